//! A single-producer / single-consumer ring over (shared) memory.
//!
//! Memory: a [`RingControl`] block followed by `capacity` items of `T`.
//! `tail` (written by the producer) and `head` (written by the consumer) are
//! free-running `u64` counters; the item for index `i` lives in slot
//! `i & (capacity - 1)`. Full and empty are told apart without a wasted slot:
//! empty is `head == tail`, full is `tail - head == capacity`.
//!
//! ## Memory ordering (the pairs, named on both halves)
//!
//! * **(A) publish/observe items.** The producer writes slots, then stores
//!   `tail` with `Release`; the consumer loads `tail` with `Acquire` before
//!   reading those slots. The consumer therefore sees every slot write that
//!   happened before the `tail` it observed.
//! * **(B) free/reuse slots.** The consumer copies items out, then stores
//!   `head` with `Release`; the producer loads `head` with `Acquire` before
//!   overwriting slots below it. The producer never overwrites a slot the
//!   consumer is still reading.
//! * Each side loads its *own* index only from its private copy (never from
//!   shared memory, where the peer could have scribbled) and refreshes its
//!   cached copy of the peer's index only when the cached value says
//!   empty/full. That keeps cache-line traffic to one transfer per batch.
//! * **(C) parking (Dekker).** A side that wants to sleep stores its
//!   `*_waiting` flag, issues a `SeqCst` fence and re-checks the ring before
//!   calling `futex_wait` on the peer-bumped sequence word. The other side,
//!   after publishing its index, issues a `SeqCst` fence and loads the flag;
//!   if set it bumps the sequence word and wakes. With both fences, at least
//!   one side sees the other's store, so a wake-up is never lost. The
//!   sequence word is loaded *before* the flag is set, so a bump between the
//!   re-check and the futex call makes `futex_wait` return at once.
//!
//! ## Distrust
//!
//! The peer may be another process that writes anything into the control
//! block or the slots. Every index read from shared memory is checked with
//! wrapping arithmetic against our own private index before use (a
//! [`Violation`] otherwise), items are copied out with volatile reads, and
//! nothing in this module panics on what the peer wrote. All index arithmetic
//! wraps (indices are counted modulo 2^64), so an end that starts from an
//! index found near `u64::MAX` in a segment works like any other instead of
//! overflowing.

use crate::barrier::Barriers;
use crate::error::{Violation, WaitError};
use crate::futex;
use crate::layout::{RingControl, RingItem};
use crate::sync::{spin_hint, AtomicU32, AtomicU64, Ordering};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a blocking wait spins (re-checking the ring) before it parks on a futex.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

type KeepAlive = Arc<dyn Any + Send + Sync>;

/// Where the item slots live.
struct Slots<T> {
    #[cfg(not(feature = "loom"))]
    base: NonNull<T>,
    #[cfg(feature = "loom")]
    base: NonNull<loom::cell::UnsafeCell<T>>,
}

impl<T: RingItem> Slots<T> {
    /// Number of u64 words in a `T`, or 0 when `T` is not a whole number of
    /// 8-aligned words (then items are copied whole).
    #[cfg(not(feature = "loom"))]
    const WORDS: usize =
        if std::mem::size_of::<T>().is_multiple_of(8) && std::mem::align_of::<T>() >= 8 {
            std::mem::size_of::<T>() / 8
        } else {
            0
        };

    /// # Safety
    /// `i` < capacity; the ring protocol gives the caller (the producer)
    /// exclusive use of slot `i`.
    #[inline]
    unsafe fn write(&self, i: usize, v: T) {
        #[cfg(not(feature = "loom"))]
        {
            let slot = self.base.as_ptr().wrapping_add(i);
            if Self::WORDS > 0 {
                let src = (&v as *const T).cast::<u64>();
                let dst = slot.cast::<u64>();
                for w in 0..Self::WORDS {
                    // SAFETY: `i` < capacity (caller), so the slot lies in the
                    // mapped ring; T is a whole number of 8-aligned u64 words
                    // (WORDS > 0), so both pointers stay inside their objects
                    // and are aligned. One volatile store per word: another
                    // process maps the slot, and word stores avoid staging the
                    // whole item on the stack first.
                    let word = unsafe { src.wrapping_add(w).read() };
                    // SAFETY: as for the read just above: `dst + w` is an
                    // aligned word of slot `i`, which the producer owns.
                    unsafe { dst.wrapping_add(w).write_volatile(word) };
                }
            } else {
                // SAFETY: as above, for an item that is not made of words.
                unsafe { slot.write_volatile(v) }
            }
        }
        #[cfg(feature = "loom")]
        {
            // SAFETY: `i` < capacity (caller), so the cell is in the ring.
            let cell = unsafe { &*self.base.as_ptr().wrapping_add(i) };
            // SAFETY: as above; loom checks the exclusivity claim.
            cell.with_mut(|p| unsafe { p.write(v) })
        }
    }

