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
use granary_peer::channel::{Protection, Suite};
use granary_peer::conn::{ConnConfig, Nanos};
use granary_peer::frame::{DataHeader, Get, MissReason};
use granary_peer::view::View;
use granary_shm::arena::ArenaSlice;
use nix::sys::eventfd::{EfdFlags, EventFd};
use prometheus_client::metrics::family::Family;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

mod conn;
mod connect;

use connect::{accept_loop, dial};

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

#[cfg(test)]
mod tests;
