//! Cross-process SPSC ring: throughput of 64-byte items (per-item and batched publication) and hand-off latency (spinning and parked), next to a minimal ring that caches the peer's index and a baseline ring that does not.
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

use granary_bench::baseline::{self, BaseProducer, Variant};
use granary_bench::cpu::{current_cpu, online_cpus, CpuSamples, Placement};
use granary_bench::peer::{self, Peer};
use granary_bench::report::{self, Goal, Json};
use granary_bench::sys::cpu_model;
use granary_shm::layout::{BatchDescriptor, ReleaseDescriptor};
use granary_shm::memfd;
use granary_shm::region::Region;
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::{AgentSegment, LoaderSegment, SegmentSpec};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The goal: Granary's batched ring at least 0.9x the minimal ring with
/// cached peer indices (`ratio_min_ring`).
const GOAL: Goal = Goal::at_least("goal", 0.9);

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

const USAGE: &str = "\
usage: bench/run ring [options]
  --items N           items per throughput run (default 20000000)
  --reps N            repetitions of each throughput case (default 5)
  --batch K           items per publication in the batched case (default 32)
  --pop B             consumer pop_into buffer, items (default 64)
  --capacity C        ring capacity for throughput, power of two (default 1024)
  --spin-samples N    ping-pong samples with spinning waits (default 20000)
  --parked-samples N  ping-pong samples with parked waits (default 5000)
  --gap-us N          pause between parked pings, microseconds (default 100)
  --quick             small run for a smoke test
  --only MODE         throughput for one publication mode: per-item or batched
  --no-latency        skip the hand-off latency measurements
  --kinds LIST        throughput for these rings only, comma-separated
                      (granary, baseline, baseline+words, ...; for profiling)
  --attribution       also run baseline variants that add what granary's ring
                      does, piece by piece: +volatile (whole-item volatile
                      copies on both sides), +vwrite / +vread (one side only),
                      +words (volatile copies one 8-byte word at a time),
                      +fence (SeqCst fence after each index store), +fence+flag
                      (then a load from the peer's index cache line),
                      +fence+farflag (a load from a line the peer never
                      writes), and combinations
  The JSON line needs both publication modes and the latency runs.";

fn main() -> ExitCode {
    let result = match peer::peer_args() {
        Some(args) => run_peer(&args),
        None => run_parent(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Options

#[derive(Clone, Debug)]
struct Opts {
    items: u64,
    reps: usize,
    batch: u64,
    pop: usize,
    capacity: u32,
    spin_samples: usize,
    parked_samples: usize,
    gap: Duration,
    attribution: bool,
    latency: bool,
    publish: Option<bool>,
    kinds: Option<Vec<Kind>>,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            items: 20_000_000,
            reps: 5,
            batch: 32,
            pop: 64,
            capacity: 1024,
            spin_samples: 20_000,
            parked_samples: 5_000,
            gap: Duration::from_micros(100),
            attribution: false,
            latency: true,
            publish: None,
            kinds: None,
        }
    }
}

impl Opts {
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Opts> {
        let mut o = Opts::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--quick" {
                o.items = 2_000_000;
                o.reps = 2;
                o.spin_samples = 2_000;
                o.parked_samples = 500;
                continue;
            }
            if flag == "--attribution" {
                o.attribution = true;
                continue;
            }
            if flag == "--no-latency" {
                o.latency = false;
                continue;
            }
            if flag == "--help" || flag == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let num = |v: &str| -> Result<u64> {
                v.replace('_', "")
                    .parse::<u64>()
                    .map_err(|_| format!("{flag}: not a number: {v}").into())
            };
            match flag.as_str() {
                "--items" => o.items = num(&value)?,
                "--reps" => o.reps = num(&value)? as usize,
                "--batch" => o.batch = num(&value)?,
                "--pop" => o.pop = num(&value)? as usize,
                "--capacity" => o.capacity = u32::try_from(num(&value)?)?,
                "--spin-samples" => o.spin_samples = num(&value)? as usize,
                "--parked-samples" => o.parked_samples = num(&value)? as usize,
                "--gap-us" => o.gap = Duration::from_micros(num(&value)?),
                "--kinds" => {
                    o.kinds = Some(value.split(',').map(Kind::parse).collect::<Result<_>>()?)
                }
                "--only" => {
                    o.publish = match value.as_str() {
                        "per-item" => Some(false),
                        "batched" => Some(true),
                        _ => return Err("--only takes per-item or batched".into()),
                    }
                }
                _ => return Err(format!("unknown option {flag}\n{USAGE}").into()),
            }
        }
        if !o.capacity.is_power_of_two() || o.capacity < 2 {
            return Err("--capacity must be a power of two ≥ 2".into());
        }
        if o.batch == 0 || o.batch > u64::from(o.capacity) {
            return Err("--batch must be in 1..=capacity".into());
        }
        if o.pop == 0 || o.items == 0 || o.reps == 0 {
            return Err("--pop, --items and --reps must be positive".into());
        }
        Ok(o)
    }
}

