//! The node role of the cluster benchmark: one process per node namespace
//! that runs the node's loader ranks against its `granaryd`, checks every
//! batch against the planner, scrapes the agent's metrics, and (in the
//! corruption scenario) runs the corrupting proxy in front of the agent's
//! peer listener.
//!
//! It talks to the orchestrator over a line protocol: commands on stdin,
//! reports on stdout (one line each, `key=value` words after a verb).
//!
//! | stdin | stdout |
//! |---|---|
//! | (start) | `ready` |
//! | `epoch E` | `tick …` every [`TICK`] while it runs (and `mark …`, see
//! | | [`NodeArgs::mark`]), then `done E …` |
//! | `epoch E locality=HEX` | the same, in the locality-aware assignment with that agreed digest |
//! | `epoch E stop=K` | the same, but every rank stops after batch `K - 1`: global steps `0..K` (a job that stops mid-epoch) |
//! | `epoch E from=K` | the same, every rank's session opened at batch `K` (`first_batch`): global steps `K..` (a relaunched job going on) |
//! | `assign E` | `assigned epoch=E infos=…` (each rank's answer to the assignment query) |
//! | `world W` | `world world=W batch=B` (the job relaunched with `W` ranks) |
//! | `world W batch=B` | the same, each rank's batch now `B` (the same global batch over another world size) |
//! | `world W batch=B layout=L nodes=N view=PATH` | the same, with the new job's rank layout `L` (view indices, comma-separated) over a view of `N` nodes read from `PATH` (a relaunch in the locality-aware assignment) |
//! | `scrape` | `scraped …` (the agent's counters now) |
//! | `quit` | `final blocks=… corrupted=…`, then exits |
//!
//! `stop=`, `from=` and `locality=` combine, in any order after `epoch E`.
//!
//! Every `done` line carries `steps=`: per batch index, the wrapping sum of
//! `mix64(id + 1)` over the samples the node's ranks received (0 for the
//! steps the command did not run). Summed over
//! the nodes it is a multiset hash of each global step, which the
//! orchestrator compares with the planner's: in exact order and in the
//! locality-aware assignment alike, each step must hold exactly the
//! planner's samples.
//!
//! A rank whose agent goes away (killed) reconnects and reopens the epoch
//! after the batches it had consumed (`first_batch`); a batch delivered
//! again anyway is checked against the plan without being counted
//! (`replayed`): the consumer sees each planned batch once.

use crate::corrupt_proxy::{Corrupt, CorruptingProxy};
use granary::{Batch, Client, ErrorCode, SessionOptions};
use granary_agent::metrics::{parse_text, scrape};
use granary_agent::planner::{EpochPlan, PlanParams};
use granary_tools::synth::{self, SynthSpec};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a running epoch reports progress and the agent's counters.
pub const TICK: Duration = Duration::from_millis(250);
/// The dataset name every agent of the benchmark serves.
pub const DATASET: &str = "data";
/// How long a rank keeps trying to reach its agent again.
const RECONNECT_LIMIT: Duration = Duration::from_secs(120);
/// How long one `next_batch` may block before the rank gives up.
const BATCH_LIMIT: Duration = Duration::from_secs(120);

/// The agent counters the benchmark follows: (short name, series, label
/// filter). Every one is a counter (reset when the agent restarts).
pub const SERIES: &[(&str, &str, &str)] = &[
    ("arena", "granary_tier_samples_total", "tier=\"arena\""),
    ("peer", "granary_tier_samples_total", "tier=\"peer\""),
    ("store", "granary_tier_samples_total", "tier=\"store\""),
    ("peer_b", "granary_tier_bytes_total", "tier=\"peer\""),
    ("store_b", "granary_tier_bytes_total", "tier=\"store\""),
    ("reads", "granary_reads_total", ""),
    ("served", "granary_peer_served_total", ""),
    ("crc", "granary_peer_crc_failures_total", ""),
    ("failed", "granary_peer_gets_failed_total", ""),
    ("hedged", "granary_peer_hedged_total", ""),
    (
        "rejected_record",
        "granary_peer_rejected_total",
        "reason=\"record\"",
    ),
    (
        "slow_routed",
        "granary_peer_gets_failed_total",
        "reason=\"slow\"",
    ),
    ("cancels", "granary_peer_cancels_total", ""),
    (
        "cancelled",
        "granary_peer_served_misses_total",
        "reason=\"cancelled\"",
    ),
    ("not_started", "granary_peer_reads_not_started_total", ""),
    ("delivered", "granary_samples_served_total", ""),
    ("assigned", "granary_assigned_samples_total", ""),
    (
        "moved",
        "granary_assigned_samples_total",
        "placement=\"peer\"",
    ),
];

