//! A deterministic simulator of N agents over this crate.
//!
//! Every agent runs the real [`Conn`](crate::conn::Conn),
//! [`Server`](crate::serve::Server), [`Directory`]
//! and block CRCs; only the clock, the network and the store are simulated.
//! One seed fixes everything (payloads, nonces, fault coin flips), so a
//! failing seed replays exactly: [`run`] is a pure function of its
//! [`SimConfig`].
//!
//! The simulated job trains in synchronous steps. Each epoch is a seeded
//! permutation of the dataset, cut into global steps of `nodes x batch`
//! samples; node `k` consumes the `k`-th slice (the exact,
//! DistributedSampler-like share). Each agent serves its consumer from its
//! arena, from the owner of a kept sample over a peer connection, or from
//! the store; it hedges to the store when a peer answer is late, on a miss,
//! a closed connection or a block failing its CRC.
//!
//! Checked at every step: each consumer received exactly its plan (zero
//! lost, zero duplicated) and every delivered byte equals the store's.
//! Checked throughout: an owner reads each sample it keeps from the store at
//! most once per incarnation (single flight), and each epoch's store reads
//! stay within the bound `kept reads by owners + samples not kept +
//! fallbacks with a recorded cause`. A step that does not finish within
//! [`SimConfig::step_limit`] of simulated time fails the run.
//!
//! Faults: peer loss with restart under a new incarnation, a partition
//! between two nodes for some steps, corrupted and misrouted blocks, and a
//! slow node.

mod agent;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use crate::conn::Nanos;
use crate::keep::Directory;
use crate::owner::mix64;
use crate::view::{Member, View};

use agent::Agent;

/// Dataset fingerprint the simulated job trains on.
pub const SIM_FINGERPRINT: u64 = 0x6772_616e_6172_7973;
const MS: Nanos = 1_000_000;

/// A node killed at the start of a step, restarted later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// Node index.
    pub node: usize,
    /// Global step (counted across epochs) during which it dies.
    pub at_step: usize,
    /// Simulated time it stays down.
    pub down_for: Nanos,
}

/// Two nodes that cannot reach each other for some steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// One side.
    pub a: usize,
    /// The other side.
    pub b: usize,
    /// First global step of the partition.
    pub from_step: usize,
    /// First global step after it.
    pub to_step: usize,
}

/// Faults to inject.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Peer loss and restart.
    pub kill: Option<Kill>,
    /// A partition.
    pub partition: Option<Partition>,
    /// Blocks sent with a flipped bit, per thousand.
    pub corrupt_per_mille: u32,
    /// Blocks sent with another sample's bytes, per thousand.
    pub misroute_per_mille: u32,
    /// A node whose outgoing messages take this many times the latency.
    pub slow: Option<(usize, u64)>,
}

/// One simulated run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Fixes every random choice.
    pub seed: u64,
    /// Agents.
    pub nodes: usize,
    /// Samples in the dataset.
    pub samples: u64,
    /// Sample sizes are drawn in `min_size..=max_size` bytes.
    pub min_size: u64,
    /// See `min_size`.
    pub max_size: u64,
    /// All arenas together hold this percentage of the dataset's bytes.
    pub arena_pct: u64,
    /// Samples each node consumes per step.
    pub batch: usize,
    /// Epochs to run.
    pub epochs: u32,
    /// One-way network latency.
    pub latency: Nanos,
    /// Store read latency.
    pub store_latency: Nanos,
    /// A peer request unanswered this long is also sent to the store.
    pub hedge_after: Nanos,
    /// A step taking longer than this fails the run.
    pub step_limit: Nanos,
    /// Faults to inject.
    pub faults: Faults,
}

