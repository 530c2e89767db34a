//! Phase 2: batches coming back. Every release the loader writes is copied
//! once and resolved through the session's private lease table; what the
//! loan held (pins, sample table) comes back. A release that names no loan
//! fences the session, and nobody else notices.

use super::Engine;
use granary_shm::ReleaseDescriptor;
use std::time::Instant;

impl Engine {
    /// Takes back released batches of session `sid`. Returns whether any
    /// came back (or the session was fenced).
    pub(super) fn reclaim(&mut self, sid: u64, now: Instant) -> bool {
        let mut buf = [ReleaseDescriptor::default(); 64];
        let mut loans = Vec::new();
        let mut any = false;
        loop {
            let Some(s) = self.sessions.get_mut(&sid) else {
                return any;
            };
            let dataset = s.dataset();
            let popped = s.reclaim(&mut buf, &mut loans, now);
            for loan in loans.drain(..) {
                self.return_loan(dataset, loan);
            }
            match popped {
                Ok(0) => return any,
                Ok(_) => any = true,
                Err(v) => {
                    self.fence(sid, v);
                    return true;
                }
            }
        }
    }
}
