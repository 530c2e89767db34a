//! Tests of the S3 source that need no S3 server: settings, error
//! classification, manifests, and the fetcher against a tiny scripted HTTP
//! server on loopback. The tests against a real server are in
//! `agent/tests/s3_*.rs`.

use super::catalog::parse_manifest;
use super::*;
use crate::testutil::Mem;
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[test]
fn env_fills_only_what_is_unset() {
    let env: HashMap<&str, &str> = [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
        ("AWS_REGION", "eu-west-3"),
        ("AWS_ACCESS_KEY_ID", "envkey"),
        ("AWS_SECRET_ACCESS_KEY", "envsecret"),
    ]
    .into_iter()
    .collect();
    let look = |k: &str| env.get(k).map(|v| v.to_string());
    let mut s = S3Settings::new("b");
    s.fill_from_env(look);
    assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert_eq!(s.region.as_deref(), Some("eu-west-3"));
    assert_eq!(s.access_key_id.as_deref(), Some("envkey"));
    assert_eq!(s.secret_access_key.as_deref(), Some("envsecret"));

    let mut s = S3Settings::new("b");
    s.endpoint = Some("https://s3.example".into());
    s.access_key_id = Some("cfgkey".into());
    s.fill_from_env(look);
    assert_eq!(s.endpoint.as_deref(), Some("https://s3.example"));
    // A configured key is never paired with the environment's secret.
    assert_eq!(s.access_key_id.as_deref(), Some("cfgkey"));
    assert_eq!(s.secret_access_key, None);

    let mut s = S3Settings::new("b");
    s.fill_from_env(|k| (k == "AWS_DEFAULT_REGION").then(|| "ap-south-1".to_owned()));
    assert_eq!(s.region.as_deref(), Some("ap-south-1"));
}

#[test]
fn settings_are_checked_before_any_request() {
    let err = |s: &S3Settings| s.build_store().map(|_| ()).unwrap_err().to_string();
    let mut s = S3Settings::new("b");
    assert!(err(&s).contains("no S3 credentials"), "{}", err(&s));
    s.access_key_id = Some("k".into());
    assert!(err(&s).contains("without a secret"), "{}", err(&s));
    s.secret_access_key = Some("very-secret".into());
    s.endpoint = Some("http://127.0.0.1:1".into());
    assert!(err(&s).contains("allow_http"), "{}", err(&s));
    s.endpoint = Some("ftp://x".into());
    assert!(err(&s).contains("not an http"), "{}", err(&s));
    s.endpoint = Some("http://127.0.0.1:1".into());
    s.allow_http = true;
    s.build_store().unwrap();
    s.bucket = "a/b".into();
    assert!(err(&s).contains("bucket name"), "{}", err(&s));
    let dbg = format!("{s:?}");
    assert!(
        !dbg.contains("very-secret") && dbg.contains("redacted"),
        "{dbg}"
    );
}

#[test]
fn statuses_are_found_in_messages() {
    assert_eq!(
        status_in("Error performing GET http://x in 2ms - Server returned non-2xx status code: 503 Service Unavailable: busy"),
        Some(503)
    );
    assert_eq!(status_in("status code: 4x"), None);
    assert_eq!(status_in("nothing"), None);
}

#[test]
fn errors_are_classified() {
    let generic = |src: Box<dyn std::error::Error + Send + Sync>| object_store::Error::Generic {
        store: "S3",
        source: src,
    };
    let http = |k| generic(Box::new(HttpError::new(k, io::Error::other("x"))));
    for (kind, retry) in [
        (HttpErrorKind::Connect, true),
        (HttpErrorKind::Request, true),
        (HttpErrorKind::Interrupted, true),
        (HttpErrorKind::Timeout, true),
        (HttpErrorKind::Decode, false),
    ] {
        assert_eq!(classify(&http(kind)).retryable, retry, "{kind:?}");
    }
    assert_eq!(
        classify(&http(HttpErrorKind::Timeout)).kind,
        io::ErrorKind::TimedOut
    );
    let nf = object_store::Error::NotFound {
        path: "k".into(),
        source: Box::new(io::Error::other("404")),
    };
    let f = classify(&nf);
    assert!(!f.retryable);
    assert_eq!(f.kind, io::ErrorKind::NotFound);
    let denied = object_store::Error::PermissionDenied {
        path: "k".into(),
        source: Box::new(io::Error::other("403")),
    };
    assert!(!classify(&denied).retryable);
    let reset = generic(Box::new(io::Error::from(io::ErrorKind::ConnectionReset)));
    assert!(classify(&reset).retryable);
    let other = generic(Box::new(io::Error::other("weird")));
    assert!(!classify(&other).retryable);
}

