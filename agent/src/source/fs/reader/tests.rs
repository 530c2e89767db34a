use super::*;

use crate::planner::mix64;
use crate::source::SampleError;
use crate::testutil::Mem;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A directory under the system temp dir, removed when dropped.
struct TestDir(PathBuf);

impl TestDir {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("granary-uring-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create test dir");
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// File contents derived from a file number, so every byte can be checked.
fn content(id: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (mix64(id.wrapping_mul(0x1_0000_0001) ^ (i / 8)) >> ((i % 8) * 8)) as u8)
        .collect()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

/// A FIFO at `path`.
fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
}

/// Whether the engine's retry policy may try `err` again.
fn retryable(err: &io::Error) -> bool {
    SampleError::from_io(err).kind.retryable()
}

fn modes() -> [bool; 2] {
    [true, false]
}

/// Submits every request (polling while the queue is full) and collects all
/// completions by tag, in the order they arrived.
fn run_all(reader: &mut UringReader, requests: Vec<ReadRequest>) -> Vec<Completion> {
    let mut out = Vec::new();
    for req in requests {
        let mut req = req;
        loop {
            match reader.submit(req) {
                Ok(()) => break,
                Err(Full(back)) => {
                    req = back;
                    reader
                        .poll_completions(Some(Duration::from_secs(5)), &mut out)
                        .expect("poll");
                }
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while reader.in_flight() > 0 {
        assert!(Instant::now() < deadline, "reads did not finish");
        reader
            .poll_completions(Some(Duration::from_secs(5)), &mut out)
            .expect("poll");
    }
    out
}

fn path_request(tag: u64, path: &Path, offset: u64, len: u32, dest: ArenaSlice) -> ReadRequest {
    ReadRequest {
        tag,
        path: cpath(path),
        offset,
        len,
        dest,
        expect: None,
        direct: false,
    }
}

/// The size and modification time of `path` now.
fn stat_of(path: &Path) -> FileStat {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).expect("stat");
    FileStat {
        size: m.len(),
        mtime: (m.mtime(), u32::try_from(m.mtime_nsec()).expect("nsec")),
    }
}

#[test]
fn a_file_that_changed_since_cataloguing_fails_with_what_changed() {
    use crate::source::{queue, FailureKind};
    let dir = TestDir::new();
    let same = dir.path("same");
    let grown = dir.path("grown");
    let replaced = dir.path("replaced");
    for p in [&same, &grown, &replaced] {
        fs::write(p, content(7, 300)).expect("write");
    }
    let catalogued: Vec<FileStat> = [&same, &grown, &replaced].map(|p| stat_of(p)).to_vec();
    // Grown by one byte; replaced by other bytes of the same size with a
    // later modification time.
    fs::write(&grown, content(7, 301)).expect("grow");
    fs::write(&replaced, content(8, 300)).expect("replace");
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    fs::File::options()
        .write(true)
        .open(&replaced)
        .and_then(|f| f.set_modified(later))
        .expect("set mtime");
    for linked in modes() {
        let mem = Mem::zeroed(900);
        let mut reader = UringReader::with_linking(4, linked).expect("reader");
        let requests = [&same, &grown, &replaced]
            .iter()
            .enumerate()
            .map(|(i, p)| ReadRequest {
                expect: Some(catalogued[i]),
                ..path_request(i as u64, p, 0, 300, mem.at(i * 300, 300))
            })
            .collect();
        let done = run_all(&mut reader, requests);
        let by_tag: HashMap<u64, &Completion> = done.iter().map(|c| (c.tag, c)).collect();
        assert_eq!(*by_tag[&0].result.as_ref().expect("unchanged file"), 300);
        assert!(mem.bytes()[..300] == content(7, 300)[..]);

        let err = by_tag[&1].result.as_ref().expect_err("grown file");
        let c = queue::changed(err).expect("a Changed error");
        assert!(
            c.size_differs && c.what.contains("size 301 (catalogued 300)"),
            "{c}"
        );
        assert_eq!(SampleError::from_io(err).kind, FailureKind::Short);
        assert!(err.to_string().contains("grown"), "{err}");

        let err = by_tag[&2].result.as_ref().expect_err("replaced file");
        let c = queue::changed(err).expect("a Changed error");
        assert!(!c.size_differs && c.what.contains("modified at"), "{c}");
        assert_eq!(SampleError::from_io(err).kind, FailureKind::Corrupt);
        assert!(!retryable(err), "a changed file is final");
    }
}

#[test]
fn reads_2000_files_at_depth_64_into_one_buffer() {
    let dir = TestDir::new();
    let mut files = Vec::new();
    let mut at = 0usize;
    for id in 0..2000u64 {
        let len = (mix64(id + 7) % 40_000) as usize;
        let path = dir.path(&format!("{id:05}.bin"));
        fs::write(&path, content(id, len)).expect("write file");
        // Distinct, non-adjacent destinations with a guard gap between them.
        files.push((id, path, at, len));
        at += len + 64;
    }
    for linked in modes() {
        let mem = Mem::filled(at, 0xAA);
        let mut reader = UringReader::with_linking(64, linked).expect("reader");
        let requests = files
            .iter()
            .map(|(id, path, at, len)| path_request(*id, path, 0, *len as u32, mem.at(*at, *len)))
            .collect();
        let done = run_all(&mut reader, requests);
        let buf = mem.bytes();
        assert_eq!(done.len(), files.len());
        let mut seen = HashMap::new();
        for c in &done {
            let n = c.result.as_ref().expect("read succeeds");
            assert!(seen.insert(c.tag, *n).is_none(), "tag {} twice", c.tag);
        }
        for (id, _, at, len) in &files {
            assert_eq!(seen.get(id), Some(&(*len as u32)));
            assert!(
                buf[*at..at + len] == content(*id, *len)[..],
                "file {id} bytes"
            );
            assert!(
                buf[at + len..at + len + 64].iter().all(|&b| b == 0xAA),
                "gap after {id}"
            );
        }
        let reordered = done.windows(2).filter(|w| w[0].tag > w[1].tag).count();
        eprintln!(
            "linked={linked} (active: {}) completions out of submission order: {reordered}",
            reader.is_linked()
        );
    }
}

#[test]
fn vanished_file_fails_alone_with_enoent_and_its_path() {
    let dir = TestDir::new();
    let mut paths = Vec::new();
    for id in 0..50u64 {
        let path = dir.path(&format!("f{id}"));
        fs::write(&path, content(id, 1000)).expect("write");
        paths.push(path);
    }
    fs::remove_file(&paths[17]).expect("remove");
    for linked in modes() {
        let mem = Mem::zeroed(50 * 1000);
        let mut reader = UringReader::with_linking(8, linked).expect("reader");
        let requests = paths
            .iter()
            .enumerate()
            .map(|(i, p)| path_request(i as u64, p, 0, 1000, mem.at(i * 1000, 1000)))
            .collect();
        let done = run_all(&mut reader, requests);
        let buf = mem.bytes();
        assert_eq!(done.len(), 50);
        for c in done {
            if c.tag == 17 {
                let err = c.result.expect_err("vanished file must fail");
                assert_eq!(errno(&err), Some(libc::ENOENT));
                assert_eq!(err.kind(), io::ErrorKind::NotFound);
                let msg = err.to_string();
                assert!(msg.contains(&paths[17].display().to_string()), "{msg}");
                assert!(msg.starts_with("open "), "{msg}");
                assert!(!retryable(&err));
            } else {
                assert_eq!(c.result.expect("others succeed"), 1000);
                let i = c.tag as usize;
                assert!(buf[i * 1000..(i + 1) * 1000] == content(c.tag, 1000)[..]);
            }
        }
    }
}

#[test]
fn file_shorter_than_requested_is_an_error() {
    let dir = TestDir::new();
    let path = dir.path("short");
    fs::write(&path, content(1, 100)).expect("write");
    for linked in modes() {
        let mem = Mem::zeroed(400);
        let mut reader = UringReader::with_linking(4, linked).expect("reader");
        let requests = vec![
            path_request(1, &path, 0, 200, mem.at(0, 200)),
            path_request(2, &path, 500, 10, mem.at(200, 10)),
            path_request(3, &path, 40, 60, mem.at(300, 60)),
        ];
        let done = run_all(&mut reader, requests);
        let buf = mem.bytes();
        let by_tag: HashMap<u64, &Completion> = done.iter().map(|c| (c.tag, c)).collect();
        let err = by_tag[&1].result.as_ref().expect_err("short file");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let msg = err.to_string();
        assert!(msg.contains("short") && msg.contains("100 of 200"), "{msg}");
        assert!(!retryable(err));
        let err = by_tag[&2].result.as_ref().expect_err("offset past the end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // A range that ends exactly at end of file is fine.
        assert_eq!(*by_tag[&3].result.as_ref().expect("tail read"), 60);
        assert!(buf[300..360] == content(1, 100)[40..]);
    }
}

#[test]
fn directory_is_an_error() {
    let dir = TestDir::new();
    fs::create_dir(dir.path("sub")).expect("mkdir");
    for linked in modes() {
        let mem = Mem::zeroed(16);
        let mut reader = UringReader::with_linking(2, linked).expect("reader");
        let done = run_all(
            &mut reader,
            vec![path_request(9, &dir.path("sub"), 0, 16, mem.all())],
        );
        let err = done[0].result.as_ref().expect_err("directory");
        assert_eq!(errno(err), Some(libc::EISDIR));
        assert!(err.to_string().contains("sub"), "{err}");
        assert!(!retryable(err));
    }
}

#[test]
fn queue_full_gives_the_request_back() {
    let dir = TestDir::new();
    let path = dir.path("a");
    fs::write(&path, content(3, 64)).expect("write");
    let mem = Mem::zeroed(64 * 5);
    let mut reader = UringReader::new(4).expect("reader");
    assert_eq!(reader.capacity(), 4);
    for i in 0..4 {
        let r = reader.submit(path_request(i, &path, 0, 64, mem.at(i as usize * 64, 64)));
        assert!(r.is_ok());
    }
    assert_eq!(reader.in_flight(), 4);
    let refused = reader.submit(path_request(4, &path, 0, 64, mem.at(256, 64)));
    let Err(Full(back)) = refused else {
        panic!("fifth request accepted at depth 4");
    };
    assert_eq!(back.tag, 4);
    assert!(Full(back).to_string().contains("full"));
    let done = run_all(&mut reader, Vec::new());
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| matches!(c.result, Ok(64))));
    assert_eq!(reader.in_flight(), 0);
    assert!(mem.bytes()[..256]
        .chunks(64)
        .all(|c| c == &content(3, 64)[..]));
}

#[test]
fn reads_a_range_at_an_offset() {
    let dir = TestDir::new();
    let path = dir.path("big");
    let data = content(5, 3_000_000);
    fs::write(&path, &data).expect("write");
    for linked in modes() {
        let mem = Mem::zeroed(2_000_000);
        let mut reader = UringReader::with_linking(2, linked).expect("reader");
        let req = path_request(1, &path, 1_000_000, 2_000_000, mem.all());
        let done = run_all(&mut reader, vec![req]);
        assert_eq!(*done[0].result.as_ref().expect("read"), 2_000_000);
        assert!(mem.bytes()[..] == data[1_000_000..]);
    }
}

#[test]
fn bad_requests_complete_with_an_error() {
    let dir = TestDir::new();
    let path = dir.path("z");
    fs::write(&path, b"").expect("write");
    let byte = Mem::zeroed(1);
    let mut reader = UringReader::new(4).expect("reader");
    let done = run_all(
        &mut reader,
        vec![
            // Eight bytes into a destination of one.
            path_request(1, &path, 0, 8, byte.all()),
            path_request(2, &path, u64::MAX, 1, byte.all()),
            // Zero bytes of an empty file: fine.
            path_request(3, &path, 0, 0, byte.all()),
            // Zero bytes of a missing file: still an open error.
            path_request(4, &dir.path("missing"), 0, 0, byte.all()),
        ],
    );
    let by_tag: HashMap<u64, &Completion> = done.iter().map(|c| (c.tag, c)).collect();
    for tag in [1, 2] {
        let err = by_tag[&tag].result.as_ref().expect_err("bad request");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
    assert_eq!(*by_tag[&3].result.as_ref().expect("empty read"), 0);
    assert_eq!(
        errno(by_tag[&4].result.as_ref().expect_err("missing")),
        Some(libc::ENOENT)
    );
    assert!(UringReader::new(0).is_err());
    assert!(UringReader::new(MAX_QUEUE_DEPTH + 1).is_err());
    // A request the caller rejects completes with its error.
    let why = io::Error::new(io::ErrorKind::InvalidInput, "too large");
    reader.reject(5, why).expect("room");
    let done = run_all(&mut reader, Vec::new());
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 5);
    let err = done[0].result.as_ref().expect_err("rejected");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn waits_are_bounded() {
    let dir = TestDir::new();
    let fifo = dir.path("fifo");
    mkfifo(&fifo);
    let mem = Mem::zeroed(5);
    let mut reader = UringReader::new(2).expect("reader");
    let mut out = Vec::new();
    let t = Instant::now();
    assert_eq!(
        reader
            .poll_completions(Some(Duration::from_millis(20)), &mut out)
            .expect("idle poll"),
        0
    );
    let r = reader.submit(path_request(1, &fifo, 0, 5, mem.all()));
    assert!(r.is_ok());
    // Opening a FIFO without a writer blocks; the poll must not.
    let n = reader
        .poll_completions(Some(Duration::from_millis(100)), &mut out)
        .expect("poll");
    assert_eq!(n, 0);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(reader.in_flight(), 1);
    // A writer unblocks the open; the read then gets its five bytes.
    let mut writer = fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("open writer");
    std::io::Write::write_all(&mut writer, b"hello").expect("write");
    drop(writer);
    let done = run_all(&mut reader, Vec::new());
    assert_eq!(*done[0].result.as_ref().expect("fifo read"), 5);
    assert_eq!(mem.bytes(), b"hello");
}

#[test]
fn errors_are_classified_for_the_retry_policy() {
    let os = io::Error::from_raw_os_error;
    for e in [libc::EIO, libc::EAGAIN, libc::EINTR, libc::ETIMEDOUT] {
        assert!(retryable(&os(e)), "errno {e}");
    }
    for e in [libc::ENOENT, libc::EACCES, libc::EISDIR, libc::EINVAL] {
        assert!(!retryable(&os(e)), "errno {e}");
    }
    let wrapped = ReadError {
        op: "read",
        target: "/x".into(),
        errno: Some(libc::EIO),
        short: None,
    }
    .into_io();
    assert_eq!(errno(&wrapped), Some(libc::EIO));
    assert!(retryable(&wrapped));
    assert!(retryable(&io::Error::from(io::ErrorKind::TimedOut)));
    let short = ReadError {
        op: "read",
        target: "/x".into(),
        errno: None,
        short: Some((3, 9)),
    }
    .into_io();
    assert_eq!(
        SampleError::from_io(&short).kind,
        crate::source::FailureKind::Short
    );
    assert!(!retryable(&short));
}

#[test]
fn completions_arrive_out_of_order_when_one_read_is_slow() {
    for linked in modes() {
        let dir = TestDir::new();
        let fifo = dir.path("slow");
        mkfifo(&fifo);
        let slow = Mem::zeroed(3);
        let fast = Mem::zeroed(10 * 100);
        let mut reader = UringReader::with_linking(16, linked).expect("reader");
        let mut requests = vec![path_request(0, &fifo, 0, 3, slow.all())];
        for id in 1..=10u64 {
            let path = dir.path(&format!("{id}"));
            fs::write(&path, content(id, 100)).expect("write");
            let at = (id as usize - 1) * 100;
            requests.push(path_request(id, &path, 0, 100, fast.at(at, 100)));
        }
        let mut out = Vec::new();
        for req in requests {
            assert!(reader.submit(req).is_ok());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while out.len() < 10 && Instant::now() < deadline {
            reader
                .poll_completions(Some(Duration::from_millis(200)), &mut out)
                .expect("poll");
        }
        // The FIFO (submitted first) has no writer yet, so it is still pending
        // while every later request has finished.
        let mut tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, (1..=10).collect::<Vec<_>>());
        assert_eq!(reader.in_flight(), 1);
        let mut writer = fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("writer");
        std::io::Write::write_all(&mut writer, b"abc").expect("write");
        drop(writer);
        let done = run_all(&mut reader, Vec::new());
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].tag, 0);
        assert_eq!(*done[0].result.as_ref().expect("fifo read"), 3);
        assert_eq!(slow.bytes(), b"abc");
        let fast = fast.bytes();
        for id in 1..=10u64 {
            let at = (id as usize - 1) * 100;
            assert!(fast[at..at + 100] == content(id, 100)[..]);
        }
    }
}