    /// # Safety
    /// `i` < capacity; slot `i` was published to the caller (the consumer).
    #[inline]
    unsafe fn read(&self, i: usize) -> T {
        #[cfg(not(feature = "loom"))]
        {
            let slot = self.base.as_ptr().wrapping_add(i);
            if Self::WORDS > 0 {
                let mut out = T::default();
                let dst = (&mut out as *mut T).cast::<u64>();
                let src = slot.cast::<u64>();
                for w in 0..Self::WORDS {
                    // SAFETY: `i` < capacity so the slot is in bounds; T is a
                    // whole number of 8-aligned words; any bit pattern is a
                    // valid `T` (RingItem), so a torn or hostile write cannot
                    // create an invalid value; volatile because another
                    // process may write the slot.
                    let word = unsafe { src.wrapping_add(w).read_volatile() };
                    // SAFETY: `dst + w` is an aligned word of the local `out`.
                    unsafe { dst.wrapping_add(w).write(word) };
                }
                out
            } else {
                // SAFETY: as above, for an item that is not made of words.
                unsafe { slot.read_volatile() }
            }
        }
        #[cfg(feature = "loom")]
        {
            // SAFETY: `i` < capacity (caller), so the cell is in the ring.
            let cell = unsafe { &*self.base.as_ptr().wrapping_add(i) };
            // SAFETY: as above; loom checks that the producer is not writing it.
            cell.with(|p| unsafe { p.read() })
        }
    }
}

/// The shared part of one ring end: where the control block and slots are.
struct RawRing<T> {
    ctrl: NonNull<RingControl>,
    slots: Slots<T>,
    capacity: u64,
    name: &'static str,
    _keep: KeepAlive,
}

impl<T> RawRing<T> {
    #[inline]
    fn ctrl(&self) -> &RingControl {
        // SAFETY: `ctrl` points at a RingControl that `_keep` keeps alive
        // (constructor contract); its fields are atomics, so shared access is
        // sound even while another process writes them.
        unsafe { self.ctrl.as_ref() }
    }

    #[inline]
    fn mask(&self) -> u64 {
        self.capacity - 1
    }

    /// The peer's index `theirs` does not fit with `ours`.
    fn violation(&self, ours: u64, theirs: u64) -> Violation {
        Violation::RingIndex {
            ring: self.name,
            ours,
            theirs,
            capacity: self.capacity,
        }
    }
}

/// The producing end of a ring (agent: ready ring; loader: release ring).
pub struct Producer<T: RingItem> {
    ring: RawRing<T>,
    /// Next index to write (private, trusted).
    tail: u64,
    /// Last tail stored to shared memory.
    published: u64,
    /// Last validated head read from shared memory.
    cached_head: u64,
    spin: Duration,
    barriers: Barriers,
}

/// The consuming end of a ring (loader: ready ring; agent: release ring).
pub struct Consumer<T: RingItem> {
    ring: RawRing<T>,
    /// Next index to read (private, trusted).
    head: u64,
    /// Last head stored to shared memory.
    published: u64,
    /// Last validated tail read from shared memory.
    cached_tail: u64,
    spin: Duration,
    barriers: Barriers,
}

// SAFETY: the ends hold raw pointers into memory kept alive by `_keep`
// (Send + Sync); all shared accesses are atomics or volatile copies and each
// end is used through `&mut self`, so moving an end to another thread is sound.
unsafe impl<T: RingItem> Send for Producer<T> {}
// SAFETY: as for Producer.
unsafe impl<T: RingItem> Send for Consumer<T> {}

/// Builds both ends of a ring over caller-provided memory.
///
/// # Safety
/// * `base` is 128-byte aligned and valid for reads and writes of
///   [`crate::layout::ring_bytes::<T>`]`(capacity)` bytes for as long as
///   `keep` lives;
/// * `capacity` is a power of two ≥ 2 and ≤ [`crate::layout::MAX_RING_CAPACITY`];
/// * at most one [`Producer`] and one [`Consumer`] exist for the ring across
///   all processes (the peer may break this; it then only hurts itself).
#[cfg(not(feature = "loom"))]
pub unsafe fn producer_from_raw<T: RingItem>(
    base: NonNull<u8>,
    capacity: u32,
    name: &'static str,
    keep: KeepAlive,
) -> Producer<T> {
    // SAFETY: forwarded contract.
    let ring = unsafe { raw_from_base(base, capacity, name, keep) };
    let tail = ring.ctrl().producer.tail.load(Ordering::Relaxed);
    let head = ring.ctrl().consumer.head.load(Ordering::Acquire);
    // A fresh ring has tail == head == 0; on attach we take the values as
    // found but never let the peer's head exceed our tail.
    let head = if tail.wrapping_sub(head) <= u64::from(capacity) {
        head
    } else {
        tail
    };
    Producer {
        ring,
        tail,
        published: tail,
        cached_head: head,
        spin: DEFAULT_SPIN,
        barriers: Barriers::Symmetric,
    }
}

