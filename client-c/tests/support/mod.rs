//! Test support: a fixture agent and a watchdog.
//!
//! The fixture is a real server on a `SOCK_SEQPACKET` listener in a temporary
//! directory, running in threads of the test process. For each connection it
//! checks the peer's uid (`SO_PEERCRED`) against its allowlist, answers an
//! open-session request by building a sealed memfd arena full of
//! deterministic samples and a ring segment, sends both fds, publishes the
//! session's batches through the ready ring, takes releases back through a
//! lease table, and ends the stream with an end-of-stream descriptor. Each
//! dataset can carry a misbehaviour (hang up, fence, corrupt descriptor, ...)
//! so the loader's error paths can be exercised.
//!
//! Sample content is a pure function of (dataset name, sample id): the first
//! 8 bytes are the id (little-endian), the rest a splitmix64 stream seeded
//! from FNV-1a(name) and the id. `examples/consume.c -f` recomputes it.
#![allow(dead_code)]

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use granary_shm::arena::{Arena, ArenaOptions, HugePages};
use granary_shm::error::ErrorCode;
use granary_shm::handshake::{ErrorReply, Message, OpenSession, SessionOpened};
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::lease::LeaseTable;
use granary_shm::ring::Consumer;
use granary_shm::segment::{AgentSegment, SegmentSpec};
use granary_shm::socket::{SeqPacket, SeqPacketListener, SocketError};
use granary_shm::{BatchDescriptor, ReleaseDescriptor, SampleEntry, Violation};

// ---------------------------------------------------------------------------
// Watchdog

#[allow(unused_imports)] // not every suite uses each
pub use granary_testkit::{watchdog, watchdog_fn};

/// The default watchdog limit.
pub const WATCHDOG: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// Deterministic content

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a (64-bit) of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// One step of splitmix64 (granary-base's generator) from `state`.
pub fn splitmix64(state: &mut u64) -> u64 {
    let mut g = granary_base::SplitMix64(*state);
    let v = g.next_u64();
    *state = g.0;
    v
}

/// Length of sample `id` of `dataset`: 1..=`max_len` bytes.
pub fn sample_len(dataset: &str, id: u64, max_len: u32) -> u32 {
    let mut st = fnv1a64(dataset.as_bytes()) ^ id.wrapping_mul(granary_base::GAMMA) ^ 0x5555;
    1 + (splitmix64(&mut st) % u64::from(max_len.max(1))) as u32
}

