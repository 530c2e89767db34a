//! Why the GPU waits: one cause injected at a time (a slow store, a CPU-starved loader, a long GPU step); the share of intervals after warm-up whose verdict names it (goal ≥ 0.95).
//!
//! One run, scenario after scenario, each with a fresh in-process agent over
//! an S3 dataset on the light store (`bench/src/light_store.rs`) behind the
//! delay proxy, and one loader thread (libgranary's Rust API) that loops
//! over `next_batch` and does, per batch, what its scenario injects:
//!
//! * `store`: the proxy adds `--store-delay-ms` (default 25) each way and
//!   the agent keeps 4 reads in flight; the loader's step is 5 ms of sleep.
//!   Every sample is new (a dataset larger than the run reads), so the
//!   store sets the pace: expected verdict `store`.
//! * `loader_cpu`: no delay (the agent keeps far ahead); the loader spins
//!   `--cpu-ms` (default 30) per batch on its own thread (a decode that
//!   cannot keep up): expected `loader_cpu`.
//! * `compute`: no delay; the loader sleeps `--step-ms` (default
//!   60) per batch, as a thread blocked on a GPU step: expected `compute`.
//!
//! * `peer`: two agents, A and B, peers of one job over loopback, each
//!   one's peer listener behind a delay proxy of its own. A loader on B
//!   reads an epoch of a smaller dataset (`--peer-files`, default 3,000)
//!   first, so that each agent keeps the samples it owns; then the store
//!   proxy adds 100 ms each way, the peer proxies `--peer-delay-ms`
//!   (default 10) each way and a cap of `--peer-mbps` (default 8), and a
//!   loader on A (5 ms sleep per batch) reads: its own samples are in its
//!   arena, the others come over the slow link. Expected `peer`.
//!
//! Each scenario runs `--warmup` seconds (default 3), then `--seconds`
//! (default 12) measured; the verdicts are the agent's
//! `granary_rank_verdicts_total` (of agent A for `peer`) over the measured
//! part.

use granary::{Client, SessionOptions};
use granary_bench::agent::{Agent, AgentSettings, S3Dataset};
use granary_bench::cli::Args;
use granary_bench::data;
use granary_bench::delay_proxy::DelayProxy;
use granary_bench::light_store::LightStore;
use granary_bench::report::{Goal, Json};
use granary_bench::sys;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "bench/run why [--files N] [--mean-size B] [--seconds S] [--warmup S] \
                     [--store-delay-ms MS] [--cpu-ms MS] [--step-ms MS] [--batch N] \
                     [--peer-files N] [--peer-delay-ms MS] [--peer-mbps M]";
const DATASET: &str = "why";
const BUCKET: &str = "why";
const GOAL: f64 = 0.95;
/// The two agents' job secret (a benchmark's, on loopback).
const PEER_SECRET: &str = "05559021d854d94b51d42d3ca615cd116676dbb10c8917f031268a90eed4ff13";
const VERDICTS: [&str; 6] = ["idle", "compute", "loader_cpu", "store", "peer", "arena"];

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("why: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Inject {
    /// Sleep this long per batch (a step that does not need the loader's CPU).
    Sleep(Duration),
    /// Spin this long per batch on the loader's thread.
    Spin(Duration),
}

struct Scenario {
    name: &'static str,
    delay: Duration,
    inflight: u32,
    inject: Inject,
}

fn run() -> Result<()> {
    let args = Args::parse(std::env::args().skip(1), &[], USAGE)?;
    let files = args.u64("files", 40_000)?;
    let mean = args.u64("mean-size", 16_384)?;
    let seconds = args.u64("seconds", 12)?;
    let warmup = args.u64("warmup", 3)?;
    let batch = args.u32("batch", 32)?;
    let ms = |k: &str, d: u64| args.u64(k, d).map(Duration::from_millis);
    let scenarios = [
        Scenario {
            name: "store",
            delay: ms("store-delay-ms", 25)?,
            inflight: 4,
            inject: Inject::Sleep(Duration::from_millis(5)),
        },
        Scenario {
            name: "loader_cpu",
            delay: Duration::ZERO,
            inflight: 64,
            inject: Inject::Spin(ms("cpu-ms", 30)?),
        },
        Scenario {
            name: "compute",
            delay: Duration::ZERO,
            inflight: 64,
            inject: Inject::Sleep(ms("step-ms", 60)?),
        },
    ];
    println!("why: {}", sys::regime());
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    let store =
        LightStore::start(&ds.spec.root, BUCKET, "", 2).map_err(|e| format!("light store: {e}"))?;
    let mut json = Json::bench("why");
    let mut worst = f64::INFINITY;
    for sc in &scenarios {
        let share = scenario(&store, sc, batch, warmup, seconds)?;
        worst = worst.min(share);
        json.num(sc.name, share, 3);
    }
    let peer = peer_scenario(
        &args,
        batch,
        warmup,
        seconds,
        Duration::from_millis(args.u64("peer-delay-ms", 10)?),
    )?;
    worst = worst.min(peer);
    json.num("peer", peer, 3);
    json.num("worst_share", worst, 3);
    json.str(
        "goal",
        if worst >= GOAL {
            "met: every injected cause named in >= 95 % of intervals"
        } else {
            "not met: a cause named in < 95 % of intervals"
        },
    );
    println!("{}", json.line());
    Ok(())
}

