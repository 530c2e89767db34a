//! S3 latency: samples/s against the store's round-trip time (0–200 ms, a delay proxy in front of SeaweedFS and of a light S3 store) for Granary, PyTorch DataLoaders doing one boto3 GET per sample (8 and 32 workers), 64 threaded GETs (4 workers × 16) and s3torchconnector.
//!
//! One run:
//!
//! 1. the synthetic dataset (default 40,000 files, ~110 KB each, ~4.4 GB:
//!    Granary's cold epoch lasts long enough for a window of about 10 s)
//!    is generated once under `bench/.data/`;
//! 2. a SeaweedFS (`weed mini`, [`granary_bench::seaweed`]) starts on free
//!    loopback ports in a fresh directory, and `granary ingest`'s code
//!    uploads the dataset into its bucket (straight to the S3 port) and
//!    reads every object back (`--verify`: the upload is checked, and the
//!    store's caches are in the same state for every point, the first one
//!    included); the run then waits until SeaweedFS is idle;
//! 3. the delay proxy ([`granary_bench::delay_proxy`]) starts in this
//!    process in front of SeaweedFS's S3 port; every client below talks to
//!    the proxy. For each round-trip time the proxy delays each direction by
//!    half of it, and three loaders are measured one after the other:
//!    * **granary**: a fresh in-process agent (the real engine) serving the
//!      bucket as a `kind = "s3"` dataset through the proxy, read by one
//!      libgranary session (batches of 32, one epoch): every sample's
//!      header is checked (magic, id, class, length), every byte is XORed
//!      once, and every 16th sample is verified byte for byte. A fresh
//!      agent per point and the first epoch only: every measured sample
//!      comes from the store, never from the arena (the run reports the
//!      arena hits: 0). Hiding a round trip takes `rate × RTT` requests in
//!      flight (Little's law: 3,000 samples/s × 0.2 s = 600), so the agent
//!      runs with `prefetch.max_inflight_reads` 1,024 (the S3 fetcher's
//!      capacity), a window of 64 batches (2,048 samples) and a 1 GiB
//!      arena (`--inflight` takes a list to compare values). Next to every
//!      round-trip time above 0 the agent is also measured at 0 ms (before
//!      the point at every other one): on a machine shared with other
//!      work the CPU left to the store changes from minute to minute, and
//!      the references show how far the machine drifted. The goal's ratio
//!      divides the 100 ms rate by the median of all these 0 ms
//!      measurements; the ratios to the neighbour alone and to the sweep's
//!      0 ms point are reported too;
//!    * **dataloader_w8**, **dataloader_w32**:
//!      `bench/latency_dataloader.py`, a PyTorch `DataLoader` over a
//!      map-style Dataset doing one boto3 `get_object` per sample (body read
//!      whole, length and magic checked), `num_workers` 8 and 32, batches
//!      of 32, shuffled;
//!    * **boto3_threads**, **s3torch_map**, **s3torch_iter**
//!      (`--contenders`): the per-sample loaders of `bench/run stall`, with
//!      its settings (4 workers × 16 threads; s3torchconnector's map and
//!      iterable datasets with 8 workers), run by `bench/stall_train.py`
//!      with no GPU step, so that they deliver as fast as they can; their
//!      CPU is their whole process tree's;
//! 4. the same sweep runs against the **light store**
//!    ([`granary_bench::light_store`], `--store light|seaweed|both`): the
//!    dataset's folder served read-only as the same bucket and keys by a
//!    hyper HTTP/1.1 server on threads of this process, each request one
//!    `open` and one `pread` from the page cache. SeaweedFS takes more than
//!    a core at these rates and caps every client alike; the light store
//!    leaves the CPU to the clients, so that the comparison is about their
//!    latency hiding and their CPU per sample. Its goals (issue 14):
//!    Granary at 100 ms ≥ 0.9 × Granary at 0 ms, and ≥ 2 × the best
//!    contender at 100 ms; the store's cores at 0 ms are printed to show
//!    it is not the bottleneck (below half a core for every client);
//! 5. the results are printed, plotted into `docs/latency.png`
//!    (`bench/latency_plot.py`, matplotlib) and summed up in the last line.
//!
//! **Steady state.** Each measurement skips the ramp-up and counts the
//! samples finished in a window: Granary from `--warmup-s` seconds after
//! its first batch until `--window-s` later or until 95 % of the epoch has
//! been delivered, whichever comes first (the epoch's tail, where the
//! prefetch window drains, is never measured); the DataLoader from
//! `--warmup-s` seconds after every worker has finished its first sample,
//! for `--window-s` seconds, counted where the samples are fetched (its
//! sampler never ends an epoch inside the window).
//!
//! **Where the CPU goes.** For every window the run records the CPU time of
//! SeaweedFS, of the proxy's threads, of the agent's engine and S3 fetcher
//! threads and of the loader (or of the Python processes), and of the
//! whole machine including steal time, in cores (CPU seconds per second);
//! what nobody here used is other processes' ("everything else"), and a
//! window where they took more than a quarter of a core is flagged as
//! contended. Each measurement starts once the machine has been quiet for
//! 2 s (waiting at most `--quiet-wait-s`). Every loader follows the same
//! rules: a contended window is measured again only with `--retries` (0 by
//! default), for every loader alike, and with `--repeat N` every point is
//! measured N times, the loaders interleaved, and the median kept. Every
//! point also reports CPU microseconds per delivered sample of the store,
//! the proxy, the agent, the loader thread and the Python processes.
//! Throughput on a shared machine follows the CPU the store gets, so each
//! point also reports samples per CPU-second of SeaweedFS. Everything is
//! in the last line's `*_detail` arrays.

