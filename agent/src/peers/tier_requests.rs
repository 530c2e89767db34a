//! The requester's side of [`PeerTier`]: gets sent to peers and what the
//! transports report about them, handed to the one requester
//! (`granary_peer::request::Requester`), which turns them into outcomes
//! for the engine (landed, asked again over TCP, read from the store).

use super::net::{Event, GetFailure, OutGet};
use super::{PeerTier, PeerToken};
use granary_peer::conn::Nanos;
use granary_peer::frame::DataHeader;
use granary_peer::request::{Claim, Outcome, Sample, Via};
use granary_shm::arena::{Arena, ArenaSlice};
use std::os::fd::RawFd;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

/// A member whose speed, as the requester judges it, changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlowChange {
    pub member: usize,
    pub slow: bool,
    /// Its usual latency (ns), 0 before any was measured.
    pub latency: Nanos,
}

impl PeerTier {
    /// The transport's clock (ns; tests).
    #[cfg(test)]
    pub(crate) fn nanos(&self) -> Nanos {
        self.net.nanos()
    }

    /// Asks member `member` for `want`, landing in `token`'s extent (`dest`
    /// in the arena): over the member's RDMA link when it is up, over TCP
    /// otherwise.
    pub(crate) fn ask(&mut self, member: usize, token: PeerToken, want: Sample, dest: ArenaSlice) {
        let now = self.net.nanos();
        let (get, claim) = self.requester.start(token, member, want, Via::Rdma, now);
        if !self.rdma_get(member, get, token.dest, token.len) {
            self.requester.set_via(get.request, Via::Tcp);
            self.net.get(member, OutGet { get, dest, claim });
        }
    }

    /// Whether any get is in flight or parked.
    pub(crate) fn gets_in_flight(&self) -> bool {
        !self.requester.is_empty() || self.grace_parked()
    }

    /// Moves what the TCP transport reported into `out`.
    pub(crate) fn drain_events(&mut self, out: &mut Vec<Event>) {
        self.net.drain(out);
    }

    /// The descriptors the engine sleeps on besides its sources': the TCP
    /// transport's wake-up and the NIC's completion channel, if it has
    /// one (armed by the last poll of its queue).
    pub(crate) fn wake_fds(&self) -> impl Iterator<Item = RawFd> {
        let nic = self.rdma.as_ref().and_then(|l| l.completion_fd());
        std::iter::once(self.net.wake_fd().as_raw_fd()).chain(nic.map(|fd| fd.as_raw_fd()))
    }

    /// Advances the requester's clock: gets past their hedge time, or of
    /// peers found slow, end in `out`.
    pub(crate) fn poll_gets(&mut self, out: &mut Vec<Outcome<PeerToken>>) {
        let now = self.net.nanos();
        self.requester.poll(now, out);
    }

    /// Sends a cancel for every get the requester handed to the store
    /// since the last call (over TCP; see `granary_peer::request`,
    /// "Cancels"); returns how many.
    pub(crate) fn send_cancels(&mut self) -> u64 {
        let cancels = self.requester.take_cancels();
        for c in &cancels {
            self.net.cancel(c.member, c.request);
        }
        cancels.len() as u64
    }

    /// The members whose slowness changed since the last call.
    pub(crate) fn slow_changes(&mut self) -> Vec<SlowChange> {
        let mut changed = Vec::new();
        for (m, was) in self.slow.iter_mut().enumerate() {
            let slow = self.requester.is_slow(m);
            if *was != slow {
                *was = slow;
                changed.push(SlowChange {
                    member: m,
                    slow,
                    latency: self.requester.latency(m).unwrap_or(0),
                });
            }
        }
        changed
    }

    /// A connection to member `member` is up; returns how its blocks
    /// travel now.
    pub(crate) fn connection_up(&mut self, member: usize) -> super::transport::LinkTransport {
        let link = self.link(member);
        self.up[member] = true;
        self.reported[member] = Some(link);
        link
    }

    /// A block for `request` arrived with this header and payload CRC.
    pub(crate) fn received(
        &mut self,
        request: u64,
        header: &DataHeader,
        crc32c: u32,
    ) -> Option<Outcome<PeerToken>> {
        let now = self.net.nanos();
        self.requester.data(request, header, crc32c, now)
    }

    /// The get `request` brought no block.
    pub(crate) fn failed(&mut self, request: u64, why: &GetFailure) -> Option<Outcome<PeerToken>> {
        let now = self.net.nanos();
        match why {
            GetFailure::Miss(r) => self.requester.miss(request, *r, now),
            GetFailure::Corrupt => self.requester.corrupt(request),
            GetFailure::Lost(why) => {
                tracing::debug!(request, "peer request lost: {why}");
                self.requester.lost(request)
            }
        }
    }

    /// The block of `request` came after its hedge and was dropped.
    pub(crate) fn discarded(&mut self, request: u64) {
        let now = self.net.nanos();
        self.requester.discarded(request, now);
    }

    /// A get back from an RDMA link goes again over TCP, into the same
    /// extent; its outcome when that cannot be.
    pub(crate) fn retry_over_tcp(
        &mut self,
        member: usize,
        get: granary_peer::frame::Get,
        claim: Arc<Claim>,
        arena: &Arena,
    ) -> Option<Outcome<PeerToken>> {
        let token = self.requester.pending(get.request)?.token;
        match arena.slice(token.dest, token.len as usize) {
            Ok(dest) => {
                tracing::debug!(
                    request = get.request,
                    "RDMA request back; asked again over TCP"
                );
                self.net.get(member, OutGet { get, dest, claim });
                None
            }
            Err(_) => self.requester.lost(get.request),
        }
    }

    /// Stops the tier: the gets still in flight or parked and the
    /// requests still served, for the engine to read from the store and to
    /// unpin. Dropping the transport stops its runtime and the RDMA links
    /// destroy their queue pairs: nothing writes into an extent after
    /// this.
    pub(crate) fn retire(mut self) -> (Vec<PeerToken>, Vec<super::Serving>) {
        let mut gets: Vec<PeerToken> = self
            .requester
            .drain()
            .into_iter()
            .map(|p| p.token)
            .collect();
        gets.extend(self.grace_drain());
        let serving = self.serving.drain().map(|(_, s)| s).collect();
        drop(self);
        (gets, serving)
    }
}
