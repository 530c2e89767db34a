//! # granary-bench: Granary's benchmarks
//!
//! Every benchmark is one binary under `src/bin/` and runs as
//! `bench/run NAME [args]`. Those moved to the folder layout keep their code
//! in `src/NAME/` (`scenario`, `measure`, `report`, and more files where a
//! concept needs one) behind a small clap binary: [`warm`], [`cold`],
//! [`ring`], [`latency`], [`cluster`] (with its node and store roles and
//! its network namespaces, [`cluster::netns`]), [`why`], [`policy`],
//! [`assign`], [`channel`] and [`attacks`]. Each prints human-readable lines
//! and, as its last line, one JSON object (see [`report::Json`]).
//! Benchmarks that need a second process re-execute their own binary in a
//! peer role ([`peer`]).
//!
//! Shared pieces:
//! * [`peer`]: spawn the current binary as a peer process that receives a
//!   shared-memory fd as its stdin and talks back over a line protocol.
//! * [`cpu`]: which CPU a thread runs on, sampled, and the resulting regime.
//! * [`baseline`]: a minimal SPSC ring used as a yardstick for granary's ring.
//! * [`report`]: medians, percentiles and the final JSON line.
//! * [`delay_proxy`]: a TCP proxy adding latency in each direction (and an
//!   optional bandwidth cap) without breaking pipelining (from
//!   granary-testkit).
//! * [`light_store`]: a light read-only S3 store serving a directory, for
//!   benchmarks where the store must not be the bottleneck.
//! * [`s3_data`]: a synthetic dataset uploaded into SeaweedFS, and its key
//!   list for the Python loaders.
//! * [`seaweed`]: a SeaweedFS S3 server on free loopback ports (from
//!   granary-testkit, which the agent's S3 tests use too).
//! * [`stall_loaders`]: the arguments of each loader `bench/stall_train.py`
//!   runs for `bench/run stall` (and `bench/run latency`).
//! * [`stall`]: `bench/run stall` (`bench/src/stall/`): the scenario, one
//!   measured run, the figures and goals, the JSON line; `--two-jobs` and
//!   `--decode`'s two jobs.
//! * [`agent`]: the real engine on a thread of the benchmark process,
//!   configured from TOML, its metrics read back as Prometheus text.
//! * [`loader`]: one session through libgranary, samples seen in place,
//!   per-epoch timings.
//! * [`data`]: synthetic datasets generated once under `bench/.data/`.
//! * [`touch`]: the touch-every-byte loop and the memory-read baseline.
//! * [`sys`]: dropping the page cache, root or not, CPU load.
//! * [`smoke`]: running a benchmark's smoke variant from a test, bounded,
//!   and reading its result line.
//! * [`cli`]: `--name value` options.
//! * [`corrupt_proxy`]: a peer-frame-aware TCP proxy corrupting chosen
//!   blocks (from granary-testkit).
//! * [`attack_agent`], [`attack_loader`], [`peer_client`], [`switch_proxy`],
//!   [`sample_windows`], [`floods`]: the pieces of the attacks benchmark:
//!   real `granaryd` processes, loaders checking every byte, a peer client
//!   written from the outside, a switchable proxy in a member's path, the
//!   samples found in clear in captured bytes, and the floods.
#![warn(missing_docs)]

pub use granary_testkit::{corrupt_proxy, delay_proxy, local_s3, seaweed};

/// Every benchmark binary runs on granaryd's allocator, so that an engine
/// hosted in a benchmark's process costs what it costs in granaryd.
#[global_allocator]
static ALLOCATOR: granary_agent::Allocator = granary_agent::Allocator;

pub mod agent;
pub mod assign;
pub mod attack_agent;
pub mod attack_loader;
pub mod attacks;
pub mod baseline;
pub mod channel;
pub mod cli;
pub mod cluster;
pub mod cold;
pub mod cpu;
pub mod data;
pub mod floods;
pub mod latency;
pub mod light_store;
pub mod loader;
pub mod peer;
pub mod peer_client;
pub mod policy;
pub mod report;
pub mod ring;
pub mod s3_data;
pub mod sample_windows;
pub mod smoke;
pub mod stall;
pub mod stall_loaders;
pub mod store;
pub mod switch_proxy;
pub mod sys;
pub mod touch;
pub mod uring_read;
pub mod warm;
pub mod why;
