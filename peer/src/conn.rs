//! One peer connection as a state machine: bytes in, events and bytes out,
//! the clock passed in.
//!
//! ```text
//!   dial()   ── preamble + message 1 ──▶ AwaitMessage2 ── message 2 ok ──┐
//!   accept() ── AwaitPreamble ── preamble, message 1 ok, message 2 ──────┤
//!                  │                                                     ▼
//!                  │ bad preamble, wrong secret, timeout          hellos agree?
//!                  ▼                                               │         │
//!               Closed ◀─── goodbye, bad record, timeout ─── Established   no: goodbye
//!                                                            (requests, data,
//!                                                             misses, credit,
//!                                                             ping/pong)
//! ```
//!
//! # Channel
//!
//! Every byte goes through [`crate::channel`]: the dialer sends the
//! preamble and Noise message 1, the listener answers with message 2, and
//! from then on both sides speak in authenticated (by default encrypted)
//! records. Each side's [`Hello`] is the payload of its handshake message.
//! The listener sends nothing at all until message 1 has authenticated
//! under the job secret, so a stranger gets no answer to test guesses
//! against; a wrong secret, a splice of two connections or a changed byte
//! ends the connection with nothing served.
//!
//! Once both hellos are known each side checks the other's: protocol
//! version, job id and view digest equal to its own, a node id that is not
//! its own, and for the dialer the node it meant to reach. A mismatch ends
//! the connection with a goodbye naming it (authenticated, so it is
//! believed).
//!
//! # Established
//!
//! * Requests are flow-controlled by credits: each side may have at most
//!   the credit the other granted outstanding. Each side grants
//!   [`ConnConfig::initial_credit`] on establishment, and one more for every
//!   request it answers (data or miss), coalesced into [`Frame::Credit`]
//!   frames. A peer exceeding its credit is closed.
//! * Due times travel as time left (nanoseconds from sending), so the two
//!   clocks need no common origin: [`Event::Request`] carries the due time
//!   on the receiver's clock.
//! * Answers: [`Conn::send_data`] queues the data header, then
//!   [`Transmit::Payload`] asks the transport for the payload, which it
//!   hands to [`Conn::seal_payload`] a piece at a time (copied once, from
//!   the pinned extent into the record), or, where it can lend the extent
//!   as a slice, to [`Conn::seal_payload_into`] (encrypted straight from
//!   the extent into a buffer the transport keeps, no copy). On the
//!   receiving side [`Event::Data`] is followed by the payload:
//!   [`Conn::payload`] gives its bytes as records open, to be copied into
//!   the reserved extent, or [`Conn::payload_into`] opens each record
//!   straight into it (decrypted there, no copy); events resume after the
//!   payload. `bench/run channel` measures both against the bare AEAD.
//! * Keepalive: after [`ConnConfig::keepalive`] without sending, a ping is
//!   sent; after [`ConnConfig::idle_timeout`] without receiving, the
//!   connection closes. Pongs give [`Event::Rtt`]. Pings are answered with
//!   one pong per write, whatever their number: a peer that pings and
//!   never reads makes nothing pile up.

use std::collections::VecDeque;
use std::fmt;

use crate::channel::{
    psk_of, ChannelError, Handshake, Preamble, Protection, Records, Suite, LEN_PREFIX, MAGIC,
    MAX_HANDSHAKE_MESSAGE, MAX_RECORD, MAX_RECORD_PLAINTEXT, PREAMBLE_LEN, TAG_LEN,
};
use crate::frame::{
    decode_frame, DataHeader, Decoded, Decoder, Frame, FrameError, Get, GoodbyeReason, Hello,
    MissReason, PayloadOrderError, Want, MAX_ID_LEN, MAX_VECTOR, PROTOCOL_VERSION,
};
use crate::input::InputBuffer;

/// Nanoseconds since an origin the caller picks (monotonic).
pub type Nanos = u64;

/// What a connection needs to know about its own side.
#[derive(Clone, Debug)]
pub struct ConnConfig {
    /// The job this agent serves.
    pub job_id: String,
    /// This agent's stable node id.
    pub node_id: String,
    /// Digest of this agent's view ([`crate::view::View::digest`]).
    pub view_digest: [u8; 32],
    /// This agent's incarnation (new on every restart).
    pub incarnation: u64,
    /// The per-job secret.
    pub secret: Vec<u8>,
    /// The node id the other side must have (the dialer knows whom it
    /// dials); `None` to accept any id (the listener checks membership on
    /// [`Event::Established`]).
    pub expected_peer: Option<String>,
    /// Requests the other side may have outstanding here.
    pub initial_credit: u32,
    /// Time allowed from creation to establishment.
    pub handshake_timeout: Nanos,
    /// Time without any byte received before closing.
    pub idle_timeout: Nanos,
    /// Time without sending before a ping goes out.
    pub keepalive: Nanos,
    /// What records protect; both sides must agree (`peers.encryption`).
    pub protection: Protection,
    /// The AEAD a dialer proposes (the listener takes the dialer's).
    pub suite: Suite,
}

impl ConnConfig {
    /// A configuration with the default timeouts (5 s handshake, 30 s
    /// idle, 5 s keepalive), an initial credit of 256, encrypted records
    /// and the suite this CPU runs fastest.
    pub fn new(
        job_id: impl Into<String>,
        node_id: impl Into<String>,
        view_digest: [u8; 32],
        incarnation: u64,
        secret: impl Into<Vec<u8>>,
    ) -> ConnConfig {
        ConnConfig {
            job_id: job_id.into(),
            node_id: node_id.into(),
            view_digest,
            incarnation,
            secret: secret.into(),
            expected_peer: None,
            initial_credit: 256,
            handshake_timeout: 5_000_000_000,
            idle_timeout: 30_000_000_000,
            keepalive: 5_000_000_000,
            protection: Protection::Encrypted,
            suite: Suite::fastest_here(),
        }
    }
}

/// Why a connection could not be created or a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnError {
    /// The secret is empty.
    EmptySecret,
    /// Job or node id empty or longer than [`MAX_ID_LEN`].
    BadId,
    /// Timeouts must be non-zero and keepalive shorter than idle timeout.
    BadTimeouts,
    /// The connection is not established (or already closed).
    NotEstablished,
    /// Not enough credit from the peer for this many requests.
    NoCredit,
    /// A vector-get of no or more than [`MAX_VECTOR`] items.
    BadCount,
    /// An answer with no request of the peer outstanding.
    NothingToAnswer,
    /// Payload bytes reported out of order, or more than announced.
    PayloadOrder,
    /// The output buffer is shorter than the records to write (this many
    /// bytes).
    OutputTooShort(usize),
    /// The frame cannot be encoded (length over the limit).
    Frame(FrameError),
    /// The channel could not be set up or seal.
    Channel(ChannelError),
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::EmptySecret => write!(f, "the job secret is empty"),
            ConnError::BadId => write!(f, "job or node id empty or over {MAX_ID_LEN} bytes"),
            ConnError::BadTimeouts => write!(
                f,
                "timeouts must be non-zero and keepalive shorter than the idle timeout"
            ),
            ConnError::NotEstablished => write!(f, "connection not established"),
            ConnError::NoCredit => write!(f, "no credit left for this request"),
            ConnError::BadCount => write!(f, "vector-get of 1..={MAX_VECTOR} items only"),
            ConnError::NothingToAnswer => write!(f, "no request of the peer is outstanding"),
            ConnError::PayloadOrder => write!(f, "{PayloadOrderError}"),
            ConnError::OutputTooShort(n) => write!(f, "the records need a buffer of {n} bytes"),
            ConnError::Frame(e) => write!(f, "{e}"),
            ConnError::Channel(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnError {}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// This side closed it (and said goodbye with this reason when the
    /// channel was up).
    Local(GoodbyeReason),
    /// The peer said goodbye.
    Remote(GoodbyeReason),
    /// The peer sent frames that do not decode (inside authentic records).
    Malformed(FrameError),
    /// The channel failed: not a peer of this job (bad preamble, another
    /// secret, another protection), or a record that did not
    /// authenticate. Nothing was served on it.
    Channel(ChannelError),
}

/// What the connection tells its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Both sides authenticated and their hellos agree. The listener says
    /// so once the dialer's first record has authenticated (the dialer
    /// sends one at once, its credit): before that, a recorded message 1
    /// replayed by a stranger would look like the dialer.
    Established {
        /// The peer's node id.
        peer: String,
        /// The peer's incarnation.
        incarnation: u64,
        /// The peer's view digest (equal to ours).
        view_digest: [u8; 32],
    },
    /// The peer wants a sample; `due` is on this side's clock.
    Request(Get),
    /// A block arrives; its payload follows (see [`Conn::payload`]).
    Data(DataHeader),
    /// The peer will not send a sample.
    Miss {
        /// The request answered.
        request: u64,
        /// Sample.
        sample: u64,
        /// Why.
        reason: MissReason,
    },
    /// The peer granted more request credit; [`Conn::credit`] is now this.
    Credit(u64),
    /// Round trip measured by a ping.
    Rtt(Nanos),
    /// The peer's RDMA queue pair parameters (opaque here).
    RdmaSetup(Vec<u8>),
    /// The peer no longer wants the block of its request `request`
    /// ([`Frame::Cancel`]): drop it if it is not being sent, and answer it
    /// with a [`MissReason::Cancelled`] miss. At most as many are passed on
    /// as the peer has requests outstanding; the others are dropped.
    Cancel(u64),
    /// The peer's job status ([`Frame::JobStatus`]); one older than the
    /// last passed on (a lower `seq`) is dropped.
    JobStatus(crate::status::JobStatus),
    /// The connection is closed; no more events follow.
    Closed(Closed),
}

