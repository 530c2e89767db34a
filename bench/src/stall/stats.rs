//! The figures of `bench/run stall`: one measured run of one contender,
//! the medians over its interleaved repetitions, the goal, and the last
//! line's JSON object.

use crate::report::{json_num, median, Json};

/// Granary's GPU-idle fraction at 100 ms must be at most this (issue 26;
/// the earlier goal was 5 %).
pub const GOAL_IDLE: f64 = 0.02;
/// ... and at most the C loader's (`granary_c`) plus this.
pub const GOAL_IDLE_OVER_C: f64 = 0.01;
/// With `--decode`: Granary's idle fraction must be at most this times the
/// best contender's.
pub const GOAL_DECODE_IDLE_RATIO: f64 = 0.5;
/// The local-disk loader that sets the step is kept at most this idle.
pub const CALIBRATION_IDLE: f64 = 0.05;
/// Granary's loader CPU per sample must be at most this times the best
/// contender's.
pub const GOAL_CPU_RATIO: f64 = 0.5;
/// The round-trip time the goal is judged at.
pub const GOAL_RTT_MS: u64 = 100;

/// One run of one contender at one round-trip time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    /// Time the training loop waited for data / the window's wall time.
    pub idle: f64,
    /// Samples delivered to the loop per second of the window.
    pub img_per_s: f64,
    /// Median and 99th percentile of the per-batch wait, in ms.
    pub wait_p50_ms: f64,
    /// See [`Run::wait_p50_ms`].
    pub wait_p99_ms: f64,
    /// Samples delivered in the window.
    pub samples: u64,
    /// From the loader's start to its first batch, in s.
    pub first_batch_s: f64,
    /// The idle fraction from the loader's start (and, for Granary, the
    /// agent's) to the window's end: start-up, warm-up and window.
    pub idle_from_start: f64,
    /// CPU seconds over the window: the loader's processes (the training
    /// process, its DataLoader workers and their threads).
    pub client_cpu_s: f64,
    /// CPU seconds of the Granary agent (0 for the other contenders).
    pub agent_cpu_s: f64,
    /// CPU seconds of the delay proxy.
    pub proxy_cpu_s: f64,
    /// CPU seconds of the store (SeaweedFS).
    pub store_cpu_s: f64,
    /// Cores busy on the machine outside all of the above.
    pub others_cores: f64,
    /// CPU seconds of the loader's processes and the agent from the start
    /// (the agent's start, the loader's launch: imports, listing, a shard
    /// reader's downloads before its first batch) to the window's end.
    pub cpu_from_start_s: f64,
    /// Samples delivered from the start to the window's end (warm-up
    /// batches and window).
    pub samples_from_start: u64,
    /// CPU seconds of the agent's prepare workers from its start to the
    /// window's end (`--decode`, `granary`; 0 otherwise).
    pub prep_cpu_s: f64,
    /// With a real GPU step (`--gpu-step`): the step's mean time in ms,
    /// measured by the loop (NaN with the sleep).
    pub gpu_step_ms: f64,
    /// Why the run failed, if it did.
    pub error: Option<String>,
}

impl Run {
    /// A failed run.
    pub fn failed(e: String) -> Run {
        Run {
            idle: f64::NAN,
            img_per_s: f64::NAN,
            wait_p50_ms: f64::NAN,
            wait_p99_ms: f64::NAN,
            first_batch_s: f64::NAN,
            idle_from_start: f64::NAN,
            gpu_step_ms: f64::NAN,
            error: Some(e),
            ..Run::default()
        }
    }

