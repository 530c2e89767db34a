//! The header walk of one tar shard, sans IO.

use granary_shm::tar::{parse_header, MemberKind, TarError, BLOCK};
use std::fmt;

/// Reads adapt to the members: after a read whose walk jumped past its
/// end (over a member's data), the next is [`SMALL_READ`]; after one whose
/// headers it used up to its end, the next is twice as large, up to
/// [`LARGE_READ`]. A shard of large members is thus read a header, a label
/// and the next header at a time; one of small members 64 KiB at a time.
pub const LARGE_READ: u64 = 64 * 1024;
/// Small reads: a header, a label member of up to 512 bytes and the next
/// header (1.5 KiB).
pub const SMALL_READ: u64 = 3 * 512;
/// Largest label member: labels are short decimal numbers.
const MAX_LABEL_BYTES: u64 = 4096;

/// One sample found in a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSample {
    /// Where the sample's first header starts in the shard.
    pub offset: u64,
    /// Bytes from there to the end of its last member's data, padded.
    pub len: u64,
    /// The label member's value, `-1` without one.
    pub label: i32,
}

/// Reads and bytes an index build made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Shards walked.
    pub shards: u64,
    /// Bytes of all shards.
    pub shard_bytes: u64,
    /// Reads (ranged GETs, `pread`s) made.
    pub reads: u64,
    /// Bytes those reads returned.
    pub bytes_read: u64,
    /// Shards whose samples came from the shard-index cache (not walked).
    pub cached: u64,
}

impl IndexStats {
    /// The counts of one read of `bytes` bytes (an index file), no shard
    /// walked yet.
    pub fn one_read(bytes: usize) -> IndexStats {
        IndexStats {
            reads: 1,
            bytes_read: bytes as u64,
            ..IndexStats::default()
        }
    }

    /// Adds another build's counts.
    pub fn add(&mut self, o: &IndexStats) {
        self.shards += o.shards;
        self.shard_bytes += o.shard_bytes;
        self.reads += o.reads;
        self.bytes_read += o.bytes_read;
        self.cached += o.cached;
    }
}

impl fmt::Display for IndexStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = if self.shard_bytes == 0 {
            0.0
        } else {
            100.0 * self.bytes_read as f64 / self.shard_bytes as f64
        };
        write!(
            f,
            "{} shards, {} bytes; read {} bytes ({pct:.2} %) in {} reads",
            self.shards, self.shard_bytes, self.bytes_read, self.reads
        )?;
        if self.cached > 0 {
            write!(f, "; {} shards from the shard-index cache", self.cached)?;
        }
        Ok(())
    }
}

/// Why a shard could not be indexed: the shard, the offset of the header
/// concerned, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkError {
    /// The shard or index file (a path or an `s3://` URL).
    pub shard: String,
    /// The offset of the header concerned in the shard; `None` where the
    /// error is about the whole file (an MDS `index.json`, a Parquet
    /// file's columns).
    pub offset: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

impl WalkError {
    /// An error about `shard` as a whole.
    pub fn whole(shard: impl Into<String>, reason: impl Into<String>) -> WalkError {
        WalkError {
            shard: shard.into(),
            offset: None,
            reason: reason.into(),
        }
    }

    /// An error at `offset` of `shard`.
    pub fn at(shard: impl Into<String>, offset: u64, reason: impl Into<String>) -> WalkError {
        WalkError {
            shard: shard.into(),
            offset: Some(offset),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "shard {} at offset {o}: {}", self.shard, self.reason),
            None => write!(f, "{}: {}", self.shard, self.reason),
        }
    }
}

impl std::error::Error for WalkError {}

/// The sample being gathered: its key, where it started, where its last
/// member ended, its label.
#[derive(Debug)]
struct Open {
    key: Vec<u8>,
    start: u64,
    end: u64,
    label: i32,
}

/// The header walk of one shard: header, skip the data, next header.
#[derive(Debug)]
pub struct TarWalker {
    shard: String,
    size: u64,
    label_ext: Vec<u8>,
    /// The next header's offset.
    pos: u64,
    /// Bytes the next read must return at least (a label member whole).
    need: u64,
    /// The next read's length (before `need`).
    chunk: u64,
    done: bool,
    open: Option<Open>,
    key: Vec<u8>,
    out: Vec<ShardSample>,
}

impl TarWalker {
    /// A walk of shard `shard` (named in errors) of `size` bytes, whose
    /// label members have extension `label_ext`.
    pub fn new(shard: impl Into<String>, size: u64, label_ext: &str) -> TarWalker {
        TarWalker {
            shard: shard.into(),
            size,
            label_ext: label_ext.as_bytes().to_vec(),
            pos: 0,
            need: BLOCK as u64,
            chunk: LARGE_READ,
            done: size == 0,
            open: None,
            key: Vec::new(),
            out: Vec::new(),
        }
    }

