//! The sans-IO core of Granary's peer layer: everything that several agents
//! must agree on, or that is parsed from another agent's bytes. No sockets,
//! no threads, no clock of its own: bytes and times in, events out.
#![forbid(unsafe_code)]

pub mod assign;
pub mod block;
pub mod conn;
pub mod frame;
pub mod keep;
pub mod owner;
pub mod serve;
pub mod view;
