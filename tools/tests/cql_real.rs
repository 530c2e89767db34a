//! The CQL source and `granary ingest` against a real ScyllaDB or Cassandra
//! cluster, when `GRANARY_TEST_SCYLLA=host:port` names one (for example
//! `docker run -p 9042:9042 scylladb/scylla --smp 1` on another machine).
//! Optional: `GRANARY_TEST_SCYLLA_USER` with `GRANARY_CQL_PASSWORD`.
//!
//! Each test works in a keyspace of its own (`granary_test_<pid>_<n>`),
//! dropped at the end. No cluster can run where CI runs, so every test is
//! `#[ignore]`d: scripts/test.sh runs them when `GRANARY_TEST_SCYLLA` is set
//! and lists them as not run otherwise. See docs/scylla.md.

use granary_agent::source::cql::{CqlDataset, CqlError, CqlSettings, CqlSource};
use granary_agent::source::{Catalog, SampleSource};
use granary_agent::source::{Completion, FailureKind, SampleError};
use granary_shm::arena::Arena;
use granary_tools::ingest::cql::{self as ingest_cql, CqlIngestOptions};
use granary_tools::synth::{self, SynthSpec};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The cluster's contact point; these tests are `#[ignore]`d and run (by
/// scripts/test.sh) only when `GRANARY_TEST_SCYLLA` is set.
fn cluster() -> String {
    std::env::var("GRANARY_TEST_SCYLLA")
        .ok()
        .filter(|h| !h.is_empty())
        .expect("GRANARY_TEST_SCYLLA=host:port names the cluster; see docs/scylla.md")
}

