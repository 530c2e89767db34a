//! One peer connection as a state machine: bytes in, events and bytes out,
//! the clock passed in.
//!
//! ```text
//!   new() ──sends Hello──▶ AwaitHello ──their Hello ok, sends Auth──▶ AwaitAuth
//!                              │                                        │
//!                              │ bad version / job / view / peer        │ their Auth verifies
//!                              ▼                                        ▼
//!                           Closed ◀──── wrong MAC, bad bytes, ──── Established
//!                                        timeout, goodbye            (requests, data,
//!                                                                     misses, credit,
//!                                                                     ping/pong)
//! ```
//!
//! # Handshake
//!
//! Both sides send a [`Hello`] at once, each with a fresh 32-byte nonce the
//! caller supplies. On the other's hello each side checks protocol version,
//! job id and view digest, then answers with
//!
//! ```text
//! Auth = HMAC-SHA256(secret, "granary-peer-auth-v1\0" || sender's hello frame || receiver's hello frame)
//! ```
//!
//! over the exact frame bytes (header included) of both hellos, sender's
//! first. Each side verifies the other's in constant time. The nonces make
//! each answer fresh; the order of the hellos in the transcript makes a
//! reflected answer fail. Nothing but hello, auth and goodbye is accepted
//! before both answers verified: a wrong secret closes the connection with
//! nothing served.
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
//! * Answers: [`Conn::send_data`] queues a [`Transmit::Bytes`] with the data
//!   header, then a [`Transmit::Payload`] telling the transport to write
//!   the payload bytes from the pinned extent. On the receiving side
//!   [`Event::Data`] is followed by the payload: [`Conn::payload`] gives
//!   the bytes already buffered, the transport reads the rest straight into
//!   the reserved extent and reports them with [`Conn::payload_direct`];
//!   events resume after the payload.
//! * Keepalive: after [`ConnConfig::keepalive`] without sending, a ping is
//!   sent; after [`ConnConfig::idle_timeout`] without receiving, the
//!   connection closes. Pongs give [`Event::Rtt`].

use std::collections::VecDeque;
use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::frame::{
    DataHeader, Decoded, Decoder, Frame, FrameError, Get, GoodbyeReason, Hello, MissReason,
    PayloadOrderError, Want, MAX_ID_LEN, MAX_VECTOR, PROTOCOL_VERSION,
};

/// Nanoseconds since an origin the caller picks (monotonic).
pub type Nanos = u64;

const AUTH_LABEL: &[u8] = b"granary-peer-auth-v1\0";

/// The HMAC a sender answers with (see the module documentation).
pub fn auth_mac(secret: &[u8], sender_hello: &[u8], receiver_hello: &[u8]) -> [u8; 32] {
    let mut m = mac(secret);
    m.update(sender_hello);
    m.update(receiver_hello);
    m.finalize().into_bytes().into()
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    m.update(AUTH_LABEL);
    m
}

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
}

impl ConnConfig {
    /// A configuration with the default timeouts (5 s handshake, 30 s
    /// idle, 5 s keepalive) and an initial credit of 256.
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
    /// Payload bytes reported out of order.
    PayloadOrder,
    /// The frame cannot be encoded (length over the limit).
    Frame(FrameError),
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
            ConnError::Frame(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnError {}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// This side closed it (and said goodbye with this reason).
    Local(GoodbyeReason),
    /// The peer said goodbye.
    Remote(GoodbyeReason),
    /// The peer sent bytes that are not frames.
    Malformed(FrameError),
}

/// What the connection tells its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Both sides authenticated.
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
    /// The connection is closed; no more events follow.
    Closed(Closed),
}

/// What the transport must write, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// Frame bytes.
    Bytes(Vec<u8>),
    /// `header.length` payload bytes of `header.sample`, from its pinned
    /// extent (the data header was in the previous bytes).
    Payload(DataHeader),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitAuth,
    Established,
    Closed,
}

