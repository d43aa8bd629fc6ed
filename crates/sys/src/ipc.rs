//! What the key process and the network-facing process need of the kernel:
//! a socket pair, passing a descriptor over it, and dying with the parent.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// A connected pair of Unix stream sockets, both close-on-exec. Nothing in
/// the file system names them: only holders of a descriptor can talk.
pub fn socket_pair() -> io::Result<(UnixStream, UnixStream)> {
    UnixStream::pair()
}

/// A connected pair of Unix sequenced-packet sockets, both close-on-exec,
/// for one-request-one-answer exchanges (each write is one message, read
/// whole by a read at least as large).
///
/// Why not a stream pair: reading from a Unix stream socket frees the
/// sender's buffer space, and that wakes every sleeper on the sender's
/// socket, a reader waiting for its next request included. Each answer a
/// worker read woke the key server's lane for nothing, which then preempted
/// the worker: ~1.85 context switches per signature on each side instead
/// of 1. A datagram reader is woken only for data.
pub fn packet_pair() -> io::Result<(UnixStream, UnixStream)> {
    let (a, b) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

/// The largest packet worth writing on a sequenced-packet socket, at most
/// `max`: the kernel refuses a packet above the socket's send buffer, so
/// half of it (two such packets can wait at once). Longer messages are
/// written in several packets (their reader reassembles them).
pub fn packet_limit(sock: impl AsFd, max: usize) -> usize {
    let buffer = rustix::net::sockopt::socket_send_buffer_size(sock).unwrap_or(0);
    (buffer / 2).max(1024).min(max)
}

/// Sends one byte and, with it, a duplicate of `fd` (`SCM_RIGHTS`).
pub fn send_fd(sock: &UnixStream, fd: impl AsFd) -> io::Result<()> {
    send_with_fd(sock, b"F", fd)
}

/// Receives what [`send_fd`] sent: `Ok(None)` when the peer closed. The
/// descriptor arrives close-on-exec; a message without one is an error.
pub fn recv_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut received = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            // Keep the first, close any extra (a well-behaved peer sends one).
            for fd in fds {
                received.get_or_insert(fd);
            }
        }
    }
    match (msg.bytes, received) {
        (0, None) => Ok(None),
        (_, Some(fd)) => Ok(Some(fd)),
        (_, None) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message without a descriptor",
        )),
    }
}

/// Sends all of `data` with a duplicate of `fd` attached to its first
/// byte (`SCM_RIGHTS`): a framed message that carries a descriptor, read
/// on the other side by [`recv_with_fds`].
pub fn send_with_fd(sock: &UnixStream, data: &[u8], fd: impl AsFd) -> io::Result<()> {
    send_with_fds(sock, data, &[fd.as_fd()])
}

/// Most descriptors [`send_with_fds`] sends with one message.
pub const MAX_FDS_PER_SEND: usize = 2;

/// [`send_with_fd`] with up to [`MAX_FDS_PER_SEND`] descriptors, which
/// arrive in this order.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS_PER_SEND {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_SEND))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent == 0 && !data.is_empty() {
        return Err(io::ErrorKind::WriteZero.into());
    }
    // The descriptor went with the first byte; the rest is plain data.
    let rest = data.get(sent..).unwrap_or_default();
    io::Write::write_all(&mut &*sock, rest)
}

/// Most descriptors [`recv_with_fds`] takes in one call; more are closed
/// by the kernel (`MSG_CTRUNC`).
pub const MAX_FDS_PER_READ: usize = 8;

/// Reads bytes into `buf` like `read`, and appends the descriptors that
/// came with them (close-on-exec) to `fds`. `Ok(0)`: the peer closed.
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    Ok(msg.bytes)
}