/// Builds the consuming end of a ring over caller-provided memory.
///
/// # Safety
/// Same contract as [`producer_from_raw`].
#[cfg(not(feature = "loom"))]
pub unsafe fn consumer_from_raw<T: RingItem>(
    base: NonNull<u8>,
    capacity: u32,
    name: &'static str,
    keep: KeepAlive,
) -> Consumer<T> {
    // SAFETY: forwarded contract.
    let ring = unsafe { raw_from_base(base, capacity, name, keep) };
    let head = ring.ctrl().consumer.head.load(Ordering::Relaxed);
    Consumer {
        ring,
        head,
        published: head,
        cached_tail: head,
        spin: DEFAULT_SPIN,
        barriers: Barriers::Symmetric,
    }
}

#[cfg(not(feature = "loom"))]
unsafe fn raw_from_base<T: RingItem>(
    base: NonNull<u8>,
    capacity: u32,
    name: &'static str,
    keep: KeepAlive,
) -> RawRing<T> {
    debug_assert!(capacity.is_power_of_two() && capacity >= 2);
    debug_assert_eq!(base.as_ptr() as usize % crate::layout::LINE, 0);
    let ctrl = base.cast::<RingControl>();
    // SAFETY: the slot array starts right after the control block, inside the
    // `ring_bytes` the caller vouched for.
    let slots = unsafe { base.add(std::mem::size_of::<RingControl>()) }.cast::<T>();
    RawRing {
        ctrl,
        slots: Slots { base: slots },
        capacity: u64::from(capacity),
        name,
        _keep: keep,
    }
}

/// A ring in private heap memory (both ends in this process). Used by tests,
/// Miri and loom; production rings live in a [`crate::segment`].
pub fn heap_ring<T: RingItem>(capacity: u32, name: &'static str) -> (Producer<T>, Consumer<T>) {
    assert!(
        capacity.is_power_of_two() && (2..=crate::layout::MAX_RING_CAPACITY).contains(&capacity),
        "ring capacity must be a power of two in 2..=MAX_RING_CAPACITY"
    );
    heap_ring_imp(capacity, name)
}

#[cfg(not(feature = "loom"))]
fn heap_ring_imp<T: RingItem>(capacity: u32, name: &'static str) -> (Producer<T>, Consumer<T>) {
    let region = Arc::new(crate::region::Region::heap(crate::layout::ring_bytes::<T>(
        capacity,
    )));
    let base = NonNull::new(region.as_ptr()).expect("region base is non-null");
    let keep: KeepAlive = region;
    // SAFETY: the heap region is page-aligned, zeroed (a valid empty ring),
    // exactly ring_bytes long and kept alive by `keep`; the only producer.
    let producer = unsafe { producer_from_raw(base, capacity, name, Arc::clone(&keep)) };
    // SAFETY: as above; the only consumer.
    let consumer = unsafe { consumer_from_raw(base, capacity, name, keep) };
    (producer, consumer)
}

#[cfg(feature = "loom")]
fn heap_ring_imp<T: RingItem>(capacity: u32, name: &'static str) -> (Producer<T>, Consumer<T>) {
    use crate::layout::{ConsumerLine, ProducerLine};
    use crate::sync::AtomicU64;
    struct LoomRing<T> {
        ctrl: RingControl,
        cells: Box<[loom::cell::UnsafeCell<T>]>,
    }
    // SAFETY: the cells are only accessed under the ring protocol, which loom checks.
    unsafe impl<T: Send> Sync for LoomRing<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Send for LoomRing<T> {}
    let ring = Arc::new(LoomRing {
        ctrl: RingControl {
            producer: ProducerLine {
                tail: AtomicU64::new(0),
                data_seq: AtomicU32::new(0),
                producer_waiting: AtomicU32::new(0),
            },
            consumer: ConsumerLine {
                head: AtomicU64::new(0),
                space_seq: AtomicU32::new(0),
                consumer_waiting: AtomicU32::new(0),
            },
        },
        cells: (0..capacity)
            .map(|_| loom::cell::UnsafeCell::new(T::default()))
            .collect(),
    });
    let ctrl = NonNull::from(&ring.ctrl);
    let cells = NonNull::new(ring.cells.as_ptr() as *mut loom::cell::UnsafeCell<T>).unwrap();
    let keep: KeepAlive = ring;
    let mk = |keep: KeepAlive| RawRing {
        ctrl,
        slots: Slots { base: cells },
        capacity: u64::from(capacity),
        name,
        _keep: keep,
    };
    (
        Producer {
            ring: mk(Arc::clone(&keep)),
            tail: 0,
            published: 0,
            cached_head: 0,
            spin: Duration::ZERO,
            barriers: Barriers::Symmetric,
        },
        Consumer {
            ring: mk(keep),
            head: 0,
            published: 0,
            cached_tail: 0,
            spin: Duration::ZERO,
            barriers: Barriers::Symmetric,
        },
    )
}

fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now().checked_add(t).unwrap_or_else(far_future))
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// Time left until `deadline`; `Some(ZERO)` once it has passed.
fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// Parks on `seq` unless `ready()` turns true after announcing ourselves in
/// `waiting` (protocol (C) in the module docs). Returns `ready()`'s last value.
fn park<F>(
    barriers: Barriers,
    seq: &AtomicU32,
    waiting: &AtomicU32,
    deadline: Option<Instant>,
    mut ready: F,
) -> Result<bool, Violation>
where
    F: FnMut() -> Result<bool, Violation>,
{
    let observed = seq.load(Ordering::Acquire);
    waiting.store(1, Ordering::Relaxed);
    barriers.before_park(); // (C)
    let result = match ready() {
        Ok(false) => {
            let left = remaining(deadline);
            if left != Some(Duration::ZERO) {
                futex::wait(seq, observed, left);
            }
            ready()
        }
        other => other,
    };
    waiting.store(0, Ordering::Relaxed);
    result
}

/// Spins for up to `spin` re-checking `ready`, then parks until the deadline.
/// Returns `Ok(true)` when ready, `Ok(false)` on timeout.
fn wait_until<F>(
    barriers: Barriers,
    spin: Duration,
    seq: &AtomicU32,
    waiting: &AtomicU32,
    deadline: Option<Instant>,
    mut ready: F,
) -> Result<bool, Violation>
where
    F: FnMut() -> Result<bool, Violation>,
{
    if ready()? {
        return Ok(true);
    }
    if !spin.is_zero() {
        let spin_end = Instant::now() + spin;
        let spin_end = deadline.map_or(spin_end, |d| d.min(spin_end));
        loop {
            for _ in 0..64 {
                spin_hint();
                if ready()? {
                    return Ok(true);
                }
            }
            if Instant::now() >= spin_end {
                break;
            }
        }
    }
    loop {
        if park(barriers, seq, waiting, deadline, &mut ready)? {
            return Ok(true);
        }
        if remaining(deadline) == Some(Duration::ZERO) {
            return Ok(false);
        }
    }
}

/// Bumps the sequence word `seq` and wakes every waiter parked on it.
fn wake(seq: &AtomicU32) {
    seq.fetch_add(1, Ordering::Release);
    futex::wake_all(seq);
}

/// Stores our index `value` into `index` for the peer (pair (A) or (B),
/// release) unless `published` says it is there already, then (protocol
/// (C)) wakes the peer through `seq` if its `waiting` flag is set.
#[inline]
fn publish_index(
    barriers: Barriers,
    (index, waiting, seq): (&AtomicU64, &AtomicU32, &AtomicU32),
    value: u64,
    published: &mut u64,
) {
    if value == *published {
        return;
    }
    index.store(value, Ordering::Release); // (A) or (B) release
    *published = value;
    barriers.after_publish(); // (C)
    if waiting.load(Ordering::Relaxed) != 0 {
        wake(seq);
    }
}

/// Which end of the ring: which words of the control block it publishes
/// to, wakes the peer through and parks on.
#[derive(Clone, Copy)]
enum Side {
    Producer,
    Consumer,
}

impl Side {
    /// The index this end publishes, the peer's waiting flag and the
    /// sequence word that wakes the peer.
    #[inline]
    fn publish_words(self, c: &RingControl) -> (&AtomicU64, &AtomicU32, &AtomicU32) {
        match self {
            Side::Producer => (
                &c.producer.tail,
                &c.consumer.consumer_waiting,
                &c.producer.data_seq,
            ),
            Side::Consumer => (
                &c.consumer.head,
                &c.producer.producer_waiting,
                &c.consumer.space_seq,
            ),
        }
    }

    /// The sequence word this end parks on and its own waiting flag.
    fn wait_words(self, c: &RingControl) -> (&AtomicU32, &AtomicU32) {
        match self {
            Side::Producer => (&c.consumer.space_seq, &c.producer.producer_waiting),
            Side::Consumer => (&c.producer.data_seq, &c.consumer.consumer_waiting),
        }
    }
}

/// One end of a ring, as the waits below see it.
trait RingEnd {
    /// Which end it is.
    const SIDE: Side;
    /// The control block, the spin and the barriers.
    fn wait_setup(&self) -> (NonNull<RingControl>, Duration, Barriers);
}

