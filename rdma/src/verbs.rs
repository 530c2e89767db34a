//! The narrow verbs interface the driver is written against.
//!
//! It covers exactly what the data path needs from a reliable-connected
//! (RC) queue pair: register memory, bring a queue pair from RESET to
//! RTS, post sends, RDMA writes and receives, bind and invalidate memory
//! windows, and poll one completion queue. There is deliberately no RDMA
//! read and no way to ask for a remote-read key: [`Access`] cannot express
//! it, so no region of the arena can ever be read by a peer.
//!
//! Remote write is granted through memory windows (type 2): a window is
//! bound, by a work request on one queue pair, to a span of a region
//! registered with [`Access::MW_BIND`], and its rkey then lets the peer at
//! the other end of that queue pair write that span and nothing else,
//! until a local invalidate (another work request) or deallocating the
//! window revokes it.
//!
//! Two implementations exist: [`crate::fake::FakeNic`] (always built, runs
//! in CI) and `crate::real::IbvNic` (feature `rdma`, over libibverbs).

use std::fmt;
use std::os::fd::BorrowedFd;

use granary_shm::arena::ArenaSlice;

/// Access rights of a registered region. Local read is implied.
///
/// There is no remote-read flag on purpose (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// Only local reads (send buffers).
    pub const NONE: Access = Access(0);
    /// The NIC may write the region for local work requests (receives).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA-write the region with its rkey (a region), or the
    /// span a window is bound to with the window's rkey (a window bind).
    pub const REMOTE_WRITE: Access = Access(2);
    /// Memory windows may be bound to spans of the region. The region's
    /// own rkey grants nothing remote unless [`Access::REMOTE_WRITE`] is
    /// given as well.
    pub const MW_BIND: Access = Access(4);

    /// Both sets of rights.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Whether every right of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

/// A registered memory region, owned by the verbs backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mr {
    /// Backend handle.
    pub id: u32,
    /// Address of the first byte, as the NIC sees it.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Key for local work requests.
    pub lkey: u32,
    /// Key a peer names in an RDMA write (meaningful only with
    /// [`Access::REMOTE_WRITE`]).
    pub rkey: u32,
    /// Rights it was registered with.
    pub access: Access,
}

/// A local scatter/gather element: `len` bytes at `addr` of the region
/// whose local key is `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region holding it.
    pub lkey: u32,
}

/// A memory window handle (type 2), local to one backend. Allocated
/// unbound; [`Verbs::post_bind`] binds it through a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MwId(pub u32);

/// What a window is bound to: `len` bytes at `addr` of a region, with
/// `access` (the driver asks only for [`Access::REMOTE_WRITE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowSpan {
    /// First byte, as the NIC sees it (inside the region).
    pub addr: u64,
    /// Length in bytes (not 0: a type 2 bind needs a length).
    pub len: u64,
    /// Rights granted to the peer holding the window's rkey.
    pub access: Access,
}

/// A peer's memory, as named in an RDMA write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Address in the peer's registered region.
    pub addr: u64,
    /// The remote key of the window (or region) covering it.
    pub rkey: u32,
}

/// A queue pair handle, local to one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpId(pub u32);

/// Queue pair states the driver can observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing allowed.
    Reset,
    /// Receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: every outstanding work request completes flushed.
    Error,
}

/// Path MTU of a connected queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// The MTU with verbs code `code` (1..=5).
    pub fn from_code(code: u8) -> Option<Mtu> {
        [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096]
            .into_iter()
            .find(|m| *m as u8 == code)
    }
}

/// What a queue pair needs of its remote end to reach RTR: exchanged as
/// bytes over the peer's TCP connection ([`crate::setup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qp_num: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (RoCE, or routed InfiniBand).
    pub gid: [u8; 16],
    /// First packet sequence number (24 bits).
    pub psn: u32,
}

/// Sizes and reliability settings of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// Send queue depth (work requests outstanding).
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

/// Reliability settings applied on RTR/RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpTiming {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout.
    pub timeout: u8,
    /// Transport retries before `RetryExceeded` (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries before `RnrRetryExceeded` (0..=7, 7 =
    /// forever; the driver never uses 7).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code on the receive side.
    pub min_rnr_timer: u8,
}

/// A queue pair transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// RESET -> INIT (access: local write, remote write, window binds).
    Init,
    /// INIT -> RTR, connected to `remote`.
    Rtr {
        /// The remote end.
        remote: Endpoint,
        /// Settings.
        timing: QpTiming,
    },
    /// RTR -> RTS.
    Rts {
        /// Settings.
        timing: QpTiming,
    },
}

/// The operation a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// A send.
    Send,
    /// An RDMA write.
    Write,
    /// A receive.
    Recv,
    /// A memory window bind.
    Bind,
    /// A local invalidate of a window's rkey.
    LocalInvalidate,
}

