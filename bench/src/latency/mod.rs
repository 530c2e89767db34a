//! `bench/run latency`. S3 latency: samples/s against the store's round-trip time (0–200 ms, a delay proxy in front of SeaweedFS and of a light S3 store) for Granary, PyTorch DataLoaders doing one boto3 GET per sample (8 and 32 workers), 64 threaded GETs (4 workers × 16) and s3torchconnector.
//!
//! One run:
//!
//! 1. the synthetic dataset (default 40,000 files, ~110 KB each, ~4.4 GB:
//!    Granary's cold epoch lasts long enough for a window of about 10 s)
//!    is generated once under `bench/.data/`;
//! 2. a SeaweedFS (`weed mini`, [`crate::seaweed`]) starts on free
//!    loopback ports in a fresh directory, and `granary ingest`'s code
//!    uploads the dataset into its bucket (straight to the S3 port) and
//!    reads every object back (`--verify`: the upload is checked, and the
//!    store's caches are in the same state for every point, the first one
//!    included); the run then waits until SeaweedFS is idle;
//! 3. the delay proxy ([`crate::delay_proxy`]) starts in this
//!    process in front of SeaweedFS's S3 port; every client below talks to
//!    the proxy. For each round-trip time the proxy delays each direction by
//!    half of it, and three loaders are measured one after the other:
//!    * **granary**: a fresh in-process agent (the real engine) serving the
//!      bucket as a `kind = "s3"` dataset through the proxy, read by one
//!      libgranary session (batches of 32, one epoch): every sample's
//!      header is checked (magic, id, class, length), every byte is XORed
//!      once, and every 16th sample is verified byte for byte. A fresh
//!      agent per point and the first epoch only: every measured sample
//!      comes from the store, never from the arena (the run reports the
//!      arena hits: 0). Hiding a round trip takes `rate × RTT` requests in
//!      flight (Little's law: 3,000 samples/s × 0.2 s = 600), so the agent
//!      runs with `prefetch.max_inflight_reads` 1,024 (the S3 fetcher's
//!      capacity), a window of 64 batches (2,048 samples) and a 1 GiB
//!      arena (`--inflight` takes a list to compare values). Next to every
//!      round-trip time above 0 the agent is also measured at 0 ms (before
//!      the point at every other one): on a machine shared with other
//!      work the CPU left to the store changes from minute to minute, and
//!      the references show how far the machine drifted. The goal's ratio
//!      divides the 100 ms rate by the median of all these 0 ms
//!      measurements; the ratios to the neighbour alone and to the sweep's
//!      0 ms point are reported too;
//!    * **dataloader_w8**, **dataloader_w32**:
//!      `bench/latency_dataloader.py`, a PyTorch `DataLoader` over a
//!      map-style Dataset doing one boto3 `get_object` per sample (body read
//!      whole, length and magic checked), `num_workers` 8 and 32, batches
//!      of 32, shuffled;
//!    * **boto3_threads**, **s3torch_map**, **s3torch_iter**
//!      (`--contenders`): the per-sample loaders of `bench/run stall`, with
//!      its settings (4 workers × 16 threads; s3torchconnector's map and
//!      iterable datasets with 8 workers), run by `bench/stall_train.py`
//!      with no GPU step, so that they deliver as fast as they can; their
//!      CPU is their whole process tree's;
//! 4. the same sweep runs against the **light store**
//!    ([`crate::light_store`], `--store light|seaweed|both`): the
//!    dataset's folder served read-only as the same bucket and keys by a
//!    hyper HTTP/1.1 server on threads of this process, each request one
//!    `open` and one `pread` from the page cache. SeaweedFS takes more than
//!    a core at these rates and caps every client alike; the light store
//!    leaves the CPU to the clients, so that the comparison is about their
//!    latency hiding and their CPU per sample. Its goals (issue 14):
//!    Granary at 100 ms ≥ 0.9 × Granary at 0 ms, and ≥ 2 × the best
//!    contender at 100 ms; the store's cores at 0 ms are printed to show
//!    it is not the bottleneck (below half a core for every client);
//! 5. the results are printed, plotted into `docs/latency.png`
//!    (`bench/latency_plot.py`, matplotlib) and summed up in the last line.
//!
//! **Steady state.** Each measurement skips the ramp-up and counts the
//! samples finished in a window: Granary from `--warmup-s` seconds after
//! its first batch until `--window-s` later or until 95 % of the epoch has
//! been delivered, whichever comes first (the epoch's tail, where the
//! prefetch window drains, is never measured); the DataLoader from
//! `--warmup-s` seconds after every worker has finished its first sample,
//! for `--window-s` seconds, counted where the samples are fetched (its
//! sampler never ends an epoch inside the window).
//!
//! **Where the CPU goes.** For every window the run records the CPU time of
//! SeaweedFS, of the proxy's threads, of the agent's engine and S3 fetcher
//! threads and of the loader (or of the Python processes), and of the
//! whole machine including steal time, in cores (CPU seconds per second);
//! what nobody here used is other processes' ("everything else"), and a
//! window where they took more than a quarter of a core is flagged as
//! contended. Each measurement starts once the machine has been quiet for
//! 2 s (waiting at most `--quiet-wait-s`). Every loader follows the same
//! rules: a contended window is measured again only with `--retries` (0 by
//! default), for every loader alike, and with `--repeat N` every point is
//! measured N times, the loaders interleaved, and the median kept. Every
//! point also reports CPU microseconds per delivered sample of the store,
//! the proxy, the agent, the loader thread and the Python processes.
//! Throughput on a shared machine follows the CPU the store gets, so each
//! point also reports samples per CPU-second of SeaweedFS. Everything is
//! in the last line's `*_detail` arrays.
//!
//! Layout: `scenario` (the options turned into knobs, loaders and stores),
//! `cpu` (where the CPU goes in a window), `loaders` (one measurement of
//! each loader), `measure` (a point under the quiet and retry rules, and the
//! sweep), `report` (the tables, the goals and the result line), and
//! [`format`] (`--format`: shards against one object per sample);
//! `bin/latency.rs` parses the options.

