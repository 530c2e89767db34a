//! # granary-shm: the shared-memory contract between `granaryd` and its loaders
//!
//! Loaders and the agent meet only in shared memory and on one Unix socket.
//! This crate is that meeting place, and the only crate of the project with
//! real `unsafe` code:
//!
//! * [`layout`]: `#[repr(C)]` layouts of the segment header, ring control
//!   blocks, batch and release descriptors and sample entries, pinned by
//!   const assertions.
//! * [`region`]: mapped memory (memfd mappings, or heap memory so Miri can run
//!   the logic).
//! * [`ring`]: the SPSC ring over shared memory, with batched publication and
//!   a spin-then-park blocking wait ([`futex`]).
//! * [`segment`]: a session's ring segment: create (agent) and attach (loader).
//! * [`arena`]: the sample arena: a sealed memfd, hugepages when available,
//!   mapped read-only by loaders.
//! * [`lease`]: the agent-private table of batches lent to a loader.
//! * [`validate`]: every check applied to memory another process can write.
//! * [`handshake`]: the session handshake as a sans-IO codec.
//! * [`socket`]: `SOCK_SEQPACKET` Unix sockets with fd passing and peer credentials.
//! * [`error`]: typed errors and the stable error-code table.
//! * [`tar`]: tar headers and the named fields of a WebDataset sample
//!   (`docs/formats.md`).
//! * [`clock`]: [`monotonic_ms`], the clock heartbeats are measured on.
//!
//! `docs/shm-layout.md` describes the formats byte by byte.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(feature = "loom"))]
pub mod arena;
pub mod barrier;
pub mod clock;
pub mod error;
pub mod futex;
pub mod handshake;
pub mod layout;
pub mod lease;
#[cfg(not(feature = "loom"))]
pub mod memfd;
pub mod region;
pub mod ring;
pub mod segment;
#[cfg(not(feature = "loom"))]
pub mod socket;
mod sync;
#[cfg(not(feature = "loom"))]
pub mod tar;
pub mod validate;

pub use clock::monotonic_ms;
pub use error::{AttachError, ErrorCode, Violation, WaitError};
pub use layout::{BatchDescriptor, ReleaseDescriptor, SampleEntry, LAYOUT_VERSION};
