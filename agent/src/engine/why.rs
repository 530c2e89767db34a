//! Why the training loop waits ([`crate::why`]): what a stalled session's
//! next batch waits on, measured every turn in `publish`, and, every
//! [`INTERVAL`], the loaders' reports read from their segments and the
//! intervals recorded per (dataset, rank) for the metrics.

use super::{key, Engine};
use crate::cache::Lookup;
use crate::peers::Route;
use crate::session::Session;
use crate::why::{Cause, Interval, INTERVAL};
use std::collections::BTreeMap;
use std::time::Instant;

impl Engine {
    /// What session `s`, stalled, waits on: the cause most of its front
    /// batch's missing samples share (ties: store, peer, arena). A sample
    /// being read is the store's or a peer's; one not requested yet waits
    /// for the store too when the dataset's reads are at their limit
    /// (`prefetch.max_inflight_reads`), and otherwise for the arena: no
    /// room, or the window has not reached it.
    pub(super) fn stall_cause(&self, s: &Session) -> Cause {
        let Some(front) = s.pending().front() else {
            return Cause::Arena;
        };
        let ds = s.dataset();
        let reads_full = self.datasets[ds].source().is_some_and(|src| {
            let retrying = self
                .retry_queue
                .iter()
                .filter(|(_, r)| r.key.dataset as usize == ds)
                .count();
            src.in_flight() + retrying >= src.capacity() as usize
        });
        let mut votes = [0u32; 3];
        for (i, slot) in front.slots.iter().enumerate() {
            let cause = if i >= front.requested {
                Some(if reads_full {
                    self.read_cause(ds, slot.sample)
                } else {
                    Cause::Arena
                })
            } else {
                match self.cache.lookup(key(ds, slot.sample)) {
                    Lookup::InFlight { .. } => Some(self.read_cause(ds, slot.sample)),
                    Lookup::Absent => Some(Cause::Arena),
                    Lookup::Ready(_) | Lookup::Failed { .. } => None,
                }
            };
            if let Some(c) = cause {
                votes[c as usize] += 1;
            }
        }
        let best = Cause::ALL
            .into_iter()
            .max_by_key(|&c| (votes[c as usize], std::cmp::Reverse(c as usize)))
            .unwrap_or(Cause::Arena);
        if votes[best as usize] == 0 {
            Cause::Arena
        } else {
            best
        }
    }

    /// A sample being read: from a peer when its owner is another member.
    fn read_cause(&self, ds: usize, sample: u64) -> Cause {
        match self.peers.as_ref().map(|t| t.route(ds, sample)) {
            Some(Route::Peer(_) | Route::Wait(_)) => Cause::Peer,
            _ => Cause::Store,
        }
    }

    /// Every [`INTERVAL`]: each session's interval, summed by (dataset,
    /// rank), recorded in the metrics' rank table.
    pub(super) fn why_interval(&mut self, now: Instant) {
        let wall = now.saturating_duration_since(self.last_why);
        if wall < INTERVAL {
            return;
        }
        self.last_why = now;
        let mut by_rank: BTreeMap<(String, u32), Interval> = BTreeMap::new();
        for s in self.sessions.values_mut() {
            let report = s.segment().loader_report();
            let iv = s.waits.take(report);
            let Some(d) = self.datasets.get(s.dataset()) else {
                continue;
            };
            by_rank
                .entry((d.name.clone(), s.rank()))
                .or_default()
                .add(&iv);
        }
        self.metrics.ranks.with(|t| t.record(by_rank, wall));
        self.job_interval(now);
    }
}
