//! A dataset the engine serves: its source once the catalog is loaded, or
//! where loading it stands.
//!
//! Filesystem datasets are opened before the engine starts, and a dataset
//! that cannot be opened stops the agent (a wrong path is a configuration
//! error). Remote datasets (S3, CQL) are opened on a thread of their own:
//! the engine waits a bounded time for the first attempt at start-up, then
//! serves every other dataset while a store that cannot be reached is tried
//! again with a growing pause (`RETRY_FIRST` doubling up to
//! `RETRY_MAX`). Loaders that ask for a dataset whose first attempt is
//! still running wait for it; once an attempt has failed, they get its
//! error at once, with when the next attempt is due.

use crate::config::{
    Config, DatasetConfig, DeliveryOrder, MixtureConfig, RetrySettings, SourceKind,
};
use crate::provenance;
use crate::source::{self, SampleSource};
use granary_shm::handshake::CatalogId;
use std::io;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// Pause after a remote dataset's first failed load.
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest pause between load attempts.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(60);
/// How long a burst of read failures of one dataset is summarised before
/// the log says more.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

type Loaded = io::Result<(Box<dyn SampleSource>, CatalogId)>;

/// What a dataset is opened from: a `[[dataset]]`, or a `[[mixture]]` of
/// them (its sources opened again for it, `docs/mixtures.md`).
#[derive(Clone)]
enum Spec {
    Dataset(Box<DatasetConfig>),
    Mixture(MixtureConfig),
}

impl Spec {
    fn open(&self, agent: &Config) -> io::Result<Box<dyn SampleSource>> {
        match self {
            Spec::Dataset(d) => source::open(d, agent),
            Spec::Mixture(m) => Ok(Box::new(source::mixture::MixtureSource::open(m, agent)?)),
        }
    }

    fn name(&self) -> &str {
        match self {
            Spec::Dataset(d) => d.name(),
            Spec::Mixture(m) => &m.name,
        }
    }
}

/// Where a dataset stands.
enum State {
    /// Serving.
    Ready(Box<dyn SampleSource>),
    /// An attempt to open it is running on a thread.
    Loading(Receiver<Loaded>),
    /// The last attempt failed; the next one starts at `next`.
    Waiting { next: Instant },
}

/// What [`Dataset::poll`] saw happen.
#[derive(Debug)]
pub(crate) enum LoadEvent {
    /// The catalog is loaded; the dataset serves from now on.
    Ready,
    /// An attempt failed (the message is also kept as
    /// [`Dataset::unavailable`]).
    Failed(String),
}

/// A configured dataset.
pub struct Dataset {
    /// Name loaders open it by.
    pub name: String,
    kind: &'static str,
    /// `order = "relaxed"`: late samples give way to ready ones.
    pub relaxed: bool,
    /// How its failed reads are retried (`[prefetch]` with the dataset's
    /// `[dataset.retry]` applied).
    pub retry: RetrySettings,
    /// What to open it from again (`None`: a source handed over ready).
    config: Option<Box<(Spec, Config)>>,
    state: State,
    /// The catalog's id (fingerprint and difference sketch) once ready:
    /// what a session state records as its provenance.
    catalog: Option<CatalogId>,
    attempts: u32,
    last_error: Option<String>,
    failures_logged: Option<Instant>,
    failures_unlogged: u64,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("name", &self.name)
            .field("ready", &self.is_ready())
            .field("attempts", &self.attempts)
            .field("last_error", &self.last_error)
            .finish()
    }
}

impl Dataset {
    /// Opens a dataset in the calling thread.
    pub(crate) fn open_now(config: &DatasetConfig, agent: &Config) -> io::Result<Dataset> {
        Dataset::open_spec_now(Spec::Dataset(Box::new(config.clone())), agent)
    }

    /// Opens a mixture (`[[mixture]]`) in the calling thread.
    pub(crate) fn open_mixture_now(config: &MixtureConfig, agent: &Config) -> io::Result<Dataset> {
        Dataset::open_spec_now(Spec::Mixture(config.clone()), agent)
    }

    fn open_spec_now(spec: Spec, agent: &Config) -> io::Result<Dataset> {
        let mut d = Dataset::unopened(spec, agent, 1);
        d.open_here(agent)?;
        Ok(d)
    }

