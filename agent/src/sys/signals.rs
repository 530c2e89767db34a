//! The daemon's signal dispositions: SIGTERM and SIGINT raise a stop flag,
//! SIGPIPE is ignored.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_termination(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handlers and returns the flag that SIGTERM and SIGINT
/// raise. SIGPIPE is ignored, so a loader that hangs up mid-send gives
/// `EPIPE` instead of killing the process. Calling it again reinstalls
/// the same handlers and returns the same flag.
pub(crate) fn install_termination_flag() -> &'static AtomicBool {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; `signal` has no other preconditions.
        unsafe {
            libc::signal(sig, on_termination as *const () as libc::sighandler_t);
        }
    }
    // SAFETY: ignoring SIGPIPE has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    &STOP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigterm_raises_the_flag_and_sigpipe_is_ignored() {
        let stop = install_termination_flag();
        // SAFETY: raise(3) sends SIGPIPE to this thread; it is ignored
        // (installed above), so it does not terminate the test process.
        let rc_pipe = unsafe { libc::raise(libc::SIGPIPE) };
        // SAFETY: as above; SIGTERM's handler only stores to an atomic.
        let rc_term = unsafe { libc::raise(libc::SIGTERM) };
        assert_eq!((rc_pipe, rc_term), (0, 0));
        assert!(stop.load(Ordering::Relaxed));
    }
}
