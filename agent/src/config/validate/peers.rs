//! The rules of `[peers]`, and of DNS membership's settings.

use super::Problems;
use crate::config::Config;
use std::collections::HashSet;
use std::net::SocketAddr;

/// The longest `peers.owner_grace_ms` and `owner_grace_blocked_ms`: ten
/// minutes.
const MAX_OWNER_GRACE_MS: u64 = 600_000;

impl Config {
    pub(super) fn validate_peers(&self, p: &mut Problems) {
        use crate::config::{Membership, MembershipSetting};
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
            } else if let Err(e) = crate::config::peer_secret::check(s.expose().as_bytes()) {
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
        if c.transport == crate::config::TransportSetting::Rdma
            && c.encryption == crate::config::Encryption::On
        {
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
        if c.handin_bytes_per_uid.bytes() < crate::config::peers::MIN_HANDIN_BYTES_PER_UID {
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
        use crate::config::peers::MAX_DNS_NAME;
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
}
