//! `granaryd`'s command line: help, version, bad arguments, and the log
//! formats of `run` (a real process, stopped with SIGTERM).

use granary_testkit::dataset::synth;
use granary_testkit::granaryd::{assert_version, output_text as text};
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use std::path::Path;
use std::process::Output;

fn granaryd(args: &[&str]) -> Output {
    GranarydConfig::args(env!("CARGO_BIN_EXE_granaryd"), args).output()
}

/// The version and the commit the binary was built from (`GRANARY_COMMIT`
/// at build time; the test is built in the same cargo run).
fn expected_version() -> String {
    granary_agent::version::describe(env!("CARGO_PKG_VERSION"), option_env!("GRANARY_COMMIT"))
}

#[test]
fn help_version_and_bad_arguments() {
    assert_version(&granaryd(&["--version"]), "granaryd", &expected_version());
    let out = granaryd(&["--help"]);
    assert!(out.status.success());
    let help = text(&out);
    for word in ["run", "validate", "print-default-config", "--log-format"] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
    let out = granaryd(&["run"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--config <FILE>"), "{}", text(&out));
    let out = granaryd(&["serve"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("unrecognized subcommand"),
        "{}",
        text(&out)
    );
    let out = granaryd(&["--log-format", "yaml", "run", "--config", "x.toml"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("\"yaml\""), "{}", text(&out));
}

/// Starts `granaryd run` on a small dataset with `extra` arguments and
/// environment, waits for its socket, stops it; returns its stderr.
fn run_and_stop(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> String {
    let data = dir.join("synth");
    if !data.exists() {
        synth(dir, 20, 4, 2_000);
    }
    let sock = dir.join("granary.sock");
    let _ = std::fs::remove_file(&sock);
    let config = dir.join("granaryd.toml");
    std::fs::write(
        &config,
        format!(
            "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\n[socket]\npath = \"{}\"\n\
             [prefetch]\nmax_inflight_reads = 32\n[metrics]\naddress = \"\"\n[[dataset]]\nname = \"synth\"\nroot = \"{}\"\n",
            sock.display(),
            data.display()
        ),
    )
    .unwrap();
    let mut c = GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &config)
        .global_args(extra)
        .log(Log::Piped)
        .ready_on_socket_file(&sock);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let mut agent = GranarydProcess::start(c);
    let status = agent.stop();
    assert!(status.success(), "{status}");
    agent.take_stderr()
}

#[test]
fn run_logs_text_by_default_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let log = run_and_stop(dir.path(), &[], &[]);
    let serving = log
        .lines()
        .find(|l| l.contains("serving on"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(serving.contains("INFO"), "{serving}");
    assert!(log.lines().any(|l| l.ends_with("stopped")), "{log}");

    let log = run_and_stop(dir.path(), &["--log-format", "json"], &[]);
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 2, "{log}");
    for l in &lines {
        assert!(l.starts_with('{') && l.ends_with('}'), "not JSON: {l}");
        assert!(l.contains("\"level\":\""), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains("serving on")), "{log}");

    // The environment picks the format too; RUST_LOG filters.
    let log = run_and_stop(dir.path(), &[], &[("GRANARY_LOG_FORMAT", "json")]);
    assert!(log.lines().all(|l| l.starts_with('{')), "{log}");
    let log = run_and_stop(dir.path(), &[], &[("RUST_LOG", "error")]);
    assert!(!log.contains("serving on"), "{log}");
}

#[test]
fn validate_warns_when_a_config_holding_secrets_is_readable_by_others() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("granaryd.toml");
    std::fs::write(
        &config,
        "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\n[prefetch]\nmax_inflight_reads = 32\n\
         [[dataset]]\nname = \"remote\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"\"\n\
         access_key_id = \"AKID\"\nsecret_access_key = \"do-not-print-me\"\n",
    )
    .unwrap();
    let path = config.to_str().unwrap();
    for (mode, warns) in [(0o644, true), (0o640, true), (0o600, false)] {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = granaryd(&["validate", "--config", path]);
        assert!(out.status.success(), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.contains("warning") && err.contains("dataset[0].secret_access_key"),
            warns,
            "mode {mode:o}: {err}"
        );
        assert!(!text(&out).contains("do-not-print-me"), "{}", text(&out));
    }
}

#[test]
fn validate_refuses_a_weak_job_secret_and_takes_a_generated_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("granaryd.toml");
    let secret = dir.path().join("job.secret");
    let write = |peers: &str| {
        std::fs::write(
            &config,
            format!(
                "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\n[prefetch]\nmax_inflight_reads = 32\n\
                 [peers]\nmembership = \"session\"\n{peers}\n\
                 [[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n"
            ),
        )
        .unwrap();
    };
    let path = config.to_str().unwrap();
    write("secret = \"hunter2hunter2\"");
    let out = granaryd(&["validate", "--config", path]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("peers.secret") && t.contains("too weak") && t.contains("granary secret new"),
        "{t}"
    );
    assert!(!t.contains("hunter2"), "the secret is never printed: {t}");
    write(&format!("secret_file = \"{}\"", secret.display()));
    std::fs::write(&secret, "x\n").unwrap();
    let out = granaryd(&["validate", "--config", path]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("peers.secret_file"), "{}", text(&out));
    let good = granary_agent::config::peer_secret::generate().unwrap();
    std::fs::write(&secret, format!("{good}\n")).unwrap();
    let out = granaryd(&["validate", "--config", path]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn documented_command_lines_exist() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_granaryd"));
    let checked = granary_testkit::docs::check_documented_command_lines(bin, "granaryd");
    assert!(
        checked >= 20,
        "only {checked} `granaryd` command lines in the docs"
    );
}
