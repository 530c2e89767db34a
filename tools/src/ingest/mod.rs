//! `granary ingest`: moves a local dataset folder into an S3 bucket
//! ([`s3`]) or into CQL tables ([`cql`]).
//!
//! Both ingests do the same thing around their store, and that is this
//! module:
//!
//! * the folder is walked exactly as the filesystem source catalogs it
//!   ([`Catalog::from_dir`]: class folders, hidden names skipped, links
//!   followed), so the store's catalog of what was ingested gives the same
//!   samples, labels and sizes in the same order;
//! * `resume`: the store says first which files it already holds as they
//!   are; those are skipped (and counted);
//! * the files are written concurrently on a tokio runtime, at most
//!   `concurrency` at a time, each write retried by the store like a read;
//! * `verify`: afterwards every file is read back and compared byte for
//!   byte (after any check of the store's own, such as metadata rows);
//! * progress is reported as files finish ([`Phase`]), and every failure
//!   is collected: the pass fails if any file failed, naming the first ones
//!   ([`IngestError::Failed`]).
//!
//! What a store does (its names for files, how it writes, lists and reads
//! back) is the `Target` each ingest implements.

pub mod cql;
pub mod mds;
pub mod parquet;
pub mod retry;
pub mod s3;
pub mod shards;

pub use s3::{ingest, parse_s3_url, parse_store_url, IngestOptions};

use granary_agent::source::Catalog;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Failures named in an [`IngestError::Failed`] message.
const FAILURES_SHOWN: usize = 10;

/// Which pass a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Uploading (skipped files count as done).
    Upload,
    /// Reading back and comparing.
    Verify,
}

/// What an ingest did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestReport {
    /// Files in the folder.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files uploaded.
    pub uploaded: u64,
    /// Bytes uploaded.
    pub uploaded_bytes: u64,
    /// Files skipped because the store already held them as they are.
    pub skipped: u64,
    /// Files read back and found equal to their file.
    pub verified: u64,
    /// Time for the upload pass.
    pub upload_time: Duration,
    /// Time for the verification pass.
    pub verify_time: Duration,
}

/// Why an ingest failed.
#[derive(Debug)]
pub enum IngestError {
    /// The folder could not be walked, or a name is not valid in the store.
    Source(String),
    /// The settings are wrong, or the store cannot be reached, set up or
    /// listed.
    Setup(String),
    /// Some files failed to upload or to verify.
    Failed {
        /// The pass that failed.
        phase: Phase,
        /// How many files failed.
        count: usize,
        /// Of how many.
        of: usize,
        /// The first failures, one line each.
        first: Vec<String>,
    },
}

