//! The owner's side of a cancel frame: a peer's request for a kept sample
//! whose store read waits for room at the source is cancelled, and that
//! read is never started; a request still wanted is read as before.

use super::*;
use crate::engine::key;
use granary_peer::frame::Get;
use std::sync::Arc;
use std::time::Instant;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn peers_toml(port: u16) -> String {
    format!(
        r#"
[peers]
membership = "static"
job_id = "job"
node_id = "n0"
listen = "127.0.0.1:{port}"
secret = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23"
members = [
  {{ id = "n0", addr = "127.0.0.1:{port}", keep = "16MiB" }},
  {{ id = "n1", addr = "127.0.0.1:1", keep = "16MiB" }},
]
"#
    )
}

#[test]
fn a_cancelled_request_leaves_its_unstarted_store_read_unstarted() {
    let mut h = harness_with(&peers_toml(free_port()), false, &[("fake", 0)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h
        .engine
        .peers
        .as_ref()
        .and_then(|t| t.fingerprint_of(0))
        .is_none()
    {
        assert!(Instant::now() < deadline, "no directory within 10 s");
        h.turns(1);
        std::thread::sleep(Duration::from_millis(1));
    }
    let tier = h.engine.peers.as_ref().unwrap();
    let fp = tier.fingerprint_of(0).unwrap();
    let dir = Arc::clone(tier.directory(0).unwrap());
    let mine: Vec<u64> = (0..SAMPLES)
        .filter(|&i| dir.owner(i) == Some(0) && dir.is_kept(i))
        .collect();
    assert!(mine.len() >= 2, "{mine:?}");
    let (a, b) = (mine[0], mine[1]);
    // The source is full: new reads wait for room.
    {
        let dummy = h.engine.arena.slice(0, 1).unwrap();
        let mut s = h.script.lock().unwrap();
        for t in 0..64u64 {
            s.submitted
                .push_back((u64::MAX - t, SAMPLES + 1, dummy.clone()));
        }
    }
    let conn = 9_999;
    let get = |request: u64, sample: u64| Get {
        request,
        fingerprint: fp,
        sample,
        length: size(sample),
        due: u64::MAX,
    };
    h.engine.peer_request(conn, get(1, a));
    h.engine.peer_request(conn, get(2, b));
    for i in [a, b] {
        assert!(matches!(
            h.engine.cache.lookup(key(0, i)),
            Lookup::InFlight { .. }
        ));
    }
    h.engine.peer_cancel(conn, 1);
    assert!(
        matches!(h.engine.cache.lookup(key(0, a)), Lookup::Absent),
        "the reservation is taken back"
    );
    assert_eq!(h.engine.metrics.peers.reads_not_started.get(), 1);
    // A cancel of a request not here does nothing.
    h.engine.peer_cancel(conn, 1);
    h.engine.peer_cancel(conn, 77);
    assert_eq!(h.engine.metrics.peers.reads_not_started.get(), 1);
    // Room again: only the request still wanted is read.
    h.script.lock().unwrap().submitted.clear();
    h.turns(2);
    assert_eq!(h.submitted(), vec![b]);
    h.engine.cache.check_invariants().unwrap();
}
