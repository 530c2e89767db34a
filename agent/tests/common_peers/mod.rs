//! Real `granaryd` processes for the multi-node tests: one per node on
//! 127.0.0.2, .3, … with its own configuration, socket, log and metrics
//! address.

use granary::{encode_view, Client, ViewMember};
use granary_agent::metrics::{parse_text, scrape};
use granary_testkit::agent_toml;
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    pub child: Option<GranarydProcess>,
}

impl Agent {
    pub fn ip(node: usize) -> String {
        format!("127.0.0.{}", node + 2)
    }

    /// Node `node`'s agent under `root/node{node}`, not started: its
    /// socket, a metrics address on its own IP, and its configuration, the
    /// shared head (`arena`, `prefetch`: [`agent_toml::head`]) followed by
    /// `tables` (`[peers]`, `[[dataset]]`).
    // `warm_restart` writes its one agent's configuration itself.
    #[allow(dead_code)]
    pub fn new(root: &Path, node: usize, arena: &str, prefetch: &str, tables: &str) -> Agent {
        let ip = Agent::ip(node);
        let dir = root.join(format!("node{node}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("granary.sock");
        let metrics: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
        let toml = agent_toml::head(arena, &sock, prefetch, &metrics.to_string()) + tables;
        let config = dir.join("granaryd.toml");
        std::fs::write(&config, toml).unwrap();
        Agent {
            node,
            dir,
            config,
            sock,
            metrics,
            child: None,
        }
    }

    pub fn start(&mut self) {
        let log = self.dir.join(format!("agent{}.log", self.node));
        let sock = self.sock.clone();
        let started = GranarydProcess::spawn(
            GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &self.config)
                .env("RUST_LOG", "info")
                .log(Log::File(log))
                .ready_when(move || Client::connect(&sock).is_ok()),
        );
        match started {
            Ok(p) => self.child = Some(p),
            Err(e) => panic!("agent {}: {e}", self.node),
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
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

/// The peer identity of the agent at `sock`, asked as a job's rank asks.
#[allow(dead_code)]
pub fn identity(sock: &Path) -> granary::PeerIdentity {
    Client::connect(sock)
        .unwrap()
        .peer_identity(Duration::from_secs(10))
        .unwrap()
}

/// The view member an agent's identity `id` describes.
#[allow(dead_code)]
pub fn member(id: granary::PeerIdentity) -> ViewMember {
    ViewMember {
        id: id.node_id,
        addr: id.addr,
        capacity: id.capacity,
    }
}

/// Gathers every agent's peer identity into view `name` (epoch 1), as the
/// Python integration does, and hands it in to each: the view and its
/// members' node ids, in the agents' order.
#[allow(dead_code)]
pub fn hand_in_view(agents: &[Agent], name: &str) -> (Vec<u8>, Vec<String>) {
    let members: Vec<ViewMember> = agents.iter().map(|a| member(identity(&a.sock))).collect();
    let view = encode_view(name, 1, &members).unwrap();
    for a in agents {
        Client::connect(&a.sock)
            .unwrap()
            .join_view(&view, Duration::from_secs(10))
            .unwrap();
    }
    (view, members.into_iter().map(|m| m.id).collect())
}

/// `nodes` agents with `membership = "session"` over one files dataset
/// `data` (a synthetic set of `files` samples in `classes` classes), each
/// with an arena of `arena` and `prefetch` keys, started, their view
/// (`view_name`) handed in.
#[allow(dead_code)]
pub struct SessionJob {
    pub _tmp: tempfile::TempDir,
    pub spec: granary_tools::synth::SynthSpec,
    pub agents: Vec<Agent>,
    pub view: Vec<u8>,
    pub node_ids: Vec<String>,
}

#[allow(dead_code)]
impl SessionJob {
    pub fn start(
        nodes: usize,
        files: u64,
        classes: u32,
        arena: &str,
        prefetch: &str,
        view_name: &str,
    ) -> SessionJob {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let spec = granary_testkit::dataset::synth_at(&data, files, classes, 1_500);
        let mut agents = Vec::new();
        for node in 0..nodes {
            let ip = Agent::ip(node);
            let listen = format!("{ip}:{}", free_port(&ip));
            let tables = format!(
                "[peers]\nmembership = \"session\"\nnode_id = \"n{node}\"\nlisten = \"{listen}\"\n\
                 secret = \"{}\"\n",
                agent_toml::TEST_SECRET
            ) + &agent_toml::fs_dataset("data", &data, "");
            agents.push(Agent::new(tmp.path(), node, arena, prefetch, &tables));
        }
        for a in &mut agents {
            a.start();
        }
        let (view, node_ids) = hand_in_view(&agents, view_name);
        SessionJob {
            _tmp: tmp,
            spec,
            agents,
            view,
            node_ids,
        }
    }
}
