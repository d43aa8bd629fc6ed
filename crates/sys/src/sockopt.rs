//! Socket options no safe wrapper offers (kTLS's `TCP_ULP` and `SOL_TLS`,
//! `TCP_DEFER_ACCEPT`), set through one `unsafe` call, and `TCP_INFO`
//! read through another.
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `setsockopt` with a byte range: the crate's one way to set options.
pub(crate) fn setsockopt_bytes(
    sock: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: *const libc::c_void,
    len: usize,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `value` points to `len` readable bytes owned by the caller for
    // the duration of the call (a live struct, string or int); the kernel
    // copies them and keeps no pointer.
    let r = unsafe { libc::setsockopt(sock.as_raw_fd(), level, name, value, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `setsockopt` with a C `int`.
pub(crate) fn setsockopt_int(
    sock: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    setsockopt_bytes(
        sock,
        level,
        name,
        (&v as *const libc::c_int).cast(),
        mem::size_of::<libc::c_int>(),
    )
}

/// `getsockopt(TCP_INFO)`: the kernel's view of a TCP socket.
pub(crate) fn tcp_info(sock: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    // SAFETY: `tcp_info` is a C struct of integers, for which all zero
    // bytes are a valid value.
    let mut info: libc::tcp_info = unsafe { mem::zeroed() };
    let mut len = libc::socklen_t::try_from(mem::size_of::<libc::tcp_info>())
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `info` is a live, writable `tcp_info` of `len` bytes; the
    // kernel writes at most `len` bytes into it and keeps no pointer.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(info)
    } else {
        Err(io::Error::last_os_error())
    }
}
