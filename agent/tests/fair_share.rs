//! Fair sharing of one agent: a loader that takes batches and never
//! releases them holds at most its window and cannot stall an honest loader
//! next to it; a user cannot hold more sessions than
//! `sessions.max_sessions_per_uid`; an oversized batch is refused at open.

mod common;

use common::*;
use granary::SessionOptions;
use granary_shm::handshake::{Message, OpenSession};
use granary_shm::segment::LoaderSegment;
use granary_shm::ErrorCode;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Takes every batch the agent publishes and never releases one, beating
/// its heartbeat so that it is not taken for dead, until `stop`. Returns
/// how many batches it got.
fn hoard(sock: &std::path::Path, stop: &AtomicBool, got: &AtomicU64) {
    let mut o = SessionOptions::new(DATASET);
    o.seed = 99;
    o.batch_size = 32;
    o.epoch_count = 1000;
    let raw = raw_open(sock, &o);
    let mut seg = LoaderSegment::attach_fd(raw.segment.as_fd(), Some(raw.reply.instance_epoch))
        .expect("hoarder: attach");
    let (mut ready, _release) = seg.take_endpoints().expect("endpoints");
    while !stop.load(Ordering::Relaxed) {
        while ready.try_pop().expect("hoarder: ready ring").is_some() {
            got.fetch_add(1, Ordering::Relaxed);
        }
        seg.beat();
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_hoarding_loader_cannot_starve_an_honest_one() {
    let _w = watchdog("a_hoarding_loader_cannot_starve_an_honest_one", 120);
    // 1 MiB of sample tables holds 1024 tables of 32 samples: a hoarder
    // allowed to keep every batch it is given (1000 epochs of 16 batches)
    // would take them all and the honest loader would get nothing.
    let window = 16;
    let agent = TestAgent::start(AgentOptions {
        files: 512,
        mean_size: 4_000,
        window_batches: window,
        ..AgentOptions::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let hoarder = {
        let (sock, stop, got) = (agent.sock.clone(), Arc::clone(&stop), Arc::clone(&got));
        std::thread::spawn(move || hoard(&sock, &stop, &got))
    };
    wait_for("the hoarder's window", Duration::from_secs(20), || {
        got.load(Ordering::Relaxed) >= u64::from(window)
    });
    // Time enough for a hoarder without a bound to take every table.
    std::thread::sleep(Duration::from_secs(2));
    let honest_stop = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    let epochs = agent
        .spawn_honest(Honest::epochs(7, 32, 3), &honest_stop)
        .join()
        .expect("the honest loader finished");
    assert_eq!(epochs, 3, "the honest loader read its epochs");
    let hoarded = got.load(Ordering::Relaxed);
    println!(
        "honest loader: 3 epochs in {:?} next to a hoarder holding {hoarded} batches",
        started.elapsed()
    );
    assert_eq!(
        hoarded,
        u64::from(window),
        "the hoarder got exactly one window of batches"
    );
    stop.store(true, Ordering::Relaxed);
    hoarder.join().expect("hoarder");
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

/// Sends an open request on a raw connection; returns the agent's refusal.
fn refused(sock: &std::path::Path, req: OpenSession) -> (ErrorCode, String) {
    let conn = granary_shm::socket::SeqPacket::connect(sock).expect("connect");
    conn.send_message(&Message::OpenSession(req), &[])
        .expect("send the open request");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    match conn.recv_message().expect("the agent's answer").0 {
        Message::Error(e) => (e.code, e.message),
        other => panic!("expected a refusal, the agent sent {other:?}"),
    }
}

#[test]
fn sessions_per_user_and_batch_size_are_bounded_at_open() {
    let _w = watchdog("sessions_per_user_and_batch_size_are_bounded_at_open", 60);
    let agent = TestAgent::start(AgentOptions {
        extra: "[sessions]\nmax_sessions_per_uid = 2\n".into(),
        ..AgentOptions::default()
    });
    let client = agent.client();
    let o = SessionOptions::new(DATASET);
    let first = client.open_session(&o).expect("first session");
    let second = client.open_session(&o).expect("second session");
    let Err(e) = client.open_session(&o) else {
        panic!("a third session of the same user was accepted");
    };
    assert_eq!(e.code(), ErrorCode::Busy);
    assert!(
        e.message().contains("sessions.max_sessions_per_uid"),
        "{}",
        e.message()
    );
    first.close().expect("close");
    let third = client
        .open_session(&o)
        .expect("a session once one of the user's closed");
    second.close().expect("close");
    third.close().expect("close");

    let mut req = o.request();
    req.batch_size = 1_000_000;
    let (code, why) = refused(&agent.sock, req.clone());
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(why.starts_with("batch_size: 1000000"), "{why}");
    req.batch_size = 32;
    req.ready_capacity = 1 << 20;
    let (code, why) = refused(&agent.sock, req);
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(why.starts_with("ready_capacity:"), "{why}");
    assert_eq!(
        agent.metrics.violations.get(),
        0,
        "refusals, not violations"
    );
}
