//! The object stores the source reads: S3 ([`S3Settings`]), Google Cloud
//! Storage ([`GcsSettings`]) and Azure Blob Storage ([`AzureSettings`]),
//! each through `object_store`'s own client and credential chain.
//! [`StoreSettings`] is any of them: what [`super::S3Source`] connects to
//! and `granary ingest` writes to. Everything after the client (catalog,
//! fetcher, ETags, one attempt per request) is the same for the three.
//!
//! Every client is built with object_store's retries off (the engine's retry
//! policy is the only retry layer) and the same timeouts
//! ([`client_options`]).

use super::{FetchOptions, S3Error, S3Settings};
use crate::config::DatasetConfig;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Which kind of object store a dataset lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// An S3-compatible bucket.
    S3,
    /// A Google Cloud Storage bucket.
    Gcs,
    /// An Azure Blob Storage container.
    Azure,
}

impl StoreKind {
    /// The dataset kind, as the configuration writes it and as the source
    /// reports it (`"s3"`, `"gcs"`, `"azure"`; also part of the dataset
    /// fingerprint).
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::S3 => "s3",
            StoreKind::Gcs => "gcs",
            StoreKind::Azure => "azure",
        }
    }

    /// The URL scheme messages name objects with (`s3`, `gs`, `az`: the
    /// schemes object_store and gsutil/fsspec use).
    pub fn scheme(self) -> &'static str {
        match self {
            StoreKind::S3 => "s3",
            StoreKind::Gcs => "gs",
            StoreKind::Azure => "az",
        }
    }
}

/// A bucket (or container) of a store, printed `scheme://name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The store.
    pub kind: StoreKind,
    /// The bucket's or container's name.
    pub name: String,
}

impl Bucket {
    /// An S3 bucket.
    pub fn s3(name: impl Into<String>) -> Bucket {
        Bucket {
            kind: StoreKind::S3,
            name: name.into(),
        }
    }

    /// The URL of `key` in this bucket, for messages.
    pub fn url_of(&self, key: &str) -> String {
        format!("{self}/{key}")
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.kind.scheme(), self.name)
    }
}

/// How to reach a Google Cloud Storage bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsSettings {
    /// The bucket.
    pub bucket: String,
    /// Base URL of the storage API (an emulator's); `None`:
    /// `GOOGLE_BASE_URL`, else Google's.
    pub endpoint: Option<String>,
    /// A service account's JSON key file; `None`: object_store's chain
    /// (`GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_SERVICE_ACCOUNT_KEY`,
    /// `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application default
    /// credentials, the instance metadata server).
    pub service_account_file: Option<PathBuf>,
    /// Unsigned requests (public buckets, emulators).
    pub anonymous: bool,
    /// Whether an `http://` endpoint is accepted.
    pub allow_http: bool,
    /// Time limit of one request attempt, headers and body.
    pub request_timeout: Duration,
    /// Retries after the first attempt (for `granary ingest`).
    pub retries: u32,
}

impl GcsSettings {
    /// Settings for `bucket` with every default (Google's endpoint, the
    /// credential chain, HTTPS only, 10 s timeout, 8 retries).
    pub fn new(bucket: impl Into<String>) -> GcsSettings {
        GcsSettings {
            bucket: bucket.into(),
            endpoint: None,
            service_account_file: None,
            anonymous: false,
            allow_http: false,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
            retries: super::DEFAULT_RETRIES,
        }
    }

