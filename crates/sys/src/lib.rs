//! The kernel-facing layer of tlsgate: listening sockets, dropping
//! privileges ([`privileges`]), the key process's socket and descriptor
//! passing ([`ipc`]); kernel TLS (`TCP_ULP`, `SOL_TLS`) and `sendfile`
//! ([`ktls`]); what the kernel says of BPF links ([`bpf`]).
//!
//! This is the one crate where `unsafe` is allowed, each call behind a
//! small function with a `// SAFETY:` note, in the modules that need it
//! ([`accept`]'s registration of a listener with tokio, [`resident`]'s
//! `mmap`/`mlock`, `sockopt`'s `setsockopt` (kTLS, `TCP_DEFER_ACCEPT`) and
//! `getsockopt(TCP_INFO)`, [`ktls`]'s control messages, [`packet`]'s
//! `AF_PACKET` socket and `BPF_PROG_RUN` call for the SYN flood
//! generator, [`bpf`]'s link queries (is SynGate still attached?), [`netdev`]'s `SIOCGIFMTU`/`SIOCGIFHWADDR` ioctls for
//! SynGate, [`fileread`]'s reads into spare capacity, [`suspend`]'s
//! coroutine handle that is `Send` because it runs only at home and its
//! pointer to the running call's yielder); everything else
//! goes through
//! `socket2`, `rustix` and `nix`, and the workspace's lint denies `unsafe`
//! in every other module.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

pub mod accept;
pub mod bpf;
pub mod fileread;
pub mod ipc;
pub mod ktls;
pub mod netdev;
pub mod packet;
pub mod privileges;
pub mod resident;
pub mod rlimit;
mod sockopt;
pub mod suspend;

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

/// A socket read that, when it comes back short, also marks the socket
/// not readable: the kernel had no more, so the next read waits for epoll
/// instead of making a `recvfrom` that returns `EAGAIN` (one system call
/// per keep-alive request and per handshake flight). tokio's own
/// `poll_read` does the same. Readiness is cleared through `try_io`, whose
/// event tick keeps an arrival between the read and the clear from being
/// lost; a peer's close is never cleared (tokio keeps `READ_CLOSED`).
pub fn read_draining(sock: &tokio::net::TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut short = None;
    let r = sock.try_io(tokio::io::Interest::READABLE, || {
        let n = sock.try_read(buf)?;
        if n > 0 && n < buf.len() {
            short = Some(n);
            // Makes `try_io` clear the readiness this read consumed.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (r, short) {
        (_, Some(n)) => Ok(n),
        (r, None) => r,
    }
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

/// How listening sockets are set up.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// The accept queue's length.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT`: a connection is handed to `accept` once its first
    /// bytes (the ClientHello) are in; a silent one after about this long,
    /// which the kernel rounds up to 1, 3, 7, 15, 31 or 63 s (SYN-ACK
    /// retransmissions), or never if the peer has gone. Connections made by
    /// SYN cookies are handed over at once. Zero: every one at once. Whole
    /// seconds, rounded up.
    pub defer_accept: Duration,
}

/// Opens a non-blocking listening socket on `addr` with `SO_REUSEPORT`, so
/// that every worker owns a listener of its own on the same address and the
/// kernel spreads connections between them.
pub fn reuseport_listener(
    addr: SocketAddr,
    options: ListenOptions,
) -> Result<TcpListener, SocketError> {
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
    let defer = options.defer_accept;
    let defer_secs = defer.as_secs() + u64::from(defer.subsec_nanos() > 0);
    sockopt::setsockopt_int(
        socket.as_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_DEFER_ACCEPT,
        libc::c_int::try_from(defer_secs).unwrap_or(libc::c_int::MAX),
    )
    .map_err(fail("setsockopt(TCP_DEFER_ACCEPT)"))?;
    socket.bind(&addr.into()).map_err(fail("bind"))?;
    let backlog = i32::try_from(options.backlog).unwrap_or(i32::MAX);
    socket.listen(backlog).map_err(fail("listen"))?;
    Ok(socket.into())
}

/// Fails when something already holds `addr`: a bind without
/// `SO_REUSEPORT` (with `SO_REUSEADDR`, so that connections in TIME_WAIT
/// do not count) on a socket closed at once. Without it our
/// `SO_REUSEPORT` listeners would join another process's (a second
/// tlsgate of the same user) and the kernel would split connections
/// between the two, silently.
pub fn ensure_unused(addr: SocketAddr) -> Result<(), SocketError> {
    let fail = |call| move |source| SocketError { call, addr, source };
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(fail("socket"))?;
    probe
        .set_reuse_address(true)
        .map_err(fail("setsockopt(SO_REUSEADDR)"))?;
    if addr.is_ipv6() {
        probe
            .set_only_v6(true)
            .map_err(fail("setsockopt(IPV6_V6ONLY)"))?;
    }
    probe.bind(&addr.into()).map_err(|source| SocketError {
        call: "bind",
        addr,
        source: if source.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{source}: another process (another tlsgate?) is listening there"),
            )
        } else {
            source
        },
    })
}

