//! Bad input from every side: dataset files that vanish or break after the
//! agent catalogued them, malformed configuration files, and a loader whose
//! uid the agent does not allow.

mod common;

use common::*;
use granary::ffi;
use granary::{ErrorCode, SessionOptions};
use granary_shm::handshake::Message;
use granary_shm::socket::SeqPacket;
use granary_testkit::GranarydConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Breaks six files of the catalogued dataset: one deleted, one replaced
/// by a directory, one truncated, one grown, one replaced by other bytes of
/// the same size (a later modification time), one made unreadable (which
/// root can still read). Returns the ids whose reads must fail.
fn break_files(agent: &TestAgent) -> BTreeSet<u64> {
    let spec = &agent.spec;
    let gone = 11;
    std::fs::remove_file(spec.path_of(gone)).unwrap();
    let dir = 57;
    std::fs::remove_file(spec.path_of(dir)).unwrap();
    std::fs::create_dir(spec.path_of(dir)).unwrap();
    let short = 123;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(spec.path_of(short))
        .unwrap();
    f.set_len(spec.size_of(short) / 2).unwrap();
    drop(f);
    let grown = 150;
    let mut bytes = std::fs::read(spec.path_of(grown)).unwrap();
    bytes.push(0);
    std::fs::write(spec.path_of(grown), bytes).unwrap();
    let replaced = 170;
    let other = vec![0x5a; spec.size_of(replaced) as usize];
    std::fs::write(spec.path_of(replaced), other).unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(3);
    std::fs::File::options()
        .write(true)
        .open(spec.path_of(replaced))
        .and_then(|f| f.set_modified(later))
        .unwrap();
    let locked = 200;
    std::fs::set_permissions(spec.path_of(locked), std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut bad = BTreeSet::from([gone, dir, short, grown, replaced]);
    if !is_root() {
        bad.insert(locked);
    }
    bad
}

#[test]
fn vanished_and_unreadable_files_are_reported_per_sample() {
    let _wd = watchdog("bad_input files", 240);
    let agent = TestAgent::start(AgentOptions {
        files: 300,
        classes: 5,
        mean_size: 4_000,
        ..AgentOptions::default()
    });
    // The catalog is built; now the files change under the agent.
    let bad = break_files(&agent);
    let n = agent.spec.num_files;

    // Rust API, two epochs (the second retries the failed samples).
    let client = agent.client();
    let mut o = SessionOptions::new(DATASET);
    o.seed = 3;
    o.batch_size = 10;
    o.epoch_count = 2;
    let mut s = client.open_session(&o).unwrap();
    let mut seen: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    let mut error_batches = 0;
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        let mut failed = 0;
        for smp in b.samples() {
            *seen.entry((b.epoch(), smp.id())).or_default() += 1;
            if bad.contains(&smp.id()) {
                // The failure's kind reaches the loader: a deleted file is
                // not found, a truncated or grown one changed length, one
                // replaced by other bytes of its size is corrupt, a
                // directory or an unreadable file is an I/O error.
                let want = match smp.id() {
                    11 => ErrorCode::NotFound,
                    123 | 150 => ErrorCode::ShortRead,
                    170 => ErrorCode::Corrupt,
                    _ => ErrorCode::Io,
                };
                assert_eq!(smp.status(), want.as_i32(), "sample {}", smp.id());
                assert_eq!(smp.len(), 0);
                assert!(smp.as_ptr().is_null());
                failed += 1;
            } else {
                verify(&agent.spec, &smp);
            }
        }
        if failed > 0 {
            error_batches += 1;
            assert_eq!(
                b.error(),
                Some(ErrorCode::Io),
                "a batch with failed samples must say so"
            );
        } else {
            assert_eq!(b.status(), 0);
        }
        s.release(b).unwrap();
    }
    s.close().unwrap();
    for epoch in 0..2 {
        for id in 0..n {
            assert_eq!(
                seen.get(&(epoch, id)),
                Some(&1),
                "epoch {epoch} sample {id}"
            );
        }
    }
    assert_eq!(seen.len() as u64, 2 * n, "a sample outside the dataset");
    assert!(
        error_batches >= bad.len(),
        "each failed sample sits in an error batch"
    );
    let m = &agent.metrics;
    // Each failed sample is read at least once; the second epoch reads it
    // again unless the first epoch's error batch was still on loan.
    assert!(
        m.read_errors.get() >= bad.len() as u64,
        "read errors counted"
    );

    // The C API path: the failing batch comes back with GRANARY_E_IO and
    // its handle, the failed samples with their status and no data.
    let io = ErrorCode::Io.as_i32();
    let path = CString::new(agent.sock.as_os_str().as_bytes()).unwrap();
    let dataset = CString::new(DATASET).unwrap();
    let mut client = std::ptr::null_mut();
    // SAFETY: a NUL-terminated path and a writable out pointer.
    let rc = unsafe { ffi::granary_connect(path.as_ptr(), &mut client) };
    assert_eq!(rc, 0);
    // SAFETY: all-zero is a valid value of this plain C struct; it is
    // initialised by the library right after.
    let mut opts: ffi::GranarySessionOptions = unsafe { std::mem::zeroed() };
    // SAFETY: `opts` is writable.
    assert_eq!(unsafe { ffi::granary_session_options_init(&mut opts) }, 0);
    opts.dataset = dataset.as_ptr();
    opts.seed = 4;
    opts.batch_size = 16;
    let mut session = std::ptr::null_mut();
    // SAFETY: a live client, initialised options whose dataset string
    // outlives the call, a writable out pointer.
    let rc = unsafe { ffi::granary_session_open(client, &opts, &mut session) };
    assert_eq!(rc, 0, "granary_session_open");
    let mut c_seen = BTreeSet::new();
    let mut c_failed = BTreeSet::new();
    loop {
        let mut batch = std::ptr::null_mut();
        // SAFETY: a live session used by this thread only; writable out.
        let rc = unsafe { ffi::granary_next_batch(session, 30_000, &mut batch) };
        if rc == ErrorCode::EndOfStream.as_i32() {
            assert!(batch.is_null());
            break;
        }
        assert!(!batch.is_null(), "granary_next_batch failed with {rc}");
        assert!(rc == 0 || rc == io, "granary_next_batch returned {rc}");
        // SAFETY: a live batch handle.
        assert_eq!(unsafe { ffi::granary_batch_status(batch) }, rc);
        if rc == io {
            // SAFETY: the library returns a NUL-terminated thread-local string.
            let msg = unsafe { CStr::from_ptr(ffi::granary_last_error_message()) };
            assert!(
                msg.to_string_lossy().contains("status"),
                "the error message explains the batch status: {msg:?}"
            );
        }
        // SAFETY: a live batch handle.
        let len = unsafe { ffi::granary_batch_len(batch) };
        let mut failed = 0;
        for i in 0..len {
            // SAFETY: all-zero is a valid GranarySample (null data).
            let mut smp: ffi::GranarySample = unsafe { std::mem::zeroed() };
            // SAFETY: a live batch, an index below its length, writable out.
            assert_eq!(unsafe { ffi::granary_batch_sample(batch, i, &mut smp) }, 0);
            assert!(c_seen.insert(smp.id), "sample {} twice", smp.id);
            if smp.status != 0 {
                let want = match smp.id {
                    11 => ErrorCode::NotFound.as_i32(),
                    123 | 150 => ErrorCode::ShortRead.as_i32(),
                    170 => ErrorCode::Corrupt.as_i32(),
                    _ => io,
                };
                assert_eq!(smp.status, want, "sample {}", smp.id);
                assert!(smp.data.is_null());
                assert_eq!(smp.length, 0);
                c_failed.insert(smp.id);
                failed += 1;
            } else {
                // SAFETY: `data` points at `length` readable bytes of the
                // arena mapping while the batch is on loan.
                let bytes = unsafe { std::slice::from_raw_parts(smp.data, smp.length as usize) };
                let info = granary_tools::synth::verify_sample(bytes).unwrap();
                assert_eq!(info, agent.spec.sample_info(smp.id));
            }
        }
        assert_eq!(
            failed > 0,
            rc == io,
            "batch status and sample statuses agree"
        );
        // SAFETY: the session's own live batch, released once.
        assert_eq!(unsafe { ffi::granary_batch_release(session, batch) }, 0);
    }
    // SAFETY: a live session handle, not used afterwards.
    assert_eq!(unsafe { ffi::granary_session_close(session) }, 0);
    // SAFETY: a live client handle, not used afterwards.
    unsafe { ffi::granary_client_free(client) };
    assert_eq!(c_seen.len() as u64, n);
    assert_eq!(c_failed, bad);

    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

/// Runs `granaryd validate --config FILE` on `toml`; returns (success, stderr + stdout).
fn validate(dir: &Path, name: &str, toml: &str) -> (bool, String) {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    let out = GranarydConfig::args(env!("CARGO_BIN_EXE_granaryd"), ["validate", "--config"])
        .arg(&path)
        .output();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.success(), text)
}

