//! The `granary ingest` command line against a real S3 server (SeaweedFS,
//! `granary_testkit::seaweed`) and a fake CQL cluster (`scylla-proxy`
//! nodes, `granary_testkit::fake_cql`): what it prints, what it writes,
//! and how it names bad input. The ingest library itself is tested with
//! the sources in `agent/tests/s3_source.rs` and `cql_source.rs`.

use granary_testkit::dataset::synth;
use granary_testkit::fake_cql::{self, FakeCluster, Tables};
use granary_testkit::seaweed::{Seaweed, BUCKET};
use std::process::Command;
use std::time::Instant;

#[test]
fn the_s3_ingest_command_uploads_verifies_resumes_and_fails_clearly() {
    let weed = Seaweed::start();
    let tmp = tempfile::tempdir().unwrap();
    let spec = synth(tmp.path(), 300, 7, 20_000);
    // `granary ingest` of the dataset to `to` through SeaweedFS, with
    // `extra` arguments and `env` over SeaweedFS's credentials.
    let ingest = |to: &str, extra: &[&str], env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_granary"))
            .arg("ingest")
            .arg(&spec.root)
            .args(["--to", to, "--endpoint"])
            .arg(weed.endpoint())
            .args(extra)
            .envs(weed.env())
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };

    // `granary ingest --verify` uploads everything and reads it back.
    let t0 = Instant::now();
    let out = ingest(
        &format!("s3://{BUCKET}/datasets/synth"),
        &["--concurrency", "16", "--verify"],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("300 uploaded") && text.contains("0 skipped"),
        "{text}"
    );
    assert!(text.contains("verify: OK, 300 objects"), "{text}");
    eprintln!(
        "ingest --verify of 300 files: {:.2} s",
        t0.elapsed().as_secs_f64()
    );

    // `--resume` finds everything in place.
    let out = ingest(
        &format!("s3://{BUCKET}/datasets/synth/"),
        &["--resume"],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("0 uploaded") && text.contains("300 skipped"),
        "{text}"
    );

    // Bad credentials: a clear failure, non-zero exit.
    let out = ingest(
        &format!("s3://{BUCKET}/other"),
        &[],
        &[("AWS_SECRET_ACCESS_KEY", "wrong")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("upload failed for 300 of 300 files") && err.contains("403"),
        "{err}"
    );
}

#[test]
fn the_ingest_command_writes_verifies_resumes_and_names_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), 30, 3, 1200);
    let fake = FakeCluster::start(Tables::empty());
    let to = format!("cql://{}/{}", fake.addrs[0], fake_cql::KS);
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_granary"))
            .arg("ingest")
            .arg(&spec.root)
            .args(extra)
            .env_remove("GRANARY_CQL_PASSWORD")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = run(&["--to", &to, "--verify"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("30 written") && out.contains("verify: OK, 30 rows"),
        "{out}"
    );
    let (ok, out) = run(&["--to", &to, "--resume"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 written") && out.contains("30 skipped"),
        "{out}"
    );
    assert_eq!(fake.shared.tables.lock().unwrap().samples.len(), 30);

    let (ok, out) = run(&["--to", "cql://127.0.0.1:9042/Bad-Name"]);
    assert!(!ok);
    assert!(out.contains("keyspace \"Bad-Name\""), "{out}");
    let (ok, out) = run(&["--to", &to, "--username", "u"]);
    assert!(!ok);
    assert!(out.contains("GRANARY_CQL_PASSWORD"), "{out}");
    let (ok, out) = run(&["--to", &to, "--replication", "dc1:0"]);
    assert!(!ok);
    assert!(out.contains("--replication"), "{out}");
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}
