//! The prepare stage over a filesystem source of generated JPEGs.

use super::image::tests::jpeg;
use super::image::{prepare, Scratch, Spec};
use super::*;
use crate::config::{ByteSize, ResizeMode};
use crate::source::{Catalog, FsSource};
use std::time::Instant;

fn config(h: u32, w: u32) -> PrepareConfig {
    PrepareConfig {
        resize: [h, w],
        mode: ResizeMode::Crop,
        threads: 2,
        max_pixels: 999_999,
        max_input_bytes: ByteSize(400_000),
        staging_bytes: ByteSize(1 << 20),
    }
}

/// A folder of JPEGs (class `cat`) and the bytes of each, in catalog
/// order: `n` good ones, then a corrupt one, then one of 1000x1000 pixels
/// (over `max_pixels`), then one over `max_input_bytes`.
fn dataset(n: usize) -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cat")).unwrap();
    let mut files = Vec::new();
    for i in 0..n {
        files.push(jpeg(120 + 7 * i as u16, 90 + 3 * i as u16, i as u8));
    }
    let mut corrupt = jpeg(100, 100, 0);
    corrupt.truncate(30);
    files.push(corrupt);
    files.push(jpeg(1000, 1000, 1));
    files.push(vec![0xFF; 500_000]);
    for (i, f) in files.iter().enumerate() {
        std::fs::write(dir.path().join(format!("cat/{i:03}.jpg")), f).unwrap();
    }
    (dir, files)
}

fn source(root: &std::path::Path, cfg: &PrepareConfig) -> PreparedSource {
    let fs = FsSource::new(Catalog::from_dir(root).unwrap(), 4, Duration::from_secs(5)).unwrap();
    PreparedSource::new(Box::new(fs), cfg).unwrap()
}

#[test]
fn every_sample_is_prepared_into_its_extent_and_bad_ones_fail_with_decode() {
    let (dir, files) = dataset(9);
    let cfg = config(24, 32);
    let mut src = source(dir.path(), &cfg);
    let out = 24 * 32 * 3;
    assert_eq!(src.len(), files.len() as u64);
    for i in 0..src.len() {
        assert_eq!(src.meta(i).size, out as u64);
    }
    assert_eq!(src.total_bytes(), files.len() as u64 * out as u64);

    let arena = Arena::heap(files.len() as u64 * 8192).unwrap();
    let mut results: HashMap<u64, Result<u32, SampleError>> = HashMap::new();
    let mut next = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while results.len() < files.len() {
        assert!(Instant::now() < deadline, "not all samples completed");
        while next < src.len() {
            let dest = arena.slice(next * 8192, out).unwrap();
            match src.submit(next, next, dest) {
                Ok(()) => next += 1,
                Err(SourceFull) => break,
            }
        }
        assert!(src.in_flight() <= src.capacity() as usize);
        let mut done = Vec::new();
        src.poll_completions(Some(Duration::from_millis(100)), &mut done)
            .unwrap();
        for c in done {
            assert!(
                results.insert(c.tag, c.result).is_none(),
                "twice: {}",
                c.tag
            );
        }
    }
    assert_eq!(src.in_flight(), 0);
    let spec = Spec::from_config(&cfg);
    for (i, f) in files.iter().enumerate() {
        let r = &results[&(i as u64)];
        if i < 9 {
            assert_eq!(r, &Ok(out as u32), "sample {i}");
            let mut want = vec![0u8; out];
            prepare(f, &spec, &mut Scratch::default(), &mut want).unwrap();
            assert_eq!(arena.read_at(i as u64 * 8192, out).unwrap(), want, "{i}");
        } else {
            let e = r.as_ref().expect_err(&format!("sample {i}"));
            assert_eq!(e.kind, FailureKind::Decode, "{i}: {e}");
            assert!(!e.kind.retryable());
            assert!(e.message.contains(&format!("{i:03}.jpg")), "{e}");
            let why = ["not a decodable JPEG", "max_pixels", "max_input_bytes"][i - 9];
            assert!(e.message.contains(why), "{i}: {e}");
        }
    }
    // Every staging extent came back.
    assert!(src.staged.check().is_ok());
    assert!(src
        .staged
        .alloc(src.staging.size(), STAGING_ALIGN)
        .is_some());
}