/// Settings for a fresh keyspace on `host`.
fn settings(host: &str) -> CqlSettings {
    static N: AtomicU32 = AtomicU32::new(0);
    let ks = format!(
        "granary_test_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let mut s = CqlSettings::new(vec![host.to_owned()], ks);
    s.username = std::env::var("GRANARY_TEST_SCYLLA_USER").ok();
    s.fill_from_env(|k| std::env::var(k).ok());
    s.max_inflight = 512;
    s
}

/// A test's own keyspace on the cluster, dropped when the test ends
/// however it ends, and a synthetic dataset in a temporary folder.
struct Fresh {
    host: String,
    s: CqlSettings,
    spec: SynthSpec,
    _dir: tempfile::TempDir,
}

impl Fresh {
    /// A fresh keyspace, and a dataset of `files` files.
    fn new(files: u64) -> Fresh {
        let host = cluster();
        let s = settings(&host);
        let dir = tempfile::tempdir().unwrap();
        let spec = synth_dir(dir.path(), files);
        Fresh {
            host,
            s,
            spec,
            _dir: dir,
        }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Ok(src) = CqlSource::connect(&self.s) {
            let cql = format!("DROP KEYSPACE IF EXISTS {}", self.s.keyspace);
            let _ = src.block_on(src.session().query_unpaged(cql, ()));
        }
    }
}

fn run_ddl(src: &CqlSource, cql: &str) {
    let mut st = scylla::statement::Statement::new(cql);
    st.set_request_timeout(Some(Duration::from_secs(60)));
    src.block_on(src.session().query_unpaged(st, ()))
        .unwrap_or_else(|e| panic!("{cql}: {e}"));
}

fn synth_dir(dir: &Path, files: u64) -> SynthSpec {
    granary_testkit::dataset::synth_at(&dir.join("synth"), files, 7, 20_000)
}

/// Every sample of `src`, 256 in flight: bytes or error by index.
fn fetch_all(src: &mut dyn SampleSource) -> HashMap<u64, Result<Vec<u8>, SampleError>> {
    let offsets: Vec<u64> = (0..src.len())
        .scan(0u64, |at, i| {
            let o = *at;
            *at += src.meta(i).size.max(1);
            Some(o)
        })
        .collect();
    let total = (0..src.len()).map(|i| src.meta(i).size.max(1)).sum::<u64>();
    let arena = Arena::heap(total.max(1)).unwrap();
    let mut out = HashMap::new();
    let mut next = 0;
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while out.len() < src.len() as usize {
        assert!(Instant::now() < deadline, "fetches did not finish");
        while next < src.len() && src.in_flight() < 256 {
            let dest = arena
                .slice(offsets[next as usize], src.meta(next).size as usize)
                .unwrap();
            src.submit(next, next, dest).unwrap();
            next += 1;
        }
        done.clear();
        src.poll_completions(Some(Duration::from_millis(500)), &mut done)
            .unwrap();
        for Completion { tag, result } in done.drain(..) {
            out.insert(
                tag,
                result.map(|n| arena.read_at(offsets[tag as usize], n as usize).unwrap()),
            );
        }
    }
    out
}

fn granary(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
#[ignore = "needs a real ScyllaDB/Cassandra: set GRANARY_TEST_SCYLLA=host:port (docs/scylla.md)"]
fn cql_real_ingest_serve_verify_and_resume() {
    let fresh = Fresh::new(400);
    let (host, s, spec) = (&fresh.host, &fresh.s, &fresh.spec);
    let root = spec.root.to_str().unwrap();
    let to = format!("cql://{host}/{}", s.keyspace);
    let mut args = vec!["ingest", root, "--to", &to, "--verify"];
    if let Some(u) = &s.username {
        args.extend(["--username", u]);
    }
    let (ok, out) = granary(&args);
    assert!(ok, "{out}");
    assert!(
        out.contains("400 written") && out.contains("verify: OK, 400 rows"),
        "{out}"
    );

    let mut ds: Box<dyn SampleSource> = Box::new(CqlDataset::connect(s).unwrap());
    let fs = Catalog::from_dir(&spec.root).unwrap();
    assert_eq!(ds.len(), 400);
    assert_eq!(ds.total_bytes(), fs.total_bytes());
    for (i, e) in fs.entries().iter().enumerate() {
        assert_eq!(ds.meta(i as u64).label, e.label, "label at {i}");
    }
    for (i, r) in fetch_all(&mut *ds) {
        let bytes = r.unwrap_or_else(|e| panic!("sample {i}: {e}"));
        assert_eq!(bytes.len() as u64, ds.meta(i).size);
        synth::verify_sample(&bytes).unwrap_or_else(|e| panic!("sample {i}: {e}"));
    }
    drop(ds);

    args.retain(|a| *a != "--verify");
    args.push("--resume");
    let (ok, out) = granary(&args);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 written") && out.contains("400 skipped"),
        "{out}"
    );
}

#[test]
#[ignore = "needs a real ScyllaDB/Cassandra: set GRANARY_TEST_SCYLLA=host:port (docs/scylla.md)"]
fn cql_real_missing_rows_wrong_sizes_and_a_table_without_size() {
    let fresh = Fresh::new(20);
    let (s, spec) = (&fresh.s, &fresh.spec);
    let mut opts = CqlIngestOptions::new(&spec.root, s.clone());
    opts.verify = true;
    ingest_cql::ingest(&opts, |_, _, _, _| {}).unwrap();

    let src = CqlSource::connect(s).unwrap();
    let catalog = src.catalog().unwrap();
    let (gone, grown) = (catalog.entries()[3].id, catalog.entries()[5].id);
    run_ddl(
        &src,
        &format!("DELETE FROM {} WHERE id = {gone}", s.data_ref()),
    );
    run_ddl(
        &src,
        &format!("UPDATE {} SET data = 0x00 WHERE id = {grown}", s.data_ref()),
    );
    let mut ds: Box<dyn SampleSource> = Box::new(CqlDataset::connect(s).unwrap());
    let results = fetch_all(&mut *ds);
    let err_of = |id: Uuid| {
        let i = (0..ds.len())
            .find(|&i| ds.describe(i).ends_with(&id.to_string()))
            .unwrap();
        results[&i].as_ref().unwrap_err()
    };
    let e = err_of(gone);
    assert_eq!(e.kind, FailureKind::NotFound, "{e}");
    assert!(
        !e.kind.retryable() && e.to_string().contains(&gone.to_string()),
        "{e}"
    );
    let e = err_of(grown);
    assert_eq!(e.kind, FailureKind::Short, "{e}");
    assert!(e.to_string().contains("length mismatch"), "{e}");
    assert_eq!(results.values().filter(|r| r.is_ok()).count(), 18);
    drop(ds);

    let mut bare = s.clone();
    bare.metadata_table = "bare".into();
    run_ddl(
        &src,
        &format!(
            "CREATE TABLE {}.bare (id uuid PRIMARY KEY, label int)",
            s.keyspace
        ),
    );
    let e = CqlSource::connect(&bare).unwrap().catalog().unwrap_err();
    assert!(matches!(e, CqlError::Schema(_)), "{e}");
    assert!(e.to_string().contains("ADD size int"), "{e}");
}
