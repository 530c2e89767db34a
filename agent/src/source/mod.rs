//! Sources: where a dataset's samples come from.
//!
//! Every source starts from a *catalog*: the ordered list of the dataset's
//! samples with their stable ids, labels and sizes, which the planner
//! permutes and the fetcher reads. The engine drives every dataset through
//! one trait, [`SampleSource`]: the catalog (how many samples, each one's
//! id, label and size) and reads into arena memory, submitted without
//! blocking and completed in any order, the way io_uring works.
//!
//! * [`fs`]: a directory tree or manifest (its catalog), read with io_uring
//!   ([`FsSource`]; the reader is `fs::reader`);
//! * [`s3`]: an object store — an S3 bucket, a Google Cloud Storage bucket
//!   or an Azure Blob Storage container —, read with ranged or whole-object
//!   GETs on a tokio runtime ([`s3::S3Dataset`]);
//! * [`cql`]: ScyllaDB or Cassandra tables, read with a prepared statement
//!   on a tokio runtime ([`cql::CqlDataset`]).
//!
//! The S3 and CQL fetchers share one task queue (`task_queue`): requests
//! as tasks on their runtime, completions handed back through a queue and
//! an eventfd, and a drop that waits until no task can write any more.
//! The io_uring reader and the fetchers speak one vocabulary ([`queue`]):
//! an [`queue::IoCompletion`] per request, [`queue::Full`] when their queue
//! is full.
//!
//! * [`shards`]: the index of tar shards (`format = "webdataset"`) for fs
//!   and S3 datasets: one sample per key, a byte range of its shard.
//!
//! * [`mixture`]: a `[[mixture]]`'s datasets' sources as one catalog.
//!
//! The three catalogs share their accessors through [`SampleList`].
//!
//! [`open`] builds the source of a configured dataset (blocking: it lists
//! or reads the catalog); a dataset with `[dataset.prepare]` gets its
//! source wrapped in a [`prepared::PreparedSource`], which decodes and
//! resizes every sample on its own threads (docs/prepare.md).

pub mod cql;
pub mod fs;
pub mod mixture;
pub mod prepared;
pub mod queue;
pub mod s3;
pub mod samples;
pub mod shards;
mod task_queue;

pub use fs::{open_catalog, Catalog, CatalogEntry, CatalogError, FsSource};
pub(crate) use queue::Landing;
pub use samples::{EntryMeta, SampleList};

use crate::config::{Config, DatasetConfig, ShardFormat};
use granary_shm::arena::ArenaSlice;
use granary_shm::ErrorCode;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// What kind of failure a read attempt met: what the engine's retry policy
/// decides on, and what the loader is told per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The sample is not in the store (a missing file, HTTP 404, no row).
    NotFound,
    /// A failure that may go away by itself (I/O error, connection lost,
    /// HTTP 5xx, overloaded node): retried.
    Transient,
    /// A failure that will not go away by retrying (permission denied, a
    /// bad request).
    Permanent,
    /// The sample's length differs from the catalog's: it changed since
    /// the catalog was made.
    Short,
    /// The bytes failed a check (checksum, version).
    Corrupt,
    /// The attempt ran out of time (`prefetch.read_timeout_ms`): retried.
    TimedOut,
    /// The dataset's prepare stage could not decode the sample (not a
    /// JPEG, corrupt data, more pixels or bytes than allowed).
    Decode,
}

impl FailureKind {
    /// Whether another attempt may succeed.
    pub fn retryable(self) -> bool {
        matches!(self, FailureKind::Transient | FailureKind::TimedOut)
    }

    /// The per-sample status the loader sees.
    pub fn code(self) -> ErrorCode {
        match self {
            FailureKind::NotFound => ErrorCode::NotFound,
            FailureKind::Transient | FailureKind::Permanent => ErrorCode::Io,
            FailureKind::Short => ErrorCode::ShortRead,
            FailureKind::Corrupt => ErrorCode::Corrupt,
            FailureKind::TimedOut => ErrorCode::Timeout,
            FailureKind::Decode => ErrorCode::Decode,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::NotFound => "not found",
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
            FailureKind::Short => "length changed",
            FailureKind::Corrupt => "corrupt",
            FailureKind::TimedOut => "timed out",
            FailureKind::Decode => "does not decode",
        })
    }
}

/// Why one read attempt failed: its kind and a message naming the sample's
/// location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleError {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What happened, for logs.
    pub message: String,
}

