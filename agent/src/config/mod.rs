//! The TOML configuration of `granaryd`.
//!
//! Every field has a documented default, so an empty file plus one
//! `[[dataset]]` is a complete configuration. Unknown keys are rejected, and
//! `Config::validate` checks the relations between settings (timeouts,
//! ring capacities, the arena against the in-flight limit). The reference for
//! operators is `docs/configuration.md`; [`Config::default_toml`] returns the
//! commented default file (`default.toml` beside this module) that
//! `granaryd print-default-config` prints.
//!
//! Module map: `arena`, `socket`, `prefetch` (with the retry settings),
//! `cache`, `sessions`, `metrics`, `peers` and `dataset` hold one section each (their
//! types are re-exported here); `size` the byte-size type; `validate` the rules between
//! settings; `machine` the checks against the machine the agent is to run
//! on (its memory, the peer secret file); `peer_secret` the job secret's strength rule and
//! generator; `document` parses the TOML text keeping positions, so that
//! errors name the field's path and line; `error` the error types.
//!
//! ```
//! use granary_agent::config::Config;
//! let cfg = Config::from_toml_str(r#"
//!     [arena]
//!     size = "1GiB"
//!
//!     [[dataset]]
//!     name = "imagenet"
//!     root = "/data/imagenet/train"
//! "#).unwrap();
//! assert_eq!(cfg.arena.size.bytes(), 1 << 30);
//! assert_eq!(cfg.datasets[0].name(), "imagenet");
//! ```

mod arena;
mod cache;
mod cloud;
mod dataset;
mod dataset_kind;
mod document;
mod error;
mod machine;
mod metrics;
mod mixture;
pub mod peer_secret;
mod peers;
mod prefetch;
mod prepare;
mod secret_files;
mod sessions;
mod size;
mod socket;
mod validate;
mod values;

#[cfg(test)]
mod doc_examples_tests;
#[cfg(test)]
mod field_use_tests;
#[cfg(test)]
pub(crate) mod fuzz_tests;
#[cfg(test)]
mod tests;

pub use arena::{ArenaConfig, HugePages};
pub use cache::{CacheConfig, CachePolicy};
pub use cloud::{AzureConfig, GcsConfig};
pub(crate) use dataset::DatasetLocation;
pub use dataset::{is_cql_name, parse_cql_host};
pub use dataset::{
    CqlConfig, DatasetConfig, DeliveryOrder, FsConfig, S3Config, Secret, ShardFormat,
    ShardSettings, SourceKind, WidsIndex,
};
pub use error::{ConfigError, Problem};
pub use metrics::MetricsConfig;
pub use mixture::{Choose, MixtureConfig, MixtureSource};
pub use peers::{
    CipherSetting, Encryption, MemberConfig, Membership, MembershipSetting, PeersConfig,
    TransportSetting,
};
pub use prefetch::{Balance, PrefetchConfig, RetryOverride, RetrySettings};
pub use prepare::{PrepareConfig, ResizeMode};
pub use sessions::SessionsConfig;
pub use size::ByteSize;
pub use socket::{FileMode, SocketConfig};

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The commented default configuration, compiled into the binary.
const DEFAULT_TOML: &str = include_str!("default.toml");

/// The whole `granaryd` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[arena]`: the shared-memory arena that holds cached samples.
    #[serde(default)]
    pub arena: ArenaConfig,
    /// `[socket]`: the Unix socket loaders connect to, and who may connect.
    #[serde(default)]
    pub socket: SocketConfig,
    /// `[prefetch]`: how far ahead and how hard the fetcher reads, and how
    /// failed reads are retried.
    #[serde(default)]
    pub prefetch: PrefetchConfig,
    /// `[cache]`: what stays in the arena.
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[sessions]`: limits and timeouts of loader sessions.
    #[serde(default)]
    pub sessions: SessionsConfig,
    /// `[metrics]`: the Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[peers]`: the agents of one job sharing their arenas.
    #[serde(default)]
    pub peers: PeersConfig,
    /// `[[dataset]]`: the datasets this agent serves (at least one).
    #[serde(default, rename = "dataset")]
    pub datasets: Vec<DatasetConfig>,
    /// `[[mixture]]`: datasets made of other datasets, each with its share
    /// of every batch (none by default).
    #[serde(default, rename = "mixture")]
    pub mixtures: Vec<MixtureConfig>,
}

impl Config {
    /// The commented default configuration, with one example dataset. It
    /// parses and validates.
    pub fn default_toml() -> &'static str {
        DEFAULT_TOML
    }

    /// Parses and validates a configuration held in memory. Relative paths
    /// are kept as written.
    pub fn from_toml_str(s: &str) -> Result<Config, ConfigError> {
        let (cfg, doc) = Self::parse(s)?;
        cfg.validate().map_err(|e| e.with_lines(&doc))?;
        Ok(cfg)
    }

    /// Reads, parses and validates a configuration file. Relative
    /// `socket.path`, `dataset[i].root` and `dataset[i].manifest` (`fs`) and
    /// `dataset[i].tls_ca_file` (`cql`) are resolved against the directory
    /// holding the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (mut cfg, doc) = Self::parse(&text).map_err(|e| e.with_file(path))?;
        let base = path.parent().unwrap_or(Path::new(""));
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut cfg.socket.path);
        if let Some(p) = cfg.peers.secret_file.as_mut() {
            resolve(p);
        }
        for ds in &mut cfg.datasets {
            match ds {
                DatasetConfig::Fs(fs) => {
                    for p in [&mut fs.root, &mut fs.manifest].into_iter().flatten() {
                        resolve(p);
                    }
                }
                DatasetConfig::Cql(cql) => {
                    if let Some(p) = cql.tls_ca_file.as_mut() {
                        resolve(p);
                    }
                }
                DatasetConfig::Gcs(gcs) => {
                    if let Some(p) = gcs.service_account_file.as_mut() {
                        resolve(p);
                    }
                }
                DatasetConfig::S3(_) | DatasetConfig::Azure(_) => {}
            }
        }
        cfg.validate()
            .map_err(|e| e.with_lines(&doc).with_file(path))?;
        Ok(cfg)
    }

    /// Parses without validating; also returns the document with its
    /// positions, to give validation problems their lines.
    fn parse(text: &str) -> Result<(Config, document::Document), ConfigError> {
        let (mut cfg, doc) = document::parse(text)?;
        cfg.peers.membership = cfg.peers.membership_setting.engine_mode();
        Ok((cfg, doc))
    }

    /// The dataset called `name`, if configured.
    pub fn dataset(&self, name: &str) -> Option<&DatasetConfig> {
        self.datasets.iter().find(|d| d.name() == name)
    }

    /// The mixture called `name`, if configured.
    pub fn mixture(&self, name: &str) -> Option<&MixtureConfig> {
        self.mixtures.iter().find(|m| m.name == name)
    }

    /// The retry settings of `dataset`: `[prefetch]`'s, overridden by the
    /// dataset's `[dataset.retry]` table where it sets a key.
    pub(crate) fn retry_for(&self, dataset: &DatasetConfig) -> RetrySettings {
        let mut over = *dataset.retry();
        if over.read_retries.is_none() {
            over.read_retries = match dataset {
                DatasetConfig::Fs(_) => None,
                DatasetConfig::S3(d) => Some(d.retries),
                DatasetConfig::Cql(d) => Some(d.retries),
                DatasetConfig::Gcs(d) => Some(d.retries),
                DatasetConfig::Azure(d) => Some(d.retries),
            };
        }
        self.prefetch.retry_settings(&over)
    }
}
