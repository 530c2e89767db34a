//! Datasets stored as shards (`format = "webdataset"`, `"mds"`,
//! `"parquet"`, `"arrow"`): the index of the samples inside a dataset's shards, built
//! from their headers with ranged reads, without reading the samples' data.
//!
//! Each format has a sans-IO walk ([`ShardWalk`]): it says which bytes of
//! a shard it needs next and is fed them. [`TarWalker`] walks tar headers
//! (a sample is the byte range from its first member's header to the end
//! of its last member's data: a tar fragment the loader splits into named
//! fields, `granary_shm::tar::fields`); [`mds::MdsWalker`] reads an MDS
//! shard's offset table and each record's column sizes (a sample is one
//! column's value); [`parquet::ParquetWalker`] reads a Parquet file's
//! footer and page headers (a sample is one binary value);
//! [`arrow::ArrowWalker`] reads an Arrow IPC file's messages and each
//! record batch's offsets and labels (a sample is one binary value). [`fs`] drives
//! the walks with `pread` over files and [`s3`] with ranged GETs, several
//! shards at once. See `docs/formats.md`.

pub mod arrow;
mod flatbuf;
pub mod mds;
pub mod parquet;
mod thrift;
mod walker;
pub mod wids;

pub use walker::{IndexStats, ShardSample, TarWalker, WalkError};

/// The sans-IO walk of one shard.
pub trait ShardWalk {
    /// The next read, `(offset, len)` within the shard, `len` at most the
    /// rest of the shard; `None` when the walk is done.
    fn next_read(&self) -> Option<(u64, u64)>;
    /// Takes `data`, the bytes of the shard at `at` (what
    /// [`next_read`](Self::next_read) asked for).
    fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError>;
    /// The samples found, in shard order.
    fn into_samples(self) -> Vec<ShardSample>;
}

/// The walks' version: part of every shard-index cache key
/// (`source::s3::index_cache`), raised whenever a walk's samples for the
/// same bytes would differ, so that no file of an older walk is used.
pub const WALK_VERSION: u32 = 1;

/// Checks that `data`, read at `at` from `file`, is the read `want` the
/// walk asked for (at least as long).
pub(crate) fn check_read(
    file: &str,
    want: Option<(u64, u64)>,
    at: u64,
    data: &[u8],
) -> Result<(), WalkError> {
    match want {
        Some((a, n)) if a == at && data.len() as u64 >= n => Ok(()),
        want => Err(WalkError::at(
            file,
            at,
            format!("read {} bytes at {at}, the walk wants {want:?}", data.len()),
        )),
    }
}

/// Whether `name` (a file name or key) is a tar shard: it ends in `.tar`.
pub(crate) fn is_shard(name: &str) -> bool {
    name.len() > 4 && name.ends_with(".tar")
}

/// Whether `name` is a Parquet file: it ends in `.parquet`.
pub(crate) fn is_parquet(name: &str) -> bool {
    name.len() > 8 && name.ends_with(".parquet")
}

/// Whether `name` is an Arrow IPC file: it ends in `.arrow` (Hugging Face
/// `datasets`), `.arrows` or `.feather`.
pub(crate) fn is_arrow(name: &str) -> bool {
    [".arrow", ".arrows", ".feather"]
        .iter()
        .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// The next read's length in the walks of MDS and Parquet shards, after
/// a read of `chunk` bytes that left `gap` bytes unread before the next
/// sample's head: a read that skipped more than a read's worth (over a
/// sample's data) is followed by [`SMALL_READ`]; one that did not, by one
/// twice as large, up to [`walker::LARGE_READ`]. Large samples thus take
/// one small read each, small ones a few large reads in all.
pub(crate) fn next_chunk(chunk: u64, gap: u64) -> u64 {
    if gap > chunk {
        SMALL_READ
    } else {
        (chunk * 2).min(walker::LARGE_READ)
    }
}

/// The small read of MDS and Parquet walks: a record's head and label, a
/// page header and a value's length (a longer head is read again whole).
pub const SMALL_READ: u64 = 512;

/// The name of the MDS index file in a dataset's root or prefix.
pub const MDS_INDEX: &str = "index.json";
