//! The agent's end of the Unix socket: accepting loaders, checking their
//! credentials, and turning their messages into engine events.
//!
//! Everything here is non-blocking; the engine thread calls [`Server::poll`]
//! once per turn. A connection carries any number of sessions; when it hangs
//! up (the loader exited or was killed) all of its sessions end. Views and
//! rank layouts handed in chunk by chunk are reassembled by `handin`.

mod handin;

use crate::config::{PeersConfig, SocketConfig};
use crate::metrics::{Metrics, ViolationKind};
use granary_shm::handshake::{ErrorReply, Message};
use granary_shm::socket::{PeerCred, SeqPacket, SeqPacketListener, SocketError};
use granary_shm::ErrorCode;
use handin::{Budget, Intake, Kind, Outcome, Rules};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

/// Identifies a loader connection.
pub(crate) type ConnId = u64;

/// What a connection asked for.
#[derive(Debug)]
pub(crate) enum ConnEvent {
    /// A new, credential-checked loader connected.
    #[allow(
        dead_code,
        reason = "the engine only counts connections; the id and credentials are for its logs"
    )]
    Connected(ConnId, PeerCred),
    /// The loader wants a session (already validated field by field).
    Open(ConnId, granary_shm::handshake::OpenSession),
    /// The loader closes one of its sessions.
    Close(ConnId, u64),
    /// The loader asks who this agent is among its job's agents.
    PeerQuery(ConnId),
    /// A loader of this uid hands in its job's membership view (its
    /// canonical encoding, reassembled from chunks).
    JoinView(ConnId, u32, Vec<u8>),
    /// The loader handed in its job's rank layout (reassembled from
    /// chunks), or chunks that could not be reassembled (why).
    Layout(ConnId, Result<Vec<u8>, String>),
    /// The loader asks whether a session could be delivered in the
    /// locality-aware assignment (already validated field by field).
    AssignmentQuery(ConnId, granary_shm::handshake::OpenSession),
    /// The loader asks where the job stands in a session's plan (already
    /// validated field by field).
    JobQuery(ConnId, granary_shm::handshake::OpenSession),
    /// The connection is gone (hang-up, or a protocol error was answered).
    Gone(ConnId),
}

struct Conn {
    sock: SeqPacket,
    cred: PeerCred,
    /// A view being handed in, chunk by chunk.
    view: Intake,
    /// A rank layout being handed in, chunk by chunk.
    layout: Intake,
}

/// The listening socket and every live connection.
pub(crate) struct Server {
    listener: SeqPacketListener,
    conns: HashMap<ConnId, Conn>,
    next_id: ConnId,
    agent_uid: u32,
    allow: SocketConfig,
    /// What views and layouts handed in may be.
    handin: Rules,
    /// Bytes each uid's hand-ins in progress announced.
    handin_budget: Budget,
}

impl Server {
    /// The credentials a connection had when it was accepted (the
    /// per-uid session quota counts by them).
    pub(crate) fn credentials(&self, id: ConnId) -> Option<PeerCred> {
        self.conns.get(&id).map(|c| c.cred)
    }

    /// The uid the agent runs as.
    pub(crate) fn agent_uid(&self) -> u32 {
        self.agent_uid
    }

