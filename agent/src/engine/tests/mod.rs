//! The engine's phases over a fake source and a clock the test moves: the
//! test is the loader (it attaches the session's ring segment and maps the
//! arena, as libgranary does) and decides when each read completes.

use super::harness::*;
use crate::cache::Lookup;
use crate::source::FailureKind;
use granary_shm::handshake::OpenSession;
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::{BatchDescriptor, ErrorCode, SampleEntry};
use std::collections::VecDeque;
use std::time::Duration;

mod balance;
mod cancel;
mod fuzz_inputs;
mod grace;
mod rdma;
mod two_peers;
mod view;

/// A harness with one session of `batch`-sample batches over `epochs`
/// epochs whose reads complete on their own: the harness, the session's
/// id and its loader.
fn auto_session(batch: u32, epochs: u32) -> (Harness, u64, Loader) {
    let mut h = harness("", false);
    let (sid, loader) = h.open(batch, epochs);
    h.auto(true);
    (h, sid, loader)
}

#[test]
fn request_phase_grows_the_window_by_slow_start() {
    let mut h = harness("", false);
    let (_, mut loader) = h.open(4, 1);
    h.turns(1);
    assert_eq!(h.submitted().len(), 4, "initial window: one batch of 4");
    h.auto(true);
    h.turns(1);
    let first = loader.take();
    assert_eq!(first.len(), 1);
    loader.give_back(&first[0].0);
    h.auto(false);
    h.turns(1);
    // Published one batch: the window grew to 2, the ring is empty again.
    assert_eq!(h.submitted().len(), 8);
    h.auto(true);
    for _ in 0..6 {
        h.turns(1);
        loader.take_and_give_back();
    }
    let s = &h.engine.sessions.values().next().unwrap();
    assert_eq!(s.window(), 4, "capped at prefetch.window_batches");
}

#[test]
fn publish_phase_keeps_plan_order_whatever_the_completion_order() {
    let (mut h, _, mut loader) = auto_session(4, 1);
    for _ in 0..4 {
        h.turns(1);
        loader.take_and_give_back();
    }
    // Hold back one sample of the front batch: nothing behind it may pass.
    h.auto(false);
    h.turns(1);
    loader.take_and_give_back();
    h.turns(1);
    assert!(h.submitted().len() > 4, "several batches in flight");
    let pending = h.engine.sessions.values().next().unwrap().pending();
    let front = pending.front().unwrap().slots[0].sample;
    {
        let mut s = h.script.lock().unwrap();
        s.held.push(front);
        s.auto = true;
    }
    h.turns(3);
    assert!(
        loader.take().is_empty(),
        "front batch incomplete: nothing published"
    );
    h.script.lock().unwrap().held.clear();
    h.turns(1);
    let got = loader.take();
    assert!(got.len() >= 2, "the front batch and those behind it");
    let seqs: Vec<u64> = got.iter().map(|(d, _)| d.seq).collect();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(seqs, sorted);
    let indices: Vec<u64> = got.iter().map(|(d, _)| d.batch_index).collect();
    assert!(indices.windows(2).all(|w| w[1] == w[0] + 1), "{indices:?}");
}

#[test]
fn every_sample_arrives_once_per_epoch_byte_for_byte() {
    let (mut h, _, mut loader) = auto_session(5, 2);
    let all = drain(&mut h, &mut loader);
    let (last, rest) = all.split_last().unwrap();
    assert_eq!(last.0.flags & BATCH_END_OF_STREAM, BATCH_END_OF_STREAM);
    for epoch in 0..2 {
        let mut ids: Vec<u64> = rest
            .iter()
            .filter(|(d, _)| d.epoch == epoch)
            .flat_map(|(_, t)| t.iter().map(|e| e.sample_id - 1000))
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..SAMPLES).collect::<Vec<_>>(), "epoch {epoch}");
        let ends = rest
            .iter()
            .filter(|(d, _)| d.epoch == epoch && d.flags & BATCH_END_OF_EPOCH != 0)
            .count();
        assert_eq!(ends, 1);
    }
    for (_, t) in rest {
        for e in t {
            assert_eq!(e.status, 0);
            let bytes = loader.bytes(e);
            assert_eq!(bytes, content(e.sample_id - 1000));
            assert_eq!(e.crc32c, crc32c::crc32c(&bytes), "CRC over the arena bytes");
            assert_eq!(e.label, ((e.sample_id - 1000) % 10) as i32);
        }
    }
    // The arena came back: nothing pinned after the last release.
    h.turns(2);
    let a = h.engine.cache.accounting();
    assert_eq!(a.pinned + a.in_flight, 0, "{a:?}");
}

