//! The S3 fetcher: sample GETs in flight on a tokio runtime, bodies copied
//! straight into the caller's memory, completions handed back to a
//! single-threaded owner.
//!
//! The owner (the engine, a test, a benchmark) calls [`S3Fetcher::submit`]
//! — which never blocks — up to [`S3Fetcher::capacity`] times, and collects
//! finished requests with [`S3Fetcher::poll_completions`], in any order,
//! exactly like `crate::source::fs::reader::UringReader`; the completions
//! are the same [`IoCompletion`](crate::source::queue::IoCompletion) type. Each accepted request becomes one
//! task on the runtime's worker threads:
//!
//! 1. a GET of the object (a ranged GET for a range of it), under a timeout
//!    that covers headers and body ([`FetchOptions::request_timeout`]);
//! 2. the body, chunk by chunk as the HTTP client receives it, copied into
//!    `dest` at its offset — the only copy of the bytes; a body longer or
//!    shorter than the requested length is an error naming the key;
//! 3. one attempt: on failure, [`super::classify`] says whether another
//!    may succeed (timeouts, connection errors, HTTP 5xx/429/408) or not
//!    (404, 403 and other client errors), in the error's [`FetchError`];
//!    the engine's retry policy decides whether to fetch again;
//! 4. the completion is queued and the fetcher's eventfd
//!    (`S3Fetcher::wake_fd`) is signalled, so an owner that waits on
//!    several descriptors wakes up.
//!
//! Dropping the fetcher cancels the requests still running and waits until
//! none can touch its destination any more. Everything but the GET itself
//! (admission, tasks, the completion queue and eventfd, attempts and their
//! counters, the drop) is the task queue the CQL fetcher uses too
//! (`source/task_queue.rs`).

use super::{classify, FetchError};
pub use crate::source::queue::Full;
use crate::source::queue::{Changed, IoCompletion as Completion, QueuedRequest};
pub use crate::source::task_queue::FetchStats;
use crate::source::task_queue::{AttemptFailure, Attempts, Dest, TaskQueue};
use futures_util::StreamExt;
use granary_shm::arena::ArenaSlice;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

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
    /// The object's ETag when it was catalogued, if known: the GET carries
    /// `If-Match`, and a response naming another ETag is refused too (for
    /// stores that ignore the header). Either way the sample fails as
    /// [`Changed`].
    pub etag: Option<Arc<str>>,
    /// Destination: the arena range reserved for this fetch, at least `len`
    /// bytes; the fetcher holds it until the completion is returned.
    pub dest: ArenaSlice,
}

impl FetchRequest {
    /// A whole-object fetch.
    pub fn whole(tag: u64, key: impl Into<ObjectPath>, len: u32, dest: ArenaSlice) -> FetchRequest {
        FetchRequest {
            tag,
            key: key.into(),
            offset: 0,
            len,
            whole_object: true,
            etag: None,
            dest,
        }
    }

    /// A ranged fetch of `len` bytes at `offset`.
    pub fn range(
        tag: u64,
        key: impl Into<ObjectPath>,
        offset: u64,
        len: u32,
        dest: ArenaSlice,
    ) -> FetchRequest {
        FetchRequest {
            tag,
            key: key.into(),
            offset,
            len,
            whole_object: false,
            etag: None,
            dest,
        }
    }
}

impl QueuedRequest for FetchRequest {
    const QUEUE: &'static str = "fetch";
    fn tag(&self) -> u64 {
        self.tag
    }
}

/// Options of a fetcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// Most requests in flight at once. Default 256.
    pub capacity: u32,
    /// Time limit of one attempt, from sending the request to the last body
    /// byte. Default 10 s.
    pub request_timeout: Duration,
    /// Worker threads of the runtime a [`super::S3Source`] creates.
    /// Default 2.
    pub worker_threads: usize,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            capacity: 256,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
            worker_threads: 2,
        }
    }
}

/// An attempt's failure, before it becomes a completion error.
struct AttemptError {
    kind: io::ErrorKind,
    retryable: bool,
    message: String,
    /// The object is not the version catalogued (size or ETag): reported as
    /// [`Changed`], not as a fetch error.
    changed: Option<Changed>,
}

