//! The peer wire format: versioned, length-bounded frames and an
//! incremental decoder that never panics.
//!
//! Every frame is an 8-byte header and a body:
//!
//! ```text
//! offset 0  u8     format version (2)
//! offset 1  u8     kind
//! offset 2  u16 LE flags, must be 0
//! offset 4  u32 LE body length, at most MAX_BODY
//! offset 8  body   (little-endian fields, listed per kind on `Frame`)
//! ```
//!
//! A [`Frame::Data`] header is followed on the wire by `length` payload
//! bytes that are not part of the frame: the codec never copies them. The
//! [`Decoder`] hands back the payload bytes it already buffered (to be
//! copied once into the reserved arena extent) and lets the transport read
//! the rest straight into the extent ([`Decoder::payload_direct`]).
//!
//! The encoding is canonical: whatever decodes re-encodes to the same
//! bytes. Anything else is a typed [`FrameError`].

pub mod status;

use status::{JobStatus, StatusBody};
use std::fmt;

/// The frame format version this crate writes and reads.
pub const FORMAT_VERSION: u8 = 2;
/// The peer protocol version carried in [`Hello`]: 3 added
/// [`Frame::Cancel`] and [`MissReason::Cancelled`], 4 added
/// [`Frame::JobStatus`] (peers of another version are refused at the
/// handshake with a version mismatch).
pub const PROTOCOL_VERSION: u16 = 4;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 8;
/// Longest frame body.
pub const MAX_BODY: u32 = 64 * 1024;
/// Most items in one [`Frame::GetMany`].
pub const MAX_VECTOR: usize = 1024;
/// Longest payload a [`Frame::Data`] may announce (1 GiB).
pub const MAX_PAYLOAD: u64 = 1 << 30;
/// Longest job or node id in a [`Hello`].
pub const MAX_ID_LEN: usize = 255;

/// Who a side is: the payload of its handshake message
/// ([`crate::channel`]), so it travels encrypted and authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Peer protocol version spoken ([`PROTOCOL_VERSION`]).
    pub version: u16,
    /// The job both sides must belong to.
    pub job_id: String,
    /// The sender's stable node id.
    pub node_id: String,
    /// Digest of the sender's membership view.
    pub view_digest: [u8; 32],
    /// The sender's incarnation (changes on every agent restart).
    pub incarnation: u64,
}

/// One sample wanted, with its dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Get {
    /// Requester's id for this request, echoed in the answer.
    pub request: u64,
    /// Dataset fingerprint.
    pub fingerprint: u64,
    /// Sample index.
    pub sample: u64,
    /// Length the requester expects (from its catalog).
    pub length: u64,
    /// When the requester needs it, in nanoseconds of the requester's
    /// clock as agreed on the connection (see [`crate::conn`]).
    pub due: u64,
}

/// One item of a [`Frame::GetMany`] (the dataset is given once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Want {
    /// Requester's id for this request.
    pub request: u64,
    /// Sample index.
    pub sample: u64,
    /// Expected length.
    pub length: u64,
    /// Due time.
    pub due: u64,
}

/// The header announcing a block; `length` payload bytes follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataHeader {
    /// The request answered.
    pub request: u64,
    /// Sample index.
    pub sample: u64,
    /// Payload bytes that follow.
    pub length: u64,
    /// Block CRC ([`crate::block`]).
    pub crc: u32,
    /// Microseconds the request waited at the owner for the sample's store
    /// read (0 when it was in the owner's arena): the requester subtracts
    /// it from the block's latency, so that an owner reading cold samples
    /// is not taken for a slow peer ([`crate::request`]).
    pub store_wait_us: u32,
}

impl DataHeader {
    /// The header answering `get` with a block of block CRC `crc` that
    /// waited `store_wait_us` for the owner's store read.
    pub fn answering(get: &Get, crc: u32, store_wait_us: u32) -> DataHeader {
        DataHeader {
            request: get.request,
            sample: get.sample,
            length: get.length,
            crc,
            store_wait_us,
        }
    }
}

/// Nanoseconds as the whole microseconds a [`DataHeader`] carries
/// (saturating at `u32::MAX`, 71 minutes).
pub fn micros(nanos: u64) -> u32 {
    u32::try_from(nanos / 1000).unwrap_or(u32::MAX)
}

