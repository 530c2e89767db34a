//! The agent's metrics: counters, gauges and a read-latency histogram the
//! engine updates without locks or allocations, rendered in the
//! OpenMetrics text format by `prometheus-client`, and served over HTTP by
//! [`MetricsServer`] (see `docs/operations.md` for every metric).
//!
//! The engine thread updates atomics only: [`Counter::inc_by`],
//! [`Gauge::set`], `Histogram::observe`, `Metrics::count_epoch` (dense
//! per-dataset slots, indexed by the dataset's position in the engine, and a
//! bounded table of epochs per dataset). The HTTP thread and `granary
//! status` read them; a scrape allocates, a sample never does.

use granary_shm::Violation;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[cfg(test)]
mod dashboard_tests;
mod endpoint;
mod health;
mod job;
mod ranks;

pub use job::SharedJob;
pub use ranks::SharedRanks;

pub use endpoint::{
    scrape, MetricsServer, CONTENT_TYPE, MAX_CLIENTS, MAX_REQUEST_HEAD, REQUEST_DEADLINE,
};
pub use health::{Health, STALE as HEALTH_STALE};
pub use prometheus_client::metrics::counter::Counter;

/// A gauge of non-negative integers (bytes, counts).
pub type Gauge = prometheus_client::metrics::gauge::Gauge<u64, AtomicU64>;

/// Upper bounds (seconds) of the read-latency histogram buckets.
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// The outcomes of `granary_warm_restart_samples_total`, in the order of
/// [`Metrics::warm_restart`]: put back in the cache; dropped because the
/// bytes no longer have their CRC-32C; dropped because their dataset
/// changed (fingerprint) or is no longer served, or the sample no longer
/// has that size; dropped because their extent is no longer free or no
/// longer lies in the cache's retained or keep area (the layout changed).
pub const WARM_OUTCOMES: [&str; 4] = ["recovered", "crc", "changed", "placement"];

/// Exports [`Metrics::warm_restart`] as one labelled counter family.
#[derive(Debug)]
struct WarmCollector([Counter; WARM_OUTCOMES.len()]);

impl Collector for WarmCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "granary_warm_restart_samples",
            "Samples of a warm restart's index, by outcome: recovered, or dropped (crc, changed, placement).",
            None,
            MetricType::Counter,
        )?;
        for (outcome, c) in WARM_OUTCOMES.iter().zip(&self.0) {
            ConstCounter::new(c.get()).encode(family.encode_family(&[("outcome", *outcome)])?)?;
        }
        Ok(())
    }
}

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
fn epoch_label(key: u64) -> String {
    if key >= u64::from(EPOCH_LABEL_LIMIT) {
        format!("{EPOCH_LABEL_LIMIT}+")
    } else {
        key.to_string()
    }
}

/// What a loader did wrong, the `kind` label of `granary_violations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A ring index moved backwards or ran more than a capacity ahead.
    RingIndex,
    /// A descriptor named a range outside its region.
    OutOfBounds,
    /// A field held a value outside its domain.
    BadField,
    /// A release named a batch not on loan (wrong token, twice, never lent).
    UnknownLease,
    /// A descriptor or table was misaligned.
    Misaligned,
    /// A malformed message on the session's socket.
    Handshake,
}

impl ViolationKind {
    /// Every kind, in the order of their series.
    pub const ALL: [ViolationKind; 6] = [
        ViolationKind::RingIndex,
        ViolationKind::OutOfBounds,
        ViolationKind::BadField,
        ViolationKind::UnknownLease,
        ViolationKind::Misaligned,
        ViolationKind::Handshake,
    ];

    /// The kind of a shared-memory violation, or `None` for a fence that
    /// is not a protocol violation: a replaced view
    /// ([`Violation::ViewReplaced`]) or a silent loader
    /// ([`Violation::Silent`], counted in `granary_sessions_timed_out`).
    pub const fn of(v: &Violation) -> Option<ViolationKind> {
        match v {
            Violation::RingIndex { .. } => Some(ViolationKind::RingIndex),
            Violation::OutOfBounds { .. } => Some(ViolationKind::OutOfBounds),
            Violation::BadField { .. } => Some(ViolationKind::BadField),
            Violation::UnknownLease { .. } => Some(ViolationKind::UnknownLease),
            Violation::Misaligned { .. } => Some(ViolationKind::Misaligned),
            Violation::ViewReplaced | Violation::Silent { .. } => None,
        }
    }

