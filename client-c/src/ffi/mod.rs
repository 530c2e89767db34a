//! The C API (`include/granary.h` is generated from this module).
//!
//! Conventions: every function that can fail returns an `int`,
//! `GRANARY_OK` (0) or a negative `GRANARY_E_*` code, and leaves a detail
//! message for `granary_last_error_message()`. Every pointer argument is
//! checked for NULL. No panic crosses the boundary. Handles are opaque and
//! come in create/destroy pairs.

mod assignment;
mod errors;
mod fields;
mod types;

pub use fields::{granary_sample_field, granary_sample_next_field};
pub use types::*;

use std::collections::HashSet;
use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;
use std::time::Duration;

use granary_shm::handshake::{MAX_LAYOUT_BYTES, MAX_VIEW_BYTES};
use granary_shm::ErrorCode;

use crate::batch::Batch;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use errors::{call, non_null, null, value};

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidArgument, message)
}

/// A copy of the `len` bytes at `ptr` (an optional buffer of the options,
/// field `what`): `None` when `ptr` is NULL, an error when `len` is over
/// `limit`.
///
/// # Safety
/// `ptr` is NULL or readable for `len` bytes.
unsafe fn optional_bytes(
    ptr: *const u8,
    len: usize,
    limit: u32,
    what: &str,
) -> Result<Option<Vec<u8>>> {
    if ptr.is_null() {
        return Ok(None);
    }
    if len > limit as usize {
        return Err(invalid(format!(
            "options.{what}_len is {len}, the limit is {limit}"
        )));
    }
    // SAFETY: non-null, and readable for `len` bytes per the caller.
    Ok(Some(
        unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec(),
    ))
}

/// Checks a struct the caller passes for an answer: `out` is not NULL and
/// its `struct_size` (the first field, set by the caller) is at least the
/// size of `T` (an error naming the struct `what` otherwise). Returns the
/// size of `T`.
///
/// # Safety
/// `out` is NULL or readable for its first four bytes.
unsafe fn answer_size<T>(out: *mut T, what: &str) -> Result<usize> {
    non_null(out, "out")?;
    // SAFETY: non-null and readable per the caller; `struct_size` is the
    // first field.
    let size = unsafe { out.cast::<u32>().cast_const().read_unaligned() } as usize;
    let ours = std::mem::size_of::<T>();
    if size < ours {
        return Err(invalid(format!(
            "{what}.struct_size is {size}, at least {ours} is required"
        )));
    }
    Ok(ours)
}

/// Converts a `timeout_ms` argument: negative waits forever.
fn timeout(timeout_ms: c_int) -> Option<Duration> {
    u64::try_from(timeout_ms).ok().map(Duration::from_millis)
}

/// Clears `*out` (so that every failure leaves NULL there) and returns it.
///
/// # Safety
/// `out` is null or valid for writing one pointer.
unsafe fn clear_out<T>(out: *mut *mut T, what: &str) -> Result<*mut *mut T> {
    non_null(out, what)?;
    // SAFETY: non-null, and the caller vouches it is writable.
    unsafe { out.write(ptr::null_mut()) };
    Ok(out)
}

