//! Where each planned sample is processed, for sessions of an agent with
//! peers: the locality-aware order (`granary_peer::assign`) and the counts
//! of samples by where they are kept.
//!
//! A session in **locality mode** delivers, for every global step, the
//! samples [`granary_peer::assign::assign_step`] gives its rank, with the
//! directory's owner of a kept sample as its holder. The directory depends
//! only on the view, the capacities and the catalog, never on which peers
//! are up, so a lost peer changes where bytes come from, not the order.
//!
//! Every session of an agent with a directory (exact or locality) counts
//! the samples of each batch it plans by placement: `local` (this node
//! keeps it), `peer` (another node keeps it: moved to this node in
//! locality mode, or simply elsewhere in exact order) and `uncached` (no
//! node keeps it).

use super::params::{PlanError, PlanParams};
use granary_peer::assign::{assign_step, global_step, Layout};
use granary_peer::keep::Directory;
use std::sync::Arc;

/// Indexes into a placement count.
pub(crate) const LOCAL: usize = 0;
/// See [`LOCAL`].
pub(crate) const PEER: usize = 1;
/// See [`LOCAL`].
pub(crate) const UNCACHED: usize = 2;

/// What a session's order and placement counts are computed from.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// The dataset's directory under the agent's view.
    pub dir: Arc<Directory>,
    /// This agent's index in the view.
    pub me: u32,
    /// `Some`: locality mode, with the job's rank layout (session ranks).
    pub layout: Option<Arc<Layout>>,
}

impl Placement {
    /// The node that keeps `sample`, if any.
    pub(crate) fn holder(&self, sample: u64) -> Option<u32> {
        self.dir
            .is_kept(sample)
            .then(|| self.dir.owner(sample))
            .flatten()
            .map(|m| m as u32)
    }

    /// `[local, peer, uncached]` counts of `samples`.
    pub(crate) fn classify(&self, samples: &[u64]) -> [u32; 3] {
        let mut n = [0u32; 3];
        for &s in samples {
            let at = match self.holder(s) {
                Some(v) if v == self.me => LOCAL,
                Some(_) => PEER,
                None => UNCACHED,
            };
            n[at] += 1;
        }
        n
    }

