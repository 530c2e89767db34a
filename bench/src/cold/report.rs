//! What a run prints: each run as it comes, then the medians, the verdict
//! and the result line.

use super::measure::{AgentEpoch, FioRun, Knobs, UringRun};
use super::scenario::{Reader, Scenario};
use super::GOAL;
use crate::report::{median, Json};
use crate::sys;

fn fmt_secs(s: Option<f64>) -> String {
    match s {
        Some(s) if s < 1e-3 => format!("≤{:.0} µs", s * 1e6),
        Some(s) => format!("≤{:.1} ms", s * 1e3),
        None => "-".to_owned(),
    }
}

impl AgentEpoch {
    /// The run in words.
    pub fn describe(&self) -> String {
        format!(
            "{}: {:.0} files/s, {:.2} s, {:.3} GB read ({:.2} GB/s); stat pass {:.2} s; first batch {:.1} ms; \
             loader waited {:.0}%; read latency p50 {} p99 {}; peak reads in flight {}; CPU: engine {:.0}%, loader {:.0}%",
            self.knobs.label(),
            self.files_per_s,
            self.secs,
            self.bytes_read as f64 / 1e9,
            self.bytes_read as f64 / 1e9 / self.secs,
            self.stat.as_secs_f64(),
            self.first_batch.as_secs_f64() * 1e3,
            self.waited.as_secs_f64() / self.secs * 100.0,
            fmt_secs(self.read_p50),
            fmt_secs(self.read_p99),
            self.peak_inflight,
            self.engine_cpu.as_secs_f64() / self.secs * 100.0,
            self.loader_cpu.as_secs_f64() / self.secs * 100.0,
        )
    }
}

impl FioRun {
    /// The run in words.
    pub fn describe(&self) -> String {
        format!(
            "{:.0} files/s over its I/O phase ({:.2} s; {:.0} files/s over the whole {:.2} s run), \
             {:.3} GB read ({:.2} GB/s) in {} reads; stat pass {:.2} s",
            self.files_per_s,
            self.runtime.as_secs_f64(),
            self.wall_files_per_s,
            self.wall.as_secs_f64(),
            self.bytes as f64 / 1e9,
            self.bytes as f64 / 1e9 / self.runtime.as_secs_f64().max(1e-9),
            self.ios,
            self.stat.as_secs_f64(),
        )
    }
}

impl UringRun {
    /// The run in words.
    pub fn describe(&self) -> String {
        format!(
            "{:.0} files/s, {:.2} s, {:.3} GB read ({:.2} GB/s) in {} reads; stat pass {:.2} s",
            self.files_per_s,
            self.secs,
            self.bytes as f64 / 1e9,
            self.bytes as f64 / 1e9 / self.secs,
            self.reads,
            self.stat.as_secs_f64()
        )
    }
}

/// Every repetition's rates, files per second.
#[derive(Default)]
pub struct Rates {
    /// The agent, buffered reads.
    pub granary: Vec<f64>,
    /// The agent with `direct_io`.
    pub direct: Vec<f64>,
    /// Each reader's, over its I/O phase.
    pub readers: Vec<Vec<f64>>,
    /// Each reader's over its whole run (fio only).
    pub wall: Vec<Vec<f64>>,
}

/// The medians against each other, the verdict and the result line.
pub struct Summary<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// The main configuration.
    pub knobs: Knobs,
    /// The rates measured.
    pub rates: &'a Rates,
    /// The best sweep configuration and its rate (`None` without `--sweep`).
    pub best: Option<(Knobs, f64)>,
}

