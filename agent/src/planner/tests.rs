use super::permutation::{SplitMix64, GAMMA};
use super::*;

fn params(n: u64, ws: u32, rank: u32, batch: u32, drop_last: bool) -> PlanParams {
    PlanParams {
        num_samples: n,
        seed: 42,
        rank,
        world_size: ws,
        batch_size: batch,
        drop_last,
    }
}

/// `DistributedSampler.__iter__` transcribed literally (list padding by
/// repetition, truncation, slicing), to check [`rank_share`] against.
fn pytorch_share(perm: &[u64], ws: u32, rank: u32, drop_last: bool) -> Vec<u64> {
    let n = perm.len() as u64;
    let ws64 = u64::from(ws);
    let num_samples = if drop_last && !n.is_multiple_of(ws64) {
        // math.ceil((n - ws) / ws), which is 0 when n < ws.
        if n < ws64 {
            0
        } else {
            (n - ws64).div_ceil(ws64)
        }
    } else {
        n.div_ceil(ws64)
    };
    let total = (num_samples * ws64) as usize;
    let mut indices = perm.to_vec();
    if !drop_last {
        let padding = total - indices.len();
        if padding <= indices.len() {
            indices.extend_from_slice(&perm[..padding]);
        } else {
            let reps = padding.div_ceil(perm.len());
            let repeated: Vec<u64> = perm.repeat(reps);
            indices.extend_from_slice(&repeated[..padding]);
        }
    } else {
        indices.truncate(total);
    }
    assert_eq!(indices.len(), total);
    indices
        .iter()
        .skip(rank as usize)
        .step_by(ws as usize)
        .copied()
        .collect()
}

#[test]
fn mix64_known_values() {
    // Reference outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
    let mut rng = SplitMix64 { state: 0 };
    assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
    assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
}

#[test]
fn permutation_is_a_permutation() {
    for n in [1u64, 2, 3, 7, 10, 100, 1000, 65_537] {
        let perm = epoch_permutation(7, 3, n).unwrap();
        assert_eq!(perm.len() as u64, n);
        let mut seen = vec![false; n as usize];
        for &x in &perm {
            assert!(x < n);
            assert!(!seen[x as usize], "{x} appears twice for n={n}");
            seen[x as usize] = true;
        }
    }
    assert!(epoch_permutation(7, 3, 0).unwrap().is_empty());
}

#[test]
fn permutation_is_deterministic_and_varies() {
    let a = epoch_permutation(42, 0, 1000).unwrap();
    assert_eq!(a, epoch_permutation(42, 0, 1000).unwrap());
    assert_ne!(a, epoch_permutation(42, 1, 1000).unwrap());
    assert_ne!(a, epoch_permutation(43, 0, 1000).unwrap());
    // PyTorch seeds with seed + epoch; here (1, 0) and (0, 1) differ.
    assert_ne!(
        epoch_permutation(1, 0, 1000).unwrap(),
        epoch_permutation(0, 1, 1000).unwrap()
    );
    let identity: Vec<u64> = (0..1000).collect();
    assert_ne!(a, identity);
}

#[test]
fn stream_keys_are_distinct() {
    let mut keys = std::collections::HashSet::new();
    for seed in [0u64, 1, 2, 42, u64::MAX] {
        for epoch in [0u32, 1, 2, 3, 1000, u32::MAX] {
            assert!(keys.insert(stream_key(seed, epoch)));
        }
    }
}

#[test]
fn permutation_is_roughly_uniform() {
    // Position of each element over many seeds: every (element, position)
    // cell of a 4x4 table should be hit about 1/4 of the time.
    let trials = 8000u64;
    let mut counts = [[0u32; 4]; 4];
    for seed in 0..trials {
        let perm = epoch_permutation(seed, 0, 4).unwrap();
        for (pos, &x) in perm.iter().enumerate() {
            counts[x as usize][pos] += 1;
        }
    }
    for row in counts {
        for c in row {
            assert!((1800..=2200).contains(&c), "cell count {c} far from 2000");
        }
    }
}

#[test]
fn bounded_draw_matches_reference_including_rejections() {
    // Values from `bounded` in tests/planner_reference.py, starting at
    // state 1. With s = 2^63 + 1 about half the draws are rejected: the
    // 11 results consume 17 draws.
    let mut rng = SplitMix64 { state: 1 };
    let big = (1u64 << 63) + 1;
    let bounds = [big, big, big, big, big, big, big, big, 3, u64::MAX, 6];
    let got: Vec<u64> = bounds.iter().map(|&s| rng.below(s)).collect();
    assert_eq!(
        got,
        [
            8_955_919_645_141_445_295,
            4_098_490_376_910_890_117,
            4_097_618_618_563_484_380,
            7_036_458_801_432_265_024,
            7_323_326_090_023_318_475,
            3_727_553_580_931_688_368,
            5_584_017_301_749_351_935,
            4_889_115_802_880_168_261,
            1,
            3_081_251_696_030_599_738,
            3,
        ]
    );
    assert_eq!(rng.state, 1u64.wrapping_add(17u64.wrapping_mul(GAMMA)));
    assert_eq!(rng.state, 0x81AF_1551_73F2_3D66);
}

