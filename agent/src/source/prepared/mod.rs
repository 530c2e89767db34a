//! A dataset's prepare stage (`[dataset.prepare]`, docs/prepare.md): a
//! [`SampleSource`] over the dataset's own source that hands the engine
//! decoded and resized samples instead of the stored bytes.
//!
//! * **Catalog.** Every sample's size is the output's, height × width × 3
//!   bytes, known before anything is read: the planner, the cache's extents
//!   and its eviction by bytes work on it unchanged. A sample's version
//!   token is the stored sample's followed by the prepare settings
//!   ([`image::Spec::token`]), so that agents that prepare a dataset
//!   differently get other fingerprints and never exchange its samples.
//! * **Reads.** [`submit`](SampleSource::submit) reads the stored bytes
//!   into an extent of a private staging buffer (`prepare.staging_bytes`,
//!   outside the arena); when the read completes, a job goes to a bounded
//!   queue of `prepare.threads` workers, which decode and resize straight
//!   into the sample's extent of the arena; the staging extent is then
//!   freed and the completion returned. Only then does the engine make the
//!   sample Ready, its CRC-32C over the prepared bytes. Nothing here
//!   blocks the engine's thread: a full staging buffer or a full source is
//!   [`SourceFull`], tried again next turn.
//! * **Failures.** A failed read keeps its kind (the engine's retry policy
//!   decides); bytes that do not decode, a file over `max_input_bytes` and
//!   a JPEG over `max_pixels` fail with [`FailureKind::Decode`], never
//!   retried, which the loader sees as `DECODE`.
//! * **Waking.** [`wait_fd`](SampleSource::wait_fd) is an epoll descriptor
//!   over the inner source's and the workers' eventfd.

pub mod image;

