//! Phase 5: publication. Each session publishes, in plan order, every batch
//! whose samples are all present (ready, or failed for good): its sample
//! table goes into the arena, its descriptor into the ready ring (one tail
//! store for all of them), and the clairvoyant cache learns how far the
//! session has got. With `order = "relaxed"`, late samples of the front
//! batch first trade places with ready ones of later batches.

use super::{key, Engine};
use crate::cache::Lookup;
use crate::session::{Loan, Session};
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::{BatchDescriptor, ErrorCode, SampleEntry, Violation};
use std::time::Duration;

impl Engine {
    /// Publishes every ready batch at the head of session `sid`'s window.
    /// Returns whether anything was published (or the session fenced).
    pub(super) fn publish(&mut self, sid: u64, dt: Duration) -> bool {
        let Some(mut s) = self.sessions.remove(&sid) else {
            return false;
        };
        let outcome = self.publish_session(&mut s);
        self.sessions.insert(sid, s);
        let published = match outcome {
            Ok(p) => p,
            Err(v) => {
                self.fence(sid, v);
                return true;
            }
        };
        // Loader stall: its ring is empty and its next batch is not ready.
        // Reading the loader's head (also once the stream has ended) may
        // reveal that it moved the head past what was published: that
        // fences the session like any other violation.
        if !published {
            let Some(s) = self.sessions.get_mut(&sid) else {
                return false;
            };
            let ended = s.ended();
            match s.ready.unconsumed() {
                Ok(0) if !ended => {
                    let ns = dt.as_nanos().min(u128::from(u64::MAX)) as u64;
                    self.metrics.loader_wait_ns.inc_by(ns);
                    if let Some(s) = self.sessions.get(&sid) {
                        let cause = self.stall_cause(s);
                        if let Some(s) = self.sessions.get_mut(&sid) {
                            s.waits.stalled(cause, ns);
                        }
                    }
                }
                Ok(_) => {}
                Err(v) => {
                    self.fence(sid, v);
                    return true;
                }
            }
        }
        published
    }

    /// Relaxed order: the front batch's late samples trade places with
    /// ready ones of later batches (`Session::relax_front`), and the
    /// cache's future index learns the order really delivered.
    fn relax_front(&mut self, s: &mut Session) {
        let ds = s.dataset();
        let cache = &self.cache;
        let present = |x: u64| {
            matches!(
                cache.lookup(key(ds, x)),
                Lookup::Ready(_) | Lookup::Failed { .. }
            )
        };
        let ready = |x: u64| matches!(cache.lookup(key(ds, x)), Lookup::Ready(_));
        let mut pairs = Vec::new();
        let swaps = s.relax_front(present, ready, |a, b| pairs.push((a, b)));
        self.metrics.relaxed_swaps.inc_by(swaps);
        for (a, b) in pairs {
            let _ = self.cache.swap_in_session(s.id(), a, b);
        }
    }

    fn publish_session(&mut self, s: &mut Session) -> Result<bool, Violation> {
        let ds = s.dataset();
        let mut published = false;
        let result = loop {
            if s.ended() {
                break Ok(());
            }
            match s.ready.free() {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(v) => break Err(v),
            }
            if s.at_end_of_stream() {
                let (seq, token) = s.lend(
                    Loan {
                        pinned: Vec::new(),
                        table: None,
                        bytes: 0,
                    },
                    true,
                );
                let d = BatchDescriptor {
                    seq,
                    token,
                    flags: BATCH_END_OF_STREAM,
                    ..Default::default()
                };
                let _ = s.ready.try_stage(d);
                published = true;
                break Ok(());
            }
            if self.datasets[ds].relaxed && matches!(s.ready.unconsumed(), Ok(0)) {
                self.relax_front(s);
            }
            let cache = &self.cache;
            let present = |x: u64| {
                matches!(
                    cache.lookup(key(ds, x)),
                    Lookup::Ready(_) | Lookup::Failed { .. }
                )
            };
            let Some(n) = s
                .pending()
                .front()
                .filter(|b| b.fully_requested())
                .map(|b| b.slots.len())
            else {
                break Ok(());
            };
            let table_len = (n * std::mem::size_of::<SampleEntry>()) as u64;
            if !self.tables.can_alloc(table_len.max(64), 64) {
                break Ok(()); // table space exhausted: wait for releases
            }
            let Some(b) = s.take_publishable(present) else {
                break Ok(());
            };
            let Some(table) = self.tables.alloc(table_len.max(64), 64) else {
                unreachable!("checked with can_alloc just above");
            };
            let Some(src) = self.datasets[ds].source() else {
                break Ok(());
            };
            let mut entries = Vec::with_capacity(n);
            let mut total = 0u64;
            let mut errors = 0u64;
            for slot in &b.slots {
                let meta = src.meta(slot.sample);
                let entry = match self.cache.lookup(key(ds, slot.sample)) {
                    Lookup::Ready(r) => {
                        total += r.len;
                        SampleEntry {
                            sample_id: meta.sample_id,
                            offset: r.offset,
                            length: r.len as u32,
                            label: meta.label,
                            crc32c: r.crc32c,
                            status: 0,
                        }
                    }
                    other => {
                        errors += 1;
                        let code = match other {
                            Lookup::Failed { code, .. } => -(code.min(i32::MAX as u32) as i32),
                            _ => ErrorCode::Internal.as_i32(),
                        };
                        SampleEntry {
                            sample_id: meta.sample_id,
                            offset: 0,
                            length: 0,
                            label: meta.label,
                            crc32c: 0,
                            status: code,
                        }
                    }
                };
                entries.push(entry);
            }
            let _ = self.arena.write_sample_table(table.offset, &entries);
            let (seq, token) = s.lend(
                Loan {
                    pinned: b.pinned_samples().collect(),
                    table: Some(table),
                    bytes: b.bytes(),
                },
                false,
            );
            let d = BatchDescriptor {
                seq,
                token,
                table_offset: table.offset,
                batch_index: b.index,
                total_bytes: total,
                epoch: b.epoch,
                sample_count: n as u32,
                // A sample that failed for good makes the whole batch an
                // error batch (its samples say which, and why).
                status: if errors > 0 {
                    ErrorCode::Io.as_i32()
                } else {
                    0
                },
                flags: if b.last_of_epoch {
                    BATCH_END_OF_EPOCH
                } else {
                    0
                },
                reserved: 0,
            };
            let _ = s.ready.try_stage(d);
            let _ = self.cache.advance_session_by(s.id(), n as u64);
            self.metrics.samples_served.inc_by(n as u64);
            self.metrics.bytes_served.inc_by(total);
            self.metrics.batches_served.inc_by(1);
            published = true;
        };
        s.ready.publish();
        result.map(|()| published)
    }
}
