//! `bench/run attacks`. Attacks on the peer tier by a stranger, a relay, a tap, flooding peers and another uid, against two release granaryd on loopback: what leaks, what breaks, what it costs
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
//! process would (`crate::floods`, `crate::peer_client`),
//! and the figures the goals name are measured: bytes and samples
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
//!
//! Layout: `scenario` (the agents, switches and loaders), `strangers`,
//! `relays`, `flooding` and `views` (the attacks), `report` (the goals and
//! the result line); `bin/attacks.rs` parses the options.

mod flooding;
mod relays;
mod report;
mod scenario;
mod strangers;
mod views;

use crate::attack_agent::{find_granaryd, rejected_delta, sum_of, AgentProc, Rss};
use crate::attack_loader::{Loader, LoaderPlan};
use crate::cli::num;
use crate::corrupt_proxy::{Corrupt, CorruptingProxy};
use crate::data;
use crate::floods;
use crate::peer_client::{self, PeerClient};
use crate::report::Json;
use crate::sample_windows::SampleWindows;
use crate::switch_proxy::{Capture, SwitchProxy};
use crate::sys;
use granary::{encode_view, Client, ErrorCode, SessionOptions, ViewMember};
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
use flooding::*;
use relays::*;
use report::*;
use scenario::*;
use strangers::*;
use views::*;

pub use views::views_child;

const DATASET: &str = "data";
const JOB: &str = "attacks";
const SECRET: &str = "3f6d0c1e9a5b47d2886e01f4b2a7c95d7e13b0c4a9f25d6e8b71c03a4f9d2e61";
const OTHER_SECRET: &str = "a0c6e1f7b39d4825c1e07a9b6f3d2c48e5b17a0d9c3f6e2b8a4d1c7f05e93b26";
/// Memory a flood may add to the agent's resident set (the goal).
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

/// The benchmark's options (`bench/run attacks --help`). Runs as any
/// user; another uid's views are tried only as root (else reported as not
/// run). Needs granaryd next to the binary (bench/run builds it).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Files in the dataset (at least 16).
    #[arg(long, default_value_t = 400, value_parser = num::<u64>)]
    pub samples: u64,
    /// Their mean size in KiB (at least 2).
    #[arg(long, default_value_t = 64, value_parser = num::<u64>)]
    pub mean_kib: u64,
    /// Loaders on each agent (at least 1).
    #[arg(long, default_value_t = 1, value_parser = num::<u32>)]
    pub loaders: u32,
    /// Unauthenticated connections of the flood [default: 10000; 1000 with --smoke].
    #[arg(long, value_parser = num::<u64>)]
    pub flood: Option<u64>,
    /// Source IPs they come from, 127.0.1.1..K (1 to 250).
    #[arg(long, default_value_t = 40, value_parser = num::<u64>)]
    pub flood_ips: u64,
    /// Seconds each flood lasts (the non-reading one at least
    /// peers.write_timeout_ms + 2 s) [default: 12; 3 with --smoke].
    #[arg(long, value_parser = num::<u64>)]
    pub attack_s: Option<u64>,
    /// Short: 1,000 flood connections, 3 s attacks, shorter peer timeouts.
    #[arg(long)]
    pub smoke: bool,
    /// Keep the work folder (configurations, agents' logs).
    #[arg(long)]
    pub keep: bool,
}

impl Options {
    /// The options resolved and checked.
    fn opts(&self) -> Result<Opts> {
        let smoke = self.smoke;
        let d = |full: u64, small: u64| if smoke { small } else { full };
        if !(1..=250).contains(&self.flood_ips) {
            return Err("--flood-ips: 1 to 250".into());
        }
        Ok(Opts {
            samples: self.samples.max(16),
            mean: self.mean_kib.max(2) * 1024,
            loaders: self.loaders.max(1),
            flood: self.flood.unwrap_or(d(10_000, 1_000)),
            flood_ips: self.flood_ips as u8,
            attack: Duration::from_secs(self.attack_s.unwrap_or(d(12, 3)).max(1)),
            smoke,
            keep: self.keep,
        })
    }
}

/// The options resolved.
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

/// Runs the benchmark; prints the result line last. `Ok(false)`: a goal
/// not met.
pub fn run(options: &Options) -> Result<bool> {
    let opts = options.opts()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Opts> {
        let args = std::iter::once("attacks").chain(args.iter().copied());
        crate::cli::parse_args::<Options>("bench/run attacks", args)
            .map_err(|e| e.to_string())?
            .opts()
    }

    #[test]
    fn smoke_shortens_the_defaults_and_given_values_win() {
        let o = opts(&[]).unwrap();
        assert_eq!((o.samples, o.mean, o.loaders), (400, 64 * 1024, 1));
        assert_eq!((o.flood, o.flood_ips, o.attack.as_secs()), (10_000, 40, 12));
        assert!(!o.smoke && !o.keep);
        let o = opts(&["--smoke", "--keep"]).unwrap();
        assert_eq!(
            (o.flood, o.attack.as_secs(), o.write_timeout().as_secs()),
            (1_000, 3, 2)
        );
        assert!(o.keep);
        let o = opts(&[
            "--smoke",
            "--flood",
            "20_000",
            "--attack-s",
            "0",
            "--samples",
            "3",
        ])
        .unwrap();
        assert_eq!((o.flood, o.attack.as_secs(), o.samples), (20_000, 1, 16));
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(opts(&["--flood-ips", "0"]).is_err());
        assert!(opts(&["--flood-ips", "251"]).is_err());
        assert!(opts(&["--loaders", "x"]).is_err());
        assert!(opts(&["--unknown"]).is_err());
    }
}
