//! The RDMA data path as the peer tier sees it: `granary_rdma`'s driver
//! over any verbs backend (the libibverbs one with the `rdma` feature, the
//! fake NIC in tests), speaking the peer protocol's own frames.
//!
//! * Queue pairs are set up with bytes the caller carries over the peer's
//!   already authenticated TCP connection ([`RdmaLinks::offer`],
//!   [`RdmaLinks::on_setup`]). The member with the lower index offers
//!   first; after a failure either side offers again once its backoff is
//!   over ([`RdmaLinks::to_offer`]); an offer is always answered.
//! * A queue pair lives and dies with the one connection it was set up
//!   over, its channel ([`RdmaLinks::channel`]): setup bytes from the same
//!   member on any other connection are refused while it is up or being
//!   set up ([`LinkError::OtherChannel`], logged at most once a second per
//!   member, [`RdmaLinks::refusal_due`]), and only that connection ending
//!   closes it ([`RdmaLinks::close`]).
//! * A get's extent is writable by the owner only through a memory window
//!   bound to exactly that extent for the get's lifetime (see
//!   `granary_rdma::driver`).
//! * The arena registered is the agent's own shared arena, in place
//!   ([`RdmaLinks::with_arena`]): extents are arena offsets, and a block
//!   lands where the loaders read it.
//! * A get names the requester's extent of the registered arena; its
//!   frame is the protocol's `Get`. The owner RDMA-writes the payload,
//!   then sends the protocol's `Data` header on the same queue pair.
//! * The requester checks the block CRC (bound to dataset, sample and
//!   length) over the landed bytes, as on TCP.
//! * On any failure the driver tears the queue pair down; each request in
//!   flight comes back as [`LinkEvent::Back`], and the requester asks
//!   again over TCP while its due time has not passed, or reads the store. The link reads
//!   `rdma-fallback` until RDMA is probed again after the driver's backoff.
//!
//! The engine drives it (`engine/peers_rdma.rs`); `docs/rdma.md`, "In the
//! agent".

use super::net::ConnId;
use super::transport::LinkTransport;
use granary_peer::frame::{decode_frame, DataHeader, Frame, Get, MissReason};
use granary_rdma::driver::{
    Driver, DriverConfig, DriverError, Event, Extent, FailReason, PeerStatus,
};
use granary_rdma::{SetupParams, Verbs};
use granary_shm::arena::ArenaSlice;
use std::collections::HashMap;
use std::os::fd::BorrowedFd;

/// What the RDMA links report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkEvent {
    /// Requester: the block landed in its extent: the owner's data header
    /// and the CRC-32C of the bytes (the requester verifies them).
    Landed {
        member: usize,
        request: u64,
        extent: Extent,
        header: DataHeader,
        crc32c: u32,
    },
    /// Requester: a block landed that was not the one asked for (another
    /// sample, length or extent); read it from the store.
    Corrupt { member: usize, request: u64 },
    /// Requester: the owner answered with a miss.
    Miss {
        member: usize,
        request: u64,
        reason: MissReason,
    },
    /// Requester: the request left RDMA (its queue pair failed); the
    /// requester asks again over TCP or reads the store.
    Back { member: usize, request: u64 },
    /// Owner: a peer asks for a block of `len` bytes at most.
    Request { member: usize, get: Get, len: u32 },
    /// Owner: the block for `request` is written (or never will be): its
    /// source may be released.
    Released { member: usize, request: u64 },
    /// The queue pair to `member` is gone (after its requests came back
    /// as `Back` and its served blocks as `Released`).
    Down { member: usize },
}

/// Why a call was refused: the caller uses TCP for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkError {
    /// The driver refused.
    Driver(DriverError),
    /// Bytes from the peer that are not setup parameters.
    BadSetup(String),
    /// Setup bytes on connection `conn` from a member whose queue pair is
    /// up, or being set up, over another connection (`channel`): refused.
    OtherChannel { conn: ConnId, channel: ConnId },
    /// A frame that does not encode (a bug of ours).
    Frame(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Driver(e) => write!(f, "{e}"),
            LinkError::BadSetup(e) => write!(f, "RDMA setup parameters: {e}"),
            LinkError::OtherChannel { conn, channel } => write!(
                f,
                "RDMA setup on connection {conn}, but the queue pair is set up over connection {channel}"
            ),
            LinkError::Frame(e) => write!(f, "frame: {e}"),
        }
    }
}

impl From<DriverError> for LinkError {
    fn from(e: DriverError) -> LinkError {
        LinkError::Driver(e)
    }
}

/// Our get in flight over RDMA.
struct Asked {
    member: usize,
    get: Get,
    extent: Extent,
}

