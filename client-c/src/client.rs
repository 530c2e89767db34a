//! A handle on one agent socket.
//!
//! Every session runs over its own connection: the agent learns that a
//! loader went away from that connection's hang-up, and the loader learns
//! the same about the agent. [`Client::connect`] makes the first connection
//! (so a wrong path or an absent agent is reported at once) and keeps it
//! for the first session; later sessions connect again.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use granary_shm::handshake::{AssignmentInfo, JobPosition, Message, PeerIdentity, ViewJoined};
use granary_shm::socket::SeqPacket;
use granary_shm::ErrorCode;

use crate::conn::dial;
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use crate::session::Session;

/// A connection point to one agent. Cheap to keep; sessions are independent
/// of each other and of the client once open.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    /// The connection made by `connect`, until a session takes it.
    spare: Mutex<Option<SeqPacket>>,
}

impl Client {
    /// Connects to the agent listening at `socket_path`.
    pub fn connect(socket_path: impl AsRef<Path>) -> Result<Client> {
        let path = socket_path.as_ref().to_owned();
        let conn = dial(&path)?;
        Ok(Client {
            path,
            spare: Mutex::new(Some(conn)),
        })
    }

    /// The agent's socket path.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Asks the agent who it is among its job's agents: its node id, the
    /// address its peers reach it at, its keep bytes, and the view it
    /// holds. Each rank of a job asks its own agent and the job gathers
    /// the answers into a view ([`crate::encode_view`]). Uses a connection
    /// of its own.
    pub fn peer_identity(&self, timeout: Duration) -> Result<PeerIdentity> {
        let conn = dial(&self.path)?;
        conn.send_message(&Message::PeerQuery, &[])
            .map_err(|e| Error::socket("asking the agent who it is", &e))?;
        conn.set_read_timeout(Some(timeout))
            .map_err(|e| Error::socket("setting the query timeout", &e))?;
        match conn.recv_message() {
            Ok((Message::PeerIdentity(p), _)) => Ok(p),
            Ok((Message::Error(e), _)) => Err(Error::new(
                e.code,
                format!("the agent refused the query: {}", e.message),
            )),
            Ok((other, _)) => Err(Error::new(
                ErrorCode::Protocol,
                format!("expected a peer identity, the agent sent {other:?}"),
            )),
            Err(e) => Err(Error::recv("waiting for the agent's identity", &e)),
        }
    }

    /// Hands the agent the job's membership view (`view`, from
    /// [`crate::encode_view`]) on a connection of its own, without opening a
    /// session, and returns its answer. A job calls it on every rank after
    /// gathering the view and waits at a barrier before reading, so every
    /// agent listens for its peers before the first sample is asked for.
    pub fn join_view(&self, view: &[u8], timeout: Duration) -> Result<ViewJoined> {
        let conn = dial(&self.path)?;
        crate::session::join_view(&conn, view, timeout)
    }

    /// Whether the session `options` describe could be delivered in the
    /// locality-aware assignment, and the digest of its inputs (on a
    /// connection of its own; the view and layout of `options` are handed
    /// in first, `options.locality` is ignored). Every rank of a job asks,
    /// the job compares the answers, and opens every session with
    /// `locality = Some(digest)` only when all of them are available with
    /// one digest; otherwise every rank opens in exact order.
    pub fn assignment(&self, options: &SessionOptions) -> Result<AssignmentInfo> {
        let conn = dial(&self.path)?;
        crate::session::query_assignment(&conn, options)
    }

    /// Where the job stands in the plan `options` describe (dataset, seed,
    /// batch size, world size, `drop_last`), as this agent knows it from
    /// its own sessions and its peers' job status: the job's committed
    /// step (the lowest position over the ranks known), and the
    /// `first_batch` for a session with these options (its rank, epochs
    /// and worker split) to open there. A replacement rank asks, sets
    /// `options.first_batch` and opens (`docs/reliability.md`, "A
    /// replacement rank"). `NotFound` when no agent of the job reported a
    /// rank of the plan. A locality-mode plan (`options.locality` set) is
    /// answered as its exact-order twin: a position counts global steps,
    /// whose samples are the same in both modes.
    pub fn job_position(&self, options: &SessionOptions) -> Result<JobPosition> {
        let conn = dial(&self.path)?;
        crate::session::query_job(&conn, options)
    }

    /// Opens a session. May be called from several threads at once.
    pub fn open_session(&self, options: &SessionOptions) -> Result<Session> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // The spare is only worth using while the agent still holds its end.
        let conn = match spare {
            Some(c) if matches!(c.peer_hung_up(), Ok(false)) => c,
            _ => dial(&self.path)?,
        };
        let mut session = Session::open(conn, options)?;
        session.resume_from(&self.path, options);
        Ok(session)
    }
}
