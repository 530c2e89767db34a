//! One connection: its state shared by the reading and writing halves,
//! the read loop, and what is failed when it ends.

use super::*;
use crate::sys;
use granary_peer::conn::{Conn, Nanos};
use granary_peer::frame::GoodbyeReason;
use granary_shm::arena::ArenaSlice;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

mod events;
mod write;

use events::{command, handle_events};
use write::write_loop;

/// The block being received.
struct Landing {
    request: u64,
    sample: u64,
    crc: u32,
    /// `None`: the engine read the store instead; the bytes are dropped.
    dest: Option<ArenaSlice>,
    got: usize,
    len: usize,
    /// When its header arrived (the transport's clock).
    started: Nanos,
}

/// One connection's state, shared by its reading and writing halves.
struct State {
    conn: Conn,
    member: Option<usize>,
    /// Our requests sent, by request id.
    expects: HashMap<u64, OutGet>,
    /// Our requests waiting for credit or the handshake.
    backlog: VecDeque<OutGet>,
    /// Blocks to send, in the order of their data headers.
    sends: VecDeque<(u64, ArenaSlice)>,
    /// The handshake failed because the two sides hold different views:
    /// during a relaunch the other side is about to take the same view,
    /// so it is dialled again soon.
    view_mismatch: bool,
    /// The connection ended with a goodbye (either side's `Normal`): the
    /// peer may be dialled again at once.
    clean_close: bool,
    /// The transport closed it for a reason it counted already.
    counted: bool,
}

struct ConnCtx {
    shared: Arc<Shared>,
    id: ConnId,
    /// The other end's address (for logs).
    remote: Option<SocketAddr>,
    stream: Arc<TcpStream>,
    state: Mutex<State>,
    write: Notify,
    closed: Notify,
    /// Notified to close an accepted connection still in its handshake
    /// when the listener is full (`connect::AcceptSlot::take`).
    evict: Arc<Notify>,
}

impl ConnCtx {
    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

pub(super) async fn run_conn(
    shared: Arc<Shared>,
    stream: TcpStream,
    dialed: Option<usize>,
    queued: Vec<OutGet>,
    from: Option<SocketAddr>,
) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    let mut cfg = shared.cfg.conn.clone();
    cfg.expected_peer = dialed.map(|m| shared.cfg.view.members()[m].id.clone());
    let mut entropy = [0u8; 32];
    for chunk in entropy.chunks_mut(8) {
        chunk.copy_from_slice(&sys::random_u64().to_le_bytes());
    }
    let conn = match dialed {
        Some(_) => Conn::dial(cfg, entropy, shared.now()),
        None => Conn::accept(cfg, entropy, shared.now()),
    };
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("peer connection refused by its own configuration: {e:?}");
            shared.emit_all(queued.into_iter().map(|g| Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost("bad peer configuration".into()),
            }));
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    lock(&shared.conns).insert(id, tx);
    let remote = from.or_else(|| stream.peer_addr().ok());
    let ctx = Arc::new(ConnCtx {
        shared,
        id,
        remote,
        stream: Arc::new(stream),
        state: Mutex::new(State {
            conn,
            member: None,
            expects: HashMap::new(),
            backlog: queued.into(),
            sends: VecDeque::new(),
            view_mismatch: false,
            clean_close: false,
            counted: false,
        }),
        write: Notify::new(),
        closed: Notify::new(),
        evict: Arc::new(Notify::new()),
    });
    if dialed.is_none() {
        lock(&ctx.shared.handshaking).insert(id, Arc::clone(&ctx.evict));
    }
    let mut writer = tokio::spawn(write_loop(Arc::clone(&ctx)));
    ctx.write.notify_one();
    let (why, landing) = read_loop(&ctx, &mut rx).await;
    // No new command reaches this connection; those queued are answered.
    lock(&ctx.shared.conns).remove(&ctx.id);
    rx.close();
    let mut dropped = Vec::new();
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Get(g) => dropped.push(Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost(why.clone()),
            }),
            Cmd::Data { header, .. } => dropped.push(Event::Sent {
                conn: id,
                request: header.request,
            }),
            Cmd::Miss { .. } | Cmd::RdmaSetup(_) | Cmd::Cancel(_) | Cmd::JobStatus(_) => {}
        }
    }
    // Let the writer flush a goodbye, then stop it: once it has ended, no
    // pinned extent is being sent and the pins may go.
    ctx.st().conn.close(GoodbyeReason::Normal);
    ctx.write.notify_one();
    if tokio::time::timeout(Duration::from_millis(500), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
        let _ = writer.await;
    }
    ctx.shared.emit_all(dropped);
    finish(&ctx, dialed, &why, landing);
}

