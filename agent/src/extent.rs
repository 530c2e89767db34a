//! Extent allocation over the arena's byte range.
//!
//! The arena is one contiguous range of bytes `[0, size)`. An
//! [`ExtentAllocator`] hands out disjoint sub-ranges ([`Extent`]s) of it (or
//! of a part of it, `[base, base + size)`) and takes them back. It is pure
//! bookkeeping: it never touches the arena's memory.
//!
//! * **Free list.** Free ranges live in a `BTreeMap` keyed by offset (for
//!   coalescing with the neighbours of a freed extent) and in a `BTreeSet` of
//!   `(length, offset)` pairs (for best fit). Adjacent free ranges are always
//!   merged, so the free list never holds two touching ranges.
//! * **Best fit.** [`ExtentAllocator::alloc`] takes the smallest free range
//!   that can hold the request at the requested alignment, and splits off the
//!   alignment padding in front of it and the remainder behind it, which stay
//!   free.
//! * **Ownership.** Every live extent is recorded, so freeing an extent that
//!   is not exactly one live allocation (a double free, a foreign or a
//!   partial extent) is reported as an error and changes nothing.
//!
//! Every operation is `O(log n)` in the number of free ranges and live
//! extents.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// A range of arena bytes: `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Extent {
    /// First byte of the range, counted from the start of the arena.
    pub offset: u64,
    /// Number of bytes in the range.
    pub len: u64,
}

impl Extent {
    /// One past the last byte of the range (saturating, so a hostile extent
    /// cannot overflow).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, +{})", self.offset, self.len)
    }
}

/// Why an extent could not be allocated or freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentError {
    /// A zero-length allocation was requested.
    ZeroLength,
    /// The requested alignment is not a power of two.
    BadAlignment {
        /// The requested alignment.
        align: u64,
    },
    /// No free range can hold the request at its alignment.
    NoSpace {
        /// The requested length.
        len: u64,
        /// The requested alignment.
        align: u64,
        /// The largest free range at the time of the request.
        largest_free: u64,
    },
    /// The extent is not a live allocation of this allocator: it was already
    /// freed, was never allocated here, or covers only part of (or more
    /// than) one allocation. Nothing was changed.
    NotAllocated {
        /// The extent that was passed in.
        extent: Extent,
    },
}

impl fmt::Display for ExtentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtentError::ZeroLength => write!(f, "cannot allocate an extent of 0 bytes"),
            ExtentError::BadAlignment { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
            ExtentError::NoSpace {
                len,
                align,
                largest_free,
            } => write!(
                f,
                "no free range holds {len} bytes aligned to {align} (largest free range: {largest_free} bytes)"
            ),
            ExtentError::NotAllocated { extent } => write!(
                f,
                "extent {extent} is not a live allocation (double free or foreign extent)"
            ),
        }
    }
}

impl std::error::Error for ExtentError {}

/// Allocator of disjoint extents of the byte range `[base, base + size)`
/// (`base` is 0 unless made with [`ExtentAllocator::with_base`]).
#[derive(Debug, Clone)]
pub(crate) struct ExtentAllocator {
    base: u64,
    size: u64,
    /// Free ranges: offset → length. Never two adjacent entries.
    free_by_offset: BTreeMap<u64, u64>,
    /// The same free ranges as `(length, offset)`, for best fit.
    free_by_len: BTreeSet<(u64, u64)>,
    /// Live allocations: offset → length.
    live: HashMap<u64, u64>,
    free_bytes: u64,
}

/// How many free ranges at least as long as a request best fit looks at
/// before it falls back to the smallest range that fits at any alignment.
const BEST_FIT_PROBES: usize = 8;

impl ExtentAllocator {
    /// An allocator over `[0, size)`, all free. `size` may be 0 (nothing can
    /// be allocated).
    pub fn new(size: u64) -> Self {
        Self::with_base(0, size)
    }

    /// An allocator over `[base, base + size)`, all free; offsets are
    /// absolute, so alignment applies to them. `size` is cut so that the
    /// range ends at most at `u64::MAX`.
    pub(crate) fn with_base(base: u64, size: u64) -> Self {
        let size = size.min(u64::MAX - base);
        let mut a = ExtentAllocator {
            base,
            size,
            free_by_offset: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            live: HashMap::new(),
            free_bytes: size,
        };
        if size > 0 {
            a.insert_free(base, size);
        }
        a
    }

