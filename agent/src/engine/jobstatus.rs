//! Where the job stands ([`crate::jobstatus`]): every interval the
//! sessions' committed positions and the ranks' waits go into the job
//! table and, when they changed or `peers.status_interval_ms` passed, to
//! the peers as a job-status frame; the peers' frames come back into the
//! table; a loader's `JobQuery` is answered from it.

use super::Engine;
use crate::jobstatus::{first_batch_at, wait_row, SessionPos};
use crate::server::ConnId;
use crate::session::Session;
use granary_peer::status::{PlanKey, RankWait};
use granary_shm::handshake::{JobPosition, Message, OpenSession};
use granary_shm::ErrorCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The plan key of a session over dataset `name` with fingerprint
/// `fingerprint`.
fn plan_key(name: &str, fingerprint: u64, s: &crate::planner::PlanParams) -> PlanKey {
    PlanKey {
        dataset: name.to_string(),
        fingerprint,
        seed: s.seed,
        batch_size: s.batch_size,
        world_size: s.world_size,
        drop_last: s.drop_last,
    }
}

/// Session `s`'s place, unless its dataset has no catalog. A session of
/// the locality-aware assignment counts as its exact-order twin: its
/// batch `k` is its share of global step `k`, whose samples are the same
/// for every layout (the assignment only moves samples within a step), so
/// a position counts the same global steps in both modes and under every
/// layout of the plan.
fn session_pos(datasets: &[crate::dataset::Dataset], s: &mut Session) -> Option<SessionPos> {
    let d = datasets.get(s.dataset())?;
    if d.name.len() > granary_peer::frame::MAX_ID_LEN {
        return None;
    }
    let fingerprint = d.catalog()?.fingerprint;
    let taken = s.committed()?;
    let plan = s.plan();
    let (first_epoch, worker, workers) = plan.layout();
    Some(SessionPos {
        key: plan_key(&d.name, fingerprint, plan.params()),
        rank: plan.params().rank,
        worker,
        workers,
        first_epoch,
        per_epoch: plan.batches_per_epoch(),
        taken,
    })
}

impl Engine {
    /// Records the final position of a session that ends.
    pub(super) fn job_session_ended(&mut self, s: &mut Session) {
        if let Some(p) = session_pos(&self.datasets, s) {
            self.job.ended(&p);
        }
    }

    /// Every interval: the sessions' positions and the ranks' waits into
    /// the table, the snapshot for the metrics, the status to the peers.
    pub(super) fn job_interval(&mut self, now: Instant) {
        let datasets = &self.datasets;
        let live: Vec<SessionPos> = self
            .sessions
            .values_mut()
            .filter_map(|s| session_pos(datasets, s))
            .collect();
        self.job.record(&live);
        let waits: Vec<RankWait> = self.metrics.ranks.with(|t| {
            t.rows()
                .filter_map(|((d, r), row)| {
                    wait_row(d, *r, row.quantiles(), row.verdict.map(|v| v as u8))
                })
                .collect()
        });
        let me = match self.peers.as_ref() {
            Some(t) => t.member_id(t.me()).to_string(),
            None => self.cfg.peers.node_id.clone(),
        };
        let me = if me.is_empty() {
            "local".to_string()
        } else {
            me
        };
        let every = Duration::from_millis(self.cfg.peers.status_interval_ms);
        // A peer silent for three of its intervals (and a second) is
        // taken for gone: its waits leave the table, its positions stay.
        let stale = every * 3 + Duration::from_secs(1);
        self.metrics
            .job
            .set(self.job.snapshot(&me, &waits, now, stale));
        let Some(tier) = self.peers.as_ref() else {
            return;
        };
        let st = self.job.status(waits);
        let Some(st) = self.job.due(st, now, every) else {
            return;
        };
        let st = Arc::new(st);
        let mut sent = 0u64;
        for m in 0..tier.view().len() {
            if m != tier.me() && tier.send_job_status(m, &st) {
                sent += 1;
            }
        }
        tracing::trace!(seq = st.seq, peers = sent, "job status sent");
    }

    /// A peer's job status.
    pub(super) fn peer_job_status(
        &mut self,
        member: usize,
        status: granary_peer::status::JobStatus,
    ) {
        let Some(tier) = self.peers.as_ref() else {
            return;
        };
        let node = tier.member_id(member).to_string();
        let now = self.clock.now();
        self.job.peer_report(member, &node, status, now);
    }

    /// Answers a `JobQuery`: where the job stands in the plan the query
    /// describes, and the `first_batch` its session opens at to start
    /// there.
    /// A query in locality mode (`req.locality` set) is answered the
    /// same way: its plan has the exact plan's batches per epoch.
    pub(super) fn job_query(&mut self, conn: ConnId, req: OpenSession) {
        let Some(ds) = self.datasets.iter().position(|d| d.name == req.dataset) else {
            self.server.reply_error(
                conn,
                ErrorCode::NotFound,
                format!("no dataset named {:?} on this agent", req.dataset),
            );
            return;
        };
        let (Some(src), Some(cat)) = (self.datasets[ds].source(), self.datasets[ds].catalog())
        else {
            self.server
                .reply_error(conn, ErrorCode::Io, "dataset not loaded".to_string());
            return;
        };
        let params = crate::planner::PlanParams {
            num_samples: src.len(),
            seed: req.seed,
            rank: req.rank,
            world_size: req.world_size,
            batch_size: req.batch_size,
            drop_last: req.drop_last,
        };
        let plan = match crate::planner::SessionPlan::new(params, req.first_epoch, req.epoch_count)
            .and_then(|p| p.with_workers(req.worker, req.workers))
        {
            Ok(p) => p,
            Err(e) => {
                self.server.reply_error(
                    conn,
                    ErrorCode::InvalidArgument,
                    format!("cannot plan: {e}"),
                );
                return;
            }
        };
        let key = plan_key(&req.dataset, cat.fingerprint, &params);
        let Some(p) = self.job.position(&key, req.rank) else {
            self.server.reply_error(
                conn,
                ErrorCode::NotFound,
                format!(
                    "no agent of the job reported a rank of this plan of {:?} (seed {}, \
                     batch size {}, world size {})",
                    req.dataset, req.seed, req.batch_size, req.world_size
                ),
            );
            return;
        };
        let first_batch = first_batch_at(
            (p.epoch, p.step),
            req.first_epoch,
            req.epoch_count,
            req.worker,
            req.workers,
            plan.batches_per_epoch(),
        );
        let answer = JobPosition {
            epoch: p.epoch,
            step: p.step,
            ranks_known: p.ranks,
            nodes: p.nodes,
            first_batch,
            rank_position: p.rank,
        };
        let _ = self.server.reply(conn, &Message::JobPosition(answer), &[]);
    }
}
