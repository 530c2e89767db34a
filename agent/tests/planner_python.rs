//! The Python reference (`tests/planner_reference.py`) reproduces the
//! planner's order exactly: permutations, shards and batches.

mod common_reference;

use std::process::Command;

use common_reference::{batches, run as run_reference, script as reference_script};
use granary_agent::planner::{epoch_permutation, EpochPlan, PlanParams};

fn check_batches(p: PlanParams, epoch: u32) {
    let plan = EpochPlan::new(&p, epoch).expect("valid parameters");
    let ours: Vec<Vec<u64>> = plan.batches().map(<[u64]>::to_vec).collect();
    let theirs = batches(&p, epoch);
    assert_eq!(
        ours.len(),
        theirs.len(),
        "batch count differs for {p:?} epoch {epoch}"
    );
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "batch {i} differs for {p:?} epoch {epoch}");
    }
}

#[test]
fn batches_match_reference() {
    let base = PlanParams {
        num_samples: 20_000,
        seed: 42,
        rank: 0,
        world_size: 2,
        batch_size: 32,
        drop_last: false,
    };
    let cases = [
        // The quickstart's shape: 20,000 samples, two ranks, several epochs.
        (base, 0),
        (PlanParams { rank: 1, ..base }, 0),
        (base, 1),
        (PlanParams { rank: 1, ..base }, 2),
        (
            PlanParams {
                drop_last: true,
                batch_size: 48,
                ..base
            },
            1,
        ),
        // Uneven sizes, padding and truncation.
        (
            PlanParams {
                num_samples: 10,
                batch_size: 3,
                ..base
            },
            0,
        ),
        (
            PlanParams {
                num_samples: 10,
                batch_size: 3,
                rank: 1,
                ..base
            },
            0,
        ),
        (
            PlanParams {
                num_samples: 1001,
                world_size: 7,
                rank: 6,
                batch_size: 10,
                ..base
            },
            4,
        ),
        (
            PlanParams {
                num_samples: 1001,
                world_size: 7,
                rank: 3,
                batch_size: 10,
                drop_last: true,
                ..base
            },
            4,
        ),
        // Fewer samples than ranks: wrap-around padding, several times over.
        (
            PlanParams {
                num_samples: 3,
                world_size: 8,
                rank: 7,
                batch_size: 1,
                ..base
            },
            0,
        ),
        (
            PlanParams {
                num_samples: 1,
                world_size: 5,
                rank: 4,
                batch_size: 2,
                ..base
            },
            0,
        ),
        // Fewer samples than ranks with drop_last: no batches at all.
        (
            PlanParams {
                num_samples: 3,
                world_size: 8,
                rank: 2,
                batch_size: 1,
                drop_last: true,
                ..base
            },
            0,
        ),
        // Batch larger than the share, with and without drop_last.
        (
            PlanParams {
                num_samples: 50,
                batch_size: 1000,
                ..base
            },
            0,
        ),
        (
            PlanParams {
                num_samples: 50,
                batch_size: 1000,
                drop_last: true,
                ..base
            },
            0,
        ),
        // Extreme seeds and epochs.
        (
            PlanParams {
                num_samples: 777,
                seed: 0,
                world_size: 1,
                batch_size: 64,
                ..base
            },
            0,
        ),
        (
            PlanParams {
                num_samples: 777,
                seed: u64::MAX,
                world_size: 3,
                rank: 2,
                batch_size: 5,
                ..base
            },
            u32::MAX,
        ),
    ];
    for (p, epoch) in cases {
        check_batches(p, epoch);
    }
}

#[test]
fn permutations_match_reference() {
    for &(seed, epoch, n) in &[
        (42u64, 0u32, 10u64),
        (42, 1, 10),
        (0, 0, 1),
        (1, 0, 2),
        (u64::MAX, 7, 100_000),
        (0x1234_5678_9ABC_DEF0, 123, 4097),
    ] {
        let ours = epoch_permutation(seed, epoch, n).expect("valid size");
        let theirs = run_reference(&[
            "--permutation".to_string(),
            "--seed".to_string(),
            seed.to_string(),
            "--epoch".to_string(),
            epoch.to_string(),
            "--n".to_string(),
            n.to_string(),
        ]);
        assert_eq!(theirs.len(), 1);
        assert_eq!(
            ours, theirs[0],
            "permutation differs for seed {seed} epoch {epoch} n {n}"
        );
    }
}

#[test]
fn reference_rejects_bad_parameters() {
    for args in [
        ["--n", "0", "--rank", "0", "--world-size", "1"],
        ["--n", "10", "--rank", "2", "--world-size", "2"],
        ["--n", "10", "--rank", "0", "--world-size", "0"],
    ] {
        let output = Command::new("python3")
            .arg(reference_script())
            .args(["--seed", "1", "--epoch", "0", "--batch-size", "1"])
            .args(args)
            .output()
            .expect("python3 runs");
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(output.stdout.is_empty());
    }
}
