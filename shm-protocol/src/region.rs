//! Mapped memory regions: a shared mapping of a file descriptor, or a zeroed
//! heap block with the same interface (so Miri and loom can run the logic that
//! sits on top).

use std::alloc::Layout;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// Alignment of heap regions (a page, like a real mapping).
pub const HEAP_ALIGN: usize = 4096;

enum Backing {
    Map(#[allow(dead_code)] memmap2::MmapRaw),
    Heap(Layout),
}

/// A contiguous block of memory that may be shared with another process.
///
/// The region never hands out references to its bytes: other processes may
/// write them at any moment, so callers go through raw pointers, atomics or
/// the copy-once helpers of [`crate::validate`].
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    backing: Backing,
}

// SAFETY: a Region is a pointer to memory it owns (heap) or keeps mapped
// (mmap) for its whole life; all access to the bytes goes through raw
// pointers and atomics whose users uphold the ring/segment protocols.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only exposes the base pointer and length.
unsafe impl Sync for Region {}

impl Region {
    /// A zeroed, page-aligned heap block of `len` bytes (`len` > 0).
    pub fn heap(len: usize) -> Region {
        let layout = Layout::from_size_align(len.max(1), HEAP_ALIGN).expect("heap region layout");
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Region {
            ptr,
            len,
            writable: true,
            backing: Backing::Heap(layout),
        }
    }

    /// Maps `len` bytes of `fd` shared and writable, optionally pre-faulting
    /// every page (`MAP_POPULATE`).
    pub fn map_shared_rw(fd: BorrowedFd<'_>, len: usize, populate: bool) -> io::Result<Region> {
        Self::map_shared(fd, len, populate, true)
    }

    /// Maps `len` bytes of `fd` shared and read-only.
    pub fn map_shared_ro(fd: BorrowedFd<'_>, len: usize, populate: bool) -> io::Result<Region> {
        Self::map_shared(fd, len, populate, false)
    }

    fn map_shared(
        fd: BorrowedFd<'_>,
        len: usize,
        populate: bool,
        writable: bool,
    ) -> io::Result<Region> {
        let mut opts = memmap2::MmapOptions::new();
        opts.len(len);
        if populate {
            opts.populate();
        }
        let map = if writable {
            opts.map_raw(fd.as_raw_fd())
        } else {
            opts.map_raw_read_only(fd.as_raw_fd())
        }?;
        Ok(Self::from_map(map, len, writable))
    }

    fn from_map(map: memmap2::MmapRaw, len: usize, writable: bool) -> Region {
        let ptr = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null on success");
        Region {
            ptr,
            len,
            writable,
            backing: Backing::Map(map),
        }
    }

    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this process may write the region.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// True when `[ptr, ptr+len)` lies inside the region.
    pub fn contains(&self, ptr: *const u8, len: usize) -> bool {
        let base = self.ptr.as_ptr() as usize;
        let p = ptr as usize;
        p >= base && p.checked_add(len).is_some_and(|end| end <= base + self.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `heap` with exactly this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        // Mappings unmap themselves when `MmapRaw` drops.
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("heap", &matches!(self.backing, Backing::Heap(_)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_region_is_zeroed_and_aligned() {
        let r = Region::heap(10_000);
        assert_eq!(r.as_ptr() as usize % HEAP_ALIGN, 0);
        assert_eq!(r.len(), 10_000);
        for i in 0..r.len() {
            // SAFETY: i < len, region is live and zero-initialised.
            assert_eq!(unsafe { r.as_ptr().wrapping_add(i).read() }, 0);
        }
        assert!(r.contains(r.as_ptr(), 10_000));
        assert!(!r.contains(r.as_ptr(), 10_001));
        assert!(!r.contains(r.as_ptr().wrapping_add(1), usize::MAX));
    }
}
