//! Running a benchmark's smoke variant from a test: its standard output
//! collected, and the process sent SIGTERM if it outlives a limit (the
//! benchmarks bound their own waits; this keeps a hang from holding the
//! test run).

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// Runs `cmd` with its standard output captured; SIGTERM after `limit`.
/// Returns its exit status and what it printed (printed again, so that the
/// test's output shows it).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> (ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {:?}: {e}", cmd.get_program()));
    let pid = child.id();
    let guard = std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read the benchmark's output");
    let status = child.wait().expect("wait for the benchmark");
    drop(guard);
    print!("{stdout}");
    (status, stdout)
}

/// The result line of a benchmark's output: its last line, asserted to be
/// the JSON object of benchmark `bench` (`{"bench":"BENCH",...`).
pub fn result_line<'a>(stdout: &'a str, bench: &str) -> &'a str {
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("{{\"bench\":\"{bench}\"")),
        "last line is not the result: {last}"
    );
    last
}
