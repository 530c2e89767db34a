//! `granary status --why` and `granary top`: each rank's verdict on why its
//! training loop waits, from the agent's `granary_rank_*` metrics
//! (docs/operations.md, "Why the GPU waits").

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The verdict labels, in the agent's order.
pub const VERDICTS: [&str; 6] = ["idle", "compute", "loader_cpu", "store", "peer", "arena"];

/// One (dataset, rank) row read back from the metrics.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Row {
    /// The last interval's verdict, if any was given.
    pub verdict: Option<String>,
    /// Intervals by verdict, in [`VERDICTS`] order.
    pub verdicts: [f64; 6],
    /// The last interval's share of time in `next_batch`.
    pub wait_ratio: f64,
    /// The last interval's busy share of the loader threads.
    pub busy_ratio: f64,
    /// Wait quantiles 0.5, 0.95, 0.99 in seconds.
    pub quantiles: [Option<f64>; 3],
    /// `next_batch` calls counted.
    pub batches: f64,
    /// Stall seconds by cause: store, peer, arena.
    pub stall: [f64; 3],
}

/// The value of label `name` in a series key `metric{a="x",b="y"}`.
pub fn label<'a>(key: &'a str, name: &str) -> Option<&'a str> {
    let labels = key.split_once('{')?.1;
    let pat = format!("{name}=\"");
    let at = labels
        .match_indices(&pat)
        .find(|(i, _)| *i == 0 || labels.as_bytes()[i - 1] == b',')?
        .0;
    let rest = &labels[at + pat.len()..];
    Some(&rest[..rest.find('"')?])
}

/// Where label `name`'s value stands in `values`, when it is one of them.
fn label_index(key: &str, name: &str, values: &[&str]) -> Option<usize> {
    let value = label(key, name)?;
    values.iter().position(|v| *v == value)
}

/// The rows by (dataset, rank), from parsed series.
pub fn rows(series: &[(String, f64)]) -> BTreeMap<(String, u32), Row> {
    let mut out: BTreeMap<(String, u32), Row> = BTreeMap::new();
    for (k, v) in series {
        let name = k.split('{').next().unwrap_or("");
        if !name.starts_with("granary_rank_") {
            continue;
        }
        let (Some(d), Some(r)) = (label(k, "dataset"), label(k, "rank")) else {
            continue;
        };
        let Ok(r) = r.parse::<u32>() else { continue };
        let row = out.entry((d.to_string(), r)).or_default();
        let v = *v;
        match name {
            "granary_rank_verdict" if v > 0.0 => {
                row.verdict = label(k, "verdict").map(String::from)
            }
            "granary_rank_verdicts_total" => {
                if let Some(i) = label_index(k, "verdict", &VERDICTS) {
                    row.verdicts[i] = v;
                }
            }
            "granary_rank_wait_ratio" => row.wait_ratio = v,
            "granary_rank_busy_ratio" => row.busy_ratio = v,
            "granary_rank_wait_quantile_seconds" => {
                if let Some(i) = label_index(k, "quantile", &["0.5", "0.95", "0.99"]) {
                    row.quantiles[i] = Some(v);
                }
            }
            "granary_rank_wait_seconds_count" => row.batches = v,
            "granary_rank_stall_seconds_total" => {
                if let Some(i) = label_index(k, "cause", &["store", "peer", "arena"]) {
                    row.stall[i] = v;
                }
            }
            _ => {}
        }
    }
    out
}

/// What each verdict means, for the table's legend.
pub fn meaning(verdict: &str) -> &'static str {
    match verdict {
        "idle" => "no batch asked for",
        "compute" => "not waiting for data: the step itself (GPU) sets the pace",
        "loader_cpu" => "the loader's own CPU work (decode, transforms, hand-over)",
        "store" => "waiting on reads from the dataset's store",
        "peer" => "waiting on samples from peer agents",
        "arena" => "samples not in the arena and not being read (arena full, window)",
        _ => "",
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |s| format!("{:.1}", s * 1e3))
}

