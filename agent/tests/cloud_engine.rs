//! The engine serving `kind = "azure"` and `kind = "gcs"` datasets from
//! emulators the tests start (Azurite, fake-gcs-server; see
//! `common_cloud`): the catalog equal to the folder's with a version token
//! (ETag) on every object, every sample read from the store once over two
//! verified epochs, a replaced object refused as changed, and a store that
//! dies mid-run: error batches with failed samples marked, a filesystem
//! dataset served meanwhile, recovery once the store is back.

mod common;
mod common_cloud;

use common::{
    honest, honest_loader_of, store_config, store_outage, watchdog, watchdog_fn, Outage, TestAgent,
    RETRYING,
};
use common_cloud::{Emulator, Kind};
use granary_agent::source::queue::changed;
use granary_agent::source::s3::{S3Layout, S3Source, StoreSettings};
use granary_agent::source::Catalog;
use granary_shm::arena::Arena;
use granary_tools::synth::SynthSpec;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

const FILES: u64 = 200;

/// A synthetic dataset of [`FILES`] files under `dir/sub`.
fn dataset_in(dir: &Path, sub: &str) -> SynthSpec {
    let d = dir.join(sub).join("synth");
    granary_testkit::dataset::synth_at(&d, FILES, 5, 6_000)
}

/// Uploads a synthetic set under `train`, checks the store's catalog
/// against the folder's, serves two epochs (each sample read once, every
/// byte verified), then replaces one object: a fetch of it is refused as
/// changed.
fn serves_every_sample_once(kind: Kind) {
    let em = Emulator::start(kind);
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    assert_eq!(em.upload(&spec.root, "train"), FILES);
    let sock = dir.path().join("granary.sock");
    let cfg = store_config(&sock, "64MiB", RETRYING, &em.table("synth", "train", ""));

    // The catalog: the folder's samples, labels and sizes, in its order,
    // each object with its ETag (what the dataset fingerprint and every
    // GET's If-Match carry).
    let settings = StoreSettings::from_dataset(&cfg.datasets[0]).unwrap();
    let source = S3Source::connect_store(&settings, 16).unwrap();
    let catalog = source
        .catalog(&S3Layout::Prefix("train".to_owned()))
        .unwrap();
    let fs = Catalog::from_dir(&spec.root).unwrap();
    assert_eq!(catalog.len(), fs.len());
    for (c, f) in catalog.entries().iter().zip(fs.entries()) {
        assert_eq!((c.label, c.size), (f.label, f.size), "{}", c.key);
        assert!(
            c.etag.as_deref().is_some_and(|t| !t.is_empty()),
            "{}",
            c.key
        );
    }

    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let stop = AtomicBool::new(true);
    assert_eq!(
        honest_loader_of(&agent.sock, "synth", &spec, honest(2, 16, 0), &stop),
        2
    );
    let m = &agent.metrics;
    assert_eq!(m.reads_submitted.get(), FILES, "one GET per sample");
    assert_eq!(m.read_errors.get(), 0);
    assert_eq!(m.samples_served.get(), 2 * FILES);
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();

    // An object replaced since cataloguing (same size, other bytes) is
    // refused, never served as its new bytes.
    let e = &catalog.entries()[0];
    em.replace(e.key.as_ref(), &vec![0x5a; e.size as usize]);
    let arena = Arena::heap(e.size).unwrap();
    let dest = arena.slice(0, e.size as usize).unwrap();
    let mut fetcher = source.fetcher().unwrap();
    fetcher
        .submit(catalog.request(0, 0, dest).unwrap())
        .unwrap();
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no completion");
        fetcher
            .poll_completions(Some(Duration::from_millis(200)), &mut out)
            .unwrap();
    }
    let err = out[0]
        .result
        .as_ref()
        .expect_err("a replaced object was served");
    let how = &changed(err)
        .unwrap_or_else(|| panic!("not refused as changed: {err}"))
        .what;
    // Azurite refuses the GET's If-Match; fake-gcs-server ignores it, and
    // the response's ETag differs from the catalogued one.
    match kind {
        Kind::Azurite => assert!(how.contains("HTTP 412"), "{how}"),
        Kind::FakeGcs => assert!(how.contains("catalogued"), "{how}"),
    }
}

/// The store killed mid-run: the loader gets error batches with failed
/// samples marked, a filesystem dataset serves two epochs meanwhile, and
/// after a restart the same session gets good batches again.
fn store_dies_mid_run(kind: Kind) {
    let em = Emulator::start(kind);
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    em.upload(&spec.root, "train");
    em.settle();
    let local = dataset_in(dir.path(), "local");
    let sock = dir.path().join("granary.sock");
    let tables = format!(
        "\n[[dataset]]\nname = \"local\"\nroot = \"{}\"\n{}",
        local.root.display(),
        em.table("synth", "train", "retries = 1\nrequest_timeout_ms = 1000")
    );
    let cfg = store_config(&sock, "64MiB", RETRYING, &tables);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let em = std::cell::RefCell::new(em);
    store_outage(
        agent,
        &spec,
        &local,
        Outage {
            served_first: 24,
            recovery: Duration::from_secs(120),
            error_within: Duration::from_secs(60),
        },
        || em.borrow_mut().kill(),
        || em.borrow_mut().restart(),
    );
}

#[test]
fn azure_serves_every_sample_once_byte_for_byte() {
    let _w = watchdog("azure_serves_every_sample_once_byte_for_byte", 180);
    serves_every_sample_once(Kind::Azurite);
}

#[test]
fn gcs_serves_every_sample_once_byte_for_byte() {
    let _w = watchdog("gcs_serves_every_sample_once_byte_for_byte", 180);
    serves_every_sample_once(Kind::FakeGcs);
}

#[test]
fn azure_store_dies_mid_run_loaders_get_error_batches_then_recover() {
    let _w = watchdog_fn!(240);
    store_dies_mid_run(Kind::Azurite);
}

#[test]
fn gcs_store_dies_mid_run_loaders_get_error_batches_then_recover() {
    let _w = watchdog_fn!(240);
    store_dies_mid_run(Kind::FakeGcs);
}
