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
use crate::dataset::{Dataset, LoadEvent};
use crate::extent::ExtentAllocator;
use crate::metrics::Metrics;
use crate::planner::{PlanParams, SessionPlan};
use crate::server::{ConnEvent, ConnId, Server};
use crate::session::{Loan, PendingBatch, Session};
use crate::uring_reader::Completion;
use granary_shm::arena::{Arena, ArenaOptions};
use granary_shm::handshake::{Message, OpenSession, SessionOpened};
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::segment::{AgentSegment, SegmentSpec};
use granary_shm::{BatchDescriptor, ErrorCode, SampleEntry, Violation};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long start-up waits for remote datasets' first catalog load.
pub const STARTUP_LOAD_WAIT: Duration = Duration::from_secs(15);

fn log_load_event(d: &Dataset, event: Option<LoadEvent>) {
    match event {
        Some(LoadEvent::Ready) => {
            if let Some(src) = d.source() {
                eprintln!(
                    "granaryd: dataset {:?} ({}) ready: {} samples, {} bytes",
                    d.name,
                    src.kind(),
                    src.len(),
                    src.total_bytes()
                );
            }
        }
        Some(LoadEvent::Failed(e)) => {
            eprintln!("granaryd: dataset {:?}: loading failed: {e}", d.name);
        }
        None => {}
    }
}