/// Copies the caller's options into [`SessionOptions`].
///
/// # Safety
/// `opts` is null or points at a readable struct of at least
/// `opts->struct_size` bytes whose `dataset` is null or a NUL-terminated
/// string.
unsafe fn read_options(opts: *const GranarySessionOptions) -> Result<SessionOptions> {
    non_null(opts, "options")?;
    // SAFETY: `struct_size` is the first field (offset 0) of every version
    // of the struct; the caller vouches the struct is readable.
    let size = unsafe { opts.cast::<u32>().read_unaligned() } as usize;
    if size < OPTIONS_V1_SIZE {
        return Err(invalid(format!(
            "options.struct_size is {size}, at least {OPTIONS_V1_SIZE} is required (call granary_session_options_init)"
        )));
    }
    // Fields past the caller's struct (an older header) keep their
    // defaults.
    let mut o = default_options();
    let n = size.min(std::mem::size_of::<GranarySessionOptions>());
    // SAFETY: the caller's struct is readable for `struct_size` ≥ n bytes;
    // `o` is ours and n is at most its size; the two do not overlap.
    unsafe { ptr::copy_nonoverlapping(opts.cast::<u8>(), ptr::addr_of_mut!(o).cast::<u8>(), n) };
    if !(1..=GRANARY_ABI_VERSION).contains(&o.abi_version) {
        return Err(Error::new(
            ErrorCode::Version,
            format!(
                "options.abi_version is {}, this library speaks 1..={GRANARY_ABI_VERSION}",
                o.abi_version
            ),
        ));
    }
    let mut s = if o.resume_state.is_null() {
        non_null(o.dataset, "options.dataset")?;
        // SAFETY: non-null, and the caller vouches for a NUL-terminated
        // string.
        let dataset = unsafe { CStr::from_ptr(o.dataset) }
            .to_str()
            .map_err(|_| invalid("options.dataset is not valid UTF-8"))?;
        let mut s = SessionOptions::new(dataset);
        s.seed = o.seed;
        s.first_epoch = o.first_epoch;
        s.epoch_count = o.epoch_count;
        s.batch_size = o.batch_size;
        s.rank = o.rank;
        s.world_size = o.world_size;
        s.drop_last = o.drop_last != 0;
        s.locality = (o.locality != 0).then_some(o.locality_digest);
        s.first_batch = o.first_batch;
        s.worker = o.worker;
        s.workers = o.workers.max(1);
        s
    } else {
        if o.resume_state_len > GRANARY_STATE_MAX {
            return Err(invalid(format!(
                "options.resume_state_len is {}, the limit is {GRANARY_STATE_MAX}",
                o.resume_state_len
            )));
        }
        // SAFETY: non-null, and the caller vouches for `resume_state_len`
        // readable bytes.
        let state = unsafe { std::slice::from_raw_parts(o.resume_state, o.resume_state_len) };
        SessionOptions::from_state(state, o.accept_changed_dataset != 0)?
    };
    s.ready_capacity = o.ready_capacity;
    s.release_capacity = o.release_capacity;
    // SAFETY: the caller vouches for `view_len` readable bytes at `view`.
    if let Some(view) = unsafe { optional_bytes(o.view, o.view_len, MAX_VIEW_BYTES, "view") }? {
        s.view = Some(view);
    }
    s.view_required = o.view_required != 0;
    // SAFETY: the caller vouches for `layout_len` readable bytes at `layout`.
    let layout = unsafe { optional_bytes(o.layout, o.layout_len, MAX_LAYOUT_BYTES, "layout") }?;
    if let Some(layout) = layout {
        s.layout = Some(layout);
    }
    s.verify_crc = o.no_crc_check == 0;
    s.resume_timeout = match o.resume_timeout_ms {
        0 => Some(crate::DEFAULT_RESUME_TIMEOUT),
        GRANARY_RESUME_OFF => None,
        ms => Some(Duration::from_millis(u64::from(ms))),
    };
    Ok(s)
}

/// Hands a batch to C: boxes it, records the handle in the session, and
/// returns the batch's own status (0, or its per-batch error code).
fn lend(s: &mut GranarySession, batch: Batch, out: *mut *mut GranaryBatch) -> c_int {
    let status = batch.status();
    if status != 0 {
        errors::set_last_error(format!(
            "batch {} of epoch {} carries status {status} ({})",
            batch.index(),
            batch.epoch(),
            errors::describe(status).to_string_lossy()
        ));
    }
    let handle = Box::into_raw(Box::new(GranaryBatch { batch }));
    s.live.insert(handle as usize);
    // SAFETY: `out` was checked non-null and writable by `clear_out`.
    unsafe { out.write(handle) };
    status
}

/// The ABI version this library implements (`GRANARY_ABI_VERSION` of its
/// header).
///
/// Thread safety: may be called from any thread at any time.
#[no_mangle]
pub extern "C" fn granary_abi_version() -> u32 {
    GRANARY_ABI_VERSION
}

/// A static, NUL-terminated description of `code`; "unknown error" for a
/// value that is not a `GRANARY_E_*` code. Never NULL; never free it.
///
/// Thread safety: may be called from any thread at any time.
#[no_mangle]
pub extern "C" fn granary_strerror(code: c_int) -> *const c_char {
    value(errors::UNKNOWN.as_ptr(), || errors::describe(code).as_ptr())
}

/// The detail of the last failure on the calling thread (for example the
/// agent's own words when it refused a session); "" if none yet. Never
/// NULL; valid until the next failing call on the same thread; never free it.
///
/// Thread safety: per thread; each thread sees its own message.
#[no_mangle]
pub extern "C" fn granary_last_error_message() -> *const c_char {
    value(c"".as_ptr(), errors::last_error_ptr)
}

/// Connects to the agent listening on the Unix socket `socket_path` and
/// stores a new client handle in `*out` (NULL on failure).
///
/// Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT`,
/// `GRANARY_E_DISCONNECTED` (no agent there), `GRANARY_E_PERMISSION`.
///
/// Thread safety: may be called from any thread. A client may be shared by
/// threads that open sessions on it concurrently.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn granary_connect(
    socket_path: *const c_char,
    out: *mut *mut GranaryClient,
) -> c_int {
    call("granary_connect", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { clear_out(out, "out") }?;
        non_null(socket_path, "socket_path")?;
        // SAFETY: non-null, and the caller vouches for a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(socket_path) };
        let client = Client::connect(Path::new(OsStr::from_bytes(path.to_bytes())))?;
        let handle = Box::into_raw(Box::new(GranaryClient { client }));
        // SAFETY: checked non-null and writable by `clear_out`.
        unsafe { out.write(handle) };
        Ok(0)
    })
}

/// Frees a client. Sessions opened from it stay open and usable. NULL is
/// ignored.
///
/// Thread safety: no other call may use the client at the same time.
///
/// # Safety
/// `client` is NULL or a handle from `granary_connect` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn granary_client_free(client: *mut GranaryClient) {
    value((), || {
        if !client.is_null() {
            // SAFETY: the caller passes a live handle from granary_connect,
            // which came from Box::into_raw; it is freed exactly once.
            drop(unsafe { Box::from_raw(client) });
        }
    })
}

