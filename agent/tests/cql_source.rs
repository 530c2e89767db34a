//! The CQL source through the real `scylla` driver, at protocol level,
//! against a fake cluster: `scylla-proxy` nodes in dry mode answering with
//! forged frames (see `granary_testkit::fake_cql`). Loopback only, no database.
//!
//! What these tests cannot show — a real cluster's behaviour under load,
//! real schema changes, ScyllaDB shards — is for `cql_real.rs`.

use granary_agent::config::Config;
use granary_agent::source::cql::{
    fetch_error, is_retryable, CqlDataset, CqlError, CqlSettings, CqlSource, FetchOptions,
    FetchRequest, Pool,
};
use granary_agent::source::{self, SampleSource};
use granary_agent::source::{Completion, SampleError};
use granary_shm::arena::Arena;
use granary_testkit::fake_cql::{
    error_frame, forge, forge_after, read_answer, read_of, FakeCluster, Sample, Tables,
};
use scylla::errors::DbError;
use scylla::routing::partitioner::{Murmur3Partitioner, Partitioner};
use scylla_proxy::Condition;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Reads samples `indices` of `src` with as many in flight as it accepts,
/// into a heap arena; returns each one's bytes or error.
fn fetch_all(
    src: &mut dyn SampleSource,
    indices: &[u64],
) -> HashMap<u64, Result<Vec<u8>, SampleError>> {
    let mut offsets = HashMap::new();
    let mut total = 0u64;
    for &i in indices {
        offsets.insert(i, total);
        total += src.meta(i).size.max(1);
    }
    let arena = Arena::heap(total.max(1)).unwrap();
    let mut out = HashMap::new();
    let mut next = 0;
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < indices.len() {
        assert!(Instant::now() < deadline, "fetches did not finish");
        while next < indices.len() && src.in_flight() < src.capacity() as usize {
            let i = indices[next];
            let dest = arena.slice(offsets[&i], src.meta(i).size as usize).unwrap();
            src.submit(i, i, dest).expect("capacity checked");
            next += 1;
        }
        done.clear();
        src.poll_completions(Some(Duration::from_millis(200)), &mut done)
            .unwrap();
        for Completion { tag, result } in done.drain(..) {
            let r = result.map(|n| {
                assert_eq!(u64::from(n), src.meta(tag).size);
                arena.read_at(offsets[&tag], n as usize).unwrap()
            });
            out.insert(tag, r);
        }
    }
    assert_eq!(src.in_flight(), 0);
    out
}

/// [`fetch_one`] with [`fast_options`].
fn fetch_fast(
    source: &CqlSource,
    id: Uuid,
    len: u32,
) -> (io::Result<Vec<u8>>, granary_agent::source::cql::FetchStats) {
    fetch_one(source, fast_options(source.settings()), id, len)
}

/// Reads one sample through a fetcher of `source` with `options`.
fn fetch_one(
    source: &CqlSource,
    options: FetchOptions,
    id: Uuid,
    len: u32,
) -> (io::Result<Vec<u8>>, granary_agent::source::cql::FetchStats) {
    let mut f = source.fetcher_with(options).unwrap();
    let arena = granary_shm::arena::Arena::heap(u64::from(len.max(1))).unwrap();
    let req = FetchRequest {
        crc: None,
        tag: 7,
        id,
        len,
        dest: arena.slice(0, len as usize).unwrap(),
    };
    f.submit(req).unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        f.poll_completions(Some(Duration::from_secs(30)), &mut done)
            .unwrap();
    }
    let c = done.pop().unwrap();
    assert_eq!(c.tag, 7);
    let stats = f.stats();
    drop(f);
    (
        c.result.map(|_| arena.read_at(0, len as usize).unwrap()),
        stats,
    )
}

fn fast_options(settings: &CqlSettings) -> FetchOptions {
    settings.fetch_options()
}

