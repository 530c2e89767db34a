//! Directories computed off the engine thread.
//!
//! `Directory::compute` scores every sample against every virtual id of
//! the view: its cost grows with the view's size times the dataset's, a
//! second or more for a large job, and the engine thread must not stop
//! for it (its sessions' heartbeats and batches would). The engine gathers
//! the inputs ([`Inputs`], from `PeerTier::directory_inputs`), a [`Job`]
//! computes the directory on a thread of its own, and the engine installs
//! it when it is done (`PeerTier::set_directory`). Meanwhile the dataset
//! routes every miss to the store, as before any directory.

use granary_peer::keep::{Directory, KeepError};
use granary_peer::view::View;
use std::io;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// What a dataset's directory is computed from.
#[derive(Debug)]
pub(crate) struct Inputs {
    pub view: Arc<View>,
    pub fingerprint: u64,
    /// Every sample's size, rounded up to the cache's extent alignment.
    pub sizes: Vec<u64>,
    /// Each member's keep budget for the dataset.
    pub budgets: Vec<u64>,
}

/// A directory computed, or why not, and how long it took.
#[derive(Debug)]
pub(crate) struct Computed {
    pub fingerprint: u64,
    pub dir: Result<Directory, KeepError>,
    pub took: Duration,
}

/// One directory being computed on its own thread.
#[derive(Debug)]
pub(crate) struct Job {
    /// The digest of the view it is computed for.
    pub view: [u8; 32],
    rx: Receiver<Computed>,
}

impl Job {
    /// Starts computing. With `hold`, the thread waits for a read lock on
    /// it first (tests hold the write lock to keep a computation running).
    pub(crate) fn spawn(
        name: &str,
        inputs: Inputs,
        hold: Option<Arc<RwLock<()>>>,
    ) -> io::Result<Job> {
        let view = inputs.view.digest().0;
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(format!("granary-dir-{name}"))
            .spawn(move || {
                let _held = hold.as_ref().map(|h| h.read());
                let start = Instant::now();
                let dir = Directory::compute(
                    &inputs.view,
                    inputs.fingerprint,
                    &inputs.sizes,
                    &inputs.budgets,
                );
                // The engine may have moved on to another view: nobody
                // waits for this one then.
                let _ = tx.send(Computed {
                    fingerprint: inputs.fingerprint,
                    dir,
                    took: start.elapsed(),
                });
            })?;
        Ok(Job { view, rx })
    }

    /// The result once computed; `Some(None)` when the thread ended
    /// without one (it panicked).
    pub(crate) fn try_take(&self) -> Option<Option<Computed>> {
        match self.rx.try_recv() {
            Ok(c) => Some(Some(c)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_peer::view::Member;

    #[test]
    fn a_job_computes_what_the_engine_thread_would_and_waits_for_its_hold() {
        let view = Arc::new(
            View::new(
                "j",
                1,
                (0..8).map(|i| Member::new(format!("n{i}"), format!("h:{i}"), 1 << 30)),
            )
            .unwrap(),
        );
        let sizes: Vec<u64> = (0..1000).map(|i| 4096 * (1 + i % 3)).collect();
        let budgets = vec![1 << 20; 8];
        let want = Directory::compute(&view, 42, &sizes, &budgets).unwrap();
        let hold = Arc::new(RwLock::new(()));
        let guard = hold.write().unwrap();
        let job = Job::spawn(
            "t",
            Inputs {
                view: Arc::clone(&view),
                fingerprint: 42,
                sizes,
                budgets,
            },
            Some(Arc::clone(&hold)),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(job.try_take().is_none(), "held back: nothing yet");
        assert_eq!(job.view, view.digest().0);
        drop(guard);
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            if let Some(c) = job.try_take() {
                break c.expect("a result");
            }
            assert!(Instant::now() < deadline, "never computed");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(got.fingerprint, 42);
        assert_eq!(got.dir.unwrap().digest(), want.digest());
    }
}
