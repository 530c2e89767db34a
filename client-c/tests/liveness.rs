//! Heartbeats in both directions, and the failure kinds of single samples,
//! against the fixture agent.

mod support;

use std::time::{Duration, Instant};

use granary::{agent_silence_limit, Client, ErrorCode};
use support::{
    open, options, sample_failure, watchdog, watchdog_fn, Behaviour, Dataset, Fixture, WATCHDOG,
};

/// The fixture's counter for session `i`, once the fixture has it.
fn loader_heartbeat(fx: &Fixture, i: usize) -> u64 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = fx.loader_heartbeat(i) {
            return v;
        }
        assert!(
            Instant::now() < end,
            "session {i} never reached the fixture"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn silence_limits() {
    assert_eq!(agent_silence_limit(0), None);
    assert_eq!(agent_silence_limit(100), Some(Duration::from_secs(1)));
    assert_eq!(agent_silence_limit(1000), Some(Duration::from_secs(3)));
    assert!(agent_silence_limit(u64::MAX).is_some());
}

#[test]
fn a_hung_agent_fails_a_blocked_wait_with_a_clear_error() {
    let _w = watchdog("a_hung_agent_fails_a_blocked_wait", WATCHDOG);
    let ds = Dataset::new("hung", 64)
        .max_len(256)
        .heartbeat(100)
        .with(Behaviour::HeartbeatStopsAfter(2));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("hung", 8));
    assert_eq!(s.info().heartbeat_interval_ms, 100);
    for _ in 0..2 {
        let b = s.next_batch(Some(Duration::from_secs(20))).unwrap();
        s.release(b).unwrap();
    }
    // No timeout: without the heartbeat check this would wait for ever.
    let start = Instant::now();
    let e = s.next_batch(None).unwrap_err();
    let waited = start.elapsed();
    assert_eq!(e.code(), ErrorCode::Disconnected, "{e}");
    assert!(
        e.message().contains("agent unresponsive: no heartbeat for"),
        "{e}"
    );
    let silent_ms: u64 = e
        .message()
        .split("no heartbeat for ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no silence in {e}"));
    assert!(silent_ms > 1000, "{e}");
    // The limit is 1 s (3 intervals are less); detection is prompt after it.
    assert!(waited < Duration::from_secs(4), "took {waited:?}");
    // Not sticky: the next call checks again (and the agent is still hung).
    let e = s.next_batch(Some(Duration::from_secs(5))).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Disconnected, "{e}");
    s.close().unwrap();
}

#[test]
fn an_agent_that_asks_for_no_heartbeats_is_never_called_unresponsive() {
    let _w = watchdog("an_agent_that_asks_for_no_heartbeats", WATCHDOG);
    let ds = Dataset::new("quiet", 16)
        .max_len(64)
        .heartbeat(0)
        .with(Behaviour::HeartbeatStopsAfter(0));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("quiet", 4));
    assert_eq!(s.info().heartbeat_interval_ms, 0);
    let e = s.next_batch(Some(Duration::from_millis(1500))).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    // No background beats either: the counter moves only with calls.
    let before = loader_heartbeat(&fx, 0);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(fx.loader_heartbeat(0), Some(before));
    let _ = s.try_next_batch();
    assert!(fx.loader_heartbeat(0).unwrap() > before);
    s.close().unwrap();
}

#[test]
fn the_loader_heartbeat_advances_while_idle_and_stops_after_close() {
    let _w = watchdog("the_loader_heartbeat_advances_while_idle", WATCHDOG);
    let ds = Dataset::new("idle", 16)
        .max_len(64)
        .heartbeat(40)
        .with(Behaviour::Gated);
    let fx = Fixture::start(vec![ds]);
    let s = open(&fx, &options("idle", 4));
    assert_eq!(s.info().heartbeat_interval_ms, 40);
    // No call on the session: only the background thread beats (every 20 ms).
    let first = loader_heartbeat(&fx, 0);
    std::thread::sleep(Duration::from_millis(400));
    let later = fx.loader_heartbeat(0).unwrap();
    assert!(later >= first + 5, "{first} -> {later}");
    s.close().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let closed = fx.loader_heartbeat(0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fx.loader_heartbeat(0), Some(closed));
}

