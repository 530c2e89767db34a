//! The index of a filesystem dataset's shards, read with `pread`.

use super::{Catalog, CatalogEntry, CatalogError};
use crate::config::{ShardFormat, ShardSettings};
use crate::source::shards::arrow::ArrowWalker;
use crate::source::shards::mds::{self, MdsWalker};
use crate::source::shards::parquet::ParquetWalker;
use crate::source::shards::wids::{self, Place};
use crate::source::shards::{
    is_arrow, is_parquet, is_shard, IndexStats, ShardSample, ShardWalk, TarWalker, WalkError,
};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The index of the shards below `root` in `settings`' format (not
/// `files`).
pub fn index_dataset(
    root: &Path,
    settings: &ShardSettings<'_>,
) -> Result<(Catalog, IndexStats), CatalogError> {
    match settings.format {
        ShardFormat::Mds => index_mds(root, settings.sample_field, settings.label_field),
        ShardFormat::Parquet => index_parquet(root, settings.sample_field, settings.label_field),
        ShardFormat::Arrow => index_arrow(root, settings.sample_field, settings.label_field),
        ShardFormat::Webdataset | ShardFormat::Files => {
            index_webdataset(root, settings.label_field, settings.wids_index.lookup())
        }
    }
}

/// A file's size and modification time.
fn stat(path: &Path) -> Result<(File, u64, (i64, u32)), CatalogError> {
    let io = |action| {
        let path = path.to_path_buf();
        move |source| CatalogError::Io {
            path,
            action,
            source,
        }
    };
    let file = File::open(path).map_err(io("open shard"))?;
    let meta = file.metadata().map_err(io("stat shard"))?;
    let mtime = (meta.mtime(), u32::try_from(meta.mtime_nsec()).unwrap_or(0));
    Ok((file, meta.len(), mtime))
}

/// Drives `walk` over `file` (at `path`) to its end.
fn drive(
    path: &Path,
    file: &File,
    walk: &mut impl ShardWalk,
    stats: &mut IndexStats,
    buf: &mut Vec<u8>,
) -> Result<(), CatalogError> {
    while let Some((at, len)) = walk.next_read() {
        buf.resize(len as usize, 0);
        file.read_exact_at(buf, at)
            .map_err(|source| CatalogError::Io {
                path: path.to_path_buf(),
                action: "read shard",
                source,
            })?;
        stats.reads += 1;
        stats.bytes_read += len;
        walk.feed(at, buf).map_err(CatalogError::Shard)?;
    }
    Ok(())
}

/// Appends a shard's samples to `entries`.
fn push(
    entries: &mut Vec<CatalogEntry>,
    path: &Path,
    size: u64,
    mtime: (i64, u32),
    samples: Vec<ShardSample>,
) {
    for s in samples {
        entries.push(CatalogEntry {
            sample_id: entries.len() as u64,
            path: path.to_path_buf(),
            label: s.label,
            size: s.len,
            offset: s.offset,
            file_size: size,
            mtime,
        });
    }
}

/// The files below `root` whose names pass `keep`, in the order the
/// `files` format lists a tree.
fn shard_files(root: &Path, keep: fn(&str) -> bool) -> Result<Vec<PathBuf>, CatalogError> {
    let files = Catalog::from_dir(root)?;
    Ok(files
        .entries()
        .iter()
        .filter(|f| keep(f.path.file_name().and_then(|n| n.to_str()).unwrap_or("")))
        .map(|f| f.path.clone())
        .collect())
}

/// Indexes the `.tar` files below `root` (in the order the `files` format
/// lists the files of a tree: files directly in `root` first, then each
/// folder's in byte order), each sample labelled by its `label_ext`
/// member. Shards are walked one after the other.
pub fn index(root: &Path, label_ext: &str) -> Result<(Catalog, IndexStats), CatalogError> {
    let shards = shard_files(root, is_shard)?.into_iter().map(|p| (p, ()));
    let (entries, stats) = walk_all(shards, IndexStats::default(), |path, size, ()| {
        Ok(TarWalker::new(path.display().to_string(), size, label_ext))
    })?;
    Ok((Catalog::finish(entries, Vec::new(), root)?, stats))
}

