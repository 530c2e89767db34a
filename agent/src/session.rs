//! One loader session as the agent sees it, and the life of its batches.
//!
//! A session walks its [`SessionPlan`] (the known future) a window ahead of
//! its loader. Each batch goes through four steps, each one a method here:
//!
//! 1. **plan** ([`Session::plan_ahead`]): the next batches of the plan join
//!    the window of batches being prepared (slow start: the window grows by
//!    one per published batch up to its maximum);
//! 2. **request** ([`Session::request_with`]): each sample of the window is
//!    looked up, pinned or read by the caller, in delivery order;
//! 3. **take publishable** ([`Session::take_publishable`]): the front batch
//!    leaves the window once every sample is present (ready or failed);
//! 4. **lend / return** ([`Session::lend`], [`Session::reclaim`]): a
//!    published batch is on loan until the loader releases it; what it pins
//!    comes back then.
//!
//! The session knows nothing of the cache or the sources: the engine passes
//! closures that answer for them, so every step is testable on its own.

use crate::extent::Extent;
use crate::planner::{PlanError, SessionCursor, SessionPlan};
use crate::server::ConnId;
use granary_shm::lease::LeaseTable;
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::AgentSegment;
use granary_shm::{BatchDescriptor, ReleaseDescriptor, Violation};
use std::collections::VecDeque;
use std::time::Instant;

/// One sample of a batch being prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The sample's index in its dataset.
    pub sample: u64,
    /// Whether this batch holds a cache pin on it: set when the slot is
    /// requested (every requested slot is pinned).
    pub pinned: bool,
    /// The sample's size, counted towards the session's pinned bytes.
    pub bytes: u64,
}

/// A batch being prepared: its samples in delivery order.
#[derive(Debug)]
pub(crate) struct PendingBatch {
    /// Epoch.
    pub epoch: u32,
    /// Index within the epoch for this rank.
    pub index: u64,
    /// The samples; the first `requested` have been looked up.
    pub slots: Vec<Slot>,
    /// How many leading slots have been requested.
    pub requested: usize,
    /// Last batch of its epoch.
    pub last_of_epoch: bool,
}

impl PendingBatch {
    /// The bytes of its samples.
    pub(crate) fn bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.bytes).sum()
    }

    /// Whether every slot has been requested.
    pub(crate) fn fully_requested(&self) -> bool {
        self.requested == self.slots.len()
    }

    /// The samples this batch holds pins on.
    pub(crate) fn pinned_samples(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots[..self.requested]
            .iter()
            .filter(|s| s.pinned)
            .map(|s| s.sample)
    }
}

/// What the request step's caller decided for one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Requested; the batch now holds a pin on it.
    Pinned,
    /// Not now (no read budget or no room): stop requesting this turn.
    Stop,
}

/// What a lent batch holds on to until the loader releases it.
#[derive(Debug)]
pub(crate) struct Loan {
    /// The batch's samples (dataset indices) in the order of its sample
    /// table; the batch holds one pin on each.
    pub pinned: Vec<u64>,
    /// Arena extent of the sample table.
    pub table: Option<Extent>,
    /// The batch's bytes, counted towards the session's pinned bytes
    /// until the loan comes back.
    pub bytes: u64,
}

