//! Warm cache: a loader touching every byte of every sample served from an arena that holds the whole dataset, against the same samples read one by one in the same shuffled order from a private mapping.
//!
//! The benchmark is `granary_bench::warm` (`bench/src/warm/`); this binary
//! parses its options ([`granary_bench::warm::Options`]).

use std::process::ExitCode;

use granary_bench::{cli, warm};

fn main() -> ExitCode {
    cli::bench_main("bench/run warm", warm::run)
}
