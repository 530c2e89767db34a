//! A minimal single-producer / single-consumer ring: the yardstick the ring
//! benchmark measures granary's ring against.
//!
//! Two free-running `u64` indices, each on its own 128-byte line, followed by
//! the item slots (the same geometry as granary's ring):
//!
//! ```text
//! 0     tail  (producer writes)      128-byte line
//! 128   head  (consumer writes)      128-byte line
//! 256   capacity × T
//! ```
//!
//! Nothing else: no validation of the peer's index, no parking and no
//! wake-up, plain (non-volatile) copies of the items. Waits spin, bounded by
//! a deadline. By default each batch loads the peer's index once;
//! [`Tuning::cache_peer`] makes an end keep a private copy of the peer's index and load the shared one
//! only when the copy says the ring is full (producer) or empty (consumer):
//! the minimal ring with cached peer indices, which touches the peer's cache
//! line only when it must.
//!
//! For diagnosis only, a [`Variant`] adds back, piece by piece, what granary's
//! ring does beyond this: volatile item copies ([`CopyMode`]), and after each
//! index store a `SeqCst` fence and a load of the peer's "waiting" flag
//! ([`PeerCheck`]), so a benchmark can attribute the difference.
//! The ordering is the textbook pair: items are written, then `tail` is stored
//! with `Release`; the consumer loads `tail` with `Acquire` before reading
//! them; the same for `head` in the other direction.

use granary_shm::layout::RingItem;
use granary_shm::region::Region;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of the two index lines in front of the slots.
pub const CONTROL_BYTES: usize = 256;

/// Bytes a ring of `capacity` items of `T` occupies.
pub const fn ring_bytes<T>(capacity: usize) -> usize {
    CONTROL_BYTES + capacity * std::mem::size_of::<T>()
}

/// Byte offsets, from the ring base, of the producer's and consumer's index lines.
const TAIL_AT: usize = 0;
const HEAD_AT: usize = 128;
/// Offset of a flag word inside an index line: next to the index (same 64-byte
/// cache line) or in the line's second, otherwise untouched, 64-byte half.
const FLAG_NEAR: usize = 12;
const FLAG_FAR: usize = 64;

/// What an end does after storing its index, besides nothing (diagnostics).
///
/// A ring that lets its peer park must, after publishing an index, fence and
/// look at the peer's "waiting" flag (the Dekker pattern). These variants add
/// that work to the baseline so its cost can be measured in isolation. The
/// flags are never set here, so no wake-up ever happens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerCheck {
    /// The plain baseline: store the index, nothing else.
    #[default]
    None,
    /// A `SeqCst` fence after each index store.
    Fence,
    /// Fence, then load a flag on the same 64-byte cache line as the peer's
    /// index (which the peer rewrites on every publication).
    FenceFlagNear,
    /// Fence, then load a flag on a 64-byte cache line the peer never writes.
    FenceFlagFar,
}

impl PeerCheck {
    /// Every variant, plain first.
    pub const ALL: [PeerCheck; 4] = [
        PeerCheck::None,
        PeerCheck::Fence,
        PeerCheck::FenceFlagNear,
        PeerCheck::FenceFlagFar,
    ];

    /// Short name: `""`, `+fence`, `+fence+flag`, `+fence+farflag`.
    pub fn suffix(self) -> &'static str {
        match self {
            PeerCheck::None => "",
            PeerCheck::Fence => "+fence",
            PeerCheck::FenceFlagNear => "+fence+flag",
            PeerCheck::FenceFlagFar => "+fence+farflag",
        }
    }

    /// Parses [`PeerCheck::suffix`].
    pub fn from_suffix(s: &str) -> Option<PeerCheck> {
        PeerCheck::ALL.into_iter().find(|c| c.suffix() == s)
    }
}

/// How an end copies items between its private memory and the slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMode {
    /// `ptr::write` / `ptr::read` of the whole item.
    #[default]
    Plain,
    /// `write_volatile` / `read_volatile` of the whole item (what granary's
    /// ring does).
    Volatile,
    /// One `write_volatile` / `read_volatile` per 8-byte word of the item.
    VolatileWords,
}

/// A baseline ring with optional extra work, for attribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// How the producer writes items.
    pub write: CopyMode,
    /// How the consumer reads items.
    pub read: CopyMode,
    /// Work after each index store.
    pub check: PeerCheck,
}

