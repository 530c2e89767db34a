//! `format = "webdataset"` end to end: the synthetic dataset as files and
//! as tar shards (written by `granary ingest --format webdataset`, on the
//! filesystem and uploaded to SeaweedFS) gives the same epoch through a
//! loader session: the same ids, labels and order, each sample's `bin`
//! field byte for byte the file, its `cls` field the label. A corrupt
//! shard is refused with a message naming it and the offset.

mod common;
mod common_s3;

use common::{epochs, same_epoch_as, store_config, watchdog, Delivered, TestAgent};
use common_s3::{s3_table, synth, upload, weed_and_synth};
use granary_testkit::agent_toml::fs_dataset;
use granary_tools::ingest::shards::write_webdataset;

const FILES: u64 = 400;

/// Checks a webdataset epoch against the files epoch.
fn same_epoch(files: &[Delivered], wds: &[Delivered], what: &str) {
    same_epoch_as(files, wds, FILES, what, |f, w| {
        let fields: Vec<_> = granary::fields::fields(&w.2)
            .map(|x| x.unwrap_or_else(|e| panic!("{what}: sample {}: {e}", w.0)))
            .collect();
        assert_eq!(fields.len(), 2, "{what}: sample {}: bin and cls", w.0);
        assert_eq!(fields[0].name, b"bin");
        assert!(
            fields[0].data == f.2.as_slice(),
            "{what}: sample {} bytes",
            w.0
        );
        assert_eq!(fields[1].name, b"cls");
        assert_eq!(fields[1].data, f.1.to_string().as_bytes());
    });
}

#[test]
fn files_and_webdataset_shards_on_fs_and_s3_give_the_same_epoch() {
    let _w = watchdog("files_and_webdataset_shards_on_fs_and_s3", 240);
    let (weed, dir, spec) = weed_and_synth(FILES, 5, 6_000);
    let shards = dir.path().join("wds");
    let w = write_webdataset(&spec.root, &shards, 256 * 1024).unwrap();
    assert_eq!(w.samples, FILES);
    assert!(w.shards.len() >= 5, "{} shards", w.shards.len());
    let report = upload(&weed, &shards, "wds");
    assert_eq!(report.files, w.shards.len() as u64);
    let sock = dir.path().join("granary.sock");
    let tables = [
        fs_dataset("files", &spec.root, ""),
        fs_dataset("wds-fs", &shards, "format = \"webdataset\""),
        s3_table(
            "wds-s3",
            &weed.endpoint(),
            "wds",
            "format = \"webdataset\"\nlabel_field = \"cls\"",
        ),
    ]
    .concat();
    let cfg = store_config(&sock, "64MiB", "", &tables);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let files = epochs(&agent.sock, "files", 1, || {});
    same_epoch(&files, &epochs(&agent.sock, "wds-fs", 1, || {}), "fs");
    same_epoch(&files, &epochs(&agent.sock, "wds-s3", 1, || {}), "s3");
}

#[test]
fn a_corrupt_shard_is_refused_naming_it_and_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), 40, 2, 3_000);
    let shards = dir.path().join("wds");
    write_webdataset(&spec.root, &shards, 64 * 1024).unwrap();
    let cfg_of = || {
        let sock = dir.path().join("g.sock");
        store_config(
            &sock,
            "64MiB",
            "",
            &format!(
                "[[dataset]]\nname = \"w\"\nroot = \"{}\"\nformat = \"webdataset\"\n",
                shards.display()
            ),
        )
    };
    let cat = granary_agent::source::open_catalog(&cfg_of().datasets[0]).unwrap();
    assert_eq!(cat.len(), 40);
    // A header damaged in the second shard: its checksum fails.
    let victim = shards.join("shard-000001.tar");
    let original = std::fs::read(&victim).unwrap();
    let mut bytes = original.clone();
    let second = cat
        .entries()
        .iter()
        .filter(|e| e.path == victim)
        .nth(1)
        .unwrap()
        .offset;
    bytes[second as usize + 3] ^= 0x55;
    std::fs::write(&victim, &bytes).unwrap();
    let e = granary_agent::source::open_catalog(&cfg_of().datasets[0])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shard-000001.tar")
            && e.contains(&format!("offset {second}"))
            && e.contains("checksum"),
        "{e}"
    );
    // Truncated inside a member.
    std::fs::write(&victim, &original[..second as usize + 700]).unwrap();
    let e = granary_agent::source::open_catalog(&cfg_of().datasets[0])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shard-000001.tar") && e.contains("truncated"),
        "{e}"
    );
}

