//! GPU stall: how long a training loop whose GPU step is a fixed sleep (or, with `--gpu-step`, a real ResNet-50 step on a GPU) waits for data from S3 (SeaweedFS or the light store behind a delay proxy, 0–200 ms RTT), for Granary and the loaders users pick instead, and the CPU each spends per sample.
//!
//! One run:
//!
//! 1. the synthetic dataset (default 20,000 files of ~110 KB; `--quick`
//!    6,000) is generated once under `bench/.data/`, uploaded into a fresh
//!    SeaweedFS ([`granary_bench::seaweed`], [`granary_bench::s3_data`])
//!    and read back once, or (`--store light`) served with the shards by
//!    the light store ([`granary_bench::light_store`]) in this process;
//!    the delay proxy ([`granary_bench::delay_proxy`]) starts in front of
//!    it;
//! 2. **the GPU step is calibrated**: a PyTorch DataLoader reading the same
//!    files from local disk (`bench/stall_train.py --contender local`, one
//!    worker per CPU) is run with no step, its rate R measured, and the step
//!    set to `batch / (0.95 R)`: the shortest step that loader can keep
//!    95 % busy. The loader is then run at that step; while its GPU-idle
//!    fraction is above 5 % the step grows by a quarter (at most 12 times).
//!    `--step-ms` skips the calibration, and so does `--gpu-step MODEL`:
//!    the step is then a real forward and backward pass of MODEL on the
//!    batch (moved to the GPU), timed by the loop;
//! 3. for every round-trip time, every contender runs `--reps` times,
//!    interleaved (A B C … A B C …), each run a fresh process (and, for
//!    Granary, a fresh agent: every sample comes from the store): the loop
//!    consumes `--warmup-batches` batches unmeasured, then measures
//!    `--batches` batches or `--window-s` seconds, whichever ends first:
//!    GPU-idle fraction (time in `next()` / wall time), samples/s, p50/p99
//!    batch wait; the run reads CPU counters at the window's edges (the
//!    loader's process tree, the agent's threads, the proxy's threads,
//!    SeaweedFS, the whole machine). Each point is the median of its runs;
//! 4. the table, the goal (at 100 ms: Granary's idle fraction ≤ 2 % and
//!    ≤ the C loader's + 1 point, its loader CPU per sample ≤ 0.5 × the
//!    best contender's), the plot
//!    (`docs/stall.png`, `bench/stall_plot.py`) and the JSON line.
//!
//! Contenders (`--contenders`; the doc, docs/benchmarks.md, gives each one's
//! settings and why): `granary` (the default PyTorch path: Python
//! `GranaryDataset` iterated in the training process through
//! `granary.cuda.prefetch`; the goal is judged on it), `granary_workers`
//! (the same dataset in a DataLoader with 2 workers), `granary_w0` (a
//! DataLoader with `num_workers=0`, no fetching ahead), `granary_c`
//! (`bench/stall_consume.c` on libgranary), `boto3_w8`, `boto3_w32`,
//! `boto3_threads` (4 workers × 16 threads), `s3torch_map`, `s3torch_iter`
//! (s3torchconnector, 8 workers), and the shard readers over shards of the
//! same samples written by `bench/stall_shards.py` into the same store:
//! `streaming` (mosaicml-streaming, MDS), `litdata` (litdata's
//! `StreamingDataset`) and `webdataset` (tar shards read with `pipe:curl`).

use granary_bench::agent::{Agent, AgentSettings, S3Dataset};
use granary_bench::cli::Args;
use granary_bench::data::{self, Dataset};
use granary_bench::delay_proxy::DelayProxy;
use granary_bench::light_store::{self, LightStore};
use granary_bench::report;
use granary_bench::s3_data;
use granary_bench::seaweed::Seaweed;
use granary_bench::stall_jobs2::{self, DecodeSpan, Jobs2};
use granary_bench::stall_loaders;
use granary_bench::stall_stats::{self, Cell, Goal, Run, GOAL_RTT_MS};
use granary_bench::store::Store;
use granary_bench::sys::{self, cpu_model, process_cpu, tree_cpu, MachineCpu};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: bench/run stall [options]
  --quick             a short run: 6,000 files, 150 batches or 12 s per window, 2 repetitions
  --rtt LIST          round-trip times in ms, comma-separated (default 0,10,50,100,200)
  --contenders LIST   default granary,granary_workers,granary_c,boto3_w8,boto3_w32,boto3_threads,
                      s3torch_map,s3torch_iter,streaming,litdata,webdataset (granary first;
                      granary_w0 on request)
  --reps N            interleaved runs per contender and RTT (default 3; --quick 2)
  --files N           files in the synthetic dataset (default 20000; --quick 6000)
  --mean-size B       mean file size in bytes (default 110000)
  --batch N           samples per batch, every contender (default 32)
  --batches N         measured batches per run (default 400; --quick 150)
  --window-s S        longest measured window (default 30; --quick 12)
  --warmup-batches N  batches consumed before the window (default 5)
  --step-ms MS        the GPU step; default: calibrated on the local-disk loader
  --gpu-step MODEL    a real step instead of the sleep: resnet50 (on CUDA when present) or tiny
                      (a small CNN, for a machine without a GPU); the C loader is not run
  --store WHICH       seaweed (default) or light (the light store in this process: no
                      SeaweedFS needed; its threads' CPU is the store's)
  --light-threads N   the light store's worker threads (default 2)
  --decode SIDE       samples are JPEGs (--jpeg-side square images) that every loader decodes and
                      resizes to SIDE x SIDE (torchvision decode_jpeg + resize); `granary` has the
                      agent prepare them ([dataset.prepare]), `granary_workers` decodes in its
                      workers; every window starts after one whole epoch (the goal: from epoch 1 on);
                      at 100 ms each repetition also runs two `granary` jobs at once on one agent
                      (jobs2_decode_cpu_ratio: decode CPU per delivered sample against one job's)
  --no-jobs2          with --decode: leave the two-job runs out
  --jpeg-side N       the JPEGs' side with --decode (default 448)
  --quiet-wait-s S    before each run, wait up to S s for the machine to be quiet (default 5)
  --plot PATH         where the plot goes (default docs/stall.png; `none`: no plot)
  --python PATH       the Python interpreter (default $PYTHON, else python3)
  --two-jobs          two jobs (C loaders, GPU steps --step-ms and half of it, default 160) on one
                      agent over one dataset at --rtt (default 100) ms, prefetch.balance = stall
                      against static (granary_bench::stall_two_jobs); with it: --max-inflight N
                      (default 80), --window-batches N (64), --window-s S (20), --reps N (2),
                      --files N (32000), --mean-size B (8000), --batch N (32)";

const BUCKET: &str = "granary-bench";
const PREFIX: &str = "synth";
const DATASET: &str = "stall";
const SEED: u64 = 42;
/// How many times calibration lengthens the step by a quarter (×14.6 in all)
/// before giving up.
const CALIBRATION_GROWTHS: u32 = 12;
/// The shard readers: contender and shard format (`stall_shards.py
/// --format`), which is also the folder of the bucket its shards go in.
const SHARD_READERS: &[(&str, &str)] = &[
    ("streaming", "mds"),
    ("litdata", "litdata"),
    ("webdataset", "wds"),
];
static RUN_NO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Every contender, in the default order (Granary first).
const ALL: &[&str] = stall_loaders::CONTENDERS;

/// The JPEG dataset of `--decode` (`bench/stall_decode.py make`, once).
fn jpeg_dataset(python: &str, root: &Path, files: u64, side: u32) -> Result<Dataset> {
    let dir = data::data_root().join(format!("jpeg-{files}x{side}"));
    let status = Command::new(python)
        .arg(root.join("bench/stall_decode.py"))
        .arg("make")
        .arg(&dir)
        .args([files.to_string(), side.to_string()])
        .status()
        .map_err(|e| format!("stall_decode.py: {e}"))?;
    if !status.success() {
        return Err(format!("stall_decode.py make: {status}"));
    }
    data::from_dir(&dir).map_err(|e| format!("dataset: {e}"))
}

/// The checkout: where this binary was built from, else the current
/// folder (a binary carried to another machine and run from a copy of the
/// checkout's root).
fn repo_root() -> Result<PathBuf> {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf);
    let here = std::env::current_dir().ok();
    built
        .into_iter()
        .chain(here)
        .find(|d| d.join("bench/stall_train.py").is_file())
        .ok_or_else(|| {
            "no checkout with bench/stall_train.py (run from the checkout's root)".into()
        })
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stall: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every contender but `granary_w0`, which is run on request only: the same
/// agent read in the training process, where its per-batch work is not
/// hidden behind the GPU step (docs/benchmarks.md has a run of it).
fn default_contenders() -> Vec<&'static str> {
    ALL.iter().copied().filter(|&n| n != "granary_w0").collect()
}

