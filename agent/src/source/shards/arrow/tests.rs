//! The walk over Arrow IPC files pyarrow wrote (`testdata/make.py`).

use super::*;

const HF_IMAGE: &[u8] = include_bytes!("testdata/hf/data-00000-of-00002.arrow");
const MANY_COLUMNS: &[u8] = include_bytes!("testdata/many_columns.arrow");
const LARGE: &[u8] = include_bytes!("testdata/large.arrow");
const FIXED: &[u8] = include_bytes!("testdata/fixed.arrow");
const COMPRESSED: &[u8] = include_bytes!("testdata/compressed.arrow");
const NULLS: &[u8] = include_bytes!("testdata/nulls.arrow");
const BY_PATH: &[u8] = include_bytes!("testdata/by_path.arrow");
const ROWS: usize = 25;

/// `make.py`'s `sample(seed, i)`.
fn sample(seed: usize, i: usize) -> Vec<u8> {
    let n = 10 + (i * 37) % 300;
    (0..n).map(|k| ((i * 7 + k + seed) % 251) as u8).collect()
}

/// `make.py`'s `label(i)`.
fn label(i: usize) -> i32 {
    i as i32 * 3 - 5
}

/// Walks `file` as the drivers do (exactly the reads asked for): the
/// samples and the number of reads.
fn walk(
    file: &[u8],
    sample_field: &str,
    label_field: &str,
) -> Result<(Vec<ShardSample>, usize), WalkError> {
    let mut w = ArrowWalker::new("t.arrow", file.len() as u64, sample_field, label_field);
    let mut reads = 0;
    while let Some((at, len)) = w.next_read() {
        reads += 1;
        assert!(reads < 10_000, "the walk does not end");
        assert!(
            at + len <= file.len() as u64,
            "a read past the end: {at}+{len}"
        );
        w.feed(at, &file[at as usize..(at + len) as usize])?;
    }
    Ok((w.into_samples(), reads))
}

/// Checks every sample's bytes in `file` and its label.
fn check(
    file: &[u8],
    got: &[ShardSample],
    bytes: impl Fn(usize) -> Vec<u8>,
    label: impl Fn(usize) -> i32,
) {
    assert_eq!(got.len(), ROWS);
    for (i, s) in got.iter().enumerate() {
        let at = s.offset as usize;
        assert_eq!(
            &file[at..at + s.len as usize],
            &bytes(i)[..],
            "row {i}'s bytes"
        );
        assert_eq!(s.label, label(i), "row {i}'s label");
    }
}

#[test]
fn a_hugging_face_image_column_is_read_value_by_value() {
    let (got, reads) = walk(HF_IMAGE, "image", "label").unwrap();
    check(HF_IMAGE, &got, |i| sample(1, i), label);
    // The schema, three record batches and the end: every batch's
    // metadata and buffers within one read or two.
    assert!(reads <= 8, "{reads} reads");
    let (by_path, _) = walk(HF_IMAGE, "image.bytes", "label").unwrap();
    assert_eq!(by_path, got, "`image` stands for `image.bytes`");
}

#[test]
fn other_columns_take_their_buffers_in_the_file_format() {
    // Dictionary, list, large binary, fixed-size, null and string-view
    // columns before the sample; the file format's magic and footer.
    let (got, _) = walk(MANY_COLUMNS, "sample", "label").unwrap();
    check(MANY_COLUMNS, &got, |i| sample(2, i), label);
}

#[test]
fn large_binary_fixed_size_and_narrow_labels() {
    let (got, _) = walk(LARGE, "sample", "label").unwrap();
    check(LARGE, &got, |i| sample(3, i), |i| (i * 10 % 256) as i32);
    let (got, _) = walk(FIXED, "sample", "label").unwrap();
    check(
        FIXED,
        &got,
        |i| [sample(4, i), sample(4, i)].concat()[..16].to_vec(),
        label,
    );
}

fn refused(file: &[u8], sample_field: &str, label_field: &str) -> String {
    match walk(file, sample_field, label_field) {
        Ok((s, _)) => panic!("accepted, {} samples", s.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn files_it_cannot_read_per_sample_are_refused_with_the_reason() {
    let e = refused(COMPRESSED, "sample", "label");
    assert!(e.contains("compressed") && e.contains("t.arrow"), "{e}");
    let e = refused(NULLS, "sample", "label");
    assert!(e.contains("1 null values"), "{e}");
    let e = refused(BY_PATH, "image", "label");
    assert!(e.contains("stored by path"), "{e}");
    let e = refused(HF_IMAGE, "picture", "label");
    assert!(
        e.contains("no column \"picture\"") && e.contains("\"image\""),
        "{e}"
    );
    let e = refused(HF_IMAGE, "image", "text");
    assert!(e.contains("not an integer"), "{e}");
    let e = refused(HF_IMAGE, "label", "label");
    assert!(e.contains("not binary"), "{e}");
    let e = refused(b"PAR1 not arrow at all, no", "sample", "label");
    assert!(e.contains("t.arrow"), "{e}");
}

#[test]
fn a_file_cut_anywhere_is_refused() {
    for cut in 0..HF_IMAGE.len() {
        if let Ok((s, _)) = walk(&HF_IMAGE[..cut], "image", "label") {
            // Only an empty file has nothing to say.
            assert!(
                cut == 0 && s.is_empty(),
                "cut at {cut}: {} samples accepted",
                s.len()
            );
        }
    }
}

#[test]
fn corrupt_bytes_never_panic_nor_place_a_sample_outside_the_file() {
    for file in [HF_IMAGE, MANY_COLUMNS] {
        for at in 0..file.len() {
            for v in [0x00, 0xFF, 0x80] {
                let mut f = file.to_vec();
                if f[at] == v {
                    continue;
                }
                f[at] = v;
                if let Ok((samples, _)) =
                    walk(&f, "image", "label").or_else(|_| walk(&f, "sample", "label"))
                {
                    for s in samples {
                        assert!(
                            s.offset + s.len <= f.len() as u64,
                            "byte {at} = {v}: a sample outside the file"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn arrow_names() {
    use crate::source::shards::is_arrow;
    assert!(is_arrow("data-00000-of-00002.arrow") && is_arrow("x.feather") && is_arrow("s.arrows"));
    assert!(!is_arrow(".arrow") && !is_arrow("x.parquet") && !is_arrow("arrow"));
}
