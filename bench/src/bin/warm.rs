//! Warm cache: a loader touching every byte of every sample served from an arena that holds the whole dataset, against the same samples read one by one in the same shuffled order from a private mapping.
//!
//! The benchmark is `granary_bench::warm` (`bench/src/warm/`); this binary
//! parses its options.

use std::process::ExitCode;

use clap::Parser;
use granary_bench::warm::{self, Options};

/// bench/run warm [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run warm", about, long_about = None)]
struct Cli {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 20_000)]
    files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000)]
    mean_size: u64,
    /// Timed epochs after the warm-up epoch.
    #[arg(long, default_value_t = 5)]
    epochs: u32,
    /// Samples per batch (the client's default).
    #[arg(long, default_value_t = granary::DEFAULT_BATCH_SIZE)]
    batch: u32,
    /// prefetch.window_batches (the agent's default).
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// sessions.ready_ring_capacity.
    #[arg(long, default_value_t = 64)]
    ready: u32,
    /// arena.hugepages: try, off or required; the baseline mapping tries 2 MiB
    /// pages unless off, and as root both are reserved in nr_hugepages.
    #[arg(long, default_value = "try")]
    hugepages: String,
    /// The loader polls try_next_batch instead of blocking.
    #[arg(long)]
    spin: bool,
    /// Also run the tuning configurations; report the best.
    #[arg(long)]
    sweep: bool,
    /// Runs of the main configuration; the median run is reported.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Skip the memory baselines (for profiling the agent alone).
    #[arg(long)]
    no_baseline: bool,
    /// After each run, run it again with the loader-side full CRC check on
    /// (verify_crc; off by default).
    #[arg(long)]
    crc_compare: bool,
    /// After each run, run it again with the loader's wait reports off.
    #[arg(long)]
    wait_compare: bool,
}

fn main() -> ExitCode {
    let c = Cli::parse();
    let o = Options {
        files: c.files,
        mean_size: c.mean_size,
        epochs: c.epochs,
        batch: c.batch,
        window: c.window,
        ready: c.ready,
        hugepages: c.hugepages,
        spin: c.spin,
        sweep: c.sweep,
        reps: c.reps,
        no_baseline: c.no_baseline,
        crc_compare: c.crc_compare,
        wait_compare: c.wait_compare,
    };
    match warm::run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warm: {e}");
            ExitCode::FAILURE
        }
    }
}
