//! The sample arena: one memfd the agent writes and loaders map read-only.
//!
//! The agent creates the arena with [`Arena::create`]: a memfd (on hugepages
//! when they are available and asked for), sized, mapped shared and
//! writable (optionally pre-faulted), then sealed with `F_SEAL_SHRINK`,
//! `F_SEAL_GROW`, `F_SEAL_FUTURE_WRITE` and `F_SEAL_SEAL`. The agent's own
//! writable mapping stays valid; from then on nobody, the agent included,
//! can create a new writable shared mapping, `write(2)` to the file, or
//! change its size. The fd sent to loaders ([`Arena::loader_fd`]) is a
//! read-only re-open on top of that.
//!
//! A loader maps the received fd with [`ArenaView::map`], which refuses an
//! fd of the wrong size or one that is not sealed.
//!
//! [`Arena::heap`] builds an arena on heap memory with the same interface,
//! so the logic above it runs under Miri.
//!
//! The arena is shared memory: its bytes may change at any moment through
//! another mapping, so this module never hands out references to them, only
//! copies ([`Arena::read_at`], [`ArenaView::read_at`]) and raw pointers.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::stat::{fchmod, fstat, Mode};

use crate::region::Region;

/// Normal arenas are sized in multiples of this.
pub const ARENA_ALIGN: u64 = 4096;

/// Where the kernel takes hugepage reservations; named in error messages.
pub const NR_HUGEPAGES_PATH: &str = "/proc/sys/vm/nr_hugepages";

/// Seals a loader requires before it maps an arena.
const REQUIRED_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_FUTURE_WRITE);

/// Whether the arena lives on hugepages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Normal pages.
    Off,
    /// Hugepages if the kernel has them reserved, otherwise normal pages
    /// (see [`Arena::fallback_reason`]).
    Try,
    /// Hugepages or an error ([`ArenaError::HugePagesRequired`]).
    Required,
}

/// How to create an [`Arena`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaOptions {
    /// Requested size in bytes; rounded up to [`ARENA_ALIGN`] or to the
    /// hugepage size.
    pub size: u64,
    /// Hugepage policy.
    pub hugepages: HugePages,
    /// Pre-fault every page at creation (`MAP_POPULATE`).
    pub populate: bool,
    /// memfd name, shown in `/proc/<pid>/fd` (at most 249 bytes, no NUL).
    pub name: String,
}

impl ArenaOptions {
    /// `size` bytes, hugepages if available, pre-faulted, named
    /// `granary-arena`.
    pub fn new(size: u64) -> ArenaOptions {
        ArenaOptions {
            size,
            hugepages: HugePages::Try,
            populate: true,
            name: "granary-arena".into(),
        }
    }
}

/// Why an arena operation failed.
#[derive(Debug)]
pub enum ArenaError {
    /// A system call failed.
    Os {
        /// The operation (`memfd_create`, `ftruncate`, `mmap`, ...).
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Hugepages were required but could not be used; the text says why and
    /// how to reserve them.
    HugePagesRequired(String),
    /// The arena fd's size is not the size the handshake announced.
    SizeMismatch {
        /// Size announced.
        expected: u64,
        /// Size of the file.
        actual: u64,
    },
    /// The arena fd lacks the seals a loader requires.
    NotSealed {
        /// The seals found (`F_GET_SEALS`).
        seals: i32,
    },
    /// A range lies outside the arena (or its end overflows).
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Arena size.
        size: u64,
    },
    /// The size is zero or too large for this machine's address space.
    InvalidSize,
    /// The start-up self-check found a way to write through the descriptor
    /// loaders get (see [`Arena::check_loader_access`]).
    LoaderCanWrite(&'static str),
}

impl ArenaError {
    fn os(op: &'static str, e: Errno) -> ArenaError {
        ArenaError::Os {
            op,
            source: io::Error::from_raw_os_error(e as i32),
        }
    }
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::Os { op, source } => write!(f, "arena {op} failed: {source}"),
            ArenaError::HugePagesRequired(why) => {
                write!(f, "hugepages are required for the arena but unavailable: {why}")
            }
            ArenaError::SizeMismatch { expected, actual } => write!(
                f,
                "arena fd is {actual} bytes, the agent announced {expected}"
            ),
            ArenaError::NotSealed { seals } => write!(
                f,
                "arena fd is not sealed against shrink, grow and future writes (seals {seals:#x}); the agent must seal it before sending"
            ),
            ArenaError::OutOfBounds { offset, len, size } => write!(
                f,
                "arena range offset {offset} length {len} lies outside 0..{size}"
            ),
            ArenaError::InvalidSize => {
                f.write_str("arena size is zero or too large for this address space")
            }
            ArenaError::LoaderCanWrite(how) => write!(
                f,
                "the arena descriptor loaders get allows {how}: refusing to share the arena"
            ),
        }
    }
}

