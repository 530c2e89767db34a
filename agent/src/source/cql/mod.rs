//! The CQL source: datasets in ScyllaDB or Cassandra tables, read through
//! the `scylla` driver.
//!
//! The layout is two tables in one keyspace (names configurable):
//!
//! ```cql
//! CREATE TABLE ks.data     (id uuid PRIMARY KEY, label int, data blob);
//! CREATE TABLE ks.metadata (id uuid PRIMARY KEY, label int, size int);
//! ```
//!
//! Four pieces, usable on their own:
//!
//! * [`CqlSettings`]: where the cluster is and how to reach it (contact
//!   points, keyspace and table names, credentials, TLS, connection pool,
//!   requests in flight, per-request timeout, retries).
//! * [`session`]: the driver session those settings describe — token-aware
//!   load balancing, the driver's own retries off (one policy, ours), reads
//!   at `LOCAL_ONE`, TLS through rustls.
//! * [`CqlCatalog`] (module [`catalog`]): the samples, read once from the
//!   metadata table (paged) after its schema is checked, in a fixed order:
//!   by label, then by the id's 16 bytes.
//! * [`CqlFetcher`] (module [`fetcher`]): one prepared
//!   `SELECT data FROM ks.data WHERE id = ?` per sample, thousands in flight
//!   on a small tokio runtime, the blob copied once, from the driver's
//!   receive buffer into the caller's memory. Its interface has the shape of
//!   `crate::source::fs::reader::UringReader` and the S3 fetcher.
//!
//! [`CqlSource`] ties the session and its runtime together; [`CqlDataset`]
//! adds the catalog and a fetcher and is what the engine drives, through
//! [`super::SampleSource`]. See `docs/scylla.md`.

pub mod catalog;
pub mod fetcher;
pub mod session;

pub use crate::source::queue::{fetch_error, is_retryable, FetchError};
pub use catalog::{CqlCatalog, CqlEntry};
pub use fetcher::{CqlFetcher, FetchOptions, FetchRequest, FetchStats, Full};

use crate::config::{parse_cql_host, DatasetConfig};
use scylla::client::session::Session;
use scylla::errors::{
    DbError, ExecutionError, NextPageError, NextRowError, PagerExecutionError, PrepareError,
    RequestAttemptError, RequestError,
};
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Default `dataset[i].request_timeout_ms`: one read attempt must be
/// answered within this.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `dataset[i].retries`.
pub(crate) const DEFAULT_RETRIES: u32 = 8;
/// Default `dataset[i].max_inflight`.
pub(crate) const DEFAULT_MAX_INFLIGHT: u32 = 2048;
/// Default `dataset[i].data_table`.
pub(crate) const DEFAULT_DATA_TABLE: &str = "data";
/// Default `dataset[i].metadata_table`.
pub(crate) const DEFAULT_METADATA_TABLE: &str = "metadata";
/// Environment variable holding the password when the configuration (or
/// the command line) names a user but no password.
pub(crate) const PASSWORD_ENV: &str = "GRANARY_CQL_PASSWORD";
/// Rows per page when the metadata table is read.
pub const CATALOG_PAGE_SIZE: i32 = 5000;

/// How many connections the driver keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// This many to every node.
    PerHost(u32),
    /// This many to every shard of every ScyllaDB node (a Cassandra node is
    /// one shard).
    PerShard(u32),
}

/// How to reach a dataset's tables.
#[derive(Clone, PartialEq, Eq)]
pub struct CqlSettings {
    /// Contact points, `host:port`.
    pub hosts: Vec<String>,
    /// The keyspace of both tables.
    pub keyspace: String,
    /// `(id uuid PRIMARY KEY, data blob, …)`.
    pub data_table: String,
    /// `(id uuid PRIMARY KEY, label int, size int)`.
    pub metadata_table: String,
    /// Password authentication: user name.
    pub username: Option<String>,
    /// Password authentication: password.
    pub password: Option<String>,
    /// Connect with TLS.
    pub tls: bool,
    /// PEM file of the authorities to trust (`None`: the system's).
    pub tls_ca_file: Option<PathBuf>,
    /// Connections kept by the driver.
    pub pool: Pool,
    /// Sample reads in flight at once.
    pub max_inflight: u32,
    /// Time limit of one request attempt.
    pub request_timeout: Duration,
    /// Retries after the first attempt, for retryable failures.
    pub retries: u32,
}

