//! The index of an S3 dataset's tar shards, read with ranged GETs, several
//! shards at once.

use super::{is_shard, IndexStats, TarWalker};
use crate::source::s3::{classify, Bucket, S3Catalog, S3Entry, S3Error};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStore};

/// Shards walked at once.
pub const PARALLEL_SHARDS: usize = 64;

/// Indexes the `.tar` objects below `prefix` (in the order of the `files`
/// listing), each sample labelled by its `label_ext` member. Every GET of
/// a shard names the ETag of the listing (`If-Match`).
pub(crate) async fn index(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    label_ext: &str,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let listing = S3Catalog::list(store, bucket, prefix).await?;
    let shards: Vec<&S3Entry> = listing
        .entries()
        .iter()
        .filter(|e| is_shard(e.key.filename().unwrap_or("")))
        .collect();
    let walked: Vec<(Vec<super::ShardSample>, IndexStats)> = stream::iter(shards.iter())
        .map(|e| walk(store, bucket, e, label_ext))
        .buffered(PARALLEL_SHARDS)
        .try_collect()
        .await?;
    let mut stats = IndexStats::default();
    let mut entries = Vec::new();
    for (shard, (samples, s)) in shards.iter().zip(walked) {
        stats.add(&s);
        for x in samples {
            entries.push(S3Entry {
                sample_id: entries.len() as u64,
                key: shard.key.clone(),
                label: x.label,
                offset: x.offset,
                size: x.len,
                whole_object: false,
                etag: shard.etag.clone(),
            });
        }
    }
    let location = format!("s3://{bucket}/{}", prefix.trim_matches('/'));
    Ok((
        S3Catalog::finish(bucket, entries, Vec::new(), &location)?,
        stats,
    ))
}

/// Walks one shard's headers.
async fn walk(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    shard: &S3Entry,
    label_ext: &str,
) -> Result<(Vec<super::ShardSample>, IndexStats), S3Error> {
    let url = format!("s3://{bucket}/{}", shard.key);
    let mut walk = TarWalker::new(url.clone(), shard.size, label_ext);
    let mut stats = IndexStats {
        shards: 1,
        shard_bytes: shard.size,
        ..IndexStats::default()
    };
    while let Some((at, len)) = walk.next_read() {
        let opts = GetOptions {
            range: Some(GetRange::Bounded(at..at + len)),
            if_match: shard.etag.as_deref().map(str::to_owned),
            ..GetOptions::default()
        };
        let bytes = async { store.get_opts(&shard.key, opts).await?.bytes().await }
            .await
            .map_err(|source| S3Error::Request {
                what: format!("read {url} bytes {at}..{}", at + len),
                retryable: classify(&source).retryable,
                source,
            })?;
        stats.reads += 1;
        stats.bytes_read += bytes.len() as u64;
        if (bytes.len() as u64) < len {
            return Err(S3Error::Shard(crate::source::shards::WalkError {
                shard: url,
                offset: at,
                reason: format!(
                    "the store returned {} bytes of {len} asked for (the object changed?)",
                    bytes.len()
                ),
            }));
        }
        walk.feed(at, &bytes).map_err(S3Error::Shard)?;
    }
    Ok((walk.into_samples(), stats))
}