#[test]
fn short_reads_continue_where_they_stopped() {
    // A FIFO hands out what has been written so far: the first read is short
    // and the rest must come from a second read on the same open file.
    let dir = TestDir::new();
    let fifo = dir.path("trickle");
    mkfifo(&fifo);
    let mem = Mem::zeroed(5);
    let mut reader = UringReader::with_linking(2, false).expect("reader");
    let r = reader.submit(path_request(1, &fifo, 0, 5, mem.all()));
    assert!(r.is_ok());
    let mut out = Vec::new();
    reader
        .poll_completions(Some(Duration::from_millis(20)), &mut out)
        .expect("poll");
    let mut writer = fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("writer");
    std::io::Write::write_all(&mut writer, b"abc").expect("write");
    let n = reader
        .poll_completions(Some(Duration::from_millis(200)), &mut out)
        .expect("poll");
    assert_eq!(n, 0, "three of five bytes is not a completion");
    std::io::Write::write_all(&mut writer, b"de").expect("write");
    drop(writer);
    let done = run_all(&mut reader, Vec::new());
    assert_eq!(*done[0].result.as_ref().expect("read"), 5);
    assert_eq!(mem.bytes(), b"abcde");
}

/// A FIFO at `path`, held open for reading and writing by the returned
/// descriptor so that opening it does not block, with nothing ever written.
fn silent_fifo(path: &Path) -> std::fs::File {
    mkfifo(path);
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open fifo")
}

