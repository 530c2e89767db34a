//! The agent's metrics: lock-free counters and gauges, a read-latency
//! histogram, the Prometheus text rendering, and a tiny HTTP endpoint.
//!
//! The engine thread updates the atomics; the HTTP thread and `granary
//! status` read them. Nothing here blocks the data path.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

/// Upper bounds (seconds) of the read-latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// A cumulative histogram over [`LATENCY_BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Approximate quantile (upper bound of the bucket holding it), seconds.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let target = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= target {
                return Some(LATENCY_BUCKETS[i]);
            }
        }
        Some(f64::INFINITY)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cum += b.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", LATENCY_BUCKETS[i]);
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Every metric the agent exports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Samples handed to loaders (counted once per batch publication).
    pub samples_served: AtomicU64,
    /// Bytes handed to loaders.
    pub bytes_served: AtomicU64,
    /// Batches published.
    pub batches_served: AtomicU64,
    /// Sample lookups that found the sample in the arena.
    pub cache_hits: AtomicU64,
    /// Sample lookups that needed a read from the source.
    pub cache_misses: AtomicU64,
    /// Reads submitted to the source.
    pub reads_submitted: AtomicU64,
    /// Reads that failed after retries.
    pub read_errors: AtomicU64,
    /// Reads retried.
    pub read_retries: AtomicU64,
    /// Samples moved ahead of late ones (`order = "relaxed"`).
    pub relaxed_swaps: AtomicU64,
    /// Reads currently in flight (gauge).
    pub reads_in_flight: AtomicU64,
    /// Bytes read from the source.
    pub bytes_read: AtomicU64,
    /// Read latency.
    pub read_latency: Histogram,
    /// Nanoseconds loaders spent with an empty ready ring while their next batch was not ready.
    pub loader_wait_ns: AtomicU64,
    /// Arena bytes free (gauge).
    pub arena_free: AtomicU64,
    /// Arena bytes cached and unpinned (gauge).
    pub arena_cached: AtomicU64,
    /// Arena bytes pinned by published batches (gauge).
    pub arena_pinned: AtomicU64,
    /// Arena bytes reserved for reads in flight (gauge).
    pub arena_in_flight: AtomicU64,
    /// Arena size (gauge).
    pub arena_size: AtomicU64,
    /// Sessions open (gauge).
    pub sessions_open: AtomicU64,
    /// Sessions opened since start.
    pub sessions_opened: AtomicU64,
    /// Protocol violations detected.
    pub violations: AtomicU64,
    /// Sessions fenced.
    pub sessions_fenced: AtomicU64,
    /// Sessions ended because their loader went silent.
    pub sessions_timed_out: AtomicU64,
    /// Connections refused by the credential allowlist.
    pub connections_refused: AtomicU64,
    /// Loaders that went away with batches on loan.
    pub loaders_lost: AtomicU64,
    /// Per (dataset, epoch): samples found in the arena / read from the source
    /// when a session first needed them. Bounded by datasets × epochs used.
    pub epochs: Mutex<BTreeMap<(String, u32), EpochCounts>>,
    /// Per dataset: whether it serves, and its samples that failed for good.
    pub datasets: Mutex<BTreeMap<String, DatasetHealth>>,
}

/// How one dataset is doing.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DatasetHealth {
    /// `"fs"`, `"s3"`, `"cql"`.
    pub kind: &'static str,
    /// Whether its catalog is loaded and it serves.
    pub ready: bool,
    /// Attempts made to load its catalog.
    pub load_attempts: u64,
    /// Sample reads that failed for good.
    pub read_errors: u64,
}

/// Hits and misses of one epoch of one dataset, over all sessions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EpochCounts {
    /// Samples present in the arena (or already being read) when needed.
    pub hits: u64,
    /// Samples that had to be read from the source.
    pub misses: u64,
}