/// How one contender is started.
#[derive(Clone, Debug)]
enum Launch {
    /// `stall_train.py` with these arguments.
    Python(Vec<String>),
    /// The C consumer, built at this path.
    C(PathBuf),
    /// Not runnable here, and why.
    Missing(String),
}

#[derive(Clone, Debug)]
struct Contender {
    name: String,
    launch: Launch,
    /// Needs a fresh Granary agent per run.
    agent: bool,
    settings: &'static str,
}

fn py_args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn contender(name: &str, python: &str, c_loader: &Result<PathBuf>) -> Result<Contender> {
    // `stall_train.py` with the contender's arguments, or why it cannot run
    // (its package does not import).
    let script = |needs: Option<(&str, &str)>| -> Launch {
        let missing = needs.filter(|(module, _)| {
            !Command::new(python)
                .args(["-c", &format!("import {module}")])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        match (missing, stall_loaders::args(name)) {
            (Some((module, package)), _) => {
                Launch::Missing(format!("{module} does not import (pip install {package})"))
            }
            (None, Some(args)) => Launch::Python(py_args(args)),
            (None, None) => Launch::Missing(format!("{name}: no stall_train.py arguments")),
        }
    };
    let (launch, agent, settings) = match name {
        "granary" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32) in the training process through granary.cuda.prefetch (depth 2; the arena registered with CUDA when there is a GPU), no DataLoader worker; agent: max_inflight_reads 1024, window 64 batches, 1 GiB arena",
        ),
        "granary_workers" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32), DataLoader(batch_size=None, num_workers=2); agent as for granary",
        ),
        "granary_w0" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32) read in the training process, DataLoader(batch_size=None, num_workers=0); agent as for granary",
        ),
        "granary_c" => (
            match c_loader {
                Ok(p) => Launch::C(p.clone()),
                Err(e) => Launch::Missing(e.clone()),
            },
            true,
            "bench/stall_consume.c: one libgranary session in the training process; agent as for granary",
        ),
        "boto3_w8" | "boto3_w32" => (
            script(None),
            false,
            "map-style Dataset, one boto3 get_object per sample; DataLoader(batch_size=32, RandomSampler, num_workers=8 or 32)",
        ),
        "boto3_threads" => (
            script(None),
            false,
            "as boto3, each worker fetching its batch with 16 threads (__getitems__); 4 workers",
        ),
        "s3torch_map" | "s3torch_iter" => (
            script(Some(("s3torchconnector", "s3torchconnector"))),
            false,
            "s3torchconnector S3MapDataset / S3IterableDataset(enable_sharding=True) .from_objects, force_path_style; DataLoader(batch_size=32, num_workers=8)",
        ),
        "streaming" => (
            script(Some(("streaming", "mosaicml-streaming"))),
            false,
            "mosaicml-streaming StreamingDataset(shuffle=True, batch_size=32) over MDS shards (MDSWriter defaults: 64 MiB, uncompressed) in the same store, a fresh local cache per run; DataLoader(batch_size=32, num_workers=8)",
        ),
        "litdata" => (
            script(Some(("litdata", "litdata"))),
            false,
            "litdata StreamingDataset(shuffle=True) over litdata.optimize chunks (64 MB, uncompressed) in the same store, a fresh local cache per run, boto3 standard retries; StreamingDataLoader(batch_size=32, num_workers=8)",
        ),
        "webdataset" => (
            script(Some(("webdataset", "webdataset"))),
            false,
            "webdataset WebDataset over 64 MiB tar shards in the same store, each read by `pipe:curl` on a presigned URL, shard shuffle + shuffle(1000), batched(32) in the workers; WebLoader(batch_size=None, num_workers=8)",
        ),
        other => {
            return Err(format!(
                "--contenders: unknown contender {other:?} (known: {})",
                ALL.join(", ")
            ))
        }
    };
    Ok(Contender {
        name: name.to_owned(),
        launch,
        agent,
        settings,
    })
}

