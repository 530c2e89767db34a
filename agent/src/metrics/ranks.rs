//! The per-rank wait families ([`crate::why`]): the loaders' `next_batch`
//! waits as a histogram and as recent quantiles, the shares of the last
//! interval, the agent's stall time by cause and the verdicts.

use crate::why::{Cause, RankTable, Verdict, QUANTILES};
use granary_shm::layout::{WAIT_BUCKETS, WAIT_BUCKET_BOUNDS_US};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The table the engine records into once per interval and the endpoint
/// encodes.
#[derive(Debug, Clone, Default)]
pub struct SharedRanks(Arc<Mutex<RankTable>>);

impl SharedRanks {
    /// Runs `f` on the table (a short critical section: once a second from
    /// the engine, once per scrape from the endpoint).
    pub fn with<R>(&self, f: impl FnOnce(&mut RankTable) -> R) -> R {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut t)
    }
}

#[derive(Debug)]
pub(super) struct RankCollector(pub(super) SharedRanks);

impl Collector for RankCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let table = self.0.with(|t| t.clone());
        let rows: Vec<_> = table
            .rows()
            .map(|((d, r), row)| (d.as_str(), r.to_string(), row))
            .collect();
        let mut e = enc.encode_descriptor(
            "granary_rank_wait_seconds",
            "Time each next_batch call took, by dataset and rank, as reported by libgranary.",
            None,
            MetricType::Histogram,
        )?;
        for (d, r, row) in &rows {
            let l = &row.total.loader;
            let mut buckets = [(f64::INFINITY, 0u64); WAIT_BUCKETS];
            for (i, b) in buckets.iter_mut().enumerate() {
                let bound = WAIT_BUCKET_BOUNDS_US
                    .get(i)
                    .map_or(f64::INFINITY, |&us| us as f64 / 1e6);
                *b = (bound, l.wait_buckets[i]);
            }
            e.encode_family(&[("dataset", *d), ("rank", r.as_str())])?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                l.wait_ns as f64 / 1e9,
                l.batches,
                &buckets,
                None,
            )?;
        }
        let mut e = enc.encode_descriptor(
            "granary_rank_wait_quantile_seconds",
            "Quantiles of next_batch times over the last 10 intervals, by dataset and rank.",
            None,
            MetricType::Gauge,
        )?;
        for (d, r, row) in &rows {
            for ((_, q), v) in QUANTILES.iter().zip(row.quantiles()) {
                if let Some(v) = v {
                    ConstGauge::new(v).encode(e.encode_family(&[
                        ("dataset", *d),
                        ("rank", r.as_str()),
                        ("quantile", q),
                    ])?)?;
                }
            }
        }
        for (name, help, pick) in [
            (
                "granary_rank_wait_ratio",
                "Share of the last interval the rank's sessions spent in next_batch.",
                (|row| row.wait_ratio) as fn(&crate::why::RankRow) -> f64,
            ),
            (
                "granary_rank_busy_ratio",
                "Share of the last interval the rank's loader threads were on a CPU or runnable.",
                |row| row.busy_ratio,
            ),
        ] {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (d, r, row) in &rows {
                ConstGauge::new(pick(row))
                    .encode(e.encode_family(&[("dataset", *d), ("rank", r.as_str())])?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "granary_rank_stall_seconds",
            "Time the rank's sessions had an empty ready ring and a next batch not ready, by what it waited on.",
            None,
            MetricType::Counter,
        )?;
        for (d, r, row) in &rows {
            for c in Cause::ALL {
                ConstCounter::new(row.total.stall_ns[c as usize] as f64 / 1e9).encode(
                    e.encode_family(&[
                        ("dataset", *d),
                        ("rank", r.as_str()),
                        ("cause", c.label()),
                    ])?,
                )?;
            }
        }
        let mut e = enc.encode_descriptor(
            "granary_rank_verdict",
            "The last interval's verdict on why the rank waits (1 for the verdict, 0 for the others).",
            None,
            MetricType::Gauge,
        )?;
        for (d, r, row) in &rows {
            for v in Verdict::ALL {
                ConstGauge::new(i64::from(row.verdict == Some(v))).encode(e.encode_family(
                    &[
                        ("dataset", *d),
                        ("rank", r.as_str()),
                        ("verdict", v.label()),
                    ],
                )?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "granary_rank_verdicts",
            "Intervals by verdict, by dataset and rank.",
            None,
            MetricType::Counter,
        )?;
        for (d, r, row) in &rows {
            for v in Verdict::ALL {
                ConstCounter::new(row.verdicts[v as usize]).encode(e.encode_family(&[
                    ("dataset", *d),
                    ("rank", r.as_str()),
                    ("verdict", v.label()),
                ])?)?;
            }
        }
        Ok(())
    }
}