    /// The `mode` label of the session's counts.
    pub(crate) fn mode(&self) -> &'static str {
        if self.layout.is_some() {
            "locality"
        } else {
            "exact"
        }
    }

    /// Rank `params.rank`'s samples of the epoch whose permutation is
    /// `perm`, in locality mode: step by step, what the assignment gives
    /// the rank. `None` in exact mode.
    pub(crate) fn locality_order(
        &self,
        params: &PlanParams,
        perm: &[u64],
    ) -> Option<Result<Vec<u64>, PlanError>> {
        let layout = self.layout.as_deref()?;
        Some(self.assign_epoch(params, perm, layout))
    }

    fn assign_epoch(
        &self,
        params: &PlanParams,
        perm: &[u64],
        layout: &Layout,
    ) -> Result<Vec<u64>, PlanError> {
        let fail = |e: granary_peer::assign::AssignError| PlanError::Assignment(e.to_string());
        let mut out = Vec::new();
        let mut holders = Vec::new();
        for step in 0.. {
            let Some(g) = global_step(
                perm,
                params.world_size,
                params.batch_size,
                params.drop_last,
                step,
            )
            .map_err(fail)?
            else {
                break;
            };
            holders.clear();
            holders.extend(g.samples.iter().map(|&s| self.holder(s)));
            let a = assign_step(&g.samples, &holders, layout, g.batch_size).map_err(fail)?;
            out.extend_from_slice(a.rank(params.rank));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::EpochPlan;
    use granary_peer::view::{Member, View};

    fn placement(nodes: u32, ranks_per_node: u32, n: u64, keep: u64, me: u32) -> Placement {
        let view = View::new(
            "job",
            1,
            (0..nodes).map(|i| Member::new(format!("n{i}"), format!("10.0.0.{i}:7000"), keep)),
        )
        .unwrap();
        let sizes = vec![100u64; n as usize];
        let budgets = vec![keep; nodes as usize];
        let dir = Directory::compute(&view, 0xfeed, &sizes, &budgets).unwrap();
        Placement {
            dir: Arc::new(dir),
            me,
            layout: Some(Arc::new(Layout::uniform(nodes, ranks_per_node).unwrap())),
        }
    }

    fn params(n: u64, rank: u32, ws: u32, b: u32, drop_last: bool) -> PlanParams {
        PlanParams {
            num_samples: n,
            seed: 7,
            rank,
            world_size: ws,
            batch_size: b,
            drop_last,
        }
    }

    /// Per batch index, the multiset of every rank's batch in locality mode
    /// is exact mode's, each rank's batch has exact mode's size, and the
    /// placement counts add up to what a direct count gives.
    #[test]
    fn locality_plans_deliver_every_global_step_unchanged() {
        for (n, keep, drop_last) in [
            (1000, 40_000, false),
            (997, 20_000, true),
            (50, 9_000, false),
        ] {
            let (nodes, per_node, b) = (3u32, 2u32, 8u32);
            let ws = nodes * per_node;
            let plans: Vec<(EpochPlan, EpochPlan)> = (0..ws)
                .map(|r| {
                    let node = r / per_node;
                    let p = placement(nodes, per_node, n, keep, node);
                    let prm = params(n, r, ws, b, drop_last);
                    (
                        EpochPlan::new(&prm, 3).unwrap(),
                        EpochPlan::with_placement(&prm, 3, Some(&p)).unwrap(),
                    )
                })
                .collect();
            let batches = plans[0].0.num_batches();
            let (mut peer_exact, mut peer_locality, mut total) = (0u64, 0u64, 0u64);
            for k in 0..batches {
                let mut exact: Vec<u64> = Vec::new();
                let mut local: Vec<u64> = Vec::new();
                for (r, (e, l)) in plans.iter().enumerate() {
                    let (eb, lb) = (e.batch(k).unwrap(), l.batch(k).unwrap());
                    assert_eq!(eb.len(), lb.len(), "rank {r} batch {k}");
                    exact.extend_from_slice(eb);
                    local.extend_from_slice(lb);
                    let p = placement(nodes, per_node, n, keep, r as u32 / per_node);
                    let counted = l.placed(k).unwrap();
                    assert_eq!(counted, p.classify(lb));
                    peer_locality += u64::from(counted[PEER]);
                    peer_exact += u64::from(p.classify(eb)[PEER]);
                    total += lb.len() as u64;
                }
                exact.sort_unstable();
                local.sort_unstable();
                assert_eq!(exact, local, "step {k} (n {n}, drop_last {drop_last})");
            }
            assert!(plans.iter().all(|(_, l)| l.batch(batches).is_none()));
            assert!(
                peer_locality * 4 < peer_exact,
                "locality moved {peer_locality} of {total}, exact {peer_exact}"
            );
        }
    }

    #[test]
    fn exact_placement_only_counts() {
        let mut p = placement(2, 1, 300, 100_000, 1);
        p.layout = None;
        assert_eq!(p.mode(), "exact");
        let prm = params(300, 1, 2, 16, false);
        let plain = EpochPlan::new(&prm, 0).unwrap();
        let counted = EpochPlan::with_placement(&prm, 0, Some(&p)).unwrap();
        assert_eq!(plain.samples(), counted.samples());
        let sums = (0..counted.num_batches())
            .map(|k| counted.placed(k).unwrap())
            .fold([0u32; 3], |a, c| [a[0] + c[0], a[1] + c[1], a[2] + c[2]]);
        assert_eq!(sums[LOCAL] + sums[PEER], 150);
        assert_eq!(sums[UNCACHED], 0);
        assert!(sums[LOCAL] > 30 && sums[PEER] > 30, "{sums:?}");
    }
}
