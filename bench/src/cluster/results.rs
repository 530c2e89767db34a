//! What a scenario measured: per node and epoch ([`NodeEpoch`]), per epoch
//! ([`EpochResult`]), the timeline, the relaunch checks and the whole
//! scenario ([`ScenarioResult`]).

use std::collections::BTreeMap;

use super::node::{self};
use super::options::Kind;
use crate::report::percentile;

/// One node in one epoch.
#[derive(Clone, Debug, Default)]
pub struct NodeEpoch {
    pub samples: u64,
    pub bytes: u64,
    pub secs: f64,
    pub lost: u64,
    pub dup: u64,
    pub bad: u64,
    pub replayed: u64,
    pub reopens: u64,
    pub waits_us: Vec<u64>,
    pub errors: Vec<String>,
    /// Why the node's ranks reopened their sessions.
    pub reasons: Vec<String>,
    /// Counter deltas over the epoch ([`node::SERIES`]).
    pub m: BTreeMap<String, f64>,
    /// Per batch index, the multiset hash of what the node's ranks got.
    pub steps: Vec<u64>,
}

impl NodeEpoch {
    /// Adds another part of the same epoch (`relaunch`: before and after
    /// the change).
    pub fn merge(&mut self, o: NodeEpoch) {
        self.samples += o.samples;
        self.bytes += o.bytes;
        self.secs += o.secs;
        self.lost += o.lost;
        self.dup += o.dup;
        self.bad += o.bad;
        self.replayed += o.replayed;
        self.reopens += o.reopens;
        self.waits_us.extend(o.waits_us);
        self.errors.extend(o.errors);
        self.reasons.extend(o.reasons);
        add_steps(&mut self.steps, &o.steps);
    }
}

#[derive(Clone, Debug, Default)]
pub struct EpochResult {
    pub secs: f64,
    pub nodes: Vec<NodeEpoch>,
    /// Whether the epoch ran in the locality-aware assignment.
    pub locality: bool,
    /// Global steps of the epoch, and how many differ from the planner's.
    pub steps: u64,
    pub step_mismatch: u64,
}

impl EpochResult {
    pub fn total(&self, key: &str) -> f64 {
        self.nodes
            .iter()
            .map(|n| n.m.get(key).copied().unwrap_or(0.0))
            .sum()
    }
    pub fn samples(&self) -> u64 {
        self.nodes.iter().map(|n| n.samples).sum()
    }
    /// Of the samples the sessions planned, the share kept by another node
    /// than the one processing them (moved by the assignment).
    pub fn moved_frac(&self) -> f64 {
        self.total("moved") / self.total("assigned").max(1.0)
    }
    pub fn waits(&self) -> Vec<u64> {
        let mut w: Vec<u64> = self.nodes.iter().flat_map(|n| n.waits_us.clone()).collect();
        w.sort_unstable();
        w
    }
    pub fn broken(&self) -> (u64, u64, u64, usize) {
        let s = |f: fn(&NodeEpoch) -> u64| self.nodes.iter().map(f).sum::<u64>();
        (
            s(|n| n.lost),
            s(|n| n.dup),
            s(|n| n.bad),
            self.nodes.iter().map(|n| n.errors.len()).sum(),
        )
    }
}

/// One point of the timeline: seconds since the scenario began, node,
/// cumulative counters.
#[derive(Clone, Debug)]
pub struct Point {
    pub t: f64,
    pub node: usize,
    pub arena: f64,
    pub peer: f64,
    pub store: f64,
    pub reads: f64,
}