#[test]
fn a_read_that_never_completes_times_out_and_others_succeed() {
    let dir = TestDir::new();
    let fifo = dir.path("silent.fifo");
    let _held = silent_fifo(&fifo);
    let file = dir.path("plain.bin");
    let data = content(3, 5000);
    fs::write(&file, &data).expect("write file");
    let limit = Duration::from_millis(300);
    for linked in modes() {
        let mut reader = UringReader::with_linking(2, linked)
            .expect("reader")
            .with_timeout(Some(limit));
        assert_eq!(reader.timeout(), Some(limit));
        let hung = Mem::zeroed(64);
        let plain = Mem::zeroed(data.len());
        let start = Instant::now();
        let done = run_all(
            &mut reader,
            vec![
                path_request(1, &fifo, 0, 64, hung.all()),
                path_request(2, &file, 0, data.len() as u32, plain.all()),
            ],
        );
        let elapsed = start.elapsed();
        assert_eq!(done.len(), 2);
        for c in &done {
            match c.tag {
                1 => {
                    let err = c.result.as_ref().expect_err("the silent read fails");
                    assert_eq!(errno(err), Some(libc::ETIME), "linked {linked}: {err}");
                    assert!(err.to_string().contains("silent.fifo"), "{err}");
                    assert!(err.to_string().starts_with("read "), "{err}");
                }
                2 => assert_eq!(c.result.as_ref().ok(), Some(&(data.len() as u32))),
                t => panic!("unexpected tag {t}"),
            }
        }
        assert_eq!(plain.bytes(), data);
        assert!(
            elapsed >= limit,
            "linked {linked}: failed after {elapsed:?}"
        );
        assert!(
            elapsed < limit + Duration::from_secs(3),
            "linked {linked}: took {elapsed:?}"
        );
        // The slot of the timed-out request is usable again.
        let again = Mem::zeroed(data.len());
        let done = run_all(
            &mut reader,
            vec![
                path_request(3, &file, 0, data.len() as u32, again.all()),
                path_request(4, &file, 0, data.len() as u32, plain.all()),
            ],
        );
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        assert_eq!(again.bytes(), data);
    }
}

