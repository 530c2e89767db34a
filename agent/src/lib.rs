//! The Granary agent library: everything `granaryd` does.
//!
//! The operator CLI `granary`, the ingest into S3/CQL and the synthetic
//! dataset generator live in the `granary-tools` crate (`tools/`).
//!
//! # Module map
//!
//! From the outside in (`docs/architecture.md` has the same map with links
//! to the design notes):
//!
//! * [`daemon`]: `granaryd run` — metrics endpoint, engine, systemd
//!   notifications, signals; [`logging`] (text or JSON lines), `notify`
//!   (systemd).
//! * [`config`]: the TOML configuration as types, validated, with the
//!   default file compiled in.
//! * [`engine`]: the turn loop and its phases (open, release, request,
//!   complete, publish, peers) over an injected clock; owns the server, the
//!   sessions, the cache and the datasets.
//! * `server`: the loaders' socket — accept, `SO_PEERCRED` check, messages.
//! * `session`: one loader session and the lifecycle of its batches over a
//!   `planner::SessionCursor`.
//! * [`planner`]: the exact sample order of every epoch, shared by the
//!   session and the cache's future index.
//! * [`provenance`]: what a saved session state records of the catalog it
//!   was taken against (fingerprint and difference sketch), and the naming
//!   of what changed since.
//! * [`cache`]: arena extents (`extent`), sample states and pins, the
//!   eviction policies (Belady with the future index, MinIO, LRU); the
//!   simulator behind feature `sim`.
//! * [`dataset`]: a configured dataset, opened (and reopened) in the
//!   background, and its health.
//! * [`source`]: the [`source::SampleSource`] trait the engine drives and
//!   its vocabulary ([`source::SampleError`], [`source::FailureKind`],
//!   [`source::queue`]); [`source::fs`] (catalog, io_uring reader,
//!   [`source::FsSource`]), [`source::s3`], [`source::cql`]. Each makes one
//!   attempt per request.
//! * `retry`: the one retry layer, `RetryPolicy`, applied by the engine.
//! * [`peers`]: the peer tier — the job's view, dataset directories,
//!   routing of misses to owners, the TCP transport on the secure channel
//!   (payloads straight to and from the arena), the RDMA links, the serving
//!   side; `PeerTier` is driven through its methods by `engine/peers.rs`,
//!   `engine/serving.rs` and `engine/peers_rdma.rs`.
//! * [`jobstatus`]: where the job stands across its agents — each plan's
//!   rank positions and each rank's waits, this agent's and its peers'
//!   (the job-status frame), stragglers.
//! * [`mixture`]: the order of a `[[mixture]]` (datasets mixed with fixed
//!   shares of every batch); its source is `source::mixture`.
//! * [`metrics`]: lock-free counters and the OpenMetrics endpoint.
//! * [`warm`]: the arena file and index that make a restart warm.
//! * `sys`: the only module allowed `unsafe` — system calls and the
//!   io_uring submissions, behind safe functions.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
pub(crate) mod balance;
/// The allocator `granaryd` declares (`#[global_allocator]`), and so do the
/// benchmarks that host the engine in their own process: mimalloc. With
/// glibc's malloc the S3 fetcher's threads spent a fifth of their time in
/// it, mostly on response buffers that went back to the kernel and were
/// faulted in again (docs/s3.md).
pub use mimalloc::MiMalloc as Allocator;

pub mod cache;
pub mod config;
pub mod daemon;
pub mod dataset;
pub mod engine;
pub(crate) mod extent;
pub mod jobstatus;
pub mod logging;
pub mod metrics;
pub mod mixture;
pub(crate) mod notify;
pub mod peers;
pub mod planner;
pub mod provenance;
pub(crate) mod retry;
pub(crate) mod server;
pub(crate) mod session;
pub mod source;
pub mod startup;
mod sys;
#[cfg(test)]
mod testutil;
pub mod version;
pub mod warm;
pub mod why;