impl Summary<'_> {
    /// The best reader's name and median among those `keep` selects.
    fn best_of(&self, keep: &dyn Fn(&Reader) -> bool) -> (String, f64) {
        self.scenario
            .readers
            .iter()
            .zip(&self.rates.readers)
            .filter(|(r, _)| keep(r))
            .map(|(r, v)| (r.name(), median(v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or_else(|| ("none".to_owned(), f64::NAN))
    }

    fn print_readers(&self, g: f64) {
        for (i, r) in self.scenario.readers.iter().enumerate() {
            let m = median(&self.rates.readers[i]);
            match r {
                Reader::Fio(_) => println!(
                    "{}: median {m:.0} files/s over its I/O phase ({:.0} files/s over its whole run); granary ÷ it {:.3}",
                    r.name(),
                    median(&self.rates.wall[i]),
                    g / m
                ),
                Reader::Uring { .. } => {
                    println!("{}: median {m:.0} files/s; granary ÷ it {:.3}", r.name(), g / m)
                }
            }
        }
    }

    /// Prints the verdict and returns the result line.
    pub fn print(&self) -> Json {
        let sc = self.scenario;
        let (knobs, depth, warm_cache) = (self.knobs, sc.depth, sc.warm_cache);
        let g = median(&self.rates.granary);
        println!("granary: median {g:.0} files/s ({})", knobs.label());
        self.print_readers(g);
        let (best_name, best_rate) = self.best_of(&|_| true);
        let (fio_best, f) = self.best_of(&|r| matches!(r, Reader::Fio(_)));
        let (_, u) = self.best_of(&|r| matches!(r, Reader::Uring { direct: false }));
        let (_, ud) = self.best_of(&|r| matches!(r, Reader::Uring { direct: true }));
        let ratio_eq = g / best_rate;
        println!(
            "result: granary {g:.0} files/s, best equal-depth reader {best_rate:.0} files/s ({best_name}, depth {depth}): ratio_equal_depth {ratio_eq:.3} (goal ≥ 0.95: {})",
            if warm_cache {
                "not judged: page cache warm"
            } else if sc.readers.is_empty() {
                "no reader run"
            } else {
                GOAL.verdict(ratio_eq)
            }
        );
        let gd = median(&self.rates.direct);
        println!(
            "O_DIRECT: granary-direct median {gd:.0} files/s ({:.3}× granary with the default; {:.3}× uring-direct); \
             io_uring reader {ud:.0} files/s direct vs {u:.0} buffered",
            gd / g,
            gd / ud
        );
        if let Some(best) = self.best {
            println!(
                "best agent configuration: {}: {:.0} files/s, ratio_equal_depth {:.3}",
                best.0.label(),
                best.1,
                best.1 / best_rate
            );
        }
        if !sc.was_cold() {
            println!("cold: WARNING: the page cache was NOT dropped: these are NOT cold reads");
        }
        println!("after: {}", sys::regime());
        let mut j = Json::bench("cold");
        j.num("granary_files_per_s", g, 0)
            .num("fio_files_per_s", f, 0)
            .num("ratio", g / f, 3)
            .num("uring_files_per_s", u, 0)
            .num("uring_direct_files_per_s", ud, 0)
            .num("granary_direct_files_per_s", gd, 0)
            .num("direct_vs_buffered", gd / g, 3)
            .num("ratio_direct", gd / ud, 3)
            .num("best_reader_files_per_s", best_rate, 0)
            .str("best_reader", &best_name);
        j.num("ratio_equal_depth", ratio_eq, 3);
        if warm_cache {
            j.str(GOAL.key, "not judged");
        } else {
            j.goal(&GOAL, ratio_eq);
        }
        j.int("depth", u64::from(depth))
            .str("config", &knobs.label())
            .str("fio_bs", fio_best.trim_start_matches("fio "));
        if let Some(best) = self.best {
            j.num("best_files_per_s", best.1, 0)
                .num("best_ratio_equal_depth", best.1 / best_rate, 3)
                .str("best_config", &best.0.label());
        }
        if warm_cache {
            j.str(
                "warning",
                "--warm-page-cache: reads served from the page cache",
            );
        } else if !sc.was_cold() {
            j.str(
                "warning",
                "not root: page cache not dropped, reads were not cold",
            );
        }
        j
    }
}