fn default_options() -> GranarySessionOptions {
    // The defaults are `SessionOptions::new`'s: the C struct only encodes
    // them (resume_timeout_ms 0 and workers 0 stand for the defaults).
    let d = SessionOptions::new("");
    GranarySessionOptions {
        struct_size: std::mem::size_of::<GranarySessionOptions>() as u32,
        abi_version: GRANARY_ABI_VERSION,
        dataset: ptr::null(),
        seed: d.seed,
        first_epoch: d.first_epoch,
        epoch_count: d.epoch_count,
        batch_size: d.batch_size,
        rank: d.rank,
        world_size: d.world_size,
        drop_last: u32::from(d.drop_last),
        ready_capacity: d.ready_capacity,
        release_capacity: d.release_capacity,
        view: ptr::null(),
        view_len: 0,
        view_required: u32::from(d.view_required),
        reserved: 0,
        layout: ptr::null(),
        layout_len: 0,
        locality: 0,
        reserved2: 0,
        locality_digest: [0; 32],
        no_crc_check: u32::from(!d.verify_crc),
        resume_timeout_ms: 0,
        first_batch: d.first_batch,
        resume_state: ptr::null(),
        resume_state_len: 0,
        accept_changed_dataset: 0,
        worker: d.worker,
        workers: 0,
        reserved3: 0,
    }
}

/// Fills `*opts` with the defaults (seed 0, epoch 0, one epoch, batches of
/// 32, rank 0 of 1, keep partial batches, the agent's ring sizes, no
/// dataset) and sets `struct_size` and `abi_version`.
///
/// Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (NULL).
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `opts` is NULL or writable for `sizeof(granary_session_options)` bytes.
#[no_mangle]
pub unsafe extern "C" fn granary_session_options_init(opts: *mut GranarySessionOptions) -> c_int {
    call("granary_session_options_init", || {
        non_null(opts, "options")?;
        let defaults = default_options();
        // SAFETY: non-null, and the caller vouches it is writable for the
        // struct's size.
        unsafe { opts.write_unaligned(defaults) };
        Ok(0)
    })
}

/// Opens a session on `client` and stores its handle in `*out` (NULL on
/// failure). Sends the request, waits (up to 30 s) for the agent's answer,
/// maps the arena read-only and attaches the ring segment.
///
/// Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL pointer, bad
/// field, `struct_size` too small), `GRANARY_E_VERSION` (`abi_version` not
/// spoken), or what the agent answered: `GRANARY_E_NOT_FOUND` (unknown
/// dataset), `GRANARY_E_PERMISSION`, `GRANARY_E_BUSY`, ...; also
/// `GRANARY_E_DISCONNECTED`, `GRANARY_E_TIMEOUT`, `GRANARY_E_PROTOCOL`.
///
/// Thread safety: may be called concurrently on the same client.
///
/// # Safety
/// `client` is NULL or a live client handle; `opts` is NULL or a readable
/// options struct (see `struct_size`); `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_session_open(
    client: *const GranaryClient,
    opts: *const GranarySessionOptions,
    out: *mut *mut GranarySession,
) -> c_int {
    call("granary_session_open", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { clear_out(out, "out") }?;
        // SAFETY: NULL or a live handle, per the caller.
        let client = unsafe { client.as_ref() }.ok_or_else(|| null("client"))?;
        // SAFETY: forwarded from the caller.
        let options = unsafe { read_options(opts) }?;
        let session = client.client.open_session(&options)?;
        let handle = Box::into_raw(Box::new(GranarySession {
            session,
            live: HashSet::new(),
        }));
        // SAFETY: checked non-null and writable by `clear_out`.
        unsafe { out.write(handle) };
        Ok(0)
    })
}

/// Fills `*out` with the session's id, samples and batches per epoch,
/// arena size and ring capacities. The caller sets `out->struct_size`
/// first; the library writes this version's fields and sets `struct_size`
/// to the size it wrote.
///
/// Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT`.
///
/// Thread safety: like every call on a session, one thread at a time.
///
/// # Safety
/// `session` is NULL or a live session handle; `out` is NULL or writable
/// for `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn granary_session_get_info(
    session: *const GranarySession,
    out: *mut GranarySessionInfo,
) -> c_int {
    call("granary_session_get_info", || {
        // SAFETY: NULL or a live handle, per the caller.
        let s = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        non_null(out, "info")?;
        // SAFETY: non-null and readable per the caller; `struct_size` is the
        // first field (offset 0) of every version of the struct.
        let size = unsafe { out.cast::<u32>().cast_const().read_unaligned() };
        let v1 = SESSION_INFO_V1_SIZE;
        if (size as usize) < v1 {
            return Err(invalid(format!(
                "info.struct_size is {size}, at least {v1} is required"
            )));
        }
        // Fields past the caller's struct (an older header) are not
        // written.
        let n = (size as usize).min(std::mem::size_of::<GranarySessionInfo>());
        let i = s.session.info();
        let info = GranarySessionInfo {
            struct_size: n as u32,
            ready_capacity: i.ready_capacity,
            release_capacity: i.release_capacity,
            reserved: 0,
            session_id: i.session_id,
            samples_per_epoch: i.samples_per_epoch,
            batches_per_epoch: i.batches_per_epoch,
            arena_size: i.arena_size,
            rank_batches_per_epoch: i.rank_batches_per_epoch,
            prepared_height: i.prepared.map_or(0, |p| p[0]),
            prepared_width: i.prepared.map_or(0, |p| p[1]),
            prepared_channels: i.prepared.map_or(0, |p| p[2]),
            reserved2: 0,
        };
        // SAFETY: the caller's struct is writable for `struct_size` ≥ n
        // bytes; `info` is ours, n is at most its size, they do not overlap.
        unsafe { ptr::copy_nonoverlapping(ptr::addr_of!(info).cast::<u8>(), out.cast::<u8>(), n) };
        Ok(0)
    })
}