/// Bytes of sample `id` of `dataset`, `len` long.
pub fn sample_bytes(dataset: &str, id: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize + 8);
    out.extend_from_slice(&id.to_le_bytes());
    let mut st = fnv1a64(dataset.as_bytes()) ^ id.wrapping_mul(0xD1B5_4A32_D192_ED03);
    while out.len() < len as usize {
        out.extend_from_slice(&splitmix64(&mut st).to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

/// Label of sample `id`.
pub fn sample_label(id: u64) -> i32 {
    (id % 1000) as i32
}

/// The sample ids rank `rank` of `world` receives in `epoch`, batched.
pub fn plan_epoch(
    samples: u64,
    seed: u64,
    epoch: u32,
    batch_size: u32,
    rank: u32,
    world: u32,
    drop_last: bool,
) -> Vec<Vec<u64>> {
    let mut order: Vec<u64> = (0..samples).collect();
    let mut st = seed ^ u64::from(epoch).wrapping_mul(0xA076_1D64_78BD_642F);
    for i in (1..order.len()).rev() {
        let j = (splitmix64(&mut st) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mine: Vec<u64> = order
        .into_iter()
        .enumerate()
        .filter(|(p, _)| *p as u64 % u64::from(world) == u64::from(rank))
        .map(|(_, id)| id)
        .collect();
    mine.chunks(batch_size as usize)
        .filter(|c| !drop_last || c.len() == batch_size as usize)
        .map(<[u64]>::to_vec)
        .collect()
}

// ---------------------------------------------------------------------------
// Fixture configuration

/// What a dataset's sessions do besides serving normally.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Serve every batch, then end of stream.
    Normal,
    /// Publish nothing until the gate is opened ([`Fixture::open_gate`]).
    Gated,
    /// Publish nothing, ever; stay connected.
    Silent,
    /// Publish this many batches, then drop the connection and everything
    /// else, as a crashing agent would.
    HangUpAfter(u64),
    /// Publish this many batches, then fence the session (and send an
    /// error message saying so).
    FenceAfter(u64),
    /// Publish this many batches, then mark the session closed.
    CloseAfter(u64),
    /// Before batch `n`, publish an extra descriptor whose sample table lies
    /// outside the arena.
    CorruptAt(u64),
    /// Before batch `n`, publish an extra copy of its descriptor that names
    /// an epoch the session did not ask for.
    WrongEpochAt(u64),
    /// Before batch `n`, publish an extra descriptor whose one sample's
    /// bytes are the batch's own sample table.
    TableOverlapAt(u64),
    /// Batch `n` carries status `Io`, and so do its samples.
    IoErrorAt(u64),
    /// Sample `id` is stored with its last byte flipped, and a CRC-32C of
    /// the flipped bytes: only a content check can tell.
    Scribble(u64),
    /// Every sample's recorded CRC-32C is off by one bit.
    BadCrc,
    /// Serve normally, but take no release back until the gate is opened
    /// (the loader's release ring fills up).
    HoldReleases,
    /// Publish nothing; hang up when the gate is opened.
    HangUpOnGate,
    /// Publish nothing; fence the session when the gate is opened.
    FenceOnGate,
    /// Publish this many batches, then stop beating the heartbeat and
    /// publishing, and stay connected: a hung (or stopped) agent.
    HeartbeatStopsAfter(u64),
    /// In batch `n` (batch status 0), sample `i` fails with
    /// `ErrorCode::SAMPLE_FAILURES[i % 6]`.
    SampleFailuresAt(u64),
}

/// A dataset the fixture serves.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Name used in open requests.
    pub name: String,
    /// Number of samples (ids 0..samples).
    pub samples: u64,
    /// Longest sample; lengths are 1..=max_len.
    pub max_len: u32,
    /// Misbehaviour, if any.
    pub behaviour: Behaviour,
    /// Pause between two publications (a slow agent), if any.
    pub pace: Option<Duration>,
    /// The segment's `heartbeat_interval_ms` (the fixture beats every loop
    /// turn, about every millisecond, unless its behaviour says otherwise).
    pub heartbeat_ms: u64,
}

impl Dataset {
    /// A normal dataset of `samples` samples up to 64 KiB each.
    pub fn new(name: &str, samples: u64) -> Dataset {
        Dataset {
            name: name.to_owned(),
            samples,
            max_len: 64 * 1024,
            behaviour: Behaviour::Normal,
            pace: None,
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
        }
    }

    /// The same dataset with heartbeat interval `ms` (0: no liveness checks).
    pub fn heartbeat(mut self, ms: u64) -> Dataset {
        self.heartbeat_ms = ms;
        self
    }

    /// The same dataset with a misbehaviour.
    pub fn with(mut self, behaviour: Behaviour) -> Dataset {
        self.behaviour = behaviour;
        self
    }

    /// The same dataset with samples of at most `max_len` bytes.
    pub fn max_len(mut self, max_len: u32) -> Dataset {
        self.max_len = max_len;
        self
    }

    /// The same dataset published at most once per `pace`.
    pub fn paced(mut self, pace: Duration) -> Dataset {
        self.pace = Some(pace);
        self
    }

    /// Length of sample `id`.
    pub fn len_of(&self, id: u64) -> u32 {
        sample_len(&self.name, id, self.max_len)
    }

    /// Bytes of sample `id`.
    pub fn bytes_of(&self, id: u64) -> Vec<u8> {
        sample_bytes(&self.name, id, self.len_of(id))
    }

    /// Bytes the fixture stores for sample `id` (differs from
    /// [`Dataset::bytes_of`] only under [`Behaviour::Scribble`]).
    pub fn stored_bytes(&self, id: u64) -> Vec<u8> {
        let mut b = self.bytes_of(id);
        if matches!(self.behaviour, Behaviour::Scribble(s) if s == id) {
            if let Some(last) = b.last_mut() {
                *last ^= 0xff;
            }
        }
        b
    }
}

/// The fixture's heartbeat interval unless a dataset says otherwise.
pub const DEFAULT_HEARTBEAT_MS: u64 = 1000;

/// Counters the fixture keeps, for assertions.
#[derive(Debug, Default)]
pub struct Stats {
    /// Sessions opened (replies with fds sent).
    pub sessions: AtomicU64,
    /// Open requests refused with an error reply.
    pub refused: AtomicU64,
    /// Descriptors published (end of stream included).
    pub published: AtomicU64,
    /// Releases that resolved to a lease.
    pub releases: AtomicU64,
    /// Contract violations seen from loaders.
    pub violations: AtomicU64,
    /// Close-session requests answered.
    pub closes: AtomicU64,
    /// Session handlers that have finished.
    pub finished: AtomicU64,
    /// Leases still out when their session handler finished (summed).
    pub unreturned: AtomicU64,
}

impl Stats {
    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::SeqCst)
    }
}

