//! The peer tier's RDMA links, driven by the engine beside the TCP
//! transport (`docs/rdma.md`, "In the agent").
//!
//! * Set-up: each peer's queue pair parameters travel as RDMA setup frames
//!   on its authenticated TCP connection. The member with the lower index
//!   offers once the connection is up; the other answers with its own;
//!   after a failure either side offers again when its backoff is over.
//!   The queue pair belongs to the connection it was set up over: setup
//!   bytes from the member on any other connection are refused (logged at
//!   most once a second per member) while it is up or being set up, and
//!   only that connection ending closes it.
//! * Requester: a peer get goes to the queue pair when the link is up
//!   (`rdma_get`), naming its reserved extent of the arena, which is
//!   registered in place. The block lands there by RDMA write, its CRC is
//!   checked, and it completes the sample like a TCP block. A miss, a bad
//!   CRC or a request back from a failed link (`Retry`) ends as on TCP:
//!   over TCP while its due time has not passed, else from the store.
//! * Owner: a get received is admitted by the same serving queue as a TCP
//!   request, under the link's own name (`peers::rdma_conn`); its block is
//!   written from the arena (`rdma_serve`) and its pin released when the
//!   write and header completed or were dropped.
//! * The completion queue is polled every turn; the engine sleeps on the
//!   NIC's completion channel (the fake NIC has none and is polled at
//!   least every millisecond while a link is up).

use super::Engine;
use crate::peers::rdma_link::{LinkError, LinkEvent};
use crate::peers::{rdma_conn, PeerTier};
use granary_peer::frame::{DataHeader, Get, MissReason};
use granary_rdma::Extent;
use std::sync::Arc;

