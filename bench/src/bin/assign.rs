//! Locality-aware assignment: fraction of samples moved per step (p = 2–256 nodes, local batch 32–512) against the law 0.40·√((p−1)/p)/√b.
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

use granary_bench::cli::Args;
use granary_bench::report::Json;
use granary_peer::assign::{assign_step, Layout};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: assign [--samples N] [--min-steps N] [--seed N]";
const NODES: [u32; 7] = [2, 3, 4, 8, 16, 64, 256];
const BATCHES: [u32; 5] = [32, 64, 128, 256, 512];

/// SplitMix64 with Lemire's bounded draw: the holders of the random steps.
struct Rng(granary_base::SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0 .. s` (s ≥ 1).
    fn below(&mut self, s: u32) -> u32 {
        let s = u64::from(s);
        loop {
            let m = u128::from(self.next()) * u128::from(s);
            let low = m as u64;
            if low >= s || low >= s.wrapping_neg() % s {
                return (m >> 64) as u32;
            }
        }
    }
}

/// The law: 0.40·√((p−1)/p)/√b.
fn law(p: u32, b: u32) -> f64 {
    let (p, b) = (f64::from(p), f64::from(b));
    0.40 * ((p - 1.0) / p).sqrt() / b.sqrt()
}

/// The exact expected moved fraction with uniform holders:
/// `E[max(0, X−b)] / b` for `X ~ Binomial(p·b, 1/p)` (each node's surplus
/// over its quota `b`, summed over `p` nodes, over the `p·b` samples).
fn exact(p: u32, b: u32) -> f64 {
    let n = u64::from(p) * u64::from(b);
    let q = 1.0 / f64::from(p);
    let odds = (q / (1.0 - q)).ln();
    // ln pmf(k), from pmf(0) = (1−q)^n upward.
    let mut ln_pmf = n as f64 * (1.0 - q).ln();
    let mut surplus = 0.0;
    for k in 0..=n {
        if k > u64::from(b) {
            surplus += (k - u64::from(b)) as f64 * ln_pmf.exp();
        }
        if k < n {
            ln_pmf += ((n - k) as f64).ln() - ((k + 1) as f64).ln() + odds;
        }
    }
    surplus / f64::from(b)
}

struct Row {
    p: u32,
    b: u32,
    steps: u64,
    measured: f64,
    law: f64,
    exact: f64,
    mean_transfers: f64,
    max_transfers: usize,
}

fn measure(p: u32, b: u32, min_samples: u64, min_steps: u64, rng: &mut Rng) -> Result<Row, String> {
    let layout = Layout::uniform(p, 1).map_err(|e| e.to_string())?;
    let n = p as usize * b as usize;
    let steps = min_steps.max(min_samples.div_ceil(n as u64));
    let samples: Vec<u64> = (0..n as u64).collect();
    let mut holders = vec![None; n];
    let (mut moved, mut transfers, mut max_transfers) = (0u64, 0u64, 0usize);
    for _ in 0..steps {
        for h in holders.iter_mut() {
            *h = Some(rng.below(p));
        }
        let a = assign_step(&samples, &holders, &layout, b).map_err(|e| e.to_string())?;
        let s = a.stats();
        if s.transfers.len() >= p as usize {
            return Err(format!(
                "p={p} b={b}: {} transfers in one step, more than p−1",
                s.transfers.len()
            ));
        }
        moved += s.moved;
        transfers += s.transfers.len() as u64;
        max_transfers = max_transfers.max(s.transfers.len());
    }
    Ok(Row {
        p,
        b,
        steps,
        measured: moved as f64 / (steps * n as u64) as f64,
        law: law(p, b),
        exact: exact(p, b),
        mean_transfers: transfers as f64 / steps as f64,
        max_transfers,
    })
}

fn run() -> Result<(), String> {
    let args = Args::parse(std::env::args().skip(1), &[], USAGE)?;
    let min_samples = args.u64("samples", 4_000_000)?;
    let min_steps = args.u64("min-steps", 200)?.max(1);
    let mut rng = Rng(granary_base::SplitMix64(args.u64("seed", 1)?));
    println!(
        "locality-aware assignment, one rank per node, holders uniform; ≥ {min_samples} samples and ≥ {min_steps} steps per row"
    );
    println!(
        "{:>4} {:>4} {:>7} {:>10} {:>8} {:>8} {:>9} {:>7} {:>15}",
        "p", "b", "steps", "measured%", "law%", "exact%", "diff(pp)", "within", "transfers/step"
    );
    let start = Instant::now();
    let mut rows = Vec::new();
    for &p in &NODES {
        for &b in &BATCHES {
            let r = measure(p, b, min_samples, min_steps, &mut rng)?;
            let diff = (r.measured - r.law) * 100.0;
            println!(
                "{:>4} {:>4} {:>7} {:>10.3} {:>8.3} {:>8.3} {:>+9.3} {:>7} {:>8.2} (max {})",
                r.p,
                r.b,
                r.steps,
                r.measured * 100.0,
                r.law * 100.0,
                r.exact * 100.0,
                diff,
                if diff.abs() <= 1.0 { "yes" } else { "NO" },
                r.mean_transfers,
                r.max_transfers
            );
            rows.push(r);
        }
    }
    let worst = rows
        .iter()
        .map(|r| ((r.measured - r.law) * 100.0).abs())
        .fold(0.0, f64::max);
    let within = rows
        .iter()
        .filter(|r| ((r.measured - r.law) * 100.0).abs() <= 1.0)
        .count();
    println!(
        "{within} of {} rows within 1 percentage point of the law (worst {worst:.3} pp); {:.1} s",
        rows.len(),
        start.elapsed().as_secs_f64()
    );
    let pct = |f: fn(&Row) -> f64| rows.iter().map(|r| f(r) * 100.0).collect::<Vec<_>>();
    let mut json = Json::bench("assign");
    json.nums(
        "p",
        &rows.iter().map(|r| f64::from(r.p)).collect::<Vec<_>>(),
        0,
    )
    .nums(
        "b",
        &rows.iter().map(|r| f64::from(r.b)).collect::<Vec<_>>(),
        0,
    )
    .nums("moved_pct", &pct(|r| r.measured), 3)
    .nums("law_pct", &pct(|r| r.law), 3)
    .nums("exact_pct", &pct(|r| r.exact), 3)
    .nums(
        "transfers_per_step",
        &rows.iter().map(|r| r.mean_transfers).collect::<Vec<_>>(),
        2,
    )
    .int("rows", rows.len() as u64)
    .int("rows_within_1pp", within as u64)
    .num("worst_diff_pp", worst, 3)
    .raw(
        "all_within_1pp",
        if within == rows.len() {
            "true"
        } else {
            "false"
        },
    );
    println!("{}", json.line());
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("assign: {e}");
            ExitCode::FAILURE
        }
    }
}