mod cpu;
pub mod format;
mod loaders;
mod measure;
mod point;
mod report;
mod scenario;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cli::num;
use crate::data;
use crate::report::{draw_with, Goal, Json};
use crate::stall_loaders::PER_SAMPLE;
use crate::sys::{self, cpu_model};
use scenario::Setup;

type Result<T> = std::result::Result<T, String>;

/// Where the S3 objects live.
const BUCKET: &str = "granary-bench";
/// Key prefix of the dataset in the bucket.
const PREFIX: &str = "synth";
/// The dataset's name in the agent.
const DATASET: &str = "latency";
/// The loader callback's way of ending a session once its window closed.
const STOP_EARLY: &str = "(window closed)";
/// The store's cores at 0 ms below which it is not what limits a client.
const STORE_BOTTLENECK: f64 = 0.5;
/// Cores taken by other processes above which a window counts as contended.
const CONTENDED: f64 = 0.25;

/// SeaweedFS: Granary at 100 ms ≥ 0.9 × its 0 ms rate (as before).
pub const GOAL_KEEP: Goal = Goal::at_least("goal_keep_0.9", 0.9);
/// SeaweedFS: Granary at 100 ms ≥ 20 × the 8-worker DataLoader (as before).
pub const GOAL_W8: Goal = Goal::at_least("goal_20x_w8", 20.0);
/// The light store: Granary at 100 ms ≥ 0.9 × Granary at 0 ms (issue 14).
pub const GOAL_LIGHT_RTT: Goal = Goal::at_least("light_goal_rtt", 0.9);
/// The light store: Granary at 100 ms ≥ 2 × the best contender (issue 14).
pub const GOAL_LIGHT_CONTENDER: Goal = Goal::at_least("light_goal_contender", 2.0);

