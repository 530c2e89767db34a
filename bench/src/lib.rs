//! Benchmarks (in progress)
