//! Granary's RDMA data path for peers.
//!
//! The owner of a sample writes it straight into the requester's arena
//! with an RDMA write, then sends the data header on the same queue pair.
//! The peer protocol core (frames, connection state machine, block CRC,
//! serving queue) stays above this crate: its frames travel here as
//! opaque bytes. See `docs/rdma.md`.
//!
//! * [`verbs`]: the narrow verbs trait the driver is written against.
//! * [`fake`]: an in-memory fake NIC with several hosts on one fabric;
//!   checks keys, bounds and rights and injects error completions. Always
//!   built: CI runs everything on it.
//! * `real` (feature `rdma`): the same trait over libibverbs through
//!   `rdma-sys`, the only module with `unsafe`.
//! * [`setup`]: queue pair parameters exchanged over TCP, as bytes.
//! * [`msg`]: the envelope of messages on a queue pair.
//! * [`driver`]: registration, queue pair setup, gets, serving, credits,
//!   teardown with fallback and backoff.
//! * [`conformance`]: a transport-generic conformance suite.
//! * [`device`]: the host's devices, probed and opened, with or without
//!   the `rdma` feature (the only place the agent's build depends on it).
//!
//! The default build neither needs nor links libibverbs.

#![cfg_attr(not(feature = "rdma"), forbid(unsafe_code))]

pub mod conformance;
pub mod device;
pub mod driver;
pub mod fake;
pub mod msg;
#[cfg(feature = "rdma")]
pub mod real;
pub mod setup;
pub mod verbs;

pub use driver::{
    Driver, DriverConfig, DriverError, Event, Extent, FailReason, PeerId, PeerStatus,
};
pub use fake::{Fabric, FakeNic};
pub use setup::SetupParams;
pub use verbs::Verbs;
