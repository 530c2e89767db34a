//! The C API called from Rust: argument checks, versioning, error strings,
//! and a whole session through the `extern "C"` functions.
//!
//! These tests call the C API the way a C program does: a run of calls on
//! the same handles under one stated contract, so one `unsafe` block (and
//! one SAFETY comment) covers each run.
#![allow(clippy::multiple_unsafe_ops_per_block)]

mod support;

use std::ffi::{c_char, CStr, CString};
use std::ptr;

use granary::ffi::*;
use granary::ErrorCode;
use support::{plan_epoch, sample_label, watchdog, Behaviour, Dataset, Fixture, Stats, WATCHDOG};

const OK: i32 = GranaryStatus::GranaryOk as i32;
const INVALID: i32 = GranaryStatus::GranaryEInvalidArgument as i32;

fn cstr(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the library returns NUL-terminated strings that outlive this call.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
}

fn last_error() -> String {
    cstr(granary_last_error_message())
}

fn init_options(dataset: &CStr) -> GranarySessionOptions {
    let mut o = std::mem::MaybeUninit::<GranarySessionOptions>::uninit();
    // SAFETY: `o` is writable for the struct's size.
    assert_eq!(unsafe { granary_session_options_init(o.as_mut_ptr()) }, OK);
    // SAFETY: init wrote every field.
    let mut o = unsafe { o.assume_init() };
    o.dataset = dataset.as_ptr();
    o
}

fn connect(fx: &Fixture) -> *mut GranaryClient {
    let path = CString::new(fx.socket_path().as_os_str().as_encoded_bytes()).unwrap();
    let mut client = ptr::null_mut();
    // SAFETY: valid string and out pointer.
    let rc = unsafe { granary_connect(path.as_ptr(), &mut client) };
    assert_eq!(rc, OK, "{}", last_error());
    assert!(!client.is_null());
    client
}

fn open(client: *mut GranaryClient, o: &GranarySessionOptions) -> *mut GranarySession {
    let mut s = ptr::null_mut();
    // SAFETY: live client, initialised options, valid out pointer.
    let rc = unsafe { granary_session_open(client, o, &mut s) };
    assert_eq!(rc, OK, "{}", last_error());
    assert!(!s.is_null());
    s
}

#[test]
fn abi_version_and_error_strings() {
    assert_eq!(granary_abi_version(), GRANARY_ABI_VERSION);
    assert_eq!(granary_abi_version(), granary::ABI_VERSION);
    for code in ErrorCode::ALL {
        let text = cstr(granary_strerror(code.as_i32()));
        assert!(!text.is_empty());
        assert_eq!(text, code.message());
    }
    // Each way a sample can fail has its own code and text.
    let kinds: Vec<(i32, String)> = ErrorCode::SAMPLE_FAILURES
        .iter()
        .map(|c| (c.as_i32(), cstr(granary_strerror(c.as_i32()))))
        .collect();
    assert_eq!(
        kinds.iter().map(|k| k.0).collect::<Vec<_>>(),
        [-8, -11, -2, -13, -17, -19]
    );
    assert!(kinds[5].1.contains("decode"), "{}", kinds[5].1);
    assert!(kinds[4].1.contains("catalogued"), "{}", kinds[4].1);
    assert!(kinds[1].1.contains("transient"), "{}", kinds[1].1);
    assert_eq!(
        GranaryStatus::GranaryEShortRead as i32,
        ErrorCode::ShortRead.as_i32()
    );
    assert_eq!(
        GranaryStatus::GranaryEDecode as i32,
        ErrorCode::Decode.as_i32()
    );
    for unknown in [1, 2, -20, -1000, i32::MIN, i32::MAX] {
        assert_eq!(cstr(granary_strerror(unknown)), "unknown error");
    }
    // The same static pointer every time.
    assert_eq!(granary_strerror(-2), granary_strerror(-2));
}

