//! `granary`'s command line: help, version, and `status` against a real
//! metrics endpoint.

use granary_agent::metrics::{Metrics, MetricsServer};
use std::process::{Command, Output};
use std::sync::Arc;

fn granary(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(args)
        .output()
        .expect("run granary")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn help_version_and_bad_arguments() {
    let out = granary(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("granary {}", env!("CARGO_PKG_VERSION"))
    );
    let help = text(&granary(&["--help"]));
    for word in ["status", "demo", "ingest"] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
    let help = text(&granary(&["ingest", "--help"]));
    for word in [
        "--to <URL>",
        "--verify",
        "--resume",
        "--endpoint",
        "--replication",
    ] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
    let out = granary(&["ingest", "/nonexistent"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--to <URL>"), "{}", text(&out));
    let out = granary(&["ingest", "/x", "--to", "s3://b/p", "--concurrency", "0"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--concurrency"), "{}", text(&out));
    let out = granary(&["status", "--metrics", "not-an-address"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("--metrics not-an-address"),
        "{}",
        text(&out)
    );
}

#[test]
fn status_prints_the_agents_counters() {
    let m = Arc::new(Metrics::default());
    m.samples_served.inc_by(1234);
    m.arena_size.set(1 << 30);
    let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
    let out = granary(&["status", "--metrics", &srv.addr().to_string()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let line = |name: &str| {
        t.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{t}"))
            .split_whitespace()
            .last()
            .unwrap()
            .to_owned()
    };
    assert_eq!(line("granary_samples_served_total"), "1234");
    assert_eq!(line("granary_arena_size_bytes"), "1073741824");
    assert!(!t.contains("_bucket"), "{t}");
    drop(srv);
    let out = granary(&["status", "--metrics", "127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cannot reach the agent's metrics"),
        "{}",
        text(&out)
    );
}
