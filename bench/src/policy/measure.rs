//! One policy: a fresh agent serves the session, every byte of every
//! sample verified, its per-epoch hit rates read back; the simulator
//! replays the same session against the cache the engine configured.

use std::time::Instant;

use granary::{Client, SessionOptions};
use granary_agent::cache::sim::{self, SimConfig, SimResult};
use granary_agent::cache::{CacheConfig, PolicyKind};
use granary_tools::synth;

use super::scenario::Scenario;
use super::{Options, Result};
use crate::agent::{series_value, Agent, AgentSettings};
use crate::loader::{self, Wait};

/// What one policy's run measured and the simulator predicted.
pub struct PolicyRun {
    /// The policy.
    pub policy: PolicyKind,
    /// The cache the engine configured.
    pub cache: CacheConfig,
    /// The agent's hit rate per epoch.
    pub measured: Vec<f64>,
    /// The simulator's replay.
    pub predicted: SimResult,
    /// Reads submitted to the source.
    pub reads: u64,
    /// Bytes read from the source.
    pub read_bytes: f64,
    /// The session's wall time, seconds.
    pub secs: f64,
    /// The loader's time waiting for batches, seconds.
    pub waited_s: f64,
}

/// Runs `policy` through a fresh agent and through the simulator.
pub fn policy(sc: &Scenario, o: &Options, policy: PolicyKind) -> Result<PolicyRun> {
    let ds = &sc.ds;
    let mut settings = AgentSettings::new(sc.arena, "policy", &ds.spec.root);
    settings.policy = policy.as_str().to_owned();
    settings.hugepages = "off".to_owned();
    settings.window_batches = o.window;
    settings.max_inflight_reads = o.inflight;
    settings.ready_ring_capacity = o.ready;
    let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
    let cc = agent.cache_config();
    if cc.arena_size != sc.cache_bytes || cc.policy != policy {
        return Err(format!(
            "the engine's cache is not the one expected: {cc:?}"
        ));
    }
    let sim_cfg = SimConfig {
        arena_size: cc.arena_size,
        align: cc.align,
        transient_reserve: cc.transient_reserve,
        sample_sizes: ds.sizes(),
        sessions: vec![sc.plan.clone()],
    };
    let predicted = sim::simulate(&sim_cfg, policy)
        .map_err(|e| format!("simulating {}: {e}", policy.as_str()))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new("policy");
    opts.seed = o.seed;
    opts.batch_size = o.batch;
    opts.epoch_count = o.epochs;
    let t = Instant::now();
    let run = loader::consume(&client, &opts, Wait::Block, |s| {
        let info =
            synth::verify_sample(s.bytes).map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
        if info.file_id != s.id {
            return Err(format!("sample {} carries file {}", s.id, info.file_id));
        }
        Ok(info.len)
    })?;
    let secs = t.elapsed().as_secs_f64();
    let lookups = agent.epoch_lookups("policy");
    let series = agent.series();
    let m = agent.metrics();
    let reads = m.reads_submitted.get();
    let waited_s = m.loader_wait_ns.get() as f64 / 1e9;
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;

    let delivered: u64 = run.epochs.iter().map(|e| e.samples).sum();
    let expected = ds.len() * u64::from(o.epochs);
    if delivered != expected || lookups.len() != o.epochs as usize {
        return Err(format!(
            "{}: {delivered} samples delivered and {} epochs counted; expected {expected} and {}",
            policy.as_str(),
            lookups.len(),
            o.epochs
        ));
    }
    Ok(PolicyRun {
        policy,
        cache: cc,
        measured: lookups.iter().map(|l| l.hit_rate()).collect(),
        predicted,
        reads,
        read_bytes: series_value(&series, "granary_read_bytes_total"),
        secs,
        waited_s,
    })
}
