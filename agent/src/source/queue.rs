//! The I/O vocabulary of the readers and fetchers below the sources: the
//! io_uring reader (`fs::reader`) and the S3 and CQL fetchers all take
//! requests without blocking, give them back in [`Full`] when their queue
//! is full, and hand back one [`IoCompletion`] per request, in any order.
//! A source turns those into [`super::Completion`]s (`Landing`).

use super::{Completion, FailureKind, SampleError};
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// The outcome of one request of a reader or fetcher.
#[derive(Debug)]
pub struct IoCompletion {
    /// The request's tag.
    pub tag: u64,
    /// The number of bytes delivered (always the requested length), or the
    /// error, which names the file, key or row.
    pub result: io::Result<u32>,
}

/// Returned by a non-blocking `submit` when as many requests as it accepts
/// are already in flight; it gives the request back.
#[derive(Debug)]
pub struct Full<R>(pub R);

/// A request of a non-blocking reader or fetcher, as [`Full`] names it.
pub(crate) trait QueuedRequest {
    /// What the queue is of, for messages: `"read"`, `"fetch"`.
    const QUEUE: &'static str;
    /// The caller's identifier.
    fn tag(&self) -> u64;
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

/// The conversion of a reader's or fetcher's completions into
/// [`Completion`]s. (The arena ranges of reads in flight are held by the
/// reader or fetcher itself, from submission to completion, and leaked if
/// it is dropped before its reads could be confirmed to have ended.)
#[derive(Debug, Default)]
pub(crate) struct Landing {
    raw: Vec<IoCompletion>,
}

impl Landing {
    /// Polls `reader` and converts what finished.
    pub(crate) fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        reader: impl FnOnce(&mut Vec<IoCompletion>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.raw.clear();
        reader(&mut self.raw)?;
        let n = self.raw.len();
        for c in self.raw.drain(..) {
            out.push(Completion {
                tag: c.tag,
                result: c.result.map_err(|e| SampleError::from_io(&e)),
            });
        }
        Ok(n)
    }
}

/// The error of a failed fetch from a store (S3, CQL), inside the
/// `io::Error` of its completion: what was fetched, what went wrong, and
/// whether another attempt may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    /// What was fetched: `GET key bytes a..b`, `cql://ks.data/<id>`.
    pub target: String,
    /// Attempts made (0: refused before running).
    pub attempts: u32,
    /// Whether the failure may go away by itself (timeouts, connection
    /// errors, overload).
    pub retryable: bool,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.target, self.message)?;
        if self.attempts > 1 {
            write!(f, " (after {} attempts)", self.attempts)?;
        }
        Ok(())
    }
}

impl std::error::Error for FetchError {}

impl FetchError {
    /// A request about `target` refused before any attempt (bad input the
    /// request cannot carry), as the `InvalidInput` error of its completion.
    pub(crate) fn refused(target: String, message: String) -> io::Error {
        let err = FetchError {
            target,
            attempts: 0,
            retryable: false,
            message,
        };
        io::Error::new(io::ErrorKind::InvalidInput, err)
    }
}

/// A sample whose file or object is no longer what its catalog recorded
/// (its size, modification time, version or checksum differ), inside the
/// `io::Error` of its completion. Final: reading again gives the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The file, key or row.
    pub target: String,
    /// What differs, with both values.
    pub what: String,
    /// Whether the size is what differs (reported as a short read).
    pub size_differs: bool,
}

impl fmt::Display for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: changed since the catalog was made: {}",
            self.target, self.what
        )
    }
}

impl std::error::Error for Changed {}

/// The [`Changed`] error inside `err`, if there is one.
pub fn changed(err: &io::Error) -> Option<&Changed> {
    err.get_ref().and_then(|e| e.downcast_ref::<Changed>())
}

/// The fetch error inside `err`, if there is one.
pub fn fetch_error(err: &io::Error) -> Option<&FetchError> {
    err.get_ref().and_then(|e| e.downcast_ref::<FetchError>())
}

/// Whether a failed fetch may go away on its own: the [`FetchError`]
/// inside says so; other errors are judged by their [`FailureKind`].
pub fn is_retryable(err: &io::Error) -> bool {
    match fetch_error(err) {
        Some(f) => f.retryable,
        None => FailureKind::retryable(SampleError::from_io(err).kind),
    }
}

/// The loop of every `poll_completions` over completions gathered in
/// rounds: `round(src, out)` moves what completed into `out` and returns
/// how many requests are still in flight. With `wait` `None` one round;
/// with `Some(d)` rounds until something completed, nothing is in flight,
/// or `d` has passed, waiting on `fd(src)` between rounds. Returns how
/// many completions it appended.
pub(crate) fn poll_rounds<S: ?Sized, T>(
    src: &mut S,
    wait: Option<Duration>,
    out: &mut Vec<T>,
    mut round: impl FnMut(&mut S, &mut Vec<T>) -> io::Result<usize>,
    fd: impl Fn(&S) -> BorrowedFd<'_>,
) -> io::Result<usize> {
    let start = out.len();
    let deadline = wait.map(|d| Instant::now() + d);
    loop {
        let in_flight = round(src, out)?;
        if out.len() > start || in_flight == 0 {
            break;
        }
        let Some(deadline) = deadline else { break };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        crate::sys::eventfd::wait_readable(fd(src), left)?;
    }
    Ok(out.len() - start)
}