/// A session opened past its first `k` batches (a loader resuming after
/// its agent went away) delivers exactly the plan's batches from there on,
/// counted across epochs; a first batch past the session is refused.
#[test]
fn a_session_can_start_at_a_given_batch() {
    let (mut h, _, mut whole) = auto_session(5, 2);
    let reference = drain(&mut h, &mut whole);
    let per_epoch = SAMPLES.div_ceil(5);
    let (_, mut resumed) = h.open_at("fake", 5, 2, 3);
    let got = drain(&mut h, &mut resumed);
    let (_, mut later) = h.open_at("fake", 5, 2, per_epoch + 2);
    let got_later = drain(&mut h, &mut later);
    let key = |all: &[(BatchDescriptor, Vec<SampleEntry>)]| -> Vec<(u32, u64, Vec<u64>)> {
        all.iter()
            .filter(|(d, _)| d.sample_count > 0)
            .map(|(d, t)| {
                (
                    d.epoch,
                    d.batch_index,
                    t.iter().map(|e| e.sample_id).collect(),
                )
            })
            .collect()
    };
    let want: Vec<_> = key(&reference)
        .into_iter()
        .filter(|(e, i, _)| *e > 0 || *i >= 3)
        .collect();
    assert_eq!(key(&got), want);
    assert_eq!(want[0].1, 3, "epoch 0 starts at batch 3");
    let want_later: Vec<_> = key(&reference)
        .into_iter()
        .filter(|(e, i, _)| *e == 1 && *i >= 2)
        .collect();
    assert_eq!(key(&got_later), want_later, "epoch 1 from batch 2");
    let mut req = request("fake", 5, 1, per_epoch);
    let Err((code, why)) = h.engine.open_session(0, 0, &req) else {
        panic!("a first batch past the epoch was accepted");
    };
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(why.starts_with("first_batch:"), "{why}");
    req.first_batch -= 1;
    assert!(h.engine.open_session(0, 0, &req).is_ok());
}

#[test]
fn a_saved_catalog_that_differs_refuses_the_open_unless_accepted() {
    let mut h = harness("", false);
    let mut req = OpenSession {
        worker: 1,
        workers: 2,
        wants_catalog: true,
        ..request("fake", 5, 1, 0)
    };
    let (opened, _) = h.engine.open_session(0, 0, &req).expect("opens");
    let catalog = opened.reply.catalog.clone().expect("asked for");
    assert_eq!(
        catalog.sketch.len(),
        crate::provenance::SKETCH_BYTES,
        "the difference sketch comes with the reply"
    );
    let rank = opened.reply.rank_batches_per_epoch;
    assert_eq!(
        opened.reply.batches_per_epoch,
        rank / 2,
        "worker 1 of 2 takes every other batch"
    );
    // The same catalog opens; one that differs is refused, naming it.
    req.catalog = Some(granary_shm::handshake::CatalogCheck {
        expected: catalog.clone(),
        accept_changed: false,
    });
    assert!(h.engine.open_session(0, 0, &req).is_ok());
    let mut other = crate::provenance::Sketch::from_bytes(&catalog.sketch).expect("sketch");
    let (k, v) = crate::provenance::sample_pair("gone-object", 1, b"");
    other.insert(k, v);
    req.catalog = Some(granary_shm::handshake::CatalogCheck {
        expected: granary_shm::handshake::CatalogId {
            fingerprint: catalog.fingerprint ^ 1,
            sketch: other.to_bytes(),
        },
        accept_changed: false,
    });
    let Err((code, why)) = h.engine.open_session(0, 0, &req) else {
        panic!("a changed catalog was accepted");
    };
    assert_eq!(code, ErrorCode::DatasetChanged);
    assert!(
        why.contains("dataset \"fake\" changed") && why.contains("1 no longer in the catalog"),
        "{why}"
    );
    req.catalog.as_mut().expect("set").accept_changed = true;
    assert!(
        h.engine.open_session(0, 0, &req).is_ok(),
        "accepted explicitly"
    );
}