/// The benchmark's options (`bench/run latency --help`).
#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 40_000, value_parser = num::<u64>)]
    pub files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000, value_parser = num::<u64>)]
    pub mean_size: u64,
    /// Round-trip times, ms, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,2,10,50,100,200", value_parser = num::<u64>)]
    pub rtt_ms: Vec<u64>,
    /// DataLoader num_workers values.
    #[arg(long, value_delimiter = ',', default_value = "8,32", value_parser = num::<u64>)]
    pub workers: Vec<u64>,
    /// More loaders, run by bench/stall_train.py with no GPU step (`none`: only the DataLoaders).
    #[arg(long, default_value_t = PER_SAMPLE.join(","))]
    pub contenders: String,
    /// Samples per batch, both loaders.
    #[arg(long, default_value_t = 32, value_parser = num::<u32>)]
    pub batch: u32,
    /// Ramp-up skipped before each window, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub warmup_s: f64,
    /// Length of each window, seconds.
    #[arg(long, default_value_t = 12.0)]
    pub window_s: f64,
    /// Granary: prefetch.max_inflight_reads, each value measured, the first the main column.
    #[arg(long, value_delimiter = ',', default_value = "1024", value_parser = num::<u64>)]
    pub inflight: Vec<u64>,
    /// Granary: prefetch.window_batches.
    #[arg(long, default_value_t = 64, value_parser = num::<u32>)]
    pub window: u32,
    /// Granary: prefetch.initial_window (the agent's default).
    #[arg(long, default_value_t = 2, value_parser = num::<u32>)]
    pub initial_window: u32,
    /// Granary: arena.size [default: max(1 GiB, largest inflight × 1 MiB)].
    #[arg(long, value_parser = num::<u64>)]
    pub arena: Option<u64>,
    /// Granary: sessions.ready_ring_capacity.
    #[arg(long, default_value_t = 128, value_parser = num::<u32>)]
    pub ready: u32,
    /// Granary: more keys, `section.key=value;...` (`dataset.key=value` goes into [[dataset]]).
    #[arg(long, default_value = "")]
    pub agent_keys: String,
    /// Granary: verify every Nth sample byte for byte.
    #[arg(long, default_value_t = 16, value_parser = num::<u64>)]
    pub verify_every: u64,
    /// Skip Granary.
    #[arg(long)]
    pub no_granary: bool,
    /// Do not measure Granary at 0 ms next to every other RTT.
    #[arg(long)]
    pub no_pair: bool,
    /// Before each measurement, wait up to S s for a quiet machine (under 0.2 busy cores for 2 s; 0: never).
    #[arg(long, default_value_t = 10.0)]
    pub quiet_wait_s: f64,
    /// Every loader alike: measure a contended window again, up to N times, keeping the least contended.
    #[arg(long, default_value_t = 0, value_parser = num::<u32>)]
    pub retries: u32,
    /// Measure every point N times, the loaders interleaved, and keep the median [default: 1; 3 with --format].
    #[arg(long, value_parser = num::<u32>)]
    pub repeat: Option<u32>,
    /// seaweed, light or both (SeaweedFS first).
    #[arg(long, default_value = "both")]
    pub store: String,
    /// The light store's worker threads.
    #[arg(long, default_value_t = 1, value_parser = num::<u64>)]
    pub light_threads: u64,
    /// Skip the DataLoaders.
    #[arg(long)]
    pub no_dataloader: bool,
    /// Where the plot goes [default: docs/latency.png, the light store's as docs/latency_light.png; `none`: no plot].
    #[arg(long, default_value = "")]
    pub plot: String,
    /// The Python interpreter [default: $PYTHON, else python3].
    #[arg(long, default_value = "")]
    pub python: String,
    /// Instead of the sweep: Granary over shards (webdataset, mds or parquet) against one object per sample, on the light store; goal format_ratio >= 0.9.
    #[arg(long, default_value = "")]
    pub format: String,
    /// With --format: the round-trip time, ms.
    #[arg(long, default_value_t = 100, value_parser = num::<u64>)]
    pub format_rtt_ms: u64,
    /// With --format: shard size, MiB.
    #[arg(long, default_value_t = 64, value_parser = num::<u64>)]
    pub shard_mib: u64,
}

