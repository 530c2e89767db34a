//! What a run prints: each scenario's intervals by verdict and the share
//! naming the injected cause, then the result line.

use std::collections::BTreeMap;

use super::measure::{Counts, VERDICTS};
use super::GOAL;
use crate::report::Json;

/// The verdicts seen (those counted at least once) by name.
fn by_verdict(c: &Counts) -> BTreeMap<&'static str, f64> {
    VERDICTS
        .iter()
        .zip(c.verdicts)
        .map(|(v, n)| (*v, n))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// The share of the measured intervals whose verdict is `name` (0 when
/// none was counted).
pub fn share_of(name: &str, c: &Counts) -> f64 {
    let counts = by_verdict(c);
    let total: f64 = counts.values().sum();
    let hit = counts.get(name).copied().unwrap_or(0.0);
    if total > 0.0 {
        hit / total
    } else {
        0.0
    }
}

/// Prints a scenario's line and returns the share naming `name`.
pub fn share(name: &str, c: &Counts) -> f64 {
    let share = share_of(name, c);
    println!(
        "{:<11} {} batches; intervals by verdict {:?}: {:.1} % name the injected cause ({})",
        name,
        c.batches,
        by_verdict(c),
        100.0 * share,
        GOAL.verdict(share)
    );
    share
}

/// The result line: each scenario's share, the worst and the verdict.
pub fn line(shares: &[(&str, f64)]) -> Json {
    let mut json = Json::bench("why");
    let mut worst = f64::INFINITY;
    for &(name, share) in shares {
        worst = worst.min(share);
        json.num(name, share, 3);
    }
    json.num("worst_share", worst, 3);
    json.str(
        "goal",
        if GOAL.met(worst) {
            "met: every injected cause named in >= 95 % of intervals"
        } else {
            "not met: a cause named in < 95 % of intervals"
        },
    );
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_counts_only_the_measured_intervals_naming_the_cause() {
        let c = Counts {
            batches: 10,
            verdicts: [1.0, 0.0, 0.0, 19.0, 0.0, 0.0],
        };
        assert_eq!(share_of("store", &c), 0.95);
        assert_eq!(share_of("peer", &c), 0.0);
        let none = Counts {
            batches: 0,
            verdicts: [0.0; 6],
        };
        assert_eq!(share_of("store", &none), 0.0);
    }

    #[test]
    fn the_line_keeps_its_keys_and_judges_the_worst() {
        let j = line(&[
            ("store", 0.96),
            ("loader_cpu", 0.99),
            ("compute", 1.0),
            ("peer", 0.951),
        ]);
        assert_eq!(
            j.line(),
            r#"{"bench":"why","store":0.96,"loader_cpu":0.99,"compute":1.0,"peer":0.951,"worst_share":0.951,"goal":"met: every injected cause named in >= 95 % of intervals"}"#
        );
        let j = line(&[("store", 0.5), ("peer", 1.0)]);
        assert!(j.line().contains(r#""worst_share":0.5,"goal":"not met"#));
    }
}