impl AttemptFailure for AttemptError {
    fn kind(&self) -> io::ErrorKind {
        self.kind
    }
}

impl AttemptError {
    fn from_store(e: &object_store::Error) -> AttemptError {
        let f = classify(e);
        AttemptError {
            kind: f.kind,
            retryable: f.retryable,
            message: format!("{}: {e}", f.what),
            changed: None,
        }
    }

    /// The object is not the version catalogued: `what` says how.
    fn changed(key: &str, what: String, size_differs: bool) -> AttemptError {
        AttemptError {
            kind: io::ErrorKind::Other,
            retryable: false,
            message: what.clone(),
            changed: Some(Changed {
                target: format!("GET {key}"),
                what,
                size_differs,
            }),
        }
    }
}

/// Non-blocking S3 fetches with completions in any order; see the
/// [module documentation](self).
pub struct S3Fetcher {
    queue: TaskQueue,
    store: Arc<dyn ObjectStore>,
    options: FetchOptions,
}

impl fmt::Debug for S3Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Fetcher")
            .field("store", &self.store.to_string())
            .field("options", &self.options)
            .field("in_flight", &self.queue.in_flight())
            .finish()
    }
}

impl S3Fetcher {
    /// A fetcher that runs its requests on `runtime` through `store`.
    /// Fails when `options.capacity` or `options.request_timeout` is 0, or
    /// the eventfd cannot be created.
    pub fn new(
        runtime: Arc<Runtime>,
        store: Arc<dyn ObjectStore>,
        options: FetchOptions,
    ) -> io::Result<S3Fetcher> {
        let queue = TaskQueue::new(
            runtime,
            options.capacity,
            options.request_timeout,
            "S3 fetcher",
        )?;
        Ok(S3Fetcher {
            queue,
            store,
            options,
        })
    }

    /// The most requests in flight at once.
    pub fn capacity(&self) -> u32 {
        self.queue.capacity()
    }

    /// Requests accepted whose completion has not been returned yet.
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight()
    }

    /// The options.
    pub fn options(&self) -> &FetchOptions {
        &self.options
    }

    /// Counters since the fetcher was created.
    pub fn stats(&self) -> FetchStats {
        self.queue.stats()
    }

    /// An eventfd that is readable while completions may be pending (it is
    /// cleared by [`poll_completions`](Self::poll_completions)); an owner
    /// waiting on several descriptors adds it to its poll set.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.queue.wake_fd()
    }

    /// Accepts `req`, or gives it back in [`Full`] when `capacity` requests
    /// are in flight. The request starts at once on the runtime; it never
    /// blocks the caller. A request whose `dest` is shorter than its length
    /// or whose range ends past `u64::MAX` completes with an `InvalidInput`
    /// error.
    ///
    /// The request's task holds `req.dest` (and so the arena's mapping)
    /// until it ends; dropping the fetcher cancels outstanding requests and
    /// waits, up to 30 seconds, until none can write any more.
    pub fn submit(&mut self, req: FetchRequest) -> Result<(), Full<FetchRequest>> {
        if self.queue.is_full() {
            return Err(Full(req));
        }
        let bad = req.dest.len() < req.len as usize
            || req.offset.checked_add(u64::from(req.len)).is_none();
        if bad {
            let why = "destination shorter than the length, or a range past u64::MAX";
            let err = FetchError::refused(target(req.key.as_ref(), None), why.to_owned());
            self.queue.reject(req.tag, err);
            return Ok(());
        }
        let store = self.store.clone();
        let timeout = self.options.request_timeout;
        let spec = Spec {
            key: req.key,
            offset: req.offset,
            len: req.len,
            whole_object: req.whole_object,
            etag: req.etag,
        };
        let task = move |dest, attempts| async move {
            fetch(&*store, &spec, dest, timeout, &attempts).await
        };
        self.queue.spawn(req.tag, req.dest, req.len, task);
        Ok(())
    }

    /// Accepts request `tag` and completes it at once with an
    /// `InvalidInput` error about `key` saying `why` (a sample no request
    /// can carry); gives the tag back in [`Full`] when `capacity` requests
    /// are in flight.
    pub(crate) fn reject(&mut self, tag: u64, key: String, why: String) -> Result<(), Full<u64>> {
        if self.queue.is_full() {
            return Err(Full(tag));
        }
        self.queue
            .reject(tag, FetchError::refused(target(&key, None), why));
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
        self.queue.poll_completions(wait, out)
    }
}

