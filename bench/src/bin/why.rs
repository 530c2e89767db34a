//! Why the GPU waits: one cause injected at a time (a slow store, a CPU-starved loader, a long GPU step); the share of intervals after warm-up whose verdict names it (goal ≥ 0.95).
//!
//! One run, scenario after scenario, each with a fresh in-process agent over
//! an S3 dataset on the light store (`bench/src/light_store.rs`) behind the
//! delay proxy, and one loader thread (libgranary's Rust API) that loops
//! over `next_batch` and does, per batch, what its scenario injects:
//!
//! * `store`: the proxy adds `--store-delay-ms` (default 25) each way and
//!   the agent keeps 4 reads in flight; the loader's step is 5 ms of sleep.
//!   Every sample is new (a dataset larger than the run reads), so the
//!   store sets the pace: expected verdict `store`.
//! * `loader_cpu`: no delay (the agent keeps far ahead); the loader spins
//!   `--cpu-ms` (default 30) per batch on its own thread (a decode that
//!   cannot keep up): expected `loader_cpu`.
//! * `compute`: no delay; the loader sleeps `--step-ms` (default
//!   60) per batch, as a thread blocked on a GPU step: expected `compute`.
//!
//! Each scenario runs `--warmup` seconds (default 3), then `--seconds`
//! (default 12) measured; the verdicts are the agent's
//! `granary_rank_verdicts_total` over the measured part. A slow peer link
//! is not injected here (it needs two agents and a job secret; the verdict
//! `peer` is covered by the agent's unit tests).

use granary::{Client, SessionOptions};
use granary_bench::agent::{Agent, AgentSettings, S3Dataset};
use granary_bench::cli::Args;
use granary_bench::data;
use granary_bench::delay_proxy::DelayProxy;
use granary_bench::light_store::LightStore;
use granary_bench::report::Json;
use granary_bench::sys;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "bench/run why [--files N] [--mean-size B] [--seconds S] [--warmup S] \
                     [--store-delay-ms MS] [--cpu-ms MS] [--step-ms MS] [--batch N]";
const DATASET: &str = "why";
const BUCKET: &str = "why";
const GOAL: f64 = 0.95;
const VERDICTS: [&str; 6] = ["idle", "compute", "loader_cpu", "store", "peer", "arena"];

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("why: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Inject {
    /// Sleep this long per batch (a step that does not need the loader's CPU).
    Sleep(Duration),
    /// Spin this long per batch on the loader's thread.
    Spin(Duration),
}

struct Scenario {
    name: &'static str,
    delay: Duration,
    inflight: u32,
    inject: Inject,
}

fn run() -> Result<()> {
    let args = Args::parse(std::env::args().skip(1), &[], USAGE)?;
    let files = args.u64("files", 40_000)?;
    let mean = args.u64("mean-size", 16_384)?;
    let seconds = args.u64("seconds", 12)?;
    let warmup = args.u64("warmup", 3)?;
    let batch = args.u32("batch", 32)?;
    let ms = |k: &str, d: u64| args.u64(k, d).map(Duration::from_millis);
    let scenarios = [
        Scenario {
            name: "store",
            delay: ms("store-delay-ms", 25)?,
            inflight: 4,
            inject: Inject::Sleep(Duration::from_millis(5)),
        },
        Scenario {
            name: "loader_cpu",
            delay: Duration::ZERO,
            inflight: 64,
            inject: Inject::Spin(ms("cpu-ms", 30)?),
        },
        Scenario {
            name: "compute",
            delay: Duration::ZERO,
            inflight: 64,
            inject: Inject::Sleep(ms("step-ms", 60)?),
        },
    ];
    println!("why: {}", sys::regime());
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    let store =
        LightStore::start(&ds.spec.root, BUCKET, "", 2).map_err(|e| format!("light store: {e}"))?;
    let mut json = Json::bench("why");
    let mut worst = f64::INFINITY;
    for sc in &scenarios {
        let share = scenario(&store, sc, batch, warmup, seconds)?;
        worst = worst.min(share);
        json.num(sc.name, share, 3);
    }
    json.num("worst_share", worst, 3);
    json.str("peer", "not injected");
    json.str(
        "goal",
        if worst >= GOAL {
            "met: every injected cause named in >= 95 % of intervals"
        } else {
            "not met: a cause named in < 95 % of intervals"
        },
    );
    println!("{}", json.line());
    Ok(())
}

/// Runs one scenario; returns the share of measured intervals whose verdict
/// names it.
fn scenario(
    store: &LightStore,
    sc: &Scenario,
    batch: u32,
    warmup: u64,
    seconds: u64,
) -> Result<f64> {
    let proxy = DelayProxy::start("127.0.0.1:0".parse().unwrap(), store.addr(), sc.delay, None)
        .map_err(|e| format!("delay proxy: {e}"))?;
    let mut settings = store.settings_via(proxy.local_addr());
    settings.request_timeout = Duration::from_secs(30);
    let dataset = S3Dataset {
        name: DATASET.to_owned(),
        settings,
        prefix: String::new(),
        extra: Vec::new(),
    };
    let mut cfg = AgentSettings::new_s3(1 << 30, dataset);
    cfg.max_inflight_reads = sc.inflight;
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 7;
    opts.batch_size = batch;
    opts.epoch_count = 1000;
    opts.open_timeout = Duration::from_secs(120);
    let mut session = client
        .open_session(&opts)
        .map_err(|e| format!("open: {e}"))?;
    let start = Instant::now();
    let mut before: Option<[f64; 6]> = None;
    let mut batches = 0u64;
    while start.elapsed() < Duration::from_secs(warmup + seconds) {
        if before.is_none() && start.elapsed() >= Duration::from_secs(warmup) {
            before = Some(verdicts(&agent));
        }
        let b = session
            .next_batch(Some(Duration::from_secs(60)))
            .map_err(|e| format!("next_batch: {e}"))?;
        batches += 1;
        drop(b);
        match sc.inject {
            Inject::Sleep(d) => std::thread::sleep(d),
            Inject::Spin(d) => {
                let t = Instant::now();
                while t.elapsed() < d {
                    std::hint::spin_loop();
                }
            }
        }
    }
    let after = verdicts(&agent);
    let before = before.unwrap_or([0.0; 6]);
    let counts: BTreeMap<&str, f64> = VERDICTS
        .iter()
        .zip(after.iter().zip(before))
        .map(|(v, (a, b))| (*v, a - b))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let total: f64 = counts.values().sum();
    let hit = counts.get(sc.name).copied().unwrap_or(0.0);
    let share = if total > 0.0 { hit / total } else { 0.0 };
    println!(
        "{:<11} {} batches; intervals by verdict {:?}: {:.1} % name the injected cause ({})",
        sc.name,
        batches,
        counts,
        100.0 * share,
        if share >= GOAL { "met" } else { "not met" }
    );
    drop(session);
    agent.stop().map_err(|e| format!("agent stop: {e}"))?;
    Ok(share)
}

/// `granary_rank_verdicts_total` of rank 0, in [`VERDICTS`] order.
fn verdicts(agent: &Agent) -> [f64; 6] {
    let mut out = [0.0; 6];
    for (k, v) in agent.series() {
        if !k.starts_with("granary_rank_verdicts_total{") || !k.contains("rank=\"0\"") {
            continue;
        }
        if let Some(i) = VERDICTS
            .iter()
            .position(|x| k.contains(&format!("verdict=\"{x}\"")))
        {
            out[i] = v;
        }
    }
    out
}