#[test]
fn a_fifo_without_a_writer_times_out() {
    let dir = TestDir::new();
    let fifo = dir.path("nowriter.fifo");
    mkfifo(&fifo);
    let limit = Duration::from_millis(300);
    for linked in modes() {
        let mut reader = UringReader::with_linking(1, linked)
            .expect("reader")
            .with_timeout(Some(limit));
        let mem = Mem::zeroed(8);
        let start = Instant::now();
        // Nobody ever opens the FIFO for writing: depending on how the
        // kernel runs the open (blocking in a worker, or non-blocking inline)
        // either the open or the read never completes.
        let done = run_all(&mut reader, vec![path_request(1, &fifo, 0, 8, mem.all())]);
        let elapsed = start.elapsed();
        let err = done[0].result.as_ref().expect_err("the open fails");
        assert_eq!(errno(err), Some(libc::ETIME), "linked {linked}: {err}");
        let text = err.to_string();
        assert!(
            text.starts_with("open ") || text.starts_with("read "),
            "{text}"
        );
        assert!(text.contains("nowriter.fifo"), "{text}");
        assert!(elapsed >= limit && elapsed < limit + Duration::from_secs(3));
    }
}

#[test]
fn without_a_timeout_reads_are_not_limited() {
    let reader = UringReader::new(1).expect("reader");
    assert_eq!(reader.timeout(), None);
}

