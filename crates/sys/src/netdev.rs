//! What an interface is, as the kernel's `SIOCGIF*` ioctls say it: its
//! index, its MTU and its MAC address, in the calling thread's network namespace (sysfs
//! may show another one: `/sys` keeps the namespace it was mounted in, so a
//! process moved with `nsenter --net` reads the host's interfaces there).
//! Two ioctls, the unsafe calls of this module, each with its `SAFETY` note.
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

/// The hardware address of the Ethernet interface `name`; an error for
/// an interface that has none of 6 bytes (`ARPHRD_ETHER`).
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    let req = query(name, libc::SIOCGIFHWADDR, "SIOCGIFHWADDR")?;
    // SAFETY: SIOCGIFHWADDR fills ifru_hwaddr, the member read.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "interface {name} is not Ethernet (hardware type {})",
                addr.sa_family
            ),
        ));
    }
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(addr.sa_data.iter()) {
        *m = *b as u8;
    }
    Ok(mac)
}

/// The index of the interface `name` in the calling thread's network
/// namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    ifindex_if_present(name)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("interface {name}: no such device"),
        )
    })
}

/// [`ifindex`], or `None` when there is no interface of that name (here).
pub fn ifindex_if_present(name: &str) -> io::Result<Option<u32>> {
    let s = socket()?;
    match rustix::net::netdevice::name_to_index(&s, name) {
        Ok(i) => Ok(Some(i)),
        Err(rustix::io::Errno::NODEV) => Ok(None),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("interface {name}: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_an_mtu_and_no_ethernet_address() {
        assert!(mtu("lo").expect("lo exists") >= 1280);
        assert_eq!(
            mac("lo").expect_err("lo is not Ethernet").kind(),
            io::ErrorKind::Unsupported
        );
        assert!(mtu("no-such-if0").is_err());
        assert!(ifindex_if_present("lo").expect("lo exists").is_some());
        assert_eq!(ifindex_if_present("no-such-if0").expect("no error"), None);
        assert_eq!(
            mtu("a-name-far-too-long-for-linux").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
