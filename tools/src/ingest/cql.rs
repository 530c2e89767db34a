//! `granary ingest … --to cql://HOSTS/KEYSPACE`: moves a local dataset
//! folder into the CQL layout (`docs/scylla.md`). The walk, the passes,
//! progress and failures are [`super`]'s; what is CQL's:
//!
//! * The folder is walked as the filesystem source catalogs it; file
//!   `root/REL` becomes the sample with id [`sample_id`]`(REL)` — a UUID v5
//!   of its relative path — its catalog label, and its bytes. Ids depend on
//!   nothing else, so running the same ingest again writes the same rows.
//! * The keyspace (replication from `--replication`, SimpleStrategy with
//!   one replica by default) and both tables are created when missing;
//!   existing tables are checked like the source checks them.
//! * Each file is two prepared inserts at `LOCAL_QUORUM`, the data row
//!   first, then the metadata row, so a metadata row always has its data
//!   row; at most `concurrency` files at a time, each insert retried like a
//!   read (timeouts, overload, unavailable, write timeouts).
//! * `resume`: the metadata table is read once first, and files whose id is
//!   there with the same label and size are skipped.
//! * `verify`: afterwards every metadata row is compared with its file's
//!   label and size, and every blob read back and compared byte for byte.

use super::{drive, retry, walk, IngestError, IngestReport, Item, Items, Phase, Step, Target};
use futures_util::TryStreamExt;
use granary_agent::source::cql::{
    AttemptError, CqlCatalog, CqlSettings, CqlSource, CATALOG_PAGE_SIZE,
};
use scylla::client::session::Session;
use scylla::serialize::row::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, Statement};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The namespace of sample ids: ids are `UUIDv5(SAMPLE_NAMESPACE, relative
/// path)`.
pub const SAMPLE_NAMESPACE: Uuid = Uuid::from_u128(0x6b1c_0a4e_8f3d_5e21_9a47_c2d8_13f0_7e65);

/// Time limit of a schema change (keyspace or table creation).
const SCHEMA_TIMEOUT: Duration = Duration::from_secs(60);

/// The id of the sample at `rel` (its path below the dataset folder,
/// components joined by `/`).
pub fn sample_id(rel: &str) -> Uuid {
    Uuid::new_v5(&SAMPLE_NAMESPACE, rel.as_bytes())
}

/// How the keyspace is replicated when `ingest` creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replication {
    /// SimpleStrategy with this many replicas.
    Simple(u32),
    /// NetworkTopologyStrategy: replicas per datacenter.
    PerDatacenter(Vec<(String, u32)>),
}

impl Replication {
    /// Parses `--replication`: `N` (SimpleStrategy, N replicas) or
    /// `DC:N[,DC:N…]` (NetworkTopologyStrategy).
    pub fn parse(s: &str) -> Result<Replication, String> {
        let count = |n: &str| {
            n.parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{n:?} is not a replica count (1 or more)"))
        };
        if !s.contains(':') {
            return Ok(Replication::Simple(count(s)?));
        }
        let mut dcs = Vec::new();
        for part in s.split(',') {
            let (dc, n) = part
                .split_once(':')
                .ok_or_else(|| format!("{part:?}: expected DATACENTER:REPLICAS"))?;
            let ok = !dc.is_empty()
                && dc
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
            if !ok {
                return Err(format!("{dc:?} is not a datacenter name"));
            }
            dcs.push((dc.to_owned(), count(n)?));
        }
        Ok(Replication::PerDatacenter(dcs))
    }

    /// The CQL map literal.
    pub fn to_cql(&self) -> String {
        match self {
            Replication::Simple(n) => {
                format!("{{'class': 'SimpleStrategy', 'replication_factor': {n}}}")
            }
            Replication::PerDatacenter(dcs) => {
                let mut s = "{'class': 'NetworkTopologyStrategy'".to_owned();
                for (dc, n) in dcs {
                    s.push_str(&format!(", '{dc}': {n}"));
                }
                s.push('}');
                s
            }
        }
    }
}

/// What to ingest, where, how.
#[derive(Debug, Clone)]
pub struct CqlIngestOptions {
    /// The dataset folder.
    pub src: PathBuf,
    /// Cluster, keyspace, tables, credentials, timeouts, retries.
    pub settings: CqlSettings,
    /// Replication of the keyspace, if `ingest` creates it.
    pub replication: Replication,
    /// Files in flight at once.
    pub concurrency: usize,
    /// Read everything back and compare.
    pub verify: bool,
    /// Skip files whose metadata row is there with the same label and size.
    pub resume: bool,
}

