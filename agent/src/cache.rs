//! The sample cache: which samples live in the arena, where, and in what
//! state; which one leaves when room is needed.
//!
//! The cache is pure bookkeeping over the arena's byte range (it never
//! touches the arena's memory and does no I/O): the fetcher asks it for room
//! before a read and reports the read's outcome; the session engine pins the
//! samples of the batches it publishes and unpins them when the loader
//! returns the batch, and tells the cache how far each session has got so
//! that the clairvoyant policy knows the future. `docs/cache.md` describes
//! the design; the summary:
//!
//! * **Keys.** A sample is `(dataset id, sample index)`: [`SampleKey`].
//! * **States.** *InFlight* (an extent is reserved and a read is under
//!   way), *Ready* (the bytes are present: offset, length, CRC-32C) and
//!   *Failed* (the read failed; an error code, no extent). InFlight and Ready
//!   entries carry a pin count. Pinned Ready entries are never evicted or
//!   moved.
//! * **Residency.** A *retained* entry stays after its last unpin and may
//!   later be evicted by the policy; a *transient* one (a read the policy
//!   chose not to keep) is freed when its last pin goes. The managed range
//!   is split in two areas: retained extents live in the first
//!   [`CacheConfig::retain_limit`] bytes, transient ones in the last
//!   [`CacheConfig::transient_reserve`] bytes (and in the retained area's
//!   free space when those are full).
//! * **Making room.** When a retained entry does not fit, the policy's
//!   candidates are evicted, preferring one whose eviction alone opens a
//!   long enough free range, then (in a fragmented area) a candidate with
//!   its address neighbours, else candidates in the policy's order; the
//!   policy may refuse the trade, and the read is then transient (a
//!   bypass).
//! * **Reservation pin.** `Cache::reserve` returns the entry with one pin,
//!   held by the reserver. An InFlight entry whose pins all went (its owner
//!   vanished) is *parked*: its extent stays reserved until the read
//!   completes or fails, and only then returns (to the cache if retained,
//!   to the free space if transient).
//! * **Failures heal.** A Failed record keeps the pins of the batches that
//!   reported it; a later `Cache::reserve` reads the sample again and the
//!   new entry takes those pins over, so a pin is never lost on the way.
//! * **Accounting.** `free + cached + pinned + in_flight == arena size`,
//!   in bytes of reserved extents (lengths rounded up to the alignment):
//!   `Accounting`, checked by `Cache::check_invariants`.
//!
//! Every operation is `O(log n)` in the number of entries, except that
//! `Cache::reserve` may evict several entries (`O(log n)` each) and
//! session events re-key the samples whose next use changed.

pub mod future;
pub mod policy;
mod sample_map;
#[cfg(feature = "sim")]
pub mod sim;

use std::collections::{BTreeMap, HashMap};

use sample_map::SampleMap;
use std::fmt;

pub use future::{FutureError, FutureIndex, SessionId, NEVER};
pub use policy::{Clairvoyant, EvictionPolicy, Lru, MinIo, PolicyKind, UnknownPolicy};

use crate::extent::{Extent, ExtentAllocator};
use crate::planner::SessionPlan;

/// Identifies a sample: which dataset, which sample of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    /// The agent's id of the dataset.
    pub dataset: u32,
    /// The sample's index in the dataset (as numbered by the planner).
    pub index: u64,
}

impl fmt::Display for SampleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dataset, self.index)
    }
}

/// How many of the policy's first candidates [`Cache::reserve`] looks
/// through for one whose eviction alone makes room, before it evicts in the
/// policy's strict order.
pub(crate) const FIT_PROBES: usize = 16;

/// The most entries [`Cache::reserve`] evicts together, a victim and its
/// address neighbours, to open one free range in a fragmented arena.
pub(crate) const WINDOW_MAX: usize = 8;

/// [`Cache::reserve`] evicts address neighbours together (see
/// [`WINDOW_MAX`]) only while the retained area's free bytes exceed its size
/// divided by this: below, scattered free space is left for smaller samples
/// to fill.
pub(crate) const FRAGMENTATION_DIVISOR: u64 = 16;

/// Default alignment of sample extents: 4096 bytes, so reads straight into
/// the arena may use `O_DIRECT`.
pub(crate) const DEFAULT_ALIGN: u64 = 4096;

/// How the cache is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// First byte of the arena range the cache manages (0 for the whole
    /// arena; larger when the arena's head holds something else). Extent
    /// offsets are absolute arena offsets.
    pub base: u64,
    /// The size in bytes of the managed range `[base, base + arena_size)`.
    pub arena_size: u64,
    /// Alignment of every extent's offset and granularity of its length: a
    /// sample of `len` bytes takes `len` rounded up to a multiple of `align`.
    /// A power of two.
    pub align: u64,
    /// Bytes kept out of the retained set's reach, for transient reads.
    /// Retained extents never exceed `arena_size - transient_reserve`. The
    /// session engine sizes it to cover the prefetch windows (under MinIO,
    /// transient reads can use nothing else once the cache is full).
    pub transient_reserve: u64,
    /// Bytes at the end of the range for the samples this agent keeps for
    /// its peers ([`Residency::Kept`], see [`Cache::reserve_kept`]): never
    /// evicted, outside the policy's reach. 0 without peers.
    pub keep_reserve: u64,
    /// The eviction policy.
    pub policy: PolicyKind,
}

impl CacheConfig {
    /// A configuration with `DEFAULT_ALIGN` and a transient reserve of a
    /// sixteenth of the arena (rounded down to the alignment).
    pub fn new(arena_size: u64, policy: PolicyKind) -> Self {
        CacheConfig {
            base: 0,
            arena_size,
            align: DEFAULT_ALIGN,
            transient_reserve: arena_size / 16 / DEFAULT_ALIGN * DEFAULT_ALIGN,
            keep_reserve: 0,
            policy,
        }
    }

    /// The most bytes retained extents may take:
    /// `arena_size - transient_reserve - keep_reserve` (0 if the reserves
    /// are larger).
    pub fn retain_limit(&self) -> u64 {
        self.arena_size
            .saturating_sub(self.transient_reserve)
            .saturating_sub(self.keep_reserve)
    }

