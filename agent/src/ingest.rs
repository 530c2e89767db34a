//! `granary ingest`: moves a local dataset folder into an S3 bucket (this
//! module) or into CQL tables ([`cql`]).
//!
//! The folder is walked exactly as the filesystem source catalogs it
//! ([`Catalog::from_dir`]: class folders, hidden names skipped, links
//! followed), and file `root/REL` becomes object `prefix/REL`, so the S3
//! catalog of `prefix` ([`crate::source::s3::S3Catalog::list`]) gives the
//! same samples with the same ids, labels and sizes.
//!
//! * Uploads run concurrently on a tokio runtime, at most `concurrency` at
//!   a time, each a single PUT retried like a sample GET (timeouts,
//!   connection errors and 5xx, with backoff and jitter).
//! * `resume`: one listing of the prefix first; files whose object already
//!   exists with the same size are skipped (and counted).
//! * `verify`: after the uploads, every object is read back and compared
//!   byte for byte with its file.
//! * Every failure is collected; the run fails if any file failed, naming
//!   the first ones.

pub mod cql;

use crate::source::s3::{classify, with_retries, S3Settings};
use crate::source::Catalog;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore, PutOptions, PutPayload};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Failures named in an [`IngestError::Failed`] message.
pub(crate) const FAILURES_SHOWN: usize = 10;

/// What to ingest, where, how.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// The dataset folder.
    pub src: PathBuf,
    /// Connection settings (the bucket included).
    pub settings: S3Settings,
    /// Key prefix the folder's files go under (`""`: the bucket root).
    pub prefix: String,
    /// Uploads (and verification reads) in flight at once.
    pub concurrency: usize,
    /// Read every object back and compare it with its file.
    pub verify: bool,
    /// Skip files whose object already exists with the same size.
    pub resume: bool,
}

impl IngestOptions {
    /// Options with 32 uploads in flight, no verification, no resume.
    pub fn new(src: impl Into<PathBuf>, settings: S3Settings, prefix: &str) -> IngestOptions {
        IngestOptions {
            src: src.into(),
            settings,
            prefix: prefix.trim_matches('/').to_owned(),
            concurrency: 32,
            verify: false,
            resume: false,
        }
    }
}

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
    /// Files skipped because their object already existed with the same size.
    pub skipped: u64,
    /// Objects read back and found equal to their file.
    pub verified: u64,
    /// Time for the upload pass.
    pub upload_time: Duration,
    /// Time for the verification pass.
    pub verify_time: Duration,
}

/// Why an ingest failed.
#[derive(Debug)]
pub enum IngestError {
    /// The folder could not be walked, or a name is not valid in a key.
    Source(String),
    /// The settings are wrong or the bucket cannot be listed.
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

/// Splits `s3://bucket/prefix` into bucket and prefix (without slashes at
/// either end; empty for the bucket root).
pub fn parse_s3_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url:?} is not an s3://BUCKET/PREFIX URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url:?} names no bucket"));
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

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

/// One file to move.
struct Item {
    file: PathBuf,
    key: ObjectPath,
    size: u64,
}

/// The files of `src` and their keys under `prefix`, in catalog order.
fn plan(src: &Path, prefix: &str) -> Result<Vec<Item>, IngestError> {
    let mut items = Vec::new();
    for f in walk(src, "an S3 key")? {
        let full = if prefix.is_empty() {
            f.rel
        } else {
            format!("{prefix}/{}", f.rel)
        };
        let key = ObjectPath::parse(&full).map_err(|err| {
            IngestError::Source(format!("{}: cannot be an S3 key: {err}", f.file.display()))
        })?;
        items.push(Item {
            file: f.file,
            key,
            size: f.size,
        });
    }
    Ok(items)
}

