//! Cold cache: the first epoch through the agent after dropping the page cache, against equal-depth readers of the same files (a minimal io_uring whole-file reader, buffered and O_DIRECT, and fio).
//!
//! Every side reads the synthetic dataset (default 20,000 files, ~110 KB
//! each, ~2.2 GB) under the same conditions:
//!
//! 1. `sync; echo 3 > /proc/sys/vm/drop_caches` (file data, dentries and
//!    inodes are dropped; needs root, and without it the run says loudly
//!    that nothing was cold);
//! 2. every file is stat'ed once, as the agent's catalog does when it
//!    starts and as fio does while it sets its job up, so metadata is warm
//!    and file data cold on every side;
//! 3. timed, every reader at the agent's queue depth (`--inflight`, default
//!    256 = `prefetch.max_inflight_reads`):
//!    * a fresh in-process agent's first epoch, from opening the session to
//!      releasing its last batch (the loader takes each batch and hands it
//!      back; `--touch` makes it read every byte too), `direct_io` unset
//!      (the agent's default: `O_DIRECT` when the files are mostly not in
//!      the page cache); `granary-direct`: the same agent with
//!      `direct_io = true` (`O_DIRECT` reads);
//!    * `uring`: a minimal io_uring reader ([`granary_bench::uring_read`]),
//!      `openat` → one read of the whole file → `close` per file, that many
//!      files in flight, buffered; `uring-direct`: the same with `O_DIRECT`;
//!    * fio's own I/O phase (`read runtime`) with `--ioengine=io_uring
//!      --iodepth=<depth> --rw=read --direct=0 --numjobs=1
//!      --file_service_type=sequential` over the dataset folder as its one
//!      file list (`--opendir`).
//!
//! fio cannot read a set of files of different sizes one whole file per
//! read: with a fixed block size it stops at each file's last whole block
//! (a block larger than a file skips the file, and `--filesize` makes fio
//! extend the files to that size), and a block range draws random lengths.
//! Two fio block settings are run: `--bs=4k` (every whole 4 KiB page of
//! every file, ~98% of the bytes) and `--bsrange=512-128k
//! --bs_unaligned=1` (reads of random sizes up to 128 KiB, ~99.8% of the
//! bytes). The bytes each side read are printed.
//!
//! The sides alternate (`--reps` times each, the order reversing every
//! repetition); medians are reported. `ratio_equal_depth` is Granary's
//! median (its default, buffered reads) over the best reader's median (goal
//! ≥ 0.95); `granary-direct` is reported beside it, against `uring-direct`. `--sweep` also runs
//! the agent with other `prefetch.max_inflight_reads` and window settings.

use granary::{Client, SessionOptions};
use granary_bench::agent::{Agent, AgentSettings};
use granary_bench::cli::Args;
use granary_bench::data::{self, Dataset};
use granary_bench::loader::{self, Wait};
use granary_bench::report::{median, Goal, Json};
use granary_bench::sys;
use granary_bench::touch::touch;
use granary_bench::uring_read::{self, FileToRead};
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The goal: at least 0.95x the best reader that keeps as many reads in
/// flight (`ratio_equal_depth`).
const GOAL: Goal = Goal::at_least("goal", 0.95);

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: bench/run cold [options]
  --files N        files in the synthetic dataset (default 20000)
  --mean-size B    mean file size in bytes (default 110000)
  --reps N         runs of each side (default 3)
  --batch N        samples per batch (default 32)
  --inflight N     prefetch.max_inflight_reads, and the depth of every reader
                   (default 256, the agent's default)
  --window N       prefetch.window_batches (default 16, the agent's default)
  --fio-bs LIST    fio block settings, comma-separated: a size (4k, 128k)
                   or a range MIN-MAX (unaligned sizes); default 4k,512-128k
  --touch          the loader reads every byte of every sample
  --sweep          also run the agent with other in-flight / window settings
  --no-fio         skip fio
  --no-uring       skip the io_uring whole-file reader
  --warm-page-cache  read every file once before each run instead of dropping
                   the page cache: NOT a cold read (every read is served from
                   the page cache), for comparing read paths on cached files;
                   the goal is not judged";

/// `--warm-page-cache`: every run starts with the dataset in the page cache.
static WARM_PAGE_CACHE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Clone, Copy, Debug)]
struct Knobs {
    batch: u32,
    inflight: u32,
    window: u32,
    /// `dataset[0].direct_io = true`; false leaves it unset (the default).
    direct: bool,
}

