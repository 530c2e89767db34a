//! Connecting to an agent's socket: one connection per session (a leaf:
//! the client, a session and its resume all dial through here).

use std::path::Path;

use granary_shm::socket::SeqPacket;
use granary_shm::ErrorCode;

use crate::error::{Error, Result};

/// A new connection to the agent listening at `path`.
pub(crate) fn dial(path: &Path) -> Result<SeqPacket> {
    if path.as_os_str().is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            "socket path is empty",
        ));
    }
    SeqPacket::connect(path).map_err(|e| {
        Error::socket(
            &format!("connecting to the agent at {}", path.display()),
            &e,
        )
    })
}
