//! The requester: every sample asked of a peer, from the request to its
//! outcome. Sans-IO like the rest of the crate: the caller starts gets,
//! feeds what the transports report, polls the clock, and acts on the
//! [`Outcome`]s. The agent's engine, its TCP and RDMA transports and the
//! simulator all drive this one requester.
//!
//! ```text
//!  start ──▶ in flight ──┬─ data (block CRC checks) ─────▶ Landed
//!   (get, claim)         ├─ data (CRC fails) ────────────▶ Store(Corrupt)
//!                        ├─ miss ────────────────────────▶ Store(Miss)
//!                        ├─ connection lost ─────────────▶ Store(Lost)
//!                        ├─ back from RDMA, due ahead ───▶ Retry (over TCP, new claim)
//!                        ├─ back from RDMA, past due ────▶ Store(Lost)
//!                        ├─ not begun by its hedge time ─▶ Store(Hedged)   (the claim is the store's)
//!                        └─ its peer found slow ─────────▶ Store(Slow)     (idem)
//! ```
//!
//! # Claims
//!
//! A block is written into its extent by the transport's thread while the
//! requester lives on the caller's. Each get over TCP therefore has a
//! [`Claim`]: the transport takes it before writing the block's first byte,
//! the requester takes it before handing the extent to the store, and
//! whoever comes second gives way (a block arriving after the store took
//! the extent is dropped and reported with [`Requester::discarded`]).
//!
//! # Slow peers
//!
//! The requester keeps, per member, a moving average of how long its
//! blocks take to land (from the get to the last byte, less the time the
//! owner says the get waited for its own store read; late blocks of hedged
//! gets included), and counts a get still unanswered as at least as
//! old as it is (compared with the other members' oldest, so that long
//! queues everywhere make no member slow). A member whose estimate exceeds
//! [`RequesterConfig::slow_factor`] times the (lower) median of the
//! members' estimates, and [`RequesterConfig::slow_floor`], is **slow**:
//! [`Requester::ask`] says to read its samples from the store instead, and
//! its gets not begun are handed to the store at once. One probe get every
//! [`RequesterConfig::probe_every`] keeps measuring it; once a measure of
//! its own (a probe's block) brings its estimate back under the bound, it
//! is asked again. The others' latencies rising above its old estimate do
//! not: that would send it a burst of gets it answers no faster than
//! before, and find it slow again. So a slow link costs a
//! few store reads, not `hedge_after` of waiting plus a second read for
//! every sample it owns. A lone peer has no others to compare with and is
//! never called slow. Nor is any member while every member measured, the
//! fastest included, is slower than the floor: then the link they share is
//! this node's own, a store read crosses it too, and routing around a
//! member would only add reads.
//!
//! A get not begun by its hedge time, `hedge_after` or twice its member's
//! usual latency when that is longer, is read from the store as well: a
//! member whose blocks always take that long (a node whose own link is
//! slow sees every peer so) is not helped by a second read, and would
//! only double the store's load.
//!
//! # Cancels
//!
//! A TCP get handed to the store (hedged, or its member found slow) is
//! also **cancelled** at its owner: [`Requester::take_cancels`] lists the
//! requests to cancel, and the caller sends a cancel frame for each
//! ([`crate::frame::Frame::Cancel`]). The owner drops what it has not
//! begun to send (and does not start the store read of a sample that no
//! one waits for any more), so a slow owner does not read, and queue on its
//! link, blocks that its requesters have read from the store already.
//! Probes are not cancelled: a probe get to a slow member goes to the store
//! at once, and its block, when it comes, is what measures the member.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::block::block_crc_of;
use crate::conn::Nanos;
use crate::frame::{DataHeader, Get, MissReason};

/// Who may write a requested sample's extent: the receiver of the peer's
/// block or the store read that replaces it, never both.
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

/// Claims are compared by identity: two are equal only if they are one.
impl PartialEq for Claim {
    fn eq(&self, other: &Claim) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Claim {}

const WAITING: u8 = 0;
const RECEIVING: u8 = 1;
const ABANDONED: u8 = 2;

impl Claim {
    /// The receiver's claim before writing the first byte of the block;
    /// false once the store has the extent.
    pub fn receive(&self) -> bool {
        self.0
            .compare_exchange(WAITING, RECEIVING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the store has the extent.
    pub fn is_abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire) == ABANDONED
    }

    /// Whether the block has begun to arrive.
    pub fn is_receiving(&self) -> bool {
        self.0.load(Ordering::Acquire) == RECEIVING
    }

