//! `SOCK_SEQPACKET` Unix sockets: message boundaries are kept, file
//! descriptors travel with a message (`SCM_RIGHTS`), and a peer's hang-up is
//! visible (a zero-length read, `POLLHUP`).
//!
//! Received descriptors are always close-on-exec (`MSG_CMSG_CLOEXEC`) and
//! owned ([`OwnedFd`]): whatever path a message takes, including rejection,
//! its descriptors are closed exactly once.

use std::fmt;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::socket::{
    self, sockopt, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::time::TimeVal;

use crate::error::ErrorCode;
use crate::handshake::{self, Message, ProtocolError, MAX_FRAME};

/// Most file descriptors one message may carry. A message with more is
/// dropped and all of its descriptors closed.
pub const MAX_FDS: usize = 8;

/// Bytes of `int` per descriptor in `SCM_RIGHTS` data.
const FD_BYTES: usize = std::mem::size_of::<RawFd>();

/// Control-buffer size for one `SCM_RIGHTS` message of [`MAX_FDS`] fds.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument.
const CMSG_CAPACITY: usize = unsafe { libc::CMSG_SPACE((MAX_FDS * FD_BYTES) as u32) } as usize;

/// `cmsg_len` of an empty control message (header only).
// SAFETY: CMSG_LEN is pure arithmetic on its argument.
const CMSG_HEADER_LEN: usize = unsafe { libc::CMSG_LEN(0) } as usize;

/// Control-message buffer with the alignment `cmsghdr` needs.
#[repr(C)]
struct CmsgBuffer {
    _align: [libc::cmsghdr; 0],
    bytes: [u8; CMSG_CAPACITY],
}

fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes written into the caller's buffer. Zero with no fds means the
    /// peer hung up ([`SeqPacket::send`] refuses empty messages).
    pub len: usize,
    /// Descriptors that came with the message (at most [`MAX_FDS`]).
    pub fds: Vec<OwnedFd>,
    /// The message was longer than the buffer; its tail is lost.
    pub truncated: bool,
}

/// Credentials of the process at the other end, as the kernel recorded them
/// at `connect`/`socketpair` time (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// Why [`SeqPacket::recv_message`] returned no message.
#[derive(Debug)]
pub enum SocketError {
    /// The socket call failed (an expired read timeout is `TimedOut`, an
    /// empty non-blocking socket `WouldBlock`).
    Io(io::Error),
    /// The peer closed its end.
    HungUp,
    /// The message is not a valid handshake frame.
    Protocol(ProtocolError),
    /// The message is longer than [`MAX_FRAME`]; it was dropped.
    Truncated,
    /// The message carried more than [`MAX_FDS`] descriptors, or control
    /// data that did not fit; it was dropped and its descriptors closed.
    ControlTruncated,
}

impl SocketError {
    /// The stable code for this error: `Timeout` for a read timeout,
    /// `WouldBlock` on a non-blocking socket with nothing to read,
    /// `Disconnected` for a hang-up or another socket failure, the
    /// protocol error's code for a bad frame, `Protocol` for an oversized
    /// message.
    pub fn code(&self) -> ErrorCode {
        match self {
            SocketError::Io(e) => match e.kind() {
                io::ErrorKind::WouldBlock => ErrorCode::WouldBlock,
                io::ErrorKind::TimedOut => ErrorCode::Timeout,
                _ => ErrorCode::Disconnected,
            },
            SocketError::HungUp => ErrorCode::Disconnected,
            SocketError::Protocol(p) => p.code(),
            SocketError::Truncated | SocketError::ControlTruncated => ErrorCode::Protocol,
        }
    }
}

impl fmt::Display for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketError::Io(e) => write!(f, "socket error: {e}"),
            SocketError::HungUp => f.write_str("peer hung up"),
            SocketError::Protocol(p) => write!(f, "{p}"),
            SocketError::Truncated => write!(
                f,
                "message longer than {MAX_FRAME} bytes dropped"
            ),
            SocketError::ControlTruncated => write!(
                f,
                "message with more than {MAX_FDS} file descriptors (or oversized control data) dropped, descriptors closed"
            ),
        }
    }
}

impl std::error::Error for SocketError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SocketError::Io(e) => Some(e),
            SocketError::Protocol(p) => Some(p),
            _ => None,
        }
    }
}