/// Indexes the `webdataset` dataset in `root`: the shards its `wids`
/// index lists when `wids` (the index's file name, and whether it must
/// exist) finds one, else every `.tar` file below it ([`index`]).
pub fn index_webdataset(
    root: &Path,
    label_ext: &str,
    wids: Option<(&str, bool)>,
) -> Result<(Catalog, IndexStats), CatalogError> {
    let Some((name, required)) = wids else {
        return index(root, label_ext);
    };
    let index_path = root.join(name);
    let text = match std::fs::read(&index_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return index(root, label_ext)
        }
        Err(source) => {
            return Err(CatalogError::Io {
                path: index_path,
                action: "read the wids index",
                source,
            })
        }
    };
    let what = index_path.display().to_string();
    let place = Place::Root(root.to_str().unwrap_or(""));
    let listed = wids::parse(&text, name, &what, place).map_err(CatalogError::Shard)?;
    let shards = listed.iter().map(|s| (root.join(&s.path), s));
    let stats = IndexStats::one_read(text.len());
    let (entries, stats) = walk_all(shards, stats, |path, size, s| {
        wids::check(&what, &path.display().to_string(), s, Some(size), None)
            .map_err(CatalogError::Shard)?;
        Ok(TarWalker::new(path.display().to_string(), size, label_ext))
    })?;
    let mut counts: HashMap<&Path, u64> = HashMap::new();
    for e in &entries {
        *counts.entry(e.path.as_path()).or_default() += 1;
    }
    for s in &listed {
        let path = root.join(&s.path);
        let n = counts.get(path.as_path()).copied().unwrap_or(0);
        wids::check(&what, &path.display().to_string(), s, None, Some(n))
            .map_err(CatalogError::Shard)?;
    }
    tracing::info!(
        "webdataset shards of {}: the {} that the wids index {what} lists, in its order",
        root.display(),
        listed.len()
    );
    Ok((Catalog::finish(entries, Vec::new(), root)?, stats))
}

/// Walks each shard (its path, and what `walker` needs besides its path
/// and size to make its walk) to its end, one after the other, and gives
/// their samples in shard order.
fn walk_all<T, W: ShardWalk>(
    shards: impl IntoIterator<Item = (PathBuf, T)>,
    mut stats: IndexStats,
    mut walker: impl FnMut(&Path, u64, T) -> Result<W, CatalogError>,
) -> Result<(Vec<CatalogEntry>, IndexStats), CatalogError> {
    let mut entries = Vec::new();
    let mut buf = Vec::new();
    for (path, extra) in shards {
        let (file, size, mtime) = stat(&path)?;
        let mut walk = walker(&path, size, extra)?;
        drive(&path, &file, &mut walk, &mut stats, &mut buf)?;
        stats.shards += 1;
        stats.shard_bytes += size;
        push(&mut entries, &path, size, mtime, walk.into_samples());
    }
    Ok((entries, stats))
}

/// Indexes the MDS dataset in `root`: the shards its `index.json` lists,
/// in that order; each sample the `sample_field` column of a record, its
/// label the `label_field` column.
pub fn index_mds(
    root: &Path,
    sample_field: &str,
    label_field: &str,
) -> Result<(Catalog, IndexStats), CatalogError> {
    let index_path = root.join(crate::source::shards::MDS_INDEX);
    let text = std::fs::read(&index_path).map_err(|source| CatalogError::Io {
        path: index_path.clone(),
        action: "read the MDS index",
        source,
    })?;
    let stats = IndexStats::one_read(text.len());
    let shards = mds::parse_index(
        &text,
        &index_path.display().to_string(),
        sample_field,
        label_field,
    )
    .map_err(CatalogError::Shard)?;
    let shards = shards.iter().map(|s| (root.join(&s.basename), s));
    let (entries, stats) = walk_all(shards, stats, |path, size, s| {
        MdsWalker::new(path.display().to_string(), size, s).map_err(CatalogError::Shard)
    })?;
    Ok((Catalog::finish(entries, Vec::new(), root)?, stats))
}

/// Indexes the files below `root` that `keep` names (`.parquet`,
/// `.arrow`: `ext`, for the error when there is none), in the order of the
/// `files` format, each walked by the walk `walker` makes of it (from its
/// name and size): each row's `sample_field` value a sample, its
/// `label_field` value the label.
pub fn index_columns<W: ShardWalk>(
    root: &Path,
    keep: fn(&str) -> bool,
    ext: &str,
    walker: impl Fn(String, u64) -> W,
) -> Result<(Catalog, IndexStats), CatalogError> {
    let shards = shard_files(root, keep)?.into_iter().map(|p| (p, ()));
    let (entries, stats) = walk_all(shards, IndexStats::default(), |path, size, ()| {
        Ok(walker(path.display().to_string(), size))
    })?;
    if entries.is_empty() && stats.shards == 0 {
        return Err(CatalogError::Shard(WalkError::whole(
            root.display().to_string(),
            format!("no {ext} file below it"),
        )));
    }
    let catalog = Catalog::finish(entries, Vec::new(), root)?;
    Ok((catalog, stats))
}

/// Indexes the `.parquet` files below `root` ([`index_columns`]).
pub fn index_parquet(
    root: &Path,
    sample_field: &str,
    label_field: &str,
) -> Result<(Catalog, IndexStats), CatalogError> {
    index_columns(root, is_parquet, ".parquet", |name, size| {
        ParquetWalker::new(name, size, sample_field, label_field)
    })
}

/// Indexes the Arrow IPC files (`.arrow`, `.arrows`, `.feather`) below
/// `root` ([`index_columns`]).
pub fn index_arrow(
    root: &Path,
    sample_field: &str,
    label_field: &str,
) -> Result<(Catalog, IndexStats), CatalogError> {
    index_columns(root, is_arrow, ".arrow", |name, size| {
        ArrowWalker::new(name, size, sample_field, label_field)
    })
}
