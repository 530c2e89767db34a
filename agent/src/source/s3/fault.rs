//! An `ObjectStore` wrapper that makes a share of GET requests fail with
//! retryable errors, for tests and benchmarks of the retry path.
//!
//! Of the GETs it passes through, a fraction `rate` fails: half of those
//! before any response (a connection error), half in the middle of the body
//! (the stream ends with an interrupted-connection error after its first
//! chunk, so the caller has already written part of the sample). Which
//! requests fail is decided by a counter mixed with a seed, so a run is
//! reproducible for a given order of requests. Every other operation is
//! passed through untouched.

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The error a [`FaultyStore`] injects.
#[derive(Debug)]
pub(crate) struct InjectedFault(&'static str);

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injected fault: {}", self.0)
    }
}

impl std::error::Error for InjectedFault {}

fn injected(kind: HttpErrorKind, what: &'static str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: Box::new(HttpError::new(kind, InjectedFault(what))),
    }
}

/// Fails a fraction of the GETs of the store it wraps; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    /// Failure threshold on a 0..2^32 scale.
    threshold: u64,
    seed: u64,
    gets: AtomicU64,
    before: AtomicU64,
    during: AtomicU64,
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl FaultyStore {
    /// Wraps `inner`, failing a fraction `rate` (0..=1) of its GETs.
    pub fn new(inner: Arc<dyn ObjectStore>, rate: f64, seed: u64) -> FaultyStore {
        let threshold = (rate.clamp(0.0, 1.0) * (1u64 << 32) as f64) as u64;
        FaultyStore {
            inner,
            threshold,
            seed,
            gets: AtomicU64::new(0),
            before: AtomicU64::new(0),
            during: AtomicU64::new(0),
        }
    }

    /// GETs seen so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::Relaxed)
    }

    /// GETs failed before a response, and in the middle of the body.
    pub fn injected(&self) -> (u64, u64) {
        (
            self.before.load(Ordering::Relaxed),
            self.during.load(Ordering::Relaxed),
        )
    }

    /// `None`: pass through; `Some(true)`: fail before the response;
    /// `Some(false)`: fail in the body.
    fn decide(&self) -> Option<bool> {
        let n = self.gets.fetch_add(1, Ordering::Relaxed);
        use granary_base::hash::{mix64, GAMMA};
        let x = self.seed ^ n.wrapping_mul(GAMMA);
        let h = mix64(x.wrapping_add(GAMMA));
        ((h >> 32) < self.threshold).then_some(h & 1 == 0)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        match self.decide() {
            None => self.inner.get_opts(location, options).await,
            Some(true) => {
                self.before.fetch_add(1, Ordering::Relaxed);
                Err(injected(HttpErrorKind::Connect, "connection refused"))
            }
            Some(false) => {
                self.during.fetch_add(1, Ordering::Relaxed);
                let mut res = self.inner.get_opts(location, options).await?;
                let meta = res.meta.clone();
                let range = res.range.clone();
                let attributes = res.attributes.clone();
                let extensions = std::mem::take(&mut res.extensions);
                let cut = res
                    .into_stream()
                    .take(1)
                    .chain(futures_util::stream::once(async {
                        Err(injected(
                            HttpErrorKind::Interrupted,
                            "connection reset in the body",
                        ))
                    }));
                Ok(GetResult {
                    payload: GetResultPayload::Stream(cut.boxed()),
                    meta,
                    range,
                    attributes,
                    extensions,
                })
            }
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
