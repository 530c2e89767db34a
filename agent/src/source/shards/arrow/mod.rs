//! Arrow IPC files (`format = "arrow"`): the `.arrow` files Hugging Face
//! `datasets` writes (its cache and `save_to_disk`), and any Arrow IPC
//! stream or file, sans IO.
//!
//! The walk reads the messages one after the other: each message's
//! metadata (a FlatBuffers `Message`, read by [`super::flatbuf`]), and for
//! a record batch only the buffers that place its samples: the sample
//! column's offsets and the label column's values. A sample is one value
//! of the sample column, a byte range of the file; the data between is
//! never read. The sample column is a top-level binary column, or a
//! struct with a `bytes` child (Hugging Face's `Image` and `Audio`
//! features), or a dotted path to a nested binary field (`image.bytes`).
//! Compressed bodies, big-endian files and null samples are refused with
//! the reason (docs/formats.md).

mod schema;

use super::flatbuf::{FbError, Table};
use super::{next_chunk, ShardSample, ShardWalk, WalkError};
use schema::{preorder_index, slots, tag, Field};

/// The first read of a message (the metadata of most record batches and
/// schemas fits; a larger one takes a second read).
const HEAD: u64 = 4096;
/// Metadata larger than this is refused (a corrupt length).
const MAX_METADATA: u64 = 64 << 20;
/// The magic of the Arrow IPC file format, before its stream.
const FILE_MAGIC: &[u8] = b"ARROW1";
/// The `Message.header` union's tags.
const SCHEMA: u8 = 1;
const DICTIONARY_BATCH: u8 = 2;
const RECORD_BATCH: u8 = 3;
/// `MetadataVersion.V5`: unions without a validity buffer.
const V5: i16 = 4;

/// The walk's position.
#[derive(Debug)]
enum Step {
    /// The message at `pos`.
    Message(u64),
    /// A record batch's buffers.
    Buffers(Batch),
    Done,
}

/// A record batch whose buffers are being read.
#[derive(Debug)]
struct Batch {
    /// Its number in the file, for errors.
    index: u64,
    rows: usize,
    /// Where the next message starts.
    next: u64,
    sample: Values,
    /// The label column's values: where, and their width in bytes.
    labels_at: u64,
    label_width: u64,
    label_signed: bool,
    offsets: Option<Vec<u64>>,
    labels: Option<Vec<i32>>,
}

/// Where a batch's sample values lie.
#[derive(Debug, Clone, Copy)]
enum Values {
    /// Variable-size: `offset_width`-byte offsets at `offsets`, relative to
    /// the data buffer at `data` of `data_len` bytes.
    Variable {
        offsets: u64,
        offset_width: u64,
        data: u64,
        data_len: u64,
    },
    /// Fixed-size: `width` bytes each from `data`.
    Fixed { data: u64, width: u64 },
}

/// The resolved columns.
#[derive(Debug)]
struct Columns {
    fields: Vec<Field>,
    /// Pre-order indexes of the sample field and its ancestors (outermost
    /// first, the sample field last), and of the label field.
    sample_path: Vec<usize>,
    /// The sample field's type tag and (fixed-size binary) width.
    sample_tag: u8,
    sample_width: i32,
    /// The label field's pre-order index, width in bytes and signedness.
    label: usize,
    label_width: u64,
    label_signed: bool,
}

/// The walk of one Arrow IPC file.
pub struct ArrowWalker {
    file: String,
    size: u64,
    sample_field: String,
    label_field: String,
    step: Step,
    columns: Option<Columns>,
    batches: u64,
    need: u64,
    chunk: u64,
    out: Vec<ShardSample>,
}

impl std::fmt::Debug for ArrowWalker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrowWalker")
            .field("file", &self.file)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

