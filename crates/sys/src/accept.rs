//! Accepting connections without the `accept4` that fails.
//!
//! tokio's `TcpListener` calls `accept4` until it fails with `EAGAIN`, one
//! failed call per readiness event, and at low load that is one per
//! connection. Such a call is not cheap: the kernel allocates the new
//! socket's inode, file and dentry before it looks at the queue, and frees
//! them again (under `openssl s_time` half of `accept4`'s time). Here each
//! accepted connection is followed by a read of the queue's length
//! (`TCP_INFO`, which allocates nothing), and an empty queue sends the
//! listener back to wait for its next readiness event.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A non-blocking listening socket registered with the current tokio
/// runtime.
pub struct Listener {
    fd: AsyncFd<TcpListener>,
    /// Accepts still sure to succeed after the next one, from the last read
    /// of the queue: a burst of n costs two reads, not n.
    known_waiting: AtomicU32,
}

impl Listener {
    /// Registers `listener` (already non-blocking) with the current runtime.
    pub fn new(listener: TcpListener) -> io::Result<Self> {
        // SAFETY: the `TcpListener` owns its descriptor and `AsyncFd` owns
        // the `TcpListener`: the descriptor stays open, and is the same
        // one, until the `AsyncFd` has deregistered it on drop.
        let fd = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE)? };
        Ok(Self {
            fd,
            known_waiting: AtomicU32::new(0),
        })
    }

    /// The next connection, registered with the current runtime, and its
    /// peer's address.
    ///
    /// A connection that arrives after the queue was read empty raises a
    /// readiness event of its own, which clearing does not discard: tokio
    /// clears only the event this call was handed.
    pub async fn accept(&self) -> io::Result<(tokio::net::TcpStream, SocketAddr)> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|l| accept_nonblocking(l.get_ref())) {
                Ok(Ok((sock, peer))) => {
                    let known = self.known_waiting.load(Ordering::Relaxed);
                    if known > 0 {
                        self.known_waiting.store(known - 1, Ordering::Relaxed);
                    } else {
                        match accept_queue_len(self.fd.get_ref()) {
                            Ok(0) => ready.clear_ready(),
                            Ok(n) => self.known_waiting.store(n - 1, Ordering::Relaxed),
                            // Unreadable: the next accept finds out, as tokio's would.
                            Err(_) => {}
                        }
                    }
                    return Ok((tokio::net::TcpStream::from_std(sock)?, peer));
                }
                Ok(Err(e)) => return Err(e),
                // Queue empty: `try_io` cleared the readiness; wait again.
                Err(_would_block) => {}
            }
        }
    }
}

/// Accepts one connection from a non-blocking listener: the new socket is
/// non-blocking and close-on-exec from its `accept4` (no `fcntl` after),
/// with the peer's address. `WouldBlock` when the accept queue is empty.
fn accept_nonblocking(listener: &TcpListener) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use rustix::net::SocketFlags;
    let (fd, peer) =
        rustix::net::acceptfrom_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)?;
    let peer = peer
        .and_then(|a| SocketAddr::try_from(a).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "accept: no IP peer address"))?;
    Ok((fd.into(), peer))
}

/// How many connections wait in a listening socket's accept queue
/// (`TCP_INFO` of a socket in LISTEN state reports it as `tcpi_unacked`).
fn accept_queue_len(listener: &TcpListener) -> io::Result<u32> {
    const TCP_LISTEN: u8 = 10;
    let info = crate::sockopt::tcp_info(listener.as_fd())?;
    if info.tcpi_state != TCP_LISTEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "accept_queue_len: the socket is not listening",
        ));
    }
    Ok(info.tcpi_unacked)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{reuseport_listener, ListenOptions};

    const AT_ONCE: ListenOptions = ListenOptions {
        backlog: 64,
        defer_accept: Duration::ZERO,
    };

    fn wait_for_queue(listener: &TcpListener, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while accept_queue_len(listener).unwrap() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(accept_queue_len(listener).unwrap(), n);
    }

    #[test]
    fn the_accept_queue_counts_what_accept_will_hand_over() {
        let listener = reuseport_listener("127.0.0.1:0".parse().unwrap(), AT_ONCE).unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(accept_queue_len(&listener).unwrap(), 0);
        let e = accept_nonblocking(&listener).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let clients: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        wait_for_queue(&listener, 3);
        let (sock, peer) = accept_nonblocking(&listener).unwrap();
        assert_eq!(accept_queue_len(&listener).unwrap(), 2);
        let ours: Vec<_> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
        assert!(ours.contains(&peer), "{peer} is none of {ours:?}");
        // Non-blocking and close-on-exec from the accept itself.
        let e = std::io::Read::read(&mut &sock, &mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let flags = rustix::io::fcntl_getfd(&sock).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        accept_nonblocking(&listener).unwrap();
        accept_nonblocking(&listener).unwrap();
        assert_eq!(accept_queue_len(&listener).unwrap(), 0);
        // A socket that is not listening is refused, not misread.
        let connected = TcpListener::from(sock.as_fd().try_clone_to_owned().unwrap());
        let e = accept_queue_len(&connected).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// The case the queue read must get right: connections that queued up
    /// together, and connections that arrive while the listener waits
    /// after having read the queue empty. Every one must be accepted.
    #[test]
    fn every_connection_is_accepted_in_bursts_and_one_by_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let std_listener = reuseport_listener("127.0.0.1:0".parse().unwrap(), AT_ONCE).unwrap();
            let addr = std_listener.local_addr().unwrap();
            let listener = Listener::new(std_listener).unwrap();
            // A burst: 20 connections queued before the first accept.
            let burst: Vec<_> = (0..20)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            wait_for_queue(listener.fd.get_ref(), 20);
            let mut peers = Vec::new();
            for _ in 0..20 {
                let (_, peer) = tokio::time::timeout(Duration::from_secs(2), listener.accept())
                    .await
                    .expect("a queued connection was left behind")
                    .unwrap();
                peers.push(peer);
            }
            let mut ours: Vec<_> = burst.iter().map(|c| c.local_addr().unwrap()).collect();
            peers.sort();
            ours.sort();
            assert_eq!(peers, ours);
            assert_eq!(accept_queue_len(listener.fd.get_ref()).unwrap(), 0);
            // One by one, from another thread, each after the listener has
            // found the queue empty and gone back to waiting.
            let client = std::thread::spawn(move || {
                (0..50)
                    .map(|i| {
                        if i % 10 == 0 {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        std::net::TcpStream::connect(addr).unwrap()
                    })
                    .collect::<Vec<_>>()
            });
            for _ in 0..50 {
                tokio::time::timeout(Duration::from_secs(2), listener.accept())
                    .await
                    .expect("a connection was not accepted")
                    .unwrap();
            }
            assert_eq!(client.join().unwrap().len(), 50);
        });
    }
}
