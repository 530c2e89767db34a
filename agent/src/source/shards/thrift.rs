//! A Parquet page header, decoded from Thrift's compact protocol.
//!
//! The `parquet` crate decodes page headers only inside its page reader
//! (which reads each page's data too); its decoder is not public. The
//! index reads headers alone, so this module decodes the few fields it
//! needs and skips the rest (statistics, CRCs, unknown fields) by type.

/// Why a header could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The bytes end before the header does: read more.
    Short,
    /// Not a page header.
    Bad(String),
}

/// The fields of a page header the index uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageHeader {
    /// `PageType`: 0 data, 1 index, 2 dictionary, 3 data v2.
    pub page_type: i32,
    /// `compressed_page_size`: the page's bytes after its header.
    pub compressed_size: i64,
    /// `uncompressed_page_size`.
    pub uncompressed_size: i64,
    /// Data pages (v1 and v2): values (nulls included).
    pub num_values: i64,
    /// Data pages: the values' encoding (0 PLAIN).
    pub encoding: i32,
    /// Data page v1: the definition levels' encoding (3 RLE).
    pub def_encoding: i32,
    /// Data page v2: rows, nulls, and the levels' byte lengths.
    pub num_rows: i64,
    /// Data page v2: nulls.
    pub num_nulls: i64,
    /// Data page v2: bytes of definition levels.
    pub def_bytes: i64,
    /// Data page v2: bytes of repetition levels.
    pub rep_bytes: i64,
    /// Bytes of the header.
    pub len: usize,
}

/// Page types.
pub const DATA_PAGE: i32 = 0;
/// Page types.
pub const INDEX_PAGE: i32 = 1;
/// Page types.
pub const DICTIONARY_PAGE: i32 = 2;
/// Page types.
pub const DATA_PAGE_V2: i32 = 3;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    depth: u32,
}

const STOP: u8 = 0;
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

fn bad(m: impl Into<String>) -> HeaderError {
    HeaderError::Bad(m.into())
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, HeaderError> {
        let b = *self.buf.get(self.pos).ok_or(HeaderError::Short)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, HeaderError> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(bad("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn int(&mut self) -> Result<i64, HeaderError> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn skip_bytes(&mut self, n: u64) -> Result<(), HeaderError> {
        let end = (self.pos as u64)
            .checked_add(n)
            .ok_or_else(|| bad("length overflows"))?;
        if end > self.buf.len() as u64 {
            return Err(HeaderError::Short);
        }
        self.pos = end as usize;
        Ok(())
    }

    /// Skips an element of a list, set or map: a boolean there is a byte.
    /// Every element takes at least one byte, so a huge count runs out of
    /// input rather than looping.
    fn skip_element(&mut self, t: u8) -> Result<(), HeaderError> {
        match t {
            TRUE | FALSE => self.byte().map(drop),
            t => self.skip(t),
        }
    }

    /// Skips a value of compact type `t`.
    fn skip(&mut self, t: u8) -> Result<(), HeaderError> {
        match t {
            TRUE | FALSE => Ok(()),
            BYTE => self.byte().map(drop),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.skip_bytes(8),
            BINARY => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            LIST | SET | MAP => {
                self.depth += 1;
                if self.depth > 16 {
                    return Err(bad("containers nested too deep"));
                }
                let r = self.skip_container(t);
                self.depth -= 1;
                r
            }
            STRUCT => self.fields(|r, _, t| r.skip(t)),
            t => Err(bad(format!("unknown compact type {t}"))),
        }
    }

    /// Skips a list, set or map.
    fn skip_container(&mut self, t: u8) -> Result<(), HeaderError> {
        match t {
            LIST | SET => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                let et = h & 0x0f;
                for _ in 0..n {
                    self.skip_element(et)?;
                }
                Ok(())
            }
            MAP => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip_element(kv >> 4)?;
                        self.skip_element(kv & 0x0f)?;
                    }
                }
                Ok(())
            }
            t => Err(bad(format!("compact type {t} is no container"))),
        }
    }

    /// Reads a struct's fields up to its stop byte, `f` taking each
    /// (id, type) and reading or skipping its value.
    fn fields(
        &mut self,
        mut f: impl FnMut(&mut Self, i16, u8) -> Result<(), HeaderError>,
    ) -> Result<(), HeaderError> {
        self.depth += 1;
        if self.depth > 16 {
            return Err(bad("structs nested too deep"));
        }
        let mut last: i16 = 0;
        loop {
            let h = self.byte()?;
            let t = h & 0x0f;
            if t == STOP {
                break;
            }
            let id = match h >> 4 {
                0 => i16::try_from(self.int()?).map_err(|_| bad("field id out of range"))?,
                d => last.wrapping_add(i16::from(d)),
            };
            last = id;
            f(self, id, t)?;
        }
        self.depth -= 1;
        Ok(())
    }

    /// An integer field of type `t`.
    fn int_field(&mut self, t: u8) -> Result<i64, HeaderError> {
        match t {
            I16 | I32 | I64 => self.int(),
            BYTE => Ok(i64::from(self.byte()? as i8)),
            _ => Err(bad(format!("integer field of compact type {t}"))),
        }
    }
}

/// Decodes the page header at the start of `buf`.
pub fn page_header(buf: &[u8]) -> Result<PageHeader, HeaderError> {
    let mut r = Reader {
        buf,
        pos: 0,
        depth: 0,
    };
    let mut h = PageHeader::default();
    let mut seen = [false; 3];
    r.fields(|r, id, t| {
        match (id, t) {
            (1, _) => {
                h.page_type = r.int_field(t)? as i32;
                seen[0] = true;
            }
            (2, _) => {
                h.uncompressed_size = r.int_field(t)?;
                seen[1] = true;
            }
            (3, _) => {
                h.compressed_size = r.int_field(t)?;
                seen[2] = true;
            }
            (5, STRUCT) => r.fields(|r, id, t| {
                match id {
                    1 => h.num_values = r.int_field(t)?,
                    2 => h.encoding = r.int_field(t)? as i32,
                    3 => h.def_encoding = r.int_field(t)? as i32,
                    _ => r.skip(t)?,
                }
                Ok(())
            })?,
            (8, STRUCT) => r.fields(|r, id, t| {
                match id {
                    1 => h.num_values = r.int_field(t)?,
                    2 => h.num_nulls = r.int_field(t)?,
                    3 => h.num_rows = r.int_field(t)?,
                    4 => h.encoding = r.int_field(t)? as i32,
                    5 => h.def_bytes = r.int_field(t)?,
                    6 => h.rep_bytes = r.int_field(t)?,
                    _ => r.skip(t)?,
                }
                Ok(())
            })?,
            _ => r.skip(t)?,
        }
        Ok(())
    })?;
    if seen != [true; 3] {
        return Err(bad("a page header without its type or sizes"));
    }
    if h.compressed_size < 0 || h.uncompressed_size < 0 || h.def_bytes < 0 || h.rep_bytes < 0 {
        return Err(bad("a page header with a negative size"));
    }
    h.len = r.pos;
    Ok(h)
}
