//! The read engine of the filesystem source: io_uring reads of whole files (or
//! ranges of open files) straight into arena memory.
//!
//! A `UringReader` accepts `ReadRequest`s up to its queue depth, turns each
//! into open → read(s) → close on one io_uring, and hands back one
//! [`Completion`] per request, in whatever order the kernel finishes them.
//! When the kernel supports direct descriptors and linked files, the three
//! steps of a file read go to the kernel as one linked chain
//! (`IOSQE_IO_LINK`, the file living in a per-request direct-descriptor
//! slot); otherwise they are issued one after the other. Short reads continue
//! where they stopped, transient errors (`EINTR`, `EAGAIN`, `ECANCELED`) are
//! resubmitted a few times, and a file that ends early is an error naming the
//! path. Whether a failed read deserves another attempt is the engine's
//! retry policy's decision (`crate::retry`), on the error's
//! [`crate::source::FailureKind`].
//!
//! A request that names what the file should be (`expect`: its size and
//! modification time when it was catalogued) has a `statx` of the path
//! after its read, in the same chain (or as a step of its own when chains
//! are not linked): a file whose size or modification time differs fails
//! its request with a [`Changed`] error, so a file that grew, shrank or
//! was replaced since the catalog was made is never served as it is now.
//! (A kernel without `IORING_OP_STATX` reads without the check, said once
//! in the log.)
//!
//! A request may ask for `O_DIRECT` ([`ReadRequest::direct`]): the file is
//! opened with it and read in whole [`DIRECT_BLOCK`]s straight from the
//! device into the arena, bypassing the page cache (no copy, no cache
//! pages to reclaim). A short read continues from the block it stopped in.
//! A filesystem that refuses `O_DIRECT` (`EINVAL` at open, as ramfs and
//! some FUSE filesystems do) or a device whose blocks are larger than
//! `DIRECT_BLOCK` (`EINVAL` at an aligned read) gets that request read
//! again through the page cache, and every later request of the reader
//! too; the log says so once. A misaligned request (an offset or a
//! destination that is not a multiple of the block) falls back alone.
//!
//! A reader built `with_timeout` links an
//! `IORING_OP_LINK_TIMEOUT` to every open and every read it hands to the
//! kernel: a step that has not completed when the timeout expires is
//! cancelled, and its request fails with `ETIME` (not resubmitted), naming
//! the step and the file. A hung device or a pipe with no writer thus fails
//! one sample instead of holding a slot of the queue for ever.
//!
//! See `docs/fetcher.md`.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::source::queue::{IoCompletion, QueuedRequest};
pub(crate) use crate::sys::uring::FileStat;
use crate::sys::uring::{Cqe, Ring};
use granary_shm::arena::ArenaSlice;

mod op;
mod steps;
use io_uring::{opcode, squeue, types, Probe};

/// Largest queue depth a reader accepts (the ring holds up to eight entries
/// per request, and the kernel caps a ring at 32768 entries; chains that do
/// not fit wait for the next submission).
pub(crate) const MAX_QUEUE_DEPTH: u32 = 8192;

/// The unit of `O_DIRECT` reads: their file offsets, lengths and memory
/// addresses are multiples of it. 4 KiB is at least the logical block size
/// of every disk in common use (512 or 4096 bytes), and the arena's extents
/// are aligned to it.
pub(crate) const DIRECT_BLOCK: u32 = 4096;

/// How many times one request is resubmitted after `EINTR`, `EAGAIN` or
/// `ECANCELED` before the error is reported.
const TRANSIENT_RESUBMITS: u32 = 8;

/// How long dropping a reader waits for its outstanding reads.
const DROP_DRAIN_LIMIT: Duration = Duration::from_secs(30);

const KIND_OPEN: u8 = 0;
const KIND_READ: u8 = 1;
const KIND_CLOSE: u8 = 2;
const KIND_TIMEOUT: u8 = 3;
const KIND_STATX: u8 = 4;

/// One read: `len` bytes at `offset` of a file into the start of `dest`.
#[derive(Debug)]
pub(crate) struct ReadRequest {
    /// The caller's identifier, returned in the [`Completion`].
    pub tag: u64,
    /// The file, opened read-only for this request and closed when it is
    /// done. Relative paths resolve against the working directory.
    pub path: CString,
    /// Where in the file the read starts.
    pub offset: u64,
    /// How many bytes to read; the file must hold them all.
    pub len: u32,
    /// Destination: the arena range reserved for this read, at least `len`
    /// bytes; the reader holds it (and so the mapping) until the read's
    /// completion has been returned.
    pub dest: ArenaSlice,
    /// What the file must still be once read (size and modification time),
    /// if anything: checked with a `statx` after the read.
    pub expect: Option<FileStat>,
    /// Read with `O_DIRECT`, in whole [`DIRECT_BLOCK`]s: `dest` must then
    /// hold `len` rounded up to the block (a shorter one is read through
    /// the page cache), and should start at a multiple of the block, as
    /// should `offset` (else the kernel refuses and the request is read
    /// through the page cache). The bytes of the last block past the end
    /// of the file are left as the device gives them.
    pub direct: bool,
}

