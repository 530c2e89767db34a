//! The floods of `bench/run attacks`, each as an outside process would
//! run it against an agent's peer listener until told to stop: thousands
//! of silent connections, authenticated connections that never read, an
//! "owner" that trickles its blocks, pings on a connection that is never
//! read, and one request id sent over and over. Each returns what it did
//! and what it got back.

use crate::peer_client::{self, Answer, PeerClient};
use granary_peer::conn::ConnConfig;
use granary_peer::frame::{DataHeader, Get};
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A receive buffer small enough that a peer that never reads stops the
/// sender after a few kilobytes (the kernel doubles it and keeps a floor).
pub const TINY_RCVBUF: usize = 4096;

/// Raises this process's soft limit on open files to its hard limit;
/// returns the limit in force.
pub fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    r.rlim_cur = r.rlim_max;
    // SAFETY: setrlimit reads the struct we own; a failure leaves the limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        // SAFETY: as above.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    }
    r.rlim_cur
}

/// What the connection flood did.
#[derive(Debug, Default, Clone)]
pub struct ConnFlood {
    /// Connections started.
    pub opened: u64,
    /// Connects that failed at once (out of ports or descriptors).
    pub failed: u64,
    /// Connections the agent closed (end of stream or reset).
    pub closed_by_agent: u64,
    /// Bytes the agent sent on them.
    pub received: u64,
    /// Connections still open at the end.
    pub open_at_end: u64,
    /// Most connections held open at once.
    pub peak_open: u64,
    /// Time to start the first `total` connections.
    pub open_time: Duration,
}

