//! The CQL fetcher: prepared sample reads in flight on a tokio runtime,
//! blobs copied once into the caller's memory, completions handed back to
//! a single-threaded owner.
//!
//! The owner calls [`CqlFetcher::submit`] — which never blocks — up to
//! [`CqlFetcher::capacity`] times, and collects finished reads with
//! [`CqlFetcher::poll_completions`], in any order, exactly like
//! [`crate::uring_reader::UringReader`] and the S3 fetcher. Each accepted
//! request becomes one task on the runtime:
//!
//! 1. one execution of the prepared `SELECT data FROM ks.data WHERE id = ?`,
//!    routed by the driver to a replica of the id's partition, under the
//!    per-attempt timeout (the statement's request timeout);
//! 2. the blob deserialized as a slice borrowed from the response frame —
//!    the bytes the driver received — and copied once into `dest`; no row is
//!    an error naming the id (`NotFound`), and so is a blob whose length is
//!    not the catalog's;
//! 3. on failure, [`super::classify`] decides: timeouts, broken
//!    connections, overloaded, unavailable and read timeouts are retried
//!    after an exponential, jittered backoff; anything else fails at once;
//! 4. the completion is queued and the eventfd ([`CqlFetcher::wake_fd`]) is
//!    signalled.
//!
//! The driver multiplexes every request over its pools (up to 32768
//! streams per connection), so thousands in flight cost a task each, not a
//! thread or a connection. Dropping the fetcher cancels the requests still
//! running and waits until none can touch its destination any more.

use super::{AttemptError, FetchError};
use crate::uring_reader::{Completion, ReadRetry};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
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
use uuid::Uuid;

/// How long dropping a fetcher waits for cancelled requests to let go of
/// their destinations.
const DROP_DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// One sample read: the blob of row `id`, `len` bytes, into `dest`.
#[derive(Debug)]
pub struct FetchRequest {
    /// The caller's identifier, returned in the [`Completion`].
    pub tag: u64,
    /// The row.
    pub id: Uuid,
    /// The blob's length according to the catalog: the bytes written to
    /// `dest` on success.
    pub len: u32,
    /// Destination (an arena extent); see [`CqlFetcher::submit`].
    pub dest: *mut u8,
}

/// Returned by [`CqlFetcher::submit`] when `capacity` requests are already
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
    /// Most requests in flight at once. Default 2048.
    pub capacity: u32,
    /// Time limit of one attempt. Default 10 s.
    pub request_timeout: Duration,
    /// Retries of retryable failures and their backoff. Default 8 retries,
    /// 50 ms first backoff, at most 2 s.
    pub retry: ReadRetry,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            capacity: super::DEFAULT_MAX_INFLIGHT,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
            retry: ReadRetry {
                retries: super::DEFAULT_RETRIES,
                base_delay: super::RETRY_BASE_DELAY,
                max_delay: super::RETRY_MAX_DELAY,
            },
        }
    }
}

/// Counters of a fetcher since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Requests accepted.
    pub requests: u64,
    /// Attempts made (requests + retries).
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
    /// An eventfd, signalled after every push to `done`.
    event: File,
    /// Tasks whose future has not been dropped yet.
    live: Mutex<usize>,
    live_cv: Condvar,
    counters: Counters,
}