/// Stores the first byte and the size of the session's read-only arena
/// mapping in `*base` and `*size`. Every sample's `data` lies in
/// `[base, base + size)`; the mapping stays valid until the session is
/// closed. Useful to check that a loader reads samples in place, or to
/// register the arena once with a device (e.g. as pinned host memory).
///
/// Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (a NULL argument).
///
/// Thread safety: read-only; any thread while the session is open.
///
/// # Safety
/// `session` is NULL or a live session handle; `base` and `size` are NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_session_arena(
    session: *const GranarySession,
    base: *mut *const u8,
    size: *mut u64,
) -> c_int {
    call("granary_session_arena", || {
        // SAFETY: NULL or a live handle, per the caller.
        let s = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        non_null(base, "base")?;
        non_null(size, "size")?;
        let (b, n) = s.session.arena();
        // SAFETY: non-null, and the caller vouches it is writable.
        unsafe { base.write(b) };
        // SAFETY: as above.
        unsafe { size.write(n) };
        Ok(0)
    })
}

/// Takes the next batch and stores its handle in `*out`. Waits up to
/// `timeout_ms` milliseconds; a negative value (`GRANARY_WAIT_FOREVER`)
/// waits without limit, 0 does not wait.
///
/// Returns `GRANARY_OK` with a batch; or, with a batch in `*out` too, the
/// batch's own negative status when the agent could not fill it (e.g.
/// `GRANARY_E_IO`): inspect it and release it like any other. With `*out`
/// NULL: `GRANARY_E_END_OF_STREAM` (all epochs delivered),
/// `GRANARY_E_TIMEOUT`, `GRANARY_E_WOULD_BLOCK` (timeout 0, nothing ready),
/// `GRANARY_E_FENCED`, `GRANARY_E_DISCONNECTED` (the agent went away; a dead
/// agent never blocks the caller past its timeout), `GRANARY_E_CORRUPT` (a
/// descriptor failed validation; the stream goes on), or
/// `GRANARY_E_INVALID_ARGUMENT`.
///
/// Thread safety: one thread at a time per session.
///
/// # Safety
/// `session` is NULL or a live session handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_next_batch(
    session: *mut GranarySession,
    timeout_ms: c_int,
    out: *mut *mut GranaryBatch,
) -> c_int {
    call("granary_next_batch", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { clear_out(out, "out") }?;
        // SAFETY: NULL or a live handle used by this thread only, per the caller.
        let s = unsafe { session.as_mut() }.ok_or_else(|| null("session"))?;
        let batch = s.session.next_batch(timeout(timeout_ms))?;
        Ok(lend(s, batch, out))
    })
}

/// `granary_next_batch(session, 0, out)`: `GRANARY_E_WOULD_BLOCK` when no
/// batch is ready.
///
/// Thread safety: one thread at a time per session.
///
/// # Safety
/// As for `granary_next_batch`.
#[no_mangle]
pub unsafe extern "C" fn granary_try_next_batch(
    session: *mut GranarySession,
    out: *mut *mut GranaryBatch,
) -> c_int {
    // SAFETY: same contract.
    unsafe { granary_next_batch(session, 0, out) }
}

/// Number of samples in the batch (0 for NULL).
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_len(batch: *const GranaryBatch) -> usize {
    // SAFETY: NULL or a live handle, per the caller.
    value(0, || unsafe { batch.as_ref() }.map_or(0, |b| b.batch.len()))
}

/// Epoch of the batch (0 for NULL).
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_epoch(batch: *const GranaryBatch) -> u32 {
    value(0, || {
        // SAFETY: NULL or a live handle, per the caller.
        unsafe { batch.as_ref() }.map_or(0, |b| b.batch.epoch())
    })
}

/// Index of the batch within its epoch for this rank (0 for NULL).
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_index(batch: *const GranaryBatch) -> u64 {
    value(0, || {
        // SAFETY: NULL or a live handle, per the caller.
        unsafe { batch.as_ref() }.map_or(0, |b| b.batch.index())
    })
}