impl CqlIngestOptions {
    /// Options with 64 files in flight, SimpleStrategy with one replica, no
    /// verification, no resume.
    pub fn new(src: impl Into<PathBuf>, settings: CqlSettings) -> CqlIngestOptions {
        CqlIngestOptions {
            src: src.into(),
            settings,
            replication: Replication::Simple(1),
            concurrency: 64,
            verify: false,
            resume: false,
        }
    }
}

/// Splits `cql://host[:port][,host[:port]…]/keyspace` into contact points
/// and keyspace.
pub fn parse_cql_url(url: &str) -> Result<(Vec<String>, String), String> {
    let rest = url
        .strip_prefix("cql://")
        .ok_or_else(|| format!("{url:?} is not a cql://HOST:PORT[,HOST:PORT]/KEYSPACE URL"))?;
    let (hosts, keyspace) = rest
        .split_once('/')
        .ok_or_else(|| format!("{url:?} names no keyspace (cql://HOST:PORT/KEYSPACE)"))?;
    let hosts: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for h in &hosts {
        granary_agent::config::parse_cql_host(h)?;
    }
    let keyspace = keyspace.trim_end_matches('/');
    if !granary_agent::config::is_cql_name(keyspace) {
        return Err(format!(
            "keyspace {keyspace:?}: 1 to 48 lowercase letters, digits or '_', starting with a letter"
        ));
    }
    Ok((hosts, keyspace.to_owned()))
}

/// The prepared statements and session the tasks share: the ingest's
/// [`Target`].
#[derive(Clone)]
struct Writer {
    session: Arc<Session>,
    insert_data: PreparedStatement,
    insert_meta: PreparedStatement,
    read: PreparedStatement,
    settings: Arc<CqlSettings>,
}

/// Writes `opts.src` into the tables of `opts.settings`; `progress(phase,
/// files done, files in all, bytes done)` is called as files finish. See
/// the module docs.
pub fn ingest(
    opts: &CqlIngestOptions,
    progress: impl FnMut(Phase, u64, u64, u64),
) -> Result<IngestReport, IngestError> {
    let mut items = Vec::new();
    for f in walk(&opts.src, "a sample name")? {
        if f.size > i32::MAX as u64 {
            return Err(IngestError::Source(format!(
                "{}: {} bytes; a sample must be under 2 GiB (the size column is an int)",
                f.file.display(),
                f.size
            )));
        }
        items.push(Item {
            key: sample_id(&f.rel),
            file: f.file,
            label: f.label,
            size: f.size,
        });
    }
    let setup = |e: granary_agent::source::cql::CqlError| IngestError::Setup(e.to_string());
    let source = CqlSource::connect(&opts.settings).map_err(setup)?;
    let settings = Arc::new(opts.settings.clone());
    source.block_on(async {
        let s = source.session();
        create_schema(s, &settings, &opts.replication)
            .await
            .map_err(setup)?;
        CqlCatalog::check_tables(s, &settings)
            .await
            .map_err(setup)?;
        let writer = Writer {
            session: s.clone(),
            insert_data: prepare(
                s,
                &settings,
                format!(
                    "INSERT INTO {} (id, label, data) VALUES (?, ?, ?)",
                    settings.data_ref()
                ),
            )
            .await?,
            insert_meta: prepare(
                s,
                &settings,
                format!(
                    "INSERT INTO {} (id, label, size, crc) VALUES (?, ?, ?, ?)",
                    settings.metadata_ref()
                ),
            )
            .await?,
            read: prepare(
                s,
                &settings,
                format!("SELECT data FROM {} WHERE id = ?", settings.data_ref()),
            )
            .await?,
            settings: settings.clone(),
        };
        drive(
            &writer,
            items,
            opts.concurrency,
            opts.resume,
            opts.verify,
            progress,
        )
        .await
    })
}

/// Runs `statement` (a schema change) once, with a long timeout; the driver
/// waits for schema agreement afterwards.
async fn schema_change(
    session: &Session,
    cql: String,
) -> Result<(), granary_agent::source::cql::CqlError> {
    let mut st = Statement::new(cql.clone());
    st.set_request_timeout(Some(SCHEMA_TIMEOUT));
    session
        .query_unpaged(st, ())
        .await
        .map(|_| ())
        .map_err(|e| {
            let e = AttemptError::from(e);
            granary_agent::source::cql::CqlError::request(format!("run {cql:?}"), (e, 1))
        })
}

