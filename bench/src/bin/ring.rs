//! Cross-process SPSC ring: throughput of 64-byte items (per-item and batched publication) and hand-off latency (spinning and parked), next to a minimal ring that caches the peer's index and a baseline ring that does not.
//!
//! The benchmark is `granary_bench::ring` (`bench/src/ring/`); this binary
//! parses its options, or runs the peer role when started as the peer.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use granary_bench::cli::num;
use granary_bench::{peer, ring};

/// bench/run ring [options]. The JSON line needs both publication modes and
/// the latency runs.
#[derive(Parser, Debug)]
#[command(name = "bench/run ring", about, long_about = None)]
struct Cli {
    /// Items per throughput run [default: 20000000; 2000000 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    items: Option<u64>,
    /// Repetitions of each throughput case [default: 5; 2 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    reps: Option<usize>,
    /// Items per publication in the batched case [default: 32].
    #[arg(long, value_parser = num::<u64>)]
    batch: Option<u64>,
    /// Consumer pop_into buffer, items [default: 64].
    #[arg(long, value_parser = num::<usize>)]
    pop: Option<usize>,
    /// Ring capacity for throughput, power of two [default: 1024].
    #[arg(long, value_parser = num::<u32>)]
    capacity: Option<u32>,
    /// Ping-pong samples with spinning waits [default: 20000; 2000 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    spin_samples: Option<usize>,
    /// Ping-pong samples with parked waits [default: 5000; 500 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    parked_samples: Option<usize>,
    /// Pause between parked pings, microseconds [default: 100].
    #[arg(long, value_parser = num::<u64>)]
    gap_us: Option<u64>,
    /// Small run for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Throughput for one publication mode.
    #[arg(long, value_parser = ["per-item", "batched"])]
    only: Option<String>,
    /// Skip the hand-off latency measurements.
    #[arg(long)]
    no_latency: bool,
    /// Throughput for these rings only, comma-separated (granary, baseline,
    /// baseline+words, ...; for profiling).
    #[arg(long)]
    kinds: Option<String>,
    /// Also run baseline variants that add what granary's ring does, piece by
    /// piece: +volatile (whole-item volatile copies on both sides), +vwrite /
    /// +vread (one side only), +words (volatile copies one 8-byte word at a
    /// time), +fence (SeqCst fence after each index store), +fence+flag (then
    /// a load from the peer's index cache line), +fence+farflag (a load from
    /// a line the peer never writes), and combinations.
    #[arg(long)]
    attribution: bool,
}

fn main() -> ExitCode {
    let result = match peer::peer_args() {
        Some(args) => ring::run_peer(&args),
        None => {
            let c = Cli::parse();
            let d = ring::Options::defaults(c.quick);
            ring::run(&ring::Options {
                items: c.items.unwrap_or(d.items),
                reps: c.reps.unwrap_or(d.reps),
                batch: c.batch.unwrap_or(d.batch),
                pop: c.pop.unwrap_or(d.pop),
                capacity: c.capacity.unwrap_or(d.capacity),
                spin_samples: c.spin_samples.unwrap_or(d.spin_samples),
                parked_samples: c.parked_samples.unwrap_or(d.parked_samples),
                gap: c.gap_us.map_or(d.gap, Duration::from_micros),
                attribution: c.attribution,
                latency: !c.no_latency,
                publish: c.only.map(|m| m == "batched"),
                kinds: c.kinds.map(|k| k.split(',').map(str::to_owned).collect()),
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring: {e}");
            ExitCode::FAILURE
        }
    }
}
