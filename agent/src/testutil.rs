//! Helpers of the crate's unit tests.

use granary_shm::arena::{Arena, ArenaSlice};

/// Heap arena memory the tests read into, and back out of.
pub(crate) struct Mem {
    arena: Arena,
    len: usize,
}

impl Mem {
    /// `len` bytes, each `fill`.
    pub(crate) fn filled(len: usize, fill: u8) -> Mem {
        let arena = Arena::heap(len.max(1) as u64).expect("heap arena");
        arena.write_at(0, &vec![fill; len]).expect("fill");
        Mem { arena, len }
    }

    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Mem {
        Mem::filled(len, 0)
    }

    /// The range `at..at + len`, as a read's destination.
    pub(crate) fn at(&self, at: usize, len: usize) -> ArenaSlice {
        self.arena.slice(at as u64, len).expect("slice")
    }

    /// The whole memory, as a read's destination.
    pub(crate) fn all(&self) -> ArenaSlice {
        self.at(0, self.len)
    }

    /// A copy of the bytes.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.arena.read_at(0, self.len).expect("read back")
    }
}