    /// The store's claim before reading into the extent: false once the
    /// block has begun to arrive.
    pub fn abandon(&self) -> bool {
        self.0
            .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The sample a get asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The dataset's fingerprint.
    pub fingerprint: u64,
    /// The sample's index.
    pub sample: u64,
    /// Its length in bytes, from the catalog.
    pub length: u64,
}

/// How a get travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Over the peer connection; hedged at its hedge time.
    Tcp,
    /// Written by the owner into the extent (RDMA); never hedged here: the
    /// link's own transfer timeout returns it first ([`Requester::back`]).
    Rdma,
}

/// Why a get ended at the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The owner answered with a miss.
    Miss(MissReason),
    /// The block failed its CRC, or was not the one asked for.
    Corrupt,
    /// The connection or queue pair was lost, or the get came back from
    /// RDMA past its due time.
    Lost,
    /// It had not begun to arrive by its hedge time.
    Hedged,
    /// Its peer was found slow.
    Slow,
}

impl Why {
    /// A short name, as metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Miss(r) => r.as_str(),
            Why::Corrupt => "corrupt",
            Why::Lost => "connection",
            Why::Hedged => "hedged",
            Why::Slow => "slow",
        }
    }
}

/// What became of a get.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The block is in the extent and verified; its bytes' CRC-32C.
    Landed {
        /// The caller's token.
        token: T,
        /// The member that sent it.
        member: usize,
        /// CRC-32C of the block's bytes.
        crc32c: u32,
    },
    /// Read the store into the same extent (the store holds the claim).
    Store {
        /// The caller's token.
        token: T,
        /// The member it was asked of.
        member: usize,
        /// Why.
        why: Why,
    },
    /// Ask the same member again over TCP, with this get and a new claim
    /// (it came back from RDMA before its due time).
    Retry {
        /// The member.
        member: usize,
        /// The get, unchanged.
        get: Get,
        /// The new claim.
        claim: Arc<Claim>,
    },
}

/// The requester's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequesterConfig {
    /// A TCP get whose block has not begun to arrive this long after it
    /// was sent is read from the store as well.
    pub hedge_after: Nanos,
    /// A member is slow when its latency estimate exceeds this many times
    /// the median of the members' estimates...
    pub slow_factor: u64,
    /// ...and this floor.
    pub slow_floor: Nanos,
    /// A slow member still gets one probe get this often.
    pub probe_every: Nanos,
    /// Gets that must have landed from a member before its average counts
    /// towards the median.
    pub min_samples: u32,
}

impl Default for RequesterConfig {
    fn default() -> Self {
        RequesterConfig {
            hedge_after: 2_000_000_000,
            slow_factor: 4,
            slow_floor: 50_000_000,
            probe_every: 1_000_000_000,
            min_samples: 4,
        }
    }
}

/// A get in flight.
#[derive(Debug)]
pub struct Pending<T> {
    /// The caller's token (what to complete or read).
    pub token: T,
    /// The member asked.
    pub member: usize,
    /// The get as sent (its `due` on this side's clock).
    pub get: Get,
    /// The claim on its extent (TCP).
    pub claim: Arc<Claim>,
    /// How it travels.
    pub via: Via,
    /// When it was sent.
    pub sent: Nanos,
    /// A probe of a member found slow ([`Requester::ask`]): never
    /// cancelled, its block measures the member.
    pub probe: bool,
}

/// What the requester knows of one member's speed.
#[derive(Clone, Debug, Default)]
struct Speed {
    /// Moving average of landing latency (ns), once any landed.
    avg: Option<Nanos>,
    landed: u32,
    slow: bool,
    /// When it was last probed while slow (set by [`Requester::ask`],
    /// which routing calls without holding the requester mutably).
    probed: Cell<Nanos>,
}

/// Hedged gets remembered so that their late blocks still say how long the
/// member took (at most this many).
const HEDGED_REMEMBERED: usize = 4096;

/// Cancels kept for [`Requester::take_cancels`] at most (more are dropped:
/// a cancel only saves the owner work).
const CANCELS_KEPT: usize = 4096;

/// A get to cancel at its owner: the caller sends a cancel frame for
/// `request` on the connection that carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancel {
    /// The member asked.
    pub member: usize,
    /// The request to cancel.
    pub request: u64,
}

