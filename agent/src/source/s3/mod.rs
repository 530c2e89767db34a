//! The object-store source: datasets in an S3-compatible bucket (AWS S3,
//! SeaweedFS, MinIO, Ceph RGW, …), a Google Cloud Storage bucket or an
//! Azure Blob Storage container, read through the `object_store` crate's
//! client for each ([`stores`]: [`StoreSettings`] names the store; module
//! and type names say S3, the first store it read).
//!
//! Three pieces, usable on their own:
//!
//! * [`S3Settings`]: where the bucket is and how to reach it (endpoint,
//!   region, credentials from the configuration or the usual `AWS_*`
//!   environment variables, path-style addressing, plain HTTP for loopback
//!   endpoints, per-request timeout, retries); [`S3Settings::build_store`]
//!   turns it into an `object_store` client with object_store's own retries
//!   switched off (the fetcher retries, see below).
//! * [`S3Catalog`] (module [`catalog`]): the dataset's samples, from a
//!   listing of `bucket/prefix` laid out like the filesystem tree (class
//!   folders → labels) or from a manifest of `key<TAB>label` lines.
//! * [`S3Fetcher`] (module [`fetcher`]): one GET per sample (a ranged GET
//!   when the sample is part of a larger object), hundreds in flight on a
//!   small multi-thread tokio runtime, a timeout per attempt, retries with
//!   exponential backoff and jitter, and the response body copied once,
//!   straight into the caller's memory (an arena extent). Its interface has
//!   the shape of `crate::source::fs::reader::UringReader`: non-blocking
//!   `submit`, `poll_completions`, completions in any order, plus an eventfd
//!   that becomes readable when completions are pending.
//!
//! [`S3Source`] ties them together around one runtime, and [`S3Dataset`]
//! is what the engine serves: a source, its catalog and a fetcher behind
//! [`crate::source::SampleSource`]. [`fault`] holds an `ObjectStore`
//! wrapper that injects failures, for tests and benchmarks.

pub mod catalog;
pub mod dataset;
pub mod fault;
pub mod fetcher;
pub mod index_cache;
pub mod shards;
pub mod stores;

pub use crate::source::queue::{fetch_error, is_retryable, FetchError};
pub use catalog::{S3Catalog, S3Entry};
pub use dataset::S3Dataset;
pub use fetcher::{FetchOptions, FetchRequest, FetchStats, Full, S3Fetcher};
pub use stores::{AzureSettings, Bucket, GcsSettings, StoreKind, StoreSettings};

use crate::config::{DatasetConfig, ShardFormat};
use object_store::aws::AmazonS3Builder;
use object_store::client::{HttpError, HttpErrorKind};
use object_store::ObjectStore;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Default `dataset[i].request_timeout_ms`: one GET attempt, headers and
/// body, must finish within this.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `dataset[i].retries`: attempts after the first for a retryable
/// failure.
pub(crate) const DEFAULT_RETRIES: u32 = 8;
/// Region used when neither the configuration nor the environment names one.
pub(crate) const DEFAULT_REGION: &str = "us-east-1";

