//! The order the agent delivers, batch by batch, is the documented one: it
//! equals what the Python reference (`tests/planner_reference.py`) prints for
//! the same seed, epoch, rank, world size, batch size and drop_last. The same
//! seed gives the same order again; different epochs give different orders.

mod common;
mod common_reference;

use common::*;
use granary::SessionOptions;
use granary_agent::planner::PlanParams;
use std::time::{Duration, Instant};

/// One epoch as delivered: its batches' sample ids, in order.
type Epoch = Vec<Vec<u64>>;

/// Runs a session of `epoch_count` epochs from `first_epoch` and records
/// every batch, checking indices, epochs and end-of-epoch flags on the way.
fn delivered(agent: &TestAgent, p: PlanParams, first_epoch: u32, epoch_count: u32) -> Vec<Epoch> {
    let client = agent.client();
    let o = SessionOptions {
        first_epoch,
        epoch_count,
        ..plan_options(DATASET, &p)
    };
    let mut s = client.open_session(&o).expect("open");
    let per_epoch = s.info().batches_per_epoch;
    let mut epochs: Vec<Epoch> = vec![Vec::new(); epoch_count as usize];
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        let k = (b.epoch() - first_epoch) as usize;
        let ep = &mut epochs[k];
        assert_eq!(b.index(), ep.len() as u64, "batch index");
        assert_eq!(
            b.is_end_of_epoch(),
            b.index() + 1 == per_epoch,
            "end-of-epoch flag on batch {} of {per_epoch}",
            b.index()
        );
        let mut ids = Vec::with_capacity(b.len());
        for smp in b.samples() {
            verify(&agent.spec, &smp);
            ids.push(smp.id());
        }
        ep.push(ids);
        s.release(b).expect("release");
    }
    s.close().expect("close");
    for (k, ep) in epochs.iter().enumerate() {
        assert_eq!(ep.len() as u64, per_epoch, "epoch {k}: batches");
    }
    epochs
}

#[test]
fn delivered_order_equals_the_python_reference() {
    let _wd = watchdog("order_reference", 240);
    let started = Instant::now();
    // 500 samples: 3 ranks do not divide it (padding), and with batches of
    // 7 each share ends in a partial batch (dropped with drop_last).
    let agent = TestAgent::start(AgentOptions {
        files: 500,
        classes: 10,
        mean_size: 4_000,
        ..AgentOptions::default()
    });
    let n = agent.spec.num_files;
    let first = PlanParams {
        num_samples: n,
        seed: 20_240_601,
        rank: 1,
        world_size: 3,
        batch_size: 7,
        drop_last: false,
    };
    let cases = [
        first,
        PlanParams {
            drop_last: true,
            ..first
        },
        PlanParams {
            seed: 0xDEAD_BEEF_0000_0001,
            rank: 0,
            world_size: 1,
            batch_size: 32,
            ..first
        },
        PlanParams {
            seed: 42,
            rank: 3,
            world_size: 4,
            batch_size: 16,
            drop_last: true,
            ..first
        },
    ];
    for p in cases {
        let run = delivered(&agent, p, 0, 2);
        for (epoch, got) in run.iter().enumerate() {
            let want = common_reference::batches(&p, epoch as u32);
            assert_eq!(got.len(), want.len(), "{p:?} epoch {epoch}: batch count");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g, w,
                    "{p:?} epoch {epoch}: batch {i} differs from the reference"
                );
            }
            if p.drop_last {
                assert!(got.iter().all(|b| b.len() == p.batch_size as usize));
            }
        }
        // Different epochs, different orders.
        assert_ne!(run[0], run[1], "{p:?}: epochs 0 and 1 in the same order");
        // The same seed again: the same order.
        let again = delivered(&agent, p, 0, 2);
        assert_eq!(
            again, run,
            "{p:?}: a second session delivered another order"
        );
        // Starting at epoch 1 gives epoch 1's order.
        let later = delivered(&agent, p, 1, 1);
        assert_eq!(
            later[0], run[1],
            "{p:?}: epoch 1 depends on where the session started"
        );
    }
    // Another seed, another order.
    let a = delivered(&agent, cases[0], 0, 1);
    let b = delivered(
        &agent,
        PlanParams {
            seed: 7,
            ..cases[0]
        },
        0,
        1,
    );
    assert_ne!(a, b, "seeds 20240601 and 7 gave the same order");

    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    println!("order_reference: {:.1?}", started.elapsed());
    agent.stop();
}
