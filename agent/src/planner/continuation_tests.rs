//! Elastic continuation in locality mode (`docs/reliability.md`, "Another
//! world size in locality mode"): a job that took global steps `0..K` of an
//! epoch under one world size, rank layout and view goes on at step `K`
//! under another world size with the same global batch (and another layout
//! and view), and the two together deliver the epoch once.
//!
//! Why it holds: global step `k` is entries `k·G .. (k+1)·G` of the epoch's
//! (padded) permutation for every world size whose global batch is `G`
//! (`granary_peer::assign::global_step`), and the locality assignment only
//! moves samples between the ranks of one step. So the samples of steps
//! `< K` are the permutation's first `K·G` entries under any layout and
//! view, and the new layout's plan from step `K` on assigns exactly the
//! rest, in the permutation's order, by locality. These tests check it on
//! every rank's real plan, with directories of different views.

use super::placement::Placement;
use super::*;
use granary_peer::assign::Layout;
use granary_peer::keep::Directory;
use granary_peer::view::{Member, View};

/// A job's placement context: the directory of a view of `nodes` members
/// (each keeping `keep` bytes of 100-byte samples) and its rank layout.
struct Job {
    dir: Arc<Directory>,
    layout: Arc<Layout>,
}

impl Job {
    fn new(nodes: u32, node_of_rank: Vec<u32>, n: u64, keep: u64, view_epoch: u64) -> Job {
        let view = View::new(
            "job",
            view_epoch,
            (0..nodes).map(|i| Member::new(format!("n{i}"), format!("10.0.0.{i}:7000"), keep)),
        )
        .unwrap();
        let sizes = vec![100u64; n as usize];
        let budgets = vec![keep; nodes as usize];
        Job {
            dir: Arc::new(Directory::compute(&view, 0xfeed, &sizes, &budgets).unwrap()),
            layout: Arc::new(Layout::new(nodes, node_of_rank).unwrap()),
        }
    }

    /// Every rank's locality plan of `epoch`.
    fn plans(&self, n: u64, batch: u32, drop_last: bool, epoch: u32) -> Vec<EpochPlan> {
        let ws = self.layout.world_size();
        (0..ws)
            .map(|rank| {
                let p = Placement {
                    dir: Arc::clone(&self.dir),
                    me: self.layout.node_of(rank).unwrap(),
                    layout: Some(Arc::clone(&self.layout)),
                };
                EpochPlan::with_placement(&params(n, rank, ws, batch, drop_last), epoch, Some(&p))
                    .unwrap()
            })
            .collect()
    }
}

fn params(n: u64, rank: u32, ws: u32, batch: u32, drop_last: bool) -> PlanParams {
    PlanParams {
        num_samples: n,
        seed: 29,
        rank,
        world_size: ws,
        batch_size: batch,
        drop_last,
    }
}

/// Every rank's batches `steps` of `plans`, sorted: what the job took in
/// those global steps.
fn taken(plans: &[EpochPlan], steps: std::ops::Range<u64>) -> Vec<u64> {
    let mut out: Vec<u64> = steps
        .flat_map(|k| plans.iter().flat_map(move |p| p.batch(k).unwrap_or(&[])))
        .copied()
        .collect();
    out.sort_unstable();
    out
}

/// The changes of the issue: world size 4 → 3, 2 → 3 and 3 → 1 with a
/// global batch of 12, the views and layouts changing too (4 → 3 loses a
/// node of the view).
fn changes(n: u64) -> Vec<(&'static str, Job, u32, Job, u32)> {
    let keep = 6_000u64;
    vec![
        (
            "4 -> 3, a node lost",
            Job::new(4, vec![0, 1, 2, 3], n, keep, 1),
            3,
            Job::new(3, vec![0, 1, 2], n, keep, 2),
            4,
        ),
        (
            "2 -> 3",
            Job::new(2, vec![0, 1], n, keep, 1),
            6,
            Job::new(3, vec![0, 1, 2], n, keep, 2),
            4,
        ),
        (
            "3 -> 1",
            Job::new(3, vec![0, 1, 1], n, keep, 1),
            4,
            Job::new(3, vec![2], n, keep, 1),
            12,
        ),
    ]
}

