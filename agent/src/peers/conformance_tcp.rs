//! The peer transports' conformance suite (`granary_rdma::conformance`)
//! over this agent's TCP transport ([`Net`]) on loopback: the same cases
//! the RDMA driver passes on the fake NIC.
//!
//! One requester and several owners, each a [`Net`] with its own arena
//! and runtime, authenticated with a job secret like any agent. The
//! requester reaches each owner through a relay on 127.0.0.1 that can
//! break the connection the way TCP breaks. Blocks are received straight
//! into the requester's arena extents and sent straight from the owners'
//! arenas, and the block CRC is checked by the transport, as in the agent.
//! The suite's header for a block is made from the fields the owner put
//! in its data header (sample, length, block CRC; the CRC is the suite's
//! own, same seed and polynomial), and the bytes are read back from the
//! requester's extent; every case also checks that the transport's CRC
//! verdict agrees with the suite's on every block.
//!
//! How the suite's faults map onto TCP (`docs/rdma.md` has the table):
//!
//! | suite fault | on TCP |
//! |---|---|
//! | corrupted block | the owner's copy of the block has a bit flipped after its CRC was taken; the requester's CRC check rejects it |
//! | peer loss mid-transfer | the owner's transport is dropped (its sockets close) after it took requests and began answering; its listener is gone |
//! | `RetryExceeded` | the relay goes silent both ways: the idle timeout ends the connection |
//! | `ReceiverNotReady` | the relay resets the connection (RST): TCP has no receiver-not-ready, its flow control only stalls the sender |
//! | `RemoteAccess` | the relay replaces the owner's next bytes with a forged record: the requester's channel rejects it (its tag fails) and closes |
//! | `Flushed` | the relay closes the connection (FIN) with requests in flight |
//!
//! In every case the requests in flight fail (`Lost`), the member is left
//! alone for `redial_after` (requests to it fail at once and go to the
//! store), then it is dialled again.

use super::net::{Claim, Event, GetFailure, Net, NetConfig, OutGet};
use granary_peer::block::{block_crc, block_crc_of};
use granary_peer::conn::ConnConfig;
use granary_peer::frame::{DataHeader, Get, MissReason};
use granary_peer::view::{Member, View};
use granary_rdma::conformance::{self, ErrorKind, Fault, Outcome, Ran, Transport};
use granary_shm::arena::Arena;
use std::collections::HashMap;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ARENA: u64 = 64 << 20;
const SECRET: &[u8] = b"conformance secret";
const JOB: &str = "conformance";
/// Idle timeout of every connection: the "transfer timeout" of TCP.
const IDLE: Duration = Duration::from_millis(400);
/// How long a member whose connection broke is left alone.
const REDIAL: Duration = Duration::from_millis(300);

/// What the relay does to the owner's next bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Break {
    Silence,
    Reset,
    Garble,
    Fin,
}

#[derive(Default)]
struct RelayState {
    armed: Option<Break>,
    fired: u32,
}

