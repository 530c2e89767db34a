//! `peers.membership = "dns"`: the members are the addresses of a name (a
//! headless Service's records in Kubernetes), resolved through the system
//! resolver (`getaddrinfo`, so `/etc/resolv.conf` and `/etc/hosts` apply),
//! with no API client.
//!
//! * **Members.** The name's A records, or its AAAA records when it has no
//!   A record; each address is a member whose id is the address as text
//!   (`10.1.2.3`, `fd00::5`) and who listens on `peers.port`. Every member
//!   gets this agent's keep area as its capacity (as under Slurm), so the
//!   agents of one view need the same arena size and `peers.keep_percent`.
//! * **This agent's id** is its own address among the records:
//!   `peers.node_id` when set (an IP address), else the IP of `peers.listen`
//!   when it names one, else the one address of the records that belongs to
//!   this host (a socket can be bound to it). `granaryd run` waits for it up
//!   to [`START_WAIT`] before it serves, then gives up with an error naming
//!   the addresses it saw.
//! * **Views.** A view is `{job: NAME@DIGEST, epoch 0, members}`, where
//!   `DIGEST` is 12 hex digits of the SHA-256 of the sorted addresses: every
//!   agent that resolves the same set builds the same bytes, whenever it
//!   resolves them, with nothing to agree on. A counter could not be
//!   agreed on without a vote, and views are never voted; that is why a
//!   changed set is another job's view rather than a higher epoch of one.
//! * **At run time.** A thread of the agent ([`Resolver`]) resolves the
//!   name every `peers.dns_refresh_ms`; when the set changed, and holds
//!   this agent, it hands the new view to its own agent over the loaders'
//!   socket, as a loader of `"session"` membership would. The engine
//!   installs it as it installs a relaunch's view (the old transport
//!   stopped, directories computed off its thread, kept samples the new
//!   keep-set drops freed). Loaders never join a DNS view, so no session is
//!   fenced by a change: their samples stay the same, only where the bytes
//!   come from changes. The server takes views from the agent's own
//!   process only (`server/handin.rs`). A failed resolution, an empty set,
//!   or a set without this agent keeps the view held (logged once per
//!   change of problem).

use crate::config::PeersConfig;
use granary_peer::view::{Member, View};
use granary_shm::handshake::{Message, PeerIdentity, ViewChunk, ViewJoined};
use granary_shm::socket::SeqPacket;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `granaryd run` waits, before it serves, for this agent's own
/// address to appear among the name's records.
pub const START_WAIT: Duration = Duration::from_secs(60);

/// How long the resolver waits for its agent's answers.
const AGENT_WAIT: Duration = Duration::from_secs(10);

/// The addresses of `name` as members: its IPv4 addresses when it has any,
/// else its IPv6 ones; sorted, each once.
pub fn resolve(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    let found: Vec<IpAddr> = (name, port).to_socket_addrs()?.map(|a| a.ip()).collect();
    Ok(members_of(found))
}

/// [`resolve`]'s rule over addresses already found.
pub fn members_of(found: impl IntoIterator<Item = IpAddr>) -> Vec<IpAddr> {
    let mut all: Vec<IpAddr> = found.into_iter().collect();
    if all.iter().any(IpAddr::is_ipv4) {
        all.retain(IpAddr::is_ipv4);
    }
    all.sort_unstable();
    all.dedup();
    all
}

/// The job id of the view of `addrs` (sorted, as [`members_of`] gives
/// them) under `name`: `NAME@` and the first 12 hex digits of the SHA-256
/// of the addresses, one per line.
pub fn job_id(name: &str, addrs: &[IpAddr]) -> String {
    let mut h = Sha256::new();
    h.update(b"granary-dns-view-v1\0");
    for a in addrs {
        h.update(a.to_string().as_bytes());
        h.update(b"\n");
    }
    let d = h.finalize();
    let hex: String = d[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}@{hex}", name.trim_end_matches('.'))
}

