//! An agent's TOML configuration as the tests write it: the settings every
//! test agent shares (a small arena without hugepages, its socket, its
//! prefetch settings and metrics address) written once, the rest appended
//! by each test.

use std::fmt::Write as _;
use std::path::Path;

/// The `[prefetch]` settings of the multi-node tests: 32 reads in flight,
/// windows of 4 batches, starting at 2.
pub const PEER_PREFETCH: &str = "max_inflight_reads = 32\nwindow_batches = 4\ninitial_window = 2";

/// A 32-byte job secret in hex, strong enough for `peers.secret`.
pub const TEST_SECRET: &str = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23";

/// The head of an agent's TOML: `[arena]` of `arena` bytes (no hugepages,
/// not populated), `[socket]` at `sock`, `[prefetch]` with `prefetch` (its
/// keys, one a line) and `[metrics]` at `metrics` (`""`: none). Tables
/// that follow (`[peers]`, `[[dataset]]`) are appended by the caller.
pub fn head(arena: &str, sock: &Path, prefetch: &str, metrics: &str) -> String {
    head_with_socket(arena, sock, "", prefetch, metrics)
}

/// [`head`] with more `[socket]` keys (`socket`, one a line).
pub fn head_with_socket(
    arena: &str,
    sock: &Path,
    socket: &str,
    prefetch: &str,
    metrics: &str,
) -> String {
    let mut s = format!(
        "[arena]\nsize = \"{arena}\"\nhugepages = \"off\"\npopulate = false\n\
         [socket]\npath = \"{}\"\n",
        sock.display()
    );
    if !socket.is_empty() {
        let _ = writeln!(s, "{socket}");
    }
    let _ = write!(
        s,
        "[prefetch]\n{prefetch}\n[metrics]\naddress = \"{metrics}\"\n"
    );
    s
}

/// A `[peers]` table with `membership = "static"`: job `job`, this node
/// `node` listening on `listen`, `members` (a TOML array), and `extra` keys.
pub fn static_peers(job: &str, node: &str, listen: &str, secret: &str, members: &str) -> String {
    format!(
        "[peers]\nmembership = \"static\"\njob_id = \"{job}\"\nnode_id = \"{node}\"\n\
         listen = \"{listen}\"\nsecret = \"{secret}\"\nmembers = {members}\n"
    )
}

/// A `[[dataset]]` table named `name` over the files under `root`, with
/// `extra` keys (one a line, or `""`).
pub fn fs_dataset(name: &str, root: &Path, extra: &str) -> String {
    let mut s = format!(
        "[[dataset]]\nname = \"{name}\"\nroot = \"{}\"\n",
        root.display()
    );
    if !extra.is_empty() {
        let _ = writeln!(s, "{extra}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_and_tables_are_the_toml_tests_wrote_by_hand() {
        let toml = head(
            "64MiB",
            Path::new("/tmp/a.sock"),
            PEER_PREFETCH,
            "127.0.0.2:9",
        ) + &static_peers("j", "n0", "127.0.0.2:7", "s", "[]")
            + &fs_dataset("data", Path::new("/d"), "format = \"webdataset\"");
        assert_eq!(
            toml,
            r#"[arena]
size = "64MiB"
hugepages = "off"
populate = false
[socket]
path = "/tmp/a.sock"
[prefetch]
max_inflight_reads = 32
window_batches = 4
initial_window = 2
[metrics]
address = "127.0.0.2:9"
[peers]
membership = "static"
job_id = "j"
node_id = "n0"
listen = "127.0.0.2:7"
secret = "s"
members = []
[[dataset]]
name = "data"
root = "/d"
format = "webdataset"
"#
        );
    }
}
