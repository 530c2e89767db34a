//! Locality-aware assignment of a global step's samples to nodes and ranks.
//!
//! In exact mode (DistributedSampler order) rank `r` processes batch `k` of
//! its own shard, wherever its samples are cached; with a partitioned cache
//! on `p` nodes, `(p−1)/p` of every step then crosses the network. The
//! locality-aware assignment keeps the **multiset of samples of every global
//! step** exactly as the planner makes it (padding duplicates included) and
//! changes only *which node, then which local rank*, processes each sample,
//! so that most samples are processed on the node that already holds them.
//! Every rank still processes exactly `b` samples per step, so DDP's
//! all-reduce sees equal batch sizes, and the gradient summed over the global
//! batch is unchanged.
//!
//! Everything here is integer-only and deterministic: every agent of a job
//! computes the same assignment from the same inputs, with no message.
//! `peer/tests/assign_reference.py` reproduces it exactly in Python.
//!
//! # Inputs
//!
//! * the **global step**: the samples the planner gives the whole job for
//!   one step, as a list (its order is the *position* used by the
//!   tie-breaks). [`global_step`] cuts it out of the epoch permutation in the
//!   planner's order; rank `r`'s exact-mode batch is then `step[r::ws]`;
//! * the [`Layout`]: the number of nodes `p` and the node of every global
//!   rank; node `v`'s local ranks are its ranks in ascending global order;
//! * the per-rank batch size `b` of the step (the same for every rank; the
//!   last step of an epoch without `drop_last` may be shorter than the
//!   configured batch size), so node `v`'s **quota** is `q(v) = ranks(v)·b`
//!   and the step holds `Σ q(v) = world_size·b` samples;
//! * for every position, the node that holds that sample cached (`None`
//!   when no node does). The caller gives the same holder to equal samples;
//!   the assignment is correct (nothing lost or duplicated) either way.
//!
//! # Algorithm
//!
//! 1. **Own samples first.** Walk the positions in ascending order. A sample
//!    held by node `v` is kept by `v` while `v` has taken fewer than `q(v)`;
//!    otherwise it joins `v`'s *surplus* (a list in position order). An
//!    uncached sample joins the *uncached* list (position order).
//! 2. **Uncached samples fill deficits.** Walk the nodes in ascending index;
//!    node `v` takes the next uncached samples, in list order, until it has
//!    `q(v)` or the list is empty. Since `Σ q = n`, the list always empties,
//!    and what is left is a surplus on some nodes and an equal total deficit
//!    on others (never both on one node).
//! 3. **Two-heap balancing.** Repeat while any surplus remains: take the
//!    node `u` with the largest surplus and the node `w` with the largest
//!    deficit (ties: the smaller node index), move `k = min(surplus(u),
//!    deficit(w))` samples, namely the first `k` not yet moved of `u`'s
//!    surplus list, from `u` to `w`, and record the transfer `(u, w, k)`.
//!    Each transfer empties `u`'s surplus or `w`'s deficit, and the last
//!    empties both, so a step makes at most `p−1` transfers.
//! 4. **Split among local ranks.** Node `v`'s list is its samples in
//!    ascending position; its `j`-th local rank takes entries
//!    `j·b .. (j+1)·b`.
//!
//! The samples moved per step are the total surplus after step 1. With the
//! whole dataset cached and holders spread uniformly (rendezvous
//! ownership), one rank per node and local batch `b`, the moved fraction is
//! about `0.40·√((p−1)/p)/√b` (the mean of `max(0, X−b)` for a binomial `X`
//! over `p·b` samples, times `p`, over `p·b`); `bench/run assign` measures it.
//!
//! # What differs from DistributedSampler
//!
//! The global batch and the gradient sum are unchanged; per-rank content is
//! not: BatchNorm statistics (computed per rank unless SyncBatchNorm is used)
//! see a different split of the global batch, and per-rank random streams
//! (augmentation seeded by rank) meet different samples. A run in locality
//! mode is reproducible from its inputs, but not sample-for-sample equal to
//! an exact-mode run.
//!
//! Cost: `O(n + p·log p)` time and `O(n + p)` memory for a step of `n`
//! samples over `p` nodes.

use sha2::{Digest, Sha256};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

