//! The metrics HTTP endpoint: `GET /metrics` served from a thread of its
//! own that reads the engine's state only through the lock-free metric
//! handles of [`Metrics`]; with a [`Health`], `GET /ready` and `GET /live`
//! too (`200` or `503` with the reason, `metrics/health.rs`).
//!
//! Every client costs bounded memory and bounded time: its request head is
//! read into a fixed [`MAX_REQUEST_HEAD`] buffer (a longer head gets `431`),
//! the whole exchange must end within [`REQUEST_DEADLINE`] of the
//! connection (a slow or silent client is dropped), at most
//! [`MAX_CLIENTS`] are served at once (a new connection evicts the oldest),
//! and the clients are multiplexed with `poll(2)`, so one slow client never
//! delays another's scrape.

use super::{Health, Metrics};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The longest request head the endpoint reads (request line and headers).
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// How long one client may take, from its connection to the last byte of
/// the answer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// Clients served at once; one more evicts the oldest.
pub const MAX_CLIENTS: usize = 64;

/// Bytes a client may still send after its answer (they are read and
/// dropped so that closing does not reset the answer away).
const DRAIN_LIMIT: usize = 64 * 1024;

/// How often the thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A running metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `addr` from a background thread.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<MetricsServer> {
        Self::start_with_health(addr, metrics, None)
    }

    /// Serves `GET /metrics`, and with `health` `GET /ready` and `GET
    /// /live`, on `addr` from a background thread.
    pub fn start_with_health(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        health: Option<Arc<Health>>,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("granary-metrics".into())
            .spawn(move || Endpoint::new(listener, metrics, health).run(&stop2))?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a client is in its exchange.
enum Phase {
    /// Reading the request head: `len` bytes of the buffer so far.
    Head { buf: Box<[u8]>, len: usize },
    /// Writing the answer: `sent` bytes of it so far.
    Answer { out: Vec<u8>, sent: usize },
    /// Answer written and the write side shut: reading and dropping what
    /// the client still sends, until it closes.
    Drain { dropped: usize },
}

struct Client {
    stream: TcpStream,
    phase: Phase,
    deadline: Instant,
}

/// What one step of a client left to do.
enum Step {
    Keep,
    Close,
}

struct Endpoint {
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Option<Arc<Health>>,
    clients: Vec<Client>,
}

impl Endpoint {
    fn new(listener: TcpListener, metrics: Arc<Metrics>, health: Option<Arc<Health>>) -> Endpoint {
        Endpoint {
            listener,
            metrics,
            health,
            clients: Vec::new(),
        }
    }

    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            self.clients.retain(|c| c.deadline > now);
            let wait = self
                .clients
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(STOP_POLL)
                .min(STOP_POLL);
            let mut fds = Vec::with_capacity(self.clients.len() + 1);
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
            for c in &self.clients {
                let events = match c.phase {
                    Phase::Answer { .. } => PollFlags::POLLOUT,
                    _ => PollFlags::POLLIN,
                };
                fds.push(PollFd::new(c.stream.as_fd(), events));
            }
            let timeout = PollTimeout::try_from(wait.max(Duration::from_millis(1)))
                .unwrap_or(PollTimeout::MAX);
            if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
                continue;
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(fds);
            // Clients from the last, so that removing one (swapped with the
            // last) never moves a client that has not had its turn.
            for i in (0..self.clients.len()).rev() {
                if ready[i + 1] {
                    if let Step::Close = self.step(i) {
                        self.clients.swap_remove(i);
                    }
                }
            }
            if ready[0] {
                self.accept();
            }
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if self.clients.len() >= MAX_CLIENTS {
                        // The oldest connection is the one least likely to
                        // be an honest scrape (those finish in milliseconds).
                        let oldest = self
                            .clients
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, c)| c.deadline)
                            .map(|(i, _)| i)
                            .unwrap_or(0);
                        self.clients.swap_remove(oldest);
                    }
                    self.clients.push(Client {
                        stream,
                        phase: Phase::Head {
                            buf: vec![0; MAX_REQUEST_HEAD].into_boxed_slice(),
                            len: 0,
                        },
                        deadline: Instant::now() + REQUEST_DEADLINE,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Moves client `i` as far as its socket allows without blocking.
    fn step(&mut self, i: usize) -> Step {
        let metrics = &self.metrics;
        let health = self.health.as_deref();
        let c = &mut self.clients[i];
        loop {
            match &mut c.phase {
                Phase::Head { buf, len } => {
                    if *len == buf.len() {
                        c.phase = answer(too_large());
                        continue;
                    }
                    match c.stream.read(&mut buf[*len..]) {
                        Ok(0) if *len == 0 => return Step::Close,
                        Ok(0) => {
                            c.phase = answer(route(&buf[..*len], metrics, health));
                        }
                        Ok(n) => {
                            let before = len.saturating_sub(3);
                            *len += n;
                            if head_ends(&buf[before..*len]) {
                                c.phase = answer(route(&buf[..*len], metrics, health));
                            }
                        }
                        Err(e) => return would_block(e),
                    }
                }
                Phase::Answer { out, sent } => match c.stream.write(&out[*sent..]) {
                    Ok(0) => return Step::Close,
                    Ok(n) => {
                        *sent += n;
                        if *sent == out.len() {
                            if c.stream.shutdown(Shutdown::Write).is_err() {
                                return Step::Close;
                            }
                            c.phase = Phase::Drain { dropped: 0 };
                        }
                    }
                    Err(e) => return would_block(e),
                },
                Phase::Drain { dropped } => {
                    let mut sink = [0u8; 4096];
                    match c.stream.read(&mut sink) {
                        Ok(0) => return Step::Close,
                        Ok(n) => {
                            *dropped += n;
                            if *dropped > DRAIN_LIMIT {
                                return Step::Close;
                            }
                        }
                        Err(e) => return would_block(e),
                    }
                }
            }
        }
    }
}

fn would_block(e: io::Error) -> Step {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Step::Keep,
        _ => Step::Close,
    }
}

