//! One measurement of each loader: Granary (a fresh in-process agent, one
//! session) and the Python loaders (`bench/latency_dataloader.py`,
//! `bench/stall_train.py`), each counting the samples of one window.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use granary::{Client, SessionOptions};
use granary_tools::synth;

use super::cpu::{CpuMark, CpuUse};
use super::point::Point;
use super::scenario::{GranaryKnobs, Windowing};
use super::{Result, DATASET, PREFIX, STOP_EARLY};
use crate::agent::{Agent, AgentSettings, S3Dataset};
use crate::data::Dataset;
use crate::delay_proxy::DelayProxy;
use crate::loader::{self, Wait};
use crate::report::{json_num, Json};
use crate::store::Store;
use crate::sys;
use crate::touch::touch;

/// Checks a synthetic sample's header against what the agent says it is.
pub fn check_header(id: u64, label: i32, bytes: &[u8]) -> std::result::Result<(), String> {
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

/// A session's options: the first epoch of [`DATASET`] in batches of
/// `batch`, shuffled with seed 42.
pub fn first_epoch(batch: u32, open_timeout: Duration) -> SessionOptions {
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 42;
    opts.batch_size = batch;
    opts.epoch_count = 1;
    opts.open_timeout = open_timeout;
    opts
}

/// The agent's settings: the bucket through the proxy as a `kind = "s3"`
/// dataset, with the knobs and the extra keys.
fn agent_settings(store: &Store, proxy: &DelayProxy, k: &GranaryKnobs) -> AgentSettings {
    let dataset_lines = k
        .extra
        .iter()
        .filter(|(s, _)| s == "dataset")
        .map(|(_, l)| l.clone())
        .collect();
    let dataset = S3Dataset {
        extra: dataset_lines,
        ..S3Dataset::new(DATASET, store.settings_via(proxy.local_addr()), PREFIX)
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
    cfg
}

/// Counts a Granary session's samples: per second, and in the window that
/// opens `win.warmup` after the first one and closes `win.window` later or
/// at `stop_at` samples, with the CPU counters at its edges.
struct Window<'a> {
    store: &'a Store,
    win: Windowing,
    /// Samples in the epoch, and where the window closes at the latest.
    n: u64,
    stop_at: u64,
    seen: u64,
    bytes: u64,
    first: Option<Instant>,
    /// (samples, bytes, CPU counters) where the window opened and closed.
    m0: Option<(u64, u64, CpuMark)>,
    m1: Option<(u64, u64, CpuMark)>,
    per_second: Vec<u64>,
}

impl Window<'_> {
    /// Counts one sample of `len` bytes; [`STOP_EARLY`] once the window has
    /// closed and the rest of the epoch is not worth reading.
    fn count(&mut self, len: u64) -> Result<()> {
        let now = Instant::now();
        let t0 = *self.first.get_or_insert(now);
        let sec = now.duration_since(t0).as_secs() as usize;
        if self.per_second.len() <= sec {
            self.per_second.resize(sec + 1, 0);
        }
        self.per_second[sec] += 1;
        if self.m0.is_none() && now.duration_since(t0) >= self.win.warmup {
            self.m0 = Some((self.seen, self.bytes, CpuMark::take(self.store)));
        }
        self.seen += 1;
        self.bytes += len;
        let open_since = match &self.m0 {
            Some((_, _, a)) if self.m1.is_none() => a.at.map(|at| now.duration_since(at)),
            _ => None,
        };
        if open_since.is_some_and(|d| d >= self.win.window || self.seen >= self.stop_at) {
            self.m1 = Some((self.seen, self.bytes, CpuMark::take(self.store)));
        }
        // A slow configuration (few reads in flight, a long RTT) is not
        // worth reading to the end once its window has closed.
        if self.m1.is_some() && self.seen < self.n * 9 / 10 {
            return Err(STOP_EARLY.to_owned());
        }
        Ok(())
    }
}

