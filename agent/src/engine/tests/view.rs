//! Views handed in by loaders (`peers.membership = "session"`), bound to
//! their owner: a loader of a uid outside `peers.view_uids` joins the view
//! held but never installs or replaces one (so it cannot fence the owner's
//! sessions or point a member elsewhere), a view of more members than
//! `peers.max_members` is refused from its header, and the directory of a
//! large view is computed while the engine goes on serving its loaders and
//! beating their heartbeats.

use super::*;
use crate::peers::Route;
use granary_peer::view::{Member, View};
use std::sync::{Arc, RwLock};
use std::time::Instant;

fn session_toml(extra: &str) -> String {
    format!(
        r#"
[sessions]
heartbeat_ms = 100
[peers]
membership = "session"
node_id = "n0000"
listen = "127.0.0.1:0"
secret = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23"
{extra}
"#
    )
}

/// The view of `job` at `epoch`: this agent (`n0000`) and `others` more
/// members of `capacity` bytes each.
fn view(job: &str, epoch: u64, others: usize, capacity: u64) -> Vec<u8> {
    let members = (0..=others)
        .map(|i| Member::new(format!("n{i:04}"), format!("127.0.0.1:{}", 1 + i), capacity));
    View::new(job, epoch, members).unwrap().encode()
}

/// A uid that is not the agent's.
fn foreign() -> u32 {
    if nix::unistd::getuid().as_raw() == 65534 {
        65533
    } else {
        65534
    }
}

fn held_epoch(h: &Harness) -> Option<u64> {
    h.engine.peers.as_ref().map(|t| t.view().epoch())
}

#[test]
fn another_uid_joins_the_held_view_but_cannot_replace_it_or_fence_the_owner() {
    let mut h = harness(&session_toml(""), false);
    let me = h.engine.server.agent_uid();
    let stranger = foreign();
    let m = Arc::clone(&h.engine.metrics);
    // No view held: a stranger cannot install the first one either.
    let v1 = view("job", 1, 1, 1 << 30);
    h.engine.join_view(100, stranger, &v1);
    assert_eq!(held_epoch(&h), None);
    assert_eq!(m.peers.views_refused("uid"), 1);

    // The owner installs epoch 1 and opens a session on that connection.
    let owner_conn = h.next_conn;
    h.engine.join_view(owner_conn, me, &v1);
    assert_eq!(held_epoch(&h), Some(1));
    let (sid, mut loader) = h.open(4, 2);
    assert_eq!(h.engine.sessions[&sid].conn(), owner_conn);
    h.auto(true);
    // (Samples of the other member, unreachable, come from the store once
    // its dial fails.)
    let mut served = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while served < 2 {
        assert!(Instant::now() < deadline, "the owner's session is served");
        h.turns(1);
        h.clock.advance(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(1));
        for (d, _) in loader.take() {
            loader.give_back(&d);
            served += 1;
        }
    }

    // A higher epoch of the same job, a view pointing a member at another
    // address (a relay), another job's view: all refused, nothing fenced.
    let v2 = view("job", 2, 1, 1 << 30);
    let relay = {
        let members = [
            Member::new("n0000", "127.0.0.1:1", 1 << 30),
            Member::new("n0001", "127.0.0.9:7170", 1 << 30),
        ];
        View::new("job", 2, members).unwrap().encode()
    };
    let other_job = view("other", 1, 1, 1 << 30);
    for (conn, bytes) in [(101, &v2), (102, &relay), (103, &other_job)] {
        h.engine.join_view(conn, stranger, bytes);
        assert!(!h.engine.conn_views.contains_key(&conn));
    }
    assert_eq!(m.peers.views_refused("uid"), 4);
    assert_eq!(held_epoch(&h), Some(1), "the owner's view stays");
    assert_eq!(m.peers.sessions_ended_by_view.get(), 0);
    assert!(h.engine.sessions.contains_key(&sid), "not fenced");
    assert_eq!(
        h.engine.peers.as_ref().unwrap().view().members()[1].addr,
        "127.0.0.1:2",
        "the member's address is the owner's"
    );

    // Joining the view held is for any uid the socket admits.
    h.engine.join_view(104, stranger, &v1);
    assert_eq!(
        h.engine.conn_views.get(&104).map(|t| t.epoch),
        Some(1),
        "joined"
    );
    assert_eq!(m.peers.views.get_or_create(&label("joined")).get(), 1);

    // The owner's relaunch does replace it and fences the old session.
    h.engine.join_view(105, me, &v2);
    assert_eq!(held_epoch(&h), Some(2));
    assert_eq!(m.peers.sessions_ended_by_view.get(), 1);
    assert!(!h.engine.sessions.contains_key(&sid));
    let _ = loader.take();
}

fn label(outcome: &str) -> crate::peers::metrics::Labels {
    crate::peers::metrics::label("outcome", outcome)
}

