//! The named fields of a sample (`format = "webdataset"` datasets): its
//! bytes are a tar fragment, split by `granary_shm::tar::fields`, which
//! checks every header and never reads outside the sample.

use super::errors::{call, non_null, null};
use super::types::{GranaryField, GranarySample};
use crate::error::Error;
use granary_shm::tar::{fields, Fields};
use granary_shm::ErrorCode;
use std::ffi::{c_char, c_int, CStr};

/// The bytes of `sample`, or an error for a failed sample.
///
/// # Safety
/// `sample` was filled by `granary_batch_sample` and its batch is live.
unsafe fn bytes_of<'a>(sample: &GranarySample) -> Result<&'a [u8], Error> {
    if sample.status != 0 {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "the sample failed (status {}): it has no fields",
                sample.status
            ),
        ));
    }
    if sample.length == 0 || sample.data.is_null() {
        return Ok(&[]);
    }
    let len = usize::try_from(sample.length)
        .map_err(|_| Error::new(ErrorCode::InvalidArgument, "sample length"))?;
    // SAFETY: `data` and `length` come from granary_batch_sample, which
    // points them at a validated range of the read-only arena mapping; the
    // caller keeps the batch (and so the mapping) alive.
    Ok(unsafe { std::slice::from_raw_parts(sample.data, len) })
}

fn corrupt(e: granary_shm::tar::TarError) -> Error {
    Error::new(ErrorCode::Corrupt, format!("sample fields: {e}"))
}

/// Finds the field `name` (a member's extension, such as `"jpg"` or
/// `"cls"`) of a sample of a `format = "webdataset"` dataset: `*data` and
/// `*length` are set to its bytes, inside the sample (valid until the batch
/// is released; no copy).
///
/// Returns `GRANARY_OK`; `GRANARY_E_NOT_FOUND` when the sample has no such
/// field; `GRANARY_E_CORRUPT` when its bytes are not a well-formed tar
/// fragment (a bad header checksum, a member past the sample's end);
/// `GRANARY_E_INVALID_ARGUMENT` for NULL or a failed sample.
///
/// Thread safety: read-only; any thread while the batch is live.
///
/// # Safety
/// `sample` is NULL or was filled by `granary_batch_sample` for a batch
/// that is still live; `name` is NULL or a NUL-terminated string; `data`
/// and `length` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_sample_field(
    sample: *const GranarySample,
    name: *const c_char,
    data: *mut *const u8,
    length: *mut u64,
) -> c_int {
    call("granary_sample_field", || {
        // SAFETY: NULL or filled by granary_batch_sample, per the caller.
        let s = unsafe { sample.as_ref() }.ok_or_else(|| null("sample"))?;
        non_null(name, "name")?;
        if data.is_null() || length.is_null() {
            return Err(null("data or length"));
        }
        // SAFETY: non-null and NUL-terminated, per the caller.
        let wanted = unsafe { CStr::from_ptr(name) }.to_bytes();
        // SAFETY: see bytes_of.
        let bytes = unsafe { bytes_of(s) }?;
        match fields(bytes).find(wanted).map_err(corrupt)? {
            Some(d) => {
                // SAFETY: non-null and writable, per the caller.
                unsafe { data.write(d.as_ptr()) };
                // SAFETY: non-null and writable, per the caller.
                unsafe { length.write(d.len() as u64) };
                Ok(0)
            }
            None => Err(Error::new(
                ErrorCode::NotFound,
                format!(
                    "the sample has no field {:?}",
                    String::from_utf8_lossy(wanted)
                ),
            )),
        }
    })
}