#[test]
fn null_pointers_are_invalid_arguments() {
    let dataset = c"x";
    let o = init_options(dataset);
    let mut client: *mut GranaryClient = ptr::dangling_mut();
    let mut session: *mut GranarySession = ptr::dangling_mut();
    let mut batch: *mut GranaryBatch = ptr::dangling_mut();
    // SAFETY: every pointer is NULL or valid; NULLs must be rejected
    // before anything is dereferenced.
    unsafe {
        assert_eq!(granary_connect(ptr::null(), &mut client), INVALID);
        assert!(client.is_null(), "out is cleared on failure");
        assert!(
            last_error().contains("socket_path is NULL"),
            "{}",
            last_error()
        );
        assert_eq!(
            granary_connect(c"/nonexistent".as_ptr(), ptr::null_mut()),
            INVALID
        );
        granary_client_free(ptr::null_mut());

        assert_eq!(granary_session_options_init(ptr::null_mut()), INVALID);
        assert_eq!(granary_session_open(ptr::null(), &o, &mut session), INVALID);
        assert!(session.is_null());
        assert_eq!(
            granary_session_get_info(ptr::null(), ptr::null_mut()),
            INVALID
        );
        let mut base: *const u8 = ptr::null();
        let mut size = 0u64;
        assert_eq!(
            granary_session_arena(ptr::null(), &mut base, &mut size),
            INVALID
        );
        assert!(last_error().contains("session is NULL"), "{}", last_error());

        assert_eq!(granary_next_batch(ptr::null_mut(), 0, &mut batch), INVALID);
        assert!(batch.is_null());
        assert_eq!(
            granary_next_batch(ptr::null_mut(), 0, ptr::null_mut()),
            INVALID
        );
        assert_eq!(granary_try_next_batch(ptr::null_mut(), &mut batch), INVALID);

        assert_eq!(granary_batch_len(ptr::null()), 0);
        assert_eq!(granary_batch_epoch(ptr::null()), 0);
        assert_eq!(granary_batch_index(ptr::null()), 0);
        assert_eq!(granary_batch_flags(ptr::null()), 0);
        assert_eq!(granary_batch_status(ptr::null()), INVALID);
        assert_eq!(
            granary_batch_sample(ptr::null(), 0, ptr::null_mut()),
            INVALID
        );

        assert_eq!(
            granary_batch_release(ptr::null_mut(), ptr::null_mut()),
            INVALID
        );
        assert_eq!(granary_session_close(ptr::null_mut()), INVALID);
    }
}

#[test]
fn options_init_fills_defaults() {
    let o = init_options(c"d");
    assert_eq!(
        o.struct_size as usize,
        std::mem::size_of::<GranarySessionOptions>()
    );
    assert_eq!(o.abi_version, GRANARY_ABI_VERSION);
    assert_eq!(o.seed, 0);
    assert_eq!(o.first_epoch, 0);
    assert_eq!(o.epoch_count, 1);
    assert_eq!(o.batch_size, granary::DEFAULT_BATCH_SIZE);
    assert_eq!((o.rank, o.world_size, o.drop_last), (0, 1, 0));
    assert_eq!((o.ready_capacity, o.release_capacity), (0, 0));
}

/// The options struct of a newer header: the v1 fields plus more.
#[repr(C)]
struct FutureOptions {
    v1: GranarySessionOptions,
    later: [u64; 4],
}

