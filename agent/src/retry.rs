//! The one retry layer: when a failed sample read is tried again.
//!
//! Sources make one attempt per request and say what kind of failure it
//! was ([`FailureKind`]); the engine asks the dataset's [`RetryPolicy`]
//! what to do next. Transient failures and timeouts are retried with
//! exponential backoff and jitter, up to a number of attempts and within a
//! total deadline per sample; anything else fails the sample at once.
//!
//! Worst case from the first attempt to a failed sample, with the
//! defaults (`read_timeout_ms` = 10 s, `read_retries` = 3, backoff 100 ms
//! doubling to at most 2 s, `sample_deadline_ms` = 20 s): when every
//! attempt times out, the first ends at 10 s, the first retry starts at
//! about 10.1 s and ends at about 20.1 s, and no retry starts after the
//! 20 s deadline: about 20.1 s. A store that answers errors at once fails
//! the sample after 0.7 s of backoff. In any configuration a sample fails
//! within `sample_deadline_ms + read_timeout_ms` (30 s with the defaults):
//! no retry starts after the deadline, and an attempt lasts at most the
//! read timeout. Remote datasets default to 8 retries (`dataset.retries`),
//! bounded by the same deadline.

use crate::config::{Config, RetrySettings};
use crate::source::FailureKind;
use std::time::{Duration, Instant};

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryDecision {
    /// Submit the read again at (not before) this instant.
    RetryAt(Instant),
    /// Report the failure for this sample.
    GiveUp,
}

/// One dataset's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Upper bound of the backoff before the first retry; doubles per retry.
    pub backoff: Duration,
    /// Upper bound of any backoff.
    pub backoff_max: Duration,
    /// No retry starts later than this after the sample's first attempt.
    pub deadline: Duration,
    /// One attempt's time limit (`prefetch.read_timeout_ms`).
    pub attempt_timeout: Duration,
}

impl RetryPolicy {
    /// The policy of a dataset with retry settings `r` (`[prefetch]` with
    /// its `[dataset.retry]` applied), attempts limited to
    /// `prefetch.read_timeout_ms`.
    pub fn new(cfg: &Config, r: &RetrySettings) -> RetryPolicy {
        RetryPolicy {
            attempts: r.retries.saturating_add(1),
            backoff: r.backoff,
            backoff_max: r.backoff_max,
            deadline: r.deadline,
            attempt_timeout: Duration::from_millis(cfg.prefetch.read_timeout_ms),
        }
    }

    /// The backoff before retry number `retry` (1 for the first): a
    /// uniform pick in `[cap / 2, cap]`, where `cap` is `backoff` doubled
    /// `retry - 1` times and bounded by `backoff_max`. `seed` picks the
    /// point, so different samples spread out.
    pub fn delay(&self, retry: u32, seed: u64) -> Duration {
        let pick = granary_base::mix64(seed ^ u64::from(retry).rotate_left(32));
        self.backoff().jittered(retry, pick)
    }

    /// The doubling of `backoff` up to `backoff_max`.
    fn backoff(&self) -> granary_base::Backoff {
        granary_base::Backoff::new(self.backoff, self.backoff_max)
    }

    /// After the `made`-th failed attempt (1 for the first) of a sample
    /// first tried at `first`, failing with `kind` at `now`.
    pub(crate) fn decide(
        &self,
        kind: FailureKind,
        made: u32,
        first: Instant,
        now: Instant,
        seed: u64,
    ) -> RetryDecision {
        if !kind.retryable() || made >= self.attempts {
            return RetryDecision::GiveUp;
        }
        let Some(at) = now.checked_add(self.delay(made, seed)) else {
            return RetryDecision::GiveUp;
        };
        match first.checked_add(self.deadline) {
            Some(deadline) if at < deadline => RetryDecision::RetryAt(at),
            _ => RetryDecision::GiveUp,
        }
    }

    /// The longest a sample can take from its first attempt to being
    /// reported failed: every attempt running into its timeout, with the
    /// largest backoffs; never more than the deadline plus one attempt.
    #[cfg(test)]
    pub(crate) fn worst_case(&self) -> Duration {
        let mut total = self.attempt_timeout;
        for retry in 1..self.attempts {
            let backoff = self.backoff().nth(retry);
            if total + backoff >= self.deadline {
                break;
            }
            total += backoff + self.attempt_timeout;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            backoff: Duration::from_millis(10),
            backoff_max: Duration::from_secs(2),
            deadline: Duration::from_secs(45),
            attempt_timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn only_transient_failures_and_timeouts_are_retried() {
        let p = policy();
        let t = Instant::now();
        for kind in [FailureKind::Transient, FailureKind::TimedOut] {
            assert!(matches!(
                p.decide(kind, 1, t, t, 1),
                RetryDecision::RetryAt(_)
            ));
        }
        for kind in [
            FailureKind::NotFound,
            FailureKind::Permanent,
            FailureKind::Short,
            FailureKind::Corrupt,
        ] {
            assert_eq!(
                p.decide(kind, 1, t, t, 1),
                RetryDecision::GiveUp,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn attempts_are_bounded() {
        let p = policy();
        let t = Instant::now();
        assert!(matches!(
            p.decide(FailureKind::Transient, 3, t, t, 1),
            RetryDecision::RetryAt(_)
        ));
        assert_eq!(
            p.decide(FailureKind::Transient, 4, t, t, 1),
            RetryDecision::GiveUp
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = policy();
        for seed in 0..100 {
            let d1 = p.delay(1, seed);
            assert!(d1 >= Duration::from_millis(5) && d1 <= Duration::from_millis(10));
            let d3 = p.delay(3, seed);
            assert!(d3 >= Duration::from_millis(20) && d3 <= Duration::from_millis(40));
            assert!(p.delay(30, seed) <= Duration::from_secs(2));
        }
        let spread: std::collections::HashSet<_> = (0..100).map(|s| p.delay(2, s)).collect();
        assert!(spread.len() > 50, "jitter spreads samples out");
    }

    #[test]
    fn no_retry_past_the_deadline() {
        let p = policy();
        let first = Instant::now();
        let late = first + Duration::from_secs(45);
        assert_eq!(
            p.decide(FailureKind::TimedOut, 1, first, late, 1),
            RetryDecision::GiveUp,
            "no retry starts after the deadline"
        );
        let early = first + Duration::from_secs(30);
        assert!(matches!(
            p.decide(FailureKind::TimedOut, 1, first, early, 1),
            RetryDecision::RetryAt(_)
        ));
    }

    #[test]
    fn worst_case_with_the_defaults_is_under_a_minute() {
        let cfg = Config::default();
        let p = RetryPolicy::new(&cfg, &RetrySettings::default());
        assert!(
            p.worst_case() < Duration::from_secs(60),
            "{:?}",
            p.worst_case()
        );
        assert!(p.worst_case() <= p.deadline + p.attempt_timeout);
        // 4 attempts of 10 s, backoffs of 10, 20 and 40 ms: all within 45 s.
        assert_eq!(policy().worst_case(), Duration::from_millis(40_070));
        assert_eq!(p.worst_case(), Duration::from_millis(20_100));
    }
}
