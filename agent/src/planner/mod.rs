//! The planner: the exact sample order of every epoch of a session.
//!
//! Given a dataset of `num_samples` samples, a shuffle seed and an epoch, the
//! planner derives a permutation of all samples, shards it across ranks with
//! the semantics of PyTorch's `torch.utils.data.DistributedSampler`
//! (`shuffle=True`; padding by wrapping around, or truncation with
//! `drop_last`), and cuts the rank's share into batches. Because the order is
//! a pure function of the parameters, the agent knows every loader's future
//! and users can compute the same order themselves: `docs/planner.md`
//! specifies the algorithm and `agent/tests/planner_reference.py` reproduces
//! it bit for bit.
//!
//! The algorithm, in short:
//!
//! 1. **Stream key.** `key = mix64(mix64(seed ^ TAG) + epoch * GAMMA)`
//!    (wrapping 64-bit arithmetic), where `mix64` is the SplitMix64
//!    finalizer, [`ALGORITHM_TAG`] is ASCII `granary1` and `GAMMA` is
//!    `0x9E3779B97F4A7C15`.
//! 2. **Generator.** SplitMix64 started at `key`: each draw adds `GAMMA` to
//!    the state and returns `mix64(state)`.
//! 3. **Bounded draw.** A uniform integer in `0..s` by Lemire's
//!    multiply-shift with rejection.
//! 4. **Shuffle.** Start from `[0, 1, …, n-1]`; for `i` from `n-1` down to
//!    `1`, draw `j` in `0..=i` and swap positions `i` and `j`.
//! 5. **Shard.** As `DistributedSampler`: the permutation is padded
//!    cyclically to `ceil(n/ws)*ws` entries (or truncated to
//!    `floor(n/ws)*ws` with `drop_last`) and rank `r` takes entries
//!    `r, r+ws, r+2ws, …`.
//! 6. **Batch.** The share is cut into consecutive batches of `batch_size`;
//!    the last one is short, or dropped with `drop_last`.

#[cfg(test)]
mod continuation_tests;
pub(crate) mod params;
pub(crate) mod permutation;
pub(crate) mod placement;
#[cfg(test)]
mod tests;

pub(crate) use params::samples_per_rank;
use params::{batch_count, share_len};
pub use params::{batches_per_epoch, PlanError, PlanParams, MAX_SAMPLES};
pub(crate) use permutation::mix64;
pub use permutation::{epoch_permutation, stream_key, ALGORITHM_TAG};
pub(crate) use placement::Placement;

use crate::mixture::MixtureOrder;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// The samples rank `params.rank` receives in `epoch`, in order, exactly as
/// `DistributedSampler.__iter__` would list them with this planner's
/// permutation in place of `torch.randperm`.
///
/// Entry `k` is `perm[(rank + k * world_size) % n]` for `k` in
/// `0..samples_per_rank`: the permutation padded by wrapping around (as
/// often as needed when `world_size > n`), or truncated with `drop_last`,
/// then strided by `world_size` from `rank`.
///
/// # Errors
///
/// Any error of [`PlanParams::validate`], or [`PlanError::OutOfMemory`].
#[cfg(test)]
pub(crate) fn rank_share(params: &PlanParams, epoch: u32) -> Result<Vec<u64>, PlanError> {
    params.validate()?;
    let perm = epoch_permutation(params.seed, epoch, params.num_samples)?;
    Ok(stride(params, &perm, share_len(params)))
}

/// Entries `perm[(rank + k * ws) % n]` for `k` in `0..count`.
fn stride(params: &PlanParams, perm: &[u64], count: u64) -> Vec<u64> {
    let n = perm.len();
    let ws = params.world_size as usize;
    let mut pos = params.rank as usize % n;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        out.push(perm[pos]);
        pos = (pos + ws) % n;
    }
    out
}

/// One rank's batches for one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    params: PlanParams,
    epoch: u32,
    /// The delivered samples in order: the rank share, without the dropped
    /// partial batch when `drop_last` (in locality mode: what the
    /// assignment gives the rank, step by step).
    samples: Vec<u64>,
    /// Per batch, `[local, peer, uncached]` counts (empty without a
    /// placement).
    placed: Vec<[u32; 3]>,
}

