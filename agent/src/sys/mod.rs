//! The agent's system calls that need `unsafe`, each behind a safe
//! function: the one place in this crate where `unsafe` is allowed (the
//! crate root denies it everywhere else).
//!
//! * this module: random keys, waiting on several descriptors, the
//!   prepare stage's scalar resizer;
//! * [`signals`]: the daemon's SIGTERM/SIGINT stop flag, SIGPIPE ignored;
//! * [`eventfd`]: the fetchers' completion eventfd and the wait on it;
//! * [`uring`]: io_uring entries that point into memory (paths, arena
//!   ranges, timeouts), held until the kernel has completed them.
#![allow(unsafe_code)]

pub(crate) mod eventfd;
pub(crate) mod signals;
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

/// Makes `resizer` use its portable scalar code, whatever the CPU offers:
/// the reference that the prepare stage's SIMD output is compared with.
pub(crate) fn scalar_resizer(resizer: &mut fast_image_resize::Resizer) {
    // SAFETY: `set_cpu_extensions` is unsafe because an extension the CPU
    // lacks would run illegal instructions; `None` is the scalar code,
    // which every CPU runs.
    unsafe { resizer.set_cpu_extensions(fast_image_resize::CpuExtensions::None) }
}

/// How many of the first `len` bytes' pages of `file` are in the page cache
/// (`mincore` over a shared mapping of them): the `direct_io` default's
/// probe, and tests of reads that must bypass the cache. `len` must not
/// exceed the file's size.
pub(crate) fn pages_in_page_cache(file: &std::fs::File, len: usize) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(0);
    }
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: a fresh read-only shared mapping of an open file, which
    // nothing reads through; unmapped below before the function returns.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `addr..addr + len` is the mapping made above, and `vec` holds
    // one byte per page of it.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    Ok(vec.iter().filter(|&&b| b & 1 == 1).count())
}

/// Waits until one of `fds` is readable or `timeout` has passed. The
/// caller keeps the descriptors open for the call.
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<()> {
    let ms = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    poll_in(fds, ms).map(|_| ())
}

/// The descriptors of `fds` that are readable now, closed at the other end
/// or in error (a poll(2) that does not wait), in the order of `fds`. The
/// caller keeps the descriptors open for the call.
pub(crate) fn ready_now(fds: &[RawFd]) -> io::Result<Vec<RawFd>> {
    let pfds = poll_in(fds, 0)?;
    Ok(pfds
        .iter()
        .filter(|p| p.revents != 0)
        .map(|p| p.fd)
        .collect())
}

/// poll(2) for `POLLIN` on `fds` for up to `ms` milliseconds (an
/// interrupted wait counts as a wait with nothing ready).
fn poll_in(fds: &[RawFd], ms: libc::c_int) -> io::Result<Vec<libc::pollfd>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a live, initialised array of `pfds.len()` pollfd
    // structs that poll(2) may write `revents` into.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        pfds.iter_mut().for_each(|p| p.revents = 0);
    }
    Ok(pfds)
}

/// The supplementary groups of the process at the other end of the Unix
/// socket `fd`, as they were when it connected (`SO_PEERGROUPS`, Linux
/// 4.13 and later).
pub(crate) fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live buffer of `len` bytes that the kernel
        // fills with gid_t values; `len` is a live socklen_t it updates.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // ERANGE: the buffer was too small and `len` says how large it must be.
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 1 << 16 {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}
