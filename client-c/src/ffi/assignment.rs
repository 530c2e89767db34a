//! The C calls of the locality-aware assignment: encoding the job's rank
//! layout and asking the agent for the assignment's digest.

use std::ffi::{c_char, c_int, CStr};
use std::ptr;

use granary_shm::ErrorCode;

use super::errors::{call, non_null, null};
use super::types::{GranaryAssignmentInfo, GranaryClient, GranarySessionOptions, GRANARY_NOTE_MAX};
use super::{fill_name, invalid, read_options};
use crate::error::Error;

/// Encodes the job's rank layout for the locality-aware assignment into
/// `buf` (`cap` bytes) and stores its length in `*len`: `node_ids[r]` is
/// the node id (`granary_peer_identity.node_id`) rank `r` of `ranks` runs
/// on, each a member of the encoded view `view` (`view_len` bytes); with
/// `workers` sessions per rank, session rank `r * workers + w` runs where
/// rank `r` does. With `buf` NULL or `cap` too small nothing is written
/// but `*len`, and the call returns `GRANARY_E_NO_MEMORY`: call again with
/// a buffer of `*len` bytes.
///
/// Returns `GRANARY_OK`, `GRANARY_E_NO_MEMORY` (see above),
/// `GRANARY_E_INVALID_ARGUMENT` (NULL, a malformed view, a node id not in
/// it, no ranks, `workers` 0).
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `view` is NULL or readable for `view_len` bytes; `node_ids` is NULL or
/// readable for `ranks` NUL-terminated strings; `buf` is NULL or writable
/// for `cap` bytes; `len` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn granary_layout_encode(
    view: *const u8,
    view_len: usize,
    node_ids: *const *const c_char,
    ranks: usize,
    workers: u32,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    call("granary_layout_encode", || {
        non_null(len, "len")?;
        non_null(view, "view")?;
        if node_ids.is_null() && ranks > 0 {
            return Err(null("node_ids"));
        }
        // SAFETY: non-null, readable for `view_len` bytes per the caller.
        let view = unsafe { std::slice::from_raw_parts(view, view_len) };
        let ptrs: &[*const c_char] = if ranks == 0 {
            &[]
        } else {
            // SAFETY: non-null, readable for `ranks` pointers per the caller.
            unsafe { std::slice::from_raw_parts(node_ids, ranks) }
        };
        let mut ids = Vec::with_capacity(ptrs.len());
        for (r, &p) in ptrs.iter().enumerate() {
            if p.is_null() {
                return Err(null(&format!("node_ids[{r}]")));
            }
            // SAFETY: non-null, NUL-terminated per the caller.
            let id = unsafe { CStr::from_ptr(p) }
                .to_str()
                .map_err(|_| invalid(format!("node_ids[{r}] is not valid UTF-8")))?;
            ids.push(id);
        }
        let bytes = crate::encode_layout(view, &ids, workers)?;
        // SAFETY: non-null, writable per the caller.
        unsafe { len.write(bytes.len()) };
        if buf.is_null() || cap < bytes.len() {
            return Err(Error::new(
                ErrorCode::NoMemory,
                format!(
                    "the layout needs {} bytes, the buffer has {cap}",
                    bytes.len()
                ),
            ));
        }
        // SAFETY: `buf` is writable for `cap` ≥ bytes.len() bytes and does
        // not overlap our vector.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
        Ok(0)
    })
}

/// Asks the agent whether the session `opts` describes (with its `view` and
/// `layout`; `locality` is ignored) could be delivered in the
/// locality-aware assignment, and stores the answer and the digest of its
/// inputs in `*out` (the caller sets `out->struct_size` first), on a
/// connection of its own. Every rank of the job asks and the job compares
/// the answers: only when every rank reports `locality` 1 with the same
/// `digest` does every rank open with `locality` 1 and that digest;
/// otherwise every rank opens in exact order (mixing the two would lose
/// and repeat samples).
///
/// Returns `GRANARY_OK` (whatever the answer), `GRANARY_E_INVALID_ARGUMENT`
/// (NULL, a bad field, `struct_size` too small), `GRANARY_E_NOT_FOUND` (no
/// such dataset), `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`.
///
/// Thread safety: may be called concurrently on the same client.
///
/// # Safety
/// `client` is NULL or a live client handle; `opts` as for
/// `granary_session_open()`; `out` is NULL or writable for
/// `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn granary_assignment_query(
    client: *const GranaryClient,
    opts: *const GranarySessionOptions,
    out: *mut GranaryAssignmentInfo,
) -> c_int {
    call("granary_assignment_query", || {
        // SAFETY: NULL or a live handle, per the caller.
        let client = unsafe { client.as_ref() }.ok_or_else(|| null("client"))?;
        // SAFETY: `out` is NULL or writable (so readable) per the caller.
        let ours = unsafe { super::answer_size(out, "info") }?;
        // SAFETY: as the caller vouches (see above).
        let options = unsafe { read_options(opts) }?;
        let a = client.client.assignment(&options)?;
        let mut info = GranaryAssignmentInfo {
            struct_size: ours as u32,
            locality: u32::from(a.locality),
            digest: a.digest,
            note: [0; GRANARY_NOTE_MAX],
        };
        fill_name(&mut info.note, &a.note);
        // SAFETY: writable for at least our size (checked above).
        unsafe { out.write_unaligned(info) };
        Ok(0)
    })
}
