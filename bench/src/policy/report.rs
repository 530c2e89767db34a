//! What a run prints: each policy's hit rates beside the simulator's, the
//! goal (clairvoyant ≥ MinIO > LRU after the first epoch) and the result
//! line.

use std::fmt::Write as _;

use super::measure::PolicyRun;
use crate::report::{verdict, Json};

/// The cache the engine configured (printed once).
pub fn print_cache(run: &PolicyRun) {
    let cc = &run.cache;
    println!(
        "cache: {:.1} MB, transient reserve {:.1} MB, retain limit {:.1} MB, alignment {}",
        cc.arena_size as f64 / 1e6,
        cc.transient_reserve as f64 / 1e6,
        cc.retain_limit() as f64 / 1e6,
        cc.align
    );
}

/// A policy's two lines: hit rates per epoch, then reads and the
/// simulator's counts.
pub fn print_run(run: &PolicyRun) {
    let mut line = format!("{:<12} agent:", run.policy.as_str());
    for r in &run.measured {
        let _ = write!(line, " {:5.1}%", r * 100.0);
    }
    line.push_str("   simulator:");
    for r in &run.predicted.hit_rates() {
        let _ = write!(line, " {:5.1}%", r * 100.0);
    }
    println!("{line}");
    println!(
        "{:<12} {} reads from the source ({:.1} MB), {:.2} s, loader stalled {:.2} s; \
         simulator: {} evictions, {} transient reads, {} unserved",
        "",
        run.reads,
        run.read_bytes / 1e6,
        run.secs,
        run.waited_s,
        run.predicted.evictions,
        run.predicted.transient_reads,
        run.predicted.unserved,
    );
}

/// Whether clairvoyant ≥ MinIO > LRU in every epoch after the first
/// (`rates` in [`granary_agent::cache::PolicyKind::ALL`] order).
pub fn goal_met(rates: &[&[f64]]) -> bool {
    let [c, mi, l] = rates else {
        return false;
    };
    let epochs = c.len().min(mi.len()).min(l.len());
    (1..epochs).all(|e| c[e] >= mi[e] && mi[e] > l[e])
}

/// Prints the goal's verdict.
pub fn print_goal(runs: &[PolicyRun], epochs: u32) {
    let rates: Vec<&[f64]> = runs.iter().map(|r| r.measured.as_slice()).collect();
    println!(
        "goal clairvoyant ≥ MinIO > LRU in epochs 2..{epochs}: {}",
        verdict(goal_met(&rates))
    );
}

/// The result line: `{"bench":"policy","clairvoyant":[..],"minio":[..],"lru":[..]}`.
pub fn line(runs: &[PolicyRun]) -> Json {
    let mut json = Json::bench("policy");
    for r in runs {
        json.nums(r.policy.as_str(), &r.measured, 4);
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_goal_orders_the_policies_after_the_first_epoch() {
        let c = [0.0, 0.4, 0.4];
        let m = [0.1, 0.3, 0.4];
        let l = [0.2, 0.1, 0.1];
        assert!(goal_met(&[&c, &m, &l]));
        // MinIO equal to LRU in one epoch: not met.
        assert!(!goal_met(&[&c, &m, &[0.0, 0.1, 0.4]]));
        // Clairvoyant below MinIO: not met.
        assert!(!goal_met(&[&[0.0, 0.2, 0.4], &m, &l]));
        assert!(!goal_met(&[&c, &m]));
    }
}
