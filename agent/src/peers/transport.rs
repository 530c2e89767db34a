//! `peers.transport`: which transport carries blocks between peers, and
//! how each peer's link is reported (`granary status`, the
//! `granary_peer_transport` metric).
//!
//! `"auto"` probes for an RDMA device through `granary_rdma::real` when the
//! agent is built with its `rdma` feature; without the feature there is
//! never a device, and the default build does not link libibverbs.
//! See `docs/rdma.md`.

use crate::config::TransportSetting;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// What the setting resolved to on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// TCP for every peer.
    Tcp,
    /// RDMA where a peer has it, TCP for the control connection.
    Rdma,
}

/// How blocks travel to one peer, as `granary status` and the
/// `granary_peer_transport` metric show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkTransport {
    /// Over the peer's TCP connection.
    Tcp,
    /// RDMA writes into the requester's arena.
    Rdma,
    /// RDMA was wanted but TCP carries the blocks (RDMA is down or not
    /// available to this peer).
    RdmaFallback,
}

impl LinkTransport {
    /// Every value, in the order the metric lists them.
    pub const ALL: [LinkTransport; 3] = [
        LinkTransport::Tcp,
        LinkTransport::Rdma,
        LinkTransport::RdmaFallback,
    ];

    /// The name shown by `granary status` and used as the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkTransport::Tcp => "tcp",
            LinkTransport::Rdma => "rdma",
            LinkTransport::RdmaFallback => "rdma-fallback",
        }
    }
}

impl fmt::Display for LinkTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why `peers.transport` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// `"rdma"` and no device was found.
    NoDevice {
        /// Whether the agent was built with the `rdma` feature.
        built_with_rdma: bool,
        /// What the probe said, when it failed rather than finding none.
        probe_error: Option<String>,
    },
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::NoDevice {
                built_with_rdma: false,
                ..
            } => f.write_str(
                "is \"rdma\" but this granaryd was built without the `rdma` feature, so it \
                 has no RDMA device; use \"auto\" or \"tcp\", or build with --features rdma",
            ),
            TransportError::NoDevice {
                built_with_rdma: true,
                probe_error: Some(e),
            } => write!(
                f,
                "is \"rdma\" but probing for RDMA devices failed ({e}); use \"auto\" or \"tcp\""
            ),
            TransportError::NoDevice {
                built_with_rdma: true,
                probe_error: None,
            } => f.write_str(
                "is \"rdma\" but this host has no RDMA device (ibv_devices lists none); \
                 use \"auto\" or \"tcp\"",
            ),
        }
    }
}

impl std::error::Error for TransportError {}

/// What a device probe found: device names, or why it could not look.
pub type ProbeResult = Result<Vec<String>, String>;

/// Whether this agent was built with the `rdma` feature (which is
/// granary-rdma's: [`granary_rdma::device`]).
pub const BUILT_WITH_RDMA: bool = granary_rdma::device::BUILT_WITH_RDMA;

/// The RDMA devices of this host. Without the `rdma` feature: none.
pub fn probe_devices() -> ProbeResult {
    granary_rdma::device::probe()
}

/// Resolves `setting` against what the probe found (pure: the probe is
/// passed in). A failed probe counts as no device.
pub fn resolve(
    setting: TransportSetting,
    built_with_rdma: bool,
    probe: &ProbeResult,
) -> Result<Resolved, TransportError> {
    let has_device = built_with_rdma && probe.as_ref().is_ok_and(|d| !d.is_empty());
    match setting {
        TransportSetting::Tcp => Ok(Resolved::Tcp),
        TransportSetting::Auto if has_device => Ok(Resolved::Rdma),
        TransportSetting::Auto => Ok(Resolved::Tcp),
        TransportSetting::Rdma if has_device => Ok(Resolved::Rdma),
        TransportSetting::Rdma => Err(TransportError::NoDevice {
            built_with_rdma,
            probe_error: probe.as_ref().err().cloned().filter(|_| built_with_rdma),
        }),
    }
}

/// Set once the "peers use TCP" line has been logged.
static SAID_TCP: AtomicBool = AtomicBool::new(false);

/// Resolves the setting on this host and says once in the log what it
/// chose when `"auto"` found no device.
pub fn resolve_here(setting: TransportSetting) -> Result<Resolved, TransportError> {
    let probe = probe_devices();
    let r = resolve(setting, BUILT_WITH_RDMA, &probe)?;
    if setting == TransportSetting::Auto
        && r == Resolved::Tcp
        && !SAID_TCP.swap(true, Ordering::Relaxed)
    {
        let why = match (&probe, BUILT_WITH_RDMA) {
            (_, false) => "built without the rdma feature".to_string(),
            (Err(e), true) => format!("RDMA device probe failed: {e}"),
            (Ok(_), true) => "no RDMA device found".to_string(),
        };
        tracing::info!("peers.transport = \"auto\": {why}; peers use TCP");
    }
    if r == Resolved::Rdma {
        if let Ok(devices) = &probe {
            tracing::info!(?devices, "peers.transport resolved to RDMA");
        }
    }
    Ok(r)
}

