//! `kind = "gcs"` and `kind = "azure"` datasets: a Google Cloud Storage
//! bucket or an Azure Blob Storage container, read by the same object-store
//! source as `kind = "s3"` (`crate::source::s3`), each through
//! `object_store`'s own client and credential chain. Each kind is its own
//! struct that rejects the keys of the others, like the kinds of
//! `dataset.rs`.

use super::prefetch::RetryOverride;
use super::prepare::PrepareConfig;
use super::values::{DeliveryOrder, Secret};
use serde::Deserialize;
use std::path::PathBuf;

/// A `kind = "gcs"` dataset.
#[derive(Clone, PartialEq, Eq, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct GcsConfig {
    /// `dataset[i].name`: see [`super::FsConfig::name`].
    pub name: String,
    /// `dataset[i].order`: see [`super::FsConfig::order`].
    #[serde(default)]
    pub order: DeliveryOrder,
    /// `[dataset.retry]`: this dataset's retry settings.
    #[serde(default)]
    pub retry: RetryOverride,
    /// `[dataset.prepare]`: decode and resize every sample (a JPEG) to one
    /// shape in the agent; unset: the object's bytes. See docs/prepare.md.
    #[serde(default)]
    pub prepare: Option<PrepareConfig>,
    /// `dataset[i].bucket` (required): the bucket.
    pub bucket: String,
    /// `dataset[i].prefix`: the folder whose objects are the samples (class
    /// folders under it); `""` for the whole bucket. Exactly one of
    /// `prefix` and `manifest` must be set.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `dataset[i].manifest`: the key of a manifest object in the bucket, or
    /// `file://PATH` for a local file.
    #[serde(default)]
    pub manifest: Option<String>,
    /// `dataset[i].endpoint`: base URL of the storage API, for emulators
    /// (`"http://127.0.0.1:4443"`). Default: `GOOGLE_BASE_URL`, else
    /// `https://storage.googleapis.com`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `dataset[i].service_account_file`: a service account's JSON key file.
    /// Unset: object_store's chain (`GOOGLE_SERVICE_ACCOUNT`,
    /// `GOOGLE_SERVICE_ACCOUNT_KEY`, `GOOGLE_APPLICATION_CREDENTIALS`,
    /// gcloud's application default credentials, the instance metadata
    /// server).
    #[serde(default)]
    pub service_account_file: Option<PathBuf>,
    /// `dataset[i].anonymous`: send requests unsigned (public buckets,
    /// emulators). Default false.
    #[serde(default)]
    pub anonymous: bool,
    /// `dataset[i].allow_http`: accept an `http://` endpoint. Default false.
    #[serde(default)]
    pub allow_http: bool,
    /// `dataset[i].request_timeout_ms`: see [`super::S3Config::request_timeout_ms`].
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// `dataset[i].retries`: see [`super::S3Config::retries`].
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// `dataset[i].max_inflight`: see [`super::S3Config::max_inflight`].
    #[serde(default)]
    pub max_inflight: Option<u32>,
}

/// A `kind = "azure"` dataset.
#[derive(Clone, PartialEq, Eq, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    /// `dataset[i].name`: see [`super::FsConfig::name`].
    pub name: String,
    /// `dataset[i].order`: see [`super::FsConfig::order`].
    #[serde(default)]
    pub order: DeliveryOrder,
    /// `[dataset.retry]`: this dataset's retry settings.
    #[serde(default)]
    pub retry: RetryOverride,
    /// `[dataset.prepare]`: decode and resize every sample (a JPEG) to one
    /// shape in the agent; unset: the object's bytes. See docs/prepare.md.
    #[serde(default)]
    pub prepare: Option<PrepareConfig>,
    /// `dataset[i].account` (required): the storage account.
    pub account: String,
    /// `dataset[i].container` (required): the container.
    pub container: String,
    /// `dataset[i].prefix`: see [`GcsConfig::prefix`].
    #[serde(default)]
    pub prefix: Option<String>,
    /// `dataset[i].manifest`: see [`GcsConfig::manifest`].
    #[serde(default)]
    pub manifest: Option<String>,
    /// `dataset[i].endpoint`: the account's blob service URL, for emulators
    /// and private endpoints (Azurite: `"http://127.0.0.1:10000/devstoreaccount1"`).
    /// Default: `AZURE_STORAGE_ENDPOINT`, else
    /// `https://ACCOUNT.blob.core.windows.net`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `dataset[i].access_key`: the account's shared key. At most one of
    /// `access_key` and `sas_token`; neither: object_store's chain
    /// (`AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_KEY`, client
    /// secret, workload identity, managed identity).
    #[serde(default)]
    pub access_key: Option<Secret>,
    /// `dataset[i].sas_token`: a shared access signature (the query string,
    /// with or without its leading `?`).
    #[serde(default)]
    pub sas_token: Option<Secret>,
    /// `dataset[i].anonymous`: send requests unsigned (public containers).
    /// Default false.
    #[serde(default)]
    pub anonymous: bool,
    /// `dataset[i].allow_http`: accept an `http://` endpoint. Default false.
    #[serde(default)]
    pub allow_http: bool,
    /// `dataset[i].request_timeout_ms`: see [`super::S3Config::request_timeout_ms`].
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// `dataset[i].retries`: see [`super::S3Config::retries`].
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// `dataset[i].max_inflight`: see [`super::S3Config::max_inflight`].
    #[serde(default)]
    pub max_inflight: Option<u32>,
}

fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_retries() -> u32 {
    8
}
