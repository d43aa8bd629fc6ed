//! One TLS connection over a tokio `TcpStream`, driven by hand.
//!
//! tlsgate drives rustls itself instead of wrapping it in a stream adapter
//! because later work needs the pieces: the ClientHello is inspected before
//! any expensive cryptography (SNI policy now, flood limits later), and after
//! the handshake the socket and the rustls state can be taken apart again
//! ([`TlsConnection::into_parts`]) to hand the record layer to kernel TLS.

use std::io::{self, Read, Write};

use rustls::server::{Acceptor, ServerConnection};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::context::TlsContext;
use crate::error::HandshakeError;

/// A plaintext `unrecognized_name` fatal alert record (RFC 8446 §6.2); it is
/// sent before any keys exist, so it goes in the clear.
const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// Non-blocking std I/O over a tokio socket, for rustls' `read_tls`/`write_tls`.
struct SyncIo<'a>(&'a TcpStream);

impl Read for SyncIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for SyncIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Best effort: an alert that cannot be sent at once is not waited for.
fn send_now(sock: &TcpStream, bytes: &[u8]) {
    let _ = sock.try_write(bytes);
}

/// Completes a server handshake on `sock` with the listener's `ctx`.
///
/// The caller bounds the time (handshake timeout) and counts the result.
pub async fn accept(sock: TcpStream, ctx: &TlsContext) -> Result<TlsConnection, HandshakeError> {
    let mut acceptor = Acceptor::default();
    let accepted = loop {
        match acceptor.read_tls(&mut SyncIo(&sock)) {
            Ok(0) => return Err(HandshakeError::Eof),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                sock.readable().await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        match acceptor.accept() {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err((e, mut alert)) => {
                let _ = alert.write(&mut SyncIo(&sock));
                return Err(e.into());
            }
        }
    };
    let sni = accepted.client_hello().server_name().map(str::to_owned);
    // The name decides the certificate and whether a client certificate
    // is asked for (mutual TLS per name).
    let Some(config) = ctx.config_for(sni.as_deref()) else {
        send_now(&sock, &ALERT_UNRECOGNIZED_NAME);
        return Err(HandshakeError::UnrecognizedName(sni));
    };
    let tls = match accepted.into_connection(config.clone()) {
        Ok(c) => c,
        Err((e, mut alert)) => {
            let _ = alert.write(&mut SyncIo(&sock));
            return Err(e.into());
        }
    };
    let mut conn = TlsConnection { sock, tls };
    conn.finish_handshake().await?;
    Ok(conn)
}

/// An established TLS connection.
pub struct TlsConnection {
    sock: TcpStream,
    tls: ServerConnection,
}

impl TlsConnection {
    async fn finish_handshake(&mut self) -> Result<(), HandshakeError> {
        while self.tls.is_handshaking() {
            self.flush().await?;
            if !self.tls.is_handshaking() {
                break;
            }
            if self.read_tls().await? == 0 {
                return Err(HandshakeError::Eof);
            }
            if let Err(e) = self.tls.process_new_packets() {
                // rustls queued the matching alert: try to deliver it.
                let _ = self.tls.write_tls(&mut SyncIo(&self.sock));
                return Err(e.into());
            }
        }
        // TLS 1.3 session tickets stay queued: they leave with the first
        // response in one write, or in `read` before it waits for the
        // client, saving a write (and a client wake-up) per connection.
        Ok(())
    }

    /// Reads TLS records from the socket into rustls; 0 means TCP EOF.
    async fn read_tls(&mut self) -> io::Result<usize> {
        loop {
            match self.tls.read_tls(&mut SyncIo(&self.sock)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.readable().await?,
                other => return other,
            }
        }
    }

    /// Reads decrypted application data. `Ok(0)` is a clean close
    /// (close_notify); a TCP close without it is `UnexpectedEof`.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.tls.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            // Nothing decrypted is waiting: send what is queued (session
            // tickets, a KeyUpdate answer) before waiting for the client.
            if self.tls.wants_write() {
                self.flush().await?;
            }
            self.read_tls().await?;
            if let Err(e) = self.tls.process_new_packets() {
                let _ = self.tls.write_tls(&mut SyncIo(&self.sock));
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }

    /// Encrypts all of `data` into records, sending as rustls' buffer fills.
    /// Call [`flush`](Self::flush) to send what is left.
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = self.tls.writer().write(data)?;
            data = data.get(n..).unwrap_or_default();
            if n == 0 || !data.is_empty() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Sends every pending TLS record.
    pub async fn flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut SyncIo(&self.sock)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends close_notify and shuts the write side of the socket.
    pub async fn close(&mut self) -> io::Result<()> {
        self.tls.send_close_notify();
        self.flush().await?;
        self.sock.shutdown().await
    }

    /// The rustls state (negotiated version, suite, group, SNI...).
    pub fn tls(&self) -> &ServerConnection {
        &self.tls
    }

    /// The TCP socket.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Takes the connection apart, e.g. to move the record layer to the kernel.
    /// Records may still be queued in rustls (the session tickets): send
    /// them with [`flush`](Self::flush) first.
    pub fn into_parts(self) -> (TcpStream, ServerConnection) {
        (self.sock, self.tls)
    }
}