/// A session.
pub(crate) struct Session {
    id: u64,
    conn: ConnId,
    dataset: usize,
    cursor: SessionCursor,
    /// The agent's side of the ring segment.
    segment: AgentSegment,
    /// Ready ring (agent produces).
    pub(crate) ready: Producer<BatchDescriptor>,
    /// Release ring (agent consumes).
    release: Consumer<ReleaseDescriptor>,
    leases: LeaseTable<Loan>,
    pending: VecDeque<PendingBatch>,
    /// The next batch of the plan, planned but kept out of the window
    /// while it would take the session past `max_held_bytes`.
    held_back: Option<PendingBatch>,
    /// Bytes of the batches being prepared and on loan.
    held_bytes: u64,
    /// `sessions.max_pinned_percent` of the sample cache, in bytes.
    max_held_bytes: u64,
    window: u32,
    max_window: u32,
    next_seq: u64,
    planned_all: bool,
    ended: bool,
    /// When the loader was last heard from (a release or a heartbeat).
    last_heard: Instant,
    /// The loader's heartbeat word when last read.
    loader_beat: u64,
    /// `[local, peer, uncached]` samples of the batches planned since the
    /// engine last took the counts (see [`Session::take_placed`]).
    placed: [u64; 3],
    /// The plan's placement mode (`exact`, `locality`), when it counts.
    placement_mode: Option<&'static str>,
    /// The rank the session's plan is for.
    rank: u32,
    /// Its waits and stalls, for the verdicts ([`crate::why`]).
    pub(crate) waits: crate::why::SessionWaits,
    /// The batch it opened at, counted across its epochs.
    first_batch: u64,
    /// How fast its loader releases batches (`prefetch.balance = "stall"`).
    releases: crate::balance::ReleaseRate,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("dataset", &self.dataset)
            .field("pending", &self.pending.len())
            .field("loans", &self.leases.len())
            .field("window", &self.window)
            .field("next_seq", &self.next_seq)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// How a session is set up ([`Session::new`]).
pub(crate) struct SessionSetup {
    /// Session id.
    pub id: u64,
    /// Owning connection.
    pub conn: ConnId,
    /// Index of the dataset in the engine's table.
    pub dataset: usize,
    /// The plan (shared with the cache's future index).
    pub plan: SessionPlan,
    /// The ring segment, endpoints not yet taken.
    pub segment: AgentSegment,
    /// Key of the lease table's tokens.
    pub lease_key: u64,
    /// Window at the start (slow start).
    pub initial_window: u32,
    /// Largest window.
    pub max_window: u32,
    /// Most bytes the batches being prepared and on loan may hold (one
    /// batch larger than this still goes alone).
    pub max_held_bytes: u64,
    /// Now, on the engine's clock.
    pub now: Instant,
    /// The first epoch's first batch to deliver (0: the epoch's first).
    pub first_batch: u64,
}

impl Session {
    /// Builds a session over its segment endpoints.
    pub fn new(setup: SessionSetup) -> Session {
        let SessionSetup {
            id,
            conn,
            dataset,
            plan,
            mut segment,
            lease_key,
            initial_window,
            max_window,
            max_held_bytes,
            now,
            first_batch,
        } = setup;
        let (ready, release) = segment
            .take_endpoints()
            .expect("a fresh segment has its endpoints");
        let loader_beat = segment.loader_heartbeat();
        let rank = plan.params().rank;
        let waits = crate::why::SessionWaits {
            last: segment.loader_report(),
            ..Default::default()
        };
        Session {
            id,
            conn,
            dataset,
            cursor: plan.cursor_at(first_batch),
            segment,
            ready,
            release,
            leases: LeaseTable::new(lease_key),
            pending: VecDeque::new(),
            held_back: None,
            held_bytes: 0,
            max_held_bytes,
            window: initial_window.clamp(1, max_window.max(1)),
            max_window: max_window.max(1),
            next_seq: 0,
            planned_all: false,
            ended: false,
            last_heard: now,
            loader_beat,
            placed: [0; 3],
            placement_mode: plan.placement_mode(),
            rank,
            waits,
            first_batch,
            releases: crate::balance::ReleaseRate::default(),
        }
    }

    /// What the read balance needs to know of this session at `now`
    /// ([`crate::balance`]): its lead over the loader in batches (published
    /// and not taken, plus the requested share of the batches being
    /// prepared), its release rate, and how many samples of its window are
    /// not yet requested.
    pub(crate) fn need(&mut self, now: Instant) -> crate::balance::Need {
        let ready = self.ready.unconsumed().unwrap_or(0) as f64;
        let mut wants = 0;
        let mut preparing = 0.0;
        for b in &self.pending {
            wants += b.slots.len() - b.requested;
            preparing += b.requested as f64 / b.slots.len().max(1) as f64;
        }
        crate::balance::Need {
            lead: ready + preparing,
            rate: self.releases.per_second(now),
            wants,
            batch: self.plan().params().batch_size.max(1) as usize,
        }
    }

