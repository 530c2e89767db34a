//! The sessions' known futures: when will each sample be needed next?
//!
//! A [`FutureIndex`] follows every registered session through its
//! [`SessionPlan`]. A session's *position* is the global sequence number of
//! the next sample it will be delivered, counted over the whole session:
//! epoch `first_epoch + k`, index `i` in that epoch's delivery order is
//! position `k * per_epoch + i`, where `per_epoch` is the number of samples
//! a rank is delivered per epoch.
//!
//! For each session the index keeps two *live epochs*: the one holding the
//! session's position and the one after it (the horizon). Each live epoch
//! holds its delivery order and its inverse (sample → index in the order,
//! `u32` per dataset sample), built from the planner when the epoch becomes
//! live. A rank's share of a dataset contains a sample at most once, so the
//! inverse is a plain array; a mixture's epoch may deliver a sample several
//! times (an upsampled source), and then each occurrence also points to the
//! next one (`later`), so that a sample's next use is still found in a few
//! steps.
//!
//! The next use of sample `s` by a session at position `p` is its position
//! in the current epoch if that is at or after `p`, else its position in the
//! next epoch, else [`NEVER`] (not needed within the horizon, or the session
//! ends first). `O(1)`.
//!
//! Sessions are compared on one timeline counted in samples: a session's
//! position `p` is the time `offset + p`, where `offset` is the timeline's
//! "now" when the session joined (the furthest time any session had
//! reached). Sessions are assumed to deliver samples at the same rate; no
//! normalisation by measured rates is made. The next use of a sample is the
//! minimum over the sessions of its dataset.
//!
//! Every mutating call reports the samples whose next use may have changed,
//! so a policy that orders samples by next use updates just those:
//! consuming a sample changes only that sample, an epoch roll-over adds the
//! new horizon epoch's samples, and adding or removing a session its two
//! live epochs' samples. Memory: `8 × share + 4 × num_samples` bytes per live
//! epoch, two live epochs per session.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::planner::{samples_per_rank, EpochPlan, PlanError, SessionPlan};

/// The next-use time of a sample that no session needs within its horizon.
pub const NEVER: u64 = u64::MAX;

/// Identifies a session, as the session engine numbers them.
pub type SessionId = u64;

/// Marks a sample that is not in an epoch's share.
const ABSENT: u32 = u32::MAX;

/// Why a [`FutureIndex`] call failed. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FutureError {
    /// A session with this id is already registered.
    DuplicateSession(SessionId),
    /// No session with this id is registered.
    UnknownSession(SessionId),
    /// The session's plan could not be built.
    Plan(PlanError),
    /// A rank's per-epoch share has `u32::MAX` samples or more, beyond what
    /// the index's `u32` inverse arrays address.
    ShareTooLarge {
        /// The share's length.
        share: u64,
    },
    /// An advance would move a session backwards or past its end.
    BadPosition {
        /// The session.
        session: SessionId,
        /// Its position now.
        position: u64,
        /// The requested position.
        requested: u64,
        /// Its last position (samples in the whole session).
        total: u64,
    },
}

impl FutureError {
    /// Checks that session `id`, at `position` of its `total`, may move to
    /// `requested`: never backwards, never past its end
    /// ([`FutureError::BadPosition`] otherwise).
    pub(crate) fn check_advance(
        id: SessionId,
        position: u64,
        total: u64,
        requested: u64,
    ) -> Result<(), FutureError> {
        if requested < position || requested > total {
            return Err(FutureError::BadPosition {
                session: id,
                position,
                requested,
                total,
            });
        }
        Ok(())
    }
}

impl fmt::Display for FutureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FutureError::DuplicateSession(id) => write!(f, "session {id} is already registered"),
            FutureError::UnknownSession(id) => write!(f, "session {id} is not registered"),
            FutureError::Plan(e) => write!(f, "cannot plan the session: {e}"),
            FutureError::ShareTooLarge { share } => write!(
                f,
                "a rank's share of {share} samples per epoch is too large to index (limit {})",
                u32::MAX - 1
            ),
            FutureError::BadPosition {
                session,
                position,
                requested,
                total,
            } => write!(
                f,
                "session {session} cannot move from position {position} to {requested} (it has {total} samples)"
            ),
        }
    }
}

