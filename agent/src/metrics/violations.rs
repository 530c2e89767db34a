//! What a loader did wrong: the `kind` label of
//! `granary_violations_total`.

use granary_shm::Violation;

/// What a loader did wrong, the `kind` label of `granary_violations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A ring index moved backwards or ran more than a capacity ahead.
    RingIndex,
    /// A descriptor named a range outside its region.
    OutOfBounds,
    /// A field held a value outside its domain.
    BadField,
    /// A release named a batch not on loan (wrong token, twice, never lent).
    UnknownLease,
    /// A descriptor or table was misaligned.
    Misaligned,
    /// A malformed message on the session's socket.
    Handshake,
}

impl ViolationKind {
    /// Every kind, in the order of their series.
    pub const ALL: [ViolationKind; 6] = [
        ViolationKind::RingIndex,
        ViolationKind::OutOfBounds,
        ViolationKind::BadField,
        ViolationKind::UnknownLease,
        ViolationKind::Misaligned,
        ViolationKind::Handshake,
    ];

    /// The kind of a shared-memory violation, or `None` for a fence that
    /// is not a protocol violation: a replaced view
    /// ([`Violation::ViewReplaced`]) or a silent loader
    /// ([`Violation::Silent`], counted in `granary_sessions_timed_out`).
    pub const fn of(v: &Violation) -> Option<ViolationKind> {
        match v {
            Violation::RingIndex { .. } => Some(ViolationKind::RingIndex),
            Violation::OutOfBounds { .. } => Some(ViolationKind::OutOfBounds),
            Violation::BadField { .. } => Some(ViolationKind::BadField),
            Violation::UnknownLease { .. } => Some(ViolationKind::UnknownLease),
            Violation::Misaligned { .. } => Some(ViolationKind::Misaligned),
            Violation::ViewReplaced | Violation::Silent { .. } => None,
        }
    }

    /// The `kind` label.
    pub const fn label(self) -> &'static str {
        match self {
            ViolationKind::RingIndex => "ring_index",
            ViolationKind::OutOfBounds => "out_of_bounds",
            ViolationKind::BadField => "bad_field",
            ViolationKind::UnknownLease => "unknown_lease",
            ViolationKind::Misaligned => "misaligned",
            ViolationKind::Handshake => "handshake",
        }
    }

    pub(super) const fn index(self) -> usize {
        self as usize
    }
}
