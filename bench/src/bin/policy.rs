//! Cache policies through the real agent: hit rate per epoch for clairvoyant, MinIO and LRU on a dataset twice the arena, next to the simulator's prediction.
//!
//! The synthetic dataset (default 4,000 files of ~50 KB, log-normal sizes)
//! is served by an in-process agent whose arena is half the dataset's
//! bytes. For each policy a fresh agent runs one session (seed 42, batches
//! of 32) for 4 epochs; the loader verifies every byte of every sample.
//! The hit rate of each epoch is read from the agent's
//! `granary_epoch_lookups_total{dataset,epoch,result}` (a hit: the sample
//! was in the arena, or already being read, when the fetcher needed it).
//!
//! The simulator (`granary_agent::cache::sim`) replays the same session
//! against a cache configured as the engine configures its own (the arena
//! less the sample-table area, the same alignment and transient reserve)
//! and its per-epoch hit rates are printed beside the measured ones.
//!
//! Goal: clairvoyant ≥ MinIO > LRU in every epoch after the first.

use granary::{Client, SessionOptions};
use granary_agent::cache::sim::{self, SimConfig};
use granary_agent::cache::PolicyKind;
use granary_agent::planner::{PlanParams, SessionPlan};
use granary_bench::agent::{series_value, Agent, AgentSettings};
use granary_bench::cli::Args;
use granary_bench::data;
use granary_bench::loader::{self, Wait};
use granary_bench::report::Json;
use granary_bench::sys;
use granary_tools::synth;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: bench/run policy [options]
  --files N        files in the synthetic dataset (default 4000)
  --mean-size B    mean file size in bytes (default 50000)
  --epochs N       epochs per session (default 4)
  --batch N        samples per batch (default 32)
  --window N       prefetch.window_batches (default 16)
  --ready N        sessions.ready_ring_capacity (default 64)
  --inflight N     prefetch.max_inflight_reads (default 64: the configuration
                   allows 1 per MiB of arena)
  --seed S         the session's shuffle seed (default 42)";

const MIB: u64 = 1 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The bytes the engine keeps for sample tables at the head of an arena of
/// `arena` bytes (mirrors `engine::table_area`).
fn table_area(arena: u64) -> u64 {
    (arena / 64).clamp(MIB, 64 * MIB) & !4095
}

