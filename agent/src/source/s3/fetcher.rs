//! The S3 fetcher: sample GETs in flight on a tokio runtime, bodies copied
//! straight into the caller's memory, completions handed back to a
//! single-threaded owner.
//!
//! The owner (the engine, a test, a benchmark) calls [`S3Fetcher::submit`]
//! — which never blocks — up to [`S3Fetcher::capacity`] times, and collects
//! finished requests with [`S3Fetcher::poll_completions`], in any order,
//! exactly like [`crate::uring_reader::UringReader`]; the completions are
//! the same [`Completion`] type. Each accepted request becomes one task on
//! the runtime's worker threads:
//!
//! 1. a GET of the object (a ranged GET for a range of it), under a timeout
//!    that covers headers and body ([`FetchOptions::request_timeout`]);
//! 2. the body, chunk by chunk as the HTTP client receives it, copied into
//!    `dest` at its offset — the only copy of the bytes; a body longer or
//!    shorter than the requested length is an error naming the key;
//! 3. on failure, [`super::classify`] decides: timeouts, connection errors,
//!    HTTP 5xx/429/408 are retried after an exponential, jittered backoff
//!    ([`FetchOptions::retry`]), each retry rewriting `dest` from the start;
//!    404, 403 and other client errors fail at once;
//! 4. the completion is queued and the fetcher's eventfd
//!    ([`S3Fetcher::wake_fd`]) is signalled, so an owner that waits on
//!    several descriptors wakes up.
//!
//! Dropping the fetcher cancels the requests still running and waits until
//! none can touch its destination any more.

use super::{classify, FetchError};
use crate::uring_reader::{Completion, ReadRetry};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::AbortHandle;

/// How long dropping a fetcher waits for cancelled requests to let go of
/// their destinations.
const DROP_DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// One sample fetch: `len` bytes of object `key` into `dest`.
#[derive(Debug)]
pub struct FetchRequest {
    /// The caller's identifier, returned in the [`Completion`].
    pub tag: u64,
    /// The object.
    pub key: ObjectPath,
    /// Where the sample starts in the object (0 for a whole object).
    pub offset: u64,
    /// Sample length: the bytes written to `dest` on success.
    pub len: u32,
    /// `true`: the sample is the whole object — a plain GET, and the object
    /// must be exactly `len` bytes long. `false`: a ranged GET of
    /// `offset..offset + len`, which the object must contain.
    pub whole_object: bool,
    /// Destination: memory reserved for this fetch (an arena extent). See
    /// [`S3Fetcher::submit`] for what must hold.
    pub dest: *mut u8,
}

impl FetchRequest {
    /// A whole-object fetch.
    pub fn whole(tag: u64, key: impl Into<ObjectPath>, len: u32, dest: *mut u8) -> FetchRequest {
        FetchRequest {
            tag,
            key: key.into(),
            offset: 0,
            len,
            whole_object: true,
            dest,
        }
    }

    /// A ranged fetch of `len` bytes at `offset`.
    pub fn range(
        tag: u64,
        key: impl Into<ObjectPath>,
        offset: u64,
        len: u32,
        dest: *mut u8,
    ) -> FetchRequest {
        FetchRequest {
            tag,
            key: key.into(),
            offset,
            len,
            whole_object: false,
            dest,
        }
    }
}

/// Returned by [`S3Fetcher::submit`] when `capacity` requests are already
/// in flight; it gives the request back.
#[derive(Debug)]
pub struct Full(pub FetchRequest);

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fetch queue full; request {} not accepted", self.0.tag)
    }
}

impl std::error::Error for Full {}

/// Options of a fetcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// Most requests in flight at once. Default 256.
    pub capacity: u32,
    /// Time limit of one attempt, from sending the request to the last body
    /// byte. Default 10 s.
    pub request_timeout: Duration,
    /// Retries of retryable failures and their backoff. Default 8 retries,
    /// 50 ms first backoff, at most 2 s.
    pub retry: ReadRetry,
    /// Worker threads of the runtime a [`super::S3Source`] creates.
    /// Default 2.
    pub worker_threads: usize,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            capacity: 256,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
            retry: ReadRetry {
                retries: super::DEFAULT_RETRIES,
                base_delay: super::RETRY_BASE_DELAY,
                max_delay: super::RETRY_MAX_DELAY,
            },
            worker_threads: 2,
        }
    }
}

