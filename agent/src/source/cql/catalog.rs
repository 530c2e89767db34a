//! The catalog of a CQL dataset: every row of the metadata table, in a
//! fixed order.
//!
//! Loading checks the schema first (one query of `system_schema.columns`
//! for the keyspace): the metadata table must have `id uuid` as its whole
//! partition key, `label int` and `size int` (or `bigint`); the data table
//! `id uuid` as its whole partition key and `data blob`. A `crc int`
//! column of the metadata table (written by `granary ingest`: the blob's
//! CRC-32C) is read when it is there, and every fetched blob is checked
//! against it. Then the metadata
//! table is read once, paged ([`super::CATALOG_PAGE_SIZE`] rows a page),
//! the whole scan retried with the source's policy if a page fails
//! retryably.
//!
//! **Order.** Samples are sorted by label (ascending, so `-1`, unlabelled,
//! first), then by the id's 16 bytes in byte order; a sample's id
//! (`sample_id`) is its position. It depends only on the rows, never on the
//! order the cluster returns them in (token order), so it is the same on
//! every node and every run, and stays the same while the table does. A
//! folder written by `granary ingest` therefore has, position by position,
//! the labels of its filesystem catalog (which also sorts by label first),
//! and within each label the same sizes in another order (by id rather than
//! by path).

use super::{once, AttemptError, CqlError, CqlSettings};
use crate::source::samples::{deref_to_samples, meta_from_fields, EntryMeta, SampleList};
use futures_util::TryStreamExt;
use scylla::client::session::Session;
use scylla::statement::{Consistency, Statement};
use std::collections::HashMap;
use uuid::Uuid;

/// One sample of a CQL dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqlEntry {
    /// Position in the catalog.
    pub sample_id: u64,
    /// Key of its rows in both tables.
    pub id: Uuid,
    /// Class label (`-1` for a null label).
    pub label: i32,
    /// Length of its blob in bytes.
    pub size: u64,
    /// Its blob's CRC-32C, when the metadata table has a `crc` column and
    /// the row a value in it.
    pub crc: Option<u32>,
}

/// One metadata row as read: id, label, size, CRC-32C.
type Row = (Uuid, i32, u64, Option<u32>);

/// One metadata row as scanned, before its checks.
type RawRow = (Uuid, Option<i32>, Option<i64>, Option<i32>);

/// What the schema check found of the metadata table's optional columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Columns {
    size: SizeType,
    /// Whether it has a `crc int` column.
    crc: bool,
}

/// The samples of a CQL dataset, in catalog order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CqlCatalog {
    metadata_table: String,
    samples: SampleList<CqlEntry>,
}

deref_to_samples!(CqlCatalog, CqlEntry);

impl EntryMeta for CqlEntry {
    meta_from_fields!();

    /// What the read asks for and checks: the row's id (16 bytes), then
    /// the blob's CRC-32C (u32, little-endian) when the catalog has one.
    fn version(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.id.as_bytes());
        if let Some(crc) = self.crc {
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

/// The type of the metadata table's `size` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SizeType {
    Int,
    BigInt,
}

impl CqlCatalog {
    /// A catalog of `(id, label, size, crc)` rows, sorted into catalog order.
    /// Fails on a size above `u32::MAX` (a sample is read in one piece into
    /// memory whose length is a `u32`).
    pub(crate) fn from_rows(
        metadata_table: &str,
        rows: impl IntoIterator<Item = Row>,
    ) -> Result<CqlCatalog, CqlError> {
        let mut rows: Vec<Row> = rows.into_iter().collect();
        rows.sort_unstable_by(|a, b| (a.1, a.0.as_bytes()).cmp(&(b.1, b.0.as_bytes())));
        let mut entries = Vec::with_capacity(rows.len());
        for (i, (id, label, size, crc)) in rows.into_iter().enumerate() {
            if size > u64::from(u32::MAX) {
                return Err(CqlError::BadRow {
                    table: metadata_table.to_owned(),
                    id,
                    reason: format!("size {size} is above the largest sample, 4 GiB - 1"),
                });
            }
            entries.push(CqlEntry {
                sample_id: i as u64,
                id,
                label,
                size,
                crc,
            });
        }
        Ok(CqlCatalog {
            metadata_table: metadata_table.to_owned(),
            samples: SampleList::new(entries),
        })
    }

