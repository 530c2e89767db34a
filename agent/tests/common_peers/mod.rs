//! Real `granaryd` processes for the multi-node tests: one per node on
//! 127.0.0.2, .3, … with its own configuration, socket, log and metrics
//! address.

use granary::Client;
use granary_agent::metrics::{parse_text, scrape};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on `ip`.
pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `granaryd` of the job.
pub struct Agent {
    pub node: usize,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub sock: PathBuf,
    pub metrics: SocketAddr,
    pub child: Option<Child>,
}

impl Agent {
    pub fn ip(node: usize) -> String {
        format!("127.0.0.{}", node + 2)
    }

    pub fn start(&mut self) {
        let log = std::fs::File::create(self.dir.join(format!("agent{}.log", self.node))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_granaryd"))
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start granaryd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Client::connect(&self.sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "agent {} did not start:\n{}",
                self.node,
                self.log()
            );
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("agent {} exited with {st}:\n{}", self.node, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("agent{}.log", self.node)))
            .unwrap_or_default()
    }

    /// The sum of every series of metric `name` (labels ignored), or of
    /// the series whose labels contain `with`.
    pub fn metric(&self, name: &str, with: &str) -> f64 {
        let body = scrape(self.metrics, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("agent {}: metrics: {e}\n{}", self.node, self.log()));
        parse_text(&body)
            .into_iter()
            .filter(|(k, _)| {
                let base = k.split('{').next().unwrap_or_default();
                base == name && k.contains(with)
            })
            .map(|(_, v)| v)
            .sum()
    }
}

impl Drop for Agent {
    /// Kills the agent and removes its warm-restart files (arena, index,
    /// journal in /dev/shm).
    fn drop(&mut self) {
        self.kill9();
        granary_agent::warm::Files::for_socket(&self.sock).remove();
    }
}
