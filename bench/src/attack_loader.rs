//! Loaders that read epoch after epoch from one agent while it is under
//! attack (`bench/run attacks`): every sample's bytes are checked against
//! the synthetic dataset (header, every content byte, its id and size),
//! not only its CRC; every batch's time and wait is kept, so that the
//! rate and the longest wait of any window can be told afterwards.

use granary::{Client, ErrorCode, SessionOptions};
use granary_tools::synth::{self, SynthSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one `next_batch` may wait before the loader counts a timeout.
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// What a loader saw so far.
#[derive(Debug, Default)]
pub struct LoaderStats {
    /// Samples whose bytes were right.
    pub samples: AtomicU64,
    /// Samples delivered with wrong bytes (any byte, its id or its size).
    pub wrong: AtomicU64,
    /// `next_batch` calls that reached [`BATCH_TIMEOUT`].
    pub timeouts: AtomicU64,
    /// Every error (failed batch or sample, lost session), with when.
    pub errors: Mutex<Vec<(Instant, String)>>,
    /// Per batch: when it came and how long `next_batch` waited for it.
    pub batches: Mutex<Vec<(Instant, Duration)>>,
}

impl LoaderStats {
    /// Batches delivered in `[from, to)` and the longest wait of a batch
    /// that came in it (a wait still going on at `to` counts up to `to`).
    pub fn window(&self, from: Instant, to: Instant) -> (u64, Duration) {
        let b = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        let mut longest = Duration::ZERO;
        let mut last = from;
        for &(at, wait) in b.iter() {
            if at >= from && at < to {
                n += 1;
                longest = longest.max(wait);
            }
            if at < to {
                last = last.max(at);
            }
        }
        // Nothing since the last batch: that gap is a wait too.
        (n, longest.max(to.saturating_duration_since(last)))
    }

    /// Errors so far.
    pub fn error_count(&self) -> usize {
        self.errors.lock().map_or(0, |e| e.len())
    }

    fn error(&self, what: String) {
        if let Ok(mut e) = self.errors.lock() {
            e.push((Instant::now(), what));
        }
    }
}

/// A loader thread.
pub struct Loader {
    /// Its name (`A0`, `B1`, …).
    pub name: String,
    /// What it saw.
    pub stats: Arc<LoaderStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How a loader reads.
#[derive(Clone, Debug)]
pub struct LoaderPlan {
    /// The agent's socket.
    pub sock: PathBuf,
    /// The dataset's name there.
    pub dataset: String,
    /// What the dataset holds.
    pub spec: SynthSpec,
    /// Shuffle seed.
    pub seed: u64,
    /// Samples per batch.
    pub batch: u32,
    /// Pause after each batch (the training step).
    pub pause: Duration,
}

impl Loader {
    /// Starts reading, epoch after epoch, until stopped.
    pub fn spawn(name: &str, plan: LoaderPlan) -> Loader {
        let stats = Arc::new(LoaderStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, halt) = (Arc::clone(&stats), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name(format!("loader-{name}"))
            .spawn(move || run(&plan, &st, &halt))
            .ok();
        if thread.is_none() {
            stats.error("could not start the loader thread".into());
        }
        Loader {
            name: name.to_owned(),
            stats,
            stop,
            thread,
        }
    }

    /// Stops it after the batch in hand.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(plan: &LoaderPlan, st: &LoaderStats, stop: &AtomicBool) {
    let mut first_epoch = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let client = match Client::connect(&plan.sock) {
            Ok(c) => c,
            Err(e) => {
                st.error(format!("connect: {e}"));
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let mut o = SessionOptions::new(plan.dataset.clone());
        o.seed = plan.seed;
        o.batch_size = plan.batch;
        o.first_epoch = first_epoch;
        o.epoch_count = 1000;
        let mut s = match client.open_session(&o) {
            Ok(s) => s,
            Err(e) => {
                st.error(format!("open: {e}"));
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let t = Instant::now();
            let b = match s.next_batch(Some(BATCH_TIMEOUT)) {
                Ok(b) => b,
                Err(e) if e.code() == ErrorCode::EndOfStream => {
                    first_epoch += 1000;
                    break;
                }
                Err(e) => {
                    if e.code() == ErrorCode::Timeout {
                        st.timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    st.error(format!("next_batch after {:?}: {e}", t.elapsed()));
                    break;
                }
            };
            let got = Instant::now();
            if let Some(code) = b.error() {
                st.error(format!("batch {} failed: {code:?}", b.seq()));
            }
            first_epoch = first_epoch.max(b.epoch());
            for x in b.samples() {
                if x.status() != 0 {
                    st.error(format!("sample {} failed: status {}", x.id(), x.status()));
                    continue;
                }
                let right = synth::verify_sample(&x.to_vec())
                    .is_ok_and(|info| info == plan.spec.sample_info(x.id()))
                    && x.label() == plan.spec.class_of(x.id()) as i32;
                if right {
                    st.samples.fetch_add(1, Ordering::Relaxed);
                } else {
                    st.wrong.fetch_add(1, Ordering::Relaxed);
                    st.error(format!("sample {}: wrong bytes", x.id()));
                }
            }
            if let Ok(mut v) = st.batches.lock() {
                v.push((got, got.duration_since(t)));
            }
            if let Err(e) = s.release(b) {
                st.error(format!("release: {e}"));
                break;
            }
            std::thread::sleep(plan.pause);
        }
    }
}
