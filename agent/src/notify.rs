//! systemd readiness and watchdog notifications (`sd_notify` protocol).
//!
//! When started by systemd with `Type=notify`, `$NOTIFY_SOCKET` names a Unix
//! datagram socket (a path, or an abstract name starting with `@`). Messages
//! are newline-separated `KEY=VALUE` pairs. Outside systemd every call is a
//! no-op.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A handle on `$NOTIFY_SOCKET`, if the service manager provided one.
#[derive(Debug)]
pub(crate) struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` and `$WATCHDOG_USEC` from the environment.
    pub(crate) fn from_env() -> io::Result<Notifier> {
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us > 0)
            .map(Duration::from_micros);
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(Notifier {
                target: None,
                watchdog,
            });
        };
        let path = path.to_string_lossy().into_owned();
        let addr = match path.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None => SocketAddr::from_pathname(&path)?,
        };
        let sock = UnixDatagram::unbound()?;
        Ok(Notifier {
            target: Some((sock, addr)),
            watchdog,
        })
    }

    /// True when running under a service manager that listens.
    #[cfg(test)]
    pub(crate) fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1` (half the configured watchdog), if enabled.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// Sends raw `KEY=VALUE` lines.
    pub fn send(&self, state: &str) -> io::Result<()> {
        match &self.target {
            Some((sock, addr)) => sock.send_to_addr(state.as_bytes(), addr).map(|_| ()),
            None => Ok(()),
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) -> io::Result<()> {
        self.send(&format!(
            "READY=1\nSTATUS={status}\nMAINPID={}",
            std::process::id()
        ))
    }

    /// `WATCHDOG=1`.
    pub fn watchdog(&self) -> io::Result<()> {
        self.send("WATCHDOG=1")
    }

    /// `STOPPING=1`.
    pub(crate) fn stopping(&self) -> io::Result<()> {
        self.send("STOPPING=1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_ready_to_a_listening_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let addr = SocketAddr::from_pathname(&path).unwrap();
        let n = Notifier {
            target: Some((UnixDatagram::unbound().unwrap(), addr)),
            watchdog: Some(Duration::from_secs(10)),
        };
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(5)));
        n.ready("serving").unwrap();
        let mut buf = [0u8; 256];
        let len = listener.recv(&mut buf).unwrap();
        let msg = std::str::from_utf8(&buf[..len]).unwrap();
        assert!(msg.starts_with("READY=1\nSTATUS=serving"), "{msg}");
    }

    #[test]
    fn disabled_without_socket() {
        let n = Notifier {
            target: None,
            watchdog: None,
        };
        assert!(!n.enabled());
        n.ready("x").unwrap();
    }
}