/// The gets in flight of one agent (see the module documentation).
#[derive(Debug)]
pub struct Requester<T> {
    cfg: RequesterConfig,
    gets: HashMap<u64, Pending<T>>,
    next: u64,
    speed: Vec<Speed>,
    /// Gets handed to the store whose blocks may still come: member, sent.
    hedged: HashMap<u64, (usize, Nanos)>,
    /// Gets handed to the store, to cancel at their owner.
    cancels: Vec<Cancel>,
}

impl<T> Requester<T> {
    /// A requester for a view of `members` members.
    pub fn new(cfg: RequesterConfig, members: usize) -> Requester<T> {
        Requester {
            cfg,
            gets: HashMap::new(),
            next: 1,
            speed: (0..members).map(|_| Speed::default()).collect(),
            hedged: HashMap::new(),
            cancels: Vec::new(),
        }
    }

    /// Gets in flight.
    pub fn len(&self) -> usize {
        self.gets.len()
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.gets.is_empty()
    }

    /// The get of request `request`, if in flight.
    pub fn pending(&self, request: u64) -> Option<&Pending<T>> {
        self.gets.get(&request)
    }

    /// Whether `member` is asked now: not while it is slow, except for one
    /// probe every [`RequesterConfig::probe_every`].
    pub fn ask(&self, member: usize, now: Nanos) -> bool {
        let Some(s) = self.speed.get(member) else {
            return false;
        };
        if !s.slow {
            return true;
        }
        if now.saturating_sub(s.probed.get()) >= self.cfg.probe_every {
            s.probed.set(now);
            return true;
        }
        false
    }

    /// Whether `member` is slow now.
    pub fn is_slow(&self, member: usize) -> bool {
        self.speed.get(member).is_some_and(|s| s.slow)
    }

    /// `member`'s landing latency estimate, once any block landed.
    pub fn latency(&self, member: usize) -> Option<Nanos> {
        self.speed.get(member).and_then(|s| s.avg)
    }

    /// Starts a get of `want` from `member`, due `hedge_after` from now.
    /// Returns the get to send (with a fresh request id) and its claim.
    pub fn start(
        &mut self,
        token: T,
        member: usize,
        want: Sample,
        via: Via,
        now: Nanos,
    ) -> (Get, Arc<Claim>) {
        let request = self.next;
        self.next += 1;
        let get = Get {
            request,
            fingerprint: want.fingerprint,
            sample: want.sample,
            length: want.length,
            due: now.saturating_add(self.cfg.hedge_after),
        };
        let claim = Arc::new(Claim::default());
        // A member found slow is asked only for its probe.
        let probe = self.is_slow(member);
        self.gets.insert(
            request,
            Pending {
                token,
                member,
                get,
                claim: Arc::clone(&claim),
                via,
                sent: now,
                probe,
            },
        );
        (get, claim)
    }

    /// The block of `request` is in its extent: `header` as the owner sent
    /// it, `crc32c` the CRC-32C of the bytes received. Verified against
    /// the get (sample, length, block CRC bound to the dataset).
    pub fn data(
        &mut self,
        request: u64,
        header: &DataHeader,
        crc32c: u32,
        now: Nanos,
    ) -> Option<Outcome<T>> {
        let p = self.gets.remove(&request)?;
        let g = p.get;
        let good = header.sample == g.sample
            && header.length == g.length
            && block_crc_of(g.fingerprint, g.sample, g.length, crc32c) == header.crc;
        if good {
            // What the member's link and queue cost: the time the owner
            // spent reading the sample from its store for us is not its
            // slowness.
            let took = now
                .saturating_sub(p.sent)
                .saturating_sub(u64::from(header.store_wait_us) * 1000);
            self.observe(p.member, took, now);
            Some(Outcome::Landed {
                token: p.token,
                member: p.member,
                crc32c,
            })
        } else {
            Some(Outcome::Store {
                token: p.token,
                member: p.member,
                why: Why::Corrupt,
            })
        }
    }

    /// The owner answered `request` with a miss. The answer to a cancel
    /// ([`MissReason::Cancelled`]) of a get already handed to the store
    /// ends it: no block will come.
    pub fn miss(&mut self, request: u64, reason: MissReason, now: Nanos) -> Option<Outcome<T>> {
        if !self.gets.contains_key(&request) {
            if reason == MissReason::Cancelled {
                self.hedged.remove(&request);
            }
            return None;
        }
        let p = self.gets.remove(&request)?;
        // A miss is an answer: it says how fast the member answers.
        self.observe(p.member, now.saturating_sub(p.sent), now);
        Some(Outcome::Store {
            token: p.token,
            member: p.member,
            why: Why::Miss(reason),
        })
    }

