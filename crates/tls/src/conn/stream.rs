//! [`TlsConnection`] as a tokio byte stream (`AsyncRead` + `AsyncWrite`),
//! for protocol libraries that drive their own I/O (HTTP/2 through the
//! `h2` crate). Only while rustls runs the record layer: a connection
//! moved into the kernel refuses (`Unsupported`), so callers that use
//! this keep the connection in user space.

use std::io::{self, BufRead, Write};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Layer, SyncIo, TlsConnection, TrackedRead, SEND_BUFFER};

fn kernel_layer() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the poll interface needs the record layer in user space",
    )
}

/// What the poll interface's writes may take past `SEND_BUFFER` before
/// the records are sent: a response's HEADERS frame shares h2's write
/// with its first DATA frame, and without the slack the fourth full
/// frame after it no longer fit: every response's first 64 KiB left in
/// two `writev`s (49,290 and 16,406 bytes), not one.
const WRITE_SLACK: usize = 2 * 1024;

impl TlsConnection {
    /// Sends every pending TLS record, waiting for the socket as needed.
    fn poll_send_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            if !tls.wants_write() {
                self.unsent_plaintext = 0;
                return Poll::Ready(Ok(()));
            }
            match tls.write_tls(&mut SyncIo(&self.sock)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.sock.poll_write_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(self.write_failed(e))),
            }
        }
    }

    /// Whether a read that must wait sends the pending records first (the
    /// default). A caller that sends them at the end of each of its turns
    /// turns it off, so that what its turns wrote leaves in one write: a
    /// new HTTP/2 connection's tickets, SETTINGS, SETTINGS ACK and first
    /// response in one `writev` after the handshake's flight, not three.
    ///
    /// Turn it off only once the peer has sent application data: until
    /// then it may be waiting for what rustls queued. After a full TLS 1.2
    /// handshake, [`accept`](super::accept) leaves the server's last flight
    /// (ticket, ChangeCipherSpec, Finished) queued, and the client sends
    /// nothing before it has it. Under h2 nothing else sends it: h2's
    /// flushes wait for the end of the connection loop's turns, and that
    /// loop starts only after the client's preface. (With reads that never
    /// sent, curl over TLS 1.2 and h2 waited for the Finished until the
    /// 10 s preface timeout closed the connection: `tests/keys.rs`.)
    pub fn send_before_waiting(&mut self, on: bool) {
        self.send_before_waiting = on;
    }

    /// Whether encrypted records wait to be sent (a slow reader's sign).
    pub fn has_pending_records(&self) -> bool {
        matches!(&self.layer, Layer::User(tls) if tls.wants_write())
    }
}

