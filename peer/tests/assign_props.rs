//! Properties of the locality-aware assignment over random layouts, batch
//! sizes, steps and holders: nothing lost or duplicated, every rank gets
//! exactly its batch, at most p−1 transfers, as few samples moved as
//! possible, and the same answer every time.

use std::collections::BTreeMap;

use granary_peer::assign::{assign_step, global_step, Layout};
use proptest::prelude::*;

/// A random layout: `nodes` nodes, each rank on a random node (some nodes
/// may have no ranks).
fn layout_strategy() -> impl Strategy<Value = Layout> {
    (1u32..=24).prop_flat_map(|nodes| {
        proptest::collection::vec(0..nodes, 1..=40)
            .prop_map(move |node_of_rank| Layout::new(nodes, node_of_rank).expect("valid layout"))
    })
}

/// A layout, a batch size, a step (samples from a small range, so that
/// duplicates occur as padding makes them) and a holder for every distinct
/// sample, `None` for some.
fn step_strategy() -> impl Strategy<Value = (Layout, u32, Vec<u64>, Vec<Option<u32>>)> {
    (layout_strategy(), 1u32..=12, 0u32..=4).prop_flat_map(|(layout, b, none_weight)| {
        let n = layout.world_size() as usize * b as usize;
        let nodes = layout.nodes();
        let domain = (n as u64 * 2).max(1);
        (
            Just(layout),
            Just(b),
            proptest::collection::vec(0..domain, n),
            proptest::collection::vec(
                prop_oneof![
                    none_weight => Just(None),
                    4 => (0..nodes).prop_map(Some),
                ],
                domain as usize,
            ),
        )
            .prop_map(|(layout, b, samples, holder_of)| {
                let holders = samples.iter().map(|&s| holder_of[s as usize]).collect();
                (layout, b, samples, holders)
            })
    })
}

