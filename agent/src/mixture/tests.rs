use super::*;
use crate::config::MixtureSource;
use crate::planner::SessionPlan;
use std::sync::Arc;

fn source(name: &str) -> MixtureSource {
    MixtureSource {
        dataset: name.to_owned(),
        weight: None,
        repeat: None,
        choose: None,
    }
}

fn weighted(weights: &[f64], epoch: Option<u64>) -> MixtureConfig {
    MixtureConfig {
        name: "mix".into(),
        epoch_samples: epoch,
        source: weights
            .iter()
            .enumerate()
            .map(|(k, &w)| MixtureSource {
                weight: Some(w),
                ..source(&format!("d{k}"))
            })
            .collect(),
    }
}

/// Per source, how many of `batch`'s samples it gave.
fn counts(order: &MixtureOrder, batch: &[u64]) -> Vec<u64> {
    let mut c = vec![0u64; order.sources().len()];
    for &s in batch {
        c[order.member_of(s).0] += 1;
    }
    c
}

fn plan(order: &Arc<MixtureOrder>, rank: u32, ws: u32, batch: u32, epochs: u32) -> SessionPlan {
    SessionPlan::for_test(order.epoch_len(), 42, rank, ws, batch, epochs)
        .with_mixture(Arc::clone(order))
}

#[test]
fn weights_half_three_tenths_fifth_give_exact_batches_of_32() {
    // 1000 + 600 + 400 samples, batches of 32, one and four ranks.
    let order =
        Arc::new(MixtureOrder::new(&weighted(&[0.5, 0.3, 0.2], None), &[1000, 600, 400]).unwrap());
    assert_eq!(order.quotas(), [1000, 600, 400]);
    assert_eq!(order.epoch_len(), 2000);
    for ws in [1u32, 4] {
        let mut totals = [0u64; 3];
        let mut full = 0;
        for rank in 0..ws {
            let p = plan(&order, rank, ws, 32, 2);
            for epoch in p.epochs() {
                let e = p.epoch(epoch as u32).unwrap();
                for b in e.batches() {
                    let c = counts(&order, b);
                    if b.len() == 32 {
                        full += 1;
                        assert_eq!(c[0], 16, "{c:?}");
                        assert!(c[1] == 9 || c[1] == 10, "{c:?}");
                        assert!(c[2] == 6 || c[2] == 7, "{c:?}");
                    }
                    for k in 0..3 {
                        totals[k] += c[k];
                    }
                }
            }
        }
        // Per epoch, 2000 = 62 × 32 + 16 with one rank; 15 steps of 4 × 32
        // and a tail of 80 (20 per rank) with four.
        assert_eq!(full, if ws == 1 { 124 } else { 120 }, "ws {ws}");
        assert_eq!(totals, [2000, 1200, 800], "two epochs, ws {ws}");
    }
}

#[test]
fn the_remainders_rotate_so_that_every_window_stays_within_one_sample() {
    let order = MixtureOrder::new(&weighted(&[0.5, 0.3, 0.2], None), &[1000, 600, 400]).unwrap();
    let seq = order.sequence(7, 3, 1, 32).unwrap();
    let mut seen = [0u64; 3];
    for (i, b) in seq.chunks(32).enumerate() {
        for (k, c) in counts(&order, b).into_iter().enumerate() {
            seen[k] += c;
        }
        let end = ((i + 1) * 32).min(seq.len()) as f64;
        for (k, w) in [0.5, 0.3, 0.2].into_iter().enumerate() {
            let behind = end * w - seen[k] as f64;
            assert!(behind.abs() < 1.0, "batch {i} source {k}: {behind}");
        }
    }
}

