//! The TOML configuration of `granaryd`.
//!
//! Every field has a documented default, so an empty file plus one
//! `[[dataset]]` is a complete configuration. Unknown keys are rejected, and
//! [`Config::validate`] checks the relations between settings (timeouts,
//! ring capacities, the arena against the in-flight limit). The reference for
//! operators is `docs/configuration.md`; [`Config::default_toml`] returns the
//! commented default file that `granaryd print-default-config` prints.
//!
//! ```
//! use granary_agent::config::Config;
//! let cfg = Config::from_toml_str(r#"
//!     [arena]
//!     size = "1GiB"
//!
//!     [[dataset]]
//!     name = "imagenet"
//!     root = "/data/imagenet/train"
//! "#).unwrap();
//! assert_eq!(cfg.arena.size.bytes(), 1 << 30);
//! assert_eq!(cfg.datasets[0].name, "imagenet");
//! ```

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Smallest accepted arena.
pub const MIN_ARENA_BYTES: u64 = 64 * MIB;
/// Arena bytes reserved per in-flight read by the static "window fits the
/// arena" rule: `arena.size ≥ prefetch.max_inflight_reads × 1 MiB`.
pub const ARENA_BYTES_PER_INFLIGHT_READ: u64 = MIB;
/// The arena size must be a multiple of this (the x86-64 huge page size).
pub const ARENA_GRANULE: u64 = 2 * MIB;
/// Largest `prefetch.max_inflight_reads` (the io_uring submission queue limit).
pub const MAX_INFLIGHT_READS: u32 = 32_768;
/// Largest ring capacity, in slots (the shared-memory layout's limit).
pub const MAX_RING_CAPACITY: u32 = 1 << 20;
/// Longest dataset name, in bytes.
pub const MAX_DATASET_NAME_BYTES: usize = 255;
/// Longest socket path, in bytes (`sun_path` holds 108 bytes including the NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The whole `granaryd` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[arena]`: the shared-memory arena that holds cached samples.
    #[serde(default)]
    pub arena: ArenaConfig,
    /// `[socket]`: the Unix socket loaders connect to, and who may connect.
    #[serde(default)]
    pub socket: SocketConfig,
    /// `[prefetch]`: how far ahead and how hard the fetcher reads.
    #[serde(default)]
    pub prefetch: PrefetchConfig,
    /// `[cache]`: what stays in the arena.
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[sessions]`: limits and timeouts of loader sessions.
    #[serde(default)]
    pub sessions: SessionsConfig,
    /// `[metrics]`: the Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[[dataset]]`: the datasets this agent serves (at least one).
    #[serde(default, rename = "dataset")]
    pub datasets: Vec<DatasetConfig>,
}

/// `[arena]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArenaConfig {
    /// `arena.size`: total arena bytes. Default 4 GiB. An integer (bytes) or
    /// a string such as `"2GiB"` or `"512MiB"`; a multiple of 2 MiB, at least
    /// 64 MiB and at least `prefetch.max_inflight_reads × 1 MiB`.
    pub size: ByteSize,
    /// `arena.hugepages`: whether the arena uses huge pages. Default `try`.
    pub hugepages: HugePages,
    /// `arena.populate`: fault every arena page in at start-up, so the first
    /// epoch does not pay for page faults and a short memory reservation
    /// fails at once instead of later. Default `true`.
    pub populate: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            size: ByteSize(4 * GIB),
            hugepages: HugePages::Try,
            populate: true,
        }
    }
}

/// `arena.hugepages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    /// `"off"`: 4 KiB pages.
    Off,
    /// `"try"` (alias `"on"`): huge pages when the kernel has enough reserved,
    /// otherwise 4 KiB pages with a warning in the log. The default.
    #[default]
    #[serde(alias = "on")]
    Try,
    /// `"required"`: huge pages or refuse to start.
    Required,
}

/// `[socket]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SocketConfig {
    /// `socket.path`: the Unix socket loaders connect to. Default
    /// `/run/granary/granary.sock`; at most 107 bytes.
    pub path: PathBuf,
    /// `socket.mode`: permission bits of the socket file. Default `0660`.
    /// An octal string (`"0660"`) or an integer (write TOML's octal literal
    /// `0o660`; a plain `660` is decimal and is rejected).
    pub mode: FileMode,
    /// `socket.allowed_uids`: user ids allowed to open sessions, besides the
    /// agent's own uid, which is always allowed. Default empty.
    pub allowed_uids: Vec<u32>,
    /// `socket.allowed_gids`: group ids whose members (primary group of the
    /// connecting process) may open sessions. Default empty.
    pub allowed_gids: Vec<u32>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/run/granary/granary.sock"),
            mode: FileMode(0o660),
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
        }
    }
}

impl SocketConfig {
    /// Whether a peer with these credentials may open a session, given the
    /// agent's own uid: its uid is the agent's, or is listed in
    /// `allowed_uids`, or its gid is listed in `allowed_gids`.
    pub fn allows(&self, agent_uid: u32, peer_uid: u32, peer_gid: u32) -> bool {
        peer_uid == agent_uid
            || self.allowed_uids.contains(&peer_uid)
            || self.allowed_gids.contains(&peer_gid)
    }
}

/// `[prefetch]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefetchConfig {
    /// `prefetch.window_batches`: per session, how many batches ahead of the
    /// loader the fetcher reads once the window is fully open. Default 16.
    pub window_batches: u32,
    /// `prefetch.max_inflight_reads`: reads in flight per dataset, across
    /// all its sessions: a filesystem dataset's io_uring queue depth; a
    /// remote dataset's `max_inflight` overrides it. Default 256, at most
    /// 32768.
    pub max_inflight_reads: u32,
    /// `prefetch.initial_window`: the window a new session starts with, in
    /// batches; it grows toward `window_batches` as batches complete (slow
    /// start). Default 2.
    pub initial_window: u32,
    /// `prefetch.read_retries`: how many times a failed read is retried
    /// before the batch is reported to the loader as failed. Default 3.
    pub read_retries: u32,
    /// `prefetch.retry_backoff_ms`: delay before the first retry, in
    /// milliseconds; doubled for each further retry. Default 100.
    pub retry_backoff_ms: u64,
    /// `prefetch.read_timeout_ms`: one read attempt that takes longer than
    /// this, in milliseconds, counts as failed. Default 30000.
    pub read_timeout_ms: u64,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            window_batches: 16,
            max_inflight_reads: 256,
            initial_window: 2,
            read_retries: 3,
            retry_backoff_ms: 100,
            read_timeout_ms: 30_000,
        }
    }
}

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// `cache.policy`: which sample leaves the arena when space is needed.
    /// Default `clairvoyant`.
    pub policy: CachePolicy,
}

/// `cache.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// `"clairvoyant"`: evict the sample whose next use, in the sessions'
    /// known futures, is furthest away (Belady). The default.
    #[default]
    Clairvoyant,
    /// `"minio"`: fill the arena once and never evict (CoorDL's MinIO).
    Minio,
    /// `"lru"`: evict the least recently used sample.
    Lru,
}

/// `[sessions]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// `sessions.max_sessions`: concurrent loader sessions; further
    /// connections are refused. Default 64.
    pub max_sessions: u32,
    /// `sessions.ready_ring_capacity`: slots of each session's ready ring
    /// (batches published to the loader); a power of two in 2..=1048576.
    /// Default 64.
    pub ready_ring_capacity: u32,
    /// `sessions.release_ring_capacity`: slots of each session's release ring
    /// (batches handed back by the loader); a power of two in 2..=1048576.
    /// Default 64.
    pub release_ring_capacity: u32,
    /// `sessions.client_timeout_ms`: a loader silent (no heartbeat, no
    /// release) for this long, in milliseconds, is taken for dead and its
    /// session is closed. Default 60000.
    pub client_timeout_ms: u64,
    /// `sessions.heartbeat_ms`: how often, in milliseconds, the agent and the
    /// loaders signal liveness to each other. Default 1000.
    pub heartbeat_ms: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            max_sessions: 64,
            ready_ring_capacity: 64,
            release_ring_capacity: 64,
            client_timeout_ms: 60_000,
            heartbeat_ms: 1_000,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `metrics.address`: `IP:PORT` of the Prometheus HTTP endpoint. Default
    /// `127.0.0.1:9464`; the empty string disables it.
    pub address: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:9464".to_owned(),
        }
    }
}