    /// The `kind` label.
    pub const fn label(self) -> &'static str {
        match self {
            ViolationKind::RingIndex => "ring_index",
            ViolationKind::OutOfBounds => "out_of_bounds",
            ViolationKind::BadField => "bad_field",
            ViolationKind::UnknownLease => "unknown_lease",
            ViolationKind::Misaligned => "misaligned",
            ViolationKind::Handshake => "handshake",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// A cumulative histogram over `LATENCY_BUCKETS`, lock-free (the
/// `prometheus-client` histogram takes a lock per observation).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Approximate quantile (upper bound of the bucket holding it), seconds.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let target = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= target {
                return Some(LATENCY_BUCKETS[i]);
            }
        }
        Some(f64::INFINITY)
    }
}

/// A [`Histogram`] shared with the registry.
#[derive(Debug, Clone, Default)]
pub struct SharedHistogram(Arc<Histogram>);

impl std::ops::Deref for SharedHistogram {
    type Target = Histogram;

    fn deref(&self) -> &Histogram {
        &self.0
    }
}

impl EncodeMetric for SharedHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let count = self.count();
        let mut buckets = [(f64::INFINITY, 0u64); LATENCY_BUCKETS.len() + 1];
        let mut below = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Ordering::Relaxed);
            buckets[i] = (LATENCY_BUCKETS[i], n);
            below += n;
        }
        buckets[LATENCY_BUCKETS.len()] = (f64::INFINITY, count.saturating_sub(below));
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
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
const NO_EPOCH: u64 = u64::MAX;

