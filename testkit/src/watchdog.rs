//! The watchdog: turns a hang into a failure. A test that holds a
//! [`Watchdog`] longer than its limit prints what was running and aborts the
//! whole test process, so CI reports a crashed test binary instead of
//! waiting for its own timeout.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A watchdog's limit: a [`Duration`], or whole seconds as a `u64`.
pub trait Limit {
    /// The limit as a duration.
    fn limit(self) -> Duration;
}

impl Limit for Duration {
    fn limit(self) -> Duration {
        self
    }
}

impl Limit for u64 {
    fn limit(self) -> Duration {
        Duration::from_secs(self)
    }
}

/// Guard returned by [`watchdog`]; dropping it disarms the watchdog.
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// Arms a watchdog for `name`: unless the returned guard is dropped within
/// `limit` (a [`Duration`] or seconds), a background thread prints `name`
/// and the limit straight to fd 2 and calls [`std::process::abort`].
pub fn watchdog(name: &str, limit: impl Limit) -> Watchdog {
    let limit = limit.limit();
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let flag = Arc::clone(&done);
    let name = name.to_owned();
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
                        "watchdog: `{name}` still running after {limit:?}: the test hangs; aborting the test process"
                    );
                    std::process::abort();
                }
                finished = cvar
                    .wait_timeout(finished, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })
        .expect("spawn the watchdog thread");
    Watchdog {
        done,
        thread: Some(thread),
    }
}

/// [`watchdog()`] named after the function it is called in (a test's
/// name): `let _w = watchdog_fn!(300);` in `fn a_test()` is
/// `let _w = watchdog("a_test", 300);`.
#[macro_export]
macro_rules! watchdog_fn {
    ($limit:expr) => {{
        fn here() {}
        $crate::watchdog::watchdog(
            $crate::watchdog::enclosing_fn(::std::any::type_name_of_val(&here)),
            $limit,
        )
    }};
}

/// The name of the function that `here_path` (the type name of a function
/// `here` declared in it) stands in.
#[doc(hidden)]
pub fn enclosing_fn(here_path: &str) -> &str {
    let path = here_path.strip_suffix("::here").unwrap_or(here_path);
    path.rsplit("::").next().unwrap_or(path)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disarmed_watchdog_lets_the_process_live_and_joins_its_thread() {
        let t0 = Instant::now();
        let w = watchdog("short", Duration::from_millis(300));
        drop(w);
        let w = watchdog("seconds", 1u64);
        drop(w);
        // Dropping wakes the thread at once: no waiting out the limit.
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(Limit::limit(3u64), Duration::from_secs(3));
    }

    #[test]
    fn watchdog_fn_is_named_after_its_function() {
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        assert_eq!(
            enclosing_fn(path),
            "watchdog_fn_is_named_after_its_function",
            "{path}"
        );
        drop(crate::watchdog_fn!(1u64));
    }

    const CHILD_VAR: &str = "GRANARY_TESTKIT_WATCHDOG_CHILD";

    /// In a child process (this test binary run again): a watchdog of
    /// 100 ms and a test that sleeps past it. In the parent: the child must
    /// die of SIGABRT, having said which test hung.
    #[test]
    fn an_expired_watchdog_aborts_the_process_naming_the_test() {
        if std::env::var_os(CHILD_VAR).is_some() {
            let _w = watchdog("the hanging child", Duration::from_millis(100));
            std::thread::sleep(Duration::from_secs(10));
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "watchdog::tests::an_expired_watchdog_aborts_the_process_naming_the_test",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(out.status.signal(), Some(6), "{:?}", out.status);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("`the hanging child` still running after 100ms"),
            "{err}"
        );
    }
}