/// Whether `tail` (the new bytes and the three before them) holds the
/// blank line that ends a request head.
fn head_ends(tail: &[u8]) -> bool {
    tail.windows(4).any(|w| w == b"\r\n\r\n") || tail.windows(2).any(|w| w == b"\n\n")
}

/// The answer to a request head.
fn route(
    head: &[u8],
    metrics: &Metrics,
    health: Option<&Health>,
) -> (&'static str, &'static str, String) {
    let end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = String::from_utf8_lossy(&head[..end]);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let probe = match (method, path, health) {
        ("GET", "/ready", Some(h)) => Some(h.ready(Instant::now()).map(|()| "ready\n")),
        ("GET", "/live", Some(h)) => Some(h.live(Instant::now()).map(|()| "live\n")),
        _ => None,
    };
    if let Some(answer) = probe {
        return match answer {
            Ok(body) => ("200 OK", "text/plain", body.to_string()),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        };
    }
    if method == "GET" && (path == "/metrics" || path == "/") {
        ("200 OK", CONTENT_TYPE, metrics.render())
    } else {
        (
            "404 Not Found",
            "text/plain",
            "not found: try GET /metrics\n".to_string(),
        )
    }
}

fn too_large() -> (&'static str, &'static str, String) {
    (
        "431 Request Header Fields Too Large",
        "text/plain",
        "request head over 8 KiB\n".to_string(),
    )
}

fn answer((status, ctype, body): (&str, &str, String)) -> Phase {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    Phase::Answer { out, sent: 0 }
}

/// Fetches `/metrics` from a running agent (used by `granary status`).
pub fn scrape(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    match resp.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(io::Error::other("metrics endpoint answered with an error")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape, checked to answer within half a second.
    fn prompt_scrape(addr: SocketAddr) -> String {
        let t0 = Instant::now();
        let body = scrape(addr, Duration::from_secs(5)).unwrap();
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
        body
    }

    #[test]
    fn an_oversized_request_head_gets_431_and_the_endpoint_still_serves() {
        let m = Arc::new(Metrics::default());
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let junk = vec![b'a'; 64 * 1024];
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX: ");
        let _ = s.write_all(&junk);
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(b"POST /x HTTP/1.1\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    }

    /// The status line and body of `GET path` at `addr`.
    fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp.lines().next().unwrap_or_default().to_string();
        let body = resp
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }

    #[test]
    fn ready_and_live_follow_the_engine_and_exist_only_with_a_health() {
        let m = Arc::new(Metrics::default());
        let h = Arc::new(Health::default());
        let srv = MetricsServer::start_with_health(
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&m),
            Some(Arc::clone(&h)),
        )
        .unwrap();
        let (status, body) = get(srv.addr(), "/ready");
        assert!(status.starts_with("HTTP/1.1 503"), "{status}");
        assert!(body.contains("starting"), "{body}");
        assert!(get(srv.addr(), "/live").0.starts_with("HTTP/1.1 200"));
        h.serving();
        assert_eq!(
            get(srv.addr(), "/ready"),
            ("HTTP/1.1 200 OK".into(), "ready\n".into())
        );
        assert!(get(srv.addr(), "/metrics").0.starts_with("HTTP/1.1 200"));
        // Without a health the paths do not exist.
        let plain = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        assert!(get(plain.addr(), "/ready").0.starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn silent_and_slow_clients_neither_delay_scrapes_nor_outlive_the_deadline() {
        let m = Arc::new(Metrics::default());
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        // Silent clients and one that sends a byte now and then.
        let idle: Vec<TcpStream> = (0..8)
            .map(|_| TcpStream::connect(srv.addr()).unwrap())
            .collect();
        let mut slow = TcpStream::connect(srv.addr()).unwrap();
        slow.write_all(b"GET /metr").unwrap();
        for _ in 0..5 {
            let body = prompt_scrape(srv.addr());
            assert!(body.contains("granary_samples_served_total 0"), "{body}");
            let _ = slow.write_all(b"i");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Past the deadline the slow client has been dropped: its socket
        // reads the end (or a reset), not an answer.
        std::thread::sleep(REQUEST_DEADLINE + Duration::from_millis(300));
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
        drop(idle);
    }

    #[test]
    fn more_clients_than_the_cap_evict_the_oldest_and_a_scrape_still_answers() {
        let m = Arc::new(Metrics::default());
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        let idle: Vec<TcpStream> = (0..MAX_CLIENTS + 16)
            .map(|_| TcpStream::connect(srv.addr()).unwrap())
            .collect();
        let body = prompt_scrape(srv.addr());
        assert!(body.ends_with("# EOF\n"), "{body}");
        // The first connections were evicted: they read the end at once.
        let mut first = &idle[0];
        first
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut b = [0u8; 1];
        let got = first.read(&mut b);
        assert!(
            matches!(got, Ok(0))
                || got
                    .as_ref()
                    .is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset),
            "{got:?}"
        );
    }
}
