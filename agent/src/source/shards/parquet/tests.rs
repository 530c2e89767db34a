use super::*;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;

/// A Parquet file of `values` (`None`: null) in an `optional` or
/// `required` binary `sample` column and an int64 `label` column (the
/// row's index), one row per page.
fn file(values: &[Option<Vec<u8>>], optional: bool, version: WriterVersion) -> Vec<u8> {
    let rep = if optional { "optional" } else { "required" };
    let schema = parquet::schema::parser::parse_message_type(&format!(
        "message m {{ {rep} binary sample; required int64 label; }}"
    ))
    .unwrap();
    let props = WriterProperties::builder()
        .set_writer_version(version)
        .set_dictionary_enabled(false)
        .set_encoding(parquet::basic::Encoding::PLAIN)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(1)
        .set_write_batch_size(1)
        .build();
    let mut w = SerializedFileWriter::new(Vec::new(), Arc::new(schema), Arc::new(props)).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let mut c = rg.next_column().unwrap().unwrap();
    let present: Vec<ByteArray> = values
        .iter()
        .flatten()
        .map(|v| ByteArray::from(v.clone()))
        .collect();
    let defs: Vec<i16> = values.iter().map(|v| i16::from(v.is_some())).collect();
    c.typed::<ByteArrayType>()
        .write_batch(&present, optional.then_some(&defs[..]), None)
        .unwrap();
    c.close().unwrap();
    let mut c = rg.next_column().unwrap().unwrap();
    let labels: Vec<i64> = (0..values.len() as i64).collect();
    c.typed::<Int64Type>()
        .write_batch(&labels, None, None)
        .unwrap();
    c.close().unwrap();
    rg.close().unwrap();
    w.into_inner().unwrap()
}

/// Walks `bytes`: the samples, reads and bytes read.
fn walk(bytes: &[u8]) -> Result<(Vec<ShardSample>, u64, u64), WalkError> {
    let mut w = ParquetWalker::new("f.parquet", bytes.len() as u64, "sample", "label");
    let (mut reads, mut read) = (0, 0);
    while let Some((at, len)) = w.next_read() {
        assert!(at + len <= bytes.len() as u64, "{at}+{len}");
        reads += 1;
        read += len;
        w.feed(at, &bytes[at as usize..(at + len) as usize])?;
    }
    Ok((w.into_samples(), reads, read))
}

#[test]
fn values_of_required_and_optional_columns_in_v1_and_v2_pages() {
    let values: Vec<Option<Vec<u8>>> = (0..40u8)
        .map(|i| Some(vec![i; 1 + 1_000 * i as usize]))
        .collect();
    for optional in [false, true] {
        for v in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let bytes = file(&values, optional, v);
            let (samples, _, _) = walk(&bytes).unwrap_or_else(|e| panic!("{v:?}: {e}"));
            assert_eq!(samples.len(), 40);
            for (i, s) in samples.iter().enumerate() {
                assert_eq!(s.label, i as i32);
                let got = &bytes[s.offset as usize..(s.offset + s.len) as usize];
                assert_eq!(got, values[i].as_deref().unwrap(), "{v:?} row {i}");
            }
        }
    }
}

#[test]
fn a_null_sample_is_refused() {
    let values = vec![Some(b"abc".to_vec()), None, Some(b"d".to_vec())];
    for v in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
        let e = walk(&file(&values, true, v)).unwrap_err().to_string();
        assert!(e.contains("row 1") && e.contains("null"), "{v:?}: {e}");
    }
}

#[test]
fn large_values_take_about_one_small_read_each() {
    let values: Vec<Option<Vec<u8>>> = (0..200usize)
        .map(|i| Some(vec![3; 60_000 + (i * 7_919) % 100_000]))
        .collect();
    let bytes = file(&values, false, WriterVersion::PARQUET_1_0);
    let (samples, reads, read) = walk(&bytes).unwrap();
    assert_eq!(samples.len(), 200);
    assert!(reads <= 205, "{reads} reads");
    let pct = 100.0 * read as f64 / bytes.len() as f64;
    assert!(pct < 2.0, "read {pct:.2} %");
}

#[test]
fn page_headers_cut_short_ask_for_more_and_garbage_is_an_error() {
    let bytes = file(
        &[Some(b"hello".to_vec())],
        false,
        WriterVersion::PARQUET_1_0,
    );
    // The file starts with PAR1, then the sample column's page header.
    let h = thrift::page_header(&bytes[4..]).unwrap();
    assert_eq!(h.page_type, thrift::DATA_PAGE);
    assert_eq!(h.num_values, 1);
    assert_eq!(h.compressed_size, 9);
    for cut in 0..h.len {
        assert_eq!(
            thrift::page_header(&bytes[4..4 + cut]),
            Err(HeaderError::Short),
            "cut at {cut}"
        );
    }
    // Random bytes never panic; each gives a header, Short or Bad.
    let mut x = granary_base::hash::GAMMA;
    for _ in 0..20_000 {
        let mut buf = [0u8; 48];
        for b in &mut buf {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let _ = thrift::page_header(&buf);
    }
    assert!(matches!(
        thrift::page_header(&[0xff; 16]),
        Err(HeaderError::Bad(_))
    ));
    // Lists in lists, a map of a billion booleans: an error, no deep
    // recursion, no endless loop.
    assert!(matches!(
        thrift::page_header(&[0x19; 65536]),
        Err(HeaderError::Bad(_))
    ));
    let mut map = vec![0x9b, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0x11];
    map.extend_from_slice(&[1; 100]);
    assert_eq!(thrift::page_header(&map), Err(HeaderError::Short));
}
