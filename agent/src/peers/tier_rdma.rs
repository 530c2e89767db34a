//! The RDMA links of [`PeerTier`] (`docs/rdma.md`, "In the agent"): set
//! up over each member's authenticated TCP connection, polled beside it,
//! carrying gets, blocks and misses when up.
//!
//! * Set-up: each peer's queue pair parameters travel as RDMA setup frames
//!   on its authenticated TCP connection. The member with the lower index
//!   offers once the connection is up; the other answers with its own;
//!   after a failure either side offers again when its backoff is over.
//!   The queue pair belongs to the connection it was set up over: setup
//!   bytes from the member on any other connection are refused (logged at
//!   most once a second per member) while it is up or being set up, and
//!   only that connection ending closes it.
//! * Requester: a get goes to the queue pair when the link is up, naming
//!   its reserved extent of the arena, which is registered in place.
//! * Owner: a block is written from the arena, a miss sent as a frame.

use super::net::ConnId;
use super::rdma_link::{LinkError, LinkEvent};
use super::transport::LinkTransport;
use super::{PeerTier, PeerToken};
use granary_peer::frame::{DataHeader, Get, MissReason};
use granary_peer::request::Outcome;
use granary_rdma::Extent;

impl PeerTier {
    /// Sends `get` over member `member`'s queue pair when its link is up;
    /// false (the caller uses TCP) otherwise.
    pub(super) fn rdma_get(&mut self, member: usize, get: Get, dest: u64, len: u32) -> bool {
        let now = self.net.nanos();
        let Some(links) = self.rdma.as_mut() else {
            return false;
        };
        if links.link(member) != LinkTransport::Rdma {
            return false;
        }
        match links.get(member, get, Extent { offset: dest, len }, now) {
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
        &mut self,
        member: usize,
        header: DataHeader,
        offset: u64,
        len: u64,
    ) -> bool {
        let now = self.net.nanos();
        let (Some(links), Ok(len)) = (self.rdma.as_mut(), u32::try_from(len)) else {
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
    pub(super) fn rdma_miss(&mut self, member: usize, get: Get, reason: MissReason) {
        let now = self.net.nanos();
        if let Some(links) = self.rdma.as_mut() {
            if let Err(e) = links.miss(member, get, reason, now) {
                tracing::debug!(member, request = get.request, "RDMA miss not sent: {e}");
            }
        }
    }

    /// An authenticated TCP connection to `member` is up: RDMA is set up
    /// over it (the offer goes at the next poll).
    pub(crate) fn rdma_conn_up(&mut self, conn: ConnId, member: usize) {
        if self.rdma.is_some() {
            self.rdma_conn[member] = Some(conn);
        }
    }

    /// A TCP connection to `member` ended: when it is the one the queue
    /// pair was set up over, the queue pair is closed (its requests come
    /// back over TCP); any other connection ending leaves it.
    pub(crate) fn rdma_conn_down(&mut self, conn: ConnId, member: usize) {
        let now = self.net.nanos();
        let Some(links) = self.rdma.as_mut() else {
            return;
        };
        if self.rdma_conn.get(member) == Some(&Some(conn)) {
            // Offers go over the queue pair's own connection if that is
            // another one, still up.
            self.rdma_conn[member] = links.channel(member).filter(|&c| c != conn);
        }
        if links.close(member, conn, now) {
            tracing::debug!(
                conn,
                peer = self.view.members()[member].id,
                "the connection RDMA was set up over ended; queue pair closed"
            );
        }
    }

    /// Setup bytes from `member` on `conn`: the answer to our offer, or
    /// its offer, which we answer. Refused when the member's queue pair is
    /// up, or being set up, over another connection.
    pub(crate) fn rdma_setup(&mut self, conn: ConnId, member: usize, bytes: &[u8]) {
        let now = self.net.nanos();
        let peer = &self.view.members()[member].id;
        let Some(links) = self.rdma.as_mut() else {
            tracing::debug!(
                conn,
                member,
                "RDMA setup from a peer; no RDMA here, TCP only"
            );
            return;
        };
        match links.on_setup(member, conn, bytes, now) {
            Ok(answer) => {
                self.rdma_conn[member] = Some(conn);
                if let Some(ours) = answer {
                    self.net.send_rdma_setup(conn, ours);
                }
                tracing::info!(peer, "RDMA queue pair to peer up");
            }
            Err(LinkError::OtherChannel { channel, .. }) => {
                if let Some(refused) = links.refusal_due(member, now) {
                    tracing::warn!(
                        conn,
                        channel,
                        refused,
                        peer,
                        "RDMA setup from peer on a connection other than the one its queue \
                         pair was set up over; refused (count since the last such line)"
                    );
                }
            }
            Err(e) => tracing::warn!(
                peer,
                "RDMA setup with peer failed ({e}); TCP carries its blocks"
            ),
        }
    }

    /// Whether the RDMA links must be polled every millisecond: some link
    /// is up and the NIC has no completion channel to wake the engine.
    pub(crate) fn rdma_polled_each_turn(&self) -> bool {
        self.rdma
            .as_ref()
            .is_some_and(|l| l.completion_fd().is_none() && l.any_up())
    }

    /// Polls the completion queue into `events` and makes the queue pair
    /// offers that are due (the lower index first, then whoever's backoff
    /// is over). False when the tier has no RDMA links.
    pub(crate) fn poll_links(&mut self, events: &mut Vec<LinkEvent>) -> bool {
        let now = self.net.nanos();
        let Some(links) = self.rdma.as_mut() else {
            return false;
        };
        links.poll(now, events);
        for (m, conn) in self.rdma_conn.iter().enumerate() {
            let Some(conn) = *conn else { continue };
            if m == self.me || !links.to_offer(self.me, m, now) {
                continue;
            }
            match links.offer(m, conn, now) {
                Ok(bytes) => self.net.send_rdma_setup(conn, bytes),
                Err(e) => tracing::debug!(member = m, "RDMA offer not made: {e}"),
            }
        }
        true
    }

    /// Hands a link's report about one of our gets to the requester:
    /// `Ok` with the get's outcome, if it ended; the owner's events (a
    /// request, a block released, a link down) come back as `Err`.
    pub(crate) fn link_event(
        &mut self,
        e: LinkEvent,
    ) -> Result<Option<Outcome<PeerToken>>, LinkEvent> {
        let now = self.net.nanos();
        Ok(match e {
            LinkEvent::Landed {
                request,
                header,
                crc32c,
                ..
            } => self.requester.data(request, &header, crc32c, now),
            LinkEvent::Corrupt { request, .. } => self.requester.corrupt(request),
            LinkEvent::Miss {
                request, reason, ..
            } => self.requester.miss(request, reason, now),
            LinkEvent::Back { request, .. } => self.requester.back(request, now),
            other => return Err(other),
        })
    }

    /// The RDMA links (tests).
    #[cfg(test)]
    pub(crate) fn rdma_links(&self) -> Option<&super::rdma_link::RdmaLinks<super::transport::Nic>> {
        self.rdma.as_ref()
    }

    /// The RDMA links (tests).
    #[cfg(test)]
    pub(crate) fn rdma_links_mut(
        &mut self,
    ) -> Option<&mut super::rdma_link::RdmaLinks<super::transport::Nic>> {
        self.rdma.as_mut()
    }

    /// Each connected member whose transport changed since it was last
    /// reported, with the new one.
    pub(crate) fn link_changes(&mut self) -> Vec<(usize, LinkTransport)> {
        let mut changed = Vec::new();
        for m in 0..self.reported.len() {
            if m == self.me || !self.up[m] {
                continue;
            }
            let now = Some(self.link(m));
            if self.reported[m] != now {
                self.reported[m] = now;
                changed.push((m, self.link(m)));
            }
        }
        changed
    }
}
