//! Set-up shared by the suites that serve a dataset from a store (S3, the
//! cloud emulators, CQL, shards): the engine's configuration, a plain
//! honest loader, whole epochs read back, and the store-outage scenario.

use super::{honest_loader_of, next_or_end, verify, wait_for, Honest, TestAgent};
use granary::{Client, ErrorCode, SessionOptions};
use granary_agent::config::Config;
use granary_tools::synth::SynthSpec;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An engine configuration for the store suites: an arena of `arena`, the
/// socket (mode 0660), 64 reads in flight and `prefetch` (more
/// `[prefetch]` keys), no metrics endpoint, then `datasets` (TOML
/// `[[dataset]]` tables).
pub fn store_config(sock: &Path, arena: &str, prefetch: &str, datasets: &str) -> Config {
    let prefetch = format!("max_inflight_reads = 64\n{prefetch}");
    let toml = granary_testkit::agent_toml::head_with_socket(
        arena,
        sock,
        "mode = \"0660\"",
        &prefetch,
        "",
    ) + datasets;
    Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("test config: {e}\n{toml}"))
}

/// [`store_config`] for dataset `synth` of `kind = "cql"` in `keyspace` at
/// `host`, 64 queries in flight; windows of 8 batches.
pub fn cql_config(sock: &Path, host: impl std::fmt::Display, keyspace: &str) -> Config {
    store_config(
        sock,
        "64MiB",
        "window_batches = 8\ninitial_window = 2",
        &format!(
            "[[dataset]]\nname = \"synth\"\nkind = \"cql\"\nhosts = [\"{host}\"]\n\
             keyspace = \"{keyspace}\"\nmax_inflight = 64\n"
        ),
    )
}

/// The `[prefetch]` keys of the S3 and cloud suites: windows of 8 batches,
/// 2 read retries 20 ms apart.
pub const RETRYING: &str =
    "window_batches = 8\ninitial_window = 2\nread_retries = 2\nretry_backoff_ms = 20";

/// An honest loader of rank 0 of 1, seed 11: `epochs` epochs of batches
/// of `batch`, `pause_ms` after each.
pub fn honest(epochs: u32, batch: u32, pause_ms: u64) -> Honest {
    Honest {
        seed: 11,
        rank: 0,
        world_size: 1,
        batch_size: batch,
        min_epochs: epochs,
        max_epochs: epochs,
        pause: Duration::from_millis(pause_ms),
    }
}

/// One sample of an epoch read by [`epochs`]: id, label and bytes.
pub type Delivered = (u64, i32, Vec<u8>);

/// Checks `other`, an epoch of the same samples in another format or
/// store, against `files`, the epoch of the plain files (`n` samples): the
/// same ids and labels in the same order, and `same_sample` holds for each
/// pair (file's sample, other's sample). `what` names the case.
pub fn same_epoch_as(
    files: &[Delivered],
    other: &[Delivered],
    n: u64,
    what: &str,
    same_sample: impl Fn(&Delivered, &Delivered),
) {
    assert_eq!(files.len(), n as usize, "files epoch");
    assert_eq!(other.len(), files.len(), "{what}: samples");
    for (f, o) in files.iter().zip(other) {
        assert_eq!((f.0, f.1), (o.0, o.1), "{what}: id and label in order");
        same_sample(f, o);
    }
}

/// `count` epochs of `dataset` (seed 5, batches of 32): (id, label, bytes)
/// per sample, in delivery order, each sample's checksum checked;
/// `after_first` runs once the first epoch's last batch is released. The
/// session is dropped after the last epoch's last batch.
pub fn epochs(
    sock: &Path,
    dataset: &str,
    count: u32,
    mut after_first: impl FnMut(),
) -> Vec<(u64, i32, Vec<u8>)> {
    let client = Client::connect(sock).expect("connect");
    let mut o = SessionOptions::new(dataset);
    o.seed = 5;
    o.batch_size = 32;
    o.epoch_count = count;
    let mut s = client.open_session(&o).expect("open");
    let mut out = Vec::new();
    let mut ends = 0;
    while let Some(b) = next_or_end(
        &mut s,
        Duration::from_secs(60),
        &format!("{dataset}: next_batch"),
    ) {
        assert_eq!(b.status(), 0, "{dataset}: batch status");
        for smp in b.samples() {
            assert!(smp.checksum_matches());
            out.push((smp.id(), smp.label(), smp.to_vec()));
        }
        let end_of_epoch = b.is_end_of_epoch();
        s.release(b).expect("release");
        if end_of_epoch {
            ends += 1;
            if ends == 1 {
                after_first();
            }
            if ends == count {
                break;
            }
        }
    }
    out
}

/// What the remote loader of [`store_outage`] saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub good_before: u64,
    pub error_batches: u64,
    pub failed_samples: u64,
    pub good_after: u64,
}

/// How long the phases of [`store_outage`] may take.
pub struct Outage {
    /// Samples served before the store is killed.
    pub served_first: u64,
    /// How long the remote loader may take to see good batches again.
    pub recovery: Duration,
    /// How long an error batch may take to come once the store is down.
    pub error_within: Duration,
}

