//! `granary`: the operator CLI.
//!
//! * `granary status [--metrics ADDR]`: the agent's counters as a table.
//! * `granary demo [--dir DIR] [--files N] [--epochs E]`: the quickstart:
//!   generate a synthetic dataset, start `granaryd` on it, run two loaders
//!   (two ranks of one job) through libgranary, verify every byte, summarise.
//! * `granary ingest SRC_DIR --to s3://BUCKET/PREFIX [--endpoint URL]
//!   [--region R] [--concurrency N] [--verify] [--resume]`: upload a dataset
//!   folder to S3 (credentials from `AWS_ACCESS_KEY_ID` /
//!   `AWS_SECRET_ACCESS_KEY`); see `docs/s3.md`.
//! * `granary ingest SRC_DIR --to cql://HOST:PORT[,HOST:PORT]/KEYSPACE
//!   [--data-table T] [--metadata-table M] [--username U] [--replication R]
//!   [--tls] [--tls-ca-file F] [--concurrency N] [--verify] [--resume]`:
//!   write a dataset folder into ScyllaDB/Cassandra tables (password from
//!   `GRANARY_CQL_PASSWORD`); see `docs/scylla.md`.

use granary_agent::ingest::{IngestError, IngestReport, Phase};
use granary_agent::metrics::{parse_text, scrape};
use granary_agent::progress::ProgressBar;
use granary_agent::synth::{self, SynthSpec};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: granary status [--metrics ADDR]
       granary demo [--dir DIR] [--files N] [--epochs E]
       granary ingest SRC_DIR --to s3://BUCKET/PREFIX [--endpoint URL] [--region R]
                      [--concurrency N] [--verify] [--resume]
       granary ingest SRC_DIR --to cql://HOST:PORT[,HOST:PORT...]/KEYSPACE
                      [--data-table T] [--metadata-table M] [--username U]
                      [--replication N|DC:N,...] [--tls] [--tls-ca-file F]
                      [--concurrency N] [--verify] [--resume]
                      (password: GRANARY_CQL_PASSWORD)";

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("status") => status(flag(&args, "--metrics").unwrap_or("127.0.0.1:9464")),
        Some("demo") => demo(&args),
        Some("ingest") => ingest(&args),
        _ => Err(USAGE.to_string()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("granary: {e}");
            ExitCode::FAILURE
        }
    }
}