/// One fresh agent serving the bucket through the proxy, one session, the
/// first epoch.
pub fn measure_granary(
    store: &Store,
    proxy: &DelayProxy,
    ds: &Dataset,
    k: &GranaryKnobs,
    win: Windowing,
) -> Result<Point> {
    let cfg = agent_settings(store, proxy, k);
    let t_start = Instant::now();
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let started = t_start.elapsed();
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let opts = first_epoch(k.batch, Duration::from_secs(120));

    let n = ds.len();
    let mut w = Window {
        store,
        win,
        n,
        stop_at: n * 95 / 100,
        seen: 0,
        bytes: 0,
        first: None,
        m0: None,
        m1: None,
        per_second: Vec::new(),
    };
    let t_open = Instant::now();
    let consumed = loader::consume(&client, &opts, Wait::Block, |s| {
        check_header(s.id, s.label, s.bytes)?;
        if s.id % k.verify_every == 0 {
            synth::verify_sample(s.bytes).map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
        }
        let x = touch(s.bytes);
        w.count(s.bytes.len() as u64)?;
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
    let Window {
        seen,
        first,
        m0,
        m1,
        per_second,
        ..
    } = w;
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
    let (note, e) = WindowFacts {
        started,
        first_batch,
        epoch_s,
        waited,
        seen,
        n,
        hits,
        hugepages,
        run: run.is_some(),
    }
    .describe(&series, &per_second);
    Ok(Point {
        samples_per_s: (n1 - n0) as f64 / span,
        mb_per_s: (b1 - b0) as f64 / span / 1e6,
        samples: n1 - n0,
        window_s: span,
        ramp_s: started.as_secs_f64() + first_batch.as_secs_f64(),
        cpu,
        note,
        json_extra: e,
        error: None,
        ..Point::default()
    })
}

/// Whole-epoch facts of a Granary measurement, for its note and its JSON
/// details.
struct WindowFacts {
    started: Duration,
    first_batch: Duration,
    epoch_s: f64,
    waited: f64,
    seen: u64,
    n: u64,
    hits: u64,
    hugepages: bool,
    /// Whether the session ran to the end of the epoch.
    run: bool,
}

impl WindowFacts {
    /// The human-readable note, and the extra JSON fields (`"key":value,...`,
    /// without braces).
    fn describe(&self, series: &[(String, f64)], per_second: &[u64]) -> (String, String) {
        let (epoch_s, n, seen, hits) = (self.epoch_s, self.n, self.seen, self.hits);
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
        let epoch_line = if self.run {
            format!(
                "epoch {:.1} s = {:.0} samples/s overall; loader waited {:.0}% of the epoch",
                epoch_s,
                n as f64 / epoch_s.max(1e-9),
                self.waited / epoch_s.max(1e-9) * 100.0
            )
        } else {
            format!("stopped after the window, {seen} of {n} samples read")
        };
        let note = format!(
            "agent up in {:.2} s (catalog listing included), first batch {:.2} s after asking; {epoch_line}; {hits} arena hits; per second: {rates}{}",
            self.started.as_secs_f64(),
            self.first_batch.as_secs_f64(),
            if s3.is_empty() {
                String::new()
            } else {
                format!("; metrics: {}", s3.join(", "))
            }
        );
        let mut extra = Json::default();
        extra
            .num("agent_start_s", self.started.as_secs_f64(), 2)
            .num("first_batch_s", self.first_batch.as_secs_f64(), 3)
            .num("epoch_s", epoch_s, 2)
            .num("epoch_samples_per_s", n as f64 / epoch_s, 1)
            .num("loader_waited", self.waited / epoch_s, 3)
            .int("samples_read", seen)
            .int("arena_hits", hits)
            .str(
                "arena_pages",
                if self.hugepages { "2 MiB" } else { "4 KiB" },
            )
            .nums(
                "per_second",
                &per_second.iter().map(|&c| c as f64).collect::<Vec<_>>(),
                0,
            );
        let e = extra.line();
        (note, e[1..e.len() - 1].to_owned())
    }
}

/// What a Python loader's run left: its last line (one JSON object), the
/// CPU use of the window between its `mark` lines (its own process tree
/// as `python`), and how long the process ran.
pub struct ScriptRun {
    pub line: String,
    pub cpu: CpuUse,
    pub ran: Duration,
}

/// Runs `python script args...` with the store's credentials, reading CPU
/// counters at its `mark window-start` / `mark window-end` lines; its
/// other lines are echoed. An error when it fails or prints no marks.
pub fn run_script(
    python: &str,
    script: &Path,
    args: &[String],
    store: &Store,
) -> Result<ScriptRun> {
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
pub fn measure_train(
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
pub fn measure_dataloader(
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
