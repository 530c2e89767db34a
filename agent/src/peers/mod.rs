//! The peer tier: the agents of one job sharing their arenas.
//!
//! Every agent of the job computes, from the same membership view and the
//! same catalog, who owns each sample and which samples each owner keeps
//! (`granary_peer::keep::Directory`). A session's miss for a sample a live
//! peer owns and keeps goes to that peer before the store; the owner reads
//! each sample it keeps from the store once, holds it in the keep area of
//! its arena (never evicted) and serves it; every peer failure falls back to
//! the store. Sessions' shares do not change: only where the bytes come
//! from does (`docs/peers.md`).
//!
//! | module | what it holds |
//! |---|---|
//! | `fingerprint` | a dataset's identity across agents: names, sizes and version tokens |
//! | `membership` | the view from the configuration (static list, Slurm), the job secret |
//! | [`dns`] | `membership = "dns"`: the members from a name's records, resolved again at run time |
//! | `directory` | directories computed on a thread of their own |
//! | `net` | the TCP transport: listener, one connection per peer, payloads straight to and from the arena |
//! | [`metrics`] | the tier's Prometheus series |
//! | [`transport`] | `peers.transport`: the RDMA device probe, each link's transport |
//! | `ratelog` | rate-limited warnings (one line per kind per period, with the count left out) |
//! | `rdma_link` | the RDMA driver speaking the peer protocol's frames, with fallback to TCP or the store |
//! | this module | [`PeerTier`]: starting the tier, routing, directories |
//! | `tier_requests` | `PeerTier`'s gets: sent, reported on, ended by the requester |
//! | `tier_grace` | `PeerTier`'s reads waiting for an owner whose connection dropped (`peers.owner_grace_ms`) |
//! | `tier_serving` | `PeerTier`'s side as owner: peers' requests admitted, tracked, answered |
//! | `tier_rdma` | `PeerTier`'s RDMA links: set-up over TCP, offers, gets, blocks, misses |
//!
//! `PeerTier`'s fields are private to this module: the engine drives it
//! through its methods from `engine/peers.rs`, `engine/serving.rs` and
//! `engine/peers_rdma.rs`, and keeps the cache, the arena and the metrics.

#[cfg(test)]
mod conformance_tcp;
pub(crate) mod directory;
pub mod dns;
mod fingerprint;
mod membership;
pub mod metrics;
pub(crate) mod net;
pub(crate) mod ratelog;
pub(crate) mod rdma_link;
mod tier_grace;
mod tier_rdma;
mod tier_requests;
mod tier_serving;
pub mod transport;

pub use fingerprint::fingerprint;
pub(crate) use membership::{endpoint, Endpoint};
pub use membership::{load_secret, view_from_config, MembershipError};

use crate::cache::{CacheConfig, SampleKey};
use crate::config::{CipherSetting, Config, Encryption, PeersConfig};
use crate::source::SampleSource;
use granary_peer::channel::{Protection, Suite};
use granary_peer::conn::ConnConfig;
use granary_peer::grace::{Grace, GraceConfig};
use granary_peer::keep::Directory;
use granary_peer::request::{Requester, RequesterConfig};
use granary_peer::serve::{ServeConfig, Server};
use granary_peer::view::View;
use granary_shm::arena::Arena;
use net::{ConnId, Net, NetConfig};
use rdma_link::RdmaLinks;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use transport::{LinkTransport, Nic, OpenNic};

/// Where a missing sample is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The store, as without peers.
    Store,
    /// The store, into the keep area: this agent owns and keeps it.
    Keep,
    /// The peer with this member index, which owns and keeps it.
    Peer(usize),
    /// The peer with this member index owns and keeps it, but its
    /// connection dropped: the read waits for it to come back, within
    /// `peers.owner_grace_ms` (`tier_grace.rs`).
    Wait(usize),
}

/// The view a loader's connection joined: sessions opened on it end when
/// a newer view of the same job is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ViewTag {
    pub job: String,
    pub epoch: u64,
}

impl ViewTag {
    pub(crate) fn of(v: &View) -> ViewTag {
        ViewTag {
            job: v.job_id().to_string(),
            epoch: v.epoch(),
        }
    }
}

/// A dataset's place in the job: its fingerprint and directory.
#[derive(Debug)]
pub(crate) struct DatasetPeers {
    pub fingerprint: u64,
    /// Shared with the sessions planned in locality mode.
    pub dir: Arc<Directory>,
}

/// What a get to a peer is for: the sample and the reserved extent it
/// lands in (the requester's token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerToken {
    pub key: SampleKey,
    /// Arena offset and length of the reserved extent.
    pub dest: u64,
    pub len: u32,
}

