//! The owner's side of the peer tier: peers' requests served from the
//! arena.
//!
//! A peer's request is answered from the arena when the sample is there
//! (pinned until its block is written), waits for the read in flight when
//! it is being read (single flight), or starts the one store read of a
//! sample this agent keeps, into the keep area. Anything else gets a miss
//! with its reason. The serving queue (`granary_peer::serve::Server`)
//! decides what goes next: earliest due first, send slots shared fairly
//! across connections, a cap on the bytes each connection's requests pin
//! (`peers.max_pinned_per_peer`). A request arrives over TCP or an RDMA
//! link (`peers::rdma_conn` names the link); its answer goes back the
//! same way.
//!
//! A request its requester cancels (it read the store instead) is dropped
//! unless its block is being sent, and answered with a `Cancelled` miss;
//! when no one waits for its store read any more and that read is still
//! waiting for room at the source, the read is not started at all.

use super::{key, Engine, Inflight};
use crate::cache::{Cache, Lookup, SampleKey};
use crate::peers::{PeerTier, Serving};
use granary_peer::block::block_crc_of;
use granary_peer::frame::{micros, DataHeader, Get, MissReason};
use granary_peer::serve::{Admit, Availability, Cancelled, Reply};

impl Engine {
    /// The block served for `request` on `conn` is written (or never will
    /// be): its slot and its pin are released.
    pub(super) fn peer_sent(&mut self, conn: u64, request: u64) {
        if let Some(s) = self.peers.as_mut().and_then(|t| t.finish(conn, request)) {
            unpin(&mut self.cache, s);
        }
    }