    /// The timing fields of a loader's JSON line (`idle`, `img_per_s`,
    /// `wait_p50_ms`, `wait_p99_ms`, `samples`, `first_batch_s`, and
    /// `busy_s` and `run_s`, the GPU's stepping time and the loader's whole
    /// run); `setup_s` is start-up the loader did not see (the agent's),
    /// added to its run for [`Run::idle_from_start`]. CPU fields stay zero.
    /// An error when a field is missing.
    pub fn from_loader_line(line: &str, setup_s: f64) -> Result<Run, String> {
        let get = |k: &str| json_num(line, k).ok_or_else(|| format!("no number {k:?} in {line}"));
        let samples = get("samples")?;
        if samples < 1.0 {
            return Err(format!("no sample delivered in the window: {line}"));
        }
        Ok(Run {
            idle: get("idle")?,
            img_per_s: get("img_per_s")?,
            wait_p50_ms: get("wait_p50_ms")?,
            wait_p99_ms: get("wait_p99_ms")?,
            samples: samples as u64,
            first_batch_s: json_num(line, "first_batch_s").unwrap_or(f64::NAN),
            idle_from_start: 1.0 - get("busy_s")? / (get("run_s")? + setup_s).max(1e-9),
            gpu_step_ms: json_num(line, "gpu_step_ms").unwrap_or(f64::NAN),
            ..Run::default()
        })
    }

    fn per_sample_us(&self, cpu_s: f64) -> f64 {
        if self.error.is_some() || self.samples == 0 {
            f64::NAN
        } else {
            cpu_s / self.samples as f64 * 1e6
        }
    }

    /// CPU µs per delivered sample of the loader itself: its processes and,
    /// for Granary, the agent.
    pub fn loader_us(&self) -> f64 {
        self.per_sample_us(self.client_cpu_s + self.agent_cpu_s)
    }

    /// Loader CPU µs per sample delivered, from the start
    /// ([`Run::cpu_from_start_s`]).
    pub fn loader_us_from_start(&self) -> f64 {
        if self.error.is_some() || self.samples_from_start == 0 {
            f64::NAN
        } else {
            self.cpu_from_start_s / self.samples_from_start as f64 * 1e6
        }
    }

    /// CPU µs per delivered sample of the proxy.
    pub fn proxy_us(&self) -> f64 {
        self.per_sample_us(self.proxy_cpu_s)
    }

    /// CPU µs per delivered sample of the store.
    pub fn store_us(&self) -> f64 {
        self.per_sample_us(self.store_cpu_s)
    }
}

/// The medians of a contender's runs at one round-trip time (failed runs
/// left out; every field NaN when all failed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cell {
    /// Runs that succeeded, and all runs.
    pub ok: usize,
    /// See [`Cell::ok`].
    pub runs: usize,
    /// Median GPU-idle fraction.
    pub idle: f64,
    /// Median [`Run::idle_from_start`].
    pub idle_from_start: f64,
    /// Median samples/s.
    pub img_per_s: f64,
    /// Median of the runs' median batch waits, ms.
    pub wait_p50_ms: f64,
    /// Median of the runs' 99th-percentile batch waits, ms.
    pub wait_p99_ms: f64,
    /// Median loader CPU µs per sample ([`Run::loader_us`]).
    pub loader_us: f64,
    /// Median agent CPU µs per sample (part of `loader_us`).
    pub agent_us: f64,
    /// Median [`Run::loader_us_from_start`].
    pub loader_us_from_start: f64,
    /// Median proxy CPU µs per sample.
    pub proxy_us: f64,
    /// Median store CPU µs per sample.
    pub store_us: f64,
    /// The GPU step's time (`--gpu-step`; NaN with the sleep).
    pub gpu_step_ms: f64,
    /// The first error, if any run failed.
    pub error: Option<String>,
}

impl Cell {
    /// Medians over `runs`.
    pub fn of(runs: &[Run]) -> Cell {
        let good: Vec<&Run> = runs.iter().filter(|r| r.error.is_none()).collect();
        let m = |f: &dyn Fn(&Run) -> f64| median(&good.iter().map(|r| f(r)).collect::<Vec<_>>());
        Cell {
            ok: good.len(),
            runs: runs.len(),
            idle: m(&|r| r.idle),
            idle_from_start: m(&|r| r.idle_from_start),
            img_per_s: m(&|r| r.img_per_s),
            wait_p50_ms: m(&|r| r.wait_p50_ms),
            wait_p99_ms: m(&|r| r.wait_p99_ms),
            loader_us: m(&|r| r.loader_us()),
            agent_us: m(&|r| r.per_sample_us(r.agent_cpu_s)),
            loader_us_from_start: m(&|r| r.loader_us_from_start()),
            proxy_us: m(&|r| r.proxy_us()),
            store_us: m(&|r| r.store_us()),
            gpu_step_ms: m(&|r| r.gpu_step_ms),
            error: runs.iter().find_map(|r| r.error.clone()),
        }
    }
}