struct Shared {
    datasets: Vec<Dataset>,
    allowed_uids: Vec<u32>,
    /// Refuse a disallowed peer as soon as it connects (as granaryd does)
    /// instead of in answer to its request.
    check_at_accept: bool,
    stop: AtomicBool,
    gate: AtomicBool,
    stats: Arc<Stats>,
    next_session: AtomicU64,
    handlers: Mutex<Vec<JoinHandle<()>>>,
    /// Every session's segment, in the order the sessions were served.
    segments: Mutex<Vec<Arc<AgentSegment>>>,
}

/// The fixture agent. Stops (and joins its threads) on drop.
pub struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// Options for `dataset` in batches of `batch_size`, a lost agent
/// reported at once (resuming has its own tests against a real agent).
pub fn options(dataset: &str, batch_size: u32) -> granary::SessionOptions {
    let mut o = granary::SessionOptions::new(dataset);
    o.batch_size = batch_size;
    o.resume_timeout = None;
    o
}

/// A session with options `o` on a new connection to `fx`.
pub fn open(fx: &Fixture, o: &granary::SessionOptions) -> granary::Session {
    granary::Client::connect(fx.socket_path())
        .expect("connect")
        .open_session(o)
        .expect("open session")
}

impl Fixture {
    /// Serves `datasets` to this process's own uid.
    pub fn start(datasets: Vec<Dataset>) -> Fixture {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        Fixture::start_with(datasets, vec![uid])
    }

    /// Serves `datasets` to the uids in `allowed_uids` only, refusing
    /// others in answer to their open request.
    pub fn start_with(datasets: Vec<Dataset>, allowed_uids: Vec<u32>) -> Fixture {
        Fixture::launch(datasets, allowed_uids, false)
    }

    /// Like [`Fixture::start_with`], but refuses a disallowed peer the
    /// moment it connects and closes the connection.
    pub fn start_checking_at_accept(datasets: Vec<Dataset>, allowed_uids: Vec<u32>) -> Fixture {
        Fixture::launch(datasets, allowed_uids, true)
    }