impl Shared {
    fn signal(&self) {
        // A failed write only costs a wake-up; poll_completions also drains
        // without one.
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
// request; `CqlFetcher::submit`'s contract makes the memory the request's
// alone until its completion is returned, and `Drop for CqlFetcher` waits
// until no task can touch it any more.
unsafe impl Send for Dest {}

impl Dest {
    /// Copies `bytes`, which must be exactly `len` long, to the destination.
    fn fill(&self, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.len, "blob length checked by the caller");
        if bytes.is_empty() {
            return;
        }
        // SAFETY: `ptr..ptr + len` is valid for writes and used by nothing
        // else while the request runs (`submit`'s contract); `bytes` lies in
        // a received frame, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) };
    }
}

/// Non-blocking CQL sample reads with completions in any order; see the
/// [module documentation](self).
pub struct CqlFetcher {
    runtime: Arc<Runtime>,
    session: Arc<Session>,
    statement: PreparedStatement,
    table: Arc<str>,
    options: FetchOptions,
    shared: Arc<Shared>,
    /// Requests that completed without running (bad input).
    ready: Vec<Completion>,
    /// Abort handles of running tasks, by internal id.
    running: HashMap<u64, AbortHandle>,
    next_id: u64,
    in_flight: usize,
}

impl fmt::Debug for CqlFetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlFetcher")
            .field("table", &self.table)
            .field("options", &self.options)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl CqlFetcher {
    /// A fetcher that executes `statement` (`SELECT data FROM <table> WHERE
    /// id = ?`) through `session` on `runtime`; `table` (`ks.data`) names
    /// rows in messages. The statement's request timeout is set to
    /// `options.request_timeout`. Fails when the capacity or the timeout is
    /// zero, or the eventfd cannot be created.
    pub fn new(
        runtime: Arc<Runtime>,
        session: Arc<Session>,
        mut statement: PreparedStatement,
        table: String,
        options: FetchOptions,
    ) -> io::Result<CqlFetcher> {
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
        statement.set_request_timeout(Some(options.request_timeout));
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            event: File::from(eventfd()?),
            live: Mutex::new(0),
            live_cv: Condvar::new(),
            counters: Counters::default(),
        });
        Ok(CqlFetcher {
            runtime,
            session,
            statement,
            table: table.into(),
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

    /// Whether the driver routes the statement by token (it knows the
    /// partition key's position among the bound values).
    pub fn is_token_aware(&self) -> bool {
        self.statement.is_token_aware()
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
    /// cleared by [`poll_completions`](Self::poll_completions)).
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.as_fd()
    }

    /// Accepts `req`, or gives it back in [`Full`] when `capacity` requests
    /// are in flight. The request starts at once on the runtime; this never
    /// blocks. A request with a null `dest` and a non-zero length completes
    /// with an `InvalidInput` error.
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
        let counters = &self.shared.counters;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        if req.dest.is_null() && req.len > 0 {
            counters.failures.fetch_add(1, Ordering::Relaxed);
            self.ready.push(Completion {
                tag: req.tag,
                result: Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    FetchError {
                        table: self.table.to_string(),
                        id: req.id,
                        attempts: 0,
                        retryable: false,
                        message: "null destination".to_owned(),
                    },
                )),
            });
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        *self.shared.live.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let guard = LiveGuard(self.shared.clone());
        let job = Job {
            session: self.session.clone(),
            statement: self.statement.clone(),
            table: self.table.clone(),
            retry: self.options.retry,
            row: req.id,
            dest: Dest {
                ptr: req.dest,
                len: req.len as usize,
            },
            seed: id,
        };
        let shared = self.shared.clone();
        let tag = req.tag;
        let task = async move {
            let _guard = guard;
            let mut job = job;
            let result = job.run(&shared.counters).await;
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
            self.in_flight -= self.ready.len();
            out.append(&mut self.ready);
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

impl Drop for CqlFetcher {
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
                    "granary: CQL fetcher dropped with {} request(s) still running after {:?}",
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

/// Everything one request's task needs.
struct Job {
    session: Arc<Session>,
    statement: PreparedStatement,
    table: Arc<str>,
    retry: ReadRetry,
    row: Uuid,
    dest: Dest,
    seed: u64,
}

impl Job {
    /// Attempts with retries and backoff; the completion's result. (`&mut`:
    /// a job belongs to one task, and its destination is not `Sync`.)
    async fn run(&mut self, counters: &Counters) -> io::Result<u32> {
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            counters.attempts.fetch_add(1, Ordering::Relaxed);
            let err = match self.attempt().await {
                Ok(()) => return Ok(self.dest.len as u32),
                Err(e) => e,
            };
            if err.failure.kind == io::ErrorKind::TimedOut {
                counters.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            if err.retryable() && attempts <= self.retry.retries {
                counters.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(self.retry.delay(attempts, self.seed)).await;
                continue;
            }
            return Err(io::Error::new(
                err.failure.kind,
                FetchError {
                    table: self.table.to_string(),
                    id: self.row,
                    attempts,
                    retryable: err.retryable(),
                    message: err.message,
                },
            ));
        }
    }

    /// One execution; the blob copied into the destination.
    async fn attempt(&mut self) -> Result<(), AttemptError> {
        let result = self
            .session
            .execute_unpaged(&self.statement, (self.row,))
            .await?;
        let invalid = |m: String| AttemptError::fatal(io::ErrorKind::InvalidData, m);
        let rows = result
            .into_rows_result()
            .map_err(|e| invalid(format!("the answer holds no rows: {e}")))?;
        let row = rows
            .maybe_first_row::<(Option<&[u8]>,)>()
            .map_err(|e| invalid(format!("cannot read the data column: {e}")))?;
        let blob = match row {
            None => {
                return Err(AttemptError::fatal(
                    io::ErrorKind::NotFound,
                    format!(
                        "no row with id {} in {} (the metadata table lists it)",
                        self.row, self.table
                    ),
                ))
            }
            Some((None,)) => return Err(invalid(format!("row {}: data is null", self.row))),
            Some((Some(blob),)) => blob,
        };
        if blob.len() != self.dest.len {
            return Err(invalid(format!(
                "length mismatch: the metadata table says {} bytes, the blob of {} holds {}",
                self.dest.len,
                self.row,
                blob.len()
            )));
        }
        self.dest.fill(blob);
        Ok(())
    }
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
