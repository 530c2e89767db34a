//! Requests running as tasks on a tokio runtime, their completions handed to
//! one owner through a queue and an eventfd: the machinery the S3 and CQL
//! fetchers share.
//!
//! Both fetchers ([`super::s3::S3Fetcher`], [`super::cql::CqlFetcher`]) have
//! the shape of [`super::fs::reader::UringReader`]: a single-threaded
//! owner submits requests without blocking, up to a capacity, and collects
//! [`IoCompletion`]s in any order, waiting on a descriptor when it has nothing
//! else to do. Only what one request does differs between them (a GET whose
//! body is streamed into memory, a prepared read whose blob is copied);
//! everything around it is a [`TaskQueue`]:
//!
//! * admission: at most `capacity` requests in flight, each counted from
//!   its submission until its completion has been handed to the owner; a
//!   request refused before it runs ([`TaskQueue::reject`]) completes on
//!   the next poll;
//! * one task per request on the runtime ([`TaskQueue::spawn`]); when it
//!   ends, its completion is queued and the eventfd
//!   ([`TaskQueue::wake_fd`]) signalled, so an owner waiting on several
//!   descriptors wakes up;
//! * [`TaskQueue::poll_completions`]: drains the queue, waiting on the
//!   eventfd until a deadline when asked to;
//! * [`Dest`]: the caller's arena range as a task sees it, and the one
//!   place where fetched bytes are copied into it; the task holds it (and
//!   so the arena's mapping) until its future is dropped;
//! * [`Attempts::once`]: a request's one attempt (the engine's retry
//!   policy decides on another), counted in [`FetchStats`];
//! * dropping: the running tasks are aborted, then the drop waits (up to
//!   30 seconds) until every task's future is gone. An aborted task may be
//!   copying into its destination on a worker thread at that moment; only
//!   once its future has been dropped can the owner lend the range to
//!   another read. A task still running after the wait keeps its range,
//!   and the mapping, alive.

use crate::source::queue::{poll_rounds, IoCompletion};
use granary_shm::arena::ArenaSlice;
use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::AbortHandle;

/// How long dropping a queue waits for cancelled requests to let go of
/// their destinations.
const DROP_DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Counters of a fetcher since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Requests accepted.
    pub requests: u64,
    /// Attempts made: one per request that ran (a request refused before
    /// running makes none).
    pub attempts: u64,
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
    timeouts: AtomicU64,
    failures: AtomicU64,
    bytes: AtomicU64,
}

