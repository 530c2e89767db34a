//! A connection's writing half: sealed frames and block payloads.

use super::*;
use granary_peer::conn::{Conn, Transmit};
use granary_shm::arena::ArenaSlice;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// Bytes of a payload sealed per write: four whole records, so that a
/// large block never sits whole in memory.
const SEAL_CHUNK: usize = 4 * granary_peer::channel::MAX_RECORD_PLAINTEXT;

/// Writes what the connection queues: sealed frames, and each block's
/// payload sealed from its pinned extent a chunk at a time.
pub(super) async fn write_loop(ctx: Arc<ConnCtx>) {
    let mut sealed = Vec::new();
    loop {
        let next = {
            let mut st = ctx.st();
            match st.conn.poll_transmit() {
                Some(Transmit::Bytes(b)) => Some(Ok(b)),
                Some(Transmit::Payload(h)) => {
                    let src = st.sends.pop_front();
                    Some(Err(Some((h, src))))
                }
                None if st.conn.is_closed() => Some(Err(None)),
                None => None,
            }
        };
        let result = match next {
            None => {
                ctx.write.notified().await;
                continue;
            }
            Some(Ok(bytes)) => {
                write_bytes(&ctx.stream, &bytes, ctx.shared.cfg.limits.write_timeout).await
            }
            // Closed and everything written.
            Some(Err(None)) => return,
            Some(Err(Some((h, src)))) => {
                let r = match &src {
                    Some((request, src))
                        if *request == h.request && src.len() as u64 >= h.length =>
                    {
                        write_payload(&ctx, src, h.length, &mut sealed).await
                    }
                    _ => Err(io::Error::other("no pinned extent for a block to send")),
                };
                ctx.shared.emit(Event::Sent {
                    conn: ctx.id,
                    request: h.request,
                });
                r
            }
        };
        if let Err(e) = result {
            if e.kind() == io::ErrorKind::TimedOut {
                ctx.shared.reject(
                    "write_timeout",
                    ctx.remote,
                    "the peer took nothing within peers.write_timeout_ms; connection closed",
                );
            }
            tracing::debug!(conn = ctx.id, "peer write: {e}");
            ctx.closed.notify_one();
            return;
        }
    }
}

/// Seals `len` bytes of the pinned extent `src` into records, a chunk at a
/// time, encrypted straight from the extent into `sealed`, and writes them.
async fn write_payload(
    ctx: &ConnCtx,
    src: &ArenaSlice,
    len: u64,
    sealed: &mut Vec<u8>,
) -> io::Result<()> {
    let len = len as usize;
    sealed.resize(Conn::sealed_len(SEAL_CHUNK), 0);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(SEAL_CHUNK);
        let written = src
            .with_bytes(|b| ctx.st().conn.seal_payload_into(&b[at..at + n], sealed))
            .map_err(|e| io::Error::other(format!("sealing a block: {e}")))?;
        write_bytes(
            &ctx.stream,
            &sealed[..written],
            ctx.shared.cfg.limits.write_timeout,
        )
        .await?;
        at += n;
    }
    Ok(())
}

/// Writes all of `bytes`; fails with `TimedOut` when the socket takes
/// nothing for `timeout` (a peer that does not read).
async fn write_bytes(stream: &TcpStream, mut bytes: &[u8], timeout: Duration) -> io::Result<()> {
    while !bytes.is_empty() {
        match tokio::time::timeout(timeout, stream.writable()).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no write progress within peers.write_timeout_ms",
                ))
            }
        }
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
