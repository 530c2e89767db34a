//! Eviction policies: which cached sample leaves the arena when a new one
//! needs room, and whether a new one is worth keeping at all.
//!
//! A policy sees only *candidates*: retained samples that are Ready and
//! unpinned, the only ones that may be evicted. The cache tells it when a
//! sample becomes a candidate ([`EvictionPolicy::insert`]) and when it stops
//! being one ([`EvictionPolicy::remove`]: pinned or evicted), when a sample
//! is used ([`EvictionPolicy::touch`]), and about the sessions' futures.
//!
//! * [`Lru`]: evicts the least recently used candidate; admits everything.
//! * [`MinIo`] (CoorDL's MinIO): never evicts; once the retained set is
//!   full, new samples are served by transient reads that are not kept.
//! * [`Clairvoyant`] (Belady): evicts the candidate whose next use, over all
//!   sessions' known futures, is furthest away (never-again first), and
//!   bypasses a new sample whose following use is further away than every
//!   candidate's next use.
//!
//! Every operation is `O(log n)` in the number of candidates; session
//! events cost `O(log n)` per sample whose next use changed (see
//! [`FutureIndex`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use super::future::{Changed, FutureError, FutureIndex, SessionId, NEVER};
use super::sample_map::SampleMap;
use super::SampleKey;
use crate::planner::SessionPlan;

/// The eviction policy names accepted in configuration (`cache.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PolicyKind {
    /// `"clairvoyant"`: Belady's furthest-next-use eviction, with bypass.
    /// The default.
    #[default]
    Clairvoyant,
    /// `"minio"`: fill once, never evict; misses beyond that are not kept.
    Minio,
    /// `"lru"`: evict the least recently used sample.
    Lru,
}

impl PolicyKind {
    /// Every policy, in the order benchmarks report them.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Clairvoyant, PolicyKind::Minio, PolicyKind::Lru];

    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Clairvoyant => "clairvoyant",
            PolicyKind::Minio => "minio",
            PolicyKind::Lru => "lru",
        }
    }

    /// A fresh policy of this kind.
    pub fn build(self) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Clairvoyant => Box::new(Clairvoyant::new()),
            PolicyKind::Minio => Box::new(MinIo::new()),
            PolicyKind::Lru => Box::new(Lru::new()),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown cache policy {:?}: expected \"clairvoyant\", \"minio\" or \"lru\"",
            self.0
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "clairvoyant" => Ok(PolicyKind::Clairvoyant),
            "minio" => Ok(PolicyKind::Minio),
            "lru" => Ok(PolicyKind::Lru),
            other => Err(UnknownPolicy(other.to_owned())),
        }
    }
}

/// What the cache asks of an eviction policy.
///
/// The cache guarantees that `insert` is called only for a sample that is
/// not a candidate and `remove` only for one that is; a policy may rely on
/// it but must not misbehave (panic, corrupt) if a call is redundant.
pub trait EvictionPolicy: fmt::Debug + Send {
    /// The policy's kind.
    fn kind(&self) -> PolicyKind;

    /// `key` became a candidate: retained, Ready and unpinned.
    fn insert(&mut self, key: SampleKey);

    /// `key` is no longer a candidate (pinned, evicted or dropped).
    fn remove(&mut self, key: SampleKey);

    /// `key` was used (a hit or a pin). Candidates or not.
    fn touch(&mut self, _key: SampleKey) {}

    /// The number of candidates.
    fn len(&self) -> usize;

    /// Whether there is no candidate.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is a candidate.
    fn contains(&self, key: SampleKey) -> bool;

    /// The candidates in eviction order, best victim first (nothing for a
    /// policy that never evicts).
    fn victims(&self) -> Box<dyn Iterator<Item = SampleKey> + '_>;

    /// The candidate to evict first, if the policy evicts at all.
    fn victim(&self) -> Option<SampleKey> {
        self.victims().next()
    }

    /// Whether evicting `victims` (a prefix of [`victims`](Self::victims),
    /// with their extent sizes in bytes) to keep `newcomer` (`bytes` long)
    /// is worth it. `false` means the newcomer should be read without being
    /// kept (a transient read) instead.
    fn admit(&self, newcomer: SampleKey, bytes: u64, victims: &[(SampleKey, u64)]) -> bool;

    /// Whether the policy ever evicts. When it does not, a full cache serves
    /// misses with transient reads and never makes room by eviction.
    fn evicts(&self) -> bool {
        true
    }

