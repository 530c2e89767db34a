//! `format = "webdataset"` end to end: the synthetic dataset as files and
//! as tar shards (written by `granary ingest --format webdataset`, on the
//! filesystem and uploaded to SeaweedFS) gives the same epoch through a
//! loader session: the same ids, labels and order, each sample's `bin`
//! field byte for byte the file, its `cls` field the label. A corrupt
//! shard is refused with a message naming it and the offset.

mod common;
mod common_s3;

use common::{watchdog, TestAgent};
use common_s3::seaweed::{ACCESS_KEY, REGION, SECRET_KEY};
use common_s3::{synth, Seaweed, BUCKET};
use granary::{Client, ErrorCode, SessionOptions};
use granary_agent::config::Config;
use granary_tools::ingest::{self, shards::write_webdataset, IngestOptions};
use std::path::Path;
use std::time::Duration;

const FILES: u64 = 400;

fn config(sock: &Path, datasets: &str) -> Config {
    let toml = format!(
        r#"
[arena]
size = "64MiB"
hugepages = "off"
populate = false
[socket]
path = "{sock}"
mode = "0660"
[prefetch]
max_inflight_reads = 64
[metrics]
address = ""
{datasets}
"#,
        sock = sock.display()
    );
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("test config: {e}\n{toml}"))
}

/// One epoch of `dataset`: (id, label, bytes) per sample, in delivery order.
fn epoch(sock: &Path, dataset: &str) -> Vec<(u64, i32, Vec<u8>)> {
    let client = Client::connect(sock).expect("connect");
    let mut o = SessionOptions::new(dataset);
    o.seed = 5;
    o.batch_size = 32;
    o.epoch_count = 1;
    let mut s = client.open_session(&o).expect("open");
    let mut out = Vec::new();
    loop {
        let b = match s.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => panic!("{dataset}: next_batch: {e}"),
        };
        assert_eq!(b.status(), 0, "{dataset}: batch status");
        for smp in b.samples() {
            assert!(smp.checksum_matches());
            out.push((smp.id(), smp.label(), smp.to_vec()));
        }
        let end = b.is_end_of_epoch();
        s.release(b).expect("release");
        if end {
            break;
        }
    }
    out
}

/// Checks a webdataset epoch against the files epoch.
fn same_epoch(files: &[(u64, i32, Vec<u8>)], wds: &[(u64, i32, Vec<u8>)], what: &str) {
    assert_eq!(files.len(), FILES as usize, "files epoch");
    assert_eq!(wds.len(), files.len(), "{what}: samples");
    for (f, w) in files.iter().zip(wds) {
        assert_eq!((f.0, f.1), (w.0, w.1), "{what}: id and label in order");
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
    }
}

#[test]
fn files_and_webdataset_shards_on_fs_and_s3_give_the_same_epoch() {
    let _w = watchdog("files_and_webdataset_shards_on_fs_and_s3", 240);
    let weed = Seaweed::start();
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), FILES, 5, 6_000);
    let shards = dir.path().join("wds");
    let w = write_webdataset(&spec.root, &shards, 256 * 1024).unwrap();
    assert_eq!(w.samples, FILES);
    assert!(w.shards.len() >= 5, "{} shards", w.shards.len());
    let report = ingest::ingest(
        &IngestOptions::new(&shards, weed.settings(), "wds"),
        |_, _, _, _| {},
    )
    .unwrap();
    assert_eq!(report.files, w.shards.len() as u64);
    let sock = dir.path().join("granary.sock");
    let tables = format!(
        r#"
[[dataset]]
name = "files"
root = "{root}"
[[dataset]]
name = "wds-fs"
root = "{shards}"
format = "webdataset"
[[dataset]]
name = "wds-s3"
kind = "s3"
endpoint = "{endpoint}"
allow_http = true
region = "{REGION}"
bucket = "{BUCKET}"
prefix = "wds"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
format = "webdataset"
label_field = "cls"
"#,
        root = spec.root.display(),
        shards = shards.display(),
        endpoint = weed.endpoint(),
    );
    let cfg = config(&sock, &tables);
    let agent =
        TestAgent::start_custom(dir, spec.root.clone(), sock, spec.clone(), cfg, Vec::new());
    let files = epoch(&agent.sock, "files");
    same_epoch(&files, &epoch(&agent.sock, "wds-fs"), "fs");
    same_epoch(&files, &epoch(&agent.sock, "wds-s3"), "s3");
}

#[test]
fn a_corrupt_shard_is_refused_naming_it_and_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), 40, 2, 3_000);
    let shards = dir.path().join("wds");
    write_webdataset(&spec.root, &shards, 64 * 1024).unwrap();
    let cfg_of = || {
        let sock = dir.path().join("g.sock");
        config(
            &sock,
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