/// Runs the benchmark; prints the result line last.
pub fn run(o: &Options) -> Result<()> {
    let setup = Setup::new(o)?;
    if !o.format.is_empty() {
        return run_format(o, &setup);
    }
    let regime_before = sys::regime();
    println!("latency: {regime_before}");
    println!("latency: CPU {}", cpu_model());
    let t_all = Instant::now();
    let ds = data::ensure(&data::spec(o.files, o.mean_size, 100))
        .map_err(|e| format!("dataset: {e}"))?;
    println!("dataset: {}", ds.describe());
    let rtt_f: Vec<f64> = setup.rtts.iter().map(|&r| r as f64).collect();
    let mut j = Json::bench("latency");
    j.nums("rtt_ms", &rtt_f, 0);
    let mut ingest_s = f64::NAN;
    for which in &setup.stores {
        let (store, keys, ingested) = scenario::start_store(which, &ds, setup.light_threads)?;
        ingest_s = ingested.unwrap_or(ingest_s);
        let result = measure::sweep(&store, &ds, &keys, &setup);
        let _ = std::fs::remove_file(&keys);
        report::summarize(&store, &result?, &setup, &mut j);
    }
    let regime_after = sys::regime();
    println!("after: {regime_after}");
    report::run_fields(&mut j, &setup, &ds, ingest_s);
    j.str("regime_before", &regime_before)
        .str("regime_after", &regime_after)
        .num("total_s", t_all.elapsed().as_secs_f64(), 0);
    let line = j.line();
    if let Some(plot) = &setup.plot {
        draw(&setup, plot, &line);
    }
    println!("{line}");
    Ok(())
}

/// The plots: SeaweedFS's at PATH, the light store's at PATH_light.
fn draw(setup: &Setup, plot: &Path, line: &str) {
    let script = setup.bench_dir.join("latency_plot.py");
    for which in &setup.stores {
        let (out, more): (PathBuf, &[&str]) = if which == "light" {
            let stem = plot
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("latency");
            (
                plot.with_file_name(format!("{stem}_light.png")),
                &["light_"],
            )
        } else {
            (plot.to_path_buf(), &[])
        };
        match draw_with(&setup.python, &script, line, &out, more) {
            Ok(()) => println!("plot: {}", out.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }
}

/// `--format FMT`: shards against one object per sample ([`format`]).
fn run_format(o: &Options, setup: &Setup) -> Result<()> {
    let knobs = &setup.knobs;
    let plan = format::Plan {
        format: format::Format::parse(&o.format)?,
        rtt_ms: o.format_rtt_ms,
        repeat: o.repeat.unwrap_or(3).max(1),
        shard_bytes: o.shard_mib.max(1) << 20,
        warmup: setup.win.warmup,
        window: setup.win.window,
        batch: knobs.batch,
        inflight: knobs.inflight,
        window_batches: knobs.window,
        arena: knobs.arena,
    };
    let before = sys::regime();
    println!("latency --format {}: {before}", o.format);
    let ds = data::ensure(&data::spec(o.files, o.mean_size, 100))
        .map_err(|e| format!("dataset: {e}"))?;
    let mut j = format::run(&ds, &plan)?;
    let after = sys::regime();
    println!("after: {after}");
    j.str("regime_before", &before).str("regime_after", &after);
    println!("{}", j.line());
    Ok(())
}
