//! A connection's events from its state machine, turned into the
//! transport's events, and the engine's commands applied to it.

use super::*;
use granary_peer::channel::ChannelError;
use granary_peer::conn::{Closed, Event as ConnEvent};
use granary_peer::frame::{DataHeader, GoodbyeReason};
use std::sync::Arc;

/// Handles the connection's events (and the buffered payload bytes of a
/// block being received). Returns why the connection closed, if it did.
pub(super) fn handle_events(ctx: &Arc<ConnCtx>, landing: &mut Option<Landing>) -> Option<String> {
    let mut out = Vec::new();
    let mut closed = None;
    {
        let mut st = ctx.st();
        loop {
            if let Some(l) = landing.as_mut() {
                match &l.dest {
                    // Opened straight into the reserved extent.
                    Some(dest) => loop {
                        let got = l.got;
                        let n = dest.with_bytes_mut(|b| st.conn.payload_into(&mut b[got..]));
                        if n == 0 {
                            break;
                        }
                        l.got += n;
                    },
                    // The store has the extent: the bytes are dropped.
                    None => {
                        while let Some(piece) = st.conn.payload() {
                            l.got += piece.len();
                        }
                    }
                }
                if st.conn.payload_remaining() > 0 {
                    if !st.conn.is_closed() {
                        break;
                    }
                    // Closed mid-block: the Closed event ends the
                    // connection and the block fails (see `finish`).
                } else if let Some(l) = landing.take() {
                    out.push(landed(l));
                }
            }
            let Some(ev) = st.conn.poll_event() else {
                break;
            };
            match ev {
                ConnEvent::Established {
                    peer, incarnation, ..
                } => match ctx.shared.cfg.view.index_of(&peer) {
                    Some(m) if m != ctx.shared.cfg.me => {
                        st.member = Some(m);
                        lock(&ctx.shared.handshaking).remove(&ctx.id);
                        out.push(Event::Up {
                            conn: ctx.id,
                            member: m,
                            incarnation,
                            channel: st.conn.channel(),
                        });
                        adopt(ctx, &mut st, m);
                        flush_backlog(ctx, &mut st);
                    }
                    _ => {
                        ctx.shared.reject(
                            "not_member",
                            ctx.remote,
                            &format!("peer {peer:?} is not a member of this job's view; closing"),
                        );
                        st.counted = true;
                        st.conn.close(GoodbyeReason::ViewMismatch);
                    }
                },
                ConnEvent::Request(get) => out.push(Event::Request { conn: ctx.id, get }),
                ConnEvent::Cancel(request) => out.push(Event::Cancel {
                    conn: ctx.id,
                    request,
                }),
                ConnEvent::Data(h) => match st.expects.remove(&h.request) {
                    Some(g) if g.get.sample == h.sample && g.get.length == h.length => {
                        let dest = g.claim.receive().then_some(g.dest);
                        *landing = Some(Landing {
                            request: h.request,
                            sample: h.sample,
                            crc: h.crc,
                            dest,
                            got: 0,
                            len: h.length as usize,
                            started: ctx.shared.now(),
                        });
                    }
                    other => {
                        let what = if other.is_some() {
                            "peer sent a block other than the one asked for; closing"
                        } else {
                            "peer sent a block nobody asked for; closing"
                        };
                        ctx.shared.reject("protocol", ctx.remote, what);
                        st.counted = true;
                        if let Some(g) = other {
                            out.push(Event::Failed {
                                request: g.get.request,
                                why: GetFailure::Corrupt,
                            });
                        }
                        st.conn.close(GoodbyeReason::ProtocolError);
                    }
                },
                ConnEvent::Miss {
                    request, reason, ..
                } => {
                    if st.expects.remove(&request).is_some() {
                        out.push(Event::Failed {
                            request,
                            why: GetFailure::Miss(reason),
                        });
                    }
                }
                ConnEvent::Credit(_) => flush_backlog(ctx, &mut st),
                ConnEvent::RdmaSetup(bytes) => {
                    if let Some(member) = st.member {
                        out.push(Event::RdmaSetup {
                            conn: ctx.id,
                            member,
                            bytes,
                        });
                    }
                }
                ConnEvent::JobStatus(status) => {
                    if let Some(member) = st.member {
                        out.push(Event::JobStatus { member, status });
                    }
                }
                ConnEvent::Rtt(nanos) => {
                    if let Some(member) = st.member {
                        out.push(Event::Rtt { member, nanos });
                    }
                }
                ConnEvent::Closed(c) => {
                    if !st.counted {
                        refused(ctx, &c, st.member.is_some());
                    }
                    st.view_mismatch = matches!(
                        c,
                        Closed::Local(GoodbyeReason::ViewMismatch)
                            | Closed::Remote(GoodbyeReason::ViewMismatch)
                    );
                    st.clean_close = matches!(
                        c,
                        Closed::Local(GoodbyeReason::Normal)
                            | Closed::Remote(GoodbyeReason::Normal)
                    );
                    closed = Some(match c {
                        Closed::Local(r) => format!("closed here ({r:?})"),
                        Closed::Remote(r) => format!("closed by the peer ({r:?})"),
                        Closed::Malformed(e) => format!("peer sent malformed bytes: {e}"),
                        Closed::Channel(e) => format!("channel: {e}"),
                    });
                    break;
                }
            }
        }
    }
    ctx.shared.emit_all(out);
    ctx.write.notify_one();
    closed
}