    /// Builds the client: object_store's `GoogleCloudStorageBuilder::from_env`
    /// (the `GOOGLE_*` variables), then these settings over it.
    pub fn build_store(&self) -> Result<Arc<dyn ObjectStore>, S3Error> {
        check_name(&self.bucket, "bucket")?;
        check_endpoint(self.endpoint.as_deref(), self.allow_http)?;
        let mut b = GoogleCloudStorageBuilder::from_env()
            .with_bucket_name(&self.bucket)
            .with_client_options(client_options(self.allow_http, self.request_timeout)?)
            .with_retry(no_retries())
            .with_skip_signature(self.anonymous);
        if let Some(e) = &self.endpoint {
            b = b.with_base_url(e.trim_end_matches('/'));
        }
        if let Some(f) = &self.service_account_file {
            b = b.with_service_account_path(f.to_string_lossy());
        }
        if self.anonymous {
            // object_store leaves reads and listings unsigned with
            // skip_signature, but its uploads still ask the credential
            // provider for a token (the metadata server when nothing else
            // is set): an empty static token keeps them from looking.
            b = b.with_credentials(Arc::new(object_store::StaticCredentialProvider::new(
                object_store::gcp::GcpCredential {
                    bearer: String::new(),
                },
            )));
        }
        let store = b
            .build()
            .map_err(|e| S3Error::Settings(format!("gs://{}: {e}", self.bucket)))?;
        Ok(Arc::new(store))
    }
}

/// How to reach an Azure Blob Storage container.
#[derive(Clone, PartialEq, Eq)]
pub struct AzureSettings {
    /// The storage account.
    pub account: String,
    /// The container.
    pub container: String,
    /// The account's blob service URL (an emulator's:
    /// `http://127.0.0.1:10000/devstoreaccount1`); `None`:
    /// `AZURE_STORAGE_ENDPOINT`, else `https://ACCOUNT.blob.core.windows.net`.
    pub endpoint: Option<String>,
    /// The account's shared key.
    pub access_key: Option<String>,
    /// A shared access signature (query string).
    pub sas_token: Option<String>,
    /// Unsigned requests (public containers).
    pub anonymous: bool,
    /// Whether an `http://` endpoint is accepted.
    pub allow_http: bool,
    /// Time limit of one request attempt, headers and body.
    pub request_timeout: Duration,
    /// Retries after the first attempt (for `granary ingest`).
    pub retries: u32,
}

impl fmt::Debug for AzureSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("AzureSettings")
            .field("account", &self.account)
            .field("container", &self.container)
            .field("endpoint", &self.endpoint)
            .field("access_key", &redact(&self.access_key))
            .field("sas_token", &redact(&self.sas_token))
            .field("anonymous", &self.anonymous)
            .field("allow_http", &self.allow_http)
            .field("request_timeout", &self.request_timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl AzureSettings {
    /// Settings for `container` of `account` with every default.
    pub fn new(account: impl Into<String>, container: impl Into<String>) -> AzureSettings {
        AzureSettings {
            account: account.into(),
            container: container.into(),
            endpoint: None,
            access_key: None,
            sas_token: None,
            anonymous: false,
            allow_http: false,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
            retries: super::DEFAULT_RETRIES,
        }
    }

    /// Builds the client: object_store's `MicrosoftAzureBuilder::from_env`
    /// (the `AZURE_*` variables), then these settings over it.
    pub fn build_store(&self) -> Result<Arc<dyn ObjectStore>, S3Error> {
        if self.account.is_empty() || !self.account.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(S3Error::Settings(format!(
                "{:?} is not a storage account name",
                self.account
            )));
        }
        check_name(&self.container, "container")?;
        check_endpoint(self.endpoint.as_deref(), self.allow_http)?;
        let mut b = MicrosoftAzureBuilder::from_env()
            .with_account(&self.account)
            .with_container_name(&self.container)
            .with_allow_http(self.allow_http)
            .with_client_options(client_options(self.allow_http, self.request_timeout)?)
            .with_retry(no_retries());
        if self.anonymous {
            b = b.with_config("azure_skip_signature".parse().map_err(config_err)?, "true");
        }
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e.trim_end_matches('/').to_owned());
        }
        if let Some(k) = &self.access_key {
            b = b.with_access_key(k);
        }
        if let Some(sas) = &self.sas_token {
            let pairs = object_store::azure::split_sas(sas.trim_start_matches('?'))
                .map_err(|e| S3Error::Settings(format!("sas_token: {e}")))?;
            b = b.with_sas_authorization(pairs);
        }
        let store = b.build().map_err(|e| {
            S3Error::Settings(format!(
                "az://{} (account {}): {e}",
                self.container, self.account
            ))
        })?;
        Ok(Arc::new(store))
    }
}

