//! `[cache]`: what stays in the arena.

use serde::Deserialize;

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// `cache.policy`: which sample leaves the arena when space is needed.
    /// Default `clairvoyant`.
    pub policy: CachePolicy,
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