impl Knobs {
    fn label(&self) -> String {
        format!(
            "batch {} window {} max_inflight_reads {}{}",
            self.batch,
            self.window,
            self.inflight,
            if self.direct { " direct_io" } else { "" }
        )
    }
}

/// One side of a repetition.
#[derive(Clone, Copy)]
enum Side {
    /// The agent, with `direct_io` or not.
    Agent { direct: bool },
    /// `readers[i]`.
    Reader(usize),
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cold: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse(
        std::env::args().skip(1),
        &["touch", "sweep", "no-fio", "no-uring", "warm-page-cache"],
        USAGE,
    )?;
    let files = args.u64("files", 20_000)?;
    let mean = args.u64("mean-size", 110_000)?;
    let reps = args.u32("reps", 3)?.max(1);
    let fio_bs: Vec<String> = args
        .string("fio-bs", "4k,512-128k")
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    let touch_bytes = args.flag("touch");
    let knobs = Knobs {
        batch: args.u32("batch", granary::DEFAULT_BATCH_SIZE)?,
        inflight: args.u32("inflight", 256)?,
        window: args.u32("window", 16)?,
        direct: false,
    };

    println!("cold: {}", sys::regime());
    let root = sys::is_root();
    let warm_cache = args.flag("warm-page-cache");
    WARM_PAGE_CACHE.store(warm_cache, Ordering::Relaxed);
    let mut cold = root && !warm_cache;
    if warm_cache {
        println!("cold: --warm-page-cache: every file is read before each run: NOTHING BELOW IS A COLD READ, and the goal is not judged");
    } else if !root {
        println!("cold: WARNING: NOT ROOT: the page cache cannot be dropped, so NOTHING BELOW IS A COLD READ");
    }
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    let arena = (ds.aligned_bytes(4096) * 5 / 4 + (128 << 20)).next_multiple_of(2 << 20);
    println!(
        "dataset: {} files, {:.3} GB in {}; arena {:.3} GB",
        ds.len(),
        ds.bytes as f64 / 1e9,
        ds.spec.root.display(),
        arena as f64 / 1e9
    );
    let fio = !args.flag("no-fio") && fio_version().is_some();
    if !args.flag("no-fio") && !fio {
        return Err(
            "fio not found (bench/run cold installs it with apt-get; or pass --no-fio)".into(),
        );
    }
    if let Some(v) = fio_version() {
        println!("fio: {v}");
    }

    let uring = !args.flag("no-uring");
    let depth = knobs.inflight;
    let files_to_read: Vec<FileToRead> = ds
        .catalog
        .entries()
        .iter()
        .map(|e| FileToRead {
            path: e.path.clone(),
            size: e.size,
        })
        .collect();
    // Every reader besides the agent, by name; each runs at `depth`.
    let mut readers: Vec<Reader> = Vec::new();
    if uring {
        readers.push(Reader::Uring { direct: false });
        readers.push(Reader::Uring { direct: true });
    }
    if fio {
        readers.extend(fio_bs.iter().map(|bs| Reader::Fio(bs.clone())));
    }
    println!(
        "depth: {depth} (agent prefetch.max_inflight_reads; every reader's queue depth / files in flight)"
    );

