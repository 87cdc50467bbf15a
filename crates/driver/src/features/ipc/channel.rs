//! The authenticated Unix socket that carries shared buffers and events
//! between two processes: fixed-size frames, each with the token, and a
//! file descriptor beside a frame where one goes along (`SCM_RIGHTS`).
//!
//! Who may connect is checked twice: the kernel's credentials of the peer
//! (`SO_PEERCRED`: the same user as this process) and the token. Every
//! blocking step (accept, each send and receive) ends at the channel's
//! deadline, so a peer that hangs or dies is an error, not a hang.

use super::token::IpcToken;
use crate::ground::error::{Error, Result};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"CSIP";
const VERSION: u16 = 1;
/// A frame's size: header (magic, version, kind, token) and payload.
pub(super) const FRAME: usize = 256;
const HEADER: usize = 24;
/// The bytes of a frame's payload.
pub(super) const PAYLOAD: usize = FRAME - HEADER;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub(super) enum Kind {
    Hello = 1,
    Welcome = 2,
    Buffer = 3,
    Event = 4,
    Signal = 5,
}

impl Kind {
    fn from_raw(raw: u16) -> Option<Self> {
        [
            Kind::Hello,
            Kind::Welcome,
            Kind::Buffer,
            Kind::Event,
            Kind::Signal,
        ]
        .into_iter()
        .find(|kind| *kind as u16 == raw)
    }
}

fn refused(reason: String) -> Error {
    Error::Ipc { reason }
}

/// The kernel's word on who is at the other end of a Unix socket.
fn peer_credentials(socket: &UnixStream) -> Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: writes at most `len` bytes into a local `ucred`.
    let code = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if code != 0 {
        return Err(refused(format!(
            "reading the peer's credentials: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if cred.uid != me {
        return Err(refused(format!(
            "the peer process {} runs as user {}, not as this process's user {me}",
            cred.pid, cred.uid
        )));
    }
    Ok(cred)
}

/// The listening end, bound to a path: an exporter accepts the processes
/// that present its token.
///
/// ```
/// use cuda_streams_driver::{IpcChannel, IpcListener, IpcToken};
/// use std::time::Duration;
/// let path = std::env::temp_dir().join(format!("ipc-doc-{}.sock", std::process::id()));
/// let token = IpcToken::random().unwrap();
/// let listener = IpcListener::bind(&path, token).unwrap();
/// let importer = std::thread::spawn({
///     let path = path.clone();
///     move || IpcChannel::connect(&path, token, Duration::from_secs(10)).map(|c| c.peer_pid())
/// });
/// let channel = listener.accept(Duration::from_secs(10)).unwrap();
/// // Both ends are this process here; usually the peer is another one.
/// assert_eq!(channel.peer_pid(), std::process::id());
/// assert_eq!(importer.join().unwrap().unwrap(), std::process::id());
/// ```
#[derive(Debug)]
pub struct IpcListener {
    listener: UnixListener,
    token: IpcToken,
    path: PathBuf,
}

impl IpcListener {
    /// Listen at `path` (a new socket file; one left there is an error)
    /// for peers presenting `token`. The file is removed when the listener
    /// is dropped.
    pub fn bind(path: impl AsRef<Path>, token: IpcToken) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)
            .map_err(|err| refused(format!("listening at {}: {err}", path.display())))?;
        Ok(Self {
            listener,
            token,
            path,
        })
    }

    /// Accept one peer: it must run as this process's user and present the
    /// token within `deadline`, which then bounds every step of the channel.
    pub fn accept(&self, deadline: Duration) -> Result<IpcChannel> {
        let until = Instant::now() + deadline;
        let mut poll = libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let millis = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, millis) };
            if ready > 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if ready < 0 && err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if ready < 0 {
                return Err(refused(format!(
                    "waiting for a peer at {}: {err}",
                    self.path.display()
                )));
            }
            return Err(refused(format!(
                "no peer connected to {} within {deadline:?}",
                self.path.display()
            )));
        }
        let (socket, _) = self
            .listener
            .accept()
            .map_err(|err| refused(format!("accepting at {}: {err}", self.path.display())))?;
        let mut channel = IpcChannel::over(socket, self.token, deadline)?;
        let hello = channel.receive_frame()?;
        if hello.kind != Kind::Hello {
            return Err(refused(format!(
                "peer process {} began with {:?}, not a greeting",
                channel.peer_pid, hello.kind
            )));
        }
        channel.send(Kind::Welcome, &[], None)?;
        Ok(channel)
    }

    /// The token peers must present.
    pub fn token(&self) -> IpcToken {
        self.token
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for IpcListener {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.path) {
            tracing::debug!("removing {}: {err}", self.path.display());
        }
    }
}