/// A label value with `\` and `"` escaped, as the text format wants.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl Metrics {
    /// Cache hit ratio so far (0 when nothing was looked up).
    pub fn hit_ratio(&self) -> f64 {
        let h = load(&self.cache_hits) as f64;
        let m = load(&self.cache_misses) as f64;
        if h + m == 0.0 {
            0.0
        } else {
            h / (h + m)
        }
    }

    /// Adds per-epoch lookups for a dataset.
    pub fn count_epoch(&self, dataset: &str, epoch: u32, hits: u64, misses: u64) {
        if let Ok(mut m) = self.epochs.lock() {
            let e = m.entry((dataset.to_string(), epoch)).or_default();
            e.hits += hits;
            e.misses += misses;
        }
    }

    /// Updates a dataset's health entry.
    pub fn dataset_health(&self, dataset: &str, update: impl FnOnce(&mut DatasetHealth)) {
        if let Ok(mut m) = self.datasets.lock() {
            update(m.entry(dataset.to_string()).or_default());
        }
    }

    /// Hit ratio per epoch of `dataset`, in epoch order.
    pub fn epoch_hit_ratios(&self, dataset: &str) -> Vec<(u32, f64)> {
        let Ok(m) = self.epochs.lock() else {
            return Vec::new();
        };
        m.iter()
            .filter(|((d, _), _)| d == dataset)
            .map(|((_, e), c)| {
                let total = c.hits + c.misses;
                (
                    *e,
                    if total == 0 {
                        0.0
                    } else {
                        c.hits as f64 / total as f64
                    },
                )
            })
            .collect()
    }

    /// Renders the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(4096);
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut s,
            "granary_samples_served_total",
            "Samples handed to loaders.",
            load(&self.samples_served),
        );
        counter(
            &mut s,
            "granary_bytes_served_total",
            "Bytes handed to loaders.",
            load(&self.bytes_served),
        );
        counter(
            &mut s,
            "granary_batches_served_total",
            "Batches published to loaders.",
            load(&self.batches_served),
        );
        let _ = writeln!(
            s,
            "# HELP granary_cache_lookups_total Sample lookups by result and tier.\n# TYPE granary_cache_lookups_total counter\n\
             granary_cache_lookups_total{{result=\"hit\",tier=\"arena\"}} {}\n\
             granary_cache_lookups_total{{result=\"miss\",tier=\"store\"}} {}",
            load(&self.cache_hits),
            load(&self.cache_misses)
        );
        counter(
            &mut s,
            "granary_reads_total",
            "Reads submitted to the source.",
            load(&self.reads_submitted),
        );
        counter(
            &mut s,
            "granary_read_errors_total",
            "Reads that failed after retries.",
            load(&self.read_errors),
        );
        counter(
            &mut s,
            "granary_read_retries_total",
            "Reads retried.",
            load(&self.read_retries),
        );
        counter(
            &mut s,
            "granary_relaxed_swaps_total",
            "Samples delivered ahead of a late one (order = relaxed).",
            load(&self.relaxed_swaps),
        );
        counter(
            &mut s,
            "granary_read_bytes_total",
            "Bytes read from the source.",
            load(&self.bytes_read),
        );
        gauge(
            &mut s,
            "granary_reads_in_flight",
            "Reads in flight.",
            load(&self.reads_in_flight),
        );
        self.read_latency.render(
            &mut s,
            "granary_read_latency_seconds",
            "Source read latency.",
        );
        let _ = writeln!(
            s,
            "# HELP granary_loader_wait_seconds_total Time loaders waited for a batch that was not ready.\n# TYPE granary_loader_wait_seconds_total counter\ngranary_loader_wait_seconds_total {}",
            load(&self.loader_wait_ns) as f64 / 1e9
        );
        let _ = writeln!(
            s,
            "# HELP granary_arena_bytes Arena bytes by state.\n# TYPE granary_arena_bytes gauge\n\
             granary_arena_bytes{{state=\"free\"}} {}\n\
             granary_arena_bytes{{state=\"cached\"}} {}\n\
             granary_arena_bytes{{state=\"pinned\"}} {}\n\
             granary_arena_bytes{{state=\"in_flight\"}} {}",
            load(&self.arena_free),
            load(&self.arena_cached),
            load(&self.arena_pinned),
            load(&self.arena_in_flight)
        );
        gauge(
            &mut s,
            "granary_arena_size_bytes",
            "Arena size.",
            load(&self.arena_size),
        );
        gauge(
            &mut s,
            "granary_sessions_open",
            "Sessions open.",
            load(&self.sessions_open),
        );
        counter(
            &mut s,
            "granary_sessions_opened_total",
            "Sessions opened.",
            load(&self.sessions_opened),
        );
        counter(
            &mut s,
            "granary_violations_total",
            "Protocol violations by loaders.",
            load(&self.violations),
        );
        counter(
            &mut s,
            "granary_sessions_fenced_total",
            "Sessions fenced after a violation.",
            load(&self.sessions_fenced),
        );
        counter(
            &mut s,
            "granary_sessions_timed_out_total",
            "Sessions ended because their loader neither released nor beat its heartbeat for sessions.client_timeout_ms.",
            load(&self.sessions_timed_out),
        );
        counter(
            &mut s,
            "granary_connections_refused_total",
            "Connections refused by the allowlist.",
            load(&self.connections_refused),
        );
        counter(
            &mut s,
            "granary_loaders_lost_total",
            "Loaders that disappeared with batches on loan.",
            load(&self.loaders_lost),
        );
        if let Ok(m) = self.datasets.lock() {
            let _ = writeln!(
                s,
                "# HELP granary_dataset_ready Whether a dataset's catalog is loaded and it serves (1) or its store is unavailable (0).\n# TYPE granary_dataset_ready gauge"
            );
            for (d, h) in m.iter() {
                let d = escape_label(d);
                let _ = writeln!(
                    s,
                    "granary_dataset_ready{{dataset=\"{d}\",kind=\"{}\"}} {}",
                    h.kind,
                    u8::from(h.ready)
                );
            }
            let _ = writeln!(
                s,
                "# HELP granary_dataset_load_attempts_total Attempts to load a dataset's catalog.\n# TYPE granary_dataset_load_attempts_total counter"
            );
            for (d, h) in m.iter() {
                let d = escape_label(d);
                let _ = writeln!(
                    s,
                    "granary_dataset_load_attempts_total{{dataset=\"{d}\"}} {}",
                    h.load_attempts
                );
            }
            let _ = writeln!(
                s,
                "# HELP granary_dataset_read_errors_total Sample reads of a dataset that failed for good.\n# TYPE granary_dataset_read_errors_total counter"
            );
            for (d, h) in m.iter() {
                let d = escape_label(d);
                let _ = writeln!(
                    s,
                    "granary_dataset_read_errors_total{{dataset=\"{d}\"}} {}",
                    h.read_errors
                );
            }
        }
        if let Ok(m) = self.epochs.lock() {
            let _ = writeln!(
                s,
                "# HELP granary_epoch_lookups_total Samples needed per dataset and epoch, by where they were found.\n# TYPE granary_epoch_lookups_total counter"
            );
            for ((d, e), c) in m.iter() {
                let d = escape_label(d);
                let _ = writeln!(s, "granary_epoch_lookups_total{{dataset=\"{d}\",epoch=\"{e}\",result=\"hit\"}} {}", c.hits);
                let _ = writeln!(s, "granary_epoch_lookups_total{{dataset=\"{d}\",epoch=\"{e}\",result=\"miss\"}} {}", c.misses);
            }
        }
        s
    }
}

