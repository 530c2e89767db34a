//! A harness for the engine's own tests and fuzzing: the engine over a fake
//! source and a clock the caller moves. The caller is the loader (it
//! attaches the session's ring segment and maps the arena, as libgranary
//! does) and decides when each read completes.

use super::clock::manual::ManualClock;
use super::Engine;
use crate::config::Config;
use crate::dataset::Dataset;
use crate::metrics::Metrics;
use crate::source::{Completion, FailureKind, SampleError, SampleMeta, SampleSource, SourceFull};
use granary_shm::arena::{ArenaSlice, ArenaView};
use granary_shm::handshake::OpenSession;
use granary_shm::layout::BATCH_END_OF_STREAM;
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::LoaderSegment;
use granary_shm::validate::copy_sample_table;
use granary_shm::{BatchDescriptor, ReleaseDescriptor, SampleEntry};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bytes of sample `i` (its length is `size(i)`).
pub(crate) fn content(i: u64) -> Vec<u8> {
    content_of(i, size(i))
}

/// The first `len` bytes of sample `i`'s pattern.
pub(crate) fn content_of(i: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8) ^ (k as u8).wrapping_mul(31))
        .collect()
}

pub(crate) fn size(i: u64) -> u64 {
    1000 + (i % 7) * 300
}

/// What the test tells the fake source, and what it saw.
#[derive(Default)]
pub(crate) struct Script {
    /// Complete every submitted read at the next poll.
    pub(crate) auto: bool,
    /// Reads submitted and not completed: (tag, sample, destination).
    pub(crate) submitted: VecDeque<(u64, u64, ArenaSlice)>,
    /// Failures to answer, per sample, one per attempt, before succeeding.
    pub(crate) failures: HashMap<u64, VecDeque<FailureKind>>,
    /// Samples never answered while in this set.
    pub(crate) held: Vec<u64>,
    /// Attempts per sample.
    pub(crate) attempts: HashMap<u64, u32>,
}

pub(crate) struct FakeSource {
    pub(crate) n: u64,
    /// Bytes added to every sample's `size(i)`.
    pub(crate) extra: u64,
    pub(crate) capacity: u32,
    pub(crate) script: Arc<Mutex<Script>>,
    pub(crate) wake: File,
}

impl SampleSource for FakeSource {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn len(&self) -> u64 {
        self.n
    }
    fn meta(&self, index: u64) -> SampleMeta {
        SampleMeta {
            sample_id: 1000 + index,
            label: (index % 10) as i32,
            size: size(index) + self.extra,
        }
    }
    fn version(&self, index: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(&index.to_le_bytes());
    }
    fn total_bytes(&self) -> u64 {
        (0..self.n).map(|i| size(i) + self.extra).sum()
    }
    fn describe(&self, index: u64) -> String {
        format!("fake://{index}")
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn in_flight(&self) -> usize {
        self.script.lock().unwrap().submitted.len()
    }
    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        let mut s = self.script.lock().unwrap();
        if s.submitted.len() >= self.capacity as usize {
            return Err(SourceFull);
        }
        *s.attempts.entry(index).or_default() += 1;
        s.submitted.push_back((tag, index, dest));
        Ok(())
    }
    fn poll_completions(
        &mut self,
        _wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let mut s = self.script.lock().unwrap();
        if !s.auto {
            return Ok(0);
        }
        let mut kept = VecDeque::new();
        let mut n = 0;
        while let Some((tag, index, dest)) = s.submitted.pop_front() {
            if s.held.contains(&index) {
                kept.push_back((tag, index, dest));
                continue;
            }
            n += 1;
            if let Some(kind) = s.failures.get_mut(&index).and_then(|f| f.pop_front()) {
                out.push(Completion {
                    tag,
                    result: Err(SampleError::new(kind, format!("scripted {kind}"))),
                });
                continue;
            }
            let bytes = content_of(index, dest.len() as u64);
            assert_eq!(dest.copy_from(&bytes), bytes.len());
            out.push(Completion {
                tag,
                result: Ok(bytes.len() as u32),
            });
        }
        s.submitted = kept;
        Ok(n)
    }
    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }
}

/// The loader's side of one session.
pub(crate) struct Loader {
    pub(crate) ready: Consumer<BatchDescriptor>,
    pub(crate) release: Producer<ReleaseDescriptor>,
    pub(crate) arena: ArenaView,
    pub(crate) _segment: LoaderSegment,
}

impl Loader {
    /// Takes every published batch: (descriptor, sample table).
    pub(crate) fn take(&mut self) -> Vec<(BatchDescriptor, Vec<SampleEntry>)> {
        let mut got = Vec::new();
        while let Some(d) = self.ready.try_pop().unwrap() {
            let mut table = Vec::new();
            if d.flags & BATCH_END_OF_STREAM == 0 {
                copy_sample_table(self.arena.region(), &d, &mut table).unwrap();
            }
            got.push((d, table));
        }
        got
    }

    /// Takes every published batch ([`Loader::take`]) and gives each back.
    pub(crate) fn take_and_give_back(&mut self) -> Vec<(BatchDescriptor, Vec<SampleEntry>)> {
        let got = self.take();
        for (d, _) in &got {
            self.give_back(d);
        }
        got
    }

    pub(crate) fn give_back(&mut self, d: &BatchDescriptor) {
        let rel = ReleaseDescriptor {
            seq: d.seq,
            token: d.token,
        };
        assert!(self.release.try_push(rel).unwrap());
    }

    pub(crate) fn bytes(&self, e: &SampleEntry) -> Vec<u8> {
        self.arena.read_at(e.offset, e.length as usize).unwrap()
    }
}

