//! `bench/run warm`. Warm cache: a loader touching every byte of every sample served from an arena that holds the whole dataset, against the same samples read one by one in the same shuffled order from a private mapping.
//!
//! One run:
//!
//! 1. the synthetic dataset (default 20,000 files, ~110 KB each, ~2.2 GB)
//!    is generated once under `bench/.data/`;
//! 2. as root, 2 MiB huge pages are reserved for the agent's arena and the
//!    baseline (`/proc/sys/vm/nr_hugepages` raised, the old value written
//!    back at the end); the dataset's bytes are copied into a private
//!    anonymous mapping (`MAP_PRIVATE`, 2 MiB pages when the reservation
//!    holds, else 4 KiB pages), laid out like the arena (4 KiB-aligned
//!    samples); the page size of the arena and of the mapping are printed;
//! 3. an in-process agent starts with an arena sized to hold every sample;
//!    a session of `1 + --epochs` epochs opens; epoch 1 fills the arena
//!    (and faults the loader's mapping in) while every sample is verified
//!    byte for byte; epochs 2.. are timed, the loader XORing every 8-byte
//!    word of every sample in place ([`granary_bench::touch::touch`]) and
//!    recording the order the samples came in;
//! 4. at the start of every timed epoch the loader pauses and runs the
//!    memory baselines with the same loop, so both sides see the same
//!    machine from minute to minute: the previous timed epoch's samples,
//!    one by one in the order Granary delivered them, from the private
//!    mapping (`shuffled`; the last epoch's replay runs after the session),
//!    and one streaming pass over the dataset's number of bytes
//!    (`memread`, a bound no shuffled reader reaches, for reference).
//!
//! `granary_gbps` = bytes of the timed epochs / their time, each epoch timed
//! from the end of its baseline passes to the release of its last batch;
//! `ratio_shuffled` = `granary_gbps` / the replays' rate (goal ≥ 0.95).
//! The agent keeps working during the pause, so an epoch may start with up
//! to a window of batches ready; that helps only when the loader would have
//! waited, and the loader's waiting time is reported. The cache is checked
//! to have been warm: every lookup of the timed epochs must be a hit and
//! the source read once per sample.
//!
//! `--sweep` repeats step 3 for the knobs that trade per-batch overhead
//! (batch size, window, ready ring capacity, a spinning loader) and reports
//! the best configuration next to the default one.
//!
//! Layout: [`scenario`] (the dataset, the hugepages and the baseline
//! mapping), [`measure`] (one agent configuration, one session),
//! [`report`] (what is printed and the result line); `bin/warm.rs` parses
//! the options.

pub mod measure;
pub mod report;
pub mod scenario;

use crate::report::Goal;
use crate::sys;
use measure::{Knobs, Outcome};
use scenario::Scenario;

type Result<T> = std::result::Result<T, String>;

/// The goal: a warm epoch at least 0.95x the same samples read one by one,
/// in the same shuffled order, from a private mapping (`ratio_shuffled`).
pub const GOAL: Goal = Goal::at_least("goal", 0.95);
/// The loader's wait reports cost at most 2 % of the warm rate.
pub const WAIT_REPORTS_GOAL: Goal = Goal::at_least("goal_wait_reports", 0.98);

/// The benchmark's options (`bench/run warm --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 20_000)]
    pub files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000)]
    pub mean_size: u64,
    /// Timed epochs after the warm-up epoch.
    #[arg(long, default_value_t = 5)]
    pub epochs: u32,
    /// Samples per batch (the client's default).
    #[arg(long, default_value_t = granary::DEFAULT_BATCH_SIZE)]
    pub batch: u32,
    /// prefetch.window_batches (the agent's default).
    #[arg(long, default_value_t = 16)]
    pub window: u32,
    /// sessions.ready_ring_capacity.
    #[arg(long, default_value_t = 64)]
    pub ready: u32,
    /// arena.hugepages: try, off or required; the baseline mapping tries 2 MiB
    /// pages unless off, and as root both are reserved in nr_hugepages.
    #[arg(long, default_value = "try")]
    pub hugepages: String,
    /// The loader polls try_next_batch instead of blocking.
    #[arg(long)]
    pub spin: bool,
    /// Also run the tuning configurations; report the best.
    #[arg(long)]
    pub sweep: bool,
    /// Runs of the main configuration; the median run is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Skip the memory baselines (for profiling the agent alone).
    #[arg(long)]
    pub no_baseline: bool,
    /// After each run, run it again with the loader-side full CRC check on
    /// (verify_crc; off by default).
    #[arg(long)]
    pub crc_compare: bool,
    /// After each run, run it again with the loader's wait reports off.
    #[arg(long)]
    pub wait_compare: bool,
}

/// What ranks runs: `ratio_shuffled`, or the throughput without baselines.
fn rank_key(o: &Outcome, with_baseline: bool) -> f64 {
    if with_baseline {
        o.ratio_shuffled()
    } else {
        o.gbps
    }
}

/// Runs the benchmark; prints the result line last.
pub fn run(options: &Options) -> Result<()> {
    let (epochs, reps) = (options.epochs.max(1), options.reps.max(1));
    let opts = &Options {
        epochs,
        reps,
        ..options.clone()
    };
    let main_knobs = Knobs {
        batch: opts.batch,
        window: opts.window,
        ready: opts.ready,
        spin: opts.spin,
        crc: false,
        waits: true,
    };
    println!("warm: {}", sys::regime());
    let sc = Scenario::prepare(opts)?;
    // The comparisons asked for, each run after every main run: whether it
    // is, its knobs and how its runs are named.
    let variants = [
        (
            opts.crc_compare,
            Knobs {
                crc: true,
                ..main_knobs
            },
            "with the full check",
        ),
        (
            opts.wait_compare,
            Knobs {
                waits: false,
                ..main_knobs
            },
            "without wait reports",
        ),
    ];
    let mut runs = Vec::new();
    let mut variant_gbps: [Vec<f64>; 2] = Default::default();
    for rep in 0..reps {
        let o = sc.measure(main_knobs)?;
        report::print_outcome(&format!("run {}/{reps}", rep + 1), &o);
        runs.push(o);
        for (&(on, k, what), gbps) in variants.iter().zip(&mut variant_gbps) {
            if on {
                let o = sc.measure(k)?;
                report::print_outcome(&format!("run {}/{reps} {what}", rep + 1), &o);
                gbps.push(o.gbps);
            }
        }
    }
    let [full_crc, no_waits] = variant_gbps;
    // The median run by ratio_shuffled (by throughput without baselines).
    let key = |x: &Outcome| rank_key(x, sc.mem.is_some());
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let main = runs[runs.len() / 2].clone();

    let mut tuned = Vec::new();
    if opts.sweep {
        let grid = [
            Knobs {
                batch: 128,
                ..main_knobs
            },
            Knobs {
                batch: 256,
                ..main_knobs
            },
            Knobs {
                window: 64,
                ready: 256,
                ..main_knobs
            },
            Knobs {
                batch: 256,
                window: 64,
                ready: 256,
                ..main_knobs
            },
            Knobs {
                spin: true,
                ..main_knobs
            },
            Knobs {
                batch: 256,
                window: 64,
                ready: 256,
                spin: true,
                ..main_knobs
            },
        ];
        for k in grid {
            let o = sc.measure(k)?;
            report::print_outcome("sweep", &o);
            tuned.push(o);
        }
    }

    let line = report::Summary {
        scenario: &sc,
        reps,
        runs: &runs,
        main: &main,
        tuned: &tuned,
        full_crc,
        no_waits,
    }
    .print();
    println!("{}", line.line());
    Ok(())
}