impl std::error::Error for FutureError {}

impl From<PlanError> for FutureError {
    fn from(e: PlanError) -> Self {
        FutureError::Plan(e)
    }
}

/// The samples a session is delivered per epoch and over its whole plan:
/// `(per_epoch, total)`, where `per_epoch` is the rank's share less a
/// dropped partial batch.
///
/// # Errors
///
/// Any error of [`PlanParams::validate`](crate::planner::PlanParams::validate).
pub(crate) fn session_length(plan: &SessionPlan) -> Result<(u64, u64), PlanError> {
    plan.params().validate()?;
    let per_epoch = plan.samples_per_epoch();
    let epochs = plan.epochs();
    Ok((
        per_epoch,
        per_epoch.saturating_mul(epochs.end - epochs.start),
    ))
}

/// One epoch of a session with its inverse order.
#[derive(Debug)]
struct LiveEpoch {
    /// Session position of the epoch's first sample.
    base: u64,
    /// Offset of the epoch from the session's first epoch.
    offset: u32,
    plan: Arc<EpochPlan>,
    /// `inverse[s]` = index of sample `s` in the delivery order, or
    /// `ABSENT`.
    inverse: Vec<u32>,
    /// `later[i]` = index of the next occurrence of the sample at index
    /// `i`, or `ABSENT`; empty when no sample occurs twice.
    later: Vec<u32>,
    /// Where the delivery order differs from `plan.samples()` (relaxed
    /// order: samples that traded places): index → sample.
    moved: HashMap<u32, u64>,
}

impl LiveEpoch {
    fn build(session: &SessionPlan, offset: u32, per_epoch: u64) -> Result<Self, FutureError> {
        let epoch = session.epochs().start + u64::from(offset);
        // The planner checked that every epoch of the session fits in u32.
        let epoch = u32::try_from(epoch).map_err(|_| PlanError::EpochRangeOverflow {
            first_epoch: u32::MAX,
            epoch_count: offset,
        })?;
        let plan = session.epoch(epoch)?;
        let n = session.index_space();
        let len = usize::try_from(n).map_err(|_| PlanError::TooManySamples { num_samples: n })?;
        let mut inverse: Vec<u32> = Vec::new();
        inverse
            .try_reserve_exact(len)
            .map_err(|_| PlanError::OutOfMemory { num_samples: n })?;
        inverse.resize(len, ABSENT);
        let mut later: Vec<u32> = Vec::new();
        // From the last index down, so that `inverse` ends at each sample's
        // first occurrence.
        for (i, &s) in plan.samples().iter().enumerate().rev() {
            // i < share < u32::MAX (checked at registration); s < n.
            if let Some(slot) = inverse.get_mut(s as usize) {
                if *slot != ABSENT {
                    if later.is_empty() {
                        later
                            .try_reserve_exact(plan.samples().len())
                            .map_err(|_| PlanError::OutOfMemory { num_samples: n })?;
                        later.resize(plan.samples().len(), ABSENT);
                    }
                    later[i] = *slot;
                }
                *slot = i as u32;
            }
        }
        Ok(LiveEpoch {
            base: u64::from(offset) * per_epoch,
            offset,
            plan,
            inverse,
            later,
            moved: HashMap::new(),
        })
    }

    /// Samples `a` and `b`, both delivered in this epoch, trade places.
    /// Returns whether both are in it.
    fn swap(&mut self, a: u64, b: u64) -> bool {
        if !self.later.is_empty() {
            // Trades are for datasets' shares, where no sample repeats.
            return false;
        }
        let index = |s: u64| {
            let i = *self.inverse.get(usize::try_from(s).ok()?)?;
            (i != ABSENT).then_some(i)
        };
        let (Some(ia), Some(ib)) = (index(a), index(b)) else {
            return false;
        };
        // Both indices came from `inverse`, so both samples index it.
        self.inverse[a as usize] = ib;
        self.inverse[b as usize] = ia;
        for (i, s) in [(ia, b), (ib, a)] {
            if self.plan.samples().get(i as usize) == Some(&s) {
                self.moved.remove(&i);
            } else {
                self.moved.insert(i, s);
            }
        }
        true
    }