/// The peer scenario (module doc); returns the share of agent A's measured
/// intervals whose verdict is `peer`.
fn peer_scenario(
    args: &Args,
    batch: u32,
    warmup: u64,
    seconds: u64,
    peer_delay: Duration,
) -> Result<f64> {
    let files = args.u64("peer-files", 3_000)?;
    let mbps = args.u64("peer-mbps", 8)? as f64;
    let ds = data::spec(files, 16_384, 100);
    let ds = data::ensure(&ds).map_err(|e| format!("dataset: {e}"))?;
    let store =
        LightStore::start(&ds.spec.root, BUCKET, "", 2).map_err(|e| format!("light store: {e}"))?;
    let store_proxy = DelayProxy::start(local(0), store.addr(), Duration::ZERO, None)
        .map_err(|e| format!("delay proxy: {e}"))?;
    // Each agent's listener, and a proxy in front of it that the other dials.
    let listen: Vec<SocketAddr> = (0..2).map(|_| local(free_port())).collect();
    let proxies: Vec<DelayProxy> = listen
        .iter()
        .map(|&l| DelayProxy::start(local(0), l, Duration::ZERO, None))
        .collect::<std::io::Result<_>>()
        .map_err(|e| format!("peer proxy: {e}"))?;
    let ids = ["a", "b"];
    let members: Vec<String> = ids
        .iter()
        .zip(&proxies)
        .map(|(id, p)| format!("{{ id = \"{id}\", addr = \"{}\" }}", p.local_addr()))
        .collect();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut settings = store.settings_via(store_proxy.local_addr());
            settings.request_timeout = Duration::from_secs(30);
            let mut cfg = AgentSettings::new_s3(
                512 << 20,
                S3Dataset {
                    name: DATASET.to_owned(),
                    settings,
                    prefix: String::new(),
                    extra: Vec::new(),
                },
            );
            cfg.max_inflight_reads = 64;
            for line in [
                "membership = \"static\"".to_string(),
                "job_id = \"why\"".to_string(),
                format!("node_id = \"{}\"", ids[i]),
                format!("listen = \"{}\"", listen[i]),
                format!("members = [{}]", members.join(", ")),
                format!("secret = \"{}\"", PEER_SECRET),
                "encryption = \"off\"".to_string(),
            ] {
                cfg.extra.push(("peers".to_string(), line));
            }
            Agent::start(&cfg).map_err(|e| format!("agent {}: {e}", ids[i]))
        })
        .collect::<Result<_>>()?;
    // An epoch on B: each agent reads, and keeps, the samples it owns.
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 7;
    opts.batch_size = batch;
    opts.epoch_count = 1;
    opts.open_timeout = Duration::from_secs(120);
    let client_b = Client::connect(agents[1].socket()).map_err(|e| format!("connect: {e}"))?;
    let mut warm = client_b
        .open_session(&opts)
        .map_err(|e| format!("open: {e}"))?;
    let mut warmed = 0u64;
    loop {
        match warm.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => warmed += b.len() as u64,
            Err(e) if e.code() == granary::ErrorCode::EndOfStream => break,
            Err(e) => return Err(format!("warm-up epoch on B: {e}")),
        }
    }
    drop(warm);
    if agents.iter().any(|a| peers_up(a) < 1.0) {
        return Err("after the warm-up epoch the two agents are not connected".into());
    }
    println!("peer        warm-up: {warmed} samples read through B; now the store 100 ms and the peer link {} ms each way, {mbps} Mbit/s", peer_delay.as_millis());
    store_proxy.set_delay(Duration::from_millis(100));
    for p in &proxies {
        p.set_delay(peer_delay);
        p.set_bandwidth_mbps(Some(mbps));
    }
    let client_a = Client::connect(agents[0].socket()).map_err(|e| format!("connect: {e}"))?;
    opts.epoch_count = 1000;
    let mut session = client_a
        .open_session(&opts)
        .map_err(|e| format!("open: {e}"))?;
    let start = Instant::now();
    let mut before: Option<[f64; 6]> = None;
    let mut batches = 0u64;
    while start.elapsed() < Duration::from_secs(warmup + seconds) {
        if before.is_none() && start.elapsed() >= Duration::from_secs(warmup) {
            before = Some(verdicts(&agents[0]));
        }
        let b = session
            .next_batch(Some(Duration::from_secs(60)))
            .map_err(|e| format!("next_batch: {e}"))?;
        batches += 1;
        drop(b);
        std::thread::sleep(Duration::from_millis(5));
    }
    let share = report(
        "peer",
        batches,
        &before.unwrap_or([0.0; 6]),
        &verdicts(&agents[0]),
    );
    drop(session);
    for a in agents {
        a.stop().map_err(|e| format!("agent stop: {e}"))?;
    }
    Ok(share)
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

