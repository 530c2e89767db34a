//! Atomics used by the ring and the segment header.
//!
//! Under the `loom` feature these are loom's model-checked atomics, so the
//! loom tests exercise exactly the code that ships. Loom atomics are not
//! layout-compatible with the kernel's, so loom builds never place them in
//! real shared memory: they only run the heap-backed rings.

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// A hint inside short spin loops.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(not(feature = "loom"))]
    std::hint::spin_loop();
    #[cfg(feature = "loom")]
    loom::thread::yield_now();
}
