//! A light S3-compatible store: one local directory served as one bucket
//! over HTTP/1.1 on 127.0.0.1, with so little CPU per request that the
//! clients, not the store, are the bottleneck of an S3 benchmark.
//!
//! SeaweedFS (see [`crate::seaweed`]) takes more than a core of a 2-core
//! machine at the rates the S3 benchmarks reach, and then caps every client
//! alike; this store lets `bench/run latency --store light` compare the
//! clients' own latency hiding and CPU cost.
//!
//! What it serves (path-style addressing, `/{bucket}/{key}`):
//!
//! * `GET` of an object, whole or one `Range: bytes=a-b` (`a-`, `-n` too;
//!   `206` with `Content-Range`, `416` past the end), with `ETag`,
//!   `Last-Modified`, `Content-Length` and `Accept-Ranges` headers;
//!   `If-Match` is answered with `412 PreconditionFailed` when it names
//!   another entity tag, `If-None-Match` with `304` when it names this one;
//! * `HEAD` of an object, the same headers without the body;
//! * `GET /{bucket}?list-type=2` (ListObjectsV2) with `prefix`,
//!   `delimiter`, `max-keys` (at most 1,000), `continuation-token`,
//!   `start-after` and `encoding-type=url`, in the XML that object_store
//!   and boto3 parse;
//! * anything else (writes included) is refused with an S3 XML error: the
//!   store is read-only.
//!
//! **Signatures are accepted without checking**: any credentials, or none,
//! are served. It is a benchmark fixture on loopback, not a server for
//! untrusted clients.
//!
//! The keys are the directory's files (walked once at start; symbolic links
//! are not followed, hidden files such as a synthetic dataset's marker are
//! left out), relative paths with `/`, under an optional key
//! prefix. Entity tags are `"<size>-<mtime ns>"` in hex, computed at start.
//! A request costs one `open` and one `pread` of the bytes asked for, on
//! the store's own tokio worker threads (named [`THREAD_NAME`], so that a
//! benchmark can read their CPU time): the bytes come from the page cache,
//! and nothing else is parsed, hashed or copied per request. HTTP is
//! hyper's HTTP/1.1 server (keep-alive, pipelining); nothing here parses
//! HTTP by hand.

use crate::local_s3::Credentials;
use bytes::Bytes;
use granary_agent::source::s3::S3Settings;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The name of the store's threads (`/proc/*/task/*/comm`).
pub const THREAD_NAME: &str = "light-store";
/// The light store's credentials and region, for clients: placeholder keys
/// for clients that insist on signing, and the region they sign for.
const CREDENTIALS: Credentials = Credentials {
    access_key: "light-store",
    secret_key: "light-store-secret",
    region: "us-east-1",
};
/// The most keys one ListObjectsV2 page returns (S3's limit).
const MAX_KEYS: usize = 1000;

/// One object.
#[derive(Debug, Clone)]
struct Object {
    key: String,
    path: PathBuf,
    size: u64,
    /// Quoted, as sent in the `ETag` header.
    etag: String,
    /// Seconds since the epoch.
    mtime: u64,
}