/// `GRANARY_BATCH_END_OF_EPOCH` and/or `GRANARY_BATCH_END_OF_STREAM`
/// (0 for NULL).
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_flags(batch: *const GranaryBatch) -> u32 {
    value(0, || {
        // SAFETY: NULL or a live handle, per the caller.
        unsafe { batch.as_ref() }.map_or(0, |b| {
            let mut flags = 0;
            if b.batch.is_end_of_epoch() {
                flags |= GRANARY_BATCH_END_OF_EPOCH;
            }
            if b.batch.is_end_of_stream() {
                flags |= GRANARY_BATCH_END_OF_STREAM;
            }
            flags
        })
    })
}

/// 0, or the batch's negative `GRANARY_E_*` status (e.g. `GRANARY_E_IO`);
/// `GRANARY_E_INVALID_ARGUMENT` for NULL.
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_status(batch: *const GranaryBatch) -> c_int {
    call("granary_batch_status", || {
        // SAFETY: NULL or a live handle, per the caller.
        let b = unsafe { batch.as_ref() }.ok_or_else(|| null("batch"))?;
        Ok(b.batch.status())
    })
}

/// Fills `*out` with sample `i` (0-based, below `granary_batch_len`). Its
/// `data` points into the read-only arena and stays valid until the batch
/// is released.
///
/// Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (NULL, `i` out of range).
///
/// Thread safety: read-only; any thread while the batch is not being released.
///
/// # Safety
/// `batch` is NULL or a live batch handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_sample(
    batch: *const GranaryBatch,
    i: usize,
    out: *mut GranarySample,
) -> c_int {
    call("granary_batch_sample", || {
        // SAFETY: NULL or a live handle, per the caller.
        let b = unsafe { batch.as_ref() }.ok_or_else(|| null("batch"))?;
        non_null(out, "out")?;
        let s = b.batch.sample(i).ok_or_else(|| {
            invalid(format!(
                "sample index {i} is out of range (the batch has {})",
                b.batch.len()
            ))
        })?;
        let sample = GranarySample {
            data: s.as_ptr(),
            length: s.len() as u64,
            id: s.id(),
            label: s.label(),
            status: s.status(),
            crc32c: s.crc32c(),
        };
        // SAFETY: non-null, and the caller vouches it is writable.
        unsafe { out.write(sample) };
        Ok(0)
    })
}

/// Hands the batch back to the agent and frees its handle; its sample
/// pointers become invalid. Every batch must be released, including those
/// that carry an error status.
///
/// Returns `GRANARY_OK`; `GRANARY_E_INVALID_ARGUMENT` for NULL or a batch
/// that this session did not lend or that was already released (then
/// nothing is freed); `GRANARY_E_FENCED` / `GRANARY_E_DISCONNECTED` if the
/// release ring stayed full and the agent is gone, `GRANARY_E_CORRUPT` if
/// the agent broke the ring (the handle is freed in these cases too). A
/// release that finds the ring full for a second is kept and pushed by a
/// later call.
///
/// Thread safety: one thread at a time per session.
///
/// # Safety
/// `session` is NULL or a live session handle; `batch` is NULL or a
/// pointer that `granary_next_batch` stored (it is checked against the
/// session's outstanding batches before use).
#[no_mangle]
pub unsafe extern "C" fn granary_batch_release(
    session: *mut GranarySession,
    batch: *mut GranaryBatch,
) -> c_int {
    call("granary_batch_release", || {
        // SAFETY: NULL or a live handle used by this thread only, per the caller.
        let s = unsafe { session.as_mut() }.ok_or_else(|| null("session"))?;
        non_null(batch, "batch")?;
        if !s.live.remove(&(batch as usize)) {
            return Err(invalid(
                "the batch was not lent by this session, or was already released",
            ));
        }
        // SAFETY: the address was recorded when this session boxed the
        // batch and removed just now, so it is a live Box freed exactly once.
        let handle = unsafe { Box::from_raw(batch) };
        s.session.release(handle.batch)?;
        Ok(0)
    })
}

/// Releases every batch the session still lends (their handles are freed),
/// tells the agent the session is over, unmaps its memory and frees the
/// handle.
///
/// Returns `GRANARY_OK` (also when the agent is already gone),
/// `GRANARY_E_INVALID_ARGUMENT` (NULL), or `GRANARY_E_CORRUPT` if the agent
/// broke the release ring; the handle is freed in every case but NULL.
///
/// Thread safety: no other call may use the session or its batches at the
/// same time.
///
/// # Safety
/// `session` is NULL or a live session handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn granary_session_close(session: *mut GranarySession) -> c_int {
    call("granary_session_close", || {
        non_null(session, "session")?;
        // SAFETY: a live handle from granary_session_open (Box::into_raw),
        // freed exactly once, here.
        let s = unsafe { Box::from_raw(session) };
        let GranarySession { session, live } = *s;
        for addr in live {
            // SAFETY: every recorded address is a live Box<GranaryBatch>
            // this session created and nobody released; dropping the batch
            // queues its release for `close` to push.
            drop(unsafe { Box::from_raw(addr as *mut GranaryBatch) });
        }
        session.close()?;
        Ok(0)
    })
}