impl SampleError {
    /// An error of `kind`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> SampleError {
        SampleError {
            kind,
            message: message.into(),
        }
    }

    /// Classifies an I/O error of a file read or of a store request: the
    /// store fetchers' errors say whether they may go away; OS errors are
    /// judged by their number.
    pub(crate) fn from_io(err: &io::Error) -> SampleError {
        let message = err.to_string();
        let retryable_store = queue::fetch_error(err).map(|f| f.retryable);
        if let Some(c) = queue::changed(err) {
            let kind = if c.size_differs {
                FailureKind::Short
            } else {
                FailureKind::Corrupt
            };
            return SampleError { kind, message };
        }
        let kind = match (err.kind(), fs::reader::errno(err)) {
            (io::ErrorKind::NotFound, _) => FailureKind::NotFound,
            (io::ErrorKind::TimedOut, _) => FailureKind::TimedOut,
            (io::ErrorKind::UnexpectedEof, _) | (io::ErrorKind::InvalidData, _) => {
                FailureKind::Short
            }
            (_, Some(libc::ENOENT | libc::ENOTDIR)) => FailureKind::NotFound,
            (_, Some(libc::ETIMEDOUT | libc::ETIME | libc::ECANCELED)) => FailureKind::TimedOut,
            (_, Some(libc::EIO | libc::EAGAIN | libc::EINTR)) => FailureKind::Transient,
            _ if retryable_store == Some(true) => FailureKind::Transient,
            _ => FailureKind::Permanent,
        };
        SampleError { kind, message }
    }
}

impl fmt::Display for SampleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind)
    }
}

impl std::error::Error for SampleError {}

/// The outcome of one read: the bytes delivered (the sample's length), or
/// why the attempt failed.
#[derive(Debug)]
pub struct Completion {
    /// The tag the read was submitted with.
    pub tag: u64,
    /// Bytes read, or the failure.
    pub result: Result<u32, SampleError>,
}

/// What the engine knows of one sample before reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleMeta {
    /// Stable id: the sample's position in the catalog.
    pub sample_id: u64,
    /// Class label (`-1`: none).
    pub label: i32,
    /// Length in bytes: what a read delivers.
    pub size: u64,
}

/// [`SampleSource::submit`]'s answer when `capacity()` reads are in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceFull;

impl std::fmt::Display for SourceFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the source has as many reads in flight as it accepts")
    }
}

impl std::error::Error for SourceFull {}

/// A dataset's source as the engine drives it: its catalog and its reads.
///
/// Reads are submitted without blocking, up to [`capacity`](Self::capacity)
/// at a time, and come back from
/// [`poll_completions`](Self::poll_completions) in any order, each with the
/// caller's tag. A source retries transient failures itself as far as its
/// own policy goes; a completion with an error is final for that attempt,
/// and its [`FailureKind`] tells the engine's retry policy whether to try
/// again later.
pub trait SampleSource: Send {
    /// `"fs"`, `"s3"`, `"gcs"`, `"azure"` or `"cql"`.
    fn kind(&self) -> &'static str;
    /// Samples in the catalog.
    fn len(&self) -> u64;
    /// Whether the catalog is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sample `index`'s id, label and size; `index < len()`.
    fn meta(&self, index: u64) -> SampleMeta;
    /// Appends sample `index`'s version token to `out` (`index < len()`):
    /// what this source's read of it asks for and checks besides its
    /// length, so that agents whose catalogs name other versions of a
    /// sample get other dataset fingerprints (`docs/peers.md`, "Dataset
    /// identity"). Empty when the source has nothing of the kind.
    fn version(&self, index: u64, out: &mut Vec<u8>);
    /// Bytes of all samples.
    fn total_bytes(&self) -> u64;
    /// Where sample `index` lives, for messages (a path, an `s3://` URL…).
    fn describe(&self, index: u64) -> String;
    /// Most reads in flight at once.
    fn capacity(&self) -> u32;
    /// The block this source's reads write whole: [`submit`](Self::submit)'s
    /// `dest` is the sample's size rounded up to it, and starts at a
    /// multiple of it. 1 (the default): exactly the size. A power of two
    /// that divides the cache's extent alignment.
    fn read_block(&self) -> u32 {
        1
    }
    /// Reads accepted whose completion has not been returned yet.
    fn in_flight(&self) -> usize;
    /// Starts reading sample `index` (all `meta(index).size` bytes) into
    /// `dest` (that size rounded up to [`read_block`](Self::read_block)), a
    /// range of the arena that only this read writes until its
    /// completion (tagged `tag`) is returned; the source holds `dest` until
    /// then, so the mapping outlives the read. Never blocks.
    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull>;
    /// Hands submitted reads on (where the source batches them) and appends
    /// finished ones to `out`; returns how many it appended. `None`: does
    /// not block; `Some(d)`: waits until one finishes or `d` has passed.
    /// Errors are failures of the source itself, not of reads.
    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize>;
    /// A descriptor that is readable while completions may be pending, for
    /// an owner that waits on several sources at once. Call
    /// [`poll_completions`](Self::poll_completions) before waiting on it:
    /// that is what hands queued reads to the kernel or the runtime.
    fn wait_fd(&self) -> BorrowedFd<'_>;
    /// A mixture's order (`[[mixture]]`), which the planner deals in place
    /// of a permutation of the catalog; `None` for a dataset.
    fn mixture(&self) -> Option<std::sync::Arc<crate::mixture::MixtureOrder>> {
        None
    }
}

