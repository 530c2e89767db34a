//! # granary-testkit: what the workspace's tests share
//!
//! A dev crate (never published): the agent's, the tools', libgranary's
//! and granary-shm's tests use it as a dev-dependency, and the benchmarks
//! use its stores and proxies. Test support lives here instead of being
//! compiled into another crate's tests from this crate's source files.
//!
//! Always there (std only, so granary-shm's loom and Miri runs can use it):
//! * [`watchdog`]: aborts a hanging test process, naming the test
//!   ([`watchdog_fn!`]: named after the test function).
//! * [`require!`]: a precondition that skips a test loudly (`SKIPPED` and
//!   why) locally and fails it under `CI=1`; [`require_ok!`] for a `Result`.
//! * [`granaryd`]: [`GranarydProcess::spawn`], the one way tests start the
//!   real `granaryd`.
//! * [`docs`]: README.md's and docs/*.md's code blocks and command lines,
//!   for tests that hold the docs to the code.
//! * [`agent_toml`]: an agent's TOML, the settings every test agent
//!   shares written once.
//! * [`procfs`]: a process's sizes from `/proc` (its resident memory).
//! * [`cc`]: a C program's build against libgranary.
//! * [`worker`]: a test server's thread, stopped and joined on drop.
//!
//! Behind features:
//! * `dataset`: [`dataset`], synthetic datasets and a `granaryd`'s directory.
//! * `s3`: [`seaweed`] (a real S3 server, SeaweedFS, on loopback ports),
//!   [`local_s3`] (loopback credentials as agent settings or environment),
//!   [`delay_proxy`] (latency and a bandwidth cap in front of a store),
//!   [`corrupt_proxy`] (a peer-frame-aware proxy corrupting chosen blocks).
//! * `cql`: [`fake_cql`], a fake CQL cluster of `scylla-proxy` nodes
//!   answering forged frames.
#![warn(missing_docs)]

pub mod agent_toml;
pub mod cc;
pub mod docs;
pub mod granaryd;
pub mod procfs;
pub mod require;
pub mod watchdog;
pub mod worker;

#[cfg(feature = "s3")]
pub mod corrupt_proxy;
#[cfg(feature = "dataset")]
pub mod dataset;
#[cfg(feature = "s3")]
pub mod delay_proxy;
#[cfg(feature = "cql")]
#[allow(missing_docs)]
pub mod fake_cql;
#[cfg(feature = "s3")]
pub mod local_s3;
#[cfg(feature = "s3")]
pub mod seaweed;

pub use granaryd::{GranarydConfig, GranarydProcess, Log};
pub use watchdog::{watchdog, Watchdog};