#[test]
fn malformed_configs_are_rejected_naming_the_field() {
    let _wd = watchdog("bad_input config", 240);
    let dir = tempfile::tempdir().unwrap();
    let dataset = "[[dataset]]\nname = \"d\"\nroot = \"/data/d\"\n";
    let cases: &[(&str, String, &[&str])] = &[
        (
            "unknown field",
            format!("[prefetch]\nwindow_batchez = 4\n{dataset}"),
            &["prefetch.window_batchez"],
        ),
        (
            "unknown table",
            format!("[prefetc]\nwindow_batches = 4\n{dataset}"),
            &["prefetc"],
        ),
        (
            "bad size",
            format!("[arena]\nsize = \"12 parsecs\"\n{dataset}"),
            &["arena.size"],
        ),
        (
            "size below the minimum",
            format!("[arena]\nsize = \"1MiB\"\n{dataset}"),
            &["arena.size", "64 MiB"],
        ),
        (
            "initial window larger than the window",
            format!("[prefetch]\nwindow_batches = 16\ninitial_window = 32\n{dataset}"),
            &["prefetch.initial_window", "window_batches"],
        ),
        (
            "window does not fit the arena",
            format!("[arena]\nsize = \"64MiB\"\n[prefetch]\nmax_inflight_reads = 4096\n{dataset}"),
            &["arena.size", "max_inflight_reads"],
        ),
        (
            "arena larger than the machine's memory",
            format!("[arena]\nsize = \"64TiB\"\n{dataset}"),
            &["arena.size", "64 TiB", "MemTotal"],
        ),
        (
            "missing dataset root",
            "[[dataset]]\nname = \"d\"\n".to_string(),
            &["dataset[0].root"],
        ),
        (
            "no dataset",
            "[arena]\nsize = \"1GiB\"\n".to_string(),
            &["dataset"],
        ),
        (
            "socket mode without owner access",
            format!("[socket]\nmode = \"0066\"\n{dataset}"),
            &["socket.mode"],
        ),
        (
            "read timeout not below the client timeout",
            format!("[prefetch]\nread_timeout_ms = 90000\n{dataset}"),
            &["prefetch.read_timeout_ms", "client_timeout_ms"],
        ),
        (
            "wrong type",
            format!("[prefetch]\nwindow_batches = \"many\"\n{dataset}"),
            &["prefetch.window_batches"],
        ),
        ("not TOML", "[arena\nsize = 1\n".to_string(), &["line 1"]),
    ];
    for (i, (what, toml, needles)) in cases.iter().enumerate() {
        let (ok, text) = validate(dir.path(), &format!("bad{i}.toml"), toml);
        assert!(!ok, "{what}: granaryd validate accepted it:\n{toml}");
        for needle in *needles {
            assert!(
                text.contains(needle),
                "{what}: the message does not name {needle:?}:\n{text}"
            );
        }
        assert!(
            text.contains(&format!("bad{i}.toml")),
            "{what}: the file is not named:\n{text}"
        );
        println!("{what}: {}", text.trim());
    }

    // The printed default configuration validates.
    let out =
        GranarydConfig::args(env!("CARGO_BIN_EXE_granaryd"), ["print-default-config"]).output();
    assert!(out.status.success());
    let default = String::from_utf8(out.stdout).unwrap();
    let (ok, text) = validate(dir.path(), "default.toml", &default);
    assert!(ok, "the default config does not validate: {text}");
    assert!(text.contains("OK"), "{text}");
}