#[test]
fn a_transient_failure_is_retried_after_backoff() {
    let mut h = harness("read_retries = 3\nretry_backoff_ms = 50", false);
    let (_, mut loader) = h.open(4, 1);
    h.turns(1);
    let victim = h.submitted()[0];
    {
        let mut s = h.script.lock().unwrap();
        s.failures
            .insert(victim, VecDeque::from([FailureKind::Transient]));
        s.auto = true;
    }
    h.turns(3);
    assert!(loader.take().is_empty(), "waiting for the retry");
    assert_eq!(h.script.lock().unwrap().attempts[&victim], 1);
    h.clock.advance(Duration::from_millis(60));
    h.turns(3);
    let got = loader.take();
    assert!(!got.is_empty());
    assert_eq!(got[0].0.status, 0);
    assert!(got[0].1.iter().any(|e| e.sample_id - 1000 == victim));
    assert_eq!(h.script.lock().unwrap().attempts[&victim], 2);
    assert_eq!(h.engine.metrics.read_retries.get(), 1);
}

#[test]
fn a_failure_reaches_the_loader_with_its_kind() {
    let mut h = harness("read_retries = 2\nretry_backoff_ms = 1", false);
    let (_, mut loader) = h.open(4, 1);
    h.turns(1);
    let sub = h.submitted();
    let (missing, flaky) = (sub[0], sub[1]);
    {
        let mut s = h.script.lock().unwrap();
        s.failures
            .insert(missing, VecDeque::from([FailureKind::NotFound]));
        s.failures
            .insert(flaky, VecDeque::from([FailureKind::Transient; 5]));
        s.auto = true;
    }
    let mut got = Vec::new();
    for _ in 0..50 {
        h.turns(1);
        got.extend(loader.take());
        if !got.is_empty() {
            break;
        }
        h.clock.advance(Duration::from_millis(10));
    }
    let (d, table) = &got[0];
    assert_eq!(d.status, ErrorCode::Io.as_i32(), "an error batch");
    let status = |x: u64| {
        table
            .iter()
            .find(|e| e.sample_id - 1000 == x)
            .unwrap()
            .status
    };
    assert_eq!(status(missing), ErrorCode::NotFound.as_i32());
    assert_eq!(status(flaky), ErrorCode::Io.as_i32());
    let s = h.script.lock().unwrap();
    assert_eq!(s.attempts[&missing], 1, "not found is not retried");
    assert_eq!(s.attempts[&flaky], 3, "read_retries = 2: three attempts");
    assert_eq!(
        table.iter().filter(|e| e.status == 0).count(),
        2,
        "the other samples are fine"
    );
}

#[test]
fn relaxed_order_lets_ready_samples_pass_a_late_one() {
    let mut h = harness("", true);
    let (_, mut loader) = h.open(4, 1);
    // Grow the window first, then hold back the front batch's first sample.
    let mut got: Vec<(BatchDescriptor, Vec<SampleEntry>)> = Vec::new();
    h.auto(true);
    for _ in 0..4 {
        h.turns(1);
        got.extend(loader.take_and_give_back());
    }
    h.auto(false);
    h.turns(1);
    got.extend(loader.take_and_give_back());
    h.turns(1);
    let late = h.engine.sessions.values().next().unwrap().pending()[0].slots[0].sample;
    {
        let mut s = h.script.lock().unwrap();
        s.held.push(late);
        s.auto = true;
    }
    let before = got.len();
    for _ in 0..30 {
        h.turns(1);
        got.extend(loader.take_and_give_back());
    }
    assert!(got.len() > before, "batches flow past the late sample");
    assert!(h.engine.metrics.relaxed_swaps.get() > 0);
    h.script.lock().unwrap().held.clear();
    got.extend(drain(&mut h, &mut loader));
    let mut ids: Vec<u64> = got
        .iter()
        .flat_map(|(_, t)| t.iter().map(|e| e.sample_id - 1000))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..SAMPLES).collect::<Vec<_>>(), "each sample once");
}

