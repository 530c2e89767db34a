//! The job-status frame's body ([`crate::frame::Frame::JobStatus`], kind
//! 13, protocol version 4): what one agent tells its peers about the job's
//! training plans it serves (each rank's committed position) and about its
//! ranks' waits in `next_batch`. Each frame replaces the sender's last one,
//! so a receiver holds at most one decoded frame per peer: at most
//! [`crate::frame::MAX_BODY`] bytes of wire, [`MAX_STATUS_PLANS`] plans,
//! [`MAX_STATUS_POSITIONS`] positions and [`MAX_STATUS_WAITS`] wait rows.
//!
//! ```text
//! u64 seq                     sender's counter, increasing per connection
//! u16 plans (<= MAX_STATUS_PLANS), each:
//!   u8 len + dataset name, u64 fingerprint, u64 seed, u32 batch_size,
//!   u32 world_size (>= 1), u8 drop_last (0|1),
//!   u16 positions, each: u32 rank (< world_size), u32 epoch, u64 step,
//!                        u8 live (0|1)
//! u16 waits (<= MAX_STATUS_WAITS), each:
//!   u8 len + dataset name, u32 rank, u32 p50_us, u32 p95_us, u32 p99_us
//!   (u32::MAX: none), u8 verdict (0..=5, 255: none)
//! ```

use crate::frame::FrameError;

/// Most plans in one status frame.
pub const MAX_STATUS_PLANS: usize = 32;
/// Most rank positions in one status frame, over all its plans.
pub const MAX_STATUS_POSITIONS: usize = 1024;
/// Most wait rows in one status frame.
pub const MAX_STATUS_WAITS: usize = 1024;
/// A wait quantile that is not known.
pub const NO_QUANTILE: u32 = u32::MAX;
/// A verdict that is not known.
pub const NO_VERDICT: u8 = 255;
/// Highest verdict code (the agent's six verdicts are 0..=5).
pub const MAX_VERDICT: u8 = 5;

/// What identifies a training plan across agents: the same key on two
/// agents is the same job's plan, whose ranks walk the same batches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanKey {
    /// Dataset name (1..=255 bytes).
    pub dataset: String,
    /// Dataset fingerprint (names, sizes, version tokens).
    pub fingerprint: u64,
    /// Shuffle seed.
    pub seed: u64,
    /// Samples per batch.
    pub batch_size: u32,
    /// Ranks of the job (>= 1).
    pub world_size: u32,
    /// Whether the plan drops the last partial batch.
    pub drop_last: bool,
}

/// Where one rank stands: the next batch of epoch `epoch` it has not
/// taken (`step`), so `step` batches of that epoch are committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankPosition {
    /// The rank (< the plan's world size).
    pub rank: u32,
    /// Its epoch.
    pub epoch: u32,
    /// Batches of that epoch it has taken.
    pub step: u64,
    /// Whether a session of the rank is open on the sender now.
    pub live: bool,
}

/// One plan and its ranks' positions, as the sender knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanStatus {
    /// The plan.
    pub key: PlanKey,
    /// Its ranks the sender serves or served.
    pub positions: Vec<RankPosition>,
}

/// One rank's recent waits in `next_batch`, in microseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankWait {
    /// Dataset name (1..=255 bytes).
    pub dataset: String,
    /// The rank.
    pub rank: u32,
    /// p50, p95, p99 ([`NO_QUANTILE`]: none).
    pub quantiles_us: [u32; 3],
    /// The last interval's verdict code, or [`NO_VERDICT`].
    pub verdict: u8,
}

/// The body of a job-status frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobStatus {
    /// The sender's counter: a frame with a lower one than the last taken
    /// from the same connection is stale.
    pub seq: u64,
    /// Plans and positions.
    pub plans: Vec<PlanStatus>,
    /// Ranks' waits.
    pub waits: Vec<RankWait>,
}

/// Bytes of a plan's fixed fields besides its name and positions.
const PLAN_FIXED: usize = 1 + 8 + 8 + 4 + 4 + 1 + 2;
/// Bytes of one position.
pub const POSITION_LEN: usize = 4 + 4 + 8 + 1;
/// Bytes of a wait row besides its name.
const WAIT_FIXED: usize = 1 + 4 + 12 + 1;

impl JobStatus {
    /// Bytes of the encoded body.
    pub fn body_len(&self) -> usize {
        8 + 2
            + self
                .plans
                .iter()
                .map(|p| PLAN_FIXED + p.key.dataset.len() + POSITION_LEN * p.positions.len())
                .sum::<usize>()
            + 2
            + self
                .waits
                .iter()
                .map(|w| WAIT_FIXED + w.dataset.len())
                .sum::<usize>()
    }

    /// Bytes a plan with `name_len` bytes of name and `positions`
    /// positions adds to the body.
    pub fn plan_len(name_len: usize, positions: usize) -> usize {
        PLAN_FIXED + name_len + POSITION_LEN * positions
    }

    /// Bytes a wait row with `name_len` bytes of name adds to the body.
    pub fn wait_len(name_len: usize) -> usize {
        WAIT_FIXED + name_len
    }