#[test]
fn catalog_in_label_then_id_order_and_every_sample_byte_for_byte() {
    let tables = Tables::generated(6000, 7);
    let expected: HashMap<Uuid, (i32, Vec<u8>)> = tables
        .samples
        .iter()
        .map(|s| (s.id, (s.label, s.data.clone().unwrap())))
        .collect();
    let fake = FakeCluster::start(tables);
    let toml = format!(
        "[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"{}\"]\nkeyspace = \"ds\"\n\
         connections_per_host = 4\nmax_inflight = 2048\n",
        fake.addrs[0]
    );
    let cfg = Config::from_toml_str(&toml).unwrap();
    // Through the engine's entry point and trait.
    let mut src = source::open(&cfg.datasets[0], &cfg).unwrap();
    assert_eq!(src.kind(), "cql");
    assert_eq!(src.len(), 6000);
    assert_eq!(src.capacity(), 2048);
    let mut total = 0;
    let mut prev: Option<(i32, Uuid)> = None;
    for i in 0..src.len() {
        let m = src.meta(i);
        assert_eq!(m.sample_id, i);
        let d = src.describe(i);
        let id: Uuid = d.strip_prefix("cql://ds.data/").unwrap().parse().unwrap();
        let (label, data) = &expected[&id];
        assert_eq!((m.label, m.size), (*label, data.len() as u64));
        if let Some(p) = prev {
            assert!(
                (p.0, p.1.as_bytes()) < (m.label, id.as_bytes()),
                "order broken at {i}"
            );
        }
        prev = Some((m.label, id));
        total += m.size;
    }
    assert_eq!(src.total_bytes(), total);
    let indices: Vec<u64> = (0..src.len()).collect();
    let got = fetch_all(&mut *src, &indices);
    for (i, r) in got {
        let bytes = r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
        let id: Uuid = src.describe(i)[14..].parse().unwrap();
        assert!(bytes == expected[&id].1, "sample {i} differs");
    }
    assert_eq!(fake.read_count(), 6000, "one EXECUTE per sample");
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
    drop(src);
}

#[test]
fn reads_go_to_the_node_that_owns_the_token() {
    let fake = FakeCluster::start_with(Tables::generated(300, 3), 3, None);
    let ds = CqlDataset::connect(&fake.settings()).unwrap();
    assert!(
        ds.fetcher().is_token_aware(),
        "the read statement is not token-aware"
    );
    let mut ds: Box<dyn SampleSource> = Box::new(ds);
    let indices: Vec<u64> = (0..300).collect();
    for (i, r) in fetch_all(&mut *ds, &indices) {
        r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
    }
    // Node k owns the tokens in (token[k-1], token[k]] (wrapping).
    let tokens: Vec<i64> = fake.shared.nodes.iter().map(|n| n.2).collect();
    let owner = |id: &Uuid| {
        let t = Murmur3Partitioner.hash_one(id.as_bytes()).value();
        tokens.iter().position(|&k| t <= k).unwrap_or(0)
    };
    let reads = fake.reads();
    for (node, ids) in reads.iter().enumerate() {
        assert!(!ids.is_empty(), "node {node} got no read");
        for id in ids {
            assert_eq!(owner(id), node, "read of {id} went to node {node}");
        }
    }
    assert_eq!(reads.iter().map(Vec::len).sum::<usize>(), 300);
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}

#[test]
fn a_missing_row_fails_at_once_naming_the_id() {
    let mut tables = Tables::generated(5, 1);
    tables.samples[2].data = None;
    let gone = tables.samples[2].clone();
    let fake = FakeCluster::start(tables);
    let source = CqlSource::connect(&fake.settings()).unwrap();
    let (r, stats) = fetch_fast(&source, gone.id, gone.size as u32);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(!is_retryable(&e));
    let msg = e.to_string();
    assert!(msg.contains(&gone.id.to_string()), "{msg}");
    assert!(msg.contains("no row"), "{msg}");
    assert_eq!(fetch_error(&e).unwrap().attempts, 1);
    assert_eq!((stats.attempts, stats.failures), (1, 1));
    assert_eq!(fake.read_count(), 1);
}