/// Builds `bench/stall_consume.c` against libgranary.so (built by
/// `bench/run stall`) into `dir`.
fn build_c_loader(root: &Path, dir: &Path) -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release");
    if !target.join("libgranary.so").is_file() {
        return Err(format!(
            "{}/libgranary.so is missing (cargo build --release -p granary-client)",
            target.display()
        ));
    }
    let out = dir.join("stall_consume");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", root.join("client-c/include").display()))
        .arg(root.join("bench/stall_consume.c"))
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", target.display()))
        .arg(format!("-Wl,-rpath,{}", target.display()))
        .arg("-lgranary")
        .status()
        .map_err(|e| format!("{cc}: {e}"))?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{cc} bench/stall_consume.c: {status}"))
    }
}

/// Where a shard reader's shards go.
enum ShardsTo<'a> {
    /// Uploaded into SeaweedFS's bucket under the format's prefix (written
    /// in `work` first).
    Upload(&'a Seaweed, &'a Path),
    /// Written into this folder, which the light store then serves under
    /// the format's prefix.
    Folder(PathBuf),
}

/// Writes the shards of a shard-reading contender in `format`
/// (`bench/stall_shards.py`).
fn write_shards(
    python: &str,
    root: &Path,
    to: &ShardsTo,
    keys: &Path,
    ds: &Dataset,
    format: &str,
) -> Result<()> {
    let mut cmd = Command::new(python);
    cmd.arg(root.join("bench/stall_shards.py"))
        .args(["--format", format])
        .arg("--keys")
        .arg(keys)
        .arg("--local-root")
        .arg(&ds.spec.root);
    let work = match to {
        ShardsTo::Upload(weed, work) => {
            let work = work.join("shards-work");
            cmd.args(["--endpoint", &weed.endpoint(), "--bucket", weed.bucket()])
                .args(["--prefix", format])
                .arg("--work")
                .arg(&work)
                .envs(weed.env());
            Some(work)
        }
        ShardsTo::Folder(dir) => {
            cmd.arg("--out").arg(dir);
            None
        }
    };
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("stall_shards.py: {e}"))?;
    if let Some(work) = work {
        let _ = std::fs::remove_dir_all(&work);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "stall_shards.py --format {format} exited with {}: {text}",
            out.status
        ));
    }
    // The writer's own messages come before the last line (litdata's
    // optimize prints on stdout).
    println!(
        "{format} shards: {}",
        text.trim().lines().last().unwrap_or("")
    );
    Ok(())
}

/// What every run shares.
struct Ctx {
    python: String,
    root: PathBuf,
    store: Store,
    /// A folder of this run's own (keys, the C loader, shard caches).
    work: PathBuf,
    proxy: DelayProxy,
    keys: PathBuf,
    ds: Dataset,
    batch: u32,
    batches: u64,
    window_s: f64,
    warmup: u64,
    quiet: Duration,
    /// `--gpu-step`: the model of the real step, if any.
    gpu_step: Option<String>,
    /// `--decode`: the side the loaders resize to (0: bytes, no decode).
    decode: u32,
}

impl Ctx {
    /// Batches consumed before the window: `--warmup-batches`, and with
    /// `--decode` a whole epoch before them.
    fn warmup_batches(&self) -> u64 {
        if self.decode == 0 {
            self.warmup
        } else {
            self.warmup + self.ds.len().div_ceil(u64::from(self.batch))
        }
    }

    /// Epochs a Granary pass is opened for: enough for the warm-up and the
    /// window.
    fn epochs(&self) -> u64 {
        let samples = (self.warmup_batches() + self.batches) * u64::from(self.batch);
        samples.div_ceil(self.ds.len().max(1)) + 1
    }
}

/// CPU counters at one edge of a window.
struct Mark {
    at: Instant,
    client: Duration,
    threads: Vec<(String, Duration)>,
    weed: Duration,
    machine: MachineCpu,
}

impl Mark {
    fn take(child: u32, weed: Option<u32>) -> Mark {
        Mark {
            at: Instant::now(),
            client: tree_cpu(child),
            threads: sys::thread_cpu(),
            weed: weed.map_or(Duration::ZERO, process_cpu),
            machine: MachineCpu::read(),
        }
    }
}

/// This process's CPU seconds between two snapshots of its threads, split
/// by whose they are.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Own {
    proxy: f64,
    /// The light store's threads (zero with SeaweedFS).
    store: f64,
    /// Every other thread but the main one: the agent's.
    agent: f64,
}

fn split_own(a: &[(String, Duration)], b: &[(String, Duration)]) -> Own {
    let total = |s: &[(String, Duration)]| -> Duration { s.iter().map(|(_, d)| *d).sum() };
    let of = |name: &str| sys::cpu_of(b, name).saturating_sub(sys::cpu_of(a, name));
    let proxy = of("delay-proxy");
    let store = of(light_store::THREAD_NAME);
    let main = of("stall");
    let all = total(b).saturating_sub(total(a));
    Own {
        proxy: proxy.as_secs_f64(),
        store: store.as_secs_f64(),
        agent: all
            .saturating_sub(proxy)
            .saturating_sub(store)
            .saturating_sub(main)
            .as_secs_f64(),
    }
}

/// One run of one contender at the proxy's current delay.
fn measure(ctx: &Ctx, c: &Contender, step_ms: f64) -> Run {
    if !ctx.quiet.is_zero() {
        sys::wait_quiet(ctx.quiet);
    }
    measure_once(ctx, c, step_ms).unwrap_or_else(Run::failed)
}

/// The agent a contender needs (None for the others): a fresh one for
/// every run, so every sample comes from the store.
fn start_agent(ctx: &Ctx, c: &Contender) -> Result<Option<Agent>> {
    if !c.agent {
        return Ok(None);
    }
    let mut settings = ctx.store.settings_via(ctx.proxy.local_addr());
    settings.request_timeout = Duration::from_secs(30);
    let mut cfg = AgentSettings::new_s3(
        1 << 30,
        S3Dataset {
            name: DATASET.to_owned(),
            settings,
            prefix: PREFIX.to_owned(),
            extra: Vec::new(),
        },
    );
    if ctx.decode > 0 && c.name == "granary" {
        // The agent decodes and resizes once; every loader then reads
        // prepared samples (docs/prepare.md).
        cfg.s3_datasets[0].extra.push(format!(
            "prepare = {{ resize = [{0}, {0}], mode = \"stretch\" }}",
            ctx.decode
        ));
    }
    cfg.window_batches = 64;
    cfg.max_inflight_reads = 1024;
    Agent::start(&cfg)
        .map(Some)
        .map_err(|e| format!("agent: {e}"))
}