/// Copies `s` into a NUL-terminated C array, cut at a character boundary.
fn fill_name(dst: &mut [c_char], s: &str) {
    let Some(room) = dst.len().checked_sub(1) else {
        return;
    };
    let mut end = s.len().min(room);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..end]) {
        *d = b as c_char;
    }
    dst[end] = 0;
}

/// Asks the agent who it is among its job's agents and stores the answer
/// in `*out` (the caller sets `out->struct_size` first). Each rank of a job
/// asks its own agent; the job gathers the answers and builds its view
/// with `granary_view_encode()`. Waits up to `timeout_ms`
/// (`GRANARY_WAIT_FOREVER`: no limit) on a connection of its own.
///
/// Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, `struct_size`
/// too small), `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`,
/// `GRANARY_E_PROTOCOL`.
///
/// Thread safety: may be called concurrently on the same client.
///
/// # Safety
/// `client` is NULL or a live client handle; `out` is NULL or writable for
/// `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn granary_get_peer_identity(
    client: *const GranaryClient,
    out: *mut GranaryPeerIdentity,
    timeout_ms: c_int,
) -> c_int {
    call("granary_get_peer_identity", || {
        // SAFETY: NULL or a live handle, per the caller.
        let client = unsafe { client.as_ref() }.ok_or_else(|| null("client"))?;
        // SAFETY: `out` is NULL or writable (so readable) per the caller.
        let ours = unsafe { answer_size(out, "identity") }?;
        let wait = timeout(timeout_ms).unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
        let p = client.client.peer_identity(wait)?;
        let mut id = GranaryPeerIdentity {
            struct_size: ours as u32,
            membership: p.membership as u32,
            capacity: p.capacity,
            view_epoch: p.view_epoch,
            members: p.members,
            reserved: 0,
            view_digest: p.view_digest,
            node_id: [0; GRANARY_NAME_MAX],
            addr: [0; GRANARY_NAME_MAX],
            job_id: [0; GRANARY_NAME_MAX],
        };
        fill_name(&mut id.node_id, &p.node_id);
        fill_name(&mut id.addr, &p.addr);
        fill_name(&mut id.job_id, &p.job_id);
        // SAFETY: writable for at least our size (checked above).
        unsafe { out.write_unaligned(id) };
        Ok(0)
    })
}

/// Asks the agent where the job stands in the plan `opts` describe
/// (dataset, seed, batch size, world size, `drop_last`) and stores the
/// answer in `*out` (the caller sets `out->struct_size` first): the job's
/// committed step, from the agent's own sessions and its peers' job
/// status, and the `first_batch` for a session with these options (its
/// rank, epochs and worker split) to open there. A replacement rank sets
/// `opts->first_batch` to it and opens. Waits up to the options'
/// `open_timeout_ms`, on a connection of its own.
///
/// Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, bad field,
/// `struct_size` too small), `GRANARY_E_NOT_FOUND`
/// (unknown dataset, or no agent of the job reported a rank of the plan),
/// `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`, `GRANARY_E_PROTOCOL`.
///
/// Thread safety: may be called concurrently on the same client.
///
/// # Safety
/// `client` is NULL or a live client handle; `opts` is NULL or a readable
/// options struct; `out` is NULL or writable for `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn granary_job_position(
    client: *const GranaryClient,
    opts: *const GranarySessionOptions,
    out: *mut GranaryJobPosition,
) -> c_int {
    call("granary_job_position", || {
        // SAFETY: NULL or a live handle, per the caller.
        let client = unsafe { client.as_ref() }.ok_or_else(|| null("client"))?;
        // SAFETY: `out` is NULL or writable (so readable) per the caller.
        let ours = unsafe { answer_size(out, "position") }?;
        // SAFETY: forwarded from the caller.
        let options = unsafe { read_options(opts) }?;
        let p = client.client.job_position(&options)?;
        let (rank_epoch, rank_step) = p.rank_position.unwrap_or((0, 0));
        let pos = GranaryJobPosition {
            struct_size: ours as u32,
            epoch: p.epoch,
            step: p.step,
            ranks_known: p.ranks_known,
            nodes: p.nodes,
            first_batch: p.first_batch,
            rank_known: u32::from(p.rank_position.is_some()),
            rank_epoch,
            rank_step,
        };
        // SAFETY: writable for at least our size (checked above).
        unsafe { out.write_unaligned(pos) };
        Ok(0)
    })
}

