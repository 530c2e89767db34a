//! The io_uring submissions of the filesystem reader: the one place where
//! entries that point into memory are handed to the kernel.
//!
//! A [`Ring`] owns an io_uring whose entries belong to numbered request
//! *slots*. [`Ring::push`] takes one chain of [`Entry`]s for a slot,
//! described by what they point at — a path ([`Arc<CStr>`]), an arena range
//! ([`ArenaSlice`], which keeps the mapping alive), a timeout
//! ([`Arc<types::Timespec>`]) — builds the kernel's entries and keeps a
//! clone of each of those until the last completion of the chain has been
//! reaped ([`Ring::reap`]). The kernel thus never sees a pointer whose
//! memory could go away: dropping a ring with entries still in flight
//! leaks what they point at instead of freeing it.

use granary_shm::arena::ArenaSlice;
use io_uring::{opcode, squeue, types, IoUring, Parameters, Submitter};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::Arc;

/// The descriptor a step goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A normal descriptor the reader opened.
    Fd(RawFd),
    /// A direct-descriptor slot of the ring (`register_files_sparse`).
    Fixed(u32),
}

/// What one submission queue entry does, and what it points at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// `openat(AT_FDCWD, path, O_RDONLY)`: into the slot's own direct
    /// descriptor when `fixed`, else as a normal close-on-exec descriptor;
    /// with `O_DIRECT` too when `o_direct` (reads then bypass the page
    /// cache and must be aligned to the device's blocks).
    Open {
        path: &'a Arc<CStr>,
        fixed: bool,
        o_direct: bool,
    },
    /// Reads `len` bytes at `offset` of the file into `dest[at..at + len]`.
    Read {
        fd: Target,
        dest: &'a ArenaSlice,
        at: u32,
        len: u32,
        offset: u64,
    },
    /// Closes the descriptor.
    Close { fd: Target },
    /// `IORING_OP_LINK_TIMEOUT`: cancels the entry before it in the chain
    /// when `limit` expires.
    LinkTimeout { limit: &'a Arc<types::Timespec> },
    /// `statx(AT_FDCWD, path)` for the size and modification time, which
    /// come back in the completion's [`Cqe::stat`].
    Statx { path: &'a Arc<CStr> },
}

/// A file's size and modification time, as `statx` gave them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStat {
    pub(crate) size: u64,
    /// Seconds and nanoseconds since the epoch.
    pub(crate) mtime: (i64, u32),
}

/// One entry of a chain: its step, a 3-bit kind the completion carries
/// back, and its link flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub(crate) step: Step<'a>,
    pub(crate) kind: u8,
    pub(crate) flags: squeue::Flags,
}

/// One completion: the slot and kind of its entry, and the kernel's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cqe {
    pub(crate) slot: u32,
    pub(crate) kind: u8,
    pub(crate) result: i32,
    /// What a successful [`Step::Statx`] found.
    pub(crate) stat: Option<FileStat>,
}

/// The largest kind an entry may carry.
const MAX_KIND: u8 = 7;
/// Bits of `user_data` below the slot number.
const KIND_BITS: u32 = 3;

/// Why [`Ring::push`] did not queue a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The submission queue has no room for the whole chain: submit, then
    /// push again.
    Full,
    /// The slot does not exist, still has entries in flight, a kind is
    /// above 7, a chain has two `statx` steps, or a read does not fit its
    /// arena range.
    Invalid,
}

/// What a slot's entries in flight point at.
#[derive(Debug, Default)]
struct Pins {
    in_flight: u32,
    path: Option<Arc<CStr>>,
    dest: Option<ArenaSlice>,
    limit: Option<Arc<types::Timespec>>,
    /// The buffer a `statx` step writes, and the step's kind.
    stat: Option<(Box<libc::statx>, u8)>,
}

/// An io_uring whose entries' memory is held until their completions; see
/// the [module documentation](self).
pub(crate) struct Ring {
    ring: IoUring,
    pins: Vec<Pins>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("slots", &self.pins.len())
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// A ring of `entries` submission entries for `slots` request slots.
    pub fn new(entries: u32, slots: u32) -> io::Result<Ring> {
        Ok(Ring {
            ring: IoUring::new(entries)?,
            pins: (0..slots).map(|_| Pins::default()).collect(),
        })
    }

    /// The kernel's parameters of the ring (features).
    pub(crate) fn params(&self) -> &Parameters {
        self.ring.params()
    }