/// Spins, then parks on `E`'s wait words until `ready(end)` holds or the
/// deadline passes ([`wait_until`]).
fn wait_end<E: RingEnd>(
    end: &mut E,
    deadline: Option<Instant>,
    mut ready: impl FnMut(&mut E) -> Result<bool, Violation>,
) -> Result<bool, Violation> {
    let (ctrl, spin, barriers) = end.wait_setup();
    // SAFETY: the control block outlives this call (kept alive by the end's
    // ring); it holds only atomics, so a shared reference beside `&mut E`
    // aliases nothing `ready` mutates.
    let ctrl = unsafe { ctrl.as_ref() };
    let (seq, waiting) = E::SIDE.wait_words(ctrl);
    wait_until(barriers, spin, seq, waiting, deadline, || ready(end))
}

/// Tries `attempt` until it gives a value, waiting with `wait` in between,
/// for up to `timeout` in all.
fn retry_blocking<E, R>(
    end: &mut E,
    timeout: Option<Duration>,
    mut attempt: impl FnMut(&mut E) -> Result<Option<R>, Violation>,
    mut wait: impl FnMut(&mut E, Option<Duration>) -> Result<bool, Violation>,
) -> Result<R, WaitError> {
    let deadline = deadline_after(timeout);
    loop {
        if let Some(r) = attempt(end)? {
            return Ok(r);
        }
        if !wait(end, remaining(deadline))? {
            return Err(WaitError::Timeout);
        }
    }
}

/// What both ends share: the waits' view of them and their settings.
macro_rules! ring_end {
    ($end:ident, $side:expr) => {
        impl<T: RingItem> RingEnd for $end<T> {
            const SIDE: Side = $side;
            fn wait_setup(&self) -> (NonNull<RingControl>, Duration, Barriers) {
                (self.ring.ctrl, self.spin, self.barriers)
            }
        }

        impl<T: RingItem> $end<T> {
            /// Capacity in items.
            pub fn capacity(&self) -> usize {
                self.ring.capacity as usize
            }

            /// Sets how long blocking waits spin before parking (zero: park at once).
            pub fn set_spin(&mut self, spin: Duration) {
                self.spin = spin;
            }

            /// Chooses the barriers of the wake-up protocol ([`Barriers`]); both ends
            /// of a ring must agree (the segment header says which to use).
            pub fn set_barriers(&mut self, barriers: Barriers) {
                self.barriers = barriers;
            }
        }
    };
}

ring_end!(Producer, Side::Producer);
ring_end!(Consumer, Side::Consumer);

impl<T: RingItem> Producer<T> {
    /// Items written (staged or published) so far: the private tail.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Items written but not yet published.
    pub fn staged(&self) -> usize {
        self.tail.wrapping_sub(self.published) as usize
    }

    /// Reloads the consumer's head (pair (B)) and checks it lies between our
    /// last view of it and what we published.
    fn refresh_head(&mut self) -> Result<(), Violation> {
        let head = self.ring.ctrl().consumer.head.load(Ordering::Acquire); // (B) acquire
        let advanced = head.wrapping_sub(self.cached_head);
        let outstanding = self.published.wrapping_sub(self.cached_head);
        if advanced > outstanding {
            return Err(self.ring.violation(self.published, head));
        }
        self.cached_head = head;
        Ok(())
    }

    /// Free slots, refreshing the consumer's head only if our cached view says full.
    pub fn free(&mut self) -> Result<usize, Violation> {
        if self.tail.wrapping_sub(self.cached_head) == self.ring.capacity {
            self.refresh_head()?;
        }
        Ok((self.ring.capacity - self.tail.wrapping_sub(self.cached_head)) as usize)
    }

    /// Published items the consumer has not taken yet (reloads its head).
    /// Zero means the consumer has caught up and may be waiting.
    pub fn unconsumed(&mut self) -> Result<usize, Violation> {
        self.refresh_head()?;
        Ok(self.published.wrapping_sub(self.cached_head) as usize)
    }

    /// Writes `item` into the next slot without publishing it. Returns
    /// `Ok(false)` when the ring is full. Call [`Producer::publish`] to make
    /// staged items visible (batched publication).
    #[inline]
    pub fn try_stage(&mut self, item: T) -> Result<bool, Violation> {
        if self.tail.wrapping_sub(self.cached_head) == self.ring.capacity {
            self.refresh_head()?;
            if self.tail.wrapping_sub(self.cached_head) == self.ring.capacity {
                return Ok(false);
            }
        }
        let slot = (self.tail & self.ring.mask()) as usize;
        // SAFETY: slot < capacity; indices in [cached_head, cached_head+capacity)
        // are ours to write until published (pair (B) acquired above).
        unsafe { self.ring.slots.write(slot, item) };
        self.tail = self.tail.wrapping_add(1);
        Ok(true)
    }