/// A sample's term in a step's multiset hash.
pub fn step_term(id: u64) -> u64 {
    granary_peer::owner::mix64(id.wrapping_add(1))
}

/// Parses `verb k=v k=v …` into the verb and the pairs.
pub fn parse_line(line: &str) -> (String, BTreeMap<String, String>) {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or_default().to_owned();
    let kv = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (verb, kv)
}

/// The followed counters of the agent at `addr`, as `k=v` words; `None`
/// when it does not answer (it is down).
fn scrape_words(addr: SocketAddr) -> Option<String> {
    let body = scrape(addr, Duration::from_secs(2)).ok()?;
    let all = parse_text(&body);
    let mut out = String::new();
    for (short, name, with) in SERIES {
        let v: f64 = all
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(with))
            .map(|(_, v)| v)
            .sum();
        out.push_str(&format!(" {short}={v}"));
    }
    Some(out)
}

/// What the node role is given.
#[derive(Clone, Debug)]
pub struct NodeArgs {
    /// The agent's socket.
    pub sock: PathBuf,
    /// The agent's metrics address (inside the namespace).
    pub metrics: SocketAddr,
    /// The ranks this node runs.
    pub ranks: Vec<u32>,
    /// Ranks in the job.
    pub world: u32,
    /// Batch size.
    pub batch: u32,
    /// Shuffle seed.
    pub seed: u64,
    /// The dataset's synthetic spec (to verify every byte).
    pub spec: SynthSpec,
    /// The corrupting proxy: where it listens, where it forwards, what it
    /// corrupts.
    pub proxy: Option<(SocketAddr, SocketAddr, Corrupt)>,
    /// An address that must accept a TCP connection before the node says
    /// `ready` (the store: checks the bridge forwards).
    pub probe: Option<SocketAddr>,
    /// (epoch, batches): print `mark` as soon as the node's ranks have
    /// received that many batches of that epoch (the orchestrator acts on
    /// it at once, e.g. kills the agent half-way through an epoch).
    pub mark: Option<(u32, u64)>,
    /// The job's rank layout: the view index of the node of every rank
    /// (empty: the ranks cannot ask for the locality-aware assignment).
    pub layout: Vec<u32>,
    /// Nodes in the view.
    pub nodes: u32,
    /// The job's membership view, handed in with every session (agents
    /// with `peers.membership = "session"`).
    pub view: Option<Vec<u8>>,
}

impl NodeArgs {
    /// Rank `rank`'s session options for `epoch`.
    fn options(&self, rank: u32, epoch: u32, locality: Option<[u8; 32]>) -> SessionOptions {
        let mut o = SessionOptions::new(DATASET);
        o.seed = self.seed;
        o.rank = rank;
        o.world_size = self.world;
        o.batch_size = self.batch;
        o.first_epoch = epoch;
        o.epoch_count = 1;
        if !self.layout.is_empty() {
            o.layout = granary_peer::assign::Layout::new(self.nodes, self.layout.clone())
                .ok()
                .map(|l| l.encode());
        }
        o.locality = locality;
        o.view = self.view.clone();
        o
    }
}

/// What one rank got in one epoch.
#[derive(Debug, Default)]
struct RankEpoch {
    samples: u64,
    bytes: u64,
    lost: u64,
    duplicated: u64,
    /// Samples whose bytes failed verification.
    bad: u64,
    replayed: u64,
    reopens: u64,
    /// Why each reopen happened (the error the client returned).
    reasons: Vec<String>,
    /// Microseconds from being ready for a batch to having it, per
    /// delivered batch.
    waits_us: Vec<u64>,
    error: Option<String>,
    /// Per batch index, the wrapping sum of [`step_term`] over the batch.
    steps: Vec<u64>,
}