/// How to reach a bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// Base URL of the S3 API (`http://127.0.0.1:8333`); `None`: AWS's
    /// endpoint for the region.
    pub endpoint: Option<String>,
    /// Region used for signing (`None`: `DEFAULT_REGION`).
    pub region: Option<String>,
    /// The bucket.
    pub bucket: String,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`) rather than virtual
    /// hosts (`bucket.endpoint/key`). Default true: what S3-compatible
    /// servers expect.
    pub path_style: bool,
    /// Whether an `http://` endpoint is accepted.
    pub allow_http: bool,
    /// Time limit of one request attempt, headers and body.
    pub request_timeout: Duration,
    /// Retries after the first attempt, for retryable failures.
    pub retries: u32,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("path_style", &self.path_style)
            .field("allow_http", &self.allow_http)
            .field("request_timeout", &self.request_timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl S3Settings {
    /// Settings for `bucket` with every default: no endpoint, region or
    /// credentials yet, path-style addressing, HTTPS only, 10 s timeout,
    /// 8 retries.
    pub fn new(bucket: impl Into<String>) -> S3Settings {
        S3Settings {
            endpoint: None,
            region: None,
            bucket: bucket.into(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            path_style: true,
            allow_http: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            retries: DEFAULT_RETRIES,
        }
    }

    /// The settings of a `kind = "s3"` dataset, completed from the process
    /// environment ([`fill_from_env`](Self::fill_from_env)).
    pub fn from_dataset(ds: &DatasetConfig) -> Result<S3Settings, S3Error> {
        let DatasetConfig::S3(ds) = ds else {
            return Err(S3Error::Settings(format!(
                "dataset {:?} is not an S3 dataset",
                ds.name()
            )));
        };
        let mut s = S3Settings::new(ds.bucket.clone());
        s.endpoint = ds.endpoint.clone();
        s.region = ds.region.clone();
        s.access_key_id = ds.access_key_id.clone();
        s.secret_access_key = ds
            .secret_access_key
            .as_ref()
            .map(|k| k.expose().to_string());
        s.path_style = ds.path_style;
        s.allow_http = ds.allow_http;
        s.request_timeout = Duration::from_millis(ds.request_timeout_ms);
        s.retries = ds.retries;
        s.fill_from_env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        Ok(s)
    }

    /// Fills what is still unset from environment variables looked up with
    /// `var`: `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`), `AWS_REGION` (or
    /// `AWS_DEFAULT_REGION`), and the credentials `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` — the credentials only
    /// when the settings name no access key at all, so a configured key is
    /// never paired with another key's secret.
    pub fn fill_from_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if self.endpoint.is_none() {
            self.endpoint = var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT"));
        }
        if self.region.is_none() {
            self.region = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION"));
        }
        if self.access_key_id.is_none() && self.secret_access_key.is_none() {
            self.access_key_id = var("AWS_ACCESS_KEY_ID");
            self.secret_access_key = var("AWS_SECRET_ACCESS_KEY");
            self.session_token = var("AWS_SESSION_TOKEN");
        }
    }

    /// The `s3://bucket/key` form of a key, for messages.
    pub fn url_of(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, key)
    }

    /// Checks the settings and builds the S3 client. Fails when credentials
    /// are missing or half given (the client would otherwise go looking for
    /// instance credentials), when an `http://` endpoint is used without
    /// `allow_http`, or when object_store rejects a value.
    pub fn build_store(&self) -> Result<Arc<dyn ObjectStore>, S3Error> {
        let bad = |m: String| Err(S3Error::Settings(m));
        if self.bucket.is_empty() || self.bucket.contains('/') {
            return bad(format!(
                "bucket name {:?} is empty or contains '/'",
                self.bucket
            ));
        }
        let (key, secret) = match (&self.access_key_id, &self.secret_access_key) {
            (Some(k), Some(s)) => (k, s),
            (None, None) => {
                return bad(
                    "no S3 credentials: set access_key_id and secret_access_key, or \
                     AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment"
                        .to_owned(),
                )
            }
            (Some(_), None) => return bad("access key id given without a secret access key".into()),
            (None, Some(_)) => {
                return bad("secret access key given without an access key id".into())
            }
        };
        stores::check_endpoint(self.endpoint.as_deref(), self.allow_http)?;
        let client = stores::client_options(self.allow_http, self.request_timeout)?;
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(self.region.as_deref().unwrap_or(DEFAULT_REGION))
            .with_access_key_id(key)
            .with_secret_access_key(secret)
            .with_virtual_hosted_style_request(!self.path_style)
            .with_allow_http(self.allow_http)
            .with_client_options(client)
            .with_retry(stores::no_retries());
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e.trim_end_matches('/'));
        }
        if let Some(t) = &self.session_token {
            b = b.with_token(t);
        }
        let store = b
            .build()
            .map_err(|e| S3Error::Settings(format!("bucket {}: {e}", self.bucket)))?;
        Ok(Arc::new(store))
    }

    /// Fetch options for these settings with `capacity` requests in flight.
    pub fn fetch_options(&self, capacity: u32) -> FetchOptions {
        FetchOptions {
            capacity,
            request_timeout: self.request_timeout,
            ..FetchOptions::default()
        }
    }
}

