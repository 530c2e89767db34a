//! The engine: one thread that owns the arena, the cache, the io_uring
//! reader, the sessions and the socket, and moves every session forward a
//! turn at a time:
//!
//! 1. accept loaders and handle their messages (open / close / hang-up);
//! 2. take back released batches (unpin their samples; a bad release fences
//!    the session);
//! 3. plan each session's window ahead (slow start) and request every missing
//!    sample from the source — one read per sample, however many sessions
//!    want it;
//! 4. collect read completions (any order), retrying transient failures;
//! 5. publish, in order, every batch whose samples are all present: a sample
//!    table goes into the arena, its samples are pinned, a descriptor goes
//!    into the ready ring;
//! 6. sleep on the io_uring completion queue until something can happen.

use crate::cache::{Cache, CacheConfig, Lookup, PolicyKind, SampleKey};
use crate::config::Config;
use crate::extent::ExtentAllocator;
use crate::metrics::Metrics;
use crate::planner::{PlanParams, SessionPlan};
use crate::server::{ConnEvent, ConnId, Server};
use crate::session::{Loan, Session};
use crate::source::fs::Catalog;
use crate::uring_reader::{Completion, ReadRequest, UringReader};
use granary_shm::arena::{Arena, ArenaOptions};
use granary_shm::handshake::{Message, OpenSession, SessionOpened};
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::segment::{AgentSegment, SegmentSpec};
use granary_shm::{BatchDescriptor, ErrorCode, SampleEntry, Violation};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A dataset the agent serves.
pub struct Dataset {
    /// Name loaders open it by.
    pub name: String,
    /// Its samples.
    pub catalog: Catalog,
}

fn key(dataset: usize, sample: u64) -> SampleKey {
    SampleKey {
        dataset: dataset as u32,
        index: sample,
    }
}

struct Inflight {
    key: SampleKey,
    dest: u64,
    started: Instant,
    attempt: u32,
    len: u32,
}

/// The engine state.
pub struct Engine {
    cfg: Config,
    metrics: Arc<Metrics>,
    arena: Arena,
    tables: ExtentAllocator,
    cache: Cache,
    reader: UringReader,
    server: Server,
    datasets: Vec<Dataset>,
    sessions: HashMap<u64, Session>,
    inflight: HashMap<u64, Inflight>,
    retry_queue: Vec<(Instant, Inflight)>,
    next_session: u64,
    next_tag: u64,
    instance_key: u64,
    events: Vec<ConnEvent>,
    completions: Vec<Completion>,
    last_turn: Instant,
    started: Instant,
}

/// Bytes of the arena set aside for sample tables.
fn table_area(arena_size: u64) -> u64 {
    (arena_size / 64).clamp(1 << 20, 64 << 20) & !4095
}

/// Bytes of the sample cache kept for reads the policy does not retain.
///
/// A session keeps up to `prefetch.window_batches` batches ahead of its
/// loader, their samples pinned (being read, or published and not yet
/// taken); the ones the policy does not keep are transient and hold their
/// extents until the batch comes back. When the transient area cannot hold
/// them, an evicting policy evicts retained samples that will be needed
/// again to make room, and MinIO refuses the reads (the window shrinks).
/// The reserve holds one such window of batches of the client's default
/// size of the largest mean sample among the datasets (each rounded up to
/// the cache's alignment): at least the default sixteenth of the cache, at
/// most half of it. More concurrent sessions share it.
fn transient_reserve(cfg: &Config, datasets: &[Dataset], cache: &CacheConfig) -> u64 {
    let align = cache.align.max(1);
    let mean = datasets
        .iter()
        .map(|d| d.catalog.total_bytes() / (d.catalog.len() as u64).max(1))
        .max()
        .unwrap_or(0)
        .next_multiple_of(align);
    let window = mean
        .saturating_mul(u64::from(granary::DEFAULT_BATCH_SIZE))
        .saturating_mul(u64::from(cfg.prefetch.window_batches));
    let half = cache.arena_size / 2 / align * align;
    window.clamp(cache.transient_reserve.min(half), half)
}