impl MetricsConfig {
    /// The endpoint's address, or `None` when metrics are disabled (or the
    /// address does not parse, which [`Config::validate`] reports).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        if self.address.is_empty() {
            None
        } else {
            self.address.parse().ok()
        }
    }
}

/// A credential read from the configuration: printed as `<redacted>` by
/// `Debug`, so logging a config never leaks it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `[[dataset]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// `dataset[i].name`: what loaders ask for; non-empty, unique, at most 255
    /// bytes, no control characters.
    pub name: String,
    /// `dataset[i].kind`: the source backend. Default `fs`.
    #[serde(default)]
    pub kind: SourceKind,
    /// `dataset[i].root`: a directory tree with one folder per class.
    /// Exactly one of `root` and `manifest` must be set.
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// `dataset[i].manifest`: for `fs`, a file listing `path<TAB>label` per
    /// line (exactly one of `root` and `manifest`); for `s3`, the key of a
    /// manifest object in the bucket, or `file://PATH` for a local file
    /// (exactly one of `prefix` and `manifest`).
    #[serde(default)]
    pub manifest: Option<PathBuf>,
    /// `dataset[i].endpoint` (`s3`): base URL of the S3 API, e.g.
    /// `"http://127.0.0.1:8333"`. Default: `AWS_ENDPOINT_URL`, else AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `dataset[i].region` (`s3`): signing region. Default: `AWS_REGION`,
    /// else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// `dataset[i].bucket` (`s3`, required): the bucket.
    #[serde(default)]
    pub bucket: Option<String>,
    /// `dataset[i].prefix` (`s3`): the folder whose objects are the samples
    /// (class folders under it); `""` for the whole bucket.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `dataset[i].access_key_id` (`s3`): with `secret_access_key`; both
    /// unset: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// `dataset[i].secret_access_key` (`s3`): see `access_key_id`.
    #[serde(default)]
    pub secret_access_key: Option<Secret>,
    /// `dataset[i].path_style` (`s3`): path-style addressing
    /// (`endpoint/bucket/key`). Default true.
    #[serde(default)]
    pub path_style: Option<bool>,
    /// `dataset[i].allow_http` (`s3`): accept an `http://` endpoint (for
    /// loopback and test servers). Default false.
    #[serde(default)]
    pub allow_http: Option<bool>,
    /// `dataset[i].request_timeout_ms` (`s3`, `cql`): one request attempt (a
    /// GET, headers and body; a CQL read) must finish within this. Default
    /// 10000.
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
    /// `dataset[i].retries` (`s3`, `cql`): retries of a failed request
    /// (timeouts, connection errors, HTTP 5xx; CQL overload, unavailable and
    /// read timeouts), with exponential backoff and jitter. Default 8, at
    /// most 100.
    #[serde(default)]
    pub retries: Option<u32>,
    /// `dataset[i].hosts` (`cql`, required): contact points, `"host:port"`
    /// (port 9042 when left out; IPv6 as `"[::1]:9042"`). The driver learns
    /// the rest of the cluster from them.
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    /// `dataset[i].keyspace` (`cql`, required): the keyspace of both tables.
    #[serde(default)]
    pub keyspace: Option<String>,
    /// `dataset[i].data_table` (`cql`): `(id uuid PRIMARY KEY, data blob,
    /// …)`. Default `"data"`.
    #[serde(default)]
    pub data_table: Option<String>,
    /// `dataset[i].metadata_table` (`cql`): `(id uuid PRIMARY KEY, label int,
    /// size int)`. Default `"metadata"`.
    #[serde(default)]
    pub metadata_table: Option<String>,
    /// `dataset[i].username` (`cql`): password authentication; the password
    /// is `password`, else `GRANARY_CQL_PASSWORD` from the environment.
    #[serde(default)]
    pub username: Option<String>,
    /// `dataset[i].password` (`cql`): see `username`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// `dataset[i].tls` (`cql`): connect with TLS. Default false.
    #[serde(default)]
    pub tls: Option<bool>,
    /// `dataset[i].tls_ca_file` (`cql`, with `tls = true`): PEM file of the
    /// certificate authorities to trust instead of the system's.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// `dataset[i].connections_per_host` (`cql`): connections to each node.
    /// Default: one per shard (ScyllaDB), one per node (Cassandra).
    #[serde(default)]
    pub connections_per_host: Option<u32>,
    /// `dataset[i].connections_per_shard` (`cql`): connections to each shard
    /// of each ScyllaDB node (a Cassandra node counts as one shard).
    #[serde(default)]
    pub connections_per_shard: Option<u32>,
    /// `dataset[i].max_inflight` (`s3`, `cql`): sample reads in flight at
    /// once for this dataset. Default: `prefetch.max_inflight_reads` for
    /// `s3`, 2048 for `cql`; at most 32768.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// `dataset[i].order`: `"strict"` (the default) delivers every batch
    /// exactly as planned; `"relaxed"` lets a ready sample of a later batch
    /// of the same epoch take the place of a late one while the loader
    /// waits, the late one moving back (every sample still comes exactly
    /// once per epoch). See docs/planner.md.
    #[serde(default)]
    pub order: DeliveryOrder,
}

/// `dataset[i].order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryOrder {
    /// Batches exactly as planned.
    #[default]
    Strict,
    /// Late samples give way to ready ones of later batches of the epoch.
    Relaxed,
}

/// `dataset[i].kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// `"fs"`: a local or network filesystem. The default.
    #[default]
    Fs,
    /// `"s3"`: an S3-compatible bucket.
    S3,
    /// `"cql"`: ScyllaDB or Cassandra tables.
    Cql,
}

/// Where a filesystem dataset's samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetLocation<'a> {
    /// A directory tree of class folders.
    Root(&'a Path),
    /// A manifest file.
    Manifest(&'a Path),
}

impl DatasetConfig {
    /// The S3-only fields, by name, and whether each is set.
    fn s3_fields_set(&self) -> [(&'static str, bool); 8] {
        [
            ("endpoint", self.endpoint.is_some()),
            ("region", self.region.is_some()),
            ("bucket", self.bucket.is_some()),
            ("prefix", self.prefix.is_some()),
            ("access_key_id", self.access_key_id.is_some()),
            ("secret_access_key", self.secret_access_key.is_some()),
            ("path_style", self.path_style.is_some()),
            ("allow_http", self.allow_http.is_some()),
        ]
    }

    /// The fields of remote stores (`s3` and `cql`), by name, and whether
    /// each is set.
    fn remote_fields_set(&self) -> [(&'static str, bool); 3] {
        [
            ("request_timeout_ms", self.request_timeout_ms.is_some()),
            ("retries", self.retries.is_some()),
            ("max_inflight", self.max_inflight.is_some()),
        ]
    }

    /// The CQL-only fields, by name, and whether each is set.
    fn cql_fields_set(&self) -> [(&'static str, bool); 10] {
        [
            ("hosts", self.hosts.is_some()),
            ("keyspace", self.keyspace.is_some()),
            ("data_table", self.data_table.is_some()),
            ("metadata_table", self.metadata_table.is_some()),
            ("username", self.username.is_some()),
            ("password", self.password.is_some()),
            ("tls", self.tls.is_some()),
            ("tls_ca_file", self.tls_ca_file.is_some()),
            ("connections_per_host", self.connections_per_host.is_some()),
            (
                "connections_per_shard",
                self.connections_per_shard.is_some(),
            ),
        ]
    }

    /// The dataset's location, or `None` unless exactly one of `root` and
    /// `manifest` is set (which [`Config::validate`] reports).
    pub fn location(&self) -> Option<DatasetLocation<'_>> {
        match (&self.root, &self.manifest) {
            (Some(r), None) => Some(DatasetLocation::Root(r)),
            (None, Some(m)) => Some(DatasetLocation::Manifest(m)),
            _ => None,
        }
    }
}

/// A byte count, written in TOML as an integer or as a string with a unit.
///
/// Units (case-insensitive): none or `B`; binary `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`; decimal `KB`, `MB`, `GB`, `TB`. A fraction is
/// allowed when the result is a whole number of bytes (`"1.5GiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// Parses `"2GiB"`, `"512 MiB"`, `"1.5G"`, `"1000000"`, ….
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        let mult = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => KIB,
            "m" | "mib" => MIB,
            "g" | "gib" => GIB,
            "t" | "tib" => TIB,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => {
                return Err(format!(
                    "unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
                ))
            }
        };
        let (int, frac) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if int.is_empty() && frac.is_empty() {
            return Err("no number".to_owned());
        }
        if frac.contains('.') {
            return Err("more than one decimal point".to_owned());
        }
        if frac.len() > 18 {
            return Err("too many decimal places".to_owned());
        }
        let too_big = || "too large for 64 bits".to_owned();
        let int_v: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_big())?
        };
        let frac_v: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| too_big())?
        };
        let scale = 10u128.pow(frac.len() as u32);
        let frac_bytes = frac_v * u128::from(mult);
        if !frac_bytes.is_multiple_of(scale) {
            return Err("not a whole number of bytes".to_owned());
        }
        let total = int_v
            .checked_mul(u128::from(mult))
            .and_then(|v| v.checked_add(frac_bytes / scale))
            .ok_or_else(too_big)?;
        u64::try_from(total).map(ByteSize).map_err(|_| too_big())
    }
}

