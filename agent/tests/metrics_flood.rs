//! The metrics endpoint of a real `granaryd` under a flood: 512 MiB sent
//! without a newline and slow clients dribbling a byte at a time neither
//! grow the agent's memory (its anonymous resident set) nor stop other
//! scrapes from answering.

use granary_agent::metrics::{parse_text, scrape};
use granary_testkit::dataset::synth;
use granary_testkit::procfs::status_bytes;
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FLOOD_BYTES: u64 = 512 << 20;
const SLOW_CLIENTS: usize = 32;

fn start(dir: &Path) -> (GranarydProcess, SocketAddr) {
    let data = synth(dir, 20, 4, 2_000).root;
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = dir.join("granaryd.toml");
    std::fs::write(
        &config,
        format!(
            "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\n[socket]\npath = \"{}\"\n[prefetch]\nmax_inflight_reads = 32\n\
             [metrics]\naddress = \"{addr}\"\n[[dataset]]\nname = \"synth\"\nroot = \"{}\"\n",
            dir.join("granary.sock").display(),
            data.display()
        ),
    )
    .unwrap();
    let agent = GranarydProcess::start(
        GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &config)
            .env("RUST_LOG", "warn")
            .log(Log::Piped)
            .ready_when(move || scrape(addr, Duration::from_secs(1)).is_ok()),
    );
    (agent, addr)
}

/// The process's anonymous resident memory (its heap and stacks; the
/// arena, shared memory the agent faults in at its own pace, is not in
/// it), bytes.
fn rss(pid: u32) -> u64 {
    status_bytes(&pid.to_string(), "RssAnon")
}

#[test]
fn a_flood_and_slow_clients_neither_grow_the_agent_nor_stop_scrapes() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = start(dir.path());
    let pid = agent.pid();
    for _ in 0..20 {
        scrape(addr, Duration::from_secs(5)).unwrap();
    }
    let before = rss(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    // 512 MiB without a newline, over as many connections as it takes (the
    // endpoint answers 431 and closes after 8 KiB).
    let flood = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        std::thread::spawn(move || {
            let chunk = vec![b'a'; 1 << 20];
            while sent.load(Ordering::Relaxed) < FLOOD_BYTES && !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    continue;
                };
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Junk: ");
                while let Ok(n) = s.write(&chunk) {
                    if sent.fetch_add(n as u64, Ordering::Relaxed) + n as u64 >= FLOOD_BYTES {
                        break;
                    }
                }
            }
        })
    };
    // Slow clients: a byte every 100 ms, reconnecting when dropped.
    let slow = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut conns: Vec<Option<TcpStream>> = (0..SLOW_CLIENTS).map(|_| None).collect();
            let mut reconnects = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    let alive = c.as_mut().is_some_and(|s| s.write_all(b"G").is_ok());
                    if !alive {
                        *c = TcpStream::connect(addr).ok();
                        reconnects += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            reconnects
        })
    };

    let mut worst = Duration::ZERO;
    let t0 = Instant::now();
    let mut scrapes = 0;
    while t0.elapsed() < Duration::from_secs(6) || sent.load(Ordering::Relaxed) < FLOOD_BYTES {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "flood stuck at {} bytes",
            sent.load(Ordering::Relaxed)
        );
        let t = Instant::now();
        let body = scrape(addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("scrape {scrapes} during the flood: {e}"));
        worst = worst.max(t.elapsed());
        assert!(
            parse_text(&body)
                .iter()
                .any(|(k, _)| k == "granary_sessions_open"),
            "{body}"
        );
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let reconnects = slow.join().unwrap();
    let after = rss(pid);
    eprintln!(
        "flood: {} MiB sent; {scrapes} scrapes, slowest {worst:?}; slow clients reconnected {reconnects} times; anonymous RSS {} -> {} KiB",
        sent.load(Ordering::Relaxed) >> 20,
        before / 1024,
        after / 1024
    );
    assert!(sent.load(Ordering::Relaxed) >= FLOOD_BYTES);
    assert!(
        worst < Duration::from_secs(1),
        "a scrape took {worst:?} during the flood"
    );
    // The slow clients were dropped at the request deadline, at least once
    // each over the run (the first connections count too).
    assert!(
        reconnects >= 2 * SLOW_CLIENTS as u64,
        "slow clients never dropped: {reconnects} connections"
    );
    assert!(
        after < before + (16 << 20),
        "anonymous RSS grew from {before} to {after} bytes"
    );
}