    /// Session `id` reads `dataset` in the order of `plan` from now on.
    ///
    /// # Errors
    ///
    /// Whatever the policy's view of the future refuses; nothing changes.
    fn add_session(
        &mut self,
        _id: SessionId,
        _dataset: u32,
        _plan: SessionPlan,
    ) -> Result<(), FutureError> {
        Ok(())
    }

    /// Session `id` has been delivered its first `position` samples.
    ///
    /// # Errors
    ///
    /// Whatever the policy's view of the future refuses; nothing changes.
    fn advance_session(&mut self, _id: SessionId, _position: u64) -> Result<(), FutureError> {
        Ok(())
    }

    /// Samples `a` and `b` traded places in session `id`'s delivery order
    /// (relaxed order).
    ///
    /// # Errors
    ///
    /// Whatever the policy's view of the future refuses; nothing changes.
    fn swap_in_session(&mut self, _id: SessionId, _a: u64, _b: u64) -> Result<(), FutureError> {
        Ok(())
    }

    /// Session `id` is gone.
    ///
    /// # Errors
    ///
    /// Whatever the policy's view of the future refuses; nothing changes.
    fn remove_session(&mut self, _id: SessionId) -> Result<(), FutureError> {
        Ok(())
    }
}

/// Least recently used: candidates ordered by the time of their last use
/// (a logical tick), oldest first. A sample's last use is when it last
/// became a candidate (inserted, or unpinned after its batch was released)
/// or was touched while a candidate.
#[derive(Debug, Default)]
pub struct Lru {
    tick: u64,
    /// Candidates' last use.
    last_use: SampleMap<u64>,
    /// Candidates by last use.
    order: BTreeMap<u64, SampleKey>,
}

impl Lru {
    /// An empty LRU policy.
    pub fn new() -> Self {
        Self::default()
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

impl EvictionPolicy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn insert(&mut self, key: SampleKey) {
        if self.last_use.contains_key(&key) {
            return;
        }
        let t = self.next_tick();
        self.last_use.insert(key, t);
        self.order.insert(t, key);
    }

    fn remove(&mut self, key: SampleKey) {
        if let Some(t) = self.last_use.remove(&key) {
            self.order.remove(&t);
        }
    }

    fn touch(&mut self, key: SampleKey) {
        if self.last_use.contains_key(&key) {
            let t = self.next_tick();
            if let Some(old) = self.last_use.insert(key, t) {
                self.order.remove(&old);
            }
            self.order.insert(t, key);
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn contains(&self, key: SampleKey) -> bool {
        self.last_use.contains_key(&key)
    }

    fn victims(&self) -> Box<dyn Iterator<Item = SampleKey> + '_> {
        Box::new(self.order.values().copied())
    }

    fn admit(&self, _newcomer: SampleKey, _bytes: u64, _victims: &[(SampleKey, u64)]) -> bool {
        true
    }
}

/// CoorDL's MinIO: whatever is retained stays; nothing is ever evicted.
#[derive(Debug, Default)]
pub struct MinIo {
    candidates: SampleMap<()>,
}

impl MinIo {
    /// An empty MinIO policy.
    pub fn new() -> Self {
        Self::default()
    }
}

impl EvictionPolicy for MinIo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Minio
    }

    fn insert(&mut self, key: SampleKey) {
        self.candidates.insert(key, ());
    }

    fn remove(&mut self, key: SampleKey) {
        self.candidates.remove(&key);
    }

    fn len(&self) -> usize {
        self.candidates.len()
    }

    fn contains(&self, key: SampleKey) -> bool {
        self.candidates.contains_key(&key)
    }

    fn victims(&self) -> Box<dyn Iterator<Item = SampleKey> + '_> {
        Box::new(std::iter::empty())
    }

    fn admit(&self, _newcomer: SampleKey, _bytes: u64, _victims: &[(SampleKey, u64)]) -> bool {
        false
    }

    fn evicts(&self) -> bool {
        false
    }
}

/// Belady's policy over the sessions' known futures.
///
/// Each candidate is ordered by its next use (timeline time from the
/// [`FutureIndex`], [`NEVER`] for samples no session needs within its
/// horizon); the victim is the candidate with the largest, ties broken by
/// key. When the future changes, only the candidates among the reported
/// samples are re-keyed.
#[derive(Debug, Default)]
pub struct Clairvoyant {
    future: FutureIndex,
    next_use: SampleMap<u64>,
    order: ByNextUse,
}

impl Clairvoyant {
    /// A clairvoyant policy with no sessions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sessions' futures as this policy sees them.
    pub fn future(&self) -> &FutureIndex {
        &self.future
    }

