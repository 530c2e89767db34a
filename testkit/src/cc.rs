//! C programs built against libgranary, as the tests and benchmarks that
//! drive the C API from C build them.

use std::path::Path;
use std::process::Command;

/// The C compiler's command (`$CC`, else `cc`) that builds the C11 program
/// `source` (`-O2`, warnings as errors) with the headers in `include` into
/// `out`, linked against the `libgranary.so` in `lib` (and finding it there
/// when it runs). The caller adds any further libraries, then runs it.
pub fn cc_against_libgranary(include: &Path, source: &Path, lib: &Path, out: &Path) -> Command {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(cc);
    cmd.args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lgranary");
    cmd
}