/// Encodes the membership view of job `job_id` at `epoch` (a relaunch uses
/// a higher epoch) with the `count` agents of `members` (any order; the
/// same agent listed more than once, as every rank of a node lists it,
/// counts once) into `buf` (`cap` bytes), and stores the encoding's length
/// in `*len`. With `buf` NULL or `cap` too small nothing is written but
/// `*len`, and the call returns `GRANARY_E_NO_MEMORY`: call again with a
/// buffer of `*len` bytes. Every rank that hands in the same members, job
/// and epoch gets the same bytes.
///
/// Returns `GRANARY_OK`, `GRANARY_E_NO_MEMORY` (see above),
/// `GRANARY_E_INVALID_ARGUMENT` (NULL, an empty job id or member list, an
/// agent listed with two addresses or capacities, names over 255 bytes).
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `job_id` is NULL or a NUL-terminated string; `members` is NULL or
/// readable for `count` entries whose strings are NUL-terminated; `buf` is
/// NULL or writable for `cap` bytes; `len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_view_encode(
    job_id: *const c_char,
    epoch: u64,
    members: *const GranaryViewMember,
    count: usize,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    call("granary_view_encode", || {
        non_null(len, "len")?;
        let text = |p: *const c_char, what: &str| -> Result<String> {
            non_null(p, what)?;
            // SAFETY: non-null, and the caller vouches for a NUL-terminated
            // string.
            unsafe { CStr::from_ptr(p) }
                .to_str()
                .map(str::to_owned)
                .map_err(|_| invalid(format!("{what} is not valid UTF-8")))
        };
        let job = text(job_id, "job_id")?;
        if members.is_null() && count > 0 {
            return Err(null("members"));
        }
        let ms: &[GranaryViewMember] = if count == 0 {
            &[]
        } else {
            // SAFETY: non-null, and the caller vouches for `count` readable
            // entries.
            unsafe { std::slice::from_raw_parts(members, count) }
        };
        let mut list = Vec::with_capacity(ms.len());
        for (i, m) in ms.iter().enumerate() {
            list.push(crate::ViewMember {
                id: text(m.id, &format!("members[{i}].id"))?,
                addr: text(m.addr, &format!("members[{i}].addr"))?,
                capacity: m.capacity,
            });
        }
        let bytes = crate::encode_view(&job, epoch, &list)?;
        // SAFETY: non-null, writable per the caller.
        unsafe { len.write(bytes.len()) };
        if buf.is_null() || cap < bytes.len() {
            return Err(Error::new(
                ErrorCode::NoMemory,
                format!("the view needs {} bytes, the buffer has {cap}", bytes.len()),
            ));
        }
        // SAFETY: `buf` is writable for `cap` ≥ bytes.len() bytes and does
        // not overlap our vector.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
        Ok(0)
    })
}

/// What became of the view handed in with `options.view`: `GRANARY_OK`
/// when the agent holds it (and stores its epoch in `*view_epoch` if not
/// NULL; the session ends if a newer view of the job replaces it),
/// `GRANARY_E_NOT_FOUND` when no view was handed in, or the agent's
/// refusal (`GRANARY_E_INVALID_ARGUMENT`: stale, conflicting or not
/// matching its configuration; `GRANARY_E_BUSY`: it serves another job;
/// `GRANARY_E_PERMISSION`: a job it does not take), its reason in
/// `granary_last_error_message()`. A refused view does not stop the
/// session: its samples are the same, only where the bytes come from
/// differs.
///
/// Thread safety: like every call on a session, one thread at a time.
///
/// # Safety
/// `session` is NULL or a live session handle; `view_epoch` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn granary_session_view(
    session: *const GranarySession,
    view_epoch: *mut u64,
) -> c_int {
    call("granary_session_view", || {
        // SAFETY: NULL or a live handle, per the caller.
        let s = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        match s.session.view_status() {
            None => Err(Error::new(
                ErrorCode::NotFound,
                "no membership view was handed in with this session",
            )),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(j)) => {
                if !view_epoch.is_null() {
                    // SAFETY: non-null, writable per the caller.
                    unsafe { view_epoch.write(j.view_epoch) };
                }
                Ok(0)
            }
        }
    })
}

/// Writes the session's checkpointable state into `buf` (`cap` bytes) and
/// its length into `*len`: the plan's inputs, the committed position (the
/// batches `granary_next_batch()` handed out so far) and the dataset's
/// provenance (the catalog's fingerprint and difference sketch). Save the
/// bytes with the training checkpoint; `granary_session_open()` with
/// `options.resume_state` opens the session again at the next batch, in
/// any process, against this agent or a restarted one. At most
/// `GRANARY_STATE_MAX` bytes. With `buf` NULL, only `*len` is written.
///
/// Returns `GRANARY_OK`, or `GRANARY_E_INVALID_ARGUMENT` (NULL `session`
/// or `len`, or `cap` below the state's length, which is then in `*len`).
///
/// Thread safety: like every call on a session, one thread at a time.
///
/// # Safety
/// `session` is NULL or a live session handle; `buf` is NULL or writable
/// for `cap` bytes; `len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_session_state(
    session: *const GranarySession,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    call("granary_session_state", || {
        // SAFETY: NULL or a live handle, per the caller.
        let s = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        // SAFETY: NULL-checked; writable per the caller.
        let out_len = unsafe { len.as_mut() }.ok_or_else(|| null("len"))?;
        let bytes = s.session.state().to_bytes();
        *out_len = bytes.len();
        if buf.is_null() {
            return Ok(0);
        }
        if cap < bytes.len() {
            return Err(invalid(format!(
                "a {cap}-byte buffer, the state takes {} bytes",
                bytes.len()
            )));
        }
        // SAFETY: `buf` is non-null and writable for `cap` ≥ bytes.len()
        // bytes per the caller; `bytes` is ours and does not overlap it.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
        Ok(0)
    })
}