    /// Stages up to `k` items made by `make(0)`, `make(1)`, … with one space
    /// check (batched publication without a per-item check). Returns how many
    /// were staged: fewer than `k` when the ring has less room. Call
    /// [`Producer::publish`] to make them visible.
    #[inline]
    pub fn stage_with(
        &mut self,
        k: usize,
        mut make: impl FnMut(usize) -> T,
    ) -> Result<usize, Violation> {
        let mut room = self.ring.capacity - self.tail.wrapping_sub(self.cached_head);
        if room < k as u64 {
            self.refresh_head()?;
            room = self.ring.capacity - self.tail.wrapping_sub(self.cached_head);
        }
        let n = (k as u64).min(room) as usize;
        let mask = self.ring.mask();
        for j in 0..n {
            let slot = (self.tail.wrapping_add(j as u64) & mask) as usize;
            // SAFETY: slot < capacity; the n slots after `tail` are free (room
            // computed from a validated head, pair (B) acquired) and ours
            // until published.
            unsafe { self.ring.slots.write(slot, make(j)) };
        }
        self.tail = self.tail.wrapping_add(n as u64);
        Ok(n)
    }

    /// Publishes every staged item with one store, and wakes a parked consumer.
    #[inline]
    pub fn publish(&mut self) {
        let words = Self::SIDE.publish_words(self.ring.ctrl());
        publish_index(self.barriers, words, self.tail, &mut self.published); // (A) release
    }

    /// Stages and publishes one item; `Ok(false)` when full.
    #[inline]
    pub fn try_push(&mut self, item: T) -> Result<bool, Violation> {
        let pushed = self.try_stage(item)?;
        if pushed {
            self.publish();
        }
        Ok(pushed)
    }

    /// Waits until at least one slot is free. `Ok(false)` on timeout.
    /// Publishes staged items first so the consumer can make progress.
    pub fn wait_for_space(&mut self, timeout: Option<Duration>) -> Result<bool, Violation> {
        self.publish();
        wait_end(self, deadline_after(timeout), |p| {
            p.refresh_head()?;
            Ok(p.tail.wrapping_sub(p.cached_head) < p.ring.capacity)
        })
    }

    /// Pushes one item, waiting (spin, then park) for space up to `timeout`.
    pub fn push_blocking(&mut self, item: T, timeout: Option<Duration>) -> Result<(), WaitError> {
        let attempt = |p: &mut Self| Ok(p.try_push(item)?.then_some(()));
        retry_blocking(self, timeout, attempt, Self::wait_for_space)
    }

    /// Wakes the consumer even if it did not announce itself; used before
    /// shutdown or fencing so a parked peer re-reads the segment state.
    pub fn notify(&self) {
        wake(&self.ring.ctrl().producer.data_seq);
    }
}

impl<T: RingItem> Consumer<T> {
    /// Items consumed so far: the private head.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Reloads the producer's tail (pair (A)) and checks it is at most one
    /// capacity ahead of our head and did not move backwards.
    fn refresh_tail(&mut self) -> Result<(), Violation> {
        let tail = self.ring.ctrl().producer.tail.load(Ordering::Acquire); // (A) acquire
        let available = tail.wrapping_sub(self.head);
        let moved = tail.wrapping_sub(self.cached_tail);
        if available > self.ring.capacity || moved > self.ring.capacity {
            return Err(self.ring.violation(self.head, tail));
        }
        self.cached_tail = tail;
        Ok(())
    }

    /// Items ready to read, refreshing the producer's tail if our view says empty.
    pub fn available(&mut self) -> Result<usize, Violation> {
        if self.head == self.cached_tail {
            self.refresh_tail()?;
        }
        Ok(self.cached_tail.wrapping_sub(self.head) as usize)
    }

    /// Copies out the next item without publishing the freed slot. Call
    /// [`Consumer::commit`] (or use [`Consumer::try_pop`]) to hand slots back.
    #[inline]
    pub fn try_take(&mut self) -> Result<Option<T>, Violation> {
        if self.head == self.cached_tail {
            self.refresh_tail()?;
            if self.head == self.cached_tail {
                return Ok(None);
            }
        }
        let slot = (self.head & self.ring.mask()) as usize;
        // SAFETY: slot < capacity and index `head` < cached_tail was published
        // to us (pair (A) acquired in refresh_tail).
        let item = unsafe { self.ring.slots.read(slot) };
        self.head = self.head.wrapping_add(1);
        Ok(Some(item))
    }

    /// Publishes our head (freeing every slot taken so far) and wakes a parked producer.
    #[inline]
    pub fn commit(&mut self) {
        let words = Self::SIDE.publish_words(self.ring.ctrl());
        publish_index(self.barriers, words, self.head, &mut self.published); // (B) release
    }

