//! The index of a filesystem dataset's tar shards, read with `pread`.

use super::{is_shard, IndexStats, TarWalker};
use crate::source::fs::{Catalog, CatalogEntry, CatalogError};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Indexes the `.tar` files below `root` (in the order the `files` format
/// lists the files of a tree: files directly in `root` first, then each
/// folder's in byte order), each sample labelled by its `label_ext`
/// member. Shards are walked one after the other.
pub fn index(root: &Path, label_ext: &str) -> Result<(Catalog, IndexStats), CatalogError> {
    let files = Catalog::from_dir(root)?;
    let mut entries = Vec::new();
    let mut stats = IndexStats::default();
    let mut buf = Vec::new();
    for f in files.entries() {
        let name = f.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !is_shard(name) {
            continue;
        }
        let io = |action| {
            let path = f.path.clone();
            move |source| CatalogError::Io {
                path,
                action,
                source,
            }
        };
        let file = File::open(&f.path).map_err(io("open shard"))?;
        let mut walk = TarWalker::new(f.path.display().to_string(), f.size, label_ext);
        while let Some((at, len)) = walk.next_read() {
            buf.resize(len as usize, 0);
            file.read_exact_at(&mut buf, at).map_err(io("read shard"))?;
            stats.reads += 1;
            stats.bytes_read += len;
            walk.feed(at, &buf).map_err(CatalogError::Shard)?;
        }
        stats.shards += 1;
        stats.shard_bytes += f.size;
        for s in walk.into_samples() {
            entries.push(CatalogEntry {
                sample_id: entries.len() as u64,
                path: f.path.clone(),
                label: s.label,
                size: s.len,
                offset: s.offset,
                file_size: f.size,
                mtime: f.mtime,
            });
        }
    }
    let catalog = Catalog::finish(entries, Vec::new(), root)?;
    Ok((catalog, stats))
}
