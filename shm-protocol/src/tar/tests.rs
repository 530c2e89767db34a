use super::*;
use proptest::prelude::*;

/// A tar of `(name, data)` members, each padded to a block, without the
/// end-of-archive blocks.
fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        out.extend_from_slice(&ustar_header(name.as_bytes(), data.len() as u64, 0).unwrap());
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out
}

#[test]
fn fields_are_the_members_by_extension() {
    let t = tar(&[
        ("a/x001.jpg", b"JPEGDATA"),
        ("a/x001.cls", b"7"),
        ("a/x001.seg.png", &[0u8; 600]),
    ]);
    let got: Vec<_> = fields(&t).map(|f| f.unwrap()).collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].name, b"jpg");
    assert_eq!(got[0].data, b"JPEGDATA");
    assert_eq!(got[1].name, b"cls");
    assert_eq!(got[1].data, b"7");
    assert_eq!(got[2].name, b"seg.png");
    assert_eq!(got[2].data.len(), 600);
    assert_eq!(fields(&t).find(b"cls").unwrap(), Some(&b"7"[..]));
    assert_eq!(fields(&t).find(b"json").unwrap(), None);
}

#[test]
fn headers_give_keys_and_extensions() {
    let h = ustar_header(b"dir/sub/k.ey.tar.gz", 5, 0).unwrap();
    let p = parse_header(&h).unwrap().unwrap();
    assert_eq!(p.size, 5);
    assert_eq!(p.kind, MemberKind::File);
    assert_eq!(p.extension(), Some(&b"ey.tar.gz"[..]));
    let mut k = Vec::new();
    p.key_into(&mut k);
    assert_eq!(k, b"dir/sub/k");
    assert_eq!(p.padded_span(), Some(1024));
    // A long path goes into the ustar prefix and comes back whole.
    let long = format!("{}/{}.jpg", "d".repeat(120), "n".repeat(90));
    let h = ustar_header(long.as_bytes(), 0, 0).unwrap();
    let p = parse_header(&h).unwrap().unwrap();
    p.key_into(&mut k);
    assert_eq!(
        k,
        format!("{}/{}", "d".repeat(120), "n".repeat(90)).as_bytes()
    );
    assert!(ustar_header("x".repeat(101).as_bytes(), 0, 0).is_none());
    assert_eq!(parse_header(&[0u8; BLOCK]).unwrap(), None);
}

#[test]
fn a_last_member_without_padding_and_the_end_blocks_are_accepted() {
    let mut t = tar(&[("k.txt", b"hello")]);
    t.truncate(BLOCK + 5);
    assert_eq!(fields(&t).find(b"txt").unwrap(), Some(&b"hello"[..]));
    let mut t = tar(&[("k.txt", b"hello")]);
    t.extend_from_slice(&[0u8; 2 * BLOCK]);
    t.extend_from_slice(&tar(&[("k.bin", b"after the end")]));
    assert_eq!(fields(&t).count(), 1, "stops at the zero block");
}

#[test]
fn hostile_bytes_are_errors_not_reads_outside() {
    let t = tar(&[("k.txt", b"hello")]);
    // Checksum.
    let mut bad = t.clone();
    bad[0] ^= 1;
    let e = fields(&bad).next().unwrap().unwrap_err();
    assert!(matches!(e, TarError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("checksum"), "{e}");
    // Data past the end.
    let cut = &t[..BLOCK + 2];
    let e = fields(cut).next().unwrap().unwrap_err();
    assert_eq!(
        e,
        TarError::Truncated {
            needed: BLOCK as u64 + 5,
            available: BLOCK as u64 + 2
        }
    );
    // A header cut short.
    let e = fields(&t[..100]).next().unwrap().unwrap_err();
    assert!(matches!(e, TarError::Truncated { .. }), "{e}");
    // A size of u64::MAX in base-256 with a valid checksum.
    let mut h = ustar_header(b"k.big", 0, 0).unwrap();
    h[124..136].copy_from_slice(&[
        0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ]);
    reseal(&mut h);
    let e = fields(&h).next().unwrap().unwrap_err();
    assert!(matches!(e, TarError::Truncated { .. }), "{e}");
    // GNU long names and pax headers are refused by name.
    for flag in [b'L', b'x', b'K'] {
        let mut h = ustar_header(b"././@LongLink", 0, 0).unwrap();
        h[156] = flag;
        reseal(&mut h);
        let e = fields(&h).next().unwrap().unwrap_err();
        assert_eq!(e, TarError::Unsupported(flag));
        assert!(e.to_string().contains("not supported"), "{e}");
    }
    // A directory and a global header are skipped.
    let mut d = ustar_header(b"dir/", 0, 0).unwrap();
    d[156] = b'5';
    reseal(&mut d);
    let mut all = d.to_vec();
    all.extend_from_slice(&t);
    assert_eq!(fields(&all).find(b"txt").unwrap(), Some(&b"hello"[..]));
}

/// Recomputes a header's checksum after an edit.
fn reseal(h: &mut [u8; BLOCK]) {
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any bytes: the iterator ends, never panics, and every field it
    /// yields lies inside the input.
    #[test]
    fn fields_of_any_bytes_stay_inside(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
        check_inside(&bytes);
    }

    /// A valid fragment with bytes flipped, cut or with headers resealed
    /// after random edits: the same.
    #[test]
    fn fields_of_damaged_fragments_stay_inside(
        sizes in proptest::collection::vec(0usize..1500, 1..4),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        reseal_first in any::<bool>(),
        cut in any::<usize>(),
    ) {
        let datas: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![7u8; n]).collect();
        let names = ["k.a", "k.b", "k.c", "k.d"];
        let members: Vec<(&str, &[u8])> =
            datas.iter().enumerate().map(|(i, d)| (names[i], d.as_slice())).collect();
        let mut t = tar(&members);
        for (at, v) in &edits {
            let i = at % t.len();
            t[i] = *v;
        }
        if reseal_first {
            let mut h = [0u8; BLOCK];
            h.copy_from_slice(&t[..BLOCK]);
            reseal(&mut h);
            t[..BLOCK].copy_from_slice(&h);
        }
        let keep = cut % (t.len() + 1);
        check_inside(&t[..keep]);
    }
}

fn check_inside(bytes: &[u8]) {
    let lo = bytes.as_ptr() as usize;
    let hi = lo + bytes.len();
    let mut n = 0;
    for f in fields(bytes) {
        n += 1;
        assert!(n <= bytes.len() / BLOCK + 1, "more fields than blocks");
        let Ok(f) = f else { continue };
        for s in [f.name, f.data] {
            let a = s.as_ptr() as usize;
            assert!(s.is_empty() || (a >= lo && a + s.len() <= hi));
        }
    }
}
