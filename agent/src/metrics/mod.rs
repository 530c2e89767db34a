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

use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(test)]
mod dashboard_tests;
mod dataset;
mod endpoint;
mod health;
mod job;
pub mod primitives;
mod ranks;
mod render;
mod violations;

#[cfg(test)]
use dataset::EpochCounts;
pub use dataset::{DatasetHealth, EPOCH_LABEL_LIMIT, EPOCH_SLOTS};
use dataset::{DatasetStats, DatasetTable};
pub use primitives::{Counter, Gauge, Histogram, SharedHistogram};
pub use render::{parse_text, WARM_OUTCOMES};
use render::{Derived, WarmCollector};
pub use violations::ViolationKind;

pub use job::SharedJob;
pub use ranks::SharedRanks;

pub use endpoint::{
    scrape, MetricsServer, CONTENT_TYPE, MAX_CLIENTS, MAX_REQUEST_HEAD, REQUEST_DEADLINE,
};
pub use health::{Health, STALE as HEALTH_STALE};

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

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::Violation;
    use std::time::Duration;

    fn get(series: &[(String, f64)], k: &str) -> Option<f64> {
        series.iter().find(|(n, _)| n == k).map(|(_, v)| *v)
    }

    /// Checks that every `(name, value)` of `want` is in `series`.
    fn assert_series(series: &[(String, f64)], want: &[(&str, f64)]) {
        for &(k, v) in want {
            assert_eq!(get(series, k), Some(v), "{k}");
        }
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
        assert_series(
            &s,
            &[
                ("granary_read_latency_seconds_bucket{le=\"+Inf\"}", 101.0),
                ("granary_read_latency_seconds_count", 101.0),
                ("granary_read_latency_seconds_bucket{le=\"1.0\"}", 100.0),
            ],
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
        assert_series(
            &s,
            &[
                ("granary_samples_served_total", 42.0),
                (
                    "granary_cache_lookups_total{result=\"hit\",tier=\"arena\"}",
                    3.0,
                ),
                ("granary_arena_bytes{state=\"pinned\"}", 4096.0),
                ("granary_loader_wait_seconds_total", 1.5),
                ("granary_dataset_ready{dataset=\"a\\\"b\",kind=\"fs\"}", 1.0),
                (
                    "granary_dataset_load_attempts_total{dataset=\"remote\"}",
                    2.0,
                ),
            ],
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