use granary::{Client, SessionOptions};
use granary_bench::agent::{Agent, AgentSettings, S3Dataset};
use granary_bench::cli::Args;
use granary_bench::data::{self, Dataset};
use granary_bench::delay_proxy::DelayProxy;
use granary_bench::latency::format;
use granary_bench::light_store::{self, LightStore};
use granary_bench::loader::{self, Wait};
use granary_bench::report::{self, json_num, median, Goal, Json};
use granary_bench::s3_data;
use granary_bench::seaweed::Seaweed;
use granary_bench::stall_loaders;
use granary_bench::store::Store;
use granary_bench::sys;
use granary_bench::sys::{cpu_model, process_cpu, wait_quiet, MachineCpu};
use granary_bench::touch::touch;
use granary_tools::synth;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: bench/run latency [options]
  --files N          files in the synthetic dataset (default 40000)
  --mean-size B      mean file size in bytes (default 110000)
  --rtt-ms LIST      round-trip times, comma-separated (default 0,2,10,50,100,200)
  --workers LIST     DataLoader num_workers values (default 8,32)
  --contenders LIST  more loaders, run by bench/stall_train.py with no GPU step (default
                     boto3_threads,s3torch_map,s3torch_iter; `none`: only the DataLoaders)
  --batch N          samples per batch, both loaders (default 32)
  --warmup-s S       ramp-up skipped before each window (default 2)
  --window-s S       length of each window (default 12)
  --inflight LIST    Granary: prefetch.max_inflight_reads (default 1024); Granary is
                     measured with each value, the first is the main column
  --window N         Granary: prefetch.window_batches (default 64)
  --initial-window N Granary: prefetch.initial_window (default 2, the agent's)
  --arena BYTES      Granary: arena.size (default max(1 GiB, largest inflight × 1 MiB))
  --ready N          Granary: sessions.ready_ring_capacity (default 128)
  --agent-keys LIST  Granary: more keys, `section.key=value;...` (`dataset.key=value`
                     goes into the [[dataset]] table)
  --verify-every N   Granary: verify every Nth sample byte for byte (default 16)
  --no-granary       skip Granary
  --no-pair          do not measure Granary at 0 ms next to every other RTT
  --quiet-wait-s S   before each measurement, wait up to S s for the machine to be
                     quiet (under 0.2 busy cores for 2 s; default 10, 0: never)
  --retries N        every loader alike: measure a contended window again, up to N times,
                     and keep the least contended attempt (default 0)
  --repeat N         measure every point N times, the loaders interleaved (A B C A B C),
                     and keep the median (default 1)
  --store WHICH      seaweed, light or both (default both: SeaweedFS first)
  --light-threads N  the light store's worker threads (default 1)
  --no-dataloader    skip the DataLoaders
  --plot PATH        where the plot goes (default docs/latency.png, the light store's
                     beside it as docs/latency_light.png; `none`: no plot)
  --python PATH      the Python interpreter (default $PYTHON, else python3)
  --format FMT       instead of the sweep: Granary over shards (webdataset, mds or
                     parquet, written once under bench/.data/) against one object per
                     sample, on the light store, at --format-rtt-ms (default 100),
                     --repeat times each (default 3), interleaved; goal format_ratio >= 0.9
  --shard-mib N      with --format: shard size (default 64)";

/// Where the S3 objects live.
const BUCKET: &str = "granary-bench";
/// Key prefix of the dataset in the bucket.
const PREFIX: &str = "synth";
/// The dataset's name in the agent.
const DATASET: &str = "latency";
/// The loader callback's way of ending a session once its window closed.
const STOP_EARLY: &str = "(window closed)";
/// The store's cores at 0 ms below which it is not what limits a client.
const STORE_BOTTLENECK: f64 = 0.5;
/// Cores taken by other processes above which a window counts as contended.
const CONTENDED: f64 = 0.25;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The Granary knobs of a run.
#[derive(Clone, Debug)]
struct GranaryKnobs {
    batch: u32,
    inflight: u32,
    window: u32,
    initial_window: u32,
    arena: u64,
    ready: u32,
    /// (section, line): extra agent keys; section `dataset` is the table.
    extra: Vec<(String, String)>,
    verify_every: u64,
}

/// Timing rules of a measurement.
#[derive(Clone, Copy, Debug)]
struct Windowing {
    warmup: Duration,
    window: Duration,
}

/// CPU time counters read at the edges of a window.
#[derive(Clone, Debug, Default)]
struct CpuMark {
    at: Option<Instant>,
    /// SeaweedFS's process (zero for the light store, whose threads are in
    /// `threads`).
    weed: Duration,
    store_in_process: bool,
    /// This process, every thread (exited ones included).
    own: Duration,
    threads: Vec<(String, Duration)>,
    machine: MachineCpu,
}

impl CpuMark {
    fn take(store: &Store) -> CpuMark {
        CpuMark {
            at: Some(Instant::now()),
            weed: store.weed_pid().map_or(Duration::ZERO, process_cpu),
            store_in_process: store.in_process(),
            own: process_cpu(std::process::id()),
            threads: sys::thread_cpu(),
            machine: MachineCpu::read(),
        }
    }
}

/// Cores used over a window, by consumer.
#[derive(Clone, Debug, Default)]
struct CpuUse {
    /// The store: SeaweedFS's process, or the light store's threads in
    /// this process.
    store: f64,
    store_in_process: bool,
    proxy: f64,
    engine: f64,
    fetcher: f64,
    loader: f64,
    /// The Python processes (DataLoader runs).
    python: f64,
    /// This process, all threads: the loader, the proxy, and for Granary
    /// the agent's threads.
    own: f64,
    /// Whole machine: busy cores (user, system, irq, softirq), the softirq
    /// part of it (the loopback network), and stolen.
    busy: f64,
    softirq: f64,
    steal: f64,
}

impl CpuUse {
    fn between(a: &CpuMark, b: &CpuMark) -> CpuUse {
        let secs = match (a.at, b.at) {
            (Some(x), Some(y)) => y.duration_since(x).as_secs_f64().max(1e-9),
            _ => return CpuUse::default(),
        };
        let th = |name: &str| {
            sys::cpu_of(&b.threads, name)
                .saturating_sub(sys::cpu_of(&a.threads, name))
                .as_secs_f64()
                / secs
        };
        let (busy, softirq, steal) = b.machine.since(&a.machine);
        CpuUse {
            store: if b.store_in_process {
                th(light_store::THREAD_NAME)
            } else {
                b.weed.saturating_sub(a.weed).as_secs_f64() / secs
            },
            store_in_process: b.store_in_process,
            own: b.own.saturating_sub(a.own).as_secs_f64() / secs,
            proxy: th("delay-proxy"),
            engine: th("granary-engine"),
            fetcher: th("granary-s3"),
            loader: th("latency"),
            python: 0.0,
            busy,
            softirq,
            steal,
        }
    }

    /// Busy cores not accounted to SeaweedFS, this process or the Python
    /// processes: other processes on the machine, and kernel work done
    /// outside them (softirqs in their own threads).
    fn rest(&self) -> f64 {
        let outside = if self.store_in_process {
            0.0
        } else {
            self.store
        };
        (self.busy - outside - self.own - self.python).max(0.0)
    }

    /// CPU microseconds per delivered sample of each consumer at `rate`
    /// samples/s: store, proxy, agent (engine and S3 fetcher), loader
    /// thread, Python processes; and the client side's total (agent and
    /// loader, or the Python processes).
    fn us_per_sample(&self, rate: f64) -> [(&'static str, f64); 6] {
        let us = |cores: f64| {
            if rate > 0.0 {
                cores / rate * 1e6
            } else {
                f64::NAN
            }
        };
        [
            ("store", us(self.store)),
            ("proxy", us(self.proxy)),
            ("agent", us(self.engine + self.fetcher)),
            ("loader", us(self.loader)),
            ("python", us(self.python)),
            (
                "client",
                us(self.engine + self.fetcher + self.loader + self.python),
            ),
        ]
    }

    fn line(&self) -> String {
        let mut s = format!(
            "{} {:.2}, proxy {:.2}",
            if self.store_in_process {
                "light store"
            } else {
                "weed"
            },
            self.store,
            self.proxy
        );
        if self.engine > 0.0 || self.fetcher > 0.0 {
            let _ = write!(
                s,
                ", engine {:.2}, S3 fetcher {:.2}, loader {:.2}",
                self.engine, self.fetcher, self.loader
            );
        }
        if self.python > 0.0 {
            let _ = write!(s, ", python {:.2}", self.python);
        }
        let _ = write!(
            s,
            "; this process {:.2}; machine busy {:.2} (softirq {:.2}), everything else {:.2}, steal {:.2}",
            self.own,
            self.busy,
            self.softirq,
            self.rest(),
            self.steal
        );
        s
    }

    fn json(&self) -> String {
        format!(
            "{{\"store\":{:.3},\"weed\":{:.3},\"proxy\":{:.3},\"engine\":{:.3},\"s3_fetcher\":{:.3},\"loader\":{:.3},\"python\":{:.3},\"bench_process\":{:.3},\"machine_busy\":{:.3},\"softirq\":{:.3},\"rest\":{:.3},\"steal\":{:.3}}}",
            self.store,
            if self.store_in_process {
                0.0
            } else {
                self.store
            },
            self.proxy,
            self.engine,
            self.fetcher,
            self.loader,
            self.python,
            self.own,
            self.busy,
            self.softirq,
            self.rest(),
            self.steal
        )
    }
}

/// Runs one measurement after [`wait_quiet`], recording the wait; a
/// contended one (other processes took more than [`CONTENDED`] cores) is
/// run again, up to `retries` times, and the least contended attempt is
/// kept (every attempt's rate and contention are recorded in it).
fn measured(limit: Duration, retries: u32, mut f: impl FnMut() -> Result<Point>) -> Point {
    let mut best: Option<Point> = None;
    let mut attempts: Vec<(f64, f64)> = Vec::new();
    for attempt in 0..=retries {
        let (waited, quiet) = if limit.is_zero() {
            (Duration::ZERO, false)
        } else {
            wait_quiet(limit)
        };
        let mut p = f().unwrap_or_else(Point::failed);
        p.quiet_wait_s = waited.as_secs_f64();
        p.started_quiet = quiet;
        let failed = p.error.is_some();
        attempts.push((p.samples_per_s, p.cpu.rest()));
        let contended = p.cpu.rest() > CONTENDED;
        if contended && attempt < retries && !failed {
            println!(
                "    (contended: other processes took {:.2} cores, {:.0} samples/s; measuring again)",
                p.cpu.rest(),
                p.samples_per_s
            );
        }
        if best
            .as_ref()
            .is_none_or(|b| b.error.is_some() || (!failed && p.cpu.rest() < b.cpu.rest()))
        {
            best = Some(p);
        }
        if !contended || failed {
            break;
        }
    }
    let mut p = best.unwrap_or_else(|| Point::failed("not measured".into()));
    p.attempts = attempts;
    p
}

/// One measured point of one loader.
#[derive(Clone, Debug, Default)]
struct Point {
    samples_per_s: f64,
    mb_per_s: f64,
    /// Samples inside the window, and its length.
    samples: u64,
    window_s: f64,
    /// From the start (session open / process start) to the steady state
    /// (first batch / every worker busy).
    ramp_s: f64,
    cpu: CpuUse,
    /// Free-form details for the human-readable lines.
    note: String,
    /// Extra JSON fields (`"key":value,...`), without braces.
    json_extra: String,
    error: Option<String>,
    /// How long the run waited for the machine to be quiet before this
    /// measurement, and whether it was.
    quiet_wait_s: f64,
    started_quiet: bool,
    /// Every attempt: (samples/s, cores other processes took).
    attempts: Vec<(f64, f64)>,
    /// Every repeat's samples/s, when the point is the median of several.
    repeats: Vec<f64>,
}

impl Point {
    /// Samples per CPU-second SeaweedFS got: the rate with the store's
    /// share of a contended machine taken out.
    fn per_store_core(&self) -> f64 {
        if self.cpu.store > 0.0 {
            self.samples_per_s / self.cpu.store
        } else {
            f64::NAN
        }
    }

    fn failed(e: String) -> Point {
        Point {
            samples_per_s: f64::NAN,
            mb_per_s: f64::NAN,
            error: Some(e),
            ..Point::default()
        }
    }

    fn json(&self) -> String {
        let num = |v: f64, d: usize| {
            if v.is_finite() {
                format!("{v:.d$}")
            } else {
                "null".to_owned()
            }
        };
        let mut s = format!(
            "{{\"samples_per_s\":{},\"mb_per_s\":{},\"samples\":{},\"window_s\":{},\"ramp_s\":{},\"samples_per_store_core_s\":{},\"contended\":{},\"started_quiet\":{},\"quiet_wait_s\":{},\"cpu\":{}",
            num(self.samples_per_s, 1),
            num(self.mb_per_s, 2),
            self.samples,
            num(self.window_s, 2),
            num(self.ramp_s, 2),
            num(self.per_store_core(), 0),
            self.cpu.rest() > CONTENDED,
            self.started_quiet,
            num(self.quiet_wait_s, 1),
            self.cpu.json()
        );
        if self.attempts.len() > 1 {
            let list: Vec<String> = self
                .attempts
                .iter()
                .map(|(r, c)| format!("[{},{}]", num(*r, 1), num(*c, 2)))
                .collect();
            let _ = write!(
                s,
                ",\"attempts_rate_and_others_cores\":[{}]",
                list.join(",")
            );
        }
        if !self.repeats.is_empty() {
            let list: Vec<String> = self.repeats.iter().map(|r| num(*r, 1)).collect();
            let _ = write!(s, ",\"repeats_samples_per_s\":[{}]", list.join(","));
        }
        let us: Vec<String> = self
            .cpu
            .us_per_sample(self.samples_per_s)
            .iter()
            .map(|(k, v)| format!("\"{k}\":{}", num(*v, 1)))
            .collect();
        let _ = write!(s, ",\"cpu_us_per_sample\":{{{}}}", us.join(","));
        if !self.json_extra.is_empty() {
            s.push(',');
            s.push_str(&self.json_extra);
        }
        if let Some(e) = &self.error {
            let mut j = Json::default();
            j.str("error", e);
            let l = j.line();
            s.push(',');
            s.push_str(&l[1..l.len() - 1]);
        }
        s.push('}');
        s
    }
}

fn run() -> Result<()> {
    let args = Args::parse(
        std::env::args().skip(1),
        &["no-granary", "no-dataloader", "no-pair"],
        USAGE,
    )?;
    let files = args.u64("files", 40_000)?;
    let mean = args.u64("mean-size", 110_000)?;
    let rtts = args.list("rtt-ms", &[0, 2, 10, 50, 100, 200])?;
    let workers = args.list("workers", &[8, 32])?;
    let batch = args.u32("batch", 32)?.max(1);
    let secs = |name: &str, default: f64| -> Result<Duration> {
        let v = args.string(name, &default.to_string());
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("--{name}: not a number of seconds: {v}"))
    };
    let win = Windowing {
        warmup: secs("warmup-s", 2.0)?,
        window: secs("window-s", 12.0)?,
    };
    let inflights = args.list("inflight", &[1024])?;
    let inflight = u32::try_from(inflights[0]).map_err(|_| "--inflight: too large")?;
    let arena_default = (1u64 << 30).max(inflights.iter().max().copied().unwrap_or(0) << 20);
    let knobs = GranaryKnobs {
        batch,
        inflight,
        window: args.u32("window", 64)?,
        initial_window: args.u32("initial-window", 2)?,
        arena: args.u64("arena", arena_default)?.next_multiple_of(2 << 20),
        ready: args.u32("ready", 128)?,
        extra: parse_keys(&args.string("agent-keys", ""))?,
        verify_every: args.u64("verify-every", 16)?.max(1),
    };
    let python = {
        let p = args.string("python", "");
        if !p.is_empty() {
            p
        } else {
            std::env::var("PYTHON")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".to_owned())
        }
    };
    let bench_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let plot = match args.string("plot", "").as_str() {
        "" => Some(bench_dir.join("../docs/latency.png")),
        "none" => None,
        p => Some(PathBuf::from(p)),
    };
    let do_granary = !args.flag("no-granary");
    let quiet = secs("quiet-wait-s", 10.0)?;
    let retries = args.u32("retries", 0)?;
    let repeat = args.u32("repeat", 1)?.max(1);
    let stores: Vec<String> = match args.string("store", "both").as_str() {
        "both" => vec!["seaweed".to_owned(), "light".to_owned()],
        "seaweed" => vec!["seaweed".to_owned()],
        "light" => vec!["light".to_owned()],
        other => return Err(format!("--store: {other:?} is not light, seaweed or both")),
    };
    let light_threads = usize::try_from(args.u64("light-threads", 1)?)
        .map_err(|_| "--light-threads: too large")?
        .max(1);
    let pair = !args.flag("no-pair");
    let do_loader = !args.flag("no-dataloader");
    let mut loaders: Vec<Loader> = workers
        .iter()
        .map(|&w| Loader {
            name: format!("dataloader_w{w}"),
            how: LoaderKind::DataLoader(w),
        })
        .collect();
    match args
        .string("contenders", &stall_loaders::PER_SAMPLE.join(","))
        .as_str()
    {
        "none" | "" => {}
        list => {
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                loaders.push(train_loader(name)?);
            }
        }
    }

    let format = args.string("format", "");
    if !format.is_empty() {
        return run_format(&args, &format, files, mean, win, &knobs);
    }

    let regime_before = sys::regime();
    println!("latency: {regime_before}");
    println!("latency: CPU {}", cpu_model());
    let t_all = Instant::now();
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    println!(
        "dataset: {} files, {:.3} GB, mean {:.0} bytes ({})",
        ds.len(),
        ds.bytes as f64 / 1e9,
        ds.bytes as f64 / ds.len().max(1) as f64,
        ds.spec.root.display()
    );

    let rtt_f: Vec<f64> = rtts.iter().map(|&r| r as f64).collect();
    let mut j = Json::bench("latency");
    j.nums("rtt_ms", &rtt_f, 0);
    let plan = Plan {
        rtts: &rtts,
        loaders: &loaders,
        inflights: &inflights,
        knobs: &knobs,
        win,
        quiet,
        retries,
        repeat,
        pair,
        do_granary,
        do_loader,
        python: &python,
        batch,
    };
    let mut ingest_s = f64::NAN;
    for which in &stores {
        let t = Instant::now();
        let (store, keys) = if which == "seaweed" {
            let weed = Seaweed::try_start(BUCKET)?;
            println!(
                "=== SeaweedFS: S3 on {} (pid {}), data in {}, up in {:.1} s",
                weed.endpoint(),
                weed.pid().unwrap_or(0),
                weed.data_dir().display(),
                t.elapsed().as_secs_f64()
            );
            ingest_s = s3_data::upload(&weed, &ds, PREFIX)?;
            println!(
                "SeaweedFS idle {:.1} s after the ingest",
                s3_data::settle(&weed).as_secs_f64()
            );
            let keys = s3_data::write_keys(&weed, &ds, PREFIX)?;
            (Store::Weed(weed), keys)
        } else {
            let light = LightStore::start(&ds.spec.root, BUCKET, PREFIX, light_threads)
                .map_err(|e| format!("light store: {e}"))?;
            println!(
                "=== light store: S3 on {} ({} objects of {}, {} worker threads), up in {:.1} s",
                light.endpoint(),
                light.len(),
                ds.spec.root.display(),
                light_threads,
                t.elapsed().as_secs_f64()
            );
            // Every file read once, so that every point is served from the
            // page cache, the first one included (SeaweedFS's ingest reads
            // its objects back for the same reason).
            let t = Instant::now();
            let warmed = s3_data::read_all(&ds)?;
            println!(
                "page cache: every file read once ({:.3} GB) in {:.1} s",
                warmed as f64 / 1e9,
                t.elapsed().as_secs_f64()
            );
            let keys = std::env::temp_dir()
                .join(format!("granary-latency-keys-{}.tsv", std::process::id()));
            s3_data::write_keys_at(&keys, &ds, PREFIX)?;
            (Store::Light(light), keys)
        };
        let result = sweep(&store, &ds, &keys, &plan);
        let _ = std::fs::remove_file(&keys);
        let sw = result?;
        summarize(&store, &sw, &plan, &mut j);
    }
    let regime_after = sys::regime();
    println!("after: {regime_after}");
    let total_s = t_all.elapsed().as_secs_f64();

    j.int("files", ds.len())
        .int("dataset_bytes", ds.bytes)
        .num(
            "mean_sample_bytes",
            ds.bytes as f64 / ds.len().max(1) as f64,
            0,
        )
        .int("batch", u64::from(batch))
        .num("warmup_s", win.warmup.as_secs_f64(), 1)
        .num("window_s", win.window.as_secs_f64(), 1)
        .int("repeat", u64::from(repeat))
        .int("retries", u64::from(retries))
        .str("granary_config", &granary_config_line(&knobs))
        .str("stores", &stores.join(","))
        .num("ingest_s", ingest_s, 1)
        .int("cpus", granary_bench::cpu::online_cpus() as u64)
        .str("cpu_model", &cpu_model())
        .str("regime_before", &regime_before)
        .str("regime_after", &regime_after)
        .num("total_s", total_s, 0);
    let line = j.line();

    if let Some(plot) = plot {
        // SeaweedFS's at PATH, the light store's at PATH_light.
        let script = bench_dir.join("latency_plot.py");
        for which in &stores {
            let (out, more): (PathBuf, &[&str]) = if which == "light" {
                let stem = plot
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("latency");
                (
                    plot.with_file_name(format!("{stem}_light.png")),
                    &["light_"],
                )
            } else {
                (plot.clone(), &[])
            };
            match report::draw_with(&python, &script, &line, &out, more) {
                Ok(()) => println!("plot: {}", out.display()),
                Err(e) => println!("plot: not drawn: {e}"),
            }
        }
    }
    println!("{line}");
    Ok(())
}

