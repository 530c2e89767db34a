//! The library's error: a stable [`ErrorCode`] plus a detailed message.
//!
//! The code is what crosses the C ABI (`GRANARY_E_*`); the message is what
//! `granary_last_error_message()` returns, e.g. the agent's own words when it
//! refused a session.

use std::fmt;
use std::io;

use granary_shm::arena::ArenaError;
use granary_shm::socket::SocketError;
use granary_shm::{AttachError, ErrorCode, Violation, WaitError};

/// A failed library call: the stable code and a human-readable detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `code` and a detail message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// The stable code (never [`ErrorCode::Ok`] for errors this library builds).
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The detail message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with `context` (`"context: message"`).
    pub(crate) fn context(mut self, context: impl fmt::Display) -> Error {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// A read or write on the agent socket failed.
    pub(crate) fn socket(what: &str, e: &io::Error) -> Error {
        let code = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorCode::Timeout,
            io::ErrorKind::PermissionDenied => ErrorCode::Permission,
            _ => ErrorCode::Disconnected,
        };
        Error::new(code, format!("{what}: {e}"))
    }

    /// Receiving a handshake message failed.
    pub(crate) fn recv(what: &str, e: &SocketError) -> Error {
        let code = match e {
            // A read timeout on a blocking socket reads as WouldBlock.
            SocketError::Io(io) if io.kind() == io::ErrorKind::WouldBlock => ErrorCode::Timeout,
            other => other.code(),
        };
        Error::new(code, format!("{what}: {e}"))
    }

    /// The agent broke the shared-memory contract.
    pub(crate) fn violation(what: impl fmt::Display, v: &Violation) -> Error {
        Error::new(ErrorCode::Corrupt, format!("{what}: {v}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{} ({})", self.message, self.code)
        }
    }
}

impl std::error::Error for Error {}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Error {
        Error::new(code, code.message())
    }
}

impl From<ArenaError> for Error {
    fn from(e: ArenaError) -> Error {
        let code = match &e {
            ArenaError::Os { source, .. } if source.kind() == io::ErrorKind::OutOfMemory => {
                ErrorCode::NoMemory
            }
            ArenaError::Os { .. } => ErrorCode::Internal,
            ArenaError::HugePagesRequired(_) => ErrorCode::NoMemory,
            ArenaError::SizeMismatch { .. }
            | ArenaError::NotSealed { .. }
            | ArenaError::OutOfBounds { .. }
            | ArenaError::InvalidSize
            | ArenaError::LoaderCanWrite(_) => ErrorCode::Protocol,
        };
        Error::new(code, e.to_string())
    }
}

impl From<AttachError> for Error {
    fn from(e: AttachError) -> Error {
        let code = match &e {
            AttachError::BadVersion { .. } => ErrorCode::Version,
            AttachError::Os(io) if io.kind() == io::ErrorKind::OutOfMemory => ErrorCode::NoMemory,
            AttachError::Os(_) => ErrorCode::Internal,
            AttachError::TooShort { .. }
            | AttachError::BadMagic(_)
            | AttachError::Invalid(_)
            | AttachError::StaleEpoch { .. } => ErrorCode::Protocol,
        };
        Error::new(code, e.to_string())
    }
}

impl From<WaitError> for Error {
    fn from(e: WaitError) -> Error {
        match e {
            WaitError::Timeout => Error::from(ErrorCode::Timeout),
            WaitError::Violation(v) => Error::violation("ring", &v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_message_and_code() {
        let e = Error::new(ErrorCode::NotFound, "dataset \"x\" is not served");
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert_eq!(
            e.to_string(),
            "dataset \"x\" is not served (no such dataset or session)"
        );
        let e = e.context("open");
        assert!(e.message().starts_with("open: dataset"));
        assert_eq!(Error::from(ErrorCode::Timeout).message(), "timed out");
    }

    #[test]
    fn socket_errors_map_to_codes() {
        let timeout = io::Error::from(io::ErrorKind::WouldBlock);
        assert_eq!(Error::socket("x", &timeout).code(), ErrorCode::Timeout);
        let gone = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(Error::socket("x", &gone).code(), ErrorCode::Disconnected);
        let e = Error::recv("x", &SocketError::Io(timeout));
        assert_eq!(e.code(), ErrorCode::Timeout);
        assert_eq!(
            Error::recv("x", &SocketError::HungUp).code(),
            ErrorCode::Disconnected
        );
    }
}