/// State shared by the owner and the tasks.
struct Shared {
    /// Finished requests: (internal id, completion).
    done: Mutex<Vec<(u64, IoCompletion)>>,
    /// An eventfd, signalled by the push that makes `done` non-empty.
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

/// The destination of one request: the first `len` bytes of an arena
/// range, held by the request's task. Only [`TaskQueue::spawn`] makes one.
#[derive(Clone)]
pub(crate) struct Dest {
    slice: ArenaSlice,
    len: usize,
}

impl Dest {
    /// The destination's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `bytes` to `at..at + bytes.len()`, which must lie within the
    /// destination (it panics otherwise; callers check first, and turn a
    /// body or blob that does not fit into an error).
    pub(crate) fn write(&self, at: usize, bytes: &[u8]) {
        assert!(
            at <= self.len && bytes.len() <= self.len - at,
            "write of {} bytes at {at} into a destination of {}",
            bytes.len(),
            self.len
        );
        self.slice.copy_at(at, bytes);
    }
}

/// A failed attempt as [`Attempts::once`] counts it.
pub(crate) trait AttemptFailure {
    /// The kind it is reported with (`TimedOut` counts as a timeout).
    fn kind(&self) -> io::ErrorKind;
}

/// What a task gets besides its destination: the counters its attempt is
/// tallied in.
pub(crate) struct Attempts {
    shared: Arc<Shared>,
}

impl Attempts {
    /// Runs the request's one attempt and counts it (and its timeout, if
    /// it ran out of time). A failed request is retried, if at all, by the
    /// engine's retry policy, as a new request.
    pub(crate) async fn once<E, Fut>(&self, attempt: Fut) -> Result<(), E>
    where
        E: AttemptFailure,
        Fut: Future<Output = Result<(), E>>,
    {
        let c = &self.shared.counters;
        c.attempts.fetch_add(1, Ordering::Relaxed);
        let r = attempt.await;
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::TimedOut {
                c.timeouts.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
}

/// Requests as tasks on a runtime, completions to one owner; see the
/// [module documentation](self).
pub(crate) struct TaskQueue {
    runtime: Arc<Runtime>,
    capacity: u32,
    /// Who owns the queue (`"S3 fetcher"`), for the drop's message.
    owner: &'static str,
    shared: Arc<Shared>,
    /// Requests that completed without running (bad input).
    ready: Vec<IoCompletion>,
    /// Abort handles of running tasks, by internal id.
    running: HashMap<u64, AbortHandle>,
    next_id: u64,
    in_flight: usize,
}

impl TaskQueue {
    /// A queue running its tasks on `runtime`, `capacity` at a time, for a
    /// fetcher whose attempts are limited to `request_timeout` (`owner`
    /// names it in messages). Fails when the capacity or the timeout is
    /// zero, or the eventfd cannot be created.
    pub fn new(
        runtime: Arc<Runtime>,
        capacity: u32,
        request_timeout: Duration,
        owner: &'static str,
    ) -> io::Result<TaskQueue> {
        if capacity == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fetch capacity must be at least 1",
            ));
        }
        if request_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request timeout must be above zero",
            ));
        }
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            event: File::from(crate::sys::eventfd::eventfd()?),
            live: Mutex::new(0),
            live_cv: Condvar::new(),
            counters: Counters::default(),
        });
        Ok(TaskQueue {
            runtime,
            capacity,
            owner,
            shared,
            ready: Vec::new(),
            running: HashMap::new(),
            next_id: 0,
            in_flight: 0,
        })
    }

    /// The most requests in flight at once.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Requests accepted whose completion has not been returned yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether `capacity` requests are in flight: the owner's `submit`
    /// gives the request back instead of calling `reject` or `spawn`.
    pub(crate) fn is_full(&self) -> bool {
        self.in_flight >= self.capacity as usize
    }

    /// Counters since the queue was created.
    pub(crate) fn stats(&self) -> FetchStats {
        let c = &self.shared.counters;
        FetchStats {
            requests: c.requests.load(Ordering::Relaxed),
            attempts: c.attempts.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        }
    }

    /// An eventfd that is readable while completions may be pending; it is
    /// cleared by [`poll_completions`](Self::poll_completions).
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.as_fd()
    }

    /// Accepts request `tag` and completes it at once with `err`, without
    /// running anything (bad input); it counts as a request and a failure.
    pub(crate) fn reject(&mut self, tag: u64, err: io::Error) {
        debug_assert!(!self.is_full());
        self.in_flight += 1;
        let c = &self.shared.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.failures.fetch_add(1, Ordering::Relaxed);
        self.ready.push(IoCompletion {
            tag,
            result: Err(err),
        });
    }

    /// Accepts request `tag` and starts it at once on the runtime, without
    /// blocking: `task` gets the destination (the first `len` bytes of
    /// `dest`, which must hold them) and the request's [`Attempts`], and
    /// returns the future that fetches. Its output — the bytes delivered,
    /// or the error — becomes the completion. The task holds `dest` until
    /// its future is dropped.
    pub(crate) fn spawn<F, Fut>(&mut self, tag: u64, dest: ArenaSlice, len: u32, task: F)
    where
        F: FnOnce(Dest, Attempts) -> Fut,
        Fut: Future<Output = io::Result<u32>> + Send + 'static,
    {
        debug_assert!(!self.is_full());
        self.in_flight += 1;
        self.shared
            .counters
            .requests
            .fetch_add(1, Ordering::Relaxed);
        let id = self.next_id;
        self.next_id += 1;
        *self.shared.live.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let guard = LiveGuard(self.shared.clone());
        debug_assert!(len as usize <= dest.len());
        let dest = Dest {
            len: (len as usize).min(dest.len()),
            slice: dest,
        };
        let attempts = Attempts {
            shared: self.shared.clone(),
        };
        let fetch = task(dest, attempts);
        let shared = self.shared.clone();
        let run = async move {
            let _guard = guard;
            let result = fetch.await;
            let c = &shared.counters;
            match &result {
                Ok(n) => c.bytes.fetch_add(u64::from(*n), Ordering::Relaxed),
                Err(_) => c.failures.fetch_add(1, Ordering::Relaxed),
            };
            // Only the push into an empty queue signals: the owner clears
            // the eventfd before it takes the whole queue, so a queue that is
            // not empty always has a signal pending (one wake-up per drain,
            // not per completion).
            let first = {
                let mut done = shared.done.lock().unwrap_or_else(|p| p.into_inner());
                done.push((id, IoCompletion { tag, result }));
                done.len() == 1
            };
            if first {
                shared.signal();
            }
        };
        let handle = self.runtime.spawn(run);
        self.running.insert(id, handle.abort_handle());
    }

    /// Appends finished requests to `out` and returns how many it appended.
    /// With `wait` `None` it does not block; with `Some(d)` and requests in
    /// flight it waits until at least one finishes or `d` has passed.
    pub(crate) fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<IoCompletion>,
    ) -> io::Result<usize> {
        let round = |s: &mut Self, out: &mut Vec<IoCompletion>| {
            s.shared.clear();
            s.in_flight -= s.ready.len();
            out.append(&mut s.ready);
            let done =
                std::mem::take(&mut *s.shared.done.lock().unwrap_or_else(|p| p.into_inner()));
            s.in_flight -= done.len();
            for (id, c) in done {
                s.running.remove(&id);
                out.push(c);
            }
            Ok(s.in_flight)
        };
        poll_rounds(self, wait, out, round, |s| s.shared.event.as_fd())
    }
}

impl Drop for TaskQueue {
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
                    "granary: {} dropped with {} request(s) still running after {:?}",
                    self.owner, *live, DROP_DRAIN_LIMIT
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
