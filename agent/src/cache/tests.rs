use super::*;
use crate::planner::{EpochPlan, PlanParams};

fn k(index: u64) -> SampleKey {
    SampleKey { dataset: 1, index }
}

fn config(arena: u64, reserve: u64, policy: PolicyKind) -> CacheConfig {
    CacheConfig {
        base: 0,
        arena_size: arena,
        align: 16,
        transient_reserve: reserve,
        keep_reserve: 0,
        policy,
    }
}

#[test]
fn restored_samples_take_their_old_extents_or_nothing() {
    let mut cfg = config(4096, 1024, PolicyKind::Lru);
    cfg.keep_reserve = 1024;
    let mut c = Cache::new(cfg).unwrap();
    c.enable_journal();
    // Retained area [0, 2048), transient [2048, 3072), keep [3072, 4096).
    assert!(c.restore(k(1), 0, 100, 7));
    assert!(!c.restore(k(1), 512, 100, 7), "known already");
    assert!(!c.restore(k(2), 64, 100, 7), "overlaps sample 1");
    assert!(!c.restore(k(3), 8, 10, 7), "misaligned");
    assert!(!c.restore(k(4), 2048, 100, 7), "in the transient area");
    assert!(
        !c.restore(k(5), 2000, 100, 7),
        "across the retained area's end"
    );
    assert!(c.restore(k(6), 3072, 100, 8));
    let mut warm: Vec<_> = c.warm_entries().collect();
    warm.sort();
    assert_eq!(
        warm,
        vec![(k(1), 0, 100, 7, false), (k(6), 3072, 100, 8, true)]
    );
    assert!(matches!(c.lookup(k(6)), Lookup::Ready(r) if r.residency == Residency::Kept));
    c.check_invariants().unwrap();
    // The restored retained sample is evictable like any other.
    assert_eq!(c.policy.victim(), Some(k(1)));
    let mut j = Vec::new();
    c.take_journal(&mut j);
    assert!(j.is_empty(), "restoring writes no journal");
    let r = c.reserve(k(9), 50).unwrap();
    c.complete(k(9), 3).unwrap();
    c.take_journal(&mut j);
    assert_eq!(j, vec![(k(9), r.extent.offset, 50, 3)]);
}

#[test]
fn an_unstarted_unpinned_reservation_is_taken_back_whole() {
    let mut cfg = config(1024, 256, PolicyKind::Lru);
    cfg.keep_reserve = 256;
    let mut c = Cache::new(cfg).unwrap();
    let before = c.accounting();
    c.reserve_kept(k(1), 100).unwrap();
    assert!(
        matches!(c.abandon(k(1)), Err(CacheError::Busy(_))),
        "the reserver's pin is held"
    );
    c.unpin(k(1)).unwrap();
    c.abandon(k(1)).unwrap();
    assert!(matches!(c.lookup(k(1)), Lookup::Absent));
    assert_eq!(c.accounting(), before);
    c.check_invariants().unwrap();
    // The keep area has its room back, and a Ready sample is not
    // taken back.
    c.reserve_kept(k(1), 100).unwrap();
    c.complete(k(1), 7).unwrap();
    c.unpin(k(1)).unwrap();
    assert!(matches!(c.abandon(k(1)), Err(CacheError::Busy(_))));
    assert!(matches!(c.abandon(k(2)), Err(CacheError::NotFound(_))));
    c.check_invariants().unwrap();
}