/// `relaunch`: the job lost its last node in the middle of epoch `epoch`
/// and went on at global step `at` with one rank fewer and the same global
/// batch.
#[derive(Clone, Debug, Default)]
pub struct Relaunch {
    pub epoch: u32,
    /// Both parts ran in the locality-aware assignment.
    pub locality: bool,
    /// The global step the relaunched job started at (every rank had
    /// consumed steps `0..at`).
    pub at: u64,
    /// Global steps in the epoch.
    pub steps: u64,
    pub world: (u32, u32),
    pub batch: (u32, u32),
    /// Steps of the epoch whose planner hash differs between the two
    /// (world, batch) pairs (0: the planner's global step does not depend
    /// on the world size).
    pub planner_differing: u64,
    /// Steps delivered (by any node) both before and after the change.
    pub twice: u64,
    /// Steps delivered by nobody, before or after.
    pub missing: u64,
    /// Steps delivered on the wrong side of the change (before it at or
    /// after `at`, or after it below `at`).
    pub wrong_side: u64,
    /// Steps of the epoch, both sides, differing from the planner's.
    pub differing: u64,
    /// The planned union of the steps (before: old world, after: new):
    /// samples twice or more (extra copies), and samples of the dataset
    /// in no step.
    pub union_extra: u64,
    pub union_missing: u64,
    /// Samples the planner pads the new world's epoch with (`n` not a
    /// multiple of the world size): these come twice.
    pub padding: u64,
    /// Store reads of the job in the epoch before the change.
    pub reads_before: f64,
    /// Store reads from the change to the end of the epoch.
    pub reads_rest: f64,
    /// Store reads of each later epoch.
    pub reads_later: Vec<f64>,
    /// The lost node's store reads in epoch 0: its owned share (each
    /// sample is read from the store by its owner, once).
    pub lost_share: f64,
    /// From the last rank stopping to the relaunched ranks' first command.
    pub change_secs: f64,
}

impl Relaunch {
    pub fn reads_after(&self) -> f64 {
        self.reads_rest + self.reads_later.iter().sum::<f64>()
    }
}

pub struct ScenarioResult {
    pub kind: Kind,
    pub arena_mib: u64,
    pub epochs: Vec<EpochResult>,
    pub agent_cpu: Vec<f64>,
    pub loader_cpu: Vec<f64>,
    pub store_cpu: f64,
    pub corrupted: u64,
    pub proxied_blocks: u64,
    /// From the kill to the restarted agent's socket answering.
    pub restart_secs: Option<f64>,
    /// `relaunch`: the change in the middle of an epoch.
    pub relaunch: Option<Relaunch>,
    pub timeline: Vec<Point>,
    /// Epoch start times (seconds since the scenario began).
    pub marks: Vec<f64>,
}

impl ScenarioResult {
    pub fn node_samples(&self, k: usize) -> u64 {
        self.epochs.iter().map(|e| e.nodes[k].samples).sum()
    }
    /// samples/s over epochs `from..`.
    pub fn rate_from(&self, from: usize) -> f64 {
        let e = &self.epochs[from.min(self.epochs.len())..];
        let s: u64 = e.iter().map(EpochResult::samples).sum();
        let t: f64 = e.iter().map(|x| x.secs).sum();
        s as f64 / t
    }
    /// The p99 batch wait (ms) of the consumers on `nodes`, all epochs.
    pub fn p99_ms_of(&self, nodes: &[usize]) -> f64 {
        let mut w: Vec<u64> = self
            .epochs
            .iter()
            .flat_map(|e| nodes.iter().flat_map(|&k| e.nodes[k].waits_us.clone()))
            .collect();
        w.sort_unstable();
        percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3
    }
    pub fn max_wait_ms(&self, epoch: usize) -> f64 {
        self.epochs[epoch].waits().last().copied().unwrap_or(0) as f64 / 1e3
    }
    pub fn broken(&self) -> (u64, u64, u64, usize) {
        self.epochs
            .iter()
            .map(EpochResult::broken)
            .fold((0, 0, 0, 0), |a, b| {
                (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3)
            })
    }
}

/// Counters made monotone across agent restarts: a value lower than the
/// last one seen means a new incarnation, whose counts add to the old.
#[derive(Default)]
pub struct Monotone {
    pub base: BTreeMap<String, f64>,
    pub last: BTreeMap<String, f64>,
}

impl Monotone {
    pub fn feed(&mut self, kv: &BTreeMap<String, String>) -> Option<BTreeMap<String, f64>> {
        if kv.get("up").map(String::as_str) != Some("1") {
            return None;
        }
        let mut out = BTreeMap::new();
        for (short, _, _) in node::SERIES {
            let v: f64 = kv.get(*short).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let last = self.last.entry((*short).into()).or_insert(0.0);
            let base = self.base.entry((*short).into()).or_insert(0.0);
            if v < *last {
                *base += *last;
            }
            *last = v;
            out.insert((*short).into(), *base + v);
        }
        Some(out)
    }
}

/// Adds per-step hashes into `into` (wrapping, index by index).
pub fn add_steps(into: &mut Vec<u64>, steps: &[u64]) {
    if into.len() < steps.len() {
        into.resize(steps.len(), 0);
    }
    for (g, &h) in into.iter_mut().zip(steps) {
        *g = g.wrapping_add(h);
    }
}