/// `--format FMT`: shards against one object per sample
/// ([`granary_bench::latency::format`]).
fn run_format(
    args: &Args,
    format: &str,
    files: u64,
    mean: u64,
    win: Windowing,
    knobs: &GranaryKnobs,
) -> Result<()> {
    let plan = format::Plan {
        format: format::Format::parse(format)?,
        rtt_ms: args.u64("format-rtt-ms", 100)?,
        repeat: args.u32("repeat", 3)?.max(1),
        shard_bytes: args.u64("shard-mib", 64)?.max(1) << 20,
        warmup: win.warmup,
        window: win.window,
        batch: knobs.batch,
        inflight: knobs.inflight,
        window_batches: knobs.window,
        arena: knobs.arena,
    };
    let before = sys::regime();
    println!("latency --format {format}: {before}");
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    let mut j = format::run(&ds, &plan)?;
    let after = sys::regime();
    println!("after: {after}");
    j.str("regime_before", &before).str("regime_after", &after);
    println!("{}", j.line());
    Ok(())
}

/// A loader of the sweep other than Granary.
#[derive(Clone, Debug)]
struct Loader {
    /// Its name in the tables and in the last line's keys.
    name: String,
    how: LoaderKind,
}

#[derive(Clone, Debug)]
enum LoaderKind {
    /// `bench/latency_dataloader.py` with this many workers.
    DataLoader(u64),
    /// `bench/stall_train.py` with these arguments (`--contender NAME ...`),
    /// with no GPU step: a loader of `bench/run stall`, at full speed.
    Train(Vec<String>),
}