/// Builds the source of a configured dataset, blocking while it lists or
/// reads the catalog. Reads in flight are capped per dataset by
/// `prefetch.max_inflight_reads`, or the dataset's `max_inflight`.
pub fn open(dataset: &DatasetConfig, cfg: &Config) -> io::Result<Box<dyn SampleSource>> {
    open_with(dataset, cfg, true)
}

/// As [`open`], for a member of a mixture: a filesystem dataset that leaves
/// `direct_io` unset reads buffered, so that every member reads the same
/// blocks whatever the page cache holds.
pub(crate) fn open_mixture_member(
    dataset: &DatasetConfig,
    cfg: &Config,
) -> io::Result<Box<dyn SampleSource>> {
    open_with(dataset, cfg, false)
}

fn open_with(
    dataset: &DatasetConfig,
    cfg: &Config,
    auto_direct: bool,
) -> io::Result<Box<dyn SampleSource>> {
    let raw = open_raw(dataset, cfg, auto_direct)?;
    match dataset.prepare() {
        Some(p) => Ok(Box::new(prepared::PreparedSource::new(raw, p)?)),
        None => Ok(raw),
    }
}

/// The source of the dataset's stored bytes, without its prepare stage.
fn open_raw(
    dataset: &DatasetConfig,
    cfg: &Config,
    auto_direct: bool,
) -> io::Result<Box<dyn SampleSource>> {
    let capacity = cfg.prefetch.max_inflight_reads;
    let read_timeout = Duration::from_millis(cfg.prefetch.read_timeout_ms);
    let index_cache = cfg.cache.shard_index_dir();
    match dataset {
        DatasetConfig::Fs(fs) => {
            let catalog = open_catalog(dataset).map_err(io::Error::other)?;
            let direct = match fs.direct_io {
                Some(on) => on,
                None if auto_direct && fs.format == ShardFormat::Files => {
                    let cached = fs::page_cache_share(&catalog);
                    let direct = cached < fs::DIRECT_IO_BELOW_CACHED;
                    tracing::info!(
                        dataset = %fs.name,
                        "direct_io unset: {:.0} % of a sample of its files in the page cache, \
                         reading {}",
                        cached * 100.0,
                        if direct { "with O_DIRECT" } else { "through the page cache" }
                    );
                    direct
                }
                None => false,
            };
            Ok(Box::new(
                FsSource::new(catalog, capacity, read_timeout)?.with_direct_io(direct),
            ))
        }
        DatasetConfig::S3(s3) => Ok(Box::new(s3::S3Dataset::open(
            dataset,
            s3.max_inflight.unwrap_or(capacity),
            read_timeout,
            index_cache.as_deref(),
        )?)),
        DatasetConfig::Gcs(gcs) => Ok(Box::new(s3::S3Dataset::open(
            dataset,
            gcs.max_inflight.unwrap_or(capacity),
            read_timeout,
            index_cache.as_deref(),
        )?)),
        DatasetConfig::Azure(az) => Ok(Box::new(s3::S3Dataset::open(
            dataset,
            az.max_inflight.unwrap_or(capacity),
            read_timeout,
            index_cache.as_deref(),
        )?)),
        DatasetConfig::Cql(_) => Ok(Box::new(cql::CqlDataset::open(dataset, read_timeout)?)),
    }
}