#[test]
fn manifests_parse_with_line_numbers() {
    let text = b"# header\n\na/x.bin\t3\r\n/abs/y.bin\t-1\t100\t20\n  # note\nz.bin\t7\n";
    let lines = parse_manifest("m", text, "data/set").unwrap();
    let got: Vec<_> = lines
        .iter()
        .map(|l| (l.line, l.key.as_str(), l.label, l.range))
        .collect();
    assert_eq!(
        got,
        [
            (3, "data/set/a/x.bin", 3, None),
            (4, "abs/y.bin", -1, Some((100, 20))),
            (6, "data/set/z.bin", 7, None),
        ]
    );
    let err = |t: &[u8]| {
        parse_manifest("s3://b/m.tsv", t, "")
            .unwrap_err()
            .to_string()
    };
    let e = err(b"a\t1\nnotab\n");
    assert!(
        e.contains("s3://b/m.tsv:2:") && e.contains("1 field"),
        "{e}"
    );
    let e = err(b"a\tcat\n");
    assert!(e.contains(":1:") && e.contains("32-bit"), "{e}");
    let e = err(b"a\t1\t5\n");
    assert!(e.contains("3 field"), "{e}");
    let e = err(b"a\t1\tx\t5\n");
    assert!(e.contains("offset"), "{e}");
    let e = err(b"a\t1\t0\t99999999999\n");
    assert!(e.contains("4 GiB"), "{e}");
    let e = err(b"\t1\n");
    assert!(e.contains("empty key"), "{e}");
    let e = err(b"ok\t1\n\xff\t2\n");
    assert!(e.contains(":2:") && e.contains("UTF-8"), "{e}");
}