/// The outcome of one `ReadRequest`: the bytes read (always the
/// requested length), or an error carrying a `ReadError` naming the file
/// (see `errno`).
pub type Completion = IoCompletion;

pub use crate::source::queue::Full;

impl QueuedRequest for ReadRequest {
    const QUEUE: &'static str = "read";
    fn tag(&self) -> u64 {
        self.tag
    }
}

/// The error inside a failed [`Completion`]: which step failed on which file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadError {
    /// `"open"` or `"read"`.
    pub op: &'static str,
    /// The file's path.
    pub target: String,
    /// The OS error number, when the kernel reported one.
    pub errno: Option<i32>,
    /// For a file that ended early: bytes read before end of file, and the
    /// number requested.
    pub short: Option<(u64, u64)>,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.errno, self.short) {
            (_, Some((got, want))) => write!(
                f,
                "{} {}: file ended after {got} of {want} bytes (it shrank or was replaced)",
                self.op, self.target
            ),
            (Some(e), None) => write!(
                f,
                "{} {}: {}",
                self.op,
                self.target,
                io::Error::from_raw_os_error(e)
            ),
            (None, None) => write!(f, "{} {}: failed", self.op, self.target),
        }
    }
}

impl std::error::Error for ReadError {}

impl ReadError {
    fn into_io(self) -> io::Error {
        let kind = match (self.errno, self.short) {
            (_, Some(_)) => io::ErrorKind::UnexpectedEof,
            (Some(e), None) => io::Error::from_raw_os_error(e).kind(),
            (None, None) => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }
}

/// The OS error number behind `err`: its raw OS error, or the `errno` of a
/// [`ReadError`] inside it.
pub(crate) fn errno(err: &io::Error) -> Option<i32> {
    err.raw_os_error().or_else(|| {
        err.get_ref()?
            .downcast_ref::<ReadError>()
            .and_then(|e| e.errno)
    })
}

/// Where a request's file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// Not open (or, in linked mode, only open inside a chain).
    Closed,
    /// Opened by the reader as a normal descriptor (sequential mode).
    Open(RawFd),
}

/// An accepted request and its progress.
#[derive(Debug)]
struct Op {
    tag: u64,
    path: Arc<CStr>,
    offset: u64,
    len: u32,
    dest: ArenaSlice,
    expect: Option<FileStat>,
    done: u32,
    file: FileState,
    /// CQEs still expected for the step or chain in flight.
    pending: u8,
    open_res: Option<i32>,
    read_res: Option<i32>,
    /// The `statx` of the step or chain in flight: what it found, or its
    /// (negative) result.
    stat_res: Option<Result<FileStat, i32>>,
    /// Whether the `statx` was handed to the kernel (unlinked mode, where
    /// it is a step of its own after the last read).
    stat_issued: bool,
    error: Option<io::Error>,
    resubmits: u32,
    /// Whether any step has been handed to the ring yet.
    issued: bool,
    /// Whether a linked timeout of the step or chain in flight expired.
    timed_out: bool,
    /// Whether the next open is with `O_DIRECT` (reads then go in whole
    /// blocks).
    direct: bool,
    /// Whether the file was opened with `O_DIRECT` (its reads are in whole
    /// blocks until it is reopened).
    opened_direct: bool,
    /// `O_DIRECT` was just refused (`EINVAL` at `"open"` or `"read"`); the
    /// request goes on through the page cache.
    refused: Option<&'static str>,
}

/// io_uring read engine; see the [module documentation](self).
///
/// Single-threaded: one owner submits and polls. Requests are handed to the
/// kernel in batches, on the next [`poll_completions`](Self::poll_completions).
pub(crate) struct UringReader {
    ring: Ring,
    ops: Vec<Option<Op>>,
    free: Vec<u32>,
    /// Requests that completed without reaching the kernel (bad input).
    ready: Vec<Completion>,
    /// Requests whose next step did not fit in the submission queue.
    deferred: Vec<u32>,
    cqes: Vec<Cqe>,
    linked: bool,
    /// Whether the kernel has `IORING_OP_STATX` (else `expect` is ignored).
    statx: bool,
    /// The limit linked to every open and read, if any (shared with the
    /// ring's entries in flight, which the kernel reads at submission).
    timeout: Option<(Duration, Arc<types::Timespec>)>,
    /// Whether requests asking for `O_DIRECT` get it: false once the
    /// filesystem or device has refused it.
    direct_io: bool,
    /// Requests whose `O_DIRECT` was refused, read through the page cache.
    direct_refusals: u64,
}