impl Engine {
    /// Sends `get` over member `member`'s queue pair when its link is up;
    /// false (the caller uses TCP) otherwise.
    pub(super) fn rdma_get(
        tier: &mut PeerTier,
        member: usize,
        get: Get,
        dest: u64,
        len: u32,
    ) -> bool {
        let now = tier.net.nanos();
        let Some(links) = tier.rdma.as_mut() else {
            return false;
        };
        if links.link(member) != crate::peers::transport::LinkTransport::Rdma {
            return false;
        }
        let extent = Extent { offset: dest, len };
        match links.get(member, get, extent, now) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(member, "RDMA get refused ({e}); over TCP");
                false
            }
        }
    }

    /// Writes the block at `offset` (`len` bytes) for member `member`'s
    /// request, with its data `header`; false when the link refused.
    pub(super) fn rdma_serve(
        tier: &mut PeerTier,
        member: usize,
        header: DataHeader,
        offset: u64,
        len: u64,
    ) -> bool {
        let now = tier.net.nanos();
        let (Some(links), Ok(len)) = (tier.rdma.as_mut(), u32::try_from(len)) else {
            return false;
        };
        match links.serve(member, header, Extent { offset, len }, now) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(member, request = header.request, "RDMA block not sent: {e}");
                false
            }
        }
    }

    /// Answers member `member`'s `get` with a miss over its queue pair.
    pub(super) fn rdma_miss(tier: &mut PeerTier, member: usize, get: Get, reason: MissReason) {
        let now = tier.net.nanos();
        if let Some(links) = tier.rdma.as_mut() {
            if let Err(e) = links.miss(member, get, reason, now) {
                tracing::debug!(member, request = get.request, "RDMA miss not sent: {e}");
            }
        }
    }

    /// An authenticated TCP connection to `member` is up: RDMA is set up
    /// over it (the offer goes at the next poll).
    pub(super) fn rdma_conn_up(&mut self, conn: u64, member: usize) {
        if let Some(t) = self.peers.as_mut().filter(|t| t.rdma.is_some()) {
            t.rdma_conn[member] = Some(conn);
        }
    }

    /// A TCP connection to `member` ended: when it is the one the queue
    /// pair was set up over, the queue pair is closed (its requests come
    /// back over TCP); any other connection ending leaves it.
    pub(super) fn rdma_conn_down(&mut self, conn: u64, member: usize) {
        let Some(t) = self.peers.as_mut() else {
            return;
        };
        let now = t.net.nanos();
        let Some(links) = t.rdma.as_mut() else {
            return;
        };
        if t.rdma_conn.get(member) == Some(&Some(conn)) {
            // Offers go over the queue pair's own connection if that is
            // another one, still up.
            t.rdma_conn[member] = links.channel(member).filter(|&c| c != conn);
        }
        if links.close(member, conn, now) {
            tracing::debug!(
                conn,
                peer = t.member_id(member),
                "the connection RDMA was set up over ended; queue pair closed"
            );
        }
    }

    /// Setup bytes from `member` on `conn`: the answer to our offer, or
    /// its offer, which we answer. Refused when the member's queue pair is
    /// up, or being set up, over another connection.
    pub(super) fn rdma_setup(&mut self, conn: u64, member: usize, bytes: &[u8]) {
        let Some(t) = self.peers.as_mut() else {
            return;
        };
        let now = t.net.nanos();
        let Some(links) = t.rdma.as_mut() else {
            tracing::debug!(
                conn,
                member,
                "RDMA setup from a peer; no RDMA here, TCP only"
            );
            return;
        };
        match links.on_setup(member, conn, bytes, now) {
            Ok(answer) => {
                t.rdma_conn[member] = Some(conn);
                if let Some(ours) = answer {
                    t.net.send_rdma_setup(conn, ours);
                }
                tracing::info!(peer = t.member_id(member), "RDMA queue pair to peer up");
            }
            Err(LinkError::OtherChannel { channel, .. }) => {
                if let Some(refused) = links.refusal_due(member, now) {
                    tracing::warn!(
                        conn,
                        channel,
                        refused,
                        peer = t.member_id(member),
                        "RDMA setup from peer on a connection other than the one its queue \
                         pair was set up over; refused (count since the last such line)"
                    );
                }
            }
            Err(e) => tracing::warn!(
                peer = t.member_id(member),
                "RDMA setup with peer failed ({e}); TCP carries its blocks"
            ),
        }
    }

    /// Whether the RDMA links must be polled every millisecond: some link
    /// is up and the NIC has no completion channel to wake the engine.
    pub(super) fn rdma_polled_each_turn(&self) -> bool {
        self.peers
            .as_ref()
            .and_then(|t| t.rdma.as_ref())
            .is_some_and(|l| l.completion_fd().is_none() && l.any_up())
    }

    /// Polls the completion queue, handles what it reports, offers queue
    /// pairs that are due and reports each link's transport. Returns
    /// whether anything happened.
    pub(super) fn poll_rdma(&mut self) -> bool {
        let Some(t) = self.peers.as_mut() else {
            return false;
        };
        let now = t.net.nanos();
        let Some(links) = t.rdma.as_mut() else {
            return false;
        };
        let mut events = std::mem::take(&mut self.link_events);
        links.poll(now, &mut events);
        // Offers: the lower index first, then whoever's backoff is over.
        for m in 0..t.rdma_conn.len() {
            let Some(conn) = t.rdma_conn[m] else { continue };
            if m == t.me || !links.to_offer(t.me, m, now) {
                continue;
            }
            match links.offer(m, conn, now) {
                Ok(bytes) => t.net.send_rdma_setup(conn, bytes),
                Err(e) => tracing::debug!(member = m, "RDMA offer not made: {e}"),
            }
        }
        let any = !events.is_empty();
        for e in events.drain(..) {
            self.on_link_event(e);
        }
        self.link_events = events;
        self.report_links();
        any
    }

    fn on_link_event(&mut self, e: LinkEvent) {
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        let now = tier.net.nanos();
        let outcome = match e {
            LinkEvent::Landed {
                request,
                header,
                crc32c,
                ..
            } => tier.requester.data(request, &header, crc32c, now),
            LinkEvent::Corrupt { request, .. } => tier.requester.corrupt(request),
            LinkEvent::Miss {
                request, reason, ..
            } => tier.requester.miss(request, reason, now),
            LinkEvent::Back { request, .. } => tier.requester.back(request, now),
            other => {
                self.on_owner_link_event(other);
                return;
            }
        };
        if let Some(o) = outcome {
            self.on_outcome(o);
        }
    }

    /// The owner's side of the RDMA links: requests, blocks written, a link
    /// gone.
    fn on_owner_link_event(&mut self, e: LinkEvent) {
        let m = Arc::clone(&self.metrics);
        let Some(tier) = self.peers.as_mut() else {
            return;
        };
        match e {
            LinkEvent::Request { member, get, len } => {
                if u64::from(len) < get.length {
                    // The driver would refuse the write: say so now.
                    m.peers.served_miss(MissReason::LengthMismatch.as_str());
                    Self::rdma_miss(tier, member, get, MissReason::LengthMismatch);
                    return;
                }
                self.peer_request(rdma_conn(member), get);
            }
            LinkEvent::Released { member, request } => {
                let conn = rdma_conn(member);
                let Some(s) = tier.serving.remove(&(conn, request)) else {
                    return;
                };
                if s.handed {
                    tier.serve.sent(conn, request);
                }
                if s.pinned {
                    let _ = self.cache.unpin(s.key);
                }
            }
            LinkEvent::Down { member } => {
                // Requests still queued for the link are dropped with
                // their pins, as for a closed connection.
                super::serving::drop_served(tier, &mut self.cache, rdma_conn(member));
            }
            // The requester's events are handled by `on_link_event`.
            LinkEvent::Landed { .. }
            | LinkEvent::Corrupt { .. }
            | LinkEvent::Miss { .. }
            | LinkEvent::Back { .. } => {}
        }
    }

    /// Reports each connected peer's transport when it changed.
    fn report_links(&mut self) {
        let Some(t) = self.peers.as_mut() else {
            return;
        };
        for m in 0..t.reported.len() {
            if m == t.me || !t.up[m] {
                continue;
            }
            let now = Some(t.link(m));
            if t.reported[m] != now {
                t.reported[m] = now;
                self.metrics.peers.set_transport(t.member_id(m), now);
            }
        }
    }

    /// Restarts the peer tier over `open`'s NIC, as on a host with an RDMA
    /// device (tests: a fake NIC on a shared fabric).
    #[cfg(test)]
    pub(crate) fn restart_peers_over(&mut self, open: crate::peers::transport::OpenNic) {
        self.rdma_nic = Some(open);
        let view = self
            .peers
            .as_ref()
            .map(|t| t.view().clone())
            .expect("a peer tier to restart");
        self.install_view(view).expect("the peer tier restarts");
    }
}
