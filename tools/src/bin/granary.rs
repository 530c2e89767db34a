//! `granary`: the operator CLI.
//!
//! * `granary status [--metrics ADDR]`: the agent's counters as a table.
//! * `granary demo [--dir DIR] [--files N] [--epochs E]`: the quickstart:
//!   generate a synthetic dataset, start `granaryd` on it, run two loaders
//!   (two ranks of one job) through libgranary, verify every byte, summarise.
//! * `granary ingest SRC_DIR --to s3://BUCKET/PREFIX [--endpoint URL]
//!   [--region R] [--concurrency N] [--verify] [--resume]`: upload a dataset
//!   folder to S3 (credentials from `AWS_ACCESS_KEY_ID` /
//!   `AWS_SECRET_ACCESS_KEY`); see `docs/s3.md`. `--to gs://BUCKET/PREFIX`
//!   and `--to az://CONTAINER/PREFIX [--account A]` (with `--endpoint`,
//!   `--anonymous`) upload to Google Cloud Storage and Azure Blob Storage
//!   through their credential chains; see `docs/gcs-azure.md`.
//! * `granary ingest SRC_DIR --to cql://HOST:PORT[,HOST:PORT]/KEYSPACE
//!   [--data-table T] [--metadata-table M] [--username U] [--replication R]
//!   [--tls] [--tls-ca-file F] [--concurrency N] [--verify] [--resume]`:
//!   write a dataset folder into ScyllaDB/Cassandra tables (password from
//!   `GRANARY_CQL_PASSWORD`); see `docs/scylla.md`.
//! * `granary secret new PATH [--force]`: a fresh job secret for
//!   `peers.secret_file`, mode 0600 (`-`: to standard output); see
//!   `docs/configuration.md`.

use clap::{Args, Parser, Subcommand};
use granary_agent::metrics::{parse_text, scrape};
use granary_tools::ingest::{IngestError, IngestReport, Phase};
use granary_tools::progress::ProgressBar;
use granary_tools::synth::{self, SynthSpec};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

/// The Granary operator CLI: the agent's counters, the quickstart demo,
/// the ingest of a dataset folder into S3 or CQL tables, and job secrets
/// for the peer tier.
#[derive(Debug, Parser)]
#[command(name = "granary", version = granary_agent::build_version!(), about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print the agent's counters as a table.
    Status {
        /// The agent's metrics endpoint (`[metrics] address`).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
        metrics: String,
        /// Only why each rank's training loop waits: its verdict (store,
        /// peer, arena, loader_cpu, compute, idle), wait shares and
        /// quantiles.
        #[arg(long)]
        why: bool,
    },
    /// A live view of `status --why` and where samples come from,
    /// redrawn every interval until interrupted.
    Top {
        /// The agent's metrics endpoint (`[metrics] address`).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
        metrics: String,
        /// Seconds between redraws.
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        interval: f64,
        /// Stop after N redraws (default: until interrupted).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// The quickstart: generate a synthetic dataset, start granaryd on it,
    /// run two C loaders (ranks 0 and 1 of one job), verify every byte,
    /// summarise.
    Demo {
        /// Where the dataset and the agent's configuration go.
        #[arg(long, value_name = "DIR", default_value = ".granary-data")]
        dir: PathBuf,
        /// Files in the synthetic dataset.
        #[arg(long, value_name = "N", default_value_t = 20_000)]
        files: u64,
        /// Epochs each loader reads.
        #[arg(long, value_name = "E", default_value_t = 3)]
        epochs: u32,
    },
    /// Copy a dataset folder into an S3 bucket (credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; see docs/s3.md) or into
    /// CQL tables (password from GRANARY_CQL_PASSWORD; see docs/scylla.md).
    Ingest(Box<IngestArgs>),
    /// The job secret peers authenticate each other with.
    #[command(subcommand)]
    Secret(SecretCmd),
}

