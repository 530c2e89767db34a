//! The configurations, the random holders, and what the moved fraction is
//! expected to be: the law and the exact expectation it approximates.

/// Nodes per configuration.
pub const NODES: [u32; 7] = [2, 3, 4, 8, 16, 64, 256];
/// Local batches per configuration.
pub const BATCHES: [u32; 5] = [32, 64, 128, 256, 512];

/// SplitMix64 with Lemire's bounded draw: the holders of the random steps.
pub struct Rng(granary_base::SplitMix64);

impl Rng {
    /// Draws from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(granary_base::SplitMix64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0 .. s` (s ≥ 1).
    pub fn below(&mut self, s: u32) -> u32 {
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
pub fn law(p: u32, b: u32) -> f64 {
    let (p, b) = (f64::from(p), f64::from(b));
    0.40 * ((p - 1.0) / p).sqrt() / b.sqrt()
}

/// The exact expected moved fraction with uniform holders:
/// `E[max(0, X−b)] / b` for `X ~ Binomial(p·b, 1/p)` (each node's surplus
/// over its quota `b`, summed over `p` nodes, over the `p·b` samples).
pub fn exact(p: u32, b: u32) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_below_their_bound_and_reach_every_value() {
        let mut rng = Rng::new(1);
        let mut seen = [0u32; 3];
        for _ in 0..3_000 {
            seen[rng.below(3) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        assert!((0..100).all(|_| rng.below(1) == 0));
    }

    #[test]
    fn the_law_is_close_to_the_exact_expectation() {
        // Two nodes, b = 32: E|X − 32| / 2 / 32 for X ~ Bin(64, 1/2), about
        // √(64/4)·√(2/π)/2/32 ≈ 0.0499.
        assert!((exact(2, 32) - 0.0497).abs() < 0.001, "{}", exact(2, 32));
        assert!((law(2, 32) - 0.05).abs() < 1e-12);
        for &p in &NODES {
            for &b in &BATCHES {
                assert!((law(p, b) - exact(p, b)).abs() < 0.01, "p={p} b={b}");
            }
        }
    }
}
