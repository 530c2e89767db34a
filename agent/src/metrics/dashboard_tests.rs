//! The committed Grafana dashboard (`deploy/grafana/granary.json`) asks
//! only for metrics the agent exports.

use super::Metrics;
use std::collections::BTreeSet;

const DASHBOARD: &str = include_str!("../../../deploy/grafana/granary.json");

/// Every metric family the agent's text exposition declares (`# TYPE`).
fn exported() -> BTreeSet<String> {
    let m = Metrics::new();
    m.register_datasets([("d", "fs")]);
    // Labelled families are declared once they have a series: one peer.
    m.peers.set_up("node-b", true);
    declared(&m)
}

/// [`exported`] with a series in every labelled family.
fn exported_with_every_series() -> BTreeSet<String> {
    use crate::peers::transport::LinkTransport;
    let m = Metrics::new();
    m.register_datasets([("d", "fs")]);
    let p = &m.peers;
    p.set_up("node-b", true);
    p.set_slow("node-b", false);
    p.set_transport("node-b", Some(LinkTransport::Tcp));
    p.observe_rtt("node-b", 0.001);
    p.get_failed("reason");
    p.reject("reason");
    p.served_miss("reason");
    p.view("installed");
    p.grace("parked", 1);
    p.assigned
        .get_or_create(&crate::peers::metrics::label("keep", "local"))
        .inc();
    declared(&m)
}

/// The families `m`'s text exposition declares (`# TYPE`).
fn declared(m: &Metrics) -> BTreeSet<String> {
    m.render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// The `granary_*` names in a PromQL expression.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("granary_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every query of the dashboard: panel targets and template variables.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for p in panels {
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        assert!(targets > 0, "panel {} has no query", p["title"]);
    }
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    let exported = exported();
    let mut checked = 0;
    for q in &qs {
        for n in names(q) {
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s).filter(|f| exported.contains(*f)))
                .map_or(n.clone(), String::from);
            assert!(
                exported.contains(&family),
                "the dashboard asks for {n} (in `{q}`), which the agent does not export"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 12,
        "only {checked} metric names found in the dashboard"
    );
    // The verdict panels are there.
    for must in ["granary_rank_verdict", "granary_rank_wait_quantile_seconds"] {
        assert!(qs.iter().any(|q| q.contains(must)), "no panel shows {must}");
    }
}

#[test]
fn names_are_found_and_an_unknown_one_would_fail() {
    assert_eq!(
        names("rate(granary_reads_total[5m]) / granary_x{a=\"b\"}"),
        ["granary_reads_total", "granary_x"]
    );
    assert!(!exported().contains("granary_x"));
    assert!(exported().contains("granary_rank_wait_seconds"));
}

/// `granary_*` words of the docs that are not metrics: crate paths
/// (followed by `::`), C API names, a keyspace prefix, and the benchmarks'
/// contender names and JSON keys.
fn not_a_metric(name: &str, after: &str) -> bool {
    const HEADER: &str = include_str!("../../../client-c/include/granary.h");
    const OTHERS: [&str; 5] = [
        "granary_c",
        "granary_w0",
        "granary_workers",
        "granary_img_per_s",
        "granary_test_",
    ];
    after.starts_with("::") || OTHERS.contains(&name) || names(HEADER).iter().any(|h| h == name)
}

#[test]
fn every_metric_the_docs_name_is_exported() {
    let exported = exported_with_every_series();
    let mut checked = 0;
    for (file, text) in granary_testkit::docs::texts() {
        if file.starts_with("benchmarks") {
            continue; // results, with the contenders' and JSON keys' names
        }
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            for n in names(line) {
                let at = rest.find(&n).map_or(0, |a| a + n.len());
                let after = &rest[at..];
                rest = after;
                if not_a_metric(&n, after) {
                    continue;
                }
                let family = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s).filter(|f| exported.contains(*f)))
                    .unwrap_or(&n);
                // `granary_peer_*`: a prefix.
                let prefix = n.ends_with('_') && exported.iter().any(|e| e.starts_with(&n));
                assert!(
                    prefix || exported.contains(family),
                    "{file}:{}: the docs name {n}, which the agent does not export",
                    i + 1
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 60,
        "only {checked} metric names found in the docs"
    );
}