    /// The next use recorded for candidate `key`.
    #[cfg(test)]
    pub(crate) fn candidate_next_use(&self, key: SampleKey) -> Option<u64> {
        self.next_use.get(&key).copied()
    }

    fn rekey(&mut self, changed: &Changed) {
        for &index in &changed.samples {
            let key = SampleKey {
                dataset: changed.dataset,
                index,
            };
            if let Some(old) = self.next_use.get_mut(&key) {
                let new = self.future.next_use(key.dataset, key.index);
                if *old != new {
                    self.order.remove(*old, key);
                    self.order.insert(new, key);
                    *old = new;
                }
            }
        }
    }
}

impl EvictionPolicy for Clairvoyant {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Clairvoyant
    }

    fn insert(&mut self, key: SampleKey) {
        if self.next_use.contains_key(&key) {
            return;
        }
        let t = self.future.next_use(key.dataset, key.index);
        self.next_use.insert(key, t);
        self.order.insert(t, key);
    }

    fn remove(&mut self, key: SampleKey) {
        if let Some(t) = self.next_use.remove(&key) {
            self.order.remove(t, key);
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn contains(&self, key: SampleKey) -> bool {
        self.next_use.contains_key(&key)
    }

    fn victims(&self) -> Box<dyn Iterator<Item = SampleKey> + '_> {
        Box::new(self.order.furthest_first())
    }

    /// Belady with bypass, size-aware when several victims are needed.
    ///
    /// Let `t` be the newcomer's use after its imminent one and `now` the
    /// timeline's clock. The newcomer is bypassed when `t` is [`NEVER`] or
    /// when some victim is needed no later than `t` (Belady). Victims never
    /// needed again cost nothing. Otherwise each of the `k` victims still
    /// needed would give a hit too, so the newcomer must promise more hits
    /// per byte-sample of occupancy than they do on average:
    /// `bytes × (t − now) × k < Σ size_v × (t_v − now)`. With one victim of
    /// at least the newcomer's size this always holds, and with equal sizes
    /// the rule is exactly Belady's.
    fn admit(&self, newcomer: SampleKey, bytes: u64, victims: &[(SampleKey, u64)]) -> bool {
        let t_new = self.future.use_after_next(newcomer.dataset, newcomer.index);
        if t_new == NEVER {
            return false;
        }
        let now = self.future.clock();
        let distance = |t: u64| u128::from(t.saturating_sub(now).max(1));
        let mut still_needed = 0u128;
        let mut victim_cost = 0u128;
        for &(victim, size) in victims {
            let t = self.next_use.get(&victim).copied().unwrap_or(NEVER);
            if t == NEVER {
                continue;
            }
            if t <= t_new {
                return false;
            }
            still_needed += 1;
            victim_cost = victim_cost.saturating_add(u128::from(size) * distance(t));
        }
        still_needed == 0
            || (u128::from(bytes) * distance(t_new)).saturating_mul(still_needed) < victim_cost
    }

    fn add_session(
        &mut self,
        id: SessionId,
        dataset: u32,
        plan: SessionPlan,
    ) -> Result<(), FutureError> {
        let changed = self.future.add_session(id, dataset, plan)?;
        self.rekey(&changed);
        Ok(())
    }

    fn advance_session(&mut self, id: SessionId, position: u64) -> Result<(), FutureError> {
        let changed = self.future.advance(id, position)?;
        self.rekey(&changed);
        Ok(())
    }

    fn swap_in_session(&mut self, id: SessionId, a: u64, b: u64) -> Result<(), FutureError> {
        let changed = self.future.swap(id, a, b)?;
        self.rekey(&changed);
        Ok(())
    }

    fn remove_session(&mut self, id: SessionId) -> Result<(), FutureError> {
        let changed = self.future.remove_session(id)?;
        self.rekey(&changed);
        Ok(())
    }
}

/// Candidates ordered by `(next use, key)`: one `u128` per candidate,
/// `next use << 64 | dataset << 48 | index`, which orders exactly as the
/// tuple and compares in two instructions; keys too wide to pack (dataset
/// of 2^16 or more, index of 2^48 or more: none in practice) in a set of
/// tuples beside it.
#[derive(Debug, Default)]
struct ByNextUse {
    packed: BTreeSet<u128>,
    wide: BTreeSet<(u64, SampleKey)>,
}

fn pack(t: u64, key: SampleKey) -> Option<u128> {
    (key.dataset < 1 << 16 && key.index < 1 << 48)
        .then(|| u128::from(t) << 64 | u128::from(key.dataset) << 48 | u128::from(key.index))
}

