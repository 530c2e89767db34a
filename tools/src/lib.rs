//! Granary's operator tools, outside the daemon: the `granary` CLI's
//! library.
//!
//! * [`ingest`]: copies a dataset folder into an S3 bucket or CQL tables
//!   (`granary ingest`).
//! * [`synth`]: the self-verifying synthetic dataset of the quickstart,
//!   the tests and the benchmarks.
//! * [`progress`]: the text progress bar of long operations.
//! * [`secret`]: a fresh job secret for the peer tier (`granary secret new`).
#![deny(unsafe_op_in_unsafe_fn)]
pub mod ingest;
pub mod progress;
pub mod secret;
pub mod synth;
pub mod why;
