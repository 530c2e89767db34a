//! Cold cache: the first epoch through the agent after dropping the page cache, against equal-depth readers of the same files (a minimal io_uring whole-file reader, buffered and O_DIRECT, and fio).
//!
//! The benchmark is `granary_bench::cold` (`bench/src/cold/`); this binary
//! parses its options.

use std::process::ExitCode;

use clap::Parser;
use granary_bench::cli::num;
use granary_bench::cold::{self, Options};

/// bench/run cold [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run cold", about, long_about = None)]
struct Cli {
    /// Files in the synthetic dataset.
    #[arg(long, default_value_t = 20_000, value_parser = num::<u64>)]
    files: u64,
    /// Mean file size in bytes.
    #[arg(long, default_value_t = 110_000, value_parser = num::<u64>)]
    mean_size: u64,
    /// Runs of each side.
    #[arg(long, default_value_t = 3, value_parser = num::<u32>)]
    reps: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = granary::DEFAULT_BATCH_SIZE, value_parser = num::<u32>)]
    batch: u32,
    /// prefetch.max_inflight_reads, and the depth of every reader (the
    /// agent's default).
    #[arg(long, default_value_t = 256, value_parser = num::<u32>)]
    inflight: u32,
    /// prefetch.window_batches (the agent's default).
    #[arg(long, default_value_t = 16, value_parser = num::<u32>)]
    window: u32,
    /// fio block settings, comma-separated: a size (4k, 128k) or a range
    /// MIN-MAX (unaligned sizes).
    #[arg(long, default_value = "4k,512-128k")]
    fio_bs: String,
    /// The loader reads every byte of every sample.
    #[arg(long)]
    touch: bool,
    /// Also run the agent with other in-flight / window settings.
    #[arg(long)]
    sweep: bool,
    /// Skip fio.
    #[arg(long)]
    no_fio: bool,
    /// Skip the io_uring whole-file reader.
    #[arg(long)]
    no_uring: bool,
    /// Read every file once before each run instead of dropping the page
    /// cache: NOT a cold read (every read is served from the page cache), for
    /// comparing read paths on cached files; the goal is not judged.
    #[arg(long)]
    warm_page_cache: bool,
}

fn main() -> ExitCode {
    let c = Cli::parse();
    let o = Options {
        files: c.files,
        mean_size: c.mean_size,
        reps: c.reps,
        batch: c.batch,
        inflight: c.inflight,
        window: c.window,
        fio_bs: c.fio_bs,
        touch: c.touch,
        sweep: c.sweep,
        no_fio: c.no_fio,
        no_uring: c.no_uring,
        warm_page_cache: c.warm_page_cache,
    };
    match cold::run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cold: {e}");
            ExitCode::FAILURE
        }
    }
}
