//! One run of one side: the agent's first epoch ([`AgentEpoch`]), fio
//! ([`FioRun`]) or the io_uring whole-file reader ([`UringRun`]), each
//! after [`Scenario::make_cold`].

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use granary::{Client, SessionOptions};

use super::scenario::{Reader, Scenario};
use super::Result;
use crate::agent::{Agent, AgentSettings};
use crate::data::Dataset;
use crate::loader::{self, Wait};
use crate::sys;
use crate::touch::touch;
use crate::uring_read;

/// One agent configuration.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// Samples per batch.
    pub batch: u32,
    /// `prefetch.max_inflight_reads`.
    pub inflight: u32,
    /// `prefetch.window_batches`.
    pub window: u32,
    /// `dataset[0].direct_io = true`; false leaves it unset (the default).
    pub direct: bool,
}

impl Knobs {
    /// The configuration in words.
    pub fn label(&self) -> String {
        format!(
            "batch {} window {} max_inflight_reads {}{}",
            self.batch,
            self.window,
            self.inflight,
            if self.direct { " direct_io" } else { "" }
        )
    }
}

/// The agent's first epoch.
pub struct AgentEpoch {
    /// The configuration.
    pub knobs: Knobs,
    /// Samples per second over the epoch.
    pub files_per_s: f64,
    /// The epoch's time.
    pub secs: f64,
    /// Bytes the agent read.
    pub bytes_read: u64,
    /// The stat pass before it.
    pub stat: Duration,
    /// Time to the first batch.
    pub first_batch: Duration,
    /// Time the loader waited.
    pub waited: Duration,
    /// Read latency, median (seconds).
    pub read_p50: Option<f64>,
    /// Read latency, 99th percentile (seconds).
    pub read_p99: Option<f64>,
    /// CPU time of the engine thread.
    pub engine_cpu: Duration,
    /// CPU time of the loader thread.
    pub loader_cpu: Duration,
    /// The most reads in flight seen.
    pub peak_inflight: u64,
}

/// Caches dropped (before the agent starts: its `direct_io` default looks
/// at the page cache when it opens the dataset); a fresh agent; one epoch.
pub fn granary_epoch(sc: &Scenario, k: Knobs, touch_bytes: bool) -> Result<AgentEpoch> {
    let ds = &sc.ds;
    let mut settings = AgentSettings::new(sc.arena, "cold", &ds.spec.root);
    settings.max_inflight_reads = k.inflight;
    settings.window_batches = k.window;
    settings.direct_io = k.direct.then_some(true);
    let stat = sc.make_cold()?;
    let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new("cold");
    opts.seed = 7;
    opts.batch_size = k.batch;
    opts.epoch_count = 1;
    // Peak reads in flight, sampled by a watcher thread.
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
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

/// One run of the io_uring whole-file reader.
pub struct UringRun {
    /// Files per second.
    pub files_per_s: f64,
    /// The run's time.
    pub secs: f64,
    /// Bytes read.
    pub bytes: u64,
    /// Reads issued.
    pub reads: u64,
    /// The stat pass before it.
    pub stat: Duration,
}

/// The io_uring reader over every file at the scenario's depth.
pub fn uring_run(sc: &Scenario, direct: bool) -> Result<UringRun> {
    let stat = sc.make_cold()?;
    let p = uring_read::read_all(&sc.files, sc.depth, direct)
        .map_err(|e| format!("{}: {e}", Reader::Uring { direct }.name()))?;
    let secs = p.elapsed.as_secs_f64().max(1e-9);
    Ok(UringRun {
        files_per_s: p.files as f64 / secs,
        secs,
        bytes: p.bytes,
        reads: p.reads,
        stat,
    })
}

/// One fio run.
pub struct FioRun {
    /// Files per second over fio's I/O phase.
    pub files_per_s: f64,
    /// Files per second over the whole run.
    pub wall_files_per_s: f64,
    /// fio's I/O phase (`read runtime`).
    pub runtime: Duration,
    /// The whole run.
    pub wall: Duration,
    /// Bytes read.
    pub bytes: u64,
    /// Reads issued.
    pub ios: u64,
    /// The stat pass before it.
    pub stat: Duration,
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

/// fio with block setting `bs` over the dataset at the scenario's depth.
pub fn fio_run(sc: &Scenario, bs: &str) -> Result<FioRun> {
    let ds = &sc.ds;
    let stat = sc.make_cold()?;
    let args = fio_args(ds, bs, sc.depth);
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