/// Copies decrypted bytes into the unfilled part of `buf`, as
/// `Read::read` would, but without zeroing that part first:
/// `ReadBuf::initialize_unfilled` writes every spare byte (h2 reads into
/// 8 KiB and more of fresh capacity) on each call, even one that finds
/// nothing to read. `Ok(0)` is the peer's close_notify, as for `read`.
fn read_plaintext(reader: &mut rustls::Reader<'_>, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // With no room, 0 would read as the peer's close.
    debug_assert!(buf.remaining() > 0, "read_plaintext needs room");
    let mut copied = 0;
    while buf.remaining() > 0 {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            // What was copied goes first; the same state shows again on
            // the next call.
            Err(_) if copied > 0 => break,
            Err(e) => return Err(e),
        };
        let n = chunk.len().min(buf.remaining());
        if n == 0 {
            break;
        }
        buf.put_slice(chunk.get(..n).unwrap_or_default());
        reader.consume(n);
        copied += n;
    }
    Ok(copied)
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
            match read_plaintext(&mut tls.reader(), buf) {
                Ok(0) => {
                    this.peer_closed = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            // Nothing decrypted is waiting: records rustls queued by itself
            // (tickets, a KeyUpdate answer) and what the caller wrote go out
            // first, without waiting, unless the caller sends them itself.
            if this.send_before_waiting && tls.wants_write() {
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
    ///
    /// A write is encrypted whole: one that would not fit under
    /// `SEND_BUFFER` (and [`WRITE_SLACK`]) beside what this interface
    /// encrypted since the last send sends those records first. rustls' own limit would take the
    /// part that fits and leave the rest for a record of its own: an h2
    /// DATA frame sized to fill a record became records of 16,318 and
    /// 66 bytes, the second in a `writev`, a segment and a wake-up of the
    /// client of its own, once per 64 KiB sent.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.unsent_plaintext > 0 && this.unsent_plaintext + total > SEND_BUFFER + WRITE_SLACK {
            ready!(this.poll_send_records(cx))?;
        }
        loop {
            let Layer::User(tls) = &mut this.layer else {
                return Poll::Ready(Err(kernel_layer()));
            };
            // With nothing of ours buffered, rustls' limit bounds a large
            // write; otherwise the check above did (the records' framing
            // may take the buffer past the limit by a few bytes each).
            let whole = this.unsent_plaintext > 0;
            if whole {
                tls.set_buffer_limit(None);
            }
            let n = tls.writer().write_vectored(bufs);
            if whole {
                tls.set_buffer_limit(Some(SEND_BUFFER));
            }
            let n = n?;
            this.unsent_plaintext += n;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::mem::MaybeUninit;
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use rustls::sign::SingleCertAndKey;
    use rustls::{ClientConnection, Connection, ServerConnection};

    use super::*;

    /// Moves every record `from` has to send to `to`.
    fn pass(from: &mut Connection, to: &mut Connection) {
        let mut wire = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut wire).unwrap();
        }
        let mut at = &wire[..];
        while !at.is_empty() {
            to.read_tls(&mut at).unwrap();
            to.process_new_packets().unwrap();
        }
    }

    fn exchange(c: &mut Connection, s: &mut Connection) {
        pass(c, s);
        pass(s, c);
    }

    /// A client and a server past their handshake, records kept in memory.
    fn handshaken() -> (Connection, Connection) {
        let made = crate::self_signed().unwrap();
        let cert = made.loaded.certified.cert.first().unwrap().clone();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(made.loaded.certified)));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").unwrap();
        let mut c = Connection::from(ClientConnection::new(Arc::new(client), name).unwrap());
        let mut s = Connection::from(ServerConnection::new(Arc::new(server)).unwrap());
        while c.is_handshaking() || s.is_handshaking() {
            exchange(&mut c, &mut s);
        }
        (c, s)
    }

    #[test]
    fn plaintext_is_copied_across_records_into_a_buffer_never_initialised() {
        let (mut c, mut s) = handshaken();
        // Three writes: three records, three chunks on the server's side.
        let sent: Vec<u8> = (0..12_000u32).map(|i| (i % 251) as u8).collect();
        for part in sent.chunks(4_000) {
            c.writer().write_all(part).unwrap();
        }
        exchange(&mut c, &mut s);

        let mut got = Vec::new();
        // Smaller than what waits and than one record: reads end mid-chunk.
        let mut space = [MaybeUninit::<u8>::uninit(); 2_500];
        loop {
            let mut buf = ReadBuf::uninit(&mut space);
            match read_plaintext(&mut s.reader(), &mut buf) {
                Ok(n) => {
                    // Filled across chunks, as far as bytes wait.
                    assert_eq!(n, buf.capacity().min(sent.len() - got.len()));
                    assert_eq!(n, buf.filled().len());
                    got.extend_from_slice(buf.filled());
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
        }
        assert_eq!(got, sent);

        // Bytes and the close after them: the bytes first, then Ok(0).
        c.writer().write_all(b"last").unwrap();
        c.send_close_notify();
        exchange(&mut c, &mut s);
        let mut buf = ReadBuf::uninit(&mut space);
        assert_eq!(read_plaintext(&mut s.reader(), &mut buf).unwrap(), 4);
        assert_eq!(buf.filled(), b"last");
        let mut buf = ReadBuf::uninit(&mut space);
        assert_eq!(read_plaintext(&mut s.reader(), &mut buf).unwrap(), 0);
    }
}
