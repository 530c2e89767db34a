//! Shared pieces of the agent-level tests (the watchdog and `AgentDir`
//! come from granary-testkit): an engine serving a
//! synthetic dataset over its real socket, an honest loader that checks
//! every sample against the planner and the synthetic content, metric and
//! descriptor snapshots, and child processes that re-run the test binary in
//! another role.
#![allow(dead_code)]

use granary::{Batch, Client, ErrorCode, Session, SessionOptions};
use granary_agent::config::Config;
use granary_agent::engine::Engine;
use granary_agent::metrics::Metrics;
use granary_agent::planner::{EpochPlan, PlanParams};
use granary_testkit::agent_toml;
use granary_tools::synth::{self, SynthSpec};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Environment variable that selects a child process's role.
pub const ROLE_VAR: &str = "GRANARY_TEST_ROLE";
/// Environment variable that carries the agent's socket path to a child.
pub const SOCKET_VAR: &str = "GRANARY_TEST_SOCKET";
/// Environment variable that carries a seed to a child.
pub const SEED_VAR: &str = "GRANARY_TEST_SEED";

mod store_suites;
#[allow(unused_imports)] // not every suite serves from a store
pub use store_suites::*;

#[allow(unused_imports)] // not every suite uses each
pub use granary_testkit::{
    dataset::{AgentDir, DATASET},
    watchdog, watchdog_fn,
};

/// A small deterministic generator (SplitMix64) for "random-ish" choices
/// that a failing run can reproduce from its printed seed.
#[allow(unused_imports)] // not every suite draws
pub use granary_base::SplitMix64 as Rng;

/// A seed that differs between runs (printed by the tests that use it).
pub fn time_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
}

/// How to set up a test agent.
pub struct AgentOptions {
    pub files: u64,
    pub classes: u32,
    pub mean_size: u64,
    pub arena: &'static str,
    pub max_inflight_reads: u32,
    pub window_batches: u32,
    pub socket_mode: &'static str,
    /// More TOML tables (e.g. `[sessions]`), appended as written.
    pub extra: String,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            files: 500,
            classes: 10,
            mean_size: 8_000,
            arena: "64MiB",
            max_inflight_reads: 32,
            window_batches: 16,
            socket_mode: "0660",
            extra: String::new(),
        }
    }
}

