//! `granary ingest --format webdataset`: a dataset folder written as
//! WebDataset tar shards.
//!
//! The folder is walked as the filesystem source catalogs it (class
//! folders, [`Catalog::from_dir`]); each file becomes one sample of two
//! members, in catalog order: the file itself, named by its path below the
//! folder (`class_000/img_00000001.bin`: key `class_000/img_00000001`,
//! extension `bin`), and `KEY.cls` holding its label in ASCII decimal
//! (files directly in the folder, label -1, get no `.cls`). A shard is
//! closed before the sample that would take it past `shard_size` (a
//! sample larger than that gets a shard of its own); shards are named
//! `shard-000000.tar`, … and end with the two zero blocks of a tar.

use granary_agent::source::Catalog;
use granary_shm::tar::{ustar_header, BLOCK};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Default `--shard-size`: 64 MiB.
pub const DEFAULT_SHARD_SIZE: u64 = 64 << 20;

/// What [`write_webdataset`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardsWritten {
    /// The shards, in order.
    pub shards: Vec<PathBuf>,
    /// Samples (files of the folder).
    pub samples: u64,
    /// Bytes of the files.
    pub bytes: u64,
}

/// An input error, `msg` saying what is wrong.
pub(super) fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The catalog of the folder `src`, with `out` created: where each shard
/// writer starts.
pub(super) fn open_source(src: &Path, out: &Path) -> io::Result<Catalog> {
    let catalog = Catalog::from_dir(src).map_err(|e| bad(e.to_string()))?;
    std::fs::create_dir_all(out)?;
    Ok(catalog)
}

/// `path`, a file of the folder `src`, below `src`, as UTF-8.
pub(super) fn relative<'a>(src: &Path, path: &'a Path) -> io::Result<&'a str> {
    path.strip_prefix(src)
        .ok()
        .and_then(Path::to_str)
        .ok_or_else(|| bad(format!("{}: the name is not UTF-8", path.display())))
}

/// The key and extension of a path below the folder: the path up to the
/// first dot of its last component, and the rest.
fn key_and_ext(rel: &str) -> Option<(&str, &str)> {
    let base_at = rel.rfind('/').map_or(0, |i| i + 1);
    let dot = rel[base_at..].find('.')? + base_at;
    Some((&rel[..dot], &rel[dot + 1..])).filter(|(k, e)| !k.ends_with('/') && !e.is_empty())
}

/// Writes the folder `src` as WebDataset shards of at most `shard_size`
/// bytes into `out` (created if missing).
pub fn write_webdataset(src: &Path, out: &Path, shard_size: u64) -> io::Result<ShardsWritten> {
    let catalog = open_source(src, out)?;
    let mut written = ShardsWritten::default();
    let mut shard: Option<(BufWriter<File>, u64)> = None;
    let mut last_key = String::new();
    let pad = |n: u64| n.next_multiple_of(BLOCK as u64);
    for e in catalog.entries() {
        let rel = relative(src, &e.path)?;
        let (key, ext) = key_and_ext(rel).ok_or_else(|| {
            bad(format!(
                "{}: a WebDataset member needs an extension (a dot in its name)",
                e.path.display()
            ))
        })?;
        if key == last_key {
            return Err(bad(format!(
                "{}: another file has the same WebDataset key {key:?} (the name up to its first dot)",
                e.path.display()
            )));
        }
        last_key = key.to_owned();
        let data = std::fs::read(&e.path)?;
        let label = (e.label >= 0).then(|| e.label.to_string());
        let span = BLOCK as u64
            + pad(data.len() as u64)
            + label
                .as_ref()
                .map_or(0, |l| BLOCK as u64 + pad(l.len() as u64));
        if shard
            .as_ref()
            .is_some_and(|(_, used)| *used > 0 && used + span + 2 * BLOCK as u64 > shard_size)
        {
            let (mut w, _) = shard.take().expect("checked");
            w.write_all(&[0u8; 2 * BLOCK])?;
            w.flush()?;
        }
        if shard.is_none() {
            let path = out.join(format!("shard-{:06}.tar", written.shards.len()));
            shard = Some((BufWriter::new(File::create(&path)?), 0));
            written.shards.push(path);
        }
        let (w, used) = shard.as_mut().expect("opened above");
        let mut member = |name: String, bytes: &[u8]| -> io::Result<()> {
            let h = ustar_header(name.as_bytes(), bytes.len() as u64, 0).ok_or_else(|| {
                bad(format!("{name}: the name does not fit a ustar header (100 bytes, or a 155-byte folder and a 100-byte name)"))
            })?;
            w.write_all(&h)?;
            w.write_all(bytes)?;
            let zeros = [0u8; BLOCK];
            w.write_all(&zeros[..(pad(bytes.len() as u64) - bytes.len() as u64) as usize])
        };
        member(format!("{key}.{ext}"), &data)?;
        if let Some(l) = &label {
            member(format!("{key}.cls"), l.as_bytes())?;
        }
        *used += span;
        written.samples += 1;
        written.bytes += data.len() as u64;
    }
    if let Some((mut w, _)) = shard {
        w.write_all(&[0u8; 2 * BLOCK])?;
        w.flush()?;
    }
    Ok(written)
}

