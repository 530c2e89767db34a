//! The RDMA data path over a [`Verbs`] backend, below the peer protocol
//! core and agnostic of it: protocol frames are opaque bytes.
//!
//! * The whole arena is registered once, local write + window binds: its
//!   own rkey grants peers nothing (never remote read either: [`Access`]
//!   cannot say it). Message buffers live in a second region with local
//!   rights only.
//! * Each peer gets one RC queue pair, set up over the peer's
//!   authenticated TCP connection: [`Driver::prepare`] returns the
//!   [`SetupParams`] to send, [`Driver::connect`] takes the peer's.
//!   Receives are posted before the parameters leave, so the peer's first
//!   send always finds one.
//! * A get names the requester's reserved extent (address, rkey, length).
//!   The rkey is a memory window's, bound (on the peer's queue pair, just
//!   before the get is sent) to exactly that extent with remote write: the
//!   peer can write those bytes and no others, and only through its own
//!   queue pair. The owner posts an RDMA write of the payload, then a send
//!   of the data header on the same queue pair: when the header arrives
//!   the bytes have landed. The requester then invalidates the window and
//!   reports the block only once the invalidate completed, so nothing can
//!   change the extent after it is reported; a miss is reported the same
//!   way. A get waits in the queue while all of the peer's
//!   [`DriverConfig::windows_per_peer`] windows are in use.
//! * Flow control: each side grants `recv_depth` credits and posts that
//!   many receives plus [`CREDIT_RESERVE`]; every message returns the
//!   receives reposted since the last one, and a credit-only message (which
//!   takes no credit) goes out when half the depth is owed. A sender never
//!   posts a credited send without a credit, so "receiver not ready" cannot
//!   happen in a healthy pair.
//! * On any error completion, a malformed message, a failed post or a
//!   transfer older than the timeout, the queue pair is destroyed first
//!   (after which nothing more can land in the arena through it) and the
//!   windows still bound through it are deallocated (their rkeys name
//!   nothing any more), and only then is every request in flight reported
//!   as [`Event::Fallback`] (the caller retries over TCP, or the store).
//!   RDMA to that peer is probed again after an exponential backoff.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::os::fd::BorrowedFd;

use granary_shm::arena::ArenaSlice;

use crate::msg::Msg;
use crate::setup::{SetupParams, MAX_SLOT, MIN_SLOT};
use crate::verbs::{
    Access, Mr, Mtu, MwId, Opcode, QpCaps, QpId, QpTiming, RemoteAddr, Sge, Transition, Verbs,
    VerbsError, WcStatus, WindowSpan, WorkCompletion,
};

/// The caller's name for a peer.
pub type PeerId = u32;

/// Driver settings. The defaults are those documented in `docs/rdma.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Receives posted per peer: the credits granted to it.
    pub recv_depth: u16,
    /// Message send slots per peer (the send queue holds twice as many
    /// work requests, a write or a window bind and a send per message,
    /// plus one invalidate per window).
    pub send_depth: u16,
    /// Memory windows per peer: the most of our gets to it whose extent a
    /// window is bound to (sent and not yet answered, or answered and
    /// being invalidated). Further gets wait in the queue.
    pub windows_per_peer: u16,
    /// Bytes of each message slot (longest message).
    pub slot_size: u32,
    /// Most peers with a queue pair at once.
    pub max_peers: u16,
    /// Queue pair reliability settings.
    pub timing: QpTiming,
    /// A get unanswered this long tears the queue pair down (ns).
    pub transfer_timeout_ns: u64,
    /// A queue pair not connected this long after `prepare` is dropped (ns).
    pub setup_timeout_ns: u64,
    /// First wait before RDMA to a failed peer is probed again (ns).
    pub backoff_initial_ns: u64,
    /// Longest such wait (ns).
    pub backoff_max_ns: u64,
}

impl Default for DriverConfig {
    fn default() -> DriverConfig {
        DriverConfig {
            recv_depth: 64,
            send_depth: 64,
            windows_per_peer: 64,
            slot_size: 4096,
            max_peers: 64,
            timing: QpTiming {
                mtu: Mtu::M4096,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 6,
                min_rnr_timer: 12,
            },
            transfer_timeout_ns: 2_000_000_000,
            setup_timeout_ns: 5_000_000_000,
            backoff_initial_ns: 100_000_000,
            backoff_max_ns: 30_000_000_000,
        }
    }
}

/// A span of the local arena, relative to its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Offset in the arena.
    pub offset: u64,
    /// Length.
    pub len: u32,
}

/// Why requests fell back or a queue pair went down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// An error completion.
    Completion(WcStatus),
    /// A transfer or the setup took longer than its timeout.
    Timeout,
    /// The peer sent something malformed or unexpected.
    Protocol(String),
    /// A verbs call failed.
    Verbs(VerbsError),
    /// `prepare` was called again for the peer.
    Replaced,
    /// `close` was called.
    Closed,
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::Completion(s) => write!(f, "error completion {s:?}"),
            FailReason::Timeout => write!(f, "timed out"),
            FailReason::Protocol(m) => write!(f, "protocol error: {m}"),
            FailReason::Verbs(e) => write!(f, "{e}"),
            FailReason::Replaced => write!(f, "queue pair replaced"),
            FailReason::Closed => write!(f, "closed"),
        }
    }
}