    /// The plan walked.
    pub(crate) fn plan(&self) -> &crate::planner::SessionPlan {
        self.cursor.plan()
    }

    /// The committed position: the batch it opened at plus the batches
    /// its loader took from the ready ring (returned by `next_batch`; the
    /// end-of-stream marker is not one), counted across its epochs. `None`
    /// when the loader broke the ring's indices (the session is fenced).
    pub(crate) fn committed(&mut self) -> Option<u64> {
        let unconsumed = self.ready.unconsumed().ok()? as u64;
        let published = self.ready.tail() - self.ready.staged() as u64;
        let taken = published.saturating_sub(unconsumed);
        let batches = self.next_seq - u64::from(self.ended);
        Some(self.first_batch + taken.min(batches))
    }

    /// The rank the session's plan is for.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The `mode` label of the placement counts, when the plan counts.
    pub fn placement_mode(&self) -> Option<&'static str> {
        self.placement_mode
    }

    /// The placement counts of the batches planned since the last call.
    pub fn take_placed(&mut self) -> [u64; 3] {
        std::mem::take(&mut self.placed)
    }

    /// Session id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The connection that opened it.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Index of its dataset in the engine's table.
    pub fn dataset(&self) -> usize {
        self.dataset
    }

    /// The agent's side of its ring segment.
    pub fn segment(&self) -> &AgentSegment {
        &self.segment
    }

    /// Batches on loan.
    pub(crate) fn loans(&self) -> usize {
        self.leases.len()
    }