    /// The owner sent a block other than the one `request` asked for (its
    /// bytes were not taken): the store is read instead.
    pub fn corrupt(&mut self, request: u64) -> Option<Outcome<T>> {
        let p = self.gets.remove(&request)?;
        Some(Outcome::Store {
            token: p.token,
            member: p.member,
            why: Why::Corrupt,
        })
    }

    /// `request`'s connection was lost before its block was whole.
    pub fn lost(&mut self, request: u64) -> Option<Outcome<T>> {
        let p = self.gets.remove(&request)?;
        Some(Outcome::Store {
            token: p.token,
            member: p.member,
            why: Why::Lost,
        })
    }

    /// `request` came back from RDMA (its queue pair failed): asked again
    /// over TCP with a new claim while its due time is ahead, else read
    /// from the store.
    pub fn back(&mut self, request: u64, now: Nanos) -> Option<Outcome<T>> {
        if self.gets.get(&request)?.get.due <= now {
            return self.lost(request);
        }
        let p = self.gets.get_mut(&request)?;
        p.claim = Arc::new(Claim::default());
        p.via = Via::Tcp;
        Some(Outcome::Retry {
            member: p.member,
            get: p.get,
            claim: Arc::clone(&p.claim),
        })
    }

    /// `request` travels by `via` after all (an RDMA get refused by its
    /// link goes over TCP).
    pub fn set_via(&mut self, request: u64, via: Via) {
        if let Some(p) = self.gets.get_mut(&request) {
            p.via = via;
        }
    }

    /// A block of `request` arrived after the store took its extent: it
    /// was dropped. Nothing is in flight for it any more; when it was
    /// hedged, its arrival still tells how long its member took.
    pub fn discarded(&mut self, request: u64, now: Nanos) {
        self.gets.remove(&request);
        if let Some((member, sent)) = self.hedged.remove(&request) {
            self.observe(member, now.saturating_sub(sent), now);
        }
    }

    /// How long a get to `member` may go unbegun before it is hedged:
    /// [`RequesterConfig::hedge_after`], or twice the member's usual
    /// latency when that is longer (a member whose blocks always take that
    /// long is not helped by a second read; one much slower than the
    /// others is found slow instead).
    pub fn hedge_time(&self, member: usize) -> Nanos {
        let usual = self
            .speed
            .get(member)
            .and_then(|s| s.avg)
            .unwrap_or(0)
            .saturating_mul(2);
        self.cfg.hedge_after.max(usual)
    }

    /// The gets handed to the store since the last call, to cancel at
    /// their owners (see [Cancels](self#cancels)).
    pub fn take_cancels(&mut self) -> Vec<Cancel> {
        std::mem::take(&mut self.cancels)
    }

    /// Every get still in flight goes to the store (the view changed, the
    /// tier stops).
    pub fn drain(&mut self) -> Vec<Pending<T>> {
        self.gets.drain().map(|(_, p)| p).collect()
    }

