//! The TCP transport of the peer tier: a listener, one connection per peer
//! opened lazily, and the bytes between each socket and its sans-IO
//! [`Conn`] (handshake, credits, keepalive and frames are all the
//! connection state machine's; this module only moves bytes).
//!
//! It runs on a small tokio runtime of its own. The engine talks to it
//! with commands (ask a peer for a sample, answer a peer's request) and
//! reads what happened from an event queue whose eventfd it polls with its
//! sources' descriptors.
//!
//! Every connection is a secure channel (`granary_peer::channel`): the
//! dialer starts the Noise handshake, the listener answers only once the
//! dialer proved the job secret. A block we asked for is opened (decrypted)
//! from its records straight into the arena extent reserved for it; a
//! block we serve is sealed (encrypted) straight from the pinned extent of
//! the cached sample into the records that carry it, four records at a
//! time.
//!
//! A request and a hedged store read never write the same extent at once:
//! each request carries a [`Claim`]; the receiver takes it before writing
//! the first byte, the engine takes it before starting the store read, and
//! whoever comes second gives way (a block arriving after the store read
//! began is received into a scratch buffer and dropped).

use super::metrics::{label, Labels};
use super::ratelog::RateLog;
use crate::metrics::Counter;
use crate::sys;
use granary_peer::channel::{ChannelError, Protection, Suite};
use granary_peer::conn::{Closed, Conn, ConnConfig, Event as ConnEvent, Nanos, Transmit};
use granary_peer::frame::{DataHeader, Get, GoodbyeReason, MissReason};
use granary_peer::view::View;
use granary_shm::arena::ArenaSlice;
use nix::sys::eventfd::{EfdFlags, EventFd};
use prometheus_client::metrics::family::Family;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

/// The transport's name for one connection.
pub(crate) type ConnId = u64;

pub(crate) use granary_peer::request::Claim;

/// A sample asked of a peer.
#[derive(Debug)]
pub(crate) struct OutGet {
    /// The request as it goes on the wire (`request` is ours).
    pub get: Get,
    /// The reserved extent the block lands in.
    pub dest: ArenaSlice,
    /// Shared with the engine (hedging).
    pub claim: Arc<Claim>,
}

/// Why a request to a peer did not bring the sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GetFailure {
    /// The owner answered with a miss.
    Miss(MissReason),
    /// The block failed its CRC (corrupted or misrouted).
    Corrupt,
    /// The connection could not be made or was lost.
    Lost(String),
}

/// What the transport tells the engine.
#[derive(Debug)]
pub(crate) enum Event {
    /// An authenticated connection to member `member`.
    Up {
        conn: ConnId,
        member: usize,
        incarnation: u64,
        /// The channel's AEAD and whether records are encrypted.
        channel: Option<(Suite, Protection)>,
    },
    /// A connection ended (`member` if it had authenticated).
    Down {
        conn: ConnId,
        member: Option<usize>,
        why: String,
    },
    /// A peer wants a sample (`due` on our clock, see [`Net::nanos`]).
    Request { conn: ConnId, get: Get },
    /// A peer cancelled its request `request` on `conn` (it reads the
    /// store instead): drop it unless its block is being sent.
    Cancel { conn: ConnId, request: u64 },
    /// The block of our request `request` is in its extent: the owner's
    /// data header and the CRC-32C of the bytes received (the requester
    /// verifies them).
    Received {
        request: u64,
        header: DataHeader,
        crc32c: u32,
    },
    /// Our request `request` failed.
    Failed { request: u64, why: GetFailure },
    /// A block arrived after the engine had read the store instead; it was
    /// dropped.
    LateDiscarded { request: u64 },
    /// The block we served for `request` on `conn` is written (or will
    /// never be): its extent may be unpinned.
    Sent { conn: ConnId, request: u64 },
    /// A round trip to `member`, measured by a keepalive.
    Rtt { member: usize, nanos: u64 },
    /// Authenticated member `member` sent its RDMA queue pair parameters
    /// on connection `conn`.
    RdmaSetup {
        conn: ConnId,
        member: usize,
        bytes: Vec<u8>,
    },
    /// Authenticated member `member` sent its job status.
    JobStatus {
        member: usize,
        status: granary_peer::status::JobStatus,
    },
}

/// A command for one connection.
enum Cmd {
    Get(OutGet),
    Cancel(u64),
    Data { header: DataHeader, src: ArenaSlice },
    Miss { get: Get, reason: MissReason },
    RdmaSetup(Vec<u8>),
    JobStatus(Arc<granary_peer::status::JobStatus>),
}

/// How a member's connection stands, for our own requests.
enum Slot {
    /// None; the next request dials.
    Idle,
    /// Being dialed; requests wait here.
    Dialing(Vec<OutGet>),
    /// Requests go to this connection.
    Up(ConnId),
    /// The last dial failed: requests fail at once until then.
    Down(Instant),
}

/// What [`Net::start`] needs.
#[derive(Debug, Clone)]
pub(crate) struct NetConfig {
    /// The view every member shares.
    pub view: Arc<View>,
    /// Our index in it.
    pub me: usize,
    /// Our side of every connection (`expected_peer` is set per dial).
    pub conn: ConnConfig,
    /// Time to connect before the handshake.
    pub connect_timeout: Duration,
    /// After a failed dial, or a connection that carried our requests
    /// ending without a goodbye (reset, silence, malformed bytes),
    /// requests to that member fail for this long (they go to the store).
    pub redial_after: Duration,
    /// For this long after the transport starts, a failed dial is tried
    /// again after [`VIEW_MISMATCH_REDIAL`] instead (see [`SETTLING`]).
    pub settling: Duration,
    /// The address dials leave from: the listener's IP when it names one.
    pub source: Option<std::net::IpAddr>,
    /// The bounds on what peers and strangers may hold here.
    pub limits: Limits,
    /// `granary_peer_rejected_total{reason}`.
    pub rejected: Family<Labels, Counter>,
}