    /// Admits a peer's request (`conn`: a TCP connection or an RDMA link).
    pub(super) fn peer_request(&mut self, conn: u64, get: Get) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        if tier.is_serving(conn, get.request) {
            // A request id reused while the first is pending: answered
            // with a miss, the first keeps its pin.
            self.metrics.peers.reject("request_id");
            if let Some(skipped) = tier.log_allowed("request_id") {
                tracing::warn!(
                    conn,
                    request = get.request,
                    skipped,
                    "peer reused a request id in flight"
                );
            }
            self.metrics
                .peers
                .served_miss(MissReason::Overloaded.as_str());
            tier.send_miss(conn, get, MissReason::Overloaded);
            return;
        }
        let mut pinned_key = None;
        let avail = match tier.served_dataset(&get) {
            Err(reason) => Availability::Absent(reason),
            Ok((ds, kept)) => {
                let src = self.datasets[ds].source();
                let len = src
                    .filter(|s| get.sample < s.len())
                    .map(|s| s.meta(get.sample).size);
                if len != Some(get.length) {
                    Availability::Absent(MissReason::LengthMismatch)
                } else {
                    let k = key(ds, get.sample);
                    match self.cache.lookup(k) {
                        Lookup::Ready(r) => {
                            if self.cache.pin(k).is_ok() {
                                pinned_key = Some(k);
                                Availability::Ready {
                                    length: r.len,
                                    crc: block_crc_of(get.fingerprint, get.sample, r.len, r.crc32c),
                                }
                            } else {
                                Availability::Absent(MissReason::Evicted)
                            }
                        }
                        Lookup::InFlight { .. } => {
                            if self.cache.pin(k).is_ok() {
                                pinned_key = Some(k);
                                Availability::Loading
                            } else {
                                Availability::Absent(MissReason::StoreError)
                            }
                        }
                        Lookup::Failed { pins, .. } if pins > 0 => {
                            Availability::Absent(MissReason::StoreError)
                        }
                        Lookup::Absent | Lookup::Failed { .. } if kept => {
                            pinned_key = Some(k);
                            Availability::Kept
                        }
                        Lookup::Absent | Lookup::Failed { .. } => {
                            Availability::Absent(MissReason::NotKept)
                        }
                    }
                }
            }
        };
        let (admit, overload) = tier.admit(conn, get, avail);
        if let Some(why) = overload {
            self.metrics.peers.reject(why.as_str());
        }
        let Some(k) = pinned_key else {
            return;
        };
        // A `Kept` sample is pinned by its reservation, if the read starts.
        let pinned = avail != Availability::Kept;
        tier.track(
            conn,
            get.request,
            Serving {
                key: k,
                pinned,
                handed: false,
            },
        );
        if admit == Admit::StartRead && self.start_kept_read(k, get.fingerprint) {
            if let Some(t) = self.peers.as_mut() {
                t.set_pinned(conn, get.request);
            }
        }
    }

    /// A peer cancelled its request `request` on `conn`: dropped unless its
    /// block is being sent (then the block is the answer), answered with a
    /// `Cancelled` miss, and its pin released; the store read it waited
    /// for is not started when no one else wants it.
    pub(super) fn peer_cancel(&mut self, conn: u64, request: u64) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        let Some(c) = tier.cancel(conn, request) else {
            return;
        };
        let (get, last) = match c {
            Cancelled::Queued(get) => (get, false),
            Cancelled::Waiting { get, last } => (get, last),
        };
        self.metrics
            .peers
            .served_miss(MissReason::Cancelled.as_str());
        tier.send_miss(conn, get, MissReason::Cancelled);
        let Some(s) = tier.untrack(conn, request) else {
            return;
        };
        unpin(&mut self.cache, s);
        if last && self.drop_unstarted_read(s.key) {
            self.metrics.peers.reads_not_started.inc();
        }
    }

    /// Takes back the read of `k` if it never started (it waits for room
    /// at the source) and nothing pins it: no session and no other request
    /// wants it. Returns whether it was taken back.
    fn drop_unstarted_read(&mut self, k: SampleKey) -> bool {
        let Some(at) = self.retry_queue.iter().position(|(_, r)| r.key == k) else {
            return false;
        };
        if !matches!(self.cache.lookup(k), Lookup::InFlight { pins: 0, .. }) {
            return false;
        }
        if self.cache.abandon(k).is_err() {
            return false;
        }
        self.retry_queue.swap_remove(at);
        true
    }

    /// The one store read of a kept sample a peer asked for; false when it
    /// could not start (the waiting requests get a miss).
    fn start_kept_read(&mut self, k: SampleKey, fingerprint: u64) -> bool {
        let len = self.datasets[k.dataset as usize]
            .source()
            .map_or(0, |s| s.meta(k.index).size);
        let reserved = u32::try_from(len).map_err(|_| ()).and_then(|len32| {
            self.cache
                .reserve_kept(k, len)
                .or_else(|_| self.cache.reserve(k, len))
                .map(|r| (r, len32))
                .map_err(|_| ())
        });
        let Ok((r, len32)) = reserved else {
            // No room: the waiting request gets a miss.
            if let Some(t) = self.peers.as_mut() {
                t.loaded(fingerprint, k.index, Err(MissReason::Overloaded));
            }
            return false;
        };
        let now = self.clock.now();
        self.start_read(Inflight {
            key: k,
            dest: r.extent.offset,
            len: len32,
            attempt: 1,
            started: now,
            first: now,
        });
        true
    }

    /// A read of `k` ended (`Some(crc)`: Ready with that CRC-32C): peers
    /// waiting for it are answered.
    pub(super) fn peer_loaded(&mut self, k: SampleKey, done: Option<(u64, u32)>) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        let Some(fp) = tier.fingerprint_of(k.dataset as usize) else {
            return;
        };
        let result = match done {
            Some((len, crc)) => Ok((len, block_crc_of(fp, k.index, len, crc))),
            None => Err(MissReason::StoreError),
        };
        tier.loaded(fp, k.index, result);
    }

    /// Hands every answer that may go now to the transport.
    pub(super) fn pump_serving(&mut self) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        while let Some(reply) = tier.next_reply() {
            match reply {
                Reply::Send {
                    conn,
                    get,
                    crc,
                    store_wait,
                } => {
                    let header = DataHeader::answering(&get, crc, micros(store_wait));
                    let ready = tier.serving(conn, get.request).and_then(|s| {
                        match self.cache.lookup(s.key) {
                            Lookup::Ready(r) if s.pinned => Some(r),
                            _ => None,
                        }
                    });
                    // An RDMA link that refuses is down: the requester gets
                    // its request back from its own driver, and nothing
                    // more goes on the link.
                    let handed = ready.is_some_and(|r| {
                        tier.send_block(conn, header, &self.arena, r.offset, r.len)
                    });
                    if handed {
                        self.metrics.peers.served.inc();
                        self.metrics.peers.served_bytes.inc_by(get.length);
                        tier.set_handed(conn, get.request);
                        continue;
                    }
                    if ready.is_none() || crate::peers::rdma_member(conn).is_none() {
                        self.metrics.peers.served_miss(MissReason::Evicted.as_str());
                        tier.send_miss(conn, get, MissReason::Evicted);
                    }
                    if let Some(s) = tier.finish(conn, get.request) {
                        unpin(&mut self.cache, s);
                    }
                }
                Reply::Miss { conn, get, reason } => {
                    self.metrics.peers.served_miss(reason.as_str());
                    tier.send_miss(conn, get, reason);
                    if let Some(s) = tier.untrack(conn, get.request) {
                        unpin(&mut self.cache, s);
                    }
                }
            }
        }
    }

    /// A connection ended: its queued answers are dropped and their pins
    /// released.
    pub(super) fn peer_conn_down(&mut self, conn: u64, member: Option<usize>) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        drop_served(tier, &mut self.cache, conn);
        if let Some(m) = member {
            if tier.member_went_down(m) {
                self.metrics.peers.set_up(tier.member_id(m), false);
                tier.grace_dropped(m);
            }
        }
    }
}

/// Releases the pin a served request held, if it held one.
pub(super) fn unpin(cache: &mut Cache, s: Serving) {
    if s.pinned {
        let _ = cache.unpin(s.key);
    }
}

/// Drops what connection `conn` (a TCP connection or an RDMA link) still
/// had queued or in service at this owner, releasing the pins.
pub(super) fn drop_served(tier: &mut PeerTier, cache: &mut Cache, conn: u64) {
    for s in tier.drop_conn(conn) {
        unpin(cache, s);
    }
}
