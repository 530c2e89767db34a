//! The Granary agent library: everything `granaryd` and `granary` do.
#![deny(unsafe_op_in_unsafe_fn)]
pub mod planner;
pub mod uring_reader;
pub mod config;
pub mod progress;
pub mod source;
pub mod synth;
