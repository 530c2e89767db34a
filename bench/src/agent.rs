//! A Granary agent run inside the benchmark process: the real engine (arena,
//! io_uring reader, cache, socket, rings) on its own thread, configured from
//! TOML exactly as `granaryd run` would be, with its metrics read back
//! through the Prometheus text the endpoint serves.

use granary_agent::cache::CacheConfig;
use granary_agent::config::Config;
use granary_agent::engine::Engine;
use granary_agent::metrics::{parse_text, Metrics};
use granary_agent::source::s3::S3Settings;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The settings a benchmark varies; everything else keeps its default.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// `arena.size` in bytes (a multiple of 2 MiB).
    pub arena_bytes: u64,
    /// `arena.hugepages`: `off`, `try` or `required`.
    pub hugepages: String,
    /// `prefetch.window_batches`.
    pub window_batches: u32,
    /// `prefetch.initial_window`.
    pub initial_window: u32,
    /// `prefetch.max_inflight_reads`.
    pub max_inflight_reads: u32,
    /// `cache.policy`: `clairvoyant`, `minio` or `lru`.
    pub policy: String,
    /// `sessions.ready_ring_capacity`.
    pub ready_ring_capacity: u32,
    /// `sessions.release_ring_capacity`.
    pub release_ring_capacity: u32,
    /// `[[dataset]]` entries: name and root directory.
    pub datasets: Vec<(String, PathBuf)>,
    /// `dataset[i].direct_io` of those entries: `Some(true)` reads with
    /// `O_DIRECT`, `Some(false)` (what [`AgentSettings::new`] sets) through
    /// the page cache, `None` leaves it unset (the agent's default: by what
    /// the page cache holds).
    pub direct_io: Option<bool>,
    /// `[[dataset]]` entries of `kind = "s3"`.
    pub s3_datasets: Vec<S3Dataset>,
    /// More `key = value` lines for a section (`arena`, `socket`,
    /// `prefetch`, `cache`, `sessions`, `metrics`, `peers`: a `[peers]`
    /// table only when it has lines), as (section, line).
    pub extra: Vec<(String, String)>,
}

/// A `kind = "s3"` dataset of an [`AgentSettings`].
#[derive(Clone, Debug)]
pub struct S3Dataset {
    /// `name`.
    pub name: String,
    /// Endpoint, region, bucket, credentials, `allow_http`, `path_style`,
    /// `request_timeout_ms`, `retries`.
    pub settings: S3Settings,
    /// `prefix`: the folder whose objects are the samples.
    pub prefix: String,
    /// More `key = value` lines for this `[[dataset]]` table.
    pub extra: Vec<String>,
}

impl S3Dataset {
    /// Dataset `name`: the objects under `prefix` of the bucket that
    /// `settings` reach, every request given 30 s (a benchmark's delay proxy
    /// can hold one for long), no extra lines.
    pub fn new(name: &str, mut settings: S3Settings, prefix: &str) -> S3Dataset {
        settings.request_timeout = Duration::from_secs(30);
        S3Dataset {
            name: name.to_owned(),
            settings,
            prefix: prefix.to_owned(),
            extra: Vec::new(),
        }
    }

    /// The `[[dataset]]` table.
    fn toml(&self) -> String {
        let st = &self.settings;
        let mut s = format!(
            "[[dataset]]\nname = {}\nkind = \"s3\"\nbucket = {}\nprefix = {}\n\
             allow_http = {}\npath_style = {}\nrequest_timeout_ms = {}\nretries = {}\n",
            toml_str(&self.name),
            toml_str(&st.bucket),
            toml_str(&self.prefix),
            st.allow_http,
            st.path_style,
            st.request_timeout.as_millis(),
            st.retries,
        );
        let opt = [
            ("endpoint", &st.endpoint),
            ("region", &st.region),
            ("access_key_id", &st.access_key_id),
            ("secret_access_key", &st.secret_access_key),
        ];
        for (key, v) in opt {
            if let Some(v) = v {
                let _ = writeln!(s, "{key} = {}", toml_str(v));
            }
        }
        for line in &self.extra {
            let _ = writeln!(s, "{line}");
        }
        s
    }
}

