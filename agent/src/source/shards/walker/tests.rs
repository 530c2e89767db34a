use super::*;
use granary_shm::tar::{fields, ustar_header};

/// A tar of `(name, data)` members and its end blocks.
fn tar(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        out.extend_from_slice(&ustar_header(name.as_bytes(), data.len() as u64, 0).unwrap());
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out.extend_from_slice(&[0u8; 2 * BLOCK]);
    out
}

/// Walks `bytes` as the drivers do; returns the samples and the bytes read.
fn walk(bytes: &[u8], label: &str) -> Result<(Vec<ShardSample>, u64, u64), WalkError> {
    let mut w = TarWalker::new("t.tar", bytes.len() as u64, label);
    let (mut read, mut reads) = (0, 0);
    while let Some((at, len)) = w.next_read() {
        assert!(len > 0 && at + len <= bytes.len() as u64);
        w.feed(at, &bytes[at as usize..(at + len) as usize])?;
        read += len;
        reads += 1;
    }
    assert!(w.is_done());
    Ok((w.into_samples(), read, reads))
}

fn sample_members(n: usize, size: impl Fn(usize) -> usize) -> Vec<(String, Vec<u8>)> {
    members(n, size, 3)
}

fn members(n: usize, size: impl Fn(usize) -> usize, json_every: usize) -> Vec<(String, Vec<u8>)> {
    let mut m = Vec::new();
    for i in 0..n {
        m.push((format!("c/s{i:05}.bin"), vec![i as u8; size(i)]));
        m.push((format!("c/s{i:05}.cls"), format!("{}", i % 7).into_bytes()));
        if i % json_every == 0 {
            m.push((format!("c/s{i:05}.json"), b"{}".to_vec()));
        }
    }
    m
}

#[test]
fn samples_are_keys_with_their_labels_and_fields() {
    for size in [0usize, 1, 511, 512, 5000, 200_000] {
        let m = sample_members(20, |i| size + i);
        let t = tar(&m);
        let (samples, _, _) = walk(&t, "cls").unwrap();
        assert_eq!(samples.len(), 20, "size {size}");
        for (i, s) in samples.iter().enumerate() {
            assert_eq!(s.label, (i % 7) as i32);
            let bytes = &t[s.offset as usize..(s.offset + s.len) as usize];
            let got: Vec<_> = fields(bytes).map(|f| f.unwrap()).collect();
            assert_eq!(got[0].name, b"bin");
            assert_eq!(got[0].data, vec![i as u8; size + i].as_slice());
            assert_eq!(got[1].data, format!("{}", i % 7).as_bytes());
            assert_eq!(got.len(), if i % 3 == 0 { 3 } else { 2 });
        }
        // Adjacent and covering every member.
        for w in samples.windows(2) {
            assert_eq!(w[0].offset + w[0].len, w[1].offset);
        }
    }
}

#[test]
fn another_label_field_and_none() {
    let m = vec![
        ("a.jpg".to_owned(), b"x".to_vec()),
        ("a.txt".to_owned(), b" 42\n".to_vec()),
        ("b.jpg".to_owned(), b"y".to_vec()),
    ];
    let (s, _, _) = walk(&tar(&m), "txt").unwrap();
    assert_eq!((s[0].label, s[1].label), (42, -1));
    let (s, _, _) = walk(&tar(&m), "cls").unwrap();
    assert_eq!((s[0].label, s[1].label), (-1, -1));
}

#[test]
fn large_members_are_skipped_reading_under_two_percent() {
    // ImageNet-like: ~110 KB images and their labels (what `granary
    // ingest` writes), then with a third member in every third sample.
    for (json_every, limit) in [(usize::MAX, 2.0), (3, 4.0)] {
        let m = members(300, |i| 80_000 + (i * 997) % 60_000, json_every);
        let t = tar(&m);
        let (s, read, reads) = walk(&t, "cls").unwrap();
        assert_eq!(s.len(), 300);
        let pct = 100.0 * read as f64 / t.len() as f64;
        assert!(pct < limit, "read {pct:.2} % in {reads} reads");
        assert!(reads <= 2 * 300 + 1, "{reads} reads");
    }
    // Small members: one read covers many headers.
    let m = sample_members(2000, |_| 100);
    let t = tar(&m);
    let (s, _, reads) = walk(&t, "cls").unwrap();
    assert_eq!(s.len(), 2000);
    assert!(reads < 100, "{reads} reads");
}

#[test]
fn bad_shards_are_errors_naming_the_shard_and_offset() {
    let m = sample_members(4, |_| 3000);
    let t = tar(&m);
    // Cut inside the third sample's data.
    let cut = &t[..9000];
    let e = walk(cut, "cls").unwrap_err();
    assert_eq!(e.shard, "t.tar");
    assert!(e.to_string().contains("t.tar at offset"), "{e}");
    assert!(e.reason.contains("truncated"), "{e}");
    // A header cut short.
    let e = walk(&t[..3584 + 100], "cls").unwrap_err();
    assert!(e.reason.contains("truncated"), "{e}");
    // A header's bytes damaged: the checksum catches it.
    let mut bad = t.clone();
    bad[3584 + 10] ^= 0x20;
    let e = walk(&bad, "cls").unwrap_err();
    assert_eq!(e.offset, Some(3584));
    assert!(e.reason.contains("checksum"), "{e}");
    // Not a tar at all.
    let e = walk(&[b'x'; 4096], "cls").unwrap_err();
    assert_eq!(e.offset, Some(0));
    // A label that is no number.
    let m = vec![("a.cls".to_owned(), b"cat".to_vec())];
    let e = walk(&tar(&m), "cls").unwrap_err();
    assert!(e.reason.contains("\"cat\""), "{e}");
    // A GNU long name.
    let mut h = ustar_header(b"././@LongLink", 0, 0).unwrap();
    h[156] = b'L';
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut t2 = h.to_vec();
    t2.extend_from_slice(&[0u8; 1024]);
    let e = walk(&t2, "cls").unwrap_err();
    assert!(e.reason.contains("not supported"), "{e}");
}

#[test]
fn a_shard_without_end_blocks_and_an_empty_one() {
    let m = sample_members(3, |_| 10);
    let mut t = tar(&m);
    t.truncate(t.len() - 1024);
    assert_eq!(walk(&t, "cls").unwrap().0.len(), 3);
    assert!(walk(&[], "cls").unwrap().0.is_empty());
}