fn config_err(e: object_store::Error) -> S3Error {
    S3Error::Settings(e.to_string())
}

/// The settings of any of the object stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSettings {
    /// An S3-compatible bucket.
    S3(S3Settings),
    /// A Google Cloud Storage bucket.
    Gcs(GcsSettings),
    /// An Azure Blob Storage container.
    Azure(AzureSettings),
}

impl From<S3Settings> for StoreSettings {
    fn from(s: S3Settings) -> StoreSettings {
        StoreSettings::S3(s)
    }
}

impl From<GcsSettings> for StoreSettings {
    fn from(s: GcsSettings) -> StoreSettings {
        StoreSettings::Gcs(s)
    }
}

impl From<AzureSettings> for StoreSettings {
    fn from(s: AzureSettings) -> StoreSettings {
        StoreSettings::Azure(s)
    }
}

impl StoreSettings {
    /// The settings of a `kind = "s3"`, `"gcs"` or `"azure"` dataset (S3's
    /// completed from the `AWS_*` environment; the others read theirs when
    /// the client is built).
    pub fn from_dataset(ds: &DatasetConfig) -> Result<StoreSettings, S3Error> {
        let ms = |ms: u64| Duration::from_millis(ms);
        Ok(match ds {
            DatasetConfig::S3(_) => StoreSettings::S3(S3Settings::from_dataset(ds)?),
            DatasetConfig::Gcs(d) => StoreSettings::Gcs(GcsSettings {
                bucket: d.bucket.clone(),
                endpoint: d.endpoint.clone(),
                service_account_file: d.service_account_file.clone(),
                anonymous: d.anonymous,
                allow_http: d.allow_http,
                request_timeout: ms(d.request_timeout_ms),
                retries: d.retries,
            }),
            DatasetConfig::Azure(d) => StoreSettings::Azure(AzureSettings {
                account: d.account.clone(),
                container: d.container.clone(),
                endpoint: d.endpoint.clone(),
                access_key: d.access_key.as_ref().map(|k| k.expose().to_owned()),
                sas_token: d.sas_token.as_ref().map(|k| k.expose().to_owned()),
                anonymous: d.anonymous,
                allow_http: d.allow_http,
                request_timeout: ms(d.request_timeout_ms),
                retries: d.retries,
            }),
            _ => {
                return Err(S3Error::Settings(format!(
                    "dataset {:?} is not in an object store",
                    ds.name()
                )))
            }
        })
    }

    /// Which store this is, for the shard-index cache's keys: the kind,
    /// the endpoint and the region or account (no credential).
    pub fn identity(&self) -> String {
        let or_default = |e: &Option<String>| e.clone().unwrap_or_else(|| "default".to_owned());
        match self {
            StoreSettings::S3(s) => format!(
                "s3 endpoint {} region {}",
                or_default(&s.endpoint),
                or_default(&s.region)
            ),
            StoreSettings::Gcs(s) => format!("gcs endpoint {}", or_default(&s.endpoint)),
            StoreSettings::Azure(s) => format!(
                "azure endpoint {} account {}",
                or_default(&s.endpoint),
                s.account
            ),
        }
    }

    /// The kind of store.
    pub fn kind(&self) -> StoreKind {
        match self {
            StoreSettings::S3(_) => StoreKind::S3,
            StoreSettings::Gcs(_) => StoreKind::Gcs,
            StoreSettings::Azure(_) => StoreKind::Azure,
        }
    }

    /// The bucket (or container).
    pub fn bucket(&self) -> Bucket {
        let name = match self {
            StoreSettings::S3(s) => &s.bucket,
            StoreSettings::Gcs(s) => &s.bucket,
            StoreSettings::Azure(s) => &s.container,
        };
        Bucket {
            kind: self.kind(),
            name: name.clone(),
        }
    }

