//! A connection's receive buffer: wire bytes received and not yet taken
//! apart, and room after them to read more into without a copy.
//!
//! Its storage stays initialized once grown, so the room handed to a read
//! is not filled with zeros again each time (for the ~96 KiB of room of an
//! established channel, that fill cost more than a fifth of a block's
//! crossing on a CPU with vector AES instructions). It grows only by what a
//! read asks for, so it never holds more than the connection ever asked to
//! read at once.

use std::fmt;

/// Received bytes `buf[..len]`, then spare room (stale bytes).
#[derive(Default)]
pub(crate) struct InputBuffer {
    buf: Vec<u8>,
    len: usize,
    /// Bytes of room handed out by the last [`InputBuffer::room`].
    lent: usize,
}

impl fmt::Debug for InputBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputBuffer")
            .field("len", &self.len)
            .field("room", &(self.buf.len() - self.len))
            .finish()
    }
}

impl InputBuffer {
    /// Bytes received (and not discarded).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes received.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The bytes received, to open records in place.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Appends `bytes` (a copy).
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.room(bytes.len()).copy_from_slice(bytes);
        self.filled(bytes.len());
    }

    /// `want` bytes of room after the bytes received, the storage grown
    /// (zero-filled) only where it is too short; report what was written
    /// there with [`InputBuffer::filled`].
    pub(crate) fn room(&mut self, want: usize) -> &mut [u8] {
        let end = self.len + want;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.lent = want;
        &mut self.buf[self.len..end]
    }

    /// The first `n` bytes of the room last handed out now hold received
    /// bytes (no more than that room).
    pub(crate) fn filled(&mut self, n: usize) {
        self.len += n.min(self.lent);
        self.lent = 0;
    }

    /// Drops the first `n` bytes received (all of them if fewer).
    pub(crate) fn discard(&mut self, n: usize) {
        let n = n.min(self.len);
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_reused_without_growing_and_bytes_stay_in_order() {
        let mut b = InputBuffer::default();
        b.extend(b"abc");
        let room = b.room(5);
        assert_eq!(room.len(), 5);
        room[..2].copy_from_slice(b"de");
        b.filled(2);
        assert_eq!(b.bytes(), b"abcde");
        b.discard(4);
        assert_eq!(b.bytes(), b"e");
        // The room asked for again fits in the storage already there: it
        // holds stale bytes, not zeros, and nothing grew.
        let cap = b.buf.len();
        assert_eq!(b.room(5).len(), 5);
        assert_eq!(b.buf.len(), cap);
        b.filled(0);
        assert_eq!(b.bytes(), b"e");
        // More than the room given is never counted as received, and a
        // report without a room counts nothing.
        b.room(1)[0] = b'f';
        b.filled(100);
        assert_eq!(b.bytes(), b"ef");
        b.filled(3);
        assert_eq!(b.len(), 2);
        b.discard(usize::MAX);
        assert_eq!(b.len(), 0);
        b.bytes_mut().iter_mut().for_each(|x| *x = 0);
    }
}