/// Multiset difference of one delivered batch against its plan: (missing,
/// extra).
fn diff(got: &[u64], want: &[u64]) -> (u64, u64) {
    let mut count: BTreeMap<u64, i64> = BTreeMap::new();
    for &w in want {
        *count.entry(w).or_default() += 1;
    }
    for &g in got {
        *count.entry(g).or_default() -= 1;
    }
    let missing = count.values().filter(|&&c| c > 0).map(|&c| c as u64).sum();
    let extra = count
        .values()
        .filter(|&&c| c < 0)
        .map(|&c| (-c) as u64)
        .sum();
    (missing, extra)
}

/// Whether a delivered sample's bytes are those of sample `id`.
fn sample_ok(spec: &SynthSpec, id: u64, label: i32, bytes: &[u8]) -> bool {
    match synth::verify_sample(bytes) {
        Ok(info) => info == spec.sample_info(id) && info.class as i32 == label,
        Err(_) => false,
    }
}

/// A batch just delivered to a rank, where its plan stood.
struct Delivered<'a> {
    /// The rank's plan of the epoch.
    plan: &'a [Vec<u64>],
    /// Batches consumed before it.
    consumed: usize,
    /// The batch's sample ids.
    ids: &'a [u64],
    /// The job's agreement, in locality order.
    locality: Option<[u8; 32]>,
}

impl Delivered<'_> {
    /// Checks the batch against the plan and counts it into `r`: batches
    /// skipped before it, samples missing or extra (exact order; in
    /// locality order only the size, the step is checked job-wide), its
    /// step hash, and every sample's bytes.
    fn check(&self, a: &NodeArgs, r: &mut RankEpoch, rank: u32, b: &Batch) {
        let Delivered {
            plan,
            consumed,
            ids,
            locality,
        } = *self;
        let idx = b.index() as usize;
        let want = plan.get(idx).map_or(&[][..], Vec::as_slice);
        if idx > consumed {
            // Batches skipped: their samples never reached the consumer.
            r.lost += plan[consumed..idx.min(plan.len())]
                .iter()
                .map(|b| b.len() as u64)
                .sum::<u64>();
        }
        if locality.is_none() {
            let (missing, extra) = diff(ids, want);
            r.lost += missing;
            r.duplicated += extra;
        } else if ids.len() != want.len() {
            // Every rank's batch of a step has the exact order's
            // size; which samples is checked per step, job-wide.
            r.error = Some(format!(
                "rank {rank}: batch {idx} holds {} samples, the step gives each rank {}",
                ids.len(),
                want.len()
            ));
        }
        if r.steps.len() <= idx {
            r.steps.resize(idx + 1, 0);
        }
        r.steps[idx] = ids
            .iter()
            .fold(0u64, |h, &id| h.wrapping_add(step_term(id)));
        for smp in b.samples() {
            // SAFETY: the agent never writes a sample's extent while
            // the batch holding it is on loan; the slice is dropped here,
            // before the caller releases the batch.
            let bytes = unsafe { smp.bytes() };
            if smp.status() != 0 || !sample_ok(&a.spec, smp.id(), smp.label(), bytes) {
                r.bad += 1;
            }
            r.samples += 1;
            r.bytes += bytes.len() as u64;
        }
    }
}

