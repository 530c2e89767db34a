//! Where the job stands, across its agents: each training plan's rank
//! positions and each rank's waits, this agent's own and its peers'
//! (`docs/reliability.md`, "A replacement rank"; `docs/operations.md`,
//! "Stragglers across nodes").
//!
//! **Positions.** A session's committed position is the batches its
//! loader took from its ready ring (returned by `next_batch`), counted
//! from the batch it opened at. For the rank it is a position in an epoch
//! of the rank's batches: `(epoch, step)`, `step` batches of `epoch` taken.
//! With DataLoader workers sharing a rank round robin (`worker` of
//! `workers`), the rank's step is the longest prefix of the epoch's
//! batches that its workers have all taken: `min` over the workers of
//! `taken_w * workers + w` (a worker not seen counts as having taken
//! none). A rank whose session ended keeps its last position until the
//! agent forgets it (bounded by [`MAX_PLANS`] and the frame's bounds).
//!
//! **The job's committed step** of a plan is the lowest `(epoch, step)`
//! over the ranks any agent of the job reports for it: every rank has
//! taken that many batches of that epoch. A rank reported by several
//! sources counts with its live position if one is live, else the
//! furthest.
//!
//! **Stragglers.** Per dataset, over every rank of every node with a
//! recent p95 wait: a rank is a straggler when its p95 is above
//! [`STRAGGLER_FACTOR`] times the median rank's p95 and above
//! [`STRAGGLER_FLOOR_S`].

use granary_peer::frame::MAX_BODY;
use granary_peer::status::{
    JobStatus, PlanKey, PlanStatus, RankPosition, RankWait, MAX_STATUS_PLANS, MAX_STATUS_POSITIONS,
    MAX_STATUS_WAITS, NO_QUANTILE, NO_VERDICT,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most plans this agent tracks (its own).
pub const MAX_PLANS: usize = MAX_STATUS_PLANS;

/// A rank whose p95 wait is above this many times the median rank's p95
/// (of the same dataset, over every node) is a straggler.
pub const STRAGGLER_FACTOR: f64 = 2.0;

/// ... and above this many seconds (so that ranks that hardly wait are
/// never stragglers).
pub const STRAGGLER_FLOOR_S: f64 = 0.010;

/// One session's place, as the engine reads it each interval.
#[derive(Debug, Clone)]
pub(crate) struct SessionPos {
    pub key: PlanKey,
    pub rank: u32,
    pub worker: u32,
    pub workers: u32,
    pub first_epoch: u32,
    /// The session's batches per epoch (its worker's part).
    pub per_epoch: u64,
    /// Batches taken, counted across the session's epochs from its first.
    pub taken: u64,
}

impl SessionPos {
    /// `(epoch, bound)`: the rank's batches of `epoch` before `bound` that
    /// this worker is responsible for are taken. `None` for a worker with
    /// no batches.
    fn worker_position(&self) -> Option<(u32, u64)> {
        if self.per_epoch == 0 {
            return None;
        }
        let off = self.taken / self.per_epoch;
        let t = self.taken % self.per_epoch;
        let epoch = u32::try_from(u64::from(self.first_epoch) + off).unwrap_or(u32::MAX);
        Some((
            epoch,
            t * u64::from(self.workers.max(1)) + u64::from(self.worker),
        ))
    }
}

/// One rank's workers as last seen here.
#[derive(Debug, Clone, Default)]
struct RankEntry {
    workers: u32,
    by_worker: BTreeMap<u32, (u32, u64)>,
    live: bool,
}

impl RankEntry {
    fn position(&self) -> Option<(u32, u64)> {
        let first = self.by_worker.values().map(|p| p.0).min()?;
        (0..self.workers.max(1))
            .map(|w| {
                self.by_worker
                    .get(&w)
                    .copied()
                    .unwrap_or((first, u64::from(w)))
            })
            .min()
    }
}

#[derive(Debug, Clone, Default)]
struct LocalPlan {
    ranks: BTreeMap<u32, RankEntry>,
    /// The interval it last had a live session.
    live_at: u64,
}

impl LocalPlan {
    /// The positions of its ranks that have one.
    fn positions(&self) -> Vec<RankPosition> {
        self.ranks
            .iter()
            .filter_map(|(&rank, e)| {
                let (epoch, step) = e.position()?;
                Some(RankPosition {
                    rank,
                    epoch,
                    step,
                    live: e.live,
                })
            })
            .collect()
    }
}

/// A peer's last status.
#[derive(Debug, Clone)]
struct Report {
    node: String,
    status: Arc<JobStatus>,
    at: Instant,
}

/// The job's position of one plan, as this agent knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPosition {
    /// The epoch of the job's committed step.
    pub epoch: u32,
    /// Batches of that epoch every known rank has taken.
    pub step: u64,
    /// Ranks known (of the plan's world size).
    pub ranks: u32,
    /// Agents whose reports (this one's included) named a rank of it.
    pub nodes: u32,
    /// The asked rank's own position, when known.
    pub rank: Option<(u32, u64)>,
}