impl std::error::Error for ArenaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArenaError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The hugepage size the kernel uses for `MFD_HUGETLB` (the `Hugepagesize`
/// line of `/proc/meminfo`), if known.
pub fn hugepage_size() -> Option<u64> {
    meminfo_value("Hugepagesize:")?.checked_mul(1024)
}

/// Free hugepages of the default size (`HugePages_Free` in `/proc/meminfo`).
pub fn hugepages_free() -> Option<u64> {
    meminfo_value("HugePages_Free:")
}

fn meminfo_value(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// Checks that `offset..offset+len` lies inside `size` bytes.
/// CRC-32C (Castagnoli) of `bytes`: the checksum the agent records for a
/// sample and a loader checks. `crc_fast` picks its fastest kernel at run
/// time (VPCLMULQDQ/AVX-512 or PCLMULQDQ folding on x86-64); the value is
/// the crc32c crate's, which the peers and the CQL source use.
fn crc32c_of(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

fn check_range(offset: u64, len: usize, size: u64) -> Result<usize, ArenaError> {
    let len64 = u64::try_from(len).unwrap_or(u64::MAX);
    let oob = ArenaError::OutOfBounds {
        offset,
        len: len64,
        size,
    };
    match offset.checked_add(len64) {
        Some(end) if end <= size => usize::try_from(offset).map_err(|_| oob),
        _ => Err(oob),
    }
}

/// Copies `len` bytes at `offset` out of `region` (of `size` bytes).
fn copy_out(region: &Region, size: u64, offset: u64, len: usize) -> Result<Vec<u8>, ArenaError> {
    let start = check_range(offset, len, size)?;
    let mut out = vec![0u8; len];
    let src = region.as_ptr().wrapping_add(start);
    // SAFETY: `src..src+len` lies inside the region (start + len <= size ==
    // region.len(), checked above), which stays mapped while borrowed;
    // `out` is a distinct, freshly allocated buffer of len bytes. The source
    // may change concurrently (another mapping); we only copy bytes, never
    // form a reference to them.
    unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
    Ok(out)
}

/// Takes an exclusive `flock(2)` on `fd`'s open file description (held
/// until every descriptor of it is closed: the process's exit, whatever
/// kills it), or fails with `EWOULDBLOCK` when another holds one.
fn lock_exclusive(fd: BorrowedFd<'_>) -> Result<(), ArenaError> {
    // SAFETY: plain syscall on a live descriptor; no memory is passed.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    Err(ArenaError::Os {
        op: "flock (another agent holds this arena file)",
        source: io::Error::last_os_error(),
    })
}

/// The agent's side of the arena: writable, owns the memfd.
#[derive(Debug)]
pub struct Arena {
    fd: Option<OwnedFd>,
    region: Arc<Region>,
    size: u64,
    hugepage: bool,
    fallback_reason: Option<String>,
    /// A named file that outlives the agent (a warm restart's arena), not a
    /// sealed memfd.
    persistent: bool,
}

impl Arena {
    /// Creates, maps and seals an arena.
    ///
    /// With [`HugePages::Try`], any failure of the hugepage path (typically
    /// `ENOMEM` at mmap because no hugepages are reserved) falls back to
    /// normal pages and records why in [`Arena::fallback_reason`]. With
    /// [`HugePages::Required`] the same failure is
    /// [`ArenaError::HugePagesRequired`], whose text says how to reserve
    /// hugepages.
    pub fn create(opts: &ArenaOptions) -> Result<Arena, ArenaError> {
        if opts.size == 0 {
            return Err(ArenaError::InvalidSize);
        }
        match opts.hugepages {
            HugePages::Off => Self::create_normal(opts, None),
            HugePages::Try => match Self::create_huge(opts) {
                Ok(a) => Ok(a),
                Err(why) => {
                    Self::create_normal(opts, Some(format!("{why}; using normal pages instead")))
                }
            },
            HugePages::Required => Self::create_huge(opts).map_err(ArenaError::HugePagesRequired),
        }
    }

    fn create_normal(opts: &ArenaOptions, fallback: Option<String>) -> Result<Arena, ArenaError> {
        let size = opts
            .size
            .checked_next_multiple_of(ARENA_ALIGN)
            .ok_or(ArenaError::InvalidSize)?;
        let mut arena = Self::build(opts, size, false)?;
        arena.fallback_reason = fallback;
        Ok(arena)
    }

    /// The hugepage path; the error is a human-readable reason.
    fn create_huge(opts: &ArenaOptions) -> Result<Arena, String> {
        let hint = |pages: u64| {
            format!(
                "reserve at least {pages} more hugepages as root, e.g. `echo {pages} > {NR_HUGEPAGES_PATH}` (plus what other users need), or set vm.nr_hugepages in /etc/sysctl.d"
            )
        };
        let Some(hp) = hugepage_size().filter(|&s| s > 0) else {
            return Err(format!(
                "the kernel reports no hugepage size in /proc/meminfo; {}",
                hint(1)
            ));
        };
        let Some(size) = opts.size.checked_next_multiple_of(hp) else {
            return Err(format!(
                "arena size {} overflows when rounded to hugepages",
                opts.size
            ));
        };
        let pages = size / hp;
        Self::build(opts, size, true).map_err(|e| {
            let free = hugepages_free()
                .map(|f| format!("{f} free"))
                .unwrap_or_else(|| "free count unknown".into());
            format!(
                "a {} hugetlb arena ({pages} pages of {}, {free}) could not be set up: {e}; {}",
                mib(size),
                mib(hp),
                hint(pages)
            )
        })
    }

    fn build(opts: &ArenaOptions, size: u64, huge: bool) -> Result<Arena, ArenaError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or(ArenaError::InvalidSize)?;
        let off = libc::off_t::try_from(size).map_err(|_| ArenaError::InvalidSize)?;
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        if huge {
            flags |= MFdFlags::MFD_HUGETLB;
        }
        let fd = memfd_create(opts.name.as_str(), flags)
            .map_err(|e| ArenaError::os("memfd_create", e))?;
        nix::unistd::ftruncate(&fd, off).map_err(|e| ArenaError::os("ftruncate", e))?;
        let region = Region::map_shared_rw(fd.as_fd(), len, opts.populate)
            .map_err(|source| ArenaError::Os { op: "mmap", source })?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(REQUIRED_SEALS | SealFlag::F_SEAL_SEAL),
        )
        .map_err(|e| ArenaError::os("F_ADD_SEALS", e))?;
        // Read-only for everyone: a loader cannot re-open its read-only
        // descriptor for writing through /proc/self/fd (the agent's own
        // mapping and descriptor keep their access).
        fchmod(&fd, Mode::S_IRUSR).map_err(|e| ArenaError::os("fchmod", e))?;
        Ok(Arena {
            fd: Some(fd),
            region: Arc::new(region),
            size,
            hugepage: huge,
            fallback_reason: None,
            persistent: false,
        })
    }

    /// Creates and maps the named arena file at `path` (on tmpfs, or on
    /// hugetlbfs when `huge`), which outlives the agent so that a restarted
    /// agent finds its samples. When a file of exactly the arena's size,
    /// owned by this user and not a link, was there (the previous agent's),
    /// it is returned mapped read-only beside the new arena, whose name it
    /// gave up: loaders may still map it (batches on loan, batches published
    /// before that agent died), so its bytes never change; the caller
    /// copies the samples it wants ([`copy_from`](Self::copy_from)) and
    /// drops it. Any other file at `path` is removed.
    ///
    /// The file is mode 0400 and owned by the agent's user: only the agent
    /// has it open for writing, and holds an exclusive `flock` on it for its
    /// life (another agent is refused). Unlike a memfd it cannot be sealed,
    /// so a process of the agent's own user (which may `chmod` it) or a
    /// privileged one could open it for writing; see
    /// [`check_loader_access`](Self::check_loader_access). `opts.size` must
    /// already be a multiple of the page size (the hugepage size when
    /// `huge`); `opts.hugepages` and `opts.name` are not used.
    pub fn persistent(
        path: &std::path::Path,
        opts: &ArenaOptions,
        huge: bool,
    ) -> Result<(Arena, Option<ArenaView>), ArenaError> {
        let size = opts.size;
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0 && l <= isize::MAX as usize)
            .ok_or(ArenaError::InvalidSize)?;
        let off = libc::off_t::try_from(size).map_err(|_| ArenaError::InvalidSize)?;
        // One agent per file: a live agent holds its file locked (until it
        // exits, however it exits); another one must neither share nor
        // replace it.
        let mut previous = None;
        if let Ok(existing) = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            lock_exclusive(existing.as_fd())?;
            // The previous agent's arena, read-only: loaders may still map
            // it (batches on loan, batches published before it died), so its
            // bytes must not change; a new file takes its name.
            let st = fstat(&existing).map_err(|e| ArenaError::os("fstat", e))?;
            let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
            if regular
                && st.st_uid == nix::unistd::geteuid().as_raw()
                && u64::try_from(st.st_size).ok() == Some(size)
            {
                if let Ok(r) = Region::map_shared_ro(existing.as_fd(), len, false) {
                    previous = Some(ArenaView {
                        region: Arc::new(r),
                        size,
                    });
                }
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ArenaError::Os {
                    op: "unlink",
                    source,
                })
            }
        }
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR,
        )
        .map_err(|e| ArenaError::os("open", e))?;
        if let Err(e) = nix::unistd::ftruncate(&fd, off) {
            let _ = std::fs::remove_file(path);
            return Err(ArenaError::os("ftruncate", e));
        }
        lock_exclusive(fd.as_fd())?;
        let region = match Region::map_shared_rw(fd.as_fd(), len, opts.populate) {
            Ok(r) => r,
            Err(source) => {
                let _ = std::fs::remove_file(path);
                return Err(ArenaError::Os { op: "mmap", source });
            }
        };
        Ok((
            Arena {
                fd: Some(fd),
                region: Arc::new(region),
                size,
                hugepage: huge,
                fallback_reason: None,
                persistent: true,
            },
            previous,
        ))
    }

    /// Copies `len` bytes at `offset` of `from` (the previous agent's
    /// arena) to the same place in this one.
    pub fn copy_from(&self, from: &ArenaView, offset: u64, len: usize) -> Result<(), ArenaError> {
        let start = check_range(offset, len, self.size)?;
        check_range(offset, len, from.size)?;
        let src = from.region.as_ptr().wrapping_add(start);
        let dst = self.region.as_ptr().wrapping_add(start);
        // SAFETY: `start..start+len` lies inside both regions (checked
        // above), which stay mapped while borrowed; this arena's region is
        // writable; they are two distinct mappings of two distinct files, so
        // the ranges do not overlap; only bytes are copied, no reference to
        // shared memory is formed.
        unsafe { std::ptr::copy_nonoverlapping(src.cast_const(), dst, len) };
        Ok(())
    }

    /// Whether this arena is a named file that outlives the agent
    /// ([`persistent`](Self::persistent)) rather than a sealed memfd.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// A heap-backed arena of `size` bytes (zeroed, no fd), so that logic
    /// over the arena runs under Miri.
    pub fn heap(size: u64) -> Result<Arena, ArenaError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0 && l <= isize::MAX as usize - crate::region::HEAP_ALIGN)
            .ok_or(ArenaError::InvalidSize)?;
        Ok(Arena {
            fd: None,
            region: Arc::new(Region::heap(len)),
            size,
            hugepage: false,
            fallback_reason: None,
            persistent: false,
        })
    }

    /// Size in bytes (after rounding).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the arena lives on hugepages.
    pub fn is_hugepage(&self) -> bool {
        self.hugepage
    }

    /// Why [`HugePages::Try`] fell back to normal pages, if it did. The agent
    /// logs this loudly.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// The agent's writable mapping.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The memfd (read-write, sealed); `None` for a heap arena.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// A read-only, close-on-exec re-open of the memfd
    /// (`/proc/self/fd/N`): the fd sent to loaders. Fails with `Unsupported`
    /// for a heap arena.
    pub fn loader_fd(&self) -> io::Result<OwnedFd> {
        let fd = self
            .fd
            .as_ref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "a heap arena has no fd"))?;
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        nix::fcntl::open(
            path.as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
    }

    /// The start-up self-check: everything a loader holding the descriptor
    /// of [`loader_fd`](Self::loader_fd) could try in order to write into the
    /// arena must fail. The file's mode has no write bit; the descriptor
    /// cannot be mapped writable, written, nor have a hole punched in it;
    /// re-opening it for writing through `/proc/self/fd` is refused (a
    /// privileged process, which may re-open it anyway, still cannot map,
    /// write or punch through the new descriptor: the seals forbid it).
    /// Nothing to check for a heap arena.
    ///
    /// # Errors
    ///
    /// [`ArenaError::LoaderCanWrite`] naming the way that worked, or
    /// [`ArenaError::Os`] when the check itself could not run.
    pub fn check_loader_access(&self) -> Result<(), ArenaError> {
        if self.fd.is_none() {
            return Ok(());
        }
        let ro = self.loader_fd().map_err(|source| ArenaError::Os {
            op: "re-open read-only",
            source,
        })?;
        let st = fstat(&ro).map_err(|e| ArenaError::os("fstat", e))?;
        if st.st_mode & 0o222 != 0 {
            return Err(ArenaError::LoaderCanWrite("a mode with write bits"));
        }
        self.check_no_write_through(ro.as_fd())?;
        let path = format!("/proc/self/fd/{}", ro.as_raw_fd());
        match nix::fcntl::open(
            path.as_str(),
            OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Err(_) => Ok(()),
            // A persistent file has no seals: with CAP_DAC_OVERRIDE it can be
            // opened for writing, as any file of the agent's can (the
            // documented limit of a warm-restart arena); a loader without
            // the privilege cannot.
            Ok(_) if self.persistent && nix::unistd::geteuid().is_root() => Ok(()),
            // Only with CAP_DAC_OVERRIDE: the seals must hold.
            Ok(rw) if nix::unistd::geteuid().is_root() => self.check_no_write_through(rw.as_fd()),
            Ok(_) => Err(ArenaError::LoaderCanWrite(
                "re-opening for writing through /proc/self/fd",
            )),
        }
    }

    /// Mapping `fd` writable, writing through it and punching a hole in it
    /// must all fail.
    fn check_no_write_through(&self, fd: BorrowedFd<'_>) -> Result<(), ArenaError> {
        let len = usize::try_from(self.size).map_err(|_| ArenaError::InvalidSize)?;
        if Region::map_shared_rw(fd, len, false).is_ok() {
            return Err(ArenaError::LoaderCanWrite("a writable mapping"));
        }
        // At start-up nothing is published yet: a write that got through
        // would only put a zero over a zero.
        if nix::sys::uio::pwrite(fd, &[0], 0).is_ok() {
            return Err(ArenaError::LoaderCanWrite("write(2)"));
        }
        let punch = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let page = libc::off_t::try_from(self.size.min(1 << 21)).unwrap_or(4096);
        if nix::fcntl::fallocate(fd, punch, 0, page).is_ok() {
            return Err(ArenaError::LoaderCanWrite("punching a hole"));
        }
        Ok(())
    }

    /// Copies `bytes` into the arena at `offset`.
    ///
    /// Loaders may be reading any part of the arena at any time; the caller
    /// publishes a range (through a ring) only after writing it, and never
    /// writes a range from two threads at once.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<(), ArenaError> {
        let start = check_range(offset, bytes.len(), self.size)?;
        let dst = self.region.as_ptr().wrapping_add(start);
        // SAFETY: `dst..dst+len` lies inside the region (start + len <= size
        // == region.len(), checked above), which is writable (the agent's RW
        // mapping or heap) and stays mapped while borrowed; `bytes` is
        // ordinary memory of this process, disjoint from the region. Nobody
        // holds references into the region (see the module docs), only raw
        // pointers.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Copies `len` bytes out of the arena at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, ArenaError> {
        copy_out(&self.region, self.size, offset, len)
    }

    /// Writes a sample table (the [`SampleEntry`] array a batch descriptor
    /// points at) at `offset`, in the layout loaders validate with
    /// [`crate::validate::copy_sample_table`].
    pub fn write_sample_table(
        &self,
        offset: u64,
        entries: &[crate::SampleEntry],
    ) -> Result<(), ArenaError> {
        let len = std::mem::size_of_val(entries);
        let start = check_range(offset, len, self.size)?;
        if start % std::mem::align_of::<crate::SampleEntry>() != 0 {
            return Err(ArenaError::OutOfBounds {
                offset,
                len: len as u64,
                size: self.size,
            });
        }
        let dst = self.region.as_ptr().wrapping_add(start);
        // SAFETY: `dst..dst+len` lies inside the writable region (checked
        // above) and stays mapped while `self` is borrowed; the entries are
        // plain `#[repr(C)]` integers without padding (layout assertions in
        // `layout`), so their bytes are initialised; the source is ordinary
        // memory of this process, disjoint from the region.
        unsafe { std::ptr::copy_nonoverlapping(entries.as_ptr().cast::<u8>(), dst, len) };
        Ok(())
    }

    /// CRC-32C of `len` bytes at `offset`, computed in place.
    ///
    /// The caller must know that nobody writes the range meanwhile (a read
    /// into it has completed and nothing else was lent it).
    pub fn crc32c(&self, offset: u64, len: usize) -> Result<u32, ArenaError> {
        let start = check_range(offset, len, self.size)?;
        let src = self.region.as_ptr().wrapping_add(start);
        // SAFETY: `src..src+len` lies inside the region (checked above),
        // which stays mapped while `self` is borrowed; loaders map it
        // read-only and the caller guarantees no write of this range by
        // the agent during the call, so the shared slice is not mutated
        // while it lives.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast_const(), len) };
        Ok(crc32c_of(bytes))
    }

    /// A handle on `len` bytes at `offset` that keeps the mapping alive, for
    /// a read to land in.
    pub fn slice(&self, offset: u64, len: usize) -> Result<ArenaSlice, ArenaError> {
        check_range(offset, len, self.size)?;
        Ok(ArenaSlice {
            region: Arc::clone(&self.region),
            offset: offset as usize,
            len,
        })
    }
}