#[test]
fn worked_example_of_the_docs() {
    // docs/planner.md: seed 42, epoch 0, n = 10, two ranks, batches of 3.
    assert_eq!(stream_key(42, 0), 0x7E9A_8556_6D74_4C80);
    assert_eq!(
        epoch_permutation(42, 0, 10).unwrap(),
        [1, 3, 2, 5, 6, 0, 9, 7, 8, 4]
    );
    let p = params(10, 2, 0, 3, false);
    let batches = |p: &PlanParams| -> Vec<Vec<u64>> {
        EpochPlan::new(p, 0)
            .unwrap()
            .batches()
            .map(<[u64]>::to_vec)
            .collect()
    };
    assert_eq!(batches(&p), [vec![1, 2, 6], vec![9, 8]]);
    assert_eq!(
        batches(&PlanParams { rank: 1, ..p }),
        [vec![3, 5, 0], vec![7, 4]]
    );
    assert_eq!(
        batches(&PlanParams {
            rank: 1,
            drop_last: true,
            ..p
        }),
        [vec![3, 5, 0]]
    );
    let ws4 = params(10, 4, 3, 3, false);
    assert_eq!(rank_share(&ws4, 0).unwrap(), [5, 7, 3]);
    assert_eq!(
        rank_share(
            &PlanParams {
                drop_last: true,
                ..ws4
            },
            0
        )
        .unwrap(),
        [5, 7]
    );
}

#[test]
fn bounded_draw_stays_in_range() {
    let mut rng = SplitMix64 { state: 1 };
    for s in [1u64, 2, 3, 5, 1 << 40, u64::MAX, (1 << 63) + 1] {
        for _ in 0..1000 {
            assert!(rng.below(s) < s);
        }
    }
}

#[test]
fn ranks_partition_the_epoch_when_divisible_or_drop_last() {
    for &(n, ws, drop_last) in &[
        (100u64, 4u32, false),
        (100, 4, true),
        (101, 4, true),
        (103, 4, true),
        (7, 7, false),
        (1000, 3, true),
    ] {
        let mut all = Vec::new();
        for rank in 0..ws {
            let share = rank_share(&params(n, ws, rank, 8, drop_last), 5).unwrap();
            assert_eq!(share.len() as u64, n / u64::from(ws));
            all.extend(share);
        }
        let len = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(
            all.len(),
            len,
            "a sample was delivered twice (n={n}, ws={ws})"
        );
        assert_eq!(len as u64, n / u64::from(ws) * u64::from(ws));
    }
}

#[test]
fn padding_matches_pytorch() {
    for &(n, ws) in &[
        (10u64, 3u32),
        (10, 4),
        (11, 4),
        (1, 4),
        (3, 8),
        (2, 7),
        (5, 16),
        (20_001, 2),
    ] {
        for drop_last in [false, true] {
            let perm = epoch_permutation(42, 2, n).unwrap();
            let mut covered = vec![0u32; n as usize];
            for rank in 0..ws {
                let p = params(n, ws, rank, 3, drop_last);
                let share = rank_share(&p, 2).unwrap();
                assert_eq!(
                    share,
                    pytorch_share(&perm, ws, rank, drop_last),
                    "n={n} ws={ws} rank={rank} drop_last={drop_last}"
                );
                assert_eq!(share.len() as u64, samples_per_rank(&p).unwrap());
                for &x in &share {
                    covered[x as usize] += 1;
                }
            }
            if !drop_last {
                // Every sample at least once; padding repeats the
                // permutation's first entries.
                assert!(covered.iter().all(|&c| c >= 1));
                let extra = n.div_ceil(u64::from(ws)) * u64::from(ws) - n;
                for (k, &x) in perm.iter().enumerate() {
                    let expected = 1 + extra / n + u64::from((k as u64) < extra % n);
                    assert_eq!(u64::from(covered[x as usize]), expected);
                }
            } else {
                assert!(covered.iter().all(|&c| c <= 1));
            }
        }
    }
}