/// The `--why` table.
pub fn render(series: &[(String, f64)]) -> String {
    let rows = rows(series);
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("why the GPU waits: no loader has reported yet (libgranary reports from its first batch)\n");
        return out;
    }
    let _ = writeln!(
        out,
        "why the GPU waits (verdict and shares: last interval; quantiles of next_batch: last 10 s)"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>5}  {:<10} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9}  {:<23}  intervals by verdict",
        "dataset",
        "rank",
        "verdict",
        "wait%",
        "busy%",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "batches",
        "stall s store/peer/arena",
    );
    let mut seen = Vec::new();
    for ((d, r), row) in &rows {
        let total: f64 = row.verdicts.iter().sum();
        let mut shares: Vec<(f64, &str)> = VERDICTS
            .iter()
            .zip(row.verdicts)
            .filter(|(_, n)| *n > 0.0)
            .map(|(v, n)| (n, *v))
            .collect();
        shares.sort_by(|a, b| b.0.total_cmp(&a.0));
        let shares: Vec<String> = shares
            .iter()
            .take(3)
            .map(|(n, v)| format!("{v} {:.0} %", 100.0 * n / total.max(1.0)))
            .collect();
        let verdict = row.verdict.as_deref().unwrap_or("-");
        if !seen.contains(&verdict) {
            seen.push(verdict);
        }
        let stall = format!(
            "{:.1}/{:.1}/{:.1}",
            row.stall[0], row.stall[1], row.stall[2]
        );
        let _ = writeln!(
            out,
            "{:<16} {:>5}  {:<10} {:>6.1} {:>6.1} {:>8} {:>8} {:>8} {:>9}  {:<23}  {}",
            d,
            r,
            verdict,
            100.0 * row.wait_ratio,
            100.0 * row.busy_ratio,
            ms(row.quantiles[0]),
            ms(row.quantiles[1]),
            ms(row.quantiles[2]),
            row.batches,
            stall,
            shares.join(", ")
        );
    }
    for v in seen.into_iter().filter(|v| *v != "-") {
        let _ = writeln!(out, "  {v}: {}", meaning(v));
    }
    out.push_str(&render_job(series));
    out
}

/// One rank of the job on some node, from `granary_job_rank_*`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct JobRow {
    /// Wait quantiles 0.5, 0.95, 0.99 in seconds.
    pub quantiles: [Option<f64>; 3],
    /// The last verdict, when known.
    pub verdict: Option<String>,
    /// Flagged a straggler by the agent.
    pub straggler: bool,
}

/// Every rank of the job by (node, dataset, rank): this agent's and those
/// its peers report in their job status.
pub fn job_rows(series: &[(String, f64)]) -> BTreeMap<(String, String, u32), JobRow> {
    let mut out: BTreeMap<(String, String, u32), JobRow> = BTreeMap::new();
    for (k, v) in series {
        let name = k.split('{').next().unwrap_or("");
        if !name.starts_with("granary_job_rank_") {
            continue;
        }
        let (Some(n), Some(d), Some(r)) = (label(k, "node"), label(k, "dataset"), label(k, "rank"))
        else {
            continue;
        };
        let Ok(r) = r.parse::<u32>() else { continue };
        let row = out.entry((n.to_string(), d.to_string(), r)).or_default();
        match name {
            "granary_job_rank_wait_seconds" => {
                let i = match label(k, "quantile") {
                    Some("0.5") => 0,
                    Some("0.95") => 1,
                    Some("0.99") => 2,
                    _ => continue,
                };
                row.quantiles[i] = Some(*v);
            }
            "granary_job_rank_straggler" => row.straggler = *v > 0.0,
            "granary_job_rank_verdict" if *v > 0.0 => {
                row.verdict = label(k, "verdict").map(String::from)
            }
            _ => {}
        }
    }
    out
}