granary_base::code_enum! {
    /// Why an owner did not send a sample. The requester reads the store.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum MissReason: u8 {
        /// This node does not own the sample under its view.
        NotOwner = 1 => "not_owner",
        /// The owner does not keep this sample.
        NotKept = 2 => "not_kept",
        /// The owner kept it but it is no longer in its arena.
        Evicted = 3 => "evicted",
        /// The owner's queue is full.
        Overloaded = 4 => "overloaded",
        /// The owner is shutting down.
        ShuttingDown = 5 => "shutting_down",
        /// The owner's own store read failed.
        StoreError = 6 => "store_error",
        /// The expected length does not match the owner's catalog.
        LengthMismatch = 7 => "length_mismatch",
        /// The owner does not know the dataset.
        UnknownDataset = 8 => "unknown_dataset",
        /// The due time passed before the owner could send it.
        Late = 9 => "late",
        /// The requester cancelled the request ([`Frame::Cancel`]) before the
        /// owner began to send its block.
        Cancelled = 10 => "cancelled",
    }
    /// A short stable name (for metrics labels).
    pub fn as_str;
}

granary_base::code_enum! {
    /// Why a connection ends.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum GoodbyeReason: u8 {
        /// Orderly close.
        Normal = 0,
        /// The sender is shutting down.
        ShuttingDown = 1,
        /// The two sides hold different views or jobs.
        ViewMismatch = 2,
        /// The peer's authentication failed.
        AuthFailed = 3,
        /// The peer broke the protocol.
        ProtocolError = 4,
        /// The peer was silent too long.
        Timeout = 5,
        /// The peer speaks another protocol version.
        VersionMismatch = 6,
    }
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Kind 1. `u16 version, u8 len + job id, u8 len + node id,
    /// [32] view digest, u64 incarnation`. Only as a handshake payload.
    Hello(Hello),
    /// Kind 3. `u64 request, u64 fingerprint, u64 sample, u64 length,
    /// u64 due`.
    Get(Get),
    /// Kind 4. `u64 fingerprint, u16 count (1..=MAX_VECTOR), count x
    /// (u64 request, u64 sample, u64 length, u64 due)`.
    GetMany {
        /// Dataset of every item.
        fingerprint: u64,
        /// The samples wanted.
        items: Vec<Want>,
    },
    /// Kind 5. `u64 request, u64 sample, u64 length (<= MAX_PAYLOAD),
    /// u32 crc, u32 store_wait_us`; then `length` payload bytes outside the
    /// frame.
    Data(DataHeader),
    /// Kind 6. `u64 request, u64 sample, u8 reason`.
    Miss {
        /// The request answered.
        request: u64,
        /// Sample index.
        sample: u64,
        /// Why.
        reason: MissReason,
    },
    /// Kind 7. `u32 grant` (> 0): the receiver may send `grant` more
    /// requests.
    Credit(u32),
    /// Kind 8. `u64 token`.
    Ping(u64),
    /// Kind 9. `u64 token` echoed from the ping.
    Pong(u64),
    /// Kind 10. `u8 reason`.
    Goodbye(GoodbyeReason),
    /// Kind 11. `1..=MAX_RDMA_SETUP` opaque bytes: this side's RDMA queue
    /// pair parameters (sent only after authentication).
    RdmaSetup(Vec<u8>),
    /// Kind 12. `u64 request`: the requester no longer wants the block of
    /// its request `request` on this connection (it reads the store
    /// instead). The owner drops the request if it has not begun to send
    /// its block, and answers it with a [`MissReason::Cancelled`] miss;
    /// otherwise the block already going is the answer.
    Cancel(u64),
    /// Kind 13 (protocol version 4). The sender's job status: its plans'
    /// rank positions and its ranks' waits ([`crate::status`] has the
    /// layout). Each replaces the sender's previous one.
    JobStatus(JobStatus),
}

