//! `[metrics]`: the Prometheus endpoint.

use serde::Deserialize;
use std::net::SocketAddr;

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
    /// address does not parse, which [`Config::validate`](super::Config::validate) reports).
    pub(crate) fn socket_addr(&self) -> Option<SocketAddr> {
        if self.address.is_empty() {
            None
        } else {
            self.address.parse().ok()
        }
    }
}
