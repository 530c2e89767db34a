//! The CQL source and `granary ingest --to cql://…` against an independently
//! written CQL v4 server: the `kassandra` crate's in-memory emulator, started
//! by the test (`common_kassandra`). Ingest with verification, resume, the
//! catalog against the folder's, and the engine serving two epochs to a
//! loader, every byte verified, one read per sample.

mod common;
mod common_kassandra;

use common::{cql_config, next_or_end, watchdog, TestAgent};
use common_kassandra::Kassandra;
use granary::{Client, SessionOptions};
use granary_agent::source::cql::CqlSettings;
use granary_agent::source::Catalog;
use granary_tools::ingest::cql::{self as ingest_cql, CqlIngestOptions};
use granary_tools::synth;
use std::time::Duration;

const FILES: u64 = 120;
const KS: &str = "granary_k";

#[test]
fn kassandra_ingest_resume_serve_and_verify() {
    let _w = watchdog("kassandra_ingest_resume_serve_and_verify", 180);
    let dir = tempfile::tempdir().unwrap();
    let spec = granary_testkit::dataset::synth_at(&dir.path().join("data"), FILES, 4, 3_000);
    let k = Kassandra::start();
    let mut settings = CqlSettings::new(vec![k.addr.to_string()], KS);
    settings.request_timeout = Duration::from_secs(5);
    let mut opts = CqlIngestOptions::new(&spec.root, settings.clone());
    opts.verify = true;
    let r = ingest_cql::ingest(&opts, |_, _, _, _| {}).unwrap_or_else(|e| panic!("ingest: {e}"));
    assert_eq!(r.uploaded, FILES);
    opts.resume = true;
    let r = ingest_cql::ingest(&opts, |_, _, _, _| {}).unwrap_or_else(|e| panic!("resume: {e}"));
    assert_eq!((r.uploaded, r.skipped), (0, FILES));

    let fs = Catalog::from_dir(&spec.root).unwrap();
    let sock = dir.path().join("granary.sock");
    let cfg = cql_config(&sock, k.addr, KS);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let client = Client::connect(&agent.sock).unwrap();
    let mut o = SessionOptions::new("synth");
    o.batch_size = 16;
    o.epoch_count = 2;
    let mut s = client.open_session(&o).unwrap();
    let mut seen = vec![vec![0u32; FILES as usize]; 2];
    let mut labels = vec![0i32; FILES as usize];
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        assert_eq!(b.status(), 0, "batch status");
        for smp in b.samples() {
            assert_eq!(smp.status(), 0, "sample {}", smp.id());
            let info = synth::verify_sample(&smp.to_vec())
                .unwrap_or_else(|e| panic!("sample {} is corrupt: {e}", smp.id()));
            assert_eq!(info.class as i32, smp.label(), "sample {} label", smp.id());
            assert!(smp.checksum_matches(), "sample {}: CRC-32C", smp.id());
            labels[smp.id() as usize] = smp.label();
            seen[b.epoch() as usize][smp.id() as usize] += 1;
        }
        s.release(b).unwrap();
    }
    s.close().unwrap();
    for (epoch, counts) in seen.iter().enumerate() {
        assert!(counts.iter().all(|&c| c == 1), "epoch {epoch}: {counts:?}");
    }
    // Label then id order: position by position the folder's labels.
    let fs_labels: Vec<i32> = fs.entries().iter().map(|e| e.label).collect();
    assert_eq!(labels, fs_labels);
    let m = &agent.metrics;
    assert_eq!(m.reads_submitted.get(), FILES, "one read per sample");
    assert_eq!(m.read_errors.get(), 0);
    agent.stop();
}
