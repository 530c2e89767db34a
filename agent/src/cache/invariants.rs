//! The cache's invariants, checked after every operation in tests and
//! simulations.

use super::*;

impl Cache {
    /// Recomputes everything from the entries and checks it against the
    /// running counters, the allocator and the policy: the accounting
    /// identity, retained bytes within the limit, every entry's extent live
    /// in the allocator and no other extent live, exactly the retained,
    /// Ready, unpinned entries known to the policy as candidates, and no
    /// transient Ready entry without pins. `O(n)`: for tests and audits.
    ///
    /// # Errors
    ///
    /// A description of the first violation found.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.areas.check()?;
        let mut sum = Accounting {
            size: self.config.arena_size,
            free: self.areas.free_bytes(),
            ..Accounting::default()
        };
        let mut extents = 0usize;
        let mut candidates = 0usize;
        for (key, entry) in &self.entries {
            let (extent, residency) = match *entry {
                Entry::InFlight {
                    extent, residency, ..
                } => {
                    sum.in_flight += extent.len;
                    (extent, residency)
                }
                Entry::Ready {
                    extent,
                    pins,
                    residency,
                    len,
                    ..
                } => {
                    if len > extent.len {
                        return Err(format!("{key}: length {len} exceeds its extent {extent}"));
                    }
                    if pins > 0 {
                        sum.pinned += extent.len;
                    } else if residency == Residency::Transient {
                        return Err(format!("{key}: transient, ready and unpinned"));
                    } else if residency == Residency::Kept {
                        sum.cached += extent.len;
                        if self.policy.contains(*key) {
                            return Err(format!("{key}: kept but a policy candidate"));
                        }
                    } else {
                        sum.cached += extent.len;
                        candidates += 1;
                        if !self.policy.contains(*key) {
                            return Err(format!("{key}: evictable but unknown to the policy"));
                        }
                    }
                    (extent, residency)
                }
                Entry::Failed { .. } => {
                    if self.policy.contains(*key) {
                        return Err(format!("{key}: failed but a policy candidate"));
                    }
                    continue;
                }
            };
            if !self.areas.is_allocated(extent) {
                return Err(format!("{key}: extent {extent} is not allocated"));
            }
            if extent.offset % self.config.align != 0 || extent.len % self.config.align != 0 {
                return Err(format!("{key}: extent {extent} is not aligned"));
            }
            extents += 1;
            if self.areas.owners.get(&extent.offset) != Some(key) {
                return Err(format!("{key}: extent {extent} is owned by another key"));
            }
            match residency {
                Residency::Retained => {
                    sum.retained += extent.len;
                    if extent.end() > self.areas.transient.base() {
                        return Err(format!("{key}: retained extent {extent} outside its area"));
                    }
                }
                Residency::Transient => sum.transient += extent.len,
                Residency::Kept => {
                    sum.kept += extent.len;
                    if extent.offset < self.areas.kept.base() {
                        return Err(format!("{key}: kept extent {extent} outside its area"));
                    }
                }
            }
            if matches!(entry, Entry::Ready { pins: 0, .. }) {
                continue;
            }
            if self.policy.contains(*key) {
                return Err(format!("{key}: pinned or in flight but a policy candidate"));
            }
        }
        if extents != self.areas.live_extents() {
            return Err(format!(
                "{} live extents but {extents} entries hold one",
                self.areas.live_extents()
            ));
        }
        if candidates != self.policy.len() {
            return Err(format!(
                "{candidates} evictable entries but the policy has {}",
                self.policy.len()
            ));
        }
        let counted = self.accounting();
        if counted != sum {
            return Err(format!(
                "counters {counted:?} disagree with entries {sum:?}"
            ));
        }
        if sum.total() != sum.size {
            return Err(format!(
                "accounting {sum:?} does not add up to the arena size"
            ));
        }
        if sum.retained > self.config.retain_limit() {
            return Err(format!(
                "retained {} bytes above the limit {}",
                sum.retained,
                self.config.retain_limit()
            ));
        }
        Ok(())
    }
}
