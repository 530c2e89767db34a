//! The index of an S3 dataset's shards, read with ranged GETs, several
//! shards at once.

use super::index_cache::ShardIndexCache;
use super::{classify, Bucket, S3Catalog, S3Entry, S3Error};
use crate::config::ShardFormat;
use crate::source::shards::arrow::ArrowWalker;
use crate::source::shards::mds::{self, MdsWalker};
use crate::source::shards::parquet::ParquetWalker;
use crate::source::shards::wids::{self, Place};
use crate::source::shards::{
    is_arrow, is_parquet, is_shard, IndexStats, ShardSample, ShardWalk, TarWalker, WalkError,
};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use std::collections::HashMap;

/// Shards walked at once.
pub const PARALLEL_SHARDS: usize = 64;

/// Where an index build keeps and finds each shard's samples
/// ([`ShardIndexCache`]), and what the shards' samples depend on beyond
/// the shard itself: the store, the format and its fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndexCacheUse<'a> {
    pub cache: &'a ShardIndexCache,
    /// The store's identity (kind, endpoint, region or account).
    pub store: &'a str,
}

/// What one shard's walk depends on: the key of its cache entry.
fn cache_key(store: &str, url: &str, size: u64, etag: &str, walk: &str) -> String {
    format!(
        "{store}|{url}|{size}|{etag}|{walk}|walk version {}",
        crate::source::shards::WALK_VERSION
    )
}

