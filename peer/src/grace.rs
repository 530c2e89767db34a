//! Grace for an owner that went away: the samples a requester wanted from
//! a member whose connection dropped wait, for a bounded time, for that
//! member to come back, instead of being read from the store at once.
//!
//! An agent that is killed and restarted (warm, with its arena) is back
//! within seconds and serves its keep-set again; reading its samples from
//! the store meanwhile costs every other agent store reads the job never
//! needed. So, sans-IO like the rest of the crate:
//!
//! ```text
//!  owner's connection drops ──▶ grace starts (GraceConfig::grace)
//!     gets lost with it, and new reads of its samples ──▶ parked
//!  owner back, restarted (a connection authenticated again, a new incarnation) ──▶ parked gets asked again
//!  owner back as it was (the same incarnation: the connection failed, not the owner) ──▶ Store(Rejoined), the grace ends
//!     an answer "unknown dataset" (its catalog is still loading) ──▶ parked, asked again after retry_after
//!  a loader blocked on a parked sample for GraceConfig::blocked ──▶ Store(Blocked)
//!  the grace over ──▶ every parked get Store(Expired); the member's samples read from the store as before
//! ```
//!
//! One grace per outage: a member that comes back and drops again within
//! the same grace does not start a new one. A grace of 0 turns it off
//! ([`Grace::enabled`]): every sample of a dropped owner goes to the store
//! at once, as before. The caller dials an awaited member every
//! [`GraceConfig::probe_every`] ([`Grace::probes`]), so that a restarted
//! member is found as soon as it listens, and says which parked samples a
//! loader is blocked on ([`Grace::mark_blocked`]).

use crate::conn::Nanos;
use crate::request::Sample;

/// The grace's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraceConfig {
    /// How long after a member's connection dropped its samples wait for
    /// it; 0 turns the grace off.
    pub grace: Nanos,
    /// How long a parked sample a loader is blocked on may wait (within
    /// the grace) before it is read from the store.
    pub blocked: Nanos,
    /// How often an awaited member is dialled.
    pub probe_every: Nanos,
    /// How soon a sample is asked again after a member back answered that
    /// it does not know the dataset yet.
    pub retry_after: Nanos,
}

impl Default for GraceConfig {
    fn default() -> Self {
        GraceConfig {
            grace: 10_000_000_000,
            blocked: 1_000_000_000,
            probe_every: 100_000_000,
            retry_after: 100_000_000,
        }
    }
}

/// A sample waiting for its owner.
#[derive(Debug)]
pub struct Parked<T> {
    /// The caller's token.
    pub token: T,
    /// The owner.
    pub member: usize,
    /// The sample.
    pub want: Sample,
    /// Whether it was asked of the owner and lost with its connection
    /// (rather than parked before it was asked, or answered with a miss).
    pub asked: bool,
    /// Not asked again before this time.
    not_before: Nanos,
    /// Since when a loader has been blocked on it.
    blocked_since: Option<Nanos>,
}

/// Why a parked sample goes to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraceEnd {
    /// Its owner's grace ended without the owner serving it.
    Expired,
    /// A loader was blocked on it for [`GraceConfig::blocked`].
    Blocked,
    /// Its owner came back with the incarnation it had: it never went
    /// away, its connection failed (read the store, as without a grace).
    Rejoined,
}

impl GraceEnd {
    /// A short name, as metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            GraceEnd::Expired => "expired",
            GraceEnd::Blocked => "blocked",
            GraceEnd::Rejoined => "rejoined",
        }
    }
}

/// What becomes of a parked sample.
#[derive(Debug, PartialEq, Eq)]
pub enum Release<T> {
    /// Ask its owner again: it is back.
    Ask {
        /// The caller's token.
        token: T,
        /// The owner.
        member: usize,
        /// The sample.
        want: Sample,
    },
    /// Read it from the store.
    Store {
        /// The caller's token.
        token: T,
        /// The owner it waited for.
        member: usize,
        /// Whether it had been asked of the owner ([`Parked::asked`]).
        asked: bool,
        /// Why.
        why: GraceEnd,
    },
}