#[test]
fn a_silent_loader_loses_its_session_and_its_pins() {
    let (mut h, sid, mut loader) = auto_session(4, 1);
    h.turns(5);
    let held = loader.take();
    assert!(!held.is_empty());
    assert!(h.engine.cache.accounting().pinned > 0);
    let limit = h.engine.cfg.sessions.client_timeout_ms;
    h.clock.advance(Duration::from_millis(limit - 1));
    h.turns(1);
    assert!(h.engine.sessions.contains_key(&sid), "not yet");
    h.clock.advance(Duration::from_millis(2));
    h.turns(1);
    assert!(!h.engine.sessions.contains_key(&sid), "silent too long");
    // Fenced, so that a loader that resumes reads nothing left in its ring.
    assert_eq!(loader._segment.state(), granary_shm::layout::state::FENCED);
    assert_eq!(loader._segment.violation(), 7);
    let a = h.engine.cache.accounting();
    assert_eq!(a.pinned, 0, "its pins came back: {a:?}");
    assert_eq!(h.engine.metrics.sessions_timed_out.get(), 1);
}

#[test]
fn releases_count_as_signs_of_life() {
    let (mut h, sid, mut loader) = auto_session(4, 3);
    let limit = h.engine.cfg.sessions.client_timeout_ms;
    for _ in 0..5 {
        h.turns(2);
        loader.take_and_give_back();
        h.clock.advance(Duration::from_millis(limit / 2));
    }
    assert!(h.engine.sessions.contains_key(&sid));
}

/// The entry of sample `x` in a sample table.
fn entry_of(table: &[SampleEntry], x: u64) -> SampleEntry {
    *table.iter().find(|e| e.sample_id - 1000 == x).unwrap()
}

/// Turns (1 ms apart) until `loader` has a batch; returns the first.
fn next_batch(h: &mut Harness, loader: &mut Loader) -> (BatchDescriptor, Vec<SampleEntry>) {
    for _ in 0..50 {
        h.turns(1);
        if let Some(b) = loader.take().into_iter().next() {
            return b;
        }
        h.clock.advance(Duration::from_millis(1));
    }
    panic!("no batch after 50 turns");
}

/// The interleaving that once published a sample without a pin: sample X
/// fails (once) while an error batch of session A holding it is on loan;
/// session B's batch, waiting for another sample, requests X; A returns its
/// batch; session C reads X again, takes and returns its batch; B's batch
/// then went out with X "ready" and unpinned (its extent free for reuse, or
/// B never published if the re-read was dropped). Now B's request reads X
/// again at once, pinned by every batch that publishes it, and B gets X's
/// bytes.
#[test]
fn a_failed_sample_read_again_stays_pinned_by_every_batch_that_publishes_it() {
    let mut h = harness("read_retries = 0", false);
    let (_, mut a) = h.open(4, 1);
    h.turns(1);
    let first = h.submitted();
    let x = first[0];
    {
        let mut s = h.script.lock().unwrap();
        s.failures
            .insert(x, VecDeque::from([FailureKind::NotFound]));
        s.auto = true;
    }
    let (da, ta) = next_batch(&mut h, &mut a);
    assert_eq!(da.status, ErrorCode::Io.as_i32(), "A's batch reports X");
    assert_eq!(entry_of(&ta, x).status, ErrorCode::NotFound.as_i32());
    let kx = super::key(0, x);
    assert!(matches!(
        h.engine.cache.lookup(kx),
        Lookup::Failed { pins: 1, .. }
    ));
    // B: one batch of every sample, kept waiting by a sample held back.
    let z = (0..SAMPLES).find(|i| !first.contains(i)).unwrap();
    h.script.lock().unwrap().held.push(z);
    let (_, mut b) = h.open(SAMPLES as u32, 1);
    h.turns(3);
    assert!(b.take().is_empty(), "B waits for sample {z}");
    // A returns its error batch.
    a.give_back(&da);
    h.turns(1);
    // C, on A's plan, gets X (read again, fine this time) and returns it.
    let (_, mut c) = h.open(4, 1);
    let (dc, tc) = next_batch(&mut h, &mut c);
    assert_eq!(dc.status, 0);
    assert_eq!(c.bytes(&entry_of(&tc, x)), content(x));
    c.give_back(&dc);
    h.turns(1);
    // Z arrives: B's batch goes out with X ready and pinned while on loan.
    h.script.lock().unwrap().held.clear();
    let (db, tb) = next_batch(&mut h, &mut b);
    assert_eq!(db.status, 0, "the failure healed for B");
    let ex = entry_of(&tb, x);
    assert_eq!(ex.status, 0);
    for _ in 0..3 {
        h.turns(1);
        assert!(h.engine.cache.pins(kx) > 0, "B's loan pins X");
        assert_eq!(b.bytes(&ex), content(x));
    }
    assert_eq!(
        h.script.lock().unwrap().attempts[&x],
        2,
        "one failed read, then one read for everybody"
    );
    b.give_back(&db);
    h.turns(2);
    assert_eq!(h.engine.cache.pins(kx), 0, "every pin came back");
}

