//! Phase 3: each session plans its window ahead and requests every sample
//! of it, in delivery order. A sample in the cache (ready, or being read for
//! someone else) is pinned; a missing one gets an arena extent and a read
//! from its dataset's source, within the dataset's read budget. A sample
//! that two sessions need is read once.

use super::{key, Engine, Inflight};
use crate::cache::Lookup;
use crate::peers::Route;
use crate::session::Request;
use granary_shm::ErrorCode;
use std::time::Instant;

impl Engine {
    /// Plans ahead and requests (and pins) every sample of session `sid`'s
    /// window, with at most `limit` reads from the store (`None`: as many
    /// as the dataset's read budget allows). Returns whether anything
    /// moved.
    pub(super) fn request(&mut self, sid: u64, now: Instant, limit: Option<usize>) -> bool {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return false;
        };
        let ds = s.dataset();
        let Some(src) = self.datasets[ds].source() else {
            return false;
        };
        if let Err(e) = s.plan_ahead(|x| src.meta(x).size) {
            tracing::warn!(session = sid, "planning failed: {e}");
            return false;
        }
        if let Some(mode) = s.placement_mode() {
            self.metrics.peers.count_assigned(mode, s.take_placed());
        }
        let retrying = retrying(&self.retry_queue, ds);
        let mut budget = (src.capacity() as usize)
            .saturating_sub(src.in_flight() + retrying)
            .min(limit.unwrap_or(usize::MAX));
        let cache = &mut self.cache;
        let metrics = &self.metrics;
        let peers = self.peers.as_ref();
        let mut reads = Vec::new();
        let moved = s.request_with(|epoch, sample| {
            let k = key(ds, sample);
            match cache.access(k) {
                Lookup::Ready(_) | Lookup::InFlight { .. } => {
                    metrics.count_epoch(ds, epoch, 1, 0);
                    metrics.peers.arena_samples.inc();
                    match cache.pin(k) {
                        Ok(_) => Request::Pinned,
                        // Too many pins: look again once some are gone.
                        Err(_) => Request::Stop,
                    }
                }
                // A failed sample is read again (the dataset's retry policy
                // anew): the new read takes over the pins of the batches
                // that reported the failure, and this batch pins it too.
                Lookup::Absent | Lookup::Failed { .. } => {
                    let route = peers.map_or(Route::Store, |t| t.route(ds, sample));
                    let from_store = !matches!(route, Route::Peer(_) | Route::Wait(_));
                    if from_store && budget == 0 {
                        return Request::Stop;
                    }
                    let len = src.meta(sample).size;
                    let reserved = match route {
                        Route::Keep => cache
                            .reserve_kept(k, len)
                            .or_else(|_| cache.reserve(k, len)),
                        _ => cache.reserve(k, len),
                    };
                    match reserved {
                        Ok(r) => {
                            if from_store {
                                budget -= 1;
                            }
                            metrics.count_epoch(ds, epoch, 0, 1);
                            reads.push((k, r.extent.offset, len, route));
                            // The reservation holds one pin: ours.
                            Request::Pinned
                        }
                        // No room now (everything pinned or in flight):
                        // look again next turn.
                        Err(_) => Request::Stop,
                    }
                }
            }
        });
        for (k, dest, len, route) in reads {
            let Ok(len) = u32::try_from(len) else {
                let what = src_describe(self, k.dataset as usize, k.index);
                self.datasets[k.dataset as usize]
                    .log_failure(|| format!("{what}: {len} bytes is too large for one read"));
                let _ = self.cache.fail(k, ErrorCode::Io.as_i32().unsigned_abs());
                continue;
            };
            match route {
                Route::Peer(member) => {
                    self.start_peer_get(member, k, dest, len);
                    continue;
                }
                Route::Wait(member) => {
                    self.park_peer_get(member, k, dest, len, false, 0);
                    continue;
                }
                Route::Store | Route::Keep => {}
            }
            self.start_read(Inflight {
                key: k,
                dest,
                len,
                attempt: 1,
                started: now,
                first: now,
            });
        }
        moved
    }

    /// Submits one attempt of a read to its dataset's source. A source with
    /// no room takes it back; it is tried again next turn.
    pub(super) fn start_read(&mut self, mut inf: Inflight) {
        inf.started = self.clock.now();
        let ds = inf.key.dataset as usize;
        // The cache's extent, of the sample's size rounded up to its
        // alignment, holds the source's whole blocks (a compile-time
        // assertion in source::fs ties the block to the alignment).
        let block = self.datasets[ds].source().map_or(1, |s| s.read_block());
        let span = inf
            .len
            .checked_next_multiple_of(block.max(1))
            .unwrap_or(inf.len);
        let dest = match self.arena.slice(inf.dest, span as usize) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("read of {} into the arena refused: {e}", inf.key);
                let _ = self
                    .cache
                    .fail(inf.key, ErrorCode::Internal.as_i32().unsigned_abs());
                self.peer_loaded(inf.key, None);
                return;
            }
        };
        let Some(src) = self.datasets[ds].source_mut() else {
            let _ = self
                .cache
                .fail(inf.key, ErrorCode::Io.as_i32().unsigned_abs());
            self.peer_loaded(inf.key, None);
            return;
        };
        let tag = self.inflight.insert(inf);
        if src.submit(tag as u64, inf.key.index, dest).is_err() {
            self.inflight.remove(tag);
            self.retry_queue.push((inf.started, inf));
        } else {
            self.metrics.reads_submitted.inc_by(1);
        }
    }

    /// Submits every retry whose time has come.
    pub(super) fn retry_due(&mut self, now: Instant) {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.retry_queue.len() {
            if self.retry_queue[i].0 <= now {
                due.push(self.retry_queue.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        for r in due {
            self.start_read(r);
        }
    }
}

/// Reads of dataset `ds` waiting in `queue` for their next attempt (they
/// count against its read budget).
pub(super) fn retrying(queue: &[(Instant, Inflight)], ds: usize) -> usize {
    queue
        .iter()
        .filter(|(_, r)| r.key.dataset as usize == ds)
        .count()
}

fn src_describe(e: &Engine, ds: usize, index: u64) -> String {
    e.datasets[ds]
        .source()
        .map(|s| s.describe(index))
        .unwrap_or_default()
}
