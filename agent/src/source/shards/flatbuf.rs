//! A bounds-checked reader of FlatBuffers tables, for the few tables of an
//! Arrow IPC message's metadata (`Message.fbs`, `Schema.fbs`) that the
//! Arrow walk reads.
//!
//! Why not the `flatbuffers` crate: its table accessors are `unsafe`
//! unless generated code (`flatc`) supplies a verifier for every table,
//! and the `arrow-ipc` crate that ships those brings the whole Arrow
//! array stack (arrow-array, -buffer, -data, -schema, -cast) into the
//! agent's build for a dozen fields. This reader is safe Rust: every read
//! is checked against the buffer, and a corrupt offset is an error, never
//! a panic (`docs/formats.md`).
//!
//! The layout (FlatBuffers' "internals"): a buffer starts with a `u32`
//! offset to its root table; a table starts with an `i32` that, subtracted
//! from the table's position, gives its vtable; a vtable is `u16` vtable
//! size, `u16` table size, then one `u16` per field: the field's offset in
//! the table, 0 when absent. Offsets to tables, strings and vectors are
//! `u32`s relative to where they are stored; a vector is a `u32` length and
//! its elements; a union is two fields, a `u8` type and the table.

/// A malformed buffer: what was read where.
pub type FbError = String;

/// A table in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    buf: &'a [u8],
    pos: usize,
    vtable: usize,
    vt_len: usize,
}

/// A vector in a buffer: `len` elements from `pos`.
#[derive(Debug, Clone, Copy)]
pub struct Vector<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Its elements.
    pub len: usize,
}

fn bytes<const N: usize>(buf: &[u8], at: usize) -> Result<[u8; N], FbError> {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .map(|b| b.try_into().expect("N bytes"))
        .ok_or_else(|| {
            format!(
                "{N} bytes at {at} lie outside the {}-byte metadata",
                buf.len()
            )
        })
}

fn u32_at(buf: &[u8], at: usize) -> Result<u32, FbError> {
    bytes::<4>(buf, at).map(u32::from_le_bytes)
}

/// The target of the `u32` offset stored at `at`.
fn follow(buf: &[u8], at: usize) -> Result<usize, FbError> {
    let off = u32_at(buf, at)? as usize;
    at.checked_add(off)
        .filter(|&t| t < buf.len())
        .ok_or_else(|| format!("an offset at {at} points outside the metadata"))
}

impl<'a> Table<'a> {
    /// The root table of `buf`.
    pub fn root(buf: &'a [u8]) -> Result<Table<'a>, FbError> {
        let pos = follow(buf, 0)?;
        Table::at(buf, pos)
    }

    fn at(buf: &'a [u8], pos: usize) -> Result<Table<'a>, FbError> {
        let soff = i32::from_le_bytes(bytes::<4>(buf, pos)?);
        let vtable = (pos as i64 - i64::from(soff)) as usize;
        let vt_len = u16::from_le_bytes(bytes::<2>(buf, vtable)?) as usize;
        if vt_len < 4 || vtable.checked_add(vt_len).is_none_or(|e| e > buf.len()) {
            return Err(format!("a table at {pos} has a corrupt vtable at {vtable}"));
        }
        Ok(Table {
            buf,
            pos,
            vtable,
            vt_len,
        })
    }

    /// Where field `slot` lies in the buffer, or `None` when absent.
    fn field(&self, slot: usize) -> Result<Option<usize>, FbError> {
        let entry = 4 + 2 * slot;
        if entry + 2 > self.vt_len {
            return Ok(None);
        }
        let off = u16::from_le_bytes(bytes::<2>(self.buf, self.vtable + entry)?) as usize;
        Ok((off != 0).then_some(self.pos + off))
    }

    fn scalar<const N: usize>(&self, slot: usize) -> Result<Option<[u8; N]>, FbError> {
        match self.field(slot)? {
            Some(at) => bytes::<N>(self.buf, at).map(Some),
            None => Ok(None),
        }
    }

    /// A `ubyte`/`bool` field (`default` when absent).
    pub fn u8(&self, slot: usize, default: u8) -> Result<u8, FbError> {
        Ok(self.scalar::<1>(slot)?.map_or(default, |b| b[0]))
    }

    /// A `short` field.
    pub fn i16(&self, slot: usize, default: i16) -> Result<i16, FbError> {
        Ok(self.scalar::<2>(slot)?.map_or(default, i16::from_le_bytes))
    }

    /// An `int` field.
    pub fn i32(&self, slot: usize, default: i32) -> Result<i32, FbError> {
        Ok(self.scalar::<4>(slot)?.map_or(default, i32::from_le_bytes))
    }

    /// A `long` field.
    pub fn i64(&self, slot: usize, default: i64) -> Result<i64, FbError> {
        Ok(self.scalar::<8>(slot)?.map_or(default, i64::from_le_bytes))
    }

    /// A table field.
    pub fn table(&self, slot: usize) -> Result<Option<Table<'a>>, FbError> {
        match self.field(slot)? {
            Some(at) => Table::at(self.buf, follow(self.buf, at)?).map(Some),
            None => Ok(None),
        }
    }

    /// A vector field.
    pub fn vector(&self, slot: usize) -> Result<Option<Vector<'a>>, FbError> {
        let Some(at) = self.field(slot)? else {
            return Ok(None);
        };
        let v = follow(self.buf, at)?;
        let len = u32_at(self.buf, v)? as usize;
        if len > self.buf.len() {
            return Err(format!(
                "a vector at {v} of {len} elements is longer than the metadata"
            ));
        }
        Ok(Some(Vector {
            buf: self.buf,
            pos: v + 4,
            len,
        }))
    }