#[test]
fn calls_beat_too() {
    let _w = watchdog("calls_beat_too", WATCHDOG);
    // An interval long enough that the background thread beats only once
    // (at registration) during the test.
    let ds = Dataset::new("calls", 16)
        .max_len(64)
        .heartbeat(600_000)
        .with(Behaviour::Gated);
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("calls", 4));
    let before = loader_heartbeat(&fx, 0);
    for _ in 0..10 {
        assert_eq!(
            s.try_next_batch().unwrap_err().code(),
            ErrorCode::WouldBlock
        );
    }
    assert!(fx.loader_heartbeat(0).unwrap() >= before + 10);
    // Each wake-up of a blocked wait beats as well.
    let before = fx.loader_heartbeat(0).unwrap();
    let e = s.next_batch(Some(Duration::from_millis(300))).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout);
    assert!(fx.loader_heartbeat(0).unwrap() >= before + 3);
    s.close().unwrap();
}

#[test]
fn sessions_opened_after_fork_beat_from_their_own_thread() {
    let _w = watchdog("sessions_opened_after_fork", WATCHDOG);
    let ds = Dataset::new("forked", 16)
        .max_len(64)
        .heartbeat(40)
        .with(Behaviour::Gated);
    let fx = Fixture::start(vec![ds]);
    // The parent's session starts the parent's heartbeat thread.
    let parent = open(&fx, &options("forked", 4));
    let _ = loader_heartbeat(&fx, 0);
    let path = fx.socket_path().to_owned();
    // SAFETY: the child only opens a session, sleeps, closes it and leaves
    // with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let client = Client::connect(&path).expect("connect in the child");
            let s = client
                .open_session(&options("forked", 4))
                .expect("open in the child");
            std::thread::sleep(Duration::from_millis(600));
            s.close().is_ok()
        });
        // SAFETY: ends the child at once, without running the parent's
        // destructors or the test harness.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    // The child's session is idle: only a heartbeat thread of its own can
    // move its counter.
    let first = loader_heartbeat(&fx, 1);
    std::thread::sleep(Duration::from_millis(300));
    let later = fx.loader_heartbeat(1).unwrap();
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is writable.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    assert!(later >= first + 4, "{first} -> {later}");
    parent.close().unwrap();
}

#[test]
fn each_sample_failure_kind_reaches_the_loader() {
    let _w = watchdog_fn!(WATCHDOG);
    let ds = Dataset::new("kinds", 40)
        .max_len(512)
        .with(Behaviour::SampleFailuresAt(1));
    let fx = Fixture::start(vec![ds]);
    let mut s = open(&fx, &options("kinds", 10));
    let mut seen = Vec::new();
    loop {
        let b = match s.next_batch(Some(Duration::from_secs(20))) {
            Ok(b) => b,
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::EndOfStream, "{e}");
                break;
            }
        };
        // A batch with failed samples is not a failed batch.
        assert_eq!(b.status(), 0);
        for (i, smp) in b.samples().enumerate() {
            if b.index() == 1 {
                let kind = sample_failure(i);
                assert_eq!(smp.status(), kind.as_i32());
                assert_eq!(smp.error(), Some(kind));
                assert!(smp.is_empty() && smp.as_ptr().is_null());
                seen.push(kind);
            } else {
                assert_eq!(smp.error(), None);
                assert!(smp.checksum_matches());
            }
        }
        s.release(b).unwrap();
    }
    // The ten failed samples of batch 1 cycle through every failure kind:
    // all six, then the first four again.
    let expected: Vec<ErrorCode> = ErrorCode::SAMPLE_FAILURES
        .iter()
        .cycle()
        .take(10)
        .copied()
        .collect();
    assert_eq!(seen, expected);
    s.close().unwrap();
}
