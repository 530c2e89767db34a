//! A peer of the job written from the outside, as an attacker would: the
//! sans-IO [`Conn`] of `granary-peer` over a blocking std [`TcpStream`],
//! dialled from a chosen source IP with a chosen receive buffer, or
//! accepted on a listener of its own (to play a member the view points
//! at). Used by `bench/run attacks`, both for the attacks that hold the
//! job secret and for the legitimate peer whose service they must not
//! stop.

use granary_peer::block::block_crc;
use granary_peer::conn::{Closed, Conn, ConnConfig, Event, Nanos, Transmit};
use granary_peer::frame::{DataHeader, Get, MissReason};
use socket2::{Domain, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Connects to `to` from `from` (port chosen by the kernel) with a receive
/// buffer of `rcvbuf` bytes when given (set before the connection, so the
/// window it advertises stays that small). With `nonblocking` the connect
/// is only started: the stream is returned at once, non-blocking.
pub fn connect(
    to: SocketAddr,
    from: Option<IpAddr>,
    rcvbuf: Option<usize>,
    nonblocking: bool,
) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    if let Some(ip) = from {
        s.bind(&SocketAddr::new(ip, 0).into())?;
    }
    if nonblocking {
        s.set_nonblocking(true)?;
    }
    match s.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if nonblocking && e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(s.into())
}

/// 32 bytes from the kernel's random number generator.
pub fn entropy() -> [u8; 32] {
    let mut b = [0u8; 32];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if ok.is_err() {
        // Never expected; a fixed key would still complete a handshake.
        let t = Instant::now().elapsed().as_nanos() as u64 ^ u64::from(std::process::id());
        b[..8].copy_from_slice(&t.to_le_bytes());
    }
    b
}

/// One connection of a peer client.
pub struct PeerClient {
    stream: TcpStream,
    conn: Conn,
    origin: Instant,
    buf: Vec<u8>,
    /// Wire bytes received so far.
    pub received: u64,
    /// Wire bytes written so far.
    pub sent: u64,
    /// Why the connection ended, once it did.
    pub closed: Option<String>,
    /// The block being received: its header and bytes so far.
    landing: Option<(DataHeader, Vec<u8>)>,
}

/// What [`PeerClient::fetch`] brought.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Blocks received: sample, payload, whether the block CRC matched.
    pub blocks: Vec<(u64, Vec<u8>, bool)>,
    /// Misses: sample, reason.
    pub misses: Vec<(u64, MissReason)>,
    /// From the call to the first block's last byte.
    pub first_block: Option<Duration>,
    /// Why the connection ended, if it did.
    pub closed: Option<String>,
}