impl EpochPlan {
    /// Plans `epoch` for the rank described by `params`.
    ///
    /// # Errors
    ///
    /// Any error of `PlanParams::validate`, or [`PlanError::OutOfMemory`].
    pub fn new(params: &PlanParams, epoch: u32) -> Result<Self, PlanError> {
        EpochPlan::with_placement(params, epoch, None)
    }

    /// Plans `epoch` as [`EpochPlan::new`] does, or in locality mode when
    /// `placement` has a layout, counting placements when it is given.
    pub(crate) fn with_placement(
        params: &PlanParams,
        epoch: u32,
        placement: Option<&Placement>,
    ) -> Result<Self, PlanError> {
        EpochPlan::build(params, epoch, placement, None)
    }

    /// [`EpochPlan::with_placement`], dealing a mixture's epoch
    /// ([`MixtureOrder::sequence`]) in place of the permutation when
    /// `mixture` is given.
    fn build(
        params: &PlanParams,
        epoch: u32,
        placement: Option<&Placement>,
        mixture: Option<&MixtureOrder>,
    ) -> Result<Self, PlanError> {
        params.validate()?;
        let delivered = batch_count(params)
            .saturating_mul(u64::from(params.batch_size))
            .min(share_len(params));
        let samples = if delivered == 0 {
            Vec::new()
        } else {
            let perm = match mixture {
                Some(m) => m.sequence(params.seed, epoch, params.world_size, params.batch_size)?,
                None => epoch_permutation(params.seed, epoch, params.num_samples)?,
            };
            match placement.and_then(|p| p.locality_order(params, &perm)) {
                Some(order) => order?,
                None => stride(params, &perm, delivered),
            }
        };
        if samples.len() as u64 != delivered {
            return Err(PlanError::Assignment(format!(
                "{} samples assigned to rank {}, {delivered} expected",
                samples.len(),
                params.rank
            )));
        }
        let placed = placement.map_or_else(Vec::new, |p| {
            samples
                .chunks(params.batch_size as usize)
                .map(|b| p.classify(b))
                .collect()
        });
        Ok(EpochPlan {
            params: *params,
            epoch,
            samples,
            placed,
        })
    }

    /// Only batches `worker`, `worker + workers`, `worker + 2 * workers`,
    /// … of this plan, in order: one DataLoader worker's part of its
    /// rank's batches (`SessionPlan::with_workers`).
    fn strided(self, worker: u32, workers: u32) -> EpochPlan {
        if workers <= 1 {
            return self;
        }
        let bs = self.params.batch_size as usize;
        let (w, ws) = (worker as usize, workers as usize);
        let mut samples = Vec::with_capacity(self.samples.len() / ws + bs);
        let mut placed = Vec::new();
        for (i, batch) in self.samples.chunks(bs).enumerate() {
            if i % ws == w {
                samples.extend_from_slice(batch);
                if let Some(p) = self.placed.get(i) {
                    placed.push(*p);
                }
            }
        }
        EpochPlan {
            params: self.params,
            epoch: self.epoch,
            samples,
            placed,
        }
    }

    /// The parameters this plan was made from.
    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// The epoch this plan covers.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Every delivered sample of the epoch, in delivery order (the
    /// concatenation of all batches).
    pub fn samples(&self) -> &[u64] {
        &self.samples
    }

    /// Batch `index`'s `[local, peer, uncached]` counts, when the plan
    /// counts placements.
    pub(crate) fn placed(&self, index: u64) -> Option<[u32; 3]> {
        self.placed.get(usize::try_from(index).ok()?).copied()
    }

    /// The number of batches; equals [`batches_per_epoch`].
    pub(crate) fn num_batches(&self) -> u64 {
        (self.samples.len() as u64).div_ceil(u64::from(self.params.batch_size))
    }