// ---------------------------------------------------------------------------
// Items

/// The `i`-th item: every field depends on `i`, so a lost, duplicated, torn
/// or reordered item changes the consumer's checks.
#[inline]
fn item(i: u64) -> BatchDescriptor {
    BatchDescriptor {
        seq: i,
        token: i.wrapping_mul(granary_base::GAMMA),
        table_offset: i << 6,
        batch_index: i >> 5,
        total_bytes: !i,
        epoch: (i >> 20) as u32,
        sample_count: 32,
        status: 0,
        flags: (i & 1) as u32,
        reserved: i ^ 0x5555_5555,
    }
}

/// Sum of every field of `d` (what the consumer accumulates per item).
#[inline]
fn fold(d: &BatchDescriptor) -> u64 {
    d.seq
        .wrapping_add(d.token)
        .wrapping_add(d.table_offset)
        .wrapping_add(d.batch_index)
        .wrapping_add(d.total_bytes)
        .wrapping_add(u64::from(d.epoch))
        .wrapping_add(u64::from(d.sample_count))
        .wrapping_add(u64::from(d.status as u32))
        .wrapping_add(u64::from(d.flags))
        .wrapping_add(d.reserved)
}

/// Consumer work per popped chunk: sequence check and checksum.
#[inline]
fn absorb(items: &[BatchDescriptor], next: &mut u64, sum: &mut u64) -> bool {
    let mut ok = true;
    for d in items {
        ok &= d.seq == *next;
        *next += 1;
        *sum = sum.wrapping_add(fold(d));
    }
    ok
}

fn expected_sum(n: u64) -> u64 {
    (0..n).fold(0u64, |s, i| s.wrapping_add(fold(&item(i))))
}

// ---------------------------------------------------------------------------
// Shared memory

/// Which ring a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Granary,
    /// The baseline ring, plain or with diagnostic extra work.
    Baseline(Variant),
    /// The plain baseline ring with cached peer indices on both ends.
    MinRing,
}

const BASELINE: Kind = Kind::Baseline(Variant::PLAIN);

impl Kind {
    /// For the baseline code paths: the variant and whether the ends cache
    /// the peer's index (`None` for granary's ring).
    fn baseline(self) -> Option<(Variant, bool)> {
        match self {
            Kind::Granary => None,
            Kind::Baseline(v) => Some((v, false)),
            Kind::MinRing => Some((Variant::PLAIN, true)),
        }
    }
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Granary => "granary".to_owned(),
            Kind::Baseline(c) => format!("baseline{}", c.suffix()),
            Kind::MinRing => "minring".to_owned(),
        }
    }

    fn parse(s: &str) -> Result<Kind> {
        if s == "granary" {
            return Ok(Kind::Granary);
        }
        if s == "minring" {
            return Ok(Kind::MinRing);
        }
        s.strip_prefix("baseline")
            .and_then(Variant::from_suffix)
            .map(Kind::Baseline)
            .ok_or_else(|| format!("unknown ring kind {s}").into())
    }
}

/// A fresh session segment in a sealed memfd; returns it and a duplicate of
/// its fd for the peer.
fn granary_segment(ready: u32, release: u32, epoch: u64) -> Result<(AgentSegment, OwnedFd)> {
    let seg = AgentSegment::create_memfd(SegmentSpec {
        session_id: epoch & 0xffff_ffff,
        ready_capacity: ready,
        release_capacity: release,
        arena_size: 1 << 20,
        instance_epoch: epoch,
        // The ring benchmark measures the rings only: no liveness checks.
        heartbeat_interval_ms: 0,
    })?;
    let fd = seg
        .fd()
        .ok_or("memfd segment without an fd")?
        .try_clone_to_owned()?;
    Ok((seg, fd))
}

/// A zeroed memfd of at least `len` bytes, mapped shared; returns the mapping
/// and the fd for the peer.
fn baseline_memory(len: usize) -> Result<(Arc<Region>, OwnedFd)> {
    let len = len.div_ceil(4096) * 4096;
    let fd = memfd::create("granary-bench-baseline", len as u64, false)?;
    let region = Region::map_shared_rw(fd.as_fd(), len, true)?;
    Ok((Arc::new(region), fd))
}

/// The peer's mapping of the baseline memfd.
fn baseline_attach(fd: BorrowedFd<'_>) -> Result<Arc<Region>> {
    let len = usize::try_from(memfd::file_size(fd)?)?;
    Ok(Arc::new(Region::map_shared_rw(fd, len, true)?))
}

/// Offset of the second baseline ring (ping-pong) in the same memfd.
fn second_ring_offset<T>(capacity: usize) -> usize {
    baseline::ring_bytes::<T>(capacity).div_ceil(128) * 128
}

fn new_epoch(run: u64) -> u64 {
    (u64::from(std::process::id()) << 32) | run
}

