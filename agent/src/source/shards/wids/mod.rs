//! `wids` shard indexes (the JSON that `widsindex create` writes), read as
//! `wids.ShardListDataset` reads them, sans IO.
//!
//! ```json
//! {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
//!  "shardlist": [{"url": "shard-000000.tar", "nsamples": 100, "filesize": 11468800,
//!                 "md5sum": "…"}, …]}
//! ```
//!
//! A `webdataset` dataset whose root or prefix holds such an index
//! (`dataset[i].wids_index`, default `shardindex.json`) takes its shards
//! from it, in its order, so that sample `i` is `ShardListDataset`'s item
//! `i`. Each shard's `filesize` is checked before it is walked and its
//! `nsamples` after: a stale index fails the dataset, naming the shard and
//! both counts. The index holds no member offsets, so the tar headers are
//! still walked (`TarWalker`).
//!
//! URLs resolve as `wids` resolves them: a relative one against the
//! index's folder (a top-level `base` is not used, as `ShardListDataset`
//! does not use it), a `datasets` component's shards against its own
//! `base`. Only shards inside the dataset's own root (a path, `file://`)
//! or bucket and prefix (`s3://bucket/key`, `/key`) are accepted; a
//! component by `source_url` (another index file) is refused.

use super::WalkError;
use serde::Deserialize;
use std::collections::HashSet;

/// Where the dataset's shards lie, for URLs that are not relative.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// A filesystem dataset's root.
    Root(&'a str),
    /// An S3 dataset's bucket and prefix.
    Bucket {
        /// The bucket.
        bucket: &'a str,
        /// The prefix (without leading or trailing `/`).
        prefix: &'a str,
    },
}

/// One shard of a `wids` index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WidsShard {
    /// Its URL as the index writes it.
    pub url: String,
    /// Its path relative to the dataset's root or prefix (`/`-separated).
    pub path: String,
    /// Its samples, as the index says.
    pub nsamples: u64,
    /// Its size in bytes, where the index says.
    pub filesize: Option<u64>,
}

#[derive(Deserialize)]
struct IndexFile {
    #[serde(rename = "__kind__")]
    kind: Option<String>,
    wids_version: Option<serde_json::Value>,
    #[serde(default)]
    shardlist: Vec<ShardEntry>,
    #[serde(default)]
    datasets: Vec<Component>,
}

#[derive(Deserialize)]
struct Component {
    source_url: Option<String>,
    base: Option<String>,
    #[serde(default)]
    shardlist: Vec<ShardEntry>,
}

#[derive(Deserialize)]
struct ShardEntry {
    url: String,
    nsamples: u64,
    filesize: Option<u64>,
}

/// Reads the index `text`, found at `index_path` (relative to the
/// dataset's root or prefix; `what`, its path or URL, names it in
/// errors): its shards in order, the top-level `shardlist` first, then
/// each component's.
pub fn parse(
    text: &[u8],
    index_path: &str,
    what: &str,
    place: Place<'_>,
) -> Result<Vec<WidsShard>, WalkError> {
    let bad = |reason: String| WalkError::whole(what, reason);
    let index: IndexFile =
        serde_json::from_slice(text).map_err(|e| bad(format!("not a wids shard index: {e}")))?;
    if let Some(kind) = index.kind.as_deref() {
        if kind != "wids-shard-index-v1" {
            return Err(bad(format!(
                "__kind__ is {kind:?}, not \"wids-shard-index-v1\""
            )));
        }
    }
    match &index.wids_version {
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => return Err(bad(format!("wids_version {v} (only 1 is known)"))),
        None => return Err(bad("no wids_version (wids requires 1)".into())),
    }
    let folder = parent(index_path);
    let mut lists = vec![(folder.to_owned(), index.shardlist)];
    for (i, c) in index.datasets.into_iter().enumerate() {
        if let Some(source) = c.source_url {
            return Err(bad(format!(
                "datasets[{i}] refers to another index ({source}): it is not read; put its \
                 shardlist in this index"
            )));
        }
        let base = match c.base {
            Some(b) => resolve(&b, folder, place)
                .map_err(|e| bad(format!("datasets[{i}].base {b:?}: {e}")))?,
            None => folder.to_owned(),
        };
        lists.push((base, c.shardlist));
    }
    let mut seen = HashSet::new();
    let mut shards = Vec::new();
    for (base, list) in lists {
        for e in list {
            let path = resolve(&e.url, &base, place)
                .and_then(|p| match p {
                    p if p.is_empty() => Err("names no file".into()),
                    p if !super::is_shard(&p) => Err(
                        "is not a .tar file (a compressed shard cannot be read by byte range)"
                            .into(),
                    ),
                    p => Ok(p),
                })
                .map_err(|reason| bad(format!("shard {:?}: {reason}", e.url)))?;
            if !seen.insert(path.clone()) {
                return Err(bad(format!(
                    "shard {:?} is listed twice (its samples would be served twice)",
                    e.url
                )));
            }
            shards.push(WidsShard {
                url: e.url,
                path,
                nsamples: e.nsamples,
                filesize: e.filesize,
            });
        }
    }
    if shards.is_empty() {
        return Err(bad("lists no shard".into()));
    }
    Ok(shards)
}

