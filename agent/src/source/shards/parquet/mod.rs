//! Parquet files (`format = "parquet"`), sans IO.
//!
//! The walk reads a file's footer (the `parquet` crate decodes it), then
//! for each row group the label column's chunk (decoded by the crate's
//! column reader) and the headers of the sample column's pages
//! ([`super::thrift`]), header → skip the value → next header. A sample is
//! one value of the sample column, which must lie alone in an uncompressed
//! PLAIN data page: its bytes are a range of the file. Files written
//! otherwise are refused with the reason (docs/formats.md).

use super::thrift::{self, HeaderError, PageHeader};
use super::{next_chunk, ShardSample, ShardWalk, WalkError};
use bytes::{Buf, Bytes};
use parquet::basic::{Compression, Type as Physical};
use parquet::column::page::PageReader;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{Int32Type, Int64Type};
use parquet::file::metadata::{
    ColumnChunkMetaData, FooterTail, ParquetMetaData, ParquetMetaDataReader,
};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use std::sync::Arc;

/// The first read: the file's last 16 KiB, the footer in most files (a
/// larger footer takes a second read).
const TAIL: u64 = 16 * 1024;
/// A label column chunk read whole: at most this many bytes.
const MAX_LABEL_CHUNK: u64 = 256 << 20;

/// A column chunk's start and length (the crate's `byte_range` panics on
/// negative values, which a corrupt footer may hold).
fn chunk_range(c: &ColumnChunkMetaData) -> Option<(u64, u64)> {
    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
    let len = c.compressed_size();
    (start >= 0 && len >= 0).then_some((start as u64, len as u64))
}

/// The walk's position.
#[derive(Debug)]
enum Step {
    /// The footer's last bytes.
    Tail,
    /// The metadata, `len` bytes before the last 8.
    Meta(u64),
    /// Row group `rg`'s label chunk.
    Labels(usize),
    /// Row group `rg`'s sample pages, the next header at `pos`, up to `end`.
    Pages {
        rg: usize,
        pos: u64,
        end: u64,
    },
    Done,
}

/// The walk of one Parquet file.
pub struct ParquetWalker {
    file: String,
    size: u64,
    sample_field: String,
    label_field: String,
    step: Step,
    meta: Option<ParquetMetaData>,
    /// The sample and label columns' indexes.
    columns: (usize, usize),
    /// The labels of the current row group.
    labels: Vec<i32>,
    /// Rows of the current row group seen.
    row: usize,
    need: u64,
    chunk: u64,
    out: Vec<ShardSample>,
}

impl std::fmt::Debug for ParquetWalker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetWalker")
            .field("file", &self.file)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

/// A byte range of the file as the crate's [`ChunkReader`].
struct Window {
    base: u64,
    data: Bytes,
}

impl Length for Window {
    fn len(&self) -> u64 {
        self.base + self.data.len() as u64
    }
}

impl ChunkReader for Window {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.get_bytes(start, 0)?;
        Ok(self.data.slice((start - self.base) as usize..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let from = start.checked_sub(self.base).map(|f| f as usize);
        match from {
            Some(f) if f.checked_add(length).is_some_and(|e| e <= self.data.len()) => {
                Ok(self.data.slice(f..f + length))
            }
            _ => Err(parquet::errors::ParquetError::EOF(format!(
                "bytes {start}..+{length} outside the column chunk"
            ))),
        }
    }
}

impl ParquetWalker {
    /// The walk of `file` (named in errors) of `size` bytes.
    pub fn new(file: impl Into<String>, size: u64, sample_field: &str, label_field: &str) -> Self {
        ParquetWalker {
            file: file.into(),
            size,
            sample_field: sample_field.to_owned(),
            label_field: label_field.to_owned(),
            step: Step::Tail,
            meta: None,
            columns: (0, 0),
            labels: Vec::new(),
            row: 0,
            need: 0,
            chunk: super::SMALL_READ,
            out: Vec::new(),
        }
    }

    fn whole(&self, reason: impl Into<String>) -> WalkError {
        WalkError::whole(self.file.clone(), reason)
    }

    fn at(&self, offset: u64, reason: impl Into<String>) -> WalkError {
        WalkError::at(self.file.clone(), offset, reason)
    }

    fn meta(&self) -> &ParquetMetaData {
        self.meta.as_ref().expect("read before the row groups")
    }