#[test]
fn random_mixtures_keep_quotas_and_totals() {
    // A small generator of test cases from the planner's own mixer.
    let mut x = 1u64;
    let mut next = |m: u64| {
        x = mix64(x.wrapping_add(0x9E37_79B9_7F4A_7C15));
        x % m
    };
    for _ in 0..200 {
        let k = 1 + next(6) as usize;
        let weights: Vec<f64> = (0..k).map(|_| 0.05 + next(1000) as f64 / 97.0).collect();
        let sizes: Vec<u64> = (0..k).map(|_| 1 + next(300)).collect();
        let e = 1 + next(3000);
        let Ok(order) = MixtureOrder::new(&weighted(&weights, Some(e)), &sizes) else {
            continue; // a source with no sample per epoch
        };
        let (ws, bs) = (1 + next(4) as u32, 1 + next(64) as u32);
        let seq = order
            .sequence(next(1 << 40), next(9) as u32, ws, bs)
            .unwrap();
        assert_eq!(seq.len() as u64, e);
        assert_eq!(counts(&order, &seq), order.quotas());
        // Every rank batch of a full global step: floor or ceil of its share.
        let step = u64::from(bs) * u64::from(ws);
        for r in 0..ws {
            let share: Vec<u64> = seq
                .iter()
                .skip(r as usize)
                .step_by(ws as usize)
                .copied()
                .take(((e / step) * u64::from(bs)) as usize)
                .collect();
            for b in share.chunks(bs as usize) {
                for (kk, c) in counts(&order, b).into_iter().enumerate() {
                    let exact = f64::from(bs) * order.quotas()[kk] as f64 / e as f64;
                    assert!(
                        c as f64 >= exact.floor() - 1e-9 && c as f64 <= exact.ceil() + 1e-9,
                        "source {kk} count {c} exact {exact} (quotas {:?}, bs {bs}, ws {ws})",
                        order.quotas()
                    );
                }
            }
        }
    }
}

#[test]
fn repeat_and_choose_set_each_epochs_totals() {
    let cfg = MixtureConfig {
        name: "mix".into(),
        epoch_samples: None,
        source: vec![
            MixtureSource {
                repeat: Some(4.0),
                ..source("small")
            },
            MixtureSource {
                choose: Some(Choose::Count(250)),
                ..source("big")
            },
            MixtureSource {
                choose: Some(Choose::Fraction(0.1)),
                ..source("huge")
            },
            MixtureSource {
                repeat: Some(1.5),
                ..source("half")
            },
        ],
    };
    let order = MixtureOrder::new(&cfg, &[100, 1000, 1000, 10]).unwrap();
    assert_eq!(order.quotas(), [400, 250, 100, 15]);
    assert_eq!(order.epoch_len(), 765);
    assert_eq!(order.index_space(), 2110);
    let mut chosen = Vec::new();
    for epoch in 0..2 {
        let seq = order.sequence(9, epoch, 2, 16).unwrap();
        assert_eq!(counts(&order, &seq), [400, 250, 100, 15]);
        let mut per = vec![0u32; 2110];
        for &s in &seq {
            per[s as usize] += 1;
        }
        // The 4× source: every sample four times; the chosen ones at most once.
        assert!(per[..100].iter().all(|&c| c == 4));
        assert!(per[100..2100].iter().all(|&c| c <= 1));
        assert!(per[2100..].iter().all(|&c| c == 1 || c == 2));
        chosen.push(per[100..1100].to_vec());
    }
    assert_ne!(chosen[0], chosen[1], "a new choice every epoch");
}

#[test]
fn the_order_is_a_pure_function_of_seed_and_epoch() {
    let order = MixtureOrder::new(&weighted(&[2.0, 1.0], Some(500)), &[50, 400]).unwrap();
    let again = MixtureOrder::new(&weighted(&[2.0, 1.0], Some(500)), &[50, 400]).unwrap();
    let a = order.sequence(5, 1, 2, 8).unwrap();
    assert_eq!(a, again.sequence(5, 1, 2, 8).unwrap());
    assert_ne!(a, order.sequence(5, 2, 2, 8).unwrap());
    assert_ne!(a, order.sequence(6, 1, 2, 8).unwrap());
    assert_eq!(order.quotas(), [333, 167]);
}

#[test]
fn bad_mixtures_are_refused_with_the_dataset_named() {
    let e = MixtureOrder::new(&weighted(&[1.0, 1.0], None), &[10, 0]).unwrap_err();
    assert!(e.contains("\"d1\" has no samples"), "{e}");
    let e = MixtureOrder::new(&weighted(&[1000.0, 1.0], Some(10)), &[10, 10]).unwrap_err();
    assert!(e.contains("\"d1\" gets no sample"), "{e}");
}

