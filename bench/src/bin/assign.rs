//! Locality-aware assignment: fraction of samples moved per step (p = 2–256 nodes, local batch 32–512) against the law 0.40·√((p−1)/p)/√b.
//!
//! The benchmark is `granary_bench::assign` (`bench/src/assign/`); this
//! binary parses its options ([`granary_bench::assign::Options`]).

use std::process::ExitCode;

use clap::Parser;
use granary_bench::assign;

/// bench/run assign [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run assign", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    options: assign::Options,
}

fn main() -> ExitCode {
    match assign::run(&Cli::parse().options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("assign: {e}");
            ExitCode::FAILURE
        }
    }
}
