//! What an interface is, as the kernel's `SIOCGIF*` ioctls say it: its
//! MTU, in the calling thread's network namespace (sysfs
//! may show another one: `/sys` keeps the namespace it was mounted in, so a
//! process moved with `nsenter --net` reads the host's interfaces there).
//! The ioctl is the unsafe call of this module, with its `SAFETY` note.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// An `ifreq` naming `name`, or an error for a name the kernel cannot hold.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data (a name and a union of plain data);
    // all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?)
}

/// Runs the `SIOCGIF*` request `call` for `name` and returns the filled
/// `ifreq`.
fn query(name: &str, request: libc::c_ulong, call: &str) -> io::Result<libc::ifreq> {
    let s = socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name that
    // outlives the call; the kernel writes at most sizeof(ifreq) into it.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), request, &mut req as *mut libc::ifreq) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("{call} on interface {name}: {e}"),
        ));
    }
    Ok(req)
}

/// The MTU of the interface `name`.
pub fn mtu(name: &str) -> io::Result<u32> {
    let req = query(name, libc::SIOCGIFMTU, "SIOCGIFMTU")?;
    // SAFETY: SIOCGIFMTU fills ifru_mtu, the member read.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::other(format!("interface {name}: MTU {mtu}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_an_mtu() {
        assert!(mtu("lo").expect("lo exists") >= 1280);
        assert!(mtu("no-such-if0").is_err());
        assert_eq!(
            mtu("a-name-far-too-long-for-linux").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
