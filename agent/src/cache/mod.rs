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

mod areas;
mod entry;
mod error;
mod eviction;
pub mod future;
mod invariants;
mod keep;
pub mod policy;
mod reads;
mod sample_map;
mod sessions;
#[cfg(feature = "sim")]
pub mod sim;

use std::collections::HashMap;

use areas::Areas;
use entry::{Entry, SessionRecord};
pub use error::CacheError;
use sample_map::SampleMap;
use std::fmt;

pub use future::{FutureError, FutureIndex, SessionId, NEVER};
pub use policy::{Clairvoyant, EvictionPolicy, Lru, MinIo, PolicyKind, UnknownPolicy};

use crate::extent::Extent;
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
}

#[cfg(test)]
mod tests;
