//! Error reporting across the C ABI: static code descriptions, the
//! per-thread detail message, and the guard that keeps panics on this side.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use granary_shm::ErrorCode;

use crate::error::{Error, Result};

/// What `granary_strerror` returns for a code it does not know.
pub(crate) const UNKNOWN: &CStr = c"unknown error";

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn to_cstring(text: String) -> CString {
    CString::new(text).unwrap_or_else(|e| {
        let mut bytes = e.into_vec();
        bytes.retain(|&b| b != 0);
        CString::new(bytes).unwrap_or_default()
    })
}

/// Replaces this thread's last error message.
pub(crate) fn set_last_error(text: String) {
    let text = to_cstring(text);
    LAST_ERROR.with(|cell| *cell.borrow_mut() = text);
}

/// Pointer to this thread's last error message (valid until it is replaced).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|cell| cell.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Records `e` as this thread's last error and returns its code.
pub(crate) fn record(e: &Error) -> c_int {
    set_last_error(e.to_string());
    e.code().as_i32()
}

/// The static description of `code`, or [`UNKNOWN`].
pub(crate) fn describe(code: c_int) -> &'static CStr {
    static TABLE: OnceLock<Vec<CString>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        ErrorCode::ALL
            .iter()
            .map(|c| to_cstring(c.message().to_owned()))
            .collect()
    });
    match ErrorCode::from_i32(code) {
        Some(c) => table
            .get(c.as_i32().unsigned_abs() as usize)
            .map_or(UNKNOWN, CString::as_c_str),
        None => UNKNOWN,
    }
}

/// Runs the body of an `int`-returning API function: errors become their
/// code (and this thread's last error), a panic becomes
/// `GRANARY_E_INTERNAL` instead of unwinding into C.
pub(crate) fn call(name: &'static str, body: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(rc)) => rc,
        Ok(Err(e)) => record(&e),
        Err(_) => record(&Error::new(
            ErrorCode::Internal,
            format!("{name}: internal error (panic caught at the API boundary)"),
        )),
    }
}

/// Runs the body of an accessor that returns a plain value: a panic yields
/// `fallback`.
pub(crate) fn value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The error for a null pointer argument.
pub(crate) fn null(what: &str) -> Error {
    Error::new(ErrorCode::InvalidArgument, format!("{what} is NULL"))
}

/// Refuses a NULL pointer argument: `Err(null(what))` when `p` is NULL.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(null(what))
    } else {
        Ok(())
    }
}