/// What the driver reports from [`Driver::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Owner side: a peer asks for a block to be written into an extent of
    /// `len` bytes. Answer with [`Driver::serve`] or [`Driver::answer`].
    GetReceived {
        /// The peer.
        peer: PeerId,
        /// Its request id.
        request: u64,
        /// The extent's length.
        len: u32,
        /// The protocol's get frame.
        frame: Vec<u8>,
    },
    /// Requester side: `len` bytes landed at the start of `extent`; the
    /// header frame (with its CRC) is for the protocol core to check.
    Landed {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: u64,
        /// The extent named in the get.
        extent: Extent,
        /// Bytes written.
        len: u32,
        /// The protocol's data header frame.
        header: Vec<u8>,
    },
    /// Requester side: answered without a payload (a miss).
    Answered {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: u64,
        /// The protocol's answer frame.
        frame: Vec<u8>,
    },
    /// Any other frame from the peer.
    Control {
        /// The peer.
        peer: PeerId,
        /// The frame.
        frame: Vec<u8>,
    },
    /// Owner side: the block's write and header completed; its source
    /// extent may be released.
    Served {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: u64,
    },
    /// Requester side: the request failed on RDMA and its extent can no
    /// longer be written; retry it over TCP or read the store.
    Fallback {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: u64,
        /// Why.
        reason: FailReason,
    },
    /// Owner side: a get received or a block being served was dropped
    /// with the queue pair; release its source.
    ServeAborted {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: u64,
    },
    /// The queue pair to `peer` is gone; RDMA may be probed again from
    /// `retry_at` (ns).
    PeerDown {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: FailReason,
        /// When `prepare` is allowed again.
        retry_at: u64,
    },
}

/// A call the driver refused. The caller uses TCP for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverError {
    /// No connected queue pair to the peer.
    NotConnected(PeerId),
    /// RDMA to the peer is backing off until this time (ns).
    BackingOff {
        /// The peer.
        peer: PeerId,
        /// When it may be probed again.
        until: u64,
    },
    /// `connect` without `prepare`, or twice.
    NotPrepared(PeerId),
    /// Every peer slot is in use.
    TooManyPeers,
    /// The request id is already in flight to that peer.
    DuplicateRequest(u64),
    /// No get with that id is waiting for an answer.
    UnknownRequest(u64),
    /// The extent leaves the arena.
    OutOfArena(Extent),
    /// The payload is longer than the extent the get named.
    TooLong {
        /// Payload.
        len: u32,
        /// Extent.
        extent: u32,
    },
    /// The message does not fit a slot.
    MessageTooLong(usize),
    /// The peer's setup parameters do not fit this driver.
    BadSetup(String),
    /// A verbs call failed (the queue pair was torn down if it was up).
    Verbs(VerbsError),
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverError::NotConnected(p) => write!(f, "no RDMA queue pair to peer {p}"),
            DriverError::BackingOff { peer, until } => {
                write!(f, "RDMA to peer {peer} backing off until {until} ns")
            }
            DriverError::NotPrepared(p) => write!(f, "peer {p} has no prepared queue pair"),
            DriverError::TooManyPeers => write!(f, "too many RDMA peers"),
            DriverError::DuplicateRequest(r) => write!(f, "request {r} already in flight"),
            DriverError::UnknownRequest(r) => write!(f, "no get {r} waiting"),
            DriverError::OutOfArena(e) => write!(f, "extent {e:?} leaves the arena"),
            DriverError::TooLong { len, extent } => {
                write!(f, "payload of {len} bytes for an extent of {extent}")
            }
            DriverError::MessageTooLong(n) => write!(f, "message of {n} bytes exceeds a slot"),
            DriverError::BadSetup(m) => write!(f, "peer setup parameters: {m}"),
            DriverError::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DriverError {}

/// The RDMA state of a peer, for `granary status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerStatus {
    /// Never set up, or closed.
    Idle,
    /// Prepared, waiting for the peer's parameters.
    Connecting,
    /// Connected.
    Up {
        /// Requests in flight from here.
        in_flight: usize,
        /// Messages this side may still send.
        credits: u16,
    },
    /// Failed; probed again from `retry_at` (ns).
    Down {
        /// When.
        retry_at: u64,
    },
}

#[derive(Clone, Debug)]
enum Outgoing {
    Get {
        request: u64,
        extent: Extent,
        frame: Vec<u8>,
    },
    Block {
        request: u64,
        src: Extent,
        remote: RemoteAddr,
        header: Vec<u8>,
    },
    Answer {
        request: u64,
        frame: Vec<u8>,
    },
    Control {
        frame: Vec<u8>,
    },
}

/// How a get of ours has been answered, held until the window bound to
/// its extent is invalidated.
#[derive(Clone, Debug)]
enum Answer {
    Data { len: u32, header: Vec<u8> },
    Miss { frame: Vec<u8> },
}

/// Requester side: a get of ours, queued or sent.
#[derive(Clone, Debug)]
struct OurGet {
    extent: Extent,
    /// When `get` was called.
    since: u64,
    /// Sent: its message is posted.
    sent: bool,
    /// The window bound to its extent (none for an empty extent).
    window: Option<u16>,
    /// Its answer, once received, while the window is being invalidated.
    answer: Option<Answer>,
}

