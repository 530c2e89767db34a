//! `bench/run stall --decode`'s hyper-parameter search: two `granary` jobs
//! (the same loader, the same seed) open sessions on one agent whose
//! dataset has `[dataset.prepare]`, at the goal's round-trip time, and the
//! agent's decode CPU per delivered sample is compared with one job's.
//!
//! **Decode CPU** is the CPU time of the agent's prepare workers (threads
//! `granary-prep-N`, [`PREP_THREAD_PREFIX`]): JPEG decode and resize. With
//! `prepare`, the loaders decode nothing. It is counted from the agent's
//! start to the end of the (last) job's window and divided by the samples
//! delivered to the training loops over the same span (warm-up epoch and
//! window, both jobs together). One job's figure comes from the `granary`
//! runs of the same benchmark at the same round-trip time, interleaved
//! with these. A node that shares prepared samples across jobs decodes each
//! sample once for both: the ratio tends to 0.5. The goal is [`GOAL`]
//! (issue 26).

use crate::report::{median, Goal};
use std::time::Duration;

/// With two jobs, decode CPU per delivered sample must be at most 0.55
/// times one job's (the verdict's key in the JSON line).
pub const GOAL: Goal = Goal::at_most("goal_jobs2_decode", 0.55);
/// The name of the agent's prepare workers, before their number.
pub const PREP_THREAD_PREFIX: &str = "granary-prep-";

/// CPU time of the prepare workers in a snapshot of this process's threads
/// (`sys::thread_cpu`).
pub fn prep_cpu(threads: &[(String, Duration)]) -> Duration {
    threads
        .iter()
        .filter(|(n, _)| n.starts_with(PREP_THREAD_PREFIX))
        .map(|(_, d)| *d)
        .sum()
}

/// Decode CPU and samples delivered over one measured span: one job's run,
/// or both jobs of one two-job run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeSpan {
    /// CPU seconds of the prepare workers.
    pub prep_cpu_s: f64,
    /// Samples delivered to the training loop(s) over the span.
    pub samples: u64,
}

impl DecodeSpan {
    /// Decode CPU µs per delivered sample (NaN with none delivered).
    pub fn us_per_sample(&self) -> f64 {
        if self.samples == 0 {
            f64::NAN
        } else {
            self.prep_cpu_s / self.samples as f64 * 1e6
        }
    }
}

/// The figures of the two-job comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Jobs2 {
    /// Median decode µs per sample of one job's runs.
    pub one_job_us: f64,
    /// Median decode µs per sample of the two-job runs.
    pub two_jobs_us: f64,
    /// `two_jobs_us / one_job_us` (NaN: not measured), judged by
    /// [`GOAL`].
    pub ratio: f64,
}

impl Jobs2 {
    /// Judges the runs: medians of each side's per-sample decode CPU.
    /// Spans with no decode CPU at all are not measurements (an agent
    /// without `prepare`) and make the figure NaN.
    pub fn judge(one_job: &[DecodeSpan], two_jobs: &[DecodeSpan]) -> Jobs2 {
        let side = |spans: &[DecodeSpan]| {
            let v: Vec<f64> = spans
                .iter()
                .filter(|s| s.prep_cpu_s > 0.0)
                .map(DecodeSpan::us_per_sample)
                .filter(|x| x.is_finite())
                .collect();
            if v.is_empty() {
                f64::NAN
            } else {
                median(&v)
            }
        };
        let (one_job_us, two_jobs_us) = (side(one_job), side(two_jobs));
        Jobs2 {
            one_job_us,
            two_jobs_us,
            ratio: two_jobs_us / one_job_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(prep_cpu_s: f64, samples: u64) -> DecodeSpan {
        DecodeSpan {
            prep_cpu_s,
            samples,
        }
    }

    #[test]
    fn only_the_prepare_workers_count() {
        let t = |n: &str, ms| (n.to_owned(), Duration::from_millis(ms));
        let threads = [
            t("granary-prep-0", 300),
            t("granary-prep-1", 200),
            t("granary-engine", 900),
            t("stall", 50),
        ];
        assert_eq!(prep_cpu(&threads), Duration::from_millis(500));
        assert_eq!(prep_cpu(&threads[2..]), Duration::ZERO);
    }

    #[test]
    fn a_shared_decode_halves_the_cost_per_sample() {
        // One job: 4 s of decode for 8,000 samples (500 µs each); two jobs:
        // the same 4 s for twice the samples.
        let j = Jobs2::judge(
            &[span(4.0, 8_000), span(4.4, 8_000)],
            &[span(4.1, 16_000), span(4.3, 16_000)],
        );
        assert!((j.one_job_us - 525.0).abs() < 1e-9, "{j:?}");
        assert!((j.two_jobs_us - 262.5).abs() < 1e-9, "{j:?}");
        assert!((j.ratio - 0.5).abs() < 1e-9);
        assert_eq!(GOAL.verdict(j.ratio), "met");
        // Each job decoding for itself: not met.
        let j = Jobs2::judge(&[span(4.0, 8_000)], &[span(8.0, 16_000)]);
        assert_eq!(GOAL.verdict(j.ratio), "NOT met");
    }

    #[test]
    fn no_decode_cpu_is_no_measurement() {
        let j = Jobs2::judge(&[span(0.0, 8_000)], &[span(4.0, 16_000)]);
        assert!(j.ratio.is_nan());
        assert_eq!(GOAL.verdict(j.ratio), "not measured");
        assert!(Jobs2::judge(&[], &[]).ratio.is_nan());
    }
}
