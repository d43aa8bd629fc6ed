//! What rustls reads from: the socket behind a buffer that hands out TLS
//! records whole or in parts, but never two records' bytes in one read.
//!
//! - Buffered: rustls asks for 4 KiB per read, so on a bare socket a big
//!   response costs a system call per 4 KiB and the generator, not the
//!   server, runs out of CPU first (a 2 MiB transfer kept the server ~50 %
//!   busy). The buffer reads the socket in big gulps.
//! - Record-bounded, when asked ([`Reads::RecordBounded`]): rustls stops
//!   reading once a record gives plaintext, so it then holds no part of
//!   the next record. Whoever stops reading through rustls at that point
//!   (to discard a body unread) knows every byte that arrived is either
//!   rustls' plaintext or in this buffer. That costs keep-alive
//!   transfers dearly, so they read [`Reads::Across`] records: rustls'
//!   receive buffer shrinks to 4 KiB whenever a read finds it empty, which
//!   a record-bounded read always does, and grows back 4 KiB (a
//!   reallocation and a copy) at a time, every record.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes read from the socket at once.
const CAPACITY: usize = 64 * 1024;
/// A TLS record header: type, version, length.
const HEADER: usize = 5;
/// Read buffers a generator thread keeps for its next connections.
const SPARE_BUFFERS: usize = 64;

thread_local! {
    /// Buffers of closed connections. A fresh 64 KiB buffer per connection
    /// cost the generator a page fault per page and, once the allocator
    /// returned it, an `madvise`: ~4 % of its core on resumed handshakes,
    /// where the generator is the limit.
    static SPARE: std::cell::RefCell<Vec<Box<[u8]>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where a read handed to rustls may end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// At the end of the current record header or body, never beyond.
    RecordBounded,
    /// Anywhere: as much as is buffered and asked for.
    Across,
}

/// The socket, a read buffer, and where the current record ends.
pub(crate) struct Wire {
    sock: TcpStream,
    reads: Reads,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    header: [u8; HEADER],
    header_len: usize,
    /// Bytes of the current record's body still to hand out.
    body_left: usize,
}

impl Wire {
    pub fn new(sock: TcpStream, reads: Reads) -> Self {
        Self {
            sock,
            reads,
            buf: SPARE
                .with_borrow_mut(Vec::pop)
                .unwrap_or_else(|| vec![0; CAPACITY].into_boxed_slice()),
            start: 0,
            end: 0,
            header: [0; HEADER],
            header_len: 0,
            body_left: 0,
        }
    }

    /// The socket, to read past rustls.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Drops what is buffered and says how many bytes that was. Only a
    /// record-bounded wire knows that rustls then holds no part of a record.
    pub fn discard_buffered(&mut self) -> usize {
        debug_assert_eq!(self.reads, Reads::RecordBounded);
        let n = self.end - self.start;
        self.start = self.end;
        n
    }

    /// How many buffered bytes one read may take: up to the end of the
    /// current header or record body. Updates the record position.
    fn take(&mut self, want: usize) -> usize {
        let have = (self.end - self.start).min(want);
        if self.reads == Reads::Across {
            return have;
        }
        if self.body_left > 0 {
            let n = have.min(self.body_left);
            self.body_left -= n;
            return n;
        }
        let n = have.min(HEADER - self.header_len);
        self.header[self.header_len..self.header_len + n]
            .copy_from_slice(&self.buf[self.start..self.start + n]);
        self.header_len += n;
        if self.header_len == HEADER {
            self.header_len = 0;
            self.body_left = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
        }
        n
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // `try_with`: a connection may outlive the thread's spares.
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARE_BUFFERS {
                spare.push(buf);
            }
        });
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.start == me.end {
            let mut fill = ReadBuf::new(&mut me.buf);
            ready!(Pin::new(&mut me.sock).poll_read(cx, &mut fill))?;
            me.start = 0;
            me.end = fill.filled().len();
            if me.end == 0 {
                return Poll::Ready(Ok(())); // EOF
            }
        }
        let n = me.take(out.remaining());
        out.put_slice(&me.buf[me.start..me.start + n]);
        me.start += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.sock.is_write_vectored()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two records and the start of a third, written at once: reads stop
    /// at every header's and every record's end.
    #[tokio::test]
    async fn reads_never_cross_a_record_boundary() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut wire = Wire::new(
            TcpStream::connect(addr).await.unwrap(),
            Reads::RecordBounded,
        );
        let (mut server, _) = listener.accept().await.unwrap();
        let mut stream = vec![23, 3, 3, 0, 3, b'a', b'b', b'c'];
        stream.extend([23, 3, 3, 0, 1, b'd']);
        stream.extend([23, 3, 3, 0, 2, b'e']);
        server.write_all(&stream).await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let n = wire.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            // Headers end at 5, 13, 19; bodies at 8, 14. However the
            // bytes arrive, no read may span one of these.
            let (from, to) = (got.len(), got.len() + n);
            for boundary in [5, 8, 13, 14, 19] {
                assert!(
                    !(from < boundary && boundary < to),
                    "a read of {from}..{to} crosses {boundary}"
                );
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, stream);
        assert_eq!(wire.body_left, 1, "the third record is cut short");
    }

    /// Read across records, one read may take all that is buffered.
    #[tokio::test]
    async fn reads_across_records_take_what_is_buffered() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut wire = Wire::new(TcpStream::connect(addr).await.unwrap(), Reads::Across);
        let (mut server, _) = listener.accept().await.unwrap();
        let stream = [23, 3, 3, 0, 3, b'a', b'b', b'c', 23, 3, 3, 0, 1, b'd'];
        server.write_all(&stream).await.unwrap();
        server.shutdown().await.unwrap();
        // One write of 14 bytes is one segment on loopback: the socket's
        // first read holds both records, and one read hands both on.
        let mut buf = [0u8; 64];
        let n = wire.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &stream[..]);
        assert_eq!(wire.read(&mut buf).await.unwrap(), 0);
    }
}