impl AgentSettings {
    /// The configuration file's defaults for a given arena size and dataset.
    pub fn new(arena_bytes: u64, dataset: &str, root: &Path) -> AgentSettings {
        let d = Config::default();
        AgentSettings {
            arena_bytes,
            hugepages: "try".to_owned(),
            window_batches: d.prefetch.window_batches,
            initial_window: d.prefetch.initial_window,
            max_inflight_reads: d.prefetch.max_inflight_reads,
            policy: "clairvoyant".to_owned(),
            ready_ring_capacity: d.sessions.ready_ring_capacity,
            release_ring_capacity: d.sessions.release_ring_capacity,
            datasets: vec![(dataset.to_owned(), root.to_path_buf())],
            direct_io: Some(false),
            s3_datasets: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// The configuration file's defaults for a given arena size and one
    /// S3 dataset.
    pub fn new_s3(arena_bytes: u64, dataset: S3Dataset) -> AgentSettings {
        let mut s = AgentSettings::new(arena_bytes, "", Path::new(""));
        s.datasets.clear();
        s.s3_datasets.push(dataset);
        s
    }

    /// The TOML text of this configuration, with the socket at `socket` and
    /// the metrics endpoint off (metrics are read in process).
    pub fn toml(&self, socket: &Path) -> String {
        let mut s = String::new();
        let extra = |section: &str| -> String {
            self.extra
                .iter()
                .filter(|(sec, _)| sec == section)
                .map(|(_, line)| format!("{line}\n"))
                .collect()
        };
        let _ = write!(
            s,
            "[arena]\nsize = {}\nhugepages = \"{}\"\n{}\
             [socket]\npath = {}\n{}\
             [prefetch]\nwindow_batches = {}\ninitial_window = {}\nmax_inflight_reads = {}\n{}\
             [cache]\npolicy = \"{}\"\n{}\
             [sessions]\nready_ring_capacity = {}\nrelease_ring_capacity = {}\n{}\
             [metrics]\naddress = \"\"\n{}",
            self.arena_bytes,
            self.hugepages,
            extra("arena"),
            toml_path(socket),
            extra("socket"),
            self.window_batches,
            self.initial_window.min(self.window_batches),
            self.max_inflight_reads,
            extra("prefetch"),
            self.policy,
            extra("cache"),
            self.ready_ring_capacity,
            self.release_ring_capacity,
            extra("sessions"),
            extra("metrics"),
        );
        let peers = extra("peers");
        if !peers.is_empty() {
            let _ = write!(s, "[peers]\n{peers}");
        }
        for d in &self.s3_datasets {
            s.push_str(&d.toml());
        }
        for (name, root) in &self.datasets {
            let _ = write!(
                s,
                "[[dataset]]\nname = \"{name}\"\nroot = {}\n",
                toml_path(root)
            );
            if let Some(on) = self.direct_io {
                let _ = writeln!(s, "direct_io = {on}");
            }
        }
        s
    }
}

/// A TOML literal string holding `p` (paths here never contain `'`).
fn toml_path(p: &Path) -> String {
    format!("'{}'", p.display())
}

/// A TOML basic string holding `v`.
fn toml_str(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// A running engine; stopped (and its socket directory removed) on drop.
pub struct Agent {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    metrics: Arc<Metrics>,
    socket: PathBuf,
    dir: PathBuf,
    hugepages: bool,
    cache: CacheConfig,
}

impl Agent {
    /// Starts an engine with `settings` and waits until it serves.
    pub fn start(settings: &AgentSettings) -> io::Result<Agent> {
        let dir = std::env::temp_dir().join(format!(
            "granary-bench-{}-{}",
            std::process::id(),
            NEXT_RUN.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("granary.sock");
        let text = settings.toml(&socket);
        let cfg = Config::from_toml_str(&text)
            .map_err(|e| io::Error::other(format!("agent config: {e}\n{text}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            let metrics = Arc::clone(&metrics);
            std::thread::Builder::new()
                .name("granary-engine".into())
                .spawn(move || -> io::Result<()> {
                    let mut engine = match Engine::new(cfg, metrics) {
                        Ok(e) => e,
                        Err(e) => {
                            let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                            return Err(e);
                        }
                    };
                    let _ = tx.send(Ok((engine.hugepages(), *engine.cache_config())));
                    engine.run(&stop, |_| {})
                })?
        };
        let (hugepages, cache) = match rx.recv() {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                let _ = thread.join();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(io::Error::other("the engine thread died while starting"));
            }
        };
        Ok(Agent {
            stop,
            thread: Some(thread),
            metrics,
            socket,
            dir,
            hugepages,
            cache,
        })
    }

    /// The socket loaders connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The engine's metrics (the atomics behind the endpoint).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the arena got huge pages.
    pub fn hugepages(&self) -> bool {
        self.hugepages
    }

    /// The engine's sample-cache configuration (what a simulation of it
    /// needs: managed bytes, alignment, transient reserve, policy).
    pub fn cache_config(&self) -> CacheConfig {
        self.cache
    }

    /// Every series of the Prometheus text, parsed.
    pub fn series(&self) -> Vec<(String, f64)> {
        parse_text(&self.metrics.render())
    }

    /// Hits and misses per epoch of `dataset`, from
    /// `granary_epoch_lookups_total{dataset,epoch,result}`, in epoch order.
    pub fn epoch_lookups(&self, dataset: &str) -> Vec<EpochLookups> {
        epoch_lookups(&self.series(), dataset)
    }

    /// Stops the engine and waits for its thread.
    pub fn stop(mut self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let r = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the engine thread panicked"))),
            None => Ok(()),
        };
        let _ = std::fs::remove_dir_all(&self.dir);
        r
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Lookups of one epoch of one dataset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochLookups {
    /// The epoch.
    pub epoch: u32,
    /// Samples found in the arena (or already being read).
    pub hits: u64,
    /// Samples read from the source.
    pub misses: u64,
}

impl EpochLookups {
    /// `hits / (hits + misses)`, 0 when nothing was looked up.
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

/// The labelled series of `metric` among parsed series: each one's labels
/// (`k="v",...`, without the braces) and value.
pub fn labelled<'a>(
    series: &'a [(String, f64)],
    metric: &'a str,
) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    series.iter().filter_map(move |(name, value)| {
        let labels = name.strip_prefix(metric)?.strip_prefix('{')?;
        Some((labels.strip_suffix('}')?, *value))
    })
}

/// Picks `granary_epoch_lookups_total` of `dataset` out of parsed series.
pub fn epoch_lookups(series: &[(String, f64)], dataset: &str) -> Vec<EpochLookups> {
    let mut out: Vec<EpochLookups> = Vec::new();
    for (labels, value) in labelled(series, "granary_epoch_lookups_total") {
        let (mut ds, mut epoch, mut result) = (None, None, None);
        for pair in labels.split(',') {
            match pair.split_once('=') {
                Some(("dataset", v)) => ds = Some(v.trim_matches('"')),
                Some(("epoch", v)) => epoch = v.trim_matches('"').parse::<u32>().ok(),
                Some(("result", v)) => result = Some(v.trim_matches('"')),
                _ => {}
            }
        }
        let (Some(d), Some(epoch), Some(result)) = (ds, epoch, result) else {
            continue;
        };
        if d != dataset {
            continue;
        }
        let slot = match out.iter().position(|e| e.epoch == epoch) {
            Some(i) => i,
            None => {
                out.push(EpochLookups {
                    epoch,
                    ..EpochLookups::default()
                });
                out.len() - 1
            }
        };
        match result {
            "hit" => out[slot].hits += value as u64,
            "miss" => out[slot].misses += value as u64,
            _ => {}
        }
    }
    out.sort_by_key(|e| e.epoch);
    out
}

/// The value of one series (exact name with labels), 0 if absent.
pub fn series_value(series: &[(String, f64)], name: &str) -> f64 {
    series
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0.0, |(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_lookups_are_picked_per_dataset() {
        let text = "\
# HELP granary_epoch_lookups_total x
granary_epoch_lookups_total{dataset=\"a\",epoch=\"1\",result=\"hit\"} 3
granary_epoch_lookups_total{dataset=\"a\",epoch=\"1\",result=\"miss\"} 1
granary_epoch_lookups_total{dataset=\"a\",epoch=\"0\",result=\"miss\"} 4
granary_epoch_lookups_total{dataset=\"b\",epoch=\"0\",result=\"hit\"} 9
granary_samples_served_total 8
";
        let got = epoch_lookups(&parse_text(text), "a");
        assert_eq!(
            got,
            vec![
                EpochLookups {
                    epoch: 0,
                    hits: 0,
                    misses: 4
                },
                EpochLookups {
                    epoch: 1,
                    hits: 3,
                    misses: 1
                },
            ]
        );
        assert!((got[1].hit_rate() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn s3_settings_make_a_valid_config() {
        let mut st = S3Settings::new("bucket");
        st.endpoint = Some("http://127.0.0.1:9000".into());
        st.allow_http = true;
        st.access_key_id = Some("k\"ey".into());
        st.secret_access_key = Some("se\\cret".into());
        let mut s = AgentSettings::new_s3(
            256 << 20,
            S3Dataset {
                name: "d".into(),
                settings: st,
                prefix: "a/b".into(),
                extra: Vec::new(),
            },
        );
        s.extra.push(("prefetch".into(), "read_retries = 5".into()));
        let cfg = Config::from_toml_str(&s.toml(Path::new("/tmp/x.sock"))).unwrap();
        assert_eq!(cfg.prefetch.read_retries, 5);
        let d = &cfg.datasets[0];
        let granary_agent::config::DatasetConfig::S3(s3) = d else {
            panic!("not an S3 dataset: {d:?}");
        };
        assert_eq!(s3.prefix.as_deref(), Some("a/b"));
        assert_eq!(s3.access_key_id.as_deref(), Some("k\"ey"));
        let back = S3Settings::from_dataset(d).unwrap();
        assert_eq!(back.secret_access_key.as_deref(), Some("se\\cret"));
        assert_eq!(back.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    }

    #[test]
    fn settings_make_a_valid_config() {
        let s = AgentSettings::new(256 << 20, "d", Path::new("/nonexistent/data"));
        let cfg = Config::from_toml_str(&s.toml(Path::new("/tmp/x.sock")));
        assert!(cfg.is_ok(), "{cfg:?}");
    }
}
