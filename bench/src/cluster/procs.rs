//! The child processes of a scenario: a process speaking the line protocol
//! ([`Proc`]) and one node's `granaryd` ([`AgentProc`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use super::netns::Net;
use super::node::parse_line;
use super::Result;

/// A child process speaking the line protocol.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: Receiver<String>,
    pub log: PathBuf,
}

pub fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let start = s.len().saturating_sub(3000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            name: name.into(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
            log,
        })
    }

    pub fn send(&mut self, cmd: &str) -> Result<()> {
        let w = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(w, "{cmd}")
            .and_then(|()| w.flush())
            .map_err(|e| format!("{}: {e}\n{}", self.name, log_tail(&self.log)))
    }

    /// The next line, waiting up to `limit`; an error when the process
    /// ended (with its log's tail).
    pub fn next(&mut self, limit: Duration) -> Result<Option<String>> {
        match self.lines.recv_timeout(limit) {
            Ok(l) => Ok(Some(l)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.died()),
        }
    }

    pub fn try_next(&mut self) -> Result<Option<String>> {
        match self.lines.try_recv() {
            Ok(l) => Ok(Some(l)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.died()),
        }
    }

    pub fn died(&mut self) -> String {
        let st = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        format!("{} ended ({st}); log:\n{}", self.name, log_tail(&self.log))
    }

    /// Waits for a line starting with `verb` (other lines are dropped).
    pub fn expect(&mut self, verb: &str, limit: Duration) -> Result<BTreeMap<String, String>> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(l) = self.next(Duration::from_millis(200))? {
                let (v, kv) = parse_line(&l);
                if v == verb {
                    return Ok(kv);
                }
            }
        }
        Err(format!(
            "{}: no `{verb}` within {limit:?}; log:\n{}",
            self.name,
            log_tail(&self.log)
        ))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL (a lost node's loader).
    pub fn kill9(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn finish(mut self) {
        self.stdin = None;
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) of process `pid` so far; 0 when gone.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    // Fields after the command: state is field 3; utime 14, stime 15.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / clock_ticks()
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// One node's `granaryd`.
pub struct AgentProc {
    pub name: String,
    pub ns: String,
    pub bin: PathBuf,
    pub config: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// CPU seconds of incarnations already killed.
    pub cpu_before: f64,
}

impl AgentProc {
    pub fn start(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Net::exec(&self.ns, &self.bin)
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if granary::Client::connect(&self.sock).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{} exited with {st}:\n{}",
                    self.name,
                    log_tail(&self.log)
                ));
            }
            if Instant::now() > end {
                return Err(format!(
                    "{} did not open its socket in 60 s:\n{}",
                    self.name,
                    log_tail(&self.log)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn cpu(&self) -> f64 {
        self.cpu_before + self.child.as_ref().map_or(0.0, |c| cpu_secs(c.id()))
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.cpu_before += cpu_secs(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for AgentProc {
    /// Kills the agent and removes its warm-restart files (its arena,
    /// index and journal in /dev/shm): the next scenario starts cold.
    fn drop(&mut self) {
        self.kill9();
        granary_agent::warm::Files::for_socket(&self.sock).remove();
    }
}

// ---------------------------------------------------------------- results