#[derive(Debug, Subcommand)]
enum SecretCmd {
    /// Write a fresh secret (32 random bytes as 64 hex digits) to PATH with
    /// mode 0600, for peers.secret_file; `-` prints it instead.
    New {
        /// The file to create, or `-` for standard output.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Replace PATH if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
struct IngestArgs {
    /// The dataset folder (class folders of files, as the fs source reads).
    #[arg(value_name = "SRC_DIR")]
    src: String,
    /// s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or
    /// cql://HOST:PORT[,HOST:PORT...]/KEYSPACE; with --format webdataset,
    /// mds or parquet, also a local folder (shards go to folders and s3://
    /// only).
    #[arg(long, value_name = "URL")]
    to: String,
    /// files: one object per file; webdataset: tar shards of --shard-size
    /// (each file one sample: the file and KEY.cls with its label); mds:
    /// MDS shards and index.json (columns key, label, sample); parquet:
    /// Parquet files (columns key, label, sample; one row per page,
    /// uncompressed, PLAIN); see docs/formats.md.
    #[arg(long, value_name = "FORMAT", default_value = "files",
          value_parser = ["files", "webdataset", "mds", "parquet"])]
    format: String,
    /// webdataset, mds, parquet: the most bytes of a shard (a larger sample
    /// gets a shard of its own).
    #[arg(long, value_name = "BYTES", default_value_t = granary_tools::ingest::shards::DEFAULT_SHARD_SIZE,
          value_parser = clap::value_parser!(u64).range(1024..))]
    shard_size: u64,
    /// webdataset: also write shardindex.json, the wids shard index of the
    /// shards (what `widsindex create` writes), for wids.ShardListDataset;
    /// a Granary dataset then takes its shards from it.
    #[arg(long)]
    wids_index: bool,
    /// Files written at once (default: the store's own).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: Option<u64>,
    /// Read everything back afterwards and compare byte for byte.
    #[arg(long)]
    verify: bool,
    /// Skip files the store already holds as they are.
    #[arg(long)]
    resume: bool,
    /// S3, GCS, Azure: the endpoint URL (plain http:// allowed when given
    /// here; Azure: the account's blob service URL).
    #[arg(long, value_name = "URL", help_heading = "S3, GCS, Azure")]
    endpoint: Option<String>,
    /// Azure: the storage account (default: AZURE_STORAGE_ACCOUNT_NAME).
    #[arg(long, value_name = "A", help_heading = "S3, GCS, Azure")]
    account: Option<String>,
    /// GCS, Azure: unsigned requests (public buckets, emulators).
    #[arg(long, help_heading = "S3, GCS, Azure")]
    anonymous: bool,
    /// S3: the region.
    #[arg(long, value_name = "R", help_heading = "S3")]
    region: Option<String>,
    /// CQL: the data table.
    #[arg(long, value_name = "T", help_heading = "CQL")]
    data_table: Option<String>,
    /// CQL: the metadata table.
    #[arg(long, value_name = "M", help_heading = "CQL")]
    metadata_table: Option<String>,
    /// CQL: the user name (password from GRANARY_CQL_PASSWORD).
    #[arg(long, value_name = "U", help_heading = "CQL")]
    username: Option<String>,
    /// CQL: the keyspace's replication, N or DC:N,...
    #[arg(long, value_name = "R", help_heading = "CQL")]
    replication: Option<String>,
    /// CQL: connect with TLS.
    #[arg(long, help_heading = "CQL")]
    tls: bool,
    /// CQL: the CA certificates to trust (implies --tls).
    #[arg(long, value_name = "FILE", help_heading = "CQL")]
    tls_ca_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Status { metrics, why } => status(&metrics, why),
        Cmd::Top {
            metrics,
            interval,
            count,
        } => top(&metrics, interval, count),
        Cmd::Demo { dir, files, epochs } => demo(dir, files, epochs),
        Cmd::Ingest(args) => ingest(&args),
        Cmd::Secret(SecretCmd::New { path, force }) => secret_new(&path, force),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("granary: {e}");
            ExitCode::FAILURE
        }
    }
}

