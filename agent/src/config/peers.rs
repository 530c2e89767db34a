//! `[peers]`: the agents of one job sharing their arenas (`docs/peers.md`).

use super::{ByteSize, Secret};
use serde::Deserialize;
use std::path::PathBuf;

/// Where the job's membership view comes from. It is never voted: the
/// launcher's list is the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Membership {
    /// No peers: this agent reads every sample it serves from the store.
    #[default]
    Off,
    /// The list in `peers.members`.
    Static,
    /// Slurm's variables (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`,
    /// `SLURM_RESTART_COUNT`), every node listening on `peers.port`.
    Slurm,
    /// Handed in by the job's loaders when they open sessions (in Python,
    /// gathered through the job's `torch.distributed` process group); a
    /// newer view of the same job replaces the old one and ends its
    /// sessions. Also how a `"dns"` agent's engine runs: its views are
    /// handed in by the agent's own resolver (`peers::dns`), by nobody else.
    Session,
}

/// `peers.membership` as written. The engine runs the [`Membership`] it
/// maps to (`"dns"` runs as `"session"`); [`PeersConfig::membership`] holds
/// that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipSetting {
    /// `"off"`.
    #[default]
    Off,
    /// `"static"`.
    Static,
    /// `"slurm"`.
    Slurm,
    /// `"session"`.
    Session,
    /// `"dns"`: the addresses of `peers.dns_name` (A records, else AAAA),
    /// each a member listening on `peers.port`, resolved again every
    /// `peers.dns_refresh_ms` (`docs/kubernetes.md`).
    Dns,
}

impl MembershipSetting {
    /// The mode the engine runs.
    pub(crate) fn engine_mode(self) -> Membership {
        match self {
            MembershipSetting::Off => Membership::Off,
            MembershipSetting::Static => Membership::Static,
            MembershipSetting::Slurm => Membership::Slurm,
            MembershipSetting::Session | MembershipSetting::Dns => Membership::Session,
        }
    }

    /// The setting as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            MembershipSetting::Off => "off",
            MembershipSetting::Static => "static",
            MembershipSetting::Slurm => "slurm",
            MembershipSetting::Session => "session",
            MembershipSetting::Dns => "dns",
        }
    }
}

/// `peers.transport`: what carries blocks between peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportSetting {
    /// RDMA when this host has an RDMA device (and the agent is built with
    /// the `rdma` feature), TCP otherwise.
    #[default]
    Auto,
    /// TCP only.
    Tcp,
    /// RDMA; the agent refuses to start without an RDMA device.
    Rdma,
}

impl TransportSetting {
    /// The setting as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportSetting::Auto => "auto",
            TransportSetting::Tcp => "tcp",
            TransportSetting::Rdma => "rdma",
        }
    }
}

/// `peers.encryption`: what the peer channel's records protect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encryption {
    /// Every record authenticated and encrypted.
    #[default]
    On,
    /// Every record authenticated, sent in clear: for a fabric the operator
    /// trusts against taps (and the only setting RDMA runs with, since RDMA
    /// writes carry payloads in clear).
    Off,
}

/// `peers.cipher`: the AEAD an agent proposes when it dials a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CipherSetting {
    /// The one this CPU runs fastest: AES-256-GCM with AES and carry-less
    /// multiply instructions, ChaCha20-Poly1305 without.
    #[default]
    Auto,
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305.
    Chacha20Poly1305,
}

/// One member of a static view.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// `peers.members[i].id`: the node's stable id.
    pub id: String,
    /// `peers.members[i].addr`: `HOST:PORT` its agent listens on for peers.
    pub addr: String,
    /// `peers.members[i].keep`: bytes of its arena kept for the job. Default:
    /// this agent's own (`peers.keep_percent` of its sample cache).
    #[serde(default)]
    pub keep: Option<ByteSize>,
}

/// `peers.dns_refresh_ms` by default.
pub(crate) const DEFAULT_DNS_REFRESH_MS: u64 = 5000;

/// The longest `peers.dns_name`: the view's job id is the name, `@` and 12
/// hex digits, within a view's 255-byte names.
pub(crate) const MAX_DNS_NAME: usize = 240;

/// `peers.max_members` by default.
pub(crate) const DEFAULT_MAX_MEMBERS: u32 = 4096;