/// The goal at [`GOAL_RTT_MS`], judged from the cells of that round-trip
/// time.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    /// Granary's idle fraction and whether it is at most [`GOAL_IDLE`] and
    /// at most the C loader's + [`GOAL_IDLE_OVER_C`] (`None`: not measured).
    pub idle: f64,
    /// The C loader's idle fraction (NaN: not measured, and then the idle
    /// goal is judged on [`GOAL_IDLE`] alone).
    pub c_idle: f64,
    /// See [`Goal::idle`].
    pub idle_met: Option<bool>,
    /// Granary's loader CPU µs per sample.
    pub granary_us: f64,
    /// The contender with the least loader CPU per sample, and that figure.
    pub best: Option<(String, f64)>,
    /// Whether Granary's is at most [`GOAL_CPU_RATIO`] × the best's.
    pub cpu_met: Option<bool>,
}

impl Goal {
    /// Judges `granary` against the C loader's cell `c` and `contenders`
    /// (name, cell) on the window's loader CPU ([`Cell::loader_us`]);
    /// contenders that were not measured are left out of the best.
    pub fn judge(granary: &Cell, c: Option<&Cell>, contenders: &[(&str, &Cell)]) -> Goal {
        Goal::judge_by(granary, c, contenders, |c| c.loader_us)
    }

    /// [`Goal::judge`] with the CPU per sample taken by `cpu` (the window's,
    /// or from the start).
    pub fn judge_by(
        granary: &Cell,
        c: Option<&Cell>,
        contenders: &[(&str, &Cell)],
        cpu: fn(&Cell) -> f64,
    ) -> Goal {
        let best = contenders
            .iter()
            .map(|(n, c)| (*n, cpu(c)))
            .filter(|(_, us)| us.is_finite())
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(n, us)| (n.to_owned(), us));
        let granary_us = cpu(granary);
        let c_idle = c.map_or(f64::NAN, |c| c.idle);
        let idle_met = granary.idle.is_finite().then_some(
            granary.idle <= GOAL_IDLE
                && (!c_idle.is_finite() || granary.idle <= c_idle + GOAL_IDLE_OVER_C),
        );
        let cpu_met = match &best {
            Some((_, b)) if granary_us.is_finite() => Some(granary_us <= GOAL_CPU_RATIO * b),
            _ => None,
        };
        Goal {
            idle: granary.idle,
            c_idle,
            idle_met,
            granary_us,
            best,
            cpu_met,
        }
    }
}

/// The contender with the least idle fraction, and that fraction (those
/// not measured left out).
pub fn best_idle(contenders: &[(&str, &Cell)]) -> Option<(String, f64)> {
    contenders
        .iter()
        .map(|(n, c)| (*n, c.idle))
        .filter(|(_, v)| v.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, v)| (n.to_owned(), v))
}

/// `met`, `NOT met` or `not measured`.
pub fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