/// `count` connections to `to`, spread over the source IPs
/// `127.0.1.1 ..= 127.0.1.ips`, started as fast as possible and held open
/// and silent until `stop`. With `refill`, each one the agent closes is
/// replaced at once, so `count` stay attempted the whole time.
pub fn conn_flood(
    to: SocketAddr,
    count: u64,
    ips: u8,
    refill: bool,
    stop: &AtomicBool,
) -> ConnFlood {
    let mut f = ConnFlood::default();
    let ips = ips.max(1);
    let src = |i: u64| IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + (i % u64::from(ips)) as u8));
    let mut held: Vec<TcpStream> = Vec::with_capacity(count as usize);
    let start = Instant::now();
    let mut next = 0u64;
    // Starts the next connection, from the next source IP.
    let open = |f: &mut ConnFlood, held: &mut Vec<TcpStream>, next: &mut u64| {
        match peer_client::connect(to, Some(src(*next)), None, true) {
            Ok(s) => {
                held.push(s);
                f.opened += 1;
            }
            Err(_) => f.failed += 1,
        }
        *next += 1;
    };
    for _ in 0..count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        open(&mut f, &mut held, &mut next);
    }
    f.open_time = start.elapsed();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let mut keep = Vec::with_capacity(held.len());
        let mut lost = 0;
        for s in held.drain(..) {
            match s.peek(&mut buf) {
                Ok(0) => lost += 1,
                Ok(_) => {
                    // Take what came, count it, keep holding.
                    let n = (&s).read(&mut buf).unwrap_or(0);
                    f.received += n as u64;
                    keep.push(s);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::NotConnected =>
                {
                    keep.push(s)
                }
                Err(_) => lost += 1,
            }
        }
        held = keep;
        f.closed_by_agent += lost;
        f.peak_open = f.peak_open.max(held.len() as u64);
        if refill {
            for _ in 0..lost {
                open(&mut f, &mut held, &mut next);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f.open_at_end = held.len() as u64;
    f
}

/// What the connections that never read did.
#[derive(Debug, Default, Clone)]
pub struct NonReaders {
    /// Connections authenticated.
    pub connections: u64,
    /// Gets sent on them.
    pub gets: u64,
    /// Connections found closed by the agent (a write failed).
    pub closed_by_agent: u64,
    /// Dials that failed.
    pub failed_dials: u64,
}

/// `n` authenticated connections from `from` (the attacker holds the job
/// secret and a member's id, `cfg`) that each ask for every credit's worth
/// of `kept` samples and never read a byte again; a closed one is
/// replaced.
pub fn non_readers(
    to: SocketAddr,
    from: IpAddr,
    cfg: &ConnConfig,
    n: usize,
    kept: &[Get],
    stop: &AtomicBool,
) -> NonReaders {
    let mut f = NonReaders::default();
    // A ping every half second finds the connections the agent closed.
    let mut cfg = cfg.clone();
    cfg.keepalive = 500_000_000;
    let mut conns: Vec<PeerClient> = Vec::new();
    let mut next_id = 1u64 << 40;
    let mut cycle = 0usize;
    while !stop.load(Ordering::Relaxed) {
        while conns.len() < n && !stop.load(Ordering::Relaxed) {
            let mut c = match PeerClient::dial(
                to,
                Some(from),
                Some(TINY_RCVBUF),
                cfg.clone(),
                Duration::from_secs(5),
            ) {
                Ok(c) => c,
                Err(_) => {
                    f.failed_dials += 1;
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            f.connections += 1;
            let now = c.now();
            while c.conn().credit() > 0 && !kept.is_empty() {
                let g = Get {
                    request: next_id,
                    due: now + 10_000_000_000,
                    ..kept[cycle % kept.len()]
                };
                next_id += 1;
                cycle += 1;
                if c.conn().send_get(g, now).is_err() {
                    break;
                }
                f.gets += 1;
            }
            if c.flush().is_err() {
                f.closed_by_agent += 1;
                continue;
            }
            conns.push(c);
        }
        let mut i = 0;
        while i < conns.len() {
            let c = &mut conns[i];
            let now = c.now();
            c.conn().handle_timeout(now);
            if c.flush().is_err() || c.conn().is_closed() {
                f.closed_by_agent += 1;
                conns.swap_remove(i);
            } else {
                i += 1;
            }
        }
        sleep_until_stop(stop, Duration::from_secs(1));
    }
    f
}

/// What the trickling owner did.
#[derive(Debug, Default, Clone)]
pub struct Trickle {
    /// Connections the agent opened to it (as to the member it plays).
    pub connections: u64,
    /// Requests it received.
    pub requests: u64,
    /// Blocks it began to trickle.
    pub blocks: u64,
    /// Payload bytes it trickled.
    pub bytes: u64,
    /// Per trickled block: from its header to the agent closing the
    /// connection.
    pub abandoned_after: Vec<Duration>,
}

/// Plays the member the agent's view points at `listener`: answers the
/// first request of each connection with a block whose payload it sends
/// one byte every `every` (the bytes right, from `content`), leaves the
/// other requests unanswered, and notes when the agent gives up.
pub fn trickle_owner(
    listener: &TcpListener,
    cfg: &ConnConfig,
    fingerprint: u64,
    content: &dyn Fn(u64) -> Vec<u8>,
    every: Duration,
    stop: &AtomicBool,
) -> Trickle {
    let mut f = Trickle::default();
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let Ok(mut c) = PeerClient::accept(stream, cfg.clone()) else {
            continue;
        };
        f.connections += 1;
        // The block being trickled: header, its bytes, bytes sent, when
        // the header went, when the next byte goes.
        let mut block: Option<(DataHeader, Vec<u8>, usize, Instant, Instant)> = None;
        while !stop.load(Ordering::Relaxed) && c.closed.is_none() {
            let _ = c.read_some(Duration::from_millis(50));
            while let Some(e) = c.conn().poll_event() {
                if let granary_peer::conn::Event::Request(g) = e {
                    f.requests += 1;
                    if block.is_some() {
                        continue;
                    }
                    let bytes = content(g.sample);
                    let h = DataHeader {
                        request: g.request,
                        sample: g.sample,
                        length: g.length,
                        crc: granary_peer::block::block_crc(fingerprint, g.sample, &bytes),
                        store_wait_us: 0,
                    };
                    if c.conn().send_data(h).is_ok() {
                        f.blocks += 1;
                        let now = Instant::now();
                        block = Some((h, bytes, 0, now, now));
                    }
                }
            }
            // The header goes out with the first byte.
            match c.flush() {
                Ok(_) => {}
                Err(_) => break,
            }
            if let Some((h, bytes, sent, _, next)) = block.as_mut() {
                if Instant::now() >= *next && (*sent as u64) < h.length {
                    let mut out = Vec::new();
                    let at = *sent;
                    let ok = c
                        .conn()
                        .seal_payload(1, &mut out, |_, dst| dst[0] = bytes[at])
                        .is_ok();
                    if !ok || c.write_raw(&out).is_err() {
                        break;
                    }
                    *sent += 1;
                    f.bytes += 1;
                    *next += every;
                }
            }
        }
        if let Some((_, _, _, header_at, _)) = block {
            if c.closed.is_some() {
                f.abandoned_after.push(header_at.elapsed());
            }
        }
    }
    f
}

/// What the ping flood did.
#[derive(Debug, Default, Clone)]
pub struct Pings {
    /// Pings written.
    pub pings: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Connections authenticated (a closed one is replaced).
    pub connections: u64,
}

/// An authenticated connection (`cfg`: the job secret and a member's id)
/// that writes pings as fast as it can and never reads the pongs.
pub fn ping_flood(to: SocketAddr, from: IpAddr, cfg: &ConnConfig, stop: &AtomicBool) -> Pings {
    let mut f = Pings::default();
    let mut cfg = cfg.clone();
    // A ping on every call: keepalive after 1 ns without sending.
    cfg.keepalive = 1;
    cfg.idle_timeout = 3_600_000_000_000;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = PeerClient::dial(
            to,
            Some(from),
            Some(TINY_RCVBUF),
            cfg.clone(),
            Duration::from_secs(5),
        ) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        f.connections += 1;
        let mut t = c.now();
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..256 {
                t += 1;
                c.conn().handle_timeout(t);
                f.pings += 1;
            }
            let before = c.sent;
            let r = c.flush();
            f.bytes += c.sent - before;
            if r.is_err() || c.conn().is_closed() {
                break;
            }
        }
    }
    f
}

/// What the reused request id did.
#[derive(Debug, Default, Clone)]
pub struct Reuse {
    /// Gets sent, all with one request id.
    pub gets: u64,
    /// Answers read (blocks and misses).
    pub answers: u64,
    /// Blocks among them.
    pub blocks: u64,
}

/// An authenticated connection that asks for `sample` over and over with
/// one request id, reading the answers (so that credit keeps coming).
pub fn reuse_request_id(
    to: SocketAddr,
    from: IpAddr,
    cfg: &ConnConfig,
    get: Get,
    fingerprint: u64,
    stop: &AtomicBool,
) -> io::Result<Reuse> {
    let mut f = Reuse::default();
    let mut c = PeerClient::dial(to, Some(from), None, cfg.clone(), Duration::from_secs(5))?;
    while !stop.load(Ordering::Relaxed) && c.closed.is_none() {
        let now = c.now();
        while c.conn().credit() > 0 {
            let g = Get {
                due: now + 10_000_000_000,
                ..get
            };
            if c.conn().send_get(g, now).is_err() {
                break;
            }
            f.gets += 1;
        }
        c.flush()?;
        c.read_some(Duration::from_millis(5))?;
        for a in c.answers(fingerprint) {
            f.answers += 1;
            if matches!(a, Answer::Block { .. }) {
                f.blocks += 1;
            }
        }
    }
    Ok(f)
}

/// Sleeps up to `d`, waking early when `stop` is set.
pub fn sleep_until_stop(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
}