    /// The first byte of the managed range.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The size of the managed range.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes not covered by any live extent.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The length of the largest free range (0 when none is free).
    pub(crate) fn largest_free(&self) -> u64 {
        self.free_by_len.last().map_or(0, |&(len, _)| len)
    }

    /// The number of free ranges (a measure of fragmentation).
    #[cfg(test)]
    pub(crate) fn free_ranges(&self) -> usize {
        self.free_by_offset.len()
    }

    /// The number of live extents.
    pub(crate) fn live_extents(&self) -> usize {
        self.live.len()
    }

    /// Whether `extent` is exactly one live allocation.
    pub(crate) fn is_allocated(&self, extent: Extent) -> bool {
        extent.len > 0 && self.live.get(&extent.offset) == Some(&extent.len)
    }

    /// Allocates `len` bytes whose offset is a multiple of `align` (a power
    /// of two; 1 for no alignment), from the smallest free range that can
    /// hold them. The returned extent is exactly `len` long; padding needed
    /// for alignment stays free. `None` when the request is invalid (zero
    /// length, alignment not a power of two) or no free range can hold it;
    /// [`try_alloc`](Self::try_alloc) says which.
    ///
    /// The search looks at the smallest free ranges of at least `len`
    /// bytes (up to eight) and then at the smallest one of at least
    /// `len + align - 1` bytes, which holds the request at any offset. So
    /// with `align == 1`, or when every offset and length in the range is a
    /// multiple of `align`, it fails only if no free range can hold the
    /// request; otherwise it may miss a short range whose offset happens to
    /// suit. `O(log n)`.
    pub(crate) fn alloc(&mut self, len: u64, align: u64) -> Option<Extent> {
        self.try_alloc(len, align).ok()
    }

    /// [`alloc`](Self::alloc), saying why it fails.
    ///
    /// # Errors
    ///
    /// [`ExtentError::ZeroLength`], [`ExtentError::BadAlignment`], or
    /// [`ExtentError::NoSpace`] when no free range can hold the request.
    pub(crate) fn try_alloc(&mut self, len: u64, align: u64) -> Result<Extent, ExtentError> {
        if len == 0 {
            return Err(ExtentError::ZeroLength);
        }
        if !align.is_power_of_two() {
            return Err(ExtentError::BadAlignment { align });
        }
        let Some((free_off, free_len, start)) = self.find(len, align) else {
            return Err(ExtentError::NoSpace {
                len,
                align,
                largest_free: self.largest_free(),
            });
        };
        self.remove_free(free_off, free_len);
        let head = start - free_off;
        if head > 0 {
            self.insert_free(free_off, head);
        }
        let tail = free_len - head - len;
        if tail > 0 {
            self.insert_free(start + len, tail);
        }
        self.live.insert(start, len);
        self.free_bytes -= len;
        Ok(Extent { offset: start, len })
    }

    /// Allocates exactly `extent` when every byte of it is free (a warm
    /// restart puts a recovered sample back where its bytes are). `None`
    /// when it is empty, leaves the managed range or overlaps a live
    /// extent; nothing changes then.
    pub(crate) fn alloc_at(&mut self, extent: Extent) -> Option<Extent> {
        let Extent { offset, len } = extent;
        let end = offset.checked_add(len)?;
        if len == 0 || offset < self.base || end > self.base + self.size {
            return None;
        }
        let (&free_off, &free_len) = self.free_by_offset.range(..=offset).next_back()?;
        if free_off + free_len < end {
            return None;
        }
        self.remove_free(free_off, free_len);
        if offset > free_off {
            self.insert_free(free_off, offset - free_off);
        }
        if free_off + free_len > end {
            self.insert_free(end, free_off + free_len - end);
        }
        self.live.insert(offset, len);
        self.free_bytes -= len;
        Some(extent)
    }

    /// Whether [`alloc`](Self::alloc)`(len, align)` would succeed now.
    pub(crate) fn can_alloc(&self, len: u64, align: u64) -> bool {
        len > 0 && align.is_power_of_two() && self.find(len, align).is_some()
    }

