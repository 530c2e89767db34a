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
            Barriers::Agent => {
                // Under loom, the point where a loader's `membarrier` may
                // land in the agent's thread (see `model`).
                #[cfg(feature = "loom")]
                model::interrupt_point();
                std::sync::atomic::compiler_fence(Ordering::SeqCst)
            }
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

#[cfg(all(not(feature = "loom"), miri))]
mod imp {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn global_expedited() {}
}

#[cfg(feature = "loom")]
mod imp {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn global_expedited() {
        super::model::membarrier();
    }
}

/// The loom model of `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` between
/// one agent thread and the loaders of a model (docs/testing.md, "The
/// asymmetric barriers").
///
/// The kernel sends an interrupt to every CPU running the agent; each runs a
/// full barrier between two of the agent's instructions and acknowledges,
/// and the call returns once all have. Modelled the same way: the loader
/// posts a request (after its own `SeqCst` fence) and waits for the
/// acknowledgement; the agent serves a pending request at its next
/// [`interrupt_point`] with a `SeqCst` fence, then acknowledges. The points
/// are where the barrier can make a difference to the wake-up protocol:
/// before the agent's index store, between that store and its load of the
/// waiting flag (inside `after_publish`), and after the load; the model's
/// agent thread calls the first and last itself around each publication.
/// A thread that is not running has gone through a context switch, itself a
/// full barrier: [`agent_exit`] (fence, then a flag) stands for that, so a
/// loader's request never waits on an agent that has finished.
#[cfg(feature = "loom")]
pub mod model {
    use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering::SeqCst};

    struct Interrupts {
        requested: AtomicUsize,
        served: AtomicUsize,
        agent_gone: AtomicBool,
    }

    loom::lazy_static! {
        static ref STATE: Interrupts = Interrupts {
            requested: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            agent_gone: AtomicBool::new(false),
        };
    }

    /// The loader's side of the call: request, wait until served.
    pub(crate) fn membarrier() {
        let want = STATE.requested.fetch_add(1, SeqCst) + 1;
        while STATE.served.load(SeqCst) < want && !STATE.agent_gone.load(SeqCst) {
            loom::thread::yield_now();
        }
        fence(SeqCst);
    }

    /// A point of the agent's thread where a pending interrupt is served.
    pub fn interrupt_point() {
        let pending = STATE.requested.load(SeqCst);
        if pending > STATE.served.load(SeqCst) {
            fence(SeqCst);
            STATE.served.store(pending, SeqCst);
        }
    }

    /// The agent's thread stops running (call it last in the model's agent
    /// thread).
    pub fn agent_exit() {
        fence(SeqCst);
        STATE.agent_gone.store(true, SeqCst);
    }
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