/// Runs epoch `epoch` of `rank` to its end (or to a failure it reports).
fn run_rank(a: &NodeArgs, rank: u32, epoch: u32, part: &Part, progress: &AtomicU64) -> RankEpoch {
    let locality = part.locality;
    let mut r = RankEpoch::default();
    let params = PlanParams {
        num_samples: a.spec.num_files,
        seed: a.seed,
        rank,
        world_size: a.world,
        batch_size: a.batch,
        drop_last: false,
    };
    let plan: Vec<Vec<u64>> = match EpochPlan::new(&params, epoch) {
        Ok(p) => p.batches().map(<[u64]>::to_vec).collect(),
        Err(e) => {
            r.error = Some(format!("plan: {e}"));
            return r;
        }
    };
    // The batches this command runs: `from..limit`.
    let limit = part
        .stop
        .map_or(plan.len(), |k| (k as usize).min(plan.len()));
    let mut consumed = (part.from as usize).min(limit);
    let mut ready_at = Instant::now();
    let mut gave_up_at: Option<Instant> = None;
    'attempts: while consumed < limit {
        if gave_up_at.is_some_and(|t| t.elapsed() > RECONNECT_LIMIT) {
            r.error = Some(format!(
                "rank {rank}: agent unreachable for {RECONNECT_LIMIT:?}"
            ));
            break;
        }
        let Ok(client) = Client::connect(&a.sock) else {
            gave_up_at.get_or_insert_with(Instant::now);
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let mut o = a.options(rank, epoch, locality);
        // A reopened session starts after the batches already consumed.
        o.first_batch = consumed as u64;
        let Ok(mut s) = client.open_session(&o) else {
            gave_up_at.get_or_insert_with(Instant::now);
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        gave_up_at = None;
        loop {
            let b = match s.next_batch(Some(BATCH_LIMIT)) {
                Ok(b) => b,
                Err(e) if e.code() == ErrorCode::EndOfStream => break 'attempts,
                Err(e) => {
                    // The agent went away (or the session failed): reopen
                    // the epoch.
                    r.reopens += 1;
                    r.reasons.push(format!("batch {consumed}: {e}"));
                    continue 'attempts;
                }
            };
            let idx = b.index() as usize;
            let ids: Vec<u64> = b.samples().map(|x| x.id()).collect();
            let want = plan.get(idx).map_or(&[][..], Vec::as_slice);
            if b.epoch() != epoch || b.status() != 0 {
                r.error = Some(format!(
                    "rank {rank}: batch {idx} of epoch {} status {}",
                    b.epoch(),
                    b.status()
                ));
            }
            let end = b.is_end_of_epoch() || b.is_end_of_stream();
            let delivered = idx >= consumed;
            if !delivered {
                // Consumed before the agent went away: checked, not counted.
                r.replayed += 1;
                if diff(&ids, want) != (0, 0) {
                    r.error = Some(format!("rank {rank}: replayed batch {idx} differs"));
                }
            } else {
                let got = Instant::now();
                let at = Delivered {
                    plan: &plan,
                    consumed,
                    ids: &ids,
                    locality,
                };
                at.check(a, &mut r, rank, &b);
                r.waits_us
                    .push(got.duration_since(ready_at).as_micros() as u64);
                consumed = idx + 1;
                let now = progress.fetch_add(1, Ordering::Relaxed) + 1;
                if a.mark == Some((epoch, now)) {
                    println!("mark epoch={epoch} batches={now}");
                }
            }
            if let Err(e) = s.release(b) {
                r.reopens += 1;
                r.reasons.push(format!("release: {e}"));
                continue 'attempts;
            }
            // The consumer is ready for its next batch once it has released
            // a delivered one; replayed batches do not count as delivered.
            if delivered {
                ready_at = Instant::now();
            }
            // Past `stop`, the job stops: the session closes with the
            // agent's read-ahead unconsumed.
            if end || consumed >= limit {
                break 'attempts;
            }
        }
    }
    r.lost += plan[consumed.min(limit)..limit]
        .iter()
        .map(|b| b.len() as u64)
        .sum::<u64>();
    r
}

/// Which part of an epoch one `epoch` command runs, and how.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Part {
    /// The agreed digest of the locality-aware assignment (`None`: exact
    /// order).
    pub locality: Option<[u8; 32]>,
    /// The first batch of every rank's session (`first_batch`).
    pub from: u64,
    /// Every rank stops after batch `stop - 1` (`None`: at the epoch's end).
    pub stop: Option<u64>,
}

impl Part {
    /// Parses the words after `epoch E`: `locality=HEX`, `from=K`,
    /// `stop=K`.
    pub fn parse<'a>(words: impl Iterator<Item = &'a str>) -> Result<Part, String> {
        let mut p = Part::default();
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("bad epoch word {w:?}"))?;
            let num = || v.parse::<u64>().map_err(|_| format!("bad {k} {v:?}"));
            match k {
                "locality" => p.locality = Some(parse_digest(v)?),
                "from" => p.from = num()?,
                "stop" => p.stop = Some(num()?),
                _ => return Err(format!("unknown epoch word {w:?}")),
            }
        }
        if p.stop.is_some_and(|s| s < p.from) {
            return Err(format!("stop before from in {p:?}"));
        }
        Ok(p)
    }
}