#[test]
fn kept_samples_live_in_their_area_and_are_never_evicted() {
    let mut cfg = config(1024, 256, PolicyKind::Lru);
    cfg.keep_reserve = 256;
    assert_eq!(cfg.retain_limit(), 512);
    let mut c = Cache::new(cfg).unwrap();
    // Two kept samples fill the keep area; a third is refused.
    for i in 0..2 {
        let r = c.reserve_kept(k(i), 100).unwrap();
        assert_eq!(r.residency, Residency::Kept);
        assert!(r.extent.offset >= 768, "{:?}", r.extent);
        c.complete(k(i), 7).unwrap();
        c.unpin(k(i)).unwrap();
    }
    assert!(matches!(
        c.reserve_kept(k(2), 100),
        Err(CacheError::NoSpace { .. })
    ));
    assert_eq!(c.accounting().kept, 224);
    c.check_invariants().unwrap();
    // Fill the retained and transient areas over and over: the kept
    // samples stay Ready.
    for i in 10..60 {
        if let Ok(r) = c.reserve(k(i), 200) {
            assert_ne!(r.residency, Residency::Kept);
            c.complete(k(i), 1).unwrap();
            c.unpin(k(i)).unwrap();
        }
        c.check_invariants().unwrap();
    }
    for i in 0..2 {
        assert!(matches!(c.lookup(k(i)), Lookup::Ready(r) if r.crc32c == 7 && r.pins == 0));
        assert_eq!(c.forget(k(i)), Err(CacheError::Busy(k(i))));
    }
    // Pinned and unpinned again, a kept sample is still not evictable.
    c.pin(k(0)).unwrap();
    c.unpin(k(0)).unwrap();
    assert!(!c.policy().contains(k(0)));
    c.check_invariants().unwrap();
    // A new view keeps only k(1): k(0) is freed, its room reusable; a
    // pinned kept sample the view drops waits.
    c.pin(k(1)).unwrap();
    assert_eq!(c.release_kept(|key| key == k(1)), (1, 0));
    assert!(matches!(c.lookup(k(0)), Lookup::Absent));
    assert_eq!(c.release_kept(|_| false), (0, 1));
    assert!(matches!(c.lookup(k(1)), Lookup::Ready(_)));
    c.unpin(k(1)).unwrap();
    assert_eq!(c.release_kept(|_| false), (1, 0));
    assert_eq!(c.accounting().kept, 0);
    c.check_invariants().unwrap();
    assert!(c.reserve_kept(k(3), 100).is_ok());
    c.complete(k(3), 3).unwrap();
    c.unpin(k(3)).unwrap();
    assert_eq!(c.release_kept(|_| false), (1, 0));
    // A new view makes this node keep samples it holds as ordinary
    // cache entries: they move into the keep area (room for one of
    // them here), out of the policy's reach; a pinned one stays put.
    let cached: Vec<u64> = (10..60)
        .filter(|&i| {
            matches!(c.lookup(k(i)), Lookup::Ready(_))
                && c.entries.get(&k(i)).is_some_and(|e| {
                    matches!(
                        e,
                        Entry::Ready {
                            residency: Residency::Retained,
                            ..
                        }
                    )
                })
        })
        .collect();
    assert!(cached.len() >= 2, "{cached:?}");
    c.pin(k(cached[0])).unwrap();
    let moves = c.adopt_kept(|key| cached.iter().any(|&i| key == k(i)));
    assert_eq!(moves.len(), 1, "room for one in the keep area");
    let (from, to) = moves[0];
    assert!(to.offset >= 768 && from.offset < 768, "{from:?} -> {to:?}");
    let adopted = cached
        .iter()
        .map(|&i| k(i))
        .find(|key| {
            matches!(c.entries.get(key),
                Some(Entry::Ready { residency: Residency::Kept, extent, .. }) if *extent == to)
        })
        .expect("the adopted sample points at its new extent");
    assert_ne!(adopted, k(cached[0]), "the pinned one stays");
    assert!(!c.policy().contains(adopted));
    assert!(matches!(
        c.entries.get(&k(cached[0])),
        Some(Entry::Ready {
            residency: Residency::Retained,
            ..
        })
    ));
    c.check_invariants().unwrap();
    c.unpin(k(cached[0])).unwrap();
    // The reserves cannot exceed the arena.
    let mut bad = config(1024, 512, PolicyKind::Lru);
    bad.keep_reserve = 513;
    assert!(Cache::new(bad).is_err());
}

