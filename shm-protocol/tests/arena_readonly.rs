//! The arena fd a loader receives cannot be used to write the arena, in this
//! process and in a separate loader process; hugepages are used or their
//! absence is reported clearly.
// The arena and socket modules need real memory and fds: not in loom builds.
#![cfg(not(feature = "loom"))]

use std::io;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use granary_shm::arena::{
    hugepage_size, hugepages_free, Arena, ArenaError, ArenaOptions, ArenaView, HugePages,
};
use granary_shm::region::Region;
use granary_shm::socket::{SeqPacket, SeqPacketListener};
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::mman::{mmap, mprotect, munmap, MapFlags, ProtFlags};
use nix::sys::stat::Mode;

const ARENA_SIZE: u64 = 4 << 20;

/// Set in the environment of the spawned loader process: the socket path.
const CHILD_ENV: &str = "GRANARY_ARENA_LOADER_SOCKET";
/// Name of the test that acts as the loader process.
const CHILD_TEST: &str = "loader_process_child";

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 12)) as u8
}

fn create_arena() -> Arena {
    let arena = Arena::create(&ArenaOptions {
        size: ARENA_SIZE,
        hugepages: HugePages::Off,
        populate: true,
        name: "granary-test-arena".into(),
    })
    .expect("create arena");
    let bytes: Vec<u8> = (0..arena.size()).map(pattern).collect();
    arena.write_at(0, &bytes).unwrap();
    arena
}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

/// Tries every way to write the arena through `fd` (a loader's read-only
/// arena fd). Returns one line per attempt and the attempts that succeeded.
///
/// `page` is the arena's page size: resizes are attempted by whole pages,
/// since hugetlbfs refuses unaligned sizes (EINVAL) before it looks at the
/// seals. hugetlbfs implements no write(2) at all (EINVAL), so with
/// `hugetlb` that refusal is accepted as well.
/// Tries to write through `fd` (named `name`) of a `size`-byte file of
/// `page`-byte pages, `len` bytes mapped: a shared writable mapping,
/// write(2), ftruncate(2) one page smaller and one page larger. Each
/// attempt with what it was.
fn write_attempts(
    fd: &OwnedFd,
    name: &str,
    len: usize,
    size: u64,
    page: u64,
) -> [(String, Result<(), Errno>); 4] {
    let smaller = (size - page) as libc::off_t;
    let larger = (size + page) as libc::off_t;
    [
        (
            format!("mmap(PROT_READ|PROT_WRITE, MAP_SHARED) of {name}"),
            Region::map_shared_rw(fd.as_fd(), len, false)
                .map(drop)
                .map_err(|e| errno_of(&e)),
        ),
        (
            format!("write(2) on {name}"),
            nix::unistd::write(fd, b"x").map(drop),
        ),
        (
            format!("ftruncate(shrink) on {name}"),
            nix::unistd::ftruncate(fd, smaller),
        ),
        (
            format!("ftruncate(grow) on {name}"),
            nix::unistd::ftruncate(fd, larger),
        ),
    ]
}

fn probe_writes(fd: &OwnedFd, size: u64, page: u64, hugetlb: bool) -> (Vec<String>, Vec<String>) {
    let len = usize::try_from(size).unwrap();
    let mut log = Vec::new();
    let mut breaches = Vec::new();
    let mut refused = |what: &str, outcome: Result<(), Errno>| match outcome {
        Ok(()) => breaches.push(format!("{what}: SUCCEEDED")),
        Err(e) => log.push(format!("{what}: refused ({e})")),
    };

    // (a) a shared writable mapping of the loader fd, (c) write(2) and (d)
    // ftruncate(2) on it.
    for (what, outcome) in write_attempts(fd, "the loader fd", len, size, page) {
        refused(&what, outcome);
    }

    // (b) re-open the same file read-write through /proc and try again:
    // only the seals stand in the way now.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match nix::fcntl::open(
        path.as_str(),
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Err(e) => log.push(format!("open(O_RDWR) of {path}: refused ({e})")),
        Ok(rw) => {
            log.push(format!(
                "open(O_RDWR) of {path}: allowed, so the seals must refuse"
            ));
            let seal_refused = |what: &str, outcome: Result<(), Errno>| match outcome {
                Ok(()) => Err(format!("{what}: SUCCEEDED")),
                Err(Errno::EPERM) => Ok(format!("{what}: refused by the seals (EPERM)")),
                Err(Errno::EINVAL) if hugetlb && what.starts_with("write(2)") => Ok(format!(
                    "{what}: refused, hugetlbfs has no write(2) (EINVAL)"
                )),
                Err(e) => Err(format!(
                    "{what}: refused with {e}, expected EPERM from the seals"
                )),
            };
            let attempts = write_attempts(&rw, "the O_RDWR re-open", len, size, page);
            let seal = (
                "F_ADD_SEALS(F_SEAL_WRITE) (seals are sealed)".to_string(),
                fcntl(&rw, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE)).map(drop),
            );
            for (what, outcome) in attempts.into_iter().chain([seal]) {
                match seal_refused(&what, outcome) {
                    Ok(line) => log.push(line),
                    Err(line) => breaches.push(line),
                }
            }
        }
    }

    // A read-only mapping cannot be made writable.
    match ArenaView::map(fd.try_clone().unwrap(), size) {
        Err(e) => breaches.push(format!("ArenaView::map failed: {e}")),
        Ok(view) => {
            let base = NonNull::new(view.base().cast_mut().cast()).unwrap();
            // SAFETY: the range is exactly the view's own mapping; if the
            // call succeeded it would only widen its protection, and nothing
            // writes through it.
            let r = unsafe { mprotect(base, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE) };
            match r {
                Ok(()) => {
                    breaches.push("mprotect(PROT_WRITE) of the read-only view: SUCCEEDED".into())
                }
                Err(e) => log.push(format!(
                    "mprotect(PROT_WRITE) of the read-only view: refused ({e})"
                )),
            }
        }
    }
    (log, breaches)
}

