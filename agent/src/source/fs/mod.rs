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

/// Files the `direct_io` default looks at when a dataset opens, spread
/// evenly over its catalog.
const CACHE_PROBE_FILES: usize = 64;

/// Bytes at the start of each probed file whose pages are looked at.
const CACHE_PROBE_BYTES: u64 = 1 << 20;

/// With `direct_io` unset, a `format = "files"` dataset reads with
/// `O_DIRECT` when less than this share of the probed pages is in the page
/// cache. `O_DIRECT` wins where the files come from the device (no cache
/// page filled and copied, the engine thread spared the page cache's work)
/// and loses about half the rate where they are cached (every read waits on
/// the device): docs/benchmarks.md, "cold".
pub(crate) const DIRECT_IO_BELOW_CACHED: f64 = 0.5;

/// The share of the pages at the start of up to [`CACHE_PROBE_FILES`] files
/// of `catalog` (evenly spread) that are in the page cache (`mincore`), from
/// 0 to 1; files that cannot be opened or mapped are left out, and a
/// catalog with nothing to probe counts as cached (buffered reads, the
/// safe choice). Costs an open, a map and a `mincore` per probed file.
pub(crate) fn page_cache_share(catalog: &Catalog) -> f64 {
    let entries = catalog.entries();
    let step = entries.len().div_ceil(CACHE_PROBE_FILES).max(1);
    let (mut cached, mut pages) = (0usize, 0usize);
    for e in entries.iter().step_by(step) {
        let len = e.file_size.min(CACHE_PROBE_BYTES) as usize;
        if len == 0 {
            continue;
        }
        let Ok(file) = std::fs::File::open(&e.path) else {
            continue;
        };
        // The file may have shrunk since it was catalogued: map no more
        // than it holds now.
        let now = file.metadata().map_or(0, |m| m.len()) as usize;
        let len = len.min(now);
        if len == 0 {
            continue;
        }
        if let Ok(n) = crate::sys::pages_in_page_cache(&file, len) {
            cached += n;
            pages += len.div_ceil(4096);
        }
    }
    if pages == 0 {
        1.0
    } else {
        cached as f64 / pages as f64
    }
}

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

#[cfg(test)]
mod cache_probe_tests {
    use super::*;
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

    /// The `direct_io` default's probe: files just read count as cached;
    /// once their pages are dropped they count as not cached, on a
    /// filesystem that can drop them (on one that lives in memory they stay
    /// cached, and the default reads them buffered, as it should); a
    /// catalog of empty files counts as cached. Opened as the agent opens
    /// it, a dataset with `direct_io` unset reads by the probe alone and
    /// buffered as a mixture member.
    #[test]
    fn the_probe_tells_cached_files_from_files_on_the_device() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cat")).unwrap();
        let paths: Vec<_> = (0..100)
            .map(|i| dir.path().join("cat").join(format!("{i:03}.bin")))
            .collect();
        for (i, p) in paths.iter().enumerate() {
            std::fs::write(p, vec![i as u8; 20_000 + i * 100]).unwrap();
            assert_eq!(std::fs::read(p).unwrap().len(), 20_000 + i * 100);
        }
        let catalog = Catalog::from_dir(dir.path()).unwrap();
        let share = page_cache_share(&catalog);
        assert!(share >= DIRECT_IO_BELOW_CACHED, "just read: {share}");

        let mut dropped = true;
        for p in &paths {
            let f = std::fs::File::open(p).unwrap();
            f.sync_all().unwrap();
            posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
            dropped &= crate::sys::pages_in_page_cache(&f, 20_000).unwrap() == 0;
        }
        let share = page_cache_share(&catalog);
        if dropped {
            assert!(share < DIRECT_IO_BELOW_CACHED, "dropped: {share}");
        } else {
            eprintln!(
                "the filesystem of {} keeps its files in memory",
                dir.path().display()
            );
            assert!(share >= DIRECT_IO_BELOW_CACHED, "in memory: {share}");
        }

        // The dataset as the agent opens it: `direct_io` unset follows the
        // probe alone, reads buffered as a mixture member, and `false`
        // always reads buffered.
        let toml = |direct: &str| {
            format!(
                "[[dataset]]\nname = \"d\"\nroot = \"{}\"\n{direct}",
                dir.path().display()
            )
        };
        let unset = crate::config::Config::from_toml_str(&toml("")).unwrap();
        let off = crate::config::Config::from_toml_str(&toml("direct_io = false\n")).unwrap();
        let block = |cfg: &crate::config::Config, member: bool| {
            let src = if member {
                crate::source::open_mixture_member(&cfg.datasets[0], cfg)
            } else {
                crate::source::open(&cfg.datasets[0], cfg)
            };
            src.unwrap().read_block()
        };
        let want = if dropped { reader::DIRECT_BLOCK } else { 1 };
        assert_eq!(block(&unset, false), want, "alone, dropped: {dropped}");
        assert_eq!(block(&unset, true), 1, "a mixture member");
        assert_eq!(block(&off, false), 1, "direct_io = false");

        let empty = tempfile::tempdir().unwrap();
        std::fs::create_dir(empty.path().join("cat")).unwrap();
        std::fs::write(empty.path().join("cat").join("0.bin"), b"").unwrap();
        let catalog = Catalog::from_dir(empty.path()).unwrap();
        assert_eq!(page_cache_share(&catalog), 1.0);
    }
}
