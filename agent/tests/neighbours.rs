//! An honest loader next to each kind of misbehaving loader keeps the
//! throughput it has alone (docs/reliability.md, "Fair sharing").
//!
//! A real `granaryd` serves a synthetic dataset that fits its arena. An
//! honest loader (every sample verified byte for byte, every epoch checked
//! against the planner) reads alone for one phase, then next to one
//! misbehaving loader (a child process) for the next, then alone again, and
//! so on for each kind:
//!
//! * `hoard`: takes every batch it is given and never releases one;
//! * `scribble`: writes random words over its ring segment, is fenced,
//!   opens a new session (waiting out the fence backoff) and does it again;
//! * `stopped`: reads a few batches, then is stopped with SIGSTOP;
//! * `churn`: opens a session, takes one batch and closes it, in a loop;
//! * `huge-batch`: asks for sessions with a batch size of 1,000,000, in a
//!   loop (each is refused);
//! * `flood`: sends endless request bytes without a newline to the metrics
//!   endpoint, over new connections as it is dropped.
//!
//! For each kind, rounds alternate: a phase next to a fresh misbehaving
//! loader, then a phase alone (A B A B ...). The ratio for a kind is the
//! median samples/s next to it over the median alone; the agent's and the
//! neighbour's CPU use are printed beside it. Misbehaving loaders act once
//! per millisecond (the flood: 64 KiB per millisecond), so that on a small
//! machine the ratio measures the agent's fairness rather than how the
//! kernel splits two cores between busy processes.
//!
//! `GRANARY_NEIGHBOUR_SECONDS` sets the seconds next to each kind (in
//! rounds of about 10 s, at least 3): `scripts/soak.sh` runs 60 and asserts
//! the 0.9x goal; the default (CI) is 3 (three rounds of 1 s), where the noise of a shared 2-core machine is larger than the
//! effect, so the test asserts that no kind costs the honest loader more
//! than half its throughput (a starved loader reads at 0) and prints the
//! 0.9x verdict for every kind.

mod common;

use common::*;
use granary::{Client, ErrorCode, SessionOptions};
use granary_shm::handshake::Message;
use granary_shm::region::Region;
use granary_shm::segment::LoaderSegment;
use granary_shm::socket::SeqPacket;
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use granary_tools::synth::SynthSpec;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_FN: &str = "neighbour_child";
const ACTED: &str = "GRANARY-NEIGHBOUR-ACTED";
const METRICS_VAR: &str = "GRANARY_NEIGHBOUR_METRICS";
const FILES: u64 = 2_000;
const KINDS: &[&str] = &[
    "hoard",
    "scribble",
    "stopped",
    "churn",
    "huge-batch",
    "flood",
];
/// The goal of the hardening issue: next to any misbehaving loader an
/// honest one keeps at least this share of its solo throughput.
const GOAL: f64 = 0.9;
/// What short (CI) phases assert: no kind halves the honest loader.
const SHORT_FLOOR: f64 = 0.5;

/// One action per millisecond for every misbehaving loop.
const PACE: Duration = Duration::from_millis(1);

/// A `granaryd` process (killed on drop) and its directory.
struct Granaryd {
    process: GranarydProcess,
    sock: PathBuf,
    spec: SynthSpec,
    metrics: SocketAddr,
    _dir: AgentDir,
}

fn start_granaryd() -> Granaryd {
    let d = AgentDir::new(None, FILES, 8_000);
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let metrics: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    d.write_config(
        "64MiB",
        "off",
        &format!("[metrics]\naddress = \"{metrics}\""),
    );
    let sock = d.sock.clone();
    let process = GranarydProcess::start(
        GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &d.config)
            .env("RUST_LOG", "warn")
            .log(Log::File(d.path("granaryd.log")))
            .ready_when(move || Client::connect(&sock).is_ok()),
    );
    Granaryd {
        process,
        sock: d.sock.clone(),
        spec: d.spec.clone(),
        metrics,
        _dir: d,
    }
}

/// The honest loader's samples/s over about `secs` (it stops at the first
/// epoch boundary after that).
fn honest_rate(g: &Granaryd, secs: Duration, seed: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let reader = {
        let (sock, spec, stop) = (g.sock.clone(), g.spec.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            honest_loader(
                &sock,
                &spec,
                Honest {
                    max_epochs: 1_000_000,
                    ..Honest::until_stopped(seed, 32, Duration::ZERO)
                },
                &stop,
            )
        })
    };
    std::thread::sleep(secs);
    stop.store(true, Ordering::Relaxed);
    let epochs = reader.join().expect("the honest loader");
    (u64::from(epochs) * FILES) as f64 / t0.elapsed().as_secs_f64()
}

/// Starts the misbehaving loader `kind` and waits until it has begun.
fn start_neighbour(g: &Granaryd, kind: &str) -> Child {
    let mut child = child_command(CHILD_FN, kind, &g.sock)
        .env(METRICS_VAR, g.metrics.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a misbehaving loader");
    let out = child.stdout.take().expect("child stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(ACTED) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the {kind} loader did not start acting within 30 s"));
    if kind == "stopped" {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGSTOP) };
        assert_eq!(r, 0, "SIGSTOP: {}", std::io::Error::last_os_error());
    }
    child
}