impl From<io::Error> for SocketError {
    fn from(e: io::Error) -> Self {
        SocketError::Io(e)
    }
}

impl From<ProtocolError> for SocketError {
    fn from(e: ProtocolError) -> Self {
        SocketError::Protocol(e)
    }
}

/// Internal outcome of one `recvmsg`.
enum RecvError {
    Io(io::Error),
    /// `MSG_CTRUNC`, or more than [`MAX_FDS`] fds: everything that arrived
    /// has been closed.
    ControlTruncated,
}

/// A connected `SOCK_SEQPACKET` Unix socket.
#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

impl SeqPacket {
    /// Connects to the listener bound at `path`.
    pub fn connect(path: &Path) -> io::Result<SeqPacket> {
        let addr = UnixAddr::new(path).map_err(errno_io)?;
        let fd = new_socket()?;
        socket::connect(fd.as_raw_fd(), &addr).map_err(errno_io)?;
        Ok(SeqPacket { fd })
    }

    /// A connected pair (`socketpair`), both ends close-on-exec.
    pub fn pair() -> io::Result<(SeqPacket, SeqPacket)> {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(errno_io)?;
        Ok((SeqPacket { fd: a }, SeqPacket { fd: b }))
    }

    /// Wraps an already connected `SOCK_SEQPACKET` socket.
    pub fn from_owned_fd(fd: OwnedFd) -> SeqPacket {
        SeqPacket { fd }
    }