/// The last line's object, its first keys as `bench/run stall` promises:
/// `bench`, `rtt_ms`, `granary_idle`, each contender's `<name>_idle`, then
/// the goal's CPU figures; `columns` holds (name, one cell per RTT) with
/// Granary first. The caller appends further keys.
pub fn summary_json(rtts: &[u64], columns: &[(String, Vec<Cell>)], goal: &Goal) -> Json {
    let mut j = Json::bench("stall");
    let rtt: Vec<f64> = rtts.iter().map(|&r| r as f64).collect();
    j.nums("rtt_ms", &rtt, 0);
    let col = |f: &dyn Fn(&Cell) -> f64, cells: &[Cell]| cells.iter().map(f).collect::<Vec<_>>();
    for (name, cells) in columns {
        j.nums(&format!("{name}_idle"), &col(&|c| c.idle, cells), 4);
    }
    j.num("granary_cpu_us_per_sample", goal.granary_us, 1);
    j.num(
        "best_contender_cpu_us_per_sample",
        goal.best.as_ref().map_or(f64::NAN, |b| b.1),
        1,
    );
    j.str(
        "best_contender",
        goal.best.as_ref().map_or("", |b| b.0.as_str()),
    );
    j.str("goal_idle", verdict(goal.idle_met));
    j.str("goal_cpu", verdict(goal.cpu_met));
    // Every contender's series after the goals: key suffix, value, decimals.
    type Series = (&'static str, fn(&Cell) -> f64, usize);
    let series: [Series; 8] = [
        ("idle_from_start", |c| c.idle_from_start, 4),
        ("img_per_s", |c| c.img_per_s, 1),
        ("p50_ms", |c| c.wait_p50_ms, 2),
        ("p99_ms", |c| c.wait_p99_ms, 2),
        ("cpu_us", |c| c.loader_us, 1),
        ("cpu_us_from_start", |c| c.loader_us_from_start, 1),
        ("proxy_us", |c| c.proxy_us, 1),
        ("store_us", |c| c.store_us, 1),
    ];
    for (name, cells) in columns {
        for (suffix, value, decimals) in series {
            j.nums(&format!("{name}_{suffix}"), &col(&value, cells), decimals);
        }
        if cells.iter().any(|c| c.gpu_step_ms.is_finite()) {
            j.nums(
                &format!("{name}_gpu_step_ms"),
                &col(&|c| c.gpu_step_ms, cells),
                2,
            );
        }
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(idle: f64, samples: u64, client: f64, agent: f64) -> Run {
        Run {
            idle,
            img_per_s: samples as f64,
            wait_p50_ms: idle * 10.0,
            wait_p99_ms: idle * 100.0,
            samples,
            client_cpu_s: client,
            agent_cpu_s: agent,
            proxy_cpu_s: 0.1,
            store_cpu_s: 1.0,
            ..Run::default()
        }
    }

    #[test]
    fn loader_lines_parse_and_empty_windows_are_errors() {
        let line = r#"{"contender": "boto3", "idle": 0.25, "img_per_s": 640.5, "wait_p50_ms": 3.0, "wait_p99_ms": 90.0, "samples": 6400, "first_batch_s": 1.5, "busy_s": 6.0, "run_s": 9.0}"#;
        let r = Run::from_loader_line(line, 1.0).unwrap();
        assert!((r.idle_from_start - 0.4).abs() < 1e-12);
        assert_eq!(r.samples, 6400);
        assert_eq!(r.idle, 0.25);
        assert_eq!(r.wait_p99_ms, 90.0);
        assert!(Run::from_loader_line(&line.replace("6400", "0"), 0.0).is_err());
        assert!(Run::from_loader_line(r#"{"samples": 5}"#, 0.0).is_err());
    }

    #[test]
    fn cpu_from_the_start_counts_the_warm_up_samples() {
        let mut r = run(0.1, 1000, 0.2, 0.1);
        assert!(
            r.loader_us_from_start().is_nan(),
            "nothing delivered from the start yet"
        );
        r.cpu_from_start_s = 0.9;
        r.samples_from_start = 1500;
        assert!((r.loader_us_from_start() - 600.0).abs() < 1e-9);
        assert!((Cell::of(&[r.clone()]).loader_us_from_start - 600.0).abs() < 1e-9);
        r.error = Some("failed".into());
        assert!(r.loader_us_from_start().is_nan());
    }

    #[test]
    fn cells_take_medians_of_the_runs_that_worked() {
        let runs = vec![
            run(0.10, 1000, 1.0, 0.0),
            Run::failed("boom".into()),
            run(0.30, 1000, 3.0, 0.0),
            run(0.20, 1000, 2.0, 1.0),
        ];
        let c = Cell::of(&runs);
        assert_eq!((c.ok, c.runs), (3, 4));
        assert!((c.idle - 0.20).abs() < 1e-12);
        // loader µs per sample: 1000, 3000, 3000 -> 3000
        assert!((c.loader_us - 3000.0).abs() < 1e-9);
        assert!((c.proxy_us - 100.0).abs() < 1e-9);
        assert!((c.store_us - 1000.0).abs() < 1e-9);
        assert_eq!(c.error.as_deref(), Some("boom"));
        let none = Cell::of(&[Run::failed("x".into())]);
        assert!(none.idle.is_nan() && none.loader_us.is_nan());
    }

    #[test]
    fn the_goal_compares_with_the_cheapest_measured_contender() {
        let g = Cell::of(&[run(0.015, 1000, 0.2, 0.1)]); // 300 µs
        let a = Cell::of(&[run(0.5, 1000, 0.7, 0.0)]); // 700 µs
        let b = Cell::of(&[run(0.9, 1000, 0.5, 0.0)]); // 500 µs
        let missing = Cell::of(&[Run::failed("not installed".into())]);
        let goal = Goal::judge(&g, None, &[("a", &a), ("b", &b), ("m", &missing)]);
        assert_eq!(goal.idle_met, Some(true));
        // 1.5 % is under 2 % but more than a point over the C loader's 0.4 %.
        let c = Cell::of(&[run(0.004, 1000, 0.1, 0.1)]);
        let goal = Goal::judge(&g, Some(&c), &[("a", &a), ("b", &b)]);
        assert_eq!((goal.idle_met, goal.c_idle), (Some(false), 0.004));
        let c = Cell::of(&[run(0.006, 1000, 0.1, 0.1)]);
        assert_eq!(Goal::judge(&g, Some(&c), &[("b", &b)]).idle_met, Some(true));
        assert_eq!(goal.best.as_ref().map(|b| b.0.as_str()), Some("b"));
        // 300 > 0.5 × 500
        assert_eq!(goal.cpu_met, Some(false));
        let slow = Cell::of(&[run(0.025, 1000, 0.1, 0.1)]); // 200 µs
        let goal = Goal::judge(&slow, None, &[("b", &b)]);
        assert_eq!(goal.idle_met, Some(false));
        assert_eq!(goal.cpu_met, Some(true));
        let goal = Goal::judge(&missing, Some(&missing), &[("m", &missing)]);
        assert_eq!((goal.idle_met, goal.cpu_met), (None, None));
        assert_eq!(verdict(goal.cpu_met), "not measured"); // Another measure picks its own best and verdict: by median wait,
                                                           // `a` (5 ms) beats `b` (9 ms), and Granary's 0.15 ms is ≤ 0.5 × 5.
        let goal = Goal::judge_by(&g, None, &[("a", &a), ("b", &b)], |c| c.wait_p50_ms);
        assert_eq!(goal.best.as_ref().map(|b| b.0.as_str()), Some("a"));
        assert!((goal.granary_us - 0.15).abs() < 1e-9);
        assert_eq!(goal.cpu_met, Some(true));
    }

    #[test]
    fn the_best_idle_is_the_least_measured() {
        let a = Cell::of(&[run(0.04, 1000, 0.2, 0.0)]);
        let b = Cell::of(&[run(0.03, 1000, 0.2, 0.0)]);
        let missing = Cell::of(&[Run::failed("x".into())]);
        assert_eq!(
            best_idle(&[("a", &a), ("b", &b), ("m", &missing)]),
            Some(("b".to_owned(), 0.03))
        );
        assert_eq!(best_idle(&[("m", &missing)]), None);
    }

    #[test]
    fn the_json_line_starts_with_the_promised_keys() {
        let g = Cell::of(&[run(0.01, 1000, 0.2, 0.1)]);
        let b = Cell::of(&[run(0.5, 1000, 0.5, 0.0)]);
        let columns = vec![
            ("granary".to_owned(), vec![g.clone(), g.clone()]),
            ("boto3_w8".to_owned(), vec![b.clone(), Cell::of(&[])]),
        ];
        let goal = Goal::judge(&g, None, &[("boto3_w8", &b)]);
        let line = summary_json(&[0, 100], &columns, &goal).line();
        assert!(
            line.starts_with(
                r#"{"bench":"stall","rtt_ms":[0,100],"granary_idle":[0.01,0.01],"boto3_w8_idle":[0.5,null],"granary_cpu_us_per_sample":300.0,"best_contender_cpu_us_per_sample":500.0,"best_contender":"boto3_w8","goal_idle":"met","goal_cpu":"NOT met""#
            ),
            "{line}"
        );
        assert!(
            line.contains(r#""boto3_w8_img_per_s":[1000.0,null]"#),
            "{line}"
        );
        assert!(
            line.contains(r#""granary_idle_from_start":[0.0,0.0]"#),
            "{line}"
        );
    }
}