/// Whether `fd` is a Unix sequenced-packet socket (the only kind a peer
/// may hand over to be talked to: see [`packet_pair`]).
pub fn is_unix_packet(fd: impl AsFd) -> bool {
    let fd = fd.as_fd();
    let packet = rustix::net::sockopt::socket_type(fd)
        .is_ok_and(|t| t == rustix::net::SocketType::SEQPACKET);
    let unix = rustix::net::getsockname(fd)
        .is_ok_and(|a| a.address_family() == rustix::net::AddressFamily::UNIX);
    packet && unix
}

/// A pipe's two ends, both close-on-exec: `(read, write)`.
///
/// Why pipes for a lane's hot path: a round trip of a small request and
/// its answer between two processes on one core cost 14.5 µs over a
/// sequenced-packet pair and 8.0 over two pipes (no socket buffer to
/// allocate and charge per message). A write of at most [`PIPE_BUF`]
/// bytes to a pipe is atomic, also non-blocking: all of it or `EAGAIN`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Longest write to a pipe that the kernel keeps whole (see [`pipe`]).
pub const PIPE_BUF: usize = rustix::pipe::PIPE_BUF;

/// Which end of a pipe [`is_pipe_end`] looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipeEnd {
    /// Opened read-only.
    Read,
    /// Opened write-only.
    Write,
}

/// Whether `fd` is a pipe (or FIFO) opened for `end` only: what a peer
/// may hand over as one direction of a lane.
pub fn is_pipe_end(fd: impl AsFd, end: PipeEnd) -> bool {
    let fd = fd.as_fd();
    let fifo = rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    });
    let want = match end {
        PipeEnd::Read => rustix::fs::OFlags::RDONLY,
        PipeEnd::Write => rustix::fs::OFlags::WRONLY,
    };
    let mode = rustix::fs::fcntl_getfl(fd).map(|f| f & rustix::fs::OFlags::RWMODE);
    fifo && mode.is_ok_and(|m| m == want)
}

/// The write end of a pipe, non-blocking, each write bounded by `timeout`:
/// a pipe has no `SO_SNDTIMEO`, so a full one is waited for with `poll`.
#[derive(Debug)]
pub struct TimedPipeWriter {
    fd: OwnedFd,
    timeout: Duration,
}

impl TimedPipeWriter {
    /// Takes `fd`, a pipe's write end, and makes it non-blocking.
    pub fn new(fd: OwnedFd, timeout: Duration) -> io::Result<TimedPipeWriter> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(TimedPipeWriter { fd, timeout })
    }
}

impl io::Write for TimedPipeWriter {
    /// `TimedOut` when the pipe stayed full for the whole timeout.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match rustix::io::write(&self.fd, buf) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    let wait = rustix::event::Timespec::try_from(left)
                        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
                    let mut fds = [rustix::event::PollFd::new(
                        &self.fd,
                        rustix::event::PollFlags::OUT,
                    )];
                    match rustix::event::poll(&mut fds, Some(&wait)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Asks the kernel to SIGKILL this process when its parent thread exits,
/// then checks that the parent is still `parent` (it may have died before).
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    let now = parent_id();
    if now == parent {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "parent {parent} is gone (parent now {now})"
        )))
    }
}

/// Makes the program `cmd` starts receive SIGTERM when the thread that
/// starts it exits (`PR_SET_PDEATHSIG`, kept across `exec`): a parent
/// killed outright, which runs no destructor, then takes its children
/// along instead of leaving servers running that the next run would
/// share its cores with. Spawn from a thread that outlives the child.
/// A parent process already gone when the child gets there (it died
/// between fork and `prctl`) fails the spawn instead.
#[allow(unsafe_code)]
pub fn terminate_with_spawning_thread(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = rustix::process::getpid();
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls
    // (`prctl`, `getppid`) and builds errors from codes, allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
            if rustix::process::getppid() == Some(parent) {
                Ok(())
            } else {
                Err(rustix::io::Errno::SRCH.into())
            }
        });
    }
}

