//! `bench/run policy`. Cache policies through the real agent: hit rate per epoch for clairvoyant, MinIO and LRU on a dataset twice the arena, next to the simulator's prediction.
//!
//! The synthetic dataset (default 4,000 files of ~50 KB, log-normal sizes)
//! is served by an in-process agent whose arena is half the dataset's
//! bytes. For each policy a fresh agent runs one session (seed 42, batches
//! of 32) for 4 epochs; the loader verifies every byte of every sample.
//! The hit rate of each epoch is read from the agent's
//! `granary_epoch_lookups_total{dataset,epoch,result}` (a hit: the sample
//! was in the arena, or already being read, when the fetcher needed it).
//!
//! The simulator (`granary_agent::cache::sim`) replays the same session
//! against a cache configured as the engine configures its own (the arena
//! less the sample-table area, the same alignment and transient reserve)
//! and its per-epoch hit rates are printed beside the measured ones.
//!
//! Goal: clairvoyant ≥ MinIO > LRU in every epoch after the first.
//!
//! Layout: [`scenario`] (the dataset, the arena, the session's plan),
//! [`measure`] (one policy through a fresh agent and through the
//! simulator), [`report`] (each policy's lines, the goal, the result
//! line); `bin/policy.rs` parses the options.

pub mod measure;
pub mod report;
pub mod scenario;

use granary_agent::cache::PolicyKind;

use crate::cli::num;
use crate::sys;
use scenario::Scenario;

type Result<T> = std::result::Result<T, String>;

/// The benchmark's options (`bench/run policy --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 4_000, value_parser = num::<u64>)]
    pub files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 50_000, value_parser = num::<u64>)]
    pub mean_size: u64,
    /// Epochs per session (at least 1).
    #[arg(long, default_value_t = 4, value_parser = num::<u32>)]
    pub epochs: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = granary::DEFAULT_BATCH_SIZE, value_parser = num::<u32>)]
    pub batch: u32,
    /// prefetch.window_batches.
    #[arg(long, default_value_t = 16, value_parser = num::<u32>)]
    pub window: u32,
    /// sessions.ready_ring_capacity.
    #[arg(long, default_value_t = 64, value_parser = num::<u32>)]
    pub ready: u32,
    /// prefetch.max_inflight_reads (the configuration allows 1 per MiB of
    /// arena).
    #[arg(long, default_value_t = 64, value_parser = num::<u32>)]
    pub inflight: u32,
    /// The session's shuffle seed.
    #[arg(long, default_value_t = 42, value_parser = num::<u64>)]
    pub seed: u64,
}

impl Options {
    /// The epochs, at least one and no more than the agent counts.
    fn epochs(&self) -> Result<u32> {
        let epochs = self.epochs.max(1);
        if epochs as usize > granary_agent::metrics::EPOCH_SLOTS {
            return Err(format!(
                "--epochs {epochs}: the agent keeps per-epoch counters for {} epochs only",
                granary_agent::metrics::EPOCH_SLOTS
            ));
        }
        Ok(epochs)
    }
}

/// Runs the benchmark; prints the result line last.
pub fn run(options: &Options) -> Result<()> {
    let o = &Options {
        epochs: options.epochs()?,
        ..options.clone()
    };
    println!("policy: {}", sys::regime());
    let sc = Scenario::prepare(o)?;
    let mut runs = Vec::new();
    for policy in PolicyKind::ALL {
        let run = measure::policy(&sc, o, policy)?;
        if policy == PolicyKind::Clairvoyant {
            report::print_cache(&run);
        }
        report::print_run(&run);
        runs.push(run);
    }
    report::print_goal(&runs, o.epochs);
    println!("after: {}", sys::regime());
    println!("{}", report::line(&runs).line());
    Ok(())
}
