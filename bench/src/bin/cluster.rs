//! multi-node cluster: node namespaces and a far store (veth, bridge, tbf, delay proxy), peers on/off, a peer killed, corrupted blocks, a slow link (root)
//!
//! Builds node namespaces `gcl-n0…` and a store namespace `gcl-store` on a
//! bridge (`granary_bench::netns`), with rate-limited links; runs SeaweedFS
//! behind the delay proxy in the store namespace, and in every node
//! namespace one `granaryd` and one loader process (two ranks on node 0).
//! Each scenario reads the same dataset for `--epochs` epochs, epoch by
//! epoch (all loaders finish an epoch before the next starts), and reports
//! per node and epoch the samples and bytes by tier, store reads, epoch
//! time, batch waits, CPU per sample, and the check of every delivered
//! batch against the planner. Goals from the benchmark's issue are printed
//! as met / not met; the last line is one JSON object.
//!
//! Scenarios: `b0` (no peers, a small arena: every node reads its share
//! from the store each epoch), `peers150` and `peers75` (exact mode, the
//! agents' keep areas together holding 150 % and 75 % of the dataset),
//! `peers150off` (as peers150 with `peers.encryption = "off"`: records
//! authenticated, not encrypted),
//! `kill` (as peers150, node 1's agent killed with SIGKILL half-way through
//! epoch 1 and restarted `--restart-ms` later), `corrupt` (as peers150, one
//! block record in `--corrupt-every` changed on the wire by a proxy in
//! front of every peer listener: the channel rejects the changed record
//! and closes the connection), `slow` (as peers150, the last node's
//! link at `--slow-mbit`), `locality` (as peers150 with every rank in the
//! locality-aware assignment, agreed by the job before each epoch; each
//! agent's arena proportional to its ranks, so that ownership follows the
//! quotas), `relaunch` (as peers150 with views handed in by the job
//! (`membership = "session"`): after epoch 0 the last node is lost (agent
//! and loader killed) and the job goes on from the next epoch on the
//! others, with a new view).
//!
//! Every epoch is checked job-wide: per global step, the multiset of the
//! samples all ranks received equals the planner's step (a multiset hash
//! per step, summed over the nodes).
//!
//! `--smoke`: two nodes, 2,048 samples, `peers150` and `locality`,
//! asserting the invariants (nothing lost or duplicated, every global step
//! the planner's, every byte right, store reads bound, locality order in
//! every epoch of `locality`); exit status 1 when one fails.
//!
//! Needs root, iproute2 and SeaweedFS's `weed`. `--cleanup` removes what a
//! run killed with SIGKILL left behind.

use granary_bench::cli::Args;
use granary_bench::cluster_node::{self, parse_line, NodeArgs, DATASET};
use granary_bench::cluster_store::{self, StoreArgs};
use granary_bench::corrupt_proxy::Corrupt;
use granary_bench::data::data_root;
use granary_bench::netns::{self, Net, NetSpec};
use granary_bench::report::{percentile, Json};
use granary_bench::seaweed::{ACCESS_KEY, BUCKET, REGION, SECRET_KEY};
use granary_bench::sys;
use granary_tools::synth::{self, SynthSpec};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

const PREFIX: &str = "gcl";
const PEER_PORT: u16 = 7170;
const PROXY_PORT: u16 = 7171;
const STORE_PORT: u16 = 9000;
const METRICS: &str = "127.0.0.1:9100";
const SECRET: &str = "8159dcb5e0454eb92e9adeff3647662612ceeb706beb34aa1581c73752f8af65";
/// The longest one epoch may take before the run is abandoned.
const EPOCH_LIMIT: Duration = Duration::from_secs(1200);

const USAGE: &str = "usage: bench/run cluster [options]   (as root)
  --samples N        samples in the dataset (default 4096; the issue's size is 16384)
  --mean-kib K       mean sample size in KiB (default 64)
  --sigma S          log-normal sigma of the sizes (default 0: all the same size;
                     the issue's variant: --mean-kib 107 --sigma 0.5)
  --epochs E         epochs per scenario (default 3)
  --batch B          batch size per rank (default 32)
  --nodes N          node namespaces (default 4; node 0 runs two ranks)
  --node-mbit M      each node's link, each way (default 1000)
  --store-mbit M     the store's link, each way (default 200)
  --rtt-ms R         round trip added by the delay proxy in front of the store (default 50)
  --slow-mbit M      the slowed node's link in `slow` (default 10)
  --hedge-ms H       peers.hedge_after_ms of every agent (default 2000, the agent's)
  --keep-percent P   peers.keep_percent of every agent (default 50)
  --b0-arena-mib A   arena of each agent in b0 (default 64, the smallest allowed)
  --corrupt-every K  one peer block in K corrupted in `corrupt` (default 10000)
  --restart-ms T     time between the kill and the restart in `kill` (default 1000)
  --scenarios LIST   comma-separated, from b0,peers150,peers150off,peers75,locality,kill,relaunch,corrupt,slow
                     (default all)
  --out DIR          logs, timeline.csv and the plot (default bench/.data/cluster)
  --plot PNG         where the plot goes (default OUT/cluster.png; `-` for none)
  --smoke            two nodes, 2048 samples, peers150 and locality; exit 1 if an invariant fails
  --cleanup          remove namespaces and links left by a killed run, then exit";

/// One scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    B0,
    Peers150,
    Peers75,
    Kill,
    Corrupt,
    Slow,
    Locality,
    Relaunch,
    /// `peers150` with `peers.encryption = "off"`: what the channel's
    /// encryption costs.
    Peers150Off,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::B0,
        Kind::Peers150,
        Kind::Peers150Off,
        Kind::Peers75,
        Kind::Locality,
        Kind::Kill,
        Kind::Relaunch,
        Kind::Corrupt,
        Kind::Slow,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::B0 => "b0",
            Kind::Peers150 => "peers150",
            Kind::Peers75 => "peers75",
            Kind::Kill => "kill",
            Kind::Corrupt => "corrupt",
            Kind::Slow => "slow",
            Kind::Locality => "locality",
            Kind::Relaunch => "relaunch",
            Kind::Peers150Off => "peers150off",
        }
    }

    fn parse(s: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown scenario {s:?}\n{USAGE}"))
    }

    /// Percent of the dataset the keep areas hold together (0: no peers).
    fn keep_pct(self) -> u64 {
        match self {
            Kind::B0 => 0,
            Kind::Peers75 => 75,
            _ => 150,
        }
    }
}

struct Opts {
    samples: u64,
    mean: u64,
    sigma: f64,
    epochs: u32,
    batch: u32,
    nodes: usize,
    node_mbit: u32,
    store_mbit: u32,
    rtt_ms: u64,
    slow_mbit: u32,
    hedge_ms: u64,
    keep_percent: u64,
    b0_arena_mib: u64,
    corrupt_every: u64,
    restart_ms: u64,
    scenarios: Vec<Kind>,
    out: PathBuf,
    plot: Option<PathBuf>,
    smoke: bool,
}

impl Opts {
    fn parse(a: &Args) -> Result<Opts> {
        let smoke = a.flag("smoke");
        let sigma: f64 = a
            .string("sigma", "0")
            .parse()
            .map_err(|_| "--sigma: not a number".to_owned())?;
        let out =
            PathBuf::from(a.string("out", &data_root().join("cluster").display().to_string()));
        let plot = match a.string("plot", "").as_str() {
            "-" => None,
            "" if smoke => None,
            "" => Some(out.join("cluster.png")),
            p => Some(PathBuf::from(p)),
        };
        let scenarios = if smoke {
            vec![Kind::Peers150, Kind::Locality]
        } else {
            a.string(
                "scenarios",
                "b0,peers150,peers150off,peers75,locality,kill,relaunch,corrupt,slow",
            )
            .split(',')
            .filter(|s| !s.is_empty())
            .map(Kind::parse)
            .collect::<Result<Vec<_>>>()?
        };
        let o = Opts {
            samples: a.u64("samples", if smoke { 2048 } else { 4096 })?,
            mean: a.u64("mean-kib", 64)? * 1024,
            sigma,
            epochs: a.u32("epochs", 3)?,
            batch: a.u32("batch", 32)?,
            nodes: a.u64("nodes", if smoke { 2 } else { 4 })? as usize,
            node_mbit: a.u32("node-mbit", 1000)?,
            store_mbit: a.u32("store-mbit", 200)?,
            rtt_ms: a.u64("rtt-ms", 50)?,
            slow_mbit: a.u32("slow-mbit", 10)?,
            hedge_ms: a.u64("hedge-ms", 2000)?,
            keep_percent: a.u64("keep-percent", 50)?,
            b0_arena_mib: a.u64("b0-arena-mib", 64)?,
            corrupt_every: a.u64("corrupt-every", 10_000)?,
            restart_ms: a.u64("restart-ms", 1000)?,
            scenarios,
            out,
            plot,
            smoke,
        };
        if o.nodes < 2 || o.nodes > 16 {
            return Err("--nodes must be 2 to 16".into());
        }
        if o.epochs < 2 {
            return Err("--epochs must be at least 2".into());
        }
        if o.samples == 0 || o.batch == 0 || o.corrupt_every == 0 {
            return Err("--samples, --batch and --corrupt-every must be positive".into());
        }
        if !(1..=90).contains(&o.keep_percent) {
            return Err("--keep-percent must be 1 to 90".into());
        }
        Ok(o)
    }

