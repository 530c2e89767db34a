//! The S3 source and `granary ingest` against a real S3 server: SeaweedFS
//! (`weed mini`) on loopback, started and stopped by each test (see
//! `common_s3`). Credentials are enforced by the server, so every request is
//! really signed.

mod common_s3;

use common_s3::delay_proxy::DelayProxy;
use common_s3::{upload, weed_and_synth, Seaweed, BUCKET};
use granary_agent::source::queue::IoCompletion as Completion;
use granary_agent::source::s3::fault::FaultyStore;
use granary_agent::source::s3::{
    fetch_error, is_retryable, FetchOptions, FetchRequest, FetchStats, S3Catalog, S3Layout,
    S3Source,
};
use granary_agent::source::Catalog;
use granary_shm::arena::{Arena, ArenaSlice};
use granary_tools::ingest::{self, IngestOptions};
use granary_tools::synth::verify_sample;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Fetches every sample of `catalog` into one buffer with `capacity` in
/// flight (the queue kept full); `on_completion(n)` runs after the n-th
/// sample is done. The fetcher makes one attempt per request; like the
/// engine's retry policy, a sample whose fetch failed with a retryable
/// error is submitted again after [`RESUBMIT_DELAY`], up to
/// [`RESUBMITS`] times. Returns the buffer, each sample's span, the final
/// result by sample, the most seen in flight, the resubmissions and the
/// fetcher's counters.
struct Fetched {
    buf: Vec<u8>,
    spans: Vec<(usize, usize)>,
    results: Vec<Option<io::Result<u32>>>,
    max_in_flight: usize,
    resubmits: u64,
    stats: FetchStats,
    elapsed: Duration,
}

/// Most resubmissions of one sample in [`fetch_all`].
const RESUBMITS: u32 = 100;
/// Wait before a resubmission in [`fetch_all`].
const RESUBMIT_DELAY: Duration = Duration::from_millis(50);

fn fetch_all(
    source: &S3Source,
    catalog: &S3Catalog,
    options: FetchOptions,
    mut on_completion: impl FnMut(usize),
) -> Fetched {
    let mut spans = Vec::new();
    let mut total = 0usize;
    for e in catalog.entries() {
        spans.push((total, e.size as usize));
        total += e.size as usize;
    }
    let arena = Arena::heap(total.max(1) as u64).unwrap();
    let mut fetcher = source.fetcher_with(options).unwrap();
    let mut results: Vec<Option<io::Result<u32>>> = (0..catalog.len()).map(|_| None).collect();
    let mut tries = vec![0u32; catalog.len()];
    let mut ready: std::collections::VecDeque<usize> = (0..catalog.len()).collect();
    let mut later: Vec<(Instant, usize)> = Vec::new();
    let mut done = 0usize;
    let mut resubmits = 0u64;
    let mut max_in_flight = 0;
    let mut out: Vec<Completion> = Vec::new();
    let t0 = Instant::now();
    while done < catalog.len() {
        let now = Instant::now();
        later.retain(|&(at, i)| {
            if at <= now {
                ready.push_back(i);
            }
            at > now
        });
        while let Some(&i) = ready.front() {
            let (at, len) = spans[i];
            let dest = arena.slice(at as u64, len).unwrap();
            let req = catalog.request(i as u64, i as u64, dest).unwrap();
            match fetcher.submit(req) {
                Ok(()) => {
                    ready.pop_front();
                }
                Err(_) => break,
            }
        }
        max_in_flight = max_in_flight.max(fetcher.in_flight());
        out.clear();
        let wait = if later.is_empty() { 200 } else { 10 };
        fetcher
            .poll_completions(Some(Duration::from_millis(wait)), &mut out)
            .unwrap();
        for c in out.drain(..) {
            let i = c.tag as usize;
            assert!(results[i].is_none(), "sample {i} completed twice");
            if let Err(e) = &c.result {
                if is_retryable(e) && tries[i] < RESUBMITS {
                    tries[i] += 1;
                    resubmits += 1;
                    later.push((Instant::now() + RESUBMIT_DELAY, i));
                    continue;
                }
            }
            results[i] = Some(c.result);
            done += 1;
            on_completion(done);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "fetch stalled at {done}"
        );
    }
    let elapsed = t0.elapsed();
    let stats = fetcher.stats();
    drop(fetcher);
    Fetched {
        buf: arena.read_at(0, total).unwrap(),
        spans,
        results,
        max_in_flight,
        resubmits,
        stats,
        elapsed,
    }
}

