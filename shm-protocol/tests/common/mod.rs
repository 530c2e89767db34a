//! Helpers shared by the integration tests.
//!
//! [`watchdog`] turns a deadlock into a failure: a test that holds a
//! [`Watchdog`] longer than its limit prints what was running and aborts the
//! whole test process, so CI reports a failed (crashed) test binary instead
//! of hanging until its own timeout.
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Guard returned by [`watchdog`]; dropping it disarms the watchdog.
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// Arms a watchdog: unless the returned guard is dropped within `limit`, a
/// background thread prints `what` and calls [`std::process::abort`].
pub fn watchdog(limit: Duration, what: &str) -> Watchdog {
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let flag = Arc::clone(&done);
    let what = what.to_owned();
    let thread = std::thread::Builder::new()
        .name("test-watchdog".into())
        .spawn(move || {
            let start = Instant::now();
            let (lock, cvar) = &*flag;
            let mut finished = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !*finished {
                let left = limit.saturating_sub(start.elapsed());
                if left.is_zero() {
                    // Straight to fd 2: the test harness captures `eprintln!`
                    // and its buffer is lost when the process aborts.
                    let _ = writeln!(
                        std::io::stderr(),
                        "watchdog: `{what}` still running after {limit:?}; aborting the test process"
                    );
                    std::process::abort();
                }
                finished = cvar
                    .wait_timeout(finished, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })
        .expect("spawn watchdog thread");
    Watchdog {
        done,
        thread: Some(thread),
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.done;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cvar.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A small deterministic generator (SplitMix64) for test data.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
}

/// SplitMix64's finaliser: a bijective scramble of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed that differs from run to run (time and pid), printed by callers so
/// a failure can be replayed.
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix(t ^ (u64::from(std::process::id()) << 32))
}