/// A memory window of a queue pair's.
#[derive(Clone, Copy, Debug)]
struct Window {
    mw: MwId,
    /// The rkey of its current bind.
    rkey: u32,
    /// The get whose extent it is bound to (unbound: `None`).
    request: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotUse {
    Free,
    Get,
    Block(u64),
    Message,
}

#[derive(Debug)]
struct Conn {
    qp: QpId,
    slab: u16,
    gen: u16,
    connected: bool,
    since: u64,
    credits: u16,
    owed: u16,
    peer_slot: u32,
    slots: Vec<SlotUse>,
    pending: VecDeque<Outgoing>,
    /// Requester side: gets sent or queued, by request.
    gets: BTreeMap<u64, OurGet>,
    /// Requester side: windows, bound or not (at most `windows_per_peer`).
    windows: Vec<Window>,
    /// Owner side: gets received and not answered yet.
    asked: BTreeMap<u64, (RemoteAddr, u32)>,
    /// Owner side: blocks queued or posted.
    serving: BTreeMap<u64, ()>,
}

#[derive(Debug, Default)]
struct Peer {
    conn: Option<Conn>,
    backoff: u64,
    retry_at: u64,
    failed: bool,
}

/// Receives posted beyond the credits granted, for credit-only messages
/// (which take no credit). A credit-only message returns at least half
/// the depth and only receives of credited messages are owed, so at most
/// two can be in flight at once.
pub const CREDIT_RESERVE: u16 = 2;

const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_WRITE: u64 = 3;
const KIND_BIND: u64 = 4;
const KIND_INVALIDATE: u64 = 5;

fn wr_id(gen: u16, kind: u64, slot: u16) -> u64 {
    (u64::from(gen) << 32) | (kind << 16) | u64::from(slot)
}

fn split_wr_id(id: u64) -> (u16, u64, u16) {
    ((id >> 32) as u16, (id >> 16) & 0xffff, id as u16)
}

/// The RDMA driver for one node.
#[derive(Debug)]
pub struct Driver<V: Verbs> {
    verbs: V,
    cfg: DriverConfig,
    arena: Mr,
    bufs: Mr,
    peers: BTreeMap<PeerId, Peer>,
    /// Unbound windows of queue pairs gone, for the next ones to use.
    spare_windows: Vec<MwId>,
    free_slabs: Vec<u16>,
    next_gen: u16,
    wcs: Vec<WorkCompletion>,
    scratch: Vec<u8>,
}

impl<V: Verbs> Driver<V> {
    /// The arena's rights: local write and window binds. Not remote
    /// write: peers write only through the windows bound per get.
    pub const ARENA_ACCESS: Access = Access::LOCAL_WRITE.union(Access::MW_BIND);

    /// Registers an arena of `arena_len` bytes ([`Driver::ARENA_ACCESS`]),
    /// allocated by the backend, and the message buffers.
    pub fn new(verbs: V, arena_len: u64, cfg: DriverConfig) -> Result<Driver<V>, DriverError> {
        Driver::build(verbs, cfg, |v| v.register(arena_len, Self::ARENA_ACCESS))
    }

    /// Registers `arena`, memory the caller already has mapped (the agent's
    /// shared arena), in place ([`Driver::ARENA_ACCESS`]), and the message
    /// buffers: extents are offsets into `arena`, and peers' blocks land
    /// in it where the caller reads them.
    pub fn with_arena(
        verbs: V,
        arena: ArenaSlice,
        cfg: DriverConfig,
    ) -> Result<Driver<V>, DriverError> {
        Driver::build(verbs, cfg, |v| v.register_mapped(arena, Self::ARENA_ACCESS))
    }

