//! The rules single settings and relations between settings must obey,
//! checked once the TOML has been read. Every problem is reported, each
//! naming its field.

use super::arena::{ARENA_BYTES_PER_INFLIGHT_READ, ARENA_GRANULE, MIN_ARENA_BYTES};
use super::dataset::{
    is_cql_name, parse_cql_host, MAX_CQL_CONNECTIONS, MAX_DATASET_NAME_BYTES, MAX_REMOTE_INFLIGHT,
    MAX_REMOTE_RETRIES,
};
use super::prefetch::{MAX_INFLIGHT_READS, MAX_READ_RETRIES};
use super::sessions::MAX_RING_CAPACITY;
use super::socket::MAX_SOCKET_PATH_BYTES;
use super::{
    AzureConfig, ByteSize, Config, ConfigError, CqlConfig, DatasetConfig, FsConfig, GcsConfig,
    Problem, RetrySettings, S3Config, ShardFormat,
};
use std::collections::HashSet;
use std::net::SocketAddr;

/// The longest `peers.owner_grace_ms` and `owner_grace_blocked_ms`: ten
/// minutes.
const MAX_OWNER_GRACE_MS: u64 = 600_000;

/// Collects problems.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn bad(&mut self, field: &str, reason: impl Into<String>) {
        self.0.push(Problem::new(field, reason.into()));
    }
}

