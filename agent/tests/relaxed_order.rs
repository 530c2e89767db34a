//! `order = "relaxed"`: a late sample gives its place to a ready one of a
//! later batch of the same epoch, and every sample still comes exactly once
//! per epoch. A source that holds back every seventh sample makes samples
//! late on purpose; in strict order the same source delivers the plan
//! exactly.

mod common;

use common::{honest_loader_of, next_or_end, verify, watchdog, watchdog_fn, Honest, TestAgent};
use granary::{Client, SessionOptions};
use granary_agent::config::Config;
use granary_agent::dataset::Dataset;
use granary_agent::planner::{EpochPlan, PlanParams};
use granary_agent::source::Completion;
use granary_agent::source::{Catalog, FsSource, SampleMeta, SampleSource, SourceFull};
use granary_shm::arena::ArenaSlice;
use granary_testkit::agent_toml::{fs_dataset, head};
use granary_tools::synth::SynthSpec;
use std::collections::HashSet;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

const FILES: u64 = 700;
const SLOW_EVERY: u64 = 7;
const LAG: Duration = Duration::from_millis(60);

/// A filesystem source whose every seventh sample completes [`LAG`] late.
struct Laggy {
    inner: FsSource,
    slow: HashSet<u64>,
    held: Vec<(Instant, Completion)>,
}

impl SampleSource for Laggy {
    fn kind(&self) -> &'static str {
        "fs"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn meta(&self, index: u64) -> SampleMeta {
        self.inner.meta(index)
    }
    fn version(&self, index: u64, out: &mut Vec<u8>) {
        self.inner.version(index, out);
    }
    fn total_bytes(&self) -> u64 {
        self.inner.total_bytes()
    }
    fn describe(&self, index: u64) -> String {
        self.inner.describe(index)
    }
    fn capacity(&self) -> u32 {
        self.inner.capacity()
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }
    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        if index.is_multiple_of(SLOW_EVERY) {
            self.slow.insert(tag);
        }
        self.inner.submit(tag, index, dest)
    }
    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let start = out.len();
        let mut got = Vec::new();
        let wait = if self.inner.in_flight() == 0 {
            None
        } else {
            wait
        };
        self.inner.poll_completions(wait, &mut got)?;
        let now = Instant::now();
        for c in got {
            if self.slow.remove(&c.tag) {
                self.held.push((now + LAG, c));
            } else {
                out.push(c);
            }
        }
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 <= now {
                out.push(self.held.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        Ok(out.len() - start)
    }
    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.inner.wait_fd()
    }
}

fn start(relaxed: bool) -> (TestAgent, SynthSpec) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let spec = granary_testkit::dataset::synth_at(&data, FILES, 5, 4_000);
    let sock = dir.path().join("granary.sock");
    let prefetch = "max_inflight_reads = 64\nwindow_batches = 8";
    let cfg = Config::from_toml_str(
        &(head("64MiB", &sock, prefetch, "") + &fs_dataset("plain", &data, "")),
    )
    .unwrap();
    let laggy = Laggy {
        inner: FsSource::new(
            Catalog::from_dir(&data).unwrap(),
            64,
            Duration::from_secs(10),
        )
        .unwrap(),
        slow: HashSet::new(),
        held: Vec::new(),
    };
    let mut ds = Dataset::from_source("laggy", Box::new(laggy));
    ds.relaxed = relaxed;
    let agent = TestAgent::start_custom(dir, data, sock, spec.clone(), cfg, vec![ds]);
    (agent, spec)
}

fn params(batch: u32) -> PlanParams {
    PlanParams {
        num_samples: FILES,
        seed: 5,
        rank: 0,
        world_size: 1,
        batch_size: batch,
        drop_last: false,
    }
}

#[test]
fn strict_order_waits_for_late_samples_and_keeps_the_plan() {
    let _w = watchdog_fn!(120);
    let (agent, spec) = start(false);
    let h = Honest::epochs(5, 16, 2);
    // Checks every batch against the plan, byte for byte.
    assert_eq!(
        honest_loader_of(&agent.sock, "laggy", &spec, h, &AtomicBool::new(true)),
        2
    );
    assert_eq!(agent.metrics.relaxed_swaps.get(), 0);
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}

#[test]
fn relaxed_order_moves_late_samples_back_and_delivers_each_once_per_epoch() {
    let _w = watchdog("relaxed_order_moves_late_samples_back", 120);
    let (agent, spec) = start(true);
    let client = Client::connect(&agent.sock).unwrap();
    let mut o = SessionOptions::new("laggy");
    o.seed = 5;
    o.batch_size = 16;
    o.epoch_count = 2;
    let mut s = client.open_session(&o).unwrap();
    let mut epochs: Vec<Vec<Vec<u64>>> = vec![Vec::new(), Vec::new()];
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(30), "next_batch") {
        assert_eq!(b.status(), 0);
        let e = b.epoch() as usize;
        assert_eq!(
            b.index(),
            epochs[e].len() as u64,
            "batch index out of order"
        );
        let mut ids = Vec::new();
        for smp in b.samples() {
            verify(&spec, &smp);
            ids.push(smp.id());
        }
        epochs[e].push(ids);
        s.release(b).unwrap();
    }
    s.close().unwrap();
    let mut moved = 0;
    for (e, got) in epochs.iter().enumerate() {
        let plan = EpochPlan::new(&params(16), e as u32).unwrap();
        let want: Vec<Vec<u64>> = plan.batches().map(<[u64]>::to_vec).collect();
        assert_eq!(got.len(), want.len(), "epoch {e}: batch count");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len(), "epoch {e}: batch size");
        }
        let mut all: Vec<u64> = got.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..FILES).collect::<Vec<_>>(),
            "epoch {e}: not each sample once"
        );
        moved += got.iter().zip(&want).filter(|(g, w)| g != w).count();
    }
    let swaps = agent.metrics.relaxed_swaps.get();
    eprintln!("{swaps} samples moved ahead; {moved} batches differ from the plan");
    assert!(swaps > 0 && moved > 0, "nothing was reordered");
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    agent.stop();
}
