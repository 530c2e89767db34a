//! The CQL fetcher: prepared sample reads in flight on a tokio runtime,
//! blobs copied once into the caller's memory, completions handed back to
//! a single-threaded owner.
//!
//! The owner calls [`CqlFetcher::submit`] — which never blocks — up to
//! [`CqlFetcher::capacity`] times, and collects finished reads with
//! [`CqlFetcher::poll_completions`], in any order, exactly like
//! `crate::source::fs::reader::UringReader` and the S3 fetcher. Each accepted
//! request becomes one task on the runtime:
//!
//! 1. one execution of the prepared `SELECT data FROM ks.data WHERE id = ?`,
//!    routed by the driver to a replica of the id's partition, under the
//!    per-attempt timeout (the statement's request timeout);
//! 2. the blob deserialized as a slice borrowed from the response frame —
//!    the bytes the driver received — and copied once into `dest`; no row is
//!    an error naming the id (`NotFound`), and so is a blob whose length is
//!    not the catalog's;
//! 3. one attempt: on failure, [`super::classify`] says whether another
//!    may succeed (timeouts, broken connections, overloaded, unavailable,
//!    read timeouts); the engine's retry policy decides on another;
//! 4. the completion is queued and the eventfd (`CqlFetcher::wake_fd`) is
//!    signalled.
//!
//! The driver multiplexes every request over its pools (up to 32768
//! streams per connection), so thousands in flight cost a task each, not a
//! thread or a connection. Dropping the fetcher cancels the requests still
//! running and waits until none can touch its destination any more.
//! Everything but the read itself (admission, tasks, the completion queue
//! and eventfd, attempts and their counters, the drop) is the task queue
//! the S3 fetcher uses too (`source/task_queue.rs`).

use super::{AttemptError, FetchError};
pub use crate::source::queue::Full;
use crate::source::queue::{Changed, IoCompletion as Completion, QueuedRequest};
pub use crate::source::task_queue::FetchStats;
use crate::source::task_queue::{AttemptFailure, Attempts, Dest, TaskQueue};
use granary_shm::arena::ArenaSlice;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use uuid::Uuid;

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
    /// The blob's CRC-32C according to the catalog (the metadata table's
    /// `crc` column, written by `granary ingest`), if it has one: a blob
    /// with another CRC fails as changed.
    pub crc: Option<u32>,
    /// Destination: the arena range reserved for this read, at least `len`
    /// bytes; the fetcher holds it until the completion is returned.
    pub dest: ArenaSlice,
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
    /// Most requests in flight at once. Default 2048.
    pub capacity: u32,
    /// Time limit of one attempt. Default 10 s.
    pub request_timeout: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            capacity: super::DEFAULT_MAX_INFLIGHT,
            request_timeout: super::DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl AttemptFailure for AttemptError {
    fn kind(&self) -> io::ErrorKind {
        self.failure.kind
    }
}

/// Non-blocking CQL sample reads with completions in any order; see the
/// [module documentation](self).
pub struct CqlFetcher {
    queue: TaskQueue,
    session: Arc<Session>,
    statement: PreparedStatement,
    table: Arc<str>,
    options: FetchOptions,
}

impl fmt::Debug for CqlFetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlFetcher")
            .field("table", &self.table)
            .field("options", &self.options)
            .field("in_flight", &self.queue.in_flight())
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
        let queue = TaskQueue::new(
            runtime,
            options.capacity,
            options.request_timeout,
            "CQL fetcher",
        )?;
        statement.set_request_timeout(Some(options.request_timeout));
        Ok(CqlFetcher {
            queue,
            session,
            statement,
            table: table.into(),
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

    /// Whether the driver routes the statement by token (it knows the
    /// partition key's position among the bound values).
    pub fn is_token_aware(&self) -> bool {
        self.statement.is_token_aware()
    }

    /// Counters since the fetcher was created.
    pub fn stats(&self) -> FetchStats {
        self.queue.stats()
    }

    /// An eventfd that is readable while completions may be pending (it is
    /// cleared by [`poll_completions`](Self::poll_completions)).
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.queue.wake_fd()
    }

    /// Accepts `req`, or gives it back in [`Full`] when `capacity` requests
    /// are in flight. The request starts at once on the runtime; this never
    /// blocks. A request whose `dest` is shorter than its length completes
    /// with an `InvalidInput` error.
    ///
    /// The request's task holds `req.dest` (and so the arena's mapping)
    /// until it ends; dropping the fetcher cancels outstanding requests and
    /// waits, up to 30 seconds, until none can write any more.
    pub fn submit(&mut self, req: FetchRequest) -> Result<(), Full<FetchRequest>> {
        if self.queue.is_full() {
            return Err(Full(req));
        }
        if req.dest.len() < req.len as usize {
            let target = format!("cql://{}/{}", self.table, req.id);
            let why = format!(
                "destination of {} bytes for a blob of {}",
                req.dest.len(),
                req.len
            );
            self.queue.reject(req.tag, FetchError::refused(target, why));
            return Ok(());
        }
        let job = Job {
            session: self.session.clone(),
            statement: self.statement.clone(),
            table: self.table.clone(),
            row: req.id,
            crc: req.crc,
        };
        let task = move |dest: Dest, attempts: Attempts| async move {
            let job = &job;
            let len = dest.len() as u32;
            match attempts.once(job.attempt(dest)).await {
                Ok(()) => Ok(len),
                Err(err) => Err(job.failed(err)),
            }
        };
        self.queue.spawn(req.tag, req.dest, req.len, task);
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

/// What one request's task needs besides its destination.
struct Job {
    session: Arc<Session>,
    statement: PreparedStatement,
    table: Arc<str>,
    row: Uuid,
    crc: Option<u32>,
}

impl Job {
    /// One execution; the blob copied into `dest`.
    async fn attempt(&self, dest: Dest) -> Result<(), AttemptError> {
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
        if blob.len() != dest.len() {
            return Err(invalid(format!(
                "length mismatch: the metadata table says {} bytes, the blob of {} holds {}",
                dest.len(),
                self.row,
                blob.len()
            )));
        }
        if let Some(want) = self.crc {
            let got = crc32c::crc32c(blob);
            if got != want {
                return Err(AttemptError::changed(Changed {
                    target: self.target(),
                    what: format!("CRC-32C {got:#010x} (catalogued {want:#010x})"),
                    size_differs: false,
                }));
            }
        }
        dest.write(0, blob);
        Ok(())
    }

    /// What errors name: `cql://ks.table/<id>`.
    fn target(&self) -> String {
        format!("cql://{}/{}", self.table, self.row)
    }

    /// The completion's error after the last failed attempt.
    fn failed(&self, err: AttemptError) -> io::Error {
        if let Some(changed) = err.changed {
            return io::Error::other(changed);
        }
        io::Error::new(
            err.failure.kind,
            FetchError {
                target: self.target(),
                attempts: 1,
                retryable: err.failure.retryable,
                message: err.message,
            },
        )
    }
}
