//! Small, typed errors of the shared-memory contract.
//!
//! Three layers, from the bottom up:
//! * [`Violation`]: something another process wrote into shared memory broke
//!   the contract. The side that detects it fences the peer.
//! * [`AttachError`], [`WaitError`], [`crate::arena::ArenaError`], [`crate::handshake::ProtocolError`]: what
//!   the individual operations of this crate can report.
//! * [`ErrorCode`]: the stable negative integers that cross the C ABI, the
//!   handshake's error replies and the per-batch / per-sample status words.

use std::fmt;

/// Stable error codes shared by the C API (`GRANARY_E_*`), the handshake's
/// error replies and the status words of batch descriptors and sample
/// entries. Values never change meaning; new codes are only appended.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Success.
    Ok = 0,
    /// An argument was null, out of range or inconsistent.
    InvalidArgument = -1,
    /// A blocking call reached its timeout.
    Timeout = -2,
    /// A non-blocking call found nothing to do.
    WouldBlock = -3,
    /// The agent went away (socket hang-up) or the connection failed.
    Disconnected = -4,
    /// A peer sent a malformed message.
    Protocol = -5,
    /// Protocol, ABI or layout version mismatch.
    Version = -6,
    /// The caller's credentials are not on the agent's allowlist.
    Permission = -7,
    /// The named dataset (or session) does not exist.
    NotFound = -8,
    /// The session was fenced after a protocol violation.
    Fenced = -9,
    /// Every batch of the requested epochs has been delivered.
    EndOfStream = -10,
    /// The data source failed to read a sample.
    Io = -11,
    /// Memory (arena or process) is exhausted.
    NoMemory = -12,
    /// A descriptor or table failed validation.
    Corrupt = -13,
    /// The agent refuses more work (session limit).
    Busy = -14,
    /// An internal error in the agent or library.
    Internal = -15,
    /// The object was already released or closed.
    Closed = -16,
    /// A sample is shorter or longer than catalogued: it changed in the
    /// source since the catalog was made.
    ShortRead = -17,
    /// The dataset's catalog is not the one a saved session state was
    /// taken against (an object replaced, added or removed since).
    DatasetChanged = -18,
    /// A sample of a dataset with a prepare stage could not be decoded
    /// (not a JPEG, corrupt data, or more pixels than the agent allows).
    Decode = -19,
}

impl ErrorCode {
    /// Every code, in numeric order (0, -1, -2, ...).
    pub const ALL: [ErrorCode; 20] = [
        ErrorCode::Ok,
        ErrorCode::InvalidArgument,
        ErrorCode::Timeout,
        ErrorCode::WouldBlock,
        ErrorCode::Disconnected,
        ErrorCode::Protocol,
        ErrorCode::Version,
        ErrorCode::Permission,
        ErrorCode::NotFound,
        ErrorCode::Fenced,
        ErrorCode::EndOfStream,
        ErrorCode::Io,
        ErrorCode::NoMemory,
        ErrorCode::Corrupt,
        ErrorCode::Busy,
        ErrorCode::Internal,
        ErrorCode::Closed,
        ErrorCode::ShortRead,
        ErrorCode::DatasetChanged,
        ErrorCode::Decode,
    ];

    /// The codes a failed sample's status can carry (in a sample entry), one
    /// per way a read can fail: the sample is gone (`NotFound`), a transient
    /// failure persisted (`Io`), the read timed out (`Timeout`), the bytes
    /// failed a check (`Corrupt`), the sample changed size (`ShortRead`),
    /// or the prepare stage could not decode it (`Decode`).
    pub const SAMPLE_FAILURES: [ErrorCode; 6] = [
        ErrorCode::NotFound,
        ErrorCode::Io,
        ErrorCode::Timeout,
        ErrorCode::Corrupt,
        ErrorCode::ShortRead,
        ErrorCode::Decode,
    ];

    /// The integer on the wire and across the C ABI.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// Decodes a wire value; unknown values are `None`.
    pub fn from_i32(v: i32) -> Option<ErrorCode> {
        let idx = usize::try_from(v.checked_neg()?).ok()?;
        Self::ALL.get(idx).copied()
    }

