//! What `--version` prints for Granary's binaries: the package version and
//! the commit they were built from. The build scripts (`scripts/test.sh`,
//! `scripts/quickstart.sh`, `scripts/wheel.sh`) set `GRANARY_COMMIT` from
//! git; a plain `cargo build` without it says so.

/// `VERSION (commit C)`, or a line that says the commit is unknown.
pub fn describe(package_version: &str, commit: Option<&str>) -> String {
    match commit {
        Some(c) if !c.is_empty() => format!("{package_version} (commit {c})"),
        _ => format!("{package_version} (commit unknown: built without GRANARY_COMMIT)"),
    }
}

/// The calling crate's [`describe`] as a `&'static str` (for clap's
/// `version`). A macro, so that `GRANARY_COMMIT` is read where the binary is
/// compiled: a new commit relinks the binaries, not this library.
#[macro_export]
macro_rules! build_version {
    () => {{
        static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        V.get_or_init(|| {
            $crate::version::describe(env!("CARGO_PKG_VERSION"), option_env!("GRANARY_COMMIT"))
        })
        .as_str()
    }};
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn the_commit_or_why_it_is_missing() {
        assert_eq!(describe("0.1.0", Some("abc123")), "0.1.0 (commit abc123)");
        for none in [None, Some("")] {
            assert_eq!(
                describe("0.1.0", none),
                "0.1.0 (commit unknown: built without GRANARY_COMMIT)"
            );
        }
    }
}