/// Writes `bytes` to `path`, flushed to the disk, and drops its pages from
/// the page cache; whether the page cache could be emptied of it (not on
/// filesystems that live in memory).
fn write_uncached(path: &Path, bytes: &[u8]) -> bool {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    fs::write(path, bytes).expect("write");
    let f = fs::File::open(path).expect("open");
    f.sync_all().expect("sync");
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).expect("fadvise");
    crate::sys::pages_in_page_cache(&f, bytes.len()).expect("mincore") == 0
}

/// `len` rounded up to the `O_DIRECT` block, at least one block.
fn blocks(len: usize) -> usize {
    len.next_multiple_of(DIRECT_BLOCK as usize)
        .max(DIRECT_BLOCK as usize)
}

#[test]
fn direct_reads_deliver_every_byte_and_leave_the_page_cache_alone() {
    let dir = TestDir::new();
    let sizes = [0usize, 1, 511, 4095, 4096, 4097, 12_288, 300_001];
    for linked in modes() {
        let paths: Vec<PathBuf> = (0..sizes.len())
            .map(|i| dir.path(&format!("f{i}-{linked}")))
            .collect();
        let mut uncached = true;
        for (i, (p, &len)) in paths.iter().zip(&sizes).enumerate() {
            uncached &= write_uncached(p, &content(i as u64, len));
        }
        let offsets: Vec<usize> = sizes
            .iter()
            .scan(0, |at, &len| {
                let here = *at;
                *at += blocks(len);
                Some(here)
            })
            .collect();
        let total: usize = sizes.iter().map(|&l| blocks(l)).sum();
        let mem = Mem::zeroed(total);
        let mut reader = UringReader::with_linking(4, linked).expect("reader");
        let requests = paths
            .iter()
            .enumerate()
            .map(|(i, p)| ReadRequest {
                direct: true,
                expect: Some(stat_of(p)),
                ..path_request(
                    i as u64,
                    p,
                    0,
                    sizes[i] as u32,
                    mem.at(offsets[i], blocks(sizes[i])),
                )
            })
            .collect();
        let done = run_all(&mut reader, requests);
        assert_eq!(done.len(), sizes.len());
        let bytes = mem.bytes();
        for c in &done {
            let i = c.tag as usize;
            let len = sizes[i];
            assert_eq!(*c.result.as_ref().expect("direct read"), len as u32);
            assert!(
                bytes[offsets[i]..offsets[i] + len] == content(i as u64, len)[..],
                "file {i} ({len} bytes, linked {linked})"
            );
        }
        assert!(reader.direct_io(), "O_DIRECT still on");
        assert_eq!(reader.direct_refusals(), 0);
        if uncached {
            for (p, &len) in paths.iter().zip(&sizes) {
                let f = fs::File::open(p).expect("open");
                let cached = crate::sys::pages_in_page_cache(&f, len).expect("mincore");
                assert_eq!(cached, 0, "{} went through the page cache", p.display());
            }
        } else {
            println!(
                "NOTE: the temporary folder's filesystem keeps files in memory: \
                 page-cache bypass not checked, bytes only"
            );
        }
    }
}

