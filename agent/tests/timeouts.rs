//! Timeouts, with real processes and real files: a loader that stops
//! (SIGSTOP) loses its session after `sessions.client_timeout_ms` and its
//! pins come back while another loader keeps reading; a loader waiting on a
//! stopped `granaryd` fails with "agent unresponsive" within a few
//! heartbeats; a file read that never completes fails its sample with
//! `Timeout` after `prefetch.read_timeout_ms` while the others are served.
//!
//! The stopped loader is a child process running this same test binary in
//! the `hold-child` role (see [`timeouts_hold_child`]).

mod common;

use common::*;
use granary::{Client, ErrorCode, SessionOptions};
use granary_agent::config::Config;
use granary_agent::dataset::Dataset;
use granary_agent::source::{Catalog, FsSource};
use granary_testkit::{GranarydConfig, GranarydProcess};
use granary_tools::synth::SynthSpec;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_FN: &str = "timeouts_hold_child";
const ROLE: &str = "hold-child";
/// Printed by the child once it holds batches on loan.
const HOLDING: &str = "GRANARY-CHILD-HOLDING";
const HEARTBEAT_MS: u64 = 200;
const CLIENT_TIMEOUT_MS: u64 = 1500;
const READ_TIMEOUT_MS: u64 = 500;

/// The `[sessions]` table of every test here.
fn timeouts_toml() -> String {
    format!("[sessions]\nheartbeat_ms = {HEARTBEAT_MS}\nclient_timeout_ms = {CLIENT_TIMEOUT_MS}\n")
}

/// An engine configuration with the short timeouts above, serving `data` as
/// the dataset `synth`.
fn engine_config(sock: &Path, data: &Path) -> Config {
    Config::from_toml_str(&format!(
        "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\npopulate = false\n\
         [socket]\npath = \"{}\"\n[prefetch]\nmax_inflight_reads = 32\nread_retries = 1\n\
         retry_backoff_ms = 5\nread_timeout_ms = {READ_TIMEOUT_MS}\n\
         sample_deadline_ms = {READ_TIMEOUT_MS}\n[metrics]\naddress = \"\"\n{}\
         [[dataset]]\nname = \"{DATASET}\"\nroot = \"{}\"\n",
        sock.display(),
        timeouts_toml(),
        data.display()
    ))
    .expect("test config")
}

/// A synthetic dataset of `files` files in a new temporary directory:
/// (directory, data folder, socket path, spec).
fn synth_dir(files: u64) -> (tempfile::TempDir, PathBuf, PathBuf, SynthSpec) {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let spec = granary_testkit::dataset::synth_at(&data, files, 4, 4_000);
    let sock = dir.path().join("granary.sock");
    (dir, data, sock, spec)
}

fn signal(child: &Child, sig: i32) {
    let pid = i32::try_from(child.id()).expect("pid fits in i32");
    // SAFETY: kill(2) of a child this test started and has not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Continues and kills a stopped child, and reaps it.
fn end_child(mut child: Child) {
    signal(&child, libc::SIGCONT);
    let _ = child.kill();
    let _ = child.wait();
}

/// The child role: open a session, take three batches without releasing
/// them, announce it, then hold them until stopped and killed.
#[test]
#[ignore = "child process entry point"]
fn timeouts_hold_child() {
    let role = expect_child_role(CHILD_FN);
    assert_eq!(role, ROLE);
    let client = Client::connect(child_socket()).expect("child: connect");
    let mut o = SessionOptions::new(DATASET);
    o.seed = 3;
    o.batch_size = 8;
    o.epoch_count = 1;
    let mut s = client.open_session(&o).expect("child: open session");
    let mut held = Vec::new();
    while held.len() < 3 {
        held.push(
            s.next_batch(Some(Duration::from_secs(30)))
                .expect("child: next_batch"),
        );
    }
    println!("{HOLDING}");
    std::thread::sleep(Duration::from_secs(120));
    panic!("child: nobody stopped me within two minutes");
}

#[test]
fn a_stopped_loader_loses_its_session_and_its_pins_come_back() {
    let _wd = watchdog("a_stopped_loader_loses_its_session", 120);
    let (dir, data, sock, spec) = synth_dir(400);
    let cfg = engine_config(&sock, &data);
    let agent = TestAgent::start_custom(dir, data, sock, spec, cfg, Vec::new());
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    let m = &agent.metrics;

    let mut child = child_command(CHILD_FN, ROLE, &agent.sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the loader child");
    let _lines = wait_for_line(&mut child, HOLDING, "the loader child");
    assert!(
        agent.acct().pinned > 0,
        "the child's batches are not pinned"
    );

    // An honest loader that keeps reading throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let honest = agent.spawn_honest(
        Honest::until_stopped(11, 16, Duration::from_millis(2)),
        &stop,
    );

    signal(&child, libc::SIGSTOP);
    let stopped = Instant::now();
    wait_for(
        "the stopped loader's session to time out",
        Duration::from_millis(CLIENT_TIMEOUT_MS + 5_000),
        || m.sessions_timed_out.get() >= 1,
    );
    let took = stopped.elapsed();
    // The loader beat its word until it was stopped: the session may end no
    // earlier than a client timeout after its last beat.
    assert!(
        took + Duration::from_millis(HEARTBEAT_MS * 2) >= Duration::from_millis(CLIENT_TIMEOUT_MS),
        "the session ended after only {took:?}"
    );
    assert_eq!(m.sessions_timed_out.get(), 1);
    assert!(
        !honest.is_finished(),
        "the honest loader stopped while the other session timed out"
    );
    stop.store(true, Ordering::Relaxed);
    let epochs = honest.join().expect("honest loader");
    assert!(epochs >= 1);

    let after = agent.wait_idle(Duration::from_secs(10));
    after.assert_balanced();
    assert_eq!(after.pinned, 0, "{after:?}");
    assert_eq!(
        m.sessions_timed_out.get(),
        1,
        "the honest session timed out"
    );
    end_child(child);
    println!("a stopped loader's session ended {took:?} after SIGSTOP");
    agent.stop();
}

#[test]
fn a_loader_waiting_on_a_stopped_agent_fails_within_a_few_heartbeats() {
    let _wd = watchdog("a_loader_waiting_on_a_stopped_agent", 120);
    let d = AgentDir::with(None, |spec| {
        spec.num_files = 200;
        spec.mean_size = 2_000;
        spec.num_classes = 4;
    });
    d.write_config(
        "64MiB",
        "off",
        &format!(
            "read_timeout_ms = {READ_TIMEOUT_MS}\nsample_deadline_ms = {READ_TIMEOUT_MS}\n\
             [metrics]\naddress = \"\"\n{}",
            timeouts_toml()
        ),
    );
    let sock = d.sock.clone();
    // Ready once a client connects (the socket file exists from bind(2)
    // on, a moment before listen(2)).
    let mut agent = GranarydProcess::start(
        GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &d.config)
            .ready_when(move || Client::connect(&sock).is_ok()),
    );
    let client = Client::connect(&d.sock).expect("connect to granaryd");
    let mut o = SessionOptions::new("synth");
    o.batch_size = 8;
    o.epoch_count = 1000;
    // Report the stopped agent instead of waiting for it to come back.
    o.resume_timeout = None;
    let mut s = client.open_session(&o).expect("open session");
    let first = s
        .next_batch(Some(Duration::from_secs(30)))
        .expect("a batch from the running agent");
    assert_eq!(first.status(), 0);
    s.release(first).expect("release");

    agent.signal("STOP");
    let stopped = Instant::now();
    // Batches already ready may still be taken; then the wait must fail.
    let err = loop {
        match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => s.release(b).expect("release"),
            Err(e) => break e,
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "batches kept coming from a stopped agent"
        );
    };
    let took = stopped.elapsed();
    let bound = Duration::from_millis(5 * HEARTBEAT_MS + 1_000);
    assert_eq!(err.code(), ErrorCode::Disconnected, "{err}");
    assert!(err.to_string().contains("agent unresponsive"), "{err}");
    assert!(
        took < bound,
        "the loader noticed after {took:?} (bound {bound:?})"
    );
    println!("a stopped agent was noticed {took:?} after SIGSTOP: {err}");
    drop(s);
    drop(client);
    agent.signal("CONT");
    let status = agent.stop();
    assert!(status.success(), "granaryd did not stop cleanly: {status}");
}