impl fmt::Debug for CqlSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlSettings")
            .field("hosts", &self.hosts)
            .field("keyspace", &self.keyspace)
            .field("data_table", &self.data_table)
            .field("metadata_table", &self.metadata_table)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("pool", &self.pool)
            .field("max_inflight", &self.max_inflight)
            .field("request_timeout", &self.request_timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl CqlSettings {
    /// Settings for `keyspace` on `hosts` with every default: tables `data`
    /// and `metadata`, no authentication, no TLS, one connection per shard,
    /// 2048 reads in flight, 10 s timeout, 8 retries.
    pub fn new(hosts: Vec<String>, keyspace: impl Into<String>) -> CqlSettings {
        CqlSettings {
            hosts,
            keyspace: keyspace.into(),
            data_table: DEFAULT_DATA_TABLE.to_owned(),
            metadata_table: DEFAULT_METADATA_TABLE.to_owned(),
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            pool: Pool::PerShard(1),
            max_inflight: DEFAULT_MAX_INFLIGHT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            retries: DEFAULT_RETRIES,
        }
    }

    /// The settings of a `kind = "cql"` dataset; the password comes from
    /// `PASSWORD_ENV` when a user is named without one.
    pub fn from_dataset(ds: &DatasetConfig) -> Result<CqlSettings, CqlError> {
        let DatasetConfig::Cql(ds) = ds else {
            return Err(CqlError::Settings(format!(
                "dataset {:?}: is not a CQL dataset",
                ds.name()
            )));
        };
        let mut s = CqlSettings::new(ds.hosts.clone(), ds.keyspace.clone());
        s.data_table = ds.data_table.clone();
        s.metadata_table = ds.metadata_table.clone();
        s.username = ds.username.clone();
        s.password = ds.password.as_ref().map(|p| p.expose().to_owned());
        s.tls = ds.tls;
        s.tls_ca_file = ds.tls_ca_file.clone();
        s.pool = match (ds.connections_per_host, ds.connections_per_shard) {
            (Some(n), _) => Pool::PerHost(n),
            (None, Some(n)) => Pool::PerShard(n),
            (None, None) => Pool::PerShard(1),
        };
        s.max_inflight = ds.max_inflight;
        s.request_timeout = Duration::from_millis(ds.request_timeout_ms);
        s.retries = ds.retries;
        s.fill_from_env(|k| std::env::var(k).ok());
        s.check()?;
        Ok(s)
    }

    /// Takes the password from `PASSWORD_ENV` (looked up with `var`) when
    /// a user is named without one.
    pub fn fill_from_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if self.username.is_some() && self.password.is_none() {
            self.password = var(PASSWORD_ENV);
        }
    }

    /// Checks what the driver would otherwise reject later or silently: the
    /// hosts, the names (only names that need no quoting are accepted, so
    /// they can be written into statements as they are), a user without a
    /// password, a zero timeout, capacity or pool.
    pub fn check(&self) -> Result<(), CqlError> {
        let bad = |m: String| Err(CqlError::Settings(m));
        if self.hosts.is_empty() {
            return bad("no contact point (hosts is empty)".to_owned());
        }
        for h in &self.hosts {
            parse_cql_host(h).map_err(|e| CqlError::Settings(format!("hosts: {e}")))?;
        }
        for (what, name) in [
            ("keyspace", &self.keyspace),
            ("data table", &self.data_table),
            ("metadata table", &self.metadata_table),
        ] {
            if !crate::config::is_cql_name(name) {
                return bad(format!(
                    "{what} {name:?} is not a name Granary accepts (1 to 48 lowercase letters, \
                     digits or '_', starting with a letter)"
                ));
            }
        }
        if self.data_table == self.metadata_table {
            return bad(format!(
                "the data and metadata tables are both {:?}",
                self.data_table
            ));
        }
        if self.username.is_some() && self.password.is_none() {
            return bad(format!(
                "user {:?} has no password: set `password`, or {PASSWORD_ENV} in the environment",
                self.username.as_deref().unwrap_or("")
            ));
        }
        if self.username.is_none() && self.password.is_some() {
            return bad("a password is set without a username".to_owned());
        }
        if self.tls_ca_file.is_some() && !self.tls {
            return bad("tls_ca_file is set but TLS is off".to_owned());
        }
        if self.request_timeout.is_zero() {
            return bad("request timeout must be above zero".to_owned());
        }
        if self.max_inflight == 0 {
            return bad("max_inflight must be at least 1".to_owned());
        }
        if matches!(self.pool, Pool::PerHost(0) | Pool::PerShard(0)) {
            return bad("the connection pool must hold at least one connection".to_owned());
        }
        Ok(())
    }

    /// `ks.data`.
    pub fn data_ref(&self) -> String {
        format!("{}.{}", self.keyspace, self.data_table)
    }

    /// `ks.metadata`.
    pub fn metadata_ref(&self) -> String {
        format!("{}.{}", self.keyspace, self.metadata_table)
    }

    /// `cql://ks.data/<id>`, for messages.
    pub fn url_of(&self, id: &Uuid) -> String {
        format!("cql://{}/{id}", self.data_ref())
    }

    /// Fetch options for these settings.
    pub fn fetch_options(&self) -> FetchOptions {
        FetchOptions {
            capacity: self.max_inflight,
            request_timeout: self.request_timeout,
        }
    }
}