    /// `scheme://bucket/key`, for messages.
    pub fn url_of(&self, key: &str) -> String {
        self.bucket().url_of(key)
    }

    /// Time limit of one request attempt.
    pub fn request_timeout(&self) -> Duration {
        match self {
            StoreSettings::S3(s) => s.request_timeout,
            StoreSettings::Gcs(s) => s.request_timeout,
            StoreSettings::Azure(s) => s.request_timeout,
        }
    }

    /// Sets the time limit of one request attempt.
    pub fn set_request_timeout(&mut self, t: Duration) {
        match self {
            StoreSettings::S3(s) => s.request_timeout = t,
            StoreSettings::Gcs(s) => s.request_timeout = t,
            StoreSettings::Azure(s) => s.request_timeout = t,
        }
    }

    /// Retries after the first attempt (`granary ingest`'s own; the agent
    /// leaves retries to the engine).
    pub fn retries(&self) -> u32 {
        match self {
            StoreSettings::S3(s) => s.retries,
            StoreSettings::Gcs(s) => s.retries,
            StoreSettings::Azure(s) => s.retries,
        }
    }

    /// Sets the retries after the first attempt.
    pub fn set_retries(&mut self, n: u32) {
        match self {
            StoreSettings::S3(s) => s.retries = n,
            StoreSettings::Gcs(s) => s.retries = n,
            StoreSettings::Azure(s) => s.retries = n,
        }
    }

    /// Checks the settings and builds the client.
    pub fn build_store(&self) -> Result<Arc<dyn ObjectStore>, S3Error> {
        match self {
            StoreSettings::S3(s) => s.build_store(),
            StoreSettings::Gcs(s) => s.build_store(),
            StoreSettings::Azure(s) => s.build_store(),
        }
    }

    /// Fetch options for these settings with `capacity` requests in flight.
    pub fn fetch_options(&self, capacity: u32) -> FetchOptions {
        FetchOptions {
            capacity,
            request_timeout: self.request_timeout(),
            ..FetchOptions::default()
        }
    }
}

/// The HTTP client's options for every store: plain HTTP only when allowed,
/// the client's own timeout twice the attempt's (the fetcher enforces the
/// attempt's limit itself; this is the backstop of listings and uploads).
pub(crate) fn client_options(
    allow_http: bool,
    request_timeout: Duration,
) -> Result<ClientOptions, S3Error> {
    if request_timeout.is_zero() {
        return Err(S3Error::Settings(
            "request timeout must be above zero".into(),
        ));
    }
    Ok(ClientOptions::new()
        .with_allow_http(allow_http)
        .with_timeout(request_timeout.saturating_mul(2))
        .with_connect_timeout(request_timeout.min(Duration::from_secs(5)))
        .with_pool_idle_timeout(Duration::from_secs(30)))
}

/// object_store's retries, off.
pub(crate) fn no_retries() -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        retry_timeout: Duration::ZERO,
        ..RetryConfig::default()
    }
}

/// A bucket or container name: non-empty, no `/`.
fn check_name(name: &str, what: &str) -> Result<(), S3Error> {
    if name.is_empty() || name.contains('/') {
        return Err(S3Error::Settings(format!(
            "{what} name {name:?} is empty or contains '/'"
        )));
    }
    Ok(())
}

/// An `http://` (with `allow_http`) or `https://` endpoint.
pub(crate) fn check_endpoint(endpoint: Option<&str>, allow_http: bool) -> Result<(), S3Error> {
    let Some(e) = endpoint else {
        return Ok(());
    };
    let bad = |m: String| Err(S3Error::Settings(m));
    if let Some(rest) = e.strip_prefix("http://") {
        if !allow_http {
            return bad(format!(
                "endpoint {e} is plain HTTP; set allow_http = true to use it (meant for loopback and test servers)"
            ));
        }
        if rest.is_empty() {
            return bad(format!("endpoint {e:?} names no host"));
        }
    } else if !e.starts_with("https://") {
        return bad(format!("endpoint {e:?} is not an http:// or https:// URL"));
    }
    Ok(())
}