/// A received frame.
pub(super) struct Frame {
    pub(super) kind: Kind,
    pub(super) payload: [u8; PAYLOAD],
    pub(super) fd: Option<OwnedFd>,
}

/// One end of an authenticated connection between two processes of the
/// same user: it carries [`SharedDeviceBuffer`](crate::SharedDeviceBuffer)s,
/// [`SharedEvent`](crate::SharedEvent)s and small signals. See
/// [`IpcListener`] for the other end, and `docs/host-memory.md` for a
/// two-process example.
#[derive(Debug)]
pub struct IpcChannel {
    socket: UnixStream,
    token: IpcToken,
    peer_pid: u32,
    deadline: Duration,
}

impl IpcChannel {
    fn over(socket: UnixStream, token: IpcToken, deadline: Duration) -> Result<Self> {
        let cred = peer_credentials(&socket)?;
        let timeout = Some(deadline.max(Duration::from_millis(1)));
        socket
            .set_read_timeout(timeout)
            .and_then(|()| socket.set_write_timeout(timeout))
            .map_err(|err| refused(format!("setting the channel's deadline: {err}")))?;
        Ok(Self {
            socket,
            token,
            peer_pid: cred.pid as u32,
            deadline,
        })
    }

    /// Connect to the listener at `path`, presenting `token`; `deadline`
    /// bounds every step of the channel (each send, each receive).
    pub fn connect(path: impl AsRef<Path>, token: IpcToken, deadline: Duration) -> Result<Self> {
        let path = path.as_ref();
        let socket = UnixStream::connect(path)
            .map_err(|err| refused(format!("connecting to {}: {err}", path.display())))?;
        let mut channel = Self::over(socket, token, deadline)?;
        channel.send(Kind::Hello, &std::process::id().to_le_bytes(), None)?;
        let welcome = channel.receive_frame()?;
        if welcome.kind != Kind::Welcome {
            return Err(refused(format!(
                "the listener at {} answered with {:?}, not a welcome",
                path.display(),
                welcome.kind
            )));
        }
        Ok(channel)
    }

    /// A second handle on the same connection (one thread may receive on it
    /// while another sends on this one). Frames are whole on either, but two
    /// threads receiving at once may each take the other's frame.
    pub fn try_clone(&self) -> Result<Self> {
        let socket = self
            .socket
            .try_clone()
            .map_err(|err| refused(format!("duplicating the channel's socket: {err}")))?;
        Ok(Self {
            socket,
            token: self.token,
            peer_pid: self.peer_pid,
            deadline: self.deadline,
        })
    }

    /// The peer's process id, as the kernel reports it.
    pub fn peer_pid(&self) -> u32 {
        self.peer_pid
    }

    /// The deadline of every step.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Send `value` to the peer (a batch number, "recorded", "done"): for
    /// the protocol of the program on top, which says when an event has
    /// been recorded so the peer's wait takes that record.
    pub fn send_signal(&mut self, value: u64) -> Result<()> {
        self.send(Kind::Signal, &value.to_le_bytes(), None)
    }

    /// Receive the peer's next [`send_signal`](Self::send_signal) value.
    pub fn receive_signal(&mut self) -> Result<u64> {
        let frame = self.receive(Kind::Signal)?;
        Ok(u64::from_le_bytes(
            frame.payload[..8].try_into().unwrap_or([0; 8]),
        ))
    }