    /// Ranks of node `k`: node 0 runs two.
    fn ranks(&self, k: usize) -> Vec<u32> {
        if k == 0 {
            vec![0, 1]
        } else {
            vec![k as u32 + 1]
        }
    }

    fn world(&self) -> u32 {
        self.nodes as u32 + 1
    }

    fn spec(&self) -> SynthSpec {
        let root = data_root().join(format!(
            "cluster-{}x{}-s{}",
            self.samples, self.mean, self.sigma
        ));
        let mut s = SynthSpec::new(root);
        s.num_files = self.samples;
        s.mean_size = self.mean;
        s.sigma = self.sigma;
        s.num_classes = 100.min(self.samples as u32);
        s
    }
}

// ---------------------------------------------------------------- roles

fn spec_of(a: &Args) -> Result<SynthSpec> {
    let mut s = SynthSpec::new(a.string("data-root", ""));
    s.num_files = a.u64("samples", 0)?;
    s.mean_size = a.u64("mean", 0)?;
    s.sigma = a
        .string("sigma", "0")
        .parse()
        .map_err(|_| "--sigma: not a number".to_owned())?;
    s.num_classes = a.u32("classes", 1)?;
    Ok(s)
}

fn addr(a: &Args, name: &str) -> Result<SocketAddr> {
    a.string(name, "")
        .parse()
        .map_err(|_| format!("--{name}: not IP:PORT"))
}

fn run_role(role: &str, rest: Vec<String>) -> Result<()> {
    let a = Args::parse(rest, &[], "an internal role of bench/run cluster")?;
    match role {
        "store" => cluster_store::run(StoreArgs {
            spec: spec_of(&a)?,
            prefix: a.string("prefix", "cluster"),
            listen: addr(&a, "listen")?,
            delay: Duration::from_micros(a.u64("delay-us", 0)?),
        }),
        "node" => {
            let ranks = a
                .list("ranks", &[])?
                .into_iter()
                .map(|r| r as u32)
                .collect();
            let proxy = if a.string("proxy-listen", "").is_empty() {
                None
            } else {
                Some((
                    addr(&a, "proxy-listen")?,
                    addr(&a, "proxy-upstream")?,
                    Corrupt::Every {
                        every: a.u64("corrupt-every", 10_000)?,
                        first: a.u64("corrupt-first", 0)?,
                    },
                ))
            };
            cluster_node::run(NodeArgs {
                sock: PathBuf::from(a.string("sock", "")),
                metrics: addr(&a, "metrics")?,
                ranks,
                world: a.u32("world", 1)?,
                batch: a.u32("batch", 1)?,
                seed: a.u64("seed", 0)?,
                spec: spec_of(&a)?,
                proxy,
                mark: if a.string("mark-batches", "").is_empty() {
                    None
                } else {
                    Some((a.u32("mark-epoch", 1)?, a.u64("mark-batches", 0)?))
                },
                probe: if a.string("probe", "").is_empty() {
                    None
                } else {
                    Some(addr(&a, "probe")?)
                },
                layout: a
                    .list("layout", &[])?
                    .into_iter()
                    .map(|v| v as u32)
                    .collect(),
                nodes: a.u32("nodes", 0)?,
                view: match a.string("view", "").as_str() {
                    "" => None,
                    p => Some(std::fs::read(p).map_err(|e| format!("--view {p}: {e}"))?),
                },
            })
        }
        _ => Err(format!("unknown role {role:?}")),
    }
}

// ---------------------------------------------------------------- processes

/// A child process speaking the line protocol.
struct Proc {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: PathBuf,
}

fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let start = s.len().saturating_sub(3000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            name: name.into(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
            log,
        })
    }

    fn send(&mut self, cmd: &str) -> Result<()> {
        let w = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(w, "{cmd}")
            .and_then(|()| w.flush())
            .map_err(|e| format!("{}: {e}\n{}", self.name, log_tail(&self.log)))
    }

    /// The next line, waiting up to `limit`; an error when the process
    /// ended (with its log's tail).
    fn next(&mut self, limit: Duration) -> Result<Option<String>> {
        match self.lines.recv_timeout(limit) {
            Ok(l) => Ok(Some(l)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.died()),
        }
    }

    fn try_next(&mut self) -> Result<Option<String>> {
        match self.lines.try_recv() {
            Ok(l) => Ok(Some(l)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.died()),
        }
    }

    fn died(&mut self) -> String {
        let st = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        format!("{} ended ({st}); log:\n{}", self.name, log_tail(&self.log))
    }

    /// Waits for a line starting with `verb` (other lines are dropped).
    fn expect(&mut self, verb: &str, limit: Duration) -> Result<BTreeMap<String, String>> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(l) = self.next(Duration::from_millis(200))? {
                let (v, kv) = parse_line(&l);
                if v == verb {
                    return Ok(kv);
                }
            }
        }
        Err(format!(
            "{}: no `{verb}` within {limit:?}; log:\n{}",
            self.name,
            log_tail(&self.log)
        ))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn finish(mut self) {
        self.stdin = None;
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) of process `pid` so far; 0 when gone.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    // Fields after the command: state is field 3; utime 14, stime 15.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// One node's `granaryd`.
struct AgentProc {
    name: String,
    ns: String,
    bin: PathBuf,
    config: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// CPU seconds of incarnations already killed.
    cpu_before: f64,
}

