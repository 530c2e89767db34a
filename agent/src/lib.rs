//! The Granary agent library: everything `granaryd` and `granary` do.
#![deny(unsafe_op_in_unsafe_fn)]
pub mod cache;
pub mod config;
pub mod daemon;
pub mod dataset;
pub mod engine;
pub mod extent;
pub mod ingest;
pub mod metrics;
pub mod notify;
pub mod planner;
pub mod progress;
pub mod retry;
pub mod server;
pub mod session;
pub mod source;
pub mod synth;
mod sys;
pub mod uring_reader;