/// The bucket: its objects, sorted by key.
#[derive(Debug)]
struct Bucket {
    name: String,
    objects: Vec<Object>,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Bucket {
    fn find(&self, key: &str) -> Option<&Object> {
        self.objects
            .binary_search_by(|o| o.key.as_str().cmp(key))
            .ok()
            .map(|i| &self.objects[i])
    }
}

/// A running store; stopped (its threads joined, its port closed) on drop.
#[derive(Debug)]
pub struct LightStore {
    addr: SocketAddr,
    bucket: Arc<Bucket>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl LightStore {
    /// Serves the files under `root` as bucket `bucket`, each under key
    /// `prefix/relative/path` (`relative/path` when `prefix` is empty), on
    /// a free port of 127.0.0.1, with `threads` worker threads.
    pub fn start(
        root: &Path,
        bucket: &str,
        prefix: &str,
        threads: usize,
    ) -> io::Result<LightStore> {
        LightStore::start_mounts(&[(root, prefix)], bucket, threads)
    }

    /// Serves several folders as one bucket: the files under each
    /// `(root, prefix)` under keys `prefix/relative/path`. Two files with
    /// one key are refused.
    pub fn start_mounts(
        mounts: &[(&Path, &str)],
        bucket: &str,
        threads: usize,
    ) -> io::Result<LightStore> {
        if bucket.is_empty() || bucket.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bucket name {bucket:?}: empty or with a '/'"),
            ));
        }
        let mut objects = Vec::new();
        for (root, prefix) in mounts {
            walk(root, prefix.trim_matches('/'), &mut objects)?;
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        if let Some(w) = objects.windows(2).find(|w| w[0].key == w[1].key) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "key {:?} is both {} and {}",
                    w[0].key,
                    w[0].path.display(),
                    w[1].path.display()
                ),
            ));
        }
        let bucket = Arc::new(Bucket {
            name: bucket.to_owned(),
            objects,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(THREAD_NAME)
            .enable_io()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))?;
        let addr = listener.local_addr()?;
        let b = Arc::clone(&bucket);
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors or the like: try again shortly.
                    tokio::task::yield_now().await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let b = Arc::clone(&b);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let b = Arc::clone(&b);
                        async move { Ok::<_, std::convert::Infallible>(handle(&b, &req)) }
                    });
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .pipeline_flush(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(LightStore {
            addr,
            bucket,
            runtime: Some(runtime),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket.name
    }

    /// Client settings for the bucket through `addr` (the store itself or
    /// a proxy in front of it): path-style, plain HTTP, placeholder
    /// credentials (never checked).
    pub fn settings_via(&self, addr: SocketAddr) -> S3Settings {
        CREDENTIALS.settings(&self.bucket.name, addr)
    }

    /// Environment for a child process (a Python client) to reach the
    /// store: placeholder credentials and the region.
    pub fn env(&self) -> [(&'static str, String); 3] {
        CREDENTIALS.env()
    }

    /// How many objects it serves.
    pub fn len(&self) -> usize {
        self.bucket.objects.len()
    }

    /// Whether it serves no object.
    pub fn is_empty(&self) -> bool {
        self.bucket.objects.is_empty()
    }

    /// Requests answered so far, and object bytes sent.
    pub fn served(&self) -> (u64, u64) {
        (
            self.bucket.requests.load(Ordering::Relaxed),
            self.bucket.bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for LightStore {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// Every regular file under `dir`, keyed by its path below the walk's root.
fn walk(root: &Path, prefix: &str, out: &mut Vec<Object>) -> io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let hidden = entry
                .file_name()
                .to_str()
                .is_none_or(|n| n.starts_with('.'));
            if !ft.is_file() || hidden {
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: not a UTF-8 path below the root", path.display()),
                    )
                })?;
            let meta = entry.metadata()?;
            let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
            let since = mtime.duration_since(UNIX_EPOCH).unwrap_or_default();
            let key = if prefix.is_empty() {
                rel.to_owned()
            } else {
                format!("{prefix}/{rel}")
            };
            out.push(Object {
                key,
                size: meta.len(),
                etag: format!("\"{:x}-{:x}\"", meta.len(), since.as_nanos()),
                mtime: since.as_secs(),
                path,
            });
        }
    }
    Ok(())
}

type Reply = Response<Full<Bytes>>;

fn handle(b: &Bucket, req: &Request<Incoming>) -> Reply {
    b.requests.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path();
    let rest = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = match rest.split_once('/') {
        Some((bk, k)) => (bk, k),
        None => (rest, ""),
    };
    if bucket != b.name {
        return error(StatusCode::NOT_FOUND, "NoSuchBucket", bucket);
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "this store is read-only",
        );
    }
    if key.is_empty() {
        let query = parse_query(req.uri().query().unwrap_or(""));
        if query.iter().any(|(k, v)| k == "list-type" && v == "2") {
            return list(b, &query);
        }
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "only ListObjectsV2 (list-type=2) is served on the bucket",
        );
    }
    let Some(key) = percent_decode(key, false) else {
        return error(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "bad percent-encoding",
        );
    };
    let Some(obj) = b.find(&key) else {
        return error(StatusCode::NOT_FOUND, "NoSuchKey", &key);
    };
    object(b, obj, req, head)
}