#[test]
fn a_misaligned_direct_request_is_read_through_the_page_cache_alone() {
    let dir = TestDir::new();
    let p = dir.path("f");
    let bytes = content(3, 20_000);
    fs::write(&p, &bytes).expect("write");
    let span = blocks(9000);
    for linked in modes() {
        let mem = Mem::zeroed(8192 + 2 * span);
        let mut reader = UringReader::with_linking(4, linked).expect("reader");
        // Offset 100 is no multiple of any device's block: the kernel
        // refuses the O_DIRECT read, and the request goes on buffered.
        let odd = ReadRequest {
            direct: true,
            ..path_request(0, &p, 100, 5000, mem.at(0, 8192))
        };
        let done = run_all(&mut reader, vec![odd]);
        assert_eq!(*done[0].result.as_ref().expect("read"), 5000);
        assert!(mem.bytes()[..5000] == bytes[100..5100]);
        assert_eq!(reader.direct_refusals(), 1, "linked {linked}");
        assert!(reader.direct_io(), "the request's fault, not the device's");
        // Aligned requests keep O_DIRECT, at an offset too; the second
        // one's last block runs past the end of the file.
        let aligned = [(1u64, 4096u64), (2, 8192)]
            .iter()
            .enumerate()
            .map(|(k, &(tag, offset))| ReadRequest {
                direct: true,
                ..path_request(tag, &p, offset, 9000, mem.at(8192 + k * span, span))
            })
            .collect();
        let done = run_all(&mut reader, aligned);
        let got = mem.bytes();
        for c in &done {
            assert_eq!(*c.result.as_ref().expect("read"), 9000);
            let k = c.tag as usize - 1;
            let at = 8192 + k * span;
            let from = 4096 * c.tag as usize;
            assert!(
                got[at..at + 9000] == bytes[from..from + 9000],
                "request {}",
                c.tag
            );
        }
        assert_eq!(
            reader.direct_refusals(),
            1,
            "no refusal of aligned requests"
        );
    }
}

