//! The read engine of the filesystem source: io_uring reads of whole files (or
//! ranges of open files) straight into arena memory.
//!
//! A [`UringReader`] accepts [`ReadRequest`]s up to its queue depth, turns each
//! into open → read(s) → close on one io_uring, and hands back one
//! [`Completion`] per request, in whatever order the kernel finishes them.
//! When the kernel supports direct descriptors and linked files, the three
//! steps of a file read go to the kernel as one linked chain
//! (`IOSQE_IO_LINK`, the file living in a per-request direct-descriptor
//! slot); otherwise they are issued one after the other. Short reads continue
//! where they stopped, transient errors (`EINTR`, `EAGAIN`, `ECANCELED`) are
//! resubmitted a few times, and a file that ends early is an error naming the
//! path. [`ReadRetry`] is the policy the fetcher applies on top: which errors
//! deserve another attempt, and when.
//!
//! A reader built [`with_timeout`](UringReader::with_timeout) links an
//! `IORING_OP_LINK_TIMEOUT` to every open and every read it hands to the
//! kernel: a step that has not completed when the timeout expires is
//! cancelled, and its request fails with `ETIME` (not resubmitted), naming
//! the step and the file. A hung device or a pipe with no writer thus fails
//! one sample instead of holding a slot of the queue for ever.
//!
//! See `docs/fetcher.md`.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring, Probe};

/// Largest queue depth a reader accepts (the ring holds up to eight entries
/// per request, and the kernel caps a ring at 32768 entries; chains that do
/// not fit wait for the next submission).
pub const MAX_QUEUE_DEPTH: u32 = 8192;

/// How many times one request is resubmitted after `EINTR`, `EAGAIN` or
/// `ECANCELED` before the error is reported.
const TRANSIENT_RESUBMITS: u32 = 8;

/// How long dropping a reader waits for its outstanding reads.
const DROP_DRAIN_LIMIT: Duration = Duration::from_secs(30);

const KIND_OPEN: u64 = 0;
const KIND_READ: u64 = 1;
const KIND_CLOSE: u64 = 2;
const KIND_TIMEOUT: u64 = 3;

/// One read: `len` bytes at `offset` of a file into `dest`.
#[derive(Debug)]
pub struct ReadRequest {
    /// The caller's identifier, returned in the [`Completion`].
    pub tag: u64,
    /// The file, opened read-only for this request and closed when it is
    /// done. Relative paths resolve against the working directory.
    pub path: CString,
    /// Where in the file the read starts.
    pub offset: u64,
    /// How many bytes to read; the file must hold them all.
    pub len: u32,
    /// Destination: memory the caller reserved for this read (an arena
    /// extent). See [`UringReader::submit`] for what must hold.
    pub dest: *mut u8,
}

/// The outcome of one [`ReadRequest`].
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The number of bytes read (always the requested length), or the error.
    /// Errors carry a [`ReadError`] naming the file; see [`errno`].
    pub result: io::Result<u32>,
}

/// Returned by a non-blocking `submit` when as many requests as it accepts
/// are already in flight ([`UringReader::submit`] with `queue_depth`
/// requests, the S3 and CQL fetchers' with `capacity`); it gives the
/// request back.
#[derive(Debug)]
pub struct Full<R = ReadRequest>(pub R);

/// A request of a non-blocking reader or fetcher, as [`Full`] names it.
pub trait QueuedRequest {
    /// What the queue is of, for messages: `"read"`, `"fetch"`.
    const QUEUE: &'static str;
    /// The caller's identifier.
    fn tag(&self) -> u64;
}

impl QueuedRequest for ReadRequest {
    const QUEUE: &'static str = "read";
    fn tag(&self) -> u64 {
        self.tag
    }
}

impl<R: QueuedRequest> fmt::Display for Full<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} queue full; request {} not accepted",
            R::QUEUE,
            self.0.tag()
        )
    }
}

impl<R: QueuedRequest + fmt::Debug> std::error::Error for Full<R> {}

/// The error inside a failed [`Completion`]: which step failed on which file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
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
pub fn errno(err: &io::Error) -> Option<i32> {
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
    path: CString,
    offset: u64,
    len: u32,
    dest: usize,
    done: u32,
    file: FileState,
    /// CQEs still expected for the step or chain in flight.
    pending: u8,
    open_res: Option<i32>,
    read_res: Option<i32>,
    error: Option<io::Error>,
    resubmits: u32,
    /// Whether any step has been handed to the ring yet.
    issued: bool,
    /// Whether a linked timeout of the step or chain in flight expired.
    timed_out: bool,
}

