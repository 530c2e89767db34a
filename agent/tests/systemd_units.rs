//! The systemd units in `systemd/`: `systemd-analyze verify` accepts them
//! without a single warning (it exits 0 on unknown keys and bad values, so
//! its output is checked too), and the hardening settings are there with
//! values that fit the agent. Where `systemd-analyze` cannot run, the test
//! says so loudly (`scripts/setup.sh test` installs it). Where systemd runs
//! the machine, `granaryd` is started under `systemd-run` with the unit's
//! own service settings and serves a verified epoch; elsewhere (a container
//! without systemd as PID 1) that test says loudly that it did not run.

mod common;

use common::*;
use granary::{Client, SessionOptions};
use granary_testkit::{require, GranarydConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const UNITS: [&str; 2] = ["granaryd.service", "granary-hugepages.service"];

/// The longest drain the agent does on stop, one after the other: the
/// file reader's (`source/fs/reader/mod.rs`) and a remote store queue's
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

/// True when `systemd-analyze` runs here.
fn systemd_analyze_runs() -> bool {
    Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn systemd_analyze_verifies_the_units_without_a_warning() {
    require!(
        systemd_analyze_runs(),
        "systemd-analyze cannot run here (scripts/setup.sh test installs it); the units are NOT verified"
    );
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
    require!(
        systemd_analyze_runs(),
        "systemd-analyze cannot run here (scripts/setup.sh test installs it)"
    );
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

/// Why `systemd-run` cannot start a service here, if it cannot: systemd
/// must be this machine's service manager (sd_booted(): /run/systemd/system
/// exists) and the test must be root (system units).
fn systemd_run_unavailable() -> Option<String> {
    if !Path::new("/run/systemd/system").is_dir() {
        let init = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
        return Some(format!(
            "systemd is not this machine's service manager (PID 1 is {:?})",
            init.trim()
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("system units need root".into());
    }
    let probe = Command::new("systemd-run").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return Some("systemd-run is not installed".into());
    }
    None
}

/// Service settings of the agent's unit that `systemd-run` passes as
/// properties: all but the command lines, the account (the test runs as
/// root: no `granary` user needed), the runtime directory (the test's
/// socket lives in its own directory) and the restart policy (a failure
/// must fail the test, not restart).
fn transient_properties(unit: &str) -> Vec<String> {
    const LEFT_OUT: [&str; 8] = [
        "ExecStart",
        "ExecStartPre",
        "User",
        "Group",
        "RuntimeDirectory",
        "RuntimeDirectoryMode",
        "Restart",
        "RestartSec",
    ];
    let service = unit
        .split("[Service]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [Service] section");
    settings(service)
        .into_iter()
        .filter(|(k, _)| !LEFT_OUT.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// Stops the transient unit when the test ends, however it ends.
struct Unit(String);

impl Drop for Unit {
    fn drop(&mut self) {
        let _ = Command::new("systemctl").args(["stop", &self.0]).output();
        let _ = Command::new("systemctl")
            .args(["reset-failed", &self.0])
            .output();
    }
}

fn unit_property(unit: &str, key: &str) -> String {
    let out = Command::new("systemctl")
        .args(["show", "--value", "-p", key, unit])
        .output()
        .expect("systemctl show");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn granaryd_serves_an_epoch_under_systemd_run_with_the_units_settings() {
    let unavailable = systemd_run_unavailable();
    require!(
        unavailable.is_none(),
        "systemd-run: {}; granaryd was NOT started under systemd on this machine \
         (the unit files are checked by the other tests of this file)",
        unavailable.unwrap_or_default()
    );
    let _w = watchdog_fn!(180);
    // Not under /tmp: the unit has PrivateTmp=yes.
    let d = AgentDir::new(Some(Path::new(env!("CARGO_TARGET_TMPDIR"))), 300, 4_000);
    d.write_config("64MiB", "off", "[metrics]\naddress = \"\"");
    let (dir, sock, spec, config) = (&d.dir, &d.sock, &d.spec, &d.config);
    let unit_text = std::fs::read_to_string(units_dir().join("granaryd.service")).unwrap();
    let name = format!("granary-test-{}.service", std::process::id());
    let mut launcher = vec![
        "systemd-run".to_owned(),
        format!("--unit={name}"),
        "--collect".to_owned(),
    ];
    for p in transient_properties(&unit_text) {
        launcher.extend(["-p".to_owned(), p]);
    }
    // ProtectSystem=strict makes the file system read-only: the socket's
    // directory must be writable.
    launcher.extend([
        "-p".to_owned(),
        format!("ReadWritePaths={}", dir.path().display()),
    ]);
    let out = GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), config)
        .launcher(launcher)
        .output();
    let unit = Unit(name);
    assert!(
        out.status.success(),
        "systemd-run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Type=notify: the start job ends when the agent reports ready.
    wait_for("the unit to be active", Duration::from_secs(60), || {
        unit_property(&unit.0, "ActiveState") == "active"
    });
    let client = Client::connect(sock).expect("connect to the agent under systemd");
    let mut o = SessionOptions::new(DATASET);
    o.batch_size = 16;
    let mut s = client.open_session(&o).expect("open a session");
    let mut seen = Vec::new();
    loop {
        match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => {
                for smp in b.samples() {
                    verify(spec, &smp);
                    seen.push(smp.id());
                }
                s.release(b).expect("release");
            }
            Err(e) if e.code() == granary::ErrorCode::EndOfStream => break,
            Err(e) => panic!("next batch under systemd: {e}"),
        }
    }
    s.close().expect("close");
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..spec.num_files).collect::<Vec<_>>(),
        "one whole epoch"
    );
    let t = Instant::now();
    let stop = Command::new("systemctl")
        .args(["stop", &unit.0])
        .output()
        .expect("systemctl stop");
    assert!(stop.status.success(), "systemctl stop failed");
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the agent took {took:?} to stop with nothing in flight"
    );
    eprintln!(
        "systemd-run: granaryd served an epoch under the unit's settings; stopped in {took:?}"
    );
}