impl fmt::Display for IngestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IngestError::Source(m) | IngestError::Setup(m) => f.write_str(m),
            IngestError::Failed {
                phase,
                count,
                of,
                first,
            } => {
                let what = match phase {
                    Phase::Upload => "upload",
                    Phase::Verify => "verification",
                };
                write!(f, "{what} failed for {count} of {of} files:")?;
                for l in first {
                    write!(f, "\n  {l}")?;
                }
                if *count > first.len() {
                    write!(f, "\n  … and {} more", count - first.len())?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for IngestError {}

/// One file of a dataset folder, in catalog order.
pub(crate) struct SourceFile {
    /// The file.
    pub(crate) file: PathBuf,
    /// Its path below the folder, components joined by `/`.
    pub(crate) rel: String,
    /// Its label in the folder's catalog.
    pub(crate) label: i32,
    /// Its size when the folder was walked.
    pub(crate) size: u64,
}

/// The files of `src`, walked as [`Catalog::from_dir`] catalogs them (in
/// its order), with their relative paths, which must be UTF-8 (`what` says
/// what a path becomes, for the message).
pub(crate) fn walk(src: &Path, what: &str) -> Result<Vec<SourceFile>, IngestError> {
    let catalog = Catalog::from_dir(src).map_err(|e| IngestError::Source(e.to_string()))?;
    let mut files = Vec::with_capacity(catalog.len());
    for e in catalog.entries() {
        let rel = e.path.strip_prefix(src).map_err(|_| {
            IngestError::Source(format!("{} is outside {}", e.path.display(), src.display()))
        })?;
        let mut parts = Vec::new();
        for c in rel.components() {
            let s = c.as_os_str().to_str().ok_or_else(|| {
                IngestError::Source(format!(
                    "{}: the name is not UTF-8, which {what} must be",
                    e.path.display()
                ))
            })?;
            parts.push(s);
        }
        files.push(SourceFile {
            file: e.path.clone(),
            rel: parts.join("/"),
            label: e.label,
            size: e.size,
        });
    }
    Ok(files)
}

/// One file to move, under the name its store gives it.
pub(crate) struct Item<K> {
    /// The file.
    pub(crate) file: PathBuf,
    /// Its name in the store: an object key, a row id.
    pub(crate) key: K,
    /// Its label in the folder's catalog.
    pub(crate) label: i32,
    /// Its size when the folder was walked.
    pub(crate) size: u64,
}

impl<K> Item<K> {
    /// The file's bytes.
    pub(crate) fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.file).map_err(|e| format!("{}: {e}", self.file.display()))
    }

    /// The file's bytes, which must be as many as when the folder was
    /// walked.
    pub(crate) fn read(&self) -> Result<Vec<u8>, String> {
        let data = self.bytes()?;
        if data.len() as u64 != self.size {
            return Err(format!(
                "{}: size changed while ingesting ({} bytes, then {})",
                self.file.display(),
                self.size,
                data.len()
            ));
        }
        Ok(data)
    }

    /// Compares `remote`, read back from `url`, with `local`, the file's
    /// bytes.
    pub(crate) fn compare(&self, url: &str, remote: &[u8], local: &[u8]) -> Result<(), String> {
        if remote.len() != local.len() {
            return Err(format!(
                "{url}: {} bytes, but {} has {}",
                remote.len(),
                self.file.display(),
                local.len()
            ));
        }
        if let Some(at) = remote.iter().zip(local).position(|(a, b)| a != b) {
            return Err(format!(
                "{url}: differs from {} at byte {at}",
                self.file.display()
            ));
        }
        Ok(())
    }
}

/// The items of an ingest as its tasks share them.
pub(crate) type Items<K> = [Arc<Item<K>>];

/// What an ingest does that depends on its store; [`drive`] does the rest.
/// A target is cloned into every task.
/// One file's write or read-back, spawned on the runtime; its error is one
/// line naming the file.
pub(crate) trait Step: Future<Output = Result<(), String>> + Send + 'static {}

impl<F: Future<Output = Result<(), String>> + Send + 'static> Step for F {}

pub(crate) trait Target: Clone + Send + Sync + 'static {
    /// How the store names a file.
    type Key: Send + Sync + 'static;

    /// For `resume`, before the upload pass: for each item, whether the
    /// store already holds it as it is.
    async fn stored(&self, items: &Items<Self::Key>) -> Result<Vec<bool>, IngestError>;

    /// Writes one item (`seed` spreads its retries); the error is one line
    /// naming the file and where it was going.
    fn write(&self, item: Arc<Item<Self::Key>>, seed: u64) -> impl Step;

    /// Before the verification reads: the items that fail already (index in
    /// `items`, message), in the order of `items`. None by default.
    async fn check(&self, items: &Items<Self::Key>) -> Result<Vec<(usize, String)>, IngestError> {
        let _ = items;
        Ok(Vec::new())
    }

    /// Reads one item back and compares it with its file.
    fn verify(&self, item: Arc<Item<Self::Key>>, seed: u64) -> impl Step;
}

