//! One session: the handshake, the read-only arena, the ring segment, and
//! the loop that takes batches and hands them back.
//!
//! Opening: send an open-session request on the session's own connection,
//! receive the reply with two fds (arena, segment), map the arena read-only
//! (its seals and size are checked), attach the segment (magic, layout
//! version, the reply's instance epoch, geometry), and take the loader's ring
//! ends: consumer of the ready ring, producer of the release ring.
//!
//! Waiting: the ready ring is waited on in slices of at most [`WAIT_SLICE`];
//! between slices the session checks the segment's state word (fenced,
//! closed) and the socket for hang-up, so a dead agent costs a loader at most
//! its own timeout. The agent wakes a parked loader when it fences or closes
//! a session.
//!
//! Heartbeats: every call beats the segment's `loader_heartbeat` word (and
//! so does every wake-up while waiting, and the process's background thread,
//! [`crate::heartbeat`]). While no batch is ready the session also reads the
//! agent's `heartbeat_ms`: once it is older than
//! `max(3 × heartbeat_interval_ms, 1 s)` the call fails with
//! [`ErrorCode::Disconnected`] ("agent unresponsive") instead of waiting for
//! ever. That failure is not sticky: if the agent resumes, the next call
//! goes on.

mod resume;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use granary_shm::arena::ArenaView;
use granary_shm::handshake::{
    AssignmentInfo, CatalogId, ErrorReply, JobPosition, Message, ViewChunk, ViewJoined,
    MAX_LAYOUT_BYTES, MAX_VIEW_BYTES,
};
use granary_shm::layout::{state, BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::region::Region;
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::LoaderSegment;
use granary_shm::socket::{SeqPacket, SocketError};
use granary_shm::validate::copy_sample_table;
use granary_shm::{monotonic_ms, BatchDescriptor, ErrorCode, ReleaseDescriptor, SampleEntry};

use crate::batch::{Batch, Returns};
use crate::error::{Error, Result};
use crate::options::{SessionInfo, SessionOptions};
use crate::state::SessionState;
use resume::Resume;

/// Longest single wait on the ready ring before the session re-checks the
/// segment state and the socket.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

/// How long a release waits for room in a full release ring before it is
/// deferred to the session's next call.
pub const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// How long closing waits for the agent to confirm.
pub const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The shortest silence after which an agent counts as unresponsive.
pub const MIN_AGENT_SILENCE: Duration = Duration::from_secs(1);

/// How long an agent that beats every `interval_ms` may stay silent before
/// the loader gives up on it: `max(3 × interval, MIN_AGENT_SILENCE)`;
/// `None` (never) for an interval of 0.
pub fn agent_silence_limit(interval_ms: u64) -> Option<Duration> {
    (interval_ms > 0)
        .then(|| Duration::from_millis(interval_ms.saturating_mul(3)).max(MIN_AGENT_SILENCE))
}

/// The agent's heartbeat word as last seen, and when (loader's
/// [`monotonic_ms`]).
#[derive(Clone, Copy, Debug)]
struct Seen {
    value: u64,
    at_ms: u64,
}

/// How long a fenced session waits for the agent's message saying why.
const FENCE_NOTE_WAIT: Duration = Duration::from_millis(200);

/// How long the call after the last batch waits for the agent's empty
/// end-of-stream descriptor, to hand it back.
const END_DESCRIPTOR_WAIT: Duration = Duration::from_millis(100);

/// Source of process-unique session keys (batches remember theirs).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// Where the stream stands.
#[derive(Debug)]
enum Stream {
    /// Batches may follow.
    Open,
    /// The last batch (flagged end of stream) was delivered with samples.
    LastDelivered,
    /// End of stream was reported.
    Ended,
    /// A fatal error (fenced, disconnected, broken ring): reported again on
    /// every call.
    Failed(Error),
}

/// An open session: a stream of batches from the agent.
///
/// A session is used by one thread at a time (`&mut self`); it may move
/// between threads. Batches it hands out may be read from any thread.
pub struct Session {
    conn: SeqPacket,
    arena: ArenaView,
    /// Shared with the process's heartbeat thread (which holds a weak
    /// reference only).
    segment: Arc<LoaderSegment>,
    /// The agent's heartbeat as last seen.
    agent_beat: Seen,
    ready: Consumer<BatchDescriptor>,
    release: Producer<ReleaseDescriptor>,
    info: SessionInfo,
    key: u64,
    next_seq: u64,
    stream: Stream,
    /// Batches dropped without an explicit release.
    returns: Arc<Returns>,
    /// Releases not yet in the ring (it was full).
    pending: Vec<ReleaseDescriptor>,
    /// Sample-table buffers of released batches, for reuse.
    spare_tables: Vec<Vec<SampleEntry>>,
    closed: bool,
    /// What the agent said of the view handed in, if one was.
    view: Option<std::result::Result<ViewJoined, Error>>,
    /// The first requested epoch: a batch of an earlier one is refused.
    first_epoch: u64,
    /// The last requested epoch: its last batch is flagged end of stream.
    last_epoch: u64,
    /// Check each sample's bytes against its CRC-32C before handing a
    /// batch out (the identity checks run either way).
    verify_crc: bool,
    /// How to open the session again when its agent goes away (`None`:
    /// fail instead).
    resume: Option<Box<Resume>>,
    /// What the session was opened with and the dataset's catalog: its
    /// checkpointable state, with `handed` ([`Session::state`]).
    origin: Box<(SessionOptions, Option<CatalogId>)>,
    /// Batches handed out since the open.
    handed: u64,
    /// The waits and busy time reported to the agent.
    waits: crate::waits::WaitClock,
}

fn protocol(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::Protocol, message)
}