impl Op {
    fn fail(&mut self, op: &'static str, errno: Option<i32>, short: Option<(u64, u64)>) {
        let target = self.path.to_string_lossy().into_owned();
        self.error = Some(
            ReadError {
                op,
                target,
                errno,
                short,
            }
            .into_io(),
        );
    }

    /// Folds the results of the step (or chain) that just finished into the
    /// request: progress, a decided error, or one more transient resubmit.
    fn settle(&mut self) {
        let open = self.open_res.take();
        let read = self.read_res.take();
        if std::mem::take(&mut self.timed_out) {
            // The step the timeout guarded was cancelled: no resubmit. (A
            // step that completed as its timeout fired keeps its result.)
            if open.is_some_and(|res| res < 0) {
                self.fail("open", Some(libc::ETIME), None);
                return;
            }
            if read.is_some_and(|res| res < 0) {
                self.fail("read", Some(libc::ETIME), None);
                return;
            }
        }
        if let Some(res) = open {
            if res < 0 {
                // A failed open cancels the linked read; its result means nothing.
                self.transient_or_fail("open", -res);
                return;
            }
        }
        match read {
            Some(res) if res >= 0 => {
                let n = res.unsigned_abs().min(self.len - self.done);
                self.done += n;
                if n == 0 && self.done < self.len {
                    self.fail(
                        "read",
                        None,
                        Some((u64::from(self.done), u64::from(self.len))),
                    );
                }
            }
            Some(res) => self.transient_or_fail("read", -res),
            None => {}
        }
    }

    fn transient_or_fail(&mut self, op: &'static str, errno: i32) {
        let transient = matches!(errno, libc::EINTR | libc::EAGAIN | libc::ECANCELED);
        if transient && self.resubmits < TRANSIENT_RESUBMITS {
            self.resubmits += 1;
        } else {
            self.fail(op, Some(errno), None);
        }
    }

    fn finished(&self) -> bool {
        self.error.is_some() || (self.issued && self.done >= self.len)
    }
}

/// io_uring read engine; see the [module documentation](self).
///
/// Single-threaded: one owner submits and polls. Requests are handed to the
/// kernel in batches, on the next [`poll_completions`](Self::poll_completions).
pub struct UringReader {
    ring: IoUring,
    ops: Vec<Option<Op>>,
    free: Vec<u32>,
    /// Requests that completed without reaching the kernel (bad input).
    ready: Vec<Completion>,
    /// Requests whose next step did not fit in the submission queue.
    deferred: Vec<u32>,
    cqes: Vec<(u64, i32)>,
    linked: bool,
    /// The limit linked to every open and read, if any. The kernel reads
    /// the timespec when the entry is submitted, which may be after the
    /// reader has moved: it lives on the heap.
    timeout: Option<(Duration, Box<types::Timespec>)>,
}

impl fmt::Debug for UringReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringReader")
            .field("queue_depth", &self.ops.len())
            .field("in_flight", &self.in_flight())
            .field("linked", &self.linked)
            .field("timeout", &self.timeout.is_some())
            .finish()
    }
}

