//! Cross-process SPSC ring: throughput of 64-byte items (per-item and batched publication) and hand-off latency (spinning and parked), next to a minimal ring that caches the peer's index and a baseline ring that does not.
//!
//! The benchmark is `granary_bench::ring` (`bench/src/ring/`); this binary
//! parses its options ([`granary_bench::ring::Args`]), or runs the peer role
//! when started as the peer.

use std::process::ExitCode;

use clap::Parser;
use granary_bench::{peer, ring};

/// bench/run ring [options]. The JSON line needs both publication modes and
/// the latency runs.
#[derive(Parser, Debug)]
#[command(name = "bench/run ring", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    args: ring::Args,
}

fn main() -> ExitCode {
    let result = match peer::peer_args() {
        Some(args) => ring::run_peer(&args),
        None => ring::run(&Cli::parse().args.options()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring: {e}");
            ExitCode::FAILURE
        }
    }
}