/// The view of `addrs` under `name`: every member at `ADDR:port` with
/// `capacity` bytes kept.
pub fn view_of(name: &str, addrs: &[IpAddr], port: u16, capacity: u64) -> Result<View, String> {
    View::new(
        job_id(name, addrs),
        0,
        addrs.iter().map(|&ip| {
            Member::new(
                ip.to_string(),
                SocketAddr::new(ip, port).to_string(),
                capacity,
            )
        }),
    )
    .map_err(|e| format!("the view of {name}'s addresses: {e}"))
}

/// Whether `ip` is an address of this host (a socket binds to it).
pub fn is_local(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// This agent's address among the records (see the module documentation):
/// `peers.node_id`, else `peers.listen`'s IP, else the one address
/// `resolve` gives that `local` says is this host's, tried every `retry`
/// until `wait` has passed.
pub fn own_address(
    cfg: &PeersConfig,
    mut resolve: impl FnMut() -> std::io::Result<Vec<IpAddr>>,
    local: impl Fn(IpAddr) -> bool,
    wait: Duration,
    retry: Duration,
) -> Result<IpAddr, String> {
    if !cfg.node_id.is_empty() {
        return cfg
            .node_id
            .parse()
            .map_err(|_| format!("peers.node_id {:?} is not an IP address", cfg.node_id));
    }
    if let Ok(l) = cfg.listen.parse::<SocketAddr>() {
        if !l.ip().is_unspecified() {
            return Ok(l.ip());
        }
    }
    let deadline = Instant::now() + wait;
    loop {
        let seen = match resolve() {
            Ok(addrs) => {
                let mine: Vec<IpAddr> = addrs.iter().copied().filter(|&a| local(a)).collect();
                match mine[..] {
                    [one] => return Ok(one),
                    [] => format!("its addresses are {addrs:?}"),
                    _ => {
                        return Err(format!(
                            "several addresses of {} are this host's ({mine:?}): set peers.listen \
                             to this agent's IP:PORT or peers.node_id to its IP",
                            cfg.dns_name
                        ))
                    }
                }
            }
            Err(e) => format!("resolving it failed: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "none of the addresses of {} is this host's after {} s ({seen}); is this \
                 agent's address published (a headless Service with publishNotReadyAddresses)? \
                 Else set peers.listen to this agent's IP:PORT",
                cfg.dns_name,
                wait.as_secs()
            ));
        }
        std::thread::sleep(retry);
    }
}

/// Sets `peers.node_id` of a `"dns"` configuration to this agent's address
/// among the records ([`own_address`], waiting up to [`START_WAIT`]), so
/// that the engine knows itself in the views the [`Resolver`] hands in.
/// Nothing for other memberships.
pub fn settle_node_id(cfg: &mut PeersConfig) -> Result<(), String> {
    if cfg.membership_setting != crate::config::MembershipSetting::Dns {
        return Ok(());
    }
    let (name, port) = (cfg.dns_name.clone(), cfg.port);
    let ip = own_address(
        cfg,
        || resolve(&name, port),
        is_local,
        START_WAIT,
        Duration::from_millis(cfg.dns_refresh_ms.min(1000)),
    )?;
    tracing::info!(node_id = %ip, name = %name, "this agent's address among the records");
    cfg.node_id = ip.to_string();
    Ok(())
}

/// The thread that resolves the name again and hands changed views to its
/// agent; stopped when dropped (without waiting for a resolution under
/// way, which the system resolver bounds).
#[derive(Debug)]
pub struct Resolver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the resolver thread needs.
struct Round {
    name: String,
    port: u16,
    max_members: usize,
    node_id: String,
    socket: PathBuf,
}