fn report_health(metrics: &Metrics, d: &Dataset) {
    metrics.dataset_health(&d.name, |h| {
        h.kind = d.kind();
        h.ready = d.is_ready();
        h.load_attempts = u64::from(d.attempts());
    });
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
    // Dropped first: a source waits, when dropped, until none of its reads
    // can write into the arena any more.
    datasets: Vec<Dataset>,
    cfg: Config,
    metrics: Arc<Metrics>,
    arena: Arena,
    tables: ExtentAllocator,
    cache: Cache,
    server: Server,
    sessions: HashMap<u64, Session>,
    inflight: HashMap<u64, Inflight>,
    retry_queue: Vec<(Instant, Inflight)>,
    next_session: u64,
    next_tag: u64,
    instance_key: u64,
    events: Vec<ConnEvent>,
    /// Opens of datasets whose first load attempt is still running.
    waiting_opens: Vec<(usize, ConnId, OpenSession)>,
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
/// most half of it. More concurrent sessions share it. Remote datasets
/// still loading when the engine starts do not count.
fn transient_reserve(cfg: &Config, datasets: &[Dataset], cache: &CacheConfig) -> u64 {
    let align = cache.align.max(1);
    let mean = datasets
        .iter()
        .filter_map(|d| d.source())
        .map(|src| src.total_bytes() / src.len().max(1))
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
    /// Creates the arena, binds the socket, opens every dataset: the
    /// filesystem ones here (a failure stops the agent), the remote ones on
    /// threads of their own, waiting up to [`STARTUP_LOAD_WAIT`] for them
    /// (a store that cannot be reached by then is tried again in the
    /// background while the others serve).
    pub fn new(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Engine> {
        Engine::with_datasets(cfg, metrics, Vec::new())
    }

    /// Like [`new`](Self::new), serving `extra` datasets (opened by the
    /// caller: a wrapped or fault-injecting client) after the configured
    /// ones.
    pub fn with_datasets(
        cfg: Config,
        metrics: Arc<Metrics>,
        extra: Vec<Dataset>,
    ) -> io::Result<Engine> {
        let mut datasets = Vec::new();
        for d in &cfg.datasets {
            if Dataset::is_remote(d) {
                datasets.push(Dataset::open_in_background(d, &cfg));
                continue;
            }
            let ds = Dataset::open_now(d, &cfg)
                .map_err(|e| io::Error::other(format!("dataset {:?}: {e}", d.name)))?;
            if ds.source().is_some_and(|s| s.is_empty()) {
                return Err(io::Error::other(format!(
                    "dataset {:?} has no samples",
                    d.name
                )));
            }
            datasets.push(ds);
        }
        datasets.extend(extra);
        metrics.register_datasets(datasets.iter().map(|d| (d.name.as_str(), d.kind())));
        let deadline = Instant::now() + STARTUP_LOAD_WAIT;
        for d in &mut datasets {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = d.wait(left);
            log_load_event(d, event);
            if let Some(why) = d.unavailable() {
                eprintln!("granaryd: {why}; serving the other datasets meanwhile");
            }
            report_health(&metrics, d);
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
        let server = Server::bind(&cfg.socket)?;
        metrics.arena_size.set(size);
        let now = Instant::now();
        Ok(Engine {
            cfg,
            metrics,
            arena,
            tables,
            cache,
            server,
            datasets,
            sessions: HashMap::new(),
            inflight: HashMap::new(),
            retry_queue: Vec::new(),
            next_session: 1,
            next_tag: 1,
            instance_key: random_u64(),
            events: Vec::new(),
            waiting_opens: Vec::new(),
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
                // Sleep until a read completes or `wait` has passed: new
                // loaders and releases are seen within `wait` (1 ms while
                // sessions are open). With nothing in flight this is a
                // plain sleep, not a spin.
                self.wait_for_completions(wait)?;
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

        progressed |= self.poll_datasets(now);
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for id in &ids {
            progressed |= self.reclaim(*id);
        }
        self.retry_due(now);
        for id in &ids {
            progressed |= self.request(*id);
        }
        progressed |= self.collect_completions()?;
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
                    let _ =
                        self.server
                            .reply(conn, &Message::SessionClosed { session_id: sid }, &[]);
                } else {
                    self.server.reply_error(
                        conn,
                        ErrorCode::NotFound,
                        format!("no session {sid} on this connection"),
                    );
                }
            }
            ConnEvent::Gone(conn) => {
                self.waiting_opens.retain(|(_, c, _)| *c != conn);
                let mine: Vec<u64> = self
                    .sessions
                    .values()
                    .filter(|s| s.conn == conn)
                    .map(|s| s.id)
                    .collect();
                for sid in mine {
                    if self
                        .sessions
                        .get(&sid)
                        .is_some_and(|s| !s.leases.is_empty())
                    {
                        self.metrics.loaders_lost.inc_by(1);
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
        let Some(num_samples) = self.datasets[ds].source().map(|s| s.len()) else {
            if self.datasets[ds].first_load_running() {
                // Answered when the first attempt ends (poll_datasets).
                self.waiting_opens.push((ds, conn, req));
            } else {
                let why = self.datasets[ds].unavailable().unwrap_or_default();
                self.server.reply_error(conn, ErrorCode::Io, why);
            }
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
            num_samples,
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
            release_capacity: pick(
                req.release_capacity,
                self.cfg.sessions.release_ring_capacity,
            ),
            arena_size: self.arena.size(),
            instance_epoch: random_u64(),
        };
        let segment = match AgentSegment::create_memfd(spec) {
            Ok(s) => s,
            Err(e) => {
                self.server.reply_error(
                    conn,
                    ErrorCode::NoMemory,
                    format!("cannot create ring segment: {e}"),
                );
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
                self.server.reply_error(
                    conn,
                    ErrorCode::InvalidArgument,
                    format!("cannot plan: {e}"),
                );
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
                self.server.reply_error(
                    conn,
                    ErrorCode::Internal,
                    format!("cannot share the arena: {e}"),
                );
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
        self.metrics.sessions_opened.inc_by(1);
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
        self.metrics.violations.inc_by(1);
        self.metrics.sessions_fenced.inc_by(1);
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
        let Some(src) = self.datasets[ds].source() else {
            return false;
        };
        let retrying = self
            .retry_queue
            .iter()
            .filter(|(_, r)| r.key.dataset as usize == ds)
            .count();
        let mut budget = (src.capacity() as usize).saturating_sub(src.in_flight() + retrying);
        'batches: for b in s.pending.iter_mut() {
            while b.requested < b.samples.len() {
                let sample = b.samples[b.requested];
                let k = key(ds, sample);
                let pinned = match self.cache.access(k) {
                    Lookup::Ready(_) | Lookup::InFlight { .. } => {
                        self.metrics.count_epoch(ds, b.epoch, 1, 0);
                        self.cache.pin(k).is_ok()
                    }
                    Lookup::Failed { pins, .. } if pins > 0 => {
                        self.metrics.count_epoch(ds, b.epoch, 0, 1);
                        false
                    }
                    Lookup::Absent | Lookup::Failed { .. } => {
                        if budget == 0 {
                            break 'batches;
                        }
                        let len = src.meta(sample).size;
                        match self.cache.reserve(k, len) {
                            Ok(r) => {
                                budget -= 1;
                                self.metrics.count_epoch(ds, b.epoch, 0, 1);
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
        let ds = k.dataset as usize;
        let Some(src) = self.datasets[ds].source_mut() else {
            let _ = self.cache.fail(k, ErrorCode::Io.as_i32().unsigned_abs());
            return;
        };
        let Ok(len32) = u32::try_from(len) else {
            let what = src.describe(k.index);
            self.datasets[ds]
                .log_failure(|| format!("{what}: {len} bytes is too large for one read"));
            let _ = self.cache.fail(k, ErrorCode::Io.as_i32().unsigned_abs());
            return;
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let ptr = self.arena.region().as_ptr().wrapping_add(dest as usize);
        // SAFETY: `dest..dest+len` is the extent the cache reserved for this
        // key inside the live arena mapping, `len` being the sample's size
        // from the same source's catalog; it stays reserved (in flight,
        // pinned) until the completion for `tag` is handled, and the arena
        // outlives every source (the engine drops its datasets first).
        let submitted = unsafe { src.submit(tag, k.index, ptr) };
        let inflight = Inflight {
            key: k,
            dest,
            started: Instant::now(),
            attempt,
            len: len32,
        };
        match submitted {
            Ok(()) => {
                self.metrics.reads_submitted.inc_by(1);
                self.inflight.insert(tag, inflight);
            }
            // Queue full: try again next turn, into the same extent.
            Err(_) => self.retry_queue.push((Instant::now(), inflight)),
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

    /// Moves the loading of remote datasets on; answers loaders waiting for
    /// a dataset whose first attempt just ended. Returns whether anything
    /// changed.
    fn poll_datasets(&mut self, now: Instant) -> bool {
        let mut changed = false;
        for i in 0..self.datasets.len() {
            let Some(event) = self.datasets[i].poll(now) else {
                continue;
            };
            changed = true;
            log_load_event(&self.datasets[i], Some(event));
            report_health(&self.metrics, &self.datasets[i]);
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting_opens)
                .into_iter()
                .partition(|(ds, _, _)| *ds == i);
            self.waiting_opens = others;
            for (_, conn, req) in mine {
                self.open_session(conn, req);
            }
        }
        changed
    }

    /// Collects finished reads of every dataset, without waiting. Returns
    /// whether there were any.
    fn collect_completions(&mut self) -> io::Result<bool> {
        self.completions.clear();
        for d in &mut self.datasets {
            if let Some(src) = d.source_mut() {
                src.poll_completions(None, &mut self.completions)?;
            }
        }
        let any = !self.completions.is_empty();
        self.handle_completions();
        Ok(any)
    }

    /// Waits up to `wait` for any dataset's read to finish (a plain sleep
    /// when none is in flight), then collects what finished.
    fn wait_for_completions(&mut self, wait: Duration) -> io::Result<()> {
        let mut fds: Vec<libc::pollfd> = self
            .datasets
            .iter()
            .filter_map(|d| d.source())
            .filter(|src| src.in_flight() > 0)
            .map(|src| libc::pollfd {
                fd: src.wait_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            std::thread::sleep(wait);
            return Ok(());
        }
        let ms = libc::c_int::try_from(wait.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fds` is a live, initialised array of `fds.len()` pollfd
        // structs that poll(2) may write `revents` into; the descriptors
        // stay open (their sources are borrowed from `self`, not dropped
        // during the call).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        self.collect_completions().map(|_| ())
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
                    self.metrics.bytes_read.inc_by(u64::from(*n));
                    let crc = self
                        .arena
                        .read_at(inf.dest, inf.len as usize)
                        .map(|b| crc32c::crc32c(&b))
                        .unwrap_or(0);
                    let _ = self.cache.complete(inf.key, crc);
                }
                Err(e)
                    if inf.attempt < self.cfg.prefetch.read_retries
                        && self.datasets[inf.key.dataset as usize]
                            .source()
                            .is_some_and(|src| src.is_retryable(e)) =>
                {
                    self.metrics.read_retries.inc_by(1);
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
                    self.metrics.read_errors.inc_by(1);
                    let d = &mut self.datasets[inf.key.dataset as usize];
                    self.metrics.dataset_health(&d.name, |h| h.read_errors += 1);
                    let what = d
                        .source()
                        .map(|src| src.describe(inf.key.index))
                        .unwrap_or_default();
                    d.log_failure(|| match other {
                        Err(e) => format!("read of {what} failed for good: {e}"),
                        Ok(n) => format!(
                            "read of {what} returned {n} of {} bytes (changed since the catalog was made?)",
                            inf.len
                        ),
                    });
                    let _ = self
                        .cache
                        .fail(inf.key, ErrorCode::Io.as_i32().unsigned_abs());
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
            if self.datasets[ds].relaxed && matches!(s.ready.unconsumed(), Ok(0)) {
                let swaps = relax_front(&mut s.pending, &self.cache, ds);
                self.metrics.relaxed_swaps.inc_by(swaps);
            }
            let Some(front) = s.pending.front() else {
                break;
            };
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
            let Some(src) = self.datasets[ds].source() else {
                break;
            };
            let mut entries = Vec::with_capacity(n * std::mem::size_of::<SampleEntry>());
            let mut pinned = Vec::with_capacity(n);
            let mut total = 0u64;
            let mut errors = 0u64;
            for (i, &x) in b.samples.iter().enumerate() {
                if b.pinned[i] {
                    pinned.push(x);
                }
                let e = src.meta(x);
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
                status: if errors > 0 {
                    ErrorCode::Io.as_i32()
                } else {
                    0
                },
                flags: if b.last_of_epoch {
                    BATCH_END_OF_EPOCH
                } else {
                    0
                },
                reserved: 0,
            };
            let _ = s.ready.try_stage(d);
            let _ = self.cache.advance_session_by(sid, n as u64);
            self.metrics.samples_served.inc_by(n as u64);
            self.metrics.bytes_served.inc_by(total);
            self.metrics.batches_served.inc_by(1);
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
                    self.metrics.loader_wait_ns.inc_by(dt.as_nanos() as u64);
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
        m.arena_free.set(a.free + tables_free);
        m.arena_cached.set(a.cached);
        m.arena_pinned.set(a.pinned + tables_used);
        m.arena_in_flight.set(a.in_flight);
        m.reads_in_flight.set(self.inflight.len() as u64);
        m.sessions_open.set(self.sessions.len() as u64);
        m.cache_hits
            .inner()
            .store(self.cache.hits(), Ordering::Relaxed);
        m.cache_misses
            .inner()
            .store(self.cache.misses(), Ordering::Relaxed);
    }
}

/// Relaxed order: every sample of the front batch that is still being read
/// trades places with a ready sample of a later batch of the same epoch
/// (already requested, so pinned by its batch: the pin moves with the
/// sample). The late sample moves back and keeps its pin; nothing is added
/// or dropped, so each epoch still delivers its samples exactly once.
/// Returns how many samples moved forward.
fn relax_front(pending: &mut VecDeque<PendingBatch>, cache: &Cache, ds: usize) -> u64 {
    let Some((front, later)) = pending.make_contiguous().split_first_mut() else {
        return 0;
    };
    let present = |x: u64| {
        matches!(
            cache.lookup(key(ds, x)),
            Lookup::Ready(_) | Lookup::Failed { .. }
        )
    };
    let ready = |x: u64| matches!(cache.lookup(key(ds, x)), Lookup::Ready(_));
    let mut swaps = 0;
    // Where the search for a ready sample stands: (later batch, position).
    let (mut b, mut k) = (0usize, 0usize);
    for i in 0..front.requested {
        if present(front.samples[i]) {
            continue;
        }
        loop {
            let Some(donor) = later.get_mut(b) else {
                return swaps;
            };
            if donor.epoch != front.epoch {
                return swaps;
            }
            if k >= donor.requested {
                (b, k) = (b + 1, 0);
                continue;
            }
            if ready(donor.samples[k]) {
                std::mem::swap(&mut front.samples[i], &mut donor.samples[k]);
                std::mem::swap(&mut front.pinned[i], &mut donor.pinned[k]);
                swaps += 1;
                k += 1;
                break;
            }
            k += 1;
        }
    }
    swaps
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