    fn build(
        mut verbs: V,
        cfg: DriverConfig,
        arena: impl FnOnce(&mut V) -> Result<Mr, VerbsError>,
    ) -> Result<Driver<V>, DriverError> {
        if !(MIN_SLOT..=MAX_SLOT).contains(&cfg.slot_size)
            || cfg.recv_depth < 2
            || cfg.send_depth < 1
            || cfg.windows_per_peer < 1
            || cfg.max_peers == 0
        {
            return Err(DriverError::BadSetup(
                "driver configuration out of range".into(),
            ));
        }
        let arena = arena(&mut verbs).map_err(DriverError::Verbs)?;
        let slab =
            (u64::from(cfg.recv_depth) + u64::from(CREDIT_RESERVE) + u64::from(cfg.send_depth))
                * u64::from(cfg.slot_size);
        let bufs = verbs
            .register(slab * u64::from(cfg.max_peers), Access::LOCAL_WRITE)
            .map_err(DriverError::Verbs)?;
        Ok(Driver {
            verbs,
            cfg,
            arena,
            bufs,
            peers: BTreeMap::new(),
            spare_windows: Vec::new(),
            free_slabs: (0..cfg.max_peers).rev().collect(),
            next_gen: 1,
            wcs: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// The registered arena.
    pub fn arena(&self) -> Mr {
        self.arena
    }

    /// The backend.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// Readable when a completion may be waiting (the backend's
    /// completion channel); `None`: call [`Driver::poll`] every turn.
    pub fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        self.verbs.completion_fd()
    }

    /// Settings.
    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    fn check_extent(&self, e: Extent) -> Result<(), DriverError> {
        match e.offset.checked_add(u64::from(e.len)) {
            Some(end) if end <= self.arena.len => Ok(()),
            _ => Err(DriverError::OutOfArena(e)),
        }
    }

    /// Copies `data` into the arena at `offset`.
    pub fn write_arena(&mut self, offset: u64, data: &[u8]) -> Result<(), DriverError> {
        let e = Extent {
            offset,
            len: u32::try_from(data.len()).map_err(|_| DriverError::MessageTooLong(data.len()))?,
        };
        self.check_extent(e)?;
        self.verbs
            .write_local(&self.arena, self.arena.addr + offset, data)
            .map_err(DriverError::Verbs)
    }

    /// Copies the arena at `offset` into `out`.
    pub fn read_arena(&self, offset: u64, out: &mut [u8]) -> Result<(), DriverError> {
        let e = Extent {
            offset,
            len: u32::try_from(out.len()).map_err(|_| DriverError::MessageTooLong(out.len()))?,
        };
        self.check_extent(e)?;
        self.verbs
            .read_local(&self.arena, self.arena.addr + offset, out)
            .map_err(DriverError::Verbs)
    }

    /// The RDMA state of `peer`.
    pub fn status(&self, peer: PeerId) -> PeerStatus {
        match self.peers.get(&peer) {
            None => PeerStatus::Idle,
            Some(p) => match &p.conn {
                Some(c) if c.connected => PeerStatus::Up {
                    in_flight: c.gets.len(),
                    credits: c.credits,
                },
                Some(_) => PeerStatus::Connecting,
                None if p.failed => PeerStatus::Down {
                    retry_at: p.retry_at,
                },
                None => PeerStatus::Idle,
            },
        }
    }

    fn slot_addr(&self, slab: u16, slot: u16) -> u64 {
        let per = u64::from(self.recv_slots()) + u64::from(self.cfg.send_depth);
        self.bufs.addr + (u64::from(slab) * per + u64::from(slot)) * u64::from(self.cfg.slot_size)
    }

    fn recv_slots(&self) -> u16 {
        self.cfg.recv_depth + CREDIT_RESERVE
    }

    fn slot_sge(&self, slab: u16, slot: u16, len: u32) -> Sge {
        Sge {
            addr: self.slot_addr(slab, slot),
            len,
            lkey: self.bufs.lkey,
        }
    }

    /// Creates a queue pair for `peer`, posts its receives and returns the
    /// parameters to send to the peer over TCP. A queue pair the peer
    /// already had is torn down first (its requests fall back).
    pub fn prepare(
        &mut self,
        peer: PeerId,
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<SetupParams, DriverError> {
        if let Some(p) = self.peers.get(&peer) {
            if p.conn.is_none() && p.failed && now < p.retry_at {
                return Err(DriverError::BackingOff {
                    peer,
                    until: p.retry_at,
                });
            }
            if p.conn.is_some() {
                self.teardown(peer, FailReason::Replaced, now, events);
            }
        }
        let slab = self.free_slabs.pop().ok_or(DriverError::TooManyPeers)?;
        let caps = QpCaps {
            max_send_wr: 2 * u32::from(self.cfg.send_depth) + u32::from(self.cfg.windows_per_peer),
            max_recv_wr: u32::from(self.recv_slots()),
        };
        let qp = match self.verbs.create_qp(caps) {
            Ok(qp) => qp,
            Err(e) => {
                self.free_slabs.push(slab);
                return Err(DriverError::Verbs(e));
            }
        };
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let recv = self.recv_slots();
        let slots = vec![SlotUse::Free; usize::from(self.cfg.send_depth)];
        let conn = Conn {
            qp,
            slab,
            gen,
            connected: false,
            since: now,
            credits: 0,
            owed: 0,
            peer_slot: 0,
            slots,
            pending: VecDeque::new(),
            gets: BTreeMap::new(),
            windows: Vec::new(),
            asked: BTreeMap::new(),
            serving: BTreeMap::new(),
        };
        self.peers.entry(peer).or_default().conn = Some(conn);
        let setup = (|| {
            self.verbs.modify_qp(qp, Transition::Init)?;
            for r in 0..recv {
                let sge = self.slot_sge(slab, r, self.cfg.slot_size);
                self.verbs.post_recv(qp, wr_id(gen, KIND_RECV, r), sge)?;
            }
            self.verbs.endpoint(qp)
        })();
        match setup {
            Ok(endpoint) => Ok(SetupParams {
                endpoint,
                mtu: self.cfg.timing.mtu,
                recv_depth: self.cfg.recv_depth,
                slot_size: self.cfg.slot_size,
            }),
            Err(e) => {
                self.teardown(peer, FailReason::Verbs(e.clone()), now, events);
                Err(DriverError::Verbs(e))
            }
        }
    }

    /// The peer offered a queue pair of its own accord: it is ready again,
    /// so a [`Driver::prepare`] answering it is not refused while backing
    /// off. The backoff itself stays: a further failure doubles it.
    pub fn peer_offered(&mut self, peer: PeerId) {
        if let Some(p) = self.peers.get_mut(&peer) {
            if p.conn.is_none() {
                p.failed = false;
            }
        }
    }

    /// Connects the prepared queue pair to the peer's parameters.
    pub fn connect(
        &mut self,
        peer: PeerId,
        remote: &SetupParams,
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<(), DriverError> {
        let conn = self
            .peers
            .get_mut(&peer)
            .and_then(|p| p.conn.as_mut())
            .filter(|c| !c.connected)
            .ok_or(DriverError::NotPrepared(peer))?;
        remote
            .validate()
            .map_err(|e| DriverError::BadSetup(e.to_string()))?;
        let qp = conn.qp;
        let mut timing = self.cfg.timing;
        timing.mtu = Mtu::from_code((timing.mtu as u8).min(remote.mtu as u8)).unwrap_or(Mtu::M1024);
        let r = self
            .verbs
            .modify_qp(
                qp,
                Transition::Rtr {
                    remote: remote.endpoint,
                    timing,
                },
            )
            .and_then(|()| self.verbs.modify_qp(qp, Transition::Rts { timing }));
        if let Err(e) = r {
            self.teardown(peer, FailReason::Verbs(e.clone()), now, events);
            return Err(DriverError::Verbs(e));
        }
        let conn = self.conn_mut(peer).expect("prepared above");
        conn.connected = true;
        conn.since = now;
        conn.credits = remote.recv_depth;
        conn.peer_slot = remote.slot_size;
        Ok(())
    }

    fn conn_mut(&mut self, peer: PeerId) -> Option<&mut Conn> {
        self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut())
    }

    fn connected(&mut self, peer: PeerId) -> Result<&mut Conn, DriverError> {
        let p = self
            .peers
            .get_mut(&peer)
            .ok_or(DriverError::NotConnected(peer))?;
        match p.conn.as_mut() {
            Some(c) if c.connected => Ok(c),
            None if p.failed => Err(DriverError::BackingOff {
                peer,
                until: p.retry_at,
            }),
            _ => Err(DriverError::NotConnected(peer)),
        }
    }

    /// The connection to `peer`, when a message of `fields` bytes of
    /// fields and a `frame`-byte frame fits its slots and ours.
    fn fitting(
        &mut self,
        peer: PeerId,
        fields: usize,
        frame: usize,
    ) -> Result<&mut Conn, DriverError> {
        let n = crate::msg::ENVELOPE_LEN + fields + frame;
        let ours = self.cfg.slot_size as usize;
        let conn = self.connected(peer)?;
        if n > conn.peer_slot as usize || n > ours {
            return Err(DriverError::MessageTooLong(n));
        }
        Ok(conn)
    }

    /// Asks `peer` for a block to be written into `extent` of the arena;
    /// `frame` is the protocol's get frame. Queued if credits are short.
    pub fn get(
        &mut self,
        peer: PeerId,
        request: u64,
        extent: Extent,
        frame: &[u8],
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<(), DriverError> {
        self.check_extent(extent)?;
        let conn = self.fitting(peer, 24, frame.len())?;
        if conn.gets.contains_key(&request) {
            return Err(DriverError::DuplicateRequest(request));
        }
        conn.gets.insert(
            request,
            OurGet {
                extent,
                since: now,
                sent: false,
                window: None,
                answer: None,
            },
        );
        conn.pending.push_back(Outgoing::Get {
            request,
            extent,
            frame: frame.to_vec(),
        });
        self.pump(peer, now, events);
        Ok(())
    }

    /// Owner side: writes `src` of the local arena into the extent `peer`
    /// named in get `request`, then sends `header`.
    pub fn serve(
        &mut self,
        peer: PeerId,
        request: u64,
        src: Extent,
        header: &[u8],
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<(), DriverError> {
        self.check_extent(src)?;
        let conn = self.fitting(peer, 16, header.len())?;
        let &(remote, len) = conn
            .asked
            .get(&request)
            .ok_or(DriverError::UnknownRequest(request))?;
        if src.len > len {
            return Err(DriverError::TooLong {
                len: src.len,
                extent: len,
            });
        }
        conn.asked.remove(&request);
        conn.serving.insert(request, ());
        conn.pending.push_back(Outgoing::Block {
            request,
            src,
            remote,
            header: header.to_vec(),
        });
        self.pump(peer, now, events);
        Ok(())
    }

    /// Owner side: answers get `request` without a payload.
    pub fn answer(
        &mut self,
        peer: PeerId,
        request: u64,
        frame: &[u8],
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<(), DriverError> {
        let conn = self.fitting(peer, 8, frame.len())?;
        conn.asked
            .remove(&request)
            .ok_or(DriverError::UnknownRequest(request))?;
        conn.pending.push_back(Outgoing::Answer {
            request,
            frame: frame.to_vec(),
        });
        self.pump(peer, now, events);
        Ok(())
    }

    /// Sends any other protocol frame.
    pub fn send_control(
        &mut self,
        peer: PeerId,
        frame: &[u8],
        now: u64,
        events: &mut Vec<Event>,
    ) -> Result<(), DriverError> {
        self.fitting(peer, 0, frame.len())?
            .pending
            .push_back(Outgoing::Control {
                frame: frame.to_vec(),
            });
        self.pump(peer, now, events);
        Ok(())
    }

    /// Closes the queue pair to `peer` without backoff; its requests fall
    /// back.
    pub fn close(&mut self, peer: PeerId, now: u64, events: &mut Vec<Event>) {
        if self.conn_mut(peer).is_some() {
            self.teardown(peer, FailReason::Closed, now, events);
        }
    }

    /// Posts what the credits and slots allow.
    fn pump(&mut self, peer: PeerId, now: u64, events: &mut Vec<Event>) {
        if let Err(reason) = self.try_pump(peer) {
            self.teardown(peer, reason, now, events);
        }
    }

    fn try_pump(&mut self, peer: PeerId) -> Result<(), FailReason> {
        let half = self.cfg.recv_depth.div_ceil(2);
        let most = usize::from(self.cfg.windows_per_peer);
        loop {
            let Some(conn) = self.conn_mut(peer).filter(|c| c.connected) else {
                return Ok(());
            };
            let Some(slot) = conn.slots.iter().position(|s| *s == SlotUse::Free) else {
                return Ok(());
            };
            if conn.credits >= 1 {
                // A get needs a window for its extent; the other messages
                // go past gets waiting for one.
                let window =
                    conn.windows.len() < most || conn.windows.iter().any(|w| w.request.is_none());
                let next = conn.pending.iter().position(|o| match o {
                    Outgoing::Get { extent, .. } => window || extent.len == 0,
                    _ => true,
                });
                if let Some(out) = next.and_then(|i| conn.pending.remove(i)) {
                    self.post_message(peer, slot as u16, out)?;
                    continue;
                }
            }
            let conn = self.conn_mut(peer).expect("checked above");
            if conn.owed >= half {
                self.post_credit(peer, slot as u16)?;
                continue;
            }
            return Ok(());
        }
    }

    fn post_credit(&mut self, peer: PeerId, slot: u16) -> Result<(), FailReason> {
        self.scratch.clear();
        let conn = self.conn_mut(peer).expect("caller checked");
        let owed = std::mem::take(&mut conn.owed);
        let mut buf = std::mem::take(&mut self.scratch);
        Msg::Credit.encode(owed, &mut buf);
        let r = self.post_send_slot(peer, slot, &buf, SlotUse::Message, false);
        self.scratch = buf;
        r
    }

    fn post_send_slot(
        &mut self,
        peer: PeerId,
        slot: u16,
        bytes: &[u8],
        usage: SlotUse,
        credited: bool,
    ) -> Result<(), FailReason> {
        let recv = self.recv_slots();
        let conn = self.conn_mut(peer).expect("caller checked");
        let (qp, slab, gen) = (conn.qp, conn.slab, conn.gen);
        if credited {
            conn.credits -= 1;
        }
        conn.slots[usize::from(slot)] = usage;
        let sge = self.slot_sge(slab, recv + slot, bytes.len() as u32);
        self.verbs
            .write_local(&self.bufs, sge.addr, bytes)
            .and_then(|()| self.verbs.post_send(qp, wr_id(gen, KIND_SEND, slot), sge))
            .map_err(FailReason::Verbs)
    }

    fn post_message(&mut self, peer: PeerId, slot: u16, out: Outgoing) -> Result<(), FailReason> {
        let conn = self.conn_mut(peer).expect("caller checked");
        let owed = std::mem::take(&mut conn.owed);
        let (qp, gen) = (conn.qp, conn.gen);
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let usage = match &out {
            Outgoing::Get {
                request,
                extent,
                frame,
            } => {
                let rkey = self.bind_window(peer, *request, *extent)?;
                Msg::Get {
                    request: *request,
                    addr: self.arena.addr + extent.offset,
                    rkey,
                    len: extent.len,
                    frame,
                }
                .encode(owed, &mut buf);
                SlotUse::Get
            }
            Outgoing::Block {
                request,
                src,
                remote,
                header,
            } => {
                let sge = Sge {
                    addr: self.arena.addr + src.offset,
                    len: src.len,
                    lkey: self.arena.lkey,
                };
                // An empty block has nothing to write (and its get no
                // window to write into).
                if src.len > 0 {
                    self.verbs
                        .post_write(qp, wr_id(gen, KIND_WRITE, slot), sge, *remote)
                        .map_err(FailReason::Verbs)?;
                }
                Msg::Data {
                    request: *request,
                    len: src.len,
                    frame: header,
                }
                .encode(owed, &mut buf);
                SlotUse::Block(*request)
            }
            Outgoing::Answer { request, frame } => {
                Msg::Answer {
                    request: *request,
                    frame,
                }
                .encode(owed, &mut buf);
                SlotUse::Message
            }
            Outgoing::Control { frame } => {
                Msg::Control { frame }.encode(owed, &mut buf);
                SlotUse::Message
            }
        };
        let r = self.post_send_slot(peer, slot, &buf, usage, true);
        self.scratch = buf;
        r
    }

    /// Binds a window of `peer`'s queue pair to `extent`, for get
    /// `request` about to be sent, and returns its rkey: the only key that
    /// lets the peer write, and only into `extent`. An empty extent gets
    /// no window (rkey 0, which names nothing). The caller checked that a
    /// window is free or may be added.
    fn bind_window(
        &mut self,
        peer: PeerId,
        request: u64,
        extent: Extent,
    ) -> Result<u32, FailReason> {
        let arena = self.arena;
        let conn = self.conn_mut(peer).expect("caller checked");
        let g = conn
            .gets
            .get_mut(&request)
            .expect("a queued get is in the map");
        g.sent = true;
        if extent.len == 0 {
            return Ok(0);
        }
        let (qp, gen) = (conn.qp, conn.gen);
        let free = conn.windows.iter().position(|w| w.request.is_none());
        let index = match free {
            Some(i) => i,
            None => {
                let mw = match self.spare_windows.pop() {
                    Some(mw) => mw,
                    None => self.verbs.alloc_mw().map_err(FailReason::Verbs)?,
                };
                let conn = self.conn_mut(peer).expect("caller checked");
                conn.windows.push(Window {
                    mw,
                    rkey: 0,
                    request: None,
                });
                conn.windows.len() - 1
            }
        };
        let mw = self.conn_mut(peer).expect("caller checked").windows[index].mw;
        let span = WindowSpan {
            addr: arena.addr + extent.offset,
            len: u64::from(extent.len),
            access: Access::REMOTE_WRITE,
        };
        let rkey = self
            .verbs
            .post_bind(qp, wr_id(gen, KIND_BIND, index as u16), mw, &arena, span)
            .map_err(FailReason::Verbs)?;
        let conn = self.conn_mut(peer).expect("caller checked");
        conn.windows[index].rkey = rkey;
        conn.windows[index].request = Some(request);
        conn.gets
            .get_mut(&request)
            .expect("a queued get is in the map")
            .window = Some(index as u16);
        Ok(rkey)
    }

    /// Get `request` to `peer` is answered: once the window bound to its
    /// extent is invalidated (at once when it has none) the answer is
    /// reported, so nothing can write the extent after the caller hears of
    /// it.
    fn answered(
        &mut self,
        peer: PeerId,
        request: u64,
        answer: Answer,
        events: &mut Vec<Event>,
    ) -> Result<(), FailReason> {
        let conn = self.conn_mut(peer).expect("caller found it");
        let (qp, gen) = (conn.qp, conn.gen);
        let g = conn
            .gets
            .get_mut(&request)
            .ok_or_else(|| FailReason::Protocol(format!("answer for unknown request {request}")))?;
        if !g.sent || g.answer.is_some() {
            return Err(FailReason::Protocol(format!(
                "answer for request {request} not sent or already answered"
            )));
        }
        if let (Answer::Data { len, .. }, extent) = (&answer, g.extent) {
            if *len > extent.len {
                // The request stays in flight: the teardown reports it.
                return Err(FailReason::Protocol(format!(
                    "data of {len} bytes for an extent of {}",
                    extent.len
                )));
            }
        }
        match g.window {
            Some(w) => {
                g.answer = Some(answer);
                let rkey = conn.windows[usize::from(w)].rkey;
                self.verbs
                    .post_invalidate(qp, wr_id(gen, KIND_INVALIDATE, w), rkey)
                    .map_err(FailReason::Verbs)
            }
            None => {
                let g = conn.gets.remove(&request).expect("found above");
                self.report(peer, request, g.extent, answer, events);
                Ok(())
            }
        }
    }

    /// The window `index` of `peer`'s queue pair is invalidated: it is
    /// free again, and the answer of the get it was bound for is reported.
    fn invalidated(
        &mut self,
        peer: PeerId,
        index: u16,
        events: &mut Vec<Event>,
    ) -> Result<(), FailReason> {
        let conn = self.conn_mut(peer).expect("caller found it");
        let request = conn
            .windows
            .get_mut(usize::from(index))
            .and_then(|w| w.request.take())
            .ok_or_else(|| FailReason::Protocol("invalidate of a window not bound".into()))?;
        let g = conn
            .gets
            .remove(&request)
            .ok_or_else(|| FailReason::Protocol("invalidate for an unknown get".into()))?;
        let answer = g
            .answer
            .ok_or_else(|| FailReason::Protocol("invalidate of a get not answered".into()))?;
        self.report(peer, request, g.extent, answer, events);
        Ok(())
    }

    fn report(
        &mut self,
        peer: PeerId,
        request: u64,
        extent: Extent,
        answer: Answer,
        events: &mut Vec<Event>,
    ) {
        match answer {
            Answer::Data { len, header } => {
                debug_assert!(extent.offset + u64::from(extent.len) <= self.arena.len);
                events.push(Event::Landed {
                    peer,
                    request,
                    extent,
                    len,
                    header,
                });
                self.peers.get_mut(&peer).expect("caller found it").backoff = 0;
            }
            Answer::Miss { frame } => events.push(Event::Answered {
                peer,
                request,
                frame,
            }),
        }
    }

    /// Polls completions, checks timeouts, and reports what happened.
    pub fn poll(&mut self, now: u64, events: &mut Vec<Event>) -> Result<(), DriverError> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let mut r = self.verbs.poll_cq(256, &mut wcs);
        if matches!(r, Ok(n) if n < 256) {
            // The queue is drained: ask for the next completion to wake
            // the caller, then look once more for one that came between.
            r = self
                .verbs
                .arm()
                .and_then(|()| self.verbs.poll_cq(256, &mut wcs));
        }
        for wc in &wcs {
            self.on_completion(*wc, now, events);
        }
        self.wcs = wcs;
        r.map_err(DriverError::Verbs)?;
        let timed_out: Vec<PeerId> = self
            .peers
            .iter()
            .filter_map(|(id, p)| {
                let c = p.conn.as_ref()?;
                let setup_late =
                    !c.connected && now.saturating_sub(c.since) > self.cfg.setup_timeout_ns;
                let get_late = c
                    .gets
                    .values()
                    .any(|g| now.saturating_sub(g.since) > self.cfg.transfer_timeout_ns);
                (setup_late || get_late).then_some(*id)
            })
            .collect();
        for peer in timed_out {
            self.teardown(peer, FailReason::Timeout, now, events);
        }
        Ok(())
    }

    fn on_completion(&mut self, wc: WorkCompletion, now: u64, events: &mut Vec<Event>) {
        let (gen, kind, slot) = split_wr_id(wc.wr_id);
        let Some(peer) = self.peers.iter().find_map(|(id, p)| {
            p.conn
                .as_ref()
                .filter(|c| c.qp == wc.qp && c.gen == gen)
                .map(|_| *id)
        }) else {
            return; // a queue pair already torn down
        };
        if wc.status != WcStatus::Success {
            return self.teardown(peer, FailReason::Completion(wc.status), now, events);
        }
        let r = match (kind, wc.opcode) {
            (KIND_RECV, Opcode::Recv) => self.on_recv(peer, slot, wc.byte_len, events),
            (KIND_SEND, Opcode::Send) => {
                let conn = self.conn_mut(peer).expect("found above");
                match conn.slots.get_mut(usize::from(slot)) {
                    Some(s) => {
                        if let SlotUse::Block(request) = std::mem::replace(s, SlotUse::Free) {
                            conn.serving.remove(&request);
                            events.push(Event::Served { peer, request });
                            self.peers.get_mut(&peer).expect("found above").backoff = 0;
                        }
                        Ok(())
                    }
                    None => Err(FailReason::Protocol(
                        "completion for an unknown slot".into(),
                    )),
                }
            }
            (KIND_WRITE, Opcode::Write) | (KIND_BIND, Opcode::Bind) => Ok(()),
            (KIND_INVALIDATE, Opcode::LocalInvalidate) => self.invalidated(peer, slot, events),
            _ => Err(FailReason::Protocol(
                "completion of an unexpected kind".into(),
            )),
        };
        match r {
            Ok(()) => self.pump(peer, now, events),
            Err(reason) => self.teardown(peer, reason, now, events),
        }
    }

    fn on_recv(
        &mut self,
        peer: PeerId,
        slot: u16,
        len: u32,
        events: &mut Vec<Event>,
    ) -> Result<(), FailReason> {
        if slot >= self.recv_slots() || len > self.cfg.slot_size {
            return Err(FailReason::Protocol("receive outside its slot".into()));
        }
        let (qp, slab, gen) = {
            let c = self.conn_mut(peer).expect("caller found it");
            (c.qp, c.slab, c.gen)
        };
        let mut buf = vec![0u8; len as usize];
        let addr = self.slot_addr(slab, slot);
        self.verbs
            .read_local(&self.bufs, addr, &mut buf)
            .map_err(FailReason::Verbs)?;
        // The slot's bytes are copied out: repost it at once.
        let sge = self.slot_sge(slab, slot, self.cfg.slot_size);
        self.verbs
            .post_recv(qp, wr_id(gen, KIND_RECV, slot), sge)
            .map_err(FailReason::Verbs)?;
        let (msg, returned) = Msg::decode(&buf).map_err(|e| FailReason::Protocol(e.to_string()))?;
        let conn = self.conn_mut(peer).expect("caller found it");
        if msg != Msg::Credit {
            conn.owed += 1;
        }
        conn.credits = conn
            .credits
            .checked_add(returned)
            .ok_or_else(|| FailReason::Protocol("credits overflow".into()))?;
        match msg {
            Msg::Get {
                request,
                addr,
                rkey,
                len,
                frame,
            } => {
                if conn.asked.contains_key(&request) || conn.serving.contains_key(&request) {
                    return Err(FailReason::Protocol(format!("get {request} repeated")));
                }
                conn.asked.insert(request, (RemoteAddr { addr, rkey }, len));
                events.push(Event::GetReceived {
                    peer,
                    request,
                    len,
                    frame: frame.to_vec(),
                });
            }
            Msg::Data {
                request,
                len,
                frame,
            } => {
                let header = frame.to_vec();
                self.answered(peer, request, Answer::Data { len, header }, events)?;
            }
            Msg::Answer { request, frame } => {
                let frame = frame.to_vec();
                self.answered(peer, request, Answer::Miss { frame }, events)?;
            }
            Msg::Control { frame } => events.push(Event::Control {
                peer,
                frame: frame.to_vec(),
            }),
            Msg::Credit => {}
        }
        Ok(())
    }

    /// Destroys the queue pair first, then reports every request on it.
    fn teardown(&mut self, peer: PeerId, reason: FailReason, now: u64, events: &mut Vec<Event>) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(conn) = p.conn.take() else {
            return;
        };
        if reason == FailReason::Closed || reason == FailReason::Replaced {
            p.failed = false;
        } else {
            let doubling = granary_base::Backoff::new(
                std::time::Duration::from_nanos(self.cfg.backoff_initial_ns),
                std::time::Duration::from_nanos(self.cfg.backoff_max_ns),
            );
            let next = doubling.after(std::time::Duration::from_nanos(p.backoff));
            p.backoff = u64::try_from(next.as_nanos()).unwrap_or(u64::MAX);
            p.retry_at = now.saturating_add(p.backoff);
            p.failed = true;
        }
        let retry_at = if p.failed { p.retry_at } else { now };
        // Nothing can land through a destroyed queue pair; an error here
        // means it is already gone.
        let _ = self.verbs.destroy_qp(conn.qp);
        // Windows still bound through it cannot be invalidated through it
        // any more: deallocating them revokes their keys. Unbound ones
        // serve the next queue pairs.
        for w in &conn.windows {
            if w.request.is_some() {
                let _ = self.verbs.dealloc_mw(w.mw);
            } else {
                self.spare_windows.push(w.mw);
            }
        }
        self.free_slabs.push(conn.slab);
        for request in conn.gets.keys() {
            events.push(Event::Fallback {
                peer,
                request: *request,
                reason: reason.clone(),
            });
        }
        for request in conn.asked.keys().chain(conn.serving.keys()) {
            events.push(Event::ServeAborted {
                peer,
                request: *request,
            });
        }
        events.push(Event::PeerDown {
            peer,
            reason,
            retry_at,
        });
    }
}

/// Dropping the driver destroys its queue pairs first and deallocates its
/// windows: nothing lands in the arena through them afterwards, even
/// while the backend (a fake fabric shared with other hosts) lives on.
impl<V: Verbs> Drop for Driver<V> {
    fn drop(&mut self) {
        for p in self.peers.values_mut() {
            if let Some(c) = p.conn.take() {
                let _ = self.verbs.destroy_qp(c.qp);
                for w in c.windows {
                    let _ = self.verbs.dealloc_mw(w.mw);
                }
            }
        }
        for mw in self.spare_windows.drain(..) {
            let _ = self.verbs.dealloc_mw(mw);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_roundtrips() {
        let id = wr_id(0xbeef, KIND_WRITE, 513);
        assert_eq!(split_wr_id(id), (0xbeef, KIND_WRITE, 513));
    }
}