/// The index build of a large tar set, for docs/benchmarks.md: shards of
/// 64 MiB holding `GRANARY_WDS_SAMPLES` samples (default 200,000) of a
/// ~110 KB `bin` member (sizes 60–160 KB) and a `cls` member, written
/// sparse (the `bin` data are holes: only headers and labels take disk
/// space), then indexed; prints the time and the bytes read.
/// `cargo nextest run --release -p granary-agent --test webdataset --run-ignored only --no-capture`
#[test]
#[ignore = "benchmark"]
fn index_build_of_a_large_tar_set() {
    use granary_shm::tar::{ustar_header, BLOCK};
    use std::io::{Seek, SeekFrom, Write};
    let n: u64 = std::env::var("GRANARY_WDS_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let dir =
        tempfile::tempdir_in(std::env::var("GRANARY_WDS_DIR").unwrap_or("/tmp".into())).unwrap();
    let shard_size = 64u64 << 20;
    let t0 = std::time::Instant::now();
    let (mut shard, mut used, mut shards, mut total) = (None::<std::fs::File>, 0u64, 0, 0u64);
    for i in 0..n {
        let size = 60_000 + (i * 7_919) % 100_000;
        let span = 3 * BLOCK as u64 + size.next_multiple_of(BLOCK as u64);
        if shard.is_none() || used + span > shard_size {
            if let Some(mut f) = shard.take() {
                f.write_all(&[0u8; 2 * BLOCK]).unwrap();
                total += used + 2 * BLOCK as u64;
            }
            shard =
                Some(std::fs::File::create(dir.path().join(format!("s-{shards:05}.tar"))).unwrap());
            shards += 1;
            used = 0;
        }
        let f = shard.as_mut().unwrap();
        let key = format!("c{:03}/img_{i:08}", i % 1000);
        f.write_all(&ustar_header(format!("{key}.bin").as_bytes(), size, 0).unwrap())
            .unwrap();
        f.seek(SeekFrom::Current(size.next_multiple_of(BLOCK as u64) as i64))
            .unwrap();
        let label = format!("{}", i % 1000);
        f.write_all(&ustar_header(format!("{key}.cls").as_bytes(), label.len() as u64, 0).unwrap())
            .unwrap();
        let mut block = [0u8; BLOCK];
        block[..label.len()].copy_from_slice(label.as_bytes());
        f.write_all(&block).unwrap();
        used += span;
    }
    if let Some(mut f) = shard.take() {
        f.write_all(&[0u8; 2 * BLOCK]).unwrap();
        total += used + 2 * BLOCK as u64;
    }
    let written = t0.elapsed();
    let t1 = std::time::Instant::now();
    let (cat, stats) = granary_agent::source::fs::shards::index(dir.path(), "cls").unwrap();
    let took = t1.elapsed();
    assert_eq!(cat.len() as u64, n);
    assert_eq!(stats.shard_bytes, total);
    assert_eq!(cat.entries()[7].label, 7);
    let pct = 100.0 * stats.bytes_read as f64 / total as f64;
    println!(
        "index build: {n} samples in {shards} shards ({:.1} GB): {:.2} s ({:.0} samples/s); {stats}; shards written (sparse) in {:.1} s",
        total as f64 / 1e9,
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        written.as_secs_f64()
    );
    assert!(pct <= 2.0, "read {pct:.2} %");
}