/// Why an S3 operation other than a sample fetch failed.
#[derive(Debug)]
pub enum S3Error {
    /// The settings are incomplete or wrong.
    Settings(String),
    /// A request failed (after its retries).
    Request {
        /// What was being done (`list s3://bucket/prefix`).
        what: String,
        /// Whether the failure was of the kind that may go away (it was
        /// retried until the retries ran out).
        retryable: bool,
        /// The client's error.
        source: object_store::Error,
    },
    /// A manifest line could not be used.
    Manifest {
        /// The manifest (`s3://bucket/key` or a file).
        manifest: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The location holds no sample.
    Empty {
        /// The listed prefix or the manifest.
        location: String,
    },
    /// A shard could not be indexed (`format = "webdataset"`, `"mds"`,
    /// `"parquet"`, `"arrow"`).
    Shard(crate::source::shards::WalkError),
    /// A local file could not be read.
    Io {
        /// The file.
        what: String,
        /// The underlying error.
        source: io::Error,
    },
}

impl fmt::Display for S3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            S3Error::Settings(m) => write!(f, "S3 settings: {m}"),
            S3Error::Request { what, source, .. } => write!(f, "cannot {what}: {source}"),
            S3Error::Manifest {
                manifest,
                line,
                reason,
            } => write!(f, "{manifest}:{line}: {reason}"),
            S3Error::Empty { location } => write!(f, "no sample found in {location}"),
            S3Error::Io { what, source } => write!(f, "{what}: {source}"),
            S3Error::Shard(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for S3Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            S3Error::Request { source, .. } => Some(source),
            S3Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How a failed request is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The `io::ErrorKind` it is reported with.
    pub kind: io::ErrorKind,
    /// Whether another attempt may succeed: timeouts, connection errors,
    /// HTTP 5xx, 429 and 408. Not: 404, 403, 401, other 4xx, bad requests,
    /// length mismatches.
    pub retryable: bool,
    /// A short description (`HTTP 503`, `not found (HTTP 404)`, …).
    pub what: String,
}

/// Classifies an `object_store` error (see [`Failure::retryable`]).
pub fn classify(err: &object_store::Error) -> Failure {
    use object_store::Error as E;
    let fail = |kind, retryable, what: &str| Failure {
        kind,
        retryable,
        what: what.to_owned(),
    };
    match err {
        E::NotFound { .. } => fail(io::ErrorKind::NotFound, false, "not found (HTTP 404)"),
        E::PermissionDenied { .. } => fail(
            io::ErrorKind::PermissionDenied,
            false,
            "access denied (HTTP 403)",
        ),
        E::Unauthenticated { .. } => fail(
            io::ErrorKind::PermissionDenied,
            false,
            "not authenticated (HTTP 401)",
        ),
        E::Generic { .. } => classify_chain(err),
        _ => fail(io::ErrorKind::Other, false, "request failed"),
    }
}

/// Classifies a generic error by what its source chain holds: a transport
/// error of the HTTP client, an HTTP status, or an I/O error.
fn classify_chain(err: &object_store::Error) -> Failure {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<HttpError>() {
            let (kind, retryable, what) = match h.kind() {
                HttpErrorKind::Connect => {
                    (io::ErrorKind::ConnectionRefused, true, "cannot connect")
                }
                HttpErrorKind::Request => {
                    (io::ErrorKind::ConnectionReset, true, "connection failed")
                }
                HttpErrorKind::Interrupted => (
                    io::ErrorKind::ConnectionAborted,
                    true,
                    "connection interrupted",
                ),
                HttpErrorKind::Timeout => (io::ErrorKind::TimedOut, true, "timed out"),
                HttpErrorKind::Decode => (
                    io::ErrorKind::InvalidData,
                    false,
                    "cannot decode the response",
                ),
                _ => (io::ErrorKind::Other, true, "transport error"),
            };
            return Failure {
                kind,
                retryable,
                what: what.to_owned(),
            };
        }
        if let Some(io_err) = e.downcast_ref::<io::Error>() {
            use io::ErrorKind as K;
            let retryable = matches!(
                io_err.kind(),
                K::TimedOut
                    | K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::Interrupted
                    | K::WouldBlock
            );
            return Failure {
                kind: io_err.kind(),
                retryable,
                what: "I/O error".to_owned(),
            };
        }
        cur = e.source();
    }
    // object_store reports statuses it does not map to a variant (5xx, 429,
    // 408, 400, 416, …) as text only: "... status code: 503 Service ...".
    let text = err.to_string();
    if let Some(code) = status_in(&text) {
        let retryable = code >= 500 || code == 429 || code == 408;
        let kind = if retryable {
            io::ErrorKind::Other
        } else {
            io::ErrorKind::InvalidInput
        };
        return Failure {
            kind,
            retryable,
            what: format!("HTTP {code}"),
        };
    }
    Failure {
        kind: io::ErrorKind::Other,
        retryable: false,
        what: "request failed".to_owned(),
    }
}