fn secret_new(path: &std::path::Path, force: bool) -> Result<(), String> {
    if path.as_os_str() == "-" {
        let line = granary_tools::secret::new_line().map_err(|e| e.to_string())?;
        print!("{line}");
        return Ok(());
    }
    granary_tools::secret::write_new(path, force).map_err(|e| format!("{}: {e}", path.display()))
}

fn scrape_series(addr: &str) -> Result<Vec<(String, f64)>, String> {
    let sa = addr.parse().map_err(|e| format!("--metrics {addr}: {e}"))?;
    let body = scrape(sa, Duration::from_secs(3))
        .map_err(|e| format!("cannot reach the agent's metrics at {addr}: {e}"))?;
    Ok(parse_text(&body))
}

fn status(addr: &str, why: bool) -> Result<(), String> {
    let series = scrape_series(addr)?;
    if why {
        print!("{}", granary_tools::why::render(&series));
        return Ok(());
    }
    print!("{}", tiers_and_peers(&series));
    print!("{}", granary_tools::why::render(&series));
    println!();
    println!("{:<60} {:>16}", "metric", "value");
    for (k, v) in series {
        if k.contains("_bucket") {
            continue;
        }
        println!("{k:<60} {v:>16}");
    }
    Ok(())
}

fn top(addr: &str, interval: f64, count: Option<u64>) -> Result<(), String> {
    if !(interval.is_finite() && interval > 0.0) {
        return Err(format!(
            "--interval {interval}: must be a positive number of seconds"
        ));
    }
    let mut drawn = 0u64;
    loop {
        let screen = match scrape_series(addr) {
            Ok(series) => format!(
                "{}\n{}",
                tiers_and_peers(&series),
                granary_tools::why::render(&series)
            ),
            Err(e) => format!("{e}\n"),
        };
        // Home, clear, then the screen: one redraw per interval.
        print!("\x1b[H\x1b[2Jgranary top: {addr}, every {interval} s (Ctrl-C to quit)\n\n{screen}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        drawn += 1;
        if count.is_some_and(|n| drawn >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(interval));
    }
}

/// The sum of the series of metric `name` whose labels contain `with`.
fn value(series: &[(String, f64)], name: &str, with: &str) -> f64 {
    series
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(with))
        .map(|(_, v)| v)
        .sum()
}