impl Engine {
    /// Creates the arena, binds the socket, opens every dataset's catalog.
    pub fn new(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Engine> {
        let mut datasets = Vec::new();
        for d in &cfg.datasets {
            let catalog = crate::source::open_catalog(d)
                .map_err(|e| io::Error::other(format!("dataset {:?}: {e}", d.name)))?;
            if catalog.is_empty() {
                return Err(io::Error::other(format!("dataset {:?} has no samples", d.name)));
            }
            datasets.push(Dataset {
                name: d.name.clone(),
                catalog,
            });
        }
        let opts = ArenaOptions {
            size: cfg.arena.size.bytes(),
            hugepages: match cfg.arena.hugepages {
                crate::config::HugePages::Off => granary_shm::arena::HugePages::Off,
                crate::config::HugePages::Try => granary_shm::arena::HugePages::Try,
                crate::config::HugePages::Required => granary_shm::arena::HugePages::Required,
            },
            populate: cfg.arena.populate,
            name: "granary-arena".to_string(),
        };
        let arena = Arena::create(&opts).map_err(|e| io::Error::other(format!("arena: {e}")))?;
        if let Some(reason) = arena.fallback_reason() {
            eprintln!("granaryd: WARNING: arena uses 4 KiB pages, not hugepages: {reason}");
        }
        let size = arena.size();
        let tables_len = table_area(size);
        let tables = ExtentAllocator::new(tables_len);
        let policy = match cfg.cache.policy {
            crate::config::CachePolicy::Clairvoyant => PolicyKind::Clairvoyant,
            crate::config::CachePolicy::Minio => PolicyKind::Minio,
            crate::config::CachePolicy::Lru => PolicyKind::Lru,
        };
        let mut cc = CacheConfig::new(size - tables_len, policy);
        cc.base = tables_len;
        cc.transient_reserve = transient_reserve(&cfg, &datasets, &cc);
        let cache = Cache::new(cc).map_err(|e| io::Error::other(format!("cache: {e}")))?;
        let reader = UringReader::new(cfg.prefetch.max_inflight_reads)?;
        let server = Server::bind(&cfg.socket)?;
        metrics.arena_size.store(size, Ordering::Relaxed);
        let now = Instant::now();
        Ok(Engine {
            cfg,
            metrics,
            arena,
            tables,
            cache,
            reader,
            server,
            datasets,
            sessions: HashMap::new(),
            inflight: HashMap::new(),
            retry_queue: Vec::new(),
            next_session: 1,
            next_tag: 1,
            instance_key: random_u64(),
            events: Vec::new(),
            completions: Vec::new(),
            last_turn: now,
            started: now,
        })
    }

    /// The socket path loaders connect to.
    pub fn socket_path(&self) -> &std::path::Path {
        self.server.path()
    }

    /// How the sample cache is set up (its range, alignment, transient
    /// reserve and policy).
    pub fn cache_config(&self) -> &CacheConfig {
        self.cache.config()
    }

    /// Whether the arena got hugepages.
    pub fn hugepages(&self) -> bool {
        self.arena.is_hugepage()
    }

    /// Runs turns until `stop` is set; `tick` is called about every 100 ms.
    pub fn run(&mut self, stop: &AtomicBool, mut tick: impl FnMut(&Engine)) -> io::Result<()> {
        let mut last_tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let progressed = self.turn()?;
            if last_tick.elapsed() >= Duration::from_millis(100) {
                last_tick = Instant::now();
                let ms = self.started.elapsed().as_millis() as u64;
                for s in self.sessions.values() {
                    s.segment.heartbeat(ms);
                }
                tick(self);
            }
            if !progressed {
                let wait = if self.sessions.is_empty() && self.inflight.is_empty() {
                    Duration::from_millis(20)
                } else {
                    Duration::from_millis(1)
                };
                if self.reader.in_flight() == 0 {
                    // Nothing can complete: io_uring would return at once,
                    // so sleep instead of spinning. New loaders and releases
                    // are seen within `wait` (1 ms while sessions are open).
                    std::thread::sleep(wait);
                } else {
                    self.completions.clear();
                    self.reader
                        .poll_completions(Some(wait), &mut self.completions)?;
                    self.handle_completions();
                }
            }
        }
        for s in self.sessions.values() {
            s.segment.close();
        }
        Ok(())
    }

