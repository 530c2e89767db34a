//! The owner's side of [`PeerTier`]: peers' requests admitted to the
//! serving queue, tracked with the pin they hold until their answer is
//! written, and answered over the transport they came by (a TCP connection
//! or a member's RDMA link, `rdma_conn`). The engine owns the cache and
//! the arena; it asks the tier what to do and releases pins itself.

use super::net::ConnId;
use super::{rdma_member, PeerTier, Serving};
use granary_peer::frame::{DataHeader, Get, MissReason};
use granary_peer::serve::{Admit, Availability, Cancelled, Reply};
use granary_shm::arena::Arena;

/// Why a request was refused as overloaded, for
/// `granary_peer_rejected_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overload {
    /// The connection's requests pin `peers.max_pinned_per_peer` already.
    Pinned,
    /// The connection's serving queue is full.
    Queued,
}

impl Overload {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Overload::Pinned => "pinned",
            Overload::Queued => "queued",
        }
    }
}

impl PeerTier {
    /// Whether request `request` of `conn` is being served.
    pub(crate) fn is_serving(&self, conn: ConnId, request: u64) -> bool {
        self.serving.contains_key(&(conn, request))
    }

    /// The dataset `get` names and whether this agent keeps its sample;
    /// the miss to answer when this agent does not know the dataset or
    /// does not own the sample.
    pub(crate) fn served_dataset(&self, get: &Get) -> Result<(usize, bool), MissReason> {
        let ds = *self
            .by_fingerprint
            .get(&get.fingerprint)
            .ok_or(MissReason::UnknownDataset)?;
        let d = self.datasets.get(ds).and_then(Option::as_ref);
        if d.and_then(|d| d.dir.owner(get.sample)) != Some(self.me) {
            return Err(MissReason::NotOwner);
        }
        Ok((ds, d.is_some_and(|d| d.dir.is_kept(get.sample))))
    }

    /// Admits `get` of `conn`, whose sample is `avail`, to the serving
    /// queue; with why, when it was refused as overloaded.
    pub(crate) fn admit(
        &mut self,
        conn: ConnId,
        get: Get,
        avail: Availability,
    ) -> (Admit, Option<Overload>) {
        let pinned_before = self.serve.pinned_bytes(conn);
        let now = self.net.nanos();
        let admit = self.serve.request(conn, get, avail, now);
        let overload = (admit == Admit::Missed(MissReason::Overloaded)).then(|| {
            if pinned_before.saturating_add(get.length) > self.max_pinned {
                Overload::Pinned
            } else {
                Overload::Queued
            }
        });
        (admit, overload)
    }

    /// Request `request` of `conn` is cancelled by its requester: what the
    /// serving queue took back, if it had not begun to send its block.
    pub(crate) fn cancel(&mut self, conn: ConnId, request: u64) -> Option<Cancelled> {
        self.serve.cancel(conn, request)
    }

    /// Tracks request `request` of `conn` until its answer is written.
    pub(crate) fn track(&mut self, conn: ConnId, request: u64, s: Serving) {
        self.serving.insert((conn, request), s);
    }

    /// How many requests are being served (tests).
    #[cfg(test)]
    pub(crate) fn serving_count(&self) -> usize {
        self.serving.len()
    }

    /// The request being served, if it is.
    pub(crate) fn serving(&self, conn: ConnId, request: u64) -> Option<Serving> {
        self.serving.get(&(conn, request)).copied()
    }

    /// The store read the request waits for started: its reservation pins
    /// the sample.
    pub(crate) fn set_pinned(&mut self, conn: ConnId, request: u64) {
        if let Some(s) = self.serving.get_mut(&(conn, request)) {
            s.pinned = true;
        }
    }

    /// The request's block was handed to the transport.
    pub(crate) fn set_handed(&mut self, conn: ConnId, request: u64) {
        if let Some(s) = self.serving.get_mut(&(conn, request)) {
            s.handed = true;
        }
    }

    /// A store read of sample `sample` of the dataset with `fingerprint`
    /// ended (`Ok((length, block CRC))`): requests waiting for it may go.
    pub(crate) fn loaded(
        &mut self,
        fingerprint: u64,
        sample: u64,
        result: Result<(u64, u32), MissReason>,
    ) {
        let now = self.net.nanos();
        self.serve.loaded(fingerprint, sample, result, now);
    }

    /// The next answer that may go now.
    pub(crate) fn next_reply(&mut self) -> Option<Reply> {
        let now = self.net.nanos();
        self.serve.poll(now)
    }

    /// The request's answer is written or will never be: its send slot is
    /// free. Returns what it held (the caller releases the pin).
    pub(crate) fn finish(&mut self, conn: ConnId, request: u64) -> Option<Serving> {
        self.serve.sent(conn, request);
        self.serving.remove(&(conn, request))
    }

    /// The request ended without taking a send slot (a miss).
    pub(crate) fn untrack(&mut self, conn: ConnId, request: u64) -> Option<Serving> {
        self.serving.remove(&(conn, request))
    }

    /// The RDMA link released the request: its slot is free when its
    /// block had been handed to the link.
    pub(crate) fn released(&mut self, conn: ConnId, request: u64) -> Option<Serving> {
        let s = self.serving.remove(&(conn, request))?;
        if s.handed {
            self.serve.sent(conn, request);
        }
        Some(s)
    }

    /// `conn` (a TCP connection or an RDMA link) ended: what it had queued
    /// or in service is dropped. Returns the requests it held.
    pub(crate) fn drop_conn(&mut self, conn: ConnId) -> Vec<Serving> {
        self.serve.conn_closed(conn);
        let gone: Vec<(u64, u64)> = self
            .serving
            .keys()
            .filter(|(c, _)| *c == conn)
            .copied()
            .collect();
        gone.iter()
            .filter_map(|id| self.serving.remove(id))
            .collect()
    }

    /// Answers `get` of `conn` with a miss, over the transport it came by.
    pub(crate) fn send_miss(&mut self, conn: ConnId, get: Get, reason: MissReason) {
        match rdma_member(conn) {
            None => self.net.send_miss(conn, get, reason),
            Some(member) => self.rdma_miss(member, get, reason),
        }
    }

    /// Sends the block of `len` bytes at arena offset `offset` for `conn`'s
    /// request, with its data `header`; false when the transport refused
    /// (an RDMA link that is down, an extent outside the arena).
    pub(crate) fn send_block(
        &mut self,
        conn: ConnId,
        header: DataHeader,
        arena: &Arena,
        offset: u64,
        len: u64,
    ) -> bool {
        match rdma_member(conn) {
            Some(member) => self.rdma_serve(member, header, offset, len),
            None => match arena.slice(offset, len as usize) {
                Ok(src) => {
                    self.net.send_block(conn, header, src);
                    true
                }
                Err(_) => false,
            },
        }
    }

    /// A connection to member `m` ended: true when no other is up (the
    /// member is down now).
    pub(crate) fn member_went_down(&mut self, m: usize) -> bool {
        if self.net.is_up(m) || !self.up[m] {
            return false;
        }
        self.up[m] = false;
        true
    }

    /// One warning of `kind` in this period: `Some(lines skipped since
    /// the last one)`, `None` while the period's line is spent.
    pub(crate) fn log_allowed(&self, kind: &'static str) -> Option<u64> {
        self.log.allow(kind)
    }
}
