//! Cross-process tests: a real agent segment (memfd) shared with a child
//! process that runs this same test binary.
//!
//! The parent creates the segment, clears `FD_CLOEXEC` on its fd in the
//! child only (in `pre_exec`, between fork and exec) and re-runs the test
//! binary as `<exe> --exact xproc_child --nocapture --test-threads=1` with
//! `GRANARY_XPROC_ROLE` saying what the child does. Without that variable
//! `xproc_child` returns at once, so a normal test run passes it trivially.
//!
//! * [`ten_million_descriptors_cross_process`]: the child attaches as a
//!   loader and consumes at least 10,000,000 batch descriptors published in
//!   batches, checking every field of every one, and returns a release for
//!   each, which the parent checks in turn.
//! * [`hostile_child_scribbling_the_segment`]: the child writes random words
//!   over the whole segment (header and both rings) while the parent keeps
//!   producing, consuming, waiting and attaching: the parent gets typed
//!   violations and attach errors and never crashes.
//! * [`attach_rejects_garbage_segments`]: loaders attaching to garbage get
//!   the right typed [`AttachError`].
//!
//! Every test holds a watchdog; the parent kills a child that overruns its
//! deadline and fails.
#![cfg(all(not(miri), not(feature = "loom")))]

mod common;

use granary_shm::layout::{
    BatchDescriptor, ReleaseDescriptor, BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM, LAYOUT_VERSION,
    SEGMENT_MAGIC,
};
use granary_shm::region::Region;
use granary_shm::segment::{AgentSegment, LoaderSegment, SegmentSpec};
use granary_shm::validate::HeaderSnapshot;
use granary_shm::{memfd, validate, AttachError, ErrorCode, Violation, WaitError};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "GRANARY_XPROC_ROLE";
const FD_ENV: &str = "GRANARY_XPROC_FD";
const ITEMS_ENV: &str = "GRANARY_XPROC_ITEMS";
const SEED_ENV: &str = "GRANARY_XPROC_SEED";
const MILLIS_ENV: &str = "GRANARY_XPROC_MILLIS";

/// Descriptors moved by the ten-million test (override with `GRANARY_XPROC_ITEMS`).
const DEFAULT_ITEMS: u64 = 10_000_000;
/// How long the parent lets a child run before killing it and failing.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);
const ARENA_SIZE: u64 = 1 << 20;
const EPOCH: u64 = 0x0123_4567_89ab_cdef;
const TOKEN_KEY: u64 = 0x7e57_7e57_c0de_cafe;
const BATCHES_PER_EPOCH: u64 = 5000;

// ---- descriptor contents, derived from seq --------------------------------

fn token_for(seq: u64) -> u64 {
    common::mix(seq ^ TOKEN_KEY) | 1
}

/// The one descriptor the parent publishes as number `seq` of `total`.
fn descriptor(seq: u64, total: u64) -> BatchDescriptor {
    let mut flags = 0;
    if seq % BATCHES_PER_EPOCH == BATCHES_PER_EPOCH - 1 {
        flags |= BATCH_END_OF_EPOCH;
    }
    if seq + 1 == total {
        flags |= BATCH_END_OF_STREAM;
    }
    BatchDescriptor {
        seq,
        token: token_for(seq),
        table_offset: (seq % 1024) * 64,
        batch_index: seq % BATCHES_PER_EPOCH,
        total_bytes: seq.wrapping_mul(4099),
        epoch: (seq / BATCHES_PER_EPOCH) as u32,
        sample_count: (seq % 251) as u32,
        status: if seq % 1000 == 999 {
            ErrorCode::Io.as_i32()
        } else {
            0
        },
        flags,
        reserved: 0,
    }
}

fn spec(session_id: u64, ready_capacity: u32, release_capacity: u32) -> SegmentSpec {
    SegmentSpec {
        session_id,
        ready_capacity,
        release_capacity,
        arena_size: ARENA_SIZE,
        instance_epoch: EPOCH,
        heartbeat_interval_ms: 100,
    }
}

