//! [`PeerTier`]'s reads waiting for an owner whose connection dropped
//! (`peers.owner_grace_ms`, `granary_peer::grace`): an agent killed and
//! restarted comes back with its arena (warm restart), so the samples it
//! keeps are waited for instead of read from the store by every other
//! agent meanwhile.
//!
//! * The grace of a member starts when its connection, up before, drops
//!   (or a get to it is lost with it, or it answers that it is shutting
//!   down). Reads of its samples then route to [`Route::Wait`]: their
//!   extents are reserved as for a peer read and the gets parked; gets in
//!   flight that were lost with the connection are parked too.
//! * While it is awaited the member is dialled every 100 ms; the first
//!   authenticated connection (it dialled us, or our probe reached it) ends
//!   the wait. A member restarted (a new incarnation in its hello) is asked
//!   the parked gets again; one its catalog does not hold yet (miss
//!   `unknown_dataset`: it is still listing) is asked again 100 ms later,
//!   within the grace. A member back with the incarnation it had never
//!   went away (its connection failed, a path cut): its parked gets go to
//!   the store, as without a grace, and its grace ends.
//! * A parked sample a loader is blocked on (see `engine/peers.rs`) waits
//!   at most `peers.owner_grace_blocked_ms`; the others, until the grace
//!   ends. What the grace does not bring is read from the store.
//!
//! [`Route::Wait`]: super::Route::Wait

use super::{PeerTier, PeerToken};
use granary_peer::conn::Nanos;
use granary_peer::frame::MissReason;
use granary_peer::grace::{Back, Release};
use granary_peer::request::{Sample, Why};

impl PeerTier {
    /// Parks a read of `want` (into `token`'s extent) until member
    /// `member`, whose connection dropped, is back, not before `delay`
    /// (`lost`: it was asked of the member and lost with its connection).
    pub(crate) fn park(
        &mut self,
        member: usize,
        token: PeerToken,
        want: Sample,
        lost: bool,
        delay: Nanos,
    ) {
        let now = self.net.nanos();
        self.grace.park(token, member, want, lost, now, delay);
    }

    /// Whether a get of `member`'s sample that ended with `why` waits for
    /// the member instead of going to the store: lost with its connection
    /// or refused because it is shutting down (its grace starts, if its
    /// connection was up and none runs), or answered "unknown dataset"
    /// while its grace runs (a restarted member still listing its
    /// catalog). Returns the delay before it is asked again.
    pub(crate) fn grace_takes(&mut self, member: usize, why: Why) -> Option<Nanos> {
        if !self.grace.enabled() {
            return None;
        }
        let now = self.net.nanos();
        match why {
            Why::Lost | Why::Miss(MissReason::ShuttingDown) => {
                if !self.grace.within(member, now) {
                    // The first news of the drop (the transport reports a
                    // connection's lost gets before the connection): only
                    // a member that was up, and is not up again.
                    let shutting = why == Why::Miss(MissReason::ShuttingDown);
                    let dropped = self.up.get(member) == Some(&true) && !self.net.is_up(member);
                    if !(shutting || dropped) {
                        return None;
                    }
                    self.grace_dropped(member);
                } else if why == Why::Miss(MissReason::ShuttingDown) {
                    self.grace.dropped(member, now);
                }
                // Not asked again at once should the member count as back
                // (its new connection lost too).
                Some(self.grace.retry_after())
            }
            Why::Miss(MissReason::UnknownDataset) if self.grace.within(member, now) => {
                Some(self.grace.retry_after())
            }
            _ => None,
        }
    }

    /// Member `member`'s connection, up before, dropped: its grace starts.
    pub(crate) fn grace_dropped(&mut self, member: usize) {
        let now = self.net.nanos();
        let fresh = !self.grace.within(member, now);
        self.grace.dropped(member, now);
        if fresh && self.grace.enabled() {
            tracing::info!(
                peer = self.member_id(member),
                grace_ms = self.grace.config().grace / 1_000_000,
                "peer went away: reads of its samples wait for it (peers.owner_grace_ms)"
            );
        }
    }

    /// A connection to member `member`, incarnation `incarnation`, is up:
    /// if it was awaited, its parked gets are asked again at the next
    /// [`grace_poll`](Self::grace_poll) (restarted) or read from the store
    /// (back as it was).
    pub(crate) fn grace_back(&mut self, member: usize, incarnation: u64) {
        let now = self.net.nanos();
        let parked = self.grace.parked().filter(|p| p.member == member).count();
        match self.grace.back(member, incarnation, now) {
            Back::NotAwaited => {}
            Back::Restarted => tracing::info!(
                peer = self.member_id(member),
                parked,
                "peer back restarted within its grace: the reads that waited for it are asked again"
            ),
            Back::Rejoined => tracing::info!(
                peer = self.member_id(member),
                parked,
                "peer back as it was (its connection failed, not the peer): the reads that \
                 waited for it are read from the store"
            ),
        }
    }

    /// Dials the members awaited, marks the parked samples a loader is
    /// blocked on (`blocked`), and appends what the grace releases to
    /// `out`: asked again, or for the store.
    pub(crate) fn grace_poll(
        &mut self,
        blocked: impl FnMut(&PeerToken) -> bool,
        out: &mut Vec<Release<PeerToken>>,
    ) {
        let now = self.net.nanos();
        for m in self.grace.probes(now) {
            self.net.probe(m);
        }
        if self.grace.is_empty() {
            return;
        }
        self.grace.mark_blocked(now, blocked);
        self.grace.poll(now, out);
    }

    /// Whether reads are parked.
    pub(crate) fn grace_parked(&self) -> bool {
        !self.grace.is_empty()
    }

    /// Every parked read, for the store (the tier stops).
    pub(crate) fn grace_drain(&mut self) -> Vec<PeerToken> {
        self.grace.drain()
    }

    /// Whether a connection to member `m` is up as the engine last heard
    /// (tests).
    #[cfg(test)]
    pub(crate) fn is_up_for_test(&self, m: usize) -> bool {
        self.up[m]
    }
}