    /// Batch `index` (counted from 0), or `None` past the last batch.
    pub fn batch(&self, index: u64) -> Option<&[u64]> {
        let b = u64::from(self.params.batch_size);
        let len = self.samples.len() as u64;
        let start = index.checked_mul(b).filter(|&s| s < len)?;
        let end = start.saturating_add(b).min(len);
        self.samples.get(start as usize..end as usize)
    }

    /// The batches in order. All have `batch_size` samples except possibly
    /// the last (never short with `drop_last`).
    pub fn batches(&self) -> impl ExactSizeIterator<Item = &[u64]> + '_ {
        self.samples.chunks(self.params.batch_size as usize)
    }
}

/// How many built epochs a [`SessionPlan`] keeps for its holders: the
/// session's cursor (up to a window ahead of the loader) and the cache's
/// future index (the epoch holding the loader's position and the next one)
/// are never more than three epochs apart.
const EPOCH_MEMO: usize = 3;

/// A session's future: epochs `first_epoch..first_epoch + epoch_count` of
/// one rank, in delivery order.
///
/// Clones share one memo of built epochs (`SessionPlan::epoch`): the
/// session walking its plan and the cache indexing the same future build
/// each epoch's permutation once between them.
#[derive(Clone)]
pub struct SessionPlan {
    params: PlanParams,
    first_epoch: u32,
    epoch_count: u32,
    /// This session's part of the rank's batches: batches `worker`,
    /// `worker + workers`, … of every epoch (`workers` 1: all of them).
    worker: u32,
    workers: u32,
    placement: Option<Arc<Placement>>,
    /// A mixture's order, dealt in place of the permutation.
    mixture: Option<Arc<MixtureOrder>>,
    memo: Arc<Mutex<Vec<Arc<EpochPlan>>>>,
}

impl fmt::Debug for SessionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPlan")
            .field("params", &self.params)
            .field("first_epoch", &self.first_epoch)
            .field("epoch_count", &self.epoch_count)
            .finish_non_exhaustive()
    }
}

impl PartialEq for SessionPlan {
    fn eq(&self, other: &Self) -> bool {
        (self.params, self.first_epoch, self.epoch_count)
            == (other.params, other.first_epoch, other.epoch_count)
    }
}

impl Eq for SessionPlan {}

impl SessionPlan {
    /// A session over `epoch_count` epochs starting at `first_epoch`.
    ///
    /// # Errors
    ///
    /// Any error of `PlanParams::validate`, [`PlanError::NoEpochs`] or
    /// [`PlanError::EpochRangeOverflow`] (the last epoch must be at most
    /// `u32::MAX`).
    pub fn new(params: PlanParams, first_epoch: u32, epoch_count: u32) -> Result<Self, PlanError> {
        params.validate()?;
        if epoch_count == 0 {
            return Err(PlanError::NoEpochs);
        }
        if u64::from(first_epoch) + u64::from(epoch_count) - 1 > u64::from(u32::MAX) {
            return Err(PlanError::EpochRangeOverflow {
                first_epoch,
                epoch_count,
            });
        }
        Ok(SessionPlan {
            params,
            first_epoch,
            epoch_count,
            worker: 0,
            workers: 1,
            placement: None,
            mixture: None,
            memo: Arc::default(),
        })
    }

    /// The same session, delivering only batches `worker`,
    /// `worker + workers`, `worker + 2 * workers`, … of each epoch of its
    /// rank: the part of one of `workers` DataLoader workers sharing the
    /// rank's batches (round robin, so that the DataLoader hands the rank's
    /// batches to the training loop in the rank's own order).
    ///
    /// # Errors
    ///
    /// [`PlanError::WorkerOutOfRange`] when `worker >= workers`.
    pub(crate) fn with_workers(mut self, worker: u32, workers: u32) -> Result<Self, PlanError> {
        if worker >= workers {
            return Err(PlanError::WorkerOutOfRange { worker, workers });
        }
        self.worker = worker;
        self.workers = workers;
        self.memo = Arc::default();
        Ok(self)
    }

