//! `granary`: the operator CLI.
//!
//! * `granary status [--metrics ADDR]`: the agent's counters as a table.
//! * `granary demo [--dir DIR] [--files N] [--epochs E]`: the quickstart:
//!   generate a synthetic dataset, start `granaryd` on it, run two loaders
//!   (two ranks of one job) through libgranary, verify every byte, summarise.

use granary::{Client, SessionOptions};
use granary_agent::metrics::{parse_text, scrape};
use granary_agent::progress::ProgressBar;
use granary_agent::synth::{self, SynthSpec};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: granary status [--metrics ADDR]
       granary demo [--dir DIR] [--files N] [--epochs E]";

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
    let sa = addr
        .parse()
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
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
    let files: u64 = flag(args, "--files").unwrap_or("20000").parse().map_err(|e| format!("--files: {e}"))?;
    let epochs: u32 = flag(args, "--epochs").unwrap_or("3").parse().map_err(|e| format!("--epochs: {e}"))?;
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
        if summary.skipped { "already there" } else { "generated" }
    );
    let sock = std::env::temp_dir().join(format!("granary-demo-{}.sock", std::process::id()));
    let arena_mb = (summary.bytes / (1 << 20) + 64).next_multiple_of(2).max(128);
    let config = dir.join("granaryd-demo.toml");
    std::fs::write(
        &config,
        format!(
            "[arena]\nsize = \"{arena_mb}MiB\"\nhugepages = \"try\"\n\n[socket]\npath = \"{}\"\n\n[metrics]\naddress = \"127.0.0.1:0\"\n\n[[dataset]]\nname = \"synth\"\nroot = \"{}\"\n",
            sock.display(),
            std::fs::canonicalize(&data).map_err(|e| e.to_string())?.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let granaryd = sibling("granaryd")?;
    let _agent = Agent(
        Command::new(&granaryd)
            .args(["run", "--config"])
            .arg(&config)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", granaryd.display()))?,
    );
    let t0 = Instant::now();
    while !sock.exists() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("granaryd did not open its socket within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("granaryd up in {:.2} s; 2 loaders x {epochs} epochs, batch 64", t0.elapsed().as_secs_f64());
    let start = Instant::now();
    let loaders: Vec<_> = (0..2)
        .map(|rank| {
            let sock = sock.clone();
            std::thread::spawn(move || load(&sock, rank, epochs))
        })
        .collect();
    let mut per_epoch = vec![(0u64, 0u64, Duration::ZERO); epochs as usize];
    let mut first = Duration::MAX;
    let mut bad = 0u64;
    for l in loaders {
        let r = l.join().map_err(|_| "a loader panicked".to_string())??;
        first = first.min(r.first_batch);
        bad += r.bad;
        for (i, e) in r.epochs.iter().enumerate() {
            per_epoch[i].0 += e.0;
            per_epoch[i].1 += e.1;
            per_epoch[i].2 = per_epoch[i].2.max(e.2);
        }
    }
    let total = start.elapsed();
    let (n, bytes): (u64, u64) = per_epoch.iter().fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
    println!("first-batch latency: {:.1} ms", first.as_secs_f64() * 1e3);
    for (i, (s, b, d)) in per_epoch.iter().enumerate() {
        println!(
            "epoch {i}: {s} samples, {:.0} samples/s, {:.0} MB/s",
            *s as f64 / d.as_secs_f64(),
            *b as f64 / 1e6 / d.as_secs_f64()
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
    if bad > 0 || n != expected {
        return Err(format!("verification FAILED: {bad} bad samples, {n} delivered of {expected}"));
    }
    println!("verification: OK, every byte of {n} samples checked, each sample once per epoch");
    Ok(())
}

struct LoaderResult {
    first_batch: Duration,
    bad: u64,
    /// Per epoch: samples, bytes, time from the epoch's first batch request to its last batch.
    epochs: Vec<(u64, u64, Duration)>,
}

fn load(sock: &Path, rank: u32, epochs: u32) -> Result<LoaderResult, String> {
    let client = Client::connect(sock).map_err(|e| e.to_string())?;
    let mut o = SessionOptions::new("synth");
    o.seed = 2026;
    o.rank = rank;
    o.world_size = 2;
    o.batch_size = 64;
    o.epoch_count = epochs;
    let t0 = Instant::now();
    let mut s = client.open_session(&o).map_err(|e| e.to_string())?;
    let mut r = LoaderResult {
        first_batch: Duration::ZERO,
        bad: 0,
        epochs: vec![(0, 0, Duration::ZERO); epochs as usize],
    };
    let mut epoch_start = Instant::now();
    let mut first = true;
    loop {
        let b = match s.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => b,
            Err(e) if e.code() == granary::ErrorCode::EndOfStream => break,
            Err(e) => return Err(format!("rank {rank}: {e}")),
        };
        if first {
            r.first_batch = t0.elapsed();
            first = false;
        }
        let e = &mut r.epochs[b.epoch() as usize];
        for smp in b.samples() {
            let bytes = smp.to_vec();
            match synth::verify_sample(&bytes) {
                Ok(info) if info.file_id == smp.id() && info.class as i32 == smp.label() => {
                    e.0 += 1;
                    e.1 += bytes.len() as u64;
                }
                _ => r.bad += 1,
            }
        }
        let end = b.is_end_of_epoch();
        let epoch = b.epoch() as usize;
        s.release(b).map_err(|e| e.to_string())?;
        if end {
            r.epochs[epoch].2 = epoch_start.elapsed();
            epoch_start = Instant::now();
        }
    }
    Ok(r)
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