/// Reserve, complete, unpin: the sample ends cached (or freed).
fn fill(c: &mut Cache, key: SampleKey, len: u64) -> Reservation {
    let r = c.reserve(key, len).unwrap();
    c.complete(key, 7).unwrap();
    c.unpin(key).unwrap();
    c.check_invariants().unwrap();
    r
}

#[test]
fn states_and_accounting() {
    let mut c = Cache::new(config(1024, 256, PolicyKind::Lru)).unwrap();
    assert_eq!(c.accounting().free, 1024);
    let r = c.reserve(k(1), 100).unwrap();
    assert_eq!(r.extent.len, 112);
    assert_eq!(r.residency, Residency::Retained);
    assert!(matches!(c.lookup(k(1)), Lookup::InFlight { pins: 1, .. }));
    let a = c.accounting();
    assert_eq!((a.in_flight, a.free, a.retained), (112, 912, 112));
    c.check_invariants().unwrap();
    let Completion::Ready(ready) = c.complete(k(1), 0xABCD).unwrap() else {
        panic!("not ready");
    };
    assert_eq!((ready.len, ready.crc32c, ready.pins), (100, 0xABCD, 1));
    assert_eq!(c.accounting().pinned, 112);
    assert_eq!(c.pin(k(1)), Ok(2));
    c.unpin(k(1)).unwrap();
    c.unpin(k(1)).unwrap();
    assert_eq!(c.unpin(k(1)), Err(CacheError::NotPinned(k(1))));
    let a = c.accounting();
    assert_eq!((a.cached, a.pinned, a.in_flight), (112, 0, 0));
    assert_eq!(a.total(), 1024);
    c.check_invariants().unwrap();
    // Access counts.
    assert!(matches!(c.access(k(1)), Lookup::Ready(_)));
    assert_eq!(c.access(k(2)), Lookup::Absent);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
}

#[test]
fn bad_calls_are_errors_and_change_nothing() {
    assert!(Cache::new(config(0, 0, PolicyKind::Lru)).is_err());
    assert!(Cache::new(config(100, 200, PolicyKind::Lru)).is_err());
    assert!(Cache::new(CacheConfig {
        align: 3,
        ..config(100, 0, PolicyKind::Lru)
    })
    .is_err());
    let mut c = Cache::new(config(1024, 256, PolicyKind::Clairvoyant)).unwrap();
    assert_eq!(c.reserve(k(1), 0), Err(CacheError::ZeroLength));
    assert!(matches!(
        c.reserve(k(1), 1025),
        Err(CacheError::TooLarge { .. })
    ));
    assert!(matches!(
        c.reserve(k(1), u64::MAX),
        Err(CacheError::TooLarge { .. })
    ));
    // Larger than both areas (768 and 256 bytes).
    assert_eq!(
        c.reserve(k(1), 769),
        Err(CacheError::TooLarge {
            len: 769,
            largest: 768
        })
    );
    assert_eq!(
        CacheConfig {
            base: 8,
            ..config(1024, 256, PolicyKind::Lru)
        }
        .largest_sample(),
        752
    );
    assert_eq!(c.complete(k(1), 0), Err(CacheError::NotFound(k(1))));
    assert_eq!(c.fail(k(1), 0), Err(CacheError::NotFound(k(1))));
    assert_eq!(c.pin(k(1)), Err(CacheError::NotFound(k(1))));
    assert_eq!(c.unpin(k(1)), Err(CacheError::NotFound(k(1))));
    assert_eq!(c.forget(k(1)), Err(CacheError::NotFound(k(1))));
    c.reserve(k(1), 10).unwrap();
    assert!(matches!(
        c.reserve(k(1), 10),
        Err(CacheError::AlreadyPresent {
            state: "in flight",
            ..
        })
    ));
    assert_eq!(c.forget(k(1)), Err(CacheError::Busy(k(1))));
    c.complete(k(1), 0).unwrap();
    assert!(matches!(
        c.complete(k(1), 0),
        Err(CacheError::WrongState { .. })
    ));
    assert!(matches!(
        c.fail(k(1), 3),
        Err(CacheError::WrongState { .. })
    ));
    assert!(matches!(
        c.reserve(k(1), 10),
        Err(CacheError::AlreadyPresent { .. })
    ));
    assert!(c.advance_session(9, 1).is_err());
    assert!(c.remove_session(9).is_err());
    c.check_invariants().unwrap();
    assert_eq!(c.accounting().pinned, 16);
}

