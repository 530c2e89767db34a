//! Warm restart of a real `granaryd`: the agent is killed (SIGKILL) or
//! stopped (SIGTERM) while a loader reads, started again on the same
//! configuration, and the loader (libgranary's resume) reads on. The
//! restarted agent finds its arena file and index, checks every sample's
//! CRC-32C and its dataset's fingerprint, and serves the samples it held
//! without reading them again from the store: its reads up to the end of
//! the loader's epochs are at most 1 % of the samples it held (those not
//! held yet are read, of course). Every byte is verified by the loader.
//!
//! Also: a sample corrupted in the arena file between stop and start is
//! dropped and read again; a dataset changed meanwhile (a file's mtime)
//! loses its own samples only.

mod common;
mod common_peers;
mod common_s3;

use common::{resuming_loader, watchdog, watchdog_fn, AgentDir, DATASET};
use common_peers::{free_port, Agent};
use common_s3::{s3_table, upload, weed_and_synth};
use granary_agent::warm::{Files, Index};
use granary_tools::synth::SynthSpec;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const FILES: u64 = 400;
const MEAN: u64 = 4_000;
const BATCH: u32 = 16;

/// A `granaryd` on `config`, its metrics on a free loopback port.
fn agent(dir: &Path, config: PathBuf, sock: PathBuf, metrics: SocketAddr) -> Agent {
    Agent {
        node: 0,
        dir: dir.to_path_buf(),
        config,
        sock,
        metrics,
        child: None,
    }
}

fn metrics_addr() -> SocketAddr {
    let ip = Agent::ip(0);
    format!("{ip}:{}", free_port(&ip)).parse().unwrap()
}

/// Stops the agent with SIGTERM and waits for it to exit.
fn sigterm(a: &mut Agent) {
    let mut c = a.child.take().expect("running");
    let st = c.stop();
    assert!(st.success(), "granaryd stopped with {st}:\n{}", a.log());
}

/// A loader thread: `epochs` epochs of `dataset`, `pause` after each batch,
/// every sample verified against `spec`, resuming across agent restarts.
/// Returns each epoch's sample ids and the session's resumes.
fn loader(
    sock: &Path,
    dataset: &str,
    spec: &SynthSpec,
    epochs: u32,
    pause: Duration,
    batches: &Arc<AtomicU64>,
) -> JoinHandle<(Vec<Vec<u64>>, u32)> {
    let batches = Arc::clone(batches);
    resuming_loader(sock, dataset, spec, (BATCH, epochs, 11), move || {
        batches.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(pause);
    })
}

fn assert_each_once(seen: Vec<Vec<u64>>, n: u64) {
    for (epoch, mut ids) in seen.into_iter().enumerate() {
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..n).collect::<Vec<_>>(),
            "epoch {epoch}: every sample exactly once"
        );
    }
}

fn wait_batches(batches: &AtomicU64, at_least: u64) {
    common::wait_for("the loader's batches", Duration::from_secs(60), || {
        batches.load(Ordering::Relaxed) >= at_least
    });
}

/// What the restarted agent's metrics say.
#[derive(Debug)]
struct After {
    reads: f64,
    recovered: f64,
    crc: f64,
    changed: f64,
    placement: f64,
}