impl Config {
    /// Checks the rules that single fields and relations between fields must
    /// obey; reports every problem found, each naming its field.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::default();
        self.validate_arena(&mut p);
        self.validate_socket(&mut p);
        self.validate_prefetch(&mut p);
        self.validate_sessions(&mut p);
        self.validate_peers(&mut p);
        let addr = &self.metrics.address;
        if !addr.is_empty() && addr.parse::<SocketAddr>().is_err() {
            p.bad(
                "metrics.address",
                format!("{addr:?} is not IP:PORT (e.g. \"127.0.0.1:9464\"); use \"\" to disable metrics"),
            );
        }
        self.validate_datasets(&mut p);
        let names: Vec<&str> = self.datasets.iter().map(DatasetConfig::name).collect();
        for (field, why) in super::mixture::problems(&self.mixtures, &names) {
            p.bad(&field, why);
        }
        if p.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                file: None,
                problems: p.0,
            })
        }
    }

    fn validate_peers(&self, p: &mut Problems) {
        use super::{Membership, MembershipSetting};
        let c = &self.peers;
        if c.membership_setting != MembershipSetting::Dns && !c.dns_name.is_empty() {
            p.bad("peers.dns_name", "is only for membership = \"dns\"");
        }
        if !c.enabled() {
            return;
        }
        if c.secret.is_none() == c.secret_file.is_none() {
            p.bad(
                "peers.secret",
                "give exactly one of peers.secret and peers.secret_file (the per-job secret)",
            );
        }
        if let Some(s) = &c.secret {
            if s.expose().is_empty() {
                p.bad("peers.secret", "is empty");
            } else if let Err(e) = super::peer_secret::check(s.expose().as_bytes()) {
                p.bad("peers.secret", e.to_string());
            }
        }
        if !(1..=90).contains(&c.keep_percent) {
            p.bad(
                "peers.keep_percent",
                format!("{} is outside 1..=90", c.keep_percent),
            );
        }
        for (field, v) in [
            ("peers.hedge_after_ms", c.hedge_after_ms),
            ("peers.connect_timeout_ms", c.connect_timeout_ms),
            ("peers.idle_timeout_ms", c.idle_timeout_ms),
        ] {
            if v == 0 {
                p.bad(field, "must be above 0");
            }
        }
        if c.idle_timeout_ms > 0 && c.idle_timeout_ms < 300 {
            p.bad(
                "peers.idle_timeout_ms",
                format!("{} ms is too short (at least 300)", c.idle_timeout_ms),
            );
        }
        if c.max_requests == 0 || c.max_requests > 65536 {
            p.bad(
                "peers.max_requests",
                format!("{} is outside 1..=65536", c.max_requests),
            );
        }
        if c.transport == super::TransportSetting::Rdma && c.encryption == super::Encryption::On {
            p.bad(
                "peers.transport",
                "\"rdma\" writes payloads in clear, so it needs peers.encryption = \"off\" \
                 (a fabric trusted against taps); with encryption on, peers use TCP",
            );
        }
        for (field, v) in [
            ("peers.max_connections", c.max_connections),
            (
                "peers.max_connections_per_address",
                c.max_connections_per_address,
            ),
        ] {
            if v == 0 {
                p.bad(field, "must be above 0");
            }
        }
        if c.max_connections_per_address > c.max_connections {
            p.bad(
                "peers.max_connections_per_address",
                format!(
                    "{} is above peers.max_connections ({})",
                    c.max_connections_per_address, c.max_connections
                ),
            );
        }
        for (field, v) in [
            ("peers.write_timeout_ms", c.write_timeout_ms),
            ("peers.block_timeout_ms", c.block_timeout_ms),
        ] {
            if v < 100 {
                p.bad(field, format!("{v} ms is too short (at least 100)"));
            }
        }
        for (field, v) in [
            ("peers.owner_grace_ms", c.owner_grace_ms),
            ("peers.owner_grace_blocked_ms", c.owner_grace_blocked_ms),
        ] {
            if v > MAX_OWNER_GRACE_MS {
                p.bad(
                    field,
                    format!("{v} ms is too long (at most {MAX_OWNER_GRACE_MS})"),
                );
            }
        }
        if !(1000..=600_000).contains(&c.status_interval_ms) {
            p.bad(
                "peers.status_interval_ms",
                format!(
                    "{} ms is out of range (1000 to 600000)",
                    c.status_interval_ms
                ),
            );
        }
        if c.max_pinned_per_peer.0 < 1 << 20 {
            p.bad(
                "peers.max_pinned_per_peer",
                format!(
                    "{} bytes is too small (at least 1 MiB)",
                    c.max_pinned_per_peer.0
                ),
            );
        }
        if c.max_members == 0 || c.max_members as usize > granary_peer::view::MAX_MEMBERS {
            p.bad(
                "peers.max_members",
                format!(
                    "{} is outside 1..={}",
                    c.max_members,
                    granary_peer::view::MAX_MEMBERS
                ),
            );
        }
        if c.handin_bytes_per_uid.bytes() < super::peers::MIN_HANDIN_BYTES_PER_UID {
            p.bad(
                "peers.handin_bytes_per_uid",
                format!("{} is below the minimum of 64 KiB", c.handin_bytes_per_uid),
            );
        }
        if c.membership == Membership::Static && c.members.len() > c.max_members as usize {
            p.bad(
                "peers.members",
                format!(
                    "{} members is more than peers.max_members ({})",
                    c.members.len(),
                    c.max_members
                ),
            );
        }
        if c.rdma_port == 0 {
            p.bad("peers.rdma_port", "ports count from 1");
        }
        if !c.listen.is_empty() && c.listen.parse::<SocketAddr>().is_err() {
            p.bad(
                "peers.listen",
                format!("{:?} is not IP:PORT (e.g. \"0.0.0.0:7170\")", c.listen),
            );
        }
        let bad_id = |s: &str| {
            s.is_empty() || s.len() > 255 || s.chars().any(|c| c.is_control() || c == ' ')
        };
        if !c.node_id.is_empty() && bad_id(&c.node_id) {
            p.bad(
                "peers.node_id",
                format!(
                    "{:?} is not a node id (1 to 255 bytes, no spaces)",
                    c.node_id
                ),
            );
        }
        if !c.advertise.is_empty()
            && c.advertise
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .is_none_or(|port| port == 0)
        {
            p.bad(
                "peers.advertise",
                format!("{:?} is not HOST:PORT", c.advertise),
            );
        }
        match c.membership_setting {
            MembershipSetting::Off => {}
            MembershipSetting::Dns => self.validate_dns(p),
            MembershipSetting::Session => {
                if !c.members.is_empty() {
                    p.bad("peers.members", "is only for membership = \"static\"");
                }
                if c.port == 0 && c.listen.is_empty() {
                    p.bad("peers.port", "must be above 0");
                }
                if !c.job_id.is_empty() && bad_id(&c.job_id) {
                    p.bad(
                        "peers.job_id",
                        format!("{:?} is not a job id (1 to 255 bytes, no spaces)", c.job_id),
                    );
                }
            }
            MembershipSetting::Slurm => {
                if !c.members.is_empty() {
                    p.bad("peers.members", "is only for membership = \"static\"");
                }
                if c.port == 0 {
                    p.bad("peers.port", "must be above 0");
                }
            }
            MembershipSetting::Static => {
                if c.job_id.is_empty() {
                    p.bad("peers.job_id", "is required with membership = \"static\"");
                }
                if c.members.is_empty() {
                    p.bad(
                        "peers.members",
                        "is empty (membership = \"static\" needs the list)",
                    );
                }
                let mut ids = HashSet::new();
                for (i, m) in c.members.iter().enumerate() {
                    if bad_id(&m.id) {
                        p.bad(
                            &format!("peers.members[{i}].id"),
                            format!("{:?} is not a node id", m.id),
                        );
                    }
                    if !ids.insert(m.id.as_str()) {
                        p.bad(
                            &format!("peers.members[{i}].id"),
                            format!("{:?} is listed twice", m.id),
                        );
                    }
                    if m.addr
                        .rsplit_once(':')
                        .and_then(|(_, port)| port.parse::<u16>().ok())
                        .is_none()
                    {
                        p.bad(
                            &format!("peers.members[{i}].addr"),
                            format!("{:?} is not HOST:PORT", m.addr),
                        );
                    }
                    if m.keep.is_some_and(|k| k.bytes() == 0) {
                        p.bad(&format!("peers.members[{i}].keep"), "is 0");
                    }
                }
                if !c.node_id.is_empty() && !ids.contains(c.node_id.as_str()) {
                    p.bad(
                        "peers.node_id",
                        format!("{:?} is not one of peers.members", c.node_id),
                    );
                }
            }
        }
    }

    /// `membership = "dns"`: the name, how often it is resolved, and the
    /// settings the records replace.
    fn validate_dns(&self, p: &mut Problems) {
        use super::peers::MAX_DNS_NAME;
        let c = &self.peers;
        let name = c.dns_name.trim_end_matches('.');
        if name.is_empty() {
            p.bad(
                "peers.dns_name",
                "is required with membership = \"dns\" (e.g. \"granary-peers.granary.svc.cluster.local\")",
            );
        } else if name.len() > MAX_DNS_NAME
            || name.split('.').any(|l| {
                l.is_empty()
                    || l.len() > 63
                    || !l
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
            })
        {
            p.bad(
                "peers.dns_name",
                format!(
                    "{:?} is not a DNS name (labels of letters, digits, '-' and '_', 1 to 63 bytes each, \
                     separated by dots; at most {MAX_DNS_NAME} bytes in all)",
                    c.dns_name
                ),
            );
        }
        if !(100..=3_600_000).contains(&c.dns_refresh_ms) {
            p.bad(
                "peers.dns_refresh_ms",
                format!("{} is outside 100..=3600000", c.dns_refresh_ms),
            );
        }
        if c.port == 0 {
            p.bad(
                "peers.port",
                "must be above 0 (every member of the records listens on it)",
            );
        }
        if !c.members.is_empty() {
            p.bad("peers.members", "is only for membership = \"static\"");
        }
        if !c.job_id.is_empty() {
            p.bad(
                "peers.job_id",
                "is not used with membership = \"dns\": the view's job id is peers.dns_name and a digest of its addresses",
            );
        }
        if !c.view_uids.is_empty() {
            p.bad(
                "peers.view_uids",
                "is not used with membership = \"dns\": views come from the records only, never from loaders",
            );
        }
        if !c.node_id.is_empty() && c.node_id.parse::<std::net::IpAddr>().is_err() {
            p.bad(
                "peers.node_id",
                format!(
                    "{:?} is not an IP address: with membership = \"dns\" a node's id is its address in the records",
                    c.node_id
                ),
            );
        }
        if let Ok(l) = c.listen.parse::<SocketAddr>() {
            if l.port() != c.port {
                p.bad(
                    "peers.listen",
                    format!(
                        "port {} is not peers.port ({}): with membership = \"dns\" every member is reached on peers.port",
                        l.port(),
                        c.port
                    ),
                );
            }
        }
    }

    fn validate_arena(&self, p: &mut Problems) {
        let size = self.arena.size.bytes();
        if size < MIN_ARENA_BYTES {
            p.bad(
                "arena.size",
                format!("{} is below the minimum of 64 MiB", self.arena.size),
            );
        }
        if !size.is_multiple_of(ARENA_GRANULE) {
            let up = size.div_ceil(ARENA_GRANULE).saturating_mul(ARENA_GRANULE);
            p.bad(
                "arena.size",
                format!(
                    "{size} bytes is not a multiple of 2 MiB (the huge page size); use {up} ({})",
                    ByteSize(up)
                ),
            );
        }
        let need = u64::from(self.prefetch.max_inflight_reads) * ARENA_BYTES_PER_INFLIGHT_READ;
        if size >= MIN_ARENA_BYTES && size < need {
            p.bad(
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
    }

    fn validate_socket(&self, p: &mut Problems) {
        let sock = self.socket.path.as_os_str();
        if sock.is_empty() {
            p.bad("socket.path", "must not be empty");
        } else if sock.len() > MAX_SOCKET_PATH_BYTES {
            p.bad(
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
            p.bad(
                "socket.mode",
                format!(
                    "{} does not give the owner read and write permission (0600)",
                    self.socket.mode
                ),
            );
        }
        if !self.socket.allowed_gids.is_empty() && mode & 0o060 != 0o060 {
            p.bad(
                "socket.mode",
                format!(
                    "{} does not give the group read and write permission (0060), \
                     so the members of socket.allowed_gids could not connect",
                    self.socket.mode
                ),
            );
        }
    }

    fn validate_prefetch(&self, p: &mut Problems) {
        let pf = &self.prefetch;
        if pf.window_batches == 0 {
            p.bad("prefetch.window_batches", "must be at least 1");
        }
        if pf.max_inflight_reads == 0 || pf.max_inflight_reads > MAX_INFLIGHT_READS {
            p.bad(
                "prefetch.max_inflight_reads",
                format!(
                    "{} is outside 1..={MAX_INFLIGHT_READS}",
                    pf.max_inflight_reads
                ),
            );
        }
        if pf.initial_window == 0 {
            p.bad("prefetch.initial_window", "must be at least 1");
        } else if pf.initial_window > pf.window_batches {
            p.bad(
                "prefetch.initial_window",
                format!(
                    "{} exceeds prefetch.window_batches = {}",
                    pf.initial_window, pf.window_batches
                ),
            );
        }
        if pf.read_timeout_ms == 0 {
            p.bad("prefetch.read_timeout_ms", "must be at least 1");
        } else if pf.read_timeout_ms >= self.sessions.client_timeout_ms {
            p.bad(
                "prefetch.read_timeout_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms, or a loader waiting on \
                     a slow read would be taken for dead before the read fails",
                    pf.read_timeout_ms, self.sessions.client_timeout_ms
                ),
            );
        }
        let retry = pf.retry_settings(&Default::default());
        self.validate_retry(&retry, "prefetch.", p);
    }

    /// The rules of retry settings, in `[prefetch]` (`prefix` =
    /// `"prefetch."`) or a dataset's `[dataset.retry]`.
    fn validate_retry(&self, r: &RetrySettings, prefix: &str, p: &mut Problems) {
        let field = |k: &str| format!("{prefix}{k}");
        let ms = |d: std::time::Duration| d.as_millis();
        if r.retries > MAX_READ_RETRIES {
            p.bad(
                &field("read_retries"),
                format!("{} is above the maximum of {MAX_READ_RETRIES}", r.retries),
            );
        }
        if r.backoff.is_zero() {
            p.bad(&field("retry_backoff_ms"), "must be at least 1");
        } else if r.backoff_max < r.backoff {
            p.bad(
                &field("retry_backoff_max_ms"),
                format!(
                    "{} ms is below retry_backoff_ms = {} ms",
                    ms(r.backoff_max),
                    ms(r.backoff)
                ),
            );
        }
        let read_timeout = u128::from(self.prefetch.read_timeout_ms);
        if ms(r.deadline) < read_timeout {
            p.bad(
                &field("sample_deadline_ms"),
                format!(
                    "{} ms is below prefetch.read_timeout_ms = {read_timeout} ms: a sample must \
                     have time for at least one whole read",
                    ms(r.deadline)
                ),
            );
        } else if ms(r.deadline) >= u128::from(self.sessions.client_timeout_ms) {
            p.bad(
                &field("sample_deadline_ms"),
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms, or a loader waiting \
                     on a failing sample would be taken for dead before the sample fails",
                    ms(r.deadline),
                    self.sessions.client_timeout_ms
                ),
            );
        }
    }

    fn validate_sessions(&self, p: &mut Problems) {
        let ss = &self.sessions;
        if ss.max_sessions == 0 {
            p.bad("sessions.max_sessions", "must be at least 1");
        }
        if ss.max_sessions_per_uid == Some(0) {
            p.bad("sessions.max_sessions_per_uid", "must be at least 1");
        }
        if !(1..=100).contains(&ss.max_pinned_percent) {
            p.bad(
                "sessions.max_pinned_percent",
                format!("is {}, must be 1 to 100", ss.max_pinned_percent),
            );
        }
        for (field, cap) in [
            ("sessions.ready_ring_capacity", ss.ready_ring_capacity),
            ("sessions.release_ring_capacity", ss.release_ring_capacity),
        ] {
            if !cap.is_power_of_two() || !(2..=MAX_RING_CAPACITY).contains(&cap) {
                p.bad(
                    field,
                    format!("{cap} is not a power of two in 2..={MAX_RING_CAPACITY}"),
                );
            }
        }
        if ss.client_timeout_ms == 0 {
            p.bad("sessions.client_timeout_ms", "must be at least 1");
        }
        if ss.heartbeat_ms == 0 {
            p.bad("sessions.heartbeat_ms", "must be at least 1");
        } else if ss.heartbeat_ms >= ss.client_timeout_ms {
            p.bad(
                "sessions.heartbeat_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms",
                    ss.heartbeat_ms, ss.client_timeout_ms
                ),
            );
        }
    }

    fn validate_datasets(&self, p: &mut Problems) {
        if self.datasets.is_empty() {
            p.bad("dataset", "at least one [[dataset]] is required");
        }
        // A dataset's retry table is checked once [prefetch]'s retry
        // settings pass, so that one mistake is not reported once per dataset.
        let prefetch_retry_ok = {
            let mut q = Problems::default();
            self.validate_retry(
                &self.prefetch.retry_settings(&Default::default()),
                "",
                &mut q,
            );
            q.0.is_empty()
        };
        let mut seen = HashSet::new();
        for (i, ds) in self.datasets.iter().enumerate() {
            let field = |name: &str| format!("dataset[{i}].{name}");
            let name = ds.name();
            if name.is_empty() {
                p.bad(&field("name"), "must not be empty");
            } else if name.len() > MAX_DATASET_NAME_BYTES {
                p.bad(
                    &field("name"),
                    format!(
                        "is {} bytes long; at most {MAX_DATASET_NAME_BYTES}",
                        name.len()
                    ),
                );
            } else if name.chars().any(char::is_control) {
                p.bad(
                    &field("name"),
                    format!("{name:?} contains control characters"),
                );
            } else if !seen.insert(name) {
                p.bad(
                    &field("name"),
                    format!("{name:?} is used by an earlier dataset"),
                );
            }
            if prefetch_retry_ok && *ds.retry() != Default::default() {
                self.validate_retry(&self.retry_for(ds), &field("retry."), p);
            }
            if let Some(prep) = ds.prepare() {
                for (key, message) in prep.problems() {
                    p.bad(&field(&format!("prepare.{key}")), message);
                }
            }
            match ds {
                DatasetConfig::Fs(fs) => {
                    validate_fs(fs, &field, p);
                    validate_format(
                        fs.format,
                        &fs.label_field,
                        &fs.sample_field,
                        fs.manifest.is_some(),
                        &field,
                        p,
                    );
                    if fs.direct_io && fs.format != ShardFormat::Files {
                        p.bad(
                            &field("direct_io"),
                            "is for format = \"files\": samples inside shards start at offsets \
                             that are no multiple of a block",
                        );
                    }
                }
                DatasetConfig::S3(s3) => {
                    validate_s3(s3, &field, p);
                    validate_format(
                        s3.format,
                        &s3.label_field,
                        &s3.sample_field,
                        s3.manifest.is_some(),
                        &field,
                        p,
                    );
                    self.validate_remote(
                        s3.request_timeout_ms,
                        s3.retries,
                        s3.max_inflight,
                        &field,
                        p,
                    );
                }
                DatasetConfig::Gcs(gcs) => {
                    validate_gcs(gcs, &field, p);
                    self.validate_remote(
                        gcs.request_timeout_ms,
                        gcs.retries,
                        gcs.max_inflight,
                        &field,
                        p,
                    );
                }
                DatasetConfig::Azure(az) => {
                    validate_azure(az, &field, p);
                    self.validate_remote(
                        az.request_timeout_ms,
                        az.retries,
                        az.max_inflight,
                        &field,
                        p,
                    );
                }
                DatasetConfig::Cql(cql) => {
                    validate_cql(cql, &field, p);
                    self.validate_remote(
                        cql.request_timeout_ms,
                        cql.retries,
                        Some(cql.max_inflight),
                        &field,
                        p,
                    );
                }
            }
        }
    }

    /// The rules of the fields remote stores share.
    fn validate_remote(
        &self,
        request_timeout_ms: u64,
        retries: u32,
        max_inflight: Option<u32>,
        field: &dyn Fn(&str) -> String,
        p: &mut Problems,
    ) {
        let client_timeout = self.sessions.client_timeout_ms;
        if request_timeout_ms == 0 {
            p.bad(&field("request_timeout_ms"), "must be at least 1");
        } else if request_timeout_ms >= client_timeout {
            p.bad(
                &field("request_timeout_ms"),
                format!(
                    "{request_timeout_ms} ms must be below sessions.client_timeout_ms = {client_timeout} ms"
                ),
            );
        }
        if retries > MAX_REMOTE_RETRIES {
            p.bad(
                &field("retries"),
                format!("{retries} is above the maximum of {MAX_REMOTE_RETRIES}"),
            );
        }
        if let Some(n) = max_inflight {
            if !(1..=MAX_REMOTE_INFLIGHT).contains(&n) {
                p.bad(
                    &field("max_inflight"),
                    format!("{n} is outside 1..={MAX_REMOTE_INFLIGHT}"),
                );
            }
        }
    }
}