/// An engine serving a synthetic dataset named `synth` from a thread of the
/// test process.
pub struct TestAgent {
    pub dir: tempfile::TempDir,
    pub data: PathBuf,
    pub sock: PathBuf,
    pub spec: SynthSpec,
    pub metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl TestAgent {
    /// Generates the dataset and starts the engine.
    pub fn start(o: AgentOptions) -> TestAgent {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let spec = granary_testkit::dataset::synth_at(&data, o.files, o.classes, o.mean_size);
        let sock = dir.path().join("granary.sock");
        let prefetch = format!(
            "max_inflight_reads = {}\nwindow_batches = {}\ninitial_window = 2\n\
             read_retries = 1\nretry_backoff_ms = 5",
            o.max_inflight_reads, o.window_batches
        );
        let socket = format!("mode = \"{}\"", o.socket_mode);
        let toml = agent_toml::head_with_socket(o.arena, &sock, &socket, &prefetch, "")
            + &o.extra
            + "\n"
            + &agent_toml::fs_dataset(DATASET, &data, "");
        let cfg = Config::from_toml_str(&toml).expect("test config");
        Self::start_with(dir, data, sock, spec, cfg)
    }

    fn start_with(
        dir: tempfile::TempDir,
        data: PathBuf,
        sock: PathBuf,
        spec: SynthSpec,
        cfg: Config,
    ) -> TestAgent {
        Self::start_custom(dir, data, sock, spec, cfg, Vec::new())
    }

    /// Starts an engine on `cfg` (whose socket is `sock`) over `spec`'s
    /// synthetic dataset.
    pub fn start_on(
        dir: tempfile::TempDir,
        spec: &SynthSpec,
        sock: PathBuf,
        cfg: Config,
    ) -> TestAgent {
        Self::start_custom(dir, spec.root.clone(), sock, spec.clone(), cfg, Vec::new())
    }

    /// Starts an engine on `cfg` (whose socket is `sock`), serving `extra`
    /// datasets after the configured ones.
    pub fn start_custom(
        dir: tempfile::TempDir,
        data: PathBuf,
        sock: PathBuf,
        spec: SynthSpec,
        cfg: Config,
        extra: Vec<granary_agent::dataset::Dataset>,
    ) -> TestAgent {
        let stop = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(Metrics::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            let metrics = Arc::clone(&metrics);
            std::thread::Builder::new()
                .name("granary-engine".into())
                .spawn(move || {
                    let mut e = match Engine::with_datasets(cfg, metrics, extra) {
                        Ok(e) => e,
                        Err(err) => {
                            let _ = ready_tx.send(Err(err.to_string()));
                            return Err(err);
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    e.run(&stop, |_| {})
                })
                .expect("engine thread")
        };
        ready_rx
            .recv()
            .expect("engine thread reports")
            .unwrap_or_else(|e| panic!("engine did not start: {e}"));
        TestAgent {
            dir,
            data,
            sock,
            spec,
            metrics,
            stop,
            thread: Some(thread),
        }
    }

    /// True while the engine thread runs (it neither returned nor panicked).
    pub fn alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the engine and checks it ended cleanly.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread.take().expect("running");
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("the engine failed: {e}"),
            Err(_) => panic!("the engine thread panicked"),
        }
    }

    pub fn acct(&self) -> Acct {
        Acct::of(&self.metrics)
    }

    /// Waits until no session is open and nothing is pinned or in flight;
    /// returns the settled accounting.
    pub fn wait_idle(&self, timeout: Duration) -> Acct {
        let m = &self.metrics;
        let end = Instant::now() + timeout;
        loop {
            assert!(self.alive(), "the engine thread died");
            let a = self.acct();
            let settled = m.sessions_open.get() == 0
                && a.pinned == 0
                && a.in_flight == 0
                && m.reads_in_flight.get() == 0
                && a.sum() == a.size
                && a == self.acct();
            if settled {
                return a;
            }
            assert!(
                Instant::now() < end,
                "the agent did not settle within {timeout:?}: {a:?}, sessions open {}, reads in flight {}",
                m.sessions_open.get(),
                m.reads_in_flight.get()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.sock).expect("connect to the test agent")
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The arena gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acct {
    pub free: u64,
    pub cached: u64,
    pub pinned: u64,
    pub in_flight: u64,
    pub size: u64,
}

impl Acct {
    pub fn of(m: &Metrics) -> Acct {
        Acct {
            free: m.arena_free.get(),
            cached: m.arena_cached.get(),
            pinned: m.arena_pinned.get(),
            in_flight: m.arena_in_flight.get(),
            size: m.arena_size.get(),
        }
    }

    pub fn sum(&self) -> u64 {
        self.free + self.cached + self.pinned + self.in_flight
    }

    /// free + cached + pinned + in-flight == arena size.
    pub fn assert_balanced(&self) {
        assert!(self.size > 0, "arena size gauge not set: {self:?}");
        assert_eq!(
            self.sum(),
            self.size,
            "accounting broken: free + cached + pinned + in_flight != arena size ({self:?})"
        );
    }
}

/// Reads `child`'s piped stdout until a line that is `line`; panics
/// naming `who` when the child ends first. Returns the rest of its
/// stdout (kept open, so that the child's writes never fail).
pub fn wait_for_line(
    child: &mut std::process::Child,
    line: &str,
    who: &str,
) -> std::io::Lines<std::io::BufReader<std::process::ChildStdout>> {
    use std::io::BufRead;
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufReader::new(out).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.trim() == line => return lines,
            Some(Ok(_)) => continue,
            _ => {
                let st = child.wait();
                panic!("{who} ended before printing {line:?}: {st:?}");
            }
        }
    }
}

/// `s`'s next batch (waiting up to `limit`), `None` at the end of its
/// stream; any other error panics, naming `who`.
pub fn next_or_end(s: &mut Session, limit: Duration, who: &str) -> Option<Batch> {
    match s.next_batch(Some(limit)) {
        Ok(b) => Some(b),
        Err(e) if e.code() == ErrorCode::EndOfStream => None,
        Err(e) => panic!("{who}: {e}"),
    }
}

/// A loader on its own thread: `epochs` epochs of `dataset` from the agent
/// at `sock` in batches of `batch` (seed `seed`), waiting up to a minute
/// for an agent that goes away to come back, every sample checked against
/// `spec`; `after_release` runs after each batch is handed back. Its
/// result: the ids seen in each epoch, and how often the session resumed.
pub fn resuming_loader(
    sock: &Path,
    dataset: &str,
    spec: &SynthSpec,
    (batch, epochs, seed): (u32, u32, u64),
    mut after_release: impl FnMut() + Send + 'static,
) -> JoinHandle<(Vec<Vec<u64>>, u32)> {
    let (sock, dataset, spec) = (sock.to_path_buf(), dataset.to_string(), spec.clone());
    std::thread::spawn(move || {
        let client = Client::connect(&sock).expect("loader: connect");
        let mut o = SessionOptions::new(&dataset);
        o.batch_size = batch;
        o.epoch_count = epochs;
        o.seed = seed;
        o.resume_timeout = Some(Duration::from_secs(60));
        let mut s = client.open_session(&o).expect("loader: open");
        let mut seen = vec![Vec::new(); epochs as usize];
        while let Some(b) = next_or_end(&mut s, Duration::from_secs(60), "loader: next batch") {
            for smp in b.samples() {
                verify(&spec, &smp);
                seen[b.epoch() as usize].push(smp.id());
            }
            s.release(b).expect("loader: release");
            after_release();
        }
        let resumes = s.resumes();
        s.close().expect("loader: close");
        (seen, resumes)
    })
}

/// The job position `client` answers for `o`, once it is one `wanted`
/// accepts (waiting up to 30 s, through `NotFound` answers while the
/// agent does not know the plan yet; any other error panics).
pub fn wait_for_position(
    what: &str,
    client: &Client,
    o: &SessionOptions,
    wanted: impl Fn(&granary::JobPosition) -> bool,
) -> granary::JobPosition {
    let mut pos = None;
    wait_for(what, Duration::from_secs(30), || {
        match client.job_position(o) {
            Ok(p) if wanted(&p) => {
                pos = Some(p);
                true
            }
            Ok(_) => false,
            Err(e) if e.code() == ErrorCode::NotFound => false,
            Err(e) => panic!("job position: {e}"),
        }
    });
    pos.unwrap()
}

/// Polls `cond` every 5 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// This process's open descriptors: fd → link target.
pub fn open_fds() -> BTreeMap<i32, String> {
    let mut out = BTreeMap::new();
    let dir = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
    let own = format!("/proc/{}/fd", std::process::id());
    for e in dir.flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let target = std::fs::read_link(e.path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "?".into());
        if target == own || target.starts_with("/proc/self/fd") {
            continue; // the directory being listed
        }
        out.insert(fd, target);
    }
    out
}

/// Descriptor kinds and how many of each (socket and pipe inodes folded).
pub fn fd_kinds(fds: &BTreeMap<i32, String>) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for t in fds.values() {
        let k = match t.split_once(":[") {
            Some((kind, _)) => kind.to_string(),
            None => t.clone(),
        };
        *kinds.entry(k).or_insert(0) += 1;
    }
    kinds
}