impl SimConfig {
    /// A small fault-free job: 4 nodes, 2048 samples of 64..512 bytes,
    /// arenas holding the whole dataset, batches of 16, 2 epochs.
    pub fn small(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            nodes: 4,
            samples: 2048,
            min_size: 64,
            max_size: 512,
            arena_pct: 100,
            batch: 16,
            epochs: 2,
            latency: 100_000,
            store_latency: 2 * MS,
            hedge_after: 20 * MS,
            step_limit: 5_000 * MS,
            faults: Faults::default(),
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Global steps completed.
    pub steps: usize,
    /// Store reads per epoch (all agents).
    pub store_reads: Vec<u64>,
    /// Samples delivered from the local arena, per epoch.
    pub local_hits: Vec<u64>,
    /// Samples delivered from a peer, per epoch.
    pub peer_hits: Vec<u64>,
    /// Samples delivered from the store, per epoch.
    pub store_hits: Vec<u64>,
    /// Peer messages per epoch (one per delivery of bytes on a link).
    pub messages: Vec<u64>,
    /// Bytes on peer links per epoch (frames and payloads).
    pub peer_bytes: Vec<u64>,
    /// Peer requests sent per epoch.
    pub requests: Vec<u64>,
    /// Misses received.
    pub misses: u64,
    /// Blocks rejected by their CRC.
    pub crc_failures: u64,
    /// Requests also sent to the store because their answer was late.
    pub hedged: u64,
    /// Samples of a peer found slow read from the store instead of asking
    /// it (and gets of it handed to the store when it was found slow).
    pub slow_routed: u64,
    /// Peer copies arriving after the sample was delivered.
    pub late_discarded: u64,
    /// Cancels sent for gets handed to the store.
    pub cancels: u64,
    /// Requests an owner dropped because their requester cancelled them.
    pub cancelled: u64,
    /// Store reads caused by a peer failure (miss, closed, CRC, hedge, no
    /// connection).
    pub fallbacks: u64,
    /// Connections closed (either side).
    pub conns_closed: u64,
    /// Simulated time at the end.
    pub elapsed: Nanos,
}

/// Why a run failed; each names where, so the seed can be replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// A consumer's samples for a step differ from its plan.
    PlanMismatch {
        /// Global step.
        step: usize,
        /// Node.
        node: usize,
        /// Samples planned, sorted.
        planned: Vec<u64>,
        /// Samples received, sorted.
        received: Vec<u64>,
    },
    /// Bytes that passed the CRC differ from the store's.
    WrongBytes {
        /// Node.
        node: usize,
        /// Sample.
        sample: u64,
    },
    /// An owner read a kept sample from the store twice in one incarnation.
    DoubleOwnerRead {
        /// Node.
        node: usize,
        /// Sample.
        sample: u64,
    },
    /// An epoch read the store more than its bound.
    StoreBound {
        /// Epoch.
        epoch: u32,
        /// Reads.
        reads: u64,
        /// Bound.
        bound: u64,
    },
    /// A step did not finish in time.
    Stuck {
        /// Global step.
        step: usize,
        /// Samples still missing per node.
        missing: Vec<usize>,
    },
    /// The configuration cannot run.
    Config(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for SimError {}

/// Simulated events, ordered by time then by scheduling order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Bytes on link `link` from `from` arrive at `to`.
    Bytes {
        from: usize,
        to: usize,
        link: u64,
        data: Vec<u8>,
    },
    /// The transport of `to` learns link `link` is gone.
    Reset { to: usize, link: u64 },
    /// A store read of `node` (incarnation `inc`) lands.
    Store { node: usize, inc: u64, sample: u64 },
    /// Timers of every agent.
    Tick,
    /// Kill a node.
    Kill { node: usize },
    /// Restart a node.
    Restart { node: usize },
}

/// The event queue and the simulated clock.
#[derive(Debug, Default)]
struct Queue {
    now: Nanos,
    seq: u64,
    heap: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
}

impl Queue {
    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }
    fn pop(&mut self) -> Option<Ev> {
        let Reverse((t, _, ev)) = self.heap.pop()?;
        self.now = self.now.max(t);
        Some(ev)
    }
}

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(granary_base::hash::GAMMA);
        mix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn nonce(&mut self) -> [u8; 32] {
        let mut n = [0u8; 32];
        for c in n.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        n
    }
}

/// The store's bytes of a sample.
fn store_bytes(sample: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (mix64(sample.wrapping_mul(0x1_0000_0001) ^ (i / 8)) >> ((i % 8) * 8)) as u8)
        .collect()
}