/// Longest [`Frame::RdmaSetup`] body.
pub const MAX_RDMA_SETUP: usize = 256;

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Hello(_) => 1,
            Frame::Get(_) => 3,
            Frame::GetMany { .. } => 4,
            Frame::Data(_) => 5,
            Frame::Miss { .. } => 6,
            Frame::Credit(_) => 7,
            Frame::Ping(_) => 8,
            Frame::Pong(_) => 9,
            Frame::Goodbye(_) => 10,
            Frame::RdmaSetup(_) => 11,
            Frame::Cancel(_) => 12,
            Frame::JobStatus(_) => 13,
        }
    }

    /// Appends the frame's bytes to `out`. Fails, writing nothing, for a
    /// frame the decoder would reject (ids too long or empty, a vector of
    /// no or too many items, a zero credit, a payload too long).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let mut body = Vec::with_capacity(64);
        match self {
            Frame::Hello(h) => {
                body.extend_from_slice(&h.version.to_le_bytes());
                put_id(&mut body, &h.job_id)?;
                put_id(&mut body, &h.node_id)?;
                body.extend_from_slice(&h.view_digest);
                body.extend_from_slice(&h.incarnation.to_le_bytes());
            }
            Frame::Get(g) => {
                for v in [g.request, g.fingerprint, g.sample, g.length, g.due] {
                    body.extend_from_slice(&v.to_le_bytes());
                }
            }
            Frame::GetMany { fingerprint, items } => {
                if items.is_empty() || items.len() > MAX_VECTOR {
                    return Err(FrameError::BadCount(items.len()));
                }
                body.extend_from_slice(&fingerprint.to_le_bytes());
                body.extend_from_slice(&(items.len() as u16).to_le_bytes());
                for w in items {
                    for v in [w.request, w.sample, w.length, w.due] {
                        body.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Frame::Data(d) => {
                if d.length > MAX_PAYLOAD {
                    return Err(FrameError::PayloadTooLong(d.length));
                }
                for v in [d.request, d.sample, d.length] {
                    body.extend_from_slice(&v.to_le_bytes());
                }
                body.extend_from_slice(&d.crc.to_le_bytes());
                body.extend_from_slice(&d.store_wait_us.to_le_bytes());
            }
            Frame::Miss {
                request,
                sample,
                reason,
            } => {
                body.extend_from_slice(&request.to_le_bytes());
                body.extend_from_slice(&sample.to_le_bytes());
                body.push(*reason as u8);
            }
            Frame::Credit(n) => {
                if *n == 0 {
                    return Err(FrameError::ZeroCredit);
                }
                body.extend_from_slice(&n.to_le_bytes());
            }
            Frame::Ping(t) | Frame::Pong(t) | Frame::Cancel(t) => {
                body.extend_from_slice(&t.to_le_bytes())
            }
            Frame::Goodbye(r) => body.push(*r as u8),
            Frame::RdmaSetup(b) => {
                if b.is_empty() || b.len() > MAX_RDMA_SETUP {
                    return Err(FrameError::BadRdmaSetup(b.len()));
                }
                body.extend_from_slice(b);
            }
            Frame::JobStatus(st) => {
                st.encode(&mut body)?;
                if body.len() > MAX_BODY as usize {
                    return Err(FrameError::BodyTooLong(body.len() as u32));
                }
            }
        }
        out.push(FORMAT_VERSION);
        out.push(self.kind());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(())
    }

    /// [`Frame::encode`] into a new vector.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FrameError> {
        let mut v = Vec::new();
        self.encode(&mut v)?;
        Ok(v)
    }
}

fn put_id(out: &mut Vec<u8>, s: &str) -> Result<(), FrameError> {
    if s.is_empty() || s.len() > MAX_ID_LEN {
        return Err(FrameError::BadId);
    }
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Why bytes are not a valid frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The header names a format version this crate does not read.
    UnsupportedVersion(u8),
    /// The header names no known frame kind.
    UnknownKind(u8),
    /// An RDMA setup body of no or more than [`MAX_RDMA_SETUP`] bytes.
    BadRdmaSetup(usize),
    /// Header flags must be zero.
    NonzeroFlags(u16),
    /// The body length exceeds [`MAX_BODY`].
    BodyTooLong(u32),
    /// The body ends before the frame's fields do.
    Truncated {
        /// Frame kind.
        kind: u8,
    },
    /// The body holds bytes past the frame's fields.
    TrailingBytes {
        /// Frame kind.
        kind: u8,
    },
    /// A hello id is empty, too long or not UTF-8.
    BadId,
    /// A vector-get with no or more than [`MAX_VECTOR`] items.
    BadCount(usize),
    /// An unknown miss reason code.
    BadMissReason(u8),
    /// An unknown goodbye reason code.
    BadGoodbyeReason(u8),
    /// A data header announcing more than [`MAX_PAYLOAD`] bytes.
    PayloadTooLong(u64),
    /// A credit frame granting nothing.
    ZeroCredit,
    /// A job-status body breaks its rules (what).
    BadStatus(&'static str),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::UnsupportedVersion(v) => write!(f, "frame format version {v} unsupported"),
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::BadRdmaSetup(n) => {
                write!(f, "RDMA setup of {n} bytes (1 to {MAX_RDMA_SETUP})")
            }
            FrameError::NonzeroFlags(x) => write!(f, "frame flags {x:#06x} must be zero"),
            FrameError::BodyTooLong(n) => write!(f, "frame body of {n} bytes exceeds {MAX_BODY}"),
            FrameError::Truncated { kind } => write!(f, "frame of kind {kind} is truncated"),
            FrameError::TrailingBytes { kind } => {
                write!(f, "frame of kind {kind} has trailing bytes")
            }
            FrameError::BadId => write!(f, "hello id empty, too long or not UTF-8"),
            FrameError::BadCount(n) => write!(f, "vector-get of {n} items (1..={MAX_VECTOR})"),
            FrameError::BadMissReason(c) => write!(f, "unknown miss reason {c}"),
            FrameError::BadGoodbyeReason(c) => write!(f, "unknown goodbye reason {c}"),
            FrameError::PayloadTooLong(n) => {
                write!(f, "data payload of {n} bytes exceeds {MAX_PAYLOAD}")
            }
            FrameError::ZeroCredit => write!(f, "credit frame grants nothing"),
            FrameError::BadStatus(why) => write!(f, "job-status frame: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

struct Body<'a> {
    b: &'a [u8],
    kind: u8,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.b.len() < n {
            return Err(FrameError::Truncated { kind: self.kind });
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn id(&mut self) -> Result<String, FrameError> {
        let n = self.u8()? as usize;
        if n == 0 {
            return Err(FrameError::BadId);
        }
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| FrameError::BadId)
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(FrameError::TrailingBytes { kind: self.kind })
        }
    }
}

impl StatusBody for Body<'_> {
    fn u8(&mut self) -> Result<u8, FrameError> {
        Body::u8(self)
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Body::u16(self)
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Body::u32(self)
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Body::u64(self)
    }
    fn name(&mut self) -> Result<String, FrameError> {
        self.id()
            .map_err(|_| FrameError::BadStatus("dataset name empty or not UTF-8"))
    }
}