fn check_pattern(view: &ArenaView) {
    let got = view.read_at(0, view.size() as usize).unwrap();
    for (i, b) in got.iter().enumerate() {
        assert_eq!(*b, pattern(i as u64), "byte {i}");
    }
}

#[test]
fn loader_fd_cannot_write_the_arena() {
    let arena = create_arena();
    let loader_fd = arena.loader_fd().unwrap();
    let (log, breaches) = probe_writes(&loader_fd, arena.size(), 4096, false);
    for line in &log {
        println!("{line}");
    }
    assert!(breaches.is_empty(), "{breaches:#?}");

    // The agent's own fd is read-write, and still cannot write(2) or resize.
    let own = arena.fd().unwrap();
    assert_eq!(nix::unistd::write(own, b"x"), Err(Errno::EPERM));
    assert_eq!(nix::unistd::ftruncate(own, 0), Err(Errno::EPERM));
    assert_eq!(
        nix::unistd::ftruncate(own, (ARENA_SIZE * 2) as libc::off_t),
        Err(Errno::EPERM)
    );
    let e = Region::map_shared_rw(own, ARENA_SIZE as usize, false).unwrap_err();
    assert_eq!(errno_of(&e), Errno::EPERM);

    // (e) The read-only view sees the pattern, and the agent's writes
    // through its existing mapping.
    let view = ArenaView::map(loader_fd, arena.size()).unwrap();
    assert!(!view.region().is_writable());
    check_pattern(&view);
    arena.write_at(12_345, b"written after sealing").unwrap();
    assert_eq!(view.read_at(12_345, 21).unwrap(), b"written after sealing");
    let end = ARENA_SIZE - 3;
    arena.write_at(end, b"end").unwrap();
    assert_eq!(view.read_at(end, 3).unwrap(), b"end");
}

#[test]
fn private_writable_mapping_stays_private() {
    let arena = create_arena();
    let loader_fd = arena.loader_fd().unwrap();
    let len = std::num::NonZeroUsize::new(ARENA_SIZE as usize).unwrap();
    // SAFETY: a fresh private mapping chosen by the kernel; it overlaps no
    // Rust object and is unmapped below.
    let mapped = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
            &loader_fd,
            0,
        )
    };
    match mapped {
        Err(e) => println!("MAP_PRIVATE|PROT_WRITE of the sealed arena: refused ({e})"),
        Ok(p) => {
            println!("MAP_PRIVATE|PROT_WRITE of the sealed arena: allowed (copy-on-write)");
            let byte = p.as_ptr().cast::<u8>().wrapping_add(100);
            // SAFETY: offset 100 lies inside the private mapping of `len`
            // bytes, which is writable and only this code touches.
            unsafe { byte.write_volatile(0xAB ^ pattern(100)) };
            // SAFETY: `p` is the mapping of `len` bytes created above, unused afterwards.
            unsafe { munmap(p, len.get()) }.unwrap();
            assert_eq!(arena.read_at(100, 1).unwrap(), [pattern(100)]);
        }
    }
}