/// This process's parent id.
pub fn parent_id() -> u32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get().unsigned_abs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_child_is_terminated_when_its_spawning_thread_exits() {
        let pid = std::thread::spawn(|| {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("30");
            terminate_with_spawning_thread(&mut cmd);
            cmd.spawn().unwrap().id()
        })
        .join()
        .unwrap();
        // Never waited for: once terminated it stays a zombie we can see.
        let state = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
                .flatten()
        };
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state() != Some('Z') && std::time::Instant::now() < limit {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(
            state(),
            Some('Z'),
            "sleep {pid} outlived the thread that started it"
        );
        let _ = rustix::process::waitpid(
            rustix::process::Pid::from_raw(pid as i32),
            rustix::process::WaitOptions::empty(),
        );
    }

    #[test]
    fn a_frame_carries_a_descriptor_and_the_bytes_around_it_stay_in_order() {
        let (a, b) = socket_pair().unwrap();
        let (x, mut y) = packet_pair().unwrap();
        std::io::Write::write_all(&mut &a, b"one").unwrap();
        send_with_fd(&a, b"two", &x).unwrap();
        std::io::Write::write_all(&mut &a, b"three").unwrap();
        drop(x);
        let (mut got, mut fds) = (Vec::new(), Vec::new());
        while got.len() < 11 {
            let mut buf = [0u8; 64];
            let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"onetwothree");
        assert_eq!(fds.len(), 1);
        assert!(is_unix_packet(&fds[0]));
        assert!(!is_unix_packet(&a), "a stream socket");
        let mut x2 = UnixStream::from(fds.pop().unwrap());
        x2.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        y.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_unix_packet(&file));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut [0u8; 4], &mut fds).unwrap(), 0);
    }

    #[test]
    fn pipe_ends_are_told_apart_and_a_full_pipe_times_a_write_out() {
        let (r, w) = pipe().unwrap();
        assert!(is_pipe_end(&r, PipeEnd::Read));
        assert!(!is_pipe_end(&r, PipeEnd::Write));
        assert!(is_pipe_end(&w, PipeEnd::Write));
        assert!(!is_pipe_end(&w, PipeEnd::Read));
        let (sock, _) = packet_pair().unwrap();
        assert!(!is_pipe_end(&sock, PipeEnd::Read));
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_pipe_end(&file, PipeEnd::Read));

        let mut w = TimedPipeWriter::new(w, Duration::from_millis(200)).unwrap();
        let chunk = [7u8; PIPE_BUF];
        let t0 = Instant::now();
        let mut written = 0usize;
        let e = loop {
            match w.write(&chunk) {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert!(written <= 16 << 20, "a pipe that never fills");
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // Room again: the write goes on.
        let mut r = std::fs::File::from(r);
        let mut buf = vec![0u8; 2 * PIPE_BUF];
        r.read_exact(&mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 7));
        assert_eq!(w.write(&chunk).unwrap(), PIPE_BUF);
        // No reader: EPIPE, not a signal.
        drop(r);
        assert_eq!(
            w.write(&chunk).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[test]
    fn two_descriptors_cross_in_order() {
        let (a, b) = socket_pair().unwrap();
        let (r, w) = pipe().unwrap();
        send_with_fds(&a, b"x", &[r.as_fd(), w.as_fd()]).unwrap();
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut [0u8; 4], &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 2);
        assert!(is_pipe_end(&fds[0], PipeEnd::Read));
        assert!(is_pipe_end(&fds[1], PipeEnd::Write));
        let three = [r.as_fd(), w.as_fd(), r.as_fd()];
        assert!(send_with_fds(&a, b"x", &three).is_err());
    }

    #[test]
    fn a_descriptor_crosses_the_socket() {
        let (a, b) = socket_pair().unwrap();
        let (x, mut y) = socket_pair().unwrap();
        send_fd(&a, &x).unwrap();
        drop(x);
        let got = recv_fd(&b).unwrap().unwrap();
        let mut x2 = UnixStream::from(got);
        x2.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        y.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        drop(a);
        assert!(recv_fd(&b).unwrap().is_none(), "EOF is None");
    }
}