/// Checks that every sample arrived and is the synthetic sample it should be.
fn verify_all(catalog: &S3Catalog, f: &Fetched) {
    for (i, e) in catalog.entries().iter().enumerate() {
        match &f.results[i] {
            Some(Ok(n)) => assert_eq!(u64::from(*n), e.size),
            other => panic!("sample {i} ({}): {other:?}", e.key),
        }
        let (at, len) = f.spans[i];
        let info = verify_sample(&f.buf[at..at + len])
            .unwrap_or_else(|err| panic!("sample {i} ({}): {err}", e.key));
        assert_eq!(info.file_id, i as u64, "{}", e.key);
        assert_eq!(i64::from(info.class), i64::from(e.label), "{}", e.key);
    }
}

fn options(capacity: u32) -> FetchOptions {
    FetchOptions {
        capacity,
        ..FetchOptions::default()
    }
}

#[test]
fn ingest_list_fetch_and_resume() {
    let (weed, tmp, spec) = weed_and_synth(300, 7, 20_000);
    // Upload with read-back (the command line's own test is in
    // tools/tests/ingest_cli.rs).
    let t0 = Instant::now();
    let mut opts = IngestOptions::new(&spec.root, weed.settings(), "datasets/synth");
    opts.concurrency = 16;
    opts.verify = true;
    let r = ingest::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!(
        (r.files, r.uploaded, r.skipped, r.verified),
        (300, 300, 0, 300)
    );
    eprintln!(
        "ingest --verify of 300 files: {:.2} s",
        t0.elapsed().as_secs_f64()
    );

    // A changed file is uploaded again by resume; verify catches nothing.
    opts.verify = false;
    opts.resume = true;
    let r = ingest::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!((r.uploaded, r.skipped), (0, 300));
    let changed = spec.path_of(17);
    let original = std::fs::read(&changed).unwrap();
    std::fs::write(&changed, b"short").unwrap();
    opts.verify = true;
    let r = ingest::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!((r.uploaded, r.skipped, r.verified), (1, 299, 300));
    std::fs::write(&changed, &original).unwrap();
    let r = ingest::ingest(&opts, |_, _, _, _| {}).unwrap();
    assert_eq!((r.uploaded, r.skipped), (1, 299));

    // The S3 catalog equals the filesystem catalog of the folder.
    let source = S3Source::connect(&weed.settings(), 64).unwrap();
    let catalog = source
        .catalog(&S3Layout::Prefix("datasets/synth".into()))
        .unwrap();
    let local = Catalog::from_dir(&spec.root).unwrap();
    assert_eq!(catalog.len(), 300);
    assert_eq!(catalog.total_bytes(), local.total_bytes());
    let names: Vec<String> = local
        .class_names()
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(catalog.class_names(), names.as_slice());
    for (s, l) in catalog.entries().iter().zip(local.entries()) {
        let rel = l.path.strip_prefix(&spec.root).unwrap().to_str().unwrap();
        assert_eq!(s.key.as_ref(), format!("datasets/synth/{rel}"));
        assert_eq!(
            (s.sample_id, s.label, s.size),
            (l.sample_id, l.label, l.size)
        );
        assert!(s.whole_object && s.offset == 0);
    }

    // Every sample through the fetcher, 64 in flight, verified byte by byte.
    let f = fetch_all(&source, &catalog, options(64), |_| {});
    verify_all(&catalog, &f);
    assert_eq!(f.max_in_flight, 64);
    assert_eq!((f.stats.requests, f.stats.failures), (300, 0));
    eprintln!(
        "fetched 300 samples ({:.1} MB) in {:.3} s, 64 in flight",
        catalog.total_bytes() as f64 / 1e6,
        f.elapsed.as_secs_f64()
    );

    // A manifest object: whole objects and byte ranges of them.
    let e5 = &catalog.entries()[5];
    let e9 = &catalog.entries()[9];
    let manifest = format!(
        "# test manifest\n{k9}\t4\n/{k5}\t-1\t100\t900\n{k9}\t2\t0\t40\n",
        k9 = e9.key.as_ref().trim_start_matches("datasets/"),
        k5 = e5.key.as_ref()
    );
    let mpath = tmp.path().join("manifest.tsv");
    std::fs::write(&mpath, &manifest).unwrap();
    let store = source.store().clone();
    source
        .block_on(store.put_opts(
            &"datasets/train.tsv".into(),
            manifest.into_bytes().into(),
            Default::default(),
        ))
        .unwrap();
    let m = source
        .catalog(&S3Layout::ManifestObject("datasets/train.tsv".into()))
        .unwrap();
    let shape: Vec<_> = m
        .entries()
        .iter()
        .map(|e| (e.key.to_string(), e.label, e.offset, e.size, e.whole_object))
        .collect();
    assert_eq!(
        shape,
        [
            (e9.key.to_string(), 4, 0, e9.size, true),
            (e5.key.to_string(), -1, 100, 900, false),
            (e9.key.to_string(), 2, 0, 40, false),
        ]
    );
    let f = fetch_all(&source, &m, options(8), |_| {});
    let file5 = std::fs::read(spec.path_of(5)).unwrap();
    let file9 = std::fs::read(spec.path_of(9)).unwrap();
    assert_eq!(&f.buf[f.spans[0].0..][..f.spans[0].1], &file9[..]);
    assert_eq!(&f.buf[f.spans[1].0..][..900], &file5[100..1000]);
    assert_eq!(&f.buf[f.spans[2].0..][..40], &file9[..40]);
    // The same manifest as a local file (keys from the bucket root fail:
    // they are relative to the folder of a manifest object only).
    let e = source
        .catalog(&S3Layout::ManifestFile(mpath))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("manifest.tsv:2:") && e.contains("not found"),
        "{e}"
    );
}