    /// Session position of `sample` in this epoch (its first occurrence),
    /// if it is delivered.
    fn position_of(&self, sample: u64) -> Option<u64> {
        let i = *self.inverse.get(usize::try_from(sample).ok()?)?;
        (i != ABSENT).then(|| self.base + u64::from(i))
    }

    /// Session position of the first occurrence of `sample` in this epoch
    /// at or after position `from`.
    fn position_from(&self, sample: u64, from: u64) -> Option<u64> {
        let mut p = self.position_of(sample)?;
        while p < from {
            let i = *self.later.get(usize::try_from(p - self.base).ok()?)?;
            if i == ABSENT {
                return None;
            }
            p = self.base + u64::from(i);
        }
        Some(p)
    }

    fn sample_at(&self, position: u64) -> Option<u64> {
        let i = u32::try_from(position.checked_sub(self.base)?).ok()?;
        match self.moved.get(&i) {
            Some(&s) => Some(s),
            None => self.plan.samples().get(i as usize).copied(),
        }
    }
}

/// One session's place in its future.
#[derive(Debug)]
struct SessionFuture {
    dataset: u32,
    plan: SessionPlan,
    per_epoch: u64,
    total: u64,
    /// Timeline time of position 0.
    offset: u64,
    position: u64,
    /// The epoch holding `position` (none once the session is finished).
    current: Option<LiveEpoch>,
    /// The epoch after it, when the session has one.
    next: Option<LiveEpoch>,
}

impl SessionFuture {
    /// The timeline times of the next two uses of `sample` by this session
    /// (`NEVER` where there is none within the horizon).
    fn next_two_uses(&self, sample: u64) -> [u64; 2] {
        let time = |pos: u64| self.offset.saturating_add(pos).min(NEVER - 1);
        let mut uses = [NEVER, NEVER];
        let mut found = 0;
        for e in self.current.iter().chain(self.next.iter()) {
            let mut from = self.position;
            while found < 2 {
                let Some(p) = e.position_from(sample, from) else {
                    break;
                };
                uses[found] = time(p);
                found += 1;
                from = p + 1;
            }
        }
        uses
    }

    fn live_samples(&self) -> impl Iterator<Item = u64> + '_ {
        self.current
            .iter()
            .chain(self.next.iter())
            .flat_map(|e| e.plan.samples().iter().copied())
    }

    fn now(&self) -> u64 {
        self.offset.saturating_add(self.position)
    }
}

/// Samples whose next use may have changed after a [`FutureIndex`] call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Changed {
    /// The dataset of the samples.
    pub dataset: u32,
    /// The sample indices (possibly with repeats).
    pub samples: Vec<u64>,
}

/// The known futures of all registered sessions (see the module docs).
#[derive(Debug, Default)]
pub struct FutureIndex {
    sessions: BTreeMap<SessionId, SessionFuture>,
    /// The furthest timeline time any session has reached.
    clock: u64,
}

impl FutureIndex {
    /// An index with no sessions: every sample's next use is [`NEVER`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of registered sessions.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is registered.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The timeline's "now": the furthest time any session has reached.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Registers session `id`, reading `dataset` in the order of `plan`,
    /// at position 0 and at the timeline's current time. Builds its first
    /// two epochs: `O(num_samples)`.
    ///
    /// # Errors
    ///
    /// [`FutureError::DuplicateSession`], [`FutureError::Plan`] or
    /// [`FutureError::ShareTooLarge`]; nothing is registered then.
    pub(crate) fn add_session(
        &mut self,
        id: SessionId,
        dataset: u32,
        plan: SessionPlan,
    ) -> Result<Changed, FutureError> {
        if self.sessions.contains_key(&id) {
            return Err(FutureError::DuplicateSession(id));
        }
        let share = samples_per_rank(plan.params())?;
        if share >= u64::from(u32::MAX) {
            return Err(FutureError::ShareTooLarge { share });
        }
        let (per_epoch, total) = session_length(&plan)?;
        let epoch_count = {
            let r = plan.epochs();
            r.end - r.start
        };
        let (current, next) = if total == 0 {
            (None, None)
        } else {
            let current = LiveEpoch::build(&plan, 0, per_epoch)?;
            let next = if epoch_count > 1 {
                Some(LiveEpoch::build(&plan, 1, per_epoch)?)
            } else {
                None
            };
            (Some(current), next)
        };
        let session = SessionFuture {
            dataset,
            plan,
            per_epoch,
            total,
            offset: self.clock,
            position: 0,
            current,
            next,
        };
        let changed = Changed {
            dataset,
            samples: session.live_samples().collect(),
        };
        self.sessions.insert(id, session);
        Ok(changed)
    }

