//! Parking on a 32-bit word that may live in shared memory.
//!
//! Real builds use the Linux `futex(2)` call without `FUTEX_PRIVATE_FLAG`, so
//! a waiter in one process is woken by a store-and-wake in another process
//! that maps the same page. Under Miri (which cannot share memory across
//! processes) waiting degrades to a short sleep, and under loom a futex is
//! modelled by a mutex and condition variable, which keeps the atomic
//! check-then-sleep semantics that make lost wake-ups visible as deadlocks.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, for at most `timeout` (forever if `None`).
///
/// Returns early on a wake-up, on a signal, or spuriously: callers re-check
/// their condition in a loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    imp::wait(word, expected, timeout)
}

/// Wakes every thread sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    imp::wake_all(word)
}

#[cfg(all(not(feature = "loom"), not(miri)))]
mod imp {
    use super::*;

    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `word` is a live, aligned u32 for the duration of the call;
        // FUTEX_WAIT only reads it and compares with `expected`; `ts_ptr` is
        // null or points at a timespec that outlives the call. Errors (EAGAIN
        // when the value already changed, EINTR, ETIMEDOUT) all mean "return
        // and let the caller re-check".
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts_ptr,
            );
        }
    }

    pub(super) fn wake_all(word: &AtomicU32) {
        // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not access
        // memory beyond looking up waiters keyed by its address.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
        }
    }
}

#[cfg(all(not(feature = "loom"), miri))]
mod imp {
    use super::*;
    use crate::sync::Ordering;

    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        if word.load(Ordering::Acquire) == expected {
            let nap = Duration::from_micros(50);
            std::thread::sleep(timeout.map_or(nap, |t| t.min(nap)));
        }
    }

    pub(super) fn wake_all(_word: &AtomicU32) {}
}

#[cfg(feature = "loom")]
mod imp {
    use super::*;
    use crate::sync::Ordering;
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        static ref PARK: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    pub(super) fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        // Timeouts are ignored on purpose: a lost wake-up must show up as a
        // deadlock in the model rather than be papered over by a timer.
        let guard = PARK.0.lock().unwrap();
        if word.load(Ordering::SeqCst) == expected {
            drop(PARK.1.wait(guard).unwrap());
        }
    }

    pub(super) fn wake_all(_word: &AtomicU32) {
        let _guard = PARK.0.lock().unwrap();
        PARK.1.notify_all();
    }
}

#[cfg(all(test, not(feature = "loom"), not(miri)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out_when_nobody_wakes() {
        let w = AtomicU32::new(7);
        let t = Instant::now();
        wait(&w, 7, Some(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn wait_returns_at_once_when_value_differs() {
        let w = AtomicU32::new(1);
        let t = Instant::now();
        wait(&w, 2, Some(Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn wake_releases_a_sleeper() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let h = std::thread::spawn(move || {
            let t = Instant::now();
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(10)));
            }
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        wake_all(&w);
        let waited = h.join().unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "sleeper was not woken: {waited:?}"
        );
    }
}