/// Reads, handles commands and timers until the connection closes; returns
/// why it closed, and the block it was receiving, if any.
async fn read_loop(
    ctx: &Arc<ConnCtx>,
    rx: &mut mpsc::UnboundedReceiver<Cmd>,
) -> (String, Option<Landing>) {
    let mut landing: Option<Landing> = None;
    loop {
        if let Some(why) = handle_events(ctx, &mut landing) {
            return (why, landing);
        }
        let block_due = landing.as_ref().map(|l| {
            l.started
                .saturating_add(ctx.shared.cfg.limits.block_timeout.as_nanos() as u64)
        });
        if block_due.is_some_and(|due| ctx.shared.now() >= due) {
            ctx.shared.reject(
                "block_timeout",
                ctx.remote,
                "a block did not arrive whole within peers.block_timeout_ms; connection closed, \
                 the sample is read elsewhere",
            );
            return (
                "a block did not arrive within peers.block_timeout_ms".into(),
                landing,
            );
        }
        let deadline = {
            let st = ctx.st();
            st.conn.poll_timeout()
        };
        let deadline = match (deadline, block_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = match deadline {
            Some(at) => Duration::from_nanos(at.saturating_sub(ctx.shared.now())),
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            r = ctx.stream.readable() => {
                if let Err(e) = r {
                    return (format!("socket: {e}"), landing);
                }
                match receive(ctx) {
                    Ok(true) => {}
                    Ok(false) => return ("closed by the peer".into(), landing),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return (format!("receive: {e}"), landing),
                }
            }
            cmd = rx.recv() => {
                let Some(cmd) = cmd else {
                    return ("transport stopped".into(), landing);
                };
                command(ctx, cmd);
            }
            _ = tokio::time::sleep(sleep) => {
                let now = ctx.shared.now();
                ctx.st().conn.handle_timeout(now);
                ctx.write.notify_one();
            }
            _ = ctx.evict.notified() => {
                return (
                    "closed to make room for a new connection: the listener was full \
                     (peers.max_connections) and this one had not authenticated"
                        .into(),
                    landing,
                );
            }
            _ = ctx.closed.notified() => {
                // The writer failed (and counted a timeout if it was one).
                let mut st = ctx.st();
                st.counted = true;
                st.conn.close(GoodbyeReason::ProtocolError);
            }
        }
    }
}

/// One non-blocking receive into the connection's own buffer (no more than
/// its handshake still needs until the channel is up). Returns false at
/// the end of the stream.
fn receive(ctx: &ConnCtx) -> io::Result<bool> {
    let now = ctx.shared.now();
    let mut st = ctx.st();
    let r = ctx.stream.try_read(st.conn.input_buffer());
    let n = *r.as_ref().unwrap_or(&0);
    st.conn.input_written(n, now);
    r.map(|n| n > 0)
}

/// Fails what the connection still owed and forgets it.
fn finish(ctx: &ConnCtx, dialed: Option<usize>, why: &str, landing: Option<Landing>) {
    lock(&ctx.shared.established).remove(&ctx.id);
    lock(&ctx.shared.handshaking).remove(&ctx.id);
    let mut out = Vec::new();
    if let Some(l) = landing {
        // Cut off mid-block: nothing writes the extent any more, the
        // engine reads the store into it.
        out.push(match l.dest {
            Some(_) => Event::Failed {
                request: l.request,
                why: GetFailure::Lost(format!("{why} in the middle of a block")),
            },
            None => Event::LateDiscarded { request: l.request },
        });
    }
    let member = {
        // The connection is closed (run_conn closed it before stopping the
        // writer); what it still owed fails here.
        let mut st = ctx.st();
        for (request, _) in st.expects.drain() {
            out.push(Event::Failed {
                request,
                why: GetFailure::Lost(why.to_string()),
            });
        }
        for g in st.backlog.drain(..) {
            out.push(Event::Failed {
                request: g.get.request,
                why: GetFailure::Lost(why.to_string()),
            });
        }
        for (request, _) in st.sends.drain(..) {
            out.push(Event::Sent {
                conn: ctx.id,
                request,
            });
        }
        (st.member, st.view_mismatch, st.clean_close)
    };
    let (member, view_mismatch, clean_close) = member;
    let redial = ctx.shared.redial_after(view_mismatch);
    if let Some(m) = member.or(dialed) {
        let mut slots = lock(&ctx.shared.slots);
        // Another authenticated connection to the same member (both sides
        // dialed at once) takes over.
        let other = lock(&ctx.shared.established)
            .iter()
            .find(|(_, &mm)| mm == m)
            .map(|(&c, _)| c);
        match std::mem::replace(&mut slots[m], Slot::Idle) {
            Slot::Up(c) if c != ctx.id => slots[m] = Slot::Up(c),
            Slot::Up(_) if other.is_some() => {
                slots[m] = Slot::Up(other.unwrap_or_default());
            }
            // Our requests' connection was reset, went silent or carried
            // malformed bytes: the peer is left alone for a while (its
            // samples come from the store), then dialled again.
            Slot::Up(_) if !clean_close => slots[m] = Slot::Down(Instant::now() + redial),
            Slot::Dialing(q) if member.is_none() => {
                // The handshake failed: requests that waited for it fail.
                out.extend(q.into_iter().map(|g| Event::Failed {
                    request: g.get.request,
                    why: GetFailure::Lost(why.to_string()),
                }));
                slots[m] = Slot::Down(Instant::now() + redial);
            }
            Slot::Dialing(q) => slots[m] = Slot::Dialing(q),
            Slot::Down(t) => slots[m] = Slot::Down(t),
            _ => {}
        }
    }
    out.push(Event::Down {
        conn: ctx.id,
        member,
        why: why.to_string(),
    });
    if member.is_some() || dialed.is_some() {
        tracing::info!(conn = ctx.id, peer = ?member.map(|m| ctx.shared.cfg.view.members()[m].id.clone()), "peer connection ended: {why}");
    } else {
        // Never authenticated: counted, and logged rate-limited, where it
        // was refused; a line for each would let a stranger fill the log.
        tracing::debug!(conn = ctx.id, from = ?ctx.remote, "peer connection ended: {why}");
    }
    ctx.shared.emit_all(out);
}