#[test]
fn five_percent_injected_failures_still_deliver_every_sample() {
    let (weed, _tmp, spec) = weed_and_synth(300, 5, 8_000);
    upload(&weed, &spec.root, "faulty");
    let settings = weed.settings();
    let faulty = Arc::new(FaultyStore::new(settings.build_store().unwrap(), 0.05, 7));
    let opts = options(64);
    let source = S3Source::with_store(faulty.clone(), BUCKET, opts.clone()).unwrap();
    let catalog = source.catalog(&S3Layout::Prefix("faulty".into())).unwrap();
    assert_eq!(catalog.len(), 300);
    let f = fetch_all(&source, &catalog, opts, |_| {});
    verify_all(&catalog, &f);
    let (before, during) = faulty.injected();
    eprintln!(
        "{} GETs, {before} failed before the response, {during} in the body; {} resubmitted",
        faulty.gets(),
        f.resubmits
    );
    assert!(before > 0 && during > 0, "{before} {during}");
    // Every injected failure failed one request, which was retryable.
    assert_eq!(f.resubmits, before + during);
    assert_eq!(f.stats.failures, before + during);
    assert_eq!(f.stats.attempts, f.stats.requests);
}

#[test]
fn server_killed_and_restarted_mid_fetch_loses_nothing() {
    let (mut weed, _tmp, spec) = weed_and_synth(600, 6, 8_000);
    upload(&weed, &spec.root, "restart");
    let mut settings = weed.settings();
    settings.request_timeout = Duration::from_secs(2);
    let source = S3Source::connect(&settings, 16).unwrap();
    let catalog = source.catalog(&S3Layout::Prefix("restart".into())).unwrap();
    let opts = source.options().clone();

    let mut restarter = None;
    let mut weed_slot = Some(weed);
    let f = fetch_all(&source, &catalog, opts, |done| {
        if done == 100 {
            let mut w = weed_slot.take().unwrap();
            w.kill();
            eprintln!("server killed after {done} samples");
            restarter = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(1));
                let t0 = Instant::now();
                w.restart();
                eprintln!(
                    "server back after {:.2} s",
                    t0.elapsed().as_secs_f64() + 1.0
                );
                w
            }));
        }
    });
    weed = restarter.expect("the kill happened").join().unwrap();
    verify_all(&catalog, &f);
    eprintln!(
        "600 samples, {} resubmitted, {} timeouts, {:.2} s",
        f.resubmits,
        f.stats.timeouts,
        f.elapsed.as_secs_f64()
    );
    assert!(f.resubmits > 0);
    assert_eq!(f.stats.failures, f.resubmits);
    // The restarted server still holds everything.
    let again = source.catalog(&S3Layout::Prefix("restart".into())).unwrap();
    assert_eq!(again, catalog);
    drop(weed);
}