impl fmt::Display for ByteSize {
    /// Writes the largest binary unit that divides the size exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
            if b != 0 && b.is_multiple_of(unit) {
                return write!(f, "{} {name}", b / unit);
            }
        }
        write!(f, "{b} B")
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: an integer or a string such as \"2GiB\" or \"512MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(|why| {
                    E::custom(format_args!(
                        "invalid size {v:?}: {why}; expected bytes as an integer or a string such as \"2GiB\" or \"512MiB\""
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// Unix permission bits (at most `0o777`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(pub u32);

impl FileMode {
    /// The permission bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FileMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "permission bits: an octal string such as \"0660\" or an integer such as 0o660",
                )
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FileMode, E> {
                match u32::try_from(v) {
                    Ok(m) if m <= 0o777 => Ok(FileMode(m)),
                    _ => Err(E::custom(format_args!(
                        "invalid mode {v}: permission bits must be at most 0o777; \
                         write an octal literal (mode = 0o660) or a string (mode = \"0660\")"
                    ))),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FileMode, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileMode, E> {
                let digits = v.strip_prefix("0o").unwrap_or(v);
                let ok = !digits.is_empty()
                    && digits.len() <= 4
                    && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
                match u32::from_str_radix(digits, 8) {
                    Ok(m) if ok && m <= 0o777 => Ok(FileMode(m)),
                    _ => Err(E::custom(format_args!(
                        "invalid mode {v:?}: expected octal permission bits such as \"0660\" (at most 0777)"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// One problem found by [`Config::validate`]: the field's full path and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Full path of the offending field, e.g. `prefetch.window_batches` or
    /// `dataset[1].name`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.field, self.reason)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug)]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The configuration file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The TOML did not parse or did not match the schema (unknown field,
    /// wrong type, bad value).
    Parse {
        /// The configuration file, when loaded from one.
        file: Option<PathBuf>,
        /// Full path of the field the error points at, when it can be told
        /// from the document (`arena.size`, `dataset[0]`).
        field: Option<String>,
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// 1-based column of the error, when known.
        column: Option<usize>,
        /// The parser's message, with its line, column and an excerpt.
        message: String,
    },
    /// The configuration parsed but breaks one or more rules.
    Invalid {
        /// The configuration file, when loaded from one.
        file: Option<PathBuf>,
        /// Every problem found (at least one).
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems of an [`ConfigError::Invalid`] error, or an empty slice.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }

    /// The full path of the offending field, when the error names one (the
    /// first problem's for [`ConfigError::Invalid`]).
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Io { .. } => None,
            ConfigError::Parse { field, .. } => field.as_deref(),
            ConfigError::Invalid { problems, .. } => problems.first().map(|p| p.field.as_str()),
        }
    }

    fn with_file(mut self, path: &Path) -> Self {
        match &mut self {
            ConfigError::Io { .. } => {}
            ConfigError::Parse { file, .. } | ConfigError::Invalid { file, .. } => {
                *file = Some(path.to_path_buf())
            }
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, source } => {
                write!(f, "cannot read configuration {}: {source}", path.display())
            }
            ConfigError::Parse {
                file,
                field,
                message,
                ..
            } => {
                if let Some(file) = file {
                    write!(f, "{}: ", file.display())?;
                }
                if let Some(field) = field {
                    write!(f, "in `{field}`: ")?;
                }
                write!(f, "{}", message.trim_end())
            }
            ConfigError::Invalid { file, problems } => {
                if let Some(file) = file {
                    write!(f, "{}: ", file.display())?;
                }
                match problems.as_slice() {
                    [one] => write!(f, "invalid configuration: {one}"),
                    many => {
                        write!(f, "invalid configuration ({} problems):", many.len())?;
                        for p in many {
                            write!(f, "\n  {p}")?;
                        }
                        Ok(())
                    }
                }
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

const DEFAULT_TOML: &str = r##"# granaryd configuration.
#
# Every setting below shows its default; only [[dataset]] has none and must be
# given at least once. Full reference: docs/configuration.md.

[arena]
# Total shared-memory arena for cached samples: an integer (bytes) or a string
# such as "2GiB" or "512MiB". A multiple of 2 MiB, at least 64 MiB and at least
# prefetch.max_inflight_reads x 1 MiB.
size = "4GiB"
# "off" (4 KiB pages), "try" (huge pages when reserved, else 4 KiB pages with a
# warning; "on" is an alias) or "required" (refuse to start without them).
hugepages = "try"
# Fault every page in at start-up.
populate = true

[socket]
# Unix socket loaders connect to (at most 107 bytes).
path = "/run/granary/granary.sock"
# Permission bits of the socket file: an octal string, or TOML's 0o660.
mode = "0660"
# Who may open sessions besides the agent's own user: user ids, and group ids
# matched against the connecting process's primary group. Empty lists allow
# only the agent's own uid.
allowed_uids = []
allowed_gids = []

[prefetch]
# Per session, how many batches ahead of the loader to read.
window_batches = 16
# Reads in flight across all sessions (io_uring queue depth), 1..=32768.
max_inflight_reads = 256
# Window of a new session, in batches; grows up to window_batches.
initial_window = 2
# Retries of a failed read before the batch is reported as failed.
read_retries = 3
# Delay before the first retry, in ms; doubled for each further retry.
retry_backoff_ms = 100
# A read attempt slower than this (ms) counts as failed.
# Must be below sessions.client_timeout_ms.
read_timeout_ms = 30000

[cache]
# "clairvoyant" (evict what is needed furthest in the future), "minio" (fill
# once, never evict) or "lru".
policy = "clairvoyant"

[sessions]
# Concurrent loader sessions.
max_sessions = 64
# Slots of each session's ready and release rings (powers of two).
ready_ring_capacity = 64
release_ring_capacity = 64
# A loader silent for this long (ms) is taken for dead.
client_timeout_ms = 60000
# Liveness signal period (ms); must be below client_timeout_ms.
heartbeat_ms = 1000

[metrics]
# Prometheus endpoint, IP:PORT; "" disables it.
address = "127.0.0.1:9464"

# One [[dataset]] table per dataset. kind = "fs" reads a local or network
# filesystem, either a directory tree with one folder per class (root) or a
# manifest file with "path<TAB>label" per line (manifest); set exactly one.
[[dataset]]
name = "imagenet"
kind = "fs"
root = "/var/lib/granary/datasets/imagenet/train"
# manifest = "/var/lib/granary/datasets/imagenet/train.tsv"
# kind = "s3" reads an S3-compatible bucket instead (docs/s3.md): bucket, and
# prefix (a folder; "" for the whole bucket) or manifest (an object key, or
# file://PATH); endpoint, region, access_key_id/secret_access_key (else the
# AWS_* environment variables), path_style, allow_http, request_timeout_ms,
# retries.
# kind = "cql" reads ScyllaDB/Cassandra tables (docs/scylla.md): hosts
# (["host:port", ...]), keyspace, data_table ("data"), metadata_table
# ("metadata"), username/password (else GRANARY_CQL_PASSWORD), tls,
# tls_ca_file, connections_per_host or connections_per_shard, max_inflight
# (2048), request_timeout_ms (10000), retries (8).
"##;

/// The retry settings that apply to one dataset (interim: agent-wide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after the first attempt.
    pub read_retries: u32,
    /// First backoff, in milliseconds.
    pub retry_backoff_ms: u64,
    /// Largest backoff, in milliseconds.
    pub retry_backoff_max_ms: u64,
    /// Total deadline per sample, in milliseconds.
    pub sample_deadline_ms: u64,
}

impl Config {
    /// The retry settings of `dataset`.
    pub fn retry_for(&self, _dataset: Option<&DatasetConfig>) -> RetrySettings {
        RetrySettings {
            read_retries: self.prefetch.read_retries,
            retry_backoff_ms: self.prefetch.retry_backoff_ms,
            retry_backoff_max_ms: 2_000,
            sample_deadline_ms: 45_000,
        }
    }

    /// The commented default configuration, with one example dataset. It
    /// parses and validates.
    pub fn default_toml() -> &'static str {
        DEFAULT_TOML
    }

    /// Parses and validates a configuration held in memory. Relative paths
    /// are kept as written.
    pub fn from_toml_str(s: &str) -> Result<Config, ConfigError> {
        let cfg = Self::parse(s)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a configuration file. Relative
    /// `socket.path`, `dataset[i].root` and `dataset[i].manifest` are resolved
    /// against the directory holding the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| e.with_file(path))?;
        let base = path.parent().unwrap_or(Path::new(""));
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut cfg.socket.path);
        for ds in cfg.datasets.iter_mut().filter(|d| d.kind == SourceKind::Fs) {
            if let Some(r) = ds.root.as_mut() {
                resolve(r);
            }
            if let Some(m) = ds.manifest.as_mut() {
                resolve(m);
            }
        }
        for ds in cfg
            .datasets
            .iter_mut()
            .filter(|d| d.kind == SourceKind::Cql)
        {
            if let Some(f) = ds.tls_ca_file.as_mut() {
                resolve(f);
            }
        }
        cfg.validate().map_err(|e| e.with_file(path))?;
        Ok(cfg)
    }

    /// Parses without validating.
    fn parse(s: &str) -> Result<Config, ConfigError> {
        toml::from_str::<Config>(s).map_err(|e| {
            let span = e.span();
            let (line, column) = match &span {
                Some(r) => {
                    let (l, c) = line_col(s, r.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            ConfigError::Parse {
                file: None,
                field: span.and_then(|r| field_at(s, r.start)),
                line,
                column,
                message: e.to_string(),
            }
        })
    }

    /// Checks the rules that single fields and relations between fields must
    /// obey; reports every problem found, each naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        let mut bad = |field: &str, reason: String| {
            p.push(Problem {
                field: field.to_owned(),
                reason,
            })
        };

        // [arena]
        let size = self.arena.size.bytes();
        if size < MIN_ARENA_BYTES {
            bad(
                "arena.size",
                format!("{} is below the minimum of 64 MiB", self.arena.size),
            );
        }
        if !size.is_multiple_of(ARENA_GRANULE) {
            let up = size.div_ceil(ARENA_GRANULE).saturating_mul(ARENA_GRANULE);
            bad(
                "arena.size",
                format!(
                    "{size} bytes is not a multiple of 2 MiB (the huge page size); use {up} ({})",
                    ByteSize(up)
                ),
            );
        }
        let need = u64::from(self.prefetch.max_inflight_reads) * ARENA_BYTES_PER_INFLIGHT_READ;
        if size >= MIN_ARENA_BYTES && size < need {
            bad(
                "arena.size",
                format!(
                    "{} cannot hold the prefetch window: prefetch.max_inflight_reads = {} needs at least {} \
                     (1 MiB per in-flight read)",
                    self.arena.size,
                    self.prefetch.max_inflight_reads,
                    ByteSize(need)
                ),
            );
        }

        // [socket]
        let sock = self.socket.path.as_os_str();
        if sock.is_empty() {
            bad("socket.path", "must not be empty".to_owned());
        } else if sock.len() > MAX_SOCKET_PATH_BYTES {
            bad(
                "socket.path",
                format!(
                    "{} is {} bytes long; a Unix socket path holds at most {MAX_SOCKET_PATH_BYTES}",
                    self.socket.path.display(),
                    sock.len()
                ),
            );
        }
        let mode = self.socket.mode.bits();
        if mode & 0o600 != 0o600 {
            bad(
                "socket.mode",
                format!(
                    "{} does not give the owner read and write permission (0600)",
                    self.socket.mode
                ),
            );
        }
        if !self.socket.allowed_gids.is_empty() && mode & 0o060 != 0o060 {
            bad(
                "socket.mode",
                format!(
                    "{} does not give the group read and write permission (0060), \
                     so the members of socket.allowed_gids could not connect",
                    self.socket.mode
                ),
            );
        }

        // [prefetch]
        let pf = &self.prefetch;
        if pf.window_batches == 0 {
            bad("prefetch.window_batches", "must be at least 1".to_owned());
        }
        if pf.max_inflight_reads == 0 || pf.max_inflight_reads > MAX_INFLIGHT_READS {
            bad(
                "prefetch.max_inflight_reads",
                format!(
                    "{} is outside 1..={MAX_INFLIGHT_READS}",
                    pf.max_inflight_reads
                ),
            );
        }
        if pf.initial_window == 0 {
            bad("prefetch.initial_window", "must be at least 1".to_owned());
        } else if pf.initial_window > pf.window_batches {
            bad(
                "prefetch.initial_window",
                format!(
                    "{} exceeds prefetch.window_batches = {}",
                    pf.initial_window, pf.window_batches
                ),
            );
        }
        if pf.read_timeout_ms == 0 {
            bad("prefetch.read_timeout_ms", "must be at least 1".to_owned());
        } else if pf.read_timeout_ms >= self.sessions.client_timeout_ms {
            bad(
                "prefetch.read_timeout_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms, or a loader waiting on \
                     a slow read would be taken for dead before the read fails",
                    pf.read_timeout_ms, self.sessions.client_timeout_ms
                ),
            );
        }

        // [sessions]
        let ss = &self.sessions;
        if ss.max_sessions == 0 {
            bad("sessions.max_sessions", "must be at least 1".to_owned());
        }
        for (field, cap) in [
            ("sessions.ready_ring_capacity", ss.ready_ring_capacity),
            ("sessions.release_ring_capacity", ss.release_ring_capacity),
        ] {
            if !cap.is_power_of_two() || !(2..=MAX_RING_CAPACITY).contains(&cap) {
                bad(
                    field,
                    format!("{cap} is not a power of two in 2..={MAX_RING_CAPACITY}"),
                );
            }
        }
        if ss.client_timeout_ms == 0 {
            bad(
                "sessions.client_timeout_ms",
                "must be at least 1".to_owned(),
            );
        }
        if ss.heartbeat_ms == 0 {
            bad("sessions.heartbeat_ms", "must be at least 1".to_owned());
        } else if ss.heartbeat_ms >= ss.client_timeout_ms {
            bad(
                "sessions.heartbeat_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms",
                    ss.heartbeat_ms, ss.client_timeout_ms
                ),
            );
        }

        // [metrics]
        let addr = &self.metrics.address;
        if !addr.is_empty() && addr.parse::<SocketAddr>().is_err() {
            bad(
                "metrics.address",
                format!("{addr:?} is not IP:PORT (e.g. \"127.0.0.1:9464\"); use \"\" to disable metrics"),
            );
        }

        // [[dataset]]
        if self.datasets.is_empty() {
            bad("dataset", "at least one [[dataset]] is required".to_owned());
        }
        let mut seen = HashSet::new();
        for (i, ds) in self.datasets.iter().enumerate() {
            let field = |name: &str| format!("dataset[{i}].{name}");
            if ds.name.is_empty() {
                bad(&field("name"), "must not be empty".to_owned());
            } else if ds.name.len() > MAX_DATASET_NAME_BYTES {
                bad(
                    &field("name"),
                    format!(
                        "is {} bytes long; at most {MAX_DATASET_NAME_BYTES}",
                        ds.name.len()
                    ),
                );
            } else if ds.name.chars().any(char::is_control) {
                bad(
                    &field("name"),
                    format!("{:?} contains control characters", ds.name),
                );
            } else if !seen.insert(ds.name.as_str()) {
                bad(
                    &field("name"),
                    format!("{:?} is used by an earlier dataset", ds.name),
                );
            }
            match ds.kind {
                SourceKind::Fs => {
                    match (&ds.root, &ds.manifest) {
                        (None, None) => bad(
                            &field("root"),
                            "set either `root` (a directory tree) or `manifest` (a file)"
                                .to_owned(),
                        ),
                        (Some(_), Some(_)) => bad(
                            &field("manifest"),
                            "set only one of `root` and `manifest`".to_owned(),
                        ),
                        (Some(r), None) if r.as_os_str().is_empty() => {
                            bad(&field("root"), "must not be empty".to_owned())
                        }
                        (None, Some(m)) if m.as_os_str().is_empty() => {
                            bad(&field("manifest"), "must not be empty".to_owned())
                        }
                        _ => {}
                    }
                    for (name, set) in ds.s3_fields_set() {
                        if set {
                            bad(
                                &field(name),
                                "only used by kind = \"s3\" datasets".to_owned(),
                            );
                        }
                    }
                    for (name, set) in ds.remote_fields_set() {
                        if set {
                            bad(
                                &field(name),
                                "only used by kind = \"s3\" and kind = \"cql\" datasets".to_owned(),
                            );
                        }
                    }
                    for (name, set) in ds.cql_fields_set() {
                        if set {
                            bad(
                                &field(name),
                                "only used by kind = \"cql\" datasets".to_owned(),
                            );
                        }
                    }
                }
                SourceKind::S3 => {
                    validate_s3(ds, &self.sessions, &field, &mut bad);
                    for (name, set) in ds.cql_fields_set() {
                        if set {
                            bad(
                                &field(name),
                                "only used by kind = \"cql\" datasets".to_owned(),
                            );
                        }
                    }
                }
                SourceKind::Cql => validate_cql(ds, &self.sessions, &field, &mut bad),
            }
        }

        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                file: None,
                problems: p,
            })
        }
    }

    /// The dataset called `name`, if configured.
    pub fn dataset(&self, name: &str) -> Option<&DatasetConfig> {
        self.datasets.iter().find(|d| d.name == name)
    }
}

/// Largest `dataset[i].retries`.
pub const MAX_S3_RETRIES: u32 = 100;

/// The rules of a `kind = "s3"` dataset.
fn validate_s3(
    ds: &DatasetConfig,
    sessions: &SessionsConfig,
    field: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(&str, String),
) {
    if ds.root.is_some() {
        bad(
            &field("root"),
            "not used by kind = \"s3\"; set `prefix` (a folder in the bucket) or `manifest`"
                .to_owned(),
        );
    }
    match ds.bucket.as_deref() {
        None => bad(&field("bucket"), "required for kind = \"s3\"".to_owned()),
        Some(b) if b.is_empty() || b.contains('/') || b.chars().any(char::is_whitespace) => bad(
            &field("bucket"),
            format!("{b:?} is not a bucket name (non-empty, no '/' or spaces)"),
        ),
        Some(_) => {}
    }
    match (&ds.prefix, &ds.manifest) {
        (None, None) => bad(
            &field("prefix"),
            "set either `prefix` (a folder of the bucket; \"\" for all of it) or `manifest`"
                .to_owned(),
        ),
        (Some(_), Some(_)) => bad(
            &field("manifest"),
            "set only one of `prefix` and `manifest`".to_owned(),
        ),
        (None, Some(m)) if m.as_os_str().is_empty() || m.as_os_str() == "file://" => {
            bad(&field("manifest"), "must not be empty".to_owned())
        }
        _ => {}
    }
    if let Some(e) = &ds.endpoint {
        if let Some(rest) = e.strip_prefix("http://") {
            if rest.is_empty() {
                bad(&field("endpoint"), format!("{e:?} names no host"));
            } else if ds.allow_http != Some(true) {
                bad(
                    &field("allow_http"),
                    format!(
                        "endpoint {e} is plain HTTP; set allow_http = true to use it (meant for loopback and test servers)"
                    ),
                );
            }
        } else if e.strip_prefix("https://").is_none_or(str::is_empty) {
            bad(
                &field("endpoint"),
                format!("{e:?} is not an http:// or https:// URL"),
            );
        }
    }
    if ds.access_key_id.is_some() != ds.secret_access_key.is_some() {
        let missing = if ds.access_key_id.is_some() {
            "secret_access_key"
        } else {
            "access_key_id"
        };
        bad(
            &field(missing),
            "access_key_id and secret_access_key go together: set both, or neither (then \
             AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are used)"
                .to_owned(),
        );
    }
    validate_remote(ds, sessions, field, bad);
}

/// The rules of the fields remote stores share (`request_timeout_ms`,
/// `retries`).
fn validate_remote(
    ds: &DatasetConfig,
    sessions: &SessionsConfig,
    field: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(&str, String),
) {
    if let Some(t) = ds.request_timeout_ms {
        if t == 0 {
            bad(
                &field("request_timeout_ms"),
                "must be at least 1".to_owned(),
            );
        } else if t >= sessions.client_timeout_ms {
            bad(
                &field("request_timeout_ms"),
                format!(
                    "{t} ms must be below sessions.client_timeout_ms = {} ms",
                    sessions.client_timeout_ms
                ),
            );
        }
    }
    if let Some(r) = ds.retries {
        if r > MAX_S3_RETRIES {
            bad(
                &field("retries"),
                format!("{r} is above the maximum of {MAX_S3_RETRIES}"),
            );
        }
    }
    if let Some(n) = ds.max_inflight {
        if !(1..=MAX_REMOTE_INFLIGHT).contains(&n) {
            bad(
                &field("max_inflight"),
                format!("{n} is outside 1..={MAX_REMOTE_INFLIGHT}"),
            );
        }
    }
}

/// Largest `dataset[i].max_inflight`.
pub const MAX_REMOTE_INFLIGHT: u32 = 32768;
/// Largest `dataset[i].connections_per_host` / `connections_per_shard`.
pub const MAX_CQL_CONNECTIONS: u32 = 64;

/// Whether `name` is a CQL name Granary accepts for a keyspace or table:
/// 1 to 48 characters, lowercase ASCII letters, digits and `_`, starting
/// with a letter — the names CQL takes unquoted and unchanged.
pub fn is_cql_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=48).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Splits a `dataset[i].hosts` entry into host and port: `"host:port"`,
/// `"host"` (port 9042), `"[v6]:port"` or `"[v6]"`.
pub fn parse_cql_host(entry: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{entry:?}: '[' without ']'"))?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("{entry:?}: expected ':' after ']'"))?,
                ),
            ),
        }
    } else {
        match entry.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(format!(
                    "{entry:?}: write an IPv6 address in brackets, e.g. \"[::1]:9042\""
                ))
            }
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!("{entry:?} names no host"));
    }
    let port = match port {
        None => 9042,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{entry:?}: {p:?} is not a port (1..=65535)"))?,
    };
    Ok((host.to_owned(), port))
}