fn header_str(req: &Request<Incoming>, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Whether an `If-Match` / `If-None-Match` list names `etag` (or is `*`).
fn etag_listed(list: &str, etag: &str) -> bool {
    list.split(',').map(str::trim).any(|t| {
        t == "*"
            || t == etag
            || t.strip_prefix("W/") == Some(etag)
            || t.trim_matches('"') == etag.trim_matches('"')
    })
}

fn object(b: &Bucket, obj: &Object, req: &Request<Incoming>, head: bool) -> Reply {
    if let Some(m) = header_str(req, header::IF_MATCH) {
        if !etag_listed(m, &obj.etag) {
            return error(
                StatusCode::PRECONDITION_FAILED,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            );
        }
    }
    let mut builder = Response::builder()
        .header(header::ETAG, obj.etag.as_str())
        .header(header::LAST_MODIFIED, http_date(obj.mtime))
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_TYPE, "application/octet-stream");
    if let Some(m) = header_str(req, header::IF_NONE_MATCH) {
        if etag_listed(m, &obj.etag) {
            return finish(builder.status(StatusCode::NOT_MODIFIED), Bytes::new());
        }
    }
    let (start, len, status) = match header_str(req, header::RANGE) {
        None => (0, obj.size, StatusCode::OK),
        Some(r) => match parse_range(r, obj.size) {
            Ok((s, e)) => {
                builder = builder.header(
                    header::CONTENT_RANGE,
                    format!("bytes {s}-{}/{}", e - 1, obj.size),
                );
                (s, e - s, StatusCode::PARTIAL_CONTENT)
            }
            Err(RangeError::Unsatisfiable) => {
                let mut r = error(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "InvalidRange",
                    "The requested range is not satisfiable",
                );
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{}", obj.size)) {
                    r.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return r;
            }
            // S3 ignores a Range header it cannot parse.
            Err(RangeError::Malformed) => (0, obj.size, StatusCode::OK),
        },
    };
    builder = builder.status(status).header(header::CONTENT_LENGTH, len);
    if head {
        return finish(builder, Bytes::new());
    }
    match read_at(&obj.path, start, len) {
        Ok(bytes) => {
            b.bytes.fetch_add(len, Ordering::Relaxed);
            finish(builder, bytes)
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            &format!("{}: {e}", obj.key),
        ),
    }
}

/// `len` bytes of the file at `start` (one open, one pread).
fn read_at(path: &Path, start: u64, len: u64) -> io::Result<Bytes> {
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, start)?;
    Ok(Bytes::from(buf))
}

