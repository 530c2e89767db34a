//! One cached sample's state (InFlight, Ready, Failed) and a registered
//! session's record.

use super::{Lookup, ReadySample, Residency};
use crate::extent::Extent;

#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    InFlight {
        extent: Extent,
        len: u64,
        pins: u32,
        residency: Residency,
    },
    Ready {
        extent: Extent,
        len: u64,
        crc32c: u32,
        pins: u32,
        residency: Residency,
    },
    Failed {
        code: u32,
        pins: u32,
    },
}

impl Entry {
    pub(super) fn state(&self) -> &'static str {
        match self {
            Entry::InFlight { .. } => "in flight",
            Entry::Ready { .. } => "ready",
            Entry::Failed { .. } => "failed",
        }
    }

    pub(super) fn lookup(&self) -> Lookup {
        match *self {
            Entry::InFlight {
                extent,
                len,
                pins,
                residency,
            } => Lookup::InFlight {
                extent,
                len,
                pins,
                residency,
            },
            Entry::Ready {
                extent,
                len,
                crc32c,
                pins,
                residency,
            } => Lookup::Ready(ReadySample {
                offset: extent.offset,
                len,
                crc32c,
                extent,
                pins,
                residency,
            }),
            Entry::Failed { code, pins } => Lookup::Failed { code, pins },
        }
    }
}

/// A registered session, as far as the cache checks calls.
#[derive(Debug, Clone, Copy)]
pub(super) struct SessionRecord {
    pub(super) position: u64,
    pub(super) total: u64,
}
