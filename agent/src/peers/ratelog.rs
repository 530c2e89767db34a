//! Rate-limited warnings of the peer tier: whatever a stranger or a peer
//! does over and over, the log gets at most one line per kind per period,
//! with the count of those left out since the last one. The lines carry
//! the remote address; the `granary_peer_rejected_total{reason}` counter
//! counts every event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One line per kind per [`RateLog::every`].
#[derive(Debug)]
pub(crate) struct RateLog {
    every: Duration,
    last: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl RateLog {
    /// At most one line per kind per `every`.
    pub(crate) fn new(every: Duration) -> RateLog {
        RateLog {
            every,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line of `kind` may be written now: `Some(n)` with the
    /// lines left out since the last one, `None` to stay quiet.
    pub(crate) fn allow(&self, kind: &'static str) -> Option<u64> {
        self.allow_at(kind, Instant::now())
    }

    fn allow_at(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get_mut(kind) {
            Some((at, skipped)) if now.saturating_duration_since(*at) < self.every => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                let n = *skipped;
                *at = now;
                *skipped = 0;
                Some(n)
            }
            None => {
                last.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_period_with_the_count_left_out() {
        let r = RateLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.allow_at("a", t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(r.allow_at("a", t0 + Duration::from_millis(i)), None);
        }
        // Another kind has its own budget.
        assert_eq!(r.allow_at("b", t0), Some(0));
        assert_eq!(r.allow_at("a", t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(r.allow_at("a", t0 + Duration::from_secs(11)), None);
    }
}