/// A verbs backend the peer tier's RDMA links run over.
pub(crate) type Nic = Box<dyn granary_rdma::Verbs + Send>;

/// Opens the backend when the tier starts: [`open_device`] on a host
/// whose `peers.transport` resolved to RDMA, the fake NIC in tests.
pub(crate) type OpenNic = std::sync::Arc<dyn Fn() -> Result<Nic, String> + Send + Sync>;

/// The device `peers.rdma_device` (the first one when empty), port
/// `peers.rdma_port`, GID index `peers.rdma_gid_index`. Without the `rdma`
/// feature there is none.
pub(crate) fn open_device(cfg: &crate::config::PeersConfig) -> Result<Nic, String> {
    let device = Some(cfg.rdma_device.as_str()).filter(|d| !d.is_empty());
    granary_rdma::device::open(device, cfg.rdma_port, cfg.rdma_gid_index)
}

/// How blocks travel to a peer when the agent's transport resolved to
/// `resolved` and the tier has no RDMA links (the device could not be
/// opened): a link that wanted RDMA is reported as falling back. With
/// links, each link's own state is reported (`RdmaLinks::link`).
pub fn link_transport(resolved: Resolved) -> LinkTransport {
    match resolved {
        Resolved::Tcp => LinkTransport::Tcp,
        Resolved::Rdma => LinkTransport::RdmaFallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(n: &[&str]) -> ProbeResult {
        Ok(n.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn auto_picks_rdma_only_with_a_device_and_the_feature() {
        use TransportSetting::*;
        assert_eq!(resolve(Auto, true, &devs(&["mlx5_0"])), Ok(Resolved::Rdma));
        assert_eq!(resolve(Auto, true, &devs(&[])), Ok(Resolved::Tcp));
        assert_eq!(resolve(Auto, false, &devs(&["mlx5_0"])), Ok(Resolved::Tcp));
        assert_eq!(
            resolve(Auto, true, &Err("ENOMEM".into())),
            Ok(Resolved::Tcp)
        );
        assert_eq!(resolve(Tcp, true, &devs(&["mlx5_0"])), Ok(Resolved::Tcp));
        assert_eq!(resolve(Rdma, true, &devs(&["mlx5_0"])), Ok(Resolved::Rdma));
    }

    #[test]
    fn rdma_without_a_device_is_a_clear_error() {
        let e = resolve(TransportSetting::Rdma, true, &devs(&[])).unwrap_err();
        assert!(e.to_string().contains("no RDMA device"), "{e}");
        let e = resolve(TransportSetting::Rdma, false, &devs(&["mlx5_0"])).unwrap_err();
        assert!(e.to_string().contains("without the `rdma` feature"), "{e}");
        let e = resolve(TransportSetting::Rdma, true, &Err("EPERM".into())).unwrap_err();
        assert!(e.to_string().contains("EPERM"), "{e}");
    }

    #[test]
    fn this_build_probes_as_its_feature_says() {
        let probe = probe_devices();
        if !BUILT_WITH_RDMA {
            assert_eq!(probe, Ok(Vec::new()), "no device without the feature");
            assert!(resolve_here(TransportSetting::Rdma).is_err());
        }
        assert_eq!(
            resolve_here(TransportSetting::Tcp),
            Ok(Resolved::Tcp),
            "tcp never probes its way to RDMA"
        );
    }

    /// The default build does not link libibverbs, the `rdma` build does:
    /// the loader maps every library a binary needs, and this test binary
    /// links the whole agent library.
    #[test]
    fn libibverbs_is_loaded_only_with_the_rdma_feature() {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("own memory map");
        let libs: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.contains(".so"))
            .collect();
        assert!(
            libs.iter().any(|l| l.contains("libc.so")),
            "the check sees shared libraries: {libs:?}"
        );
        let verbs = libs.iter().any(|l| l.contains("libibverbs"));
        assert_eq!(verbs, BUILT_WITH_RDMA, "libibverbs loaded: {libs:?}");
    }

    #[test]
    fn links_are_named_for_status() {
        let names: Vec<_> = LinkTransport::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, ["tcp", "rdma", "rdma-fallback"]);
        assert_eq!(link_transport(Resolved::Tcp), LinkTransport::Tcp);
        assert_eq!(link_transport(Resolved::Rdma), LinkTransport::RdmaFallback);
    }
}
