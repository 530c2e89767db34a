//! `granaryd` as a child process of a test: the one way tests start the
//! real binary. [`GranarydConfig`] says how (the binary, the subcommand and
//! its configuration file, a launcher in front such as `systemd-run` or
//! `unshare`, the environment, where its output goes, and when it counts
//! as ready); [`GranarydProcess::spawn`] starts it and waits until it is
//! ready or has exited; the process is killed (SIGKILL) and reaped on drop.
//!
//! The binary's path comes from the test: `env!("CARGO_BIN_EXE_granaryd")`,
//! which cargo sets only when compiling the agent's own integration tests.

use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Where the process's stderr goes.
#[derive(Debug, Clone)]
pub enum Log {
    /// Discarded.
    Null,
    /// Written to this file (created, truncated).
    File(PathBuf),
    /// A pipe, read by [`GranarydProcess::take_stderr`] (or by
    /// [`GranarydProcess::spawn`] when the process exits early).
    Piped,
}

/// A readiness probe: true once the process serves.
pub type Probe = Box<dyn FnMut() -> bool>;

/// How to run `granaryd`.
pub struct GranarydConfig {
    bin: PathBuf,
    launcher: Vec<OsString>,
    global: Vec<OsString>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: Log,
    ready: Option<Probe>,
    timeout: Duration,
}

impl GranarydConfig {
    /// `bin run --config CONFIG` (`bin` is `env!("CARGO_BIN_EXE_granaryd")`).
    /// By default: no `RUST_LOG` nor `GRANARY_LOG_FORMAT` from the test's
    /// environment, stdin and stdout null, stderr discarded, ready as soon
    /// as it is spawned, 60 s to become ready.
    pub fn run(bin: impl AsRef<Path>, config: impl AsRef<Path>) -> GranarydConfig {
        GranarydConfig::args(bin, ["run", "--config"]).arg(config.as_ref())
    }

    /// `bin ARGS…`: any other command line (`validate`, `--help`, …).
    pub fn args<I, S>(bin: impl AsRef<Path>, args: I) -> GranarydConfig
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        GranarydConfig {
            bin: bin.as_ref().to_owned(),
            launcher: Vec::new(),
            global: Vec::new(),
            args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            log: Log::Null,
            ready: None,
            timeout: Duration::from_secs(60),
        }
    }

    /// One more argument at the end (a path, say).
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Options before the subcommand (`--log-format json`).
    pub fn global_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.global
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// A program and its arguments that run `granaryd` (`systemd-run -p …`,
    /// `unshare -m …`): the binary and its arguments follow them.
    pub fn launcher<I, S>(mut self, prog_and_args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.launcher = prog_and_args
            .into_iter()
            .map(|a| a.as_ref().to_owned())
            .collect();
        self
    }

    /// An environment variable for the process (`RUST_LOG`, …).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Where stderr goes.
    pub fn log(mut self, log: Log) -> Self {
        self.log = log;
        self
    }

    /// Ready once `probe` returns true (polled every 20 ms); e.g. a client
    /// connects to the socket, or the metrics endpoint answers.
    pub fn ready_when(mut self, probe: impl FnMut() -> bool + 'static) -> Self {
        self.ready = Some(Box::new(probe));
        self
    }

    /// Ready once `sock` exists (it does from bind(2) on).
    pub fn ready_on_socket_file(self, sock: impl AsRef<Path>) -> Self {
        let sock = sock.as_ref().to_owned();
        self.ready_when(move || sock.exists())
    }

    /// How long it may take to become ready (60 s by default).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The command line, environment and stdio as configured.
    pub fn command(&self) -> Command {
        let mut cmd = match self.launcher.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.args(&self.global)
            .args(&self.args)
            .env_remove("GRANARY_LOG_FORMAT")
            .env_remove("RUST_LOG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the command to its end and returns its output (for `validate`,
    /// `--help`, a launcher that returns at once).
    pub fn output(&self) -> Output {
        self.command()
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.bin.display()))
    }
}

/// A running `granaryd`, killed (SIGKILL) and reaped on drop.
pub struct GranarydProcess {
    child: Option<Child>,
    log: Log,
}

