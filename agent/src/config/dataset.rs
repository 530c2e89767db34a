//! `[[dataset]]`: one table per dataset, its keys set by its `kind` (`fs`,
//! the default, `s3`, `gcs`, `azure` or `cql`). Each kind is its own struct
//! that rejects the keys of the others (`gcs` and `azure` in `cloud.rs`).

use super::cloud::{AzureConfig, GcsConfig};
use super::dataset_kind::dataset_kind;
use super::prefetch::RetryOverride;
use super::prepare::PrepareConfig;
pub use super::values::{DeliveryOrder, Secret};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Longest dataset name, in bytes.
pub(crate) const MAX_DATASET_NAME_BYTES: usize = 255;
/// Largest `dataset[i].retries`.
pub(crate) const MAX_REMOTE_RETRIES: u32 = 100;
/// Largest `dataset[i].max_inflight`.
pub(crate) const MAX_REMOTE_INFLIGHT: u32 = 32768;
/// Largest `dataset[i].connections_per_host` / `connections_per_shard`.
pub(crate) const MAX_CQL_CONNECTIONS: u32 = 64;

/// One `[[dataset]]`, by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DatasetConfig {
    /// `kind = "fs"` (the default): a local or network filesystem.
    Fs(FsConfig),
    /// `kind = "s3"`: an S3-compatible bucket.
    S3(S3Config),
    /// `kind = "cql"`: ScyllaDB or Cassandra tables.
    Cql(CqlConfig),
    /// `kind = "gcs"`: a Google Cloud Storage bucket.
    Gcs(GcsConfig),
    /// `kind = "azure"`: an Azure Blob Storage container.
    Azure(AzureConfig),
}

/// `dataset[i].kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// `"fs"`: a local or network filesystem. The default.
    #[default]
    Fs,
    /// `"s3"`: an S3-compatible bucket.
    S3,
    /// `"cql"`: ScyllaDB or Cassandra tables.
    Cql,
    /// `"gcs"`: a Google Cloud Storage bucket.
    Gcs,
    /// `"azure"`: an Azure Blob Storage container.
    Azure,
}

impl SourceKind {
    /// The name written in the configuration: `"fs"`, `"s3"`, `"cql"`,
    /// `"gcs"` or `"azure"`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SourceKind::Fs => "fs",
            SourceKind::S3 => "s3",
            SourceKind::Cql => "cql",
            SourceKind::Gcs => "gcs",
            SourceKind::Azure => "azure",
        }
    }
}

/// `dataset[i].format`: how a dataset's samples lie in its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardFormat {
    /// `"files"`: one file (or object) per sample. The default.
    #[default]
    Files,
    /// `"webdataset"`: tar shards; the members of one key are one sample.
    Webdataset,
    /// `"mds"`: Mosaic streaming shards (`index.json`); one column of a
    /// record is the sample.
    Mds,
    /// `"parquet"`: Parquet files; one binary column of a row is the sample.
    Parquet,
    /// `"arrow"`: Arrow IPC files (Hugging Face `datasets`' `.arrow`); one
    /// binary column of a row is the sample.
    Arrow,
}

impl ShardFormat {
    /// The name in the configuration.
    pub fn keyword(self) -> &'static str {
        match self {
            ShardFormat::Files => "files",
            ShardFormat::Webdataset => "webdataset",
            ShardFormat::Mds => "mds",
            ShardFormat::Parquet => "parquet",
            ShardFormat::Arrow => "arrow",
        }
    }

    /// Whether the format's samples are columns (`sample_field` applies).
    pub fn has_columns(self) -> bool {
        matches!(
            self,
            ShardFormat::Mds | ShardFormat::Parquet | ShardFormat::Arrow
        )
    }
}

/// Default `dataset[i].label_field` of a `webdataset` dataset.
pub(crate) const DEFAULT_LABEL_FIELD: &str = "cls";
/// Default `dataset[i].label_field` of an `mds`, `parquet` or `arrow` dataset.
pub(crate) const DEFAULT_LABEL_COLUMN: &str = "label";
/// Default `dataset[i].sample_field` of an `mds`, `parquet` or `arrow`
/// dataset.
pub(crate) const DEFAULT_SAMPLE_COLUMN: &str = "sample";