/// The rules of a `kind = "cql"` dataset.
fn validate_cql(
    ds: &DatasetConfig,
    sessions: &SessionsConfig,
    field: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(&str, String),
) {
    for (name, set) in ds.s3_fields_set() {
        if set {
            bad(
                &field(name),
                "only used by kind = \"s3\" datasets".to_owned(),
            );
        }
    }
    for name in ["root", "manifest"] {
        let set = if name == "root" {
            ds.root.is_some()
        } else {
            ds.manifest.is_some()
        };
        if set {
            bad(
                &field(name),
                "not used by kind = \"cql\"; the samples are listed by the metadata table"
                    .to_owned(),
            );
        }
    }
    match ds.hosts.as_deref() {
        None | Some([]) => bad(
            &field("hosts"),
            "required for kind = \"cql\": contact points such as [\"10.0.0.1:9042\"]".to_owned(),
        ),
        Some(hosts) => {
            for (j, h) in hosts.iter().enumerate() {
                if let Err(e) = parse_cql_host(h) {
                    bad(&field(&format!("hosts[{j}]")), e);
                }
            }
        }
    }
    let name_rule = "is not a CQL name Granary accepts (1 to 48 lowercase letters, digits or \
                     '_', starting with a letter)";
    match ds.keyspace.as_deref() {
        None => bad(&field("keyspace"), "required for kind = \"cql\"".to_owned()),
        Some(k) if !is_cql_name(k) => bad(&field("keyspace"), format!("{k:?} {name_rule}")),
        Some(_) => {}
    }
    for (key, value) in [
        ("data_table", &ds.data_table),
        ("metadata_table", &ds.metadata_table),
    ] {
        if let Some(t) = value {
            if !is_cql_name(t) {
                bad(&field(key), format!("{t:?} {name_rule}"));
            }
        }
    }
    let data = ds.data_table.as_deref().unwrap_or("data");
    let meta = ds.metadata_table.as_deref().unwrap_or("metadata");
    if data == meta {
        bad(
            &field("metadata_table"),
            format!("{meta:?} is also the data table; the two tables must differ"),
        );
    }
    match (&ds.username, &ds.password) {
        (Some(u), _) if u.is_empty() => bad(&field("username"), "must not be empty".to_owned()),
        (None, Some(_)) => bad(
            &field("username"),
            "a password is set without a username; set both (or the username and \
             GRANARY_CQL_PASSWORD in the environment)"
                .to_owned(),
        ),
        _ => {}
    }
    if let Some(f) = &ds.tls_ca_file {
        if f.as_os_str().is_empty() {
            bad(&field("tls_ca_file"), "must not be empty".to_owned());
        } else if ds.tls != Some(true) {
            bad(
                &field("tls"),
                "tls_ca_file is set but TLS is off; set tls = true".to_owned(),
            );
        }
    }
    if ds.connections_per_host.is_some() && ds.connections_per_shard.is_some() {
        bad(
            &field("connections_per_shard"),
            "set only one of connections_per_host and connections_per_shard".to_owned(),
        );
    }
    for (key, value) in [
        ("connections_per_host", ds.connections_per_host),
        ("connections_per_shard", ds.connections_per_shard),
    ] {
        if let Some(n) = value {
            if !(1..=MAX_CQL_CONNECTIONS).contains(&n) {
                bad(
                    &field(key),
                    format!("{n} is outside 1..={MAX_CQL_CONNECTIONS}"),
                );
            }
        }
    }
    validate_remote(ds, sessions, field, bad);
}