impl AgentProc {
    fn start(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Net::exec(&self.ns, &self.bin)
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if granary::Client::connect(&self.sock).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{} exited with {st}:\n{}",
                    self.name,
                    log_tail(&self.log)
                ));
            }
            if Instant::now() > end {
                return Err(format!(
                    "{} did not open its socket in 60 s:\n{}",
                    self.name,
                    log_tail(&self.log)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn cpu(&self) -> f64 {
        self.cpu_before + self.child.as_ref().map_or(0.0, |c| cpu_secs(c.id()))
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.cpu_before += cpu_secs(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for AgentProc {
    /// Kills the agent and removes its warm-restart files (its arena,
    /// index and journal in /dev/shm): the next scenario starts cold.
    fn drop(&mut self) {
        self.kill9();
        granary_agent::warm::Files::for_socket(&self.sock).remove();
    }
}

// ---------------------------------------------------------------- results

/// One node in one epoch.
#[derive(Clone, Debug, Default)]
struct NodeEpoch {
    samples: u64,
    bytes: u64,
    secs: f64,
    lost: u64,
    dup: u64,
    bad: u64,
    replayed: u64,
    reopens: u64,
    waits_us: Vec<u64>,
    errors: Vec<String>,
    /// Why the node's ranks reopened their sessions.
    reasons: Vec<String>,
    /// Counter deltas over the epoch ([`cluster_node::SERIES`]).
    m: BTreeMap<String, f64>,
    /// Per batch index, the multiset hash of what the node's ranks got.
    steps: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
struct EpochResult {
    secs: f64,
    nodes: Vec<NodeEpoch>,
    /// Whether the epoch ran in the locality-aware assignment.
    locality: bool,
    /// Global steps of the epoch, and how many differ from the planner's.
    steps: u64,
    step_mismatch: u64,
}

impl EpochResult {
    fn total(&self, key: &str) -> f64 {
        self.nodes
            .iter()
            .map(|n| n.m.get(key).copied().unwrap_or(0.0))
            .sum()
    }
    fn samples(&self) -> u64 {
        self.nodes.iter().map(|n| n.samples).sum()
    }
    /// Of the samples the sessions planned, the share kept by another node
    /// than the one processing them (moved by the assignment).
    fn moved_frac(&self) -> f64 {
        self.total("moved") / self.total("assigned").max(1.0)
    }
    fn waits(&self) -> Vec<u64> {
        let mut w: Vec<u64> = self.nodes.iter().flat_map(|n| n.waits_us.clone()).collect();
        w.sort_unstable();
        w
    }
    fn broken(&self) -> (u64, u64, u64, usize) {
        let s = |f: fn(&NodeEpoch) -> u64| self.nodes.iter().map(f).sum::<u64>();
        (
            s(|n| n.lost),
            s(|n| n.dup),
            s(|n| n.bad),
            self.nodes.iter().map(|n| n.errors.len()).sum(),
        )
    }
}

/// One point of the timeline: seconds since the scenario began, node,
/// cumulative counters.
#[derive(Clone, Debug)]
struct Point {
    t: f64,
    node: usize,
    arena: f64,
    peer: f64,
    store: f64,
    reads: f64,
}

struct ScenarioResult {
    kind: Kind,
    arena_mib: u64,
    epochs: Vec<EpochResult>,
    agent_cpu: Vec<f64>,
    loader_cpu: Vec<f64>,
    store_cpu: f64,
    corrupted: u64,
    proxied_blocks: u64,
    /// From the kill to the restarted agent's socket answering.
    restart_secs: Option<f64>,
    timeline: Vec<Point>,
    /// Epoch start times (seconds since the scenario began).
    marks: Vec<f64>,
}

impl ScenarioResult {
    fn node_samples(&self, k: usize) -> u64 {
        self.epochs.iter().map(|e| e.nodes[k].samples).sum()
    }
    /// samples/s over epochs `from..`.
    fn rate_from(&self, from: usize) -> f64 {
        let e = &self.epochs[from.min(self.epochs.len())..];
        let s: u64 = e.iter().map(EpochResult::samples).sum();
        let t: f64 = e.iter().map(|x| x.secs).sum();
        s as f64 / t
    }
    /// The p99 batch wait (ms) of the consumers on `nodes`, all epochs.
    fn p99_ms_of(&self, nodes: &[usize]) -> f64 {
        let mut w: Vec<u64> = self
            .epochs
            .iter()
            .flat_map(|e| nodes.iter().flat_map(|&k| e.nodes[k].waits_us.clone()))
            .collect();
        w.sort_unstable();
        percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3
    }
    fn max_wait_ms(&self, epoch: usize) -> f64 {
        self.epochs[epoch].waits().last().copied().unwrap_or(0) as f64 / 1e3
    }
    fn broken(&self) -> (u64, u64, u64, usize) {
        self.epochs
            .iter()
            .map(EpochResult::broken)
            .fold((0, 0, 0, 0), |a, b| {
                (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3)
            })
    }
}

/// Counters made monotone across agent restarts: a value lower than the
/// last one seen means a new incarnation, whose counts add to the old.
#[derive(Default)]
struct Monotone {
    base: BTreeMap<String, f64>,
    last: BTreeMap<String, f64>,
}

impl Monotone {
    fn feed(&mut self, kv: &BTreeMap<String, String>) -> Option<BTreeMap<String, f64>> {
        if kv.get("up").map(String::as_str) != Some("1") {
            return None;
        }
        let mut out = BTreeMap::new();
        for (short, _, _) in cluster_node::SERIES {
            let v: f64 = kv.get(*short).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let last = self.last.entry((*short).into()).or_insert(0.0);
            let base = self.base.entry((*short).into()).or_insert(0.0);
            if v < *last {
                *base += *last;
            }
            *last = v;
            out.insert((*short).into(), *base + v);
        }
        Some(out)
    }
}

// ---------------------------------------------------------------- scenario

struct Env {
    net: Net,
    spec: SynthSpec,
    dataset_bytes: u64,
    work: PathBuf,
    granaryd: PathBuf,
    me: PathBuf,
}

fn agent_toml(o: &Opts, kind: Kind, k: usize, arena_mib: u64, sock: &Path) -> String {
    let ip = netns::node_ip(k);
    let mut t = format!(
        r#"[arena]
size = "{arena_mib}MiB"
hugepages = "off"
populate = false
[socket]
path = "{sock}"
[prefetch]
max_inflight_reads = 64
window_batches = 4
initial_window = 2
read_retries = 3
retry_backoff_ms = 50
[metrics]
address = "{METRICS}"
"#,
        sock = sock.display()
    );
    if kind.keep_pct() > 0 {
        let port = if kind == Kind::Corrupt {
            PROXY_PORT
        } else {
            PEER_PORT
        };
        let members: Vec<String> = (0..o.nodes)
            .map(|n| {
                format!(
                    "{{ id = \"n{n}\", addr = \"{}:{port}\" }}",
                    netns::node_ip(n)
                )
            })
            .collect();
        let membership = if matches!(kind, Kind::Relaunch | Kind::Locality) {
            // The job hands its view in (with every agent's own keep bytes;
            // after the loss in `relaunch`, a new one).
            "membership = \"session\"\n".to_string()
        } else {
            format!(
                "membership = \"static\"\njob_id = \"{}\"\nmembers = [{}]\n",
                kind.name(),
                members.join(", ")
            )
        };
        let _ = write!(
            t,
            r#"[peers]
{membership}node_id = "n{k}"
listen = "{ip}:{PEER_PORT}"
secret = "{SECRET}"
keep_percent = {kp}
hedge_after_ms = {hedge}
encryption = "{enc}"
"#,
            kp = o.keep_percent,
            hedge = o.hedge_ms,
            enc = if kind == Kind::Peers150Off {
                "off"
            } else {
                "on"
            },
        );
    }
    let _ = write!(
        t,
        r#"[[dataset]]
name = "{DATASET}"
kind = "s3"
endpoint = "http://{store}:{STORE_PORT}"
allow_http = true
region = "{REGION}"
bucket = "{BUCKET}"
prefix = "cluster"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
"#,
        store = netns::store_ip(),
    );
    t
}

/// The arena of each agent in MiB: the keep areas together hold
/// `keep_pct` % of the dataset (rounded up), or the b0 arena.
fn arena_mib(o: &Opts, env: &Env, kind: Kind) -> u64 {
    if kind.keep_pct() == 0 {
        return o.b0_arena_mib.div_ceil(2) * 2;
    }
    let keep_node = env.dataset_bytes * kind.keep_pct() / 100 / o.nodes as u64;
    let arena = keep_node * 100 / o.keep_percent;
    // Arenas are whole 2 MiB pages.
    arena.div_ceil(2 << 20) * 2
}

/// Node `k`'s arena in MiB: `arena` everywhere, but in `locality` the
/// same total split in proportion to the node's ranks (a node's share of
/// the keep areas, hence of ownership, then matches its share of every
/// step).
fn node_arena(o: &Opts, kind: Kind, arena: u64, k: usize) -> u64 {
    if kind != Kind::Locality {
        return arena;
    }
    let total = arena * o.nodes as u64;
    let mine = total * o.ranks(k).len() as u64 / u64::from(o.world());
    mine.div_ceil(2) * 2
}

/// The view index of node `k`: members are sorted by node id (`n0`,
/// `n1`, … as strings).
fn view_index(o: &Opts, k: usize) -> u32 {
    let mut ids: Vec<String> = (0..o.nodes).map(|n| format!("n{n}")).collect();
    ids.sort();
    ids.iter()
        .position(|id| *id == format!("n{k}"))
        .unwrap_or(0) as u32
}

/// Every rank's view index, in rank order.
fn layout(o: &Opts) -> Vec<u32> {
    let mut node_of = vec![0u32; o.world() as usize];
    for k in 0..o.nodes {
        for r in o.ranks(k) {
            node_of[r as usize] = view_index(o, k);
        }
    }
    node_of
}

/// Per global step of `epoch` with `world` ranks, the planner's multiset
/// hash (the sum of every rank's batch's terms).
fn planned_steps(o: &Opts, world: u32, epoch: u32) -> Vec<u64> {
    let mut steps: Vec<u64> = Vec::new();
    for rank in 0..world {
        let p = granary_agent::planner::PlanParams {
            num_samples: o.samples,
            seed: 1,
            rank,
            world_size: world,
            batch_size: o.batch,
            drop_last: false,
        };
        let Ok(plan) = granary_agent::planner::EpochPlan::new(&p, epoch) else {
            continue;
        };
        for (k, b) in plan.batches().enumerate() {
            if steps.len() <= k {
                steps.resize(k + 1, 0);
            }
            let h = b
                .iter()
                .fold(0u64, |h, &id| h.wrapping_add(cluster_node::step_term(id)));
            steps[k] = steps[k].wrapping_add(h);
        }
    }
    steps
}

/// The moved fraction the assignment gives on average over 2,000 steps
/// whose samples are each held by a uniformly random node, for ranks on
/// `node_of_rank` and batches of `b`.
fn predicted_moved(nodes: u32, node_of_rank: &[u32], b: u32) -> f64 {
    let Ok(layout) = granary_peer::assign::Layout::new(nodes, node_of_rank.to_vec()) else {
        return 0.0;
    };
    let n = node_of_rank.len() * b as usize;
    let samples: Vec<u64> = (0..n as u64).collect();
    let (mut moved, mut all) = (0u64, 0u64);
    let mut state = 0x6772_616e_6172_7931u64;
    for _ in 0..2000 {
        let holders: Vec<Option<u32>> = (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                Some((granary_peer::owner::mix64(state) % u64::from(nodes)) as u32)
            })
            .collect();
        if let Ok(a) = granary_peer::assign::assign_step(&samples, &holders, &layout, b) {
            moved += a.stats().moved;
            all += a.stats().samples;
        }
    }
    moved as f64 / all.max(1) as f64
}

/// Gathers the identities of the agents `which`, hands them the view of
/// epoch `epoch` and waits for the peers to see each other.
fn hand_view(agents: &[AgentProc], which: &[usize], job: &str, epoch: u64) -> Result<Vec<u8>> {
    let mut members = Vec::new();
    for &k in which {
        let id = granary::Client::connect(&agents[k].sock)
            .and_then(|c| c.peer_identity(Duration::from_secs(10)))
            .map_err(|e| format!("{}: peer identity: {e}", agents[k].name))?;
        members.push(granary::ViewMember {
            id: id.node_id,
            addr: id.addr,
            capacity: id.capacity,
        });
    }
    let view = granary::encode_view(job, epoch, &members).map_err(|e| format!("view: {e}"))?;
    for &k in which {
        granary::Client::connect(&agents[k].sock)
            .and_then(|c| c.join_view(&view, Duration::from_secs(10)))
            .map_err(|e| format!("{}: join view: {e}", agents[k].name))?;
    }
    // The barrier: every agent holds the view before anyone reads.
    std::thread::sleep(Duration::from_millis(500));
    Ok(view)
}

fn batches_per_epoch(o: &Opts, rank: u32) -> u64 {
    let p = granary_agent::planner::PlanParams {
        num_samples: o.samples,
        seed: 1,
        rank,
        world_size: o.world(),
        batch_size: o.batch,
        drop_last: false,
    };
    granary_agent::planner::batches_per_epoch(&p).unwrap_or(0)
}

fn run_scenario(o: &Opts, env: &Env, store_pids: &[u32], kind: Kind) -> Result<ScenarioResult> {
    let dir = env.work.join(kind.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let arena = arena_mib(o, env, kind);
    let slow_node = o.nodes - 1;
    if kind == Kind::Slow {
        env.net.set_node_rate(slow_node, o.slow_mbit)?;
    }
    let restore = |net: &Net| {
        if kind == Kind::Slow {
            let _ = net.set_node_rate(slow_node, o.node_mbit);
        }
    };
    let res = scenario_body(o, env, store_pids, kind, &dir, arena);
    restore(&env.net);
    res
}

fn scenario_body(
    o: &Opts,
    env: &Env,
    store_pids: &[u32],
    kind: Kind,
    dir: &Path,
    arena: u64,
) -> Result<ScenarioResult> {
    let p = env.net.prefix().to_owned();
    let mut agents = Vec::new();
    for k in 0..o.nodes {
        let sock = dir.join(format!("n{k}.sock"));
        let config = dir.join(format!("n{k}.toml"));
        std::fs::write(
            &config,
            agent_toml(o, kind, k, node_arena(o, kind, arena, k), &sock),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        agents.push(AgentProc {
            name: format!("granaryd n{k}"),
            ns: netns::node_ns(&p, k),
            bin: env.granaryd.clone(),
            config,
            sock,
            log: dir.join(format!("n{k}.agent.log")),
            child: None,
            cpu_before: 0.0,
        });
    }
    for a in &mut agents {
        a.start()?;
    }
    let view_file = dir.join("view.bin");
    if matches!(kind, Kind::Relaunch | Kind::Locality) {
        let all: Vec<usize> = (0..o.nodes).collect();
        let view = hand_view(&agents, &all, kind.name(), 1)?;
        std::fs::write(&view_file, view).map_err(|e| format!("{}: {e}", view_file.display()))?;
    }
    let victim = 1usize;
    let victim_half: u64 = o
        .ranks(victim)
        .iter()
        .map(|&r| batches_per_epoch(o, r))
        .sum::<u64>()
        / 2;
    let mut nodes = Vec::new();
    for (k, agent) in agents.iter().enumerate() {
        let ranks: Vec<String> = o.ranks(k).iter().map(u32::to_string).collect();
        let mut c = Net::exec(&netns::node_ns(&p, k), &env.me);
        c.args(["--role", "node"])
            .arg("--sock")
            .arg(&agent.sock)
            .args(["--metrics", METRICS, "--ranks", &ranks.join(",")])
            .args(["--world", &o.world().to_string()])
            .args(["--batch", &o.batch.to_string(), "--seed", "1"])
            .args(["--probe", &format!("{}:{STORE_PORT}", netns::store_ip())])
            .args(spec_args(&env.spec));
        if kind == Kind::Locality {
            let l: Vec<String> = layout(o).iter().map(u32::to_string).collect();
            c.args(["--layout", &l.join(",")])
                .args(["--nodes", &o.nodes.to_string()])
                .arg("--view")
                .arg(&view_file);
        }
        if kind == Kind::Kill && k == victim {
            c.args([
                "--mark-epoch",
                "1",
                "--mark-batches",
                &victim_half.to_string(),
            ]);
        }
        if kind == Kind::Corrupt {
            let ip = netns::node_ip(k);
            c.args(["--proxy-listen", &format!("{ip}:{PROXY_PORT}")])
                .args(["--proxy-upstream", &format!("{ip}:{PEER_PORT}")])
                .args(["--corrupt-every", &o.corrupt_every.to_string()])
                // The first corrupted block early, so that every proxy
                // corrupts some even in a short run.
                .args(["--corrupt-first", &(50 + 17 * k).to_string()]);
        }
        let mut node = Proc::spawn(
            &format!("loader n{k}"),
            c,
            dir.join(format!("n{k}.loader.log")),
        )?;
        node.expect("ready", Duration::from_secs(30))?;
        nodes.push(node);
    }
    let store_cpu0: f64 = store_pids.iter().map(|&p| cpu_secs(p)).sum();
    let t0 = Instant::now();
    let mut mono: Vec<Monotone> = (0..o.nodes).map(|_| Monotone::default()).collect();
    let mut prev: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); o.nodes];
    let mut timeline = Vec::new();
    let mut marks = Vec::new();
    let mut epochs = Vec::new();
    let mut restart_secs = None;
    let lost = o.nodes - 1;
    let mut active = vec![true; o.nodes];
    let mut world = o.world();
    for e in 0..o.epochs {
        if kind == Kind::Relaunch && e == 1 {
            // The last node is lost; the job goes on from the next epoch
            // on the others, with a new view (epoch 2) handed in.
            active[lost] = false;
            agents[lost].kill9();
            let survivors: Vec<usize> = (0..o.nodes).filter(|&k| active[k]).collect();
            hand_view(&agents, &survivors, "relaunch", 2)?;
            world -= o.ranks(lost).len() as u32;
            for &k in &survivors {
                nodes[k].send(&format!("world {world}"))?;
                nodes[k].expect("world", Duration::from_secs(10))?;
            }
            eprintln!(
                "  relaunch: node n{lost} lost after epoch 0; the job goes on with {world} ranks on {} nodes",
                survivors.len()
            );
        }
        let locality = if kind == Kind::Locality {
            agree_epoch(&mut nodes, &active, world, e)?
        } else {
            None
        };
        let start = Instant::now();
        marks.push(t0.elapsed().as_secs_f64());
        for (k, n) in nodes.iter_mut().enumerate() {
            if active[k] {
                match &locality {
                    Some(d) => n.send(&format!(
                        "epoch {e} locality={}",
                        cluster_node::digest_hex(d)
                    ))?,
                    None => n.send(&format!("epoch {e}"))?,
                }
            }
        }
        let mut done: Vec<Option<NodeEpoch>> = (0..o.nodes)
            .map(|k| (!active[k]).then(NodeEpoch::default))
            .collect();
        let mut killed = false;
        while done.iter().any(Option::is_none) {
            let mut idle = true;
            for k in 0..o.nodes {
                while let Some(line) = nodes[k].try_next()? {
                    idle = false;
                    let (verb, kv) = parse_line(&line);
                    match verb.as_str() {
                        "tick" => {
                            if let Some(m) = mono[k].feed(&kv) {
                                timeline.push(Point {
                                    t: t0.elapsed().as_secs_f64(),
                                    node: k,
                                    arena: m["arena"],
                                    peer: m["peer"],
                                    store: m["store"],
                                    reads: m["reads"],
                                });
                            }
                        }
                        "mark" if kind == Kind::Kill && e == 1 && k == victim && !killed => {
                            killed = true;
                            let at = Instant::now();
                            agents[victim].kill9();
                            eprintln!(
                                "  kill: granaryd n{victim} killed (SIGKILL) after {} batches of epoch 1",
                                kv.get("batches").map_or("?", String::as_str)
                            );
                            std::thread::sleep(Duration::from_millis(o.restart_ms));
                            agents[victim].start()?;
                            let s = at.elapsed().as_secs_f64();
                            eprintln!(
                                "  kill: granaryd n{victim} answering again {s:.2} s after the kill"
                            );
                            restart_secs = Some(s);
                        }
                        "done" => done[k] = Some(node_epoch(&kv)),
                        _ => {}
                    }
                }
            }
            if start.elapsed() > EPOCH_LIMIT {
                return Err(format!(
                    "{}: epoch {e} did not finish in {EPOCH_LIMIT:?}",
                    kind.name()
                ));
            }
            if idle {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let mut res = EpochResult {
            secs,
            nodes: done.into_iter().map(Option::unwrap_or_default).collect(),
            locality: locality.is_some(),
            ..EpochResult::default()
        };
        let want = planned_steps(o, world, e);
        let mut got = vec![0u64; want.len()];
        for ne in &res.nodes {
            if ne.steps.len() > got.len() {
                got.resize(ne.steps.len(), 0);
            }
            for (g, &h) in got.iter_mut().zip(&ne.steps) {
                *g = g.wrapping_add(h);
            }
        }
        res.steps = want.len() as u64;
        res.step_mismatch = (0..got.len().max(want.len()))
            .filter(|&i| got.get(i) != want.get(i))
            .count() as u64;
        for k in 0..o.nodes {
            if !active[k] {
                continue;
            }
            nodes[k].send("scrape")?;
            let kv = nodes[k].expect("scraped", Duration::from_secs(10))?;
            let now = mono[k].feed(&kv).unwrap_or_else(|| prev[k].clone());
            res.nodes[k].m = now
                .iter()
                .map(|(key, v)| (key.clone(), v - prev[k].get(key).copied().unwrap_or(0.0)))
                .collect();
            prev[k] = now;
        }
        eprintln!(
            "  {} epoch {e}: {:.1} s, {} samples, store reads {:.0}, steps differing from the planner {} of {}",
            kind.name(),
            secs,
            res.samples(),
            res.total("reads"),
            res.step_mismatch,
            res.steps
        );
        epochs.push(res);
    }
    let agent_cpu: Vec<f64> = agents.iter().map(AgentProc::cpu).collect();
    let loader_cpu: Vec<f64> = nodes.iter().map(|n| cpu_secs(n.pid())).collect();
    let store_cpu = store_pids.iter().map(|&p| cpu_secs(p)).sum::<f64>() - store_cpu0;
    let (mut corrupted, mut proxied_blocks) = (0, 0);
    for n in &mut nodes {
        n.send("quit")?;
        let kv = n.expect("final", Duration::from_secs(10))?;
        corrupted += kv
            .get("corrupted")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        proxied_blocks += kv
            .get("blocks")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    for n in nodes {
        n.finish();
    }
    drop(agents);
    Ok(ScenarioResult {
        kind,
        arena_mib: arena,
        epochs,
        agent_cpu,
        loader_cpu,
        store_cpu,
        corrupted,
        proxied_blocks,
        restart_secs,
        timeline,
        marks,
    })
}

/// Asks every active node's ranks for the assignment of epoch `e` and
/// applies the job's rule: the agreed digest, or `None` (exact order, the
/// reason printed).
fn agree_epoch(
    nodes: &mut [Proc],
    active: &[bool],
    world: u32,
    e: u32,
) -> Result<Option<[u8; 32]>> {
    for (k, n) in nodes.iter_mut().enumerate() {
        if active[k] {
            n.send(&format!("assign {e}"))?;
        }
    }
    let mut infos: Vec<Option<granary::AssignmentInfo>> = vec![None; world as usize];
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
        let kv = n.expect("assigned", Duration::from_secs(60))?;
        for word in kv.get("infos").map_or("", String::as_str).split('|') {
            let mut parts = word.splitn(3, ':');
            let (Some(r), Some(ok), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("bad assignment answer {word:?}"));
            };
            let r: usize = r.parse().map_err(|_| format!("bad rank in {word:?}"))?;
            let info = if ok == "1" {
                granary::AssignmentInfo {
                    locality: true,
                    digest: cluster_node::parse_digest(rest)?,
                    note: String::new(),
                }
            } else {
                granary::AssignmentInfo {
                    locality: false,
                    digest: [0; 32],
                    note: rest.replace('_', " "),
                }
            };
            if let Some(slot) = infos.get_mut(r) {
                *slot = Some(info);
            }
        }
    }
    let infos: Vec<granary::AssignmentInfo> = infos
        .into_iter()
        .enumerate()
        .map(|(r, i)| {
            i.unwrap_or(granary::AssignmentInfo {
                locality: false,
                digest: [0; 32],
                note: format!("rank {r} did not answer"),
            })
        })
        .collect();
    match granary::agree(&infos) {
        granary::Agreement::Locality(d) => Ok(Some(d)),
        granary::Agreement::Exact(why) => {
            eprintln!("  locality: epoch {e} runs in exact order: {why}");
            Ok(None)
        }
    }
}

fn node_epoch(kv: &BTreeMap<String, String>) -> NodeEpoch {
    let u = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let list = |k: &str| -> Vec<String> {
        kv.get(k)
            .filter(|v| v.as_str() != "-")
            .map(|v| v.split('|').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    NodeEpoch {
        samples: u("samples"),
        bytes: u("bytes"),
        secs: kv.get("secs").and_then(|v| v.parse().ok()).unwrap_or(0.0),
        lost: u("lost"),
        dup: u("dup"),
        bad: u("bad"),
        replayed: u("replayed"),
        reopens: u("reopens"),
        waits_us: kv
            .get("waits")
            .filter(|v| v.as_str() != "-")
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default(),
        errors: list("errors"),
        reasons: list("reasons"),
        m: BTreeMap::new(),
        steps: kv
            .get("steps")
            .filter(|v| v.as_str() != "-")
            .map(|v| {
                v.split(',')
                    .filter_map(|x| u64::from_str_radix(x, 16).ok())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn spec_args(s: &SynthSpec) -> Vec<String> {
    vec![
        "--data-root".into(),
        s.root.display().to_string(),
        "--samples".into(),
        s.num_files.to_string(),
        "--mean".into(),
        s.mean_size.to_string(),
        "--sigma".into(),
        s.sigma.to_string(),
        "--classes".into(),
        s.num_classes.to_string(),
    ]
}

// ---------------------------------------------------------------- report

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn print_scenario(o: &Opts, r: &ScenarioResult) {
    let n = o.samples as f64;
    println!(
        "\n== {} (arena {} MiB per agent{})",
        r.kind.name(),
        r.arena_mib,
        if r.kind.keep_pct() > 0 {
            format!(
                ", keep areas together {} % of the dataset",
                r.kind.keep_pct()
            )
        } else {
            ", no peers".into()
        }
    );
    println!(
        "{:>5} {:>4} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>7} {:>8} {:>8} {:>8} {:>9}",
        "epoch",
        "node",
        "samples",
        "local",
        "peer",
        "reads",
        "MB peer",
        "MB store",
        "secs",
        "p50 ms",
        "p99 ms",
        "served",
        "lost/dup"
    );
    for (e, ep) in r.epochs.iter().enumerate() {
        for (k, ne) in ep.nodes.iter().enumerate() {
            let g = |key: &str| ne.m.get(key).copied().unwrap_or(0.0);
            let mut w = ne.waits_us.clone();
            w.sort_unstable();
            println!(
                "{:>5} {:>4} {:>7} {:>7.0} {:>7.0} {:>7.0} {:>9.1} {:>9.1} {:>7.2} {:>8.2} {:>8.2} {:>8.0} {:>9}",
                e,
                format!("n{k}"),
                ne.samples,
                g("arena"),
                g("peer"),
                g("reads"),
                g("peer_b") / 1e6,
                g("store_b") / 1e6,
                ne.secs,
                percentile(&w, 50.0).unwrap_or(0) as f64 / 1e3,
                percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3,
                g("served"),
                format!("{}/{}", ne.lost, ne.dup),
            );
        }
        let w = ep.waits();
        let (lost, dup, bad, errs) = ep.broken();
        println!(
            "{:>5} {:>4} {:>7} {:>7.0} {:>7.0} {:>7.0}  store reads {} of the dataset, {:.2} s, {:.0} samples/s, p50 {:.2} ms, p99 {:.2} ms, lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}, CRC failures {:.0}, hedged {:.0}",
            e,
            "all",
            ep.samples(),
            ep.total("arena"),
            ep.total("peer"),
            ep.total("reads"),
            pct(ep.total("reads") / n),
            ep.secs,
            ep.samples() as f64 / ep.secs,
            percentile(&w, 50.0).unwrap_or(0) as f64 / 1e3,
            percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3,
            ep.total("crc"),
            ep.total("hedged"),
        );
        println!(
            "{:>5} {:>4}  {} order; global steps differing from the planner: {} of {}; assigned samples kept on another node: {}",
            e,
            "job",
            if ep.locality { "locality-aware" } else { "exact" },
            ep.step_mismatch,
            ep.steps,
            pct(ep.moved_frac()),
        );
        for ne in &ep.nodes {
            for err in &ne.errors {
                println!("      error: {err}");
            }
            for why in &ne.reasons {
                println!("      session reopened: {}", why.replace('_', " "));
            }
        }
    }
    let total: u64 = r.epochs.iter().map(EpochResult::samples).sum();
    let cpu: Vec<String> = (0..o.nodes)
        .map(|k| {
            let s = r.node_samples(k).max(1) as f64;
            format!(
                "n{k}: granaryd {:.0} µs, loader {:.0} µs",
                r.agent_cpu[k] / s * 1e6,
                r.loader_cpu[k] / s * 1e6
            )
        })
        .collect();
    println!(
        "  CPU per delivered sample: {}; store (SeaweedFS + delay proxy) {:.0} µs",
        cpu.join("; "),
        r.store_cpu / total.max(1) as f64 * 1e6
    );
    if r.kind == Kind::Corrupt {
        println!(
            "  corrupting proxies: {} blocks forwarded, {} corrupted",
            r.proxied_blocks, r.corrupted
        );
    }
    if let Some(s) = r.restart_secs {
        println!("  kill: the agent answered again {s:.2} s after the kill");
    }
}

fn scenario_json(o: &Opts, r: &ScenarioResult) -> String {
    let n = o.samples as f64;
    let mut j = Json::default();
    j.int("arena_mib", r.arena_mib)
        .int("keep_pct_of_dataset", r.kind.keep_pct());
    let per = |f: &dyn Fn(&EpochResult) -> f64| -> Vec<f64> { r.epochs.iter().map(f).collect() };
    j.nums("epoch_secs", &per(&|e| e.secs), 3)
        .nums("samples_per_s", &per(&|e| e.samples() as f64 / e.secs), 1)
        .nums("samples", &per(&|e| e.samples() as f64), 0)
        .nums("store_reads_frac", &per(&|e| e.total("reads") / n), 4)
        .nums("tier_local", &per(&|e| e.total("arena")), 0)
        .nums("tier_peer", &per(&|e| e.total("peer")), 0)
        .nums("tier_store", &per(&|e| e.total("store")), 0)
        .nums("bytes_peer", &per(&|e| e.total("peer_b")), 0)
        .nums("bytes_store", &per(&|e| e.total("store_b")), 0)
        .nums(
            "p50_wait_ms",
            &per(&|e| percentile(&e.waits(), 50.0).unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums(
            "p99_wait_ms",
            &per(&|e| percentile(&e.waits(), 99.0).unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums(
            "max_wait_ms",
            &per(&|e| e.waits().last().copied().unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums("crc_failures", &per(&|e| e.total("crc")), 0)
        .nums("hedged", &per(&|e| e.total("hedged")), 0)
        .nums("locality", &per(&|e| f64::from(u8::from(e.locality))), 0)
        .nums("moved_frac", &per(&EpochResult::moved_frac), 4)
        .nums("steps_differing", &per(&|e| e.step_mismatch as f64), 0);
    let nodes: Vec<String> = (0..o.nodes)
        .map(|k| {
            let mut nj = Json::default();
            let per = |f: &dyn Fn(&NodeEpoch) -> f64| -> Vec<f64> {
                r.epochs.iter().map(|e| f(&e.nodes[k])).collect()
            };
            let g = |key: &'static str| move |ne: &NodeEpoch| ne.m.get(key).copied().unwrap_or(0.0);
            let s = r.node_samples(k).max(1) as f64;
            nj.nums("samples", &per(&|ne| ne.samples as f64), 0)
                .nums("bytes", &per(&|ne| ne.bytes as f64), 0)
                .nums("reopens", &per(&|ne| ne.reopens as f64), 0)
                .nums("local", &per(&g("arena")), 0)
                .nums("peer", &per(&g("peer")), 0)
                .nums("store", &per(&g("store")), 0)
                .nums("store_reads", &per(&g("reads")), 0)
                .nums("bytes_peer", &per(&g("peer_b")), 0)
                .nums("bytes_store", &per(&g("store_b")), 0)
                .nums("secs", &per(&|ne| ne.secs), 3)
                .nums(
                    "p50_wait_ms",
                    &per(&|ne| {
                        let mut w = ne.waits_us.clone();
                        w.sort_unstable();
                        percentile(&w, 50.0).unwrap_or(0) as f64 / 1e3
                    }),
                    3,
                )
                .nums(
                    "p99_wait_ms",
                    &per(&|ne| {
                        let mut w = ne.waits_us.clone();
                        w.sort_unstable();
                        percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3
                    }),
                    3,
                )
                .nums("lost", &per(&|ne| ne.lost as f64), 0)
                .nums("duplicated", &per(&|ne| ne.dup as f64), 0)
                .nums("bad_bytes", &per(&|ne| ne.bad as f64), 0)
                .nums("replayed_batches", &per(&|ne| ne.replayed as f64), 0)
                .num("agent_cpu_us_per_sample", r.agent_cpu[k] / s * 1e6, 1)
                .num("loader_cpu_us_per_sample", r.loader_cpu[k] / s * 1e6, 1);
            nj.line()
        })
        .collect();
    j.raw("nodes", &format!("[{}]", nodes.join(",")));
    let total: u64 = r.epochs.iter().map(EpochResult::samples).sum();
    j.num(
        "store_cpu_us_per_sample",
        r.store_cpu / total.max(1) as f64 * 1e6,
        1,
    );
    let (lost, dup, bad, errs) = r.broken();
    j.int("lost", lost)
        .int("duplicated", dup)
        .int("bad_bytes", bad)
        .int("errors", errs as u64);
    if r.kind == Kind::Corrupt {
        j.int("blocks_corrupted", r.corrupted)
            .int("blocks_proxied", r.proxied_blocks);
    }
    if let Some(s) = r.restart_secs {
        j.num("restart_secs", s, 3);
    }
    j.line()
}

/// A goal's verdict.
struct Goal {
    goal: &'static str,
    verdict: &'static str,
    detail: String,
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

fn goals(o: &Opts, rs: &[ScenarioResult]) -> Vec<Goal> {
    let n = o.samples as f64;
    let get = |k: Kind| rs.iter().find(|r| r.kind == k);
    let mut g = Vec::new();
    let not_run = |goal: &'static str, what: &str| Goal {
        goal,
        verdict: "not run",
        detail: format!("scenario {what} was not run"),
    };
    const G1: &str = "store reads after epoch 0 <= 1 % of samples, arenas 150 %";
    match get(Kind::Peers150) {
        Some(r) => {
            let worst = r.epochs[1..]
                .iter()
                .map(|e| e.total("reads") / n)
                .fold(0.0, f64::max);
            g.push(Goal {
                goal: G1,
                verdict: met(worst <= 0.01),
                detail: format!(
                    "peers150: worst epoch >= 1 read {} of the dataset",
                    pct(worst)
                ),
            });
        }
        None => g.push(not_run(G1, "peers150")),
    }
    const G2: &str = "store reads after epoch 0 <= uncached share + 2 points, arenas 75 %";
    match get(Kind::Peers75) {
        Some(r) => {
            let worst = r.epochs[1..]
                .iter()
                .map(|e| e.total("reads") / n)
                .fold(0.0, f64::max);
            g.push(Goal {
                goal: G2,
                verdict: met(worst <= 0.25 + 0.02),
                detail: format!(
                    "peers75: worst epoch >= 1 read {} of the dataset; uncached share 25 % (keep areas hold 75 %)",
                    pct(worst)
                ),
            });
        }
        None => g.push(not_run(G2, "peers75")),
    }
    const G3: &str = "epoch 0 store reads <= 1.01 x the dataset";
    let firsts: Vec<(Kind, f64)> = rs
        .iter()
        .filter(|r| matches!(r.kind, Kind::Peers150 | Kind::Peers150Off | Kind::Peers75))
        .map(|r| (r.kind, r.epochs[0].total("reads") / n))
        .collect();
    if firsts.is_empty() {
        g.push(not_run(G3, "peers150/peers75"));
    } else {
        g.push(Goal {
            goal: G3,
            verdict: met(firsts.iter().all(|(_, f)| *f <= 1.01)),
            detail: firsts
                .iter()
                .map(|(k, f)| format!("{}: {f:.4} x", k.name()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    const G4: &str = "locality mode: samples moved within 1 point of the assignment's prediction for this layout";
    match get(Kind::Locality) {
        Some(r) => {
            let p = o.nodes as f64;
            let law = 0.40 * ((p - 1.0) / p).sqrt() / f64::from(o.batch).sqrt();
            let (moved, all) = r.epochs.iter().fold((0.0, 0.0), |a, e| {
                (a.0 + e.total("moved"), a.1 + e.total("assigned"))
            });
            let got = moved / all.max(1.0);
            let every = r.epochs.iter().all(|e| e.locality);
            let uniform: Vec<u32> = (0..o.nodes as u32).collect();
            let predicted = predicted_moved(o.nodes as u32, &layout(o), o.batch);
            g.push(Goal {
                goal: G4,
                verdict: met(every && (got - predicted).abs() <= 0.01),
                detail: format!(
                    "locality: {} of assigned samples moved (every epoch in locality order: {every}); the assignment \
                     predicts {} for this layout (node 0 runs {} of the {} ranks but owns 1/{} of the samples: \
                     ownership weighs nodes by capacity in 32 GiB steps, so every node here weighs the same), \
                     {} with one rank per node; the uniform law 0.40*sqrt((p-1)/p)/sqrt(b) gives {} (p = {}, b = {})",
                    pct(got),
                    pct(predicted),
                    o.ranks(0).len(),
                    o.world(),
                    o.nodes,
                    pct(predicted_moved(o.nodes as u32, &uniform, o.batch)),
                    pct(law),
                    o.nodes,
                    o.batch,
                ),
            });
        }
        None => g.push(not_run(G4, "locality")),
    }
    const G5: &str = "exact mode moves ~(p-1)/p of cached samples (taken as within 5 points)";
    match get(Kind::Peers150) {
        Some(r) => {
            // Moved: planned samples kept by another node than the one
            // processing them (the assignment's definition).
            let p = o.nodes as f64;
            let want = (p - 1.0) / p;
            let (moved, all) = r.epochs.iter().fold((0.0, 0.0), |a, e| {
                (a.0 + e.total("moved"), a.1 + e.total("assigned"))
            });
            let got = moved / all.max(1.0);
            let (peer, delivered): (f64, f64) = r.epochs[1..].iter().fold((0.0, 0.0), |a, e| {
                (a.0 + e.total("peer"), a.1 + e.samples() as f64)
            });
            g.push(Goal {
                goal: G5,
                verdict: met((got - want).abs() <= 0.05),
                detail: format!(
                    "peers150: {} of assigned samples kept on another node, (p-1)/p = {}; \
                     epochs >= 1 fetched {} of delivered samples from peers (the rest was cached locally from earlier fetches)",
                    pct(got),
                    pct(want),
                    pct(peer / delivered.max(1.0))
                ),
            });
        }
        None => g.push(not_run(G5, "peers150")),
    }
    const G6: &str = "locality and exact modes deliver the same global batch per step";
    match (get(Kind::Peers150), get(Kind::Locality)) {
        (Some(x), Some(l)) => {
            let bad = |r: &ScenarioResult| r.epochs.iter().map(|e| e.step_mismatch).sum::<u64>();
            let steps: u64 = l.epochs.iter().map(|e| e.steps).sum();
            g.push(Goal {
                goal: G6,
                verdict: met(bad(x) == 0 && bad(l) == 0 && steps > 0),
                detail: format!(
                    "global steps whose multiset differs from the planner's: exact {}, locality {} (of {steps})",
                    bad(x),
                    bad(l)
                ),
            });
        }
        _ => g.push(not_run(G6, "peers150 and locality")),
    }
    const G7: &str = "throughput >= 5x b0 when the store is the bottleneck";
    match (get(Kind::B0), get(Kind::Peers150)) {
        (Some(b), Some(p)) => {
            let x = p.rate_from(1) / b.rate_from(1);
            g.push(Goal {
                goal: G7,
                verdict: met(x >= 5.0),
                detail: format!(
                    "epochs >= 1: peers150 {:.0} samples/s, b0 {:.0} samples/s: {x:.2}x (store link {} Mbit/s, RTT {} ms); whole runs: {:.2}x",
                    p.rate_from(1),
                    b.rate_from(1),
                    o.store_mbit,
                    o.rtt_ms,
                    p.rate_from(0) / b.rate_from(0)
                ),
            });
        }
        _ => g.push(not_run(G7, "b0 and peers150")),
    }
    const G8: &str = "peer kill and restart: zero lost, zero duplicated";
    const G9: &str = "peer kill and restart: no consumer waits longer than the restart time + 2 s";
    match get(Kind::Kill) {
        Some(r) => {
            let (lost, dup, bad, errs) = r.broken();
            g.push(Goal {
                goal: G8,
                verdict: met(lost == 0 && dup == 0 && bad == 0 && errs == 0),
                detail: format!(
                    "lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}; batches replayed after the restart {}",
                    r.epochs.iter().flat_map(|e| &e.nodes).map(|n| n.replayed).sum::<u64>()
                ),
            });
            match r.restart_secs {
                Some(s) => {
                    let worst = r.max_wait_ms(1) / 1e3;
                    g.push(Goal {
                        goal: G9,
                        verdict: met(worst <= s + 2.0),
                        detail: format!(
                            "longest wait for a batch in epoch 1 {worst:.2} s; restart took {s:.2} s (SIGKILL to socket answering)"
                        ),
                    });
                }
                None => g.push(Goal {
                    goal: G9,
                    verdict: "not met",
                    detail: "the kill never happened (epoch 1 ended first)".into(),
                }),
            }
        }
        None => {
            g.push(not_run(G8, "kill"));
            g.push(not_run(G9, "kill"));
        }
    }
    const G10: &str = "node loss with relaunch: only the lost node's samples change owner";
    match get(Kind::Relaunch) {
        Some(r) if r.epochs.len() > 1 => {
            let lost_node = o.nodes - 1;
            // The lost node read its keep-set from the store in epoch 0;
            // after the relaunch only those samples have new owners, who
            // read them from the store once.
            let lost_share = r.epochs[0].nodes[lost_node]
                .m
                .get("reads")
                .copied()
                .unwrap_or(0.0);
            let after = r.epochs[1].total("reads");
            let (lost, dup, bad, errs) = r.broken();
            let steps: u64 = r.epochs.iter().map(|e| e.step_mismatch).sum();
            g.push(Goal {
                goal: G10,
                verdict: met(
                    after <= lost_share * 1.05 + 0.01 * n
                        && lost + dup + bad == 0
                        && errs == 0
                        && steps == 0,
                ),
                detail: format!(
                    "store reads in the first epoch after the relaunch {after:.0} ({}); the lost node had read {lost_share:.0} (its keep-set) in epoch 0; \
                     lost {lost}, duplicated {dup}, bad {bad}, errors {errs}, steps differing {steps} (a proxy: the agents do not export ownership)",
                    pct(after / n)
                ),
            });
        }
        _ => g.push(not_run(G10, "relaunch")),
    }
    const G11: &str =
        "corruption: changed records rejected by the channel, no bad sample delivered";
    match get(Kind::Corrupt) {
        Some(r) => {
            let rejected: f64 = r.epochs.iter().map(|e| e.total("rejected_record")).sum();
            let crc: f64 = r.epochs.iter().map(|e| e.total("crc")).sum();
            let (_, _, bad, _) = r.broken();
            g.push(Goal {
                goal: G11,
                verdict: met(r.corrupted > 0 && rejected >= 1.0 && bad == 0),
                detail: format!(
                    "{} of {} block records changed on the wire; {rejected:.0} records rejected by the channel \
                     (each closes its connection: the records behind it on the same connection are never opened), \
                     {crc:.0} block CRC failures, {bad} bad samples delivered",
                    r.corrupted, r.proxied_blocks
                ),
            });
        }
        None => g.push(not_run(G11, "corrupt")),
    }
    const G12: &str = "slow link: the other nodes' p99 batch wait <= 2x their p99 in peers150";
    const G13: &str = "slow link: epoch 0 store reads <= 1.05 x the dataset";
    match (get(Kind::Slow), get(Kind::Peers150)) {
        (Some(s), Some(p)) => {
            let slow = o.nodes - 1;
            let p99_of = |r: &ScenarioResult, nodes: &[usize]| r.p99_ms_of(nodes);
            let others: Vec<usize> = (0..o.nodes).filter(|&k| k != slow).collect();
            let (a, b) = (p99_of(s, &others), p99_of(p, &others));
            let per_node: Vec<String> = (0..o.nodes)
                .map(|k| {
                    format!(
                        "n{k}{} {:.1} ms",
                        if k == slow { " (slow)" } else { "" },
                        p99_of(s, &[k])
                    )
                })
                .collect();
            let routed: f64 = s.epochs.iter().map(|e| e.total("slow_routed")).sum();
            let hedged: f64 = s.epochs.iter().map(|e| e.total("hedged")).sum();
            g.push(Goal {
                goal: G12,
                verdict: met(a <= 2.0 * b),
                detail: format!(
                    "p99 of the nodes other than n{slow}: slow {a:.1} ms, peers150 {b:.1} ms; per node in slow: {}; \
                     requests handed to the store because a peer was found slow {routed:.0}, hedged {hedged:.0}",
                    per_node.join(", ")
                ),
            });
            let first = s.epochs[0].total("reads") / n;
            g.push(Goal {
                goal: G13,
                verdict: met(first <= 1.05),
                detail: format!(
                    "slow: epoch 0 read {first:.4} x the dataset from the store (peers150: {:.4} x)",
                    p.epochs[0].total("reads") / n
                ),
            });
        }
        _ => {
            g.push(not_run(G12, "slow and peers150"));
            g.push(not_run(G13, "slow and peers150"));
        }
    }
    const G14: &str = "channel cost: peers150 (encrypted) >= 0.9x the samples/s of peers150off";
    match (get(Kind::Peers150), get(Kind::Peers150Off)) {
        (Some(on), Some(off)) => {
            let x = on.rate_from(0) / off.rate_from(0).max(1e-9);
            g.push(Goal {
                goal: G14,
                verdict: met(x >= 0.9),
                detail: format!(
                    "whole runs: peers150 {:.0} samples/s, peers150off {:.0} samples/s: {x:.3}x; epochs >= 1: {:.3}x",
                    on.rate_from(0),
                    off.rate_from(0),
                    on.rate_from(1) / off.rate_from(1).max(1e-9)
                ),
            });
        }
        _ => g.push(not_run(G14, "peers150 and peers150off")),
    }
    g
}

fn write_timeline(path: &Path, rs: &[ScenarioResult]) -> Result<()> {
    let mut s = String::from("scenario,t,node,local,peer,store,reads\n");
    for r in rs {
        for (e, t) in r.marks.iter().enumerate() {
            let _ = writeln!(s, "{},{t:.3},epoch,{e},0,0,0", r.kind.name());
        }
        for p in &r.timeline {
            let _ = writeln!(
                s,
                "{},{:.3},{},{},{},{},{}",
                r.kind.name(),
                p.t,
                p.node,
                p.arena,
                p.peer,
                p.store,
                p.reads
            );
        }
    }
    std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw(timeline: &Path, png: &Path) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster_plot.py");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let st = Command::new(&py)
        .arg(&script)
        .arg(timeline)
        .arg(png)
        .status()
        .map_err(|e| format!("{py}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{} exited with {st}", script.display()))
    }
}

// ---------------------------------------------------------------- main

fn orchestrate(o: &Opts) -> Result<bool> {
    if !sys::is_root() {
        return Err("bench/run cluster needs root (network namespaces, tc)".into());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let granaryd = granary_bench::attack_agent::find_granaryd()?;
    let work = o.out.join("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    netns::on_interrupt(PREFIX, &work)?;
    let regime0 = sys::regime();
    println!("regime at start: {regime0}");
    let spec = o.spec();
    let summary = synth::generate(&spec, |_, _| {}).map_err(|e| format!("dataset: {e}"))?;
    let dataset_bytes = spec.total_bytes();
    println!(
        "dataset: {} samples, mean {} KiB, sigma {}, {:.1} MB ({}), {} nodes, {} ranks (two on n0), batch {}, {} epochs",
        o.samples,
        o.mean / 1024,
        o.sigma,
        dataset_bytes as f64 / 1e6,
        if summary.skipped { "reused" } else { "generated" },
        o.nodes,
        o.world(),
        o.batch,
        o.epochs
    );
    println!(
        "links: nodes {} Mbit/s, store {} Mbit/s + {} ms RTT (delay proxy); hedge after {} ms; keep_percent {}",
        o.node_mbit, o.store_mbit, o.rtt_ms, o.hedge_ms, o.keep_percent
    );
    let net = Net::create(NetSpec {
        prefix: PREFIX.into(),
        nodes: o.nodes,
        node_mbit: o.node_mbit,
        store_mbit: o.store_mbit,
    })?;
    let mut sc = Net::exec(&netns::store_ns(PREFIX), &me);
    sc.args(["--role", "store", "--prefix", "cluster"])
        .args(["--listen", &format!("{}:{STORE_PORT}", netns::store_ip())])
        .args(["--delay-us", &(o.rtt_ms * 1000 / 2).to_string()])
        .args(spec_args(&spec));
    let t = Instant::now();
    let mut store = Proc::spawn("store", sc, work.join("store.log"))?;
    let ready = store.expect("ready", Duration::from_secs(900))?;
    let weed_pid: u32 = ready
        .get("weed_pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    println!(
        "store ready (SeaweedFS + ingest + delay proxy) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let env = Env {
        net,
        spec,
        dataset_bytes,
        work: work.clone(),
        granaryd,
        me,
    };
    let store_pids = [store.pid(), weed_pid];
    let mut results = Vec::new();
    for &kind in &o.scenarios {
        eprintln!("scenario {} …", kind.name());
        let r = run_scenario(o, &env, &store_pids, kind)?;
        print_scenario(o, &r);
        results.push(r);
    }
    let _ = store.send("quit");
    store.finish();
    let regime1 = sys::regime();
    println!("\nregime at end: {regime1}");

    // Invariants: every consumer got exactly its plan, every byte right.
    let mut invariants = Vec::new();
    for r in &results {
        let (lost, dup, bad, errs) = r.broken();
        if lost + dup + bad > 0 || errs > 0 {
            invariants.push(format!(
                "{}: lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}",
                r.kind.name()
            ));
        }
        for (e, ep) in r.epochs.iter().enumerate() {
            if ep.step_mismatch > 0 || ep.steps == 0 {
                invariants.push(format!(
                    "{} epoch {e}: {} of {} global steps differ from the planner's",
                    r.kind.name(),
                    ep.step_mismatch,
                    ep.steps
                ));
            }
        }
        if o.smoke && r.kind == Kind::Locality && !r.epochs.iter().all(|e| e.locality) {
            invariants.push("locality: an epoch ran in exact order".into());
        }
        if o.smoke && matches!(r.kind, Kind::Peers150 | Kind::Locality) {
            let n = o.samples as f64;
            let r0 = r.epochs[0].total("reads");
            if r0 > 1.01 * n {
                invariants.push(format!(
                    "epoch 0 read {r0} samples from the store (bound {:.0})",
                    1.01 * n
                ));
            }
            for (e, ep) in r.epochs.iter().enumerate().skip(1) {
                let x = ep.total("reads");
                if x > 0.01 * n {
                    invariants.push(format!(
                        "epoch {e} read {x} samples from the store (bound {:.0})",
                        0.01 * n
                    ));
                }
            }
        }
    }
    println!(
        "\ninvariants (every consumer received exactly its plan, per step; every byte verified{}): {}",
        if o.smoke { "; store reads bound" } else { "" },
        if invariants.is_empty() {
            "hold".to_owned()
        } else {
            format!("BROKEN: {}", invariants.join("; "))
        }
    );

    let gs = if o.smoke {
        Vec::new()
    } else {
        goals(o, &results)
    };
    if !gs.is_empty() {
        println!("\ngoals:");
        for g in &gs {
            println!("  [{}] {}: {}", g.verdict, g.goal, g.detail);
        }
    }
    let timeline = o.out.join("timeline.csv");
    write_timeline(&timeline, &results)?;
    println!("timeline: {}", timeline.display());
    if let Some(png) = &o.plot {
        match draw(&timeline, png) {
            Ok(()) => println!("plot: {}", png.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }
    let mut j = Json::bench(if o.smoke { "cluster-smoke" } else { "cluster" });
    j.int("samples", o.samples)
        .int("mean_bytes", o.mean)
        .num("sigma", o.sigma, 2)
        .int("dataset_bytes", dataset_bytes)
        .int("nodes", o.nodes as u64)
        .int("ranks", u64::from(o.world()))
        .int("batch", u64::from(o.batch))
        .int("epochs", u64::from(o.epochs))
        .int("node_mbit", u64::from(o.node_mbit))
        .int("store_mbit", u64::from(o.store_mbit))
        .int("rtt_ms", o.rtt_ms)
        .int("hedge_ms", o.hedge_ms)
        .str("regime_start", &regime0)
        .str("regime_end", &regime1);
    let sj: Vec<String> = results
        .iter()
        .map(|r| format!("\"{}\":{}", r.kind.name(), scenario_json(o, r)))
        .collect();
    j.raw("scenarios", &format!("{{{}}}", sj.join(",")));
    let gj: Vec<String> = gs
        .iter()
        .map(|g| {
            let mut x = Json::default();
            x.str("goal", g.goal)
                .str("verdict", g.verdict)
                .str("detail", &g.detail);
            x.line()
        })
        .collect();
    j.raw("goals", &format!("[{}]", gj.join(",")));
    j.str(
        "invariants",
        if invariants.is_empty() {
            "hold"
        } else {
            "broken"
        },
    );
    drop(env);
    println!("{}", j.line());
    Ok(invariants.is_empty())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        let role = args.get(1).cloned().unwrap_or_default();
        if let Err(e) = run_role(&role, args.into_iter().skip(2).collect()) {
            eprintln!("cluster {role}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let parsed = Args::parse(args, &["smoke", "cleanup"], USAGE).and_then(|a| {
        if a.flag("cleanup") {
            let left = netns::teardown(PREFIX);
            if left.is_empty() {
                println!("cluster: nothing of {PREFIX}-* left");
                std::process::exit(0);
            }
            eprintln!("cluster: could not remove {}", left.join(", "));
            std::process::exit(1);
        }
        Opts::parse(&a)
    });
    let o = match parsed {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cluster: {e}");
            std::process::exit(2);
        }
    };
    match orchestrate(&o) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("cluster: {e}");
            std::process::exit(1);
        }
    }
}
