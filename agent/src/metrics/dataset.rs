//! The per-dataset counters: health, bytes and lookups, and the bounded
//! table of epochs behind `granary_epoch_lookups_total`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Epochs of one dataset that keep series of their own
/// (`granary_epoch_lookups_total`): the most recently started ones. An
/// older epoch's series disappears when a newer one needs its slot, so a
/// loader's choice of `first_epoch` cannot grow the label set.
pub const EPOCH_SLOTS: usize = 8;

/// Epochs from this one up share one series, labelled `epoch="1024+"`: the
/// `epoch` label takes at most 1,025 values per dataset over the agent's
/// life, whatever `first_epoch` loaders ask for.
pub const EPOCH_LABEL_LIMIT: u32 = 1024;

/// The `epoch` label of a table key.
pub(super) fn epoch_label(key: u64) -> String {
    if key >= u64::from(EPOCH_LABEL_LIMIT) {
        format!("{EPOCH_LABEL_LIMIT}+")
    } else {
        key.to_string()
    }
}

/// How one dataset is doing (a snapshot; see `Metrics::dataset_health`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DatasetHealth {
    /// `"fs"`, `"s3"`, `"cql"`.
    pub kind: &'static str,
    /// Whether its catalog is loaded and it serves.
    pub ready: bool,
    /// Attempts made to load its catalog.
    pub(crate) load_attempts: u64,
    /// Sample reads that failed for good.
    pub read_errors: u64,
}

/// Hits and misses of one epoch of one dataset, over all sessions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EpochCounts {
    /// Samples present in the arena (or already being read) when a session
    /// first needed them.
    pub hits: u64,
    /// Samples that had to be read from the source.
    pub misses: u64,
}

/// Marks an [`EpochSlot`] that holds no epoch.
pub(super) const NO_EPOCH: u64 = u64::MAX;

/// One epoch's counters in a dataset's bounded epoch table.
#[derive(Debug)]
pub(super) struct EpochSlot {
    /// The epoch counted here, or [`NO_EPOCH`].
    pub(super) epoch: AtomicU64,
    /// When the slot was taken (the table's clock), for eviction.
    pub(super) born: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
}

impl Default for EpochSlot {
    fn default() -> EpochSlot {
        EpochSlot {
            epoch: AtomicU64::new(NO_EPOCH),
            born: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

/// The counters of one dataset.
#[derive(Debug)]
pub(super) struct DatasetStats {
    pub(super) name: Box<str>,
    pub(super) kind: &'static str,
    pub(super) ready: AtomicBool,
    pub(super) load_attempts: AtomicU64,
    pub(super) read_errors: AtomicU64,
    /// Samples needed, over every epoch: found in the arena / read.
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) epochs: [EpochSlot; EPOCH_SLOTS],
    /// The epoch table's clock: slots taken so far.
    pub(super) clock: AtomicU64,
    /// The slot used last (most samples of a turn share an epoch).
    pub(super) last: AtomicU64,
}

impl DatasetStats {
    pub(super) fn new(name: &str, kind: &'static str) -> DatasetStats {
        DatasetStats {
            name: name.into(),
            kind,
            ready: AtomicBool::new(false),
            load_attempts: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            epochs: Default::default(),
            clock: AtomicU64::new(0),
            last: AtomicU64::new(0),
        }
    }

    /// The slot of `epoch`, taking the oldest one when it has none. Written
    /// by the engine thread only; a scrape racing a slot's reuse may read
    /// that slot's old or new counts, never anything else.
    pub(super) fn slot(&self, epoch: u64) -> &EpochSlot {
        let last = &self.epochs[self.last.load(Ordering::Relaxed) as usize % EPOCH_SLOTS];
        if last.epoch.load(Ordering::Relaxed) == epoch {
            return last;
        }
        let (mut oldest, mut oldest_born) = (0, u64::MAX);
        for (i, s) in self.epochs.iter().enumerate() {
            let e = s.epoch.load(Ordering::Relaxed);
            if e == epoch {
                self.last.store(i as u64, Ordering::Relaxed);
                return s;
            }
            let born = if e == NO_EPOCH {
                0
            } else {
                s.born.load(Ordering::Relaxed)
            };
            if born < oldest_born {
                (oldest, oldest_born) = (i, born);
            }
        }
        let s = &self.epochs[oldest];
        s.epoch.store(NO_EPOCH, Ordering::Release);
        s.hits.store(0, Ordering::Relaxed);
        s.misses.store(0, Ordering::Relaxed);
        s.born.store(
            self.clock.fetch_add(1, Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
        s.epoch.store(epoch, Ordering::Release);
        self.last.store(oldest as u64, Ordering::Relaxed);
        s
    }

    pub(super) fn health(&self) -> DatasetHealth {
        DatasetHealth {
            kind: self.kind,
            ready: self.ready.load(Ordering::Relaxed),
            load_attempts: self.load_attempts.load(Ordering::Relaxed),
            read_errors: self.read_errors.load(Ordering::Relaxed),
        }
    }

    /// The epochs in the table, in epoch order.
    pub(super) fn epoch_counts(&self) -> Vec<(u64, EpochCounts)> {
        let mut v: Vec<(u64, EpochCounts)> = self
            .epochs
            .iter()
            .filter_map(|s| {
                let e = s.epoch.load(Ordering::Acquire);
                let c = EpochCounts {
                    hits: s.hits.load(Ordering::Relaxed),
                    misses: s.misses.load(Ordering::Relaxed),
                };
                (e != NO_EPOCH && s.epoch.load(Ordering::Acquire) == e).then_some((e, c))
            })
            .collect();
        v.sort_unstable_by_key(|(e, _)| *e);
        v
    }
}

/// The per-dataset counters, set once the engine knows its datasets.
pub(super) type DatasetTable = Arc<OnceLock<Box<[DatasetStats]>>>;