/// A rank's waits on some node, for the metrics and `granary status --why`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRankRow {
    pub node: String,
    pub dataset: String,
    pub rank: u32,
    /// p50, p95, p99 in seconds.
    pub quantiles: [Option<f64>; 3],
    pub verdict: Option<u8>,
    pub straggler: bool,
}

/// Every plan's job position, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPlanRow {
    pub key: PlanKey,
    pub position: JobPosition,
}

/// What the metrics show of the job ([`crate::metrics`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSnapshot {
    pub ranks: Vec<JobRankRow>,
    pub plans: Vec<JobPlanRow>,
}

/// This agent's and its peers' positions and waits.
#[derive(Debug, Default)]
pub(crate) struct JobTable {
    local: BTreeMap<PlanKey, LocalPlan>,
    /// By member index.
    peers: BTreeMap<usize, Report>,
    tick: u64,
    seq: u64,
    /// The last status sent (without its `seq`) and when.
    last_sent: Option<(JobStatus, Instant)>,
}

impl JobTable {
    /// Records one interval's live sessions. Ranks without a live session
    /// keep their last position.
    pub(crate) fn record(&mut self, sessions: &[SessionPos]) {
        self.tick += 1;
        for p in self.local.values_mut() {
            for r in p.ranks.values_mut() {
                r.live = false;
            }
        }
        // Several live sessions of one worker (a replacement beside one
        // not yet timed out): the furthest.
        type Worker<'a> = (&'a PlanKey, u32, u32);
        let mut live: BTreeMap<Worker<'_>, (&SessionPos, (u32, u64))> = BTreeMap::new();
        for s in sessions {
            let Some(pos) = s.worker_position() else {
                continue;
            };
            let e = live.entry((&s.key, s.rank, s.worker)).or_insert((s, pos));
            if pos > e.1 {
                *e = (s, pos);
            }
        }
        for ((key, rank, worker), (s, pos)) in live {
            self.put(key, rank, worker, s.workers, pos, true);
        }
    }

    /// Records the final position of a session that ended.
    pub(crate) fn ended(&mut self, s: &SessionPos) {
        if let Some(pos) = s.worker_position() {
            self.put(&s.key, s.rank, s.worker, s.workers, pos, false);
        }
    }

    fn put(
        &mut self,
        key: &PlanKey,
        rank: u32,
        worker: u32,
        workers: u32,
        pos: (u32, u64),
        live: bool,
    ) {
        if !self.local.contains_key(key) && !self.make_room() {
            return;
        }
        let positions: usize = self.local.values().map(|p| p.ranks.len()).sum();
        let tick = self.tick;
        let plan = self.local.entry(key.clone()).or_default();
        if !plan.ranks.contains_key(&rank) && positions >= MAX_STATUS_POSITIONS {
            return;
        }
        if live {
            plan.live_at = tick;
        }
        let e = plan.ranks.entry(rank).or_default();
        if e.workers != workers {
            e.by_worker.clear();
            e.workers = workers;
        }
        if e.by_worker.len() < MAX_STATUS_POSITIONS || e.by_worker.contains_key(&worker) {
            e.by_worker.insert(worker, pos);
        }
        e.live |= live;
    }

    /// Room for one more plan: drops the one live longest ago when full.
    fn make_room(&mut self) -> bool {
        if self.local.len() < MAX_PLANS {
            return true;
        }
        let oldest = self
            .local
            .iter()
            .filter(|(_, p)| p.live_at < self.tick)
            .min_by_key(|(_, p)| p.live_at)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => {
                self.local.remove(&k);
                true
            }
            None => false,
        }
    }

    /// Takes a peer's status (the connection already dropped stale ones).
    pub(crate) fn peer_report(
        &mut self,
        member: usize,
        node: &str,
        status: JobStatus,
        now: Instant,
    ) {
        self.peers.insert(
            member,
            Report {
                node: node.to_string(),
                status: Arc::new(status),
                at: now,
            },
        );
    }

    /// Forgets every peer's status (a new view: members are renumbered).
    pub(crate) fn forget_peers(&mut self) {
        self.peers.clear();
    }

    /// This agent's status: its plans and `waits`, within the frame's
    /// bounds (what does not fit is left out).
    pub(crate) fn status(&self, waits: Vec<RankWait>) -> JobStatus {
        let mut st = JobStatus::default();
        let mut room = MAX_BODY as usize - JobStatus::default().body_len();
        let mut positions = 0;
        for (key, plan) in &self.local {
            let ps = plan.positions();
            let len = JobStatus::plan_len(key.dataset.len(), ps.len());
            if ps.is_empty()
                || len > room
                || st.plans.len() >= MAX_STATUS_PLANS
                || positions + ps.len() > MAX_STATUS_POSITIONS
            {
                continue;
            }
            room -= len;
            positions += ps.len();
            st.plans.push(PlanStatus {
                key: key.clone(),
                positions: ps,
            });
        }
        for w in waits {
            let len = JobStatus::wait_len(w.dataset.len());
            if len > room || st.waits.len() >= MAX_STATUS_WAITS {
                break;
            }
            room -= len;
            st.waits.push(w);
        }
        st
    }

    /// The status to send now, if any: when it changed since the last one
    /// sent, or `every` passed. Empty statuses are not sent.
    pub(crate) fn due(
        &mut self,
        st: JobStatus,
        now: Instant,
        every: Duration,
    ) -> Option<JobStatus> {
        if st.plans.is_empty() && st.waits.is_empty() {
            return None;
        }
        if let Some((last, at)) = &self.last_sent {
            if *last == st && now.saturating_duration_since(*at) < every {
                return None;
            }
        }
        self.seq += 1;
        self.last_sent = Some((st.clone(), now));
        Some(JobStatus {
            seq: self.seq,
            ..st
        })
    }

    /// Every source's positions of plan `key`: this agent's, then each
    /// peer's, as (node index, positions).
    fn positions_of(&self, key: &PlanKey) -> Vec<(usize, Vec<RankPosition>)> {
        let mut out = Vec::new();
        if let Some(plan) = self.local.get(key) {
            let ps = plan.positions();
            out.push((usize::MAX, ps));
        }
        for (&m, r) in &self.peers {
            for p in &r.status.plans {
                if &p.key == key {
                    out.push((m, p.positions.clone()));
                }
            }
        }
        out
    }

    /// Where the job stands in plan `key`, and rank `rank` in it; `None`
    /// when no agent reported a rank of it.
    pub(crate) fn position(&self, key: &PlanKey, rank: u32) -> Option<JobPosition> {
        let mut best: BTreeMap<u32, RankPosition> = BTreeMap::new();
        let mut nodes = 0;
        for (_, ps) in self.positions_of(key) {
            if !ps.is_empty() {
                nodes += 1;
            }
            for p in ps {
                let e = best.entry(p.rank).or_insert(p);
                if (p.live, p.epoch, p.step) > (e.live, e.epoch, e.step) {
                    *e = p;
                }
            }
        }
        let (epoch, step) = best.values().map(|p| (p.epoch, p.step)).min()?;
        Some(JobPosition {
            epoch,
            step,
            ranks: best.len() as u32,
            nodes,
            rank: best.get(&rank).map(|p| (p.epoch, p.step)),
        })
    }

    /// What the metrics show: `local` waits of this node named `me`, the
    /// waits of peers heard from within `stale` of `now`, stragglers
    /// flagged; every plan's job position (a silent peer's positions
    /// count: its ranks may be the ones being replaced).
    pub(crate) fn snapshot(
        &self,
        me: &str,
        local: &[RankWait],
        now: Instant,
        stale: Duration,
    ) -> JobSnapshot {
        let mut ranks: Vec<JobRankRow> = local.iter().map(|w| row(me, w)).collect();
        for r in self.peers.values() {
            if now.saturating_duration_since(r.at) <= stale {
                ranks.extend(r.status.waits.iter().map(|w| row(&r.node, w)));
            }
        }
        flag_stragglers(&mut ranks);
        let mut keys: Vec<&PlanKey> = self.local.keys().collect();
        for r in self.peers.values() {
            keys.extend(r.status.plans.iter().map(|p| &p.key));
        }
        keys.sort();
        keys.dedup();
        let plans = keys
            .into_iter()
            .filter_map(|k| {
                Some(JobPlanRow {
                    key: k.clone(),
                    position: self.position(k, u32::MAX)?,
                })
            })
            .collect();
        JobSnapshot { ranks, plans }
    }
}

