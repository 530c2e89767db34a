//! `bench/run stall`. GPU stall: how long a training loop whose GPU step is a fixed sleep (or, with `--gpu-step`, a real ResNet-50 step on a GPU) waits for data from S3 (SeaweedFS or the light store behind a delay proxy, 0–200 ms RTT), for Granary and the loaders users pick instead, and the CPU each spends per sample.
//!
//! One run:
//!
//! 1. the synthetic dataset (default 20,000 files of ~110 KB; `--quick`
//!    6,000) is generated once under `bench/.data/`, uploaded into a fresh
//!    SeaweedFS ([`crate::seaweed`], [`crate::s3_data`])
//!    and read back once, or (`--store light`) served with the shards by
//!    the light store ([`crate::light_store`]) in this process;
//!    the delay proxy ([`crate::delay_proxy`]) starts in front of
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
//! `StreamingDataset`) and `webdataset` (tar shards read with `pipe:curl`);
//! with `--decode` only, `dali` (NVIDIA DALI on the CPU: its webdataset
//! reader over the tar shards, its image decoder and resize).
//!
//! `--decode` makes the samples JPEGs, each contender decoding them the
//! way its own docs recommend (`crate::stall_loaders::decoder`:
//! torchvision, PIL or DALI; `granary` reads samples its agent prepared),
//! and adds, at the goal's RTT, two `granary` jobs at once on one
//! agent ([`jobs2`]); `--two-jobs` is another benchmark on the same
//! harness: two C loaders with different steps on one agent, prefetch
//! balanced by time to stall against static windows ([`two_jobs`]).
//!
//! Layout: [`scenario`] (the dataset, the store and its shards, the delay
//! proxy, the contenders), [`measure`] (one run, the calibration, every
//! run interleaved), [`stats`] (a run's figures, the medians, the goals'
//! thresholds), [`report`] (the table, the verdicts, the JSON line),
//! [`jobs2`] and [`two_jobs`]. `bench/src/bin/stall.rs` parses the
//! options.

mod measure;
mod report;
mod scenario;

pub mod jobs2;
pub mod stats;
pub mod two_jobs;

use std::path::PathBuf;
use std::time::Instant;

type Result<T> = std::result::Result<T, String>;

/// Every contender, in the default order (Granary first).
pub use scenario::ALL as CONTENDERS;
pub use scenario::{default_contenders, repo_root};

/// The options of `bench/run stall` (without `--two-jobs`), defaults
/// resolved.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--rtt`: round-trip times in ms.
    pub rtts: Vec<u64>,
    /// `--contenders`: `granary` first.
    pub contenders: Vec<String>,
    /// `--reps`: interleaved runs per contender and RTT.
    pub reps: u64,
    /// `--files`: files in the dataset.
    pub files: u64,
    /// `--mean-size`: their mean size in bytes (not with `--decode`).
    pub mean_size: u64,
    /// `--batch`: samples per batch.
    pub batch: u32,
    /// `--batches`: measured batches per run.
    pub batches: u64,
    /// `--window-s`: the longest measured window.
    pub window_s: f64,
    /// `--warmup-batches`: batches consumed before the window.
    pub warmup: u64,
    /// `--step-ms`: the GPU step (None: calibrated).
    pub step_ms: Option<f64>,
    /// `--gpu-step`: a real step's model (`resnet50` or `tiny`).
    pub gpu_step: Option<String>,
    /// `--store`: `seaweed` or `light`.
    pub store: String,
    /// `--light-threads`: the light store's worker threads.
    pub light_threads: usize,
    /// `--decode`: the side the loaders resize to (0: bytes).
    pub decode: u32,
    /// `--jpeg-side`: the JPEGs' side with `--decode`.
    pub jpeg_side: u32,
    /// Not `--no-jobs2`: with `--decode`, the two-job runs.
    pub with_jobs2: bool,
    /// `--quiet-wait-s`: the wait for a quiet machine before each run.
    pub quiet_s: f64,
    /// `--plot`: where the plot goes (None: no plot).
    pub plot: Option<PathBuf>,
    /// `--python`: the interpreter.
    pub python: String,
}

impl Options {
    /// Whether the two-job runs of `--decode` happen.
    pub fn jobs2(&self) -> bool {
        self.decode > 0 && self.with_jobs2
    }