/// A per-sample loader of `bench/run stall` (`stall_loaders::PER_SAMPLE`),
/// with its `stall` arguments. The shard readers are left out: the light
/// store serves the dataset's files, not shards.
fn train_loader(name: &str) -> Result<Loader> {
    let args = stall_loaders::args(name)
        .filter(|_| stall_loaders::PER_SAMPLE.contains(&name))
        .ok_or_else(|| {
            format!(
                "--contenders: {name:?} is not one of {}",
                stall_loaders::PER_SAMPLE.join(", ")
            )
        })?;
    Ok(Loader {
        name: name.to_owned(),
        how: LoaderKind::Train(args.iter().map(|s| (*s).to_owned()).collect()),
    })
}

/// What every store's sweep is run with.
struct Plan<'a> {
    rtts: &'a [u64],
    loaders: &'a [Loader],
    inflights: &'a [u64],
    knobs: &'a GranaryKnobs,
    win: Windowing,
    quiet: Duration,
    retries: u32,
    repeat: u32,
    pair: bool,
    do_granary: bool,
    do_loader: bool,
    python: &'a str,
    batch: u32,
}

/// One store's points, one per round-trip time (the median of the
/// repeats).
struct Sweep {
    granary: Vec<Point>,
    /// Granary at 0 ms next to each point (the point itself at 0 ms).
    ref0: Vec<Point>,
    /// Every 0 ms measurement of Granary, repeats included.
    zeros: Vec<f64>,
    /// Further max_inflight_reads values, if any.
    granary_more: Vec<(u64, Vec<Point>)>,
    loaders: Vec<Vec<Point>>,
}

/// The repeat with the median rate (the lower one of an even count;
/// failed repeats count below every rate), every repeat's rate recorded in
/// it.
fn median_point(mut v: Vec<Point>) -> Point {
    let rates: Vec<f64> = v.iter().map(|p| p.samples_per_s).collect();
    v.sort_by(|a, b| {
        let key = |p: &Point| {
            if p.samples_per_s.is_finite() {
                p.samples_per_s
            } else {
                f64::NEG_INFINITY
            }
        };
        key(a).total_cmp(&key(b))
    });
    let n = v.len();
    let mut p = if n == 0 {
        Point::failed("not measured".into())
    } else {
        v.swap_remove((n - 1) / 2)
    };
    if n > 1 {
        p.repeats = rates;
    }
    p
}

