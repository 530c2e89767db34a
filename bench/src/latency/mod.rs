//! Parts of `bench/run latency` that live in the library: the shard-format
//! comparison (`--format`, [`format`]).

pub mod format;
