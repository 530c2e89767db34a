//! Completions reaped into their requests, and each request's next step
//! (open, read, statx, close; chained or one at a time) built for the
//! ring.

use std::io;
use std::sync::Arc;

use super::*;
use crate::sys::uring::{Cqe, Entry, PushError, Step, Target};

impl UringReader {
    /// Moves every available CQE into its request, advancing those whose step
    /// or chain is complete.
    pub(super) fn reap(&mut self, out: &mut Vec<Completion>) {
        self.cqes.clear();
        self.ring.reap(&mut self.cqes);
        for i in 0..self.cqes.len() {
            let Some(&Cqe {
                slot,
                kind,
                result,
                stat,
            }) = self.cqes.get(i)
            else {
                break;
            };
            let linked = self.linked;
            let Some(Some(op)) = self.ops.get_mut(slot as usize) else {
                continue;
            };
            match kind {
                KIND_OPEN => {
                    op.open_res = Some(result);
                    if result >= 0 && !linked {
                        op.file = FileState::Open(result);
                    }
                }
                KIND_READ => op.read_res = Some(result),
                KIND_CLOSE => op.file = FileState::Closed,
                KIND_STATX => {
                    op.stat_res = Some(stat.ok_or(if result < 0 { result } else { -libc::EIO }));
                }
                _ => op.timed_out |= result == -libc::ETIME,
            }
            op.pending = op.pending.saturating_sub(1);
            if op.pending == 0 {
                self.advance(slot, out);
            }
        }
    }

    /// Decides and queues the next step of request `idx`, or finishes it.
    pub(super) fn advance(&mut self, idx: u32, out: &mut Vec<Completion>) {
        let linked = self.linked;
        let limit = self.timeout.as_ref().map(|(_, ts)| ts);
        let Some(Some(op)) = self.ops.get_mut(idx as usize) else {
            return;
        };
        op.settle();
        if let Some(step) = op.refused.take() {
            self.direct_refusals += 1;
            // An aligned request refused: the filesystem or the device.
            if self.direct_io && (step == "open" || op.aligned()) {
                self.direct_io = false;
                tracing::warn!(
                    "O_DIRECT refused ({step} {}: {}); this dataset's files are read through \
                     the page cache from now on",
                    op.path.to_string_lossy(),
                    io::Error::from_raw_os_error(libc::EINVAL)
                );
            }
        }
        let chain = match (op.finished(), op.file) {
            (true, FileState::Open(fd)) => {
                let mut chain = Vec::new();
                if op.error.is_none() && op.expect.is_some() && !op.stat_issued {
                    op.stat_issued = true;
                    chain.push(entry(
                        Step::Statx { path: &op.path },
                        KIND_STATX,
                        squeue::Flags::IO_HARDLINK,
                    ));
                }
                chain.push(entry(
                    Step::Close { fd: Target::Fd(fd) },
                    KIND_CLOSE,
                    squeue::Flags::empty(),
                ));
                chain
            }
            (true, FileState::Closed) => {
                if let Some(op) = self.ops.get_mut(idx as usize).and_then(Option::take) {
                    out.push(Completion {
                        tag: op.tag,
                        result: op.error.map_or(Ok(op.len), Err),
                    });
                }
                self.free.push(idx);
                return;
            }
            // Opened with O_DIRECT, which its read refused: closed, to be
            // opened again without.
            (false, FileState::Open(fd)) if op.opened_direct && !op.direct => vec![entry(
                Step::Close { fd: Target::Fd(fd) },
                KIND_CLOSE,
                squeue::Flags::empty(),
            )],
            (false, FileState::Open(fd)) => {
                guarded(read_step(op, Target::Fd(fd)), KIND_READ, limit, None)
            }
            (false, FileState::Closed) => {
                op.opened_direct = op.direct;
                let open = Step::Open {
                    path: &op.path,
                    fixed: linked,
                    o_direct: op.direct,
                };
                if linked {
                    let mut chain = guarded(open, KIND_OPEN, limit, Some(squeue::Flags::IO_LINK));
                    // A hard link: the close runs even after a short or
                    // timed-out read.
                    let read = read_step(op, Target::Fixed(idx));
                    chain.extend(guarded(
                        read,
                        KIND_READ,
                        limit,
                        Some(squeue::Flags::IO_HARDLINK),
                    ));
                    if op.expect.is_some() {
                        chain.push(entry(
                            Step::Statx { path: &op.path },
                            KIND_STATX,
                            squeue::Flags::IO_HARDLINK,
                        ));
                    }
                    chain.push(entry(
                        Step::Close {
                            fd: Target::Fixed(idx),
                        },
                        KIND_CLOSE,
                        squeue::Flags::empty(),
                    ));
                    chain
                } else {
                    guarded(open, KIND_OPEN, limit, None)
                }
            }
        };
        let n = u8::try_from(chain.len()).unwrap_or(u8::MAX);
        match self.ring.push(idx, &chain) {
            Ok(()) => {
                op.pending = n;
                op.issued = true;
            }
            Err(PushError::Full) => self.deferred.push(idx),
            Err(PushError::Invalid) => {
                // Not reached: a request's step is pushed only once its
                // previous one has completed, and reads fit their range.
                // Fail the request rather than submit it.
                op.fail("read", Some(libc::EINVAL), None);
                op.issued = true;
                self.deferred.push(idx);
            }
        }
    }
}

/// An entry of kind `kind` with link flags `flags`.
fn entry(step: Step<'_>, kind: u8, flags: squeue::Flags) -> Entry<'_> {
    Entry { step, kind, flags }
}

/// `step` alone, or, with a `limit`, `step` linked to an
/// `IORING_OP_LINK_TIMEOUT` that cancels it when the limit expires. `then`
/// links whatever follows in the chain to the last entry (`IO_LINK`, or
/// `IO_HARDLINK` to run it even when `step` fails).
fn guarded<'a>(
    step: Step<'a>,
    kind: u8,
    limit: Option<&'a Arc<types::Timespec>>,
    then: Option<squeue::Flags>,
) -> Vec<Entry<'a>> {
    let then = then.unwrap_or(squeue::Flags::empty());
    match limit {
        None => vec![entry(step, kind, then)],
        Some(limit) => vec![
            entry(step, kind, squeue::Flags::IO_LINK | then),
            entry(Step::LinkTimeout { limit }, KIND_TIMEOUT, then),
        ],
    }
}

/// A read of the rest of `op` through `fd`; with `O_DIRECT`, from the start
/// of the block where the last read stopped to the end of the last block.
fn read_step(op: &Op, fd: Target) -> Step<'_> {
    let at = op.read_from();
    let end = if op.opened_direct {
        op.len.next_multiple_of(DIRECT_BLOCK)
    } else {
        op.len
    };
    Step::Read {
        fd,
        dest: &op.dest,
        at,
        len: end - at,
        offset: op.offset + u64::from(at),
    }
}