    /// The best free range for the request: `(range offset, range length,
    /// aligned start)`.
    fn find(&self, len: u64, align: u64) -> Option<(u64, u64, u64)> {
        let fits = |off: u64, flen: u64| -> Option<u64> {
            let start = off.checked_next_multiple_of(align)?;
            let end = start.checked_add(len)?;
            (end <= off + flen).then_some(start)
        };
        // Best fit: the smallest ranges that are long enough, as long as
        // alignment does not get in the way.
        for &(flen, off) in self.free_by_len.range((len, 0)..).take(BEST_FIT_PROBES) {
            if let Some(start) = fits(off, flen) {
                return Some((off, flen, start));
            }
        }
        // A range of len + align - 1 bytes holds the request at any offset.
        let sure = len.checked_add(align - 1)?;
        let &(flen, off) = self.free_by_len.range((sure, 0)..).next()?;
        fits(off, flen).map(|start| (off, flen, start))
    }

    /// Frees a live extent, merging it with free neighbours.
    ///
    /// # Errors
    ///
    /// [`ExtentError::NotAllocated`] when `extent` is not exactly one live
    /// allocation (double free, foreign or partial extent); nothing changes.
    pub fn free(&mut self, extent: Extent) -> Result<(), ExtentError> {
        if !self.is_allocated(extent) {
            return Err(ExtentError::NotAllocated { extent });
        }
        self.live.remove(&extent.offset);
        self.free_bytes += extent.len;
        let (off, len) = self.coalesced(extent);
        if off < extent.offset {
            let prev_len = extent.offset - off;
            self.remove_free(off, prev_len);
        }
        let end = extent.offset + extent.len;
        if off + len > end {
            self.remove_free(end, off + len - end);
        }
        self.insert_free(off, len);
        Ok(())
    }

    /// The free range `(offset, length)` that freeing the live `extent`
    /// would produce, merged with its free neighbours.
    fn coalesced(&self, extent: Extent) -> (u64, u64) {
        let mut off = extent.offset;
        let mut len = extent.len;
        if let Some((&p_off, &p_len)) = self.free_by_offset.range(..extent.offset).next_back() {
            if p_off + p_len == extent.offset {
                off = p_off;
                len += p_len;
            }
        }
        let end = extent.offset + extent.len;
        if let Some(&n_len) = self.free_by_offset.get(&end) {
            len += n_len;
        }
        (off, len)
    }

    /// The length of the free range that freeing `extent` would leave
    /// (the extent merged with its free neighbours), or `None` when `extent`
    /// is not a live allocation. Lets a caller choose, among several
    /// extents, one whose release makes room for a request.
    pub(crate) fn hole_if_freed(&self, extent: Extent) -> Option<u64> {
        self.is_allocated(extent).then(|| self.coalesced(extent).1)
    }

    /// The free range that ends exactly at `offset`, if any.
    pub(crate) fn free_range_ending_at(&self, offset: u64) -> Option<Extent> {
        let (&off, &len) = self.free_by_offset.range(..offset).next_back()?;
        (off + len == offset).then_some(Extent { offset: off, len })
    }

    /// The free range that starts exactly at `offset`, if any.
    pub(crate) fn free_range_at(&self, offset: u64) -> Option<Extent> {
        self.free_by_offset
            .get(&offset)
            .map(|&len| Extent { offset, len })
    }

