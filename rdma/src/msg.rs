//! Messages on a queue pair's send channel: a small envelope around the
//! peer protocol's control frames, which the driver carries as opaque
//! bytes.
//!
//! ```text
//! offset 0  u8     envelope version (1)
//! offset 1  u8     kind
//! offset 2  u16 LE credits returned (receives reposted since the last message)
//! offset 4  u32 LE frame length
//! offset 8  kind fields:
//!           1 Get     u64 request, u64 extent address, u32 window rkey, u32 extent length
//!           2 Data    u64 request, u32 payload length, u32 zero
//!           3 Answer  u64 request
//!           4 Control (none)
//!           5 Credit  (none; frame length 0)
//! then      frame bytes
//! ```
//!
//! A `Data` message follows the RDMA write of its payload on the same
//! queue pair, so the payload has landed when it is received. Decoding
//! never panics.

use std::fmt;

/// Envelope version.
pub const MSG_VERSION: u8 = 1;
/// Bytes before the kind fields.
pub const ENVELOPE_LEN: usize = 8;
/// Longest kind fields.
pub const MAX_FIELDS: usize = 24;

/// A decoded message; `frame` borrows the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// A request naming the requester's extent.
    Get {
        /// Requester's id.
        request: u64,
        /// Extent address in the requester's arena.
        addr: u64,
        /// The rkey of the memory window bound to exactly this extent
        /// (0, naming nothing, for an empty extent).
        rkey: u32,
        /// Extent length.
        len: u32,
        /// The protocol's get frame.
        frame: &'a [u8],
    },
    /// The payload of `request` has been written; `frame` is the
    /// protocol's data header.
    Data {
        /// The request answered.
        request: u64,
        /// Bytes written at the start of the extent.
        len: u32,
        /// The data header frame.
        frame: &'a [u8],
    },
    /// `request` is answered without a payload (a miss): its extent will
    /// not be written.
    Answer {
        /// The request answered.
        request: u64,
        /// The protocol's answer frame.
        frame: &'a [u8],
    },
    /// Any other protocol frame.
    Control {
        /// The frame.
        frame: &'a [u8],
    },
    /// Only returns credits.
    Credit,
}

/// A malformed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MsgError {
    /// Shorter than its envelope and fields.
    Short(usize),
    /// Another envelope version.
    Version(u8),
    /// Unknown kind.
    Kind(u8),
    /// Frame length disagrees with the bytes received.
    FrameLength {
        /// Announced.
        announced: u32,
        /// Present.
        present: usize,
    },
    /// A reserved field is not zero, or a credit message carries a frame.
    Reserved,
}

impl fmt::Display for MsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgError::Short(n) => write!(f, "message of {n} bytes is too short"),
            MsgError::Version(v) => write!(f, "message version {v}"),
            MsgError::Kind(k) => write!(f, "message kind {k}"),
            MsgError::FrameLength { announced, present } => {
                write!(f, "frame length {announced}, {present} bytes present")
            }
            MsgError::Reserved => write!(f, "reserved message field set"),
        }
    }
}

impl std::error::Error for MsgError {}

