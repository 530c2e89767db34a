//! The job's membership view as loaders hand it in, and this agent's
//! identity among its job's agents.
//!
//! * `PeerQuery` is answered with who this agent is (node id, the address
//!   its peers reach it at, its keep bytes) and the view it holds.
//! * A view handed in (`JoinView`, before a session opens on the same
//!   connection) is checked against the configuration and the view held
//!   (the server took its chunks only with `peers.membership = "session"`,
//!   within the uid's hand-in budget and `peers.max_members`' size):
//!   - the view held (the same digest) is joined by any loader the socket
//!     admits;
//!   - installing or replacing one is for loaders of the agent's own uid
//!     and of `peers.view_uids` only (`Permission` for the others), and for
//!     views of at most `peers.max_members` members, checked from the
//!     encoding's header before it is decoded;
//!   - the first view is installed; a view of the same job with a higher
//!     epoch (a relaunch) replaces it and ends the sessions that joined an
//!     older one; a lower epoch, or the same epoch with other members, is
//!     refused; another job's view replaces the held one only when no
//!     session uses it;
//!   - with `"static"` or `"slurm"` only the configured view is joined;
//!     with `"off"` every view is refused.
//! * Installing a view stops the old transport (what was asked of old
//!   peers is read from the store, what they asked of us is dropped with
//!   its pins) and starts a new one; each dataset's directory is then
//!   computed off the engine thread (`engine/directory.rs`), the store
//!   serving meanwhile; kept samples the new keep-set drops are freed.
//!
//! A refusal never stops a session from opening: its samples are the same
//! in every view, only where the bytes come from changes.

use super::Engine;
use crate::config::{Membership, MembershipSetting};
use crate::peers::{PeerTier, ViewTag};
use crate::server::ConnId;
use granary_peer::view::View;
use granary_shm::handshake::{MembershipMode, Message, PeerIdentity, ViewJoined};
use granary_shm::{ErrorCode, Violation};
use sha2::{Digest, Sha256};