/// The rules of `format`, `label_field` and `sample_field` (fs and s3
/// datasets).
fn validate_format(
    format: ShardFormat,
    label_field: &Option<String>,
    sample_field: &Option<String>,
    manifest: bool,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    if format != ShardFormat::Files && manifest {
        p.bad(
            &field("manifest"),
            "a manifest lists samples of format = \"files\"; shards are found under `root` or `prefix`",
        );
    }
    if let Some(l) = label_field {
        if format == ShardFormat::Files {
            p.bad(
                &field("label_field"),
                "is for format = \"webdataset\", \"mds\" or \"parquet\"",
            );
        } else if l.is_empty() || l.contains('/') || l.chars().any(char::is_control) {
            p.bad(
                &field("label_field"),
                format!(
                    "{l:?} is not a member extension or column name (non-empty, no '/' or control characters)"
                ),
            );
        }
    }
    if let Some(s) = sample_field {
        if !format.has_columns() {
            p.bad(
                &field("sample_field"),
                "is for format = \"mds\" or \"parquet\"",
            );
        } else if s.is_empty() || s.contains('/') || s.chars().any(char::is_control) {
            p.bad(
                &field("sample_field"),
                format!("{s:?} is not a column name (non-empty, no '/' or control characters)"),
            );
        }
    }
}

