//! `[socket]`: the Unix socket loaders connect to, and who may connect.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::path::PathBuf;

/// Longest socket path, in bytes (`sun_path` holds 108 bytes including the NUL).
pub(crate) const MAX_SOCKET_PATH_BYTES: usize = 107;

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
    /// `socket.allowed_gids`: group ids whose members (the connecting
    /// process's primary group or one of its supplementary groups) may open
    /// sessions. Default empty.
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
    pub(crate) fn allows(&self, agent_uid: u32, peer_uid: u32, peer_gid: u32) -> bool {
        peer_uid == agent_uid
            || self.allowed_uids.contains(&peer_uid)
            || self.allowed_gids.contains(&peer_gid)
    }

    /// Whether one of a peer's supplementary groups is in `allowed_gids`.
    pub fn allows_any_group(&self, peer_groups: &[u32]) -> bool {
        peer_groups.iter().any(|g| self.allowed_gids.contains(g))
    }
}

/// Unix permission bits (at most `0o777`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(pub u32);

impl FileMode {
    /// The permission bits.
    pub(crate) fn bits(self) -> u32 {
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
