//! Locality-aware sessions (`docs/planner.md`, "Locality-aware
//! assignment"): the rank layout a loader hands in on its connection, the
//! digest of the assignment's inputs that a loader asks for
//! (`AssignmentQuery`) so that every rank of the job can compare it, and the
//! placement a session is planned with.
//!
//! The locality-aware order is only correct when every rank of the job uses
//! it with the same inputs: one rank in exact order and the others in
//! locality order would lose some samples of a step and repeat others. So
//! the agent never falls back silently at open: a loader asks first, the
//! job agrees (all locality with one digest, else all exact), and an open in
//! locality mode names the agreed digest, which the agent checks against
//! its own inputs; any difference refuses the open.

use super::{Engine, Waiting};
use crate::config::Membership;
use crate::planner::placement::Placement;
use crate::server::ConnId;
use granary_peer::assign::{Inputs, Layout};
use granary_shm::handshake::{AssignmentInfo, Message, OpenSession};
use granary_shm::ErrorCode;
use std::sync::Arc;

/// The rank layout a connection handed in, or why it could not be read.
pub(crate) type HandedLayout = Result<Arc<Layout>, String>;

/// Lowercase hex of the first bytes of a digest, for messages.
fn short(digest: &[u8; 32]) -> String {
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

impl Engine {
    /// Records the layout (or the error) handed in on `conn`.
    pub(super) fn take_layout(&mut self, conn: ConnId, bytes: Result<Vec<u8>, String>) {
        let layout =
            bytes.and_then(|b| Layout::decode(&b).map(Arc::new).map_err(|e| e.to_string()));
        self.conn_layouts.insert(conn, layout);
    }

    /// The dataset a query or open names, once it is loaded; `None` when
    /// the request was answered with an error or parked until the
    /// dataset's first load ends.
    pub(super) fn loaded_dataset(
        &mut self,
        conn: ConnId,
        req: &OpenSession,
        waiting: Waiting,
    ) -> Option<usize> {
        let Some(ds) = self.datasets.iter().position(|d| d.name == req.dataset) else {
            self.server.reply_error(
                conn,
                ErrorCode::NotFound,
                format!("no dataset named {:?} on this agent", req.dataset),
            );
            return None;
        };
        if self.datasets[ds].source().is_none() {
            if self.datasets[ds].first_load_running() {
                // Answered when the first attempt ends (poll_datasets).
                self.waiting_opens.push((ds, conn, req.clone(), waiting));
            } else {
                let why = self.datasets[ds].unavailable().unwrap_or_default();
                self.server.reply_error(conn, ErrorCode::Io, why);
            }
            return None;
        }
        Some(ds)
    }

    /// Answers an `AssignmentQuery`: whether the session it describes could
    /// run in locality mode here, and the digest of its inputs.
    pub(super) fn assignment_query(&mut self, conn: ConnId, req: OpenSession) {
        let Some(ds) = self.loaded_dataset(conn, &req, Waiting::Query) else {
            return;
        };
        if self.directory_pending(ds) {
            self.wait_for_directory(ds, conn, req, Waiting::Query);
            return;
        }
        let info = match self.locality(conn, ds, &req) {
            Ok((_, digest)) => AssignmentInfo {
                locality: true,
                digest,
                note: String::new(),
            },
            Err(why) => {
                tracing::info!(
                    dataset = req.dataset,
                    "locality assignment unavailable, the job runs in exact order: {why}"
                );
                AssignmentInfo {
                    locality: false,
                    digest: [0; 32],
                    note: why,
                }
            }
        };
        let _ = self.server.reply(conn, &Message::AssignmentInfo(info), &[]);
    }

    /// The placement of a session opened on `conn` for dataset `ds`:
    /// locality mode with the agreed digest `agreed`, or exact order
    /// (counted by placement when peers are on).
    pub(super) fn placement_for(
        &mut self,
        conn: ConnId,
        ds: usize,
        req: &OpenSession,
    ) -> Result<Option<Placement>, (ErrorCode, String)> {
        let Some(agreed) = req.locality else {
            return Ok(self.exact_placement(ds));
        };
        let (placement, digest) = self.locality(conn, ds, req).map_err(|why| {
            (
                ErrorCode::InvalidArgument,
                format!("locality assignment unavailable: {why}"),
            )
        })?;
        if digest != agreed {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "locality assignment: this agent's inputs give digest {}…, the job agreed on {}…; \
                     the view, the dataset, the layout or the session's parameters changed since the \
                     job asked (ask again, agree, and reopen)",
                    short(&digest),
                    short(&agreed)
                ),
            ));
        }
        Ok(Some(placement))
    }

    /// Exact order, counted by placement when dataset `ds` has a directory.
    fn exact_placement(&mut self, ds: usize) -> Option<Placement> {
        self.peer_directories();
        let tier = self.peers.as_ref()?;
        let dir = tier.directory(ds)?;
        Some(Placement {
            dir: Arc::clone(dir),
            me: tier.me() as u32,
            layout: None,
        })
    }

    /// The locality-mode placement of `req` on `conn` and its inputs'
    /// digest, or why there is none.
    fn locality(
        &mut self,
        conn: ConnId,
        ds: usize,
        req: &OpenSession,
    ) -> Result<(Placement, [u8; 32]), String> {
        self.peer_directories();
        let Some(tier) = self.peers.as_ref() else {
            return Err(
                "this agent has no peer tier (peers.membership = \"off\", or no view handed in yet)"
                    .into(),
            );
        };
        let view = tier.view();
        if self.cfg.peers.membership == Membership::Session
            && self.conn_views.get(&conn) != Some(&crate::peers::ViewTag::of(view))
        {
            return Err(format!(
                "this connection has not joined the view the agent holds (job {:?}, epoch {}): \
                 hand the job's view in first",
                view.job_id(),
                view.epoch()
            ));
        }
        let Some(dir) = tier.directory(ds) else {
            return Err(format!(
                "dataset {:?} has no peer directory (see the agent's log)",
                req.dataset
            ));
        };
        let layout = match self.conn_layouts.get(&conn) {
            None => return Err("no rank layout was handed in on this connection".into()),
            Some(Err(why)) => return Err(format!("the rank layout handed in is unusable: {why}")),
            Some(Ok(l)) => Arc::clone(l),
        };
        if layout.nodes() as usize != view.len() {
            return Err(format!(
                "the rank layout spans {} nodes, the view of job {:?} has {} members",
                layout.nodes(),
                view.job_id(),
                view.len()
            ));
        }
        if layout.world_size() != req.world_size {
            return Err(format!(
                "the rank layout places {} ranks, the session's world_size is {}",
                layout.world_size(),
                req.world_size
            ));
        }
        let digest = Inputs {
            directory: dir.digest(),
            seed: req.seed,
            first_epoch: req.first_epoch,
            epoch_count: req.epoch_count,
            batch_size: req.batch_size,
            drop_last: req.drop_last,
            layout: &layout,
        }
        .digest();
        Ok((
            Placement {
                dir: Arc::clone(dir),
                me: tier.me() as u32,
                layout: Some(layout),
            },
            digest,
        ))
    }
}