    /// Checks the schema and reads the metadata table; see the
    /// [module documentation](self).
    pub async fn load(session: &Session, settings: &CqlSettings) -> Result<CqlCatalog, CqlError> {
        let columns = check_schema(session, settings).await?;
        let table = settings.metadata_ref();
        let crc = if columns.crc { ", crc" } else { "" };
        let mut statement = Statement::new(format!("SELECT id, label, size{crc} FROM {table}"));
        statement.set_page_size(super::CATALOG_PAGE_SIZE);
        statement.set_consistency(Consistency::LocalQuorum);
        let rows = once(|| read_rows(session, &statement, &table, columns))
            .await
            .map_err(|e| CqlError::request(format!("read {table}"), e))??;
        CqlCatalog::from_rows(&table, rows)
    }

    /// Checks that both tables exist with the columns Granary needs (see
    /// the [module documentation](self)); the error says what is wrong and
    /// how to fix it.
    pub async fn check_tables(session: &Session, settings: &CqlSettings) -> Result<(), CqlError> {
        check_schema(session, settings).await.map(|_| ())
    }

    /// Whether the metadata table has the `crc int` column (after the
    /// same checks as [`check_tables`](Self::check_tables)).
    pub async fn has_crc_column(
        session: &Session,
        settings: &CqlSettings,
    ) -> Result<bool, CqlError> {
        check_schema(session, settings).await.map(|c| c.crc)
    }

