//! Warm cache: a loader touching every byte of every sample served from an arena that holds the whole dataset, against the same samples read one by one in the same shuffled order from a private mapping.
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

use granary::{Client, SessionOptions};
use granary_bench::agent::{Agent, AgentSettings};
use granary_bench::cli::Args;
use granary_bench::data;
use granary_bench::loader::{self, Wait};
use granary_bench::report::{Goal, Json};
use granary_bench::sys;
use granary_bench::touch::{gbps, touch, MemRead};
use granary_tools::synth;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The goal: a warm epoch at least 0.95x the same samples read one by one,
/// in the same shuffled order, from a private mapping (`ratio_shuffled`).
const GOAL: Goal = Goal::at_least("goal", 0.95);
/// The loader's wait reports cost at most 2 % of the warm rate.
const WAIT_REPORTS_GOAL: Goal = Goal::at_least("goal_wait_reports", 0.98);

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: bench/run warm [options]
  --files N        files in the synthetic dataset (default 20000)
  --mean-size B    mean file size in bytes (default 110000)
  --epochs N       timed epochs after the warm-up epoch (default 5)
  --batch N        samples per batch (default 32, the client's default)
  --window N       prefetch.window_batches (default 16, the agent's default)
  --ready N        sessions.ready_ring_capacity (default 64)
  --hugepages M    arena.hugepages: try, off or required (default try); the
                   baseline mapping tries 2 MiB pages unless off, and as
                   root both are reserved in /proc/sys/vm/nr_hugepages
  --spin           the loader polls try_next_batch instead of blocking
  --sweep          also run the tuning configurations; report the best
  --reps N         runs of the main configuration (default 3); the median run is reported
  --no-baseline    skip the memory baselines (for profiling the agent alone)
  --crc-compare    after each run of the main configuration, run it again with the
                   loader-side CRC check off (interleaved); report the check's cost
  --wait-compare   after each run of the main configuration, run it again with the
                   loader's wait reports off (interleaved); report their cost";

/// One agent-and-loader configuration.
#[derive(Clone, Copy, Debug)]
struct Knobs {
    batch: u32,
    window: u32,
    ready: u32,
    spin: bool,
    /// The loader checks every sample's CRC-32C (libgranary's default).
    crc: bool,
    /// The loader reports its waits to the agent (libgranary's default).
    waits: bool,
}

impl Knobs {
    fn label(&self) -> String {
        format!(
            "batch {} window {} ready {}{}{}{}",
            self.batch,
            self.window,
            self.ready,
            if self.spin { " spin" } else { "" },
            if self.crc { "" } else { " no-crc-check" },
            if self.waits { "" } else { " no-wait-reports" }
        )
    }
}

/// What one configuration measured.
#[derive(Clone, Debug)]
struct Outcome {
    knobs: Knobs,
    gbps: f64,
    /// The streaming baseline over the same epochs (NaN without baselines).
    memread: f64,
    /// The same samples in the same order, one by one, from the private
    /// mapping, over the same epochs.
    by_sample: f64,
    samples_per_s: f64,
    /// Per timed epoch: granary, memread and by-sample GB/s.
    per_epoch: Vec<(f64, f64, f64)>,
    /// Fraction of the timed span the loader spent inside next_batch.
    waited: f64,
    /// next_batch calls over 100 µs, and the longest.
    long_waits: u64,
    max_wait: Duration,
    /// Engine thread CPU time / timed span.
    engine_busy: f64,
    /// Loader thread CPU time / timed span.
    loader_busy: f64,
    batches_per_s: f64,
    /// The arena got 2 MiB pages.
    hugepages: bool,
}

impl Outcome {
    fn ratio(&self) -> f64 {
        self.gbps / self.memread
    }

    fn ratio_shuffled(&self) -> f64 {
        self.gbps / self.by_sample
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse(
        std::env::args().skip(1),
        &[
            "spin",
            "sweep",
            "no-baseline",
            "crc-compare",
            "wait-compare",
        ],
        USAGE,
    )?;
    let files = args.u64("files", 20_000)?;
    let mean = args.u64("mean-size", 110_000)?;
    let epochs = args.u32("epochs", 5)?.max(1);
    let reps = args.u32("reps", 3)?.max(1);
    let hugepages = args.string("hugepages", "try");
    let main_knobs = Knobs {
        batch: args.u32("batch", granary::DEFAULT_BATCH_SIZE)?,
        window: args.u32("window", 16)?,
        ready: args.u32("ready", 64)?,
        spin: args.flag("spin"),
        crc: true,
        waits: true,
    };

    println!("warm: {}", sys::regime());
    let ds = data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
    let aligned = ds.aligned_bytes(4096);
    // Room for every sample (extents are 4 KiB-aligned), the engine's sample
    // tables (1/64) and its transient reserve (1/16 of the rest, or one
    // prefetch window), with slack; checked after the run (every timed
    // lookup must hit).
    let arena = (aligned + aligned / 8 + (64 << 20)).next_multiple_of(2 << 20);
    println!(
        "dataset: {} files, {:.3} GB ({:.3} GB in 4 KiB extents); arena {:.3} GB",
        ds.len(),
        ds.bytes as f64 / 1e9,
        aligned as f64 / 1e9,
        arena as f64 / 1e9
    );
    let want_huge = hugepages != "off";
    // 2 MiB pages for the arena and the baseline mapping, with slack.
    let huge_need = arena.div_ceil(2 << 20) + aligned.div_ceil(2 << 20) + 8;
    let _reservation = if want_huge && sys::is_root() {
        match sys::HugepageReservation::reserve(huge_need) {
            Ok(r) => {
                println!(
                    "hugepages: nr_hugepages {} -> {} (asked for {huge_need} more; restored at the end)",
                    r.old(),
                    r.now
                );
                Some(r)
            }
            Err(e) => {
                println!("hugepages: WARNING: {e}: nothing reserved");
                None
            }
        }
    } else {
        if want_huge {
            println!("hugepages: not root: nothing reserved (both sides get what the system has)");
        }
        None
    };
    let mem = if args.flag("no-baseline") {
        None
    } else {
        let files: Vec<(&std::path::Path, u64)> = ds
            .catalog
            .entries()
            .iter()
            .map(|e| (e.path.as_path(), e.size))
            .collect();
        let m = MemRead::load(&files, want_huge).map_err(|e| format!("baseline mapping: {e}"))?;
        println!(
            "baseline: a private mapping of {:.3} GB on {}",
            m.bytes() as f64 / 1e9,
            pages(m.hugepages())
        );
        Some(m)
    };

    let mut runs = Vec::new();
    let mut no_crc = Vec::new();
    let mut no_waits = Vec::new();
    for rep in 0..reps {
        let o = measure(&ds, arena, &hugepages, main_knobs, epochs, mem.as_ref())?;
        print_outcome(&format!("run {}/{reps}", rep + 1), &o);
        runs.push(o);
        if args.flag("crc-compare") {
            let k = Knobs {
                crc: false,
                ..main_knobs
            };
            let o = measure(&ds, arena, &hugepages, k, epochs, mem.as_ref())?;
            print_outcome(&format!("run {}/{reps} without the check", rep + 1), &o);
            no_crc.push(o.gbps);
        }
        if args.flag("wait-compare") {
            let k = Knobs {
                waits: false,
                ..main_knobs
            };
            let o = measure(&ds, arena, &hugepages, k, epochs, mem.as_ref())?;
            print_outcome(&format!("run {}/{reps} without wait reports", rep + 1), &o);
            no_waits.push(o.gbps);
        }
    }
    // The median run by ratio_shuffled (by throughput without baselines).
    let key = |o: &Outcome| {
        if mem.is_some() {
            o.ratio_shuffled()
        } else {
            o.gbps
        }
    };
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let main = runs[runs.len() / 2].clone();

    let mut tuned = Vec::new();
    if args.flag("sweep") {
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
            let o = measure(&ds, arena, &hugepages, k, epochs, mem.as_ref())?;
            print_outcome("sweep", &o);
            tuned.push(o);
        }
    }

    let ratios: Vec<f64> = runs.iter().map(Outcome::ratio_shuffled).collect();
    let rs = main.ratio_shuffled();
    let met = GOAL.verdict(rs);
    println!(
        "pages: arena on {}, baseline mapping on {}{}",
        pages(main.hugepages),
        mem.as_ref()
            .map_or("(no baseline)", |m| pages(m.hugepages())),
        if mem
            .as_ref()
            .is_some_and(|m| m.hugepages() != main.hugepages)
        {
            " (WARNING: different page sizes)"
        } else {
            ""
        }
    );
    println!(
        "result: granary {:.2} GB/s vs the same samples in the same shuffled order from a private mapping {:.2} GB/s: ratio_shuffled {rs:.3} (median of {reps} run(s); all: {}) (goal ≥ 0.95: {met})",
        main.gbps,
        main.by_sample,
        fmt_rates(&ratios),
    );
    println!(
        "for reference, a single-core streaming read of the same bytes ({:.2} GB/s): ratio {:.3}",
        main.memread,
        main.ratio()
    );
    let best = tuned
        .iter()
        .chain(std::iter::once(&main))
        .max_by(|a, b| key(a).total_cmp(&key(b)))
        .cloned()
        .unwrap_or_else(|| main.clone());
    if !tuned.is_empty() {
        println!(
            "best configuration: {}: {:.2} GB/s, ratio_shuffled {:.3} (against the streaming read {:.3})",
            best.knobs.label(),
            best.gbps,
            best.ratio_shuffled(),
            best.ratio()
        );
    }
    println!("after: {}", sys::regime());

    no_crc.sort_by(f64::total_cmp);
    let no_crc_median = no_crc.get(no_crc.len() / 2).copied();
    if let Some(n) = no_crc_median {
        let mut with: Vec<f64> = runs.iter().map(|o| o.gbps).collect();
        with.sort_by(f64::total_cmp);
        let w = with[with.len() / 2];
        println!(
            "loader-side CRC check: {w:.2} GB/s with it, {n:.2} GB/s without (medians of {reps} interleaved runs each): {:.3} of the unchecked rate",
            w / n
        );
    }
    no_waits.sort_by(f64::total_cmp);
    let no_waits_median = no_waits.get(no_waits.len() / 2).copied();
    if let Some(n) = no_waits_median {
        let mut with: Vec<f64> = runs.iter().map(|o| o.gbps).collect();
        with.sort_by(f64::total_cmp);
        let w = with[with.len() / 2];
        println!(
            "loader wait reports: {w:.2} GB/s with them, {n:.2} GB/s without (medians of {reps} interleaved runs each): {:.3} of the rate without (goal >= 0.98: {})",
            w / n,
            WAIT_REPORTS_GOAL.verdict(w / n)
        );
    }
    let mut j = Json::bench("warm");
    j.num("granary_gbps", main.gbps, 3)
        .num("memread_gbps", main.memread, 3)
        .num("ratio", main.ratio(), 3)
        .num("samples_per_s", main.samples_per_s, 0)
        .num("memread_by_sample_gbps", main.by_sample, 3)
        .num("ratio_shuffled", rs, 3)
        .goal(&GOAL, rs)
        .str("config", &main.knobs.label())
        .str("arena_pages", pages(main.hugepages))
        .str(
            "baseline_pages",
            mem.as_ref().map_or("none", |m| pages(m.hugepages())),
        );
    if let Some(n) = no_crc_median {
        j.num("no_crc_check_gbps", n, 3);
    }
    if let Some(n) = no_waits_median {
        j.num("no_wait_reports_gbps", n, 3);
    }
    if !tuned.is_empty() {
        j.num("best_gbps", best.gbps, 3)
            .num("best_ratio", best.ratio(), 3)
            .num("best_ratio_shuffled", best.ratio_shuffled(), 3)
            .str("best_config", &best.knobs.label());
    }
    println!("{}", j.line());
    Ok(())
}

fn pages(huge: bool) -> &'static str {
    if huge {
        "2 MiB pages"
    } else {
        "4 KiB pages"
    }
}

fn fmt_rates(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn print_outcome(what: &str, o: &Outcome) {
    println!(
        "{what}: {}, arena on {}: granary {:.2} GB/s, shuffled {:.2} GB/s, memread {:.2} GB/s: \
         ratio_shuffled {:.3} (memread {:.3}); {:.0} samples/s, {:.0} batches/s",
        o.knobs.label(),
        pages(o.hugepages),
        o.gbps,
        o.by_sample,
        o.memread,
        o.ratio_shuffled(),
        o.ratio(),
        o.samples_per_s,
        o.batches_per_s,
    );
    println!(
        "  per epoch (granary/memread/shuffled GB/s): {}",
        o.per_epoch
            .iter()
            .map(|(g, m, b)| format!("{g:.1}/{m:.1}/{b:.1}"))
            .collect::<Vec<_>>()
            .join("  ")
    );
    println!(
        "  loader waited {:.1}% of the time ({} waits over 100 µs, longest {:.2} ms); CPU: engine {:.0}%, loader {:.0}%",
        o.waited * 100.0,
        o.long_waits,
        o.max_wait.as_secs_f64() * 1e3,
        o.engine_busy * 100.0,
        o.loader_busy * 100.0,
    );
    // Time inside next_batch counts as waiting even when the loader's own
    // CPU works there (libgranary's CRC check), so compare the CPU time with
    // the time spent outside it.
    if o.loader_busy < 0.9 * (1.0 - o.waited) {
        println!(
            "  WARNING: the loader ran only {:.0}% of the time it did not wait: other processes took the CPU; this run is not clean",
            o.loader_busy / (1.0 - o.waited).max(1e-9) * 100.0
        );
    }
}

/// Marks taken by the loader at the edges of the timed epochs.
#[derive(Default)]
struct Marks {
    /// Per timed epoch: when its granary part started (after the baselines).
    go: Vec<Instant>,
    /// Per timed epoch: baseline pass durations (streaming, by sample).
    stream: Vec<Duration>,
    by_sample: Vec<Duration>,
    /// CPU time of every thread (and the loader's own, exactly) when each
    /// epoch's granary part started and ended (the end of epoch k is taken
    /// at the first sample of k + 1, before its baselines, or at the very
    /// last sample).
    cpu_go: Vec<(Vec<(String, Duration)>, Duration)>,
    cpu_stop: Vec<(Vec<(String, Duration)>, Duration)>,
}

/// One agent with `k`, one session of `1 + epochs` epochs.
fn measure(
    ds: &data::Dataset,
    arena: u64,
    hugepages: &str,
    k: Knobs,
    epochs: u32,
    mem: Option<&MemRead>,
) -> Result<Outcome> {
    let mut settings = AgentSettings::new(arena, "warm", &ds.spec.root);
    settings.hugepages = hugepages.to_owned();
    settings.window_batches = k.window;
    settings.ready_ring_capacity = k.ready;
    settings.release_ring_capacity = k.ready;
    let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new("warm");
    opts.seed = 42;
    opts.batch_size = k.batch;
    opts.epoch_count = 1 + epochs;
    opts.verify_crc = k.crc;
    opts.report_waits = k.waits;

    let total = ds.len() * u64::from(1 + epochs);
    let mut seen = 0u64;
    let mut epoch = 0u32;
    let mut marks = Marks::default();
    // Per timed epoch: the sample ids in the order they were delivered.
    let mut orders: Vec<Vec<usize>> = Vec::with_capacity(epochs as usize);
    let run = loader::consume(
        &client,
        &opts,
        if k.spin { Wait::Spin } else { Wait::Block },
        |s| {
            if s.epoch == 0 {
                let info = synth::verify_sample(s.bytes)
                    .map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
                if info.file_id != s.id || i64::from(info.class) != i64::from(s.label) {
                    return Err(format!("sample {} carries file {}", s.id, info.file_id));
                }
            } else if s.epoch != epoch {
                // First sample of a timed epoch: close the previous one,
                // run the baselines, start this one.
                epoch = s.epoch;
                if epoch > 1 {
                    marks.cpu_stop.push((sys::thread_cpu(), sys::own_cpu()));
                }
                if let Some(m) = mem {
                    marks.stream.push(m.stream_pass().0);
                    // The previous timed epoch, replayed in its order.
                    if let Some(prev) = orders.last() {
                        marks.by_sample.push(m.sample_pass(prev).0);
                    }
                }
                orders.push(Vec::with_capacity(ds.len() as usize));
                marks.cpu_go.push((sys::thread_cpu(), sys::own_cpu()));
                marks.go.push(Instant::now());
            }
            if s.epoch > 0 {
                if let Some(o) = orders.last_mut() {
                    o.push(s.id as usize);
                }
            }
            seen += 1;
            let x = touch(s.bytes);
            if seen == total {
                marks.cpu_stop.push((sys::thread_cpu(), sys::own_cpu()));
            }
            Ok(x)
        },
    )?;
    if run.epochs.len() != 1 + epochs as usize || marks.go.len() != epochs as usize {
        return Err(format!(
            "{} epochs delivered, {} expected",
            run.epochs.len(),
            1 + epochs
        ));
    }
    for e in &run.epochs {
        if e.samples != ds.len() {
            return Err(format!(
                "epoch {}: {} samples, {} expected",
                e.epoch,
                e.samples,
                ds.len()
            ));
        }
    }
    // The last timed epoch's replay (the agent is idle now).
    if let (Some(m), Some(last)) = (mem, orders.last()) {
        marks.by_sample.push(m.sample_pass(last).0);
    }
    if orders.iter().any(|o| o.len() as u64 != ds.len()) {
        return Err("a timed epoch's recorded order misses samples".into());
    }
    let lookups = agent.epoch_lookups("warm");
    let reads = agent.metrics().reads_submitted.get();
    let cold_timed: u64 = lookups
        .iter()
        .filter(|l| l.epoch > 0)
        .map(|l| l.misses)
        .sum();
    if cold_timed > 0 || reads != ds.len() {
        return Err(format!(
            "the cache was not warm: {cold_timed} misses in the timed epochs, {reads} reads for {} samples",
            ds.len()
        ));
    }
    let hugepages = agent.hugepages();
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;

    let timed = &run.epochs[1..];
    let times: Vec<Duration> = timed
        .iter()
        .zip(&marks.go)
        .map(|(e, go)| e.end.saturating_duration_since(*go))
        .collect();
    let span: Duration = times.iter().sum();
    let secs = span.as_secs_f64().max(1e-9);
    let bytes: u64 = timed.iter().map(|e| e.bytes).sum();
    let samples: u64 = timed.iter().map(|e| e.samples).sum();
    let batches: u64 = timed.iter().map(|e| e.batches).sum();
    let waited: Duration = timed.iter().map(|e| e.waited).sum();
    let pairs = || marks.cpu_go.iter().zip(&marks.cpu_stop);
    let engine_cpu: f64 = pairs()
        .map(|(a, b)| {
            sys::cpu_of(&b.0, "granary-engine")
                .saturating_sub(sys::cpu_of(&a.0, "granary-engine"))
                .as_secs_f64()
        })
        .sum();
    let loader_cpu: f64 = pairs()
        .map(|(a, b)| b.1.saturating_sub(a.1).as_secs_f64())
        .sum();
    let rate_of = |d: &[Duration]| -> f64 {
        if d.is_empty() {
            f64::NAN
        } else {
            gbps(ds.bytes * d.len() as u64, d.iter().sum())
        }
    };
    let per_epoch = timed
        .iter()
        .zip(&times)
        .enumerate()
        .map(|(i, (e, t))| {
            let m = marks.stream.get(i).map_or(f64::NAN, |d| gbps(ds.bytes, *d));
            let b = marks
                .by_sample
                .get(i)
                .map_or(f64::NAN, |d| gbps(ds.bytes, *d));
            (gbps(e.bytes, *t), m, b)
        })
        .collect();
    let warm = &run.epochs[0];
    println!(
        "  warm-up epoch: {:.2} s ({:.2} GB/s, verifying), first batch after {:.1} ms; fold {:016x}",
        warm.elapsed().as_secs_f64(),
        gbps(warm.bytes, warm.elapsed()),
        run.first_batch.as_secs_f64() * 1e3,
        run.fold
    );
    Ok(Outcome {
        knobs: k,
        gbps: gbps(bytes, span),
        memread: rate_of(&marks.stream),
        by_sample: rate_of(&marks.by_sample),
        samples_per_s: samples as f64 / secs,
        per_epoch,
        waited: waited.as_secs_f64() / secs,
        long_waits: timed.iter().map(|e| e.long_waits).sum(),
        max_wait: timed.iter().map(|e| e.max_wait).max().unwrap_or_default(),
        engine_busy: engine_cpu / secs,
        loader_busy: loader_cpu / secs,
        batches_per_s: batches as f64 / secs,
        hugepages,
    })
}
