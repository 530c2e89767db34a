//! The agent's system calls that need `unsafe`, each behind a safe
//! function: the one place in this crate where `unsafe` is allowed (the
//! crate root denies it everywhere else).
//!
//! * this module: random keys, waiting on several descriptors;
//! * [`eventfd`]: the fetchers' completion eventfd and the wait on it;
//! * [`uring`]: io_uring entries that point into memory (paths, arena
//!   ranges, timeouts), held until the kernel has completed them.
#![allow(unsafe_code)]

pub(crate) mod eventfd;
pub(crate) mod uring;

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// 64 random bits from the operating system (keys, instance epochs).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // getrandom reads the kernel's CSPRNG; it fails only on kernels older
    // than anything this agent supports, where a panic with the reason is
    // the right answer.
    getrandom::fill(&mut b).expect("the kernel's random number generator is unavailable");
    u64::from_le_bytes(b)
}

/// Waits until one of `fds` is readable or `timeout` has passed. The
/// caller keeps the descriptors open for the call.
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfds` is a live, initialised array of `pfds.len()` pollfd
    // structs that poll(2) may write `revents` into.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
