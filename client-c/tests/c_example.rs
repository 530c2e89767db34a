//! Compiles `examples/consume.c` with the system C compiler against the
//! libgranary that this `cargo test` built (static and shared), and runs it
//! against the fixture agent.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use granary::ErrorCode;
use support::{plan_epoch, watchdog, Behaviour, Dataset, Fixture, WATCHDOG};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding the libgranary built with this test binary: the
/// test runs from `<target>/release/deps`, where Cargo also writes the
/// library's staticlib and cdylib; after `cargo build` they are uplifted to
/// `<target>/release` too.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory").to_owned();
    let candidates = [
        deps.clone(),
        deps.parent().map(Path::to_owned).unwrap_or_default(),
        crate_dir().join("../target/release"),
    ];
    for dir in &candidates {
        if dir.join("libgranary.a").is_file() && dir.join("libgranary.so").is_file() {
            return dir.clone();
        }
    }
    panic!(
        "libgranary.a / libgranary.so not found in {candidates:?}; \
         run `cargo test --release -p granary-client` (it builds them)"
    );
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn check(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// libgranary.so exports its C API and nothing else (`build.rs` hides what
/// the crates linked into it export, such as crc-fast's C interface).
#[test]
fn the_shared_library_exports_only_its_c_api() {
    let lib = lib_dir().join("libgranary.so");
    let out = run(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib));
    check("nm -D libgranary.so", &out);
    let symbols: Vec<String> = stdout(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    assert!(
        symbols.iter().any(|s| s == "granary_session_open"),
        "the C API is missing from {symbols:?}"
    );
    let foreign: Vec<&String> = symbols
        .iter()
        .filter(|s| !s.starts_with("granary_"))
        .collect();
    assert!(foreign.is_empty(), "libgranary.so exports {foreign:?}");
}

/// Builds consume.c twice: against libgranary.a and against libgranary.so.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let libs = lib_dir();
    let include = crate_dir().join("include");
    let source = crate_dir().join("examples/consume.c");
    let flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"];

    let static_bin = dir.join("consume-static");
    let out = run(Command::new(cc())
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg(libs.join("libgranary.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&static_bin));
    check("compiling consume.c against libgranary.a", &out);

    let shared_bin = dir.join("consume-shared");
    let out = run(Command::new(cc())
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .args(["-lgranary", "-o"])
        .arg(&shared_bin));
    check("compiling consume.c against libgranary.so", &out);
    (static_bin, shared_bin)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// consume.c (`bin`) run with the options `opts`, the agent's socket
/// `sock`, then `args` (the dataset and the numbers).
fn consume(bin: &Path, opts: &[&str], sock: &Path, args: &[&str]) -> Output {
    run(Command::new(bin).args(opts).arg(sock).args(args))
}

/// Asserts that the summary line `out` printed passes `ok`.
#[track_caller]
fn assert_summary(out: &Output, ok: impl Fn(&str) -> bool) {
    let summary = stdout(out);
    assert!(ok(&summary), "{summary}");
}

/// The summary line consume prints for a clean run.
#[allow(clippy::too_many_arguments)]
fn expected_summary(
    ds: &Dataset,
    batch: u32,
    epochs: u32,
    seed: u64,
    rank: u32,
    world: u32,
) -> String {
    let (mut batches, mut samples, mut bytes) = (0u64, 0u64, 0u64);
    for epoch in 0..epochs {
        for ids in plan_epoch(ds.samples, seed, epoch, batch, rank, world, false) {
            batches += 1;
            samples += ids.len() as u64;
            bytes += ids.iter().map(|&id| u64::from(ds.len_of(id))).sum::<u64>();
        }
    }
    format!("batches={batches} samples={samples} bytes={bytes} errors=0 mismatches=0\n")
}

#[test]
fn c_example_reads_and_verifies_every_sample() {
    let _w = watchdog("c_example_reads_and_verifies_every_sample", WATCHDOG);
    let tmp = tempfile::tempdir().unwrap();
    let (static_bin, shared_bin) = build(tmp.path());

    let ds = Dataset::new("c-example", 257);
    let flaky = Dataset::new("c-flaky", 40)
        .max_len(1000)
        .with(Behaviour::IoErrorAt(1));
    let scribbled = Dataset::new("c-scribbled", 30)
        .max_len(700)
        .with(Behaviour::Scribble(17));
    let bad_crc = Dataset::new("c-bad-crc", 12)
        .max_len(300)
        .with(Behaviour::BadCrc);
    let kinds = Dataset::new("c-kinds", 24)
        .max_len(400)
        .with(Behaviour::SampleFailuresAt(0));
    let fx = Fixture::start(vec![ds.clone(), flaky, scribbled, bad_crc, kinds]);
    let sock = fx.socket_path().to_owned();

    for bin in [&static_bin, &shared_bin] {
        let out = consume(bin, &["-f"], &sock, &["c-example", "16", "2", "42"]);
        check("consume", &out);
        assert_eq!(stdout(&out), expected_summary(&ds, 16, 2, 42, 0, 1));
    }
    assert_eq!(
        expected_summary(&ds, 16, 2, 42, 0, 1).split(' ').next(),
        Some("batches=34")
    );

    // Rank 1 of 3, one epoch.
    let out = consume(
        &static_bin,
        &["-f"],
        &sock,
        &["c-example", "10", "1", "9", "1", "3"],
    );
    check("consume rank 1 of 3", &out);
    assert_eq!(stdout(&out), expected_summary(&ds, 10, 1, 9, 1, 3));

    // A batch the agent could not fill is counted, released, and fails the run.
    let out = consume(&static_bin, &["-f"], &sock, &["c-flaky", "8"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_summary(&out, |s| s.starts_with("batches=5 samples=32 "));
    assert_summary(&out, |s| s.contains(" errors=1 mismatches=0"));

    // Each failed sample reports its own kind: code and text.
    let out = consume(&static_bin, &["-f"], &sock, &["c-kinds", "6"]);
    assert_eq!(out.status.code(), Some(1));
    assert_summary(&out, |s| s.contains(" errors=6 mismatches=0"));
    let err = String::from_utf8_lossy(&out.stderr);
    for kind in ErrorCode::SAMPLE_FAILURES {
        let line = format!("failed: {} ({})", kind.message(), kind.as_i32());
        assert!(err.contains(&line), "{line:?} not in:\n{err}");
    }

    // The checks are real: a wrong byte under a matching CRC fails the
    // content check, a wrong CRC fails even without it.
    let out = consume(&static_bin, &["-f"], &sock, &["c-scribbled", "8"]);
    assert_eq!(out.status.code(), Some(1));
    assert_summary(&out, |s| s.ends_with(" errors=0 mismatches=1\n"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample 17 "));
    let out = consume(&static_bin, &[], &sock, &["c-scribbled", "8"]);
    check("consume without the content check", &out);
    // A wrong CRC: libgranary's own check turns every sample into a
    // CORRUPT failure (each batch says so)...
    let out = consume(&static_bin, &[], &sock, &["c-bad-crc", "4"]);
    assert_eq!(out.status.code(), Some(1));
    assert_summary(&out, |s| {
        s.starts_with("batches=3 samples=0 bytes=0 ") && s.ends_with(" errors=3 mismatches=0\n")
    });
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(ErrorCode::Corrupt.message()),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... and with that check off (-n), the program's own CRC check
    // catches every sample.
    let out = consume(&static_bin, &["-n"], &sock, &["c-bad-crc", "4"]);
    assert_eq!(out.status.code(), Some(1));
    assert_summary(&out, |s| s.ends_with(" errors=0 mismatches=12\n"));

    // An unknown dataset is a session error with the agent's words.
    let out = consume(&static_bin, &[], &sock, &["imagenet"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no such dataset"), "{err}");
    assert!(err.contains("\"imagenet\""), "{err}");

    // Bad usage.
    let out = consume(&static_bin, &[], &sock, &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn header_compiles_as_strict_c_and_as_cpp() {
    let tmp = tempfile::tempdir().unwrap();
    let unit = tmp.path().join("unit.c");
    std::fs::write(
        &unit,
        "#include \"granary.h\"\n\
         #include \"granary.h\"\n\
         int main(void) { return granary_abi_version() == GRANARY_ABI_VERSION ? 0 : 1; }\n",
    )
    .unwrap();
    let include = crate_dir().join("include");
    let out = run(Command::new(cc())
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(&include)
        .arg(&unit));
    check("compiling granary.h as C99", &out);

    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    match Command::new(&cxx)
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-x",
            "c++",
            "-I",
        ])
        .arg(&include)
        .arg(&unit)
        .output()
    {
        Ok(out) => check("compiling granary.h as C++", &out),
        Err(e) => eprintln!("skipping the C++ check: {cxx} is not available ({e})"),
    }
}