/// Opens `count` listeners on `addr`. With port 0 the first one picks a
/// free port and the others join it, so all workers share one port.
/// Otherwise the address must be free first ([`ensure_unused`]): the
/// listeners share it among themselves, never with another process.
pub fn reuseport_group(
    addr: SocketAddr,
    options: ListenOptions,
    count: usize,
) -> Result<Vec<TcpListener>, SocketError> {
    if addr.port() != 0 {
        ensure_unused(addr)?;
    }
    let first = reuseport_listener(addr, options)?;
    let bound = first.local_addr().map_err(|source| SocketError {
        call: "getsockname",
        addr,
        source,
    })?;
    let mut all = vec![first];
    for _ in 1..count {
        all.push(reuseport_listener(bound, options)?);
    }
    Ok(all)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    const AT_ONCE: ListenOptions = ListenOptions {
        backlog: 16,
        defer_accept: Duration::ZERO,
    };

    #[test]
    fn group_shares_one_port_and_accepts() {
        let group = reuseport_group("127.0.0.1:0".parse().unwrap(), AT_ONCE, 3).unwrap();
        let port = group[0].local_addr().unwrap().port();
        assert!(group.iter().all(|l| l.local_addr().unwrap().port() == port));
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    }

    #[test]
    fn bind_conflict_names_the_call() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = reuseport_listener(plain.local_addr().unwrap(), AT_ONCE).unwrap_err();
        assert_eq!(e.call, "bind");
        assert!(e.to_string().contains("127.0.0.1"));
    }

    #[test]
    fn group_refuses_an_address_another_reuseport_listener_holds() {
        let other = reuseport_listener("127.0.0.1:0".parse().unwrap(), AT_ONCE).unwrap();
        let addr = other.local_addr().unwrap();
        let e = reuseport_group(addr, AT_ONCE, 2).unwrap_err();
        assert_eq!(e.call, "bind");
        assert_eq!(e.source.kind(), io::ErrorKind::AddrInUse);
        drop(other);
        // Free again: the probe leaves nothing behind, the group binds.
        let group = reuseport_group(addr, AT_ONCE, 2).unwrap();
        assert_eq!(group.len(), 2);
    }

    /// Whether `accept` has a connection for us within `limit`.
    fn accepted_within(listener: &TcpListener, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            match listener.accept() {
                Ok(_) => return true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("accept: {e}"),
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_deferred_accept_waits_for_the_first_bytes() {
        let options = ListenOptions {
            backlog: 16,
            defer_accept: Duration::from_millis(1500),
        };
        let listener = reuseport_listener("127.0.0.1:0".parse().unwrap(), options).unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Connected (the handshake is done), but nothing sent: not yet.
        assert!(!accepted_within(&listener, Duration::from_millis(300)));
        client.write_all(b"\x16\x03\x01").unwrap();
        assert!(accepted_within(&listener, Duration::from_secs(2)));

        let at_once = reuseport_listener("127.0.0.1:0".parse().unwrap(), AT_ONCE).unwrap();
        let _quiet = std::net::TcpStream::connect(at_once.local_addr().unwrap()).unwrap();
        assert!(accepted_within(&at_once, Duration::from_secs(2)));
    }

    /// A connected loopback pair: tokio's end, and a std end to write from.
    async fn pair() -> (tokio::net::TcpStream, std::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (sock, _) = listener.accept().await.unwrap();
        (sock, peer)
    }

    /// Reads with `read_draining` until `want` bytes came, waiting for the
    /// socket in between; fails after 5 s (a lost wake-up).
    async fn read_all(sock: &tokio::net::TcpStream, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        tokio::time::timeout(Duration::from_secs(5), async {
            while got.len() < want {
                match read_draining(sock, &mut buf) {
                    Ok(0) => panic!("EOF after {} of {want} bytes", got.len()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        sock.readable().await.unwrap();
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stalled after {} of {want} bytes", got.len()));
        got
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_short_read_waits_for_the_socket_and_misses_nothing_after_it() {
        let (sock, mut peer) = pair().await;
        peer.write_all(b"first").unwrap();
        sock.readable().await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(read_draining(&sock, &mut buf).unwrap(), 5);
        // Short: the next read reports nothing to read (without a system
        // call: tests/serve.rs counts them)...
        assert_eq!(
            read_draining(&sock, &mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // ...and what comes later still wakes the reader.
        let writer = std::thread::spawn(move || {
            for piece in [&b"second"[..], b"third", b"fourth"] {
                std::thread::sleep(Duration::from_millis(20));
                peer.write_all(piece).unwrap();
            }
            peer
        });
        assert_eq!(read_all(&sock, 17).await, b"secondthirdfourth");
        writer.join().unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_close_after_a_short_read_is_still_seen() {
        let (sock, mut peer) = pair().await;
        peer.write_all(b"last words").unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(read_all(&sock, 10).await, b"last words");
        let mut buf = [0u8; 64];
        let eof = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match read_draining(&sock, &mut buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        sock.readable().await.unwrap();
                    }
                    other => return other.unwrap(),
                }
            }
        })
        .await
        .expect("the peer's close was lost");
        assert_eq!(eof, 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_read_leaves_the_socket_readable() {
        let (sock, mut peer) = pair().await;
        peer.write_all(&[7u8; 100]).unwrap();
        // Both pieces may not have arrived together: wait until they have.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            sock.readable().await.unwrap();
            let mut probe = [0u8; 128];
            if sock.peek(&mut probe).await.unwrap() == 100 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "100 bytes never arrived"
            );
        }
        let mut buf = [0u8; 64];
        // A full buffer says nothing about what is left: the next read goes
        // to the kernel and gets the rest.
        assert_eq!(read_draining(&sock, &mut buf).unwrap(), 64);
        assert_eq!(read_draining(&sock, &mut buf).unwrap(), 36);
    }
}
