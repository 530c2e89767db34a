//! The filesystem source: a directory tree or a manifest ([`catalog`]),
//! read with io_uring straight into the arena ([`reader`]), behind
//! [`SampleSource`] ([`FsSource`]).

pub mod catalog;
pub mod reader;
pub mod shards;

pub use catalog::{Catalog, CatalogEntry, CatalogError};

use super::{Completion, Landing, SampleSource, SourceFull};
use crate::config::{DatasetConfig, DatasetLocation, ShardFormat};
use granary_shm::arena::ArenaSlice;
use reader::{FileStat, ReadRequest, UringReader};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// Builds the catalog of a configured filesystem dataset: a directory tree
/// ([`Catalog::from_dir`]) or a manifest (`Catalog::from_manifest`).
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
    if let Some(shards) = dataset.shards() {
        if shards.format != ShardFormat::Files {
            let Some(DatasetLocation::Root(root)) = fs.location() else {
                return Err(CatalogError::NoLocation {
                    dataset: fs.name.clone(),
                });
            };
            let (catalog, stats) = shards::index_dataset(root, &shards)?;
            tracing::info!(
                dataset = %fs.name,
                "{} index of {}: {} samples from {stats}",
                shards.format.keyword(),
                root.display(),
                catalog.len()
            );
            return Ok(catalog);
        }
    }
    match fs.location() {
        Some(DatasetLocation::Root(root)) => Catalog::from_dir(root),
        Some(DatasetLocation::Manifest(manifest)) => Catalog::from_manifest(manifest),
        None => Err(CatalogError::NoLocation {
            dataset: fs.name.clone(),
        }),
    }
}

// The engine's extents hold an O_DIRECT read's whole blocks: they start at
// multiples of the cache's alignment and are rounded up to it.
const _: () = assert!(crate::cache::DEFAULT_ALIGN.is_multiple_of(reader::DIRECT_BLOCK as u64));

/// A filesystem dataset: its catalog and an io_uring reader of its own.
pub struct FsSource {
    reader: UringReader,
    landing: Landing,
    catalog: Catalog,
    /// Whether files are read with `O_DIRECT`.
    direct: bool,
}

impl std::fmt::Debug for FsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsSource")
            .field("samples", &self.catalog.len())
            .field("reader", &self.reader)
            .field("direct", &self.direct)
            .finish()
    }
}

impl FsSource {
    /// A source reading `catalog`'s files, `capacity` at a time; an open or
    /// read that takes longer than `read_timeout` is cancelled and fails its
    /// sample with `ETIME` ([`super::FailureKind::TimedOut`]).
    pub fn new(catalog: Catalog, capacity: u32, read_timeout: Duration) -> io::Result<FsSource> {
        Ok(FsSource {
            reader: UringReader::new(capacity)?.with_timeout(Some(read_timeout)),
            landing: Landing::default(),
            catalog,
            direct: false,
        })
    }

    /// Reads the files with `O_DIRECT` when `on` (see [`reader`]): the
    /// engine then gives every read whole 4 KiB blocks of the arena.
    pub fn with_direct_io(mut self, on: bool) -> FsSource {
        self.direct = on;
        self
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

    crate::source::samples::catalog_methods!();

    fn describe(&self, index: u64) -> String {
        let e = &self.catalog.entries()[index as usize];
        if e.offset == 0 && e.file_size == e.size {
            e.path.display().to_string()
        } else {
            // A sample inside a shard.
            format!(
                "{} bytes {}..{}",
                e.path.display(),
                e.offset,
                e.offset + e.size
            )
        }
    }

    fn capacity(&self) -> u32 {
        self.reader.capacity()
    }

    fn read_block(&self) -> u32 {
        if self.direct {
            reader::DIRECT_BLOCK
        } else {
            1
        }
    }

    fn in_flight(&self) -> usize {
        self.reader.in_flight()
    }

    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        let e = &self.catalog.entries()[index as usize];
        let (Ok(len), Ok(path)) = (
            u32::try_from(e.size),
            CString::new(e.path.as_os_str().as_bytes()),
        ) else {
            // A file of 4 GiB or more, or a path with a NUL byte: completed
            // with an error at once.
            let err = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a file of 4 GiB or more, or a path with a NUL byte",
                    e.path.display()
                ),
            );
            return self.reader.reject(tag, err).map_err(|_| SourceFull);
        };
        if dest.len() < len as usize {
            return Err(SourceFull);
        }
        let span = u64::from(len).next_multiple_of(u64::from(self.read_block()));
        if (dest.len() as u64) < span {
            // The engine gives whole blocks (read_block); a shorter range is
            // its bug, said rather than read some other way.
            let err = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: O_DIRECT read given {} bytes of arena, {span} needed",
                    e.path.display(),
                    dest.len()
                ),
            );
            return self.reader.reject(tag, err).map_err(|_| SourceFull);
        }
        let req = ReadRequest {
            tag,
            path,
            offset: e.offset,
            len,
            dest,
            expect: Some(FileStat {
                size: e.file_size,
                mtime: e.mtime,
            }),
            direct: self.direct,
        };
        self.reader.submit(req).map_err(|_| SourceFull)
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let reader = &mut self.reader;
        self.landing
            .poll(out, |raw| reader.poll_completions(wait, raw))
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }
}