#[test]
fn struct_size_and_abi_version_are_checked() {
    let _w = watchdog("struct_size_and_abi_version_are_checked", WATCHDOG);
    let ds = Dataset::new("versions", 20).max_len(256);
    let fx = Fixture::start(vec![ds]);
    let client = connect(&fx);
    let mut s = ptr::null_mut();

    // A caller built against the header before the view fields (56 bytes):
    // what lies past its struct is never read, so it opens without a view.
    let mut o = init_options(c"versions");
    o.struct_size = 56;
    o.view = 8usize as *const u8; // would crash if it were read
    o.view_len = 1 << 20;
    // SAFETY: live client, readable options, valid out pointer.
    assert_eq!(unsafe { granary_session_open(client, &o, &mut s) }, 0);
    assert!(!s.is_null());
    let mut epoch = 0u64;
    // SAFETY: a live session from the open above.
    let rc = unsafe { granary_session_view(s, &mut epoch) };
    assert_eq!(rc, GranaryStatus::GranaryENotFound as i32);
    // SAFETY: closed once.
    assert_eq!(unsafe { granary_session_close(s) }, 0);
    s = ptr::null_mut();

    let mut o = init_options(c"versions");
    o.struct_size = 48;
    // SAFETY: live client, readable options, valid out pointer.
    let rc = unsafe { granary_session_open(client, &o, &mut s) };
    assert_eq!(rc, INVALID);
    assert!(last_error().contains("struct_size"), "{}", last_error());
    o.struct_size = 0;
    // SAFETY: as above.
    assert_eq!(unsafe { granary_session_open(client, &o, &mut s) }, INVALID);

    for abi in [0, GRANARY_ABI_VERSION + 1, u32::MAX] {
        let mut o = init_options(c"versions");
        o.abi_version = abi;
        // SAFETY: as above.
        let rc = unsafe { granary_session_open(client, &o, &mut s) };
        assert_eq!(rc, GranaryStatus::GranaryEVersion as i32);
        assert!(last_error().contains("abi_version"), "{}", last_error());
        assert!(s.is_null());
    }

    let mut o = init_options(c"versions");
    o.dataset = ptr::null();
    // SAFETY: as above.
    assert_eq!(unsafe { granary_session_open(client, &o, &mut s) }, INVALID);
    assert!(last_error().contains("dataset"), "{}", last_error());
    let bad_utf8 = [0xffu8, 0xfe, 0];
    o.dataset = bad_utf8.as_ptr().cast();
    // SAFETY: as above (a NUL-terminated byte string).
    assert_eq!(unsafe { granary_session_open(client, &o, &mut s) }, INVALID);

    // A larger struct from a newer header is accepted.
    let mut future = FutureOptions {
        v1: init_options(c"versions"),
        later: [7; 4],
    };
    future.v1.struct_size = std::mem::size_of::<FutureOptions>() as u32;
    let opts: *const GranarySessionOptions = ptr::addr_of!(future).cast();
    // SAFETY: the struct is readable for its whole (larger) struct_size.
    let rc = unsafe { granary_session_open(client, opts, &mut s) };
    assert_eq!(rc, OK, "{}", last_error());

    let mut info = GranarySessionInfo {
        struct_size: 8,
        ..Default::default()
    };
    // SAFETY: live session, writable info.
    assert_eq!(unsafe { granary_session_get_info(s, &mut info) }, INVALID);
    info.struct_size = std::mem::size_of::<GranarySessionInfo>() as u32;
    // SAFETY: as above.
    assert_eq!(unsafe { granary_session_get_info(s, &mut info) }, OK);
    assert_eq!(info.samples_per_epoch, 20);
    assert_eq!(info.batches_per_epoch, 1);
    assert!(info.arena_size >= 4096);
    assert!(info.session_id > 0);

    // SAFETY: live handles, each freed once.
    unsafe {
        assert_eq!(granary_session_close(s), OK);
        granary_client_free(client);
    }
}

#[test]
fn last_error_message_is_per_thread() {
    // SAFETY: NULL is rejected before use.
    assert_eq!(unsafe { granary_session_close(ptr::null_mut()) }, INVALID);
    assert!(last_error().contains("session is NULL"));
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "", "a fresh thread has no last error");
    assert!(last_error().contains("session is NULL"));
}