#[test]
fn a_read_that_never_completes_fails_its_sample_with_timeout() {
    let _wd = watchdog("a_read_that_never_completes", 120);
    const FILES: u64 = 64;
    let (dir, data, sock, spec) = synth_dir(FILES);
    let catalog = Catalog::from_dir(&data).expect("catalog");
    // One sample's file becomes a FIFO that nothing ever writes to, held
    // open for reading and writing so that opening it does not block: a
    // read of it never completes.
    let hung_id = 17;
    let hung_path = catalog.get(hung_id).expect("sample 17").path.clone();
    std::fs::remove_file(&hung_path).expect("remove the sample file");
    mkfifo(&hung_path);
    let _held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&hung_path)
        .expect("open the FIFO");

    // The catalog is built already; the configured `synth` dataset (from
    // which the FIFO is skipped) is not read here, the source below is.
    let cfg = engine_config(&sock, &data);
    let source = FsSource::new(
        catalog,
        32,
        Duration::from_millis(cfg.prefetch.read_timeout_ms),
    )
    .expect("source");
    let ds = Dataset::from_source("fifo", Box::new(source));
    let agent = TestAgent::start_custom(dir, data, sock, spec.clone(), cfg, vec![ds]);

    let client = agent.client();
    let mut o = SessionOptions::new("fifo");
    o.batch_size = 8;
    o.epoch_count = 1;
    let started = Instant::now();
    let mut s = client.open_session(&o).expect("open session");
    let mut statuses = HashMap::new();
    let mut hung_seen_at = None;
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        // A batch with a failed sample is an error batch; its samples say
        // which failed and why.
        let has_hung = b.samples().any(|smp| smp.id() == hung_id);
        let want = if has_hung { ErrorCode::Io.as_i32() } else { 0 };
        assert_eq!(b.status(), want, "batch {} status", b.index());
        for smp in b.samples() {
            if smp.id() == hung_id {
                hung_seen_at = Some(started.elapsed());
            } else {
                verify(&spec, &smp);
            }
            assert!(statuses.insert(smp.id(), smp.error()).is_none());
        }
        s.release(b).expect("release");
    }
    s.close().expect("close");
    assert_eq!(statuses.len() as u64, FILES, "not every sample delivered");
    assert_eq!(statuses.get(&hung_id), Some(&Some(ErrorCode::Timeout)));
    assert_eq!(
        statuses.values().filter(|e| e.is_some()).count(),
        1,
        "only the FIFO fails"
    );
    let at = hung_seen_at.expect("the FIFO's sample was delivered");
    assert!(
        at >= Duration::from_millis(READ_TIMEOUT_MS),
        "the FIFO's sample failed after only {at:?}"
    );
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    println!("the never-completing read failed its sample after {at:?}");
    agent.stop();
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}
