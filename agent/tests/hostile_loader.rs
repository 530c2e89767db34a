//! Hostile loaders against a live agent: child processes that open a session
//! and then break the shared-memory contract on purpose (random words over
//! the whole ring segment, releases with wrong tokens or for batches never
//! lent, a release returned twice, ring indices moved far ahead) or abuse
//! the socket (a malformed frame, descriptors sent to the agent). Meanwhile
//! an honest loader reads on. Every contract breaker is fenced and counted,
//! the honest loader gets every sample of every epoch exactly once with
//! verified content, the agent keeps serving new sessions, and its
//! accounting and descriptors come back to their baseline.

mod common;

use common::*;
use granary::SessionOptions;
use granary_agent::metrics::{parse_text, ViolationKind};
use granary_shm::handshake::Message;
use granary_shm::layout::{state, BatchDescriptor, ReleaseDescriptor};
use granary_shm::region::Region;
use granary_shm::ring::Consumer;
use granary_shm::segment::LoaderSegment;
use granary_shm::socket::SocketError;
use granary_shm::ErrorCode;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_FN: &str = "hostile_child";
const ACTED: &str = "GRANARY-HOSTILE-ACTED";

/// What a hostile role does to the agent, as the parent sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    /// The session is fenced (one violation).
    Fenced,
    /// The connection is dropped after a malformed frame (one violation).
    Dropped,
    /// The misuse is refused without a violation.
    Refused,
}

const ROLES: &[(&str, Outcome, Option<ViolationKind>)] = &[
    ("scribble", Outcome::Fenced, None),
    (
        "wrong-token",
        Outcome::Fenced,
        Some(ViolationKind::UnknownLease),
    ),
    (
        "never-lent",
        Outcome::Fenced,
        Some(ViolationKind::UnknownLease),
    ),
    (
        "double-release",
        Outcome::Fenced,
        Some(ViolationKind::UnknownLease),
    ),
    (
        "release-tail-ahead",
        Outcome::Fenced,
        Some(ViolationKind::RingIndex),
    ),
    (
        "ready-head-ahead",
        Outcome::Fenced,
        Some(ViolationKind::RingIndex),
    ),
    ("scribble", Outcome::Fenced, None),
    (
        "socket-garbage",
        Outcome::Dropped,
        Some(ViolationKind::Handshake),
    ),
    ("fd-spam", Outcome::Refused, None),
    ("scribble", Outcome::Fenced, None),
];

/// A word of the mapped segment, as an atomic.
fn word(region: &Region, offset: u64) -> &AtomicU64 {
    let off = usize::try_from(offset).expect("offset fits");
    assert!(
        off % 8 == 0 && off + 8 <= region.len(),
        "word {off} outside the segment"
    );
    let p = region.as_ptr().wrapping_add(off).cast::<u64>();
    // SAFETY: `p` is 8-aligned and inside the live shared mapping (checked
    // above; the mapping is page aligned), every bit pattern is a valid u64,
    // and the reference cannot outlive `region`. Other processes touch the
    // word only through atomics or volatile copies.
    unsafe { AtomicU64::from_ptr(p) }
}