    /// Submits, waits and registers (probes, direct-descriptor slots).
    pub(crate) fn submitter(&self) -> Submitter<'_> {
        self.ring.submitter()
    }

    /// Whether entries are queued that the kernel has not been handed yet.
    pub(crate) fn has_unsubmitted(&mut self) -> bool {
        !self.ring.submission().is_empty()
    }

    /// Queues `chain` for `slot` (handed to the kernel on the next submit),
    /// whole or not at all. The slot must have nothing in flight.
    pub(crate) fn push(&mut self, slot: u32, chain: &[Entry<'_>]) -> Result<(), PushError> {
        let pins = self
            .pins
            .get_mut(slot as usize)
            .filter(|p| p.in_flight == 0)
            .ok_or(PushError::Invalid)?;
        let mut held = Pins::default();
        let mut entries = Vec::with_capacity(chain.len());
        for e in chain {
            if e.kind > MAX_KIND {
                return Err(PushError::Invalid);
            }
            let sqe = match e.step {
                Step::Open {
                    path,
                    fixed,
                    o_direct,
                } => {
                    let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr());
                    held.path = Some(Arc::clone(path));
                    let direct_io = if o_direct { libc::O_DIRECT } else { 0 };
                    if fixed {
                        let slot = types::DestinationSlot::try_from_slot_target(slot).ok();
                        open.file_index(slot)
                            .flags(libc::O_RDONLY | direct_io)
                            .build()
                    } else {
                        open.flags(libc::O_RDONLY | libc::O_CLOEXEC | direct_io)
                            .build()
                    }
                }
                Step::Read {
                    fd,
                    dest,
                    at,
                    len,
                    offset,
                } => {
                    let end = u64::from(at) + u64::from(len);
                    if end > dest.len() as u64 {
                        return Err(PushError::Invalid);
                    }
                    let ptr = dest.as_mut_ptr().wrapping_add(at as usize);
                    held.dest = Some(dest.clone());
                    match fd {
                        Target::Fd(fd) => opcode::Read::new(types::Fd(fd), ptr, len),
                        Target::Fixed(fd) => opcode::Read::new(types::Fixed(fd), ptr, len),
                    }
                    .offset(offset)
                    .build()
                }
                Step::Close { fd } => match fd {
                    Target::Fd(fd) => opcode::Close::new(types::Fd(fd)).build(),
                    Target::Fixed(fd) => opcode::Close::new(types::Fixed(fd)).build(),
                },
                Step::LinkTimeout { limit } => {
                    held.limit = Some(Arc::clone(limit));
                    opcode::LinkTimeout::new(Arc::as_ptr(limit)).build()
                }
                Step::Statx { path } => {
                    if held.stat.is_some() {
                        return Err(PushError::Invalid);
                    }
                    held.path = Some(Arc::clone(path));
                    let buf = held.stat.insert((Box::new(zeroed_statx()), e.kind));
                    let ptr: *mut libc::statx = &mut *buf.0;
                    opcode::Statx::new(
                        types::Fd(libc::AT_FDCWD),
                        path.as_ptr(),
                        ptr.cast::<types::statx>(),
                    )
                    .mask(libc::STATX_SIZE | libc::STATX_MTIME)
                    .build()
                }
            };
            entries.push(
                sqe.flags(e.flags)
                    .user_data((u64::from(slot) << KIND_BITS) | u64::from(e.kind)),
            );
        }
        // SAFETY: every pointer in `entries` comes from something `held`
        // owns: the path from an `Arc<CStr>`, the timeout from an
        // `Arc<Timespec>`, the `statx` buffer from a `Box` (its heap memory
        // does not move when `held` does), the read's destination from an `ArenaSlice`
        // (`as_mut_ptr` is valid for `len()` bytes while the slice lives;
        // `at + len` was checked against it). `held` becomes the slot's pins
        // below and is released only when the chain's last completion has
        // been reaped, or leaked when the ring is dropped before that; the
        // engine lends each arena range to one read at a time. Descriptors
        // are numbers, not memory.
        let pushed = unsafe { self.ring.submission().push_multiple(&entries) };
        pushed.map_err(|_| PushError::Full)?;
        held.in_flight = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        *pins = held;
        Ok(())
    }

    /// Appends every available completion to `out`, releasing what a
    /// slot's entries pointed at once the last of them has completed.
    pub(crate) fn reap(&mut self, out: &mut Vec<Cqe>) {
        for c in self.ring.completion() {
            let ud = c.user_data();
            let Ok(slot) = u32::try_from(ud >> KIND_BITS) else {
                continue;
            };
            let kind = (ud & u64::from(MAX_KIND)) as u8;
            let mut stat = None;
            if let Some(p) = self.pins.get_mut(slot as usize) {
                p.in_flight = p.in_flight.saturating_sub(1);
                // The kernel has finished writing the buffer once the
                // step's completion is here.
                if let Some((buf, k)) = &p.stat {
                    if *k == kind && c.result() >= 0 {
                        stat = Some(FileStat {
                            size: buf.stx_size,
                            mtime: (buf.stx_mtime.tv_sec, buf.stx_mtime.tv_nsec),
                        });
                    }
                }
                if p.in_flight == 0 {
                    *p = Pins::default();
                }
            }
            out.push(Cqe {
                slot,
                kind,
                result: c.result(),
                stat,
            });
        }
    }
}

/// A `statx` buffer for the kernel to fill.
fn zeroed_statx() -> libc::statx {
    // SAFETY: `libc::statx` is a plain C struct of integers (and reserved
    // integer arrays), for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

impl AsFd for Ring {
    /// The io_uring's descriptor: readable while completions are waiting.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.pins.iter().any(|p| p.in_flight > 0) {
            // The kernel may still write through entries in flight: keep
            // their memory (and the arena's mapping) for good.
            std::mem::forget(std::mem::take(&mut self.pins));
        }
    }
}