    /// `ks.metadata`, the table the catalog was read from.
    pub fn metadata_table(&self) -> &str {
        &self.metadata_table
    }
}

/// One scan of the metadata table. The outer error is an attempt's (to
/// retry); the inner one a row Granary cannot use (final).
async fn read_rows(
    session: &Session,
    statement: &Statement,
    table: &str,
    columns: Columns,
) -> Result<Result<Vec<Row>, CqlError>, AttemptError> {
    let pager = session.query_iter(statement.clone(), ()).await?;
    let mut out = Vec::new();
    let raw: Vec<RawRow> = match (columns.size, columns.crc) {
        (SizeType::Int, false) => {
            scan(
                pager,
                table,
                |(id, label, size): (Uuid, Option<i32>, Option<i32>)| {
                    (id, label, size.map(i64::from), None)
                },
            )
            .await?
        }
        (SizeType::BigInt, false) => {
            scan(
                pager,
                table,
                |(id, label, size): (Uuid, Option<i32>, Option<i64>)| (id, label, size, None),
            )
            .await?
        }
        (SizeType::Int, true) => {
            scan(
                pager,
                table,
                |(id, label, size, crc): (Uuid, Option<i32>, Option<i32>, Option<i32>)| {
                    (id, label, size.map(i64::from), crc)
                },
            )
            .await?
        }
        (SizeType::BigInt, true) => scan(pager, table, |row: RawRow| row).await?,
    };
    for (id, label, size, crc) in raw {
        let bad = |reason: &str| CqlError::BadRow {
            table: table.to_owned(),
            id,
            reason: reason.to_owned(),
        };
        let Some(size) = size else {
            return Ok(Err(bad("size is null")));
        };
        let Ok(size) = u64::try_from(size) else {
            return Ok(Err(bad(&format!("size {size} is negative"))));
        };
        // The column holds the CRC's 32 bits as a signed int.
        let crc = crc.map(|c| u32::from_ne_bytes(c.to_ne_bytes()));
        out.push((id, label.unwrap_or(-1), size, crc));
    }
    Ok(Ok(out))
}

/// Every row of `pager` as columns `T`, turned into a [`RawRow`] by `into`.
async fn scan<T>(
    pager: scylla::client::pager::QueryPager,
    table: &str,
    into: impl Fn(T) -> RawRow,
) -> Result<Vec<RawRow>, AttemptError>
where
    T: for<'frame, 'metadata> scylla::deserialize::row::DeserializeRow<'frame, 'metadata> + 'static,
{
    let mut stream = pager.rows_stream::<T>().map_err(|e| type_error(table, e))?;
    let mut v = Vec::new();
    while let Some(row) = stream.try_next().await? {
        v.push(into(row));
    }
    Ok(v)
}

fn type_error(table: &str, e: impl std::fmt::Display) -> AttemptError {
    AttemptError::fatal(
        std::io::ErrorKind::InvalidData,
        format!("{table}: the columns are not (id uuid, label int, size int[, crc int]): {e}"),
    )
}

/// Reads the keyspace's columns and checks both tables; returns the type
/// of the metadata table's `size` column and whether it has a `crc`.
async fn check_schema(session: &Session, settings: &CqlSettings) -> Result<Columns, CqlError> {
    // The keyspace name is checked (lowercase letters, digits, '_'), so it
    // can be written into the statement as it is.
    let mut statement = Statement::new(format!(
        "SELECT table_name, column_name, kind, type FROM system_schema.columns \
         WHERE keyspace_name = '{}'",
        settings.keyspace
    ));
    statement.set_consistency(Consistency::One);
    let rows = once(|| async {
        let result = session.query_unpaged(statement.clone(), ()).await?;
        let rows = result
            .into_rows_result()
            .map_err(|e| AttemptError::fatal(std::io::ErrorKind::InvalidData, e.to_string()))?;
        let rows = rows
            .rows::<(String, String, String, String)>()
            .map_err(|e| AttemptError::fatal(std::io::ErrorKind::InvalidData, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AttemptError::fatal(std::io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(rows)
    })
    .await
    .map_err(|e| CqlError::request("read system_schema.columns", e))?;
    let mut tables: HashMap<&str, Vec<(&str, &str, &str)>> = HashMap::new();
    for (t, c, k, ty) in &rows {
        tables
            .entry(t.as_str())
            .or_default()
            .push((c.as_str(), k.as_str(), ty.as_str()));
    }
    let meta_ref = settings.metadata_ref();
    let data_ref = settings.data_ref();
    let meta = tables
        .get(settings.metadata_table.as_str())
        .ok_or_else(|| missing_table(&meta_ref))?;
    let data = tables
        .get(settings.data_table.as_str())
        .ok_or_else(|| missing_table(&data_ref))?;
    check_key(&meta_ref, meta)?;
    check_key(&data_ref, data)?;
    let column = |cols: &[(&str, &str, &str)], name: &str| {
        cols.iter()
            .find(|c| c.0 == name)
            .map(|c| c.2.to_ascii_lowercase())
    };
    let size_type = match column(meta, "size").as_deref() {
        Some("int") => SizeType::Int,
        Some("bigint") => SizeType::BigInt,
        Some(other) => {
            return Err(CqlError::Schema(format!(
                "{meta_ref}: column `size` is of type {other}; it must be int (or bigint)"
            )))
        }
        None => {
            return Err(CqlError::Schema(format!(
                "{meta_ref} has no `size` column. Granary must know every sample's size before \
                 reading it. Add the column and fill it with each blob's length in bytes \
                 (ALTER TABLE {meta_ref} ADD size int; then UPDATE {meta_ref} SET size = <bytes> \
                 WHERE id = <id> for every row), or write the dataset again with `granary ingest`, \
                 which does both; see docs/scylla.md"
            )))
        }
    };
    // A column that must be there, of type `ty`.
    let require =
        |table: &str, cols: &[(&str, &str, &str)], name: &str, ty: &str| match column(cols, name) {
            Some(t) if t == ty => Ok(()),
            Some(other) => Err(CqlError::Schema(format!(
                "{table}: column `{name}` is of type {other}; it must be {ty}"
            ))),
            None => Err(CqlError::Schema(format!(
                "{table} has no `{name}` column ({name} {ty})"
            ))),
        };
    require(&meta_ref, meta, "label", "int")?;
    let crc = match column(meta, "crc").as_deref() {
        Some("int") => true,
        Some(other) => {
            return Err(CqlError::Schema(format!(
                "{meta_ref}: column `crc` is of type {other}; it must be int (the blob's CRC-32C)"
            )))
        }
        None => false,
    };
    require(&data_ref, data, "data", "blob")?;
    Ok(Columns {
        size: size_type,
        crc,
    })
}

fn missing_table(table: &str) -> CqlError {
    CqlError::Schema(format!(
        "table {table} does not exist (create and fill it with `granary ingest`; see docs/scylla.md)"
    ))
}

/// The partition key must be `id uuid` alone: that is what a read binds,
/// and what token-aware routing hashes.
fn check_key(table: &str, cols: &[(&str, &str, &str)]) -> Result<(), CqlError> {
    let keys: Vec<_> = cols.iter().filter(|c| c.1 == "partition_key").collect();
    match keys.as_slice() {
        [(name, _, ty)] if *name == "id" && ty.eq_ignore_ascii_case("uuid") => Ok(()),
        _ => Err(CqlError::Schema(format!(
            "{table}: the partition key must be `id uuid` alone (found: {})",
            keys.iter()
                .map(|c| format!("{} {}", c.0, c.2))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
