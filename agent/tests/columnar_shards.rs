//! `format = "mds"` and `format = "parquet"` end to end: the synthetic
//! dataset as files, as MDS shards and as Parquet files (written by
//! `granary ingest --format mds|parquet`, on the filesystem and uploaded
//! to SeaweedFS) gives the same epoch through a loader session: the same
//! ids, labels and order, each sample byte for byte the file. Arrow IPC
//! files as Hugging Face `datasets` writes them (pyarrow wrote the
//! fixtures) give every row's image bytes and label, on both. Corrupt,
//! truncated and unreadable shards are refused naming the file and the
//! reason; the arena holds each cached sample in at most 1.05× its size.

mod common;
mod common_s3;

use common::{epochs, same_epoch_as, store_config, watchdog, Delivered, TestAgent};
use common_s3::{s3_table, synth, upload, weed_and_synth};
use granary_agent::source::{open_catalog, Catalog, CatalogError};
use granary_testkit::agent_toml::fs_dataset;
use granary_tools::ingest::{mds::write_mds, parquet::write_parquet, shards::ShardsWritten};
use std::path::{Path, PathBuf};
use std::time::Duration;

const FILES: u64 = 400;

fn same_epoch(files: &[Delivered], other: &[Delivered], what: &str) {
    same_epoch_as(files, other, FILES, what, |f, o| {
        assert!(f.2 == o.2, "{what}: sample {} bytes", o.0);
    });
}

#[test]
fn files_mds_and_parquet_on_fs_and_s3_give_the_same_epoch() {
    let _w = watchdog("files_mds_and_parquet_on_fs_and_s3", 300);
    let (weed, dir, spec) = weed_and_synth(FILES, 5, 6_000);
    let mds = dir.path().join("mds");
    let pq = dir.path().join("pq");
    let m = write_mds(&spec.root, &mds, 256 * 1024).unwrap();
    let p = write_parquet(&spec.root, &pq, 256 * 1024).unwrap();
    assert_eq!((m.samples, p.samples), (FILES, FILES));
    assert!(m.shards.len() >= 5 && p.shards.len() >= 5, "{m:?} {p:?}");
    for (folder, prefix, n) in [
        (&mds, "mds", m.shards.len() + 1),
        (&pq, "pq", p.shards.len()),
    ] {
        let report = upload(&weed, folder, prefix);
        assert_eq!(report.files, n as u64, "{prefix}: files uploaded");
    }
    let sock = dir.path().join("granary.sock");
    let s3 = |name: &str, prefix: &str, format: &str| {
        s3_table(
            name,
            &weed.endpoint(),
            prefix,
            &format!("format = \"{format}\"\nsample_field = \"sample\"\nlabel_field = \"label\""),
        )
    };
    let tables = [
        fs_dataset("files", &spec.root, ""),
        fs_dataset("mds-fs", &mds, "format = \"mds\""),
        fs_dataset("pq-fs", &pq, "format = \"parquet\""),
        s3("mds-s3", "mds", "mds"),
        s3("pq-s3", "pq", "parquet"),
    ]
    .concat();
    let cfg = store_config(&sock, "64MiB", "", &tables);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let files = epochs(&agent.sock, "files", 1, || {});
    for name in ["mds-fs", "pq-fs", "mds-s3", "pq-s3"] {
        same_epoch(&files, &epochs(&agent.sock, name, 1, || {}), name);
    }
}

/// `make.py`'s rows (agent/src/source/shards/arrow/testdata).
fn arrow_row(seed: usize, i: usize) -> (i32, Vec<u8>) {
    let n = 10 + (i * 37) % 300;
    let bytes = (0..n).map(|k| ((i * 7 + k + seed) % 251) as u8).collect();
    (i as i32 * 3 - 5, bytes)
}

#[test]
fn hugging_face_arrow_files_on_fs_and_s3_give_every_row() {
    let _w = watchdog("hugging_face_arrow_files_on_fs_and_s3", 240);
    let (weed, dir, spec) = weed_and_synth(20, 2, 2_000);
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/source/shards/arrow/testdata/hf");
    let arrow = dir.path().join("arrow");
    std::fs::create_dir(&arrow).unwrap();
    for f in ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"] {
        std::fs::copy(fixtures.join(f), arrow.join(f)).unwrap();
    }
    assert_eq!(upload(&weed, &arrow, "hf").files, 2);
    let sock = dir.path().join("granary.sock");
    let tables = format!(
        "[[dataset]]\nname = \"arrow-fs\"\nroot = \"{}\"\nformat = \"arrow\"\nsample_field = \"image\"\n{}",
        arrow.display(),
        s3_table("arrow-s3", &weed.endpoint(), "hf", "format = \"arrow\"\nsample_field = \"image\""),
    );
    let cfg = store_config(&sock, "64MiB", "", &tables);
    let agent = TestAgent::start_on(dir, &spec, sock, cfg);
    let fs = epochs(&agent.sock, "arrow-fs", 1, || {});
    let s3 = epochs(&agent.sock, "arrow-s3", 1, || {});
    assert_eq!(fs.len(), 50);
    assert!(fs == s3, "the same epoch from the filesystem and from S3");
    let mut ids: Vec<u64> = fs.iter().map(|d| d.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..50).collect::<Vec<u64>>(), "every row once");
    for (id, label, bytes) in &fs {
        let (seed, row) = if *id < 25 {
            (1, *id as usize)
        } else {
            (7, *id as usize - 25)
        };
        assert_eq!(
            (*label, bytes),
            (arrow_row(seed, row).0, &arrow_row(seed, row).1),
            "row {id}"
        );
    }
}

