use super::*;

const FIXTURE: &[u8] = include_bytes!("testdata/shardindex.json");
const ROOT: Place<'static> = Place::Root("/data/wds");
const BUCKET: Place<'static> = Place::Bucket {
    bucket: "b",
    prefix: "train/wds",
};

fn one(url: &str, place: Place<'_>, index_path: &str) -> Result<String, String> {
    let text =
        format!(r#"{{"wids_version": 1, "shardlist": [{{"url": "{url}", "nsamples": 1}}]}}"#);
    parse(text.as_bytes(), index_path, "idx", place)
        .map(|s| s[0].path.clone())
        .map_err(|e| e.reason)
}

#[test]
fn the_index_widsindex_writes_gives_its_shards_in_order() {
    let shards = parse(FIXTURE, "shardindex.json", "idx", ROOT).unwrap();
    let got: Vec<(&str, u64, Option<u64>)> = shards
        .iter()
        .map(|s| (s.path.as_str(), s.nsamples, s.filesize))
        .collect();
    assert_eq!(
        got,
        [
            ("a-shard.tar", 5, Some(20480)),
            ("b-shard.tar", 3, Some(10240)),
            ("c-shard.tar", 4, Some(10240)),
        ]
    );
    // In a folder of the root, its shards are in that folder.
    let shards = parse(FIXTURE, "meta/shardindex.json", "idx", BUCKET).unwrap();
    assert_eq!(shards[2].path, "meta/c-shard.tar");
    assert_eq!(shards[2].url, "c-shard.tar");
}

#[test]
fn urls_resolve_as_wids_resolves_them_inside_the_dataset_only() {
    assert_eq!(one("x/./y.tar", ROOT, "i.json").unwrap(), "x/y.tar");
    assert_eq!(one("../y.tar", ROOT, "m/i.json").unwrap(), "y.tar");
    assert_eq!(
        one("/data/wds/x/y.tar", ROOT, "m/i.json").unwrap(),
        "x/y.tar"
    );
    assert_eq!(
        one("file:///data/wds/y.tar", ROOT, "i.json").unwrap(),
        "y.tar"
    );
    assert_eq!(
        one("s3://b/train/wds/s/y.tar", BUCKET, "i.json").unwrap(),
        "s/y.tar"
    );
    assert_eq!(one("/train/wds/y.tar", BUCKET, "i.json").unwrap(), "y.tar");
    let refused = [
        ("../y.tar", ROOT, "i.json", "climbs out"),
        ("/data/other/y.tar", ROOT, "i.json", "outside the dataset"),
        ("/data/wdsx/y.tar", ROOT, "i.json", "outside the dataset"),
        (
            "s3://c/train/wds/y.tar",
            BUCKET,
            "i.json",
            "not in the dataset's bucket",
        ),
        (
            "s3://b/train/y.tar",
            BUCKET,
            "i.json",
            "outside the dataset",
        ),
        (
            "s3://b/train/wds/y.tar",
            ROOT,
            "i.json",
            "S3 URL in a filesystem",
        ),
        ("file:///y.tar", BUCKET, "i.json", "file URL in an S3"),
        ("https://host/y.tar", ROOT, "i.json", "another store"),
        ("y.tar.gz", ROOT, "i.json", "not a .tar file"),
        (".", ROOT, "i.json", "names no file"),
    ];
    for (url, place, index, want) in refused {
        let e = one(url, place, index).unwrap_err();
        assert!(e.contains(want), "{url}: {e}");
    }
}

#[test]
fn components_resolve_against_their_base_and_other_indexes_are_refused() {
    let text = br#"{"wids_version": 1,
        "shardlist": [{"url": "a.tar", "nsamples": 2}],
        "datasets": [
            {"base": "more", "shardlist": [{"url": "b.tar", "nsamples": 3, "filesize": 10240}]},
            {"shardlist": [{"url": "c.tar", "nsamples": 1}]}
        ]}"#;
    let shards = parse(text, "m/i.json", "idx", ROOT).unwrap();
    let paths: Vec<&str> = shards.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["m/a.tar", "m/more/b.tar", "m/c.tar"]);

    let refused: [(&[u8], &str); 7] = [
        (
            br#"{"wids_version": 1, "datasets": [{"source_url": "other.json"}]}"#,
            "refers to another index (other.json)",
        ),
        (br#"{"wids_version": 2, "shardlist": []}"#, "wids_version 2"),
        (
            br#"{"shardlist": [{"url": "a.tar", "nsamples": 1}]}"#,
            "no wids_version",
        ),
        (
            br#"{"__kind__": "other", "wids_version": 1, "shardlist": []}"#,
            "__kind__ is \"other\"",
        ),
        (br#"{"wids_version": 1, "shardlist": []}"#, "lists no shard"),
        (
            br#"{"wids_version": 1, "shardlist": [{"url": "a.tar"}]}"#,
            "not a wids shard index: missing field `nsamples`",
        ),
        (
            br#"{"wids_version": 1, "shardlist": [{"url": "a.tar", "nsamples": 1},
                {"url": "./a.tar", "nsamples": 1}]}"#,
            "listed twice",
        ),
    ];
    for (text, want) in refused {
        let e = parse(text, "i.json", "idx", ROOT).unwrap_err();
        assert_eq!(e.shard, "idx");
        assert!(e.reason.contains(want), "{want}: {}", e.reason);
    }
}