/// Kinds this format defines (2, the authentication answer of format 1,
/// is retired: the channel authenticates; 12 came with protocol version
/// 3, 13 with 4).
fn known_kind(k: u8) -> bool {
    k == 1 || (3..=13).contains(&k)
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes
/// are needed, else the frame and the bytes it took (a data header's
/// payload is not included).
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        // Reject a bad version or kind as early as the bytes allow.
        if let Some(&v) = buf.first() {
            if v != FORMAT_VERSION {
                return Err(FrameError::UnsupportedVersion(v));
            }
        }
        if let Some(&k) = buf.get(1) {
            if !known_kind(k) {
                return Err(FrameError::UnknownKind(k));
            }
        }
        return Ok(None);
    };
    let version = header[0];
    let kind = header[1];
    if version != FORMAT_VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    if !known_kind(kind) {
        return Err(FrameError::UnknownKind(kind));
    }
    let flags = u16::from_le_bytes([header[2], header[3]]);
    if flags != 0 {
        return Err(FrameError::NonzeroFlags(flags));
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_BODY {
        return Err(FrameError::BodyTooLong(len));
    }
    let total = HEADER_LEN + len as usize;
    let Some(body) = buf.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let mut b = Body { b: body, kind };
    let frame = match kind {
        1 => Frame::Hello(Hello {
            version: b.u16()?,
            job_id: b.id()?,
            node_id: b.id()?,
            view_digest: b.arr()?,
            incarnation: b.u64()?,
        }),
        3 => Frame::Get(Get {
            request: b.u64()?,
            fingerprint: b.u64()?,
            sample: b.u64()?,
            length: b.u64()?,
            due: b.u64()?,
        }),
        4 => {
            let fingerprint = b.u64()?;
            let count = b.u16()? as usize;
            if count == 0 || count > MAX_VECTOR {
                return Err(FrameError::BadCount(count));
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(Want {
                    request: b.u64()?,
                    sample: b.u64()?,
                    length: b.u64()?,
                    due: b.u64()?,
                });
            }
            Frame::GetMany { fingerprint, items }
        }
        5 => {
            let d = DataHeader {
                request: b.u64()?,
                sample: b.u64()?,
                length: b.u64()?,
                crc: b.u32()?,
                store_wait_us: b.u32()?,
            };
            if d.length > MAX_PAYLOAD {
                return Err(FrameError::PayloadTooLong(d.length));
            }
            Frame::Data(d)
        }
        6 => {
            let request = b.u64()?;
            let sample = b.u64()?;
            let code = b.u8()?;
            let reason = MissReason::from_code(code).ok_or(FrameError::BadMissReason(code))?;
            Frame::Miss {
                request,
                sample,
                reason,
            }
        }
        7 => {
            let n = b.u32()?;
            if n == 0 {
                return Err(FrameError::ZeroCredit);
            }
            Frame::Credit(n)
        }
        8 => Frame::Ping(b.u64()?),
        9 => Frame::Pong(b.u64()?),
        12 => Frame::Cancel(b.u64()?),
        13 => Frame::JobStatus(crate::status::decode(&mut b)?),
        11 => {
            let n = b.b.len();
            if n == 0 || n > MAX_RDMA_SETUP {
                return Err(FrameError::BadRdmaSetup(n));
            }
            Frame::RdmaSetup(b.take(n)?.to_vec())
        }
        _ => {
            let code = b.u8()?;
            Frame::Goodbye(
                GoodbyeReason::from_code(code).ok_or(FrameError::BadGoodbyeReason(code))?,
            )
        }
    };
    b.end()?;
    Ok(Some((frame, total)))
}