    /// Sends one message with up to [`MAX_FDS`] descriptors attached.
    ///
    /// Empty messages without descriptors are refused (`InvalidInput`),
    /// because the receiver reads them as a hang-up. Never raises
    /// `SIGPIPE`: a closed peer is `BrokenPipe`.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} file descriptors in one message, the limit is {MAX_FDS}",
                    fds.len()
                ),
            ));
        }
        if bytes.is_empty() && fds.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty message without descriptors (reads as a hang-up)",
            ));
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        let iov = [IoSlice::new(bytes)];
        loop {
            match socket::sendmsg::<()>(
                self.fd.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("sent {n} of {} bytes of a message", bytes.len()),
                    ))
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(errno_io(e)),
            }
        }
    }

    /// Receives one message into `buf`.
    ///
    /// A message with more than [`MAX_FDS`] descriptors (or any control
    /// data that did not fit) is dropped, every descriptor that arrived is
    /// closed, and the call fails with `InvalidData`. An expired read
    /// timeout fails with `TimedOut`; a non-blocking socket with nothing to
    /// read fails with `WouldBlock`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        self.recv_inner(buf).map_err(|e| match e {
            RecvError::Io(e) => e,
            RecvError::ControlTruncated => io::Error::new(
                io::ErrorKind::InvalidData,
                SocketError::ControlTruncated.to_string(),
            ),
        })
    }

    fn recv_inner(&self, buf: &mut [u8]) -> Result<Received, RecvError> {
        let mut cmsg = CmsgBuffer {
            _align: [],
            bytes: [0; CMSG_CAPACITY],
        };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain old data (pointers, integers, padding);
        // all-zero is a valid value (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.bytes.as_mut_ptr().cast();
        msg.msg_controllen = CMSG_CAPACITY as _;
        let n = loop {
            // SAFETY: `msg` points at `iov` (which covers `buf`) and at
            // `cmsg.bytes`, all live and exclusively borrowed for the call;
            // the lengths given are those of the buffers.
            let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if r >= 0 {
                break r.unsigned_abs();
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if self.read_timeout_expired() => {
                    return Err(RecvError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "read timeout expired",
                    )))
                }
                _ => return Err(RecvError::Io(err)),
            }
        };
        // Take ownership of every descriptor the kernel installed before
        // deciding anything, so that each is closed exactly once.
        let fds = take_rights(&msg);
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MAX_FDS {
            drop(fds);
            return Err(RecvError::ControlTruncated);
        }
        Ok(Received {
            len: n.min(buf.len()),
            fds,
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        })
    }

    /// After `EAGAIN`: true if it came from an expired `SO_RCVTIMEO` on a
    /// blocking socket rather than from non-blocking mode.
    fn read_timeout_expired(&self) -> bool {
        let blocking = fcntl(&self.fd, FcntlArg::F_GETFL)
            .is_ok_and(|f| !OFlag::from_bits_retain(f).contains(OFlag::O_NONBLOCK));
        let timeout_set = socket::getsockopt(&self.fd, sockopt::ReceiveTimeout)
            .is_ok_and(|tv| tv.tv_sec() != 0 || tv.tv_usec() != 0);
        blocking && timeout_set
    }

    /// Encodes and sends one handshake message with its descriptors.
    pub fn send_message(&self, msg: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let frame = handshake::encode_to_vec(msg);
        self.send(&frame, fds)
    }

    /// Receives and decodes one handshake message and its descriptors. On
    /// any error the descriptors that came with the message are closed.
    pub fn recv_message(&self) -> Result<(Message, Vec<OwnedFd>), SocketError> {
        let mut buf = vec![0u8; MAX_FRAME];
        let r = match self.recv_inner(&mut buf) {
            Ok(r) => r,
            Err(RecvError::Io(e)) => return Err(SocketError::Io(e)),
            Err(RecvError::ControlTruncated) => return Err(SocketError::ControlTruncated),
        };
        if r.truncated {
            return Err(SocketError::Truncated);
        }
        if r.len == 0 && r.fds.is_empty() {
            return Err(SocketError::HungUp);
        }
        let msg = handshake::decode_frame(&buf[..r.len])?;
        Ok((msg, r.fds))
    }

    /// Sets (or with `None` clears) a timeout on receiving; an expired wait
    /// fails with `TimedOut`. A zero duration is refused.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let tv = match timeout {
            None => TimeVal::new(0, 0),
            Some(d) if d.is_zero() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a zero read timeout is not allowed (use None to block)",
                ))
            }
            Some(d) => {
                let secs = libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX);
                // Round sub-microsecond timeouts up: zero would mean "never".
                let usecs = if secs == 0 {
                    d.subsec_micros().max(1)
                } else {
                    d.subsec_micros()
                };
                TimeVal::new(secs, libc::suseconds_t::from(usecs))
            }
        };
        socket::setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv).map_err(errno_io)
    }

    /// Switches non-blocking mode on or off.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), nonblocking)
    }

    /// Credentials of the peer process (`SO_PEERCRED`).
    pub fn peer_credentials(&self) -> io::Result<PeerCred> {
        let c = socket::getsockopt(&self.fd, sockopt::PeerCredentials).map_err(errno_io)?;
        Ok(PeerCred {
            pid: c.pid(),
            uid: c.uid(),
            gid: c.gid(),
        })
    }

    /// Whether the peer has closed its end (or the socket is in error),
    /// without blocking. True as soon as the peer is gone, even if messages
    /// it sent are still unread.
    pub fn peer_hung_up(&self) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        loop {
            // SAFETY: `pfd` is one valid, exclusively borrowed pollfd and the
            // count passed is 1; a zero timeout never blocks.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            if r >= 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        Ok(pfd.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0)
    }
}

/// `AsFd` and `AsRawFd` for socket types that own their descriptor in `fd`.
macro_rules! lend_fd {
    ($($socket:ty),*) => {$(
        impl AsFd for $socket {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.fd.as_fd()
            }
        }

        impl AsRawFd for $socket {
            fn as_raw_fd(&self) -> RawFd {
                self.fd.as_raw_fd()
            }
        }
    )*};
}

lend_fd!(SeqPacket, SeqPacketListener);

impl From<SeqPacket> for OwnedFd {
    fn from(s: SeqPacket) -> OwnedFd {
        s.fd
    }
}