    /// When [`Requester::poll`] has something to do next, if ever.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.gets
            .values()
            .filter(|p| p.via == Via::Tcp)
            .map(|p| p.sent.saturating_add(self.hedge_time(p.member)))
            .min()
    }

    /// Advances to `now`: gets not begun by their hedge time, and those of
    /// members found slow, go to the store (their claims taken); appends
    /// their outcomes to `out`.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<Outcome<T>>) {
        self.judge(now, None);
        let ended: Vec<(u64, Why)> = self
            .gets
            .iter()
            .filter(|(_, p)| p.via == Via::Tcp)
            .filter_map(|(&r, p)| {
                if now.saturating_sub(p.sent) >= self.hedge_time(p.member) {
                    Some((r, Why::Hedged))
                } else if self.speed[p.member].slow {
                    Some((r, Why::Slow))
                } else {
                    None
                }
            })
            .collect();
        for (r, why) in ended {
            let Some(p) = self.gets.get(&r) else { continue };
            if !p.claim.abandon() {
                // The block has begun to arrive: it is waited for.
                continue;
            }
            if self.hedged.len() >= HEDGED_REMEMBERED {
                self.hedged.clear();
            }
            self.hedged.insert(r, (p.member, p.sent));
            if !p.probe && self.cancels.len() < CANCELS_KEPT {
                self.cancels.push(Cancel {
                    member: p.member,
                    request: r,
                });
            }
            if let Some(p) = self.gets.remove(&r) {
                out.push(Outcome::Store {
                    token: p.token,
                    member: p.member,
                    why,
                });
            }
        }
    }

    fn observe(&mut self, member: usize, latency: Nanos, now: Nanos) {
        let Some(s) = self.speed.get_mut(member) else {
            return;
        };
        s.avg = Some(match s.avg {
            // An exponential moving average, weight 1/8.
            Some(a) => a - a / 8 + latency / 8,
            None => latency,
        });
        s.landed = s.landed.saturating_add(1);
        self.judge(now, Some(member));
    }

    /// Marks members slow or not, from their averages and the age of their
    /// oldest get still unanswered. A slow member becomes fast again only
    /// on a measure of its own (`measured`: a probe's block, or a late
    /// one): not because the others' latencies rose above its old
    /// average, which would send it a burst of gets it is no faster to
    /// answer than before, and find it slow again.
    fn judge(&mut self, now: Nanos, measured: Option<usize>) {
        let min = self.cfg.min_samples;
        let known_of = |s: &Speed| s.avg.filter(|_| s.landed >= min);
        let mut known: Vec<Nanos> = self.speed.iter().filter_map(known_of).collect();
        if known.is_empty() {
            for s in &mut self.speed {
                s.slow = false;
            }
            return;
        }
        known.sort_unstable();
        // Every member measured, the fastest included, slower than the
        // floor: what they have in common is this node's own link, and a
        // store read of their samples crosses the same link. No member is
        // found slow while it lasts (the hedge still applies); one found
        // slow before stays so until its probes say otherwise.
        let own_link = known.len() >= 2 && known[0] > self.cfg.slow_floor;
        // The lower median: with two members, the faster is the measure.
        let bound = known[(known.len() - 1) / 2]
            .saturating_mul(self.cfg.slow_factor)
            .max(self.cfg.slow_floor);
        let mut oldest = vec![0 as Nanos; self.speed.len()];
        for p in self.gets.values() {
            if !p.claim.is_receiving() {
                let age = now.saturating_sub(p.sent);
                if let Some(o) = oldest.get_mut(p.member) {
                    *o = (*o).max(age);
                }
            }
        }
        // An unanswered get counts only against the others' oldest: when
        // every owner has a long queue (the job's first reads), none is
        // slower than the rest.
        let mut waiting: Vec<Nanos> = oldest.iter().copied().filter(|&a| a > 0).collect();
        waiting.sort_unstable();
        let age_bound = if waiting.len() >= 2 {
            waiting[(waiting.len() - 1) / 2]
                .saturating_mul(self.cfg.slow_factor)
                .max(bound)
        } else {
            bound
        };
        for (m, s) in self.speed.iter_mut().enumerate() {
            // Judged only against another member's measure: a lone peer
            // is never slow.
            let others = known.len() - usize::from(known_of(s).is_some());
            if others == 0 {
                s.slow = false;
                continue;
            }
            let avg = s.avg.unwrap_or(0);
            if !s.slow && !own_link && (avg > bound || oldest[m] > age_bound) {
                // Slow from now on, until probes bring its average down:
                // the average starts at what was seen.
                s.slow = true;
                s.probed.set(now);
                s.avg = Some(avg.max(oldest[m]));
            } else if s.slow && measured == Some(m) && avg <= bound && oldest[m] <= age_bound {
                s.slow = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::block_crc;

    const MS: Nanos = 1_000_000;

    fn want(fingerprint: u64, sample: u64, length: u64) -> Sample {
        Sample {
            fingerprint,
            sample,
            length,
        }
    }

    fn cfg() -> RequesterConfig {
        RequesterConfig {
            hedge_after: 500 * MS,
            slow_floor: 20 * MS,
            ..RequesterConfig::default()
        }
    }

    fn header(get: &Get, bytes: &[u8]) -> DataHeader {
        DataHeader {
            request: get.request,
            sample: get.sample,
            length: get.length,
            crc: block_crc(get.fingerprint, get.sample, bytes),
            store_wait_us: 0,
        }
    }

    #[test]
    fn a_verified_block_lands_and_a_wrong_one_goes_to_the_store() {
        let mut r: Requester<&str> = Requester::new(cfg(), 2);
        let (g, _) = r.start("a", 1, want(9, 5, 3), Via::Tcp, 0);
        let h = header(&g, b"abc");
        assert_eq!(
            r.data(g.request, &h, crc32c::crc32c(b"abc"), MS),
            Some(Outcome::Landed {
                token: "a",
                member: 1,
                crc32c: crc32c::crc32c(b"abc")
            })
        );
        // Another sample's bytes with its own (correct) CRC: the identity
        // in the block CRC rejects it.
        let (g, _) = r.start("b", 1, want(9, 6, 3), Via::Tcp, 0);
        let mut wrong = header(&g, b"abc");
        wrong.crc = block_crc(9, 7, b"abc");
        assert_eq!(
            r.data(g.request, &wrong, crc32c::crc32c(b"abc"), MS),
            Some(Outcome::Store {
                token: "b",
                member: 1,
                why: Why::Corrupt
            })
        );
        // A header for another sample than the one asked.
        let (g, _) = r.start("c", 1, want(9, 8, 3), Via::Tcp, 0);
        let other = DataHeader {
            sample: 9,
            ..header(&g, b"abc")
        };
        assert!(matches!(
            r.data(g.request, &other, 0, MS),
            Some(Outcome::Store {
                why: Why::Corrupt,
                ..
            })
        ));
        assert!(r.is_empty());
        // Unknown or finished requests are ignored.
        assert_eq!(r.data(g.request, &other, 0, MS), None);
        assert_eq!(r.lost(77), None);
    }

    #[test]
    fn a_get_not_begun_by_its_hedge_time_goes_to_the_store_once() {
        let mut r: Requester<u32> = Requester::new(cfg(), 2);
        let (a, ca) = r.start(1, 1, want(9, 1, 3), Via::Tcp, 0);
        let (_, cb) = r.start(2, 1, want(9, 2, 3), Via::Tcp, 0);
        let (_, _) = r.start(3, 1, want(9, 3, 3), Via::Rdma, 0);
        assert_eq!(r.poll_timeout(), Some(500 * MS));
        let mut out = Vec::new();
        r.poll(499 * MS, &mut out);
        assert!(out.is_empty());
        // b's block has begun to arrive: it is waited for.
        assert!(cb.receive());
        r.poll(500 * MS, &mut out);
        assert_eq!(
            out,
            [Outcome::Store {
                token: 1,
                member: 1,
                why: Why::Hedged
            }]
        );
        assert!(
            ca.is_abandoned() && !ca.receive(),
            "the store has a's extent"
        );
        // The late block of a is dropped; nothing else happens.
        assert_eq!(r.data(a.request, &header(&a, b"abc"), 0, MS), None);
        assert_eq!(r.len(), 2, "b and the RDMA get remain");
    }

    #[test]
    fn a_hedged_get_is_cancelled_at_its_owner_once() {
        let mut r: Requester<u32> = Requester::new(cfg(), 2);
        let (a, _) = r.start(1, 1, want(9, 1, 3), Via::Tcp, 0);
        let (_, cb) = r.start(2, 1, want(9, 2, 3), Via::Tcp, 0);
        r.start(3, 1, want(9, 3, 3), Via::Rdma, 0);
        let mut out = Vec::new();
        r.poll(499 * MS, &mut out);
        assert!(r.take_cancels().is_empty(), "nothing handed over yet");
        assert!(cb.receive());
        r.poll(500 * MS, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            r.take_cancels(),
            [Cancel {
                member: 1,
                request: a.request
            }],
            "the hedged get, not the one arriving nor the RDMA one"
        );
        r.poll(600 * MS, &mut out);
        assert!(r.take_cancels().is_empty(), "each get is cancelled once");
        // The owner's answer to the cancel ends it: no block will come, so
        // nothing is measured later from it.
        assert_eq!(r.miss(a.request, MissReason::Cancelled, 700 * MS), None);
        r.discarded(a.request, 900 * MS);
        assert_eq!(r.latency(1), None);
    }

    #[test]
    fn gets_of_a_member_found_slow_are_cancelled_but_not_its_probes() {
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for m in 1..4 {
            land(&mut r, m, 8, MS, &mut t);
        }
        let (slow_get, _) = r.start(100, 3, want(9, 100, 3), Via::Tcp, t);
        let mut out = Vec::new();
        r.poll(t + 30 * MS, &mut out);
        assert!(r.is_slow(3));
        assert_eq!(
            r.take_cancels(),
            [Cancel {
                member: 3,
                request: slow_get.request
            }]
        );
        // A probe goes to the store at once too, but is not cancelled: its
        // block is what measures the member.
        t += 1030 * MS;
        assert!(r.ask(3, t));
        let (probe, _) = r.start(101, 3, want(9, 101, 3), Via::Tcp, t);
        assert!(r.pending(probe.request).is_some_and(|p| p.probe));
        r.poll(t + MS, &mut out);
        assert!(matches!(
            out.last(),
            Some(Outcome::Store {
                token: 101,
                why: Why::Slow,
                ..
            })
        ));
        assert!(r.take_cancels().is_empty());
        let before = r.latency(3);
        r.discarded(probe.request, t + 5 * MS);
        assert_ne!(r.latency(3), before, "the probe's late block measured it");
    }

    #[test]
    fn rdma_gets_come_back_over_tcp_before_due_and_to_the_store_after() {
        let mut r: Requester<u8> = Requester::new(cfg(), 2);
        let (g, _) = r.start(1, 1, want(9, 1, 3), Via::Rdma, 0);
        match r.back(g.request, 100 * MS) {
            Some(Outcome::Retry {
                member: 1,
                get,
                claim,
            }) => {
                assert_eq!(get, g);
                assert!(claim.receive());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.pending(g.request).map(|p| p.via), Some(Via::Tcp));
        let (g, _) = r.start(2, 1, want(9, 2, 3), Via::Rdma, 0);
        assert!(matches!(
            r.back(g.request, 600 * MS),
            Some(Outcome::Store {
                token: 2,
                why: Why::Lost,
                ..
            })
        ));
    }

    /// Lands `n` gets from `member`, each taking `each`.
    fn land(r: &mut Requester<u64>, member: usize, n: u64, each: Nanos, t: &mut Nanos) {
        for i in 0..n {
            let (g, _) = r.start(i, member, want(9, i, 3), Via::Tcp, *t);
            *t += each;
            let h = header(&g, b"abc");
            assert!(matches!(
                r.data(g.request, &h, crc32c::crc32c(b"abc"), *t),
                Some(Outcome::Landed { .. })
            ));
        }
    }

    #[test]
    fn a_slow_member_is_routed_around_and_probed_until_it_recovers() {
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for m in 1..4 {
            land(&mut r, m, 8, MS, &mut t);
        }
        assert!((1..4).all(|m| r.ask(m, t) && !r.is_slow(m)));
        // Member 3 stops answering quickly: its gets pile up unanswered.
        let (slow_get, _) = r.start(100, 3, want(9, 100, 3), Via::Tcp, t);
        let (_, receiving) = r.start(101, 3, want(9, 101, 3), Via::Tcp, t);
        assert!(receiving.receive());
        let mut out = Vec::new();
        r.poll(t + 10 * MS, &mut out);
        assert!(
            out.is_empty(),
            "10 ms is within 4 x the median and the floor"
        );
        r.poll(t + 30 * MS, &mut out);
        assert!(r.is_slow(3), "30 ms unanswered against a 1 ms median");
        assert_eq!(
            out,
            [Outcome::Store {
                token: 100,
                member: 3,
                why: Why::Slow
            }],
            "its get not begun goes to the store at once; the one arriving is waited for"
        );
        assert!(r.pending(slow_get.request).is_none());
        t += 30 * MS;
        assert!(!r.ask(3, t), "a slow member is not asked");
        assert!(r.ask(1, t));
        // One probe a second.
        assert!(r.ask(3, t + 1000 * MS));
        assert!(!r.ask(3, t + 1001 * MS));
        // It answers fast again: probes bring its average down.
        let mut t = t + 1000 * MS;
        r.discarded(101, t);
        for _ in 0..40 {
            land(&mut r, 3, 1, MS, &mut t);
        }
        assert!(!r.is_slow(3) && r.ask(3, t));
    }

    #[test]
    fn a_slow_member_recovers_on_its_own_measure_not_the_others_drift() {
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for m in 1..4 {
            land(&mut r, m, 8, MS, &mut t);
        }
        r.start(100, 3, want(9, 100, 3), Via::Tcp, t);
        let mut out = Vec::new();
        r.poll(t + 30 * MS, &mut out);
        assert!(r.is_slow(3));
        t += 30 * MS;
        // The others slow down to 20 ms: 4 x the median is now above member
        // 3's estimate (30 ms), but nothing new was learnt of member 3.
        for m in 1..3 {
            land(&mut r, m, 40, 20 * MS, &mut t);
        }
        r.poll(t, &mut out);
        assert!(r.is_slow(3), "still slow: no measure of its own");
        // Its probe lands within the bound: it is asked again.
        land(&mut r, 3, 1, MS, &mut t);
        assert!(!r.is_slow(3) && r.ask(3, t));
    }

    #[test]
    fn a_peer_that_never_answers_is_slow_against_one_that_does() {
        let mut r: Requester<u64> = Requester::new(cfg(), 3);
        let mut t = 0;
        land(&mut r, 1, 8, MS, &mut t);
        r.start(100, 2, want(9, 100, 3), Via::Tcp, t);
        let mut out = Vec::new();
        r.poll(t + 30 * MS, &mut out);
        assert!(r.is_slow(2) && !r.is_slow(1), "{out:?}");
        assert!(matches!(out[..], [Outcome::Store { why: Why::Slow, .. }]));
    }

    #[test]
    fn long_queues_at_every_member_make_none_slow() {
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for m in 1..4 {
            land(&mut r, m, 8, MS, &mut t);
        }
        // Every member has a get unanswered for 100 ms (the job's first
        // reads queue at every owner): none is slower than the others.
        for m in 1..4 {
            r.start(m as u64, m, want(9, m as u64, 3), Via::Tcp, t);
        }
        let mut out = Vec::new();
        r.poll(t + 100 * MS, &mut out);
        assert!(out.is_empty() && (1..4).all(|m| !r.is_slow(m)), "{out:?}");
    }

    #[test]
    fn when_every_member_is_slower_than_the_floor_none_is_routed_around() {
        // This node's own link is slow: every member's blocks take 200 ms
        // or more (the floor is 20 ms), member 3's the longest.
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for (m, ms) in [(1, 200), (2, 250), (3, 900)] {
            land(&mut r, m, 8, ms * MS, &mut t);
        }
        let mut out = Vec::new();
        r.poll(t, &mut out);
        assert!((1..4).all(|m| !r.is_slow(m) && r.ask(m, t)), "{out:?}");
        // A get of member 3 unanswered for 1.5 s against the others' 0.2 s:
        // still not routed around (the hedge decides, at its own time).
        r.start(100, 3, want(9, 100, 3), Via::Tcp, t);
        r.start(101, 1, want(9, 101, 3), Via::Tcp, t + 1300 * MS);
        r.poll(t + 1500 * MS, &mut out);
        assert!(!r.is_slow(3), "{out:?}");
        // The same member against fast ones is found slow.
        let mut r: Requester<u64> = Requester::new(cfg(), 4);
        let mut t = 0;
        for (m, ms) in [(1, 2), (2, 3), (3, 900)] {
            land(&mut r, m, 8, ms * MS, &mut t);
        }
        r.poll(t, &mut out);
        assert!(r.is_slow(3) && !r.is_slow(1) && !r.is_slow(2));
    }

    #[test]
    fn a_lone_peer_is_never_called_slow() {
        let mut r: Requester<u64> = Requester::new(cfg(), 2);
        let mut t = 0;
        land(&mut r, 1, 8, 200 * MS, &mut t);
        let mut out = Vec::new();
        r.start(1, 1, want(9, 1, 3), Via::Tcp, t);
        r.poll(t + 400 * MS, &mut out);
        assert!(out.is_empty() && !r.is_slow(1) && r.ask(1, t));
    }

    #[test]
    fn a_claim_goes_to_the_receiver_or_the_store_never_both() {
        let c = Claim::default();
        assert!(c.receive());
        assert!(
            !c.abandon(),
            "the store may not write a block being received"
        );
        assert!(!c.receive());
        let c = Claim::default();
        assert!(c.abandon());
        assert!(!c.receive(), "the block may not land after the store began");
        assert!(!c.abandon());
        // Raced from two threads many times: exactly one side wins.
        for _ in 0..1000 {
            let c = Arc::new(Claim::default());
            let c2 = Arc::clone(&c);
            let t = std::thread::spawn(move || c2.receive());
            let hedged = c.abandon();
            let received = t.join().unwrap();
            assert!(hedged ^ received);
        }
    }

    #[test]
    fn a_miss_and_a_lost_connection_go_to_the_store() {
        let mut r: Requester<u8> = Requester::new(cfg(), 2);
        let (g, _) = r.start(1, 1, want(9, 1, 3), Via::Tcp, 0);
        assert_eq!(
            r.miss(g.request, MissReason::NotKept, MS),
            Some(Outcome::Store {
                token: 1,
                member: 1,
                why: Why::Miss(MissReason::NotKept)
            })
        );
        let (g, _) = r.start(2, 1, want(9, 2, 3), Via::Tcp, 0);
        assert!(matches!(
            r.lost(g.request),
            Some(Outcome::Store { why: Why::Lost, .. })
        ));
        r.start(3, 1, want(9, 3, 3), Via::Tcp, 0);
        assert_eq!(r.drain().len(), 1);
        assert!(r.is_empty());
    }
}
