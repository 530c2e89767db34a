//! The metric types the engine updates without locks or allocations: a
//! counter, a gauge and the read-latency histogram. A leaf: the agent's
//! other metrics (and the peer tier's) are built from these.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use prometheus_client::metrics::counter::Counter;

/// A gauge of non-negative integers (bytes, counts).
pub type Gauge = prometheus_client::metrics::gauge::Gauge<u64, AtomicU64>;

/// Upper bounds (seconds) of the read-latency histogram buckets.
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

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