#[test]
fn a_missing_file_keeps_its_kind() {
    let (dir, _) = dataset(2);
    let mut src = source(dir.path(), &config(8, 8));
    std::fs::remove_file(dir.path().join("cat/001.jpg")).unwrap();
    let arena = Arena::heap(1 << 16).unwrap();
    src.submit(7, 1, arena.slice(0, 192).unwrap()).unwrap();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while done.is_empty() && Instant::now() < deadline {
        src.poll_completions(Some(Duration::from_millis(100)), &mut done)
            .unwrap();
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 7);
    assert_eq!(
        done[0].result.as_ref().unwrap_err().kind,
        FailureKind::NotFound
    );
    assert_eq!(src.in_flight(), 0);
}

#[test]
fn the_settings_are_part_of_the_fingerprint() {
    let (dir, _) = dataset(3);
    let a = source(dir.path(), &config(16, 16));
    let fp = |s: &dyn SampleSource| crate::peers::fingerprint("d", s);
    let same = source(dir.path(), &config(16, 16));
    assert_eq!(fp(&a), fp(&same));
    let bigger = source(dir.path(), &config(16, 17));
    let stretch = source(
        dir.path(),
        &PrepareConfig {
            mode: ResizeMode::Stretch,
            ..config(16, 16)
        },
    );
    let raw = FsSource::new(
        Catalog::from_dir(dir.path()).unwrap(),
        4,
        Duration::from_secs(5),
    )
    .unwrap();
    let all = [fp(&a), fp(&bigger), fp(&stretch), fp(&raw)];
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            assert_ne!(all[i], all[j], "{i} vs {j}");
        }
    }
    // Threads and limits do not change the output: they are not in it.
    let more_threads = source(
        dir.path(),
        &PrepareConfig {
            threads: 5,
            ..config(16, 16)
        },
    );
    assert_eq!(fp(&a), fp(&more_threads));
}

#[test]
fn a_full_staging_buffer_holds_reads_back_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cat")).unwrap();
    let files: Vec<Vec<u8>> = (0..24).map(|i| jpeg(40 + i, 30 + i, i as u8)).collect();
    for (i, f) in files.iter().enumerate() {
        assert!(f.len() <= 4096, "{} bytes", f.len());
        std::fs::write(dir.path().join(format!("cat/{i:03}.jpg")), f).unwrap();
    }
    // Room for three staged files, a read limit of 32.
    let cfg = PrepareConfig {
        max_input_bytes: ByteSize(4096),
        staging_bytes: ByteSize(3 * 4096),
        threads: 1,
        ..config(8, 8)
    };
    let fs = FsSource::new(
        Catalog::from_dir(dir.path()).unwrap(),
        32,
        Duration::from_secs(5),
    )
    .unwrap();
    let mut src = PreparedSource::new(Box::new(fs), &cfg).unwrap();
    let out = 8 * 8 * 3;
    let arena = Arena::heap(24 * 4096).unwrap();
    let mut ok = 0;
    let mut next = 0u64;
    let mut held_back = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while ok < files.len() {
        assert!(
            Instant::now() < deadline,
            "{ok} of {} completed",
            files.len()
        );
        while next < src.len() {
            match src.submit(next, next, arena.slice(next * 4096, out).unwrap()) {
                Ok(()) => next += 1,
                Err(SourceFull) => {
                    held_back += 1;
                    break;
                }
            }
        }
        assert!(src.in_flight() <= 3, "{} in flight", src.in_flight());
        let mut done = Vec::new();
        src.poll_completions(Some(Duration::from_millis(50)), &mut done)
            .unwrap();
        for c in done {
            assert_eq!(c.result, Ok(out as u32), "sample {}", c.tag);
            ok += 1;
        }
    }
    assert!(held_back > 0, "the staging buffer never filled");
    let spec = Spec::from_config(&cfg);
    for (i, f) in files.iter().enumerate() {
        let mut want = vec![0u8; out];
        prepare(f, &spec, &mut Scratch::default(), &mut want).unwrap();
        assert_eq!(arena.read_at(i as u64 * 4096, out).unwrap(), want, "{i}");
    }
    assert_eq!(src.in_flight(), 0);
}
