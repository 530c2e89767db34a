//! A request's progress: what its completions mean for its next step,
//! and how it fails.

use std::io;

use super::*;
use crate::source::queue::Changed;

impl Op {
    pub(super) fn fail(&mut self, op: &'static str, errno: Option<i32>, short: Option<(u64, u64)>) {
        let target = self.path.to_string_lossy().into_owned();
        self.error = Some(
            ReadError {
                op,
                target,
                errno,
                short,
            }
            .into_io(),
        );
    }

    /// Folds the results of the step (or chain) that just finished into the
    /// request: progress, a decided error, or one more transient resubmit.
    pub(super) fn settle(&mut self) {
        let open = self.open_res.take();
        let read = self.read_res.take();
        let stat = self.stat_res.take();
        if std::mem::take(&mut self.timed_out) {
            // The step the timeout guarded was cancelled: no resubmit. (A
            // step that completed as its timeout fired keeps its result.)
            if open.is_some_and(|res| res < 0) {
                self.fail("open", Some(libc::ETIME), None);
                return;
            }
            if read.is_some_and(|res| res < 0) {
                self.fail("read", Some(libc::ETIME), None);
                return;
            }
        }
        if let Some(res) = open {
            if res < 0 {
                // A failed open cancels the linked read; its result means nothing.
                if self.opened_direct && res == -libc::EINVAL {
                    self.refuse_direct("open");
                } else {
                    self.transient_or_fail("open", -res);
                }
                return;
            }
        }
        match read {
            Some(res) if res >= 0 => {
                let from = u64::from(self.read_from());
                let reach = (from + u64::from(res.unsigned_abs())).min(u64::from(self.len));
                let reach = u32::try_from(reach).unwrap_or(self.len);
                if reach > self.done {
                    self.done = reach;
                } else if self.done < self.len {
                    self.fail(
                        "read",
                        None,
                        Some((u64::from(self.done), u64::from(self.len))),
                    );
                }
            }
            Some(res) if self.opened_direct && res == -libc::EINVAL => self.refuse_direct("read"),
            Some(res) => self.transient_or_fail("read", -res),
            None => {}
        }
        if self.error.is_none() && self.done >= self.len {
            if let (Some(expect), Some(stat)) = (self.expect, stat) {
                self.check(expect, stat);
            }
        }
    }

    /// Compares what `statx` found after the whole read with what the file
    /// was when catalogued.
    pub(super) fn check(&mut self, expect: FileStat, stat: Result<FileStat, i32>) {
        match stat {
            Ok(now) if now == expect => {}
            Ok(now) => {
                let mut what = Vec::new();
                if now.size != expect.size {
                    what.push(format!("size {} (catalogued {})", now.size, expect.size));
                }
                if now.mtime != expect.mtime {
                    what.push(format!(
                        "modified at {}.{:09} (catalogued {}.{:09})",
                        now.mtime.0, now.mtime.1, expect.mtime.0, expect.mtime.1
                    ));
                }
                let changed = Changed {
                    target: self.path.to_string_lossy().into_owned(),
                    what: what.join(", "),
                    size_differs: now.size != expect.size,
                };
                self.error = Some(io::Error::other(changed));
            }
            Err(res) => self.fail("statx", Some(-res), None),
        }
    }

    /// Goes on without `O_DIRECT`, which `step` just refused.
    pub(super) fn refuse_direct(&mut self, step: &'static str) {
        self.direct = false;
        self.refused = Some(step);
    }

    /// Where in the destination the next read starts: where the last one
    /// stopped, or with `O_DIRECT` the start of the block it stopped in.
    pub(super) fn read_from(&self) -> u32 {
        if self.opened_direct {
            self.done / DIRECT_BLOCK * DIRECT_BLOCK
        } else {
            self.done
        }
    }

    /// Whether the request's offset and destination are aligned to the
    /// block, so that a refusal of `O_DIRECT` is the device's, not the
    /// request's.
    pub(super) fn aligned(&self) -> bool {
        self.offset.is_multiple_of(u64::from(DIRECT_BLOCK))
            && self
                .dest
                .as_mut_ptr()
                .addr()
                .is_multiple_of(DIRECT_BLOCK as usize)
    }

    pub(super) fn transient_or_fail(&mut self, op: &'static str, errno: i32) {
        let transient = matches!(errno, libc::EINTR | libc::EAGAIN | libc::ECANCELED);
        if transient && self.resubmits < TRANSIENT_RESUBMITS {
            self.resubmits += 1;
        } else {
            self.fail(op, Some(errno), None);
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.error.is_some() || (self.issued && self.done >= self.len)
    }
}
