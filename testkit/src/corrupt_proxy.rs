//! A TCP proxy in front of one agent's peer listener that follows the peer
//! channel's framing going both ways (the dialer's preamble and handshake
//! message, the listener's handshake message, then length-prefixed
//! records) without decrypting anything, and changes one byte of chosen
//! block records, so the receiving agent's channel must reject the record;
//! or holds back, or cuts, what one node sends. What it does: [`Corrupt`].
//!
//! A *block record* is a record of at least [`BLOCK_RECORD`] bytes: the
//! records that carry payloads (frame records are small). Who sends a
//! direction is known from the addresses: the listener's own bytes come
//! from the upstream node, a dialer's from the node whose IP it dials from
//! ([`Senders`]; agents dial from their listener's IP).
//!
//! One thread per direction per connection; the proxy forwards bytes as
//! they come and never holds a whole record. Counts the block records it
//! forwarded and those it changed.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Records at least this long carry payload bytes.
pub const BLOCK_RECORD: usize = 1024;

/// Which block records get changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// None: the proxy only forwards.
    Nothing,
    /// Every block record sent by the node with this id.
    From(String),
    /// Block records `first`, `first + every`, `first + 2·every`, … in the
    /// order the proxy sees them (counted over all its connections, both
    /// ways).
    Every {
        /// The period (10 000: one block record in 10 000).
        every: u64,
        /// The 0-based number of the first changed record.
        first: u64,
    },
    /// Every chunk the node with this id sends waits this long.
    SlowFrom(String, std::time::Duration),
    /// The node's first block record on each connection goes through up to
    /// its first byte; then the connection is cut both ways (counted as
    /// changed).
    CutFrom(String),
}

/// Who sends on a connection through the proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Senders {
    /// The node behind the proxy (the listener).
    pub upstream: String,
    /// Dialers' nodes by the IP they dial from.
    pub by_ip: HashMap<IpAddr, String>,
}

/// Counters shared by a proxy's threads.
#[derive(Debug, Default)]
struct Counts {
    blocks: AtomicU64,
    corrupted: AtomicU64,
}

/// A running proxy; stops accepting on drop (connections already open run
/// until either side closes).
#[derive(Debug)]
pub struct CorruptingProxy {
    addr: SocketAddr,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
}

impl CorruptingProxy {
    /// Listens on `listen` (port 0 picks one) and forwards every connection
    /// to `upstream`, changing what `corrupt` says (senders unknown: only
    /// [`Corrupt::Nothing`] and [`Corrupt::Every`] act).
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        corrupt: Corrupt,
    ) -> std::io::Result<CorruptingProxy> {
        CorruptingProxy::start_with(listen, upstream, corrupt, Senders::default())
    }

    /// [`CorruptingProxy::start`], knowing who sends on each connection.
    pub fn start_with(
        listen: SocketAddr,
        upstream: SocketAddr,
        corrupt: Corrupt,
        senders: Senders,
    ) -> std::io::Result<CorruptingProxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, halt) = (Arc::clone(&counts), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("corrupt-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if halt.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                        continue;
                    };
                    let dialer = client
                        .peer_addr()
                        .ok()
                        .and_then(|a| senders.by_ip.get(&a.ip()).cloned())
                        .unwrap_or_default();
                    for (from, to, who, dialing) in [
                        (c2, s2, dialer, true),
                        (server, client, senders.upstream.clone(), false),
                    ] {
                        let (c, corrupt) = (Arc::clone(&c), corrupt.clone());
                        std::thread::spawn(move || pump(from, to, &corrupt, &c, &who, dialing));
                    }
                }
            })?;
        Ok(CorruptingProxy { addr, counts, stop })
    }

    /// The address peers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Block records changed (or cut) so far.
    pub fn corrupted(&self) -> u64 {
        self.counts.corrupted.load(Ordering::Relaxed)
    }

    /// Block records forwarded so far (changed or not).
    pub fn blocks(&self) -> u64 {
        self.counts.blocks.load(Ordering::Relaxed)
    }
}

impl Drop for CorruptingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Whether the block record about to be counted as number `n` is changed.
fn chosen(corrupt: &Corrupt, sender: &str, n: u64) -> bool {
    match corrupt {
        Corrupt::Nothing | Corrupt::SlowFrom(..) | Corrupt::CutFrom(_) => false,
        Corrupt::From(id) => id == sender,
        Corrupt::Every { every, first } => {
            n >= *first && (n - first).is_multiple_of((*every).max(1))
        }
    }
}

/// Where one direction's byte stream stands in the channel's framing.
#[derive(Debug)]
struct Framing {
    /// Bytes of clear preamble still to pass (the dialer's 8).
    preamble: usize,
    /// Whether the handshake message is still ahead.
    handshake: bool,
    /// Bytes of the length prefix read so far.
    prefix: Vec<u8>,
    /// Body bytes of the current message or record still to pass.
    body: usize,
}