#[test]
fn failures_keep_pins_and_allow_retry() {
    let mut c = Cache::new(config(1024, 0, PolicyKind::Lru)).unwrap();
    c.reserve(k(5), 50).unwrap();
    c.pin(k(5)).unwrap(); // a second session waits for it
    c.fail(k(5), 42).unwrap();
    assert_eq!(c.lookup(k(5)), Lookup::Failed { code: 42, pins: 2 });
    assert_eq!(c.accounting().free, 1024);
    assert_eq!(
        c.pin(k(5)),
        Err(CacheError::Failed {
            key: k(5),
            code: 42
        })
    );
    // Still pinned by the two that reported the failure: a retry takes
    // their pins over, so neither ever holds bytes without a pin.
    let r = c.reserve(k(5), 50).unwrap();
    assert!(matches!(c.lookup(k(5)), Lookup::InFlight { pins: 3, .. }));
    assert!(matches!(
        c.reserve(k(5), 50),
        Err(CacheError::AlreadyPresent { .. })
    ));
    c.complete(k(5), 9).unwrap();
    c.unpin(k(5)).unwrap(); // the retrier is done
    c.unpin(k(5)).unwrap(); // the first holder releases its error batch
    assert!(matches!(c.lookup(k(5)), Lookup::Ready(s) if s.pins == 1));
    let a = c.accounting();
    assert_eq!((a.pinned, a.free), (r.extent.len, 1024 - r.extent.len));
    c.unpin(k(5)).unwrap();
    assert_eq!(c.unpin(k(5)), Err(CacheError::NotPinned(k(5))));
    assert_eq!(c.accounting().cached, r.extent.len);
    c.check_invariants().unwrap();
    // A failed record without pins is replaced the same way.
    c.reserve(k(7), 8).unwrap();
    c.unpin(k(7)).unwrap();
    c.fail(k(7), 1).unwrap();
    fill(&mut c, k(7), 8);
    assert!(matches!(c.lookup(k(7)), Lookup::Ready(s) if s.pins == 0));
    c.reserve(k(6), 8).unwrap();
    c.unpin(k(6)).unwrap();
    c.fail(k(6), 1).unwrap();
    c.forget(k(6)).unwrap();
    assert_eq!(c.lookup(k(6)), Lookup::Absent);
    assert_eq!(c.stats().failures, 3);
    c.check_invariants().unwrap();
}

#[test]
fn lru_evicts_least_recent_and_nothing_pinned() {
    let mut c = Cache::new(config(64 * 10, 0, PolicyKind::Lru)).unwrap();
    for i in 0..10 {
        fill(&mut c, k(i), 64);
    }
    assert_eq!(c.accounting().free, 0);
    // Pin 0 (in use), touch 1 (recently hit).
    c.pin(k(0)).unwrap();
    assert!(matches!(c.access(k(1)), Lookup::Ready(_)));
    let r = c.reserve(k(10), 64).unwrap();
    assert_eq!(r.evicted, 1);
    assert_eq!(c.lookup(k(2)), Lookup::Absent);
    assert!(matches!(c.lookup(k(0)), Lookup::Ready(_)));
    assert!(matches!(c.lookup(k(1)), Lookup::Ready(_)));
    c.complete(k(10), 0).unwrap();
    c.check_invariants().unwrap();
    // Pin everything: no room, no eviction.
    for i in 1..10 {
        if i != 2 {
            c.pin(k(i)).unwrap();
        }
    }
    assert_eq!(
        c.reserve(k(11), 64),
        Err(CacheError::NoSpace {
            key: k(11),
            need: 64
        })
    );
    assert_eq!(c.stats().no_space, 1);
    c.check_invariants().unwrap();
    let a = c.accounting();
    assert_eq!((a.pinned, a.cached, a.free), (640, 0, 0));
}

