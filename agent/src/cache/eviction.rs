//! Making room: reservations, the policy's victims and eviction.

use super::*;

impl Cache {
    /// Reserves room for reading sample `key` of `len` bytes and records it
    /// InFlight with one pin (the reserver's; see [`unpin`](Self::unpin)).
    ///
    /// The entry is retained when it fits within the retain limit, possibly
    /// after evicting candidates in the policy's order, as long as the
    /// policy admits it against those victims
    /// ([`EvictionPolicy::admit`]). Otherwise it is transient
    /// (MinIO once full; clairvoyant's bypass; any policy when the sample is
    /// larger than the retain limit or nothing is evictable) and takes free
    /// space outside the retained set; should there be none, evicting
    /// policies evict to make some. A Failed entry is replaced (a retry):
    /// the new entry takes over the pins of the batches that reported the
    /// failure, which unpin it when they are done, so none of its holders
    /// ever refers to bytes without a pin.
    ///
    /// # Errors
    ///
    /// [`CacheError::ZeroLength`], [`CacheError::TooLarge`],
    /// [`CacheError::AlreadyPresent`] (pin it instead), or
    /// [`CacheError::NoSpace`] (everything is pinned or in flight, or the
    /// policy never evicts: retry after some unpins or completions).
    pub(crate) fn reserve(&mut self, key: SampleKey, len: u64) -> Result<Reservation, CacheError> {
        if len == 0 {
            return Err(CacheError::ZeroLength);
        }
        let largest = self.config.largest_sample();
        let need = match self.config.extent_len(len) {
            Some(n) if n <= largest => n,
            _ => return Err(CacheError::TooLarge { len, largest }),
        };
        let carried = self.retry_pins(key)?;
        let align = self.config.align;
        let limit = self.config.retain_limit();
        let mut evicted = 0u32;
        let mut victims: Vec<(SampleKey, u64)> = Vec::new();
        if need <= limit {
            loop {
                if self.acct.retained + need <= limit && self.areas.retained.can_alloc(need, align)
                {
                    return self.start_read(key, need, len, Residency::Retained, evicted, carried);
                }
                self.plan_victims(key, need, &mut victims);
                if victims.is_empty() || !self.policy.admit(key, need, &victims) {
                    break;
                }
                for &(victim, _) in &victims {
                    self.evict(victim, true)?;
                    evicted = evicted.saturating_add(1);
                }
            }
        }
        loop {
            if self.areas.transient.can_alloc(need, align)
                || self.areas.retained.can_alloc(need, align)
            {
                return self.start_read(key, need, len, Residency::Transient, evicted, carried);
            }
            let victim = if self.policy.evicts() {
                self.policy.victim()
            } else {
                None
            };
            let Some(victim) = victim else {
                self.stats.no_space += 1;
                return Err(CacheError::NoSpace { key, need });
            };
            self.evict(victim, true)?;
            evicted = evicted.saturating_add(1);
        }
    }

    /// The victims whose eviction lets a retained extent of `need` bytes
    /// in, tried in this order:
    ///
    /// 1. among the policy's first [`FIT_PROBES`] candidates, the first one
    ///    that alone brings the retained bytes within the limit and leaves a
    ///    free range of `need` bytes in the retained area;
    /// 2. among the same candidates, the first whose *window* the policy
    ///    admits the newcomer against: the candidate together with the
    ///    fewest address neighbours (free ranges, then evictable entries,
    ///    the smaller side first, at most [`WINDOW_MAX`] entries) that
    ///    form a free range of `need` bytes. This is how fragmentation is
    ///    undone without moving anything;
    /// 3. the candidates in the policy's order until enough bytes are freed
    ///    (at least one: a free range may still be missing after that, and
    ///    the caller asks again).
    pub(super) fn plan_victims(
        &self,
        key: SampleKey,
        need: u64,
        victims: &mut Vec<(SampleKey, u64)>,
    ) {
        victims.clear();
        let over = (self.acct.retained + need).saturating_sub(self.config.retain_limit());
        for victim in self.policy.victims().take(FIT_PROBES) {
            if let Some(extent) = self.evictable_extent(victim) {
                let hole = self.areas.retained.hole_if_freed(extent).unwrap_or(0);
                if extent.len >= over && hole >= need {
                    victims.push((victim, extent.len));
                    return;
                }
            }
        }
        let fragmented =
            self.areas.retained.free_bytes() > self.config.retain_limit() / FRAGMENTATION_DIVISOR;
        for victim in self
            .policy
            .victims()
            .take(if fragmented { FIT_PROBES } else { 0 })
        {
            if self.window(victim, need, victims)
                && victims.iter().map(|v| v.1).sum::<u64>() >= over
                && self.policy.admit(key, need, victims)
            {
                return;
            }
        }
        victims.clear();
        let target = over
            .max(need.saturating_sub(self.areas.retained.free_bytes()))
            .max(1);
        let mut freed = 0u64;
        for victim in self.policy.victims() {
            let size = self.evictable_extent(victim).map_or(0, |e| e.len);
            victims.push((victim, size));
            freed += size;
            if freed >= target {
                break;
            }
        }
    }

