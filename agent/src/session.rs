//! One loader session as the agent sees it: its plan (the known future), its
//! window of batches being prepared, its rings, and the batches on loan.

use crate::planner::{EpochPlan, PlanError, PlanParams};
use crate::server::ConnId;
use granary_shm::lease::LeaseTable;
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::AgentSegment;
use granary_shm::{BatchDescriptor, ReleaseDescriptor};
use std::collections::VecDeque;

/// A batch being prepared: its samples (dataset indices) in delivery order.
#[derive(Debug)]
pub struct PendingBatch {
    /// Epoch.
    pub epoch: u32,
    /// Index within the epoch for this rank.
    pub index: u64,
    /// Sample indices.
    pub samples: Vec<u64>,
    /// How many leading samples have been looked up / requested already.
    pub requested: usize,
    /// For each requested sample: whether this batch holds a cache pin on it.
    pub pinned: Vec<bool>,
    /// Last batch of its epoch.
    pub last_of_epoch: bool,
}

/// What a lent batch holds on to until the loader releases it.
#[derive(Debug)]
pub struct Loan {
    /// Cache keys pinned by this batch (dataset-local sample indices).
    pub pinned: Vec<u64>,
    /// Arena extent of the sample table.
    pub table: Option<crate::extent::Extent>,
}

/// A session.
pub struct Session {
    /// Session id.
    pub id: u64,
    /// Owning connection.
    pub conn: ConnId,
    /// Index of the dataset in the engine's table.
    pub dataset: usize,
    /// Plan parameters.
    pub params: PlanParams,
    /// First epoch.
    pub first_epoch: u32,
    /// One past the last epoch.
    pub end_epoch: u32,
    /// Batches per epoch for this rank.
    pub batches_per_epoch: u64,
    /// The agent's side of the ring segment.
    pub segment: AgentSegment,
    /// Ready ring (agent produces).
    pub ready: Producer<BatchDescriptor>,
    /// Release ring (agent consumes).
    pub release: Consumer<ReleaseDescriptor>,
    /// Batches on loan.
    pub leases: LeaseTable<Loan>,
    /// Batches planned and being prepared, in delivery order.
    pub pending: VecDeque<PendingBatch>,
    /// Current window (slow start grows it up to the configured maximum).
    pub window: u32,
    /// Next descriptor sequence number.
    pub next_seq: u64,
    /// Plan of the epoch being expanded into `pending`.
    plan: Option<EpochPlan>,
    /// Next batch index to expand within `plan`.
    next_index: u64,
    /// True once every batch has been planned.
    pub planned_all: bool,
    /// True once END_OF_STREAM was published.
    pub ended: bool,
}

impl Session {
    /// Builds a session over its segment endpoints.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        conn: ConnId,
        dataset: usize,
        params: PlanParams,
        first_epoch: u32,
        epoch_count: u32,
        mut segment: AgentSegment,
        lease_key: u64,
        initial_window: u32,
    ) -> Result<Session, PlanError> {
        params.validate()?;
        let batches_per_epoch = crate::planner::batches_per_epoch(&params)?;
        let (ready, release) = segment
            .take_endpoints()
            .expect("a fresh segment has its endpoints");
        Ok(Session {
            id,
            conn,
            dataset,
            params,
            first_epoch,
            end_epoch: first_epoch.saturating_add(epoch_count),
            batches_per_epoch,
            segment,
            ready,
            release,
            leases: LeaseTable::new(lease_key),
            pending: VecDeque::new(),
            window: initial_window.max(1),
            next_seq: 0,
            plan: None,
            next_index: 0,
            planned_all: false,
            ended: false,
        })
    }

    /// Plans batches until `pending` and the `published` batches the loader
    /// has not taken yet hold `window` batches together (or the plan ends):
    /// both are ahead of the loader, and a full ready ring must not stretch
    /// the window (its samples stay pinned until released).
    pub fn plan_ahead(&mut self, published: usize) -> Result<(), PlanError> {
        while !self.planned_all
            && self.pending.len().saturating_add(published) < self.window as usize
        {
            let epoch = match &self.plan {
                Some(p) if self.next_index < p.num_batches() => p.epoch(),
                Some(p) => {
                    let next = p.epoch() + 1;
                    if next >= self.end_epoch {
                        self.planned_all = true;
                        self.plan = None;
                        break;
                    }
                    self.plan = Some(EpochPlan::new(&self.params, next)?);
                    self.next_index = 0;
                    next
                }
                None => {
                    if self.first_epoch >= self.end_epoch {
                        self.planned_all = true;
                        break;
                    }
                    self.plan = Some(EpochPlan::new(&self.params, self.first_epoch)?);
                    self.next_index = 0;
                    self.first_epoch
                }
            };
            let plan = self.plan.as_ref().expect("set above");
            let Some(samples) = plan.batch(self.next_index) else {
                // An epoch with no batches for this rank (tiny dataset): move on.
                self.next_index = plan.num_batches();
                continue;
            };
            let last = self.next_index + 1 == plan.num_batches();
            self.pending.push_back(PendingBatch {
                epoch,
                index: self.next_index,
                samples: samples.to_vec(),
                requested: 0,
                pinned: Vec::with_capacity(samples.len()),
                last_of_epoch: last,
            });
            self.next_index += 1;
        }
        Ok(())
    }
}
