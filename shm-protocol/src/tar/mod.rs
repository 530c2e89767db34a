//! Tar headers, as WebDataset shards hold them, and the named fields of a
//! sample cut from such a shard.
//!
//! A `format = "webdataset"` dataset serves each sample as the bytes of its
//! shard from the first member's 512-byte header to the end of its last
//! member's data (padded to 512 bytes): a small tar fragment. The agent
//! parses headers to build the dataset's index ([`parse_header`]); the
//! loader splits a sample into its named fields ([`fields`]). Both sides
//! use this one parser.
//!
//! The bytes are untrusted input: every header's checksum is checked, every
//! length is checked against the bytes there are, and nothing is read
//! outside the slice given. Nothing here panics on any input.
//!
//! Supported: ustar and GNU headers with names of up to 100 bytes plus the
//! ustar 155-byte prefix, octal and base-256 sizes. GNU long names (`L`,
//! `K`) and pax extended headers (`x`) are refused with
//! [`TarError::Unsupported`]; pax global headers (`g`) are skipped.

use std::fmt;

/// A tar block: headers and data are laid out in units of it.
pub const BLOCK: usize = 512;

/// What one header describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    /// A regular file (`'0'` or NUL).
    File,
    /// A GNU long name or long link name (`L`, `K`), or a pax extended
    /// header (`x`): the next member's name is not in its own header.
    LongName,
    /// A pax global header (`g`): applies to the archive, skipped.
    Global,
    /// Anything else (directories, links, devices): no sample data.
    Other,
}

/// A parsed tar header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// The ustar prefix (empty when none): the member's path is
    /// `prefix/name`.
    pub prefix: &'a [u8],
    /// The name field, up to its first NUL.
    pub name: &'a [u8],
    /// Bytes of data after the header.
    pub size: u64,
    /// What the member is.
    pub kind: MemberKind,
    /// The type flag byte.
    pub typeflag: u8,
}

impl<'a> Header<'a> {
    /// The last component of the member's path.
    pub fn basename(&self) -> &'a [u8] {
        match self.name.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.name[i + 1..],
            None => self.name,
        }
    }

    /// The WebDataset extension: the basename after its first dot (`jpg`,
    /// `seg.png`); `None` when the basename has no dot.
    pub fn extension(&self) -> Option<&'a [u8]> {
        let base = self.basename();
        let dot = base.iter().position(|&b| b == b'.')?;
        Some(&base[dot + 1..])
    }

    /// The WebDataset key: the whole path up to the first dot of the
    /// basename, written into `out` (cleared first). Members with equal
    /// keys that follow each other form one sample.
    pub fn key_into(&self, out: &mut Vec<u8>) {
        out.clear();
        if !self.prefix.is_empty() {
            out.extend_from_slice(self.prefix);
            out.push(b'/');
        }
        let base = self.basename();
        let dir_len = self.name.len() - base.len();
        out.extend_from_slice(&self.name[..dir_len]);
        let stem = base.iter().position(|&b| b == b'.').unwrap_or(base.len());
        out.extend_from_slice(&base[..stem]);
    }

    /// Bytes from the header's start to the end of its data rounded up to
    /// a block (`None` on overflow).
    pub fn padded_span(&self) -> Option<u64> {
        let data = self.size.checked_add(BLOCK as u64 - 1)? / BLOCK as u64 * BLOCK as u64;
        data.checked_add(BLOCK as u64)
    }
}

/// Why a header or a sample's fields could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarError {
    /// The stored checksum is not the header's.
    Checksum {
        /// The checksum field's value (`None`: not a number).
        stored: Option<u64>,
        /// The sum of the header's bytes.
        computed: u64,
    },
    /// A numeric field is not octal or base-256.
    BadNumber(&'static str),
    /// A header or its data runs past the bytes there are.
    Truncated {
        /// Bytes needed from the header's start.
        needed: u64,
        /// Bytes there are from the header's start.
        available: u64,
    },
    /// A member kind this parser does not follow (a GNU long name or a pax
    /// extended header), with its type flag.
    Unsupported(u8),
}