/// Completion status: the verbs' `ibv_wc_status` values the driver
/// distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local length error (a receive buffer too small).
    LocalLength,
    /// A local protection error (bad lkey or bounds).
    LocalProtection,
    /// The work request was flushed because the queue pair is in error.
    Flushed,
    /// The responder rejected the remote key, bounds or rights.
    RemoteAccess,
    /// A window bind or invalidate failed (bad window, region, span or
    /// rights).
    MwBind,
    /// The responder found the request invalid.
    RemoteInvalidRequest,
    /// Transport retries exhausted (peer gone or path broken).
    RetryExceeded,
    /// The receiver had no receive posted, retries exhausted.
    RnrRetryExceeded,
    /// Anything else (vendor code kept).
    Other(u32),
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's id from the post.
    pub wr_id: u64,
    /// The queue pair.
    pub qp: QpId,
    /// Operation (for flushed completions: as posted).
    pub opcode: Opcode,
    /// Outcome.
    pub status: WcStatus,
    /// Bytes received (receives only).
    pub byte_len: u32,
}

/// A verbs call that failed synchronously.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// No device, or it could not be opened.
    NoDevice(String),
    /// The handle is unknown.
    UnknownQp(QpId),
    /// The region handle is unknown.
    UnknownMr(u32),
    /// The memory window handle is unknown.
    UnknownMw(MwId),
    /// The queue pair is in a state that does not allow the call.
    BadState {
        /// The queue pair.
        qp: QpId,
        /// Its state.
        state: QpState,
    },
    /// The queue is full.
    QueueFull(QpId),
    /// A local access outside a region.
    OutOfBounds,
    /// A backend call failed with an errno.
    Os {
        /// The verbs call.
        call: &'static str,
        /// errno.
        errno: i32,
    },
    /// An argument the backend rejects.
    Invalid(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::NoDevice(m) => write!(f, "no RDMA device: {m}"),
            VerbsError::UnknownQp(q) => write!(f, "unknown queue pair {}", q.0),
            VerbsError::UnknownMr(m) => write!(f, "unknown memory region {m}"),
            VerbsError::UnknownMw(m) => write!(f, "unknown memory window {}", m.0),
            VerbsError::BadState { qp, state } => {
                write!(f, "queue pair {} in state {state:?}", qp.0)
            }
            VerbsError::QueueFull(q) => write!(f, "queue pair {} is full", q.0),
            VerbsError::OutOfBounds => write!(f, "access outside a registered region"),
            VerbsError::Os { call, errno } => write!(f, "{call} failed: errno {errno}"),
            VerbsError::Invalid(m) => write!(f, "invalid argument: {m}"),
        }
    }
}

impl std::error::Error for VerbsError {}

/// The verbs a driver needs. Every work request is signaled: each post
/// yields exactly one [`WorkCompletion`] on [`Verbs::poll_cq`], in post
/// order within a queue pair's send queue and within its receive queue.
/// All queue pairs of one backend share one completion queue.
pub trait Verbs {
    /// Allocates `len` bytes of backend-owned, page-aligned memory and
    /// registers it with `access`.
    fn register(&mut self, len: u64, access: Access) -> Result<Mr, VerbsError>;

    /// Registers `mem`, memory the caller has already mapped (the agent's
    /// shared arena), in place with `access`: work requests and peers'
    /// RDMA writes then read and write that very memory. The backend holds
    /// `mem`, and with it the mapping, for as long as the registration
    /// lives, so the mapping always outlives the registration.
    fn register_mapped(&mut self, mem: ArenaSlice, access: Access) -> Result<Mr, VerbsError>;

    /// Copies `data` into registered memory at `addr` (a local store).
    fn write_local(&mut self, mr: &Mr, addr: u64, data: &[u8]) -> Result<(), VerbsError>;

    /// Copies registered memory at `addr` into `out` (a local load).
    fn read_local(&self, mr: &Mr, addr: u64, out: &mut [u8]) -> Result<(), VerbsError>;

    /// Creates a reliable-connected queue pair in RESET.
    fn create_qp(&mut self, caps: QpCaps) -> Result<QpId, VerbsError>;

    /// What the remote end needs to connect to `qp`.
    fn endpoint(&self, qp: QpId) -> Result<Endpoint, VerbsError>;

    /// Moves `qp` one state forward.
    fn modify_qp(&mut self, qp: QpId, to: Transition) -> Result<(), VerbsError>;

    /// The state of `qp`.
    fn qp_state(&self, qp: QpId) -> Result<QpState, VerbsError>;

    /// Destroys `qp`; its outstanding work requests produce no more
    /// completions and nothing more lands through it.
    fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError>;