#[test]
fn missing_keys_and_bad_credentials_fail_at_once_naming_the_key() {
    let weed = Seaweed::start();
    let source = S3Source::connect(&weed.settings(), 8).unwrap();
    let mut fetcher = source.fetcher().unwrap();
    let buf = heap(64);
    let e = fetch_one(
        &mut fetcher,
        FetchRequest::whole(1, "no/such/key.bin", 64, whole(&buf)),
    )
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(!is_retryable(&e));
    assert!(e.to_string().contains("no/such/key.bin"), "{e}");
    assert_eq!(fetch_error(&e).unwrap().attempts, 1);

    let mut bad = weed.settings();
    bad.secret_access_key = Some("not-the-secret".into());
    let source = S3Source::connect(&bad, 8).unwrap();
    let mut fetcher = source.fetcher().unwrap();
    let e = fetch_one(
        &mut fetcher,
        FetchRequest::whole(1, "any.bin", 64, whole(&buf)),
    )
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(!is_retryable(&e));
    assert!(e.to_string().contains("any.bin"), "{e}");
    let e = source.catalog(&S3Layout::Prefix("x".into())).unwrap_err();
    assert!(e.to_string().contains("403"), "{e}");
}

#[test]
fn an_object_replaced_after_cataloguing_is_a_clear_per_sample_error() {
    use granary_agent::source::queue::changed;
    use object_store::ObjectStoreExt;
    let (weed, _tmp, spec) = weed_and_synth(6, 1, 3_000);
    upload(&weed, &spec.root, "versions");
    let source = S3Source::connect(&weed.settings(), 8).unwrap();
    let catalog = source
        .catalog(&S3Layout::Prefix("versions".into()))
        .unwrap();
    assert!(
        catalog.entries().iter().all(|e| e.etag.is_some()),
        "the listing gives every object's ETag"
    );
    // Sample 1 replaced by other bytes of the same size, sample 2 by a
    // longer object; the others untouched.
    let store = source.store().clone();
    let put = |i: usize, bytes: Vec<u8>| {
        let key = catalog.entries()[i].key.clone();
        source.block_on(store.put(&key, bytes.into())).expect("put");
    };
    let size1 = catalog.entries()[1].size as usize;
    put(1, vec![0x5a; size1]);
    put(2, vec![0x11; catalog.entries()[2].size as usize + 7]);
    let mut fetcher = source.fetcher().unwrap();
    for (i, e) in catalog.entries().iter().enumerate() {
        let buf = heap(e.size as usize);
        let req = catalog.request(i as u64, 1, whole(&buf)).unwrap();
        let got = fetch_one(&mut fetcher, req);
        match i {
            1 | 2 => {
                let err = got.expect_err("a replaced object");
                let c = changed(&err).unwrap_or_else(|| panic!("sample {i}: {err}"));
                assert!(err.to_string().contains(e.key.as_ref()), "{err}");
                assert!(!is_retryable(&err));
                eprintln!("sample {i}: {c}");
            }
            _ => {
                assert_eq!(got.unwrap(), e.size as u32);
                verify_sample(&read_back(&buf)).expect("original bytes");
            }
        }
    }
}

