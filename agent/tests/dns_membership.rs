//! `peers.membership = "dns"` with real `granaryd` processes
//! (`docs/kubernetes.md`, "Membership from DNS"):
//!
//! * one agent whose name is `localhost` (from `/etc/hosts`, no root):
//!   its resolver hands it the one-member view of its own address, a
//!   loader's view is refused naming `peers.dns_name`, and an epoch is read;
//! * three agents on 127.0.0.2–4 whose name is answered by a DNS responder
//!   the test runs (`common_dns`), each agent in a mount namespace of its own
//!   where that responder is `/etc/resolv.conf`'s nameserver (needs root):
//!   two agents find each other, a third joins when its address is added to
//!   the records, the three read one epoch sharing their arenas (each
//!   sample read from the store once), and when the third leaves the
//!   records the other two go back to the view of two; when the name has
//!   no record left, they keep that view and say why once.

mod common;
mod common_dns;

use common::{next_or_end, verify, watchdog_fn};
use common_dns::DnsStub;
use granary::{
    encode_view, Client, ErrorCode, MembershipMode, PeerIdentity, SessionOptions, ViewMember,
};
use granary_agent::metrics::{parse_text, scrape};
use granary_testkit::agent_toml::{fs_dataset, head, PEER_PREFETCH, TEST_SECRET as SECRET};
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use granary_tools::synth::SynthSpec;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAME: &str = "granary-peers.granary.svc.cluster.local";
const FILES: u64 = 240;
const BATCH: u32 = 8;