impl fmt::Debug for UringReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringReader")
            .field("queue_depth", &self.ops.len())
            .field("in_flight", &self.in_flight())
            .field("linked", &self.linked)
            .field("timeout", &self.timeout.is_some())
            .field("direct_io", &self.direct_io)
            .finish()
    }
}

impl AsFd for UringReader {
    /// The io_uring's descriptor: readable while completions are waiting.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

impl UringReader {
    /// A reader that keeps at most `queue_depth` requests in flight, using
    /// linked open → read → close chains when the kernel supports them.
    ///
    /// Fails when `queue_depth` is 0 or above [`MAX_QUEUE_DEPTH`], when
    /// io_uring is unavailable, or when the kernel lacks `OPENAT`, `READ`,
    /// `CLOSE` or timed waits (Linux 5.11).
    pub fn new(queue_depth: u32) -> io::Result<Self> {
        Self::with_linking(queue_depth, true)
    }

    /// Like [`new`](Self::new); with `allow_linking` false every request goes
    /// through open, read and close as separate completions even where the
    /// kernel could link them.
    pub(crate) fn with_linking(queue_depth: u32, allow_linking: bool) -> io::Result<Self> {
        if queue_depth == 0 || queue_depth > MAX_QUEUE_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue depth {queue_depth} is outside 1..={MAX_QUEUE_DEPTH}"),
            ));
        }
        // Room for every request's chain at once (five entries with
        // timeouts), within the kernel's cap of 32768 entries.
        let ring = Ring::new(
            (queue_depth * 8).next_power_of_two().min(32768),
            queue_depth,
        )?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without timed waits (IORING_FEAT_EXT_ARG, Linux 5.11)",
            ));
        }
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        let codes = [
            opcode::OpenAt::CODE,
            opcode::Read::CODE,
            opcode::Close::CODE,
            opcode::LinkTimeout::CODE,
        ];
        if !codes.iter().all(|&c| probe.is_supported(c)) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without OPENAT, READ, CLOSE or LINK_TIMEOUT",
            ));
        }
        // Linked chains need a direct-descriptor slot per request, and the
        // read must see the file its linked open installed.
        let linked = allow_linking
            && ring.params().is_feature_linked_file()
            && ring.submitter().register_files_sparse(queue_depth).is_ok();
        let statx = probe.is_supported(opcode::Statx::CODE);
        if !statx {
            warn_no_statx();
        }
        Ok(Self {
            ring,
            ops: (0..queue_depth).map(|_| None).collect(),
            free: (0..queue_depth).rev().collect(),
            ready: Vec::new(),
            deferred: Vec::new(),
            cqes: Vec::new(),
            linked,
            statx,
            timeout: None,
            direct_io: true,
            direct_refusals: 0,
        })
    }

    /// Limits every open and every read to `limit` (`None`: no limit) with a
    /// linked `IORING_OP_LINK_TIMEOUT`; a step still running at the limit is
    /// cancelled and its request fails with `ETIME`. Applies to requests
    /// submitted from now on.
    pub(crate) fn with_timeout(mut self, limit: Option<Duration>) -> Self {
        self.timeout = limit.map(|d| (d, Arc::new(types::Timespec::from(d))));
        self
    }

    /// The limit on each open and read, if any.
    #[cfg(test)]
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.as_ref().map(|(d, _)| *d)
    }

    /// Whether file reads go to the kernel as linked chains on direct
    /// descriptors (otherwise as three separate steps).
    #[cfg(test)]
    pub(crate) fn is_linked(&self) -> bool {
        self.linked
    }

    /// Whether requests asking for `O_DIRECT` still get it (false once the
    /// filesystem or device has refused it).
    #[cfg(test)]
    pub(crate) fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Requests whose `O_DIRECT` was refused (read through the page cache).
    #[cfg(test)]
    pub(crate) fn direct_refusals(&self) -> u64 {
        self.direct_refusals
    }

    /// The queue depth: the most requests in flight at once.
    pub fn capacity(&self) -> u32 {
        u32::try_from(self.ops.len()).unwrap_or(u32::MAX)
    }

    /// Requests accepted whose completion has not been returned yet.
    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.free.len() + self.ready.len()
    }

    /// Accepts `req`, or gives it back in [`Full`] when `queue_depth`
    /// requests are in flight. Accepted requests reach the kernel in one
    /// batch on the next [`poll_completions`](Self::poll_completions). Bad
    /// requests (a `dest` shorter than `len`, a range past `u64::MAX`)
    /// complete with an `InvalidInput` error.
    ///
    /// The reader holds `req.dest` until the request's [`Completion`] has
    /// been returned; dropping the reader waits for outstanding reads (up to
    /// 30 seconds) and leaks the ranges of those that did not finish, so the
    /// kernel never writes into memory that was unmapped.
    pub fn submit(&mut self, req: ReadRequest) -> Result<(), Full<ReadRequest>> {
        if self.in_flight() >= self.ops.len() {
            return Err(Full(req));
        }
        let bad = req.len as usize > req.dest.len()
            || req.offset.checked_add(u64::from(req.len)).is_none();
        if bad {
            self.ready.push(Completion {
                tag: req.tag,
                result: Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "read request with a destination shorter than its length or a range past u64::MAX",
                )),
            });
            return Ok(());
        }
        let Some(idx) = self.free.pop() else {
            return Err(Full(req));
        };
        let blocks = u64::from(req.len).next_multiple_of(u64::from(DIRECT_BLOCK));
        let direct = req.direct && self.direct_io && blocks <= req.dest.len() as u64;
        let op = Op {
            tag: req.tag,
            path: Arc::from(req.path),
            offset: req.offset,
            len: req.len,
            dest: req.dest,
            expect: req.expect.filter(|_| self.statx),
            done: 0,
            file: FileState::Closed,
            pending: 0,
            open_res: None,
            read_res: None,
            stat_res: None,
            stat_issued: false,
            error: None,
            resubmits: 0,
            issued: false,
            timed_out: false,
            direct,
            opened_direct: false,
            refused: None,
        };
        if let Some(slot) = self.ops.get_mut(idx as usize) {
            *slot = Some(op);
        }
        let mut sink = Vec::new();
        self.advance(idx, &mut sink);
        self.ready.append(&mut sink);
        Ok(())
    }

    /// Accepts request `tag` and completes it at once with `err`, without
    /// reading (a request the caller could not express, such as a file of
    /// 4 GiB or more); gives the tag back in [`Full`] when `queue_depth`
    /// requests are in flight.
    pub(crate) fn reject(&mut self, tag: u64, err: io::Error) -> Result<(), Full<u64>> {
        if self.in_flight() >= self.ops.len() {
            return Err(Full(tag));
        }
        self.ready.push(Completion {
            tag,
            result: Err(err),
        });
        Ok(())
    }

    /// Hands queued requests to the kernel and appends finished requests to
    /// `out`; returns how many it appended. With `wait` `None` it does not
    /// block; with `Some(d)` it waits until at least one request finishes or
    /// `d` has passed, whichever is first.
    ///
    /// Errors are failures of the ring itself, not of reads (those come back
    /// in the completions).
    pub fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let start = out.len();
        out.append(&mut self.ready);
        let deadline = wait.map(|d| Instant::now() + d);
        loop {
            for idx in std::mem::take(&mut self.deferred) {
                self.advance(idx, out);
            }
            let live = self.ops.len() > self.free.len();
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let block = match remaining {
                Some(r) => out.len() == start && live && !r.is_zero(),
                None => false,
            };
            let entered = if block {
                let ts = types::Timespec::from(remaining.unwrap_or_default());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            } else if self.ring.has_unsubmitted() {
                self.ring.submitter().submit()
            } else {
                Ok(0)
            };
            if let Err(e) = entered {
                match e.raw_os_error() {
                    Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                    _ => return Err(e),
                }
            }
            self.reap(out);
            let expired = remaining.is_none_or(|r| r.is_zero());
            if out.len() > start || expired || self.in_flight() == 0 {
                // Steps queued while reaping (continuations, closes, next
                // chains) go to the kernel now rather than on the next poll.
                if self.ring.has_unsubmitted() {
                    if let Err(e) = self.ring.submitter().submit() {
                        if !matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) {
                            return Err(e);
                        }
                    }
                }
                return Ok(out.len() - start);
            }
        }
    }
}

/// Says once per process that files are read without checking them
/// against their catalog.
fn warn_no_statx() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "io_uring has no STATX (Linux 5.6): files are read without checking their size and \
             modification time against the catalog"
        );
    });
}

impl Drop for UringReader {
    /// Waits (up to 30 seconds) for outstanding reads, so that none lands in
    /// memory the caller may reuse once the reader is gone.
    fn drop(&mut self) {
        let deadline = Instant::now() + DROP_DRAIN_LIMIT;
        let mut sink = Vec::new();
        while self.in_flight() > 0 && Instant::now() < deadline {
            if self
                .poll_completions(Some(Duration::from_millis(100)), &mut sink)
                .is_err()
            {
                break;
            }
            sink.clear();
        }
    }
}

#[cfg(test)]
mod tests;
