//! The engine serving a `kind = "cql"` dataset through `SampleSource`: a
//! folder written by `granary ingest` into a fake cluster (scylla-proxy
//! dry-mode nodes, see `granary_testkit::fake_cql`), then two epochs read by a loader over
//! the real socket, arena and rings, every byte checked.

mod common;

use common::{cql_config, next_or_end, watchdog, TestAgent};
use granary::{Client, SessionOptions};
use granary_agent::source::Catalog;
use granary_testkit::fake_cql::{FakeCluster, Tables, KS};
use granary_tools::ingest::cql::{self as ingest_cql, CqlIngestOptions};
use granary_tools::synth;
use std::time::Duration;
use uuid::Uuid;

const FILES: u64 = 400;

#[test]
fn engine_serves_an_ingested_cql_dataset_byte_for_byte() {
    let _w = watchdog("engine_serves_an_ingested_cql_dataset_byte_for_byte", 180);
    let dir = tempfile::tempdir().unwrap();
    let spec = granary_testkit::dataset::synth_at(&dir.path().join("data"), FILES, 5, 4_000);
    let fake = FakeCluster::start(Tables::empty());
    let r = ingest_cql::ingest(
        &CqlIngestOptions::new(&spec.root, fake.settings()),
        |_, _, _, _| {},
    )
    .unwrap();
    assert_eq!(r.uploaded, FILES);

    // The CQL catalog's order: by label, then id bytes. Position → the
    // generator's file id (the filesystem catalog's sample id).
    let fs = Catalog::from_dir(&spec.root).unwrap();
    let mut order: Vec<(i32, Uuid, u64)> = fs
        .entries()
        .iter()
        .map(|e| {
            let rel = e.path.strip_prefix(&spec.root).unwrap().to_str().unwrap();
            (e.label, ingest_cql::sample_id(rel), e.sample_id)
        })
        .collect();
    order.sort_by(|a, b| (a.0, a.1.as_bytes()).cmp(&(b.0, b.1.as_bytes())));
    let file_of: Vec<u64> = order.iter().map(|o| o.2).collect();

    let sock = dir.path().join("granary.sock");
    let cfg = cql_config(&sock, fake.addrs[0], KS);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);

    let client = Client::connect(&agent.sock).unwrap();
    let mut o = SessionOptions::new("synth");
    o.batch_size = 16;
    o.epoch_count = 2;
    o.seed = 5;
    let mut s = client.open_session(&o).unwrap();
    let mut seen = vec![vec![0u32; FILES as usize]; 2];
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        assert_eq!(b.status(), 0, "batch status");
        let epoch = b.epoch() as usize;
        for smp in b.samples() {
            assert_eq!(smp.status(), 0, "sample {}", smp.id());
            let info = synth::verify_sample(&smp.to_vec())
                .unwrap_or_else(|e| panic!("sample {} is corrupt: {e}", smp.id()));
            assert_eq!(
                info.file_id,
                file_of[smp.id() as usize],
                "sample {}",
                smp.id()
            );
            assert_eq!(info.class as i32, smp.label(), "sample {} label", smp.id());
            assert!(smp.checksum_matches(), "sample {}: CRC-32C", smp.id());
            seen[epoch][smp.id() as usize] += 1;
        }
        s.release(b).unwrap();
    }
    s.close().unwrap();
    for (epoch, counts) in seen.iter().enumerate() {
        assert!(counts.iter().all(|&c| c == 1), "epoch {epoch}: {counts:?}");
    }
    let m = &agent.metrics;
    assert_eq!(m.reads_submitted.get(), FILES, "one read per sample");
    assert_eq!(m.read_errors.get(), 0);
    assert_eq!(fake.read_count() as u64, FILES);
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
    agent.stop();
}