use super::queue::poll_rounds;
use super::{Completion, FailureKind, SampleError, SampleMeta, SampleSource, SourceFull};
use crate::config::PrepareConfig;
use crate::extent::{Extent, ExtentAllocator};
use granary_shm::arena::{Arena, ArenaSlice};
use image::{PrepareError, Scratch, Spec};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Staging extents start and end on this boundary (an `O_DIRECT` read
/// writes whole 4 KiB blocks).
const STAGING_ALIGN: u64 = 4096;

/// One sample between its read and its completion.
struct Job {
    tag: u64,
    index: u64,
    /// Its extent of the staging buffer.
    extent: Extent,
    /// The stored bytes, once read (`extent`'s first bytes).
    raw: Option<ArenaSlice>,
    /// The sample's extent of the arena, where the output goes.
    dest: ArenaSlice,
}

/// A worker's answer: the job's tag, index and staging extent, and how the
/// preparation went.
type Done = (u64, u64, Extent, Result<(), PrepareError>);

/// What the workers hand back, with the eventfd they signal.
struct Finished {
    done: Mutex<Vec<Done>>,
    event: File,
}

impl Finished {
    fn push(&self, d: Done) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        // A failed write costs only a wake-up: poll_completions drains the
        // list without one.
        let _ = (&self.event).write(&1u64.to_ne_bytes());
    }

    /// Wakes the owner for completions it queued itself.
    fn push_wake(&self) {
        let _ = (&self.event).write(&1u64.to_ne_bytes());
    }

    fn take(&self, out: &mut Vec<Done>) {
        let mut buf = [0u8; 8];
        let _ = (&self.event).read(&mut buf);
        out.append(&mut self.done.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// A dataset's source with its prepare stage (the module's doc).
pub struct PreparedSource {
    inner: Box<dyn SampleSource>,
    spec: Spec,
    max_input: u64,
    staging: Arena,
    staged: ExtentAllocator,
    /// Stored reads in flight, by tag.
    reading: HashMap<u64, Job>,
    /// Jobs handed to the workers and not yet back.
    preparing: usize,
    /// Completions ready to return (failures found at submit or at read).
    ready: Vec<Completion>,
    jobs: Option<SyncSender<Job>>,
    finished: Arc<Finished>,
    workers: Vec<JoinHandle<()>>,
    epoll: Epoll,
    raw_done: Vec<Completion>,
    prepared_done: Vec<Done>,
}

impl PreparedSource {
    /// `inner` with the prepare stage `cfg`: starts its workers and
    /// allocates its staging buffer.
    pub fn new(inner: Box<dyn SampleSource>, cfg: &PrepareConfig) -> io::Result<PreparedSource> {
        let spec = Spec::from_config(cfg);
        let max_input = cfg.max_input_bytes.bytes();
        let size = cfg
            .staging_bytes
            .bytes()
            .max(max_input)
            .next_multiple_of(STAGING_ALIGN);
        let staging = Arena::heap(size).map_err(io::Error::other)?;
        let queue = inner.capacity().max(1) as usize;
        let (tx, rx) = mpsc::sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let finished = Arc::new(Finished {
            done: Mutex::new(Vec::new()),
            event: File::from(crate::sys::eventfd::eventfd()?),
        });
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(inner.wait_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        epoll.add(&finished.event, EpollEvent::new(EpollFlags::EPOLLIN, 1))?;
        let mut workers = Vec::new();
        for i in 0..cfg.threads {
            let rx = Arc::clone(&rx);
            let finished = Arc::clone(&finished);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("granary-prep-{i}"))
                    .spawn(move || work(&rx, &finished, spec))?,
            );
        }
        Ok(PreparedSource {
            inner,
            spec,
            max_input,
            staging,
            staged: ExtentAllocator::new(size),
            reading: HashMap::new(),
            preparing: 0,
            ready: Vec::new(),
            jobs: Some(tx),
            finished,
            workers,
            epoll,
            raw_done: Vec::new(),
            prepared_done: Vec::new(),
        })
    }

    fn decode_error(&self, index: u64, e: &PrepareError) -> SampleError {
        SampleError::new(
            FailureKind::Decode,
            format!("prepare {}: {e}", self.inner.describe(index)),
        )
    }

    fn free(&mut self, extent: Extent) {
        if let Err(e) = self.staged.free(extent) {
            tracing::error!("prepare: staging extent {extent} not freed: {e:?}");
        }
    }

    /// Everything that finished, without waiting: stored reads go to the
    /// workers (or fail), prepared samples and failures to `out`.
    fn collect(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        self.raw_done.clear();
        self.inner.poll_completions(None, &mut self.raw_done)?;
        let raw_done = std::mem::take(&mut self.raw_done);
        for c in &raw_done {
            let Some(mut job) = self.reading.remove(&c.tag) else {
                continue;
            };
            let want = self.inner.meta(job.index).size;
            let failure = match &c.result {
                Ok(n) if u64::from(*n) == want => {
                    match self.staging.slice(job.extent.offset, *n as usize) {
                        Ok(raw) => {
                            job.raw = Some(raw);
                            match self.jobs.as_ref().map(|t| t.try_send(job)) {
                                Some(Ok(())) => {
                                    self.preparing += 1;
                                    continue;
                                }
                                Some(Err(
                                    TrySendError::Full(j) | TrySendError::Disconnected(j),
                                )) => {
                                    job = j;
                                    SampleError::new(
                                        FailureKind::Transient,
                                        "prepare: the workers' queue is full",
                                    )
                                }
                                None => unreachable!("the queue lives as long as the source"),
                            }
                        }
                        Err(e) => SampleError::new(FailureKind::Permanent, e.to_string()),
                    }
                }
                Ok(n) => SampleError::new(
                    FailureKind::Short,
                    format!(
                        "{}: returned {n} of {want} bytes (changed since the catalog was made?)",
                        self.inner.describe(job.index)
                    ),
                ),
                Err(e) => e.clone(),
            };
            self.free(job.extent);
            self.ready.push(Completion {
                tag: job.tag,
                result: Err(failure),
            });
        }
        self.raw_done = raw_done;
        out.append(&mut self.ready);

        self.prepared_done.clear();
        self.finished.take(&mut self.prepared_done);
        let done = std::mem::take(&mut self.prepared_done);
        let len = self.spec.output_bytes() as u32;
        for (tag, index, extent, result) in &done {
            self.preparing -= 1;
            self.free(*extent);
            out.push(Completion {
                tag: *tag,
                result: match result {
                    Ok(()) => Ok(len),
                    Err(e) => Err(self.decode_error(*index, e)),
                },
            });
        }
        self.prepared_done = done;
        Ok(())
    }
}

/// A worker: takes jobs until the queue closes.
fn work(rx: &Mutex<Receiver<Job>>, finished: &Finished, spec: Spec) {
    let mut scratch = Scratch::default();
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let n = spec.output_bytes();
        let result = match &job.raw {
            Some(raw) if job.dest.len() >= n => raw.with_bytes(|input| {
                job.dest.with_bytes_mut(|out| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        image::prepare(input, &spec, &mut scratch, &mut out[..n])
                    }))
                    .unwrap_or_else(|_| {
                        scratch = Scratch::default();
                        Err(PrepareError::Decode("the decoder panicked".to_owned()))
                    })
                })
            }),
            _ => Err(PrepareError::Resize(format!(
                "destination of {} bytes for {n}",
                job.dest.len()
            ))),
        };
        finished.push((job.tag, job.index, job.extent, result));
    }
}