/// Needs root (mounts a ramfs, whose files refuse `O_DIRECT` at open):
/// run by `scripts/test.sh` in its root step.
#[test]
#[ignore = "needs root: mounts a ramfs"]
fn a_filesystem_that_refuses_direct_io_is_read_through_the_page_cache() {
    let dir = TestDir::new();
    let mnt = dir.path("ramfs");
    fs::create_dir(&mnt).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&mnt)
        .status()
        .expect("run mount");
    assert!(mounted.success(), "mount -t ramfs (needs root)");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&mnt);
    let sizes = [5000usize, 4096, 70_000, 1];
    for (i, &len) in sizes.iter().enumerate() {
        fs::write(mnt.join(format!("f{i}")), content(i as u64, len)).expect("write");
    }
    for linked in modes() {
        let mem = Mem::zeroed(sizes.iter().map(|&l| blocks(l)).sum());
        let mut reader = UringReader::with_linking(2, linked).expect("reader");
        let mut at = 0;
        let requests = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let dest = mem.at(at, blocks(len));
                at += blocks(len);
                ReadRequest {
                    direct: true,
                    ..path_request(i as u64, &mnt.join(format!("f{i}")), 0, len as u32, dest)
                }
            })
            .collect();
        let done = run_all(&mut reader, requests);
        let got = mem.bytes();
        let mut at = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let c = done.iter().find(|c| c.tag == i as u64).expect("completion");
            assert_eq!(*c.result.as_ref().expect("read"), len as u32);
            assert!(got[at..at + len] == content(i as u64, len)[..], "file {i}");
            at += blocks(len);
        }
        assert!(!reader.direct_io(), "O_DIRECT off after the refusal");
        // The requests in flight when it was refused were refused too
        // (queue depth 2); the later ones did not ask.
        let refused = reader.direct_refusals();
        assert!((1..=2).contains(&refused), "{refused} refusals");
    }
}
