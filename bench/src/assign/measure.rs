//! One configuration: random steps through the assignment function, the
//! samples moved and the transfers counted.

use granary_peer::assign::{assign_step, Layout};

use super::scenario::{exact, law, Rng};
use super::Result;

/// What one configuration measured, beside what was expected.
pub struct Row {
    /// Nodes.
    pub p: u32,
    /// Local batch.
    pub b: u32,
    /// Steps run.
    pub steps: u64,
    /// Fraction of the samples processed away from their holder.
    pub measured: f64,
    /// The law's fraction.
    pub law: f64,
    /// The exact expectation.
    pub exact: f64,
    /// Transfers per step, mean.
    pub mean_transfers: f64,
    /// Transfers in one step, most.
    pub max_transfers: usize,
}

impl Row {
    /// Measured less the law, percentage points.
    pub fn diff_pp(&self) -> f64 {
        (self.measured - self.law) * 100.0
    }
}

/// Runs `p` nodes with local batch `b` for at least `min_steps` steps and
/// `min_samples` samples.
pub fn row(p: u32, b: u32, min_samples: u64, min_steps: u64, rng: &mut Rng) -> Result<Row> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_configuration_moves_about_what_the_law_says() {
        let r = row(4, 32, 100_000, 10, &mut Rng::new(3)).unwrap();
        assert_eq!(r.steps, 782);
        assert!(r.diff_pp().abs() < 1.0, "{}", r.diff_pp());
        assert!(r.max_transfers < 4 && r.mean_transfers > 0.0);
    }
}