/// Uploads `opts.src` to `s3://bucket/prefix`; `progress(phase, files done,
/// files in all, bytes done)` is called as files finish. See the module docs.
pub fn ingest(
    opts: &IngestOptions,
    mut progress: impl FnMut(Phase, u64, u64, u64),
) -> Result<IngestReport, IngestError> {
    let items = plan(&opts.src, &opts.prefix)?;
    let store = opts
        .settings
        .build_store()
        .map_err(|e| IngestError::Setup(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("granary-ingest")
        .enable_all()
        .build()
        .map_err(|e| IngestError::Setup(format!("starting the runtime: {e}")))?;
    let concurrency = opts.concurrency.max(1);
    let settings = &opts.settings;
    runtime.block_on(async {
        let files = items.len() as u64;
        let bytes: u64 = items.iter().map(|i| i.size).sum();
        let mut report = IngestReport {
            files,
            bytes,
            uploaded: 0,
            uploaded_bytes: 0,
            skipped: 0,
            verified: 0,
            upload_time: Duration::ZERO,
            verify_time: Duration::ZERO,
        };
        let items: Vec<Arc<Item>> = items.into_iter().map(Arc::new).collect();

        // Upload pass.
        let t0 = Instant::now();
        let existing = if opts.resume {
            list_sizes(&*store, settings, &opts.prefix).await?
        } else {
            HashMap::new()
        };
        let mut todo = Vec::new();
        let (mut done, mut done_bytes) = (0u64, 0u64);
        for it in &items {
            if existing.get(it.key.as_ref()) == Some(&it.size) {
                report.skipped += 1;
                done += 1;
                done_bytes += it.size;
            } else {
                todo.push(it.clone());
            }
        }
        progress(Phase::Upload, done, files, done_bytes);
        let failures = run_bounded(todo, concurrency, &store, settings, upload, |ok, it| {
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
        if opts.verify {
            let t1 = Instant::now();
            let (mut done, mut done_bytes) = (0u64, 0u64);
            progress(Phase::Verify, 0, files, 0);
            let failures = run_bounded(
                items.clone(),
                concurrency,
                &store,
                settings,
                verify,
                |ok, it| {
                    if ok {
                        report.verified += 1;
                    }
                    done += 1;
                    done_bytes += it.size;
                    progress(Phase::Verify, done, files, done_bytes);
                },
            )
            .await;
            report.verify_time = t1.elapsed();
            if !failures.is_empty() {
                return Err(failed(Phase::Verify, failures, items.len()));
            }
        }
        Ok(report)
    })
}

pub(crate) fn failed(phase: Phase, mut failures: Vec<(usize, String)>, of: usize) -> IngestError {
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

/// Sizes of the objects under `prefix`, by key.
async fn list_sizes(
    store: &dyn ObjectStore,
    settings: &S3Settings,
    prefix: &str,
) -> Result<HashMap<String, u64>, IngestError> {
    let folder = ObjectPath::from(prefix);
    let arg = (!prefix.is_empty()).then_some(&folder);
    with_retries(settings.retry_policy(), 0, || async {
        let mut out = HashMap::new();
        let mut stream = store.list(arg);
        while let Some(meta) = stream.next().await {
            let meta = meta?;
            out.insert(meta.location.as_ref().to_owned(), meta.size);
        }
        Ok(out)
    })
    .await
    .map_err(|(e, _)| {
        IngestError::Setup(format!(
            "cannot list s3://{}/{prefix}: {}: {e}",
            settings.bucket,
            classify(&e).what
        ))
    })
}

type Job = fn(
    Arc<dyn ObjectStore>,
    S3Settings,
    Arc<Item>,
    u64,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Runs `job` over `items` with at most `concurrency` at once; `on_done` is
/// called on this task as each finishes. Returns the failures (index,
/// message).
async fn run_bounded(
    items: Vec<Arc<Item>>,
    concurrency: usize,
    store: &Arc<dyn ObjectStore>,
    settings: &S3Settings,
    job: Job,
    mut on_done: impl FnMut(bool, &Item),
) -> Vec<(usize, String)> {
    let mut set: JoinSet<(usize, Result<(), String>)> = JoinSet::new();
    let mut failures = Vec::new();
    let mut next = 0usize;
    loop {
        while set.len() < concurrency && next < items.len() {
            let (i, it) = (next, items[next].clone());
            let fut = job(store.clone(), settings.clone(), it, i as u64);
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

fn upload(
    store: Arc<dyn ObjectStore>,
    settings: S3Settings,
    it: Arc<Item>,
    seed: u64,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
    Box::pin(async move {
        let data = std::fs::read(&it.file).map_err(|e| format!("{}: {e}", it.file.display()))?;
        if data.len() as u64 != it.size {
            return Err(format!(
                "{}: size changed while ingesting ({} bytes, then {})",
                it.file.display(),
                it.size,
                data.len()
            ));
        }
        let payload = PutPayload::from(data);
        with_retries(settings.retry_policy(), seed, || {
            store.put_opts(&it.key, payload.clone(), PutOptions::default())
        })
        .await
        .map(|_| ())
        .map_err(|(e, n)| {
            format!(
                "{} -> {}: {} after {n} attempt(s): {e}",
                it.file.display(),
                settings.url_of(it.key.as_ref()),
                classify(&e).what
            )
        })
    })
}

fn verify(
    store: Arc<dyn ObjectStore>,
    settings: S3Settings,
    it: Arc<Item>,
    seed: u64,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
    Box::pin(async move {
        let url = settings.url_of(it.key.as_ref());
        let remote = with_retries(settings.retry_policy(), seed, || async {
            store
                .get_opts(&it.key, GetOptions::default())
                .await?
                .bytes()
                .await
        })
        .await
        .map_err(|(e, n)| format!("{url}: {} after {n} attempt(s): {e}", classify(&e).what))?;
        let local = std::fs::read(&it.file).map_err(|e| format!("{}: {e}", it.file.display()))?;
        if remote.len() != local.len() {
            return Err(format!(
                "{url}: {} bytes, but {} has {}",
                remote.len(),
                it.file.display(),
                local.len()
            ));
        }
        if let Some(at) = remote.iter().zip(&local).position(|(a, b)| a != b) {
            return Err(format!(
                "{url}: differs from {} at byte {at}",
                it.file.display()
            ));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_parse() {
        assert_eq!(
            parse_s3_url("s3://b/p/q/").unwrap(),
            ("b".to_owned(), "p/q".to_owned())
        );
        assert_eq!(
            parse_s3_url("s3://b").unwrap(),
            ("b".to_owned(), String::new())
        );
        assert_eq!(
            parse_s3_url("s3://b/").unwrap(),
            ("b".to_owned(), String::new())
        );
        assert!(parse_s3_url("http://b/p").is_err());
        assert!(parse_s3_url("s3:///p").is_err());
    }

    #[test]
    fn keys_follow_the_catalog() {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, b: &[u8]| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b).unwrap();
        };
        w("b/2.bin", b"22");
        w("a/1.bin", b"1");
        w("top.bin", b"t");
        w(".hidden/x", b"x");
        let items = plan(d.path(), "ds/v1").unwrap();
        let keys: Vec<_> = items.iter().map(|i| (i.key.to_string(), i.size)).collect();
        assert_eq!(
            keys,
            [
                ("ds/v1/top.bin".to_owned(), 1),
                ("ds/v1/a/1.bin".to_owned(), 1),
                ("ds/v1/b/2.bin".to_owned(), 2)
            ]
        );
        let items = plan(d.path(), "").unwrap();
        assert_eq!(items[0].key.as_ref(), "top.bin");
        let e = ingest(
            &IngestOptions::new(d.path().join("missing"), S3Settings::new("b"), "p"),
            |_, _, _, _| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
