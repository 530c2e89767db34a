use super::*;

/// A column: name, encoding, size.
type Col<'a> = (&'a str, &'a str, Option<u64>);

/// An MDS shard of `records` (each a list of column values, in column
/// order) and its `index.json` entry for `columns` (name, encoding, size).
fn shard(columns: &[Col<'_>], records: &[Vec<Vec<u8>>]) -> (Vec<u8>, String) {
    shard_with(columns, records, b"")
}

/// As [`shard`], with `config` between the offset table and the first
/// record (mosaicml-streaming's `MDSWriter` writes its configuration there).
fn shard_with(columns: &[Col<'_>], records: &[Vec<Vec<u8>>], config: &[u8]) -> (Vec<u8>, String) {
    let mut recs = Vec::new();
    for r in records {
        let mut rec = Vec::new();
        for (c, v) in columns.iter().zip(r) {
            if c.2.is_none() {
                rec.extend_from_slice(&(v.len() as u32).to_le_bytes());
            }
        }
        for v in r {
            rec.extend_from_slice(v);
        }
        recs.push(rec);
    }
    let n = recs.len() as u32;
    let mut out = n.to_le_bytes().to_vec();
    let mut at = 4 + 4 * (n + 1) + config.len() as u32;
    for r in &recs {
        out.extend_from_slice(&at.to_le_bytes());
        at += r.len() as u32;
    }
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(config);
    for r in &recs {
        out.extend_from_slice(r);
    }
    let q = |f: &dyn Fn(&Col<'_>) -> String| columns.iter().map(f).collect::<Vec<_>>().join(",");
    let index = format!(
        r#"{{"shards":[{{"column_names":[{}],"column_encodings":[{}],"column_sizes":[{}],"compression":null,"format":"mds","raw_data":{{"basename":"s.mds","bytes":{},"hashes":{{}}}},"samples":{n},"version":2,"zip_data":null}}],"version":2}}"#,
        q(&|c| format!("{:?}", c.0)),
        q(&|c| format!("{:?}", c.1)),
        q(&|c| c.2.map_or("null".into(), |s| s.to_string())),
        out.len()
    );
    (out, index)
}

/// Walks `bytes` as the shard `index` lists: the samples, reads and bytes
/// read.
fn walk(
    bytes: &[u8],
    index: &str,
    sample: &str,
    label: &str,
) -> Result<(Vec<ShardSample>, u64, u64), WalkError> {
    let listed = parse_index(index.as_bytes(), "index.json", sample, label)?;
    let mut w = MdsWalker::new("s.mds", bytes.len() as u64, &listed[0])?;
    let (mut reads, mut read) = (0, 0);
    while let Some((at, len)) = w.next_read() {
        assert!(at + len <= bytes.len() as u64);
        reads += 1;
        read += len;
        w.feed(at, &bytes[at as usize..(at + len) as usize])?;
    }
    Ok((w.into_samples(), reads, read))
}

#[test]
fn the_sample_column_and_the_label_of_every_record() {
    let cols = [
        ("a", "str", None),
        ("label", "int8", Some(1)),
        ("x", "bytes", None),
        ("z", "float32", Some(4)),
    ];
    let records: Vec<Vec<Vec<u8>>> = (0..50u8)
        .map(|i| {
            vec![
                vec![b'k'; i as usize % 7],
                vec![(i as i8 - 25) as u8],
                vec![i; 10 + 97 * i as usize],
                vec![1, 2, 3, 4],
            ]
        })
        .collect();
    let (bytes, index) = shard(&cols, &records);
    let (samples, _, _) = walk(&bytes, &index, "x", "label").unwrap();
    assert_eq!(samples.len(), 50);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.label, i as i32 - 25);
        let got = &bytes[s.offset as usize..(s.offset + s.len) as usize];
        assert_eq!(got, records[i][2].as_slice(), "record {i}");
    }
    // Another column as the sample, a fixed-size one too.
    let (samples, _, _) = walk(&bytes, &index, "a", "label").unwrap();
    assert_eq!(samples[6].len, 6);
    let (samples, _, _) = walk(&bytes, &index, "z", "label").unwrap();
    let z = &samples[9];
    assert_eq!(&bytes[z.offset as usize..][..4], &[1, 2, 3, 4]);
}

#[test]
fn large_records_take_one_small_read_each_small_ones_few() {
    let cols = [("label", "int", Some(8)), ("sample", "bytes", None)];
    let big: Vec<Vec<Vec<u8>>> = (0..300u64)
        .map(|i| {
            vec![
                (i as i64 % 1000).to_le_bytes().to_vec(),
                vec![7; 60_000 + (i as usize * 7_919) % 100_000],
            ]
        })
        .collect();
    let (bytes, index) = shard(&cols, &big);
    let (samples, reads, read) = walk(&bytes, &index, "sample", "label").unwrap();
    assert_eq!(samples.len(), 300);
    assert_eq!(samples[299].label, 299);
    assert!(reads <= 302, "{reads} reads");
    let pct = 100.0 * read as f64 / bytes.len() as f64;
    assert!(pct < 2.0, "read {pct:.2} % of the shard");
    let small: Vec<Vec<Vec<u8>>> = (0..2000u64)
        .map(|i| vec![(i as i64).to_le_bytes().to_vec(), vec![1; 40]])
        .collect();
    let (bytes, index) = shard(&cols, &small);
    let (samples, reads, _) = walk(&bytes, &index, "sample", "label").unwrap();
    assert_eq!(samples.len(), 2000);
    assert!(reads < 20, "{reads} reads");
}

#[test]
fn bad_indexes_and_records_are_errors_naming_the_file() {
    let cols = [("label", "int", Some(8)), ("sample", "bytes", None)];
    let recs = vec![vec![5i64.to_le_bytes().to_vec(), b"abc".to_vec()]];
    let (bytes, index) = shard(&cols, &recs);
    let e = walk(
        &bytes,
        &index.replace("\"mds\"", "\"jsonl\""),
        "sample",
        "label",
    )
    .unwrap_err();
    assert!(e.to_string().contains("only \"mds\" shards"), "{e}");
    let e = walk(
        &bytes,
        &index.replace("s.mds", "../s.mds"),
        "sample",
        "label",
    )
    .unwrap_err();
    assert!(e.to_string().contains("leaves the dataset"), "{e}");
    let e = walk(&bytes, &index, "sample", "sample").unwrap_err();
    assert!(e.to_string().contains("not an integer"), "{e}");
    let e = walk(&bytes, &index, "img", "label").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("index.json: shard 0 (\"s.mds\"): no column \"img\""),
        "{e}"
    );
    // A label beyond 32 bits.
    let recs = vec![vec![(1i64 << 40).to_le_bytes().to_vec(), b"abc".to_vec()]];
    let (bytes, index) = shard(&cols, &recs);
    let e = walk(&bytes, &index, "sample", "label").unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    // The sample count differs from the index's.
    let (mut bytes, index) = shard(&cols, &recs);
    bytes[0] = 3;
    let e = walk(&bytes, &index, "sample", "label").unwrap_err();
    assert_eq!(e.offset, Some(0));
    assert!(e.to_string().contains("holds 3 samples"), "{e}");
}