const FOREIGN_FN: &str = "foreign_uid_child";
const REFUSED: &str = "GRANARY-FOREIGN-REFUSED";

/// The child role, run as uid/gid 65534: try to open a session twice (raw
/// handshake and libgranary) and check that the agent refused it and sent no
/// descriptor.
#[test]
#[ignore = "child process entry point of a_uid_outside_the_allowlist_gets_no_fds; not a test on its own"]
fn foreign_uid_child() {
    let role = expect_child_role(FOREIGN_FN);
    assert_eq!(role, "foreign-uid");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(uid, 65534, "the child must run as uid 65534");
    let sock = child_socket();
    let before = open_fds();

    let conn = SeqPacket::connect(&sock).expect("foreign: connect (the socket must be reachable)");
    let mut o = SessionOptions::new(DATASET);
    o.batch_size = 4;
    // The agent answers at accept, maybe before the request can be sent.
    let _ = conn.send_message(&Message::OpenSession(o.request()), &[]);
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reply = match conn.recv_message() {
        Err(granary_shm::socket::SocketError::Io(e))
            if e.kind() == std::io::ErrorKind::ConnectionReset =>
        {
            conn.recv_message()
        }
        other => other,
    };
    match reply {
        Ok((Message::Error(e), fds)) => {
            assert_eq!(e.code, ErrorCode::Permission, "{e:?}");
            assert!(
                fds.is_empty(),
                "the agent passed {} fds to a refused loader",
                fds.len()
            );
            assert!(e.message.contains("65534"), "{}", e.message);
        }
        other => panic!("foreign: expected a permission error, got {other:?}"),
    }
    drop(conn);

    let err = granary::Client::connect(&sock)
        .and_then(|c| c.open_session(&o))
        .expect_err("foreign: libgranary opened a session");
    assert_eq!(err.code(), ErrorCode::Permission, "{err}");

    let after = open_fds();
    let memfds: Vec<_> = after.values().filter(|t| t.contains("memfd:")).collect();
    assert!(memfds.is_empty(), "foreign: received {memfds:?}");
    assert_eq!(
        fd_kinds(&before),
        fd_kinds(&after),
        "foreign: descriptors changed"
    );
    println!("{REFUSED}");
}