    /// The free ranges in offset order, as extents.
    #[cfg(test)]
    pub(crate) fn free_extents(&self) -> impl Iterator<Item = Extent> + '_ {
        self.free_by_offset
            .iter()
            .map(|(&offset, &len)| Extent { offset, len })
    }

    /// Checks the allocator's internal consistency: the two free indexes
    /// agree, free ranges are disjoint, non-adjacent and inside the range,
    /// live extents do not overlap free ranges or each other, and the byte
    /// counts add up to the size.
    ///
    /// # Errors
    ///
    /// A description of the first inconsistency found.
    pub fn check(&self) -> Result<(), String> {
        if self.free_by_offset.len() != self.free_by_len.len() {
            return Err(format!(
                "free indexes disagree: {} ranges by offset, {} by length",
                self.free_by_offset.len(),
                self.free_by_len.len()
            ));
        }
        let mut ranges: Vec<(u64, u64, bool)> = Vec::new();
        let mut free_sum = 0u64;
        for (&off, &len) in &self.free_by_offset {
            if len == 0 || !self.free_by_len.contains(&(len, off)) {
                return Err(format!("free range [{off}, +{len}) badly indexed"));
            }
            free_sum += len;
            ranges.push((off, len, true));
        }
        if free_sum != self.free_bytes {
            return Err(format!(
                "free bytes counted {} but ranges hold {free_sum}",
                self.free_bytes
            ));
        }
        let mut live_sum = 0u64;
        for (&off, &len) in &self.live {
            live_sum += len;
            ranges.push((off, len, false));
        }
        if live_sum + free_sum != self.size {
            return Err(format!(
                "live {live_sum} + free {free_sum} != size {}",
                self.size
            ));
        }
        ranges.sort_unstable();
        let mut cursor = self.base;
        let mut prev_free = false;
        for (off, len, is_free) in ranges {
            if off != cursor {
                return Err(format!(
                    "gap or overlap at offset {off} (expected {cursor})"
                ));
            }
            if is_free && prev_free {
                return Err(format!("adjacent free ranges not merged at {off}"));
            }
            prev_free = is_free;
            cursor = off
                .checked_add(len)
                .ok_or_else(|| format!("range at {off} overflows"))?;
        }
        if cursor != self.base + self.size {
            return Err(format!(
                "ranges end at {cursor}, the range at {}",
                self.base + self.size
            ));
        }
        Ok(())
    }

    fn insert_free(&mut self, off: u64, len: u64) {
        self.free_by_offset.insert(off, len);
        self.free_by_len.insert((len, off));
    }

    fn remove_free(&mut self, off: u64, len: u64) {
        self.free_by_offset.remove(&off);
        self.free_by_len.remove(&(len, off));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the randomized tests.
    struct Rng(granary_base::SplitMix64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0.below(n)
        }
    }

    #[test]
    fn allocates_and_coalesces() {
        let mut a = ExtentAllocator::new(100);
        let x = a.try_alloc(10, 1).unwrap();
        let y = a.try_alloc(20, 1).unwrap();
        let z = a.try_alloc(30, 1).unwrap();
        assert_eq!(x, Extent { offset: 0, len: 10 });
        assert_eq!(
            y,
            Extent {
                offset: 10,
                len: 20
            }
        );
        assert_eq!(
            z,
            Extent {
                offset: 30,
                len: 30
            }
        );
        assert_eq!(a.free_bytes(), 40);
        assert_eq!(a.largest_free(), 40);
        a.free(y).unwrap();
        assert_eq!(a.free_ranges(), 2);
        assert_eq!(a.largest_free(), 40);
        a.free(x).unwrap();
        assert_eq!(a.free_ranges(), 2);
        assert_eq!(a.largest_free(), 40);
        assert_eq!(a.free_extents().next(), Some(Extent { offset: 0, len: 30 }));
        a.free(z).unwrap();
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.largest_free(), 100);
        assert_eq!(a.free_bytes(), 100);
        a.check().unwrap();
    }

    #[test]
    fn best_fit_picks_smallest_hole() {
        let mut a = ExtentAllocator::new(1000);
        let e: Vec<Extent> = [100, 10, 50, 10, 30, 10]
            .iter()
            .map(|&l| a.try_alloc(l, 1).unwrap())
            .collect();
        // Holes of 100, 50 and 30 bytes, plus the 790-byte tail.
        a.free(e[0]).unwrap();
        a.free(e[2]).unwrap();
        a.free(e[4]).unwrap();
        let got = a.try_alloc(25, 1).unwrap();
        assert_eq!(
            got,
            Extent {
                offset: e[4].offset,
                len: 25
            }
        );
        let got = a.try_alloc(40, 1).unwrap();
        assert_eq!(got.offset, e[2].offset);
        let got = a.try_alloc(60, 1).unwrap();
        assert_eq!(got.offset, e[0].offset);
        a.check().unwrap();
    }

    #[test]
    fn alignment_is_honoured_and_padding_stays_free() {
        let mut a = ExtentAllocator::new(8192);
        let small = a.try_alloc(100, 1).unwrap();
        let aligned = a.try_alloc(1000, 4096).unwrap();
        assert_eq!(aligned.offset, 4096);
        assert_eq!(a.free_bytes(), 8192 - 1100);
        // The padding [100, 4096) is free and usable.
        let pad = a.try_alloc(3996, 1).unwrap();
        assert_eq!(pad.offset, 100);
        a.free(small).unwrap();
        a.free(aligned).unwrap();
        a.free(pad).unwrap();
        assert_eq!(a.largest_free(), 8192);
        // A request that fits only when the hole's start is aligned.
        let mut b = ExtentAllocator::new(4096 * 3);
        let _head = b.try_alloc(10, 1).unwrap();
        assert!(b.can_alloc(4096 * 2, 4096));
        assert!(!b.can_alloc(4096 * 3 - 10, 4096));
        assert_eq!(b.try_alloc(4096 * 2, 4096).unwrap().offset, 4096);
        b.check().unwrap();
        // A range that starts past 0: offsets are absolute.
        let mut c = ExtentAllocator::with_base(1000, 200);
        assert_eq!((c.base(), c.size()), (1000, 200));
        assert_eq!(
            c.try_alloc(64, 64).unwrap(),
            Extent {
                offset: 1024,
                len: 64
            }
        );
        assert_eq!(
            c.alloc(100, 1),
            Some(Extent {
                offset: 1088,
                len: 100
            })
        );
        assert_eq!(c.alloc(25, 1), None);
        assert_eq!(c.free_bytes(), 36);
        c.check().unwrap();
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut a = ExtentAllocator::new(64);
        assert_eq!(a.try_alloc(0, 1), Err(ExtentError::ZeroLength));
        assert_eq!(
            a.try_alloc(8, 3),
            Err(ExtentError::BadAlignment { align: 3 })
        );
        assert_eq!(
            a.try_alloc(8, 0),
            Err(ExtentError::BadAlignment { align: 0 })
        );
        assert_eq!(
            a.try_alloc(65, 1),
            Err(ExtentError::NoSpace {
                len: 65,
                align: 1,
                largest_free: 64
            })
        );
        assert!(matches!(
            a.try_alloc(u64::MAX, 1 << 63),
            Err(ExtentError::NoSpace { .. })
        ));
        let x = a.try_alloc(16, 1).unwrap();
        // Foreign, partial, oversized and double frees change nothing.
        for bad in [
            Extent {
                offset: 16,
                len: 16,
            },
            Extent { offset: 0, len: 8 },
            Extent { offset: 0, len: 32 },
            Extent { offset: 0, len: 0 },
            Extent {
                offset: u64::MAX,
                len: u64::MAX,
            },
        ] {
            assert_eq!(a.free(bad), Err(ExtentError::NotAllocated { extent: bad }));
            a.check().unwrap();
            assert_eq!(a.free_bytes(), 48);
        }
        a.free(x).unwrap();
        assert_eq!(a.free(x), Err(ExtentError::NotAllocated { extent: x }));
        assert_eq!(a.free_bytes(), 64);
        a.check().unwrap();
        assert!(!ExtentError::NotAllocated { extent: x }
            .to_string()
            .is_empty());
        // An empty allocator.
        let mut e = ExtentAllocator::new(0);
        assert!(e.try_alloc(1, 1).is_err());
        assert_eq!(e.largest_free(), 0);
        e.check().unwrap();
    }

    #[test]
    fn hole_if_freed_reports_the_merged_range() {
        let mut a = ExtentAllocator::new(100);
        let x = a.try_alloc(10, 1).unwrap();
        let y = a.try_alloc(10, 1).unwrap();
        let z = a.try_alloc(10, 1).unwrap();
        assert_eq!(a.hole_if_freed(y), Some(10));
        a.free(x).unwrap();
        assert_eq!(a.hole_if_freed(y), Some(20));
        assert_eq!(a.hole_if_freed(z), Some(10 + 70));
        a.free(z).unwrap();
        assert_eq!(a.hole_if_freed(y), Some(100));
        assert_eq!(a.hole_if_freed(z), None);
        assert_eq!(
            a.free_range_ending_at(10),
            Some(Extent { offset: 0, len: 10 })
        );
        assert_eq!(
            a.free_range_at(20),
            Some(Extent {
                offset: 20,
                len: 80
            })
        );
        assert_eq!(a.free_range_at(0), Some(Extent { offset: 0, len: 10 }));
        assert_eq!(a.free_range_ending_at(20), None);
        assert_eq!(a.free_range_at(10), None);
    }

    /// Random allocations and frees against a byte map: no two live extents
    /// overlap, every byte is accounted for, the largest free range is
    /// exact, and bad frees are refused.
    #[test]
    fn randomized_against_a_byte_model() {
        for seed in 0..20u64 {
            let size = 1 + Rng(granary_base::SplitMix64(seed)).below(4096);
            let mut rng = Rng(granary_base::SplitMix64(seed * 7919 + 1));
            let mut a = ExtentAllocator::new(size);
            // model[i] = Some(id) when byte i belongs to live extent id.
            let mut model: Vec<Option<usize>> = vec![None; size as usize];
            let mut live: Vec<Extent> = Vec::new();
            for step in 0..3000 {
                let op = rng.below(10);
                if op < 5 {
                    let max = if rng.below(4) == 0 { size } else { 64 };
                    let len = 1 + rng.below(max);
                    let align = 1u64 << rng.below(7);
                    match a.try_alloc(len, align) {
                        Ok(e) => {
                            assert_eq!(e.len, len);
                            assert_eq!(e.offset % align, 0);
                            assert!(e.end() <= size);
                            for b in e.offset..e.end() {
                                assert!(model[b as usize].is_none(), "overlap at {b}");
                                model[b as usize] = Some(live.len());
                            }
                            live.push(e);
                        }
                        Err(ExtentError::NoSpace { .. }) => {
                            // No free run holds it at any offset (len +
                            // align - 1 bytes); unaligned, no run holds it
                            // at all.
                            let mut run = 0u64;
                            for b in model.iter().chain(std::iter::once(&Some(0))) {
                                if b.is_none() {
                                    run += 1;
                                } else {
                                    assert!(
                                        run < len + align - 1,
                                        "missed a fit for {len}@{align} in a run of {run}"
                                    );
                                    run = 0;
                                }
                            }
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                } else if op < 9 && !live.is_empty() {
                    let i = rng.below(live.len() as u64) as usize;
                    let e = live.swap_remove(i);
                    a.free(e).unwrap();
                    for b in e.offset..e.end() {
                        model[b as usize] = None;
                    }
                    // Ids moved by swap_remove.
                    if i < live.len() {
                        let moved = live[i];
                        for b in moved.offset..moved.end() {
                            model[b as usize] = Some(i);
                        }
                    }
                    // Double free.
                    assert!(a.free(e).is_err());
                } else {
                    // A random extent that is not exactly a live one.
                    let off = rng.below(size + 2);
                    let len = rng.below(size + 2);
                    let e = Extent { offset: off, len };
                    if !live.contains(&e) {
                        assert_eq!(a.free(e), Err(ExtentError::NotAllocated { extent: e }));
                    }
                }
                let model_free = model.iter().filter(|b| b.is_none()).count() as u64;
                assert_eq!(a.free_bytes(), model_free, "seed {seed} step {step}");
                let mut largest = 0u64;
                let mut run = 0u64;
                for b in &model {
                    run = if b.is_none() { run + 1 } else { 0 };
                    largest = largest.max(run);
                }
                assert_eq!(a.largest_free(), largest);
                assert_eq!(a.live_extents(), live.len());
                if step % 97 == 0 {
                    a.check().unwrap();
                }
            }
            for e in live.drain(..) {
                a.free(e).unwrap();
            }
            assert_eq!(a.free_bytes(), size);
            assert_eq!(a.free_ranges(), 1);
            a.check().unwrap();
        }
    }

    #[test]
    fn alloc_at_takes_exactly_a_free_range() {
        let mut a = ExtentAllocator::with_base(4096, 1 << 16);
        let x = Extent {
            offset: 8192,
            len: 4096,
        };
        assert_eq!(a.alloc_at(x), Some(x));
        assert_eq!(a.alloc_at(x), None, "taken");
        assert_eq!(
            a.alloc_at(Extent {
                offset: 10_000,
                len: 100
            }),
            None,
            "overlaps"
        );
        assert_eq!(
            a.alloc_at(Extent {
                offset: 0,
                len: 100
            }),
            None,
            "below the base"
        );
        assert_eq!(
            a.alloc_at(Extent {
                offset: 4096 + (1 << 16) - 10,
                len: 20
            }),
            None,
            "past the end"
        );
        let y = Extent {
            offset: 4096,
            len: 4096,
        };
        assert_eq!(a.alloc_at(y), Some(y));
        a.check().unwrap();
        assert_eq!(a.free_bytes(), (1 << 16) - 8192);
        a.free(x).unwrap();
        a.free(y).unwrap();
        a.check().unwrap();
        assert_eq!(a.free_bytes(), 1 << 16);
    }
}