/// Moves `items` into `target` — skipping what it holds already when
/// `resume`, reading everything back when `verify` — with at most
/// `concurrency` files in flight; `progress(phase, files done, files in
/// all, bytes done)` is called as files finish. Runs on a tokio runtime
/// (the tasks are spawned on it).
pub(crate) async fn drive<T: Target>(
    target: &T,
    items: Vec<Item<T::Key>>,
    concurrency: usize,
    resume: bool,
    verify: bool,
    mut progress: impl FnMut(Phase, u64, u64, u64),
) -> Result<IngestReport, IngestError> {
    let concurrency = concurrency.max(1);
    let files = items.len() as u64;
    let mut report = IngestReport {
        files,
        bytes: items.iter().map(|i| i.size).sum(),
        uploaded: 0,
        uploaded_bytes: 0,
        skipped: 0,
        verified: 0,
        upload_time: Duration::ZERO,
        verify_time: Duration::ZERO,
    };
    let items: Vec<Arc<Item<T::Key>>> = items.into_iter().map(Arc::new).collect();

    // Upload pass.
    let t0 = Instant::now();
    let stored = if resume {
        target.stored(&items).await?
    } else {
        vec![false; items.len()]
    };
    let (mut done, mut done_bytes) = (0u64, 0u64);
    let mut todo = Vec::new();
    for (it, there) in items.iter().zip(stored) {
        if there {
            report.skipped += 1;
            done += 1;
            done_bytes += it.size;
        } else {
            todo.push(it.clone());
        }
    }
    progress(Phase::Upload, done, files, done_bytes);
    let write = |it, seed| target.write(it, seed);
    let failures = run_bounded(&todo, concurrency, write, |ok, it| {
        if ok {
            report.uploaded += 1;
            report.uploaded_bytes += it.size;
        }
        done += 1;
        done_bytes += it.size;
        progress(Phase::Upload, done, files, done_bytes);
    })
    .await;
    report.upload_time = t0.elapsed();
    if !failures.is_empty() {
        return Err(failed(Phase::Upload, failures, items.len()));
    }

    // Verification pass.
    if verify {
        let t1 = Instant::now();
        progress(Phase::Verify, 0, files, 0);
        let mut failures = target.check(&items).await?;
        let (mut done, mut done_bytes) = (0u64, 0u64);
        let mut to_read = Vec::new();
        let mut index = Vec::new();
        let mut failing = failures.iter().map(|f| f.0).peekable();
        for (i, it) in items.iter().enumerate() {
            if failing.next_if_eq(&i).is_some() {
                done += 1;
                done_bytes += it.size;
            } else {
                to_read.push(it.clone());
                index.push(i);
            }
        }
        let read = |it, seed| target.verify(it, seed);
        let more = run_bounded(&to_read, concurrency, read, |ok, it| {
            if ok {
                report.verified += 1;
            }
            done += 1;
            done_bytes += it.size;
            progress(Phase::Verify, done, files, done_bytes);
        })
        .await;
        failures.extend(
            more.into_iter()
                .map(|(i, m)| (index.get(i).copied().unwrap_or(i), m)),
        );
        report.verify_time = t1.elapsed();
        if !failures.is_empty() {
            return Err(failed(Phase::Verify, failures, items.len()));
        }
    }
    Ok(report)
}

/// The error of a pass with `failures` (index, message) among `of` files:
/// the count and the first few, in index order.
fn failed(phase: Phase, mut failures: Vec<(usize, String)>, of: usize) -> IngestError {
    failures.sort();
    let count = failures.len();
    IngestError::Failed {
        phase,
        count,
        of,
        first: failures
            .into_iter()
            .take(FAILURES_SHOWN)
            .map(|(_, m)| m)
            .collect(),
    }
}