#[test]
fn dataset_config_maps_to_settings_and_layout() {
    use crate::config::Config;
    let cfg = Config::from_toml_str(
        "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:8333\"\nallow_http = true\n\
         bucket = \"bkt\"\nprefix = \"train\"\naccess_key_id = \"k\"\nsecret_access_key = \"s\"\n\
         request_timeout_ms = 1500\nretries = 3\n\
         [[dataset]]\nname = \"m\"\nkind = \"s3\"\nbucket = \"bkt\"\nmanifest = \"file:///tmp/m.tsv\"\n\
         [[dataset]]\nname = \"o\"\nkind = \"s3\"\nbucket = \"bkt\"\nmanifest = \"idx/train.tsv\"\npath_style = false\n",
    )
    .unwrap();
    let s = S3Settings::from_dataset(&cfg.datasets[0]).unwrap();
    assert_eq!(s.bucket, "bkt");
    assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
    assert!(s.allow_http && s.path_style);
    assert_eq!(s.request_timeout, Duration::from_millis(1500));
    assert_eq!(s.retries, 3);
    assert_eq!(s.access_key_id.as_deref(), Some("k"));
    assert_eq!(
        S3Layout::from_dataset(&cfg.datasets[0]).unwrap(),
        S3Layout::Prefix("train".into())
    );
    assert_eq!(
        S3Layout::from_dataset(&cfg.datasets[1]).unwrap(),
        S3Layout::ManifestFile("/tmp/m.tsv".into())
    );
    assert_eq!(
        S3Layout::from_dataset(&cfg.datasets[2]).unwrap(),
        S3Layout::ManifestObject("idx/train.tsv".into())
    );
    assert!(
        !S3Settings::from_dataset(&cfg.datasets[2])
            .unwrap()
            .path_style
    );
    let e = crate::source::open_catalog(&cfg.datasets[0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a filesystem dataset"), "{e}");
}

// ---------------------------------------------------------------------------
// A scripted HTTP/1.1 server: every request is answered by `respond`, which
// sees the request path and how many requests came before.

struct Reply {
    status: u16,
    body: Vec<u8>,
    /// Content-Length to announce (default: the body's length).
    announce: Option<usize>,
    delay: Duration,
    /// An `ETag` header to send.
    etag: Option<&'static str>,
}

impl Reply {
    fn ok(body: Vec<u8>) -> Reply {
        Reply {
            status: 200,
            body,
            announce: None,
            delay: Duration::ZERO,
            etag: None,
        }
    }
    fn status(status: u16) -> Reply {
        Reply {
            status,
            body: b"<Error><Code>X</Code></Error>".to_vec(),
            announce: None,
            delay: Duration::ZERO,
            etag: None,
        }
    }
}

type Script = dyn Fn(&str, &str, u32) -> Reply + Send + Sync;

struct Scripted {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn scripted(respond: impl Fn(&str, &str, u32) -> Reply + Send + Sync + 'static) -> Scripted {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let respond: Arc<Script> = Arc::new(respond);
    let count = Arc::new(AtomicU32::new(0));
    let (stop2, seen2) = (stop.clone(), seen.clone());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            if stop2.load(Ordering::Relaxed) {
                return;
            }
            let Ok(mut conn) = conn else { continue };
            let (respond, count, seen) = (respond.clone(), count.clone(), seen2.clone());
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match conn.read(&mut tmp) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let mut parts = head.split_whitespace();
                    let method = parts.next().unwrap_or("").to_owned();
                    let path = parts.next().unwrap_or("").to_owned();
                    let range = head
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("range:"))
                        .map(|l| l[6..].trim().to_owned())
                        .unwrap_or_default();
                    let if_match = head
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("if-match:"))
                        .map(|l| format!(" if-match={}", l[9..].trim()))
                        .unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .push(format!("{method} {path}{if_match} {range}"));
                    let n = count.fetch_add(1, Ordering::Relaxed);
                    let r = respond(&path, &range, n);
                    std::thread::sleep(r.delay);
                    let len = r.announce.unwrap_or(r.body.len());
                    let reason = if r.status < 300 { "OK" } else { "Error" };
                    let mut out = format!(
                        "HTTP/1.1 {} {reason}\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\n",
                        r.status
                    );
                    if let Some(etag) = r.etag {
                        out.push_str(&format!("ETag: {etag}\r\n"));
                    }
                    if r.status == 206 {
                        out.push_str(
                            &format!("Content-Range: bytes {range}/1000000\r\n")
                                .replace("bytes=", ""),
                        );
                    }
                    out.push_str("\r\n");
                    let mut bytes = out.into_bytes();
                    bytes.extend_from_slice(&r.body);
                    if conn.write_all(&bytes).is_err() || r.announce.is_some() {
                        // A short body: close so the client sees it end early.
                        return;
                    }
                }
            });
        }
    });
    Scripted { addr, stop, seen }
}

fn source_for(server: &Scripted, retries: u32, timeout: Duration) -> S3Source {
    let mut s = S3Settings::new("bkt");
    s.endpoint = Some(format!("http://{}", server.addr));
    s.allow_http = true;
    s.access_key_id = Some("k".into());
    s.secret_access_key = Some("s".into());
    s.request_timeout = timeout;
    s.retries = retries;
    S3Source::connect(&s, 64).unwrap()
}