    /// One turn; returns whether anything moved.
    pub fn turn(&mut self) -> io::Result<bool> {
        let mut progressed = false;
        let now = Instant::now();
        let dt = now.duration_since(self.last_turn);
        self.last_turn = now;

        self.events.clear();
        let mut events = std::mem::take(&mut self.events);
        self.server.poll(&self.metrics, &mut events);
        for ev in events.drain(..) {
            progressed = true;
            self.handle_event(ev);
        }
        self.events = events;

        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for id in &ids {
            progressed |= self.reclaim(*id);
        }
        self.retry_due(now);
        for id in &ids {
            progressed |= self.request(*id);
        }
        self.completions.clear();
        self.reader.poll_completions(None, &mut self.completions)?;
        progressed |= !self.completions.is_empty();
        self.handle_completions();
        for id in &ids {
            progressed |= self.publish(*id, dt);
        }
        self.update_gauges();
        Ok(progressed)
    }

    fn handle_event(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Connected(..) => {}
            ConnEvent::Open(conn, req) => self.open_session(conn, req),
            ConnEvent::Close(conn, sid) => {
                if self.sessions.get(&sid).is_some_and(|s| s.conn == conn) {
                    self.end_session(sid, false);
                    let _ = self
                        .server
                        .reply(conn, &Message::SessionClosed { session_id: sid }, &[]);
                } else {
                    self.server
                        .reply_error(conn, ErrorCode::NotFound, format!("no session {sid} on this connection"));
                }
            }
            ConnEvent::Gone(conn) => {
                let mine: Vec<u64> = self
                    .sessions
                    .values()
                    .filter(|s| s.conn == conn)
                    .map(|s| s.id)
                    .collect();
                for sid in mine {
                    if self.sessions.get(&sid).is_some_and(|s| !s.leases.is_empty()) {
                        self.metrics.loaders_lost.fetch_add(1, Ordering::Relaxed);
                    }
                    self.end_session(sid, false);
                }
            }
        }
    }

    fn open_session(&mut self, conn: ConnId, req: OpenSession) {
        let Some(ds) = self.datasets.iter().position(|d| d.name == req.dataset) else {
            self.server.reply_error(
                conn,
                ErrorCode::NotFound,
                format!("no dataset named {:?} on this agent", req.dataset),
            );
            return;
        };
        if self.sessions.len() >= self.cfg.sessions.max_sessions as usize {
            self.server.reply_error(
                conn,
                ErrorCode::Busy,
                format!("session limit reached ({})", self.cfg.sessions.max_sessions),
            );
            return;
        }
        let params = PlanParams {
            num_samples: self.datasets[ds].catalog.len() as u64,
            seed: req.seed,
            rank: req.rank,
            world_size: req.world_size,
            batch_size: req.batch_size,
            drop_last: req.drop_last,
        };
        let pick = |asked: u32, default: u32| if asked == 0 { default } else { asked };
        let id = self.next_session;
        self.next_session += 1;
        let spec = SegmentSpec {
            session_id: id,
            ready_capacity: pick(req.ready_capacity, self.cfg.sessions.ready_ring_capacity),
            release_capacity: pick(req.release_capacity, self.cfg.sessions.release_ring_capacity),
            arena_size: self.arena.size(),
            instance_epoch: random_u64(),
        };
        let segment = match AgentSegment::create_memfd(spec) {
            Ok(s) => s,
            Err(e) => {
                self.server
                    .reply_error(conn, ErrorCode::NoMemory, format!("cannot create ring segment: {e}"));
                return;
            }
        };
        let session = match Session::new(
            id,
            conn,
            ds,
            params,
            req.first_epoch,
            req.epoch_count,
            segment,
            self.instance_key ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            self.cfg.prefetch.initial_window,
        ) {
            Ok(s) => s,
            Err(e) => {
                self.server
                    .reply_error(conn, ErrorCode::InvalidArgument, format!("cannot plan: {e}"));
                return;
            }
        };
        let samples_per_epoch = crate::planner::samples_per_rank(&params).unwrap_or(0);
        let reply = Message::SessionOpened(SessionOpened {
            session_id: id,
            instance_epoch: spec.instance_epoch,
            arena_size: self.arena.size(),
            segment_size: session.segment.geometry().segment_size,
            samples_per_epoch,
            batches_per_epoch: session.batches_per_epoch,
            fd_count: 2,
        });
        let arena_fd = match self.arena.loader_fd() {
            Ok(fd) => fd,
            Err(e) => {
                self.server
                    .reply_error(conn, ErrorCode::Internal, format!("cannot share the arena: {e}"));
                return;
            }
        };
        let Some(seg_fd) = session.segment.fd() else {
            self.server
                .reply_error(conn, ErrorCode::Internal, "segment has no descriptor");
            return;
        };
        if self
            .server
            .reply(conn, &reply, &[arena_fd.as_fd(), seg_fd])
            .is_err()
        {
            return; // the loader is gone already
        }
        self.metrics.sessions_opened.fetch_add(1, Ordering::Relaxed);
        if let Ok(plan) = SessionPlan::new(params, req.first_epoch, req.epoch_count) {
            if let Err(e) = self.cache.add_session(id, ds as u32, plan) {
                eprintln!("granaryd: session {id}: cache cannot index its plan: {e}");
            }
        }
        self.sessions.insert(id, session);
    }

    /// Ends a session and takes back everything it held. A fenced session's
    /// segment keeps its FENCED state (and violation code) for the loader to
    /// read; any other ends CLOSED.
    fn end_session(&mut self, sid: u64, fenced: bool) {
        let Some(mut s) = self.sessions.remove(&sid) else {
            return;
        };
        if !fenced {
            s.segment.close();
        }
        let ds = s.dataset;
        let loans: Vec<Loan> = s.leases.drain().map(|(_, l)| l).collect();
        for loan in loans {
            self.return_loan(ds, loan);
        }
        // Pins held by batches still being prepared. In-flight reads stay
        // parked in the cache until they complete.
        for b in s.pending.drain(..) {
            for (i, &x) in b.samples[..b.requested].iter().enumerate() {
                if b.pinned[i] {
                    let _ = self.cache.unpin(key(ds, x));
                }
            }
        }
        let _ = self.cache.remove_session(sid);
    }

    fn return_loan(&mut self, dataset: usize, loan: Loan) {
        for sample in loan.pinned {
            let _ = self.cache.unpin(key(dataset, sample));
        }
        if let Some(t) = loan.table {
            let _ = self.tables.free(t);
        }
    }

    fn fence(&mut self, sid: u64, v: Violation) {
        self.metrics.violations.fetch_add(1, Ordering::Relaxed);
        self.metrics.sessions_fenced.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.sessions.get(&sid) {
            eprintln!("granaryd: session {sid} fenced: {v}");
            s.segment.fence(&v);
        }
        self.end_session(sid, true);
    }

    /// Takes back released batches. Returns whether any came back.
    fn reclaim(&mut self, sid: u64) -> bool {
        let mut buf = [granary_shm::ReleaseDescriptor::default(); 64];
        let mut any = false;
        loop {
            let Some(s) = self.sessions.get_mut(&sid) else {
                return any;
            };
            let n = match s.release.pop_into(&mut buf) {
                Ok(n) => n,
                Err(v) => {
                    self.fence(sid, v);
                    return true;
                }
            };
            if n == 0 {
                return any;
            }
            any = true;
            let dataset = s.dataset;
            let mut loans = Vec::with_capacity(n);
            let mut bad = None;
            for rel in &buf[..n] {
                match s.leases.reclaim(rel) {
                    Ok(l) => loans.push(l),
                    Err(v) => {
                        bad = Some(v);
                        break;
                    }
                }
            }
            for l in loans {
                self.return_loan(dataset, l);
            }
            if let Some(v) = bad {
                self.fence(sid, v);
                return true;
            }
        }
    }

    /// Plans ahead and requests (and pins) every sample of the window.
    /// Returns whether anything moved.
    fn request(&mut self, sid: u64) -> bool {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return false;
        };
        // Published batches not yet taken count towards the window. A bad
        // head reads as none here; publish() fences the session for it.
        let published = s.ready.unconsumed().unwrap_or(0);
        if let Err(e) = s.plan_ahead(published) {
            eprintln!("granaryd: session {sid}: planning failed: {e}");
            return false;
        }
        let ds = s.dataset;
        let mut moved = false;
        let mut reads = Vec::new();
        let mut budget = (self.reader.capacity() as usize)
            .saturating_sub(self.reader.in_flight() as usize + self.retry_queue.len());
        'batches: for b in s.pending.iter_mut() {
            while b.requested < b.samples.len() {
                let sample = b.samples[b.requested];
                let k = key(ds, sample);
                let pinned = match self.cache.access(k) {
                    Lookup::Ready(_) | Lookup::InFlight { .. } => {
                        self.metrics
                            .count_epoch(&self.datasets[ds].name, b.epoch, 1, 0);
                        self.cache.pin(k).is_ok()
                    }
                    Lookup::Failed { pins, .. } if pins > 0 => {
                        self.metrics
                            .count_epoch(&self.datasets[ds].name, b.epoch, 0, 1);
                        false
                    }
                    Lookup::Absent | Lookup::Failed { .. } => {
                        if budget == 0 {
                            break 'batches;
                        }
                        let len = self.datasets[ds].catalog.entries()[sample as usize].size;
                        match self.cache.reserve(k, len) {
                            Ok(r) => {
                                budget -= 1;
                                self.metrics
                                    .count_epoch(&self.datasets[ds].name, b.epoch, 0, 1);
                                reads.push((k, r.extent.offset, len));
                                true // reserve pins once for us
                            }
                            // No room now (everything pinned or in flight):
                            // look again next turn.
                            Err(_) => break 'batches,
                        }
                    }
                };
                b.pinned.push(pinned);
                b.requested += 1;
                moved = true;
            }
        }
        for (k, dest, len) in reads {
            self.start_read(k, dest, len, 0);
        }
        moved
    }

    fn start_read(&mut self, k: SampleKey, dest: u64, len: u64, attempt: u32) {
        let entry = &self.datasets[k.dataset as usize].catalog.entries()[k.index as usize];
        let (Ok(len32), Ok(path)) = (
            u32::try_from(len),
            CString::new(entry.path.as_os_str().as_bytes()),
        ) else {
            let _ = self.cache.fail(k, ErrorCode::Io.as_i32().unsigned_abs());
            return;
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let req = ReadRequest {
            tag,
            path,
            offset: 0,
            len: len32,
            dest: self.arena.region().as_ptr().wrapping_add(dest as usize),
        };
        // SAFETY: `dest..dest+len` is the extent the cache reserved for this
        // key inside the live arena mapping; it stays reserved (in flight,
        // pinned) until the completion for `tag` is handled.
        match unsafe { self.reader.submit(req) } {
            Ok(()) => {
                self.metrics.reads_submitted.fetch_add(1, Ordering::Relaxed);
                self.inflight.insert(
                    tag,
                    Inflight {
                        key: k,
                        dest,
                        started: Instant::now(),
                        attempt,
                        len: len32,
                    },
                );
            }
            Err(_) => {
                // Queue full: try again next turn, into the same extent.
                self.retry_queue.push((
                    Instant::now(),
                    Inflight {
                        key: k,
                        dest,
                        started: Instant::now(),
                        attempt,
                        len: len32,
                    },
                ));
            }
        }
    }

    fn retry_due(&mut self, now: Instant) {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.retry_queue.len() {
            if self.retry_queue[i].0 <= now {
                due.push(self.retry_queue.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        for r in due {
            self.start_read(r.key, r.dest, u64::from(r.len), r.attempt);
        }
    }

    fn handle_completions(&mut self) {
        let completions = std::mem::take(&mut self.completions);
        for c in &completions {
            let Some(inf) = self.inflight.remove(&c.tag) else {
                continue;
            };
            self.metrics.read_latency.observe(inf.started.elapsed());
            match &c.result {
                Ok(n) if *n == inf.len => {
                    self.metrics
                        .bytes_read
                        .fetch_add(u64::from(*n), Ordering::Relaxed);
                    let crc = self
                        .arena
                        .read_at(inf.dest, inf.len as usize)
                        .map(|b| crc32c::crc32c(&b))
                        .unwrap_or(0);
                    let _ = self.cache.complete(inf.key, crc);
                }
                Err(e)
                    if crate::uring_reader::is_retryable(e)
                        && inf.attempt < self.cfg.prefetch.read_retries =>
                {
                    self.metrics.read_retries.fetch_add(1, Ordering::Relaxed);
                    let backoff = Duration::from_millis(
                        self.cfg.prefetch.retry_backoff_ms << inf.attempt.min(10),
                    );
                    self.retry_queue.push((
                        Instant::now() + backoff,
                        Inflight {
                            attempt: inf.attempt + 1,
                            ..inf
                        },
                    ));
                }
                other => {
                    self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                    let path = &self.datasets[inf.key.dataset as usize].catalog.entries()
                        [inf.key.index as usize]
                        .path;
                    match other {
                        Err(e) => eprintln!("granaryd: read of {} failed: {e}", path.display()),
                        Ok(n) => eprintln!(
                            "granaryd: read of {} returned {n} of {} bytes (file changed?)",
                            path.display(),
                            inf.len
                        ),
                    }
                    let _ = self.cache.fail(inf.key, ErrorCode::Io.as_i32().unsigned_abs());
                }
            }
        }
        self.completions = completions;
        self.completions.clear();
    }

    /// Publishes every ready batch at the head of a session's window.
    fn publish(&mut self, sid: u64, dt: Duration) -> bool {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return false;
        };
        let ds = s.dataset;
        let mut published = false;
        let mut violation = None;
        loop {
            if s.ended {
                break;
            }
            match s.ready.free() {
                Ok(0) => break,
                Ok(_) => {}
                Err(v) => {
                    violation = Some(v);
                    break;
                }
            }
            let Some(front) = s.pending.front() else {
                if s.planned_all {
                    let seq = s.next_seq;
                    let token = s.leases.lend(
                        seq,
                        Loan {
                            pinned: Vec::new(),
                            table: None,
                        },
                    );
                    let d = BatchDescriptor {
                        seq,
                        token: token.unwrap_or(0),
                        flags: BATCH_END_OF_STREAM,
                        ..Default::default()
                    };
                    let _ = s.ready.try_stage(d);
                    s.next_seq += 1;
                    s.ended = true;
                    published = true;
                }
                break;
            };
            if front.requested < front.samples.len() {
                break;
            }
            let cache = &self.cache;
            let present = front.samples.iter().all(|&x| {
                matches!(
                    cache.lookup(key(ds, x)),
                    Lookup::Ready(_) | Lookup::Failed { .. }
                )
            });
            if !present {
                break;
            }
            let n = front.samples.len();
            let table_len = (n * std::mem::size_of::<SampleEntry>()) as u64;
            let Some(table) = self.tables.alloc(table_len.max(64), 64) else {
                break; // table space exhausted: wait for releases
            };
            let b = s.pending.pop_front().expect("front exists");
            let catalog = &self.datasets[ds].catalog;
            let mut entries = Vec::with_capacity(n * std::mem::size_of::<SampleEntry>());
            let mut pinned = Vec::with_capacity(n);
            let mut total = 0u64;
            let mut errors = 0u64;
            for (i, &x) in b.samples.iter().enumerate() {
                if b.pinned[i] {
                    pinned.push(x);
                }
                let e = &catalog.entries()[x as usize];
                let entry = match self.cache.lookup(key(ds, x)) {
                    Lookup::Ready(r) => {
                        total += r.len;
                        SampleEntry {
                            sample_id: e.sample_id,
                            offset: r.offset,
                            length: r.len as u32,
                            label: e.label,
                            crc32c: r.crc32c,
                            status: 0,
                        }
                    }
                    _ => {
                        errors += 1;
                        SampleEntry {
                            sample_id: e.sample_id,
                            offset: 0,
                            length: 0,
                            label: e.label,
                            crc32c: 0,
                            status: ErrorCode::Io.as_i32(),
                        }
                    }
                };
                entries.extend_from_slice(&entry_bytes(&entry));
            }
            let _ = self.arena.write_at(table.offset, &entries);
            let seq = s.next_seq;
            s.next_seq += 1;
            let token = s
                .leases
                .lend(
                    seq,
                    Loan {
                        pinned,
                        table: Some(table),
                    },
                )
                .unwrap_or(0);
            let d = BatchDescriptor {
                seq,
                token,
                table_offset: table.offset,
                batch_index: b.index,
                total_bytes: total,
                epoch: b.epoch,
                sample_count: n as u32,
                // A sample whose read failed for good makes the whole batch
                // an error batch (its samples say which).
                status: if errors > 0 { ErrorCode::Io.as_i32() } else { 0 },
                flags: if b.last_of_epoch { BATCH_END_OF_EPOCH } else { 0 },
                reserved: 0,
            };
            let _ = s.ready.try_stage(d);
            let _ = self.cache.advance_session_by(sid, n as u64);
            self.metrics
                .samples_served
                .fetch_add(n as u64, Ordering::Relaxed);
            self.metrics.bytes_served.fetch_add(total, Ordering::Relaxed);
            self.metrics.batches_served.fetch_add(1, Ordering::Relaxed);
            s.window = (s.window + 1).min(self.cfg.prefetch.window_batches);
            published = true;
        }
        s.ready.publish();
        if let Some(v) = violation {
            self.fence(sid, v);
            return true;
        }
        // Loader stall: its ring is empty and its next batch is not ready.
        // Reading the loader's head (also once the stream has ended) may
        // reveal that it moved the head past what was published: that
        // fences the session like any other violation.
        if !published {
            match s.ready.unconsumed() {
                Ok(0) if !s.ended => {
                    self.metrics
                        .loader_wait_ns
                        .fetch_add(dt.as_nanos() as u64, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(v) => {
                    self.fence(sid, v);
                    return true;
                }
            }
        }
        published
    }

    fn update_gauges(&self) {
        let a = self.cache.accounting();
        let m = &self.metrics;
        let tables_free = self.tables.free_bytes();
        let tables_used = self.tables.size() - tables_free;
        m.arena_free.store(a.free + tables_free, Ordering::Relaxed);
        m.arena_cached.store(a.cached, Ordering::Relaxed);
        m.arena_pinned.store(a.pinned + tables_used, Ordering::Relaxed);
        m.arena_in_flight.store(a.in_flight, Ordering::Relaxed);
        m.reads_in_flight
            .store(self.inflight.len() as u64, Ordering::Relaxed);
        m.sessions_open
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        m.cache_hits.store(self.cache.hits(), Ordering::Relaxed);
        m.cache_misses.store(self.cache.misses(), Ordering::Relaxed);
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ u64::from(std::process::id());
    }
    u64::from_le_bytes(b)
}

fn entry_bytes(e: &SampleEntry) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&e.sample_id.to_le_bytes());
    b[8..16].copy_from_slice(&e.offset.to_le_bytes());
    b[16..20].copy_from_slice(&e.length.to_le_bytes());
    b[20..24].copy_from_slice(&e.label.to_le_bytes());
    b[24..28].copy_from_slice(&e.crc32c.to_le_bytes());
    b[28..32].copy_from_slice(&e.status.to_le_bytes());
    b
}
