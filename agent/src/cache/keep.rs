//! The keep area (samples this node owns for its peers) and a warm
//! restart's entries.

use super::*;

impl Cache {
    /// Reserves room in the keep area for reading sample `key` of `len`
    /// bytes, which this agent keeps for its peers: recorded InFlight with
    /// one pin, like `reserve`, and never evicted once
    /// Ready (it stays after its last unpin).
    ///
    /// # Errors
    ///
    /// As `reserve`; [`CacheError::NoSpace`] when the keep
    /// area is full (read it with `reserve` instead).
    pub fn reserve_kept(&mut self, key: SampleKey, len: u64) -> Result<Reservation, CacheError> {
        if len == 0 {
            return Err(CacheError::ZeroLength);
        }
        let need = self
            .config
            .extent_len(len)
            .ok_or(CacheError::TooLarge { len, largest: 0 })?;
        let carried = self.retry_pins(key)?;
        if !self.areas.kept.can_alloc(need, self.config.align) {
            self.stats.no_space += 1;
            return Err(CacheError::NoSpace { key, need });
        }
        self.start_read(key, need, len, Residency::Kept, 0, carried)
    }

    /// Frees the kept samples (ready, unpinned) that `still_kept` no longer
    /// wants: after the job's membership view changed, this agent's
    /// keep-set is another. Returns how many were freed and how many kept
    /// samples it could not free yet (pinned or in flight), whatever
    /// `still_kept` says of them.
    pub(crate) fn release_kept(
        &mut self,
        mut still_kept: impl FnMut(SampleKey) -> bool,
    ) -> (usize, usize) {
        let mut free = Vec::new();
        let mut busy = 0;
        for (&key, e) in &self.entries {
            match *e {
                Entry::Ready {
                    extent,
                    pins: 0,
                    residency: Residency::Kept,
                    ..
                } if !still_kept(key) => free.push((key, extent)),
                Entry::Ready {
                    residency: Residency::Kept,
                    ..
                }
                | Entry::InFlight {
                    residency: Residency::Kept,
                    ..
                } if !still_kept(key) => busy += 1,
                _ => {}
            }
        }
        let mut freed = 0;
        for (key, extent) in free {
            if self.areas.free(extent).is_ok() {
                self.entries.remove(&key);
                self.changes += 1;
                self.acct.cached -= extent.len;
                self.acct.kept -= extent.len;
                freed += 1;
            }
        }
        (freed, busy)
    }

    /// Moves the retained samples (ready, unpinned) that `keep` now wants
    /// into the keep area, as far as it has room: after the job's view
    /// changed, samples this agent holds as ordinary cache entries may have
    /// become its own to keep. Returns the (from, to) extents whose bytes
    /// the caller must copy before anything reads them (the entry points at
    /// `to` already; `from` is free).
    pub(crate) fn adopt_kept(
        &mut self,
        mut keep: impl FnMut(SampleKey) -> bool,
    ) -> Vec<(Extent, Extent)> {
        let wanted: Vec<(SampleKey, Extent)> = self
            .entries
            .iter()
            .filter_map(|(&key, e)| match *e {
                Entry::Ready {
                    extent,
                    pins: 0,
                    residency: Residency::Retained,
                    ..
                } if keep(key) => Some((key, extent)),
                _ => None,
            })
            .collect();
        let mut moves = Vec::new();
        for (key, from) in wanted {
            if !self.areas.kept.can_alloc(from.len, self.config.align) {
                break;
            }
            let Ok(to) = self
                .areas
                .alloc(key, from.len, self.config.align, Residency::Kept)
            else {
                break;
            };
            if self.areas.free(from).is_err() {
                let _ = self.areas.free(to);
                continue;
            }
            if let Some(Entry::Ready {
                extent,
                residency,
                len,
                crc32c,
                ..
            }) = self.entries.get_mut(&key)
            {
                *extent = to;
                *residency = Residency::Kept;
                if let Some(j) = self.journal.as_mut() {
                    j.push((key, to.offset, *len, *crc32c));
                }
            }
            self.policy.remove(key);
            self.changes += 1;
            self.acct.retained -= from.len;
            self.acct.kept += from.len;
            moves.push((from, to));
        }
        moves
    }

    /// The samples a warm restart can take back: Ready, retained or kept
    /// (transient ones go with their last pin): `(key, offset, len, crc,
    /// kept)`.
    pub(crate) fn warm_entries(
        &self,
    ) -> impl Iterator<Item = (SampleKey, u64, u64, u32, bool)> + '_ {
        self.entries.iter().filter_map(|(&key, e)| match *e {
            Entry::Ready {
                extent,
                len,
                crc32c,
                residency: residency @ (Residency::Retained | Residency::Kept),
                ..
            } => Some((
                key,
                extent.offset,
                len,
                crc32c,
                residency == Residency::Kept,
            )),
            _ => None,
        })
    }

    /// Puts back a sample whose bytes are already at `offset` (a warm
    /// restart): Ready, unpinned, retained when the offset lies in the
    /// retained area, kept when it lies in the keep area. `false` (nothing
    /// changed) when the sample is known already, its extent is not free or
    /// not wholly inside one of those areas, or the retained area's limit
    /// would be passed.
    pub(crate) fn restore(&mut self, key: SampleKey, offset: u64, len: u64, crc32c: u32) -> bool {
        if len == 0 || self.entries.get(&key).is_some() {
            return false;
        }
        let Some(need) = self.config.extent_len(len) else {
            return false;
        };
        if !offset.is_multiple_of(self.config.align.max(1)) {
            return false;
        }
        let extent = Extent { offset, len: need };
        let kept_base = self.areas.kept.base();
        let residency = if offset >= kept_base && self.config.keep_reserve > 0 {
            Residency::Kept
        } else if offset + need <= self.areas.transient.base()
            && self.acct.retained + need <= self.config.retain_limit()
        {
            Residency::Retained
        } else {
            return false;
        };
        let allocator = match residency {
            Residency::Kept => &mut self.areas.kept,
            _ => &mut self.areas.retained,
        };
        if allocator.alloc_at(extent).is_none() {
            return false;
        }
        self.areas.owners.insert(offset, key);
        self.entries.insert(
            key,
            Entry::Ready {
                extent,
                len,
                crc32c,
                pins: 0,
                residency,
            },
        );
        self.acct.cached += need;
        self.changes += 1;
        match residency {
            Residency::Kept => self.acct.kept += need,
            _ => {
                self.acct.retained += need;
                self.policy.insert(key);
            }
        }
        true
    }

    /// Drops `key` from the cache: a Failed record without pins, or a
    /// cached (retained, Ready, unpinned) sample, e.g. when its dataset
    /// changed.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`] or [`CacheError::Busy`] (pinned or in
    /// flight).
    #[cfg(test)]
    pub(crate) fn forget(&mut self, key: SampleKey) -> Result<(), CacheError> {
        match self.entries.get(&key) {
            None => Err(CacheError::NotFound(key)),
            Some(Entry::Failed { pins: 0, .. }) => {
                self.entries.remove(&key);
                Ok(())
            }
            Some(Entry::Ready {
                pins: 0,
                residency: Residency::Retained,
                ..
            }) => self.evict(key, false),
            Some(_) => Err(CacheError::Busy(key)),
        }
    }
}