    /// Forgets session `id` (finished, closed or dead).
    ///
    /// # Errors
    ///
    /// [`FutureError::UnknownSession`].
    pub(crate) fn remove_session(&mut self, id: SessionId) -> Result<Changed, FutureError> {
        let session = self
            .sessions
            .remove(&id)
            .ok_or(FutureError::UnknownSession(id))?;
        Ok(Changed {
            dataset: session.dataset,
            samples: session.live_samples().collect(),
        })
    }

    /// Session `id`'s position: samples delivered so far.
    pub fn position(&self, id: SessionId) -> Option<u64> {
        self.sessions.get(&id).map(|s| s.position)
    }

    /// Session `id`'s number of samples over its whole plan.
    pub fn total(&self, id: SessionId) -> Option<u64> {
        self.sessions.get(&id).map(|s| s.total)
    }

    /// The sample at position `position` of session `id`, when that
    /// position lies in one of its live epochs.
    pub fn sample_at(&self, id: SessionId, position: u64) -> Option<u64> {
        let s = self.sessions.get(&id)?;
        s.current
            .iter()
            .chain(s.next.iter())
            .find_map(|e| e.sample_at(position))
    }

    /// Moves session `id` to `position` (samples delivered so far, at most
    /// its total): every sample in between has been used. `O(k)` for `k`
    /// samples, plus `O(num_samples)` for each live epoch that has to be
    /// built (one per epoch boundary crossed, two at most).
    ///
    /// # Errors
    ///
    /// [`FutureError::UnknownSession`], [`FutureError::BadPosition`]
    /// (backwards or past the end), or [`FutureError::Plan`] when a new
    /// live epoch cannot be built. Nothing changes on error.
    pub(crate) fn advance(&mut self, id: SessionId, position: u64) -> Result<Changed, FutureError> {
        let s = self
            .sessions
            .get_mut(&id)
            .ok_or(FutureError::UnknownSession(id))?;
        FutureError::check_advance(id, s.position, s.total, position)?;
        let mut changed = Changed {
            dataset: s.dataset,
            samples: Vec::new(),
        };
        if position == s.position {
            return Ok(changed);
        }
        // s.total > 0 here, so per_epoch > 0.
        let epoch_count = {
            let r = s.plan.epochs();
            r.end - r.start
        };
        let old_current = s.position / s.per_epoch;
        let new_current = position / s.per_epoch;
        // Build what the new live epochs need before changing anything.
        let mut new_live: [Option<LiveEpoch>; 2] = [None, None];
        if new_current != old_current {
            for (slot, offset) in new_live.iter_mut().zip([new_current, new_current + 1]) {
                let reusable = offset == old_current + 1;
                if offset < epoch_count && !reusable {
                    // offset < epoch_count <= 2^32.
                    *slot = Some(LiveEpoch::build(&s.plan, offset as u32, s.per_epoch)?);
                }
            }
        }
        // The samples used between the two positions, as far as the old
        // live epochs know them.
        for p in s.position..position {
            match s
                .current
                .as_ref()
                .and_then(|e| e.sample_at(p))
                .or_else(|| s.next.as_ref().and_then(|e| e.sample_at(p)))
            {
                Some(sample) => changed.samples.push(sample),
                None => break,
            }
        }
        if new_current != old_current {
            let [built_current, built_next] = new_live;
            let old_next = s.next.take();
            let keep =
                |e: Option<LiveEpoch>, offset: u64| e.filter(|e| u64::from(e.offset) == offset);
            s.current = built_current.or_else(|| keep(old_next, new_current));
            s.next = built_next;
            for e in [&s.current, &s.next].into_iter().flatten() {
                if u64::from(e.offset) != old_current + 1 {
                    changed.samples.extend(e.plan.samples().iter().copied());
                }
            }
        }
        s.position = position;
        if s.position >= s.total {
            s.current = None;
            s.next = None;
        }
        self.clock = self.clock.max(s.now());
        Ok(changed)
    }

