//! Loaders that keep breaking the protocol: the agent closes a fenced
//! session's connection, and a process fenced again within
//! [`WINDOW`] waits before its next session opens: 250 ms after its second
//! fence, doubling with each further one up to 30 s. Its opens until then
//! are refused with `Busy`, saying how long is left. The key is the
//! process (pid), not the user: other processes of the same user (the
//! honest loaders of the job) are not held back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Fences further apart than this start the count again.
const WINDOW: Duration = Duration::from_secs(60);
/// The wait after the second fence within the window.
const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest wait.
const MAX_DELAY: Duration = Duration::from_secs(30);
/// Processes remembered at most (the oldest record goes first).
const MAX_RECORDS: usize = 4096;

/// One process's recent fences.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Fences within the window.
    recent: u32,
    /// When the last one was.
    last: Instant,
    /// No session opens before this.
    until: Instant,
}

/// The fence records of recent offenders, by pid.
#[derive(Debug, Default)]
pub(crate) struct FenceBackoff {
    by_pid: HashMap<i32, Record>,
}

impl FenceBackoff {
    /// Records a fence of process `pid` at `now`; returns how long its next
    /// session must wait.
    pub(crate) fn fenced(&mut self, pid: i32, now: Instant) -> Duration {
        self.forget_old(now);
        let recent = match self.by_pid.get(&pid) {
            Some(r) if now.saturating_duration_since(r.last) < WINDOW => r.recent + 1,
            _ => 1,
        };
        let delay = delay_after(recent);
        self.by_pid.insert(
            pid,
            Record {
                recent,
                last: now,
                until: now + delay,
            },
        );
        delay
    }

    /// Whether process `pid` may open a session at `now`; if not, its
    /// recent fences and the wait left.
    pub(crate) fn check(&self, pid: i32, now: Instant) -> Result<(), (u32, Duration)> {
        match self.by_pid.get(&pid) {
            Some(r) if r.until > now => Err((r.recent, r.until - now)),
            _ => Ok(()),
        }
    }

    /// Drops records past their window, and the oldest beyond
    /// [`MAX_RECORDS`].
    fn forget_old(&mut self, now: Instant) {
        self.by_pid
            .retain(|_, r| now.saturating_duration_since(r.last) < WINDOW || r.until > now);
        while self.by_pid.len() >= MAX_RECORDS {
            let Some(oldest) = self
                .by_pid
                .iter()
                .min_by_key(|(_, r)| r.last)
                .map(|(&p, _)| p)
            else {
                break;
            };
            self.by_pid.remove(&oldest);
        }
    }
}

/// The wait after the `recent`-th fence within the window.
fn delay_after(recent: u32) -> Duration {
    if recent < 2 {
        return Duration::ZERO;
    }
    granary_base::Backoff::new(FIRST_DELAY, MAX_DELAY).nth(recent - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_second_fence_up_to_the_cap() {
        let waits: Vec<u128> = (1..=10).map(|n| delay_after(n).as_millis()).collect();
        assert_eq!(
            waits,
            [0, 250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
        );
    }

    #[test]
    fn a_repeat_offender_waits_others_do_not_and_old_fences_are_forgotten() {
        let mut b = FenceBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.fenced(7, t0), Duration::ZERO);
        assert!(b.check(7, t0).is_ok(), "one fence costs no wait");
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.fenced(7, t1), FIRST_DELAY);
        let (recent, left) = b.check(7, t1).expect_err("held back");
        assert_eq!((recent, left), (2, FIRST_DELAY));
        assert!(b.check(8, t1).is_ok(), "another process is not held back");
        assert!(b.check(7, t1 + FIRST_DELAY).is_ok(), "the wait ends");
        // Past the window, the count starts again.
        let later = t1 + WINDOW + Duration::from_secs(1);
        assert_eq!(b.fenced(7, later), Duration::ZERO);
    }

    #[test]
    fn records_are_bounded() {
        let mut b = FenceBackoff::default();
        let t0 = Instant::now();
        for pid in 0..(MAX_RECORDS as i32 + 100) {
            b.fenced(pid, t0 + Duration::from_micros(pid as u64));
        }
        assert!(b.by_pid.len() <= MAX_RECORDS);
    }
}