/// The name [`write_wids_index`] writes: `widsindex create`'s default,
/// the one a `webdataset` dataset looks for.
pub const WIDS_INDEX: &str = "shardindex.json";

/// Writes `out/shardindex.json`, the `wids` shard index of the shards `w`
/// wrote into `out` (as `widsindex create` writes it, without the MD5
/// sums): each shard by its name, its sample count and its size. Then
/// `wids.ShardListDataset` reads the folder, and a Granary `webdataset`
/// dataset takes its shards from it (docs/formats.md). The counts come from
/// indexing the shards written.
pub fn write_wids_index(out: &Path, w: &ShardsWritten) -> io::Result<PathBuf> {
    let (catalog, _) = granary_agent::source::fs::shards::index(out, "cls")
        .map_err(|e| bad(format!("index the shards written: {e}")))?;
    let mut shardlist = Vec::with_capacity(w.shards.len());
    for shard in &w.shards {
        let name = relative(out, shard)?;
        let nsamples = catalog
            .entries()
            .iter()
            .filter(|e| &e.path == shard)
            .count();
        let filesize = std::fs::metadata(shard)?.len();
        shardlist
            .push(serde_json::json!({"url": name, "nsamples": nsamples, "filesize": filesize}));
    }
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("shards");
    let index = serde_json::json!({
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": name,
        "shardlist": shardlist,
    });
    let path = out.join(WIDS_INDEX);
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&index).map_err(io::Error::other)?,
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_extensions() {
        assert_eq!(key_and_ext("c/img_1.bin"), Some(("c/img_1", "bin")));
        assert_eq!(key_and_ext("c.d/img.tar.gz"), Some(("c.d/img", "tar.gz")));
        assert_eq!(key_and_ext("c/noext"), None);
        assert_eq!(key_and_ext("c/.hidden"), None);
    }
}

#[cfg(test)]
mod written {
    use super::*;

    #[test]
    fn shards_index_back_to_the_files_in_order() {
        let (d, spec, out, w) = crate::ingest::ninety_files_written("wds", write_webdataset);
        for s in &w.shards {
            let len = std::fs::metadata(s).unwrap().len();
            assert!(len <= 64 * 1024 || w.shards.len() == 1, "{len}");
        }
        let files = Catalog::from_dir(&spec.root).unwrap();
        let (wds, _) = granary_agent::source::fs::shards::index(&out, "cls").unwrap();
        assert_eq!(wds.len(), files.len());
        for (f, s) in files.entries().iter().zip(wds.entries()) {
            assert_eq!(f.label, s.label);
            let bytes = wds.read_sample(s.sample_id).unwrap();
            let got = granary_shm::tar::fields(&bytes).find(b"bin").unwrap();
            assert_eq!(got, Some(std::fs::read(&f.path).unwrap().as_slice()));
        }
        // The wids index of the shards: each with its count and size; the
        // dataset read through it is the same.
        let path = write_wids_index(&out, &w).unwrap();
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let list = index["shardlist"].as_array().unwrap();
        assert_eq!(list.len(), w.shards.len());
        assert_eq!(
            list.iter()
                .map(|s| s["nsamples"].as_u64().unwrap())
                .sum::<u64>(),
            90
        );
        assert_eq!(list[0]["url"], "shard-000000.tar");
        assert_eq!(
            list[0]["filesize"],
            std::fs::metadata(&w.shards[0]).unwrap().len()
        );
        let (by_index, _) = granary_agent::source::fs::shards::index_webdataset(
            &out,
            "cls",
            Some((WIDS_INDEX, true)),
        )
        .unwrap();
        assert_eq!(by_index.entries(), wds.entries());
        // Two files with one key are refused, naming the second.
        std::fs::write(spec.root.join("class_000/img_00000000.png"), b"x").unwrap();
        let e = write_webdataset(&spec.root, &d.path().join("w2"), 64 * 1024).unwrap_err();
        assert!(e.to_string().contains("same WebDataset key"), "{e}");
    }
}