    /// Takes and commits one item.
    #[inline]
    pub fn try_pop(&mut self) -> Result<Option<T>, Violation> {
        let item = self.try_take()?;
        if item.is_some() {
            self.commit();
        }
        Ok(item)
    }

    /// Takes up to `out.len()` items and commits them with one store. The
    /// producer's tail is reloaded only when the cached view holds fewer
    /// items than asked for.
    pub fn pop_into(&mut self, out: &mut [T]) -> Result<usize, Violation> {
        if self.cached_tail.wrapping_sub(self.head) < out.len() as u64 {
            self.refresh_tail()?;
        }
        let avail = self.cached_tail.wrapping_sub(self.head);
        let n = avail.min(out.len() as u64) as usize;
        let mask = self.ring.mask();
        for (j, o) in out[..n].iter_mut().enumerate() {
            let slot = (self.head.wrapping_add(j as u64) & mask) as usize;
            // SAFETY: slot < capacity and index head + j < cached_tail was
            // published to us (pair (A) acquired in refresh_tail).
            *o = unsafe { self.ring.slots.read(slot) };
        }
        self.head = self.head.wrapping_add(n as u64);
        self.commit();
        Ok(n)
    }

    /// Waits until at least one item is ready (spin, then park). `Ok(false)` on timeout.
    /// Commits taken items first so the producer can make progress.
    pub fn wait_for_data(&mut self, timeout: Option<Duration>) -> Result<bool, Violation> {
        self.commit();
        wait_end(self, deadline_after(timeout), |c| Ok(c.available()? > 0))
    }

    /// Pops one item, waiting (spin, then park) up to `timeout`.
    pub fn pop_blocking(&mut self, timeout: Option<Duration>) -> Result<T, WaitError> {
        retry_blocking(self, timeout, Self::try_pop, Self::wait_for_data)
    }

    /// Wakes the producer even if it did not announce itself.
    pub fn notify(&self) {
        wake(&self.ring.ctrl().consumer.space_seq);
    }
}

impl<T: RingItem> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.commit();
    }
}

