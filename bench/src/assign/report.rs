//! What a run prints: the table, one row per configuration, then the
//! summary and the result line.

use std::time::Duration;

use super::measure::Row;
use super::WITHIN;
use crate::report::Json;

/// The heading and the table's column names.
pub fn print_header(min_samples: u64, min_steps: u64) {
    println!(
        "locality-aware assignment, one rank per node, holders uniform; ≥ {min_samples} samples and ≥ {min_steps} steps per row"
    );
    println!(
        "{:>4} {:>4} {:>7} {:>10} {:>8} {:>8} {:>9} {:>7} {:>15}",
        "p", "b", "steps", "measured%", "law%", "exact%", "diff(pp)", "within", "transfers/step"
    );
}

/// One configuration's row.
pub fn print_row(r: &Row) {
    let diff = r.diff_pp();
    println!(
        "{:>4} {:>4} {:>7} {:>10.3} {:>8.3} {:>8.3} {:>+9.3} {:>7} {:>8.2} (max {})",
        r.p,
        r.b,
        r.steps,
        r.measured * 100.0,
        r.law * 100.0,
        r.exact * 100.0,
        diff,
        if WITHIN.met(diff.abs()) { "yes" } else { "NO" },
        r.mean_transfers,
        r.max_transfers
    );
}

/// Prints the summary and returns the result line.
pub fn summary(rows: &[Row], took: Duration) -> Json {
    let worst = rows.iter().map(|r| r.diff_pp().abs()).fold(0.0, f64::max);
    let within = rows
        .iter()
        .filter(|r| WITHIN.met(r.diff_pp().abs()))
        .count();
    println!(
        "{within} of {} rows within 1 percentage point of the law (worst {worst:.3} pp); {:.1} s",
        rows.len(),
        took.as_secs_f64()
    );
    let pct = |f: fn(&Row) -> f64| rows.iter().map(|r| f(r) * 100.0).collect::<Vec<_>>();
    let each = |f: fn(&Row) -> f64| rows.iter().map(f).collect::<Vec<_>>();
    let mut json = Json::bench("assign");
    json.nums("p", &each(|r| f64::from(r.p)), 0)
        .nums("b", &each(|r| f64::from(r.b)), 0)
        .nums("moved_pct", &pct(|r| r.measured), 3)
        .nums("law_pct", &pct(|r| r.law), 3)
        .nums("exact_pct", &pct(|r| r.exact), 3)
        .nums("transfers_per_step", &each(|r| r.mean_transfers), 2)
        .int("rows", rows.len() as u64)
        .int("rows_within_1pp", within as u64)
        .num("worst_diff_pp", worst, 3)
        .raw(
            WITHIN.key,
            if within == rows.len() {
                "true"
            } else {
                "false"
            },
        );
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: u32, measured: f64, law: f64) -> Row {
        Row {
            p,
            b: 32,
            steps: 1,
            measured,
            law,
            exact: law,
            mean_transfers: 1.0,
            max_transfers: 1,
        }
    }

    #[test]
    fn the_line_keeps_its_keys_and_counts_rows_within_a_point() {
        let rows = [row(2, 0.05, 0.05), row(3, 0.07, 0.05)];
        let j = summary(&rows, Duration::ZERO).line();
        assert_eq!(
            j,
            r#"{"bench":"assign","p":[2,3],"b":[32,32],"moved_pct":[5.0,7.0],"law_pct":[5.0,5.0],"exact_pct":[5.0,5.0],"transfers_per_step":[1.0,1.0],"rows":2,"rows_within_1pp":1,"worst_diff_pp":2.0,"all_within_1pp":false}"#
        );
        assert!(summary(&rows[..1], Duration::ZERO)
            .line()
            .ends_with(r#""all_within_1pp":true}"#));
    }
}