    /// The batches on loan, in no order.
    pub fn loaned(&self) -> impl Iterator<Item = &Loan> + '_ {
        self.leases.iter().map(|(_, loan)| loan)
    }

    /// Batches being prepared.
    pub fn pending(&self) -> &VecDeque<PendingBatch> {
        &self.pending
    }

    /// Bytes of the batches being prepared and on loan.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The most bytes its batches may hold (`sessions.max_pinned_percent`).
    #[cfg(test)]
    pub(crate) fn max_held_bytes(&self) -> u64 {
        self.max_held_bytes
    }

    /// The current window, in batches.
    #[cfg(test)]
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Whether END_OF_STREAM has been published.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Step 1: plans batches until the window is full or the plan ends.
    /// Batches on loan (published, whether or not the loader took them, and
    /// not yet released) count towards the window: their samples and sample
    /// tables stay pinned until released, so neither a deep ready ring nor a
    /// loader that takes batches and never releases them stretches it. A
    /// session thus never holds more than its largest window of batches.
    ///
    /// The bytes of those batches (`size(sample)` each) count towards
    /// `max_held_bytes` too: a batch that would take the session past it
    /// waits for releases, unless the session holds nothing, so that a
    /// batch larger than the cap still goes (alone).
    pub(crate) fn plan_ahead(&mut self, size: impl Fn(u64) -> u64) -> Result<(), PlanError> {
        let on_loan = self.leases.len();
        while self.pending.len().saturating_add(on_loan) < self.window as usize {
            let next = match self.held_back.take() {
                Some(b) => b,
                None if self.planned_all => break,
                None => match self.cursor.next_batch()? {
                    Some(b) => {
                        if let Some(p) = b.placed {
                            for (total, n) in self.placed.iter_mut().zip(p) {
                                *total += u64::from(n);
                            }
                        }
                        PendingBatch {
                            epoch: b.epoch,
                            index: b.index,
                            slots: b
                                .samples
                                .iter()
                                .map(|&sample| Slot {
                                    sample,
                                    pinned: false,
                                    bytes: size(sample),
                                })
                                .collect(),
                            requested: 0,
                            last_of_epoch: b.last_of_epoch,
                        }
                    }
                    None => {
                        self.planned_all = true;
                        break;
                    }
                },
            };
            let bytes = next.bytes();
            let holds_nothing = self.pending.is_empty() && on_loan == 0;
            if !holds_nothing && self.held_bytes.saturating_add(bytes) > self.max_held_bytes {
                self.held_back = Some(next);
                break;
            }
            self.held_bytes = self.held_bytes.saturating_add(bytes);
            self.pending.push_back(next);
        }
        Ok(())
    }

    /// Step 2: offers every sample of the window not yet requested, in
    /// delivery order, to `decide(epoch, sample)`, until it answers
    /// [`Request::Stop`]. Returns whether any sample was requested.
    pub(crate) fn request_with(&mut self, mut decide: impl FnMut(u32, u64) -> Request) -> bool {
        let mut moved = false;
        for b in self.pending.iter_mut() {
            while b.requested < b.slots.len() {
                let slot = &mut b.slots[b.requested];
                match decide(b.epoch, slot.sample) {
                    Request::Stop => return moved,
                    Request::Pinned => slot.pinned = true,
                }
                b.requested += 1;
                moved = true;
            }
        }
        moved
    }

    /// Relaxed order: every sample of the front batch that is not present
    /// trades places with a ready sample of a later batch of the same epoch
    /// (already requested, so pinned by its batch: the pin moves with the
    /// sample). The late sample moves back and keeps its pin; nothing is
    /// added or dropped, so each epoch still delivers its samples exactly
    /// once. `swapped(late, ready)` is told of every trade (for the cache's
    /// future index). Returns how many samples moved forward.
    pub(crate) fn relax_front(
        &mut self,
        present: impl Fn(u64) -> bool,
        ready: impl Fn(u64) -> bool,
        mut swapped: impl FnMut(u64, u64),
    ) -> u64 {
        let Some((front, later)) = self.pending.make_contiguous().split_first_mut() else {
            return 0;
        };
        let mut swaps = 0;
        // Where the search for a ready sample stands: (later batch, slot).
        let (mut b, mut k) = (0usize, 0usize);
        for i in 0..front.requested {
            if present(front.slots[i].sample) {
                continue;
            }
            loop {
                let Some(donor) = later.get_mut(b) else {
                    return swaps;
                };
                if donor.epoch != front.epoch {
                    return swaps;
                }
                if k >= donor.requested {
                    (b, k) = (b + 1, 0);
                    continue;
                }
                if ready(donor.slots[k].sample) {
                    swapped(front.slots[i].sample, donor.slots[k].sample);
                    std::mem::swap(&mut front.slots[i], &mut donor.slots[k]);
                    swaps += 1;
                    k += 1;
                    break;
                }
                k += 1;
            }
        }
        swaps
    }

    /// Step 3: the front batch, once all its samples are requested and
    /// `present`. The window grows by one (slow start).
    pub(crate) fn take_publishable(
        &mut self,
        present: impl Fn(u64) -> bool,
    ) -> Option<PendingBatch> {
        let front = self.pending.front()?;
        if !front.fully_requested() || !front.slots.iter().all(|s| present(s.sample)) {
            return None;
        }
        self.window = (self.window + 1).min(self.max_window);
        self.pending.pop_front()
    }

    /// Whether the plan is exhausted and every batch has left the window:
    /// the end of the stream is due.
    pub(crate) fn at_end_of_stream(&self) -> bool {
        self.planned_all && self.held_back.is_none() && self.pending.is_empty() && !self.ended
    }

    /// Step 4: lends a batch (or the end-of-stream marker, holding nothing)
    /// under the next sequence number; returns `(seq, token)`.
    /// The loan's bytes must be those of the batch it publishes (taken
    /// from the window by [`take_publishable`](Self::take_publishable)).
    pub fn lend(&mut self, loan: Loan, end_of_stream: bool) -> (u64, u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if end_of_stream {
            self.ended = true;
        }
        let token = self.leases.lend(seq, loan).unwrap_or(0);
        (seq, token)
    }

    /// Step 4, back: pops up to `buf.len()` releases from the release ring
    /// and resolves each through the lease table into `loans`. Returns how
    /// many releases were popped (0: none waiting), or the violation that
    /// must fence the session (loans resolved before it are in `loans`).
    pub fn reclaim(
        &mut self,
        buf: &mut [ReleaseDescriptor],
        loans: &mut Vec<Loan>,
        now: Instant,
    ) -> Result<usize, Violation> {
        let n = self.release.pop_into(buf)?;
        if n > 0 {
            self.last_heard = now;
            self.releases.record(n, now);
        }
        for rel in &buf[..n] {
            let loan = self.leases.reclaim(rel)?;
            self.held_bytes = self.held_bytes.saturating_sub(loan.bytes);
            loans.push(loan);
        }
        Ok(n)
    }

    /// Reads the loader's heartbeat word; a change counts as being heard
    /// from at `now`. Returns how long the loader has been silent.
    pub fn silence(&mut self, now: Instant) -> std::time::Duration {
        let beat = self.segment.loader_heartbeat();
        if beat != self.loader_beat {
            self.loader_beat = beat;
            self.last_heard = now;
        }
        now.saturating_duration_since(self.last_heard)
    }

    /// Takes everything the session still holds, for the engine to give
    /// back: the loans, and the samples pinned by batches being prepared.
    pub(crate) fn take_holdings(&mut self) -> (Vec<Loan>, Vec<u64>) {
        self.held_bytes = 0;
        self.held_back = None;
        let loans = self.leases.drain().map(|(_, l)| l).collect();
        let pins = self
            .pending
            .drain(..)
            .flat_map(|b| b.pinned_samples().collect::<Vec<_>>())
            .collect();
        (loans, pins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::PlanParams;
    use granary_shm::segment::SegmentSpec;

    fn session(n: u64, batch: u32, epochs: u32, window: u32) -> Session {
        session_from(n, batch, epochs, 1, window)
    }

    fn session_from(n: u64, batch: u32, epochs: u32, initial: u32, window: u32) -> Session {
        let params = PlanParams {
            num_samples: n,
            seed: 7,
            rank: 0,
            world_size: 1,
            batch_size: batch,
            drop_last: false,
        };
        let segment = AgentSegment::create_heap(SegmentSpec {
            session_id: 1,
            ready_capacity: 64,
            release_capacity: 64,
            arena_size: 1 << 20,
            instance_epoch: 1,
            heartbeat_interval_ms: 0,
        })
        .unwrap();
        Session::new(SessionSetup {
            id: 1,
            conn: 1,
            dataset: 0,
            plan: SessionPlan::new(params, 0, epochs).unwrap(),
            segment,
            lease_key: 99,
            initial_window: initial,
            max_window: window,
            max_held_bytes: u64::MAX,
            now: Instant::now(),
            first_batch: 0,
        })
    }

    #[test]
    fn slow_start_grows_the_window_by_one_per_publication() {
        let mut s = session(40, 4, 1, 3);
        s.plan_ahead(|_| 1).unwrap();
        assert_eq!(s.pending().len(), 1, "window starts at 1");
        assert!(s.request_with(|_, _| Request::Pinned));
        let b = s.take_publishable(|_| true).expect("all present");
        assert_eq!(b.slots.len(), 4);
        assert_eq!(s.window(), 2);
        s.plan_ahead(|_| 1).unwrap();
        assert_eq!(s.pending().len(), 2);
        s.request_with(|_, _| Request::Pinned);
        s.take_publishable(|_| true).unwrap();
        s.take_publishable(|_| true).unwrap();
        s.plan_ahead(|_| 1).unwrap();
        assert_eq!(s.window(), 3, "capped at the maximum");
        assert_eq!(s.pending().len(), 3);
    }

    #[test]
    fn request_stops_where_told_and_resumes_there() {
        let mut s = session(40, 4, 1, 2);
        s.plan_ahead(|_| 1).unwrap();
        let mut seen = Vec::new();
        s.request_with(|_, x| {
            if seen.len() == 3 {
                return Request::Stop;
            }
            seen.push(x);
            Request::Pinned
        });
        assert_eq!(s.pending()[0].requested, 3);
        assert!(
            s.take_publishable(|_| true).is_none(),
            "not fully requested"
        );
        let mut rest = Vec::new();
        s.request_with(|_, x| {
            rest.push(x);
            Request::Pinned
        });
        assert_eq!(rest.len(), 1);
        let b = s.take_publishable(|_| true).unwrap();
        let pinned: Vec<u64> = b.pinned_samples().collect();
        seen.extend(rest);
        assert_eq!(pinned, seen, "every requested slot, in order");
    }

    #[test]
    fn publication_waits_for_the_front_batch_in_plan_order() {
        let mut s = session(40, 4, 1, 4);
        for _ in 0..3 {
            s.plan_ahead(|_| 1).unwrap();
            s.request_with(|_, _| Request::Pinned);
            s.take_publishable(|_| true).unwrap();
        }
        s.plan_ahead(|_| 1).unwrap();
        s.request_with(|_, _| Request::Pinned);
        let front: Vec<u64> = s.pending()[0].slots.iter().map(|x| x.sample).collect();
        let missing = front[2];
        assert!(s.take_publishable(|x| x != missing).is_none());
        let b = s.take_publishable(|_| true).unwrap();
        assert_eq!(b.index, 3, "batches leave in plan order");
    }

    #[test]
    fn relaxed_order_moves_ready_samples_forward_within_the_epoch() {
        let mut s = session_from(40, 4, 2, 4, 4);
        s.plan_ahead(|_| 1).unwrap();
        s.request_with(|_, _| Request::Pinned);
        let before: Vec<u64> = s
            .pending()
            .iter()
            .flat_map(|b| b.slots.iter().map(|x| x.sample))
            .collect();
        let late = s.pending()[0].slots[1].sample;
        let mut pairs = Vec::new();
        let swaps = s.relax_front(|x| x != late, |x| x != late, |a, b| pairs.push((a, b)));
        assert_eq!(swaps, 1);
        let forward = s.pending()[0].slots[1].sample;
        assert_ne!(forward, late);
        assert_eq!(pairs, vec![(late, forward)], "the trade is reported");
        let mut after: Vec<u64> = s
            .pending()
            .iter()
            .flat_map(|b| b.slots.iter().map(|x| x.sample))
            .collect();
        let mut sorted = before.clone();
        sorted.sort_unstable();
        after.sort_unstable();
        assert_eq!(sorted, after, "nothing added or dropped");
        assert!(s.take_publishable(|x| x != late).is_some());
    }

    #[test]
    fn end_of_stream_after_the_last_batch() {
        let mut s = session(8, 4, 2, 8);
        let mut batches = 0;
        while !s.at_end_of_stream() {
            s.plan_ahead(|_| 1).unwrap();
            s.request_with(|_, _| Request::Pinned);
            while let Some(b) = s.take_publishable(|_| true) {
                batches += 1;
                s.lend(
                    Loan {
                        pinned: b.pinned_samples().collect(),
                        table: None,
                        bytes: b.bytes(),
                    },
                    false,
                );
            }
        }
        assert_eq!(batches, 4, "2 epochs of 2 batches");
        let (seq, _) = s.lend(
            Loan {
                pinned: Vec::new(),
                table: None,
                bytes: 0,
            },
            true,
        );
        assert_eq!(seq, 4);
        assert!(s.ended() && !s.at_end_of_stream());
        let (loans, pins) = s.take_holdings();
        assert_eq!(loans.len(), 5);
        assert!(pins.is_empty());
    }

    #[test]
    fn holdings_include_pins_of_batches_being_prepared() {
        let mut s = session(40, 4, 1, 2);
        s.plan_ahead(|_| 1).unwrap();
        let mut n = 0;
        s.request_with(|_, _| {
            n += 1;
            if n > 2 {
                Request::Stop
            } else {
                Request::Pinned
            }
        });
        let (loans, pins) = s.take_holdings();
        assert!(loans.is_empty());
        assert_eq!(pins.len(), 2);
    }
}