/// Ring-segment memfds (`memfd:granary-session-*`) this process holds.
pub fn session_memfds() -> Vec<String> {
    open_fds()
        .into_values()
        .filter(|t| t.contains("memfd:granary-session-"))
        .collect()
}

/// Asserts the process holds the same kinds and counts of descriptors as
/// in `baseline`, and no ring segment.
pub fn assert_fds_back_to(baseline: &BTreeMap<String, usize>) {
    let mut now = BTreeMap::new();
    // Give a just-closed descriptor a moment (threads finishing their drops).
    for _ in 0..200 {
        now = fd_kinds(&open_fds());
        if &now == baseline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        &now, baseline,
        "descriptors leaked (or lost): now vs baseline"
    );
    let segs = session_memfds();
    assert!(segs.is_empty(), "ring segments still open: {segs:?}");
}

/// A command that re-runs this test binary's test `test_fn` alone, in the
/// role `role`. Child entry points are `#[ignore]`d (hence `--ignored`) and
/// named `*_child`, which `.config/nextest.toml` filters out of every run.
pub fn child_command(test_fn: &str, role: &str, sock: &Path) -> Command {
    let exe = std::env::current_exe().expect("current exe");
    child_command_of(&exe, test_fn, role, sock)
}

/// [`child_command`] running the test binary at `exe` (a copy of this one).
fn child_command_of(exe: &Path, test_fn: &str, role: &str, sock: &Path) -> Command {
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        test_fn,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(ROLE_VAR, role)
    .env(SOCKET_VAR, sock);
    c
}