/// Most one refusal line per member per this many ns.
const REFUSAL_LOG_NS: u64 = 1_000_000_000;

/// When a refusal was last logged, and how many came since.
#[derive(Debug, Clone, Copy, Default)]
struct Refusals {
    logged: Option<u64>,
    held: u64,
}

/// The RDMA links of one agent to its peers (members of the view).
pub(crate) struct RdmaLinks<V: Verbs> {
    driver: Driver<V>,
    asked: HashMap<u64, Asked>,
    /// Members RDMA was ever set up with.
    tried: Vec<bool>,
    /// Per member: the connection its queue pair was set up over (what it
    /// says only counts while the queue pair is up or being set up).
    channel: Vec<Option<ConnId>>,
    /// Per member: setup bytes refused for coming on another connection.
    refusals: Vec<Refusals>,
    /// Events of driver calls made outside [`RdmaLinks::poll`], reported
    /// by the next poll.
    held: Vec<Event>,
}

impl<V: Verbs> std::fmt::Debug for RdmaLinks<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaLinks")
            .field("members", &self.tried.len())
            .field("asked", &self.asked.len())
            .finish()
    }
}

fn frame_bytes(f: &Frame) -> Result<Vec<u8>, LinkError> {
    f.to_bytes().map_err(|e| LinkError::Frame(format!("{e:?}")))
}

fn decode(bytes: &[u8]) -> Option<Frame> {
    match decode_frame(bytes) {
        Ok(Some((f, n))) if n == bytes.len() => Some(f),
        _ => None,
    }
}

impl<V: Verbs> RdmaLinks<V> {
    /// Registers an arena of `arena_len` bytes of the backend's own once,
    /// for a job of two members (the tests').
    #[cfg(test)]
    pub(crate) fn new(
        verbs: V,
        arena_len: u64,
        cfg: DriverConfig,
    ) -> Result<RdmaLinks<V>, LinkError> {
        let driver = Driver::new(verbs, arena_len, cfg)?;
        Ok(RdmaLinks::over(driver, 2))
    }

    /// Registers `arena`, the agent's shared arena, in place, for
    /// `members` peers: extents are offsets into it.
    pub(crate) fn with_arena(
        verbs: V,
        arena: ArenaSlice,
        cfg: DriverConfig,
        members: usize,
    ) -> Result<RdmaLinks<V>, LinkError> {
        Ok(RdmaLinks::over(
            Driver::with_arena(verbs, arena, cfg)?,
            members,
        ))
    }

    fn over(driver: Driver<V>, members: usize) -> RdmaLinks<V> {
        RdmaLinks {
            driver,
            asked: HashMap::new(),
            tried: vec![false; members],
            channel: vec![None; members],
            refusals: vec![Refusals::default(); members],
            held: Vec::new(),
        }
    }

    /// The driver (its arena, its settings).
    #[cfg(test)]
    pub(crate) fn driver_mut(&mut self) -> &mut Driver<V> {
        &mut self.driver
    }