/// A range of the arena that a read writes into: it holds the mapping, so
/// the memory cannot be unmapped while any read still owns one. A source
/// that cannot be sure its reads have finished leaks its slices (the
/// mapping stays) rather than dropping them.
#[derive(Debug, Clone)]
pub struct ArenaSlice {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl ArenaSlice {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset in the arena.
    pub fn offset(&self) -> u64 {
        self.offset as u64
    }

    /// The first byte, for the kernel to write into (io_uring). Valid for
    /// `len()` bytes while this slice lives.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.region.as_ptr().wrapping_add(self.offset)
    }

    /// Copies `bytes` to the start of the slice; returns how many were
    /// copied (at most `len()`).
    pub fn copy_from(&self, bytes: &[u8]) -> usize {
        self.copy_at(0, bytes)
    }

    /// Copies `bytes` to `at..` of the slice; returns how many were copied
    /// (at most `len() - at`; none when `at` is past the end).
    pub fn copy_at(&self, at: usize, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.len.saturating_sub(at));
        if n == 0 {
            return 0;
        }
        // SAFETY: `at + n <= len` (above) and `offset + len <= region.len()`
        // (checked when the slice was made); the region stays mapped while
        // `self.region` is held; the engine lends each range to one read
        // at a time, so nothing else writes it; the source buffer is
        // disjoint ordinary memory.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.as_mut_ptr().wrapping_add(at), n);
        }
        n
    }

    /// Copies the bytes at `at..` of the slice into `dst` (as many as fit,
    /// at most `len() - at`); returns how many were copied. The holder must
    /// know that nothing writes the range meanwhile (it is pinned).
    pub fn copy_to(&self, at: usize, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len.saturating_sub(at));
        if n == 0 {
            return 0;
        }
        // SAFETY: `at + n <= len` (above) and `offset + len <= region.len()`
        // (checked when the slice was made); the region stays mapped while
        // `self.region` is held; the holder keeps writers off the range; the
        // destination is disjoint ordinary memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_mut_ptr().wrapping_add(at).cast_const(),
                dst.as_mut_ptr(),
                n,
            );
        }
        n
    }

    /// Runs `f` over the slice's bytes in place (a block sealed straight
    /// from its extent). The holder must know that nothing writes the range
    /// meanwhile (it is pinned).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: `offset + len <= region.len()` (checked when the slice was
        // made) and the region stays mapped while `self.region` is held;
        // loaders map it read-only and the holder keeps writers off the
        // range for the call, so the shared borrow is not written under.
        let bytes = unsafe { std::slice::from_raw_parts(self.as_mut_ptr().cast_const(), self.len) };
        f(bytes)
    }

    /// Runs `f` over the slice's bytes in place, writable (a block opened
    /// straight into its reserved extent). The holder must be the range's
    /// only writer and reader in this process for the call: the engine
    /// lends a reserved extent to one transfer at a time, and loaders see
    /// it only once it is published.
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // SAFETY: `offset + len <= region.len()` (checked when the slice was
        // made) and the region stays mapped while `self.region` is held; the
        // region is writable by this process; the holder is the range's only
        // user in this process for the call (see above), so no other
        // reference to these bytes exists while the exclusive one lives.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) };
        f(bytes)
    }

    /// Copies `len` bytes at `at..` of the slice out (an RDMA write's
    /// source, as a fake NIC reads it).
    pub fn read_at(&self, at: usize, len: usize) -> Result<Vec<u8>, ArenaError> {
        let oob = ArenaError::OutOfBounds {
            offset: at as u64,
            len: len as u64,
            size: self.len as u64,
        };
        match at.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(oob),
        }
        copy_out(
            &self.region,
            self.region.len() as u64,
            (self.offset + at) as u64,
            len,
        )
    }

    /// CRC-32C of the whole slice, computed in place. The holder must know
    /// that nothing writes the range meanwhile (its read has completed).
    pub fn crc32c(&self) -> u32 {
        // SAFETY: `offset + len <= region.len()` (checked when the slice was
        // made) and the region stays mapped while `self.region` is held;
        // loaders map it read-only and the holder guarantees no write of
        // the range during the call.
        let bytes = unsafe { std::slice::from_raw_parts(self.as_mut_ptr().cast_const(), self.len) };
        crc32c_of(bytes)
    }
}