/// Arena bytes per cached sample: one dataset of ImageNet-like samples
/// (~110 KB) in an agent of its own, two epochs; after the first, every
/// sample is cached for the second, and the arena's held bytes over the
/// samples' bytes is the figure (extents are rounded up to 4 KiB).
#[test]
fn arena_bytes_per_cached_sample_are_within_1_05_of_the_sample() {
    let _w = watchdog("arena_bytes_per_cached_sample", 240);
    for format in ["mds", "parquet"] {
        let dir = tempfile::tempdir().unwrap();
        let spec = synth(dir.path(), 200, 4, 110_000);
        let shards = dir.path().join("shards");
        let written = if format == "mds" {
            write_mds(&spec.root, &shards, 8 << 20)
        } else {
            write_parquet(&spec.root, &shards, 8 << 20)
        }
        .unwrap();
        let sock = dir.path().join("granary.sock");
        let tables = format!(
            "[[dataset]]\nname = \"d\"\nroot = \"{}\"\nformat = \"{format}\"\n",
            shards.display()
        );
        let cfg = store_config(&sock, "128MiB", "", &tables);
        let agent = TestAgent::start_on(dir, &spec, sock, cfg);
        let mut held = 0;
        let out = epochs(&agent.sock, "d", 2, || {
            std::thread::sleep(Duration::from_millis(300));
            let a = agent.acct();
            held = a.size - a.free;
        });
        assert_eq!(out.len(), 400);
        let ratio = held as f64 / written.bytes as f64;
        println!(
            "{format}: {} samples, {} bytes; arena held {held} bytes: {ratio:.4}x",
            written.samples, written.bytes
        );
        assert!(
            (1.0..=1.05).contains(&ratio),
            "{format}: arena {held} bytes for {} bytes of samples ({ratio:.4}x)",
            written.bytes
        );
    }
}

/// The catalog of one dataset `d` of `format` at `root`, with `extra`
/// lines in its table.
fn catalog(root: &Path, format: &str, extra: &str) -> Result<Catalog, CatalogError> {
    let cfg = store_config(
        &root.join("g.sock"),
        "64MiB",
        "",
        &format!(
            "[[dataset]]\nname = \"d\"\nroot = \"{}\"\nformat = \"{format}\"\n{extra}",
            root.display()
        ),
    );
    open_catalog(&cfg.datasets[0])
}

fn catalog_error(root: &Path, format: &str, extra: &str) -> String {
    catalog(root, format, extra)
        .map(|c| format!("no error: {} samples", c.len()))
        .unwrap_or_else(|e| e.to_string())
}

/// Writes 40 samples with `write` (a shard writer) into `<tmp>/<format>`,
/// checks that its catalog opens, then that a copy with `victim` cut short
/// by 100 bytes is refused with an error naming `victim` and saying
/// `why`. Returns the temporary folder, the shards' folder, the victim's
/// path and its original bytes (the victim is left truncated).
fn truncated_shard_is_refused(
    format: &str,
    victim: &str,
    why: &str,
    write: fn(&Path, &Path, u64) -> std::io::Result<ShardsWritten>,
) -> (tempfile::TempDir, PathBuf, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = synth(dir.path(), 40, 2, 3_000);
    let root = dir.path().join(format);
    write(&spec.root, &root, 40 * 1024).unwrap();
    let path = root.join(victim);
    let original = std::fs::read(&path).unwrap();
    let ok = catalog_error(&root, format, "");
    assert!(ok.starts_with("no error: 40"), "{ok}");
    std::fs::write(&path, &original[..original.len() - 100]).unwrap();
    let e = catalog_error(&root, format, "");
    assert!(e.contains(victim) && e.contains(why), "{e}");
    (dir, root, path, original)
}