    /// The transient area's size: `transient_reserve`, less what the keep
    /// area takes beyond the retained area.
    fn transient_len(&self) -> u64 {
        self.arena_size
            .saturating_sub(self.keep_reserve)
            .saturating_sub(self.retain_limit())
    }

    /// The largest extent the cache can place: the aligned room in the
    /// larger of the retained area (`retain_limit` bytes from `base`) and
    /// the transient area (the `transient_reserve` bytes after it).
    pub(crate) fn largest_sample(&self) -> u64 {
        let align = self.align.max(1);
        let room = |start: u64, len: u64| {
            let end = start.saturating_add(len);
            start
                .checked_next_multiple_of(align)
                .filter(|&s| s < end)
                .map_or(0, |s| (end - s) / align * align)
        };
        let split = self.base.saturating_add(self.retain_limit());
        room(self.base, self.retain_limit()).max(room(split, self.transient_len()))
    }

    /// The bytes a sample of `len` bytes takes in the arena: `len` rounded
    /// up to the alignment, or `None` on overflow.
    pub(crate) fn extent_len(&self, len: u64) -> Option<u64> {
        len.checked_next_multiple_of(self.align.max(1))
    }

    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// [`CacheError::BadConfig`] naming the bad field.
    pub(crate) fn validate(&self) -> Result<(), CacheError> {
        if self.arena_size == 0 {
            return Err(CacheError::BadConfig("arena_size is 0".into()));
        }
        if self.base.checked_add(self.arena_size).is_none() {
            return Err(CacheError::BadConfig(format!(
                "base {} + arena_size {} overflows",
                self.base, self.arena_size
            )));
        }
        if !self.align.is_power_of_two() {
            return Err(CacheError::BadConfig(format!(
                "align {} is not a power of two",
                self.align
            )));
        }
        if self.transient_reserve > self.arena_size {
            return Err(CacheError::BadConfig(format!(
                "transient_reserve {} exceeds arena_size {}",
                self.transient_reserve, self.arena_size
            )));
        }
        if self.keep_reserve > self.arena_size - self.transient_reserve {
            return Err(CacheError::BadConfig(format!(
                "keep_reserve {} + transient_reserve {} exceed arena_size {}",
                self.keep_reserve, self.transient_reserve, self.arena_size
            )));
        }
        Ok(())
    }
}

/// Whether an entry stays in the cache after its last unpin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Kept after use, until the policy evicts it.
    Retained,
    /// Freed when its last pin goes (or when its read ends, if no pin is
    /// left by then): a read the policy chose not to cache.
    Transient,
    /// Held in the keep area for the job's peers: stays after its last
    /// unpin and is never evicted.
    Kept,
}

/// Room reserved for a read, returned by `Cache::reserve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The sample.
    pub key: SampleKey,
    /// Where to read it: `extent.offset` is the destination, `extent.len`
    /// (the length rounded up to the alignment) is what is reserved.
    pub extent: Extent,
    /// The sample's length in bytes, as requested.
    pub len: u64,
    /// Whether the sample stays cached after use.
    pub residency: Residency,
    /// How many entries were evicted to make room.
    pub evicted: u32,
}

/// A Ready sample: where its bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadySample {
    /// Arena offset of the first byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// CRC-32C of the bytes, as reported by the reader.
    pub crc32c: u32,
    /// The reserved extent (`len` rounded up to the alignment).
    pub extent: Extent,
    /// Current pin count.
    pub pins: u32,
    /// Whether it stays after its last unpin.
    pub residency: Residency,
}

/// What the cache knows of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Not in the cache.
    Absent,
    /// A read into `extent` is under way.
    InFlight {
        /// The reserved extent.
        extent: Extent,
        /// The sample's length.
        len: u64,
        /// Current pin count (0: parked, its owner is gone).
        pins: u32,
        /// Whether it will stay after use.
        residency: Residency,
    },
    /// The bytes are present.
    Ready(ReadySample),
    /// The read failed.
    Failed {
        /// The error code the fetcher reported.
        code: u32,
        /// Pins still held by those who waited for it.
        pins: u32,
    },
}

/// The outcome of `Cache::complete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The sample is Ready.
    Ready(ReadySample),
    /// The read was transient and nobody holds a pin any more: its extent
    /// went straight back to the free space.
    Discarded,
}

/// Arena use by state, in bytes of reserved extents.
///
/// `free + cached + pinned + in_flight == size` always holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Accounting {
    /// The arena's size.
    pub size: u64,
    /// Bytes in no extent.
    pub free: u64,
    /// Ready, unpinned entries (retained ones are evictable; kept ones
    /// are not).
    pub cached: u64,
    /// Ready entries with at least one pin.
    pub pinned: u64,
    /// Entries whose read is under way, parked ones included.
    pub in_flight: u64,
    /// Of `pinned + in_flight`, the bytes of transient entries.
    pub transient: u64,
    /// Of `cached + pinned + in_flight`, the bytes of retained entries
    /// (never above the retain limit).
    pub retained: u64,
    /// Of `cached + pinned + in_flight`, the bytes of kept entries (in the
    /// keep area).
    pub kept: u64,
}

impl Accounting {
    /// `free + cached + pinned + in_flight`: equals `size`.
    pub fn total(&self) -> u64 {
        self.free + self.cached + self.pinned + self.in_flight
    }
}

/// Event counters since the cache was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CacheStats {
    /// [`Cache::access`] found the sample Ready.
    pub hits: u64,
    /// [`Cache::access`] found a read of the sample under way.
    pub in_flight_hits: u64,
    /// [`Cache::access`] found the sample absent (or failed).
    pub misses: u64,
    /// Retained reservations.
    pub retained_reservations: u64,
    /// Transient reservations (bypasses and MinIO's uncached reads).
    pub transient_reservations: u64,
    /// Reservations refused for lack of space.
    pub no_space: u64,
    /// Entries evicted by the policy.
    pub evictions: u64,
    /// Bytes of extents evicted by the policy.
    pub evicted_bytes: u64,
    /// Reads completed.
    pub completions: u64,
    /// Transient reads whose extent was freed at completion (owner gone).
    pub discarded: u64,
    /// Reads failed.
    pub failures: u64,
}

