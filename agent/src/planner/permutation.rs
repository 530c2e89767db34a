//! The epoch's permutation: the stream key of `(seed, epoch)`, SplitMix64
//! and the Fisher-Yates shuffle of the planner's algorithm (steps 1 to 4 in
//! the planner's documentation).

use super::params::{check_num_samples, PlanError};

/// Domain tag mixed into every stream key: the ASCII bytes `granary1` read
/// as a big-endian 64-bit integer. It names the version of the algorithm; a
/// different ordering algorithm would use a different tag.
pub const ALGORITHM_TAG: u64 = 0x6772_616E_6172_7931;

/// SplitMix64's increment and finaliser (granary-base owns them).
pub(crate) use granary_base::hash::{mix64, GAMMA};

/// The 64-bit key of the random stream of `(seed, epoch)`:
/// `mix64(mix64(seed ^ ALGORITHM_TAG) + epoch * GAMMA)` with wrapping
/// arithmetic.
///
/// For a fixed seed, distinct epochs give distinct keys; for a fixed epoch,
/// distinct seeds give distinct keys (every step is a bijection).
pub fn stream_key(seed: u64, epoch: u32) -> u64 {
    mix64(mix64(seed ^ ALGORITHM_TAG).wrapping_add(u64::from(epoch).wrapping_mul(GAMMA)))
}

/// SplitMix64: a 64-bit Weyl sequence passed through [`mix64`].
pub(super) struct SplitMix64 {
    pub(super) state: u64,
}

impl SplitMix64 {
    #[inline]
    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform integer in `0..s` (`s >= 1`): Lemire's multiply-shift with
    /// rejection. The high word of `x * s` is the result; a draw whose low
    /// word is below `2^64 mod s` is rejected and redrawn.
    #[inline]
    pub(super) fn below(&mut self, s: u64) -> u64 {
        let mut m = u128::from(self.next_u64()) * u128::from(s);
        // Truncations are intended: the low and high 64-bit words of m.
        let mut low = m as u64;
        if low < s {
            let threshold = s.wrapping_neg() % s;
            while low < threshold {
                m = u128::from(self.next_u64()) * u128::from(s);
                low = m as u64;
            }
        }
        (m >> 64) as u64
    }
}

/// The permutation of `0..n` for `(seed, epoch)`: Fisher–Yates from the last
/// position down, driven by SplitMix64 started at [`stream_key`]`(seed,
/// epoch)`.
///
/// `n = 0` gives an empty permutation. Takes `8 * n` bytes.
///
/// # Errors
///
/// [`PlanError::TooManySamples`] when `n` exceeds [`MAX_SAMPLES`],
/// [`PlanError::OutOfMemory`] when the vector cannot be allocated.
pub fn epoch_permutation(seed: u64, epoch: u32, n: u64) -> Result<Vec<u64>, PlanError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let len = check_num_samples(n)?;
    let mut perm: Vec<u64> = Vec::new();
    perm.try_reserve_exact(len)
        .map_err(|_| PlanError::OutOfMemory { num_samples: n })?;
    perm.extend(0..n);
    let mut rng = SplitMix64 {
        state: stream_key(seed, epoch),
    };
    for i in (1..len).rev() {
        // i < len <= MAX_SAMPLES: both conversions are exact.
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    Ok(perm)
}
