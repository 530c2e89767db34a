//! Sessions registered with the clairvoyant policy, and how far each got.

use super::*;

impl Cache {
    /// Registers session `id`, which will read `dataset` in the order of
    /// `plan`, at position 0.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: a duplicate id or a plan that cannot be
    /// indexed.
    pub(crate) fn add_session(
        &mut self,
        id: SessionId,
        dataset: u32,
        plan: SessionPlan,
    ) -> Result<(), CacheError> {
        if self.sessions.contains_key(&id) {
            return Err(FutureError::DuplicateSession(id).into());
        }
        let (_, total) = future::session_length(&plan).map_err(FutureError::Plan)?;
        self.policy.add_session(id, dataset, plan)?;
        self.sessions
            .insert(id, SessionRecord { position: 0, total });
        Ok(())
    }

    /// Session `id` has been delivered its first `position` samples (the
    /// global sequence number of the next one): call it as batches are
    /// published. Positions never go back.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session, or a position behind the
    /// current one or past the session's end.
    pub(crate) fn advance_session(
        &mut self,
        id: SessionId,
        position: u64,
    ) -> Result<(), CacheError> {
        let record = self
            .sessions
            .get(&id)
            .copied()
            .ok_or(FutureError::UnknownSession(id))?;
        FutureError::check_advance(id, record.position, record.total, position)?;
        self.policy.advance_session(id, position)?;
        self.sessions
            .insert(id, SessionRecord { position, ..record });
        Ok(())
    }

    /// Samples `a` and `b` of session `id`'s dataset traded places in its
    /// delivery order (relaxed order): the clairvoyant policy's next-use
    /// distances follow what is really delivered.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session.
    pub(crate) fn swap_in_session(
        &mut self,
        id: SessionId,
        a: u64,
        b: u64,
    ) -> Result<(), CacheError> {
        if !self.sessions.contains_key(&id) {
            return Err(FutureError::UnknownSession(id).into());
        }
        self.policy.swap_in_session(id, a, b)?;
        Ok(())
    }

    /// Moves session `id` forward by `count` samples:
    /// [`advance_session`](Self::advance_session) to its position plus
    /// `count`.
    ///
    /// # Errors
    ///
    /// As [`advance_session`](Self::advance_session).
    pub(crate) fn advance_session_by(
        &mut self,
        id: SessionId,
        count: u64,
    ) -> Result<(), CacheError> {
        let position = self
            .session_position(id)
            .ok_or(FutureError::UnknownSession(id))?;
        self.advance_session(id, position.saturating_add(count))
    }

    /// Forgets session `id` (finished, closed or dead). Its pins are the
    /// session engine's to release.
    ///
    /// # Errors
    ///
    /// [`CacheError::Session`]: unknown session.
    pub(crate) fn remove_session(&mut self, id: SessionId) -> Result<(), CacheError> {
        if !self.sessions.contains_key(&id) {
            return Err(FutureError::UnknownSession(id).into());
        }
        self.policy.remove_session(id)?;
        self.sessions.remove(&id);
        Ok(())
    }

    /// Session `id`'s position, if registered.
    pub(crate) fn session_position(&self, id: SessionId) -> Option<u64> {
        self.sessions.get(&id).map(|r| r.position)
    }
}
