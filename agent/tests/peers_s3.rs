//! Three real `granaryd` processes on 127.0.0.2, .3 and .4 sharing their
//! arenas as the peers of one job, each with two loader ranks (a job of six
//! ranks), on an S3 dataset in a SeaweedFS the test starts:
//!
//! * two epochs: every sample of every epoch delivered exactly once per job
//!   and byte for byte; the first epoch reads each sample from the store
//!   once across the three agents; the second reads at most 1 % of them
//!   (the arenas together hold the dataset);
//! * one agent killed with `kill -9` mid-epoch and restarted: its loaders
//!   reopen at the epoch, nothing lost, nothing duplicated, and the others
//!   keep being served (their requests to the dead peer go to the store);
//! * a peer whose blocks are corrupted: detected by the CRC, read again
//!   from the store, counted;
//! * an agent with the wrong job secret: no connection authenticates, so it
//!   serves nothing and is served nothing.

mod common;
mod common_peers;
mod common_s3;

use common::{verify, watchdog, watchdog_fn};
use common_peers::{free_port, identity, member, Agent};
use common_s3::{s3_table, upload, weed_and_synth, Seaweed};
use granary::{encode_view, Client, ErrorCode, MembershipMode, SessionOptions, ViewMember};
use granary_testkit::agent_toml::static_peers;
use granary_testkit::corrupt_proxy::{Corrupt, CorruptingProxy, Senders};
use granary_tools::synth::SynthSpec;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const FILES: u64 = 480;
const MEAN: u64 = 96 * 1024;
const NODES: usize = 3;
const RANKS_PER_NODE: u32 = 2;
const SEED: u64 = 7;
const BATCH: u32 = 16;
const SECRET: &str = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23";

/// Times a rank's session went on after its agent went away: resumed by
/// libgranary (after the batches it had), or, when that failed, the epoch
/// reopened whole by the rank.
static REOPENED: AtomicU64 = AtomicU64::new(0);

/// Where `a`'s peer listener is, from its configuration.
fn peer_addr(a: &Agent) -> SocketAddr {
    let cfg = std::fs::read_to_string(&a.config).unwrap();
    let line = cfg
        .lines()
        .find(|l| l.starts_with("listen = "))
        .expect("listen in the test configuration");
    line.trim_start_matches("listen = ")
        .trim_matches('"')
        .parse()
        .unwrap()
}

struct Cluster {
    /// The view every rank hands in at session open (membership
    /// "session"); `None`: the agents' configured view.
    view: Option<Vec<u8>>,
    proxies: Vec<CorruptingProxy>,
    _weed: Seaweed,
    _tmp: tempfile::TempDir,
    spec: SynthSpec,
    agents: Vec<Agent>,
}

/// Writes the configuration of every agent (`secret_of(node)` gives each
/// its job secret) and starts them.
fn cluster(name: &str, secret_of: impl Fn(usize) -> String) -> Cluster {
    cluster_with(name, secret_of, None, 20_000)
}