/// A relay on 127.0.0.1 between the requester and one owner.
struct Relay {
    addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    state: Arc<Mutex<RelayState>>,
    closed: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    fn start() -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("relay address");
        let target = Arc::new(Mutex::new(None));
        let state = Arc::new(Mutex::new(RelayState::default()));
        let closed = Arc::new(AtomicBool::new(false));
        let (t, s, c) = (Arc::clone(&target), Arc::clone(&state), Arc::clone(&closed));
        let accept = std::thread::spawn(move || {
            // The listener is dropped when the relay closes: dials are
            // refused from then on.
            while !c.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let Some(to) = *t.lock().unwrap() else {
                            continue;
                        };
                        match TcpStream::connect(to) {
                            Ok(up) => pump_pair(down, up, Arc::clone(&s), Arc::clone(&c)),
                            Err(_) => drop(down),
                        }
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Relay {
            addr,
            target,
            state,
            closed,
            accept: Some(accept),
        }
    }

    fn close(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.close();
    }
}

/// Starts the two directions of one relayed connection. `down` is the
/// requester's side, `up` the owner's.
fn pump_pair(
    down: TcpStream,
    up: TcpStream,
    state: Arc<Mutex<RelayState>>,
    closed: Arc<AtomicBool>,
) {
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let stop = Arc::new(AtomicBool::new(false));
    let silent = Arc::new(AtomicBool::new(false));
    let (d2, u2) = (
        down.try_clone().expect("clone"),
        up.try_clone().expect("clone"),
    );
    let flags = Flags {
        stop,
        silent,
        closed,
    };
    let f1 = flags.clone();
    // Requester to owner: plain copy.
    std::thread::spawn(move || pump(d2, u2, None, f1));
    // Owner to requester: where the breaks happen.
    std::thread::spawn(move || pump(up, down, Some(state), flags));
}

/// Shared by the two directions of one relayed connection.
#[derive(Clone)]
struct Flags {
    /// Both directions end.
    stop: Arc<AtomicBool>,
    /// Nothing passes either way any more; the sockets stay open.
    silent: Arc<AtomicBool>,
    /// The relay is closing.
    closed: Arc<AtomicBool>,
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    breaks: Option<Arc<Mutex<RelayState>>>,
    flags: Flags,
) {
    let Flags {
        stop,
        silent,
        closed,
    } = flags;
    let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
    let mut buf = vec![0u8; 64 * 1024];
    let mut reset = false;
    loop {
        if stop.load(Ordering::Relaxed) || closed.load(Ordering::Relaxed) {
            break;
        }
        let n = match from.read(&mut buf) {
            // A silenced connection passes on no FIN either.
            Ok(0) if silent.load(Ordering::Relaxed) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => continue,
            Err(_) => break,
        };
        if silent.load(Ordering::Relaxed) {
            continue;
        }
        let armed = breaks.as_ref().and_then(|b| {
            let mut st = b.lock().unwrap();
            let a = st.armed.take();
            if a.is_some() {
                st.fired += 1;
            }
            a
        });
        match armed {
            None => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Some(Break::Silence) => {
                // Nothing more passes either way, nothing is closed: the
                // requester's idle timeout ends the connection.
                silent.store(true, Ordering::Relaxed);
            }
            Some(Break::Reset) => {
                // SO_LINGER 0: the close sends RST, not FIN.
                let _ = nix::sys::socket::setsockopt(
                    &to.as_fd(),
                    nix::sys::socket::sockopt::Linger,
                    &libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    },
                );
                stop.store(true, Ordering::Relaxed);
                reset = true;
                break;
            }
            Some(Break::Garble) => {
                // A whole record that is not the owner's: the requester's
                // channel rejects it.
                let mut forged = vec![0u8, 32];
                forged.extend_from_slice(&[0xff; 32]);
                let _ = to.write_all(&forged);
                stop.store(true, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
                break;
            }
            Some(Break::Fin) => {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    if !reset {
        // A FIN; after a reset the last close sends the RST instead.
        let _ = to.shutdown(Shutdown::Write);
    }
    let _ = from.shutdown(Shutdown::Read);
}

/// One owner: its transport, arena and what it is sending.
struct Owner {
    net: Option<Net>,
    arena: Arena,
    next: u64,
    corrupt_next: bool,
    dying: bool,
}

/// The requester's view of one request.
struct Pending {
    sample: u64,
    offset: u64,
    len: u64,
}

/// The suite's [`Transport`] over [`Net`] on loopback.
struct TcpTransport {
    requester: Net,
    arena: Arena,
    next: u64,
    owners: Vec<Owner>,
    relays: Vec<Relay>,
    pending: HashMap<u64, Pending>,
    /// Requests refused before they were sent (the member is backing off).
    refused: Vec<Outcome>,
    /// What each owner put in the data header of a request it served:
    /// (sample, length, block CRC).
    headers: HashMap<u64, (u64, u64, u32)>,
    /// Connections lost while no fault was injected.
    unexpected_downs: u64,
    /// Why the requester's connections ended.
    downs: Vec<String>,
    faulted: bool,
    /// Blocks whose transport verdict (CRC) disagreed with the suite's.
    disagreements: u64,
    /// Blocks the transport rejected for their CRC.
    crc_rejects: u64,
    credit: u32,
}

fn conn_config(view: &View, me: &str, credit: u32) -> ConnConfig {
    let mut c = ConnConfig::new(JOB, me, view.digest().0, crate::sys::random_u64(), SECRET);
    c.initial_credit = credit;
    c.handshake_timeout = Duration::from_secs(2).as_nanos() as u64;
    c.idle_timeout = IDLE.as_nanos() as u64;
    c.keepalive = (IDLE / 4).as_nanos() as u64;
    c
}

fn net_config(view: &Arc<View>, me: usize, credit: u32) -> NetConfig {
    NetConfig {
        view: Arc::clone(view),
        me,
        conn: conn_config(view, &view.members()[me].id, credit),
        connect_timeout: Duration::from_secs(2),
        redial_after: REDIAL,
        settling: Duration::ZERO,
        source: None,
        limits: super::net::Limits::default(),
        rejected: Default::default(),
    }
}

fn bump(next: &mut u64, len: u64) -> u64 {
    if *next + len > ARENA {
        *next = 0;
    }
    let at = *next;
    *next += len.div_ceil(64) * 64;
    at
}

impl TcpTransport {
    fn new(owners: usize, credit: u32) -> TcpTransport {
        let relays: Vec<Relay> = (0..owners).map(|_| Relay::start()).collect();
        // Member 0 is the requester (never dialled here), 1.. the owners
        // behind their relays.
        let mut members = vec![Member::new("m0", "127.0.0.1:9", 1 << 30)];
        for (i, r) in relays.iter().enumerate() {
            members.push(Member::new(
                format!("m{}", i + 1),
                r.addr.to_string(),
                1 << 30,
            ));
        }
        let view = Arc::new(View::new(JOB, 1, members).expect("view"));
        let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
        let requester = Net::start(net_config(&view, 0, credit), any).expect("requester");
        let owners: Vec<Owner> = (0..owners)
            .map(|i| {
                let net = Net::start(net_config(&view, i + 1, credit), any).expect("owner");
                *relays[i].target.lock().unwrap() = Some(net.local_addr());
                Owner {
                    net: Some(net),
                    arena: Arena::heap(ARENA).expect("owner arena"),
                    next: 0,
                    corrupt_next: false,
                    dying: false,
                }
            })
            .collect();
        TcpTransport {
            requester,
            arena: Arena::heap(ARENA).expect("requester arena"),
            next: 0,
            owners,
            relays,
            pending: HashMap::new(),
            refused: Vec::new(),
            headers: HashMap::new(),
            unexpected_downs: 0,
            downs: Vec::new(),
            faulted: false,
            disagreements: 0,
            crc_rejects: 0,
            credit,
        }
    }

    /// Serves what reached the owners; returns whether anything happened.
    fn serve(&mut self) -> bool {
        let mut any = false;
        for o in &mut self.owners {
            let Some(net) = &o.net else { continue };
            let mut ev = Vec::new();
            net.drain(&mut ev);
            any |= !ev.is_empty();
            for e in ev {
                let Event::Request { conn, get } = e else {
                    continue;
                };
                let bytes = conformance::payload(get.sample);
                if get.fingerprint != conformance::FINGERPRINT || get.length != bytes.len() as u64 {
                    net.send_miss(conn, get, MissReason::NotKept);
                    continue;
                }
                let at = bump(&mut o.next, bytes.len() as u64);
                o.arena.write_at(at, &bytes).expect("stage the block");
                let crc = block_crc(conformance::FINGERPRINT, get.sample, &bytes);
                if std::mem::take(&mut o.corrupt_next) {
                    let mut b = o.arena.read_at(at, 1).expect("block byte");
                    b[0] ^= 0x10;
                    o.arena.write_at(at, &b).expect("flip a bit");
                }
                self.headers
                    .insert(get.request, (get.sample, get.length, crc));
                let src = o.arena.slice(at, bytes.len()).expect("source extent");
                net.send_block(conn, DataHeader::answering(&get, crc, 0), src);
            }
            if o.dying {
                // Dropping the transport closes its sockets and listener.
                o.net = None;
            }
        }
        any
    }

    fn delivered(&mut self, request: u64) -> Outcome {
        let p = self.pending.remove(&request).expect("a request we made");
        let bytes = self
            .arena
            .read_at(p.offset, p.len as usize)
            .expect("extent inside the arena");
        let (sample, len, crc) = self
            .headers
            .get(&request)
            .copied()
            .expect("served by an owner");
        let mut header = Vec::with_capacity(conformance::HEADER_LEN);
        header.extend_from_slice(&sample.to_le_bytes());
        header.extend_from_slice(&len.to_le_bytes());
        header.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(p.sample, sample);
        Outcome::Delivered {
            request,
            header,
            bytes,
        }
    }

    fn take(&mut self, out: &mut Vec<Outcome>) -> bool {
        let mut ev = Vec::new();
        self.requester.drain(&mut ev);
        let any = !ev.is_empty();
        for e in ev {
            // The transport reports what arrived; the block CRC is checked
            // as the agent's requester checks it (`Requester::data`).
            let e = match e {
                Event::Received {
                    request,
                    header,
                    crc32c,
                } if block_crc_of(
                    conformance::FINGERPRINT,
                    header.sample,
                    header.length,
                    crc32c,
                ) != header.crc =>
                {
                    Event::Failed {
                        request,
                        why: GetFailure::Corrupt,
                    }
                }
                e => e,
            };
            match e {
                Event::Received { request, .. } => {
                    let o = self.delivered(request);
                    if let Outcome::Delivered { header, bytes, .. } = &o {
                        let sample = self.headers[&request].0;
                        self.disagreements +=
                            u64::from(!conformance::verifies(sample, header, bytes));
                    }
                    out.push(o);
                }
                Event::Failed {
                    request,
                    why: GetFailure::Corrupt,
                } => {
                    self.crc_rejects += 1;
                    let o = self.delivered(request);
                    if let Outcome::Delivered { header, bytes, .. } = &o {
                        let sample = self.headers[&request].0;
                        self.disagreements +=
                            u64::from(conformance::verifies(sample, header, bytes));
                    }
                    out.push(o);
                }
                Event::Failed { request, .. } if self.pending.remove(&request).is_some() => {
                    out.push(Outcome::Fallback { request });
                }
                Event::Down { why, .. } => {
                    self.unexpected_downs += u64::from(!self.faulted);
                    self.downs.push(why);
                }
                _ => {}
            }
        }
        any
    }
}

impl Transport for TcpTransport {
    fn owners(&self) -> usize {
        self.owners.len()
    }

    fn credit_limit(&self) -> usize {
        self.credit as usize
    }

    fn get(&mut self, owner: usize, request: u64, sample: u64) {
        // As the engine routes: a member left alone after a failure gets
        // nothing (its samples come from the store).
        if !self.requester.reachable(owner + 1) {
            self.refused.push(Outcome::Fallback { request });
            return;
        }
        let len = conformance::sample_len(sample) as u64;
        let offset = bump(&mut self.next, len);
        let dest = self
            .arena
            .slice(offset, len as usize)
            .expect("extent inside the arena");
        self.pending.insert(
            request,
            Pending {
                sample,
                offset,
                len,
            },
        );
        self.requester.get(
            owner + 1,
            OutGet {
                get: Get {
                    request,
                    fingerprint: conformance::FINGERPRINT,
                    sample,
                    length: len,
                    due: self.requester.nanos() + 10_000_000_000,
                },
                dest,
                claim: Arc::new(Claim::default()),
            },
        );
    }

    fn step(&mut self, dt_ns: u64, out: &mut Vec<Outcome>) {
        // Real time: up to `dt_ns`, less once something happened.
        let until = Instant::now() + Duration::from_nanos(dt_ns);
        let long = dt_ns > 2_000_000;
        out.append(&mut self.refused);
        loop {
            let served = self.serve();
            let took = self.take(out);
            if Instant::now() >= until || ((served || took) && !long) {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn inject(&mut self, fault: Fault) -> bool {
        if matches!(
            fault,
            Fault::StrayWrite { .. } | Fault::StaleKeyWrite { .. }
        ) {
            // The transport receives a block only into the extent it asked
            // for: an owner has no way to aim elsewhere.
            return false;
        }
        self.faulted = true;
        match fault {
            Fault::CorruptNextBlock { owner } => self.owners[owner].corrupt_next = true,
            Fault::KillOwner { owner } => {
                self.owners[owner].dying = true;
                self.relays[owner].close();
            }
            Fault::ErrorCompletion { owner, kind } => {
                let b = match kind {
                    ErrorKind::RetryExceeded => Break::Silence,
                    ErrorKind::ReceiverNotReady => Break::Reset,
                    ErrorKind::RemoteAccess => Break::Garble,
                    ErrorKind::Flushed => Break::Fin,
                };
                self.relays[owner].state.lock().unwrap().armed = Some(b);
            }
            Fault::StrayWrite { .. } | Fault::StaleKeyWrite { .. } => unreachable!("refused above"),
        }
        true
    }

    fn flow_control_violations(&self) -> u64 {
        // TCP cannot overrun a receiver; a peer sending beyond its credit
        // is a protocol error that ends the connection.
        self.unexpected_downs
    }

    fn retry_after_ns(&self) -> u64 {
        REDIAL.as_nanos() as u64
    }

    fn transfer_timeout_ns(&self) -> u64 {
        IDLE.as_nanos() as u64
    }
}

#[test]
fn tcp_many_in_flight() {
    let mut t = TcpTransport::new(3, 64);
    let tally = conformance::many_in_flight(&mut t);
    assert!(tally.fallback.is_empty(), "{tally:?}");
    assert_eq!(t.disagreements, 0);
    assert_eq!(t.crc_rejects, 0);
}

#[test]
fn tcp_out_of_order_across_connections() {
    let mut reordered = 0;
    for _ in 0..3 {
        let mut t = TcpTransport::new(3, 64);
        reordered += u32::from(conformance::out_of_order(&mut t));
        assert_eq!(t.disagreements, 0);
    }
    assert!(reordered > 0, "connections complete independently");
}

#[test]
fn tcp_credits_exhausted() {
    for credit in [2u32, 3, 4, 7] {
        let mut t = TcpTransport::new(1, credit);
        conformance::credits_exhausted(&mut t);
        assert_eq!(t.disagreements, 0, "credit {credit}");
    }
}

#[test]
fn tcp_corrupted_block() {
    let mut t = TcpTransport::new(1, 64);
    assert_eq!(conformance::corrupted_block(&mut t), Ran::Yes);
    assert_eq!(t.crc_rejects, 1, "the transport's CRC check caught it");
    assert_eq!(t.disagreements, 0, "and agrees with the suite");
}

#[test]
fn tcp_peer_loss_mid_transfer() {
    let mut t = TcpTransport::new(2, 64);
    assert_eq!(conformance::peer_loss_mid_transfer(&mut t), Ran::Yes);
    assert!(!t.requester.is_up(1), "the lost owner's connection is gone");
    assert_eq!(t.disagreements, 0);
}

#[test]
fn tcp_each_error_completion() {
    for kind in ErrorKind::ALL {
        let mut t = TcpTransport::new(1, 64);
        assert_eq!(
            conformance::error_completion(&mut t, kind),
            Ran::Yes,
            "{kind:?}"
        );
        assert_eq!(
            t.relays[0].state.lock().unwrap().fired,
            1,
            "{kind:?} broke the connection once"
        );
        assert_eq!(t.disagreements, 0, "{kind:?}");
        // A write into a reset connection fails before the read sees the
        // reset ("closed here (ProtocolError)"); after a FIN the close can
        // race the same way.
        let want: &[&str] = match kind {
            ErrorKind::RetryExceeded => &["Timeout"],
            ErrorKind::ReceiverNotReady => &["reset", "closed here (ProtocolError)"],
            ErrorKind::RemoteAccess => &["authentication tag"],
            ErrorKind::Flushed => &["closed by the peer", "reset", "closed here (ProtocolError)"],
        };
        assert!(
            t.downs
                .first()
                .is_some_and(|w| want.iter().any(|x| w.contains(x))),
            "{kind:?} ends the connection with one of {want:?}: {:?}",
            t.downs
        );
    }
}

/// Drains `net`'s events until one matches, for at most 5 s.
fn wait_event(net: &Net, mut want: impl FnMut(&Event) -> bool) -> Event {
    let end = Instant::now() + Duration::from_secs(5);
    let mut ev = Vec::new();
    while Instant::now() < end {
        net.drain(&mut ev);
        if let Some(at) = ev.iter().position(&mut want) {
            return ev.swap_remove(at);
        }
        ev.clear();
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("no such event within 5 s");
}

#[test]
fn tcp_a_cancelled_request_reaches_its_owner_and_is_answered() {
    let t = TcpTransport::new(1, 2);
    let owner = t.owners[0].net.as_ref().expect("owner");
    let ask = |request: u64, sample: u64| {
        let len = conformance::payload(sample).len();
        let claim = Arc::new(Claim::default());
        let get = Get {
            request,
            fingerprint: conformance::FINGERPRINT,
            sample,
            length: len as u64,
            due: u64::MAX,
        };
        let dest = t.arena.slice(request * 65_536, len).expect("extent");
        t.requester.get(
            1,
            OutGet {
                get,
                dest,
                claim: Arc::clone(&claim),
            },
        );
        (get, claim)
    };
    let (get, claim) = ask(1, 5);
    let Event::Request { conn, get: seen } =
        wait_event(owner, |e| matches!(e, Event::Request { .. }))
    else {
        unreachable!()
    };
    assert_eq!(seen.request, get.request);
    // The requester reads the store instead (the hedge takes the claim)
    // and cancels; the owner hears of it on the same connection.
    assert!(claim.abandon());
    t.requester.cancel(1, get.request);
    let e = wait_event(owner, |e| matches!(e, Event::Cancel { .. }));
    assert!(
        matches!(e, Event::Cancel { conn: c, request: 1 } if c == conn),
        "{e:?}"
    );
    owner.send_miss(conn, seen, MissReason::Cancelled);
    let e = wait_event(&t.requester, |e| matches!(e, Event::Failed { .. }));
    assert!(
        matches!(
            e,
            Event::Failed {
                request: 1,
                why: GetFailure::Miss(MissReason::Cancelled)
            }
        ),
        "{e:?}"
    );
    // The miss returned the credit: with a credit of two, two more
    // requests go out. A cancel of a request that is not in flight on
    // the connection sends nothing.
    t.requester.cancel(1, 77);
    let (g2, _) = ask(2, 6);
    let (g3, _) = ask(3, 7);
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while seen.len() < 2 && Instant::now() < end {
        let mut ev = Vec::new();
        owner.drain(&mut ev);
        for e in ev {
            match e {
                Event::Request { get, .. } => seen.push(get.request),
                Event::Cancel { .. } => panic!("a cancel nobody sent: {e:?}"),
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(seen, [g2.request, g3.request], "the credit came back");
}