/// A shard reader's local cache: fresh for every run, so its shards come
/// from the store.
fn fresh_cache(ctx: &Ctx) -> PathBuf {
    ctx.work.join(format!(
        "shard-cache-{}",
        RUN_NO.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// The command line of one loader process of contender `c`.
fn loader_command(
    ctx: &Ctx,
    c: &Contender,
    agent: Option<&Agent>,
    cache: &Path,
    step_ms: f64,
) -> Result<Command> {
    let socket = agent
        .map(|a| a.socket().display().to_string())
        .unwrap_or_default();
    let (batch, step) = (ctx.batch.to_string(), format!("{step_ms:.3}"));
    let (warm, batches, window) = (
        ctx.warmup_batches().to_string(),
        ctx.batches.to_string(),
        ctx.window_s.to_string(),
    );
    let mut cmd = match &c.launch {
        Launch::Missing(e) => return Err(format!("not run: {e}")),
        Launch::C(bin) => {
            let mut cmd = Command::new(bin);
            cmd.args([
                socket.as_str(),
                DATASET,
                &batch,
                &step,
                &warm,
                &batches,
                &window,
                &SEED.to_string(),
            ]);
            cmd
        }
        Launch::Python(args) => {
            let mut cmd = Command::new(&ctx.python);
            cmd.arg(ctx.root.join("bench/stall_train.py"))
                .args(args)
                .args(["--batch", &batch, "--step-ms", &step])
                .args(["--warmup-batches", &warm, "--batches", &batches])
                .args(["--window-s", &window, "--seed", &SEED.to_string()])
                .arg("--keys")
                .arg(&ctx.keys)
                .arg("--local-root")
                .arg(&ctx.ds.spec.root)
                .args(["--endpoint", &format!("http://{}", ctx.proxy.local_addr())])
                .args(["--bucket", ctx.store.bucket(), "--marks"]);
            if let Some(model) = &ctx.gpu_step {
                cmd.args(["--gpu-step", model]);
            }
            if ctx.decode > 0 {
                cmd.args(["--decode", &ctx.decode.to_string()])
                    .args(["--epochs", &ctx.epochs().to_string()]);
            }
            if c.agent {
                cmd.args(["--socket", &socket, "--dataset", DATASET]);
            }
            if let Some((_, prefix)) = SHARD_READERS.iter().find(|r| r.0 == c.name) {
                cmd.args(["--remote", &format!("s3://{}/{prefix}", ctx.store.bucket())])
                    .arg("--cache")
                    .arg(cache)
                    // mosaicml-streaming's boto3 client reads its endpoint here.
                    .env(
                        "S3_ENDPOINT_URL",
                        format!("http://{}", ctx.proxy.local_addr()),
                    );
            }
            cmd
        }
    };
    cmd.envs(ctx.store.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Ok(cmd)
}

/// What one loader process printed: its JSON line and the marks taken at
/// its window's edges.
struct Printed {
    line: String,
    start: Mark,
    end: Mark,
}

/// Reads a loader's output to its end (its other lines echoed), taking a
/// [`Mark`] at each window edge, and waits for it.
fn follow(name: &str, mut child: std::process::Child, weed: Option<u32>) -> Result<Printed> {
    let pid = child.id();
    let out = child.stdout.take().ok_or("no stdout")?;
    let (mut m0, mut m1, mut line) = (None, None, None);
    for l in BufReader::new(out).lines() {
        let l = l.map_err(|e| e.to_string())?;
        match l.trim() {
            "mark window-start" => m0 = Some(Mark::take(pid, weed)),
            "mark window-end" => m1 = Some(Mark::take(pid, weed)),
            l if l.starts_with('{') => line = Some(l.to_owned()),
            l => println!("    {name}: {l}"),
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let line = line
        .filter(|_| status.success())
        .ok_or_else(|| format!("{name} exited with {status}"))?;
    let (Some(start), Some(end)) = (m0, m1) else {
        return Err(format!("{name}: no window marks"));
    };
    Ok(Printed { line, start, end })
}

fn measure_once(ctx: &Ctx, c: &Contender, step_ms: f64) -> Result<Run> {
    let t_setup = Instant::now();
    // This process's threads before the agent starts: its CPU from the start.
    let threads_at_launch = sys::thread_cpu();
    let agent = start_agent(ctx, c)?;
    let cache = fresh_cache(ctx);
    let mut cmd = loader_command(ctx, c, agent.as_ref(), &cache, step_ms)?;
    let setup_s = t_setup.elapsed().as_secs_f64();
    let child = cmd.spawn().map_err(|e| format!("{}: {e}", c.name))?;
    let printed = follow(&c.name, child, ctx.store.weed_pid());
    drop(agent);
    let _ = std::fs::remove_dir_all(&cache);
    let Printed {
        line,
        start: a,
        end: b,
    } = printed?;
    let mut r = Run::from_loader_line(&line, setup_s)?;
    // The loader's tree did not exist before the launch: its CPU at the
    // window's end is all it spent.
    r.cpu_from_start_s = b.client.as_secs_f64() + split_own(&threads_at_launch, &b.threads).agent;
    r.samples_from_start = samples_from_start(ctx, &line, r.samples);
    // The agent started after `threads_at_launch`: its prepare workers'
    // CPU at the window's end is all they spent.
    r.prep_cpu_s = stall_jobs2::prep_cpu(&b.threads).as_secs_f64();
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    r.client_cpu_s = b.client.saturating_sub(a.client).as_secs_f64();
    let own = split_own(&a.threads, &b.threads);
    (r.proxy_cpu_s, r.agent_cpu_s) = (own.proxy, own.agent);
    r.store_cpu_s = b.weed.saturating_sub(a.weed).as_secs_f64() + own.store;
    let (busy, _, _) = b.machine.since(&a.machine);
    let ours = (r.client_cpu_s + r.proxy_cpu_s + r.agent_cpu_s + r.store_cpu_s) / secs;
    r.others_cores = (busy - ours).max(0.0);
    Ok(r)
}

/// Samples a loader delivered from its start to its window's end: its
/// warm-up batches (as it reports them) and the window's.
fn samples_from_start(ctx: &Ctx, line: &str, window_samples: u64) -> u64 {
    let warmed =
        report::json_num(line, "warmup_batches").map_or(ctx.warmup_batches(), |n| n as u64);
    window_samples + warmed * u64::from(ctx.batch)
}

/// `--decode`: two `granary` jobs at once on one agent with `prepare`
/// ([`granary_bench::stall_jobs2`]). Returns both jobs' runs and the decode
/// span over both.
fn measure_jobs2(ctx: &Ctx, c: &Contender, step_ms: f64) -> Result<([Run; 2], DecodeSpan)> {
    if !ctx.quiet.is_zero() {
        sys::wait_quiet(ctx.quiet);
    }
    let t_setup = Instant::now();
    let agent = start_agent(ctx, c)?.ok_or("two jobs: the contender has no agent")?;
    let cache = fresh_cache(ctx);
    let setup_s = t_setup.elapsed().as_secs_f64();
    let weed = ctx.store.weed_pid();
    let printed: Vec<Result<Printed>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (1..=2)
            .map(|j| {
                let cmd = loader_command(ctx, c, Some(&agent), &cache, step_ms);
                s.spawn(move || {
                    let name = format!("{} job {j}", c.name);
                    let child = cmd?.spawn().map_err(|e| format!("{name}: {e}"))?;
                    follow(&name, child, weed)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a job's thread panicked".into()))
            })
            .collect()
    });
    drop(agent);
    let _ = std::fs::remove_dir_all(&cache);
    let mut span = DecodeSpan::default();
    let mut runs = Vec::new();
    for p in printed {
        let p = p?;
        let mut r = Run::from_loader_line(&p.line, setup_s)?;
        r.samples_from_start = samples_from_start(ctx, &p.line, r.samples);
        // The later window's end covers both jobs' spans.
        r.prep_cpu_s = stall_jobs2::prep_cpu(&p.end.threads).as_secs_f64();
        span.prep_cpu_s = span.prep_cpu_s.max(r.prep_cpu_s);
        span.samples += r.samples_from_start;
        runs.push(r);
    }
    let runs: [Run; 2] = runs.try_into().map_err(|_| "two jobs: not two runs")?;
    Ok((runs, span))
}

fn print_run(name: &str, r: &Run) {
    if let Some(e) = &r.error {
        println!("  {name}: FAILED: {e}");
        return;
    }
    println!(
        "  {name}: idle {:.1} % ({:.1} % from the start), {:.0} img/s, wait p50 {:.1} ms p99 {:.1} ms, first batch {:.2} s; CPU µs/sample: loader {:.0} (agent {:.0}; {:.0} from the start), proxy {:.0}, store {:.0}; others {:.2} cores",
        r.idle * 100.0,
        r.idle_from_start * 100.0,
        r.img_per_s,
        r.wait_p50_ms,
        r.wait_p99_ms,
        r.first_batch_s,
        r.loader_us(),
        r.agent_cpu_s / r.samples.max(1) as f64 * 1e6,
        r.loader_us_from_start(),
        r.proxy_us(),
        r.store_us(),
        r.others_cores
    );
}

/// The GPU step: the shortest that the local-disk DataLoader keeps ≥ 95 %
/// busy (see the module documentation). Returns (step ms, the loader's
/// rate with no step, its idle fraction at the step).
fn calibrate(ctx: &Ctx) -> Result<(f64, f64, f64)> {
    let local = Contender {
        name: "local".to_owned(),
        launch: Launch::Python(py_args(&[
            "--contender",
            "local",
            "--workers",
            &granary_bench::cpu::online_cpus().to_string(),
        ])),
        agent: false,
        settings: "",
    };
    let free = measure(ctx, &local, 0.0);
    print_run("local disk, no GPU step", &free);
    if let Some(e) = &free.error {
        return Err(format!("calibration: {e}"));
    }
    let mut step = f64::from(ctx.batch) / (0.95 * free.img_per_s) * 1e3;
    for _ in 0..=CALIBRATION_GROWTHS {
        let r = measure(ctx, &local, step);
        print_run(&format!("local disk, step {step:.2} ms"), &r);
        if let Some(e) = &r.error {
            return Err(format!("calibration: {e}"));
        }
        if r.idle <= stall_stats::CALIBRATION_IDLE {
            return Ok((step, free.img_per_s, r.idle));
        }
        step *= 1.25;
    }
    Err(format!(
        "calibration: the local-disk loader never got under {} % idle",
        stall_stats::CALIBRATION_IDLE * 100.0
    ))
}

/// `--two-jobs` ([`granary_bench::stall_two_jobs`]).
fn two_jobs(args: &Args) -> Result<()> {
    let settings = granary_bench::stall_two_jobs::Settings::from_args(args)?;
    let root = repo_root()?;
    let work = std::env::temp_dir().join(format!("granary-stall-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    println!("stall --two-jobs: {}", sys::regime());
    let out = build_c_loader(&root, &work)
        .and_then(|c| granary_bench::stall_two_jobs::run(&settings, &c));
    let _ = std::fs::remove_dir_all(&work);
    out
}

fn run() -> Result<()> {
    let args = Args::parse(
        std::env::args().skip(1),
        &["quick", "two-jobs", "no-jobs2"],
        USAGE,
    )?;
    if args.flag("two-jobs") {
        return two_jobs(&args);
    }
    let quick = args.flag("quick");
    let q = |full: u64, short: u64| if quick { short } else { full };
    let rtts = args.list("rtt", &[0, 10, 50, 100, 200])?;
    let names: Vec<String> = args
        .string("contenders", &default_contenders().join(","))
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if names.first().map(String::as_str) != Some("granary") {
        return Err(
            "--contenders: the list must start with granary (the goal is judged on it)".into(),
        );
    }
    if let Some(bad) = names.iter().find(|n| !ALL.contains(&n.as_str())) {
        return Err(format!(
            "--contenders: unknown contender {bad:?} (known: {})",
            ALL.join(", ")
        ));
    }
    let reps = args.u64("reps", q(3, 2))?.max(1);
    let files = args.u64("files", q(20_000, 6_000))?;
    let mean = args.u64("mean-size", 110_000)?;
    let batch = args.u32("batch", 32)?.max(1);
    let batches = args.u64("batches", q(400, 150))?.max(1);
    let window_s: f64 = args
        .string("window-s", if quick { "12" } else { "30" })
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x > 0.0)
        .ok_or("--window-s: not a positive number of seconds")?;
    let warmup = args.u64("warmup-batches", 5)?;
    let step_arg = args.string("step-ms", "");
    let quiet_s: f64 = args
        .string("quiet-wait-s", "5")
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x >= 0.0)
        .ok_or("--quiet-wait-s: not a number of seconds")?;
    let python = match args.string("python", "") {
        p if !p.is_empty() => p,
        _ => std::env::var("PYTHON")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".to_owned()),
    };
    let root = repo_root()?;
    let store_kind = args.string("store", "seaweed");
    if !["seaweed", "light"].contains(&store_kind.as_str()) {
        return Err(format!("--store: {store_kind:?} is not seaweed or light"));
    }
    let light_threads = args.u64("light-threads", 2)?.max(1) as usize;
    let gpu_step = match args.string("gpu-step", "").as_str() {
        "" => None,
        m @ ("resnet50" | "tiny") => Some(m.to_owned()),
        m => return Err(format!("--gpu-step: {m:?} is not resnet50 or tiny")),
    };
    let plot = match args.string("plot", "").as_str() {
        "" => Some(root.join("docs/stall.png")),
        "none" => None,
        p => Some(PathBuf::from(p)),
    };
    let decode = args.u32("decode", 0)?;
    let jpeg_side = args.u32("jpeg-side", 448)?;
    let consumed = (warmup + batches) * u64::from(batch);
    if consumed > files && decode == 0 {
        return Err(format!(
            "--files {files} is smaller than the {consumed} samples a run may consume (warm-up + batches) × batch"
        ));
    }

    let regime_before = sys::regime();
    println!("stall: {regime_before}");
    println!("stall: CPU {}", cpu_model());
    let t_all = Instant::now();
    let ds = if decode > 0 {
        jpeg_dataset(&python, &root, files, jpeg_side)?
    } else {
        data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?
    };
    println!(
        "dataset: {} files, {:.3} GB, mean {:.0} bytes ({})",
        ds.len(),
        ds.bytes as f64 / 1e9,
        ds.bytes as f64 / ds.len().max(1) as f64,
        ds.spec.root.display()
    );
    let work = std::env::temp_dir().join(format!("granary-stall-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let keys = work.join("keys.tsv");
    s3_data::write_keys_at(&keys, &ds, PREFIX)?;
    let c_loader = match (&gpu_step, decode) {
        (Some(_), _) => Err("with --gpu-step: the C loader has no GPU step".to_owned()),
        (None, 1..) => Err("with --decode: the C loader does not decode".to_owned()),
        (None, 0) => build_c_loader(&root, &work),
    };
    let mut contenders = names
        .iter()
        .map(|n| contender(n, &python, &c_loader))
        .collect::<Result<Vec<_>>>()?;
    let formats: Vec<&str> = contenders
        .iter()
        .filter(|c| matches!(c.launch, Launch::Python(_)))
        .filter_map(|c| SHARD_READERS.iter().find(|r| r.0 == c.name).map(|r| r.1))
        .collect();
    let mut shard_errors = Vec::new();
    let store = if store_kind == "light" {
        let mut mounts = vec![(ds.spec.root.clone(), PREFIX.to_owned())];
        for format in &formats {
            let dir = work.join("shards").join(format);
            match write_shards(
                &python,
                &root,
                &ShardsTo::Folder(dir.clone()),
                &keys,
                &ds,
                format,
            ) {
                Ok(()) => mounts.push((dir, (*format).to_owned())),
                Err(e) => shard_errors.push((*format, e)),
            }
        }
        let mounts: Vec<(&Path, &str)> = mounts
            .iter()
            .map(|(d, p)| (d.as_path(), p.as_str()))
            .collect();
        let light = LightStore::start_mounts(&mounts, BUCKET, light_threads)
            .map_err(|e| format!("light store: {e}"))?;
        println!(
            "light store: S3 on {} ({} objects, {light_threads} worker threads)",
            light.endpoint(),
            light.len()
        );
        // Every file read once, so that the first run is served from the
        // page cache like the others (SeaweedFS's ingest reads its objects
        // back for the same reason).
        let t = Instant::now();
        let warmed = s3_data::read_all(&ds)?;
        println!(
            "page cache: every file read once ({:.3} GB) in {:.1} s",
            warmed as f64 / 1e9,
            t.elapsed().as_secs_f64()
        );
        Store::Light(light)
    } else {
        let weed = Seaweed::try_start(BUCKET)?;
        println!(
            "SeaweedFS: S3 on {} (pid {})",
            weed.endpoint(),
            weed.pid().unwrap_or(0)
        );
        s3_data::upload(&weed, &ds, PREFIX)?;
        println!(
            "SeaweedFS idle {:.1} s after the ingest",
            s3_data::settle(&weed).as_secs_f64()
        );
        for format in &formats {
            let to = ShardsTo::Upload(&weed, &work);
            if let Err(e) = write_shards(&python, &root, &to, &keys, &ds, format) {
                shard_errors.push((*format, e));
            }
        }
        Store::Weed(weed)
    };
    for c in &mut contenders {
        let Some((_, format)) = SHARD_READERS.iter().find(|r| r.0 == c.name) else {
            continue;
        };
        if let Some((_, e)) = shard_errors.iter().find(|(f, _)| f == format) {
            c.launch = Launch::Missing(e.clone());
        }
    }
    for c in &contenders {
        match &c.launch {
            Launch::Missing(e) => println!("contender {}: NOT RUN: {e}", c.name),
            _ => println!("contender {}: {}", c.name, c.settings),
        }
    }
    let proxy = DelayProxy::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        store.addr(),
        Duration::ZERO,
        None,
    )
    .map_err(|e| format!("delay proxy: {e}"))?;
    println!(
        "delay proxy: {} -> {} ({})",
        proxy.local_addr(),
        store.addr(),
        store.describe()
    );
    let ctx = Ctx {
        python: python.clone(),
        root: root.clone(),
        store,
        work,
        proxy,
        keys,
        ds,
        batch,
        batches,
        window_s,
        warmup,
        quiet: Duration::from_secs_f64(quiet_s),
        gpu_step: gpu_step.clone(),
        decode,
    };

    let (step_ms, local_rate, local_idle) = if ctx.gpu_step.is_some() {
        (0.0, f64::NAN, f64::NAN)
    } else if step_arg.is_empty() {
        println!("--- calibrating the GPU step on the local-disk DataLoader");
        calibrate(&ctx)?
    } else {
        let s: f64 = step_arg
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .ok_or("--step-ms: not a number of ms")?;
        (s, f64::NAN, f64::NAN)
    };
    match &ctx.gpu_step {
        Some(model) => println!(
            "GPU step: {model} forward and backward on each batch of {batch} (bf16 autocast, channels_last, SGD; on CUDA when present), synchronised, timed by the loop"
        ),
        None => println!(
            "GPU step: {step_ms:.2} ms per batch of {batch} ({:.0} img/s when never waiting); local-disk loader: {local_rate:.0} img/s with no step, idle {:.1} % at this step",
            f64::from(batch) / step_ms * 1e3,
            local_idle * 100.0
        ),
    }

    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); rtts.len()]; contenders.len()];
    // `--decode`: two `granary` jobs on one agent, at the goal's RTT,
    // interleaved with the other runs.
    let jobs2_on = decode > 0 && !args.flag("no-jobs2");
    let mut jobs2_spans = Vec::new();
    for (i, &rtt) in rtts.iter().enumerate() {
        ctx.proxy.set_delay(Duration::from_micros(rtt * 500));
        println!("--- RTT {rtt} ms");
        for rep in 0..reps {
            for (k, c) in contenders.iter().enumerate() {
                let r = measure(&ctx, c, step_ms);
                print_run(&format!("{} (run {})", c.name, rep + 1), &r);
                runs[k][i].push(r);
            }
            if jobs2_on && rtt == GOAL_RTT_MS {
                match measure_jobs2(&ctx, &contenders[0], step_ms) {
                    Ok((two, span)) => {
                        for (j, r) in two.iter().enumerate() {
                            println!(
                                "  granary, two jobs: job {} (run {}): idle {:.1} % ({:.1} % from the start), {:.0} img/s, wait p99 {:.1} ms, first batch {:.2} s",
                                j + 1,
                                rep + 1,
                                r.idle * 100.0,
                                r.idle_from_start * 100.0,
                                r.img_per_s,
                                r.wait_p99_ms,
                                r.first_batch_s
                            );
                        }
                        println!(
                            "  granary, two jobs (run {}): decode CPU {:.2} s for {} samples delivered ({:.0} µs/sample)",
                            rep + 1,
                            span.prep_cpu_s,
                            span.samples,
                            span.us_per_sample()
                        );
                        jobs2_spans.push(span);
                    }
                    Err(e) => println!("  granary, two jobs (run {}): FAILED: {e}", rep + 1),
                }
            }
        }
    }
    let one_job_spans: Vec<DecodeSpan> = rtts
        .iter()
        .position(|&r| r == GOAL_RTT_MS)
        .map(|i| {
            runs[0][i]
                .iter()
                .filter(|r| r.error.is_none())
                .map(|r| DecodeSpan {
                    prep_cpu_s: r.prep_cpu_s,
                    samples: r.samples_from_start,
                })
                .collect()
        })
        .unwrap_or_default();
    let jobs2 = Jobs2::judge(&one_job_spans, &jobs2_spans);
    let Ctx {
        store, proxy, work, ..
    } = ctx;
    drop(proxy);
    drop(store);
    let _ = std::fs::remove_dir_all(&work);

    // Medians, table, goal.
    let columns: Vec<(String, Vec<Cell>)> = contenders
        .iter()
        .zip(&runs)
        .map(|(c, per_rtt)| {
            (
                c.name.clone(),
                per_rtt.iter().map(|r| Cell::of(r)).collect(),
            )
        })
        .collect();
    println!(
        "\nGPU-idle fraction in the window (median of {reps} runs; from the start; img/s; loader CPU µs per sample), step {step_ms:.2} ms:"
    );
    println!(
        "| RTT ms | {} |",
        columns
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (i, rtt) in rtts.iter().enumerate() {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, cells)| {
                let c = &cells[i];
                if c.ok == 0 {
                    "failed".to_owned()
                } else {
                    format!(
                        "{:.1} % ({:.1} %; {:.0}; {:.0})",
                        c.idle * 100.0,
                        c.idle_from_start * 100.0,
                        c.img_per_s,
                        c.loader_us
                    )
                }
            })
            .collect();
        println!("| {rtt} | {} |", cells.join(" | "));
    }
    let at = rtts.iter().position(|&r| r == GOAL_RTT_MS);
    let empty = Cell::of(&[]);
    let cell = |k: usize| at.map_or(&empty, |i| &columns[k].1[i]);
    let others: Vec<(&str, &Cell)> = columns
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, (n, _))| !n.starts_with("granary"))
        .map(|(k, (n, _))| (n.as_str(), cell(k)))
        .collect();
    let c_cell = columns
        .iter()
        .position(|(n, _)| n == "granary_c")
        .map(&cell);
    let mut goal = Goal::judge(cell(0), c_cell, &others);
    let best_idle = stall_stats::best_idle(&others);
    if decode > 0 {
        // With --decode the idle goal is relative: ≤ 0.5 × the best
        // contender's.
        goal.idle_met = best_idle.as_ref().and_then(|(_, b)| {
            goal.idle
                .is_finite()
                .then_some(goal.idle <= stall_stats::GOAL_DECODE_IDLE_RATIO * b)
        });
        println!(
            "decode goal at {GOAL_RTT_MS} ms: granary idle {:.2} % against the best contender's {} (goal ≤ {}×: {})",
            goal.idle * 100.0,
            best_idle
                .as_ref()
                .map_or("(none measured)".to_owned(), |(n, v)| format!("{:.2} % ({n})", v * 100.0)),
            stall_stats::GOAL_DECODE_IDLE_RATIO,
            stall_stats::verdict(goal.idle_met)
        );
    }
    println!(
        "goal at {GOAL_RTT_MS} ms: granary idle {:.1} % (goal ≤ {:.0} % and ≤ granary_c's {:.1} % + {:.0} point: {}); loader CPU {:.0} µs/sample against the best contender's {} (goal ≤ {}×: {})",
        goal.idle * 100.0,
        stall_stats::GOAL_IDLE * 100.0,
        goal.c_idle * 100.0,
        stall_stats::GOAL_IDLE_OVER_C * 100.0,
        stall_stats::verdict(goal.idle_met),
        goal.granary_us,
        goal.best
            .as_ref()
            .map_or("(none measured)".to_owned(), |(n, v)| format!("{v:.0} µs ({n})")),
        stall_stats::GOAL_CPU_RATIO,
        stall_stats::verdict(goal.cpu_met)
    );
    // The goal is judged on `granary`; the other Granary configurations are
    // held to the same bar and printed beside it, not in its place.
    for (k, (n, _)) in columns.iter().enumerate().skip(1) {
        if n.starts_with("granary") {
            let g = Goal::judge(cell(k), c_cell, &others);
            println!(
                "  {n} at {GOAL_RTT_MS} ms: idle {:.1} % (≤ {:.0} %: {}); CPU {:.0} µs/sample (≤ {}× the best contender: {})",
                g.idle * 100.0,
                stall_stats::GOAL_IDLE * 100.0,
                stall_stats::verdict(g.idle_met),
                g.granary_us,
                stall_stats::GOAL_CPU_RATIO,
                stall_stats::verdict(g.cpu_met)
            );
        }
    }
    for (n, c) in &others {
        println!(
            "  {n} at {GOAL_RTT_MS} ms: idle {:.1} %; CPU {:.0} µs/sample ({:.0} from the start)",
            c.idle * 100.0,
            c.loader_us,
            c.loader_us_from_start
        );
    }
    // The goal's CPU is the window's. From the start, a shard reader's
    // downloads before its first batch and every loader's start-up are
    // charged too: printed beside it, not in its place.
    let goal_from_start = Goal::judge_by(cell(0), c_cell, &others, |c| c.loader_us_from_start);
    println!(
        "CPU from the start at {GOAL_RTT_MS} ms (not the goal's measure): granary {:.0} µs/sample against the best contender's {} (≤ {}×: {})",
        goal_from_start.granary_us,
        goal_from_start
            .best
            .as_ref()
            .map_or("(none measured)".to_owned(), |(n, v)| format!("{v:.0} µs ({n})")),
        stall_stats::GOAL_CPU_RATIO,
        stall_stats::verdict(goal_from_start.cpu_met)
    );
    if jobs2_on {
        println!(
            "two jobs at {GOAL_RTT_MS} ms: decode CPU {:.0} µs per delivered sample against one job's {:.0} (ratio {:.3}; goal {}: {})",
            jobs2.two_jobs_us,
            jobs2.one_job_us,
            jobs2.ratio,
            stall_jobs2::GOAL.rule(),
            stall_jobs2::GOAL.verdict(jobs2.ratio)
        );
    }
    let regime_after = sys::regime();
    println!("after: {regime_after}");

    let mut j = stall_stats::summary_json(&rtts, &columns, &goal);
    j.num(
        "best_contender_idle",
        best_idle.as_ref().map_or(f64::NAN, |b| b.1),
        4,
    )
    .num("decode", f64::from(decode), 0)
    .num("jobs2_decode_cpu_ratio", jobs2.ratio, 3)
    .num("granary_decode_cpu_us_per_sample", jobs2.one_job_us, 1)
    .num("jobs2_decode_cpu_us_per_sample", jobs2.two_jobs_us, 1);
    if jobs2_on {
        j.goal(&stall_jobs2::GOAL, jobs2.ratio);
    }
    j.str("store", &store_kind)
        .str("gpu_step", gpu_step.as_deref().unwrap_or("sleep"))
        .num("step_ms", step_ms, 3)
        .num("local_disk_img_per_s", local_rate, 0)
        .num("local_disk_idle_at_step", local_idle, 4)
        .int("batch", u64::from(batch))
        .int("reps", reps)
        .int("batches_per_run", batches)
        .num("window_s", window_s, 1)
        .int("files", files)
        .int("mean_size", mean)
        .str("cpu_model", &cpu_model())
        .int("cpus", granary_bench::cpu::online_cpus() as u64)
        .str("regime_before", &regime_before)
        .str("regime_after", &regime_after)
        .num("total_s", t_all.elapsed().as_secs_f64(), 0)
        .num(
            "granary_cpu_us_per_sample_from_start",
            goal_from_start.granary_us,
            1,
        )
        .num(
            "best_contender_cpu_us_per_sample_from_start",
            goal_from_start.best.as_ref().map_or(f64::NAN, |b| b.1),
            1,
        )
        .str(
            "best_contender_from_start",
            goal_from_start.best.as_ref().map_or("", |b| b.0.as_str()),
        );
    for c in &contenders {
        if let Launch::Missing(e) = &c.launch {
            j.str(&format!("{}_not_run", c.name), e);
        }
    }
    let line = j.line();
    if let Some(plot) = plot {
        match report::draw(&python, &root.join("bench/stall_plot.py"), &line, &plot) {
            Ok(()) => println!("plot: {}", plot.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }
    println!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_threads_split_into_proxy_and_agent() {
        let s = |v: &[(&str, u64)]| -> Vec<(String, Duration)> {
            v.iter()
                .map(|(n, ms)| ((*n).to_owned(), Duration::from_millis(*ms)))
                .collect()
        };
        let a = s(&[("stall", 100), ("delay-proxy", 10), ("granary-engine", 5)]);
        let b = s(&[
            ("stall", 150),
            ("delay-proxy", 40),
            ("granary-engine", 25),
            ("granary-s3", 30),
        ]);
        let own = split_own(&a, &b);
        assert!((own.proxy - 0.030).abs() < 1e-9);
        assert!((own.agent - 0.050).abs() < 1e-9);
        assert_eq!(own.store, 0.0);
        let c = s(&[
            ("stall", 150),
            ("delay-proxy", 40),
            ("granary-engine", 25),
            ("granary-s3", 30),
            (light_store::THREAD_NAME, 70),
        ]);
        let own = split_own(&a, &c);
        assert!((own.store - 0.070).abs() < 1e-9);
        assert!(
            (own.agent - 0.050).abs() < 1e-9,
            "the store is not the agent"
        );
    }

    #[test]
    fn contender_names_are_checked() {
        let none: Result<PathBuf> = Err("no C loader".into());
        assert!(contender("nope", "python3", &none).is_err());
        let c = contender("granary_c", "python3", &none).unwrap();
        assert!(matches!(c.launch, Launch::Missing(_)));
        for name in default_contenders() {
            assert!(contender(name, "python3", &none).is_ok(), "{name}");
        }
        assert!(!default_contenders().contains(&"granary_w0"));
        assert_eq!(default_contenders()[0], "granary");
        let c = contender("boto3_w32", "python3", &none).unwrap();
        match c.launch {
            Launch::Python(a) => assert!(a.windows(2).any(|w| w == ["--workers", "32"])),
            other => panic!("{other:?}"),
        }
    }
}