/// The job's ranks on every node, stragglers marked; empty when the agent
/// exports none (peers off and no rank reported).
pub fn render_job(series: &[(String, f64)]) -> String {
    let rows = job_rows(series);
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nthe job's ranks on every node (from the peers' job status; straggler: p95 above 2x the median rank's p95)"
    );
    let _ = writeln!(
        out,
        "{:<16} {:<16} {:>5}  {:<10} {:>8} {:>8} {:>8}  straggler",
        "node", "dataset", "rank", "verdict", "p50 ms", "p95 ms", "p99 ms",
    );
    for ((n, d, r), row) in &rows {
        let _ = writeln!(
            out,
            "{:<16} {:<16} {:>5}  {:<10} {:>8} {:>8} {:>8}  {}",
            n,
            d,
            r,
            row.verdict.as_deref().unwrap_or("-"),
            ms(row.quantiles[0]),
            ms(row.quantiles[1]),
            ms(row.quantiles[2]),
            if row.straggler { "STRAGGLER" } else { "" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(k: &str, v: f64) -> (String, f64) {
        (k.to_string(), v)
    }

    #[test]
    fn labels_are_read_exactly() {
        let k = r#"granary_rank_verdict{dataset="d",rank="3",verdict="store"}"#;
        assert_eq!(label(k, "rank"), Some("3"));
        assert_eq!(label(k, "verdict"), Some("store"));
        assert_eq!(label(k, "dict"), None);
        assert_eq!(label("granary_x", "rank"), None);
    }

    #[test]
    fn rows_and_the_table_say_the_verdict() {
        let series = vec![
            s(
                r#"granary_rank_verdict{dataset="img",rank="0",verdict="compute"}"#,
                0.0,
            ),
            s(
                r#"granary_rank_verdict{dataset="img",rank="0",verdict="store"}"#,
                1.0,
            ),
            s(
                r#"granary_rank_verdicts_total{dataset="img",rank="0",verdict="store"}"#,
                19.0,
            ),
            s(
                r#"granary_rank_verdicts_total{dataset="img",rank="0",verdict="idle"}"#,
                1.0,
            ),
            s(r#"granary_rank_wait_ratio{dataset="img",rank="0"}"#, 0.42),
            s(
                r#"granary_rank_wait_quantile_seconds{dataset="img",rank="0",quantile="0.95"}"#,
                0.048,
            ),
            s(
                r#"granary_rank_wait_seconds_count{dataset="img",rank="0"}"#,
                1234.0,
            ),
            s(
                r#"granary_rank_stall_seconds_total{dataset="img",rank="0",cause="store"}"#,
                12.5,
            ),
            s(r#"granary_rank_wait_ratio{dataset="img",rank="1"}"#, 0.01),
        ];
        let r = rows(&series);
        let row = &r[&("img".to_string(), 0)];
        assert_eq!(row.verdict.as_deref(), Some("store"));
        assert_eq!(row.verdicts[3], 19.0);
        assert_eq!(row.quantiles, [None, Some(0.048), None]);
        assert_eq!(row.stall, [12.5, 0.0, 0.0]);
        assert_eq!(r[&("img".to_string(), 1)].verdict, None);
        let t = render(&series);
        assert!(t.contains("store 95 %, idle 5 %"), "{t}");
        assert!(t.contains("48.0"), "{t}");
        assert!(t.contains("store: waiting on reads"), "{t}");
        assert!(render(&[]).contains("no loader has reported yet"));
        assert!(!t.contains("on every node"), "no job rows: {t}");
    }

    #[test]
    fn the_jobs_ranks_on_other_nodes_are_listed_with_stragglers() {
        let mut series = vec![s(r#"granary_rank_wait_ratio{dataset="img",rank="0"}"#, 0.1)];
        for (node, rank, p95, straggler) in [("a", 0, 0.02, 0.0), ("b", 1, 0.2, 1.0)] {
            let l = format!(r#"node="{node}",dataset="img",rank="{rank}""#);
            series.push(s(
                &format!(r#"granary_job_rank_wait_seconds{{{l},quantile="0.95"}}"#),
                p95,
            ));
            series.push(s(&format!("granary_job_rank_straggler{{{l}}}"), straggler));
        }
        series.push(s(
            r#"granary_job_rank_verdict{node="b",dataset="img",rank="1",verdict="peer"}"#,
            1.0,
        ));
        let rows = job_rows(&series);
        assert_eq!(rows.len(), 2);
        let b = &rows[&("b".to_string(), "img".to_string(), 1)];
        assert!(b.straggler);
        assert_eq!(b.verdict.as_deref(), Some("peer"));
        let t = render(&series);
        let line = t.lines().find(|l| l.starts_with("b ")).unwrap();
        assert!(line.contains("200.0") && line.ends_with("STRAGGLER"), "{t}");
        let line = t.lines().find(|l| l.starts_with("a ")).unwrap();
        assert!(!line.contains("STRAGGLER"), "{t}");
    }
}