/// The transport's bounds (`peers.max_connections` and the others; see
/// `docs/security.md`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Accepted connections held at once.
    pub max_connections: u32,
    /// Of which from one source IP.
    pub max_per_address: u32,
    /// A write making no progress this long closes its connection.
    pub write_timeout: Duration,
    /// A block not wholly received this long after its header closes its
    /// connection (the sample is read elsewhere).
    pub block_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_per_address: 8,
            write_timeout: Duration::from_secs(10),
            block_timeout: Duration::from_secs(5),
        }
    }
}

/// How soon a peer that held another view is dialled again: agents take a
/// relaunch's view within moments of each other.
const VIEW_MISMATCH_REDIAL: Duration = Duration::from_millis(50);

/// For this long after the transport starts (the agent started, or took a
/// new view) a failed dial is tried again after [`VIEW_MISMATCH_REDIAL`]:
/// the other agents are starting or taking the view too.
pub(crate) const SETTLING: Duration = Duration::from_secs(5);

struct Shared {
    cfg: NetConfig,
    origin: Instant,
    events: Mutex<VecDeque<Event>>,
    wake: EventFd,
    slots: Mutex<Vec<Slot>>,
    conns: Mutex<HashMap<ConnId, mpsc::UnboundedSender<Cmd>>>,
    /// Authenticated connections and their member.
    established: Mutex<HashMap<ConnId, usize>>,
    next_conn: AtomicU64,
    /// Accepted connections held, by source IP.
    accepted: Mutex<HashMap<IpAddr, u32>>,
    /// Accepted connections still in their handshake, oldest first, and
    /// how to close each: when the listener is full, the oldest makes room
    /// for a new one.
    handshaking: Mutex<BTreeMap<ConnId, Arc<Notify>>>,
    log: RateLog,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug that already
    // stopped a task; the data stays consistent enough to go on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// How long a member whose dial failed stays down.
    fn redial_after(&self, view_mismatch: bool) -> Duration {
        if view_mismatch || self.origin.elapsed() < self.cfg.settling {
            VIEW_MISMATCH_REDIAL.min(self.cfg.redial_after)
        } else {
            self.cfg.redial_after
        }
    }

    /// Counts a refusal for `reason` and logs it, rate-limited.
    fn reject(&self, reason: &'static str, from: Option<SocketAddr>, what: &str) {
        self.cfg
            .rejected
            .get_or_create(&label("reason", reason))
            .inc();
        if let Some(skipped) = self.log.allow(reason) {
            let from = from.map_or_else(|| "-".to_string(), |a| a.to_string());
            tracing::warn!(%from, reason, skipped, "peer tier: {what}");
        }
    }

    fn emit(&self, e: Event) {
        lock(&self.events).push_back(e);
        // The counter cannot overflow at our rates; a failed write leaves
        // the engine to find the event on its next turn.
        let _ = self.wake.write(1);
    }

    fn emit_all(&self, es: impl IntoIterator<Item = Event>) {
        let mut q = lock(&self.events);
        let before = q.len();
        q.extend(es);
        if q.len() > before {
            let _ = self.wake.write(1);
        }
    }
}

/// The running transport. Dropping it stops every connection.
pub(crate) struct Net {
    shared: Arc<Shared>,
    local: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").field("listen", &self.local).finish()
    }
}

