//! The Granary agent library: everything `granaryd` and `granary` do.
#![deny(unsafe_op_in_unsafe_fn)]
pub mod planner;
pub mod config;
pub mod progress;
pub mod source;
pub mod synth;
pub mod metrics;
pub mod notify;
pub mod uring_reader;
pub mod cache;
pub mod extent;
pub mod dataset;
pub mod engine;
pub mod server;
pub mod session;
pub mod daemon;
pub mod ingest;