    /// A short, static, human-readable description (what `granary_strerror` returns).
    pub const fn message(self) -> &'static str {
        match self {
            ErrorCode::Ok => "success",
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::Timeout => "timed out",
            ErrorCode::WouldBlock => "no batch ready (would block)",
            ErrorCode::Disconnected => "disconnected from the agent",
            ErrorCode::Protocol => "protocol error: malformed message",
            ErrorCode::Version => "protocol, ABI or layout version mismatch",
            ErrorCode::Permission => "permission denied by the agent's allowlist",
            ErrorCode::NotFound => "no such dataset or session",
            ErrorCode::Fenced => "session fenced after a protocol violation",
            ErrorCode::EndOfStream => "end of stream: all requested epochs delivered",
            ErrorCode::Io => {
                "the data source failed to read a sample (a transient failure persisted)"
            }
            ErrorCode::NoMemory => "out of memory",
            ErrorCode::Corrupt => "descriptor or sample table failed validation",
            ErrorCode::Busy => "the agent is busy (session limit reached)",
            ErrorCode::Internal => "internal error",
            ErrorCode::Closed => "already released or closed",
            ErrorCode::ShortRead => {
                "the sample is shorter or longer than catalogued (changed since the catalog was made)"
            }
            ErrorCode::DatasetChanged => {
                "the dataset changed since the session state was saved"
            }
            ErrorCode::Decode => {
                "the agent could not decode the sample to prepare it (not a JPEG, corrupt, or too many pixels)"
            }
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// A breach of the shared-memory contract by the process on the other side.
///
/// Produced by the validation module and by the rings. Never a panic: the
/// detecting side turns it into a fence of that one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The peer's ring index moved backwards or ran more than a capacity ahead.
    RingIndex {
        /// Which ring ("ready" or "release").
        ring: &'static str,
        /// Our own (trusted) index.
        ours: u64,
        /// The index the peer published.
        theirs: u64,
        /// Ring capacity.
        capacity: u64,
    },
    /// A descriptor names a range outside the arena, or its arithmetic overflows.
    OutOfBounds {
        /// What was being resolved.
        what: &'static str,
        /// Claimed offset.
        offset: u64,
        /// Claimed length.
        len: u64,
        /// Size of the region it must lie in.
        limit: u64,
    },
    /// A field holds a value outside its domain.
    BadField {
        /// Field name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A release names a batch that was never lent or was already returned.
    UnknownLease {
        /// Sequence number named by the release.
        seq: u64,
        /// Token named by the release.
        token: u64,
    },
    /// A descriptor or table is misaligned.
    Misaligned {
        /// What was misaligned.
        what: &'static str,
        /// The offending offset.
        offset: u64,
    },
    /// Not the loader's doing: its job was relaunched and a newer
    /// membership view replaced the one the session joined, so the agent
    /// took back everything the session held.
    ViewReplaced,
    /// The loader neither released a batch nor beat its heartbeat for the
    /// agent's client timeout (it is stopped or hung): the agent took back
    /// everything the session held, so nothing left in its ring may be
    /// read.
    Silent {
        /// How long it had been silent, in milliseconds.
        ms: u64,
    },
}

impl Violation {
    /// A stable small integer for the segment header's `violation` word and metrics.
    pub const fn code(&self) -> u32 {
        match self {
            Violation::RingIndex { .. } => 1,
            Violation::OutOfBounds { .. } => 2,
            Violation::BadField { .. } => 3,
            Violation::UnknownLease { .. } => 4,
            Violation::Misaligned { .. } => 5,
            Violation::ViewReplaced => 6,
            Violation::Silent { .. } => 7,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::RingIndex {
                ring,
                ours,
                theirs,
                capacity,
            } => write!(
                f,
                "{ring} ring: peer index {theirs} is inconsistent with ours {ours} (capacity {capacity})"
            ),
            Violation::OutOfBounds {
                what,
                offset,
                len,
                limit,
            } => write!(
                f,
                "{what}: range offset {offset} length {len} lies outside 0..{limit}"
            ),
            Violation::BadField { field, value } => {
                write!(f, "field {field} holds invalid value {value}")
            }
            Violation::UnknownLease { seq, token } => write!(
                f,
                "release of batch seq {seq} token {token:#x} that is not on loan"
            ),
            Violation::Misaligned { what, offset } => {
                write!(f, "{what}: offset {offset} is misaligned")
            }
            Violation::ViewReplaced => f.write_str(
                "a newer membership view of the job (a relaunch) replaced the one the session joined",
            ),
            Violation::Silent { ms } => write!(
                f,
                "the loader was silent (no release, no heartbeat) for {ms} ms, past the agent's client timeout; its batches were taken back"
            ),
        }
    }
}

impl std::error::Error for Violation {}

/// Why attaching to a segment failed.
#[derive(Debug)]
pub enum AttachError {
    /// The mapping is smaller than a header, or than the header claims.
    TooShort {
        /// Bytes the segment must have.
        needed: u64,
        /// Bytes actually mapped.
        actual: u64,
    },
    /// The magic number is wrong (not a Granary segment, or not yet published).
    BadMagic(u64),
    /// The layout version differs from this library's.
    BadVersion {
        /// Version found in the header.
        found: u32,
        /// Version this library speaks.
        expected: u32,
    },
    /// The header is internally inconsistent.
    Invalid(Violation),
    /// The segment's instance epoch differs from the one the handshake promised.
    StaleEpoch {
        /// Epoch found in the header.
        found: u64,
        /// Epoch expected.
        expected: u64,
    },
    /// An OS call failed (mmap, fstat).
    Os(std::io::Error),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::TooShort { needed, actual } => {
                write!(f, "segment too short: needs {needed} bytes, has {actual}")
            }
            AttachError::BadMagic(m) => write!(f, "bad segment magic {m:#018x}"),
            AttachError::BadVersion { found, expected } => write!(
                f,
                "segment layout version {found}, this library speaks {expected}"
            ),
            AttachError::Invalid(v) => write!(f, "invalid segment header: {v}"),
            AttachError::StaleEpoch { found, expected } => write!(
                f,
                "segment instance epoch {found:#x} differs from the expected {expected:#x}"
            ),
            AttachError::Os(e) => write!(f, "segment mapping failed: {e}"),
        }
    }
}