#[test]
fn overloaded_unavailable_and_read_timeouts_are_retryable_then_delivered() {
    let tables = Tables::generated(3, 1);
    let s = tables.samples[1].clone();
    let mut fake = FakeCluster::start(tables);
    let once = || Condition::TrueForLimitedTimes(1);
    let errors = [
        forged_errors::overloaded(),
        forged_errors::unavailable(),
        forged_errors::read_timeout(),
    ];
    let rules = errors
        .into_iter()
        .map(|err| {
            forge(read_of(s.id).and(once()), move |req| {
                error_frame(&req, err.clone(), "forged")
            })
        })
        .collect();
    fake.prepend_rules(0, rules);
    let source = CqlSource::connect(&fake.settings()).unwrap();
    // One attempt per request: each forged error fails one read, which
    // says another may succeed (the engine's retry policy decides).
    for what in ["overloaded", "unavailable", "timeout"] {
        let (r, stats) = fetch_fast(&source, s.id, s.size as u32);
        let e = r.unwrap_err();
        assert!(is_retryable(&e), "{what}: {e}");
        assert_eq!((stats.attempts, stats.failures), (1, 1), "{what}");
    }
    let (r, stats) = fetch_fast(&source, s.id, s.size as u32);
    assert_eq!(r.unwrap(), s.data.clone().unwrap());
    assert_eq!((stats.attempts, stats.failures), (1, 0));

    // Always overloaded: every read fails, retryably, naming the cause.
    let overloaded = Arc::new(forged_errors::overloaded());
    fake.prepend_rules(
        0,
        vec![forge(read_of(s.id), move |req| {
            error_frame(&req, (*overloaded).clone(), "forged")
        })],
    );
    let (r, stats) = fetch_fast(&source, s.id, s.size as u32);
    let e = r.unwrap_err();
    assert!(is_retryable(&e), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("overloaded"), "{msg}");
    assert_eq!((stats.attempts, stats.failures), (1, 1));
}

/// A cluster of three samples whose first sample's reads that match
/// `slow(id)` are answered after 1.5 s; that sample; a source on the
/// cluster.
fn slow_first_sample(slow: impl Fn(Uuid) -> Condition) -> (FakeCluster, Sample, CqlSource) {
    let tables = Tables::generated(3, 1);
    let s = tables.samples[0].clone();
    let mut fake = FakeCluster::start(tables);
    let shared = fake.shared.clone();
    fake.prepend_rules(
        0,
        vec![forge_after(
            Duration::from_millis(1500),
            slow(s.id),
            move |req| read_answer(&shared, &req),
        )],
    );
    let source = CqlSource::connect(&fake.settings()).unwrap();
    (fake, s, source)
}

#[test]
fn a_read_slower_than_the_timeout_times_out_and_the_next_one_delivers() {
    let (fake, s, source) = slow_first_sample(read_of);
    let mut o = fast_options(source.settings());
    o.request_timeout = Duration::from_millis(250);
    let t0 = Instant::now();
    let (r, stats) = fetch_one(&source, o.clone(), s.id, s.size as u32);
    let took = t0.elapsed();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(is_retryable(&e));
    assert_eq!((stats.attempts, stats.timeouts), (1, 1));
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // Slow only once (a fresh cluster, whose rules hold no always-slow
    // one): the first read times out, the next delivers.
    drop(source);
    drop(fake);
    let (_fake, s, source) =
        slow_first_sample(|id| read_of(id).and(Condition::TrueForLimitedTimes(1)));
    let (r, stats) = fetch_one(&source, o.clone(), s.id, s.size as u32);
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
    assert_eq!((stats.attempts, stats.timeouts), (1, 1));
    let (r, stats) = fetch_one(&source, o, s.id, s.size as u32);
    assert_eq!(r.unwrap(), s.data.unwrap());
    assert_eq!((stats.attempts, stats.timeouts, stats.failures), (1, 0, 0));
}

#[test]
fn a_blob_of_another_size_than_the_catalog_is_an_error_naming_the_id() {
    let mut tables = Tables::generated(4, 2);
    tables.samples[3].size += 1;
    let s = tables.samples[3].clone();
    let fake = FakeCluster::start(tables);
    let source = CqlSource::connect(&fake.settings()).unwrap();
    let catalog = source.catalog().unwrap();
    let entry = catalog.entries().iter().find(|e| e.id == s.id).unwrap();
    assert_eq!(entry.size, s.size as u64);
    let (r, stats) = fetch_fast(&source, s.id, entry.size as u32);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(!is_retryable(&e));
    let msg = e.to_string();
    assert!(
        msg.contains(&s.id.to_string()) && msg.contains("length mismatch"),
        "{msg}"
    );
    assert_eq!(stats.attempts, 1);
}

#[test]
fn unauthorized_and_syntax_errors_fail_at_once() {
    let tables = Tables::generated(2, 1);
    let s = tables.samples[0].clone();
    let mut fake = FakeCluster::start(tables);
    let source = CqlSource::connect(&fake.settings()).unwrap();
    for (err, kind) in [
        (DbError::Unauthorized, io::ErrorKind::PermissionDenied),
        (DbError::SyntaxError, io::ErrorKind::InvalidInput),
    ] {
        let e2 = err.clone();
        fake.prepend_rules(
            0,
            vec![forge(read_of(s.id), move |req| {
                error_frame(&req, e2.clone(), "forged")
            })],
        );
        let (r, stats) = fetch_fast(&source, s.id, s.size as u32);
        let e = r.unwrap_err();
        assert_eq!(e.kind(), kind, "{err:?}: {e}");
        assert!(!is_retryable(&e));
        assert_eq!(stats.attempts, 1, "{err:?}");
    }
}