#[test]
#[ignore = "needs root to run a loader as uid 65534; scripts/test.sh runs it when it runs as root"]
fn a_uid_outside_the_allowlist_gets_no_fds() {
    assert!(
        is_root(),
        "a_uid_outside_the_allowlist_gets_no_fds needs root to run a loader as uid 65534"
    );
    let _wd = watchdog("bad_input uid", 240);
    let agent = TestAgent::start(AgentOptions {
        files: 50,
        classes: 2,
        mean_size: 4_000,
        socket_mode: "0777",
        ..AgentOptions::default()
    });
    // uid 65534 must reach the socket and run a copy of this test binary.
    std::fs::set_permissions(agent.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mode = std::fs::metadata(&agent.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o777, "socket mode");

    let start = Instant::now();
    let out = run_child_as(
        agent.dir.path(),
        FOREIGN_FN,
        "foreign-uid",
        &agent.sock,
        (65534, 65534),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(REFUSED),
        "the foreign loader failed: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let m = &agent.metrics;
    assert!(m.connections_refused.get() >= 2, "refusals counted");
    assert_eq!(m.sessions_opened.get(), 0);
    println!("foreign uid refused twice in {:.1?}", start.elapsed());

    // The agent's own uid still gets a session.
    let stop = std::sync::atomic::AtomicBool::new(true);
    let h = Honest::epochs(1, 8, 1);
    assert_eq!(honest_loader(&agent.sock, &agent.spec, h, &stop), 1);
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}
