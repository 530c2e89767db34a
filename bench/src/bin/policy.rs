//! Cache policies through the real agent: hit rate per epoch for clairvoyant, MinIO and LRU on a dataset twice the arena, next to the simulator's prediction.
//!
//! The benchmark is `granary_bench::policy` (`bench/src/policy/`); this
//! binary parses its options ([`granary_bench::policy::Options`]).

use std::process::ExitCode;

use granary_bench::{cli, policy};

fn main() -> ExitCode {
    cli::bench_main("bench/run policy", policy::run)
}