/// A peer connection. See the module documentation.
#[derive(Debug)]
pub struct Conn {
    cfg: ConnConfig,
    state: State,
    decoder: Decoder,
    events: VecDeque<Event>,
    out: VecDeque<Transmit>,
    our_hello: Vec<u8>,
    our_nonce: [u8; 32],
    /// The peer's hello frame bytes (empty until received).
    peer_hello: Vec<u8>,
    peer: Option<Hello>,
    created: Nanos,
    now: Nanos,
    last_recv: Nanos,
    last_send: Nanos,
    /// Requests we may still send.
    send_credit: u64,
    /// Requests of the peer received and not yet answered.
    peer_outstanding: u64,
    /// Answers sent whose credit is not yet granted back.
    credit_owed: u32,
}

impl Conn {
    /// A new connection (either side), sending its hello at once. `nonce`
    /// must be fresh randomness.
    pub fn new(cfg: ConnConfig, nonce: [u8; 32], now: Nanos) -> Result<Conn, ConnError> {
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
        let hello = Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            job_id: cfg.job_id.clone(),
            node_id: cfg.node_id.clone(),
            view_digest: cfg.view_digest,
            incarnation: cfg.incarnation,
            nonce,
        });
        let our_hello = hello.to_bytes().map_err(ConnError::Frame)?;
        let mut c = Conn {
            cfg,
            state: State::AwaitHello,
            decoder: Decoder::new(),
            events: VecDeque::new(),
            out: VecDeque::new(),
            our_hello: our_hello.clone(),
            our_nonce: nonce,
            peer_hello: Vec::new(),
            peer: None,
            created: now,
            now,
            last_recv: now,
            last_send: now,
            send_credit: 0,
            peer_outstanding: 0,
            credit_owed: 0,
        };
        c.push_bytes(&our_hello);
        Ok(c)
    }

    /// True once both sides authenticated, until closed.
    pub fn is_established(&self) -> bool {
        self.state == State::Established
    }

    /// True once closed (queued bytes, such as a goodbye, may remain).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// The peer's hello, once received.
    pub fn peer(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// Requests this side may still send.
    pub fn credit(&self) -> u64 {
        self.send_credit
    }

    /// Feeds bytes read from the transport.
    pub fn handle_input(&mut self, bytes: &[u8], now: Nanos) {
        self.now = self.now.max(now);
        if self.state == State::Closed {
            return;
        }
        if !bytes.is_empty() {
            self.last_recv = self.now;
        }
        self.decoder.feed(bytes);
        self.process();
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.process();
        self.events.pop_front()
    }

    /// The next thing to write, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.credit_owed > 0 && self.state == State::Established {
            let f = Frame::Credit(self.credit_owed);
            self.credit_owed = 0;
            self.push_frame(&f);
        }
        self.out.pop_front()
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

    /// Closes with a goodbye (no-op when already closed).
    pub fn close(&mut self, reason: GoodbyeReason) {
        if self.state == State::Closed {
            return;
        }
        self.push_frame(&Frame::Goodbye(reason));
        self.state = State::Closed;
        self.events.push_back(Event::Closed(Closed::Local(reason)));
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
    /// [`Transmit::Payload`] for the transport to write the bytes.
    pub fn send_data(&mut self, header: DataHeader) -> Result<(), ConnError> {
        self.ready_to_answer()?;
        let bytes = Frame::Data(header).to_bytes().map_err(ConnError::Frame)?;
        self.answered();
        self.push_bytes(&bytes);
        self.out.push_back(Transmit::Payload(header));
        Ok(())
    }

    /// Sends this side's RDMA queue pair parameters (opaque bytes, 1 to
    /// [`crate::frame::MAX_RDMA_SETUP`]); only once authenticated, so no
    /// RDMA key or address leaves before the peer proved the job secret.
    pub fn send_rdma_setup(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        if self.state != State::Established {
            return Err(ConnError::NotEstablished);
        }
        let f = Frame::RdmaSetup(bytes.to_vec());
        f.to_bytes().map_err(ConnError::Frame)?;
        self.push_frame(&f);
        Ok(())
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

    /// After [`Event::Data`]: the payload bytes already buffered here, in
    /// order (copy them into the extent), or `None` when none are.
    pub fn payload(&mut self) -> Option<&[u8]> {
        if self.decoder.payload_remaining() == 0 {
            return None;
        }
        match self.decoder.next_item() {
            Ok(Some(Decoded::Payload(p))) => Some(p),
            _ => None,
        }
    }

    /// Payload bytes still expected for the current block.
    pub fn payload_remaining(&self) -> u64 {
        self.decoder.payload_remaining()
    }

    /// Records `n` payload bytes the transport read straight into the
    /// extent (only once [`Conn::payload`] returned `None`).
    pub fn payload_direct(&mut self, n: u64, now: Nanos) -> Result<(), ConnError> {
        self.decoder
            .payload_direct(n)
            .map_err(|_| ConnError::PayloadOrder)?;
        self.now = self.now.max(now);
        if n > 0 {
            self.last_recv = self.now;
        }
        Ok(())
    }

    fn ready_to_request(&self, n: u64) -> Result<(), ConnError> {
        if self.state != State::Established {
            return Err(ConnError::NotEstablished);
        }
        if self.send_credit < n {
            return Err(ConnError::NoCredit);
        }
        Ok(())
    }

    fn ready_to_answer(&self) -> Result<(), ConnError> {
        if self.state != State::Established {
            return Err(ConnError::NotEstablished);
        }
        if self.peer_outstanding == 0 {
            return Err(ConnError::NothingToAnswer);
        }
        Ok(())
    }

    fn answered(&mut self) {
        self.peer_outstanding -= 1;
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
        if let Some(Transmit::Bytes(last)) = self.out.back_mut() {
            last.extend_from_slice(b);
        } else {
            self.out.push_back(Transmit::Bytes(b.to_vec()));
        }
    }

    /// Decodes and handles buffered frames until a payload or the end.
    fn process(&mut self) {
        while self.state != State::Closed && self.decoder.payload_remaining() == 0 {
            match self.decoder.next_item() {
                Ok(Some(Decoded::Frame(f))) => self.on_frame(f),
                Ok(Some(Decoded::Payload(_))) | Ok(None) => return,
                Err(e) => {
                    self.push_frame(&Frame::Goodbye(GoodbyeReason::ProtocolError));
                    self.state = State::Closed;
                    self.events.push_back(Event::Closed(Closed::Malformed(e)));
                }
            }
        }
    }

    fn on_frame(&mut self, f: Frame) {
        match (self.state, f) {
            (_, Frame::Goodbye(r)) => {
                self.state = State::Closed;
                self.events.push_back(Event::Closed(Closed::Remote(r)));
            }
            (State::AwaitHello, Frame::Hello(h)) => self.on_hello(h),
            (State::AwaitAuth, Frame::Auth(tag)) => {
                // Constant-time comparison by the MAC library.
                let mut m = mac(&self.cfg.secret);
                m.update(&self.peer_hello);
                m.update(&self.our_hello);
                let ok = !self.peer_hello.is_empty() && m.verify_slice(&tag).is_ok();
                if !ok {
                    self.close(GoodbyeReason::AuthFailed);
                    return;
                }
                self.state = State::Established;
                if let Some(p) = &self.peer {
                    self.events.push_back(Event::Established {
                        peer: p.node_id.clone(),
                        incarnation: p.incarnation,
                        view_digest: p.view_digest,
                    });
                }
                if self.cfg.initial_credit > 0 {
                    self.push_frame(&Frame::Credit(self.cfg.initial_credit));
                }
            }
            (State::Established, Frame::Get(g)) => {
                if self.take_peer_requests(1) {
                    let due = self.now.saturating_add(g.due);
                    self.events.push_back(Event::Request(Get { due, ..g }));
                }
            }
            (State::Established, Frame::GetMany { fingerprint, items }) => {
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
            (State::Established, Frame::Data(d)) => self.events.push_back(Event::Data(d)),
            (
                State::Established,
                Frame::Miss {
                    request,
                    sample,
                    reason,
                },
            ) => self.events.push_back(Event::Miss {
                request,
                sample,
                reason,
            }),
            (State::Established, Frame::Credit(n)) => {
                self.send_credit = self.send_credit.saturating_add(u64::from(n));
                self.events.push_back(Event::Credit(self.send_credit));
            }
            (State::Established, Frame::Ping(t)) => self.push_frame(&Frame::Pong(t)),
            (State::Established, Frame::RdmaSetup(b)) => {
                self.events.push_back(Event::RdmaSetup(b));
            }
            (State::Established, Frame::Pong(t)) => {
                if t <= self.now {
                    self.events.push_back(Event::Rtt(self.now - t));
                }
            }
            // Anything else (a second hello, data before auth, ...) breaks
            // the protocol; nothing is served.
            _ => self.close(GoodbyeReason::ProtocolError),
        }
    }

    fn on_hello(&mut self, h: Hello) {
        if h.version != PROTOCOL_VERSION {
            self.close(GoodbyeReason::VersionMismatch);
            return;
        }
        if h.job_id != self.cfg.job_id || h.view_digest != self.cfg.view_digest {
            self.close(GoodbyeReason::ViewMismatch);
            return;
        }
        if self
            .cfg
            .expected_peer
            .as_ref()
            .is_some_and(|want| *want != h.node_id)
        {
            self.close(GoodbyeReason::ViewMismatch);
            return;
        }
        if h.node_id == self.cfg.node_id || h.nonce == self.our_nonce {
            // A connection to ourselves, or our own hello reflected.
            self.close(GoodbyeReason::ProtocolError);
            return;
        }
        let theirs = match Frame::Hello(h.clone()).to_bytes() {
            Ok(b) => b,
            Err(_) => {
                self.close(GoodbyeReason::ProtocolError);
                return;
            }
        };
        let ours = auth_mac(&self.cfg.secret, &self.our_hello, &theirs);
        self.peer_hello = theirs;
        self.peer = Some(h);
        self.state = State::AwaitAuth;
        self.push_frame(&Frame::Auth(ours));
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

#[cfg(test)]
mod tests {
    use super::*;

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
                    to.handle_input(&vec![h.sample as u8; h.length as usize], now);
                    payloads.push(h);
                }
            }
        }
        payloads
    }

    fn events(c: &mut Conn) -> Vec<Event> {
        std::iter::from_fn(|| c.poll_event()).collect()
    }

    fn pair(sa: &[u8], sb: &[u8]) -> (Conn, Conn) {
        let mut a = Conn::new(cfg("a", sa), [1; 32], 0).unwrap();
        let mut b = Conn::new(cfg("b", sb), [2; 32], 0).unwrap();
        for _ in 0..3 {
            pump(&mut a, &mut b, 0);
            pump(&mut b, &mut a, 0);
        }
        (a, b)
    }

    #[test]
    fn handshake_establishes_with_the_right_secret() {
        let (mut a, mut b) = pair(b"s3cret", b"s3cret");
        assert!(a.is_established() && b.is_established());
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

    #[test]
    fn rdma_setup_goes_only_after_authentication() {
        let mut a = Conn::new(cfg("a", b"s"), [1; 32], 0).unwrap();
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
        // Before authentication it breaks the protocol.
        let mut c = Conn::new(cfg("c", b"s"), [3; 32], 0).unwrap();
        c.handle_input(&Frame::RdmaSetup(vec![1; 36]).to_bytes().unwrap(), 0);
        assert!(c.is_closed());
        assert!(!events(&mut c)
            .iter()
            .any(|e| matches!(e, Event::RdmaSetup(_))));
    }

    #[test]
    fn wrong_secret_closes_and_serves_nothing() {
        let (mut a, b) = pair(b"right", b"wrong");
        assert!(a.is_closed() && b.is_closed());
        assert!(events(&mut a).contains(&Event::Closed(Closed::Local(GoodbyeReason::AuthFailed))));
        assert_eq!(a.send_get(get(1), 0), Err(ConnError::NotEstablished));
        // A request smuggled in after the hello is not served either.
        let mut c = Conn::new(cfg("c", b"right"), [3; 32], 0).unwrap();
        let mut d = Conn::new(cfg("d", b"wrong"), [4; 32], 0).unwrap();
        pump(&mut d, &mut c, 0);
        c.handle_input(&Frame::Get(get(1)).to_bytes().unwrap(), 0);
        let ev = events(&mut c);
        assert!(!ev.iter().any(|e| matches!(e, Event::Request(_))), "{ev:?}");
        assert!(c.is_closed());
    }

    #[test]
    fn view_or_job_mismatch_closes() {
        let mut a = Conn::new(cfg("a", b"s"), [1; 32], 0).unwrap();
        let mut other = cfg("b", b"s");
        other.view_digest = [8; 32];
        let mut b = Conn::new(other, [2; 32], 0).unwrap();
        pump(&mut b, &mut a, 0);
        assert!(events(&mut a).contains(&Event::Closed(Closed::Local(GoodbyeReason::ViewMismatch))));
        let mut a = Conn::new(cfg("a", b"s"), [1; 32], 0).unwrap();
        let mut want = cfg("x", b"s");
        want.expected_peer = Some("b".into());
        let mut x = Conn::new(want, [5; 32], 0).unwrap();
        pump(&mut a, &mut x, 0);
        assert!(x.is_closed());
    }

    #[test]
    fn reflected_hello_fails() {
        let mut a = Conn::new(cfg("a", b"s"), [1; 32], 0).unwrap();
        let Some(Transmit::Bytes(hello)) = a.poll_transmit() else {
            panic!("no hello")
        };
        a.handle_input(&hello, 0);
        assert!(a.is_closed());
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
                crc: 5
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
        // A peer sending past its credit is closed.
        let raw = Frame::GetMany {
            fingerprint: 9,
            items: items.clone(),
        }
        .to_bytes()
        .unwrap();
        b.handle_input(&raw, 0);
        assert!(
            events(&mut b).contains(&Event::Closed(Closed::Local(GoodbyeReason::ProtocolError)))
        );
    }

    #[test]
    fn payload_read_directly() {
        let (mut a, mut b) = pair(b"k", b"k");
        a.send_get(get(0), 0).unwrap();
        pump(&mut a, &mut b, 0);
        events(&mut b);
        b.send_data(DataHeader {
            request: 0,
            sample: 0,
            length: 100,
            crc: 0,
        })
        .unwrap();
        let Some(Transmit::Bytes(hdr)) = b.poll_transmit() else {
            panic!()
        };
        assert!(matches!(b.poll_transmit(), Some(Transmit::Payload(_))));
        events(&mut a);
        a.handle_input(&hdr, 0);
        assert!(matches!(a.poll_event(), Some(Event::Data(_))));
        assert_eq!(a.payload(), None);
        assert_eq!(a.payload_remaining(), 100);
        a.payload_direct(100, 0).unwrap();
        a.handle_input(
            &Frame::Goodbye(GoodbyeReason::Normal).to_bytes().unwrap(),
            0,
        );
        assert_eq!(
            events(&mut a),
            [Event::Closed(Closed::Remote(GoodbyeReason::Normal))]
        );
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

        let mut c = Conn::new(cfg("c", b"k"), [1; 32], 0).unwrap();
        assert_eq!(c.poll_timeout(), Some(5 * S));
        c.handle_timeout(5 * S);
        assert!(c.is_closed());
    }

    #[test]
    fn malformed_bytes_close() {
        let (mut a, _) = pair(b"k", b"k");
        a.handle_input(&[1, 200, 0, 0, 0, 0, 0, 0], 0);
        assert!(events(&mut a).contains(&Event::Closed(Closed::Malformed(
            FrameError::UnknownKind(200)
        ))));
    }

    #[test]
    fn bad_configs_are_refused() {
        assert_eq!(
            Conn::new(cfg("a", b""), [0; 32], 0).unwrap_err(),
            ConnError::EmptySecret
        );
        let mut c = cfg("a", b"k");
        c.keepalive = c.idle_timeout;
        assert_eq!(
            Conn::new(c, [0; 32], 0).unwrap_err(),
            ConnError::BadTimeouts
        );
        assert_eq!(
            Conn::new(cfg("", b"k"), [0; 32], 0).unwrap_err(),
            ConnError::BadId
        );
    }
}