    fn open_spec_in_background(spec: Spec, agent: &Config) -> Dataset {
        let mut d = Dataset::unopened(spec, agent, 0);
        d.start_attempt();
        d
    }

    /// Starts opening a mixture on a thread of its own.
    pub(crate) fn open_mixture_in_background(config: &MixtureConfig, agent: &Config) -> Dataset {
        Dataset::open_spec_in_background(Spec::Mixture(config.clone()), agent)
    }

    /// Whether a mixture is opened in the background: some source of it is.
    pub(crate) fn is_remote_mixture(config: &MixtureConfig, agent: &Config) -> bool {
        config
            .source
            .iter()
            .filter_map(|s| agent.dataset(&s.dataset))
            .any(Dataset::is_remote)
    }

    fn open_here(&mut self, agent: &Config) -> io::Result<()> {
        let Some(both) = self.config.as_deref() else {
            return Ok(());
        };
        let source = both.0.open(agent)?;
        self.catalog = Some(provenance::catalog_id(&self.name, &*source));
        self.state = State::Ready(source);
        Ok(())
    }

    /// A dataset of `spec` under `agent`'s settings, not open yet: its
    /// next attempt may start at once, `attempts` made so far.
    fn unopened(spec: Spec, agent: &Config, attempts: u32) -> Dataset {
        let (name, kind, relaxed, retry) = match &spec {
            Spec::Dataset(c) => (
                c.name().to_owned(),
                c.kind().as_str(),
                c.order() == DeliveryOrder::Relaxed,
                agent.retry_for(c),
            ),
            Spec::Mixture(m) => (
                m.name.clone(),
                "mixture",
                false,
                agent.prefetch.retry_settings(&Default::default()),
            ),
        };
        Dataset {
            name,
            kind,
            relaxed,
            retry,
            config: Some(Box::new((spec, agent.clone()))),
            state: State::Waiting {
                next: Instant::now(),
            },
            catalog: None,
            attempts,
            last_error: None,
            failures_logged: None,
            failures_unlogged: 0,
        }
    }

    /// Starts opening a dataset on a thread of its own.
    pub(crate) fn open_in_background(config: &DatasetConfig, agent: &Config) -> Dataset {
        Dataset::open_spec_in_background(Spec::Dataset(Box::new(config.clone())), agent)
    }

    /// Serves a source opened elsewhere (a wrapped or fault-injecting
    /// client, in tests and benchmarks) under `name`.
    pub fn from_source(name: &str, source: Box<dyn SampleSource>) -> Dataset {
        let catalog = Some(provenance::catalog_id(name, &*source));
        Dataset {
            catalog,
            name: name.to_owned(),
            kind: source.kind(),
            relaxed: false,
            retry: RetrySettings::default(),
            config: None,
            state: State::Ready(source),
            attempts: 1,
            last_error: None,
            failures_logged: None,
            failures_unlogged: 0,
        }
    }

    /// The dataset's configuration (`None`: a source handed over ready).
    pub fn config(&self) -> Option<&DatasetConfig> {
        match self.config.as_deref() {
            Some((Spec::Dataset(d), _)) => Some(d),
            _ => None,
        }
    }

    /// Whether the configuration says the dataset is opened in the
    /// background (remote stores) rather than before start-up.
    pub(crate) fn is_remote(config: &DatasetConfig) -> bool {
        config.kind() != SourceKind::Fs
    }

    fn start_attempt(&mut self) {
        let Some(both) = self.config.clone() else {
            return;
        };
        let (config, agent) = *both;
        let (tx, rx) = mpsc::channel();
        self.attempts += 1;
        let spawned = std::thread::Builder::new()
            .name(format!("granary-open-{}", self.attempts))
            .spawn(move || {
                let result = config.open(&agent).and_then(|s| {
                    if s.is_empty() {
                        Err(io::Error::other("the dataset has no samples"))
                    } else {
                        let id = provenance::catalog_id(config.name(), &*s);
                        Ok((s, id))
                    }
                });
                let _ = tx.send(result);
            });
        self.state = match spawned {
            Ok(_) => State::Loading(rx),
            Err(e) => {
                self.last_error = Some(format!("cannot start a thread to open it: {e}"));
                State::Waiting {
                    next: Instant::now() + self.pause(),
                }
            }
        };
    }

    fn pause(&self) -> Duration {
        granary_base::Backoff::new(RETRY_FIRST, RETRY_MAX).nth(self.attempts)
    }

