//! The S3 store behind a benchmark's delay proxy: SeaweedFS (a real S3
//! server in its own process) or the light store (in this process, so
//! cheap that the clients, not the store, are measured). `bench/run
//! latency` and `bench/run stall` run on either.

use crate::light_store::LightStore;
use crate::seaweed::Seaweed;
use granary_agent::source::s3::S3Settings;
use std::net::SocketAddr;

/// The store behind the delay proxy.
pub enum Store {
    /// SeaweedFS (`weed mini`), a process of its own.
    Weed(Seaweed),
    /// The light store ([`crate::light_store`]), threads of this process.
    Light(LightStore),
}

impl Store {
    /// Its name in the output.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Weed(_) => "SeaweedFS",
            Store::Light(_) => "light store",
        }
    }

    /// The prefix of its keys in the last line (`""` for SeaweedFS, whose
    /// keys predate the light store's).
    pub fn key(&self) -> &'static str {
        match self {
            Store::Weed(_) => "",
            Store::Light(_) => "light_",
        }
    }

    /// Where its S3 endpoint listens.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Store::Weed(w) => w.s3_addr(),
            Store::Light(l) => l.addr(),
        }
    }

    /// The bucket the benchmark reads.
    pub fn bucket(&self) -> &str {
        match self {
            Store::Weed(w) => w.bucket(),
            Store::Light(l) => l.bucket(),
        }
    }

    /// SeaweedFS's process, whose CPU is read from `/proc` (none for the
    /// light store).
    pub fn weed_pid(&self) -> Option<u32> {
        match self {
            Store::Weed(w) => w.pid(),
            Store::Light(_) => None,
        }
    }

    /// Whether its CPU time is that of threads of this process.
    pub fn in_process(&self) -> bool {
        matches!(self, Store::Light(_))
    }

    /// The agent's S3 settings for the bucket through `addr` (the proxy).
    pub fn settings_via(&self, addr: SocketAddr) -> S3Settings {
        match self {
            Store::Weed(w) => w.settings_via(addr),
            Store::Light(l) => l.settings_via(addr),
        }
    }

    /// Credentials and region for a child process.
    pub fn env(&self) -> [(&'static str, String); 3] {
        match self {
            Store::Weed(w) => w.env(),
            Store::Light(l) => l.env(),
        }
    }

    /// One line for the output: what serves the bucket.
    pub fn describe(&self) -> &'static str {
        match self {
            Store::Weed(_) => {
                "SeaweedFS weed mini on 127.0.0.1, in-process delay proxy (RTT/2 each way)"
            }
            Store::Light(_) => {
                "light store (granary_bench::light_store: hyper HTTP/1.1, page-cache reads) in this process on 127.0.0.1, in-process delay proxy (RTT/2 each way)"
            }
        }
    }
}