impl fmt::Display for TarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TarError::Checksum {
                stored: Some(s),
                computed,
            } => write!(
                f,
                "bad tar header checksum (stored {s}, computed {computed}): not a tar header, or corrupt"
            ),
            TarError::Checksum {
                stored: None,
                computed,
            } => write!(
                f,
                "bad tar header checksum (stored field is not a number, computed {computed}): not a tar header, or corrupt"
            ),
            TarError::BadNumber(field) => write!(f, "tar header field `{field}` is not a number"),
            TarError::Truncated { needed, available } => write!(
                f,
                "tar member truncated: needs {needed} bytes from its header, {available} there"
            ),
            TarError::Unsupported(t) => write!(
                f,
                "tar member of type {:?} (GNU long name or pax extended header) is not supported: \
                 member names must fit the ustar name and prefix fields",
                char::from(*t)
            ),
        }
    }
}

impl std::error::Error for TarError {}

/// The bytes of `field` up to its first NUL.
fn cstr(field: &[u8]) -> &[u8] {
    match field.iter().position(|&b| b == 0) {
        Some(i) => &field[..i],
        None => field,
    }
}

/// An octal number (spaces and NULs around it allowed) or a GNU base-256
/// number (first byte's high bit set).
fn number(field: &[u8], name: &'static str) -> Result<u64, TarError> {
    if let Some((&first, rest)) = field.split_first() {
        if first & 0x80 != 0 {
            if first & 0x40 != 0 {
                return Err(TarError::BadNumber(name)); // negative
            }
            let mut v = u64::from(first & 0x3f);
            for &b in rest {
                v = v
                    .checked_mul(256)
                    .and_then(|v| v.checked_add(u64::from(b)))
                    .ok_or(TarError::BadNumber(name))?;
            }
            return Ok(v);
        }
    }
    let digits = cstr(field).trim_ascii();
    if digits.is_empty() {
        return Ok(0);
    }
    let mut v: u64 = 0;
    for &b in digits {
        if !(b'0'..=b'7').contains(&b) {
            return Err(TarError::BadNumber(name));
        }
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(TarError::BadNumber(name))?;
    }
    Ok(v)
}

/// Parses one 512-byte header block. `Ok(None)`: a block of zeros (the
/// end of the archive).
pub fn parse_header(block: &[u8; BLOCK]) -> Result<Option<Header<'_>>, TarError> {
    if block.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let stored = number(&block[148..156], "chksum").ok();
    let computed: u64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                u64::from(b' ')
            } else {
                u64::from(b)
            }
        })
        .sum();
    // Some old writers summed signed bytes.
    let signed: i64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                i64::from(b' ')
            } else {
                i64::from(b as i8)
            }
        })
        .sum();
    if stored != Some(computed) && stored.map(|s| s as i64) != Some(signed) {
        return Err(TarError::Checksum { stored, computed });
    }
    let size = number(&block[124..136], "size")?;
    let typeflag = block[156];
    let kind = match typeflag {
        b'0' | 0 | b'7' => MemberKind::File,
        b'L' | b'K' | b'x' => MemberKind::LongName,
        b'g' => MemberKind::Global,
        _ => MemberKind::Other,
    };
    // POSIX ustar (not GNU, whose magic is "ustar  " and who keeps other
    // fields there) has the prefix field.
    let ustar = &block[257..263] == b"ustar\0";
    let prefix = if ustar { cstr(&block[345..500]) } else { &[] };
    Ok(Some(Header {
        prefix,
        name: cstr(&block[..100]),
        size,
        kind,
        typeflag,
    }))
}

/// One named field of a sample: a tar member's extension and its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The member's extension (`jpg`, `cls`, `seg.png`).
    pub name: &'a [u8],
    /// The member's data.
    pub data: &'a [u8],
}

