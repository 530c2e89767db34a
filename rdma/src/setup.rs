//! Queue pair setup parameters, exchanged as bytes over the peer's
//! authenticated TCP connection (no rdmacm).
//!
//! ```text
//! offset 0   u8      format version (1)
//! offset 1   u8      path MTU code (1..=5: 256..4096)
//! offset 2   u16 LE  LID
//! offset 4   u32 LE  queue pair number (< 2^24)
//! offset 8   u32 LE  first PSN (< 2^24)
//! offset 12  [16]    GID
//! offset 28  u16 LE  receives posted (the sender's initial credits, >= 2)
//! offset 30  u16 LE  flags, must be 0
//! offset 32  u32 LE  message slot size in bytes (MIN_SLOT..=MAX_SLOT)
//! ```
//!
//! Decoding checks every field and returns a typed [`SetupError`]; it
//! never panics on any input. The encoding is canonical.

use std::fmt;

use crate::verbs::{Endpoint, Mtu};

/// Format version written and read.
pub const SETUP_VERSION: u8 = 1;
/// Encoded length.
pub const SETUP_LEN: usize = 36;
/// Smallest message slot.
pub const MIN_SLOT: u32 = 256;
/// Largest message slot.
pub const MAX_SLOT: u32 = 64 * 1024;

/// One side's queue pair parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetupParams {
    /// The queue pair to connect to.
    pub endpoint: Endpoint,
    /// Path MTU the sender will use.
    pub mtu: Mtu,
    /// Receives the sender has posted: the other side's initial credits.
    pub recv_depth: u16,
    /// Size of each receive slot: the longest message the other side may
    /// send.
    pub slot_size: u32,
}

/// Why setup bytes were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupError {
    /// Not exactly [`SETUP_LEN`] bytes.
    Length(usize),
    /// Another format version.
    Version(u8),
    /// Unknown MTU code.
    Mtu(u8),
    /// Queue pair number or PSN beyond 24 bits.
    TooWide(&'static str, u32),
    /// Fewer than two receives.
    Depth(u16),
    /// Nonzero flags.
    Flags(u16),
    /// Slot size out of range.
    Slot(u32),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Length(n) => write!(f, "setup parameters: {n} bytes, want {SETUP_LEN}"),
            SetupError::Version(v) => write!(f, "setup parameters: version {v}"),
            SetupError::Mtu(m) => write!(f, "setup parameters: MTU code {m}"),
            SetupError::TooWide(what, v) => write!(f, "setup parameters: {what} {v} over 24 bits"),
            SetupError::Depth(d) => write!(f, "setup parameters: receive depth {d} < 2"),
            SetupError::Flags(x) => write!(f, "setup parameters: flags {x:#x}"),
            SetupError::Slot(s) => write!(f, "setup parameters: slot size {s}"),
        }
    }
}

impl std::error::Error for SetupError {}

impl SetupParams {
    /// The canonical bytes.
    pub fn encode(&self) -> [u8; SETUP_LEN] {
        let mut b = [0u8; SETUP_LEN];
        b[0] = SETUP_VERSION;
        b[1] = self.mtu as u8;
        b[2..4].copy_from_slice(&self.endpoint.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.endpoint.qp_num.to_le_bytes());
        b[8..12].copy_from_slice(&self.endpoint.psn.to_le_bytes());
        b[12..28].copy_from_slice(&self.endpoint.gid);
        b[28..30].copy_from_slice(&self.recv_depth.to_le_bytes());
        b[32..36].copy_from_slice(&self.slot_size.to_le_bytes());
        b
    }

    /// Checks that encoding would round-trip.
    pub fn validate(&self) -> Result<(), SetupError> {
        SetupParams::decode(&self.encode()).map(|_| ())
    }

    /// Parses bytes from the peer.
    pub fn decode(b: &[u8]) -> Result<SetupParams, SetupError> {
        let b: &[u8; SETUP_LEN] = b.try_into().map_err(|_| SetupError::Length(b.len()))?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[0] != SETUP_VERSION {
            return Err(SetupError::Version(b[0]));
        }
        let mtu = Mtu::from_code(b[1]).ok_or(SetupError::Mtu(b[1]))?;
        let qp_num = u32_at(4);
        if qp_num >= 1 << 24 {
            return Err(SetupError::TooWide("queue pair number", qp_num));
        }
        let psn = u32_at(8);
        if psn >= 1 << 24 {
            return Err(SetupError::TooWide("PSN", psn));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let recv_depth = u16_at(28);
        if recv_depth < 2 {
            return Err(SetupError::Depth(recv_depth));
        }
        let flags = u16_at(30);
        if flags != 0 {
            return Err(SetupError::Flags(flags));
        }
        let slot_size = u32_at(32);
        if !(MIN_SLOT..=MAX_SLOT).contains(&slot_size) {
            return Err(SetupError::Slot(slot_size));
        }
        Ok(SetupParams {
            endpoint: Endpoint {
                qp_num,
                lid: u16_at(2),
                gid,
                psn,
            },
            mtu,
            recv_depth,
            slot_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SetupParams {
        SetupParams {
            endpoint: Endpoint {
                qp_num: 0x12_3456,
                lid: 7,
                gid: [9; 16],
                psn: 0xab_cdef,
            },
            mtu: Mtu::M4096,
            recv_depth: 64,
            slot_size: 4096,
        }
    }

    #[test]
    fn pinned_bytes() {
        let b = sample().encode();
        assert_eq!(
            &b[..12],
            &[1, 5, 7, 0, 0x56, 0x34, 0x12, 0, 0xef, 0xcd, 0xab, 0]
        );
        assert_eq!(&b[28..], &[64, 0, 0, 0, 0, 16, 0, 0]);
        assert_eq!(SetupParams::decode(&b), Ok(sample()));
    }

    #[test]
    fn rejects_each_bad_field() {
        let good = sample().encode();
        let bad = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            SetupParams::decode(&b)
        };
        assert_eq!(bad(0, 2), Err(SetupError::Version(2)));
        assert_eq!(bad(1, 6), Err(SetupError::Mtu(6)));
        assert!(matches!(bad(7, 1), Err(SetupError::TooWide(..))));
        assert!(matches!(bad(11, 1), Err(SetupError::TooWide(..))));
        let mut b = good;
        b[28] = 1;
        b[29] = 0;
        assert_eq!(SetupParams::decode(&b), Err(SetupError::Depth(1)));
        assert_eq!(bad(30, 1), Err(SetupError::Flags(1)));
        assert_eq!(bad(35, 1), Err(SetupError::Slot(0x0100_1000)));
        assert_eq!(SetupParams::decode(&good[1..]), Err(SetupError::Length(35)));
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_is_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = SetupParams::decode(&bytes) {
                prop_assert_eq!(&p.encode()[..], &bytes[..]);
            }
        }

        #[test]
        fn roundtrip(qp in 0u32..1 << 24, psn in 0u32..1 << 24, lid: u16, gid: [u8; 16],
                     mtu in 1u8..=5, depth in 2u16.., slot in MIN_SLOT..=MAX_SLOT) {
            let p = SetupParams {
                endpoint: Endpoint { qp_num: qp, lid, gid, psn },
                mtu: Mtu::from_code(mtu).unwrap(),
                recv_depth: depth,
                slot_size: slot,
            };
            prop_assert_eq!(SetupParams::decode(&p.encode()), Ok(p));
        }
    }
}