/// Collects every descriptor of every `SCM_RIGHTS` message in `msg`'s
/// control data as owned fds.
fn take_rights(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled in by a successful recvmsg; its control
    // pointer and (kernel-updated) length describe our live buffer.
    let mut cur = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cur.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return null or a pointer to a
        // whole header inside the control buffer; the buffer is aligned for
        // cmsghdr, but read unaligned anyway to assume nothing.
        let hdr = unsafe { cur.read_unaligned() };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: `cur` is a valid header (see above); CMSG_DATA only
            // offsets the pointer past the header.
            let data = unsafe { libc::CMSG_DATA(cur) };
            // cmsg_len is size_t with glibc but socklen_t with musl.
            #[allow(clippy::useless_conversion)]
            let data_len = usize::try_from(hdr.cmsg_len)
                .unwrap_or(0)
                .saturating_sub(CMSG_HEADER_LEN);
            for i in 0..data_len / FD_BYTES {
                let slot = data.wrapping_add(i * FD_BYTES).cast::<RawFd>();
                // SAFETY: the kernel wrote `cmsg_len` bytes for this header,
                // so `data_len / FD_BYTES` ints follow CMSG_DATA inside the
                // buffer and `slot` is one of them; it may be unaligned.
                let raw = unsafe { slot.read_unaligned() };
                if raw >= 0 {
                    // SAFETY: SCM_RIGHTS descriptors were just installed in
                    // this process for us alone; nothing else owns them.
                    fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
        }
        // SAFETY: `msg` and `cur` are valid as above; CMSG_NXTHDR checks the
        // next header against msg_controllen and returns null past the end.
        cur = unsafe { libc::CMSG_NXTHDR(msg, cur) };
    }
    fds
}

fn new_socket() -> io::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(errno_io)
}

fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    let bits = fcntl(fd, FcntlArg::F_GETFL).map_err(errno_io)?;
    let mut flags = OFlag::from_bits_retain(bits);
    flags.set(OFlag::O_NONBLOCK, nonblocking);
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(errno_io)?;
    Ok(())
}

/// A listening `SOCK_SEQPACKET` Unix socket bound to a path. The socket file
/// is removed on drop (if it is still the one this listener created).
#[derive(Debug)]
pub struct SeqPacketListener {
    fd: OwnedFd,
    path: PathBuf,
    /// (device, inode) of the socket file created by `bind`.
    id: (u64, u64),
}

impl SeqPacketListener {
    /// Binds and listens at `path`, with file permissions `mode`
    /// (e.g. `0o660`).
    ///
    /// A socket file left at `path` by a dead process is replaced. A live
    /// listener there makes this fail with `AddrInUse` (the probe that finds
    /// out connects once, so that listener accepts a connection that hangs
    /// up at once); anything that is not a socket makes it fail with
    /// `AlreadyExists`. The permissions are
    /// set before `listen`, so nobody connects through looser ones.
    pub fn bind(path: &Path, mode: u32) -> io::Result<SeqPacketListener> {
        let addr = UnixAddr::new(path).map_err(errno_io)?;
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if SeqPacket::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{} is in use by a live listener", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; refusing to replace it",
                        path.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let fd = new_socket()?;
        socket::bind(fd.as_raw_fd(), &addr).map_err(errno_io)?;
        let meta = std::fs::symlink_metadata(path)?;
        // From here on, drop removes the file.
        let listener = SeqPacketListener {
            fd,
            path: path.to_owned(),
            id: (meta.dev(), meta.ino()),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
        socket::listen(&listener.fd, Backlog::MAXCONN).map_err(errno_io)?;
        Ok(listener)
    }

    /// Accepts one connection; the new socket is close-on-exec (and
    /// blocking, whatever the listener's mode).
    pub fn accept(&self) -> io::Result<SeqPacket> {
        loop {
            match socket::accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                Ok(raw) => {
                    // SAFETY: accept4 returned a new descriptor that nothing
                    // else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    return Ok(SeqPacket { fd });
                }
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(e) => return Err(errno_io(e)),
            }
        }
    }