/// A view refused: the `reason` label of its count, the code and the
/// message the loader is told.
type Refused = (&'static str, ErrorCode, String);

impl Engine {
    /// Answers a loader's `PeerQuery`.
    pub(super) fn peer_query(&mut self, conn: ConnId) {
        let membership = match self.cfg.peers.membership_setting {
            MembershipSetting::Off => MembershipMode::Off,
            MembershipSetting::Static => MembershipMode::Static,
            MembershipSetting::Slurm => MembershipMode::Slurm,
            MembershipSetting::Session => MembershipMode::Session,
            MembershipSetting::Dns => MembershipMode::Dns,
        };
        let (node_id, addr) = self
            .peer_endpoint
            .as_ref()
            .map(|e| (e.node_id.clone(), e.advertise.clone()))
            .unwrap_or_default();
        let view = self.peers.as_ref().map(PeerTier::view);
        let reply = PeerIdentity {
            membership,
            node_id,
            addr,
            capacity: self.cache.config().keep_reserve,
            job_id: view.map(|v| v.job_id().to_string()).unwrap_or_default(),
            view_epoch: view.map_or(0, View::epoch),
            view_digest: view.map_or([0; 32], |v| v.digest().0),
            members: view.map_or(0, |v| v.len() as u32),
        };
        let _ = self.server.reply(conn, &Message::PeerIdentity(reply), &[]);
    }

    /// Takes the view a loader of `uid` handed in (see the module
    /// documentation).
    pub(super) fn join_view(&mut self, conn: ConnId, uid: u32, bytes: &[u8]) {
        match self.adopt_view(conn, uid, bytes) {
            Ok(joined) => {
                self.metrics.peers.view(if joined.installed {
                    "installed"
                } else {
                    "joined"
                });
                let _ = self.server.reply(conn, &Message::ViewJoined(joined), &[]);
            }
            Err((reason, code, why)) => {
                self.metrics.peers.view_refused(reason);
                tracing::warn!(conn, uid, "membership view refused: {why}");
                self.server.reply_error(conn, code, why);
            }
        }
    }

    fn adopt_view(&mut self, conn: ConnId, uid: u32, bytes: &[u8]) -> Result<ViewJoined, Refused> {
        // The view held, joined by any loader the socket admits: its
        // digest is that of its canonical bytes.
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(h) = self.peers.as_ref().map(PeerTier::view) {
            if h.digest().0 == digest {
                let j = ViewJoined {
                    view_epoch: h.epoch(),
                    view_digest: digest,
                    installed: false,
                    sessions_ended: 0,
                };
                self.conn_views.insert(conn, ViewTag::of(h));
                return Ok(j);
            }
        }
        let other = |code, why: String| ("other", code, why);
        match self.cfg.peers.membership {
            Membership::Off => {
                return Err((
                    "membership",
                    ErrorCode::InvalidArgument,
                    "peers are off on this agent (peers.membership = \"off\"); the session reads the store"
                        .into(),
                ))
            }
            Membership::Static | Membership::Slurm => {
                let view = View::decode(bytes)
                    .map_err(|e| ("malformed", ErrorCode::InvalidArgument, format!("view: {e}")))?;
                return Err((
                        "membership",
                        ErrorCode::InvalidArgument,
                        format!(
                            "this agent's view comes from its configuration (peers.membership = \"{}\"); \
                             the view handed in (job {:?}, epoch {}, {} members) is another",
                            if self.cfg.peers.membership == Membership::Static { "static" } else { "slurm" },
                            view.job_id(),
                            view.epoch(),
                            view.len()
                        ),
                    ));
            }
            Membership::Session => {}
        }
        let agent_uid = self.server.agent_uid();
        if !self.cfg.peers.may_install_views(agent_uid, uid) {
            let held = match self.peers.as_ref().map(PeerTier::view) {
                Some(h) => format!(
                    "it may join the view the agent holds (job {:?}, epoch {})",
                    h.job_id(),
                    h.epoch()
                ),
                None => "the agent holds none yet".to_string(),
            };
            return Err((
                "uid",
                ErrorCode::Permission,
                format!(
                    "uid {uid} may not install or replace this agent's membership view: only uid \
                     {agent_uid} (the agent's) and peers.view_uids {:?} may; {held}",
                    self.cfg.peers.view_uids
                ),
            ));
        }
        let members = View::member_count(bytes).map_err(|e| {
            (
                "malformed",
                ErrorCode::InvalidArgument,
                format!("view: {e}"),
            )
        })?;
        let max = self.cfg.peers.max_members;
        if members > max as usize {
            return Err((
                "max_members",
                ErrorCode::InvalidArgument,
                format!("view: {members} members, more than peers.max_members ({max})"),
            ));
        }
        let view = View::decode(bytes).map_err(|e| {
            (
                "malformed",
                ErrorCode::InvalidArgument,
                format!("view: {e}"),
            )
        })?;
        let tag = ViewTag::of(&view);
        let held = self.peers.as_ref().map(|t| t.view().clone());
        let joined = |installed: bool, sessions_ended: u32| ViewJoined {
            view_epoch: view.epoch(),
            view_digest: view.digest().0,
            installed,
            sessions_ended,
        };
        let wanted = &self.cfg.peers.job_id;
        if !wanted.is_empty() && wanted != view.job_id() {
            return Err(other(
                ErrorCode::Permission,
                format!(
                    "this agent takes views of job {wanted:?} only (peers.job_id), not {:?}",
                    view.job_id()
                ),
            ));
        }
        let node_id = self
            .peer_endpoint
            .as_ref()
            .map(|e| e.node_id.clone())
            .unwrap_or_default();
        if view.index_of(&node_id).is_none() {
            return Err(other(
                ErrorCode::InvalidArgument,
                format!(
                    "this agent ({node_id:?}) is not a member of the view of job {:?}",
                    view.job_id()
                ),
            ));
        }
        if let Some(h) = &held {
            if h.job_id() == view.job_id() {
                if view.epoch() < h.epoch() {
                    return Err(other(
                        ErrorCode::InvalidArgument,
                        format!(
                            "stale view: epoch {} of job {:?} is older than the epoch {} this agent holds",
                            view.epoch(),
                            view.job_id(),
                            h.epoch()
                        ),
                    ));
                }
                if view.epoch() == h.epoch() {
                    return Err(other(
                        ErrorCode::InvalidArgument,
                        format!(
                            "conflicting view: epoch {} of job {:?} already has other members here \
                             (a relaunch must hand in a higher epoch)",
                            view.epoch(),
                            view.job_id()
                        ),
                    ));
                }
            } else {
                let users = self.sessions_of_job(h.job_id());
                if users > 0 {
                    return Err(other(
                        ErrorCode::Busy,
                        format!(
                            "this agent serves job {:?}'s view to {users} sessions; job {:?}'s view waits until they end",
                            h.job_id(),
                            view.job_id()
                        ),
                    ));
                }
            }
        }
        let ended = self
            .install_view(view.clone())
            .map_err(|(code, why)| other(code, why))?;
        self.conn_views.insert(conn, tag);
        Ok(joined(true, ended))
    }

    /// Sessions whose connection joined a view of `job`.
    fn sessions_of_job(&self, job: &str) -> usize {
        self.sessions
            .values()
            .filter(|s| self.conn_views.get(&s.conn()).is_some_and(|t| t.job == job))
            .count()
    }

    /// Replaces the peer tier by one for `view`; ends the sessions of older
    /// views of the same job. Returns how many ended.
    pub(super) fn install_view(&mut self, view: View) -> Result<u32, (ErrorCode, String)> {
        if let Some(old) = self.peers.take() {
            self.retire_peers(old);
        }
        let (job, epoch) = (view.job_id().to_string(), view.epoch());
        let cc = *self.cache.config();
        let tier = PeerTier::start(
            &self.cfg,
            view,
            &cc,
            self.datasets.len(),
            &self.arena,
            self.rdma_nic.as_ref(),
            &self.metrics.peers,
        )
        .map_err(|e| (ErrorCode::Io, format!("starting the peer tier: {e}")))?;
        tracing::info!(
            job = %job,
            epoch,
            members = tier.view().len(),
            "membership view installed"
        );
        self.metrics.peers.view_epoch.set(epoch);
        self.peers = Some(tier);
        self.job.forget_peers();
        self.release_stale_kept = true;
        let stale: Vec<u64> = self
            .sessions
            .values()
            .filter(|s| {
                self.conn_views
                    .get(&s.conn())
                    .is_some_and(|t| t.job == job && t.epoch < epoch)
            })
            .map(|s| s.id())
            .collect();
        for &sid in &stale {
            tracing::warn!(
                session = sid,
                job = %job,
                epoch,
                "session ended: its job was relaunched with a newer view"
            );
            self.metrics.peers.sessions_ended_by_view.inc();
            // Fenced, not closed: the loader is alive, and the batches in
            // its ring name sample tables the agent takes back now. The
            // reason goes on the socket first, as for any fence.
            if let Some(conn) = self.sessions.get(&sid).map(|s| s.conn()) {
                self.server.reply_error(
                    conn,
                    ErrorCode::Fenced,
                    format!(
                        "job {job:?} was relaunched: view epoch {epoch} replaced the session's"
                    ),
                );
            }
            self.end_session(sid, Some(&Violation::ViewReplaced));
        }
        Ok(stale.len() as u32)
    }

    /// Stops a peer tier: what we asked of its peers is read from the
    /// store into the same extents, what they asked of us is dropped with
    /// its pins.
    fn retire_peers(&mut self, old: PeerTier) {
        for m in old.view().members() {
            self.metrics.peers.set_up(&m.id, false);
            self.metrics.peers.set_transport(&m.id, None);
        }
        // Nothing writes into an extent once the tier is retired.
        let (gets, serving) = old.retire();
        for token in gets {
            self.read_store_instead(token);
        }
        for s in serving {
            super::serving::unpin(&mut self.cache, s);
        }
    }

    /// After a view change, frees the kept samples the new keep-sets no
    /// longer hold (once every dataset's directory is known).
    pub(super) fn release_unkept(&mut self) {
        let now = self.clock.now();
        if !self.release_stale_kept
            || now.saturating_duration_since(self.last_release) < std::time::Duration::from_secs(1)
        {
            return;
        }
        let Some(tier) = self.peers.as_ref() else {
            return;
        };
        let ready = (0..self.datasets.len())
            .all(|ds| self.datasets[ds].source().is_none() || tier.fingerprint_of(ds).is_some());
        if !ready {
            return;
        }
        self.last_release = now;
        let (freed, busy) = self
            .cache
            .release_kept(|k| tier.keeps_here(k.dataset as usize, k.index));
        if freed > 0 || busy > 0 {
            tracing::info!(
                freed,
                busy,
                "kept samples the new view does not keep here released"
            );
        }
        self.release_stale_kept = busy > 0;
        // Samples this agent now keeps that it holds as ordinary cache
        // entries move into the keep area (so they are not read again once
        // evicted); the bytes follow their entry.
        let moves = self
            .cache
            .adopt_kept(|k| tier.keeps_here(k.dataset as usize, k.index));
        let mut moved = 0usize;
        for (from, to) in &moves {
            let copied = self
                .arena
                .read_at(from.offset, from.len as usize)
                .and_then(|bytes| self.arena.write_at(to.offset, &bytes));
            match copied {
                Ok(()) => moved += 1,
                Err(e) => tracing::error!("moving a kept sample into the keep area: {e}"),
            }
        }
        if moved > 0 {
            tracing::info!(
                moved,
                "cached samples the new view keeps here moved into the keep area"
            );
        }
    }
}