/// The fields of a sample's bytes (a tar fragment), in order; see
/// [`fields`].
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
}

/// The named fields of a WebDataset sample: every regular member, by
/// extension, in the order they are stored. Members without an extension,
/// directories and pax global headers are skipped. The iterator ends at
/// the end of the bytes or at a block of zeros; a bad header (checksum,
/// number, a member past the end of the bytes, a GNU long name or pax
/// extended header) is yielded as an error, once, and ends it.
pub fn fields(bytes: &[u8]) -> Fields<'_> {
    Fields {
        bytes,
        pos: 0,
        done: false,
    }
}

impl<'a> Fields<'a> {
    /// The first field named `name`, if any (stops at the first error).
    pub fn find(self, name: &[u8]) -> Result<Option<&'a [u8]>, TarError> {
        for f in self {
            let f = f?;
            if f.name == name {
                return Ok(Some(f.data));
            }
        }
        Ok(None)
    }

    /// Where the next header starts (the bytes consumed so far).
    pub fn position(&self) -> usize {
        self.pos
    }

    fn fail(&mut self, e: TarError) -> Option<Result<Field<'a>, TarError>> {
        self.done = true;
        Some(Err(e))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, TarError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
            if rest.is_empty() {
                self.done = true;
                return None;
            }
            let Some(block) = rest.first_chunk::<BLOCK>() else {
                return self.fail(TarError::Truncated {
                    needed: BLOCK as u64,
                    available: rest.len() as u64,
                });
            };
            let header = match parse_header(block) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => return self.fail(e),
            };
            if header.kind == MemberKind::LongName {
                return self.fail(TarError::Unsupported(header.typeflag));
            }
            let data_end = (BLOCK as u64).checked_add(header.size);
            let data = match data_end {
                Some(end) if end <= rest.len() as u64 => &rest[BLOCK..end as usize],
                _ => {
                    return self.fail(TarError::Truncated {
                        needed: data_end.unwrap_or(u64::MAX),
                        available: rest.len() as u64,
                    })
                }
            };
            // The last member's padding may be cut off; the span is capped
            // at the bytes there are.
            let span = header
                .padded_span()
                .map_or(rest.len(), |s| s.min(rest.len() as u64) as usize);
            self.pos += span;
            if header.kind != MemberKind::File {
                continue;
            }
            if let Some(name) = header.extension() {
                return Some(Ok(Field { name, data }));
            }
        }
    }
}

/// Writes a ustar header for a regular file `name` of `size` bytes into
/// `out` (for writers of shards and for tests). `name` must fit the
/// 100-byte name field, or be split at a `/` into a prefix of at most 155
/// bytes and a name of at most 100; `None` otherwise.
pub fn ustar_header(name: &[u8], size: u64, mtime: u64) -> Option<[u8; BLOCK]> {
    let mut h = [0u8; BLOCK];
    if name.len() <= 100 {
        h[..name.len()].copy_from_slice(name);
    } else {
        let cut = name[..name.len().min(156)]
            .iter()
            .rposition(|&b| b == b'/')
            .filter(|&i| name.len() - i - 1 <= 100 && i > 0)?;
        h[345..345 + cut].copy_from_slice(&name[..cut]);
        let base = &name[cut + 1..];
        h[..base.len()].copy_from_slice(base);
    }
    let octal = |field: &mut [u8], v: u64| -> Option<()> {
        let s = format!("{v:0w$o}", w = field.len() - 1);
        if s.len() >= field.len() {
            return None;
        }
        field[..s.len()].copy_from_slice(s.as_bytes());
        Some(())
    };
    octal(&mut h[100..108], 0o644)?;
    octal(&mut h[108..116], 0)?;
    octal(&mut h[116..124], 0)?;
    octal(&mut h[124..136], size)?;
    octal(&mut h[136..148], mtime)?;
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    Some(h)
}

#[cfg(test)]
mod tests;
