//! Attacks on the peer tier by a stranger, a relay, a tap, flooding peers and another uid, against two release granaryd on loopback: what leaks, what breaks, what it costs
//!
//! Two real `granaryd` processes, A on 127.0.0.2 and B on 127.0.0.3, share
//! a synthetic dataset on disk through a static view (encryption on);
//! loaders on each read epoch after epoch and check every sample's bytes.
//! A's and B's addresses in the view point at switches (127.0.0.10 and
//! 127.0.0.4) that forward to them, so that every connection between the
//! two crosses one, and a tap, a corrupting relay or an attacker playing B
//! can be put on the path at run time. The view has a third member, `p`,
//! which keeps nothing: the legitimate peer whose service the floods must
//! not stop, and the member whose id the authenticated attackers use. Then each attack runs as an outside
//! process would (`granary_bench::floods`, `granary_bench::peer_client`),
//! and the figures the issue's goals name are measured: bytes and samples
//! an outsider reads in clear, wrong samples delivered, the agent's
//! resident memory before and at the peak of each flood, its loaders'
//! batches per second before and during, how soon a legitimate peer gets
//! blocks during each flood, what the log grew by. Another uid's views are
//! tried on a third agent (`membership = "session"`, needs root). Last,
//! the pair is restarted with `encryption = "off"` and tapped again, to
//! show the tap sees samples when they travel in clear.
//!
//! Every goal is printed as met / not met with what decided it; the last
//! line is one JSON object. `--smoke`: a small dataset, short attacks,
//! 1,000 flood connections, shorter peer timeouts; what
//! `bench/tests/attacks_smoke.rs` runs.

use granary::{encode_view, Client, ErrorCode, SessionOptions, ViewMember};
use granary_bench::attack_agent::{find_granaryd, rejected_delta, sum_of, AgentProc, Rss};
use granary_bench::attack_loader::{Loader, LoaderPlan};
use granary_bench::cli::Args;
use granary_bench::corrupt_proxy::{Corrupt, CorruptingProxy};
use granary_bench::data;
use granary_bench::floods;
use granary_bench::peer_client::{self, PeerClient};
use granary_bench::report::Json;
use granary_bench::sample_windows::SampleWindows;
use granary_bench::switch_proxy::{Capture, SwitchProxy};
use granary_bench::sys;
use granary_peer::channel::{Preamble, Protection, Suite};
use granary_peer::conn::{Conn, ConnConfig, Transmit};
use granary_peer::frame::{Frame, Get, Hello, PROTOCOL_VERSION};
use granary_tools::synth::{self, SynthSpec};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

const DATASET: &str = "data";
const JOB: &str = "attacks";
const SECRET: &str = "3f6d0c1e9a5b47d2886e01f4b2a7c95d7e13b0c4a9f25d6e8b71c03a4f9d2e61";
const OTHER_SECRET: &str = "a0c6e1f7b39d4825c1e07a9b6f3d2c48e5b17a0d9c3f6e2b8a4d1c7f05e93b26";
/// Memory a flood may add to the agent's resident set (the issue's goal).
const RSS_BOUND: u64 = 128 << 20;
/// How soon a legitimate peer must get a block during a flood.
const PEER_BOUND: Duration = Duration::from_secs(5);
/// A loader "keeps being served" when no batch waits longer than this.
const SERVED_BOUND: Duration = Duration::from_secs(10);
/// Log bytes one flood may add.
const LOG_BOUND: u64 = 1 << 20;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}
const A_IP: u8 = 2;
const B_IP: u8 = 3;
const SWITCH_B_IP: u8 = 4;
const SWITCH_A_IP: u8 = 10;
/// The legitimate member `p`: its probes dial A from here; its view
/// address (port 9) refuses connections.
const P_IP: u8 = 11;
const OWNER_IP: u8 = 5;
const MEMBER_IP: u8 = 6;
const VIEWS_IP: u8 = 7;
const SPLICE_IP: u8 = 8;
const STRANGER_IP: u8 = 9;

const USAGE: &str = "usage: bench/run attacks [options]
  --samples N      files in the dataset (default 400)
  --mean-kib K     their mean size in KiB (default 64)
  --loaders L      loaders on each agent (default 1)
  --flood N        unauthenticated connections of the flood (default 10000)
  --flood-ips K    source IPs they come from, 127.0.1.1..K (default 40)
  --attack-s S     seconds each flood lasts (default 12; the non-reading one
                   at least peers.write_timeout_ms + 2 s)
  --smoke          short: 1,000 flood connections, 3 s attacks, shorter peer timeouts
  --keep           keep the work folder (configurations, agents' logs)
Runs as any user; another uid's views are tried only as root (else reported
as not run). Needs granaryd next to this binary (bench/run builds it).";

struct Opts {
    samples: u64,
    mean: u64,
    loaders: u32,
    flood: u64,
    flood_ips: u8,
    attack: Duration,
    smoke: bool,
    keep: bool,
}

impl Opts {
    fn parse() -> Result<Opts> {
        let a = Args::parse(std::env::args().skip(1), &["smoke", "keep"], USAGE)?;
        let smoke = a.flag("smoke");
        let d = |full: u64, small: u64| if smoke { small } else { full };
        let ips = a.u64("flood-ips", 40)?;
        if !(1..=250).contains(&ips) {
            return Err("--flood-ips: 1 to 250".into());
        }
        Ok(Opts {
            samples: a.u64("samples", 400)?.max(16),
            mean: a.u64("mean-kib", 64)?.max(2) * 1024,
            loaders: a.u32("loaders", 1)?.max(1),
            flood: a.u64("flood", d(10_000, 1_000))?,
            flood_ips: ips as u8,
            attack: Duration::from_secs(a.u64("attack-s", d(12, 3))?.max(1)),
            smoke,
            keep: a.flag("keep"),
        })
    }

    /// `[peers]` timeouts: the defaults, shorter in a smoke run.
    fn peer_timeouts(&self) -> &'static str {
        if self.smoke {
            "write_timeout_ms = 2000\nblock_timeout_ms = 1000\n"
        } else {
            ""
        }
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_secs(if self.smoke { 2 } else { 10 })
    }

    fn block_timeout(&self) -> Duration {
        Duration::from_secs(if self.smoke { 1 } else { 5 })
    }

    /// Quiet time before each flood (the loaders' rate before it).
    fn before(&self) -> Duration {
        Duration::from_secs(if self.smoke { 2 } else { 4 })
    }

    /// Time after each flood before the memory is read again.
    fn settle(&self) -> Duration {
        Duration::from_secs(if self.smoke { 1 } else { 3 })
    }
}

// ---------------------------------------------------------------- goals

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Goal {
    /// A stranger, a relay or a tap reads 0 samples in clear and causes 0
    /// wrong samples.
    Clear,
    /// Floods: memory, loaders served, a legitimate peer within 5 s.
    Floods,
    /// Another uid's views are refused.
    Views,
    /// No loader times out.
    Timeouts,
}

const GOALS: [(Goal, &str, &str); 4] = [
    (
        Goal::Clear,
        "clear",
        "a stranger, a relay or a tap reads 0 samples in clear and causes 0 wrong samples",
    ),
    (
        Goal::Floods,
        "floods",
        "floods leave the agent's memory <= 128 MiB above its baseline; its loaders keep being \
         served, and a legitimate peer gets blocks within 5 s",
    ),
    (Goal::Views, "views", "another uid's views are refused"),
    (Goal::Timeouts, "timeouts", "no loader times out"),
];

struct Check {
    goal: Goal,
    ok: bool,
    what: String,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
    not_run: Vec<(Goal, String)>,
    json: Vec<(String, String)>,
}

impl Report {
    fn check(&mut self, goal: Goal, ok: bool, what: String) {
        println!("    [{}] {what}", if ok { "ok" } else { "NOT MET" });
        self.checks.push(Check { goal, ok, what });
    }

    fn section(&mut self, key: &str, j: &Json) {
        self.json.push((key.to_owned(), j.line()));
    }
}

// ---------------------------------------------------------------- setup

struct Ctx {
    opts: Opts,
    spec: SynthSpec,
    windows: SampleWindows,
    bin: PathBuf,
    work: PathBuf,
    /// Loaders of every pair run so far (their totals are judged at the end).
    retired: Vec<Loader>,
}

