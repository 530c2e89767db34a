//! A dataset's identity across agents: its fingerprint
//! ([`granary_peer::fingerprint`], where the definition lives, since every
//! peer must agree on it), over a source's catalog: each sample's id, size
//! and version token ([`SampleSource::version`]).

use crate::source::SampleSource;

/// Dataset `name`'s fingerprint over `src`'s catalog.
pub fn fingerprint(name: &str, src: &dyn SampleSource) -> u64 {
    granary_peer::fingerprint::fingerprint(name, src.kind(), src.len(), |i, token| {
        src.version(i, token);
        let m = src.meta(i);
        (m.sample_id, m.size)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::s3::{FetchOptions, S3Dataset, S3Entry, S3Layout, S3Source};
    use crate::source::samples::{EntryMeta, SampleList};
    use crate::source::{Catalog, FsSource};
    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    /// The fingerprint of a catalog's sample list, as a source over it
    /// would give.
    fn of_list<E: EntryMeta>(name: &str, kind: &str, list: &SampleList<E>) -> u64 {
        granary_peer::fingerprint::fingerprint(name, kind, list.len() as u64, |i, token| {
            list.version(i, token);
            let m = list.meta(i);
            (m.sample_id, m.size)
        })
    }

    /// The fingerprint of one sample with `token` (the peer crate's tests
    /// hold it to the definition written out).
    fn by_hand(name: &str, kind: &str, id: u64, size: u64, token: &[u8]) -> u64 {
        granary_peer::fingerprint::fingerprint(name, kind, 1, |_, t| {
            t.extend_from_slice(token);
            (id, size)
        })
    }

    fn fs_source(root: &std::path::Path) -> FsSource {
        FsSource::new(Catalog::from_dir(root).unwrap(), 4, Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn files_that_differ_only_in_mtime_give_other_fingerprints() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cat")).unwrap();
        let f = dir.path().join("cat/0.bin");
        std::fs::write(&f, b"0123456789").unwrap();
        std::fs::write(dir.path().join("cat/1.bin"), b"abc").unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        let file = std::fs::File::options().write(true).open(&f).unwrap();
        file.set_modified(t0).unwrap();
        let a = fs_source(dir.path());
        // The same tree catalogued again, and under another mount point.
        assert_eq!(
            fingerprint("d", &fs_source(dir.path())),
            fingerprint("d", &a)
        );
        let other = tempfile::tempdir().unwrap();
        let moved = other.path().join("mnt");
        std::fs::rename(dir.path(), &moved).unwrap();
        assert_eq!(fingerprint("d", &fs_source(&moved)), fingerprint("d", &a));
        // One nanosecond of one file's mtime, same size and bytes.
        let f = moved.join("cat/0.bin");
        let file = std::fs::File::options().write(true).open(&f).unwrap();
        file.set_modified(t0 + Duration::from_nanos(1)).unwrap();
        let b = fs_source(&moved);
        assert_eq!(b.meta(0), a.meta(0));
        assert_ne!(fingerprint("d", &b), fingerprint("d", &a));
        // The token is the mtime, seconds then nanoseconds.
        let mut token = Vec::new();
        a.version(0, &mut token);
        let mut want = 1_700_000_000i64.to_le_bytes().to_vec();
        want.extend_from_slice(&5u32.to_le_bytes());
        assert_eq!(token, want);
        assert_eq!(fingerprint("d", &a), of_list("d", "fs", a.catalog()));
        assert_ne!(
            fingerprint("e", &a),
            fingerprint("d", &a),
            "the name counts"
        );
    }

    fn s3_dataset(store: &Arc<InMemory>) -> S3Dataset {
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let source = S3Source::with_store(dyn_store, "b", FetchOptions::default()).unwrap();
        let catalog = source.catalog(&S3Layout::Prefix("train".into())).unwrap();
        S3Dataset::with_parts(source, catalog).unwrap()
    }

    fn put(store: &InMemory, key: &str, bytes: &'static [u8]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.put(&ObjectPath::from(key), PutPayload::from_static(bytes)))
            .unwrap();
    }

    #[test]
    fn objects_that_differ_only_in_etag_give_other_fingerprints() {
        let store = Arc::new(InMemory::new());
        put(&store, "train/cat/0.jpg", b"0123456789");
        put(&store, "train/dog/1.jpg", b"abc");
        let a = s3_dataset(&store);
        assert!(
            a.catalog().entries()[0].etag.is_some(),
            "the store gives ETags"
        );
        assert_eq!(fingerprint("d", &s3_dataset(&store)), fingerprint("d", &a));
        // The same bytes written again: a new version, a new ETag.
        put(&store, "train/cat/0.jpg", b"0123456789");
        let b = s3_dataset(&store);
        assert_eq!(b.meta(0), a.meta(0));
        assert_ne!(b.catalog().entries()[0].etag, a.catalog().entries()[0].etag);
        assert_ne!(fingerprint("d", &b), fingerprint("d", &a));
        assert_eq!(fingerprint("d", &a), of_list("d", "s3", a.catalog()));
        // The token: key length and key, offset, ETag.
        let e = &a.catalog().entries()[1];
        let mut token = Vec::new();
        a.version(1, &mut token);
        let mut want = 15u32.to_le_bytes().to_vec();
        want.extend_from_slice(b"train/dog/1.jpg");
        want.extend_from_slice(&0u64.to_le_bytes());
        want.extend_from_slice(e.etag.as_deref().unwrap().as_bytes());
        assert_eq!(token, want);
        assert_eq!(
            of_list("d", "s3", &SampleList::new(vec![e.clone()])),
            by_hand("d", "s3", 1, 3, &want)
        );
    }

    #[test]
    fn ranges_keys_and_missing_etags_count_too() {
        let entry = S3Entry {
            sample_id: 0,
            key: ObjectPath::from("shard-0.tar"),
            label: -1,
            offset: 512,
            size: 100,
            whole_object: false,
            etag: None,
        };
        let fp = |e: &S3Entry| of_list("d", "s3", &SampleList::new(vec![e.clone()]));
        let base = fp(&entry);
        for changed in [
            S3Entry {
                offset: 1024,
                ..entry.clone()
            },
            S3Entry {
                key: ObjectPath::from("shard-1.tar"),
                ..entry.clone()
            },
            S3Entry {
                etag: Some(Arc::from("\"1\"")),
                ..entry.clone()
            },
        ] {
            assert_ne!(fp(&changed), base, "{changed:?}");
        }
    }

    #[test]
    fn rows_that_differ_only_in_crc_give_other_fingerprints() {
        use crate::source::cql::CqlCatalog;
        let id = uuid::Uuid::from_bytes([7; 16]);
        let other = uuid::Uuid::from_bytes([8; 16]);
        let cat = |rows: Vec<(uuid::Uuid, i32, u64, Option<u32>)>| {
            of_list("d", "cql", &CqlCatalog::from_rows("m", rows).unwrap())
        };
        let a = cat(vec![(id, 0, 10, Some(0xdead_beef))]);
        assert_eq!(a, cat(vec![(id, 0, 10, Some(0xdead_beef))]));
        assert_ne!(a, cat(vec![(id, 0, 10, Some(0xdead_bee0))]), "CRC");
        assert_ne!(a, cat(vec![(id, 0, 10, None)]), "no CRC column");
        assert_ne!(a, cat(vec![(other, 0, 10, Some(0xdead_beef))]), "row id");
        let mut want = id.as_bytes().to_vec();
        want.extend_from_slice(&0xdead_beef_u32.to_le_bytes());
        assert_eq!(a, by_hand("d", "cql", 0, 10, &want));
    }

    /// The cost for an ImageNet-sized S3 catalog (1,281,167 samples, keys
    /// and ETags of ImageNet's lengths). Run in release:
    /// `cargo test --release -p granary-agent --lib fingerprint_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, for docs/peers.md"]
    fn fingerprint_cost_of_an_imagenet_sized_catalog() {
        let n = 1_281_167u64;
        let entries: Vec<S3Entry> = (0..n)
            .map(|i| S3Entry {
                sample_id: i,
                key: ObjectPath::from(format!(
                    "imagenet/train/n{:08}/n{:08}_{i}.JPEG",
                    i / 1281,
                    i / 1281
                )),
                label: (i / 1281) as i32,
                offset: 0,
                size: 110_000 + i % 1000,
                whole_object: true,
                etag: Some(Arc::from(format!(
                    "\"{:032x}\"",
                    u128::from(i) * 0x9e37_79b9
                ))),
            })
            .collect();
        let list = SampleList::new(entries);
        let mut best = Duration::MAX;
        let mut fp = 0;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            fp = of_list("imagenet", "s3", &list);
            best = best.min(t.elapsed());
        }
        let mut token = Vec::new();
        list.version(0, &mut token);
        eprintln!(
            "fingerprint {fp:016x} of {n} samples ({} bytes of token each): best of 5 {:.0} ms",
            token.len(),
            best.as_secs_f64() * 1e3
        );
        assert!(best < Duration::from_secs(5), "{best:?}");
    }
}