impl<T: RingItem> Drop for Producer<T> {
    fn drop(&mut self) {
        self.publish();
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn push_pop_wrap_full_empty() {
        let (mut p, mut c) = heap_ring::<u64>(4, "t");
        assert_eq!(c.try_pop().unwrap(), None);
        for round in 0..10u64 {
            for i in 0..4 {
                assert!(p.try_push(round * 4 + i).unwrap());
            }
            assert!(!p.try_push(99).unwrap(), "ring must be full");
            for i in 0..4 {
                assert_eq!(c.try_pop().unwrap(), Some(round * 4 + i));
            }
            assert_eq!(c.try_pop().unwrap(), None);
        }
    }

    #[test]
    fn staged_items_are_invisible_until_published() {
        let (mut p, mut c) = heap_ring::<u64>(8, "t");
        assert!(p.try_stage(1).unwrap());
        assert!(p.try_stage(2).unwrap());
        assert_eq!(p.staged(), 2);
        assert_eq!(c.try_pop().unwrap(), None);
        p.publish();
        assert_eq!(c.try_pop().unwrap(), Some(1));
        assert_eq!(c.try_pop().unwrap(), Some(2));
    }

    #[test]
    fn stage_with_fills_what_fits_in_order() {
        let (mut p, mut c) = heap_ring::<u64>(8, "t");
        assert_eq!(p.stage_with(5, |j| 100 + j as u64).unwrap(), 5);
        assert_eq!(c.try_pop().unwrap(), None, "staged items are invisible");
        p.publish();
        assert_eq!(
            p.stage_with(5, |j| 200 + j as u64).unwrap(),
            3,
            "only 3 slots left"
        );
        p.publish();
        let mut out = [0u64; 16];
        assert_eq!(c.pop_into(&mut out).unwrap(), 8);
        assert_eq!(&out[..8], &[100, 101, 102, 103, 104, 200, 201, 202]);
        assert_eq!(p.stage_with(8, |j| j as u64).unwrap(), 8);
    }

    #[test]
    fn taken_slots_are_not_free_until_committed() {
        let (mut p, mut c) = heap_ring::<u64>(2, "t");
        assert!(p.try_push(1).unwrap() && p.try_push(2).unwrap());
        assert_eq!(c.try_take().unwrap(), Some(1));
        assert!(!p.try_push(3).unwrap());
        c.commit();
        assert!(p.try_push(3).unwrap());
    }

    #[test]
    fn hostile_tail_is_a_violation() {
        let (p, mut c) = heap_ring::<u64>(4, "ready");
        p.ring.ctrl().producer.tail.store(1000, Ordering::Release);
        assert!(matches!(
            c.try_pop(),
            Err(Violation::RingIndex { ring: "ready", .. })
        ));
        p.ring
            .ctrl()
            .producer
            .tail
            .store(u64::MAX, Ordering::Release);
        assert!(c.try_pop().is_err());
    }

    #[test]
    fn hostile_head_is_a_violation() {
        let (mut p, c) = heap_ring::<u64>(4, "release");
        for i in 0..4 {
            assert!(p.try_push(i).unwrap());
        }
        // Head ahead of what was published.
        c.ring.ctrl().consumer.head.store(9, Ordering::Release);
        assert!(p.try_push(5).is_err());
        // Head that moved backwards.
        let (mut p, mut c) = heap_ring::<u64>(4, "release");
        for i in 0..4 {
            assert!(p.try_push(i).unwrap());
        }
        assert_eq!(c.try_pop().unwrap(), Some(0));
        assert!(p.try_push(9).unwrap());
        c.ring.ctrl().consumer.head.store(0, Ordering::Release);
        assert!(p.try_push(10).is_err());
    }

    #[test]
    fn indices_wrap_past_u64_max() {
        let cap = 4u32;
        let region = Arc::new(crate::region::Region::heap(
            crate::layout::ring_bytes::<u64>(cap),
        ));
        let base = NonNull::new(region.as_ptr()).unwrap();
        // SAFETY: the zeroed heap region starts with a RingControl (atomics).
        let ctrl = unsafe { base.cast::<RingControl>().as_ref() };
        let start = u64::MAX - 5;
        ctrl.producer.tail.store(start, Ordering::Relaxed);
        ctrl.consumer.head.store(start, Ordering::Relaxed);
        let keep: KeepAlive = region;
        // SAFETY: page-aligned, ring_bytes long, kept alive by `keep`; the
        // only producer of this ring.
        let mut p = unsafe { producer_from_raw::<u64>(base, cap, "t", Arc::clone(&keep)) };
        // SAFETY: as above; the only consumer.
        let mut c = unsafe { consumer_from_raw::<u64>(base, cap, "t", keep) };
        for round in 0..4u64 {
            for i in 0..4 {
                assert!(p.try_push(round * 4 + i).unwrap());
            }
            assert!(!p.try_push(99).unwrap());
            assert_eq!(p.free().unwrap(), 0);
            assert_eq!(c.available().unwrap(), 4);
            for i in 0..4 {
                assert_eq!(c.try_pop().unwrap(), Some(round * 4 + i));
            }
            assert_eq!(c.try_pop().unwrap(), None);
        }
        assert_eq!(p.tail(), start.wrapping_add(16));
        assert_eq!(c.head(), start.wrapping_add(16));
    }

    #[test]
    fn blocking_pop_times_out_and_wakes() {
        let (mut p, mut c) = heap_ring::<u64>(4, "t");
        c.set_spin(Duration::ZERO);
        let t = Instant::now();
        assert_eq!(
            c.pop_blocking(Some(Duration::from_millis(20))),
            Err(WaitError::Timeout)
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
        let h = std::thread::spawn(move || c.pop_blocking(Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.try_push(42).unwrap());
        assert_eq!(h.join().unwrap(), Ok(42));
    }

    #[test]
    fn blocking_push_waits_for_space() {
        let (mut p, mut c) = heap_ring::<u64>(2, "t");
        p.set_spin(Duration::ZERO);
        assert!(p.try_push(1).unwrap() && p.try_push(2).unwrap());
        assert_eq!(
            p.push_blocking(3, Some(Duration::from_millis(10))),
            Err(WaitError::Timeout)
        );
        let h = std::thread::spawn(move || {
            p.push_blocking(3, Some(Duration::from_secs(10))).unwrap();
            p
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.try_pop().unwrap(), Some(1));
        let _p = h.join().unwrap();
        assert_eq!(c.try_pop().unwrap(), Some(2));
        assert_eq!(c.try_pop().unwrap(), Some(3));
    }

    #[test]
    fn threads_move_many_items_in_order() {
        let n: u64 = if cfg!(miri) { 500 } else { 200_000 };
        let (mut p, mut c) = heap_ring::<[u64; 8]>(64, "t");
        let h = std::thread::spawn(move || {
            for i in 0..n {
                p.push_blocking([i, !i, i * 3, 0, 0, 0, 0, i ^ 0x55], None)
                    .unwrap();
            }
        });
        let mut buf = [[0u64; 8]; 16];
        let mut next = 0;
        while next < n {
            let got = c.pop_into(&mut buf).unwrap();
            if got == 0 {
                c.wait_for_data(Some(Duration::from_secs(10))).unwrap();
            }
            for item in &buf[..got] {
                assert_eq!(item, &[next, !next, next * 3, 0, 0, 0, 0, next ^ 0x55]);
                next += 1;
            }
        }
        h.join().unwrap();
    }
}