/// Why a cache call was refused. A refused call changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// The configuration is invalid.
    BadConfig(String),
    /// A zero-length sample.
    ZeroLength,
    /// A sample larger than either area of the arena (see
    /// `CacheConfig::largest_sample`).
    TooLarge {
        /// The requested length.
        len: u64,
        /// The largest extent the cache can hold.
        largest: u64,
    },
    /// Not enough room now: everything evictable is gone and the rest is
    /// pinned or in flight (or the policy never evicts). Retry later.
    NoSpace {
        /// The sample.
        key: SampleKey,
        /// Bytes needed (rounded up to the alignment).
        need: u64,
    },
    /// The sample is already in flight or Ready (pin it instead).
    AlreadyPresent {
        /// The sample.
        key: SampleKey,
        /// Its state: `"in flight"`, `"ready"` or `"failed"`.
        state: &'static str,
    },
    /// The sample is not in the cache.
    NotFound(SampleKey),
    /// The call needs a sample in another state.
    WrongState {
        /// The sample.
        key: SampleKey,
        /// Its state.
        state: &'static str,
        /// The state the call needs.
        expected: &'static str,
    },
    /// An unpin of a sample without pins.
    NotPinned(SampleKey),
    /// A pin count would overflow.
    PinOverflow(SampleKey),
    /// A pin of a failed sample.
    Failed {
        /// The sample.
        key: SampleKey,
        /// The error code of its read.
        code: u32,
    },
    /// The sample is pinned or in flight and cannot be dropped.
    Busy(SampleKey),
    /// A session call was refused.
    Session(FutureError),
    /// The cache found its own state inconsistent (a bug); the call was
    /// abandoned.
    Internal(String),
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::BadConfig(m) => write!(f, "invalid cache configuration: {m}"),
            CacheError::ZeroLength => write!(f, "a sample of 0 bytes cannot be cached"),
            CacheError::TooLarge { len, largest } => write!(
                f,
                "a sample of {len} bytes does not fit: the cache holds extents of at most {largest} bytes"
            ),
            CacheError::NoSpace { key, need } => write!(
                f,
                "no room for sample {key} ({need} bytes): the arena is pinned or in flight; retry later"
            ),
            CacheError::AlreadyPresent { key, state } => {
                write!(f, "sample {key} is already {state}")
            }
            CacheError::NotFound(key) => write!(f, "sample {key} is not in the cache"),
            CacheError::WrongState {
                key,
                state,
                expected,
            } => write!(f, "sample {key} is {state}, not {expected}"),
            CacheError::NotPinned(key) => write!(f, "sample {key} is not pinned"),
            CacheError::PinOverflow(key) => write!(f, "sample {key} has too many pins"),
            CacheError::Failed { key, code } => {
                write!(f, "sample {key} failed to read (error {code})")
            }
            CacheError::Busy(key) => write!(f, "sample {key} is pinned or in flight"),
            CacheError::Session(e) => write!(f, "{e}"),
            CacheError::Internal(m) => write!(f, "cache inconsistency: {m}"),
        }
    }
}

impl std::error::Error for CacheError {}

impl From<FutureError> for CacheError {
    fn from(e: FutureError) -> Self {
        CacheError::Session(e)
    }
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    InFlight {
        extent: Extent,
        len: u64,
        pins: u32,
        residency: Residency,
    },
    Ready {
        extent: Extent,
        len: u64,
        crc32c: u32,
        pins: u32,
        residency: Residency,
    },
    Failed {
        code: u32,
        pins: u32,
    },
}

impl Entry {
    fn state(&self) -> &'static str {
        match self {
            Entry::InFlight { .. } => "in flight",
            Entry::Ready { .. } => "ready",
            Entry::Failed { .. } => "failed",
        }
    }

    fn lookup(&self) -> Lookup {
        match *self {
            Entry::InFlight {
                extent,
                len,
                pins,
                residency,
            } => Lookup::InFlight {
                extent,
                len,
                pins,
                residency,
            },
            Entry::Ready {
                extent,
                len,
                crc32c,
                pins,
                residency,
            } => Lookup::Ready(ReadySample {
                offset: extent.offset,
                len,
                crc32c,
                extent,
                pins,
                residency,
            }),
            Entry::Failed { code, pins } => Lookup::Failed { code, pins },
        }
    }
}

/// A registered session, as far as the cache checks calls.
#[derive(Debug, Clone, Copy)]
struct SessionRecord {
    position: u64,
    total: u64,
}

/// The arena range split in two: the retained area `[base, base +
/// retain_limit)`, where retained extents live (and transient ones when the
/// transient area is full), and the transient area after it. Keeping the
/// short-lived transient extents apart stops them from fragmenting the
/// retained set, and retained extents from scattering the transients' room.
#[derive(Debug, Clone)]
struct Areas {
    retained: ExtentAllocator,
    transient: ExtentAllocator,
    kept: ExtentAllocator,
    /// Every live extent's offset and the sample it holds, in offset order,
    /// for finding a victim's neighbours.
    owners: BTreeMap<u64, SampleKey>,
}