/// The RTT sweep against one store, through a delay proxy of its own:
/// at each round-trip time, `repeat` rounds of Granary (and its 0 ms
/// reference), then each DataLoader, in that order (A B C A B C …), every
/// measurement under the same quiet and retry rules.
fn sweep(store: &Store, ds: &Dataset, keys: &Path, plan: &Plan<'_>) -> Result<Sweep> {
    let proxy = DelayProxy::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        store.addr(),
        Duration::ZERO,
        None,
    )
    .map_err(|e| format!("delay proxy: {e}"))?;
    println!("delay proxy: {} -> {}", proxy.local_addr(), store.addr());
    let (quiet, retries, win) = (plan.quiet, plan.retries, plan.win);
    let mut sw = Sweep {
        granary: Vec::new(),
        ref0: Vec::new(),
        zeros: Vec::new(),
        granary_more: plan.inflights[1..]
            .iter()
            .map(|&n| (n, Vec::new()))
            .collect(),
        loaders: vec![Vec::new(); plan.loaders.len()],
    };
    let delay = |rtt: u64| Duration::from_micros(rtt * 1000 / 2);
    for (i, &rtt) in plan.rtts.iter().enumerate() {
        proxy.set_delay(delay(rtt));
        println!(
            "--- {}: RTT {rtt} ms (proxy delay {} ms each way)",
            store.name(),
            rtt as f64 / 2.0
        );
        let mut g = Vec::new();
        let mut r0 = Vec::new();
        let mut more: Vec<Vec<Point>> = vec![Vec::new(); sw.granary_more.len()];
        let mut dl: Vec<Vec<Point>> = vec![Vec::new(); plan.loaders.len()];
        for round in 0..plan.repeat {
            if plan.repeat > 1 {
                println!("  round {} of {}", round + 1, plan.repeat);
            }
            if plan.do_granary {
                // The 0 ms reference goes first at every other point, so
                // that a drift in the machine's load does not always favour
                // one side.
                let paired = plan.pair && rtt != 0;
                let reference = |r0: &mut Vec<Point>| {
                    proxy.set_delay(Duration::ZERO);
                    let p = measured(quiet, retries, || {
                        measure_granary(store, &proxy, ds, plan.knobs, win)
                    });
                    print_point("granary at 0 ms (reference for this point)", &p);
                    r0.push(p);
                    proxy.set_delay(delay(rtt));
                };
                let ref_first = paired && !(i + round as usize).is_multiple_of(2);
                if ref_first {
                    reference(&mut r0);
                }
                let p = measured(quiet, retries, || {
                    measure_granary(store, &proxy, ds, plan.knobs, win)
                });
                print_point("granary", &p);
                if paired && !ref_first {
                    reference(&mut r0);
                } else if !paired && rtt == 0 {
                    r0.push(p.clone());
                }
                g.push(p);
                for (k, (n, _)) in sw.granary_more.iter().enumerate() {
                    let kn = GranaryKnobs {
                        inflight: u32::try_from(*n).unwrap_or(u32::MAX),
                        ..plan.knobs.clone()
                    };
                    let p = measured(quiet, retries, || {
                        measure_granary(store, &proxy, ds, &kn, win)
                    });
                    print_point(&format!("granary, max_inflight_reads {n}"), &p);
                    more[k].push(p);
                }
            }
            if plan.do_loader {
                for (k, l) in plan.loaders.iter().enumerate() {
                    let p = measured(quiet, retries, || match &l.how {
                        LoaderKind::DataLoader(w) => measure_dataloader(
                            plan.python,
                            store,
                            &proxy,
                            keys,
                            *w,
                            plan.batch,
                            win,
                        ),
                        LoaderKind::Train(args) => {
                            measure_train(plan.python, store, &proxy, keys, args, plan.batch, win)
                        }
                    });
                    print_point(&l.name, &p);
                    dl[k].push(p);
                }
            }
        }
        if plan.do_granary {
            sw.zeros
                .extend(r0.iter().map(|p| p.samples_per_s).filter(|r| r.is_finite()));
            sw.granary.push(median_point(g));
            sw.ref0.push(median_point(r0));
            for (k, m) in more.into_iter().enumerate() {
                sw.granary_more[k].1.push(median_point(m));
            }
        }
        if plan.do_loader {
            for (k, d) in dl.into_iter().enumerate() {
                sw.loaders[k].push(median_point(d));
            }
        }
    }
    Ok(sw)
}

