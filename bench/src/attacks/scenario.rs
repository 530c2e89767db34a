//! The set-up: the two agents and their loaders, the switches in their
//! paths, warming them up, and a legitimate member's fetches.

use super::*;

pub(super) struct Ctx {
    pub(super) opts: Opts,
    pub(super) spec: SynthSpec,
    pub(super) windows: SampleWindows,
    pub(super) bin: PathBuf,
    pub(super) work: PathBuf,
    /// Loaders of every pair run so far (their totals are judged at the end).
    pub(super) retired: Vec<Loader>,
}

pub(super) fn free_port(ip: IpAddr) -> Result<u16> {
    TcpListener::bind(SocketAddr::new(ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port on {ip}: {e}"))
}

/// Two agents of one job and their loaders.
pub(super) struct Pair {
    pub(super) a: AgentProc,
    pub(super) b: AgentProc,
    pub(super) a_peer: SocketAddr,
    pub(super) b_peer: SocketAddr,
    pub(super) digest: [u8; 32],
    pub(super) fingerprint: u64,
    pub(super) protection: Protection,
    pub(super) loaders: Vec<Loader>,
}

impl Pair {
    pub(super) fn a_loaders(&self) -> impl Iterator<Item = &Loader> {
        self.loaders.iter().filter(|l| l.name.starts_with('A'))
    }

    /// What an attacker holding the secret and member `node`'s id says.
    pub(super) fn member(&self, node: &str, expect: Option<&str>) -> ConnConfig {
        let mut c = ConnConfig::new(
            JOB,
            node,
            self.digest,
            u64::from_le_bytes(peer_client::entropy()[..8].try_into().unwrap_or([0; 8])),
            SECRET,
        );
        c.expected_peer = expect.map(str::to_owned);
        c.protection = self.protection;
        c
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn agent_toml(
    ctx: &Ctx,
    id: &str,
    sock: &Path,
    listen: SocketAddr,
    metrics: SocketAddr,
    members: &str,
    encryption: bool,
) -> String {
    format!(
        r#"[arena]
size = "64MiB"
hugepages = "off"
populate = true
[socket]
path = "{sock}"
[prefetch]
max_inflight_reads = 32
window_batches = 4
initial_window = 2
[metrics]
address = "{metrics}"
[peers]
membership = "static"
job_id = "{JOB}"
node_id = "{id}"
listen = "{listen}"
members = [{members}]
secret = "{SECRET}"
keep_percent = 90
encryption = "{enc}"
{timeouts}[[dataset]]
name = "{DATASET}"
root = "{root}"
"#,
        sock = sock.display(),
        enc = if encryption { "on" } else { "off" },
        timeouts = ctx.opts.peer_timeouts(),
        root = ctx.spec.root.display(),
    )
}

/// The two switches every connection between A and B crosses: `to_a`
/// where A's view address points, `to_b` where B's.
pub(super) struct Paths {
    pub(super) to_a: SwitchProxy,
    pub(super) to_b: SwitchProxy,
}

impl Paths {
    /// Both lead to their agent (recording or not).
    pub(super) fn forward(&self, pair: &Pair, record: bool) {
        self.to_a.set(pair.a_peer, record);
        self.to_b.set(pair.b_peer, record);
    }

    /// What both recorded, taken.
    pub(super) fn take(&self) -> Capture {
        let mut c = self.to_a.take_capture();
        let d = self.to_b.take_capture();
        c.to_upstream.extend_from_slice(&d.to_upstream);
        c.to_dialer.extend_from_slice(&d.to_dialer);
        c.openings.extend(d.openings);
        c
    }
}

pub(super) fn start_pair(ctx: &Ctx, paths: &Paths, encryption: bool, tag: &str) -> Result<Pair> {
    let a_peer = SocketAddr::new(ip(A_IP), free_port(ip(A_IP))?);
    let b_peer = SocketAddr::new(ip(B_IP), free_port(ip(B_IP))?);
    let a_metrics = SocketAddr::new(ip(A_IP), free_port(ip(A_IP))?);
    let b_metrics = SocketAddr::new(ip(B_IP), free_port(ip(B_IP))?);
    paths.to_a.set(a_peer, false);
    paths.to_b.set(b_peer, false);
    let members = format!(
        "{{ id = \"a\", addr = \"{}\" }}, {{ id = \"b\", addr = \"{}\" }}, \
         {{ id = \"p\", addr = \"{}:9\", keep = \"1KiB\" }}",
        paths.to_a.addr(),
        paths.to_b.addr(),
        ip(P_IP)
    );
    let a_sock = ctx.work.join(format!("a{tag}.sock"));
    let b_sock = ctx.work.join(format!("b{tag}.sock"));
    let a_toml = agent_toml(ctx, "a", &a_sock, a_peer, a_metrics, &members, encryption);
    let b_toml = agent_toml(ctx, "b", &b_sock, b_peer, b_metrics, &members, encryption);
    let a = AgentProc::start(
        &ctx.bin,
        &format!("A{tag}"),
        &ctx.work,
        &a_toml,
        &a_sock,
        a_metrics,
        None,
    )?;
    let b = AgentProc::start(
        &ctx.bin,
        &format!("B{tag}"),
        &ctx.work,
        &b_toml,
        &b_sock,
        b_metrics,
        None,
    )?;
    let id = |sock: &Path| {
        Client::connect(sock)
            .and_then(|c| c.peer_identity(Duration::from_secs(10)))
            .map_err(|e| format!("{}: peer identity: {e}", sock.display()))
    };
    let (ia, ib) = (id(&a_sock)?, id(&b_sock)?);
    if ia.view_digest != ib.view_digest || ia.members != 3 {
        return Err(format!("A and B hold different views: {ia:?} {ib:?}"));
    }
    let cfg = granary_agent::config::Config::from_toml_str(&a_toml)
        .map_err(|e| format!("A's configuration: {e}"))?;
    let src = granary_agent::source::open(&cfg.datasets[0], &cfg)
        .map_err(|e| format!("the dataset: {e}"))?;
    let fingerprint = granary_agent::peers::fingerprint(DATASET, &*src);
    let mut loaders = Vec::new();
    for (name, sock) in [("A", &a_sock), ("B", &b_sock)] {
        for k in 0..ctx.opts.loaders {
            loaders.push(Loader::spawn(
                &format!("{name}{k}{tag}"),
                LoaderPlan {
                    sock: sock.clone(),
                    dataset: DATASET.into(),
                    spec: ctx.spec.clone(),
                    seed: 11 + u64::from(k) + if name == "A" { 0 } else { 100 },
                    batch: 16,
                    pause: Duration::from_millis(20),
                },
            ));
        }
    }
    Ok(Pair {
        a,
        b,
        a_peer,
        b_peer,
        digest: ia.view_digest,
        fingerprint,
        protection: if encryption {
            Protection::Encrypted
        } else {
            Protection::Authenticated
        },
        loaders,
    })
}

/// Waits until every loader has read `epochs` epochs (or `limit` passed).
pub(super) fn warm_up(ctx: &Ctx, pair: &Pair, epochs: u64, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let least = pair
            .loaders
            .iter()
            .map(|l| l.stats.samples.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        if least >= epochs * ctx.spec.num_files {
            return Ok(());
        }
        for l in &pair.loaders {
            if let Ok(e) = l.stats.errors.lock() {
                if let Some((_, what)) = e.first() {
                    return Err(format!("loader {}: {what}", l.name));
                }
            }
        }
        if Instant::now() > end {
            return Err(format!(
                "the loaders did not read {epochs} epochs in {limit:?}\nA:\n{}\nB:\n{}",
                pair.a.log_tail(),
                pair.b.log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn tiers(a: &AgentProc) -> (f64, f64, f64) {
    let s = a.series();
    let t = |tier: &str| {
        sum_of(
            &s,
            "granary_tier_samples_total",
            &format!("tier=\"{tier}\""),
        )
    };
    (t("arena"), t("peer"), t("store"))
}

/// Gets of every sample (request ids from `first`), due in 10 s.
pub(super) fn gets_of(ctx: &Ctx, fingerprint: u64, ids: &[u64], first: u64) -> Vec<Get> {
    ids.iter()
        .enumerate()
        .map(|(k, &s)| Get {
            request: first + k as u64,
            fingerprint,
            sample: s,
            length: ctx.spec.size_of(s),
            due: 10_000_000_000,
        })
        .collect()
}

/// How soon the legitimate peer dials again after a refused dial (an
/// agent's first 5 s: 50 ms; later 1 s).
pub(super) const REDIAL: Duration = Duration::from_millis(100);

/// A legitimate member's fetch from A (as `p`, from its address): the
/// samples it got right, how many blocks were wrong, when the first came
/// (from the first dial; a refused dial is tried again every 100 ms).
pub(super) struct PeerFetch {
    pub(super) good: Vec<u64>,
    pub(super) wrong: usize,
    pub(super) first_block: Option<Duration>,
    pub(super) error: Option<String>,
}

pub(super) fn legit_fetch(ctx: &Ctx, pair: &Pair, ids: &[u64], timeout: Duration) -> PeerFetch {
    let start = Instant::now();
    // As an agent does, a refused dial is tried again shortly.
    let mut c = loop {
        let left = timeout.saturating_sub(start.elapsed());
        match PeerClient::dial(
            pair.a_peer,
            Some(ip(P_IP)),
            None,
            pair.member("p", Some("a")),
            left,
        ) {
            Ok(c) => break c,
            Err(e) if start.elapsed() + REDIAL >= timeout => {
                return PeerFetch {
                    good: Vec::new(),
                    wrong: 0,
                    first_block: None,
                    error: Some(format!("dial: {e}")),
                }
            }
            Err(_) => std::thread::sleep(REDIAL),
        }
    };
    let dialled = start.elapsed();
    let f = c.fetch(
        pair.fingerprint,
        &gets_of(ctx, pair.fingerprint, ids, 1),
        timeout.saturating_sub(dialled),
    );
    let mut good = Vec::new();
    let mut wrong = 0;
    for (s, b, ok) in &f.blocks {
        if *ok && b.as_slice() == ctx.windows.content(*s) {
            good.push(*s);
        } else {
            wrong += 1;
        }
    }
    PeerFetch {
        good,
        wrong,
        first_block: f.first_block.map(|d| dialled + d),
        error: f.closed,
    }
}