/// Why an assignment (or a global step) could not be computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignError {
    /// The layout has no nodes.
    NoNodes,
    /// The layout has no ranks.
    NoRanks,
    /// A rank names a node outside `0 .. nodes`.
    RankNodeOutOfRange { rank: u32, node: u32, nodes: u32 },
    /// The per-rank batch size is 0.
    BatchSizeZero,
    /// The world size is 0 (in [`global_step`]).
    WorldSizeZero,
    /// The permutation is empty (in [`global_step`]).
    EmptyPermutation,
    /// The step does not hold `world_size · batch_size` samples.
    StepSize { expected: u64, got: u64 },
    /// `holders` is not as long as `samples`.
    HoldersLength { samples: u64, holders: u64 },
    /// A holder names a node outside `0 .. nodes`.
    HolderOutOfRange {
        position: u64,
        node: u32,
        nodes: u32,
    },
    /// The step's sample list could not be allocated.
    OutOfMemory { samples: u64 },
    /// An encoded layout is malformed (what is wrong).
    BadEncoding(String),
}

impl fmt::Display for AssignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssignError::NoNodes => write!(f, "layout has no nodes: at least one is needed"),
            AssignError::NoRanks => write!(f, "layout has no ranks: at least one is needed"),
            AssignError::RankNodeOutOfRange { rank, node, nodes } => write!(
                f,
                "rank {rank} is on node {node}, out of range for {nodes} nodes"
            ),
            AssignError::BatchSizeZero => write!(f, "batch_size is 0: at least 1 is needed"),
            AssignError::WorldSizeZero => write!(f, "world_size is 0: at least 1 is needed"),
            AssignError::EmptyPermutation => write!(f, "the epoch permutation is empty"),
            AssignError::StepSize { expected, got } => write!(
                f,
                "step holds {got} samples, expected world_size × batch_size = {expected}"
            ),
            AssignError::HoldersLength { samples, holders } => write!(
                f,
                "{holders} holders given for {samples} samples: one per sample is needed"
            ),
            AssignError::HolderOutOfRange {
                position,
                node,
                nodes,
            } => write!(
                f,
                "sample at position {position} is held by node {node}, out of range for {nodes} nodes"
            ),
            AssignError::OutOfMemory { samples } => {
                write!(f, "cannot allocate a step of {samples} samples")
            }
            AssignError::BadEncoding(why) => write!(f, "malformed layout: {why}"),
        }
    }
}

impl std::error::Error for AssignError {}

/// Which node every rank of the job runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    node_of_rank: Vec<u32>,
    ranks_of_node: Vec<Vec<u32>>,
}

impl Layout {
    /// A layout of `nodes` nodes where global rank `r` runs on node
    /// `node_of_rank[r]`. A node's local ranks are its ranks in ascending
    /// global order. Nodes without ranks are allowed (their quota is 0: they
    /// hand all they hold to others).
    pub fn new(nodes: u32, node_of_rank: Vec<u32>) -> Result<Layout, AssignError> {
        if nodes == 0 {
            return Err(AssignError::NoNodes);
        }
        if node_of_rank.is_empty() {
            return Err(AssignError::NoRanks);
        }
        let mut ranks_of_node = vec![Vec::new(); nodes as usize];
        for (rank, &node) in node_of_rank.iter().enumerate() {
            let rank = u32::try_from(rank).map_err(|_| AssignError::RankNodeOutOfRange {
                rank: u32::MAX,
                node,
                nodes,
            })?;
            match ranks_of_node.get_mut(node as usize) {
                Some(list) => list.push(rank),
                None => return Err(AssignError::RankNodeOutOfRange { rank, node, nodes }),
            }
        }
        Ok(Layout {
            node_of_rank,
            ranks_of_node,
        })
    }

    /// `nodes` nodes of `ranks_per_node` ranks each, numbered as torchrun
    /// does: global rank `node · ranks_per_node + local rank`.
    pub fn uniform(nodes: u32, ranks_per_node: u32) -> Result<Layout, AssignError> {
        let node_of_rank = (0..nodes)
            .flat_map(|v| std::iter::repeat_n(v, ranks_per_node as usize))
            .collect();
        Layout::new(nodes, node_of_rank)
    }

    /// Number of nodes `p`.
    pub fn nodes(&self) -> u32 {
        self.ranks_of_node.len() as u32
    }

    /// Number of ranks of the job.
    pub fn world_size(&self) -> u32 {
        self.node_of_rank.len() as u32
    }

    /// The node rank `rank` runs on, if it exists.
    pub fn node_of(&self, rank: u32) -> Option<u32> {
        self.node_of_rank.get(rank as usize).copied()
    }

