//! Why the GPU waits: one cause injected at a time (a slow store, a CPU-starved loader, a long GPU step); the share of intervals after warm-up whose verdict names it (goal ≥ 0.95).
//!
//! The benchmark is `granary_bench::why` (`bench/src/why/`); this binary
//! parses its options ([`granary_bench::why::Options`]).

use std::process::ExitCode;

use clap::Parser;
use granary_bench::why;

/// bench/run why [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run why", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    options: why::Options,
}

fn main() -> ExitCode {
    match why::run(&Cli::parse().options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("why: {e}");
            ExitCode::FAILURE
        }
    }
}