/// Runs test `test_fn` of a copy of this test binary, placed in `dir`
/// (which `uid` must be able to enter), in the role `role`, as `uid` and
/// `gid`; returns what it printed. Needs root.
pub fn run_child_as(
    dir: &Path,
    test_fn: &str,
    role: &str,
    sock: &Path,
    (uid, gid): (u32, u32),
) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let exe = dir.join(format!("{role}-loader"));
    std::fs::copy(std::env::current_exe().expect("current exe"), &exe)
        .expect("copy the test binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let run = || {
        child_command_of(&exe, test_fn, role, sock)
            .current_dir(dir)
            .uid(uid)
            .gid(gid)
            .stdin(std::process::Stdio::null())
            .output()
    };
    // A test thread that forks while the copy is being written hands the
    // write descriptor to its child for a moment: exec then fails with
    // ETXTBSY until that child has exec'd.
    let mut tries = 0;
    loop {
        match run() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => {
                break other.unwrap_or_else(|e| panic!("run the {role} loader as uid {uid}: {e}"))
            }
        }
    }
}

/// The role this process was started in, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// The role of a child entry point; panics when the test binary was run
/// without one (a child entry is no test on its own).
pub fn expect_child_role(test_fn: &str) -> String {
    child_role().unwrap_or_else(|| {
        panic!("{test_fn} is a child process entry point, run only by its parent test")
    })
}

/// The socket path a child was given.
pub fn child_socket() -> PathBuf {
    PathBuf::from(std::env::var_os(SOCKET_VAR).expect("child: socket path in the environment"))
}

/// Checks one delivered sample's bytes against the synthetic content.
pub fn verify(spec: &SynthSpec, s: &granary::Sample<'_>) {
    assert_eq!(s.status(), 0, "sample {} has status {}", s.id(), s.status());
    let bytes = s.to_vec();
    let info = synth::verify_sample(&bytes)
        .unwrap_or_else(|e| panic!("sample {} is corrupt: {e}", s.id()));
    assert_eq!(info.file_id, s.id(), "sample id and content disagree");
    assert_eq!(info, spec.sample_info(s.id()), "sample {} metadata", s.id());
    assert_eq!(info.class as i32, s.label(), "sample {} label", s.id());
    assert!(s.checksum_matches(), "sample {}: CRC-32C mismatch", s.id());
}

/// What an honest loader asks for.
#[derive(Clone, Copy, Debug)]
pub struct Honest {
    pub seed: u64,
    pub rank: u32,
    pub world_size: u32,
    pub batch_size: u32,
    /// Epochs to finish at least, even when told to stop.
    pub min_epochs: u32,
    /// Epochs requested from the agent (an upper bound).
    pub max_epochs: u32,
    /// Pause after each batch, to stretch the run.
    pub pause: Duration,
}

impl Honest {
    /// Rank 0 of 1 reading exactly `epochs` epochs of `batch_size` in the
    /// order of `seed`, without pausing.
    pub fn epochs(seed: u64, batch_size: u32, epochs: u32) -> Honest {
        Honest {
            seed,
            rank: 0,
            world_size: 1,
            batch_size,
            min_epochs: epochs,
            max_epochs: epochs,
            pause: Duration::ZERO,
        }
    }

    /// Rank 0 of 1 reading epochs of `batch_size` in the order of `seed`
    /// (at least one, at most 1000) until told to stop, pausing `pause`
    /// after each batch.
    pub fn until_stopped(seed: u64, batch_size: u32, pause: Duration) -> Honest {
        Honest {
            max_epochs: 1000,
            pause,
            ..Honest::epochs(seed, batch_size, 1)
        }
    }
}

/// Session options for `dataset` in the planner's order that `p`
/// describes (its `num_samples` is the dataset's).
pub fn plan_options(dataset: &str, p: &PlanParams) -> SessionOptions {
    SessionOptions {
        seed: p.seed,
        rank: p.rank,
        world_size: p.world_size,
        batch_size: p.batch_size,
        drop_last: p.drop_last,
        ..SessionOptions::new(dataset)
    }
}

/// Runs an honest loader: every batch of every epoch must be exactly the
/// planner's (so every sample of the share exactly once), every sample
/// verified byte for byte. Stops at an epoch boundary once `stop` is set
/// and `min_epochs` are done. Returns the epochs verified.
pub fn honest_loader(sock: &Path, spec: &SynthSpec, h: Honest, stop: &AtomicBool) -> u32 {
    honest_loader_of(sock, DATASET, spec, h, stop)
}

impl TestAgent {
    /// Runs [`honest_loader`] on this agent's dataset in a thread of its
    /// own until `stop` is set; the thread returns the epochs it read.
    pub fn spawn_honest(&self, h: Honest, stop: &Arc<AtomicBool>) -> JoinHandle<u32> {
        let (sock, spec, stop) = (self.sock.clone(), self.spec.clone(), Arc::clone(stop));
        std::thread::spawn(move || honest_loader(&sock, &spec, h, &stop))
    }
}

