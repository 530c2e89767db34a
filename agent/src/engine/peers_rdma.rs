//! The peer tier's RDMA links, driven by the engine beside the TCP
//! transport (`docs/rdma.md`, "In the agent"). The links and their
//! set-up are the tier's (`peers/tier_rdma.rs`); here the engine polls
//! them each turn and handles what they report:
//!
//! * Requester: a block landed by RDMA write, a miss, a bad CRC or a
//!   request back from a failed link goes to the requester, whose outcome
//!   completes the sample like a TCP block, asks again over TCP while the
//!   get's due time has not passed, or reads the store.
//! * Owner: a get received is admitted by the same serving queue as a TCP
//!   request, under the link's own name (`peers::rdma_conn`); its pin is
//!   released when the write and header completed or were dropped.
//! * The completion queue is polled every turn; the engine sleeps on the
//!   NIC's completion channel (the fake NIC has none and is polled at
//!   least every millisecond while a link is up).

use super::Engine;
use crate::peers::rdma_conn;
use crate::peers::rdma_link::LinkEvent;
use granary_peer::frame::MissReason;
use std::sync::Arc;

impl Engine {
    /// Whether the RDMA links must be polled every millisecond: some link
    /// is up and the NIC has no completion channel to wake the engine.
    pub(super) fn rdma_polled_each_turn(&self) -> bool {
        self.peers
            .as_ref()
            .is_some_and(|t| t.rdma_polled_each_turn())
    }

    /// Polls the completion queue, handles what it reports, offers queue
    /// pairs that are due and reports each link's transport. Returns
    /// whether anything happened.
    pub(super) fn poll_rdma(&mut self) -> bool {
        let Some(t) = self.peers.as_mut() else {
            return false;
        };
        let mut events = std::mem::take(&mut self.link_events);
        if !t.poll_links(&mut events) {
            self.link_events = events;
            return false;
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
        match tier.link_event(e) {
            Ok(Some(o)) => self.on_outcome(o),
            Ok(None) => {}
            Err(owner) => self.on_owner_link_event(owner),
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
                    tier.send_miss(rdma_conn(member), get, MissReason::LengthMismatch);
                    return;
                }
                self.peer_request(rdma_conn(member), get);
            }
            LinkEvent::Released { member, request } => {
                if let Some(s) = tier.released(rdma_conn(member), request) {
                    super::serving::unpin(&mut self.cache, s);
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
        for (m, link) in t.link_changes() {
            self.metrics.peers.set_transport(t.member_id(m), Some(link));
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