impl Net {
    /// Binds the listener on `listen` and starts the runtime.
    pub(crate) fn start(cfg: NetConfig, listen: SocketAddr) -> io::Result<Net> {
        let std_listener = StdListener::bind(listen)
            .map_err(|e| io::Error::new(e.kind(), format!("peer listener on {listen}: {e}")))?;
        std_listener.set_nonblocking(true)?;
        let local = std_listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("granary-peers")
            .enable_io()
            .enable_time()
            .build()?;
        let members = cfg.view.len();
        let shared = Arc::new(Shared {
            cfg,
            origin: Instant::now(),
            events: Mutex::new(VecDeque::new()),
            wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(io::Error::from)?,
            slots: Mutex::new((0..members).map(|_| Slot::Idle).collect()),
            conns: Mutex::new(HashMap::new()),
            established: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            accepted: Mutex::new(HashMap::new()),
            handshaking: Mutex::new(BTreeMap::new()),
            log: RateLog::new(Duration::from_secs(10)),
        });
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(std_listener)?
        };
        rt.spawn(accept_loop(Arc::clone(&shared), listener));
        Ok(Net {
            shared,
            local,
            rt: Some(rt),
        })
    }

    /// The address the listener is bound to.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Nanoseconds on the transport's clock (due times are on it).
    pub(crate) fn nanos(&self) -> Nanos {
        self.shared.now()
    }

    /// Readable while events may be waiting.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }

    /// Whether requests to `member` may be tried (not marked down after a
    /// failed dial).
    pub(crate) fn reachable(&self, member: usize) -> bool {
        let mut slots = lock(&self.shared.slots);
        match slots.get(member) {
            Some(Slot::Down(until)) if Instant::now() < *until => false,
            Some(Slot::Down(_)) => {
                slots[member] = Slot::Idle;
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Whether an authenticated connection to `member` carries our
    /// requests now.
    pub(crate) fn is_up(&self, member: usize) -> bool {
        matches!(lock(&self.shared.slots).get(member), Some(Slot::Up(_)))
    }

    /// Asks `member` for a sample. The outcome comes back as an event
    /// ([`Event::Landed`] or [`Event::Failed`]).
    pub(crate) fn get(&self, member: usize, g: OutGet) {
        let request = g.get.request;
        let mut slots = lock(&self.shared.slots);
        let Some(slot) = slots.get_mut(member) else {
            drop(slots);
            self.shared.emit(Event::Failed {
                request,
                why: GetFailure::Lost(format!("no member {member}")),
            });
            return;
        };
        match slot {
            Slot::Up(conn) => {
                let conn = *conn;
                let tx = lock(&self.shared.conns).get(&conn).cloned();
                match tx {
                    Some(tx) => {
                        if let Err(mpsc::error::SendError(Cmd::Get(g))) = tx.send(Cmd::Get(g)) {
                            *slot = Slot::Idle;
                            drop(slots);
                            self.fail_lost(g, "connection closed");
                        }
                    }
                    None => {
                        *slot = Slot::Dialing(vec![g]);
                        drop(slots);
                        self.dial(member);
                    }
                }
            }
            Slot::Dialing(q) => q.push(g),
            Slot::Idle => {
                *slot = Slot::Dialing(vec![g]);
                drop(slots);
                self.dial(member);
            }
            Slot::Down(_) => {
                drop(slots);
                self.fail_lost(g, "peer unreachable");
            }
        }
    }

    fn fail_lost(&self, g: OutGet, why: &str) {
        self.shared.emit(Event::Failed {
            request: g.get.request,
            why: GetFailure::Lost(why.to_string()),
        });
    }

    fn dial(&self, member: usize) {
        if let Some(rt) = &self.rt {
            rt.spawn(dial(Arc::clone(&self.shared), member, false));
        }
    }

    /// Dials `member` without a request, unless a connection to it is up
    /// or being dialled: an owner awaited after its connection dropped is
    /// found as soon as it listens again ([`Event::Up`]). A failed probe
    /// is not logged (an agent restarting refuses many) and leaves the
    /// member down as a failed dial does.
    pub(crate) fn probe(&self, member: usize) {
        let mut slots = lock(&self.shared.slots);
        let Some(slot) = slots.get_mut(member) else {
            return;
        };
        if matches!(slot, Slot::Idle | Slot::Down(_)) {
            *slot = Slot::Dialing(Vec::new());
            drop(slots);
            if let Some(rt) = &self.rt {
                rt.spawn(dial(Arc::clone(&self.shared), member, true));
            }
        }
    }

    /// Cancels our request `request` to `member` on the connection that
    /// carries our requests to it (nothing when none does: a request of a
    /// connection that ended has failed already).
    pub(crate) fn cancel(&self, member: usize, request: u64) {
        let conn = match lock(&self.shared.slots).get(member) {
            Some(Slot::Up(conn)) => *conn,
            _ => return,
        };
        if let Some(tx) = lock(&self.shared.conns).get(&conn) {
            let _ = tx.send(Cmd::Cancel(request));
        }
    }

    /// Answers a request of connection `conn` with `header` and the block
    /// in `src` (pinned by the caller until [`Event::Sent`]).
    pub(crate) fn send_block(&self, conn: ConnId, header: DataHeader, src: ArenaSlice) {
        let request = header.request;
        let tx = lock(&self.shared.conns).get(&conn).cloned();
        let sent = tx.is_some_and(|tx| tx.send(Cmd::Data { header, src }).is_ok());
        if !sent {
            self.shared.emit(Event::Sent { conn, request });
        }
    }

    /// Sends our RDMA queue pair parameters on connection `conn` (once it
    /// is authenticated; before, or on a closed connection, they are
    /// dropped and the peer stays on TCP).
    pub(crate) fn send_rdma_setup(&self, conn: ConnId, bytes: Vec<u8>) {
        if let Some(tx) = lock(&self.shared.conns).get(&conn) {
            let _ = tx.send(Cmd::RdmaSetup(bytes));
        }
    }

    /// Sends our job status to `member` on the connection that carries
    /// our requests to it; nothing when none is up (status never dials:
    /// the next one goes once a connection is). Returns whether it was
    /// queued.
    pub(crate) fn send_job_status(
        &self,
        member: usize,
        status: &Arc<granary_peer::status::JobStatus>,
    ) -> bool {
        let conn = match lock(&self.shared.slots).get(member) {
            Some(Slot::Up(conn)) => *conn,
            _ => return false,
        };
        lock(&self.shared.conns)
            .get(&conn)
            .is_some_and(|tx| tx.send(Cmd::JobStatus(Arc::clone(status))).is_ok())
    }

    /// Answers request `get` of connection `conn` with a miss.
    pub(crate) fn send_miss(&self, conn: ConnId, get: Get, reason: MissReason) {
        if let Some(tx) = lock(&self.shared.conns).get(&conn) {
            let _ = tx.send(Cmd::Miss { get, reason });
        }
    }

    /// Moves every pending event to `out`.
    pub(crate) fn drain(&self, out: &mut Vec<Event>) {
        // Reset the eventfd first: an event pushed after this is seen now
        // or wakes the next poll.
        let _ = self.shared.wake.read();
        out.extend(lock(&self.shared.events).drain(..));
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Tasks still holding arena ranges keep the mapping alive
            // (ArenaSlice); none is left writing once the runtime is gone.
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let Some(slot) = AcceptSlot::take(&shared, from) else {
                    // Dropped at once: closed before a byte is read.
                    continue;
                };
                tracing::debug!(%from, "peer connection accepted");
                tokio::spawn(async move {
                    let s = Arc::clone(&slot.shared);
                    run_conn(s, stream, None, Vec::new(), Some(from)).await;
                    drop(slot);
                });
            }
            Err(e) => {
                if let Some(skipped) = shared.log.allow("accept") {
                    tracing::warn!(skipped, "peer listener: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// An accepted connection's place under `peers.max_connections` and
/// `peers.max_connections_per_address`, given back on drop.
struct AcceptSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl AcceptSlot {
    fn take(shared: &Arc<Shared>, from: SocketAddr) -> Option<AcceptSlot> {
        let limits = shared.cfg.limits;
        let ip = from.ip();
        let (refused, evicted) = {
            let mut held = lock(&shared.accepted);
            let total: u32 = held.values().sum();
            let here = held.get(&ip).copied().unwrap_or(0);
            // Full: the oldest connection still in its handshake is closed
            // to make room, so that strangers holding every place cannot
            // keep a member out (its handshake takes a round trip).
            let evicted = (total >= limits.max_connections && here < limits.max_per_address)
                .then(|| lock(&shared.handshaking).pop_first())
                .flatten();
            if let Some((_, close)) = &evicted {
                close.notify_one();
            }
            let refused = if total >= limits.max_connections && evicted.is_none() {
                Some("connections")
            } else if here >= limits.max_per_address {
                Some("per_address")
            } else {
                *held.entry(ip).or_insert(0) += 1;
                None
            };
            (refused, evicted.is_some())
        };
        if evicted {
            shared.reject(
                "connections",
                Some(from),
                "listener full (peers.max_connections): closed the oldest connection still in \
                 its handshake to take a new one",
            );
        }
        match refused {
            Some(reason) => {
                shared.reject(
                    reason,
                    Some(from),
                    if reason == "connections" {
                        "connection refused: peers.max_connections reached"
                    } else {
                        "connection refused: peers.max_connections_per_address reached"
                    },
                );
                None
            }
            None => Some(AcceptSlot {
                shared: Arc::clone(shared),
                ip,
            }),
        }
    }
}

impl Drop for AcceptSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.shared.accepted);
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

async fn dial(shared: Arc<Shared>, member: usize, quiet: bool) {
    let addr = shared.cfg.view.members()[member].addr.clone();
    let connect = tokio::time::timeout(
        shared.cfg.connect_timeout,
        connect_from(shared.cfg.source, &addr),
    )
    .await;
    let err = match connect {
        Ok(Ok(stream)) => {
            // Requests made while the handshake runs wait in the slot; those
            // made while connecting go with the connection.
            let queued = {
                let mut slots = lock(&shared.slots);
                match &mut slots[member] {
                    Slot::Dialing(q) => std::mem::take(q),
                    _ => Vec::new(),
                }
            };
            run_conn(shared, stream, Some(member), queued, None).await;
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no connection within {:?}", shared.cfg.connect_timeout),
    };
    if quiet {
        tracing::debug!(peer = %shared.cfg.view.members()[member].id, %addr, "probe failed: {err}");
    } else {
        tracing::warn!(peer = %shared.cfg.view.members()[member].id, %addr, "dial failed: {err}");
    }
    let until = Instant::now() + shared.redial_after(false);
    let queued = {
        let mut slots = lock(&shared.slots);
        match &mut slots[member] {
            // A connection the peer opened to us may have been adopted
            // meanwhile: it stays.
            Slot::Dialing(q) => {
                let q = std::mem::take(q);
                slots[member] = Slot::Down(until);
                q
            }
            _ => Vec::new(),
        }
    };
    shared.emit_all(queued.into_iter().map(|g| Event::Failed {
        request: g.get.request,
        why: GetFailure::Lost(format!("dial {addr}: {err}")),
    }));
}

/// Connects to `addr` (`HOST:PORT`) from `source` when it names an IP (the
/// listener's), so that peers see this node's own address; from the
/// address the routes pick otherwise.
async fn connect_from(source: Option<std::net::IpAddr>, addr: &str) -> io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = io::Error::other(format!("{addr}: no address"));
    for target in tokio::net::lookup_host(addr).await? {
        if target.is_ipv4() != ip.is_ipv4() {
            continue;
        }
        let socket = if ip.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(ip, 0))?;
        match socket.connect(target).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The block being received.
struct Landing {
    request: u64,
    sample: u64,
    crc: u32,
    /// `None`: the engine read the store instead; the bytes are dropped.
    dest: Option<ArenaSlice>,
    got: usize,
    len: usize,
    /// When its header arrived (the transport's clock).
    started: Nanos,
}

/// One connection's state, shared by its reading and writing halves.
struct State {
    conn: Conn,
    member: Option<usize>,
    /// Our requests sent, by request id.
    expects: HashMap<u64, OutGet>,
    /// Our requests waiting for credit or the handshake.
    backlog: VecDeque<OutGet>,
    /// Blocks to send, in the order of their data headers.
    sends: VecDeque<(u64, ArenaSlice)>,
    /// The handshake failed because the two sides hold different views:
    /// during a relaunch the other side is about to take the same view,
    /// so it is dialled again soon.
    view_mismatch: bool,
    /// The connection ended with a goodbye (either side's `Normal`): the
    /// peer may be dialled again at once.
    clean_close: bool,
    /// The transport closed it for a reason it counted already.
    counted: bool,
}

struct ConnCtx {
    shared: Arc<Shared>,
    id: ConnId,
    /// The other end's address (for logs).
    remote: Option<SocketAddr>,
    stream: Arc<TcpStream>,
    state: Mutex<State>,
    write: Notify,
    closed: Notify,
    /// Notified to close an accepted connection still in its handshake
    /// when the listener is full ([`AcceptSlot::take`]).
    evict: Arc<Notify>,
}

impl ConnCtx {
    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

async fn run_conn(
    shared: Arc<Shared>,
    stream: TcpStream,
    dialed: Option<usize>,
    queued: Vec<OutGet>,
    from: Option<SocketAddr>,
) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    let mut cfg = shared.cfg.conn.clone();
    cfg.expected_peer = dialed.map(|m| shared.cfg.view.members()[m].id.clone());
    let mut entropy = [0u8; 32];
    for chunk in entropy.chunks_mut(8) {
        chunk.copy_from_slice(&sys::random_u64().to_le_bytes());
    }
    let conn = match dialed {
        Some(_) => Conn::dial(cfg, entropy, shared.now()),
        None => Conn::accept(cfg, entropy, shared.now()),
    };
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("peer connection refused by its own configuration: {e:?}");
            shared.emit_all(queued.into_iter().map(|g| Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost("bad peer configuration".into()),
            }));
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    lock(&shared.conns).insert(id, tx);
    let remote = from.or_else(|| stream.peer_addr().ok());
    let ctx = Arc::new(ConnCtx {
        shared,
        id,
        remote,
        stream: Arc::new(stream),
        state: Mutex::new(State {
            conn,
            member: None,
            expects: HashMap::new(),
            backlog: queued.into(),
            sends: VecDeque::new(),
            view_mismatch: false,
            clean_close: false,
            counted: false,
        }),
        write: Notify::new(),
        closed: Notify::new(),
        evict: Arc::new(Notify::new()),
    });
    if dialed.is_none() {
        lock(&ctx.shared.handshaking).insert(id, Arc::clone(&ctx.evict));
    }
    let mut writer = tokio::spawn(write_loop(Arc::clone(&ctx)));
    ctx.write.notify_one();
    let (why, landing) = read_loop(&ctx, &mut rx).await;
    // No new command reaches this connection; those queued are answered.
    lock(&ctx.shared.conns).remove(&ctx.id);
    rx.close();
    let mut dropped = Vec::new();
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Get(g) => dropped.push(Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost(why.clone()),
            }),
            Cmd::Data { header, .. } => dropped.push(Event::Sent {
                conn: id,
                request: header.request,
            }),
            Cmd::Miss { .. } | Cmd::RdmaSetup(_) | Cmd::Cancel(_) | Cmd::JobStatus(_) => {}
        }
    }
    // Let the writer flush a goodbye, then stop it: once it has ended, no
    // pinned extent is being sent and the pins may go.
    ctx.st().conn.close(GoodbyeReason::Normal);
    ctx.write.notify_one();
    if tokio::time::timeout(Duration::from_millis(500), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
        let _ = writer.await;
    }
    ctx.shared.emit_all(dropped);
    finish(&ctx, dialed, &why, landing);
}

/// Reads, handles commands and timers until the connection closes; returns
/// why it closed, and the block it was receiving, if any.
async fn read_loop(
    ctx: &Arc<ConnCtx>,
    rx: &mut mpsc::UnboundedReceiver<Cmd>,
) -> (String, Option<Landing>) {
    let mut landing: Option<Landing> = None;
    loop {
        if let Some(why) = handle_events(ctx, &mut landing) {
            return (why, landing);
        }
        let block_due = landing.as_ref().map(|l| {
            l.started
                .saturating_add(ctx.shared.cfg.limits.block_timeout.as_nanos() as u64)
        });
        if block_due.is_some_and(|due| ctx.shared.now() >= due) {
            ctx.shared.reject(
                "block_timeout",
                ctx.remote,
                "a block did not arrive whole within peers.block_timeout_ms; connection closed, \
                 the sample is read elsewhere",
            );
            return (
                "a block did not arrive within peers.block_timeout_ms".into(),
                landing,
            );
        }
        let deadline = {
            let st = ctx.st();
            st.conn.poll_timeout()
        };
        let deadline = match (deadline, block_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = match deadline {
            Some(at) => Duration::from_nanos(at.saturating_sub(ctx.shared.now())),
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            r = ctx.stream.readable() => {
                if let Err(e) = r {
                    return (format!("socket: {e}"), landing);
                }
                match receive(ctx) {
                    Ok(true) => {}
                    Ok(false) => return ("closed by the peer".into(), landing),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return (format!("receive: {e}"), landing),
                }
            }
            cmd = rx.recv() => {
                let Some(cmd) = cmd else {
                    return ("transport stopped".into(), landing);
                };
                command(ctx, cmd);
            }
            _ = tokio::time::sleep(sleep) => {
                let now = ctx.shared.now();
                ctx.st().conn.handle_timeout(now);
                ctx.write.notify_one();
            }
            _ = ctx.evict.notified() => {
                return (
                    "closed to make room for a new connection: the listener was full \
                     (peers.max_connections) and this one had not authenticated"
                        .into(),
                    landing,
                );
            }
            _ = ctx.closed.notified() => {
                // The writer failed (and counted a timeout if it was one).
                let mut st = ctx.st();
                st.counted = true;
                st.conn.close(GoodbyeReason::ProtocolError);
            }
        }
    }
}

/// One non-blocking receive into the connection's own buffer (no more than
/// its handshake still needs until the channel is up). Returns false at
/// the end of the stream.
fn receive(ctx: &ConnCtx) -> io::Result<bool> {
    let now = ctx.shared.now();
    let mut st = ctx.st();
    let r = ctx.stream.try_read(st.conn.input_buffer());
    let n = *r.as_ref().unwrap_or(&0);
    st.conn.input_written(n, now);
    r.map(|n| n > 0)
}

/// Handles the connection's events (and the buffered payload bytes of a
/// block being received). Returns why the connection closed, if it did.
fn handle_events(ctx: &Arc<ConnCtx>, landing: &mut Option<Landing>) -> Option<String> {
    let mut out = Vec::new();
    let mut closed = None;
    {
        let mut st = ctx.st();
        loop {
            if let Some(l) = landing.as_mut() {
                match &l.dest {
                    // Opened straight into the reserved extent.
                    Some(dest) => loop {
                        let got = l.got;
                        let n = dest.with_bytes_mut(|b| st.conn.payload_into(&mut b[got..]));
                        if n == 0 {
                            break;
                        }
                        l.got += n;
                    },
                    // The store has the extent: the bytes are dropped.
                    None => {
                        while let Some(piece) = st.conn.payload() {
                            l.got += piece.len();
                        }
                    }
                }
                if st.conn.payload_remaining() > 0 {
                    if !st.conn.is_closed() {
                        break;
                    }
                    // Closed mid-block: the Closed event ends the
                    // connection and the block fails (see `finish`).
                } else if let Some(l) = landing.take() {
                    out.push(landed(l));
                }
            }
            let Some(ev) = st.conn.poll_event() else {
                break;
            };
            match ev {
                ConnEvent::Established {
                    peer, incarnation, ..
                } => match ctx.shared.cfg.view.index_of(&peer) {
                    Some(m) if m != ctx.shared.cfg.me => {
                        st.member = Some(m);
                        lock(&ctx.shared.handshaking).remove(&ctx.id);
                        out.push(Event::Up {
                            conn: ctx.id,
                            member: m,
                            incarnation,
                            channel: st.conn.channel(),
                        });
                        adopt(ctx, &mut st, m);
                        flush_backlog(ctx, &mut st);
                    }
                    _ => {
                        ctx.shared.reject(
                            "not_member",
                            ctx.remote,
                            &format!("peer {peer:?} is not a member of this job's view; closing"),
                        );
                        st.counted = true;
                        st.conn.close(GoodbyeReason::ViewMismatch);
                    }
                },
                ConnEvent::Request(get) => out.push(Event::Request { conn: ctx.id, get }),
                ConnEvent::Cancel(request) => out.push(Event::Cancel {
                    conn: ctx.id,
                    request,
                }),
                ConnEvent::Data(h) => match st.expects.remove(&h.request) {
                    Some(g) if g.get.sample == h.sample && g.get.length == h.length => {
                        let dest = g.claim.receive().then_some(g.dest);
                        *landing = Some(Landing {
                            request: h.request,
                            sample: h.sample,
                            crc: h.crc,
                            dest,
                            got: 0,
                            len: h.length as usize,
                            started: ctx.shared.now(),
                        });
                    }
                    other => {
                        let what = if other.is_some() {
                            "peer sent a block other than the one asked for; closing"
                        } else {
                            "peer sent a block nobody asked for; closing"
                        };
                        ctx.shared.reject("protocol", ctx.remote, what);
                        st.counted = true;
                        if let Some(g) = other {
                            out.push(Event::Failed {
                                request: g.get.request,
                                why: GetFailure::Corrupt,
                            });
                        }
                        st.conn.close(GoodbyeReason::ProtocolError);
                    }
                },
                ConnEvent::Miss {
                    request, reason, ..
                } => {
                    if st.expects.remove(&request).is_some() {
                        out.push(Event::Failed {
                            request,
                            why: GetFailure::Miss(reason),
                        });
                    }
                }
                ConnEvent::Credit(_) => flush_backlog(ctx, &mut st),
                ConnEvent::RdmaSetup(bytes) => {
                    if let Some(member) = st.member {
                        out.push(Event::RdmaSetup {
                            conn: ctx.id,
                            member,
                            bytes,
                        });
                    }
                }
                ConnEvent::JobStatus(status) => {
                    if let Some(member) = st.member {
                        out.push(Event::JobStatus { member, status });
                    }
                }
                ConnEvent::Rtt(nanos) => {
                    if let Some(member) = st.member {
                        out.push(Event::Rtt { member, nanos });
                    }
                }
                ConnEvent::Closed(c) => {
                    if !st.counted {
                        refused(ctx, &c, st.member.is_some());
                    }
                    st.view_mismatch = matches!(
                        c,
                        Closed::Local(GoodbyeReason::ViewMismatch)
                            | Closed::Remote(GoodbyeReason::ViewMismatch)
                    );
                    st.clean_close = matches!(
                        c,
                        Closed::Local(GoodbyeReason::Normal)
                            | Closed::Remote(GoodbyeReason::Normal)
                    );
                    closed = Some(match c {
                        Closed::Local(r) => format!("closed here ({r:?})"),
                        Closed::Remote(r) => format!("closed by the peer ({r:?})"),
                        Closed::Malformed(e) => format!("peer sent malformed bytes: {e}"),
                        Closed::Channel(e) => format!("channel: {e}"),
                    });
                    break;
                }
            }
        }
    }
    ctx.shared.emit_all(out);
    ctx.write.notify_one();
    closed
}

/// Counts and logs (rate-limited) a connection that ended because of what
/// the other side did.
fn refused(ctx: &ConnCtx, c: &Closed, established: bool) {
    let reason = match c {
        Closed::Channel(ChannelError::ProtectionMismatch { .. }) => "protection",
        Closed::Channel(
            ChannelError::Unauthentic | ChannelError::RecordLength(_) | ChannelError::Exhausted,
        ) => "record",
        Closed::Channel(_) => "handshake",
        Closed::Malformed(_) => "malformed",
        Closed::Local(GoodbyeReason::Timeout) if !established => "handshake_timeout",
        Closed::Local(GoodbyeReason::ProtocolError) => "protocol",
        _ => return,
    };
    let what = match c {
        Closed::Channel(e) => format!("connection closed: {e}"),
        Closed::Malformed(e) => format!("connection closed: malformed frames ({e})"),
        Closed::Local(GoodbyeReason::Timeout) => {
            "connection closed: no handshake within peers.connect_timeout_ms".to_string()
        }
        _ => "connection closed: the peer broke the protocol".to_string(),
    };
    ctx.shared.reject(reason, ctx.remote, &what);
}

/// The event for a block fully received.
fn landed(l: Landing) -> Event {
    let Some(dest) = l.dest else {
        return Event::LateDiscarded { request: l.request };
    };
    Event::Received {
        request: l.request,
        header: DataHeader {
            request: l.request,
            sample: l.sample,
            length: l.len as u64,
            crc: l.crc,
            store_wait_us: 0,
        },
        crc32c: dest.crc32c(),
    }
}

/// Makes this connection the one our requests to `member` use, unless
/// another already is; takes over requests queued while dialing.
fn adopt(ctx: &ConnCtx, st: &mut State, member: usize) {
    let mut slots = lock(&ctx.shared.slots);
    lock(&ctx.shared.established).insert(ctx.id, member);
    match std::mem::replace(&mut slots[member], Slot::Up(ctx.id)) {
        Slot::Dialing(q) => st.backlog.extend(q),
        Slot::Up(other) if other != ctx.id && lock(&ctx.shared.conns).contains_key(&other) => {
            // Both sides dialed at once: the first connection up keeps
            // carrying requests; this one serves only.
            slots[member] = Slot::Up(other);
        }
        _ => {}
    }
}

fn flush_backlog(ctx: &ConnCtx, st: &mut State) {
    if !st.conn.is_established() {
        return;
    }
    let now = ctx.shared.now();
    while st.conn.credit() > 0 {
        let Some(g) = st.backlog.pop_front() else {
            break;
        };
        if g.claim.is_abandoned() {
            // Hedged while waiting for credit: the store has it.
            continue;
        }
        match st.conn.send_get(g.get, now) {
            Ok(()) => {
                st.expects.insert(g.get.request, g);
            }
            Err(_) => {
                st.backlog.push_front(g);
                break;
            }
        }
    }
}

fn command(ctx: &ConnCtx, cmd: Cmd) {
    let mut st = ctx.st();
    match cmd {
        Cmd::Get(g) => {
            st.backlog.push_back(g);
            flush_backlog(ctx, &mut st);
        }
        Cmd::Cancel(request) => {
            // Only a request this connection sent is cancelled at the
            // owner; one still waiting for credit is skipped when its turn
            // comes (its claim is the store's).
            if st.expects.contains_key(&request) {
                let _ = st.conn.send_cancel(request);
            }
        }
        Cmd::Data { header, src } => {
            if st.conn.send_data(header).is_ok() {
                st.sends.push_back((header.request, src));
            } else {
                drop(st);
                ctx.shared.emit(Event::Sent {
                    conn: ctx.id,
                    request: header.request,
                });
            }
        }
        Cmd::Miss { get, reason } => {
            let _ = st.conn.send_miss(get.request, get.sample, reason);
        }
        Cmd::RdmaSetup(bytes) => {
            if let Err(e) = st.conn.send_rdma_setup(&bytes) {
                tracing::debug!(conn = ctx.id, "RDMA setup not sent: {e}");
            }
        }
        Cmd::JobStatus(status) => {
            if let Err(e) = st.conn.send_job_status(&status) {
                tracing::debug!(conn = ctx.id, "job status not sent: {e}");
            }
        }
    }
    ctx.write.notify_one();
}

/// Bytes of a payload sealed per write: four whole records, so that a
/// large block never sits whole in memory.
const SEAL_CHUNK: usize = 4 * granary_peer::channel::MAX_RECORD_PLAINTEXT;

/// Writes what the connection queues: sealed frames, and each block's
/// payload sealed from its pinned extent a chunk at a time.
async fn write_loop(ctx: Arc<ConnCtx>) {
    let mut sealed = Vec::new();
    loop {
        let next = {
            let mut st = ctx.st();
            match st.conn.poll_transmit() {
                Some(Transmit::Bytes(b)) => Some(Ok(b)),
                Some(Transmit::Payload(h)) => {
                    let src = st.sends.pop_front();
                    Some(Err(Some((h, src))))
                }
                None if st.conn.is_closed() => Some(Err(None)),
                None => None,
            }
        };
        let result = match next {
            None => {
                ctx.write.notified().await;
                continue;
            }
            Some(Ok(bytes)) => {
                write_bytes(&ctx.stream, &bytes, ctx.shared.cfg.limits.write_timeout).await
            }
            // Closed and everything written.
            Some(Err(None)) => return,
            Some(Err(Some((h, src)))) => {
                let r = match &src {
                    Some((request, src))
                        if *request == h.request && src.len() as u64 >= h.length =>
                    {
                        write_payload(&ctx, src, h.length, &mut sealed).await
                    }
                    _ => Err(io::Error::other("no pinned extent for a block to send")),
                };
                ctx.shared.emit(Event::Sent {
                    conn: ctx.id,
                    request: h.request,
                });
                r
            }
        };
        if let Err(e) = result {
            if e.kind() == io::ErrorKind::TimedOut {
                ctx.shared.reject(
                    "write_timeout",
                    ctx.remote,
                    "the peer took nothing within peers.write_timeout_ms; connection closed",
                );
            }
            tracing::debug!(conn = ctx.id, "peer write: {e}");
            ctx.closed.notify_one();
            return;
        }
    }
}

/// Seals `len` bytes of the pinned extent `src` into records, a chunk at a
/// time, encrypted straight from the extent into `sealed`, and writes them.
async fn write_payload(
    ctx: &ConnCtx,
    src: &ArenaSlice,
    len: u64,
    sealed: &mut Vec<u8>,
) -> io::Result<()> {
    let len = len as usize;
    sealed.resize(Conn::sealed_len(SEAL_CHUNK), 0);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(SEAL_CHUNK);
        let written = src
            .with_bytes(|b| ctx.st().conn.seal_payload_into(&b[at..at + n], sealed))
            .map_err(|e| io::Error::other(format!("sealing a block: {e}")))?;
        write_bytes(
            &ctx.stream,
            &sealed[..written],
            ctx.shared.cfg.limits.write_timeout,
        )
        .await?;
        at += n;
    }
    Ok(())
}

/// Writes all of `bytes`; fails with `TimedOut` when the socket takes
/// nothing for `timeout` (a peer that does not read).
async fn write_bytes(stream: &TcpStream, mut bytes: &[u8], timeout: Duration) -> io::Result<()> {
    while !bytes.is_empty() {
        match tokio::time::timeout(timeout, stream.writable()).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no write progress within peers.write_timeout_ms",
                ))
            }
        }
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fails what the connection still owed and forgets it.
fn finish(ctx: &ConnCtx, dialed: Option<usize>, why: &str, landing: Option<Landing>) {
    lock(&ctx.shared.established).remove(&ctx.id);
    lock(&ctx.shared.handshaking).remove(&ctx.id);
    let mut out = Vec::new();
    if let Some(l) = landing {
        // Cut off mid-block: nothing writes the extent any more, the
        // engine reads the store into it.
        out.push(match l.dest {
            Some(_) => Event::Failed {
                request: l.request,
                why: GetFailure::Lost(format!("{why} in the middle of a block")),
            },
            None => Event::LateDiscarded { request: l.request },
        });
    }
    let member = {
        // The connection is closed (run_conn closed it before stopping the
        // writer); what it still owed fails here.
        let mut st = ctx.st();
        for (request, _) in st.expects.drain() {
            out.push(Event::Failed {
                request,
                why: GetFailure::Lost(why.to_string()),
            });
        }
        for g in st.backlog.drain(..) {
            out.push(Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost(why.to_string()),
            });
        }
        for (request, _) in st.sends.drain(..) {
            out.push(Event::Sent {
                conn: ctx.id,
                request,
            });
        }
        (st.member, st.view_mismatch, st.clean_close)
    };
    let (member, view_mismatch, clean_close) = member;
    let redial = ctx.shared.redial_after(view_mismatch);
    if let Some(m) = member.or(dialed) {
        let mut slots = lock(&ctx.shared.slots);
        // Another authenticated connection to the same member (both sides
        // dialed at once) takes over.
        let other = lock(&ctx.shared.established)
            .iter()
            .find(|(_, &mm)| mm == m)
            .map(|(&c, _)| c);
        match std::mem::replace(&mut slots[m], Slot::Idle) {
            Slot::Up(c) if c != ctx.id => slots[m] = Slot::Up(c),
            Slot::Up(_) if other.is_some() => {
                slots[m] = Slot::Up(other.unwrap_or_default());
            }
            // Our requests' connection was reset, went silent or carried
            // malformed bytes: the peer is left alone for a while (its
            // samples come from the store), then dialled again.
            Slot::Up(_) if !clean_close => slots[m] = Slot::Down(Instant::now() + redial),
            Slot::Dialing(q) if member.is_none() => {
                // The handshake failed: requests that waited for it fail.
                out.extend(q.into_iter().map(|g| Event::Failed {
                    request: g.get.request,
                    why: GetFailure::Lost(why.to_string()),
                }));
                slots[m] = Slot::Down(Instant::now() + redial);
            }
            Slot::Dialing(q) => slots[m] = Slot::Dialing(q),
            Slot::Down(t) => slots[m] = Slot::Down(t),
            _ => {}
        }
    }
    out.push(Event::Down {
        conn: ctx.id,
        member,
        why: why.to_string(),
    });
    if member.is_some() || dialed.is_some() {
        tracing::info!(conn = ctx.id, peer = ?member.map(|m| ctx.shared.cfg.view.members()[m].id.clone()), "peer connection ended: {why}");
    } else {
        // Never authenticated: counted, and logged rate-limited, where it
        // was refused; a line for each would let a stranger fill the log.
        tracing::debug!(conn = ctx.id, from = ?ctx.remote, "peer connection ended: {why}");
    }
    ctx.shared.emit_all(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking connection to `to` from `ip` (port chosen by the kernel).
    fn connect_from(ip: [u8; 4], to: SocketAddr) -> std::net::TcpStream {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let s = rt
            .block_on(async {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.bind(SocketAddr::from((ip, 0)))?;
                s.connect(to).await
            })
            .unwrap();
        let s = s.into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s
    }

    /// Whether the other side closed `s` within `wait`.
    fn closed_within(s: &mut std::net::TcpStream, wait: Duration) -> bool {
        use std::io::Read;
        s.set_read_timeout(Some(wait)).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    #[test]
    fn a_full_listener_closes_its_oldest_handshake_to_take_a_member() {
        use granary_peer::view::Member;
        use std::io::{Read, Write};
        let secret = b"a-full-listener-test-secret".to_vec();
        let view = Arc::new(
            View::new(
                "j",
                0,
                [
                    Member::new("a", "127.0.0.1:1", 1 << 30),
                    Member::new("b", "127.0.0.1:2", 1 << 30),
                ],
            )
            .unwrap(),
        );
        let conn = ConnConfig::new("j", "a", view.digest().0, 1, secret.clone());
        let rejected: Family<Labels, Counter> = Family::default();
        let net = Net::start(
            NetConfig {
                view: Arc::clone(&view),
                me: 0,
                conn,
                connect_timeout: Duration::from_secs(2),
                redial_after: Duration::from_secs(1),
                settling: Duration::ZERO,
                source: None,
                limits: Limits {
                    max_connections: 4,
                    max_per_address: 2,
                    ..Limits::default()
                },
                rejected: rejected.clone(),
            },
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap();
        let to = net.local_addr();
        // Four silent strangers from two addresses hold every place.
        let mut strangers: Vec<std::net::TcpStream> = Vec::new();
        for k in 0..4u8 {
            strangers.push(connect_from([127, 0, 0, 21 + k / 2], to));
            // In order: the first is the oldest.
            std::thread::sleep(Duration::from_millis(50));
        }
        // A member dials from elsewhere and authenticates.
        let mut m = connect_from([127, 0, 0, 23], to);
        let mut cfg = ConnConfig::new("j", "b", view.digest().0, 2, secret);
        cfg.expected_peer = Some("a".into());
        let mut c = Conn::dial(cfg, [7u8; 32], 0).unwrap();
        while let Some(Transmit::Bytes(b)) = c.poll_transmit() {
            m.write_all(&b).unwrap();
        }
        m.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        let mut up = false;
        let mut buf = vec![0u8; 4096];
        while !up && Instant::now() < end {
            if let Ok(n) = m.read(&mut buf) {
                assert!(n > 0, "the member's connection was closed");
                c.handle_input(&buf[..n], 1);
            }
            while let Some(e) = c.poll_event() {
                assert!(!matches!(e, ConnEvent::Closed(_)), "{e:?}");
                up |= matches!(e, ConnEvent::Established { .. });
            }
        }
        assert!(
            up,
            "the member did not get in while strangers held every place"
        );
        // The oldest stranger made room; the others are still held.
        assert!(closed_within(&mut strangers[0], Duration::from_secs(2)));
        for s in &mut strangers[1..] {
            assert!(!closed_within(s, Duration::from_millis(100)));
        }
        assert_eq!(
            rejected
                .get_or_create(&label("reason", "connections"))
                .get(),
            1
        );
        // A stranger from an address at its own bound is refused outright,
        // and makes no room.
        let mut more = connect_from([127, 0, 0, 22], to);
        assert!(closed_within(&mut more, Duration::from_secs(2)));
        for s in &mut strangers[1..] {
            assert!(!closed_within(s, Duration::from_millis(100)));
        }
    }
}