fn run() -> Result<()> {
    let args = Args::parse(std::env::args().skip(1), &[], USAGE)?;
    let files = args.u64("files", 4_000)?;
    let mean = args.u64("mean-size", 50_000)?;
    let epochs = args.u32("epochs", 4)?.max(1);
    if epochs as usize > granary_agent::metrics::EPOCH_SLOTS {
        return Err(format!(
            "--epochs {epochs}: the agent keeps per-epoch counters for {} epochs only",
            granary_agent::metrics::EPOCH_SLOTS
        ));
    }
    let batch = args.u32("batch", granary::DEFAULT_BATCH_SIZE)?;
    let window = args.u32("window", 16)?;
    let inflight = args.u32("inflight", 64)?;
    let ready = args.u32("ready", 64)?;
    let seed = args.u64("seed", 42)?;

    println!("policy: {}", sys::regime());
    let ds = data::ensure(&data::spec(files, mean, 40)).map_err(|e| format!("dataset: {e}"))?;
    let arena = (ds.bytes / 2 / (2 * MIB) * (2 * MIB)).max(64 * MIB);
    let cache_bytes = arena - table_area(arena);
    println!(
        "dataset: {} files, {:.1} MB ({:.1} MB in 4 KiB extents); arena {:.1} MB ({:.2}× smaller), \
         of which {:.1} MB for samples; batch {batch}, window {window}, ready ring {ready}, {inflight} reads in flight, {epochs} epochs, seed {seed}",
        ds.len(),
        ds.bytes as f64 / 1e6,
        ds.aligned_bytes(4096) as f64 / 1e6,
        arena as f64 / 1e6,
        ds.bytes as f64 / arena as f64,
        cache_bytes as f64 / 1e6,
    );

    let params = PlanParams {
        num_samples: ds.len(),
        seed,
        rank: 0,
        world_size: 1,
        batch_size: batch,
        drop_last: false,
    };
    let plan = SessionPlan::new(params, 0, epochs).map_err(|e| format!("plan: {e}"))?;

    // The JSON line: {"bench":"policy","clairvoyant":[..],"minio":[..],"lru":[..]}.
    let mut json = Json::bench("policy").line();
    json.pop();
    let mut measured_all = Vec::new();
    for policy in PolicyKind::ALL {
        let mut settings = AgentSettings::new(arena, "policy", &ds.spec.root);
        settings.policy = policy.as_str().to_owned();
        settings.hugepages = "off".to_owned();
        settings.window_batches = window;
        settings.max_inflight_reads = inflight;
        settings.ready_ring_capacity = ready;
        let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
        let cc = agent.cache_config();
        if cc.arena_size != cache_bytes || cc.policy != policy {
            return Err(format!(
                "the engine's cache is not the one expected: {cc:?}"
            ));
        }
        let sim_cfg = SimConfig {
            arena_size: cc.arena_size,
            align: cc.align,
            transient_reserve: cc.transient_reserve,
            sample_sizes: ds.sizes(),
            sessions: vec![plan.clone()],
        };
        let predicted = sim::simulate(&sim_cfg, policy)
            .map_err(|e| format!("simulating {}: {e}", policy.as_str()))?;
        if policy == PolicyKind::Clairvoyant {
            println!(
                "cache: {:.1} MB, transient reserve {:.1} MB, retain limit {:.1} MB, alignment {}",
                cc.arena_size as f64 / 1e6,
                cc.transient_reserve as f64 / 1e6,
                cc.retain_limit() as f64 / 1e6,
                cc.align
            );
        }
        let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
        let mut opts = SessionOptions::new("policy");
        opts.seed = seed;
        opts.batch_size = batch;
        opts.epoch_count = epochs;
        let t = Instant::now();
        let run = loader::consume(&client, &opts, Wait::Block, |s| {
            let info = synth::verify_sample(s.bytes)
                .map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
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
        if delivered != ds.len() * u64::from(epochs) || lookups.len() != epochs as usize {
            return Err(format!(
                "{}: {delivered} samples delivered and {} epochs counted; expected {} and {epochs}",
                policy.as_str(),
                lookups.len(),
                ds.len() * u64::from(epochs)
            ));
        }
        let measured: Vec<f64> = lookups.iter().map(|l| l.hit_rate()).collect();
        let sim_rates = predicted.hit_rates();
        let mut line = format!("{:<12} agent:", policy.as_str());
        for r in &measured {
            let _ = write!(line, " {:5.1}%", r * 100.0);
        }
        line.push_str("   simulator:");
        for r in &sim_rates {
            let _ = write!(line, " {:5.1}%", r * 100.0);
        }
        println!("{line}");
        println!(
            "{:<12} {reads} reads from the source ({:.1} MB), {:.2} s, loader stalled {:.2} s; \
             simulator: {} evictions, {} transient reads, {} unserved",
            "",
            series_value(&series, "granary_read_bytes_total") / 1e6,
            secs,
            waited_s,
            predicted.evictions,
            predicted.transient_reads,
            predicted.unserved,
        );
        let list = measured
            .iter()
            .map(|r| format!("{r:.4}"))
            .collect::<Vec<_>>()
            .join(",");
        let _ = write!(json, ",\"{}\":[{list}]", policy.as_str());
        measured_all.push(measured);
    }

    let (c, mi, l) = (&measured_all[0], &measured_all[1], &measured_all[2]);
    let ok = (1..epochs as usize).all(|e| c[e] >= mi[e] && mi[e] > l[e]);
    println!(
        "goal clairvoyant ≥ MinIO > LRU in epochs 2..{epochs}: {}",
        if ok { "met" } else { "NOT met" }
    );
    println!("after: {}", sys::regime());
    json.push('}');
    println!("{json}");
    Ok(())
}