impl Resolver {
    /// Starts the thread for a `"dns"` configuration whose agent listens
    /// on `socket` (`None` for other memberships). `cfg.node_id` is this
    /// agent's address ([`settle_node_id`]).
    pub fn start(cfg: &PeersConfig, socket: &Path) -> std::io::Result<Option<Resolver>> {
        if cfg.membership_setting != crate::config::MembershipSetting::Dns {
            return Ok(None);
        }
        let round = Round {
            name: cfg.dns_name.clone(),
            port: cfg.port,
            max_members: cfg.max_members as usize,
            node_id: cfg.node_id.clone(),
            socket: socket.to_path_buf(),
        };
        let every = Duration::from_millis(cfg.dns_refresh_ms);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("granary-dns".into())
            .spawn(move || round.run(every, &flag))?;
        Ok(Some(Resolver {
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

impl Round {
    fn run(&self, every: Duration, stop: &AtomicBool) {
        let mut held: Option<Vec<IpAddr>> = None;
        let mut problem = String::new();
        while !stop.load(Ordering::Relaxed) {
            match self.once(held.as_deref()) {
                Ok(Some((addrs, joined))) => {
                    tracing::info!(
                        name = %self.name,
                        members = addrs.len(),
                        installed = joined.installed,
                        "membership view from DNS: {addrs:?}"
                    );
                    held = Some(addrs);
                    problem.clear();
                }
                Ok(None) => problem.clear(),
                Err(e) => {
                    if e != problem {
                        tracing::warn!(name = %self.name, "membership from DNS: {e}; the view held stays");
                        problem = e;
                    }
                }
            }
            let until = Instant::now() + every;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50).min(every));
            }
        }
    }

    /// One resolution: the new set and the agent's answer when a new view
    /// was handed in, `None` when the set is the one held.
    fn once(&self, held: Option<&[IpAddr]>) -> Result<Option<(Vec<IpAddr>, ViewJoined)>, String> {
        let addrs =
            resolve(&self.name, self.port).map_err(|e| format!("resolving {}: {e}", self.name))?;
        if held == Some(&addrs[..]) {
            return Ok(None);
        }
        if addrs.is_empty() {
            return Err(format!("{} has no address", self.name));
        }
        if !addrs.iter().any(|a| a.to_string() == self.node_id) {
            return Err(format!(
                "this agent's address {} is not among {}'s addresses {addrs:?}",
                self.node_id, self.name
            ));
        }
        if addrs.len() > self.max_members {
            return Err(format!(
                "{} has {} addresses, more than peers.max_members ({})",
                self.name,
                addrs.len(),
                self.max_members
            ));
        }
        let me = identity(&self.socket)?;
        let view = view_of(&self.name, &addrs, self.port, me.capacity)?;
        if me.view_digest == view.digest().0 {
            return Ok(Some((
                addrs,
                ViewJoined {
                    view_epoch: view.epoch(),
                    view_digest: me.view_digest,
                    installed: false,
                    sessions_ended: 0,
                },
            )));
        }
        let joined = hand_in(&self.socket, &view.encode())?;
        Ok(Some((addrs, joined)))
    }
}

fn dial(socket: &Path) -> Result<SeqPacket, String> {
    let c = SeqPacket::connect(socket)
        .map_err(|e| format!("connecting to this agent at {}: {e}", socket.display()))?;
    c.set_read_timeout(Some(AGENT_WAIT))
        .map_err(|e| format!("setting a read timeout: {e}"))?;
    Ok(c)
}

/// The agent's answer to a `PeerQuery` (its keep bytes, the view held).
fn identity(socket: &Path) -> Result<PeerIdentity, String> {
    let c = dial(socket)?;
    c.send_message(&Message::PeerQuery, &[])
        .map_err(|e| format!("asking this agent who it is: {e}"))?;
    match c.recv_message() {
        Ok((Message::PeerIdentity(p), _)) => Ok(p),
        Ok((other, _)) => Err(format!("this agent answered {other:?} to a peer query")),
        Err(e) => Err(format!("waiting for this agent's identity: {e}")),
    }
}

/// Hands the encoded `view` to the agent and returns its answer.
fn hand_in(socket: &Path, view: &[u8]) -> Result<ViewJoined, String> {
    let c = dial(socket)?;
    for chunk in ViewChunk::split(view) {
        c.send_message(&Message::ViewChunk(chunk), &[])
            .map_err(|e| format!("handing the view to this agent: {e}"))?;
    }
    match c.recv_message() {
        Ok((Message::ViewJoined(j), _)) => Ok(j),
        Ok((Message::Error(e), _)) => Err(format!("this agent refused the view: {}", e.message)),
        Ok((other, _)) => Err(format!("this agent answered {other:?} to a view")),
        Err(e) => Err(format!("waiting for this agent's answer to the view: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const STRONG: &str = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cfg(extra: &str) -> Config {
        Config::from_toml_str(&format!(
            "[peers]\nmembership = \"dns\"\ndns_name = \"granary-peers.granary.svc.cluster.local\"\n\
             secret = \"{STRONG}\"\n{extra}\n[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n"
        ))
        .unwrap()
    }

    #[test]
    fn ipv4_records_win_and_the_set_is_sorted_and_deduplicated() {
        let got = members_of([
            ip("fd00::2"),
            ip("10.0.0.9"),
            ip("10.0.0.3"),
            ip("10.0.0.9"),
        ]);
        assert_eq!(got, [ip("10.0.0.3"), ip("10.0.0.9")]);
        let v6 = members_of([ip("fd00::9"), ip("fd00::2")]);
        assert_eq!(v6, [ip("fd00::2"), ip("fd00::9")]);
        assert!(members_of([]).is_empty());
    }

    #[test]
    fn every_agent_builds_the_same_view_of_one_set_and_another_of_another() {
        let name = "granary-peers.granary.svc.cluster.local";
        let a = members_of([ip("10.0.0.3"), ip("10.0.0.2")]);
        let b = members_of([ip("10.0.0.2"), ip("10.0.0.3")]);
        let v1 = view_of(name, &a, 7170, 1 << 30).unwrap();
        let v2 = view_of(name, &b, 7170, 1 << 30).unwrap();
        assert_eq!(v1.encode(), v2.encode(), "the order found changes nothing");
        assert_eq!(v1.epoch(), 0);
        assert!(v1
            .job_id()
            .starts_with("granary-peers.granary.svc.cluster.local@"));
        assert_eq!(v1.job_id().len(), name.len() + 13);
        let m = &v1.members()[v1.index_of("10.0.0.3").unwrap()];
        assert_eq!((m.addr.as_str(), m.capacity), ("10.0.0.3:7170", 1 << 30));
        // A member more is another job id, hence another view.
        let c = members_of([ip("10.0.0.2"), ip("10.0.0.3"), ip("10.0.0.4")]);
        let v3 = view_of(name, &c, 7170, 1 << 30).unwrap();
        assert_ne!(v3.job_id(), v1.job_id());
        // The trailing dot of a fully qualified name is not part of it.
        assert_eq!(job_id(&format!("{name}."), &a), v1.job_id());
        // IPv6 members are reached at [ADDR]:PORT.
        let v6 = view_of(name, &[ip("fd00::5")], 7300, 1).unwrap();
        assert_eq!(v6.members()[0].addr, "[fd00::5]:7300");
        assert_eq!(v6.members()[0].id, "fd00::5");
    }

    #[test]
    fn the_agent_finds_its_own_address_among_the_records() {
        let fast = Duration::from_millis(1);
        let c = cfg("");
        let records = || Ok(vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        // The one record of this host.
        let got = own_address(&c.peers, records, |a| a == ip("10.0.0.3"), fast, fast);
        assert_eq!(got.unwrap(), ip("10.0.0.3"));
        // Several: refused at once, asking for peers.listen.
        let e = own_address(&c.peers, records, |_| true, fast, fast).unwrap_err();
        assert!(e.contains("peers.listen"), "{e}");
        // None after the wait: the addresses seen are named.
        let e = own_address(&c.peers, records, |_| false, fast, fast).unwrap_err();
        assert!(
            e.contains("10.0.0.2") && e.contains("publishNotReadyAddresses"),
            "{e}"
        );
        // A record that appears later is waited for.
        let mut n = 0;
        let later = || {
            n += 1;
            Ok(if n < 3 {
                vec![ip("10.0.0.2")]
            } else {
                vec![ip("10.0.0.2"), ip("10.0.0.7")]
            })
        };
        let got = own_address(
            &c.peers,
            later,
            |a| a == ip("10.0.0.7"),
            Duration::from_secs(10),
            fast,
        );
        assert_eq!(got.unwrap(), ip("10.0.0.7"));
        // A resolver error is named too.
        let e = own_address(
            &c.peers,
            || Err(std::io::Error::other("no such host")),
            |_| true,
            fast,
            fast,
        )
        .unwrap_err();
        assert!(e.contains("no such host"), "{e}");
        // peers.node_id, then peers.listen's IP, come first.
        let c = cfg("node_id = \"10.0.0.9\"");
        assert_eq!(
            own_address(&c.peers, records, |_| false, fast, fast).unwrap(),
            ip("10.0.0.9")
        );
        let c = cfg("listen = \"10.0.0.8:7170\"");
        assert_eq!(
            own_address(&c.peers, records, |_| false, fast, fast).unwrap(),
            ip("10.0.0.8")
        );
    }

    #[test]
    fn the_settings_are_validated_with_clear_errors() {
        let bad = |peers: &str| {
            Config::from_toml_str(&format!(
                "[peers]\nsecret = \"{STRONG}\"\n{peers}\n[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n"
            ))
            .unwrap_err()
            .to_string()
        };
        let dns = "membership = \"dns\"\n";
        for (peers, field, says) in [
            (dns.to_string(), "peers.dns_name", "is required"),
            (
                format!("{dns}dns_name = \"bad name\""),
                "peers.dns_name",
                "is not a DNS name",
            ),
            (
                format!("{dns}dns_name = \"{}\"", "a".repeat(241)),
                "peers.dns_name",
                "240",
            ),
            (
                format!("{dns}dns_name = \"p\"\ndns_refresh_ms = 10"),
                "peers.dns_refresh_ms",
                "outside",
            ),
            (
                format!("{dns}dns_name = \"p\"\njob_id = \"j\""),
                "peers.job_id",
                "not used",
            ),
            (
                format!("{dns}dns_name = \"p\"\nview_uids = [5]"),
                "peers.view_uids",
                "never from loaders",
            ),
            (
                format!("{dns}dns_name = \"p\"\nnode_id = \"gpu1\""),
                "peers.node_id",
                "not an IP address",
            ),
            (
                format!("{dns}dns_name = \"p\"\nlisten = \"10.0.0.1:7200\""),
                "peers.listen",
                "peers.port",
            ),
            (
                "membership = \"session\"\ndns_name = \"p\"".to_string(),
                "peers.dns_name",
                "only for membership = \"dns\"",
            ),
        ] {
            let e = bad(&peers);
            assert!(e.contains(field) && e.contains(says), "{peers}: {e}");
        }
        // A good one runs the engine as "session".
        let c = cfg("dns_refresh_ms = 100\nlisten = \"10.0.0.1:7170\"");
        assert_eq!(c.peers.membership, crate::config::Membership::Session);
        assert_eq!(c.peers.membership_setting.as_str(), "dns");
    }

    #[test]
    fn localhost_resolves_through_the_system_resolver() {
        // /etc/hosts names localhost on every machine this runs on.
        let got = resolve("localhost", 7170).unwrap();
        assert_eq!(got, [ip("127.0.0.1")]);
        assert!(is_local(ip("127.0.0.1")));
        assert!(!is_local(ip("192.0.2.77")), "TEST-NET-1 is nobody's");
    }
}