/// The node role's main loop; returns when told `quit` or stdin closes.
pub fn run(mut a: NodeArgs) -> Result<(), String> {
    let proxy = match &a.proxy {
        Some((listen, up, corrupt)) => Some(
            CorruptingProxy::start(*listen, *up, corrupt.clone())
                .map_err(|e| format!("corrupting proxy on {listen}: {e}"))?,
        ),
        None => None,
    };
    if let Some(p) = a.probe {
        std::net::TcpStream::connect_timeout(&p, Duration::from_secs(5)).map_err(|e| {
            format!("cannot reach {p} from this namespace ({e}): does the bridge forward?")
        })?;
    }
    println!("ready");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("epoch"), Some(e)) => {
                let epoch: u32 = e.parse().map_err(|_| format!("bad epoch {e:?}"))?;
                run_epoch(&a, epoch, &Part::parse(words)?);
            }
            (Some("world"), Some(w)) => {
                // The job relaunched on fewer nodes: the same ranks here, a
                // smaller world (and, to keep the global batch, a larger
                // batch).
                a.world = w.parse().map_err(|_| format!("bad world {w:?}"))?;
                for word in words {
                    let (k, v) = word
                        .split_once('=')
                        .ok_or_else(|| format!("unknown world word {word:?}"))?;
                    let bad = || format!("bad {k} {v:?}");
                    match k {
                        "batch" => a.batch = v.parse().map_err(|_| bad())?,
                        "nodes" => a.nodes = v.parse().map_err(|_| bad())?,
                        "layout" => {
                            a.layout = v
                                .split(',')
                                .map(|x| x.parse().map_err(|_| bad()))
                                .collect::<Result<_, _>>()?;
                        }
                        "view" => {
                            a.view = Some(std::fs::read(v).map_err(|e| format!("view {v}: {e}"))?);
                        }
                        _ => return Err(format!("unknown world word {word:?}")),
                    }
                }
                println!("world world={} batch={}", a.world, a.batch);
            }
            (Some("assign"), Some(e)) => {
                let epoch: u32 = e.parse().map_err(|_| format!("bad epoch {e:?}"))?;
                println!(
                    "assigned epoch={epoch} infos={}",
                    assignment_infos(&a, epoch)
                );
            }
            (Some("scrape"), _) => {
                let m = scrape_words(a.metrics).unwrap_or_default();
                println!("scraped up={}{m}", u8::from(!m.is_empty()));
            }
            (Some("quit"), _) => break,
            _ => return Err(format!("unknown command {line:?}")),
        }
    }
    let (blocks, corrupted) = proxy
        .as_ref()
        .map_or((0, 0), |p| (p.blocks(), p.corrupted()));
    println!("final blocks={blocks} corrupted={corrupted}");
    Ok(())
}

/// Lowercase hex of a digest.
pub fn digest_hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`digest_hex`]'s output.
pub fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("bad digest {hex:?}");
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(d)
}