    /// Binds the socket (mode from config) in non-blocking mode; views and
    /// layouts are handed in under `peers`' rules.
    pub fn bind(cfg: &SocketConfig, peers: &PeersConfig) -> io::Result<Server> {
        let path: &Path = cfg.path.as_ref();
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let listener = SeqPacketListener::bind(path, cfg.mode.bits())?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            conns: HashMap::new(),
            next_id: 1,
            agent_uid: nix::unistd::getuid().as_raw(),
            allow: cfg.clone(),
            handin: Rules::new(peers),
            handin_budget: Budget::default(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        self.listener.local_path()
    }

    /// Accepts new loaders and reads pending messages; appends events.
    pub fn poll(&mut self, metrics: &Metrics, out: &mut Vec<ConnEvent>) {
        // One poll(2) finds what has something to read: a non-blocking
        // accept4 or recvmsg that finds nothing still costs a system call
        // (accept4 allocates a socket first), every engine turn.
        let listener = self.listener.as_raw_fd();
        let mut fds = vec![listener];
        fds.extend(self.conns.values().map(|c| c.sock.as_raw_fd()));
        // Cannot tell: try everything, as a readable descriptor would.
        let mut ready = crate::sys::ready_now(&fds).unwrap_or(fds);
        ready.sort_unstable();
        let known = self.next_id;
        if ready.binary_search(&listener).is_ok() {
            self.accept(metrics, out);
        }
        let mut gone = Vec::new();
        for (&id, conn) in &mut self.conns {
            // Connections accepted just now are read at once.
            if id < known && ready.binary_search(&conn.sock.as_raw_fd()).is_err() {
                continue;
            }
            loop {
                match conn.sock.recv_message() {
                    Ok((msg, fds)) => {
                        drop(fds); // loaders never send descriptors
                        match msg {
                            Message::OpenSession(req) => match req.validate() {
                                Ok(()) => out.push(ConnEvent::Open(id, req)),
                                Err(reply) => {
                                    let _ = conn.sock.send_message(&Message::Error(reply), &[]);
                                }
                            },
                            Message::CloseSession { session_id } => {
                                out.push(ConnEvent::Close(id, session_id))
                            }
                            Message::PeerQuery => out.push(ConnEvent::PeerQuery(id)),
                            Message::AssignmentQuery(req) => match req.validate() {
                                Ok(()) => out.push(ConnEvent::AssignmentQuery(id, req)),
                                Err(reply) => {
                                    let _ = conn.sock.send_message(&Message::Error(reply), &[]);
                                }
                            },
                            Message::JobQuery(req) => match req.validate() {
                                Ok(()) => out.push(ConnEvent::JobQuery(id, req)),
                                Err(reply) => {
                                    let _ = conn.sock.send_message(&Message::Error(reply), &[]);
                                }
                            },
                            // Not answered: the query or open that needs
                            // the layout reports what was wrong with it.
                            Message::LayoutChunk(chunk) => match conn.layout.push(
                                chunk,
                                conn.cred.uid,
                                &self.handin,
                                &mut self.handin_budget,
                            ) {
                                Outcome::Done(bytes) => out.push(ConnEvent::Layout(id, Ok(bytes))),
                                Outcome::Refused(_, reply) => {
                                    out.push(ConnEvent::Layout(id, Err(reply.message)))
                                }
                                Outcome::Pending | Outcome::Dropped => {}
                            },
                            Message::ViewChunk(chunk) => match conn.view.push(
                                chunk,
                                conn.cred.uid,
                                &self.handin,
                                &mut self.handin_budget,
                            ) {
                                Outcome::Done(view) => {
                                    out.push(ConnEvent::JoinView(id, conn.cred.uid, view))
                                }
                                Outcome::Refused(reason, reply) => {
                                    metrics.peers.view_refused(reason);
                                    tracing::warn!(
                                        conn = id,
                                        uid = conn.cred.uid,
                                        "membership view refused: {}",
                                        reply.message
                                    );
                                    let _ = conn.sock.send_message(&Message::Error(reply), &[]);
                                }
                                Outcome::Pending | Outcome::Dropped => {}
                            },
                            other => {
                                let _ = conn.sock.send_message(
                                    &Message::Error(ErrorReply {
                                        code: ErrorCode::Protocol,
                                        message: format!(
                                            "unexpected message from a loader: {}",
                                            kind_name(&other)
                                        ),
                                    }),
                                    &[],
                                );
                                gone.push(id);
                                break;
                            }
                        }
                    }
                    Err(SocketError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(SocketError::Io(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(SocketError::Protocol(p)) => {
                        metrics.count_violation(ViolationKind::Handshake);
                        let _ = conn.sock.send_message(
                            &Message::Error(ErrorReply {
                                code: p.code(),
                                message: format!("malformed message: {p}"),
                            }),
                            &[],
                        );
                        gone.push(id);
                        break;
                    }
                    Err(_) => {
                        gone.push(id);
                        break;
                    }
                }
            }
        }
        for id in gone {
            self.forget(id);
            out.push(ConnEvent::Gone(id));
        }
    }

    fn accept(&mut self, metrics: &Metrics, out: &mut Vec<ConnEvent>) {
        loop {
            let sock = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("granaryd: accept failed: {e}");
                    return;
                }
            };
            let cred = match sock.peer_credentials() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("granaryd: SO_PEERCRED failed, dropping connection: {e}");
                    continue;
                }
            };
            // Supplementary groups as the peer had them at connect time.
            let allowed = self.allow.allows(self.agent_uid, cred.uid, cred.gid)
                || (!self.allow.allowed_gids.is_empty()
                    && crate::sys::peer_groups(std::os::fd::AsFd::as_fd(&sock))
                        .is_ok_and(|g| self.allow.allows_any_group(&g)));
            if !allowed {
                metrics.connections_refused.inc_by(1);
                eprintln!(
                    "granaryd: refused pid {} uid {} gid {}: not in socket.allowed_uids / allowed_gids",
                    cred.pid, cred.uid, cred.gid
                );
                let _ = sock.send_message(
                    &Message::Error(ErrorReply {
                        code: ErrorCode::Permission,
                        message: format!(
                            "uid {} gid {} is not allowed by this agent (socket.allowed_uids / allowed_gids)",
                            cred.uid, cred.gid
                        ),
                    }),
                    &[],
                );
                continue;
            }
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.conns.insert(
                id,
                Conn {
                    sock,
                    cred,
                    view: Intake::new(Kind::View).of_agent(cred.pid == std::process::id() as i32),
                    layout: Intake::new(Kind::Layout),
                },
            );
            out.push(ConnEvent::Connected(id, cred));
        }
    }