/// What the transport must write, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// Wire bytes (handshake messages or sealed records).
    Bytes(Vec<u8>),
    /// `header.length` payload bytes of `header.sample`, from its pinned
    /// extent: the transport passes them to [`Conn::seal_payload`] (the
    /// data header was in the previous bytes) and writes what it returns
    /// before polling again.
    Payload(DataHeader),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Listener: waiting for the preamble and message 1.
    AwaitMessage1,
    /// Dialer: waiting for message 2.
    AwaitMessage2,
    Established,
    Closed,
}

/// Queued output, sealed when the transport polls for it.
#[derive(Debug)]
enum Out {
    /// Wire bytes as they are (handshake).
    Wire(Vec<u8>),
    /// Frames not yet sealed.
    Plain(Vec<u8>),
    /// A payload the transport supplies.
    Payload(DataHeader),
}

/// A peer connection. See the module documentation.
#[derive(Debug)]
pub struct Conn {
    cfg: ConnConfig,
    psk: [u8; 32],
    /// The listener's ephemeral randomness, until message 1 arrives.
    entropy: Option<[u8; 32]>,
    state: State,
    hs: Option<Handshake>,
    records: Option<Records>,
    /// Wire bytes received: `inbuf[in_pos..]` not yet taken apart.
    inbuf: InputBuffer,
    in_pos: usize,
    /// The opened plaintext of the current record not yet taken:
    /// `inbuf[plain.0..plain.1]`.
    plain: (usize, usize),
    /// Whether [`Conn::input_buffer`] handed out room not yet reported.
    reading: bool,
    decoder: Decoder,
    events: VecDeque<Event>,
    out: VecDeque<Out>,
    peer: Option<Hello>,
    created: Nanos,
    now: Nanos,
    last_recv: Nanos,
    last_send: Nanos,
    /// Requests we may still send.
    send_credit: u64,
    /// Requests of the peer received and not yet answered.
    peer_outstanding: u64,
    /// Cancels of the peer passed on and not yet matched by an answer: at
    /// most `peer_outstanding`, so a peer cannot make cancels pile up.
    peer_cancels: u64,
    /// Answers sent whose credit is not yet granted back.
    credit_owed: u32,
    /// The token of the latest ping not yet answered.
    pong: Option<u64>,
    /// The `seq` of the peer's last job status passed on.
    peer_status_seq: Option<u64>,
    /// Payload bytes the transport must still seal, and how many it did.
    sealing: Option<(DataHeader, u64)>,
    /// This side accepted the connection.
    listener: bool,
    /// The listener's [`Event::Established`], held until the dialer's
    /// first record authenticates: a recorded message 1 replayed by
    /// someone else decrypts, but only its real dialer holds the keys of
    /// the records that follow.
    unconfirmed: Option<Event>,
}

impl Conn {
    /// The dialer's side of a new connection: queues the preamble and
    /// handshake message 1 at once. `entropy` must be fresh randomness (it
    /// becomes the ephemeral key).
    pub fn dial(cfg: ConnConfig, entropy: [u8; 32], now: Nanos) -> Result<Conn, ConnError> {
        let mut c = Conn::new(cfg, now)?;
        let preamble = Preamble {
            suite: c.cfg.suite,
            protection: c.cfg.protection,
        };
        let mut hs = Handshake::initiator(preamble, &c.psk, entropy).map_err(ConnError::Channel)?;
        let hello = c.our_hello()?;
        let mut wire = preamble.encode().to_vec();
        hs.write(&hello, &mut wire).map_err(ConnError::Channel)?;
        c.hs = Some(hs);
        c.state = State::AwaitMessage2;
        c.out.push_back(Out::Wire(wire));
        c.last_send = now;
        Ok(c)
    }

    /// The listener's side of an accepted connection: says nothing until
    /// the dialer's first message authenticates. `entropy` as for
    /// [`Conn::dial`].
    pub fn accept(cfg: ConnConfig, entropy: [u8; 32], now: Nanos) -> Result<Conn, ConnError> {
        let mut c = Conn::new(cfg, now)?;
        c.entropy = Some(entropy);
        c.listener = true;
        c.state = State::AwaitMessage1;
        Ok(c)
    }

    fn new(cfg: ConnConfig, now: Nanos) -> Result<Conn, ConnError> {
        if cfg.secret.is_empty() {
            return Err(ConnError::EmptySecret);
        }
        let id_ok = |s: &str| !s.is_empty() && s.len() <= MAX_ID_LEN;
        if !id_ok(&cfg.job_id) || !id_ok(&cfg.node_id) {
            return Err(ConnError::BadId);
        }
        if cfg.handshake_timeout == 0
            || cfg.idle_timeout == 0
            || cfg.keepalive == 0
            || cfg.keepalive >= cfg.idle_timeout
        {
            return Err(ConnError::BadTimeouts);
        }
        Ok(Conn {
            psk: psk_of(&cfg.secret),
            cfg,
            entropy: None,
            state: State::Closed,
            hs: None,
            records: None,
            inbuf: InputBuffer::default(),
            in_pos: 0,
            plain: (0, 0),
            reading: false,
            decoder: Decoder::new(),
            events: VecDeque::new(),
            out: VecDeque::new(),
            peer: None,
            created: now,
            now,
            last_recv: now,
            last_send: now,
            send_credit: 0,
            peer_outstanding: 0,
            peer_cancels: 0,
            credit_owed: 0,
            pong: None,
            peer_status_seq: None,
            sealing: None,
            listener: false,
            unconfirmed: None,
        })
    }