#[test]
fn a_request_slower_than_the_timeout_fails_then_succeeds_without_the_delay() {
    let (weed, _tmp, spec) = weed_and_synth(4, 1, 4_000);
    upload(&weed, &spec.root, "slow");
    let proxy = DelayProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        weed.s3_addr(),
        Duration::from_millis(400),
        None,
    )
    .unwrap();
    let mut settings = weed.settings_via(proxy.local_addr());
    settings.request_timeout = Duration::from_millis(300);
    let source = S3Source::connect(&settings, 8).unwrap();
    let key = "slow/class_000/img_00000000.bin";
    let len = std::fs::metadata(spec.path_of(0)).unwrap().len() as u32;
    let buf = heap(len as usize);
    let mut fetcher = source.fetcher().unwrap();
    let t0 = Instant::now();
    let e = fetch_one(&mut fetcher, FetchRequest::whole(1, key, len, whole(&buf))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(is_retryable(&e));
    assert!(
        e.to_string().contains(key) && e.to_string().contains("300 ms"),
        "{e}"
    );
    // One attempt, cut at the timeout.
    assert_eq!(fetcher.stats().timeouts, 1);
    assert_eq!(fetcher.stats().attempts, 1);
    assert!(t0.elapsed() >= Duration::from_millis(300));

    proxy.set_delay(Duration::ZERO);
    let n = fetch_one(&mut fetcher, FetchRequest::whole(2, key, len, whole(&buf))).unwrap();
    assert_eq!(n, len);
    let bytes = read_back(&buf);
    assert_eq!(bytes, std::fs::read(spec.path_of(0)).unwrap());
    verify_sample(&bytes).unwrap();
}

/// Throughput of whole-sample GETs from SeaweedFS on loopback, at 64 and
/// 256 in flight (`cargo test --release -p granary-agent --test s3_source
/// -- --ignored --nocapture`).
#[test]
#[ignore = "measurement; run by hand"]
fn fetch_throughput() {
    let (weed, _tmp, spec) = weed_and_synth(2000, 20, 110_000);
    let t0 = Instant::now();
    let mut opts = IngestOptions::new(&spec.root, weed.settings(), "tput");
    opts.concurrency = 64;
    ingest::ingest(&opts, |_, _, _, _| {}).unwrap();
    eprintln!("ingest of 2000 files: {:.1} s", t0.elapsed().as_secs_f64());
    let source = S3Source::connect(&weed.settings(), 256).unwrap();
    let catalog = source.catalog(&S3Layout::Prefix("tput".into())).unwrap();
    let mut rates: HashMap<u32, f64> = HashMap::new();
    for cap in [64u32, 256, 64, 256] {
        let f = fetch_all(&source, &catalog, options(cap), |_| {});
        verify_all(&catalog, &f);
        let rate = catalog.len() as f64 / f.elapsed.as_secs_f64();
        eprintln!(
            "{cap} in flight: {rate:.0} samples/s, {:.0} MB/s",
            catalog.total_bytes() as f64 / 1e6 / f.elapsed.as_secs_f64()
        );
        let best = rates.entry(cap).or_default();
        *best = best.max(rate);
    }
    eprintln!(
        "best: 64 in flight {:.0} samples/s, 256 in flight {:.0} samples/s",
        rates[&64], rates[&256]
    );
}

/// A heap arena of `len` bytes.
fn heap(len: usize) -> Arena {
    Arena::heap(len as u64).unwrap()
}

/// All of `arena`, as a destination.
fn whole(arena: &Arena) -> ArenaSlice {
    arena.slice(0, arena.size() as usize).unwrap()
}

/// The bytes of `arena`.
fn read_back(arena: &Arena) -> Vec<u8> {
    arena.read_at(0, arena.size() as usize).unwrap()
}

fn fetch_one(f: &mut granary_agent::source::s3::S3Fetcher, req: FetchRequest) -> io::Result<u32> {
    f.submit(req).unwrap();
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no completion");
        f.poll_completions(Some(Duration::from_secs(1)), &mut out)
            .unwrap();
    }
    out.pop().unwrap().result
}
