//! `[[mixture]]` end to end: a mixture of a files dataset, a WebDataset
//! shard set on the filesystem and an S3 dataset on SeaweedFS (weights
//! 0.5/0.3/0.2) opened by name through a loader session. Every batch of 32 has its exact quotas,
//! every sample's bytes are its dataset's, two agents give the same order,
//! and a session resumed from its saved state goes on exactly where it
//! stopped.

mod common;
mod common_s3;

use common::{watchdog, TestAgent};
use common_s3::seaweed::{ACCESS_KEY, REGION, SECRET_KEY};
use common_s3::{synth, upload, Seaweed, BUCKET};
use granary::{Client, ErrorCode, SessionOptions};
use granary_agent::config::Config;
use granary_testkit::agent_toml::head;
use granary_tools::ingest::shards::write_webdataset;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Samples of the three datasets: files, webdataset shards, S3 objects.
const SIZES: [u64; 3] = [200, 120, 80];

fn config(sock: &Path, a: &Path, b: &Path, endpoint: &str) -> Config {
    let toml = format!(
        r#"
{head}
[[dataset]]
name = "a"
root = "{a}"
[[dataset]]
name = "b"
root = "{b}"
format = "webdataset"
[[dataset]]
name = "c"
kind = "s3"
endpoint = "{endpoint}"
allow_http = true
region = "{REGION}"
bucket = "{BUCKET}"
prefix = "c"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
[[mixture]]
name = "mix"
[[mixture.source]]
dataset = "a"
weight = 0.5
[[mixture.source]]
dataset = "b"
weight = 0.3
[[mixture.source]]
dataset = "c"
weight = 0.2
"#,
        head = head("64MiB", sock, "max_inflight_reads = 64", ""),
        a = a.display(),
        b = b.display(),
    );
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("test config: {e}\n{toml}"))
}

/// A session's batches: (id, bytes) per sample.
type Batches = Vec<Vec<(u64, Vec<u8>)>>;

/// Batches of `o`'s session: (id, bytes) per sample; stops after `limit`
/// batches when given, returning the session's state then.
fn batches(sock: &Path, o: &SessionOptions, limit: Option<usize>) -> (Batches, Option<Vec<u8>>) {
    let client = Client::connect(sock).expect("connect");
    let mut s = client.open_session(o).expect("open");
    let mut out = Vec::new();
    loop {
        if limit == Some(out.len()) {
            return (out, Some(s.state().to_bytes()));
        }
        let b = match s.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => panic!("{}: next_batch: {e}", o.dataset),
        };
        assert_eq!(b.status(), 0, "batch status");
        let mut batch = Vec::new();
        for smp in b.samples() {
            assert!(smp.checksum_matches());
            batch.push((smp.id(), smp.to_vec()));
        }
        s.release(b).expect("release");
        out.push(batch);
    }
    (out, None)
}

fn options(dataset: &str, epochs: u32) -> SessionOptions {
    let mut o = SessionOptions::new(dataset);
    o.seed = 11;
    o.batch_size = 32;
    o.epoch_count = epochs;
    o
}

struct Sets {
    _dir: tempfile::TempDir,
    roots: [PathBuf; 2],
    weed: Seaweed,
}

fn datasets() -> Sets {
    let dir = tempfile::tempdir().unwrap();
    let a = synth(&dir.path().join("a"), SIZES[0], 4, 3_000);
    let b_files = synth(&dir.path().join("b"), SIZES[1], 4, 5_000);
    let c = synth(&dir.path().join("c"), SIZES[2], 4, 2_000);
    let shards = dir.path().join("b-wds");
    let w = write_webdataset(&b_files.root, &shards, 128 * 1024).unwrap();
    assert_eq!(w.samples, SIZES[1]);
    assert!(w.shards.len() >= 2);
    let weed = Seaweed::start();
    let report = upload(&weed, &c.root, "c");
    assert_eq!(report.files, SIZES[2]);
    Sets {
        roots: [a.root.clone(), shards],
        _dir: dir,
        weed,
    }
}

fn start(sets: &Sets) -> TestAgent {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("granary.sock");
    let [a, b] = &sets.roots;
    let cfg = config(&sock, a, b, &sets.weed.endpoint());
    let spec = granary_tools::synth::SynthSpec::new(a);
    TestAgent::start_custom(dir, a.clone(), sock, spec, cfg, Vec::new())
}

#[test]
fn a_mixture_of_files_shards_and_s3_gives_exact_batches_and_resumes_exactly() {
    let _w = watchdog("a_mixture_of_files_shards_and_s3", 240);
    let sets = datasets();
    let agent = start(&sets);
    // Each dataset's bytes by id, read through its own sessions.
    let members: Vec<HashMap<u64, Vec<u8>>> = ["a", "b", "c"]
        .iter()
        .map(|d| {
            let (b, _) = batches(&agent.sock, &options(d, 1), None);
            b.into_iter().flatten().collect()
        })
        .collect();
    for (m, &n) in members.iter().zip(&SIZES) {
        assert_eq!(m.len() as u64, n);
    }
    let offsets = [0, SIZES[0], SIZES[0] + SIZES[1]];
    let source_of = |id: u64| offsets.iter().rposition(|&o| id >= o).unwrap();

    let (mix, _) = batches(&agent.sock, &options("mix", 2), None);
    // 400 samples per epoch: 12 batches of 32 and one of 16, per epoch.
    assert_eq!(mix.len(), 26);
    let mut totals = [0u64; 3];
    for (i, batch) in mix.iter().enumerate() {
        let mut c = [0u64; 3];
        for (id, bytes) in batch {
            let k = source_of(*id);
            c[k] += 1;
            let want = &members[k][&(id - offsets[k])];
            assert_eq!(bytes, want, "batch {i}: sample {id} is not dataset {k}'s");
        }
        if batch.len() == 32 {
            assert_eq!(c[0], 16, "batch {i}: {c:?}");
            assert!(c[1] == 9 || c[1] == 10, "batch {i}: {c:?}");
            assert!(c[2] == 6 || c[2] == 7, "batch {i}: {c:?}");
        }
        for k in 0..3 {
            totals[k] += c[k];
        }
    }
    assert_eq!(totals, [400, 240, 160], "two epochs' totals");

    // A second agent over the same datasets deals the same order.
    let other = start(&sets);
    let (again, _) = batches(&other.sock, &options("mix", 2), None);
    let ids = |b: &[Vec<(u64, Vec<u8>)>]| -> Vec<Vec<u64>> {
        b.iter().map(|x| x.iter().map(|s| s.0).collect()).collect()
    };
    assert_eq!(ids(&again), ids(&mix), "two agents, one order");
    other.stop();

    // Stop after 17 batches (into the second epoch), resume from the state.
    let (first, state) = batches(&agent.sock, &options("mix", 2), Some(17));
    let state = state.expect("a saved state");
    let resumed = SessionOptions::from_state(&state, false).expect("state");
    assert_eq!(resumed.dataset, "mix");
    let (rest, _) = batches(&agent.sock, &resumed, None);
    let mut joined = ids(&first);
    joined.extend(ids(&rest));
    assert_eq!(joined, ids(&mix), "resumed: every batch once, in order");
    agent.stop();
}
