//! `granary ingest --format parquet`: a dataset folder written as Parquet
//! files that Granary reads per sample.
//!
//! Each file becomes one row of three required columns: `key` (`binary`,
//! UTF-8: its path below the folder), `label` (`int32`: its label, -1 for
//! files directly in the folder) and `sample` (`binary`: the file). Every
//! column is written uncompressed, PLAIN, without dictionary or
//! statistics, one row per data page (v1): each sample is then the value
//! of one page, a byte range of the file. A file holds one row group and
//! is closed before the row that would take its data past `shard_size`
//! (a larger row gets a file of its own); files are named
//! `shard-000000.parquet`, ….

use super::shards::{open_source, relative, ShardsWritten};
use ::parquet::basic::{Compression, Encoding};
use ::parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
use ::parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// The schema written.
pub const SCHEMA: &str = "message granary {
  required binary key (STRING);
  required int32 label;
  required binary sample;
}";

fn pq(e: ::parquet::errors::ParquetError) -> io::Error {
    io::Error::other(e.to_string())
}

/// The rows of one file.
#[derive(Default)]
struct Rows {
    keys: Vec<ByteArray>,
    labels: Vec<i32>,
    samples: Vec<ByteArray>,
    bytes: u64,
}

/// The writer's settings: one row per page, uncompressed, PLAIN, no
/// dictionary, no statistics.
pub fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_encoding(Encoding::PLAIN)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_data_page_row_count_limit(1)
        .set_write_batch_size(1)
        .set_max_row_group_row_count(None)
        .set_max_row_group_bytes(None)
        .build()
}

fn write_file(path: &Path, rows: &Rows) -> io::Result<()> {
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(pq)?);
    let file = std::fs::File::create(path)?;
    let mut w = SerializedFileWriter::new(file, schema, Arc::new(properties())).map_err(pq)?;
    let mut rg = w.next_row_group().map_err(pq)?;
    let mut col = rg.next_column().map_err(pq)?.expect("key");
    col.typed::<ByteArrayType>()
        .write_batch(&rows.keys, None, None)
        .map_err(pq)?;
    col.close().map_err(pq)?;
    let mut col = rg.next_column().map_err(pq)?.expect("label");
    col.typed::<Int32Type>()
        .write_batch(&rows.labels, None, None)
        .map_err(pq)?;
    col.close().map_err(pq)?;
    let mut col = rg.next_column().map_err(pq)?.expect("sample");
    col.typed::<ByteArrayType>()
        .write_batch(&rows.samples, None, None)
        .map_err(pq)?;
    col.close().map_err(pq)?;
    rg.close().map_err(pq)?;
    w.close().map_err(pq)?;
    Ok(())
}

/// Writes the folder `src` as Parquet files of about `shard_size` bytes
/// into `out` (created if missing).
pub fn write_parquet(src: &Path, out: &Path, shard_size: u64) -> io::Result<ShardsWritten> {
    let catalog = open_source(src, out)?;
    let mut written = ShardsWritten::default();
    let mut rows = Rows::default();
    let flush = |rows: &mut Rows, written: &mut ShardsWritten| -> io::Result<()> {
        let path = out.join(format!("shard-{:06}.parquet", written.shards.len()));
        write_file(&path, rows)?;
        written.shards.push(path);
        *rows = Rows::default();
        Ok(())
    };
    for e in catalog.entries() {
        let rel = relative(src, &e.path)?;
        let data = std::fs::read(&e.path)?;
        // A row's pages: the key, label and sample values and three page
        // headers of about 30 bytes each.
        let row = (rel.len() + data.len() + 4 + 100) as u64;
        if !rows.labels.is_empty() && rows.bytes + row > shard_size {
            flush(&mut rows, &mut written)?;
        }
        written.samples += 1;
        written.bytes += data.len() as u64;
        rows.bytes += row;
        rows.keys.push(ByteArray::from(rel.as_bytes().to_vec()));
        rows.labels.push(e.label);
        rows.samples.push(ByteArray::from(data));
    }
    if !rows.labels.is_empty() {
        flush(&mut rows, &mut written)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_index_back_to_the_files_in_order() {
        let (_d, spec, out, w) = crate::ingest::ninety_files_written("pq", write_parquet);
        crate::ingest::assert_indexed_in_order(
            &spec.root,
            &out,
            &w,
            granary_agent::source::fs::shards::index_parquet,
            7,
        );
    }
}