impl std::os::fd::AsRawFd for UringReader {
    /// The io_uring's descriptor: readable while completions are waiting.
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
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
    pub fn with_linking(queue_depth: u32, allow_linking: bool) -> io::Result<Self> {
        if queue_depth == 0 || queue_depth > MAX_QUEUE_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue depth {queue_depth} is outside 1..={MAX_QUEUE_DEPTH}"),
            ));
        }
        // Room for every request's chain at once (five entries with
        // timeouts), within the kernel's cap of 32768 entries.
        let ring = IoUring::new((queue_depth * 8).next_power_of_two().min(32768))?;
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
        Ok(Self {
            ring,
            ops: (0..queue_depth).map(|_| None).collect(),
            free: (0..queue_depth).rev().collect(),
            ready: Vec::new(),
            deferred: Vec::new(),
            cqes: Vec::new(),
            linked,
            timeout: None,
        })
    }

    /// Limits every open and every read to `limit` (`None`: no limit) with a
    /// linked `IORING_OP_LINK_TIMEOUT`; a step still running at the limit is
    /// cancelled and its request fails with `ETIME`. Applies to requests
    /// submitted from now on.
    pub fn with_timeout(mut self, limit: Option<Duration>) -> Self {
        self.timeout = limit.map(|d| (d, Box::new(types::Timespec::from(d))));
        self
    }

    /// The limit on each open and read, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.as_ref().map(|(d, _)| *d)
    }

    /// Whether file reads go to the kernel as linked chains on direct
    /// descriptors (otherwise as three separate steps).
    pub fn is_linked(&self) -> bool {
        self.linked
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
    /// batch on the next [`poll_completions`](Self::poll_completions). Bad requests (null
    /// `dest`, a range past `u64::MAX`) complete with an `InvalidInput` error.
    ///
    /// # Safety
    ///
    /// `req.dest` must be valid for writes of `req.len` bytes, and nothing may
    /// read or write that memory, until this request's [`Completion`] has
    /// been returned by `poll_completions` (dropping the reader waits for
    /// outstanding reads, up to 30 seconds).
    pub unsafe fn submit(&mut self, req: ReadRequest) -> Result<(), Full> {
        if self.in_flight() >= self.ops.len() {
            return Err(Full(req));
        }
        let bad = (req.dest.is_null() && req.len > 0)
            || req.offset.checked_add(u64::from(req.len)).is_none();
        if bad {
            self.ready.push(Completion {
                tag: req.tag,
                result: Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "read request with a null destination or a range past u64::MAX",
                )),
            });
            return Ok(());
        }
        let Some(idx) = self.free.pop() else {
            return Err(Full(req));
        };
        let op = Op {
            tag: req.tag,
            path: req.path,
            offset: req.offset,
            len: req.len,
            dest: req.dest as usize,
            done: 0,
            file: FileState::Closed,
            pending: 0,
            open_res: None,
            read_res: None,
            error: None,
            resubmits: 0,
            issued: false,
            timed_out: false,
        };
        if let Some(slot) = self.ops.get_mut(idx as usize) {
            *slot = Some(op);
        }
        let mut sink = Vec::new();
        self.advance(idx, &mut sink);
        self.ready.append(&mut sink);
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
            } else if !self.ring.submission().is_empty() {
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
                if !self.ring.submission().is_empty() {
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

    /// Moves every available CQE into its request, advancing those whose step
    /// or chain is complete.
    fn reap(&mut self, out: &mut Vec<Completion>) {
        self.cqes.clear();
        self.cqes
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for i in 0..self.cqes.len() {
            let Some(&(user_data, res)) = self.cqes.get(i) else {
                break;
            };
            let Ok(idx) = u32::try_from(user_data >> 2) else {
                continue;
            };
            let linked = self.linked;
            let Some(Some(op)) = self.ops.get_mut(idx as usize) else {
                continue;
            };
            match user_data & 3 {
                KIND_OPEN => {
                    op.open_res = Some(res);
                    if res >= 0 && !linked {
                        op.file = FileState::Open(res);
                    }
                }
                KIND_READ => op.read_res = Some(res),
                KIND_CLOSE => op.file = FileState::Closed,
                _ => op.timed_out |= res == -libc::ETIME,
            }
            op.pending = op.pending.saturating_sub(1);
            if op.pending == 0 {
                self.advance(idx, out);
            }
        }
    }

    /// Decides and queues the next step of request `idx`, or finishes it.
    fn advance(&mut self, idx: u32, out: &mut Vec<Completion>) {
        let linked = self.linked;
        let limit = self
            .timeout
            .as_ref()
            .map(|(_, ts)| std::ptr::from_ref::<types::Timespec>(ts));
        let Some(Some(op)) = self.ops.get_mut(idx as usize) else {
            return;
        };
        op.settle();
        let entries = match (op.finished(), op.file) {
            (true, FileState::Open(fd)) => vec![opcode::Close::new(types::Fd(fd))
                .build()
                .user_data(ud(idx, KIND_CLOSE))],
            (true, FileState::Closed) => {
                if let Some(op) = self.ops.get_mut(idx as usize).and_then(Option::take) {
                    out.push(Completion {
                        tag: op.tag,
                        result: op.error.map_or(Ok(op.len), Err),
                    });
                }
                self.free.push(idx);
                return;
            }
            (false, FileState::Open(fd)) => {
                guarded(read_entry(op, types::Fd(fd), idx), idx, limit, None)
            }
            (false, FileState::Closed) => {
                let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), op.path.as_ptr());
                if linked {
                    let slot = types::DestinationSlot::try_from_slot_target(idx).ok();
                    let open = open
                        .file_index(slot)
                        .flags(libc::O_RDONLY)
                        .build()
                        .user_data(ud(idx, KIND_OPEN));
                    let mut chain = guarded(open, idx, limit, Some(squeue::Flags::IO_LINK));
                    // A hard link: the close runs even after a short or
                    // timed-out read.
                    let read = read_entry(op, types::Fixed(idx), idx);
                    chain.extend(guarded(read, idx, limit, Some(squeue::Flags::IO_HARDLINK)));
                    chain.push(
                        opcode::Close::new(types::Fixed(idx))
                            .build()
                            .user_data(ud(idx, KIND_CLOSE)),
                    );
                    chain
                } else {
                    let open = open
                        .flags(libc::O_RDONLY | libc::O_CLOEXEC)
                        .build()
                        .user_data(ud(idx, KIND_OPEN));
                    guarded(open, idx, limit, None)
                }
            }
        };
        // SAFETY: every entry points at memory that outlives the operation:
        // the path is owned by this request's `Op`, which stays in `ops`
        // until its last CQE has been reaped; the timeout's timespec is a
        // heap box owned by the reader, read by the kernel at submission and
        // never changed or freed while the ring lives; `dest` (plus progress) is
        // covered by the caller's contract on `submit`; the descriptor is the
        // one this request opened, or its own direct slot `idx`. A chain is
        // pushed whole or not at all.
        let pushed = unsafe { self.ring.submission().push_multiple(&entries) };
        match pushed {
            Ok(()) => {
                op.pending = u8::try_from(entries.len()).unwrap_or(u8::MAX);
                op.issued = true;
            }
            Err(_) => self.deferred.push(idx),
        }
    }
}

