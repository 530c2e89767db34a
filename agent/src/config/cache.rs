//! `[cache]`: what stays in the arena.

use serde::Deserialize;
use std::path::PathBuf;

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// `cache.policy`: which sample leaves the arena when space is needed.
    /// Default `clairvoyant`.
    pub policy: CachePolicy,
    /// `cache.shard_index_dir`: where the index of each object-store shard
    /// (`format` other than `"files"` on `s3`, `gcs`, `azure`) is kept, by
    /// its ETag, so that the dataset opens again without walking the
    /// shards that did not change. Unset: `$XDG_CACHE_HOME/granary/shard-index`,
    /// else `$HOME/.cache/granary/shard-index`, else none; `""`: none.
    pub shard_index_dir: Option<PathBuf>,
}

impl CacheConfig {
    /// The shard-index folder in force (see `shard_index_dir`), `None` for
    /// none.
    pub fn shard_index_dir(&self) -> Option<PathBuf> {
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        match &self.shard_index_dir {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => env("XDG_CACHE_HOME")
                .or_else(|| env("HOME").map(|h| h.join(".cache")))
                .map(|c| c.join("granary").join("shard-index")),
        }
    }
}

/// `cache.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// `"clairvoyant"`: evict the sample whose next use, in the sessions'
    /// known futures, is furthest away (Belady). The default.
    #[default]
    Clairvoyant,
    /// `"minio"`: fill the arena once and never evict (CoorDL's MinIO).
    Minio,
    /// `"lru"`: evict the least recently used sample.
    Lru,
}