/// Receives the agent's answer to an open request.
///
/// An agent that answers and closes the connection while our request is
/// still unread in its queue makes the kernel report `ECONNRESET` once,
/// ahead of the answer itself: read again to get the answer.
fn recv_reply(conn: &SeqPacket) -> std::result::Result<(Message, Vec<OwnedFd>), SocketError> {
    match conn.recv_message() {
        Err(SocketError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
            conn.recv_message()
        }
        other => other,
    }
}

/// The agent's error reply to an open request.
fn refusal(e: ErrorReply) -> Error {
    let code = if e.code == ErrorCode::Ok {
        ErrorCode::Protocol
    } else {
        e.code
    };
    Error::new(
        code,
        format!("the agent refused the session: {}", e.message),
    )
}

fn violation_name(code: u32) -> &'static str {
    match code {
        1 => "ring index violation",
        2 => "out-of-bounds descriptor",
        3 => "invalid field",
        4 => "release of a batch that was not on loan",
        5 => "misaligned descriptor",
        6 => "ended by the agent: a newer membership view of the job (a relaunch) replaced the one this session joined",
        7 => "ended by the agent: this loader was silent past the agent's client timeout and its batches were taken back",
        _ => "unspecified violation",
    }
}

/// Hands the agent the encoded view `view` on `conn` and waits for its
/// answer.
pub(crate) fn join_view(conn: &SeqPacket, view: &[u8], wait: Duration) -> Result<ViewJoined> {
    if view.len() > MAX_VIEW_BYTES as usize {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!("view: {} bytes, the limit is {MAX_VIEW_BYTES}", view.len()),
        ));
    }
    for chunk in ViewChunk::split(view) {
        conn.send_message(&Message::ViewChunk(chunk), &[])
            .map_err(|e| Error::socket("handing in the membership view", &e))?;
    }
    conn.set_read_timeout(Some(wait))
        .map_err(|e| Error::socket("setting the handshake timeout", &e))?;
    let (reply, _fds) =
        recv_reply(conn).map_err(|e| Error::recv("waiting for the agent's view answer", &e))?;
    match reply {
        Message::ViewJoined(j) => Ok(j),
        Message::Error(e) => Err(Error::new(
            if e.code == ErrorCode::Ok {
                ErrorCode::Protocol
            } else {
                e.code
            },
            format!("the agent refused the membership view: {}", e.message),
        )),
        other => Err(protocol(format!(
            "expected a view answer, the agent sent {other:?}"
        ))),
    }
}

/// The identity checks every batch gets before it is handed out, with or
/// without the CRC pass, on top of the protocol's bounds checks
/// ([`copy_sample_table`]: every sample inside the arena, a failed sample
/// empty) and the sequence number and byte total checked by the caller. They
/// read the sample table only, never the samples' bytes:
///
/// * a batch with samples belongs to one of the session's epochs;
/// * no sample's bytes overlap the batch's own sample table (the agent
///   writes the table into the arena beside the samples it names).
///
/// What they cannot tell is whether the bytes at a sample's offset are still
/// the ones the agent recorded the CRC of; that is the CRC pass
/// (`verify_crc`), and docs/reliability.md says why the default leaves it
/// to the agent.
fn check_identity(
    d: &BatchDescriptor,
    table: &[SampleEntry],
    epochs: std::ops::RangeInclusive<u64>,
) -> std::result::Result<(), String> {
    if d.sample_count == 0 {
        return Ok(());
    }
    if !epochs.contains(&u64::from(d.epoch)) {
        return Err(format!(
            "batch of epoch {}, the session asked for epochs {} to {}",
            d.epoch,
            epochs.start(),
            epochs.end()
        ));
    }
    let table_start = d.table_offset;
    let table_end = table_start + u64::from(d.sample_count) * size_of::<SampleEntry>() as u64;
    for e in table.iter().filter(|e| e.status == 0 && e.length > 0) {
        let end = e.offset + u64::from(e.length);
        if e.offset < table_end && table_start < end {
            return Err(format!(
                "sample {} (bytes {}..{end}) overlaps the batch's sample table ({table_start}..{table_end})",
                e.sample_id, e.offset
            ));
        }
    }
    Ok(())
}

