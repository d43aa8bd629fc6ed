//! What the key process and the network-facing process need of the kernel:
//! a socket pair, passing a descriptor over it, and dying with the parent.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// A connected pair of Unix stream sockets, both close-on-exec. Nothing in
/// the file system names them: only holders of a descriptor can talk.
pub fn socket_pair() -> io::Result<(UnixStream, UnixStream)> {
    UnixStream::pair()
}

/// Sends one byte and, with it, a duplicate of `fd` (`SCM_RIGHTS`).
pub fn send_fd(sock: &UnixStream, fd: impl AsFd) -> io::Result<()> {
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(b"F")],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent == 1 {
        Ok(())
    } else {
        Err(io::ErrorKind::WriteZero.into())
    }
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