    fn check(&self) -> Result<(), FrameError> {
        if self.plans.len() > MAX_STATUS_PLANS {
            return Err(FrameError::BadStatus("too many plans"));
        }
        if self.waits.len() > MAX_STATUS_WAITS {
            return Err(FrameError::BadStatus("too many wait rows"));
        }
        let positions: usize = self.plans.iter().map(|p| p.positions.len()).sum();
        if positions > MAX_STATUS_POSITIONS {
            return Err(FrameError::BadStatus("too many positions"));
        }
        for p in &self.plans {
            check_name(&p.key.dataset)?;
            if p.key.world_size == 0 {
                return Err(FrameError::BadStatus("world size 0"));
            }
            if p.positions.iter().any(|r| r.rank >= p.key.world_size) {
                return Err(FrameError::BadStatus("rank out of range"));
            }
        }
        for w in &self.waits {
            check_name(&w.dataset)?;
            if w.verdict > MAX_VERDICT && w.verdict != NO_VERDICT {
                return Err(FrameError::BadStatus("unknown verdict"));
            }
        }
        Ok(())
    }

    /// Appends the body; fails, writing nothing, for a status the decoder
    /// would refuse.
    pub(crate) fn encode(&self, body: &mut Vec<u8>) -> Result<(), FrameError> {
        self.check()?;
        let start = body.len();
        body.extend_from_slice(&self.seq.to_le_bytes());
        body.extend_from_slice(&(self.plans.len() as u16).to_le_bytes());
        for p in &self.plans {
            let k = &p.key;
            put_name(body, &k.dataset);
            body.extend_from_slice(&k.fingerprint.to_le_bytes());
            body.extend_from_slice(&k.seed.to_le_bytes());
            body.extend_from_slice(&k.batch_size.to_le_bytes());
            body.extend_from_slice(&k.world_size.to_le_bytes());
            body.push(u8::from(k.drop_last));
            body.extend_from_slice(&(p.positions.len() as u16).to_le_bytes());
            for r in &p.positions {
                body.extend_from_slice(&r.rank.to_le_bytes());
                body.extend_from_slice(&r.epoch.to_le_bytes());
                body.extend_from_slice(&r.step.to_le_bytes());
                body.push(u8::from(r.live));
            }
        }
        body.extend_from_slice(&(self.waits.len() as u16).to_le_bytes());
        for w in &self.waits {
            put_name(body, &w.dataset);
            body.extend_from_slice(&w.rank.to_le_bytes());
            for q in w.quantiles_us {
                body.extend_from_slice(&q.to_le_bytes());
            }
            body.push(w.verdict);
        }
        debug_assert_eq!(body.len() - start, self.body_len());
        Ok(())
    }
}

fn check_name(s: &str) -> Result<(), FrameError> {
    if s.is_empty() || s.len() > crate::frame::MAX_ID_LEN {
        return Err(FrameError::BadStatus("dataset name empty or too long"));
    }
    Ok(())
}

fn put_name(out: &mut Vec<u8>, s: &str) {
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// The reads the status decoder needs from a frame body.
pub(crate) trait StatusBody {
    fn u8(&mut self) -> Result<u8, FrameError>;
    fn u16(&mut self) -> Result<u16, FrameError>;
    fn u32(&mut self) -> Result<u32, FrameError>;
    fn u64(&mut self) -> Result<u64, FrameError>;
    fn name(&mut self) -> Result<String, FrameError>;
}

fn flag(b: u8) -> Result<bool, FrameError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(FrameError::BadStatus("flag neither 0 nor 1")),
    }
}

/// Decodes a status body; every count is checked before anything is
/// allocated for it.
pub(crate) fn decode(b: &mut impl StatusBody) -> Result<JobStatus, FrameError> {
    let seq = b.u64()?;
    let nplans = usize::from(b.u16()?);
    if nplans > MAX_STATUS_PLANS {
        return Err(FrameError::BadStatus("too many plans"));
    }
    let mut plans = Vec::with_capacity(nplans);
    let mut positions_left = MAX_STATUS_POSITIONS;
    for _ in 0..nplans {
        let key = PlanKey {
            dataset: b.name()?,
            fingerprint: b.u64()?,
            seed: b.u64()?,
            batch_size: b.u32()?,
            world_size: b.u32()?,
            drop_last: flag(b.u8()?)?,
        };
        if key.world_size == 0 {
            return Err(FrameError::BadStatus("world size 0"));
        }
        let n = usize::from(b.u16()?);
        if n > positions_left {
            return Err(FrameError::BadStatus("too many positions"));
        }
        positions_left -= n;
        let mut positions = Vec::with_capacity(n);
        for _ in 0..n {
            let r = RankPosition {
                rank: b.u32()?,
                epoch: b.u32()?,
                step: b.u64()?,
                live: flag(b.u8()?)?,
            };
            if r.rank >= key.world_size {
                return Err(FrameError::BadStatus("rank out of range"));
            }
            positions.push(r);
        }
        plans.push(PlanStatus { key, positions });
    }
    let nwaits = usize::from(b.u16()?);
    if nwaits > MAX_STATUS_WAITS {
        return Err(FrameError::BadStatus("too many wait rows"));
    }
    let mut waits = Vec::with_capacity(nwaits);
    for _ in 0..nwaits {
        let w = RankWait {
            dataset: b.name()?,
            rank: b.u32()?,
            quantiles_us: [b.u32()?, b.u32()?, b.u32()?],
            verdict: b.u8()?,
        };
        if w.verdict > MAX_VERDICT && w.verdict != NO_VERDICT {
            return Err(FrameError::BadStatus("unknown verdict"));
        }
        waits.push(w);
    }
    Ok(JobStatus { seq, plans, waits })
}