    /// Samples `a` and `b` of session `id` traded places in its delivery
    /// order (relaxed order: a late sample of the front batch swapped with
    /// a ready one of a later batch of the same epoch): each one's next use
    /// is now where the other was. The trade happens in the live epoch in
    /// which `a` comes next, if `b` is still to come in it too; otherwise
    /// nothing changes and no sample is reported. `O(1)`.
    ///
    /// # Errors
    ///
    /// [`FutureError::UnknownSession`].
    pub(crate) fn swap(&mut self, id: SessionId, a: u64, b: u64) -> Result<Changed, FutureError> {
        let s = self
            .sessions
            .get_mut(&id)
            .ok_or(FutureError::UnknownSession(id))?;
        let mut changed = Changed {
            dataset: s.dataset,
            samples: Vec::new(),
        };
        let position = s.position;
        let upcoming = |e: &LiveEpoch, x: u64| e.position_of(x).is_some_and(|p| p >= position);
        // The live epoch in which `a` comes next.
        if let Some(e) = [&mut s.current, &mut s.next]
            .into_iter()
            .flatten()
            .find(|e| upcoming(e, a))
        {
            if upcoming(e, b) && e.swap(a, b) {
                changed.samples.extend([a, b]);
            }
        }
        Ok(changed)
    }

    /// The timeline time of the next use of `sample` of `dataset` by any
    /// session, or [`NEVER`]. `O(sessions)`.
    pub(crate) fn next_use(&self, dataset: u32, sample: u64) -> u64 {
        self.sessions
            .values()
            .filter(|s| s.dataset == dataset)
            .map(|s| s.next_two_uses(sample)[0])
            .min()
            .unwrap_or(NEVER)
    }

