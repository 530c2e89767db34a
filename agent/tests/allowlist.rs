//! `socket.allowed_gids` admits a process by its supplementary groups as
//! well as by its primary group (`SO_PEERGROUPS`): processes that run as an
//! unprivileged user connect to a real engine and see whether the agent
//! refuses them at once. Needs root (to take another uid and set groups);
//! elsewhere it says so loudly and checks nothing.

mod common;

use common::{TestAgent, DATASET};
use granary_agent::config::Config;
use granary_tools::synth::{self, SynthSpec};
use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const NOBODY: u32 = 65534;
const MEMBERS: u32 = 4242;
const OTHERS: u32 = 4343;

/// What a child saw.
const ACCEPTED: i32 = 0;
const REFUSED: i32 = 2;

/// Forks a process that takes uid and primary gid `NOBODY` with
/// supplementary groups `groups`, connects to `sock` and exits with
/// [`ACCEPTED`] (the agent kept the connection open and silent for 1 s) or
/// [`REFUSED`] (it answered at once); other codes mean a set-up failure.
fn connect_as(sock: &Path, groups: &[u32]) -> i32 {
    let path = CString::new(sock.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: an all-zero sockaddr_un is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as libc::c_char;
    }
    let groups: Vec<libc::gid_t> = groups.to_vec();
    let mut cmd = Command::new("/bin/true");
    let child = move || -> std::io::Result<()> {
        let verdict = child_verdict(&addr, &groups);
        // SAFETY: _exit ends the forked child without running anything of
        // the parent's.
        unsafe { libc::_exit(verdict) }
    };
    // SAFETY: the closure runs in the forked child and makes only
    // async-signal-safe system calls on memory prepared before the fork; it
    // never returns (it exits with its verdict), so nothing is executed.
    unsafe {
        cmd.pre_exec(child);
    }
    let status = cmd.status().expect("fork the child");
    status.code().unwrap_or(-1)
}

/// In the forked child: takes the identity, connects, waits for an answer.
fn child_verdict(addr: &libc::sockaddr_un, groups: &[libc::gid_t]) -> i32 {
    // SAFETY: `groups` is a live array of `groups.len()` gids.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return 10;
    }
    // SAFETY: plain system calls on integers.
    if unsafe { libc::setgid(NOBODY) } != 0 || unsafe { libc::setuid(NOBODY) } != 0 {
        return 10;
    }
    // SAFETY: a plain system call on integers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
    if fd < 0 {
        return 11;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_un of `len` bytes.
    if unsafe { libc::connect(fd, std::ptr::from_ref(addr).cast(), len) } != 0 {
        return 12;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one live pollfd.
    if unsafe { libc::poll(&mut p, 1, 1000) } == 0 {
        ACCEPTED
    } else {
        REFUSED
    }
}

#[test]
fn supplementary_groups_are_allowed_like_primary_ones() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!(
            "******** allowlist: SKIPPED: not root, cannot run a loader as another user \
             with supplementary groups; the supplementary-group allowlist is NOT tested here"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    let mut spec = SynthSpec::new(&data);
    spec.num_files = 20;
    spec.mean_size = 2_000;
    spec.num_classes = 2;
    synth::generate(&spec, |_, _| {}).unwrap();
    let sock = dir.path().join("granary.sock");
    let cfg = Config::from_toml_str(&format!(
        "[arena]\nsize = \"64MiB\"\nhugepages = \"off\"\npopulate = false\n\
         [socket]\npath = \"{}\"\nmode = \"0666\"\nallowed_gids = [{MEMBERS}]\n\
         [prefetch]\nmax_inflight_reads = 32\n[metrics]\naddress = \"\"\n\
         [[dataset]]\nname = \"{DATASET}\"\nroot = \"{}\"\n",
        sock.display(),
        data.display()
    ))
    .unwrap();
    let agent = TestAgent::start_custom(dir, data, sock.clone(), spec, cfg, Vec::new());
    let refused0 = agent.metrics.connections_refused.get();

    assert_eq!(connect_as(&sock, &[OTHERS, MEMBERS]), ACCEPTED);
    assert_eq!(connect_as(&sock, &[MEMBERS]), ACCEPTED);
    assert_eq!(connect_as(&sock, &[]), REFUSED);
    assert_eq!(connect_as(&sock, &[OTHERS]), REFUSED);
    assert_eq!(agent.metrics.connections_refused.get(), refused0 + 2);
    agent.stop();
}
