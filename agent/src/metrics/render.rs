//! What a scrape reads besides the registered metrics: the labelled and
//! derived families (collected at scrape time), the warm-restart outcomes,
//! and the parser of the text the endpoint serves.

use super::dataset::{epoch_label, DatasetStats, DatasetTable};
use super::primitives::{Counter, Gauge};
use super::violations::ViolationKind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The outcomes of `granary_warm_restart_samples_total`, in the order of
/// [`Metrics::warm_restart`]: put back in the cache; dropped because the
/// bytes no longer have their CRC-32C; dropped because their dataset
/// changed (fingerprint) or is no longer served, or the sample no longer
/// has that size; dropped because their extent is no longer free or no
/// longer lies in the cache's retained or keep area (the layout changed).
pub const WARM_OUTCOMES: [&str; 4] = ["recovered", "crc", "changed", "placement"];

/// Exports [`Metrics::warm_restart`] as one labelled counter family.
#[derive(Debug)]
pub(super) struct WarmCollector(pub(super) [Counter; WARM_OUTCOMES.len()]);

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

/// The labelled and derived metrics, read at scrape time.
#[derive(Debug)]
pub(super) struct Derived {
    pub(super) cache: [(&'static str, &'static str, Counter); 2],
    pub(super) violations: [Counter; ViolationKind::ALL.len()],
    pub(super) loader_wait_ns: Counter,
    pub(super) arena: [(&'static str, Gauge); 4],
    pub(super) datasets: DatasetTable,
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
        per_dataset(
            &mut enc,
            datasets,
            "granary_dataset_load_attempts",
            "Attempts to load a dataset's catalog.",
            |d| &d.load_attempts,
        )?;
        per_dataset(
            &mut enc,
            datasets,
            "granary_dataset_read_errors",
            "Sample reads of a dataset that failed for good.",
            |d| &d.read_errors,
        )?;
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

/// Encodes the counter family `name`: one series per dataset, of the
/// counter `count` picks.
fn per_dataset(
    enc: &mut DescriptorEncoder,
    datasets: &[DatasetStats],
    name: &str,
    help: &str,
    count: fn(&DatasetStats) -> &AtomicU64,
) -> Result<(), fmt::Error> {
    let mut e = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for d in datasets {
        let v = ConstCounter::new(count(d).load(Ordering::Relaxed));
        v.encode(e.encode_family(&[("dataset", &*d.name)])?)?;
    }
    Ok(())
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
