//! The session handshake as a sans-IO codec: bytes in, messages out.
//!
//! Nothing here touches a socket or a clock. The loader encodes an
//! [`OpenSession`] request, the agent decodes it, checks it with
//! [`OpenSession::validate`] and answers with [`SessionOpened`] (whose frame
//! travels together with the arena and segment fds over `SCM_RIGHTS`, see
//! [`crate::socket`]) or with an [`ErrorReply`].
//!
//! # Wire format
//!
//! Every frame is an 8-byte header followed by a body:
//!
//! ```text
//! offset 0  body_len  u32 LE   bytes after the header (≤ MAX_FRAME - 8)
//! offset 4  kind      u16 LE   1 OpenSession, 2 SessionOpened, 3 CloseSession,
//!                              4 SessionClosed, 5 Error, 6 PeerQuery,
//!                              7 PeerIdentity, 8 ViewChunk, 9 ViewJoined
//! offset 6  version   u16 LE   PROTOCOL_VERSION
//! offset 8  body
//! ```
//!
//! Body fields are written in declaration order with no padding: integers
//! little-endian, strings as a u16 LE byte length followed by that many UTF-8
//! bytes, bools as one byte `0` or `1` (any other value is an error), error
//! codes as the i32 LE of [`ErrorCode`]. A body must be consumed exactly;
//! extra bytes are an error.
//!
//! Digests are 32 raw bytes; a [`ViewChunk`]'s bytes are a u16 LE length
//! and that many bytes.
//!
//! # Membership views
//!
//! A loader may hand its agent the job's membership view before opening a
//! session on the same connection (`docs/peers.md`): it asks the agent who
//! it is ([`Message::PeerQuery`] → [`PeerIdentity`]), the job gathers every
//! agent's identity, and each loader sends the canonical encoding of the
//! resulting view (`granary_peer::view::View::encode`) in [`ViewChunk`]s of
//! at most [`VIEW_CHUNK`] bytes, [`MAX_VIEW_BYTES`] in all. The agent answers
//! the last chunk with [`ViewJoined`] or an [`ErrorReply`]; sessions opened
//! on that connection afterwards belong to the view.
//!
//! On a `SOCK_SEQPACKET` socket one datagram carries exactly one frame
//! ([`decode_frame`]); on a byte stream, [`Decoder`] reassembles frames.

use std::fmt;

use crate::error::ErrorCode;
use crate::layout::MAX_RING_CAPACITY;
use crate::validate::MAX_BATCH_SAMPLES;

/// Version carried in every frame header. A peer speaking another version is
/// answered with [`ErrorCode::Version`].
pub const PROTOCOL_VERSION: u16 = 1;

/// Largest frame (header and body) either side sends or accepts, in bytes.
pub const MAX_FRAME: usize = 4096;

/// Longest dataset name accepted by [`OpenSession::validate`], in bytes.
pub const MAX_DATASET_NAME: usize = 255;

/// Samples per batch when a loader asks for none (`batch_size = 0`).
pub const DEFAULT_BATCH_SIZE: u32 = 32;

/// Size of the frame header.
pub const HEADER_LEN: usize = 8;

/// Largest body a frame may carry.
pub const MAX_BODY: usize = MAX_FRAME - HEADER_LEN;

const KIND_OPEN_SESSION: u16 = 1;
const KIND_SESSION_OPENED: u16 = 2;
const KIND_CLOSE_SESSION: u16 = 3;
const KIND_SESSION_CLOSED: u16 = 4;
const KIND_ERROR: u16 = 5;
const KIND_PEER_QUERY: u16 = 6;
const KIND_PEER_IDENTITY: u16 = 7;
const KIND_VIEW_CHUNK: u16 = 8;
const KIND_VIEW_JOINED: u16 = 9;
const KIND_LAYOUT_CHUNK: u16 = 10;
const KIND_ASSIGNMENT_QUERY: u16 = 11;
const KIND_ASSIGNMENT_INFO: u16 = 12;
const KIND_JOB_QUERY: u16 = 13;
const KIND_JOB_POSITION: u16 = 14;
const KIND_LAST: u16 = KIND_JOB_POSITION;

/// Largest encoded rank layout a loader may hand in, in bytes (8 bytes of
/// header and 4 per rank: about 2 million ranks).
pub const MAX_LAYOUT_BYTES: u32 = MAX_VIEW_BYTES;

/// Bytes of an [`AssignmentInfo`] body besides the note: the mode (1), the
/// digest (32) and the note's length (2).
const ASSIGNMENT_INFO_FIXED: usize = 1 + 32 + 2;

/// Largest encoded membership view a loader may hand in, in bytes (65,536
/// members with ids and addresses of about 60 bytes each).
pub const MAX_VIEW_BYTES: u32 = 8 << 20;

/// Most view bytes one [`ViewChunk`] carries: the body holds the total
/// (4), the offset (4) and the bytes' length (2).
pub const VIEW_CHUNK: usize = MAX_BODY - 10;

/// Bytes of a [`PeerIdentity`] body besides its three strings' bytes.
const PEER_IDENTITY_FIXED: usize = 1 + 3 * 2 + 8 + 8 + 32 + 4;

/// Bytes of an [`OpenSession`] body besides the dataset name and its length:
/// seed (8), five u32 (20), drop_last (1), three u32 (12).
const OPEN_SESSION_FIXED: usize = 8 + 5 * 4 + 1 + 3 * 4;

/// Bytes of an [`ErrorReply`] body besides the message: code (4) and the
/// message length (2).
const ERROR_FIXED: usize = 4 + 2;

/// A loader's request to open a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenSession {
    /// Name of a dataset the agent serves (1..=[`MAX_DATASET_NAME`] bytes).
    pub dataset: String,
    /// Shuffle seed; the same seed, rank and world size give the same order.
    pub seed: u64,
    /// First epoch to deliver.
    pub first_epoch: u32,
    /// Number of epochs to deliver (≥ 1).
    pub epoch_count: u32,
    /// Samples per batch (≥ 1).
    pub batch_size: u32,
    /// This loader's rank, `< world_size`.
    pub rank: u32,
    /// Number of ranks sharing the dataset (≥ 1).
    pub world_size: u32,
    /// Drop the last, partial batch of each epoch.
    pub drop_last: bool,
    /// Capacity of the ready ring: 0 for the agent's default, otherwise a
    /// power of two in `2..=MAX_RING_CAPACITY`.
    pub ready_capacity: u32,
    /// Capacity of the release ring: 0 for the agent's default, otherwise a
    /// power of two in `2..=MAX_RING_CAPACITY`.
    pub release_capacity: u32,
    /// ABI version of the client library making the request.
    pub client_abi: u32,
    /// `Some(digest)`: deliver the locality-aware assignment whose inputs
    /// have this digest (the one every rank of the job agreed on, from an
    /// [`Message::AssignmentQuery`]); the agent refuses the session when
    /// its own inputs give another digest. `None`: exact
    /// (`DistributedSampler`) order. Encoded after the other fields only
    /// when present, so requests of older clients decode as `None`.
    pub locality: Option<[u8; 32]>,
    /// Skip the session's first `first_batch` batches, counted across its
    /// epochs (0: none): a loader resuming after its agent went away names
    /// how many it has handed out. Encoded only when not 0.
    pub first_batch: u64,
    /// With `workers` > 1, the session takes only batches `worker`,
    /// `worker + workers`, … of each epoch of its rank: one of `workers`
    /// DataLoader workers sharing the rank's batches round robin. Encoded
    /// only when `workers` > 1.
    pub worker: u32,
    /// How many workers share the rank's batches (1: the session takes
    /// them all).
    pub workers: u32,
    /// `Some`: open only if the dataset's catalog is the one a saved
    /// session state was taken against (its provenance). Encoded only when
    /// present.
    pub catalog: Option<CatalogCheck>,
    /// The client decodes a [`SessionOpened`] trailer (the catalog id and
    /// the rank's batch count); without it the agent sends none, so older
    /// clients get the replies they know. Encoded only when set.
    pub wants_catalog: bool,
}

/// Most bytes of a catalog sketch ([`CatalogId::sketch`]).
pub const MAX_SKETCH: usize = 2048;

/// What identifies a dataset's catalog: the fingerprint over every
/// sample's name, size and version token (ETag, mtime or CRC-32C), and a
/// sketch of the same from which the agent can name the samples that
/// differ between two catalogs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogId {
    /// The dataset fingerprint (`docs/peers.md`, "Dataset identity").
    pub fingerprint: u64,
    /// The agent's difference sketch of the catalog (opaque to loaders; at
    /// most [`MAX_SKETCH`] bytes).
    pub sketch: Vec<u8>,
}

