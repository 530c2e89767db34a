//! The sans-IO core of Granary's peer layer: everything that several agents
//! must agree on, or that is parsed from another agent's bytes. No sockets,
//! no threads, no clock of its own: bytes and times in, events out. Transport
//! drivers (TCP) and the simulator in [`sim`] sit on top.
//!
//! An agent uses it in this order: build a [`view::View`] (static list,
//! Slurm, or handed in) and compare digests; compute a [`keep::Directory`]
//! per dataset (owner and keep bit of every sample); open one
//! [`conn::Conn`] per peer, feeding it socket bytes and writing what
//! [`conn::Conn::poll_transmit`] returns; answer [`conn::Event::Request`]s
//! through a [`serve::Server`]; check every received block with
//! [`block::BlockCrc`] before use; on any failure read the store.
//!
//! | module | what it holds |
//! |---|---|
//! | [`view`] | immutable membership views, their canonical encoding and digest; Slurm host lists |
//! | [`owner`] | integer-only, capacity-weighted rendezvous ownership of samples |
//! | [`keep`] | the deterministic keep-set of every owner, and the [`keep::Directory`] of a dataset |
//! | [`block`] | CRC-32C of a block bound to (dataset, sample, length) |
//! | [`fingerprint`] | a dataset's identity: SHA-256 over its name, kind and every sample's id, size and version token |
//! | [`frame`] | the versioned wire frames and an incremental, never-panicking decoder |
//! | [`status`] | the job-status frame's body: rank positions and waits a peer reports |
//! | [`channel`] | the secure channel: Noise handshake keyed by the job secret, sealed records |
//! | [`conn`] | one connection: the channel's handshake, hellos, credits, keepalive, goodbye |
//! | [`serve`] | the owner's serving queue: earliest due first, fair windows, single flight |
//! | [`request`] | the requester: gets in flight, claims, verification, hedging, slow peers |
//! | [`grace`] | samples of an owner whose connection dropped, waiting (bounded) for it to come back |
//! | [`sim`] | a deterministic, seeded simulator of N agents over the modules above |
//! | [`assign`] | locality-aware assignment of a global step's samples |
//!
//! Time is always a [`conn::Nanos`] (`u64` nanoseconds since an origin the
//! caller picks); randomness (hello nonces) is passed in. `docs/peers.md`
//! describes the model.
#![forbid(unsafe_code)]

pub mod assign;
pub mod block;
pub mod channel;
pub mod conn;
pub mod fingerprint;
pub mod frame;
/// The job-status frame's body (a part of [`frame`]'s wire format).
pub use frame::status;
pub mod grace;
mod input;
pub mod keep;
pub mod owner;
pub mod request;
pub mod serve;
/// The seeded simulator of N agents, for the crate's tests and the
/// `sim_sweep` example (feature `sim`): not compiled into `granaryd`.
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod view;