/// A peer's request being served: the pin it holds, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serving {
    pub key: SampleKey,
    pub pinned: bool,
    /// Its answer was handed to the transport (RDMA: a `Released` for it
    /// frees a place in the serving queue; one aborted before does not).
    pub handed: bool,
}

/// The serving queue's name for member `m`'s RDMA link: its requests are
/// queued and answered like a connection's. TCP connections count up from
/// 1 and never reach these.
pub(crate) fn rdma_conn(m: usize) -> ConnId {
    RDMA_CONNS + m as u64
}

/// The member whose RDMA link `conn` names, if it names one.
pub(crate) fn rdma_member(conn: ConnId) -> Option<usize> {
    conn.checked_sub(RDMA_CONNS).map(|m| m as usize)
}

const RDMA_CONNS: ConnId = u64::MAX - u32::MAX as u64;

/// The RDMA links over the NIC `open` gave, registering the whole of
/// `arena`; `None` (TCP carries every block, reported `rdma-fallback`)
/// when that fails.
fn rdma_links(
    open: Result<Nic, String>,
    arena: &Arena,
    hedge_after: Duration,
    members: usize,
) -> Option<RdmaLinks<Nic>> {
    let cfg = granary_rdma::DriverConfig {
        // A get unanswered when the TCP path would hedge it tears the
        // queue pair down, so that nothing lands in its extent any more
        // before the store is read into it.
        transfer_timeout_ns: hedge_after.as_nanos() as u64,
        ..granary_rdma::DriverConfig::default()
    };
    let links = open.and_then(|nic| {
        let whole = arena
            .slice(0, arena.size() as usize)
            .map_err(|e| e.to_string())?;
        RdmaLinks::with_arena(nic, whole, cfg, members).map_err(|e| e.to_string())
    });
    match links {
        Ok(l) => {
            tracing::info!(
                arena_bytes = arena.size(),
                "RDMA links ready: the arena is registered; peers' blocks land by RDMA write"
            );
            Some(l)
        }
        Err(e) => {
            tracing::warn!(
                "peers.transport: RDMA could not start ({e}); peers' blocks go over TCP \
                 (rdma-fallback)"
            );
            None
        }
    }
}

/// The peer tier of one agent (see the module documentation).
#[derive(Debug)]
pub struct PeerTier {
    net: Net,
    view: Arc<View>,
    me: usize,
    align: u64,
    /// By the engine's dataset index; `None` until the dataset is ready.
    datasets: Vec<Option<DatasetPeers>>,
    by_fingerprint: HashMap<u64, usize>,
    /// Our gets in flight: the requester (verification, hedging, slow
    /// peers).
    requester: Requester<PeerToken>,
    /// Per member: whether the requester found it slow, as last reported.
    slow: Vec<bool>,
    serve: Server,
    /// Peers' requests admitted, by (connection, request id).
    serving: HashMap<(u64, u64), Serving>,
    /// Per member: whether a connection is up.
    up: Vec<bool>,
    /// What `peers.transport` resolved to on this host.
    transport: transport::Resolved,
    /// The RDMA links, when the transport resolved to RDMA and the device
    /// opened (the whole arena registered in place).
    rdma: Option<RdmaLinks<Nic>>,
    /// Per member: the authenticated TCP connection RDMA is set up over.
    rdma_conn: Vec<Option<ConnId>>,
    /// Per member: the transport last reported (`granary status`).
    reported: Vec<Option<LinkTransport>>,
    /// `peers.max_pinned_per_peer`.
    max_pinned: u64,
    /// Rate-limited warnings of the engine's side of the tier.
    log: ratelog::RateLog,
    /// Reads waiting for an owner whose connection dropped.
    grace: Grace<PeerToken>,
}

