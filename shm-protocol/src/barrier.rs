//! Asymmetric memory barriers for the rings' wake-up protocol.
//!
//! The wake-up protocol (ring module docs, pair (C)) is a Dekker pattern: the
//! side about to park stores its `*_waiting` flag and re-checks the ring; the
//! publishing side stores its index and checks the flag. Each side needs a
//! store→load barrier between the two. Symmetric, that is a `SeqCst` fence on
//! every publication — about 20 ns, paid once per batch by the agent.
//!
//! The agent never parks on its hot path, the loader does, and parking is
//! already slow (a futex call). So when the kernel offers
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, the agent registers for it
//! and its publications use only a compiler fence, while a loader about to
//! park calls `membarrier`, which runs a full barrier on every CPU currently
//! executing a registered process. Either the agent's index store precedes
//! that barrier (the loader's re-check sees it) or the agent's flag load
//! follows it (the agent sees the flag): no wake-up is lost. The agent says
//! in the segment header ([`crate::layout::SEGMENT_FLAG_ASYMMETRIC`]) whether
//! it registered; without the flag both sides use `SeqCst` fences.

use crate::sync::{fence, Ordering};

/// Which barriers a ring end uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Barriers {
    /// `SeqCst` fences on both the publication and the parking side.
    #[default]
    Symmetric,
    /// The agent's ends, when registered: compiler fence after publishing,
    /// `SeqCst` fence before parking (a loader's publications stay symmetric).
    Agent,
    /// A loader's ends facing a registered agent: `SeqCst` fence after
    /// publishing, `membarrier` before parking.
    Loader,
}

impl Barriers {
    /// The barrier between publishing an index and checking the peer's
    /// waiting flag.
    #[inline]
    pub(crate) fn after_publish(self) {
        match self {
            Barriers::Agent => std::sync::atomic::compiler_fence(Ordering::SeqCst),
            _ => fence(Ordering::SeqCst),
        }
    }

    /// The barrier between announcing we will park and re-checking the ring.
    #[inline]
    pub(crate) fn before_park(self) {
        fence(Ordering::SeqCst);
        if self == Barriers::Loader {
            imp::global_expedited();
        }
    }
}

/// Registers this process for expedited global barriers, once. Returns
/// whether the asymmetric protocol may be used by this process as the agent.
pub fn register_agent() -> bool {
    imp::register()
}

#[cfg(all(not(feature = "loom"), not(miri)))]
mod imp {
    use std::sync::OnceLock;

    const CMD_QUERY: libc::c_int = 0;
    const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
    const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

    fn membarrier(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes two integers and touches no memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    pub(super) fn register() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| {
            let supported = membarrier(CMD_QUERY);
            supported >= 0
                && supported & libc::c_long::from(CMD_GLOBAL_EXPEDITED) != 0
                && supported & libc::c_long::from(CMD_REGISTER_GLOBAL_EXPEDITED) != 0
                && membarrier(CMD_REGISTER_GLOBAL_EXPEDITED) == 0
        })
    }

    pub(super) fn global_expedited() {
        if membarrier(CMD_GLOBAL_EXPEDITED) != 0 {
            // Cannot happen once the agent registered (the command exists);
            // fall back to what a fence can do and let the futex timeout
            // bound any delay.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[cfg(any(feature = "loom", miri))]
mod imp {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn global_expedited() {}
}

#[cfg(all(test, not(feature = "loom"), not(miri)))]
mod tests {
    #[test]
    fn registration_is_stable() {
        let first = super::register_agent();
        assert_eq!(first, super::register_agent());
        // The kernels this project targets (≥ 4.16) have the command.
        assert!(
            first,
            "membarrier GLOBAL_EXPEDITED unavailable on this kernel"
        );
        super::imp::global_expedited();
    }
}
