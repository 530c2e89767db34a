//! The one clock both sides of a segment read: `CLOCK_MONOTONIC`.
//!
//! `CLOCK_MONOTONIC` is one clock for every process of the machine (it does
//! not jump with the wall clock), so the agent can store a reading in
//! [`crate::layout::SegmentHeader::heartbeat_ms`] and a loader can compare it
//! with its own reading.

/// Milliseconds of `CLOCK_MONOTONIC` (time since an unspecified point, the
/// same for every process of the machine).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always
    // supported on Linux, so the call cannot fail (a failure would leave the
    // zeroed value, which only makes heartbeats look old).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_ms_advances_with_time() {
        let a = monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = monotonic_ms();
        assert!(a > 0);
        assert!(b >= a + 25, "{a} -> {b}");
        assert!(b < a + 10_000, "{a} -> {b}");
    }
}
