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
//! (`membership = "session"`) and one rank per node, world size = nodes;
//! the world size drops by one in the middle of epoch 1: see below).
//!
//! `relaunch`: every rank's batch is `--batch` x (nodes - 1) / nodes (24
//! with the defaults), so that the global batch `G` stays `--batch` x
//! (nodes - 1) when the job loses a rank. Epoch 0 warms the caches. Epoch 1
//! runs until every rank has consumed `K` global steps (half the epoch; in
//! data-parallel training every rank commits the same steps); then the last
//! node is lost (its `granaryd` and its loader killed with SIGKILL), the
//! others get a new view (epoch 2), and the job is relaunched with one rank
//! fewer and `--batch` per rank: the survivors' sessions open epoch 1 at
//! batch `K` (`first_batch`). Global step `k` is the permutation's entries
//! `[k·G, (k+1)·G)` whatever the world size, so the two parts together
//! must be the epoch's plan, each step once; the later epochs run with the
//! new world. Checked and reported: per step of epoch 1 the delivered
//! multiset against the planner's (old world before `K`, new from `K`),
//! steps delivered twice, missing, or on the wrong side of the change; the
//! plan's union against the dataset (with `--samples` not a multiple of
//! both world sizes the planner pads, as `DistributedSampler` does, and
//! those samples come twice); whether the planner's step hashes differ
//! between the two worlds; and the store reads after the change (the rest
//! of epoch 1, then the later epochs) against the lost node's owned share
//! (its store reads in epoch 0). With `--relaunch-locality` both jobs run
//! the locality-aware assignment: the old one agreed on before each epoch
//! (one rank per node), the relaunched one agreed on again after the
//! change, over the new view and layout; the checks are the same (a global
//! step's samples do not depend on the layout).
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
  --batch B          batch size per rank (default 32; in relaunch each rank's after the loss,
                     before it B x (nodes - 1) / nodes: B must be divisible by --nodes, and
                     --samples a multiple of nodes x (nodes - 1) gives epochs without padding)
  --nodes N          node namespaces (default 4; node 0 runs two ranks)
  --node-mbit M      each node's link, each way (default 1000)
  --store-mbit M     the store's link, each way (default 200)
  --rtt-ms R         round trip added by the delay proxy in front of the store (default 50)
  --slow-mbit M      the slowed node's link in `slow` (default 10)
  --hedge-ms H       peers.hedge_after_ms of every agent (default 2000, the agent's)
  --owner-grace-ms G peers.owner_grace_ms of every agent (default 10000, the agent's; 0: a
                     dropped owner's samples are read from the store at once)
  --keep-percent P   peers.keep_percent of every agent (default 50)
  --b0-arena-mib A   arena of each agent in b0 (default 64, the smallest allowed)
  --corrupt-every K  one peer block in K corrupted in `corrupt` (default 10000)
  --restart-ms T     time between the kill and the restart in `kill` (default 1000)
  --relaunch-locality  run `relaunch` in the locality-aware assignment: the job agrees
                     before each epoch, and again after the change with the new view,
                     world size and layout
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
    owner_grace_ms: u64,
    keep_percent: u64,
    b0_arena_mib: u64,
    corrupt_every: u64,
    restart_ms: u64,
    /// `relaunch` in the locality-aware assignment.
    relaunch_locality: bool,
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
            owner_grace_ms: a.u64("owner-grace-ms", 10_000)?,
            keep_percent: a.u64("keep-percent", 50)?,
            b0_arena_mib: a.u64("b0-arena-mib", 64)?,
            corrupt_every: a.u64("corrupt-every", 10_000)?,
            restart_ms: a.u64("restart-ms", 1000)?,
            relaunch_locality: a.flag("relaunch-locality"),
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
        if o.scenarios.contains(&Kind::Relaunch) && !o.global_batch().is_multiple_of(o.nodes as u64)
        {
            return Err(format!(
                "relaunch keeps the global batch --batch x (nodes - 1) = {} over {} ranks before the loss: \
                 give a --batch divisible by --nodes",
                o.global_batch(),
                o.nodes
            ));
        }
        Ok(o)
    }

    /// Ranks of node `k` in scenario `kind`: one per node in `relaunch`
    /// (world size = nodes), else [`Opts::ranks`].
    fn ranks_in(&self, kind: Kind, k: usize) -> Vec<u32> {
        if kind == Kind::Relaunch {
            vec![k as u32]
        } else {
            self.ranks(k)
        }
    }

    /// Ranks in the job at the start of scenario `kind`.
    fn world_in(&self, kind: Kind) -> u32 {
        if kind == Kind::Relaunch {
            self.nodes as u32
        } else {
            self.world()
        }
    }

    /// `relaunch`'s global batch: `--batch` per rank once the last node is
    /// lost, over `nodes - 1` ranks.
    fn global_batch(&self) -> u64 {
        u64::from(self.batch) * (self.nodes as u64 - 1)
    }

    /// Every rank's batch at the start of scenario `kind`: in `relaunch`
    /// the global batch over all the nodes.
    fn batch_in(&self, kind: Kind) -> u32 {
        if kind == Kind::Relaunch {
            (self.global_batch() / self.nodes as u64) as u32
        } else {
            self.batch
        }
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

    /// Kills the process with SIGKILL (a lost node's loader).
    fn kill9(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
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

impl NodeEpoch {
    /// Adds another part of the same epoch (`relaunch`: before and after
    /// the change).
    fn merge(&mut self, o: NodeEpoch) {
        self.samples += o.samples;
        self.bytes += o.bytes;
        self.secs += o.secs;
        self.lost += o.lost;
        self.dup += o.dup;
        self.bad += o.bad;
        self.replayed += o.replayed;
        self.reopens += o.reopens;
        self.waits_us.extend(o.waits_us);
        self.errors.extend(o.errors);
        self.reasons.extend(o.reasons);
        add_steps(&mut self.steps, &o.steps);
    }
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

/// `relaunch`: the job lost its last node in the middle of epoch `epoch`
/// and went on at global step `at` with one rank fewer and the same global
/// batch.
#[derive(Clone, Debug, Default)]
struct Relaunch {
    epoch: u32,
    /// Both parts ran in the locality-aware assignment.
    locality: bool,
    /// The global step the relaunched job started at (every rank had
    /// consumed steps `0..at`).
    at: u64,
    /// Global steps in the epoch.
    steps: u64,
    world: (u32, u32),
    batch: (u32, u32),
    /// Steps of the epoch whose planner hash differs between the two
    /// (world, batch) pairs (0: the planner's global step does not depend
    /// on the world size).
    planner_differing: u64,
    /// Steps delivered (by any node) both before and after the change.
    twice: u64,
    /// Steps delivered by nobody, before or after.
    missing: u64,
    /// Steps delivered on the wrong side of the change (before it at or
    /// after `at`, or after it below `at`).
    wrong_side: u64,
    /// Steps of the epoch, both sides, differing from the planner's.
    differing: u64,
    /// The planned union of the steps (before: old world, after: new):
    /// samples twice or more (extra copies), and samples of the dataset
    /// in no step.
    union_extra: u64,
    union_missing: u64,
    /// Samples the planner pads the new world's epoch with (`n` not a
    /// multiple of the world size): these come twice.
    padding: u64,
    /// Store reads of the job in the epoch before the change.
    reads_before: f64,
    /// Store reads from the change to the end of the epoch.
    reads_rest: f64,
    /// Store reads of each later epoch.
    reads_later: Vec<f64>,
    /// The lost node's store reads in epoch 0: its owned share (each
    /// sample is read from the store by its owner, once).
    lost_share: f64,
    /// From the last rank stopping to the relaunched ranks' first command.
    change_secs: f64,
}

impl Relaunch {
    fn reads_after(&self) -> f64 {
        self.reads_rest + self.reads_later.iter().sum::<f64>()
    }
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
    /// `relaunch`: the change in the middle of an epoch.
    relaunch: Option<Relaunch>,
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
    let prefetch = "max_inflight_reads = 64\nwindow_batches = 4\ninitial_window = 2\n\
                    read_retries = 3\nretry_backoff_ms = 50";
    let mut t =
        granary_testkit::agent_toml::head(&format!("{arena_mib}MiB"), sock, prefetch, METRICS);
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
owner_grace_ms = {grace}
encryption = "{enc}"
"#,
            kp = o.keep_percent,
            hedge = o.hedge_ms,
            grace = o.owner_grace_ms,
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
/// `relaunch`'s layout over the view of nodes `which` (one rank per node,
/// rank `i` on `which[i]`): each rank's view index (members sorted by
/// node id), comma-separated.
fn relaunch_layout(which: &[usize]) -> String {
    let mut ids: Vec<String> = which.iter().map(|k| format!("n{k}")).collect();
    ids.sort();
    which
        .iter()
        .map(|k| {
            let id = format!("n{k}");
            ids.iter().position(|x| *x == id).unwrap_or(0).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn layout(o: &Opts) -> Vec<u32> {
    let mut node_of = vec![0u32; o.world() as usize];
    for k in 0..o.nodes {
        for r in o.ranks(k) {
            node_of[r as usize] = view_index(o, k);
        }
    }
    node_of
}

/// Per global step of `epoch` with `world` ranks of `batch`, the samples
/// of every rank's batch of that index (rank after rank).
fn planned_step_ids(o: &Opts, world: u32, batch: u32, epoch: u32) -> Vec<Vec<u64>> {
    let mut steps: Vec<Vec<u64>> = Vec::new();
    for rank in 0..world {
        let p = granary_agent::planner::PlanParams {
            num_samples: o.samples,
            seed: 1,
            rank,
            world_size: world,
            batch_size: batch,
            drop_last: false,
        };
        let Ok(plan) = granary_agent::planner::EpochPlan::new(&p, epoch) else {
            continue;
        };
        for (k, b) in plan.batches().enumerate() {
            if steps.len() <= k {
                steps.resize(k + 1, Vec::new());
            }
            steps[k].extend_from_slice(b);
        }
    }
    steps
}

/// Per global step of `epoch` with `world` ranks of `batch`, the planner's
/// multiset hash (the sum of every rank's batch's terms). With the same
/// global batch `world x batch` it does not depend on the world size:
/// global step `k` is the permutation's entries `[k·G, (k+1)·G)` (padding
/// aside: see `relaunch`'s check).
fn planned_steps(o: &Opts, world: u32, batch: u32, epoch: u32) -> Vec<u64> {
    planned_step_ids(o, world, batch, epoch)
        .iter()
        .map(|ids| {
            ids.iter()
                .fold(0u64, |h, &id| h.wrapping_add(cluster_node::step_term(id)))
        })
        .collect()
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
    let mut gen = granary_base::SplitMix64(0x6772_616e_6172_7931);
    for _ in 0..2000 {
        let holders: Vec<Option<u32>> = (0..n)
            .map(|_| Some((gen.next_u64() % u64::from(nodes)) as u32))
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
        let ranks: Vec<String> = o.ranks_in(kind, k).iter().map(u32::to_string).collect();
        let mut c = Net::exec(&netns::node_ns(&p, k), &env.me);
        c.args(["--role", "node"])
            .arg("--sock")
            .arg(&agent.sock)
            .args(["--metrics", METRICS, "--ranks", &ranks.join(",")])
            .args(["--world", &o.world_in(kind).to_string()])
            .args(["--batch", &o.batch_in(kind).to_string(), "--seed", "1"])
            .args(["--probe", &format!("{}:{STORE_PORT}", netns::store_ip())])
            .args(spec_args(&env.spec));
        if kind == Kind::Locality {
            let l: Vec<String> = layout(o).iter().map(u32::to_string).collect();
            c.args(["--layout", &l.join(",")])
                .args(["--nodes", &o.nodes.to_string()])
                .arg("--view")
                .arg(&view_file);
        }
        if kind == Kind::Relaunch && o.relaunch_locality {
            let all: Vec<usize> = (0..o.nodes).collect();
            c.args(["--layout", &relaunch_layout(&all)])
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
    let mut epochs: Vec<EpochResult> = Vec::new();
    let mut restart_secs = None;
    let lost = o.nodes - 1;
    let mut active = vec![true; o.nodes];
    let mut world = o.world_in(kind);
    let mut batch = o.batch_in(kind);
    // `relaunch`: the epoch the last node is lost in, after a warm-up.
    let split = 1u32;
    let mut relaunch: Option<Relaunch> = None;
    let mut loader_cpu = vec![0.0; o.nodes];
    for e in 0..o.epochs {
        let mut locality =
            if kind == Kind::Locality || (kind == Kind::Relaunch && o.relaunch_locality) {
                agree_epoch(&mut nodes, &active, world, e)?
            } else {
                None
            };
        // Whether every part of the epoch ran in locality order.
        let mut every_part_locality = true;
        // The parts of the epoch, (from, stop): in `relaunch`'s split
        // epoch, the old job runs global steps 0..K (about half) and the
        // relaunched one K.. .
        let parts: Vec<(u64, Option<u64>)> = if kind == Kind::Relaunch && e == split {
            let k = planned_steps(o, world, batch, e).len() as u64 / 2;
            vec![(0, Some(k)), (k, None)]
        } else {
            vec![(0, None)]
        };
        let start = Instant::now();
        marks.push(t0.elapsed().as_secs_f64());
        let mut merged: Vec<NodeEpoch> = vec![NodeEpoch::default(); o.nodes];
        // Per part: the job-wide hash of every step delivered, and the
        // (world, batch) it ran with.
        let mut part_steps: Vec<(Vec<u64>, u32, u32)> = Vec::new();
        let mut want: Vec<u64> = Vec::new();
        let mut at_change: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); o.nodes];
        let mut change_secs = 0.0;
        let mut killed = false;
        for (pi, &(from, stop)) in parts.iter().enumerate() {
            if pi > 0 {
                let at = Instant::now();
                // Store reads split at the change: every node's counters
                // now, the lost one's included.
                at_change = scrape_deltas(&mut nodes, &active, &mut mono, &mut prev)?;
                // The last node is lost (agent and loader killed); the job
                // is relaunched on the others with a new view (epoch 2),
                // one rank fewer and the same global batch, at the step
                // every rank had committed.
                active[lost] = false;
                agents[lost].kill9();
                loader_cpu[lost] = cpu_secs(nodes[lost].pid());
                nodes[lost].kill9();
                let survivors: Vec<usize> = (0..o.nodes).filter(|&k| active[k]).collect();
                let view2 = hand_view(&agents, &survivors, "relaunch", 2)?;
                let old = (world, batch);
                world -= o.ranks_in(kind, lost).len() as u32;
                batch = (o.global_batch() / u64::from(world)) as u32;
                let mut words = format!("world {world} batch={batch}");
                if o.relaunch_locality {
                    // The new job's layout over the new view, then its
                    // agreement: the same global batch, another layout.
                    let f = dir.join("view2.bin");
                    std::fs::write(&f, &view2).map_err(|e| format!("{}: {e}", f.display()))?;
                    let _ = write!(
                        words,
                        " layout={} nodes={} view={}",
                        relaunch_layout(&survivors),
                        survivors.len(),
                        f.display()
                    );
                }
                for &k in &survivors {
                    nodes[k].send(&words)?;
                    nodes[k].expect("world", Duration::from_secs(10))?;
                }
                if o.relaunch_locality {
                    locality = agree_epoch(&mut nodes, &active, world, e)?;
                }
                change_secs = at.elapsed().as_secs_f64();
                eprintln!(
                    "  relaunch: node n{lost} lost at global step {from} of epoch {e} ({} ranks x {}); \
                     the job goes on at step {from} with {world} ranks x {batch} on {} nodes",
                    old.0,
                    old.1,
                    survivors.len()
                );
            }
            every_part_locality &= locality.is_some();
            let plan = planned_steps(o, world, batch, e);
            let hi = stop.map_or(plan.len(), |s| s as usize).min(plan.len());
            if want.len() < plan.len() {
                want.resize(plan.len(), 0);
            }
            want[from as usize..hi].copy_from_slice(&plan[from as usize..hi]);
            let mut cmd = format!("epoch {e}");
            if let Some(d) = &locality {
                let _ = write!(cmd, " locality={}", cluster_node::digest_hex(d));
            }
            if from > 0 {
                let _ = write!(cmd, " from={from}");
            }
            if let Some(s) = stop {
                let _ = write!(cmd, " stop={s}");
            }
            for (k, n) in nodes.iter_mut().enumerate() {
                if active[k] {
                    n.send(&cmd)?;
                }
            }
            let mut done: Vec<Option<NodeEpoch>> = (0..o.nodes)
                .map(|k| (!active[k]).then(NodeEpoch::default))
                .collect();
            while done.iter().any(Option::is_none) {
                let mut idle = true;
                for k in 0..o.nodes {
                    if !active[k] {
                        continue;
                    }
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
            let mut job = Vec::new();
            for (k, ne) in done.into_iter().enumerate() {
                let ne = ne.unwrap_or_default();
                add_steps(&mut job, &ne.steps);
                merged[k].merge(ne);
            }
            part_steps.push((job, world, batch));
        }
        let secs = start.elapsed().as_secs_f64();
        let mut res = EpochResult {
            secs,
            nodes: merged,
            locality: every_part_locality,
            ..EpochResult::default()
        };
        let mut got = Vec::new();
        for (steps, _, _) in &part_steps {
            add_steps(&mut got, steps);
        }
        res.steps = want.len() as u64;
        res.step_mismatch = (0..got.len().max(want.len()))
            .filter(|&i| got.get(i).copied().unwrap_or(0) != want.get(i).copied().unwrap_or(0))
            .count() as u64;
        let after = scrape_deltas(&mut nodes, &active, &mut mono, &mut prev)?;
        for k in 0..o.nodes {
            let mut m = at_change[k].clone();
            for (key, v) in &after[k] {
                *m.entry(key.clone()).or_insert(0.0) += v;
            }
            res.nodes[k].m = m;
        }
        if parts.len() > 1 {
            let sum = |ms: &[BTreeMap<String, f64>]| -> f64 {
                ms.iter().filter_map(|m| m.get("reads")).sum()
            };
            let mut r = check_steps(o, e, parts[1].0, &part_steps);
            r.differing = res.step_mismatch;
            r.reads_before = sum(&at_change);
            r.reads_rest = sum(&after);
            r.lost_share = epochs[0].nodes[lost].m.get("reads").copied().unwrap_or(0.0);
            r.change_secs = change_secs;
            r.locality = every_part_locality;
            relaunch = Some(r);
        } else if let Some(r) = relaunch.as_mut() {
            r.reads_later.push(res.total("reads"));
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
    for (k, n) in nodes.iter().enumerate() {
        if active[k] {
            loader_cpu[k] = cpu_secs(n.pid());
        }
    }
    let store_cpu = store_pids.iter().map(|&p| cpu_secs(p)).sum::<f64>() - store_cpu0;
    let (mut corrupted, mut proxied_blocks) = (0, 0);
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
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
        relaunch,
        timeline,
        marks,
    })
}

/// Every active node's counters now, as deltas from `prev` (which they
/// replace); an empty map for the nodes no longer active.
fn scrape_deltas(
    nodes: &mut [Proc],
    active: &[bool],
    mono: &mut [Monotone],
    prev: &mut [BTreeMap<String, f64>],
) -> Result<Vec<BTreeMap<String, f64>>> {
    let mut out = vec![BTreeMap::new(); nodes.len()];
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
        n.send("scrape")?;
        let kv = n.expect("scraped", Duration::from_secs(10))?;
        let now = mono[k].feed(&kv).unwrap_or_else(|| prev[k].clone());
        out[k] = now
            .iter()
            .map(|(key, v)| (key.clone(), v - prev[k].get(key).copied().unwrap_or(0.0)))
            .collect();
        prev[k] = now;
    }
    Ok(out)
}

/// Adds per-step hashes into `into` (wrapping, index by index).
fn add_steps(into: &mut Vec<u64>, steps: &[u64]) {
    if into.len() < steps.len() {
        into.resize(steps.len(), 0);
    }
    for (g, &h) in into.iter_mut().zip(steps) {
        *g = g.wrapping_add(h);
    }
}

/// `relaunch`'s step checks for epoch `e`, the job changed at global step
/// `at`: `parts` holds the job-wide step hashes delivered before and after
/// the change, each with its (world, batch). A step nobody delivered has
/// hash 0 (a delivered one is 0 with probability 2^-64).
fn check_steps(o: &Opts, e: u32, at: u64, parts: &[(Vec<u64>, u32, u32)]) -> Relaunch {
    let (before, w0, b0) = &parts[0];
    let (after, w1, b1) = &parts[1];
    let plan0 = planned_step_ids(o, *w0, *b0, e);
    let plan1 = planned_step_ids(o, *w1, *b1, e);
    let hash = |ids: &[u64]| {
        ids.iter()
            .fold(0u64, |h, &id| h.wrapping_add(cluster_node::step_term(id)))
    };
    let steps = plan0.len().max(plan1.len());
    let planner_differing = (0..steps)
        .filter(|&i| plan0.get(i).map(|x| hash(x)) != plan1.get(i).map(|x| hash(x)))
        .count() as u64;
    let at = at as usize;
    let on = |v: &Vec<u64>, i: usize| v.get(i).is_some_and(|&h| h != 0);
    let twice = (0..steps)
        .filter(|&i| on(before, i) && on(after, i))
        .count() as u64;
    let missing = (0..steps)
        .filter(|&i| !on(before, i) && !on(after, i))
        .count() as u64;
    let wrong_side = (0..steps.max(before.len()).max(after.len()))
        .filter(|&i| (i >= at && on(before, i)) || (i < at && on(after, i)))
        .count() as u64;
    // The plan's union: steps 0..at of the old world, at.. of the new.
    let mut count = vec![0u32; o.samples as usize];
    let ids = plan0.iter().take(at).chain(plan1.iter().skip(at)).flatten();
    for &id in ids {
        if let Some(c) = count.get_mut(id as usize) {
            *c += 1;
        }
    }
    let union_extra = count.iter().map(|&c| u64::from(c.saturating_sub(1))).sum();
    let union_missing = count.iter().filter(|&&c| c == 0).count() as u64;
    let w = u64::from(*w1);
    Relaunch {
        epoch: e,
        at: at as u64,
        steps: steps as u64,
        world: (*w0, *w1),
        batch: (*b0, *b1),
        planner_differing,
        twice,
        missing,
        wrong_side,
        union_extra,
        union_missing,
        padding: o.samples.div_ceil(w) * w - o.samples,
        ..Relaunch::default()
    }
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
        // Where the peer requests went: hedged, routed around a slow peer,
        // cancelled at the owner (and what the owners did with cancels).
        let asked: Vec<String> = ep
            .nodes
            .iter()
            .enumerate()
            .map(|(k, ne)| {
                let g = |key: &str| ne.m.get(key).copied().unwrap_or(0.0);
                format!(
                    "n{k} {:.0}/{:.0}/{:.0}/{:.0}/{:.0}",
                    g("hedged"),
                    g("slow_routed"),
                    g("cancels"),
                    g("cancelled"),
                    g("not_started")
                )
            })
            .collect();
        println!(
            "{:>5} {:>4}  peer requests hedged/slow-routed/cancels sent; cancelled here/reads not started: {}",
            e,
            "reqs",
            asked.join(", ")
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
    if let Some(x) = &r.relaunch {
        println!(
            "  relaunch ({} order): node n{} lost at global step {} of {} in epoch {}: {} ranks x {} -> {} x {} ({:.2} s from the stop to the relaunched ranks' command)",
            if x.locality { "locality" } else { "exact" },
            o.nodes - 1,
            x.at,
            x.steps,
            x.epoch,
            x.world.0,
            x.batch.0,
            x.world.1,
            x.batch.1,
            x.change_secs
        );
        println!(
            "  relaunch: epoch {} steps differing from the planner {}, delivered twice {}, missing {}, on the wrong side of the change {}; \
             the plan's union {} extra copies, {} samples missing (padding {}); the planner's steps differ between the two worlds in {} of {}",
            x.epoch,
            x.differing,
            x.twice,
            x.missing,
            x.wrong_side,
            x.union_extra,
            x.union_missing,
            x.padding,
            x.planner_differing,
            x.steps
        );
        let later: Vec<String> = x.reads_later.iter().map(|v| format!("{v:.0}")).collect();
        println!(
            "  relaunch: store reads before the change {:.0}, rest of epoch {} {:.0}, later epochs {}: after the change {:.0} ({}); \
             the lost node's owned share (its epoch-0 store reads) {:.0}",
            x.reads_before,
            x.epoch,
            x.reads_rest,
            if later.is_empty() { "-".to_owned() } else { later.join(", ") },
            x.reads_after(),
            pct(x.reads_after() / n),
            x.lost_share
        );
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
    if let Some(x) = &r.relaunch {
        let mut rj = Json::default();
        rj.int("epoch", u64::from(x.epoch))
            .str("assignment", if x.locality { "locality" } else { "exact" })
            .int("at_step", x.at)
            .int("steps", x.steps)
            .int("world_before", u64::from(x.world.0))
            .int("world_after", u64::from(x.world.1))
            .int("batch_before", u64::from(x.batch.0))
            .int("batch_after", u64::from(x.batch.1))
            .int("steps_differing", x.differing)
            .int("steps_twice", x.twice)
            .int("steps_missing", x.missing)
            .int("steps_wrong_side", x.wrong_side)
            .int("union_extra", x.union_extra)
            .int("union_missing", x.union_missing)
            .int("padding", x.padding)
            .int(
                "planner_steps_differing_between_worlds",
                x.planner_differing,
            )
            .num("reads_before_change", x.reads_before, 0)
            .num("reads_rest_of_epoch", x.reads_rest, 0)
            .nums("reads_later_epochs", &x.reads_later, 0)
            .num("reads_after_change", x.reads_after(), 0)
            .num("lost_node_owned_share", x.lost_share, 0)
            .num("change_secs", x.change_secs, 3);
        j.raw("relaunch", &rj.line());
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
    granary_bench::report::verdict(ok)
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
    const G15: &str = "relaunch: world size N -> N-1 in the middle of an epoch (same global batch): the union of global \
                       steps equals the plan with no duplicates, and store reads after the change <= the lost node's owned share";
    match get(Kind::Relaunch).map(|r| (r, r.relaunch.as_ref())) {
        Some((r, Some(x))) => {
            // The lost node read its owned share (its keep set) from the
            // store in epoch 0; after the change only those samples have
            // new owners, who read them from the store once (a proxy: the
            // agents do not export ownership).
            let after = x.reads_after();
            let (lost, dup, bad, errs) = r.broken();
            let steps: u64 = r.epochs.iter().map(|e| e.step_mismatch).sum();
            let clean = lost + dup + bad == 0 && errs == 0 && steps == 0;
            let later: Vec<String> = x.reads_later.iter().map(|v| format!("{v:.0}")).collect();
            g.push(Goal {
                goal: G10,
                verdict: met(after <= x.lost_share * 1.05 + 0.01 * n && clean),
                detail: format!(
                    "store reads after the change {after:.0} ({}); the lost node had read {:.0} (its keep set) in epoch 0; \
                     lost {lost}, duplicated {dup}, bad {bad}, errors {errs}, steps differing {steps}",
                    pct(after / n),
                    x.lost_share
                ),
            });
            let union_ok = x.union_extra == 0
                && x.union_missing == 0
                && x.twice == 0
                && x.missing == 0
                && x.wrong_side == 0
                && x.differing == 0;
            g.push(Goal {
                goal: G15,
                verdict: met(union_ok && clean && after <= x.lost_share),
                detail: format!(
                    "world {} x batch {} -> {} x {} (global batch {}) at global step {} of {} in epoch {}; \
                     steps of epoch {} differing from the planner {}, delivered twice {}, missing {}, on the wrong side {}; \
                     the plan's union: {} extra copies, {} samples missing (the new world pads {}); \
                     the planner's steps for the two worlds differ in {} of {}; \
                     store reads after the change {after:.0} (rest of epoch {} {:.0}, later epochs {}) against the lost node's owned share {:.0} \
                     (its epoch-0 store reads; {:.0} = n/nodes); before the change in epoch {} {:.0}; \
                     lost {lost}, duplicated {dup}, bad {bad}, errors {errs}, steps differing in all epochs {steps}{}",
                    x.world.0,
                    x.batch.0,
                    x.world.1,
                    x.batch.1,
                    u64::from(x.world.1) * u64::from(x.batch.1),
                    x.at,
                    x.steps,
                    x.epoch,
                    x.epoch,
                    x.differing,
                    x.twice,
                    x.missing,
                    x.wrong_side,
                    x.union_extra,
                    x.union_missing,
                    x.padding,
                    x.planner_differing,
                    x.steps,
                    x.epoch,
                    x.reads_rest,
                    if later.is_empty() { "none run".to_owned() } else { later.join(" + ") },
                    x.lost_share,
                    n / o.nodes as f64,
                    x.epoch,
                    x.reads_before,
                    if x.padding > 0 {
                        format!(
                            "; --samples a multiple of {} gives both worlds an epoch without padding",
                            u64::from(x.world.0) * u64::from(x.world.1)
                        )
                    } else {
                        String::new()
                    },
                ),
            });
        }
        _ => {
            g.push(not_run(G10, "relaunch"));
            g.push(not_run(G15, "relaunch"));
        }
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
        "dataset: {} samples, mean {} KiB, sigma {}, {:.1} MB ({}), {} nodes, {} ranks (two on n0; relaunch: one per node), batch {}, {} epochs",
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
        "links: nodes {} Mbit/s, store {} Mbit/s + {} ms RTT (delay proxy); hedge after {} ms; owner grace {} ms; keep_percent {}",
        o.node_mbit, o.store_mbit, o.rtt_ms, o.hedge_ms, o.owner_grace_ms, o.keep_percent
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
        .int("owner_grace_ms", o.owner_grace_ms)
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
    let parsed =
        Args::parse(args, &["smoke", "cleanup", "relaunch-locality"], USAGE).and_then(|a| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaunch_layouts_name_view_indices_of_members_sorted_by_id() {
        assert_eq!(relaunch_layout(&[0, 1, 2]), "0,1,2");
        // "n10" sorts before "n2".
        assert_eq!(relaunch_layout(&[2, 10, 0]), "2,1,0");
        let args = ["--scenarios", "relaunch", "--relaunch-locality"].map(String::from);
        let flags = ["smoke", "cleanup", "relaunch-locality"];
        assert!(
            Opts::parse(&Args::parse(args, &flags, USAGE).unwrap())
                .unwrap()
                .relaunch_locality
        );
    }

    fn opts(samples: u64) -> Opts {
        let args = ["--samples", &samples.to_string(), "--scenarios", "relaunch"].map(String::from);
        Opts::parse(&Args::parse(args, &["smoke", "cleanup"], USAGE).unwrap()).unwrap()
    }

    /// The job-wide step hashes a relaunch delivers when it runs steps
    /// `0..stop` with (w0, b0) and `from..` with (w1, b1).
    fn delivered(o: &Opts, stop: usize, from: usize) -> Vec<(Vec<u64>, u32, u32)> {
        let mut before = planned_steps(o, 4, 24, 1);
        before.truncate(stop);
        let mut after = planned_steps(o, 3, 32, 1);
        for h in &mut after[..from] {
            *h = 0;
        }
        vec![(before, 4, 24), (after, 3, 32)]
    }

    #[test]
    fn the_global_step_does_not_depend_on_the_world_size() {
        let o = opts(1200);
        assert_eq!(
            (o.world_in(Kind::Relaunch), o.batch_in(Kind::Relaunch)),
            (4, 24)
        );
        assert_eq!(o.global_batch(), 96);
        assert_eq!(planned_steps(&o, 4, 24, 1), planned_steps(&o, 3, 32, 1));
        let r = check_steps(&o, 1, 6, &delivered(&o, 6, 6));
        assert_eq!(r.steps, 13);
        assert_eq!(r.planner_differing, 0);
        assert_eq!((r.twice, r.missing, r.wrong_side), (0, 0, 0));
        assert_eq!((r.union_extra, r.union_missing, r.padding), (0, 0, 0));
    }

    #[test]
    fn a_step_run_twice_or_skipped_is_reported() {
        let o = opts(1200);
        let r = check_steps(&o, 1, 6, &delivered(&o, 6, 5));
        assert_eq!((r.twice, r.missing, r.wrong_side), (1, 0, 1));
        let r = check_steps(&o, 1, 6, &delivered(&o, 5, 6));
        assert_eq!((r.twice, r.missing, r.wrong_side), (0, 1, 0));
    }

    #[test]
    fn padding_shows_in_the_union() {
        // 1,201 is a multiple of neither 4 nor 3: both worlds pad, so the
        // last step differs between them and the union repeats samples.
        let o = opts(1201);
        let r = check_steps(&o, 1, 6, &delivered(&o, 6, 6));
        assert_eq!(r.padding, 2);
        assert_eq!(r.planner_differing, 1);
        assert_eq!((r.union_extra, r.union_missing), (2, 0));
    }

    #[test]
    fn relaunch_needs_a_global_batch_the_old_world_divides() {
        let args = ["--batch", "30", "--scenarios", "relaunch"].map(String::from);
        assert!(Opts::parse(&Args::parse(args, &["smoke", "cleanup"], USAGE).unwrap()).is_err());
    }
}