/// A running metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `addr` from a background thread.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("granary-metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let _ = serve(stream, &metrics);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain headers (bounded).
    let mut line = String::new();
    for _ in 0..100 {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" && (path == "/metrics" || path == "/") {
        ("200 OK", "text/plain; version=0.0.4", metrics.render())
    } else {
        (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics\n".to_string(),
        )
    };
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

/// Fetches `/metrics` from a running agent (used by `granary status`).
pub fn scrape(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    use std::io::Read;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    match resp.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(io::Error::other("metrics endpoint answered with an error")),
    }
}

/// Parses Prometheus text into (series, value) pairs, skipping comments.
pub fn parse_text(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_and_render() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.observe(Duration::from_micros(80));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(30));
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), Some(0.000_1));
        assert_eq!(h.quantile(0.99), Some(0.05));
        let mut s = String::new();
        h.render(&mut s, "x", "y");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 100"));
    }

    #[test]
    fn endpoint_serves_prometheus_text() {
        let m = Arc::new(Metrics::default());
        m.samples_served.store(42, Ordering::Relaxed);
        m.cache_hits.store(3, Ordering::Relaxed);
        m.cache_misses.store(1, Ordering::Relaxed);
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        let body = scrape(srv.addr(), Duration::from_secs(5)).unwrap();
        let series = parse_text(&body);
        let get = |k: &str| series.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("granary_samples_served_total"), Some(42.0));
        assert_eq!(
            get("granary_cache_lookups_total{result=\"hit\",tier=\"arena\"}"),
            Some(3.0)
        );
        assert!((m.hit_ratio() - 0.75).abs() < 1e-9);
    }
}
