//! The Granary agent library: everything `granaryd` does.
//!
//! The operator CLI `granary`, the ingest into S3/CQL and the synthetic
//! dataset generator live in the `granary-tools` crate (`tools/`).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
pub mod cache;
pub mod config;
// Its SIGTERM/SIGINT/SIGPIPE handlers (two `libc::signal` calls) are the
// one use of `unsafe` outside `sys`; they belong in `sys` too.
#[allow(unsafe_code)]
pub mod daemon;
pub mod dataset;
pub mod engine;
pub mod extent;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod planner;
pub mod retry;
pub mod server;
pub mod session;
pub mod source;
mod sys;
#[cfg(test)]
mod testutil;
