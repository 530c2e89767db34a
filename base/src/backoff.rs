//! The doubling delay: `first`, then twice that after each further
//! failure, never more than `max`. [`Backoff::nth`] is the delay before
//! the n-th retry, [`Backoff::jittered`] a pick in its upper half (so
//! that many retrying at once spread out), [`Backoff::after`] the step
//! from one delay to the next for callers that keep the current delay.

use std::time::Duration;

/// A delay that doubles from `first` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub first: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Backoff {
    /// Doubling from `first` up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max }
    }

    /// The delay before retry `n` (1 for the first; 0 counts as 1):
    /// `first` doubled `n - 1` times, at most `max` (and at most
    /// `u64::MAX` nanoseconds).
    pub fn nth(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(64);
        let nanos = self
            .first
            .as_nanos()
            .saturating_mul(1u128 << doublings)
            .min(self.max.as_nanos())
            .min(u128::from(u64::MAX));
        Duration::from_nanos(nanos as u64)
    }

    /// A pick in `[cap / 2, cap]` where `cap` is [`Backoff::nth`]`(n)`;
    /// `pick` (64 well-spread bits, e.g. a [`mix64`](crate::mix64) of a
    /// seed) chooses the point, so equal picks give equal delays.
    pub fn jittered(&self, n: u32, pick: u64) -> Duration {
        let cap = self.nth(n).as_nanos();
        let half = cap / 2;
        let nanos = half + (((cap - half) * u128::from(pick)) >> 64);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The delay after `current`: `first` when `current` is zero, else
    /// twice `current`, at most `max`.
    pub fn after(&self, current: Duration) -> Duration {
        if current.is_zero() {
            return self.first.min(self.max);
        }
        current.saturating_mul(2).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_delay_doubles_up_to_the_cap() {
        let b = Backoff::new(10 * MS, 100 * MS);
        let got: Vec<_> = (0..7).map(|n| b.nth(n)).collect();
        assert_eq!(
            got,
            [
                10 * MS,
                10 * MS,
                20 * MS,
                40 * MS,
                80 * MS,
                100 * MS,
                100 * MS
            ]
        );
        assert_eq!(b.nth(u32::MAX), 100 * MS);
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(huge.nth(40), Duration::from_nanos(u64::MAX));

        let mut d = Duration::ZERO;
        let mut steps = Vec::new();
        for _ in 0..6 {
            d = b.after(d);
            steps.push(d);
        }
        assert_eq!(
            steps,
            [10 * MS, 20 * MS, 40 * MS, 80 * MS, 100 * MS, 100 * MS]
        );
    }

    #[test]
    fn a_jittered_delay_stays_in_the_upper_half() {
        let b = Backoff::new(10 * MS, 100 * MS);
        for n in 1..8 {
            let cap = b.nth(n);
            assert_eq!(b.jittered(n, 0), cap / 2);
            assert!(b.jittered(n, u64::MAX) <= cap);
            for pick in [1u64 << 20, 1 << 40, 1 << 63, crate::mix64(n.into())] {
                let d = b.jittered(n, pick);
                assert!(d >= cap / 2 && d <= cap, "{n}: {d:?} of {cap:?}");
            }
        }
    }
}
