//! The delay proxy of `bench/` (compiled in through `common_s3`): delays
//! overlap instead of adding up, bytes pass unchanged and in order, end of
//! stream is forwarded, the bandwidth cap holds.

mod common_s3;

use common_s3::delay_proxy::DelayProxy;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// An echo server: every byte received is sent back; closes after EOF.
fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let _ = c.set_nodelay(true);
                let mut buf = [0u8; 16384];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            let _ = c.shutdown(Shutdown::Write);
                            return;
                        }
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn proxy(upstream: SocketAddr, delay_ms: u64, mbps: Option<f64>) -> DelayProxy {
    DelayProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        upstream,
        Duration::from_millis(delay_ms),
        mbps,
    )
    .unwrap()
}

#[test]
fn pipelined_requests_all_see_one_delay() {
    let p = proxy(echo_server(), 50, None);
    let mut c = TcpStream::connect(p.local_addr()).unwrap();
    c.set_nodelay(true).unwrap();
    // Warm-up exchange: one round trip costs about 2 × 50 ms.
    let t0 = Instant::now();
    c.write_all(b"ping").unwrap();
    let mut four = [0u8; 4];
    c.read_exact(&mut four).unwrap();
    let rtt = t0.elapsed();
    assert_eq!(&four, b"ping");
    assert!(
        rtt >= Duration::from_millis(100) && rtt < Duration::from_millis(200),
        "{rtt:?}"
    );

    // 20 requests sent back to back, then 20 replies read: about one round
    // trip in all, not 20.
    let requests: Vec<Vec<u8>> = (0..20u8)
        .map(|i| format!("request {i:02} ").into_bytes())
        .collect();
    let t0 = Instant::now();
    let writer = {
        let mut c = c.try_clone().unwrap();
        let requests = requests.clone();
        std::thread::spawn(move || {
            for r in &requests {
                c.write_all(r).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let want: Vec<u8> = requests.concat();
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got).unwrap();
    let total = t0.elapsed();
    writer.join().unwrap();
    assert_eq!(got, want);
    assert!(
        total >= Duration::from_millis(100) && total < Duration::from_millis(250),
        "20 pipelined exchanges took {total:?}"
    );
}

#[test]
fn bytes_pass_unchanged_in_order_and_eof_is_forwarded() {
    let p = proxy(echo_server(), 5, None);
    let mut c = TcpStream::connect(p.local_addr()).unwrap();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let writer = {
        let mut c = c.try_clone().unwrap();
        let data = data.clone();
        std::thread::spawn(move || {
            for chunk in data.chunks(7919) {
                c.write_all(chunk).unwrap();
            }
            c.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "bytes changed");
    assert_eq!(p.forwarded(), (data.len() as u64, data.len() as u64));
    assert_eq!(p.connections(), 1);
}

/// Sends `data` through `addr` to an echo server (writing from another
/// thread, then closing the write half), checks that it came back whole,
/// and returns how long the round trip took.
fn echo_through(addr: std::net::SocketAddr, data: &[u8]) -> Duration {
    let mut c = TcpStream::connect(addr).unwrap();
    let t0 = Instant::now();
    let writer = {
        let mut c = c.try_clone().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            c.write_all(&data).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    let took = t0.elapsed();
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
    took
}

#[test]
fn bandwidth_cap_paces_the_transfer() {
    // 80 Mbit/s = 10 MB/s per direction: 2 MB takes at least 0.2 s each way.
    let p = proxy(echo_server(), 0, Some(80.0));
    let data = vec![0x5au8; 2_000_000];
    let took = echo_through(p.local_addr(), &data);
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Without the cap the same transfer is much faster.
    p.set_bandwidth_mbps(None);
    let fast = echo_through(p.local_addr(), &data);
    assert!(fast < took, "{fast:?} vs {took:?}");
}

#[test]
fn the_delay_can_change_while_running() {
    let p = proxy(echo_server(), 200, None);
    let mut c = TcpStream::connect(p.local_addr()).unwrap();
    let t0 = Instant::now();
    c.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    c.read_exact(&mut one).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(400));
    p.set_delay(Duration::ZERO);
    assert_eq!(p.delay(), Duration::ZERO);
    let t0 = Instant::now();
    c.write_all(b"y").unwrap();
    c.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"y");
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
}
