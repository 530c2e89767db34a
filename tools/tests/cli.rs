//! `granary`'s command line: help, version, and `status` against a real
//! metrics endpoint.

use granary_agent::metrics::{Metrics, MetricsServer};
use granary_testkit::granaryd::{assert_version, output_text as text};
use std::process::{Command, Output};
use std::sync::Arc;

fn granary(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(args)
        .output()
        .expect("run granary")
}

/// `granary ARGS`, which must fail saying `why`.
fn fails_saying(args: &[&str], why: &str) {
    let out = granary(args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(why), "{}", text(&out));
}

/// The version and the commit the binary was built from (`GRANARY_COMMIT`
/// at build time; the test is built in the same cargo run).
fn expected_version() -> String {
    granary_agent::version::describe(env!("CARGO_PKG_VERSION"), option_env!("GRANARY_COMMIT"))
}

#[test]
fn help_version_and_bad_arguments() {
    assert_version(&granary(&["--version"]), "granary", &expected_version());
    let help = text(&granary(&["--help"]));
    for word in ["status", "demo", "ingest", "secret"] {
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
    fails_saying(&["ingest", "/nonexistent"], "--to <URL>");
    fails_saying(
        &["ingest", "/x", "--to", "s3://b/p", "--concurrency", "0"],
        "--concurrency",
    );
    fails_saying(
        &["status", "--metrics", "not-an-address"],
        "--metrics not-an-address",
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
    fails_saying(
        &["status", "--metrics", "127.0.0.1:1"],
        "cannot reach the agent's metrics",
    );
}

#[test]
fn secret_new_writes_a_private_strong_secret_and_keeps_an_existing_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("job.secret");
    let path = p.to_str().unwrap();
    let out = granary(&["secret", "new", path]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        out.stdout.is_empty(),
        "the secret is not printed: {}",
        text(&out)
    );
    let mode = std::fs::metadata(&p).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let first = std::fs::read_to_string(&p).unwrap();
    granary_agent::config::peer_secret::check(first.trim_end().as_bytes()).unwrap();
    fails_saying(&["secret", "new", path], "--force");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), first);
    let out = granary(&["secret", "new", "--force", path]);
    assert!(out.status.success(), "{}", text(&out));
    assert_ne!(std::fs::read_to_string(&p).unwrap(), first);
    // `-`: to standard output, one line.
    let out = granary(&["secret", "new", "-"]);
    assert!(out.status.success(), "{}", text(&out));
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.len(), 65, "{line:?}");
    granary_agent::config::peer_secret::check(line.trim_end().as_bytes()).unwrap();
    assert!(!dir.path().join("-").exists());
}

#[test]
fn documented_command_lines_exist() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_granary"));
    let checked = granary_testkit::docs::check_documented_command_lines(bin, "granary");
    assert!(
        checked >= 20,
        "only {checked} `granary` command lines in the docs"
    );
}