impl GranarydProcess {
    /// Starts `config` and waits until its probe says ready. `Err` with
    /// its exit status and log when it exits first; panics when it is not
    /// ready within the timeout.
    pub fn spawn(mut config: GranarydConfig) -> Result<GranarydProcess, String> {
        let mut cmd = config.command();
        cmd.stdout(Stdio::null());
        match &config.log {
            Log::Null => cmd.stderr(Stdio::null()),
            Log::File(p) => cmd.stderr(
                std::fs::File::create(p)
                    .unwrap_or_else(|e| panic!("create the log {}: {e}", p.display())),
            ),
            Log::Piped => cmd.stderr(Stdio::piped()),
        };
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", config.bin.display()));
        let mut p = GranarydProcess {
            child: Some(child),
            log: config.log.clone(),
        };
        let Some(mut ready) = config.ready.take() else {
            return Ok(p);
        };
        let t0 = Instant::now();
        loop {
            if let Some(status) = p.try_wait() {
                let log = p.log_text();
                p.child = None;
                return Err(format!("granaryd exited ({status}): {}", log.trim()));
            }
            if ready() {
                return Ok(p);
            }
            assert!(
                t0.elapsed() < config.timeout,
                "granaryd was not ready within {:?}: {}",
                config.timeout,
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`GranarydProcess::spawn`], panicking with the log when the process
    /// exits before it is ready.
    pub fn start(config: GranarydConfig) -> GranarydProcess {
        GranarydProcess::spawn(config).unwrap_or_else(|e| panic!("{e}"))
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("granaryd was already reaped")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("granaryd was already reaped")
            .id()
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child().try_wait().expect("poll granaryd")
    }

    /// Sends signal `name` (`TERM`, `STOP`, `CONT`, …) with kill(1).
    pub fn signal(&self, name: &str) {
        let mut kill = Command::new("kill");
        kill.arg("-s").arg(name).arg(self.pid().to_string());
        run_ok(&mut kill, &format!("kill -s {name}"));
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child().wait().expect("reap granaryd");
        status
    }

    /// SIGTERM, then waits: the status of a graceful stop.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait()
    }

    /// SIGKILL and reap now (also what dropping does).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The whole of a piped stderr (after the process has exited, or it
    /// blocks until then).
    pub fn take_stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child().stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// The log so far: the log file's text, or a piped stderr's (only
    /// once the process has exited), or nothing.
    pub fn log_text(&mut self) -> String {
        match self.log.clone() {
            Log::File(p) => std::fs::read_to_string(p).unwrap_or_default(),
            Log::Piped
                if self
                    .child
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_)))) =>
            {
                self.take_stderr()
            }
            _ => String::new(),
        }
    }
}

impl Drop for GranarydProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A finished process's stdout followed by its stderr, as text: what a
/// test of a command line's messages reads.
pub fn output_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs `cmd` to its end and returns its stdout as text. Not starting, an
/// unsuccessful exit (its stderr is in the message) and output that is not
/// UTF-8 panic, naming `what`.
#[track_caller]
pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{what}: output not UTF-8: {e}"))
}

/// Asserts that `out`, a `--version` run of the binary `name`, succeeded
/// and printed `name` then `version`.
#[track_caller]
pub fn assert_version(out: &Output, name: &str, version: &str) {
    assert!(out.status.success(), "{}", output_text(out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{name} {version}")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh` stands in for the binary: the command line, the launcher,
    /// the environment and the early-exit report.
    #[test]
    fn the_command_line_launcher_environment_and_an_early_exit() {
        let c = GranarydConfig::run("/bin/granaryd", "/x/g.toml")
            .global_args(["--log-format", "json"])
            .launcher(["systemd-run", "--collect"])
            .env("RUST_LOG", "warn");
        let cmd = c.command();
        assert_eq!(cmd.get_program(), "systemd-run");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(
            args,
            [
                "--collect",
                "/bin/granaryd",
                "--log-format",
                "json",
                "run",
                "--config",
                "/x/g.toml"
            ]
        );
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&(OsStr::new("RUST_LOG"), Some(OsStr::new("warn")))));
        assert!(envs.contains(&(OsStr::new("GRANARY_LOG_FORMAT"), None)));

        let out = GranarydConfig::args("/bin/sh", ["-c", "echo out; exit 3"]).output();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");

        let early = GranarydConfig::args("/bin/sh", ["-c", "echo refused >&2; exit 1"])
            .log(Log::Piped)
            .ready_when(|| false);
        let err = GranarydProcess::spawn(early).err().expect("an early exit");
        assert!(
            err.contains("exit status: 1") && err.contains("refused"),
            "{err}"
        );

        let flag = std::env::temp_dir().join(format!("granary-testkit-{}", std::process::id()));
        let _ = std::fs::remove_file(&flag);
        let script = format!(
            "trap 'exit 0' TERM; touch {}; while :; do sleep 0.05; done",
            flag.display()
        );
        let mut p = GranarydProcess::start(
            GranarydConfig::args("/bin/sh", ["-c", &script]).ready_on_socket_file(&flag),
        );
        let _ = std::fs::remove_file(&flag);
        assert!(p.try_wait().is_none());
        assert!(p.stop().success());
    }
}
