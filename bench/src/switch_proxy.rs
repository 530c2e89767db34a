//! A TCP proxy that sits where a member's address points (`bench/run
//! attacks`): every connection is forwarded to an upstream the benchmark
//! switches at run time (the real member, a corrupting relay, an attacker
//! playing the member), and what passes may be recorded, as a tap on the
//! path would. Switching cuts the connections in progress, so the next
//! dial meets the new upstream.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the proxy does with each connection.
#[derive(Clone, Debug)]
struct Mode {
    upstream: SocketAddr,
    /// Keep a copy of what passes (each direction up to the cap).
    record: bool,
}

/// What a tap recorded: each direction's bytes, in order, per connection
/// appended one after the other.
#[derive(Debug, Default, Clone)]
pub struct Capture {
    /// From the dialer to the upstream.
    pub to_upstream: Vec<u8>,
    /// From the upstream to the dialer.
    pub to_dialer: Vec<u8>,
    /// The first read from the dialer on each connection (at most 2 KiB):
    /// its preamble and first handshake message, which it writes at once.
    pub openings: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Shared {
    mode: Mutex<Option<Mode>>,
    live: Mutex<Vec<TcpStream>>,
    capture: Mutex<Capture>,
    cap: usize,
    connections: AtomicU64,
    stop: AtomicBool,
}

/// A running switch; stops accepting on drop.
pub struct SwitchProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl SwitchProxy {
    /// Listens on `listen`; connections are refused (closed) until an
    /// upstream is set. Each recorded direction keeps at most `cap` bytes.
    pub fn start(listen: SocketAddr, cap: usize) -> std::io::Result<SwitchProxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cap,
            ..Shared::default()
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("switch-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if s.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let mode = s.mode.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let Some(mode) = mode else { continue };
                    let Ok(server) = TcpStream::connect(mode.upstream) else {
                        continue;
                    };
                    s.connections.fetch_add(1, Ordering::Relaxed);
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let clones = (
                        client.try_clone(),
                        server.try_clone(),
                        client.try_clone(),
                        server.try_clone(),
                    );
                    let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = clones else {
                        continue;
                    };
                    {
                        let mut live = s.live.lock().unwrap_or_else(|p| p.into_inner());
                        live.push(c3);
                        live.push(s3);
                    }
                    for (from, to, up) in [(c2, s2, true), (server, client, false)] {
                        let (s, rec) = (Arc::clone(&s), mode.record);
                        std::thread::spawn(move || pump(from, to, &s, rec, up));
                    }
                }
            })?;
        Ok(SwitchProxy { addr, shared })
    }

    /// Where the member's address points.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards new connections to `upstream`, recording them or not, and
    /// cuts those in progress.
    pub fn set(&self, upstream: SocketAddr, record: bool) {
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Mode { upstream, record });
        self.cut();
    }

    /// Closes new connections at once, and cuts those in progress.
    pub fn refuse(&self) {
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.cut();
    }

    /// Cuts every connection in progress (both ways).
    pub fn cut(&self) {
        let live: Vec<TcpStream> =
            std::mem::take(&mut *self.shared.live.lock().unwrap_or_else(|p| p.into_inner()));
        for s in live {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Takes what was recorded so far (and starts afresh).
    pub fn take_capture(&self) -> Capture {
        std::mem::take(
            &mut *self
                .shared
                .capture
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut();
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies one direction, recording it when asked.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Shared, record: bool, up: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = true;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if record {
            let mut c = s.capture.lock().unwrap_or_else(|p| p.into_inner());
            let dir = if up {
                &mut c.to_upstream
            } else {
                &mut c.to_dialer
            };
            let room = s.cap.saturating_sub(dir.len()).min(n);
            dir.extend_from_slice(&buf[..room]);
            if up && first {
                c.openings.push(buf[..n.min(2048)].to_vec());
            }
        }
        first = false;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
