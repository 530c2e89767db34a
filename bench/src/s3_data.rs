//! A synthetic dataset in SeaweedFS for the S3 benchmarks (`latency`,
//! `stall`): the upload, the wait for the store to go idle after it, and the
//! list of keys the Python loaders read.

use crate::data::Dataset;
use crate::seaweed::Seaweed;
use crate::sys::process_cpu;
use granary_tools::ingest::{self, IngestOptions, Phase};
use granary_tools::progress::ProgressBar;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Uploads the dataset into the server's bucket under `prefix` (32
/// uploads in flight) and reads every object back; returns the seconds the
/// upload took.
pub fn upload(weed: &Seaweed, ds: &Dataset, prefix: &str) -> Result<f64, String> {
    let mut opts = IngestOptions::new(&ds.spec.root, weed.settings(), prefix);
    opts.concurrency = 32;
    // Reading every object back checks the upload and leaves the store's
    // caches (filer metadata, volume files in the page cache) in the same
    // state for every point, the first one included.
    opts.verify = true;
    let mut bar = ProgressBar::new(&format!("ingest s3://{}/{prefix}", weed.bucket()), ds.len());
    let report = ingest::ingest(&opts, |phase, done, _, bytes| {
        if phase == Phase::Upload {
            bar.update(done, bytes);
        }
    })
    .map_err(|e| format!("ingest: {e}"))?;
    bar.finish(report.files, report.bytes);
    let s = report.upload_time.as_secs_f64();
    println!(
        "ingest: {} objects, {:.3} GB in {:.1} s ({:.0} MB/s); all read back and compared in {:.1} s",
        report.uploaded,
        report.uploaded_bytes as f64 / 1e9,
        s,
        report.uploaded_bytes as f64 / 1e6 / s.max(1e-9),
        report.verify_time.as_secs_f64()
    );
    if report.verified != ds.len() {
        return Err(format!(
            "{} of {} objects verified",
            report.verified,
            ds.len()
        ));
    }
    Ok(s)
}

/// Waits until SeaweedFS is idle (under 5 % of a core over half a second)
/// after the ingest, at most 30 s; returns how long that took.
pub fn settle(weed: &Seaweed) -> Duration {
    let t = Instant::now();
    let Some(pid) = weed.pid() else {
        return Duration::ZERO;
    };
    let step = Duration::from_millis(500);
    let mut last = process_cpu(pid);
    while t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(step);
        let now = process_cpu(pid);
        if now.saturating_sub(last).as_secs_f64() < 0.05 * step.as_secs_f64() {
            break;
        }
        last = now;
    }
    t.elapsed()
}

/// The keys and sizes of the samples, `key<TAB>size` per line, in a file
/// (`keys.tsv` in the server's directory) for the Python loaders.
pub fn write_keys(weed: &Seaweed, ds: &Dataset, prefix: &str) -> Result<PathBuf, String> {
    let path = weed.dir().join("keys.tsv");
    write_keys_at(&path, ds, prefix)?;
    Ok(path)
}

/// The same list at `path` (for a store without a directory of its own).
pub fn write_keys_at(path: &Path, ds: &Dataset, prefix: &str) -> Result<(), String> {
    let mut text = String::new();
    for e in ds.catalog.entries() {
        let rel = e
            .path
            .strip_prefix(&ds.spec.root)
            .map_err(|_| format!("{} is outside the dataset", e.path.display()))?;
        let rel = rel
            .to_str()
            .ok_or_else(|| format!("{}: not UTF-8", rel.display()))?;
        let _ = writeln!(text, "{prefix}/{rel}\t{}", e.size);
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every file of the dataset once (so that a store serving the
/// folder finds it in the page cache); returns the bytes read.
pub fn read_all(ds: &Dataset) -> Result<u64, String> {
    let mut bytes = 0u64;
    for e in ds.catalog.entries() {
        let b = std::fs::read(&e.path).map_err(|err| format!("{}: {err}", e.path.display()))?;
        bytes += b.len() as u64;
    }
    Ok(bytes)
}