/// Counts and logs (rate-limited) a connection that ended because of what
/// the other side did.
fn refused(ctx: &ConnCtx, c: &Closed, established: bool) {
    let reason = match c {
        Closed::Channel(ChannelError::ProtectionMismatch { .. }) => "protection",
        Closed::Channel(
            ChannelError::Unauthentic | ChannelError::RecordLength(_) | ChannelError::Exhausted,
        ) => "record",
        Closed::Channel(_) => "handshake",
        Closed::Malformed(_) => "malformed",
        Closed::Local(GoodbyeReason::Timeout) if !established => "handshake_timeout",
        Closed::Local(GoodbyeReason::ProtocolError) => "protocol",
        _ => return,
    };
    let what = match c {
        Closed::Channel(e) => format!("connection closed: {e}"),
        Closed::Malformed(e) => format!("connection closed: malformed frames ({e})"),
        Closed::Local(GoodbyeReason::Timeout) => {
            "connection closed: no handshake within peers.connect_timeout_ms".to_string()
        }
        _ => "connection closed: the peer broke the protocol".to_string(),
    };
    ctx.shared.reject(reason, ctx.remote, &what);
}

/// The event for a block fully received.
fn landed(l: Landing) -> Event {
    let Some(dest) = l.dest else {
        return Event::LateDiscarded { request: l.request };
    };
    Event::Received {
        request: l.request,
        header: DataHeader {
            request: l.request,
            sample: l.sample,
            length: l.len as u64,
            crc: l.crc,
            store_wait_us: 0,
        },
        crc32c: dest.crc32c(),
    }
}

/// Makes this connection the one our requests to `member` use, unless
/// another already is; takes over requests queued while dialing.
fn adopt(ctx: &ConnCtx, st: &mut State, member: usize) {
    let mut slots = lock(&ctx.shared.slots);
    lock(&ctx.shared.established).insert(ctx.id, member);
    match std::mem::replace(&mut slots[member], Slot::Up(ctx.id)) {
        Slot::Dialing(q) => st.backlog.extend(q),
        Slot::Up(other) if other != ctx.id && lock(&ctx.shared.conns).contains_key(&other) => {
            // Both sides dialed at once: the first connection up keeps
            // carrying requests; this one serves only.
            slots[member] = Slot::Up(other);
        }
        _ => {}
    }
}

fn flush_backlog(ctx: &ConnCtx, st: &mut State) {
    if !st.conn.is_established() {
        return;
    }
    let now = ctx.shared.now();
    while st.conn.credit() > 0 {
        let Some(g) = st.backlog.pop_front() else {
            break;
        };
        if g.claim.is_abandoned() {
            // Hedged while waiting for credit: the store has it.
            continue;
        }
        match st.conn.send_get(g.get, now) {
            Ok(()) => {
                st.expects.insert(g.get.request, g);
            }
            Err(_) => {
                st.backlog.push_front(g);
                break;
            }
        }
    }
}

pub(super) fn command(ctx: &ConnCtx, cmd: Cmd) {
    let mut st = ctx.st();
    match cmd {
        Cmd::Get(g) => {
            st.backlog.push_back(g);
            flush_backlog(ctx, &mut st);
        }
        Cmd::Cancel(request) => {
            // Only a request this connection sent is cancelled at the
            // owner; one still waiting for credit is skipped when its turn
            // comes (its claim is the store's).
            if st.expects.contains_key(&request) {
                let _ = st.conn.send_cancel(request);
            }
        }
        Cmd::Data { header, src } => {
            if st.conn.send_data(header).is_ok() {
                st.sends.push_back((header.request, src));
            } else {
                drop(st);
                ctx.shared.emit(Event::Sent {
                    conn: ctx.id,
                    request: header.request,
                });
            }
        }
        Cmd::Miss { get, reason } => {
            let _ = st.conn.send_miss(get.request, get.sample, reason);
        }
        Cmd::RdmaSetup(bytes) => {
            if let Err(e) = st.conn.send_rdma_setup(&bytes) {
                tracing::debug!(conn = ctx.id, "RDMA setup not sent: {e}");
            }
        }
        Cmd::JobStatus(status) => {
            if let Err(e) = st.conn.send_job_status(&status) {
                tracing::debug!(conn = ctx.id, "job status not sent: {e}");
            }
        }
    }
    ctx.write.notify_one();
}
