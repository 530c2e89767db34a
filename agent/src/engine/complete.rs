//! Phase 4: reads finishing, in any order. A complete read becomes a Ready
//! sample with the CRC-32C of its bytes (computed in place in the arena);
//! a failure goes to the dataset's retry policy, which retries it later or
//! fails the sample with its kind (the loader sees which).

use super::{Engine, Inflight};
use crate::cache::{Completion as CacheCompletion, SampleKey};
use crate::retry::RetryDecision;
use crate::source::{FailureKind, SampleError};
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

impl Engine {
    /// Collects finished reads of every dataset, without waiting. Returns
    /// whether there were any.
    pub(super) fn collect_completions(&mut self) -> io::Result<bool> {
        self.completions.clear();
        for d in &mut self.datasets {
            if let Some(src) = d.source_mut() {
                src.poll_completions(None, &mut self.completions)?;
            }
        }
        let any = !self.completions.is_empty();
        self.handle_completions();
        Ok(any)
    }

    /// Waits up to `wait` for any dataset's read to finish (a plain sleep
    /// when none is in flight), then collects what finished.
    pub(super) fn wait_for_completions(&mut self, wait: Duration) -> io::Result<()> {
        let mut fds: Vec<i32> = self
            .datasets
            .iter()
            .filter_map(|d| d.source())
            .filter(|src| src.in_flight() > 0)
            .map(|src| src.wait_fd().as_raw_fd())
            .collect();
        if let Some(t) = &self.peers {
            // The fake NIC has no completion channel: it is polled every
            // turn.
            fds.extend(t.wake_fds());
        }
        if fds.is_empty() {
            std::thread::sleep(wait);
            return Ok(());
        }
        // The descriptors stay open: their sources are owned by `self` and
        // not dropped before the call returns.
        crate::sys::poll_readable(&fds, wait)?;
        self.collect_completions().map(|_| ())
    }

    fn handle_completions(&mut self) {
        let completions = std::mem::take(&mut self.completions);
        let now = self.clock.now();
        for c in &completions {
            let Some(inf) = self.inflight.try_remove(c.tag as usize) else {
                continue;
            };
            self.metrics
                .read_latency
                .observe(now.saturating_duration_since(inf.started));
            let failure = match &c.result {
                Ok(n) if *n == inf.len => {
                    self.metrics.bytes_read.inc_by(u64::from(*n));
                    self.metrics.peers.store_samples.inc();
                    self.metrics.peers.store_bytes.inc_by(u64::from(*n));
                    let crc = self.arena.crc32c(inf.dest, inf.len as usize).unwrap_or(0);
                    self.sample_ready(inf.key, crc);
                    continue;
                }
                Ok(n) => SampleError::new(
                    FailureKind::Short,
                    format!(
                        "returned {n} of {} bytes (changed since the catalog was made?)",
                        inf.len
                    ),
                ),
                Err(e) => e.clone(),
            };
            self.after_failure(inf, failure, now);
        }
        self.completions = completions;
        self.completions.clear();
    }

    /// The one place where a read, from the store or from a peer, makes
    /// its sample Ready (with the CRC-32C of its bytes): the cache takes
    /// it, and peers waiting for it here are answered.
    pub(super) fn sample_ready(&mut self, key: SampleKey, crc32c: u32) {
        let done = self.cache.complete(key, crc32c);
        let loaded = match &done {
            Ok(CacheCompletion::Ready(r)) => Some((r.len, r.crc32c)),
            _ => None,
        };
        self.peer_loaded(key, loaded);
    }

    /// The one place where a sample fails for good (`code`, what the loader
    /// sees): the cache fails it, and peers waiting for it get a miss.
    fn sample_failed(&mut self, key: SampleKey, code: u32) {
        let _ = self.cache.fail(key, code);
        self.peer_loaded(key, None);
    }

    /// Retries a failed attempt or fails the sample, as the dataset's
    /// policy says.
    fn after_failure(&mut self, inf: Inflight, err: SampleError, now: std::time::Instant) {
        let ds = inf.key.dataset as usize;
        let seed = self.instance_key ^ inf.key.index;
        match self.retry[ds].decide(err.kind, inf.attempt, inf.first, now, seed) {
            RetryDecision::RetryAt(at) => {
                self.metrics.read_retries.inc_by(1);
                self.retry_queue.push((
                    at,
                    Inflight {
                        attempt: inf.attempt + 1,
                        ..inf
                    },
                ));
            }
            RetryDecision::GiveUp => {
                self.metrics.read_errors.inc_by(1);
                let d = &mut self.datasets[ds];
                self.metrics.dataset_health(&d.name, |h| h.read_errors += 1);
                let what = d
                    .source()
                    .map(|src| src.describe(inf.key.index))
                    .unwrap_or_default();
                let attempts = inf.attempt;
                d.log_failure(|| {
                    format!(
                        "read of {what} failed for good after {attempts} attempt(s) ({}): {}",
                        err.kind, err.message
                    )
                });
                self.sample_failed(inf.key, err.kind.code().as_i32().unsigned_abs());
            }
        }
    }
}
