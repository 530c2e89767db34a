//! The systemd units in `systemd/`: `systemd-analyze verify` accepts them
//! without a single warning (it exits 0 on unknown keys and bad values, so
//! its output is checked too), and the hardening settings are there with
//! values that fit the agent. Where `systemd-analyze` cannot run, the test
//! says so loudly (`scripts/setup.sh test` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const UNITS: [&str; 2] = ["granaryd.service", "granary-hugepages.service"];

/// The longest drain the agent does on stop, one after the other: the
/// file reader's (`source/fs/reader.rs`) and a remote store queue's
/// (`source/task_queue.rs`), 30 s each.
const STOP_DRAINS: Duration = Duration::from_secs(60);

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd")
}

/// `key=value` settings of a unit, in order.
fn settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn get<'a>(s: &'a [(String, String)], key: &str) -> Option<&'a str> {
    s.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn seconds(v: &str) -> Duration {
    let n: u64 = v
        .trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("{v}: want whole seconds"));
    Duration::from_secs(n)
}

#[test]
fn the_agent_unit_is_hardened_and_stops_after_its_drains() {
    let text = std::fs::read_to_string(units_dir().join("granaryd.service")).unwrap();
    let s = settings(&text);
    for (key, want) in [
        ("ProtectProc", "invisible"),
        ("SystemCallErrorNumber", "EPERM"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(get(&s, key), Some(want), "{key}");
    }
    assert!(get(&s, "MemoryMax").is_some_and(|v| !v.is_empty() && v != "infinity"));
    let tasks: u32 = get(&s, "TasksMax").unwrap().parse().unwrap();
    assert!((64..=65536).contains(&tasks), "TasksMax={tasks}");
    // Nothing in the agent locks memory.
    assert_eq!(get(&s, "LimitMEMLOCK"), None);
    let stop = seconds(get(&s, "TimeoutStopSec").unwrap());
    assert!(
        stop > STOP_DRAINS,
        "TimeoutStopSec {stop:?} is not above the stop drains {STOP_DRAINS:?}"
    );
}

#[test]
fn systemd_analyze_verifies_the_units_without_a_warning() {
    let probe = Command::new("systemd-analyze").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "******** systemd units: SKIPPED: systemd-analyze cannot run here \
             (scripts/setup.sh test installs it); the units are NOT verified"
        );
        return;
    }
    // The units name the installed binary; point them at the one built here
    // so that verify can check it is executable.
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for unit in UNITS {
        let text = std::fs::read_to_string(units_dir().join(unit)).unwrap();
        let text = text.replace("/usr/local/bin/granaryd", env!("CARGO_BIN_EXE_granaryd"));
        let p = dir.path().join(unit);
        std::fs::write(&p, text).unwrap();
        paths.push(p);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{said}"
    );
    let about_ours: Vec<&str> = said
        .lines()
        .filter(|l| paths.iter().any(|p| l.contains(&*p.to_string_lossy())))
        .collect();
    assert!(
        about_ours.is_empty(),
        "systemd-analyze verify warns about the units:\n{}",
        about_ours.join("\n")
    );
}

#[test]
fn a_broken_unit_is_caught_by_the_same_check() {
    // The check above would pass a unit verify merely warns about, were
    // it not reading the output: prove it sees a bad key.
    if !Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("******** systemd units: SKIPPED: systemd-analyze cannot run here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.service");
    std::fs::write(
        &p,
        "[Service]\nExecStart=/bin/true\nProtectProc=bogus\nTasksMaxx=1\n",
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&p)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("bogus") && said.contains("TasksMaxx"),
        "{said}"
    );
}