impl Msg<'_> {
    fn kind(&self) -> u8 {
        match self {
            Msg::Get { .. } => 1,
            Msg::Data { .. } => 2,
            Msg::Answer { .. } => 3,
            Msg::Control { .. } => 4,
            Msg::Credit => 5,
        }
    }

    fn frame(&self) -> &[u8] {
        match self {
            Msg::Get { frame, .. }
            | Msg::Data { frame, .. }
            | Msg::Answer { frame, .. }
            | Msg::Control { frame } => frame,
            Msg::Credit => &[],
        }
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        ENVELOPE_LEN + fields_len(self.kind()) + self.frame().len()
    }

    /// Appends the encoding, with `credits` returned, to `out`.
    pub fn encode(&self, credits: u16, out: &mut Vec<u8>) {
        let frame = self.frame();
        out.push(MSG_VERSION);
        out.push(self.kind());
        out.extend_from_slice(&credits.to_le_bytes());
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        match *self {
            Msg::Get {
                request,
                addr,
                rkey,
                len,
                ..
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(&rkey.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Msg::Data { request, len, .. } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
            }
            Msg::Answer { request, .. } => out.extend_from_slice(&request.to_le_bytes()),
            Msg::Control { .. } | Msg::Credit => {}
        }
        out.extend_from_slice(frame);
    }

    /// Parses one received message; returns it and the credits returned.
    pub fn decode(b: &[u8]) -> Result<(Msg<'_>, u16), MsgError> {
        if b.len() < ENVELOPE_LEN {
            return Err(MsgError::Short(b.len()));
        }
        if b[0] != MSG_VERSION {
            return Err(MsgError::Version(b[0]));
        }
        let kind = b[1];
        if !(1..=5).contains(&kind) {
            return Err(MsgError::Kind(kind));
        }
        let credits = u16::from_le_bytes([b[2], b[3]]);
        let announced = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let fl = fields_len(kind);
        let rest = &b[ENVELOPE_LEN..];
        if rest.len() < fl {
            return Err(MsgError::Short(b.len()));
        }
        let (f, frame) = rest.split_at(fl);
        if frame.len() as u64 != u64::from(announced) {
            return Err(MsgError::FrameLength {
                announced,
                present: frame.len(),
            });
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&f[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let u32_at = |i: usize| u32::from_le_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
        let msg = match kind {
            1 => Msg::Get {
                request: u64_at(0),
                addr: u64_at(8),
                rkey: u32_at(16),
                len: u32_at(20),
                frame,
            },
            2 => {
                if u32_at(12) != 0 {
                    return Err(MsgError::Reserved);
                }
                Msg::Data {
                    request: u64_at(0),
                    len: u32_at(8),
                    frame,
                }
            }
            3 => Msg::Answer {
                request: u64_at(0),
                frame,
            },
            4 => Msg::Control { frame },
            _ => {
                if !frame.is_empty() {
                    return Err(MsgError::Reserved);
                }
                Msg::Credit
            }
        };
        Ok((msg, credits))
    }
}

fn fields_len(kind: u8) -> usize {
    match kind {
        1 => 24,
        2 => 16,
        3 => 8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_kind_roundtrips() {
        let frame = [1u8, 2, 3];
        let msgs = [
            Msg::Get {
                request: 9,
                addr: 0x1000,
                rkey: 77,
                len: 4096,
                frame: &frame,
            },
            Msg::Data {
                request: 9,
                len: 100,
                frame: &frame,
            },
            Msg::Answer {
                request: 9,
                frame: &frame,
            },
            Msg::Control { frame: &frame },
            Msg::Credit,
        ];
        for m in msgs {
            let mut out = Vec::new();
            m.encode(5, &mut out);
            assert_eq!(out.len(), m.encoded_len());
            assert_eq!(Msg::decode(&out), Ok((m, 5)));
        }
    }

    #[test]
    fn rejects_malformed() {
        let mut out = Vec::new();
        Msg::Control { frame: &[7; 4] }.encode(0, &mut out);
        assert_eq!(
            Msg::decode(&out[..out.len() - 1]),
            Err(MsgError::FrameLength {
                announced: 4,
                present: 3
            })
        );
        let mut v = out.clone();
        v[0] = 2;
        assert_eq!(Msg::decode(&v), Err(MsgError::Version(2)));
        let mut v = out.clone();
        v[1] = 6;
        assert_eq!(Msg::decode(&v), Err(MsgError::Kind(6)));
        assert_eq!(Msg::decode(&out[..3]), Err(MsgError::Short(3)));
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_is_canonical(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok((m, c)) = Msg::decode(&b) {
                let mut out = Vec::new();
                m.encode(c, &mut out);
                prop_assert_eq!(out, b);
            }
        }
    }
}