/// Checks a shard of the index, found at `shard` (its path or URL) with
/// `size` bytes (before its walk) or `samples` samples (after), against
/// what the index `what` says of it.
pub fn check(
    what: &str,
    shard: &str,
    s: &WidsShard,
    size: Option<u64>,
    samples: Option<u64>,
) -> Result<(), WalkError> {
    let stale = |found: String, said: String| {
        Err(WalkError::whole(
            shard,
            format!(
                "the wids index {what} says {said}, the shard holds {found}: the index is stale \
                 (run widsindex again) or groups members otherwise"
            ),
        ))
    };
    if let (Some(want), Some(size)) = (s.filesize, size) {
        if want != size {
            return stale(format!("{size} bytes"), format!("{want} bytes"));
        }
    }
    match samples {
        Some(n) if n != s.nsamples => {
            stale(format!("{n} samples"), format!("{} samples", s.nsamples))
        }
        _ => Ok(()),
    }
}

/// The folder part of a `/`-separated path (`""` at the top).
fn parent(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

/// The path, relative to the dataset's root or prefix, of `url` found in
/// an index in `folder` (itself relative).
fn resolve(url: &str, folder: &str, place: Place<'_>) -> Result<String, String> {
    let inside = |abs: &str, top: &str| -> Result<String, String> {
        let abs = normalize(abs.trim_start_matches('/'))?;
        let top = normalize(top.trim_start_matches('/'))?;
        if top.is_empty() {
            return Ok(abs);
        }
        match abs.strip_prefix(top.as_str()) {
            Some(rest) if rest.starts_with('/') => Ok(rest[1..].to_owned()),
            _ => Err("is outside the dataset's root or prefix".into()),
        }
    };
    if let Some(path) = url.strip_prefix("file://") {
        return match place {
            Place::Root(root) => inside(path, root),
            Place::Bucket { .. } => Err("is a file URL in an S3 dataset".into()),
        };
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        return match place {
            Place::Bucket { bucket, prefix } => match rest.split_once('/') {
                Some((b, key)) if b == bucket => inside(key, prefix),
                _ => Err(format!("is not in the dataset's bucket {bucket:?}")),
            },
            Place::Root(_) => Err("is an S3 URL in a filesystem dataset".into()),
        };
    }
    if url.contains("://") {
        return Err("names another store (only the dataset's own root or bucket is read)".into());
    }
    if url.starts_with('/') {
        return match place {
            Place::Root(root) => inside(url, root),
            // As `wids` merges it with an `s3://bucket/...` base: the key.
            Place::Bucket { prefix, .. } => inside(url, prefix),
        };
    }
    let joined = if folder.is_empty() {
        url.to_owned()
    } else {
        format!("{folder}/{url}")
    };
    normalize(&joined)
}

/// `path` without `.`, empty and `..` components; an error where `..`
/// climbs above its top.
fn normalize(path: &str) -> Result<String, String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts
                    .pop()
                    .ok_or("climbs out of the dataset's root or prefix")?;
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests;
