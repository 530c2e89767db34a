//! Why the GPU waits: one cause injected at a time (a slow store, a CPU-starved loader, a long GPU step); the share of intervals after warm-up whose verdict names it (goal ≥ 0.95).
//!
//! The benchmark is `granary_bench::why` (`bench/src/why/`); this binary
//! parses its options ([`granary_bench::why::Options`]).

use std::process::ExitCode;

use granary_bench::{cli, why};

fn main() -> ExitCode {
    cli::bench_main("bench/run why", why::run)
}
