//! The engine: one thread that owns the arena, the cache, the datasets'
//! sources, the sessions and the socket, and moves every session forward a
//! turn at a time. Each phase of a turn is a module of its own:
//!
//! 1. `open`: accept loaders and handle their messages (open / close /
//!    hang-up), end sessions whose loader went silent;
//! 2. `release`: take back released batches (unpin their samples; a bad
//!    release fences the session);
//! 3. `request`: plan each session's window ahead (slow start) and request
//!    every missing sample from its source — one read per sample, however
//!    many sessions want it; `balance` orders the sessions and divides a
//!    dataset's free reads among them (`prefetch.balance`);
//! 4. `complete`: collect read completions (any order); the dataset's
//!    retry policy decides what is tried again;
//! 5. `publish`: publish, in order, every batch whose samples are all
//!    present: a sample table goes into the arena, a descriptor into the
//!    ready ring;
//! 6. sleep on the sources' descriptors until something can happen.
//!
//! With peers, `peers` (the requester's side: gets to peers and their
//! outcomes), `peers_rdma` (the RDMA links) and `serving` (peers' requests
//! answered from the arena) run within the turn; `view` and `directory`
//! take membership views and compute directories.
//!
//! Time comes from an injected `Clock`, so the phases' tests control it.

mod assignment;
mod balance;
mod clock;
mod complete;
mod directory;
mod fence_backoff;
#[cfg(any(test, feature = "fuzzing"))]
mod harness;
mod jobstatus;
#[cfg(any(test, feature = "fuzzing"))]
pub mod loader_script;
mod open;
mod peers;
mod peers_rdma;
mod publish;
mod release;
mod request;
mod serving;
#[cfg(test)]
mod tests;
mod view;
mod warm;
mod why;

pub(crate) use clock::{Clock, SystemClock};

use crate::cache::{Cache, CacheConfig, Lookup, PolicyKind, SampleKey};
use crate::config::{Config, Membership};
use crate::dataset::{Dataset, LoadEvent};
use crate::extent::ExtentAllocator;
use crate::metrics::Metrics;
use crate::retry::RetryPolicy;
use crate::server::{ConnEvent, ConnId, Server};
use crate::session::Session;
use crate::source::Completion;
use granary_shm::arena::{Arena, ArenaOptions};
use granary_shm::handshake::{OpenSession, DEFAULT_BATCH_SIZE};
use slab::Slab;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long start-up waits for remote datasets' first catalog load.
pub(crate) const STARTUP_LOAD_WAIT: Duration = Duration::from_secs(15);

