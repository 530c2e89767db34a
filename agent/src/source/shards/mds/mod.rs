//! Mosaic streaming's MDS shards (`format = "mds"`), sans IO.
//!
//! A dataset is an `index.json` listing its shards, each with its columns
//! (`column_names`, `column_encodings`, `column_sizes`: `null` for a
//! variable-size column), its sample count and its file
//! (`raw_data.basename`, `raw_data.bytes`). A shard is
//!
//! ```text
//! u32 n | u32 offsets[n + 1] | [the writer's configuration] | record 0 | record 1 | ...
//! ```
//!
//! (little-endian; `offsets[i]` the record's start in the shard, the last
//! the shard's size; mosaicml-streaming's `MDSWriter` writes a JSON copy
//! of its configuration between the table and the first record, which the
//! offsets step over), and a record is the `u32` sizes of its
//! variable-size columns, then every column's bytes, in column order.
//! [`parse_index`] reads `index.json`; [`MdsWalker`] reads a shard's
//! offset table, then the head of each record up to the end of its label
//! column: the sample is the byte range of the `sample_field` column's
//! value, its label the `label_field` column's integer.

use super::{next_chunk, ShardSample, ShardWalk, WalkError};
use serde::Deserialize;
use std::sync::Arc;

/// One column of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its MDS encoding (`bytes`, `int`, `jpeg`, …).
    pub encoding: String,
    /// Its size in bytes if fixed; `None`: variable (a `u32` in the head
    /// of each record).
    pub size: Option<u64>,
}

/// The columns of a shard and which are the sample and the label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The columns, in record order.
    pub columns: Vec<Column>,
    /// The sample column's index.
    pub sample: usize,
    /// The label column's index.
    pub label: usize,
    /// The label's integer encoding: width in bytes and signedness.
    label_int: (usize, bool),
    /// Bytes of a record's head (4 per variable-size column).
    head: u64,
}

/// One shard listed by `index.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdsShard {
    /// Its file, relative to the dataset's root or prefix.
    pub basename: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its records.
    pub samples: u64,
    /// Its columns.
    pub layout: Arc<Layout>,
}

#[derive(Deserialize)]
struct IndexFile {
    shards: Vec<ShardEntry>,
}

#[derive(Deserialize)]
struct ShardEntry {
    format: String,
    #[serde(default)]
    column_names: Vec<String>,
    #[serde(default)]
    column_encodings: Vec<String>,
    #[serde(default)]
    column_sizes: Vec<Option<u64>>,
    #[serde(default)]
    compression: Option<String>,
    raw_data: FileInfo,
    samples: u64,
}

#[derive(Deserialize)]
struct FileInfo {
    basename: String,
    bytes: u64,
}

/// The width and signedness of an MDS integer encoding.
fn int_encoding(e: &str) -> Option<(usize, bool)> {
    Some(match e {
        "int" | "int64" => (8, true),
        "int32" => (4, true),
        "int16" => (2, true),
        "int8" => (1, true),
        "uint64" => (8, false),
        "uint32" => (4, false),
        "uint16" => (2, false),
        "uint8" => (1, false),
        _ => return None,
    })
}