    let mut granary_rates = Vec::new();
    let mut direct_rates = Vec::new();
    let mut reader_rates = vec![Vec::new(); readers.len()];
    let mut fio_wall_rates = vec![Vec::new(); readers.len()];
    for rep in 0..reps {
        // A B C … then … C B A: every side sees both ends of the repetition.
        let mut order: Vec<Side> = [false, true]
            .map(|direct| Side::Agent { direct })
            .into_iter()
            .chain((0..readers.len()).map(Side::Reader))
            .collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for side in order {
            match side {
                Side::Agent { direct } => {
                    let k = Knobs { direct, ..knobs };
                    let r = granary_epoch(&ds, arena, k, touch_bytes, &mut cold)?;
                    let name = if direct { "granary-direct" } else { "granary" };
                    println!("{name} (run {}/{reps}): {}", rep + 1, r.describe());
                    if direct {
                        direct_rates.push(r.files_per_s);
                    } else {
                        granary_rates.push(r.files_per_s);
                    }
                }
                Side::Reader(i) => match &readers[i] {
                    Reader::Fio(bs) => {
                        let r = fio_run(&ds, bs, depth, &mut cold)?;
                        println!(
                            "{} (run {}/{reps}): {}",
                            readers[i].name(),
                            rep + 1,
                            r.describe()
                        );
                        reader_rates[i].push(r.files_per_s);
                        fio_wall_rates[i].push(r.wall_files_per_s);
                    }
                    Reader::Uring { direct } => {
                        let stat = make_cold(&ds, &mut cold)?;
                        let p = uring_read::read_all(&files_to_read, depth, *direct)
                            .map_err(|e| format!("{}: {e}", readers[i].name()))?;
                        let secs = p.elapsed.as_secs_f64().max(1e-9);
                        println!(
                            "{} (run {}/{reps}): {:.0} files/s, {:.2} s, {:.3} GB read ({:.2} GB/s) in {} reads; stat pass {:.2} s",
                            readers[i].name(),
                            rep + 1,
                            p.files as f64 / secs,
                            secs,
                            p.bytes as f64 / 1e9,
                            p.bytes as f64 / 1e9 / secs,
                            p.reads,
                            stat.as_secs_f64()
                        );
                        reader_rates[i].push(p.files as f64 / secs);
                    }
                },
            }
        }
    }

    let mut best = (knobs, median(&granary_rates));
    if args.flag("sweep") {
        let grid = [
            Knobs {
                inflight: 64,
                ..knobs
            },
            Knobs {
                inflight: 1024,
                ..knobs
            },
            Knobs {
                window: 64,
                ..knobs
            },
            Knobs {
                window: 64,
                inflight: 1024,
                ..knobs
            },
            Knobs {
                batch: 128,
                window: 16,
                inflight: 1024,
                direct: false,
            },
        ];
        for k in grid {
            let r = granary_epoch(&ds, arena, k, touch_bytes, &mut cold)?;
            println!("granary (sweep): {}", r.describe());
            if r.files_per_s > best.1 {
                best = (k, r.files_per_s);
            }
        }
    }