/// The smallest `peers.handin_bytes_per_uid`: a small view and a small
/// layout at once.
pub(crate) const MIN_HANDIN_BYTES_PER_UID: u64 = 64 << 10;

/// `[peers]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeersConfig {
    /// `peers.membership`: `"off"` (default), `"static"`, `"slurm"`,
    /// `"session"` or `"dns"`.
    #[serde(rename = "membership")]
    pub membership_setting: MembershipSetting,
    /// How the engine takes its view: `peers.membership`, with `"dns"` run
    /// as `"session"` (set from `membership_setting` when the file is
    /// parsed, never read from it).
    #[serde(skip)]
    pub membership: Membership,
    /// `peers.dns_name`: with `"dns"`, the name whose A records (AAAA when
    /// it has none) are the members' addresses, e.g. a headless Service's
    /// `granary-peers.granary.svc.cluster.local`.
    pub dns_name: String,
    /// `peers.dns_refresh_ms`: with `"dns"`, how often the name is
    /// resolved again; a changed set of addresses is a new view. Default
    /// 5000.
    pub dns_refresh_ms: u64,
    /// `peers.job_id`: the job every member belongs to. Required with
    /// `"static"`; `SLURM_JOB_ID` with `"slurm"`; with `"session"`, if
    /// set, the only job whose views are accepted.
    pub job_id: String,
    /// `peers.node_id`: this agent's id in the view. Default: the host
    /// name (`SLURMD_NODENAME` under Slurm).
    pub node_id: String,
    /// `peers.listen`: `IP:PORT` of the peer listener. Default: the port of
    /// this node's entry on all addresses (`0.0.0.0`).
    pub listen: String,
    /// `peers.port`: the port every agent listens on with `"slurm"` and,
    /// unless `peers.listen` says otherwise, `"session"`. Default 7170.
    pub port: u16,
    /// `peers.advertise`: `HOST:PORT` other agents reach this one at, as
    /// told to loaders that gather a view (`"session"`). Default: the
    /// `peers.listen` address when it names an IP, else `NODE_ID:PORT`.
    pub advertise: String,
    /// `peers.members`: the static view (`"static"`).
    pub members: Vec<MemberConfig>,
    /// `peers.view_uids`: user ids whose loaders may install or replace
    /// this agent's view (`"session"`), besides the agent's own uid, which
    /// always may. Any loader the socket admits may join the view held.
    /// Default empty.
    pub view_uids: Vec<u32>,
    /// `peers.max_members`: the most members a view may have, 1 to 65,536;
    /// larger views are refused before they are decoded (and a static or
    /// Slurm view larger than this stops the agent). Default 4096.
    pub max_members: u32,
    /// `peers.handin_bytes_per_uid`: bytes of views and rank layouts the
    /// loaders of one uid may be handing in at once, over all their
    /// connections (each hand-in counts its announced size from its first
    /// chunk). Default 16 MiB.
    pub handin_bytes_per_uid: ByteSize,
    /// `peers.secret`: the per-job secret, the pre-shared key of the peer
    /// channel's handshake. Give it or `peers.secret_file`.
    pub secret: Option<Secret>,
    /// `peers.secret_file`: a file holding the secret (trailing newline
    /// ignored).
    pub secret_file: Option<PathBuf>,
    /// `peers.keep_percent`: share of this agent's sample cache that holds
    /// the samples it owns for the job (its keep-set), in percent, 1 to 90.
    /// Default 50.
    pub keep_percent: u32,
    /// `peers.hedge_after_ms`: a sample asked of a peer that has not begun
    /// to arrive after this long is read from the store as well (the first
    /// copy wins). Default 2000.
    pub hedge_after_ms: u64,
    /// `peers.owner_grace_ms`: when the connection to a sample's owner
    /// drops, reads of its samples wait this long for it to come back (a
    /// restarted agent serves its keep-set again) before they go to the
    /// store; 0 reads the store at once. Default 10000.
    pub owner_grace_ms: u64,
    /// `peers.owner_grace_blocked_ms`: within that grace, how long a sample
    /// a loader is already waiting on (its batch is next and nothing is
    /// ready before it) waits for its owner before it is read from the
    /// store; 0 reads it at once. Default 1000.
    pub owner_grace_blocked_ms: u64,
    /// `peers.status_interval_ms`: how often this agent sends its peers
    /// its job status (each plan's rank positions and its ranks' waits)
    /// when nothing changed; a change goes out at the next second.
    /// Default 5000.
    pub status_interval_ms: u64,
    /// `peers.connect_timeout_ms`: time to connect and authenticate.
    /// Default 3000.
    pub connect_timeout_ms: u64,
    /// `peers.idle_timeout_ms`: a connection silent this long is closed
    /// (keepalives go out at a third of it). Default 15000.
    pub idle_timeout_ms: u64,
    /// `peers.max_requests`: requests outstanding on one connection (the
    /// credit each side grants). Default 256.
    pub max_requests: u32,
    /// `peers.transport`: `"auto"` (default), `"tcp"` or `"rdma"`
    /// (`docs/rdma.md`).
    pub transport: TransportSetting,
    /// `peers.rdma_device`: the RDMA device blocks go through when the
    /// transport resolves to RDMA, as `ibv_devices` names it. Default:
    /// `""`, the first device.
    pub rdma_device: String,
    /// `peers.rdma_port`: its port, from 1. Default 1.
    pub rdma_port: u8,
    /// `peers.rdma_gid_index`: the port's GID index (on RoCE, the RoCE v2
    /// GID of this node's address). Default 0.
    pub rdma_gid_index: u8,
    /// `peers.encryption`: `"on"` (default) or `"off"` (records
    /// authenticated, not encrypted).
    pub encryption: Encryption,
    /// `peers.cipher`: `"auto"` (default), `"aes-256-gcm"` or
    /// `"chacha20-poly1305"`.
    pub cipher: CipherSetting,
    /// `peers.max_connections`: peer connections this agent's listener
    /// holds at once, authenticated or not. Default 256.
    pub max_connections: u32,
    /// `peers.max_connections_per_address`: of which from one source IP
    /// address. Default 8.
    pub max_connections_per_address: u32,
    /// `peers.write_timeout_ms`: a connection whose writes make no progress
    /// this long is closed (what it was sent is unpinned). Default 10000.
    pub write_timeout_ms: u64,
    /// `peers.block_timeout_ms`: a block whose payload has not wholly
    /// arrived this long after its header is abandoned, its connection
    /// closed and the sample read elsewhere. Default 5000.
    pub block_timeout_ms: u64,
    /// `peers.max_pinned_per_peer`: bytes of this agent's arena one peer
    /// connection's requests may hold pinned (queued, waiting for a store
    /// read or being sent); more get an `overloaded` miss. Default 256 MiB.
    pub max_pinned_per_peer: ByteSize,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            membership_setting: MembershipSetting::Off,
            membership: Membership::Off,
            dns_name: String::new(),
            dns_refresh_ms: DEFAULT_DNS_REFRESH_MS,
            job_id: String::new(),
            node_id: String::new(),
            listen: String::new(),
            port: 7170,
            advertise: String::new(),
            members: Vec::new(),
            view_uids: Vec::new(),
            max_members: DEFAULT_MAX_MEMBERS,
            handin_bytes_per_uid: ByteSize(16 << 20),
            secret: None,
            secret_file: None,
            keep_percent: 50,
            hedge_after_ms: 2000,
            owner_grace_ms: 10_000,
            owner_grace_blocked_ms: 1000,
            status_interval_ms: 5000,
            connect_timeout_ms: 3000,
            idle_timeout_ms: 15000,
            max_requests: 256,
            transport: TransportSetting::Auto,
            rdma_device: String::new(),
            rdma_port: 1,
            rdma_gid_index: 0,
            encryption: Encryption::On,
            cipher: CipherSetting::Auto,
            max_connections: 256,
            max_connections_per_address: 8,
            write_timeout_ms: 10_000,
            block_timeout_ms: 5000,
            max_pinned_per_peer: ByteSize(256 << 20),
        }
    }
}

impl PeersConfig {
    /// Whether this agent shares its arena with peers.
    pub(crate) fn enabled(&self) -> bool {
        self.membership != Membership::Off
    }

    /// Whether a loader of `uid` may install or replace the view, given
    /// the agent's own uid (which always may).
    pub(crate) fn may_install_views(&self, agent_uid: u32, uid: u32) -> bool {
        uid == agent_uid || self.view_uids.contains(&uid)
    }
}
