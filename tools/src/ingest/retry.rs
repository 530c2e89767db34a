//! The ingest's retries: an operation on the store (a PUT, a read-back, a
//! listing, a statement) that fails with a retryable error is tried again
//! after an exponential, jittered backoff, up to the dataset's `retries`
//! times. (The agent itself makes one attempt per request; its retry
//! policy is the engine's.)

use granary_agent::source::cql::{AttemptError, CqlSettings};
use granary_agent::source::s3::{classify, StoreSettings};
use std::future::Future;
use std::time::Duration;

/// Upper bound of the backoff before the first retry; it doubles per retry.
pub const BASE_DELAY: Duration = Duration::from_millis(50);
/// Upper bound of any backoff.
pub const MAX_DELAY: Duration = Duration::from_secs(2);

/// How many times to retry, and how long to wait before each retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Retries after the first failure; 0 reports the first error.
    pub retries: u32,
    /// Upper bound of the delay before the first retry; doubles per retry.
    pub base_delay: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
}

impl Backoff {
    /// `retries` retries with the default delays.
    pub fn new(retries: u32) -> Backoff {
        Backoff {
            retries,
            base_delay: BASE_DELAY,
            max_delay: MAX_DELAY,
        }
    }

    /// The delay before retry number `attempt` (1 for the first): a
    /// uniform pick in `[cap / 2, cap]`, where `cap` is `base_delay`
    /// doubled `attempt - 1` times and bounded by `max_delay`; `seed`
    /// picks the point, so equal seeds give equal delays and different
    /// items spread out.
    pub fn delay(&self, attempt: u32, seed: u64) -> Duration {
        let pick = splitmix(seed ^ u64::from(attempt).rotate_left(32));
        granary_base::Backoff::new(self.base_delay, self.max_delay).jittered(attempt, pick)
    }
}

/// SplitMix64: well-spread bits from any seed.
fn splitmix(x: u64) -> u64 {
    granary_base::SplitMix64(x).next_u64()
}

/// Runs `op` until it succeeds, fails with an error `retryable` rejects,
/// or `backoff.retries` retries have failed, sleeping the backoff
/// (jittered by `seed`) between attempts. On failure: the last error and
/// the number of attempts made.
pub async fn with_retries<T, E, F, Fut>(
    backoff: Backoff,
    seed: u64,
    retryable: impl Fn(&E) -> bool,
    mut op: F,
) -> Result<T, (E, u32)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if attempts <= backoff.retries && retryable(&e) => {
                tokio::time::sleep(backoff.delay(attempts, seed)).await;
            }
            Err(e) => return Err((e, attempts)),
        }
    }
}

/// [`with_retries`] for an object-store operation (S3, GCS, Azure), as
/// `settings.retries()` asks.
pub async fn s3<T, F, Fut>(
    settings: &StoreSettings,
    seed: u64,
    op: F,
) -> Result<T, (object_store::Error, u32)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let backoff = Backoff::new(settings.retries());
    with_retries(backoff, seed, |e| classify(e).retryable, op).await
}

/// [`with_retries`] for a CQL operation, as `settings.retries` asks.
pub async fn cql<T, F, Fut>(
    settings: &CqlSettings,
    seed: u64,
    op: F,
) -> Result<T, (AttemptError, u32)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AttemptError>>,
{
    let backoff = Backoff::new(settings.retries);
    with_retries(backoff, seed, AttemptError::retryable, op).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn backs_off_exponentially_with_bounded_jitter() {
        let b = Backoff {
            retries: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
        };
        for seed in 0..200u64 {
            for attempt in 1..=6u32 {
                let cap = Duration::from_millis((10u64 << (attempt - 1)).min(50));
                let d = b.delay(attempt, seed);
                assert!(
                    d >= cap / 2 && d <= cap,
                    "attempt {attempt} seed {seed}: {d:?}"
                );
                assert_eq!(d, b.delay(attempt, seed), "deterministic");
            }
        }
        let distinct: std::collections::HashSet<_> = (0..50).map(|s| b.delay(2, s)).collect();
        assert!(distinct.len() > 40, "jitter spreads items out");
        let huge = Backoff {
            retries: 100,
            base_delay: Duration::MAX,
            max_delay: Duration::MAX,
        };
        assert!(huge.delay(100, 1) > Duration::ZERO);
    }

    fn run<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn retries_retryable_errors_up_to_the_limit() {
        let b = Backoff {
            retries: 2,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        };
        // Fails twice, then succeeds: three attempts.
        let calls = AtomicU32::new(0);
        let r: Result<u32, (&str, u32)> = run(with_retries(
            b,
            7,
            |_| true,
            || async {
                let n = calls.fetch_add(1, Ordering::Relaxed);
                if n < 2 {
                    Err("busy")
                } else {
                    Ok(n)
                }
            },
        ));
        assert_eq!(r, Ok(2));
        // Always failing: the last error after 1 + 2 attempts.
        let r: Result<(), (&str, u32)> =
            run(with_retries(b, 7, |_| true, || async { Err("busy") }));
        assert_eq!(r, Err(("busy", 3)));
        // Not retryable: one attempt.
        let r: Result<(), (&str, u32)> =
            run(with_retries(b, 7, |_| false, || async { Err("denied") }));
        assert_eq!(r, Err(("denied", 1)));
    }
}