#[test]
fn member_of_finds_each_source() {
    let order = MixtureOrder::new(&weighted(&[1.0, 1.0, 1.0], None), &[3, 1, 5]).unwrap();
    assert_eq!(order.offsets(), [0, 3, 4]);
    let got: Vec<(usize, u64)> = (0..9).map(|i| order.member_of(i)).collect();
    assert_eq!(
        got,
        [
            (0, 0),
            (0, 1),
            (0, 2),
            (1, 0),
            (2, 0),
            (2, 1),
            (2, 2),
            (2, 3),
            (2, 4)
        ]
    );
}

/// The goal, measured on the real cache and clairvoyant policy the
/// way `cache::sim` replays a session (reads complete at once): weights
/// 0.5/0.3/0.2 over 500 + 1500 + 1000 samples with 4,000 samples per epoch,
/// so the first source is read 4× per epoch and the others 0.8× (the
/// upsampled source is 1/6 of the unique bytes, the most these weights
/// allow with the others downsampled); the arena
/// is half the mixture's unique bytes. Prints the figures as one JSON line
/// (docs/benchmarks.md).
#[test]
fn a_four_times_upsampled_source_stays_resident_in_half_the_bytes() {
    use crate::cache::{Cache, CacheConfig, Lookup, PolicyKind, SampleKey};
    let order = Arc::new(
        MixtureOrder::new(&weighted(&[0.5, 0.3, 0.2], Some(4000)), &[500, 1500, 1000]).unwrap(),
    );
    assert_eq!(order.quotas(), [2000, 1200, 800]);
    let n = order.index_space();
    let sizes: Vec<u64> = (0..n).map(|i| 60_000 + mix64(i) % 100_000).collect();
    let unique: u64 = sizes.iter().sum();
    let run = |policy: PolicyKind| -> Vec<[(u64, u64); 3]> {
        let arena = (unique / 2).next_multiple_of(4096);
        let mut cache = Cache::new(CacheConfig::new(arena, policy)).unwrap();
        let p = plan(&order, 0, 1, 32, 4);
        cache.add_session(0, 0, p.clone()).unwrap();
        let mut cursor = p.cursor_at(0);
        let mut per_epoch = vec![[(0u64, 0u64); 3]; 4];
        let (mut position, mut pinned) = (0u64, Vec::new());
        while let Some(batch) = cursor.next_batch().unwrap() {
            pinned.clear();
            for &index in batch.samples {
                let key = SampleKey { dataset: 0, index };
                let hit = match cache.access(key) {
                    Lookup::Ready(_) => {
                        cache.pin(key).unwrap();
                        pinned.push(key);
                        true
                    }
                    _ => {
                        if cache.reserve(key, sizes[index as usize]).is_ok() {
                            cache.complete(key, 0).unwrap();
                            pinned.push(key);
                        }
                        false
                    }
                };
                let c = &mut per_epoch[batch.epoch as usize][order.member_of(index).0];
                c.0 += 1;
                c.1 += u64::from(hit);
            }
            position += batch.samples.len() as u64;
            cache.advance_session(0, position).unwrap();
            for &key in &pinned {
                cache.unpin(key).unwrap();
            }
        }
        per_epoch
    };
    let rate = |c: (u64, u64)| c.1 as f64 / c.0.max(1) as f64;
    let after_first = |e: &[[(u64, u64); 3]], k: usize| {
        let (a, h) = e[1..]
            .iter()
            .fold((0, 0), |(a, h), x| (a + x[k].0, h + x[k].1));
        rate((a, h))
    };
    let clairvoyant = run(PolicyKind::Clairvoyant);
    let lru = run(PolicyKind::Lru);
    let up = after_first(&clairvoyant, 0);
    println!(
        "{{\"unique_bytes\":{unique},\"arena_bytes\":{},\"upsampled_hit_rate_after_epoch0\":{up:.4},\
         \"upsampled_hit_rate_epoch0\":{:.4},\"downsampled_hit_rates_after_epoch0\":[{:.4},{:.4}],\
         \"lru_upsampled_hit_rate_after_epoch0\":{:.4}}}",
        unique / 2,
        rate(clairvoyant[0][0]),
        after_first(&clairvoyant, 1),
        after_first(&clairvoyant, 2),
        after_first(&lru, 0),
    );
    assert!(
        up >= 0.9,
        "the 4x source's hit rate after epoch 0 is {up:.3}"
    );
}