#[test]
fn a_whole_session_through_the_c_api() {
    let _w = watchdog("a_whole_session_through_the_c_api", WATCHDOG);
    let ds = Dataset::new("c-api", 150);
    let other = Dataset::new("c-api-gated", 30)
        .max_len(512)
        .with(Behaviour::Gated);
    let fx = Fixture::start(vec![ds.clone(), other]);
    let client = connect(&fx);

    let mut missing = ptr::null_mut();
    let o = init_options(c"no-such-dataset");
    // SAFETY: live client, options, out pointer.
    let rc = unsafe { granary_session_open(client, &o, &mut missing) };
    assert_eq!(rc, GranaryStatus::GranaryENotFound as i32);
    assert!(last_error().contains("no-such-dataset"), "{}", last_error());

    let mut o = init_options(c"c-api");
    o.batch_size = 16;
    o.epoch_count = 2;
    o.seed = 1234;
    let s = open(client, &o);
    let gated = open(client, &init_options(c"c-api-gated"));
    let mut arena_base: *const u8 = ptr::null();
    let mut arena_size = 0u64;
    // SAFETY: live session, writable out pointers; NULL outs are refused.
    unsafe {
        assert_eq!(
            granary_session_arena(s, ptr::null_mut(), &mut arena_size),
            INVALID
        );
        assert_eq!(
            granary_session_arena(s, &mut arena_base, ptr::null_mut()),
            INVALID
        );
        assert_eq!(
            granary_session_arena(s, &mut arena_base, &mut arena_size),
            OK
        );
    }
    assert!(!arena_base.is_null());
    let mut info = GranarySessionInfo {
        struct_size: std::mem::size_of::<GranarySessionInfo>() as u32,
        ..Default::default()
    };
    // SAFETY: live session, writable info.
    assert_eq!(unsafe { granary_session_get_info(s, &mut info) }, OK);
    assert_eq!(arena_size, info.arena_size);
    let arena = arena_base as usize..arena_base as usize + arena_size as usize;

    let mut batch = ptr::null_mut();
    // SAFETY: live session and out pointer.
    let rc = unsafe { granary_try_next_batch(gated, &mut batch) };
    assert_eq!(rc, GranaryStatus::GranaryEWouldBlock as i32);
    assert!(batch.is_null());

    let mut held = Vec::new();
    let mut batches = 0;
    for epoch in 0..2 {
        let plan = plan_epoch(150, 1234, epoch, 16, 0, 1, false);
        for (index, ids) in plan.iter().enumerate() {
            let mut b = ptr::null_mut();
            // SAFETY: live session and out pointer.
            let rc = unsafe { granary_next_batch(s, 10_000, &mut b) };
            assert_eq!(rc, OK, "{}", last_error());
            // SAFETY: `b` is a live batch handle until released below.
            unsafe {
                assert_eq!(granary_batch_status(b), OK);
                assert_eq!(granary_batch_epoch(b), epoch);
                assert_eq!(granary_batch_index(b), index as u64);
                assert_eq!(granary_batch_len(b), ids.len());
                let last = index + 1 == plan.len();
                assert_eq!(
                    granary_batch_flags(b) & GRANARY_BATCH_END_OF_EPOCH != 0,
                    last
                );
                // The last batch of the last epoch carries the end of stream.
                assert_eq!(
                    granary_batch_flags(b) & GRANARY_BATCH_END_OF_STREAM != 0,
                    last && epoch == 1
                );
                for (i, &id) in ids.iter().enumerate() {
                    let mut smp = std::mem::zeroed::<GranarySample>();
                    assert_eq!(granary_batch_sample(b, i, &mut smp), OK);
                    assert_eq!(smp.id, id);
                    assert_eq!(smp.label, sample_label(id));
                    assert_eq!(smp.status, 0);
                    assert_eq!(smp.length, u64::from(ds.len_of(id)));
                    // Zero copy: the bytes lie inside the arena mapping.
                    assert!(arena.contains(&(smp.data as usize)));
                    assert!(smp.data as usize + smp.length as usize <= arena.end);
                    let bytes = std::slice::from_raw_parts(smp.data, smp.length as usize);
                    assert!(bytes == ds.bytes_of(id), "content of sample {id}");
                    assert_eq!(crc32c::crc32c(bytes), smp.crc32c);
                }
                let mut smp = std::mem::zeroed::<GranarySample>();
                assert_eq!(granary_batch_sample(b, ids.len(), &mut smp), INVALID);
                assert_eq!(granary_batch_sample(b, 0, ptr::null_mut()), INVALID);
                // A batch of another session is refused without being touched.
                assert_eq!(granary_batch_release(gated, b), INVALID);
            }
            batches += 1;
            if batches % 5 == 0 && held.len() < 3 {
                held.push(b); // left for close to release
            } else {
                // SAFETY: live session and batch.
                assert_eq!(unsafe { granary_batch_release(s, b) }, OK);
                // Releasing twice is refused (the handle is gone and is not
                // dereferenced).
                // SAFETY: the stale pointer is only compared, never followed.
                assert_eq!(unsafe { granary_batch_release(s, b) }, INVALID);
            }
        }
    }
    let mut b = ptr::null_mut();
    // SAFETY: live session and out pointer.
    let rc = unsafe { granary_next_batch(s, GRANARY_WAIT_FOREVER, &mut b) };
    assert_eq!(rc, GranaryStatus::GranaryEEndOfStream as i32);
    assert!(b.is_null());
    assert_eq!(batches, 20);
    assert_eq!(held.len(), 3);

    // SAFETY: live handles, each freed once; `held` batches are released by close.
    unsafe {
        assert_eq!(granary_session_close(s), OK);
        assert_eq!(granary_session_close(gated), OK);
        granary_client_free(client);
    }
    assert!(fx.wait_finished(2, std::time::Duration::from_secs(10)));
    let st = fx.stats();
    assert_eq!(Stats::get(&st.violations), 0);
    // Every batch of the first session came back, the held ones included.
    assert_eq!(Stats::get(&st.releases), 21);
}