    fn our_hello(&self) -> Result<Vec<u8>, ConnError> {
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            job_id: self.cfg.job_id.clone(),
            node_id: self.cfg.node_id.clone(),
            view_digest: self.cfg.view_digest,
            incarnation: self.cfg.incarnation,
        })
        .to_bytes()
        .map_err(ConnError::Frame)
    }

    /// True once both sides authenticated, until closed.
    pub fn is_established(&self) -> bool {
        self.state == State::Established
    }

    /// True once closed (queued bytes, such as a goodbye, may remain).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// The peer's hello, once its handshake message authenticated.
    pub fn peer(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// The suite and protection of the channel, once it is up.
    pub fn channel(&self) -> Option<(Suite, Protection)> {
        self.records.as_ref().map(|r| (r.suite(), r.protection()))
    }

    /// Requests this side may still send.
    pub fn credit(&self) -> u64 {
        self.send_credit
    }

    /// Feeds bytes read from the transport.
    pub fn handle_input(&mut self, bytes: &[u8], now: Nanos) {
        if self.state == State::Closed {
            return;
        }
        self.compact();
        self.inbuf.extend(bytes);
        self.received(bytes.len(), now);
    }

    /// Room to read wire bytes into without a copy: as many as the
    /// handshake still needs before it is done (so a stranger's bytes
    /// never grow a buffer), up to a record and a half after. Report what
    /// was read with [`Conn::input_written`]. The room is not cleared: it
    /// may hold bytes of earlier reads.
    pub fn input_buffer(&mut self) -> &mut [u8] {
        self.compact();
        let want = match self.state {
            State::AwaitMessage1 => self.handshake_wanted(PREAMBLE_LEN),
            State::AwaitMessage2 => self.handshake_wanted(0),
            State::Established => (LEN_PREFIX + MAX_RECORD) * 3 / 2,
            State::Closed => 0,
        };
        self.reading = true;
        self.inbuf.room(want)
    }

    /// `n` bytes were read into [`Conn::input_buffer`].
    pub fn input_written(&mut self, n: usize, now: Nanos) {
        if !std::mem::take(&mut self.reading) {
            return;
        }
        self.inbuf.filled(n);
        if self.state != State::Closed {
            self.received(n, now);
        }
    }

    /// Bytes the handshake message at `offset` past the unread bytes still
    /// needs (at least 1 while it is incomplete).
    fn handshake_wanted(&self, offset: usize) -> usize {
        let have = self.inbuf.len() - self.in_pos;
        let head = offset + LEN_PREFIX;
        if have < head {
            return head - have;
        }
        let at = self.in_pos + offset;
        let b = self.inbuf.bytes();
        let n = usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
        (head + n.min(MAX_HANDSHAKE_MESSAGE))
            .saturating_sub(have)
            .max(1)
    }

    fn received(&mut self, n: usize, now: Nanos) {
        self.now = self.now.max(now);
        if n > 0 {
            self.last_recv = self.now;
        }
        self.process();
    }

    /// Drops wire bytes already taken apart.
    fn compact(&mut self) {
        let keep = if self.plain.0 < self.plain.1 {
            self.plain.0.min(self.in_pos)
        } else {
            self.in_pos
        };
        if keep == 0 || keep < self.inbuf.len() / 2 && keep < 64 * 1024 {
            return;
        }
        self.inbuf.discard(keep);
        self.in_pos -= keep;
        if self.plain.0 < self.plain.1 {
            self.plain = (self.plain.0 - keep, self.plain.1 - keep);
        } else {
            self.plain = (0, 0);
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.process();
        self.events.pop_front()
    }

    /// The next thing to write, if any. Nothing comes while a payload
    /// handed out by [`Transmit::Payload`] is not wholly sealed.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.sealing.is_some() {
            return None;
        }
        if self.state == State::Established {
            if self.credit_owed > 0 {
                let f = Frame::Credit(self.credit_owed);
                self.credit_owed = 0;
                self.push_frame(&f);
            }
            if let Some(t) = self.pong.take() {
                self.push_frame(&Frame::Pong(t));
            }
        }
        loop {
            match self.out.pop_front()? {
                Out::Wire(b) => return Some(Transmit::Bytes(b)),
                Out::Plain(p) => {
                    let records = self.records.as_mut()?;
                    let mut wire = Vec::with_capacity(p.len() + 64);
                    match records.seal(&p, &mut wire) {
                        Ok(()) => return Some(Transmit::Bytes(wire)),
                        Err(e) => self.fail_channel(e),
                    }
                }
                Out::Payload(h) => {
                    if h.length > 0 {
                        self.sealing = Some((h, 0));
                    }
                    return Some(Transmit::Payload(h));
                }
            }
        }
    }

    /// Payload bytes still to seal for the last [`Transmit::Payload`].
    pub fn payload_to_seal(&self) -> u64 {
        self.sealing.map_or(0, |(h, done)| h.length - done)
    }

    /// Seals the next `len` bytes of the payload handed out by
    /// [`Transmit::Payload`] into records appended to `out`. `fill(offset,
    /// dst)` writes the payload bytes at `offset` (from the start of the
    /// payload) into `dst`, in place in the record.
    pub fn seal_payload(
        &mut self,
        len: u64,
        out: &mut Vec<u8>,
        mut fill: impl FnMut(u64, &mut [u8]),
    ) -> Result<(), ConnError> {
        let Some((h, done)) = self.sealing else {
            return Err(ConnError::PayloadOrder);
        };
        if len > h.length - done {
            return Err(ConnError::PayloadOrder);
        }
        let records = self.records.as_mut().ok_or(ConnError::NotEstablished)?;
        let mut at = done;
        let end = done + len;
        while at < end {
            let n = (end - at).min(MAX_RECORD_PLAINTEXT as u64) as usize;
            records
                .seal_with(n, out, |dst| fill(at, dst))
                .map_err(ConnError::Channel)?;
            at += n as u64;
        }
        self.sealing = (end < h.length).then_some((h, end));
        self.last_send = self.now;
        Ok(())
    }

    /// [`Conn::seal_payload`] of the whole of `payload`, for callers that
    /// hold it in memory.
    pub fn seal_payload_from(
        &mut self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ConnError> {
        self.seal_payload(payload.len() as u64, out, |at, dst| {
            let at = at as usize;
            dst.copy_from_slice(&payload[at..at + dst.len()]);
        })
    }

    /// Bytes of the records that [`Conn::seal_payload_into`] writes for
    /// `len` payload bytes: one record per [`MAX_RECORD_PLAINTEXT`] bytes
    /// or part of them, each with its length prefix and tag.
    pub fn sealed_len(len: usize) -> usize {
        len + len.div_ceil(MAX_RECORD_PLAINTEXT) * (LEN_PREFIX + TAG_LEN)
    }

    /// Seals the next `payload.len()` bytes of the payload handed out by
    /// [`Transmit::Payload`] straight from `payload` (encrypted from it in
    /// one pass, no copy first) into records written at the start of
    /// `out`, and returns their length, [`Conn::sealed_len`] of
    /// `payload.len()`. `out` must hold that many bytes; a buffer kept for
    /// the next call is not cleared or grown, unlike the `Vec` of
    /// [`Conn::seal_payload`].
    pub fn seal_payload_into(
        &mut self,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, ConnError> {
        let Some((h, done)) = self.sealing else {
            return Err(ConnError::PayloadOrder);
        };
        let len = payload.len() as u64;
        if len > h.length - done {
            return Err(ConnError::PayloadOrder);
        }
        let need = Conn::sealed_len(payload.len());
        if out.len() < need {
            return Err(ConnError::OutputTooShort(need));
        }
        let records = self.records.as_mut().ok_or(ConnError::NotEstablished)?;
        let mut at = 0;
        for piece in payload.chunks(MAX_RECORD_PLAINTEXT) {
            at += records
                .seal_into(piece, &mut out[at..])
                .map_err(ConnError::Channel)?;
        }
        let end = done + len;
        self.sealing = (end < h.length).then_some((h, end));
        self.last_send = self.now;
        Ok(at)
    }

    /// When [`Conn::handle_timeout`] must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        match self.state {
            State::Closed => None,
            State::Established => Some(
                (self.last_recv.saturating_add(self.cfg.idle_timeout))
                    .min(self.last_send.saturating_add(self.cfg.keepalive)),
            ),
            _ => Some(
                (self.created.saturating_add(self.cfg.handshake_timeout))
                    .min(self.last_recv.saturating_add(self.cfg.idle_timeout)),
            ),
        }
    }

    /// Advances timers to `now`: closes on handshake or idle timeout, sends
    /// a keepalive ping when due.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        let now = self.now;
        match self.state {
            State::Closed => {}
            State::Established => {
                if now >= self.last_recv.saturating_add(self.cfg.idle_timeout) {
                    self.close(GoodbyeReason::Timeout);
                } else if now >= self.last_send.saturating_add(self.cfg.keepalive) {
                    self.push_frame(&Frame::Ping(now));
                }
            }
            _ => {
                if now >= self.created.saturating_add(self.cfg.handshake_timeout)
                    || now >= self.last_recv.saturating_add(self.cfg.idle_timeout)
                {
                    self.close(GoodbyeReason::Timeout);
                }
            }
        }
    }

    /// Closes, with a goodbye when the channel is up (no-op when already
    /// closed).
    pub fn close(&mut self, reason: GoodbyeReason) {
        if self.state == State::Closed {
            return;
        }
        if self.records.is_some() {
            self.push_frame(&Frame::Goodbye(reason));
        }
        self.state = State::Closed;
        self.events.push_back(Event::Closed(Closed::Local(reason)));
    }

    /// Closes after a channel failure: a goodbye only when the records
    /// still work (an unauthentic record from the peer), none before.
    fn fail_channel(&mut self, e: ChannelError) {
        if self.state == State::Closed {
            return;
        }
        if self.records.is_some() && e == ChannelError::Unauthentic {
            self.push_frame(&Frame::Goodbye(GoodbyeReason::ProtocolError));
        }
        self.state = State::Closed;
        self.events.push_back(Event::Closed(Closed::Channel(e)));
    }

    /// Asks for one sample; `due` is on this side's clock.
    pub fn send_get(&mut self, get: Get, now: Nanos) -> Result<(), ConnError> {
        self.ready_to_request(1)?;
        self.now = self.now.max(now);
        let wire = Get {
            due: get.due.saturating_sub(self.now),
            ..get
        };
        self.send_credit -= 1;
        self.push_frame(&Frame::Get(wire));
        Ok(())
    }

    /// Asks for several samples of one dataset in one frame.
    pub fn send_get_many(
        &mut self,
        fingerprint: u64,
        items: &[Want],
        now: Nanos,
    ) -> Result<(), ConnError> {
        if items.is_empty() || items.len() > MAX_VECTOR {
            return Err(ConnError::BadCount);
        }
        self.ready_to_request(items.len() as u64)?;
        self.now = self.now.max(now);
        let items = items
            .iter()
            .map(|w| Want {
                due: w.due.saturating_sub(self.now),
                ..*w
            })
            .collect::<Vec<_>>();
        self.send_credit -= items.len() as u64;
        self.push_frame(&Frame::GetMany { fingerprint, items });
        Ok(())
    }

    /// Answers a request with a block: queues the data header, then a
    /// [`Transmit::Payload`] for the transport to supply the bytes.
    pub fn send_data(&mut self, header: DataHeader) -> Result<(), ConnError> {
        self.ready_to_answer()?;
        let bytes = Frame::Data(header).to_bytes().map_err(ConnError::Frame)?;
        self.answered();
        self.push_bytes(&bytes);
        self.out.push_back(Out::Payload(header));
        Ok(())
    }

    /// Sends this side's RDMA queue pair parameters (opaque bytes, 1 to
    /// [`crate::frame::MAX_RDMA_SETUP`]); only once established, so no
    /// RDMA key or address leaves before the peer proved the job secret,
    /// and only inside the channel.
    pub fn send_rdma_setup(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        self.push_bounded(Frame::RdmaSetup(bytes.to_vec()))
    }

    /// Tells the peer that the block of our request `request` is no longer
    /// wanted ([`Frame::Cancel`]). It answers with a
    /// [`MissReason::Cancelled`] miss, or with the block if it was already
    /// being sent; either returns the request's credit.
    pub fn send_cancel(&mut self, request: u64) -> Result<(), ConnError> {
        self.check_established()?;
        self.push_frame(&Frame::Cancel(request));
        Ok(())
    }

    /// Sends this side's job status ([`Frame::JobStatus`]); only once
    /// established. Fails, sending nothing, for a status the peer would
    /// refuse (over the frame's bounds).
    pub fn send_job_status(&mut self, status: &crate::status::JobStatus) -> Result<(), ConnError> {
        self.push_bounded(Frame::JobStatus(status.clone()))
    }

    /// Answers a request with a miss.
    pub fn send_miss(
        &mut self,
        request: u64,
        sample: u64,
        reason: MissReason,
    ) -> Result<(), ConnError> {
        self.ready_to_answer()?;
        self.answered();
        self.push_frame(&Frame::Miss {
            request,
            sample,
            reason,
        });
        Ok(())
    }

    /// After [`Event::Data`]: the next payload bytes received, in order
    /// (copy them into the extent), or `None` when none are here yet.
    pub fn payload(&mut self) -> Option<&[u8]> {
        let left = self.decoder.payload_remaining();
        if left == 0 {
            return None;
        }
        if self.decoder.buffered() > 0 {
            return match self.decoder.next_item() {
                Ok(Some(Decoded::Payload(p))) => Some(p),
                _ => None,
            };
        }
        if self.plain.0 >= self.plain.1 && !self.open_record() {
            return None;
        }
        let (a, b) = self.plain;
        let n = ((b - a) as u64).min(left) as usize;
        if n == 0 || self.decoder.payload_direct(n as u64).is_err() {
            return None;
        }
        self.plain.0 += n;
        Some(&self.inbuf.bytes()[a..a + n])
    }

    /// After [`Event::Data`]: writes the next payload bytes received into
    /// `dst`, in order, and returns how many (0 when none are here yet). A
    /// whole record of payload that fits in `dst` is opened straight into
    /// it: an encrypted one is decrypted there, with no copy after. Other
    /// bytes are copied, as [`Conn::payload`] would give them. Calls of the
    /// two may be mixed.
    pub fn payload_into(&mut self, dst: &mut [u8]) -> usize {
        let left = self.decoder.payload_remaining();
        if left == 0 || dst.is_empty() {
            return 0;
        }
        if self.decoder.buffered() == 0 && self.plain.0 >= self.plain.1 {
            let Some((start, len)) = self.whole_record() else {
                return 0;
            };
            let n = len - TAG_LEN;
            if n as u64 <= left && n <= dst.len() {
                let Some(records) = self.records.as_mut() else {
                    return 0;
                };
                let body = &self.inbuf.bytes()[start..start + len];
                return match records.open_into(body, &mut dst[..n]) {
                    Ok(()) if self.decoder.payload_direct(n as u64).is_ok() => {
                        self.in_pos = start + len;
                        n
                    }
                    Ok(()) => 0,
                    Err(e) => {
                        self.fail_channel(e);
                        0
                    }
                };
            }
        }
        // A record holding more than the rest of the payload, or more than
        // `dst` takes: opened in place, copied piece by piece.
        if self.decoder.buffered() > 0 {
            return match self.decoder.next_payload(dst.len()) {
                Some(p) => {
                    dst[..p.len()].copy_from_slice(p);
                    p.len()
                }
                None => 0,
            };
        }
        if self.plain.0 >= self.plain.1 && !self.open_record() {
            return 0;
        }
        let (a, b) = self.plain;
        let n = (b - a).min(dst.len()).min(left as usize);
        if n == 0 || self.decoder.payload_direct(n as u64).is_err() {
            return 0;
        }
        self.plain.0 += n;
        dst[..n].copy_from_slice(&self.inbuf.bytes()[a..a + n]);
        n
    }

    /// Queues `plain` as frame bytes to be sealed as they are: lets a fuzz
    /// target play a member that sends arbitrary frames inside authentic
    /// records.
    #[cfg(any(test, fuzzing))]
    #[doc(hidden)]
    pub fn inject_plaintext_for_fuzzing(&mut self, plain: &[u8]) {
        if !plain.is_empty() {
            self.push_bytes(plain);
        }
    }

    /// Payload bytes still expected for the current block.
    pub fn payload_remaining(&self) -> u64 {
        self.decoder.payload_remaining()
    }

    /// `NotEstablished` until the handshake has completed.
    fn check_established(&self) -> Result<(), ConnError> {
        if self.state != State::Established {
            return Err(ConnError::NotEstablished);
        }
        Ok(())
    }

    /// Sends `f`, a frame whose content may be over its bounds, once
    /// established; sends nothing when it is not, or when `f` does not
    /// encode.
    fn push_bounded(&mut self, f: Frame) -> Result<(), ConnError> {
        self.check_established()?;
        f.to_bytes().map_err(ConnError::Frame)?;
        self.push_frame(&f);
        Ok(())
    }

    fn ready_to_request(&self, n: u64) -> Result<(), ConnError> {
        self.check_established()?;
        if self.send_credit < n {
            return Err(ConnError::NoCredit);
        }
        Ok(())
    }

    fn ready_to_answer(&self) -> Result<(), ConnError> {
        self.check_established()?;
        if self.peer_outstanding == 0 {
            return Err(ConnError::NothingToAnswer);
        }
        Ok(())
    }

    fn answered(&mut self) {
        self.peer_outstanding -= 1;
        self.peer_cancels = self.peer_cancels.saturating_sub(1);
        self.credit_owed = self.credit_owed.saturating_add(1);
    }

    fn push_frame(&mut self, f: &Frame) {
        // Every frame built here is within the limits by construction.
        if let Ok(b) = f.to_bytes() {
            self.push_bytes(&b);
        }
    }

    fn push_bytes(&mut self, b: &[u8]) {
        self.last_send = self.now;
        if let Some(Out::Plain(last)) = self.out.back_mut() {
            last.extend_from_slice(b);
        } else {
            self.out.push_back(Out::Plain(b.to_vec()));
        }
    }

    /// Takes apart what was received, as far as it goes.
    fn process(&mut self) {
        loop {
            match self.state {
                State::Closed => return,
                State::AwaitMessage1 => {
                    if !self.take_message1() {
                        return;
                    }
                }
                State::AwaitMessage2 => {
                    if !self.take_message2() {
                        return;
                    }
                }
                State::Established => {
                    if !self.take_frame() {
                        return;
                    }
                }
            }
        }
    }

    /// The listener's handshake: preamble and message 1 in, message 2 out.
    fn take_message1(&mut self) -> bool {
        self.handshake_step(Self::try_message1)
    }

    /// The dialer's handshake: message 2 in.
    fn take_message2(&mut self) -> bool {
        self.handshake_step(Self::try_message2)
    }

    /// Runs a step of the handshake: whether it completed (`false` also
    /// when its bytes have not all arrived); a failure fails the channel.
    fn handshake_step(&mut self, step: fn(&mut Self) -> Result<bool, ChannelError>) -> bool {
        step(self).unwrap_or_else(|e| {
            self.fail_channel(e);
            false
        })
    }

    fn try_message1(&mut self) -> Result<bool, ChannelError> {
        let have = &self.inbuf.bytes()[self.in_pos..];
        if have.len() < PREAMBLE_LEN + LEN_PREFIX {
            // A stranger is told apart as soon as its bytes differ.
            let n = have.len().min(MAGIC.len());
            if have[..n] != MAGIC[..n] {
                return Err(ChannelError::BadPreamble);
            }
            return Ok(false);
        }
        let mut pre = [0u8; PREAMBLE_LEN];
        pre.copy_from_slice(&have[..PREAMBLE_LEN]);
        let preamble = Preamble::decode(&pre, self.cfg.protection)?;
        let n = usize::from(u16::from_be_bytes([
            have[PREAMBLE_LEN],
            have[PREAMBLE_LEN + 1],
        ]));
        if n > MAX_HANDSHAKE_MESSAGE {
            return Err(ChannelError::HandshakeLength(n));
        }
        let start = PREAMBLE_LEN + LEN_PREFIX;
        if have.len() < start + n {
            return Ok(false);
        }
        let message = have[start..start + n].to_vec();
        self.in_pos += start + n;
        let entropy = self.entropy.take().unwrap_or_default();
        let mut hs = Handshake::responder(preamble, &self.psk, entropy)?;
        let theirs = hs.read(&message)?;
        let hello = parse_hello(&theirs).ok_or(ChannelError::BadHello)?;
        let mut wire = Vec::new();
        let ours = self.our_hello().map_err(|_| ChannelError::Internal)?;
        let records = hs.write(&ours, &mut wire).and_then(|()| hs.finish())?;
        self.records = Some(records);
        self.out.push_back(Out::Wire(wire));
        self.last_send = self.now;
        self.established(hello);
        Ok(true)
    }

    fn try_message2(&mut self) -> Result<bool, ChannelError> {
        let have = &self.inbuf.bytes()[self.in_pos..];
        if have.len() < LEN_PREFIX {
            return Ok(false);
        }
        let n = usize::from(u16::from_be_bytes([have[0], have[1]]));
        if n > MAX_HANDSHAKE_MESSAGE {
            return Err(ChannelError::HandshakeLength(n));
        }
        if have.len() < LEN_PREFIX + n {
            return Ok(false);
        }
        let message = have[LEN_PREFIX..LEN_PREFIX + n].to_vec();
        self.in_pos += LEN_PREFIX + n;
        let mut hs = self.hs.take().ok_or(ChannelError::Internal)?;
        let theirs = hs.read(&message)?;
        self.records = Some(hs.finish()?);
        let hello = parse_hello(&theirs).ok_or(ChannelError::BadHello)?;
        self.established(hello);
        Ok(true)
    }

    /// Checks the peer's authenticated hello; establishes or says goodbye.
    fn established(&mut self, h: Hello) {
        let reason = if h.version != PROTOCOL_VERSION {
            Some(GoodbyeReason::VersionMismatch)
        } else if h.job_id != self.cfg.job_id
            || h.view_digest != self.cfg.view_digest
            || self
                .cfg
                .expected_peer
                .as_ref()
                .is_some_and(|want| *want != h.node_id)
        {
            Some(GoodbyeReason::ViewMismatch)
        } else if h.node_id == self.cfg.node_id {
            // A connection to ourselves (or our own message reflected).
            Some(GoodbyeReason::ProtocolError)
        } else {
            None
        };
        self.peer = Some(h.clone());
        self.state = State::Established;
        if let Some(r) = reason {
            self.close(r);
            return;
        }
        let up = Event::Established {
            peer: h.node_id,
            incarnation: h.incarnation,
            view_digest: h.view_digest,
        };
        if self.listener {
            self.unconfirmed = Some(up);
        } else {
            self.events.push_back(up);
        }
        if self.cfg.initial_credit > 0 {
            self.push_frame(&Frame::Credit(self.cfg.initial_credit));
        }
    }

    /// Where the body of the next record lies in `inbuf` and its length,
    /// once it is wholly here (`None` otherwise, or on a bad length, which
    /// closes).
    fn whole_record(&mut self) -> Option<(usize, usize)> {
        if self.state != State::Established || self.records.is_none() {
            return None;
        }
        let len = match Records::record_len(&self.inbuf.bytes()[self.in_pos..]) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(e) => {
                self.fail_channel(e);
                return None;
            }
        };
        let start = self.in_pos + LEN_PREFIX;
        (self.inbuf.len() >= start + len).then_some((start, len))
    }

    /// Opens the next whole record, if one is here; false otherwise (or on
    /// failure, which closes).
    fn open_record(&mut self) -> bool {
        let Some((start, len)) = self.whole_record() else {
            return false;
        };
        let Some(records) = self.records.as_mut() else {
            return false;
        };
        match records.open(&mut self.inbuf.bytes_mut()[start..start + len]) {
            Ok(n) => {
                self.plain = (start, start + n);
                self.in_pos = start + len;
                if let Some(up) = self.unconfirmed.take() {
                    self.events.push_back(up);
                }
                true
            }
            Err(e) => {
                self.fail_channel(e);
                false
            }
        }
    }

    /// One step of the established phase: a frame handled, plaintext fed
    /// to the decoder or a record opened. False when nothing can be done
    /// until more bytes arrive (or a payload is taken).
    fn take_frame(&mut self) -> bool {
        if self.decoder.payload_remaining() > 0 {
            // The payload is taken by `payload()`; open its record so
            // that it is ready.
            return false;
        }
        match self.decoder.next_item() {
            Ok(Some(Decoded::Frame(f))) => {
                self.on_frame(f);
                true
            }
            Ok(Some(Decoded::Payload(_))) => true,
            Ok(None) => {
                if self.plain.0 < self.plain.1 {
                    let (a, b) = self.plain;
                    let n = self.decoder.wanted().clamp(1, b - a);
                    self.decoder.feed(&self.inbuf.bytes()[a..a + n]);
                    self.plain.0 += n;
                    true
                } else {
                    self.open_record()
                }
            }
            Err(e) => {
                self.push_frame(&Frame::Goodbye(GoodbyeReason::ProtocolError));
                self.state = State::Closed;
                self.events.push_back(Event::Closed(Closed::Malformed(e)));
                false
            }
        }
    }

    fn on_frame(&mut self, f: Frame) {
        match f {
            Frame::Goodbye(r) => {
                self.state = State::Closed;
                self.events.push_back(Event::Closed(Closed::Remote(r)));
            }
            Frame::Get(g) => {
                if self.take_peer_requests(1) {
                    let due = self.now.saturating_add(g.due);
                    self.events.push_back(Event::Request(Get { due, ..g }));
                }
            }
            Frame::GetMany { fingerprint, items } => {
                if self.take_peer_requests(items.len() as u64) {
                    for w in items {
                        self.events.push_back(Event::Request(Get {
                            request: w.request,
                            fingerprint,
                            sample: w.sample,
                            length: w.length,
                            due: self.now.saturating_add(w.due),
                        }));
                    }
                }
            }
            Frame::Data(d) => self.events.push_back(Event::Data(d)),
            Frame::Miss {
                request,
                sample,
                reason,
            } => self.events.push_back(Event::Miss {
                request,
                sample,
                reason,
            }),
            Frame::Credit(n) => {
                self.send_credit = self.send_credit.saturating_add(u64::from(n));
                self.events.push_back(Event::Credit(self.send_credit));
            }
            // Answered with one pong per write, however many came.
            Frame::Ping(t) => self.pong = Some(t),
            Frame::RdmaSetup(b) => self.events.push_back(Event::RdmaSetup(b)),
            Frame::JobStatus(st) => {
                if self.peer_status_seq.is_none_or(|last| st.seq > last) {
                    self.peer_status_seq = Some(st.seq);
                    self.events.push_back(Event::JobStatus(st));
                }
            }
            // A request may be cancelled while it is outstanding here; a
            // cancel that crossed its answer on the wire is not an error,
            // so surplus cancels are dropped, not fatal.
            Frame::Cancel(request) => {
                if self.peer_cancels < self.peer_outstanding {
                    self.peer_cancels += 1;
                    self.events.push_back(Event::Cancel(request));
                }
            }
            Frame::Pong(t) => {
                if t <= self.now {
                    self.events.push_back(Event::Rtt(self.now - t));
                }
            }
            // A hello inside the channel breaks the protocol.
            Frame::Hello(_) => self.close(GoodbyeReason::ProtocolError),
        }
    }

    fn take_peer_requests(&mut self, n: u64) -> bool {
        let allowed = u64::from(self.cfg.initial_credit);
        if self.peer_outstanding + n > allowed {
            self.close(GoodbyeReason::ProtocolError);
            return false;
        }
        self.peer_outstanding += n;
        true
    }
}