/// What every agent shares: inputs, the run's state, the counters.
struct Shared {
    cfg: SimConfig,
    view: View,
    dir: Directory,
    sizes: Vec<u64>,
    rng: Rng,
    report: Report,
    epoch: u32,
    step: usize,
    next_link: u64,
    /// Node down until restarted.
    down: Vec<bool>,
    /// Partition active now between (a, b).
    cut: Option<(usize, usize)>,
    /// Kept samples read by owners in this epoch.
    owner_reads: u64,
    /// Fallback reads in this epoch.
    epoch_fallbacks: u64,
    first_error: Option<SimError>,
}

impl Shared {
    fn fail(&mut self, e: SimError) {
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
    fn cut_between(&self, a: usize, b: usize) -> bool {
        self.cut
            .is_some_and(|(x, y)| (x == a && y == b) || (x == b && y == a))
    }
    fn link_latency(&self, from: usize) -> Nanos {
        match self.cfg.faults.slow {
            Some((n, factor)) if n == from => self.cfg.latency.saturating_mul(factor.max(1)),
            _ => self.cfg.latency,
        }
    }
}

/// Runs one simulation; `Ok` when every check held.
pub fn run(cfg: &SimConfig) -> Result<Report, SimError> {
    if cfg.nodes == 0 || cfg.batch == 0 || cfg.samples == 0 || cfg.min_size > cfg.max_size {
        return Err(SimError::Config(
            "nodes, batch and samples must be non-zero and min_size <= max_size".into(),
        ));
    }
    let per_step = (cfg.nodes * cfg.batch) as u64;
    if cfg.samples < per_step {
        return Err(SimError::Config(
            "fewer samples than one global step".into(),
        ));
    }
    let mut rng = Rng(cfg.seed);
    let sizes: Vec<u64> = (0..cfg.samples)
        .map(|_| cfg.min_size + rng.below(cfg.max_size - cfg.min_size + 1))
        .collect();
    let total: u64 = sizes.iter().sum();
    let budget = total.saturating_mul(cfg.arena_pct) / 100 / cfg.nodes as u64;
    let view = View::new(
        "sim-job",
        1,
        (0..cfg.nodes).map(|i| Member::new(format!("node{i:04}"), format!("sim:{i}"), 1 << 30)),
    )
    .map_err(|e| SimError::Config(e.to_string()))?;
    let dir = Directory::compute(&view, SIM_FINGERPRINT, &sizes, &vec![budget; cfg.nodes])
        .map_err(|e| SimError::Config(e.to_string()))?;
    let mut sh = Shared {
        cfg: cfg.clone(),
        view,
        dir,
        sizes,
        rng,
        report: Report::default(),
        epoch: 0,
        step: 0,
        next_link: 1,
        down: vec![false; cfg.nodes],
        cut: None,
        owner_reads: 0,
        epoch_fallbacks: 0,
        first_error: None,
    };
    let mut agents: Vec<Agent> = (0..cfg.nodes)
        .map(|i| Agent::new(i, 1, cfg.nodes, cfg))
        .collect();
    let mut q = Queue::default();
    let steps_per_epoch = (cfg.samples / per_step) as usize;
    let tick = MS;
    q.at(tick, Ev::Tick);

    for epoch in 0..cfg.epochs {
        sh.epoch = epoch;
        sh.owner_reads = 0;
        sh.epoch_fallbacks = 0;
        for v in [
            &mut sh.report.store_reads,
            &mut sh.report.local_hits,
            &mut sh.report.peer_hits,
            &mut sh.report.store_hits,
            &mut sh.report.messages,
            &mut sh.report.peer_bytes,
            &mut sh.report.requests,
        ] {
            v.push(0);
        }
        let perm = permutation(
            cfg.samples,
            cfg.seed ^ u64::from(epoch).wrapping_mul(0x5851_f42d),
        );
        for s in 0..steps_per_epoch {
            let step = sh.report.steps;
            sh.step = step;
            if let Some(p) = cfg.faults.partition {
                sh.cut = (step >= p.from_step && step < p.to_step).then_some((p.a, p.b));
            }
            if let Some(k) = cfg.faults.kill {
                if k.at_step == step && k.node < cfg.nodes {
                    q.at(q.now + 3 * cfg.latency, Ev::Kill { node: k.node });
                    q.at(
                        q.now + 3 * cfg.latency + k.down_for,
                        Ev::Restart { node: k.node },
                    );
                }
            }
            let base = s * cfg.nodes * cfg.batch;
            let plans: Vec<Vec<u64>> = (0..cfg.nodes)
                .map(|n| perm[base + n * cfg.batch..base + (n + 1) * cfg.batch].to_vec())
                .collect();
            for (n, plan) in plans.iter().enumerate() {
                agents[n].start_step(plan, &mut q, &mut sh);
            }
            let started = q.now;
            loop {
                if let Some(e) = sh.first_error.take() {
                    return Err(e);
                }
                if agents.iter().all(|a| a.step_done()) {
                    break;
                }
                if q.now > started + cfg.step_limit {
                    return Err(SimError::Stuck {
                        step,
                        missing: agents.iter().map(Agent::missing).collect(),
                    });
                }
                let Some(ev) = q.pop() else {
                    return Err(SimError::Stuck {
                        step,
                        missing: agents.iter().map(Agent::missing).collect(),
                    });
                };
                dispatch(ev, &mut agents, &mut q, &mut sh, tick);
            }
            for (n, plan) in plans.iter().enumerate() {
                let mut planned = plan.clone();
                planned.sort_unstable();
                let mut received = agents[n].take_received();
                received.sort_unstable();
                if planned != received {
                    return Err(SimError::PlanMismatch {
                        step,
                        node: n,
                        planned,
                        received,
                    });
                }
            }
            sh.report.steps += 1;
        }
        let consumed = &perm[..steps_per_epoch * cfg.nodes * cfg.batch];
        let not_kept = consumed.iter().filter(|&&s| !sh.dir.is_kept(s)).count() as u64;
        let reads = sh.report.store_reads[epoch as usize];
        let bound = sh.owner_reads + not_kept + sh.epoch_fallbacks;
        if reads > bound {
            return Err(SimError::StoreBound {
                epoch,
                reads,
                bound,
            });
        }
    }
    sh.report.elapsed = q.now;
    Ok(sh.report)
}

fn dispatch(ev: Ev, agents: &mut [Agent], q: &mut Queue, sh: &mut Shared, tick: Nanos) {
    match ev {
        Ev::Bytes {
            from,
            to,
            link,
            data,
        } => {
            if sh.down[to] {
                let back = q.now + sh.link_latency(to);
                q.at(back, Ev::Reset { to: from, link });
            } else {
                agents[to].on_bytes(from, link, &data, q, sh);
            }
        }
        Ev::Reset { to, link } => {
            if !sh.down[to] {
                agents[to].on_reset(link, q, sh);
            }
        }
        Ev::Store { node, inc, sample } => {
            if !sh.down[node] && agents[node].incarnation() == inc {
                agents[node].on_store(sample, q, sh);
            }
        }
        Ev::Tick => {
            for a in agents.iter_mut() {
                if !sh.down[a.node()] {
                    a.on_tick(q, sh);
                }
            }
            q.at(q.now + tick, Ev::Tick);
        }
        Ev::Kill { node } => {
            sh.down[node] = true;
            // The kernel closes a killed process's sockets: peers see resets.
            for link in agents[node].links() {
                let (peer, id) = link;
                q.at(q.now + sh.cfg.latency, Ev::Reset { to: peer, link: id });
            }
            let inc = agents[node].incarnation();
            let plan = agents[node].pending_plan();
            agents[node] = Agent::new(node, inc + 1, sh.cfg.nodes, &sh.cfg);
            agents[node].keep_plan(plan);
        }
        Ev::Restart { node } => {
            sh.down[node] = false;
            agents[node].resume(true, q, sh);
        }
    }
}

/// A seeded permutation of `0..n` (sorted by a hash, then index).
fn permutation(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.sort_by_key(|&s| (mix64(s ^ mix64(seed)), s));
    v
}

#[cfg(test)]
mod tests;