#[test]
fn hugepages_used_or_reported() {
    let hp = hugepage_size();
    let free = hugepages_free().unwrap_or(0);
    let needed = hp.map_or(u64::MAX, |hp| ARENA_SIZE.div_ceil(hp));
    let opts = |hugepages| ArenaOptions {
        size: ARENA_SIZE,
        hugepages,
        populate: true,
        name: "granary-test-huge".into(),
    };
    if free >= needed {
        println!("branch: {free} hugepages of {hp:?} bytes free, testing Required");
        let arena = Arena::create(&opts(HugePages::Required)).expect("hugepage arena");
        assert!(arena.is_hugepage());
        assert!(arena.fallback_reason().is_none());
        assert_eq!(arena.size() % hp.unwrap(), 0);
        arena.write_at(0, b"huge").unwrap();
        let loader_fd = arena.loader_fd().unwrap();
        let (log, breaches) = probe_writes(&loader_fd, arena.size(), hp.unwrap(), true);
        for line in &log {
            println!("hugetlb: {line}");
        }
        assert!(breaches.is_empty(), "hugetlb arena: {breaches:#?}");
        let view = ArenaView::map(loader_fd, arena.size()).unwrap();
        assert_eq!(view.read_at(0, 4).unwrap(), b"huge");
    } else {
        println!(
            "branch: {free} hugepages free, {needed} needed: testing the refusal and the fallback"
        );
        let e = Arena::create(&opts(HugePages::Required)).unwrap_err();
        let ArenaError::HugePagesRequired(why) = &e else {
            panic!("expected HugePagesRequired, got {e}");
        };
        let text = e.to_string();
        println!("Required: {text}");
        assert!(text.contains("/proc/sys/vm/nr_hugepages"), "{text}");
        assert!(!why.is_empty());

        let arena = Arena::create(&opts(HugePages::Try)).expect("fallback arena");
        assert!(!arena.is_hugepage());
        let reason = arena.fallback_reason().expect("a fallback reason");
        println!("Try fell back: {reason}");
        assert!(reason.contains("normal pages"), "{reason}");
        assert!(reason.contains("/proc/sys/vm/nr_hugepages"), "{reason}");
        assert_eq!(arena.size(), ARENA_SIZE);
    }
}

// ---------------------------------------------------------------------------
// A separate loader process.

fn wait_child(child: &mut Child, deadline: Instant) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("loader process did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn accept_child(listener: &SeqPacketListener, child: &mut Child, deadline: Instant) -> SeqPacket {
    listener.set_nonblocking(true).unwrap();
    loop {
        match listener.accept() {
            Ok(conn) => return conn,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("loader process exited before connecting: {status}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("loader process did not connect in time");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn recv_text(conn: &SeqPacket) -> String {
    let mut buf = vec![0u8; 16 * 1024];
    let r = conn.recv(&mut buf).expect("recv from the other process");
    String::from_utf8_lossy(&buf[..r.len]).into_owned()
}

#[test]
fn loader_process_cannot_write_the_arena() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arena-test.sock");
    let listener = SeqPacketListener::bind(&path, 0o600).unwrap();
    let arena = create_arena();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            CHILD_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the loader process");
    let conn = accept_child(&listener, &mut child, deadline);
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let peer = conn.peer_credentials().unwrap();
    assert_eq!(peer.pid, child.id() as i32, "the peer is the child process");
    assert_ne!(peer.pid, std::process::id() as i32);

    let loader_fd = arena.loader_fd().unwrap();
    conn.send(&arena.size().to_le_bytes(), &[loader_fd.as_fd()])
        .unwrap();
    drop(loader_fd);

    let first = recv_text(&conn);
    println!("loader process reports:\n{first}");
    assert!(first.starts_with("ok"), "{first}");

    arena.write_at(4096, b"agent writes on").unwrap();
    conn.send(b"changed", &[]).unwrap();
    let second = recv_text(&conn);
    assert_eq!(second, "ok: saw the agent's write");

    let status = wait_child(&mut child, deadline);
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    assert!(
        status.success(),
        "loader process failed: {status}\n{output}"
    );
}

/// The loader process of `loader_process_cannot_write_the_arena`. Ignored
/// and filtered out of nextest runs (`.config/nextest.toml`): it is no test
/// on its own.
#[test]
#[ignore = "child process entry point of loader_process_cannot_write_the_arena; not a test on its own"]
fn loader_process_child() {
    let path = std::env::var_os(CHILD_ENV)
        .expect("loader_process_child is only run by loader_process_cannot_write_the_arena");
    let conn = SeqPacket::connect(Path::new(&path)).expect("connect to the agent test");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 64];
    let mut r = conn.recv(&mut buf).expect("receive the arena fd");
    assert_eq!(r.len, 8);
    assert_eq!(r.fds.len(), 1);
    let size = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let fd = r.fds.pop().unwrap();

    let (log, breaches) = probe_writes(&fd, size, 4096, false);
    let view = ArenaView::map(fd, size).expect("map the arena read-only");
    check_pattern(&view);
    let report = if breaches.is_empty() {
        format!(
            "ok: every write path refused in pid {}\n{}",
            std::process::id(),
            log.join("\n")
        )
    } else {
        format!(
            "BREACH in pid {}:\n{}",
            std::process::id(),
            breaches.join("\n")
        )
    };
    conn.send(report.as_bytes(), &[]).unwrap();
    assert!(breaches.is_empty(), "{breaches:#?}");

    let r = conn.recv(&mut buf).expect("wait for the agent's write");
    assert_eq!(&buf[..r.len], b"changed");
    let seen = view.read_at(4096, 15).unwrap();
    let reply = if seen == b"agent writes on" {
        "ok: saw the agent's write".to_owned()
    } else {
        format!("stale view: {seen:?}")
    };
    conn.send(reply.as_bytes(), &[]).unwrap();
}
