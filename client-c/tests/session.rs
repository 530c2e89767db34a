//! The Rust API against the fixture agent: content, ordering, and every
//! way a session can go wrong.

mod support;

use std::time::{Duration, Instant};

use granary::{Batch, Client, ErrorCode, Session, SessionOptions};
use support::{
    open, plan_epoch, sample_label, watchdog, Behaviour, Dataset, Fixture, Stats, WATCHDOG,
};

const LONG: Option<Duration> = Some(Duration::from_secs(20));

fn options(dataset: &str, batch_size: u32, epochs: u32, seed: u64) -> SessionOptions {
    let mut o = support::options(dataset, batch_size);
    o.epoch_count = epochs;
    o.seed = seed;
    o
}

/// Checks one batch against the fixture's plan and content.
fn verify(ds: &Dataset, batch: &Batch, want_ids: &[u64]) {
    assert_eq!(batch.status(), 0);
    assert_eq!(batch.error(), None);
    assert_eq!(batch.len(), want_ids.len());
    let mut total = 0u64;
    for (i, (sample, &id)) in batch.samples().zip(want_ids).enumerate() {
        assert_eq!(sample.id(), id, "sample {i}");
        assert_eq!(sample.status(), 0);
        assert_eq!(sample.label(), sample_label(id));
        let bytes = sample.to_vec();
        assert_eq!(bytes.len(), ds.len_of(id) as usize);
        assert_eq!(sample.len(), bytes.len());
        assert_eq!(
            &bytes[..bytes.len().min(8)],
            &id.to_le_bytes()[..bytes.len().min(8)]
        );
        assert!(bytes == ds.bytes_of(id), "content of sample {id}");
        assert_eq!(crc32c::crc32c(&bytes), sample.crc32c());
        assert!(sample.checksum_matches());
        assert!(!sample.as_ptr().is_null());
        // SAFETY: the fixture never writes a sample's bytes while its batch
        // is on loan, and the slice is dropped before the release.
        let in_place = unsafe { sample.bytes() };
        assert_eq!(in_place, &bytes[..]);
        total += bytes.len() as u64;
    }
    assert_eq!(batch.total_bytes(), total);
    assert!(batch.sample(batch.len()).is_none());
}

/// Takes every batch until end of stream, verifying each one; returns the
/// number of batches.
fn consume_all(ds: &Dataset, session: &mut Session, o: &SessionOptions) -> usize {
    let mut seen = 0;
    for epoch in o.first_epoch..o.first_epoch + o.epoch_count {
        let plan = plan_epoch(
            ds.samples,
            o.seed,
            epoch,
            o.batch_size,
            o.rank,
            o.world_size,
            o.drop_last,
        );
        for (index, ids) in plan.iter().enumerate() {
            let batch = session.next_batch(LONG).expect("next batch");
            assert_eq!(batch.epoch(), epoch);
            assert_eq!(batch.index(), index as u64);
            assert_eq!(batch.seq(), seen as u64);
            assert_eq!(batch.is_end_of_epoch(), index + 1 == plan.len());
            // The library flags the last batch of the last epoch, though the
            // agent's own end-of-stream descriptor (empty) follows it.
            assert_eq!(
                batch.is_end_of_stream(),
                index + 1 == plan.len() && epoch + 1 == o.first_epoch + o.epoch_count
            );
            verify(ds, &batch, ids);
            session.release(batch).expect("release");
            seen += 1;
        }
    }
    let end = session.next_batch(LONG).expect_err("end of stream");
    assert_eq!(end.code(), ErrorCode::EndOfStream, "{end}");
    seen
}

#[test]
fn every_sample_of_every_batch_is_verified() {
    let _w = watchdog("every_sample_of_every_batch_is_verified", WATCHDOG);
    let ds = Dataset::new("imagenet-mini", 300);
    let fx = Fixture::start(vec![ds.clone()]);
    let o = options("imagenet-mini", 32, 2, 7);
    let mut session = open(&fx, &o);
    let info = *session.info();
    assert_eq!(info.samples_per_epoch, 300);
    assert_eq!(info.batches_per_epoch, 10);
    assert!(info.arena_size > 0);
    assert_eq!(info.ready_capacity, 8);
    assert_eq!(info.release_capacity, 16);

    assert_eq!(consume_all(&ds, &mut session, &o), 20);
    // End of stream is sticky.
    for _ in 0..2 {
        let e = session.try_next_batch().unwrap_err();
        assert_eq!(e.code(), ErrorCode::EndOfStream);
    }
    session.close().expect("close");
    assert!(fx.wait_finished(1, Duration::from_secs(10)));
    let st = fx.stats();
    assert_eq!(Stats::get(&st.closes), 1);
    assert_eq!(Stats::get(&st.unreturned), 0, "every lease came back");
    assert_eq!(Stats::get(&st.releases), Stats::get(&st.published));
    assert_eq!(
        Stats::get(&st.published),
        21,
        "20 batches and end of stream"
    );
    assert_eq!(Stats::get(&st.violations), 0);
}

