//! Cache policies through the real agent: hit rate per epoch for clairvoyant, MinIO and LRU on a dataset twice the arena, next to the simulator's prediction.
//!
//! The benchmark is `granary_bench::policy` (`bench/src/policy/`); this
//! binary parses its options ([`granary_bench::policy::Options`]).

use std::process::ExitCode;

use clap::Parser;
use granary_bench::policy;

/// bench/run policy [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run policy", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    options: policy::Options,
}

fn main() -> ExitCode {
    match policy::run(&Cli::parse().options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy: {e}");
            ExitCode::FAILURE
        }
    }
}