/// What [`Decoder::next_item`] yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole frame. After a [`Frame::Data`], payload bytes come next.
    Frame(Frame),
    /// Buffered bytes of the current data payload, to be copied into the
    /// extent reserved for it.
    Payload(&'a [u8]),
}

/// Incremental decoder over a byte stream. Errors are sticky: after one,
/// every call returns it again.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    pos: usize,
    payload_left: u64,
    error: Option<FrameError>,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos >= self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Buffered bytes not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes still needed to complete the next frame: 0 while a payload is
    /// pending or a whole frame is buffered. Feeding no more than this
    /// keeps the bytes after a data header (its payload) out of the
    /// decoder's buffer.
    pub fn wanted(&self) -> usize {
        if self.payload_left > 0 || self.error.is_some() {
            return 0;
        }
        let buf = &self.buf[self.pos..];
        let Some(h) = buf.get(..HEADER_LEN) else {
            return HEADER_LEN - buf.len();
        };
        let body = u32::from_le_bytes([h[4], h[5], h[6], h[7]]).min(MAX_BODY) as usize;
        (HEADER_LEN + body).saturating_sub(buf.len())
    }

    /// Payload bytes of the current data frame still to come (0 outside a
    /// payload).
    pub fn payload_remaining(&self) -> u64 {
        self.payload_left
    }

    /// The next frame or payload piece; `Ok(None)` when more bytes are
    /// needed. While a payload is pending and nothing of it is buffered,
    /// the transport may read up to [`Decoder::payload_remaining`] bytes
    /// straight into the extent and report them with
    /// [`Decoder::payload_direct`].
    pub fn next_item(&mut self) -> Result<Option<Decoded<'_>>, FrameError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.payload_left > 0 {
            let avail = self.buffered() as u64;
            if avail == 0 {
                return Ok(None);
            }
            let n = avail.min(self.payload_left) as usize;
            let start = self.pos;
            self.pos += n;
            self.payload_left -= n as u64;
            return Ok(Some(Decoded::Payload(&self.buf[start..start + n])));
        }
        match decode_frame(&self.buf[self.pos..]) {
            Ok(None) => Ok(None),
            Ok(Some((frame, used))) => {
                self.pos += used;
                if let Frame::Data(d) = &frame {
                    self.payload_left = d.length;
                }
                Ok(Some(Decoded::Frame(frame)))
            }
            Err(e) => {
                self.error = Some(e);
                Err(e)
            }
        }
    }

    /// Up to `max` payload bytes buffered here, in order, as
    /// [`Decoder::next_item`] gives them but no more than `max`; `None`
    /// when no payload is pending or none of it is buffered.
    pub fn next_payload(&mut self, max: usize) -> Option<&[u8]> {
        if self.payload_left == 0 || self.error.is_some() {
            return None;
        }
        let n = (self.buffered() as u64)
            .min(self.payload_left)
            .min(max as u64) as usize;
        if n == 0 {
            return None;
        }
        let start = self.pos;
        self.pos += n;
        self.payload_left -= n as u64;
        Some(&self.buf[start..start + n])
    }

    /// Records `n` payload bytes that the transport read straight into the
    /// extent, bypassing the decoder. Fails (changing nothing) when `n`
    /// exceeds what is left of the payload or bytes of it are still
    /// buffered here (those must be taken first, in order).
    pub fn payload_direct(&mut self, n: u64) -> Result<(), PayloadOrderError> {
        if n > self.payload_left || (n > 0 && self.buffered() > 0) {
            return Err(PayloadOrderError);
        }
        self.payload_left -= n;
        Ok(())
    }
}

/// [`Decoder::payload_direct`] was called out of order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadOrderError;

impl fmt::Display for PayloadOrderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "payload bytes reported out of order (more than remain, or buffered bytes not taken)"
        )
    }
}