    /// The same session, planned (locality mode) and counted with
    /// `placement`.
    pub(crate) fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = Some(Arc::new(placement));
        self.memo = Arc::default();
        self
    }

    /// The same session over a mixture: each epoch deals
    /// `mixture.sequence(…)` (`params.num_samples` is its epoch length).
    pub(crate) fn with_mixture(mut self, mixture: Arc<MixtureOrder>) -> Self {
        self.mixture = Some(mixture);
        self.memo = Arc::default();
        self
    }

    /// The number of distinct sample indices the plan can name: the
    /// dataset's samples, or a mixture's sources' samples added up.
    pub(crate) fn index_space(&self) -> u64 {
        self.mixture
            .as_deref()
            .map_or(self.params.num_samples, MixtureOrder::index_space)
    }

    /// The `mode` label of the session's placement counts, when it counts.
    pub(crate) fn placement_mode(&self) -> Option<&'static str> {
        self.placement.as_deref().map(Placement::mode)
    }

    /// The session's parameters.
    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// The first epoch and the worker split (`worker`, `workers`).
    pub(crate) fn layout(&self) -> (u32, u32, u32) {
        (self.first_epoch, self.worker, self.workers)
    }

    /// The epochs of the session, in order.
    pub fn epochs(&self) -> Range<u64> {
        let first = u64::from(self.first_epoch);
        first..first + u64::from(self.epoch_count)
    }

    /// Batches per epoch (the same for every epoch): the rank's, or this
    /// worker's part of them.
    pub fn batches_per_epoch(&self) -> u64 {
        let all = batch_count(&self.params);
        let (w, ws) = (u64::from(self.worker), u64::from(self.workers.max(1)));
        if all <= w {
            0
        } else {
            (all - w).div_ceil(ws)
        }
    }

    /// Samples delivered per epoch (the same for every epoch): the rank's
    /// share less a dropped partial batch, or this worker's part of it.
    pub(crate) fn samples_per_epoch(&self) -> u64 {
        let all = batch_count(&self.params);
        let bs = u64::from(self.params.batch_size);
        let rank = all.saturating_mul(bs).min(share_len(&self.params));
        let mine = self.batches_per_epoch();
        if mine == 0 {
            return 0;
        }
        // Only the rank's last batch can be short; it is this session's
        // last when `all - 1` is one of its batches.
        let last_mine = (all - 1) % u64::from(self.workers.max(1)) == u64::from(self.worker);
        let short = all.saturating_mul(bs) - rank;
        mine * bs - if last_mine { short } else { 0 }
    }

    /// A test session over epochs `0..epochs` of `num_samples` samples,
    /// keeping the last, partial batch of each epoch.
    #[cfg(test)]
    pub(crate) fn for_test(
        num_samples: u64,
        seed: u64,
        rank: u32,
        world_size: u32,
        batch_size: u32,
        epochs: u32,
    ) -> SessionPlan {
        let params = PlanParams {
            num_samples,
            seed,
            rank,
            world_size,
            batch_size,
            drop_last: false,
        };
        SessionPlan::new(params, 0, epochs).unwrap()
    }

    /// Batches over the whole session.
    #[cfg(test)]
    pub(crate) fn total_batches(&self) -> u64 {
        self.batches_per_epoch() * u64::from(self.epoch_count)
    }

    /// The plan of `epoch` (one of [`epochs`](Self::epochs)), built once
    /// and shared by every clone of this plan while it is among the last
    /// few epochs asked for.
    ///
    /// # Errors
    ///
    /// [`PlanError::OutOfMemory`] when the permutation cannot be allocated.
    pub(crate) fn epoch(&self, epoch: u32) -> Result<Arc<EpochPlan>, PlanError> {
        // A poisoned memo only means a panic elsewhere while it was held:
        // its content (finished Arcs) is still valid.
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = memo.iter().find(|p| p.epoch() == epoch) {
            return Ok(Arc::clone(p));
        }
        let built = Arc::new(
            EpochPlan::build(
                &self.params,
                epoch,
                self.placement.as_deref(),
                self.mixture.as_deref(),
            )?
            .strided(self.worker, self.workers),
        );
        if memo.len() >= EPOCH_MEMO {
            memo.remove(0);
        }
        memo.push(Arc::clone(&built));
        Ok(built)
    }

    /// A cursor at the session's first batch.
    #[cfg(test)]
    pub(crate) fn cursor(&self) -> SessionCursor {
        self.cursor_at(0)
    }

    /// A cursor past the session's first `first_batch` batches, counted
    /// across its epochs (a loader resuming after its agent went away).
    pub(crate) fn cursor_at(&self, first_batch: u64) -> SessionCursor {
        let per_epoch = self.batches_per_epoch().max(1);
        SessionCursor {
            session: self.clone(),
            next_epoch_offset: u32::try_from(first_batch / per_epoch).unwrap_or(u32::MAX),
            current: None,
            next_batch: 0,
            skip: first_batch % per_epoch,
        }
    }

    /// Samples in the session's first `batches` batches (counted across
    /// its epochs).
    ///
    /// # Errors
    ///
    /// [`PlanError::OutOfMemory`] when an epoch's plan cannot be built.
    pub(crate) fn samples_before(&self, batches: u64) -> Result<u64, PlanError> {
        let per_epoch = self.batches_per_epoch();
        if per_epoch == 0 || batches == 0 {
            return Ok(0);
        }
        let whole = batches / per_epoch;
        let first = self.epoch(self.first_epoch)?;
        let epoch_samples = first.samples().len() as u64;
        let part = (batches % per_epoch) * u64::from(self.params.batch_size);
        Ok(whole * epoch_samples + part.min(epoch_samples))
    }
}