#[test]
fn the_writers_configuration_between_the_table_and_the_records_is_stepped_over() {
    // What mosaicml-streaming 0.13's MDSWriter writes after the offsets.
    let config = br#"{"version": 2, "format": "mds", "compression": null, "hashes": [], "size_limit": 1048576, "column_names": ["label", "sample"], "column_encodings": ["int", "bytes"], "column_sizes": [8, null]}"#;
    let cols = [("label", "int", Some(8)), ("sample", "bytes", None)];
    let records: Vec<Vec<Vec<u8>>> = (0..40u64)
        .map(|i| {
            vec![
                (i as i64 * 3).to_le_bytes().to_vec(),
                vec![i as u8; 100 + i as usize],
            ]
        })
        .collect();
    let (bytes, index) = shard_with(&cols, &records, config);
    let (samples, _, _) = walk(&bytes, &index, "sample", "label").unwrap();
    assert_eq!(samples.len(), 40);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.label, i as i32 * 3);
        let got = &bytes[s.offset as usize..(s.offset + s.len) as usize];
        assert_eq!(got, records[i][1].as_slice(), "record {i}");
    }
    // A first record inside the offset table is refused.
    let (mut bad, index) = shard(&cols, &records);
    bad[4..8].copy_from_slice(&8u32.to_le_bytes());
    let e = walk(&bad, &index, "sample", "label").unwrap_err();
    assert!(e.to_string().contains("inside the offsets"), "{e}");
}
