//! A mixture's source (`[[mixture]]`, `docs/mixtures.md`): its datasets'
//! sources one after the other, as one catalog.
//!
//! Sample `offset[k] + i` is sample `i` of source `k` (its id, label, size
//! and version token); a read goes to that source with the engine's tag,
//! so completions come back unchanged. One epoll descriptor holds every
//! source's wait descriptor, so the engine waits on the mixture as on any
//! source. The order of its epochs is its [`MixtureOrder`], which the
//! engine hands the planner ([`SampleSource::mixture`]).

use super::queue::poll_rounds;
use super::{Completion, SampleMeta, SampleSource, SourceFull};
use crate::config::{Config, MixtureConfig};
use crate::mixture::MixtureOrder;
use granary_shm::arena::ArenaSlice;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

/// The source of a mixture.
pub struct MixtureSource {
    members: Vec<Box<dyn SampleSource>>,
    order: Arc<MixtureOrder>,
    epoll: Epoll,
    total_bytes: u64,
    capacity: u32,
    read_block: u32,
}

impl MixtureSource {
    /// Opens every source of mixture `cfg` (blocking, as
    /// [`super::open`] does for each).
    ///
    /// # Errors
    ///
    /// The first source that cannot be opened (named), or a mixture its
    /// sources' catalogs cannot make ([`MixtureOrder::new`]).
    pub fn open(cfg: &MixtureConfig, agent: &Config) -> io::Result<MixtureSource> {
        let mut members = Vec::with_capacity(cfg.source.len());
        for s in &cfg.source {
            let ds = agent.dataset(&s.dataset).ok_or_else(|| {
                io::Error::other(format!(
                    "mixture {:?}: no dataset {:?}",
                    cfg.name, s.dataset
                ))
            })?;
            let source = super::open_mixture_member(ds, agent).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("mixture {:?}: dataset {:?}: {e}", cfg.name, s.dataset),
                )
            })?;
            members.push(source);
        }
        MixtureSource::new(cfg, members)
    }

    /// A mixture of `members` (opened, in `cfg.source`' order).
    ///
    /// # Errors
    ///
    /// As [`MixtureOrder::new`], or when the sources read different
    /// blocks (`direct_io` on some and not others).
    pub fn new(cfg: &MixtureConfig, members: Vec<Box<dyn SampleSource>>) -> io::Result<Self> {
        let sizes: Vec<u64> = members.iter().map(|m| m.len()).collect();
        let order = MixtureOrder::new(cfg, &sizes).map_err(io::Error::other)?;
        let blocks: Vec<u32> = members.iter().map(|m| m.read_block().max(1)).collect();
        let read_block = blocks.iter().copied().max().unwrap_or(1);
        if blocks.iter().any(|&b| b != read_block) {
            return Err(io::Error::other(format!(
                "mixture {:?}: its datasets read blocks of {blocks:?} bytes; \
                 mix datasets that all use direct_io or none",
                cfg.name
            )));
        }
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        for (k, m) in members.iter().enumerate() {
            epoll.add(m.wait_fd(), EpollEvent::new(EpollFlags::EPOLLIN, k as u64))?;
        }
        Ok(MixtureSource {
            total_bytes: members.iter().map(|m| m.total_bytes()).sum(),
            capacity: members
                .iter()
                .fold(0u32, |a, m| a.saturating_add(m.capacity())),
            members,
            order: Arc::new(order),
            epoll,
            read_block,
        })
    }

    fn member(&self, index: u64) -> (&dyn SampleSource, u64) {
        let (k, i) = self.order.member_of(index);
        (&*self.members[k], i)
    }
}

impl SampleSource for MixtureSource {
    fn kind(&self) -> &'static str {
        "mixture"
    }

    fn len(&self) -> u64 {
        self.order.index_space()
    }

    fn meta(&self, index: u64) -> SampleMeta {
        let (m, i) = self.member(index);
        SampleMeta {
            sample_id: index,
            ..m.meta(i)
        }
    }

    fn version(&self, index: u64, out: &mut Vec<u8>) {
        let (m, i) = self.member(index);
        m.version(i, out);
    }

    fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn describe(&self, index: u64) -> String {
        let (k, i) = self.order.member_of(index);
        format!(
            "{} (dataset {:?} of mixture {:?})",
            self.members[k].describe(i),
            self.order.sources()[k],
            self.order.name()
        )
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn read_block(&self) -> u32 {
        self.read_block
    }

    fn in_flight(&self) -> usize {
        self.members.iter().map(|m| m.in_flight()).sum()
    }

    fn submit(&mut self, tag: u64, index: u64, dest: ArenaSlice) -> Result<(), SourceFull> {
        let (k, i) = self.order.member_of(index);
        self.members[k].submit(tag, i, dest)
    }

    fn poll_completions(
        &mut self,
        wait: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> io::Result<usize> {
        let round = |s: &mut Self, out: &mut Vec<Completion>| {
            for m in &mut s.members {
                m.poll_completions(None, out)?;
            }
            Ok(s.in_flight())
        };
        poll_rounds(self, wait, out, round, |s| s.epoll.0.as_fd())
    }

    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    fn mixture(&self) -> Option<Arc<MixtureOrder>> {
        Some(Arc::clone(&self.order))
    }
}
