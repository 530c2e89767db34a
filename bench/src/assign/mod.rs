//! `bench/run assign`. Locality-aware assignment: fraction of samples moved per step (p = 2–256 nodes, local batch 32–512) against the law 0.40·√((p−1)/p)/√b.
//!
//! Runs the pure assignment function (`granary_peer::assign::assign_step`)
//! over many random global steps. Each node runs one rank with local batch
//! `b`, so a step holds `p·b` distinct samples; every sample's holder is
//! drawn uniformly among the `p` nodes (a stand-in for rendezvous ownership
//! with the whole dataset cached). The moved fraction is the number of
//! samples processed on another node than their holder over the samples
//! processed, summed over all steps of a configuration.
//!
//! Beside the measurement it prints the law `0.40·√((p−1)/p)/√b` and the
//! exact expectation `E[max(0, X−b)]/b` for `X ~ Binomial(p·b, 1/p)` (what
//! the law approximates), whether the measurement is within 1 percentage
//! point of the law, and the transfers per step (at most `p−1`).
//!
//! Each configuration runs at least `--min-steps` steps (default 200) and at
//! least `--samples` samples (default 4,000,000). `--seed` picks the holders.
//!
//! Layout: [`scenario`] (the configurations, the random holders, the law
//! and the exact expectation), [`measure`] (one configuration's steps),
//! [`report`] (the table and the result line); `bin/assign.rs` parses the
//! options.

pub mod measure;
pub mod report;
pub mod scenario;

use std::time::Instant;

use crate::cli::num;
use crate::report::Goal;
use scenario::{Rng, BATCHES, NODES};

type Result<T> = std::result::Result<T, String>;

/// A configuration's goal: the measured moved fraction within 1 percentage
/// point of the law (the distance, in points; `all_within_1pp` when every
/// row meets it).
pub const WITHIN: Goal = Goal::at_most("all_within_1pp", 1.0);

/// The benchmark's options (`bench/run assign --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// At least this many samples per configuration.
    #[arg(long, default_value_t = 4_000_000, value_parser = num::<u64>)]
    pub samples: u64,
    /// At least this many steps per configuration (at least 1).
    #[arg(long, default_value_t = 200, value_parser = num::<u64>)]
    pub min_steps: u64,
    /// The seed of the holders' draws.
    #[arg(long, default_value_t = 1, value_parser = num::<u64>)]
    pub seed: u64,
}

/// Runs the benchmark; prints the result line last.
pub fn run(o: &Options) -> Result<()> {
    let min_steps = o.min_steps.max(1);
    let mut rng = Rng::new(o.seed);
    report::print_header(o.samples, min_steps);
    let start = Instant::now();
    let mut rows = Vec::new();
    for &p in &NODES {
        for &b in &BATCHES {
            let r = measure::row(p, b, o.samples, min_steps, &mut rng)?;
            report::print_row(&r);
            rows.push(r);
        }
    }
    let json = report::summary(&rows, start.elapsed());
    println!("{}", json.line());
    Ok(())
}