/// What an owner's return means ([`Grace::back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Back {
    /// It was not awaited.
    NotAwaited,
    /// It was awaited and comes back restarted (another incarnation, or
    /// none known): its parked gets are asked again.
    Restarted,
    /// It was awaited and comes back with the incarnation it had: its
    /// parked gets go to the store and its grace ends.
    Rejoined,
}

#[derive(Clone, Copy, Debug, Default)]
struct Owner {
    /// When its connection dropped, while its grace runs.
    dropped: Option<Nanos>,
    /// Whether a connection to it is up again.
    back: bool,
    /// When it was last dialled.
    probed: Option<Nanos>,
    /// Its incarnation, as its last connection said.
    incarnation: Option<u64>,
}

/// The parked samples of one agent (see the module documentation).
#[derive(Debug)]
pub struct Grace<T> {
    cfg: GraceConfig,
    owners: Vec<Owner>,
    parked: Vec<Parked<T>>,
    /// Released outside [`Grace::poll`] (an owner rejoined), handed out
    /// by the next poll.
    released: Vec<Release<T>>,
}

impl<T> Grace<T> {
    /// The grace of a view of `members` members.
    pub fn new(cfg: GraceConfig, members: usize) -> Grace<T> {
        Grace {
            cfg,
            owners: vec![Owner::default(); members],
            parked: Vec::new(),
            released: Vec::new(),
        }
    }

    /// Whether a dropped owner is waited for at all.
    pub fn enabled(&self) -> bool {
        self.cfg.grace > 0
    }

    /// The settings.
    pub fn config(&self) -> GraceConfig {
        self.cfg
    }

    /// Parked samples (and those released, not yet polled).
    pub fn len(&self) -> usize {
        self.parked.len() + self.released.len()
    }

    /// Whether none is parked or released.
    pub fn is_empty(&self) -> bool {
        self.parked.is_empty() && self.released.is_empty()
    }

    /// The parked samples.
    pub fn parked(&self) -> impl Iterator<Item = &Parked<T>> {
        self.parked.iter()
    }

    fn running(&self, member: usize, now: Nanos) -> Option<&Owner> {
        let o = self.owners.get(member)?;
        let t = o.dropped?;
        (self.enabled() && now < t.saturating_add(self.cfg.grace)).then_some(o)
    }

    /// The connection to `member` dropped (or it said it is shutting
    /// down): its grace starts, unless one is running.
    pub fn dropped(&mut self, member: usize, now: Nanos) {
        if !self.enabled() {
            return;
        }
        let running = self.running(member, now).is_some();
        let Some(o) = self.owners.get_mut(member) else {
            return;
        };
        if !running {
            o.dropped = Some(now);
            o.probed = None;
        }
        o.back = false;
    }