impl PeerTier {
    /// Starts the tier for `view`: the job secret, the listener. The
    /// cache's keep area is this agent's share and its extent alignment
    /// sizes samples in the directory. When `peers.transport` resolves to
    /// RDMA, or `nic` is given (a test's fake NIC), the RDMA links register
    /// `arena` in place. Refusals are counted in `metrics`.
    pub(crate) fn start(
        cfg: &Config,
        view: View,
        cache: &CacheConfig,
        datasets: usize,
        arena: &Arena,
        nic: Option<&OpenNic>,
        metrics: &metrics::PeerMetrics,
    ) -> io::Result<PeerTier> {
        let (keep_bytes, align) = (cache.keep_reserve, cache.align);
        let ep = membership::endpoint(&cfg.peers, Some(&view))
            .map_err(|e| io::Error::other(format!("peers: {e}")))?;
        let node_id = ep.node_id.clone();
        let me = view.index_of(&node_id).ok_or_else(|| {
            io::Error::other(format!(
                "peers: this node's id {node_id:?} is not in the view of job {:?}",
                view.job_id()
            ))
        })?;
        let secret =
            load_secret(&cfg.peers).map_err(|e| io::Error::other(format!("peers: {e}")))?;
        let listen = ep.listen;
        let resolved = match nic {
            Some(_) => transport::Resolved::Rdma,
            None => transport::resolve_here(cfg.peers.transport)
                .map_err(|e| io::Error::other(format!("peers.transport {e}")))?,
        };
        let encrypted = cfg.peers.encryption == Encryption::On;
        let resolved = if encrypted && resolved == transport::Resolved::Rdma {
            tracing::info!(
                "peers.encryption = \"on\": RDMA writes payloads in clear, so peers use TCP \
                 (set peers.encryption = \"off\" on a fabric trusted against taps to use RDMA)"
            );
            transport::Resolved::Tcp
        } else {
            resolved
        };
        let view = Arc::new(view);
        let p: &PeersConfig = &cfg.peers;
        let hedge_after = Duration::from_millis(p.hedge_after_ms);
        let rdma = match resolved {
            transport::Resolved::Tcp => None,
            transport::Resolved::Rdma => {
                let open = nic.map_or_else(|| transport::open_device(p), |f| f());
                rdma_links(open, arena, hedge_after, view.len())
            }
        };
        let idle = Duration::from_millis(p.idle_timeout_ms);
        let mut conn = ConnConfig::new(
            view.job_id(),
            node_id.clone(),
            view.digest().0,
            crate::sys::random_u64(),
            secret,
        );
        conn.initial_credit = p.max_requests;
        conn.protection = if encrypted {
            Protection::Encrypted
        } else {
            Protection::Authenticated
        };
        conn.suite = match p.cipher {
            CipherSetting::Auto => Suite::fastest_here(),
            CipherSetting::Aes256Gcm => Suite::Aes256Gcm,
            CipherSetting::Chacha20Poly1305 => Suite::ChaCha20Poly1305,
        };
        conn.handshake_timeout = Duration::from_millis(p.connect_timeout_ms).as_nanos() as u64;
        conn.idle_timeout = idle.as_nanos() as u64;
        conn.keepalive = (idle / 3).as_nanos() as u64;
        let net = Net::start(
            NetConfig {
                view: Arc::clone(&view),
                me,
                conn,
                connect_timeout: Duration::from_millis(p.connect_timeout_ms),
                redial_after: Duration::from_millis(1000),
                settling: net::SETTLING,
                source: Some(listen.ip()).filter(|ip| !ip.is_unspecified()),
                limits: net::Limits {
                    max_connections: p.max_connections,
                    max_per_address: p.max_connections_per_address,
                    write_timeout: Duration::from_millis(p.write_timeout_ms),
                    block_timeout: Duration::from_millis(p.block_timeout_ms),
                },
                rejected: metrics.rejected.clone(),
            },
            listen,
        )?;
        tracing::info!(
            job = view.job_id(),
            node = %node_id,
            epoch = view.epoch(),
            members = view.len(),
            listen = %net.local_addr(),
            keep_bytes,
            "peer tier started"
        );
        Ok(PeerTier {
            net,
            me,
            align: align.max(1),
            datasets: (0..datasets).map(|_| None).collect(),
            by_fingerprint: HashMap::new(),
            requester: Requester::new(
                RequesterConfig {
                    hedge_after: hedge_after.as_nanos() as u64,
                    // Scheduling hiccups of a busy node must not make a
                    // peer slow: a quarter of the hedge delay, at least 50
                    // ms (a tenth let a 200 ms stall of a node running two
                    // ranks, on a 2-vCPU machine, send a peer's samples to
                    // the store; a peer that answers well within the hedge
                    // delay costs no second read).
                    slow_floor: (hedge_after / 4).max(Duration::from_millis(50)).as_nanos() as u64,
                    ..RequesterConfig::default()
                },
                view.len(),
            ),
            slow: vec![false; view.len()],
            serve: Server::new(ServeConfig {
                max_in_flight: 64,
                per_conn_window: 16,
                max_queued_per_conn: (p.max_requests as usize).max(1) * 2,
                late_grace: Some(hedge_after.as_nanos() as u64),
                max_pinned_bytes_per_conn: p.max_pinned_per_peer.0,
            }),
            serving: HashMap::new(),
            up: vec![false; view.len()],
            transport: resolved,
            rdma,
            rdma_conn: vec![None; view.len()],
            reported: vec![None; view.len()],
            max_pinned: p.max_pinned_per_peer.0,
            log: ratelog::RateLog::new(Duration::from_secs(10)),
            grace: Grace::new(
                GraceConfig {
                    grace: Duration::from_millis(p.owner_grace_ms).as_nanos() as u64,
                    blocked: Duration::from_millis(p.owner_grace_blocked_ms).as_nanos() as u64,
                    ..GraceConfig::default()
                },
                view.len(),
            ),
            view,
        })
    }

