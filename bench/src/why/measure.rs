//! A measured loop: batches taken for the warm-up and the measured part,
//! the cause injected after each, and the agent's verdict counters read at
//! both ends of the measured part.

use std::time::{Duration, Instant};

use granary::Session;

use super::inject::Inject;
use super::Result;
use crate::agent::Agent;

/// The verdicts of `granary_rank_verdicts_total`, in the order of [`Counts`].
pub const VERDICTS: [&str; 6] = ["idle", "compute", "loader_cpu", "store", "peer", "arena"];

/// The warm-up and the measured part of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Before the measurement.
    pub warmup: Duration,
    /// Measured.
    pub measured: Duration,
}

/// What a measured loop saw: the batches taken and rank 0's verdicts over
/// the measured part, in [`VERDICTS`] order.
#[derive(Clone, Debug, PartialEq)]
pub struct Counts {
    /// Batches taken, warm-up included.
    pub batches: u64,
    /// Intervals per verdict over the measured part.
    pub verdicts: [f64; 6],
}

/// Takes batches from `session` for the warm-up and the measured part,
/// applying `inject` after each; the verdicts `agent` counted meanwhile.
pub fn measured(
    session: &mut Session,
    agent: &Agent,
    window: Window,
    inject: Inject,
) -> Result<Counts> {
    let start = Instant::now();
    let mut before: Option<[f64; 6]> = None;
    let mut batches = 0u64;
    while start.elapsed() < window.warmup + window.measured {
        if before.is_none() && start.elapsed() >= window.warmup {
            before = Some(verdicts(agent));
        }
        let b = session
            .next_batch(Some(Duration::from_secs(60)))
            .map_err(|e| format!("next_batch: {e}"))?;
        batches += 1;
        drop(b);
        inject.apply();
    }
    let before = before.unwrap_or([0.0; 6]);
    let after = verdicts(agent);
    Ok(Counts {
        batches,
        verdicts: std::array::from_fn(|i| after[i] - before[i]),
    })
}

/// `granary_rank_verdicts_total` of rank 0, in [`VERDICTS`] order.
fn verdicts(agent: &Agent) -> [f64; 6] {
    let mut out = [0.0; 6];
    for (k, v) in agent.series() {
        if !k.starts_with("granary_rank_verdicts_total{") || !k.contains("rank=\"0\"") {
            continue;
        }
        if let Some(i) = VERDICTS
            .iter()
            .position(|x| k.contains(&format!("verdict=\"{x}\"")))
        {
            out[i] = v;
        }
    }
    out
}

/// Peers of `agent` whose connection is up.
pub fn peers_up(agent: &Agent) -> f64 {
    agent
        .series()
        .iter()
        .filter(|(k, _)| k.starts_with("granary_peer_up{"))
        .map(|(_, v)| v)
        .sum()
}
