//! A real `granaryd` process for `bench/run attacks`: its configuration
//! written to a file, its log on disk (so its size can be watched), its
//! resident memory from `/proc`, its counters from its metrics endpoint.

use granary_agent::metrics::{parse_text, scrape};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `granaryd` is: `$GRANARY_AGENT_BIN`, else next to (or one folder
/// above) this executable (`target/release/`, and `deps/` for tests).
pub fn find_granaryd() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("GRANARY_AGENT_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = me.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let p = dir.join("granaryd");
        if p.is_file() {
            return Ok(p);
        }
        dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    Err(format!(
        "granaryd not found next to {} (build it: cargo build --release -p granary-agent \
         --bin granaryd, which bench/run does; or set GRANARY_AGENT_BIN)",
        me.display()
    ))
}

/// Resident memory of a process, from `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rss {
    /// `VmRSS`: every resident page (the arena's shared pages included).
    pub total: u64,
    /// `RssAnon`: resident anonymous memory (heaps, stacks).
    pub anon: u64,
}

/// `pid`'s resident memory; zeros when it is gone.
pub fn rss_of(pid: u32) -> Rss {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Rss::default();
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    Rss {
        total: field("VmRSS:"),
        anon: field("RssAnon:"),
    }
}

/// One `granaryd`.
pub struct AgentProc {
    /// Its name in the output (`A`, `B`, …).
    pub name: String,
    /// The configuration file.
    pub config: PathBuf,
    /// Its loader socket.
    pub sock: PathBuf,
    /// Its log (standard error).
    pub log: PathBuf,
    /// Its metrics endpoint.
    pub metrics: SocketAddr,
    child: Option<Child>,
}

impl AgentProc {
    /// Writes `toml` to `dir/NAME.toml` and starts `bin` on it with
    /// `RUST_LOG` as given (the default level when `None`); waits until the
    /// socket answers.
    pub fn start(
        bin: &Path,
        name: &str,
        dir: &Path,
        toml: &str,
        sock: &Path,
        metrics: SocketAddr,
        rust_log: Option<&str>,
    ) -> Result<AgentProc, String> {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, toml).map_err(|e| format!("{}: {e}", config.display()))?;
        let log = dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(sock);
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        match rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut a = AgentProc {
            name: name.to_owned(),
            config,
            sock: sock.to_path_buf(),
            log,
            metrics,
            child: Some(child),
        };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if granary::Client::connect(&a.sock).is_ok() {
                return Ok(a);
            }
            if let Some(Ok(Some(st))) = a.child.as_mut().map(Child::try_wait) {
                return Err(format!("{name} exited with {st}:\n{}", a.log_tail()));
            }
            if Instant::now() > end {
                return Err(format!(
                    "{name} did not open its socket in 60 s:\n{}",
                    a.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Its resident memory now.
    pub fn rss(&self) -> Rss {
        rss_of(self.pid())
    }

    /// Bytes its log holds.
    pub fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Its log from byte `from` on.
    pub fn log_since(&self, from: u64) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[(from as usize).min(text.len())..]).into_owned()
    }

    /// Every series of its metrics, parsed (empty when it does not answer).
    pub fn series(&self) -> Vec<(String, f64)> {
        scrape(self.metrics, Duration::from_secs(5))
            .map(|b| parse_text(&b))
            .unwrap_or_default()
    }

    /// The sum of the series of metric `name` whose labels contain `with`.
    pub fn metric(&self, name: &str, with: &str) -> f64 {
        sum_of(&self.series(), name, with)
    }

    /// Stops it (SIGKILL) and waits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The sum of the series of metric `name` in `series` whose labels
/// contain `with`.
pub fn sum_of(series: &[(String, f64)], name: &str, with: &str) -> f64 {
    series
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(with))
        .map(|(_, v)| v)
        .sum()
}

/// `granary_peer_rejected_total` by reason, from parsed series.
pub fn rejected(series: &[(String, f64)]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (labels, v) in crate::agent::labelled(series, "granary_peer_rejected_total") {
        for pair in labels.split(',') {
            if let Some(("reason", r)) = pair.split_once('=') {
                out.push((r.trim_matches('"').to_owned(), v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// What changed in `granary_peer_rejected_total{reason}` from `before` to
/// `after`, as `reason=n` words (the reasons that moved).
pub fn rejected_delta(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, u64)> {
    let b = rejected(before);
    rejected(after)
        .into_iter()
        .filter_map(|(r, v)| {
            let was = b.iter().find(|(x, _)| *x == r).map_or(0.0, |(_, v)| *v);
            let d = (v - was).max(0.0) as u64;
            (d > 0).then_some((r, d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_by_reason_and_their_change() {
        let before = parse_text(
            "granary_peer_rejected_total{reason=\"handshake\"} 2\n\
             granary_peer_rejected_total{reason=\"record\"} 1\n\
             granary_peer_up{peer=\"b\"} 1\n",
        );
        let after = parse_text(
            "granary_peer_rejected_total{reason=\"handshake\"} 5\n\
             granary_peer_rejected_total{reason=\"record\"} 1\n\
             granary_peer_rejected_total{reason=\"per_address\"} 7\n",
        );
        assert_eq!(
            rejected_delta(&before, &after),
            vec![("handshake".to_owned(), 3), ("per_address".to_owned(), 7)]
        );
        assert_eq!(sum_of(&after, "granary_peer_rejected_total", ""), 13.0);
        assert_eq!(sum_of(&after, "granary_peer_rejected_total", "record"), 1.0);
        let me = rss_of(std::process::id());
        assert!(me.total > 0 && me.anon > 0 && me.anon <= me.total, "{me:?}");
    }
}
