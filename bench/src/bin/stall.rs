//! GPU stall: how long a training loop waits for data from S3 for Granary and the loaders users pick instead, and the CPU each spends per sample.
//!
//! The benchmark is `granary_bench::stall` (`bench/src/stall/`); this
//! binary parses its options.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use granary_bench::stall::{self, two_jobs, Options};

/// bench/run stall [options]. Defaults in brackets are those of --quick
/// and of --two-jobs where they differ.
#[derive(Parser, Debug)]
#[command(name = "bench/run stall", about, long_about = None)]
struct Cli {
    /// A short run: 6,000 files, 150 batches or 12 s per window, 2 repetitions.
    #[arg(long)]
    quick: bool,
    /// Round-trip times in ms, comma-separated [0,10,50,100,200; --two-jobs 100].
    #[arg(long, value_delimiter = ',')]
    rtt: Option<Vec<u64>>,
    /// Contenders, comma-separated, granary first [every one but granary_w0; dali with --decode only].
    #[arg(long, value_delimiter = ',')]
    contenders: Option<Vec<String>>,
    /// Interleaved runs per contender and RTT [3; --quick 2; --two-jobs 2].
    #[arg(long)]
    reps: Option<u64>,
    /// Files in the synthetic dataset [20000; --quick 6000; --two-jobs 32000].
    #[arg(long)]
    files: Option<u64>,
    /// Mean file size in bytes [110000; --two-jobs 8000].
    #[arg(long)]
    mean_size: Option<u64>,
    /// Samples per batch, every contender.
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// Measured batches per run [400; --quick 150].
    #[arg(long)]
    batches: Option<u64>,
    /// Longest measured window in s [30; --quick 12; --two-jobs 20].
    #[arg(long)]
    window_s: Option<f64>,
    /// Batches consumed before the window.
    #[arg(long, default_value_t = 5)]
    warmup_batches: u64,
    /// The GPU step in ms [calibrated on the local-disk loader; --two-jobs 160].
    #[arg(long)]
    step_ms: Option<f64>,
    /// A real step instead of the sleep: resnet50 (on CUDA when present) or tiny.
    #[arg(long)]
    gpu_step: Option<String>,
    /// seaweed, or light (the light store in this process).
    #[arg(long, default_value = "seaweed")]
    store: String,
    /// The light store's worker threads.
    #[arg(long, default_value_t = 2)]
    light_threads: usize,
    /// Samples are JPEGs every loader decodes and resizes to SIDE x SIDE; the
    /// window starts after one epoch; at 100 ms also two granary jobs at once.
    #[arg(long, default_value_t = 0, value_name = "SIDE")]
    decode: u32,
    /// The JPEGs' side with --decode.
    #[arg(long, default_value_t = 448)]
    jpeg_side: u32,
    /// With --decode: leave the two-job runs out.
    #[arg(long)]
    no_jobs2: bool,
    /// Before each run, wait up to S s for the machine to be quiet.
    #[arg(long, default_value_t = 5.0)]
    quiet_wait_s: f64,
    /// Where the plot goes [docs/stall.png]; `none`: no plot.
    #[arg(long)]
    plot: Option<String>,
    /// The Python interpreter [$PYTHON, else python3].
    #[arg(long)]
    python: Option<String>,
    /// Two jobs (C loaders, steps --step-ms and half of it) on one agent,
    /// prefetch.balance = stall against static.
    #[arg(long)]
    two_jobs: bool,
    /// --two-jobs: the agent's prefetch.max_inflight_reads.
    #[arg(long, default_value_t = 80)]
    max_inflight: u32,
    /// --two-jobs: the agent's prefetch.window_batches.
    #[arg(long, default_value_t = 64)]
    window_batches: u32,
}

fn main() -> ExitCode {
    let c = Cli::parse();
    let out = if c.two_jobs {
        two_jobs_settings(c).and_then(|s| stall::run_two_jobs(&s))
    } else {
        stall::repo_root().and_then(|root| stall::run(&options(c, root)))
    };
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stall: {e}");
            ExitCode::FAILURE
        }
    }
}

fn options(c: Cli, root: PathBuf) -> Options {
    let q = |full: u64, short: u64| if c.quick { short } else { full };
    let default_contenders = stall::default_contenders(c.decode)
        .iter()
        .map(|s| s.to_string())
        .collect();
    Options {
        rtts: c.rtt.unwrap_or_else(|| vec![0, 10, 50, 100, 200]),
        contenders: c.contenders.unwrap_or(default_contenders),
        reps: c.reps.unwrap_or(q(3, 2)).max(1),
        files: c.files.unwrap_or(q(20_000, 6_000)),
        mean_size: c.mean_size.unwrap_or(110_000),
        batch: c.batch.max(1),
        batches: c.batches.unwrap_or(q(400, 150)).max(1),
        window_s: c.window_s.unwrap_or(if c.quick { 12.0 } else { 30.0 }),
        warmup: c.warmup_batches,
        step_ms: c.step_ms,
        gpu_step: c.gpu_step,
        store: c.store,
        light_threads: c.light_threads.max(1),
        decode: c.decode,
        jpeg_side: c.jpeg_side,
        with_jobs2: !c.no_jobs2,
        quiet_s: c.quiet_wait_s,
        plot: match c.plot.as_deref() {
            None | Some("") => Some(root.join("docs/stall.png")),
            Some("none") => None,
            Some(p) => Some(PathBuf::from(p)),
        },
        python: c
            .python
            .or_else(|| std::env::var("PYTHON").ok())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".to_owned()),
    }
}

fn two_jobs_settings(c: Cli) -> Result<two_jobs::Settings, String> {
    let d = two_jobs::Settings::default();
    let positive = |name: &str, v: Option<f64>, default: f64| match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        Some(x) => Err(format!("--{name}: {x} is not a positive number")),
    };
    Ok(two_jobs::Settings {
        files: c.files.unwrap_or(d.files),
        mean_size: c.mean_size.unwrap_or(d.mean_size),
        batch: c.batch.max(1),
        step_ms: positive("step-ms", c.step_ms, d.step_ms)?,
        window_s: positive("window-s", c.window_s, d.window_s)?,
        reps: c.reps.unwrap_or(d.reps).max(1),
        max_inflight: c.max_inflight.max(1),
        window_batches: c.window_batches.max(1),
        rtt_ms: c.rtt.and_then(|r| r.first().copied()).unwrap_or(d.rtt_ms),
    })
}