fn free_port(ip: IpAddr) -> Result<u16> {
    TcpListener::bind(SocketAddr::new(ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port on {ip}: {e}"))
}

/// Two agents of one job and their loaders.
struct Pair {
    a: AgentProc,
    b: AgentProc,
    a_peer: SocketAddr,
    b_peer: SocketAddr,
    digest: [u8; 32],
    fingerprint: u64,
    protection: Protection,
    loaders: Vec<Loader>,
}

impl Pair {
    fn a_loaders(&self) -> impl Iterator<Item = &Loader> {
        self.loaders.iter().filter(|l| l.name.starts_with('A'))
    }

    /// What an attacker holding the secret and member `node`'s id says.
    fn member(&self, node: &str, expect: Option<&str>) -> ConnConfig {
        let mut c = ConnConfig::new(
            JOB,
            node,
            self.digest,
            u64::from_le_bytes(peer_client::entropy()[..8].try_into().unwrap_or([0; 8])),
            SECRET,
        );
        c.expected_peer = expect.map(str::to_owned);
        c.protection = self.protection;
        c
    }
}

#[allow(clippy::too_many_arguments)]
fn agent_toml(
    ctx: &Ctx,
    id: &str,
    sock: &Path,
    listen: SocketAddr,
    metrics: SocketAddr,
    members: &str,
    encryption: bool,
) -> String {
    format!(
        r#"[arena]
size = "64MiB"
hugepages = "off"
populate = true
[socket]
path = "{sock}"
[prefetch]
max_inflight_reads = 32
window_batches = 4
initial_window = 2
[metrics]
address = "{metrics}"
[peers]
membership = "static"
job_id = "{JOB}"
node_id = "{id}"
listen = "{listen}"
members = [{members}]
secret = "{SECRET}"
keep_percent = 90
encryption = "{enc}"
{timeouts}[[dataset]]
name = "{DATASET}"
root = "{root}"
"#,
        sock = sock.display(),
        enc = if encryption { "on" } else { "off" },
        timeouts = ctx.opts.peer_timeouts(),
        root = ctx.spec.root.display(),
    )
}

/// The two switches every connection between A and B crosses: `to_a`
/// where A's view address points, `to_b` where B's.
struct Paths {
    to_a: SwitchProxy,
    to_b: SwitchProxy,
}

impl Paths {
    /// Both lead to their agent (recording or not).
    fn forward(&self, pair: &Pair, record: bool) {
        self.to_a.set(pair.a_peer, record);
        self.to_b.set(pair.b_peer, record);
    }

    /// What both recorded, taken.
    fn take(&self) -> Capture {
        let mut c = self.to_a.take_capture();
        let d = self.to_b.take_capture();
        c.to_upstream.extend_from_slice(&d.to_upstream);
        c.to_dialer.extend_from_slice(&d.to_dialer);
        c.openings.extend(d.openings);
        c
    }
}

fn start_pair(ctx: &Ctx, paths: &Paths, encryption: bool, tag: &str) -> Result<Pair> {
    let a_peer = SocketAddr::new(ip(A_IP), free_port(ip(A_IP))?);
    let b_peer = SocketAddr::new(ip(B_IP), free_port(ip(B_IP))?);
    let a_metrics = SocketAddr::new(ip(A_IP), free_port(ip(A_IP))?);
    let b_metrics = SocketAddr::new(ip(B_IP), free_port(ip(B_IP))?);
    paths.to_a.set(a_peer, false);
    paths.to_b.set(b_peer, false);
    let members = format!(
        "{{ id = \"a\", addr = \"{}\" }}, {{ id = \"b\", addr = \"{}\" }}, \
         {{ id = \"p\", addr = \"{}:9\", keep = \"1KiB\" }}",
        paths.to_a.addr(),
        paths.to_b.addr(),
        ip(P_IP)
    );
    let a_sock = ctx.work.join(format!("a{tag}.sock"));
    let b_sock = ctx.work.join(format!("b{tag}.sock"));
    let a_toml = agent_toml(ctx, "a", &a_sock, a_peer, a_metrics, &members, encryption);
    let b_toml = agent_toml(ctx, "b", &b_sock, b_peer, b_metrics, &members, encryption);
    let a = AgentProc::start(
        &ctx.bin,
        &format!("A{tag}"),
        &ctx.work,
        &a_toml,
        &a_sock,
        a_metrics,
        None,
    )?;
    let b = AgentProc::start(
        &ctx.bin,
        &format!("B{tag}"),
        &ctx.work,
        &b_toml,
        &b_sock,
        b_metrics,
        None,
    )?;
    let id = |sock: &Path| {
        Client::connect(sock)
            .and_then(|c| c.peer_identity(Duration::from_secs(10)))
            .map_err(|e| format!("{}: peer identity: {e}", sock.display()))
    };
    let (ia, ib) = (id(&a_sock)?, id(&b_sock)?);
    if ia.view_digest != ib.view_digest || ia.members != 3 {
        return Err(format!("A and B hold different views: {ia:?} {ib:?}"));
    }
    let cfg = granary_agent::config::Config::from_toml_str(&a_toml)
        .map_err(|e| format!("A's configuration: {e}"))?;
    let src = granary_agent::source::open(&cfg.datasets[0], &cfg)
        .map_err(|e| format!("the dataset: {e}"))?;
    let fingerprint = granary_agent::peers::fingerprint(DATASET, &*src);
    let mut loaders = Vec::new();
    for (name, sock) in [("A", &a_sock), ("B", &b_sock)] {
        for k in 0..ctx.opts.loaders {
            loaders.push(Loader::spawn(
                &format!("{name}{k}{tag}"),
                LoaderPlan {
                    sock: sock.clone(),
                    dataset: DATASET.into(),
                    spec: ctx.spec.clone(),
                    seed: 11 + u64::from(k) + if name == "A" { 0 } else { 100 },
                    batch: 16,
                    pause: Duration::from_millis(20),
                },
            ));
        }
    }
    Ok(Pair {
        a,
        b,
        a_peer,
        b_peer,
        digest: ia.view_digest,
        fingerprint,
        protection: if encryption {
            Protection::Encrypted
        } else {
            Protection::Authenticated
        },
        loaders,
    })
}

/// Waits until every loader has read `epochs` epochs (or `limit` passed).
fn warm_up(ctx: &Ctx, pair: &Pair, epochs: u64, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let least = pair
            .loaders
            .iter()
            .map(|l| l.stats.samples.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        if least >= epochs * ctx.spec.num_files {
            return Ok(());
        }
        for l in &pair.loaders {
            if let Ok(e) = l.stats.errors.lock() {
                if let Some((_, what)) = e.first() {
                    return Err(format!("loader {}: {what}", l.name));
                }
            }
        }
        if Instant::now() > end {
            return Err(format!(
                "the loaders did not read {epochs} epochs in {limit:?}\nA:\n{}\nB:\n{}",
                pair.a.log_tail(),
                pair.b.log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tiers(a: &AgentProc) -> (f64, f64, f64) {
    let s = a.series();
    let t = |tier: &str| {
        sum_of(
            &s,
            "granary_tier_samples_total",
            &format!("tier=\"{tier}\""),
        )
    };
    (t("arena"), t("peer"), t("store"))
}

/// Gets of every sample (request ids from `first`), due in 10 s.
fn gets_of(ctx: &Ctx, fingerprint: u64, ids: &[u64], first: u64) -> Vec<Get> {
    ids.iter()
        .enumerate()
        .map(|(k, &s)| Get {
            request: first + k as u64,
            fingerprint,
            sample: s,
            length: ctx.spec.size_of(s),
            due: 10_000_000_000,
        })
        .collect()
}

/// How soon the legitimate peer dials again after a refused dial (an
/// agent's first 5 s: 50 ms; later 1 s).
const REDIAL: Duration = Duration::from_millis(100);

/// A legitimate member's fetch from A (as `p`, from its address): the
/// samples it got right, how many blocks were wrong, when the first came
/// (from the first dial; a refused dial is tried again every 100 ms).
struct PeerFetch {
    good: Vec<u64>,
    wrong: usize,
    first_block: Option<Duration>,
    error: Option<String>,
}

fn legit_fetch(ctx: &Ctx, pair: &Pair, ids: &[u64], timeout: Duration) -> PeerFetch {
    let start = Instant::now();
    // As an agent does, a refused dial is tried again shortly.
    let mut c = loop {
        let left = timeout.saturating_sub(start.elapsed());
        match PeerClient::dial(
            pair.a_peer,
            Some(ip(P_IP)),
            None,
            pair.member("p", Some("a")),
            left,
        ) {
            Ok(c) => break c,
            Err(e) if start.elapsed() + REDIAL >= timeout => {
                return PeerFetch {
                    good: Vec::new(),
                    wrong: 0,
                    first_block: None,
                    error: Some(format!("dial: {e}")),
                }
            }
            Err(_) => std::thread::sleep(REDIAL),
        }
    };
    let dialled = start.elapsed();
    let f = c.fetch(
        pair.fingerprint,
        &gets_of(ctx, pair.fingerprint, ids, 1),
        timeout.saturating_sub(dialled),
    );
    let mut good = Vec::new();
    let mut wrong = 0;
    for (s, b, ok) in &f.blocks {
        if *ok && b.as_slice() == ctx.windows.content(*s) {
            good.push(*s);
        } else {
            wrong += 1;
        }
    }
    PeerFetch {
        good,
        wrong,
        first_block: f.first_block.map(|d| dialled + d),
        error: f.closed,
    }
}

// ---------------------------------------------------------------- main

fn main() {
    if let Some(pos) = std::env::args().position(|a| a == "--views-stranger") {
        let sock = std::env::args().nth(pos + 1).unwrap_or_default();
        std::process::exit(views_child(Path::new(&sock)));
    }
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("attacks: {e}");
            std::process::exit(2);
        }
    }
}

fn run() -> Result<bool> {
    let opts = Opts::parse()?;
    let started = Instant::now();
    let regime = sys::regime();
    println!("regime at start: {regime}");
    let fds = floods::raise_fd_limit();
    println!("open files allowed: {fds}");
    let root = sys::is_root();
    let bin = find_granaryd()?;
    let mut spec = data::spec(opts.samples, opts.mean, 8);
    spec.root = data::data_root().join(format!("attacks-{}x{}", opts.samples, opts.mean));
    let ds = data::ensure(&spec).map_err(|e| format!("dataset: {e}"))?;
    println!(
        "dataset: {} files, {:.1} MB, under {}",
        ds.len(),
        ds.bytes as f64 / 1e6,
        spec.root.display()
    );
    let work = std::env::temp_dir().join(format!("granary-attacks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let mut ctx = Ctx {
        windows: SampleWindows::new(&spec),
        spec,
        bin,
        work,
        opts,
        retired: Vec::new(),
    };
    let mut r = Report::default();
    let result = attacks(&mut ctx, &mut r, root);
    for l in &mut ctx.retired {
        l.stop();
    }
    if let Err(e) = &result {
        println!("\nthe run stopped: {e}");
    }
    let ok = finish(&ctx, &mut r, &regime, started, result.err());
    if ctx.opts.keep {
        eprintln!("work folder kept: {}", ctx.work.display());
    } else {
        let _ = std::fs::remove_dir_all(&ctx.work);
    }
    Ok(ok)
}

fn attacks(ctx: &mut Ctx, r: &mut Report, root: bool) -> Result<()> {
    let switch = |last: u8| {
        SwitchProxy::start(SocketAddr::new(ip(last), 0), 64 << 20)
            .map_err(|e| format!("switch: {e}"))
    };
    let paths = Paths {
        to_a: switch(SWITCH_A_IP)?,
        to_b: switch(SWITCH_B_IP)?,
    };
    println!(
        "\n== agents A (127.0.0.2) and B (127.0.0.3), encryption on; their view addresses are \
         the switches {} and {}; member p (keeps nothing) probes from 127.0.0.11",
        paths.to_a.addr(),
        paths.to_b.addr()
    );
    let mut pair = start_pair(ctx, &paths, true, "")?;
    let result = attacks_on(ctx, r, root, &paths, &pair);
    // Their loaders' figures are judged at the end, whatever happened.
    retire(ctx, &mut pair);
    drop(pair);
    result?;
    // The same pair in clear: the tap must see samples.
    println!("\n== agents A and B again, encryption off");
    let mut off = start_pair(ctx, &paths, false, "-off")?;
    let warm = warm_up(ctx, &off, 1, Duration::from_secs(120));
    if warm.is_ok() {
        let (j, found) = tap(ctx, &off, &paths, r, "tap in clear");
        r.check(
            Goal::Clear,
            found > 0,
            format!(
                "with encryption off the same tap finds {found} samples in clear (it must find \
                 some, or the tap proves nothing)"
            ),
        );
        r.section("tap_off", &j);
    }
    retire(ctx, &mut off);
    warm
}

/// The attacks on the pair with encryption on.
fn attacks_on(ctx: &Ctx, r: &mut Report, root: bool, paths: &Paths, pair: &Pair) -> Result<()> {
    warm_up(ctx, pair, 2, Duration::from_secs(180))?;
    let (ar, ap, st) = tiers(&pair.a);
    println!("  warm: A's samples so far: arena {ar}, peer {ap}, store {st}");
    if ap == 0.0 {
        return Err("A got no sample from B while warming up: the peer tier is idle".into());
    }
    // What A keeps: ask A for every sample as B would.
    let all: Vec<u64> = (0..ctx.spec.num_files).collect();
    let probe = legit_fetch(ctx, pair, &all, Duration::from_secs(60));
    println!(
        "  A serves {} of {} samples to member p ({} wrong blocks, the first after {:?}{})",
        probe.good.len(),
        ctx.spec.num_files,
        probe.wrong,
        probe.first_block,
        probe
            .error
            .as_deref()
            .map(|e| format!(", {e}"))
            .unwrap_or_default()
    );
    let kept = probe.good;
    if kept.is_empty() {
        return Err("A serves no sample to member p".into());
    }
    strangers(ctx, pair, r);
    splice(ctx, pair, paths, r)?;
    let (j, _) = tap(ctx, pair, paths, r, "tap");
    r.section("tap", &j);
    relay(ctx, pair, paths, r)?;
    run_floods(ctx, pair, paths, &kept, r)?;
    if root && !ctx.opts.smoke {
        if let Err(e) = views(ctx, r) {
            r.check(
                Goal::Views,
                false,
                format!("the views attack could not run: {e}"),
            );
        }
    } else {
        let why = if ctx.opts.smoke {
            "smoke run"
        } else {
            "needs root to run a loader as uid 65534"
        };
        println!("\n== another uid's views: NOT RUN ({why})");
        r.not_run.push((Goal::Views, why.to_owned()));
        let mut j = Json::default();
        j.str("verdict", "not run").str("why", why);
        r.section("views", &j);
    }
    Ok(())
}

fn retire(ctx: &mut Ctx, pair: &mut Pair) {
    for mut l in pair.loaders.drain(..) {
        l.stop();
        ctx.retired.push(l);
    }
}

// ---------------------------------------------------------------- 1, 6: strangers

fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.extend_from_slice(&peer_client::entropy());
    }
    out.truncate(n);
    out
}

/// A hello as format 1 framed it: frame version 1, protocol version 1, in
/// clear.
fn format1_hello(digest: [u8; 32]) -> Vec<u8> {
    let mut b = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        job_id: JOB.into(),
        node_id: "b".into(),
        view_digest: digest,
        incarnation: 7,
    })
    .to_bytes()
    .unwrap_or_default();
    if b.len() > 10 {
        b[0] = 1;
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
    }
    b
}

/// The bytes a dialer with `cfg` sends first (preamble and message 1).
fn dialer_opening(cfg: ConnConfig) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(mut c) = Conn::dial(cfg, peer_client::entropy(), 0) {
        while let Some(Transmit::Bytes(b)) = c.poll_transmit() {
            out.extend_from_slice(&b);
        }
    }
    out
}

fn strangers(ctx: &Ctx, pair: &Pair, r: &mut Report) {
    println!(
        "\n== 1. strangers at A's peer port {} (from 127.0.0.9)",
        pair.a_peer
    );
    let preamble = Preamble {
        suite: Suite::fastest_here(),
        protection: Protection::Encrypted,
    }
    .encode()
    .to_vec();
    let mut wrong = pair.member("b", Some("a"));
    wrong.secret = OTHER_SECRET.as_bytes().to_vec();
    let mut wrong_clear = wrong.clone();
    wrong_clear.protection = Protection::Authenticated;
    let mut message = preamble.clone();
    message.extend_from_slice(&96u16.to_be_bytes());
    message.extend_from_slice(&random_bytes(96));
    let mut garbage = preamble.clone();
    garbage.extend_from_slice(&random_bytes(4096));
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("text", b"GET / HTTP/1.1\r\nHost: granary\r\n\r\n".to_vec()),
        ("format1_hello", format1_hello(pair.digest)),
        ("random", random_bytes(4096)),
        ("preamble_then_garbage", garbage),
        ("preamble_then_random_message", message),
        ("wrong_secret", dialer_opening(wrong.clone())),
        ("wrong_secret_in_clear", dialer_opening(wrong_clear)),
        ("silent", Vec::new()),
    ];
    let mut j = Json::default();
    let mut total = 0usize;
    let mut found = BTreeSet::new();
    let mut all_closed = true;
    for (name, bytes) in &variants {
        let before = pair.a.series();
        let p = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            bytes,
            Duration::from_secs(6),
        );
        let after = pair.a.series();
        let delta = rejected_delta(&before, &after);
        let words: Vec<String> = delta.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut o = Json::default();
        match p {
            Ok(p) => {
                total += p.received.len();
                found.extend(ctx.windows.found_in(&p.received));
                all_closed &= p.closed;
                println!(
                    "  {name:<30} sent {:>5} B, got back {} B, {}, rejected: {}",
                    bytes.len(),
                    p.received.len(),
                    match p.closed_after {
                        Some(d) => format!("closed after {:.2} s", d.as_secs_f64()),
                        None => "still open after 6 s".into(),
                    },
                    if words.is_empty() {
                        "-".into()
                    } else {
                        words.join(" ")
                    }
                );
                o.int("sent", bytes.len() as u64)
                    .int("received", p.received.len() as u64)
                    .num(
                        "closed_after_s",
                        p.closed_after.map_or(f64::NAN, |d| d.as_secs_f64()),
                        3,
                    );
            }
            Err(e) => {
                println!("  {name:<30} could not connect: {e}");
                o.str("error", &e.to_string());
                all_closed = false;
            }
        }
        o.raw("rejected", &rejected_json(&delta));
        j.raw(name, &o.line());
    }
    r.check(
        Goal::Clear,
        total == 0 && found.is_empty(),
        format!(
            "strangers got {total} bytes back ({} samples in clear) over {} kinds of hello",
            found.len(),
            variants.len()
        ),
    );
    r.check(
        Goal::Clear,
        all_closed,
        "every stranger's connection was closed by A (the silent one at peers.connect_timeout_ms)"
            .into(),
    );
    // 6. the oracle: what a dialer with the wrong secret learns.
    let n = if ctx.opts.smoke { 20 } else { 200 };
    let before = pair.a.series();
    let t = Instant::now();
    let mut oracle_bytes = 0usize;
    for _ in 0..n {
        if let Ok(p) = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            &dialer_opening(wrong.clone()),
            Duration::from_secs(2),
        ) {
            oracle_bytes += p.received.len();
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let delta = rejected_delta(&before, &pair.a.series());
    println!(
        "  oracle: {n} dialers with a wrong secret got {oracle_bytes} bytes back ({:.0} guesses/s, \
         each an online connection; rejected: {})",
        n as f64 / secs,
        words(&delta)
    );
    r.check(
        Goal::Clear,
        oracle_bytes == 0,
        format!("a dialer with a wrong secret receives {oracle_bytes} bytes: nothing to guess offline against"),
    );
    let mut o = Json::default();
    o.int("dialers", n)
        .int("received", oracle_bytes as u64)
        .num("guesses_per_s", n as f64 / secs, 0)
        .raw("rejected", &rejected_json(&delta));
    r.section("oracle", &o);
    // The log under a stream of strangers.
    let n = if ctx.opts.smoke { 200 } else { 2000 };
    let log0 = pair.a.log_bytes();
    let before = pair.a.series();
    let t = Instant::now();
    for _ in 0..n {
        let _ = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            b"garbage",
            Duration::from_secs(2),
        );
    }
    let secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let grew = pair.a.log_bytes().saturating_sub(log0);
    let delta = rejected_delta(&before, &pair.a.series());
    println!(
        "  {n} garbage connections in {secs:.1} s: A's log grew {grew} bytes ({:.0} bytes a \
         connection); rejected: {}",
        grew as f64 / n as f64,
        words(&delta)
    );
    j.raw(
        "stream",
        &Json::default()
            .int("connections", n)
            .num("seconds", secs, 2)
            .int("log_bytes", grew)
            .raw("rejected", &rejected_json(&delta))
            .line(),
    );
    j.int("received_total", total as u64)
        .int("samples_in_clear", found.len() as u64);
    r.section("strangers", &j);
}

