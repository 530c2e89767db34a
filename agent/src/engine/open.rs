//! Phase 1: loaders' connections and sessions coming and going.
//!
//! An `OpenSession` is checked against the dataset and the limits, gets a
//! ring segment and a plan (shared with the cache's future index), and is
//! answered with the arena and segment descriptors. A session ends when its
//! loader closes it, hangs up, goes silent for `sessions.client_timeout_ms`
//! or breaks the protocol (fenced); everything it held comes back.

use super::{key, Engine, Waiting};
use crate::metrics::ViolationKind;
use crate::planner::{PlanParams, SessionPlan};
use crate::server::{ConnEvent, ConnId};
use crate::session::{Loan, Session, SessionSetup};
use granary_shm::handshake::{Message, OpenSession, SessionOpened};
use granary_shm::segment::{AgentSegment, SegmentSpec};
use granary_shm::{ErrorCode, Violation};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// A refusal of an open, as the loader is told.
pub(super) type Refusal = (ErrorCode, String);

/// The largest ring a loader may ask for, in slots, unless the agent's
/// configured default is larger (the operator's choice is the limit then):
/// a ring never holds more than a window of batches, and a larger one only
/// costs the agent memory.
pub(crate) const MAX_LOADER_RING: u32 = 4096;

/// A session just opened: the reply and the descriptors that go with it.
pub(super) struct Opened {
    pub(crate) reply: SessionOpened,
    pub(crate) arena_fd: OwnedFd,
}

impl Engine {
    /// Accepts loaders and handles their messages. Returns whether any
    /// arrived.
    pub(super) fn poll_connections(&mut self) -> bool {
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.server.poll(&self.metrics, &mut events);
        let any = !events.is_empty();
        for ev in events.drain(..) {
            self.handle_event(ev);
        }
        self.events = events;
        any
    }

