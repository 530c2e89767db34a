//! Cold cache: the first epoch through the agent after dropping the page cache, against equal-depth readers of the same files (a minimal io_uring whole-file reader, buffered and O_DIRECT, and fio).
//!
//! The benchmark is `granary_bench::cold` (`bench/src/cold/`); this binary
//! parses its options ([`granary_bench::cold::Options`]).

use std::process::ExitCode;

use granary_bench::{cli, cold};

fn main() -> ExitCode {
    cli::bench_main("bench/run cold", cold::run)
}