// ---------------------------------------------------------------------------
// Parent

/// How the producer publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Publish {
    /// `try_push` per item (baseline: one tail store per item).
    PerItem,
    /// `stage_with` k items, then `publish` (baseline: k slots, one tail store).
    Batched(u64),
}

impl Publish {
    fn k(self) -> u64 {
        match self {
            Publish::PerItem => 1,
            Publish::Batched(k) => k,
        }
    }

    fn label(self) -> String {
        match self {
            Publish::PerItem => "per-item".to_owned(),
            Publish::Batched(k) => format!("batched k={k}"),
        }
    }
}

/// Progress marks the producer takes every [`SAMPLE_EVERY`] items: where it
/// ran, and when (items written, time). The ring holds at most `capacity`
/// items, so the producer's pace is the consumer's pace to within that.
#[derive(Default)]
struct Marks {
    cpus: CpuSamples,
    times: Vec<(u64, Instant)>,
}

impl Marks {
    #[inline(never)]
    fn mark(&mut self, items: u64) {
        self.times.push((items, Instant::now()));
        self.cpus.sample();
    }

    /// Median ns/item over the intervals between marks (robust to a few
    /// intervals stretched by other processes); NaN without two marks.
    fn median_slice_ns(&self) -> f64 {
        let slices: Vec<f64> = self
            .times
            .windows(2)
            .filter(|w| w[1].0 > w[0].0)
            .map(|w| (w[1].1 - w[0].1).as_nanos() as f64 / (w[1].0 - w[0].0) as f64)
            .collect();
        report::median(&slices)
    }
}

/// One throughput run as seen by the parent.
struct Run {
    ns_per_item: f64,
    slice_ns_per_item: f64,
    placement: Placement,
    parent_cpus: CpuSamples,
    peer_cpus: CpuSamples,
    empty_polls: u64,
    full_waits: u64,
    /// Whether the repetition's distance probe said "near".
    near: bool,
}