/// How one end of a baseline ring works, fixed when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// The diagnostic extra work.
    pub variant: Variant,
    /// The end keeps a private copy of the peer's index, reloaded only when
    /// the copy says the ring is too full for a batch (producer) or empty
    /// (consumer).
    pub cache_peer: bool,
}

impl Tuning {
    /// The plain baseline: no extra work, the peer's index loaded every batch.
    pub const PLAIN: Tuning = Tuning {
        variant: Variant::PLAIN,
        cache_peer: false,
    };
}

/// Names of the copy-mode pairs that [`Variant::suffix`] knows.
const COPY_NAMES: [(&str, CopyMode, CopyMode); 5] = [
    ("", CopyMode::Plain, CopyMode::Plain),
    ("+volatile", CopyMode::Volatile, CopyMode::Volatile),
    ("+vwrite", CopyMode::Volatile, CopyMode::Plain),
    ("+vread", CopyMode::Plain, CopyMode::Volatile),
    ("+words", CopyMode::VolatileWords, CopyMode::VolatileWords),
];

impl Variant {
    /// The plain baseline.
    pub const PLAIN: Variant = Variant {
        write: CopyMode::Plain,
        read: CopyMode::Plain,
        check: PeerCheck::None,
    };

    const fn new(write: CopyMode, read: CopyMode, check: PeerCheck) -> Variant {
        Variant { write, read, check }
    }

    /// The variants an attribution run measures besides the plain baseline.
    pub const ATTRIBUTION: [Variant; 9] = {
        use CopyMode::{Plain, Volatile, VolatileWords};
        use PeerCheck::{Fence, FenceFlagFar, FenceFlagNear, None};
        [
            Variant::new(Volatile, Volatile, None),
            Variant::new(Volatile, Plain, None),
            Variant::new(Plain, Volatile, None),
            Variant::new(VolatileWords, VolatileWords, None),
            Variant::new(Plain, Plain, Fence),
            Variant::new(Plain, Plain, FenceFlagNear),
            Variant::new(Plain, Plain, FenceFlagFar),
            Variant::new(Volatile, Volatile, FenceFlagNear),
            Variant::new(VolatileWords, VolatileWords, FenceFlagNear),
        ]
    };

    /// Short name: `""`, `+volatile`, `+vwrite`, `+vread`, `+words`, then the
    /// [`PeerCheck::suffix`]; e.g. `+volatile+fence+flag`.
    pub fn suffix(self) -> String {
        let copy = COPY_NAMES
            .iter()
            .find(|(_, w, r)| *w == self.write && *r == self.read)
            .map_or("+mixedcopy", |(name, _, _)| name);
        format!("{copy}{}", self.check.suffix())
    }

    /// Parses [`Variant::suffix`].
    pub fn from_suffix(s: &str) -> Option<Variant> {
        // Longest copy name first, so "" does not shadow the others.
        COPY_NAMES.iter().rev().find_map(|&(name, write, read)| {
            let rest = s.strip_prefix(name)?;
            PeerCheck::from_suffix(rest).map(|check| Variant { write, read, check })
        })
    }
}

/// Writes `v` to `dst` as `mode` says.
///
/// # Safety
/// `dst` is valid for writes of a `T` and 8-aligned.
#[inline(always)]
unsafe fn put<T: RingItem>(dst: *mut T, v: T, mode: CopyMode) {
    match mode {
        // SAFETY: forwarded contract.
        CopyMode::Plain => unsafe { dst.write(v) },
        // SAFETY: forwarded contract.
        CopyMode::Volatile => unsafe { dst.write_volatile(v) },
        CopyMode::VolatileWords => {
            let src = std::ptr::from_ref(&v).cast::<u64>();
            let dst = dst.cast::<u64>();
            for w in 0..std::mem::size_of::<T>() / 8 {
                // SAFETY: word `w` lies inside both `v` and `*dst` (T is a
                // multiple of 8 bytes, checked in `Raw::new`); both 8-aligned.
                let word = unsafe { src.wrapping_add(w).read_unaligned() };
                // SAFETY: as above.
                unsafe { dst.wrapping_add(w).write_volatile(word) };
            }
        }
    }
}