#[test]
fn share_sizes_for_edge_cases() {
    // n < ws without drop_last: every rank gets one sample, wrapped.
    let p = params(3, 8, 7, 4, false);
    assert_eq!(samples_per_rank(&p).unwrap(), 1);
    assert_eq!(batches_per_epoch(&p).unwrap(), 1);
    let perm = epoch_permutation(42, 0, 3).unwrap();
    assert_eq!(rank_share(&p, 0).unwrap(), vec![perm[7 % 3]]);
    // n < ws with drop_last: nothing for anyone, as in PyTorch.
    let p = params(3, 8, 0, 4, true);
    assert_eq!(samples_per_rank(&p).unwrap(), 0);
    assert_eq!(batches_per_epoch(&p).unwrap(), 0);
    let plan = EpochPlan::new(&p, 0).unwrap();
    assert_eq!(plan.num_batches(), 0);
    assert_eq!(plan.batches().count(), 0);
    assert_eq!(plan.batch(0), None);
    // batch_size larger than the share.
    let p = params(10, 2, 1, 64, false);
    assert_eq!(batches_per_epoch(&p).unwrap(), 1);
    assert_eq!(EpochPlan::new(&p, 0).unwrap().batch(0).unwrap().len(), 5);
    let p = params(10, 2, 1, 64, true);
    assert_eq!(batches_per_epoch(&p).unwrap(), 0);
    assert_eq!(EpochPlan::new(&p, 0).unwrap().num_batches(), 0);
    // One sample, one rank.
    let p = params(1, 1, 0, 1, true);
    assert_eq!(
        EpochPlan::new(&p, 9).unwrap().batches().collect::<Vec<_>>(),
        vec![&[0u64][..]]
    );
}

#[test]
fn batches_cut_the_share() {
    for drop_last in [false, true] {
        for &(n, ws, b) in &[(10u64, 2u32, 3u32), (100, 3, 7), (64, 4, 4), (9, 1, 10)] {
            for rank in 0..ws {
                let p = params(n, ws, rank, b, drop_last);
                let plan = EpochPlan::new(&p, 1).unwrap();
                let share = rank_share(&p, 1).unwrap();
                let expected = batches_per_epoch(&p).unwrap();
                assert_eq!(plan.num_batches(), expected);
                assert_eq!(plan.batches().len() as u64, expected);
                let batches: Vec<&[u64]> = plan.batches().collect();
                for (i, batch) in batches.iter().enumerate() {
                    assert_eq!(plan.batch(i as u64), Some(*batch));
                    if drop_last || i + 1 < batches.len() {
                        assert_eq!(batch.len(), b as usize);
                    }
                }
                assert_eq!(plan.batch(expected), None);
                assert_eq!(plan.batch(u64::MAX), None);
                let flat: Vec<u64> = batches.concat();
                assert_eq!(flat, plan.samples());
                if drop_last {
                    assert_eq!(flat[..], share[..flat.len()]);
                    assert!(share.len() - flat.len() < b as usize);
                } else {
                    assert_eq!(flat, share);
                }
            }
        }
    }
}

#[test]
fn bad_parameters_are_rejected() {
    let good = params(10, 2, 0, 3, false);
    assert_eq!(good.validate(), Ok(()));
    let cases = [
        (
            PlanParams {
                num_samples: 0,
                ..good
            },
            PlanError::NoSamples,
        ),
        (
            PlanParams {
                num_samples: MAX_SAMPLES + 1,
                ..good
            },
            PlanError::TooManySamples {
                num_samples: MAX_SAMPLES + 1,
            },
        ),
        (
            PlanParams {
                world_size: 0,
                ..good
            },
            PlanError::ZeroWorldSize,
        ),
        (
            PlanParams { rank: 2, ..good },
            PlanError::RankOutOfRange {
                rank: 2,
                world_size: 2,
            },
        ),
        (
            PlanParams {
                batch_size: 0,
                ..good
            },
            PlanError::ZeroBatchSize,
        ),
    ];
    for (p, err) in cases {
        assert_eq!(p.validate(), Err(err.clone()));
        assert_eq!(samples_per_rank(&p), Err(err.clone()));
        assert_eq!(batches_per_epoch(&p), Err(err.clone()));
        assert_eq!(rank_share(&p, 0), Err(err.clone()));
        assert_eq!(EpochPlan::new(&p, 0), Err(err.clone()));
        assert_eq!(SessionPlan::new(p, 0, 1), Err(err));
    }
    assert_eq!(SessionPlan::new(good, 0, 0), Err(PlanError::NoEpochs));
    assert_eq!(
        SessionPlan::new(good, u32::MAX, 2),
        Err(PlanError::EpochRangeOverflow {
            first_epoch: u32::MAX,
            epoch_count: 2
        })
    );
    assert!(SessionPlan::new(good, u32::MAX, 1).is_ok());
    assert!(epoch_permutation(0, 0, MAX_SAMPLES + 1).is_err());
    let msg = PlanError::RankOutOfRange {
        rank: 4,
        world_size: 4,
    }
    .to_string();
    assert!(
        msg.contains("rank 4") && msg.contains("world_size 4"),
        "{msg}"
    );
    assert!(PlanError::NoSamples
        .to_string()
        .contains("num_samples is 0"));
}