/// A session opened from a saved state: the catalog the state was taken
/// against, and what to do when the dataset's catalog differs now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogCheck {
    /// The catalog the state was taken against.
    pub expected: CatalogId,
    /// Open anyway when it differs (the agent logs which samples changed).
    pub accept_changed: bool,
}

impl OpenSession {
    /// A request for `dataset` in batches of `batch_size` with every other
    /// field at its plainest: seed 0, epoch 0 only, rank 0 of 1, keep the
    /// last partial batch, the agent's ring sizes, client ABI 1, exact
    /// order from the first batch, one worker, no catalog check and no
    /// catalog trailer. Callers set what they need with struct update
    /// syntax.
    pub fn new(dataset: impl Into<String>, batch_size: u32) -> OpenSession {
        OpenSession {
            dataset: dataset.into(),
            seed: 0,
            first_epoch: 0,
            epoch_count: 1,
            batch_size,
            rank: 0,
            world_size: 1,
            drop_last: false,
            ready_capacity: 0,
            release_capacity: 0,
            client_abi: 1,
            locality: None,
            first_batch: 0,
            worker: 0,
            workers: 1,
            catalog: None,
            wants_catalog: false,
        }
    }

    /// Checks every field's domain. The error names the offending field and
    /// carries [`ErrorCode::InvalidArgument`], ready to be sent back.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        let invalid = |message: String| {
            Err(ErrorReply {
                code: ErrorCode::InvalidArgument,
                message,
            })
        };
        if self.dataset.is_empty() {
            return invalid("dataset: name is empty".into());
        }
        if self.dataset.len() > MAX_DATASET_NAME {
            return invalid(format!(
                "dataset: name is {} bytes long, the limit is {MAX_DATASET_NAME}",
                self.dataset.len()
            ));
        }
        if self.batch_size == 0 {
            return invalid("batch_size: must be at least 1".into());
        }
        if self.batch_size > MAX_BATCH_SAMPLES {
            return invalid(format!(
                "batch_size: {} is above the limit of {MAX_BATCH_SAMPLES} samples",
                self.batch_size
            ));
        }
        if self.world_size == 0 {
            return invalid("world_size: must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return invalid(format!(
                "rank: {} is not below world_size {}",
                self.rank, self.world_size
            ));
        }
        if self.epoch_count == 0 {
            return invalid("epoch_count: must be at least 1".into());
        }
        if self.workers == 0 || self.worker >= self.workers {
            return invalid(format!(
                "worker: {} is not below workers {} (workers must be at least 1)",
                self.worker, self.workers
            ));
        }
        if self.first_epoch.checked_add(self.epoch_count).is_none() {
            return invalid(format!(
                "epoch_count: first_epoch {} + epoch_count {} overflows u32",
                self.first_epoch, self.epoch_count
            ));
        }
        for (field, cap) in [
            ("ready_capacity", self.ready_capacity),
            ("release_capacity", self.release_capacity),
        ] {
            if cap != 0 && !(cap.is_power_of_two() && (2..=MAX_RING_CAPACITY).contains(&cap)) {
                return invalid(format!(
                    "{field}: {cap} is neither 0 (agent default) nor a power of two in 2..={MAX_RING_CAPACITY}"
                ));
            }
        }
        Ok(())
    }
}

/// The agent's reply to a successful [`OpenSession`]. The frame travels with
/// `fd_count` file descriptors: the arena, then the ring segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOpened {
    /// Identifier of the new session (for [`Message::CloseSession`]).
    pub session_id: u64,
    /// The agent instance's epoch; the segment header must carry the same.
    pub instance_epoch: u64,
    /// Size of the arena memfd in bytes.
    pub arena_size: u64,
    /// Size of the ring segment memfd in bytes.
    pub segment_size: u64,
    /// Samples this rank receives per epoch.
    pub samples_per_epoch: u64,
    /// Batches this rank receives per epoch.
    pub batches_per_epoch: u64,
    /// Number of fds attached to the frame (2: arena, segment).
    pub fd_count: u8,
    /// The dataset's catalog, which a session state records as its
    /// provenance, with `rank_batches_per_epoch`: encoded after the other
    /// fields only when present (sent to clients that ask,
    /// [`OpenSession::wants_catalog`]).
    pub catalog: Option<CatalogId>,
    /// Batches the whole rank receives per epoch (equal to
    /// `batches_per_epoch` unless the session takes one worker's part);
    /// sent with `catalog`, 0 otherwise.
    pub rank_batches_per_epoch: u64,
    /// `[height, width, channels]` of every sample of a dataset the agent
    /// prepares (`[dataset.prepare]`: uint8, height × width × channels):
    /// encoded after the catalog, only with it and only for such a dataset.
    /// A library that predates it refuses such a reply (trailing bytes).
    pub prepared: Option<[u32; 3]>,
}

granary_base::code_enum! {
    /// How an agent learns its job's membership (`peers.membership`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum MembershipMode: u8 {
        /// Peers are off: the agent reads everything from the store.
        Off = 0,
        /// A static list in the agent's configuration.
        Static = 1,
        /// Slurm's variables.
        Slurm = 2,
        /// Views handed in by loaders at session open.
        Session = 3,
        /// The addresses of a DNS name, resolved by the agent itself; it
        /// takes no view from loaders.
        Dns = 4,
    }
}

/// The agent's answer to [`Message::PeerQuery`]: who it is among its job's
/// agents, and the view it holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Where this agent's membership comes from.
    pub membership: MembershipMode,
    /// Its stable node id (empty when peers are off).
    pub node_id: String,
    /// `HOST:PORT` other agents reach its peer listener at.
    pub addr: String,
    /// Bytes of its arena kept for the job (its capacity in a view).
    pub capacity: u64,
    /// The job of the view it holds; empty when it holds none.
    pub job_id: String,
    /// That view's epoch.
    pub view_epoch: u64,
    /// That view's digest (zeros when it holds none).
    pub view_digest: [u8; 32],
    /// That view's member count (0 when it holds none).
    pub members: u32,
}

/// One piece of an encoded membership view (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewChunk {
    /// Length of the whole encoding, at most [`MAX_VIEW_BYTES`].
    pub total: u32,
    /// Where these bytes start in it; chunks come in order.
    pub offset: u32,
    /// At most [`VIEW_CHUNK`] bytes.
    pub bytes: Vec<u8>,
}

impl ViewChunk {
    /// Cuts an encoded view into the chunks that carry it.
    pub fn split(view: &[u8]) -> Vec<ViewChunk> {
        let total = u32::try_from(view.len()).unwrap_or(u32::MAX);
        if view.is_empty() {
            return vec![ViewChunk {
                total,
                offset: 0,
                bytes: Vec::new(),
            }];
        }
        view.chunks(VIEW_CHUNK)
            .enumerate()
            .map(|(i, c)| ViewChunk {
                total,
                offset: u32::try_from(i * VIEW_CHUNK).unwrap_or(u32::MAX),
                bytes: c.to_vec(),
            })
            .collect()
    }
}

/// Reassembles a view (or a rank layout) from its [`ViewChunk`]s, refusing
/// anything but consecutive chunks of one announced total within
/// [`MAX_VIEW_BYTES`] (equal to [`MAX_LAYOUT_BYTES`]).
#[derive(Debug, Default)]
pub struct ViewAssembler {
    buf: Vec<u8>,
    total: Option<u32>,
    /// What is assembled, for the messages: `None` for a view.
    what: Option<&'static str>,
}

impl ViewAssembler {
    /// An assembler of rank layouts ([`Message::LayoutChunk`]).
    pub fn for_layout() -> ViewAssembler {
        ViewAssembler {
            what: Some("layout"),
            ..ViewAssembler::default()
        }
    }