    fn launch(datasets: Vec<Dataset>, allowed_uids: Vec<u32>, check_at_accept: bool) -> Fixture {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("granaryd.sock");
        let listener = SeqPacketListener::bind(&path, 0o600).expect("bind the fixture socket");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let shared = Arc::new(Shared {
            datasets,
            allowed_uids,
            check_at_accept,
            stop: AtomicBool::new(false),
            gate: AtomicBool::new(false),
            stats: Arc::default(),
            next_session: AtomicU64::new(1),
            handlers: Mutex::new(Vec::new()),
            segments: Mutex::new(Vec::new()),
        });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("fixture-accept".into())
            .spawn(move || accept_loop(listener, s))
            .expect("spawn the fixture acceptor");
        Fixture {
            _dir: dir,
            path,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The socket to connect to.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Lets [`Behaviour::Gated`] sessions publish.
    pub fn open_gate(&self) {
        self.shared.gate.store(true, Ordering::SeqCst);
    }

    /// The loader heartbeat counter of the `i`-th session served (0-based),
    /// read as the agent reads it; `None` before that session exists.
    pub fn loader_heartbeat(&self, i: usize) -> Option<u64> {
        let segments = self.shared.segments.lock().unwrap();
        segments.get(i).map(|s| s.loader_heartbeat())
    }

    /// Waits until `n` session handlers have finished (or `limit` passes).
    pub fn wait_finished(&self, n: u64, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if Stats::get(&self.shared.stats.finished) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Asserts that `n` session handlers finish within 10 s and that every
    /// batch handed out came back.
    pub fn assert_all_returned(&self, n: u64) {
        assert!(self.wait_finished(n, Duration::from_secs(10)));
        assert_eq!(Stats::get(&self.stats().unreturned), 0);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let handlers = std::mem::take(&mut *self.shared.handlers.lock().unwrap());
        for h in handlers {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: SeqPacketListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok(conn) => {
                let s = Arc::clone(&shared);
                let h = std::thread::Builder::new()
                    .name("fixture-session".into())
                    .spawn(move || serve(conn, s))
                    .expect("spawn a fixture session");
                shared.handlers.lock().unwrap().push(h);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("fixture accept failed: {e}"),
        }
    }
}

fn refuse(conn: &SeqPacket, shared: &Shared, code: ErrorCode, message: String) {
    shared.stats.refused.fetch_add(1, Ordering::SeqCst);
    let _ = conn.send_message(&Message::Error(ErrorReply { code, message }), &[]);
}

/// One connection: the handshake, then the session.
fn serve(conn: SeqPacket, shared: Arc<Shared>) {
    if shared.check_at_accept {
        let uid = conn.peer_credentials().map(|c| c.uid).unwrap_or(u32::MAX);
        if !shared.allowed_uids.contains(&uid) {
            let msg = format!("uid {uid} is not on the agent's allowlist");
            refuse(&conn, &shared, ErrorCode::Permission, msg);
            return;
        }
    }
    conn.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let request = loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match conn.recv_message() {
            Ok((Message::OpenSession(r), _)) => break r,
            Ok((other, _)) => {
                let msg = format!("expected an open-session request, got {other:?}");
                refuse(&conn, &shared, ErrorCode::Protocol, msg);
                return;
            }
            Err(SocketError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
    };
    let allowed = conn
        .peer_credentials()
        .map(|c| (c.uid, shared.allowed_uids.contains(&c.uid)));
    match allowed {
        Ok((_, true)) => {}
        Ok((uid, false)) => {
            let msg = format!("uid {uid} is not on the agent's allowlist");
            refuse(&conn, &shared, ErrorCode::Permission, msg);
            return;
        }
        Err(e) => {
            refuse(
                &conn,
                &shared,
                ErrorCode::Permission,
                format!("SO_PEERCRED: {e}"),
            );
            return;
        }
    }
    if let Err(e) = request.validate() {
        refuse(&conn, &shared, e.code, e.message);
        return;
    }
    let Some(ds) = shared.datasets.iter().find(|d| d.name == request.dataset) else {
        let msg = format!("dataset {:?} is not served by this agent", request.dataset);
        refuse(&conn, &shared, ErrorCode::NotFound, msg);
        return;
    };
    let ds = ds.clone();
    let served = match Served::build(&ds, &request, &shared) {
        Ok(s) => s,
        Err(msg) => {
            refuse(&conn, &shared, ErrorCode::Internal, msg);
            return;
        }
    };
    let unreturned = served.run(conn, &ds, &shared);
    shared
        .stats
        .unreturned
        .fetch_add(unreturned, Ordering::SeqCst);
    shared.stats.finished.fetch_add(1, Ordering::SeqCst);
}

/// Serializes sample entries as they lie in the arena (layout version 1).
fn table_bytes(entries: &[SampleEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 32);
    for e in entries {
        out.extend_from_slice(&e.sample_id.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.length.to_le_bytes());
        out.extend_from_slice(&e.label.to_le_bytes());
        out.extend_from_slice(&e.crc32c.to_le_bytes());
        out.extend_from_slice(&e.status.to_le_bytes());
    }
    out
}

fn align8(v: u64) -> u64 {
    v.div_ceil(8) * 8
}

/// How sample `i` of a [`Behaviour::SampleFailuresAt`] batch fails.
pub fn sample_failure(i: usize) -> ErrorCode {
    ErrorCode::SAMPLE_FAILURES[i % ErrorCode::SAMPLE_FAILURES.len()]
}

/// A session's memory and the descriptors it will publish, in order.
struct Served {
    arena: Arena,
    segment: Arc<AgentSegment>,
    plan: Vec<BatchDescriptor>,
    session_id: u64,
    samples_per_epoch: u64,
    batches_per_epoch: u64,
}

impl Served {
    fn build(ds: &Dataset, req: &OpenSession, shared: &Shared) -> Result<Served, String> {
        let epochs: Vec<(u32, Vec<Vec<u64>>)> = (req.first_epoch
            ..req.first_epoch + req.epoch_count)
            .map(|e| {
                let b = plan_epoch(
                    ds.samples,
                    req.seed,
                    e,
                    req.batch_size,
                    req.rank,
                    req.world_size,
                    req.drop_last,
                );
                (e, b)
            })
            .collect();
        // Data region: every sample once.
        let mut offsets = Vec::with_capacity(ds.samples as usize);
        let mut end = 0u64;
        for id in 0..ds.samples {
            offsets.push(end);
            end = align8(end + u64::from(ds.len_of(id)));
        }
        let total_samples: u64 = epochs
            .iter()
            .flat_map(|(_, b)| b.iter().map(|x| x.len() as u64))
            .sum();
        let tables_at = end;
        let size = tables_at + total_samples * 32 + 4096;
        let mut opts = ArenaOptions::new(size);
        opts.hugepages = HugePages::Off;
        opts.populate = false;
        opts.name = format!("granary-fixture-{}", ds.name);
        let arena = Arena::create(&opts).map_err(|e| e.to_string())?;
        for id in 0..ds.samples {
            arena
                .write_at(offsets[id as usize], &ds.stored_bytes(id))
                .map_err(|e| e.to_string())?;
        }

        let mut plan = Vec::new();
        let mut table_at = tables_at;
        let mut real = 0u64;
        for (epoch, batches) in &epochs {
            let last = batches.len().saturating_sub(1);
            for (index, ids) in batches.iter().enumerate() {
                if matches!(ds.behaviour, Behaviour::CorruptAt(n) if n == real) {
                    plan.push(BatchDescriptor {
                        table_offset: arena.size(),
                        sample_count: 1,
                        epoch: *epoch,
                        batch_index: index as u64,
                        ..Default::default()
                    });
                }
                if matches!(ds.behaviour, Behaviour::TableOverlapAt(n) if n == real) {
                    // In the arena's slack after every batch's table.
                    let own = tables_at + total_samples * 32;
                    let entry = SampleEntry {
                        sample_id: ids[0],
                        offset: own,
                        length: 32,
                        label: sample_label(ids[0]),
                        crc32c: 0,
                        status: 0,
                    };
                    arena
                        .write_at(own, &table_bytes(&[entry]))
                        .map_err(|e| e.to_string())?;
                    plan.push(BatchDescriptor {
                        table_offset: own,
                        sample_count: 1,
                        total_bytes: 32,
                        epoch: *epoch,
                        batch_index: index as u64,
                        ..Default::default()
                    });
                }
                let io_error = matches!(ds.behaviour, Behaviour::IoErrorAt(n) if n == real);
                let sample_failures =
                    matches!(ds.behaviour, Behaviour::SampleFailuresAt(n) if n == real);
                let entries: Vec<SampleEntry> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, &id)| {
                        let failure = if io_error {
                            Some(ErrorCode::Io)
                        } else if sample_failures {
                            Some(sample_failure(i))
                        } else {
                            None
                        };
                        if let Some(code) = failure {
                            SampleEntry {
                                sample_id: id,
                                label: sample_label(id),
                                status: code.as_i32(),
                                ..Default::default()
                            }
                        } else {
                            let bytes = ds.stored_bytes(id);
                            let bad_crc = matches!(ds.behaviour, Behaviour::BadCrc);
                            SampleEntry {
                                sample_id: id,
                                offset: offsets[id as usize],
                                length: bytes.len() as u32,
                                label: sample_label(id),
                                crc32c: crc32c::crc32c(&bytes) ^ u32::from(bad_crc),
                                status: 0,
                            }
                        }
                    })
                    .collect();
                arena
                    .write_at(table_at, &table_bytes(&entries))
                    .map_err(|e| e.to_string())?;
                plan.push(BatchDescriptor {
                    table_offset: table_at,
                    batch_index: index as u64,
                    total_bytes: entries.iter().map(|e| u64::from(e.length)).sum(),
                    epoch: *epoch,
                    sample_count: entries.len() as u32,
                    status: if io_error { ErrorCode::Io.as_i32() } else { 0 },
                    flags: if index == last { BATCH_END_OF_EPOCH } else { 0 },
                    ..Default::default()
                });
                if matches!(ds.behaviour, Behaviour::WrongEpochAt(n) if n == real) {
                    let good = plan.pop().expect("just pushed");
                    plan.push(BatchDescriptor {
                        epoch: req.first_epoch + req.epoch_count,
                        flags: 0,
                        ..good
                    });
                    plan.push(good);
                }
                table_at = align8(table_at + entries.len() as u64 * 32);
                real += 1;
            }
        }
        plan.push(BatchDescriptor {
            epoch: req.first_epoch + req.epoch_count - 1,
            flags: BATCH_END_OF_STREAM,
            ..Default::default()
        });

        // A session opened past its first batches (a resume) starts there.
        let skip = usize::try_from(req.first_batch)
            .unwrap_or(usize::MAX)
            .min(plan.len());
        plan.drain(..skip);
        let session_id = shared.next_session.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let pick = |asked: u32, default: u32| if asked == 0 { default } else { asked };
        let segment = AgentSegment::create_memfd(SegmentSpec {
            session_id,
            ready_capacity: pick(req.ready_capacity, 8),
            release_capacity: pick(req.release_capacity, 16),
            arena_size: arena.size(),
            instance_epoch: splitmix64(&mut (nanos ^ session_id)),
            heartbeat_interval_ms: ds.heartbeat_ms,
        })
        .map_err(|e| e.to_string())?;
        let first = epochs
            .first()
            .map(|(_, b)| b.as_slice())
            .unwrap_or_default();
        Ok(Served {
            arena,
            segment: Arc::new(segment),
            plan,
            session_id,
            samples_per_epoch: first.iter().map(|b| b.len() as u64).sum(),
            batches_per_epoch: first.len() as u64,
        })
    }

    /// Sends the reply with the fds, then serves until the loader closes or
    /// hangs up, the fixture stops, or the behaviour says otherwise.
    /// Returns the number of leases still out at the end.
    fn run(mut self, conn: SeqPacket, ds: &Dataset, shared: &Shared) -> u64 {
        let stats = &shared.stats;
        let reply = SessionOpened {
            session_id: self.session_id,
            instance_epoch: self.segment.spec().instance_epoch,
            arena_size: self.arena.size(),
            segment_size: self.segment.geometry().segment_size,
            samples_per_epoch: self.samples_per_epoch,
            batches_per_epoch: self.batches_per_epoch,
            fd_count: 2,
            catalog: None,
            rank_batches_per_epoch: 0,
            prepared: None,
        };
        let loader_fd = match self.arena.loader_fd() {
            Ok(fd) => fd,
            Err(e) => {
                refuse(&conn, shared, ErrorCode::Internal, e.to_string());
                return 0;
            }
        };
        let Some(segment_fd) = self.segment.fd() else {
            refuse(&conn, shared, ErrorCode::Internal, "heap segment".into());
            return 0;
        };
        if conn
            .send_message(
                &Message::SessionOpened(reply.clone()),
                &[loader_fd.as_fd(), segment_fd],
            )
            .is_err()
        {
            return 0;
        }
        drop(loader_fd);
        stats.sessions.fetch_add(1, Ordering::SeqCst);

        let (mut ready, mut release) = Arc::get_mut(&mut self.segment)
            .and_then(AgentSegment::take_endpoints)
            .expect("fresh segment");
        shared
            .segments
            .lock()
            .unwrap()
            .push(Arc::clone(&self.segment));
        release.set_spin(Duration::ZERO);
        let mut leases: LeaseTable<()> = LeaseTable::new(reply.instance_epoch ^ 0x5eed);
        let _ = conn.set_nonblocking(true);
        let mut next = 0usize;
        let mut stopped_publishing = false;
        let mut last_publish: Option<Instant> = None;
        let reclaim = |release: &mut Consumer<ReleaseDescriptor>,
                       leases: &mut LeaseTable<()>,
                       segment: &AgentSegment|
         -> bool {
            loop {
                let violation = match release.try_pop() {
                    Ok(Some(r)) => match leases.reclaim(&r) {
                        Ok(()) => {
                            stats.releases.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Err(v) => v,
                    },
                    Ok(None) => return true,
                    Err(v) => v,
                };
                stats.violations.fetch_add(1, Ordering::SeqCst);
                segment.fence(&violation);
                return false;
            }
        };

        loop {
            if shared.stop.load(Ordering::SeqCst) {
                break;
            }
            let mut busy = false;
            let hung =
                matches!(ds.behaviour, Behaviour::HeartbeatStopsAfter(n) if next as u64 >= n);
            if !hung {
                self.segment.heartbeat(granary_shm::monotonic_ms());
            }
            let holding = matches!(ds.behaviour, Behaviour::HoldReleases)
                && !shared.gate.load(Ordering::SeqCst);
            if !holding && !reclaim(&mut release, &mut leases, &self.segment) {
                stopped_publishing = true;
            }
            match conn.recv_message() {
                Ok((Message::CloseSession { session_id }, _)) => {
                    reclaim(&mut release, &mut leases, &self.segment);
                    stats.closes.fetch_add(1, Ordering::SeqCst);
                    let _ = conn.send_message(&Message::SessionClosed { session_id }, &[]);
                    break;
                }
                Ok(_) => {}
                Err(SocketError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            let published = next as u64;
            let gate = shared.gate.load(Ordering::SeqCst);
            match ds.behaviour {
                Behaviour::HangUpOnGate if gate => return leases.len() as u64,
                Behaviour::FenceOnGate if gate && !stopped_publishing => {
                    stopped_publishing = true;
                    self.segment
                        .fence(&Violation::UnknownLease { seq: 0, token: 0 });
                }
                Behaviour::HangUpAfter(n) if published >= n => return leases.len() as u64,
                Behaviour::FenceAfter(n) if published >= n && !stopped_publishing => {
                    stopped_publishing = true;
                    self.segment.fence(&Violation::BadField {
                        field: "fixture",
                        value: n,
                    });
                    let _ = conn.send_message(
                        &Message::Error(ErrorReply {
                            code: ErrorCode::Fenced,
                            message: format!("fixture fenced the session after {n} batches"),
                        }),
                        &[],
                    );
                }
                Behaviour::CloseAfter(n) if published >= n && !stopped_publishing => {
                    stopped_publishing = true;
                    self.segment.close();
                }
                _ => {}
            }
            let held = match ds.behaviour {
                Behaviour::Silent | Behaviour::HangUpOnGate | Behaviour::FenceOnGate => true,
                Behaviour::HeartbeatStopsAfter(_) => hung,
                Behaviour::Gated => !gate,
                _ => false,
            };
            let paced = ds
                .pace
                .zip(last_publish)
                .is_some_and(|(p, t)| t.elapsed() < p);
            if !stopped_publishing && !held && !paced && next < self.plan.len() {
                match ready.free() {
                    Ok(free) if free > 0 => {
                        let mut d = self.plan[next];
                        d.seq = next as u64;
                        d.token = leases.lend(d.seq, ()).expect("fresh sequence number");
                        if ready.try_push(d).unwrap_or(false) {
                            next += 1;
                            busy = true;
                            last_publish = Some(Instant::now());
                            stats.published.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Ok(_) => {}
                    Err(v) => {
                        stats.violations.fetch_add(1, Ordering::SeqCst);
                        self.segment.fence(&v);
                        stopped_publishing = true;
                    }
                }
            }
            if !busy && holding {
                std::thread::sleep(Duration::from_millis(1));
            } else if !busy {
                let _ = release.wait_for_data(Some(Duration::from_millis(1)));
            }
        }
        leases.len() as u64
    }
}