/// [`cluster`] whose agents take the view their loaders hand in
/// (`peers.membership = "session"`) instead of a configured list.
fn session_cluster(name: &str) -> Cluster {
    let mut c = cluster_with(name, |_| SECRET.to_string(), None, 20_000);
    for a in &mut c.agents {
        a.kill9();
        let cfg = std::fs::read_to_string(&a.config).unwrap();
        let cfg: String = cfg
            .lines()
            .filter(|l| !l.starts_with("members = ") && !l.starts_with("job_id = "))
            .map(|l| {
                if l.starts_with("membership = ") {
                    "membership = \"session\"\n".to_string()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&a.config, cfg).unwrap();
        a.start();
    }
    c
}

/// [`cluster`], with every agent's peer listener behind a
/// [`CorruptingProxy`] doing `fault`, and `peers.hedge_after_ms`.
fn cluster_with(
    name: &str,
    secret_of: impl Fn(usize) -> String,
    fault: Option<Corrupt>,
    hedge_after_ms: u64,
) -> Cluster {
    let (weed, tmp, spec) = weed_and_synth(FILES, 10, MEAN);
    let report = upload(&weed, &spec.root, name);
    assert_eq!(report.files, FILES);
    let peer_ports: Vec<u16> = (0..NODES).map(|n| free_port(&Agent::ip(n))).collect();
    let listen: Vec<SocketAddr> = (0..NODES)
        .map(|n| {
            format!("{}:{}", Agent::ip(n), peer_ports[n])
                .parse()
                .unwrap()
        })
        .collect();
    let mut proxies = Vec::new();
    let advertised: Vec<SocketAddr> = match fault {
        None => listen.clone(),
        Some(bad) => listen
            .iter()
            .enumerate()
            .map(|(node, &up)| {
                // Agents dial from their listener's IP: the proxy tells who
                // sends by it.
                let senders = Senders {
                    upstream: format!("n{node}"),
                    by_ip: (0..NODES)
                        .map(|n| (Agent::ip(n).parse().unwrap(), format!("n{n}")))
                        .collect(),
                };
                let p = CorruptingProxy::start_with(
                    "127.0.0.5:0".parse().unwrap(),
                    up,
                    bad.clone(),
                    senders,
                )
                .unwrap();
                let a = p.addr();
                proxies.push(p);
                a
            })
            .collect(),
    };
    let members: Vec<String> = (0..NODES)
        .map(|n| format!("{{ id = \"n{n}\", addr = \"{}\" }}", advertised[n]))
        .collect();
    let mut agents = Vec::new();
    for (node, listen) in listen.iter().enumerate() {
        let members = format!("[{}]", members.join(", "));
        let tables = static_peers(
            name,
            &format!("n{node}"),
            &listen.to_string(),
            &secret_of(node),
            &members,
        ) + &format!("hedge_after_ms = {hedge_after_ms}\n")
            + &s3_table("data", &weed.endpoint(), name, "");
        let prefetch = "max_inflight_reads = 64\nwindow_batches = 4\ninitial_window = 2\n\
                        read_retries = 2\nretry_backoff_ms = 20";
        agents.push(Agent::new(tmp.path(), node, "64MiB", prefetch, &tables));
    }
    for a in &mut agents {
        a.start();
    }
    Cluster {
        view: None,
        proxies,
        _weed: weed,
        _tmp: tmp,
        spec,
        agents,
    }
}

/// One rank reading epoch `epoch` through `sock`: the sample ids it got,
/// each verified byte for byte. `None` when the agent went away first.
fn read_epoch(
    sock: &Path,
    spec: &SynthSpec,
    rank: u32,
    epoch: u32,
    view: Option<Vec<u8>>,
) -> Option<Vec<u64>> {
    let client = Client::connect(sock).ok()?;
    let mut o = SessionOptions::new("data");
    o.view = view;
    o.view_required = o.view.is_some();
    o.seed = SEED;
    o.rank = rank;
    o.world_size = NODES as u32 * RANKS_PER_NODE;
    o.batch_size = BATCH;
    o.first_epoch = epoch;
    o.epoch_count = 1;
    let mut s = client.open_session(&o).ok()?;
    let mut ids = Vec::new();
    loop {
        let b = match s.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(_) => return None,
        };
        assert_eq!(b.status(), 0, "rank {rank}: batch status");
        assert_eq!(b.epoch(), epoch);
        for smp in b.samples() {
            verify(spec, &smp);
            ids.push(smp.id());
        }
        let end = b.is_end_of_epoch();
        if s.release(b).is_err() {
            return None;
        }
        if end {
            break;
        }
    }
    REOPENED.fetch_add(u64::from(s.resumes()), Ordering::Relaxed);
    let _ = s.close();
    Some(ids)
}

/// Runs epoch `epoch` on every rank of the job; `during` runs while the
/// loaders read (and may kill and restart agents). Asserts the job got
/// every sample exactly once.
fn run_epoch(c: &mut Cluster, epoch: u32, during: impl FnOnce(&mut Cluster)) {
    let mut handles = Vec::new();
    for node in 0..NODES {
        for r in 0..RANKS_PER_NODE {
            let rank = node as u32 * RANKS_PER_NODE + r;
            let (sock, spec, view) = (c.agents[node].sock.clone(), c.spec.clone(), c.view.clone());
            handles.push(std::thread::spawn(move || {
                // A rank whose agent died resumes on the restarted agent
                // after the batches it had (libgranary); if even that
                // fails, it reads the epoch whole again (what it had is
                // discarded).
                let deadline = Instant::now() + Duration::from_secs(240);
                loop {
                    if let Some(ids) = read_epoch(&sock, &spec, rank, epoch, view.clone()) {
                        return ids;
                    }
                    REOPENED.fetch_add(1, Ordering::Relaxed);
                    assert!(
                        Instant::now() < deadline,
                        "rank {rank} never finished epoch {epoch}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }));
        }
    }
    during(c);
    let mut all: Vec<u64> = Vec::new();
    for h in handles {
        all.extend(h.join().expect("a loader failed"));
    }
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(
        n,
        all.len(),
        "epoch {epoch}: a sample delivered twice in the job"
    );
    assert_eq!(
        all,
        (0..FILES).collect::<Vec<_>>(),
        "epoch {epoch}: samples missing"
    );
}

fn sum(c: &Cluster, name: &str, with: &str) -> f64 {
    c.agents.iter().map(|a| a.metric(name, with)).sum()
}

#[test]
fn three_agents_read_each_sample_from_the_store_once() {
    let _w = watchdog("three_agents_read_each_sample_from_the_store_once", 600);
    let mut c = cluster("job1", |_| SECRET.to_string());
    run_epoch(&mut c, 0, |_| {});
    let reads0 = sum(&c, "granary_reads_total", "");
    let peer0 = sum(&c, "granary_tier_samples_total", "tier=\"peer\"");
    let served0 = sum(&c, "granary_peer_served_total", "");
    eprintln!("epoch 0: store reads {reads0}, samples from peers {peer0}, blocks served {served0}");
    // Every sample had to come from the store once (nothing was cached);
    // no more reads than samples means none was read twice.
    assert_eq!(reads0, FILES as f64, "epoch 0 store reads");
    assert!(peer0 > 0.0, "no sample came from a peer");
    assert_eq!(peer0, served0, "blocks received and served disagree");
    assert_eq!(sum(&c, "granary_peer_crc_failures_total", ""), 0.0);
    run_epoch(&mut c, 1, |_| {});
    let reads1 = sum(&c, "granary_reads_total", "") - reads0;
    let peer1 = sum(&c, "granary_tier_samples_total", "tier=\"peer\"") - peer0;
    let arena1 = sum(&c, "granary_tier_samples_total", "tier=\"arena\"");
    eprintln!("epoch 1: store reads {reads1}, samples from peers {peer1}, from the arena (both epochs) {arena1}");
    for a in &c.agents {
        eprintln!(
            "agent {}: gets failed {} (slow {}), hedged {}, slow peers now {}",
            a.node,
            a.metric("granary_peer_gets_failed_total", ""),
            a.metric("granary_peer_gets_failed_total", "reason=\"slow\""),
            a.metric("granary_peer_hedged_total", ""),
            a.metric("granary_peer_slow", "")
        );
    }
    assert!(
        reads1 <= FILES as f64 / 100.0,
        "epoch 1 read {reads1} samples from the store (at most 1 % of {FILES})"
    );
    assert!(peer1 > 0.0, "no sample came from a peer in epoch 1");
}

#[test]
fn an_agent_killed_mid_epoch_and_restarted_loses_nothing() {
    let _w = watchdog("an_agent_killed_mid_epoch_and_restarted_loses_nothing", 600);
    let mut c = cluster("job2", |_| SECRET.to_string());
    run_epoch(&mut c, 0, |c| {
        // Mid-epoch: some samples served, not all.
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.agents[1].metric("granary_samples_served_total", "") < (FILES / 12) as f64 {
            assert!(Instant::now() < deadline, "agent 1 served nothing");
            std::thread::sleep(Duration::from_millis(20));
        }
        c.agents[1].kill9();
        std::thread::sleep(Duration::from_millis(300));
        c.agents[1].start();
    });
    assert!(
        REOPENED.load(Ordering::Relaxed) > 0,
        "the kill did not interrupt a loader (the epoch had ended)"
    );
    // The others noticed and fell back to the store for its samples.
    run_epoch(&mut c, 1, |_| {});
    assert_eq!(sum(&c, "granary_peer_crc_failures_total", ""), 0.0);
}

#[test]
fn a_wrong_job_secret_gets_nothing_served() {
    let _w = watchdog("a_wrong_job_secret_gets_nothing_served", 600);
    let mut c = cluster("job3", |n| {
        if n == 2 {
            "fbde5277205c87aa9fbe7520fe4a6bf975a016fec2021eaa5f9d38308c2d9e2e".into()
        } else {
            SECRET.into()
        }
    });
    // Strangers on agent 0's peer port: garbage, a truncated frame, a
    // connection that says nothing. The agent closes them and serves on.
    let peer0 = peer_addr(&c.agents[0]);
    let mut strangers = Vec::new();
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[1, 1, 0, 0, 255, 255, 0, 0][..],
        &[][..],
    ] {
        let mut s = TcpStream::connect(peer0).unwrap();
        s.write_all(junk).unwrap();
        strangers.push(s);
    }
    run_epoch(&mut c, 0, |_| {});
    // The garbage got the connection closed without one byte in answer
    // (nothing a stranger could test guesses of the secret against).
    for mut s in strangers.into_iter().take(2) {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let r = s.read_to_end(&mut got);
        // End of stream, or a reset when the listener closed with the
        // stranger's bytes unread.
        let closed = r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset);
        assert!(closed && got.is_empty(), "{r:?} {}", got.len());
    }
    let odd = &c.agents[2];
    assert_eq!(
        odd.metric("granary_peer_served_total", ""),
        0.0,
        "{}",
        odd.log()
    );
    assert_eq!(
        odd.metric("granary_tier_samples_total", "tier=\"peer\""),
        0.0
    );
    assert_eq!(odd.metric("granary_peer_up", ""), 0.0);
    // The two that share the secret did share.
    assert!(c.agents[0].metric("granary_tier_samples_total", "tier=\"peer\"") > 0.0);
    // Node 2 read its share from the store, the others theirs: every
    // sample still once per epoch (checked by run_epoch).
}

#[test]
fn bytes_changed_on_the_wire_are_rejected_and_read_from_the_store() {
    let _w = watchdog_fn!(600);
    // A proxy changes one byte in every block record n1 sends. The channel
    // rejects the record (it fails its tag), closes the connection, and
    // the requests on it are read from the store: nothing wrong reaches a
    // loader (run_epoch checks every byte), the block CRC never has to.
    let mut c = cluster_with(
        "job4",
        |_| SECRET.to_string(),
        Some(Corrupt::From("n1".into())),
        20_000,
    );
    run_epoch(&mut c, 0, |_| {});
    let corrupted: u64 = c.proxies.iter().map(CorruptingProxy::corrupted).sum();
    let rejected = sum(&c, "granary_peer_rejected_total", "reason=\"record\"");
    let lost = sum(
        &c,
        "granary_peer_gets_failed_total",
        "reason=\"connection\"",
    );
    eprintln!("block records changed {corrupted}, records rejected {rejected}, requests failed over {lost}");
    assert!(corrupted > 0, "no block record of n1 went through a proxy");
    assert!(
        rejected >= 1.0 && rejected <= corrupted as f64,
        "{rejected} records rejected for {corrupted} changed"
    );
    assert!(lost >= 1.0, "no request failed over to the store");
    assert_eq!(sum(&c, "granary_peer_crc_failures_total", ""), 0.0);
    // n1 itself received nothing changed.
    assert_eq!(
        c.agents[1].metric("granary_peer_rejected_total", "reason=\"record\""),
        0.0
    );
}

#[test]
fn a_slow_peer_is_hedged_by_the_store() {
    let _w = watchdog("a_slow_peer_is_hedged_by_the_store", 600);
    // Everything n1 sends (its blocks and its own requests) waits 1.5 s per
    // chunk; requests hedge after 300 ms. Nothing is lost and the hedges
    // read the store. (Owners answer requests that reach them that late
    // with a `Late` miss rather than a block; a block that does arrive
    // after its hedge began is dropped.)
    let mut c = cluster_with(
        "job5",
        |_| SECRET.to_string(),
        Some(Corrupt::SlowFrom("n1".into(), Duration::from_millis(1500))),
        300,
    );
    run_epoch(&mut c, 0, |_| {});
    let hedged = sum(&c, "granary_peer_hedged_total", "");
    let late = sum(&c, "granary_peer_late_discarded_total", "");
    let slow = sum(&c, "granary_peer_gets_failed_total", "reason=\"slow\"");
    eprintln!("hedged {hedged}, late blocks dropped {late}, handed to the store as slow {slow}");
    // The others hedged n1's late requests or, once they had measured each
    // other, found n1 slow and routed around it (which of the two depends
    // on how busy the machine is; `granary_peer::request` tests both).
    assert!(hedged + slow > 0.0, "nothing late went to the store");
    assert_eq!(sum(&c, "granary_peer_crc_failures_total", ""), 0.0);
    // A hedged sample, or one handed to the store when n1 was found slow,
    // is read from the store by the requester, and perhaps by n1 too: more
    // store reads than samples, by at most those.
    let reads = sum(&c, "granary_reads_total", "");
    assert!(
        reads >= FILES as f64 && reads <= FILES as f64 + hedged + slow,
        "{reads} reads"
    );
}

#[test]
fn a_connection_cut_in_the_middle_of_a_block_fails_over_to_the_store() {
    let _w = watchdog_fn!(600);
    // Every connection carrying n1's blocks is cut one byte into its first
    // block. The requesters' half-received samples go to the store; nothing
    // hangs, nothing is lost.
    let mut c = cluster_with(
        "job6",
        |_| SECRET.to_string(),
        Some(Corrupt::CutFrom("n1".into())),
        20_000,
    );
    run_epoch(&mut c, 0, |_| {});
    let cuts: u64 = c.proxies.iter().map(CorruptingProxy::corrupted).sum();
    let lost = sum(
        &c,
        "granary_peer_gets_failed_total",
        "reason=\"connection\"",
    );
    eprintln!("connections cut mid-block {cuts}, requests failed over {lost}");
    assert!(cuts > 0, "no block of n1 was cut");
    assert!(
        lost >= cuts as f64,
        "{lost} requests failed over for {cuts} cuts"
    );
}

/// Each agent's identity, asked as a job's ranks ask theirs, gathered into
/// the view of `job` at `epoch`.
fn gather_view(c: &Cluster, job: &str, epoch: u64) -> Vec<u8> {
    let members: Vec<ViewMember> = c
        .agents
        .iter()
        .map(|a| {
            let id = identity(&a.sock);
            assert_eq!(id.membership, MembershipMode::Session);
            assert_eq!(id.node_id, format!("n{}", a.node));
            assert_eq!(id.addr, peer_addr(a).to_string());
            assert!(id.capacity > 0);
            member(id)
        })
        .collect();
    encode_view(job, epoch, &members).unwrap()
}

/// Every rank hands the view to its agent and waits at a barrier (here:
/// the loop) before reading, as the Python integration does.
fn join_everywhere(c: &Cluster, view: &[u8]) {
    for a in &c.agents {
        let j = Client::connect(&a.sock)
            .unwrap()
            .join_view(view, Duration::from_secs(10))
            .unwrap();
        assert_eq!(j.view_digest, granary::view_digest(view).unwrap());
    }
}

fn view_options(view: &[u8], required: bool, epochs: u32) -> SessionOptions {
    let mut o = SessionOptions::new("data");
    o.seed = SEED;
    o.world_size = NODES as u32 * RANKS_PER_NODE;
    o.batch_size = BATCH;
    o.epoch_count = epochs;
    o.view = Some(view.to_vec());
    o.view_required = required;
    o
}

#[test]
fn views_handed_in_at_session_open_share_the_cache_and_a_relaunch_ends_the_old_view() {
    let _w = watchdog_fn!(600);
    let mut c = session_cluster("job7");
    let sock0 = c.agents[0].sock.clone();
    let before = Client::connect(&sock0)
        .unwrap()
        .peer_identity(Duration::from_secs(10))
        .unwrap();
    assert_eq!((before.job_id.as_str(), before.members), ("", 0));

    // First launch: every rank hands in the view of epoch 1.
    let v1 = gather_view(&c, "job7", 1);
    join_everywhere(&c, &v1);
    c.view = Some(v1.clone());
    run_epoch(&mut c, 0, |_| {});
    let reads0 = sum(&c, "granary_reads_total", "");
    let peer0 = sum(&c, "granary_tier_samples_total", "tier=\"peer\"");
    eprintln!("epoch 0 (views from sessions): store reads {reads0}, samples from peers {peer0}");
    assert_eq!(reads0, FILES as f64, "epoch 0 store reads");
    assert!(peer0 > 0.0, "no sample came from a peer");
    assert_eq!(
        sum(&c, "granary_peer_views_total", "outcome=\"installed\""),
        NODES as f64
    );
    let held = Client::connect(&sock0)
        .unwrap()
        .peer_identity(Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        (held.job_id.as_str(), held.view_epoch, held.members),
        ("job7", 1, NODES as u32)
    );

    // A loader of the first launch still reading on n0.
    let mut straggler = Client::connect(&sock0)
        .unwrap()
        .open_session(&view_options(&v1, true, 4))
        .unwrap();
    assert!(
        matches!(straggler.view_status(), Some(Ok(j)) if !j.installed && j.view_epoch == 1),
        "{:?}",
        straggler.view_status()
    );
    let b = straggler.next_batch(Some(Duration::from_secs(60))).unwrap();
    straggler.release(b).unwrap();

    // The relaunch: the same nodes, epoch 2. Its first session on n0
    // installs the view and ends the straggler's.
    let v2 = gather_view(&c, "job7", 2);
    let s2 = Client::connect(&sock0)
        .unwrap()
        .open_session(&view_options(&v2, true, 1))
        .unwrap();
    match s2.view_status() {
        Some(Ok(j)) => {
            assert!(j.installed);
            assert_eq!((j.view_epoch, j.sessions_ended), (2, 1));
        }
        other => panic!("the relaunch's view: {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "the old view's session never ended"
        );
        match straggler.next_batch(Some(Duration::from_secs(5))) {
            // A batch taken before the fence may still come.
            Ok(b) => {
                let _ = straggler.release(b);
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::Fenced, "{e}");
                assert!(e.to_string().contains("membership view"), "{e}");
                break;
            }
        }
    }
    drop(straggler);

    // The first launch's view is stale now: refused, and the session opens
    // anyway unless the view is required.
    let s3 = Client::connect(&sock0)
        .unwrap()
        .open_session(&view_options(&v1, false, 1))
        .unwrap();
    match s3.view_status() {
        Some(Err(e)) => assert!(e.to_string().contains("stale"), "{e}"),
        other => panic!("a stale view: {other:?}"),
    }
    drop(s3);
    let e = Client::connect(&sock0)
        .unwrap()
        .open_session(&view_options(&v1, true, 1))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.to_string().contains("stale"), "{e}");
    // Another job's view waits while a session uses job7's.
    let other = gather_view(&c, "job8", 1);
    let e = Client::connect(&sock0)
        .unwrap()
        .open_session(&view_options(&other, true, 1))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Busy, "{e}");
    drop(s2);

    // The relaunched job reads its next epoch: the keep areas survived
    // (the same nodes own the same samples), so the store is hardly read.
    join_everywhere(&c, &v2);
    let reads_before = sum(&c, "granary_reads_total", "");
    c.view = Some(v2.clone());
    run_epoch(&mut c, 1, |_| {});
    let reads1 = sum(&c, "granary_reads_total", "") - reads_before;
    let installed = sum(&c, "granary_peer_views_total", "outcome=\"installed\"");
    eprintln!("epoch 1 after the relaunch: store reads {reads1}, views installed {installed}");
    assert!(
        reads1 <= FILES as f64 / 100.0,
        "after the relaunch epoch 1 read {reads1} samples from the store (at most 1 % of {FILES})"
    );
    assert_eq!(installed, 2.0 * NODES as f64);
    assert_eq!(
        sum(&c, "granary_peer_gets_failed_total", ""),
        0.0,
        "a peer was asked and failed"
    );
    assert_eq!(
        sum(&c, "granary_peer_sessions_ended_by_view_total", ""),
        1.0
    );
    assert!(sum(&c, "granary_peer_views_total", "outcome=\"refused\"") >= 3.0);
}