    /// The time of the use of `sample` after the imminent one: the second
    /// smallest of all sessions' upcoming uses, or [`NEVER`]. This is how
    /// long a sample fetched now for its imminent use would have to be
    /// kept to serve another. `O(sessions)`.
    pub(crate) fn use_after_next(&self, dataset: u32, sample: u64) -> u64 {
        let mut best = [NEVER, NEVER];
        for s in self.sessions.values().filter(|s| s.dataset == dataset) {
            for t in s.next_two_uses(sample) {
                if t < best[0] {
                    best = [t, best[0]];
                } else if t < best[1] {
                    best[1] = t;
                }
            }
        }
        best[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::PlanParams;

    fn plan(n: u64, seed: u64, rank: u32, ws: u32, epochs: u32) -> SessionPlan {
        SessionPlan::for_test(n, seed, rank, ws, 4, epochs)
    }

    /// The whole delivery sequence of a session.
    fn sequence(p: &SessionPlan) -> Vec<u64> {
        p.epochs()
            .flat_map(|e| {
                EpochPlan::new(p.params(), e as u32)
                    .unwrap()
                    .samples()
                    .to_vec()
            })
            .collect()
    }

    /// Next use by brute force: the first position >= pos holding s, within
    /// the current epoch and the next.
    fn brute_next(seq: &[u64], per_epoch: u64, pos: u64, s: u64) -> u64 {
        let horizon_end = ((pos / per_epoch + 2) * per_epoch).min(seq.len() as u64);
        (pos..horizon_end)
            .find(|&p| seq[p as usize] == s)
            .unwrap_or(NEVER)
    }

    #[test]
    fn a_mixture_that_repeats_samples_gives_each_ones_nearest_use() {
        use crate::config::{MixtureConfig, MixtureSource};
        use crate::mixture::MixtureOrder;
        let source = |d: &str, repeat: f64| MixtureSource {
            dataset: d.into(),
            weight: None,
            repeat: Some(repeat),
            choose: None,
        };
        let cfg = MixtureConfig {
            name: "m".into(),
            epoch_samples: None,
            source: vec![source("a", 4.0), source("b", 0.5)],
        };
        let order = Arc::new(MixtureOrder::new(&cfg, &[5, 40]).unwrap());
        let mut params = *plan(1, 3, 0, 1, 1).params();
        params.num_samples = order.epoch_len();
        let p = SessionPlan::new(params, 0, 3)
            .unwrap()
            .with_mixture(Arc::clone(&order));
        let seq: Vec<u64> = p
            .epochs()
            .flat_map(|e| p.epoch(e as u32).unwrap().samples().to_vec())
            .collect();
        assert_eq!(seq.len(), 3 * 40);
        let mut idx = FutureIndex::new();
        idx.add_session(1, 0, p).unwrap();
        for pos in 0..seq.len() as u64 {
            idx.advance(1, pos).unwrap();
            for s in 0..45 {
                assert_eq!(
                    idx.next_use(0, s),
                    brute_next(&seq, 40, pos, s),
                    "position {pos}, sample {s}"
                );
            }
        }
    }

    #[test]
    fn next_use_matches_brute_force_through_a_session() {
        let n = 37;
        let p = plan(n, 5, 0, 1, 4);
        let seq = sequence(&p);
        let per_epoch = n;
        let mut idx = FutureIndex::new();
        idx.add_session(1, 0, p.clone()).unwrap();
        for pos in 0..=seq.len() as u64 {
            if pos > 0 {
                let changed = idx.advance(1, pos).unwrap();
                assert!(changed.samples.contains(&seq[pos as usize - 1]));
            }
            assert_eq!(idx.position(1), Some(pos));
            for s in 0..n {
                assert_eq!(
                    idx.next_use(0, s),
                    brute_next(&seq, per_epoch, pos, s),
                    "pos {pos} sample {s}"
                );
            }
        }
        // Finished: nothing is needed any more.
        assert!((0..n).all(|s| idx.next_use(0, s) == NEVER));
        assert!(idx.advance(1, seq.len() as u64 + 1).is_err());
    }

    #[test]
    fn use_after_next_and_multi_rank_horizon() {
        let n = 50;
        // Two ranks of one job: each sees half the dataset per epoch.
        let p0 = plan(n, 9, 0, 2, 3);
        let p1 = plan(n, 9, 1, 2, 3);
        let (s0, s1) = (sequence(&p0), sequence(&p1));
        let mut idx = FutureIndex::new();
        idx.add_session(10, 7, p0).unwrap();
        idx.add_session(11, 7, p1).unwrap();
        for s in 0..n {
            let b0 = brute_next(&s0, 25, 0, s);
            let b1 = brute_next(&s1, 25, 0, s);
            assert_eq!(idx.next_use(7, s), b0.min(b1));
            // Some rank needs every sample in epoch 0.
            assert!(idx.next_use(7, s) < 25);
            // Another dataset has no future.
            assert_eq!(idx.next_use(8, s), NEVER);
            // The use after next: the second smallest of the four uses
            // (two per session within the horizon).
            let mut all = vec![b0, b1];
            for (seq, first) in [(&s0, b0), (&s1, b1)] {
                all.push(if first == NEVER {
                    NEVER
                } else {
                    brute_next(seq, 25, first + 1, s)
                });
            }
            all.sort_unstable();
            assert_eq!(idx.use_after_next(7, s), all[1], "sample {s}");
        }
        assert_eq!(idx.remove_session(10).unwrap().samples.len(), 50);
        assert_eq!(idx.remove_session(10), Err(FutureError::UnknownSession(10)));
        for s in 0..n {
            assert_eq!(idx.next_use(7, s), brute_next(&s1, 25, 0, s));
        }
    }

    #[test]
    fn late_sessions_join_at_the_current_time() {
        let p = plan(20, 1, 0, 1, 2);
        let mut idx = FutureIndex::new();
        idx.add_session(1, 0, p.clone()).unwrap();
        idx.advance(1, 15).unwrap();
        assert_eq!(idx.clock(), 15);
        let q = plan(20, 2, 0, 1, 2);
        idx.add_session(2, 0, q.clone()).unwrap();
        let first_of_q = sequence(&q)[0];
        // Session 2's position 0 is time 15.
        assert!(idx.next_use(0, first_of_q) <= 15);
        assert_eq!(idx.next_use(0, first_of_q), {
            let a = brute_next(&sequence(&p), 20, 15, first_of_q);
            a.min(15)
        });
    }

    #[test]
    fn swapped_samples_take_each_others_next_use() {
        // 40 samples, one rank, batches of 4, two epochs.
        let p = plan(40, 3, 0, 1, 2);
        let seq = sequence(&p);
        let mut idx = FutureIndex::new();
        idx.add_session(1, 0, p.clone()).unwrap();
        idx.advance(1, 4).unwrap();
        // The front batch holds positions 4..8; position 5's sample is
        // late and trades places with position 17's.
        let (late, ready) = (seq[5], seq[17]);
        let before = (idx.next_use(0, late), idx.next_use(0, ready));
        assert_eq!(before, (5, 17));
        let changed = idx.swap(1, late, ready).unwrap();
        assert_eq!(changed.samples, vec![late, ready]);
        assert_eq!(idx.next_use(0, late), 17);
        assert_eq!(idx.next_use(0, ready), 5);
        assert_eq!(idx.sample_at(1, 5), Some(ready));
        assert_eq!(idx.sample_at(1, 17), Some(late));
        // Delivering the front batch uses the ready sample, not the late
        // one: the late one is still needed, at its new place.
        let used = idx.advance(1, 8).unwrap();
        assert!(used.samples.contains(&ready) && !used.samples.contains(&late));
        assert_eq!(idx.next_use(0, late), 17);
        // The ready sample's next use is now in the next epoch.
        assert_eq!(
            idx.next_use(0, ready),
            40 + seq[40..].iter().position(|&x| x == ready).unwrap() as u64
        );
        // A late sample moves again: it trades places a second time.
        idx.advance(1, 12).unwrap();
        let x = seq[13];
        assert_eq!(idx.sample_at(1, 17), Some(late));
        idx.swap(1, late, x).unwrap();
        assert_eq!(idx.sample_at(1, 13), Some(late));
        assert_eq!(idx.sample_at(1, 17), Some(x));
        assert_eq!((idx.next_use(0, late), idx.next_use(0, x)), (13, 17));
        // A sample outside the dataset, or an unknown session: nothing moves.
        assert!(idx.swap(1, late, 1000).unwrap().samples.is_empty());
        assert_eq!(idx.sample_at(1, 13), Some(late));
        assert_eq!(
            idx.swap(9, late, ready).unwrap_err(),
            FutureError::UnknownSession(9)
        );
    }

    #[test]
    fn bad_calls_are_errors() {
        let p = plan(10, 1, 0, 1, 1);
        let mut idx = FutureIndex::new();
        idx.add_session(1, 0, p.clone()).unwrap();
        assert_eq!(
            idx.add_session(1, 0, p.clone()).unwrap_err(),
            FutureError::DuplicateSession(1)
        );
        assert!(matches!(
            idx.advance(1, 11),
            Err(FutureError::BadPosition { .. })
        ));
        idx.advance(1, 5).unwrap();
        assert!(matches!(
            idx.advance(1, 4),
            Err(FutureError::BadPosition { .. })
        ));
        assert_eq!(
            idx.advance(2, 1).unwrap_err(),
            FutureError::UnknownSession(2)
        );
        assert_eq!(idx.total(1), Some(10));
        assert_eq!(idx.sample_at(1, 5), Some(sequence(&p)[5]));
        // Indices beyond the dataset are never needed.
        assert_eq!(idx.next_use(0, 10), NEVER);
        assert_eq!(idx.next_use(0, u64::MAX), NEVER);
        // A session without samples (drop_last, fewer samples than ranks).
        let empty = SessionPlan::new(
            PlanParams {
                num_samples: 3,
                seed: 0,
                rank: 0,
                world_size: 8,
                batch_size: 2,
                drop_last: true,
            },
            0,
            2,
        )
        .unwrap();
        idx.add_session(3, 0, empty).unwrap();
        assert_eq!(idx.total(3), Some(0));
        idx.advance(3, 0).unwrap();
        assert!(!FutureError::ShareTooLarge { share: 1 << 40 }
            .to_string()
            .is_empty());
    }
}
