//! `bench/run why`. Why the GPU waits: one cause injected at a time (a slow store, a CPU-starved loader, a long GPU step); the share of intervals after warm-up whose verdict names it (goal ≥ 0.95).
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
//! * `peer`: two agents, A and B, peers of one job over loopback, each
//!   one's peer listener behind a delay proxy of its own. A loader on B
//!   reads an epoch of a smaller dataset (`--peer-files`, default 3,000)
//!   first, so that each agent keeps the samples it owns; then the store
//!   proxy adds 100 ms each way, the peer proxies `--peer-delay-ms`
//!   (default 10) each way and a cap of `--peer-mbps` (default 8), and a
//!   loader on A (5 ms sleep per batch) reads: its own samples are in its
//!   arena, the others come over the slow link. Expected `peer`.
//!
//! Each scenario runs `--warmup` seconds (default 3), then `--seconds`
//! (default 12) measured; the verdicts are the agent's
//! `granary_rank_verdicts_total` (of agent A for `peer`) over the measured
//! part.
//!
//! Layout: [`scenario`] (the injected causes, the agents over the delayed
//! store and peer links), [`measure`] (a measured loop and the verdict
//! counters), [`report`] (the share naming the cause, the result line);
//! `bin/why.rs` parses the options.

pub mod inject;
pub mod measure;
pub mod report;
pub mod scenario;

use std::time::Duration;

use crate::cli::num;
use crate::data;
use crate::light_store::LightStore;
use crate::report::Goal;
use crate::sys;
use scenario::{Inject, Scenario};

type Result<T> = std::result::Result<T, String>;

/// The goal: every injected cause named in at least 95 % of the measured
/// intervals (`worst_share`).
pub const GOAL: Goal = Goal::at_least("goal", 0.95);

/// The dataset's name in the agents' configuration.
const DATASET: &str = "why";
/// The light store's bucket.
const BUCKET: &str = "why";

/// The benchmark's options (`bench/run why --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 40_000, value_parser = num::<u64>)]
    pub files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 16_384, value_parser = num::<u64>)]
    pub mean_size: u64,
    /// Measured seconds per scenario.
    #[arg(long, default_value_t = 12, value_parser = num::<u64>)]
    pub seconds: u64,
    /// Seconds per scenario before the measurement.
    #[arg(long, default_value_t = 3, value_parser = num::<u64>)]
    pub warmup: u64,
    /// Delay the store proxy adds each way in the `store` scenario, ms.
    #[arg(long, default_value_t = 25, value_parser = num::<u64>)]
    pub store_delay_ms: u64,
    /// CPU the loader spins per batch in the `loader_cpu` scenario, ms.
    #[arg(long, default_value_t = 30, value_parser = num::<u64>)]
    pub cpu_ms: u64,
    /// The loader's sleep per batch in the `compute` scenario, ms.
    #[arg(long, default_value_t = 60, value_parser = num::<u64>)]
    pub step_ms: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 32, value_parser = num::<u32>)]
    pub batch: u32,
    /// Files in the `peer` scenario's dataset.
    #[arg(long, default_value_t = 3_000, value_parser = num::<u64>)]
    pub peer_files: u64,
    /// Delay each peer proxy adds each way in the `peer` scenario, ms.
    #[arg(long, default_value_t = 10, value_parser = num::<u64>)]
    pub peer_delay_ms: u64,
    /// Bandwidth cap of each peer proxy in the `peer` scenario, Mbit/s.
    #[arg(long, default_value_t = 8, value_parser = num::<u64>)]
    pub peer_mbps: u64,
}

impl Options {
    /// The single-agent scenarios, in the order they run.
    fn scenarios(&self) -> [Scenario; 3] {
        let ms = Duration::from_millis;
        [
            Scenario {
                name: "store",
                delay: ms(self.store_delay_ms),
                inflight: 4,
                inject: Inject::Sleep(ms(5)),
            },
            Scenario {
                name: "loader_cpu",
                delay: Duration::ZERO,
                inflight: 64,
                inject: Inject::Spin(ms(self.cpu_ms)),
            },
            Scenario {
                name: "compute",
                delay: Duration::ZERO,
                inflight: 64,
                inject: Inject::Sleep(ms(self.step_ms)),
            },
        ]
    }

    /// The warm-up and measured parts of each scenario.
    fn window(&self) -> measure::Window {
        measure::Window {
            warmup: Duration::from_secs(self.warmup),
            measured: Duration::from_secs(self.seconds),
        }
    }
}

/// Runs the benchmark; prints the result line last.
pub fn run(o: &Options) -> Result<()> {
    println!("why: {}", sys::regime());
    let ds = data::ensure(&data::spec(o.files, o.mean_size, 100))
        .map_err(|e| format!("dataset: {e}"))?;
    let store =
        LightStore::start(&ds.spec.root, BUCKET, "", 2).map_err(|e| format!("light store: {e}"))?;
    let mut shares = Vec::new();
    for sc in &o.scenarios() {
        let counts = scenario::single(&store, sc, o.batch, o.window())?;
        shares.push((sc.name, report::share(sc.name, &counts)));
    }
    let counts = scenario::peer(o, o.window())?;
    shares.push(("peer", report::share("peer", &counts)));
    println!("{}", report::line(&shares).line());
    Ok(())
}