fn stop_neighbour(kind: &str, mut child: Child) {
    if let Some(status) = child.try_wait().expect("poll the child") {
        panic!("the {kind} loader ended on its own ({status}): it should misbehave until killed");
    }
    // SIGKILL ends a stopped process too.
    child.kill().expect("kill the misbehaving loader");
    child.wait().expect("reap the misbehaving loader");
}

/// CPU time (user + system) a process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Duration::from_millis(ticks * 1000 / hz.max(1))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What one kind of neighbour cost, over its rounds.
struct Row {
    kind: &'static str,
    with: Vec<f64>,
    alone: Vec<f64>,
    /// Cores the agent used: next to the neighbour, alone.
    agent_with: f64,
    agent_alone: f64,
    /// Cores the neighbour itself used.
    neighbour: f64,
}

impl Row {
    fn ratio(&mut self) -> f64 {
        median(&mut self.with) / median(&mut self.alone)
    }
}

#[test]
fn an_honest_loader_keeps_its_throughput_next_to_any_misbehaving_one() {
    // Seconds next to each kind, split into rounds of about 10 s (at least
    // 3); each round is one phase next to the neighbour, then one alone.
    let secs: u64 = std::env::var("GRANARY_NEIGHBOUR_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let rounds = (secs / 10).max(3);
    let phase = Duration::from_secs(secs).div_f64(rounds as f64);
    let long = secs >= 30;
    let _w = watchdog_fn!(120 + secs * 2 * KINDS.len() as u64 * 2);
    let g = start_granaryd();
    let agent_pid = g.process.pid();
    // Warm the arena: one epoch read into the cache before any phase.
    honest_rate(&g, Duration::ZERO, 1);
    let mut rows = Vec::new();
    let mut seed = 10;
    for kind in KINDS {
        let mut row = Row {
            kind,
            with: Vec::new(),
            alone: Vec::new(),
            agent_with: 0.0,
            agent_alone: 0.0,
            neighbour: 0.0,
        };
        let (mut t_with, mut t_alone) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..rounds {
            seed += 1;
            let child = start_neighbour(&g, kind);
            let (c0, n0, t0) = (cpu_time(agent_pid), cpu_time(child.id()), Instant::now());
            row.with.push(honest_rate(&g, phase, seed));
            let t = t0.elapsed();
            t_with += t;
            row.agent_with += (cpu_time(agent_pid) - c0).as_secs_f64();
            row.neighbour += (cpu_time(child.id()).saturating_sub(n0)).as_secs_f64();
            stop_neighbour(kind, child);
            let (c0, t0) = (cpu_time(agent_pid), Instant::now());
            row.alone.push(honest_rate(&g, phase, seed + 1000));
            t_alone += t0.elapsed();
            row.agent_alone += (cpu_time(agent_pid) - c0).as_secs_f64();
        }
        row.agent_with /= t_with.as_secs_f64();
        row.neighbour /= t_with.as_secs_f64();
        row.agent_alone /= t_alone.as_secs_f64();
        rows.push(row);
    }
    assert!(
        g.metrics_alive(),
        "granaryd stopped answering during the test"
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "neighbours: {rounds} rounds of {phase:.1?} next to each kind, each followed by {phase:.1?} alone ({}); \
         load average {}",
        if long {
            "the 0.9x goal asserted"
        } else {
            "short phases: >= 0.5x asserted, the 0.9x goal only printed"
        },
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut ratios = Vec::new();
    for row in &mut rows {
        let ratio = row.ratio();
        println!(
            "neighbours: {:>10}: median {:>7.0} samples/s next to it, {:>7.0} alone: {ratio:.3} (goal >= {GOAL}: {}); \
             agent {:.2} cores next to it, {:.2} alone; the neighbour {:.2} cores",
            row.kind,
            median(&mut row.with),
            median(&mut row.alone),
            if ratio >= GOAL { "met" } else { "NOT met" },
            row.agent_with,
            row.agent_alone,
            row.neighbour,
        );
        ratios.push((row.kind, ratio));
    }
    let floor = if long { GOAL } else { SHORT_FLOOR };
    for (kind, ratio) in ratios {
        assert!(
            ratio >= floor,
            "next to a {kind} loader the honest loader kept {ratio:.3} of its throughput (floor {floor})"
        );
    }
}

impl Granaryd {
    fn metrics_alive(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.metrics, Duration::from_secs(5)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut first = String::new();
        BufReader::new(s).read_line(&mut first).is_ok() && first.contains("200")
    }
}

/// Opens a session with the raw handshake; `None` when the agent refuses
/// it (for instance while this process's fence backoff runs).
fn try_raw_open(sock: &Path, o: &SessionOptions) -> Option<RawSession> {
    let conn = SeqPacket::connect(sock).ok()?;
    conn.send_message(&Message::OpenSession(o.request()), &[])
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let (msg, fds) = conn.recv_message().ok()?;
    let Message::SessionOpened(reply) = msg else {
        return None;
    };
    let mut fds = fds.into_iter();
    let arena = fds.next()?;
    let segment = fds.next()?;
    Some(RawSession {
        conn,
        reply,
        arena,
        segment,
    })
}

fn options(seed: u64, batch_size: u32) -> SessionOptions {
    let mut o = SessionOptions::new(DATASET);
    o.seed = seed;
    o.batch_size = batch_size;
    o.epoch_count = 1_000_000;
    o
}

fn acted() {
    println!("{ACTED}");
    let _ = std::io::stdout().flush();
}

fn hoard(sock: &Path) -> ! {
    let raw = raw_open(sock, &options(99, 32));
    let mut seg = LoaderSegment::attach_fd(raw.segment.as_fd(), Some(raw.reply.instance_epoch))
        .expect("hoard: attach");
    let (mut ready, _release) = seg.take_endpoints().expect("hoard: endpoints");
    let mut got = 0u64;
    loop {
        while ready.try_pop().expect("hoard: ready ring").is_some() {
            got += 1;
            if got == 1 {
                acted();
            }
        }
        seg.beat();
        std::thread::sleep(PACE);
    }
}

fn scribble(sock: &Path) -> ! {
    let mut rng = Rng(time_seed());
    let mut first = true;
    loop {
        let Some(raw) = try_raw_open(sock, &options(rng.next_u64(), 32)) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let len = usize::try_from(raw.reply.segment_size).expect("segment size");
        let region = Region::map_shared_rw(raw.segment.as_fd(), len, false).expect("scribble: map");
        if first {
            acted();
            first = false;
        }
        while !raw.conn.peer_hung_up().unwrap_or(true) {
            let off = (rng.below(len as u64) & !7) as usize;
            let p = region.as_ptr().wrapping_add(off).cast::<u64>();
            // SAFETY: `off` is 8-aligned and at least 8 bytes below the
            // end of the live shared mapping `region`, which is page
            // aligned; the agent reads these words only through atomics or
            // volatile copies.
            unsafe { std::ptr::write_volatile(p, rng.next_u64()) };
            std::thread::sleep(PACE);
        }
    }
}

fn stopped(sock: &Path) -> ! {
    let client = Client::connect(sock).expect("stopped: connect");
    let mut s = client
        .open_session(&options(77, 32))
        .expect("stopped: open");
    let mut n = 0u64;
    loop {
        let b = s
            .next_batch(Some(Duration::from_secs(30)))
            .expect("stopped: next batch");
        s.release(b).expect("stopped: release");
        n += 1;
        if n == 3 {
            // The parent stops us from here on, mid-stream.
            acted();
        }
        std::thread::sleep(PACE);
    }
}

fn churn(sock: &Path) -> ! {
    let client = Client::connect(sock).expect("churn: connect");
    let mut rng = Rng(time_seed());
    let mut first = true;
    loop {
        let mut s = client
            .open_session(&options(rng.next_u64(), 32))
            .expect("churn: open");
        let b = s
            .next_batch(Some(Duration::from_secs(30)))
            .expect("churn: next batch");
        s.release(b).expect("churn: release");
        s.close().expect("churn: close");
        if first {
            acted();
            first = false;
        }
        std::thread::sleep(PACE);
    }
}

fn huge_batch(sock: &Path) -> ! {
    // The raw handshake: libgranary refuses such a batch size itself.
    let mut req = options(5, 32).request();
    req.batch_size = 1_000_000;
    let mut first = true;
    loop {
        let conn = SeqPacket::connect(sock).expect("huge-batch: connect");
        conn.send_message(&Message::OpenSession(req.clone()), &[])
            .expect("huge-batch: send");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("huge-batch: timeout");
        match conn.recv_message() {
            Ok((Message::Error(e), _)) if e.code == ErrorCode::InvalidArgument => {}
            other => panic!("huge-batch: expected a refusal, got {other:?}"),
        }
        if first {
            acted();
            first = false;
        }
        std::thread::sleep(PACE);
    }
}

fn flood(addr: SocketAddr) -> ! {
    let chunk = vec![b'a'; 64 << 10];
    let mut first = true;
    loop {
        let Ok(mut s) = TcpStream::connect(addr) else {
            std::thread::sleep(PACE);
            continue;
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Junk: ");
        if first {
            acted();
            first = false;
        }
        while s.write_all(&chunk).is_ok() {
            std::thread::sleep(PACE);
        }
    }
}

/// The child role: misbehave as the role says until killed.
#[test]
#[ignore = "child process entry point of the neighbours test; not a test on its own"]
fn neighbour_child() {
    let role = expect_child_role(CHILD_FN);
    let sock = child_socket();
    match role.as_str() {
        "hoard" => hoard(&sock),
        "scribble" => scribble(&sock),
        "stopped" => stopped(&sock),
        "churn" => churn(&sock),
        "huge-batch" => huge_batch(&sock),
        "flood" => {
            let addr = std::env::var(METRICS_VAR)
                .expect("metrics address in the environment")
                .parse()
                .expect("metrics address");
            flood(addr)
        }
        other => panic!("unknown neighbour role {other}"),
    }
}
