//! An Arrow IPC schema as the Arrow walk needs it: each field's type, its
//! children, and where its nodes and buffers lie in a record batch.

use super::super::flatbuf::{FbError, Table};

/// Arrow's `Type` union tags (`Schema.fbs`) that the walk names.
pub(super) mod tag {
    pub const NULL: u8 = 1;
    pub const INT: u8 = 2;
    pub const BINARY: u8 = 4;
    pub const UTF8: u8 = 5;
    pub const STRUCT: u8 = 13;
    pub const UNION: u8 = 14;
    pub const FIXED_SIZE_BINARY: u8 = 15;
    pub const FIXED_SIZE_LIST: u8 = 16;
    pub const LARGE_BINARY: u8 = 19;
    pub const LARGE_UTF8: u8 = 20;
    pub const RUN_END_ENCODED: u8 = 22;
    pub const BINARY_VIEW: u8 = 23;
    pub const UTF8_VIEW: u8 = 24;
    pub const LIST_VIEW: u8 = 25;
    pub const LARGE_LIST_VIEW: u8 = 26;
    /// The last tag this reader knows.
    pub const LAST: u8 = 26;
}

/// One field of the schema.
#[derive(Debug, Clone)]
pub(super) struct Field {
    pub name: String,
    /// The `Type` union's tag.
    pub tag: u8,
    /// Dictionary-encoded: its record batch node holds indexes only.
    pub dictionary: bool,
    /// `Int`: bit width and signedness; `FixedSizeBinary`: byte width.
    pub width: i32,
    pub signed: bool,
    /// `Union`: dense (two buffers) or sparse (one).
    pub dense: bool,
    pub children: Vec<Field>,
}

/// `Field` table slots (`Schema.fbs`).
const FIELD_NAME: usize = 0;
const FIELD_TYPE_TYPE: usize = 2;
const FIELD_TYPE: usize = 3;
const FIELD_DICTIONARY: usize = 4;
const FIELD_CHILDREN: usize = 5;

impl Field {
    pub fn read(t: &Table<'_>, depth: usize) -> Result<Field, FbError> {
        if depth > 64 {
            return Err("fields nested more than 64 deep".into());
        }
        let name = t.string(FIELD_NAME)?.unwrap_or("").to_owned();
        let tag = t.u8(FIELD_TYPE_TYPE, 0)?;
        let ty = t.table(FIELD_TYPE)?;
        let (mut width, mut signed, mut dense) = (0, false, false);
        match (tag, ty) {
            // Int { bitWidth: int, is_signed: bool }
            (tag::INT, Some(ty)) => {
                width = ty.i32(0, 0)?;
                signed = ty.u8(1, 0)? != 0;
            }
            // FixedSizeBinary { byteWidth: int }
            (tag::FIXED_SIZE_BINARY, Some(ty)) => width = ty.i32(0, 0)?,
            // Union { mode: short (Sparse = 0, Dense = 1), typeIds }
            (tag::UNION, Some(ty)) => dense = ty.i16(0, 0)? == 1,
            _ => {}
        }
        let dictionary = t.table(FIELD_DICTIONARY)?.is_some();
        let mut children = Vec::new();
        if let Some(v) = t.vector(FIELD_CHILDREN)? {
            for i in 0..v.len {
                children.push(Field::read(&v.table(i)?, depth + 1)?);
            }
        }
        Ok(Field {
            name,
            tag,
            dictionary,
            width,
            signed,
            dense,
            children,
        })
    }

    /// Buffers of this field's own node in a record batch (not its
    /// children's), given the variadic data buffers of a view field.
    fn buffers(&self, variadic: &mut dyn FnMut() -> Result<u64, String>) -> Result<u64, String> {
        if self.dictionary {
            return Ok(2); // validity and indexes
        }
        Ok(match self.tag {
            tag::NULL | tag::RUN_END_ENCODED => 0,
            tag::STRUCT | tag::FIXED_SIZE_LIST => 1,
            tag::BINARY | tag::UTF8 | tag::LARGE_BINARY | tag::LARGE_UTF8 => 3,
            tag::LIST_VIEW | tag::LARGE_LIST_VIEW => 3,
            tag::BINARY_VIEW | tag::UTF8_VIEW => 2 + variadic()?,
            // Metadata version 5: no validity buffer; type ids (and offsets).
            tag::UNION => 1 + u64::from(self.dense),
            t if t == 0 || t > tag::LAST => {
                return Err(format!(
                    "the column {:?} has type tag {t}, unknown",
                    self.name
                ))
            }
            // Int, FloatingPoint, Bool, Decimal, dates and times,
            // FixedSizeBinary, List, LargeList, Map: validity and one more.
            _ => 2,
        })
    }

    /// Whether the record batch holds nodes for this field's children.
    fn has_child_nodes(&self) -> bool {
        !self.dictionary
    }
}

/// Where one field lies in a record batch: its node and its first buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub node: usize,
    pub buffer: usize,
}

/// The nodes and buffers of every field of `fields` in pre-order (the
/// order of a record batch's `nodes` and `buffers`); `variadic` are the
/// batch's `variadicBufferCounts`, one per view field in that order.
pub(super) fn slots(fields: &[Field], variadic: &[i64]) -> Result<Vec<Slot>, String> {
    fn walk(
        f: &Field,
        out: &mut Vec<Slot>,
        buffer: &mut usize,
        next_variadic: &mut dyn FnMut() -> Result<u64, String>,
    ) -> Result<(), String> {
        out.push(Slot {
            node: out.len(),
            buffer: *buffer,
        });
        *buffer += f.buffers(next_variadic)? as usize;
        if f.has_child_nodes() {
            for c in &f.children {
                walk(c, out, buffer, next_variadic)?;
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    let mut buffer = 0;
    let mut views = variadic.iter();
    let mut next_variadic = || match views.next() {
        Some(&n) if n >= 0 => Ok(n as u64),
        Some(&n) => Err(format!("a view column with {n} data buffers")),
        None => Err("more view columns than variadic buffer counts".to_owned()),
    };
    for f in fields {
        walk(f, &mut out, &mut buffer, &mut next_variadic)?;
    }
    Ok(out)
}

/// The pre-order position of the field at `path` (indexes of a top-level
/// field, then of children) among all of `fields`' fields.
pub(super) fn preorder_index(fields: &[Field], path: &[usize]) -> usize {
    fn count(f: &Field) -> usize {
        1 + if f.has_child_nodes() {
            f.children.iter().map(count).sum()
        } else {
            0
        }
    }
    let mut index = 0;
    let mut level = fields;
    for &p in path {
        index += level[..p].iter().map(count).sum::<usize>();
        // The field itself; its children follow it.
        index += 1;
        level = &level[p].children;
    }
    index - 1
}