#[test]
fn sharded_ranks_drop_last_and_small_rings() {
    let _w = watchdog("sharded_ranks_drop_last_and_small_rings", WATCHDOG);
    let ds = Dataset::new("sharded", 203).max_len(4096);
    let fx = Fixture::start(vec![ds.clone()]);
    let client = Client::connect(fx.socket_path()).unwrap();
    let mut total = 0;
    for rank in 0..3 {
        let mut o = options("sharded", 10, 3, 99);
        o.first_epoch = 5;
        o.rank = rank;
        o.world_size = 3;
        o.drop_last = true;
        o.ready_capacity = 2;
        o.release_capacity = 2;
        let mut session = client.open_session(&o).unwrap();
        assert_eq!(session.info().ready_capacity, 2);
        total += consume_all(&ds, &mut session, &o);
        session.close().unwrap();
    }
    // 203 samples over 3 ranks: 68, 68, 67 per epoch; full batches of 10: 6 each.
    assert_eq!(total, 3 * 3 * 6);
    fx.assert_all_returned(3);
}

#[test]
fn sessions_on_threads_are_independent() {
    let _w = watchdog("sessions_on_threads_are_independent", WATCHDOG);
    let a = Dataset::new("thread-a", 120).max_len(8192);
    let b = Dataset::new("thread-b", 90).max_len(8192);
    let fx = Fixture::start(vec![a.clone(), b.clone()]);
    let client = Client::connect(fx.socket_path()).unwrap();
    std::thread::scope(|scope| {
        for (ds, seed) in [(&a, 1), (&b, 2), (&a, 3)] {
            let client = &client;
            scope.spawn(move || {
                let o = options(&ds.name, 16, 2, seed);
                let mut s = client.open_session(&o).unwrap();
                consume_all(ds, &mut s, &o);
                s.close().unwrap();
            });
        }
    });
    fx.assert_all_returned(3);
}

#[test]
fn a_slow_agent_wakes_a_parked_loader() {
    let _w = watchdog("a_slow_agent_wakes_a_parked_loader", WATCHDOG);
    let ds = Dataset::new("slow", 40)
        .max_len(1024)
        .paced(Duration::from_millis(15));
    let fx = Fixture::start(vec![ds.clone()]);
    let o = options("slow", 4, 1, 0);
    let mut s = open(&fx, &o);
    for _ in 0..10 {
        // Wait without limit: each batch arrives within a few slices.
        let b = s.next_batch(None).unwrap();
        s.release(b).unwrap();
    }
    assert_eq!(
        s.next_batch(None).unwrap_err().code(),
        ErrorCode::EndOfStream
    );
}

#[test]
fn non_blocking_returns_would_block_before_data() {
    let _w = watchdog("non_blocking_returns_would_block_before_data", WATCHDOG);
    let ds = Dataset::new("gated", 50)
        .max_len(2048)
        .with(Behaviour::Gated);
    let fx = Fixture::start(vec![ds.clone()]);
    let o = options("gated", 8, 1, 3);
    let mut s = open(&fx, &o);
    let t = Instant::now();
    assert_eq!(
        s.try_next_batch().unwrap_err().code(),
        ErrorCode::WouldBlock
    );
    let e = s.next_batch(Some(Duration::ZERO)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::WouldBlock);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "non-blocking calls must not wait"
    );
    fx.open_gate();
    let first = s.next_batch(LONG).expect("data after the gate opens");
    assert_eq!(first.seq(), 0);
    s.release(first).unwrap();
    let mut n = 1;
    loop {
        match s.next_batch(LONG) {
            Ok(b) => {
                n += 1;
                s.release(b).unwrap();
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::EndOfStream);
                break;
            }
        }
    }
    assert_eq!(n, 7);
}