/// A hello frame and nothing else.
fn parse_hello(b: &[u8]) -> Option<Hello> {
    match decode_frame(b) {
        Ok(Some((Frame::Hello(h), n))) if n == b.len() => Some(h),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;

    const S: u64 = 1_000_000_000;

    fn cfg(node: &str, secret: &[u8]) -> ConnConfig {
        let mut c = ConnConfig::new("job", node, [7; 32], 1, secret);
        c.initial_credit = 4;
        c
    }

    /// Moves every queued transmit of `from` into `to`; returns payload
    /// transmits seen (their bytes are `sample` repeated).
    fn pump(from: &mut Conn, to: &mut Conn, now: Nanos) -> Vec<DataHeader> {
        let mut payloads = Vec::new();
        while let Some(t) = from.poll_transmit() {
            match t {
                Transmit::Bytes(b) => to.handle_input(&b, now),
                Transmit::Payload(h) => {
                    let mut wire = Vec::new();
                    from.seal_payload_from(&vec![h.sample as u8; h.length as usize], &mut wire)
                        .unwrap();
                    to.handle_input(&wire, now);
                    payloads.push(h);
                }
            }
        }
        payloads
    }

    /// Everything `c` queued, as wire bytes (payloads sealed as zeros).
    fn wire_of(c: &mut Conn) -> Vec<u8> {
        let mut w = Vec::new();
        while let Some(t) = c.poll_transmit() {
            match t {
                Transmit::Bytes(b) => w.extend_from_slice(&b),
                Transmit::Payload(h) => c
                    .seal_payload_from(&vec![0; h.length as usize], &mut w)
                    .unwrap(),
            }
        }
        w
    }

    fn events(c: &mut Conn) -> Vec<Event> {
        std::iter::from_fn(|| c.poll_event()).collect()
    }

    fn pair_with(a: ConnConfig, b: ConnConfig) -> (Conn, Conn) {
        let mut a = Conn::dial(a, [1; 32], 0).unwrap();
        let mut b = Conn::accept(b, [2; 32], 0).unwrap();
        for _ in 0..3 {
            pump(&mut a, &mut b, 0);
            pump(&mut b, &mut a, 0);
        }
        (a, b)
    }

    fn pair(sa: &[u8], sb: &[u8]) -> (Conn, Conn) {
        pair_with(cfg("a", sa), cfg("b", sb))
    }

    /// The configurations of a dialer "a" and a listener "b" sharing
    /// `secret`, both asking for `protection`.
    fn cfgs(secret: &[u8], protection: Protection) -> (ConnConfig, ConnConfig) {
        let mut ca = cfg("a", secret);
        ca.protection = protection;
        let mut cb = cfg("b", secret);
        cb.protection = protection;
        (ca, cb)
    }

    #[test]
    fn handshake_establishes_with_the_right_secret() {
        for protection in [Protection::Encrypted, Protection::Authenticated] {
            for suite in Suite::ALL {
                let (mut ca, cb) = cfgs(b"s3cret", protection);
                ca.suite = suite;
                let (mut a, mut b) = pair_with(ca, cb);
                assert!(a.is_established() && b.is_established());
                assert_eq!(a.channel(), Some((suite, protection)));
                assert_eq!(
                    b.channel(),
                    Some((suite, protection)),
                    "the listener takes the dialer's suite"
                );
                assert_eq!(
                    events(&mut a),
                    [
                        Event::Established {
                            peer: "b".into(),
                            incarnation: 1,
                            view_digest: [7; 32]
                        },
                        Event::Credit(4)
                    ]
                );
                assert_eq!(a.credit(), 4);
                assert!(matches!(events(&mut b)[0], Event::Established { .. }));
            }
        }
    }

    #[test]
    fn the_listener_says_nothing_to_a_stranger() {
        // Not a preamble, a preamble and garbage, a dialer with another
        // secret: the listener closes and has not written one byte.
        let mut dialer = Conn::dial(cfg("x", b"wrong"), [3; 32], 0).unwrap();
        let real = wire_of(&mut dialer);
        let inputs: Vec<Vec<u8>> = vec![
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            {
                let mut v = real[..PREAMBLE_LEN].to_vec();
                v.extend_from_slice(&[0, 60]);
                v.extend(std::iter::repeat_n(7u8, 60));
                v
            },
            real,
        ];
        for input in inputs {
            let mut l = Conn::accept(cfg("me", b"right"), [4; 32], 0).unwrap();
            l.handle_input(&input, 0);
            assert!(l.is_closed(), "{input:?}");
            assert!(
                wire_of(&mut l).is_empty(),
                "the listener answered a stranger"
            );
            let ev = events(&mut l);
            assert!(
                matches!(ev[..], [Event::Closed(Closed::Channel(_))]),
                "{ev:?}"
            );
        }
    }

    #[test]
    fn wrong_secret_serves_nothing_and_establishes_nothing() {
        let (mut a, mut b) = pair(b"right", b"wrong");
        assert!(a.is_closed() || !a.is_established());
        assert!(b.is_closed());
        assert!(events(&mut b).contains(&Event::Closed(Closed::Channel(ChannelError::Handshake))));
        assert_eq!(a.send_get(get(1), 0), Err(ConnError::NotEstablished));
        // The dialer gets no answer: it times out.
        a.handle_timeout(6 * S);
        assert!(a.is_closed());
        assert!(events(&mut a).contains(&Event::Closed(Closed::Local(GoodbyeReason::Timeout))));
    }

    #[test]
    fn a_relay_between_two_listeners_gets_nothing() {
        // Someone dials both agents and passes each one's bytes to the
        // other: two listeners both wait for a first message; neither sends
        // one, so nothing happens until both time out.
        let mut a = Conn::accept(cfg("a", b"k"), [1; 32], 0).unwrap();
        let mut b = Conn::accept(cfg("b", b"k"), [2; 32], 0).unwrap();
        for _ in 0..3 {
            pump(&mut a, &mut b, 0);
            pump(&mut b, &mut a, 0);
        }
        assert!(!a.is_established() && !b.is_established());
        // Replaying a dialer's recorded first message to another listener
        // gets a message 2 whose keys the replayer cannot compute: the
        // records it then forges fail.
        let mut d = Conn::dial(cfg("d", b"k"), [5; 32], 0).unwrap();
        let m1 = wire_of(&mut d);
        let mut l = Conn::accept(cfg("l", b"k"), [6; 32], 0).unwrap();
        l.handle_input(&m1, 0);
        assert!(l.is_established());
        // The replayer is not taken for the dialer: no record of its own
        // has authenticated yet.
        assert_eq!(events(&mut l), []);
        let mut forged = vec![0, 40];
        forged.extend(std::iter::repeat_n(0x55u8, 40));
        l.handle_input(&forged, 0);
        assert_eq!(
            events(&mut l),
            [Event::Closed(Closed::Channel(ChannelError::Unauthentic))]
        );
        // The real dialer's first record (its credit) is what makes the
        // listener say it is up.
        let mut d = Conn::dial(cfg("d", b"k"), [5; 32], 0).unwrap();
        let mut l = Conn::accept(cfg("l", b"k"), [6; 32], 0).unwrap();
        pump(&mut d, &mut l, 0);
        assert_eq!(events(&mut l), []);
        pump(&mut l, &mut d, 0);
        pump(&mut d, &mut l, 0);
        assert_eq!(
            events(&mut l),
            [
                Event::Established {
                    peer: "d".into(),
                    incarnation: 1,
                    view_digest: [7; 32]
                },
                Event::Credit(4)
            ]
        );
    }

    #[test]
    fn a_flipped_byte_on_the_wire_closes_and_delivers_nothing() {
        for protection in [Protection::Encrypted, Protection::Authenticated] {
            let (ca, cb) = cfgs(b"k", protection);
            let (mut a, mut b) = pair_with(ca, cb);
            events(&mut a);
            events(&mut b);
            a.send_get(get(3), 0).unwrap();
            let mut w = wire_of(&mut a);
            let last = w.len() - TAG_LEN - 3;
            w[last] ^= 0x20;
            b.handle_input(&w, 0);
            let ev = events(&mut b);
            assert!(!ev.iter().any(|e| matches!(e, Event::Request(_))), "{ev:?}");
            assert!(ev.contains(&Event::Closed(Closed::Channel(ChannelError::Unauthentic))));
        }
    }

    #[test]
    fn encrypted_records_hide_payloads_and_authenticated_ones_do_not() {
        for protection in [Protection::Encrypted, Protection::Authenticated] {
            let (ca, cb) = cfgs(b"k", protection);
            let (mut a, mut b) = pair_with(ca, cb);
            events(&mut a);
            a.send_get(get(0), 0).unwrap();
            pump(&mut a, &mut b, 0);
            events(&mut b);
            b.send_data(DataHeader {
                request: 0,
                sample: 0,
                length: 1000,
                crc: 0,
                store_wait_us: 0,
            })
            .unwrap();
            let secret_bytes = b"the-sample-bytes".repeat(70);
            let mut w = Vec::new();
            while let Some(t) = b.poll_transmit() {
                match t {
                    Transmit::Bytes(x) => w.extend_from_slice(&x),
                    Transmit::Payload(_) => {
                        b.seal_payload_from(&secret_bytes[..1000], &mut w).unwrap()
                    }
                }
            }
            let seen = w.windows(16).any(|x| x == b"the-sample-bytes");
            assert_eq!(seen, protection == Protection::Authenticated);
            a.handle_input(&w, 0);
            assert!(matches!(a.poll_event(), Some(Event::Data(_))));
            let mut got = Vec::new();
            while let Some(p) = a.payload() {
                got.extend_from_slice(p);
            }
            assert_eq!(got, secret_bytes[..1000]);
        }
    }

    #[test]
    fn rdma_setup_goes_only_after_authentication() {
        let mut a = Conn::dial(cfg("a", b"s"), [1; 32], 0).unwrap();
        assert_eq!(a.send_rdma_setup(&[1; 36]), Err(ConnError::NotEstablished));
        let (mut a, mut b) = pair(b"s", b"s");
        events(&mut b);
        a.send_rdma_setup(&[9; 36]).unwrap();
        assert!(matches!(
            a.send_rdma_setup(&[]),
            Err(ConnError::Frame(FrameError::BadRdmaSetup(0)))
        ));
        pump(&mut a, &mut b, 0);
        assert_eq!(events(&mut b), [Event::RdmaSetup(vec![9; 36])]);
    }

    #[test]
    fn view_or_job_or_peer_mismatch_says_goodbye() {
        let mut other = cfg("b", b"s");
        other.view_digest = [8; 32];
        let (mut a, mut b) = pair_with(cfg("a", b"s"), other);
        assert!(a.is_closed() && b.is_closed());
        let ea = events(&mut a);
        let eb = events(&mut b);
        assert!(
            ea.iter()
                .chain(&eb)
                .any(|e| matches!(e, Event::Closed(Closed::Local(GoodbyeReason::ViewMismatch)))),
            "{ea:?} {eb:?}"
        );
        assert!(!ea
            .iter()
            .chain(&eb)
            .any(|e| matches!(e, Event::Established { .. })));
        // The dialer meant to reach "b", and "x" answered.
        let mut want = cfg("a", b"s");
        want.expected_peer = Some("b".into());
        let (mut a, _) = pair_with(want, cfg("x", b"s"));
        assert!(events(&mut a).contains(&Event::Closed(Closed::Local(GoodbyeReason::ViewMismatch))));
        // Another job.
        let mut job = cfg("b", b"s");
        job.job_id = "other".into();
        let (a, _) = pair_with(cfg("a", b"s"), job);
        assert!(a.is_closed());
    }

    #[test]
    fn protection_mismatch_is_refused_by_the_listener() {
        let mut off = cfg("b", b"s");
        off.protection = Protection::Authenticated;
        let (_, mut b) = pair_with(cfg("a", b"s"), off);
        assert!(events(&mut b).contains(&Event::Closed(Closed::Channel(
            ChannelError::ProtectionMismatch { theirs: 1 }
        ))));
    }

    #[test]
    fn a_connection_to_ourselves_closes() {
        let (a, b) = pair_with(cfg("a", b"s"), cfg("a", b"s"));
        assert!(a.is_closed() && b.is_closed());
    }

    fn get(request: u64) -> Get {
        Get {
            request,
            fingerprint: 9,
            sample: request,
            length: 3,
            due: 10 * S,
        }
    }

    #[test]
    fn requests_data_and_credits_flow() {
        let (mut a, mut b) = pair(b"k", b"k");
        events(&mut a);
        events(&mut b);
        for r in 0..4 {
            a.send_get(get(r), S).unwrap();
        }
        assert_eq!(a.send_get(get(9), S), Err(ConnError::NoCredit));
        pump(&mut a, &mut b, 2 * S);
        let reqs = events(&mut b);
        assert_eq!(reqs.len(), 4);
        // Due 10 s at a's 1 s: 9 s left, so 11 s on b's clock (received at 2 s).
        assert_eq!(
            reqs[0],
            Event::Request(Get {
                due: 11 * S,
                ..get(0)
            })
        );
        b.send_data(DataHeader {
            request: 0,
            sample: 0,
            length: 3,
            crc: 5,
            store_wait_us: 0,
        })
        .unwrap();
        b.send_miss(1, 1, MissReason::NotKept).unwrap();
        let sent = pump(&mut b, &mut a, 2 * S);
        assert_eq!(sent.len(), 1);
        let ev = a.poll_event().unwrap();
        assert_eq!(
            ev,
            Event::Data(DataHeader {
                request: 0,
                sample: 0,
                length: 3,
                crc: 5,
                store_wait_us: 0,
            })
        );
        assert_eq!(a.payload(), Some(&[0u8, 0, 0][..]));
        assert_eq!(
            events(&mut a),
            [
                Event::Miss {
                    request: 1,
                    sample: 1,
                    reason: MissReason::NotKept
                },
                Event::Credit(2)
            ]
        );
        // Two answers returned two credits.
        assert_eq!(a.credit(), 2);
        assert_eq!(b.send_miss(7, 7, MissReason::Late), Ok(()));
        assert_eq!(b.send_miss(8, 8, MissReason::Late), Ok(()));
        assert_eq!(
            b.send_miss(9, 9, MissReason::Late),
            Err(ConnError::NothingToAnswer)
        );
    }

    #[test]
    fn vector_get_and_credit_overrun() {
        let (mut a, mut b) = pair(b"k", b"k");
        let items: Vec<Want> = (0..3)
            .map(|r| Want {
                request: r,
                sample: r,
                length: 1,
                due: S,
            })
            .collect();
        a.send_get_many(9, &items, 0).unwrap();
        assert_eq!(a.credit(), 1);
        assert_eq!(a.send_get_many(9, &items, 0), Err(ConnError::NoCredit));
        pump(&mut a, &mut b, 0);
        let reqs: Vec<_> = events(&mut b)
            .into_iter()
            .filter(|e| matches!(e, Event::Request(_)))
            .collect();
        assert_eq!(reqs.len(), 3);
        // A peer sending past its credit is closed: a's credit is spent, so
        // its frame is forged into its records by hand.
        a.credit_owed = 0;
        a.send_credit = 3;
        a.send_get_many(9, &items, 0).unwrap();
        pump(&mut a, &mut b, 0);
        assert!(
            events(&mut b).contains(&Event::Closed(Closed::Local(GoodbyeReason::ProtocolError)))
        );
    }

    #[test]
    fn large_payloads_cross_many_records_and_frames_resume_after_them() {
        let (mut a, mut b) = pair(b"k", b"k");
        let len = 3 * MAX_RECORD_PLAINTEXT as u64 + 77;
        let bytes = answered_block(&mut a, &mut b, len);
        let Some(Transmit::Bytes(hdr)) = b.poll_transmit() else {
            panic!("no header")
        };
        let Some(Transmit::Payload(h)) = b.poll_transmit() else {
            panic!("no payload")
        };
        assert_eq!(
            b.poll_transmit(),
            None,
            "nothing while the payload is unsealed"
        );
        assert_eq!(b.payload_to_seal(), len);
        let mut w = hdr;
        // Sealed in two pieces of odd sizes.
        b.seal_payload(100_001, &mut w, |at, d| {
            d.copy_from_slice(&bytes[at as usize..at as usize + d.len()])
        })
        .unwrap();
        assert!(
            b.seal_payload(len, &mut Vec::new(), |_, _| {}).is_err(),
            "more than is left"
        );
        b.seal_payload(len - 100_001, &mut w, |at, d| {
            d.copy_from_slice(&bytes[at as usize..at as usize + d.len()])
        })
        .unwrap();
        assert_eq!(h.length, len);
        w.extend_from_slice(&wire_of(&mut b));
        // Fed a few bytes at a time.
        let mut got = Vec::new();
        let mut evs = Vec::new();
        for piece in w.chunks(4093) {
            a.handle_input(piece, 0);
            loop {
                while let Some(p) = a.payload() {
                    got.extend_from_slice(p);
                }
                if a.payload_remaining() > 0 {
                    break;
                }
                match a.poll_event() {
                    Some(e) => evs.push(e),
                    None => break,
                }
            }
        }
        assert_eq!(got, bytes);
        assert!(matches!(evs[0], Event::Data(_)));
        assert!(matches!(evs[1], Event::Miss { request: 1, .. }), "{evs:?}");
    }

    /// `b` answers `a`'s get 0 with a block of `len` bytes and a miss of
    /// get 1; the block's bytes.
    fn answered_block(a: &mut Conn, b: &mut Conn, len: u64) -> Vec<u8> {
        events(a);
        a.send_get(get(0), 0).unwrap();
        a.send_get(get(1), 0).unwrap();
        pump(a, b, 0);
        events(b);
        b.send_data(DataHeader {
            request: 0,
            sample: 5,
            length: len,
            crc: 0,
            store_wait_us: 0,
        })
        .unwrap();
        b.send_miss(1, 1, MissReason::Evicted).unwrap();
        (0..len).map(|i| (i * 13 % 253) as u8).collect()
    }

    #[test]
    fn payloads_sealed_from_a_slice_are_the_same_records_and_open_into_the_extent() {
        let len = 2 * MAX_RECORD_PLAINTEXT as u64 + 1001;
        for protection in [Protection::Encrypted, Protection::Authenticated] {
            let (ca, cb) = cfgs(b"k", protection);
            // Two pairs with the same keys (same entropy): one seals with
            // the fill closure into a Vec, the other from a slice.
            let (mut a1, mut b1) = pair_with(ca.clone(), cb.clone());
            let (mut a2, mut b2) = pair_with(ca, cb);
            let bytes = answered_block(&mut a1, &mut b1, len);
            answered_block(&mut a2, &mut b2, len);
            let (mut w1, mut w2) = (Vec::new(), Vec::new());
            for (b, w, slice) in [(&mut b1, &mut w1, false), (&mut b2, &mut w2, true)] {
                let Some(Transmit::Bytes(hdr)) = b.poll_transmit() else {
                    panic!("no header")
                };
                w.extend_from_slice(&hdr);
                assert!(matches!(b.poll_transmit(), Some(Transmit::Payload(_))));
                // Two pieces of odd sizes, as a transport seals chunk by chunk.
                for (from, to) in [(0, 70_001), (70_001, len as usize)] {
                    if slice {
                        let mut out = vec![0xaa; Conn::sealed_len(to - from) + 3];
                        let n = b.seal_payload_into(&bytes[from..to], &mut out).unwrap();
                        assert_eq!(n, Conn::sealed_len(to - from));
                        assert!(out[n..].iter().all(|&x| x == 0xaa));
                        w.extend_from_slice(&out[..n]);
                    } else {
                        b.seal_payload((to - from) as u64, w, |at, d| {
                            let at = at as usize;
                            d.copy_from_slice(&bytes[at..at + d.len()])
                        })
                        .unwrap();
                    }
                }
                assert_eq!(b.payload_to_seal(), 0);
                w.extend_from_slice(&wire_of(b));
            }
            assert_eq!(w1, w2, "{protection:?}");
            // Received through payload_into, in reads of odd sizes, into an
            // extent; a small destination piece now and then takes the
            // copying path.
            let mut extent = vec![0u8; len as usize];
            let mut got = 0;
            let mut evs = Vec::new();
            let mut turn = 0;
            for piece in w2.chunks(50_000) {
                a2.input_buffer()[..piece.len()].copy_from_slice(piece);
                a2.input_written(piece.len(), 0);
                loop {
                    loop {
                        turn += 1;
                        let total = extent.len();
                        let room = if turn % 3 == 0 {
                            7.min(total - got)
                        } else {
                            total - got
                        };
                        let n = a2.payload_into(&mut extent[got..got + room]);
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                    if a2.payload_remaining() > 0 {
                        break;
                    }
                    match a2.poll_event() {
                        Some(e) => evs.push(e),
                        None => break,
                    }
                }
            }
            assert_eq!(got, len as usize);
            assert_eq!(extent, bytes, "{protection:?}");
            assert!(matches!(evs[0], Event::Data(_)), "{evs:?}");
            assert!(
                evs.iter()
                    .any(|e| matches!(e, Event::Miss { request: 1, .. })),
                "{evs:?}"
            );
            assert_eq!(a2.payload_into(&mut extent), 0, "nothing after the payload");
        }
    }

    #[test]
    fn seal_payload_into_refuses_what_it_cannot_write() {
        let (mut a, mut b) = pair(b"k", b"k");
        let mut out = vec![0; 1000];
        assert_eq!(
            b.seal_payload_into(b"x", &mut out),
            Err(ConnError::PayloadOrder),
            "no payload handed out"
        );
        answered_block(&mut a, &mut b, 100);
        let mut w = Vec::new();
        while let Some(Transmit::Bytes(x)) = b.poll_transmit() {
            w.extend_from_slice(&x);
        }
        assert_eq!(
            b.seal_payload_into(&[0; 101], &mut out),
            Err(ConnError::PayloadOrder),
            "more than the payload"
        );
        assert_eq!(
            b.seal_payload_into(&[0; 100], &mut out[..117]),
            Err(ConnError::OutputTooShort(118))
        );
        // Nothing was sealed by the refusals: the whole payload still goes.
        assert_eq!(b.payload_to_seal(), 100);
        let n = b.seal_payload_into(&[4; 100], &mut out).unwrap();
        w.extend_from_slice(&out[..n]);
        w.extend_from_slice(&wire_of(&mut b));
        a.handle_input(&w, 0);
        assert!(matches!(a.poll_event(), Some(Event::Data(_))));
        let mut dst = [0u8; 100];
        assert_eq!(a.payload_into(&mut dst), 100);
        assert_eq!(dst, [4; 100]);
    }

    #[test]
    fn a_payload_record_failing_its_tag_closes_payload_into() {
        let (mut a, mut b) = pair(b"k", b"k");
        answered_block(&mut a, &mut b, 5000);
        let mut w = wire_of(&mut b);
        // The payload's record is the second; flip a byte of its body.
        let first = 2 + usize::from(u16::from_be_bytes([w[0], w[1]]));
        w[first + 10] ^= 1;
        a.handle_input(&w, 0);
        assert!(matches!(a.poll_event(), Some(Event::Data(_))));
        let mut dst = vec![0u8; 5000];
        assert_eq!(a.payload_into(&mut dst), 0);
        assert!(a.is_closed());
        assert!(events(&mut a).contains(&Event::Closed(Closed::Channel(ChannelError::Unauthentic))));
    }

    #[test]
    fn pings_from_a_peer_that_never_reads_coalesce() {
        let (mut a, mut b) = pair(b"k", b"k");
        events(&mut b);
        wire_of(&mut b);
        let mut pings = Vec::new();
        for t in 0..10_000u64 {
            a.handle_timeout(t * 6 * S);
            pings.extend_from_slice(&wire_of(&mut a));
            a.last_recv = t * 6 * S;
        }
        b.handle_input(&pings, 0);
        events(&mut b);
        let w = wire_of(&mut b);
        assert!(w.len() < 200, "{} bytes answered 10,000 pings", w.len());
    }

    #[test]
    fn keepalive_and_timeouts() {
        let (mut a, mut b) = pair(b"k", b"k");
        while a.poll_transmit().is_some() {}
        let t = a.poll_timeout().unwrap();
        assert_eq!(t, 5 * S);
        a.handle_timeout(t);
        pump(&mut a, &mut b, t);
        pump(&mut b, &mut a, t + 1000);
        assert!(events(&mut a).contains(&Event::Rtt(1000)));
        a.handle_timeout(t + 31 * S);
        assert!(events(&mut a).contains(&Event::Closed(Closed::Local(GoodbyeReason::Timeout))));
        assert_eq!(a.poll_timeout(), None);

        let mut c = Conn::accept(cfg("c", b"k"), [1; 32], 0).unwrap();
        assert_eq!(c.poll_timeout(), Some(5 * S));
        c.handle_timeout(5 * S);
        assert!(c.is_closed());
    }

    #[test]
    fn malformed_frames_inside_records_close() {
        let (mut a, mut b) = pair(b"k", b"k");
        // Frames in authentic records that do not decode.
        a.inject_plaintext_for_fuzzing(&[FORMAT_VERSION_FOR_TESTS, 200, 0, 0, 0, 0, 0, 0]);
        pump(&mut a, &mut b, 0);
        assert!(events(&mut b).contains(&Event::Closed(Closed::Malformed(
            FrameError::UnknownKind(200)
        ))));
    }

    const FORMAT_VERSION_FOR_TESTS: u8 = crate::frame::FORMAT_VERSION;

    #[test]
    fn cancels_reach_the_owner_for_outstanding_requests_only() {
        let (mut a, mut b) = pair(b"k", b"k");
        events(&mut a);
        events(&mut b);
        a.send_get(get(1), S).unwrap();
        a.send_get(get(2), S).unwrap();
        a.send_cancel(1).unwrap();
        pump(&mut a, &mut b, S);
        assert_eq!(
            events(&mut b),
            [
                Event::Request(get(1)),
                Event::Request(get(2)),
                Event::Cancel(1)
            ]
        );
        // The miss answering the cancel returns the credit.
        b.send_miss(1, 1, MissReason::Cancelled).unwrap();
        pump(&mut b, &mut a, S);
        assert!(events(&mut a).contains(&Event::Miss {
            request: 1,
            sample: 1,
            reason: MissReason::Cancelled
        }));
        assert_eq!(a.credit(), 3);
        // One request outstanding: of three cancels (a crossing answer
        // makes a surplus legitimate), one is passed on, none is fatal.
        for r in [2, 2, 7] {
            a.send_cancel(r).unwrap();
        }
        pump(&mut a, &mut b, S);
        assert_eq!(events(&mut b), [Event::Cancel(2)]);
        assert!(b.is_established());
        // A cancel body that is not one u64 is malformed: the connection
        // closes with a protocol error, and says why.
        let mut bad = Frame::Cancel(2).to_bytes().unwrap();
        bad[4] = 7;
        bad.pop();
        a.inject_plaintext_for_fuzzing(&bad);
        pump(&mut a, &mut b, S);
        assert!(events(&mut b).contains(&Event::Closed(Closed::Malformed(
            FrameError::Truncated { kind: 12 }
        ))));
        pump(&mut b, &mut a, S);
        assert!(
            events(&mut a).contains(&Event::Closed(Closed::Remote(GoodbyeReason::ProtocolError)))
        );
        // Nothing to cancel on a closed connection.
        assert_eq!(a.send_cancel(2), Err(ConnError::NotEstablished));
    }

    #[test]
    fn job_status_reaches_the_peer_and_stale_ones_are_dropped() {
        use crate::status::JobStatus;
        let (mut a, mut b) = pair(b"k", b"k");
        events(&mut a);
        events(&mut b);
        let st = |seq| JobStatus {
            seq,
            ..JobStatus::default()
        };
        a.send_job_status(&st(5)).unwrap();
        a.send_job_status(&st(3)).unwrap();
        a.send_job_status(&st(6)).unwrap();
        pump(&mut a, &mut b, S);
        assert_eq!(
            events(&mut b),
            [Event::JobStatus(st(5)), Event::JobStatus(st(6))]
        );
        // Over the bounds: refused before anything is queued.
        let mut big = st(7);
        big.waits = vec![
            crate::status::RankWait {
                dataset: "d".into(),
                rank: 0,
                quantiles_us: [0; 3],
                verdict: 0,
            };
            crate::status::MAX_STATUS_WAITS + 1
        ];
        assert!(matches!(
            a.send_job_status(&big),
            Err(ConnError::Frame(FrameError::BadStatus(_)))
        ));
        // A malformed status closes the connection as a protocol error.
        let mut bad = Frame::JobStatus(st(8)).to_bytes().unwrap();
        bad[HEADER_LEN + 8] = 200; // 200 plans
        a.inject_plaintext_for_fuzzing(&bad);
        pump(&mut a, &mut b, S);
        assert!(
            events(&mut b).contains(&Event::Closed(Closed::Malformed(FrameError::BadStatus(
                "too many plans"
            ))))
        );
    }

    #[test]
    fn the_input_buffer_stays_small_until_the_handshake_is_done() {
        let mut l = Conn::accept(cfg("l", b"k"), [1; 32], 0).unwrap();
        assert_eq!(l.input_buffer().len(), PREAMBLE_LEN + LEN_PREFIX);
        l.input_written(0, 0);
        let mut d = Conn::dial(cfg("d", b"k"), [2; 32], 0).unwrap();
        let m1 = wire_of(&mut d);
        // Byte by byte through the zero-copy buffer.
        for &byte in &m1 {
            let buf = l.input_buffer();
            assert!(buf.len() <= PREAMBLE_LEN + LEN_PREFIX + MAX_HANDSHAKE_MESSAGE);
            buf[0] = byte;
            l.input_written(1, 0);
        }
        assert!(l.is_established());
        assert!(l.input_buffer().len() > MAX_RECORD);
        l.input_written(0, 0);
        pump(&mut l, &mut d, 0);
        assert!(d.is_established());
    }

    #[test]
    fn bad_configs_are_refused() {
        assert_eq!(
            Conn::dial(cfg("a", b""), [0; 32], 0).unwrap_err(),
            ConnError::EmptySecret
        );
        let mut c = cfg("a", b"k");
        c.keepalive = c.idle_timeout;
        assert_eq!(
            Conn::accept(c, [0; 32], 0).unwrap_err(),
            ConnError::BadTimeouts
        );
        assert_eq!(
            Conn::dial(cfg("", b"k"), [0; 32], 0).unwrap_err(),
            ConnError::BadId
        );
    }
}
