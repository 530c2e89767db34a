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

use crate::mixture::MixtureOrder;
use crate::placement::Placement;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Domain tag mixed into every stream key: the ASCII bytes `granary1` read
/// as a big-endian 64-bit integer. It names the version of the algorithm; a
/// different ordering algorithm would use a different tag.
pub const ALGORITHM_TAG: u64 = 0x6772_616E_6172_7931;

/// SplitMix64's increment and finaliser (granary-base owns them).
pub(crate) use granary_base::hash::{mix64, GAMMA};

/// The largest dataset the planner accepts: 2^48 samples. Far beyond any
/// dataset whose permutation (8 bytes per sample) fits in memory, and small
/// enough that no index arithmetic can overflow.
pub const MAX_SAMPLES: u64 = 1 << 48;

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The dataset has no samples.
    NoSamples,
    /// The dataset has more samples than [`MAX_SAMPLES`] (or than this
    /// machine can index).
    TooManySamples {
        /// The requested number of samples.
        num_samples: u64,
    },
    /// `world_size` is 0.
    ZeroWorldSize,
    /// `rank` is not below `world_size`.
    RankOutOfRange {
        /// The requested rank.
        rank: u32,
        /// The world size it must be below.
        world_size: u32,
    },
    /// `batch_size` is 0.
    ZeroBatchSize,
    /// A session spans no epoch.
    NoEpochs,
    /// `first_epoch + epoch_count` does not fit in a `u32` epoch number.
    EpochRangeOverflow {
        /// The session's first epoch.
        first_epoch: u32,
        /// The session's number of epochs.
        epoch_count: u32,
    },
    /// The permutation's memory could not be allocated.
    OutOfMemory {
        /// The number of samples whose permutation was being built.
        num_samples: u64,
    },
    /// The locality-aware assignment failed (its inputs were checked at
    /// open, so this names a bug).
    Assignment(String),
    /// A session's `worker` is not below its `workers`.
    WorkerOutOfRange {
        /// The requested worker.
        worker: u32,
        /// The number of workers it must be below.
        workers: u32,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoSamples => {
                write!(f, "num_samples is 0: a dataset must have at least one sample")
            }
            PlanError::TooManySamples { num_samples } => write!(
                f,
                "num_samples is {num_samples}: the planner supports at most {MAX_SAMPLES} samples"
            ),
            PlanError::ZeroWorldSize => {
                write!(f, "world_size is 0: it must be at least 1")
            }
            PlanError::RankOutOfRange { rank, world_size } => write!(
                f,
                "rank {rank} is out of range for world_size {world_size}: rank must be below world_size"
            ),
            PlanError::ZeroBatchSize => {
                write!(f, "batch_size is 0: it must be at least 1")
            }
            PlanError::NoEpochs => {
                write!(f, "epoch_count is 0: a session must span at least one epoch")
            }
            PlanError::EpochRangeOverflow {
                first_epoch,
                epoch_count,
            } => write!(
                f,
                "first_epoch {first_epoch} + epoch_count {epoch_count} exceeds the largest epoch number {}",
                u32::MAX
            ),
            PlanError::OutOfMemory { num_samples } => write!(
                f,
                "cannot allocate the permutation of {num_samples} samples ({} bytes)",
                num_samples.saturating_mul(8)
            ),
            PlanError::Assignment(why) => write!(f, "locality assignment failed: {why}"),
            PlanError::WorkerOutOfRange { worker, workers } => write!(
                f,
                "worker {worker} is out of range for workers {workers}: worker must be below workers"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// What determines a rank's order: the dataset size, the shuffle seed, the
/// rank's place in the job and the batching.
///
/// `drop_last` plays the role of both `DistributedSampler(drop_last=…)` and
/// `DataLoader(drop_last=…)`: it truncates the permutation to a multiple of
/// `world_size` instead of padding it, and drops the rank's last partial
/// batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanParams {
    /// Number of samples in the dataset; samples are numbered `0..num_samples`.
    pub num_samples: u64,
    /// Shuffle seed, shared by every rank of a job.
    pub seed: u64,
    /// This loader's rank, in `0..world_size`.
    pub rank: u32,
    /// Number of ranks sharing the dataset.
    pub world_size: u32,
    /// Samples per batch.
    pub batch_size: u32,
    /// Truncate instead of padding, and drop the last partial batch.
    pub drop_last: bool,
}

impl PlanParams {
    /// Checks that a plan can be made from these parameters.
    ///
    /// # Errors
    ///
    /// [`PlanError::NoSamples`], [`PlanError::TooManySamples`],
    /// [`PlanError::ZeroWorldSize`], [`PlanError::RankOutOfRange`] or
    /// [`PlanError::ZeroBatchSize`], naming the first bad field.
    pub(crate) fn validate(&self) -> Result<(), PlanError> {
        check_num_samples(self.num_samples)?;
        if self.world_size == 0 {
            return Err(PlanError::ZeroWorldSize);
        }
        if self.rank >= self.world_size {
            return Err(PlanError::RankOutOfRange {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        if self.batch_size == 0 {
            return Err(PlanError::ZeroBatchSize);
        }
        Ok(())
    }
}

fn check_num_samples(n: u64) -> Result<usize, PlanError> {
    if n == 0 {
        return Err(PlanError::NoSamples);
    }
    if n > MAX_SAMPLES {
        return Err(PlanError::TooManySamples { num_samples: n });
    }
    usize::try_from(n).map_err(|_| PlanError::TooManySamples { num_samples: n })
}

/// The 64-bit key of the random stream of `(seed, epoch)`:
/// `mix64(mix64(seed ^ ALGORITHM_TAG) + epoch * GAMMA)` with wrapping
/// arithmetic.
///
/// For a fixed seed, distinct epochs give distinct keys; for a fixed epoch,
/// distinct seeds give distinct keys (every step is a bijection).
pub fn stream_key(seed: u64, epoch: u32) -> u64 {
    mix64(mix64(seed ^ ALGORITHM_TAG).wrapping_add(u64::from(epoch).wrapping_mul(GAMMA)))
}

/// SplitMix64: a 64-bit Weyl sequence passed through [`mix64`].
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform integer in `0..s` (`s >= 1`): Lemire's multiply-shift with
    /// rejection. The high word of `x * s` is the result; a draw whose low
    /// word is below `2^64 mod s` is rejected and redrawn.
    #[inline]
    fn below(&mut self, s: u64) -> u64 {
        let mut m = u128::from(self.next_u64()) * u128::from(s);
        // Truncations are intended: the low and high 64-bit words of m.
        let mut low = m as u64;
        if low < s {
            let threshold = s.wrapping_neg() % s;
            while low < threshold {
                m = u128::from(self.next_u64()) * u128::from(s);
                low = m as u64;
            }
        }
        (m >> 64) as u64
    }
}

/// The permutation of `0..n` for `(seed, epoch)`: Fisher–Yates from the last
/// position down, driven by SplitMix64 started at [`stream_key`]`(seed,
/// epoch)`.
///
/// `n = 0` gives an empty permutation. Takes `8 * n` bytes.
///
/// # Errors
///
/// [`PlanError::TooManySamples`] when `n` exceeds [`MAX_SAMPLES`],
/// [`PlanError::OutOfMemory`] when the vector cannot be allocated.
pub fn epoch_permutation(seed: u64, epoch: u32, n: u64) -> Result<Vec<u64>, PlanError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let len = check_num_samples(n)?;
    let mut perm: Vec<u64> = Vec::new();
    perm.try_reserve_exact(len)
        .map_err(|_| PlanError::OutOfMemory { num_samples: n })?;
    perm.extend(0..n);
    let mut rng = SplitMix64 {
        state: stream_key(seed, epoch),
    };
    for i in (1..len).rev() {
        // i < len <= MAX_SAMPLES: both conversions are exact.
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    Ok(perm)
}

/// The number of samples each rank receives per epoch, as
/// `DistributedSampler.num_samples`: `ceil(n / ws)`, or `floor(n / ws)` with
/// `drop_last` (0 when `n < ws`).
///
/// # Errors
///
/// Any error of [`PlanParams::validate`].
pub(crate) fn samples_per_rank(params: &PlanParams) -> Result<u64, PlanError> {
    params.validate()?;
    Ok(share_len(params))
}

/// [`samples_per_rank`] for validated parameters.
fn share_len(params: &PlanParams) -> u64 {
    let ws = u64::from(params.world_size);
    if params.drop_last {
        params.num_samples / ws
    } else {
        params.num_samples.div_ceil(ws)
    }
}

/// The number of batches each rank receives per epoch:
/// `ceil(share / batch_size)`, or `floor(share / batch_size)` with
/// `drop_last`, where `share` is `samples_per_rank`.
///
/// # Errors
///
/// Any error of `PlanParams::validate`.
pub fn batches_per_epoch(params: &PlanParams) -> Result<u64, PlanError> {
    params.validate()?;
    Ok(batch_count(params))
}

/// [`batches_per_epoch`] for validated parameters.
fn batch_count(params: &PlanParams) -> u64 {
    let share = share_len(params);
    let b = u64::from(params.batch_size);
    if params.drop_last {
        share / b
    } else {
        share.div_ceil(b)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u64, ws: u32, rank: u32, batch: u32, drop_last: bool) -> PlanParams {
        PlanParams {
            num_samples: n,
            seed: 42,
            rank,
            world_size: ws,
            batch_size: batch,
            drop_last,
        }
    }

    /// `DistributedSampler.__iter__` transcribed literally (list padding by
    /// repetition, truncation, slicing), to check [`rank_share`] against.
    fn pytorch_share(perm: &[u64], ws: u32, rank: u32, drop_last: bool) -> Vec<u64> {
        let n = perm.len() as u64;
        let ws64 = u64::from(ws);
        let num_samples = if drop_last && !n.is_multiple_of(ws64) {
            // math.ceil((n - ws) / ws), which is 0 when n < ws.
            if n < ws64 {
                0
            } else {
                (n - ws64).div_ceil(ws64)
            }
        } else {
            n.div_ceil(ws64)
        };
        let total = (num_samples * ws64) as usize;
        let mut indices = perm.to_vec();
        if !drop_last {
            let padding = total - indices.len();
            if padding <= indices.len() {
                indices.extend_from_slice(&perm[..padding]);
            } else {
                let reps = padding.div_ceil(perm.len());
                let repeated: Vec<u64> = perm.repeat(reps);
                indices.extend_from_slice(&repeated[..padding]);
            }
        } else {
            indices.truncate(total);
        }
        assert_eq!(indices.len(), total);
        indices
            .iter()
            .skip(rank as usize)
            .step_by(ws as usize)
            .copied()
            .collect()
    }

    #[test]
    fn mix64_known_values() {
        // Reference outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
        let mut rng = SplitMix64 { state: 0 };
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn permutation_is_a_permutation() {
        for n in [1u64, 2, 3, 7, 10, 100, 1000, 65_537] {
            let perm = epoch_permutation(7, 3, n).unwrap();
            assert_eq!(perm.len() as u64, n);
            let mut seen = vec![false; n as usize];
            for &x in &perm {
                assert!(x < n);
                assert!(!seen[x as usize], "{x} appears twice for n={n}");
                seen[x as usize] = true;
            }
        }
        assert!(epoch_permutation(7, 3, 0).unwrap().is_empty());
    }

    #[test]
    fn permutation_is_deterministic_and_varies() {
        let a = epoch_permutation(42, 0, 1000).unwrap();
        assert_eq!(a, epoch_permutation(42, 0, 1000).unwrap());
        assert_ne!(a, epoch_permutation(42, 1, 1000).unwrap());
        assert_ne!(a, epoch_permutation(43, 0, 1000).unwrap());
        // PyTorch seeds with seed + epoch; here (1, 0) and (0, 1) differ.
        assert_ne!(
            epoch_permutation(1, 0, 1000).unwrap(),
            epoch_permutation(0, 1, 1000).unwrap()
        );
        let identity: Vec<u64> = (0..1000).collect();
        assert_ne!(a, identity);
    }

    #[test]
    fn stream_keys_are_distinct() {
        let mut keys = std::collections::HashSet::new();
        for seed in [0u64, 1, 2, 42, u64::MAX] {
            for epoch in [0u32, 1, 2, 3, 1000, u32::MAX] {
                assert!(keys.insert(stream_key(seed, epoch)));
            }
        }
    }

    #[test]
    fn permutation_is_roughly_uniform() {
        // Position of each element over many seeds: every (element, position)
        // cell of a 4x4 table should be hit about 1/4 of the time.
        let trials = 8000u64;
        let mut counts = [[0u32; 4]; 4];
        for seed in 0..trials {
            let perm = epoch_permutation(seed, 0, 4).unwrap();
            for (pos, &x) in perm.iter().enumerate() {
                counts[x as usize][pos] += 1;
            }
        }
        for row in counts {
            for c in row {
                assert!((1800..=2200).contains(&c), "cell count {c} far from 2000");
            }
        }
    }

    #[test]
    fn bounded_draw_matches_reference_including_rejections() {
        // Values from `bounded` in tests/planner_reference.py, starting at
        // state 1. With s = 2^63 + 1 about half the draws are rejected: the
        // 11 results consume 17 draws.
        let mut rng = SplitMix64 { state: 1 };
        let big = (1u64 << 63) + 1;
        let bounds = [big, big, big, big, big, big, big, big, 3, u64::MAX, 6];
        let got: Vec<u64> = bounds.iter().map(|&s| rng.below(s)).collect();
        assert_eq!(
            got,
            [
                8_955_919_645_141_445_295,
                4_098_490_376_910_890_117,
                4_097_618_618_563_484_380,
                7_036_458_801_432_265_024,
                7_323_326_090_023_318_475,
                3_727_553_580_931_688_368,
                5_584_017_301_749_351_935,
                4_889_115_802_880_168_261,
                1,
                3_081_251_696_030_599_738,
                3,
            ]
        );
        assert_eq!(rng.state, 1u64.wrapping_add(17u64.wrapping_mul(GAMMA)));
        assert_eq!(rng.state, 0x81AF_1551_73F2_3D66);
    }

    #[test]
    fn worked_example_of_the_docs() {
        // docs/planner.md: seed 42, epoch 0, n = 10, two ranks, batches of 3.
        assert_eq!(stream_key(42, 0), 0x7E9A_8556_6D74_4C80);
        assert_eq!(
            epoch_permutation(42, 0, 10).unwrap(),
            [1, 3, 2, 5, 6, 0, 9, 7, 8, 4]
        );
        let p = params(10, 2, 0, 3, false);
        let batches = |p: &PlanParams| -> Vec<Vec<u64>> {
            EpochPlan::new(p, 0)
                .unwrap()
                .batches()
                .map(<[u64]>::to_vec)
                .collect()
        };
        assert_eq!(batches(&p), [vec![1, 2, 6], vec![9, 8]]);
        assert_eq!(
            batches(&PlanParams { rank: 1, ..p }),
            [vec![3, 5, 0], vec![7, 4]]
        );
        assert_eq!(
            batches(&PlanParams {
                rank: 1,
                drop_last: true,
                ..p
            }),
            [vec![3, 5, 0]]
        );
        let ws4 = params(10, 4, 3, 3, false);
        assert_eq!(rank_share(&ws4, 0).unwrap(), [5, 7, 3]);
        assert_eq!(
            rank_share(
                &PlanParams {
                    drop_last: true,
                    ..ws4
                },
                0
            )
            .unwrap(),
            [5, 7]
        );
    }

    #[test]
    fn bounded_draw_stays_in_range() {
        let mut rng = SplitMix64 { state: 1 };
        for s in [1u64, 2, 3, 5, 1 << 40, u64::MAX, (1 << 63) + 1] {
            for _ in 0..1000 {
                assert!(rng.below(s) < s);
            }
        }
    }

    #[test]
    fn ranks_partition_the_epoch_when_divisible_or_drop_last() {
        for &(n, ws, drop_last) in &[
            (100u64, 4u32, false),
            (100, 4, true),
            (101, 4, true),
            (103, 4, true),
            (7, 7, false),
            (1000, 3, true),
        ] {
            let mut all = Vec::new();
            for rank in 0..ws {
                let share = rank_share(&params(n, ws, rank, 8, drop_last), 5).unwrap();
                assert_eq!(share.len() as u64, n / u64::from(ws));
                all.extend(share);
            }
            let len = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(
                all.len(),
                len,
                "a sample was delivered twice (n={n}, ws={ws})"
            );
            assert_eq!(len as u64, n / u64::from(ws) * u64::from(ws));
        }
    }

    #[test]
    fn padding_matches_pytorch() {
        for &(n, ws) in &[
            (10u64, 3u32),
            (10, 4),
            (11, 4),
            (1, 4),
            (3, 8),
            (2, 7),
            (5, 16),
            (20_001, 2),
        ] {
            for drop_last in [false, true] {
                let perm = epoch_permutation(42, 2, n).unwrap();
                let mut covered = vec![0u32; n as usize];
                for rank in 0..ws {
                    let p = params(n, ws, rank, 3, drop_last);
                    let share = rank_share(&p, 2).unwrap();
                    assert_eq!(
                        share,
                        pytorch_share(&perm, ws, rank, drop_last),
                        "n={n} ws={ws} rank={rank} drop_last={drop_last}"
                    );
                    assert_eq!(share.len() as u64, samples_per_rank(&p).unwrap());
                    for &x in &share {
                        covered[x as usize] += 1;
                    }
                }
                if !drop_last {
                    // Every sample at least once; padding repeats the
                    // permutation's first entries.
                    assert!(covered.iter().all(|&c| c >= 1));
                    let extra = n.div_ceil(u64::from(ws)) * u64::from(ws) - n;
                    for (k, &x) in perm.iter().enumerate() {
                        let expected = 1 + extra / n + u64::from((k as u64) < extra % n);
                        assert_eq!(u64::from(covered[x as usize]), expected);
                    }
                } else {
                    assert!(covered.iter().all(|&c| c <= 1));
                }
            }
        }
    }

    #[test]
    fn share_sizes_for_edge_cases() {
        // n < ws without drop_last: every rank gets one sample, wrapped.
        let p = params(3, 8, 7, 4, false);
        assert_eq!(samples_per_rank(&p).unwrap(), 1);
        assert_eq!(batches_per_epoch(&p).unwrap(), 1);
        let perm = epoch_permutation(42, 0, 3).unwrap();
        assert_eq!(rank_share(&p, 0).unwrap(), vec![perm[7 % 3]]);
        // n < ws with drop_last: nothing for anyone, as in PyTorch.
        let p = params(3, 8, 0, 4, true);
        assert_eq!(samples_per_rank(&p).unwrap(), 0);
        assert_eq!(batches_per_epoch(&p).unwrap(), 0);
        let plan = EpochPlan::new(&p, 0).unwrap();
        assert_eq!(plan.num_batches(), 0);
        assert_eq!(plan.batches().count(), 0);
        assert_eq!(plan.batch(0), None);
        // batch_size larger than the share.
        let p = params(10, 2, 1, 64, false);
        assert_eq!(batches_per_epoch(&p).unwrap(), 1);
        assert_eq!(EpochPlan::new(&p, 0).unwrap().batch(0).unwrap().len(), 5);
        let p = params(10, 2, 1, 64, true);
        assert_eq!(batches_per_epoch(&p).unwrap(), 0);
        assert_eq!(EpochPlan::new(&p, 0).unwrap().num_batches(), 0);
        // One sample, one rank.
        let p = params(1, 1, 0, 1, true);
        assert_eq!(
            EpochPlan::new(&p, 9).unwrap().batches().collect::<Vec<_>>(),
            vec![&[0u64][..]]
        );
    }

    #[test]
    fn batches_cut_the_share() {
        for drop_last in [false, true] {
            for &(n, ws, b) in &[(10u64, 2u32, 3u32), (100, 3, 7), (64, 4, 4), (9, 1, 10)] {
                for rank in 0..ws {
                    let p = params(n, ws, rank, b, drop_last);
                    let plan = EpochPlan::new(&p, 1).unwrap();
                    let share = rank_share(&p, 1).unwrap();
                    let expected = batches_per_epoch(&p).unwrap();
                    assert_eq!(plan.num_batches(), expected);
                    assert_eq!(plan.batches().len() as u64, expected);
                    let batches: Vec<&[u64]> = plan.batches().collect();
                    for (i, batch) in batches.iter().enumerate() {
                        assert_eq!(plan.batch(i as u64), Some(*batch));
                        if drop_last || i + 1 < batches.len() {
                            assert_eq!(batch.len(), b as usize);
                        }
                    }
                    assert_eq!(plan.batch(expected), None);
                    assert_eq!(plan.batch(u64::MAX), None);
                    let flat: Vec<u64> = batches.concat();
                    assert_eq!(flat, plan.samples());
                    if drop_last {
                        assert_eq!(flat[..], share[..flat.len()]);
                        assert!(share.len() - flat.len() < b as usize);
                    } else {
                        assert_eq!(flat, share);
                    }
                }
            }
        }
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let good = params(10, 2, 0, 3, false);
        assert_eq!(good.validate(), Ok(()));
        let cases = [
            (
                PlanParams {
                    num_samples: 0,
                    ..good
                },
                PlanError::NoSamples,
            ),
            (
                PlanParams {
                    num_samples: MAX_SAMPLES + 1,
                    ..good
                },
                PlanError::TooManySamples {
                    num_samples: MAX_SAMPLES + 1,
                },
            ),
            (
                PlanParams {
                    world_size: 0,
                    ..good
                },
                PlanError::ZeroWorldSize,
            ),
            (
                PlanParams { rank: 2, ..good },
                PlanError::RankOutOfRange {
                    rank: 2,
                    world_size: 2,
                },
            ),
            (
                PlanParams {
                    batch_size: 0,
                    ..good
                },
                PlanError::ZeroBatchSize,
            ),
        ];
        for (p, err) in cases {
            assert_eq!(p.validate(), Err(err.clone()));
            assert_eq!(samples_per_rank(&p), Err(err.clone()));
            assert_eq!(batches_per_epoch(&p), Err(err.clone()));
            assert_eq!(rank_share(&p, 0), Err(err.clone()));
            assert_eq!(EpochPlan::new(&p, 0), Err(err.clone()));
            assert_eq!(SessionPlan::new(p, 0, 1), Err(err));
        }
        assert_eq!(SessionPlan::new(good, 0, 0), Err(PlanError::NoEpochs));
        assert_eq!(
            SessionPlan::new(good, u32::MAX, 2),
            Err(PlanError::EpochRangeOverflow {
                first_epoch: u32::MAX,
                epoch_count: 2
            })
        );
        assert!(SessionPlan::new(good, u32::MAX, 1).is_ok());
        assert!(epoch_permutation(0, 0, MAX_SAMPLES + 1).is_err());
        let msg = PlanError::RankOutOfRange {
            rank: 4,
            world_size: 4,
        }
        .to_string();
        assert!(
            msg.contains("rank 4") && msg.contains("world_size 4"),
            "{msg}"
        );
        assert!(PlanError::NoSamples
            .to_string()
            .contains("num_samples is 0"));
    }

    #[test]
    fn session_cursor_walks_epochs_in_order() {
        let p = params(23, 2, 1, 5, false);
        let session = SessionPlan::new(p, 3, 3).unwrap();
        assert_eq!(session.epochs(), 3..6);
        assert_eq!(session.batches_per_epoch(), 3);
        assert_eq!(session.total_batches(), 9);
        let mut cursor = session.cursor();
        let mut walked = Vec::new();
        while let Some(batch) = cursor.next_batch().unwrap() {
            walked.push((batch.epoch, batch.index, batch.samples.to_vec()));
        }
        let mut expected = Vec::new();
        for epoch in 3..6 {
            let plan = EpochPlan::new(&p, epoch).unwrap();
            for (i, batch) in plan.batches().enumerate() {
                expected.push((epoch, i as u64, batch.to_vec()));
            }
        }
        assert_eq!(walked, expected);
        assert_eq!(walked.len() as u64, session.total_batches());
        // Exhausted cursors stay exhausted.
        assert_eq!(cursor.next_batch().unwrap(), None);

        // A session without batches yields nothing.
        let empty = SessionPlan::new(params(3, 8, 0, 4, true), 0, 5).unwrap();
        assert_eq!(empty.total_batches(), 0);
        assert_eq!(empty.cursor().next_batch().unwrap(), None);

        // The last representable epoch.
        let last = SessionPlan::new(p, u32::MAX, 1).unwrap();
        let mut cursor = last.cursor();
        assert_eq!(cursor.next_batch().unwrap().unwrap().epoch, u32::MAX);
    }

    #[test]
    fn workers_split_the_rank_batches_round_robin() {
        for (n, ws, bs, drop_last) in [
            (23, 2, 5, false),
            (100, 3, 7, true),
            (9, 1, 2, false),
            (5, 2, 4, false),
        ] {
            for workers in 1..=4u32 {
                let p = params(n, ws, 0, bs, drop_last);
                let rank = SessionPlan::new(p, 1, 2).unwrap();
                let mut rank_batches = Vec::new();
                let mut c = rank.cursor();
                while let Some(b) = c.next_batch().unwrap() {
                    rank_batches.push((b.epoch, b.index, b.samples.to_vec()));
                }
                let mut union = Vec::new();
                for w in 0..workers {
                    let part = SessionPlan::new(p, 1, 2)
                        .unwrap()
                        .with_workers(w, workers)
                        .unwrap();
                    let mut mine = Vec::new();
                    let mut c = part.cursor();
                    while let Some(b) = c.next_batch().unwrap() {
                        mine.push((b.epoch, b.samples.to_vec()));
                    }
                    let expect: Vec<_> = rank_batches
                        .iter()
                        .filter(|(_, i, _)| *i % u64::from(workers) == u64::from(w))
                        .map(|(e, _, s)| (*e, s.clone()))
                        .collect();
                    assert_eq!(
                        mine, expect,
                        "n {n} ws {ws} bs {bs} worker {w} of {workers}"
                    );
                    assert_eq!(mine.len() as u64, part.total_batches());
                    let samples: u64 = mine.iter().map(|(_, s)| s.len() as u64).sum();
                    assert_eq!(
                        samples,
                        2 * part.samples_per_epoch(),
                        "n {n} ws {ws} bs {bs} dl {drop_last} w {w}/{workers}"
                    );
                    // Resuming at a batch of the part skips exactly those.
                    if part.total_batches() > 1 {
                        let mut c = part.cursor_at(1);
                        assert_eq!(
                            c.next_batch().unwrap().map(|b| b.samples.to_vec()),
                            Some(mine[1].1.clone())
                        );
                    }
                    union.extend(mine);
                }
                assert_eq!(union.len(), rank_batches.len());
            }
        }
        let p = params(10, 1, 0, 2, false);
        let e = SessionPlan::new(p, 0, 1)
            .unwrap()
            .with_workers(2, 2)
            .unwrap_err();
        assert_eq!(
            e,
            PlanError::WorkerOutOfRange {
                worker: 2,
                workers: 2
            }
        );
        assert!(e.to_string().contains("worker 2 is out of range"));
    }

    #[test]
    fn large_permutation_is_a_permutation() {
        let n = 2_000_000u64;
        let perm = epoch_permutation(1, 1, n).unwrap();
        let mut seen = vec![false; n as usize];
        for &x in &perm {
            assert!(!std::mem::replace(&mut seen[x as usize], true));
        }
    }
}
