//! Block integrity bound to identity: a CRC-32C seeded with (dataset
//! fingerprint, sample index, length) over the payload.
//!
//! ```text
//! crc = crc32c_append(crc32c(u64_le(fingerprint) || u64_le(sample) || u64_le(len)),
//!                     payload)
//! ```
//!
//! i.e. CRC-32C (Castagnoli) over the 24-byte identity followed by the
//! payload. It is computed once, when the sample arrives from the store,
//! and checked by whoever receives the block from a peer: a right block for
//! another sample, another dataset, or cut to another length fails, as does
//! a flipped bit.

use std::fmt;

/// The 24 identity bytes the CRC starts from.
fn identity(fingerprint: u64, sample: u64, len: u64) -> [u8; 24] {
    let mut id = [0u8; 24];
    id[..8].copy_from_slice(&fingerprint.to_le_bytes());
    id[8..16].copy_from_slice(&sample.to_le_bytes());
    id[16..].copy_from_slice(&len.to_le_bytes());
    id
}

/// The block CRC of `payload` as sample `sample` of dataset `fingerprint`.
pub fn block_crc(fingerprint: u64, sample: u64, payload: &[u8]) -> u32 {
    let mut c = BlockCrc::new(fingerprint, sample, payload.len() as u64);
    c.update(payload);
    c.value()
}

/// Incremental [`block_crc`], for payloads that arrive in pieces (a
/// transport reading straight into an arena extent).
/// The block CRC of a payload of `len` bytes whose plain CRC-32C is
/// `payload_crc32c`: what [`block_crc`] returns for it, without reading the
/// payload again.
pub fn block_crc_of(fingerprint: u64, sample: u64, len: u64, payload_crc32c: u32) -> u32 {
    let head = crc32c::crc32c(&identity(fingerprint, sample, len));
    crc32c::crc32c_combine(head, payload_crc32c, len as usize)
}

#[derive(Clone, Debug)]
pub struct BlockCrc {
    crc: u32,
    expected_len: u64,
    seen: u64,
}

impl BlockCrc {
    /// Starts the CRC of a block of `len` bytes.
    pub fn new(fingerprint: u64, sample: u64, len: u64) -> BlockCrc {
        BlockCrc {
            crc: crc32c::crc32c(&identity(fingerprint, sample, len)),
            expected_len: len,
            seen: 0,
        }
    }

    /// Adds the next piece of the payload.
    pub fn update(&mut self, piece: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, piece);
        self.seen += piece.len() as u64;
    }

    /// The CRC of what has been added so far.
    pub fn value(&self) -> u32 {
        self.crc
    }

    /// Checks the whole payload arrived and matches `expected`.
    pub fn finish(&self, expected: u32) -> Result<(), BlockError> {
        if self.seen != self.expected_len {
            return Err(BlockError::Length {
                expected: self.expected_len,
                got: self.seen,
            });
        }
        if self.crc != expected {
            return Err(BlockError::Crc {
                expected,
                got: self.crc,
            });
        }
        Ok(())
    }
}

/// Why a block was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockError {
    /// The payload is not the length the requester expected.
    Length {
        /// Length expected.
        expected: u64,
        /// Length received.
        got: u64,
    },
    /// The CRC does not match: corrupted, or a block of another sample.
    Crc {
        /// CRC announced with the block.
        expected: u32,
        /// CRC of what arrived.
        got: u32,
    },
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockError::Length { expected, got } => {
                write!(f, "block of {got} bytes where {expected} were expected")
            }
            BlockError::Crc { expected, got } => {
                write!(f, "block CRC {got:#010x} does not match {expected:#010x}")
            }
        }
    }
}

impl std::error::Error for BlockError {}

/// Verifies that `payload` is sample `sample` of dataset `fingerprint`, of
/// `expected_len` bytes, with block CRC `crc`.
pub fn verify(
    fingerprint: u64,
    sample: u64,
    expected_len: u64,
    payload: &[u8],
    crc: u32,
) -> Result<(), BlockError> {
    if payload.len() as u64 != expected_len {
        return Err(BlockError::Length {
            expected: expected_len,
            got: payload.len() as u64,
        });
    }
    let mut c = BlockCrc::new(fingerprint, sample, expected_len);
    c.update(payload);
    c.finish(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_crc_from_the_plain_crc_matches() {
        for len in [0usize, 1, 7, 64, 1000, 65_537] {
            let p: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let plain = crc32c::crc32c(&p);
            assert_eq!(
                block_crc_of(9, 4, len as u64, plain),
                block_crc(9, 4, &p),
                "len {len}"
            );
            assert_ne!(block_crc_of(9, 5, len as u64, plain), block_crc(9, 4, &p));
        }
    }

    #[test]
    fn right_block_verifies() {
        let p = b"hello block".to_vec();
        let c = block_crc(1, 2, &p);
        assert_eq!(verify(1, 2, p.len() as u64, &p, c), Ok(()));
        // The definition, spelled out.
        let mut id = Vec::new();
        id.extend_from_slice(&1u64.to_le_bytes());
        id.extend_from_slice(&2u64.to_le_bytes());
        id.extend_from_slice(&(p.len() as u64).to_le_bytes());
        id.extend_from_slice(&p);
        assert_eq!(c, crc32c::crc32c(&id));
    }

    #[test]
    fn wrong_identity_or_bytes_fail() {
        let p = vec![7u8; 4096];
        let c = block_crc(1, 2, &p);
        let n = p.len() as u64;
        assert!(matches!(
            verify(1, 3, n, &p, c),
            Err(BlockError::Crc { .. })
        ));
        assert!(matches!(
            verify(9, 2, n, &p, c),
            Err(BlockError::Crc { .. })
        ));
        assert!(matches!(
            verify(1, 2, n - 1, &p[..4095], c),
            Err(BlockError::Crc { .. })
        ));
        assert_eq!(
            verify(1, 2, n, &p[..4095], c),
            Err(BlockError::Length {
                expected: n,
                got: n - 1
            })
        );
        let mut q = p.clone();
        q[100] ^= 0x10;
        assert!(matches!(
            verify(1, 2, n, &q, c),
            Err(BlockError::Crc { .. })
        ));
        // Same bytes under another sample's CRC: a misrouted block.
        assert!(verify(1, 2, n, &p, block_crc(1, 5, &p)).is_err());
    }

    #[test]
    fn incremental_equals_whole() {
        let p: Vec<u8> = (0..10_000u32).map(|i| (i * 31) as u8).collect();
        let mut c = BlockCrc::new(4, 5, p.len() as u64);
        for piece in p.chunks(777) {
            c.update(piece);
        }
        assert_eq!(c.value(), block_crc(4, 5, &p));
        assert_eq!(c.finish(block_crc(4, 5, &p)), Ok(()));
        let mut short = BlockCrc::new(4, 5, p.len() as u64);
        short.update(&p[..10]);
        assert!(matches!(short.finish(0), Err(BlockError::Length { .. })));
    }
}