/// The HTTP status in an object_store error message, if it names one.
fn status_in(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    let digits = text.get(at..at + 3)?;
    let code: u16 = digits.parse().ok()?;
    (100..600).contains(&code).then_some(code)
}

/// Where a dataset's catalog comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Layout {
    /// Every object below a prefix (`""`: the whole bucket), class folders
    /// under it.
    Prefix(String),
    /// A manifest object in the bucket.
    ManifestObject(String),
    /// A manifest file on the local filesystem.
    ManifestFile(std::path::PathBuf),
    /// The shards below a prefix (`format = "webdataset"`, `"mds"`,
    /// `"parquet"`, `"arrow"`).
    Shards(shards::ShardLayout),
}

impl S3Layout {
    /// The layout of a `kind = "s3"`, `"gcs"` or `"azure"` dataset:
    /// `prefix`, or `manifest` (an object key, or `file://PATH` for a local
    /// file); WebDataset shards below `prefix` with `format = "webdataset"`
    /// (S3 only).
    pub fn from_dataset(config: &DatasetConfig) -> Result<S3Layout, S3Error> {
        let shards = config.shards();
        let (prefix, manifest, format) = match config {
            DatasetConfig::S3(d) => (&d.prefix, &d.manifest, d.format),
            DatasetConfig::Gcs(d) => (&d.prefix, &d.manifest, ShardFormat::Files),
            DatasetConfig::Azure(d) => (&d.prefix, &d.manifest, ShardFormat::Files),
            _ => {
                return Err(S3Error::Settings(format!(
                    "dataset {:?} is not in an object store",
                    config.name()
                )))
            }
        };
        match (prefix, manifest) {
            (Some(p), None) => match shards {
                Some(s) if s.format != ShardFormat::Files && format != ShardFormat::Files => {
                    Ok(S3Layout::Shards(shards::ShardLayout {
                        prefix: p.clone(),
                        format: s.format,
                        label_field: s.label_field.to_owned(),
                        sample_field: s.sample_field.to_owned(),
                        wids_index: s
                            .wids_index
                            .lookup()
                            .map(|(name, required)| (name.to_owned(), required)),
                    }))
                }
                _ => Ok(S3Layout::Prefix(p.clone())),
            },
            (None, Some(_)) if format != ShardFormat::Files => Err(S3Error::Settings(format!(
                "dataset {:?}: format = {:?} needs `prefix`, not `manifest`",
                config.name(),
                format.keyword()
            ))),
            (None, Some(m)) => Ok(match m.strip_prefix("file://") {
                Some(path) => S3Layout::ManifestFile(path.into()),
                None => S3Layout::ManifestObject(m.clone()),
            }),
            _ => Err(S3Error::Settings(format!(
                "dataset {:?}: set exactly one of `prefix` and `manifest`",
                config.name()
            ))),
        }
    }
}

/// An object-store dataset source: the client, a tokio runtime on its own
/// threads, and the options of the fetchers it makes.
pub struct S3Source {
    runtime: Arc<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    bucket: Bucket,
    options: FetchOptions,
    /// The shard-index cache and the store's identity in its keys.
    index_cache: Option<(index_cache::ShardIndexCache, String)>,
}

impl fmt::Debug for S3Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Source")
            .field("bucket", &self.bucket)
            .field("store", &self.store.to_string())
            .field("options", &self.options)
            .finish()
    }
}

impl S3Source {
    /// Connects to the bucket of `settings`; fetchers get `capacity`
    /// requests in flight. Nothing is sent until a catalog is listed or a
    /// sample fetched.
    pub fn connect(settings: &S3Settings, capacity: u32) -> Result<S3Source, S3Error> {
        S3Source::connect_store(&StoreSettings::S3(settings.clone()), capacity)
    }