    /// Refuses what cannot run: an unknown contender, a list that does not
    /// start with `granary`, a store or model that does not exist, a window
    /// that is not positive, a dataset smaller than a run consumes.
    pub fn check(&self) -> Result<()> {
        if self.contenders.first().map(String::as_str) != Some("granary") {
            return Err(
                "--contenders: the list must start with granary (the goal is judged on it)".into(),
            );
        }
        if let Some(bad) = self
            .contenders
            .iter()
            .find(|n| !CONTENDERS.contains(&n.as_str()))
        {
            return Err(format!(
                "--contenders: unknown contender {bad:?} (known: {})",
                CONTENDERS.join(", ")
            ));
        }
        if !["seaweed", "light"].contains(&self.store.as_str()) {
            return Err(format!("--store: {:?} is not seaweed or light", self.store));
        }
        if let Some(d) = self
            .contenders
            .iter()
            .find(|n| self.decode == 0 && crate::stall_loaders::DECODE_ONLY.contains(&n.as_str()))
        {
            return Err(format!("--contenders: {d} runs with --decode only"));
        }
        if let Some(m) = self
            .gpu_step
            .as_deref()
            .filter(|m| !["resnet50", "tiny"].contains(m))
        {
            return Err(format!("--gpu-step: {m:?} is not resnet50 or tiny"));
        }
        if !(self.window_s.is_finite() && self.window_s > 0.0) {
            return Err("--window-s: not a positive number of seconds".into());
        }
        if !(self.quiet_s.is_finite() && self.quiet_s >= 0.0) {
            return Err("--quiet-wait-s: not a number of seconds".into());
        }
        if self.step_ms.is_some_and(|s| !(s.is_finite() && s >= 0.0)) {
            return Err("--step-ms: not a number of ms".into());
        }
        let consumed = (self.warmup + self.batches) * u64::from(self.batch);
        if consumed > self.files && self.decode == 0 {
            return Err(format!(
                "--files {} is smaller than the {consumed} samples a run may consume (warm-up + batches) × batch",
                self.files
            ));
        }
        Ok(())
    }
}

/// Runs the benchmark and prints its JSON line last.
pub fn run(o: &Options) -> Result<()> {
    o.check()?;
    let root = repo_root()?;
    let regime_before = crate::sys::regime();
    println!("stall: {regime_before}");
    println!("stall: CPU {}", crate::sys::cpu_model());
    let t_all = Instant::now();
    let (ctx, contenders) = scenario::setup(o, &root)?;
    let step = measure::step(&ctx, o)?;
    let measured = measure::run_all(&ctx, &contenders, o, step.ms);
    ctx.finish();
    report::report(
        o,
        &root,
        &contenders,
        &measured,
        &step,
        &regime_before,
        t_all,
    )
}

/// `--two-jobs` ([`two_jobs`]): builds the C loader, then runs.
pub fn run_two_jobs(s: &two_jobs::Settings) -> Result<()> {
    let root = repo_root()?;
    let work = std::env::temp_dir().join(format!("granary-stall-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    println!("stall --two-jobs: {}", crate::sys::regime());
    let out = scenario::build_c_loader(&root, &work).and_then(|c| two_jobs::run(s, &c));
    let _ = std::fs::remove_dir_all(&work);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(contenders: &[&str], decode: u32) -> Options {
        Options {
            rtts: vec![100],
            contenders: contenders.iter().map(|s| (*s).to_owned()).collect(),
            reps: 1,
            files: 3000,
            mean_size: 110_000,
            batch: 32,
            batches: 5,
            window_s: 10.0,
            warmup: 5,
            step_ms: Some(40.0),
            gpu_step: None,
            store: "light".into(),
            light_threads: 2,
            decode,
            jpeg_side: 448,
            with_jobs2: false,
            quiet_s: 0.0,
            plot: None,
            python: "python3".into(),
        }
    }

    #[test]
    fn dali_runs_with_decode_only() {
        let err = options(&["granary", "dali"], 0).check().unwrap_err();
        assert!(err.contains("dali runs with --decode only"), "{err}");
        assert!(options(&["granary", "dali"], 224).check().is_ok());
        assert!(options(&["granary", "webdataset"], 0).check().is_ok());
    }
}
