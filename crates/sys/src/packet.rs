//! `AF_PACKET` sockets that send whole Ethernet frames as built, past the
//! qdisc (`PACKET_QDISC_BYPASS`), in batches (`sendmmsg`): the SYN flood
//! generator's way out. Binding needs a `sockaddr_ll`, which no safe crate
//! here builds, and the bypass option has no safe setter: those two calls
//! are the unsafe ones, each with its `SAFETY` note. Sending goes through
//! rustix's safe `sendmmsg`. The generator's XDP mode sends with
//! `bpf(BPF_PROG_RUN)` in live-frame mode ([`xdp_live_run`]) through the
//! crate's one `bpf(2)` call in [`crate::bpf`]: no safe crate here makes
//! it (aya 0.13 does not).
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

pub use crate::netdev::ifindex;

/// `struct xdp_md` as `BPF_PROG_TEST_RUN` takes it for its context.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// The `test` member of `union bpf_attr` (`BPF_PROG_TEST_RUN`), up to
/// `batch_size`, and the struct's tail padding as an explicit zero field:
/// the kernel refuses (`EINVAL`) an attribute with non-zero bytes past the
/// command's last field, and implicit padding is not initialised.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

impl crate::bpf::Attr for TestRunAttr {}

const BPF_PROG_TEST_RUN: libc::c_int = 10;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// Runs the XDP program `prog` `repeat` times on copies of `frame` in
/// live-frame mode (`BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`,
/// Linux 5.18+), `batch` frames at a time (1–256): the frames the program
/// returns `XDP_TX` for are transmitted on the interface `ifindex` (in the
/// calling thread's network namespace) as `xdp_frame`s, the way a
/// driver's XDP_TX/redirect would send them, with XDP headroom. The
/// program may rewrite each frame; the kernel does not restore the
/// template's bytes between runs, only its pointers. Runs on the calling
/// thread's CPU; needs `CAP_BPF` and `CAP_NET_ADMIN`.
pub fn xdp_live_run(
    prog: std::os::fd::BorrowedFd<'_>,
    frame: &[u8],
    ifindex: u32,
    repeat: u32,
    batch: u32,
) -> io::Result<()> {
    let len = u32::try_from(frame.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
    let ctx = XdpMd {
        data_end: len,
        ingress_ifindex: ifindex,
        ..XdpMd::default()
    };
    let prog_fd = u32::try_from(prog.as_raw_fd())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "descriptor"))?;
    let mut attr = TestRunAttr {
        prog_fd,
        data_size_in: len,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: (&ctx as *const XdpMd) as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..TestRunAttr::default()
    };
    // The kernel writes retval, duration and data_size_out back into
    // `attr`; it only reads `frame` and `ctx` (no data_out or ctx_out in
    // live-frame mode), both valid for the lengths given until it returns.
    crate::bpf::sys_bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("bpf(BPF_PROG_TEST_RUN, XDP live frames): {e}"),
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the kernel's UAPI gives these structs.
    #[test]
    fn test_run_layout_matches_the_uapi() {
        assert_eq!(std::mem::size_of::<XdpMd>(), 24);
        assert_eq!(std::mem::size_of::<TestRunAttr>(), 80);
        assert_eq!(std::mem::offset_of!(TestRunAttr, data_in), 16);
        assert_eq!(std::mem::offset_of!(TestRunAttr, repeat), 32);
        assert_eq!(std::mem::offset_of!(TestRunAttr, ctx_in), 48);
        assert_eq!(std::mem::offset_of!(TestRunAttr, flags), 64);
        assert_eq!(std::mem::offset_of!(TestRunAttr, batch_size), 72);
        assert_eq!(std::mem::offset_of!(TestRunAttr, pad), 76);
    }
}