/// Checks every sample of a validated table against its CRC-32C, in place;
/// a mismatch becomes a `Corrupt` failure of that sample (empty). Returns
/// how many failed.
fn verify_samples(arena: &ArenaView, table: &mut [SampleEntry]) -> usize {
    let mut bad = 0;
    for e in table.iter_mut().filter(|e| e.status == 0) {
        let ok = arena
            .crc32c(e.offset, e.length as usize)
            .is_ok_and(|crc| crc == e.crc32c);
        if !ok {
            e.status = ErrorCode::Corrupt.as_i32();
            e.length = 0;
            bad += 1;
        }
    }
    bad
}

/// What became of a view handed in before a query or an open.
pub(crate) type ViewOutcome = Option<std::result::Result<ViewJoined, Error>>;

/// Hands the agent the view and the rank layout of `options` on `conn`, as
/// a query or an open needs them. The view's refusal fails only with
/// `view_required` (or a lost connection); the layout is not answered (the
/// query or open that follows reports a bad one).
pub(crate) fn hand_in(conn: &SeqPacket, options: &SessionOptions) -> Result<ViewOutcome> {
    let view = match &options.view {
        None => None,
        Some(v) => match join_view(conn, v, options.open_timeout) {
            Ok(joined) => Some(Ok(joined)),
            Err(e) if options.view_required => return Err(e),
            Err(e) if e.code() == ErrorCode::Disconnected || e.code() == ErrorCode::Timeout => {
                return Err(e)
            }
            Err(e) => Some(Err(e)),
        },
    };
    if let Some(layout) = &options.layout {
        if layout.len() > MAX_LAYOUT_BYTES as usize {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "layout: {} bytes, the limit is {MAX_LAYOUT_BYTES}",
                    layout.len()
                ),
            ));
        }
        for chunk in ViewChunk::split(layout) {
            conn.send_message(&Message::LayoutChunk(chunk), &[])
                .map_err(|e| Error::socket("handing in the rank layout", &e))?;
        }
    }
    Ok(view)
}

/// Asks the agent on `conn` whether the session `options` describes could
/// be delivered in the locality-aware assignment, and with what digest.
pub(crate) fn query_assignment(
    conn: &SeqPacket,
    options: &SessionOptions,
) -> Result<AssignmentInfo> {
    let mut request = options.request();
    request.locality = None;
    request
        .validate()
        .map_err(|e| Error::new(e.code, e.message))?;
    hand_in(conn, options)?;
    conn.send_message(&Message::AssignmentQuery(request), &[])
        .map_err(|e| Error::socket("asking for the assignment", &e))?;
    conn.set_read_timeout(Some(options.open_timeout))
        .map_err(|e| Error::socket("setting the handshake timeout", &e))?;
    let (reply, _fds) = recv_reply(conn)
        .map_err(|e| Error::recv("waiting for the agent's assignment answer", &e))?;
    match reply {
        Message::AssignmentInfo(a) => Ok(a),
        Message::Error(e) => Err(refusal(e)),
        other => Err(protocol(format!(
            "expected an assignment answer, the agent sent {other:?}"
        ))),
    }
}

/// Asks the agent on `conn` where the job stands in the plan `options`
/// describe ([`crate::Client::job_position`]).
pub(crate) fn query_job(conn: &SeqPacket, options: &SessionOptions) -> Result<JobPosition> {
    let mut request = options.request();
    request.first_batch = 0;
    request.catalog = None;
    request
        .validate()
        .map_err(|e| Error::new(e.code, e.message))?;
    conn.send_message(&Message::JobQuery(request), &[])
        .map_err(|e| Error::socket("asking where the job stands", &e))?;
    conn.set_read_timeout(Some(options.open_timeout))
        .map_err(|e| Error::socket("setting the handshake timeout", &e))?;
    let (reply, _fds) =
        recv_reply(conn).map_err(|e| Error::recv("waiting for the agent's job position", &e))?;
    match reply {
        Message::JobPosition(j) => Ok(j),
        Message::Error(e) => Err(refusal(e)),
        other => Err(protocol(format!(
            "expected a job position, the agent sent {other:?}"
        ))),
    }
}

