//! SplitMix64 (Steele, Lea and Flood, 2014): the increment [`GAMMA`], the
//! finaliser [`mix64`] (a bijection of 64-bit integers) and the generator
//! [`SplitMix64`]. In Python:
//!
//! ```text
//! M = 2**64 - 1
//! GAMMA = 0x9e3779b97f4a7c15
//! def mix64(z):
//!     z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
//!     z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
//!     return z ^ (z >> 31)
//! ```

/// SplitMix64's increment: the odd integer closest to 2^64 / φ.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijection of 64-bit integers whose output
/// bits each depend on every input bit.
#[inline]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 generator: each draw adds [`GAMMA`] to the state and
/// returns [`mix64`] of it. Deterministic from its seed (the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix64(self.0)
    }

    /// A draw in `0..n` by remainder (slightly biased for an `n` that is
    /// not a power of two: for tests and synthetic data, not for plans).
    /// Panics when `n` is 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The reference SplitMix64 stream from seed 0 (as in Java's
        // SplittableRandom and every published implementation).
        let mut g = SplitMix64(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(g.next_u64(), 0x06C4_5D18_8009_454F);
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(GAMMA), 0xE220_A839_7B1D_CDAF);
        let mut g = SplitMix64(7);
        assert!((0..1000).all(|_| g.below(10) < 10));
    }
}
