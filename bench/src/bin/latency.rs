//! S3 latency: samples/s against the store's round-trip time (0–200 ms, a delay proxy in front of SeaweedFS and of a light S3 store) for Granary, PyTorch DataLoaders doing one boto3 GET per sample (8 and 32 workers), 64 threaded GETs (4 workers × 16) and s3torchconnector.
//!
//! The benchmark is `granary_bench::latency` (`bench/src/latency/`); this
//! binary parses its options.

use std::process::ExitCode;

use clap::Parser;
use granary_bench::cli::{num, num_list};
use granary_bench::latency::{self, Options};
use granary_bench::stall_loaders::PER_SAMPLE;

/// bench/run latency [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run latency", about, long_about = None)]
struct Cli {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 40_000, value_parser = num::<u64>)]
    files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000, value_parser = num::<u64>)]
    mean_size: u64,
    /// Round-trip times, comma-separated.
    #[arg(long, default_value = "0,2,10,50,100,200")]
    rtt_ms: String,
    /// DataLoader num_workers values.
    #[arg(long, default_value = "8,32")]
    workers: String,
    /// More loaders, run by bench/stall_train.py with no GPU step (`none`: only the DataLoaders).
    #[arg(long, default_value_t = PER_SAMPLE.join(","))]
    contenders: String,
    /// Samples per batch, both loaders.
    #[arg(long, default_value_t = 32, value_parser = num::<u32>)]
    batch: u32,
    /// Ramp-up skipped before each window, seconds.
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// Length of each window, seconds.
    #[arg(long, default_value_t = 12.0)]
    window_s: f64,
    /// Granary: prefetch.max_inflight_reads, each value measured, the first the main column.
    #[arg(long, default_value = "1024")]
    inflight: String,
    /// Granary: prefetch.window_batches.
    #[arg(long, default_value_t = 64, value_parser = num::<u32>)]
    window: u32,
    /// Granary: prefetch.initial_window (the agent's default).
    #[arg(long, default_value_t = 2, value_parser = num::<u32>)]
    initial_window: u32,
    /// Granary: arena.size [default: max(1 GiB, largest inflight × 1 MiB)].
    #[arg(long, value_parser = num::<u64>)]
    arena: Option<u64>,
    /// Granary: sessions.ready_ring_capacity.
    #[arg(long, default_value_t = 128, value_parser = num::<u32>)]
    ready: u32,
    /// Granary: more keys, `section.key=value;...` (`dataset.key=value` goes into [[dataset]]).
    #[arg(long, default_value = "")]
    agent_keys: String,
    /// Granary: verify every Nth sample byte for byte.
    #[arg(long, default_value_t = 16, value_parser = num::<u64>)]
    verify_every: u64,
    /// Skip Granary.
    #[arg(long)]
    no_granary: bool,
    /// Do not measure Granary at 0 ms next to every other RTT.
    #[arg(long)]
    no_pair: bool,
    /// Before each measurement, wait up to S s for a quiet machine (under 0.2 busy cores for 2 s; 0: never).
    #[arg(long, default_value_t = 10.0)]
    quiet_wait_s: f64,
    /// Every loader alike: measure a contended window again, up to N times, keeping the least contended.
    #[arg(long, default_value_t = 0, value_parser = num::<u32>)]
    retries: u32,
    /// Measure every point N times, the loaders interleaved, and keep the median [default: 1; 3 with --format].
    #[arg(long, value_parser = num::<u32>)]
    repeat: Option<u32>,
    /// seaweed, light or both (SeaweedFS first).
    #[arg(long, default_value = "both")]
    store: String,
    /// The light store's worker threads.
    #[arg(long, default_value_t = 1, value_parser = num::<u64>)]
    light_threads: u64,
    /// Skip the DataLoaders.
    #[arg(long)]
    no_dataloader: bool,
    /// Where the plot goes [default: docs/latency.png, the light store's as docs/latency_light.png; `none`: no plot].
    #[arg(long, default_value = "")]
    plot: String,
    /// The Python interpreter [default: $PYTHON, else python3].
    #[arg(long, default_value = "")]
    python: String,
    /// Instead of the sweep: Granary over shards (webdataset, mds or parquet) against one object per sample, on the light store; goal format_ratio >= 0.9.
    #[arg(long, default_value = "")]
    format: String,
    /// With --format: the round-trip time, ms.
    #[arg(long, default_value_t = 100, value_parser = num::<u64>)]
    format_rtt_ms: u64,
    /// With --format: shard size, MiB.
    #[arg(long, default_value_t = 64, value_parser = num::<u64>)]
    shard_mib: u64,
}

fn options(c: Cli) -> Result<Options, String> {
    Ok(Options {
        rtt_ms: num_list(&c.rtt_ms).map_err(|e| format!("--rtt-ms: {e}"))?,
        workers: num_list(&c.workers).map_err(|e| format!("--workers: {e}"))?,
        inflight: num_list(&c.inflight).map_err(|e| format!("--inflight: {e}"))?,
        files: c.files,
        mean_size: c.mean_size,
        contenders: c.contenders,
        batch: c.batch,
        warmup_s: c.warmup_s,
        window_s: c.window_s,
        window: c.window,
        initial_window: c.initial_window,
        arena: c.arena,
        ready: c.ready,
        agent_keys: c.agent_keys,
        verify_every: c.verify_every,
        no_granary: c.no_granary,
        no_pair: c.no_pair,
        quiet_wait_s: c.quiet_wait_s,
        retries: c.retries,
        repeat: c.repeat,
        store: c.store,
        light_threads: c.light_threads,
        no_dataloader: c.no_dataloader,
        plot: c.plot,
        python: c.python,
        format: c.format,
        format_rtt_ms: c.format_rtt_ms,
        shard_mib: c.shard_mib,
    })
}

fn main() -> ExitCode {
    match options(Cli::parse()).and_then(|o| latency::run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency: {e}");
            ExitCode::FAILURE
        }
    }
}