/// The rules of a `kind = "fs"` dataset.
fn validate_fs(ds: &FsConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    match (&ds.root, &ds.manifest) {
        (None, None) => p.bad(
            &field("root"),
            "set either `root` (a directory tree) or `manifest` (a file)",
        ),
        (Some(_), Some(_)) => p.bad(&field("manifest"), "set only one of `root` and `manifest`"),
        (Some(r), None) if r.as_os_str().is_empty() => p.bad(&field("root"), "must not be empty"),
        (None, Some(m)) if m.as_os_str().is_empty() => {
            p.bad(&field("manifest"), "must not be empty")
        }
        _ => {}
    }
}

/// The rules of a `kind = "s3"` dataset.
fn validate_s3(ds: &S3Config, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    validate_bucket(&ds.bucket, "bucket", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "bucket", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    if ds.access_key_id.is_some() != ds.secret_access_key.is_some() {
        let missing = if ds.access_key_id.is_some() {
            "secret_access_key"
        } else {
            "access_key_id"
        };
        p.bad(
            &field(missing),
            "access_key_id and secret_access_key go together: set both, or neither (then \
             AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are used)",
        );
    }
}

/// The rules of a `kind = "gcs"` dataset.
fn validate_gcs(ds: &GcsConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    validate_bucket(&ds.bucket, "bucket", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "bucket", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    if ds
        .service_account_file
        .as_ref()
        .is_some_and(|f| f.as_os_str().is_empty())
    {
        p.bad(&field("service_account_file"), "must not be empty");
    }
}

/// The rules of a `kind = "azure"` dataset.
fn validate_azure(ds: &AzureConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    let a = &ds.account;
    if a.is_empty() || !a.bytes().all(|b| b.is_ascii_alphanumeric()) {
        p.bad(
            &field("account"),
            format!("{a:?} is not a storage account name (letters and digits)"),
        );
    }
    validate_bucket(&ds.container, "container", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "container", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    let signed = ds.access_key.is_some() || ds.sas_token.is_some();
    if ds.access_key.is_some() && ds.sas_token.is_some() {
        p.bad(
            &field("sas_token"),
            "set at most one of `access_key` and `sas_token`",
        );
    } else if signed && ds.anonymous {
        p.bad(
            &field("anonymous"),
            "anonymous requests carry no credentials: leave out `access_key` and `sas_token`",
        );
    }
}

/// A bucket or container name: non-empty, no `/` or spaces.
fn validate_bucket(b: &str, key: &str, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    if b.is_empty() || b.contains('/') || b.chars().any(char::is_whitespace) {
        p.bad(
            &field(key),
            format!("{b:?} is not a {key} name (non-empty, no '/' or spaces)"),
        );
    }
}

/// Exactly one of `prefix` and `manifest`, the manifest not empty.
fn validate_layout(
    prefix: &Option<String>,
    manifest: &Option<String>,
    what: &str,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    match (prefix, manifest) {
        (None, None) => p.bad(
            &field("prefix"),
            format!(
                "set either `prefix` (a folder of the {what}; \"\" for all of it) or `manifest`"
            ),
        ),
        (Some(_), Some(_)) => p.bad(
            &field("manifest"),
            "set only one of `prefix` and `manifest`",
        ),
        (None, Some(m)) if m.is_empty() || m == "file://" => {
            p.bad(&field("manifest"), "must not be empty")
        }
        _ => {}
    }
}

/// An `http://` or `https://` URL; plain HTTP only with `allow_http`.
fn validate_endpoint(
    endpoint: Option<&str>,
    allow_http: bool,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    let Some(e) = endpoint else {
        return;
    };
    if let Some(rest) = e.strip_prefix("http://") {
        if rest.is_empty() {
            p.bad(&field("endpoint"), format!("{e:?} names no host"));
        } else if !allow_http {
            p.bad(
                &field("allow_http"),
                format!(
                    "endpoint {e} is plain HTTP; set allow_http = true to use it (meant for loopback and test servers)"
                ),
            );
        }
    } else if e.strip_prefix("https://").is_none_or(str::is_empty) {
        p.bad(
            &field("endpoint"),
            format!("{e:?} is not an http:// or https:// URL"),
        );
    }
}

/// The rules of a `kind = "cql"` dataset.
fn validate_cql(ds: &CqlConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    if ds.hosts.is_empty() {
        p.bad(
            &field("hosts"),
            "required for kind = \"cql\": contact points such as [\"10.0.0.1:9042\"]",
        );
    }
    for (j, h) in ds.hosts.iter().enumerate() {
        if let Err(e) = parse_cql_host(h) {
            p.bad(&field(&format!("hosts[{j}]")), e);
        }
    }
    let name_rule = "is not a CQL name Granary accepts (1 to 48 lowercase letters, digits or \
                     '_', starting with a letter)";
    for (key, value) in [
        ("keyspace", &ds.keyspace),
        ("data_table", &ds.data_table),
        ("metadata_table", &ds.metadata_table),
    ] {
        if !is_cql_name(value) {
            p.bad(&field(key), format!("{value:?} {name_rule}"));
        }
    }
    if ds.data_table == ds.metadata_table {
        p.bad(
            &field("metadata_table"),
            format!(
                "{:?} is also the data table; the two tables must differ",
                ds.metadata_table
            ),
        );
    }
    match (&ds.username, &ds.password) {
        (Some(u), _) if u.is_empty() => p.bad(&field("username"), "must not be empty"),
        (None, Some(_)) => p.bad(
            &field("username"),
            "a password is set without a username; set both (or the username and \
             GRANARY_CQL_PASSWORD in the environment)",
        ),
        _ => {}
    }
    if let Some(f) = &ds.tls_ca_file {
        if f.as_os_str().is_empty() {
            p.bad(&field("tls_ca_file"), "must not be empty");
        } else if !ds.tls {
            p.bad(
                &field("tls"),
                "tls_ca_file is set but TLS is off; set tls = true",
            );
        }
    }
    if ds.connections_per_host.is_some() && ds.connections_per_shard.is_some() {
        p.bad(
            &field("connections_per_shard"),
            "set only one of connections_per_host and connections_per_shard",
        );
    }
    for (key, value) in [
        ("connections_per_host", ds.connections_per_host),
        ("connections_per_shard", ds.connections_per_shard),
    ] {
        if let Some(n) = value {
            if !(1..=MAX_CQL_CONNECTIONS).contains(&n) {
                p.bad(
                    &field(key),
                    format!("{n} is outside 1..={MAX_CQL_CONNECTIONS}"),
                );
            }
        }
    }
}