#[test]
fn minio_fills_once_then_reads_transiently() {
    let mut c = Cache::new(config(1000, 200, PolicyKind::Minio)).unwrap();
    // Retain limit 800: 8 samples of 100 bytes (align 16 → 112 each: 7).
    let mut retained = 0;
    for i in 0..10 {
        let r = fill(&mut c, k(i), 100);
        if r.residency == Residency::Retained {
            retained += 1;
        }
    }
    assert_eq!(retained, 7);
    assert_eq!(c.stats().evictions, 0);
    // Transient reads left nothing behind.
    let a = c.accounting();
    assert_eq!((a.cached, a.transient, a.retained), (7 * 112, 0, 7 * 112));
    assert_eq!(c.lookup(k(9)), Lookup::Absent);
    // Transient reads use what the retained set leaves: 1000 - 784 =
    // 216 bytes, room for one.
    let r1 = c.reserve(k(20), 100).unwrap();
    assert_eq!(r1.residency, Residency::Transient);
    assert!(matches!(
        c.reserve(k(21), 100),
        Err(CacheError::NoSpace { .. })
    ));
    // The owner of 20 vanishes mid-read: it is parked until the read ends.
    c.unpin(k(20)).unwrap();
    assert!(matches!(c.lookup(k(20)), Lookup::InFlight { pins: 0, .. }));
    assert_eq!(c.accounting().in_flight, 112);
    c.check_invariants().unwrap();
    assert!(matches!(
        c.reserve(k(21), 100),
        Err(CacheError::NoSpace { .. })
    ));
    assert_eq!(c.complete(k(20), 0), Ok(Completion::Discarded));
    assert_eq!(c.accounting().in_flight, 0);
    // Two sessions share the transient 21; it is freed at the last unpin.
    c.reserve(k(21), 100).unwrap();
    c.pin(k(21)).unwrap();
    c.complete(k(21), 0).unwrap();
    c.unpin(k(21)).unwrap();
    assert!(matches!(c.lookup(k(21)), Lookup::Ready(_)));
    assert_eq!(c.accounting().pinned, 112);
    c.unpin(k(21)).unwrap();
    assert_eq!(c.lookup(k(21)), Lookup::Absent);
    assert_eq!(c.accounting().free, 1000 - 784);
    c.check_invariants().unwrap();
}

#[test]
fn parked_retained_read_lands_in_the_cache() {
    let mut c = Cache::new(config(1024, 0, PolicyKind::Lru)).unwrap();
    c.reserve(k(1), 100).unwrap();
    c.unpin(k(1)).unwrap(); // owner gone
    assert!(matches!(c.lookup(k(1)), Lookup::InFlight { pins: 0, .. }));
    assert_eq!(c.accounting().in_flight, 112);
    c.check_invariants().unwrap();
    c.complete(k(1), 9).unwrap();
    assert_eq!(c.accounting().cached, 112);
    assert!(c.policy().contains(k(1)));
    c.check_invariants().unwrap();
    // Forget drops a cached sample.
    c.forget(k(1)).unwrap();
    assert_eq!(c.accounting().free, 1024);
    assert_eq!(c.stats().evictions, 0);
}

