//! A loader for the end-to-end benchmarks: one session through libgranary's
//! Rust API, every sample handed to a callback in place (no copy), every
//! batch released right after, and per-epoch timings.

use granary::{Client, ErrorCode, SessionOptions};
use std::time::{Duration, Instant};

/// A `next_batch` call longer than this counts as a long wait (the ready
/// ring was empty: the agent had not published the next batch yet).
pub const LONG_WAIT: Duration = Duration::from_micros(100);

/// How long one `next_batch` may wait before the run counts as stalled.
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(120);

/// What one epoch of a session delivered, seen from the loader.
#[derive(Clone, Copy, Debug)]
pub struct EpochRecord {
    /// The epoch.
    pub epoch: u32,
    /// Samples delivered.
    pub samples: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Batches delivered.
    pub batches: u64,
    /// When the previous epoch ended (its last batch released), or when the
    /// session was opened for the first epoch.
    pub start: Instant,
    /// When this epoch's last batch was released.
    pub end: Instant,
    /// Time spent inside `next_batch` (waiting for the agent).
    pub waited: Duration,
    /// `next_batch` calls that took longer than [`LONG_WAIT`].
    pub long_waits: u64,
    /// The longest `next_batch` call.
    pub max_wait: Duration,
}

impl EpochRecord {
    /// `end - start`.
    pub fn elapsed(&self) -> Duration {
        self.end.duration_since(self.start)
    }
}

/// A whole session's delivery.
#[derive(Clone, Debug)]
pub struct SessionRun {
    /// Time to open the session (handshake, mapping).
    pub open: Duration,
    /// From the session being open to its first batch.
    pub first_batch: Duration,
    /// Per epoch, in delivery order.
    pub epochs: Vec<EpochRecord>,
    /// Wrapping sum of the callback's results (keeps the touching loop alive).
    pub fold: u64,
}

impl SessionRun {
    /// Bytes, time and samples over the epochs from index `from` on.
    pub fn span(&self, from: usize) -> (u64, Duration, u64) {
        let tail = &self.epochs[from.min(self.epochs.len())..];
        let bytes = tail.iter().map(|e| e.bytes).sum();
        let samples = tail.iter().map(|e| e.samples).sum();
        let time = match (tail.first(), tail.last()) {
            (Some(a), Some(b)) => b.end.duration_since(a.start),
            _ => Duration::ZERO,
        };
        (bytes, time, samples)
    }
}

/// How the loader waits for its next batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `next_batch(timeout)`: the client's wait (a short spin, then a futex).
    Block,
    /// `try_next_batch()` in a loop: never parks (costs a core while waiting).
    Spin,
}

/// A sample as the callback sees it.
pub struct SampleRef<'a> {
    /// Epoch of its batch.
    pub epoch: u32,
    /// Sample id.
    pub id: u64,
    /// Label.
    pub label: i32,
    /// The bytes, in place in the arena.
    pub bytes: &'a [u8],
}

/// Opens a session with `opts` on `client` and consumes it to the end:
/// `per_sample` sees every sample's bytes in place; its results are summed
/// into [`SessionRun::fold`]. An error status on a batch or a sample, or a
/// callback error, ends the run with that error.
pub fn consume(
    client: &Client,
    opts: &SessionOptions,
    wait: Wait,
    mut per_sample: impl FnMut(&SampleRef<'_>) -> Result<u64, String>,
) -> Result<SessionRun, String> {
    let t_open = Instant::now();
    let mut session = client
        .open_session(opts)
        .map_err(|e| format!("open session: {e}"))?;
    let opened = Instant::now();
    let mut run = SessionRun {
        open: opened.duration_since(t_open),
        first_batch: Duration::ZERO,
        epochs: Vec::new(),
        fold: 0,
    };
    let mut cur: Option<EpochRecord> = None;
    let mut epoch_start = opened;
    loop {
        let t = Instant::now();
        let next = match wait {
            Wait::Block => session.next_batch(Some(BATCH_TIMEOUT)),
            Wait::Spin => loop {
                match session.try_next_batch() {
                    Err(e) if e.code() == ErrorCode::WouldBlock && t.elapsed() < BATCH_TIMEOUT => {
                        std::hint::spin_loop();
                    }
                    other => break other,
                }
            },
        };
        let batch = match next {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => return Err(format!("next_batch: {e}")),
        };
        let got = Instant::now();
        if run.first_batch.is_zero() {
            run.first_batch = got.duration_since(opened);
        }
        if let Some(code) = batch.error() {
            return Err(format!("batch {} failed: {code:?}", batch.seq()));
        }
        let rec = cur.get_or_insert(EpochRecord {
            epoch: batch.epoch(),
            samples: 0,
            bytes: 0,
            batches: 0,
            start: epoch_start,
            end: epoch_start,
            waited: Duration::ZERO,
            long_waits: 0,
            max_wait: Duration::ZERO,
        });
        let w = got.duration_since(t);
        rec.waited += w;
        rec.max_wait = rec.max_wait.max(w);
        rec.long_waits += u64::from(w > LONG_WAIT);
        rec.batches += 1;
        for s in batch.samples() {
            if s.status() != 0 {
                return Err(format!(
                    "sample {} failed with status {}",
                    s.id(),
                    s.status()
                ));
            }
            // SAFETY: the agent is this benchmark's own engine, which never
            // writes a sample's extent while the batch holding it is on
            // loan; the slice is dropped before the batch is released below.
            let bytes = unsafe { s.bytes() };
            let r = per_sample(&SampleRef {
                epoch: batch.epoch(),
                id: s.id(),
                label: s.label(),
                bytes,
            })?;
            run.fold = run.fold.wrapping_add(r);
            rec.samples += 1;
            rec.bytes += bytes.len() as u64;
        }
        let end_of_epoch = batch.is_end_of_epoch() || batch.is_end_of_stream();
        session
            .release(batch)
            .map_err(|e| format!("release: {e}"))?;
        if end_of_epoch {
            let mut done = cur.take().expect("set above");
            done.end = Instant::now();
            epoch_start = done.end;
            run.epochs.push(done);
        }
    }
    if let Some(mut rest) = cur.take() {
        rest.end = Instant::now();
        run.epochs.push(rest);
    }
    session.close().map_err(|e| format!("close: {e}"))?;
    Ok(run)
}
