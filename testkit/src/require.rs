//! `require!`: a test's precondition that this machine may lack (a tool, a
//! kernel feature, root). Locally an unmet precondition skips the test
//! loudly: one line on stderr saying `SKIPPED`, which test, and why, so a
//! green run never hides what was not tested. Under `CI=1` it fails the
//! test instead: CI machines are set up to run everything they are asked to
//! run.

/// True when `CI` is `1` in the environment: unmet preconditions fail.
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "1")
}

/// The line printed for a skipped test, or the panic message under `CI=1`.
pub fn skip_line(test: &str, why: &str) -> String {
    format!("******** {test}: SKIPPED: {why}")
}

/// Reports an unmet precondition of `test`: prints the `SKIPPED` line
/// (straight to fd 2, past the harness's capture) and returns, or panics
/// with it under `CI=1`. [`require!`](crate::require!) calls this and then
/// returns from the test.
#[track_caller]
pub fn unmet(test: &str, why: &str) {
    let line = skip_line(test, why);
    if strict() {
        panic!("{line} (CI=1: an unmet precondition fails the test)");
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `require!(cond, "why {}", x)`: unless `cond` holds, the test is skipped
/// loudly (prints `SKIPPED` and why, then returns), or fails under `CI=1`.
#[macro_export]
macro_rules! require {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            $crate::require::unmet(module_path!(), &format!($($why)+));
            return;
        }
    };
}

/// `let v = require_ok!(result, "what {}", x);`: the `Ok` value, or the
/// test is skipped loudly with `what: the error` (fails under `CI=1`).
#[macro_export]
macro_rules! require_ok {
    ($e:expr, $($why:tt)+) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $crate::require::unmet(module_path!(), &format!("{}: {e}", format!($($why)+)));
                return;
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guarded(ok: bool, ran: &mut bool) {
        crate::require!(ok, "precondition {}", "unmet");
        *ran = true;
    }

    fn guarded_ok(r: Result<u32, String>, got: &mut Option<u32>) {
        let v = crate::require_ok!(r, "a pool");
        *got = Some(v);
    }

    #[test]
    fn an_unmet_precondition_skips_locally_and_fails_under_ci() {
        assert_eq!(skip_line("m", "no tool"), "******** m: SKIPPED: no tool");
        let mut ran = false;
        guarded(true, &mut ran);
        assert!(ran);
        let mut got = None;
        guarded_ok(Ok(7), &mut got);
        assert_eq!(got, Some(7));
        if strict() {
            // CI=1: the unmet precondition panics with the SKIPPED line.
            let r = std::panic::catch_unwind(|| guarded(false, &mut false));
            let msg = *r
                .expect_err("must fail under CI=1")
                .downcast::<String>()
                .unwrap();
            assert!(msg.contains("SKIPPED: precondition unmet"), "{msg}");
        } else {
            let mut ran = false;
            guarded(false, &mut ran);
            assert!(!ran, "the test body ran past an unmet precondition");
            let mut got = None;
            guarded_ok(Err("none".into()), &mut got);
            assert_eq!(got, None);
        }
    }
}
