//! The per-rank wait families ([`crate::why`]): the loaders' `next_batch`
//! waits as a histogram and as recent quantiles, the shares of the last
//! interval, the agent's stall time by cause and the verdicts.

use crate::why::{Cause, RankRow, RankTable, Verdict, QUANTILES};
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
        per_rank(
            &mut enc,
            &rows,
            (
                "granary_rank_wait_quantile_seconds",
                "Quantiles of next_batch times over the last 10 intervals, by dataset and rank.",
                MetricType::Gauge,
            ),
            "quantile",
            |row| {
                let quantiles = QUANTILES.iter().zip(row.quantiles());
                quantiles.filter_map(|(&(_, q), v)| Some((q, ConstGauge::new(v?))))
            },
        )?;
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
        per_rank(
            &mut enc,
            &rows,
            (
                "granary_rank_stall_seconds",
                "Time the rank's sessions had an empty ready ring and a next batch not ready, by what it waited on.",
                MetricType::Counter,
            ),
            "cause",
            |row| {
                Cause::ALL.map(|c| {
                    let secs = row.total.stall_ns[c as usize] as f64 / 1e9;
                    (c.label(), ConstCounter::new(secs))
                })
            },
        )?;
        per_rank(
            &mut enc,
            &rows,
            (
                "granary_rank_verdict",
                "The last interval's verdict on why the rank waits (1 for the verdict, 0 for the others).",
                MetricType::Gauge,
            ),
            "verdict",
            |row| Verdict::ALL.map(|v| (v.label(), ConstGauge::new(i64::from(row.verdict == Some(v))))),
        )?;
        per_rank(
            &mut enc,
            &rows,
            (
                "granary_rank_verdicts",
                "Intervals by verdict, by dataset and rank.",
                MetricType::Counter,
            ),
            "verdict",
            |row| Verdict::ALL.map(|v| (v.label(), ConstCounter::new(row.verdicts[v as usize]))),
        )?;
        Ok(())
    }
}

/// Encodes the family `name` of `kind`: for each rank, the series
/// `series(row)` gives, each labelled with the dataset, the rank and
/// `label` = the series' value.
fn per_rank<'a, M: EncodeMetric, S: IntoIterator<Item = (&'a str, M)>>(
    enc: &mut DescriptorEncoder,
    rows: &[(&str, String, &RankRow)],
    (name, help, kind): (&str, &str, MetricType),
    label: &str,
    series: impl Fn(&RankRow) -> S,
) -> Result<(), fmt::Error> {
    let mut e = enc.encode_descriptor(name, help, None, kind)?;
    for (d, r, row) in rows {
        for (value, metric) in series(row) {
            let labels = [("dataset", *d), ("rank", r.as_str()), (label, value)];
            metric.encode(e.encode_family(&labels)?)?;
        }
    }
    Ok(())
}