fn after(a: &Agent) -> After {
    let o = |outcome: &str| {
        a.metric(
            "granary_warm_restart_samples_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    After {
        reads: a.metric("granary_reads_total", ""),
        recovered: o("recovered"),
        crc: o("crc"),
        changed: o("changed"),
        placement: o("placement"),
    }
}

enum Stop {
    Kill,
    Term,
}

/// One agent on `config`, a loader of three epochs; the agent is stopped
/// after `stop_after` batches, started again, and the loader reads on.
/// Returns the restarted agent's figures (read when the loader is done) and
/// how long the restart took.
fn restart_while_reading(
    dir: &Path,
    config: PathBuf,
    sock: PathBuf,
    metrics: SocketAddr,
    spec: &SynthSpec,
    stop_after: u64,
    stop: Stop,
) -> (After, Duration, Agent) {
    let mut a = agent(dir, config, sock.clone(), metrics);
    a.start();
    let batches = Arc::new(AtomicU64::new(0));
    let l = loader(&sock, DATASET, spec, 3, Duration::from_millis(10), &batches);
    wait_batches(&batches, stop_after);
    let t0 = Instant::now();
    match stop {
        Stop::Kill => a.kill9(),
        Stop::Term => sigterm(&mut a),
    }
    a.start();
    let took = t0.elapsed();
    let (seen, resumes) = l.join().expect("the loader");
    assert_each_once(seen, spec.num_files);
    assert_eq!(resumes, 1, "the loader resumed once");
    (after(&a), took, a)
}

/// [`restart_while_reading`] with the agent (its folder, configuration,
/// socket and metrics address) stopped by `stop` 15 batches into epoch 1,
/// epoch 0 read in full: the arena holds every sample and the index has
/// caught up, so the restarted agent recovers them all, none failing a
/// check, and reads (almost) nothing from the store again. `what` names
/// the case in the log.
fn restarts_warm_mid_epoch_1(
    (dir, config, sock, metrics): (&Path, PathBuf, PathBuf, SocketAddr),
    spec: &SynthSpec,
    stop: Stop,
    what: &str,
) {
    let per_epoch = FILES.div_ceil(u64::from(BATCH));
    let (f, took, a) =
        restart_while_reading(dir, config, sock, metrics, spec, per_epoch + 15, stop);
    eprintln!(
        "warm restart ({what} mid-epoch 1): {f:?}; restarted in {} ms",
        took.as_millis()
    );
    assert_eq!(f.recovered, FILES as f64, "{}", a.log());
    assert_eq!(f.crc + f.changed + f.placement, 0.0);
    assert!(
        f.reads <= 0.01 * f.recovered,
        "{} store reads after the restart, the arena held {}",
        f.reads,
        f.recovered
    );
}

fn fs_config(d: &AgentDir, metrics: SocketAddr) {
    d.write_config(
        "64MiB",
        "off",
        &format!("[metrics]\naddress = \"{metrics}\""),
    );
}

#[test]
fn a_killed_agent_restarts_warm_mid_epoch() {
    let _w = watchdog("a_killed_agent_restarts_warm_mid_epoch", 180);
    let d = AgentDir::new(None, FILES, MEAN);
    let m = metrics_addr();
    fs_config(&d, m);
    // Epoch 0 read in full, then 15 batches (150 ms or more) into epoch 1:
    // the arena holds every sample, and the index has caught up.
    restarts_warm_mid_epoch_1(
        (d.dir.path(), d.config.clone(), d.sock.clone(), m),
        &d.spec,
        Stop::Kill,
        "fs, SIGKILL",
    );
}

/// SIGKILL in the middle of the first epoch, a few milliseconds after the
/// agent's last read landed (well within the index's rewrite interval of
/// 1 s): the journal has every sample the arena held.
#[test]
fn a_killed_agent_restarts_warm_in_its_first_epoch() {
    let _w = watchdog("a_killed_agent_restarts_warm_in_its_first_epoch", 180);
    let files = 3_000;
    let d = AgentDir::new(None, files, MEAN);
    let m = metrics_addr();
    fs_config(&d, m);
    let mut a = agent(d.dir.path(), d.config.clone(), d.sock.clone(), m);
    a.start();
    let batches = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let stop_at = 40;
    let l = {
        let (batches, gate) = (Arc::clone(&batches), Arc::clone(&gate));
        resuming_loader(&d.sock, DATASET, &d.spec, (BATCH, 2, 5), move || {
            if batches.fetch_add(1, Ordering::Relaxed) + 1 == stop_at {
                while gate.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    wait_batches(&batches, stop_at);
    // The window fills and its reads land; the index is not rewritten
    // meanwhile (it is, at most once a second).
    let mut last = -1.0;
    let held = loop {
        std::thread::sleep(Duration::from_millis(10));
        let r = a.metric("granary_reads_total", "");
        if r == last && a.metric("granary_reads_in_flight", "") == 0.0 {
            break r;
        }
        last = r;
    };
    a.kill9();
    a.start();
    gate.store(false, Ordering::Relaxed);
    let (seen, resumes) = l.join().expect("the loader");
    assert_each_once(seen, files);
    assert_eq!(resumes, 1);
    let f = after(&a);
    eprintln!(
        "warm restart (fs, SIGKILL mid-epoch 0, {files} samples): the arena held {held} samples; {f:?}"
    );
    assert!(
        held < files as f64,
        "the arena held the whole dataset: not mid-epoch"
    );
    let never_held = files as f64 - held;
    assert!(
        f.reads - never_held <= 0.01 * held,
        "{} store reads after the restart, {never_held} of them samples never held, the arena held {held}",
        f.reads
    );
    assert!(f.recovered >= 0.99 * held, "{f:?}\n{}", a.log());
}

#[test]
fn a_stopped_agent_restarts_warm_mid_epoch() {
    let _w = watchdog("a_stopped_agent_restarts_warm_mid_epoch", 180);
    let d = AgentDir::new(None, 3_000, MEAN);
    let m = metrics_addr();
    fs_config(&d, m);
    // Half of epoch 0: the arena holds what was read so far (and what the
    // window prefetched); SIGTERM writes the index as the agent stops.
    let (f, took, a) = restart_while_reading(
        d.dir.path(),
        d.config.clone(),
        d.sock.clone(),
        m,
        &d.spec,
        12,
        Stop::Term,
    );
    eprintln!(
        "warm restart (fs, SIGTERM mid-epoch 0): {f:?}; restarted in {} ms",
        took.as_millis()
    );
    assert!(f.recovered >= (12 * BATCH) as f64, "{f:?}\n{}", a.log());
    assert_eq!(f.crc + f.changed + f.placement, 0.0);
    assert!(
        f.recovered < 3_000.0,
        "the arena held the whole dataset: not mid-epoch"
    );
    let never_held = 3_000.0 - f.recovered;
    assert!(
        f.reads - never_held <= 0.01 * f.recovered,
        "{} store reads after the restart, {never_held} of them samples never held, the arena held {}",
        f.reads,
        f.recovered
    );
}

#[test]
fn a_killed_agent_on_an_s3_dataset_restarts_warm() {
    let _w = watchdog("a_killed_agent_on_an_s3_dataset_restarts_warm", 300);
    let (weed, tmp, spec) = weed_and_synth(FILES, 10, MEAN);
    let prefix = "warm";
    let report = upload(&weed, &spec.root, prefix);
    assert_eq!(report.files, FILES);
    let sock = tmp.path().join("granary.sock");
    let config = tmp.path().join("granaryd.toml");
    let m = metrics_addr();
    std::fs::write(
        &config,
        format!(
            r#"
[arena]
size = "64MiB"
hugepages = "off"
[socket]
path = "{sock}"
[prefetch]
max_inflight_reads = 64
[metrics]
address = "{m}"
{s3}"#,
            sock = sock.display(),
            s3 = s3_table(DATASET, &weed.endpoint(), prefix, ""),
        ),
    )
    .unwrap();
    let _files = RemoveOnDrop(Files::for_socket(&sock));
    for (stop, name) in [(Stop::Kill, "S3, SIGKILL"), (Stop::Term, "S3, SIGTERM")] {
        let at = (tmp.path(), config.clone(), sock.clone(), m);
        restarts_warm_mid_epoch_1(at, &spec, stop, name);
    }
}

/// Removes an agent's warm-restart files when the test ends.
struct RemoveOnDrop(Files);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        self.0.remove();
    }
}

#[test]
fn a_corrupted_sample_and_a_changed_dataset_are_dropped_alone() {
    let _w = watchdog_fn!(180);
    let d = AgentDir::new(None, FILES, MEAN);
    let other_files = 100;
    let mut other = SynthSpec::new(d.dir.path().join("other"));
    other.num_files = other_files;
    other.mean_size = MEAN;
    granary_tools::synth::generate(&other, |_, _| {}).unwrap();
    let m = metrics_addr();
    d.write_config(
        "64MiB",
        "off",
        &format!(
            "[metrics]\naddress = \"{m}\"\n[[dataset]]\nname = \"other\"\nroot = \"{}\"",
            other.root.display()
        ),
    );
    let mut a = agent(d.dir.path(), d.config.clone(), d.sock.clone(), m);
    a.start();
    // One epoch of each dataset, then a clean stop.
    let none = Arc::new(AtomicU64::new(0));
    let (s, _) = loader(&d.sock, DATASET, &d.spec, 1, Duration::ZERO, &none)
        .join()
        .unwrap();
    assert_each_once(s, FILES);
    let (s, _) = loader(&d.sock, "other", &other, 1, Duration::ZERO, &none)
        .join()
        .unwrap();
    assert_each_once(s, other_files);
    sigterm(&mut a);

    // Between stop and start: one sample's bytes flipped in the arena file,
    // one file of `other` touched (same bytes, a new mtime).
    let files = Files::for_socket(&d.sock);
    let idx = Index::read(&files.index).unwrap().expect("an index");
    let synth_idx = idx.datasets.iter().find(|x| x.name == DATASET).unwrap();
    assert_eq!(synth_idx.records.len() as u64, FILES);
    let victim = synth_idx.records[7];
    flip_byte(&idx.arena_path, victim.offset + victim.len / 2);
    // A sample file: one in a class folder.
    let touched = std::fs::read_dir(&other.root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .find_map(|d| walk_first_file(&d))
        .expect("a file of `other`");
    let f = std::fs::File::options().write(true).open(&touched).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    drop(f);

    a.start();
    let f0 = after(&a);
    eprintln!("warm restart after corruption and a change: {f0:?}");
    assert_eq!(f0.crc, 1.0, "{}", a.log());
    assert_eq!(f0.changed, other_files as f64);
    assert_eq!(f0.recovered, (FILES - 1) as f64);
    let (s, _) = loader(&d.sock, DATASET, &d.spec, 1, Duration::ZERO, &none)
        .join()
        .unwrap();
    assert_each_once(s, FILES);
    assert_eq!(
        a.metric("granary_reads_total", ""),
        1.0,
        "only the corrupted sample is read again"
    );
    let (s, _) = loader(&d.sock, "other", &other, 1, Duration::ZERO, &none)
        .join()
        .unwrap();
    assert_each_once(s, other_files);
    assert_eq!(
        a.metric("granary_reads_total", ""),
        1.0 + other_files as f64,
        "the changed dataset is read again in full"
    );
}

fn walk_first_file(dir: &Path) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_file() {
            return Some(p);
        }
        if p.is_dir() {
            if let Some(f) = walk_first_file(&p) {
                return Some(f);
            }
        }
    }
    None
}

/// Flips one byte of the (mode 0400) arena file at `at`.
fn flip_byte(path: &Path, at: u64) {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let before = std::fs::metadata(path).unwrap().permissions();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
    drop(f);
    std::fs::set_permissions(path, before).unwrap();
}

/// Another arena size, then a torn index: each start is cold, says why in
/// the log, and serves every sample right.
#[test]
fn a_changed_arena_or_a_torn_index_starts_cold() {
    let _w = watchdog("a_changed_arena_or_a_torn_index_starts_cold", 180);
    let d = AgentDir::new(None, FILES, MEAN);
    let m = metrics_addr();
    fs_config(&d, m);
    let mut a = agent(d.dir.path(), d.config.clone(), d.sock.clone(), m);
    let none = Arc::new(AtomicU64::new(0));
    let epoch = |a: &Agent| {
        let (s, _) = loader(&d.sock, DATASET, &d.spec, 1, Duration::ZERO, &none)
            .join()
            .unwrap();
        assert_each_once(s, FILES);
        after(a)
    };
    a.start();
    epoch(&a);
    sigterm(&mut a);

    // 64 MiB → 128 MiB.
    d.write_config("128MiB", "off", &format!("[metrics]\naddress = \"{m}\""));
    a.start();
    let f = epoch(&a);
    assert_eq!(f.recovered, 0.0);
    assert_eq!(f.reads, FILES as f64, "a cold start reads everything");
    assert!(
        a.log()
            .contains("cold start, the arena changed from 67108864 bytes to 134217728 bytes"),
        "{}",
        a.log()
    );
    sigterm(&mut a);

    // The index torn (cut in half).
    let files = Files::for_socket(&d.sock);
    let bytes = std::fs::read(&files.index).unwrap();
    std::fs::write(&files.index, &bytes[..bytes.len() / 2]).unwrap();
    a.start();
    let f = epoch(&a);
    assert_eq!(f.recovered, 0.0);
    assert_eq!(f.reads, FILES as f64);
    assert!(a.log().contains("is torn or not an index"), "{}", a.log());
    eprintln!("cold starts: another arena size, then a torn index; each logged with its reason");
}