/// Where samples came from (arena, peers, store) and, with peers, each
/// peer's connection, transport (tcp, rdma, rdma-fallback) and round
/// trip.
fn tiers_and_peers(series: &[(String, f64)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let tiers: Vec<(&str, f64)> = ["arena", "peer", "store"]
        .into_iter()
        .map(|t| {
            let with = format!("tier=\"{t}\"");
            (t, value(series, "granary_tier_samples_total", &with))
        })
        .collect();
    let total: f64 = tiers.iter().map(|t| t.1).sum();
    if total > 0.0 {
        let _ = writeln!(out, "samples by tier:");
        for (t, n) in &tiers {
            let _ = writeln!(out, "  {t:<8} {n:>14} ({:.1} %)", 100.0 * n / total);
        }
    }
    let mut peers: Vec<(String, f64)> = series
        .iter()
        .filter(|(k, _)| k.starts_with("granary_peer_up{"))
        .map(|(k, v)| {
            let id = k
                .split("peer=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?");
            (id.to_string(), *v)
        })
        .collect();
    if peers.is_empty() {
        return out;
    }
    peers.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(
        out,
        "peers: {} asked, {} served, {} CRC failures, {} hedged",
        value(series, "granary_peer_gets_total", ""),
        value(series, "granary_peer_served_total", ""),
        value(series, "granary_peer_crc_failures_total", ""),
        value(series, "granary_peer_hedged_total", ""),
    );
    for (id, up) in peers {
        let with = format!("peer=\"{id}\"");
        let n = value(series, "granary_peer_rtt_seconds_count", &with);
        let rtt = if n > 0.0 {
            format!(
                "mean round trip {:.3} ms",
                1e3 * value(series, "granary_peer_rtt_seconds_sum", &with) / n
            )
        } else {
            "no round trip measured yet".to_string()
        };
        let state = if up > 0.0 { "up" } else { "down" };
        // The transport series that reads 1 (granary_peer_transport).
        let transport = series
            .iter()
            .filter(|(k, v)| {
                *v > 0.0 && k.starts_with("granary_peer_transport{") && k.contains(&with)
            })
            .find_map(|(k, _)| {
                k.split("transport=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
            })
            .unwrap_or("-");
        let _ = writeln!(out, "  {id:<20} {state:<5} {transport:<13} {rtt}");
    }
    out.push('\n');
    out
}

/// The demo's agent and its socket: stopped (SIGTERM) when dropped, and
/// the files that would keep its arena for a warm restart removed (the
/// next demo's socket is another, so they would only hold memory).
struct Agent(Child, PathBuf);

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
        granary_agent::warm::Files::for_socket(&self.1).remove();
    }
}