// ---- child processes -------------------------------------------------------

struct ChildProc {
    child: Child,
    output: tempfile::NamedTempFile,
    what: &'static str,
}

/// Re-runs this test binary as a child playing `role`, with the segment fd
/// `fd` inherited under the same number.
fn spawn_child(role: &'static str, fd: BorrowedFd<'_>, env: &[(&str, String)]) -> ChildProc {
    let output = tempfile::NamedTempFile::new().expect("temp file for child output");
    let stdout = output.reopen().expect("reopen child output");
    // One open file (shared offset) for both streams, so they interleave.
    let stderr = stdout.try_clone().expect("dup child output");
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().expect("current test binary"));
    cmd.args([
        "--exact",
        "xproc_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE_ENV, role)
    .env(FD_ENV, raw.to_string())
    .env("RUST_BACKTRACE", "1")
    .stdin(Stdio::null())
    .stdout(Stdio::from(stdout))
    .stderr(Stdio::from(stderr));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let keep_open_across_exec = move || {
        // SAFETY: F_SETFD on a descriptor number only changes its flags; it
        // runs in the forked child, so only the child's copy loses FD_CLOEXEC.
        if unsafe { libc::fcntl(raw, libc::F_SETFD, 0) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl, which is async-signal-safe, and allocates nothing; the parent's
    // fd keeps FD_CLOEXEC, so no child spawned concurrently inherits it.
    unsafe { cmd.pre_exec(keep_open_across_exec) };
    let child = cmd.spawn().expect("spawn child test process");
    ChildProc {
        child,
        output,
        what: role,
    }
}

impl ChildProc {
    fn output_text(&self) -> String {
        let mut s = String::new();
        let _ = File::open(self.output.path()).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    /// Fails the test with the child's output.
    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!(
            "{} child: {why}\n---- child output ----\n{}",
            self.what,
            self.output_text()
        );
    }

    /// `Some(status)` once the child has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        match self.child.try_wait() {
            Ok(s) => s,
            Err(e) => self.fail(&format!("try_wait failed: {e}")),
        }
    }

    /// Waits for the child to exit successfully before `deadline`.
    fn wait_success(&mut self, deadline: Instant) {
        loop {
            if let Some(status) = self.exited() {
                if !status.success() {
                    self.fail(&format!("exited with {status}"));
                }
                return;
            }
            if Instant::now() >= deadline {
                self.fail("did not finish before its deadline; killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The child side, started by `spawn_child` with `GRANARY_XPROC_ROLE` set.
/// Any mismatch panics, so the child exits non-zero. Ignored and filtered
/// out of nextest runs (`.config/nextest.toml`): it is no test on its own.
#[test]
#[ignore = "child process entry point of the cross-process tests; not a test on its own"]
fn xproc_child() {
    let role = std::env::var(ROLE_ENV)
        .expect("xproc_child is only run by the cross-process tests (GRANARY_XPROC_ROLE unset)");
    let _w = granary_testkit::watchdog("xproc_child", CHILD_DEADLINE + Duration::from_secs(10));
    let raw: i32 = env_u64(FD_ENV).expect("fd number in env") as i32;
    // SAFETY: the parent left this descriptor open across exec for us; it
    // stays open for the whole life of this process.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    match role.as_str() {
        "consumer" => consume(fd, env_u64(ITEMS_ENV).expect("item count in env")),
        "hostile" => scribble(
            fd,
            env_u64(SEED_ENV).expect("seed in env"),
            Duration::from_millis(env_u64(MILLIS_ENV).expect("duration in env")),
        ),
        other => panic!("unknown child role {other}"),
    }
}

/// Loader role: attach, consume `total` descriptors checking each, release each.
fn consume(fd: BorrowedFd<'_>, total: u64) {
    let mut seg = LoaderSegment::attach_fd(fd, Some(EPOCH)).expect("attach to parent's segment");
    assert_eq!(seg.info().arena_size, ARENA_SIZE);
    let (mut ready, mut release) = seg.take_endpoints().expect("loader endpoints");
    let mut buf = [BatchDescriptor::default(); 128];
    let mut next = 0u64;
    while next < total {
        let n = ready.pop_into(&mut buf).expect("ready ring violation");
        if n == 0 {
            ready
                .wait_for_data(Some(Duration::from_secs(1)))
                .expect("ready ring violation");
            continue;
        }
        for d in &buf[..n] {
            let want = descriptor(next, total);
            if *d != want {
                panic!("descriptor {next}: got {d:?}, want {want:?}");
            }
            validate::check_batch(d, ARENA_SIZE).expect("descriptor passes validation");
            let r = ReleaseDescriptor {
                seq: d.seq,
                token: d.token,
            };
            while !release.try_stage(r).expect("release ring violation") {
                release
                    .wait_for_space(Some(Duration::from_secs(1)))
                    .expect("release ring violation");
            }
            next += 1;
        }
        release.publish();
    }
    // Nothing beyond the last descriptor.
    assert_eq!(ready.try_pop().expect("ready ring violation"), None);
    eprintln!("child consumed and released {next} descriptors");
}

/// Hostile role: write random words over the whole segment for `run`.
fn scribble(fd: BorrowedFd<'_>, seed: u64, run: Duration) {
    let len = memfd::file_size(fd).expect("segment size") as usize;
    let region = Region::map_shared_rw(fd, len, false).expect("map segment");
    let words = len / 8;
    let mut rng = common::SplitMix(seed);
    let end = Instant::now() + run;
    let mut writes = 0u64;
    while Instant::now() < end {
        for _ in 0..256 {
            let r = rng.next_u64();
            // Half of the writes go to the first 2 KiB (header, ready ring
            // control block, first slots) where the interesting words are.
            let idx = if r & 1 == 0 {
                (r >> 1) as usize % words.min(256)
            } else {
                (r >> 1) as usize % words
            };
            let value = match rng.next_u64() % 4 {
                0 => rng.next_u64(),
                1 => rng.next_u64() % 64,
                2 => u64::MAX - rng.next_u64() % 64,
                _ => 0,
            };
            // SAFETY: idx < len / 8, so the 8-byte word lies inside the
            // mapping (page aligned, so 8-aligned); the parent reads this
            // memory only through atomics and volatile copies.
            unsafe {
                region
                    .as_ptr()
                    .cast::<u64>()
                    .wrapping_add(idx)
                    .write_volatile(value)
            };
            writes += 1;
        }
    }
    eprintln!("hostile child wrote {writes} random words");
}

// ---- the tests -------------------------------------------------------------

/// At least ten million descriptors cross a process boundary, published in
/// batches of up to 64 with one tail store each; every field of every
/// descriptor and every release is checked.
#[test]
fn ten_million_descriptors_cross_process() {
    let total = env_u64(ITEMS_ENV).unwrap_or(DEFAULT_ITEMS);
    let _w = granary_testkit::watchdog_fn!(CHILD_DEADLINE + Duration::from_secs(30));
    let mut seg = AgentSegment::create_memfd(spec(1, 1024, 1024)).expect("create segment");
    let (mut ready, mut release) = seg.take_endpoints().expect("agent endpoints");
    let fd = seg.fd().expect("memfd segment has an fd");
    let start = Instant::now();
    let deadline = start + CHILD_DEADLINE;
    let mut child = spawn_child("consumer", fd, &[(ITEMS_ENV, total.to_string())]);

    let mut sent = 0u64;
    let mut released = 0u64;
    let mut rbuf = [ReleaseDescriptor::default(); 256];
    let mut publishes = 0u64;
    while released < total {
        let mut progress = false;
        let mut staged = 0;
        while sent < total && staged < 64 {
            match ready.try_stage(descriptor(sent, total)) {
                Ok(true) => {
                    sent += 1;
                    staged += 1;
                }
                Ok(false) => break,
                Err(v) => child.fail(&format!("ready ring violation: {v}")),
            }
        }
        if staged > 0 {
            ready.publish();
            publishes += 1;
            progress = true;
        }
        let n = match release.pop_into(&mut rbuf) {
            Ok(n) => n,
            Err(v) => child.fail(&format!("release ring violation: {v}")),
        };
        for r in &rbuf[..n] {
            if r.seq != released || r.token != token_for(released) {
                child.fail(&format!("release {released}: got {r:?}"));
            }
            released += 1;
        }
        progress |= n > 0;
        if Instant::now() >= deadline {
            child.fail(&format!(
                "deadline passed after {sent} sent, {released} released; killed"
            ));
        }
        if !progress {
            if let Some(status) = child.exited() {
                child.fail(&format!(
                    "exited early with {status} after {released} releases"
                ));
            }
            if let Err(v) = release.wait_for_data(Some(Duration::from_millis(20))) {
                child.fail(&format!("release ring violation: {v}"));
            }
        }
    }
    child.wait_success(deadline);
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(sent, total);
    assert!(total >= DEFAULT_ITEMS || env_u64(ITEMS_ENV).is_some());
    eprintln!(
        "{total} descriptors in {secs:.2} s ({:.1} ns each, {:.1} per publish)",
        secs * 1e9 / total as f64,
        total as f64 / publishes as f64
    );
}

/// A child writes random words over the whole segment while the parent keeps
/// producing on the ready ring, consuming the release ring, waiting with
/// timeouts and attaching as a loader. Every call returns: values, timeouts,
/// typed [`Violation`]s or typed [`AttachError`]s; the parent never crashes,
/// and the scribbles are detected on both rings.
#[test]
fn hostile_child_scribbling_the_segment() {
    let _w = granary_testkit::watchdog_fn!(Duration::from_secs(60));
    let seed = common::fresh_seed();
    eprintln!("hostile seed {seed:#x}");
    let mut seg = AgentSegment::create_memfd(spec(2, 8, 8)).expect("create segment");
    let (mut ready, mut release) = seg.take_endpoints().expect("agent endpoints");
    let fd = seg.fd().expect("memfd segment has an fd");
    let mut child = spawn_child(
        "hostile",
        fd,
        &[(SEED_ENV, seed.to_string()), (MILLIS_ENV, "1500".into())],
    );
    let deadline = Instant::now() + Duration::from_secs(30);

    let mut ready_violations = 0u64;
    let mut release_violations = 0u64;
    let mut attach_errors = 0u64;
    let mut pushed = 0u64;
    let mut popped = 0u64;
    let mut iterations = 0u64;
    let mut first_violation: Option<Violation> = None;
    let mut rbuf = [ReleaseDescriptor::default(); 16];
    let check_ring = |v: &Violation, ring: &str| match v {
        Violation::RingIndex { ring: r, .. } => assert_eq!(*r, ring),
        other => panic!("unexpected violation kind on the {ring} ring: {other:?}"),
    };
    loop {
        let done = child.exited().is_some();
        iterations += 1;
        match ready.try_push(descriptor(pushed, u64::MAX)) {
            Ok(true) => pushed += 1,
            Ok(false) => {}
            Err(v) => {
                check_ring(&v, "ready");
                ready_violations += 1;
                first_violation.get_or_insert(v);
            }
        }
        match release.try_pop() {
            Ok(Some(_)) => popped += 1,
            Ok(None) => {}
            Err(v) => {
                check_ring(&v, "release");
                release_violations += 1;
                first_violation.get_or_insert(v);
            }
        }
        match iterations % 8 {
            0 => {
                if let Err(v) = ready.free() {
                    check_ring(&v, "ready");
                }
            }
            1 => {
                if let Err(v) = release.available() {
                    check_ring(&v, "release");
                }
            }
            2 => {
                if let Err(v) = release.pop_into(&mut rbuf) {
                    check_ring(&v, "release");
                }
            }
            3 => match release.pop_blocking(Some(Duration::from_micros(200))) {
                Ok(_) | Err(WaitError::Timeout) => {}
                Err(WaitError::Violation(v)) => check_ring(&v, "release"),
            },
            4 => match ready.push_blocking(descriptor(pushed, u64::MAX), Some(Duration::ZERO)) {
                Ok(()) => pushed += 1,
                Err(WaitError::Timeout) => {}
                Err(WaitError::Violation(v)) => check_ring(&v, "ready"),
            },
            5 => {
                seg.heartbeat(iterations);
                seg.wake_loader();
            }
            6 => {
                // A loader attaching now sees whatever the child left there.
                match LoaderSegment::attach_fd(fd, Some(EPOCH)) {
                    Ok(mut l) => {
                        // Header intact for now: its rings still answer.
                        let (mut c, mut p) = l.take_endpoints().expect("fresh endpoints");
                        let _ = c.try_pop();
                        let _ = p.try_push(ReleaseDescriptor::default());
                    }
                    Err(
                        AttachError::BadMagic(_)
                        | AttachError::BadVersion { .. }
                        | AttachError::StaleEpoch { .. }
                        | AttachError::TooShort { .. }
                        | AttachError::Invalid(_),
                    ) => attach_errors += 1,
                    Err(AttachError::Os(e)) => panic!("attach failed in the OS: {e}"),
                }
            }
            _ => {}
        }
        if done {
            break;
        }
        if Instant::now() >= deadline {
            child.fail("hostile child overran its deadline");
        }
    }
    child.wait_success(deadline);
    if let Some(v) = first_violation {
        // What the agent does with a violation: fence the session.
        seg.fence(&v);
    }
    eprintln!(
        "{iterations} iterations: {pushed} pushed, {popped} popped, {ready_violations} ready \
         violations, {release_violations} release violations, {attach_errors} attach errors"
    );
    assert!(
        ready_violations > 0,
        "scribbled ready ring never reported a violation"
    );
    assert!(
        release_violations > 0,
        "scribbled release ring never reported a violation"
    );
    assert!(attach_errors > 0, "scribbled header never failed an attach");
}

// ---- garbage segments ------------------------------------------------------

/// A sealable memfd holding exactly `bytes`.
fn memfd_with(bytes: &[u8]) -> OwnedFd {
    let fd = memfd::create("granary-garbage", bytes.len() as u64, false).expect("memfd");
    let file = File::from(fd.try_clone().expect("dup memfd"));
    file.write_all_at(bytes, 0).expect("fill memfd");
    fd
}

/// The bytes of a freshly created, valid segment.
fn valid_segment_bytes(ready: u32, release: u32) -> Vec<u8> {
    let seg = AgentSegment::create_memfd(spec(3, ready, release)).expect("create segment");
    let len = seg.geometry().segment_size as usize;
    let mut bytes = vec![0u8; len];
    File::from(seg.fd().unwrap().try_clone_to_owned().unwrap())
        .read_exact_at(&mut bytes, 0)
        .expect("read segment");
    bytes
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Attaches a loader to a memfd holding `bytes`; on success returns the
/// header as the loader read it, after taking its ring ends once.
fn attach(bytes: &[u8]) -> Result<HeaderSnapshot, AttachError> {
    let fd = memfd_with(bytes);
    let mut l = LoaderSegment::attach_fd(fd.as_fd(), Some(EPOCH))?;
    assert!(l.take_endpoints().is_some());
    Ok(*l.info())
}

/// Garbage, short, wrong-version and truncated segments are refused with
/// the right typed error; a valid copy is accepted.
#[test]
fn attach_rejects_garbage_segments() {
    let _w = granary_testkit::watchdog("attach_rejects_garbage_segments", Duration::from_secs(60));
    let mut rng = common::SplitMix(common::fresh_seed());
    let random = |rng: &mut common::SplitMix, n: usize| -> Vec<u8> {
        (0..n).map(|_| rng.next_u64() as u8).collect()
    };

    // Random bytes: the magic is whatever the first eight bytes say.
    for _ in 0..32 {
        let bytes = random(&mut rng, 8192);
        let magic = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        match attach(&bytes) {
            Err(AttachError::BadMagic(m)) => assert_eq!(m, magic),
            other => panic!("random segment: {other:?}"),
        }
    }

    // Shorter than a header (including empty).
    for n in [0usize, 1, 8, 100, 255] {
        match attach(&random(&mut rng, n)) {
            Err(AttachError::TooShort {
                needed: 256,
                actual,
            }) => assert_eq!(actual, n as u64),
            other => panic!("{n}-byte segment: {other:?}"),
        }
    }

    let valid = valid_segment_bytes(256, 256);
    assert!(valid.len() > 8192);
    let info = attach(&valid).expect("a copy of a valid segment attaches");
    assert_eq!(info.segment_size, valid.len() as u64);

    // Magic right, version wrong.
    for version in [0u32, LAYOUT_VERSION + 1, u32::MAX] {
        let mut bytes = valid.clone();
        put_u32(&mut bytes, 8, version);
        match attach(&bytes) {
            Err(AttachError::BadVersion { found, expected }) => {
                assert_eq!((found, expected), (version, LAYOUT_VERSION))
            }
            other => panic!("version {version}: {other:?}"),
        }
    }

    // segment_size claims more than the file holds.
    for extra in [1u64, 4096, u64::MAX - valid.len() as u64] {
        let mut bytes = valid.clone();
        let claimed = valid.len() as u64 + extra;
        put_u64(&mut bytes, 32, claimed);
        match attach(&bytes) {
            Err(AttachError::TooShort { needed, actual }) => {
                assert_eq!((needed, actual), (claimed, valid.len() as u64))
            }
            other => panic!("segment_size {claimed}: {other:?}"),
        }
    }

    // A valid header in a file cut short.
    match attach(&valid[..8192]) {
        Err(AttachError::TooShort { needed, actual }) => {
            assert_eq!((needed, actual), (valid.len() as u64, 8192))
        }
        other => panic!("truncated segment: {other:?}"),
    }

    // Another instance's segment.
    let mut bytes = valid.clone();
    put_u64(&mut bytes, 16, EPOCH ^ 1);
    assert!(matches!(
        attach(&bytes),
        Err(AttachError::StaleEpoch { found, expected: EPOCH }) if found == EPOCH ^ 1
    ));

    // Right identity words over random geometry: a typed refusal, never a panic.
    for _ in 0..256 {
        let mut bytes = random(&mut rng, valid.len());
        bytes[..24].copy_from_slice(&valid[..24]);
        put_u64(&mut bytes, 0, SEGMENT_MAGIC);
        match attach(&bytes) {
            Err(AttachError::Invalid(_)) | Err(AttachError::TooShort { .. }) => {}
            other => panic!("random geometry: {other:?}"),
        }
    }

    // Each geometry field of a valid header, corrupted alone.
    // (header_size, ready_offset, ready_capacity, ready_item_size,
    // release_offset, release_capacity, release_item_size)
    for at in [12usize, 48, 56, 60, 64, 72, 76] {
        let mut bytes = valid.clone();
        bytes[at] ^= 0x40;
        assert!(
            matches!(attach(&bytes), Err(AttachError::Invalid(_))),
            "corrupt byte at {at} accepted"
        );
    }
}
