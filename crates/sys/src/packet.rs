//! `AF_PACKET` sockets that send whole Ethernet frames as built, past the
//! qdisc (`PACKET_QDISC_BYPASS`), in batches (`sendmmsg`): the SYN flood
//! generator's way out. Binding needs a `sockaddr_ll`, which no safe crate
//! here builds, and the bypass option has no safe setter: those two calls
//! are the unsafe ones, each with its `SAFETY` note. Sending goes through
//! rustix's safe `sendmmsg`.
#![allow(unsafe_code)]

use std::io;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags};

/// A packet socket bound to one interface, for sending only.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
}

fn last(call: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

impl PacketSocket {
    /// Opens a packet socket that sends on the interface `ifindex` and
    /// receives nothing (protocol 0), with the qdisc bypassed.
    pub fn open(ifindex: u32) -> io::Result<PacketSocket> {
        // SAFETY: socket(2) with constant arguments; the result is checked
        // and owned at once.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(last("socket(AF_PACKET)"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index"))?;
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `sll` is a valid sockaddr_ll of `len` bytes that outlives
        // the call; the descriptor is open.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                len,
            )
        };
        if r < 0 {
            return Err(last("bind(AF_PACKET)"));
        }
        let one: libc::c_int = 1;
        // SAFETY: an int option of the right size that outlives the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&one as *const libc::c_int).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(last("setsockopt(PACKET_QDISC_BYPASS)"));
        }
        Ok(PacketSocket { fd })
    }

    /// Sends `frames` (whole Ethernet frames) with one `sendmmsg`; returns
    /// how many went (the rest, if any, are the caller's to retry). The
    /// error is the kernel's as it is (`raw_os_error` tells `ENOBUFS`, a
    /// full device queue, from the rest).
    pub fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let iovs: Vec<[IoSlice<'_>; 1]> = frames.iter().map(|f| [IoSlice::new(f)]).collect();
        let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = frames
            .iter()
            .map(|_| SendAncillaryBuffer::default())
            .collect();
        let mut msgs: Vec<MMsgHdr<'_>> = iovs
            .iter()
            .zip(controls.iter_mut())
            .map(|(iov, control)| MMsgHdr::new(iov, control))
            .collect();
        sendmmsg(self.fd.as_fd(), &mut msgs, SendFlags::empty()).map_err(io::Error::from)
    }
}

/// The index of the interface `name` in the calling thread's network
/// namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let s = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    rustix::net::netdevice::name_to_index(&s, name)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("interface {name}: {e}")))
}