/// A loader that takes batches and never releases them gets one window of
/// batches (`prefetch.window_batches = 4` here) and then waits; another
/// session on the same agent reads its epoch meanwhile.
#[test]
fn batches_on_loan_count_towards_the_window() {
    let (mut h, hoarder, mut greedy) = auto_session(4, 8);
    let mut taken = 0;
    for _ in 0..200 {
        h.turns(1);
        taken += greedy.take().len();
        h.clock.advance(Duration::from_millis(1));
    }
    assert_eq!(taken, 4, "one window of batches, not the 8 epochs");
    assert_eq!(h.engine.sessions[&hoarder].loans(), 4);
    assert!(h.engine.sessions[&hoarder].pending().is_empty());
    let (_, mut honest) = h.open(4, 1);
    let all = drain(&mut h, &mut honest);
    assert_eq!(
        all.len(),
        (SAMPLES / 4) as usize + 1,
        "an epoch, then the end"
    );
    assert_eq!(greedy.take().len(), 0, "still waiting for releases");
}

/// Ring capacities a loader asks for are bounded by the agent.
#[test]
fn rings_larger_than_the_agents_limit_are_refused_at_open() {
    let mut h = harness("", false);
    let mut req = OpenSession {
        ready_capacity: 8192,
        ..request("fake", 4, 1, 0)
    };
    let Err((code, why)) = h.engine.open_session(0, 0, &req) else {
        panic!("a ready ring of 8192 slots was accepted");
    };
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(why.starts_with("ready_capacity: 8192"), "{why}");
    req.ready_capacity = 0;
    req.release_capacity = 1 << 20;
    let Err((_, why)) = h.engine.open_session(0, 0, &req) else {
        panic!("a release ring of 2^20 slots was accepted");
    };
    assert!(why.starts_with("release_capacity:"), "{why}");
    req.ready_capacity = super::open::MAX_LOADER_RING;
    req.release_capacity = super::open::MAX_LOADER_RING;
    assert!(h.engine.open_session(0, 0, &req).is_ok());
    assert!(h.engine.sessions.len() == 1);
}

/// The bytes a session's batches hold, counted from what it holds: the
/// slots of its batches being prepared and the pinned samples of its loans.
fn held_by(h: &Harness, sid: u64, sample_bytes: impl Fn(u64) -> u64) -> u64 {
    let s = &h.engine.sessions[&sid];
    let pending: u64 = s
        .pending()
        .iter()
        .flat_map(|b| b.slots.iter())
        .map(|x| sample_bytes(x.sample))
        .sum();
    let loaned: u64 = s
        .loaned()
        .flat_map(|l| l.pinned.iter())
        .map(|&x| sample_bytes(x))
        .sum();
    assert_eq!(pending + loaned, s.held_bytes(), "the session's own count");
    pending + loaned
}

