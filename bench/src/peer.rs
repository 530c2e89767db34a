//! A benchmark's second process: the same binary, re-executed in a peer role.
//!
//! The parent creates the shared memory and hands its fd to the peer as the
//! peer's standard input (the spawn duplicates it onto fd 0 without
//! close-on-exec, so nothing else is inherited). The peer answers on its
//! standard output, one line per message, each line starting with a word
//! (`ready`, `done`, ...) followed by space-separated fields; its standard
//! error goes to the parent's, for diagnostics.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::{Child, ChildStdout, Command, Stdio};

/// First argument that puts a benchmark binary in its peer role.
pub const PEER_ARG: &str = "--peer";

/// The peer-role arguments (everything after [`PEER_ARG`]) when this process
/// was started as a peer; `None` in the parent.
pub fn peer_args() -> Option<Vec<String>> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some(PEER_ARG) {
        Some(args.collect())
    } else {
        None
    }
}

/// Runs `f` with the shared-memory fd the parent passed (the peer's stdin).
pub fn with_shared_fd<R>(f: impl FnOnce(BorrowedFd<'_>) -> R) -> R {
    let stdin = io::stdin();
    f(stdin.as_fd())
}

/// Sends one message line to the parent.
pub fn say(words: &[&str]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{}", words.join(" "))?;
    out.flush()
}

/// A running peer process.
pub struct Peer {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts the current executable as a peer with `args`, giving it
    /// `shared` as its stdin.
    pub fn spawn(shared: OwnedFd, args: &[String]) -> io::Result<Peer> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg(PEER_ARG)
            .args(args)
            .stdin(Stdio::from(shared))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("peer stdout was not captured"))?;
        Ok(Peer {
            child,
            lines: BufReader::new(stdout),
        })
    }

    /// Reads the peer's next line and checks that it starts with `word`;
    /// returns the fields after it.
    pub fn expect(&mut self, word: &str) -> io::Result<Vec<String>> {
        let mut line = String::new();
        if self.lines.read_line(&mut line)? == 0 {
            let status = self.child.wait()?;
            return Err(io::Error::other(format!(
                "peer exited ({status}) while the parent expected `{word}`"
            )));
        }
        let mut fields = line.split_ascii_whitespace().map(str::to_owned);
        match fields.next() {
            Some(w) if w == word => Ok(fields.collect()),
            _ => Err(io::Error::other(format!(
                "peer said `{}`, expected `{word}`",
                line.trim_end()
            ))),
        }
    }

    /// Waits for the peer to exit and checks it succeeded.
    pub fn finish(mut self) -> io::Result<()> {
        let status = self.child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("peer failed: {status}")))
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A peer still running here means the parent bailed out early: stop
        // it rather than leave it waiting on a ring nobody feeds.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