    /// The canonical encoding, as loaders hand it to their agent:
    /// `"GLY1"`, the node count and the rank count (u32 little-endian
    /// each), then every rank's node (u32 little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + 4 * self.node_of_rank.len());
        out.extend_from_slice(LAYOUT_MAGIC);
        out.extend_from_slice(&self.nodes().to_le_bytes());
        out.extend_from_slice(&self.world_size().to_le_bytes());
        for v in &self.node_of_rank {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes [`Layout::encode`]'s bytes, checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Layout, AssignError> {
        let bad = |why: String| AssignError::BadEncoding(why);
        let rest = bytes
            .strip_prefix(LAYOUT_MAGIC.as_slice())
            .ok_or_else(|| bad("it does not start with \"GLY1\"".into()))?;
        if rest.len() < 8 {
            return Err(bad(format!(
                "{} bytes, at least 12 are needed",
                bytes.len()
            )));
        }
        let word = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
        let (nodes, ranks) = (word(0), word(4));
        let body = &rest[8..];
        if body.len() as u64 != u64::from(ranks) * 4 {
            return Err(bad(format!(
                "{ranks} ranks announced, {} bytes of ranks follow (4 per rank)",
                body.len()
            )));
        }
        Layout::new(
            nodes,
            (0..ranks as usize).map(|r| word(8 + 4 * r)).collect(),
        )
    }

    /// Node `node`'s ranks in local order (ascending global rank); empty for
    /// a node outside the layout.
    pub fn ranks_of(&self, node: u32) -> &[u32] {
        self.ranks_of_node
            .get(node as usize)
            .map_or(&[], Vec::as_slice)
    }
}

/// The first bytes of an encoded [`Layout`].
const LAYOUT_MAGIC: &[u8; 4] = b"GLY1";

/// One transfer of a step: `samples` samples that `from` holds are
/// processed on `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub from: u32,
    pub to: u32,
    pub samples: u64,
}

/// What a step's assignment did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepStats {
    /// Samples in the step (`world_size · b`).
    pub samples: u64,
    /// Samples processed on the node that holds them.
    pub local: u64,
    /// Samples no node holds (read from the store by whoever processes them).
    pub uncached: u64,
    /// Cached samples processed on another node than their holder
    /// (`samples = local + uncached + moved`).
    pub moved: u64,
    /// The transfers, in the order the balancing made them (at most `p−1`).
    pub transfers: Vec<Transfer>,
}

/// The assignment of one global step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    batch_size: u32,
    nodes: Vec<Vec<u64>>,
    node_of_rank: Vec<u32>,
    first_of_rank: Vec<usize>,
    stats: StepStats,
}

impl Assignment {
    /// Node `node`'s samples, in ascending step position (empty for a node
    /// outside the layout).
    pub fn node(&self, node: u32) -> &[u64] {
        self.nodes.get(node as usize).map_or(&[], Vec::as_slice)
    }

    /// Global rank `rank`'s `b` samples (empty for a rank outside the
    /// layout).
    pub fn rank(&self, rank: u32) -> &[u64] {
        let (Some(&node), Some(&first)) = (
            self.node_of_rank.get(rank as usize),
            self.first_of_rank.get(rank as usize),
        ) else {
            return &[];
        };
        &self.nodes[node as usize][first..first + self.batch_size as usize]
    }

    /// What the step moved.
    pub fn stats(&self) -> &StepStats {
        &self.stats
    }
}

