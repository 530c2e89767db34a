//! An object-store dataset (S3, GCS, Azure) as the engine serves it: the
//! source (client and runtime), the catalog, and one fetcher, behind
//! [`SampleSource`].

use super::{S3Catalog, S3Error, S3Fetcher, S3Layout, S3Source, StoreSettings};
use crate::config::DatasetConfig;
use crate::source::{Completion, Landing, SampleSource, SourceFull};
use granary_shm::arena::ArenaSlice;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// A `kind = "s3"`, `"gcs"` or `"azure"` dataset, ready to serve.
pub struct S3Dataset {
    // Field order matters: the fetcher (which may still have requests
    // running on the source's runtime) is dropped before the source.
    fetcher: S3Fetcher,
    landing: Landing,
    catalog: S3Catalog,
    source: S3Source,
}

impl fmt::Debug for S3Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Dataset")
            .field("bucket", &self.catalog.location())
            .field("samples", &self.catalog.len())
            .field("fetcher", &self.fetcher)
            .finish()
    }
}

impl S3Dataset {
    /// Connects, lists (or reads the manifest of) the dataset, and makes a
    /// fetcher with `capacity` requests in flight. Blocking.
    /// Each request is one attempt (the engine's retry policy is the only
    /// retry layer), limited to `read_timeout` or the dataset's
    /// `request_timeout_ms`, whichever is shorter. Shard indexes go
    /// through the shard-index cache in `index_cache` when given
    /// (`cache.shard_index_dir`).
    pub fn open(
        ds: &DatasetConfig,
        capacity: u32,
        read_timeout: Duration,
        index_cache: Option<&std::path::Path>,
    ) -> io::Result<S3Dataset> {
        let mut settings = StoreSettings::from_dataset(ds).map_err(io::Error::other)?;
        settings.set_retries(0);
        settings.set_request_timeout(settings.request_timeout().min(read_timeout));
        let layout = S3Layout::from_dataset(ds).map_err(io::Error::other)?;
        let mut source = S3Source::connect_store(&settings, capacity).map_err(io::Error::other)?;
        if let (Some(dir), S3Layout::Shards(_)) = (index_cache, &layout) {
            match super::index_cache::ShardIndexCache::open(dir) {
                Ok(cache) => source = source.with_index_cache(cache, settings.identity()),
                Err(e) => tracing::warn!(
                    dataset = %ds.name(),
                    "shard index cache {}: {e}; indexing without it",
                    dir.display()
                ),
            }
        }
        let catalog = source.catalog(&layout).map_err(|e| match e {
            S3Error::Request {
                retryable: true, ..
            } => io::Error::new(io::ErrorKind::TimedOut, e),
            e => io::Error::other(e),
        })?;
        S3Dataset::with_parts(source, catalog)
    }

    /// A dataset from a source and a catalog listed through it.
    pub fn with_parts(source: S3Source, catalog: S3Catalog) -> io::Result<S3Dataset> {
        let fetcher = source.fetcher()?;
        Ok(S3Dataset {
            fetcher,
            landing: Landing::default(),
            catalog,
            source,
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &S3Catalog {
        &self.catalog
    }

    /// The source (client, runtime, options).
    pub fn source(&self) -> &S3Source {
        &self.source
    }

    /// The fetcher's counters.
    pub fn stats(&self) -> super::FetchStats {
        self.fetcher.stats()
    }
}

impl SampleSource for S3Dataset {
    fn kind(&self) -> &'static str {
        self.source.location().kind.name()
    }

    crate::source::samples::catalog_methods!();

    fn describe(&self, index: u64) -> String {
        let e = &self.catalog.entries()[index as usize];
        let url = self.catalog.location().url_of(e.key.as_ref());
        if e.whole_object {
            url
        } else {
            format!("{url} bytes {}..{}", e.offset, e.offset + e.size)
        }
    }

    fn capacity(&self) -> u32 {
        self.fetcher.capacity()
    }

    fn in_flight(&self) -> usize {
        self.fetcher.in_flight()
    }

    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        let size = self.catalog.entries()[index as usize].size;
        if (dest.len() as u64) < size {
            return Err(SourceFull);
        }
        match self.catalog.request(index, tag, dest) {
            Some(req) => self.fetcher.submit(req).map_err(|_| SourceFull),
            None => {
                // A sample of 4 GiB or more cannot be one request.
                let key = self.catalog.entries()[index as usize].key.to_string();
                let why = format!("a sample of {size} bytes is larger than one request carries");
                self.fetcher.reject(tag, key, why).map_err(|_| SourceFull)
            }
        }
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let fetcher = &mut self.fetcher;
        self.landing
            .poll(out, |raw| fetcher.poll_completions(wait, raw))
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.fetcher.wake_fd()
    }
}
