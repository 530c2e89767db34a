//! The requester's side of the peer tier: samples asked of peers and what
//! came back.
//!
//! * A miss the request phase routes to a peer ([`Route::Peer`]: the owner
//!   keeps it, it is reachable and not found slow) reserves its extent as
//!   any read does and starts a get in the tier's requester
//!   (`granary_peer::request::Requester`), sent over the peer's RDMA link
//!   when it is up, over TCP otherwise.
//! * What the transports report (a block received, a miss, a lost
//!   connection, a get back from RDMA, a block dropped after its hedge) goes
//!   to the requester, which verifies blocks against their get and decides
//!   each get's [`Outcome`]: landed, asked again over TCP, or read from the
//!   store into the same extent. The clock goes to it too: gets not begun
//!   by their hedge time, and those of a peer found slow, go to the store,
//!   and are cancelled at their owner (a cancel frame: it drops what it
//!   has not begun to send).
//! * A landed block completes its sample through the same path as a store
//!   read (`Engine::sample_ready`, `complete.rs`).
//!
//! [`Route::Peer`]: crate::peers::Route::Peer

use super::{key, Engine, Inflight};
use crate::cache::SampleKey;
use crate::peers::net::Event;
use crate::peers::PeerToken;
use granary_peer::channel::Protection;
use granary_peer::grace::Release;
use granary_peer::request::{Outcome, Sample, Why};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Asks peer `member` for sample `k`, landing in the extent at `dest`.
    pub(super) fn start_peer_get(&mut self, member: usize, k: SampleKey, dest: u64, len: u32) {
        let token = PeerToken { key: k, dest, len };
        let want = self.want_of(&token);
        let slice = self.arena.slice(dest, len as usize);
        let (Some(tier), Some(want), Ok(slice)) = (self.peers.as_mut(), want, slice) else {
            // Cannot happen with a directory and an extent from the cache;
            // the reservation must not stay in flight for ever.
            tracing::error!("peer read of {k} could not start");
            let _ = self
                .cache
                .fail(k, granary_shm::ErrorCode::Internal.as_i32().unsigned_abs());
            return;
        };
        tier.ask(member, token, want, slice);
        self.metrics.peers.gets_sent.inc();
    }

    /// Parks the read of sample `k` (its extent at `dest` reserved) until
    /// member `member`, whose connection dropped, is back, not before
    /// `delay` ns (`peers.owner_grace_ms`, `peers/tier_grace.rs`); `lost`:
    /// it was asked of the member and lost with its connection.
    pub(super) fn park_peer_get(
        &mut self,
        member: usize,
        k: SampleKey,
        dest: u64,
        len: u32,
        lost: bool,
        delay: u64,
    ) {
        let token = PeerToken { key: k, dest, len };
        match (self.want_of(&token), self.peers.as_mut()) {
            (Some(want), Some(tier)) => {
                tier.park(member, token, want, lost, delay);
                self.metrics.peers.grace("parked", 1);
            }
            _ => self.read_store_instead(token),
        }
    }

    /// What a get for `token` asks for, once its dataset has a directory.
    fn want_of(&self, token: &PeerToken) -> Option<Sample> {
        let fingerprint = self
            .peers
            .as_ref()?
            .fingerprint_of(token.key.dataset as usize)?;
        Some(Sample {
            fingerprint,
            sample: token.key.index,
            length: u64::from(token.len),
        })
    }

    /// Handles the transports' events, advances the requester's clock and
    /// sends the answers that may go. Returns whether anything happened.
    pub(super) fn poll_peers(&mut self, _now: Instant) -> bool {
        let Some(tier) = self.peers.as_mut() else {
            return false;
        };
        let mut events = std::mem::take(&mut self.peer_events);
        tier.drain_events(&mut events);
        let mut any = !events.is_empty();
        for e in events.drain(..) {
            self.on_peer_event(e);
        }
        self.peer_events = events;
        any |= self.poll_rdma();
        self.poll_requester();
        self.pump_serving();
        any
    }

    /// Gets past their hedge time, or of peers found slow, go to the store;
    /// reads parked for an owner that went away are asked again once it is
    /// back, or go to the store when its grace ends or a loader waited on
    /// them long enough.
    fn poll_requester(&mut self) {
        let blocked = if self.peers.as_ref().is_some_and(|t| t.grace_parked()) {
            self.blocked_samples()
        } else {
            HashSet::new()
        };
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        let mut ended = Vec::new();
        tier.poll_gets(&mut ended);
        let cancels = tier.send_cancels();
        self.metrics.peers.cancels_sent.inc_by(cancels);
        let mut released = Vec::new();
        tier.grace_poll(|t| blocked.contains(&t.key), &mut released);
        self.report_slow();
        for o in ended {
            self.on_outcome(o);
        }
        for r in released {
            match r {
                Release::Ask { token, member, .. } => {
                    self.metrics.peers.grace("returned", 1);
                    self.start_peer_get(member, token.key, token.dest, token.len);
                }
                Release::Store {
                    token, why, asked, ..
                } => {
                    self.metrics.peers.grace(why.as_str(), 1);
                    if asked {
                        // Asked, lost with its connection, read from the
                        // store: as without a grace.
                        self.metrics.peers.get_failed(Why::Lost.as_str());
                    }
                    self.read_store_instead(token);
                }
            }
        }
    }

    /// The samples a loader is blocked on: those of the next batch of
    /// every session whose loader has taken every batch published (it
    /// waits for that one, or will at its next call).
    fn blocked_samples(&mut self) -> HashSet<SampleKey> {
        let mut out = HashSet::new();
        for s in self.sessions.values_mut() {
            if s.ready.unconsumed().is_ok_and(|n| n > 0) {
                continue;
            }
            let ds = s.dataset();
            if let Some(front) = s.pending().front() {
                out.extend(
                    front.slots[..front.requested]
                        .iter()
                        .map(|slot| key(ds, slot.sample)),
                );
            }
        }
        out
    }

    /// Publishes which peers the requester finds slow when that changed.
    fn report_slow(&mut self) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        for c in tier.slow_changes() {
            let peer = tier.member_id(c.member);
            if c.slow {
                tracing::warn!(
                    peer,
                    latency_ms = c.latency / 1_000_000,
                    "peer found slow: its samples are read from the store (probed every second)"
                );
            } else {
                tracing::info!(peer, "peer no longer slow");
            }
            self.metrics.peers.set_slow(peer, c.slow);
        }
    }

    fn on_peer_event(&mut self, e: Event) {
        let m = Arc::clone(&self.metrics);
        match e {
            Event::Up {
                conn,
                member,
                incarnation,
                channel,
            } => {
                if let Some(t) = self.peers.as_mut() {
                    let (suite, records) = match channel {
                        Some((s, Protection::Encrypted)) => (s.as_str(), "encrypted"),
                        Some((s, Protection::Authenticated)) => (s.as_str(), "authenticated"),
                        None => ("-", "-"),
                    };
                    tracing::info!(
                        conn,
                        peer = t.member_id(member),
                        incarnation = format_args!("{incarnation:016x}"),
                        suite,
                        records,
                        "peer connection up"
                    );
                    let link = t.connection_up(member);
                    t.grace_back(member, incarnation);
                    m.peers.set_up(t.member_id(member), true);
                    m.peers.set_transport(t.member_id(member), Some(link));
                    t.rdma_conn_up(conn, member);
                }
            }
            Event::Down { conn, member, why } => {
                tracing::debug!(conn, "peer connection down: {why}");
                if let (Some(member), Some(t)) = (member, self.peers.as_mut()) {
                    t.rdma_conn_down(conn, member);
                }
                self.peer_conn_down(conn, member);
            }
            Event::Request { conn, get } => self.peer_request(conn, get),
            Event::JobStatus { member, status } => self.peer_job_status(member, status),
            Event::Cancel { conn, request } => self.peer_cancel(conn, request),
            Event::Received {
                request,
                header,
                crc32c,
            } => {
                let Some(t) = self.peers.as_mut() else { return };
                if let Some(o) = t.received(request, &header, crc32c) {
                    self.on_outcome(o);
                }
            }
            Event::Failed { request, why } => {
                let Some(t) = self.peers.as_mut() else { return };
                if let Some(o) = t.failed(request, &why) {
                    self.on_outcome(o);
                }
            }
            Event::LateDiscarded { request } => {
                tracing::debug!(request, "a block from a peer came after its hedge");
                m.peers.late_discarded.inc();
                if let Some(t) = self.peers.as_mut() {
                    t.discarded(request);
                }
            }
            Event::Sent { conn, request } => self.peer_sent(conn, request),
            Event::Rtt { member, nanos } => {
                if let Some(t) = self.peers.as_ref() {
                    m.peers.observe_rtt(t.member_id(member), nanos as f64 / 1e9);
                }
            }
            Event::RdmaSetup {
                conn,
                member,
                bytes,
            } => {
                if let Some(t) = self.peers.as_mut() {
                    t.rdma_setup(conn, member, &bytes);
                }
            }
        }
    }

    /// What became of a get: the one place where a peer's answer becomes a
    /// Ready sample, a new get over TCP, or a store read.
    pub(super) fn on_outcome(&mut self, o: Outcome<PeerToken>) {
        let m = Arc::clone(&self.metrics);
        match o {
            Outcome::Landed { token, crc32c, .. } => {
                m.peers.peer_samples.inc();
                m.peers.peer_bytes.inc_by(u64::from(token.len));
                self.sample_ready(token.key, crc32c);
            }
            Outcome::Store { token, member, why } => {
                // An owner that went away is waited for (its grace).
                if let Some(delay) = self.peers.as_mut().and_then(|t| t.grace_takes(member, why)) {
                    let lost = why == Why::Lost;
                    self.park_peer_get(member, token.key, token.dest, token.len, lost, delay);
                    return;
                }
                match why {
                    Why::Hedged => {
                        m.peers.hedged.inc();
                    }
                    Why::Corrupt => {
                        m.peers.crc_failures.inc();
                        m.peers.get_failed("corrupt");
                        if let Some(t) = self.peers.as_ref() {
                            if let Some(skipped) = t.log_allowed("corrupt") {
                                tracing::warn!(
                                    peer = t.member_id(member),
                                    skipped,
                                    "a block of {} from a peer failed its CRC; reading the store",
                                    token.key
                                );
                            }
                        }
                    }
                    other => m.peers.get_failed(other.as_str()),
                }
                self.read_store_instead(token);
            }
            Outcome::Retry { member, get, claim } => {
                let Some(t) = self.peers.as_mut() else { return };
                if let Some(o) = t.retry_over_tcp(member, get, claim, &self.arena) {
                    self.on_outcome(o);
                }
            }
        }
    }

    /// A get ended without its block: the store is read into its extent.
    pub(super) fn read_store_instead(&mut self, token: PeerToken) {
        let now = self.clock.now();
        self.start_read(Inflight {
            key: token.key,
            dest: token.dest,
            len: token.len,
            attempt: 1,
            started: now,
            first: now,
        });
    }
}