    /// Connects to the bucket or container of any store's `settings`;
    /// fetchers get `capacity` requests in flight.
    pub fn connect_store(settings: &StoreSettings, capacity: u32) -> Result<S3Source, S3Error> {
        let store = settings.build_store()?;
        S3Source::with_store_at(store, settings.bucket(), settings.fetch_options(capacity)).map_err(
            |e| S3Error::Io {
                what: "starting the object-store runtime".to_owned(),
                source: e,
            },
        )
    }

    /// A source over any `ObjectStore` (a wrapped or fault-injecting
    /// client) of an S3 bucket.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        bucket: &str,
        options: FetchOptions,
    ) -> io::Result<S3Source> {
        S3Source::with_store_at(store, Bucket::s3(bucket), options)
    }

    /// A source over any `ObjectStore` holding `bucket`.
    pub fn with_store_at(
        store: Arc<dyn ObjectStore>,
        bucket: Bucket,
        options: FetchOptions,
    ) -> io::Result<S3Source> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.worker_threads.max(1))
            .thread_name("granary-s3")
            .enable_all()
            .build()?;
        Ok(S3Source {
            runtime: Arc::new(runtime),
            store,
            bucket,
            options,
            index_cache: None,
        })
    }

    /// Shard indexes ([`S3Layout::Shards`]) go through `cache`; `store` is
    /// the store's identity in its keys ([`StoreSettings::identity`]).
    pub fn with_index_cache(
        mut self,
        cache: index_cache::ShardIndexCache,
        store: String,
    ) -> S3Source {
        self.index_cache = Some((cache, store));
        self
    }

    /// The client.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The bucket (or container) name.
    pub fn bucket(&self) -> &str {
        &self.bucket.name
    }

    /// The bucket and its store.
    pub fn location(&self) -> &Bucket {
        &self.bucket
    }

    /// The fetch options.
    pub fn options(&self) -> &FetchOptions {
        &self.options
    }

    /// Runs `f` to completion on the source's runtime, blocking the caller
    /// (who must not be on a runtime thread).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Builds the catalog of `layout` (listing or manifest), blocking.
    pub fn catalog(&self, layout: &S3Layout) -> Result<S3Catalog, S3Error> {
        let store = &*self.store;
        let bucket = &self.bucket;
        let cache = self
            .index_cache
            .as_ref()
            .map(|(cache, store)| shards::IndexCacheUse { cache, store });
        self.block_on(async move {
            match layout {
                S3Layout::Prefix(p) => S3Catalog::list(store, bucket, p).await,
                S3Layout::ManifestObject(k) => {
                    S3Catalog::from_manifest_object(store, bucket, k).await
                }
                S3Layout::ManifestFile(f) => S3Catalog::from_manifest_file(store, bucket, f).await,
                S3Layout::Shards(layout) => {
                    let (catalog, stats) =
                        shards::index_dataset(store, bucket, layout, cache).await?;
                    tracing::info!(
                        "{} index of s3://{bucket}/{}: {} samples from {stats}",
                        layout.format.keyword(),
                        layout.prefix,
                        catalog.len()
                    );
                    Ok(catalog)
                }
            }
        })
    }

    /// A fetcher on this source's runtime with the source's options.
    pub fn fetcher(&self) -> io::Result<S3Fetcher> {
        S3Fetcher::new(
            self.runtime.clone(),
            self.store.clone(),
            self.options.clone(),
        )
    }

    /// A fetcher with other options (capacity, timeout, retries) on the
    /// same runtime and client.
    pub fn fetcher_with(&self, options: FetchOptions) -> io::Result<S3Fetcher> {
        S3Fetcher::new(self.runtime.clone(), self.store.clone(), options)
    }
}

/// Runs `op` once, and gives its error with the number of attempts (1).
/// The agent makes one attempt per request: a sample is read again by the
/// engine's retry policy, a dataset whose catalog cannot be read is opened
/// again in the background (`crate::dataset`).
pub(crate) async fn once<T, F, Fut>(op: F) -> Result<T, (object_store::Error, u32)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    op().await.map_err(|e| (e, 1))
}

#[cfg(test)]
mod tests;