/// Reads a `T` from `src` as `mode` says.
///
/// # Safety
/// `src` is valid for reads of a `T` and 8-aligned.
#[inline(always)]
unsafe fn get<T: RingItem>(src: *const T, mode: CopyMode) -> T {
    match mode {
        // SAFETY: forwarded contract; any bit pattern is a valid `T`.
        CopyMode::Plain => unsafe { src.read() },
        // SAFETY: as above.
        CopyMode::Volatile => unsafe { src.read_volatile() },
        CopyMode::VolatileWords => {
            let mut out = T::default();
            let dst = std::ptr::from_mut(&mut out).cast::<u64>();
            let src = src.cast::<u64>();
            for w in 0..std::mem::size_of::<T>() / 8 {
                // SAFETY: word `w` lies inside both items (T is a multiple of
                // 8 bytes, checked in `Raw::new`); any bits are a valid `T`.
                let word = unsafe { src.wrapping_add(w).read_volatile() };
                // SAFETY: as above.
                unsafe { dst.wrapping_add(w).write_unaligned(word) };
            }
            out
        }
    }
}

/// A wait ran past its deadline (the peer stopped moving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("baseline ring: the peer made no progress before the deadline")
    }
}

impl std::error::Error for Stalled {}

/// Spins (with a pause hint) until `ready()` or `deadline`.
#[inline]
fn spin_until(deadline: Instant, mut ready: impl FnMut() -> bool) -> Result<(), Stalled> {
    loop {
        for _ in 0..1024 {
            if ready() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= deadline {
            return Err(Stalled);
        }
    }
}

struct Raw<T> {
    base: NonNull<u8>,
    mask: u64,
    capacity: u64,
    _keep: Arc<Region>,
    _item: PhantomData<T>,
}

impl<T: RingItem> Raw<T> {
    fn new(region: Arc<Region>, offset: usize, capacity: usize) -> Raw<T> {
        assert!(
            capacity.is_power_of_two(),
            "capacity must be a power of two"
        );
        let end = offset
            .checked_add(ring_bytes::<T>(capacity))
            .expect("ring size overflows");
        assert!(end <= region.len(), "ring does not fit in the region");
        let base = NonNull::new(region.as_ptr().wrapping_add(offset)).expect("non-null base");
        assert_eq!(
            base.as_ptr() as usize % 128,
            0,
            "ring base must be 128-aligned"
        );
        Raw {
            base,
            mask: capacity as u64 - 1,
            capacity: capacity as u64,
            _keep: region,
            _item: PhantomData,
        }
    }

    #[inline]
    fn index(&self, offset: usize) -> &AtomicU64 {
        let word = self.base.as_ptr().wrapping_add(offset).cast::<u64>();
        // SAFETY: `offset` is TAIL_AT or HEAD_AT, inside the control lines
        // that `new` checked lie in the region (kept alive by `_keep`); the
        // base is 128-aligned so the word is 8-aligned; it is only accessed
        // atomically.
        unsafe { AtomicU64::from_ptr(word) }
    }

    #[inline]
    fn flag(&self, offset: usize) -> &AtomicU32 {
        let word = self.base.as_ptr().wrapping_add(offset).cast::<u32>();
        // SAFETY: `offset` is an index line plus FLAG_NEAR or FLAG_FAR, inside
        // the control lines (see `index`); 4-aligned; only accessed atomically.
        unsafe { AtomicU32::from_ptr(word) }
    }

    /// The [`PeerCheck`] work after storing an index; `peer_line` is the
    /// offset of the other end's index line.
    #[inline]
    fn after_store(&self, check: PeerCheck, peer_line: usize) -> u32 {
        match check {
            PeerCheck::None => 0,
            PeerCheck::Fence => {
                fence(Ordering::SeqCst);
                0
            }
            PeerCheck::FenceFlagNear => {
                fence(Ordering::SeqCst);
                self.flag(peer_line + FLAG_NEAR).load(Ordering::Relaxed)
            }
            PeerCheck::FenceFlagFar => {
                fence(Ordering::SeqCst);
                self.flag(peer_line + FLAG_FAR).load(Ordering::Relaxed)
            }
        }
    }

    #[inline]
    fn slot(&self, index: u64) -> *mut T {
        let byte = CONTROL_BYTES + (index & self.mask) as usize * std::mem::size_of::<T>();
        self.base.as_ptr().wrapping_add(byte).cast::<T>()
    }
}

/// The producing end of a baseline ring.
pub struct BaseProducer<T: RingItem> {
    raw: Raw<T>,
    tail: u64,
    /// Last head loaded (used only with `cache_peer`).
    head_cache: u64,
    tuning: Tuning,
    flags_seen: u64,
    full_waits: u64,
}

/// The consuming end of a baseline ring.
pub struct BaseConsumer<T: RingItem> {
    raw: Raw<T>,
    head: u64,
    /// Last tail loaded (used only with `cache_peer`).
    tail_cache: u64,
    tuning: Tuning,
    flags_seen: u64,
}

/// The producing end of the ring at `offset` in `region`.
///
/// Panics when the ring does not fit, its base is not 128-aligned or
/// `capacity` is not a power of two.
///
/// # Safety
/// At most one producer and one consumer exist for this ring across all
/// processes, both run this module's protocol, and the ring memory starts
/// zeroed (an empty ring).
pub unsafe fn producer<T: RingItem>(
    region: Arc<Region>,
    offset: usize,
    capacity: usize,
) -> BaseProducer<T> {
    let raw = Raw::new(region, offset, capacity);
    let tail = raw.index(TAIL_AT).load(Ordering::Relaxed);
    let head_cache = raw.index(HEAD_AT).load(Ordering::Acquire);
    BaseProducer {
        raw,
        tail,
        head_cache,
        tuning: Tuning::PLAIN,
        flags_seen: 0,
        full_waits: 0,
    }
}

/// The consuming end of the ring at `offset` in `region`.
///
/// # Safety
/// Same contract as [`producer`].
pub unsafe fn consumer<T: RingItem>(
    region: Arc<Region>,
    offset: usize,
    capacity: usize,
) -> BaseConsumer<T> {
    let raw = Raw::new(region, offset, capacity);
    let head = raw.index(HEAD_AT).load(Ordering::Relaxed);
    BaseConsumer {
        raw,
        head,
        tail_cache: head,
        tuning: Tuning::PLAIN,
        flags_seen: 0,
    }
}

impl<T: RingItem> BaseProducer<T> {
    /// This end, working as `tuning` says (plain when made).
    pub fn tuned(self, tuning: Tuning) -> Self {
        BaseProducer { tuning, ..self }
    }

    /// How many times a [`PeerCheck`] load found a flag set (always 0 here).
    pub fn flags_seen(&self) -> u64 {
        self.flags_seen
    }

    /// How many batches found the ring too full and had to wait.
    pub fn full_waits(&self) -> u64 {
        self.full_waits
    }

    /// Waits until `k` slots are free, writes `make(i)` for the next `k`
    /// indices `i`, then publishes them with one store of `tail`.
    #[inline]
    pub fn push_batch(
        &mut self,
        k: u64,
        deadline: Instant,
        mut make: impl FnMut(u64) -> T,
    ) -> Result<(), Stalled> {
        assert!(k <= self.raw.capacity, "batch larger than the ring");
        let (raw, tail) = (&self.raw, self.tail);
        let need = tail.wrapping_add(k);
        let fits = |head: u64| need.wrapping_sub(head) <= raw.capacity;
        // With a cached head that already shows room, the consumer's line
        // is not touched at all; a head seen earlier is only ever behind
        // the real one, so the room it shows is real.
        if !(self.tuning.cache_peer && fits(self.head_cache)) {
            let mut head = raw.index(HEAD_AT).load(Ordering::Acquire);
            if !fits(head) {
                self.full_waits += 1;
                spin_until(deadline, || {
                    head = raw.index(HEAD_AT).load(Ordering::Acquire);
                    fits(head)
                })?;
            }
            self.head_cache = head;
        }
        macro_rules! fill {
            ($mode:expr) => {
                for i in tail..need {
                    // SAFETY: the slot pointer is masked into the ring, inside
                    // the 128-aligned region, 8-aligned; head (acquired above)
                    // shows the consumer is done with every slot up to
                    // `need - capacity`, so nobody reads this slot.
                    unsafe { put(raw.slot(i), make(i), $mode) };
                }
            };
        }
        // One loop per mode, so each compiles without a branch inside.
        match self.tuning.variant.write {
            CopyMode::Plain => fill!(CopyMode::Plain),
            CopyMode::Volatile => fill!(CopyMode::Volatile),
            CopyMode::VolatileWords => fill!(CopyMode::VolatileWords),
        }
        self.tail = need;
        self.raw.index(TAIL_AT).store(need, Ordering::Release);
        if self.raw.after_store(self.tuning.variant.check, HEAD_AT) != 0 {
            self.flags_seen += 1;
        }
        Ok(())
    }
}

impl<T: RingItem> BaseConsumer<T> {
    /// This end, working as `tuning` says (plain when made).
    pub fn tuned(self, tuning: Tuning) -> Self {
        BaseConsumer { tuning, ..self }
    }

    /// How many times a [`PeerCheck`] load found a flag set (always 0 here).
    pub fn flags_seen(&self) -> u64 {
        self.flags_seen
    }

    /// Copies out whatever is available, up to `out.len()` items, and frees
    /// their slots with one store of `head`. Returns how many it copied.
    #[inline]
    pub fn pop_into(&mut self, out: &mut [T]) -> usize {
        // With a cached tail that still shows items, the producer's line is
        // not touched; those items were published before that tail was
        // acquired, so they are visible.
        let tail = if self.tuning.cache_peer && self.tail_cache != self.head {
            self.tail_cache
        } else {
            let t = self.raw.index(TAIL_AT).load(Ordering::Acquire);
            self.tail_cache = t;
            t
        };
        let n = tail.wrapping_sub(self.head).min(out.len() as u64) as usize;
        let (raw, head) = (&self.raw, self.head);
        macro_rules! drain {
            ($mode:expr) => {
                for (j, item) in out[..n].iter_mut().enumerate() {
                    // SAFETY: the slot pointer is masked into the ring, inside
                    // the region, 8-aligned; the producer published it (tail
                    // acquired above) and will not reuse it before we store a
                    // head past it.
                    *item = unsafe { get(raw.slot(head + j as u64), $mode) };
                }
            };
        }
        match self.tuning.variant.read {
            CopyMode::Plain => drain!(CopyMode::Plain),
            CopyMode::Volatile => drain!(CopyMode::Volatile),
            CopyMode::VolatileWords => drain!(CopyMode::VolatileWords),
        }
        if n > 0 {
            self.head += n as u64;
            self.raw.index(HEAD_AT).store(self.head, Ordering::Release);
            if self.raw.after_store(self.tuning.variant.check, TAIL_AT) != 0 {
                self.flags_seen += 1;
            }
        }
        n
    }

    /// Spins until at least one item is available or `deadline` passes.
    #[inline]
    pub fn wait_for_data(&self, deadline: Instant) -> Result<(), Stalled> {
        let (raw, head) = (&self.raw, self.head);
        spin_until(deadline, || {
            raw.index(TAIL_AT).load(Ordering::Acquire) != head
        })
    }
}

// SAFETY: the ends point into a region kept alive by the Arc they own; all
// shared accesses are atomics or copies of plain-data items, and each end is
// used through `&mut self`.
unsafe impl<T: RingItem> Send for BaseProducer<T> {}
// SAFETY: as for BaseProducer.
unsafe impl<T: RingItem> Send for BaseConsumer<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn moves_items_in_order_across_threads() {
        move_items(Variant::PLAIN, false);
        move_items(Variant::PLAIN, true);
        for variant in Variant::ATTRIBUTION {
            move_items(variant, false);
        }
    }

    fn move_items(variant: Variant, cache_peer: bool) {
        let cap = 64;
        let region = Arc::new(Region::heap(ring_bytes::<[u64; 8]>(cap)));
        let tuning = Tuning {
            variant,
            cache_peer,
        };
        // SAFETY: the only producer of a zeroed heap ring.
        let mut p = unsafe { producer::<[u64; 8]>(region.clone(), 0, cap) }.tuned(tuning);
        // SAFETY: its only consumer.
        let mut c = unsafe { consumer::<[u64; 8]>(region, 0, cap) }.tuned(tuning);
        let n = 100_000u64;
        let deadline = Instant::now() + Duration::from_secs(30);
        let h = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                let k = (n - i).min(7);
                p.push_batch(k, deadline, |j| [j, !j, 0, 0, 0, 0, 0, j ^ 5])
                    .unwrap();
                i += k;
            }
            assert_eq!(p.flags_seen(), 0);
        });
        let mut buf = [[0u64; 8]; 16];
        let mut next = 0;
        while next < n {
            let got = c.pop_into(&mut buf);
            if got == 0 {
                c.wait_for_data(deadline).unwrap();
            }
            for item in &buf[..got] {
                assert_eq!(item, &[next, !next, 0, 0, 0, 0, 0, next ^ 5]);
                next += 1;
            }
        }
        h.join().unwrap();
        assert_eq!(c.flags_seen(), 0);
        assert_eq!(Variant::from_suffix(&variant.suffix()), Some(variant));
    }
}