#[test]
fn a_shard_that_differs_from_the_index_is_stale() {
    let shards = parse(FIXTURE, "shardindex.json", "idx", ROOT).unwrap();
    let a = &shards[0];
    assert!(check("idx", "/d/a-shard.tar", a, Some(20480), None).is_ok());
    assert!(check("idx", "/d/a-shard.tar", a, None, Some(5)).is_ok());
    let e = check("idx", "/d/a-shard.tar", a, Some(30720), None).unwrap_err();
    assert_eq!(e.shard, "/d/a-shard.tar");
    assert!(
        e.reason
            .contains("the wids index idx says 20480 bytes, the shard holds 30720 bytes"),
        "{}",
        e.reason
    );
    let e = check("idx", "/d/a-shard.tar", a, None, Some(4)).unwrap_err();
    assert!(e
        .reason
        .contains("says 5 samples, the shard holds 4 samples"));
    // Without a filesize, only the count is checked.
    let no_size = WidsShard {
        filesize: None,
        ..a.clone()
    };
    assert!(check("idx", "a", &no_size, Some(1), Some(5)).is_ok());
}

/// The fixture's shards in a fresh folder, with `index` (if any) as
/// `shardindex.json`.
fn fixture_root(index: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let data =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/source/shards/wids/testdata");
    for name in ["a-shard.tar", "b-shard.tar", "c-shard.tar"] {
        std::fs::copy(data.join(name), dir.path().join(name)).unwrap();
    }
    if let Some(text) = index {
        std::fs::write(dir.path().join("shardindex.json"), text).unwrap();
    }
    dir
}

/// `(shard file name, label)` of each sample of the fs index of `root`.
fn fs_samples(
    root: &std::path::Path,
    wids: Option<(&str, bool)>,
) -> Result<Vec<(String, i32)>, String> {
    let (catalog, _) = crate::source::fs::shards::index_webdataset(root, "cls", wids)
        .map_err(|e| e.to_string())?;
    Ok(catalog
        .entries()
        .iter()
        .map(|e| {
            let name = e.path.file_name().unwrap().to_string_lossy().into_owned();
            (name, e.label)
        })
        .collect())
}

#[test]
fn a_filesystem_dataset_takes_the_shards_of_its_index_in_its_order() {
    let labels = |name: &str, range: std::ops::Range<i32>| -> Vec<(String, i32)> {
        range.map(|l| (name.to_owned(), l)).collect()
    };
    // widsindex's own index: every shard, in its (URL) order.
    let dir = fixture_root(Some(std::str::from_utf8(FIXTURE).unwrap()));
    let all = fs_samples(dir.path(), Some(("shardindex.json", false))).unwrap();
    let want: Vec<_> = [
        labels("a-shard.tar", 20..25),
        labels("b-shard.tar", 0..3),
        labels("c-shard.tar", 10..14),
    ]
    .concat();
    assert_eq!(all, want);
    // An index of two shards, in another order: those, in its order.
    let two = r#"{"wids_version": 1, "shardlist": [
        {"url": "./c-shard.tar", "nsamples": 4, "filesize": 10240},
        {"url": "a-shard.tar", "nsamples": 5}]}"#;
    let dir = fixture_root(Some(two));
    let got = fs_samples(dir.path(), Some(("shardindex.json", false))).unwrap();
    assert_eq!(
        got,
        [labels("c-shard.tar", 10..14), labels("a-shard.tar", 20..25)].concat()
    );
    // Not looked for, or not there: every .tar file listed.
    assert_eq!(fs_samples(dir.path(), None).unwrap(), want);
    let none = fixture_root(None);
    assert_eq!(
        fs_samples(none.path(), Some(("shardindex.json", false))).unwrap(),
        want
    );
    let e = fs_samples(none.path(), Some(("train.json", true))).unwrap_err();
    assert!(
        e.contains("train.json") && e.contains("read the wids index"),
        "{e}"
    );
}

#[test]
fn a_stale_index_fails_the_filesystem_dataset_naming_the_shard() {
    let cases = [
        (
            r#"{"url": "b-shard.tar", "nsamples": 4}"#,
            "says 4 samples, the shard holds 3 samples",
        ),
        (
            r#"{"url": "b-shard.tar", "nsamples": 3, "filesize": 9999}"#,
            "says 9999 bytes, the shard holds 10240 bytes",
        ),
    ];
    for (entry, want) in cases {
        let dir = fixture_root(Some(&format!(
            r#"{{"wids_version": 1, "shardlist": [{entry}]}}"#
        )));
        let e = fs_samples(dir.path(), Some(("shardindex.json", false))).unwrap_err();
        assert!(e.contains("b-shard.tar") && e.contains(want), "{e}");
    }
    let dir = fixture_root(Some(
        r#"{"wids_version": 1, "shardlist": [{"url": "gone.tar", "nsamples": 1}]}"#,
    ));
    let e = fs_samples(dir.path(), Some(("shardindex.json", false))).unwrap_err();
    assert!(e.contains("gone.tar"), "{e}");
}
