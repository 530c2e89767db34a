//! Each dataset's peer directory, computed off the engine thread
//! (`peers/directory.rs`) whatever the view's and the dataset's sizes.
//!
//! * Once a view is held and a dataset's catalog is ready, the engine
//!   gathers the directory's inputs (the fingerprint and the samples'
//!   sizes: one pass over the catalog) and a thread of its own computes
//!   the directory; the engine installs it at the first turn after it is
//!   done. A directory computed for a view the agent no longer holds is
//!   dropped, and the new view's is computed.
//! * Until then the dataset has no directory: its misses are read from the
//!   store (`Route::Store`), kept samples are not released, exact-order
//!   sessions open and read as usual, and a locality-mode `AssignmentQuery`
//!   or open waits for the directory (its loader's open timeout applies),
//!   then is answered as if it had just arrived.
//! * A directory that cannot be computed is said once (warn) for that view;
//!   its dataset reads the store.
//! * At start, before any loader is served, the engine waits (up to 15 s)
//!   for the directories of a configured view (`"static"`, `"slurm"`), so
//!   that the first sessions' reads are routed as before.

use super::{Engine, Waiting};
use crate::peers::directory::Job;
use crate::server::ConnId;
use granary_shm::handshake::OpenSession;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The directories being computed, and the requests waiting for them.
#[derive(Debug, Default)]
pub(crate) struct Directories {
    /// By dataset index.
    jobs: HashMap<usize, Job>,
    /// (dataset, view digest) whose directory could not be computed.
    failed: Vec<(usize, [u8; 32])>,
    /// Locality-mode queries and opens waiting for their dataset's
    /// directory.
    pub(crate) waiting: Vec<(usize, ConnId, OpenSession, Waiting)>,
    /// Holds computations back while a test holds its write lock.
    pub(crate) hold: Option<Arc<RwLock<()>>>,
}

impl Directories {
    /// Forgets what connection `conn` was waiting for.
    pub(super) fn forget(&mut self, conn: ConnId) {
        self.waiting.retain(|(_, c, _, _)| *c != conn);
    }
}

impl Engine {
    /// Installs the directories computed since the last turn, and starts
    /// computing those of the datasets that have none; answers the
    /// requests that waited for them. Returns whether one was installed.
    pub(super) fn peer_directories(&mut self) -> bool {
        let Some(tier) = self.peers.as_mut() else {
            self.directories.jobs.clear();
            return false;
        };
        let view = tier.view().digest().0;
        let dirs = &mut self.directories;
        dirs.jobs.retain(|_, j| j.view == view);
        let mut done = Vec::new();
        for (&ds, job) in &dirs.jobs {
            let Some(result) = job.try_take() else {
                continue;
            };
            done.push(ds);
            let name = &self.datasets[ds].name;
            match result.map(|c| (c.fingerprint, c.took, c.dir)) {
                Some((fp, took, Ok(dir))) => {
                    tracing::info!(
                        dataset = %name,
                        fingerprint = format_args!("{fp:016x}"),
                        kept_here = dir.kept_bytes(tier.me()),
                        took_ms = took.as_millis() as u64,
                        "peer directory computed"
                    );
                    tier.set_directory(ds, fp, dir);
                }
                Some((_, _, Err(e))) => {
                    tracing::warn!(dataset = %name, "no peer directory: {e}; reading the store");
                    dirs.failed.push((ds, view));
                }
                None => {
                    tracing::error!(dataset = %name, "the peer directory's thread ended without one; reading the store");
                    dirs.failed.push((ds, view));
                }
            }
        }
        for ds in &done {
            dirs.jobs.remove(ds);
        }
        dirs.failed.retain(|(_, v)| *v == view);
        for (ds, d) in self.datasets.iter().enumerate() {
            if dirs.jobs.contains_key(&ds) || dirs.failed.contains(&(ds, view)) {
                continue;
            }
            let Some(inputs) = d
                .source()
                .and_then(|src| tier.directory_inputs(ds, &d.name, src))
            else {
                continue;
            };
            match Job::spawn(&d.name, inputs, dirs.hold.clone()) {
                Ok(job) => {
                    dirs.jobs.insert(ds, job);
                }
                Err(e) => {
                    tracing::warn!(dataset = %d.name, "no peer directory: starting its thread: {e}; reading the store");
                    dirs.failed.push((ds, view));
                }
            }
        }
        if done.is_empty() {
            return false;
        }
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.directories.waiting)
            .into_iter()
            .partition(|(ds, _, _, _)| done.contains(ds));
        self.directories.waiting = still;
        for (_, conn, req, waiting) in ready {
            match waiting {
                Waiting::Open => self.handle_open(conn, req),
                Waiting::Query => self.assignment_query(conn, req),
            }
        }
        true
    }

    /// Waits up to `limit` for the directories being computed (at start,
    /// before any session: a configured view's).
    pub(super) fn wait_for_directories(&mut self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        self.peer_directories();
        while !self.directories.jobs.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.peer_directories();
        }
    }

    /// Whether dataset `ds`'s directory is being computed.
    pub(super) fn directory_pending(&mut self, ds: usize) -> bool {
        self.peer_directories();
        self.directories.jobs.contains_key(&ds)
    }

    /// Parks a locality-mode request until dataset `ds`'s directory is
    /// computed.
    pub(super) fn wait_for_directory(
        &mut self,
        ds: usize,
        conn: ConnId,
        req: OpenSession,
        waiting: Waiting,
    ) {
        tracing::debug!(
            conn,
            dataset = %self.datasets[ds].name,
            "locality request waits for the peer directory"
        );
        self.directories.waiting.push((ds, conn, req, waiting));
    }
}
