//! Where the engine reads the time: the system's monotonic clock in
//! production, a clock the test moves in the phases' tests.

use std::time::Instant;

/// A source of monotonic time.
pub(crate) trait Clock: Send {
    /// Now.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod manual {
    use super::Clock;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// A clock that moves only when told to; clones share the time.
    #[derive(Debug, Clone)]
    pub(crate) struct ManualClock(Arc<Mutex<Instant>>);

    impl ManualClock {
        pub(crate) fn new() -> ManualClock {
            ManualClock(Arc::new(Mutex::new(Instant::now())))
        }

        pub(crate) fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
    }
}