    /// Readable when a completion may be waiting; `None`: poll every turn.
    pub(crate) fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        self.driver.completion_fd()
    }

    /// Whether the queue pair to any member is up.
    pub(crate) fn any_up(&self) -> bool {
        (0..self.tried.len()).any(|m| self.link(m) == LinkTransport::Rdma)
    }

    fn peer(member: usize) -> u32 {
        member as u32
    }

    /// Prepares a queue pair to `member`, to live on connection `conn`
    /// (its channel); the bytes go to it over that authenticated
    /// connection.
    pub(crate) fn offer(
        &mut self,
        member: usize,
        conn: ConnId,
        now: u64,
    ) -> Result<Vec<u8>, LinkError> {
        let mut ev = Vec::new();
        let p = self.driver.prepare(Self::peer(member), now, &mut ev)?;
        if let Some(t) = self.tried.get_mut(member) {
            *t = true;
        }
        if let Some(c) = self.channel.get_mut(member) {
            *c = Some(conn);
        }
        // A queue pair replaced here sends its requests back (next poll).
        self.held.append(&mut ev);
        Ok(p.encode().to_vec())
    }

    /// The connection the queue pair to `member` was set up over, while
    /// that queue pair is up or being set up.
    pub(crate) fn channel(&self, member: usize) -> Option<ConnId> {
        match self.driver.status(Self::peer(member)) {
            PeerStatus::Connecting | PeerStatus::Up { .. } => {
                self.channel.get(member).copied().flatten()
            }
            PeerStatus::Idle | PeerStatus::Down { .. } => None,
        }
    }

    /// Handles setup bytes from `member` on connection `conn`: the answer
    /// to our offer, or an offer of its own, answered with ours (returned,
    /// to send back over `conn`). Refused, leaving the queue pair as it
    /// is, when the member's queue pair is up or being set up over another
    /// connection.
    pub(crate) fn on_setup(
        &mut self,
        member: usize,
        conn: ConnId,
        bytes: &[u8],
        now: u64,
    ) -> Result<Option<Vec<u8>>, LinkError> {
        if let Some(channel) = self.channel(member).filter(|&c| c != conn) {
            if let Some(r) = self.refusals.get_mut(member) {
                r.held += 1;
            }
            return Err(LinkError::OtherChannel { conn, channel });
        }
        if self.driver.status(Self::peer(member)) == PeerStatus::Connecting {
            self.accept(member, bytes, now)?;
            return Ok(None);
        }
        // Checked before a queue pair is made for it.
        SetupParams::decode(bytes).map_err(|e| LinkError::BadSetup(e.to_string()))?;
        self.driver.peer_offered(Self::peer(member));
        let ours = self.offer(member, conn, now)?;
        self.accept(member, bytes, now)?;
        Ok(Some(ours))
    }

    /// After a refusal of `member`'s setup bytes: `Some(n)` when a line
    /// may be logged now (at most one a second per member), `n` being the
    /// refusals since the last line, the latest included.
    pub(crate) fn refusal_due(&mut self, member: usize, now: u64) -> Option<u64> {
        let r = self.refusals.get_mut(member)?;
        if r.held == 0
            || r.logged
                .is_some_and(|t| now.saturating_sub(t) < REFUSAL_LOG_NS)
        {
            return None;
        }
        r.logged = Some(now);
        Some(std::mem::take(&mut r.held))
    }

    /// Whether to offer a queue pair to `member` now (we are `me`): the
    /// lower index offers first, and after a failure either side offers
    /// again once its backoff is over.
    pub(crate) fn to_offer(&self, me: usize, member: usize, now: u64) -> bool {
        match self.driver.status(Self::peer(member)) {
            PeerStatus::Idle => me < member,
            PeerStatus::Down { retry_at } => now >= retry_at,
            PeerStatus::Connecting | PeerStatus::Up { .. } => false,
        }
    }

    /// Connection `conn` to `member` ended: when it is the queue pair's
    /// channel, the queue pair is closed (its requests come back as
    /// `Back`) and true returned; any other connection ending leaves it.
    pub(crate) fn close(&mut self, member: usize, conn: ConnId, now: u64) -> bool {
        if self.channel(member) != Some(conn) {
            return false;
        }
        self.driver.close(Self::peer(member), now, &mut self.held);
        if let Some(c) = self.channel.get_mut(member) {
            *c = None;
        }
        true
    }

    /// Connects to `member` with the bytes it offered.
    pub(crate) fn accept(
        &mut self,
        member: usize,
        bytes: &[u8],
        now: u64,
    ) -> Result<(), LinkError> {
        let p = SetupParams::decode(bytes).map_err(|e| LinkError::BadSetup(e.to_string()))?;
        let peer = Self::peer(member);
        Ok(self.driver.connect(peer, &p, now, &mut self.held)?)
    }

    /// How blocks travel to `member` now.
    pub(crate) fn link(&self, member: usize) -> LinkTransport {
        match self.driver.status(Self::peer(member)) {
            PeerStatus::Up { .. } => LinkTransport::Rdma,
            _ => LinkTransport::RdmaFallback,
        }
    }

    /// Members whose RDMA failed and may be probed again now: offer them
    /// a queue pair again.
    #[cfg(test)]
    pub(crate) fn probe_due(&self, now: u64) -> Vec<usize> {
        (0..self.tried.len())
            .filter(|&m| self.tried[m])
            .filter(|&m| {
                matches!(self.driver.status(Self::peer(m)),
                    PeerStatus::Down { retry_at } if now >= retry_at)
            })
            .collect()
    }

    /// Asks `member` for `get`'s block, to land in `extent`. Refused (use
    /// TCP) when no queue pair is up.
    pub(crate) fn get(
        &mut self,
        member: usize,
        get: Get,
        extent: Extent,
        now: u64,
    ) -> Result<(), LinkError> {
        let frame = frame_bytes(&Frame::Get(get))?;
        let peer = Self::peer(member);
        self.driver
            .get(peer, get.request, extent, &frame, now, &mut self.held)?;
        self.asked.insert(
            get.request,
            Asked {
                member,
                get,
                extent,
            },
        );
        Ok(())
    }

    /// Owner: writes the block at `src` with its data `header` (the
    /// length is `src`'s).
    pub(crate) fn serve(
        &mut self,
        member: usize,
        header: DataHeader,
        src: Extent,
        now: u64,
    ) -> Result<(), LinkError> {
        let request = header.request;
        let header = frame_bytes(&Frame::Data(DataHeader {
            length: u64::from(src.len),
            ..header
        }))?;
        let peer = Self::peer(member);
        Ok(self
            .driver
            .serve(peer, request, src, &header, now, &mut self.held)?)
    }

    /// Owner: answers `get` with a miss.
    pub(crate) fn miss(
        &mut self,
        member: usize,
        get: Get,
        reason: MissReason,
        now: u64,
    ) -> Result<(), LinkError> {
        let frame = frame_bytes(&Frame::Miss {
            request: get.request,
            sample: get.sample,
            reason,
        })?;
        let peer = Self::peer(member);
        Ok(self
            .driver
            .answer(peer, get.request, &frame, now, &mut self.held)?)
    }

    /// Polls the completions; appends what happened to `out`.
    pub(crate) fn poll(&mut self, now: u64, out: &mut Vec<LinkEvent>) {
        let mut ev = std::mem::take(&mut self.held);
        if let Err(e) = self.driver.poll(now, &mut ev) {
            tracing::warn!("RDMA completion queue: {e}");
        }
        for e in ev {
            self.on_event(e, out);
        }
    }

    fn on_event(&mut self, e: Event, out: &mut Vec<LinkEvent>) {
        match e {
            Event::Landed {
                request,
                extent,
                len,
                header,
                ..
            } => {
                let Some(a) = self.asked.remove(&request) else {
                    return;
                };
                let member = a.member;
                let landed = match decode(&header) {
                    Some(Frame::Data(h))
                        if h.request == request
                            && h.sample == a.get.sample
                            && h.length == a.get.length
                            && u64::from(len) == h.length
                            && extent == a.extent =>
                    {
                        let mut bytes = vec![0u8; len as usize];
                        self.driver
                            .read_arena(extent.offset, &mut bytes)
                            .ok()
                            .map(|()| (h, crc32c::crc32c(&bytes)))
                    }
                    _ => None,
                };
                out.push(match landed {
                    Some((header, crc32c)) => LinkEvent::Landed {
                        member,
                        request,
                        extent,
                        header,
                        crc32c,
                    },
                    None => LinkEvent::Corrupt { member, request },
                });
            }
            Event::Answered { request, frame, .. } => {
                let Some(a) = self.asked.remove(&request) else {
                    return;
                };
                let reason = match decode(&frame) {
                    Some(Frame::Miss { reason, .. }) => reason,
                    _ => MissReason::StoreError,
                };
                out.push(LinkEvent::Miss {
                    member: a.member,
                    request,
                    reason,
                });
            }
            Event::Fallback { request, .. } => {
                let Some(a) = self.asked.remove(&request) else {
                    return;
                };
                out.push(LinkEvent::Back {
                    member: a.member,
                    request,
                });
            }
            Event::GetReceived {
                peer, len, frame, ..
            } => {
                let member = peer as usize;
                match decode(&frame) {
                    Some(Frame::Get(get)) => out.push(LinkEvent::Request { member, get, len }),
                    _ => tracing::warn!(member, "RDMA get without a get frame; ignored"),
                }
            }
            Event::Served { peer, request } | Event::ServeAborted { peer, request } => {
                out.push(LinkEvent::Released {
                    member: peer as usize,
                    request,
                });
            }
            Event::PeerDown {
                peer,
                reason,
                retry_at,
            } => {
                let member = peer as usize;
                match reason {
                    FailReason::Closed | FailReason::Replaced => tracing::debug!(
                        member,
                        "RDMA queue pair to peer {reason}; set up again when offered"
                    ),
                    _ => tracing::warn!(
                        member,
                        retry_at,
                        "RDMA to peer down ({reason}); TCP carries its blocks until probed again"
                    ),
                }
                out.push(LinkEvent::Down { member });
            }
            Event::Control { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_peer::block::{block_crc, block_crc_of};
    use granary_rdma::fake::{Fabric, FakeNic};
    use granary_rdma::verbs::WcStatus;

    const ARENA: u64 = 4 << 20;
    const FP: u64 = 0x1234_5678_9abc_def0;
    /// Each side's name for the connection between a and b.
    const A_CONN: ConnId = 7;
    const B_CONN: ConnId = 70;
    /// The owner answers this sample with a miss.
    const NOT_KEPT: u64 = 999;

    fn block(sample: u64) -> Vec<u8> {
        (0..(1000 + sample * 37) as usize)
            .map(|i| (i as u64 ^ sample) as u8)
            .collect()
    }

    /// A request for `sample`'s whole block, with no due time.
    fn get_block(request: u64, sample: u64) -> Get {
        Get {
            request,
            fingerprint: FP,
            sample,
            length: block(sample).len() as u64,
            due: u64::MAX,
        }
    }

    /// Owner: writes `get`'s block at `offset` of the arena and serves it
    /// from there.
    fn serve_block(
        links: &mut RdmaLinks<FakeNic>,
        member: usize,
        get: &Get,
        offset: u64,
        now: u64,
    ) -> Result<(), LinkError> {
        let bytes = block(get.sample);
        let src = Extent {
            offset,
            len: bytes.len() as u32,
        };
        links.driver_mut().write_arena(offset, &bytes).unwrap();
        let crc = block_crc(FP, get.sample, &bytes);
        links.serve(member, DataHeader::answering(get, crc, 0), src, now)
    }

    /// Two agents' links on one fake fabric: member 0 asks, member 1 owns.
    struct Pair {
        fabric: Fabric,
        a: RdmaLinks<FakeNic>,
        b: RdmaLinks<FakeNic>,
        now: u64,
        next: u64,
    }

    impl Pair {
        fn new() -> Pair {
            let fabric = Fabric::new(5);
            let cfg = DriverConfig {
                transfer_timeout_ns: 100_000_000,
                ..DriverConfig::default()
            };
            let a = RdmaLinks::new(fabric.add_host(), ARENA, cfg).unwrap();
            let b = RdmaLinks::new(fabric.add_host(), ARENA, cfg).unwrap();
            let mut p = Pair {
                fabric,
                a,
                b,
                now: 1,
                next: 0,
            };
            p.connect();
            p
        }

        /// The setup bytes each side would send over its TCP connection.
        fn connect(&mut self) {
            let from_a = self.a.offer(1, A_CONN, self.now).unwrap();
            let from_b = self.b.offer(0, B_CONN, self.now).unwrap();
            self.a.accept(1, &from_b, self.now).unwrap();
            self.b.accept(0, &from_a, self.now).unwrap();
        }

        fn get(&mut self, request: u64, sample: u64, due: u64) -> Result<Extent, LinkError> {
            let get = Get {
                due,
                ..get_block(request, sample)
            };
            let extent = Extent {
                offset: self.next,
                len: get.length as u32,
            };
            self.next += get.length.next_multiple_of(64);
            self.a.get(1, get, extent, self.now).map(|()| extent)
        }

        /// Runs both sides for `steps` ms; the owner serves every request.
        fn run(&mut self, steps: u32) -> Vec<LinkEvent> {
            let mut got = Vec::new();
            for _ in 0..steps {
                self.now += 1_000_000;
                let mut ev = Vec::new();
                self.b.poll(self.now, &mut ev);
                for e in ev {
                    if let LinkEvent::Request { member, get, .. } = e {
                        if get.sample == NOT_KEPT {
                            let _ = self.b.miss(member, get, MissReason::NotKept, self.now);
                            continue;
                        }
                        let offset = ARENA / 2 + get.sample * 4096;
                        let _ = serve_block(&mut self.b, member, &get, offset, self.now);
                    }
                }
                self.a.poll(self.now, &mut got);
            }
            got
        }
    }

    #[test]
    fn blocks_land_in_the_named_extent_with_their_crc_checked() {
        let mut p = Pair::new();
        assert_eq!(p.a.link(1), LinkTransport::Rdma);
        let mut extents = HashMap::new();
        for r in 0..20u64 {
            extents.insert(r, p.get(r, r + 3, u64::MAX).unwrap());
        }
        let got = p.run(50);
        assert_eq!(got.len(), 20, "{got:?}");
        for e in got {
            let LinkEvent::Landed {
                request,
                extent,
                crc32c,
                ..
            } = e
            else {
                panic!("not landed: {e:?}");
            };
            assert_eq!(extents[&request], extent);
            let mut bytes = vec![0u8; extent.len as usize];
            p.a.driver_mut()
                .read_arena(extent.offset, &mut bytes)
                .unwrap();
            assert_eq!(bytes, block(request + 3));
            assert_eq!(crc32c, crc32c::crc32c(&bytes));
        }
    }

    #[test]
    fn a_corrupted_write_lands_with_bytes_its_header_crc_rejects() {
        let mut p = Pair::new();
        p.fabric.corrupt_next_write(1);
        p.get(7, 9, u64::MAX).unwrap();
        p.get(8, 10, u64::MAX).unwrap();
        let got = p.run(50);
        // What the requester checks (`Requester::data`): the block CRC of
        // the bytes received against the header's.
        let verified = |request: u64| {
            got.iter().find_map(|e| match e {
                LinkEvent::Landed {
                    request: r,
                    header,
                    crc32c,
                    ..
                } if *r == request => {
                    Some(block_crc_of(FP, header.sample, header.length, *crc32c) == header.crc)
                }
                _ => None,
            })
        };
        assert_eq!(verified(7), Some(false), "{got:?}");
        assert_eq!(verified(8), Some(true), "{got:?}");
    }

    #[test]
    fn an_error_completion_sends_requests_to_tcp_or_the_store_and_rdma_comes_back() {
        let mut p = Pair::new();
        p.fabric.inject(1, None, None, WcStatus::RetryExceeded);
        let soon = p.now + 1_000_000_000;
        p.get(1, 1, soon).unwrap();
        // Already past due: it goes to the store.
        p.get(2, 2, p.now).unwrap();
        let got = p.run(200);
        // Both come back; the requester sends the first over TCP (due
        // ahead) and the second to the store (`Requester::back`).
        for request in [1, 2] {
            assert!(
                got.contains(&LinkEvent::Back { member: 1, request }),
                "{got:?}"
            );
        }
        assert_eq!(p.a.link(1), LinkTransport::RdmaFallback);
        // Refused while backing off: the caller uses TCP.
        assert!(p.get(3, 3, u64::MAX).is_err());
        assert!(p.a.probe_due(p.now).is_empty());
        // After the backoff the requester probes again.
        p.now += DriverConfig::default().backoff_max_ns;
        assert_eq!(p.a.probe_due(p.now), vec![1]);
        p.connect();
        assert_eq!(p.a.link(1), LinkTransport::Rdma);
        p.get(4, 4, u64::MAX).unwrap();
        let got = p.run(50);
        assert!(
            got.iter()
                .any(|e| matches!(e, LinkEvent::Landed { request: 4, .. })),
            "{got:?}"
        );
    }

    #[test]
    fn a_miss_comes_back_as_a_miss() {
        let mut p = Pair::new();
        p.get(5, NOT_KEPT, u64::MAX).unwrap();
        let got = p.run(20);
        assert_eq!(
            got,
            vec![LinkEvent::Miss {
                member: 1,
                request: 5,
                reason: MissReason::NotKept
            }]
        );
    }

    /// Two agents' transports on 127.0.0.1 with their RDMA links on one
    /// fake fabric: the queue pair parameters travel as RDMA setup frames
    /// on the authenticated TCP connection, then a block goes by RDMA.
    #[test]
    fn queue_pairs_are_set_up_over_the_authenticated_tcp_connection() {
        use crate::peers::net::{Claim, Event as NetEvent, Net, NetConfig, OutGet};
        use granary_peer::conn::ConnConfig;
        use granary_peer::view::{Member, View};
        use granary_shm::arena::Arena;
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
        };
        let addrs = [port(), port()];
        let view = Arc::new(
            View::new(
                "job",
                1,
                (0..2).map(|i| Member::new(format!("m{i}"), addrs[i].to_string(), 1 << 30)),
            )
            .unwrap(),
        );
        let nets: Vec<Net> = (0..2)
            .map(|me| {
                let mut conn = ConnConfig::new(
                    "job",
                    format!("m{me}"),
                    view.digest().0,
                    crate::sys::random_u64(),
                    b"secret".to_vec(),
                );
                conn.keepalive = 1_000_000_000;
                Net::start(
                    NetConfig {
                        view: Arc::clone(&view),
                        me,
                        conn,
                        connect_timeout: Duration::from_secs(2),
                        redial_after: Duration::from_millis(100),
                        settling: Duration::ZERO,
                        source: None,
                        limits: crate::peers::net::Limits::default(),
                        rejected: Default::default(),
                    },
                    addrs[me],
                )
                .unwrap()
            })
            .collect();
        let fabric = Fabric::new(3);
        let mut links: Vec<RdmaLinks<FakeNic>> = (0..2)
            .map(|_| RdmaLinks::new(fabric.add_host(), ARENA, DriverConfig::default()).unwrap())
            .collect();
        // A first TCP request opens the connection (the owner answers it
        // with a miss).
        let arena = Arena::heap(1 << 20).unwrap();
        nets[0].get(
            1,
            OutGet {
                get: Get {
                    request: 1,
                    fingerprint: FP,
                    sample: 1,
                    length: 10,
                    due: u64::MAX / 2,
                },
                dest: arena.slice(0, 10).unwrap(),
                claim: Arc::new(Claim::default()),
            },
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut landed = None;
        let mut asked = false;
        let mut now = 1u64;
        while landed.is_none() && Instant::now() < deadline {
            now += 1_000_000;
            for me in 0..2 {
                let mut ev = Vec::new();
                nets[me].drain(&mut ev);
                for e in ev {
                    match e {
                        // The dialler offers first.
                        NetEvent::Up { conn, member, .. } if me == 0 => {
                            let bytes = links[0].offer(member, conn, now).unwrap();
                            nets[0].send_rdma_setup(conn, bytes);
                        }
                        NetEvent::RdmaSetup {
                            conn,
                            member,
                            bytes,
                        } => {
                            if me == 1 {
                                let ours = links[1].offer(member, conn, now).unwrap();
                                nets[1].send_rdma_setup(conn, ours);
                            }
                            links[me].accept(member, &bytes, now).unwrap();
                        }
                        NetEvent::Request { conn, get } => {
                            nets[me].send_miss(conn, get, MissReason::NotKept);
                        }
                        _ => {}
                    }
                }
            }
            if !asked && links[0].link(1) == LinkTransport::Rdma {
                assert_eq!(links[1].link(0), LinkTransport::Rdma);
                let get = get_block(2, 42);
                let extent = Extent {
                    offset: 4096,
                    len: get.length as u32,
                };
                links[0].get(1, get, extent, now).unwrap();
                asked = true;
            }
            let mut ev = Vec::new();
            links[1].poll(now, &mut ev);
            for e in ev {
                if let LinkEvent::Request { member, get, .. } = e {
                    serve_block(&mut links[1], member, &get, 0, now).unwrap();
                }
            }
            let mut ev = Vec::new();
            links[0].poll(now, &mut ev);
            landed = ev.into_iter().find_map(|e| match e {
                LinkEvent::Landed { extent, .. } => Some(extent),
                _ => None,
            });
            std::thread::sleep(Duration::from_millis(1));
        }
        let extent = landed.expect("a block landed by RDMA after the TCP setup");
        let mut bytes = vec![0u8; extent.len as usize];
        links[0]
            .driver_mut()
            .read_arena(extent.offset, &mut bytes)
            .unwrap();
        assert_eq!(bytes, block(42));
        assert_eq!(fabric.stats().writes, 1, "one RDMA write");
    }

    /// The lower index offers; the other answers; after a failure either
    /// side offers once its backoff is over, and an offer is answered even
    /// by a side still backing off; offers that cross both connect.
    #[test]
    fn offers_go_from_the_lower_index_and_are_always_answered() {
        let fabric = Fabric::new(9);
        let cfg = DriverConfig::default();
        let mut a = RdmaLinks::new(fabric.add_host(), ARENA, cfg).unwrap();
        let mut b = RdmaLinks::new(fabric.add_host(), ARENA, cfg).unwrap();
        // a is member 0, b member 1.
        assert!(a.to_offer(0, 1, 1));
        assert!(!b.to_offer(1, 0, 1), "the higher index waits");
        let offer = a.offer(1, A_CONN, 1).unwrap();
        assert!(!a.to_offer(0, 1, 1), "connecting");
        let answer = b
            .on_setup(0, B_CONN, &offer, 1)
            .unwrap()
            .expect("an answer");
        assert_eq!(
            a.on_setup(1, A_CONN, &answer, 1).unwrap(),
            None,
            "our answer"
        );
        assert_eq!(
            (a.link(1), b.link(0)),
            (LinkTransport::Rdma, LinkTransport::Rdma)
        );
        // The requester's queue pair fails.
        fabric.inject(
            0,
            None,
            Some(granary_rdma::verbs::Opcode::Send),
            WcStatus::Flushed,
        );
        let get = Get {
            request: 1,
            fingerprint: FP,
            sample: 1,
            length: 10,
            due: u64::MAX,
        };
        a.get(1, get, Extent { offset: 0, len: 10 }, 2).unwrap();
        let mut ev = Vec::new();
        a.poll(2, &mut ev);
        assert!(ev.contains(&LinkEvent::Down { member: 1 }), "{ev:?}");
        assert!(!a.to_offer(0, 1, 3), "backing off");
        // b, whose queue pair still looks up, offers anew (as after its
        // own failure): a answers although it is backing off.
        let offer = b.offer(0, B_CONN, 3).unwrap();
        let answer = a
            .on_setup(1, A_CONN, &offer, 3)
            .unwrap()
            .expect("an answer");
        b.on_setup(0, B_CONN, &answer, 3).unwrap();
        assert_eq!(
            (a.link(1), b.link(0)),
            (LinkTransport::Rdma, LinkTransport::Rdma)
        );
        // Offers that cross: each side takes the other's as the answer.
        let (oa, ob) = (
            a.offer(1, A_CONN, 4).unwrap(),
            b.offer(0, B_CONN, 4).unwrap(),
        );
        assert_eq!(a.on_setup(1, A_CONN, &ob, 4).unwrap(), None);
        assert_eq!(b.on_setup(0, B_CONN, &oa, 4).unwrap(), None);
        assert_eq!(
            (a.link(1), b.link(0)),
            (LinkTransport::Rdma, LinkTransport::Rdma)
        );
        // The connected pair carries a block.
        let get = get_block(2, 5);
        let e = Extent {
            offset: 8192,
            len: get.length as u32,
        };
        a.get(1, get, e, 5).unwrap();
        let mut landed = false;
        for _ in 0..10 {
            let mut ev = Vec::new();
            b.poll(5, &mut ev);
            for x in ev {
                if let LinkEvent::Request { member, get, .. } = x {
                    serve_block(&mut b, member, &get, 0, 5).unwrap();
                }
            }
            let mut ev = Vec::new();
            a.poll(5, &mut ev);
            landed |= ev
                .iter()
                .any(|x| matches!(x, LinkEvent::Landed { request: 2, .. }));
        }
        assert!(landed);
        // The TCP connection ends: the queue pair is closed, no backoff.
        assert!(a.close(1, A_CONN, 6));
        assert_eq!(a.link(1), LinkTransport::RdmaFallback);
        assert!(a.to_offer(0, 1, 6), "offered again on the next connection");
    }

    #[test]
    fn bad_setup_bytes_are_refused() {
        let fabric = Fabric::new(1);
        let mut a = RdmaLinks::new(fabric.add_host(), ARENA, DriverConfig::default()).unwrap();
        a.offer(1, A_CONN, 1).unwrap();
        assert!(matches!(
            a.accept(1, b"short", 1),
            Err(LinkError::BadSetup(_))
        ));
        assert_eq!(a.link(1), LinkTransport::RdmaFallback);
    }
    /// A queue pair lives and dies with the connection it was set up over:
    /// setup bytes from the member on another connection are refused
    /// (counted, logged at most once a second) and leave it carrying
    /// blocks; another connection ending leaves it; its own ending closes
    /// it, after which another connection may set one up.
    #[test]
    fn a_queue_pair_belongs_to_the_connection_it_was_set_up_over() {
        let mut p = Pair::new();
        assert_eq!(p.a.channel(1), Some(A_CONN));
        assert_eq!(p.b.channel(0), Some(B_CONN));
        let other: ConnId = 8;
        // A queue pair of a third host's offered on another connection
        // authenticated as b, and a's own answer replayed there.
        let mut rogue =
            RdmaLinks::new(p.fabric.add_host(), ARENA, DriverConfig::default()).unwrap();
        let offer = rogue.offer(0, 1, p.now).unwrap();
        let qps = p.fabric.qp_count(0);
        for _ in 0..3 {
            assert_eq!(
                p.a.on_setup(1, other, &offer, p.now),
                Err(LinkError::OtherChannel {
                    conn: other,
                    channel: A_CONN
                })
            );
        }
        assert_eq!(p.fabric.qp_count(0), qps, "no queue pair made or replaced");
        assert_eq!(p.a.channel(1), Some(A_CONN));
        assert_eq!(p.a.link(1), LinkTransport::Rdma);
        // Logged once, then at most once a second with the count held back.
        assert_eq!(p.a.refusal_due(1, p.now), Some(3));
        assert_eq!(p.a.refusal_due(1, p.now), None, "nothing new to log");
        let _ = p.a.on_setup(1, other, &offer, p.now + 1);
        assert_eq!(p.a.refusal_due(1, p.now + 1), None, "within the second");
        let _ = p.a.on_setup(1, other, &offer, p.now + 2_000_000_000);
        assert_eq!(p.a.refusal_due(1, p.now + 2_000_000_000), Some(2));
        // The queue pair still carries blocks.
        let e = p.get(1, 4, u64::MAX).unwrap();
        let got = p.run(20);
        assert!(
            got.iter()
                .any(|x| matches!(x, LinkEvent::Landed { request: 1, extent, .. } if *extent == e)),
            "{got:?}"
        );
        // Another connection of b's ending leaves it.
        assert!(!p.a.close(1, other, p.now));
        assert_eq!(p.a.link(1), LinkTransport::Rdma);
        // Its own connection ending closes it.
        assert!(p.a.close(1, A_CONN, p.now));
        assert_eq!(p.a.link(1), LinkTransport::RdmaFallback);
        assert_eq!(p.a.channel(1), None);
        // Then another connection may carry a new one.
        let offer = p.b.offer(0, 80, p.now).unwrap();
        let answer =
            p.a.on_setup(1, other, &offer, p.now)
                .unwrap()
                .expect("answered");
        p.b.on_setup(0, 80, &answer, p.now).unwrap();
        assert_eq!(p.a.channel(1), Some(other));
        assert_eq!(p.a.link(1), LinkTransport::Rdma);
    }
}
