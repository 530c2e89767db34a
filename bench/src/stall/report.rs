//! The end of `bench/run stall`: the medians' table, the goals judged at
//! the goal's round-trip time, and the JSON line (with the plot).

use super::jobs2::{self, Jobs2};
use super::measure::{Measured, Step};
use super::scenario::{Contender, Launch};
use super::stats::{self, Cell, Goal, GOAL_RTT_MS};
use super::Options;
use crate::report::{self, Json};
use crate::sys::{self, cpu_model};
use std::path::Path;
use std::time::Instant;

type Result<T> = std::result::Result<T, String>;

/// The medians of every contender's runs, per RTT.
pub(super) type Columns = Vec<(String, Vec<Cell>)>;

/// Prints the table, judges and prints the goals, prints the JSON line
/// (and draws the plot unless `--plot none`).
pub(super) fn report(
    o: &Options,
    root: &Path,
    contenders: &[Contender],
    m: &Measured,
    step: &Step,
    regime_before: &str,
    t_all: Instant,
) -> Result<()> {
    let columns: Columns = contenders
        .iter()
        .zip(&m.runs)
        .map(|(c, per_rtt)| {
            (
                c.name.clone(),
                per_rtt.iter().map(|r| Cell::of(r)).collect(),
            )
        })
        .collect();
    table(o, &columns, step.ms);
    let v = goals(o, &columns, &m.jobs2);
    let regime_after = sys::regime();
    println!("after: {regime_after}");
    let mut j = json(o, &columns, &v, &m.jobs2, step);
    j.str("regime_before", regime_before)
        .str("regime_after", &regime_after)
        .num("total_s", t_all.elapsed().as_secs_f64(), 0)
        .num(
            "granary_cpu_us_per_sample_from_start",
            v.from_start.granary_us,
            1,
        )
        .num(
            "best_contender_cpu_us_per_sample_from_start",
            v.from_start.best.as_ref().map_or(f64::NAN, |b| b.1),
            1,
        )
        .str(
            "best_contender_from_start",
            v.from_start.best.as_ref().map_or("", |b| b.0.as_str()),
        );
    for c in contenders {
        if let Launch::Missing(e) = &c.launch {
            j.str(&format!("{}_not_run", c.name), e);
        }
    }
    let line = j.line();
    if let Some(plot) = &o.plot {
        match report::draw(&o.python, &root.join("bench/stall_plot.py"), &line, plot) {
            Ok(()) => println!("plot: {}", plot.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }
    println!("{line}");
    Ok(())
}

/// The medians' table: one row per RTT, one column per contender.
fn table(o: &Options, columns: &Columns, step_ms: f64) {
    let rtts = &o.rtts;
    println!(
        "\nGPU-idle fraction in the window (median of {} runs; from the start; img/s; loader CPU µs per sample), step {:.2} ms:",
        o.reps,
        step_ms
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
}

/// The goals judged at [`GOAL_RTT_MS`].
struct Verdicts {
    /// On the window's CPU (the goal's measure).
    goal: Goal,
    /// The best contender's idle fraction.
    best_idle: Option<(String, f64)>,
    /// On the CPU from the start (printed beside it).
    from_start: Goal,
}

/// Judges the goals at [`GOAL_RTT_MS`] and prints them, with every other
/// Granary configuration held to the same bar and the contenders' figures.
fn goals(o: &Options, columns: &Columns, jobs2: &Jobs2) -> Verdicts {
    let rtts = &o.rtts;
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
    let best_idle = stats::best_idle(&others);
    if o.decode > 0 {
        // With --decode the idle goal is relative: ≤ 0.5 × the best
        // contender's.
        goal.idle_met = best_idle.as_ref().and_then(|(_, b)| {
            goal.idle
                .is_finite()
                .then_some(goal.idle <= stats::GOAL_DECODE_IDLE_RATIO * b)
        });
        println!(
            "decode goal at {GOAL_RTT_MS} ms: granary idle {:.2} % against the best contender's {} (goal ≤ {}×: {})",
            goal.idle * 100.0,
            best_idle
                .as_ref()
                .map_or("(none measured)".to_owned(), |(n, v)| format!("{:.2} % ({n})", v * 100.0)),
            stats::GOAL_DECODE_IDLE_RATIO,
            stats::verdict(goal.idle_met)
        );
    }
    println!(
        "goal at {GOAL_RTT_MS} ms: granary idle {:.1} % (goal ≤ {:.0} % and ≤ granary_c's {:.1} % + {:.0} point: {}); loader CPU {:.0} µs/sample against the best contender's {} (goal ≤ {}×: {})",
        goal.idle * 100.0,
        stats::GOAL_IDLE * 100.0,
        goal.c_idle * 100.0,
        stats::GOAL_IDLE_OVER_C * 100.0,
        stats::verdict(goal.idle_met),
        goal.granary_us,
        goal.best
            .as_ref()
            .map_or("(none measured)".to_owned(), |(n, v)| format!("{v:.0} µs ({n})")),
        stats::GOAL_CPU_RATIO,
        stats::verdict(goal.cpu_met)
    );
    // The goal is judged on `granary`; the other Granary configurations are
    // held to the same bar and printed beside it, not in its place.
    for (k, (n, _)) in columns.iter().enumerate().skip(1) {
        if n.starts_with("granary") {
            let g = Goal::judge(cell(k), c_cell, &others);
            println!(
                "  {n} at {GOAL_RTT_MS} ms: idle {:.1} % (≤ {:.0} %: {}); CPU {:.0} µs/sample (≤ {}× the best contender: {})",
                g.idle * 100.0,
                stats::GOAL_IDLE * 100.0,
                stats::verdict(g.idle_met),
                g.granary_us,
                stats::GOAL_CPU_RATIO,
                stats::verdict(g.cpu_met)
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
    let from_start = Goal::judge_by(cell(0), c_cell, &others, |c| c.loader_us_from_start);
    println!(
        "CPU from the start at {GOAL_RTT_MS} ms (not the goal's measure): granary {:.0} µs/sample against the best contender's {} (≤ {}×: {})",
        from_start.granary_us,
        from_start
            .best
            .as_ref()
            .map_or("(none measured)".to_owned(), |(n, v)| format!("{v:.0} µs ({n})")),
        stats::GOAL_CPU_RATIO,
        stats::verdict(from_start.cpu_met)
    );
    if o.jobs2() {
        println!(
            "two jobs at {GOAL_RTT_MS} ms: decode CPU {:.0} µs per delivered sample against one job's {:.0} (ratio {:.3}; goal {}: {})",
            jobs2.two_jobs_us,
            jobs2.one_job_us,
            jobs2.ratio,
            jobs2::GOAL.rule(),
            jobs2::GOAL.verdict(jobs2.ratio)
        );
    }
    Verdicts {
        goal,
        best_idle,
        from_start,
    }
}

/// The JSON line's keys from the figures (the caller adds the regime and
/// the from-the-start figures).
fn json(o: &Options, columns: &Columns, v: &Verdicts, jobs2: &Jobs2, step: &Step) -> Json {
    let (goal, best_idle) = (&v.goal, &v.best_idle);
    let mut j = stats::summary_json(&o.rtts, columns, goal);
    j.num(
        "best_contender_idle",
        best_idle.as_ref().map_or(f64::NAN, |b| b.1),
        4,
    )
    .num("decode", f64::from(o.decode), 0)
    .num("jobs2_decode_cpu_ratio", jobs2.ratio, 3)
    .num("granary_decode_cpu_us_per_sample", jobs2.one_job_us, 1)
    .num("jobs2_decode_cpu_us_per_sample", jobs2.two_jobs_us, 1);
    if o.jobs2() {
        j.goal(&jobs2::GOAL, jobs2.ratio);
    }
    j.str("store", &o.store)
        .str("gpu_step", o.gpu_step.as_deref().unwrap_or("sleep"))
        .num("step_ms", step.ms, 3)
        .num("local_disk_img_per_s", step.local_rate, 0)
        .num("local_disk_idle_at_step", step.local_idle, 4)
        .int("batch", u64::from(o.batch))
        .int("reps", o.reps)
        .int("batches_per_run", o.batches)
        .num("window_s", o.window_s, 1)
        .int("files", o.files)
        .int("mean_size", o.mean_size)
        .str("cpu_model", &cpu_model())
        .int("cpus", crate::cpu::online_cpus() as u64);
    j
}