/// A loader's read-only mapping of the arena.
#[derive(Debug, Clone)]
pub struct ArenaView {
    region: Arc<Region>,
    size: u64,
}

impl ArenaView {
    /// Maps an arena fd received from the agent.
    ///
    /// The file must be exactly `expected_size` bytes (the size the
    /// handshake announced) and carry at least the shrink, grow and
    /// future-write seals, so that it can neither change size under the
    /// loader (no `SIGBUS`) nor be written through a new mapping.
    pub fn map(fd: OwnedFd, expected_size: u64) -> Result<ArenaView, ArenaError> {
        // Seals first: once shrink and grow are sealed the size checked
        // below cannot change any more.
        let seals = match fcntl(&fd, FcntlArg::F_GET_SEALS) {
            Ok(s) => s,
            // Not a sealable file (not a memfd): no seals at all.
            Err(Errno::EINVAL) => 0,
            Err(e) => return Err(ArenaError::os("F_GET_SEALS", e)),
        };
        let st = fstat(&fd).map_err(|e| ArenaError::os("fstat", e))?;
        if !SealFlag::from_bits_retain(seals).contains(REQUIRED_SEALS)
            && !Self::is_read_only_file(&fd, &st)
        {
            return Err(ArenaError::NotSealed { seals });
        }
        let actual = u64::try_from(st.st_size).unwrap_or(0);
        if actual != expected_size {
            return Err(ArenaError::SizeMismatch {
                expected: expected_size,
                actual,
            });
        }
        let len = usize::try_from(expected_size)
            .ok()
            .filter(|&l| l > 0 && l <= isize::MAX as usize)
            .ok_or(ArenaError::InvalidSize)?;
        let region = Region::map_shared_ro(fd.as_fd(), len, false)
            .map_err(|source| ArenaError::Os { op: "mmap", source })?;
        Ok(ArenaView {
            region: Arc::new(region),
            size: expected_size,
        })
    }