fn le(b: &[u8]) -> u64 {
    let mut x = [0u8; 8];
    x[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(x)
}

impl ArrowWalker {
    /// The walk of `file` (named in errors) of `size` bytes.
    pub fn new(file: impl Into<String>, size: u64, sample_field: &str, label_field: &str) -> Self {
        ArrowWalker {
            file: file.into(),
            size,
            sample_field: sample_field.to_owned(),
            label_field: label_field.to_owned(),
            step: Step::Message(0),
            columns: None,
            batches: 0,
            need: 0,
            chunk: HEAD,
            out: Vec::new(),
        }
    }

    fn whole(&self, reason: impl Into<String>) -> WalkError {
        WalkError::whole(self.file.clone(), reason)
    }

    fn at(&self, offset: u64, reason: impl Into<String>) -> WalkError {
        WalkError::at(self.file.clone(), offset, reason)
    }

    /// Reads the message at `pos` from `data` (the file from `pos`).
    fn message(&mut self, mut pos: u64, data: &[u8]) -> Result<(), WalkError> {
        let mut data = data;
        if pos == 0 && data.starts_with(FILE_MAGIC) {
            // The file format: magic, padding to 8, then the stream.
            pos = 8;
            data = data.get(8..).unwrap_or(&[]);
        }
        self.check_more(pos)?;
        let Some(prefix) = data.get(..8.min(data.len())).filter(|p| p.len() >= 4) else {
            return self.short(pos, 8);
        };
        // A continuation marker and a length, or (before format 0.15) a
        // length alone.
        let (len, meta_at) = if prefix[..4] == [0xFF; 4] {
            if prefix.len() < 8 {
                return self.short(pos, 8);
            }
            (
                u64::from(u32::from_le_bytes(prefix[4..8].try_into().expect("4"))),
                8,
            )
        } else {
            (
                u64::from(u32::from_le_bytes(prefix[..4].try_into().expect("4"))),
                4,
            )
        };
        if len == 0 {
            return self.end(); // end of stream
        }
        if len > MAX_METADATA || pos + meta_at + len > self.size {
            return Err(self.at(
                pos,
                format!(
                    "a message of {len} bytes of metadata runs past the end of the file ({} \
                     bytes): truncated, or not an Arrow IPC file",
                    self.size
                ),
            ));
        }
        let Some(meta) = data.get(meta_at as usize..(meta_at + len) as usize) else {
            return self.short(pos, meta_at + len);
        };
        let body = pos + meta_at + len;
        let header = self.header(meta, body).map_err(|e| self.at(pos, e))?;
        let next = match header {
            Header::Schema(cols) => {
                if self.columns.is_some() {
                    return Err(self.at(pos, "a second schema message"));
                }
                self.columns = Some(*cols);
                body
            }
            Header::Skip(next) => next,
            Header::Batch(batch) => {
                let from = pos;
                self.step = Step::Buffers(batch);
                // The buffers may lie in what was read already.
                return self.buffers(from, data);
            }
        };
        self.chunk = next_chunk(self.chunk, next.saturating_sub(pos + data.len() as u64));
        self.need = 0;
        self.step = Step::Message(next);
        self.check_more(next)
    }

    /// The end of the stream.
    fn end(&mut self) -> Result<(), WalkError> {
        if self.columns.is_none() {
            return Err(self.whole(
                "no schema message before the end: empty, or not an Arrow IPC stream or file",
            ));
        }
        self.step = Step::Done;
        Ok(())
    }

    /// A message must follow at `pos` (at least the end-of-stream marker,
    /// which every writer puts: a file without one was cut short).
    fn check_more(&self, pos: u64) -> Result<(), WalkError> {
        if pos >= self.size {
            return Err(self.at(
                pos,
                "the stream ends without its end-of-stream marker: truncated",
            ));
        }
        Ok(())
    }

    /// More bytes are needed at `pos`: at least `n`.
    fn short(&mut self, pos: u64, n: u64) -> Result<(), WalkError> {
        if self.size - pos < n {
            return Err(self.at(
                pos,
                format!(
                    "a message cut short by the end of the file ({} bytes): truncated",
                    self.size
                ),
            ));
        }
        self.need = n.max(self.chunk);
        self.step = Step::Message(pos);
        Ok(())
    }

    /// Reads one message's metadata; `body` is where its body starts.
    fn header(&mut self, meta: &[u8], body: u64) -> Result<Header, FbError> {
        let m = Table::root(meta)?;
        let version = m.i16(0, 0)?;
        let kind = m.u8(1, 0)?;
        let h = m.table(2)?;
        let body_len = m.i64(3, 0)?;
        let next = u64::try_from(body_len)
            .ok()
            .and_then(|l| body.checked_add(l))
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                format!(
                    "a body of {body_len} bytes at {body} runs past the end of the file ({} bytes)",
                    self.size
                )
            })?;
        match (kind, h) {
            (SCHEMA, Some(s)) => self
                .schema(&s, version)
                .map(|c| Header::Schema(Box::new(c))),
            (DICTIONARY_BATCH, _) => Ok(Header::Skip(next)),
            (RECORD_BATCH, Some(rb)) => self.batch(&rb, body, next).map(Header::Batch),
            (k, _) => Err(format!(
                "a message of kind {k} (not a schema, dictionary or record batch)"
            )),
        }
    }

    /// Resolves the sample and label columns in the schema.
    fn schema(&self, s: &Table<'_>, version: i16) -> Result<Columns, FbError> {
        if s.i16(0, 0)? != 0 {
            return Err("a big-endian file: not read".into());
        }
        let mut fields = Vec::new();
        if let Some(v) = s.vector(1)? {
            for i in 0..v.len {
                fields.push(Field::read(&v.table(i)?, 0)?);
            }
        }
        if version < V5 && has_union(&fields) {
            return Err("a union column in a file of metadata version 4 or older: not read".into());
        }
        let names = || -> Vec<&str> { fields.iter().map(|f| f.name.as_str()).collect() };
        // The sample: a dotted path of field names; a struct at its end
        // stands for its `bytes` child (Hugging Face's Image and Audio).
        let mut path = Vec::new();
        let mut level = &fields;
        let mut field: Option<&Field> = None;
        for part in self.sample_field.split('.') {
            let Some(i) = level.iter().position(|f| f.name == part) else {
                return Err(format!(
                    "no column {:?} (sample_field); the columns are {:?}",
                    self.sample_field,
                    names()
                ));
            };
            path.push(i);
            field = Some(&level[i]);
            level = &level[i].children;
        }
        let mut field = field.expect("split yields a part");
        if field.tag == tag::STRUCT && !field.dictionary {
            if let Some(i) = field.children.iter().position(|c| c.name == "bytes") {
                path.push(i);
                field = &field.children[i];
            }
        }
        let binary = matches!(
            field.tag,
            tag::BINARY | tag::LARGE_BINARY | tag::UTF8 | tag::LARGE_UTF8 | tag::FIXED_SIZE_BINARY
        );
        if !binary || field.dictionary {
            return Err(format!(
                "the sample column {:?} is not binary (type tag {}{}): a sample is one binary value",
                self.sample_field,
                field.tag,
                if field.dictionary { ", dictionary-encoded" } else { "" }
            ));
        }
        let mut level = &fields;
        for &p in &path[..path.len() - 1] {
            if level[p].tag != tag::STRUCT || level[p].dictionary {
                return Err(format!(
                    "the sample column {:?} lies inside a list, map or union: one value per row is \
                     read",
                    self.sample_field
                ));
            }
            level = &level[p].children;
        }
        let sample_path = (1..=path.len())
            .map(|n| preorder_index(&fields, &path[..n]))
            .collect();
        let Some(l) = fields.iter().position(|f| f.name == self.label_field) else {
            return Err(format!(
                "no top-level column {:?} (label_field); the columns are {:?}",
                self.label_field,
                names()
            ));
        };
        let lf = &fields[l];
        if lf.tag != tag::INT || lf.dictionary || ![8, 16, 32, 64].contains(&lf.width) {
            return Err(format!(
                "the label column {:?} is not an integer (type tag {}): an int8 … int64 column is \
                 read",
                self.label_field, lf.tag
            ));
        }
        let (sample_tag, sample_width) = (field.tag, field.width);
        Ok(Columns {
            label: preorder_index(&fields, &[l]),
            label_width: (lf.width / 8) as u64,
            label_signed: lf.signed,
            sample_tag,
            sample_width,
            sample_path,
            fields,
        })
    }

    /// Places a record batch's sample and label buffers.
    fn batch(&mut self, rb: &Table<'_>, body: u64, next: u64) -> Result<Batch, FbError> {
        let index = self.batches;
        self.batches += 1;
        let Some(cols) = &self.columns else {
            return Err("a record batch before the schema".into());
        };
        let rows = rb.i64(0, 0)?;
        if rb.table(3)?.is_some() {
            return Err(format!(
                "record batch {index}: its body is compressed (LZ4 or ZSTD): a sample must be a \
                 byte range of the file: write it uncompressed"
            ));
        }
        let body_len = next - body;
        // Each row takes bytes of the label buffer (checked below), so a
        // count past the body is corrupt.
        let rows = usize::try_from(rows)
            .ok()
            .filter(|&r| r as u64 <= body_len)
            .ok_or_else(|| {
                format!("record batch {index}: {rows} rows in a body of {body_len} bytes: corrupt")
            })?;
        let nodes = rb.vector(1)?.ok_or("a record batch without nodes")?;
        let buffers = rb.vector(2)?.ok_or("a record batch without buffers")?;
        let variadic: Vec<i64> = match rb.vector(4)? {
            Some(v) => (0..v.len).map(|i| v.i64(i)).collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let layout = slots(&cols.fields, &variadic)?;
        let node = |i: usize| -> Result<(i64, i64), FbError> {
            let r = nodes.record(layout[i].node, 16)?;
            Ok((le(&r[..8]) as i64, le(&r[8..]) as i64))
        };
        // A buffer's place in the file, checked against the body.
        let buffer = |i: usize, k: usize| -> Result<(u64, u64), FbError> {
            let r = buffers.record(layout[i].buffer + k, 16)?;
            let (off, len) = (le(&r[..8]), le(&r[8..]));
            if off.checked_add(len).is_none_or(|e| e > body_len) {
                return Err(format!(
                    "record batch {index}: a buffer at {off}..+{len} runs past its body of \
                     {body_len} bytes"
                ));
            }
            Ok((body + off, len))
        };
        let name = &self.sample_field;
        for &i in &cols.sample_path {
            let (len, nulls) = node(i)?;
            if nulls != 0 {
                return Err(format!(
                    "record batch {index}: {nulls} null values in the sample column {name:?} or \
                     the struct holding it (a Hugging Face Image stored by path only? \
                     `Dataset.save_to_disk` embeds the bytes)"
                ));
            }
            if len < 0 || (len as u64) < rows as u64 {
                return Err(format!(
                    "record batch {index}: the sample column has {len} values for {rows} rows"
                ));
            }
        }
        let s = *cols.sample_path.last().expect("a sample field");
        let sample = if cols.sample_tag == tag::FIXED_SIZE_BINARY {
            let width = u64::try_from(cols.sample_width).unwrap_or(0);
            let (data, len) = buffer(s, 1)?;
            if len < width * rows as u64 {
                return Err(format!(
                    "record batch {index}: {len} bytes of values for {rows} rows of {width}"
                ));
            }
            Values::Fixed { data, width }
        } else {
            let w = if matches!(cols.sample_tag, tag::LARGE_BINARY | tag::LARGE_UTF8) {
                8
            } else {
                4
            };
            let (offsets, olen) = buffer(s, 1)?;
            let (data, data_len) = buffer(s, 2)?;
            if rows > 0 && olen < (rows as u64 + 1) * w {
                return Err(format!(
                    "record batch {index}: {olen} bytes of offsets for {rows} rows"
                ));
            }
            Values::Variable {
                offsets,
                offset_width: w,
                data,
                data_len,
            }
        };
        let (len, nulls) = node(cols.label)?;
        if nulls != 0 || len < rows as i64 {
            return Err(format!(
                "record batch {index}: the label column {:?} has {nulls} nulls and {len} values \
                 for {rows} rows",
                self.label_field
            ));
        }
        let label_width = cols.label_width;
        let (labels_at, llen) = buffer(cols.label, 1)?;
        if llen < label_width * rows as u64 {
            return Err(format!(
                "record batch {index}: {llen} bytes of labels for {rows} rows"
            ));
        }
        Ok(Batch {
            index,
            rows,
            next,
            sample,
            labels_at,
            label_width,
            label_signed: cols.label_signed,
            offsets: matches!(sample, Values::Fixed { .. }).then(Vec::new),
            labels: None,
        })
    }

    /// The next range of a batch still to read: its offsets, its labels,
    /// or both in one read when they lie close together.
    fn batch_read(b: &Batch) -> Option<(u64, u64)> {
        let offsets = match (&b.offsets, b.sample) {
            (
                None,
                Values::Variable {
                    offsets,
                    offset_width,
                    ..
                },
            ) => Some((offsets, (b.rows as u64 + 1) * offset_width)),
            _ => None,
        };
        let labels = b
            .labels
            .is_none()
            .then_some((b.labels_at, b.label_width * b.rows as u64));
        match (offsets, labels) {
            (Some(o), Some(l)) => {
                let (from, to) = (o.0.min(l.0), (o.0 + o.1).max(l.0 + l.1));
                if to - from <= 2 * (o.1 + l.1) + 64 * 1024 {
                    Some((from, to - from))
                } else {
                    Some(o)
                }
            }
            (o, l) => o.or(l),
        }
    }

    /// Takes what `data` (the file at `at`) holds of the current batch's
    /// buffers; emits its samples once both are read.
    fn buffers(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        let Step::Buffers(b) = &mut self.step else {
            unreachable!("buffers in another step")
        };
        let end = at + data.len() as u64;
        let slice = |from: u64, len: u64| -> Option<&[u8]> {
            (from >= at && from + len <= end)
                .then(|| &data[(from - at) as usize..(from - at + len) as usize])
        };
        if b.offsets.is_none() {
            if let Values::Variable {
                offsets,
                offset_width: w,
                ..
            } = b.sample
            {
                if let Some(raw) = slice(offsets, (b.rows as u64 + 1) * w) {
                    b.offsets = Some(raw.chunks_exact(w as usize).map(le).collect());
                }
            }
        }
        if b.labels.is_none() {
            if let Some(raw) = slice(b.labels_at, b.label_width * b.rows as u64) {
                let w = b.label_width as usize;
                let mut labels = Vec::with_capacity(b.rows);
                for (row, v) in raw.chunks_exact(w).enumerate() {
                    let bits = le(v);
                    let value = if b.label_signed {
                        // Sign-extended from the column's width.
                        let shift = 64 - 8 * w as u32;
                        i128::from(((bits << shift) as i64) >> shift)
                    } else {
                        i128::from(bits)
                    };
                    let Ok(l) = i32::try_from(value) else {
                        let (at, index) = (b.labels_at, b.index);
                        return Err(WalkError::at(
                            self.file.clone(),
                            at,
                            format!(
                                "record batch {index}, row {row}: label {value} does not fit a \
                                 32-bit integer"
                            ),
                        ));
                    };
                    labels.push(l);
                }
                b.labels = Some(labels);
            }
        }
        if Self::batch_read(b).is_some() {
            self.need = 0;
            return Ok(());
        }
        let Step::Buffers(b) = std::mem::replace(&mut self.step, Step::Done) else {
            unreachable!()
        };
        self.emit(&b)?;
        self.chunk = next_chunk(self.chunk, b.next.saturating_sub(end));
        self.need = 0;
        self.step = Step::Message(b.next);
        self.check_more(b.next)
    }

    /// Adds a read batch's samples.
    fn emit(&mut self, b: &Batch) -> Result<(), WalkError> {
        let labels = b.labels.as_deref().expect("read");
        match b.sample {
            Values::Fixed { data, width } => {
                for (row, &label) in labels.iter().enumerate() {
                    self.out.push(ShardSample {
                        offset: data + row as u64 * width,
                        len: width,
                        label,
                    });
                }
            }
            Values::Variable {
                offsets,
                data,
                data_len,
                ..
            } => {
                let o = b.offsets.as_deref().expect("read");
                for (row, &label) in labels.iter().enumerate() {
                    let (from, to) = (o[row], o[row + 1]);
                    if from > to || to > data_len {
                        return Err(self.at(
                            offsets,
                            format!(
                                "record batch {}, row {row}: value offsets {from}..{to} outside \
                                 its {data_len}-byte data buffer: corrupt",
                                b.index
                            ),
                        ));
                    }
                    self.out.push(ShardSample {
                        offset: data + from,
                        len: to - from,
                        label,
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a message holds.
enum Header {
    Schema(Box<Columns>),
    /// A message the walk skips; the next one starts here.
    Skip(u64),
    Batch(Batch),
}

fn has_union(fields: &[Field]) -> bool {
    fields
        .iter()
        .any(|f| f.tag == tag::UNION || has_union(&f.children))
}

impl ShardWalk for ArrowWalker {
    fn next_read(&self) -> Option<(u64, u64)> {
        match &self.step {
            Step::Message(pos) => {
                let n = self.chunk.max(self.need).min(self.size - pos);
                (n > 0).then_some((*pos, n))
            }
            Step::Buffers(b) => Self::batch_read(b),
            Step::Done => None,
        }
    }

    fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        super::check_read(&self.file, self.next_read(), at, data)?;
        match self.step {
            Step::Message(pos) => self.message(pos, data),
            Step::Buffers(_) => self.buffers(at, data),
            Step::Done => Ok(()),
        }
    }

    fn into_samples(self) -> Vec<ShardSample> {
        self.out
    }
}

#[cfg(test)]
mod tests;
