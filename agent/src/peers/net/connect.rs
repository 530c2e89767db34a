//! Connections made: the listener's accept loop, with its limits on
//! connections held, and the dialer.

use super::conn::run_conn;
use super::*;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

pub(super) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let Some(slot) = AcceptSlot::take(&shared, from) else {
                    // Dropped at once: closed before a byte is read.
                    continue;
                };
                tracing::debug!(%from, "peer connection accepted");
                tokio::spawn(async move {
                    let s = Arc::clone(&slot.shared);
                    run_conn(s, stream, None, Vec::new(), Some(from)).await;
                    drop(slot);
                });
            }
            Err(e) => {
                if let Some(skipped) = shared.log.allow("accept") {
                    tracing::warn!(skipped, "peer listener: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// An accepted connection's place under `peers.max_connections` and
/// `peers.max_connections_per_address`, given back on drop.
struct AcceptSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl AcceptSlot {
    fn take(shared: &Arc<Shared>, from: SocketAddr) -> Option<AcceptSlot> {
        let limits = shared.cfg.limits;
        let ip = from.ip();
        let (refused, evicted) = {
            let mut held = lock(&shared.accepted);
            let total: u32 = held.values().sum();
            let here = held.get(&ip).copied().unwrap_or(0);
            // Full: the oldest connection still in its handshake is closed
            // to make room, so that strangers holding every place cannot
            // keep a member out (its handshake takes a round trip).
            let evicted = (total >= limits.max_connections && here < limits.max_per_address)
                .then(|| lock(&shared.handshaking).pop_first())
                .flatten();
            if let Some((_, close)) = &evicted {
                close.notify_one();
            }
            let refused = if total >= limits.max_connections && evicted.is_none() {
                Some("connections")
            } else if here >= limits.max_per_address {
                Some("per_address")
            } else {
                *held.entry(ip).or_insert(0) += 1;
                None
            };
            (refused, evicted.is_some())
        };
        if evicted {
            shared.reject(
                "connections",
                Some(from),
                "listener full (peers.max_connections): closed the oldest connection still in \
                 its handshake to take a new one",
            );
        }
        match refused {
            Some(reason) => {
                shared.reject(
                    reason,
                    Some(from),
                    if reason == "connections" {
                        "connection refused: peers.max_connections reached"
                    } else {
                        "connection refused: peers.max_connections_per_address reached"
                    },
                );
                None
            }
            None => Some(AcceptSlot {
                shared: Arc::clone(shared),
                ip,
            }),
        }
    }
}

impl Drop for AcceptSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.shared.accepted);
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

pub(super) async fn dial(shared: Arc<Shared>, member: usize, quiet: bool) {
    let addr = shared.cfg.view.members()[member].addr.clone();
    let connect = tokio::time::timeout(
        shared.cfg.connect_timeout,
        connect_from(shared.cfg.source, &addr),
    )
    .await;
    let err = match connect {
        Ok(Ok(stream)) => {
            // Requests made while the handshake runs wait in the slot; those
            // made while connecting go with the connection.
            let queued = {
                let mut slots = lock(&shared.slots);
                match &mut slots[member] {
                    Slot::Dialing(q) => std::mem::take(q),
                    _ => Vec::new(),
                }
            };
            run_conn(shared, stream, Some(member), queued, None).await;
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no connection within {:?}", shared.cfg.connect_timeout),
    };
    if quiet {
        tracing::debug!(peer = %shared.cfg.view.members()[member].id, %addr, "probe failed: {err}");
    } else {
        tracing::warn!(peer = %shared.cfg.view.members()[member].id, %addr, "dial failed: {err}");
    }
    let until = Instant::now() + shared.redial_after(false);
    let queued = {
        let mut slots = lock(&shared.slots);
        match &mut slots[member] {
            // A connection the peer opened to us may have been adopted
            // meanwhile: it stays.
            Slot::Dialing(q) => {
                let q = std::mem::take(q);
                slots[member] = Slot::Down(until);
                q
            }
            _ => Vec::new(),
        }
    };
    shared.emit_all(queued.into_iter().map(|g| Event::Failed {
        request: g.get.request,
        why: GetFailure::Lost(format!("dial {addr}: {err}")),
    }));
}

/// Connects to `addr` (`HOST:PORT`) from `source` when it names an IP (the
/// listener's), so that peers see this node's own address; from the
/// address the routes pick otherwise.
async fn connect_from(source: Option<std::net::IpAddr>, addr: &str) -> io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = io::Error::other(format!("{addr}: no address"));
    for target in tokio::net::lookup_host(addr).await? {
        if target.is_ipv4() != ip.is_ipv4() {
            continue;
        }
        let socket = if ip.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(ip, 0))?;
        match socket.connect(target).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}