    /// Reads the footer's tail from `data` (the file's last bytes).
    fn tail(&mut self, data: &[u8]) -> Result<(), WalkError> {
        if self.size < 12 {
            return Err(self.whole(format!(
                "not a Parquet file: {} bytes (at least 12)",
                self.size
            )));
        }
        let t: [u8; 8] = data[data.len() - 8..].try_into().expect("8 bytes");
        let tail = FooterTail::try_new(&t).map_err(|_| {
            self.whole("not a Parquet file: it does not end in PAR1 (truncated, or another format)")
        })?;
        if tail.is_encrypted_footer() {
            return Err(self.whole("encrypted footer (PARE): encrypted files are not read"));
        }
        let m = tail.metadata_length() as u64;
        if m + 8 > self.size - 4 {
            return Err(self.whole(format!(
                "the footer says {m} bytes of metadata, the file has {} (truncated or corrupt)",
                self.size
            )));
        }
        if m + 8 <= data.len() as u64 {
            let from = data.len() - 8 - m as usize;
            self.decode(&data[from..data.len() - 8])
        } else {
            self.step = Step::Meta(m);
            Ok(())
        }
    }

    /// Decodes the metadata and checks the two columns.
    fn decode(&mut self, buf: &[u8]) -> Result<(), WalkError> {
        let meta = ParquetMetaDataReader::decode_metadata(buf)
            .map_err(|e| self.whole(format!("cannot decode the footer: {e}")))?;
        let schema = meta.file_metadata().schema_descr();
        let find = |name: &str, setting: &str| {
            (0..schema.num_columns())
                .find(|&i| {
                    let p = schema.column(i);
                    p.path().parts().len() == 1 && p.path().parts()[0] == name
                })
                .ok_or_else(|| {
                    let names: Vec<String> = (0..schema.num_columns())
                        .map(|i| schema.column(i).path().string())
                        .collect();
                    self.whole(format!(
                        "no top-level column {name:?} ({setting}); the columns are {names:?}"
                    ))
                })
        };
        let sample = find(&self.sample_field, "sample_field")?;
        let label = find(&self.label_field, "label_field")?;
        let (s, l) = (schema.column(sample), schema.column(label));
        if !matches!(
            s.physical_type(),
            Physical::BYTE_ARRAY | Physical::FIXED_LEN_BYTE_ARRAY
        ) {
            return Err(self.whole(format!(
                "the sample column {:?} is {}, not binary",
                self.sample_field,
                s.physical_type()
            )));
        }
        if !matches!(l.physical_type(), Physical::INT32 | Physical::INT64) {
            return Err(self.whole(format!(
                "the label column {:?} is {}, not an integer",
                self.label_field,
                l.physical_type()
            )));
        }
        for (c, name) in [(s, &self.sample_field), (l, &self.label_field)] {
            if c.max_rep_level() != 0 {
                return Err(self.whole(format!("the column {name:?} is repeated (a list)")));
            }
        }
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let c = rg.column(sample);
            if c.compression() != Compression::UNCOMPRESSED {
                return Err(self.whole(format!(
                    "row group {g}: the sample column {:?} is compressed ({}); a sample must be \
                     a byte range: write it uncompressed",
                    self.sample_field,
                    c.compression()
                )));
            }
            if c.dictionary_page_offset().is_some() {
                return Err(self.whole(format!(
                    "row group {g}: the sample column {:?} has a dictionary page; write it \
                     PLAIN, without a dictionary",
                    self.sample_field
                )));
            }
            let rows = rg.num_rows();
            if !(0..=self.size as i64).contains(&rows) {
                return Err(self.whole(format!("row group {g}: {rows} rows: corrupt footer")));
            }
            let (from, len) = chunk_range(c).unwrap_or((u64::MAX, 0));
            if from.checked_add(len).is_none_or(|e| e > self.size) {
                return Err(self.whole(format!(
                    "row group {g}: the sample column's pages ({from}..+{len}) run past the end \
                     of the file ({} bytes)",
                    self.size
                )));
            }
            let (from, len) = chunk_range(rg.column(label)).unwrap_or((u64::MAX, 0));
            if from.checked_add(len).is_none_or(|e| e > self.size) || len > MAX_LABEL_CHUNK {
                return Err(self.whole(format!(
                    "row group {g}: the label column's chunk ({from}..+{len}) runs past the end \
                     of the file ({} bytes) or exceeds {MAX_LABEL_CHUNK} bytes",
                    self.size
                )));
            }
        }
        self.columns = (sample, label);
        self.meta = Some(meta);
        self.start_group(0);
        Ok(())
    }

    /// Moves to row group `rg` (or the end).
    fn start_group(&mut self, rg: usize) {
        self.step = if rg < self.meta().num_row_groups() {
            Step::Labels(rg)
        } else {
            Step::Done
        };
    }