#[test]
fn credentials_are_checked_and_bad_ones_fail_clearly() {
    let creds = granary_testkit::fake_cql::Credentials {
        user: "granary".into(),
        password: "s3cret".into(),
    };
    let fake = FakeCluster::start_with(Tables::generated(10, 2), 1, Some(creds));
    let mut s = fake.settings();
    s.username = Some("granary".into());
    s.password = Some("s3cret".into());
    let source = CqlSource::connect(&s).unwrap();
    assert_eq!(source.catalog().unwrap().len(), 10);
    drop(source);

    s.password = Some("wrong".into());
    let e = CqlSource::connect(&s).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CqlError::Connect { .. }), "{msg}");
    assert!(msg.contains("username and password"), "{msg}");
    assert!(!msg.contains("wrong"), "the password leaked: {msg}");

    s.username = None;
    s.password = None;
    let e = CqlSource::connect(&s).unwrap_err().to_string();
    assert!(e.contains(&fake.addrs[0].to_string()), "{e}");

    // A user without a password is refused before connecting.
    s.username = Some("granary".into());
    let e = CqlSource::connect(&s).unwrap_err().to_string();
    assert!(e.contains("GRANARY_CQL_PASSWORD"), "{e}");
}

#[test]
fn nothing_listening_is_a_connect_error_naming_the_host() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut s = CqlSettings::new(vec![format!("127.0.0.1:{port}")], "ds");
    s.request_timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let e = CqlSource::connect(&s).unwrap_err();
    assert!(matches!(e, CqlError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

#[test]
fn a_metadata_table_without_size_fails_saying_how_to_fix_it() {
    let mut tables = Tables::generated(3, 1);
    tables.size_type = None;
    let fake = FakeCluster::start(tables);
    let source = CqlSource::connect(&fake.settings()).unwrap();
    let e = source.catalog().unwrap_err();
    assert!(matches!(e, CqlError::Schema(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("ds.metadata has no `size` column"), "{msg}");
    assert!(
        msg.contains("ALTER TABLE ds.metadata ADD size int"),
        "{msg}"
    );
    assert!(msg.contains("granary ingest"), "{msg}");

    // A bigint size column is read as well, and other table names are used.
    let mut tables = Tables::generated(3, 1);
    tables.size_type = Some("bigint");
    tables.data_table = "blobs".into();
    tables.metadata_table = "idx".into();
    let want: u64 = tables.samples.iter().map(|s| s.size as u64).sum();
    let fake = FakeCluster::start(tables);
    let mut settings = fake.settings();
    settings.pool = Pool::PerShard(2);
    let mut ds: Box<dyn SampleSource> = Box::new(CqlDataset::connect(&settings).unwrap());
    assert_eq!(ds.total_bytes(), want);
    assert!(ds.describe(0).starts_with("cql://ds.blobs/"));
    for (i, r) in fetch_all(&mut *ds, &[0, 1, 2]) {
        r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
    }
}

/// The server errors the tests forge.
mod forged_errors {
    use scylla::errors::DbError;
    use scylla::statement::Consistency;
    pub fn overloaded() -> DbError {
        DbError::Overloaded
    }
    pub fn unavailable() -> DbError {
        DbError::Unavailable {
            consistency: Consistency::LocalOne,
            required: 1,
            alive: 0,
        }
    }
    pub fn read_timeout() -> DbError {
        DbError::ReadTimeout {
            consistency: Consistency::LocalOne,
            received: 0,
            required: 1,
            data_present: false,
        }
    }
}

/// The id → (relative path, label, size) map of a folder's filesystem
/// catalog, ids as `granary ingest` derives them.
fn fs_ids(
    root: &std::path::Path,
) -> (
    source::Catalog,
    HashMap<Uuid, (std::path::PathBuf, i32, u64)>,
) {
    let catalog = source::Catalog::from_dir(root).unwrap();
    let map = catalog
        .entries()
        .iter()
        .map(|e| {
            let rel = e
                .path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            (
                ingest_cql::sample_id(&rel),
                (e.path.clone(), e.label, e.size),
            )
        })
        .collect();
    (catalog, map)
}

use granary_tools::ingest::cql as ingest_cql;

#[test]
fn ingest_writes_a_folder_that_the_source_serves_like_the_filesystem_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = granary_tools::synth::SynthSpec::new(dir.path().join("synth"));
    spec.num_files = 240;
    spec.num_classes = 5;
    spec.mean_size = 1500;
    granary_tools::synth::generate(&spec, |_, _| {}).unwrap();
    let fake = FakeCluster::start(Tables::empty());

    let mut opts = ingest_cql::CqlIngestOptions::new(&spec.root, fake.settings());
    opts.verify = true;
    opts.concurrency = 16;
    let mut last = (0, 0);
    let r = ingest_cql::ingest(&opts, |_, done, total, _| last = (done, total)).unwrap();
    assert_eq!(
        (r.files, r.uploaded, r.skipped, r.verified),
        (240, 240, 0, 240)
    );
    assert_eq!(last, (240, 240));
    assert_eq!(r.uploaded_bytes, spec.total_bytes());

    // Resumed: nothing to write; one file changed: that one is written.
    opts.verify = false;
    opts.resume = true;
    let r = ingest_cql::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!((r.uploaded, r.skipped), (0, 240));
    let changed = spec.path_of(17);
    let mut bytes = std::fs::read(&changed).unwrap();
    bytes.extend_from_slice(b"more");
    std::fs::write(&changed, &bytes).unwrap();
    let r = ingest_cql::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!((r.uploaded, r.skipped), (1, 239));

    // Served: position by position the labels of the filesystem catalog,
    // within each label the same sizes; every byte equal to its file.
    let (fs, by_id) = fs_ids(&spec.root);
    let mut ds: Box<dyn SampleSource> = Box::new(CqlDataset::connect(&fake.settings()).unwrap());
    assert_eq!(ds.len(), fs.len() as u64);
    assert_eq!(ds.total_bytes(), fs.total_bytes());
    let mut cql_sizes: HashMap<i32, Vec<u64>> = HashMap::new();
    let mut fs_sizes: HashMap<i32, Vec<u64>> = HashMap::new();
    for (i, e) in fs.entries().iter().enumerate() {
        let m = ds.meta(i as u64);
        assert_eq!(m.label, e.label, "label at {i}");
        cql_sizes.entry(m.label).or_default().push(m.size);
        fs_sizes.entry(e.label).or_default().push(e.size);
    }
    for v in cql_sizes.values_mut().chain(fs_sizes.values_mut()) {
        v.sort_unstable();
    }
    assert_eq!(cql_sizes, fs_sizes);
    let indices: Vec<u64> = (0..ds.len()).collect();
    for (i, r) in fetch_all(&mut *ds, &indices) {
        let got = r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
        let id: Uuid = ds.describe(i)[14..].parse().unwrap();
        let (path, label, _) = &by_id[&id];
        assert_eq!(ds.meta(i).label, *label);
        assert!(
            got == std::fs::read(path).unwrap(),
            "{} differs",
            path.display()
        );
    }
    // Ingest wrote each blob's CRC-32C into the metadata table's `crc`
    // column (which it added); a blob replaced after cataloguing by other
    // bytes of the same size fails its sample as changed.
    let replaced = {
        let mut t = fake.shared.tables.lock().unwrap();
        assert_eq!(t.crc_type, Some("int"), "ingest adds the crc column");
        for smp in &t.samples {
            let data = smp.data.as_ref().expect("ingested");
            let want = i32::from_ne_bytes(crc32c::crc32c(data).to_ne_bytes());
            assert_eq!(smp.crc, Some(want), "crc of {}", smp.id);
        }
        let smp = &mut t.samples[5];
        let data = smp.data.as_mut().expect("ingested");
        data.iter_mut().for_each(|b| *b ^= 0x5a);
        smp.id
    };
    let again = fetch_all(&mut *ds, &indices);
    for (i, r) in again {
        let id: Uuid = ds.describe(i)[14..].parse().unwrap();
        if id == replaced {
            let e = r.expect_err("a replaced blob");
            assert_eq!(e.kind, source::FailureKind::Corrupt, "{e}");
            assert!(
                e.message.contains(&id.to_string()) && e.message.contains("CRC-32C"),
                "{e}"
            );
        } else {
            r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
        }
    }
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}
