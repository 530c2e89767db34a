//! Whole sessions driven by a loader script, beside an honest session:
//! hostile sessions open with odd batch sizes, take batches and hoard them,
//! release them twice, release forged and stale descriptors, fall silent
//! past the client timeout, and close. The engine never fails a turn, its
//! invariant check holds after every turn (debug builds and tests), the
//! honest session gets every sample once per epoch byte for byte, and once
//! the hostile sessions are gone nothing stays pinned.
//!
//! The script's choices come from a word source: a seeded generator in the
//! engine's unit tests and `scripts/soak.sh`
//! (`random_loader_scripts_never_hurt_the_engine_or_an_honest_session`),
//! the fuzzer's bytes in the `session` cargo-fuzz target (`agent/fuzz`).
//! Built for tests and with the `fuzzing` feature only.

use super::harness::{content, harness, Loader, SAMPLES};
use granary_shm::arena::ArenaView;
use granary_shm::handshake::OpenSession;
use granary_shm::layout::BATCH_END_OF_STREAM;
use granary_shm::segment::LoaderSegment;
use granary_shm::{BatchDescriptor, ReleaseDescriptor};
use std::time::Duration;

/// What a script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Hostile sessions the engine opened.
    pub opened: u64,
    /// Hostile sessions it refused at open.
    pub refused: u64,
    /// Hostile sessions it ended itself (fenced, silent, finished).
    pub fenced: u64,
}

/// Runs one loader script whose every choice is the next word of `next`;
/// `seed` names the script in failure messages. Panics when the engine
/// fails a turn or breaks a promise (see the module documentation).
pub fn run(seed: &str, mut next: impl FnMut() -> u64) -> Outcome {
    const EPOCHS: u32 = 30;
    let mut h = harness(
        "sample_deadline_ms = 1500\n[sessions]\nclient_timeout_ms = 2000\n",
        false,
    );
    h.auto(true);
    let (honest_sid, mut honest) = h.open(8, EPOCHS);
    let mut seen = vec![vec![0u32; SAMPLES as usize]; EPOCHS as usize];
    let mut ended = false;
    // (session, loader, batches taken and not released)
    let mut hostile: Vec<(u64, Loader, Vec<BatchDescriptor>)> = Vec::new();
    let (mut opened, mut refused, mut fenced) = (0u64, 0u64, 0u64);
    for _ in 0..50_000 {
        if ended {
            break;
        }
        let pick = |n: usize, r: u64| (r % n.max(1) as u64) as usize;
        match next() % 12 {
            0 if hostile.len() < 4 => {
                let batch = [1u32, 3, 8, 64, 65_536, 70_000][pick(6, next())];
                let ds = 0;
                let req = OpenSession {
                    seed: next(),
                    drop_last: next().is_multiple_of(2),
                    epoch_count: 1 + (next() % 3) as u32,
                    ..OpenSession::new("fake", batch)
                };
                match h.engine.open_session(h.next_conn, ds, &req) {
                    Ok((o, sid)) => {
                        h.next_conn += 1;
                        let s = &h.engine.sessions[&sid];
                        let mut seg = LoaderSegment::attach_fd(
                            s.segment().fd().unwrap(),
                            Some(o.reply.instance_epoch),
                        )
                        .unwrap();
                        let (ready, release) = seg.take_endpoints().unwrap();
                        let arena = ArenaView::map(o.arena_fd, o.reply.arena_size).unwrap();
                        let l = Loader {
                            ready,
                            release,
                            arena,
                            _segment: seg,
                        };
                        hostile.push((sid, l, Vec::new()));
                        opened += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
            1 if !hostile.is_empty() => {
                let (sid, _, _) = hostile.remove(pick(hostile.len(), next()));
                h.engine.end_session(sid, None);
            }
            2 | 3 if !hostile.is_empty() => {
                let i = pick(hostile.len(), next());
                let (_, l, held) = &mut hostile[i];
                held.extend(l.take().into_iter().map(|(d, _)| d));
            }
            4 | 5 if !hostile.is_empty() => {
                let i = pick(hostile.len(), next());
                let r = next();
                let (_, l, held) = &mut hostile[i];
                if !held.is_empty() {
                    let d = held.remove(pick(held.len(), r));
                    let rel = ReleaseDescriptor {
                        seq: d.seq,
                        token: d.token,
                    };
                    let _ = l.release.try_push(rel);
                    if r.is_multiple_of(4) {
                        // Released twice.
                        let _ = l.release.try_push(rel);
                    }
                }
            }
            6 if !hostile.is_empty() => {
                let i = pick(hostile.len(), next());
                let rel = ReleaseDescriptor {
                    seq: next() % 8,
                    token: next(),
                };
                let _ = hostile[i].1.release.try_push(rel);
            }
            7 => h.clock.advance(Duration::from_millis(next() % 1500)),
            _ => {}
        }
        h.engine.turn().unwrap();
        // Sessions the engine ended (fenced, silent, or finished and
        // closed) leave the script.
        let before = hostile.len();
        hostile.retain(|(sid, _, _)| h.engine.sessions.contains_key(sid));
        fenced += (before - hostile.len()) as u64;
        assert!(
            h.engine.sessions.contains_key(&honest_sid),
            "the honest session was ended (seed {seed})"
        );
        // The honest loader is alive: it beats, as libgranary does; it
        // reads on every other turn, so the script has time to act.
        honest._segment.beat();
        if next().is_multiple_of(2) {
            h.clock.advance(Duration::from_millis(1));
            continue;
        }
        for (d, t) in honest.take() {
            for e in &t {
                assert_eq!(e.status, 0, "seed {seed}");
                let i = e.sample_id - 1000;
                assert_eq!(honest.bytes(e), content(i), "sample {i}, seed {seed}");
                seen[d.epoch as usize][i as usize] += 1;
            }
            honest.give_back(&d);
            ended |= d.flags & BATCH_END_OF_STREAM != 0;
        }
        h.clock.advance(Duration::from_millis(1));
    }
    assert!(ended, "the honest session did not finish (seed {seed})");
    for (epoch, counts) in seen.iter().enumerate() {
        assert!(
            counts.iter().all(|&c| c == 1),
            "epoch {epoch}: not every sample exactly once (seed {seed}): {counts:?}"
        );
    }
    for (sid, _, _) in hostile.drain(..) {
        h.engine.end_session(sid, None);
    }
    h.engine.end_session(honest_sid, None);
    h.turns(2);
    let a = h.engine.cache.accounting();
    assert_eq!(a.pinned, 0, "pins left behind (seed {seed}): {a:?}");
    Outcome {
        opened,
        refused,
        fenced,
    }
}

/// The script from a seed (the engine's unit tests, `scripts/soak.sh`).
pub fn from_seed(seed: u64) -> Outcome {
    let mut gen = granary_base::SplitMix64(seed);
    run(&seed.to_string(), move || gen.next_u64())
}

/// The script from fuzzer bytes: each choice is the next 8 bytes (little
/// endian, zero-padded). Once the bytes run out every choice is 1: the
/// hostile sessions are ended one per turn and the honest one reads to its
/// end, so every input is a whole script.
pub fn from_bytes(data: &[u8]) -> Outcome {
    let mut words = data.chunks(8);
    run("fuzz input", move || match words.next() {
        Some(w) => {
            let mut b = [0u8; 8];
            b[..w.len()].copy_from_slice(w);
            u64::from_le_bytes(b)
        }
        None => 1,
    })
}
