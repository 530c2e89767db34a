//! A `[[mixture]]` of a CQL dataset (on the `kassandra` crate's CQL
//! emulator, which the test starts) and a files dataset, weights 0.75 and
//! 0.25, opened by name from Rust and from C (`examples/consume.c`, built
//! against the libgranary of this build): every batch of 32 takes 24 CQL
//! samples and 8 files samples, each sample's bytes are its dataset's, and
//! the C loader receives the same samples in the same order as the Rust one.

mod common;
mod common_kassandra;

use common::{
    assert_two_source_batches, bytes_by_id, epochs, store_config, watchdog_fn, TestAgent,
};
use common_kassandra::Kassandra;
use granary_agent::source::cql::CqlSettings;
use granary_testkit::cc::cc_against_libgranary;
use granary_testkit::require;
use granary_tools::ingest::cql::{self as ingest_cql, CqlIngestOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Samples of each dataset.
const FILES: u64 = 120;
const KS: &str = "granary_mix";
/// The batch and seed of `common::epochs`.
const BATCH: u32 = 32;
const SEED: u64 = 5;

/// The folder holding the libgranary.so of this build (`target/release`,
/// beside this test's `deps/`), when the workspace build made it.
fn lib_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let release = exe.parent()?.parent()?.to_path_buf();
    release.join("libgranary.so").is_file().then_some(release)
}

/// `examples/consume.c` built against the libgranary in `lib`.
fn build_consume(lib: &Path, out: &Path) -> PathBuf {
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client-c");
    let exe = out.join("consume");
    let mut cc = cc_against_libgranary(
        &client.join("include"),
        &client.join("examples/consume.c"),
        lib,
        &exe,
    );
    let status = cc
        .args(["-lpthread", "-ldl", "-lm"])
        .status()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cc.get_program()));
    assert!(status.success(), "building consume.c: {status}");
    exe
}

#[test]
fn a_mixture_of_cql_and_files_opens_by_name_from_rust_and_from_c() {
    let _w = watchdog_fn!(180);
    let lib = lib_dir();
    require!(
        lib.is_some(),
        "libgranary.so beside this test's deps/ (`cargo build --release --workspace` builds it)"
    );
    let lib = lib.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cql_set = granary_testkit::dataset::synth_at(&dir.path().join("cql"), FILES, 4, 3_000);
    let files_set = granary_testkit::dataset::synth_at(&dir.path().join("files"), FILES, 4, 2_000);
    let k = Kassandra::start();
    let mut settings = CqlSettings::new(vec![k.addr.to_string()], KS);
    settings.request_timeout = Duration::from_secs(5);
    let r = ingest_cql::ingest(
        &CqlIngestOptions::new(&cql_set.root, settings),
        |_, _, _, _| {},
    )
    .unwrap_or_else(|e| panic!("ingest: {e}"));
    assert_eq!(r.uploaded, FILES);

    let sock = dir.path().join("granary.sock");
    let datasets = format!(
        "[[dataset]]\nname = \"cql\"\nkind = \"cql\"\nhosts = [\"{host}\"]\nkeyspace = \"{KS}\"\n\
         max_inflight = 64\n\
         [[dataset]]\nname = \"files\"\nroot = \"{files}\"\n\
         [[mixture]]\nname = \"mix\"\nepoch_samples = 160\n\
         [[mixture.source]]\ndataset = \"cql\"\nweight = 0.75\n\
         [[mixture.source]]\ndataset = \"files\"\nweight = 0.25\n",
        host = k.addr,
        files = files_set.root.display()
    );
    let cfg = store_config(&sock, "64MiB", "window_batches = 8", &datasets);
    let agent = TestAgent::start_custom(
        dir,
        cql_set.root.clone(),
        sock.clone(),
        cql_set.clone(),
        cfg,
        Vec::new(),
    );

    let cql = bytes_by_id(&sock, "cql");
    let files = bytes_by_id(&sock, "files");
    assert_eq!((cql.len(), files.len()), (FILES as usize, FILES as usize));

    let mix = epochs(&sock, "mix", 2, || {});
    assert_eq!(mix.len(), 2 * 160, "two epochs of 160 samples");
    // 0.75 / 0.25 of 32.
    assert_two_source_batches(&mix, FILES, (24, 8), &cql, &files);

    // The same mixture from C: the same samples, in the same order.
    let exe = build_consume(&lib, agent.dir.path());
    let out = Command::new(&exe)
        .arg("-i")
        .arg(&sock)
        .args(["mix", &BATCH.to_string(), "2", &SEED.to_string()])
        .output()
        .expect("run consume");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "consume mix: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let from_c: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("sample ")?.split(' ').nth(1)?.parse().ok())
        .collect();
    let from_rust: Vec<u64> = mix.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(
        from_c, from_rust,
        "C and Rust loaders see one mixture order"
    );
    assert!(
        stdout.contains(" errors=0 mismatches=0"),
        "consume checked every sample's CRC: {stdout}"
    );
    agent.stop();
}