    /// Takes the next chunk: `Ok(Some(bytes))` once the view is complete,
    /// `Ok(None)` while more chunks are due, an error (and a fresh start)
    /// for a chunk that does not follow.
    pub fn push(&mut self, c: ViewChunk) -> Result<Option<Vec<u8>>, ErrorReply> {
        let what = self.what.unwrap_or("view");
        let bad = |message: String| ErrorReply {
            code: ErrorCode::InvalidArgument,
            message,
        };
        let fresh = ViewAssembler {
            what: self.what,
            ..ViewAssembler::default()
        };
        if c.total > MAX_VIEW_BYTES {
            *self = fresh;
            return Err(bad(format!(
                "{what}: {} bytes, the limit is {MAX_VIEW_BYTES}",
                c.total
            )));
        }
        let expected_offset = self.buf.len() as u64;
        if self.total.is_some_and(|t| t != c.total) || u64::from(c.offset) != expected_offset {
            let e = bad(format!(
                "{what} chunk at offset {} of {} bytes does not follow the {} bytes received of {}",
                c.offset,
                c.total,
                expected_offset,
                self.total.unwrap_or(c.total)
            ));
            *self = fresh;
            return Err(e);
        }
        if u64::from(c.offset) + c.bytes.len() as u64 > u64::from(c.total) {
            *self = fresh;
            return Err(bad(format!(
                "{what} chunk runs past the announced {} bytes",
                c.total
            )));
        }
        self.total = Some(c.total);
        // Grow by doubling, never past the announced total: what a hand-in
        // holds stays within the bytes it announced.
        let needed = self.buf.len() + c.bytes.len();
        if needed > self.buf.capacity() {
            let grown = (self.buf.capacity() * 2).max(needed).min(c.total as usize);
            self.buf.reserve_exact(grown - self.buf.len());
        }
        self.buf.extend_from_slice(&c.bytes);
        if self.buf.len() as u64 == u64::from(c.total) {
            let done = std::mem::take(&mut self.buf);
            *self = fresh;
            return Ok(Some(done));
        }
        Ok(None)
    }

    /// Bytes held for a view not yet complete.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Bytes allocated for it (at most the announced total).
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }
}

/// The agent's answer to the last [`ViewChunk`]: the view it holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewJoined {
    /// The view's epoch.
    pub view_epoch: u64,
    /// The view's digest.
    pub view_digest: [u8; 32],
    /// Whether this view replaced the one the agent held (false: it held
    /// this one already).
    pub installed: bool,
    /// Sessions of an older view of the same job that ended because of it.
    pub sessions_ended: u32,
}

/// The agent's answer to [`Message::AssignmentQuery`]: whether it can
/// deliver that session in the locality-aware assignment, and the digest of
/// that assignment's inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssignmentInfo {
    /// True when the locality-aware assignment is available.
    pub locality: bool,
    /// SHA-256 of its inputs (the dataset's directory under the view, the
    /// session's plan parameters but the rank, the layout); zeros when
    /// `locality` is false.
    pub digest: [u8; 32],
    /// Why not, when `locality` is false (empty otherwise).
    pub note: String,
}

/// The agent's answer to [`Message::JobQuery`]: where the job stands in
/// the plan the query describes, from the agent's own sessions and its
/// peers' job status (`docs/reliability.md`, "A replacement rank").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobPosition {
    /// The epoch of the job's committed step.
    pub epoch: u32,
    /// The committed step: batches of `epoch` that every known rank of
    /// the plan has taken.
    pub step: u64,
    /// Ranks of the plan whose position the agent knows.
    pub ranks_known: u32,
    /// Agents whose reports named a rank of the plan (this one included).
    pub nodes: u32,
    /// `first_batch` for the queried session (its rank, epochs and worker
    /// split) to open at the committed step.
    pub first_batch: u64,
    /// The queried rank's own position `(epoch, step)`, when known.
    pub rank_position: Option<(u32, u64)>,
}

/// Bytes of a [`JobPosition`] body.
const JOB_POSITION_LEN: usize = 4 + 8 + 4 + 4 + 8 + 1 + 4 + 8;

/// A typed refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    /// Stable error code.
    pub code: ErrorCode,
    /// Human-readable detail. Cut (at a character boundary) to fit in one
    /// frame when encoded.
    pub message: String,
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorReply {}

/// Every message of the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Loader → agent: open a session.
    OpenSession(OpenSession),
    /// Agent → loader: the session is open (fds attached).
    SessionOpened(SessionOpened),
    /// Loader → agent: close a session.
    CloseSession {
        /// The session to close.
        session_id: u64,
    },
    /// Agent → loader: the session is closed.
    SessionClosed {
        /// The session that was closed.
        session_id: u64,
    },
    /// Either direction: a typed refusal.
    Error(ErrorReply),
    /// Loader → agent: who are you among the job's agents?
    PeerQuery,
    /// Agent → loader: the answer to [`Message::PeerQuery`].
    PeerIdentity(PeerIdentity),
    /// Loader → agent: a piece of the job's membership view.
    ViewChunk(ViewChunk),
    /// Agent → loader: the view handed in is the agent's view now.
    ViewJoined(ViewJoined),
    /// Loader → agent: a piece of the job's rank layout (which member of the
    /// view every rank runs on), for the next [`Message::AssignmentQuery`]
    /// and [`Message::OpenSession`] on this connection. Not answered: a bad
    /// layout is reported by the query or open that needs it.
    LayoutChunk(ViewChunk),
    /// Loader → agent: could this session be delivered in the
    /// locality-aware assignment, and with what digest? (The `rank` and
    /// `locality` fields are ignored.)
    AssignmentQuery(OpenSession),
    /// Agent → loader: the answer to [`Message::AssignmentQuery`].
    AssignmentInfo(AssignmentInfo),
    /// Loader → agent: where does the job stand in this session's plan
    /// (its dataset, seed, batch size, world size, `drop_last`)? The rank,
    /// epochs and worker split say which `first_batch` to answer with.
    JobQuery(OpenSession),
    /// Agent → loader: the answer to [`Message::JobQuery`].
    JobPosition(JobPosition),
}

impl Message {
    fn kind(&self) -> u16 {
        match self {
            Message::OpenSession(_) => KIND_OPEN_SESSION,
            Message::SessionOpened(_) => KIND_SESSION_OPENED,
            Message::CloseSession { .. } => KIND_CLOSE_SESSION,
            Message::SessionClosed { .. } => KIND_SESSION_CLOSED,
            Message::Error(_) => KIND_ERROR,
            Message::PeerQuery => KIND_PEER_QUERY,
            Message::PeerIdentity(_) => KIND_PEER_IDENTITY,
            Message::ViewChunk(_) => KIND_VIEW_CHUNK,
            Message::ViewJoined(_) => KIND_VIEW_JOINED,
            Message::LayoutChunk(_) => KIND_LAYOUT_CHUNK,
            Message::AssignmentQuery(_) => KIND_ASSIGNMENT_QUERY,
            Message::AssignmentInfo(_) => KIND_ASSIGNMENT_INFO,
            Message::JobQuery(_) => KIND_JOB_QUERY,
            Message::JobPosition(_) => KIND_JOB_POSITION,
        }
    }
}

/// Why bytes could not be decoded into a [`Message`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The frame ends before its header or body is complete.
    Truncated,
    /// The header announces a body larger than [`MAX_FRAME`] allows (the
    /// announced body length).
    TooLarge(u32),
    /// The header carries another protocol version.
    BadVersion(u16),
    /// The header carries an unknown message kind.
    UnknownKind(u16),
    /// A string is not valid UTF-8.
    BadUtf8,
    /// A bool byte is neither 0 nor 1.
    BadBool(u8),
    /// An error reply carries an unknown error code.
    BadErrorCode(i32),
    /// Bytes follow the end of the frame or of its body (how many).
    TrailingBytes(usize),
    /// A peer identity carries an unknown membership mode.
    BadMembership(u8),
    /// An open-session request's trailer flags name unknown fields.
    BadFlags(u8),
    /// A field the message marks absent is not zero (every message has one
    /// encoding).
    AbsentNotZero,
}

