//! `granary secret new`: a fresh job secret for `peers.secret_file`
//! (`docs/configuration.md`, "The job secret").
//!
//! The file is written whole or not at all: the secret goes to a new
//! temporary file of mode 0600 in the target's folder, is synced, and is
//! then linked to its name, which fails if a file of that name exists, or,
//! with `force`, renamed over it. No reader ever sees a partial secret or a
//! secret readable by others.

use granary_agent::config::peer_secret;
use std::io::{self, Write};
use std::path::Path;

/// Writes a fresh secret (64 hexadecimal digits and a newline) to `path`
/// with mode 0600; an existing file is replaced only with `force`.
pub fn write_new(path: &Path, force: bool) -> io::Result<()> {
    let secret = peer_secret::generate()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // tempfile creates the file with O_EXCL and mode 0600.
    let mut tmp = tempfile::Builder::new()
        .prefix(".granary-secret-")
        .tempfile_in(dir)?;
    tmp.write_all(secret.as_bytes())?;
    tmp.write_all(b"\n")?;
    tmp.as_file().sync_all()?;
    let persisted = if force {
        tmp.persist(path)
    } else {
        tmp.persist_noclobber(path)
    };
    persisted.map_err(|e| {
        if e.error.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists; --force replaces it", path.display()),
            )
        } else {
            e.error
        }
    })?;
    // The new name is durable once its folder is synced.
    std::fs::File::open(dir)?.sync_all()
}

/// A fresh secret, as [`write_new`] writes it, for standard output.
pub fn new_line() -> io::Result<String> {
    Ok(peer_secret::generate()? + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_secret_file_is_private_strong_and_never_overwritten_unasked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.secret");
        write_new(&p, false).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let first = std::fs::read_to_string(&p).unwrap();
        assert_eq!(first.len(), 65);
        assert!(first.ends_with('\n'));
        peer_secret::check(first.trim_end().as_bytes()).unwrap();
        // An existing file is kept, and the error says how to replace it.
        let e = write_new(&p, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("--force"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), first);
        // --force replaces it, even one readable by others, with a private one.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_new(&p, true).unwrap();
        let second = std::fs::read_to_string(&p).unwrap();
        assert_ne!(second, first);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("job.secret")]);
        // A folder that does not exist: an error, nothing written.
        assert!(write_new(&dir.path().join("no/such/job.secret"), false).is_err());
        let line = new_line().unwrap();
        assert_eq!(line.len(), 65);
        peer_secret::check(line.trim_end().as_bytes()).unwrap();
    }
}
