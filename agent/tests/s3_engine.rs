//! The engine serving `kind = "s3"` datasets from a real S3 server
//! (SeaweedFS on loopback, started by each test): full epochs verified byte
//! for byte after `granary ingest`, the server killed and restarted
//! mid-epoch, 5 % of GETs failed by a fault wrapper, an unreachable store
//! next to a healthy dataset, and a store that dies mid-run and comes back.

mod common;
mod common_s3;

use common::{
    honest, honest_loader_of, next_or_end, store_config, store_outage, wait_for, watchdog,
    watchdog_fn, Honest, Outage, TestAgent, RETRYING,
};
use common_s3::{s3_table, synth, upload, Seaweed, BUCKET};
use granary::{Client, ErrorCode, SessionOptions};
use granary_agent::config::Config;
use granary_agent::dataset::Dataset;
use granary_agent::source::s3::fault::FaultyStore;
use granary_agent::source::s3::{FetchOptions, S3Dataset, S3Layout, S3Source};
use granary_tools::synth::SynthSpec;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILES: u64 = 600;

fn ingest_dir(weed: &Seaweed, src: &Path, prefix: &str) {
    assert_eq!(upload(weed, src, prefix).files, FILES);
}

/// A filesystem dataset table.
fn fs_table(name: &str, root: &Path) -> String {
    format!(
        "\n[[dataset]]\nname = \"{name}\"\nroot = \"{}\"\n",
        root.display()
    )
}

/// A synthetic dataset of [`FILES`] files under `dir/sub`.
fn dataset_in(dir: &Path, sub: &str) -> SynthSpec {
    let d = dir.join(sub);
    std::fs::create_dir_all(&d).unwrap();
    synth(&d, FILES, 6, 6_000)
}

fn start(dir: tempfile::TempDir, spec: &SynthSpec, cfg: Config, extra: Vec<Dataset>) -> TestAgent {
    let sock = cfg.socket.path.clone();
    TestAgent::start_custom(dir, spec.root.clone(), sock, spec.clone(), cfg, extra)
}

#[test]
fn engine_serves_an_ingested_bucket_byte_for_byte() {
    let _w = watchdog("engine_serves_an_ingested_bucket_byte_for_byte", 240);
    let weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    ingest_dir(&weed, &spec.root, "train");
    let sock = dir.path().join("granary.sock");
    let cfg = store_config(
        &sock,
        "64MiB",
        RETRYING,
        &s3_table("synth", &weed.endpoint(), "train", ""),
    );
    let agent = start(dir, &spec, cfg, Vec::new());
    let stop = AtomicBool::new(true);
    // Two ranks, two epochs each, at once: every batch in the planner's
    // order, every byte checked against the generator.
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (sock, spec, stop) = (&agent.sock, &spec, &stop);
                s.spawn(move || {
                    let h = Honest {
                        rank,
                        world_size: 2,
                        ..honest(2, 16, 0)
                    };
                    honest_loader_of(sock, "synth", spec, h, stop)
                })
            })
            .collect();
        for r in ranks {
            assert_eq!(r.join().unwrap(), 2);
        }
    });
    let m = &agent.metrics;
    // The arena holds the whole dataset: one GET per sample, the second
    // epoch served from memory.
    assert_eq!(m.reads_submitted.get(), FILES, "one GET per sample");
    assert_eq!(m.read_errors.get(), 0);
    assert_eq!(m.samples_served.get(), 2 * FILES);
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