/// What a task fetches (a [`FetchRequest`] without its destination).
struct Spec {
    key: ObjectPath,
    offset: u64,
    len: u32,
    whole_object: bool,
    etag: Option<Arc<str>>,
}

/// Runs one request: one attempt under the timeout.
async fn fetch(
    store: &dyn ObjectStore,
    req: &Spec,
    dest: Dest,
    timeout: Duration,
    attempts: &Attempts,
) -> io::Result<u32> {
    let one = async move {
        tokio::time::timeout(timeout, attempt(store, req, dest))
            .await
            .unwrap_or_else(|_| {
                Err(AttemptError {
                    kind: io::ErrorKind::TimedOut,
                    retryable: true,
                    message: format!(
                        "timed out: no complete response within {} ms",
                        timeout.as_millis()
                    ),
                    changed: None,
                })
            })
    };
    match attempts.once(one).await {
        Ok(()) => Ok(req.len),
        Err(AttemptError {
            changed: Some(changed),
            ..
        }) => Err(io::Error::other(changed)),
        Err(err) => Err(io::Error::new(
            err.kind,
            FetchError {
                target: target(
                    req.key.as_ref(),
                    (!req.whole_object).then(|| (req.offset, req.offset + u64::from(req.len))),
                ),
                attempts: 1,
                retryable: err.retryable,
                message: err.message,
            },
        )),
    }
}

/// What a fetch error names: `GET key`, with `bytes a..b` for a range.
fn target(key: &str, range: Option<(u64, u64)>) -> String {
    match range {
        Some((a, b)) => format!("GET {key} bytes {a}..{b}"),
        None => format!("GET {key}"),
    }
}

/// One GET attempt, its body streamed into `dest`.
async fn attempt(store: &dyn ObjectStore, req: &Spec, dest: Dest) -> Result<(), AttemptError> {
    let want = u64::from(req.len);
    let mut opts = GetOptions {
        if_match: req.etag.as_deref().map(str::to_owned),
        ..GetOptions::default()
    };
    if !req.whole_object {
        if req.len == 0 {
            return Ok(());
        }
        opts.range = Some(GetRange::Bounded(req.offset..req.offset + want));
    }
    let key = req.key.as_ref();
    let res = match store.get_opts(&req.key, opts).await {
        Ok(res) => res,
        Err(object_store::Error::Precondition { .. }) => {
            let what = format!(
                "the store refused If-Match {} (HTTP 412): the object was replaced",
                req.etag.as_deref().unwrap_or_default()
            );
            return Err(AttemptError::changed(key, what, false));
        }
        Err(e) => return Err(AttemptError::from_store(&e)),
    };
    let mismatch = |got: String| AttemptError {
        kind: io::ErrorKind::InvalidData,
        retryable: false,
        message: format!("length mismatch: expected {want} bytes, {got}"),
        changed: None,
    };
    if let (Some(want), Some(got)) = (req.etag.as_deref(), res.meta.e_tag.as_deref()) {
        // Compared without their quotes: some stores quote an ETag in a
        // response's header but not in a listing (fake-gcs-server does).
        if want.trim_matches('"') != got.trim_matches('"') {
            let what = format!("ETag {got} (catalogued {want})");
            return Err(AttemptError::changed(key, what, false));
        }
    }
    if req.whole_object && res.meta.size != want {
        let what = format!("size {} (catalogued {want})", res.meta.size);
        return Err(AttemptError::changed(key, what, true));
    }
    let served = res.range.end - res.range.start;
    if served != want {
        return Err(mismatch(format!("the server sent a range of {served}")));
    }
    let mut at = 0usize;
    let mut body = res.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| AttemptError::from_store(&e))?;
        if at + chunk.len() > dest.len() {
            return Err(mismatch(format!(
                "the body holds more than {}",
                at + chunk.len() - 1
            )));
        }
        dest.write(at, &chunk);
        at += chunk.len();
    }
    if at != dest.len() {
        return Err(mismatch(format!("the body ended after {at}")));
    }
    Ok(())
}
