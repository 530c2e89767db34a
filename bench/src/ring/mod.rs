//! `bench/run ring`. Cross-process SPSC ring: throughput of 64-byte items (per-item and batched publication) and hand-off latency (spinning and parked), next to a minimal ring that caches the peer's index and a baseline ring that does not.
//!
//! The parent process creates the shared memory (a session segment from
//! `AgentSegment::create_memfd` for granary's ring, a plain memfd for the
//! baseline ring), re-executes this binary as the peer process with the fd as
//! its stdin, and produces; the peer attaches and consumes.
//!
//! * Throughput: `--items` items of 64 bytes (`BatchDescriptor`) per run; the
//!   producer publishes after every item (`try_push`) or after every
//!   `--batch` items (`stage_with` k items, then `publish`); the consumer pops with
//!   `pop_into` into a `--pop`-item buffer, checks every item's sequence number
//!   and sums every field. Every repetition runs each ring once per mode and
//!   the order rotates between repetitions, so drift hits both; the median
//!   ns/item over `--reps` repetitions is reported, with the median of
//!   2^20-item slices beside it. Three rings by default: granary's, the
//!   minimal ring (`minring`: the baseline ring whose ends keep a private
//!   copy of the peer's index, reloading it only when the ring looks full
//!   or empty; the goal is granary batched ≥ 0.9× its throughput,
//!   `ratio_min_ring`) and the baseline ring (the peer's index loaded once
//!   per batch). `--attribution` adds baseline variants that put back
//!   granary's volatile copies and fences one at a time.
//! * Hand-off latency: ping-pong over two rings (ready ring out, release ring
//!   back), one-way latency = round trip / 2. Spinning: both sides spin
//!   (spin = 1 s) waiting. Parked: spin = 0 on both sides, so each wait parks on
//!   the futex; the parent waits `--gap-us` between pings so the peer is asleep
//!   when the ping arrives.
//!
//! Nothing is pinned; both processes sample the CPU they run on, and the
//! output states where they ran (distinct CPUs, a shared CPU, or mixed) and,
//! from a short spinning ping-pong before each repetition, how far apart the
//! two CPUs were (near or far: virtual CPUs move).
//!
//! Layout: `scenario` (the items, the rings and their shared memory),
//! `measure` (a throughput run, a ping-pong, and the phases made of them),
//! `peer` (the consuming process), `report` (the medians, the regime and
//! the result line); `bin/ring.rs` parses the options.

mod measure;
mod peer;
mod report;
mod scenario;

use std::time::Duration;

use crate::baseline::Variant;
use crate::cli::num;
use crate::cpu::online_cpus;
use crate::report::Goal;
use scenario::{expected_sum, Kind, Publish, BASELINE};

/// The goal: Granary's batched ring at least 0.9x the minimal ring with
/// cached peer indices (`ratio_min_ring`).
pub const GOAL: Goal = Goal::at_least("goal", 0.9);

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

/// How long any wait may last before the run is declared stalled.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Spin budget for the "spinning" latency case: far longer than a hand-off.
const LONG_SPIN: Duration = Duration::from_secs(1);
/// CPU samples are taken every this many items in throughput runs.
const SAMPLE_EVERY: u64 = 1 << 20;
/// Capacity of the rings used for ping-pong.
const PING_CAPACITY: u32 = 64;
/// Ping-pong samples of the distance probe run before each repetition.
const PROBE_SAMPLES: usize = 2_000;
/// One-way spinning hand-off (baseline ring, p50) below which the two CPUs
/// count as "near"; the two vCPUs of the test machines showed either
/// 50–90 ns or about 300 ns.
const NEAR_NS: f64 = 150.0;
/// Marker in a pong's `token`: no CPU sample attached.
const NO_CPU: u64 = u64::MAX;

/// The benchmark's options (`bench/run ring --help`).
#[derive(Clone, Debug)]
pub struct Options {
    /// Items per throughput run.
    pub items: u64,
    /// Repetitions of each throughput case.
    pub reps: usize,
    /// Items per publication in the batched case.
    pub batch: u64,
    /// The consumer's `pop_into` buffer, items.
    pub pop: usize,
    /// Ring capacity for throughput, a power of two.
    pub capacity: u32,
    /// Ping-pong samples with spinning waits.
    pub spin_samples: usize,
    /// Ping-pong samples with parked waits.
    pub parked_samples: usize,
    /// Pause between parked pings.
    pub gap: Duration,
    /// Also run the baseline variants that add granary's work piece by piece.
    pub attribution: bool,
    /// Run the hand-off latency measurements.
    pub latency: bool,
    /// Throughput for one publication mode only: batched (`true`) or per
    /// item (`false`).
    pub publish: Option<bool>,
    /// Throughput for these rings only (`granary`, `minring`, `baseline…`).
    pub kinds: Option<Vec<String>>,
}

impl Options {
    /// The defaults, or the smoke test's small run (`--quick`).
    pub fn defaults(quick: bool) -> Options {
        Options {
            items: if quick { 2_000_000 } else { 20_000_000 },
            reps: if quick { 2 } else { 5 },
            batch: 32,
            pop: 64,
            capacity: 1024,
            spin_samples: if quick { 2_000 } else { 20_000 },
            parked_samples: if quick { 500 } else { 5_000 },
            gap: Duration::from_micros(100),
            attribution: false,
            latency: true,
            publish: None,
            kinds: None,
        }
    }