impl Session {
    /// Runs the handshake on `conn` and maps what the agent sent.
    pub(crate) fn open(conn: SeqPacket, options: &SessionOptions) -> Result<Session> {
        let request = options.request();
        request
            .validate()
            .map_err(|e| Error::new(e.code, e.message))?;
        if options.open_timeout.is_zero() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                "open_timeout: must be positive",
            ));
        }
        let view = hand_in(&conn, options)?;
        if let Err(e) = conn.send_message(&Message::OpenSession(request), &[]) {
            // An agent that refuses a connection (e.g. its uid) may answer
            // and close it before the request is even sent: prefer its words.
            let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
            if let Ok((Message::Error(reply), _)) = recv_reply(&conn) {
                return Err(refusal(reply));
            }
            return Err(Error::socket("sending the open-session request", &e));
        }
        conn.set_read_timeout(Some(options.open_timeout))
            .map_err(|e| Error::socket("setting the handshake timeout", &e))?;
        let (reply, fds) =
            recv_reply(&conn).map_err(|e| Error::recv("waiting for the agent's answer", &e))?;
        let reply = match reply {
            Message::SessionOpened(r) => r,
            Message::Error(e) => return Err(refusal(e)),
            other => {
                return Err(protocol(format!(
                    "expected a session-opened reply, the agent sent {other:?}"
                )))
            }
        };
        conn.set_read_timeout(None)
            .map_err(|e| Error::socket("clearing the handshake timeout", &e))?;
        if reply.fd_count != 2 || fds.len() != 2 {
            return Err(protocol(format!(
                "the session-opened reply must carry 2 fds (arena, segment); it announced {} and carried {}",
                reply.fd_count,
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        let (Some(arena_fd), Some(segment_fd)) = (fds.next(), fds.next()) else {
            return Err(protocol("missing fds in the session-opened reply"));
        };
        let arena = ArenaView::map(arena_fd, reply.arena_size)
            .map_err(|e| Error::from(e).context("mapping the arena"))?;
        let mut segment = LoaderSegment::attach_fd(segment_fd.as_fd(), Some(reply.instance_epoch))
            .map_err(|e| Error::from(e).context("attaching the ring segment"))?;
        drop(segment_fd);
        let hdr = *segment.info();
        if hdr.session_id != reply.session_id
            || hdr.arena_size != reply.arena_size
            || hdr.segment_size != reply.segment_size
        {
            return Err(protocol(format!(
                "the ring segment (session {}, arena {} bytes, {} bytes) does not match the reply (session {}, arena {} bytes, {} bytes)",
                hdr.session_id,
                hdr.arena_size,
                hdr.segment_size,
                reply.session_id,
                reply.arena_size,
                reply.segment_size
            )));
        }
        let (ready, release) = segment
            .take_endpoints()
            .ok_or_else(|| Error::new(ErrorCode::Internal, "ring endpoints already taken"))?;
        let segment = Arc::new(segment);
        segment.beat();
        crate::heartbeat::process()
            .register(&segment)
            .map_err(|e| {
                Error::new(
                    ErrorCode::Internal,
                    format!("starting the heartbeat thread: {e}"),
                )
            })?;
        let agent_beat = Seen {
            value: segment.heartbeat_ms(),
            at_ms: monotonic_ms(),
        };
        Ok(Session {
            conn,
            arena,
            segment,
            agent_beat,
            ready,
            release,
            info: SessionInfo::new(&reply, &hdr),
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            next_seq: 0,
            stream: Stream::Open,
            returns: Arc::default(),
            pending: Vec::new(),
            spare_tables: Vec::new(),
            closed: false,
            view,
            first_epoch: u64::from(options.first_epoch),
            last_epoch: u64::from(options.first_epoch)
                + u64::from(options.epoch_count.saturating_sub(1)),
            verify_crc: options.verify_crc,
            resume: None,
            origin: Box::new((options.clone(), reply.catalog.clone())),
            handed: 0,
            waits: crate::waits::WaitClock::new(options.report_waits),
        })
    }

    /// Lets the session reopen itself at `path` after its agent went away,
    /// as `options.resume_timeout` says ([`crate::resume`]).
    pub(crate) fn resume_from(&mut self, path: &std::path::Path, options: &SessionOptions) {
        self.resume = Resume::new(path, options).map(Box::new);
    }

    /// Carries the resume state over to a session that replaces another.
    pub(crate) fn set_resume(&mut self, resume: Resume) {
        self.resume = Some(Box::new(resume));
    }

    /// How many times the session reopened itself after its agent went
    /// away.
    pub fn resumes(&self) -> u32 {
        self.resume.as_ref().map_or(0, |r| r.count())
    }

    /// What became of the membership view handed in with
    /// [`SessionOptions::view`]: `None` when none was, `Some(Ok(_))` when the
    /// agent holds it (and ends this session if a newer view of the job
    /// replaces it), `Some(Err(_))` when it refused it (the session reads
    /// through whatever view the agent holds, or the store).
    pub fn view_status(&self) -> Option<&std::result::Result<ViewJoined, Error>> {
        self.view.as_ref()
    }

    /// The session's checkpointable state ([`crate::state`]): its plan's
    /// inputs, the committed position (the batches `next_batch` handed
    /// out) and the dataset's provenance. Save the bytes with the training
    /// checkpoint; [`SessionOptions::from_state`] opens the session again
    /// at the next batch, in any process, against this agent or a
    /// restarted one.
    pub fn state(&self) -> SessionState {
        let (opened, catalog) = &*self.origin;
        let mut options = SessionOptions::new(opened.dataset.clone());
        options.seed = opened.seed;
        options.first_epoch = opened.first_epoch;
        options.epoch_count = opened.epoch_count;
        options.batch_size = opened.batch_size;
        options.rank = opened.rank;
        options.world_size = opened.world_size;
        options.drop_last = opened.drop_last;
        options.worker = opened.worker;
        options.workers = opened.workers;
        options.locality = opened.locality;
        options.first_batch = opened.first_batch.saturating_add(self.handed);
        SessionState {
            options,
            catalog: catalog.clone(),
        }
    }

    /// What the agent said about the session.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// First byte and size of the read-only arena mapping: every sample's
    /// bytes lie in `[base, base + size)`.
    pub fn arena(&self) -> (*const u8, u64) {
        (self.arena.base(), self.arena.size())
    }

    /// Takes the next batch, waiting up to `timeout` (`None`: forever;
    /// zero: do not wait, [`ErrorCode::WouldBlock`] when none is ready).
    ///
    /// Errors: `Timeout`, `WouldBlock`, `EndOfStream` (every requested epoch
    /// was delivered), `Fenced`, `Disconnected` (the agent hung up or closed
    /// the session, reported once the ready ring is drained), `Corrupt` (a
    /// descriptor or sample table failed validation; the batch is handed back
    /// and the stream goes on). A batch whose [`Batch::status`] is negative is
    /// returned as `Ok`: check it, and release it like any other.
    ///
    /// When the agent goes away (`Disconnected`), the session waits up to
    /// [`SessionOptions::resume_timeout`] for it to come back and goes on
    /// with the next batch of its plan ([`crate::resume`]); `Disconnected`
    /// is returned only when it does not come back in time (or resuming is
    /// off).
    pub fn next_batch(&mut self, timeout: Option<Duration>) -> Result<Batch> {
        let started = self.waits.before(&self.segment);
        loop {
            match self.next_batch_here(timeout) {
                Ok(batch) => {
                    if let Some(r) = &mut self.resume {
                        r.handed_out();
                    }
                    self.handed += 1;
                    self.waits.after(&self.segment, started);
                    return Ok(batch);
                }
                Err(e) if Resume::applies_to(&e) && !self.closed => {
                    let Some(resume) = self.resume.take() else {
                        return Err(e);
                    };
                    self.let_go_of_the_arena();
                    match resume.reopen(&e, self.key) {
                        // The old session is dropped: it has nothing left
                        // to hand back to an agent that is gone.
                        Ok(new) => drop(std::mem::replace(self, new)),
                        Err(e) => return Err(self.fail(e)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Unmaps the lost agent's arena before waiting for the agent to come
    /// back: a restarted agent may need that memory again (with
    /// `arena.hugepages = "required"` and a pool that holds one arena, it
    /// cannot start while the old arena's pages are mapped here). Batches
    /// still on loan hold the mapping until they are released.
    fn let_go_of_the_arena(&mut self) {
        self.arena = ArenaView::from_region(Arc::new(Region::heap(0)));
    }

    /// [`next_batch`](Self::next_batch) from this session's agent only.
    fn next_batch_here(&mut self, timeout: Option<Duration>) -> Result<Batch> {
        self.segment.beat();
        self.usable()?;
        self.flush_releases(Duration::ZERO)?;
        let nonblocking = timeout == Some(Duration::ZERO);
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            // After a fence the agent takes back every lease: whatever is
            // still in the ring may point at memory it reuses.
            if self.segment.state() == state::FENCED {
                let e = match self.liveness() {
                    Err(e) => e,
                    Ok(()) => Error::from(ErrorCode::Fenced),
                };
                return Err(self.fail(e));
            }
            if let Some(d) = self.pop()? {
                return self.accept(d);
            }
            if let Err(e) = self.liveness() {
                // A batch published before the agent went away is complete
                // and still mapped: deliver it. A fenced session delivers
                // nothing more.
                if e.code() != ErrorCode::Fenced {
                    if let Some(d) = self.pop()? {
                        return self.accept(d);
                    }
                }
                return Err(self.fail(e));
            }
            self.agent_responsive()?;
            let slice = match deadline {
                None => WAIT_SLICE,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(if nonblocking {
                            Error::new(ErrorCode::WouldBlock, "no batch is ready")
                        } else {
                            Error::new(
                                ErrorCode::Timeout,
                                format!("no batch arrived within {timeout:?}"),
                            )
                        });
                    }
                    left.min(WAIT_SLICE)
                }
            };
            if let Err(v) = self.ready.wait_for_data(Some(slice)) {
                return Err(self.fail(Error::violation("ready ring", &v)));
            }
            self.segment.beat();
        }
    }

    /// Has the agent beaten recently enough? Its heartbeat counts as stale
    /// when it is older than the limit on the shared clock *and* this
    /// session has itself seen it unchanged for that long (so a clock that
    /// differs between the two processes cannot fail a healthy session).
    fn agent_responsive(&mut self) -> Result<()> {
        let interval = self.segment.heartbeat_interval_ms();
        let Some(limit) = agent_silence_limit(interval) else {
            return Ok(());
        };
        let now = monotonic_ms();
        let beat = self.segment.heartbeat_ms();
        if beat != self.agent_beat.value {
            self.agent_beat = Seen {
                value: beat,
                at_ms: now,
            };
            return Ok(());
        }
        let unchanged = now.saturating_sub(self.agent_beat.at_ms);
        let age = now.checked_sub(beat).unwrap_or(unchanged);
        if u128::from(age.min(unchanged)) <= limit.as_millis() {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::Disconnected,
            format!(
                "agent unresponsive: no heartbeat for {age} ms (session {}; the agent beats every {interval} ms, the limit is {} ms)",
                self.info.session_id,
                limit.as_millis()
            ),
        ))
    }

    /// Takes the next batch if one is ready ([`ErrorCode::WouldBlock`] otherwise).
    pub fn try_next_batch(&mut self) -> Result<Batch> {
        self.next_batch(Some(Duration::ZERO))
    }

    /// Hands a batch back to the agent.
    ///
    /// Fails with `InvalidArgument` for a batch of another session (which is
    /// then handed back to its own session). If the release ring stays full
    /// for [`RELEASE_WAIT`], the release is kept and pushed by a later call;
    /// the batch counts as released either way.
    pub fn release(&mut self, batch: Batch) -> Result<()> {
        self.segment.beat();
        if self
            .resume
            .as_ref()
            .is_some_and(|r| r.retired(batch.session_key()))
        {
            // A batch of the session this one replaced: its agent is gone,
            // and the new one never lent it.
            drop(batch.disarm());
            return Ok(());
        }
        if batch.session_key() != self.key {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                "the batch belongs to another session",
            ));
        }
        let (rel, table) = batch.disarm();
        if self.spare_tables.len() < 8 {
            self.spare_tables.push(table);
        }
        self.pending.push(rel);
        self.flush_releases(RELEASE_WAIT)
    }

    /// Hands back every outstanding release, tells the agent the session is
    /// over and waits (up to [`CLOSE_WAIT`]) for its confirmation. Batches
    /// still held stay readable but are no longer on loan.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.segment.beat();
        // A fenced session has nothing to hand back (and its reason was
        // read when the fence was seen).
        if self.segment.state() == state::FENCED || self.liveness().is_err() {
            return Ok(());
        }
        let flushed = self.flush_releases(CLOSE_WAIT);
        let bye = Message::CloseSession {
            session_id: self.info.session_id,
        };
        if self.conn.send_message(&bye, &[]).is_ok()
            && self.conn.set_read_timeout(Some(CLOSE_WAIT)).is_ok()
        {
            // Anything else the agent had queued is skipped; a bounded number
            // of messages, each under the read timeout.
            for _ in 0..16 {
                match self.conn.recv_message() {
                    Ok((Message::SessionClosed { .. }, _)) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        }
        flushed
    }

    /// Sticky outcomes first: end of stream, earlier fatal errors.
    fn usable(&mut self) -> Result<()> {
        match &self.stream {
            Stream::Open => Ok(()),
            Stream::LastDelivered => {
                self.stream = Stream::Ended;
                self.release_end_descriptor();
                Err(Error::new(
                    ErrorCode::EndOfStream,
                    "every batch was delivered",
                ))
            }
            Stream::Ended => Err(Error::new(
                ErrorCode::EndOfStream,
                "every batch was delivered",
            )),
            Stream::Failed(e) => Err(e.clone()),
        }
    }

    /// Takes the agent's empty end-of-stream descriptor, which follows the
    /// batch this library already flagged as the last, and releases it (if
    /// the agent has published it yet; closing the session returns it
    /// otherwise).
    fn release_end_descriptor(&mut self) {
        let mut next = self.ready.try_pop();
        if matches!(next, Ok(None)) && self.ready.wait_for_data(Some(END_DESCRIPTOR_WAIT)).is_ok() {
            next = self.ready.try_pop();
        }
        if let Ok(Some(d)) = next {
            self.next_seq = self.next_seq.wrapping_add(1);
            self.pending.push(ReleaseDescriptor {
                seq: d.seq,
                token: d.token,
            });
            let _ = self.flush_releases(Duration::ZERO);
        }
    }

    /// Records a fatal error and returns it.
    fn fail(&mut self, e: Error) -> Error {
        self.stream = Stream::Failed(e.clone());
        e
    }

    fn pop(&mut self) -> Result<Option<BatchDescriptor>> {
        self.ready
            .try_pop()
            .map_err(|v| self.fail(Error::violation("ready ring", &v)))
    }

    /// Is the agent still serving this session?
    fn liveness(&mut self) -> Result<()> {
        let id = self.info.session_id;
        match self.segment.state() {
            state::LIVE => {}
            state::FENCED => {
                let mut msg = format!(
                    "the agent fenced session {id} ({})",
                    violation_name(self.segment.violation())
                );
                if let Some(note) = self.agent_note() {
                    msg.push_str(": ");
                    msg.push_str(&note);
                }
                return Err(Error::new(ErrorCode::Fenced, msg));
            }
            state::CLOSED => {
                return Err(Error::new(
                    ErrorCode::Disconnected,
                    format!("the agent closed session {id}"),
                ))
            }
            other => {
                return Err(Error::new(
                    ErrorCode::Corrupt,
                    format!("session {id}: segment state word holds {other}"),
                ))
            }
        }
        match self.conn.peer_hung_up() {
            Ok(false) => Ok(()),
            Ok(true) => Err(Error::new(
                ErrorCode::Disconnected,
                format!("the agent hung up (session {id})"),
            )),
            Err(e) => {
                Err(Error::socket("checking the agent socket", &e).context(format!("session {id}")))
            }
        }
    }

    /// The error message an agent sends with a fence (its reason), if one
    /// arrives within [`FENCE_NOTE_WAIT`] (the agent may send it just after
    /// marking the segment fenced).
    fn agent_note(&self) -> Option<String> {
        self.conn.set_nonblocking(true).ok()?;
        let until = Instant::now() + FENCE_NOTE_WAIT;
        let note = loop {
            match self.conn.recv_message() {
                Ok((Message::Error(e), _)) => break Some(e.message),
                Err(SocketError::Io(e))
                    if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < until =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                _ => break None,
            }
        };
        let _ = self.conn.set_nonblocking(false);
        note
    }

    /// Validates a descriptor popped from the ready ring.
    fn accept(&mut self, d: BatchDescriptor) -> Result<Batch> {
        let seq = d.seq;
        let expected = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let mut table = self.spare_tables.pop().unwrap_or_default();
        let checked = if seq != expected {
            Err(format!("sequence number {seq}, expected {expected}"))
        } else {
            copy_sample_table(self.arena.region(), &d, &mut table)
                .map_err(|v| v.to_string())
                .and_then(|()| {
                    let sum: u64 = table.iter().map(|e| u64::from(e.length)).sum();
                    if sum == d.total_bytes {
                        Ok(())
                    } else {
                        Err(format!(
                            "total_bytes {} differs from the samples' sum {sum}",
                            d.total_bytes
                        ))
                    }
                })
                .and_then(|()| check_identity(&d, &table, self.first_epoch..=self.last_epoch))
        };
        if let Err(why) = checked {
            // Hand it back so the agent can take back what it pinned; the
            // agent decides whether the lease is real.
            self.pending.push(ReleaseDescriptor {
                seq,
                token: d.token,
            });
            self.flush_releases(Duration::ZERO)?;
            return Err(Error::new(
                ErrorCode::Corrupt,
                format!("batch seq {seq}: {why}"),
            ));
        }
        let mut d = d;
        if self.verify_crc {
            let corrupt = verify_samples(&self.arena, &mut table);
            if corrupt > 0 && d.status == 0 {
                d.status = ErrorCode::Corrupt.as_i32();
            }
        }
        if d.sample_count > 0
            && d.flags & BATCH_END_OF_EPOCH != 0
            && u64::from(d.epoch) == self.last_epoch
        {
            // The last batch of the last epoch: the agent's own
            // end-of-stream descriptor (empty) follows it, so the flag is
            // set here for the loader to see on the batch itself.
            d.flags |= BATCH_END_OF_STREAM;
        }
        if d.flags & BATCH_END_OF_STREAM != 0 {
            if d.sample_count == 0 {
                self.pending.push(ReleaseDescriptor {
                    seq,
                    token: d.token,
                });
                self.stream = Stream::Ended;
                self.flush_releases(Duration::ZERO)?;
                if d.status != 0 {
                    let code = ErrorCode::from_i32(d.status).unwrap_or(ErrorCode::Internal);
                    return Err(Error::new(
                        code,
                        format!("the agent ended the stream with status {code:?}"),
                    ));
                }
                return Err(Error::new(
                    ErrorCode::EndOfStream,
                    "every batch was delivered",
                ));
            }
            self.stream = Stream::LastDelivered;
        }
        Ok(Batch::new(
            self.key,
            d,
            table,
            self.arena.clone(),
            Arc::clone(&self.returns),
        ))
    }

    /// Pushes every outstanding release (explicit ones and those of dropped
    /// batches), waiting up to `wait` for room in a full ring. Whatever does
    /// not fit in time stays pending for the next call.
    fn flush_releases(&mut self, wait: Duration) -> Result<()> {
        let dropped = self.returns.take_all();
        self.pending.extend(dropped);
        if self.pending.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now().checked_add(wait);
        let mut done = 0;
        let result = loop {
            while done < self.pending.len() {
                match self.release.try_stage(self.pending[done]) {
                    Ok(true) => done += 1,
                    Ok(false) => break,
                    Err(v) => {
                        self.release.publish();
                        self.pending.drain(..done);
                        return Err(self.fail(Error::violation("release ring", &v)));
                    }
                }
            }
            self.release.publish();
            if done == self.pending.len() {
                break Ok(());
            }
            let left = deadline.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break Ok(());
            }
            if let Err(e) = self.liveness() {
                break Err(e);
            }
            if let Err(v) = self.release.wait_for_space(Some(left.min(WAIT_SLICE))) {
                self.pending.drain(..done);
                return Err(self.fail(Error::violation("release ring", &v)));
            }
            self.segment.beat();
        };
        self.pending.drain(..done);
        result
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("info", &self.info)
            .field("next_seq", &self.next_seq)
            .field("stream", &self.stream)
            .field("pending_releases", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::arena::Arena;

    fn entry(id: u64, offset: u64, bytes: &[u8], crc: u32) -> SampleEntry {
        SampleEntry {
            sample_id: id,
            offset,
            length: bytes.len() as u32,
            label: 1,
            crc32c: crc,
            status: 0,
        }
    }

    /// The identity checks read the table only: a batch of another epoch,
    /// and a sample overlapping the batch's own table, are refused; a
    /// sample just beside the table, a failed (empty) sample at the
    /// table's offset and an empty descriptor pass.
    #[test]
    fn identity_checks_refuse_another_epoch_and_a_sample_over_the_table() {
        let d = BatchDescriptor {
            table_offset: 4096,
            sample_count: 2,
            epoch: 3,
            ..Default::default()
        };
        let beside = entry(1, 4096 + 64, &[0; 100], 0);
        let before = entry(2, 0, &[0; 4096], 0);
        let mut failed = entry(3, 4096, b"", 0);
        failed.status = ErrorCode::Io.as_i32();
        assert_eq!(check_identity(&d, &[beside, before], 2..=3), Ok(()));
        assert_eq!(check_identity(&d, &[beside, failed], 3..=3), Ok(()));
        let err = check_identity(&d, &[beside, before], 0..=2).unwrap_err();
        assert!(
            err.contains("epoch 3") && err.contains("epochs 0 to 2"),
            "{err}"
        );
        let over = entry(4, 4096 + 63, &[0; 8], 0);
        let err = check_identity(&d, &[beside, over], 3..=3).unwrap_err();
        assert!(
            err.contains("sample 4") && err.contains("overlaps"),
            "{err}"
        );
        let tail = entry(5, 4000, &[0; 97], 0);
        assert!(check_identity(&d, &[tail, beside], 3..=3).is_err());
        let empty = BatchDescriptor {
            sample_count: 0,
            epoch: 99,
            ..d
        };
        assert_eq!(check_identity(&empty, &[], 0..=0), Ok(()));
    }

    /// A sample whose bytes no longer match the CRC the agent recorded is
    /// handed out as a `Corrupt` failure (empty), never as other bytes;
    /// intact samples and samples that had already failed are untouched.
    #[test]
    fn samples_failing_their_crc_become_corrupt_failures() {
        let arena = Arena::heap(4096).unwrap();
        arena.write_at(0, b"intact bytes").unwrap();
        arena.write_at(100, b"flipped bytes").unwrap();
        let view = ArenaView::from_region(Arc::clone(arena.region()));
        let good = crc32c::crc32c(b"intact bytes");
        let was = crc32c::crc32c(b"flipped byteS");
        let mut failed = entry(3, 0, b"", 0);
        failed.status = ErrorCode::Io.as_i32();
        let mut table = vec![
            entry(1, 0, b"intact bytes", good),
            entry(2, 100, b"flipped bytes", was),
            failed,
        ];
        assert_eq!(verify_samples(&view, &mut table), 1);
        assert_eq!(table[0].status, 0);
        assert_eq!(table[0].length, 12);
        assert_eq!(table[1].status, ErrorCode::Corrupt.as_i32());
        assert_eq!(table[1].length, 0);
        assert_eq!(table[2].status, ErrorCode::Io.as_i32());
    }
}