/// Peers of `agent` whose connection is up.
fn peers_up(agent: &Agent) -> f64 {
    agent
        .series()
        .iter()
        .filter(|(k, _)| k.starts_with("granary_peer_up{"))
        .map(|(_, v)| v)
        .sum()
}

/// Prints and returns the share of the measured intervals (`after` less
/// `before`) whose verdict is `name`.
fn report(name: &str, batches: u64, before: &[f64; 6], after: &[f64; 6]) -> f64 {
    let counts: BTreeMap<&str, f64> = VERDICTS
        .iter()
        .zip(after.iter().zip(before))
        .map(|(v, (a, b))| (*v, a - b))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let total: f64 = counts.values().sum();
    let hit = counts.get(name).copied().unwrap_or(0.0);
    let share = if total > 0.0 { hit / total } else { 0.0 };
    println!(
        "{:<11} {} batches; intervals by verdict {:?}: {:.1} % name the injected cause ({})",
        name,
        batches,
        counts,
        100.0 * share,
        Goal::at_least("goal", GOAL).verdict(share)
    );
    share
}

/// Runs one scenario; returns the share of measured intervals whose verdict
/// names it.
fn scenario(
    store: &LightStore,
    sc: &Scenario,
    batch: u32,
    warmup: u64,
    seconds: u64,
) -> Result<f64> {
    let proxy = DelayProxy::start(local(0), store.addr(), sc.delay, None)
        .map_err(|e| format!("delay proxy: {e}"))?;
    let mut settings = store.settings_via(proxy.local_addr());
    settings.request_timeout = Duration::from_secs(30);
    let dataset = S3Dataset {
        name: DATASET.to_owned(),
        settings,
        prefix: String::new(),
        extra: Vec::new(),
    };
    let mut cfg = AgentSettings::new_s3(1 << 30, dataset);
    cfg.max_inflight_reads = sc.inflight;
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 7;
    opts.batch_size = batch;
    opts.epoch_count = 1000;
    opts.open_timeout = Duration::from_secs(120);
    let mut session = client
        .open_session(&opts)
        .map_err(|e| format!("open: {e}"))?;
    let start = Instant::now();
    let mut before: Option<[f64; 6]> = None;
    let mut batches = 0u64;
    while start.elapsed() < Duration::from_secs(warmup + seconds) {
        if before.is_none() && start.elapsed() >= Duration::from_secs(warmup) {
            before = Some(verdicts(&agent));
        }
        let b = session
            .next_batch(Some(Duration::from_secs(60)))
            .map_err(|e| format!("next_batch: {e}"))?;
        batches += 1;
        drop(b);
        match sc.inject {
            Inject::Sleep(d) => std::thread::sleep(d),
            Inject::Spin(d) => {
                let t = Instant::now();
                while t.elapsed() < d {
                    std::hint::spin_loop();
                }
            }
        }
    }
    let share = report(
        sc.name,
        batches,
        &before.unwrap_or([0.0; 6]),
        &verdicts(&agent),
    );
    drop(session);
    agent.stop().map_err(|e| format!("agent stop: {e}"))?;
    Ok(share)
}

/// `granary_rank_verdicts_total` of rank 0, in [`VERDICTS`] order.
fn verdicts(agent: &Agent) -> [f64; 6] {
    let mut out = [0.0; 6];
    for (k, v) in agent.series() {
        if !k.starts_with("granary_rank_verdicts_total{") || !k.contains("rank=\"0\"") {
            continue;
        }
        if let Some(i) = VERDICTS
            .iter()
            .position(|x| k.contains(&format!("verdict=\"{x}\"")))
        {
            out[i] = v;
        }
    }
    out
}