    /// Switches non-blocking mode on or off (then `accept` fails with
    /// `WouldBlock` when no connection is pending).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), nonblocking)
    }

    /// The path the listener is bound to.
    pub fn local_path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SeqPacketListener {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{ErrorReply, OpenSession, SessionOpened};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::{Read, Seek, SeekFrom, Write};

    fn memfd_with(content: &[u8]) -> OwnedFd {
        let fd = memfd_create("granary-test", MFdFlags::MFD_CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(content).unwrap();
        OwnedFd::from(f)
    }

    fn read_all(fd: OwnedFd) -> Vec<u8> {
        let mut f = std::fs::File::from(fd);
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    fn is_cloexec(fd: &OwnedFd) -> bool {
        let flags = fcntl(fd, FcntlArg::F_GETFD).unwrap();
        flags & libc::FD_CLOEXEC != 0
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn passes_memfds_and_keeps_boundaries() {
        let (a, b) = SeqPacket::pair().unwrap();
        let m1 = memfd_with(b"first arena");
        let m2 = memfd_with(b"second");
        a.send(b"one", &[m1.as_fd(), m2.as_fd()]).unwrap();
        a.send(b"two!", &[]).unwrap();
        drop((m1, m2));

        let mut buf = [0u8; 64];
        let r = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], b"one");
        assert!(!r.truncated);
        assert_eq!(r.fds.len(), 2);
        assert!(r.fds.iter().all(is_cloexec));
        let mut fds = r.fds.into_iter();
        assert_eq!(read_all(fds.next().unwrap()), b"first arena");
        assert_eq!(read_all(fds.next().unwrap()), b"second");

        let r = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], b"two!");
        assert!(r.fds.is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn short_buffer_reports_truncation() {
        let (a, b) = SeqPacket::pair().unwrap();
        a.send(&[7u8; 100], &[]).unwrap();
        let mut buf = [0u8; 10];
        let r = b.recv(&mut buf).unwrap();
        assert_eq!(r.len, 10);
        assert!(r.truncated);

        a.send(&vec![0u8; MAX_FRAME + 1], &[]).unwrap();
        assert!(matches!(b.recv_message(), Err(SocketError::Truncated)));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn peer_credentials_are_ours() {
        let (a, _b) = SeqPacket::pair().unwrap();
        let cred = a.peer_credentials().unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, nix::unistd::geteuid().as_raw());
        assert_eq!(cred.gid, nix::unistd::getegid().as_raw());
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn hang_up_is_visible() {
        let (a, b) = SeqPacket::pair().unwrap();
        assert!(!a.peer_hung_up().unwrap());
        b.send(b"last words", &[]).unwrap();
        drop(b);
        assert!(a.peer_hung_up().unwrap());
        // Messages sent before the hang-up are still delivered, then EOF.
        let mut buf = [0u8; 32];
        let r = a.recv(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], b"last words");
        let r = a.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.fds.len()), (0, 0));
        assert!(matches!(a.recv_message(), Err(SocketError::HungUp)));
        let e = a.send(b"x", &[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn empty_message_is_refused() {
        let (a, _b) = SeqPacket::pair().unwrap();
        assert_eq!(
            a.send(&[], &[]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn read_timeout_and_nonblocking() {
        let (a, _b) = SeqPacket::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 8];
        let e = a.recv(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let e = a.recv_message().unwrap_err();
        assert_eq!(e.code(), ErrorCode::Timeout);
        assert!(a.set_read_timeout(Some(Duration::ZERO)).is_err());
        a.set_read_timeout(None).unwrap();
        a.set_nonblocking(true).unwrap();
        assert_eq!(
            a.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(a.recv_message().unwrap_err().code(), ErrorCode::WouldBlock);
        a.set_nonblocking(false).unwrap();
    }

    /// Asserts EOF on a non-blocking pipe: EOF arrives only once every copy
    /// of the write end is closed (a leaked copy reads as `WouldBlock`).
    fn assert_eof(r: OwnedFd) {
        let mut buf = [0u8; 1];
        assert_eq!(nix::unistd::read(&r, &mut buf), Ok(0));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn too_many_fds_are_rejected_and_closed() {
        let (a, b) = SeqPacket::pair().unwrap();
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();

        // Our own send refuses.
        let nine: Vec<BorrowedFd<'_>> = (0..MAX_FDS + 1).map(|_| w.as_fd()).collect();
        assert_eq!(
            a.send(b"x", &nine).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );

        // A raw sendmsg with 9 fds reaches the receiver, which closes the
        // descriptors that arrived and reports the rejection.
        let raw: Vec<RawFd> = (0..MAX_FDS + 1).map(|_| w.as_raw_fd()).collect();
        for message in [&b"many"[..], b"many again"] {
            socket::sendmsg::<()>(
                a.as_raw_fd(),
                &[IoSlice::new(message)],
                &[ControlMessage::ScmRights(&raw)],
                MsgFlags::empty(),
                None,
            )
            .unwrap();
        }
        let mut buf = [0u8; 16];
        let e = b.recv(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(matches!(
            b.recv_message(),
            Err(SocketError::ControlTruncated)
        ));

        // The connection stays usable.
        a.send_message(&Message::CloseSession { session_id: 3 }, &[w.as_fd()])
            .unwrap();
        let (m, fds) = b.recv_message().unwrap();
        assert_eq!(m, Message::CloseSession { session_id: 3 });
        assert_eq!(fds.len(), 1);
        drop(fds);

        // No copy of the write end survives anywhere in this process.
        drop(w);
        assert_eof(r);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn garbage_frame_is_a_protocol_error() {
        let (a, b) = SeqPacket::pair().unwrap();
        a.send(b"not a frame at all", &[]).unwrap();
        let e = b.recv_message().unwrap_err();
        assert!(matches!(e, SocketError::Protocol(_)), "{e}");
        assert_eq!(e.code(), ErrorCode::Version);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn request_reply_over_a_bound_listener() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("granary.sock");
        let listener = SeqPacketListener::bind(&path, 0o600).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(listener.local_path(), path);

        // A second bind on a live listener is refused. Its probe shows up
        // at the live listener as a connection that hangs up at once.
        let e = SeqPacketListener::bind(&path, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        let probe = listener.accept().unwrap();
        assert!(matches!(probe.recv_message(), Err(SocketError::HungUp)));

        let server = std::thread::spawn(move || {
            let conn = listener.accept().unwrap();
            let cred = conn.peer_credentials().unwrap();
            assert_eq!(cred.pid, std::process::id() as i32);
            let (msg, fds) = conn.recv_message().unwrap();
            assert!(fds.is_empty());
            let Message::OpenSession(open) = msg else {
                panic!("unexpected {msg:?}");
            };
            if open.dataset != "mnist" {
                conn.send_message(
                    &Message::Error(ErrorReply {
                        code: ErrorCode::NotFound,
                        message: format!("no dataset {:?}", open.dataset),
                    }),
                    &[],
                )
                .unwrap();
                return listener;
            }
            let arena = memfd_with(b"arena bytes");
            let segment = memfd_with(b"segment bytes");
            let reply = Message::SessionOpened(SessionOpened {
                session_id: 42,
                instance_epoch: 7,
                arena_size: 11,
                segment_size: 13,
                samples_per_epoch: 60_000,
                batches_per_epoch: 938,
                fd_count: 2,
                catalog: None,
                rank_batches_per_epoch: 0,
                prepared: None,
            });
            conn.send_message(&reply, &[arena.as_fd(), segment.as_fd()])
                .unwrap();
            let (msg, _) = conn.recv_message().unwrap();
            assert_eq!(msg, Message::CloseSession { session_id: 42 });
            conn.send_message(&Message::SessionClosed { session_id: 42 }, &[])
                .unwrap();
            assert!(matches!(conn.recv_message(), Err(SocketError::HungUp)));
            listener
        });

        let client = SeqPacket::connect(&path).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let open = OpenSession {
            seed: 1,
            ..OpenSession::new("mnist", 64)
        };
        client
            .send_message(&Message::OpenSession(open), &[])
            .unwrap();
        let (reply, fds) = client.recv_message().unwrap();
        let Message::SessionOpened(opened) = reply else {
            panic!("unexpected {reply:?}");
        };
        assert_eq!(opened.session_id, 42);
        assert_eq!(fds.len(), usize::from(opened.fd_count));
        let mut fds = fds.into_iter();
        assert_eq!(read_all(fds.next().unwrap()), b"arena bytes");
        assert_eq!(read_all(fds.next().unwrap()), b"segment bytes");
        client
            .send_message(&Message::CloseSession { session_id: 42 }, &[])
            .unwrap();
        let (closed, _) = client.recv_message().unwrap();
        assert_eq!(closed, Message::SessionClosed { session_id: 42 });
        drop(client);

        let listener = server.join().unwrap();
        drop(listener);
        assert!(!path.exists(), "socket file removed on drop");
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs memfd/socket syscalls")]
    fn bind_replaces_stale_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        // A crashed agent leaves its socket file behind with nobody
        // listening (std's listener does not unlink on drop).
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let second = SeqPacketListener::bind(&path, 0o660).unwrap();
        let c = SeqPacket::connect(&path).unwrap();
        let s = second.accept().unwrap();
        c.send(b"hi", &[]).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(s.recv(&mut buf).unwrap().len, 2);
        drop(second);

        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep me").unwrap();
        let e = SeqPacketListener::bind(&file, 0o660).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    }
}