    fn check(&self) -> Result<()> {
        if !self.capacity.is_power_of_two() || self.capacity < 2 {
            return Err("--capacity must be a power of two ≥ 2".into());
        }
        if self.batch == 0 || self.batch > u64::from(self.capacity) {
            return Err("--batch must be in 1..=capacity".into());
        }
        if self.pop == 0 || self.items == 0 || self.reps == 0 {
            return Err("--pop, --items and --reps must be positive".into());
        }
        Ok(())
    }
}

/// The options as given (`bench/run ring --help`); `None`: the default, or
/// with `--quick` the smoke test's.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Items per throughput run [default: 20000000; 2000000 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    pub items: Option<u64>,
    /// Repetitions of each throughput case [default: 5; 2 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    pub reps: Option<usize>,
    /// Items per publication in the batched case [default: 32].
    #[arg(long, value_parser = num::<u64>)]
    pub batch: Option<u64>,
    /// Consumer pop_into buffer, items [default: 64].
    #[arg(long, value_parser = num::<usize>)]
    pub pop: Option<usize>,
    /// Ring capacity for throughput, power of two [default: 1024].
    #[arg(long, value_parser = num::<u32>)]
    pub capacity: Option<u32>,
    /// Ping-pong samples with spinning waits [default: 20000; 2000 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    pub spin_samples: Option<usize>,
    /// Ping-pong samples with parked waits [default: 5000; 500 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    pub parked_samples: Option<usize>,
    /// Pause between parked pings, microseconds [default: 100].
    #[arg(long, value_parser = num::<u64>)]
    pub gap_us: Option<u64>,
    /// Small run for a smoke test.
    #[arg(long)]
    pub quick: bool,
    /// Throughput for one publication mode.
    #[arg(long, value_parser = ["per-item", "batched"])]
    pub only: Option<String>,
    /// Skip the hand-off latency measurements.
    #[arg(long)]
    pub no_latency: bool,
    /// Throughput for these rings only, comma-separated (granary, baseline,
    /// baseline+words, ...; for profiling).
    #[arg(long)]
    pub kinds: Option<String>,
    /// Also run baseline variants that add what granary's ring does, piece by
    /// piece: +volatile (whole-item volatile copies on both sides), +vwrite /
    /// +vread (one side only), +words (volatile copies one 8-byte word at a
    /// time), +fence (SeqCst fence after each index store), +fence+flag (then
    /// a load from the peer's index cache line), +fence+farflag (a load from
    /// a line the peer never writes), and combinations.
    #[arg(long)]
    pub attribution: bool,
}

impl Args {
    /// The options with the defaults filled in.
    pub fn options(self) -> Options {
        let (c, d) = (&self, Options::defaults(self.quick));
        Options {
            items: c.items.unwrap_or(d.items),
            reps: c.reps.unwrap_or(d.reps),
            batch: c.batch.unwrap_or(d.batch),
            pop: c.pop.unwrap_or(d.pop),
            capacity: c.capacity.unwrap_or(d.capacity),
            spin_samples: c.spin_samples.unwrap_or(d.spin_samples),
            parked_samples: c.parked_samples.unwrap_or(d.parked_samples),
            gap: c.gap_us.map_or(d.gap, Duration::from_micros),
            attribution: c.attribution,
            latency: !c.no_latency,
            publish: c.only.as_deref().map(|m| m == "batched"),
            kinds: c
                .kinds
                .as_ref()
                .map(|k| k.split(',').map(str::to_owned).collect()),
        }
    }
}

/// Runs the peer role: attaches to the parent's memory, consumes or echoes.
pub fn run_peer(args: &[String]) -> std::result::Result<(), String> {
    peer::run_peer(args).map_err(|e| e.to_string())
}

/// Runs the benchmark (the parent's side); prints the result line last.
pub fn run(o: &Options) -> std::result::Result<(), String> {
    run_parent(o).map_err(|e| e.to_string())
}

fn run_parent(o: &Options) -> Result<()> {
    o.check()?;
    let nproc = online_cpus();
    report::print_header(o, nproc);
    let modes: Vec<Publish> = match o.publish {
        None => vec![Publish::PerItem, Publish::Batched(o.batch)],
        Some(false) => vec![Publish::PerItem],
        Some(true) => vec![Publish::Batched(o.batch)],
    };
    let mut kinds = vec![Kind::Granary, Kind::MinRing, BASELINE];
    if o.attribution {
        kinds.extend(Variant::ATTRIBUTION.iter().map(|&v| Kind::Baseline(v)));
    }
    if let Some(k) = &o.kinds {
        kinds = k.iter().map(|s| Kind::parse(s)).collect::<Result<_>>()?;
    }
    let tp = measure::throughput(o, &modes, &kinds, expected_sum(o.items))?;
    let summary = report::Summary {
        o,
        nproc,
        modes: &modes,
        kinds: &kinds,
        tp: &tp,
    };
    summary.print_cases();
    let latency = match o.latency {
        true => Some(measure::latency(o, tp.run_no)?),
        false => None,
    };
    let line = summary.print(latency.as_ref());
    println!("{}", line.line());
    Ok(())
}