/// Enumerates the fields of a sample: start with `*cursor = 0`; each call
/// fills `*out` with the next field (its name, the member's extension, is
/// not NUL-terminated: use `name_length`) and advances `*cursor`.
///
/// Returns 1 when `*out` was filled, 0 when there are no more fields,
/// `GRANARY_E_CORRUPT` for a malformed header (checksum, bounds),
/// `GRANARY_E_INVALID_ARGUMENT` for NULL, a failed sample or a cursor past
/// the sample's end.
///
/// # Safety
/// As `granary_sample_field`; `cursor` and `out` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_sample_next_field(
    sample: *const GranarySample,
    cursor: *mut u64,
    out: *mut GranaryField,
) -> c_int {
    call("granary_sample_next_field", || {
        // SAFETY: NULL or filled by granary_batch_sample, per the caller.
        let s = unsafe { sample.as_ref() }.ok_or_else(|| null("sample"))?;
        if cursor.is_null() || out.is_null() {
            return Err(null("cursor or out"));
        }
        // SAFETY: see bytes_of.
        let bytes = unsafe { bytes_of(s) }?;
        // SAFETY: non-null and writable, per the caller.
        let at = unsafe { cursor.read() };
        let rest = usize::try_from(at)
            .ok()
            .and_then(|a| bytes.get(a..))
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::InvalidArgument,
                    format!("cursor {at} is past the sample's {} bytes", bytes.len()),
                )
            })?;
        let mut it: Fields<'_> = fields(rest);
        match it.next() {
            None => Ok(0),
            Some(Err(e)) => Err(corrupt(e)),
            Some(Ok(f)) => {
                let field = GranaryField {
                    name: f.name.as_ptr(),
                    name_length: f.name.len() as u64,
                    data: f.data.as_ptr(),
                    length: f.data.len() as u64,
                };
                // SAFETY: non-null and writable, per the caller.
                unsafe { out.write(field) };
                // SAFETY: non-null and writable, per the caller.
                unsafe { cursor.write(at + it.position() as u64) };
                Ok(1)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::tar::{ustar_header, BLOCK};

    fn sample_of(bytes: &[u8]) -> GranarySample {
        GranarySample {
            data: bytes.as_ptr(),
            length: bytes.len() as u64,
            id: 0,
            label: 0,
            status: 0,
            crc32c: 0,
        }
    }

    fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, d) in members {
            out.extend_from_slice(&ustar_header(n.as_bytes(), d.len() as u64, 0).unwrap());
            out.extend_from_slice(d);
            out.resize(out.len().next_multiple_of(BLOCK), 0);
        }
        out
    }

    #[test]
    fn find_and_enumerate_fields_through_the_c_api() {
        let t = tar(&[("k.jpg", b"image"), ("k.cls", b"3")]);
        let s = sample_of(&t);
        let (mut p, mut n) = (std::ptr::null(), 0u64);
        // SAFETY: `s` points at `t`, alive for the test; the outputs are
        // locals.
        let rc = unsafe { granary_sample_field(&s, c"jpg".as_ptr(), &mut p, &mut n) };
        assert_eq!(rc, 0);
        // SAFETY: the field lies inside `t`.
        let got = unsafe { std::slice::from_raw_parts(p, n as usize) };
        assert_eq!(got, b"image");
        // SAFETY: as above.
        let rc = unsafe { granary_sample_field(&s, c"json".as_ptr(), &mut p, &mut n) };
        assert_eq!(rc, ErrorCode::NotFound as c_int);
        let mut cursor = 0u64;
        let mut f = GranaryField {
            name: std::ptr::null(),
            name_length: 0,
            data: std::ptr::null(),
            length: 0,
        };
        let mut names = Vec::new();
        // SAFETY: as above.
        while unsafe { granary_sample_next_field(&s, &mut cursor, &mut f) } == 1 {
            // SAFETY: the name lies inside `t`.
            names.push(
                unsafe { std::slice::from_raw_parts(f.name, f.name_length as usize) }.to_vec(),
            );
        }
        assert_eq!(names, [b"jpg".to_vec(), b"cls".to_vec()]);
        assert_eq!(cursor, t.len() as u64);
        // Damaged: CORRUPT, and NULL arguments: INVALID_ARGUMENT.
        let mut bad = t.clone();
        bad[5] ^= 1;
        let s = sample_of(&bad);
        // SAFETY: as above.
        let rc = unsafe { granary_sample_field(&s, c"cls".as_ptr(), &mut p, &mut n) };
        assert_eq!(rc, ErrorCode::Corrupt as c_int);
        // SAFETY: NULL is allowed and refused.
        let rc = unsafe { granary_sample_field(std::ptr::null(), c"cls".as_ptr(), &mut p, &mut n) };
        assert_eq!(rc, ErrorCode::InvalidArgument as c_int);
        let mut cursor = bad.len() as u64 + 1;
        // SAFETY: as above.
        let rc = unsafe { granary_sample_next_field(&s, &mut cursor, &mut f) };
        assert_eq!(rc, ErrorCode::InvalidArgument as c_int);
    }
}