#[test]
fn clairvoyant_evicts_furthest_and_bypasses() {
    let params = PlanParams {
        num_samples: 8,
        seed: 11,
        rank: 0,
        world_size: 1,
        batch_size: 1,
        drop_last: false,
    };
    let plan = SessionPlan::new(params, 0, 3).unwrap();
    let order: Vec<u64> = (0..3)
        .flat_map(|e| EpochPlan::new(&params, e).unwrap().samples().to_vec())
        .collect();
    // Room for 4 samples of 16 bytes, plus one transient slot.
    let mut c = Cache::new(config(80, 16, PolicyKind::Clairvoyant)).unwrap();
    c.add_session(1, 1, plan).unwrap();
    let mut hits = 0;
    for (pos, &s) in order.iter().enumerate() {
        let key = k(s);
        match c.access(key) {
            Lookup::Ready(_) => {
                hits += 1;
                c.pin(key).unwrap();
            }
            Lookup::Absent => {
                c.reserve(key, 16).unwrap();
                c.complete(key, 0).unwrap();
            }
            other => panic!("{other:?}"),
        }
        c.advance_session(1, pos as u64 + 1).unwrap();
        c.unpin(key).unwrap();
        c.check_invariants().unwrap();
    }
    // Belady with 4 slots over 3 permutations of 8: the reference count.
    assert_eq!(hits, belady_hits(&order, 4));
    assert!(c.stats().transient_reservations > 0);
    c.remove_session(1).unwrap();
    assert_eq!(c.session_position(1), None);
}

/// Belady with bypass on a unit-size trace, by brute force.
fn belady_hits(trace: &[u64], slots: usize) -> u64 {
    let next = |from: usize, s: u64| {
        trace[from..]
            .iter()
            .position(|&x| x == s)
            .map_or(usize::MAX, |p| p + from)
    };
    let mut cache: Vec<u64> = Vec::new();
    let mut hits = 0;
    for (t, &s) in trace.iter().enumerate() {
        if cache.contains(&s) {
            hits += 1;
            continue;
        }
        if cache.len() < slots {
            cache.push(s);
            continue;
        }
        let (i, far) = cache
            .iter()
            .enumerate()
            .map(|(i, &c)| (i, next(t + 1, c)))
            .max_by_key(|&(_, n)| n)
            .unwrap();
        if next(t + 1, s) < far {
            cache[i] = s;
        }
    }
    hits
}

#[test]
fn randomized_operations_keep_the_invariants() {
    for policy in PolicyKind::ALL {
        let mut c = Cache::new(config(4096, 512, policy)).unwrap();
        let mut rng = 0x1234_5678u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for step in 0..20_000 {
            let key = k(next(64));
            match next(8) {
                0 | 1 => {
                    let _ = c.reserve(key, 1 + next(300));
                }
                2 => {
                    let _ = c.complete(key, 1);
                }
                3 => {
                    let _ = c.fail(key, 5);
                }
                4 => {
                    let _ = c.pin(key);
                }
                5 | 6 => {
                    let _ = c.unpin(key);
                }
                _ => {
                    let _ = c.access(key);
                    let _ = c.forget(key);
                }
            }
            if step % 16 == 0 {
                c.check_invariants()
                    .unwrap_or_else(|e| panic!("{policy} step {step}: {e}"));
            }
        }
        // Drain: complete everything in flight, release every pin.
        let keys: Vec<SampleKey> = (0..64).map(k).collect();
        for &key in &keys {
            if let Lookup::InFlight { .. } = c.lookup(key) {
                c.complete(key, 0).unwrap();
            }
            while c.unpin(key).is_ok() {}
        }
        c.check_invariants().unwrap();
        let a = c.accounting();
        assert_eq!((a.pinned, a.in_flight, a.transient), (0, 0, 0));
        assert_eq!(a.free + a.cached, 4096);
        for &key in &keys {
            let _ = c.forget(key);
        }
        assert_eq!(c.accounting().free, 4096);
        assert!(c.is_empty());
    }
}
