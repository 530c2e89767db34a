//! The scenarios: a cause injected into one agent's loader or store, or
//! two agents as peers over slow links; each returns the verdicts counted
//! over its measured part.

use std::net::SocketAddr;
use std::time::Duration;

use granary::{Client, SessionOptions};

pub use super::inject::Inject;
use super::measure::{self, Counts, Window};
use super::{Options, Result, BUCKET, DATASET};
use crate::agent::{Agent, AgentSettings, S3Dataset};
use crate::data;
use crate::delay_proxy::DelayProxy;
use crate::light_store::LightStore;

/// The two agents' job secret (a benchmark's, on loopback).
const PEER_SECRET: &str = "05559021d854d94b51d42d3ca615cd116676dbb10c8917f031268a90eed4ff13";

/// One single-agent scenario.
pub struct Scenario {
    /// Its name, the verdict it expects and its JSON key.
    pub name: &'static str,
    /// What the store proxy adds each way.
    pub delay: Duration,
    /// `prefetch.max_inflight_reads`.
    pub inflight: u32,
    /// What the loader does per batch.
    pub inject: Inject,
}

/// The session every loader opens: seed 7, `batch` samples per batch.
fn session_options(batch: u32, epochs: u32) -> SessionOptions {
    let mut opts = SessionOptions::new(DATASET);
    opts.seed = 7;
    opts.batch_size = batch;
    opts.epoch_count = epochs;
    opts.open_timeout = Duration::from_secs(120);
    opts
}

/// An S3 dataset on `store` through a proxy at `via`.
fn dataset(store: &LightStore, via: SocketAddr) -> S3Dataset {
    S3Dataset::new(DATASET, store.settings_via(via), "")
}

/// Runs one single-agent scenario: a fresh agent over `store` behind a
/// proxy adding the scenario's delay, one loader injecting its cause.
pub fn single(store: &LightStore, sc: &Scenario, batch: u32, window: Window) -> Result<Counts> {
    let proxy =
        DelayProxy::loopback(store.addr(), sc.delay).map_err(|e| format!("delay proxy: {e}"))?;
    let mut cfg = AgentSettings::new_s3(1 << 30, dataset(store, proxy.local_addr()));
    cfg.max_inflight_reads = sc.inflight;
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut session = client
        .open_session(&session_options(batch, 1000))
        .map_err(|e| format!("open: {e}"))?;
    let counts = measure::measured(&mut session, &agent, window, sc.inject)?;
    drop(session);
    agent.stop().map_err(|e| format!("agent stop: {e}"))?;
    Ok(counts)
}

/// The peer scenario (module doc of [`super`]): the verdicts of agent A.
pub fn peer(o: &Options, window: Window) -> Result<Counts> {
    let peer_delay = Duration::from_millis(o.peer_delay_ms);
    let mbps = o.peer_mbps as f64;
    let ds = data::spec(o.peer_files, 16_384, 100);
    let ds = data::ensure(&ds).map_err(|e| format!("dataset: {e}"))?;
    let store =
        LightStore::start(&ds.spec.root, BUCKET, "", 2).map_err(|e| format!("light store: {e}"))?;
    let store_proxy = DelayProxy::loopback(store.addr(), Duration::ZERO)
        .map_err(|e| format!("delay proxy: {e}"))?;
    // Each agent's listener, and a proxy in front of it that the other dials.
    let listen: Vec<SocketAddr> = (0..2).map(|_| local(free_port())).collect();
    let proxies: Vec<DelayProxy> = listen
        .iter()
        .map(|&l| DelayProxy::loopback(l, Duration::ZERO))
        .collect::<std::io::Result<_>>()
        .map_err(|e| format!("peer proxy: {e}"))?;
    let ids = ["a", "b"];
    let members: Vec<String> = ids
        .iter()
        .zip(&proxies)
        .map(|(id, p)| format!("{{ id = \"{id}\", addr = \"{}\" }}", p.local_addr()))
        .collect();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut cfg =
                AgentSettings::new_s3(512 << 20, dataset(&store, store_proxy.local_addr()));
            cfg.max_inflight_reads = 64;
            for line in [
                "membership = \"static\"".to_string(),
                "job_id = \"why\"".to_string(),
                format!("node_id = \"{}\"", ids[i]),
                format!("listen = \"{}\"", listen[i]),
                format!("members = [{}]", members.join(", ")),
                format!("secret = \"{}\"", PEER_SECRET),
                "encryption = \"off\"".to_string(),
            ] {
                cfg.extra.push(("peers".to_string(), line));
            }
            Agent::start(&cfg).map_err(|e| format!("agent {}: {e}", ids[i]))
        })
        .collect::<Result<_>>()?;
    // An epoch on B: each agent reads, and keeps, the samples it owns.
    let client_b = Client::connect(agents[1].socket()).map_err(|e| format!("connect: {e}"))?;
    let mut warm = client_b
        .open_session(&session_options(o.batch, 1))
        .map_err(|e| format!("open: {e}"))?;
    let mut warmed = 0u64;
    loop {
        match warm.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => warmed += b.len() as u64,
            Err(e) if e.code() == granary::ErrorCode::EndOfStream => break,
            Err(e) => return Err(format!("warm-up epoch on B: {e}")),
        }
    }
    drop(warm);
    if agents.iter().any(|a| measure::peers_up(a) < 1.0) {
        return Err("after the warm-up epoch the two agents are not connected".into());
    }
    println!("peer        warm-up: {warmed} samples read through B; now the store 100 ms and the peer link {} ms each way, {mbps} Mbit/s", peer_delay.as_millis());
    store_proxy.set_delay(Duration::from_millis(100));
    for p in &proxies {
        p.set_delay(peer_delay);
        p.set_bandwidth_mbps(Some(mbps));
    }
    let client_a = Client::connect(agents[0].socket()).map_err(|e| format!("connect: {e}"))?;
    let mut session = client_a
        .open_session(&session_options(o.batch, 1000))
        .map_err(|e| format!("open: {e}"))?;
    let counts = measure::measured(
        &mut session,
        &agents[0],
        window,
        Inject::Sleep(Duration::from_millis(5)),
    )?;
    drop(session);
    for a in agents {
        a.stop().map_err(|e| format!("agent stop: {e}"))?;
    }
    Ok(counts)
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}