/// Counters of a fetcher since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Requests accepted.
    pub requests: u64,
    /// GET attempts made (requests + retries).
    pub attempts: u64,
    /// Attempts that failed and were retried.
    pub retries: u64,
    /// Attempts that ran out of time.
    pub timeouts: u64,
    /// Requests that completed with an error.
    pub failures: u64,
    /// Bytes delivered by successful requests.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
    failures: AtomicU64,
    bytes: AtomicU64,
}

/// State shared by the owner and the tasks.
struct Shared {
    /// Finished requests: (internal id, completion).
    done: Mutex<Vec<(u64, Completion)>>,
    /// Signalled after every push to `done`.
    event: File,
    /// Tasks whose future has not been dropped yet.
    live: Mutex<usize>,
    live_cv: Condvar,
    counters: Counters,
}

impl Shared {
    fn signal(&self) {
        // An eventfd counter cannot overflow at our rates; a failed write
        // only costs a wake-up, and poll_completions also drains without one.
        let _ = (&self.event).write(&1u64.to_ne_bytes());
    }

    fn clear(&self) {
        let mut buf = [0u8; 8];
        let _ = (&self.event).read(&mut buf);
    }
}

/// Decrements the live-task count when a task's future is dropped —
/// finished or cancelled.
struct LiveGuard(Arc<Shared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut live = self.0.live.lock().unwrap_or_else(|p| p.into_inner());
        *live -= 1;
        self.0.live_cv.notify_all();
    }
}