/// Whether `basename` stays inside the dataset: relative, no `..`, no
/// empty component.
fn safe_basename(b: &str) -> bool {
    !b.is_empty()
        && !b.starts_with('/')
        && !b.contains('\\')
        && b.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Reads `index.json` (`text`, named `what` in errors): its shards, whose
/// `sample_field` column is the sample and `label_field` column the label.
pub fn parse_index(
    text: &[u8],
    what: &str,
    sample_field: &str,
    label_field: &str,
) -> Result<Vec<MdsShard>, WalkError> {
    let bad = |reason: String| WalkError::whole(what, reason);
    let index: IndexFile =
        serde_json::from_slice(text).map_err(|e| bad(format!("not an MDS index ({e})")))?;
    let mut out = Vec::with_capacity(index.shards.len());
    let mut last: Option<Arc<Layout>> = None;
    for (i, s) in index.shards.into_iter().enumerate() {
        let name = &s.raw_data.basename;
        let bad = |reason: String| bad(format!("shard {i} ({name:?}): {reason}"));
        if s.format != "mds" {
            return Err(bad(format!(
                "format {:?}: only \"mds\" shards are read",
                s.format
            )));
        }
        if let Some(c) = &s.compression {
            return Err(bad(format!(
                "compressed ({c}): a byte range of a compressed shard is no sample; \
                 write the dataset without compression"
            )));
        }
        if !safe_basename(name) {
            return Err(bad("the file name leaves the dataset's folder".into()));
        }
        let n = s.column_names.len();
        if n == 0 || s.column_encodings.len() != n || s.column_sizes.len() != n {
            return Err(bad(format!(
                "{n} column names, {} encodings, {} sizes",
                s.column_encodings.len(),
                s.column_sizes.len()
            )));
        }
        let find = |f: &str, setting: &str| {
            s.column_names.iter().position(|c| c == f).ok_or_else(|| {
                bad(format!(
                    "no column {f:?} ({setting}); the columns are {:?}",
                    s.column_names
                ))
            })
        };
        let sample = find(sample_field, "sample_field")?;
        let label = find(label_field, "label_field")?;
        let label_int = int_encoding(&s.column_encodings[label])
            .filter(|(w, _)| s.column_sizes[label] == Some(*w as u64))
            .ok_or_else(|| {
                bad(format!(
                    "the label column {label_field:?} is {:?} of size {:?}, not an integer",
                    s.column_encodings[label], s.column_sizes[label]
                ))
            })?;
        let columns: Vec<Column> = (0..n)
            .map(|c| Column {
                name: s.column_names[c].clone(),
                encoding: s.column_encodings[c].clone(),
                size: s.column_sizes[c],
            })
            .collect();
        let head = 4 * columns.iter().filter(|c| c.size.is_none()).count() as u64;
        let layout = Layout {
            columns,
            sample,
            label,
            label_int,
            head,
        };
        let layout = match last.take() {
            Some(l) if *l == layout => l,
            _ => Arc::new(layout),
        };
        last = Some(layout.clone());
        out.push(MdsShard {
            basename: s.raw_data.basename,
            bytes: s.raw_data.bytes,
            samples: s.samples,
            layout,
        });
    }
    Ok(out)
}

/// The walk of one MDS shard: the offset table, then each record's head.
#[derive(Debug)]
pub struct MdsWalker {
    shard: String,
    size: u64,
    layout: Arc<Layout>,
    samples: u64,
    /// The records' offsets (`samples + 1`), once read.
    offsets: Vec<u64>,
    /// The next record to read.
    next: usize,
    /// Bytes the next read must return at least.
    need: u64,
    chunk: u64,
    out: Vec<ShardSample>,
}

impl MdsWalker {
    /// The walk of `shard` (named in errors) of `size` bytes, listed as
    /// `listed` by `index.json`.
    pub fn new(shard: impl Into<String>, size: u64, listed: &MdsShard) -> Result<Self, WalkError> {
        let shard = shard.into();
        if size != listed.bytes {
            return Err(WalkError::whole(
                shard,
                format!(
                    "index.json says {} bytes, the shard has {size} (truncated or changed)",
                    listed.bytes
                ),
            ));
        }
        let table = listed
            .samples
            .checked_add(2)
            .and_then(|n| n.checked_mul(4))
            .unwrap_or(u64::MAX);
        if table > size {
            return Err(WalkError::at(
                shard,
                0,
                format!(
                    "truncated: the offsets of {} samples need {table} bytes, the shard has {size}",
                    listed.samples
                ),
            ));
        }
        Ok(MdsWalker {
            shard,
            size,
            layout: listed.layout.clone(),
            samples: listed.samples,
            offsets: Vec::new(),
            next: 0,
            need: table,
            chunk: super::SMALL_READ,
            out: Vec::new(),
        })
    }

    fn err(&self, offset: u64, reason: impl Into<String>) -> WalkError {
        WalkError::at(self.shard.clone(), offset, reason)
    }

    /// Reads the offset table from `data` (the shard's start).
    fn table(&mut self, data: &[u8]) -> Result<(), WalkError> {
        let n = self.samples as usize;
        let u32_at = |i: usize| u64::from(u32::from_le_bytes(data[i..i + 4].try_into().unwrap()));
        let stored = u32_at(0);
        if stored != self.samples {
            return Err(self.err(
                0,
                format!(
                    "the shard holds {stored} samples, index.json says {}: not this MDS shard, or corrupt",
                    self.samples
                ),
            ));
        }
        let offsets: Vec<u64> = (0..=n).map(|i| u32_at(4 + 4 * i)).collect();
        // The first record starts after the table, right after it or past
        // the writer's configuration block (`MDSWriter` writes one).
        if offsets[0] < 4 + 4 * (self.samples + 1) {
            return Err(self.err(
                4,
                format!(
                    "the first record starts at {}, inside the offsets (they end at {}): corrupt",
                    offsets[0],
                    4 + 4 * (self.samples + 1)
                ),
            ));
        }
        if let Some(i) = (0..n).find(|&i| offsets[i + 1] < offsets[i]) {
            return Err(self.err(
                4 + 4 * (i as u64 + 1),
                format!(
                    "record {i} ends at {}, before it starts ({}): corrupt",
                    offsets[i + 1],
                    offsets[i]
                ),
            ));
        }
        if offsets[n] != self.size {
            return Err(self.err(
                4 + 4 * n as u64,
                format!(
                    "the records end at {}, the shard at {} (truncated or corrupt)",
                    offsets[n], self.size
                ),
            ));
        }
        self.offsets = offsets;
        self.need = self.layout.head;
        Ok(())
    }

    /// Reads record `i`'s head from `rec` (its first bytes, as many as
    /// were read): `Ok(None)` when more are needed (`self.need` set).
    fn record(&mut self, i: usize, rec: &[u8]) -> Result<Option<ShardSample>, WalkError> {
        let start = self.offsets[i];
        let len = self.offsets[i + 1] - start;
        let l = &*self.layout;
        if l.head > len {
            return Err(self.err(
                start,
                format!(
                    "record {i} of {len} bytes is shorter than its {}-byte head: corrupt",
                    l.head
                ),
            ));
        }
        if (rec.len() as u64) < l.head {
            self.need = l.head;
            return Ok(None);
        }
        // Each column's offset in the record, and the end.
        let mut at = l.head;
        let mut var = 0;
        let mut spans = Vec::with_capacity(l.columns.len());
        for c in &l.columns {
            let size = match c.size {
                Some(s) => s,
                None => {
                    var += 4;
                    u64::from(u32::from_le_bytes(
                        rec[var - 4..var].try_into().expect("4 bytes"),
                    ))
                }
            };
            spans.push((at, size));
            at += size;
        }
        if at != len {
            return Err(self.err(
                start,
                format!("record {i}: its columns take {at} bytes, the record {len}: corrupt"),
            ));
        }
        let (lab_at, lab_len) = spans[l.label];
        let lab_end = lab_at + lab_len;
        if (rec.len() as u64) < lab_end {
            self.need = lab_end;
            return Ok(None);
        }
        let b = &rec[lab_at as usize..lab_end as usize];
        let (width, signed) = l.label_int;
        let mut raw = [0u8; 8];
        raw[..width].copy_from_slice(b);
        let value: i128 = if signed {
            let shift = 64 - 8 * width as u32;
            i128::from((i64::from_le_bytes(raw) << shift) >> shift)
        } else {
            i128::from(u64::from_le_bytes(raw))
        };
        let label = i32::try_from(value).map_err(|_| {
            self.err(
                start + lab_at,
                format!("record {i}: label {value} does not fit a 32-bit integer"),
            )
        })?;
        let (s_at, s_len) = spans[l.sample];
        self.need = l.head;
        Ok(Some(ShardSample {
            offset: start + s_at,
            len: s_len,
            label,
        }))
    }
}

impl ShardWalk for MdsWalker {
    fn next_read(&self) -> Option<(u64, u64)> {
        if self.offsets.is_empty() {
            return Some((0, self.need));
        }
        if self.next as u64 == self.samples {
            return None;
        }
        let at = self.offsets[self.next];
        Some((at, self.chunk.max(self.need).min(self.size - at)))
    }

    fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        let expect = self.next_read().map(|(a, _)| a);
        if expect != Some(at) {
            return Err(self.err(at, format!("read at {at}, the walk is at {expect:?}")));
        }
        let end = at + data.len() as u64;
        if self.offsets.is_empty() {
            if (data.len() as u64) < self.need {
                return Err(self.err(at, "truncated: the offset table is cut short"));
            }
            return self.table(data);
        }
        while (self.next as u64) < self.samples {
            let start = self.offsets[self.next];
            let rec_end = self.offsets[self.next + 1].min(end);
            if start > end {
                break;
            }
            let rec = &data[(start - at) as usize..(rec_end - at) as usize];
            match self.record(self.next, rec)? {
                Some(s) => {
                    self.out.push(s);
                    self.next += 1;
                }
                None => {
                    if start == at && rec_end == self.offsets[self.next + 1] {
                        return Err(self.err(start, "record cut short"));
                    }
                    break;
                }
            }
        }
        let gap = match self.offsets.get(self.next) {
            Some(&next) if (self.next as u64) < self.samples => next.saturating_sub(end),
            _ => 0,
        };
        self.chunk = next_chunk(self.chunk, gap);
        Ok(())
    }

    fn into_samples(self) -> Vec<ShardSample> {
        self.out
    }
}

#[cfg(test)]
mod tests;