/// How many times the session reopened itself after its agent went away
/// (see `resume_timeout_ms`), into `*count`. After a resume the session's
/// id and arena (`granary_session_get_info()`, `granary_session_arena()`)
/// are the new agent's; batches taken before it stay readable until
/// released.
///
/// Thread safety: like every call on a session, one thread at a time.
///
/// # Safety
/// `session` is NULL or a live session handle; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_session_resumes(
    session: *const GranarySession,
    count: *mut u32,
) -> c_int {
    call("granary_session_resumes", || {
        // SAFETY: NULL or a live handle, per the caller.
        let s = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        // SAFETY: NULL-checked; writable per the caller.
        let out = unsafe { count.as_mut() }.ok_or_else(|| null("count"))?;
        *out = s.session.resumes();
        Ok(0)
    })
}

/// Hands the agent the job's membership view (`view_len` bytes from
/// `granary_view_encode()`) without opening a session, and stores the
/// epoch of the view it holds now in `*view_epoch` (if not NULL). A job
/// calls it on every rank once the view is gathered, then waits at a
/// barrier before reading: every agent then listens for its peers before
/// the first sample is asked for. Waits up to `timeout_ms`.
///
/// Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, a malformed,
/// stale or conflicting view, one the agent's configuration does not
/// match), `GRANARY_E_BUSY` (the agent serves another job's view to live
/// sessions), `GRANARY_E_PERMISSION` (a job the agent does not take),
/// `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`.
///
/// Thread safety: may be called concurrently on the same client.
///
/// # Safety
/// `client` is NULL or a live client handle; `view` is NULL or readable for
/// `view_len` bytes; `view_epoch` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn granary_join_view(
    client: *const GranaryClient,
    view: *const u8,
    view_len: usize,
    view_epoch: *mut u64,
    timeout_ms: c_int,
) -> c_int {
    call("granary_join_view", || {
        // SAFETY: NULL or a live handle, per the caller.
        let client = unsafe { client.as_ref() }.ok_or_else(|| null("client"))?;
        non_null(view, "view")?;
        if view_len > granary_shm::handshake::MAX_VIEW_BYTES as usize {
            return Err(invalid(format!(
                "view_len is {view_len}, the limit is {}",
                granary_shm::handshake::MAX_VIEW_BYTES
            )));
        }
        // SAFETY: non-null, readable for `view_len` bytes per the caller.
        let bytes = unsafe { std::slice::from_raw_parts(view, view_len) };
        let wait = timeout(timeout_ms).unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
        let joined = client.client.join_view(bytes, wait)?;
        if !view_epoch.is_null() {
            // SAFETY: non-null, writable per the caller.
            unsafe { view_epoch.write(joined.view_epoch) };
        }
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_enum_matches_error_codes() {
        let all = [
            GranaryStatus::GranaryOk,
            GranaryStatus::GranaryEInvalidArgument,
            GranaryStatus::GranaryETimeout,
            GranaryStatus::GranaryEWouldBlock,
            GranaryStatus::GranaryEDisconnected,
            GranaryStatus::GranaryEProtocol,
            GranaryStatus::GranaryEVersion,
            GranaryStatus::GranaryEPermission,
            GranaryStatus::GranaryENotFound,
            GranaryStatus::GranaryEFenced,
            GranaryStatus::GranaryEEndOfStream,
            GranaryStatus::GranaryEIo,
            GranaryStatus::GranaryENoMemory,
            GranaryStatus::GranaryECorrupt,
            GranaryStatus::GranaryEBusy,
            GranaryStatus::GranaryEInternal,
            GranaryStatus::GranaryEClosed,
            GranaryStatus::GranaryEShortRead,
            GranaryStatus::GranaryEDatasetChanged,
            GranaryStatus::GranaryEDecode,
        ];
        assert_eq!(all.len(), ErrorCode::ALL.len());
        for (s, c) in all.iter().zip(ErrorCode::ALL) {
            assert_eq!(*s as i32, c.as_i32(), "{s:?} vs {c:?}");
            let name = format!("{s:?}");
            let code = format!("{c:?}");
            assert!(
                name.ends_with(&code) || (code == "Ok" && name == "GranaryOk"),
                "{name} does not name {code}"
            );
        }
    }

    #[test]
    fn flag_bits_match_the_layout() {
        use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
        assert_eq!(GRANARY_BATCH_END_OF_EPOCH, BATCH_END_OF_EPOCH);
        assert_eq!(GRANARY_BATCH_END_OF_STREAM, BATCH_END_OF_STREAM);
        assert_eq!(GRANARY_ABI_VERSION, crate::ABI_VERSION);
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout(-1), None);
        assert_eq!(timeout(i32::MIN), None);
        assert_eq!(timeout(0), Some(Duration::ZERO));
        assert_eq!(timeout(250), Some(Duration::from_millis(250)));
    }
}
