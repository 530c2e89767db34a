//! The job-wide families ([`crate::jobstatus`]): every rank's recent wait
//! quantiles and verdict on every node of the job (this agent's ranks and
//! those its peers report in their job status), stragglers flagged, and
//! each plan's committed step.

use crate::jobstatus::JobSnapshot;
use crate::why::{Verdict, QUANTILES};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The snapshot the engine stores once per interval and the endpoint
/// encodes.
#[derive(Debug, Clone, Default)]
pub struct SharedJob(Arc<Mutex<JobSnapshot>>);

impl SharedJob {
    /// Replaces the snapshot.
    pub fn set(&self, s: JobSnapshot) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// A copy of the snapshot.
    pub fn get(&self) -> JobSnapshot {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Debug)]
pub(super) struct JobCollector(pub(super) SharedJob);

impl Collector for JobCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snap = self.0.get();
        let ranks: Vec<_> = snap.ranks.iter().map(|r| (r, r.rank.to_string())).collect();
        let mut e = enc.encode_descriptor(
            "granary_job_rank_wait_seconds",
            "Quantiles of next_batch times over the last 10 intervals, by node, dataset and rank, for every rank of the job (peers' ranks from their job status).",
            None,
            MetricType::Gauge,
        )?;
        for (r, rank) in &ranks {
            for ((_, q), v) in QUANTILES.iter().zip(r.quantiles) {
                if let Some(v) = v {
                    ConstGauge::new(v).encode(e.encode_family(&[
                        ("node", r.node.as_str()),
                        ("dataset", r.dataset.as_str()),
                        ("rank", rank.as_str()),
                        ("quantile", q),
                    ])?)?;
                }
            }
        }
        let mut e = enc.encode_descriptor(
            "granary_job_rank_straggler",
            "1 when the rank's p95 wait is above 2 times the median rank's p95 of the dataset, over every node (and above 10 ms).",
            None,
            MetricType::Gauge,
        )?;
        for (r, rank) in &ranks {
            ConstGauge::new(i64::from(r.straggler)).encode(e.encode_family(&[
                ("node", r.node.as_str()),
                ("dataset", r.dataset.as_str()),
                ("rank", rank.as_str()),
            ])?)?;
        }
        let mut e = enc.encode_descriptor(
            "granary_job_rank_verdict",
            "The rank's last verdict on why it waits (1 for the verdict), for every rank of the job.",
            None,
            MetricType::Gauge,
        )?;
        for (r, rank) in &ranks {
            let Some(code) = r.verdict else { continue };
            let Some(v) = Verdict::ALL.get(usize::from(code)) else {
                continue;
            };
            ConstGauge::new(1).encode(e.encode_family(&[
                ("node", r.node.as_str()),
                ("dataset", r.dataset.as_str()),
                ("rank", rank.as_str()),
                ("verdict", v.label()),
            ])?)?;
        }
        let plans: Vec<_> = snap
            .plans
            .iter()
            .map(|p| {
                (
                    p,
                    p.key.seed.to_string(),
                    p.key.world_size.to_string(),
                    p.key.batch_size.to_string(),
                )
            })
            .collect();
        for (name, help, pick) in [
            (
                "granary_job_committed_epoch",
                "The epoch of the job's committed step, by plan (dataset, seed, world size, batch size).",
                (|p| p.position.epoch as i64) as fn(&crate::jobstatus::JobPlanRow) -> i64,
            ),
            (
                "granary_job_committed_step",
                "Batches of that epoch every known rank of the plan has taken (the job's committed step).",
                |p| p.position.step as i64,
            ),
            (
                "granary_job_ranks_known",
                "Ranks of the plan whose position this agent knows (its own and its peers' reports).",
                |p| i64::from(p.position.ranks),
            ),
        ] {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (p, seed, world, batch) in &plans {
                ConstGauge::new(pick(p)).encode(e.encode_family(&[
                    ("dataset", p.key.dataset.as_str()),
                    ("seed", seed.as_str()),
                    ("world_size", world.as_str()),
                    ("batch_size", batch.as_str()),
                ])?)?;
            }
        }
        Ok(())
    }
}