impl Framing {
    fn new(dialing: bool) -> Framing {
        Framing {
            preamble: if dialing { 8 } else { 0 },
            handshake: true,
            prefix: Vec::new(),
            body: 0,
        }
    }

    /// Walks `chunk`; calls `record(at, len)` at the first body byte of
    /// each record (not the handshake message), `at` its offset in the
    /// chunk.
    fn walk(&mut self, chunk: &[u8], mut record: impl FnMut(usize, usize)) {
        let mut i = 0;
        while i < chunk.len() {
            if self.preamble > 0 {
                let n = self.preamble.min(chunk.len() - i);
                self.preamble -= n;
                i += n;
            } else if self.body > 0 {
                let n = self.body.min(chunk.len() - i);
                self.body -= n;
                i += n;
            } else {
                self.prefix.push(chunk[i]);
                i += 1;
                if self.prefix.len() == 2 {
                    let len = usize::from(u16::from_be_bytes([self.prefix[0], self.prefix[1]]));
                    self.prefix.clear();
                    self.body = len;
                    if self.handshake {
                        self.handshake = false;
                    } else if len > 0 && i < chunk.len() {
                        record(i, len);
                    } else if len > 0 {
                        // The body starts in the next chunk.
                        record(chunk.len(), len);
                    }
                }
            }
        }
    }
}

/// Copies one direction, changing a byte in the middle of the chosen block
/// records.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    corrupt: &Corrupt,
    counts: &Counts,
    sender: &str,
    dialing: bool,
) {
    let mut framing = Framing::new(dialing);
    // Stream offsets: of the next byte read, and of bytes to flip.
    let mut fed = 0u64;
    let mut flips: Vec<u64> = Vec::new();
    let mut cut_at: Option<u64> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        let end = fed + n as u64;
        framing.walk(chunk, |at, len| {
            if len < BLOCK_RECORD {
                return;
            }
            let start = fed + at as u64;
            let k = counts.blocks.fetch_add(1, Ordering::Relaxed);
            if chosen(corrupt, sender, k) {
                flips.push(start + len as u64 / 2);
                counts.corrupted.fetch_add(1, Ordering::Relaxed);
            }
            let cut = matches!(corrupt, Corrupt::CutFrom(id) if id == sender);
            if cut && cut_at.is_none() {
                cut_at = Some(start + 1);
                counts.corrupted.fetch_add(1, Ordering::Relaxed);
            }
        });
        flips.retain(|&at| {
            if (fed..end).contains(&at) {
                chunk[(at - fed) as usize] ^= 0x5a;
                false
            } else {
                at >= end
            }
        });
        if let Some(at) = cut_at.filter(|&at| at <= end) {
            // Up to one byte of the record's body goes through; then nothing.
            let _ = to.write_all(&chunk[..at.saturating_sub(fed) as usize]);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        fed = end;
        if let Corrupt::SlowFrom(id, d) = corrupt {
            if id == sender {
                std::thread::sleep(*d);
            }
        }
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_finds_records_after_the_handshake_in_any_chunking() {
        // Dialer: preamble, message 1 (3 bytes), records of 2000 and 5 bytes.
        let mut wire = b"GRNY\x02\x01\x01\x00".to_vec();
        wire.extend_from_slice(&[0, 3, 9, 9, 9]);
        wire.extend_from_slice(&2000u16.to_be_bytes());
        wire.extend(std::iter::repeat_n(1u8, 2000));
        wire.extend_from_slice(&5u16.to_be_bytes());
        wire.extend_from_slice(&[2; 5]);
        for piece in [1, 2, 7, 100, 5000] {
            let mut f = Framing::new(true);
            let mut seen = Vec::new();
            let mut off = 0;
            for chunk in wire.chunks(piece) {
                f.walk(chunk, |at, len| seen.push((off + at, len)));
                off += chunk.len();
            }
            assert_eq!(seen, [(15, 2000), (2017, 5)], "pieces of {piece}");
        }
        // Listener: message 2 first, no preamble.
        let mut f = Framing::new(false);
        let mut seen = Vec::new();
        f.walk(&[0, 2, 7, 7, 0, 1, 4], |at, len| seen.push((at, len)));
        assert_eq!(seen, [(6, 1)]);
    }

    #[test]
    fn every_nth_block_from_the_first() {
        let c = Corrupt::Every {
            every: 10,
            first: 3,
        };
        let hit: Vec<u64> = (0..30).filter(|&n| chosen(&c, "x", n)).collect();
        assert_eq!(hit, vec![3, 13, 23]);
        assert!(!chosen(&Corrupt::Nothing, "x", 0));
        assert!(chosen(&Corrupt::From("n1".into()), "n1", 5));
        assert!(!chosen(&Corrupt::From("n1".into()), "n2", 5));
    }
}