impl PeerClient {
    /// Dials `to` (from `from`, with receive buffer `rcvbuf`) with `cfg`,
    /// and waits up to `timeout` for the channel and the other side's
    /// first credit.
    pub fn dial(
        to: SocketAddr,
        from: Option<IpAddr>,
        rcvbuf: Option<usize>,
        cfg: ConnConfig,
        timeout: Duration,
    ) -> io::Result<PeerClient> {
        let stream = connect(to, from, rcvbuf, false)?;
        let conn = Conn::dial(cfg, entropy(), 0).map_err(|e| io::Error::other(e.to_string()))?;
        let mut c = PeerClient::over(stream, conn);
        c.flush()?;
        let end = Instant::now() + timeout;
        while c.conn.credit() == 0 {
            if let Some(why) = &c.closed {
                return Err(io::Error::other(format!("closed before credit: {why}")));
            }
            if Instant::now() >= end {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no channel and credit in time",
                ));
            }
            c.read_some(Duration::from_millis(50))?;
            c.drain_events();
            c.flush()?;
        }
        Ok(c)
    }

    /// The listener's side on an accepted `stream` (nothing is sent until
    /// the dialer's first message authenticates).
    pub fn accept(stream: TcpStream, cfg: ConnConfig) -> io::Result<PeerClient> {
        let conn = Conn::accept(cfg, entropy(), 0).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(PeerClient::over(stream, conn))
    }

    fn over(stream: TcpStream, conn: Conn) -> PeerClient {
        let _ = stream.set_nodelay(true);
        PeerClient {
            stream,
            conn,
            origin: Instant::now(),
            buf: vec![0u8; 256 * 1024],
            received: 0,
            sent: 0,
            closed: None,
            landing: None,
        }
    }

    /// The state machine.
    pub fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The socket.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Nanoseconds on this client's clock.
    pub fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// Writes whatever the connection queued. Stops at a payload to send
    /// and returns its header: the caller seals it ([`Conn::seal_payload`])
    /// and writes it with [`PeerClient::write_raw`].
    pub fn flush(&mut self) -> io::Result<Option<DataHeader>> {
        while let Some(t) = self.conn.poll_transmit() {
            match t {
                Transmit::Bytes(b) => self.write_raw(&b)?,
                Transmit::Payload(h) => return Ok(Some(h)),
            }
        }
        Ok(None)
    }

    /// Writes `bytes` as they are.
    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.sent += bytes.len() as u64;
        Ok(())
    }

    /// Reads once, waiting up to `wait`; feeds what came to the
    /// connection. Returns the bytes read (0 on a timeout or at the end;
    /// the end sets [`PeerClient::closed`]).
    pub fn read_some(&mut self, wait: Duration) -> io::Result<usize> {
        if self.closed.is_some() {
            return Ok(0);
        }
        self.stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        match self.stream.read(&mut self.buf) {
            Ok(0) => {
                self.closed = Some("end of stream".into());
                Ok(0)
            }
            Ok(n) => {
                self.received += n as u64;
                let now = self.now();
                self.conn.handle_input(&self.buf[..n], now);
                Ok(n)
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                let now = self.now();
                self.conn.handle_timeout(now);
                Ok(0)
            }
            Err(e) => {
                self.closed = Some(format!("read: {e}"));
                Ok(0)
            }
        }
    }

    /// Drops the events that need no answer; notes a close.
    fn drain_events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            if let Event::Closed(c) = e {
                self.closed = Some(closed_text(&c));
            }
        }
    }

    /// The next event, reading for up to `wait` when none is queued.
    pub fn next_event(&mut self, wait: Duration) -> io::Result<Option<Event>> {
        if let Some(e) = self.conn.poll_event() {
            return Ok(Some(self.note(e)));
        }
        self.read_some(wait)?;
        self.flush()?;
        Ok(self.conn.poll_event().map(|e| self.note(e)))
    }

    fn note(&mut self, e: Event) -> Event {
        if let Event::Closed(c) = &e {
            self.closed = Some(closed_text(c));
        }
        e
    }

    /// Takes apart what was received so far: blocks (their CRC checked
    /// against `fingerprint`) and misses; other events are dropped, a close
    /// is noted. A block whose payload is still on its way stays here
    /// until it is whole.
    pub fn answers(&mut self, fingerprint: u64) -> Vec<Answer> {
        let mut out = Vec::new();
        loop {
            if let Some((h, bytes)) = self.landing.as_mut() {
                while let Some(p) = self.conn.payload() {
                    bytes.extend_from_slice(p);
                }
                if self.conn.payload_remaining() > 0 {
                    return out;
                }
                let crc_ok = block_crc(fingerprint, h.sample, bytes) == h.crc;
                let (h, bytes) = self.landing.take().expect("set");
                out.push(Answer::Block {
                    sample: h.sample,
                    bytes,
                    crc_ok,
                });
            }
            let Some(e) = self.conn.poll_event() else {
                return out;
            };
            match e {
                Event::Data(h) => self.landing = Some((h, Vec::with_capacity(h.length as usize))),
                Event::Miss { sample, reason, .. } => out.push(Answer::Miss { sample, reason }),
                Event::Closed(c) => self.closed = Some(closed_text(&c)),
                _ => {}
            }
        }
    }

    /// Asks for `gets` (their `due` is time left from now) as credit
    /// allows, and collects the answers until all came, the connection
    /// ended, or `timeout` passed. Each block's CRC is checked against
    /// `fingerprint`.
    pub fn fetch(&mut self, fingerprint: u64, gets: &[Get], timeout: Duration) -> Fetched {
        let start = Instant::now();
        let end = start + timeout;
        let mut out = Fetched::default();
        let mut next = 0;
        let mut answered = 0;
        while answered < gets.len() && Instant::now() < end && self.closed.is_none() {
            let now = self.now();
            while next < gets.len() && self.conn.credit() > 0 {
                let g = Get {
                    due: now + gets[next].due,
                    ..gets[next]
                };
                if self.conn.send_get(g, now).is_err() {
                    break;
                }
                next += 1;
            }
            if let Err(e) = self.flush() {
                self.closed = Some(format!("write: {e}"));
                break;
            }
            if let Err(e) = self.read_some(Duration::from_millis(20)) {
                self.closed = Some(format!("read: {e}"));
                break;
            }
            for a in self.answers(fingerprint) {
                answered += 1;
                match a {
                    Answer::Block {
                        sample,
                        bytes,
                        crc_ok,
                    } => {
                        out.blocks.push((sample, bytes, crc_ok));
                        out.first_block.get_or_insert_with(|| start.elapsed());
                    }
                    Answer::Miss { sample, reason } => out.misses.push((sample, reason)),
                }
            }
        }
        out.closed.clone_from(&self.closed);
        out
    }
}

/// An answer to a get.
#[derive(Debug)]
pub enum Answer {
    /// A whole block.
    Block {
        /// Sample.
        sample: u64,
        /// Its payload.
        bytes: Vec<u8>,
        /// Whether its block CRC matched.
        crc_ok: bool,
    },
    /// A miss.
    Miss {
        /// Sample.
        sample: u64,
        /// Why.
        reason: MissReason,
    },
}

/// A connection's end in words.
pub fn closed_text(c: &Closed) -> String {
    match c {
        Closed::Local(r) => format!("closed here ({r:?})"),
        Closed::Remote(r) => format!("closed by the other side ({r:?})"),
        Closed::Malformed(e) => format!("malformed: {e}"),
        Closed::Channel(e) => format!("channel: {e}"),
    }
}

/// What a stranger got from one connection: bytes sent back, whether and
/// when the other side closed it.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Bytes the stranger received.
    pub received: Vec<u8>,
    /// The other side closed (end of stream or reset) within the wait.
    pub closed: bool,
    /// When, from the connection.
    pub closed_after: Option<Duration>,
}

/// Connects to `to` from `from`, writes `bytes` (a failed write is not an
/// error: the other side may have closed already), and reads until the
/// other side closes or `wait` passes.
pub fn stranger(
    to: SocketAddr,
    from: Option<IpAddr>,
    bytes: &[u8],
    wait: Duration,
) -> io::Result<Probe> {
    let mut s = connect(to, from, None, false)?;
    let start = Instant::now();
    let _ = s.write_all(bytes);
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let end = start + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Probe {
                received,
                closed: false,
                closed_after: None,
            });
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
            }
            Err(_) => break,
        }
    }
    Ok(Probe {
        received,
        closed: true,
        closed_after: Some(start.elapsed()),
    })
}