fn throughput_run(kind: Kind, publish: Publish, o: &Opts, run_no: u64, want: u64) -> Result<Run> {
    let epoch = new_epoch(run_no);
    let n = o.items;
    let args = vec![
        "tp".to_owned(),
        kind.name(),
        n.to_string(),
        o.pop.to_string(),
        epoch.to_string(),
        o.capacity.to_string(),
    ];
    let mut marks = Marks::default();
    let (elapsed, done, full_waits) = match kind {
        Kind::Granary => {
            let (mut seg, fd) = granary_segment(o.capacity, 64, epoch)?;
            let (mut prod, _release) = seg.take_endpoints().ok_or("endpoints already taken")?;
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            marks.mark(0);
            let t0 = Instant::now();
            let waits = produce_granary(&mut prod, n, publish, &mut marks)?;
            let done = peer.expect("done")?;
            let elapsed = t0.elapsed();
            peer.finish()?;
            (elapsed, done, waits)
        }
        Kind::Baseline(_) | Kind::MinRing => {
            let (variant, cache_peer) = kind.baseline().ok_or("not a baseline ring")?;
            let cap = o.capacity as usize;
            let (region, fd) = baseline_memory(baseline::ring_bytes::<BatchDescriptor>(cap))?;
            // SAFETY: fresh zeroed memfd; this is the ring's only producer and
            // the peer creates its only consumer.
            let mut prod = unsafe { baseline::producer::<BatchDescriptor>(region, 0, cap) };
            prod.set_variant(variant);
            prod.set_cache_peer(cache_peer);
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            marks.mark(0);
            let t0 = Instant::now();
            produce_baseline(&mut prod, n, publish.k(), &mut marks)?;
            let done = peer.expect("done")?;
            let elapsed = t0.elapsed();
            peer.finish()?;
            (elapsed, done, prod.full_waits())
        }
    };
    // done: checksum ok empty_polls cpus
    let [sum, ok, polls, peer_cpus] = <[String; 4]>::try_from(done)
        .map_err(|d| format!("malformed done line from peer: {d:?}"))?;
    if ok != "1" || sum.parse::<u64>()? != want {
        return Err(format!(
            "{} run: items arrived out of order or corrupted",
            kind.name()
        )
        .into());
    }
    let peer_cpus = CpuSamples::decode(&peer_cpus).ok_or("malformed cpu samples from peer")?;
    Ok(Run {
        ns_per_item: elapsed.as_nanos() as f64 / n as f64,
        slice_ns_per_item: marks.median_slice_ns(),
        placement: Placement::of(&marks.cpus, &peer_cpus),
        parent_cpus: marks.cpus,
        peer_cpus,
        empty_polls: polls.parse()?,
        full_waits,
        near: true,
    })
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
fn produce_granary(
    prod: &mut Producer<BatchDescriptor>,
    n: u64,
    publish: Publish,
    marks: &mut Marks,
) -> Result<u64> {
    let mut i = 0;
    let mut waits = 0;
    let mut mark_at = SAMPLE_EVERY;
    while i < n {
        match publish {
            Publish::PerItem => {
                if prod.try_push(item(i))? {
                    i += 1;
                } else {
                    waits += 1;
                    if !prod.wait_for_space(Some(TIMEOUT))? {
                        return Err("granary ring: consumer stalled".into());
                    }
                }
            }
            Publish::Batched(k) => {
                let end = (i + k).min(n);
                while i < end {
                    let base = i;
                    let got = prod.stage_with((end - i) as usize, |j| item(base + j as u64))?;
                    i += got as u64;
                    if i < end {
                        waits += 1;
                        if !prod.wait_for_space(Some(TIMEOUT))? {
                            return Err("granary ring: consumer stalled".into());
                        }
                    }
                }
                prod.publish();
            }
        }
        if i >= mark_at {
            marks.mark(i);
            mark_at += SAMPLE_EVERY;
        }
    }
    Ok(waits)
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
fn produce_baseline(
    prod: &mut BaseProducer<BatchDescriptor>,
    n: u64,
    k: u64,
    marks: &mut Marks,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT * 30;
    let mut i = 0;
    let mut mark_at = SAMPLE_EVERY;
    while i < n {
        let k = k.min(n - i);
        prod.push_batch(k, deadline, item)?;
        i += k;
        if i >= mark_at {
            marks.mark(i);
            mark_at += SAMPLE_EVERY;
        }
    }
    Ok(())
}

/// Ping-pong results: one-way latencies (round trip / 2) in ns, sorted.
struct PingPong {
    one_way_ns: Vec<u64>,
    pairs: u64,
    pairs_distinct: u64,
}

impl PingPong {
    fn p(&self, pct: f64) -> f64 {
        report::percentile(&self.one_way_ns, pct).map_or(f64::NAN, |v| v as f64)
    }

    fn distinct_pct(&self) -> f64 {
        if self.pairs == 0 {
            f64::NAN
        } else {
            100.0 * self.pairs_distinct as f64 / self.pairs as f64
        }
    }
}

/// Runs one ping-pong; `parked` selects spin = 0 and a gap between pings.
fn ping_pong(kind: Kind, parked: bool, samples: usize, o: &Opts, run_no: u64) -> Result<PingPong> {
    let warmup = (samples / 10).max(100);
    let total = warmup + samples;
    let epoch = new_epoch(run_no);
    let cpu_every: usize = if parked { 8 } else { 1024 };
    let args = vec![
        "pp".to_owned(),
        kind.name(),
        if parked { "parked" } else { "spin" }.to_owned(),
        total.to_string(),
        epoch.to_string(),
        cpu_every.to_string(),
    ];
    let gap = if parked { o.gap } else { Duration::ZERO };
    let mut rtts = Vec::with_capacity(samples);
    let (mut pairs, mut pairs_distinct) = (0u64, 0u64);
    let mut record = |i: usize, rtt: Duration, peer_cpu: u64| {
        if i >= warmup {
            rtts.push(rtt.as_nanos() as u64);
        }
        if peer_cpu != NO_CPU {
            if let Some(mine) = current_cpu() {
                pairs += 1;
                pairs_distinct += u64::from(u64::from(mine) != peer_cpu);
            }
        }
    };
    match kind {
        Kind::Granary => {
            let (mut seg, fd) = granary_segment(PING_CAPACITY, PING_CAPACITY, epoch)?;
            let (mut ping, mut pong) = seg.take_endpoints().ok_or("endpoints already taken")?;
            let spin = if parked { Duration::ZERO } else { LONG_SPIN };
            ping.set_spin(spin);
            pong.set_spin(spin);
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            for i in 0..total {
                pause(gap);
                let t0 = Instant::now();
                if !ping.try_push(item(i as u64))? {
                    return Err("ping ring full".into());
                }
                let r = pong.pop_blocking(Some(TIMEOUT))?;
                let rtt = t0.elapsed();
                if r.seq != i as u64 {
                    return Err(format!("pong {} for ping {i}", r.seq).into());
                }
                record(i, rtt, r.token);
            }
            peer.expect("done")?;
            peer.finish()?;
        }
        Kind::Baseline(_) | Kind::MinRing => {
            if parked {
                return Err("the baseline ring cannot park".into());
            }
            let cap = PING_CAPACITY as usize;
            let second = second_ring_offset::<BatchDescriptor>(cap);
            let (region, fd) =
                baseline_memory(second + baseline::ring_bytes::<ReleaseDescriptor>(cap))?;
            // SAFETY: fresh zeroed memfd; the parent owns the only producer of
            // ring 0, the peer its only consumer.
            let mut ping = unsafe { baseline::producer::<BatchDescriptor>(region.clone(), 0, cap) };
            // SAFETY: the parent owns the only consumer of ring 1, the peer its
            // only producer.
            let mut pong = unsafe { baseline::consumer::<ReleaseDescriptor>(region, second, cap) };
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            let deadline = Instant::now() + TIMEOUT * 30;
            let mut one = [ReleaseDescriptor::default()];
            for i in 0..total {
                let t0 = Instant::now();
                ping.push_batch(1, deadline, |_| item(i as u64))?;
                while pong.pop_into(&mut one) == 0 {
                    pong.wait_for_data(deadline)?;
                }
                let rtt = t0.elapsed();
                if one[0].seq != i as u64 {
                    return Err(format!("pong {} for ping {i}", one[0].seq).into());
                }
                record(i, rtt, one[0].token);
            }
            peer.expect("done")?;
            peer.finish()?;
        }
    }
    let mut one_way_ns: Vec<u64> = rtts.iter().map(|r| r / 2).collect();
    one_way_ns.sort_unstable();
    Ok(PingPong {
        one_way_ns,
        pairs,
        pairs_distinct,
    })
}

/// Busy-waits `d` (keeps this CPU awake, unlike a sleep, so only the peer parks).
fn pause(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| {
            s.split_ascii_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "?".to_owned())
}

/// Median ns/item (whole runs and 1 Mi-item slices) of one case.
#[derive(Clone, Copy)]
struct CaseSummary {
    run: f64,
    slice: f64,
}

fn run_parent() -> Result<()> {
    let o = Opts::parse(std::env::args().skip(1))?;
    let nproc = online_cpus();
    println!("ring: cross-process SPSC ring, 64-byte items (BatchDescriptor)");
    println!(
        "  cpu: {} | nproc {nproc} | load avg {} | pinning: none",
        cpu_model(),
        loadavg()
    );
    println!(
        "  throughput: {} items/run, {} reps, capacity {}, batch k={}, pop_into buffer {}",
        o.items, o.reps, o.capacity, o.batch, o.pop
    );
    let want = expected_sum(o.items);

    // --- throughput -------------------------------------------------------
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
        kinds.clone_from(k);
    }
    let mut runs: BTreeMap<(u64, String), Vec<Run>> = BTreeMap::new();
    let mut run_no = 0u64;
    let mut probes: Vec<f64> = Vec::new();
    for rep in 0..o.reps {
        // How far apart the two CPUs are right now: a short spinning
        // ping-pong over the baseline ring (the hypervisor may move vCPUs).
        run_no += 1;
        let probe = ping_pong(BASELINE, false, PROBE_SAMPLES, &o, run_no)?.p(50.0);
        println!(
            "  rep {} distance probe: {probe:.0} ns one-way ({})",
            rep + 1,
            if probe < NEAR_NS { "near" } else { "far" }
        );
        probes.push(probe);
        for &publish in &modes {
            // Rotate the order every repetition so slow drift hits every kind.
            let mut order = kinds.clone();
            order.rotate_left(rep % kinds.len());
            for kind in order {
                run_no += 1;
                let mut r = throughput_run(kind, publish, &o, run_no, want)?;
                r.near = probe < NEAR_NS;
                println!(
                    "  rep {} {:<13} {:<28} {:>8.2} ns/item ({:>6.2} slice median) [{}; producer {}; consumer {}; producer waits (full) {}, consumer waits (empty) {}]",
                    rep + 1,
                    publish.label(),
                    kind.name(),
                    r.ns_per_item,
                    r.slice_ns_per_item,
                    r.placement,
                    r.parent_cpus,
                    r.peer_cpus,
                    r.full_waits,
                    r.empty_polls
                );
                runs.entry((publish.k(), kind.name())).or_default().push(r);
            }
        }
    }
    let summary_where = |publish: Publish, kind: Kind, keep: &dyn Fn(&Run) -> bool| {
        let v: Vec<&Run> = runs
            .get(&(publish.k(), kind.name()))
            .map_or_else(Vec::new, |v| v.iter().filter(|r| keep(r)).collect());
        let med = |f: fn(&Run) -> f64| report::median(&v.iter().map(|r| f(r)).collect::<Vec<_>>());
        CaseSummary {
            run: med(|r| r.ns_per_item),
            slice: med(|r| r.slice_ns_per_item),
        }
    };
    let summary = |publish: Publish, kind: Kind| summary_where(publish, kind, &|_| true);
    println!(
        "  median over {} reps, ns/item (whole run | median 1 Mi-item slice):",
        o.reps
    );
    for &publish in &modes {
        let g = summary(publish, Kind::Granary);
        for &kind in &kinds {
            let c = summary(publish, kind);
            println!(
                "    {:<13} {:<28} {:>8.2} | {:>6.2}   ns ÷ granary ns {:.3} | {:.3}",
                publish.label(),
                kind.name(),
                c.run,
                c.slice,
                c.run / g.run,
                c.slice / g.slice
            );
        }
    }
    let item_g = summary(Publish::PerItem, Kind::Granary);
    let item_b = summary(Publish::PerItem, BASELINE);
    let batch_g = summary(Publish::Batched(o.batch), Kind::Granary);
    let batch_b = summary(Publish::Batched(o.batch), BASELINE);
    let item_m = summary(Publish::PerItem, Kind::MinRing);
    let batch_m = summary(Publish::Batched(o.batch), Kind::MinRing);
    let batched_ratio_where = |near: bool| {
        let keep = move |r: &Run| r.near == near;
        let g = summary_where(Publish::Batched(o.batch), Kind::Granary, &keep);
        let b = summary_where(Publish::Batched(o.batch), BASELINE, &keep);
        (g.run, b.run, b.run / g.run)
    };
    let by_distance = [
        (true, batched_ratio_where(true)),
        (false, batched_ratio_where(false)),
    ];
    for (near, (g, b, ratio)) in by_distance {
        if ratio.is_finite() {
            println!(
                "    batched, {} reps only: granary {g:.2}, baseline {b:.2} ns/item, ratio {ratio:.3}",
                if near { "near" } else { "far" }
            );
        }
    }

    // --- hand-off latency ---------------------------------------------------
    let latency = if o.latency {
        println!(
            "  hand-off latency (round trip / 2): {} spinning samples, {} parked samples (gap {} us)",
            o.spin_samples,
            o.parked_samples,
            o.gap.as_micros()
        );
        let spin = ping_pong(Kind::Granary, false, o.spin_samples, &o, run_no + 1)?;
        let base_spin = ping_pong(BASELINE, false, o.spin_samples, &o, run_no + 2)?;
        let parked = ping_pong(Kind::Granary, true, o.parked_samples, &o, run_no + 3)?;
        for (label, pp, unit, div) in [
            ("granary  spinning", &spin, "ns", 1.0),
            ("baseline spinning", &base_spin, "ns", 1.0),
            ("granary  parked", &parked, "us", 1e3),
        ] {
            println!(
                "    {label:<18} p50 {:>8.2} {unit}  p99 {:>8.2} {unit}  [distinct CPUs in {:.0}% of {} sampled hand-offs]",
                pp.p(50.0) / div,
                pp.p(99.0) / div,
                pp.distinct_pct(),
                pp.pairs
            );
        }
        Some((spin, base_spin, parked))
    } else {
        None
    };

    // --- regime -------------------------------------------------------------
    let placements: Vec<Placement> = runs.values().flatten().map(|r| r.placement).collect();
    let distinct = placements
        .iter()
        .filter(|p| matches!(p, Placement::Distinct { .. }))
        .count();
    let shared = placements
        .iter()
        .filter(|p| matches!(p, Placement::Shared { .. }))
        .count();
    // A run whose processes moved once is not a different regime: the label
    // needs 90 % of the runs.
    let regime = if distinct * 10 >= placements.len() * 9 {
        "distinct"
    } else if shared * 10 >= placements.len() * 9 {
        "shared"
    } else {
        "mixed"
    };
    let near = probes.iter().filter(|&&p| p < NEAR_NS).count();
    let distance = if near == probes.len() {
        "near"
    } else if near == 0 {
        "far"
    } else {
        "mixed"
    };
    println!(
        "  regime: nproc {nproc}; throughput runs on distinct CPUs {distinct}/{n}, on one shared CPU {shared}/{n} ({regime}); CPU distance {distance} (near in {near}/{} reps, probe p50 {}); load avg now {}",
        probes.len(),
        probes.iter().map(|p| format!("{p:.0}")).collect::<Vec<_>>().join("/"),
        loadavg(),
        n = placements.len(),
    );
    if (batch_b.run / batch_g.run).is_finite() {
        println!(
            "  granary batched: {:.1}% of the baseline ring's throughput (whole runs), {:.1}% (slice medians)",
            100.0 * batch_b.run / batch_g.run,
            100.0 * batch_b.slice / batch_g.slice,
        );
    }
    let ratio_min = batch_m.run / batch_g.run;
    let min_met = GOAL.verdict(ratio_min);
    println!(
        "  result: granary batched {:.2} ns/item, minimal ring with cached peer indices {:.2} ns/item: ratio_min_ring {ratio_min:.3} ({:.3} on slice medians; per item {:.3}) (goal ≥ 0.9: {min_met})",
        batch_g.run,
        batch_m.run,
        batch_m.slice / batch_g.slice,
        item_m.run / item_g.run,
    );
    if regime != "distinct" {
        println!(
            "  WARNING: regime {regime}: in some runs both processes shared one CPU, where spinning rings measure the scheduler, not the ring; rerun on an idle machine"
        );
    }

    let mut j = Json::bench("ring");
    let nan = f64::NAN;
    let (spin_p50, spin_p99, base_p50, base_p99, parked_p50, parked_p99, parked_distinct) = latency
        .as_ref()
        .map_or((nan, nan, nan, nan, nan, nan, nan), |(s, b, p)| {
            (
                s.p(50.0),
                s.p(99.0),
                b.p(50.0),
                b.p(99.0),
                p.p(50.0) / 1e3,
                p.p(99.0) / 1e3,
                p.distinct_pct(),
            )
        });
    j.num("granary_ns_per_item", batch_g.run, 3)
        .num("baseline_ns_per_item", batch_b.run, 3)
        .num("ratio", batch_b.run / batch_g.run, 3)
        .num("spin_handoff_ns_p50", spin_p50, 0)
        .num("parked_handoff_us_p50", parked_p50, 2)
        .num("min_ring_ns_per_item", batch_m.run, 3)
        .num("ratio_min_ring", ratio_min, 3)
        .goal(&GOAL, ratio_min)
        .num("min_ring_slice_ns_per_item", batch_m.slice, 3)
        .num("slice_ratio_min_ring", batch_m.slice / batch_g.slice, 3)
        .num("min_ring_per_item_ns_per_item", item_m.run, 3)
        .num("per_item_ratio_min_ring", item_m.run / item_g.run, 3)
        .num("granary_slice_ns_per_item", batch_g.slice, 3)
        .num("baseline_slice_ns_per_item", batch_b.slice, 3)
        .num("slice_ratio", batch_b.slice / batch_g.slice, 3)
        .num("granary_per_item_ns_per_item", item_g.run, 3)
        .num("baseline_per_item_ns_per_item", item_b.run, 3)
        .num("per_item_ratio", item_b.run / item_g.run, 3)
        .num("spin_handoff_ns_p99", spin_p99, 0)
        .num("baseline_spin_handoff_ns_p50", base_p50, 0)
        .num("baseline_spin_handoff_ns_p99", base_p99, 0)
        .num("parked_handoff_us_p99", parked_p99, 2)
        .int("batch", o.batch)
        .int("items", o.items)
        .int("reps", o.reps as u64)
        .int("nproc", nproc as u64)
        .str("regime", regime)
        .str("distance", distance)
        .int("near_reps", near as u64)
        .num("probe_ns_p50_median", report::median(&probes), 0)
        .num("ratio_near", by_distance[0].1 .2, 3)
        .num("ratio_far", by_distance[1].1 .2, 3)
        .int("runs_distinct_cpus", distinct as u64)
        .int("runs", placements.len() as u64)
        .num("parked_distinct_cpu_pct", parked_distinct, 1);
    if o.attribution {
        for &publish in &modes {
            for &kind in kinds.iter().skip(3) {
                let key = format!(
                    "{}_{}_ns_per_item",
                    kind.name(),
                    if publish.k() == 1 {
                        "per_item"
                    } else {
                        "batched"
                    }
                );
                j.num(&key.replace('+', "_"), summary(publish, kind).run, 3);
            }
        }
    }
    println!("{}", j.line());
    Ok(())
}

// ---------------------------------------------------------------------------
// Peer

fn arg(args: &[String], i: usize) -> Result<&str> {
    args.get(i)
        .map(String::as_str)
        .ok_or_else(|| format!("peer: missing argument {i}").into())
}

fn run_peer(args: &[String]) -> Result<()> {
    let role = arg(args, 0)?;
    let kind = Kind::parse(arg(args, 1)?)?;
    peer::with_shared_fd(|fd| match role {
        "tp" => {
            let n: u64 = arg(args, 2)?.parse()?;
            let pop: usize = arg(args, 3)?.parse()?;
            let epoch: u64 = arg(args, 4)?.parse()?;
            match kind {
                Kind::Granary => consume_granary(fd, epoch, n, pop),
                Kind::Baseline(_) | Kind::MinRing => {
                    let (variant, cache_peer) = kind.baseline().ok_or("not a baseline ring")?;
                    consume_baseline(fd, n, pop, arg(args, 5)?.parse()?, variant, cache_peer)
                }
            }
        }
        "pp" => {
            let parked = arg(args, 2)? == "parked";
            let total: usize = arg(args, 3)?.parse()?;
            let epoch: u64 = arg(args, 4)?.parse()?;
            let cpu_every: usize = arg(args, 5)?.parse()?;
            match kind {
                Kind::Granary => echo_granary(fd, epoch, parked, total, cpu_every),
                Kind::Baseline(_) | Kind::MinRing => echo_baseline(fd, total, cpu_every),
            }
        }
        _ => Err(format!("peer: unknown role {role}").into()),
    })
}

fn attach_granary(
    fd: BorrowedFd<'_>,
    epoch: u64,
) -> Result<(Consumer<BatchDescriptor>, Producer<ReleaseDescriptor>)> {
    let mut seg = LoaderSegment::attach_fd(fd, Some(epoch))?;
    Ok(seg.take_endpoints().ok_or("endpoints already taken")?)
}

fn say_done(sum: u64, ok: bool, empty_polls: u64, cpus: &CpuSamples) -> Result<()> {
    peer::say(&[
        "done",
        &sum.to_string(),
        if ok { "1" } else { "0" },
        &empty_polls.to_string(),
        &cpus.encode(),
    ])?;
    Ok(())
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
fn consume_granary(fd: BorrowedFd<'_>, epoch: u64, n: u64, pop: usize) -> Result<()> {
    let (mut cons, _release) = attach_granary(fd, epoch)?;
    let mut buf = vec![BatchDescriptor::default(); pop];
    let mut cpus = CpuSamples::default();
    cpus.sample();
    peer::say(&["ready"])?;
    let (mut next, mut sum, mut ok, mut polls) = (0u64, 0u64, true, 0u64);
    let mut sample_at = SAMPLE_EVERY;
    while next < n {
        let got = cons.pop_into(&mut buf)?;
        if got == 0 {
            polls += 1;
            if !cons.wait_for_data(Some(TIMEOUT))? {
                return Err("granary ring: producer stalled".into());
            }
            continue;
        }
        ok &= absorb(&buf[..got], &mut next, &mut sum);
        if next >= sample_at {
            cpus.sample();
            sample_at += SAMPLE_EVERY;
        }
    }
    say_done(sum, ok && next == n, polls, &cpus)
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
fn consume_baseline(
    fd: BorrowedFd<'_>,
    n: u64,
    pop: usize,
    cap: usize,
    variant: Variant,
    cache_peer: bool,
) -> Result<()> {
    let region = baseline_attach(fd)?;
    // SAFETY: the parent created the zeroed ring and its only producer; this
    // is the only consumer.
    let mut cons = unsafe { baseline::consumer::<BatchDescriptor>(region, 0, cap) };
    cons.set_variant(variant);
    cons.set_cache_peer(cache_peer);
    let mut buf = vec![BatchDescriptor::default(); pop];
    let mut cpus = CpuSamples::default();
    cpus.sample();
    peer::say(&["ready"])?;
    let deadline = Instant::now() + TIMEOUT * 30;
    let (mut next, mut sum, mut ok, mut polls) = (0u64, 0u64, true, 0u64);
    let mut sample_at = SAMPLE_EVERY;
    while next < n {
        let got = cons.pop_into(&mut buf);
        if got == 0 {
            polls += 1;
            cons.wait_for_data(deadline)?;
            continue;
        }
        ok &= absorb(&buf[..got], &mut next, &mut sum);
        if next >= sample_at {
            cpus.sample();
            sample_at += SAMPLE_EVERY;
        }
    }
    say_done(sum, ok && next == n, polls, &cpus)
}

fn cpu_word() -> u64 {
    current_cpu().map_or(NO_CPU, u64::from)
}

fn echo_granary(
    fd: BorrowedFd<'_>,
    epoch: u64,
    parked: bool,
    total: usize,
    cpu_every: usize,
) -> Result<()> {
    let (mut ping, mut pong) = attach_granary(fd, epoch)?;
    let spin = if parked { Duration::ZERO } else { LONG_SPIN };
    ping.set_spin(spin);
    pong.set_spin(spin);
    peer::say(&["ready"])?;
    let mut cpu = NO_CPU;
    for i in 0..total {
        let d = ping.pop_blocking(Some(TIMEOUT))?;
        let r = ReleaseDescriptor {
            seq: d.seq,
            token: std::mem::replace(&mut cpu, NO_CPU),
        };
        if !pong.try_push(r)? {
            return Err("pong ring full".into());
        }
        // Sampled after the pong left, so the read stays out of the timed path;
        // it travels with the next pong.
        if i % cpu_every == 0 {
            cpu = cpu_word();
        }
    }
    peer::say(&["done"])?;
    Ok(())
}

fn echo_baseline(fd: BorrowedFd<'_>, total: usize, cpu_every: usize) -> Result<()> {
    let region = baseline_attach(fd)?;
    let cap = PING_CAPACITY as usize;
    let second = second_ring_offset::<BatchDescriptor>(cap);
    // SAFETY: the parent created the zeroed rings and owns the other ends;
    // this is the only consumer of ring 0 ...
    let mut ping = unsafe { baseline::consumer::<BatchDescriptor>(region.clone(), 0, cap) };
    // SAFETY: ... and the only producer of ring 1.
    let mut pong = unsafe { baseline::producer::<ReleaseDescriptor>(region, second, cap) };
    peer::say(&["ready"])?;
    let deadline = Instant::now() + TIMEOUT * 30;
    let mut one = [BatchDescriptor::default()];
    let mut cpu = NO_CPU;
    for i in 0..total {
        while ping.pop_into(&mut one) == 0 {
            ping.wait_for_data(deadline)?;
        }
        let r = ReleaseDescriptor {
            seq: one[0].seq,
            token: std::mem::replace(&mut cpu, NO_CPU),
        };
        pong.push_batch(1, deadline, |_| r)?;
        if i % cpu_every == 0 {
            cpu = cpu_word();
        }
    }
    peer::say(&["done"])?;
    Ok(())
}