fn unpack(p: u128) -> (u64, SampleKey) {
    let low = p as u64;
    (
        (p >> 64) as u64,
        SampleKey {
            dataset: (low >> 48) as u32,
            index: low & ((1 << 48) - 1),
        },
    )
}

impl ByNextUse {
    fn insert(&mut self, t: u64, key: SampleKey) {
        match pack(t, key) {
            Some(p) => self.packed.insert(p),
            None => self.wide.insert((t, key)),
        };
    }

    fn remove(&mut self, t: u64, key: SampleKey) {
        match pack(t, key) {
            Some(p) => self.packed.remove(&p),
            None => self.wide.remove(&(t, key)),
        };
    }

    fn len(&self) -> usize {
        self.packed.len() + self.wide.len()
    }

    /// The keys, furthest next use first (ties: larger key first).
    fn furthest_first(&self) -> impl Iterator<Item = SampleKey> + '_ {
        let mut packed = self.packed.iter().rev().map(|&p| unpack(p)).peekable();
        let mut wide = self.wide.iter().rev().copied().peekable();
        std::iter::from_fn(move || {
            let take_packed = match (packed.peek(), wide.peek()) {
                (Some(a), Some(b)) => a > b,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            let next = if take_packed {
                packed.next()
            } else {
                wide.next()
            };
            next.map(|(_, k)| k)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::{EpochPlan, PlanParams};

    fn k(index: u64) -> SampleKey {
        SampleKey { dataset: 0, index }
    }

    #[test]
    fn next_use_order_packs_and_merges_like_the_tuple_set() {
        let keys = [
            SampleKey {
                dataset: 0,
                index: 3,
            },
            SampleKey {
                dataset: 2,
                index: 1,
            },
            SampleKey {
                dataset: 1 << 16,
                index: 0,
            },
            SampleKey {
                dataset: 0,
                index: 1 << 48,
            },
            SampleKey {
                dataset: (1 << 16) - 1,
                index: (1 << 48) - 1,
            },
        ];
        let mut o = ByNextUse::default();
        let mut want = BTreeSet::new();
        for (i, &key) in keys.iter().enumerate() {
            for t in [NEVER, 5, i as u64] {
                o.insert(t, key);
                want.insert((t, key));
            }
        }
        o.remove(5, keys[2]);
        want.remove(&(5, keys[2]));
        o.remove(5, keys[0]);
        want.remove(&(5, keys[0]));
        assert_eq!(o.len(), want.len());
        let got: Vec<SampleKey> = o.furthest_first().collect();
        let expected: Vec<SampleKey> = want.iter().rev().map(|&(_, k)| k).collect();
        assert_eq!(got, expected);
        assert!(o.wide.len() >= 2 && o.packed.len() >= 2);
    }

    #[test]
    fn names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.as_str().parse::<PolicyKind>(), Ok(p));
            assert_eq!(p.build().kind(), p);
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(PolicyKind::default(), PolicyKind::Clairvoyant);
        let e = "fifo".parse::<PolicyKind>().unwrap_err();
        assert!(e.to_string().contains("fifo"));
    }

    #[test]
    fn lru_orders_by_last_use() {
        let mut p = Lru::new();
        for i in 0..4 {
            p.insert(k(i));
        }
        assert_eq!(p.victim(), Some(k(0)));
        p.touch(k(0));
        assert_eq!(p.victim(), Some(k(1)));
        p.remove(k(1));
        assert!(!p.contains(k(1)));
        assert_eq!(p.victim(), Some(k(2)));
        // A sample that comes back (unpinned) is the most recent.
        p.remove(k(2));
        p.touch(k(2)); // not a candidate: ignored
        assert!(!p.contains(k(2)));
        p.insert(k(2));
        assert_eq!(p.victim(), Some(k(3)));
        p.insert(k(3)); // redundant
        assert_eq!(p.len(), 3);
        assert_eq!(p.victims().collect::<Vec<_>>(), [k(3), k(0), k(2)]);
        assert!(p.admit(k(9), 1, &[(k(3), 1)]));
    }

    #[test]
    fn minio_never_evicts() {
        let mut p = MinIo::new();
        p.insert(k(1));
        assert_eq!(p.victim(), None);
        assert!(!p.evicts());
        assert!(!p.admit(k(2), 1, &[]));
        assert_eq!(p.victims().count(), 0);
        assert_eq!(p.len(), 1);
        p.remove(k(1));
        assert!(p.is_empty());
    }

    #[test]
    fn clairvoyant_evicts_furthest_next_use_and_follows_sessions() {
        let params = PlanParams {
            num_samples: 10,
            seed: 3,
            rank: 0,
            world_size: 1,
            batch_size: 2,
            drop_last: false,
        };
        let plan = SessionPlan::new(params, 0, 2).unwrap();
        let e0 = EpochPlan::new(&params, 0).unwrap().samples().to_vec();
        let e1 = EpochPlan::new(&params, 1).unwrap().samples().to_vec();
        let mut p = Clairvoyant::new();
        for s in 0..10 {
            p.insert(k(s));
        }
        // No session: nothing is needed, any victim is fine.
        assert!(p.victim().is_some());
        p.add_session(1, 0, plan).unwrap();
        // The sample needed last in epoch 0 goes first.
        assert_eq!(p.victim(), Some(k(e0[9])));
        // Consuming the first sample moves it to its epoch-1 position (>= 10),
        // so it becomes the victim.
        p.advance_session(1, 1).unwrap();
        assert_eq!(p.candidate_next_use(k(e0[0])), Some(10 + pos(&e1, e0[0])));
        assert_eq!(p.victim(), Some(k(e0[0])));
        // Bypass: a newcomer used next at e0[1]'s slot and then in epoch 1 is
        // kept only if that second use beats the victim's next use.
        p.remove(k(e0[1]));
        let victim = p.victim().unwrap();
        let newcomer = k(e0[1]);
        let victim_next = p.candidate_next_use(victim).unwrap();
        let after = 10 + pos(&e1, e0[1]);
        assert_eq!(p.admit(newcomer, 8, &[(victim, 8)]), after < victim_next);
        // Size-aware with several victims: a newcomer needed at `after`
        // displacing two victims needed later is kept only if it is small
        // enough for its occupancy to beat theirs on average.
        let far: Vec<SampleKey> = p.victims().take(2).collect();
        let t: Vec<u64> = far
            .iter()
            .map(|&v| p.candidate_next_use(v).unwrap())
            .collect();
        if after < t[1] {
            let now = p.future().clock();
            let cost = (t[0] - now) * 8 + (t[1] - now) * 8;
            let fits = |bytes: u64| bytes * (after - now) * 2 < cost;
            let two = [(far[0], 8), (far[1], 8)];
            assert_eq!(p.admit(newcomer, 8, &two), fits(8));
            assert_eq!(p.admit(newcomer, 1000, &two), fits(1000));
            assert!(!fits(1000));
        }
        // End of the session: everything is never needed again.
        p.insert(newcomer);
        p.advance_session(1, 20).unwrap();
        assert!((0..10).all(|s| p.candidate_next_use(k(s)) == Some(NEVER)));
        assert!(!p.admit(k(1), 1, &[(k(0), 1)]));
        p.remove_session(1).unwrap();
        assert!(p.remove_session(1).is_err());
    }

    #[test]
    fn clairvoyant_follows_samples_that_traded_places() {
        let params = PlanParams {
            num_samples: 10,
            seed: 5,
            rank: 0,
            world_size: 1,
            batch_size: 2,
            drop_last: false,
        };
        let plan = SessionPlan::new(params, 0, 1).unwrap();
        let e0 = EpochPlan::new(&params, 0).unwrap().samples().to_vec();
        let mut p = Clairvoyant::new();
        for s in 0..10 {
            p.insert(k(s));
        }
        p.add_session(1, 0, plan).unwrap();
        // Strict order: the sample needed last is the victim.
        assert_eq!(p.victim(), Some(k(e0[9])));
        // Relaxed order: the front batch's second sample (late) trades places
        // with the last one (ready), which is now needed at position 1.
        p.swap_in_session(1, e0[1], e0[9]).unwrap();
        assert_eq!(p.candidate_next_use(k(e0[9])), Some(1));
        assert_eq!(p.candidate_next_use(k(e0[1])), Some(9));
        assert_eq!(p.victim(), Some(k(e0[1])), "the late sample is needed last");
        // Delivering the front batch uses the ready sample, not the late one.
        p.advance_session(1, 2).unwrap();
        assert_eq!(p.candidate_next_use(k(e0[9])), Some(NEVER));
        assert_eq!(p.candidate_next_use(k(e0[1])), Some(9));
        assert!(p.swap_in_session(2, 0, 1).is_err());
    }

    fn pos(order: &[u64], s: u64) -> u64 {
        order.iter().position(|&x| x == s).unwrap() as u64
    }
}
