//! `bench/run cold`. Cold cache: the first epoch through the agent after dropping the page cache, against equal-depth readers of the same files (a minimal io_uring whole-file reader, buffered and O_DIRECT, and fio).
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
//!    * `uring`: a minimal io_uring reader ([`crate::uring_read`]),
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
//! median (with its defaults) over the best reader's median (goal
//! ≥ 0.95); `granary-direct` is reported beside it, against `uring-direct`. `--sweep` also runs
//! the agent with other `prefetch.max_inflight_reads` and window settings.
//!
//! Layout: [`scenario`] (the dataset, the readers, a cold page cache),
//! [`measure`] (one run of one side), [`report`] (what is printed and the
//! result line); `bin/cold.rs` parses the options.

pub mod measure;
pub mod report;
pub mod scenario;

use crate::cli::num;
use crate::report::{median, Goal};
use crate::sys;
use measure::Knobs;
use report::{Rates, Summary};
use scenario::{Reader, Scenario};

type Result<T> = std::result::Result<T, String>;

/// The goal: at least 0.95x the best reader that keeps as many reads in
/// flight (`ratio_equal_depth`).
pub const GOAL: Goal = Goal::at_least("goal", 0.95);

/// The benchmark's options (`bench/run cold --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 20_000, value_parser = num::<u64>)]
    pub files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000, value_parser = num::<u64>)]
    pub mean_size: u64,
    /// Runs of each side.
    #[arg(long, default_value_t = 3, value_parser = num::<u32>)]
    pub reps: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = granary::DEFAULT_BATCH_SIZE, value_parser = num::<u32>)]
    pub batch: u32,
    /// prefetch.max_inflight_reads, and the depth of every reader (the
    /// agent's default).
    #[arg(long, default_value_t = 256, value_parser = num::<u32>)]
    pub inflight: u32,
    /// prefetch.window_batches (the agent's default).
    #[arg(long, default_value_t = 16, value_parser = num::<u32>)]
    pub window: u32,
    /// fio block settings, comma-separated: a size (4k, 128k) or a range
    /// MIN-MAX (unaligned sizes).
    #[arg(long, default_value = "4k,512-128k")]
    pub fio_bs: String,
    /// The loader reads every byte of every sample.
    #[arg(long)]
    pub touch: bool,
    /// Also run the agent with other in-flight / window settings.
    #[arg(long)]
    pub sweep: bool,
    /// Skip fio.
    #[arg(long)]
    pub no_fio: bool,
    /// Skip the io_uring whole-file reader.
    #[arg(long)]
    pub no_uring: bool,
    /// Read every file once before each run instead of dropping the page
    /// cache: NOT a cold read (every read is served from the page cache), for
    /// comparing read paths on cached files; the goal is not judged.
    #[arg(long)]
    pub warm_page_cache: bool,
}

/// One side of a repetition.
#[derive(Clone, Copy)]
enum Side {
    /// The agent, with `direct_io` or not.
    Agent { direct: bool },
    /// `readers[i]`.
    Reader(usize),
}

/// Runs one side once, printing it and recording its rate.
fn run_side(sc: &Scenario, o: &Options, side: Side, run: &str, rates: &mut Rates) -> Result<()> {
    let knobs = main_knobs(o);
    match side {
        Side::Agent { direct } => {
            let r = measure::granary_epoch(sc, Knobs { direct, ..knobs }, o.touch)?;
            let name = if direct { "granary-direct" } else { "granary" };
            println!("{name} ({run}): {}", r.describe());
            if direct {
                rates.direct.push(r.files_per_s);
            } else {
                rates.granary.push(r.files_per_s);
            }
        }
        Side::Reader(i) => {
            let reader = &sc.readers[i];
            let (rate, wall) = match reader {
                Reader::Fio(bs) => {
                    let r = measure::fio_run(sc, bs)?;
                    println!("{} ({run}): {}", reader.name(), r.describe());
                    (r.files_per_s, Some(r.wall_files_per_s))
                }
                Reader::Uring { direct } => {
                    let r = measure::uring_run(sc, *direct)?;
                    println!("{} ({run}): {}", reader.name(), r.describe());
                    (r.files_per_s, None)
                }
            };
            rates.readers[i].push(rate);
            rates.wall[i].extend(wall);
        }
    }
    Ok(())
}

fn main_knobs(o: &Options) -> Knobs {
    Knobs {
        batch: o.batch,
        inflight: o.inflight,
        window: o.window,
        direct: false,
    }
}

/// `--sweep`: the agent with other in-flight and window settings; the best
/// of them and the main configuration.
fn sweep(sc: &Scenario, o: &Options, main: f64) -> Result<(Knobs, f64)> {
    let knobs = main_knobs(o);
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
    let mut best = (knobs, main);
    for k in grid {
        let r = measure::granary_epoch(sc, k, o.touch)?;
        println!("granary (sweep): {}", r.describe());
        if r.files_per_s > best.1 {
            best = (k, r.files_per_s);
        }
    }
    Ok(best)
}

/// Runs the benchmark; prints the result line last.
pub fn run(options: &Options) -> Result<()> {
    let o = &Options {
        reps: options.reps.max(1),
        ..options.clone()
    };
    println!("cold: {}", sys::regime());
    let sc = Scenario::prepare(o)?;
    let n = sc.readers.len();
    let mut rates = Rates {
        readers: vec![Vec::new(); n],
        wall: vec![Vec::new(); n],
        ..Rates::default()
    };
    for rep in 0..o.reps {
        // A B C … then … C B A: every side sees both ends of the repetition.
        let mut order: Vec<Side> = [false, true]
            .map(|direct| Side::Agent { direct })
            .into_iter()
            .chain((0..n).map(Side::Reader))
            .collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        let run = format!("run {}/{}", rep + 1, o.reps);
        for side in order {
            run_side(&sc, o, side, &run, &mut rates)?;
        }
    }
    let best = match o.sweep {
        true => Some(sweep(&sc, o, median(&rates.granary))?),
        false => None,
    };
    let line = Summary {
        scenario: &sc,
        knobs: main_knobs(o),
        rates: &rates,
        best,
    }
    .print();
    println!("{}", line.line());
    Ok(())
}