    /// The next read: `(offset, len)`, `len` at least what the walk needs
    /// and at most the rest of the shard; `None` when the walk is done.
    pub fn next_read(&self) -> Option<(u64, u64)> {
        if self.done {
            return None;
        }
        let len = self.chunk.max(self.need).min(self.size - self.pos);
        Some((self.pos, len))
    }

    fn err(&self, offset: u64, reason: impl Into<String>) -> WalkError {
        WalkError::at(self.shard.clone(), offset, reason)
    }

    /// Takes `data`, the bytes of the shard at `at` (what
    /// [`next_read`](Self::next_read) asked for, or more), and walks the
    /// headers they hold.
    pub fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        if at != self.pos {
            return Err(self.err(at, format!("read at {at}, the walk is at {}", self.pos)));
        }
        let end = at + data.len() as u64;
        while !self.done {
            if self.pos == self.size {
                self.finish_open();
                self.done = true;
                break;
            }
            if self.pos + BLOCK as u64 > self.size {
                return Err(self.err(
                    self.pos,
                    format!(
                        "truncated: a header needs 512 bytes, the shard ends {} bytes later",
                        self.size - self.pos
                    ),
                ));
            }
            if self.pos + BLOCK as u64 > end {
                self.need = BLOCK as u64;
                break;
            }
            let i = (self.pos - at) as usize;
            let Some(block) = data[i..].first_chunk::<BLOCK>() else {
                break;
            };
            let h = match parse_header(block) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    // End of archive.
                    self.finish_open();
                    self.done = true;
                    break;
                }
                Err(e) => return Err(self.err(self.pos, e.to_string())),
            };
            if h.kind == MemberKind::LongName {
                return Err(self.err(self.pos, TarError::Unsupported(h.typeflag).to_string()));
            }
            let span = h
                .padded_span()
                .filter(|s| self.pos.checked_add(*s).is_some_and(|e| e <= self.size));
            let Some(span) = span else {
                return Err(self.err(
                    self.pos,
                    format!(
                        "truncated: the member's {} bytes of data run past the end of the shard ({} bytes)",
                        h.size, self.size
                    ),
                ));
            };
            let ext = (h.kind == MemberKind::File)
                .then(|| h.extension())
                .flatten();
            let Some(ext) = ext else {
                // Directories, links, global headers, members without an
                // extension: not part of any sample.
                self.finish_open();
                self.pos += span;
                continue;
            };
            let mut label = None;
            if ext == self.label_ext.as_slice() {
                if h.size > MAX_LABEL_BYTES {
                    return Err(self.err(
                        self.pos,
                        format!(
                            "label member of {} bytes (at most {MAX_LABEL_BYTES})",
                            h.size
                        ),
                    ));
                }
                let data_end = self.pos + BLOCK as u64 + h.size;
                if data_end > end {
                    self.need = data_end - self.pos;
                    break;
                }
                let d = &data[i + BLOCK..(data_end - at) as usize];
                let v = std::str::from_utf8(d)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok());
                match v {
                    Some(v) => label = Some(v),
                    None => {
                        return Err(self.err(
                            self.pos,
                            format!(
                                "label member {:?} holds {:?}, not a 32-bit decimal integer",
                                String::from_utf8_lossy(h.name),
                                String::from_utf8_lossy(&d[..d.len().min(40)])
                            ),
                        ))
                    }
                }
            }
            h.key_into(&mut self.key);
            let same = self.open.as_ref().is_some_and(|o| o.key == self.key);
            if !same {
                self.finish_open();
                self.open = Some(Open {
                    key: std::mem::take(&mut self.key),
                    start: self.pos,
                    end: self.pos,
                    label: -1,
                });
            }
            let o = self.open.as_mut().expect("opened above");
            o.end = self.pos + span;
            if let Some(l) = label {
                o.label = l;
            }
            self.pos += span;
            self.need = BLOCK as u64;
        }
        self.chunk = if self.pos > end {
            SMALL_READ
        } else {
            (self.chunk * 2).min(LARGE_READ)
        };
        Ok(())
    }

    fn finish_open(&mut self) {
        if let Some(o) = self.open.take() {
            self.out.push(ShardSample {
                offset: o.start,
                len: o.end - o.start,
                label: o.label,
            });
        }
    }

    /// Whether the walk has reached the end of the archive.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The samples found, in shard order (call when
    /// [`next_read`](Self::next_read) says `None`).
    pub fn into_samples(self) -> Vec<ShardSample> {
        self.out
    }
}

impl super::ShardWalk for TarWalker {
    fn next_read(&self) -> Option<(u64, u64)> {
        TarWalker::next_read(self)
    }
    fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        TarWalker::feed(self, at, data)
    }
    fn into_samples(self) -> Vec<ShardSample> {
        TarWalker::into_samples(self)
    }
}

#[cfg(test)]
mod tests;