async fn create_schema(
    session: &Session,
    settings: &CqlSettings,
    replication: &Replication,
) -> Result<(), granary_agent::source::cql::CqlError> {
    schema_change(
        session,
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {} WITH replication = {}",
            settings.keyspace,
            replication.to_cql()
        ),
    )
    .await?;
    schema_change(
        session,
        format!(
            "CREATE TABLE IF NOT EXISTS {} (id uuid PRIMARY KEY, label int, data blob)",
            settings.data_ref()
        ),
    )
    .await?;
    schema_change(
        session,
        format!(
            "CREATE TABLE IF NOT EXISTS {} (id uuid PRIMARY KEY, label int, size int, crc int)",
            settings.metadata_ref()
        ),
    )
    .await?;
    // A metadata table from before the `crc` column gets it (its rows
    // written earlier keep a null CRC, which the agent does not check).
    if !CqlCatalog::has_crc_column(session, settings).await? {
        schema_change(
            session,
            format!("ALTER TABLE {} ADD crc int", settings.metadata_ref()),
        )
        .await?;
    }
    Ok(())
}

async fn prepare(
    session: &Session,
    settings: &CqlSettings,
    cql: String,
) -> Result<PreparedStatement, IngestError> {
    let mut st = retry::cql(settings, 3, || async {
        Ok(session.prepare(cql.as_str()).await?)
    })
    .await
    .map_err(|e| {
        IngestError::Setup(
            granary_agent::source::cql::CqlError::request(format!("prepare {cql:?}"), e)
                .to_string(),
        )
    })?;
    st.set_consistency(Consistency::LocalQuorum);
    st.set_is_idempotent(true);
    st.set_request_timeout(Some(settings.request_timeout));
    st.set_retry_policy(Some(Arc::new(
        scylla::policies::retry::FallthroughRetryPolicy::new(),
    )));
    Ok(st)
}

/// `id → (label, size)` of every metadata row.
async fn read_metadata(
    session: &Session,
    settings: &CqlSettings,
) -> Result<HashMap<Uuid, (i32, i64)>, IngestError> {
    let table = settings.metadata_ref();
    let mut st = Statement::new(format!("SELECT id, label, size FROM {table}"));
    st.set_page_size(CATALOG_PAGE_SIZE);
    st.set_consistency(Consistency::LocalQuorum);
    retry::cql(settings, 4, || async {
        let mut rows = session
            .query_iter(st.clone(), ())
            .await?
            .rows_stream::<(Uuid, Option<i32>, Option<i32>)>()
            .map_err(|e| {
                AttemptError::fatal(
                    std::io::ErrorKind::InvalidData,
                    format!("{table}: unexpected columns: {e}"),
                )
            })?;
        let mut out = HashMap::new();
        while let Some((id, label, size)) = rows.try_next().await? {
            out.insert(id, (label.unwrap_or(-1), size.map_or(-1, i64::from)));
        }
        Ok(out)
    })
    .await
    .map_err(|e| {
        IngestError::Setup(
            granary_agent::source::cql::CqlError::request(format!("read {table}"), e).to_string(),
        )
    })
}

impl Writer {
    /// Executes `statement` with `values`, retried by the settings' policy
    /// (jittered by `seed`).
    async fn execute(
        &self,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        seed: u64,
    ) -> Result<(), (AttemptError, u32)> {
        retry::cql(&self.settings, seed, || async {
            self.session.execute_unpaged(statement, &values).await?;
            Ok(())
        })
        .await
    }
}

/// Whether each item's metadata row is there with its label and size;
/// `rows` are the metadata table's ([`read_metadata`]).
fn rows_match(items: &Items<Uuid>, rows: &HashMap<Uuid, (i32, i64)>) -> Vec<bool> {
    items
        .iter()
        .map(|it| rows.get(&it.key) == Some(&(it.label, it.size as i64)))
        .collect()
}

impl Target for Writer {
    type Key = Uuid;

    async fn stored(&self, items: &Items<Uuid>) -> Result<Vec<bool>, IngestError> {
        let rows = read_metadata(&self.session, &self.settings).await?;
        Ok(rows_match(items, &rows))
    }