    /// Moves loading on: takes a finished attempt's result, starts the next
    /// attempt when its time has come. Never blocks.
    pub(crate) fn poll(&mut self, now: Instant) -> Option<LoadEvent> {
        match &self.state {
            State::Ready(_) => None,
            State::Waiting { next } => {
                if now >= *next {
                    self.start_attempt();
                }
                None
            }
            State::Loading(rx) => match rx.try_recv() {
                Ok(result) => Some(self.settle(result)),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(self.settle(Err(io::Error::other(
                    "the thread opening it ended without an answer",
                )))),
            },
        }
    }

    /// Waits up to `limit` for a running attempt to finish.
    pub(crate) fn wait(&mut self, limit: Duration) -> Option<LoadEvent> {
        let State::Loading(rx) = &self.state else {
            return None;
        };
        match rx.recv_timeout(limit) {
            Ok(result) => Some(self.settle(result)),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(self.settle(Err(io::Error::other(
                "the thread opening it ended without an answer",
            )))),
        }
    }

    fn settle(&mut self, result: Loaded) -> LoadEvent {
        match result {
            Ok((source, catalog)) => {
                self.state = State::Ready(source);
                self.catalog = Some(catalog);
                self.last_error = None;
                LoadEvent::Ready
            }
            Err(e) => {
                let msg = e.to_string();
                self.last_error = Some(msg.clone());
                self.state = State::Waiting {
                    next: Instant::now() + self.pause(),
                };
                LoadEvent::Failed(msg)
            }
        }
    }

    /// `"fs"`, `"s3"`, `"gcs"`, `"azure"`, `"cql"` or `"mixture"`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Load attempts so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the dataset serves.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// Whether its first load attempt is still running.
    pub(crate) fn first_load_running(&self) -> bool {
        matches!(self.state, State::Loading(_)) && self.last_error.is_none()
    }

    /// Why it does not serve (for loaders and the log); `None` when ready.
    pub fn unavailable(&self) -> Option<String> {
        let kind = self.kind;
        match &self.state {
            State::Ready(_) => None,
            State::Loading(_) => Some(match &self.last_error {
                None => format!("dataset {:?} ({kind}) is still loading its catalog", self.name),
                Some(e) => format!(
                    "dataset {:?} ({kind}) is unavailable: {e} (attempt {} is running)",
                    self.name, self.attempts
                ),
            }),
            State::Waiting { next } => Some(format!(
                "dataset {:?} ({kind}) is unavailable: {} (attempt {} failed; the next starts in {:.1} s)",
                self.name,
                self.last_error.as_deref().unwrap_or("not loaded"),
                self.attempts,
                next.saturating_duration_since(Instant::now()).as_secs_f64()
            )),
        }
    }

    /// The catalog's id (fingerprint and difference sketch); `None` until
    /// the dataset is ready.
    pub fn catalog(&self) -> Option<&CatalogId> {
        self.catalog.as_ref()
    }

    /// The source; `None` until the dataset is ready.
    pub fn source(&self) -> Option<&dyn SampleSource> {
        match &self.state {
            State::Ready(s) => Some(&**s),
            _ => None,
        }
    }

    /// The source, mutable; `None` until the dataset is ready.
    pub(crate) fn source_mut(&mut self) -> Option<&mut (dyn SampleSource + 'static)> {
        match &mut self.state {
            State::Ready(s) => Some(&mut **s),
            _ => None,
        }
    }

    /// Logs a sample that failed for good, without flooding the log when a
    /// whole store is down: the first failure is logged, then one summary
    /// line at most every ten seconds.
    pub(crate) fn log_failure(&mut self, what: impl FnOnce() -> String) {
        let now = Instant::now();
        match self.failures_logged {
            Some(t) if now.duration_since(t) < ERROR_LOG_INTERVAL => {
                self.failures_unlogged += 1;
            }
            _ => {
                let more = std::mem::take(&mut self.failures_unlogged);
                if more > 0 {
                    tracing::warn!(
                        "dataset {:?}: {more} more samples failed in the last {} s",
                        self.name,
                        ERROR_LOG_INTERVAL.as_secs()
                    );
                }
                tracing::warn!("dataset {:?}: {}", self.name, what());
                self.failures_logged = Some(now);
            }
        }
    }
}