/// `sessions.max_pinned_percent`: a session of huge samples whose loader
/// never releases pins at most its share of the cache (not its window of
/// batches), while a session of small samples reads its epoch; a batch
/// larger than the cap still goes, alone, so a session never deadlocks.
#[test]
fn a_session_of_huge_samples_pins_at_most_its_share_of_the_cache() {
    const HUGE: u64 = 1 << 20;
    let mut h = harness_with(
        "[sessions]\nmax_pinned_percent = 10",
        false,
        &[("fake", 0), ("huge", HUGE)],
    );
    let huge_bytes = |x: u64| size(x) + HUGE;
    // Batches of 2 samples, about 2.2 MB each: the window (4 batches) would
    // hold about 9 MB, the cap (10 % of about 60 MiB) about 6.3 MB.
    let (hoarder, mut greedy) = h.open_on("huge", 2, 8);
    let cap = h.engine.sessions[&hoarder].max_held_bytes();
    let cache = h.engine.arena.size() - super::table_area(h.engine.arena.size());
    assert_eq!(cap, cache / 100 * 10);
    assert!(4 * 2 * HUGE > cap, "the window alone would pass the cap");
    h.auto(true);
    let (mut taken, mut most) = (0, 0);
    for _ in 0..200 {
        h.turns(1);
        taken += greedy.take().len();
        let held = held_by(&h, hoarder, huge_bytes);
        assert!(held <= cap, "{held} bytes held, cap {cap}");
        most = most.max(held);
        h.clock.advance(Duration::from_millis(1));
    }
    assert!(taken >= 1, "the capped session made progress");
    assert!(
        taken < 4,
        "{taken} batches: the cap, not the window, stopped it"
    );
    assert!(
        most + 2 * (size(0) + HUGE) > cap,
        "it filled its share: {most}"
    );
    // Another session keeps progressing next to it.
    let (_, mut honest) = h.open(4, 1);
    let all = drain(&mut h, &mut honest);
    assert_eq!(all.len(), (SAMPLES / 4) as usize + 1);
    assert_eq!(greedy.take().len(), 0, "still waiting for releases");
    assert!(held_by(&h, hoarder, huge_bytes) <= cap);

    // One batch larger than the cap (8 samples, about 8.4 MB) goes alone:
    // the stream ends, and the session never holds more than that batch.
    let (big, mut loader) = h.open_on("huge", 8, 1);
    let one_batch = 8 * (HUGE + 2800);
    assert!(one_batch > cap);
    let mut batches = 0;
    let mut ended = false;
    for _ in 0..10_000 {
        h.turns(1);
        assert!(held_by(&h, big, huge_bytes) <= one_batch);
        for (d, table) in loader.take() {
            ended |= d.flags & BATCH_END_OF_STREAM != 0;
            if !ended {
                batches += 1;
                for e in &table {
                    assert_eq!(e.status, 0);
                    let x = e.sample_id - 1000;
                    assert_eq!(loader.bytes(e), content_of(x, huge_bytes(x)));
                }
            }
            loader.give_back(&d);
        }
        if ended {
            break;
        }
        h.clock.advance(Duration::from_millis(1));
    }
    assert!(ended, "a batch larger than the cap deadlocked its session");
    assert_eq!(batches, (SAMPLES / 8) as usize);
}

/// A whole session driven by a random loader script, beside an honest
/// session: hostile sessions open with odd batch sizes, take batches and
/// hoard them, release them twice, release forged and stale descriptors,
/// fall silent past the client timeout, and close; the engine never fails
/// a turn, its invariant check holds after every turn (debug builds and
/// tests), the honest session gets every sample once per epoch byte for
/// byte, and once the hostile sessions are gone nothing stays pinned. A new
/// seed each run, printed (`GRANARY_SESSION_FUZZ_SEED` replays one).
/// `GRANARY_SESSION_FUZZ_RUNS` scripts run one after the other (default 1;
/// `scripts/soak.sh` runs more), from consecutive seeds.
#[test]
fn random_loader_scripts_never_hurt_the_engine_or_an_honest_session() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let first = env("GRANARY_SESSION_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let runs = env("GRANARY_SESSION_FUZZ_RUNS").unwrap_or(1);
    println!("session fuzz: {runs} script(s) from GRANARY_SESSION_FUZZ_SEED={first}");
    for seed in first..first.saturating_add(runs) {
        let o = super::loader_script::from_seed(seed);
        println!(
            "session fuzz: {} hostile sessions opened, {} refused, {} ended by the agent",
            o.opened, o.refused, o.fenced
        );
    }
}