    /// An authenticated connection to `member` is up, the member saying
    /// it is `incarnation`. When it was awaited: restarted, its parked
    /// samples are asked again at the next [`poll`](Self::poll); the same
    /// incarnation as before (it never went away: its connection failed),
    /// they go to the store and its grace ends.
    pub fn back(&mut self, member: usize, incarnation: u64, now: Nanos) -> Back {
        let awaited = self.awaits(member, now);
        let Some(o) = self.owners.get_mut(member) else {
            return Back::NotAwaited;
        };
        let before = o.incarnation.replace(incarnation);
        o.back = true;
        if !awaited {
            return Back::NotAwaited;
        }
        if before != Some(incarnation) {
            return Back::Restarted;
        }
        o.dropped = None;
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].member == member {
                let p = self.parked.swap_remove(i);
                self.released.push(Release::Store {
                    token: p.token,
                    member,
                    asked: p.asked,
                    why: GraceEnd::Rejoined,
                });
            } else {
                i += 1;
            }
        }
        Back::Rejoined
    }

    /// Whether a read of a sample `member` owns waits for it now: its
    /// grace runs and it is not back.
    pub fn awaits(&self, member: usize, now: Nanos) -> bool {
        self.running(member, now).is_some_and(|o| !o.back)
    }

    /// Whether `member`'s grace runs (back or not): a get lost with its
    /// connection, or answered "unknown dataset" by it, waits again.
    pub fn within(&self, member: usize, now: Nanos) -> bool {
        self.running(member, now).is_some()
    }

    /// Parks a read of `want` for `member` (`asked`: it was asked of the
    /// member and lost with its connection), asked again once the member is back, not before
    /// `now + delay`.
    pub fn park(
        &mut self,
        token: T,
        member: usize,
        want: Sample,
        asked: bool,
        now: Nanos,
        delay: Nanos,
    ) {
        self.parked.push(Parked {
            token,
            member,
            want,
            asked,
            not_before: now.saturating_add(delay),
            blocked_since: None,
        });
    }

    /// The retry delay after a member back answered "unknown dataset".
    pub fn retry_after(&self) -> Nanos {
        self.cfg.retry_after
    }

    /// Marks the parked samples a loader is blocked on (`blocked(token)`),
    /// from `now` unless marked before.
    pub fn mark_blocked(&mut self, now: Nanos, mut blocked: impl FnMut(&T) -> bool) {
        for p in &mut self.parked {
            if p.blocked_since.is_none() && blocked(&p.token) {
                p.blocked_since = Some(now);
            }
        }
    }

    /// The awaited members to dial now (each at most every
    /// [`GraceConfig::probe_every`]).
    pub fn probes(&mut self, now: Nanos) -> Vec<usize> {
        let mut out = Vec::new();
        for m in 0..self.owners.len() {
            if !self.awaits(m, now) {
                continue;
            }
            let o = &mut self.owners[m];
            if o.probed
                .is_none_or(|p| now.saturating_sub(p) >= self.cfg.probe_every)
            {
                o.probed = Some(now);
                out.push(m);
            }
        }
        out
    }

    /// Advances to `now`: parked samples whose owner is back are asked
    /// again, those whose grace ended or whose loader waited
    /// [`GraceConfig::blocked`] go to the store; appended to `out`.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<Release<T>>) {
        out.append(&mut self.released);
        let mut i = 0;
        while i < self.parked.len() {
            let p = &self.parked[i];
            let owner = self.running(p.member, now).copied();
            let release = match owner {
                None => Some(Some(GraceEnd::Expired)),
                Some(_)
                    if p.blocked_since
                        .is_some_and(|b| now.saturating_sub(b) >= self.cfg.blocked) =>
                {
                    Some(Some(GraceEnd::Blocked))
                }
                Some(o) if o.back && now >= p.not_before => Some(None),
                Some(_) => None,
            };
            let Some(end) = release else {
                i += 1;
                continue;
            };
            let p = self.parked.swap_remove(i);
            out.push(match end {
                Some(why) => Release::Store {
                    token: p.token,
                    member: p.member,
                    asked: p.asked,
                    why,
                },
                None => Release::Ask {
                    token: p.token,
                    member: p.member,
                    want: p.want,
                },
            });
        }
        for o in &mut self.owners {
            if o.dropped
                .is_some_and(|t| now >= t.saturating_add(self.cfg.grace))
            {
                *o = Owner {
                    back: o.back,
                    ..Owner::default()
                };
            }
        }
    }

    /// Every parked sample, for the store (the view changed, the tier
    /// stops).
    pub fn drain(&mut self) -> Vec<T> {
        let released = self.released.drain(..).map(|r| match r {
            Release::Ask { token, .. } | Release::Store { token, .. } => token,
        });
        let mut out: Vec<T> = released.collect();
        out.extend(self.parked.drain(..).map(|p| p.token));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn cfg() -> GraceConfig {
        GraceConfig {
            grace: 3000 * MS,
            blocked: 500 * MS,
            probe_every: 100 * MS,
            retry_after: 100 * MS,
        }
    }

    fn want(sample: u64) -> Sample {
        Sample {
            fingerprint: 9,
            sample,
            length: 3,
        }
    }

    fn polled(g: &mut Grace<u64>, now: Nanos) -> Vec<Release<u64>> {
        let mut out = Vec::new();
        g.poll(now, &mut out);
        out
    }

    /// [`polled`], in token order.
    fn polled_by_token(g: &mut Grace<u64>, now: Nanos) -> Vec<Release<u64>> {
        let mut out = polled(g, now);
        out.sort_by_key(|r| match r {
            Release::Store { token, .. } | Release::Ask { token, .. } => *token,
        });
        out
    }

    /// Member `member`'s samples `(token, asked)` sent to the store as `why`.
    fn to_store(member: usize, why: GraceEnd, tokens: &[(u64, bool)]) -> Vec<Release<u64>> {
        let store = |&(token, asked)| Release::Store {
            token,
            member,
            asked,
            why,
        };
        tokens.iter().map(store).collect()
    }

    #[test]
    fn a_dropped_owner_is_awaited_within_the_grace_and_read_from_the_store_after() {
        let mut g: Grace<u64> = Grace::new(cfg(), 3);
        assert!(!g.awaits(1, 0), "no grace before a drop");
        g.dropped(1, 1000 * MS);
        assert!(g.awaits(1, 1000 * MS) && g.within(1, 1000 * MS));
        assert!(!g.awaits(2, 1000 * MS), "only the dropped member");
        g.park(7, 1, want(7), true, 1000 * MS, 0);
        g.park(8, 1, want(8), false, 2000 * MS, 0);
        // Nothing is released while the grace runs and the owner is away.
        for t in [1000, 2000, 3999] {
            assert!(polled(&mut g, t * MS).is_empty(), "at {t} ms");
        }
        assert_eq!(g.len(), 2);
        // The grace ends 3 s after the drop, for both.
        assert_eq!(
            polled_by_token(&mut g, 4000 * MS),
            to_store(1, GraceEnd::Expired, &[(7, true), (8, false)])
        );
        assert!(!g.awaits(1, 4000 * MS) && !g.within(1, 4000 * MS));
        // A later drop starts a new grace.
        g.dropped(1, 9000 * MS);
        assert!(g.awaits(1, 9000 * MS));
    }

    #[test]
    fn an_owner_back_ends_the_wait_at_once() {
        let mut g: Grace<u64> = Grace::new(cfg(), 3);
        g.dropped(2, 0);
        g.park(1, 2, want(1), true, 0, 0);
        g.park(2, 2, want(2), false, 0, 0);
        assert!(polled(&mut g, 200 * MS).is_empty());
        assert_eq!(
            g.back(2, 77, 300 * MS),
            Back::Restarted,
            "no incarnation known"
        );
        assert!(!g.awaits(2, 300 * MS), "new reads go to it");
        assert!(g.within(2, 300 * MS), "its grace still covers lost gets");
        let out = polled(&mut g, 300 * MS);
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|r| matches!(r, Release::Ask { member: 2, .. })));
        // It answers "unknown dataset" (its catalog is loading): parked
        // again, asked after the retry delay.
        g.park(1, 2, want(1), true, 400 * MS, g.retry_after());
        assert!(polled(&mut g, 450 * MS).is_empty());
        assert_eq!(
            polled(&mut g, 500 * MS),
            [Release::Ask {
                token: 1,
                member: 2,
                want: want(1)
            }]
        );
        // Dropping again within the same grace does not extend it.
        g.dropped(2, 1000 * MS);
        assert!(g.awaits(2, 2999 * MS) && !g.awaits(2, 3000 * MS));
    }

    #[test]
    fn an_owner_back_as_it_was_sends_its_parked_samples_to_the_store() {
        let mut g: Grace<u64> = Grace::new(cfg(), 3);
        // Its incarnation, from its first connection.
        assert_eq!(g.back(1, 5, 0), Back::NotAwaited);
        g.dropped(1, 100 * MS);
        g.park(1, 1, want(1), true, 100 * MS, 0);
        g.park(2, 1, want(2), false, 100 * MS, 0);
        g.park(3, 2, want(3), false, 100 * MS, 0);
        g.dropped(2, 100 * MS);
        // Member 1 reconnects as incarnation 5: it never went away (its
        // connection was cut), so its samples go to the store, as without
        // a grace, and the grace ends.
        assert_eq!(g.back(1, 5, 200 * MS), Back::Rejoined);
        assert!(!g.within(1, 200 * MS));
        assert_eq!(
            polled_by_token(&mut g, 200 * MS),
            to_store(1, GraceEnd::Rejoined, &[(1, true), (2, false)])
        );
        // Member 2's sample still waits; it comes back restarted.
        assert_eq!(g.len(), 1);
        assert_eq!(g.back(2, 9, 300 * MS), Back::Restarted);
        assert!(matches!(
            polled(&mut g, 300 * MS)[..],
            [Release::Ask { token: 3, .. }]
        ));
        // A later drop of member 1 starts a new grace.
        g.dropped(1, 400 * MS);
        assert!(g.awaits(1, 400 * MS));
        assert_eq!(g.back(1, 6, 500 * MS), Back::Restarted);
    }

    #[test]
    fn a_sample_a_loader_is_blocked_on_waits_only_the_blocked_bound() {
        let mut g: Grace<u64> = Grace::new(cfg(), 2);
        g.dropped(1, 0);
        g.park(1, 1, want(1), false, 0, 0);
        g.park(2, 1, want(2), false, 0, 0);
        g.mark_blocked(100 * MS, |&t| t == 1);
        // Marked again later: the first mark counts.
        g.mark_blocked(300 * MS, |_| true);
        assert!(polled(&mut g, 599 * MS).is_empty());
        assert_eq!(
            polled(&mut g, 600 * MS),
            to_store(1, GraceEnd::Blocked, &[(1, false)])
        );
        assert_eq!(
            polled(&mut g, 800 * MS),
            to_store(1, GraceEnd::Blocked, &[(2, false)])
        );
        // A bound of 0: at once.
        let mut g: Grace<u64> = Grace::new(
            GraceConfig {
                blocked: 0,
                ..cfg()
            },
            2,
        );
        g.dropped(1, 0);
        g.park(1, 1, want(1), false, 0, 0);
        g.mark_blocked(10 * MS, |_| true);
        assert_eq!(polled(&mut g, 10 * MS).len(), 1);
    }

    #[test]
    fn an_awaited_owner_is_probed_every_probe_period_until_it_is_back() {
        let mut g: Grace<u64> = Grace::new(cfg(), 3);
        assert!(g.probes(0).is_empty());
        g.dropped(1, 0);
        assert_eq!(g.probes(0), [1]);
        assert!(g.probes(50 * MS).is_empty());
        assert_eq!(g.probes(100 * MS), [1]);
        g.back(1, 3, 150 * MS);
        assert!(g.probes(300 * MS).is_empty(), "back: not probed");
        g.dropped(1, 400 * MS);
        assert_eq!(g.probes(400 * MS), [1]);
        polled(&mut g, 3000 * MS);
        assert!(g.probes(3000 * MS).is_empty(), "grace over");
    }

    #[test]
    fn a_grace_of_zero_waits_for_nothing() {
        let mut g: Grace<u64> = Grace::new(GraceConfig { grace: 0, ..cfg() }, 2);
        assert!(!g.enabled());
        g.dropped(1, 0);
        assert!(!g.awaits(1, 0) && !g.within(1, 0));
        assert!(g.probes(0).is_empty());
        // Anything parked anyway goes to the store at the next poll.
        g.park(1, 1, want(1), false, 0, 0);
        assert_eq!(polled(&mut g, 0).len(), 1);
        assert!(g.is_empty());
    }
}