fn words(delta: &[(String, u64)]) -> String {
    if delta.is_empty() {
        return "-".into();
    }
    delta
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn rejected_json(delta: &[(String, u64)]) -> String {
    let mut o = Json::default();
    for (k, v) in delta {
        o.int(k, *v);
    }
    o.line()
}

// ---------------------------------------------------------------- 2: relays

/// Copies `from` to `to`, counting; stops at the end of either.
fn pipe(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn splice(ctx: &Ctx, pair: &Pair, paths: &Paths, r: &mut Report) -> Result<()> {
    println!("\n== 2. relays without the secret");
    let mut j = Json::default();
    // (a) Dial both agents and join the two connections.
    let (sa0, sb0) = (pair.a.series(), pair.b.series());
    let to_a = peer_client::connect(pair.a_peer, Some(ip(SPLICE_IP)), None, false)
        .map_err(|e| format!("splice: {e}"))?;
    let to_b = peer_client::connect(pair.b_peer, Some(ip(SPLICE_IP)), None, false)
        .map_err(|e| format!("splice: {e}"))?;
    let (a_said, b_said) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let t = Instant::now();
    let threads = [
        {
            let (f, to, c) = (
                to_a.try_clone().map_err(|e| e.to_string())?,
                to_b.try_clone().map_err(|e| e.to_string())?,
                Arc::clone(&a_said),
            );
            std::thread::spawn(move || pipe(f, to, c))
        },
        {
            let (f, to, c) = (to_b, to_a, Arc::clone(&b_said));
            std::thread::spawn(move || pipe(f, to, c))
        },
    ];
    for th in threads {
        let _ = th.join();
    }
    let secs = t.elapsed().as_secs_f64();
    let (da, db) = (
        rejected_delta(&sa0, &pair.a.series()),
        rejected_delta(&sb0, &pair.b.series()),
    );
    let (a_said, b_said) = (
        a_said.load(Ordering::Relaxed),
        b_said.load(Ordering::Relaxed),
    );
    println!(
        "  splice of two accepted connections: A said {a_said} B, B said {b_said} B; both closed \
         after {secs:.2} s (A rejected: {}; B rejected: {})",
        words(&da),
        words(&db)
    );
    r.check(
        Goal::Clear,
        a_said == 0 && b_said == 0,
        format!(
            "a splice of A's and B's listeners carries {} bytes",
            a_said + b_said
        ),
    );
    j.raw(
        "splice",
        &Json::default()
            .int("a_bytes", a_said)
            .int("b_bytes", b_said)
            .num("closed_after_s", secs, 2)
            .raw("a_rejected", &rejected_json(&da))
            .raw("b_rejected", &rejected_json(&db))
            .line(),
    );
    // (b) A dialer's opening, recorded on the path, replayed to B and to A.
    paths.forward(pair, true);
    let end = Instant::now() + Duration::from_secs(15);
    let opening = loop {
        if let Some(o) = paths.take().openings.into_iter().next() {
            break o;
        }
        if Instant::now() > end {
            return Err("neither A nor B dialled the other in 15 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    paths.forward(pair, false);
    let mut forged = opening.clone();
    forged.extend_from_slice(&200u16.to_be_bytes());
    forged.extend_from_slice(&random_bytes(200));
    let mut found = BTreeSet::new();
    // The real connections, cut above, come up again first: what comes up
    // during a replay is the replay.
    std::thread::sleep(Duration::from_secs(3));
    for (who, to, agent) in [("B", pair.b_peer, &pair.b), ("A", pair.a_peer, &pair.a)] {
        let before = agent.series();
        let log0 = agent.log_bytes();
        let p = peer_client::stranger(to, Some(ip(SPLICE_IP)), &forged, Duration::from_secs(5))
            .map_err(|e| format!("replay: {e}"))?;
        let d = rejected_delta(&before, &agent.series());
        std::thread::sleep(Duration::from_millis(200));
        let ups = agent.log_since(log0).matches("peer connection up").count();
        found.extend(ctx.windows.found_in(&p.received));
        println!(
            "  a recorded opening ({} B) replayed to {who} with a forged record: got {} B back \
             (its handshake answer; no key to read it), {} samples in clear; {who} took it for \
             the member {ups} times (\"peer connection up\"); rejected: {}",
            opening.len(),
            p.received.len(),
            ctx.windows.found_in(&p.received).len(),
            words(&d)
        );
        j.raw(
            &format!("replay_to_{}", who.to_lowercase()),
            &Json::default()
                .int("received", p.received.len() as u64)
                .int("taken_for_the_member", ups as u64)
                .int(
                    "samples_in_clear",
                    ctx.windows.found_in(&p.received).len() as u64,
                )
                .raw("rejected", &rejected_json(&d))
                .line(),
        );
    }
    r.check(
        Goal::Clear,
        found.is_empty(),
        format!(
            "replays of a recorded handshake read {} samples in clear",
            found.len()
        ),
    );
    r.section("splice", &j);
    Ok(())
}

/// Records A's path to B for a while: what crossed, and the samples found
/// in it in clear.
fn tap(ctx: &Ctx, pair: &Pair, paths: &Paths, r: &mut Report, what: &str) -> (Json, usize) {
    let secs = if ctx.opts.smoke { 4 } else { 8 };
    println!(
        "\n== 3. {what}: the forwarding proxies on the path between A and B record everything \
         for {secs} s"
    );
    let (_, p0, _) = tiers(&pair.a);
    let wrong0 = wrong_total(ctx, pair);
    paths.forward(pair, true);
    std::thread::sleep(Duration::from_secs(secs));
    let cap = paths.take();
    paths.forward(pair, false);
    let (_, p1, _) = tiers(&pair.a);
    let mut found = ctx.windows.found_in(&cap.to_dialer);
    found.extend(ctx.windows.found_in(&cap.to_upstream));
    let wrong = wrong_total(ctx, pair) - wrong0;
    println!(
        "  captured {} B from listeners to dialers and {} B the other way ({} connections); A \
         got {} samples from peers meanwhile; samples found in clear: {}",
        cap.to_dialer.len(),
        cap.to_upstream.len(),
        cap.openings.len(),
        p1 - p0,
        found.len()
    );
    if pair.protection == Protection::Encrypted {
        r.check(
            Goal::Clear,
            found.is_empty() && wrong == 0,
            format!(
                "the tap reads {} samples in clear while {} samples crossed ({wrong} wrong samples)",
                found.len(),
                p1 - p0
            ),
        );
        r.check(
            Goal::Clear,
            p1 > p0,
            format!(
                "samples crossed the tapped path ({}), so the tap was tested",
                p1 - p0
            ),
        );
    }
    let mut j = Json::default();
    j.int("seconds", secs)
        .int("bytes_to_dialers", cap.to_dialer.len() as u64)
        .int("bytes_to_listeners", cap.to_upstream.len() as u64)
        .int("peer_samples", (p1 - p0) as u64)
        .int("samples_in_clear", found.len() as u64);
    (j, found.len())
}

fn wrong_total(ctx: &Ctx, pair: &Pair) -> u64 {
    pair.loaders
        .iter()
        .chain(ctx.retired.iter())
        .map(|l| l.stats.wrong.load(Ordering::Relaxed))
        .sum()
}

fn relay(ctx: &Ctx, pair: &Pair, paths: &Paths, r: &mut Report) -> Result<()> {
    let secs = if ctx.opts.smoke { 4 } else { 8 };
    println!(
        "\n== 2c. relays on the path between A and B that replace payload bytes (a byte of every \
         block record) for {secs} s"
    );
    let corrupt = |to: SocketAddr| {
        CorruptingProxy::start(
            SocketAddr::new(ip(SWITCH_B_IP), 0),
            to,
            Corrupt::Every { every: 1, first: 0 },
        )
        .map_err(|e| format!("relay: {e}"))
    };
    let (to_a, to_b) = (corrupt(pair.a_peer)?, corrupt(pair.b_peer)?);
    let wrong0 = wrong_total(ctx, pair);
    paths.to_a.set(to_a.addr(), true);
    paths.to_b.set(to_b.addr(), true);
    // Blocks that crossed the honest connections just before the cut are
    // counted by A a moment later: the baseline is read once they have
    // settled, so only what crossed the relays is weighed.
    std::thread::sleep(Duration::from_millis(500));
    let s0 = pair.a.series();
    std::thread::sleep(Duration::from_secs(secs));
    let cap = paths.take();
    paths.forward(pair, false);
    let (blocks, changed) = (
        to_a.blocks() + to_b.blocks(),
        to_a.corrupted() + to_b.corrupted(),
    );
    let s1 = pair.a.series();
    let wrong = wrong_total(ctx, pair) - wrong0;
    let d = rejected_delta(&s0, &s1);
    let peer = sum_of(&s1, "granary_tier_samples_total", "tier=\"peer\"")
        - sum_of(&s0, "granary_tier_samples_total", "tier=\"peer\"");
    let crc = sum_of(&s1, "granary_peer_crc_failures_total", "")
        - sum_of(&s0, "granary_peer_crc_failures_total", "");
    let mut found = ctx.windows.found_in(&cap.to_dialer);
    found.extend(ctx.windows.found_in(&cap.to_upstream));
    println!(
        "  the relays saw {blocks} block records and changed {changed}; A rejected: {}; block CRC \
         failures {crc}; samples A took from peers meanwhile {peer}; wrong samples delivered \
         {wrong}; samples in clear on the path {}",
        words(&d),
        found.len()
    );
    r.check(
        Goal::Clear,
        wrong == 0 && found.is_empty() && peer == 0.0,
        format!(
            "relays changing {changed} records caused {wrong} wrong samples, {peer} samples \
             accepted from them, and read {} samples in clear",
            found.len()
        ),
    );
    r.check(
        Goal::Clear,
        changed > 0,
        format!("the relays changed {changed} block records, so the attack was tested"),
    );
    let mut j = Json::default();
    j.int("seconds", secs)
        .int("block_records", blocks)
        .int("changed", changed)
        .int("wrong_samples", wrong)
        .int("peer_samples_accepted", peer as u64)
        .int("crc_failures", crc as u64)
        .int("samples_in_clear", found.len() as u64)
        .raw("rejected", &rejected_json(&d));
    r.section("relay", &j);
    Ok(())
}

// ---------------------------------------------------------------- 4: floods

/// What every flood is judged on.
struct FloodFigures {
    rss0: Rss,
    peak: Rss,
    after: Rss,
    log_bytes: u64,
    rejected: Vec<(String, u64)>,
    /// Per A loader: batches/s before and during, longest wait during.
    loaders: Vec<(String, f64, f64, Duration)>,
    loader_errors: usize,
    /// Probes: time to the first block (None: none within 10 s), wrong blocks.
    probes: Vec<(Option<Duration>, usize, Option<String>)>,
    /// Samples the real B got from peers during the flood.
    b_peer_samples: f64,
    seconds: f64,
    /// How long after the flood `after` was taken.
    settle: Duration,
}

fn flood<T: Send>(
    ctx: &Ctx,
    pair: &Pair,
    kept: &[u64],
    dur: Duration,
    attack: impl FnOnce(&AtomicBool) -> T + Send,
) -> (T, FloodFigures) {
    let t0 = Instant::now();
    std::thread::sleep(ctx.opts.before());
    let t1 = Instant::now();
    let rss0 = pair.a.rss();
    let log0 = pair.a.log_bytes();
    let s0 = pair.a.series();
    let b0 = sum_of(
        &pair.b.series(),
        "granary_tier_samples_total",
        "tier=\"peer\"",
    );
    let errors0: usize = pair.a_loaders().map(|l| l.stats.error_count()).sum();
    let stop = AtomicBool::new(false);
    let stop_watch = AtomicBool::new(false);
    let pid = pair.a.pid();
    let (out, peak, probes) = std::thread::scope(|s| {
        let attacker = s.spawn(|| attack(&stop));
        let watcher = s.spawn(|| {
            let mut peak = Rss::default();
            while !stop_watch.load(Ordering::Relaxed) {
                let now = granary_bench::attack_agent::rss_of(pid);
                peak.total = peak.total.max(now.total);
                peak.anon = peak.anon.max(now.anon);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        let prober = s.spawn(|| {
            let mut out = Vec::new();
            floods::sleep_until_stop(&stop, Duration::from_secs(1));
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<u64> = (0..4).map(|i| kept[(k + i * 7) % kept.len()]).collect();
                k += 1;
                let f = legit_fetch(ctx, pair, &ids, Duration::from_secs(10));
                out.push((f.first_block, f.wrong, f.error));
                floods::sleep_until_stop(&stop, Duration::from_secs(1));
            }
            out
        });
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let out = attacker.join();
        let probes = prober.join().unwrap_or_default();
        stop_watch.store(true, Ordering::Relaxed);
        let peak = watcher.join().unwrap_or_default();
        (out, peak, probes)
    });
    let out = match out {
        Ok(o) => o,
        Err(_) => panic!("an attack thread panicked"),
    };
    let t2 = Instant::now();
    let s1 = pair.a.series();
    let log_bytes = pair.a.log_bytes().saturating_sub(log0);
    let b1 = sum_of(
        &pair.b.series(),
        "granary_tier_samples_total",
        "tier=\"peer\"",
    );
    let loaders = pair
        .a_loaders()
        .map(|l| {
            let (nb, _) = l.stats.window(t0, t1);
            let (nd, longest) = l.stats.window(t1, t2);
            (
                l.name.clone(),
                nb as f64 / (t1 - t0).as_secs_f64(),
                nd as f64 / (t2 - t1).as_secs_f64(),
                longest,
            )
        })
        .collect();
    let loader_errors = pair
        .a_loaders()
        .map(|l| l.stats.error_count())
        .sum::<usize>()
        - errors0;
    std::thread::sleep(ctx.opts.settle());
    let after = pair.a.rss();
    let peak = Rss {
        total: peak.total.max(rss0.total),
        anon: peak.anon.max(rss0.anon),
    };
    (
        out,
        FloodFigures {
            rss0,
            peak,
            after,
            log_bytes,
            rejected: rejected_delta(&s0, &s1),
            loaders,
            loader_errors,
            probes,
            b_peer_samples: b1 - b0,
            seconds: (t2 - t1).as_secs_f64(),
            settle: ctx.opts.settle(),
        },
    )
}

const MIB: f64 = (1 << 20) as f64;

/// Prints and judges a flood's figures; returns its JSON fields.
fn judge(name: &str, f: &FloodFigures, r: &mut Report) -> Json {
    let grew = f.peak.total.saturating_sub(f.rss0.total);
    println!(
        "  A's memory: {:.1} MiB before, {:.1} MiB at the peak (+{:.1} MiB; anonymous {:.1} -> {:.1} \
         MiB), {:.1} MiB {:.0} s after",
        f.rss0.total as f64 / MIB,
        f.peak.total as f64 / MIB,
        grew as f64 / MIB,
        f.rss0.anon as f64 / MIB,
        f.peak.anon as f64 / MIB,
        f.after.total as f64 / MIB,
        f.settle.as_secs_f64()
    );
    for (l, before, during, longest) in &f.loaders {
        println!(
            "  loader {l}: {before:.1} batches/s before, {during:.1} during; longest wait during \
             {:.2} s",
            longest.as_secs_f64()
        );
    }
    let ok_probes = f
        .probes
        .iter()
        .filter(|(d, w, _)| d.is_some_and(|d| d <= PEER_BOUND) && *w == 0)
        .count();
    let worst = f
        .probes
        .iter()
        .map(|(d, _, _)| d.map_or(f64::INFINITY, |d| d.as_secs_f64()))
        .fold(0.0f64, f64::max);
    let wrong: usize = f.probes.iter().map(|(_, w, _)| w).sum();
    let failures: Vec<&str> = f
        .probes
        .iter()
        .filter(|(d, _, _)| d.is_none())
        .filter_map(|(_, _, e)| e.as_deref())
        .collect();
    println!(
        "  legitimate peer (member p, from 127.0.0.11): {ok_probes} of {} fetches had a block within \
         5 s, the slowest after {worst:.2} s{}; the real B took {} samples from peers meanwhile",
        f.probes.len(),
        failures
            .first()
            .map(|e| format!(" (a failed one: {e})"))
            .unwrap_or_default(),
        f.b_peer_samples
    );
    println!(
        "  A's log grew {} bytes; rejected: {}",
        f.log_bytes,
        words(&f.rejected)
    );
    r.check(
        Goal::Floods,
        grew <= RSS_BOUND,
        format!(
            "{name}: A's memory +{:.1} MiB (bound 128 MiB)",
            grew as f64 / MIB
        ),
    );
    let served = f.loader_errors == 0
        && f.loaders
            .iter()
            .all(|(_, _, during, longest)| *during > 0.0 && *longest <= SERVED_BOUND);
    r.check(
        Goal::Floods,
        served,
        format!(
            "{name}: A's loaders kept being served ({} errors, longest wait {:.2} s, bound {} s)",
            f.loader_errors,
            f.loaders
                .iter()
                .map(|l| l.3.as_secs_f64())
                .fold(0.0, f64::max),
            SERVED_BOUND.as_secs()
        ),
    );
    r.check(
        Goal::Floods,
        !f.probes.is_empty() && ok_probes == f.probes.len(),
        format!(
            "{name}: a legitimate peer got blocks within 5 s in {ok_probes} of {} tries (slowest \
             {worst:.2} s)",
            f.probes.len()
        ),
    );
    r.check(
        Goal::Clear,
        wrong == 0,
        format!("{name}: the legitimate peer got {wrong} wrong blocks"),
    );
    let mut j = Json::default();
    j.num("seconds", f.seconds, 1)
        .int("rss_before", f.rss0.total)
        .int("rss_peak", f.peak.total)
        .int("rss_after", f.after.total)
        .int("anon_before", f.rss0.anon)
        .int("anon_peak", f.peak.anon)
        .num("rss_growth_mib", grew as f64 / MIB, 1)
        .nums(
            "loader_batches_per_s_before",
            &f.loaders.iter().map(|l| l.1).collect::<Vec<_>>(),
            2,
        )
        .nums(
            "loader_batches_per_s_during",
            &f.loaders.iter().map(|l| l.2).collect::<Vec<_>>(),
            2,
        )
        .num(
            "loader_longest_wait_s",
            f.loaders
                .iter()
                .map(|l| l.3.as_secs_f64())
                .fold(0.0, f64::max),
            2,
        )
        .int("loader_errors", f.loader_errors as u64)
        .int("peer_tries", f.probes.len() as u64)
        .int("peer_tries_within_5s", ok_probes as u64)
        .num("peer_slowest_s", worst, 2)
        .num("b_peer_samples", f.b_peer_samples, 0)
        .int("log_bytes", f.log_bytes)
        .raw("rejected", &rejected_json(&f.rejected));
    j
}

fn run_floods(ctx: &Ctx, pair: &Pair, paths: &Paths, kept: &[u64], r: &mut Report) -> Result<()> {
    let dur = ctx.opts.attack;
    let mut all = Json::default();
    let member = pair.member("p", Some("a"));
    let kept_gets = gets_of(ctx, pair.fingerprint, kept, 1);

    for refill in [false, true] {
        let n = ctx.opts.flood;
        let name = if refill {
            "4a'. connection flood, refilled"
        } else {
            "4a. connection flood"
        };
        println!(
            "\n== {name}: {n} unauthenticated connections from {} source IPs (127.0.1.x), opened \
             as fast as possible, held open and silent for {} s{}",
            ctx.opts.flood_ips,
            dur.as_secs(),
            if refill {
                "; each one A closes is opened again at once"
            } else {
                ""
            }
        );
        let (c, f) = flood(ctx, pair, kept, dur, |stop| {
            floods::conn_flood(pair.a_peer, n, ctx.opts.flood_ips, refill, stop)
        });
        println!(
            "  opened {} ({} failed at once) in {:.2} s for the first {n}; A closed {}; {} bytes \
             came back; most held open at once {}",
            c.opened,
            c.failed,
            c.open_time.as_secs_f64(),
            c.closed_by_agent,
            c.received,
            c.peak_open
        );
        let mut j = judge(name, &f, r);
        r.check(
            Goal::Clear,
            c.received == 0,
            format!("{name}: {} bytes sent to the flooding stranger", c.received),
        );
        j.int("opened", c.opened)
            .int("failed", c.failed)
            .int("closed_by_agent", c.closed_by_agent)
            .int("received", c.received)
            .num("open_time_s", c.open_time.as_secs_f64(), 2);
        all.raw(
            if refill {
                "conn_flood_refill"
            } else {
                "conn_flood"
            },
            &j.line(),
        );
    }

    let dur_nr = dur.max(ctx.opts.write_timeout() + Duration::from_secs(2));
    println!(
        "\n== 4b. six authenticated connections (the secret and p's id, from 127.0.0.6) that ask \
         for A's kept samples and never read, for {} s; a closed one is replaced",
        dur_nr.as_secs()
    );
    let (n, f) = flood(ctx, pair, kept, dur_nr, |stop| {
        floods::non_readers(pair.a_peer, ip(MEMBER_IP), &member, 6, &kept_gets, stop)
    });
    println!(
        "  {} connections, {} gets sent, {} found closed by A, {} dials failed",
        n.connections, n.gets, n.closed_by_agent, n.failed_dials
    );
    let mut j = judge("4b. non-reading peers", &f, r);
    j.int("connections", n.connections)
        .int("gets", n.gets)
        .int("closed_by_agent", n.closed_by_agent);
    all.raw("non_readers", &j.line());

    let every = Duration::from_secs(5);
    println!(
        "\n== 4c. an authenticated \"owner\": B's view address now leads to an attacker (127.0.0.5) \
         holding the secret, which answers A's first get on each connection with a block trickled \
         one byte every {} s, for {} s",
        every.as_secs(),
        dur.as_secs().max(3 * ctx.opts.block_timeout().as_secs())
    );
    let owner =
        TcpListener::bind(SocketAddr::new(ip(OWNER_IP), 0)).map_err(|e| format!("owner: {e}"))?;
    let owner_addr = owner.local_addr().map_err(|e| e.to_string())?;
    let owner_cfg = pair.member("b", None);
    let content = |id: u64| ctx.windows.content(id).to_vec();
    let dur_t = dur.max(3 * ctx.opts.block_timeout());
    let (t, f) = flood(ctx, pair, kept, dur_t, |stop| {
        // A's dials to B reach the attacker; B's dials to A are refused, so
        // the attacker is the only B that A can ask.
        paths.to_b.set(owner_addr, false);
        paths.to_a.refuse();
        let t = floods::trickle_owner(&owner, &owner_cfg, pair.fingerprint, &content, every, stop);
        paths.forward(pair, false);
        t
    });
    let slowest = t
        .abandoned_after
        .iter()
        .map(Duration::as_secs_f64)
        .fold(0.0, f64::max);
    println!(
        "  A dialled the attacker {} times and asked {} samples; {} blocks trickled ({} bytes); A \
         abandoned them after {:?} s",
        t.connections,
        t.requests,
        t.blocks,
        t.bytes,
        t.abandoned_after
            .iter()
            .map(|d| (d.as_secs_f64() * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    let bound = ctx.opts.block_timeout() + Duration::from_secs(1);
    r.check(
        Goal::Floods,
        !t.abandoned_after.is_empty() && slowest <= bound.as_secs_f64(),
        format!(
            "4c. trickle: A abandoned {} trickled blocks, the slowest after {slowest:.2} s \
             (peers.block_timeout_ms = {} ms, 1 s allowed beyond)",
            t.abandoned_after.len(),
            ctx.opts.block_timeout().as_millis()
        ),
    );
    let mut j = judge("4c. trickling owner", &f, r);
    j.int("connections", t.connections)
        .int("requests", t.requests)
        .int("blocks", t.blocks)
        .int("bytes", t.bytes)
        .nums(
            "abandoned_after_s",
            &t.abandoned_after
                .iter()
                .map(Duration::as_secs_f64)
                .collect::<Vec<_>>(),
            2,
        );
    all.raw("trickle", &j.line());

    let dur_p = dur.max(Duration::from_secs(if ctx.opts.smoke { 3 } else { 10 }));
    println!(
        "\n== 4d. pings as fast as they can be written on an authenticated connection that never \
         reads, for {} s",
        dur_p.as_secs()
    );
    let (p, f) = flood(ctx, pair, kept, dur_p, |stop| {
        floods::ping_flood(pair.a_peer, ip(MEMBER_IP), &member, stop)
    });
    println!(
        "  {} pings ({:.1} MB) on {} connections",
        p.pings,
        p.bytes as f64 / 1e6,
        p.connections
    );
    let mut j = judge("4d. pings", &f, r);
    j.int("pings", p.pings)
        .int("bytes", p.bytes)
        .int("connections", p.connections);
    all.raw("pings", &j.line());

    let dur_r = Duration::from_secs(if ctx.opts.smoke { 3 } else { 5 });
    println!(
        "\n== 4e. one request id sent over and over for {} s (an authenticated peer that reads)",
        dur_r.as_secs()
    );
    let get = Get {
        request: 7,
        ..kept_gets[0]
    };
    let (u, f) = flood(ctx, pair, kept, dur_r, |stop| {
        floods::reuse_request_id(
            pair.a_peer,
            ip(MEMBER_IP),
            &member,
            get,
            pair.fingerprint,
            stop,
        )
    });
    let u = u.unwrap_or_default();
    let reused = f
        .rejected
        .iter()
        .find(|(k, _)| k == "request_id")
        .map_or(0, |(_, v)| *v);
    println!(
        "  {} gets with request id 7 ({} answered, {} blocks); A counted {reused} reuses; its log \
         grew {} bytes (the old code: 21.8 MB in 5 s)",
        u.gets, u.answers, u.blocks, f.log_bytes
    );
    r.check(
        Goal::Floods,
        f.log_bytes <= LOG_BOUND && reused > 0,
        format!(
            "4e. reused request id: {reused} reuses wrote {} log bytes (bound 1 MiB)",
            f.log_bytes
        ),
    );
    let mut j = judge("4e. reused request id", &f, r);
    j.int("gets", u.gets)
        .int("answers", u.answers)
        .int("reuses_counted", reused);
    all.raw("reused_id", &j.line());
    r.section("floods", &all);
    Ok(())
}

// ---------------------------------------------------------------- 5: views

const VIEWS_JOB: &str = "attacks-views";

/// The loader of another uid (re-executed as uid 65534): hands views in and
/// prints what happened, one line each.
fn views_child(sock: &Path) -> i32 {
    let wait = Duration::from_secs(10);
    let id = match Client::connect(sock).and_then(|c| c.peer_identity(wait)) {
        Ok(i) => i,
        Err(e) => {
            println!("error identity {e}");
            return 1;
        }
    };
    let me = ViewMember {
        id: id.node_id.clone(),
        addr: id.addr.clone(),
        capacity: id.capacity,
    };
    let relay = ViewMember {
        id: "n1".into(),
        addr: "127.0.0.9:7170".into(),
        capacity: id.capacity,
    };
    let views = [
        ("join", encode_view(VIEWS_JOB, 1, std::slice::from_ref(&me))),
        (
            "relaunch",
            encode_view(VIEWS_JOB, 2, std::slice::from_ref(&me)),
        ),
        ("relay", encode_view(VIEWS_JOB, 2, &[me.clone(), relay])),
    ];
    for (what, v) in views {
        let Ok(v) = v else {
            println!("error encode {what}");
            return 1;
        };
        match Client::connect(sock).and_then(|c| c.join_view(&v, wait)) {
            Ok(j) => println!("{what} accepted installed={}", j.installed),
            Err(e) => println!("{what} refused {:?}", e.code()),
        }
    }
    match Client::connect(sock).and_then(|c| c.peer_identity(wait)) {
        Ok(i) => println!("held {} {}", i.job_id, i.view_epoch),
        Err(e) => println!("error identity {e}"),
    }
    0
}

fn views(ctx: &Ctx, r: &mut Report) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    println!(
        "\n== 5. another uid's views: a loader as uid 65534 (admitted by socket.allowed_uids) on \
         agent C (membership = \"session\")"
    );
    let dir = ctx.work.join("views");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for d in [&ctx.work, &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    let sock = dir.join("c.sock");
    let listen = SocketAddr::new(ip(VIEWS_IP), free_port(ip(VIEWS_IP))?);
    let metrics = SocketAddr::new(ip(VIEWS_IP), free_port(ip(VIEWS_IP))?);
    let toml = format!(
        r#"[arena]
size = "64MiB"
hugepages = "off"
[prefetch]
max_inflight_reads = 32
[socket]
path = "{sock}"
mode = "0777"
allowed_uids = [65534]
[metrics]
address = "{metrics}"
[peers]
membership = "session"
node_id = "c"
listen = "{listen}"
secret = "{SECRET}"
[[dataset]]
name = "{DATASET}"
root = "{root}"
"#,
        sock = sock.display(),
        root = ctx.spec.root.display()
    );
    let c = AgentProc::start(&ctx.bin, "C", &dir, &toml, &sock, metrics, None)?;
    // The owner installs the job's view and reads.
    let id = Client::connect(&sock)
        .and_then(|c| c.peer_identity(Duration::from_secs(10)))
        .map_err(|e| format!("C: {e}"))?;
    let me = ViewMember {
        id: id.node_id,
        addr: id.addr,
        capacity: id.capacity,
    };
    let v1 = encode_view(VIEWS_JOB, 1, &[me]).map_err(|e| e.to_string())?;
    let mut o = SessionOptions::new(DATASET);
    o.view = Some(v1);
    o.view_required = true;
    o.batch_size = 8;
    let mut s = Client::connect(&sock)
        .and_then(|cl| cl.open_session(&o))
        .map_err(|e| format!("the owner's session: {e}"))?;
    let installed = matches!(s.view_status(), Some(Ok(j)) if j.installed);
    let mut got = 0u64;
    let mut wrong = 0u64;
    let mut read = |b: &granary::Batch| {
        for x in b.samples() {
            let right = x.status() == 0
                && synth::verify_sample(&x.to_vec())
                    .is_ok_and(|i| i == ctx.spec.sample_info(x.id()));
            if right {
                got += 1;
            } else {
                wrong += 1;
            }
        }
    };
    let b = s
        .next_batch(Some(Duration::from_secs(30)))
        .map_err(|e| format!("the owner's first batch: {e}"))?;
    read(&b);
    s.release(b).map_err(|e| e.to_string())?;
    let refused0 = c.metric("granary_peer_views_total", "reason=\"uid\"");
    // The other uid's loader.
    let exe = dir.join("attacks-views-loader");
    std::fs::copy(std::env::current_exe().map_err(|e| e.to_string())?, &exe)
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let mut tries = 0;
    let out = loop {
        let o = std::process::Command::new(&exe)
            .arg("--views-stranger")
            .arg(&sock)
            .current_dir(&dir)
            .uid(65534)
            .gid(65534)
            .stdin(std::process::Stdio::null())
            .output();
        match o {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.map_err(|e| format!("run as uid 65534: {e}"))?,
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for l in text.lines() {
        println!("  uid 65534: {l}");
    }
    let line = |w: &str| {
        text.lines()
            .find(|l| l.starts_with(w))
            .unwrap_or("")
            .to_owned()
    };
    // The owner reads its epoch to the end.
    let mut fenced = None;
    loop {
        match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => {
                read(&b);
                let _ = s.release(b);
            }
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => {
                fenced = Some(e.to_string());
                break;
            }
        }
    }
    drop(s);
    let series = c.series();
    let refused = sum_of(&series, "granary_peer_views_total", "reason=\"uid\"") - refused0;
    let ended = sum_of(&series, "granary_peer_sessions_ended_by_view_total", "");
    let epoch = sum_of(&series, "granary_peer_view_epoch", "");
    println!(
        "  owner: view installed {installed}; read {got} samples of {} ({wrong} wrong){}; C \
         refused {refused} views for their uid; sessions ended by a view {ended}; C's view epoch \
         {epoch}",
        ctx.spec.num_files,
        fenced
            .as_deref()
            .map(|e| format!(", then failed: {e}"))
            .unwrap_or_default()
    );
    let refused_both = line("relaunch").starts_with("relaunch refused Permission")
        && line("relay").starts_with("relay refused Permission");
    r.check(
        Goal::Views,
        installed && refused_both && out.status.success(),
        format!(
            "another uid's relaunch epoch and relay view: {:?}, {:?}",
            line("relaunch"),
            line("relay")
        ),
    );
    r.check(
        Goal::Views,
        fenced.is_none() && ended == 0.0 && got == ctx.spec.num_files && epoch == 1.0,
        format!(
            "the owner's session was not fenced: {got} of {} samples read, {ended} sessions ended \
             by a view, view epoch {epoch}",
            ctx.spec.num_files
        ),
    );
    r.check(
        Goal::Clear,
        wrong == 0,
        format!("the owner's session read {wrong} wrong samples"),
    );
    let mut j = Json::default();
    j.str("join", &line("join"))
        .str("relaunch", &line("relaunch"))
        .str("relay", &line("relay"))
        .str("held", &line("held"))
        .num("refused_uid", refused, 0)
        .num("sessions_ended_by_view", ended, 0)
        .int("owner_samples", got)
        .int("owner_wrong", wrong)
        .str("owner_error", fenced.as_deref().unwrap_or(""));
    r.section("views", &j);
    Ok(())
}

// ---------------------------------------------------------------- verdicts

fn finish(
    ctx: &Ctx,
    r: &mut Report,
    regime: &str,
    started: Instant,
    error: Option<String>,
) -> bool {
    println!("\n== loaders over the whole run");
    let mut samples = 0;
    let mut wrong = 0;
    let mut timeouts = 0;
    let mut errors = Vec::new();
    let mut longest = Duration::ZERO;
    for l in &ctx.retired {
        let st = &l.stats;
        samples += st.samples.load(Ordering::Relaxed);
        wrong += st.wrong.load(Ordering::Relaxed);
        timeouts += st.timeouts.load(Ordering::Relaxed);
        if let Ok(e) = st.errors.lock() {
            errors.extend(e.iter().map(|(_, w)| format!("{}: {w}", l.name)));
        }
        if let Ok(b) = st.batches.lock() {
            longest = longest.max(b.iter().map(|x| x.1).max().unwrap_or_default());
        }
    }
    println!(
        "  {} loaders: {samples} samples with every byte checked, {wrong} wrong, {timeouts} \
         timeouts, {} errors, longest wait for a batch {:.2} s",
        ctx.retired.len(),
        errors.len(),
        longest.as_secs_f64()
    );
    for e in errors.iter().take(5) {
        println!("    {e}");
    }
    r.check(
        Goal::Clear,
        wrong == 0 && samples > 0,
        format!("the loaders received {wrong} wrong samples of {samples}"),
    );
    r.check(
        Goal::Timeouts,
        timeouts == 0 && errors.is_empty() && samples > 0,
        format!(
            "no loader timed out or failed: {timeouts} timeouts, {} errors{}",
            errors.len(),
            errors
                .first()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        ),
    );
    if let Some(e) = &error {
        for (g, _, _) in GOALS {
            r.checks.push(Check {
                goal: g,
                ok: false,
                what: format!("the run stopped before the end: {e}"),
            });
        }
    }
    println!("\n== goals");
    let mut goals = Json::default();
    let mut all_met = true;
    for (g, key, text) in GOALS {
        let checks: Vec<&Check> = r.checks.iter().filter(|c| c.goal == g).collect();
        let not_run = r.not_run.iter().find(|(x, _)| *x == g);
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.what.as_str())
            .collect();
        let verdict = if !failed.is_empty() {
            "not met"
        } else if let Some((_, why)) = not_run {
            println!("  {text}: NOT RUN ({why})");
            goals.raw(
                key,
                &Json::default()
                    .str("verdict", "not run")
                    .str("why", why)
                    .line(),
            );
            continue;
        } else if checks.is_empty() {
            "not met"
        } else {
            "met"
        };
        all_met &= verdict == "met";
        println!(
            "  {text}: {}",
            if verdict == "met" { "met" } else { "NOT MET" }
        );
        for f in &failed {
            println!("    because: {f}");
        }
        let mut why = String::new();
        for f in &failed {
            if !why.is_empty() {
                why.push_str("; ");
            }
            let _ = write!(why, "{f}");
        }
        goals.raw(
            key,
            &Json::default()
                .str("verdict", verdict)
                .str("why", &why)
                .line(),
        );
    }
    let mut j = Json::bench(if ctx.opts.smoke {
        "attacks-smoke"
    } else {
        "attacks"
    });
    j.raw("goals", &goals.line())
        .int("samples", ctx.spec.num_files)
        .int("loaders_per_agent", u64::from(ctx.opts.loaders))
        .int("flood_connections", ctx.opts.flood)
        .int("flood_ips", u64::from(ctx.opts.flood_ips));
    for (k, v) in &r.json {
        j.raw(k, v);
    }
    j.raw(
        "loaders",
        &Json::default()
            .int("samples", samples)
            .int("wrong", wrong)
            .int("timeouts", timeouts)
            .int("errors", errors.len() as u64)
            .num("longest_wait_s", longest.as_secs_f64(), 2)
            .line(),
    )
    .str("error", error.as_deref().unwrap_or(""))
    .num("seconds", started.elapsed().as_secs_f64(), 0)
    .str("regime", regime);
    println!("{}", j.line());
    all_met && error.is_none()
}