#[test]
fn timeout_returns_within_bounds() {
    let _w = watchdog("timeout_returns_within_bounds", WATCHDOG);
    let ds = Dataset::new("silent", 10).with(Behaviour::Silent);
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("silent", 4, 1, 0));
    for ms in [1u64, 120, 300] {
        let limit = Duration::from_millis(ms);
        let t = Instant::now();
        let e = s.next_batch(Some(limit)).unwrap_err();
        let took = t.elapsed();
        assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
        assert!(
            took >= limit,
            "returned after {took:?}, before the {limit:?} timeout"
        );
        assert!(
            took < limit + Duration::from_millis(1500),
            "returned {took:?} after a {limit:?} timeout"
        );
    }
    // A timeout is not fatal.
    assert_eq!(
        s.try_next_batch().unwrap_err().code(),
        ErrorCode::WouldBlock
    );
}

/// Takes batches until an error, releasing each; returns (batches, error, time of the error).
fn drain_until_error(s: &mut Session, timeout: Option<Duration>) -> (u64, granary::Error, Instant) {
    let mut n = 0;
    loop {
        match s.next_batch(timeout) {
            Ok(b) => {
                n += 1;
                let _ = s.release(b);
            }
            Err(e) => return (n, e, Instant::now()),
        }
    }
}

#[test]
fn agent_hanging_up_mid_stream_disconnects_within_the_timeout() {
    let _w = watchdog("agent_hanging_up_mid_stream", WATCHDOG);
    let ds = Dataset::new("crashy", 100)
        .max_len(1024)
        .with(Behaviour::HangUpAfter(3));
    let fx = Fixture::start(vec![ds]);
    for timeout in [Some(Duration::from_secs(30)), None] {
        let mut s = open(&fx, &options("crashy", 5, 1, 0));
        let t = Instant::now();
        let (n, e, _) = drain_until_error(&mut s, timeout);
        assert_eq!(e.code(), ErrorCode::Disconnected, "{e}");
        assert!(n <= 3, "{n} batches from an agent that published 3");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "hang-up noticed only after {:?}",
            t.elapsed()
        );
        // Sticky.
        assert_eq!(
            s.try_next_batch().unwrap_err().code(),
            ErrorCode::Disconnected
        );
        s.close().expect("closing a disconnected session succeeds");
    }
}

#[test]
fn a_parked_loader_learns_of_hang_up_and_fence_promptly() {
    let _w = watchdog("a_parked_loader_learns_promptly", WATCHDOG);
    let fx = Fixture::start(vec![
        Dataset::new("dies", 10).with(Behaviour::HangUpOnGate),
        Dataset::new("fences", 10).with(Behaviour::FenceOnGate),
    ]);
    let client = Client::connect(fx.socket_path()).unwrap();
    let mut dies = client.open_session(&options("dies", 2, 1, 0)).unwrap();
    let mut fences = client.open_session(&options("fences", 2, 1, 0)).unwrap();
    let delay = Duration::from_millis(300);
    let t = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(delay);
            fx.open_gate();
        });
        let a = scope.spawn(|| (dies.next_batch(None).unwrap_err(), t.elapsed()));
        let b = scope.spawn(|| {
            (
                fences
                    .next_batch(Some(Duration::from_secs(60)))
                    .unwrap_err(),
                t.elapsed(),
            )
        });
        let (e, took) = a.join().unwrap();
        assert_eq!(e.code(), ErrorCode::Disconnected, "{e}");
        assert!(
            took >= delay && took < delay + Duration::from_secs(2),
            "{took:?}"
        );
        let (e, took) = b.join().unwrap();
        assert_eq!(e.code(), ErrorCode::Fenced, "{e}");
        assert!(e.message().contains("not on loan"), "{e}");
        assert!(
            took >= delay && took < delay + Duration::from_secs(2),
            "{took:?}"
        );
    });
}

#[test]
fn fenced_session_reports_fenced() {
    let _w = watchdog("fenced_session_reports_fenced", WATCHDOG);
    let ds = Dataset::new("fence", 100)
        .max_len(1024)
        .with(Behaviour::FenceAfter(2));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("fence", 5, 1, 0));
    let t = Instant::now();
    let (n, e, _) = drain_until_error(&mut s, Some(Duration::from_secs(30)));
    assert_eq!(e.code(), ErrorCode::Fenced, "{e}");
    assert!(n <= 2);
    assert!(t.elapsed() < Duration::from_secs(5));
    // The segment's violation word says why (the fixture records a bad field),
    // and the message the agent sent with the fence is appended.
    assert!(e.message().contains("invalid field"), "{e}");
    assert!(
        e.message()
            .contains("fixture fenced the session after 2 batches"),
        "{e}"
    );
    assert_eq!(s.try_next_batch().unwrap_err().code(), ErrorCode::Fenced);
}