    fn write(&self, it: Arc<Item<Uuid>>, seed: u64) -> impl Step {
        let w = self.clone();
        async move {
            let data = it.read()?;
            let url = w.settings.url_of(&it.key);
            w.execute(&w.insert_data, (it.key, it.label, data.as_slice()), seed)
                .await
                .map_err(|(e, n)| {
                    format!(
                        "{} -> {url}: {} after {n} attempt(s)",
                        it.file.display(),
                        e.message
                    )
                })?;
            // The blob's CRC-32C, its 32 bits as the int column holds them.
            let crc = i32::from_ne_bytes(crc32c::crc32c(&data).to_ne_bytes());
            w.execute(
                &w.insert_meta,
                (it.key, it.label, it.size as i32, crc),
                seed,
            )
            .await
            .map_err(|(e, n)| {
                format!(
                    "{} -> {} row {}: {} after {n} attempt(s)",
                    it.file.display(),
                    w.settings.metadata_ref(),
                    it.key,
                    e.message
                )
            })
        }
    }

    /// Every item's metadata row must be there with its label and size.
    async fn check(&self, items: &Items<Uuid>) -> Result<Vec<(usize, String)>, IngestError> {
        let rows = read_metadata(&self.session, &self.settings).await?;
        let ok = rows_match(items, &rows);
        Ok(items
            .iter()
            .zip(ok)
            .enumerate()
            .filter(|(_, (_, ok))| !ok)
            .map(|(i, (it, _))| {
                let got = rows.get(&it.key);
                let m = format!(
                    "{}: metadata row {} is {got:?}, expected (label {}, size {})",
                    it.file.display(),
                    it.key,
                    it.label,
                    it.size
                );
                (i, m)
            })
            .collect())
    }

    fn verify(&self, it: Arc<Item<Uuid>>, seed: u64) -> impl Step {
        let w = self.clone();
        async move {
            let url = w.settings.url_of(&it.key);
            let remote = retry::cql(&w.settings, seed, || async {
                let r = w.session.execute_unpaged(&w.read, (it.key,)).await?;
                let invalid = |e: String| AttemptError::fatal(std::io::ErrorKind::InvalidData, e);
                let rows = r.into_rows_result().map_err(|e| invalid(e.to_string()))?;
                let row = rows
                    .maybe_first_row::<(Option<Vec<u8>>,)>()
                    .map_err(|e| invalid(e.to_string()))?;
                Ok(row.and_then(|r| r.0))
            })
            .await
            .map_err(|(e, n)| format!("{url}: {} after {n} attempt(s)", e.message))?
            .ok_or_else(|| format!("{url}: no data row"))?;
            it.compare(&url, &remote, &it.read()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cql_urls_parse() {
        assert_eq!(
            parse_cql_url("cql://10.0.0.1:9042,db2/imagenet").unwrap(),
            (
                vec!["10.0.0.1:9042".to_owned(), "db2".to_owned()],
                "imagenet".to_owned()
            )
        );
        assert_eq!(parse_cql_url("cql://[::1]:19042/ks/").unwrap().1, "ks");
        for bad in [
            "s3://b/p",
            "cql://h",
            "cql://h/",
            "cql:///ks",
            "cql://h:0/ks",
            "cql://h/Bad",
        ] {
            assert!(parse_cql_url(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn replication_parses_and_prints_as_cql() {
        assert_eq!(Replication::parse("3").unwrap(), Replication::Simple(3));
        assert_eq!(
            Replication::parse("dc1:3,dc-2:2").unwrap().to_cql(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc-2': 2}"
        );
        assert_eq!(
            Replication::Simple(1).to_cql(),
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        for bad in ["0", "x", "dc1:0", ":3", "d'c:1", "dc1:3,"] {
            assert!(Replication::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sample_ids_are_stable_and_distinct() {
        let a = sample_id("class_a/img_0001.jpg");
        assert_eq!(a, sample_id("class_a/img_0001.jpg"));
        assert_ne!(a, sample_id("class_a/img_0002.jpg"));
        assert_ne!(a, sample_id("class_b/img_0001.jpg"));
        assert_eq!(a.get_version_num(), 5);
        // Pinned (RFC 4122 v5, checked with Python's uuid.uuid5): changing
        // the namespace would orphan every row ingested so far.
        assert_eq!(
            sample_id("a/1.bin").to_string(),
            "0d452219-5e7b-5596-8009-f0a10b30b828"
        );
    }

    #[test]
    fn a_missing_folder_fails_before_connecting() {
        let opts = CqlIngestOptions::new(
            "/nonexistent/granary-ingest-src",
            CqlSettings::new(vec!["127.0.0.1:1".into()], "ks"),
        );
        let e = ingest(&opts, |_, _, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("granary-ingest-src"), "{e}");
    }
}
