//! Views and layouts bound to their owner, through the agent's socket
//! (`docs/peers.md`, "Views handed in at session open"):
//!
//! * a loader of another uid that the socket admits (uid 65534, run as a
//!   child process: needs root) joins the job's view but cannot replace it
//!   with a higher epoch, point a member elsewhere, or fence the owner's
//!   session;
//! * under `membership = "static"` view chunks are refused as they arrive,
//!   answered once per hand-in, and nothing is buffered;
//! * 40 connections of one uid parking partial views hold at most
//!   `peers.handin_bytes_per_uid`: the rest are refused (`Busy`) at their
//!   first chunk, and the owner's loader and view go on;
//! * a view larger than `peers.max_members` is refused at its first chunk
//!   when its size says so, else from its header.

mod common;

use common::*;
use granary::{encode_view, Client, ErrorCode, SessionOptions, ViewMember};
use granary_shm::handshake::{Message, ViewChunk, VIEW_CHUNK};
use granary_shm::socket::SeqPacket;
use granary_testkit::agent_toml;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An in-process agent with `[socket]` settings `socket` and `[peers]`
/// settings `peers`, serving a small synthetic dataset.
fn agent(socket: &str, peers: &str) -> TestAgent {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let spec = granary_testkit::dataset::synth_at(&data, 64, 2, 2_000);
    let sock = dir.path().join("granary.sock");
    let prefetch = "max_inflight_reads = 16\nwindow_batches = 4\ninitial_window = 2";
    let toml = agent_toml::head_with_socket("64MiB", &sock, socket, prefetch, "")
        + &format!(
            "[peers]\nsecret = \"{}\"\n{peers}\n",
            agent_toml::TEST_SECRET
        )
        + &agent_toml::fs_dataset(DATASET, &data, "");
    let cfg = granary_agent::config::Config::from_toml_str(&toml).expect("test config");
    TestAgent::start_custom(dir, data, sock, spec, cfg, Vec::new())
}

fn session_peers(extra: &str) -> String {
    format!(
        "membership = \"session\"\nnode_id = \"n0\"\nlisten = \"127.0.0.1:{}\"\n{extra}",
        free_port()
    )
}

/// The view of `job` at `epoch` with this agent and `extra` other members.
fn job_view(sock: &Path, job: &str, epoch: u64, extra: &[(&str, &str)]) -> Vec<u8> {
    let me = Client::connect(sock)
        .unwrap()
        .peer_identity(Duration::from_secs(10))
        .unwrap();
    let mut members = vec![ViewMember {
        id: me.node_id,
        addr: me.addr,
        capacity: me.capacity,
    }];
    for (id, addr) in extra {
        members.push(ViewMember {
            id: id.to_string(),
            addr: addr.to_string(),
            capacity: me.capacity,
        });
    }
    encode_view(job, epoch, &members).unwrap()
}

fn refused(m: &granary_agent::metrics::Metrics, reason: &str) -> u64 {
    m.peers.views_refused(reason)
}

/// The next message on `c`, within 10 s.
fn next(c: &SeqPacket) -> Message {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.recv_message().expect("a reply").0
}

const STRANGER_FN: &str = "stranger_child";
const STRANGER_DONE: &str = "GRANARY-STRANGER-DONE";

#[test]
#[ignore = "child process entry point of another_uid_joins_the_view_but_cannot_replace_it; not a test on its own"]
fn stranger_child() {
    let role = expect_child_role(STRANGER_FN);
    assert_eq!(role, "stranger");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(uid, 65534, "the child runs as uid 65534");
    let sock = child_socket();
    let wait = Duration::from_secs(10);
    // The view the owner handed in: the stranger may join it.
    let v1 = job_view(&sock, "job", 1, &[]);
    let j = Client::connect(&sock)
        .unwrap()
        .join_view(&v1, wait)
        .unwrap();
    assert!(!j.installed, "joined, not installed: {j:?}");
    assert_eq!(j.view_epoch, 1);
    // A relaunch's epoch, a member pointed at a relay, another job.
    let relaunch = job_view(&sock, "job", 2, &[]);
    let relay = job_view(&sock, "job", 2, &[("n1", "127.0.0.9:7170")]);
    let other = job_view(&sock, "other-job", 1, &[]);
    for (what, v) in [
        ("relaunch", &relaunch),
        ("relay", &relay),
        ("other job", &other),
    ] {
        let e = Client::connect(&sock)
            .unwrap()
            .join_view(v, wait)
            .expect_err(what);
        assert_eq!(e.code(), ErrorCode::Permission, "{what}: {e}");
        assert!(e.to_string().contains("peers.view_uids"), "{what}: {e}");
        assert!(e.to_string().contains("65534"), "{what}: {e}");
    }
    // Required with an open: the open is refused.
    let mut o = SessionOptions::new(DATASET);
    o.view = Some(relaunch);
    o.view_required = true;
    let e = Client::connect(&sock)
        .unwrap()
        .open_session(&o)
        .map(|_| ())
        .expect_err("an open with the stranger's view");
    assert_eq!(e.code(), ErrorCode::Permission, "{e}");
    // The agent still holds the owner's view.
    let id = Client::connect(&sock).unwrap().peer_identity(wait).unwrap();
    assert_eq!((id.job_id.as_str(), id.view_epoch), ("job", 1));
    println!("{STRANGER_DONE}");
}