fn multiset<'a>(items: impl IntoIterator<Item = &'a u64>) -> BTreeMap<u64, usize> {
    let mut m = BTreeMap::new();
    for &s in items {
        *m.entry(s).or_insert(0) += 1;
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn assignment_keeps_the_step_and_balances_it((layout, b, samples, holders) in step_strategy()) {
        let a = assign_step(&samples, &holders, &layout, b).expect("valid step");
        let p = layout.nodes();
        let step = multiset(&samples);

        // Every rank gets exactly b; every node ranks × b.
        for r in 0..layout.world_size() {
            prop_assert_eq!(a.rank(r).len(), b as usize);
        }
        for v in 0..p {
            prop_assert_eq!(a.node(v).len(), layout.ranks_of(v).len() * b as usize);
            // A node's ranks together hold exactly the node's list.
            let of_ranks: Vec<u64> = layout.ranks_of(v).iter().flat_map(|&r| a.rank(r).iter().copied()).collect();
            prop_assert_eq!(of_ranks.as_slice(), a.node(v));
        }
        // The union of the nodes' (and of the ranks') lists is the step's
        // multiset: nothing lost, nothing duplicated, padding kept.
        prop_assert_eq!(&multiset((0..p).flat_map(|v| a.node(v))), &step);
        prop_assert_eq!(&multiset((0..layout.world_size()).flat_map(|r| a.rank(r))), &step);

        // Statistics add up, and at most p−1 transfers, each between two
        // different nodes and of at least one sample.
        let s = a.stats();
        prop_assert_eq!(s.samples, samples.len() as u64);
        prop_assert_eq!(s.local + s.uncached + s.moved, s.samples);
        prop_assert!(s.transfers.len() < p as usize);
        prop_assert_eq!(s.transfers.iter().map(|t| t.samples).sum::<u64>(), s.moved);
        for t in &s.transfers {
            prop_assert!(t.from != t.to && t.from < p && t.to < p && t.samples > 0);
        }

        // Locality: each node processes min(held, quota) of its own samples,
        // so the moved count is the least possible, Σ max(0, held − quota).
        let holder_of: BTreeMap<u64, Option<u32>> = samples.iter().copied().zip(holders.iter().copied()).collect();
        let mut least_moved = 0;
        for v in 0..p {
            let held = holders.iter().filter(|&&h| h == Some(v)).count();
            let quota = layout.ranks_of(v).len() * b as usize;
            let own = a.node(v).iter().filter(|s| holder_of[s] == Some(v)).count();
            prop_assert_eq!(own, held.min(quota));
            least_moved += held.saturating_sub(quota) as u64;
        }
        prop_assert_eq!(s.moved, least_moved);
        prop_assert_eq!(s.uncached, holders.iter().filter(|h| h.is_none()).count() as u64);

        // Deterministic.
        prop_assert_eq!(&assign_step(&samples, &holders, &layout, b).expect("valid step"), &a);
    }

    /// Over a whole epoch of the planner's steps, the assignment delivers
    /// exactly what DistributedSampler's shards deliver, step by step.
    #[test]
    fn epoch_of_steps_matches_the_shards(
        n in 1usize..300,
        nodes in 1u32..6,
        ranks_per_node in 1u32..4,
        batch in 1u32..40,
        drop_last in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = Layout::uniform(nodes, ranks_per_node).expect("valid layout");
        let ws = layout.world_size();
        // Any permutation will do: a seeded Fisher–Yates.
        let mut perm: Vec<u64> = (0..n as u64).collect();
        let mut x = seed;
        for i in (1..n).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (x >> 33) as usize % (i + 1));
        }
        let holder = |s: u64| (!s.is_multiple_of(7)).then_some((s.wrapping_mul(seed | 1) >> 7) as u32 % nodes);
        // DistributedSampler: rank r's share is padded[r + k·ws], batched by B.
        let per_rank = if drop_last { n / ws as usize } else { n.div_ceil(ws as usize) };
        let steps = if drop_last { per_rank / batch as usize } else { per_rank.div_ceil(batch as usize) };
        for step in 0..=steps {
            let g = global_step(&perm, ws, batch, drop_last, step as u64).expect("valid parameters");
            let Some(g) = g else {
                prop_assert_eq!(step, steps);
                break;
            };
            prop_assert!(step < steps);
            let lo = step * batch as usize;
            let hi = (lo + batch as usize).min(per_rank);
            let shards: Vec<u64> = (0..ws as usize)
                .flat_map(|r| (lo..hi).map(move |k| r + k * ws as usize))
                .map(|i| perm[i % n])
                .collect();
            let holders: Vec<Option<u32>> = g.samples.iter().map(|&s| holder(s)).collect();
            let a = assign_step(&g.samples, &holders, &layout, g.batch_size).expect("valid step");
            prop_assert_eq!(
                multiset((0..ws).flat_map(|r| a.rank(r))),
                multiset(&shards)
            );
        }
    }
}

#[test]
fn all_uncached_moves_nothing_and_one_holder_fans_out() {
    let layout = Layout::uniform(4, 2).expect("valid layout");
    let samples: Vec<u64> = (0..16).collect();
    let a = assign_step(&samples, &[None; 16], &layout, 2).expect("valid step");
    assert_eq!(a.stats().moved, 0);
    assert!(a.stats().transfers.is_empty());
    assert_eq!(a.node(2), &[8, 9, 10, 11]);

    // Node 3 holds everything: it keeps 4 and sends 4 to each other node,
    // the largest deficit first and ties to the smaller index: 3 transfers.
    let a = assign_step(&samples, &[Some(3); 16], &layout, 2).expect("valid step");
    let s = a.stats();
    assert_eq!((s.local, s.moved), (4, 12));
    let pairs: Vec<(u32, u32, u64)> = s
        .transfers
        .iter()
        .map(|t| (t.from, t.to, t.samples))
        .collect();
    assert_eq!(pairs, [(3, 0, 4), (3, 1, 4), (3, 2, 4)]);
    assert_eq!(a.node(3), &[0, 1, 2, 3]);
    assert_eq!(a.node(0), &[4, 5, 6, 7]);
    assert_eq!(a.rank(7), &[2, 3]);
}