    /// Posts a send of `local` (consumes one receive at the peer).
    fn post_send(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError>;

    /// Posts an RDMA write of `local` to `remote`.
    fn post_write(
        &mut self,
        qp: QpId,
        wr_id: u64,
        local: Sge,
        remote: RemoteAddr,
    ) -> Result<(), VerbsError>;

    /// Posts a receive into `local`.
    fn post_recv(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError>;

    /// Allocates an unbound memory window (type 2).
    fn alloc_mw(&mut self) -> Result<MwId, VerbsError>;

    /// Deallocates `mw`. A window still bound is revoked with it: its
    /// rkey names nothing from then on.
    fn dealloc_mw(&mut self, mw: MwId) -> Result<(), VerbsError>;

    /// Posts a bind of `mw` (unbound) to `span` of `mr` (registered with
    /// [`Access::MW_BIND`]) on `qp`'s send queue and returns the window's
    /// new rkey. Once the bind executes (in send-queue order, so before
    /// any work request posted after it), the peer at the other end of
    /// `qp`, and only through `qp`, may access `span` with the rkey as
    /// `span.access` allows, until the rkey is invalidated or the window
    /// deallocated. Each bind gives a new rkey (its low byte counts up).
    fn post_bind(
        &mut self,
        qp: QpId,
        wr_id: u64,
        mw: MwId,
        mr: &Mr,
        span: WindowSpan,
    ) -> Result<u32, VerbsError>;

    /// Posts a local invalidate of `rkey` (a window bound through `qp`) on
    /// `qp`'s send queue: once it completes, the rkey names nothing and
    /// the window is unbound, ready for another bind.
    fn post_invalidate(&mut self, qp: QpId, wr_id: u64, rkey: u32) -> Result<(), VerbsError>;

    /// Appends up to `max` completions to `out`; returns how many.
    fn poll_cq(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError>;

    /// A descriptor that turns readable when a completion arrives after
    /// [`Verbs::arm`], for a caller that sleeps in poll(2). `None` when
    /// the backend has none (the fake NIC, whose work requests run only
    /// when some host polls): the caller then polls the queue every turn.
    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Consumes the notifications that made [`Verbs::completion_fd`]
    /// readable and asks for the next completion to notify. Poll the queue
    /// once more after arming: a completion that arrived in between
    /// notifies nobody.
    fn arm(&mut self) -> Result<(), VerbsError> {
        Ok(())
    }
}

/// A boxed backend is a backend: the agent picks one (the libibverbs NIC,
/// or the fake one in tests) when its peer tier starts.
impl<V: Verbs + ?Sized> Verbs for Box<V> {
    fn register(&mut self, len: u64, access: Access) -> Result<Mr, VerbsError> {
        (**self).register(len, access)
    }
    fn register_mapped(&mut self, mem: ArenaSlice, access: Access) -> Result<Mr, VerbsError> {
        (**self).register_mapped(mem, access)
    }
    fn write_local(&mut self, mr: &Mr, addr: u64, data: &[u8]) -> Result<(), VerbsError> {
        (**self).write_local(mr, addr, data)
    }
    fn read_local(&self, mr: &Mr, addr: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        (**self).read_local(mr, addr, out)
    }
    fn create_qp(&mut self, caps: QpCaps) -> Result<QpId, VerbsError> {
        (**self).create_qp(caps)
    }
    fn endpoint(&self, qp: QpId) -> Result<Endpoint, VerbsError> {
        (**self).endpoint(qp)
    }
    fn modify_qp(&mut self, qp: QpId, to: Transition) -> Result<(), VerbsError> {
        (**self).modify_qp(qp, to)
    }
    fn qp_state(&self, qp: QpId) -> Result<QpState, VerbsError> {
        (**self).qp_state(qp)
    }
    fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError> {
        (**self).destroy_qp(qp)
    }
    fn post_send(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        (**self).post_send(qp, wr_id, local)
    }
    fn post_write(
        &mut self,
        qp: QpId,
        wr_id: u64,
        local: Sge,
        remote: RemoteAddr,
    ) -> Result<(), VerbsError> {
        (**self).post_write(qp, wr_id, local, remote)
    }
    fn post_recv(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        (**self).post_recv(qp, wr_id, local)
    }
    fn alloc_mw(&mut self) -> Result<MwId, VerbsError> {
        (**self).alloc_mw()
    }
    fn dealloc_mw(&mut self, mw: MwId) -> Result<(), VerbsError> {
        (**self).dealloc_mw(mw)
    }
    fn post_bind(
        &mut self,
        qp: QpId,
        wr_id: u64,
        mw: MwId,
        mr: &Mr,
        span: WindowSpan,
    ) -> Result<u32, VerbsError> {
        (**self).post_bind(qp, wr_id, mw, mr, span)
    }
    fn post_invalidate(&mut self, qp: QpId, wr_id: u64, rkey: u32) -> Result<(), VerbsError> {
        (**self).post_invalidate(qp, wr_id, rkey)
    }
    fn poll_cq(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        (**self).poll_cq(max, out)
    }
    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).completion_fd()
    }
    fn arm(&mut self) -> Result<(), VerbsError> {
        (**self).arm()
    }
}