fn demo(dir: PathBuf, files: u64, epochs: u32) -> Result<(), String> {
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
        sock.clone(),
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
    let epoch_reads = epoch_source_reads(&body, "synth");
    let (n, bytes): (u64, u64) = per_epoch.iter().fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
    let series = parse_text(&body);
    let metric = |name: &str| series.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    println!("first-batch latency: {first_ms:.1} ms");
    // Source reads per epoch: samples of the epoch that no session had
    // read or asked for before. The two ranks do not cross epoch
    // boundaries together, so the rank ahead also reads samples the other
    // one needs in its current epoch: an epoch's reads are not all its own.
    for (i, (s, b, secs)) in per_epoch.iter().enumerate() {
        let reads = epoch_reads
            .get(&(i as u64))
            .map_or("source reads n/a".to_string(), |r| {
                format!("{r:.0} read from the source")
            });
        println!(
            "epoch {i}: {s} samples, {:.0} samples/s, {:.0} MB/s, {reads}",
            *s as f64 / secs.max(1e-9),
            *b as f64 / 1e6 / secs.max(1e-9)
        );
    }
    if let (Some(reads), Some(size)) = (
        metric("granary_reads_total"),
        metric("granary_arena_size_bytes"),
    ) {
        let arena = n as f64 - reads;
        println!(
            "source: {reads:.0} reads for {files} files x {epochs} epochs{}; {:.0} of {n} samples ({:.1} %) served from the arena without a read of their own (arena {:.0} MiB)",
            if reads as u64 == files {
                " (each file read once)"
            } else {
                ""
            },
            arena.max(0.0),
            100.0 * arena.max(0.0) / (n as f64).max(1.0),
            size / 1048576.0
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

/// Samples of each epoch of `dataset` that had to be read from the source
/// (`granary_epoch_lookups_total{result="miss"}`), by epoch.
fn epoch_source_reads(body: &str, dataset: &str) -> std::collections::BTreeMap<u64, f64> {
    let mut m = std::collections::BTreeMap::new();
    let prefix = format!("granary_epoch_lookups_total{{dataset=\"{dataset}\",epoch=\"");
    for (k, v) in parse_text(body) {
        let Some((epoch, tail)) = k.strip_prefix(&prefix).and_then(|r| r.split_once('"')) else {
            continue;
        };
        if let (Ok(epoch), true) = (epoch.parse::<u64>(), tail.contains("\"miss\"")) {
            *m.entry(epoch).or_insert(0.0) += v;
        }
    }
    m
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

fn ingest(args: &IngestArgs) -> Result<(), String> {
    use granary_agent::source::s3::{AzureSettings, GcsSettings, StoreKind};
    use granary_tools::ingest::{self, IngestOptions};
    let (src, to) = (args.src.as_str(), args.to.as_str());
    if args.wids_index && args.format != "webdataset" {
        return Err("--wids-index is for --format webdataset".into());
    }
    // Shards are written to a folder: `--to` itself, or one that is then
    // uploaded like any folder.
    let mut staging = None;
    let src = if args.format != "files" {
        let remote = to.starts_with("s3://");
        if to.contains("://") && !remote {
            return Err(format!(
                "--format {} writes to a folder or s3://, not CQL tables, gs:// or az://",
                args.format
            ));
        }
        let dir = if remote {
            let t = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
            let p = t.path().to_path_buf();
            staging = Some(t);
            p
        } else {
            PathBuf::from(to)
        };
        let write = match args.format.as_str() {
            "mds" => ingest::mds::write_mds,
            "parquet" => ingest::parquet::write_parquet,
            _ => ingest::shards::write_webdataset,
        };
        let w = write(Path::new(src), &dir, args.shard_size)
            .map_err(|e| format!("ingest {src} as {}: {e}", args.format))?;
        if args.wids_index {
            ingest::shards::write_wids_index(&dir, &w)
                .map_err(|e| format!("write the wids index of {}: {e}", dir.display()))?;
        }
        println!(
            "{}: {} samples, {:.1} MB in {} shards in {}",
            args.format,
            w.samples,
            w.bytes as f64 / 1e6,
            w.shards.len(),
            if remote {
                "a temporary folder".to_owned()
            } else {
                dir.display().to_string()
            }
        );
        if !remote {
            return Ok(());
        }
        dir.display().to_string()
    } else {
        src.to_owned()
    };
    let src = src.as_str();
    if to.starts_with("cql://") {
        return ingest_cql(args);
    }
    let (kind, bucket, prefix) = ingest::parse_store_url(to).map_err(|e| format!("--to: {e}"))?;
    let plain_http = args
        .endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"));
    let settings: granary_agent::source::s3::StoreSettings = match kind {
        StoreKind::S3 => s3_settings(args, bucket).into(),
        StoreKind::Gcs => {
            let mut s = GcsSettings::new(bucket);
            s.endpoint.clone_from(&args.endpoint);
            s.allow_http = plain_http;
            s.anonymous = args.anonymous;
            s.into()
        }
        StoreKind::Azure => {
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            let account = args
                .account
                .clone()
                .or_else(|| env("AZURE_STORAGE_ACCOUNT_NAME"))
                .ok_or(
                    "az://: name the storage account with --account or AZURE_STORAGE_ACCOUNT_NAME",
                )?;
            let mut s = AzureSettings::new(account, bucket);
            s.endpoint.clone_from(&args.endpoint);
            s.allow_http = plain_http;
            s.anonymous = args.anonymous;
            s.into()
        }
    };
    let mut opts = IngestOptions::new(src, settings, &prefix);
    opts.concurrency = concurrency(args).unwrap_or(opts.concurrency);
    (opts.verify, opts.resume) = (args.verify, args.resume);
    let words = IngestWords {
        wrote: "uploaded",
        same: "size",
        items: "objects",
    };
    let r = run_ingest(src, to, opts.verify, words, |progress| {
        ingest::ingest(&opts, progress)
    });
    drop(staging);
    r
}

/// The S3 settings of `granary ingest --to s3://…`.
fn s3_settings(args: &IngestArgs, bucket: String) -> granary_agent::source::s3::S3Settings {
    use granary_agent::source::s3::S3Settings;
    let mut settings = S3Settings::new(bucket);
    if let Some(e) = &args.endpoint {
        // An endpoint given on the command line is used as given, plain
        // HTTP included.
        settings.allow_http = e.starts_with("http://");
        settings.endpoint = Some(e.clone());
    }
    settings.region = args.region.clone();
    settings.fill_from_env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    if settings
        .endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
    {
        settings.allow_http = true;
    }
    settings
}

/// `--concurrency`, when given.
fn concurrency(args: &IngestArgs) -> Option<usize> {
    args.concurrency
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
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

fn ingest_cql(args: &IngestArgs) -> Result<(), String> {
    use granary_agent::source::cql::CqlSettings;
    use granary_tools::ingest::cql::{self, CqlIngestOptions, Replication};
    let (src, to) = (args.src.as_str(), args.to.as_str());
    let (hosts, keyspace) = cql::parse_cql_url(to).map_err(|e| format!("--to: {e}"))?;
    let mut settings = CqlSettings::new(hosts, keyspace);
    if let Some(t) = &args.data_table {
        settings.data_table = t.clone();
    }
    if let Some(t) = &args.metadata_table {
        settings.metadata_table = t.clone();
    }
    settings.username = args.username.clone();
    settings.fill_from_env(|k| std::env::var(k).ok());
    settings.tls = args.tls;
    if let Some(f) = &args.tls_ca_file {
        settings.tls = true;
        settings.tls_ca_file = Some(f.clone());
    }
    let mut opts = CqlIngestOptions::new(src, settings);
    if let Some(r) = &args.replication {
        opts.replication = Replication::parse(r).map_err(|e| format!("--replication: {e}"))?;
    }
    opts.concurrency = concurrency(args).unwrap_or(opts.concurrency);
    (opts.verify, opts.resume) = (args.verify, args.resume);
    let words = IngestWords {
        wrote: "written",
        same: "label and size",
        items: "rows",
    };
    run_ingest(src, to, opts.verify, words, |progress| {
        cql::ingest(&opts, progress)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_tiers_and_peers() {
        let body = "granary_tier_samples_total{tier=\"arena\"} 50\n\
granary_tier_samples_total{tier=\"peer\"} 30\n\
granary_tier_samples_total{tier=\"store\"} 20\n\
granary_peer_gets_total 31\n\
granary_peer_served_total 12\n\
granary_peer_up{peer=\"n1\"} 1\n\
granary_peer_up{peer=\"n2\"} 0\n\
granary_peer_rtt_seconds_sum{peer=\"n1\"} 0.002\n\
granary_peer_rtt_seconds_count{peer=\"n1\"} 4\n\
granary_peer_transport{peer=\"n1\",transport=\"tcp\"} 0\n\
granary_peer_transport{peer=\"n1\",transport=\"rdma-fallback\"} 1\n\
granary_peer_transport{peer=\"n2\",transport=\"tcp\"} 1\n\
granary_peer_transport{peer=\"n2\",transport=\"rdma\"} 0\n";
        let s = tiers_and_peers(&parse_text(body));
        assert!(s.contains("arena") && s.contains("50 (50.0 %)"), "{s}");
        assert!(s.contains("peer ") && s.contains("30 (30.0 %)"), "{s}");
        assert!(s.contains("31 asked, 12 served"), "{s}");
        assert!(
            s.contains("n1") && s.contains("up") && s.contains("0.500 ms"),
            "{s}"
        );
        assert!(s.contains("n2") && s.contains("down"), "{s}");
        let line = |id: &str| s.lines().find(|l| l.contains(id)).unwrap_or("").to_string();
        assert!(line("n1").contains("rdma-fallback"), "{s}");
        assert!(
            line("n2").contains(" tcp ") && !line("n2").contains("rdma"),
            "{s}"
        );
        // Without peer series: tiers only.
        let s = tiers_and_peers(&parse_text(
            "granary_tier_samples_total{tier=\"store\"} 5\n",
        ));
        assert!(s.contains("store") && !s.contains("peers:"), "{s}");
    }
}
