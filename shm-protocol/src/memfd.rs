//! Thin wrappers over `memfd_create(2)`, `ftruncate(2)`, file seals and `fstat(2)`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Seal: the file may not shrink.
pub const SEAL_SHRINK: i32 = libc::F_SEAL_SHRINK;
/// Seal: the file may not grow.
pub const SEAL_GROW: i32 = libc::F_SEAL_GROW;
/// Seal: no new writable mappings or write(2) (existing mappings stay writable).
pub const SEAL_FUTURE_WRITE: i32 = libc::F_SEAL_FUTURE_WRITE;
/// Seal: the seal set itself is frozen.
pub const SEAL_SEAL: i32 = libc::F_SEAL_SEAL;

/// Creates a close-on-exec, sealable memfd of `size` bytes.
pub fn create(name: &str, size: u64, hugetlb: bool) -> io::Result<OwnedFd> {
    let cname = CString::new(name.replace('\0', "_")).expect("NULs were replaced");
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if hugetlb {
        flags |= libc::MFD_HUGETLB;
    }
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd size too large"))?;
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Adds `seals` (a combination of the `SEAL_*` constants).
pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: plain fcntl on a live descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The seals currently set on `fd`.
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: plain fcntl on a live descriptor.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// The size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let file = std::fs::File::from(fd.try_clone_to_owned()?);
    Ok(file.metadata()?.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn create_seal_and_inspect() {
        let fd = create("granary-test", 8192, false).unwrap();
        assert_eq!(file_size(fd.as_fd()).unwrap(), 8192);
        add_seals(fd.as_fd(), SEAL_SHRINK | SEAL_GROW).unwrap();
        let s = seals(fd.as_fd()).unwrap();
        assert_eq!(s & (SEAL_SHRINK | SEAL_GROW), SEAL_SHRINK | SEAL_GROW);
        // SAFETY: plain syscall on a live descriptor.
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) } < 0);
    }
}
