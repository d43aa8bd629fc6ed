//! The kernel-facing layer of tlsgate: listening sockets, dropping
//! privileges ([`privileges`]), the key process's socket and descriptor
//! passing ([`ipc`]); kernel TLS (`TCP_ULP`, `SOL_TLS`) and `sendfile`
//! ([`ktls`]); BPF later.
//!
//! This is the one crate where `unsafe` is allowed, each call behind a
//! small function with a `// SAFETY:` note, in the modules that need it
//! ([`resident`]'s `mmap`/`mlock`, [`ktls`]'s socket options and
//! control messages, [`packet`]'s `AF_PACKET` socket and `BPF_PROG_RUN`
//! call for the SYN flood generator, [`fileread`]'s reads into spare
//! capacity); everything else goes through
//! `socket2`, `rustix` and `nix`, and the workspace's lint denies `unsafe`
//! in every other module.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

pub mod fileread;
pub mod ipc;
pub mod ktls;
pub mod packet;
pub mod privileges;
pub mod resident;

/// Writes `bufs` to a TCP socket with `MSG_MORE`, without waiting: a
/// last segment that is not full stays queued until the next write or a
/// `shutdown`, whose FIN then leaves in the same segment (one packet less
/// for the peer to take and acknowledge when a response ends a connection).
pub fn send_vectored_more(
    sock: std::os::fd::BorrowedFd<'_>,
    bufs: &[io::IoSlice<'_>],
) -> io::Result<usize> {
    rustix::net::sendmsg(
        sock,
        bufs,
        &mut rustix::net::SendAncillaryBuffer::default(),
        rustix::net::SendFlags::MORE
            | rustix::net::SendFlags::DONTWAIT
            | rustix::net::SendFlags::NOSIGNAL,
    )
    .map_err(io::Error::from)
}

/// A syscall that failed, naming the call and the address.
#[derive(Debug, thiserror::Error)]
#[error("{call} on {addr}: {source}")]
pub struct SocketError {
    /// The operation (`socket`, `bind`, `listen`, `setsockopt(SO_REUSEPORT)`).
    pub call: &'static str,
    /// The address involved.
    pub addr: SocketAddr,
    /// The kernel's answer.
    #[source]
    pub source: io::Error,
}

/// Opens a non-blocking listening socket on `addr` with `SO_REUSEPORT`, so
/// that every worker owns a listener of its own on the same address and the
/// kernel spreads connections between them.
pub fn reuseport_listener(addr: SocketAddr, backlog: u32) -> Result<TcpListener, SocketError> {
    let fail = |call| move |source| SocketError { call, addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(fail("socket"))?;
    socket
        .set_reuse_address(true)
        .map_err(fail("setsockopt(SO_REUSEADDR)"))?;
    socket
        .set_reuse_port(true)
        .map_err(fail("setsockopt(SO_REUSEPORT)"))?;
    if addr.is_ipv6() {
        // "[::]" means IPv6 only; listen on "0.0.0.0" too for IPv4.
        socket
            .set_only_v6(true)
            .map_err(fail("setsockopt(IPV6_V6ONLY)"))?;
    }
    socket
        .set_nodelay(true)
        .map_err(fail("setsockopt(TCP_NODELAY)"))?;
    socket
        .set_nonblocking(true)
        .map_err(fail("fcntl(O_NONBLOCK)"))?;
    socket.bind(&addr.into()).map_err(fail("bind"))?;
    let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
    socket.listen(backlog).map_err(fail("listen"))?;
    Ok(socket.into())
}

/// Opens `count` listeners on `addr`. With port 0 the first one picks a
/// free port and the others join it, so all workers share one port.
pub fn reuseport_group(
    addr: SocketAddr,
    backlog: u32,
    count: usize,
) -> Result<Vec<TcpListener>, SocketError> {
    let first = reuseport_listener(addr, backlog)?;
    let bound = first.local_addr().map_err(|source| SocketError {
        call: "getsockname",
        addr,
        source,
    })?;
    let mut all = vec![first];
    for _ in 1..count {
        all.push(reuseport_listener(bound, backlog)?);
    }
    Ok(all)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn group_shares_one_port_and_accepts() {
        let group = reuseport_group("127.0.0.1:0".parse().unwrap(), 16, 3).unwrap();
        let port = group[0].local_addr().unwrap().port();
        assert!(group.iter().all(|l| l.local_addr().unwrap().port() == port));
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    }

    #[test]
    fn bind_conflict_names_the_call() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = reuseport_listener(plain.local_addr().unwrap(), 16).unwrap_err();
        assert_eq!(e.call, "bind");
        assert!(e.to_string().contains("127.0.0.1"));
    }
}