    /// Sends a reply (with descriptors) on a connection. A failure means the
    /// loader is gone; the next poll reports it.
    pub fn reply(&self, id: ConnId, msg: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        match self.conns.get(&id) {
            Some(c) => c.sock.send_message(msg, fds),
            None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "connection gone",
            )),
        }
    }

    /// Closes a connection (what was sent on it stays readable by the
    /// loader until it reads the end). No `Gone` event follows: the caller
    /// cleans up after it. Returns whether it was open.
    pub(crate) fn close(&mut self, id: ConnId) -> bool {
        self.forget(id)
    }

    /// Drops a connection and what it was handing in. Returns whether it
    /// was open.
    fn forget(&mut self, id: ConnId) -> bool {
        let Some(mut c) = self.conns.remove(&id) else {
            return false;
        };
        c.view.abandon(c.cred.uid, &mut self.handin_budget);
        c.layout.abandon(c.cred.uid, &mut self.handin_budget);
        true
    }

    /// Sends an error reply.
    pub(crate) fn reply_error(&self, id: ConnId, code: ErrorCode, message: impl Into<String>) {
        let _ = self.reply(
            id,
            &Message::Error(ErrorReply {
                code,
                message: message.into(),
            }),
            &[],
        );
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::OpenSession(_) => "OpenSession",
        Message::SessionOpened(_) => "SessionOpened",
        Message::CloseSession { .. } => "CloseSession",
        Message::SessionClosed { .. } => "SessionClosed",
        Message::Error(_) => "Error",
        Message::PeerQuery => "PeerQuery",
        Message::PeerIdentity(_) => "PeerIdentity",
        Message::ViewChunk(_) => "ViewChunk",
        Message::ViewJoined(_) => "ViewJoined",
        Message::LayoutChunk(_) => "LayoutChunk",
        Message::AssignmentQuery(_) => "AssignmentQuery",
        Message::AssignmentInfo(_) => "AssignmentInfo",
        Message::JobQuery(_) => "JobQuery",
        Message::JobPosition(_) => "JobPosition",
    }
}