/// Assigns one global step's samples to the layout's nodes and ranks (see
/// the module documentation for the algorithm). `holders[i]` is the node
/// holding `samples[i]` cached, or `None`; `batch_size` is the step's
/// per-rank batch size `b`, and `samples` must hold `world_size · b`
/// entries.
pub fn assign_step(
    samples: &[u64],
    holders: &[Option<u32>],
    layout: &Layout,
    batch_size: u32,
) -> Result<Assignment, AssignError> {
    if batch_size == 0 {
        return Err(AssignError::BatchSizeZero);
    }
    let b = batch_size as usize;
    let expected = u64::from(layout.world_size()) * u64::from(batch_size);
    if samples.len() as u64 != expected {
        return Err(AssignError::StepSize {
            expected,
            got: samples.len() as u64,
        });
    }
    if holders.len() != samples.len() {
        return Err(AssignError::HoldersLength {
            samples: samples.len() as u64,
            holders: holders.len() as u64,
        });
    }
    let p = layout.ranks_of_node.len();
    let quota: Vec<usize> = layout.ranks_of_node.iter().map(|r| r.len() * b).collect();
    let mut count = vec![0usize; p];
    let mut node_at = vec![u32::MAX; samples.len()];
    let mut surplus: Vec<Vec<usize>> = vec![Vec::new(); p];
    let mut uncached = Vec::new();

    // 1. Own samples first, up to the quota.
    for (position, holder) in holders.iter().enumerate() {
        match *holder {
            Some(v) if (v as usize) < p => {
                if count[v as usize] < quota[v as usize] {
                    count[v as usize] += 1;
                    node_at[position] = v;
                } else {
                    surplus[v as usize].push(position);
                }
            }
            Some(v) => {
                return Err(AssignError::HolderOutOfRange {
                    position: position as u64,
                    node: v,
                    nodes: p as u32,
                })
            }
            None => uncached.push(position),
        }
    }
    let local: usize = count.iter().sum();

    // 2. Uncached samples fill deficits, nodes in ascending index.
    let mut next = uncached.iter();
    for v in 0..p {
        while count[v] < quota[v] {
            let Some(&position) = next.next() else { break };
            node_at[position] = v as u32;
            count[v] += 1;
        }
    }

    // 3. Two-heap balancing: largest surplus into largest deficit, ties to
    // the smaller node index.
    let mut surplus_heap: BinaryHeap<(usize, Reverse<u32>)> = surplus
        .iter()
        .enumerate()
        .filter(|(_, list)| !list.is_empty())
        .map(|(v, list)| (list.len(), Reverse(v as u32)))
        .collect();
    let mut deficit_heap: BinaryHeap<(usize, Reverse<u32>)> = (0..p)
        .filter(|&v| count[v] < quota[v])
        .map(|v| (quota[v] - count[v], Reverse(v as u32)))
        .collect();
    let mut moved_from = vec![0usize; p];
    let mut transfers = Vec::new();
    while let (Some((give, Reverse(u))), Some((take, Reverse(w)))) =
        (surplus_heap.pop(), deficit_heap.pop())
    {
        let k = give.min(take);
        let start = moved_from[u as usize];
        for &position in &surplus[u as usize][start..start + k] {
            node_at[position] = w;
        }
        moved_from[u as usize] = start + k;
        transfers.push(Transfer {
            from: u,
            to: w,
            samples: k as u64,
        });
        if give > k {
            surplus_heap.push((give - k, Reverse(u)));
        }
        if take > k {
            deficit_heap.push((take - k, Reverse(w)));
        }
    }
    let moved: usize = moved_from.iter().sum();

    // 4. Node lists in ascending position; local rank j takes j·b .. (j+1)·b.
    let mut nodes: Vec<Vec<u64>> = quota.iter().map(|&q| Vec::with_capacity(q)).collect();
    for (&sample, &v) in samples.iter().zip(&node_at) {
        nodes[v as usize].push(sample);
    }
    debug_assert!(nodes.iter().zip(&quota).all(|(list, &q)| list.len() == q));
    let mut first_of_rank = vec![0usize; layout.node_of_rank.len()];
    for ranks in &layout.ranks_of_node {
        for (j, &rank) in ranks.iter().enumerate() {
            first_of_rank[rank as usize] = j * b;
        }
    }
    Ok(Assignment {
        batch_size,
        nodes,
        node_of_rank: layout.node_of_rank.clone(),
        first_of_rank,
        stats: StepStats {
            samples: samples.len() as u64,
            local: local as u64,
            uncached: uncached.len() as u64,
            moved: moved as u64,
            transfers,
        },
    })
}

/// What a locality-aware session's order depends on besides the rank, as
/// the agents of a job (and their loaders, through their process group)
/// compare it. Two ranks with the same digest compute the same assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs<'a> {
    /// The dataset's directory digest under the view
    /// ([`crate::keep::Directory::digest`]): it covers the view (members and
    /// their capacities) and the catalog fingerprint.
    pub directory: [u8; 32],
    /// The shuffle seed.
    pub seed: u64,
    /// The first epoch of the session.
    pub first_epoch: u32,
    /// How many epochs it covers.
    pub epoch_count: u32,
    /// The per-rank batch size.
    pub batch_size: u32,
    /// Truncate instead of padding, and drop the last partial batch.
    pub drop_last: bool,
    /// Which node every rank runs on (its world size is the session's).
    pub layout: &'a Layout,
}