impl Areas {
    fn new(config: &CacheConfig) -> Self {
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
    fn alloc(
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
    fn owner(&mut self, offset: u64) -> &mut ExtentAllocator {
        if offset < self.transient.base() {
            &mut self.retained
        } else if offset < self.kept.base() {
            &mut self.transient
        } else {
            &mut self.kept
        }
    }

    fn free(&mut self, extent: Extent) -> Result<(), crate::extent::ExtentError> {
        self.owner(extent.offset).free(extent)?;
        self.owners.remove(&extent.offset);
        Ok(())
    }

    fn is_allocated(&self, extent: Extent) -> bool {
        self.retained.is_allocated(extent)
            || self.transient.is_allocated(extent)
            || self.kept.is_allocated(extent)
    }

    fn free_bytes(&self) -> u64 {
        self.retained.free_bytes() + self.transient.free_bytes() + self.kept.free_bytes()
    }

    fn live_extents(&self) -> usize {
        self.retained.live_extents() + self.transient.live_extents() + self.kept.live_extents()
    }

    fn check(&self) -> Result<(), String> {
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

/// The sample cache (see the module docs).
#[derive(Debug)]
pub struct Cache {
    config: CacheConfig,
    areas: Areas,
    entries: SampleMap<Entry>,
    policy: Box<dyn EvictionPolicy>,
    sessions: HashMap<SessionId, SessionRecord>,
    acct: Accounting,
    stats: CacheStats,
    /// Bumped whenever the set of Ready retained or kept samples changes
    /// (what a warm restart's index lists).
    changes: u64,
    /// Retained or kept samples that became Ready (or moved) since the
    /// journal was last taken, when a warm restart keeps one: `(key,
    /// offset, len, crc)`.
    journal: Option<Vec<(SampleKey, u64, u64, u32)>>,
}

impl Cache {
    /// An empty cache with the policy named in `config`.
    ///
    /// # Errors
    ///
    /// [`CacheError::BadConfig`].
    pub fn new(config: CacheConfig) -> Result<Self, CacheError> {
        Self::with_policy(config, config.policy.build())
    }

    /// An empty cache driven by `policy` (`config.policy` is ignored).
    ///
    /// # Errors
    ///
    /// [`CacheError::BadConfig`].
    pub(crate) fn with_policy(
        config: CacheConfig,
        policy: Box<dyn EvictionPolicy>,
    ) -> Result<Self, CacheError> {
        config.validate()?;
        let config = CacheConfig {
            policy: policy.kind(),
            ..config
        };
        Ok(Cache {
            config,
            areas: Areas::new(&config),
            entries: SampleMap::new(),
            policy,
            sessions: HashMap::new(),
            acct: Accounting {
                size: config.arena_size,
                free: config.arena_size,
                ..Accounting::default()
            },
            stats: CacheStats::default(),
            changes: 0,
            journal: None,
        })
    }

    /// From now on, remember every retained or kept sample that becomes
    /// Ready (or moves), for [`take_journal`](Self::take_journal).
    pub(crate) fn enable_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// Moves what the journal remembered into `out`: `(key, offset, len,
    /// crc)` in the order it happened.
    pub(crate) fn take_journal(&mut self, out: &mut Vec<(SampleKey, u64, u64, u32)>) {
        if let Some(j) = self.journal.as_mut() {
            out.append(j);
        }
    }

    /// A number that changes whenever the Ready retained or kept samples
    /// do (a warm restart's index is rewritten then).
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The eviction policy.
    pub fn policy(&self) -> &dyn EvictionPolicy {
        self.policy.as_ref()
    }

    /// Arena use by state.
    pub(crate) fn accounting(&self) -> Accounting {
        Accounting {
            free: self.areas.free_bytes(),
            ..self.acct
        }
    }

    /// Event counters.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Hits counted by `access` (samples found Ready).
    pub fn hits(&self) -> u64 {
        self.stats.hits
    }

    /// Misses counted by `access` (samples absent or
    /// failed).
    pub fn misses(&self) -> u64 {
        self.stats.misses
    }

    /// The number of entries (in flight, ready or failed).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The pins held on `key` (0 when absent).
    pub(crate) fn pins(&self, key: SampleKey) -> u32 {
        match self.lookup(key) {
            Lookup::Absent => 0,
            Lookup::InFlight { pins, .. } | Lookup::Failed { pins, .. } => pins,
            Lookup::Ready(r) => r.pins,
        }
    }

    /// What the cache knows of `key`. Counts nothing.
    pub(crate) fn lookup(&self, key: SampleKey) -> Lookup {
        self.entries.get(&key).map_or(Lookup::Absent, Entry::lookup)
    }

    /// [`lookup`](Self::lookup) for a sample a session needs: counts a hit
    /// (Ready), an in-flight hit or a miss (absent or failed), and tells the
    /// policy of the use.
    pub(crate) fn access(&mut self, key: SampleKey) -> Lookup {
        let found = self.lookup(key);
        match found {
            Lookup::Ready(_) => {
                self.stats.hits += 1;
                self.policy.touch(key);
            }
            Lookup::InFlight { .. } => self.stats.in_flight_hits += 1,
            Lookup::Absent | Lookup::Failed { .. } => self.stats.misses += 1,
        }
        found
    }

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
    fn plan_victims(&self, key: SampleKey, need: u64, victims: &mut Vec<(SampleKey, u64)>) {
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
    fn evictable_extent(&self, key: SampleKey) -> Option<Extent> {
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
    fn window(&self, victim: SampleKey, need: u64, victims: &mut Vec<(SampleKey, u64)>) -> bool {
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
    fn retry_pins(&self, key: SampleKey) -> Result<u32, CacheError> {
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

    fn start_read(
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
    fn evict(&mut self, key: SampleKey, counted: bool) -> Result<(), CacheError> {
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
        let entry = self.entries.get(&key).ok_or(CacheError::NotFound(key))?;
        let Entry::InFlight {
            extent,
            len,
            pins,
            residency,
        } = *entry
        else {
            return Err(CacheError::WrongState {
                key,
                state: entry.state(),
                expected: "in flight",
            });
        };
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
        let entry = self.entries.get(&key).ok_or(CacheError::NotFound(key))?;
        let Entry::InFlight {
            extent,
            pins,
            residency,
            ..
        } = *entry
        else {
            return Err(CacheError::WrongState {
                key,
                state: entry.state(),
                expected: "in flight",
            });
        };
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

    /// Registers session `id`, which will read `dataset` in the order of
    /// `plan`, at position 0.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: a duplicate id or a plan that cannot be
    /// indexed.
    pub(crate) fn add_session(
        &mut self,
        id: SessionId,
        dataset: u32,
        plan: SessionPlan,
    ) -> Result<(), CacheError> {
        if self.sessions.contains_key(&id) {
            return Err(FutureError::DuplicateSession(id).into());
        }
        let (_, total) = future::session_length(&plan).map_err(FutureError::Plan)?;
        self.policy.add_session(id, dataset, plan)?;
        self.sessions
            .insert(id, SessionRecord { position: 0, total });
        Ok(())
    }

    /// Session `id` has been delivered its first `position` samples (the
    /// global sequence number of the next one): call it as batches are
    /// published. Positions never go back.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session, or a position behind the
    /// current one or past the session's end.
    pub(crate) fn advance_session(
        &mut self,
        id: SessionId,
        position: u64,
    ) -> Result<(), CacheError> {
        let record = self
            .sessions
            .get(&id)
            .copied()
            .ok_or(FutureError::UnknownSession(id))?;
        if position < record.position || position > record.total {
            return Err(FutureError::BadPosition {
                session: id,
                position: record.position,
                requested: position,
                total: record.total,
            }
            .into());
        }
        self.policy.advance_session(id, position)?;
        self.sessions
            .insert(id, SessionRecord { position, ..record });
        Ok(())
    }

    /// Samples `a` and `b` of session `id`'s dataset traded places in its
    /// delivery order (relaxed order): the clairvoyant policy's next-use
    /// distances follow what is really delivered.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session.
    pub(crate) fn swap_in_session(
        &mut self,
        id: SessionId,
        a: u64,
        b: u64,
    ) -> Result<(), CacheError> {
        if !self.sessions.contains_key(&id) {
            return Err(FutureError::UnknownSession(id).into());
        }
        self.policy.swap_in_session(id, a, b)?;
        Ok(())
    }

    /// Moves session `id` forward by `count` samples:
    /// [`advance_session`](Self::advance_session) to its position plus
    /// `count`.
    ///
    /// # Errors
    ///
    /// As [`advance_session`](Self::advance_session).
    pub(crate) fn advance_session_by(
        &mut self,
        id: SessionId,
        count: u64,
    ) -> Result<(), CacheError> {
        let position = self
            .session_position(id)
            .ok_or(FutureError::UnknownSession(id))?;
        self.advance_session(id, position.saturating_add(count))
    }

    /// Forgets session `id` (finished, closed or dead). Its pins are the
    /// session engine's to release.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session.
    pub(crate) fn remove_session(&mut self, id: SessionId) -> Result<(), CacheError> {
        if !self.sessions.contains_key(&id) {
            return Err(FutureError::UnknownSession(id).into());
        }
        self.policy.remove_session(id)?;
        self.sessions.remove(&id);
        Ok(())
    }

    /// Session `id`'s position, if registered.
    pub(crate) fn session_position(&self, id: SessionId) -> Option<u64> {
        self.sessions.get(&id).map(|r| r.position)
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::{EpochPlan, PlanParams};

    fn k(index: u64) -> SampleKey {
        SampleKey { dataset: 1, index }
    }

    fn config(arena: u64, reserve: u64, policy: PolicyKind) -> CacheConfig {
        CacheConfig {
            base: 0,
            arena_size: arena,
            align: 16,
            transient_reserve: reserve,
            keep_reserve: 0,
            policy,
        }
    }

    #[test]
    fn restored_samples_take_their_old_extents_or_nothing() {
        let mut cfg = config(4096, 1024, PolicyKind::Lru);
        cfg.keep_reserve = 1024;
        let mut c = Cache::new(cfg).unwrap();
        c.enable_journal();
        // Retained area [0, 2048), transient [2048, 3072), keep [3072, 4096).
        assert!(c.restore(k(1), 0, 100, 7));
        assert!(!c.restore(k(1), 512, 100, 7), "known already");
        assert!(!c.restore(k(2), 64, 100, 7), "overlaps sample 1");
        assert!(!c.restore(k(3), 8, 10, 7), "misaligned");
        assert!(!c.restore(k(4), 2048, 100, 7), "in the transient area");
        assert!(
            !c.restore(k(5), 2000, 100, 7),
            "across the retained area's end"
        );
        assert!(c.restore(k(6), 3072, 100, 8));
        let mut warm: Vec<_> = c.warm_entries().collect();
        warm.sort();
        assert_eq!(
            warm,
            vec![(k(1), 0, 100, 7, false), (k(6), 3072, 100, 8, true)]
        );
        assert!(matches!(c.lookup(k(6)), Lookup::Ready(r) if r.residency == Residency::Kept));
        c.check_invariants().unwrap();
        // The restored retained sample is evictable like any other.
        assert_eq!(c.policy.victim(), Some(k(1)));
        let mut j = Vec::new();
        c.take_journal(&mut j);
        assert!(j.is_empty(), "restoring writes no journal");
        let r = c.reserve(k(9), 50).unwrap();
        c.complete(k(9), 3).unwrap();
        c.take_journal(&mut j);
        assert_eq!(j, vec![(k(9), r.extent.offset, 50, 3)]);
    }

    #[test]
    fn an_unstarted_unpinned_reservation_is_taken_back_whole() {
        let mut cfg = config(1024, 256, PolicyKind::Lru);
        cfg.keep_reserve = 256;
        let mut c = Cache::new(cfg).unwrap();
        let before = c.accounting();
        c.reserve_kept(k(1), 100).unwrap();
        assert!(
            matches!(c.abandon(k(1)), Err(CacheError::Busy(_))),
            "the reserver's pin is held"
        );
        c.unpin(k(1)).unwrap();
        c.abandon(k(1)).unwrap();
        assert!(matches!(c.lookup(k(1)), Lookup::Absent));
        assert_eq!(c.accounting(), before);
        c.check_invariants().unwrap();
        // The keep area has its room back, and a Ready sample is not
        // taken back.
        c.reserve_kept(k(1), 100).unwrap();
        c.complete(k(1), 7).unwrap();
        c.unpin(k(1)).unwrap();
        assert!(matches!(c.abandon(k(1)), Err(CacheError::Busy(_))));
        assert!(matches!(c.abandon(k(2)), Err(CacheError::NotFound(_))));
        c.check_invariants().unwrap();
    }

    #[test]
    fn kept_samples_live_in_their_area_and_are_never_evicted() {
        let mut cfg = config(1024, 256, PolicyKind::Lru);
        cfg.keep_reserve = 256;
        assert_eq!(cfg.retain_limit(), 512);
        let mut c = Cache::new(cfg).unwrap();
        // Two kept samples fill the keep area; a third is refused.
        for i in 0..2 {
            let r = c.reserve_kept(k(i), 100).unwrap();
            assert_eq!(r.residency, Residency::Kept);
            assert!(r.extent.offset >= 768, "{:?}", r.extent);
            c.complete(k(i), 7).unwrap();
            c.unpin(k(i)).unwrap();
        }
        assert!(matches!(
            c.reserve_kept(k(2), 100),
            Err(CacheError::NoSpace { .. })
        ));
        assert_eq!(c.accounting().kept, 224);
        c.check_invariants().unwrap();
        // Fill the retained and transient areas over and over: the kept
        // samples stay Ready.
        for i in 10..60 {
            if let Ok(r) = c.reserve(k(i), 200) {
                assert_ne!(r.residency, Residency::Kept);
                c.complete(k(i), 1).unwrap();
                c.unpin(k(i)).unwrap();
            }
            c.check_invariants().unwrap();
        }
        for i in 0..2 {
            assert!(matches!(c.lookup(k(i)), Lookup::Ready(r) if r.crc32c == 7 && r.pins == 0));
            assert_eq!(c.forget(k(i)), Err(CacheError::Busy(k(i))));
        }
        // Pinned and unpinned again, a kept sample is still not evictable.
        c.pin(k(0)).unwrap();
        c.unpin(k(0)).unwrap();
        assert!(!c.policy().contains(k(0)));
        c.check_invariants().unwrap();
        // A new view keeps only k(1): k(0) is freed, its room reusable; a
        // pinned kept sample the view drops waits.
        c.pin(k(1)).unwrap();
        assert_eq!(c.release_kept(|key| key == k(1)), (1, 0));
        assert!(matches!(c.lookup(k(0)), Lookup::Absent));
        assert_eq!(c.release_kept(|_| false), (0, 1));
        assert!(matches!(c.lookup(k(1)), Lookup::Ready(_)));
        c.unpin(k(1)).unwrap();
        assert_eq!(c.release_kept(|_| false), (1, 0));
        assert_eq!(c.accounting().kept, 0);
        c.check_invariants().unwrap();
        assert!(c.reserve_kept(k(3), 100).is_ok());
        c.complete(k(3), 3).unwrap();
        c.unpin(k(3)).unwrap();
        assert_eq!(c.release_kept(|_| false), (1, 0));
        // A new view makes this node keep samples it holds as ordinary
        // cache entries: they move into the keep area (room for one of
        // them here), out of the policy's reach; a pinned one stays put.
        let cached: Vec<u64> = (10..60)
            .filter(|&i| {
                matches!(c.lookup(k(i)), Lookup::Ready(_))
                    && c.entries.get(&k(i)).is_some_and(|e| {
                        matches!(
                            e,
                            Entry::Ready {
                                residency: Residency::Retained,
                                ..
                            }
                        )
                    })
            })
            .collect();
        assert!(cached.len() >= 2, "{cached:?}");
        c.pin(k(cached[0])).unwrap();
        let moves = c.adopt_kept(|key| cached.iter().any(|&i| key == k(i)));
        assert_eq!(moves.len(), 1, "room for one in the keep area");
        let (from, to) = moves[0];
        assert!(to.offset >= 768 && from.offset < 768, "{from:?} -> {to:?}");
        let adopted = cached
            .iter()
            .map(|&i| k(i))
            .find(|key| {
                matches!(c.entries.get(key),
                    Some(Entry::Ready { residency: Residency::Kept, extent, .. }) if *extent == to)
            })
            .expect("the adopted sample points at its new extent");
        assert_ne!(adopted, k(cached[0]), "the pinned one stays");
        assert!(!c.policy().contains(adopted));
        assert!(matches!(
            c.entries.get(&k(cached[0])),
            Some(Entry::Ready {
                residency: Residency::Retained,
                ..
            })
        ));
        c.check_invariants().unwrap();
        c.unpin(k(cached[0])).unwrap();
        // The reserves cannot exceed the arena.
        let mut bad = config(1024, 512, PolicyKind::Lru);
        bad.keep_reserve = 513;
        assert!(Cache::new(bad).is_err());
    }

    /// Reserve, complete, unpin: the sample ends cached (or freed).
    fn fill(c: &mut Cache, key: SampleKey, len: u64) -> Reservation {
        let r = c.reserve(key, len).unwrap();
        c.complete(key, 7).unwrap();
        c.unpin(key).unwrap();
        c.check_invariants().unwrap();
        r
    }

    #[test]
    fn states_and_accounting() {
        let mut c = Cache::new(config(1024, 256, PolicyKind::Lru)).unwrap();
        assert_eq!(c.accounting().free, 1024);
        let r = c.reserve(k(1), 100).unwrap();
        assert_eq!(r.extent.len, 112);
        assert_eq!(r.residency, Residency::Retained);
        assert!(matches!(c.lookup(k(1)), Lookup::InFlight { pins: 1, .. }));
        let a = c.accounting();
        assert_eq!((a.in_flight, a.free, a.retained), (112, 912, 112));
        c.check_invariants().unwrap();
        let Completion::Ready(ready) = c.complete(k(1), 0xABCD).unwrap() else {
            panic!("not ready");
        };
        assert_eq!((ready.len, ready.crc32c, ready.pins), (100, 0xABCD, 1));
        assert_eq!(c.accounting().pinned, 112);
        assert_eq!(c.pin(k(1)), Ok(2));
        c.unpin(k(1)).unwrap();
        c.unpin(k(1)).unwrap();
        assert_eq!(c.unpin(k(1)), Err(CacheError::NotPinned(k(1))));
        let a = c.accounting();
        assert_eq!((a.cached, a.pinned, a.in_flight), (112, 0, 0));
        assert_eq!(a.total(), 1024);
        c.check_invariants().unwrap();
        // Access counts.
        assert!(matches!(c.access(k(1)), Lookup::Ready(_)));
        assert_eq!(c.access(k(2)), Lookup::Absent);
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
    }

    #[test]
    fn bad_calls_are_errors_and_change_nothing() {
        assert!(Cache::new(config(0, 0, PolicyKind::Lru)).is_err());
        assert!(Cache::new(config(100, 200, PolicyKind::Lru)).is_err());
        assert!(Cache::new(CacheConfig {
            align: 3,
            ..config(100, 0, PolicyKind::Lru)
        })
        .is_err());
        let mut c = Cache::new(config(1024, 256, PolicyKind::Clairvoyant)).unwrap();
        assert_eq!(c.reserve(k(1), 0), Err(CacheError::ZeroLength));
        assert!(matches!(
            c.reserve(k(1), 1025),
            Err(CacheError::TooLarge { .. })
        ));
        assert!(matches!(
            c.reserve(k(1), u64::MAX),
            Err(CacheError::TooLarge { .. })
        ));
        // Larger than both areas (768 and 256 bytes).
        assert_eq!(
            c.reserve(k(1), 769),
            Err(CacheError::TooLarge {
                len: 769,
                largest: 768
            })
        );
        assert_eq!(
            CacheConfig {
                base: 8,
                ..config(1024, 256, PolicyKind::Lru)
            }
            .largest_sample(),
            752
        );
        assert_eq!(c.complete(k(1), 0), Err(CacheError::NotFound(k(1))));
        assert_eq!(c.fail(k(1), 0), Err(CacheError::NotFound(k(1))));
        assert_eq!(c.pin(k(1)), Err(CacheError::NotFound(k(1))));
        assert_eq!(c.unpin(k(1)), Err(CacheError::NotFound(k(1))));
        assert_eq!(c.forget(k(1)), Err(CacheError::NotFound(k(1))));
        c.reserve(k(1), 10).unwrap();
        assert!(matches!(
            c.reserve(k(1), 10),
            Err(CacheError::AlreadyPresent {
                state: "in flight",
                ..
            })
        ));
        assert_eq!(c.forget(k(1)), Err(CacheError::Busy(k(1))));
        c.complete(k(1), 0).unwrap();
        assert!(matches!(
            c.complete(k(1), 0),
            Err(CacheError::WrongState { .. })
        ));
        assert!(matches!(
            c.fail(k(1), 3),
            Err(CacheError::WrongState { .. })
        ));
        assert!(matches!(
            c.reserve(k(1), 10),
            Err(CacheError::AlreadyPresent { .. })
        ));
        assert!(c.advance_session(9, 1).is_err());
        assert!(c.remove_session(9).is_err());
        c.check_invariants().unwrap();
        assert_eq!(c.accounting().pinned, 16);
    }

    #[test]
    fn failures_keep_pins_and_allow_retry() {
        let mut c = Cache::new(config(1024, 0, PolicyKind::Lru)).unwrap();
        c.reserve(k(5), 50).unwrap();
        c.pin(k(5)).unwrap(); // a second session waits for it
        c.fail(k(5), 42).unwrap();
        assert_eq!(c.lookup(k(5)), Lookup::Failed { code: 42, pins: 2 });
        assert_eq!(c.accounting().free, 1024);
        assert_eq!(
            c.pin(k(5)),
            Err(CacheError::Failed {
                key: k(5),
                code: 42
            })
        );
        // Still pinned by the two that reported the failure: a retry takes
        // their pins over, so neither ever holds bytes without a pin.
        let r = c.reserve(k(5), 50).unwrap();
        assert!(matches!(c.lookup(k(5)), Lookup::InFlight { pins: 3, .. }));
        assert!(matches!(
            c.reserve(k(5), 50),
            Err(CacheError::AlreadyPresent { .. })
        ));
        c.complete(k(5), 9).unwrap();
        c.unpin(k(5)).unwrap(); // the retrier is done
        c.unpin(k(5)).unwrap(); // the first holder releases its error batch
        assert!(matches!(c.lookup(k(5)), Lookup::Ready(s) if s.pins == 1));
        let a = c.accounting();
        assert_eq!((a.pinned, a.free), (r.extent.len, 1024 - r.extent.len));
        c.unpin(k(5)).unwrap();
        assert_eq!(c.unpin(k(5)), Err(CacheError::NotPinned(k(5))));
        assert_eq!(c.accounting().cached, r.extent.len);
        c.check_invariants().unwrap();
        // A failed record without pins is replaced the same way.
        c.reserve(k(7), 8).unwrap();
        c.unpin(k(7)).unwrap();
        c.fail(k(7), 1).unwrap();
        fill(&mut c, k(7), 8);
        assert!(matches!(c.lookup(k(7)), Lookup::Ready(s) if s.pins == 0));
        c.reserve(k(6), 8).unwrap();
        c.unpin(k(6)).unwrap();
        c.fail(k(6), 1).unwrap();
        c.forget(k(6)).unwrap();
        assert_eq!(c.lookup(k(6)), Lookup::Absent);
        assert_eq!(c.stats().failures, 3);
        c.check_invariants().unwrap();
    }

    #[test]
    fn lru_evicts_least_recent_and_nothing_pinned() {
        let mut c = Cache::new(config(64 * 10, 0, PolicyKind::Lru)).unwrap();
        for i in 0..10 {
            fill(&mut c, k(i), 64);
        }
        assert_eq!(c.accounting().free, 0);
        // Pin 0 (in use), touch 1 (recently hit).
        c.pin(k(0)).unwrap();
        assert!(matches!(c.access(k(1)), Lookup::Ready(_)));
        let r = c.reserve(k(10), 64).unwrap();
        assert_eq!(r.evicted, 1);
        assert_eq!(c.lookup(k(2)), Lookup::Absent);
        assert!(matches!(c.lookup(k(0)), Lookup::Ready(_)));
        assert!(matches!(c.lookup(k(1)), Lookup::Ready(_)));
        c.complete(k(10), 0).unwrap();
        c.check_invariants().unwrap();
        // Pin everything: no room, no eviction.
        for i in 1..10 {
            if i != 2 {
                c.pin(k(i)).unwrap();
            }
        }
        assert_eq!(
            c.reserve(k(11), 64),
            Err(CacheError::NoSpace {
                key: k(11),
                need: 64
            })
        );
        assert_eq!(c.stats().no_space, 1);
        c.check_invariants().unwrap();
        let a = c.accounting();
        assert_eq!((a.pinned, a.cached, a.free), (640, 0, 0));
    }

    #[test]
    fn minio_fills_once_then_reads_transiently() {
        let mut c = Cache::new(config(1000, 200, PolicyKind::Minio)).unwrap();
        // Retain limit 800: 8 samples of 100 bytes (align 16 → 112 each: 7).
        let mut retained = 0;
        for i in 0..10 {
            let r = fill(&mut c, k(i), 100);
            if r.residency == Residency::Retained {
                retained += 1;
            }
        }
        assert_eq!(retained, 7);
        assert_eq!(c.stats().evictions, 0);
        // Transient reads left nothing behind.
        let a = c.accounting();
        assert_eq!((a.cached, a.transient, a.retained), (7 * 112, 0, 7 * 112));
        assert_eq!(c.lookup(k(9)), Lookup::Absent);
        // Transient reads use what the retained set leaves: 1000 - 784 =
        // 216 bytes, room for one.
        let r1 = c.reserve(k(20), 100).unwrap();
        assert_eq!(r1.residency, Residency::Transient);
        assert!(matches!(
            c.reserve(k(21), 100),
            Err(CacheError::NoSpace { .. })
        ));
        // The owner of 20 vanishes mid-read: it is parked until the read ends.
        c.unpin(k(20)).unwrap();
        assert!(matches!(c.lookup(k(20)), Lookup::InFlight { pins: 0, .. }));
        assert_eq!(c.accounting().in_flight, 112);
        c.check_invariants().unwrap();
        assert!(matches!(
            c.reserve(k(21), 100),
            Err(CacheError::NoSpace { .. })
        ));
        assert_eq!(c.complete(k(20), 0), Ok(Completion::Discarded));
        assert_eq!(c.accounting().in_flight, 0);
        // Two sessions share the transient 21; it is freed at the last unpin.
        c.reserve(k(21), 100).unwrap();
        c.pin(k(21)).unwrap();
        c.complete(k(21), 0).unwrap();
        c.unpin(k(21)).unwrap();
        assert!(matches!(c.lookup(k(21)), Lookup::Ready(_)));
        assert_eq!(c.accounting().pinned, 112);
        c.unpin(k(21)).unwrap();
        assert_eq!(c.lookup(k(21)), Lookup::Absent);
        assert_eq!(c.accounting().free, 1000 - 784);
        c.check_invariants().unwrap();
    }

    #[test]
    fn parked_retained_read_lands_in_the_cache() {
        let mut c = Cache::new(config(1024, 0, PolicyKind::Lru)).unwrap();
        c.reserve(k(1), 100).unwrap();
        c.unpin(k(1)).unwrap(); // owner gone
        assert!(matches!(c.lookup(k(1)), Lookup::InFlight { pins: 0, .. }));
        assert_eq!(c.accounting().in_flight, 112);
        c.check_invariants().unwrap();
        c.complete(k(1), 9).unwrap();
        assert_eq!(c.accounting().cached, 112);
        assert!(c.policy().contains(k(1)));
        c.check_invariants().unwrap();
        // Forget drops a cached sample.
        c.forget(k(1)).unwrap();
        assert_eq!(c.accounting().free, 1024);
        assert_eq!(c.stats().evictions, 0);
    }

    #[test]
    fn clairvoyant_evicts_furthest_and_bypasses() {
        let params = PlanParams {
            num_samples: 8,
            seed: 11,
            rank: 0,
            world_size: 1,
            batch_size: 1,
            drop_last: false,
        };
        let plan = SessionPlan::new(params, 0, 3).unwrap();
        let order: Vec<u64> = (0..3)
            .flat_map(|e| EpochPlan::new(&params, e).unwrap().samples().to_vec())
            .collect();
        // Room for 4 samples of 16 bytes, plus one transient slot.
        let mut c = Cache::new(config(80, 16, PolicyKind::Clairvoyant)).unwrap();
        c.add_session(1, 1, plan).unwrap();
        let mut hits = 0;
        for (pos, &s) in order.iter().enumerate() {
            let key = k(s);
            match c.access(key) {
                Lookup::Ready(_) => {
                    hits += 1;
                    c.pin(key).unwrap();
                }
                Lookup::Absent => {
                    c.reserve(key, 16).unwrap();
                    c.complete(key, 0).unwrap();
                }
                other => panic!("{other:?}"),
            }
            c.advance_session(1, pos as u64 + 1).unwrap();
            c.unpin(key).unwrap();
            c.check_invariants().unwrap();
        }
        // Belady with 4 slots over 3 permutations of 8: the reference count.
        assert_eq!(hits, belady_hits(&order, 4));
        assert!(c.stats().transient_reservations > 0);
        c.remove_session(1).unwrap();
        assert_eq!(c.session_position(1), None);
    }

    /// Belady with bypass on a unit-size trace, by brute force.
    fn belady_hits(trace: &[u64], slots: usize) -> u64 {
        let next = |from: usize, s: u64| {
            trace[from..]
                .iter()
                .position(|&x| x == s)
                .map_or(usize::MAX, |p| p + from)
        };
        let mut cache: Vec<u64> = Vec::new();
        let mut hits = 0;
        for (t, &s) in trace.iter().enumerate() {
            if cache.contains(&s) {
                hits += 1;
                continue;
            }
            if cache.len() < slots {
                cache.push(s);
                continue;
            }
            let (i, far) = cache
                .iter()
                .enumerate()
                .map(|(i, &c)| (i, next(t + 1, c)))
                .max_by_key(|&(_, n)| n)
                .unwrap();
            if next(t + 1, s) < far {
                cache[i] = s;
            }
        }
        hits
    }

    #[test]
    fn randomized_operations_keep_the_invariants() {
        for policy in PolicyKind::ALL {
            let mut c = Cache::new(config(4096, 512, policy)).unwrap();
            let mut rng = 0x1234_5678u64;
            let mut next = move |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            for step in 0..20_000 {
                let key = k(next(64));
                match next(8) {
                    0 | 1 => {
                        let _ = c.reserve(key, 1 + next(300));
                    }
                    2 => {
                        let _ = c.complete(key, 1);
                    }
                    3 => {
                        let _ = c.fail(key, 5);
                    }
                    4 => {
                        let _ = c.pin(key);
                    }
                    5 | 6 => {
                        let _ = c.unpin(key);
                    }
                    _ => {
                        let _ = c.access(key);
                        let _ = c.forget(key);
                    }
                }
                if step % 16 == 0 {
                    c.check_invariants()
                        .unwrap_or_else(|e| panic!("{policy} step {step}: {e}"));
                }
            }
            // Drain: complete everything in flight, release every pin.
            let keys: Vec<SampleKey> = (0..64).map(k).collect();
            for &key in &keys {
                if let Lookup::InFlight { .. } = c.lookup(key) {
                    c.complete(key, 0).unwrap();
                }
                while c.unpin(key).is_ok() {}
            }
            c.check_invariants().unwrap();
            let a = c.accounting();
            assert_eq!((a.pinned, a.in_flight, a.transient), (0, 0, 0));
            assert_eq!(a.free + a.cached, 4096);
            for &key in &keys {
                let _ = c.forget(key);
            }
            assert_eq!(c.accounting().free, 4096);
            assert!(c.is_empty());
        }
    }
}