fn log_load_event(d: &Dataset, event: Option<LoadEvent>) {
    match event {
        Some(LoadEvent::Ready) => {
            if let Some(src) = d.source() {
                tracing::info!(
                    dataset = %d.name,
                    kind = src.kind(),
                    samples = src.len(),
                    bytes = src.total_bytes(),
                    "dataset ready"
                );
            }
        }
        Some(LoadEvent::Failed(e)) => {
            tracing::warn!(dataset = %d.name, "loading failed: {e}");
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

pub(crate) fn key(dataset: usize, sample: u64) -> SampleKey {
    SampleKey {
        dataset: dataset as u32,
        index: sample,
    }
}

/// What a request parked until its dataset's first load ends asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// An `OpenSession`.
    Open,
    /// An `AssignmentQuery`.
    Query,
}

/// A read on its way: submitted to a source, or waiting for its retry.
#[derive(Debug, Clone, Copy)]

struct Inflight {
    key: SampleKey,
    dest: u64,
    len: u32,
    /// Attempts made so far, this one included.
    attempt: u32,
    /// When this attempt was submitted.
    started: Instant,
    /// When the first attempt was submitted (the sample's deadline counts
    /// from here).
    first: Instant,
}

/// The engine state.
pub struct Engine {
    // Dropped first: a source waits, when dropped, until none of its reads
    // can write into the arena any more (and leaks its arena handles if it
    // cannot be sure).
    datasets: Vec<Dataset>,
    retry: Vec<RetryPolicy>,
    cfg: Config,
    metrics: Arc<Metrics>,
    clock: Box<dyn Clock>,
    arena: Arena,
    tables: ExtentAllocator,
    cache: Cache,
    server: Server,
    sessions: BTreeMap<u64, Session>,
    /// Reads submitted to a source, by tag.
    inflight: Slab<Inflight>,
    /// Reads waiting for their next attempt, with when it is due.
    retry_queue: Vec<(Instant, Inflight)>,
    next_session: u64,
    instance_key: u64,
    events: Vec<ConnEvent>,
    /// Opens of datasets whose first load attempt is still running.
    waiting_opens: Vec<(usize, ConnId, OpenSession, Waiting)>,
    completions: Vec<Completion>,
    last_turn: Instant,
    last_heartbeat: Instant,
    /// The peer tier, when `[peers]` is on and a view is known.
    peers: Option<crate::peers::PeerTier>,
    peer_events: Vec<crate::peers::net::Event>,
    link_events: Vec<crate::peers::rdma_link::LinkEvent>,
    /// Opens the NIC of a peer tier started later (a new view) in place of
    /// the device probe: a test's fake NIC. `None`: `peers.transport`.
    rdma_nic: Option<crate::peers::transport::OpenNic>,
    /// This agent's peer listener and the address it advertises, when
    /// `[peers]` is on.
    peer_endpoint: Option<crate::peers::Endpoint>,
    /// The view each loader connection joined.
    conn_views: std::collections::HashMap<ConnId, crate::peers::ViewTag>,
    /// The rank layout each loader connection handed in (or why it could
    /// not be read), for locality-mode queries and opens.
    conn_layouts: std::collections::HashMap<ConnId, assignment::HandedLayout>,
    /// Directories being computed off the engine thread.
    directories: directory::Directories,
    /// A view change left kept samples the new keep-set drops.
    release_stale_kept: bool,
    /// Processes fenced again and again wait before their next session.
    fence_backoff: fence_backoff::FenceBackoff,
    last_release: Instant,
    /// The arena's file and index, when a restart is to be warm.
    warm: Option<warm::WarmState>,
    /// When the loaders' waits were last read ([`crate::why`]).
    last_why: Instant,
    /// Where the job stands: positions and waits, ours and the peers'.
    job: crate::jobstatus::JobTable,
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
/// The reserve holds one such window of batches of the default size of the
/// largest mean sample among the datasets (each rounded up to the cache's
/// alignment): at least the default sixteenth of the cache, at most half of
/// it. More concurrent sessions share it. Remote datasets still loading
/// when the engine starts do not count.
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
        .saturating_mul(u64::from(DEFAULT_BATCH_SIZE))
        .saturating_mul(u64::from(cfg.prefetch.window_batches));
    let half = cache.arena_size / 2 / align * align;
    window.clamp(cache.transient_reserve.min(half), half)
}

impl Engine {
    /// Creates the arena, binds the socket, opens every dataset: the
    /// filesystem ones here (a failure stops the agent), the remote ones on
    /// threads of their own, waiting up to `STARTUP_LOAD_WAIT` (15 s) for them
    /// (a store that cannot be reached by then is tried again in the
    /// background while the others serve).
    pub fn new(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Engine> {
        Engine::with_datasets(cfg, metrics, Vec::new())
    }

    /// Like [`new`](Self::new), with the arena in a named file that
    /// outlives the process and an index of its samples beside it, so that
    /// the next start is warm (`granaryd run`; [`crate::warm`]). The
    /// samples of the previous agent's index are checked and put back.
    pub fn new_warm(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Engine> {
        Engine::build(cfg, metrics, Vec::new(), Box::new(SystemClock), true)
    }

    /// Like [`new`](Self::new), serving `extra` datasets (opened by the
    /// caller: a wrapped or fault-injecting client) after the configured
    /// ones.
    pub fn with_datasets(
        cfg: Config,
        metrics: Arc<Metrics>,
        extra: Vec<Dataset>,
    ) -> io::Result<Engine> {
        Engine::with_clock(cfg, metrics, extra, Box::new(SystemClock))
    }

    /// Like [`with_datasets`](Self::with_datasets), reading time from
    /// `clock`.
    pub(crate) fn with_clock(
        cfg: Config,
        metrics: Arc<Metrics>,
        extra: Vec<Dataset>,
        clock: Box<dyn Clock>,
    ) -> io::Result<Engine> {
        Engine::build(cfg, metrics, extra, clock, false)
    }

    fn build(
        cfg: Config,
        metrics: Arc<Metrics>,
        extra: Vec<Dataset>,
        clock: Box<dyn Clock>,
        warm: bool,
    ) -> io::Result<Engine> {
        let mut datasets = Vec::new();
        for d in &cfg.datasets {
            if Dataset::is_remote(d) {
                datasets.push(Dataset::open_in_background(d, &cfg));
                continue;
            }
            let ds = Dataset::open_now(d, &cfg)
                .map_err(|e| io::Error::other(format!("dataset {:?}: {e}", d.name())))?;
            if ds.source().is_some_and(|s| s.is_empty()) {
                return Err(io::Error::other(format!(
                    "dataset {:?} has no samples",
                    d.name()
                )));
            }
            datasets.push(ds);
        }
        for m in &cfg.mixtures {
            if Dataset::is_remote_mixture(m, &cfg) {
                datasets.push(Dataset::open_mixture_in_background(m, &cfg));
                continue;
            }
            datasets.push(
                Dataset::open_mixture_now(m, &cfg)
                    .map_err(|e| io::Error::other(format!("mixture {:?}: {e}", m.name)))?,
            );
        }
        // Datasets handed over ready follow `[prefetch]`'s retry settings.
        for mut d in extra {
            d.retry = cfg.prefetch.retry_settings(&Default::default());
            datasets.push(d);
        }
        metrics.register_datasets(datasets.iter().map(|d| (d.name.as_str(), d.kind())));
        let deadline = Instant::now() + STARTUP_LOAD_WAIT;
        for d in &mut datasets {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = d.wait(left);
            log_load_event(d, event);
            if let Some(why) = d.unavailable() {
                tracing::warn!("{why}; serving the other datasets meanwhile");
            }
            report_health(&metrics, d);
        }
        let retry = datasets
            .iter()
            .map(|d| RetryPolicy::new(&cfg, &d.retry))
            .collect();
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
        let (arena, warm) = if warm {
            let o = crate::warm::open_arena(&cfg, &opts)?;
            (o.arena, o.warm)
        } else {
            let a = Arena::create(&opts).map_err(|e| io::Error::other(format!("arena: {e}")))?;
            (a, None)
        };
        arena
            .check_loader_access()
            .map_err(|e| io::Error::other(format!("arena self-check: {e}")))?;
        if let Some(reason) = arena.fallback_reason() {
            tracing::warn!("arena uses 4 KiB pages, not hugepages: {reason}");
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
        if cfg.peers.enabled() {
            cc.keep_reserve =
                (cc.arena_size / 100 * u64::from(cfg.peers.keep_percent)) / cc.align * cc.align;
        }
        cc.transient_reserve =
            transient_reserve(&cfg, &datasets, &cc).min(cc.arena_size - cc.keep_reserve);
        let cache = Cache::new(cc).map_err(|e| io::Error::other(format!("cache: {e}")))?;
        let configured_view = match cfg.peers.membership {
            Membership::Off | Membership::Session => None,
            Membership::Static | Membership::Slurm => Some(
                crate::peers::view_from_config(
                    &cfg.peers,
                    cc.keep_reserve,
                    &std::env::vars().collect(),
                )
                .map_err(|e| io::Error::other(format!("peers: {e}")))?,
            ),
        };
        let peer_endpoint = if cfg.peers.enabled() {
            Some(
                crate::peers::endpoint(&cfg.peers, configured_view.as_ref())
                    .map_err(|e| io::Error::other(format!("peers: {e}")))?,
            )
        } else {
            None
        };
        let peers = match configured_view {
            Some(view) => Some(crate::peers::PeerTier::start(
                &cfg,
                view,
                &cc,
                datasets.len(),
                &arena,
                None,
                &metrics.peers,
            )?),
            None => None,
        };
        if let Some(v) = peers.as_ref().map(|t| t.view()) {
            metrics.peers.view_epoch.set(v.epoch());
        }
        let server = Server::bind(&cfg.socket, &cfg.peers)?;
        metrics.arena_size.set(size);
        let now = clock.now();
        let mut engine = Engine {
            cfg,
            metrics,
            clock,
            arena,
            tables,
            cache,
            server,
            datasets,
            retry,
            sessions: BTreeMap::new(),
            inflight: Slab::new(),
            retry_queue: Vec::new(),
            next_session: 1,
            instance_key: crate::sys::random_u64(),
            events: Vec::new(),
            waiting_opens: Vec::new(),
            completions: Vec::new(),
            last_turn: now,
            last_heartbeat: now,
            last_why: now,
            job: crate::jobstatus::JobTable::default(),
            peers,
            peer_events: Vec::new(),
            link_events: Vec::new(),
            rdma_nic: None,
            peer_endpoint,
            conn_views: std::collections::HashMap::new(),
            conn_layouts: std::collections::HashMap::new(),
            directories: directory::Directories::default(),
            release_stale_kept: false,
            fence_backoff: fence_backoff::FenceBackoff::default(),
            last_release: now,
            warm: warm.map(|w| warm::WarmState::new(w, now)),
        };
        if engine.warm.is_some() {
            engine.cache.enable_journal();
        }
        for i in 0..engine.datasets.len() {
            engine.warm_restore(i);
        }
        // A configured view's directories before the first loader is
        // served (no session waits yet), so that its first reads are
        // routed; those of datasets still loading come later.
        engine.wait_for_directories(STARTUP_LOAD_WAIT);
        Ok(engine)
    }

    /// The socket path loaders connect to.
    pub(crate) fn socket_path(&self) -> &std::path::Path {
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
        let mut last_tick = self.clock.now();
        while !stop.load(Ordering::Relaxed) {
            let progressed = self.turn()?;
            let now = self.clock.now();
            if now.saturating_duration_since(last_tick) >= Duration::from_millis(100) {
                last_tick = now;
                tick(self);
            }
            if !progressed {
                let wait = if self.sessions.is_empty()
                    && self.inflight.is_empty()
                    && self.peers.as_ref().is_none_or(|t| !t.gets_in_flight())
                    && !self.rdma_polled_each_turn()
                {
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
            s.segment().close();
        }
        self.warm_journal();
        self.warm_snapshot(self.clock.now(), true);
        Ok(())
    }

    /// One turn; returns whether anything moved.
    pub(crate) fn turn(&mut self) -> io::Result<bool> {
        let now = self.clock.now();
        let dt = now.saturating_duration_since(self.last_turn);
        self.last_turn = now;

        let mut progressed = self.poll_connections();
        progressed |= self.poll_datasets(now);
        progressed |= self.peer_directories();
        self.release_unkept();
        progressed |= self.poll_peers(now);
        self.heartbeat(now);
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for &id in &ids {
            progressed |= self.reclaim(id, now);
        }
        progressed |= self.end_silent_sessions(now);
        self.retry_due(now);
        progressed |= self.request_all(&ids, now);
        progressed |= self.collect_completions()?;
        for &id in &ids {
            progressed |= self.publish(id, dt);
        }
        self.why_interval(now);
        self.update_gauges();
        self.warm_journal();
        self.warm_snapshot(now, false);
        if cfg!(any(debug_assertions, test)) {
            self.check_invariants();
        }
        Ok(progressed)
    }

    /// Writes the agent's heartbeat into every session's segment, every
    /// `sessions.heartbeat_ms`.
    fn heartbeat(&mut self, now: Instant) {
        let every = Duration::from_millis(self.cfg.sessions.heartbeat_ms);
        if now.saturating_duration_since(self.last_heartbeat) < every {
            return;
        }
        self.last_heartbeat = now;
        let ms = granary_shm::monotonic_ms();
        for s in self.sessions.values() {
            s.segment().heartbeat(ms);
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
            self.warm_restore(i);
            report_health(&self.metrics, &self.datasets[i]);
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting_opens)
                .into_iter()
                .partition(|(ds, _, _, _)| *ds == i);
            self.waiting_opens = others;
            for (_, conn, req, waiting) in mine {
                match waiting {
                    Waiting::Open => self.handle_open(conn, req),
                    Waiting::Query => self.assignment_query(conn, req),
                }
            }
        }
        changed
    }

    /// Every sample referenced by a batch on loan or being prepared is
    /// pinned in the cache (at least once per batch holding it), every
    /// sample a batch on loan published as ready is still where its sample
    /// table says with the same bytes (CRC-32C), and the cache's own books
    /// balance. Runs after every turn in debug builds and in the unit tests;
    /// a violation is a bug, so it panics.
    fn check_invariants(&self) {
        if let Err(e) = self.cache.check_invariants() {
            panic!("cache invariant broken: {e}");
        }
        let mut held: std::collections::HashMap<SampleKey, u32> = Default::default();
        let mut entries = Vec::new();
        let window = self.cfg.prefetch.window_batches as usize;
        for s in self.sessions.values() {
            // A window of batches, and the end-of-stream marker.
            assert!(
                s.loans() <= window + 1,
                "session {} has {} batches on loan, its window is {window}",
                s.id(),
                s.loans()
            );
            let ds = s.dataset();
            let pending = s.pending().iter().flat_map(|b| b.pinned_samples());
            let loaned = s.loaned().flat_map(|l| l.pinned.iter().copied());
            for x in pending.chain(loaned) {
                *held.entry(key(ds, x)).or_default() += 1;
            }
            for loan in s.loaned() {
                let Some(table) = loan.table else { continue };
                let d = granary_shm::BatchDescriptor {
                    table_offset: table.offset,
                    sample_count: loan.pinned.len() as u32,
                    ..Default::default()
                };
                if let Err(e) =
                    granary_shm::validate::copy_sample_table(self.arena.region(), &d, &mut entries)
                {
                    panic!(
                        "session {}: a loaned sample table reads back as {e}",
                        s.id()
                    );
                }
                for (&x, e) in loan.pinned.iter().zip(&entries) {
                    if e.status != 0 {
                        continue;
                    }
                    let k = key(ds, x);
                    let Lookup::Ready(r) = self.cache.lookup(k) else {
                        panic!("session {}: {k} is on loan as ready but is not", s.id());
                    };
                    assert!(
                        r.offset == e.offset && r.len == u64::from(e.length),
                        "session {}: {k} moved while on loan",
                        s.id()
                    );
                    let crc = self.arena.crc32c(e.offset, e.length as usize).ok();
                    assert_eq!(
                        crc,
                        Some(e.crc32c),
                        "session {}: the bytes of {k} changed while on loan",
                        s.id()
                    );
                }
            }
        }
        for (k, n) in held {
            let pins = self.cache.pins(k);
            assert!(
                pins >= n,
                "{n} batch(es) hold a pin on {k}, the cache counts {pins}"
            );
        }
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