fn finish(builder: hyper::http::response::Builder, body: Bytes) -> Reply {
    builder.body(Full::new(body)).unwrap_or_else(|e| {
        let mut r = Response::new(Full::new(Bytes::from(e.to_string())));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

/// An S3 XML error.
fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{}</Message></Error>",
        xml_escape(message)
    );
    finish(
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/xml"),
        Bytes::from(body),
    )
}

/// Why a `Range` header is not served as a range.
#[derive(Debug, PartialEq, Eq)]
enum RangeError {
    /// Not one `bytes=` range: served whole, as S3 does.
    Malformed,
    /// Starts past the end: `416`.
    Unsatisfiable,
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` of an object of `size` bytes into
/// `[start, end)`.
fn parse_range(h: &str, size: u64) -> Result<(u64, u64), RangeError> {
    let spec = h
        .trim()
        .strip_prefix("bytes=")
        .ok_or(RangeError::Malformed)?;
    if spec.contains(',') {
        return Err(RangeError::Malformed);
    }
    let (a, z) = spec.split_once('-').ok_or(RangeError::Malformed)?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| RangeError::Malformed);
    let (start, end) = match (a.trim().is_empty(), z.trim().is_empty()) {
        (true, true) => return Err(RangeError::Malformed),
        (true, false) => {
            let n = num(z)?;
            if n == 0 {
                return Err(RangeError::Unsatisfiable);
            }
            (size.saturating_sub(n), size)
        }
        (false, true) => (num(a)?, size),
        (false, false) => {
            let (s, e) = (num(a)?, num(z)?);
            if e < s {
                return Err(RangeError::Malformed);
            }
            (s, e.saturating_add(1).min(size))
        }
    };
    if start >= size {
        return Err(RangeError::Unsatisfiable);
    }
    Ok((start, end))
}

/// `a=b&c=d` into decoded pairs.
fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(k, true).unwrap_or_default(),
                percent_decode(v, true).unwrap_or_default(),
            )
        })
        .collect()
}

/// `%XX` decoding (and `+` as a space in a query); `None` if malformed or
/// not UTF-8.
fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes all but unreserved characters and `/`
/// (`encoding-type=url`).
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-_.~/".contains(&c) {
            out.push(c as char);
        } else {
            let _ = write!(out, "%{c:02X}");
        }
    }
    out
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// ListObjectsV2.
fn list(b: &Bucket, query: &[(String, String)]) -> Reply {
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let prefix = get("prefix").unwrap_or("");
    let delimiter = get("delimiter").filter(|d| !d.is_empty());
    let max_keys = match get("max-keys") {
        None => MAX_KEYS,
        Some(v) => match v.parse::<usize>() {
            Ok(n) => n.min(MAX_KEYS),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "InvalidArgument",
                    "max-keys: not a number",
                )
            }
        },
    };
    let url = get("encoding-type") == Some("url");
    let enc = |s: &str| xml_escape(&if url { url_encode(s) } else { s.to_owned() });
    // The token is the last key (or common prefix) of the previous page, in
    // hex: listing resumes after it.
    let token = get("continuation-token");
    let after = match token {
        Some(t) => match hex_decode(t) {
            Some(k) => k,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "InvalidArgument",
                    "The continuation token provided is incorrect",
                )
            }
        },
        None => get("start-after").unwrap_or("").to_owned(),
    };
    let from = b
        .objects
        .partition_point(|o| o.key.as_str() <= after.as_str() || o.key.as_str() < prefix);
    let mut contents = String::new();
    let mut prefixes = String::new();
    let mut count = 0usize;
    let mut last: Option<String> = None;
    let mut truncated = false;
    for o in &b.objects[from..] {
        if !o.key.starts_with(prefix) {
            break;
        }
        // A common prefix already returned (on this page or before).
        let common = delimiter.and_then(|d| {
            o.key[prefix.len()..]
                .find(d)
                .map(|at| &o.key[..prefix.len() + at + d.len()])
        });
        if let Some(cp) = common {
            if last.as_deref() == Some(cp) || after.starts_with(cp) {
                continue;
            }
        }
        if count == max_keys {
            truncated = true;
            break;
        }
        count += 1;
        match common {
            Some(cp) => {
                let _ = write!(
                    prefixes,
                    "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                    enc(cp)
                );
                last = Some(cp.to_owned());
            }
            None => {
                let _ = write!(
                    contents,
                    "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                    enc(&o.key),
                    iso_date(o.mtime),
                    xml_escape(&o.etag),
                    o.size
                );
                last = Some(o.key.clone());
            }
        }
    }
    let mut xml = String::with_capacity(contents.len() + prefixes.len() + 512);
    let _ = write!(
        xml,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>{}</Name><Prefix>{}</Prefix>",
        xml_escape(&b.name),
        enc(prefix)
    );
    if let Some(d) = delimiter {
        let _ = write!(xml, "<Delimiter>{}</Delimiter>", enc(d));
    }
    if url {
        xml.push_str("<EncodingType>url</EncodingType>");
    }
    let _ = write!(
        xml,
        "<KeyCount>{count}</KeyCount><MaxKeys>{max_keys}</MaxKeys><IsTruncated>{truncated}</IsTruncated>"
    );
    if let Some(t) = token {
        let _ = write!(
            xml,
            "<ContinuationToken>{}</ContinuationToken>",
            xml_escape(t)
        );
    }
    if let (true, Some(l)) = (truncated, &last) {
        let _ = write!(
            xml,
            "<NextContinuationToken>{}</NextContinuationToken>",
            hex(l)
        );
    }
    xml.push_str(&contents);
    xml.push_str(&prefixes);
    xml.push_str("</ListBucketResult>");
    finish(
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/xml"),
        Bytes::from(xml),
    )
}

fn hex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.as_bytes() {
        let _ = write!(out, "{c:02x}");
    }
    out
}

fn hex_decode(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// (year, month, day) of a day count since 1970-01-01 (the proleptic
/// Gregorian calendar; H. Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `2026-11-24T15:00:00.000Z`.
fn iso_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let t = secs % 86_400;
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.000Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// `Tue, 24 Nov 2026 15:00:00 GMT` (RFC 9110's IMF-fixdate).
fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (secs / 86_400) as i64;
    let t = secs % 86_400;
    let (y, m, d) = civil(days);
    format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(m - 1) as usize],
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    /// A fresh directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "granary-light-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn content(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    /// Five objects under `data/`: a/1.bin (1,000 bytes), a/2.bin, a/x y.bin,
    /// b/3.bin, b/c/4.bin; and a hidden file that is not served.
    fn fixture() -> (TempDir, LightStore) {
        let d = TempDir::new("fixture");
        for (i, rel) in ["a/1.bin", "a/2.bin", "a/x y.bin", "b/3.bin", "b/c/4.bin"]
            .iter()
            .enumerate()
        {
            let p = d.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content(i as u8, 1000 + i)).unwrap();
        }
        std::fs::write(d.0.join(".marker"), b"hidden").unwrap();
        let store = LightStore::start(&d.0, "bk", "data", 1).unwrap();
        (d, store)
    }

    struct Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        fn text(&self) -> String {
            String::from_utf8_lossy(&self.body).into_owned()
        }
    }

    /// One request over a fresh connection (`Connection: close`), read to
    /// the end.
    fn request(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> Answer {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: AWS4-HMAC-SHA256 Credential=any/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let at = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a header block");
        let head = String::from_utf8(raw[..at].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: raw[at + 4..].to_vec(),
        }
    }

    fn between<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        xml.split(open.as_str())
            .skip(1)
            .filter_map(|p| p.split_once(close.as_str()).map(|(v, _)| v))
            .collect()
    }

    #[test]
    fn lists_pages_prefixes_and_common_prefixes() {
        let (_d, st) = fixture();
        assert_eq!(st.len(), 5, "the hidden file is not served");
        let a = request(st.addr(), "GET", "/bk?list-type=2", &[]);
        assert_eq!(a.status, 200);
        let xml = a.text();
        assert_eq!(
            between(&xml, "Key"),
            [
                "data/a/1.bin",
                "data/a/2.bin",
                "data/a/x y.bin",
                "data/b/3.bin",
                "data/b/c/4.bin"
            ]
        );
        assert_eq!(
            between(&xml, "Size"),
            ["1000", "1001", "1002", "1003", "1004"]
        );
        assert_eq!(between(&xml, "IsTruncated"), ["false"]);
        assert_eq!(between(&xml, "KeyCount"), ["5"]);
        let lm = between(&xml, "LastModified")[0];
        assert!(lm.ends_with(".000Z") && lm.len() == 24, "{lm}");

        // Pages of two, following the continuation tokens.
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let target = match &token {
                Some(t) => {
                    format!("/bk?list-type=2&max-keys=2&prefix=data%2F&continuation-token={t}")
                }
                None => "/bk?list-type=2&max-keys=2&prefix=data%2F".to_owned(),
            };
            let xml = request(st.addr(), "GET", &target, &[]).text();
            pages += 1;
            keys.extend(between(&xml, "Key").into_iter().map(str::to_owned));
            match between(&xml, "NextContinuationToken").first() {
                Some(t) => {
                    assert_eq!(between(&xml, "IsTruncated"), ["true"]);
                    token = Some((*t).to_owned());
                }
                None => break,
            }
            assert!(pages < 10, "the listing does not end");
        }
        assert_eq!(pages, 3);
        assert_eq!(keys.len(), 5);
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");

        let xml = request(st.addr(), "GET", "/bk?list-type=2&prefix=data/b/", &[]).text();
        assert_eq!(between(&xml, "Key"), ["data/b/3.bin", "data/b/c/4.bin"]);
        let xml = request(
            st.addr(),
            "GET",
            "/bk?list-type=2&prefix=data/&delimiter=/",
            &[],
        )
        .text();
        assert!(between(&xml, "Key").is_empty());
        assert_eq!(between(&xml, "Prefix")[1..], ["data/a/", "data/b/"]);
        let xml = request(
            st.addr(),
            "GET",
            "/bk?list-type=2&prefix=data/a/&encoding-type=url",
            &[],
        )
        .text();
        assert_eq!(between(&xml, "Key")[2], "data/a/x%20y.bin");
        let a = request(
            st.addr(),
            "GET",
            "/bk?list-type=2&continuation-token=zz",
            &[],
        );
        assert_eq!(a.status, 400);
    }

    #[test]
    fn gets_whole_ranges_and_heads() {
        let (_d, st) = fixture();
        let a = request(st.addr(), "GET", "/bk/data/a/1.bin", &[]);
        assert_eq!(a.status, 200);
        assert_eq!(a.body, content(0, 1000));
        assert_eq!(a.header("content-length"), Some("1000"));
        let etag = a.header("etag").unwrap().to_owned();
        assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
        assert!(a.header("last-modified").unwrap().ends_with(" GMT"));

        let a = request(st.addr(), "GET", "/bk/data/a/x%20y.bin", &[]);
        assert_eq!(a.status, 200);
        assert_eq!(a.body, content(2, 1002));

        let a = request(
            st.addr(),
            "GET",
            "/bk/data/b/3.bin",
            &[("Range", "bytes=10-19")],
        );
        assert_eq!(a.status, 206);
        assert_eq!(a.body, content(3, 1003)[10..20]);
        assert_eq!(a.header("content-range"), Some("bytes 10-19/1003"));
        let a = request(
            st.addr(),
            "GET",
            "/bk/data/b/3.bin",
            &[("Range", "bytes=-3")],
        );
        assert_eq!(a.status, 206);
        assert_eq!(a.body, content(3, 1003)[1000..]);
        let a = request(
            st.addr(),
            "GET",
            "/bk/data/b/3.bin",
            &[("Range", "bytes=990-5000")],
        );
        assert_eq!(a.body, content(3, 1003)[990..]);
        let a = request(
            st.addr(),
            "GET",
            "/bk/data/b/3.bin",
            &[("Range", "bytes=5000-")],
        );
        assert_eq!(a.status, 416);
        assert_eq!(a.header("content-range"), Some("bytes */1003"));

        let a = request(st.addr(), "HEAD", "/bk/data/b/c/4.bin", &[]);
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-length"), Some("1004"));
        assert!(a.body.is_empty());
        let (requests, bytes) = st.served();
        assert_eq!(requests, 7);
        assert_eq!(bytes, 1000 + 1002 + 10 + 3 + 13);
    }

    #[test]
    fn if_match_missing_keys_and_writes_are_refused() {
        let (_d, st) = fixture();
        let etag = request(st.addr(), "HEAD", "/bk/data/a/2.bin", &[])
            .header("etag")
            .unwrap()
            .to_owned();
        let a = request(st.addr(), "GET", "/bk/data/a/2.bin", &[("If-Match", &etag)]);
        assert_eq!(a.status, 200);
        assert_eq!(a.body, content(1, 1001));
        let a = request(
            st.addr(),
            "GET",
            "/bk/data/a/2.bin",
            &[("If-Match", "\"other\"")],
        );
        assert_eq!(a.status, 412);
        assert!(a.text().contains("<Code>PreconditionFailed</Code>"));
        let a = request(
            st.addr(),
            "GET",
            "/bk/data/a/2.bin",
            &[("If-None-Match", &etag)],
        );
        assert_eq!(a.status, 304);

        let a = request(st.addr(), "GET", "/bk/data/a/none.bin", &[]);
        assert_eq!(a.status, 404);
        assert!(a.text().contains("<Code>NoSuchKey</Code>"));
        let a = request(st.addr(), "GET", "/other/data/a/1.bin", &[]);
        assert_eq!(a.status, 404);
        assert!(a.text().contains("<Code>NoSuchBucket</Code>"));
        let a = request(st.addr(), "GET", "/bk/data/.marker", &[]);
        assert_eq!(a.status, 404);
        let a = request(
            st.addr(),
            "PUT",
            "/bk/data/a/1.bin",
            &[("Content-Length", "0")],
        );
        assert_eq!(a.status, 405);
        let a = request(st.addr(), "GET", "/bk/data/a/%zz", &[]);
        assert_eq!(a.status, 400);
    }

    #[test]
    fn mounts_serve_several_folders_and_refuse_a_key_twice() {
        let (a, b) = (TempDir::new("mount-a"), TempDir::new("mount-b"));
        std::fs::write(a.0.join("1.bin"), content(1, 100)).unwrap();
        std::fs::create_dir_all(b.0.join("s")).unwrap();
        std::fs::write(b.0.join("s/index.json"), b"{}").unwrap();
        let st = LightStore::start_mounts(&[(&a.0, "data"), (&b.0, "mds")], "bk", 1).unwrap();
        assert_eq!(st.len(), 2);
        let xml = request(st.addr(), "GET", "/bk?list-type=2", &[]).text();
        assert_eq!(between(&xml, "Key"), ["data/1.bin", "mds/s/index.json"]);
        let got = request(st.addr(), "GET", "/bk/mds/s/index.json", &[]);
        assert_eq!((got.status, got.body.as_slice()), (200, &b"{}"[..]));
        drop(st);
        std::fs::write(b.0.join("1.bin"), b"x").unwrap();
        let e = LightStore::start_mounts(&[(&a.0, "data"), (&b.0, "data")], "bk", 1).unwrap_err();
        assert!(e.to_string().contains("data/1.bin"), "{e}");
    }

    #[test]
    fn ranges_parse_like_s3() {
        assert_eq!(parse_range("bytes=0-9", 100), Ok((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Ok((90, 100)));
        assert_eq!(parse_range("bytes=-10", 100), Ok((90, 100)));
        assert_eq!(parse_range("bytes=-1000", 100), Ok((0, 100)));
        assert_eq!(parse_range("bytes=50-1000", 100), Ok((50, 100)));
        assert_eq!(
            parse_range("bytes=100-", 100),
            Err(RangeError::Unsatisfiable)
        );
        assert_eq!(parse_range("bytes=-0", 100), Err(RangeError::Unsatisfiable));
        assert_eq!(parse_range("bytes=9-0", 100), Err(RangeError::Malformed));
        assert_eq!(parse_range("items=0-9", 100), Err(RangeError::Malformed));
        assert_eq!(
            parse_range("bytes=0-1,5-6", 100),
            Err(RangeError::Malformed)
        );
        assert_eq!(parse_range("bytes=-", 100), Err(RangeError::Malformed));
    }

    #[test]
    fn dates_are_iso_and_imf() {
        assert_eq!(iso_date(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(iso_date(1_700_000_000), "2023-11-14T22:13:20.000Z");
        assert_eq!(http_date(1_700_000_000), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(iso_date(951_782_400), "2000-02-29T00:00:00.000Z");
    }

    /// The agent's real S3 source (object_store's client: listing, GETs
    /// with `If-Match`) reads one whole epoch from the store, every sample
    /// verified byte for byte.
    #[test]
    fn the_agents_s3_source_reads_an_epoch() {
        use crate::agent::{Agent, AgentSettings, S3Dataset};
        use crate::loader::{self, Wait};
        use granary_tools::synth;
        let d = TempDir::new("synth");
        let mut spec = synth::SynthSpec::new(d.0.join("ds"));
        spec.num_files = 300;
        spec.num_classes = 3;
        spec.mean_size = 20_000;
        synth::generate(&spec, |_, _| {}).unwrap();
        let st = LightStore::start(&spec.root, "bk", "synth", 2).unwrap();
        assert_eq!(st.len(), 300);
        let dataset = S3Dataset {
            name: "light".to_owned(),
            settings: st.settings_via(st.addr()),
            prefix: "synth".to_owned(),
            extra: Vec::new(),
        };
        let mut cfg = AgentSettings::new_s3(64 << 20, dataset);
        cfg.max_inflight_reads = 32;
        let agent = Agent::start(&cfg).unwrap();
        let client = granary::Client::connect(agent.socket()).unwrap();
        let mut opts = granary::SessionOptions::new("light");
        opts.batch_size = 16;
        opts.epoch_count = 1;
        opts.seed = 7;
        let mut seen = std::collections::HashSet::new();
        loader::consume(&client, &opts, Wait::Block, |s| {
            let info = synth::verify_sample(s.bytes).map_err(|e| format!("{}: {e}", s.id))?;
            if info.file_id != s.id {
                return Err(format!("sample {} carries file {}", s.id, info.file_id));
            }
            seen.insert(s.id);
            Ok(0)
        })
        .unwrap();
        drop(client);
        agent.stop().unwrap();
        assert_eq!(seen.len(), 300);
        let (requests, bytes) = st.served();
        assert!(requests > 300, "{requests} requests");
        assert!(bytes >= spec.total_bytes(), "{bytes} bytes served");
    }

    #[test]
    fn bad_buckets_are_refused() {
        let d = TempDir::new("bad");
        assert!(LightStore::start(&d.0, "", "", 1).is_err());
        assert!(LightStore::start(&d.0, "a/b", "", 1).is_err());
        assert!(LightStore::start(&d.0.join("missing"), "bk", "", 1).is_err());
    }
}