impl SampleSource for PreparedSource {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn meta(&self, index: u64) -> SampleMeta {
        SampleMeta {
            size: self.spec.output_bytes() as u64,
            ..self.inner.meta(index)
        }
    }

    fn version(&self, index: u64, out: &mut Vec<u8>) {
        self.inner.version(index, out);
        self.spec.token(out);
    }

    fn total_bytes(&self) -> u64 {
        self.len() * self.spec.output_bytes() as u64
    }

    fn describe(&self, index: u64) -> String {
        self.inner.describe(index)
    }

    fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    fn in_flight(&self) -> usize {
        self.reading.len() + self.preparing + self.ready.len()
    }

    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        if self.in_flight() >= self.capacity() as usize {
            return Err(SourceFull);
        }
        let raw = self.inner.meta(index).size;
        let refuse = if raw > self.max_input {
            Some(PrepareError::TooLarge {
                bytes: raw,
                max: self.max_input,
            })
        } else if raw == 0 {
            Some(PrepareError::Decode("the file is empty".to_owned()))
        } else {
            None
        };
        if let Some(e) = refuse {
            let err = self.decode_error(index, &e);
            self.ready.push(Completion {
                tag,
                result: Err(err),
            });
            self.finished.push_wake();
            return Ok(());
        }
        let block = u64::from(self.inner.read_block().max(1));
        let span = raw.next_multiple_of(block);
        let Some(extent) = self
            .staged
            .alloc(span.next_multiple_of(STAGING_ALIGN), STAGING_ALIGN)
        else {
            return Err(SourceFull);
        };
        let slice = match self.staging.slice(extent.offset, span as usize) {
            Ok(s) => s,
            Err(_) => {
                self.free(extent);
                return Err(SourceFull);
            }
        };
        if self.inner.submit(tag, index, slice).is_err() {
            self.free(extent);
            return Err(SourceFull);
        }
        self.reading.insert(
            tag,
            Job {
                tag,
                index,
                extent,
                raw: None,
                dest,
            },
        );
        Ok(())
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let round = |s: &mut Self, out: &mut Vec<Completion>| {
            s.collect(out)?;
            Ok(s.in_flight())
        };
        poll_rounds(self, wait, out, round, |s| s.epoll.0.as_fd())
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }
}

impl Drop for PreparedSource {
    /// Closes the queue and waits for the workers, which finish the jobs
    /// queued (each holds its slices, so the memory outlives them).
    fn drop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests;
