//! A plan's inputs ([`PlanParams`]), why a plan cannot be made
//! ([`PlanError`]) and the counts every rank agrees on: samples and batches
//! per rank and epoch. A leaf: it names no other module of the agent.

use std::fmt;

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

pub(super) fn check_num_samples(n: u64) -> Result<usize, PlanError> {
    if n == 0 {
        return Err(PlanError::NoSamples);
    }
    if n > MAX_SAMPLES {
        return Err(PlanError::TooManySamples { num_samples: n });
    }
    usize::try_from(n).map_err(|_| PlanError::TooManySamples { num_samples: n })
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
pub(super) fn share_len(params: &PlanParams) -> u64 {
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
pub(super) fn batch_count(params: &PlanParams) -> u64 {
    let share = share_len(params);
    let b = u64::from(params.batch_size);
    if params.drop_last {
        share / b
    } else {
        share.div_ceil(b)
    }
}
