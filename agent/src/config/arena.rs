//! `[arena]`: the shared-memory arena that holds cached samples.

use super::size::{ByteSize, GIB, MIB};
use serde::Deserialize;

/// Smallest accepted arena.
pub(crate) const MIN_ARENA_BYTES: u64 = 64 * MIB;
/// Arena bytes reserved per in-flight read by the static "window fits the
/// arena" rule: `arena.size ≥ prefetch.max_inflight_reads × 1 MiB`.
pub(crate) const ARENA_BYTES_PER_INFLIGHT_READ: u64 = MIB;
/// The arena size must be a multiple of this (the x86-64 huge page size).
pub(crate) const ARENA_GRANULE: u64 = 2 * MIB;

/// `[arena]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArenaConfig {
    /// `arena.size`: total arena bytes. Default 4 GiB. An integer (bytes) or
    /// a string such as `"2GiB"` or `"512MiB"`; a multiple of 2 MiB, at least
    /// 64 MiB and at least `prefetch.max_inflight_reads × 1 MiB`.
    pub size: ByteSize,
    /// `arena.hugepages`: whether the arena uses huge pages. Default `try`.
    pub hugepages: HugePages,
    /// `arena.populate`: fault every arena page in at start-up, so the first
    /// epoch does not pay for page faults and a short memory reservation
    /// fails at once instead of later. Default `true`.
    pub populate: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            size: ByteSize(4 * GIB),
            hugepages: HugePages::Try,
            populate: true,
        }
    }
}

/// `arena.hugepages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    /// `"off"`: 4 KiB pages.
    Off,
    /// `"try"` (alias `"on"`): huge pages when the kernel has enough reserved,
    /// otherwise 4 KiB pages with a warning in the log. The default.
    #[default]
    #[serde(alias = "on")]
    Try,
    /// `"required"`: huge pages or refuse to start.
    Required,
}