#[test]
fn a_uid_of_peers_view_uids_may_install_and_replace_the_view() {
    let stranger = foreign();
    let mut h = harness(&session_toml(&format!("view_uids = [{stranger}]")), false);
    h.engine.join_view(1, stranger, &view("job", 1, 1, 1 << 30));
    assert_eq!(held_epoch(&h), Some(1));
    h.engine.join_view(2, stranger, &view("job", 3, 1, 1 << 30));
    assert_eq!(held_epoch(&h), Some(3));
    assert_eq!(h.engine.metrics.peers.views_refused("uid"), 0);
    // Another uid still may not.
    h.engine
        .join_view(3, stranger + 1, &view("job", 4, 1, 1 << 30));
    assert_eq!(held_epoch(&h), Some(3));
    assert_eq!(h.engine.metrics.peers.views_refused("uid"), 1);
}

#[test]
fn a_view_of_more_members_than_max_members_is_refused_from_its_header() {
    let mut h = harness(&session_toml("max_members = 3"), false);
    let me = h.engine.server.agent_uid();
    let m = Arc::clone(&h.engine.metrics);
    h.engine.join_view(1, me, &view("job", 1, 3, 1 << 30));
    assert_eq!(held_epoch(&h), None, "4 members > 3: no tier started");
    assert_eq!(m.peers.views_refused("max_members"), 1);
    // A header announcing 65,536 members and no body: refused from the
    // header, not decoded (a decode would call it truncated).
    let mut huge = view("job", 1, 0, 1 << 30);
    let count_at = granary_peer::view::VIEW_MAGIC.len() + 4 + 3 + 8;
    huge.truncate(count_at + 4);
    huge[count_at..].copy_from_slice(&65_536u32.to_le_bytes());
    assert_eq!(View::member_count(&huge), Ok(65_536));
    h.engine.join_view(2, me, &huge);
    assert_eq!(m.peers.views_refused("max_members"), 2);
    assert_eq!(m.peers.views_refused("malformed"), 0);
    // Three members is fine.
    h.engine.join_view(3, me, &view("job", 1, 2, 1 << 30));
    assert_eq!(held_epoch(&h), Some(1));
}

#[test]
fn the_engine_serves_and_beats_while_a_large_views_directory_is_computed() {
    let mut h = harness(&session_toml(""), false);
    let me = h.engine.server.agent_uid();
    // A session reading in exact order before the view arrives.
    let (_, mut loader) = h.open(4, 1);
    h.auto(true);
    // Hold every directory computation back until the end of the test: as
    // long as the largest view's would take.
    let hold = Arc::new(RwLock::new(()));
    let guard = hold.write().unwrap();
    h.engine.directories.hold = Some(Arc::clone(&hold));
    // 4,096 members of 1 TiB: 131,072 virtual ids to score every sample
    // against.
    let big = view("job", 1, 4095, 1 << 40);
    let start = Instant::now();
    h.engine.join_view(h.next_conn, me, &big);
    let install = start.elapsed();
    assert_eq!(held_epoch(&h), Some(1));
    // A locality query waits for the directory.
    let query = OpenSession {
        seed: 3,
        ..OpenSession::new("fake", 4)
    };
    h.engine.assignment_query(h.next_conn, query);
    assert_eq!(h.engine.directories.waiting.len(), 1, "the query waits");

    let mut slowest = Duration::ZERO;
    let mut beats = std::collections::BTreeSet::new();
    let mut delivered = 0;
    let mut ended = false;
    for _ in 0..200 {
        let t = Instant::now();
        h.engine.turn().unwrap();
        slowest = slowest.max(t.elapsed());
        beats.insert(loader._segment.heartbeat_ms());
        for (d, table) in loader.take() {
            ended |= d.flags & BATCH_END_OF_STREAM != 0;
            for e in &table {
                assert_eq!(e.status, 0);
                assert_eq!(loader.bytes(e), content(e.sample_id - 1000));
            }
            delivered += table.len();
            loader.give_back(&d);
        }
        h.clock.advance(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(2));
        let tier = h.engine.peers.as_ref().unwrap();
        assert!(tier.fingerprint_of(0).is_none(), "held back: no directory");
        assert_eq!(tier.route(0, 0), Route::Store, "the store serves meanwhile");
    }
    eprintln!(
        "view of 4096 members: installed in {install:?}; while its directory was computed \
         the slowest turn took {slowest:?}, {} heartbeats, {delivered} samples delivered",
        beats.len()
    );
    assert!(
        ended,
        "the whole epoch was delivered while the directory was computed"
    );
    assert_eq!(delivered as u64, SAMPLES);
    assert!(beats.len() >= 20, "heartbeats went on: {beats:?}");
    assert!(
        slowest < Duration::from_millis(500),
        "a turn took {slowest:?} while the directory was computed"
    );
    assert!(h.engine.metrics.peers.store_samples.get() >= SAMPLES);

    // Let it compute: the directory is installed and the query answered.
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(120);
    while h.engine.peers.as_ref().unwrap().fingerprint_of(0).is_none() {
        assert!(Instant::now() < deadline, "the directory never came");
        let t = Instant::now();
        h.engine.turn().unwrap();
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        slowest < Duration::from_millis(500),
        "a turn took {slowest:?} while the directory was computed"
    );
    assert!(
        h.engine.directories.waiting.is_empty(),
        "the query was answered"
    );
    let tier = h.engine.peers.as_ref().unwrap();
    let dir = tier.directory(0).unwrap();
    assert_eq!(dir.len() as u64, SAMPLES);
    for i in 0..SAMPLES {
        let owner = dir.owner(i).unwrap();
        assert!(owner < 4096);
    }
}