    fn label_chunk(&self, rg: usize) -> &ColumnChunkMetaData {
        self.meta().row_group(rg).column(self.columns.1)
    }

    /// Decodes row group `rg`'s labels from its label chunk `data`.
    fn labels(&mut self, rg: usize, at: u64, data: &[u8]) -> Result<(), WalkError> {
        let c = self.label_chunk(rg).clone();
        let rows = self.meta().row_group(rg).num_rows() as usize;
        let window = Arc::new(Window {
            base: at,
            data: Bytes::copy_from_slice(data),
        });
        let err = |e: parquet::errors::ParquetError| {
            self.at(
                at,
                format!(
                    "row group {rg}: the label column {:?}: {e}",
                    self.label_field
                ),
            )
        };
        let pages: Box<dyn PageReader> =
            Box::new(SerializedPageReader::new(window, &c, rows, None).map_err(err)?);
        let descr = c.column_descr_ptr();
        let max_def = descr.max_def_level();
        let mut defs = Vec::new();
        let mut labels = Vec::with_capacity(rows);
        let values = match c.column_type() {
            Physical::INT32 => {
                let mut r = ColumnReaderImpl::<Int32Type>::new(descr, pages);
                let mut v = Vec::with_capacity(rows);
                r.read_records(rows, (max_def > 0).then_some(&mut defs), None, &mut v)
                    .map_err(err)?;
                labels.extend(v.iter().map(|&x| i64::from(x)));
                v.len()
            }
            _ => {
                let mut r = ColumnReaderImpl::<Int64Type>::new(descr, pages);
                let mut v = Vec::with_capacity(rows);
                r.read_records(rows, (max_def > 0).then_some(&mut defs), None, &mut v)
                    .map_err(err)?;
                labels.extend(v.iter().copied());
                v.len()
            }
        };
        if values != rows {
            return Err(self.at(
                at,
                format!(
                    "row group {rg}: the label column {:?} holds {values} values for {rows} rows \
                     (nulls, or cut short)",
                    self.label_field
                ),
            ));
        }
        self.labels = labels
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                i32::try_from(v).map_err(|_| {
                    self.at(
                        at,
                        format!("row group {rg}, row {i}: label {v} does not fit a 32-bit integer"),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        self.row = 0;
        let (from, len) = chunk_range(self.meta().row_group(rg).column(self.columns.0))
            .expect("checked when the footer was read");
        self.step = Step::Pages {
            rg,
            pos: from,
            end: from + len,
        };
        self.need = 0;
        Ok(())
    }

    /// Where page `h` (at `pos`, whole up to `data`'s end at `end`) holds
    /// its value: `Ok(Some((offset, len)))`, `Ok(None)` for a page without
    /// a value (an index page), or the bytes needed (`Err(Ok(n))`).
    fn value(
        &self,
        h: &PageHeader,
        pos: u64,
        data: &[u8],
        rg: usize,
    ) -> Result<Result<Option<(u64, u64)>, u64>, WalkError> {
        let bad = |r: String| Err(self.at(pos, format!("row group {rg}, row {}: {r}", self.row)));
        let body = pos + h.len as u64;
        let body_len = h.compressed_size as u64;
        let descr = self
            .meta()
            .row_group(rg)
            .column(self.columns.0)
            .column_descr();
        let max_def = descr.max_def_level();
        let (levels_at, levels) = match h.page_type {
            thrift::INDEX_PAGE => return Ok(Ok(None)),
            thrift::DICTIONARY_PAGE => {
                return bad("a dictionary page: write the sample column PLAIN".into())
            }
            thrift::DATA_PAGE => {
                if h.num_values != 1 {
                    return bad(format!(
                        "a data page of {} values: each sample must be a page of one value",
                        h.num_values
                    ));
                }
                if max_def == 0 {
                    (body, 0)
                } else {
                    if h.def_encoding != 3 {
                        return bad("definition levels not RLE-encoded".into());
                    }
                    // A v1 page's RLE levels: a u32 length, then the levels.
                    let need = body + 4 - pos;
                    let Some(b) = data.get((body - pos) as usize..(need) as usize) else {
                        return Ok(Err(need));
                    };
                    let n = u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes")));
                    (body, 4 + n)
                }
            }
            thrift::DATA_PAGE_V2 => {
                if h.num_values != 1 || h.num_rows != 1 {
                    return bad(format!(
                        "a data page of {} values in {} rows: each sample must be a page of one value",
                        h.num_values, h.num_rows
                    ));
                }
                if h.num_nulls != 0 {
                    return bad("a null sample".into());
                }
                (body, (h.def_bytes + h.rep_bytes) as u64)
            }
            t => return bad(format!("page type {t}, not a data page")),
        };
        if h.encoding != 0 {
            return bad(format!(
                "values encoded with encoding {} (PLAIN is 0)",
                h.encoding
            ));
        }
        if levels > body_len {
            return bad("levels larger than the page: corrupt".into());
        }
        let values_at = levels_at + levels;
        let values_len = body_len - levels;
        if descr.physical_type() == Physical::FIXED_LEN_BYTE_ARRAY {
            let w = descr.type_length().max(0) as u64;
            if values_len != w {
                return bad(format!(
                    "{values_len} bytes of values for one {w}-byte value (a null sample, or corrupt)"
                ));
            }
            return Ok(Ok(Some((values_at, w))));
        }
        if values_len < 4 {
            return bad("no value (a null sample)".into());
        }
        let need = values_at + 4 - pos;
        let Some(b) = data.get((values_at - pos) as usize..need as usize) else {
            return Ok(Err(need));
        };
        let n = u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes")));
        if n + 4 != values_len {
            return bad(format!(
                "the page holds {values_len} bytes of values, one value of {n} bytes takes {}: \
                 not one PLAIN value",
                n + 4
            ));
        }
        Ok(Ok(Some((values_at + 4, n))))
    }

    /// Walks the page headers in `data` (the file at `at`).
    fn pages(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        let data_end = at + data.len() as u64;
        let Step::Pages { rg, mut pos, end } = self.step else {
            unreachable!("pages in another step")
        };
        while pos < end {
            if pos >= data_end {
                break;
            }
            let from = (pos - at) as usize;
            let h = match thrift::page_header(&data[from..]) {
                Ok(h) => h,
                Err(HeaderError::Short) => {
                    if data_end >= end {
                        return Err(self.at(
                            pos,
                            format!("row group {rg}: a page header cut short by the end of the column chunk"),
                        ));
                    }
                    self.need = ((data_end - pos) * 2).max(1024);
                    break;
                }
                Err(HeaderError::Bad(m)) => {
                    return Err(self.at(pos, format!("row group {rg}: not a page header: {m}")))
                }
            };
            let page_end = (pos + h.len as u64).saturating_add(h.compressed_size as u64);
            if page_end > end {
                return Err(self.at(
                    pos,
                    format!(
                        "row group {rg}: a page of {} bytes runs past the end of its column chunk ({end}): truncated or corrupt",
                        h.compressed_size
                    ),
                ));
            }
            match self.value(&h, pos, &data[from..], rg)? {
                Err(n) => {
                    self.need = n;
                    break;
                }
                Ok(None) => {}
                Ok(Some((offset, len))) => {
                    let Some(&label) = self.labels.get(self.row) else {
                        return Err(self.at(
                            pos,
                            format!(
                                "row group {rg}: more sample pages than its {} rows",
                                self.labels.len()
                            ),
                        ));
                    };
                    self.out.push(ShardSample { offset, len, label });
                    self.row += 1;
                }
            }
            self.need = 0;
            pos = page_end;
        }
        self.step = Step::Pages { rg, pos, end };
        if pos >= end {
            if self.row != self.labels.len() {
                return Err(self.at(
                    pos,
                    format!(
                        "row group {rg}: {} sample values for {} rows",
                        self.row,
                        self.labels.len()
                    ),
                ));
            }
            self.start_group(rg + 1);
        }
        self.chunk = next_chunk(self.chunk, pos.saturating_sub(data_end));
        Ok(())
    }
}

impl ShardWalk for ParquetWalker {
    fn next_read(&self) -> Option<(u64, u64)> {
        match self.step {
            Step::Tail => {
                let n = self.size.min(TAIL);
                Some((self.size - n, n))
            }
            Step::Meta(m) => Some((self.size - 8 - m, m + 8)),
            Step::Labels(rg) => chunk_range(self.label_chunk(rg)),
            Step::Pages { pos, end, .. } => Some((pos, self.chunk.max(self.need).min(end - pos))),
            Step::Done => None,
        }
    }

    fn feed(&mut self, at: u64, data: &[u8]) -> Result<(), WalkError> {
        super::check_read(&self.file, self.next_read(), at, data)?;
        match self.step {
            Step::Tail => self.tail(data),
            Step::Meta(m) => self.decode(&data[..m as usize]),
            Step::Labels(rg) => self.labels(rg, at, data),
            Step::Pages { .. } => self.pages(at, data),
            Step::Done => Ok(()),
        }
    }

    fn into_samples(self) -> Vec<ShardSample> {
        self.out
    }
}

#[cfg(test)]
mod tests;