#[test]
fn old_steps_before_k_and_new_steps_from_k_deliver_the_epoch_once() {
    // 240 = 20 global steps of 12: no padding, every sample exactly once.
    let n = 240u64;
    for (what, old, b_old, new, b_new) in changes(n) {
        for epoch in [0, 3] {
            let (po, pn) = (
                old.plans(n, b_old, false, epoch),
                new.plans(n, b_new, false, epoch),
            );
            let steps = po[0].num_batches();
            assert_eq!(steps, 20, "{what}");
            assert_eq!(pn[0].num_batches(), steps, "{what}: same global batch");
            for k in [0, 1, 7, 13, 19, 20] {
                let mut all = taken(&po, 0..k);
                all.extend(taken(&pn, k..steps));
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..n).collect::<Vec<_>>(),
                    "{what}, epoch {epoch}, K {k}: every sample once"
                );
                // Each new step gives every rank exactly its batch size.
                for step in k..steps {
                    assert!(
                        pn.iter()
                            .all(|p| p.batch(step).unwrap().len() == b_new as usize),
                        "{what}: step {step}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_continuation_delivers_what_the_new_world_size_delivers_padding_and_truncation_included() {
    // 246 samples: no world size divides the epoch into whole steps, so
    // the last step pads (or `drop_last` truncates) as the new world size
    // does; the union is the new world size's own epoch, as a multiset,
    // and each step from K on is the exact-order step of the new plan.
    let n = 246u64;
    for drop_last in [false, true] {
        for (what, old, b_old, new, b_new) in changes(n) {
            let (po, pn) = (
                old.plans(n, b_old, drop_last, 1),
                new.plans(n, b_new, drop_last, 1),
            );
            let ws_new = new.layout.world_size();
            let exact: Vec<EpochPlan> = (0..ws_new)
                .map(|r| EpochPlan::new(&params(n, r, ws_new, b_new, drop_last), 1).unwrap())
                .collect();
            let steps = pn[0].num_batches();
            let old_steps = po[0].num_batches();
            let whole = steps.min(old_steps) - 1;
            for k in [0, 2, whole / 2, whole] {
                let mut all = taken(&po, 0..k);
                all.extend(taken(&pn, k..steps));
                all.sort_unstable();
                assert_eq!(
                    all,
                    taken(&exact, 0..steps),
                    "{what}, drop_last {drop_last}, K {k}"
                );
                for step in k..steps {
                    assert_eq!(
                        taken(&pn, step..step + 1),
                        taken(&exact, step..step + 1),
                        "{what}, step {step}"
                    );
                }
                // The old steps taken are the permutation's first K·G.
                let perm = epoch_permutation(29, 1, n).unwrap();
                let mut head = perm[..(k * 12) as usize].to_vec();
                head.sort_unstable();
                assert_eq!(taken(&po, 0..k), head, "{what}, K {k}");
            }
            // Nothing repeated but the new world size's own padding.
            let distinct = {
                let mut d = taken(&exact, 0..steps);
                d.dedup();
                d.len() as u64
            };
            let delivered = taken(&exact, 0..steps).len() as u64;
            if drop_last {
                assert_eq!(delivered, distinct, "{what}");
            } else {
                assert_eq!(distinct, n, "{what}");
                assert_eq!(delivered, n.div_ceil(u64::from(ws_new)) * u64::from(ws_new));
            }
        }
    }
}

#[test]
fn the_old_steps_do_not_depend_on_the_layout_or_view_but_their_ranks_do() {
    // The premise, on its own: the same world size under two layouts and
    // views takes the same samples in steps 0..K, split differently.
    let n = 240u64;
    let a = Job::new(2, vec![0, 0, 1, 1], n, 6_000, 1);
    let b = Job::new(3, vec![2, 0, 1, 0], n, 6_000, 5);
    let (pa, pb) = (a.plans(n, 3, false, 2), b.plans(n, 3, false, 2));
    let mut differ = 0;
    for k in 0..pa[0].num_batches() {
        assert_eq!(taken(&pa, k..k + 1), taken(&pb, k..k + 1), "step {k}");
        differ += usize::from(pa.iter().zip(&pb).any(|(x, y)| x.batch(k) != y.batch(k)));
    }
    assert!(differ > 10, "the layouts split {differ} steps differently");
}