/// The store killed mid-run: the loader of dataset `synth` (`spec`) gets
/// error batches with failed samples marked, the filesystem dataset
/// `local` serves two epochs meanwhile, and after `restart` the same
/// session gets good batches again. Then the agent's health and balance
/// are checked and it is stopped.
pub fn store_outage(
    agent: TestAgent,
    spec: &SynthSpec,
    local: &SynthSpec,
    o: Outage,
    kill: impl FnOnce(),
    restart: impl FnOnce(),
) {
    let saw_error = AtomicBool::new(false);
    let restarted = AtomicBool::new(false);
    let stop = AtomicBool::new(true);
    std::thread::scope(|s| {
        let (sock, saw_error, restarted) = (&agent.sock, &saw_error, &restarted);
        let remote = s.spawn(move || {
            let client = Client::connect(sock).unwrap();
            let mut opts = SessionOptions::new("synth");
            opts.batch_size = 8;
            opts.epoch_count = 50;
            let mut session = client.open_session(&opts).unwrap();
            let mut seen = Seen::default();
            let end = Instant::now() + o.recovery;
            while seen.good_after < 3 {
                assert!(Instant::now() < end, "no recovery: {seen:?}");
                let b = session.next_batch(Some(Duration::from_secs(60))).unwrap();
                if b.status() == 0 {
                    for smp in b.samples() {
                        verify(spec, &smp);
                    }
                    if restarted.load(Ordering::SeqCst) && seen.error_batches > 0 {
                        seen.good_after += 1;
                    } else if seen.error_batches == 0 {
                        seen.good_before += 1;
                    }
                } else {
                    assert_eq!(b.status(), ErrorCode::Io.as_i32(), "batch status");
                    seen.error_batches += 1;
                    for smp in b.samples() {
                        if smp.status() != 0 {
                            assert_eq!(smp.status(), ErrorCode::Io.as_i32());
                            seen.failed_samples += 1;
                        } else {
                            verify(spec, &smp);
                        }
                    }
                    saw_error.store(true, Ordering::SeqCst);
                }
                session.release(b).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
            session.close().unwrap();
            seen
        });
        let m = Arc::clone(&agent.metrics);
        wait_for("the first batches", Duration::from_secs(60), || {
            m.samples_served.get() >= o.served_first
        });
        kill();
        eprintln!("killed the store");
        // The other dataset serves two whole epochs while the store is down.
        let stop = &stop;
        let healthy =
            s.spawn(move || honest_loader_of(sock, "local", local, honest(2, 32, 2), stop));
        wait_for("an error batch", o.error_within, || {
            saw_error.load(Ordering::SeqCst)
        });
        assert_eq!(
            healthy.join().unwrap(),
            2,
            "the healthy dataset stopped serving"
        );
        restart();
        restarted.store(true, Ordering::SeqCst);
        eprintln!("restarted the store");
        let seen = remote.join().unwrap();
        eprintln!("{seen:?}");
        assert!(seen.good_before > 0 && seen.error_batches > 0 && seen.failed_samples > 0);
        assert!(seen.good_after >= 3);
    });
    assert!(agent.metrics.read_errors.get() > 0);
    let health = agent.metrics.dataset_healths();
    assert!(
        health["synth"].ready && health["synth"].read_errors > 0,
        "{health:?}"
    );
    assert_eq!(health["local"].read_errors, 0, "{health:?}");
    agent.wait_idle(Duration::from_secs(20)).assert_balanced();
    agent.stop();
}

/// Each sample's bytes by id, from one epoch of `dataset` ([`epochs`]).
#[allow(dead_code)]
pub fn bytes_by_id(sock: &Path, dataset: &str) -> std::collections::HashMap<u64, Vec<u8>> {
    epochs(sock, dataset, 1, || {})
        .into_iter()
        .map(|(id, _, b)| (id, b))
        .collect()
}

/// Checks the batches of 32 of a mixture of two datasets ([`epochs`]'
/// samples): ids below `split` are `a`'s samples, the rest `b`'s at
/// `id - split`; every batch takes `quota` of `a`'s and the rest of `b`'s,
/// each sample with its dataset's bytes.
#[allow(dead_code)]
pub fn assert_two_source_batches(
    mix: &[(u64, i32, Vec<u8>)],
    split: u64,
    quota: (usize, usize),
    a: &std::collections::HashMap<u64, Vec<u8>>,
    b: &std::collections::HashMap<u64, Vec<u8>>,
) {
    for (n, batch) in mix.chunks(32).enumerate() {
        let from_a = batch.iter().filter(|(id, _, _)| *id < split).count();
        assert_eq!((from_a, batch.len() - from_a), quota, "batch {n}");
        for (id, _, bytes) in batch {
            let own = if *id < split {
                &a[id]
            } else {
                &b[&(id - split)]
            };
            assert!(own == bytes, "mixture sample {id}: its dataset's bytes");
        }
    }
}
