//! Phase 3's order: which session's window is requested first, and how many
//! store reads each may start this turn (`prefetch.balance`).
//!
//! * `"static"`: sessions in the order they opened, each taking what its
//!   window wants while the dataset's read budget lasts.
//! * `"stall"`: per dataset, the free reads are granted by
//!   [`crate::balance::grant`] (a floor each, then by least time to stall);
//!   each session requests within its grant, the nearest a stall first;
//!   then, in the same order, whatever a grant left unused (its samples
//!   were in the arena already) goes to whoever still wants reads.

use super::Engine;
use crate::config::Balance;
use std::time::Instant;

impl Engine {
    /// Requests every session's window (`ids` in the order they opened).
    /// Returns whether anything moved.
    pub(super) fn request_all(&mut self, ids: &[u64], now: Instant) -> bool {
        let mut moved = false;
        if self.cfg.prefetch.balance == Balance::Static {
            for &id in ids {
                moved |= self.request(id, now, None);
            }
            return moved;
        }
        let mut by_dataset: Vec<(usize, Vec<u64>)> = Vec::new();
        for &id in ids {
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let ds = s.dataset();
            match by_dataset.iter_mut().find(|(d, _)| *d == ds) {
                Some((_, v)) => v.push(id),
                None => by_dataset.push((ds, vec![id])),
            }
        }
        for (ds, sids) in by_dataset {
            moved |= match sids[..] {
                // One session: every free read is its own either way.
                [one] => self.request(one, now, None),
                _ => self.request_balanced(ds, &sids, now),
            };
        }
        moved
    }

    /// `"stall"` for the sessions `sids` of dataset `ds`.
    fn request_balanced(&mut self, ds: usize, sids: &[u64], now: Instant) -> bool {
        let mut moved = false;
        let Some(src) = self.datasets[ds].source() else {
            return false;
        };
        let budget = (src.capacity() as usize)
            .saturating_sub(src.in_flight() + super::request::retrying(&self.retry_queue, ds));
        let mut needs = Vec::with_capacity(sids.len());
        for &sid in sids {
            // Plans the window first (what `request` does), so that what
            // it wants is known.
            moved |= self.request(sid, now, Some(0));
            needs.push(self.sessions.get_mut(&sid).map(|s| s.need(now)));
        }
        let known: Vec<_> = needs.iter().map(|n| n.unwrap_or(NOTHING)).collect();
        let (grants, _) = crate::balance::grant(budget, &known);
        let mut order: Vec<usize> = (0..sids.len()).collect();
        let tts = |i: usize| {
            let n = &known[i];
            n.lead / n.rate.unwrap_or(f64::INFINITY).max(1e-9)
        };
        order.sort_by(|&a, &b| tts(a).total_cmp(&tts(b)).then(a.cmp(&b)));
        for &i in &order {
            if grants[i] > 0 {
                moved |= self.request(sids[i], now, Some(grants[i]));
            }
        }
        for &i in &order {
            if known[i].wants > grants[i] {
                moved |= self.request(sids[i], now, None);
            }
        }
        moved
    }
}

/// A session that went away in the turn: wants nothing.
const NOTHING: crate::balance::Need = crate::balance::Need {
    lead: 0.0,
    rate: None,
    wants: 0,
    batch: 1,
};