/// Why a CQL operation other than a sample fetch failed.
#[derive(Debug)]
pub enum CqlError {
    /// The settings are incomplete or wrong.
    Settings(String),
    /// No session could be opened.
    Connect {
        /// The contact points.
        hosts: Vec<String>,
        /// What the driver said, with a hint where one helps.
        message: String,
    },
    /// A table is missing or does not have the expected columns.
    Schema(String),
    /// A request failed (after its retries).
    Request {
        /// What was being done (`read ks.metadata`).
        what: String,
        /// Whether the last failure was of the kind that may go away.
        retryable: bool,
        /// Attempts made.
        attempts: u32,
        /// What went wrong.
        message: String,
    },
    /// The metadata table has a row Granary cannot use.
    BadRow {
        /// The table.
        table: String,
        /// The row's id.
        id: Uuid,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for CqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CqlError::Settings(m) => write!(f, "CQL settings: {m}"),
            CqlError::Connect { hosts, message } => {
                write!(f, "cannot connect to {}: {message}", hosts.join(","))
            }
            CqlError::Schema(m) => f.write_str(m),
            CqlError::Request {
                what,
                attempts,
                message,
                ..
            } => {
                write!(f, "cannot {what}: {message}")?;
                if *attempts > 1 {
                    write!(f, " (after {attempts} attempts)")?;
                }
                Ok(())
            }
            CqlError::BadRow { table, id, reason } => write!(f, "{table}, id {id}: {reason}"),
        }
    }
}

impl std::error::Error for CqlError {}

