//! # libgranary: the loader side of Granary
//!
//! A loader connects to the node's `granaryd` over its Unix socket, opens a
//! *session* (dataset, seed, epochs, batch size, rank and world size), and
//! then takes batches that the agent has already placed in a shared-memory
//! arena: each sample is a pointer into a read-only mapping, never a copy.
//! When the loader is done with a batch it releases it, and the agent may
//! reuse that memory.
//!
//! The crate has two faces over the same code:
//!
//! * the Rust API: [`Client`], [`Session`], [`Batch`], [`Sample`];
//! * the C API (`include/granary.h`, built as `libgranary.so` and
//!   `libgranary.a`), a thin layer in [`ffi`] that wraps the Rust API.
//!
//! ```no_run
//! use granary::{Client, SessionOptions};
//! use std::time::Duration;
//!
//! let client = Client::connect("/run/granary/granaryd.sock")?;
//! let mut options = SessionOptions::new("imagenet-train");
//! options.batch_size = 256;
//! let mut session = client.open_session(&options)?;
//! loop {
//!     let batch = match session.next_batch(Some(Duration::from_secs(10))) {
//!         Ok(b) => b,
//!         Err(e) if e.code() == granary::ErrorCode::EndOfStream => break,
//!         Err(e) => return Err(e.into()),
//!     };
//!     for sample in batch.samples() {
//!         let _ = (sample.id(), sample.label(), sample.len());
//!     }
//!     session.release(batch)?;
//! }
//! session.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `docs/c-api.md` describes the C API: lifecycle, error codes and
//! thread safety.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod assignment;
mod batch;
mod client;
mod conn;
mod error;
pub mod ffi;
/// The named fields of a WebDataset sample (its tar members by
/// extension): the parser the C and Python APIs use too.
pub mod fields {
    pub use granary_shm::tar::{fields, Field, Fields, TarError};
}
mod heartbeat;
mod options;
mod session;
mod state;
mod view;
mod waits;

pub use assignment::{agree, encode_layout, Agreement};
pub use batch::{Batch, Sample};
pub use client::Client;
pub use error::{Error, Result};
pub use granary_shm::handshake::{
    AssignmentInfo, JobPosition, MembershipMode, PeerIdentity, ViewJoined,
};
pub use granary_shm::ErrorCode;
pub use options::{
    SessionInfo, SessionOptions, DEFAULT_BATCH_SIZE, DEFAULT_OPEN_TIMEOUT, DEFAULT_RESUME_TIMEOUT,
};
pub use session::{
    agent_silence_limit, Session, CLOSE_WAIT, MIN_AGENT_SILENCE, RELEASE_WAIT, WAIT_SLICE,
};
pub use state::SessionState;
pub use view::{encode_view, view_digest, ViewMember};

/// Version of the client ABI: the C header's `GRANARY_ABI_VERSION`, and the
/// value the handshake's open-session request carries.
pub const ABI_VERSION: u32 = ffi::GRANARY_ABI_VERSION;