/// The destination of one request, movable to a worker thread.
#[derive(Clone, Copy)]
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Dest` is only dereferenced by the one task that owns the
// request; `S3Fetcher::submit`'s contract makes the memory the request's
// alone until its completion is returned, and `Drop for S3Fetcher` waits
// until no task can touch it any more.
unsafe impl Send for Dest {}

impl Dest {
    /// Copies `bytes` to `at..at + bytes.len()`, which the caller has
    /// checked lies within `len`.
    fn write(&self, at: usize, bytes: &[u8]) {
        debug_assert!(at + bytes.len() <= self.len);
        let to = self.ptr.wrapping_add(at);
        // SAFETY: `to..to + bytes.len()` lies inside the `len` bytes at `ptr`
        // (checked by the caller), which `submit`'s contract makes valid for
        // writes and used by nothing else while the request runs; `bytes` is
        // a received buffer, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len()) };
    }
}

/// An attempt's failure, before it becomes a completion error.
struct AttemptError {
    kind: io::ErrorKind,
    retryable: bool,
    message: String,
}

impl AttemptError {
    fn from_store(e: &object_store::Error) -> AttemptError {
        let f = classify(e);
        AttemptError {
            kind: f.kind,
            retryable: f.retryable,
            message: format!("{}: {e}", f.what),
        }
    }
}

/// Non-blocking S3 fetches with completions in any order; see the
/// [module documentation](self).
pub struct S3Fetcher {
    runtime: Arc<Runtime>,
    store: Arc<dyn ObjectStore>,
    options: FetchOptions,
    shared: Arc<Shared>,
    /// Requests that completed without running (bad input).
    ready: Vec<Completion>,
    /// Abort handles of running tasks, by internal id.
    running: HashMap<u64, AbortHandle>,
    next_id: u64,
    in_flight: usize,
}

impl fmt::Debug for S3Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Fetcher")
            .field("store", &self.store.to_string())
            .field("options", &self.options)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl S3Fetcher {
    /// A fetcher that runs its requests on `runtime` through `store`.
    /// Fails when `options.capacity` is 0 or the eventfd cannot be created.
    pub fn new(
        runtime: Arc<Runtime>,
        store: Arc<dyn ObjectStore>,
        options: FetchOptions,
    ) -> io::Result<S3Fetcher> {
        if options.capacity == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fetch capacity must be at least 1",
            ));
        }
        if options.request_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request timeout must be above zero",
            ));
        }
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            event: File::from(eventfd()?),
            live: Mutex::new(0),
            live_cv: Condvar::new(),
            counters: Counters::default(),
        });
        Ok(S3Fetcher {
            runtime,
            store,
            options,
            shared,
            ready: Vec::new(),
            running: HashMap::new(),
            next_id: 0,
            in_flight: 0,
        })
    }

    /// The most requests in flight at once.
    pub fn capacity(&self) -> u32 {
        self.options.capacity
    }

    /// Requests accepted whose completion has not been returned yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The options.
    pub fn options(&self) -> &FetchOptions {
        &self.options
    }

    /// Counters since the fetcher was created.
    pub fn stats(&self) -> FetchStats {
        let c = &self.shared.counters;
        FetchStats {
            requests: c.requests.load(Ordering::Relaxed),
            attempts: c.attempts.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        }
    }

    /// An eventfd that is readable while completions may be pending (it is
    /// cleared by [`poll_completions`](Self::poll_completions)); an owner
    /// waiting on several descriptors adds it to its poll set.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.as_fd()
    }

    /// Accepts `req`, or gives it back in [`Full`] when `capacity` requests
    /// are in flight. The request starts at once on the runtime; it never
    /// blocks the caller. A request with a null `dest` (and a non-zero
    /// length) or a range past `u64::MAX` completes with an `InvalidInput`
    /// error.
    ///
    /// # Safety
    ///
    /// `req.dest` must be valid for writes of `req.len` bytes, and nothing
    /// may read or write that memory, until this request's [`Completion`]
    /// has been returned by `poll_completions` (dropping the fetcher cancels
    /// outstanding requests and waits, up to 30 seconds, until none can
    /// write any more).
    pub unsafe fn submit(&mut self, req: FetchRequest) -> Result<(), Full> {
        if self.in_flight >= self.options.capacity as usize {
            return Err(Full(req));
        }
        self.in_flight += 1;
        self.shared
            .counters
            .requests
            .fetch_add(1, Ordering::Relaxed);
        let bad = (req.dest.is_null() && req.len > 0)
            || req.offset.checked_add(u64::from(req.len)).is_none();
        if bad {
            self.shared
                .counters
                .failures
                .fetch_add(1, Ordering::Relaxed);
            self.ready.push(Completion {
                tag: req.tag,
                result: Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    FetchError {
                        key: req.key.to_string(),
                        range: None,
                        attempts: 0,
                        retryable: false,
                        message: "null destination or a range past u64::MAX".to_owned(),
                    },
                )),
            });
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        {
            let mut live = self.shared.live.lock().unwrap_or_else(|p| p.into_inner());
            *live += 1;
        }
        let guard = LiveGuard(self.shared.clone());
        let store = self.store.clone();
        let options = self.options.clone();
        let shared = self.shared.clone();
        let dest = Dest {
            ptr: req.dest,
            len: req.len as usize,
        };
        let tag = req.tag;
        let spec = Spec {
            key: req.key,
            offset: req.offset,
            len: req.len,
            whole_object: req.whole_object,
        };
        let task = async move {
            let _guard = guard;
            let result = fetch(&*store, &spec, dest, &options, &shared.counters, id).await;
            let c = &shared.counters;
            match &result {
                Ok(n) => c.bytes.fetch_add(u64::from(*n), Ordering::Relaxed),
                Err(_) => c.failures.fetch_add(1, Ordering::Relaxed),
            };
            shared
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((id, Completion { tag, result }));
            shared.signal();
        };
        let handle = self.runtime.spawn(task);
        self.running.insert(id, handle.abort_handle());
        Ok(())
    }

    /// Appends finished requests to `out` and returns how many it appended.
    /// With `wait` `None` it does not block; with `Some(d)` and requests in
    /// flight it waits until at least one finishes or `d` has passed.
    pub fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let start = out.len();
        let deadline = wait.map(|d| Instant::now() + d);
        loop {
            self.shared.clear();
            let n = self.ready.len();
            out.append(&mut self.ready);
            self.in_flight -= n;
            let done =
                std::mem::take(&mut *self.shared.done.lock().unwrap_or_else(|p| p.into_inner()));
            self.in_flight -= done.len();
            for (id, c) in done {
                self.running.remove(&id);
                out.push(c);
            }
            if out.len() > start || self.in_flight == 0 {
                break;
            }
            let Some(deadline) = deadline else { break };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            wait_readable(self.shared.event.as_fd(), left)?;
        }
        Ok(out.len() - start)
    }
}

impl Drop for S3Fetcher {
    /// Cancels the requests still running and waits (up to 30 seconds) until
    /// none of them can write into its destination.
    fn drop(&mut self) {
        for h in self.running.values() {
            h.abort();
        }
        let limit = Instant::now() + DROP_DRAIN_LIMIT;
        let mut live = self.shared.live.lock().unwrap_or_else(|p| p.into_inner());
        while *live > 0 {
            let left = limit.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!(
                    "granary: S3 fetcher dropped with {} request(s) still running after {:?}",
                    *live, DROP_DRAIN_LIMIT
                );
                break;
            }
            live = self
                .shared
                .live_cv
                .wait_timeout(live, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// What a task fetches (a [`FetchRequest`] without its destination).
struct Spec {
    key: ObjectPath,
    offset: u64,
    len: u32,
    whole_object: bool,
}

/// Runs one request: attempts under the timeout, retries with backoff.
async fn fetch(
    store: &dyn ObjectStore,
    req: &Spec,
    dest: Dest,
    options: &FetchOptions,
    counters: &Counters,
    id: u64,
) -> io::Result<u32> {
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        counters.attempts.fetch_add(1, Ordering::Relaxed);
        let outcome =
            tokio::time::timeout(options.request_timeout, attempt(store, req, dest)).await;
        let err = match outcome {
            Ok(Ok(())) => return Ok(req.len),
            Ok(Err(e)) => e,
            Err(_) => AttemptError {
                kind: io::ErrorKind::TimedOut,
                retryable: true,
                message: format!(
                    "timed out: no complete response within {} ms",
                    options.request_timeout.as_millis()
                ),
            },
        };
        if err.kind == io::ErrorKind::TimedOut {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        if err.retryable && attempts <= options.retry.retries {
            counters.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(options.retry.delay(attempts, id)).await;
            continue;
        }
        return Err(io::Error::new(
            err.kind,
            FetchError {
                key: req.key.to_string(),
                range: (!req.whole_object).then(|| (req.offset, req.offset + u64::from(req.len))),
                attempts,
                retryable: err.retryable,
                message: err.message,
            },
        ));
    }
}

/// One GET attempt, its body streamed into `dest`.
async fn attempt(store: &dyn ObjectStore, req: &Spec, dest: Dest) -> Result<(), AttemptError> {
    let want = u64::from(req.len);
    let mut opts = GetOptions::default();
    if !req.whole_object {
        if req.len == 0 {
            return Ok(());
        }
        opts.range = Some(GetRange::Bounded(req.offset..req.offset + want));
    }
    let res = store
        .get_opts(&req.key, opts)
        .await
        .map_err(|e| AttemptError::from_store(&e))?;
    let mismatch = |got: String| AttemptError {
        kind: io::ErrorKind::InvalidData,
        retryable: false,
        message: format!("length mismatch: expected {want} bytes, {got}"),
    };
    if req.whole_object && res.meta.size != want {
        return Err(mismatch(format!("the object holds {}", res.meta.size)));
    }
    let served = res.range.end - res.range.start;
    if served != want {
        return Err(mismatch(format!("the server sent a range of {served}")));
    }
    let mut at = 0usize;
    let mut body = res.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| AttemptError::from_store(&e))?;
        if at + chunk.len() > dest.len {
            return Err(mismatch(format!(
                "the body holds more than {}",
                at + chunk.len() - 1
            )));
        }
        dest.write(at, &chunk);
        at += chunk.len();
    }
    if at != dest.len {
        return Err(mismatch(format!("the body ended after {at}")));
    }
    Ok(())
}

/// A non-blocking, close-on-exec eventfd.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits until `fd` is readable or `timeout` has passed.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfd` and `ts` are valid for the call; one descriptor; a null
    // signal mask leaves the mask unchanged.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