    fn handle_event(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Connected(..) => {}
            ConnEvent::Open(conn, req) => self.handle_open(conn, req),
            ConnEvent::Close(conn, sid) => {
                if self.sessions.get(&sid).is_some_and(|s| s.conn() == conn) {
                    self.end_session(sid, None);
                    let _ =
                        self.server
                            .reply(conn, &Message::SessionClosed { session_id: sid }, &[]);
                } else {
                    self.server.reply_error(
                        conn,
                        ErrorCode::NotFound,
                        format!("no session {sid} on this connection"),
                    );
                }
            }
            ConnEvent::PeerQuery(conn) => self.peer_query(conn),
            ConnEvent::JoinView(conn, uid, view) => self.join_view(conn, uid, &view),
            ConnEvent::Layout(conn, bytes) => self.take_layout(conn, bytes),
            ConnEvent::AssignmentQuery(conn, req) => self.assignment_query(conn, req),
            ConnEvent::JobQuery(conn, req) => self.job_query(conn, req),
            ConnEvent::Gone(conn) => {
                self.conn_views.remove(&conn);
                self.conn_layouts.remove(&conn);
                self.waiting_opens.retain(|(_, c, _, _)| *c != conn);
                self.directories.forget(conn);
                let mine: Vec<u64> = self
                    .sessions
                    .values()
                    .filter(|s| s.conn() == conn)
                    .map(|s| s.id())
                    .collect();
                for sid in mine {
                    if self.sessions.get(&sid).is_some_and(|s| s.loans() > 0) {
                        self.metrics.loaders_lost.inc_by(1);
                    }
                    self.end_session(sid, None);
                }
            }
        }
    }

    /// Opens a session for `conn` and answers it (or parks the request
    /// while its dataset's first load is running).
    pub(super) fn handle_open(&mut self, conn: ConnId, req: OpenSession) {
        let Some(ds) = self.loaded_dataset(conn, &req, Waiting::Open) else {
            return;
        };
        if req.locality.is_some() && self.directory_pending(ds) {
            self.wait_for_directory(ds, conn, req, Waiting::Open);
            return;
        }
        let (opened, sid) = match self.open_session(conn, ds, &req) {
            Ok(x) => x,
            Err((code, why)) => {
                self.server.reply_error(conn, code, why);
                return;
            }
        };
        let sent = {
            let s = &self.sessions[&sid];
            match s.segment().fd() {
                Some(seg_fd) => self
                    .server
                    .reply(
                        conn,
                        &Message::SessionOpened(opened.reply),
                        &[opened.arena_fd.as_fd(), seg_fd],
                    )
                    .is_ok(),
                None => false,
            }
        };
        if sent {
            self.metrics.sessions_opened.inc_by(1);
        } else {
            // The loader is gone already.
            self.end_session(sid, None);
        }
    }

    /// Creates session state for a request on dataset `ds` (which has a
    /// source). Returns the reply and the new session's id.
    pub(super) fn open_session(
        &mut self,
        conn: ConnId,
        ds: usize,
        req: &OpenSession,
    ) -> Result<(Opened, u64), Refusal> {
        let (num_samples, mixture) = self.datasets[ds]
            .source()
            .map(|s| match s.mixture() {
                Some(m) => (m.epoch_len(), Some(m)),
                None => (s.len(), None),
            })
            .ok_or((ErrorCode::Io, "dataset not loaded".to_string()))?;
        if self.sessions.len() >= self.cfg.sessions.max_sessions as usize {
            return Err((
                ErrorCode::Busy,
                format!("session limit reached ({})", self.cfg.sessions.max_sessions),
            ));
        }
        self.check_uid_quota(conn)?;
        self.check_fence_backoff(conn)?;
        let ss = &self.cfg.sessions;
        for (field, asked, default) in [
            ("ready_capacity", req.ready_capacity, ss.ready_ring_capacity),
            (
                "release_capacity",
                req.release_capacity,
                ss.release_ring_capacity,
            ),
        ] {
            let limit = default.max(MAX_LOADER_RING);
            if asked > limit {
                return Err((
                    ErrorCode::InvalidArgument,
                    format!("{field}: {asked} slots is above this agent's limit of {limit}"),
                ));
            }
        }
        let params = PlanParams {
            num_samples,
            seed: req.seed,
            rank: req.rank,
            world_size: req.world_size,
            batch_size: req.batch_size,
            drop_last: req.drop_last,
        };
        self.check_catalog(ds, req)?;
        let mut plan = SessionPlan::new(params, req.first_epoch, req.epoch_count)
            .and_then(|p| p.with_workers(req.worker, req.workers))
            .map_err(|e| (ErrorCode::InvalidArgument, format!("cannot plan: {e}")))?;
        if let Some(m) = mixture {
            plan = plan.with_mixture(m);
        }
        if let Some(placement) = self.placement_for(conn, ds, req)? {
            plan = plan.with_placement(placement);
        }
        let session_batches = plan
            .batches_per_epoch()
            .saturating_mul(u64::from(req.epoch_count));
        if req.first_batch > 0 && req.first_batch >= session_batches {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "first_batch: {} is not below the session's {session_batches} batches",
                    req.first_batch
                ),
            ));
        }
        let skipped = plan
            .samples_before(req.first_batch)
            .map_err(|e| (ErrorCode::NoMemory, format!("cannot plan: {e}")))?;
        let pick = |asked: u32, default: u32| if asked == 0 { default } else { asked };
        let id = self.next_session;
        let spec = SegmentSpec {
            session_id: id,
            ready_capacity: pick(req.ready_capacity, self.cfg.sessions.ready_ring_capacity),
            release_capacity: pick(
                req.release_capacity,
                self.cfg.sessions.release_ring_capacity,
            ),
            arena_size: self.arena.size(),
            instance_epoch: crate::sys::random_u64(),
            heartbeat_interval_ms: self.cfg.sessions.heartbeat_ms,
        };
        let segment = AgentSegment::create_memfd(spec).map_err(|e| {
            (
                ErrorCode::NoMemory,
                format!("cannot create ring segment: {e}"),
            )
        })?;
        let arena_fd = self
            .arena
            .loader_fd()
            .map_err(|e| (ErrorCode::Internal, format!("cannot share the arena: {e}")))?;
        let samples_per_epoch = plan.samples_per_epoch();
        let session = Session::new(SessionSetup {
            id,
            conn,
            dataset: ds,
            plan: plan.clone(),
            segment,
            lease_key: self.instance_key ^ id.wrapping_mul(granary_base::hash::GAMMA),
            initial_window: self.cfg.prefetch.initial_window,
            max_window: self.cfg.prefetch.window_batches,
            max_held_bytes: self.max_pinned_bytes(),
            now: self.clock.now(),
            first_batch: req.first_batch,
        });
        let reply = SessionOpened {
            session_id: id,
            instance_epoch: spec.instance_epoch,
            arena_size: self.arena.size(),
            segment_size: session.segment().geometry().segment_size,
            samples_per_epoch,
            batches_per_epoch: plan.batches_per_epoch(),
            fd_count: 2,
            catalog: if req.wants_catalog {
                self.datasets[ds].catalog().cloned()
            } else {
                None
            },
            rank_batches_per_epoch: if req.wants_catalog {
                crate::planner::batches_per_epoch(&params).unwrap_or(0)
            } else {
                0
            },
            // The shape of a prepared dataset's samples, to clients that
            // take the trailer.
            prepared: if req.wants_catalog {
                self.datasets[ds]
                    .config()
                    .and_then(|c| c.prepare())
                    .map(|p| [p.resize[0], p.resize[1], 3])
            } else {
                None
            },
        };
        self.next_session += 1;
        if let Err(e) = self.cache.add_session(id, ds as u32, plan) {
            tracing::warn!(session = id, "cache cannot index the session's plan: {e}");
        } else if skipped > 0 {
            let _ = self.cache.advance_session_by(id, skipped);
        }
        self.sessions.insert(id, session);
        Ok((Opened { reply, arena_fd }, id))
    }

    /// Refuses a session opened from a saved state whose catalog is not the
    /// dataset's now (naming what changed), unless the request accepts it;
    /// an accepted change is logged with the same words.
    fn check_catalog(&self, ds: usize, req: &OpenSession) -> Result<(), Refusal> {
        let Some(check) = &req.catalog else {
            return Ok(());
        };
        let d = &self.datasets[ds];
        let (Some(now), Some(src)) = (d.catalog(), d.source()) else {
            return Ok(());
        };
        let Some(why) = crate::provenance::mismatch(&d.name, &check.expected, now, src) else {
            return Ok(());
        };
        if check.accept_changed {
            tracing::warn!(
                "{why}; the session opens anyway (the loader accepted a changed dataset)"
            );
            return Ok(());
        }
        Err((
            ErrorCode::DatasetChanged,
            format!("{why}; open without the saved state, or accept the change explicitly"),
        ))
    }

    /// Refuses a further session of the user behind `conn` once it holds
    /// `sessions.max_sessions_per_uid` (a connection whose credentials are
    /// unknown counts for nobody).
    fn check_uid_quota(&self, conn: ConnId) -> Result<(), Refusal> {
        let ss = &self.cfg.sessions;
        let quota = ss.max_sessions_per_uid.unwrap_or(ss.max_sessions);
        let uid_of = |c: ConnId| self.server.credentials(c).map(|cred| cred.uid);
        let Some(uid) = uid_of(conn) else {
            return Ok(());
        };
        let held = self
            .sessions
            .values()
            .filter(|s| uid_of(s.conn()) == Some(uid))
            .count();
        if held >= quota as usize {
            return Err((
                ErrorCode::Busy,
                format!(
                    "uid {uid} holds {held} sessions, the limit per user \
                     (sessions.max_sessions_per_uid) is {quota}"
                ),
            ));
        }
        Ok(())
    }

    /// Ends a session and takes back everything it held. A fenced session's
    /// segment keeps its FENCED state (and violation code) for the loader
    /// to read; any other ends CLOSED.
    pub(super) fn end_session(&mut self, sid: u64, fenced: Option<&Violation>) {
        let Some(mut s) = self.sessions.remove(&sid) else {
            return;
        };
        self.job_session_ended(&mut s);
        match fenced {
            Some(v) => s.segment().fence(v),
            None => s.segment().close(),
        }
        let ds = s.dataset();
        let (loans, pins) = s.take_holdings();
        for loan in loans {
            self.return_loan(ds, loan);
        }
        // Pins held by batches still being prepared. In-flight reads stay
        // parked in the cache until they complete.
        for x in pins {
            let _ = self.cache.unpin(key(ds, x));
        }
        let _ = self.cache.remove_session(sid);
    }

    /// Gives back what a loan held: its pins and its sample table.
    pub(super) fn return_loan(&mut self, dataset: usize, loan: Loan) {
        for sample in loan.pinned {
            let _ = self.cache.unpin(key(dataset, sample));
        }
        if let Some(t) = loan.table {
            let _ = self.tables.free(t);
        }
    }

    /// The most bytes one session's batches (being prepared and on loan)
    /// may hold: `sessions.max_pinned_percent` of the sample cache.
    pub(super) fn max_pinned_bytes(&self) -> u64 {
        let size = self.arena.size();
        let cache = size.saturating_sub(super::table_area(size));
        cache / 100 * u64::from(self.cfg.sessions.max_pinned_percent.min(100))
    }

    /// Fences a session for a protocol violation and ends it. A violation
    /// of the loader's own (not a replaced view) also closes its
    /// connection, and a process fenced again soon waits before its next
    /// session (`fence_backoff`).
    pub(super) fn fence(&mut self, sid: u64, v: Violation) {
        // A replaced view is not the loader's doing: fenced, not counted.
        let kind = ViolationKind::of(&v);
        if let Some(kind) = kind {
            self.metrics.count_violation(kind);
        }
        self.metrics.sessions_fenced.inc_by(1);
        tracing::warn!(session = sid, "session fenced: {v}");
        // The reason goes on the socket before the segment says fenced, so
        // a loader that sees the fence finds the message waiting.
        let conn = self.sessions.get(&sid).map(|s| s.conn());
        if let Some(conn) = conn {
            self.server
                .reply_error(conn, ErrorCode::Fenced, v.to_string());
        }
        self.end_session(sid, Some(&v));
        let (Some(conn), Some(_)) = (conn, kind) else {
            return;
        };
        if let Some(cred) = self.server.credentials(conn) {
            let wait = self.fence_backoff.fenced(cred.pid, self.clock.now());
            if !wait.is_zero() {
                tracing::warn!(
                    pid = cred.pid,
                    "fenced again: the process's next session waits {} ms",
                    wait.as_millis()
                );
            }
        }
        // Whatever else the connection held (sessions, a view, a layout)
        // goes with it.
        self.server.close(conn);
        self.handle_event(ConnEvent::Gone(conn));
    }

    /// Refuses a session to a process fenced again and again until its
    /// wait is over (`fence_backoff`).
    fn check_fence_backoff(&self, conn: ConnId) -> Result<(), Refusal> {
        let Some(cred) = self.server.credentials(conn) else {
            return Ok(());
        };
        self.fence_backoff
            .check(cred.pid, self.clock.now())
            .map_err(|(recent, left)| {
                (
                    ErrorCode::Busy,
                    format!(
                        "pid {}: {recent} sessions fenced within a minute for protocol \
                         violations; new sessions are refused for {} ms more",
                        cred.pid,
                        left.as_millis().max(1)
                    ),
                )
            })
    }

    /// Ends every session whose loader has neither released a batch nor
    /// beaten its heartbeat for `sessions.client_timeout_ms` (stopped or
    /// hung). Returns whether any ended.
    pub(super) fn end_silent_sessions(&mut self, now: Instant) -> bool {
        let limit = Duration::from_millis(self.cfg.sessions.client_timeout_ms);
        let silent: Vec<(u64, Duration)> = self
            .sessions
            .values_mut()
            .filter_map(|s| {
                let quiet = s.silence(now);
                (quiet >= limit).then_some((s.id(), quiet))
            })
            .collect();
        for &(sid, quiet) in &silent {
            tracing::warn!(
                session = sid,
                "loader silent for {} ms (sessions.client_timeout_ms = {}): session ended, its pins freed",
                quiet.as_millis(),
                limit.as_millis()
            );
            self.metrics.sessions_timed_out.inc_by(1);
            // Fenced, not closed: a stopped loader that resumes must not
            // read the batches left in its ring, whose tables and samples
            // the agent takes back now.
            let v = Violation::Silent {
                ms: u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX),
            };
            if let Some(conn) = self.sessions.get(&sid).map(|s| s.conn()) {
                self.server
                    .reply_error(conn, ErrorCode::Fenced, v.to_string());
            }
            self.end_session(sid, Some(&v));
        }
        !silent.is_empty()
    }
}