#[test]
#[ignore = "needs root to run a loader as uid 65534; scripts/test.sh runs it when it runs as root"]
fn another_uid_joins_the_view_but_cannot_replace_it() {
    assert!(
        is_root(),
        "this test needs root to run a loader as uid 65534"
    );
    let _wd = watchdog("view_owner stranger", 240);
    let a = agent(
        "mode = \"0777\"\nallowed_uids = [65534]",
        &session_peers(""),
    );
    std::fs::set_permissions(a.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    // The owner (the agent's uid) installs the view and reads.
    let v1 = job_view(&a.sock, "job", 1, &[]);
    let mut o = SessionOptions::new(DATASET);
    o.view = Some(v1);
    o.view_required = true;
    o.batch_size = 4;
    let mut s = a.client().open_session(&o).unwrap();
    assert!(matches!(s.view_status(), Some(Ok(j)) if j.installed));
    let b = s.next_batch(Some(Duration::from_secs(30))).unwrap();
    let mut got = b.len();
    s.release(b).unwrap();

    let out = run_child_as(
        a.dir.path(),
        STRANGER_FN,
        "stranger",
        &a.sock,
        (65534, 65534),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(STRANGER_DONE),
        "the stranger failed: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    // The owner's session was not fenced: it reads its epoch to the end.
    loop {
        match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => {
                got += b.len();
                for x in b.samples() {
                    verify(&a.spec, &x);
                }
                s.release(b).unwrap();
            }
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => panic!("the owner's session: {e}"),
        }
    }
    assert_eq!(got as u64, a.spec.num_files);
    drop(s);
    let m = &a.metrics;
    assert_eq!(refused(m, "uid"), 4, "relaunch, relay, other job, open");
    assert_eq!(m.peers.sessions_ended_by_view.get(), 0);
    assert_eq!(m.peers.view_epoch.get(), 1);
    a.stop();
}

#[test]
fn view_chunks_under_static_membership_are_refused_once_and_not_buffered() {
    let _wd = watchdog("view_owner static", 120);
    let port = free_port();
    let a = agent(
        "",
        &format!(
            "membership = \"static\"\njob_id = \"j\"\nnode_id = \"n0\"\n\
             members = [{{ id = \"n0\", addr = \"127.0.0.1:{port}\" }}]"
        ),
    );
    // Three chunks of a view, then a query: one error, then the answer to
    // the query (nothing else was queued).
    let c = SeqPacket::connect(&a.sock).unwrap();
    let bytes = vec![7u8; 2 * VIEW_CHUNK + 100];
    for chunk in ViewChunk::split(&bytes) {
        c.send_message(&Message::ViewChunk(chunk), &[]).unwrap();
    }
    c.send_message(&Message::PeerQuery, &[]).unwrap();
    match next(&c) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::InvalidArgument);
            assert!(
                e.message.contains("takes no view from loaders"),
                "{}",
                e.message
            );
            assert!(e.message.contains("static"), "{}", e.message);
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    match next(&c) {
        Message::PeerIdentity(id) => assert_eq!(id.view_epoch, 0),
        other => panic!("expected the identity, got {other:?}"),
    }
    // Its own view too: the view comes from the configuration.
    let own = encode_view(
        "j",
        0,
        &[ViewMember {
            id: "n0".into(),
            addr: format!("127.0.0.1:{port}"),
            capacity: Client::connect(&a.sock)
                .unwrap()
                .peer_identity(Duration::from_secs(10))
                .unwrap()
                .capacity,
        }],
    )
    .unwrap();
    let e = a
        .client()
        .join_view(&own, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert_eq!(refused(&a.metrics, "membership"), 2);
    // Sessions open as ever, without a view.
    let mut o = SessionOptions::new(DATASET);
    o.batch_size = 8;
    let mut s = a.client().open_session(&o).unwrap();
    let b = s.next_batch(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(b.len(), 8);
    s.release(b).unwrap();
    drop(s);
    drop(c);
    a.stop();
}

/// This process's resident set, in bytes.
fn rss() -> u64 {
    granary_testkit::procfs::status_bytes("self", "VmRSS")
}

#[test]
fn partial_views_are_bounded_per_uid_over_all_its_connections() {
    let _wd = watchdog("view_owner per uid", 180);
    let a = agent("", &session_peers(""));
    let m = &a.metrics;
    // The owner's loader reads while the flood goes on.
    let mut o = SessionOptions::new(DATASET);
    o.batch_size = 4;
    let mut s = a.client().open_session(&o).unwrap();
    let before = rss();

    // 40 connections announce views of 2 MiB (within what 4,096 members
    // can take) and send all of them but the last chunk.
    const TOTAL: usize = 2 << 20;
    let bytes = vec![1u8; TOTAL];
    let chunks = ViewChunk::split(&bytes);
    let conns: Vec<SeqPacket> = (0..40)
        .map(|_| SeqPacket::connect(&a.sock).unwrap())
        .collect();
    for c in &conns {
        for chunk in &chunks[..chunks.len() - 1] {
            c.send_message(&Message::ViewChunk(chunk.clone()), &[])
                .unwrap();
        }
        c.send_message(&Message::PeerQuery, &[]).unwrap();
    }
    // 16 MiB per uid: 8 hand-ins of 2 MiB; the others are refused at their
    // first chunk.
    let mut parked = 0;
    let mut busy = 0;
    for c in &conns {
        match next(c) {
            Message::PeerIdentity(_) => parked += 1,
            Message::Error(e) => {
                assert_eq!(e.code, ErrorCode::Busy, "{}", e.message);
                assert!(
                    e.message.contains("peers.handin_bytes_per_uid"),
                    "{}",
                    e.message
                );
                busy += 1;
                assert!(
                    matches!(next(c), Message::PeerIdentity(_)),
                    "one answer per hand-in"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let grown = rss().saturating_sub(before);
    eprintln!(
        "40 connections parking partial views of {TOTAL} bytes: {parked} parked, {busy} refused, \
         resident set +{:.1} MiB",
        grown as f64 / (1 << 20) as f64
    );
    assert_eq!((parked, busy), (8, 32));
    assert_eq!(refused(m, "handin_bytes"), 32);
    assert!(grown < 48 << 20, "parking views took {grown} bytes");

    // The owner's loader was served throughout.
    let mut got = 0;
    let start = Instant::now();
    while got < 16 {
        let b = s.next_batch(Some(Duration::from_secs(30))).unwrap();
        got += b.len();
        s.release(b).unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(30));

    // The parked ones hold their uid's budget until they end: a real view
    // is refused now, and taken once they hang up.
    let view = job_view(&a.sock, "job", 1, &[]);
    let e = a
        .client()
        .join_view(&view, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Busy, "{e}");
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(10);
    let joined = loop {
        match a.client().join_view(&view, Duration::from_secs(10)) {
            Ok(j) => break j,
            Err(e) if e.code() == ErrorCode::Busy && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the owner's view after the flood: {e}"),
        }
    };
    assert!(joined.installed);
    drop(s);
    a.stop();
}

#[test]
fn a_view_above_max_members_is_refused_before_it_is_assembled_or_decoded() {
    let _wd = watchdog("view_owner max_members", 120);
    let a = agent("", &session_peers("max_members = 2"));
    // More bytes than two members can take: refused at the first chunk.
    let longest = granary_peer::view::max_encoded_len(2);
    let c = SeqPacket::connect(&a.sock).unwrap();
    for chunk in ViewChunk::split(&vec![0u8; longest + 1]) {
        c.send_message(&Message::ViewChunk(chunk), &[]).unwrap();
    }
    c.send_message(&Message::PeerQuery, &[]).unwrap();
    match next(&c) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::InvalidArgument);
            assert!(e.message.contains("peers.max_members (2)"), "{}", e.message);
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert!(matches!(next(&c), Message::PeerIdentity(_)));
    // A small view of three members: refused from its header.
    let three = job_view(
        &a.sock,
        "job",
        1,
        &[("n1", "127.0.0.1:1"), ("n2", "127.0.0.1:2")],
    );
    assert!(three.len() <= longest);
    let e = a
        .client()
        .join_view(&three, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("3 members"), "{e}");
    assert_eq!(refused(&a.metrics, "max_members"), 2);
    // Two members is fine.
    let two = job_view(&a.sock, "job", 1, &[("n1", "127.0.0.1:1")]);
    assert!(
        a.client()
            .join_view(&two, Duration::from_secs(10))
            .unwrap()
            .installed
    );
    drop(c);
    a.stop();
}
