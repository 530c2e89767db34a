//! The arena's byte range split into the retained, transient and keep
//! areas, each with its own extent allocator.

use std::collections::BTreeMap;

use super::{CacheConfig, Residency, SampleKey};
use crate::extent::{Extent, ExtentAllocator};

/// The arena range split in two: the retained area `[base, base +
/// retain_limit)`, where retained extents live (and transient ones when the
/// transient area is full), and the transient area after it. Keeping the
/// short-lived transient extents apart stops them from fragmenting the
/// retained set, and retained extents from scattering the transients' room.
#[derive(Debug, Clone)]
pub(super) struct Areas {
    pub(super) retained: ExtentAllocator,
    pub(super) transient: ExtentAllocator,
    pub(super) kept: ExtentAllocator,
    /// Every live extent's offset and the sample it holds, in offset order,
    /// for finding a victim's neighbours.
    pub(super) owners: BTreeMap<u64, SampleKey>,
}

impl Areas {
    pub(super) fn new(config: &CacheConfig) -> Self {
        let limit = config.retain_limit();
        Areas {
            retained: ExtentAllocator::with_base(config.base, limit),
            transient: ExtentAllocator::with_base(config.base + limit, config.transient_len()),
            kept: ExtentAllocator::with_base(
                config.base + config.arena_size - config.keep_reserve,
                config.keep_reserve,
            ),
            owners: BTreeMap::new(),
        }
    }

    /// Allocates `need` bytes for `key` in the retained area, or for a
    /// transient entry in the transient area and failing that in the
    /// retained one.
    pub(super) fn alloc(
        &mut self,
        key: SampleKey,
        need: u64,
        align: u64,
        residency: Residency,
    ) -> Result<Extent, crate::extent::ExtentError> {
        let extent = match residency {
            Residency::Retained => self.retained.try_alloc(need, align),
            Residency::Transient => self
                .transient
                .try_alloc(need, align)
                .or_else(|_| self.retained.try_alloc(need, align)),
            Residency::Kept => self.kept.try_alloc(need, align),
        }?;
        self.owners.insert(extent.offset, key);
        Ok(extent)
    }

    /// The allocator that owns offset `offset`.
    pub(super) fn owner(&mut self, offset: u64) -> &mut ExtentAllocator {
        if offset < self.transient.base() {
            &mut self.retained
        } else if offset < self.kept.base() {
            &mut self.transient
        } else {
            &mut self.kept
        }
    }

    pub(super) fn free(&mut self, extent: Extent) -> Result<(), crate::extent::ExtentError> {
        self.owner(extent.offset).free(extent)?;
        self.owners.remove(&extent.offset);
        Ok(())
    }

    pub(super) fn is_allocated(&self, extent: Extent) -> bool {
        self.retained.is_allocated(extent)
            || self.transient.is_allocated(extent)
            || self.kept.is_allocated(extent)
    }

    pub(super) fn free_bytes(&self) -> u64 {
        self.retained.free_bytes() + self.transient.free_bytes() + self.kept.free_bytes()
    }

    pub(super) fn live_extents(&self) -> usize {
        self.retained.live_extents() + self.transient.live_extents() + self.kept.live_extents()
    }

    pub(super) fn check(&self) -> Result<(), String> {
        self.retained.check()?;
        self.transient.check()?;
        self.kept.check()?;
        if self.owners.len() != self.live_extents() {
            return Err(format!(
                "{} extents have owners, {} are live",
                self.owners.len(),
                self.live_extents()
            ));
        }
        Ok(())
    }
}