/// A dataset's shard settings, defaulted ([`DatasetConfig::shards`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSettings<'a> {
    /// `format`.
    pub format: ShardFormat,
    /// `label_field`: the label member's extension (`webdataset`) or the
    /// label column (`mds`, `parquet`, `arrow`).
    pub label_field: &'a str,
    /// `sample_field`: the sample column (`mds`, `parquet`, `arrow`).
    pub sample_field: &'a str,
    /// `wids_index`: where a `webdataset` dataset's shard list is looked
    /// for ([`WidsIndex::Off`] for the other formats).
    pub wids_index: WidsIndex<'a>,
}

/// `dataset[i].wids_index`, defaulted: the `wids` shard index that gives a
/// `webdataset` dataset its shards (`source::shards::wids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WidsIndex<'a> {
    /// `""`, or a format other than `webdataset`: the shards are the
    /// `.tar` files listed.
    Off,
    /// Unset: this file (`shardindex.json`) in the root or prefix when it
    /// is there, else the `.tar` files listed.
    IfPresent(&'a str),
    /// Set: this file in the root or prefix, which must exist.
    Required(&'a str),
}

impl<'a> WidsIndex<'a> {
    /// The file to look for, and whether it must exist; `None`: none.
    pub fn lookup(self) -> Option<(&'a str, bool)> {
        match self {
            WidsIndex::Off => None,
            WidsIndex::IfPresent(name) => Some((name, false)),
            WidsIndex::Required(name) => Some((name, true)),
        }
    }
}

/// The default `dataset[i].wids_index`: the name `widsindex create` writes.
pub(crate) const DEFAULT_WIDS_INDEX: &str = "shardindex.json";

dataset_kind! {
    /// A `kind = "fs"` dataset.
    pub struct FsConfig {
        @common
        /// `dataset[i].root`: a directory tree with one folder per class.
        /// Exactly one of `root` and `manifest` must be set.
        #[serde(default)]
        pub root: Option<PathBuf>,
        /// `dataset[i].manifest`: a file listing `path<TAB>label` per line.
        #[serde(default)]
        pub manifest: Option<PathBuf>,
        /// `dataset[i].direct_io`: read the files with `O_DIRECT`, straight
        /// from the device into the arena in whole 4 KiB blocks, bypassing the
        /// page cache (`true`), or through the page cache (`false`). Unset
        /// (the default): `O_DIRECT` for a `format = "files"` dataset whose
        /// files are mostly not in the page cache when it is opened (a sample
        /// of them is probed), buffered otherwise; shard formats and the
        /// members of a mixture read buffered. A filesystem that refuses
        /// `O_DIRECT` gets buffered reads, said once in the log. See
        /// docs/fetcher.md.
        #[serde(default)]
        pub direct_io: Option<bool>,
        @shards
    }
}

dataset_kind! {
    /// A `kind = "s3"` dataset.
    pub struct S3Config {
        @common
        /// `dataset[i].bucket` (required): the bucket.
        pub bucket: String,
        @objects
        /// `dataset[i].endpoint`: base URL of the S3 API, e.g.
        /// `"http://127.0.0.1:8333"`. Default: `AWS_ENDPOINT_URL`, else AWS.
        #[serde(default)]
        pub endpoint: Option<String>,
        /// `dataset[i].region`: signing region. Default: `AWS_REGION`, else
        /// `us-east-1`.
        #[serde(default)]
        pub region: Option<String>,
        /// `dataset[i].access_key_id`: with `secret_access_key`; both unset:
        /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
        #[serde(default)]
        pub access_key_id: Option<String>,
        /// `dataset[i].secret_access_key`: see `access_key_id`.
        #[serde(default)]
        pub secret_access_key: Option<Secret>,
        /// `dataset[i].path_style`: path-style addressing
        /// (`endpoint/bucket/key`). Default true.
        #[serde(default = "yes")]
        pub path_style: bool,
        @remote
        @shards
    }
}

dataset_kind! {
    /// A `kind = "cql"` dataset.
    pub struct CqlConfig {
        @common
        /// `dataset[i].hosts` (required): contact points, `"host:port"` (port
        /// 9042 when left out; IPv6 as `"[::1]:9042"`). The driver learns the
        /// rest of the cluster from them.
        pub hosts: Vec<String>,
        /// `dataset[i].keyspace` (required): the keyspace of both tables.
        pub keyspace: String,
        /// `dataset[i].data_table`: `(id uuid PRIMARY KEY, data blob, …)`.
        /// Default `"data"`.
        #[serde(default = "default_data_table")]
        pub data_table: String,
        /// `dataset[i].metadata_table`: `(id uuid PRIMARY KEY, label int, size
        /// int)`. Default `"metadata"`.
        #[serde(default = "default_metadata_table")]
        pub metadata_table: String,
        /// `dataset[i].username`: password authentication; the password is
        /// `password`, else `GRANARY_CQL_PASSWORD` from the environment.
        #[serde(default)]
        pub username: Option<String>,
        /// `dataset[i].password`: see `username`.
        #[serde(default)]
        pub password: Option<Secret>,
        /// `dataset[i].tls`: connect with TLS. Default false.
        #[serde(default)]
        pub tls: bool,
        /// `dataset[i].tls_ca_file` (with `tls = true`): PEM file of the
        /// certificate authorities to trust instead of the system's.
        #[serde(default)]
        pub tls_ca_file: Option<PathBuf>,
        /// `dataset[i].connections_per_host`: connections to each node.
        /// Default: one per shard (ScyllaDB), one per node (Cassandra).
        #[serde(default)]
        pub connections_per_host: Option<u32>,
        /// `dataset[i].connections_per_shard`: connections to each shard of
        /// each ScyllaDB node (a Cassandra node counts as one shard).
        #[serde(default)]
        pub connections_per_shard: Option<u32>,
        /// `dataset[i].max_inflight`: sample reads in flight at once for this
        /// dataset. Default 2048, at most 32768.
        #[serde(default = "default_cql_max_inflight")]
        pub max_inflight: u32,
        /// `dataset[i].request_timeout_ms`: one read must finish within this.
        /// Default 10000.
        #[serde(default = "super::dataset_kind::default_request_timeout_ms")]
        pub request_timeout_ms: u64,
        /// `dataset[i].retries`: retries of a failed sample read (overload,
        /// unavailable and read timeouts), with exponential backoff and jitter:
        /// this dataset's `read_retries` unless `[dataset.retry]` sets one.
        /// Default 8, at most 100.
        #[serde(default = "super::dataset_kind::default_remote_retries")]
        pub retries: u32,
    }
}

fn yes() -> bool {
    true
}
fn default_data_table() -> String {
    "data".to_owned()
}
fn default_metadata_table() -> String {
    "metadata".to_owned()
}
fn default_cql_max_inflight() -> u32 {
    2048
}

impl DatasetConfig {
    /// `dataset[i].name`.
    pub fn name(&self) -> &str {
        match self {
            DatasetConfig::Fs(d) => &d.name,
            DatasetConfig::S3(d) => &d.name,
            DatasetConfig::Cql(d) => &d.name,
            DatasetConfig::Gcs(d) => &d.name,
            DatasetConfig::Azure(d) => &d.name,
        }
    }

    /// `dataset[i].kind`.
    pub(crate) fn kind(&self) -> SourceKind {
        match self {
            DatasetConfig::Fs(_) => SourceKind::Fs,
            DatasetConfig::S3(_) => SourceKind::S3,
            DatasetConfig::Cql(_) => SourceKind::Cql,
            DatasetConfig::Gcs(_) => SourceKind::Gcs,
            DatasetConfig::Azure(_) => SourceKind::Azure,
        }
    }

    /// `dataset[i].order`.
    pub(crate) fn order(&self) -> DeliveryOrder {
        match self {
            DatasetConfig::Fs(d) => d.order,
            DatasetConfig::S3(d) => d.order,
            DatasetConfig::Cql(d) => d.order,
            DatasetConfig::Gcs(d) => d.order,
            DatasetConfig::Azure(d) => d.order,
        }
    }

    /// `[dataset.retry]`.
    pub(crate) fn retry(&self) -> &RetryOverride {
        match self {
            DatasetConfig::Fs(d) => &d.retry,
            DatasetConfig::S3(d) => &d.retry,
            DatasetConfig::Cql(d) => &d.retry,
            DatasetConfig::Gcs(d) => &d.retry,
            DatasetConfig::Azure(d) => &d.retry,
        }
    }

    /// `[dataset.prepare]`.
    pub fn prepare(&self) -> Option<&PrepareConfig> {
        match self {
            DatasetConfig::Fs(d) => d.prepare.as_ref(),
            DatasetConfig::S3(d) => d.prepare.as_ref(),
            DatasetConfig::Cql(d) => d.prepare.as_ref(),
            DatasetConfig::Gcs(d) => d.prepare.as_ref(),
            DatasetConfig::Azure(d) => d.prepare.as_ref(),
        }
    }
}

/// Where a filesystem dataset's samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DatasetLocation<'a> {
    /// A directory tree of class folders.
    Root(&'a Path),
    /// A manifest file.
    Manifest(&'a Path),
}

impl FsConfig {
    /// The dataset's location, or `None` unless exactly one of `root` and
    /// `manifest` is set (which validation reports).
    pub(crate) fn location(&self) -> Option<DatasetLocation<'_>> {
        match (&self.root, &self.manifest) {
            (Some(r), None) => Some(DatasetLocation::Root(r)),
            (None, Some(m)) => Some(DatasetLocation::Manifest(m)),
            _ => None,
        }
    }
}

impl DatasetConfig {
    /// `dataset[i].format`, `label_field` and `sample_field` (defaulted):
    /// `None` for kinds without shards (`cql`, `gcs`, `azure`).
    pub(crate) fn shards(&self) -> Option<ShardSettings<'_>> {
        let (format, label, sample, wids) = match self {
            DatasetConfig::Fs(d) => (d.format, &d.label_field, &d.sample_field, &d.wids_index),
            DatasetConfig::S3(d) => (d.format, &d.label_field, &d.sample_field, &d.wids_index),
            DatasetConfig::Cql(_) | DatasetConfig::Gcs(_) | DatasetConfig::Azure(_) => return None,
        };
        let default_label = if format.has_columns() {
            DEFAULT_LABEL_COLUMN
        } else {
            DEFAULT_LABEL_FIELD
        };
        Some(ShardSettings {
            format,
            label_field: label.as_deref().unwrap_or(default_label),
            sample_field: sample.as_deref().unwrap_or(DEFAULT_SAMPLE_COLUMN),
            wids_index: match wids.as_deref() {
                _ if format != ShardFormat::Webdataset => WidsIndex::Off,
                None => WidsIndex::IfPresent(DEFAULT_WIDS_INDEX),
                Some("") => WidsIndex::Off,
                Some(name) => WidsIndex::Required(name),
            },
        })
    }
}

/// Whether `name` is a CQL name Granary accepts for a keyspace or table:
/// 1 to 48 characters, lowercase ASCII letters, digits and `_`, starting
/// with a letter — the names CQL takes unquoted and unchanged.
pub fn is_cql_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=48).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Splits a `dataset[i].hosts` entry into host and port: `"host:port"`,
/// `"host"` (port 9042), `"[v6]:port"` or `"[v6]"`.
pub fn parse_cql_host(entry: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{entry:?}: '[' without ']'"))?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("{entry:?}: expected ':' after ']'"))?,
                ),
            ),
        }
    } else {
        match entry.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(format!(
                    "{entry:?}: write an IPv6 address in brackets, e.g. \"[::1]:9042\""
                ))
            }
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!("{entry:?} names no host"));
    }
    let port = match port {
        None => 9042,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{entry:?}: {p:?} is not a port (1..=65535)"))?,
    };
    Ok((host.to_owned(), port))
}