/// Prints one store's table and goals and adds its keys to the last line:
/// SeaweedFS's under the names they always had, the light store's with a
/// `light_` prefix.
fn summarize(store: &Store, sw: &Sweep, plan: &Plan<'_>, j: &mut Json) {
    let (rtts, loaders) = (plan.rtts, plan.loaders);
    let pre = store.key();
    let rate = |v: &[Point], i: usize| v.get(i).map_or(f64::NAN, |p| p.samples_per_s);
    let client_us = |v: &[Point], i: usize| {
        v.get(i)
            .map_or(f64::NAN, |p| p.cpu.us_per_sample(p.samples_per_s)[5].1)
    };
    println!(
        "\n{}: samples/s (client CPU µs per sample; the store's cores)",
        store.name()
    );
    println!(
        "| RTT ms | granary | {} |",
        sw.granary_more
            .iter()
            .map(|(n, _)| format!("granary, {n} in flight"))
            .chain(loaders.iter().map(|l| l.name.clone()))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (i, rtt) in rtts.iter().enumerate() {
        let cols: Vec<String> = sw
            .granary_more
            .iter()
            .map(|(_, l)| l)
            .chain(sw.loaders.iter())
            .map(|l| {
                format!(
                    "{:.0} ({:.0} µs; {:.2})",
                    rate(l, i),
                    client_us(l, i),
                    l.get(i).map_or(f64::NAN, |p| p.cpu.store)
                )
            })
            .collect();
        println!(
            "| {rtt} | {:.0} ({:.0} µs; {:.2}) | {} |",
            rate(&sw.granary, i),
            client_us(&sw.granary, i),
            sw.granary.get(i).map_or(f64::NAN, |p| p.cpu.store),
            cols.join(" | ")
        );
    }
    let idx = |ms: u64| rtts.iter().position(|&r| r == ms);
    let g0 = idx(0).map_or(f64::NAN, |i| rate(&sw.granary, i));
    let g100 = idx(100).map_or(f64::NAN, |i| rate(&sw.granary, i));
    let ref100 = idx(100).map_or(f64::NAN, |i| rate(&sw.ref0, i));
    let keep_unpaired = g100 / g0;
    let keep_paired = g100 / ref100;
    // Granary's 0 ms throughput: the median of every 0 ms measurement of
    // the sweep (the sweep's point and the references next to the others),
    // which a single noisy or drifted measurement does not move.
    let g0_median = if sw.zeros.is_empty() {
        g0
    } else {
        median(&sw.zeros)
    };
    let keep = g100 / g0_median;
    let at100 = |k: usize| idx(100).map_or(f64::NAN, |i| rate(&sw.loaders[k], i));
    let w8_100 = loaders
        .iter()
        .position(|l| l.name == "dataloader_w8")
        .map_or(f64::NAN, at100);
    let speedup = g100 / w8_100;
    // The best contender at 100 ms.
    let best = (0..loaders.len())
        .map(|k| (&loaders[k].name, at100(k)))
        .filter(|(_, r)| r.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let (best_name, best_rate) =
        best.map_or(("none".to_owned(), f64::NAN), |(n, r)| (n.clone(), r));
    let over_best = g100 / best_rate;
    let core_rate = |v: &[Point], i: Option<usize>| {
        i.and_then(|i| v.get(i))
            .map_or(f64::NAN, Point::per_store_core)
    };
    let keep_per_core = core_rate(&sw.granary, idx(100)) / core_rate(&sw.ref0, idx(100));
    let verdict = |value: f64, goal: f64| Goal::at_least("", goal).verdict(value);
    println!(
        "{}: granary at 100 ms {:.0} samples/s = {:.3} × its 0 ms rate (median of {} measurements at 0 ms: {:.0} samples/s); {:.2} × the best contender at 100 ms ({best_name}, {:.0} samples/s); {:.1} × the 8-worker DataLoader",
        store.name(),
        g100,
        keep,
        sw.zeros.len(),
        g0_median,
        over_best,
        best_rate,
        speedup
    );
    println!(
        "  against the 0 ms measurement next to it ({:.0} samples/s): {:.3}; against the sweep's 0 ms point ({:.0} samples/s): {:.3}; per store CPU-second: {:.3}",
        ref100, keep_paired, g0, keep_unpaired, keep_per_core
    );
    // The store's share of the machine at each point, and at 0 ms whether
    // it could be what limits the clients.
    let store_cores = |v: &[Point]| -> Vec<f64> { v.iter().map(|p| p.cpu.store).collect() };
    let mut at0_verdict = None;
    if let Some(i) = idx(0) {
        let mut line = Vec::new();
        let mut worst = 0.0f64;
        let named = std::iter::once(("granary".to_owned(), &sw.granary)).chain(
            loaders
                .iter()
                .zip(&sw.loaders)
                .map(|(l, v)| (l.name.clone(), v)),
        );
        for (name, v) in named {
            if let Some(p) = v.get(i).filter(|p| p.error.is_none()) {
                line.push(format!(
                    "{name} {:.2} cores ({:.0} µs per sample)",
                    p.cpu.store,
                    p.cpu.us_per_sample(p.samples_per_s)[0].1
                ));
                worst = worst.max(p.cpu.store);
            }
        }
        let verdict = if line.is_empty() {
            "not measured"
        } else if worst < STORE_BOTTLENECK {
            "yes"
        } else {
            "no"
        };
        println!(
            "{} at 0 ms: {}; {}",
            store.name(),
            line.join(", "),
            match verdict {
                "yes" => format!(
                    "below {STORE_BOTTLENECK} core for every client: the store is not the bottleneck"
                ),
                "no" => format!("{worst:.2} cores for one client: the store may be what limits it"),
                _ => "not measured".to_owned(),
            }
        );
        at0_verdict = Some(verdict);
    }
    let rates = |v: &[Point]| -> Vec<f64> { v.iter().map(|p| p.samples_per_s).collect() };
    let cus = |v: &[Point]| -> Vec<f64> { (0..v.len()).map(|i| client_us(v, i)).collect() };
    j.nums(&format!("{pre}granary"), &rates(&sw.granary), 1);
    if let Some(v) = at0_verdict {
        j.str(&format!("{pre}store_not_bottleneck_at_0ms"), v);
    }
    for (n, points) in &sw.granary_more {
        j.nums(&format!("{pre}granary_inflight_{n}"), &rates(points), 1);
    }
    for (k, l) in loaders.iter().enumerate() {
        j.nums(&format!("{pre}{}", l.name), &rates(&sw.loaders[k]), 1);
    }
    j.nums(&format!("{pre}granary_ref0"), &rates(&sw.ref0), 1);
    j.nums(
        &format!("{pre}granary_client_us_per_sample"),
        &cus(&sw.granary),
        1,
    );
    for (k, l) in loaders.iter().enumerate() {
        j.nums(
            &format!("{pre}{}_client_us_per_sample", l.name),
            &cus(&sw.loaders[k]),
            1,
        );
    }
    j.nums(
        &format!("{pre}store_cores_granary"),
        &store_cores(&sw.granary),
        3,
    );
    for (k, l) in loaders.iter().enumerate() {
        j.nums(
            &format!("{pre}store_cores_{}", l.name),
            &store_cores(&sw.loaders[k]),
            3,
        );
    }
    j.num(&format!("{pre}granary_0ms_median"), g0_median, 1)
        .num(&format!("{pre}granary_100_over_0"), keep, 3)
        .num(&format!("{pre}granary_100_over_0_paired"), keep_paired, 3)
        .num(
            &format!("{pre}granary_100_over_0_unpaired"),
            keep_unpaired,
            3,
        )
        .num(
            &format!("{pre}granary_100_over_0_per_store_core"),
            keep_per_core,
            3,
        )
        .num(&format!("{pre}granary_over_w8_at_100"), speedup, 2)
        .str(&format!("{pre}best_contender_at_100"), &best_name)
        .num(
            &format!("{pre}granary_over_best_contender_at_100"),
            over_best,
            2,
        );
    match store {
        Store::Weed(_) => {
            // The goals this benchmark has always printed for SeaweedFS;
            // issue 14 asks only for the store's CPU share there.
            println!(
                "SeaweedFS goals (as before): ≥ 0.9 × its 0 ms rate: {}; ≥ 20 × the 8-worker DataLoader: {}",
                verdict(keep, 0.9),
                verdict(speedup, 20.0)
            );
            j.str("goal_keep_0.9", verdict(keep, 0.9))
                .str("goal_20x_w8", verdict(speedup, 20.0));
        }
        Store::Light(_) => {
            println!(
                "GOAL light store, granary at 100 ms ≥ 0.9 × granary at 0 ms: {:.3}: {}",
                keep,
                verdict(keep, 0.9)
            );
            println!(
                "GOAL light store, granary at 100 ms ≥ 2 × the best contender at 100 ms ({best_name}): {:.2}: {}",
                over_best,
                verdict(over_best, 2.0)
            );
            j.str("light_goal_rtt", verdict(keep, 0.9))
                .str("light_goal_contender", verdict(over_best, 2.0));
        }
    }
    let contended: Vec<String> = rtts
        .iter()
        .enumerate()
        .filter_map(|(i, rtt)| {
            let p = sw.granary.get(i)?;
            (p.cpu.rest() > CONTENDED).then(|| format!("{rtt} ms ({:.2} cores)", p.cpu.rest()))
        })
        .collect();
    if !contended.is_empty() {
        println!(
            "WARNING: other processes took more than {CONTENDED} cores during the Granary windows at {}: those rates are lower than this machine can do",
            contended.join(", ")
        );
    }
    let details = |v: &[Point]| {
        format!(
            "[{}]",
            v.iter().map(Point::json).collect::<Vec<_>>().join(",")
        )
    };
    j.raw(&format!("{pre}granary_detail"), &details(&sw.granary));
    for (n, points) in &sw.granary_more {
        j.raw(
            &format!("{pre}granary_inflight_{n}_detail"),
            &details(points),
        );
    }
    for (k, l) in loaders.iter().enumerate() {
        j.raw(&format!("{pre}{}_detail", l.name), &details(&sw.loaders[k]));
    }
    j.str(&format!("{pre}store"), store.describe());
}

/// `section.key=value;...` into (section, `key = value`) pairs.
fn parse_keys(s: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (lhs, value) = part
            .split_once('=')
            .ok_or_else(|| format!("--agent-keys: {part:?} is not section.key=value"))?;
        let (section, key) = lhs
            .trim()
            .split_once('.')
            .ok_or_else(|| format!("--agent-keys: {lhs:?} names no section"))?;
        out.push((section.to_owned(), format!("{key} = {}", value.trim())));
    }
    Ok(out)
}

fn granary_config_line(k: &GranaryKnobs) -> String {
    let mut s = format!(
        "batch {}, prefetch.max_inflight_reads {}, prefetch.window_batches {}, prefetch.initial_window {}, arena {} MiB, ready ring {}, verify every {}",
        k.batch,
        k.inflight,
        k.window,
        k.initial_window.min(k.window),
        k.arena >> 20,
        k.ready,
        k.verify_every
    );
    for (sec, line) in &k.extra {
        let _ = write!(s, ", {sec}.{line}");
    }
    s
}

fn print_point(who: &str, p: &Point) {
    if let Some(e) = &p.error {
        println!("  {who}: FAILED: {e}");
        return;
    }
    println!(
        "  {who}: {:.1} samples/s ({:.1} MB/s), {} samples in {:.1} s, ramp {:.2} s{}",
        p.samples_per_s,
        p.mb_per_s,
        p.samples,
        p.window_s,
        p.ramp_s,
        if p.note.is_empty() {
            String::new()
        } else {
            format!("; {}", p.note)
        }
    );
    println!(
        "    CPU (cores): {}; {:.0} samples per store CPU-second; {}",
        p.cpu.line(),
        p.per_store_core(),
        if p.started_quiet {
            format!("started on a quiet machine after {:.0} s", p.quiet_wait_s)
        } else {
            format!("the machine was not quiet ({:.0} s waited)", p.quiet_wait_s)
        }
    );
    let us: Vec<String> = p
        .cpu
        .us_per_sample(p.samples_per_s)
        .iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect();
    println!("    CPU µs per delivered sample: {}", us.join(", "));
    if p.cpu.rest() > CONTENDED {
        println!(
            "    contended: other processes took {:.2} cores during this window",
            p.cpu.rest()
        );
    }
}

/// Checks a synthetic sample's header against what the agent says it is.
fn check_header(id: u64, label: i32, bytes: &[u8]) -> std::result::Result<(), String> {
    if bytes.len() < synth::HEADER_LEN || bytes[..8] != synth::MAGIC {
        return Err(format!("sample {id}: no synthetic header"));
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let class = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let len = u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    if word(8) != id || i64::from(class) != i64::from(label) || len as usize != bytes.len() {
        return Err(format!(
            "sample {id} (label {label}, {} bytes) carries file {} of class {class}, {len} bytes",
            bytes.len(),
            word(8)
        ));
    }
    Ok(())
}

/// One fresh agent serving the bucket through the proxy, one session, the
/// first epoch.
fn measure_granary(
    store: &Store,
    proxy: &DelayProxy,
    ds: &Dataset,
    k: &GranaryKnobs,
    win: Windowing,
) -> Result<Point> {
    let mut settings = store.settings_via(proxy.local_addr());
    settings.request_timeout = Duration::from_secs(30);
    let dataset = S3Dataset {
        name: DATASET.to_owned(),
        settings,
        prefix: PREFIX.to_owned(),
        extra: k
            .extra
            .iter()
            .filter(|(s, _)| s == "dataset")
            .map(|(_, l)| l.clone())
            .collect(),
    };
    let mut cfg = AgentSettings::new_s3(k.arena, dataset);
    cfg.window_batches = k.window;
    cfg.initial_window = k.initial_window;
    cfg.max_inflight_reads = k.inflight;
    cfg.ready_ring_capacity = k.ready;
    cfg.release_ring_capacity = k.ready;
    cfg.extra = k
        .extra
        .iter()
        .filter(|(s, _)| s != "dataset")
        .cloned()
        .collect();
    let t_start = Instant::now();
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let started = t_start.elapsed();
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 42;
    opts.batch_size = k.batch;
    opts.epoch_count = 1;
    opts.open_timeout = Duration::from_secs(120);

    let n = ds.len();
    let stop_at = n * 95 / 100;
    let mut seen = 0u64;
    let mut first: Option<Instant> = None;
    let (mut m0, mut m1) = (None::<(u64, u64, CpuMark)>, None::<(u64, u64, CpuMark)>);
    let mut bytes = 0u64;
    let mut per_second: Vec<u64> = Vec::new();
    let t_open = Instant::now();
    let consumed = loader::consume(&client, &opts, Wait::Block, |s| {
        check_header(s.id, s.label, s.bytes)?;
        if s.id % k.verify_every == 0 {
            synth::verify_sample(s.bytes).map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
        }
        let x = touch(s.bytes);
        let now = Instant::now();
        let t0 = *first.get_or_insert(now);
        let sec = now.duration_since(t0).as_secs() as usize;
        if per_second.len() <= sec {
            per_second.resize(sec + 1, 0);
        }
        per_second[sec] += 1;
        if m0.is_none() && now.duration_since(t0) >= win.warmup {
            m0 = Some((seen, bytes, CpuMark::take(store)));
        }
        seen += 1;
        bytes += s.bytes.len() as u64;
        let open_since = match &m0 {
            Some((_, _, a)) if m1.is_none() => a.at.map(|at| now.duration_since(at)),
            _ => None,
        };
        if open_since.is_some_and(|d| d >= win.window || seen >= stop_at) {
            m1 = Some((seen, bytes, CpuMark::take(store)));
        }
        // A slow configuration (few reads in flight, a long RTT) is not
        // worth reading to the end once its window has closed.
        if m1.is_some() && seen < n * 9 / 10 {
            return Err(STOP_EARLY.to_owned());
        }
        Ok(x)
    });
    let run = match consumed {
        Ok(run) => Some(run),
        Err(e) if e == STOP_EARLY => None,
        Err(e) => return Err(e),
    };
    let lookups = agent.epoch_lookups(DATASET);
    let series = agent.series();
    let hugepages = agent.hugepages();
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;

    if let Some(run) = &run {
        let delivered: u64 = run.epochs.iter().map(|e| e.samples).sum();
        if delivered != n {
            return Err(format!("{delivered} samples delivered, {n} expected"));
        }
    }
    let hits: u64 = lookups.iter().map(|l| l.hits).sum();
    let (Some((n0, b0, c0)), Some((n1, b1, c1))) = (m0, m1) else {
        return Err(format!(
            "the epoch ended before the window could open ({:.1} s from the first batch, warm-up {:.1} s): raise --files or lower --warmup-s",
            first.map_or(0.0, |f| f.elapsed().as_secs_f64()),
            win.warmup.as_secs_f64()
        ));
    };
    let span = c1
        .at
        .zip(c0.at)
        .map_or(0.0, |(b, a)| b.duration_since(a).as_secs_f64())
        .max(1e-9);
    // Whole-epoch figures; NaN when the session stopped after its window.
    let (epoch_s, waited, first_batch) = match &run {
        Some(run) => (
            run.epochs[0].elapsed().as_secs_f64(),
            run.epochs[0].waited.as_secs_f64(),
            run.open + run.first_batch,
        ),
        None => (
            f64::NAN,
            f64::NAN,
            first.map_or(Duration::ZERO, |f| f.duration_since(t_open)),
        ),
    };
    let mut cpu = CpuUse::between(&c0, &c1);
    cpu.loader = cpu.loader.max(0.0);
    let s3: Vec<String> = series
        .iter()
        .filter(|(name, v)| {
            *v != 0.0
                && (name.contains("retr")
                    || name.contains("error")
                    || name.contains("timeout")
                    || name.contains("fail"))
        })
        .map(|(name, v)| format!("{name} {v}"))
        .collect();
    let rates = per_second
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let epoch_line = if run.is_some() {
        format!(
            "epoch {:.1} s = {:.0} samples/s overall; loader waited {:.0}% of the epoch",
            epoch_s,
            n as f64 / epoch_s.max(1e-9),
            waited / epoch_s.max(1e-9) * 100.0
        )
    } else {
        format!("stopped after the window, {seen} of {n} samples read")
    };
    let note = format!(
        "agent up in {:.2} s (catalog listing included), first batch {:.2} s after asking; {epoch_line}; {hits} arena hits; per second: {rates}{}",
        started.as_secs_f64(),
        first_batch.as_secs_f64(),
        if s3.is_empty() {
            String::new()
        } else {
            format!("; metrics: {}", s3.join(", "))
        }
    );
    let mut extra = Json::default();
    extra
        .num("agent_start_s", started.as_secs_f64(), 2)
        .num("first_batch_s", first_batch.as_secs_f64(), 3)
        .num("epoch_s", epoch_s, 2)
        .num("epoch_samples_per_s", n as f64 / epoch_s, 1)
        .num("loader_waited", waited / epoch_s, 3)
        .int("samples_read", seen)
        .int("arena_hits", hits)
        .str("arena_pages", if hugepages { "2 MiB" } else { "4 KiB" })
        .nums(
            "per_second",
            &per_second.iter().map(|&c| c as f64).collect::<Vec<_>>(),
            0,
        );
    let e = extra.line();
    Ok(Point {
        samples_per_s: (n1 - n0) as f64 / span,
        mb_per_s: (b1 - b0) as f64 / span / 1e6,
        samples: n1 - n0,
        window_s: span,
        ramp_s: started.as_secs_f64() + first_batch.as_secs_f64(),
        cpu,
        note,
        json_extra: e[1..e.len() - 1].to_owned(),
        error: None,
        ..Point::default()
    })
}

/// What a Python loader's run left: its last line (one JSON object), the
/// CPU use of the window between its `mark` lines (its own process tree
/// as `python`), and how long the process ran.
struct ScriptRun {
    line: String,
    cpu: CpuUse,
    ran: Duration,
}

/// Runs `python script args...` with the store's credentials, reading CPU
/// counters at its `mark window-start` / `mark window-end` lines; its
/// other lines are echoed. An error when it fails or prints no marks.
fn run_script(python: &str, script: &Path, args: &[String], store: &Store) -> Result<ScriptRun> {
    let t0 = Instant::now();
    let mut child = Command::new(python)
        .arg(script)
        .args(args)
        .arg("--marks")
        .envs(store.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{python} {}: {e}", script.display()))?;
    let pid = child.id();
    let out = child.stdout.take().ok_or("no stdout")?;
    let (mut c0, mut c1) = (None, None);
    let mut result = None;
    for line in BufReader::new(out).lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.trim() {
            "mark window-start" => c0 = Some((CpuMark::take(store), sys::tree_cpu(pid))),
            "mark window-end" => c1 = Some((CpuMark::take(store), sys::tree_cpu(pid))),
            l if l.starts_with('{') => result = Some(l.to_owned()),
            l => println!("    python: {l}"),
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let _ = std::io::stdout().flush();
    let Some(line) = result.filter(|_| status.success()) else {
        return Err(format!("{} exited with {status}", script.display()));
    };
    let (Some((a, ta)), Some((b, tb))) = (c0, c1) else {
        return Err(format!("{}: no window marks", script.display()));
    };
    let mut cpu = CpuUse::between(&a, &b);
    let secs = match (a.at, b.at) {
        (Some(x), Some(y)) => y.duration_since(x).as_secs_f64().max(1e-9),
        _ => f64::NAN,
    };
    cpu.python = tb.saturating_sub(ta).as_secs_f64() / secs;
    cpu.loader = 0.0;
    Ok(ScriptRun {
        line,
        cpu,
        ran: t0.elapsed(),
    })
}

/// One run of `bench/stall_train.py` (a `bench/run stall` contender) through
/// the proxy, with no GPU step: after one batch and `win.warmup` more
/// seconds of warm-up, the samples delivered to the training loop in
/// `win.window`; the CPU of its whole process tree (workers, threads) over
/// the window is its Python cores.
fn measure_train(
    python: &str,
    store: &Store,
    proxy: &DelayProxy,
    keys: &Path,
    args: &[String],
    batch: u32,
    win: Windowing,
) -> Result<Point> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("stall_train.py");
    let mut all = args.to_vec();
    all.extend(
        [
            "--step-ms",
            "0",
            "--batch",
            &batch.to_string(),
            "--warmup-batches",
            "1",
            "--warmup-s",
            &win.warmup.as_secs_f64().to_string(),
            "--batches",
            "1000000000",
            "--window-s",
            &win.window.as_secs_f64().to_string(),
            "--keys",
            &keys.display().to_string(),
            "--endpoint",
            &format!("http://{}", proxy.local_addr()),
            "--bucket",
            store.bucket(),
        ]
        .map(str::to_owned),
    );
    let run = run_script(python, &script, &all, store)?;
    let get = |k: &str| json_num(&run.line, k).unwrap_or(f64::NAN);
    Ok(Point {
        samples_per_s: get("img_per_s"),
        mb_per_s: f64::NAN,
        samples: get("samples") as u64,
        window_s: get("wall_s"),
        ramp_s: get("first_batch_s"),
        cpu: run.cpu.clone(),
        note: format!(
            "first batch after {:.1} s; process ran {:.1} s",
            get("first_batch_s"),
            run.ran.as_secs_f64()
        ),
        json_extra: format!("\"python\":{}", run.line),
        error: None,
        ..Point::default()
    })
}

/// One run of `bench/latency_dataloader.py` through the proxy. Its
/// Python cores are what the script measured itself (its workers count
/// the samples where they are fetched).
fn measure_dataloader(
    python: &str,
    store: &Store,
    proxy: &DelayProxy,
    keys: &Path,
    workers: u64,
    batch: u32,
    win: Windowing,
) -> Result<Point> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("latency_dataloader.py");
    let args = [
        "--endpoint",
        &format!("http://{}", proxy.local_addr()),
        "--bucket",
        store.bucket(),
        "--keys",
        &keys.display().to_string(),
        "--workers",
        &workers.to_string(),
        "--batch",
        &batch.to_string(),
        "--warmup-s",
        &win.warmup.as_secs_f64().to_string(),
        "--window-s",
        &win.window.as_secs_f64().to_string(),
    ]
    .map(str::to_owned);
    let run = run_script(python, &script, &args, store)?;
    let get = |k: &str| json_num(&run.line, k).unwrap_or(f64::NAN);
    let mut cpu = run.cpu.clone();
    cpu.python = get("cpu_cores");
    Ok(Point {
        samples_per_s: get("samples_per_s"),
        mb_per_s: get("mb_per_s"),
        samples: get("samples") as u64,
        window_s: get("window_s"),
        ramp_s: get("ramp_s"),
        cpu,
        note: format!(
            "delivered to the main process {:.1} samples/s; process ran {:.1} s",
            get("delivered_per_s"),
            run.ran.as_secs_f64()
        ),
        json_extra: format!("\"python\":{}", run.line),
        error: None,
        ..Point::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_keys_parse_into_sections() {
        let got = parse_keys("prefetch.read_retries = 5; dataset.max_inflight=64;").unwrap();
        assert_eq!(
            got,
            vec![
                ("prefetch".to_owned(), "read_retries = 5".to_owned()),
                ("dataset".to_owned(), "max_inflight = 64".to_owned()),
            ]
        );
        assert!(parse_keys("nosection=1").is_err());
        assert!(parse_keys("a.b").is_err());
        assert!(parse_keys("").unwrap().is_empty());
    }

    #[test]
    fn headers_are_checked_against_the_catalog() {
        let mut spec = synth::SynthSpec::new("/nonexistent");
        spec.num_files = 10;
        spec.num_classes = 2;
        let mut buf = Vec::new();
        spec.render(7, &mut buf);
        let class = i32::try_from(spec.class_of(7)).unwrap();
        assert!(check_header(7, class, &buf).is_ok());
        assert!(check_header(6, class, &buf).is_err());
        assert!(check_header(7, class + 1, &buf).is_err());
        assert!(check_header(7, class, &buf[..buf.len() - 1]).is_err());
    }

    #[test]
    fn repeats_keep_the_median_and_failures_count_lowest() {
        let at = |r: f64| Point {
            samples_per_s: r,
            ..Point::default()
        };
        let p = median_point(vec![at(30.0), at(10.0), at(20.0)]);
        assert_eq!(p.samples_per_s, 20.0);
        assert_eq!(p.repeats, vec![30.0, 10.0, 20.0]);
        // An even count keeps the lower middle; a failed repeat ranks last.
        let p = median_point(vec![
            at(30.0),
            Point::failed("x".into()),
            at(10.0),
            at(20.0),
        ]);
        assert_eq!(p.samples_per_s, 10.0);
        let p = median_point(vec![at(5.0)]);
        assert_eq!(p.samples_per_s, 5.0);
        assert!(p.repeats.is_empty());
        assert!(median_point(Vec::new()).error.is_some());
    }

    #[test]
    fn cpu_per_sample_divides_cores_by_the_rate() {
        let u = CpuUse {
            store: 0.5,
            engine: 0.2,
            fetcher: 0.3,
            loader: 0.1,
            ..CpuUse::default()
        };
        let us = u.us_per_sample(1000.0);
        assert_eq!(us[0], ("store", 500.0));
        assert!((us[2].1 - 500.0).abs() < 1e-9);
        assert!((us[5].1 - 600.0).abs() < 1e-9);
        assert!(u.us_per_sample(0.0)[0].1.is_nan());
        // The light store's threads are part of this process: not "others".
        let inside = CpuUse {
            store: 0.5,
            store_in_process: true,
            own: 1.0,
            busy: 1.2,
            ..CpuUse::default()
        };
        assert!((inside.rest() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn contention_is_what_nobody_here_used() {
        let u = CpuUse {
            store: 1.0,
            own: 0.5,
            python: 0.2,
            busy: 2.0,
            ..CpuUse::default()
        };
        assert!((u.rest() - 0.3).abs() < 1e-9);
        let mut p = Point::failed("x".into());
        p.cpu = u;
        assert!(p.per_store_core().is_nan());
        p.samples_per_s = 2000.0;
        assert!((p.per_store_core() - 2000.0).abs() < 1e-9);
    }
}
