//! A minimal io_uring whole-file reader: the equal-depth yardstick of the
//! `cold` benchmark.
//!
//! It keeps `depth` files in flight on one io_uring, each going through
//! `openat` → one `read` of the whole file into its own slot buffer →
//! `close`, and starts the next file when a slot's `close` completes. One
//! read per file, nothing else: no checksum, no statx, no copy out of the
//! slot. With `direct` the files are opened with `O_DIRECT` and each read
//! asks for the file's size rounded up to 4 KiB into a 4 KiB-aligned buffer
//! (the kernel returns the file's bytes and stops at its end).

use io_uring::{opcode, types, IoUring};
use std::alloc::Layout;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Buffer alignment (and `O_DIRECT` length granule).
const ALIGN: usize = 4096;

/// One file to read.
#[derive(Clone, Debug)]
pub struct FileToRead {
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes (the read must return exactly this many).
    pub size: u64,
}

/// What a pass over the files did.
#[derive(Clone, Debug)]
pub struct Pass {
    /// From the first submission to the last `close` completion.
    pub elapsed: Duration,
    /// Bytes the reads returned.
    pub bytes: u64,
    /// Files read.
    pub files: u64,
    /// Read requests submitted (one per file).
    pub reads: u64,
}

/// One zeroed, 4 KiB-aligned heap block holding every slot's buffer.
struct Slab {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Slab {
    fn new(len: usize) -> io::Result<Slab> {
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Slab { ptr, layout })
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// What a slot is waiting for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Idle,
    Open,
    Read,
    Close,
}

struct Slot {
    stage: Stage,
    file: usize,
    fd: i32,
    path: CString,
}

/// Reads every file of `files` once, `depth` files in flight.
pub fn read_all(files: &[FileToRead], depth: u32, direct: bool) -> io::Result<Pass> {
    let depth = depth.max(1) as usize;
    let max = files.iter().map(|f| f.size).max().unwrap_or(0) as usize;
    let slot_len = max.next_multiple_of(ALIGN).max(ALIGN);
    let slab = Slab::new(slot_len * depth)?;
    let entries = u32::try_from(depth.next_power_of_two())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "depth too large"))?;
    let mut ring = IoUring::new(entries)?;
    let mut flags = libc::O_RDONLY | libc::O_CLOEXEC;
    if direct {
        flags |= libc::O_DIRECT;
    }
    let mut slots: Vec<Slot> = (0..depth)
        .map(|_| Slot {
            stage: Stage::Idle,
            file: 0,
            fd: -1,
            path: CString::default(),
        })
        .collect();
    let start = Instant::now();
    match drive(&mut ring, files, &slab, slot_len, &mut slots, flags, direct) {
        Ok((bytes, reads)) => Ok(Pass {
            elapsed: start.elapsed(),
            bytes,
            files: files.len() as u64,
            reads,
        }),
        Err(e) => {
            // Requests may still be in flight and the kernel may still write
            // into the slab or read a path: leak both rather than free them
            // under it (this ends the benchmark anyway).
            std::mem::forget(slab);
            std::mem::forget(slots);
            Err(e)
        }
    }
}

/// Runs the passes' state machine; returns (bytes read, reads submitted).
fn drive(
    ring: &mut IoUring,
    files: &[FileToRead],
    slab: &Slab,
    slot_len: usize,
    slots: &mut [Slot],
    flags: i32,
    direct: bool,
) -> io::Result<(u64, u64)> {
    let (mut next, mut done, mut bytes, mut reads) = (0usize, 0usize, 0u64, 0u64);

    // Queues the next file on slot `s` (its open), if any is left.
    let open_next = |ring: &mut IoUring, slot: &mut Slot, s: usize, next: &mut usize| {
        if *next >= files.len() {
            slot.stage = Stage::Idle;
            return Ok(());
        }
        slot.file = *next;
        *next += 1;
        slot.path = CString::new(files[slot.file].path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        slot.stage = Stage::Open;
        let sqe = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), slot.path.as_ptr())
            .flags(flags)
            .build()
            .user_data(s as u64);
        push(ring, &sqe)
    };

    for (s, slot) in slots.iter_mut().enumerate() {
        open_next(ring, slot, s, &mut next)?;
    }
    while done < files.len() {
        ring.submit_and_wait(1)?;
        let completions: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (s, res) in completions {
            let slot = slots
                .get_mut(s)
                .ok_or_else(|| io::Error::other("completion for an unknown slot"))?;
            let file = &files[slot.file];
            if res < 0 {
                return Err(io::Error::other(format!(
                    "{}: {}",
                    file.path.display(),
                    io::Error::from_raw_os_error(-res)
                )));
            }
            match slot.stage {
                Stage::Open => {
                    slot.fd = res;
                    slot.stage = Stage::Read;
                    let want = if direct {
                        (file.size as usize).next_multiple_of(ALIGN)
                    } else {
                        file.size as usize
                    };
                    let buf = slab.ptr.as_ptr().wrapping_add(s * slot_len);
                    let sqe = opcode::Read::new(types::Fd(slot.fd), buf, want as u32)
                        .offset(0)
                        .build()
                        .user_data(s as u64);
                    reads += 1;
                    push(ring, &sqe)?;
                }
                Stage::Read => {
                    if res as u64 != file.size {
                        return Err(io::Error::other(format!(
                            "{}: read returned {res} bytes of {}",
                            file.path.display(),
                            file.size
                        )));
                    }
                    bytes += res as u64;
                    slot.stage = Stage::Close;
                    let sqe = opcode::Close::new(types::Fd(slot.fd))
                        .build()
                        .user_data(s as u64);
                    push(ring, &sqe)?;
                }
                Stage::Close => {
                    slot.fd = -1;
                    done += 1;
                    open_next(ring, slot, s, &mut next)?;
                }
                Stage::Idle => return Err(io::Error::other("completion for an idle slot")),
            }
        }
    }
    Ok((bytes, reads))
}

/// Pushes one entry (each slot has at most one in flight and the ring has
/// at least one entry per slot, so the queue has room).
fn push(ring: &mut IoUring, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: every pointer in the entry (the path of an open, the buffer of
    // a read) belongs to a slot that stays untouched until the entry
    // completes: `drive` waits for every completion, and on an error
    // `read_all` leaks the slots and the slab instead of freeing them.
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("submission queue full"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_byte_of_every_file_once() {
        let dir = std::env::temp_dir().join(format!("granary-uring-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for (i, size) in [0u64, 1, 4095, 4096, 4097, 100_000].iter().enumerate() {
            let path = dir.join(format!("f{i}"));
            std::fs::write(&path, vec![7u8; *size as usize]).unwrap();
            files.push(FileToRead { path, size: *size });
        }
        let pass = read_all(&files, 4, false).unwrap();
        assert_eq!(pass.files, 6);
        assert_eq!(pass.reads, 6);
        assert_eq!(pass.bytes, files.iter().map(|f| f.size).sum::<u64>());
        // A file shorter than its catalogued size is an error.
        files[2].size = 5000;
        assert!(read_all(&files, 4, false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