    /// Send a frame of `kind` with `payload` (at most [`PAYLOAD`] bytes)
    /// and, beside it, a duplicate of `fd`.
    pub(super) fn send(&mut self, kind: Kind, payload: &[u8], fd: Option<RawFd>) -> Result<()> {
        let mut frame = [0u8; FRAME];
        frame[0..4].copy_from_slice(&MAGIC);
        frame[4..6].copy_from_slice(&VERSION.to_le_bytes());
        frame[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
        frame[8..24].copy_from_slice(&self.token.0);
        frame[HEADER..HEADER + payload.len()].copy_from_slice(payload);
        let sent = match fd {
            None => self.socket.write_all(&frame).map(|()| FRAME),
            Some(fd) => send_with_fd(&self.socket, &frame, fd),
        };
        match sent {
            Ok(n) if n == FRAME => Ok(()),
            // The descriptor went with the first part: the rest as usual.
            Ok(n) => self
                .socket
                .write_all(&frame[n..])
                .map_err(|err| self.io_error("sending", err)),
            Err(err) => Err(self.io_error("sending", err)),
        }
    }

    /// Receive the next frame, which must be of `kind`.
    pub(super) fn receive(&mut self, kind: Kind) -> Result<Frame> {
        let frame = self.receive_frame()?;
        if frame.kind != kind {
            return Err(refused(format!(
                "expected {kind:?} from peer process {}, received {:?}",
                self.peer_pid, frame.kind
            )));
        }
        Ok(frame)
    }

    fn receive_frame(&mut self) -> Result<Frame> {
        let mut bytes = [0u8; FRAME];
        let (n, fd) = receive_with_fd(&self.socket, &mut bytes)
            .map_err(|err| self.io_error("receiving", err))?;
        if n == 0 {
            return Err(refused(format!(
                "peer process {} closed the channel (it exited, or dropped its end)",
                self.peer_pid
            )));
        }
        if n < FRAME {
            self.socket
                .read_exact(&mut bytes[n..])
                .map_err(|err| self.io_error("receiving", err))?;
        }
        if bytes[0..4] != MAGIC || bytes[4..6] != VERSION.to_le_bytes() {
            return Err(refused(format!(
                "peer process {} sent a frame that is not of this protocol (version 1)",
                self.peer_pid
            )));
        }
        let token: [u8; 16] = bytes[8..24].try_into().unwrap_or([0; 16]);
        if !self.token.matches(&token) {
            return Err(refused(format!(
                "peer process {} presented a wrong token: a forged or stale peer",
                self.peer_pid
            )));
        }
        let raw_kind = u16::from_le_bytes([bytes[6], bytes[7]]);
        let kind = Kind::from_raw(raw_kind).ok_or_else(|| {
            refused(format!(
                "peer process {} sent a frame of unknown kind {raw_kind}",
                self.peer_pid
            ))
        })?;
        let mut payload = [0u8; PAYLOAD];
        payload.copy_from_slice(&bytes[HEADER..]);
        Ok(Frame { kind, payload, fd })
    }

    fn io_error(&self, what: &str, err: std::io::Error) -> Error {
        let why = match err.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("the deadline of {:?} passed", self.deadline)
            }
            _ => err.to_string(),
        };
        refused(format!(
            "{what} on the channel to peer process {}: {why}",
            self.peer_pid
        ))
    }
}

/// Space for one descriptor's control message.
#[repr(C, align(8))]
struct Control([u8; 64]);

fn send_with_fd(socket: &UnixStream, frame: &[u8], fd: RawFd) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr() as *mut libc::c_void,
        iov_len: frame.len(),
    };
    let mut control = Control([0; 64]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: a zeroed msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds `space` bytes (at most 64), aligned
    // for cmsghdr; the first header lies inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    loop {
        // SAFETY: the message points at live locals for the call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn receive_with_fd(
    socket: &UnixStream,
    frame: &mut [u8],
) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: frame.as_mut_ptr().cast(),
        iov_len: frame.len(),
    };
    let mut control = Control([0; 64]);
    // SAFETY: a zeroed msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    let received = loop {
        // SAFETY: the message points at live locals for the call;
        // descriptors received are close-on-exec.
        let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if got >= 0 {
            break got as usize;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut fd = None;
    // SAFETY: walks the control messages the kernel wrote into `control`,
    // within `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                // A second descriptor would replace (and close) the first:
                // one frame carries at most one.
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((received, fd))
}
