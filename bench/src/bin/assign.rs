//! Locality-aware assignment: fraction of samples moved per step (p = 2–256 nodes, local batch 32–512) against the law 0.40·√((p−1)/p)/√b.
//!
//! The benchmark is `granary_bench::assign` (`bench/src/assign/`); this
//! binary parses its options ([`granary_bench::assign::Options`]).

use std::process::ExitCode;

use granary_bench::{assign, cli};

fn main() -> ExitCode {
    cli::bench_main("bench/run assign", assign::run)
}
