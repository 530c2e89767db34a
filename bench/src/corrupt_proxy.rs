//! A TCP proxy in front of one agent's peer listener that decodes the peer
//! frames going both ways (`granary_peer::frame::Decoder`) and flips the
//! first payload byte of chosen data blocks, so the receiving agent's block
//! CRC must catch them; or holds back, or cuts, what one node sends. What
//! it does: [`Corrupt`].
//!
//! One thread per direction per connection; the proxy forwards bytes as
//! they come and never holds a whole block. Counts the blocks it forwarded
//! and those it corrupted.

use granary_peer::frame::{Decoded, Decoder, Frame};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Which data blocks (with a non-empty payload) get corrupted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// None: the proxy only forwards.
    Nothing,
    /// Every block sent by the node whose hello names this id.
    From(String),
    /// Blocks `first`, `first + every`, `first + 2·every`, … in the order
    /// the proxy sees them (counted over all its connections, both ways).
    Every {
        /// The period (10 000: one block in 10 000).
        every: u64,
        /// The 0-based number of the first corrupted block.
        first: u64,
    },
    /// Every chunk the node with this id sends waits this long.
    SlowFrom(String, std::time::Duration),
    /// The node's first block on each connection goes through up to its
    /// first payload byte; then the connection is cut both ways (counted as
    /// corrupted).
    CutFrom(String),
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
    /// to `upstream`, corrupting what `corrupt` says.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        corrupt: Corrupt,
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
                    for (from, to) in [(c2, s2), (server, client)] {
                        let (c, corrupt) = (Arc::clone(&c), corrupt.clone());
                        std::thread::spawn(move || pump(from, to, &corrupt, &c));
                    }
                }
            })?;
        Ok(CorruptingProxy { addr, counts, stop })
    }

    /// The address peers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Data blocks corrupted so far.
    pub fn corrupted(&self) -> u64 {
        self.counts.corrupted.load(Ordering::Relaxed)
    }

    /// Data blocks forwarded so far (corrupted or not).
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

/// Whether the block about to be counted as number `n` is corrupted.
fn chosen(corrupt: &Corrupt, sender: &str, n: u64) -> bool {
    match corrupt {
        Corrupt::Nothing | Corrupt::SlowFrom(..) | Corrupt::CutFrom(_) => false,
        Corrupt::From(id) => id == sender,
        Corrupt::Every { every, first } => {
            n >= *first && (n - first).is_multiple_of((*every).max(1))
        }
    }
}

/// Copies one direction, flipping the first payload byte of the chosen
/// blocks.
fn pump(mut from: TcpStream, mut to: TcpStream, corrupt: &Corrupt, counts: &Counts) {
    let mut dec = Decoder::new();
    let mut sender = String::new();
    // Stream offsets: of the next byte read, and of payload bytes to flip.
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
        dec.feed(chunk);
        let end = fed + n as u64;
        while let Ok(Some(item)) = dec.next_item() {
            if let Decoded::Frame(f) = item {
                match f {
                    Frame::Hello(h) => sender = h.node_id,
                    Frame::Data(h) if h.length > 0 => {
                        let k = counts.blocks.fetch_add(1, Ordering::Relaxed);
                        if chosen(corrupt, &sender, k) {
                            flips.push(end - dec.buffered() as u64);
                            counts.corrupted.fetch_add(1, Ordering::Relaxed);
                        }
                        let cut = matches!(corrupt, Corrupt::CutFrom(id) if *id == sender);
                        if cut && h.length > 1 && cut_at.is_none() {
                            cut_at = Some(end - dec.buffered() as u64 + 1);
                            counts.corrupted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    _ => {}
                }
            }
        }
        flips.retain(|&at| {
            if (fed..end).contains(&at) {
                chunk[(at - fed) as usize] ^= 0x5a;
                false
            } else {
                at >= end
            }
        });
        if let Some(at) = cut_at.filter(|&at| at <= end) {
            // The header and one payload byte go through; then nothing.
            let _ = to.write_all(&chunk[..at.saturating_sub(fed) as usize]);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        fed = end;
        if let Corrupt::SlowFrom(id, d) = corrupt {
            if *id == sender {
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
