//! What a run prints: each measurement as it comes, then the verdict and
//! the result line.

use super::measure::{pages, Outcome};
use super::scenario::Scenario;
use super::{GOAL, WAIT_REPORTS_GOAL};
use crate::report::Json;
use crate::sys;

fn fmt_rates(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn print_outcome(what: &str, o: &Outcome) {
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

/// The middle value of `values` (the upper one of an even count).
fn middle(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The comparisons' medians, the best configuration of a sweep and the
/// result line.
pub(super) struct Summary<'a> {
    pub scenario: &'a Scenario,
    pub reps: u32,
    /// Every run of the main configuration.
    pub runs: &'a [Outcome],
    /// The median run.
    pub main: &'a Outcome,
    /// The sweep's runs.
    pub tuned: &'a [Outcome],
    /// Runs with the loader's full CRC check, GB/s.
    pub full_crc: Vec<f64>,
    /// Runs without the loader's wait reports, GB/s.
    pub no_waits: Vec<f64>,
}

impl Summary<'_> {
    /// Prints the verdict and returns the result line.
    pub fn print(self) -> Json {
        let (runs, main, tuned, reps) = (self.runs, self.main, self.tuned, self.reps);
        let mem = self.scenario.mem.as_ref();
        let key = |o: &Outcome| super::rank_key(o, mem.is_some());
        let ratios: Vec<f64> = runs.iter().map(Outcome::ratio_shuffled).collect();
        let rs = main.ratio_shuffled();
        let met = GOAL.verdict(rs);
        println!(
            "pages: arena on {}, baseline mapping on {}{}",
            pages(main.hugepages),
            mem.map_or("(no baseline)", |m| pages(m.hugepages())),
            if mem.is_some_and(|m| m.hugepages() != main.hugepages) {
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
            .chain(std::iter::once(main))
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

        // The default configuration's rate, beside its two variants'.
        let runs_gbps: Vec<f64> = runs.iter().map(|o| o.gbps).collect();
        let runs_median = middle(&runs_gbps).unwrap_or(f64::NAN);
        let full_crc_median = middle(&self.full_crc);
        if let Some(f) = full_crc_median {
            let n = runs_median;
            println!(
                "loader-side full CRC check (verify_crc): {f:.2} GB/s with it, {n:.2} GB/s without, the default (medians of {reps} interleaved runs each): {:.3} of the default rate",
                f / n
            );
        }
        let no_waits_median = middle(&self.no_waits);
        if let Some(n) = no_waits_median {
            let w = runs_median;
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
                mem.map_or("none", |m| pages(m.hugepages())),
            );
        if let Some(f) = full_crc_median {
            j.num("full_crc_check_gbps", f, 3);
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
        j
    }
}