#[test]
fn per_batch_errors_come_with_the_batch() {
    let _w = watchdog("per_batch_errors_come_with_the_batch", WATCHDOG);
    let ds = Dataset::new("io", 24)
        .max_len(256)
        .with(Behaviour::IoErrorAt(1));
    let fx = Fixture::start(vec![ds]);
    let client = connect(&fx);
    let mut o = init_options(c"io");
    o.batch_size = 8;
    let s = open(client, &o);
    let mut codes = Vec::new();
    loop {
        let mut b = ptr::null_mut();
        // SAFETY: live session and out pointer.
        let rc = unsafe { granary_next_batch(s, 10_000, &mut b) };
        if rc == GranaryStatus::GranaryEEndOfStream as i32 {
            break;
        }
        assert!(!b.is_null(), "rc {rc}: {}", last_error());
        codes.push(rc);
        // SAFETY: live batch until released.
        unsafe {
            assert_eq!(granary_batch_status(b), rc);
            if rc != OK {
                assert!(last_error().contains("batch 1"), "{}", last_error());
                let mut smp = std::mem::zeroed::<GranarySample>();
                assert_eq!(granary_batch_sample(b, 0, &mut smp), OK);
                assert!(smp.data.is_null());
                assert_eq!(smp.length, 0);
                assert_eq!(smp.status, GranaryStatus::GranaryEIo as i32);
            }
            assert_eq!(granary_batch_release(s, b), OK);
        }
    }
    assert_eq!(codes, vec![OK, GranaryStatus::GranaryEIo as i32, OK]);
    // SAFETY: live handles, freed once.
    unsafe {
        assert_eq!(granary_session_close(s), OK);
        granary_client_free(client);
    }
}