impl From<CqlError> for io::Error {
    fn from(e: CqlError) -> io::Error {
        let kind = match &e {
            CqlError::Settings(_) => io::ErrorKind::InvalidInput,
            CqlError::Connect { .. } => io::ErrorKind::ConnectionRefused,
            CqlError::Schema(_) | CqlError::BadRow { .. } => io::ErrorKind::InvalidData,
            CqlError::Request {
                retryable: true, ..
            } => io::ErrorKind::TimedOut,
            CqlError::Request { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// How a failed request is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The `io::ErrorKind` it is reported with.
    pub kind: io::ErrorKind,
    /// Whether another attempt may succeed: client timeouts, broken or
    /// missing connections, and the server's overloaded, unavailable, read
    /// and write timeout, bootstrapping, rate-limit and server errors. Not:
    /// syntax, invalid request, unauthorized, authentication, protocol and
    /// decoding errors.
    pub retryable: bool,
    /// A short description (`overloaded`, `timed out`, …).
    pub what: String,
}

impl Failure {
    /// A failure reported as `kind`, described as `what`.
    pub fn new(kind: io::ErrorKind, retryable: bool, what: &str) -> Failure {
        Failure {
            kind,
            retryable,
            what: what.to_owned(),
        }
    }
}

/// Classifies a driver error (see [`Failure::retryable`]).
pub fn classify(err: &ExecutionError) -> Failure {
    use io::ErrorKind as K;
    let fail = Failure::new;
    match err {
        ExecutionError::RequestTimeout(_) => fail(K::TimedOut, true, "timed out"),
        ExecutionError::ConnectionPoolError(_) => {
            fail(K::NotConnected, true, "no connection to the node")
        }
        ExecutionError::EmptyPlan => fail(K::NotConnected, true, "no node to send the request to"),
        ExecutionError::LastAttemptError(e) => classify_attempt(e),
        ExecutionError::BadQuery(_) => fail(K::InvalidInput, false, "bad statement"),
        ExecutionError::PrepareError(PrepareError::AllAttemptsFailed { first_attempt }) => {
            classify_attempt(first_attempt)
        }
        ExecutionError::PrepareError(PrepareError::ConnectionPoolError(_)) => {
            fail(K::NotConnected, true, "no connection to the node")
        }
        ExecutionError::PrepareError(_) => fail(K::Other, false, "cannot prepare the statement"),
        _ => fail(K::Other, false, "request failed"),
    }
}

/// Classifies the error of one attempt.
pub(crate) fn classify_attempt(err: &RequestAttemptError) -> Failure {
    use io::ErrorKind as K;
    let fail = Failure::new;
    match err {
        RequestAttemptError::DbError(db, _) => classify_db(db),
        RequestAttemptError::BrokenConnectionError(_) => {
            fail(K::ConnectionReset, true, "connection broken")
        }
        RequestAttemptError::UnableToAllocStreamId => {
            fail(K::WouldBlock, true, "no free stream on the connection")
        }
        RequestAttemptError::SerializationError(_)
        | RequestAttemptError::CqlRequestSerialization(_) => {
            fail(K::InvalidInput, false, "cannot serialize the request")
        }
        RequestAttemptError::CqlResultParseError(_)
        | RequestAttemptError::CqlErrorParseError(_)
        | RequestAttemptError::BodyExtensionsParseError(_)
        | RequestAttemptError::UnexpectedResponse(_) => {
            fail(K::InvalidData, false, "cannot decode the response")
        }
        _ => fail(K::Other, false, "request failed"),
    }
}

/// Classifies an error the server answered with.
pub(crate) fn classify_db(db: &DbError) -> Failure {
    use io::ErrorKind as K;
    let (kind, retryable, what) = match db {
        DbError::Overloaded => (K::Other, true, "overloaded"),
        DbError::Unavailable { .. } => (K::Other, true, "unavailable"),
        DbError::ReadTimeout { .. } => (K::TimedOut, true, "read timeout"),
        DbError::WriteTimeout { .. } => (K::TimedOut, true, "write timeout"),
        DbError::IsBootstrapping => (K::Other, true, "the node is bootstrapping"),
        DbError::RateLimitReached { .. } => (K::Other, true, "rate limit reached"),
        DbError::ServerError => (K::Other, true, "server error"),
        DbError::Unprepared { .. } => (K::Other, true, "statement not prepared on the node"),
        DbError::ReadFailure { .. } => (K::Other, false, "read failure"),
        DbError::WriteFailure { .. } => (K::Other, false, "write failure"),
        DbError::SyntaxError => (K::InvalidInput, false, "syntax error"),
        DbError::Invalid => (K::InvalidInput, false, "invalid request"),
        DbError::Unauthorized => (K::PermissionDenied, false, "unauthorized"),
        DbError::AuthenticationError => (K::PermissionDenied, false, "authentication failed"),
        DbError::ConfigError => (K::InvalidInput, false, "configuration error"),
        DbError::AlreadyExists { .. } => (K::AlreadyExists, false, "already exists"),
        DbError::ProtocolError => (K::InvalidData, false, "protocol error"),
        _ => (K::Other, false, "server error"),
    };
    Failure::new(kind, retryable, what)
}

/// One failed attempt of a request, judged ([`classify`]) and described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    /// How it is judged.
    pub failure: Failure,
    /// `what: driver message`.
    pub message: String,
    /// The row is not what the catalog recorded (its CRC-32C differs):
    /// reported as [`Changed`](super::queue::Changed), final.
    pub changed: Option<super::queue::Changed>,
}

impl AttemptError {
    /// An attempt that failed as `failure` for the reason `err`.
    pub fn new(failure: Failure, err: impl fmt::Display) -> AttemptError {
        let message = format!("{}: {err}", failure.what);
        AttemptError {
            failure,
            message,
            changed: None,
        }
    }

    /// A row that is not what the catalog recorded.
    pub fn changed(changed: super::queue::Changed) -> AttemptError {
        let mut e = AttemptError::fatal(io::ErrorKind::InvalidData, changed.to_string());
        e.changed = Some(changed);
        e
    }

    /// A failure Granary finds itself (a missing row, a wrong length).
    pub fn fatal(kind: io::ErrorKind, message: String) -> AttemptError {
        AttemptError {
            failure: Failure::new(kind, false, &message),
            message,
            changed: None,
        }
    }

    /// Whether another attempt may succeed.
    pub fn retryable(&self) -> bool {
        self.failure.retryable
    }
}

impl From<ExecutionError> for AttemptError {
    fn from(e: ExecutionError) -> AttemptError {
        AttemptError::new(classify(&e), e)
    }
}

impl From<PrepareError> for AttemptError {
    fn from(e: PrepareError) -> AttemptError {
        AttemptError::from(ExecutionError::from(e))
    }
}

impl From<RequestError> for AttemptError {
    fn from(e: RequestError) -> AttemptError {
        let f = match &e {
            RequestError::LastAttemptError(a) => classify_attempt(a),
            RequestError::RequestTimeout(_) => {
                Failure::new(io::ErrorKind::TimedOut, true, "timed out")
            }
            _ => Failure::new(
                io::ErrorKind::NotConnected,
                true,
                "no connection to the node",
            ),
        };
        AttemptError::new(f, e)
    }
}

impl From<PagerExecutionError> for AttemptError {
    fn from(e: PagerExecutionError) -> AttemptError {
        match e {
            PagerExecutionError::PrepareError(p) => p.into(),
            PagerExecutionError::NextPageError(NextPageError::RequestFailure(r)) => r.into(),
            other => AttemptError::new(
                Failure::new(io::ErrorKind::Other, false, "request failed"),
                other,
            ),
        }
    }
}

impl From<NextRowError> for AttemptError {
    fn from(e: NextRowError) -> AttemptError {
        match e {
            NextRowError::NextPageError(NextPageError::RequestFailure(r)) => r.into(),
            other => {
                let f = Failure::new(io::ErrorKind::InvalidData, false, "cannot read the rows");
                AttemptError::new(f, other)
            }
        }
    }
}

/// Runs `op` once, and gives its error with the number of attempts (1).
/// The agent makes one attempt per request: a sample is read again by the
/// engine's retry policy, a dataset whose catalog cannot be read is opened
/// again in the background (`crate::dataset`).
pub(crate) async fn once<T, F, Fut>(op: F) -> Result<T, (AttemptError, u32)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, AttemptError>>,
{
    op().await.map_err(|e| (e, 1))
}

impl CqlError {
    /// A request error after `attempts` attempts of `what`.
    pub fn request(what: impl Into<String>, (err, attempts): (AttemptError, u32)) -> CqlError {
        CqlError::Request {
            what: what.into(),
            retryable: err.retryable(),
            attempts,
            message: err.message,
        }
    }
}

/// A session to a cluster on a tokio runtime of its own (two worker
/// threads named `granary-cql`).
pub struct CqlSource {
    // Drop order: the session (its background tasks stop when it goes)
    // before the runtime it runs on.
    session: Arc<Session>,
    runtime: Arc<tokio::runtime::Runtime>,
    settings: CqlSettings,
}

impl fmt::Debug for CqlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlSource")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl CqlSource {
    /// Checks `settings` and opens a session (blocking): the driver
    /// connects to the contact points, learns the topology and the
    /// keyspace's replication, and opens its connection pools.
    pub fn connect(settings: &CqlSettings) -> Result<CqlSource, CqlError> {
        settings.check()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("granary-cql")
            .enable_all()
            .build()
            .map_err(|e| CqlError::Settings(format!("starting the CQL runtime: {e}")))?;
        let session = runtime.block_on(session::connect(settings))?;
        Ok(CqlSource {
            session: Arc::new(session),
            runtime: Arc::new(runtime),
            settings: settings.clone(),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &CqlSettings {
        &self.settings
    }

    /// The driver session.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Runs `f` to completion on the source's runtime, blocking the caller
    /// (who must not be on a runtime thread).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Checks the tables and reads the catalog from the metadata table
    /// (blocking).
    pub fn catalog(&self) -> Result<CqlCatalog, CqlError> {
        self.block_on(CqlCatalog::load(&self.session, &self.settings))
    }

    /// A fetcher with the settings' options (blocking: it prepares the
    /// statement).
    pub fn fetcher(&self) -> Result<CqlFetcher, CqlError> {
        self.fetcher_with(self.settings.fetch_options())
    }

    /// A fetcher with other options on the same session.
    pub fn fetcher_with(&self, options: FetchOptions) -> Result<CqlFetcher, CqlError> {
        let statement = self.block_on(session::prepare_read(&self.session, &self.settings))?;
        CqlFetcher::new(
            self.runtime.clone(),
            self.session.clone(),
            statement,
            self.settings.data_ref(),
            options,
        )
        .map_err(|e| CqlError::Settings(format!("creating the fetcher: {e}")))
    }
}

/// A CQL dataset as the engine drives it: the session, the catalog and a
/// fetcher.
pub struct CqlDataset {
    // Drop order: the fetcher (it waits until no read can write any more)
    // before the session.
    fetcher: CqlFetcher,
    landing: super::Landing,
    catalog: CqlCatalog,
    source: CqlSource,
}

impl fmt::Debug for CqlDataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlDataset")
            .field("samples", &self.catalog.len())
            .field("source", &self.source)
            .field("fetcher", &self.fetcher)
            .finish()
    }
}

impl CqlDataset {
    /// Connects, loads the catalog and prepares the read statement for a
    /// `kind = "cql"` dataset (blocking).
    /// Each read is one attempt (the engine's retry policy is the only
    /// retry layer), limited to `read_timeout` or the dataset's
    /// `request_timeout_ms`, whichever is shorter.
    pub fn open(ds: &DatasetConfig, read_timeout: Duration) -> Result<CqlDataset, CqlError> {
        let mut settings = CqlSettings::from_dataset(ds)?;
        settings.retries = 0;
        settings.request_timeout = settings.request_timeout.min(read_timeout);
        CqlDataset::connect(&settings)
    }

    /// The same from settings.
    pub fn connect(settings: &CqlSettings) -> Result<CqlDataset, CqlError> {
        let source = CqlSource::connect(settings)?;
        let catalog = source.catalog()?;
        let fetcher = source.fetcher()?;
        Ok(CqlDataset {
            fetcher,
            landing: super::Landing::default(),
            catalog,
            source,
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &CqlCatalog {
        &self.catalog
    }

    /// The fetcher.
    pub fn fetcher(&self) -> &CqlFetcher {
        &self.fetcher
    }

    /// The session and its settings.
    pub fn source(&self) -> &CqlSource {
        &self.source
    }
}

impl super::SampleSource for CqlDataset {
    fn kind(&self) -> &'static str {
        "cql"
    }

    crate::source::samples::catalog_methods!();

    fn describe(&self, index: u64) -> String {
        self.source
            .settings
            .url_of(&self.catalog.entries()[index as usize].id)
    }

    fn capacity(&self) -> u32 {
        self.fetcher.capacity()
    }

    fn in_flight(&self) -> usize {
        self.fetcher.in_flight()
    }

    fn submit(
        &mut self,
        tag: u64,
        index: u64,
        dest: granary_shm::arena::ArenaSlice,
    ) -> Result<(), super::SourceFull> {
        let e = &self.catalog.entries()[index as usize];
        if (dest.len() as u64) < e.size {
            return Err(super::SourceFull);
        }
        // Catalog sizes fit in u32 (checked when it was read).
        let req = FetchRequest {
            tag,
            id: e.id,
            len: e.size as u32,
            crc: e.crc,
            dest,
        };
        self.fetcher.submit(req).map_err(|_| super::SourceFull)
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<super::Completion>,
    ) -> io::Result<usize> {
        let fetcher = &mut self.fetcher;
        self.landing
            .poll(out, |raw| fetcher.poll_completions(wait, raw))
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.fetcher.wake_fd()
    }
}

#[cfg(test)]
mod tests;