fn secs(us: u32) -> Option<f64> {
    (us != NO_QUANTILE).then(|| f64::from(us) / 1e6)
}

fn row(node: &str, w: &RankWait) -> JobRankRow {
    JobRankRow {
        node: node.to_string(),
        dataset: w.dataset.clone(),
        rank: w.rank,
        quantiles: w.quantiles_us.map(secs),
        verdict: (w.verdict != NO_VERDICT).then_some(w.verdict),
        straggler: false,
    }
}

/// Flags the stragglers among `rows` (see the module documentation).
pub(crate) fn flag_stragglers(rows: &mut [JobRankRow]) {
    let mut by_dataset: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rows.iter() {
        if let Some(p95) = r.quantiles[1] {
            by_dataset.entry(r.dataset.clone()).or_default().push(p95);
        }
    }
    for r in rows.iter_mut() {
        let (Some(p95), Some(all)) = (r.quantiles[1], by_dataset.get_mut(&r.dataset)) else {
            continue;
        };
        if all.len() < 2 {
            continue;
        }
        all.sort_by(f64::total_cmp);
        // The lower median: with two ranks, the faster one.
        let median = all[(all.len() - 1) / 2];
        r.straggler = p95 > STRAGGLER_FLOOR_S && p95 > STRAGGLER_FACTOR * median;
    }
}