/// Runs `job(item, index)` over `items` with at most `concurrency` at once,
/// each a task on the current runtime; `on_done` is called here as each
/// finishes. Returns the failures (index in `items`, message).
async fn run_bounded<T, Fut>(
    items: &[Arc<T>],
    concurrency: usize,
    job: impl Fn(Arc<T>, u64) -> Fut,
    mut on_done: impl FnMut(bool, &T),
) -> Vec<(usize, String)>
where
    Fut: Step,
{
    let mut set: JoinSet<(usize, Result<(), String>)> = JoinSet::new();
    let mut failures = Vec::new();
    let mut next = 0usize;
    loop {
        while set.len() < concurrency && next < items.len() {
            let i = next;
            let fut = job(items[i].clone(), i as u64);
            set.spawn(async move { (i, fut.await) });
            next += 1;
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (i, r) = match joined {
            Ok(v) => v,
            Err(e) => {
                failures.push((usize::MAX, format!("a task failed: {e}")));
                continue;
            }
        };
        let ok = r.is_ok();
        if let Err(m) = r {
            failures.push((i, m));
        }
        on_done(ok, &items[i]);
    }
    failures
}

/// 90 synthetic files (3 classes, about 4 kB each) under a temporary
/// directory, written by `write` into its folder `name` in shards of at
/// most 64 KiB (at least 4 of them): where each format's round-trip test
/// starts. Returns the directory, the files' spec, the folder and what was
/// written.
#[cfg(test)]
pub(crate) fn ninety_files_written(
    name: &str,
    write: fn(&Path, &Path, u64) -> std::io::Result<shards::ShardsWritten>,
) -> (
    tempfile::TempDir,
    crate::synth::SynthSpec,
    PathBuf,
    shards::ShardsWritten,
) {
    let d = tempfile::tempdir().unwrap();
    let mut spec = crate::synth::SynthSpec::new(d.path().join("src"));
    (spec.num_files, spec.num_classes, spec.mean_size) = (90, 3, 4_000);
    crate::synth::generate(&spec, |_, _| {}).unwrap();
    let out = d.path().join(name);
    let w = write(&spec.root, &out, 64 * 1024).unwrap();
    assert_eq!(w.samples, 90);
    assert!(w.shards.len() >= 4, "{name}: {} shards", w.shards.len());
    (d, spec, out, w)
}

/// A format's indexer (`root`, `sample_field`, `label_field`), as the agent
/// has one per format.
#[cfg(test)]
type IndexFn = fn(
    &Path,
    &str,
    &str,
) -> Result<
    (Catalog, granary_agent::source::shards::IndexStats),
    granary_agent::source::CatalogError,
>;

/// A format's index of the files [`ninety_files_written`] wrote from
/// `root` into `out` (`w`), read back through `index`: the files in
/// catalog order, with their labels, sizes and bytes, from as many shards
/// as were written; and with the `key` column as the sample, file
/// `key_of`'s path below `root`.
#[cfg(test)]
pub(crate) fn assert_indexed_in_order(
    root: &Path,
    out: &Path,
    w: &shards::ShardsWritten,
    index: IndexFn,
    key_of: usize,
) {
    let files = Catalog::from_dir(root).unwrap();
    let (samples, stats) = index(out, "sample", "label").unwrap();
    assert_eq!(samples.len(), files.len());
    assert_eq!(stats.shards, w.shards.len() as u64);
    for (f, s) in files.entries().iter().zip(samples.entries()) {
        assert_eq!(f.label, s.label);
        assert_eq!(s.size, f.size);
        let bytes = samples.read_sample(s.sample_id).unwrap();
        assert_eq!(bytes, std::fs::read(&f.path).unwrap());
    }
    let (keys, _) = index(out, "key", "label").unwrap();
    let rel = files.entries()[key_of].path.strip_prefix(root).unwrap();
    assert_eq!(
        keys.read_sample(key_of as u64).unwrap(),
        rel.to_str().unwrap().as_bytes()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// A store that holds `stored`, fails the writes of `bad_write`, the
    /// check of `bad_check` and the read-back of `bad_read`, and records
    /// what was written.
    #[derive(Clone, Default)]
    struct Fake {
        stored: Arc<HashSet<u32>>,
        bad_write: Arc<HashSet<u32>>,
        bad_check: Arc<HashSet<u32>>,
        bad_read: Arc<HashSet<u32>>,
        written: Arc<Mutex<Vec<u32>>>,
    }

    impl Target for Fake {
        type Key = u32;

        async fn stored(&self, items: &Items<u32>) -> Result<Vec<bool>, IngestError> {
            Ok(items.iter().map(|i| self.stored.contains(&i.key)).collect())
        }

        fn write(&self, item: Arc<Item<u32>>, _: u64) -> impl Step {
            let f = self.clone();
            async move {
                if f.bad_write.contains(&item.key) {
                    return Err(format!("write {}", item.key));
                }
                f.written.lock().unwrap().push(item.key);
                Ok(())
            }
        }

        async fn check(&self, items: &Items<u32>) -> Result<Vec<(usize, String)>, IngestError> {
            Ok(items
                .iter()
                .enumerate()
                .filter(|(_, it)| self.bad_check.contains(&it.key))
                .map(|(i, it)| (i, format!("check {}", it.key)))
                .collect())
        }

        fn verify(&self, item: Arc<Item<u32>>, _: u64) -> impl Step {
            let bad = self.bad_read.contains(&item.key);
            async move {
                tokio::task::yield_now().await;
                match bad {
                    true => Err(format!("read {}", item.key)),
                    false => Ok(()),
                }
            }
        }
    }

    fn items(n: u32) -> Vec<Item<u32>> {
        (0..n)
            .map(|k| Item {
                file: format!("f{k}").into(),
                key: k,
                label: 0,
                size: 10 + u64::from(k),
            })
            .collect()
    }

    type Reports = Vec<(Phase, u64, u64, u64)>;

    fn run(
        fake: &Fake,
        n: u32,
        resume: bool,
        verify: bool,
    ) -> (Result<IngestReport, IngestError>, Reports) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut seen = Vec::new();
        let r = rt.block_on(drive(fake, items(n), 3, resume, verify, |p, d, f, b| {
            seen.push((p, d, f, b))
        }));
        (r, seen)
    }

    fn set(keys: impl IntoIterator<Item = u32>) -> Arc<HashSet<u32>> {
        Arc::new(keys.into_iter().collect())
    }

    #[test]
    fn resume_skips_what_is_stored_and_verify_reads_everything() {
        let fake = Fake {
            stored: set([1, 4]),
            ..Fake::default()
        };
        let (r, seen) = run(&fake, 6, true, true);
        let r = r.unwrap();
        let total: u64 = (0..6).map(|k| 10 + k).sum();
        assert_eq!((r.files, r.bytes, r.skipped), (6, total, 2));
        assert_eq!(
            (r.uploaded, r.uploaded_bytes, r.verified),
            (4, total - 11 - 14, 6)
        );
        let mut written = fake.written.lock().unwrap().clone();
        written.sort();
        assert_eq!(written, [0, 2, 3, 5]);
        // The skipped files count as done at once; each pass ends complete.
        assert_eq!(seen[0], (Phase::Upload, 2, 6, 25));
        assert!(seen.contains(&(Phase::Upload, 6, 6, total)));
        assert_eq!(seen.last(), Some(&(Phase::Verify, 6, 6, total)));
        // Without resume everything is written, and nothing is read back
        // without verify.
        let (r, seen) = run(&fake, 6, false, false);
        let r = r.unwrap();
        assert_eq!((r.skipped, r.uploaded, r.verified), (0, 6, 0));
        assert!(seen.iter().all(|s| s.0 == Phase::Upload));
    }

    #[test]
    fn failures_are_collected_and_named_in_catalog_order() {
        let fake = Fake {
            bad_write: set([7, 2]),
            ..Fake::default()
        };
        let e = run(&fake, 9, false, true).0.unwrap_err();
        let IngestError::Failed {
            phase,
            count,
            of,
            first,
        } = &e
        else {
            panic!("{e}")
        };
        assert_eq!((*phase, *count, *of), (Phase::Upload, 2, 9));
        assert_eq!(first, &["write 2", "write 7"]);
        assert_eq!(fake.written.lock().unwrap().len(), 7);

        // Failed checks and failed reads together, in catalog order; the
        // files that failed the check are not read back.
        let fake = Fake {
            bad_check: set([5, 1]),
            bad_read: set([0, 3, 1]),
            ..Fake::default()
        };
        let e = run(&fake, 6, false, true).0.unwrap_err();
        let IngestError::Failed { phase, first, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(*phase, Phase::Verify);
        assert_eq!(first, &["read 0", "check 1", "read 3", "check 5"]);

        // More failures than are named.
        let fake = Fake {
            bad_write: set(0..25),
            ..Fake::default()
        };
        let e = run(&fake, 30, false, false).0.unwrap_err().to_string();
        assert!(e.starts_with("upload failed for 25 of 30 files:"), "{e}");
        assert!(e.contains("write 9") && !e.contains("write 10"), "{e}");
        assert!(e.ends_with("… and 15 more"), "{e}");
    }
}