/// Submits one request and waits for its completion.
fn fetch_one(f: &mut S3Fetcher, req: FetchRequest) -> io::Result<u32> {
    f.submit(req).unwrap();
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no completion");
        f.poll_completions(Some(Duration::from_secs(1)), &mut out)
            .unwrap();
    }
    assert_eq!(f.in_flight(), 0);
    out.pop().unwrap().result
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn fetcher_makes_one_attempt_per_request_and_streams_into_dest() {
    let server = scripted(|_, _, n| {
        if n < 2 {
            Reply::status(503)
        } else {
            Reply::ok(body(5000))
        }
    });
    let src = source_for(&server, 3, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(5000);
    // The settings' retries are the ingest's: the fetcher makes one attempt
    // per request, and says whether another may succeed.
    for tag in 1..=2 {
        let e =
            fetch_one(&mut f, FetchRequest::whole(tag, "a/b.bin", 5000, buf.all())).unwrap_err();
        assert!(is_retryable(&e), "{e}");
        assert_eq!(fetch_error(&e).unwrap().attempts, 1);
    }
    let r = fetch_one(&mut f, FetchRequest::whole(3, "a/b.bin", 5000, buf.all()));
    assert_eq!(r.unwrap(), 5000);
    assert_eq!(buf.bytes(), body(5000));
    let st = f.stats();
    assert_eq!(
        (st.requests, st.attempts, st.failures, st.bytes),
        (3, 3, 2, 5000)
    );
    assert!(server.seen.lock().unwrap()[0].starts_with("GET /bkt/a/b.bin"));
}

#[test]
fn a_failing_fetch_reports_one_attempt_and_a_retryable_error() {
    let server = scripted(|_, _, _| Reply::status(500));
    let src = source_for(&server, 2, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(10);
    let e = fetch_one(&mut f, FetchRequest::whole(1, "k.bin", 10, buf.all())).unwrap_err();
    assert!(is_retryable(&e), "{e}");
    let fe = fetch_error(&e).unwrap();
    assert_eq!((fe.attempts, fe.target.as_str()), (1, "GET k.bin"));
    assert_eq!(server.seen.lock().unwrap().len(), 1, "one GET");
    assert!(e.to_string().contains("HTTP 500"), "{e}");
}

#[test]
fn fetcher_fails_404_at_once_naming_the_key() {
    let server = scripted(|_, _, _| Reply::status(404));
    let src = source_for(&server, 5, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(10);
    let e = fetch_one(&mut f, FetchRequest::whole(9, "gone/x.bin", 10, buf.all())).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(!is_retryable(&e));
    assert!(e.to_string().contains("gone/x.bin"), "{e}");
    assert_eq!(f.stats().attempts, 1);
    let server = scripted(|_, _, _| Reply::status(403));
    let src = source_for(&server, 5, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let e = fetch_one(&mut f, FetchRequest::whole(9, "x.bin", 10, buf.all())).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(!is_retryable(&e));
}

#[test]
fn fetcher_reports_length_mismatches() {
    let server = scripted(|path, _, _| {
        if path.contains("short") {
            // Announces 100 bytes, sends 40 and hangs up: retryable, then fails.
            Reply {
                announce: Some(100),
                ..Reply::ok(body(40))
            }
        } else {
            Reply::ok(body(120))
        }
    });
    let src = source_for(&server, 1, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(100);
    let e = fetch_one(&mut f, FetchRequest::whole(1, "big.bin", 100, buf.all())).unwrap_err();
    let changed = crate::source::queue::changed(&e).expect("a Changed error");
    assert!(changed.size_differs, "{e}");
    assert!(
        e.to_string().contains("big.bin") && e.to_string().contains("size 120 (catalogued 100)"),
        "{e}"
    );
    assert_eq!(
        crate::source::SampleError::from_io(&e).kind,
        crate::source::FailureKind::Short
    );
    assert!(!is_retryable(&e));
    let e = fetch_one(&mut f, FetchRequest::whole(2, "short.bin", 100, buf.all())).unwrap_err();
    assert!(is_retryable(&e), "{e}");
    assert!(e.to_string().contains("short.bin"), "{e}");
}

#[test]
fn fetcher_requires_the_catalogued_etag() {
    use crate::source::{queue, FailureKind, SampleError};
    // `v1.bin` is still the catalogued version; `v2.bin` was replaced and the
    // server honours If-Match (412); `lax.bin` was replaced and the server
    // ignores If-Match, so only the response's ETag tells.
    let server = scripted(|path, _, _| {
        if path.contains("v2") {
            Reply::status(412)
        } else if path.contains("lax") {
            Reply {
                etag: Some("\"new\""),
                ..Reply::ok(body(50))
            }
        } else {
            Reply {
                etag: Some("\"old\""),
                ..Reply::ok(body(50))
            }
        }
    });
    let src = source_for(&server, 1, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(50);
    let with_etag = |tag, key: &str| FetchRequest {
        etag: Some(Arc::from("\"old\"")),
        ..FetchRequest::whole(tag, key.to_owned(), 50, buf.all())
    };
    assert_eq!(fetch_one(&mut f, with_etag(1, "v1.bin")).unwrap(), 50);
    assert!(buf.bytes() == body(50));
    for key in ["v2.bin", "lax.bin"] {
        let e = fetch_one(&mut f, with_etag(2, key)).unwrap_err();
        let changed = queue::changed(&e).unwrap_or_else(|| panic!("{key}: not Changed: {e}"));
        assert!(!changed.size_differs, "{e}");
        assert!(e.to_string().contains(key), "{e}");
        assert_eq!(SampleError::from_io(&e).kind, FailureKind::Corrupt, "{e}");
        assert!(!is_retryable(&e));
    }
    assert_eq!(
        server.seen.lock().unwrap().len(),
        3,
        "a changed object is not fetched again"
    );
    let seen = server.seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|l| l.contains("if-match=\"old\"")),
        "every GET carries If-Match: {seen:?}"
    );
}

#[test]
fn fetcher_sends_ranged_gets() {
    let server = scripted(|_, range, _| {
        // "bytes=100-149"
        let r = range.trim_start_matches("bytes=");
        let (a, b) = r.split_once('-').unwrap();
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        Reply {
            status: 206,
            ..Reply::ok(body(200)[a..=b].to_vec())
        }
    });
    let src = source_for(&server, 0, Duration::from_secs(5));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(50);
    let n = fetch_one(
        &mut f,
        FetchRequest::range(1, "pack.bin", 100, 50, buf.all()),
    )
    .unwrap();
    assert_eq!(n, 50);
    assert_eq!(buf.bytes(), body(200)[100..150]);
    assert!(server.seen.lock().unwrap()[0].ends_with("bytes=100-149"));
}

#[test]
fn fetcher_times_out_and_many_fly_at_once() {
    let server = scripted(|path, _, _| Reply {
        delay: if path.contains("slow") {
            Duration::from_millis(800)
        } else {
            Duration::from_millis(100)
        },
        ..Reply::ok(body(64))
    });
    let src = source_for(&server, 0, Duration::from_millis(300));
    let mut f = src.fetcher().unwrap();
    let buf = Mem::zeroed(64);
    let e = fetch_one(&mut f, FetchRequest::whole(1, "slow.bin", 64, buf.all())).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(is_retryable(&e));
    assert_eq!(f.stats().timeouts, 1);

    // 48 requests of 100 ms each, all in flight: well under 48 × 100 ms.
    let bufs: Vec<Mem> = (0..48).map(|_| Mem::zeroed(64)).collect();
    let t0 = Instant::now();
    for (i, b) in bufs.iter().enumerate() {
        let req = FetchRequest::whole(i as u64, format!("f{i}.bin").as_str(), 64, b.all());
        f.submit(req).unwrap();
    }
    assert_eq!(f.in_flight(), 48);
    let mut out = Vec::new();
    while out.len() < 48 {
        f.poll_completions(Some(Duration::from_secs(1)), &mut out)
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    let elapsed = t0.elapsed();
    assert!(out.iter().all(|c| c.result.is_ok()));
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    assert!(bufs.iter().all(|b| b.bytes() == body(64)));
}

#[test]
fn submit_beyond_capacity_is_refused_and_eventfd_wakes() {
    let server = scripted(|_, _, _| Reply {
        delay: Duration::from_millis(50),
        ..Reply::ok(body(8))
    });
    let src = source_for(&server, 0, Duration::from_secs(5));
    let mut f = src
        .fetcher_with(FetchOptions {
            capacity: 2,
            ..src.options().clone()
        })
        .unwrap();
    let (a, b, c) = (Mem::zeroed(8), Mem::zeroed(8), Mem::zeroed(8));
    f.submit(FetchRequest::whole(1, "a", 8, a.all())).unwrap();
    f.submit(FetchRequest::whole(2, "b", 8, b.all())).unwrap();
    let full = f
        .submit(FetchRequest::whole(3, "c", 8, c.all()))
        .unwrap_err();
    assert_eq!(full.0.tag, 3);
    // The eventfd becomes readable once something completes.
    let t = Instant::now();
    crate::sys::eventfd::wait_readable(f.wake_fd(), Duration::from_secs(5)).expect("wait");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let mut out = Vec::new();
    while out.len() < 2 {
        f.poll_completions(Some(Duration::from_secs(1)), &mut out)
            .unwrap();
    }
    let mut tags: Vec<_> = out.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, [1, 2]);
    // Nothing in flight: no wait.
    let t0 = Instant::now();
    assert_eq!(
        f.poll_completions(Some(Duration::from_secs(5)), &mut out)
            .unwrap(),
        0
    );
    assert!(t0.elapsed() < Duration::from_millis(100));
    // A destination shorter than the length fails at once.
    let d = Mem::zeroed(4);
    f.submit(FetchRequest::whole(4, "d", 8, d.all())).unwrap();
    out.clear();
    f.poll_completions(None, &mut out).unwrap();
    assert_eq!(
        out[0].result.as_ref().unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[test]
fn dropping_a_busy_fetcher_cancels_and_returns() {
    let server = scripted(|_, _, _| Reply {
        delay: Duration::from_secs(3),
        ..Reply::ok(body(8))
    });
    let src = source_for(&server, 0, Duration::from_secs(20));
    let mut f = src.fetcher().unwrap();
    let bufs: Vec<Mem> = (0..8).map(|_| Mem::zeroed(8)).collect();
    for (i, b) in bufs.iter().enumerate() {
        f.submit(FetchRequest::whole(i as u64, "x", 8, b.all()))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    drop(f);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(bufs.iter().all(|b| b.bytes() == [0u8; 8]));
}

/// The shard-index cache over an in-memory store: a second index walks
/// nothing, a shard put again (a new ETag) is walked again alone, damaged
/// cache files and other walk settings are walked, the catalog the same.
#[test]
fn shard_indexes_are_kept_by_etag_and_walked_again_when_a_shard_changes() {
    use super::index_cache::ShardIndexCache;
    use super::shards::{index_dataset, IndexCacheUse, ShardLayout};
    use crate::config::ShardFormat;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    let mem = Arc::new(InMemory::new());
    let source = S3Source::with_store(mem.clone(), "b", FetchOptions::default()).unwrap();
    let files: [&[u8]; 2] = [
        include_bytes!("../shards/arrow/testdata/hf/data-00000-of-00002.arrow"),
        include_bytes!("../shards/arrow/testdata/hf/data-00001-of-00002.arrow"),
    ];
    let put = |i: usize| {
        let key = object_store::path::Path::from(format!("hf/data-0000{i}-of-00002.arrow"));
        source
            .block_on(mem.put(&key, files[i].to_vec().into()))
            .unwrap();
    };
    put(0);
    put(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = ShardIndexCache::open(dir.path()).unwrap();
    let bucket = Bucket::s3("b");
    let index = |sample_field: &str| {
        let use_ = IndexCacheUse {
            cache: &cache,
            store: "memory",
        };
        let layout = ShardLayout {
            prefix: "hf".into(),
            format: ShardFormat::Arrow,
            label_field: "label".into(),
            sample_field: sample_field.into(),
            wids_index: None,
        };
        let (catalog, stats) = source
            .block_on(index_dataset(&*mem, &bucket, &layout, Some(use_)))
            .unwrap();
        let rows: Vec<(String, u64, u64, i32)> = catalog
            .entries()
            .iter()
            .map(|e| (e.key.to_string(), e.offset, e.size, e.label))
            .collect();
        (rows, stats)
    };
    let (first, s) = index("image");
    assert_eq!(first.len(), 50);
    assert!(s.cached == 0 && s.reads > 0, "{s:?}");
    let (again, s) = index("image");
    assert_eq!(again, first);
    assert_eq!(
        (s.cached, s.reads, s.shards),
        (2, 0, 2),
        "nothing walked: {s:?}"
    );
    assert!(
        s.to_string()
            .contains("2 shards from the shard-index cache"),
        "{s}"
    );
    put(1); // the same bytes, a new ETag
    let (changed, s) = index("image");
    assert_eq!(changed, first);
    assert!(
        s.cached == 1 && s.reads > 0,
        "the changed shard walked alone: {s:?}"
    );
    for f in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::write(f.unwrap().path(), b"GRNSHIX1 damaged").unwrap();
    }
    let (damaged, s) = index("image");
    assert_eq!(damaged, first);
    assert_eq!(s.cached, 0, "damaged files are walked again: {s:?}");
    let (other, s) = index("image.bytes");
    assert_eq!(other, first, "image stands for image.bytes");
    assert_eq!(s.cached, 0, "other walk settings, other keys: {s:?}");
}

#[test]
fn a_wids_index_in_the_prefix_gives_the_shards_and_their_order() {
    use super::shards::{index_dataset, ShardLayout};
    use crate::config::ShardFormat;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    let mem = Arc::new(InMemory::new());
    let source = S3Source::with_store(mem.clone(), "b", FetchOptions::default()).unwrap();
    let put = |key: &str, bytes: Vec<u8>| {
        let key = object_store::path::Path::from(key);
        source.block_on(mem.put(&key, bytes.into())).unwrap();
    };
    for name in ["a-shard.tar", "b-shard.tar", "c-shard.tar"] {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/source/shards/wids/testdata")
            .join(name);
        put(&format!("wds/{name}"), std::fs::read(data).unwrap());
    }
    let bucket = Bucket::s3("b");
    let index = |wids: Option<(&str, bool)>| {
        let layout = ShardLayout {
            prefix: "wds".into(),
            format: ShardFormat::Webdataset,
            label_field: "cls".into(),
            sample_field: "sample".into(),
            wids_index: wids.map(|(n, r)| (n.to_owned(), r)),
        };
        source
            .block_on(index_dataset(&*mem, &bucket, &layout, None))
            .map(|(catalog, _)| {
                catalog
                    .entries()
                    .iter()
                    .map(|e| (e.key.filename().unwrap().to_owned(), e.label))
                    .collect::<Vec<_>>()
            })
            .map_err(|e| e.to_string())
    };
    let default = Some(("shardindex.json", false));
    let listed = index(default).unwrap();
    assert_eq!(listed.len(), 12, "no index: every .tar object");
    // Relative, by key, by absolute path: in the index's order.
    put(
        "wds/shardindex.json",
        br#"{"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [
            {"url": "c-shard.tar", "nsamples": 4, "filesize": 10240},
            {"url": "s3://b/wds/a-shard.tar", "nsamples": 5},
            {"url": "/wds/b-shard.tar", "nsamples": 3}]}"#
            .to_vec(),
    );
    let got = index(default).unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..4], ["c-shard.tar"; 4]);
    assert_eq!(&names[4..9], ["a-shard.tar"; 5]);
    assert_eq!(got[4].1, 20, "a-shard's first label");
    assert_eq!(got.len(), 12);
    assert_eq!(
        index(None).unwrap(),
        listed,
        "wids_index = \"\": the listing"
    );
    let e = index(Some(("train.json", true))).unwrap_err();
    assert!(
        e.contains("s3://b/wds/train.json") && e.contains("not in the bucket"),
        "{e}"
    );
    put(
        "wds/shardindex.json",
        br#"{"wids_version": 1, "shardlist": [{"url": "b-shard.tar", "nsamples": 2}]}"#.to_vec(),
    );
    let e = index(default).unwrap_err();
    assert!(
        e.contains("s3://b/wds/b-shard.tar") && e.contains("says 2 samples, the shard holds 3"),
        "{e}"
    );
    put(
        "wds/shardindex.json",
        br#"{"wids_version": 1, "shardlist": [{"url": "gone.tar", "nsamples": 2}]}"#.to_vec(),
    );
    let e = index(default).unwrap_err();
    assert!(
        e.contains("gone.tar") && e.contains("not in the bucket"),
        "{e}"
    );
}
