//! S3 latency: samples/s against the store's round-trip time (0–200 ms, a delay proxy in front of SeaweedFS and of a light S3 store) for Granary, PyTorch DataLoaders doing one boto3 GET per sample (8 and 32 workers), 64 threaded GETs (4 workers × 16) and s3torchconnector.
//!
//! The benchmark is `granary_bench::latency` (`bench/src/latency/`); this
//! binary parses its options ([`granary_bench::latency::Options`]).

use std::process::ExitCode;

use granary_bench::{cli, latency};

fn main() -> ExitCode {
    cli::bench_main("bench/run latency", latency::run)
}