#[test]
fn session_cursor_walks_epochs_in_order() {
    let p = params(23, 2, 1, 5, false);
    let session = SessionPlan::new(p, 3, 3).unwrap();
    assert_eq!(session.epochs(), 3..6);
    assert_eq!(session.batches_per_epoch(), 3);
    assert_eq!(session.total_batches(), 9);
    let mut cursor = session.cursor();
    let mut walked = Vec::new();
    while let Some(batch) = cursor.next_batch().unwrap() {
        walked.push((batch.epoch, batch.index, batch.samples.to_vec()));
    }
    let mut expected = Vec::new();
    for epoch in 3..6 {
        let plan = EpochPlan::new(&p, epoch).unwrap();
        for (i, batch) in plan.batches().enumerate() {
            expected.push((epoch, i as u64, batch.to_vec()));
        }
    }
    assert_eq!(walked, expected);
    assert_eq!(walked.len() as u64, session.total_batches());
    // Exhausted cursors stay exhausted.
    assert_eq!(cursor.next_batch().unwrap(), None);

    // A session without batches yields nothing.
    let empty = SessionPlan::new(params(3, 8, 0, 4, true), 0, 5).unwrap();
    assert_eq!(empty.total_batches(), 0);
    assert_eq!(empty.cursor().next_batch().unwrap(), None);

    // The last representable epoch.
    let last = SessionPlan::new(p, u32::MAX, 1).unwrap();
    let mut cursor = last.cursor();
    assert_eq!(cursor.next_batch().unwrap().unwrap().epoch, u32::MAX);
}

#[test]
fn workers_split_the_rank_batches_round_robin() {
    for (n, ws, bs, drop_last) in [
        (23, 2, 5, false),
        (100, 3, 7, true),
        (9, 1, 2, false),
        (5, 2, 4, false),
    ] {
        for workers in 1..=4u32 {
            let p = params(n, ws, 0, bs, drop_last);
            let rank = SessionPlan::new(p, 1, 2).unwrap();
            let mut rank_batches = Vec::new();
            let mut c = rank.cursor();
            while let Some(b) = c.next_batch().unwrap() {
                rank_batches.push((b.epoch, b.index, b.samples.to_vec()));
            }
            let mut union = Vec::new();
            for w in 0..workers {
                let part = SessionPlan::new(p, 1, 2)
                    .unwrap()
                    .with_workers(w, workers)
                    .unwrap();
                let mut mine = Vec::new();
                let mut c = part.cursor();
                while let Some(b) = c.next_batch().unwrap() {
                    mine.push((b.epoch, b.samples.to_vec()));
                }
                let expect: Vec<_> = rank_batches
                    .iter()
                    .filter(|(_, i, _)| *i % u64::from(workers) == u64::from(w))
                    .map(|(e, _, s)| (*e, s.clone()))
                    .collect();
                assert_eq!(
                    mine, expect,
                    "n {n} ws {ws} bs {bs} worker {w} of {workers}"
                );
                assert_eq!(mine.len() as u64, part.total_batches());
                let samples: u64 = mine.iter().map(|(_, s)| s.len() as u64).sum();
                assert_eq!(
                    samples,
                    2 * part.samples_per_epoch(),
                    "n {n} ws {ws} bs {bs} dl {drop_last} w {w}/{workers}"
                );
                // Resuming at a batch of the part skips exactly those.
                if part.total_batches() > 1 {
                    let mut c = part.cursor_at(1);
                    assert_eq!(
                        c.next_batch().unwrap().map(|b| b.samples.to_vec()),
                        Some(mine[1].1.clone())
                    );
                }
                union.extend(mine);
            }
            assert_eq!(union.len(), rank_batches.len());
        }
    }
    let p = params(10, 1, 0, 2, false);
    let e = SessionPlan::new(p, 0, 1)
        .unwrap()
        .with_workers(2, 2)
        .unwrap_err();
    assert_eq!(
        e,
        PlanError::WorkerOutOfRange {
            worker: 2,
            workers: 2
        }
    );
    assert!(e.to_string().contains("worker 2 is out of range"));
}

#[test]
fn large_permutation_is_a_permutation() {
    let n = 2_000_000u64;
    let perm = epoch_permutation(1, 1, n).unwrap();
    let mut seen = vec![false; n as usize];
    for &x in &perm {
        assert!(!std::mem::replace(&mut seen[x as usize], true));
    }
}