    /// A string field (UTF-8 checked).
    pub fn string(&self, slot: usize) -> Result<Option<&'a str>, FbError> {
        let Some(v) = self.vector(slot)? else {
            return Ok(None);
        };
        let b = v.bytes(v.len)?;
        std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| format!("a string at {} is not UTF-8", v.pos))
    }
}

impl<'a> Vector<'a> {
    /// The vector's first `n` bytes (a string's, or a struct vector's).
    fn bytes(&self, n: usize) -> Result<&'a [u8], FbError> {
        self.pos
            .checked_add(n)
            .and_then(|e| self.buf.get(self.pos..e))
            .ok_or_else(|| format!("a vector at {} runs past the metadata", self.pos))
    }

    /// Element `i` of a vector of tables.
    pub fn table(&self, i: usize) -> Result<Table<'a>, FbError> {
        if i >= self.len {
            return Err(format!("element {i} of a vector of {}", self.len));
        }
        Table::at(self.buf, follow(self.buf, self.pos + 4 * i)?)
    }

    /// Element `i` of a vector of `size`-byte structs, as bytes.
    pub fn record(&self, i: usize, size: usize) -> Result<&'a [u8], FbError> {
        if i >= self.len {
            return Err(format!("element {i} of a vector of {}", self.len));
        }
        let all = self.bytes(self.len * size)?;
        Ok(&all[i * size..(i + 1) * size])
    }

    /// Element `i` of a vector of `long`s.
    pub fn i64(&self, i: usize) -> Result<i64, FbError> {
        self.record(i, 8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer holding one table: a `short` (slot 0), a string (slot 1), an
    /// absent slot 2, a vector of two longs (slot 3).
    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        // root offset -> table at 16
        b[0..4].copy_from_slice(&16u32.to_le_bytes());
        // vtable at 4: size 12, table size 16, fields: 4, 8, 0, 12
        for (i, v) in [12u16, 16, 4, 8, 0, 12].iter().enumerate() {
            b[4 + 2 * i..6 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
        // table at 16: soffset 12 (16 - 12 = 4)
        b[16..20].copy_from_slice(&12i32.to_le_bytes());
        b[20..22].copy_from_slice(&(-7i16).to_le_bytes());
        // string offset at 24 -> 32
        b[24..28].copy_from_slice(&8u32.to_le_bytes());
        b[32..36].copy_from_slice(&3u32.to_le_bytes());
        b[36..39].copy_from_slice(b"abc");
        // vector offset at 28 -> 40
        b[28..32].copy_from_slice(&12u32.to_le_bytes());
        b[40..44].copy_from_slice(&2u32.to_le_bytes());
        b[44..52].copy_from_slice(&5i64.to_le_bytes());
        b[52..60].copy_from_slice(&(-9i64).to_le_bytes());
        b
    }

    #[test]
    fn reads_fields_and_defaults() {
        let b = sample();
        let t = Table::root(&b).unwrap();
        assert_eq!(t.i16(0, 0).unwrap(), -7);
        assert_eq!(t.string(1).unwrap(), Some("abc"));
        assert_eq!(t.i32(2, 42).unwrap(), 42, "absent: the default");
        assert_eq!(t.i64(9, 1).unwrap(), 1, "past the vtable: absent");
        let v = t.vector(3).unwrap().unwrap();
        assert_eq!((v.len, v.i64(0).unwrap(), v.i64(1).unwrap()), (2, 5, -9));
        assert!(v.i64(2).is_err());
    }

    #[test]
    fn corrupt_offsets_are_errors_not_panics() {
        let good = sample();
        for at in 0..good.len() {
            for v in [0xFFu8, 0x7F, 0x80, 0x01] {
                let mut b = good.clone();
                b[at] = v;
                // Any result is fine as long as nothing panics.
                if let Ok(t) = Table::root(&b) {
                    let _ = t.i16(0, 0);
                    let _ = t.string(1);
                    if let Ok(Some(v)) = t.vector(3) {
                        let _ = v.i64(1);
                        let _ = v.table(0);
                    }
                }
            }
        }
        assert!(Table::root(&good[..8]).is_err());
        let mut b = good.clone();
        b[40..44].copy_from_slice(&1000u32.to_le_bytes());
        let t = Table::root(&b).unwrap();
        assert!(t.vector(3).is_err(), "a vector longer than the buffer");
    }
}