#[test]
fn connect_failures() {
    let dir = tempfile::tempdir().unwrap();
    let path = CString::new(
        dir.path()
            .join("absent.sock")
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    let mut c = ptr::dangling_mut();
    // SAFETY: valid string and out pointer.
    let rc = unsafe { granary_connect(path.as_ptr(), &mut c) };
    assert_eq!(rc, GranaryStatus::GranaryEDisconnected as i32);
    assert!(c.is_null());
    assert!(last_error().contains("absent.sock"), "{}", last_error());
    // SAFETY: as above.
    assert_eq!(unsafe { granary_connect(c"".as_ptr(), &mut c) }, INVALID);
}

#[test]
fn views_encode_in_two_calls_and_refuse_bad_members() {
    let m = |id: &'static std::ffi::CStr, addr: &'static std::ffi::CStr| GranaryViewMember {
        id: id.as_ptr(),
        addr: addr.as_ptr(),
        capacity: 1 << 30,
    };
    // Every rank of a node lists its agent: repeats count once.
    let members = [
        m(c"n1", c"10.0.0.2:7170"),
        m(c"n0", c"10.0.0.1:7170"),
        m(c"n1", c"10.0.0.2:7170"),
    ];
    let mut len = 0usize;
    // SAFETY: valid strings and members, a NULL buffer of 0 bytes.
    let rc = unsafe {
        granary_view_encode(
            c"job".as_ptr(),
            3,
            members.as_ptr(),
            3,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(rc, GranaryStatus::GranaryENoMemory as i32);
    assert!(len > 16, "{len}");
    let mut buf = vec![0u8; len];
    // SAFETY: as above, with a buffer of `len` bytes.
    let rc = unsafe {
        granary_view_encode(
            c"job".as_ptr(),
            3,
            members.as_ptr(),
            3,
            buf.as_mut_ptr(),
            len,
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(len, buf.len());
    let same = granary::encode_view(
        "job",
        3,
        &[
            granary::ViewMember {
                id: "n0".into(),
                addr: "10.0.0.1:7170".into(),
                capacity: 1 << 30,
            },
            granary::ViewMember {
                id: "n1".into(),
                addr: "10.0.0.2:7170".into(),
                capacity: 1 << 30,
            },
        ],
    )
    .unwrap();
    assert_eq!(buf, same, "the C and Rust encodings differ");
    // One node with two addresses.
    let bad = [m(c"n0", c"10.0.0.1:7170"), m(c"n0", c"10.0.0.9:7170")];
    // SAFETY: as above.
    let rc = unsafe {
        granary_view_encode(
            c"job".as_ptr(),
            3,
            bad.as_ptr(),
            2,
            buf.as_mut_ptr(),
            len,
            &mut len,
        )
    };
    assert_eq!(rc, INVALID);
    assert!(last_error().contains("view"), "{}", last_error());
    // No members, or NULL ones.
    for count in [0, 2] {
        // SAFETY: as above; NULL members are refused before being read.
        let rc = unsafe {
            granary_view_encode(
                c"job".as_ptr(),
                3,
                ptr::null(),
                count,
                buf.as_mut_ptr(),
                len,
                &mut len,
            )
        };
        assert_eq!(rc, INVALID, "{count} NULL members");
    }
}

#[test]
fn session_state_through_the_c_api() {
    let _w = watchdog("session_state_through_the_c_api", WATCHDOG);
    let ds = Dataset::new("state", 100);
    let fx = Fixture::start(vec![ds]);
    let client = connect(&fx);
    let mut o = init_options(c"state");
    o.batch_size = 10;
    o.seed = 77;
    let s = open(client, &o);
    for _ in 0..3 {
        let mut batch = ptr::null_mut();
        // SAFETY: live session and out pointer; the batch is released at once.
        unsafe {
            assert!(granary_next_batch(s, -1, &mut batch) >= 0);
            assert_eq!(granary_batch_release(s, batch), OK);
        }
    }
    let mut len = 0usize;
    // SAFETY: live session; NULL buffer asks for the length; NULL len is
    // refused; a short buffer is refused with the length written.
    unsafe {
        assert_eq!(
            granary_session_state(s, ptr::null_mut(), 0, ptr::null_mut()),
            INVALID
        );
        assert_eq!(granary_session_state(s, ptr::null_mut(), 0, &mut len), OK);
    }
    assert!(len > 0 && len <= GRANARY_STATE_MAX, "{len}");
    let mut small = vec![0u8; len - 1];
    let mut got = 0usize;
    // SAFETY: `small` is writable for its length.
    let rc = unsafe { granary_session_state(s, small.as_mut_ptr(), small.len(), &mut got) };
    assert_eq!((rc, got), (INVALID, len));
    assert!(last_error().contains("state takes"), "{}", last_error());
    let mut buf = vec![0u8; GRANARY_STATE_MAX];
    // SAFETY: `buf` is writable for its length.
    let rc = unsafe { granary_session_state(s, buf.as_mut_ptr(), buf.len(), &mut got) };
    assert_eq!(rc, OK);
    let state = granary::SessionState::from_bytes(&buf[..got]).expect("a state");
    assert_eq!(state.options.first_batch, 3, "three batches handed out");
    assert_eq!((state.options.seed, state.options.batch_size), (77, 10));
    // Opened from the state with no dataset named: batch 3 comes next.
    let mut r = init_options(c"ignored");
    r.dataset = ptr::null();
    r.resume_state = buf.as_ptr();
    r.resume_state_len = got;
    let resumed = open(client, &r);
    let mut batch = ptr::null_mut();
    // SAFETY: live session and out pointer.
    unsafe {
        assert!(granary_next_batch(resumed, -1, &mut batch) >= 0);
        assert_eq!(granary_batch_index(batch), 3);
        assert_eq!(granary_batch_release(resumed, batch), OK);
    }
    // Changed bytes are refused before anything is sent.
    buf[12] ^= 1;
    let mut bad = ptr::null_mut();
    // SAFETY: live client, options pointing at `buf`, out pointer.
    let rc = unsafe { granary_session_open(client, &r, &mut bad) };
    assert_eq!(rc, INVALID);
    assert!(last_error().contains("checksum"), "{}", last_error());
    // SAFETY: live handles, closed once.
    unsafe {
        assert_eq!(granary_session_close(resumed), OK);
        assert_eq!(granary_session_close(s), OK);
        granary_client_free(client);
    }
}
