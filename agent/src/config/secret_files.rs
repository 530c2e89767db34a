//! Warnings about files that hold secrets but are readable by more than
//! the agent's user: the configuration file when it holds a store or peer
//! secret inline, and `peers.secret_file`. `granaryd validate` prints them
//! and `granaryd run` logs them; neither refuses to start, so that a
//! configuration without secrets can stay world-readable.

use super::{Config, DatasetConfig};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Permission bits that let a group or other users read a file.
const SHARED_READ: u32 = 0o044;

impl Config {
    /// The settings of this configuration that hold a secret inline, by
    /// name (`dataset[i].secret_access_key`, `dataset[i].password`,
    /// `peers.secret`).
    pub fn inline_secrets(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (i, d) in self.datasets.iter().enumerate() {
            match d {
                DatasetConfig::S3(s) if s.secret_access_key.is_some() => {
                    found.push(format!("dataset[{i}].secret_access_key"));
                }
                DatasetConfig::Cql(c) if c.password.is_some() => {
                    found.push(format!("dataset[{i}].password"));
                }
                DatasetConfig::Azure(a) => {
                    if a.access_key.is_some() {
                        found.push(format!("dataset[{i}].access_key"));
                    }
                    if a.sas_token.is_some() {
                        found.push(format!("dataset[{i}].sas_token"));
                    }
                }
                _ => {}
            }
        }
        if self.peers.secret.is_some() {
            found.push("peers.secret".to_owned());
        }
        found
    }

    /// One line per file holding a secret that its group or other users
    /// can read: the configuration file at `path` (when it holds a secret
    /// inline) and `peers.secret_file`. Empty when all is well (or a file's
    /// mode cannot be read).
    pub fn secret_file_warnings(&self, path: &Path) -> Vec<String> {
        let mut warnings = Vec::new();
        let secrets = self.inline_secrets();
        if !secrets.is_empty() {
            if let Some(mode) = shared_read(path) {
                warnings.push(format!(
                    "{} holds secrets ({}) and is readable by its group or other users \
                     (mode {mode:04o}): chmod 600 it, or move the secrets to the environment",
                    path.display(),
                    secrets.join(", ")
                ));
            }
        }
        if let Some(f) = &self.peers.secret_file {
            if let Some(mode) = shared_read(f) {
                warnings.push(format!(
                    "peers.secret_file {} is readable by its group or other users \
                     (mode {mode:04o}): chmod 600 it",
                    f.display()
                ));
            }
        }
        warnings
    }
}

/// The file's permission bits when its group or others may read it.
fn shared_read(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & SHARED_READ != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::Permissions;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(mode)).unwrap();
        p
    }

    const S3: &str = "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"\"\n\
                      access_key_id = \"AK\"\nsecret_access_key = \"sk-never-printed\"\n";

    #[test]
    fn a_readable_file_with_secrets_warns_and_a_private_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let open = write(dir.path(), "open.toml", S3, 0o644);
        let cfg = Config::load(&open).unwrap();
        assert_eq!(cfg.inline_secrets(), ["dataset[0].secret_access_key"]);
        let w = cfg.secret_file_warnings(&open);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("mode 0644") && w[0].contains("secret_access_key"),
            "{w:?}"
        );
        assert!(
            // Hyphens keep a random temporary folder's name from matching.
            !w[0].contains("sk-never-printed"),
            "the secret itself is never printed: {w:?}"
        );

        let private = write(dir.path(), "private.toml", S3, 0o600);
        assert!(cfg.secret_file_warnings(&private).is_empty());
        // Group-readable is shared too.
        let group = write(dir.path(), "group.toml", S3, 0o640);
        assert_eq!(cfg.secret_file_warnings(&group).len(), 1);
    }

    #[test]
    fn a_readable_file_without_secrets_is_fine_and_a_shared_peer_secret_file_warns() {
        let dir = tempfile::tempdir().unwrap();
        let plain = write(
            dir.path(),
            "plain.toml",
            "[[dataset]]\nname = \"d\"\nroot = \"/data\"\n",
            0o644,
        );
        let cfg = Config::load(&plain).unwrap();
        assert!(cfg.inline_secrets().is_empty());
        assert!(cfg.secret_file_warnings(&plain).is_empty());

        let secret = write(dir.path(), "peer.secret", "s3cr3t-s3cr3t-s3cr3t\n", 0o604);
        let mut cfg = cfg;
        cfg.peers.secret_file = Some(secret.clone());
        let w = cfg.secret_file_warnings(&plain);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("peers.secret_file") && w[0].contains("0604"),
            "{w:?}"
        );
        std::fs::set_permissions(&secret, Permissions::from_mode(0o400)).unwrap();
        assert!(cfg.secret_file_warnings(&plain).is_empty());
    }
}