fn ud(idx: u32, kind: u64) -> u64 {
    (u64::from(idx) << 2) | kind
}

/// `step` alone, or, with a `limit`, `step` linked to an
/// `IORING_OP_LINK_TIMEOUT` that cancels it when the limit expires. `then`
/// links whatever follows in the chain to the last entry (`IO_LINK`, or
/// `IO_HARDLINK` to run it even when `step` fails).
fn guarded(
    step: squeue::Entry,
    idx: u32,
    limit: Option<*const types::Timespec>,
    then: Option<squeue::Flags>,
) -> Vec<squeue::Entry> {
    let then = then.unwrap_or(squeue::Flags::empty());
    match limit {
        None => vec![step.flags(then)],
        Some(ts) => vec![
            step.flags(squeue::Flags::IO_LINK | then),
            opcode::LinkTimeout::new(ts)
                .build()
                .flags(then)
                .user_data(ud(idx, KIND_TIMEOUT)),
        ],
    }
}

/// A read of the rest of `op` through `fd`.
fn read_entry(op: &Op, fd: impl Into<ReadFd>, idx: u32) -> squeue::Entry {
    let rest = op.len - op.done;
    let dest = (op.dest + op.done as usize) as *mut u8;
    let offset = op.offset + u64::from(op.done);
    let read = match fd.into() {
        ReadFd::Fd(fd) => opcode::Read::new(fd, dest, rest),
        ReadFd::Fixed(fd) => opcode::Read::new(fd, dest, rest),
    };
    read.offset(offset).build().user_data(ud(idx, KIND_READ))
}

/// The two kinds of descriptor a read can go through.
enum ReadFd {
    Fd(types::Fd),
    Fixed(types::Fixed),
}

impl From<types::Fd> for ReadFd {
    fn from(fd: types::Fd) -> Self {
        ReadFd::Fd(fd)
    }
}

impl From<types::Fixed> for ReadFd {
    fn from(fd: types::Fixed) -> Self {
        ReadFd::Fixed(fd)
    }
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

/// What [`read_files_into`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStats {
    /// From the first submission to the last completion.
    pub elapsed: Duration,
    /// Bytes read.
    pub bytes: u64,
    /// Files read.
    pub files: usize,
}