/// 1-based line and column (in characters) of byte `offset` in `s`.
fn line_col(s: &str, offset: usize) -> (usize, usize) {
    let offset = floor_char_boundary(s, offset.min(s.len()));
    let before = &s[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Best-effort full path (`arena.size`, `dataset[1].root`, `dataset[0]`) of
/// what the byte at `offset` belongs to, for documents written in the usual
/// `[table]` / `key = value` style. `None` when it cannot be told.
fn field_at(s: &str, offset: usize) -> Option<String> {
    let offset = floor_char_boundary(s, offset.min(s.len()));
    let line_start = s[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = s[offset..].find('\n').map_or(s.len(), |i| offset + i);
    let line = &s[line_start..line_end];

    // The table the line belongs to: the last header before it.
    let mut table: Option<String> = None;
    let mut dataset_count = 0usize;
    for l in s[..line_start].lines() {
        if let Some(h) = header_of(l) {
            if h == "dataset" {
                dataset_count += 1;
                table = Some(format!("dataset[{}]", dataset_count - 1));
            } else {
                table = Some(h);
            }
        }
    }
    if let Some(h) = header_of(line) {
        return Some(if h == "dataset" {
            format!("dataset[{dataset_count}]")
        } else {
            h
        });
    }
    let key = line.split_once('=').map(|(k, _)| k.trim())?;
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !bare {
        return None;
    }
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_owned(),
    })
}

/// The name inside a `[name]` or `[[name]]` header line, if `l` is one.
fn header_of(l: &str) -> Option<String> {
    let l = l.split('#').next().unwrap_or("").trim();
    let inner = l
        .strip_prefix("[[")
        .and_then(|r| r.strip_suffix("]]"))
        .or_else(|| l.strip_prefix('[').and_then(|r| r.strip_suffix(']')))?
        .trim();
    let ok = !inner.is_empty()
        && inner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    ok.then(|| inner.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[[dataset]]\nname = \"d\"\nroot = \"/data\"\n";

    fn parse_err(s: &str) -> ConfigError {
        Config::from_toml_str(s).expect_err("config should be rejected")
    }

    fn invalid_fields(s: &str) -> Vec<String> {
        parse_err(s)
            .problems()
            .iter()
            .map(|p| p.field.clone())
            .collect()
    }

    #[test]
    fn default_toml_parses_validates_and_matches_defaults() {
        let cfg = Config::from_toml_str(Config::default_toml()).unwrap();
        assert_eq!(cfg.arena, ArenaConfig::default());
        assert_eq!(cfg.socket, SocketConfig::default());
        assert_eq!(cfg.prefetch, PrefetchConfig::default());
        assert_eq!(cfg.cache, CacheConfig::default());
        assert_eq!(cfg.sessions, SessionsConfig::default());
        assert_eq!(cfg.metrics, MetricsConfig::default());
        assert_eq!(cfg.datasets.len(), 1);
        assert_eq!(cfg.datasets[0].name, "imagenet");
        assert!(matches!(
            cfg.datasets[0].location(),
            Some(DatasetLocation::Root(_))
        ));
    }

    #[test]
    fn documented_default_file_matches() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/configuration.md"
        ))
        .unwrap();
        let block = doc
            .split("## The default file")
            .nth(1)
            .and_then(|s| s.split("```toml\n").nth(1))
            .and_then(|s| s.split("```").next())
            .expect("docs/configuration.md has a default file block");
        assert_eq!(
            Config::from_toml_str(block).unwrap(),
            Config::from_toml_str(Config::default_toml()).unwrap()
        );
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let cfg = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(cfg.arena.size, ByteSize(4 << 30));
        assert_eq!(cfg.arena.hugepages, HugePages::Try);
        assert!(cfg.arena.populate);
        assert_eq!(cfg.socket.path, Path::new("/run/granary/granary.sock"));
        assert_eq!(cfg.socket.mode, FileMode(0o660));
        assert_eq!(cfg.cache.policy, CachePolicy::Clairvoyant);
        assert_eq!(
            cfg.metrics.socket_addr(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(cfg.datasets[0].kind, SourceKind::Fs);
        assert_eq!(
            cfg.dataset("d").unwrap().root.as_deref(),
            Some(Path::new("/data"))
        );
    }

    #[test]
    fn sizes_parse() {
        let ok = |s: &str| ByteSize::parse(s).unwrap().bytes();
        assert_eq!(ok("2GiB"), 2 << 30);
        assert_eq!(ok("512MiB"), 512 << 20);
        assert_eq!(ok("512 mib"), 512 << 20);
        assert_eq!(ok("1.5G"), 3 << 29);
        assert_eq!(ok("4k"), 4096);
        assert_eq!(ok("1GB"), 1_000_000_000);
        assert_eq!(ok("123"), 123);
        assert_eq!(ok("7B"), 7);
        for bad in [
            "",
            "GiB",
            "1.2.3G",
            "2XB",
            "-1G",
            "0.3B",
            "99999999999TiB",
            "1.5",
        ] {
            assert!(ByteSize::parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert_eq!(ByteSize(2 << 30).to_string(), "2 GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000 B");
    }

    #[test]
    fn size_accepts_integer_and_string() {
        let cfg = Config::from_toml_str(&format!("[arena]\nsize = 268435456\n{MINIMAL}")).unwrap();
        assert_eq!(cfg.arena.size.bytes(), 256 << 20);
        let cfg = Config::from_toml_str(&format!("[arena]\nsize = \"256MiB\"\n{MINIMAL}")).unwrap();
        assert_eq!(cfg.arena.size.bytes(), 256 << 20);
    }

    #[test]
    fn bad_size_names_field_and_line() {
        let e = parse_err(&format!(
            "[arena]\nhugepages = \"off\"\nsize = \"2XB\"\n{MINIMAL}"
        ));
        match &e {
            ConfigError::Parse { field, line, .. } => {
                assert_eq!(field.as_deref(), Some("arena.size"));
                assert_eq!(*line, Some(3));
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("arena.size"), "{msg}");
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.contains("2XB"), "{msg}");
        let e = parse_err(&format!("[arena]\nsize = -5\n{MINIMAL}"));
        assert_eq!(e.field(), Some("arena.size"));
    }

    #[test]
    fn modes_parse() {
        let mode = |v: &str| {
            Config::from_toml_str(&format!("[socket]\nmode = {v}\n{MINIMAL}"))
                .map(|c| c.socket.mode.bits())
        };
        assert_eq!(mode("\"0660\"").unwrap(), 0o660);
        assert_eq!(mode("\"600\"").unwrap(), 0o600);
        assert_eq!(mode("\"0o666\"").unwrap(), 0o666);
        assert_eq!(mode("0o640").unwrap(), 0o640);
        assert_eq!(mode("432").unwrap(), 0o660);
        for bad in ["660", "\"0x1a\"", "\"0680\"", "\"\"", "\"7777\"", "-1"] {
            let e = mode(bad).expect_err(bad);
            assert_eq!(e.field(), Some("socket.mode"), "{bad}: {e}");
        }
        // Owner must be able to connect.
        assert_eq!(mode("\"0060\"").unwrap_err().field(), Some("socket.mode"));
    }

    #[test]
    fn unknown_fields_are_rejected_with_position() {
        let e = parse_err(&format!("[prefetch]\nwindow_batchez = 4\n{MINIMAL}"));
        let msg = e.to_string();
        assert!(msg.contains("window_batchez"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
        assert_eq!(e.field(), Some("prefetch.window_batchez"));
        let e = parse_err(&format!("[prefetc]\nwindow_batches = 4\n{MINIMAL}"));
        assert!(e.to_string().contains("prefetc"), "{e}");
        let e = parse_err(
            "[[dataset]]\nname = \"a\"\nroot = \"/a\"\n[[dataset]]\nname = \"b\"\nrot = \"/b\"\n",
        );
        assert_eq!(e.field(), Some("dataset[1].rot"));
    }

    #[test]
    fn wrong_types_and_enum_values() {
        let e = parse_err(&format!("[prefetch]\nwindow_batches = \"many\"\n{MINIMAL}"));
        assert_eq!(e.field(), Some("prefetch.window_batches"));
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_err(&format!("[cache]\npolicy = \"fifo\"\n{MINIMAL}"));
        assert_eq!(e.field(), Some("cache.policy"));
        assert!(e.to_string().contains("fifo"), "{e}");
        let e = parse_err(&format!("[arena]\nhugepages = \"sometimes\"\n{MINIMAL}"));
        assert_eq!(e.field(), Some("arena.hugepages"));
        let cfg =
            Config::from_toml_str(&format!("[arena]\nhugepages = \"on\"\n{MINIMAL}")).unwrap();
        assert_eq!(cfg.arena.hugepages, HugePages::Try);
        let e = parse_err("[[dataset]]\nroot = \"/a\"\n");
        assert_eq!(e.field(), Some("dataset[0]"));
        assert!(e.to_string().contains("name"), "{e}");
        let e = parse_err("[[dataset]]\nname = \"a\"\nkind = \"nfs\"\nroot = \"/a\"\n");
        assert_eq!(e.field(), Some("dataset[0].kind"));
    }

    #[test]
    fn syntax_errors_keep_line_and_column() {
        let e = parse_err("[arena\nsize = 1\n");
        match e {
            ConfigError::Parse { line, column, .. } => {
                assert_eq!(line, Some(1));
                assert!(column.is_some());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn relations_are_validated() {
        let f = invalid_fields(&format!(
            "[prefetch]\ninitial_window = 32\nwindow_batches = 16\n{MINIMAL}"
        ));
        assert_eq!(f, ["prefetch.initial_window"]);
        let f = invalid_fields(&format!(
            "[prefetch]\nread_timeout_ms = 5000\n[sessions]\nclient_timeout_ms = 5000\nheartbeat_ms = 6000\n{MINIMAL}"
        ));
        assert_eq!(f, ["prefetch.read_timeout_ms", "sessions.heartbeat_ms"]);
        let f = invalid_fields(&format!(
            "[sessions]\nready_ring_capacity = 48\nrelease_ring_capacity = 1\n{MINIMAL}"
        ));
        assert_eq!(
            f,
            [
                "sessions.ready_ring_capacity",
                "sessions.release_ring_capacity"
            ]
        );
        let f = invalid_fields(&format!(
            "[prefetch]\nmax_inflight_reads = 0\nwindow_batches = 0\n{MINIMAL}"
        ));
        assert_eq!(
            f,
            [
                "prefetch.window_batches",
                "prefetch.max_inflight_reads",
                "prefetch.initial_window"
            ]
        );
        let f = invalid_fields(&format!("[sessions]\nmax_sessions = 0\n{MINIMAL}"));
        assert_eq!(f, ["sessions.max_sessions"]);
    }

    #[test]
    fn arena_rules() {
        let f = invalid_fields(&format!("[arena]\nsize = \"32MiB\"\n{MINIMAL}"));
        assert_eq!(f, ["arena.size"]);
        let f = invalid_fields(&format!("[arena]\nsize = 300000000\n{MINIMAL}"));
        assert_eq!(f, ["arena.size"]);
        let e = parse_err(&format!(
            "[arena]\nsize = \"256MiB\"\n[prefetch]\nmax_inflight_reads = 512\n{MINIMAL}"
        ));
        assert_eq!(e.field(), Some("arena.size"));
        assert!(e.to_string().contains("max_inflight_reads"), "{e}");
        Config::from_toml_str(&format!(
            "[arena]\nsize = \"512MiB\"\n[prefetch]\nmax_inflight_reads = 512\n{MINIMAL}"
        ))
        .unwrap();
    }

    #[test]
    fn socket_rules() {
        let long = "/x".repeat(60);
        let f = invalid_fields(&format!("[socket]\npath = \"{long}\"\n{MINIMAL}"));
        assert_eq!(f, ["socket.path"]);
        let f = invalid_fields(&format!(
            "[socket]\nmode = \"0600\"\nallowed_gids = [100]\n{MINIMAL}"
        ));
        assert_eq!(f, ["socket.mode"]);
        let cfg = Config::from_toml_str(&format!(
            "[socket]\nallowed_uids = [1001]\nallowed_gids = [100]\n{MINIMAL}"
        ))
        .unwrap();
        assert!(cfg.socket.allows(1000, 1000, 1000));
        assert!(cfg.socket.allows(1000, 1001, 5));
        assert!(cfg.socket.allows(1000, 7, 100));
        assert!(!cfg.socket.allows(1000, 7, 5));
        assert!(!SocketConfig::default().allows(1000, 0, 0));
    }

    #[test]
    fn metrics_address() {
        let cfg = Config::from_toml_str(&format!("[metrics]\naddress = \"\"\n{MINIMAL}")).unwrap();
        assert_eq!(cfg.metrics.socket_addr(), None);
        let cfg = Config::from_toml_str(&format!("[metrics]\naddress = \"[::1]:9000\"\n{MINIMAL}"))
            .unwrap();
        assert_eq!(cfg.metrics.socket_addr().unwrap().port(), 9000);
        let f = invalid_fields(&format!("[metrics]\naddress = \"localhost\"\n{MINIMAL}"));
        assert_eq!(f, ["metrics.address"]);
    }

    #[test]
    fn dataset_rules() {
        assert_eq!(invalid_fields(""), ["dataset"]);
        let two = |a: &str, b: &str| {
            invalid_fields(&format!(
                "[[dataset]]\nname = \"{a}\"\nroot = \"/a\"\n[[dataset]]\nname = \"{b}\"\nroot = \"/b\"\n"
            ))
        };
        assert_eq!(two("x", "x"), ["dataset[1].name"]);
        assert_eq!(two("", "y"), ["dataset[0].name"]);
        assert_eq!(two("x", &"n".repeat(256)), ["dataset[1].name"]);
        assert_eq!(two("x", "tab\\there"), ["dataset[1].name"]);
        assert!(Config::from_toml_str(&format!(
            "[[dataset]]\nname = \"{}\"\nroot = \"/a\"\n",
            "n".repeat(255)
        ))
        .is_ok());
        let f = invalid_fields("[[dataset]]\nname = \"a\"\n");
        assert_eq!(f, ["dataset[0].root"]);
        let f = invalid_fields("[[dataset]]\nname = \"a\"\nroot = \"/a\"\nmanifest = \"/m\"\n");
        assert_eq!(f, ["dataset[0].manifest"]);
        let cfg =
            Config::from_toml_str("[[dataset]]\nname = \"a\"\nmanifest = \"/m.tsv\"\n").unwrap();
        assert_eq!(
            cfg.datasets[0].location(),
            Some(DatasetLocation::Manifest(Path::new("/m.tsv")))
        );
    }

    #[test]
    fn s3_dataset_rules() {
        const S3: &str = "[[dataset]]\nname = \"s\"\nkind = \"s3\"\n";
        let cfg = Config::from_toml_str(&format!("{S3}bucket = \"b\"\nprefix = \"\"\n")).unwrap();
        assert_eq!(cfg.datasets[0].kind, SourceKind::S3);
        assert_eq!(cfg.datasets[0].prefix.as_deref(), Some(""));
        assert_eq!(
            invalid_fields(S3),
            ["dataset[0].bucket", "dataset[0].prefix"]
        );
        let f = invalid_fields(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\nmanifest = \"m.tsv\"\nroot = \"/x\"\n"
        ));
        assert_eq!(f, ["dataset[0].root", "dataset[0].manifest"]);
        let f = invalid_fields(&format!(
            "{S3}bucket = \"a/b\"\nprefix = \"p\"\nendpoint = \"http://127.0.0.1:8333\"\n"
        ));
        assert_eq!(f, ["dataset[0].bucket", "dataset[0].allow_http"]);
        Config::from_toml_str(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\nendpoint = \"http://127.0.0.1:8333\"\nallow_http = true\n"
        ))
        .unwrap();
        let f = invalid_fields(&format!(
            "{S3}bucket = \"b\"\nmanifest = \"k\"\nendpoint = \"s3.example.com\"\naccess_key_id = \"k\"\n"
        ));
        assert_eq!(f, ["dataset[0].endpoint", "dataset[0].secret_access_key"]);
        let f = invalid_fields(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\nrequest_timeout_ms = 60000\nretries = 1000\nmax_inflight = 0\n"
        ));
        assert_eq!(
            f,
            [
                "dataset[0].request_timeout_ms",
                "dataset[0].retries",
                "dataset[0].max_inflight"
            ]
        );
        let cfg = Config::from_toml_str(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\nmax_inflight = 1024\norder = \"relaxed\"\n"
        ))
        .unwrap();
        assert_eq!(cfg.datasets[0].max_inflight, Some(1024));
        assert_eq!(cfg.datasets[0].order, DeliveryOrder::Relaxed);
        assert!(Config::from_toml_str(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\norder = \"sorted\"\n"
        ))
        .is_err());
        let f = invalid_fields(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\nrequest_timeout_ms = 0\n"
        ));
        assert_eq!(f, ["dataset[0].request_timeout_ms"]);
        // S3 fields on a filesystem dataset are mistakes.
        let f = invalid_fields(
            "[[dataset]]\nname = \"f\"\nroot = \"/d\"\nbucket = \"b\"\nretries = 2\n",
        );
        assert_eq!(f, ["dataset[0].bucket", "dataset[0].retries"]);
        let e = parse_err(&format!(
            "{S3}bucket = \"b\"\nprefix = \"p\"\npathstyle = true\n"
        ));
        assert_eq!(e.field(), Some("dataset[0].pathstyle"));
    }

    #[test]
    fn cql_dataset_rules() {
        const CQL: &str = "[[dataset]]\nname = \"c\"\nkind = \"cql\"\n";
        let cfg = Config::from_toml_str(&format!(
            "{CQL}hosts = [\"10.0.0.1:9042\", \"db\", \"[::1]:19042\"]\nkeyspace = \"imagenet\"\n\
             username = \"u\"\npassword = \"hunter2\"\ntls = true\ntls_ca_file = \"/ca.pem\"\n\
             connections_per_host = 4\nmax_inflight = 4096\nrequest_timeout_ms = 500\nretries = 3\n"
        ))
        .unwrap();
        let ds = &cfg.datasets[0];
        assert_eq!(ds.kind, SourceKind::Cql);
        assert_eq!(ds.max_inflight, Some(4096));
        let dbg = format!("{ds:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(dbg.contains("<redacted>"), "{dbg}");
        // Every required key missing: each named.
        assert_eq!(
            invalid_fields(CQL),
            ["dataset[0].hosts", "dataset[0].keyspace"]
        );
        let base = format!("{CQL}hosts = [\"h:9042\"]\nkeyspace = \"k\"\n");
        let f = invalid_fields(&format!(
            "{CQL}hosts = [\"h:0\", \"\", \"::1\", \"[::1\"]\nkeyspace = \"Bad-Name\"\n"
        ));
        assert_eq!(
            f,
            [
                "dataset[0].hosts[0]",
                "dataset[0].hosts[1]",
                "dataset[0].hosts[2]",
                "dataset[0].hosts[3]",
                "dataset[0].keyspace"
            ]
        );
        let f = invalid_fields(&format!(
            "{base}data_table = \"t\"\nmetadata_table = \"t\"\npassword = \"p\"\ntls_ca_file = \"/ca\"\n"
        ));
        assert_eq!(
            f,
            [
                "dataset[0].metadata_table",
                "dataset[0].username",
                "dataset[0].tls"
            ]
        );
        let f = invalid_fields(&format!(
            "{base}connections_per_host = 2\nconnections_per_shard = 0\nmax_inflight = 0\nretries = 101\n"
        ));
        assert_eq!(
            f,
            [
                "dataset[0].connections_per_shard",
                "dataset[0].connections_per_shard",
                "dataset[0].retries",
                "dataset[0].max_inflight"
            ]
        );
        // S3 and filesystem keys are mistakes on a CQL dataset, and CQL keys
        // on the others.
        let f = invalid_fields(&format!("{base}bucket = \"b\"\nroot = \"/d\"\n"));
        assert_eq!(f, ["dataset[0].bucket", "dataset[0].root"]);
        let f = invalid_fields(
            "[[dataset]]\nname = \"f\"\nroot = \"/d\"\nkeyspace = \"k\"\nmax_inflight = 2\n",
        );
        assert_eq!(f, ["dataset[0].max_inflight", "dataset[0].keyspace"]);
        let f = invalid_fields(
            "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"\"\nhosts = [\"h\"]\n",
        );
        assert_eq!(f, ["dataset[0].hosts"]);
        let msg = parse_err(&format!("{base}username = \"\"\n")).to_string();
        assert!(msg.contains("dataset[0].username"), "{msg}");
    }

    #[test]
    fn cql_hosts_and_names_parse() {
        assert_eq!(parse_cql_host("db1").unwrap(), ("db1".to_owned(), 9042));
        assert_eq!(
            parse_cql_host("10.0.0.1:19042").unwrap(),
            ("10.0.0.1".to_owned(), 19042)
        );
        assert_eq!(parse_cql_host("[::1]").unwrap(), ("::1".to_owned(), 9042));
        assert_eq!(
            parse_cql_host("[fe80::1]:7").unwrap(),
            ("fe80::1".to_owned(), 7)
        );
        for bad in ["", ":9042", "h:x", "h:70000", "::1", "[::1]x", "a b:1"] {
            assert!(parse_cql_host(bad).is_err(), "{bad:?} accepted");
        }
        assert!(is_cql_name("data_2"));
        for bad in ["", "Data", "2data", "_x", "a-b", &"a".repeat(49)] {
            assert!(!is_cql_name(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn cql_tls_ca_file_is_resolved_against_the_config_folder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("granary.toml");
        std::fs::write(
            &path,
            "[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"h\"]\nkeyspace = \"k\"\ntls = true\ntls_ca_file = \"ca.pem\"\n",
        )
        .unwrap();
        let cfg = Config::load(&path).unwrap();
        assert_eq!(
            cfg.datasets[0].tls_ca_file.as_deref(),
            Some(dir.path().join("ca.pem").as_path())
        );
    }

    #[test]
    fn s3_manifest_keys_are_not_resolved_as_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("granary.toml");
        std::fs::write(
            &path,
            "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nmanifest = \"idx/train.tsv\"\n",
        )
        .unwrap();
        let cfg = Config::load(&path).unwrap();
        assert_eq!(
            cfg.datasets[0].manifest.as_deref(),
            Some(Path::new("idx/train.tsv"))
        );
    }

    #[test]
    fn multiple_problems_are_all_reported() {
        let e = parse_err("[sessions]\nheartbeat_ms = 0\nmax_sessions = 0\n");
        assert_eq!(e.problems().len(), 3);
        let msg = e.to_string();
        assert!(msg.contains("3 problems"), "{msg}");
        assert!(msg.contains("sessions.heartbeat_ms"), "{msg}");
    }

    #[test]
    fn load_resolves_relative_paths_and_names_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("granary.toml");
        std::fs::write(
            &path,
            "[socket]\npath = \"g.sock\"\n[[dataset]]\nname = \"a\"\nroot = \"data\"\n[[dataset]]\nname = \"b\"\nmanifest = \"/abs/m.tsv\"\n",
        )
        .unwrap();
        let cfg = Config::load(&path).unwrap();
        assert_eq!(cfg.socket.path, dir.path().join("g.sock"));
        assert_eq!(
            cfg.datasets[0].root.as_deref(),
            Some(dir.path().join("data").as_path())
        );
        assert_eq!(
            cfg.datasets[1].manifest.as_deref(),
            Some(Path::new("/abs/m.tsv"))
        );

        std::fs::write(&path, "[prefetch]\nwindow_batches = 0\n").unwrap();
        let msg = Config::load(&path).unwrap_err().to_string();
        assert!(msg.contains("granary.toml"), "{msg}");
        assert!(msg.contains("prefetch.window_batches"), "{msg}");

        let e = Config::load(dir.path().join("missing.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Io { .. }));
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }
}
