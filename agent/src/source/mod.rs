//! Sources: where a dataset's samples come from.
//!
//! Every source starts from a *catalog*: the ordered list of the dataset's
//! samples with their stable ids, labels and sizes, which the planner
//! permutes and the fetcher reads. The engine drives every dataset through
//! one trait, [`SampleSource`]: the catalog (how many samples, each one's
//! id, label and size) and reads into arena memory, submitted without
//! blocking and completed in any order, the way io_uring works.
//!
//! * [`fs`]: a directory tree or manifest, read with io_uring
//!   ([`FsSource`]);
//! * [`s3`]: an S3 bucket, read with ranged or whole-object GETs on a tokio
//!   runtime ([`s3::S3Dataset`]);
//! * [`cql`]: ScyllaDB or Cassandra tables, read with a prepared statement
//!   on a tokio runtime ([`cql::CqlDataset`]).
//!
//! The S3 and CQL fetchers share one task queue (`task_queue`): requests
//! as tasks on their runtime, completions handed back through a queue and
//! an eventfd, and a drop that waits until no task can write any more.
//!
//! [`open`] builds the source of a configured dataset (blocking: it lists
//! or reads the catalog).

pub mod cql;
pub mod fs;
pub mod s3;
mod task_queue;

pub use fs::{Catalog, CatalogEntry, CatalogError};

use crate::config::{Config, DatasetConfig, DatasetLocation};
use crate::uring_reader::{Completion, ReadRequest, UringReader};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

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
/// and [`is_retryable`](Self::is_retryable) says whether the engine may try
/// again later.
pub trait SampleSource: Send {
    /// `"fs"`, `"s3"` or `"cql"`.
    fn kind(&self) -> &'static str;
    /// Samples in the catalog.
    fn len(&self) -> u64;
    /// Whether the catalog is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sample `index`'s id, label and size; `index < len()`.
    fn meta(&self, index: u64) -> SampleMeta;
    /// Bytes of all samples.
    fn total_bytes(&self) -> u64;
    /// Where sample `index` lives, for messages (a path, an `s3://` URL…).
    fn describe(&self, index: u64) -> String;
    /// Most reads in flight at once.
    fn capacity(&self) -> u32;
    /// Reads accepted whose completion has not been returned yet.
    fn in_flight(&self) -> usize;
    /// Starts reading sample `index` (all `meta(index).size` bytes) into
    /// `dest`; its completion carries `tag`. Never blocks.
    ///
    /// # Safety
    ///
    /// `dest` must be valid for writes of `meta(index).size` bytes, and
    /// nothing else may read or write that memory, until the completion for
    /// `tag` has been returned by [`poll_completions`](Self::poll_completions)
    /// (dropping the source waits until no read can write any more).
    unsafe fn submit(&mut self, tag: u64, index: u64, dest: *mut u8) -> Result<(), SourceFull>;
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
    /// Whether a failed read may succeed if tried again later.
    fn is_retryable(&self, err: &io::Error) -> bool;
}

/// Builds the source of a configured dataset, blocking while it lists or
/// reads the catalog. Reads in flight are capped per dataset by
/// `prefetch.max_inflight_reads`, or the dataset's `max_inflight`.
pub fn open(dataset: &DatasetConfig, cfg: &Config) -> io::Result<Box<dyn SampleSource>> {
    let capacity = cfg.prefetch.max_inflight_reads;
    match dataset {
        DatasetConfig::Fs(_) => {
            let catalog = open_catalog(dataset).map_err(io::Error::other)?;
            Ok(Box::new(FsSource::new(catalog, capacity)?))
        }
        DatasetConfig::S3(s3) => Ok(Box::new(s3::S3Dataset::open(
            dataset,
            s3.max_inflight.unwrap_or(capacity),
        )?)),
        DatasetConfig::Cql(_) => Ok(Box::new(cql::CqlDataset::open(dataset)?)),
    }
}

/// Builds the catalog of a configured filesystem dataset: a directory tree
/// ([`Catalog::from_dir`]) or a manifest ([`Catalog::from_manifest`]).
pub fn open_catalog(dataset: &DatasetConfig) -> Result<Catalog, CatalogError> {
    let DatasetConfig::Fs(fs) = dataset else {
        return Err(CatalogError::Io {
            path: dataset.name().into(),
            action: "catalog",
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a filesystem dataset (remote datasets are opened with source::open)",
            ),
        });
    };
    match fs.location() {
        Some(DatasetLocation::Root(root)) => Catalog::from_dir(root),
        Some(DatasetLocation::Manifest(manifest)) => Catalog::from_manifest(manifest),
        None => Err(CatalogError::NoLocation {
            dataset: fs.name.clone(),
        }),
    }
}

/// A filesystem dataset: its catalog and an io_uring reader of its own.
pub struct FsSource {
    catalog: Catalog,
    reader: UringReader,
}

impl std::fmt::Debug for FsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsSource")
            .field("samples", &self.catalog.len())
            .field("reader", &self.reader)
            .finish()
    }
}

impl FsSource {
    /// A source reading `catalog`'s files, `capacity` at a time.
    pub fn new(catalog: Catalog, capacity: u32) -> io::Result<FsSource> {
        Ok(FsSource {
            catalog,
            reader: UringReader::new(capacity)?,
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }
}

impl SampleSource for FsSource {
    fn kind(&self) -> &'static str {
        "fs"
    }

    fn len(&self) -> u64 {
        self.catalog.len() as u64
    }

    fn meta(&self, index: u64) -> SampleMeta {
        let e = &self.catalog.entries()[index as usize];
        SampleMeta {
            sample_id: e.sample_id,
            label: e.label,
            size: e.size,
        }
    }

    fn total_bytes(&self) -> u64 {
        self.catalog.total_bytes()
    }

    fn describe(&self, index: u64) -> String {
        self.catalog.entries()[index as usize]
            .path
            .display()
            .to_string()
    }

    fn capacity(&self) -> u32 {
        self.reader.capacity()
    }

    fn in_flight(&self) -> usize {
        self.reader.in_flight()
    }

    unsafe fn submit(&mut self, tag: u64, index: u64, dest: *mut u8) -> Result<(), SourceFull> {
        let e = &self.catalog.entries()[index as usize];
        let (Ok(len), Ok(path)) = (
            u32::try_from(e.size),
            CString::new(e.path.as_os_str().as_bytes()),
        ) else {
            // A file of 4 GiB or more, or a path with a NUL byte: give it
            // back as a bad request, completed with an error at once.
            let req = ReadRequest {
                tag,
                path: CString::default(),
                offset: 0,
                len: 1,
                dest: std::ptr::null_mut(),
            };
            // SAFETY: a null destination is refused by the reader without
            // being touched; it completes with an InvalidInput error.
            return unsafe { self.reader.submit(req) }.map_err(|_| SourceFull);
        };
        let req = ReadRequest {
            tag,
            path,
            offset: 0,
            len,
            dest,
        };
        // SAFETY: the caller guarantees `dest` is valid for `len` bytes and
        // untouched until the completion for `tag` is returned.
        unsafe { self.reader.submit(req) }.map_err(|_| SourceFull)
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        self.reader.poll_completions(wait, out)
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the ring's descriptor lives as long as the reader, which
        // `self` owns for the borrow's lifetime.
        unsafe { BorrowedFd::borrow_raw(self.reader.as_raw_fd()) }
    }

    fn is_retryable(&self, err: &io::Error) -> bool {
        crate::uring_reader::is_retryable(err)
    }
}
