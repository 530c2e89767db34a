//! `granary ingest --format mds`: a dataset folder written as Mosaic MDS
//! shards.
//!
//! Each file becomes one record of three columns (MDS orders them by
//! name): `key` (`str`, its path below the folder), `label` (`int`, its
//! label, -1 for files directly in the folder) and `sample` (`bytes`, the
//! file). A shard is closed before the record that would take it past
//! `shard_size` (a larger record gets a shard of its own); shards are
//! named `shard.00000.mds`, … (as Mosaic's `MDSWriter` names them),
//! uncompressed, and listed in `index.json` (version 2).

use super::shards::{bad, open_source, relative, ShardsWritten};
use std::io::{self, Write};
use std::path::Path;

/// The columns written, in MDS's (sorted) order: name, encoding, size.
const COLUMNS: [(&str, &str, Option<u64>); 3] = [
    ("key", "str", None),
    ("label", "int", Some(8)),
    ("sample", "bytes", None),
];

/// One shard being gathered: its records.
#[derive(Default)]
struct Open {
    records: Vec<Vec<u8>>,
    bytes: u64,
}

impl Open {
    /// The shard's size with one more record of `len` bytes.
    fn size_with(&self, len: u64) -> u64 {
        4 + 4 * (self.records.len() as u64 + 2) + self.bytes + len
    }
}

/// Writes shard `i` of `out` and returns its `index.json` entry.
fn write_shard(out: &Path, i: usize, open: &Open, shard_size: u64) -> io::Result<String> {
    let name = format!("shard.{i:05}.mds");
    let n = open.records.len() as u64;
    let table = 4 + 4 * (n + 1);
    let size = table + open.bytes;
    let size32 = u32::try_from(size).map_err(|_| {
        bad(format!(
            "{name}: {size} bytes, more than MDS's 32-bit offsets"
        ))
    })?;
    let mut buf = Vec::with_capacity(size as usize);
    buf.extend_from_slice(&(n as u32).to_le_bytes());
    let mut at = table;
    for r in &open.records {
        buf.extend_from_slice(&(at as u32).to_le_bytes());
        at += r.len() as u64;
    }
    buf.extend_from_slice(&size32.to_le_bytes());
    for r in &open.records {
        buf.extend_from_slice(r);
    }
    std::fs::write(out.join(&name), &buf)?;
    let names: Vec<String> = COLUMNS.iter().map(|c| format!("{:?}", c.0)).collect();
    let encs: Vec<String> = COLUMNS.iter().map(|c| format!("{:?}", c.1)).collect();
    let sizes: Vec<String> = COLUMNS
        .iter()
        .map(|c| c.2.map_or("null".into(), |s| s.to_string()))
        .collect();
    Ok(format!(
        "{{\"column_encodings\": [{}], \"column_names\": [{}], \"column_sizes\": [{}], \
         \"compression\": null, \"format\": \"mds\", \"hashes\": [], \"raw_data\": \
         {{\"basename\": \"{name}\", \"bytes\": {size}, \"hashes\": {{}}}}, \"samples\": {n}, \
         \"size_limit\": {shard_size}, \"version\": 2, \"zip_data\": null}}",
        encs.join(", "),
        names.join(", "),
        sizes.join(", ")
    ))
}

/// Writes the folder `src` as MDS shards of at most `shard_size` bytes and
/// their `index.json` into `out` (created if missing).
pub fn write_mds(src: &Path, out: &Path, shard_size: u64) -> io::Result<ShardsWritten> {
    let catalog = open_source(src, out)?;
    let mut written = ShardsWritten::default();
    let mut entries = Vec::new();
    let mut open = Open::default();
    for e in catalog.entries() {
        let rel = relative(src, &e.path)?;
        let data = std::fs::read(&e.path)?;
        let mut rec = Vec::with_capacity(16 + rel.len() + data.len());
        for len in [rel.len(), data.len()] {
            let len = u32::try_from(len)
                .map_err(|_| bad(format!("{}: larger than 4 GiB", e.path.display())))?;
            rec.extend_from_slice(&len.to_le_bytes());
        }
        rec.extend_from_slice(rel.as_bytes());
        rec.extend_from_slice(&i64::from(e.label).to_le_bytes());
        rec.extend_from_slice(&data);
        if !open.records.is_empty() && open.size_with(rec.len() as u64) > shard_size {
            entries.push(write_shard(out, written.shards.len(), &open, shard_size)?);
            written
                .shards
                .push(out.join(format!("shard.{:05}.mds", written.shards.len())));
            open = Open::default();
        }
        open.bytes += rec.len() as u64;
        open.records.push(rec);
        written.samples += 1;
        written.bytes += data.len() as u64;
    }
    if !open.records.is_empty() {
        entries.push(write_shard(out, written.shards.len(), &open, shard_size)?);
        written
            .shards
            .push(out.join(format!("shard.{:05}.mds", written.shards.len())));
    }
    let mut index = std::fs::File::create(out.join("index.json"))?;
    write!(
        index,
        "{{\"shards\": [\n{}\n], \"version\": 2}}\n",
        entries.join(",\n")
    )?;
    index.flush()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_index_back_to_the_files_in_order() {
        let (_d, spec, out, w) = crate::ingest::ninety_files_written("mds", write_mds);
        for s in &w.shards {
            assert!(std::fs::metadata(s).unwrap().len() <= 64 * 1024);
        }
        // The key column as the sample: each file's path.
        crate::ingest::assert_indexed_in_order(
            &spec.root,
            &out,
            &w,
            granary_agent::source::fs::shards::index_mds,
            5,
        );
    }
}
