//! Why a cache call was refused.

use std::fmt;

use super::{FutureError, SampleKey};

/// Why a cache call was refused. A refused call changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// The configuration is invalid.
    BadConfig(String),
    /// A zero-length sample.
    ZeroLength,
    /// A sample larger than either area of the arena (see
    /// `CacheConfig::largest_sample`).
    TooLarge {
        /// The requested length.
        len: u64,
        /// The largest extent the cache can hold.
        largest: u64,
    },
    /// Not enough room now: everything evictable is gone and the rest is
    /// pinned or in flight (or the policy never evicts). Retry later.
    NoSpace {
        /// The sample.
        key: SampleKey,
        /// Bytes needed (rounded up to the alignment).
        need: u64,
    },
    /// The sample is already in flight or Ready (pin it instead).
    AlreadyPresent {
        /// The sample.
        key: SampleKey,
        /// Its state: `"in flight"`, `"ready"` or `"failed"`.
        state: &'static str,
    },
    /// The sample is not in the cache.
    NotFound(SampleKey),
    /// The call needs a sample in another state.
    WrongState {
        /// The sample.
        key: SampleKey,
        /// Its state.
        state: &'static str,
        /// The state the call needs.
        expected: &'static str,
    },
    /// An unpin of a sample without pins.
    NotPinned(SampleKey),
    /// A pin count would overflow.
    PinOverflow(SampleKey),
    /// A pin of a failed sample.
    Failed {
        /// The sample.
        key: SampleKey,
        /// The error code of its read.
        code: u32,
    },
    /// The sample is pinned or in flight and cannot be dropped.
    Busy(SampleKey),
    /// A session call was refused.
    Session(FutureError),
    /// The cache found its own state inconsistent (a bug); the call was
    /// abandoned.
    Internal(String),
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::BadConfig(m) => write!(f, "invalid cache configuration: {m}"),
            CacheError::ZeroLength => write!(f, "a sample of 0 bytes cannot be cached"),
            CacheError::TooLarge { len, largest } => write!(
                f,
                "a sample of {len} bytes does not fit: the cache holds extents of at most {largest} bytes"
            ),
            CacheError::NoSpace { key, need } => write!(
                f,
                "no room for sample {key} ({need} bytes): the arena is pinned or in flight; retry later"
            ),
            CacheError::AlreadyPresent { key, state } => {
                write!(f, "sample {key} is already {state}")
            }
            CacheError::NotFound(key) => write!(f, "sample {key} is not in the cache"),
            CacheError::WrongState {
                key,
                state,
                expected,
            } => write!(f, "sample {key} is {state}, not {expected}"),
            CacheError::NotPinned(key) => write!(f, "sample {key} is not pinned"),
            CacheError::PinOverflow(key) => write!(f, "sample {key} has too many pins"),
            CacheError::Failed { key, code } => {
                write!(f, "sample {key} failed to read (error {code})")
            }
            CacheError::Busy(key) => write!(f, "sample {key} is pinned or in flight"),
            CacheError::Session(e) => write!(f, "{e}"),
            CacheError::Internal(m) => write!(f, "cache inconsistency: {m}"),
        }
    }
}

impl std::error::Error for CacheError {}

impl From<FutureError> for CacheError {
    fn from(e: FutureError) -> Self {
        CacheError::Session(e)
    }
}
