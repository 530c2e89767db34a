//! What the tests of two engines as the peers of one job share: their
//! ports, their `[peers]` tables and turning them together.

use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1.
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The `[peers]` table of member `me` of a static job of two members
/// (`n0` and `n1`, keeping 16 MiB each) listening on 127.0.0.1 at `ports`,
/// with the `extra` keys.
pub(super) fn peers_toml(me: usize, ports: [u16; 2], extra: &str) -> String {
    format!(
        r#"
[peers]
membership = "static"
job_id = "job"
node_id = "n{me}"
listen = "127.0.0.1:{}"
secret = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23"
{extra}
members = [
  {{ id = "n0", addr = "127.0.0.1:{}", keep = "16MiB" }},
  {{ id = "n1", addr = "127.0.0.1:{}", keep = "16MiB" }},
]
"#,
        ports[me], ports[0], ports[1]
    )
}

/// Engines turned together.
pub(super) trait Engines: Sized {
    /// Turns each engine `n` times.
    fn turns(&mut self, n: usize);

    /// Turns the engines until `done` or 10 s (a failure naming `what`).
    fn until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.turns(1);
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}