/// [`honest_loader`] of dataset `dataset`.
pub fn honest_loader_of(
    sock: &Path,
    dataset: &str,
    spec: &SynthSpec,
    h: Honest,
    stop: &AtomicBool,
) -> u32 {
    let client = Client::connect(sock).expect("honest loader: connect");
    let params = PlanParams {
        num_samples: spec.num_files,
        seed: h.seed,
        rank: h.rank,
        world_size: h.world_size,
        batch_size: h.batch_size,
        drop_last: false,
    };
    let o = SessionOptions {
        epoch_count: h.max_epochs,
        ..plan_options(dataset, &params)
    };
    let mut s = client.open_session(&o).expect("honest loader: open");
    drop(client);
    let mut epoch_batches: Vec<Vec<u64>> = Vec::new();
    let mut epoch = 0u32;
    let mut done = 0u32;
    while let Some(b) = next_or_end(
        &mut s,
        Duration::from_secs(30),
        &format!("honest loader: next_batch in epoch {epoch}"),
    ) {
        assert_eq!(b.status(), 0, "honest loader: batch status");
        assert_eq!(b.epoch(), epoch, "honest loader: batch of the wrong epoch");
        assert_eq!(
            b.index(),
            epoch_batches.len() as u64,
            "honest loader: batch index out of order"
        );
        let mut ids = Vec::with_capacity(b.len());
        for smp in b.samples() {
            verify(spec, &smp);
            ids.push(smp.id());
        }
        epoch_batches.push(ids);
        let end = b.is_end_of_epoch();
        s.release(b).expect("honest loader: release");
        if end {
            let plan = EpochPlan::new(&params, epoch).expect("plan");
            let want: Vec<Vec<u64>> = plan.batches().map(<[u64]>::to_vec).collect();
            assert_eq!(
                epoch_batches, want,
                "honest loader: epoch {epoch} differs from the plan"
            );
            // Independently of the plan: the share's size, and (when the
            // ranks split the dataset evenly, so nothing is padded) no
            // sample twice and every sample in the dataset.
            let mut all: Vec<u64> = epoch_batches.iter().flatten().copied().collect();
            let n = spec.num_files;
            let ws = u64::from(h.world_size);
            assert_eq!(
                all.len() as u64,
                n.div_ceil(ws),
                "honest loader: epoch {epoch} size"
            );
            all.sort_unstable();
            all.dedup();
            if n.is_multiple_of(ws) {
                assert_eq!(
                    all.len() as u64,
                    n / ws,
                    "honest loader: a sample twice in epoch {epoch}"
                );
            }
            assert!(
                all.iter().all(|&x| x < n),
                "honest loader: sample id out of range"
            );
            epoch_batches.clear();
            epoch += 1;
            done += 1;
            if done >= h.min_epochs && stop.load(Ordering::Relaxed) {
                break;
            }
        }
        if !h.pause.is_zero() {
            std::thread::sleep(h.pause);
        }
    }
    s.close().expect("honest loader: close");
    done
}

/// A session opened with the raw handshake: the connection, the agent's
/// reply and the two descriptors it passed (arena, ring segment).
pub struct RawSession {
    pub conn: granary_shm::socket::SeqPacket,
    pub reply: granary_shm::handshake::SessionOpened,
    pub arena: std::os::fd::OwnedFd,
    pub segment: std::os::fd::OwnedFd,
}

/// Opens a session without libgranary, keeping the descriptors.
pub fn raw_open(sock: &Path, o: &SessionOptions) -> RawSession {
    use granary_shm::handshake::Message;
    let conn = granary_shm::socket::SeqPacket::connect(sock).expect("raw: connect");
    conn.send_message(&Message::OpenSession(o.request()), &[])
        .expect("raw: send the open request");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("raw: read timeout");
    let (msg, fds) = conn.recv_message().expect("raw: the agent's answer");
    let Message::SessionOpened(reply) = msg else {
        panic!("raw: expected SessionOpened, the agent sent {msg:?}");
    };
    assert_eq!(
        fds.len(),
        2,
        "raw: the reply must carry the arena and the segment"
    );
    let mut fds = fds.into_iter();
    let arena = fds.next().expect("arena fd");
    let segment = fds.next().expect("segment fd");
    RawSession {
        conn,
        reply,
        arena,
        segment,
    }
}