    /// The address the peer listener is bound to.
    pub fn listen_addr(&self) -> SocketAddr {
        self.net.local_addr()
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// This agent's index in the view.
    pub fn me(&self) -> usize {
        self.me
    }

    /// What dataset `ds`'s directory is computed from (its source is
    /// ready): its fingerprint, its samples' sizes and each member's
    /// budget. `None` when it has a directory already.
    pub(crate) fn directory_inputs(
        &self,
        ds: usize,
        name: &str,
        src: &dyn SampleSource,
    ) -> Option<directory::Inputs> {
        if self.datasets.get(ds).is_none_or(|d| d.is_some()) {
            return None;
        }
        let fingerprint = fingerprint(name, src);
        let sizes: Vec<u64> = (0..src.len())
            .map(|i| src.meta(i).size.next_multiple_of(self.align))
            .collect();
        // Each dataset gets an equal share of every member's keep area (the
        // same configuration on every agent gives the same shares).
        let shares = self.datasets.len().max(1) as u64;
        let budgets: Vec<u64> = self
            .view
            .members()
            .iter()
            .map(|m| m.capacity / shares)
            .collect();
        Some(directory::Inputs {
            view: Arc::clone(&self.view),
            fingerprint,
            sizes,
            budgets,
        })
    }

    /// Installs dataset `ds`'s directory, computed from
    /// [`directory_inputs`](Self::directory_inputs) for this tier's view.
    pub(crate) fn set_directory(&mut self, ds: usize, fingerprint: u64, dir: Directory) {
        let Some(slot) = self.datasets.get_mut(ds) else {
            return;
        };
        self.by_fingerprint.insert(fingerprint, ds);
        *slot = Some(DatasetPeers {
            fingerprint,
            dir: Arc::new(dir),
        });
    }

    /// Where a sample missing from the arena is read from.
    pub(crate) fn route(&self, ds: usize, sample: u64) -> Route {
        let Some(Some(d)) = self.datasets.get(ds) else {
            return Route::Store;
        };
        let (Some(owner), true) = (d.dir.owner(sample), d.dir.is_kept(sample)) else {
            return Route::Store;
        };
        if owner == self.me {
            Route::Keep
        } else if self.grace.awaits(owner, self.net.nanos()) {
            Route::Wait(owner)
        } else if self.net.reachable(owner) && self.requester.ask(owner, self.net.nanos()) {
            Route::Peer(owner)
        } else {
            Route::Store
        }
    }

    /// Whether this agent keeps sample `sample` of dataset `ds` (owns it
    /// and it is in its keep-set); false while the directory is unknown.
    pub(crate) fn keeps_here(&self, ds: usize, sample: u64) -> bool {
        matches!(self.datasets.get(ds), Some(Some(d))
            if d.dir.owner(sample) == Some(self.me) && d.dir.is_kept(sample))
    }

    /// Dataset `ds`'s directory, once it is computed.
    pub(crate) fn directory(&self, ds: usize) -> Option<&Arc<Directory>> {
        self.datasets.get(ds)?.as_ref().map(|d| &d.dir)
    }

    /// The fingerprint of dataset `ds`, once its directory is computed.
    pub(crate) fn fingerprint_of(&self, ds: usize) -> Option<u64> {
        self.datasets.get(ds)?.as_ref().map(|d| d.fingerprint)
    }

    /// How blocks travel to member `m` now: the RDMA link's own state
    /// when the tier has links.
    pub(crate) fn link(&self, m: usize) -> LinkTransport {
        match &self.rdma {
            Some(links) => links.link(m),
            None => transport::link_transport(self.transport),
        }
    }

    /// Sends our job status to member `m` on the connection up to it, if
    /// any (status never dials); whether it was queued.
    pub(crate) fn send_job_status(
        &self,
        m: usize,
        status: &Arc<granary_peer::status::JobStatus>,
    ) -> bool {
        self.net.send_job_status(m, status)
    }

    /// The id of member `m`.
    pub(crate) fn member_id(&self, m: usize) -> &str {
        &self.view.members()[m].id
    }
}