pub(crate) struct Harness {
    pub(crate) engine: Engine,
    pub(crate) clock: ManualClock,
    pub(crate) script: Arc<Mutex<Script>>,
    /// The connection id of the next session (one connection each, as
    /// libgranary opens them).
    pub(crate) next_conn: u64,
    pub(crate) _dir: tempfile::TempDir,
}

pub(crate) const SAMPLES: u64 = 64;

pub(crate) fn config(dir: &std::path::Path, extra: &str) -> Config {
    let toml = format!(
        r#"
[arena]
size = "64MiB"
hugepages = "off"
populate = false

[socket]
path = "{}/agent.sock"

[prefetch]
initial_window = 1
window_batches = 4
read_timeout_ms = 1000
max_inflight_reads = 32
{extra}

[[dataset]]
name = "placeholder"
root = "/nonexistent"
"#,
        dir.display()
    );
    let mut cfg = Config::from_toml_str(&toml).expect("test config");
    cfg.datasets.clear();
    cfg
}

pub(crate) fn harness(extra: &str, relaxed: bool) -> Harness {
    harness_with(extra, relaxed, &[("fake", 0)])
}

/// A harness over fake datasets `(name, bytes added to every sample)`.
pub(crate) fn harness_with(extra: &str, relaxed: bool, datasets: &[(&str, u64)]) -> Harness {
    harness_sized(extra, relaxed, datasets, SAMPLES, 64)
}

/// [`harness_with`] over datasets of `n` samples whose sources take
/// `capacity` reads at a time.
pub(crate) fn harness_sized(
    extra: &str,
    relaxed: bool,
    datasets: &[(&str, u64)],
    n: u64,
    capacity: u32,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), extra);
    let script = Arc::new(Mutex::new(Script::default()));
    let datasets = datasets
        .iter()
        .map(|&(name, extra)| {
            let src = FakeSource {
                n,
                extra,
                capacity,
                script: script.clone(),
                wake: File::open("/dev/null").unwrap(),
            };
            let mut ds = Dataset::from_source(name, Box::new(src));
            ds.relaxed = relaxed;
            ds
        })
        .collect();
    let clock = ManualClock::new();
    let engine = Engine::with_clock(
        cfg,
        Arc::new(Metrics::default()),
        datasets,
        Box::new(clock.clone()),
    )
    .unwrap();
    Harness {
        engine,
        clock,
        script,
        next_conn: 0,
        _dir: dir,
    }
}

impl Harness {
    pub(crate) fn open(&mut self, batch: u32, epochs: u32) -> (u64, Loader) {
        self.open_on("fake", batch, epochs)
    }

    pub(crate) fn open_on(&mut self, dataset: &str, batch: u32, epochs: u32) -> (u64, Loader) {
        self.open_at(dataset, batch, epochs, 0)
    }

    pub(crate) fn open_at(
        &mut self,
        dataset: &str,
        batch: u32,
        epochs: u32,
        first_batch: u64,
    ) -> (u64, Loader) {
        self.open_with(request(dataset, batch, epochs, first_batch))
    }

    /// Opens a session with the open request `req`.
    pub(crate) fn open_with(&mut self, req: OpenSession) -> (u64, Loader) {
        let dataset = req.dataset.clone();
        let ds = self
            .engine
            .datasets
            .iter()
            .position(|d| d.name == dataset)
            .expect("a dataset of the harness");
        let conn = self.next_conn;
        self.next_conn += 1;
        let (opened, sid) = self.engine.open_session(conn, ds, &req).unwrap();
        let s = &self.engine.sessions[&sid];
        let mut segment =
            LoaderSegment::attach_fd(s.segment().fd().unwrap(), Some(opened.reply.instance_epoch))
                .unwrap();
        let (ready, release) = segment.take_endpoints().unwrap();
        let arena = ArenaView::map(opened.arena_fd, opened.reply.arena_size).unwrap();
        (
            sid,
            Loader {
                ready,
                release,
                arena,
                _segment: segment,
            },
        )
    }

    pub(crate) fn turns(&mut self, n: usize) {
        for _ in 0..n {
            self.engine.turn().unwrap();
        }
    }

    pub(crate) fn auto(&self, on: bool) {
        self.script.lock().unwrap().auto = on;
    }

    #[cfg_attr(not(test), allow(dead_code))] // used by the unit tests only
    pub(crate) fn submitted(&self) -> Vec<u64> {
        let s = self.script.lock().unwrap();
        s.submitted.iter().map(|(_, i, _)| *i).collect()
    }
}

/// Every batch of a session, released as it arrives, until END_OF_STREAM.
#[cfg_attr(not(test), allow(dead_code))] // used by the unit tests only
pub(crate) fn drain(
    h: &mut Harness,
    loader: &mut Loader,
) -> Vec<(BatchDescriptor, Vec<SampleEntry>)> {
    let mut all = Vec::new();
    for _ in 0..10_000 {
        h.engine.turn().unwrap();
        for (d, t) in loader.take() {
            loader.give_back(&d);
            let end = d.flags & BATCH_END_OF_STREAM != 0;
            all.push((d, t));
            if end {
                return all;
            }
        }
        h.clock.advance(Duration::from_millis(1));
    }
    panic!("no end of stream after 10,000 turns");
}

/// The open request the harness's loaders send: seed 3, rank 0 of 1, the
/// agent's rings, exact order.
pub(crate) fn request(dataset: &str, batch: u32, epochs: u32, first_batch: u64) -> OpenSession {
    OpenSession {
        seed: 3,
        epoch_count: epochs,
        first_batch,
        ..OpenSession::new(dataset, batch)
    }
}
