//! [`TlsConnection`] as a tokio byte stream (`AsyncRead` + `AsyncWrite`),
//! for protocol libraries that drive their own I/O (HTTP/2 through the
//! `h2` crate). Only while rustls runs the record layer: a connection
//! moved into the kernel refuses (`Unsupported`), so callers that use
//! this keep the connection in user space.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Layer, SyncIo, TlsConnection, TrackedRead};

fn kernel_layer() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the poll interface needs the record layer in user space",
    )
}

impl TlsConnection {
    /// Sends every pending TLS record, waiting for the socket as needed.
    fn poll_send_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            if !tls.wants_write() {
                return Poll::Ready(Ok(()));
            }
            match tls.write_tls(&mut SyncIo(&self.sock)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.sock.poll_write_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Whether encrypted records wait to be sent (a slow reader's sign).
    pub fn has_pending_records(&self) -> bool {
        matches!(&self.layer, Layer::User(tls) if tls.wants_write())
    }
}

impl AsyncRead for TlsConnection {
    /// Decrypted application data; end of stream after the peer's
    /// close_notify, `UnexpectedEof` after a TCP close without it.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.carried.is_empty() {
            let n = buf.remaining().min(this.carried.len());
            buf.put_slice(this.carried.get(..n).unwrap_or_default());
            this.carried.drain(..n);
            return Poll::Ready(Ok(()));
        }
        if this.peer_closed {
            return Poll::Ready(Ok(()));
        }
        loop {
            let Layer::User(tls) = &mut this.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            match tls.reader().read(buf.initialize_unfilled()) {
                Ok(0) => {
                    this.peer_closed = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            // Nothing decrypted is waiting: records rustls queued by itself
            // (tickets, a KeyUpdate answer) go out first, without waiting.
            if tls.wants_write() {
                if let Poll::Ready(Err(e)) = this.poll_send_records(cx) {
                    return Poll::Ready(Err(e));
                }
            }
            let Layer::User(tls) = &mut this.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            let mut io = TrackedRead {
                sock: &this.sock,
                boundary: &mut this.boundary,
                first: None,
            };
            match tls.read_tls(&mut io) {
                // 0 is TCP EOF: the reader reports it after processing.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(this.sock.poll_read_ready(cx))?;
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
            if let Err(e) = this.process_packets() {
                return Poll::Ready(Err(e));
            }
        }
    }
}

impl AsyncWrite for TlsConnection {
    /// Encrypts into rustls' buffer; waits for the socket only when the
    /// buffer is full. [`poll_flush`](AsyncWrite::poll_flush) sends.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    /// Several buffers into the same records: a frame header and its
    /// payload share a record instead of the header making one of its own.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let Layer::User(tls) = &mut this.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            let n = tls.writer().write_vectored(bufs)?;
            if n > 0 || total == 0 {
                return Poll::Ready(Ok(n));
            }
            ready!(this.poll_send_records(cx))?;
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_records(cx)
    }

    /// close_notify (once), then the socket's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            this.write_closed = true;
            if let Layer::User(tls) = &mut this.layer {
                tls.send_close_notify();
            }
        }
        if let Layer::User(_) = this.layer {
            ready!(this.poll_send_records(cx))?;
        }
        Pin::new(&mut this.sock).poll_shutdown(cx)
    }
}