#[test]
fn store_killed_and_restarted_mid_epoch_the_epoch_completes() {
    let _w = watchdog_fn!(300);
    let mut weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    ingest_dir(&weed, &spec.root, "train");
    let sock = dir.path().join("granary.sock");
    let table = s3_table("synth", &weed.endpoint(), "train", "retries = 30");
    let agent = start(
        dir,
        &spec,
        store_config(&sock, "64MiB", RETRYING, &table),
        Vec::new(),
    );
    let stop = AtomicBool::new(true);
    let m = Arc::clone(&agent.metrics);
    std::thread::scope(|s| {
        let (sock, spec, stop) = (&agent.sock, &spec, &stop);
        // A slow loader: the window (8 batches of 8) keeps most of the
        // epoch unread when the server goes away.
        let loader = s.spawn(move || honest_loader_of(sock, "synth", spec, honest(1, 8, 25), stop));
        wait_for("the first batches", Duration::from_secs(60), || {
            m.samples_served.get() >= 80
        });
        let read_before = m.reads_submitted.get();
        weed.kill();
        eprintln!("killed the server after {read_before} reads");
        std::thread::sleep(Duration::from_secs(1));
        weed.restart();
        eprintln!("restarted the server");
        assert!(read_before < FILES, "the kill came after every read");
        // The loader checks that every batch is the planner's, with status
        // 0 and every byte right: nothing lost, nothing twice.
        assert_eq!(loader.join().unwrap(), 1);
    });
    assert_eq!(m.read_errors.get(), 0, "no sample failed for good");
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

#[test]
fn five_percent_of_gets_failing_and_a_replaced_object_lose_nothing_else() {
    let _w = watchdog_fn!(240);
    let weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    ingest_dir(&weed, &spec.root, "train");
    let faulty = Arc::new(FaultyStore::new(
        weed.settings().build_store().unwrap(),
        0.05,
        3,
    ));
    let opts = FetchOptions {
        capacity: 64,
        ..FetchOptions::default()
    };
    let source = S3Source::with_store(faulty.clone(), BUCKET, opts).unwrap();
    let catalog = source.catalog(&S3Layout::Prefix("train".into())).unwrap();
    // One object replaced after cataloguing by other bytes of its size.
    let replaced = catalog.entries()[3].clone();
    {
        use object_store::ObjectStoreExt;
        let store = weed.settings().build_store().unwrap();
        let other = vec![0x5a; replaced.size as usize];
        source
            .block_on(store.put(&replaced.key, other.into()))
            .expect("replace an object");
    }
    let remote = Dataset::from_source(
        "synth",
        Box::new(S3Dataset::with_parts(source, catalog).unwrap()),
    );
    // The configuration needs a dataset of its own: a local one.
    let local = dataset_in(dir.path(), "local");
    let sock = dir.path().join("granary.sock");
    let mut cfg = store_config(&sock, "64MiB", RETRYING, &fs_table("local", &local.root));
    // A sample fails only when every attempt fails: 5 % to the power of
    // the attempts. With 3 attempts (1.25e-4 per read) two epochs of this
    // dataset lost a sample about one run in ten; with 7 (8e-10) never.
    cfg.prefetch.read_retries = 6;
    let agent = start(dir, &spec, cfg, vec![remote]);
    // Two epochs: every sample once per epoch, each verified byte for
    // byte, except the replaced one, a CORRUPT failure each time.
    let client = Client::connect(&agent.sock).unwrap();
    let mut o = SessionOptions::new("synth");
    o.batch_size = 16;
    o.epoch_count = 2;
    let mut s = client.open_session(&o).unwrap();
    let mut seen = std::collections::BTreeMap::<(u32, u64), u32>::new();
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(60), "next_batch") {
        for smp in b.samples() {
            *seen.entry((b.epoch(), smp.id())).or_default() += 1;
            if smp.id() == replaced.sample_id {
                assert_eq!(
                    smp.status(),
                    ErrorCode::Corrupt.as_i32(),
                    "the replaced object"
                );
                assert!(smp.as_ptr().is_null());
            } else {
                common::verify(&spec, &smp);
            }
        }
        s.release(b).unwrap();
    }
    s.close().unwrap();
    assert_eq!(
        seen.len() as u64,
        2 * spec.num_files,
        "every sample, every epoch"
    );
    assert!(seen.values().all(|&n| n == 1), "a sample twice");
    let (before, during) = faulty.injected();
    eprintln!(
        "{} GETs; {before} failed before the body, {during} in it",
        faulty.gets()
    );
    assert!(
        before + during >= 10,
        "too few faults injected: {before} + {during}"
    );
    // Only the replaced object failed for good (once per epoch that read it).
    let errors = agent.metrics.read_errors.get();
    assert!((1..=2).contains(&errors), "{errors} read errors");
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

/// A loopback port nothing listens on.
fn dead_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn unreachable_store_is_a_clear_error_and_the_other_datasets_serve() {
    let _w = watchdog_fn!(120);
    let dir = tempfile::tempdir().unwrap();
    let local = dataset_in(dir.path(), "local");
    let sock = dir.path().join("granary.sock");
    let tables = fs_table("local", &local.root)
        + &s3_table(
            "remote",
            &dead_endpoint(),
            "train",
            "retries = 1\nrequest_timeout_ms = 500",
        );
    let t0 = Instant::now();
    let agent = start(
        dir,
        &local,
        store_config(&sock, "64MiB", RETRYING, &tables),
        Vec::new(),
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "start-up waited too long"
    );
    let client = Client::connect(&agent.sock).unwrap();
    let err = client
        .open_session(&SessionOptions::new("remote"))
        .expect_err("opening an unreachable dataset must fail");
    assert_eq!(err.code(), ErrorCode::Io, "{err}");
    let msg = err.message();
    assert!(
        msg.contains("\"remote\"") && msg.contains("unavailable") && msg.contains("next"),
        "unclear error: {msg}"
    );
    drop(client);
    let stop = AtomicBool::new(true);
    assert_eq!(
        honest_loader_of(&agent.sock, "local", &local, honest(2, 32, 0), &stop),
        2
    );
    assert!(agent.alive());
    let text = agent.metrics.render();
    for line in [
        "granary_dataset_ready{dataset=\"remote\",kind=\"s3\"} 0",
        "granary_dataset_ready{dataset=\"local\",kind=\"fs\"} 1",
    ] {
        assert!(text.contains(line), "metrics lack {line}:\n{text}");
    }
    agent.stop();
}

#[test]
fn store_dies_mid_run_loaders_get_error_batches_then_recover() {
    let _w = watchdog_fn!(300);
    let weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = dataset_in(dir.path(), "a");
    ingest_dir(&weed, &spec.root, "train");
    let local = dataset_in(dir.path(), "local");
    let sock = dir.path().join("granary.sock");
    let tables = fs_table("local", &local.root)
        + &s3_table(
            "synth",
            &weed.endpoint(),
            "train",
            "retries = 1\nrequest_timeout_ms = 1000",
        );
    let agent = start(
        dir,
        &spec,
        store_config(&sock, "64MiB", RETRYING, &tables),
        Vec::new(),
    );
    let weed = std::cell::RefCell::new(weed);
    store_outage(
        agent,
        &spec,
        &local,
        Outage {
            served_first: 40,
            recovery: Duration::from_secs(200),
            error_within: Duration::from_secs(120),
        },
        || weed.borrow_mut().kill(),
        || weed.borrow_mut().restart(),
    );
}
