//! Socket options no safe wrapper offers (kTLS's `TCP_ULP` and `SOL_TLS`,
//! `TCP_DEFER_ACCEPT`), set through one `unsafe` call.
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