/// A wait row of this agent's rank table, for the status frame.
pub(crate) fn wait_row(
    dataset: &str,
    rank: u32,
    quantiles: [Option<f64>; 3],
    verdict: Option<u8>,
) -> Option<RankWait> {
    if dataset.is_empty() || dataset.len() > granary_peer::frame::MAX_ID_LEN {
        return None;
    }
    Some(RankWait {
        dataset: dataset.to_string(),
        rank,
        quantiles_us: quantiles.map(|q| {
            q.map_or(NO_QUANTILE, |s| {
                ((s * 1e6).round() as u64).min(u64::from(NO_QUANTILE - 1)) as u32
            })
        }),
        verdict: verdict.unwrap_or(NO_VERDICT),
    })
}

/// The batch a session with these options opens at to start at the job's
/// position `(epoch, step)`: the session's batches before it, counted
/// across its epochs from `first_epoch` (clamped to the session's end).
pub(crate) fn first_batch_at(
    (epoch, step): (u32, u64),
    first_epoch: u32,
    epoch_count: u32,
    worker: u32,
    workers: u32,
    per_epoch: u64,
) -> u64 {
    if epoch < first_epoch {
        return 0;
    }
    let off = u64::from(epoch - first_epoch);
    if off >= u64::from(epoch_count) {
        return u64::from(epoch_count) * per_epoch;
    }
    let (w, ws) = (u64::from(worker), u64::from(workers.max(1)));
    let before = if step > w { (step - w).div_ceil(ws) } else { 0 };
    off * per_epoch + before.min(per_epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(world: u32) -> PlanKey {
        PlanKey {
            dataset: "d".into(),
            fingerprint: 7,
            seed: 1,
            batch_size: 4,
            world_size: world,
            drop_last: false,
        }
    }

    fn pos(rank: u32, worker: u32, workers: u32, per_epoch: u64, taken: u64) -> SessionPos {
        SessionPos {
            key: key(4),
            rank,
            worker,
            workers,
            first_epoch: 0,
            per_epoch,
            taken,
        }
    }

    #[test]
    fn a_rank_of_several_workers_stands_at_their_common_prefix() {
        // 10 batches per epoch, 3 workers: worker 0 has batches 0,3,6,9
        // (4), worker 1 has 1,4,7 (3), worker 2 has 2,5,8 (3).
        let mut t = JobTable::default();
        t.record(&[pos(0, 0, 3, 4, 2), pos(0, 1, 3, 3, 2), pos(0, 2, 3, 3, 1)]);
        // Taken: 0,3 / 1,4 / 2: the prefix is batches 0..5.
        assert_eq!(t.position(&key(4), 0).unwrap().rank, Some((0, 5)));
        // Worker 2 not seen: it counts as having taken none.
        let mut t = JobTable::default();
        t.record(&[pos(0, 0, 3, 4, 2), pos(0, 1, 3, 3, 2)]);
        assert_eq!(t.position(&key(4), 0).unwrap().step, 2);
        // Into the next epoch: (1, 0) once every worker took its last.
        let mut t = JobTable::default();
        t.record(&[pos(0, 0, 1, 10, 10)]);
        assert_eq!(t.position(&key(4), 0).unwrap().rank, Some((1, 0)));
    }

    #[test]
    fn the_job_stands_at_its_slowest_rank_and_ended_ranks_are_kept() {
        let mut t = JobTable::default();
        t.record(&[pos(0, 0, 1, 10, 7), pos(1, 0, 1, 10, 4)]);
        t.ended(&pos(1, 0, 1, 10, 5));
        t.record(&[pos(0, 0, 1, 10, 8)]);
        let p = t.position(&key(4), 1).unwrap();
        assert_eq!((p.epoch, p.step, p.ranks, p.nodes), (0, 5, 2, 1));
        assert_eq!(p.rank, Some((0, 5)));
        // A peer's report of ranks 2 and 3 joins in; rank 3 is behind.
        let mut peer = t.status(Vec::new());
        peer.plans[0].positions = vec![
            RankPosition {
                rank: 2,
                epoch: 0,
                step: 9,
                live: true,
            },
            RankPosition {
                rank: 3,
                epoch: 0,
                step: 3,
                live: true,
            },
        ];
        t.peer_report(1, "b", peer, Instant::now());
        let p = t.position(&key(4), 2).unwrap();
        assert_eq!((p.step, p.ranks, p.nodes, p.rank), (3, 4, 2, Some((0, 9))));
        assert!(t.position(&key(8), 0).is_none(), "another plan");
    }

    #[test]
    fn memory_is_bounded() {
        let mut t = JobTable::default();
        // Far more plans than kept, each live once: the oldest go.
        for i in 0..(MAX_PLANS as u64 * 3) {
            let mut s = pos(0, 0, 1, 10, 1);
            s.key.seed = i;
            t.record(&[s]);
        }
        assert_eq!(t.local.len(), MAX_PLANS);
        // Far more ranks than a frame carries.
        let mut t = JobTable::default();
        let mut many = Vec::new();
        for r in 0..3000 {
            let mut s = pos(r, 0, 1, 10, 1);
            s.key.world_size = 4000;
            many.push(s);
        }
        t.record(&many);
        let n: usize = t.local.values().map(|p| p.ranks.len()).sum();
        assert_eq!(n, MAX_STATUS_POSITIONS);
        // The status always fits one frame.
        let waits = (0..5000)
            .map(|r| wait_row(&"x".repeat(200), r, [Some(0.1); 3], Some(3)).unwrap())
            .collect();
        let st = t.status(waits);
        let bytes = granary_peer::frame::Frame::JobStatus(st.clone())
            .to_bytes()
            .unwrap();
        assert!(bytes.len() <= MAX_BODY as usize + granary_peer::frame::HEADER_LEN);
        assert!(!st.waits.is_empty() && st.waits.len() < 5000);
    }

    #[test]
    fn status_goes_out_on_change_or_after_the_interval() {
        let mut t = JobTable::default();
        let now = Instant::now();
        let every = Duration::from_secs(5);
        assert!(t.due(t.status(Vec::new()), now, every).is_none(), "empty");
        t.record(&[pos(0, 0, 1, 10, 1)]);
        let a = t.due(t.status(Vec::new()), now, every).unwrap();
        assert!(t.due(t.status(Vec::new()), now, every).is_none(), "same");
        t.record(&[pos(0, 0, 1, 10, 2)]);
        let b = t.due(t.status(Vec::new()), now, every).unwrap();
        assert!(b.seq > a.seq);
        let later = now + every;
        assert!(t.due(t.status(Vec::new()), later, every).is_some());
    }

    #[test]
    fn stragglers_are_ranks_far_above_the_median() {
        let r = |node: &str, rank, p95| JobRankRow {
            node: node.into(),
            dataset: "d".into(),
            rank,
            quantiles: [Some(0.001), Some(p95), Some(p95)],
            verdict: None,
            straggler: false,
        };
        let mut rows = vec![
            r("a", 0, 0.020),
            r("a", 1, 0.025),
            r("b", 2, 0.022),
            r("b", 3, 0.120),
        ];
        flag_stragglers(&mut rows);
        let flagged: Vec<u32> = rows
            .iter()
            .filter(|x| x.straggler)
            .map(|x| x.rank)
            .collect();
        assert_eq!(flagged, [3]);
        // Below the floor nobody is a straggler.
        let mut rows = vec![r("a", 0, 0.0001), r("b", 1, 0.005)];
        flag_stragglers(&mut rows);
        assert!(rows.iter().all(|x| !x.straggler));
    }

    #[test]
    fn the_first_batch_of_a_replacement() {
        // 10 batches per epoch, one worker: epoch 1, step 4 from epoch 0.
        assert_eq!(first_batch_at((1, 4), 0, 3, 0, 1, 10), 14);
        // Opened from epoch 1: step 4.
        assert_eq!(first_batch_at((1, 4), 1, 1, 0, 1, 10), 4);
        // Worker 1 of 3 (batches 1, 4, 7): before step 5 it took 1 and 4.
        assert_eq!(first_batch_at((0, 5), 0, 1, 1, 3, 3), 2);
        assert_eq!(first_batch_at((0, 1), 0, 1, 1, 3, 3), 0);
        // Before the session's epochs, and past them.
        assert_eq!(first_batch_at((0, 4), 2, 1, 0, 1, 10), 0);
        assert_eq!(first_batch_at((5, 4), 0, 2, 0, 1, 10), 20);
    }
}