fn status(addr: &str) -> Result<(), String> {
    let sa = addr.parse().map_err(|e| format!("--metrics {addr}: {e}"))?;
    let body = scrape(sa, Duration::from_secs(3))
        .map_err(|e| format!("cannot reach the agent's metrics at {addr}: {e}"))?;
    println!("{:<60} {:>16}", "metric", "value");
    for (k, v) in parse_text(&body) {
        if k.contains("_bucket") {
            continue;
        }
        println!("{k:<60} {v:>16}");
    }
    Ok(())
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

fn demo(args: &[String]) -> Result<(), String> {
    let dir = PathBuf::from(flag(args, "--dir").unwrap_or(".granary-data"));
    let files: u64 = flag(args, "--files")
        .unwrap_or("20000")
        .parse()
        .map_err(|e| format!("--files: {e}"))?;
    let epochs: u32 = flag(args, "--epochs")
        .unwrap_or("3")
        .parse()
        .map_err(|e| format!("--epochs: {e}"))?;
    let data = dir.join("synth");
    let mut spec = SynthSpec::new(&data);
    spec.num_files = files;
    let bar = std::cell::RefCell::new(ProgressBar::new("dataset", files));
    let summary = synth::generate(&spec, |n, b| bar.borrow_mut().update(n, b))
        .map_err(|e| format!("generating {}: {e}", data.display()))?;
    bar.borrow_mut().finish(summary.files, summary.bytes);
    println!(
        "dataset: {} files, {:.1} MB in {} ({})",
        summary.files,
        summary.bytes as f64 / 1e6,
        data.display(),
        if summary.skipped {
            "already there"
        } else {
            "generated"
        }
    );
    let sock = std::env::temp_dir().join(format!("granary-demo-{}.sock", std::process::id()));
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("picking a metrics port: {e}"))?;
    // Room for the whole dataset (4 KiB-rounded extents), the cache's
    // transient reserve (1/16) and the sample tables.
    let arena_mb = (summary.bytes * 6 / 5 / (1 << 20) + 64)
        .next_multiple_of(2)
        .max(256); // the config requires 1 MiB per read in flight (256)
    let config = dir.join("granaryd-demo.toml");
    std::fs::write(
        &config,
        format!(
            "[arena]\nsize = \"{arena_mb}MiB\"\nhugepages = \"try\"\n\n[socket]\npath = \"{}\"\n\n[metrics]\naddress = \"{metrics_addr}\"\n\n[[dataset]]\nname = \"synth\"\nroot = \"{}\"\n",
            sock.display(),
            std::fs::canonicalize(&data).map_err(|e| e.to_string())?.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let granaryd = sibling("granaryd")?;
    let mut agent = Agent(
        Command::new(&granaryd)
            .args(["run", "--config"])
            .arg(&config)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", granaryd.display()))?,
    );
    let t0 = Instant::now();
    while !sock.exists() {
        if let Ok(Some(status)) = agent.0.try_wait() {
            return Err(format!(
                "granaryd exited before serving ({status}); see its message above"
            ));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("granaryd did not open its socket within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "granaryd up in {:.2} s; 2 C loaders (ranks 0 and 1 of one job) x {epochs} epochs, batch 64",
        t0.elapsed().as_secs_f64()
    );
    let consume = sibling("consume")?;
    let start = Instant::now();
    let loaders: Vec<Child> = (0..2)
        .map(|rank: u32| {
            Command::new(&consume)
                .arg("-s")
                .arg(&sock)
                .args([
                    "synth",
                    "64",
                    &epochs.to_string(),
                    "2026",
                    &rank.to_string(),
                    "2",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", consume.display()))
        })
        .collect::<Result<_, _>>()?;
    let mut per_epoch = vec![(0u64, 0u64, 0f64); epochs as usize];
    let mut first_ms = f64::MAX;
    let mut ok = true;
    for (rank, child) in loaders.into_iter().enumerate() {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines() {
            let kv: Vec<(&str, &str)> = line
                .split_whitespace()
                .filter_map(|t| t.split_once('='))
                .collect();
            let get = |k: &str| kv.iter().find(|(a, _)| *a == k).map(|(_, v)| *v);
            if let Some(ms) = get("first_batch_ms").and_then(|v| v.parse::<f64>().ok()) {
                first_ms = first_ms.min(ms);
            }
            if let (Some(e), Some(n), Some(b), Some(sec)) =
                (get("epoch"), get("samples"), get("bytes"), get("seconds"))
            {
                if let Some(slot) = e.parse::<usize>().ok().and_then(|e| per_epoch.get_mut(e)) {
                    slot.0 += n.parse::<u64>().unwrap_or(0);
                    slot.1 += b.parse::<u64>().unwrap_or(0);
                    slot.2 = slot.2.max(sec.parse::<f64>().unwrap_or(0.0));
                }
            }
            if line.starts_with("batches=") {
                println!("loader rank {rank}: {line}");
            }
        }
        if !out.status.success() {
            ok = false;
            eprintln!("loader rank {rank} failed: {}", out.status);
        }
    }
    let total = start.elapsed();
    let body = scrape(metrics_addr, Duration::from_secs(3)).unwrap_or_default();
    let hit_rates = epoch_hit_rates(&body, "synth");
    let (n, bytes): (u64, u64) = per_epoch.iter().fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
    let series = parse_text(&body);
    let metric = |name: &str| series.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    println!("first-batch latency: {first_ms:.1} ms");
    if let (Some(reads), Some(hp)) = (
        metric("granary_reads_total"),
        metric("granary_arena_size_bytes"),
    ) {
        println!(
            "agent: {reads:.0} source reads for {files} files x {epochs} epochs; arena {:.0} MiB",
            hp / 1048576.0
        );
    }
    for (i, (s, b, secs)) in per_epoch.iter().enumerate() {
        let hit = hit_rates
            .iter()
            .find(|(e, _)| *e == i as u32)
            .map_or("n/a".to_string(), |(_, r)| format!("{:.1}%", r * 100.0));
        println!(
            "epoch {i}: {s} samples, {:.0} samples/s, {:.0} MB/s, hit rate {hit}",
            *s as f64 / secs.max(1e-9),
            *b as f64 / 1e6 / secs.max(1e-9)
        );
    }
    println!(
        "total: {n} samples, {:.1} MB in {:.2} s: {:.0} samples/s, {:.0} MB/s",
        bytes as f64 / 1e6,
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64(),
        bytes as f64 / 1e6 / total.as_secs_f64()
    );
    let expected = files * u64::from(epochs);
    if !ok || n != expected {
        return Err(format!(
            "verification FAILED: {n} samples verified of {expected} expected"
        ));
    }
    println!("verification: OK, every byte of {n} samples checked, each sample once per epoch");
    Ok(())
}

/// Hit ratio per epoch of `dataset` from the agent's metrics text.
fn epoch_hit_rates(body: &str, dataset: &str) -> Vec<(u32, f64)> {
    let mut m: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
    let prefix = format!("granary_epoch_lookups_total{{dataset=\"{dataset}\",epoch=\"");
    for (k, v) in parse_text(body) {
        let Some(rest) = k.strip_prefix(&prefix) else {
            continue;
        };
        let Some((epoch, tail)) = rest.split_once('"') else {
            continue;
        };
        let Ok(epoch) = epoch.parse::<u32>() else {
            continue;
        };
        let e = m.entry(epoch).or_default();
        if tail.contains("\"hit\"") {
            e.0 += v;
        } else {
            e.1 += v;
        }
    }
    m.into_iter()
        .map(|(e, (h, miss))| (e, if h + miss > 0.0 { h / (h + miss) } else { 0.0 }))
        .collect()
}

fn sibling(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = me.with_file_name(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} not found next to {}", name, me.display()))
    }
}

fn ingest(args: &[String]) -> Result<(), String> {
    use granary_agent::ingest::{self, IngestOptions};
    use granary_agent::source::s3::S3Settings;
    let src = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .ok_or_else(|| format!("ingest: which folder?\n{USAGE}"))?;
    let to = flag(args, "--to").ok_or_else(|| {
        format!("ingest: --to s3://BUCKET/PREFIX or cql://HOSTS/KEYSPACE is required\n{USAGE}")
    })?;
    if to.starts_with("cql://") {
        return ingest_cql(args, src, to);
    }
    let (bucket, prefix) = ingest::parse_s3_url(to).map_err(|e| format!("--to: {e}"))?;
    let mut settings = S3Settings::new(bucket);
    if let Some(e) = flag(args, "--endpoint") {
        // An endpoint given on the command line is used as given, plain
        // HTTP included.
        settings.allow_http = e.starts_with("http://");
        settings.endpoint = Some(e.to_owned());
    }
    settings.region = flag(args, "--region").map(str::to_owned);
    settings.fill_from_env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    if settings
        .endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
    {
        settings.allow_http = true;
    }
    let mut opts = IngestOptions::new(src, settings, &prefix);
    let flags = IngestFlags::parse(args)?;
    opts.concurrency = flags.concurrency.unwrap_or(opts.concurrency);
    (opts.verify, opts.resume) = (flags.verify, flags.resume);
    let words = IngestWords {
        wrote: "uploaded",
        same: "size",
        items: "objects",
    };
    run_ingest(src, to, opts.verify, words, |progress| {
        ingest::ingest(&opts, progress)
    })
}

/// The flags both ingests take: `--concurrency` (`None` when not given),
/// `--verify`, `--resume`.
struct IngestFlags {
    concurrency: Option<usize>,
    verify: bool,
    resume: bool,
}

impl IngestFlags {
    fn parse(args: &[String]) -> Result<IngestFlags, String> {
        let concurrency = match flag(args, "--concurrency") {
            Some(c) => Some(
                c.parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or_else(|| format!("--concurrency {c:?}: expected a positive integer"))?,
            ),
            None => None,
        };
        Ok(IngestFlags {
            concurrency,
            verify: args.iter().any(|a| a == "--verify"),
            resume: args.iter().any(|a| a == "--resume"),
        })
    }
}

/// How an ingest's summary says what it did.
struct IngestWords {
    /// What happened to the files moved: `uploaded`, `written`.
    wrote: &'static str,
    /// What a skipped file had in common with what the store held.
    same: &'static str,
    /// What was read back: `objects`, `rows`.
    items: &'static str,
}

/// Runs `ingest` (given the progress callback) with progress bars, and
/// prints its summary.
fn run_ingest(
    src: &str,
    to: &str,
    verify: bool,
    words: IngestWords,
    ingest: impl FnOnce(&mut dyn FnMut(Phase, u64, u64, u64)) -> Result<IngestReport, IngestError>,
) -> Result<(), String> {
    let mut bars = Bars(None);
    let result = ingest(&mut |phase, done, total, bytes| bars.report(phase, done, total, bytes));
    bars.end(result.is_ok());
    let r = result.map_err(|e| format!("ingest {src} -> {to}: {e}"))?;
    println!(
        "ingest: {} files, {:.1} MB from {src} to {to}: {} {} ({:.1} MB in {:.1} s, {:.0} MB/s), {} skipped (already there with the same {})",
        r.files,
        r.bytes as f64 / 1e6,
        r.uploaded,
        words.wrote,
        r.uploaded_bytes as f64 / 1e6,
        r.upload_time.as_secs_f64(),
        r.uploaded_bytes as f64 / 1e6 / r.upload_time.as_secs_f64().max(1e-9),
        r.skipped,
        words.same,
    );
    if verify {
        println!(
            "verify: OK, {} {} read back and equal to their files ({:.1} s)",
            r.verified,
            words.items,
            r.verify_time.as_secs_f64()
        );
    }
    Ok(())
}

/// The progress bars of an ingest: one per phase.
struct Bars(Option<(Phase, ProgressBar, u64, u64)>);

impl Bars {
    fn report(&mut self, phase: Phase, done: u64, total: u64, bytes: u64) {
        if self.0.as_ref().is_none_or(|b| b.0 != phase) {
            if let Some((_, b, d, by)) = self.0.as_mut() {
                b.finish(*d, *by);
            }
            let label = match phase {
                Phase::Upload => "upload",
                Phase::Verify => "verify",
            };
            self.0 = Some((phase, ProgressBar::new(label, total), 0, 0));
        }
        if let Some((_, b, d, by)) = self.0.as_mut() {
            (*d, *by) = (done, bytes);
            b.update(done, bytes);
        }
    }

    fn end(mut self, ok: bool) {
        if let (true, Some((_, b, d, by))) = (ok, self.0.as_mut()) {
            b.finish(*d, *by);
        }
    }
}

fn ingest_cql(args: &[String], src: &str, to: &str) -> Result<(), String> {
    use granary_agent::ingest::cql::{self, CqlIngestOptions, Replication};
    use granary_agent::source::cql::CqlSettings;
    let (hosts, keyspace) = cql::parse_cql_url(to).map_err(|e| format!("--to: {e}"))?;
    let mut settings = CqlSettings::new(hosts, keyspace);
    if let Some(t) = flag(args, "--data-table") {
        settings.data_table = t.to_owned();
    }
    if let Some(t) = flag(args, "--metadata-table") {
        settings.metadata_table = t.to_owned();
    }
    settings.username = flag(args, "--username").map(str::to_owned);
    settings.fill_from_env(|k| std::env::var(k).ok());
    settings.tls = args.iter().any(|a| a == "--tls");
    if let Some(f) = flag(args, "--tls-ca-file") {
        settings.tls = true;
        settings.tls_ca_file = Some(f.into());
    }
    let mut opts = CqlIngestOptions::new(src, settings);
    if let Some(r) = flag(args, "--replication") {
        opts.replication = Replication::parse(r).map_err(|e| format!("--replication: {e}"))?;
    }
    let flags = IngestFlags::parse(args)?;
    opts.concurrency = flags.concurrency.unwrap_or(opts.concurrency);
    (opts.verify, opts.resume) = (flags.verify, flags.resume);
    let words = IngestWords {
        wrote: "written",
        same: "label and size",
        items: "rows",
    };
    run_ingest(src, to, opts.verify, words, |progress| {
        cql::ingest(&opts, progress)
    })
}