fn wait_batch(ready: &mut Consumer<BatchDescriptor>) -> BatchDescriptor {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(d) = ready
            .try_pop()
            .expect("hostile: the agent's ready ring is sane")
        {
            return d;
        }
        assert!(Instant::now() < end, "hostile: no batch within 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `sendmsg` of `bytes` with every descriptor of `fds` in one SCM_RIGHTS
/// message, however many.
fn send_fds_unchecked(sock: RawFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let payload = u32::try_from(std::mem::size_of_val(raw.as_slice())).expect("small");
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    // SAFETY: CMSG_LEN only computes a size.
    let cmsg_len = unsafe { libc::CMSG_LEN(payload) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data for which all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` writable bytes, room for one
    // header; the result is that header or null.
    let hdr = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    assert!(!hdr.is_null());
    let header = libc::cmsghdr {
        cmsg_len: cmsg_len as _,
        cmsg_level: libc::SOL_SOCKET,
        cmsg_type: libc::SCM_RIGHTS,
    };
    // SAFETY: `hdr` is the first, suitably aligned header slot of `control`.
    unsafe { hdr.write(header) };
    // SAFETY: CMSG_DATA of a valid header inside the buffer.
    let data = unsafe { libc::CMSG_DATA(hdr) };
    // SAFETY: the data area holds `payload` bytes (CMSG_SPACE above) and
    // does not overlap `raw`.
    unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), data, payload as usize) };
    // SAFETY: `msg` points at live buffers (iov, control) for the call.
    let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    assert!(r >= 0, "sendmsg: {}", std::io::Error::last_os_error());
}

/// The child role: open a session, break the contract as `role` says,
/// report, wait for the parent's go-ahead (stdin closing) and check what the
/// agent made of it from this side.
#[test]
#[ignore = "child process entry point of the hostile loader tests; not a test on its own"]
fn hostile_child() {
    let role = expect_child_role(CHILD_FN);
    let sock = child_socket();
    let mut o = SessionOptions::new(DATASET);
    o.seed = 1234;
    o.batch_size = 8;
    o.epoch_count = 1;
    // Room for the whole stream: the ready ring never fills, so a moved
    // head must be noticed without waiting for a full ring.
    o.ready_capacity = 256;
    let raw = raw_open(&sock, &o);
    let seg_len = usize::try_from(raw.reply.segment_size).expect("segment size");
    let region = Region::map_shared_rw(raw.segment.as_fd(), seg_len, false)
        .expect("hostile: map the segment");
    let mut seg = LoaderSegment::attach_fd(raw.segment.as_fd(), Some(raw.reply.instance_epoch))
        .expect("hostile: attach");
    let info = *seg.info();
    let (mut ready, mut release) = seg.take_endpoints().expect("endpoints");
    let mut expect_violation = None;
    match role.as_str() {
        "scribble" => {
            // The arena is handed out read-only and the segment is sealed.
            let rw = Region::map_shared_rw(raw.arena.as_fd(), raw.reply.arena_size as usize, false);
            assert!(rw.is_err(), "hostile: the arena could be mapped writable");
            // SAFETY: ftruncate on a descriptor this process owns; it must fail.
            let r = unsafe { libc::ftruncate(raw.segment.as_raw_fd(), 4096) };
            assert!(r < 0, "hostile: the segment could be shrunk");
            // Random words over the header and both rings, in address
            // order: the agent can only notice once the rings are hit, so
            // its fence lands after our pass over the header.
            let mut rng = Rng(time_seed());
            for off in (0..seg_len as u64).step_by(8) {
                word(&region, off).store(rng.next_u64(), Ordering::Release);
            }
        }
        "wrong-token" => {
            let d = wait_batch(&mut ready);
            let bad = ReleaseDescriptor {
                seq: d.seq,
                token: d.token ^ 0x0100,
            };
            assert!(release.try_push(bad).expect("push"));
            expect_violation = Some(4);
        }
        "never-lent" => {
            let d = wait_batch(&mut ready);
            let bad = ReleaseDescriptor {
                seq: d.seq + 1_000_000,
                token: d.token,
            };
            assert!(release.try_push(bad).expect("push"));
            expect_violation = Some(4);
        }
        "double-release" => {
            let d = wait_batch(&mut ready);
            let rel = ReleaseDescriptor {
                seq: d.seq,
                token: d.token,
            };
            assert!(release.try_push(rel).expect("push"));
            assert!(release.try_push(rel).expect("push"));
            expect_violation = Some(4);
        }
        "release-tail-ahead" => {
            wait_batch(&mut ready);
            // The release ring's producer tail (our word) far ahead.
            word(&region, info.release_offset).fetch_add(1 << 40, Ordering::Release);
            expect_violation = Some(1);
        }
        "ready-head-ahead" => {
            wait_batch(&mut ready);
            // The ready ring's consumer head (our word, one line after the
            // producer's) past everything the agent published.
            word(&region, info.ready_offset + 128).store(u64::MAX / 3, Ordering::Release);
            expect_violation = Some(1);
        }
        "socket-garbage" => {
            // A frame of an unknown kind, then noise.
            let mut frame = vec![8, 0, 0, 0, 0x77, 0x77, 1, 0];
            let mut rng = Rng(time_seed());
            frame.extend_from_slice(&rng.next_u64().to_le_bytes());
            raw.conn.send(&frame, &[]).expect("send garbage");
            match raw.conn.recv_message() {
                Ok((Message::Error(e), fds)) => {
                    assert_eq!(e.code, ErrorCode::Protocol, "{e:?}");
                    assert!(fds.is_empty());
                }
                other => panic!("hostile: expected a protocol error, got {other:?}"),
            }
            match raw.conn.recv_message() {
                Err(SocketError::HungUp) => {}
                Err(SocketError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("hostile: expected the agent to hang up, got {other:?}"),
            }
        }
        "fd-spam" => {
            // Descriptors the agent never asked for: with a request it
            // refuses, then more than a message may carry.
            let extra: Vec<_> = (0..3)
                .map(|_| raw.segment.try_clone().expect("dup"))
                .collect();
            let borrowed: Vec<_> = extra.iter().map(|f| f.as_fd()).collect();
            let close = granary_shm::handshake::encode_to_vec(&Message::CloseSession {
                session_id: raw.reply.session_id + 1000,
            });
            raw.conn.send(&close, &borrowed).expect("send with fds");
            match raw.conn.recv_message() {
                Ok((Message::Error(e), fds)) => {
                    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
                    assert!(fds.is_empty());
                }
                other => panic!("hostile: expected not-found, got {other:?}"),
            }
            let many: Vec<_> = (0..20)
                .map(|_| raw.segment.try_clone().expect("dup"))
                .collect();
            let borrowed: Vec<_> = many.iter().map(|f| f.as_fd()).collect();
            // More than the agent accepts in one message (the library
            // refuses to send that many, so sendmsg directly): it drops us.
            send_fds_unchecked(raw.conn.as_raw_fd(), &close, &borrowed);
            let end = Instant::now() + Duration::from_secs(10);
            while !raw.conn.peer_hung_up().expect("poll") {
                assert!(
                    Instant::now() < end,
                    "hostile: the agent kept a connection that sent 20 fds"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        other => panic!("unknown hostile role {other}"),
    }
    println!("{ACTED}");
    // Wait for the parent to have seen the agent's reaction.
    let mut rest = String::new();
    let _ = std::io::stdin().read_to_string(&mut rest);
    // The agent counts a fence just before it writes the state word (and a
    // scribbler's own garbage sits there until then).
    let want = match role.as_str() {
        "socket-garbage" | "fd-spam" => state::CLOSED,
        _ => state::FENCED,
    };
    let end = Instant::now() + Duration::from_secs(10);
    while seg.state() != want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    match role.as_str() {
        "socket-garbage" | "fd-spam" => {
            assert_eq!(
                seg.state(),
                state::CLOSED,
                "hostile {role}: the session was not ended"
            );
        }
        _ => {
            assert_eq!(seg.state(), state::FENCED, "hostile {role}: not fenced");
            if let Some(code) = expect_violation {
                assert_eq!(seg.violation(), code, "hostile {role}: violation code");
            }
            // The reason comes on the socket too, ahead of the fence.
            raw.conn
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            match raw.conn.recv_message() {
                Ok((Message::Error(e), _)) => {
                    assert_eq!(e.code, ErrorCode::Fenced, "hostile {role}: {e:?}");
                    if expect_violation == Some(4) {
                        assert!(e.message.contains("not on loan"), "hostile {role}: {e:?}");
                    } else {
                        assert!(!e.message.is_empty(), "hostile {role}: {e:?}");
                    }
                }
                other => panic!("hostile {role}: expected the fence reason, got {other:?}"),
            }
            // Then the agent closes the connection.
            let until = Instant::now() + Duration::from_secs(5);
            while !raw.conn.peer_hung_up().expect("poll the socket") && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(
                raw.conn.peer_hung_up().expect("poll the socket"),
                "hostile {role}: the fenced connection stays open"
            );
        }
    }
    println!("hostile {role}: agent reaction seen");
}

#[test]
fn hostile_loaders_are_fenced_and_nobody_else_notices() {
    let _wd = watchdog("hostile_loader", 240);
    let started = Instant::now();
    let agent = TestAgent::start(AgentOptions {
        files: 1000,
        classes: 10,
        mean_size: 8_000,
        ..AgentOptions::default()
    });
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    let fds_before = fd_kinds(&open_fds());

    let stop = Arc::new(AtomicBool::new(false));
    let honest = agent.spawn_honest(Honest::until_stopped(5, 8, Duration::from_millis(1)), &stop);

    let m = &agent.metrics;
    let mut fenced_expected = 0;
    let mut violations_expected = 0;
    let mut kinds_expected = [0u64; ViolationKind::ALL.len()];
    for (i, &(role, outcome, kind)) in ROLES.iter().enumerate() {
        let fenced0 = m.sessions_fenced.get();
        let violations0 = m.violations.get();
        let kinds0 = ViolationKind::ALL.map(|k| m.violations_of(k));
        let mut child = child_command(CHILD_FN, role, &agent.sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a hostile child");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.trim() == ACTED => break,
                Some(Ok(_)) => continue,
                _ => panic!(
                    "hostile child {i} ({role}) failed before acting: {:?}",
                    child.wait()
                ),
            }
        }
        match outcome {
            Outcome::Fenced => {
                fenced_expected += 1;
                violations_expected += 1;
                wait_for(
                    &format!("{role} to be fenced"),
                    Duration::from_secs(20),
                    || m.sessions_fenced.get() > fenced0,
                );
            }
            Outcome::Dropped => {
                violations_expected += 1;
                wait_for(
                    &format!("{role} to be counted"),
                    Duration::from_secs(20),
                    || m.violations.get() > violations0,
                );
            }
            Outcome::Refused => {}
        }
        drop(stdin);
        let st = child.wait().expect("reap");
        assert!(st.success(), "hostile child {i} ({role}) failed: {st:?}");
        assert!(agent.alive(), "the agent died after {role}");
        assert!(
            !honest.is_finished(),
            "the honest loader stopped during {role}"
        );
        assert_eq!(m.sessions_fenced.get(), fenced_expected, "after {role}");
        assert_eq!(m.violations.get(), violations_expected, "after {role}");
        // One violation, of the kind the role commits (a scribbler's
        // random words may break any rule first).
        let kinds = ViolationKind::ALL.map(|k| m.violations_of(k));
        let grown: Vec<ViolationKind> = ViolationKind::ALL
            .into_iter()
            .zip(kinds.iter().zip(&kinds0))
            .filter(|(_, (now, before))| now > before)
            .map(|(k, _)| k)
            .collect();
        match (outcome, kind) {
            (Outcome::Refused, _) => assert!(grown.is_empty(), "{role}: {grown:?}"),
            (_, Some(k)) => assert_eq!(grown, [k], "{role}: violation kind"),
            (_, None) => assert_eq!(grown.len(), 1, "{role}: {grown:?}"),
        }
        for k in grown {
            kinds_expected[k as usize] += 1;
        }
    }

    // The scrape shows the same counts under the `kind` label.
    let series = parse_text(&m.render());
    for (k, want) in ViolationKind::ALL.into_iter().zip(kinds_expected) {
        let name = format!("granary_violations_total{{kind=\"{}\"}}", k.label());
        let got = series.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        assert_eq!(got, Some(want as f64), "{name}");
    }
    assert_eq!(kinds_expected.iter().sum::<u64>(), violations_expected);
    println!("hostile_loader: violations by kind {kinds_expected:?}");

    stop.store(true, Ordering::Relaxed);
    let epochs = honest.join().expect("the honest loader");
    assert!(epochs >= 1);

    // The agent still serves: a new session reads a whole verified epoch.
    let now = AtomicBool::new(true);
    let h = Honest {
        rank: 1,
        world_size: 2,
        ..Honest::epochs(77, 10, 1)
    };
    assert_eq!(honest_loader(&agent.sock, &agent.spec, h, &now), 1);

    let after = agent.wait_idle(Duration::from_secs(20));
    after.assert_balanced();
    assert_eq!(m.sessions_open.get(), 0);
    assert_fds_back_to(&fds_before);
    println!(
        "hostile_loader: {} hostile loaders ({fenced_expected} fenced), honest loader verified \
         {epochs} epoch(s), {:.1?}",
        ROLES.len(),
        started.elapsed()
    );
    agent.stop();
}