#[test]
fn agent_closing_the_session_disconnects_after_the_ring_drains() {
    let _w = watchdog("agent_closing_the_session", WATCHDOG);
    let ds = Dataset::new("closing", 100)
        .max_len(1024)
        .with(Behaviour::CloseAfter(2));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("closing", 5, 1, 0));
    let (n, e, _) = drain_until_error(&mut s, Some(Duration::from_secs(30)));
    assert_eq!(e.code(), ErrorCode::Disconnected, "{e}");
    assert_eq!(
        n, 2,
        "both published batches are delivered before the close"
    );
}

#[test]
fn corrupt_descriptor_is_reported_not_a_crash() {
    let _w = watchdog("corrupt_descriptor_is_reported", WATCHDOG);
    let ds = Dataset::new("corrupt", 64)
        .max_len(2048)
        .with(Behaviour::CorruptAt(1));
    let fx = Fixture::start(vec![ds.clone()]);
    let o = options("corrupt", 8, 1, 11);
    let mut s = open(&fx, &o);
    let plan = plan_epoch(64, 11, 0, 8, 0, 1, false);
    let mut got = Vec::new();
    let mut corrupt = 0;
    loop {
        match s.next_batch(LONG) {
            Ok(b) => {
                verify(&ds, &b, &plan[got.len()]);
                got.push(b.index());
                s.release(b).unwrap();
            }
            Err(e) if e.code() == ErrorCode::Corrupt => {
                assert!(e.message().contains("outside"), "{e}");
                assert_eq!(got.len(), 1, "the bad descriptor comes before batch 1");
                corrupt += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::EndOfStream, "{e}");
                break;
            }
        }
    }
    assert_eq!(corrupt, 1);
    assert_eq!(got, (0..8).collect::<Vec<u64>>());
    s.close().unwrap();
    assert!(fx.wait_finished(1, Duration::from_secs(10)));
    assert_eq!(Stats::get(&fx.stats().violations), 0);
    assert_eq!(
        Stats::get(&fx.stats().unreturned),
        0,
        "the bad descriptor was handed back too"
    );
}

#[test]
fn batch_with_io_status_is_delivered_and_released() {
    let _w = watchdog("batch_with_io_status", WATCHDOG);
    let ds = Dataset::new("flaky", 40)
        .max_len(1024)
        .with(Behaviour::IoErrorAt(2));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("flaky", 8, 1, 5));
    let mut statuses = Vec::new();
    loop {
        match s.next_batch(LONG) {
            Ok(b) => {
                statuses.push(b.status());
                if b.status() != 0 {
                    assert_eq!(b.error(), Some(ErrorCode::Io));
                    assert_eq!(b.total_bytes(), 0);
                    for smp in b.samples() {
                        assert_eq!(smp.status(), ErrorCode::Io.as_i32());
                        assert!(smp.is_empty());
                        assert!(smp.as_ptr().is_null());
                        assert!(smp.to_vec().is_empty());
                    }
                }
                s.release(b).unwrap();
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::EndOfStream, "{e}");
                break;
            }
        }
    }
    assert_eq!(statuses, vec![0, 0, ErrorCode::Io.as_i32(), 0, 0]);
    s.close().unwrap();
    fx.assert_all_returned(1);
}

#[test]
fn a_full_release_ring_defers_releases_without_losing_them() {
    let _w = watchdog("a_full_release_ring_defers_releases", WATCHDOG);
    let ds = Dataset::new("held", 20)
        .max_len(256)
        .with(Behaviour::HoldReleases);
    let fx = Fixture::start(vec![ds.clone()]);
    let mut o = options("held", 2, 1, 0);
    o.ready_capacity = 8;
    o.release_capacity = 2;
    let mut s = open(&fx, &o);
    let batches: Vec<Batch> = (0..3).map(|_| s.next_batch(LONG).unwrap()).collect();
    let mut waits = Vec::new();
    for b in batches {
        let t = Instant::now();
        s.release(b)
            .expect("a release into a full ring is deferred, not failed");
        waits.push(t.elapsed());
    }
    assert!(waits[0] < granary::RELEASE_WAIT && waits[1] < granary::RELEASE_WAIT);
    assert!(
        waits[2] >= granary::RELEASE_WAIT,
        "the third release waited {:?}",
        waits[2]
    );
    assert_eq!(Stats::get(&fx.stats().releases), 0);
    fx.open_gate();
    let mut n = 3;
    loop {
        match s.next_batch(LONG) {
            Ok(b) => {
                n += 1;
                s.release(b).unwrap();
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::EndOfStream, "{e}");
                break;
            }
        }
    }
    assert_eq!(n, 10);
    s.close().unwrap();
    fx.assert_all_returned(1);
    assert_eq!(Stats::get(&fx.stats().releases), 11);
    assert_eq!(Stats::get(&fx.stats().violations), 0);
}

