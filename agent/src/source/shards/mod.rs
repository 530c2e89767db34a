//! Datasets stored as shards (`format = "webdataset"`): the index of the
//! samples inside a dataset's tar files, built from their headers with
//! ranged reads, without reading the members' data.
//!
//! [`TarWalker`] is the sans-IO part: it says which bytes of a shard it
//! needs next ([`TarWalker::next_read`]) and is fed them
//! ([`TarWalker::feed`]); [`fs`] drives it with `pread` over files and
//! [`s3`] with ranged GETs, several shards at once. Each sample is the
//! byte range from its first member's header to the end of its last
//! member's data (padded to 512 bytes): a tar fragment the loader splits
//! into named fields (`granary_shm::tar::fields`). See `docs/formats.md`.

pub mod fs;
pub mod s3;
mod walker;

pub use walker::{IndexStats, ShardSample, TarWalker, WalkError};

/// Whether `name` (a file name or key) is a shard: it ends in `.tar`.
pub(crate) fn is_shard(name: &str) -> bool {
    name.len() > 4 && name.ends_with(".tar")
}