/// Walks every object below `prefix` whose name passes `keep` with the
/// walker `walker(url, size)` makes.
async fn index_listed<W: ShardWalk>(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    keep: fn(&str) -> bool,
    cache: Option<(IndexCacheUse<'_>, &str)>,
    walker: impl Fn(String, u64) -> W,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let shards = listed(store, bucket, prefix, keep).await?;
    let walks = shards
        .iter()
        .map(|e| Ok((e, walker(format!("s3://{bucket}/{}", e.key), e.size))));
    walk_all(store, bucket, prefix, walks, IndexStats::default(), cache).await
}

/// Indexes the MDS dataset below `prefix`: its `index.json`, then the
/// shards it lists (their sizes and ETags from a listing of the prefix).
async fn index_mds(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    sample_field: &str,
    label_field: &str,
    cache: Option<(IndexCacheUse<'_>, &str)>,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let index_key = key_in(prefix, crate::source::shards::MDS_INDEX);
    let url = format!("s3://{bucket}/{index_key}");
    let text = get_whole(store, &index_key, &format!("read the MDS index {url}")).await?;
    let stats = IndexStats::one_read(text.len());
    let shards =
        mds::parse_index(&text, &url, sample_field, label_field).map_err(S3Error::Shard)?;
    let all = listed(store, bucket, prefix, |_| true).await?;
    let by_key: HashMap<&str, &S3Entry> = all.iter().map(|e| (e.key.as_ref(), e)).collect();
    let walks = shards.iter().map(|s| {
        let key = key_in(prefix, &s.basename);
        let url = format!("s3://{bucket}/{key}");
        let e = by_key.get(key.as_str()).ok_or_else(|| {
            S3Error::Shard(WalkError::whole(
                url.clone(),
                "listed by index.json, not in the bucket",
            ))
        })?;
        Ok((*e, MdsWalker::new(url, e.size, s).map_err(S3Error::Shard)?))
    });
    walk_all(store, bucket, prefix, walks, stats, cache).await
}

/// The key of `name` (a `/`-separated path) below `prefix`.
fn key_in(prefix: &str, name: &str) -> String {
    match prefix.trim_matches('/') {
        "" => name.to_owned(),
        f => format!("{f}/{name}"),
    }
}

/// The whole object `key` (an index file); `what` says what failed.
async fn get_whole(
    store: &dyn ObjectStore,
    key: &str,
    what: &str,
) -> Result<bytes::Bytes, S3Error> {
    let key = ObjectPath::from(key);
    async { store.get(&key).await?.bytes().await }
        .await
        .map_err(|source| S3Error::Request {
            what: what.to_owned(),
            retryable: classify(&source).retryable,
            source,
        })
}

/// Indexes the `webdataset` dataset below `prefix`: the shards its `wids`
/// index lists when `wids` (the index's name below the prefix, and
/// whether it must exist) finds it in the listing, else every `.tar`
/// object listed. The index's shards must be listed, with the sizes it
/// says, and hold the samples it says once walked.
async fn index_webdataset(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    label_field: &str,
    wids: Option<(&str, bool)>,
    cache: Option<(IndexCacheUse<'_>, &str)>,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let tar = |e: &S3Entry| TarWalker::new(format!("s3://{bucket}/{}", e.key), e.size, label_field);
    let all = listed(store, bucket, prefix, |_| true).await?;
    let index = wids.and_then(|(name, _)| {
        let key = key_in(prefix, name);
        all.iter()
            .find(|e| e.key.as_ref() == key)
            .map(|e| (name, e))
    });
    let Some((name, index)) = index else {
        if let Some((name, true)) = wids {
            return Err(S3Error::Shard(WalkError::whole(
                format!("s3://{bucket}/{}", key_in(prefix, name)),
                "no such object: the wids index that wids_index names is not in the bucket",
            )));
        }
        let walks = all
            .iter()
            .filter(|e| is_shard(e.key.filename().unwrap_or("")))
            .map(|e| Ok((e, tar(e))));
        return walk_all(store, bucket, prefix, walks, IndexStats::default(), cache).await;
    };
    let url = format!("s3://{bucket}/{}", index.key);
    let text = get_whole(
        store,
        index.key.as_ref(),
        &format!("read the wids index {url}"),
    )
    .await?;
    let place = Place::Bucket {
        bucket: &bucket.name,
        prefix: prefix.trim_matches('/'),
    };
    let shards = wids::parse(&text, name, &url, place).map_err(S3Error::Shard)?;
    let by_key: HashMap<&str, &S3Entry> = all.iter().map(|e| (e.key.as_ref(), e)).collect();
    let walks = shards.iter().map(|s| {
        let shard = format!("s3://{bucket}/{}", key_in(prefix, &s.path));
        let e = by_key
            .get(key_in(prefix, &s.path).as_str())
            .ok_or_else(|| {
                S3Error::Shard(WalkError::whole(
                    shard.clone(),
                    format!("listed by the wids index {url}, not in the bucket"),
                ))
            })?;
        wids::check(&url, &shard, s, Some(e.size), None).map_err(S3Error::Shard)?;
        Ok((*e, tar(e)))
    });
    let (catalog, stats) = walk_all(
        store,
        bucket,
        prefix,
        walks,
        IndexStats::one_read(text.len()),
        cache,
    )
    .await?;
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for e in catalog.entries() {
        *counts.entry(e.key.as_ref()).or_default() += 1;
    }
    for s in &shards {
        let key = key_in(prefix, &s.path);
        let n = counts.get(key.as_str()).copied().unwrap_or(0);
        wids::check(&url, &format!("s3://{bucket}/{key}"), s, None, Some(n))
            .map_err(S3Error::Shard)?;
    }
    tracing::info!(
        "webdataset shards of s3://{bucket}/{}: the {} that the wids index {url} lists, in its order",
        prefix.trim_matches('/'),
        shards.len()
    );
    Ok((catalog, stats))
}

/// The objects below `prefix` whose names pass `keep`, in the order of the
/// `files` listing.
async fn listed(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    keep: fn(&str) -> bool,
) -> Result<Vec<S3Entry>, S3Error> {
    let listing = S3Catalog::list(store, bucket, prefix).await?;
    Ok(listing
        .entries()
        .iter()
        .filter(|e| keep(e.key.filename().unwrap_or("")))
        .cloned()
        .collect())
}

/// Runs the walks, [`PARALLEL_SHARDS`] at once, and makes the catalog of
/// their samples in shard order. With a cache (and `walk`, what the
/// samples depend on beyond the shard), a shard whose samples it holds for
/// its ETag is not walked, and every shard walked is kept in it.
async fn walk_all<'a, W: ShardWalk>(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
    walks: impl Iterator<Item = Result<(&'a S3Entry, W), S3Error>>,
    mut stats: IndexStats,
    cache: Option<(IndexCacheUse<'_>, &str)>,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let walks: Vec<(&S3Entry, W)> = walks.collect::<Result<_, _>>()?;
    let shards: Vec<&S3Entry> = walks.iter().map(|(e, _)| *e).collect();
    let key = |e: &S3Entry| {
        let (c, walk) = cache?;
        let etag = e.etag.as_deref()?;
        let url = format!("s3://{bucket}/{}", e.key);
        Some((c.cache, cache_key(c.store, &url, e.size, etag, walk)))
    };
    let walked: Vec<(Vec<ShardSample>, IndexStats)> = stream::iter(walks)
        .map(|(e, w)| {
            let key = key(e);
            async move {
                if let Some(samples) = key.as_ref().and_then(|(c, k)| c.get(k, e.size)) {
                    let cached = IndexStats {
                        shards: 1,
                        shard_bytes: e.size,
                        cached: 1,
                        ..IndexStats::default()
                    };
                    return Ok((samples, cached));
                }
                let (samples, stats) = walk(store, bucket, e, w).await?;
                if let Some((c, k)) = &key {
                    c.put(k, &samples);
                }
                Ok((samples, stats))
            }
        })
        .buffered(PARALLEL_SHARDS)
        .try_collect()
        .await?;
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

/// Walks one shard with ranged GETs naming its ETag.
async fn walk<W: ShardWalk>(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    shard: &S3Entry,
    mut walk: W,
) -> Result<(Vec<ShardSample>, IndexStats), S3Error> {
    let url = format!("s3://{bucket}/{}", shard.key);
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
            return Err(S3Error::Shard(WalkError::at(
                url,
                at,
                format!(
                    "the store returned {} bytes of {len} asked for (the object changed?)",
                    bytes.len()
                ),
            )));
        }
        walk.feed(at, &bytes).map_err(S3Error::Shard)?;
    }
    Ok((walk.into_samples(), stats))
}

/// What an S3 dataset's shard index is built from: its prefix and shard
/// settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// The prefix.
    pub prefix: String,
    /// The shards' format.
    pub format: ShardFormat,
    /// The label members' extension or the label column.
    pub label_field: String,
    /// The sample column (`mds`, `parquet`, `arrow`).
    pub sample_field: String,
    /// The `wids` index to look for below the prefix, and whether it must
    /// exist (`webdataset`).
    pub wids_index: Option<(String, bool)>,
}

/// The index of the shards `layout` describes (not `files`), through
/// `cache` when given.
pub(crate) async fn index_dataset(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    layout: &ShardLayout,
    cache: Option<IndexCacheUse<'_>>,
) -> Result<(S3Catalog, IndexStats), S3Error> {
    let (prefix, format) = (layout.prefix.as_str(), layout.format);
    let (sample_field, label_field) = (layout.sample_field.as_str(), layout.label_field.as_str());
    let walk = format!(
        "{} sample {sample_field:?} label {label_field:?}",
        format.keyword()
    );
    let cache = cache.map(|c| (c, walk.as_str()));
    match format {
        ShardFormat::Mds => {
            index_mds(store, bucket, prefix, sample_field, label_field, cache).await
        }
        // The `.parquet` objects below `prefix`, in the order of the
        // `files` listing.
        ShardFormat::Parquet => {
            index_listed(store, bucket, prefix, is_parquet, cache, |url, size| {
                ParquetWalker::new(url, size, sample_field, label_field)
            })
            .await
        }
        // The `.arrow` (`.arrows`, `.feather`) objects below `prefix`, in
        // the order of the `files` listing.
        ShardFormat::Arrow => {
            index_listed(store, bucket, prefix, is_arrow, cache, |url, size| {
                ArrowWalker::new(url, size, sample_field, label_field)
            })
            .await
        }
        // The `.tar` objects the wids index lists, or below `prefix` in
        // the order of the `files` listing, each sample labelled by its
        // `label_field` member. Every GET of a shard names the ETag of
        // the listing (`If-Match`).
        ShardFormat::Webdataset | ShardFormat::Files => {
            let wids = layout.wids_index.as_ref().map(|(n, r)| (n.as_str(), *r));
            index_webdataset(store, bucket, prefix, label_field, wids, cache).await
        }
    }
}