impl std::error::Error for PayloadOrderError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::NO_VERDICT;

    pub(crate) fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                version: PROTOCOL_VERSION,
                job_id: "job-1".into(),
                node_id: "node01".into(),
                view_digest: [3; 32],
                incarnation: 77,
            }),
            Frame::Get(Get {
                request: 1,
                fingerprint: 2,
                sample: 3,
                length: 4,
                due: 5,
            }),
            Frame::GetMany {
                fingerprint: 8,
                items: vec![
                    Want {
                        request: 1,
                        sample: 2,
                        length: 3,
                        due: 4,
                    };
                    3
                ],
            },
            Frame::Data(DataHeader {
                request: 1,
                sample: 2,
                length: 5,
                crc: 0xdead_beef,
                store_wait_us: 0,
            }),
            Frame::Miss {
                request: 4,
                sample: 5,
                reason: MissReason::NotKept,
            },
            Frame::Credit(16),
            Frame::Ping(11),
            Frame::Pong(11),
            Frame::Goodbye(GoodbyeReason::ShuttingDown),
            Frame::Cancel(0x0102),
            Frame::JobStatus(status_sample()),
            Frame::JobStatus(JobStatus::default()),
        ]
    }

    pub(crate) fn status_sample() -> JobStatus {
        use crate::status::{PlanKey, PlanStatus, RankPosition, RankWait, NO_QUANTILE};
        JobStatus {
            seq: 9,
            plans: vec![PlanStatus {
                key: PlanKey {
                    dataset: "imagenet".into(),
                    fingerprint: 0xabcd,
                    seed: 42,
                    batch_size: 32,
                    world_size: 4,
                    drop_last: true,
                },
                positions: vec![
                    RankPosition {
                        rank: 0,
                        epoch: 1,
                        step: 17,
                        live: true,
                    },
                    RankPosition {
                        rank: 3,
                        epoch: 1,
                        step: 15,
                        live: false,
                    },
                ],
            }],
            waits: vec![RankWait {
                dataset: "imagenet".into(),
                rank: 3,
                quantiles_us: [100, 2_500, NO_QUANTILE],
                verdict: 3,
            }],
        }
    }

    #[test]
    fn frames_round_trip() {
        for f in samples() {
            let b = f.to_bytes().unwrap();
            assert_eq!(decode_frame(&b), Ok(Some((f.clone(), b.len()))));
            for cut in 0..b.len() {
                assert_eq!(decode_frame(&b[..cut]), Ok(None), "{f:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn wire_bytes_are_pinned() {
        let b = Frame::Get(Get {
            request: 1,
            fingerprint: 2,
            sample: 3,
            length: 4,
            due: 5,
        })
        .to_bytes()
        .unwrap();
        let mut want = vec![2, 3, 0, 0, 40, 0, 0, 0];
        for v in 1u64..=5 {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(b, want);
        let m = Frame::Miss {
            request: 0x0102,
            sample: 7,
            reason: MissReason::Evicted,
        }
        .to_bytes()
        .unwrap();
        assert_eq!(
            m,
            [2, 6, 0, 0, 17, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 3]
        );
        assert_eq!(
            Frame::Goodbye(GoodbyeReason::Timeout).to_bytes().unwrap(),
            [2, 10, 0, 0, 1, 0, 0, 0, 5]
        );
        assert_eq!(
            Frame::Cancel(0x0102).to_bytes().unwrap(),
            [2, 12, 0, 0, 8, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(MissReason::from_code(10), Some(MissReason::Cancelled));
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        let good = Frame::Ping(1).to_bytes().unwrap();
        let mut b = good.clone();
        b[0] = 1;
        assert_eq!(decode_frame(&b), Err(FrameError::UnsupportedVersion(1)));
        assert_eq!(decode_frame(&[1]), Err(FrameError::UnsupportedVersion(1)));
        // Kind 2 (format 1's authentication answer) is retired.
        let mut b = good.clone();
        b[1] = 2;
        assert_eq!(decode_frame(&b), Err(FrameError::UnknownKind(2)));
        let mut b = good.clone();
        b[1] = 99;
        assert_eq!(decode_frame(&b), Err(FrameError::UnknownKind(99)));
        let mut b = good.clone();
        b[1] = 14;
        assert_eq!(decode_frame(&b), Err(FrameError::UnknownKind(14)));
        // A cancel is exactly one u64.
        let cancel = Frame::Cancel(5).to_bytes().unwrap();
        let mut b = cancel.clone();
        b[4] = 7;
        b.pop();
        assert_eq!(decode_frame(&b), Err(FrameError::Truncated { kind: 12 }));
        let mut b = cancel.clone();
        b[4] = 9;
        b.push(0);
        assert_eq!(
            decode_frame(&b),
            Err(FrameError::TrailingBytes { kind: 12 })
        );
        let mut b = good.clone();
        b[2] = 1;
        assert_eq!(decode_frame(&b), Err(FrameError::NonzeroFlags(1)));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        assert_eq!(decode_frame(&b), Err(FrameError::BodyTooLong(MAX_BODY + 1)));
        let mut b = good.clone();
        b[4] = 9;
        b.push(0);
        assert_eq!(decode_frame(&b), Err(FrameError::TrailingBytes { kind: 8 }));
        let mut b = good.clone();
        b[4] = 7;
        b.pop();
        assert_eq!(decode_frame(&b), Err(FrameError::Truncated { kind: 8 }));
        let mut b = Frame::Miss {
            request: 1,
            sample: 1,
            reason: MissReason::Late,
        }
        .to_bytes()
        .unwrap();
        *b.last_mut().unwrap() = 0;
        assert_eq!(decode_frame(&b), Err(FrameError::BadMissReason(0)));
        let mut b = Frame::Credit(1).to_bytes().unwrap();
        b[8] = 0;
        assert_eq!(decode_frame(&b), Err(FrameError::ZeroCredit));
        assert_eq!(Frame::Credit(0).to_bytes(), Err(FrameError::ZeroCredit));
        assert_eq!(
            Frame::GetMany {
                fingerprint: 0,
                items: vec![]
            }
            .to_bytes(),
            Err(FrameError::BadCount(0))
        );
        let mut h = Frame::Hello(Hello {
            version: 1,
            job_id: "j".into(),
            node_id: "n".into(),
            view_digest: [0; 32],
            incarnation: 0,
        })
        .to_bytes()
        .unwrap();
        h[HEADER_LEN + 3] = 0xff; // job id byte: not UTF-8
        assert_eq!(decode_frame(&h), Err(FrameError::BadId));
        let d = Frame::Data(DataHeader {
            request: 0,
            sample: 0,
            length: MAX_PAYLOAD + 1,
            crc: 0,
            store_wait_us: 0,
        });
        assert_eq!(
            d.to_bytes(),
            Err(FrameError::PayloadTooLong(MAX_PAYLOAD + 1))
        );
    }

    #[test]
    fn job_status_wire_bytes_are_pinned() {
        let st = JobStatus {
            seq: 1,
            ..JobStatus::default()
        };
        assert_eq!(
            Frame::JobStatus(st).to_bytes().unwrap(),
            [2, 13, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let b = Frame::JobStatus(status_sample()).to_bytes().unwrap();
        assert_eq!(b.len() - HEADER_LEN, status_sample().body_len());
    }

    /// Offset in a [`status_sample`] frame of the byte after its plan's
    /// fixed fields (the first position's rank).
    fn first_position_at() -> usize {
        HEADER_LEN + 8 + 2 + 1 + "imagenet".len() + 8 + 8 + 4 + 4 + 1 + 2
    }

    #[test]
    fn bad_job_status_is_refused() {
        let good = Frame::JobStatus(status_sample()).to_bytes().unwrap();
        let bad = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            decode_frame(&b)
        };
        let plans_at = HEADER_LEN + 8;
        assert_eq!(
            bad(plans_at, 33),
            Err(FrameError::BadStatus("too many plans"))
        );
        // The plan's name length 0.
        assert!(matches!(
            bad(plans_at + 2, 0),
            Err(FrameError::BadStatus(_))
        ));
        let drop_last_at = first_position_at() - 3;
        assert_eq!(
            bad(drop_last_at, 2),
            Err(FrameError::BadStatus("flag neither 0 nor 1"))
        );
        let world_at = drop_last_at - 4;
        assert_eq!(bad(world_at, 0), Err(FrameError::BadStatus("world size 0")));
        // Rank 0 of a world of 4 becomes rank 9.
        assert_eq!(
            bad(first_position_at(), 9),
            Err(FrameError::BadStatus("rank out of range"))
        );
        // The position count: 0x0402 positions, past the bound.
        assert_eq!(
            bad(first_position_at() - 1, 4),
            Err(FrameError::BadStatus("too many positions"))
        );
        // The verdict (the last byte).
        assert_eq!(
            bad(good.len() - 1, 6),
            Err(FrameError::BadStatus("unknown verdict"))
        );
        assert!(bad(good.len() - 1, NO_VERDICT).is_ok());
        // Cut short and padded.
        let mut b = good.clone();
        let n = b.len() - HEADER_LEN - 1;
        b[4..8].copy_from_slice(&(n as u32).to_le_bytes());
        b.pop();
        assert_eq!(decode_frame(&b), Err(FrameError::Truncated { kind: 13 }));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&((n + 2) as u32).to_le_bytes());
        b.push(0);
        assert_eq!(
            decode_frame(&b),
            Err(FrameError::TrailingBytes { kind: 13 })
        );
        // The encoder refuses what the decoder would.
        let mut st = status_sample();
        st.plans[0].positions[0].rank = 4;
        assert_eq!(
            Frame::JobStatus(st).to_bytes(),
            Err(FrameError::BadStatus("rank out of range"))
        );
        let mut st = status_sample();
        st.waits[0].verdict = 7;
        assert!(Frame::JobStatus(st).to_bytes().is_err());
        let mut st = status_sample();
        st.waits = vec![st.waits[0].clone(); crate::status::MAX_STATUS_WAITS + 1];
        assert_eq!(
            Frame::JobStatus(st).to_bytes(),
            Err(FrameError::BadStatus("too many wait rows"))
        );
        // Random bytes under kind 13 never panic and never decode to more
        // than the bounds allow.
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = HEADER_LEN + (x as usize) % (b.len() - HEADER_LEN);
                b[at] = (x >> 32) as u8;
            }
            if let Ok(Some((Frame::JobStatus(st), _))) = decode_frame(&b) {
                assert!(st.plans.len() <= crate::status::MAX_STATUS_PLANS);
                assert!(st.waits.len() <= crate::status::MAX_STATUS_WAITS);
            }
        }
    }

    #[test]
    fn decoder_splits_payload_from_frames() {
        let mut wire = Vec::new();
        Frame::Ping(1).encode(&mut wire).unwrap();
        Frame::Data(DataHeader {
            request: 7,
            sample: 8,
            length: 6,
            crc: 1,
            store_wait_us: 0,
        })
        .encode(&mut wire)
        .unwrap();
        wire.extend_from_slice(b"abcdef");
        Frame::Pong(2).encode(&mut wire).unwrap();
        for piece in 1..wire.len() {
            let mut d = Decoder::new();
            let mut frames = Vec::new();
            let mut payload = Vec::new();
            for chunk in wire.chunks(piece) {
                d.feed(chunk);
                while let Some(x) = d.next_item().unwrap() {
                    match x {
                        Decoded::Frame(f) => frames.push(f),
                        Decoded::Payload(p) => payload.extend_from_slice(p),
                    }
                }
            }
            assert_eq!(payload, b"abcdef");
            assert_eq!(frames.len(), 3);
            assert_eq!(frames[2], Frame::Pong(2));
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn payload_read_directly_bypasses_the_buffer() {
        let mut d = Decoder::new();
        let mut hdr = Vec::new();
        Frame::Data(DataHeader {
            request: 1,
            sample: 1,
            length: 10,
            crc: 0,
            store_wait_us: 0,
        })
        .encode(&mut hdr)
        .unwrap();
        hdr.extend_from_slice(b"abc");
        d.feed(&hdr);
        assert!(matches!(
            d.next_item(),
            Ok(Some(Decoded::Frame(Frame::Data(_))))
        ));
        assert_eq!(d.payload_direct(1), Err(PayloadOrderError));
        assert_eq!(d.next_item(), Ok(Some(Decoded::Payload(b"abc"))));
        assert_eq!(d.payload_remaining(), 7);
        assert_eq!(d.payload_direct(8), Err(PayloadOrderError));
        assert_eq!(d.payload_direct(7), Ok(()));
        assert_eq!(d.next_item(), Ok(None));
        d.feed(&Frame::Ping(3).to_bytes().unwrap());
        assert_eq!(d.next_item(), Ok(Some(Decoded::Frame(Frame::Ping(3)))));
    }

    #[test]
    fn buffered_payload_is_taken_no_more_than_asked() {
        let mut d = Decoder::new();
        assert_eq!(d.next_payload(10), None, "no payload pending");
        let mut w = Frame::Data(DataHeader {
            request: 1,
            sample: 1,
            length: 5,
            crc: 0,
            store_wait_us: 0,
        })
        .to_bytes()
        .unwrap();
        w.extend_from_slice(b"abcde");
        w.extend_from_slice(&Frame::Ping(3).to_bytes().unwrap());
        d.feed(&w);
        assert!(matches!(
            d.next_item(),
            Ok(Some(Decoded::Frame(Frame::Data(_))))
        ));
        assert_eq!(d.next_payload(0), None);
        assert_eq!(d.next_payload(2), Some(&b"ab"[..]));
        assert_eq!(
            d.next_payload(10),
            Some(&b"cde"[..]),
            "not past the payload"
        );
        assert_eq!(d.payload_remaining(), 0);
        assert_eq!(d.next_payload(10), None);
        assert_eq!(d.next_item(), Ok(Some(Decoded::Frame(Frame::Ping(3)))));
    }

    #[test]
    fn decoder_errors_are_sticky() {
        let mut d = Decoder::new();
        d.feed(&[9, 9, 9]);
        assert_eq!(d.next_item(), Err(FrameError::UnsupportedVersion(9)));
        d.feed(&Frame::Ping(1).to_bytes().unwrap());
        assert_eq!(d.next_item(), Err(FrameError::UnsupportedVersion(9)));
    }
}