    /// A warm-restart arena ([`Arena::persistent`]): a regular file on
    /// tmpfs or hugetlbfs, of a mode without write bits, handed over
    /// read-only. It cannot be sealed; the loader trusts the file's owner
    /// (the agent's user) not to shrink it.
    fn is_read_only_file(fd: &OwnedFd, st: &libc::stat) -> bool {
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let read_only_fd =
            fcntl(fd, FcntlArg::F_GETFL).is_ok_and(|fl| fl & libc::O_ACCMODE == libc::O_RDONLY);
        let in_memory = nix::sys::statfs::fstatfs(fd).is_ok_and(|f| {
            let t = f.filesystem_type();
            t == nix::sys::statfs::TMPFS_MAGIC || t == nix::sys::statfs::HUGETLBFS_MAGIC
        });
        regular && read_only_fd && in_memory && st.st_mode & 0o222 == 0
    }

    /// A view of an existing region (heap arenas, tests).
    pub fn from_region(region: Arc<Region>) -> ArenaView {
        let size = u64::try_from(region.len()).unwrap_or(u64::MAX);
        ArenaView { region, size }
    }

    /// Base address of the mapping. Bytes behind it may change at any time;
    /// read them through raw pointers or [`ArenaView::read_at`].
    pub fn base(&self) -> *const u8 {
        self.region.as_ptr()
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The mapping.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Copies `len` bytes out of the arena at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, ArenaError> {
        copy_out(&self.region, self.size, offset, len)
    }

    /// CRC-32C of `len` bytes at `offset`, computed in place (no copy).
    ///
    /// The agent promises not to write the bytes of a sample whose batch is
    /// on loan; a loader checks lent samples only.
    pub fn crc32c(&self, offset: u64, len: usize) -> Result<u32, ArenaError> {
        let start = check_range(offset, len, self.size)?;
        let src = self.region.as_ptr().wrapping_add(start);
        // SAFETY: `src..src+len` lies inside the mapping (checked above),
        // which stays mapped while `self` is borrowed; the agent does not
        // write a lent sample's range, so the shared slice is not mutated
        // while it lives (and a byte changed anyway only makes the CRC
        // differ, which is what the check reports).
        let bytes = unsafe { std::slice::from_raw_parts(src.cast_const(), len) };
        Ok(crc32c_of(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_checksum_is_the_crc32c_crates() {
        // Every length up to a few folding blocks, odd alignments, and a
        // sample-sized buffer: one kernel per size class.
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..600).chain([4095, 4096, 4097, 65_536, 110_000, 299_993]) {
            for start in [0usize, 1, 7] {
                let b = &data[start..start + len];
                assert_eq!(crc32c_of(b), crc32c::crc32c(b), "{len} bytes at {start}");
            }
        }
        assert_eq!(crc32c_of(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn slice_copies_land_inside_the_slice_only() {
        let a = Arena::heap(64).unwrap();
        let s = a.slice(16, 8).unwrap();
        assert_eq!(s.copy_from(b"abc"), 3);
        assert_eq!(s.copy_at(5, b"xyz!"), 3, "clipped at the slice's end");
        assert_eq!(s.copy_at(9, b"q"), 0, "past the end");
        let all = a.read_at(0, 64).unwrap();
        assert_eq!(&all[16..24], b"abc\0\0xyz");
        assert!(all[..16].iter().chain(&all[24..]).all(|&b| b == 0));
        assert_eq!(s.read_at(5, 3).unwrap(), b"xyz");
        assert_eq!(s.read_at(0, 8).unwrap(), b"abc\0\0xyz");
        assert!(s.read_at(6, 3).is_err(), "past the slice's end");
        assert!(s.read_at(usize::MAX, 2).is_err(), "overflow");
    }

    #[test]
    fn heap_arena_reads_back_and_checks_bounds() {
        let a = Arena::heap(10_000).unwrap();
        assert_eq!(a.size(), 10_000);
        assert!(a.fd().is_none());
        assert!(!a.is_hugepage());
        assert!(a.fallback_reason().is_none());
        assert_eq!(
            a.loader_fd().unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        a.write_at(9_990, b"0123456789").unwrap();
        assert_eq!(a.read_at(9_990, 10).unwrap(), b"0123456789");
        assert_eq!(a.read_at(0, 4).unwrap(), [0, 0, 0, 0]);
        assert_eq!(a.read_at(10_000, 0).unwrap(), b"");

        let view = ArenaView::from_region(a.region().clone());
        assert_eq!(view.size(), 10_000);
        assert_eq!(view.base(), a.region().as_ptr().cast_const());
        assert_eq!(view.read_at(9_995, 5).unwrap(), b"56789");

        for (offset, len) in [
            (9_991, 10),
            (10_001, 0),
            (u64::MAX, 1),
            (u64::MAX - 3, 8),
            (1, usize::MAX),
        ] {
            let e = a.read_at(offset, len).unwrap_err();
            assert!(matches!(e, ArenaError::OutOfBounds { .. }), "{e}");
            let e = view.read_at(offset, len).unwrap_err();
            assert!(matches!(e, ArenaError::OutOfBounds { .. }), "{e}");
        }
        assert!(matches!(
            a.write_at(9_991, b"0123456789"),
            Err(ArenaError::OutOfBounds {
                offset: 9_991,
                len: 10,
                size: 10_000
            })
        ));
        assert!(matches!(
            a.write_at(u64::MAX, b"x"),
            Err(ArenaError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn invalid_sizes() {
        assert!(matches!(Arena::heap(0), Err(ArenaError::InvalidSize)));
        assert!(matches!(
            Arena::heap(u64::MAX),
            Err(ArenaError::InvalidSize)
        ));
        let mut o = ArenaOptions::new(0);
        o.hugepages = HugePages::Off;
        assert!(matches!(Arena::create(&o), Err(ArenaError::InvalidSize)));
        o.size = u64::MAX;
        assert!(matches!(Arena::create(&o), Err(ArenaError::InvalidSize)));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn normal_arena_is_sealed_and_rounded() {
        let mut o = ArenaOptions::new(5000);
        o.hugepages = HugePages::Off;
        o.populate = false;
        let a = Arena::create(&o).unwrap();
        assert_eq!(a.size(), 8192);
        assert!(!a.is_hugepage());
        assert!(a.fallback_reason().is_none());
        let seals =
            SealFlag::from_bits_retain(fcntl(a.fd().unwrap(), FcntlArg::F_GET_SEALS).unwrap());
        assert!(seals.contains(REQUIRED_SEALS | SealFlag::F_SEAL_SEAL));
        a.write_at(8000, b"tail").unwrap();
        let view = ArenaView::map(a.loader_fd().unwrap(), 8192).unwrap();
        assert_eq!(view.read_at(8000, 4).unwrap(), b"tail");
        assert!(!view.region().is_writable());
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn loaders_cannot_write_through_their_descriptor() {
        let mut o = ArenaOptions::new(1 << 20);
        o.hugepages = HugePages::Off;
        o.populate = false;
        let a = Arena::create(&o).unwrap();
        // Mode 0400: nobody may re-open the file for writing.
        let st = fstat(a.fd().unwrap()).unwrap();
        assert_eq!(st.st_mode & 0o777, 0o400);
        a.check_loader_access().unwrap();
        let ro = a.loader_fd().unwrap();
        assert!(Region::map_shared_rw(ro.as_fd(), 1 << 20, false).is_err());
        assert!(nix::sys::uio::pwrite(&ro, b"x", 0).is_err());
        let path = format!("/proc/self/fd/{}", ro.as_raw_fd());
        let reopened = nix::fcntl::open(path.as_str(), OFlag::O_RDWR, Mode::empty());
        if !nix::unistd::geteuid().is_root() {
            assert!(reopened.is_err(), "re-opened for writing");
        } else if let Ok(rw) = reopened {
            // Root bypasses the mode; the seals still refuse every write.
            assert!(Region::map_shared_rw(rw.as_fd(), 1 << 20, false).is_err());
            assert!(nix::sys::uio::pwrite(&rw, b"x", 0).is_err());
        }
        // The agent's own mapping still writes.
        a.write_at(0, b"ok").unwrap();
        assert_eq!(a.read_at(0, 2).unwrap(), b"ok");
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn view_rejects_unsealed_and_wrong_size() {
        let fd = memfd_create(
            "unsealed",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        let e = ArenaView::map(fd.try_clone().unwrap(), 4096).unwrap_err();
        assert!(matches!(e, ArenaError::NotSealed { seals: 0 }), "{e}");
        assert!(e.to_string().contains("must seal"));

        // Shrink and grow alone are not enough: future writes must be sealed too.
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .unwrap();
        let e = ArenaView::map(fd.try_clone().unwrap(), 4096).unwrap_err();
        assert!(matches!(e, ArenaError::NotSealed { .. }), "{e}");

        fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE)).unwrap();
        let e = ArenaView::map(fd.try_clone().unwrap(), 8192).unwrap_err();
        assert!(
            matches!(
                e,
                ArenaError::SizeMismatch {
                    expected: 8192,
                    actual: 4096
                }
            ),
            "{e}"
        );
        ArenaView::map(fd, 4096).unwrap();

        // A memfd created without MFD_ALLOW_SEALING carries F_SEAL_SEAL only.
        let fd = memfd_create("nosealing", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        let e = ArenaView::map(fd, 4096).unwrap_err();
        assert!(matches!(e, ArenaError::NotSealed { .. }), "{e}");

        // A regular file cannot be sealed at all.
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let e = ArenaView::map(OwnedFd::from(file), 4096).unwrap_err();
        assert!(matches!(e, ArenaError::NotSealed { .. }), "{e}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs tmpfs files and mmap")]
    fn persistent_arena_keeps_its_bytes_and_loaders_cannot_write() {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/granary-shm-test-{}-{}.arena",
            std::process::id(),
            nix::unistd::geteuid()
        ));
        struct Rm(std::path::PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let _rm = Rm(path.clone());
        let mut o = ArenaOptions::new(1 << 20);
        o.populate = false;
        let (a, previous) = Arena::persistent(&path, &o, false).unwrap();
        assert!(previous.is_none());
        assert!(a.is_persistent());
        let st = fstat(a.fd().unwrap()).unwrap();
        assert_eq!(st.st_mode & 0o777, 0o400);
        a.check_loader_access().unwrap();
        a.write_at(4096, b"warm").unwrap();
        let ro = a.loader_fd().unwrap();
        assert!(Region::map_shared_rw(ro.as_fd(), 1 << 20, false).is_err());
        assert!(nix::sys::uio::pwrite(&ro, b"x", 0).is_err());
        let view = ArenaView::map(ro, 1 << 20).unwrap();
        assert_eq!(view.read_at(4096, 4).unwrap(), b"warm");

        // While an agent holds the file, another may not take it.
        let busy = Arena::persistent(&path, &o, false).unwrap_err();
        assert!(busy.to_string().contains("another agent"), "{busy}");
        drop(a);

        // The next agent gets a new file and the previous one's bytes,
        // read-only; a loader still mapping the previous arena sees its
        // bytes unchanged whatever the new agent writes.
        let (b, previous) = Arena::persistent(&path, &o, false).unwrap();
        let previous = previous.expect("the previous arena");
        assert_eq!(previous.read_at(4096, 4).unwrap(), b"warm");
        assert_eq!(b.read_at(4096, 4).unwrap(), [0; 4]);
        b.copy_from(&previous, 4096, 4).unwrap();
        assert_eq!(b.read_at(4096, 4).unwrap(), b"warm");
        b.write_at(4096, b"new!").unwrap();
        assert_eq!(view.read_at(4096, 4).unwrap(), b"warm");
        assert_eq!(fstat(b.fd().unwrap()).unwrap().st_mode & 0o777, 0o400);
        drop((b, previous, view));

        // Another size: nothing to take over.
        o.size = 2 << 20;
        let (c, previous) = Arena::persistent(&path, &o, false).unwrap();
        assert!(previous.is_none());
        assert_eq!(c.read_at(4096, 4).unwrap(), [0; 4]);
        // A descriptor open for writing, or a file with write bits, is
        // refused by loaders.
        let e = ArenaView::map(c.fd().unwrap().try_clone_to_owned().unwrap(), 2 << 20).unwrap_err();
        assert!(matches!(e, ArenaError::NotSealed { .. }), "{e}");
    }

    #[test]
    fn error_messages() {
        let e = ArenaError::Os {
            op: "mmap",
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        assert!(e.to_string().starts_with("arena mmap failed: "));
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            ArenaError::SizeMismatch {
                expected: 1,
                actual: 2
            }
            .to_string(),
            "arena fd is 2 bytes, the agent announced 1"
        );
        assert!(ArenaError::InvalidSize.to_string().contains("zero"));
    }
}