impl ProtocolError {
    /// The code to report to the peer: [`ErrorCode::Version`] for a version
    /// mismatch, [`ErrorCode::Protocol`] for everything else.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::BadVersion(_) => ErrorCode::Version,
            _ => ErrorCode::Protocol,
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Truncated => f.write_str("handshake frame is truncated"),
            ProtocolError::TooLarge(n) => write!(
                f,
                "handshake frame announces a {n}-byte body, the limit is {MAX_BODY}"
            ),
            ProtocolError::BadVersion(v) => write!(
                f,
                "handshake protocol version {v}, this side speaks {PROTOCOL_VERSION}"
            ),
            ProtocolError::UnknownKind(k) => write!(f, "unknown handshake message kind {k}"),
            ProtocolError::BadUtf8 => f.write_str("handshake string is not valid UTF-8"),
            ProtocolError::BadBool(b) => {
                write!(f, "handshake bool byte is {b}, expected 0 or 1")
            }
            ProtocolError::BadErrorCode(c) => write!(f, "unknown error code {c} in error reply"),
            ProtocolError::TrailingBytes(n) => {
                write!(f, "{n} unexpected bytes after the handshake message")
            }
            ProtocolError::BadMembership(b) => {
                write!(f, "unknown membership mode {b} in a peer identity")
            }
            ProtocolError::BadFlags(b) => {
                write!(f, "unknown flags {b:#04x} in an open-session request")
            }
            ProtocolError::AbsentNotZero => {
                write!(f, "a field marked absent is not zero")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

// ---------------------------------------------------------------------------
// Encoding

/// Appends `s` as a u16 length and its bytes, cut at a character boundary to
/// at most `max` bytes (`max` ≤ u16::MAX).
fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut end = s.len().min(max).min(usize::from(u16::MAX));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let len = u16::try_from(end).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
}

/// Flag bits of an [`OpenSession`]'s trailer.
const OPEN_LOCALITY: u8 = 1;
const OPEN_FIRST_BATCH: u8 = 1 << 1;
const OPEN_WORKERS: u8 = 1 << 2;
const OPEN_CATALOG: u8 = 1 << 3;
const OPEN_ACCEPT_CHANGED: u8 = 1 << 4;
const OPEN_WANTS_CATALOG: u8 = 1 << 5;
const OPEN_KNOWN: u8 = 0b11_1111;

/// The trailer flags announcing `o`'s optional fields.
fn open_flags(o: &OpenSession) -> u8 {
    let mut f = 0;
    if o.locality.is_some() {
        f |= OPEN_LOCALITY;
    }
    if o.first_batch != 0 {
        f |= OPEN_FIRST_BATCH;
    }
    if o.workers > 1 {
        f |= OPEN_WORKERS;
    }
    if let Some(c) = &o.catalog {
        f |= OPEN_CATALOG;
        if c.accept_changed {
            f |= OPEN_ACCEPT_CHANGED;
        }
    }
    if o.wants_catalog {
        f |= OPEN_WANTS_CATALOG;
    }
    f
}

/// Bytes of `o`'s optional trailer.
fn open_trailer_len(o: &OpenSession) -> usize {
    let f = open_flags(o);
    if f == 0 {
        return 0;
    }
    let mut n = 1;
    if f & OPEN_LOCALITY != 0 {
        n += 32;
    }
    if f & OPEN_FIRST_BATCH != 0 {
        n += 8;
    }
    if f & OPEN_WORKERS != 0 {
        n += 8;
    }
    if let Some(c) = &o.catalog {
        n += 8 + 2 + c.expected.sketch.len().min(MAX_SKETCH);
    }
    n
}

/// Appends a catalog id: fingerprint, sketch length (u16), sketch (cut to
/// [`MAX_SKETCH`]).
fn put_catalog(out: &mut Vec<u8>, c: &CatalogId) {
    let n = c.sketch.len().min(MAX_SKETCH);
    out.extend_from_slice(&c.fingerprint.to_le_bytes());
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&c.sketch[..n]);
}

/// Appends the encoded frame of `msg` to `out`.
///
/// Never fails and never panics. The one field that could exceed a frame, a
/// string, is cut at a character boundary to fit: an [`ErrorReply`] message
/// loses its tail, and an over-long dataset name is cut to the room left in
/// the frame (thousands of bytes, far above [`MAX_DATASET_NAME`]), so it
/// still arrives over-long and [`OpenSession::validate`] rejects it.
pub fn encode(msg: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    match msg {
        Message::OpenSession(o) | Message::AssignmentQuery(o) | Message::JobQuery(o) => {
            let trailer = open_trailer_len(o);
            put_str(out, &o.dataset, MAX_BODY - 2 - OPEN_SESSION_FIXED - trailer);
            out.extend_from_slice(&o.seed.to_le_bytes());
            for v in [
                o.first_epoch,
                o.epoch_count,
                o.batch_size,
                o.rank,
                o.world_size,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(u8::from(o.drop_last));
            for v in [o.ready_capacity, o.release_capacity, o.client_abi] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            // The optional trailer: a flags byte, then what it announces.
            let flags = open_flags(o);
            if flags != 0 {
                out.push(flags);
                if let Some(digest) = &o.locality {
                    out.extend_from_slice(digest);
                }
                if o.first_batch != 0 {
                    out.extend_from_slice(&o.first_batch.to_le_bytes());
                }
                if o.workers > 1 {
                    out.extend_from_slice(&o.worker.to_le_bytes());
                    out.extend_from_slice(&o.workers.to_le_bytes());
                }
                if let Some(c) = &o.catalog {
                    put_catalog(out, &c.expected);
                }
            }
        }
        Message::SessionOpened(s) => {
            for v in [
                s.session_id,
                s.instance_epoch,
                s.arena_size,
                s.segment_size,
                s.samples_per_epoch,
                s.batches_per_epoch,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(s.fd_count);
            if let Some(c) = &s.catalog {
                out.extend_from_slice(&s.rank_batches_per_epoch.to_le_bytes());
                put_catalog(out, c);
                if let Some(shape) = s.prepared {
                    for v in shape {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
        Message::CloseSession { session_id } | Message::SessionClosed { session_id } => {
            out.extend_from_slice(&session_id.to_le_bytes());
        }
        Message::Error(e) => {
            out.extend_from_slice(&e.code.as_i32().to_le_bytes());
            put_str(out, &e.message, MAX_BODY - ERROR_FIXED);
        }
        Message::PeerQuery => {}
        Message::PeerIdentity(p) => {
            // Each string gets a third of the room; real ids and addresses
            // are far shorter (a view refuses names above 255 bytes).
            let room = (MAX_BODY - PEER_IDENTITY_FIXED) / 3;
            out.push(p.membership as u8);
            put_str(out, &p.node_id, room);
            put_str(out, &p.addr, room);
            out.extend_from_slice(&p.capacity.to_le_bytes());
            put_str(out, &p.job_id, room);
            out.extend_from_slice(&p.view_epoch.to_le_bytes());
            out.extend_from_slice(&p.view_digest);
            out.extend_from_slice(&p.members.to_le_bytes());
        }
        Message::ViewChunk(c) | Message::LayoutChunk(c) => {
            let n = c.bytes.len().min(VIEW_CHUNK);
            out.extend_from_slice(&c.total.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&(n as u16).to_le_bytes());
            out.extend_from_slice(&c.bytes[..n]);
        }
        Message::ViewJoined(j) => {
            out.extend_from_slice(&j.view_epoch.to_le_bytes());
            out.extend_from_slice(&j.view_digest);
            out.push(u8::from(j.installed));
            out.extend_from_slice(&j.sessions_ended.to_le_bytes());
        }
        Message::AssignmentInfo(a) => {
            out.push(u8::from(a.locality));
            out.extend_from_slice(&a.digest);
            put_str(out, &a.note, MAX_BODY - ASSIGNMENT_INFO_FIXED);
        }
        Message::JobPosition(j) => {
            let start_body = out.len();
            out.extend_from_slice(&j.epoch.to_le_bytes());
            out.extend_from_slice(&j.step.to_le_bytes());
            out.extend_from_slice(&j.ranks_known.to_le_bytes());
            out.extend_from_slice(&j.nodes.to_le_bytes());
            out.extend_from_slice(&j.first_batch.to_le_bytes());
            let (e, st) = j.rank_position.unwrap_or((0, 0));
            out.push(u8::from(j.rank_position.is_some()));
            out.extend_from_slice(&e.to_le_bytes());
            out.extend_from_slice(&st.to_le_bytes());
            debug_assert_eq!(out.len() - start_body, JOB_POSITION_LEN);
        }
    }
    let body_len = u32::try_from(out.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
    let header = &mut out[start..start + HEADER_LEN];
    header[0..4].copy_from_slice(&body_len.to_le_bytes());
    header[4..6].copy_from_slice(&msg.kind().to_le_bytes());
    header[6..8].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
}

/// Encodes `msg` into a fresh vector.
pub fn encode_to_vec(msg: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode(msg, &mut out);
    out
}

// ---------------------------------------------------------------------------
// Decoding

/// A parsed, checked frame header.
struct Header {
    body_len: usize,
    kind: u16,
}

/// Parses and checks the header at the start of `bytes`; `Ok(None)` when
/// fewer than [`HEADER_LEN`] bytes are present.
fn parse_header(bytes: &[u8]) -> Result<Option<Header>, ProtocolError> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let body_len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let kind = u16::from_le_bytes([h[4], h[5]]);
    let version = u16::from_le_bytes([h[6], h[7]]);
    if version != PROTOCOL_VERSION {
        return Err(ProtocolError::BadVersion(version));
    }
    let body = usize::try_from(body_len).map_err(|_| ProtocolError::TooLarge(body_len))?;
    if body > MAX_BODY {
        return Err(ProtocolError::TooLarge(body_len));
    }
    if !(KIND_OPEN_SESSION..=KIND_LAST).contains(&kind) {
        return Err(ProtocolError::UnknownKind(kind));
    }
    Ok(Some(Header {
        body_len: body,
        kind,
    }))
}

/// Reads fields off a body, front to back.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(ProtocolError::Truncated)?;
        self.rest = tail;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        self.take().map(u32::from_le_bytes)
    }

    fn i32(&mut self) -> Result<i32, ProtocolError> {
        self.take().map(i32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        self.take().map(u64::from_le_bytes)
    }

    fn bool(&mut self) -> Result<bool, ProtocolError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(ProtocolError::BadBool(b)),
        }
    }

    fn bytes(&mut self) -> Result<Vec<u8>, ProtocolError> {
        let len = usize::from(self.u16()?);
        if self.rest.len() < len {
            return Err(ProtocolError::Truncated);
        }
        let (bytes, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(bytes.to_vec())
    }

    fn string(&mut self) -> Result<String, ProtocolError> {
        let len = usize::from(self.u16()?);
        if self.rest.len() < len {
            return Err(ProtocolError::Truncated);
        }
        let (bytes, tail) = self.rest.split_at(len);
        self.rest = tail;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::BadUtf8)
    }

    fn chunk(&mut self) -> Result<ViewChunk, ProtocolError> {
        Ok(ViewChunk {
            total: self.u32()?,
            offset: self.u32()?,
            bytes: self.bytes()?,
        })
    }

    fn open_session(&mut self) -> Result<OpenSession, ProtocolError> {
        let mut o = OpenSession {
            dataset: self.string()?,
            seed: self.u64()?,
            first_epoch: self.u32()?,
            epoch_count: self.u32()?,
            batch_size: self.u32()?,
            rank: self.u32()?,
            world_size: self.u32()?,
            drop_last: self.bool()?,
            ready_capacity: self.u32()?,
            release_capacity: self.u32()?,
            client_abi: self.u32()?,
            ..OpenSession::new(String::new(), 0)
        };
        // Later additions, absent in older requests: a flags byte (bit 0:
        // a locality digest follows; bit 1: a first batch; bit 2: worker and
        // workers; bit 3: the expected catalog; bit 4, only with bit 3:
        // accept a changed catalog).
        if !self.rest.is_empty() {
            let flags = self.u8()?;
            // A trailer announces at least one field, and only known ones
            // (so that every frame has one encoding).
            if flags == 0
                || flags & !OPEN_KNOWN != 0
                || (flags & OPEN_ACCEPT_CHANGED != 0 && flags & OPEN_CATALOG == 0)
            {
                return Err(ProtocolError::BadFlags(flags));
            }
            if flags & 1 != 0 {
                o.locality = Some(self.take()?);
            }
            if flags & 2 != 0 {
                o.first_batch = self.u64()?;
                if o.first_batch == 0 {
                    // 0 is said by leaving the field out.
                    return Err(ProtocolError::BadFlags(flags));
                }
            }
            if flags & OPEN_WORKERS != 0 {
                o.worker = self.u32()?;
                o.workers = self.u32()?;
                if o.workers <= 1 {
                    // 1 is said by leaving the fields out.
                    return Err(ProtocolError::BadFlags(flags));
                }
            }
            if flags & OPEN_CATALOG != 0 {
                o.catalog = Some(CatalogCheck {
                    expected: self.catalog()?,
                    accept_changed: flags & OPEN_ACCEPT_CHANGED != 0,
                });
            }
            o.wants_catalog = flags & OPEN_WANTS_CATALOG != 0;
        }
        Ok(o)
    }

    fn catalog(&mut self) -> Result<CatalogId, ProtocolError> {
        let fingerprint = self.u64()?;
        let sketch = self.bytes()?;
        if sketch.len() > MAX_SKETCH {
            return Err(ProtocolError::TooLarge(sketch.len() as u32));
        }
        Ok(CatalogId {
            fingerprint,
            sketch,
        })
    }

    fn finish(self) -> Result<(), ProtocolError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes(self.rest.len()))
        }
    }
}