/// Every rank's answer to the assignment query for `epoch`, as
/// `rank:1:DIGEST` or `rank:0:why` words joined by `|` (spaces and bars of
/// the reason replaced).
fn assignment_infos(a: &NodeArgs, epoch: u32) -> String {
    a.ranks
        .iter()
        .map(|&rank| {
            let answer =
                Client::connect(&a.sock).and_then(|c| c.assignment(&a.options(rank, epoch, None)));
            match answer {
                Ok(i) if i.locality => format!("{rank}:1:{}", digest_hex(&i.digest)),
                Ok(i) => format!("{rank}:0:{}", i.note.replace([' ', '|'], "_")),
                Err(e) => format!("{rank}:0:{}", e.to_string().replace([' ', '|'], "_")),
            }
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Runs one epoch on every rank of the node, ticking meanwhile, and
/// reports it.
fn run_epoch(a: &NodeArgs, epoch: u32, part: &Part) {
    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let ticker = {
        let (progress, stop, metrics) = (Arc::clone(&progress), Arc::clone(&stop), a.metrics);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let m = scrape_words(metrics).unwrap_or_default();
                println!(
                    "tick batches={} up={}{m}",
                    progress.load(Ordering::Relaxed),
                    u8::from(!m.is_empty())
                );
                let next = Instant::now() + TICK;
                while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })
    };
    let results: Vec<RankEpoch> = std::thread::scope(|sc| {
        let hs: Vec<_> = a
            .ranks
            .iter()
            .map(|&rank| {
                let p = Arc::clone(&progress);
                sc.spawn(move || run_rank(a, rank, epoch, part, &p))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| RankEpoch {
                    error: Some("rank thread panicked".into()),
                    ..RankEpoch::default()
                })
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    let sum = |f: fn(&RankEpoch) -> u64| results.iter().map(f).sum::<u64>();
    let waits: Vec<String> = results
        .iter()
        .flat_map(|r| r.waits_us.iter().map(u64::to_string))
        .collect();
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| e.replace(' ', "_")))
        .collect();
    let reasons: Vec<String> = results
        .iter()
        .flat_map(|r| r.reasons.iter().map(|e| e.replace([' ', '|'], "_")))
        .collect();
    let mut steps: Vec<u64> = Vec::new();
    for r in &results {
        if steps.len() < r.steps.len() {
            steps.resize(r.steps.len(), 0);
        }
        for (s, &h) in steps.iter_mut().zip(&r.steps) {
            *s = s.wrapping_add(h);
        }
    }
    let steps: Vec<String> = steps.iter().map(|h| format!("{h:x}")).collect();
    println!(
        "done epoch={epoch} secs={secs:.4} samples={} bytes={} lost={} dup={} bad={} replayed={} \
         reopens={} waits={} errors={} reasons={} steps={}",
        sum(|r| r.samples),
        sum(|r| r.bytes),
        sum(|r| r.lost),
        sum(|r| r.duplicated),
        sum(|r| r.bad),
        sum(|r| r.replayed),
        sum(|r| r.reopens),
        list_field(&waits, ","),
        list_field(&errors, "|"),
        list_field(&reasons, "|"),
        list_field(&steps, ","),
    );
}

/// A list as one value of the `done` line: its items joined by `sep`, or
/// `-` when it is empty.
fn list_field(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(sep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiset_difference_counts_missing_and_extra() {
        assert_eq!(diff(&[1, 2, 3], &[3, 2, 1]), (0, 0));
        assert_eq!(diff(&[1, 1, 3], &[1, 2, 3]), (1, 1));
        assert_eq!(diff(&[], &[4, 5]), (2, 0));
        assert_eq!(diff(&[7], &[]), (0, 1));
    }

    #[test]
    fn digests_round_trip_through_hex() {
        let d: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(parse_digest(&digest_hex(&d)), Ok(d));
        assert!(parse_digest("00").is_err());
        assert!(parse_digest(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn epoch_words_parse_into_a_part() {
        assert_eq!(Part::parse("".split_whitespace()), Ok(Part::default()));
        let p = Part::parse("stop=21".split_whitespace()).unwrap();
        assert_eq!((p.from, p.stop, p.locality), (0, Some(21), None));
        let d = [7u8; 32];
        let w = format!("from=21 locality={}", digest_hex(&d));
        let p = Part::parse(w.split_whitespace()).unwrap();
        assert_eq!((p.from, p.stop, p.locality), (21, None, Some(d)));
        assert!(Part::parse("from=5 stop=4".split_whitespace()).is_err());
        assert!(Part::parse("stop=x".split_whitespace()).is_err());
        assert!(Part::parse("later=1".split_whitespace()).is_err());
    }

    #[test]
    fn lines_parse_into_verb_and_pairs() {
        let (v, kv) = parse_line("done epoch=2 secs=1.5 errors=-");
        assert_eq!(v, "done");
        assert_eq!(kv["epoch"], "2");
        assert_eq!(kv["errors"], "-");
    }
}
