//! A read's outcome (complete, fail, abandon) and the pins of the batches
//! that hold a sample.

use super::*;

impl Cache {
    /// The in-flight entry of `key`: its extent, length, pins and
    /// residency.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`] or [`CacheError::WrongState`] (not in
    /// flight).
    fn in_flight(&self, key: SampleKey) -> Result<(Extent, u64, u32, Residency), CacheError> {
        let entry = self.entries.get(&key).ok_or(CacheError::NotFound(key))?;
        match *entry {
            Entry::InFlight {
                extent,
                len,
                pins,
                residency,
            } => Ok((extent, len, pins, residency)),
            _ => Err(CacheError::WrongState {
                key,
                state: entry.state(),
                expected: "in flight",
            }),
        }
    }

    /// The read of `key` finished with content checksum `crc32c`: the sample
    /// is Ready with the pins it gathered while in flight. A transient read
    /// whose pins are all gone is discarded and its extent freed; a retained
    /// one without pins becomes evictable.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`] or [`CacheError::WrongState`] (not in
    /// flight).
    pub(crate) fn complete(
        &mut self,
        key: SampleKey,
        crc32c: u32,
    ) -> Result<Completion, CacheError> {
        let (extent, len, pins, residency) = self.in_flight(key)?;
        self.stats.completions += 1;
        if pins == 0 && residency == Residency::Transient {
            self.areas
                .free(extent)
                .map_err(|e| CacheError::Internal(format!("discarding {key}: {e}")))?;
            self.entries.remove(&key);
            self.acct.in_flight -= extent.len;
            self.acct.transient -= extent.len;
            self.stats.discarded += 1;
            return Ok(Completion::Discarded);
        }
        let ready = Entry::Ready {
            extent,
            len,
            crc32c,
            pins,
            residency,
        };
        self.entries.insert(key, ready);
        self.changes += 1;
        if let (Some(j), Residency::Retained | Residency::Kept) = (self.journal.as_mut(), residency)
        {
            j.push((key, extent.offset, len, crc32c));
        }
        self.acct.in_flight -= extent.len;
        if pins > 0 {
            self.acct.pinned += extent.len;
        } else {
            self.acct.cached += extent.len;
            if residency != Residency::Kept {
                self.policy.insert(key);
            }
        }
        match ready.lookup() {
            Lookup::Ready(r) => Ok(Completion::Ready(r)),
            _ => Err(CacheError::Internal(
                "ready entry reads back otherwise".into(),
            )),
        }
    }

    /// The read of `key` failed with error `code`: its extent is freed and
    /// the entry is Failed, keeping its pins (each holder unpins it). A
    /// later [`reserve`](Self::reserve) retries, taking the pins over;
    /// [`forget`](Self::forget) drops a record without pins.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`] or [`CacheError::WrongState`] (not in
    /// flight).
    pub(crate) fn fail(&mut self, key: SampleKey, code: u32) -> Result<(), CacheError> {
        let (extent, _, pins, residency) = self.in_flight(key)?;
        self.areas
            .free(extent)
            .map_err(|e| CacheError::Internal(format!("failing {key}: {e}")))?;
        self.entries.insert(key, Entry::Failed { code, pins });
        self.acct.in_flight -= extent.len;
        match residency {
            Residency::Retained => self.acct.retained -= extent.len,
            Residency::Transient => self.acct.transient -= extent.len,
            Residency::Kept => self.acct.kept -= extent.len,
        }
        self.stats.failures += 1;
        Ok(())
    }

    /// Takes back the reservation of `key`, in flight without a pin and
    /// whose read never started (a peer's request for it was cancelled
    /// while the read waited for room at the source): its extent is freed
    /// and the entry removed, as if it had never been reserved.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`], or [`CacheError::Busy`] when it is not in
    /// flight or is pinned.
    pub(crate) fn abandon(&mut self, key: SampleKey) -> Result<(), CacheError> {
        let entry = self.entries.get(&key).ok_or(CacheError::NotFound(key))?;
        let Entry::InFlight {
            extent,
            pins: 0,
            residency,
            ..
        } = *entry
        else {
            return Err(CacheError::Busy(key));
        };
        self.areas
            .free(extent)
            .map_err(|e| CacheError::Internal(format!("abandoning {key}: {e}")))?;
        self.entries.remove(&key);
        self.acct.in_flight -= extent.len;
        match residency {
            Residency::Retained => self.acct.retained -= extent.len,
            Residency::Transient => self.acct.transient -= extent.len,
            Residency::Kept => self.acct.kept -= extent.len,
        }
        Ok(())
    }

    /// Takes a pin on `key` (Ready or in flight), returning the new pin
    /// count. A pinned sample is never evicted or moved.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`], [`CacheError::Failed`] or
    /// [`CacheError::PinOverflow`].
    pub(crate) fn pin(&mut self, key: SampleKey) -> Result<u32, CacheError> {
        let entry = self
            .entries
            .get_mut(&key)
            .ok_or(CacheError::NotFound(key))?;
        match entry {
            Entry::Ready { extent, pins, .. } => {
                let new = pins.checked_add(1).ok_or(CacheError::PinOverflow(key))?;
                if *pins == 0 {
                    // Only retained entries are Ready without pins.
                    self.acct.cached -= extent.len;
                    self.acct.pinned += extent.len;
                    self.policy.remove(key);
                }
                *pins = new;
                self.policy.touch(key);
                Ok(new)
            }
            Entry::InFlight { pins, .. } => {
                *pins = pins.checked_add(1).ok_or(CacheError::PinOverflow(key))?;
                Ok(*pins)
            }
            Entry::Failed { code, .. } => Err(CacheError::Failed { key, code: *code }),
        }
    }

    /// Releases one pin on `key`. The last pin of a Ready sample makes it
    /// evictable (retained) or frees it (transient); the last pin of an
    /// in-flight sample parks it until its read ends.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotFound`] or [`CacheError::NotPinned`].
    pub(crate) fn unpin(&mut self, key: SampleKey) -> Result<(), CacheError> {
        let entry = self
            .entries
            .get_mut(&key)
            .ok_or(CacheError::NotFound(key))?;
        match entry {
            Entry::Ready {
                extent,
                pins,
                residency,
                ..
            } => {
                if *pins == 0 {
                    return Err(CacheError::NotPinned(key));
                }
                *pins -= 1;
                if *pins > 0 {
                    return Ok(());
                }
                let (extent, residency) = (*extent, *residency);
                self.acct.pinned -= extent.len;
                match residency {
                    Residency::Retained => {
                        self.acct.cached += extent.len;
                        self.policy.insert(key);
                    }
                    Residency::Kept => self.acct.cached += extent.len,
                    Residency::Transient => {
                        self.areas
                            .free(extent)
                            .map_err(|e| CacheError::Internal(format!("freeing {key}: {e}")))?;
                        self.entries.remove(&key);
                        self.acct.transient -= extent.len;
                    }
                }
                Ok(())
            }
            Entry::InFlight { pins, .. } | Entry::Failed { pins, .. } => {
                if *pins == 0 {
                    return Err(CacheError::NotPinned(key));
                }
                *pins -= 1;
                Ok(())
            }
        }
    }
}