impl std::error::Error for AttachError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttachError::Os(e) => Some(e),
            AttachError::Invalid(v) => Some(v),
            _ => None,
        }
    }
}

impl From<Violation> for AttachError {
    fn from(v: Violation) -> Self {
        AttachError::Invalid(v)
    }
}

/// Why a blocking ring operation returned without success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed.
    Timeout,
    /// The peer broke the contract while we waited.
    Violation(Violation),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Timeout => f.write_str("timed out"),
            WaitError::Violation(v) => write!(f, "{v}"),
        }
    }
}

impl std::error::Error for WaitError {}

impl From<Violation> for WaitError {
    fn from(v: Violation) -> Self {
        WaitError::Violation(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(c.as_i32(), -(i as i32));
            assert_eq!(ErrorCode::from_i32(c.as_i32()), Some(*c));
            assert!(!c.message().is_empty());
        }
        assert_eq!(ErrorCode::from_i32(1), None);
        assert_eq!(ErrorCode::from_i32(-17), Some(ErrorCode::ShortRead));
        assert_eq!(ErrorCode::from_i32(-18), Some(ErrorCode::DatasetChanged));
        assert_eq!(ErrorCode::from_i32(-19), Some(ErrorCode::Decode));
        assert_eq!(ErrorCode::from_i32(-20), None);
        assert_eq!(ErrorCode::from_i32(i32::MIN), None);
    }

    #[test]
    fn sample_failure_kinds_have_distinct_codes_and_messages() {
        let codes: Vec<i32> = ErrorCode::SAMPLE_FAILURES
            .iter()
            .map(|c| c.as_i32())
            .collect();
        assert_eq!(codes, [-8, -11, -2, -13, -17, -19]);
        let mut messages: Vec<&str> = ErrorCode::SAMPLE_FAILURES
            .iter()
            .map(|c| c.message())
            .collect();
        messages.sort_unstable();
        messages.dedup();
        assert_eq!(messages.len(), 6);
        assert!(ErrorCode::Decode.message().contains("decode"));
        assert!(ErrorCode::ShortRead.message().contains("catalog"));
        assert!(ErrorCode::Io.message().contains("transient"));
    }
}
