//! A session that outlives its agent: when the agent goes away (a crash,
//! `kill -9`, `systemctl restart`: it hangs up, closes the session or stops
//! beating), the session waits for it to come back, with doubling pauses
//! from 50 ms to 1 s, up to [`SessionOptions::resume_timeout`], and opens
//! the same plan again after the batches it has already handed out
//! (`OpenSession.first_batch`). The loader sees every batch of its plan once.
//!
//! Batches taken from the earlier session stay readable (they hold its
//! arena mapping); releasing them hands nothing to the new agent, which
//! never lent them. A fence is not resumed: the agent fenced this loader
//! for something it did.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use granary_shm::ErrorCode;

use super::Session;
use crate::error::{Error, Result};
use crate::options::SessionOptions;

/// First pause between two attempts to reach the agent again.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between two attempts.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a session needs to open itself again.
#[derive(Debug)]
pub(crate) struct Resume {
    path: PathBuf,
    options: SessionOptions,
    limit: Duration,
    /// Batches handed out since `options.first_batch`.
    handed: u64,
    /// Keys of the earlier sessions this one replaced.
    retired: Vec<u64>,
    /// How many times the session was reopened.
    count: u32,
}

impl Resume {
    /// What a session opened at `path` with `options` needs to resume;
    /// `None` when the options say to fail at once.
    pub(crate) fn new(path: &Path, options: &SessionOptions) -> Option<Resume> {
        Some(Resume {
            path: path.to_owned(),
            options: options.clone(),
            limit: options.resume_timeout?,
            handed: 0,
            retired: Vec::new(),
            count: 0,
        })
    }

    /// Counts one batch handed out.
    pub(crate) fn handed_out(&mut self) {
        self.handed += 1;
    }

    /// Whether a batch with session key `key` came from a session this
    /// one replaced.
    pub(crate) fn retired(&self, key: u64) -> bool {
        self.retired.contains(&key)
    }

    /// How many times the session was reopened.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// Whether `e`, from the session's stream, means the agent went away.
    pub(crate) fn applies_to(e: &Error) -> bool {
        e.code() == ErrorCode::Disconnected
    }

    /// Waits for the agent to come back and opens the plan again after the
    /// batches handed out; `old_key` is the key of the session that lost
    /// its agent. Fails with `Disconnected` naming `gone` and the last
    /// attempt's error once the limit has passed, or at once on an answer
    /// that waiting cannot change (a refused argument or permission).
    pub(crate) fn reopen(mut self, gone: &Error, old_key: u64) -> Result<Session> {
        let mut options = self.options.clone();
        options.first_batch = self.options.first_batch.saturating_add(self.handed);
        let deadline = Instant::now() + self.limit;
        let mut pause = FIRST_PAUSE;
        loop {
            let attempt =
                crate::conn::dial(&self.path).and_then(|conn| Session::open(conn, &options));
            match attempt {
                Ok(mut session) => {
                    self.retired.push(old_key);
                    self.count += 1;
                    session.set_resume(self);
                    return Ok(session);
                }
                Err(e) if worth_waiting(e.code()) && Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = granary_base::Backoff::new(FIRST_PAUSE, MAX_PAUSE).after(pause);
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorCode::Disconnected,
                        format!(
                            "{gone}; the session could not be resumed within {} ms after {} batches: {e}",
                            self.limit.as_millis(),
                            self.handed
                        ),
                    ))
                }
            }
        }
    }
}

/// Whether an agent that answers (or does not) with `code` may answer
/// otherwise later: not there yet, starting, loading its datasets, busy.
fn worth_waiting(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Disconnected
            | ErrorCode::Timeout
            | ErrorCode::NotFound
            | ErrorCode::Io
            | ErrorCode::Busy
            | ErrorCode::Closed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_agent_is_resumed_and_only_answers_that_may_change_are_waited_for() {
        assert!(Resume::applies_to(&Error::new(
            ErrorCode::Disconnected,
            "x"
        )));
        assert!(!Resume::applies_to(&Error::new(ErrorCode::Fenced, "x")));
        assert!(!Resume::applies_to(&Error::new(
            ErrorCode::EndOfStream,
            "x"
        )));
        assert!(worth_waiting(ErrorCode::Disconnected));
        assert!(worth_waiting(ErrorCode::NotFound));
        assert!(!worth_waiting(ErrorCode::InvalidArgument));
        assert!(!worth_waiting(ErrorCode::Permission));
        assert!(!worth_waiting(ErrorCode::Version));
    }

    #[test]
    fn no_timeout_means_no_resume() {
        let mut o = SessionOptions::new("d");
        assert!(Resume::new(Path::new("/x"), &o).is_some(), "on by default");
        o.resume_timeout = None;
        assert!(Resume::new(Path::new("/x"), &o).is_none());
    }

    #[test]
    fn an_agent_that_never_comes_back_fails_after_the_limit_naming_both_errors() {
        let dir = std::env::temp_dir().join(format!("granary-resume-{}", std::process::id()));
        let mut o = SessionOptions::new("d");
        o.resume_timeout = Some(Duration::from_millis(300));
        let r = Resume::new(&dir.join("absent.sock"), &o).expect("resume on");
        let gone = Error::new(ErrorCode::Disconnected, "the agent hung up (session 7)");
        let t0 = Instant::now();
        let e = r.reopen(&gone, 1).expect_err("no agent");
        let waited = t0.elapsed();
        assert_eq!(e.code(), ErrorCode::Disconnected);
        let msg = e.to_string();
        assert!(msg.contains("hung up") && msg.contains("300 ms"), "{msg}");
        assert!(
            waited >= Duration::from_millis(100) && waited < Duration::from_secs(3),
            "waited {waited:?}"
        );
    }
}
