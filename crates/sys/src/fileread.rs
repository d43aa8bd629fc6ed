//! Reading a file into a buffer's spare capacity: `pread(2)` writes the
//! bytes where they will be sent from, with no zero-fill before it. An
//! HTTP/2 body was zero-filled chunk by chunk ahead of each read: a 1 MiB
//! file cost a 1 MiB `memset` on top of its copy.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;

use bytes::BytesMut;

/// Reads up to `n` bytes of `file` at `offset` and appends them to `buf`;
/// returns how many (0 at the end of the file).
pub fn pread_append(file: &File, buf: &mut BytesMut, n: usize, offset: u64) -> io::Result<usize> {
    buf.reserve(n);
    let spare = buf.spare_capacity_mut();
    let room = spare.len().min(n);
    let target = spare.get_mut(..room).unwrap_or_default();
    let (read, _) = rustix::io::pread(file, target, offset)?;
    let got = read.len();
    // SAFETY: `pread` initialised the first `got` bytes of the spare
    // capacity (rustix hands back exactly that slice), so the buffer's
    // new length covers initialised bytes only.
    unsafe { buf.set_len(buf.len() + got) };
    Ok(got)
}

/// Opens `path` read-only without waiting: with `O_NONBLOCK`, opening a
/// FIFO returns at once instead of blocking until a writer comes, so the
/// caller can `fstat` the file and refuse what is not a regular file. (On
/// a regular file the flag changes nothing.) `O_NOCTTY`: a terminal named
/// by mistake does not become ours.
pub fn open_no_wait(path: &std::path::Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let fd = rustix::fs::open(path, flags, Mode::empty())?;
    Ok(File::from(fd))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn appends_what_the_file_holds_at_the_offset() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"0123456789").unwrap();
        let mut buf = BytesMut::from(&b"head:"[..]);
        assert_eq!(pread_append(&f, &mut buf, 4, 3).unwrap(), 4);
        assert_eq!(&buf[..], b"head:3456");
        // Past the end: fewer bytes, then none.
        assert_eq!(pread_append(&f, &mut buf, 100, 8).unwrap(), 2);
        assert_eq!(pread_append(&f, &mut buf, 100, 10).unwrap(), 0);
        assert_eq!(&buf[..], b"head:345689");
    }
}