/// One epoch's counters in a dataset's bounded epoch table.
#[derive(Debug)]
struct EpochSlot {
    /// The epoch counted here, or [`NO_EPOCH`].
    epoch: AtomicU64,
    /// When the slot was taken (the table's clock), for eviction.
    born: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
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
struct DatasetStats {
    name: Box<str>,
    kind: &'static str,
    ready: AtomicBool,
    load_attempts: AtomicU64,
    read_errors: AtomicU64,
    /// Samples needed, over every epoch: found in the arena / read.
    hits: AtomicU64,
    misses: AtomicU64,
    epochs: [EpochSlot; EPOCH_SLOTS],
    /// The epoch table's clock: slots taken so far.
    clock: AtomicU64,
    /// The slot used last (most samples of a turn share an epoch).
    last: AtomicU64,
}

impl DatasetStats {
    fn new(name: &str, kind: &'static str) -> DatasetStats {
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
    fn slot(&self, epoch: u64) -> &EpochSlot {
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

    fn health(&self) -> DatasetHealth {
        DatasetHealth {
            kind: self.kind,
            ready: self.ready.load(Ordering::Relaxed),
            load_attempts: self.load_attempts.load(Ordering::Relaxed),
            read_errors: self.read_errors.load(Ordering::Relaxed),
        }
    }

    /// The epochs in the table, in epoch order.
    fn epoch_counts(&self) -> Vec<(u64, EpochCounts)> {
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
type DatasetTable = Arc<OnceLock<Box<[DatasetStats]>>>;

/// Every metric the agent exports.
pub struct Metrics {
    /// Samples handed to loaders (counted once per batch publication).
    pub samples_served: Counter,
    /// Bytes handed to loaders.
    pub(crate) bytes_served: Counter,
    /// Batches published.
    pub(crate) batches_served: Counter,
    /// The cache's own total of lookups that found the sample in the arena
    /// (the engine mirrors it with `inner().store`).
    pub(crate) cache_hits: Counter,
    /// The cache's own total of lookups that needed a read from the source.
    pub(crate) cache_misses: Counter,
    /// Reads submitted to the source.
    pub reads_submitted: Counter,
    /// Reads that failed after retries.
    pub read_errors: Counter,
    /// Reads retried.
    pub read_retries: Counter,
    /// Samples moved ahead of late ones (`order = "relaxed"`).
    pub relaxed_swaps: Counter,
    /// Reads currently in flight.
    pub reads_in_flight: Gauge,
    /// Bytes read from the source.
    pub bytes_read: Counter,
    /// Read latency.
    pub read_latency: SharedHistogram,
    /// Nanoseconds loaders spent with an empty ready ring while their next
    /// batch was not ready (exported in seconds).
    pub loader_wait_ns: Counter,
    /// Every rank's waits, stalls and verdicts ([`crate::why`]).
    pub ranks: SharedRanks,
    /// Every rank of the job, on every node ([`crate::jobstatus`]).
    pub job: SharedJob,
    /// Arena bytes free.
    pub arena_free: Gauge,
    /// Arena bytes cached and unpinned.
    pub arena_cached: Gauge,
    /// Arena bytes pinned by published batches.
    pub arena_pinned: Gauge,
    /// Arena bytes reserved for reads in flight.
    pub arena_in_flight: Gauge,
    /// Arena size.
    pub arena_size: Gauge,
    /// Sessions open.
    pub sessions_open: Gauge,
    /// Sessions opened since start.
    pub sessions_opened: Counter,
    /// Protocol violations detected, of every kind (exported by kind as
    /// `granary_violations_total{kind}`; count with
    /// [`count_violation`](Self::count_violation)).
    pub violations: Counter,
    /// Protocol violations by kind, indexed like [`ViolationKind::ALL`].
    violations_by_kind: [Counter; ViolationKind::ALL.len()],
    /// Sessions fenced.
    pub sessions_fenced: Counter,
    /// Sessions ended because their loader neither released a batch nor
    /// beat its heartbeat for `sessions.client_timeout_ms`.
    pub sessions_timed_out: Counter,
    /// Connections refused by the credential allowlist.
    pub connections_refused: Counter,
    /// Loaders that went away with batches on loan.
    pub loaders_lost: Counter,
    /// The peer tier's series (`granary_tier_*`, `granary_peer_*`).
    pub peers: crate::peers::metrics::PeerMetrics,
    /// Samples of a warm restart's index, by outcome
    /// (`granary_warm_restart_samples_total{outcome}`; see
    /// [`WARM_OUTCOMES`]).
    pub warm_restart: [Counter; WARM_OUTCOMES.len()],
    datasets: DatasetTable,
    registry: Registry,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The labelled and derived metrics, read at scrape time.
#[derive(Debug)]
struct Derived {
    cache: [(&'static str, &'static str, Counter); 2],
    violations: [Counter; ViolationKind::ALL.len()],
    loader_wait_ns: Counter,
    arena: [(&'static str, Gauge); 4],
    datasets: DatasetTable,
}

impl Collector for Derived {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut e = enc.encode_descriptor(
            "granary_cache_lookups",
            "Sample lookups by result and tier (the cache's count).",
            None,
            MetricType::Counter,
        )?;
        for (result, tier, c) in &self.cache {
            c.encode(e.encode_family(&[("result", *result), ("tier", *tier)])?)?;
        }
        let mut e = enc.encode_descriptor(
            "granary_violations",
            "Protocol violations by loaders, by kind.",
            None,
            MetricType::Counter,
        )?;
        for (kind, c) in ViolationKind::ALL.iter().zip(&self.violations) {
            c.encode(e.encode_family(&[("kind", kind.label())])?)?;
        }
        let wait = ConstCounter::new(self.loader_wait_ns.get() as f64 / 1e9);
        wait.encode(enc.encode_descriptor(
            "granary_loader_wait_seconds",
            "Time loaders waited for a batch that was not ready.",
            None,
            MetricType::Counter,
        )?)?;
        let mut e = enc.encode_descriptor(
            "granary_arena_bytes",
            "Arena bytes by state.",
            None,
            MetricType::Gauge,
        )?;
        for (state, g) in &self.arena {
            g.encode(e.encode_family(&[("state", *state)])?)?;
        }
        let Some(datasets) = self.datasets.get() else {
            return Ok(());
        };
        let mut e = enc.encode_descriptor(
            "granary_dataset_ready",
            "Whether a dataset's catalog is loaded and it serves (1) or its store is unavailable (0).",
            None,
            MetricType::Gauge,
        )?;
        for d in datasets.iter() {
            let v = ConstGauge::new(i64::from(d.ready.load(Ordering::Relaxed)));
            v.encode(e.encode_family(&[("dataset", &*d.name), ("kind", d.kind)])?)?;
        }
        let mut e = enc.encode_descriptor(
            "granary_dataset_load_attempts",
            "Attempts to load a dataset's catalog.",
            None,
            MetricType::Counter,
        )?;
        for d in datasets.iter() {
            let v = ConstCounter::new(d.load_attempts.load(Ordering::Relaxed));
            v.encode(e.encode_family(&[("dataset", &*d.name)])?)?;
        }
        let mut e = enc.encode_descriptor(
            "granary_dataset_read_errors",
            "Sample reads of a dataset that failed for good.",
            None,
            MetricType::Counter,
        )?;
        for d in datasets.iter() {
            let v = ConstCounter::new(d.read_errors.load(Ordering::Relaxed));
            v.encode(e.encode_family(&[("dataset", &*d.name)])?)?;
        }
        let mut e = enc.encode_descriptor(
            "granary_dataset_lookups",
            "Samples sessions needed per dataset, by where they were found (hit: in the arena or already being read; miss: read from the source).",
            None,
            MetricType::Counter,
        )?;
        for d in datasets.iter() {
            for (result, v) in [("hit", &d.hits), ("miss", &d.misses)] {
                let v = ConstCounter::new(v.load(Ordering::Relaxed));
                v.encode(e.encode_family(&[("dataset", &*d.name), ("result", result)])?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "granary_epoch_lookups",
            "Samples needed per dataset and epoch (the most recent epochs only), by where they were found.",
            None,
            MetricType::Counter,
        )?;
        for d in datasets.iter() {
            for (epoch, c) in d.epoch_counts() {
                let epoch = epoch_label(epoch);
                for (result, v) in [("hit", c.hits), ("miss", c.misses)] {
                    ConstCounter::new(v).encode(e.encode_family(&[
                        ("dataset", &*d.name),
                        ("epoch", epoch.as_str()),
                        ("result", result),
                    ])?)?;
                }
            }
        }
        Ok(())
    }
}

impl Metrics {
    /// Every metric at zero, registered for rendering.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            samples_served: Counter::default(),
            bytes_served: Counter::default(),
            batches_served: Counter::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            reads_submitted: Counter::default(),
            read_errors: Counter::default(),
            read_retries: Counter::default(),
            relaxed_swaps: Counter::default(),
            reads_in_flight: Gauge::default(),
            bytes_read: Counter::default(),
            read_latency: SharedHistogram::default(),
            loader_wait_ns: Counter::default(),
            ranks: SharedRanks::default(),
            job: SharedJob::default(),
            arena_free: Gauge::default(),
            arena_cached: Gauge::default(),
            arena_pinned: Gauge::default(),
            arena_in_flight: Gauge::default(),
            arena_size: Gauge::default(),
            sessions_open: Gauge::default(),
            sessions_opened: Counter::default(),
            violations: Counter::default(),
            violations_by_kind: Default::default(),
            sessions_fenced: Counter::default(),
            sessions_timed_out: Counter::default(),
            connections_refused: Counter::default(),
            loaders_lost: Counter::default(),
            peers: Default::default(),
            warm_restart: Default::default(),
            datasets: Arc::default(),
            registry: Registry::default(),
        };
        for (name, help, c) in [
            (
                "granary_samples_served",
                "Samples handed to loaders.",
                &m.samples_served,
            ),
            (
                "granary_bytes_served",
                "Bytes handed to loaders.",
                &m.bytes_served,
            ),
            (
                "granary_batches_served",
                "Batches published to loaders.",
                &m.batches_served,
            ),
            (
                "granary_reads",
                "Reads submitted to the source.",
                &m.reads_submitted,
            ),
            (
                "granary_read_errors",
                "Reads that failed after retries.",
                &m.read_errors,
            ),
            ("granary_read_retries", "Reads retried.", &m.read_retries),
            (
                "granary_relaxed_swaps",
                "Samples delivered ahead of a late one (order = relaxed).",
                &m.relaxed_swaps,
            ),
            (
                "granary_read_bytes",
                "Bytes read from the source.",
                &m.bytes_read,
            ),
            (
                "granary_sessions_opened",
                "Sessions opened.",
                &m.sessions_opened,
            ),
            (
                "granary_sessions_fenced",
                "Sessions fenced after a violation.",
                &m.sessions_fenced,
            ),
            (
                "granary_sessions_timed_out",
                "Sessions ended because their loader went silent for sessions.client_timeout_ms.",
                &m.sessions_timed_out,
            ),
            (
                "granary_connections_refused",
                "Connections refused by the allowlist.",
                &m.connections_refused,
            ),
            (
                "granary_loaders_lost",
                "Loaders that disappeared with batches on loan.",
                &m.loaders_lost,
            ),
        ] {
            registry.register(name, help, c.clone());
        }
        for (name, help, g) in [
            (
                "granary_reads_in_flight",
                "Reads in flight.",
                &m.reads_in_flight,
            ),
            ("granary_arena_size_bytes", "Arena size.", &m.arena_size),
            ("granary_sessions_open", "Sessions open.", &m.sessions_open),
        ] {
            registry.register(name, help, g.clone());
        }
        registry.register(
            "granary_read_latency_seconds",
            "Source read latency.",
            m.read_latency.clone(),
        );
        m.peers.register(&mut registry);
        registry.register_collector(Box::new(WarmCollector(m.warm_restart.clone())));
        registry.register_collector(Box::new(ranks::RankCollector(m.ranks.clone())));
        registry.register_collector(Box::new(job::JobCollector(m.job.clone())));
        registry.register_collector(Box::new(Derived {
            cache: [
                ("hit", "arena", m.cache_hits.clone()),
                ("miss", "store", m.cache_misses.clone()),
            ],
            violations: m.violations_by_kind.clone(),
            loader_wait_ns: m.loader_wait_ns.clone(),
            arena: [
                ("free", m.arena_free.clone()),
                ("cached", m.arena_cached.clone()),
                ("pinned", m.arena_pinned.clone()),
                ("in_flight", m.arena_in_flight.clone()),
            ],
            datasets: Arc::clone(&m.datasets),
        }));
        Metrics { registry, ..m }
    }

    /// Names the engine's datasets, in the engine's order (index `i` of
    /// [`count_epoch`](Self::count_epoch) is the `i`-th): called once by the
    /// engine before it serves. A second call keeps the first table.
    pub(crate) fn register_datasets<'a>(
        &self,
        datasets: impl IntoIterator<Item = (&'a str, &'static str)>,
    ) {
        let table: Box<[DatasetStats]> = datasets
            .into_iter()
            .map(|(name, kind)| DatasetStats::new(name, kind))
            .collect();
        let _ = self.datasets.set(table);
    }

    fn dataset(&self, index: usize) -> Option<&DatasetStats> {
        self.datasets.get().and_then(|t| t.get(index))
    }

    /// Counts one violation of `kind` (and in the total).
    pub(crate) fn count_violation(&self, kind: ViolationKind) {
        self.violations.inc();
        self.violations_by_kind[kind.index()].inc();
    }

    /// Violations of `kind` counted so far.
    pub fn violations_of(&self, kind: ViolationKind) -> u64 {
        self.violations_by_kind[kind.index()].get()
    }

    /// Cache hit ratio so far (0 when nothing was looked up).
    #[cfg(test)]
    pub(crate) fn hit_ratio(&self) -> f64 {
        let h = self.cache_hits.get() as f64;
        let m = self.cache_misses.get() as f64;
        if h + m == 0.0 {
            0.0
        } else {
            h / (h + m)
        }
    }

    /// Adds lookups of epoch `epoch` of the engine's dataset `dataset`
    /// (its index): no lock, no allocation. Epochs from
    /// [`EPOCH_LABEL_LIMIT`] up are counted together.
    pub(crate) fn count_epoch(&self, dataset: usize, epoch: u32, hits: u64, misses: u64) {
        let Some(d) = self.dataset(dataset) else {
            return;
        };
        d.hits.fetch_add(hits, Ordering::Relaxed);
        d.misses.fetch_add(misses, Ordering::Relaxed);
        let s = d.slot(u64::from(epoch.min(EPOCH_LABEL_LIMIT)));
        s.hits.fetch_add(hits, Ordering::Relaxed);
        s.misses.fetch_add(misses, Ordering::Relaxed);
    }

    /// Updates the health of the dataset named `dataset` (a registered
    /// one; others are ignored). Cold path: a scan by name, no lock.
    pub(crate) fn dataset_health(&self, dataset: &str, update: impl FnOnce(&mut DatasetHealth)) {
        let Some(d) = self
            .datasets
            .get()
            .and_then(|t| t.iter().find(|d| &*d.name == dataset))
        else {
            return;
        };
        let mut h = d.health();
        update(&mut h);
        d.ready.store(h.ready, Ordering::Relaxed);
        d.load_attempts.store(h.load_attempts, Ordering::Relaxed);
        d.read_errors.store(h.read_errors, Ordering::Relaxed);
    }

    /// Every registered dataset's health, by name.
    pub fn dataset_healths(&self) -> BTreeMap<String, DatasetHealth> {
        self.datasets
            .get()
            .map(|t| t.iter().map(|d| (d.name.to_string(), d.health())).collect())
            .unwrap_or_default()
    }

    /// The epochs of `dataset` still in its table, in epoch order
    /// ([`EPOCH_LABEL_LIMIT`] stands for every epoch from it up).
    #[cfg(test)]
    pub(crate) fn epoch_counts(&self, dataset: &str) -> Vec<(u64, EpochCounts)> {
        self.datasets
            .get()
            .and_then(|t| t.iter().find(|d| &*d.name == dataset))
            .map(DatasetStats::epoch_counts)
            .unwrap_or_default()
    }

    /// Renders the OpenMetrics text exposition format.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// Parses Prometheus or OpenMetrics text into (series, value) pairs,
/// skipping comments and `# EOF`.
pub fn parse_text(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(series: &[(String, f64)], k: &str) -> Option<f64> {
        series.iter().find(|(n, _)| n == k).map(|(_, v)| *v)
    }

    #[test]
    fn histogram_quantiles_and_render() {
        let m = Metrics::new();
        let h = &m.read_latency;
        for _ in 0..90 {
            h.observe(Duration::from_micros(80));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(30));
        }
        h.observe(Duration::from_secs(3));
        assert_eq!(h.count(), 101);
        assert_eq!(h.quantile(0.5), Some(0.000_1));
        assert_eq!(h.quantile(0.99), Some(0.05));
        let s = parse_text(&m.render());
        assert_eq!(
            get(&s, "granary_read_latency_seconds_bucket{le=\"+Inf\"}"),
            Some(101.0)
        );
        assert_eq!(get(&s, "granary_read_latency_seconds_count"), Some(101.0));
        assert_eq!(
            get(&s, "granary_read_latency_seconds_bucket{le=\"1.0\"}"),
            Some(100.0)
        );
    }

    #[test]
    fn endpoint_serves_the_text_format_with_todays_names() {
        let m = Arc::new(Metrics::default());
        m.samples_served.inc_by(42);
        m.cache_hits.inner().store(3, Ordering::Relaxed);
        m.cache_misses.inner().store(1, Ordering::Relaxed);
        m.arena_pinned.set(4096);
        m.loader_wait_ns.inc_by(1_500_000_000);
        m.register_datasets([("a\"b", "fs"), ("remote", "s3")]);
        m.dataset_health("remote", |h| h.load_attempts += 2);
        m.dataset_health("a\"b", |h| h.ready = true);
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        let body = scrape(srv.addr(), Duration::from_secs(5)).unwrap();
        assert!(body.ends_with("# EOF\n"), "{body}");
        let s = parse_text(&body);
        assert_eq!(get(&s, "granary_samples_served_total"), Some(42.0));
        assert_eq!(
            get(
                &s,
                "granary_cache_lookups_total{result=\"hit\",tier=\"arena\"}"
            ),
            Some(3.0)
        );
        assert_eq!(
            get(&s, "granary_arena_bytes{state=\"pinned\"}"),
            Some(4096.0)
        );
        assert_eq!(get(&s, "granary_loader_wait_seconds_total"), Some(1.5));
        assert_eq!(
            get(&s, "granary_dataset_ready{dataset=\"a\\\"b\",kind=\"fs\"}"),
            Some(1.0)
        );
        assert_eq!(
            get(
                &s,
                "granary_dataset_load_attempts_total{dataset=\"remote\"}"
            ),
            Some(2.0)
        );
        assert!((m.hit_ratio() - 0.75).abs() < 1e-9);
    }

    #[test]
    fn epoch_table_is_bounded_and_keeps_the_newest_epochs() {
        let m = Metrics::new();
        m.register_datasets([("d", "fs"), ("e", "fs")]);
        // A loader's first_epoch far out, then a job going through epochs.
        m.count_epoch(0, 4_000_000_000, 1, 0);
        for epoch in 0..20u32 {
            m.count_epoch(0, epoch, 2, 1);
            m.count_epoch(0, epoch, 1, 0);
        }
        m.count_epoch(1, 7, 0, 5);
        m.count_epoch(9, 7, 0, 5); // unknown dataset: ignored
        let d = m.epoch_counts("d");
        assert_eq!(d.len(), EPOCH_SLOTS);
        let epochs: Vec<u64> = d.iter().map(|(e, _)| *e).collect();
        assert_eq!(epochs, (12..20).collect::<Vec<u64>>());
        assert!(d
            .iter()
            .all(|(_, c)| *c == EpochCounts { hits: 3, misses: 1 }));
        assert_eq!(
            m.epoch_counts("e"),
            [(7, EpochCounts { hits: 0, misses: 5 })]
        );
        let s = parse_text(&m.render());
        let epoch_series = s
            .iter()
            .filter(|(k, _)| k.starts_with("granary_epoch_lookups_total{dataset=\"d\""))
            .count();
        assert_eq!(epoch_series, 2 * EPOCH_SLOTS);
        assert!(!s.iter().any(|(k, _)| k.contains("4000000000")));
        assert_eq!(
            get(
                &s,
                "granary_dataset_lookups_total{dataset=\"d\",result=\"hit\"}"
            ),
            Some(61.0)
        );
    }

    #[test]
    fn loader_chosen_epochs_share_one_bounded_label() {
        let m = Metrics::new();
        m.register_datasets([("d", "fs")]);
        for epoch in (EPOCH_LABEL_LIMIT..u32::MAX).step_by(1 << 20) {
            m.count_epoch(0, epoch, 1, 1);
        }
        m.count_epoch(0, 3, 1, 0);
        let total = u64::from((u32::MAX - EPOCH_LABEL_LIMIT).div_ceil(1 << 20));
        assert_eq!(
            m.epoch_counts("d"),
            [
                (3, EpochCounts { hits: 1, misses: 0 }),
                (
                    u64::from(EPOCH_LABEL_LIMIT),
                    EpochCounts {
                        hits: total,
                        misses: total
                    }
                )
            ]
        );
        let s = parse_text(&m.render());
        assert_eq!(
            get(
                &s,
                "granary_epoch_lookups_total{dataset=\"d\",epoch=\"1024+\",result=\"miss\"}"
            ),
            Some(total as f64)
        );
        let series = s
            .iter()
            .filter(|(k, _)| k.starts_with("granary_epoch_lookups_total"))
            .count();
        assert_eq!(series, 4);
    }

    #[test]
    fn violations_are_counted_by_kind_and_a_replaced_view_is_none() {
        let m = Metrics::new();
        let lease = Violation::UnknownLease { seq: 1, token: 2 };
        for v in [&lease, &lease, &Violation::ViewReplaced] {
            if let Some(k) = ViolationKind::of(v) {
                m.count_violation(k);
            }
        }
        m.count_violation(ViolationKind::Handshake);
        assert_eq!(m.violations.get(), 3);
        assert_eq!(m.violations_of(ViolationKind::UnknownLease), 2);
        assert_eq!(m.violations_of(ViolationKind::Handshake), 1);
        assert_eq!(ViolationKind::of(&Violation::ViewReplaced), None);
        assert_eq!(ViolationKind::of(&Violation::Silent { ms: 1 }), None);
        // The kinds follow the segment's violation codes.
        let samples = [
            Violation::RingIndex {
                ring: "ready",
                ours: 0,
                theirs: 9,
                capacity: 4,
            },
            Violation::OutOfBounds {
                what: "sample",
                offset: 0,
                len: 1,
                limit: 0,
            },
            Violation::BadField {
                field: "state",
                value: 7,
            },
            lease,
            Violation::Misaligned {
                what: "table",
                offset: 3,
            },
        ];
        for v in &samples {
            let k = ViolationKind::of(v).expect("a loader's violation has a kind");
            assert_eq!(ViolationKind::ALL[v.code() as usize - 1], k, "{v}");
        }
        let s = parse_text(&m.render());
        assert_eq!(
            get(&s, "granary_violations_total{kind=\"unknown_lease\"}"),
            Some(2.0)
        );
        assert_eq!(
            get(&s, "granary_violations_total{kind=\"ring_index\"}"),
            Some(0.0)
        );
        let kinds = s
            .iter()
            .filter(|(k, _)| k.starts_with("granary_violations_total{"))
            .count();
        assert_eq!(kinds, ViolationKind::ALL.len());
        assert_eq!(get(&s, "granary_violations_total"), None);
    }
}
