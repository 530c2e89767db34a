//! # granary-base: formats and policies every crate computes alike
//!
//! * [`hash`]: SplitMix64 (its increment, its finaliser `mix64`, the
//!   generator), which the planner's order, the peers' ownership, the
//!   synthetic dataset and the tests' generators are built on. The planner
//!   and ownership formulas are pinned bit for bit by Python references,
//!   so there is exactly one definition.
//! * [`backoff`]: the delay that doubles from a first value up to a cap,
//!   with or without jitter, for every retry and pause that grows.
//! * [`code_enum!`]: an enum whose variants stand for fixed codes, with
//!   the list of its variants and the look-up from a code.
//! * [`assert_offsets!`]: the offsets of a `#[repr(C)]` type's fields,
//!   checked at compile time.
//!
//! A leaf crate without dependencies, so that granary-shm and granary-peer
//! (which do not depend on each other) can both use it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
pub mod code_enum;
pub mod hash;
pub mod layout;

pub use backoff::Backoff;
pub use hash::{mix64, SplitMix64, GAMMA};