#[test]
fn corrupt_and_truncated_mds_shards_are_refused_naming_them() {
    // Truncated: shorter than index.json says.
    let (_dir, root, victim, original) =
        truncated_shard_is_refused("mds", "shard.00001.mds", "truncated", write_mds);
    // The offset table damaged: a record ends before it starts.
    let mut bad = original.clone();
    bad[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&victim, &bad).unwrap();
    let e = catalog_error(&root, "mds", "");
    assert!(
        e.contains("shard.00001.mds at offset") && e.contains("corrupt"),
        "{e}"
    );
    // A record's column sizes damaged: they no longer add up.
    let mut bad = original.clone();
    let first = u32::from_le_bytes(bad[4..8].try_into().unwrap()) as usize;
    bad[first + 4] ^= 0x40;
    std::fs::write(&victim, &bad).unwrap();
    let e = catalog_error(&root, "mds", "");
    assert!(
        e.contains(&format!("shard.00001.mds at offset {first}")) && e.contains("corrupt"),
        "{e}"
    );
    std::fs::write(&victim, &original).unwrap();
    // index.json: a missing column, a compressed shard, not JSON.
    let e = catalog_error(&root, "mds", "sample_field = \"jpg\"\n");
    assert!(
        e.contains("index.json") && e.contains("no column \"jpg\" (sample_field)"),
        "{e}"
    );
    let index = root.join("index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace("\"compression\": null", "\"compression\": \"zstd\""),
    )
    .unwrap();
    let e = catalog_error(&root, "mds", "");
    assert!(e.contains("compressed (zstd)"), "{e}");
    std::fs::write(&index, &text[..text.len() / 2]).unwrap();
    let e = catalog_error(&root, "mds", "");
    assert!(e.contains("not an MDS index"), "{e}");
    std::fs::remove_file(&index).unwrap();
    let e = catalog_error(&root, "mds", "");
    assert!(e.contains("index.json"), "{e}");
}

/// Writes `rows` rows of a binary `sample` and an int32 `label` column
/// with `props`.
fn parquet_file(path: &Path, rows: usize, props: parquet::file::properties::WriterProperties) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let schema = parquet::schema::parser::parse_message_type(
        "message m { required binary sample; required int32 label; }",
    )
    .unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(f, Arc::new(schema), Arc::new(props)).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let samples: Vec<ByteArray> = (0..rows)
        .map(|i| ByteArray::from(vec![i as u8; 100 + i]))
        .collect();
    let labels: Vec<i32> = (0..rows as i32).collect();
    let mut c = rg.next_column().unwrap().unwrap();
    c.typed::<ByteArrayType>()
        .write_batch(&samples, None, None)
        .unwrap();
    c.close().unwrap();
    let mut c = rg.next_column().unwrap().unwrap();
    c.typed::<Int32Type>()
        .write_batch(&labels, None, None)
        .unwrap();
    c.close().unwrap();
    rg.close().unwrap();
    w.close().unwrap();
}

#[test]
fn corrupt_truncated_and_unreadable_parquet_files_are_refused_naming_them() {
    use parquet::file::properties::WriterProperties;
    // Truncated: the footer is gone.
    let (dir, root, victim, original) =
        truncated_shard_is_refused("parquet", "shard-000001.parquet", "PAR1", write_parquet);
    // A sample page's header damaged (the first sample of the file).
    std::fs::write(&victim, &original).unwrap();
    let cat = catalog(&root, "parquet", "").unwrap();
    let first = cat.entries().iter().find(|e| e.path == victim).unwrap();
    let header_at = first.offset as usize - 4 - 20;
    let mut bad = original.clone();
    for b in &mut bad[header_at..header_at + 24] {
        *b = 0xff;
    }
    std::fs::write(&victim, &bad).unwrap();
    let e = catalog_error(&root, "parquet", "");
    assert!(e.contains("shard-000001.parquet at offset"), "{e}");
    std::fs::write(&victim, &original).unwrap();
    // Columns missing or of the wrong type.
    let e = catalog_error(&root, "parquet", "sample_field = \"jpg\"\n");
    assert!(
        e.contains("shard-000000.parquet") && e.contains("no top-level column \"jpg\""),
        "{e}"
    );
    let e = catalog_error(&root, "parquet", "label_field = \"key\"\n");
    assert!(e.contains("not an integer"), "{e}");
    // Files Granary cannot read per sample: many rows per page, a
    // dictionary.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let plain = |b: parquet::file::properties::WriterPropertiesBuilder| {
        b.set_dictionary_enabled(false)
            .set_encoding(parquet::basic::Encoding::PLAIN)
            .build()
    };
    parquet_file(
        &other.join("a.parquet"),
        50,
        plain(WriterProperties::builder()),
    );
    let e = catalog_error(&other, "parquet", "");
    assert!(
        e.contains("a.parquet at offset") && e.contains("a data page of 50 values"),
        "{e}"
    );
    parquet_file(
        &other.join("a.parquet"),
        50,
        WriterProperties::builder()
            .set_data_page_row_count_limit(1)
            .set_write_batch_size(1)
            .build(),
    );
    let e = catalog_error(&other, "parquet", "");
    assert!(e.contains("a.parquet") && e.contains("dictionary"), "{e}");
    // Written by another writer with one row per page: read.
    parquet_file(
        &other.join("a.parquet"),
        50,
        plain(
            WriterProperties::builder()
                .set_data_page_row_count_limit(1)
                .set_write_batch_size(1),
        ),
    );
    let cat = catalog(&other, "parquet", "").unwrap();
    assert_eq!(cat.len(), 50);
    for i in [0u64, 17, 49] {
        assert_eq!(cat.entries()[i as usize].label, i as i32);
        assert_eq!(cat.read_sample(i).unwrap(), vec![i as u8; 100 + i as usize]);
    }
}
