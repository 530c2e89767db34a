//! A TCP proxy that adds latency (and optionally caps bandwidth) between a
//! client and a server on loopback, the stand-in for a far-away store on a
//! machine without `tc netem`.
//!
//! Every chunk of bytes read from one side is stamped with its arrival time
//! and forwarded to the other side, in order, once `arrival + delay` has
//! passed. Delays therefore overlap: N requests sent back to back over one
//! connection all arrive `delay` later, not `N × delay` later, exactly as on
//! a long link — pipelining and many requests in flight keep their benefit.
//! A request/reply exchange through the proxy costs `2 × delay` (one way
//! each direction) on top of the server's own time. End of stream is
//! delayed the same way, so half-closed connections behave.
//!
//! The optional bandwidth cap models one link per direction, shared by all
//! connections of the proxy: a chunk leaves no earlier than its due time and
//! no earlier than the link is free, and then occupies the link for
//! `bytes / rate`.
//!
//! The delay and the cap can be changed while the proxy runs
//! ([`DelayProxy::set_delay`], [`DelayProxy::set_bandwidth_mbps`]); a change
//! applies to bytes that arrive afterwards.
//!
//! The proxy runs on its own small tokio runtime and stops (closing every
//! connection) when dropped. `bench/src/bin/delay_proxy.rs` is the
//! command-line front end; tests and benchmarks start it in-process.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Largest chunk read at once from one side.
const CHUNK: usize = 64 * 1024;
/// Chunks buffered per direction of a connection before the reader waits
/// (64 MiB at most).
const QUEUE_CHUNKS: usize = 1024;

/// Settings shared by every connection, changeable at run time.
#[derive(Debug)]
struct Knobs {
    delay_us: AtomicU64,
    /// Bytes per second, 0 for no cap.
    rate_bps: AtomicU64,
    /// When each direction's link is next free (0: client → server,
    /// 1: server → client).
    link_free: [Mutex<Instant>; 2],
    accepted: AtomicU64,
    forwarded: [AtomicU64; 2],
}

impl Knobs {
    fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }
}

/// A running delay proxy; see the [module documentation](self).
pub struct DelayProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    knobs: Arc<Knobs>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for DelayProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("delay", &self.delay())
            .finish()
    }
}

fn bytes_per_sec(mbps: Option<f64>) -> u64 {
    match mbps {
        Some(m) if m > 0.0 => (m * 1e6 / 8.0).max(1.0) as u64,
        _ => 0,
    }
}

impl DelayProxy {
    /// Listens on `listen` (port 0 picks a free one) and forwards every
    /// accepted connection to `upstream`, `delay` later in each direction,
    /// with an optional cap in megabits per second per direction.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        delay: Duration,
        bandwidth_mbps: Option<f64>,
    ) -> io::Result<DelayProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("delay-proxy")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(listen))?;
        let addr = listener.local_addr()?;
        let now = Instant::now();
        let knobs = Arc::new(Knobs {
            delay_us: AtomicU64::new(delay.as_micros().min(u128::from(u64::MAX)) as u64),
            rate_bps: AtomicU64::new(bytes_per_sec(bandwidth_mbps)),
            link_free: [Mutex::new(now), Mutex::new(now)],
            accepted: AtomicU64::new(0),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let k = knobs.clone();
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                k.accepted.fetch_add(1, Ordering::Relaxed);
                let k = k.clone();
                tokio::spawn(async move {
                    // A refused upstream simply closes the client's connection,
                    // as the server itself would.
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, k);
                    }
                });
            }
        });
        Ok(DelayProxy {
            addr,
            upstream,
            knobs,
            runtime: Some(runtime),
        })
    }

    /// [`DelayProxy::start`] on a free loopback port, with no bandwidth cap.
    pub fn loopback(upstream: SocketAddr, delay: Duration) -> io::Result<DelayProxy> {
        DelayProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), upstream, delay, None)
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The one-way delay.
    pub fn delay(&self) -> Duration {
        self.knobs.delay()
    }

    /// Changes the one-way delay of bytes arriving from now on.
    pub fn set_delay(&self, delay: Duration) {
        let us = delay.as_micros().min(u128::from(u64::MAX)) as u64;
        self.knobs.delay_us.store(us, Ordering::Relaxed);
    }

    /// Changes the bandwidth cap (megabits per second per direction;
    /// `None` removes it).
    pub fn set_bandwidth_mbps(&self, mbps: Option<f64>) {
        self.knobs
            .rate_bps
            .store(bytes_per_sec(mbps), Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.knobs.accepted.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far: (client → server, server → client).
    pub fn forwarded(&self) -> (u64, u64) {
        (
            self.knobs.forwarded[0].load(Ordering::Relaxed),
            self.knobs.forwarded[1].load(Ordering::Relaxed),
        )
    }

    /// Serves until the process ends (the command-line proxy).
    pub fn run_forever(self) -> ! {
        loop {
            std::thread::park();
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Starts both directions of one proxied connection.
fn relay(client: TcpStream, server: TcpStream, knobs: Arc<Knobs>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    pipe(cr, sw, knobs.clone(), 0);
    pipe(sr, cw, knobs, 1);
}

/// One direction: a reader stamping chunks, a writer releasing them when due.
fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, knobs: Arc<Knobs>, dir: usize) {
    // `None` is end of stream, delayed like data.
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(QUEUE_CHUNKS);
    let k = knobs.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let due = Instant::now() + k.delay();
            let item = (n > 0).then(|| buf[..n].to_vec());
            let end = item.is_none();
            if tx.send((due, item)).await.is_err() || end {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((due, item)) = rx.recv().await {
            let Some(bytes) = item else {
                tokio::time::sleep_until(due).await;
                let _ = to.shutdown().await;
                return;
            };
            let rate = knobs.rate_bps.load(Ordering::Relaxed);
            let send_at = if rate == 0 {
                due
            } else {
                let mut free = knobs.link_free[dir]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let start = (*free).max(due);
                let busy = Duration::from_secs_f64(bytes.len() as f64 / rate as f64);
                *free = start + busy;
                start + busy
            };
            tokio::time::sleep_until(send_at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
            knobs.forwarded[dir].fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
    });
}