#[test]
fn dropped_batches_and_wrong_session_releases_come_back() {
    let _w = watchdog("dropped_batches_come_back", WATCHDOG);
    let ds = Dataset::new("returns", 64).max_len(512);
    let fx = Fixture::start(vec![ds]);
    let client = Client::connect(fx.socket_path()).unwrap();
    let o = options("returns", 8, 1, 0);
    let mut s1 = client.open_session(&o).unwrap();
    let mut s2 = client.open_session(&o).unwrap();

    let b = s1.next_batch(LONG).unwrap();
    drop(b); // not released: handed back by s1's next call
    let b = s1.next_batch(LONG).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Stats::get(&fx.stats().releases) < 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        Stats::get(&fx.stats().releases),
        1,
        "the dropped batch was returned"
    );

    let e = s2.release(b).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    // The batch went back to s1 instead; s2 is unaffected.
    let other = s2.next_batch(LONG).unwrap();
    s2.release(other).unwrap();

    // Batches stay readable after their session is closed.
    let kept = s1.next_batch(LONG).unwrap();
    s1.close().unwrap();
    assert!(kept.samples().all(|smp| smp.checksum_matches()));
    drop(kept);
    s2.close().unwrap();
    assert!(fx.wait_finished(2, Duration::from_secs(10)));
    assert_eq!(Stats::get(&fx.stats().violations), 0);
    // s1: the dropped batch and the one released to the wrong session;
    // s2: one. The batch kept past close is not on loan any more from the
    // loader's side; the agent takes it back with the session.
    assert_eq!(Stats::get(&fx.stats().releases), 3);
}

#[test]
fn refusals_carry_the_agents_words() {
    let _w = watchdog("refusals_carry_the_agents_words", WATCHDOG);
    let fx = Fixture::start(vec![Dataset::new("known", 10)]);
    let client = Client::connect(fx.socket_path()).unwrap();
    let e = client
        .open_session(&SessionOptions::new("unknown"))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().contains("\"unknown\""), "{e}");

    let mut o = SessionOptions::new("known");
    o.batch_size = 0;
    let e = client.open_session(&o).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("batch_size"), "{e}");
    o.batch_size = 4;
    o.ready_capacity = 3;
    assert_eq!(
        client.open_session(&o).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );

    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let strict = Fixture::start_with(vec![Dataset::new("known", 10)], vec![me.wrapping_add(1)]);
    let client = Client::connect(strict.socket_path()).unwrap();
    let e = client
        .open_session(&SessionOptions::new("known"))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Permission);
    assert!(e.message().contains(&format!("uid {me}")), "{e}");
    assert_eq!(Stats::get(&strict.stats().refused), 1);
    assert_eq!(Stats::get(&strict.stats().sessions), 0);

    // An agent that refuses at accept time and closes the connection before
    // the request arrives: still a permission error with its message.
    let strict = Fixture::start_checking_at_accept(
        vec![Dataset::new("known", 10)],
        vec![me.wrapping_add(1)],
    );
    let client = Client::connect(strict.socket_path()).unwrap();
    for pause in [0, 100] {
        std::thread::sleep(Duration::from_millis(pause));
        let e = client
            .open_session(&SessionOptions::new("known"))
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Permission, "{e}");
        assert!(e.message().contains("allowlist"), "{e}");
    }

    let dir = tempfile::tempdir().unwrap();
    let e = Client::connect(dir.path().join("nobody-here.sock")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Disconnected);
    assert!(e.message().contains("nobody-here.sock"), "{e}");
}

#[test]
fn one_client_opens_many_sessions() {
    let _w = watchdog("one_client_opens_many_sessions", WATCHDOG);
    let ds = Dataset::new("spare", 16).max_len(256);
    let fx = Fixture::start(vec![ds.clone()]);
    let client = Client::connect(fx.socket_path()).unwrap();
    let o = options("spare", 4, 1, 0);
    for _ in 0..3 {
        let mut s = client.open_session(&o).unwrap();
        assert_eq!(consume_all(&ds, &mut s, &o), 4);
        s.close().unwrap();
    }
    assert_eq!(Stats::get(&fx.stats().sessions), 3);
}

#[test]
fn handles_cross_threads() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Client>();
    sync::<Client>();
    send::<Session>();
    send::<Batch>();
    sync::<Batch>();
}