/// Reads each `(path, len)` of `files`, whole, into `buf`, one after the
/// other in list order, with `queue_depth` reads in flight; the cold-read
/// benchmark's workload.
///
/// Fails on the first file that cannot be read (the error names it), when
/// `buf` is shorter than the sum of the lengths, or when the reader cannot be
/// created. Returns only after every read it started has finished.
pub fn read_files_into<P: AsRef<Path>>(
    files: &[(P, u32)],
    buf: &mut [u8],
    queue_depth: u32,
) -> io::Result<ReadStats> {
    let mut requests = Vec::with_capacity(files.len());
    let mut at = 0usize;
    for (i, (path, len)) in files.iter().enumerate() {
        let path = CString::new(path.as_ref().as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("path {} contains a NUL byte", path.as_ref().display()),
            )
        })?;
        let end = at
            .checked_add(*len as usize)
            .filter(|&end| end <= buf.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "buffer of {} bytes too small for {} files",
                        buf.len(),
                        files.len()
                    ),
                )
            })?;
        requests.push((i as u64, path, at, *len));
        at = end;
    }
    let mut reader = UringReader::new(queue_depth)?;
    let base = buf.as_mut_ptr();
    let mut pending = requests.into_iter();
    let mut next = pending.next();
    let mut done = Vec::new();
    let mut first_error = None;
    let mut bytes = 0u64;
    let start = Instant::now();
    loop {
        while first_error.is_none() {
            let Some((tag, path, at, len)) = next.take() else {
                break;
            };
            let req = ReadRequest {
                tag,
                path,
                offset: 0,
                len,
                // `at + len <= buf.len()` was checked above.
                dest: base.wrapping_add(at),
            };
            // SAFETY: `dest` lies inside `buf`, which stays mutably borrowed
            // (and untouched) until every request has completed: the loop
            // below runs until nothing is in flight. Ranges are disjoint.
            match unsafe { reader.submit(req) } {
                Ok(()) => next = pending.next(),
                Err(Full(req)) => {
                    next = Some((tag, req.path, at, len));
                    break;
                }
            }
        }
        if reader.in_flight() == 0 && (next.is_none() || first_error.is_some()) {
            break;
        }
        if let Err(e) = reader.poll_completions(Some(Duration::from_secs(1)), &mut done) {
            first_error.get_or_insert(e);
            // Requests may still be in the kernel; keep polling until they finish.
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in done.drain(..) {
            match c.result {
                Ok(n) => bytes += u64::from(n),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    let elapsed = start.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok(ReadStats {
            elapsed,
            bytes,
            files: files.len(),
        }),
    }
}

/// Whether a read error may go away on its own: `EIO`, `EAGAIN`, `EINTR`,
/// `ETIMEDOUT`, `ECANCELED` (and the matching error kinds without an OS error
/// number). Missing files, permissions, directories, files that ended early
/// and bad requests are not: they fail the sample at once.
pub fn is_retryable(err: &io::Error) -> bool {
    match errno(err) {
        Some(e) => matches!(
            e,
            libc::EIO | libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT | libc::ECANCELED
        ),
        None => matches!(
            err.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    }
}

/// Retry policy for failed sample reads: transient errors are retried up to
/// `retries` times with exponential backoff and jitter; anything else fails
/// the sample at once.
///
/// Time is an input ([`decide`](Self::decide) takes `now` and returns an
/// instant), so the policy never sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRetry {
    /// Retries after the first failure; 0 reports the first error.
    pub retries: u32,
    /// Upper bound of the delay before the first retry; doubles per retry.
    pub base_delay: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
}

/// What to do after a failed read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Submit the read again at (not before) this instant.
    RetryAt(Instant),
    /// Report the error for this sample.
    GiveUp,
}

impl Default for ReadRetry {
    /// Four retries, 10 ms first backoff, at most 1 s.
    fn default() -> Self {
        Self {
            retries: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
        }
    }
}

impl ReadRetry {
    /// Whether `err` may go away on its own; see [`is_retryable`].
    pub fn is_retryable(err: &io::Error) -> bool {
        is_retryable(err)
    }

    /// The delay before retry number `attempt` (1 for the first retry): a
    /// uniform pick in `[cap / 2, cap]`, where `cap` is `base_delay`
    /// doubled `attempt - 1` times and bounded by `max_delay`. `seed` (for
    /// instance the sample id) picks the point, so equal seeds give equal
    /// delays and different samples spread out.
    pub fn delay(&self, attempt: u32, seed: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let cap = self
            .base_delay
            .as_nanos()
            .saturating_mul(1u128 << doublings)
            .min(self.max_delay.as_nanos())
            .min(u128::from(u64::MAX));
        let half = cap / 2;
        let spread = cap - half;
        let pick = u128::from(mix64(seed ^ u64::from(attempt).rotate_left(32)));
        let nanos = half + ((spread * pick) >> 64);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// After the `failures`-th failed attempt of a read (1 for the first),
    /// at time `now`: retry at `now + delay(failures, seed)` if `err` is
    /// retryable and fewer than `retries` retries were made, else give up.
    pub fn decide(&self, err: &io::Error, failures: u32, now: Instant, seed: u64) -> RetryDecision {
        if !Self::is_retryable(err) || failures > self.retries {
            return RetryDecision::GiveUp;
        }
        match now.checked_add(self.delay(failures, seed)) {
            Some(at) => RetryDecision::RetryAt(at),
            None => RetryDecision::GiveUp,
        }
    }
}

/// A 64-bit mixing function (SplitMix64 finaliser): well-spread bits from any seed.
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