/// One batch of a session, as a [`SessionCursor`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedBatch<'a> {
    /// The epoch the batch belongs to.
    pub epoch: u32,
    /// The batch's index within its epoch, from 0.
    pub index: u64,
    /// The batch's sample indices, in order.
    pub samples: &'a [u64],
    /// Whether it is the last batch of its epoch.
    pub last_of_epoch: bool,
    /// `[local, peer, uncached]` counts of its samples, when the plan
    /// counts placements.
    pub placed: Option<[u32; 3]>,
}

/// Walks a [`SessionPlan`] batch by batch in delivery order, one epoch at a
/// time (memory: the epochs its plan's memo holds).
#[derive(Debug, Clone)]
pub(crate) struct SessionCursor {
    session: SessionPlan,
    /// Offset from `first_epoch` of the next epoch to plan.
    next_epoch_offset: u32,
    /// The epoch being walked.
    current: Option<Arc<EpochPlan>>,
    /// Index of the next batch of `current` to yield.
    next_batch: u64,
    /// Batches of the first epoch not to yield (taken when it is loaded).
    skip: u64,
}

impl SessionCursor {
    /// The plan walked.
    pub(crate) fn plan(&self) -> &SessionPlan {
        &self.session
    }

    /// The next batch, or `None` once the session's last epoch is done.
    ///
    /// # Errors
    ///
    /// [`PlanError::OutOfMemory`] when an epoch's permutation cannot be
    /// allocated; the cursor stays where it was and the call may be retried.
    pub fn next_batch(&mut self) -> Result<Option<PlannedBatch<'_>>, PlanError> {
        if self.session.batches_per_epoch() == 0 {
            return Ok(None);
        }
        loop {
            let exhausted = match &self.current {
                Some(plan) => self.next_batch >= plan.num_batches(),
                None => true,
            };
            if !exhausted {
                break;
            }
            if self.next_epoch_offset >= self.session.epoch_count {
                self.current = None;
                return Ok(None);
            }
            let epoch = self.session.first_epoch + self.next_epoch_offset;
            self.current = Some(self.session.epoch(epoch)?);
            self.next_epoch_offset += 1;
            self.next_batch = std::mem::take(&mut self.skip);
        }
        let index = self.next_batch;
        self.next_batch += 1;
        Ok(self.current.as_ref().and_then(|plan| {
            plan.batch(index).map(|samples| PlannedBatch {
                epoch: plan.epoch(),
                index,
                samples,
                last_of_epoch: index + 1 == plan.num_batches(),
                placed: plan.placed(index),
            })
        }))
    }
}