    /// The extent of `key` if it may be evicted: retained, Ready, unpinned.
    pub(super) fn evictable_extent(&self, key: SampleKey) -> Option<Extent> {
        match self.entries.get(&key) {
            Some(&Entry::Ready {
                extent,
                pins: 0,
                residency: Residency::Retained,
                ..
            }) => Some(extent),
            _ => None,
        }
    }

    /// Fills `victims` with `victim` and the address neighbours to evict
    /// with it so that a free range of `need` bytes forms in the retained
    /// area (see [`plan_victims`](Self::plan_victims)). `false` when the
    /// neighbourhood is blocked (pinned, in flight or transient entries, the
    /// area's ends) before the range is long enough.
    pub(super) fn window(
        &self,
        victim: SampleKey,
        need: u64,
        victims: &mut Vec<(SampleKey, u64)>,
    ) -> bool {
        victims.clear();
        let Some(extent) = self.evictable_extent(victim) else {
            return false;
        };
        let area = &self.areas.retained;
        let area_end = area.base() + area.size();
        if extent.offset < area.base() || extent.end() > area_end {
            return false;
        }
        victims.push((victim, extent.len));
        let (mut lo, mut hi) = (extent.offset, extent.end());
        loop {
            if let Some(f) = area.free_range_ending_at(lo) {
                lo = f.offset;
            }
            if let Some(f) = area.free_range_at(hi) {
                hi = f.end();
            }
            if hi - lo >= need {
                return true;
            }
            if victims.len() >= WINDOW_MAX {
                return false;
            }
            let left = self
                .areas
                .owners
                .range(..lo)
                .next_back()
                .and_then(|(_, &k)| self.evictable_extent(k).map(|e| (k, e)))
                .filter(|(_, e)| e.end() == lo);
            let right = self
                .areas
                .owners
                .get(&hi)
                .filter(|_| hi < area_end)
                .and_then(|&k| self.evictable_extent(k).map(|e| (k, e)));
            let next = match (left, right) {
                (Some(l), Some(r)) => {
                    if l.1.len <= r.1.len {
                        l
                    } else {
                        r
                    }
                }
                (Some(l), None) => l,
                (None, Some(r)) => r,
                (None, None) => return false,
            };
            victims.push((next.0, next.1.len));
            lo = lo.min(next.1.offset);
            hi = hi.max(next.1.end());
        }
    }

    /// The pins a new read of `key` takes over: none for an absent sample,
    /// those of a Failed record (its holders, batches that reported the
    /// failure, unpin the new entry when they are done).
    pub(super) fn retry_pins(&self, key: SampleKey) -> Result<u32, CacheError> {
        match self.entries.get(&key) {
            None => Ok(0),
            Some(&Entry::Failed { pins, .. }) if pins < u32::MAX => Ok(pins),
            Some(Entry::Failed { .. }) => Err(CacheError::PinOverflow(key)),
            Some(e) => Err(CacheError::AlreadyPresent {
                key,
                state: e.state(),
            }),
        }
    }

    pub(super) fn start_read(
        &mut self,
        key: SampleKey,
        need: u64,
        len: u64,
        residency: Residency,
        evicted: u32,
        carried: u32,
    ) -> Result<Reservation, CacheError> {
        let extent = self
            .areas
            .alloc(key, need, self.config.align, residency)
            .map_err(|e| CacheError::Internal(format!("allocation after a fit check: {e}")))?;
        self.entries.insert(
            key,
            Entry::InFlight {
                extent,
                len,
                pins: carried + 1,
                residency,
            },
        );
        self.acct.in_flight += need;
        match residency {
            Residency::Retained => {
                self.acct.retained += need;
                self.stats.retained_reservations += 1;
            }
            Residency::Transient => {
                self.acct.transient += need;
                self.stats.transient_reservations += 1;
            }
            Residency::Kept => self.acct.kept += need,
        }
        Ok(Reservation {
            key,
            extent,
            len,
            residency,
            evicted,
        })
    }

    /// Evicts candidate `key` (retained, Ready, unpinned); `counted` when it
    /// is the policy's choice (counted in the stats).
    pub(super) fn evict(&mut self, key: SampleKey, counted: bool) -> Result<(), CacheError> {
        match self.entries.get(&key) {
            Some(&Entry::Ready {
                extent,
                pins: 0,
                residency: Residency::Retained,
                ..
            }) => {
                self.areas
                    .free(extent)
                    .map_err(|e| CacheError::Internal(format!("evicting {key}: {e}")))?;
                self.entries.remove(&key);
                self.policy.remove(key);
                self.changes += 1;
                self.acct.cached -= extent.len;
                self.acct.retained -= extent.len;
                if counted {
                    self.stats.evictions += 1;
                    self.stats.evicted_bytes += extent.len;
                }
                Ok(())
            }
            other => {
                // The policy offered a sample that is not a candidate: drop it
                // from the policy so the cache cannot loop on it.
                self.policy.remove(key);
                Err(CacheError::Internal(format!(
                    "policy offered {key} ({}) as a victim",
                    other.map_or("absent", Entry::state)
                )))
            }
        }
    }
}