fn free_port(ip: &str) -> u16 {
    TcpListener::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A port free on every one of `ips` (each agent listens on its own
/// address, all on one `peers.port`).
fn port_free_on(ips: &[String]) -> u16 {
    for _ in 0..100 {
        let p = free_port(&ips[0]);
        if ips
            .iter()
            .all(|ip| TcpListener::bind(format!("{ip}:{p}")).is_ok())
        {
            return p;
        }
    }
    panic!("no port free on all of {ips:?}");
}

fn dataset(dir: &Path) -> SynthSpec {
    granary_testkit::dataset::synth_at(&dir.join("data"), FILES, 4, 16 * 1024)
}

/// One `granaryd` with `membership = "dns"`.
struct DnsAgent {
    ip: String,
    dir: PathBuf,
    config: PathBuf,
    sock: PathBuf,
    metrics: SocketAddr,
    child: Option<GranarydProcess>,
}

impl DnsAgent {
    fn new(root: &Path, ip: &str, name: &str, port: u16, data: &Path) -> DnsAgent {
        let dir = root.join(format!("agent-{ip}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("granary.sock");
        let metrics: SocketAddr = format!("{ip}:{}", free_port(ip)).parse().unwrap();
        let peers = format!(
            "[peers]\nmembership = \"dns\"\ndns_name = \"{name}\"\ndns_refresh_ms = 200\n\
             port = {port}\nlisten = \"{ip}:{port}\"\nsecret = \"{SECRET}\"\nhedge_after_ms = 20000\n"
        );
        let toml = head("64MiB", &sock, PEER_PREFETCH, &metrics.to_string())
            + &peers
            + &fs_dataset("data", data, "");
        let config = dir.join("granaryd.toml");
        std::fs::write(&config, toml).unwrap();
        DnsAgent {
            ip: ip.to_string(),
            dir,
            config,
            sock,
            metrics,
            child: None,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// Starts `granaryd run` through `launcher` (the program and its
    /// arguments before granaryd's), and waits for its socket.
    fn start(&mut self, launcher: &[String]) {
        let sock = self.sock.clone();
        let started = GranarydProcess::spawn(
            GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), &self.config)
                .launcher(launcher)
                .env("RUST_LOG", "info")
                .log(Log::File(self.dir.join("agent.log")))
                .timeout(Duration::from_secs(90))
                .ready_when(move || Client::connect(&sock).is_ok()),
        );
        match started {
            Ok(p) => self.child = Some(p),
            Err(e) => panic!("agent {}: {e}", self.ip),
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    fn identity(&self) -> PeerIdentity {
        Client::connect(&self.sock)
            .unwrap()
            .peer_identity(Duration::from_secs(10))
            .unwrap()
    }

    /// The sum of the series of `name` whose labels contain `with`.
    fn metric(&self, name: &str, with: &str) -> f64 {
        let body = scrape(self.metrics, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("agent {}: metrics: {e}\n{}", self.ip, self.log()));
        parse_text(&body)
            .into_iter()
            .filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(with))
            .map(|(_, v)| v)
            .sum()
    }
}

impl Drop for DnsAgent {
    fn drop(&mut self) {
        self.stop();
        granary_agent::warm::Files::for_socket(&self.sock).remove();
    }
}

/// Waits until every agent of `agents` holds a view of `members` members,
/// the same one; returns its digest.
fn converged(agents: &[&DnsAgent], members: u32) -> [u8; 32] {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids: Vec<PeerIdentity> = agents.iter().map(|a| a.identity()).collect();
        if ids.iter().all(|i| i.members == members)
            && ids.iter().all(|i| i.view_digest == ids[0].view_digest)
        {
            return ids[0].view_digest;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
            panic!(
                "no common view of {members} members: {:?}\n{}",
                ids.iter()
                    .map(|i| (&i.node_id, &i.job_id, i.members))
                    .collect::<Vec<_>>(),
                logs.join("\n----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Rank `rank` of `world` reading epoch 0 through `sock`: the ids it got,
/// each verified byte for byte.
fn read_epoch(sock: &Path, spec: &SynthSpec, rank: u32, world: u32) -> Vec<u64> {
    let client = Client::connect(sock).unwrap();
    let mut o = SessionOptions::new("data");
    o.seed = 3;
    o.rank = rank;
    o.world_size = world;
    o.batch_size = BATCH;
    o.epoch_count = 1;
    let mut s = client.open_session(&o).unwrap();
    let mut ids = Vec::new();
    while let Some(b) = next_or_end(&mut s, Duration::from_secs(60), &format!("rank {rank}")) {
        for smp in b.samples() {
            verify(spec, &smp);
            ids.push(smp.id());
        }
        let end = b.is_end_of_epoch();
        s.release(b).unwrap();
        if end {
            break;
        }
    }
    let _ = s.close();
    ids
}

#[test]
fn an_agent_named_localhost_takes_its_own_view_and_refuses_loaders_views() {
    let _w = watchdog_fn!(300);
    let tmp = tempfile::tempdir().unwrap();
    let spec = dataset(tmp.path());
    let port = free_port("127.0.0.1");
    let mut a = DnsAgent::new(tmp.path(), "127.0.0.1", "localhost", port, &spec.root);
    a.start(&[]);
    converged(&[&a], 1);
    let me = a.identity();
    assert_eq!(
        me.membership,
        MembershipMode::Dns,
        "a loader is told where the view comes from"
    );
    assert_eq!(me.node_id, "127.0.0.1");
    assert!(me.job_id.starts_with("localhost@"), "{}", me.job_id);
    assert_eq!(me.view_epoch, 0);
    assert_eq!(
        a.metric("granary_peer_views_total", "outcome=\"installed\""),
        1.0
    );
    // A loader's view (even one of the same member) is refused, naming DNS.
    let view = encode_view(
        "job",
        1,
        &[ViewMember {
            id: me.node_id.clone(),
            addr: me.addr.clone(),
            capacity: me.capacity,
        }],
    )
    .unwrap();
    let e = Client::connect(&a.sock)
        .unwrap()
        .join_view(&view, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("peers.dns_name"), "{e}");
    assert_eq!(a.identity().view_digest, me.view_digest, "the view stays");
    // The probes' paths: ready (the engine serves) and live.
    for path in ["/ready", "/live"] {
        let mut s = std::net::TcpStream::connect(a.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::io::Write::write_all(&mut s, format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut resp = String::new();
        std::io::Read::read_to_string(&mut s, &mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp}");
    }
    // The loader reads its epoch all the same.
    let ids = read_epoch(&a.sock, &spec, 0, 1);
    assert_eq!(ids.len() as u64, FILES);
    assert_eq!(a.metric("granary_reads_total", ""), FILES as f64);
}

/// The sum of `name` over `agents`.
fn total(agents: &[DnsAgent], name: &str, with: &str) -> f64 {
    agents.iter().map(|a| a.metric(name, with)).sum()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
#[ignore = "needs root: mount namespaces whose /etc/resolv.conf names the test's DNS responder; scripts/test.sh runs it when it runs as root"]
fn agents_find_each_other_through_a_dns_responder_and_follow_its_records() {
    assert!(is_root(), "this test needs root (unshare --mount)");
    let _w = watchdog_fn!(600);
    let tmp = tempfile::tempdir().unwrap();
    let spec = dataset(tmp.path());
    // The responder on a loopback address of its own, port 53 (the only
    // port glibc's resolv.conf can name).
    let stub_ip = Ipv4Addr::new(127, 0, 53, 1);
    let ips: Vec<String> = (2..=4).map(|k| format!("127.0.0.{k}")).collect();
    let addrs: Vec<Ipv4Addr> = ips.iter().map(|s| s.parse().unwrap()).collect();
    let stub = DnsStub::start(SocketAddr::from((stub_ip, 53)), NAME, &addrs[..2])
        .expect("bind the DNS responder on 127.0.53.1:53");
    let resolv = tmp.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {stub_ip}\noptions timeout:1 attempts:3\n"),
    )
    .unwrap();
    // Each agent in a mount namespace of its own whose /etc/resolv.conf is
    // the file above (what `ip netns exec` does with /etc/netns/NS).
    let launcher: Vec<String> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([resolv.display().to_string()])
    .collect();
    let port = port_free_on(&ips);
    let mut agents: Vec<DnsAgent> = ips
        .iter()
        .map(|ip| DnsAgent::new(tmp.path(), ip, NAME, port, &spec.root))
        .collect();

    // Two records, two agents: they find each other.
    agents[0].start(&launcher);
    agents[1].start(&launcher);
    let two = converged(&[&agents[0], &agents[1]], 2);
    let id = agents[0].identity();
    assert!(id.job_id.starts_with(&format!("{NAME}@")), "{}", id.job_id);
    assert_eq!(id.node_id, "127.0.0.2");

    // A third record: the third agent starts (it waits for its own
    // address among the records) and all three move to the view of three.
    stub.set(&addrs);
    agents[2].start(&launcher);
    let three = converged(&[&agents[0], &agents[1], &agents[2]], 3);
    assert_ne!(two, three);

    // One epoch, one rank on each node: every sample once in the job, each
    // read from the store once across the three agents.
    let handles: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(rank, a)| {
            let (sock, spec) = (a.sock.clone(), spec.clone());
            std::thread::spawn(move || read_epoch(&sock, &spec, rank as u32, 3))
        })
        .collect();
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..FILES).collect::<Vec<_>>(), "every sample once");
    let reads = total(&agents, "granary_reads_total", "");
    let from_peers = total(&agents, "granary_tier_samples_total", "tier=\"peer\"");
    let served = total(&agents, "granary_peer_served_total", "");
    eprintln!(
        "three agents through DNS: store reads {reads}, samples from peers {from_peers}, \
         blocks served {served}, DNS queries {}",
        stub.queries()
    );
    assert!(stub.queries() > 0, "the agents asked the responder");
    assert_eq!(reads, FILES as f64, "each sample read from the store once");
    assert!(from_peers > 0.0, "no sample came from a peer");
    assert_eq!(from_peers, served);

    // The third leaves the records (its pod is gone): the other two go
    // back to the view of two, the very one they held before.
    agents[2].stop();
    stub.set(&addrs[..2]);
    let again = converged(&[&agents[0], &agents[1]], 2);
    assert_eq!(again, two, "the same records give the same view");
    assert_eq!(
        total(
            &agents[..2],
            "granary_peer_sessions_ended_by_view_total",
            ""
        ),
        0.0,
        "no session is ended by a change of records"
    );

    // The name loses every record (or its server fails): the view held
    // stays, and the reason is logged once.
    stub.set(&[]);
    let asked = stub.queries();
    wait_until("the agents asked again", || stub.queries() >= asked + 8);
    for a in &agents[..2] {
        assert_eq!(
            a.identity().view_digest,
            two,
            "{}: the view held stays",
            a.ip
        );
        wait_until("the reason logged", || {
            a.log().contains("the view held stays")
        });
        assert_eq!(
            a.log().matches("the view held stays").count(),
            1,
            "{}: logged once",
            a.ip
        );
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