    let g = median(&granary_rates);
    println!("granary: median {g:.0} files/s ({})", knobs.label());
    for (i, r) in readers.iter().enumerate() {
        let m = median(&reader_rates[i]);
        match r {
            Reader::Fio(_) => println!(
                "{}: median {m:.0} files/s over its I/O phase ({:.0} files/s over its whole run); granary ÷ it {:.3}",
                r.name(),
                median(&fio_wall_rates[i]),
                g / m
            ),
            Reader::Uring { .. } => {
                println!("{}: median {m:.0} files/s; granary ÷ it {:.3}", r.name(), g / m)
            }
        }
    }
    let best_of = |keep: &dyn Fn(&Reader) -> bool| {
        readers
            .iter()
            .zip(&reader_rates)
            .filter(|(r, _)| keep(r))
            .map(|(r, v)| (r.name(), median(v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or_else(|| ("none".to_owned(), f64::NAN))
    };
    let (best_name, best_rate) = best_of(&|_| true);
    let (fio_best, f) = best_of(&|r| matches!(r, Reader::Fio(_)));
    let (_, u) = best_of(&|r| matches!(r, Reader::Uring { direct: false }));
    let (_, ud) = best_of(&|r| matches!(r, Reader::Uring { direct: true }));
    let ratio_eq = g / best_rate;
    println!(
        "result: granary {g:.0} files/s, best equal-depth reader {best_rate:.0} files/s ({best_name}, depth {depth}): ratio_equal_depth {ratio_eq:.3} (goal ≥ 0.95: {})",
        if warm_cache {
            "not judged: page cache warm"
        } else if readers.is_empty() {
            "no reader run"
        } else {
            GOAL.verdict(ratio_eq)
        }
    );
    let gd = median(&direct_rates);
    println!(
        "O_DIRECT: granary-direct median {gd:.0} files/s ({:.3}× granary with the default; {:.3}× uring-direct); \
         io_uring reader {ud:.0} files/s direct vs {u:.0} buffered",
        gd / g,
        gd / ud
    );
    if args.flag("sweep") {
        println!(
            "best agent configuration: {}: {:.0} files/s, ratio_equal_depth {:.3}",
            best.0.label(),
            best.1,
            best.1 / best_rate
        );
    }
    if !cold {
        println!("cold: WARNING: the page cache was NOT dropped: these are NOT cold reads");
    }
    println!("after: {}", sys::regime());
    let mut j = Json::bench("cold");
    j.num("granary_files_per_s", g, 0)
        .num("fio_files_per_s", f, 0)
        .num("ratio", g / f, 3)
        .num("uring_files_per_s", u, 0)
        .num("uring_direct_files_per_s", ud, 0)
        .num("granary_direct_files_per_s", gd, 0)
        .num("direct_vs_buffered", gd / g, 3)
        .num("ratio_direct", gd / ud, 3)
        .num("best_reader_files_per_s", best_rate, 0)
        .str("best_reader", &best_name)
        .num("ratio_equal_depth", ratio_eq, 3)
        .str(
            "goal",
            if warm_cache {
                "not judged"
            } else {
                GOAL.verdict(ratio_eq)
            },
        )
        .int("depth", u64::from(depth))
        .str("config", &knobs.label())
        .str("fio_bs", fio_best.trim_start_matches("fio "));
    if args.flag("sweep") {
        j.num("best_files_per_s", best.1, 0)
            .num("best_ratio_equal_depth", best.1 / best_rate, 3)
            .str("best_config", &best.0.label());
    }
    if warm_cache {
        j.str(
            "warning",
            "--warm-page-cache: reads served from the page cache",
        );
    } else if !cold {
        j.str(
            "warning",
            "not root: page cache not dropped, reads were not cold",
        );
    }
    println!("{}", j.line());
    Ok(())
}

/// A reader the agent is compared with.
enum Reader {
    /// fio with this block setting.
    Fio(String),
    /// The minimal io_uring whole-file reader.
    Uring { direct: bool },
}

impl Reader {
    fn name(&self) -> String {
        match self {
            Reader::Fio(bs) => format!("fio {bs}"),
            Reader::Uring { direct: false } => "uring".to_owned(),
            Reader::Uring { direct: true } => "uring-direct".to_owned(),
        }
    }
}

/// Drops the page cache (or records that it could not; with
/// `--warm-page-cache` reads every file instead), then stats every file.
/// Returns how long the stat pass took.
fn make_cold(ds: &Dataset, cold: &mut bool) -> Result<Duration> {
    if WARM_PAGE_CACHE.load(Ordering::Relaxed) {
        for e in ds.catalog.entries() {
            std::fs::read(&e.path).map_err(|err| format!("{}: {err}", e.path.display()))?;
        }
    } else if *cold {
        if let Err(e) = sys::drop_caches() {
            println!("cold: WARNING: {e}: the page cache was NOT dropped");
            *cold = false;
        }
    }
    data::stat_all(ds).map_err(|e| format!("stat: {e}"))
}

struct AgentEpoch {
    knobs: Knobs,
    files_per_s: f64,
    secs: f64,
    bytes_read: u64,
    stat: Duration,
    first_batch: Duration,
    waited: Duration,
    read_p50: Option<f64>,
    read_p99: Option<f64>,
    engine_cpu: Duration,
    loader_cpu: Duration,
    peak_inflight: u64,
}

impl AgentEpoch {
    fn describe(&self) -> String {
        format!(
            "{}: {:.0} files/s, {:.2} s, {:.3} GB read ({:.2} GB/s); stat pass {:.2} s; first batch {:.1} ms; \
             loader waited {:.0}%; read latency p50 {} p99 {}; peak reads in flight {}; CPU: engine {:.0}%, loader {:.0}%",
            self.knobs.label(),
            self.files_per_s,
            self.secs,
            self.bytes_read as f64 / 1e9,
            self.bytes_read as f64 / 1e9 / self.secs,
            self.stat.as_secs_f64(),
            self.first_batch.as_secs_f64() * 1e3,
            self.waited.as_secs_f64() / self.secs * 100.0,
            fmt_secs(self.read_p50),
            fmt_secs(self.read_p99),
            self.peak_inflight,
            self.engine_cpu.as_secs_f64() / self.secs * 100.0,
            self.loader_cpu.as_secs_f64() / self.secs * 100.0,
        )
    }
}

fn fmt_secs(s: Option<f64>) -> String {
    match s {
        Some(s) if s < 1e-3 => format!("≤{:.0} µs", s * 1e6),
        Some(s) => format!("≤{:.1} ms", s * 1e3),
        None => "-".to_owned(),
    }
}

/// Caches dropped (before the agent starts: its `direct_io` default looks
/// at the page cache when it opens the dataset); a fresh agent; one epoch.
fn granary_epoch(
    ds: &Dataset,
    arena: u64,
    k: Knobs,
    touch_bytes: bool,
    cold: &mut bool,
) -> Result<AgentEpoch> {
    let mut settings = AgentSettings::new(arena, "cold", &ds.spec.root);
    settings.max_inflight_reads = k.inflight;
    settings.window_batches = k.window;
    settings.direct_io = k.direct.then_some(true);
    let stat = make_cold(ds, cold)?;
    let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new("cold");
    opts.seed = 7;
    opts.batch_size = k.batch;
    opts.epoch_count = 1;
    // Peak reads in flight, sampled by a watcher thread.
    let peak = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let me = sys::thread_name();
    let cpu0 = sys::thread_cpu();
    let t = Instant::now();
    let run = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let n = agent.metrics().reads_in_flight.get();
                peak.fetch_max(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let r = loader::consume(&client, &opts, Wait::Block, |smp| {
            Ok(if touch_bytes { touch(smp.bytes) } else { 0 })
        });
        done.store(true, Ordering::Relaxed);
        r
    })?;
    let secs = t.elapsed().as_secs_f64();
    let cpu1 = sys::thread_cpu();
    let delivered: u64 = run.epochs.iter().map(|e| e.samples).sum();
    if delivered != ds.len() {
        return Err(format!(
            "{delivered} samples delivered, {} expected",
            ds.len()
        ));
    }
    let m = agent.metrics();
    let out = AgentEpoch {
        knobs: k,
        files_per_s: ds.len() as f64 / secs,
        secs,
        bytes_read: m.bytes_read.get(),
        stat,
        first_batch: run.first_batch,
        waited: run.epochs.iter().map(|e| e.waited).sum(),
        read_p50: m.read_latency.quantile(0.5),
        read_p99: m.read_latency.quantile(0.99),
        engine_cpu: sys::cpu_of(&cpu1, "granary-engine")
            .saturating_sub(sys::cpu_of(&cpu0, "granary-engine")),
        loader_cpu: sys::cpu_of(&cpu1, &me).saturating_sub(sys::cpu_of(&cpu0, &me)),
        peak_inflight: peak.load(Ordering::Relaxed),
    };
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;
    Ok(out)
}

fn fio_version() -> Option<String> {
    let o = Command::new("fio").arg("--version").output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

struct FioRun {
    files_per_s: f64,
    wall_files_per_s: f64,
    runtime: Duration,
    wall: Duration,
    bytes: u64,
    ios: u64,
    stat: Duration,
}

impl FioRun {
    fn describe(&self) -> String {
        format!(
            "{:.0} files/s over its I/O phase ({:.2} s; {:.0} files/s over the whole {:.2} s run), \
             {:.3} GB read ({:.2} GB/s) in {} reads; stat pass {:.2} s",
            self.files_per_s,
            self.runtime.as_secs_f64(),
            self.wall_files_per_s,
            self.wall.as_secs_f64(),
            self.bytes as f64 / 1e9,
            self.bytes as f64 / 1e9 / self.runtime.as_secs_f64().max(1e-9),
            self.ios,
            self.stat.as_secs_f64(),
        )
    }
}

/// fio's command line for the dataset at queue depth `depth`; `bs` is a
/// block size or a `MIN-MAX` range of unaligned sizes.
fn fio_args(ds: &Dataset, bs: &str, depth: u32) -> Vec<String> {
    let block = match bs.split_once('-') {
        Some(_) => vec![format!("--bsrange={bs}"), "--bs_unaligned=1".to_owned()],
        None => vec![format!("--bs={bs}")],
    };
    let mut v: Vec<String> = vec![
        "--name=cold".into(),
        format!("--opendir={}", ds.spec.root.display()),
        "--ioengine=io_uring".into(),
        format!("--iodepth={depth}"),
        "--rw=read".into(),
        "--direct=0".into(),
        "--numjobs=1".into(),
        format!("--openfiles={depth}"),
        "--file_service_type=sequential".into(),
        "--output-format=terse".into(),
        "--terse-version=3".into(),
    ];
    v.extend(block);
    v
}

fn fio_run(ds: &Dataset, bs: &str, depth: u32, cold: &mut bool) -> Result<FioRun> {
    let stat = make_cold(ds, cold)?;
    let args = fio_args(ds, bs, depth);
    let t = Instant::now();
    let out = Command::new("fio")
        .args(&args)
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    let wall = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "fio {} failed: {}{}",
            args.join(" "),
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Terse v3: 1 version; 2 fio version; 3 job name; 4 group; 5 error;
    // 6 read KiB; 7 read KiB/s; 8 read IOPS; 9 read runtime (ms).
    let line = text
        .lines()
        .find(|l| l.starts_with("3;"))
        .ok_or_else(|| format!("no terse line in fio's output: {text}"))?;
    let f: Vec<&str> = line.split(';').collect();
    let num = |i: usize| -> Result<u64> {
        f.get(i - 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("fio terse field {i} missing in: {line}"))
    };
    if num(5)? != 0 {
        return Err(format!("fio reported error {}", num(5)?));
    }
    let kib = num(6)?;
    let runtime = Duration::from_millis(num(9)?.max(1));
    let iops = num(8)?;
    let bytes = kib * 1024;
    if bytes < ds.bytes * 9 / 10 {
        return Err(format!(
            "fio read only {bytes} of the dataset's {} bytes ({})",
            ds.bytes,
            args.join(" ")
        ));
    }
    Ok(FioRun {
        files_per_s: ds.len() as f64 / runtime.as_secs_f64(),
        wall_files_per_s: ds.len() as f64 / wall.as_secs_f64(),
        runtime,
        wall,
        bytes,
        ios: (iops as f64 * runtime.as_secs_f64()).round() as u64,
        stat,
    })
}
