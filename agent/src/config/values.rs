//! Values that several kinds of `[[dataset]]` share (`dataset.rs` and
//! `cloud.rs` both use them; this file uses neither).

use serde::Deserialize;
use std::fmt;

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

/// A credential read from the configuration: printed as `<redacted>` by
/// `Debug`, so logging a config never leaks it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that must use it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