impl Inputs<'_> {
    /// SHA-256 over every field, in a fixed order, behind a version tag.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"granary-assignment-v1\0");
        h.update(self.directory);
        h.update(self.seed.to_le_bytes());
        h.update(self.first_epoch.to_le_bytes());
        h.update(self.epoch_count.to_le_bytes());
        h.update(self.batch_size.to_le_bytes());
        h.update([u8::from(self.drop_last)]);
        h.update(self.layout.encode());
        h.finalize().into()
    }
}

/// One global step as the planner makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalStep {
    /// The samples of every rank's batch, in the padded permutation's order:
    /// rank `r`'s exact-mode batch is `samples[r::world_size]`.
    pub samples: Vec<u64>,
    /// The per-rank batch size of this step (the configured batch size, or
    /// less for the last step of an epoch without `drop_last`).
    pub batch_size: u32,
}

/// Step `step` of an epoch, cut from the epoch permutation (the planner's
/// `epoch_permutation`) exactly as the planner shards and batches it
/// (`docs/planner.md`, sections 5 and 6): with `ns` samples per rank, step
/// `k` is entries `k·B·ws .. min((k+1)·B, ns)·ws` of the padded permutation
/// `padded[i] = permutation[i mod n]`. `None` past the epoch's last step.
pub fn global_step(
    permutation: &[u64],
    world_size: u32,
    batch_size: u32,
    drop_last: bool,
    step: u64,
) -> Result<Option<GlobalStep>, AssignError> {
    if world_size == 0 {
        return Err(AssignError::WorldSizeZero);
    }
    if batch_size == 0 {
        return Err(AssignError::BatchSizeZero);
    }
    if permutation.is_empty() {
        return Err(AssignError::EmptyPermutation);
    }
    let n = permutation.len() as u64;
    let ws = u64::from(world_size);
    let per_rank = if drop_last { n / ws } else { n.div_ceil(ws) };
    let start = match step.checked_mul(u64::from(batch_size)) {
        Some(start) if start < per_rank => start,
        _ => return Ok(None),
    };
    let end = per_rank.min(start + u64::from(batch_size));
    if drop_last && end - start < u64::from(batch_size) {
        return Ok(None);
    }
    let len = (end - start) * ws;
    let mut samples = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|len| samples.try_reserve_exact(len).ok())
        .ok_or(AssignError::OutOfMemory { samples: len })?;
    samples.extend((start * ws..end * ws).map(|i| permutation[(i % n) as usize]));
    Ok(Some(GlobalStep {
        samples,
        batch_size: (end - start) as u32,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_docs() {
        // docs/planner.md, "Locality-aware assignment", worked example.
        let layout = Layout::new(3, vec![0, 0, 1, 2]).unwrap();
        let samples = [10, 11, 12, 13, 14, 15, 16, 17];
        let holders = [
            Some(1),
            Some(1),
            Some(1),
            None,
            Some(0),
            Some(1),
            Some(1),
            Some(2),
        ];
        let a = assign_step(&samples, &holders, &layout, 2).unwrap();
        assert_eq!(a.node(0), &[12, 13, 14, 15]);
        assert_eq!(a.node(1), &[10, 11]);
        assert_eq!(a.node(2), &[16, 17]);
        assert_eq!(a.rank(0), &[12, 13]);
        assert_eq!(a.rank(1), &[14, 15]);
        assert_eq!(a.rank(2), &[10, 11]);
        assert_eq!(a.rank(3), &[16, 17]);
        assert_eq!(a.rank(4), &[] as &[u64]);
        let s = a.stats();
        assert_eq!((s.samples, s.local, s.uncached, s.moved), (8, 4, 1, 3));
        assert_eq!(
            s.transfers,
            vec![
                Transfer {
                    from: 1,
                    to: 0,
                    samples: 2
                },
                Transfer {
                    from: 1,
                    to: 2,
                    samples: 1
                }
            ]
        );
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_eq!(Layout::new(0, vec![]), Err(AssignError::NoNodes));
        assert_eq!(Layout::new(2, vec![]), Err(AssignError::NoRanks));
        assert_eq!(
            Layout::new(2, vec![0, 2]),
            Err(AssignError::RankNodeOutOfRange {
                rank: 1,
                node: 2,
                nodes: 2
            })
        );
        let layout = Layout::uniform(2, 1).unwrap();
        assert_eq!(
            assign_step(&[], &[], &layout, 0),
            Err(AssignError::BatchSizeZero)
        );
        assert_eq!(
            assign_step(&[1, 2, 3], &[None; 3], &layout, 2),
            Err(AssignError::StepSize {
                expected: 4,
                got: 3
            })
        );
        assert_eq!(
            assign_step(&[1, 2], &[None], &layout, 1),
            Err(AssignError::HoldersLength {
                samples: 2,
                holders: 1
            })
        );
        assert_eq!(
            assign_step(&[1, 2], &[None, Some(5)], &layout, 1),
            Err(AssignError::HolderOutOfRange {
                position: 1,
                node: 5,
                nodes: 2
            })
        );
        assert_eq!(
            global_step(&[1], 0, 1, false, 0),
            Err(AssignError::WorldSizeZero)
        );
        assert_eq!(
            global_step(&[], 1, 1, false, 0),
            Err(AssignError::EmptyPermutation)
        );
        assert!(AssignError::StepSize {
            expected: 4,
            got: 3
        }
        .to_string()
        .contains("expected world_size × batch_size = 4"));
    }

    #[test]
    fn global_step_pads_and_truncates_as_the_planner() {
        // docs/planner.md's worked example: permutation of 10 over 4 ranks.
        let perm = [1, 3, 2, 5, 6, 0, 9, 7, 8, 4];
        // Without drop_last: 3 per rank, padded with 1 and 3; batches of 2.
        let s0 = global_step(&perm, 4, 2, false, 0).unwrap().unwrap();
        assert_eq!(s0.batch_size, 2);
        assert_eq!(s0.samples, vec![1, 3, 2, 5, 6, 0, 9, 7]);
        let s1 = global_step(&perm, 4, 2, false, 1).unwrap().unwrap();
        assert_eq!(s1.batch_size, 1);
        assert_eq!(s1.samples, vec![8, 4, 1, 3]);
        assert_eq!(global_step(&perm, 4, 2, false, 2).unwrap(), None);
        // Rank 0's exact batches are 1 6 | 8 (share 1 6 8).
        assert_eq!(s0.samples.iter().step_by(4).collect::<Vec<_>>(), [&1, &6]);
        // With drop_last: 2 per rank, one step of 2, nothing else.
        let d = global_step(&perm, 4, 2, true, 0).unwrap().unwrap();
        assert_eq!(d.samples, vec![1, 3, 2, 5, 6, 0, 9, 7]);
        assert_eq!(global_step(&perm, 4, 2, true, 1).unwrap(), None);
        assert_eq!(global_step(&perm, 4, 3, true, 0).unwrap(), None);
        assert_eq!(global_step(&perm, 4, 1, false, u64::MAX).unwrap(), None);
    }

    #[test]
    fn layout_encoding_round_trips_and_refuses_garbage() {
        let layout = Layout::new(3, vec![2, 0, 2, 1]).unwrap();
        let bytes = layout.encode();
        assert_eq!(bytes.len(), 12 + 16);
        assert_eq!(Layout::decode(&bytes), Ok(layout));
        let bad = |b: &[u8]| match Layout::decode(b) {
            Err(e) => e.to_string(),
            Ok(l) => panic!("decoded {l:?}"),
        };
        assert!(bad(b"GLY0").contains("GLY1"));
        assert!(bad(b"GLY1\x01\0\0\0").contains("at least 12"));
        assert!(bad(&bytes[..bytes.len() - 1]).contains("4 ranks announced"));
        let mut far = bytes.clone();
        far[12] = 7;
        assert!(bad(&far).contains("rank 0 is on node 7"));
    }

    #[test]
    fn layout_accessors() {
        let layout = Layout::new(3, vec![2, 0, 2]).unwrap();
        assert_eq!(layout.nodes(), 3);
        assert_eq!(layout.world_size(), 3);
        assert_eq!(layout.ranks_of(2), &[0, 2]);
        assert_eq!(layout.ranks_of(1), &[] as &[u32]);
        assert_eq!(layout.ranks_of(9), &[] as &[u32]);
        assert_eq!(layout.node_of(1), Some(0));
        assert_eq!(layout.node_of(3), None);
        let u = Layout::uniform(2, 3).unwrap();
        assert_eq!(u.ranks_of(1), &[3, 4, 5]);
    }
}
