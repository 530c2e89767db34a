//! `kind = "gcs"` and `kind = "azure"` datasets: a Google Cloud Storage
//! bucket or an Azure Blob Storage container, read by the same object-store
//! source as `kind = "s3"` (`crate::source::s3`), each through
//! `object_store`'s own client and credential chain. Each kind is its own
//! struct that rejects the keys of the others, like the kinds of
//! `dataset.rs`.

use super::dataset_kind::dataset_kind;
use super::values::Secret;
use std::path::PathBuf;

dataset_kind! {
    /// A `kind = "gcs"` dataset.
    pub struct GcsConfig {
        @common
        /// `dataset[i].bucket` (required): the bucket.
        pub bucket: String,
        @objects
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
        @remote
    }
}

dataset_kind! {
    /// A `kind = "azure"` dataset.
    pub struct AzureConfig {
        @common
        /// `dataset[i].account` (required): the storage account.
        pub account: String,
        /// `dataset[i].container` (required): the container.
        pub container: String,
        @objects
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
        @remote
    }
}