fn decode_body(kind: u16, body: &[u8]) -> Result<Message, ProtocolError> {
    let mut r = Reader { rest: body };
    let msg = match kind {
        KIND_OPEN_SESSION => Message::OpenSession(r.open_session()?),
        KIND_ASSIGNMENT_QUERY => Message::AssignmentQuery(r.open_session()?),
        KIND_JOB_QUERY => Message::JobQuery(r.open_session()?),
        KIND_JOB_POSITION => {
            let mut j = JobPosition {
                epoch: r.u32()?,
                step: r.u64()?,
                ranks_known: r.u32()?,
                nodes: r.u32()?,
                first_batch: r.u64()?,
                rank_position: None,
            };
            let known = r.bool()?;
            let (e, st) = (r.u32()?, r.u64()?);
            if known {
                j.rank_position = Some((e, st));
            } else if (e, st) != (0, 0) {
                return Err(ProtocolError::AbsentNotZero);
            }
            Message::JobPosition(j)
        }
        KIND_SESSION_OPENED => {
            let mut o = SessionOpened {
                session_id: r.u64()?,
                instance_epoch: r.u64()?,
                arena_size: r.u64()?,
                segment_size: r.u64()?,
                samples_per_epoch: r.u64()?,
                batches_per_epoch: r.u64()?,
                fd_count: r.u8()?,
                catalog: None,
                rank_batches_per_epoch: 0,
                prepared: None,
            };
            // The trailer, only for clients that asked: the rank's batches
            // and the catalog, both or neither; then, for a prepared
            // dataset, the samples' shape.
            if !r.rest.is_empty() {
                o.rank_batches_per_epoch = r.u64()?;
                o.catalog = Some(r.catalog()?);
                if !r.rest.is_empty() {
                    o.prepared = Some([r.u32()?, r.u32()?, r.u32()?]);
                }
            }
            Message::SessionOpened(o)
        }
        KIND_CLOSE_SESSION => Message::CloseSession {
            session_id: r.u64()?,
        },
        KIND_SESSION_CLOSED => Message::SessionClosed {
            session_id: r.u64()?,
        },
        KIND_ERROR => {
            let raw = r.i32()?;
            let code = ErrorCode::from_i32(raw).ok_or(ProtocolError::BadErrorCode(raw))?;
            Message::Error(ErrorReply {
                code,
                message: r.string()?,
            })
        }
        KIND_PEER_QUERY => Message::PeerQuery,
        KIND_PEER_IDENTITY => {
            let mode = r.u8()?;
            let membership =
                MembershipMode::from_code(mode).ok_or(ProtocolError::BadMembership(mode))?;
            Message::PeerIdentity(PeerIdentity {
                membership,
                node_id: r.string()?,
                addr: r.string()?,
                capacity: r.u64()?,
                job_id: r.string()?,
                view_epoch: r.u64()?,
                view_digest: r.take()?,
                members: r.u32()?,
            })
        }
        KIND_VIEW_CHUNK => Message::ViewChunk(r.chunk()?),
        KIND_LAYOUT_CHUNK => Message::LayoutChunk(r.chunk()?),
        KIND_ASSIGNMENT_INFO => Message::AssignmentInfo(AssignmentInfo {
            locality: r.bool()?,
            digest: r.take()?,
            note: r.string()?,
        }),
        KIND_VIEW_JOINED => Message::ViewJoined(ViewJoined {
            view_epoch: r.u64()?,
            view_digest: r.take()?,
            installed: r.bool()?,
            sessions_ended: r.u32()?,
        }),
        other => return Err(ProtocolError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(msg)
}

/// Decodes exactly one frame (one `SOCK_SEQPACKET` datagram). A short frame
/// is [`ProtocolError::Truncated`]; bytes after the frame are
/// [`ProtocolError::TrailingBytes`].
pub fn decode_frame(frame: &[u8]) -> Result<Message, ProtocolError> {
    let header = parse_header(frame)?.ok_or(ProtocolError::Truncated)?;
    let body = &frame[HEADER_LEN..];
    if body.len() < header.body_len {
        return Err(ProtocolError::Truncated);
    }
    if body.len() > header.body_len {
        return Err(ProtocolError::TrailingBytes(body.len() - header.body_len));
    }
    decode_body(header.kind, body)
}

/// Reassembles frames from a byte stream.
///
/// A header is checked as soon as its 8 bytes have arrived, so a peer cannot
/// make the decoder wait for (or buffer) more than one [`MAX_FRAME`]-sized
/// frame. Besides that partial frame, the decoder holds only the bytes fed
/// since the last call to [`Decoder::next_message`] that returned
/// `Ok(None)`. After an error the stream is out of sync: every later call
/// returns the same error.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    failed: Option<ProtocolError>,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Appends bytes received from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        match self.try_next() {
            Ok(m) => Ok(m),
            Err(e) => {
                self.failed = Some(e);
                self.buf = Vec::new();
                self.start = 0;
                Err(e)
            }
        }
    }

    fn try_next(&mut self) -> Result<Option<Message>, ProtocolError> {
        let pending = &self.buf[self.start..];
        let Some(header) = parse_header(pending)? else {
            return Ok(None);
        };
        let total = HEADER_LEN + header.body_len;
        let Some(frame) = pending.get(..total) else {
            return Ok(None);
        };
        let msg = decode_body(header.kind, &frame[HEADER_LEN..])?;
        self.start += total;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(msg))
    }

    /// Bytes received but not yet returned as messages.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_open() -> OpenSession {
        OpenSession {
            seed: 0x0123_4567_89ab_cdef,
            first_epoch: 3,
            epoch_count: 90,
            rank: 1,
            world_size: 8,
            drop_last: true,
            ready_capacity: 64,
            ..OpenSession::new("imagenet-train", 256)
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The wire format of one OpenSession, pinned. If this test fails the
    /// format changed: bump PROTOCOL_VERSION and update docs/shm-layout.md.
    #[test]
    fn open_session_wire_format_is_pinned() {
        let frame = encode_to_vec(&Message::OpenSession(sample_open()));
        let expected = concat!(
            "39000000",
            "0100",
            "0100", // body_len 57, kind 1, version 1
            "0e00",
            "696d6167656e65742d747261696e", // "imagenet-train"
            "efcdab8967452301",             // seed
            "03000000",
            "5a000000",
            "00010000",
            "01000000",
            "08000000", // epochs, batch, rank, world
            "01",       // drop_last
            "40000000",
            "00000000",
            "01000000", // capacities, client_abi
        );
        assert_eq!(hex(&frame), expected);
        assert_eq!(frame.len(), HEADER_LEN + 57);
        assert_eq!(
            decode_frame(&frame),
            Ok(Message::OpenSession(sample_open()))
        );
    }

    #[test]
    fn small_frames_are_pinned() {
        assert_eq!(
            hex(&encode_to_vec(&Message::CloseSession { session_id: 7 })),
            "08000000030001000700000000000000"
        );
        assert_eq!(
            hex(&encode_to_vec(&Message::Error(ErrorReply {
                code: ErrorCode::NotFound,
                message: "no".into()
            }))),
            "0800000005000100f8ffffff02006e6f"
        );
    }

    /// The locality request rides after the older fields: an older client's
    /// frame (without it) decodes as exact order, a newer one's carries the
    /// flag byte and the digest.
    #[test]
    fn a_prepared_shape_follows_the_catalog_and_only_it() {
        let base = SessionOpened {
            session_id: 1,
            instance_epoch: 2,
            arena_size: 3,
            segment_size: 4,
            samples_per_epoch: 5,
            batches_per_epoch: 6,
            fd_count: 2,
            catalog: Some(CatalogId {
                fingerprint: 7,
                sketch: vec![1, 2, 3],
            }),
            rank_batches_per_epoch: 6,
            prepared: None,
        };
        let plain = encode_to_vec(&Message::SessionOpened(base.clone()));
        let shaped = SessionOpened {
            prepared: Some([224, 160, 3]),
            ..base.clone()
        };
        let frame = encode_to_vec(&Message::SessionOpened(shaped.clone()));
        // Twelve bytes after the catalog, which a reply without them
        // (an older agent, or a dataset served as stored bytes) lacks.
        assert_eq!(frame.len(), plain.len() + 12);
        assert_eq!(&frame[8..plain.len()], &plain[8..]);
        assert_eq!(&frame[plain.len()..plain.len() + 4], &224u32.to_le_bytes());
        assert_eq!(decode_frame(&frame), Ok(Message::SessionOpened(shaped)));
        assert_eq!(
            decode_frame(&plain),
            Ok(Message::SessionOpened(base.clone()))
        );
        // Without the catalog trailer there is no shape either: a client
        // that did not ask gets the reply it knows.
        let bare = SessionOpened {
            catalog: None,
            rank_batches_per_epoch: 0,
            prepared: Some([1, 1, 3]),
            ..base
        };
        match decode_frame(&encode_to_vec(&Message::SessionOpened(bare))) {
            Ok(Message::SessionOpened(o)) => assert_eq!((o.catalog, o.prepared), (None, None)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_position_has_a_fixed_length_and_refuses_a_bad_flag() {
        let j = JobPosition {
            epoch: 2,
            step: 9,
            ranks_known: 3,
            nodes: 2,
            first_batch: 29,
            rank_position: Some((2, 11)),
        };
        let f = encode_to_vec(&Message::JobPosition(j));
        assert_eq!(f.len(), HEADER_LEN + JOB_POSITION_LEN);
        assert_eq!(decode_frame(&f), Ok(Message::JobPosition(j)));
        let mut bad = f.clone();
        bad[HEADER_LEN + 28] = 2;
        assert_eq!(decode_frame(&bad), Err(ProtocolError::BadBool(2)));
        assert_eq!(
            decode_frame(&f[..f.len() - 1]),
            Err(ProtocolError::Truncated)
        );
        // Absent, the rank's position must be zeros: one encoding per
        // message (the fuzz target re-encodes what it decodes).
        let mut absent = f.clone();
        absent[HEADER_LEN + 28] = 0;
        assert_eq!(decode_frame(&absent), Err(ProtocolError::AbsentNotZero));
        let none = encode_to_vec(&Message::JobPosition(JobPosition {
            rank_position: None,
            ..j
        }));
        assert_eq!(decode_frame(&none).map(|m| encode_to_vec(&m)), Ok(none));
    }

    #[test]
    fn locality_request_is_an_optional_trailer() {
        let exact = encode_to_vec(&Message::OpenSession(sample_open()));
        let mut o = sample_open();
        o.locality = Some([0xab; 32]);
        let frame = encode_to_vec(&Message::OpenSession(o.clone()));
        assert_eq!(frame.len(), exact.len() + 33);
        assert_eq!(&frame[8..exact.len()], &exact[8..]);
        assert_eq!(frame[exact.len()], 1);
        assert_eq!(decode_frame(&frame), Ok(Message::OpenSession(o.clone())));
        let q = encode_to_vec(&Message::AssignmentQuery(o.clone()));
        assert_eq!(decode_frame(&q), Ok(Message::AssignmentQuery(o.clone())));
        let q = encode_to_vec(&Message::JobQuery(o.clone()));
        assert_eq!(decode_frame(&q), Ok(Message::JobQuery(o)));
        // A flag byte without its digest is truncated, not exact order.
        let with = |extra: &[u8]| {
            let mut f = exact.clone();
            f.extend_from_slice(extra);
            let body = (f.len() - HEADER_LEN) as u32;
            f[0..4].copy_from_slice(&body.to_le_bytes());
            f
        };
        assert_eq!(decode_frame(&with(&[1])), Err(ProtocolError::Truncated));
        assert_eq!(
            decode_frame(&with(&[0x40])),
            Err(ProtocolError::BadFlags(0x40)),
            "unknown trailer fields are refused"
        );
        assert_eq!(
            decode_frame(&with(&[0x10])),
            Err(ProtocolError::BadFlags(0x10)),
            "accepting a changed catalog needs the catalog"
        );
        // Workers are said only when more than one.
        let mut one = vec![4];
        one.extend_from_slice(&0u32.to_le_bytes());
        one.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(decode_frame(&with(&one)), Err(ProtocolError::BadFlags(4)));
        assert_eq!(
            decode_frame(&with(&[0])),
            Err(ProtocolError::BadFlags(0)),
            "an empty trailer is refused: a frame has one encoding"
        );
        assert_eq!(
            decode_frame(&with(&[2, 0, 0, 0, 0, 0, 0, 0, 0])),
            Err(ProtocolError::BadFlags(2)),
            "a first batch of 0 is said by leaving it out"
        );
        // A first batch alone, and with a digest.
        let mut r = sample_open();
        r.first_batch = 7;
        let f = encode_to_vec(&Message::OpenSession(r.clone()));
        assert_eq!(f.len(), exact.len() + 9);
        assert_eq!(decode_frame(&f), Ok(Message::OpenSession(r.clone())));
        r.locality = Some([3; 32]);
        let f = encode_to_vec(&Message::OpenSession(r.clone()));
        assert_eq!(f.len(), exact.len() + 41);
        assert_eq!(decode_frame(&f), Ok(Message::OpenSession(r)));
    }

    #[test]
    fn validate_names_each_field() {
        assert_eq!(sample_open().validate(), Ok(()));
        type Mutation = Box<dyn Fn(&mut OpenSession)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("dataset", Box::new(|o| o.dataset.clear())),
            ("dataset", Box::new(|o| o.dataset = "x".repeat(256))),
            ("batch_size", Box::new(|o| o.batch_size = 0)),
            (
                "batch_size",
                Box::new(|o| o.batch_size = MAX_BATCH_SAMPLES + 1),
            ),
            ("batch_size", Box::new(|o| o.batch_size = 1_000_000)),
            ("world_size", Box::new(|o| o.world_size = 0)),
            ("rank", Box::new(|o| o.rank = 8)),
            ("epoch_count", Box::new(|o| o.epoch_count = 0)),
            (
                "epoch_count",
                Box::new(|o| {
                    o.first_epoch = u32::MAX;
                    o.epoch_count = 1;
                }),
            ),
            ("ready_capacity", Box::new(|o| o.ready_capacity = 3)),
            ("ready_capacity", Box::new(|o| o.ready_capacity = 1)),
            (
                "release_capacity",
                Box::new(|o| o.release_capacity = MAX_RING_CAPACITY * 2),
            ),
        ];
        for (field, mutate) in cases {
            let mut o = sample_open();
            mutate(&mut o);
            let err = o.validate().expect_err(field);
            assert_eq!(err.code, ErrorCode::InvalidArgument);
            assert!(
                err.message.starts_with(field),
                "{field}: message {:?}",
                err.message
            );
        }
        let mut o = sample_open();
        o.dataset = "é".repeat(127); // 254 bytes
        o.ready_capacity = MAX_RING_CAPACITY;
        o.release_capacity = 2;
        o.batch_size = MAX_BATCH_SAMPLES;
        o.first_epoch = u32::MAX - 1;
        o.epoch_count = 1;
        assert_eq!(o.validate(), Ok(()));
    }

    #[test]
    fn every_truncation_is_truncated() {
        let msgs = [
            Message::OpenSession(sample_open()),
            Message::SessionOpened(SessionOpened {
                session_id: 1,
                instance_epoch: 2,
                arena_size: 3,
                segment_size: 4,
                samples_per_epoch: 5,
                batches_per_epoch: 6,
                fd_count: 2,
                catalog: None,
                rank_batches_per_epoch: 0,
                prepared: None,
            }),
            Message::CloseSession { session_id: 9 },
            Message::SessionClosed { session_id: 9 },
            Message::Error(ErrorReply {
                code: ErrorCode::Busy,
                message: "later".into(),
            }),
        ];
        for msg in msgs {
            let frame = encode_to_vec(&msg);
            for cut in 0..frame.len() {
                assert_eq!(
                    decode_frame(&frame[..cut]),
                    Err(ProtocolError::Truncated),
                    "{msg:?} cut at {cut}"
                );
            }
            let mut longer = frame.clone();
            longer.push(0);
            assert_eq!(decode_frame(&longer), Err(ProtocolError::TrailingBytes(1)));
        }
    }

    #[test]
    fn body_length_lies_are_caught() {
        // A body_len shorter than the fields: the fields run out.
        let mut frame = encode_to_vec(&Message::CloseSession { session_id: 1 });
        frame[0] = 4;
        frame.truncate(HEADER_LEN + 4);
        assert_eq!(decode_frame(&frame), Err(ProtocolError::Truncated));
        // A body_len longer than the fields: bytes left inside the body.
        let mut frame = encode_to_vec(&Message::CloseSession { session_id: 1 });
        frame[0] = 10;
        frame.extend_from_slice(&[0, 0]);
        assert_eq!(decode_frame(&frame), Err(ProtocolError::TrailingBytes(2)));
    }

    #[test]
    fn header_checks() {
        let good = encode_to_vec(&Message::SessionClosed { session_id: 5 });

        let mut bad_version = good.clone();
        bad_version[6] = 2;
        assert_eq!(
            decode_frame(&bad_version),
            Err(ProtocolError::BadVersion(2))
        );
        assert_eq!(ProtocolError::BadVersion(2).code(), ErrorCode::Version);

        let mut bad_kind = good.clone();
        bad_kind[4] = 0;
        assert_eq!(decode_frame(&bad_kind), Err(ProtocolError::UnknownKind(0)));
        bad_kind[4] = 15;
        assert_eq!(decode_frame(&bad_kind), Err(ProtocolError::UnknownKind(15)));
        assert_eq!(ProtocolError::UnknownKind(13).code(), ErrorCode::Protocol);

        let mut too_large = good.clone();
        too_large[0..4].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert_eq!(
            decode_frame(&too_large),
            Err(ProtocolError::TooLarge(MAX_BODY as u32 + 1))
        );
        too_large[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_frame(&too_large),
            Err(ProtocolError::TooLarge(u32::MAX))
        );
        // The decoder rejects it from the header alone, without waiting.
        let mut d = Decoder::new();
        d.feed(&too_large[..HEADER_LEN]);
        assert_eq!(d.next_message(), Err(ProtocolError::TooLarge(u32::MAX)));
        d.feed(&good);
        assert_eq!(d.next_message(), Err(ProtocolError::TooLarge(u32::MAX)));
    }

    #[test]
    fn field_checks() {
        let mut frame = encode_to_vec(&Message::OpenSession(sample_open()));
        let drop_last_at = HEADER_LEN + 2 + 14 + 8 + 20;
        assert_eq!(frame[drop_last_at], 1);
        frame[drop_last_at] = 2;
        assert_eq!(decode_frame(&frame), Err(ProtocolError::BadBool(2)));

        let mut frame = encode_to_vec(&Message::OpenSession(sample_open()));
        frame[HEADER_LEN + 2] = 0xff;
        assert_eq!(decode_frame(&frame), Err(ProtocolError::BadUtf8));

        let mut frame = encode_to_vec(&Message::Error(ErrorReply {
            code: ErrorCode::Io,
            message: String::new(),
        }));
        frame[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(-99i32).to_le_bytes());
        assert_eq!(decode_frame(&frame), Err(ProtocolError::BadErrorCode(-99)));
        frame[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1i32.to_le_bytes());
        assert_eq!(decode_frame(&frame), Err(ProtocolError::BadErrorCode(1)));
    }

    #[test]
    fn long_strings_are_cut_to_fit_a_frame() {
        let msg = Message::Error(ErrorReply {
            code: ErrorCode::Internal,
            message: "ü".repeat(10_000),
        });
        let frame = encode_to_vec(&msg);
        assert!(frame.len() <= MAX_FRAME);
        let Ok(Message::Error(e)) = decode_frame(&frame) else {
            panic!("decode failed");
        };
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(e.message.len() > 4000 && e.message.chars().all(|c| c == 'ü'));

        let mut open = sample_open();
        open.dataset = "d".repeat(100_000);
        let frame = encode_to_vec(&Message::OpenSession(open));
        assert_eq!(frame.len(), MAX_FRAME);
        let Ok(Message::OpenSession(o)) = decode_frame(&frame) else {
            panic!("decode failed");
        };
        assert!(o.dataset.len() > MAX_DATASET_NAME);
        assert!(o.validate().unwrap_err().message.starts_with("dataset"));
    }

    #[test]
    fn display_messages() {
        for e in [
            ProtocolError::Truncated,
            ProtocolError::TooLarge(5000),
            ProtocolError::BadVersion(9),
            ProtocolError::UnknownKind(77),
            ProtocolError::BadUtf8,
            ProtocolError::BadBool(3),
            ProtocolError::BadErrorCode(-40),
            ProtocolError::TrailingBytes(2),
        ] {
            let s = e.to_string();
            assert!(s.len() > 10, "{s}");
        }
        assert_eq!(
            ProtocolError::BadVersion(9).to_string(),
            "handshake protocol version 9, this side speaks 1"
        );
    }

    #[test]
    fn decoder_handles_several_frames_in_one_feed() {
        let mut bytes = Vec::new();
        for id in 0..5 {
            encode(&Message::CloseSession { session_id: id }, &mut bytes);
        }
        bytes.extend_from_slice(&[1, 0]); // start of a sixth header
        let mut d = Decoder::new();
        d.feed(&bytes);
        for id in 0..5 {
            assert_eq!(
                d.next_message(),
                Ok(Some(Message::CloseSession { session_id: id }))
            );
        }
        assert_eq!(d.next_message(), Ok(None));
        assert_eq!(d.pending(), 2);
    }

    fn arb_error_code() -> impl Strategy<Value = ErrorCode> {
        proptest::sample::select(ErrorCode::ALL.to_vec())
    }

    fn arb_catalog_id() -> impl Strategy<Value = CatalogId> {
        (
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..=MAX_SKETCH),
        )
            .prop_map(|(fingerprint, sketch)| CatalogId {
                fingerprint,
                sketch,
            })
    }

    fn arb_catalog_check() -> impl Strategy<Value = CatalogCheck> {
        (arb_catalog_id(), any::<bool>()).prop_map(|(expected, accept_changed)| CatalogCheck {
            expected,
            accept_changed,
        })
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let open = (
            ".{0,40}",
            any::<u64>(),
            any::<[u32; 5]>(),
            any::<bool>(),
            any::<[u32; 3]>(),
            proptest::option::of(any::<[u8; 32]>()),
            any::<bool>(),
            prop_oneof![Just(0u64), any::<u64>()],
            (
                prop_oneof![Just((0u32, 1u32)), (any::<u32>(), 2u32..)],
                proptest::option::of(arb_catalog_check()),
            ),
        )
            .prop_map(
                |(dataset, seed, a, drop_last, b, locality, query, first_batch, (w, catalog))| {
                    let o = OpenSession {
                        dataset,
                        seed,
                        first_epoch: a[0],
                        epoch_count: a[1],
                        batch_size: a[2],
                        rank: a[3],
                        world_size: a[4],
                        drop_last,
                        ready_capacity: b[0],
                        release_capacity: b[1],
                        client_abi: b[2],
                        locality,
                        first_batch,
                        worker: w.0,
                        workers: w.1,
                        catalog,
                        wants_catalog: w.0 % 2 == 1,
                    };
                    if query {
                        Message::AssignmentQuery(o)
                    } else {
                        Message::OpenSession(o)
                    }
                },
            );
        let opened = (
            any::<[u64; 6]>(),
            any::<u8>(),
            proptest::option::of(arb_catalog_id()),
            proptest::option::of(any::<[u32; 3]>()),
        )
            .prop_map(|(v, fd_count, catalog, shape)| {
                let rank_batches_per_epoch = if catalog.is_some() { v[5] ^ v[0] } else { 0 };
                let prepared = if catalog.is_some() { shape } else { None };
                Message::SessionOpened(SessionOpened {
                    session_id: v[0],
                    instance_epoch: v[1],
                    arena_size: v[2],
                    segment_size: v[3],
                    samples_per_epoch: v[4],
                    batches_per_epoch: v[5],
                    fd_count,
                    catalog,
                    rank_batches_per_epoch,
                    prepared,
                })
            });
        prop_oneof![
            open,
            opened,
            any::<u64>().prop_map(|session_id| Message::CloseSession { session_id }),
            any::<u64>().prop_map(|session_id| Message::SessionClosed { session_id }),
            (arb_error_code(), ".{0,200}")
                .prop_map(|(code, message)| Message::Error(ErrorReply { code, message })),
            Just(Message::PeerQuery),
            (
                0u8..5,
                ".{0,40}",
                ".{0,40}",
                any::<u64>(),
                ".{0,40}",
                any::<u64>(),
                any::<[u8; 32]>(),
                any::<u32>()
            )
                .prop_map(
                    |(m, node_id, addr, capacity, job_id, view_epoch, view_digest, members)| {
                        Message::PeerIdentity(PeerIdentity {
                            membership: MembershipMode::from_code(m).unwrap(),
                            node_id,
                            addr,
                            capacity,
                            job_id,
                            view_epoch,
                            view_digest,
                            members,
                        })
                    }
                ),
            (
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(total, offset, bytes)| Message::ViewChunk(ViewChunk {
                    total,
                    offset,
                    bytes
                })),
            (
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(total, offset, bytes)| Message::LayoutChunk(ViewChunk {
                    total,
                    offset,
                    bytes
                })),
            (any::<[u64; 3]>(), any::<[u32; 4]>(), any::<bool>()).prop_map(|(l, w, known)| {
                Message::JobPosition(JobPosition {
                    epoch: w[0],
                    step: l[0],
                    ranks_known: w[1],
                    nodes: w[2],
                    first_batch: l[1],
                    rank_position: known.then_some((w[3], l[2])),
                })
            }),
            (any::<bool>(), any::<[u8; 32]>(), ".{0,80}").prop_map(|(locality, digest, note)| {
                Message::AssignmentInfo(AssignmentInfo {
                    locality,
                    digest,
                    note,
                })
            }),
            (any::<u64>(), any::<[u8; 32]>(), any::<bool>(), any::<u32>()).prop_map(
                |(view_epoch, view_digest, installed, sessions_ended)| {
                    Message::ViewJoined(ViewJoined {
                        view_epoch,
                        view_digest,
                        installed,
                        sessions_ended,
                    })
                }
            ),
        ]
    }

    #[test]
    fn a_view_travels_in_chunks_and_is_reassembled() {
        let view: Vec<u8> = (0..3 * VIEW_CHUNK + 17).map(|i| (i * 7) as u8).collect();
        let chunks = ViewChunk::split(&view);
        assert_eq!(chunks.len(), 4);
        let mut a = ViewAssembler::default();
        for (i, c) in chunks.iter().enumerate() {
            let frame = encode_to_vec(&Message::ViewChunk(c.clone()));
            assert!(frame.len() <= MAX_FRAME);
            let Ok(Message::ViewChunk(c)) = decode_frame(&frame) else {
                panic!("chunk {i} did not round-trip");
            };
            let out = a.push(c).unwrap();
            assert_eq!(out.is_some(), i == 3);
            assert!(
                a.allocated() <= view.len(),
                "{} bytes allocated for a hand-in of {}",
                a.allocated(),
                view.len()
            );
            if let Some(v) = out {
                assert_eq!(v.len(), v.capacity(), "grown to the total exactly");
                assert_eq!(v, view);
            }
        }
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn out_of_order_oversized_and_overrunning_chunks_are_refused() {
        let view = vec![1u8; 2 * VIEW_CHUNK];
        let chunks = ViewChunk::split(&view);
        let mut a = ViewAssembler::default();
        // The second chunk first.
        let e = a.push(chunks[1].clone()).unwrap_err();
        assert!(e.message.contains("does not follow"), "{e}");
        // A chunk announcing another total midway.
        a.push(chunks[0].clone()).unwrap();
        let mut other = chunks[1].clone();
        other.total += 1;
        assert!(a.push(other).is_err());
        assert_eq!(a.pending(), 0, "a refused chunk starts over");
        // Too large in all.
        let huge = ViewChunk {
            total: MAX_VIEW_BYTES + 1,
            offset: 0,
            bytes: vec![0; 10],
        };
        assert!(a.push(huge).unwrap_err().message.contains("limit"));
        // Bytes past the announced total.
        let over = ViewChunk {
            total: 5,
            offset: 0,
            bytes: vec![0; 6],
        };
        assert!(a.push(over).unwrap_err().message.contains("past"));
        // An empty view is one empty chunk, complete at once.
        let empty = ViewChunk::split(&[]);
        assert_eq!(empty.len(), 1);
        assert_eq!(a.push(empty[0].clone()).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn an_unknown_membership_mode_is_refused() {
        let mut frame = encode_to_vec(&Message::PeerIdentity(PeerIdentity {
            membership: MembershipMode::Session,
            node_id: "n".into(),
            addr: "h:1".into(),
            capacity: 1,
            job_id: String::new(),
            view_epoch: 0,
            view_digest: [0; 32],
            members: 0,
        }));
        frame[HEADER_LEN] = 9;
        assert_eq!(decode_frame(&frame), Err(ProtocolError::BadMembership(9)));
    }

    proptest! {
        #[test]
        fn round_trip(msg in arb_message()) {
            let frame = encode_to_vec(&msg);
            prop_assert!(frame.len() <= MAX_FRAME);
            prop_assert_eq!(decode_frame(&frame), Ok(msg));
        }

        #[test]
        fn byte_by_byte_stream(msgs in proptest::collection::vec(arb_message(), 1..6)) {
            let mut bytes = Vec::new();
            for m in &msgs {
                encode(m, &mut bytes);
            }
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for b in &bytes {
                d.feed(std::slice::from_ref(b));
                while let Some(m) = d.next_message().unwrap() {
                    got.push(m);
                }
            }
            prop_assert_eq!(got, msgs);
            prop_assert_eq!(d.pending(), 0);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_frame(&bytes);
            let mut d = Decoder::new();
            d.feed(&bytes);
            for _ in 0..bytes.len() + 1 {
                match d.next_message() {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }

        #[test]
        fn plausible_garbage_never_panics(
            kind in 0u16..12,
            body in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            // A valid header over a random body reaches the field decoders.
            let mut frame = Vec::new();
            frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
            frame.extend_from_slice(&kind.to_le_bytes());
            frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            frame.extend_from_slice(&body);
            if let Ok(m) = decode_frame(&frame) {
                // Anything accepted re-encodes to the same bytes.
                prop_assert_eq!(encode_to_vec(&m), frame);
            }
        }
    }
}
