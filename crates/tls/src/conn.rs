//! One TLS connection over a tokio `TcpStream`, driven by hand.
//!
//! tlsgate drives rustls itself instead of wrapping it in a stream adapter
//! because later work needs the pieces: the ClientHello is inspected before
//! any expensive cryptography (SNI policy, flood limits), and after the
//! handshake the record layer can move into the kernel
//! ([`TlsConnection::offload`]): rustls gives up its traffic secrets and
//! the socket encrypts and decrypts by itself (kTLS), which lets files go
//! out with `sendfile`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::time::Duration;

use rustls::server::{Acceptor, ServerConnection};
use rustls::HandshakeKind;
use tlsgate_sys::ktls::{self, content_type, Direction, Support, TlsVersion};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use crate::context::TlsContext;
use crate::error::HandshakeError;
use crate::offload::{crypto_info, kernel_suite, KernelState, OffloadError, RecordBoundary};

mod stream;

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

/// The writes of a connection's last records: `MSG_MORE`, so the FIN that
/// follows at once shares their segment.
struct LastWrite<'a>(&'a TcpStream);

impl Write for LastWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_io(Interest::WRITABLE, || {
            tlsgate_sys::send_vectored_more(self.0.as_fd(), bufs)
        })
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Socket reads for rustls that keep track of the TLS record framing, so
/// the record layer can later be handed to the kernel at a record start.
struct TrackedRead<'a> {
    sock: &'a TcpStream,
    boundary: &'a mut RecordBoundary,
    /// The stream's first bytes, kept while the ClientHello is read.
    first: Option<&'a mut HelloStart>,
}

impl Read for TrackedRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = tlsgate_sys::read_draining(self.sock, buf)?;
        let got = buf.get(..n).unwrap_or_default();
        self.boundary.observe(got);
        if let Some(first) = self.first.as_deref_mut() {
            first.observe(got);
        }
        Ok(n)
    }
}

/// The first 11 bytes of a connection: record header, handshake header and
/// the ClientHello's legacy_version.
#[derive(Default)]
struct HelloStart {
    bytes: [u8; 11],
    have: usize,
}

impl HelloStart {
    fn observe(&mut self, got: &[u8]) {
        let take = (self.bytes.len() - self.have).min(got.len());
        if let (Some(dst), Some(src)) = (
            self.bytes.get_mut(self.have..self.have + take),
            got.get(..take),
        ) {
            dst.copy_from_slice(src);
        }
        self.have += take;
    }

    /// The ClientHello's legacy_version, if the first record carries it.
    fn legacy_version(&self) -> Option<u16> {
        match self.bytes {
            [0x16, _, _, _, _, 0x01, _, _, _, major, minor] if self.have == 11 => {
                Some(u16::from_be_bytes([major, minor]))
            }
            _ => None,
        }
    }
}

/// A plaintext `protocol_version` fatal alert record.
const ALERT_PROTOCOL_VERSION: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 70];

/// A plaintext `internal_error` fatal alert record: the server cannot go
/// on for a reason of its own (its key process did not sign).
const ALERT_INTERNAL_ERROR: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80];

/// The first bytes of a TLS 1.2 server flight kept: its ServerHello with
/// the session ID and the extensions (~40 bytes from rustls).
const FIRST_FLIGHT_KEPT: usize = 192;

/// Writes for rustls that keep the first bytes sent: the TLS 1.2
/// ServerHello, whose session ID a fatal alert must forget and whose
/// extensions say whether a ticket follows.
struct FirstFlight<'a> {
    sock: &'a TcpStream,
    bytes: &'a mut [u8; FIRST_FLIGHT_KEPT],
    have: &'a mut usize,
}

impl FirstFlight<'_> {
    /// Keeps what fits of the `n` bytes just sent from `bufs`.
    fn keep(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 || *self.have == self.bytes.len() {
                return;
            }
            let sent = buf.len().min(n);
            n -= sent;
            let keep = (self.bytes.len() - *self.have).min(sent);
            if let (Some(dst), Some(src)) = (
                self.bytes.get_mut(*self.have..*self.have + keep),
                buf.get(..keep),
            ) {
                dst.copy_from_slice(src);
            }
            *self.have += keep;
        }
    }
}

impl Write for FirstFlight<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.sock.try_write(buf)?;
        self.keep(&[io::IoSlice::new(buf)], n);
        Ok(n)
    }
    // The whole flight (ServerHello … ServerHelloDone, or a resumption's
    // ServerHello, ticket, ChangeCipherSpec and Finished) in one system
    // call and one TCP segment: rustls hands every record as its own
    // buffer, and the default `write_vectored` would send each alone.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let n = self.sock.try_write_vectored(bufs)?;
        self.keep(bufs, n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The body of a TLS 1.2 ServerHello at the start of `flight`, as far as
/// `flight` holds it: after the record header (5) and the handshake header
/// (4), up to the hello's own end (rustls may put the flight's next
/// messages in the same record).
fn server_hello(flight: &[u8]) -> Option<&[u8]> {
    if flight.first() != Some(&0x16) || flight.get(5) != Some(&0x02) {
        return None;
    }
    let len = flight
        .get(6..9)?
        .iter()
        .fold(0usize, |n, b| n << 8 | usize::from(*b));
    flight.get(9..(9 + len).min(flight.len()))
}

/// The session ID of a TLS 1.2 ServerHello: after version (2) and random
/// (32), the ID's length and the ID.
fn server_hello_session_id(flight: &[u8]) -> Option<([u8; 32], usize)> {
    let hello = server_hello(flight)?;
    let len = usize::from(*hello.get(34)?);
    let id = hello.get(35..35 + len)?;
    let mut out = [0u8; 32];
    out.get_mut(..len)?.copy_from_slice(id);
    (len > 0).then_some((out, len))
}

/// Whether a TLS 1.2 ServerHello carries the session_ticket extension, the
/// promise of a NewSessionTicket (RFC 5077 §3.2). After the session ID:
/// cipher suite (2), compression (1), then the extensions' length and each
/// extension's type and length.
fn server_hello_sends_ticket(flight: &[u8]) -> bool {
    const SESSION_TICKET: [u8; 2] = [0x00, 0x23];
    let walk = || -> Option<bool> {
        let hello = server_hello(flight)?;
        let at = 35 + usize::from(*hello.get(34)?) + 3;
        let len = usize::from(u16::from_be_bytes([*hello.get(at)?, *hello.get(at + 1)?]));
        let listed = hello.get(at + 2..)?;
        let mut ext = listed.get(..len).unwrap_or(listed);
        while let (Some(kind), Some(n)) = (ext.get(..2), ext.get(2..4)) {
            if kind == SESSION_TICKET {
                return Some(true);
            }
            let n = usize::from(u16::from_be_bytes([*n.first()?, *n.get(1)?]));
            ext = ext.get(4 + n..)?;
        }
        Some(false)
    };
    walk().unwrap_or(false)
}

/// A TLS 1.2 session in the server's cache, forgotten if the connection
/// ends in a fatal alert (RFC 5246 §7.2.2).
struct CachedSession {
    config: std::sync::Arc<rustls::ServerConfig>,
    id: [u8; 32],
    len: usize,
    /// A ticket was announced: the session is not cached
    /// (crate::session_cache).
    ticketed: bool,
}

impl CachedSession {
    fn forget(&self) {
        if let Some(id) = self.id.get(..self.len) {
            self.config.session_storage.take(id);
        }
    }
}

/// Best effort: an alert that cannot be sent at once is not waited for.
fn send_now(sock: &TcpStream, bytes: &[u8]) {
    let _ = sock.try_write(bytes);
}

/// Tells the client its handshake failed with `e`: `queued` sends what
/// rustls queued (its alert), except when the key process did not sign.
/// rustls queues no alert then, only the ServerHello the signature was to
/// follow: sent alone, the client waits for the rest until we close (a
/// truncated stream). None of that flight has left yet, so it is dropped
/// and `internal_error` goes instead, in the clear, as before any
/// ServerHello (after a HelloRetryRequest too, which has no keys).
fn send_failure(sock: &TcpStream, e: &rustls::Error, queued: impl FnOnce(&mut SyncIo<'_>)) {
    if crate::KeyUnavailable::cause_of(e).is_some() {
        send_now(sock, &ALERT_INTERNAL_ERROR);
    } else {
        queued(&mut SyncIo(sock));
    }
}

/// Completes a server handshake on `sock` with the listener's `ctx`.
///
/// The caller bounds the time (handshake timeout) and counts the result.
pub async fn accept(sock: TcpStream, ctx: &TlsContext) -> Result<TlsConnection, HandshakeError> {
    let mut acceptor = Acceptor::default();
    let mut boundary = RecordBoundary::default();
    let mut first = HelloStart::default();
    let accepted = loop {
        let mut io = TrackedRead {
            sock: &sock,
            boundary: &mut boundary,
            first: Some(&mut first),
        };
        match acceptor.read_tls(&mut io) {
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
    // RFC 8446 Appendix D.5: a ClientHello with legacy_version 0x0300
    // (SSLv3) or lower MUST be refused with protocol_version.
    if let Some(v) = first.legacy_version().filter(|v| *v <= 0x0300) {
        send_now(&sock, &ALERT_PROTOCOL_VERSION);
        return Err(HandshakeError::LegacyVersion(v));
    }
    let sni = accepted.client_hello().server_name().map(str::to_owned);
    // The name decides the certificate and whether a client certificate
    // is asked for (mutual TLS per name).
    let Some(config) = ctx.config_for(sni.as_deref()) else {
        send_now(&sock, &ALERT_UNRECOGNIZED_NAME);
        return Err(HandshakeError::UnrecognizedName(sni));
    };
    // rustls signs in here: with the keys in the key process, the
    // handshake waits for its signature without blocking the worker.
    let for_rustls = config.clone();
    let made = crate::remote::run_signing(move || accepted.into_connection(for_rustls))
        .await
        .map_err(io::Error::other)?;
    let tls = match made {
        Ok(c) => c,
        Err((e, mut alert)) => {
            send_failure(&sock, &e, |io| {
                let _ = alert.write(io);
            });
            return Err(e.into());
        }
    };
    let tls12 = tls.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2);
    let mut conn = TlsConnection {
        sock,
        layer: Layer::User(tls),
        boundary,
        carried: Vec::new(),
        peer_closed: false,
        write_closed: false,
        session: None,
        send_before_waiting: true,
        unsent_plaintext: 0,
    };
    if tls12 {
        // The first flight goes out now, its session ID noted.
        let (mut flight, mut have) = ([0u8; FIRST_FLIGHT_KEPT], 0);
        conn.flush_into(&mut flight, &mut have).await?;
        let flight = flight.get(..have).unwrap_or_default();
        conn.session = server_hello_session_id(flight).map(|(id, len)| CachedSession {
            config: config.clone(),
            id,
            len,
            ticketed: server_hello_sends_ticket(flight),
        });
    }
    if let Err(e) = conn.finish_handshake().await {
        if matches!(e, HandshakeError::Tls(_)) {
            // A fatal alert was sent or received.
            conn.failed();
        }
        return Err(e);
    }
    Ok(conn)
}

/// An established TLS connection, its records encrypted by rustls in user
/// space or, after [`offload`](Self::offload), by the kernel.
pub struct TlsConnection {
    sock: TcpStream,
    layer: Layer,
    /// Where the bytes read so far end in the record framing.
    boundary: RecordBoundary,
    /// Plaintext rustls had decrypted when the kernel took over; read first.
    carried: Vec<u8>,
    /// The peer's close_notify arrived.
    peer_closed: bool,
    /// Our close_notify was sent (or the write side is gone).
    write_closed: bool,
    /// The TLS 1.2 session this connection put in (or took from) the cache.
    session: Option<CachedSession>,
    /// `poll_read` sends what rustls queued before it waits (see there);
    /// off when the caller sends at the end of every turn anyway.
    send_before_waiting: bool,
    /// Plaintext `poll_write` encrypted since rustls' records were last
    /// all sent: what decides when a write sends them first (see there).
    unsent_plaintext: usize,
}

// Boxing rustls' state would cost an allocation per connection to save
// ~1 KiB only on connections that moved to the kernel.
#[allow(clippy::large_enum_variant)]
enum Layer {
    User(ServerConnection),
    Kernel(KernelState),
    /// A switch to the kernel failed after rustls gave up its state.
    Gone,
}

/// Whether epoll already reported `sock` gone both ways (a reset, or
/// both sides shut): nothing written now can reach the peer. Reads the
/// readiness tokio last took from epoll, without a system call.
fn peer_unreachable(sock: &TcpStream) -> bool {
    last_readiness(sock, Interest::WRITABLE).is_some_and(|r| r.is_write_closed())
}

/// The readiness for `interest` that tokio last took from epoll, without
/// a system call; `None` when it holds none.
fn last_readiness(sock: &TcpStream, interest: Interest) -> Option<tokio::io::Ready> {
    let ready = std::pin::pin!(sock.ready(interest));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(ready, &mut cx) {
        std::task::Poll::Ready(Ok(r)) => Some(r),
        _ => None,
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection's TLS state was lost in a failed switch to kernel TLS",
    )
}

/// TLS alert descriptions used under kTLS (RFC 8446 §6).
mod alert {
    pub const CLOSE_NOTIFY: u8 = 0;
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const USER_CANCELED: u8 = 90;
    pub const WARNING: u8 = 1;
    pub const FATAL: u8 = 2;
}

/// Ciphertext rustls queues before its writer takes no more: its own
/// default, restated because `write_all` raises it for one call.
const SEND_BUFFER: usize = 64 * 1024;
/// What one `write_all` call encrypts before sending, at most.
const ONE_WRITE: usize = 2 * SEND_BUFFER;

/// The smallest read passed to the kernel's record layer: room for any
/// alert (2 bytes) and a handshake message's type.
const MIN_KERNEL_READ: usize = 64;

/// TLS 1.3 handshake message type of KeyUpdate.
const KEY_UPDATE: u8 = 24;

/// What a relay turn waits for: readable when it may read, writable when
/// it has something to send; `None` for neither (it then waits for ever).
pub fn relay_interest(reading: bool, sending: bool) -> Option<Interest> {
    match (reading, sending) {
        (true, true) => Some(Interest::READABLE | Interest::WRITABLE),
        (true, false) => Some(Interest::READABLE),
        (false, true) => Some(Interest::WRITABLE),
        (false, false) => None,
    }
}

/// What one [`TlsConnection::relay`] turn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Application bytes read into the buffer; 0 is the peer's
    /// close_notify.
    Read(usize),
    /// Bytes of the data taken to send; 0: nothing was to be taken, and
    /// the records queued before have gone out.
    Sent(usize),
}

impl TlsConnection {
    async fn finish_handshake(&mut self) -> Result<(), HandshakeError> {
        let ticketed = self.session.as_ref().is_some_and(|s| s.ticketed);
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone().into());
            };
            // First whatever is already here: records that came in the same
            // read as the ClientHello (a pipelined flight, a second hello)
            // are processed now, never left waiting for more input.
            let processed =
                if tls.handshake_kind() == Some(HandshakeKind::FullWithHelloRetryRequest) {
                    // After a HelloRetryRequest the second ClientHello is
                    // answered here, and signed: the signature is awaited as
                    // the first hello's is, not by blocking the worker.
                    self.process_retried_hello().await?
                } else {
                    let _ticketed = ticketed.then(crate::session_cache::TicketedSession::enter);
                    let _gone = peer_unreachable(&self.sock)
                        .then(crate::session_cache::UnreachablePeer::enter);
                    tls.process_new_packets().map(|_| ())
                };
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone().into());
            };
            if let Err(e) = processed {
                // rustls queued the matching alert: try to deliver it.
                send_failure(&self.sock, &e, |io| {
                    let _ = tls.write_tls(io);
                });
                return Err(e.into());
            }
            if !tls.is_handshaking() {
                break;
            }
            self.flush().await?;
            if self.read_tls().await? == 0 {
                return Err(HandshakeError::Eof);
            }
        }
        // What rustls queued last stays queued: TLS 1.3 session tickets
        // leave with the first response in one write (or in the first read
        // that waits), saving a write and a client wake-up per connection.
        // A full TLS 1.2 handshake's last flight (ticket, ChangeCipherSpec,
        // Finished), which the client waits for, leaves in the first read
        // that waits (see `send_before_waiting`).
        Ok(())
    }

    /// `process_new_packets` for a handshake that was asked to retry its
    /// ClientHello, run where a signature it asks for is awaited
    /// ([`run_signing`](crate::remote::run_signing)). rustls moves there
    /// and back; only such handshakes (a client guessing a key share the
    /// server does not take) pay for it.
    async fn process_retried_hello(&mut self) -> io::Result<Result<(), rustls::Error>> {
        let Layer::User(mut tls) = std::mem::replace(&mut self.layer, Layer::Gone) else {
            return Err(gone());
        };
        let (tls, processed) = crate::remote::run_signing(move || {
            let processed = tls.process_new_packets().map(|_| ());
            (tls, processed)
        })
        .await
        .map_err(io::Error::other)?;
        self.layer = Layer::User(tls);
        Ok(processed)
    }

    /// Sends what rustls holds, keeping the first bytes in `flight`.
    async fn flush_into(
        &mut self,
        flight: &mut [u8; FIRST_FLIGHT_KEPT],
        have: &mut usize,
    ) -> io::Result<()> {
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone());
            };
            if !tls.wants_write() {
                return Ok(());
            }
            let mut io = FirstFlight {
                sock: &self.sock,
                bytes: flight,
                have,
            };
            match tls.write_tls(&mut io) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.writable().await?,
                Err(e) => return Err(self.write_failed(e)),
            }
        }
    }

    /// A send failed (the peer reset the connection, or the socket
    /// errs): nothing more can leave, close_notify included, so
    /// [`close`](Self::close) will not try. Returns `e` for the caller.
    fn write_failed(&mut self, e: io::Error) -> io::Error {
        if e.kind() != io::ErrorKind::Interrupted {
            self.write_closed = true;
        }
        e
    }

    /// The connection ended in a fatal alert (sent or received): its
    /// session must not resume (RFC 5246 §7.2.2).
    fn failed(&mut self) {
        if let Some(s) = self.session.take() {
            s.forget();
        }
    }

    /// Reads TLS records from the socket into rustls; 0 means TCP EOF.
    async fn read_tls(&mut self) -> io::Result<usize> {
        loop {
            match self.try_read_tls() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.readable().await?,
                other => return other,
            }
        }
    }

    /// [`read_tls`](Self::read_tls) without waiting: `WouldBlock` when
    /// the socket has nothing.
    fn try_read_tls(&mut self) -> io::Result<usize> {
        let Layer::User(tls) = &mut self.layer else {
            return Err(gone());
        };
        let mut io = TrackedRead {
            sock: &self.sock,
            boundary: &mut self.boundary,
            first: None,
        };
        tls.read_tls(&mut io)
    }

    /// Reads decrypted application data. `Ok(0)` is a clean close
    /// (close_notify, which is answered with ours); a TCP close without it
    /// is `UnexpectedEof`.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.read_unanswered(buf).await;
        if matches!(r, Ok(0)) && !buf.is_empty() {
            // RFC 8446 §6.1, RFC 5246 §7.2.1: close_notify is answered.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.close()).await;
        }
        r
    }

    /// [`read`](Self::read) without the answer to close_notify, whose
    /// caller decides when this side closes.
    async fn read_unanswered(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.carried.is_empty() {
            let n = buf.len().min(self.carried.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(..n), self.carried.get(..n)) {
                dst.copy_from_slice(src);
            }
            self.carried.drain(..n);
            return Ok(n);
        }
        if self.peer_closed {
            return Ok(0);
        }
        let r = match self.layer {
            Layer::User(_) => self.read_user(buf).await,
            Layer::Kernel(_) if !buf.is_empty() && buf.len() < MIN_KERNEL_READ => {
                // The kernel hands a control record over in part when the
                // buffer is small and keeps the rest: an alert read one
                // byte at a time would look like a fatal one. Read wide,
                // keep what does not fit.
                let mut wide = [0u8; MIN_KERNEL_READ];
                let r = self.read_kernel(&mut wide).await;
                if let Ok(n) = r {
                    let take = n.min(buf.len());
                    if let (Some(dst), Some(src)) = (buf.get_mut(..take), wide.get(..take)) {
                        dst.copy_from_slice(src);
                    }
                    self.carried
                        .extend_from_slice(wide.get(take..n).unwrap_or_default());
                    Ok(take)
                } else {
                    r
                }
            }
            Layer::Kernel(_) => self.read_kernel(buf).await,
            Layer::Gone => Err(gone()),
        };
        if matches!(r, Ok(0)) && !buf.is_empty() {
            self.peer_closed = true;
        }
        r
    }

    /// One turn of a full-duplex relay (a WebSocket tunnel): reads into
    /// `buf`, when given, or takes bytes of `data` to send, whichever the
    /// peer allows first, so that a peer which stops reading does not stop
    /// what it sends, nor the other way round. Cancel-safe: what it read or
    /// took is in its answer, and a turn dropped while it waits loses
    /// nothing. Records it queued go out in later turns, while they also
    /// wait to read; with `data` empty, `Sent(0)` says the last of them
    /// left. `Read(0)` is the peer's close_notify: a TLS 1.3 peer closes
    /// its side only (RFC 8446 §6.1), so this side may still send until
    /// [`close`](Self::close); a TLS 1.2 one is answered at once (RFC 5246
    /// §7.2.1 asks for that). A TCP close without close_notify is
    /// `UnexpectedEof`. With nothing to read or send it waits for ever:
    /// the caller bounds it.
    pub async fn relay(&mut self, mut buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        if let Some(b) = buf.as_deref_mut() {
            if !self.carried.is_empty() || self.peer_closed {
                return self.read_unanswered(b).await.map(Turn::Read);
            }
        }
        if self.write_closed && !data.is_empty() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let r = match self.layer {
            Layer::User(_) => self.relay_user(buf, data).await,
            Layer::Kernel(_) => self.relay_kernel(buf, data).await,
            Layer::Gone => Err(gone()),
        };
        if matches!(r, Ok(Turn::Read(0))) {
            self.peer_closed = true;
            let half_close = match &self.layer {
                Layer::User(tls) => {
                    tls.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3)
                }
                Layer::Kernel(k) => k.version == TlsVersion::Tls13,
                Layer::Gone => false,
            };
            if !half_close {
                let _ = tokio::time::timeout(Duration::from_secs(1), self.close()).await;
            }
        }
        r
    }

    async fn relay_user(&mut self, mut buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        let mut queued = false;
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone());
            };
            // Queued records out first, as far as the socket takes them now.
            queued |= tls.wants_write();
            while tls.wants_write() {
                match tls.write_tls(&mut SyncIo(&self.sock)) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(self.write_failed(e)),
                }
            }
            if !data.is_empty() {
                // As much as rustls' send buffer takes (`SEND_BUFFER`).
                let n = tls.writer().write(data)?;
                if n > 0 {
                    // Started now; an error shows in the next turn.
                    let _ = tls.write_tls(&mut SyncIo(&self.sock));
                    return Ok(Turn::Sent(n));
                }
            } else if queued && !tls.wants_write() {
                return Ok(Turn::Sent(0));
            }
            if let Some(b) = buf.as_deref_mut() {
                match tls.reader().read(b) {
                    Ok(n) => return Ok(Turn::Read(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            // Readable only when a read is wanted: rustls would otherwise
            // buffer what the peer sends without bound.
            let Some(interest) = relay_interest(buf.is_some(), tls.wants_write()) else {
                return std::future::pending().await;
            };
            let ready = self.sock.ready(interest).await?;
            if ready.is_readable() && buf.is_some() {
                match self.try_read_tls() {
                    // At EOF the reader says how the peer closed.
                    Ok(_) => {
                        self.process_packets()?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }

    async fn relay_kernel(&mut self, mut buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        // One record's worth per write, charged before it is written (as
        // `write_all` does), so a short write overcharges by one piece.
        let piece = data.get(..data.len().min(16 * 1024)).unwrap_or_default();
        loop {
            let Some(interest) = relay_interest(buf.is_some(), !piece.is_empty()) else {
                return std::future::pending().await;
            };
            let ready = self.sock.ready(interest).await?;
            if ready.is_writable() && !piece.is_empty() {
                let Layer::Kernel(k) = &mut self.layer else {
                    return Err(gone());
                };
                if !k.charge(piece.len()) {
                    return self.key_worn_out().await.map(|()| Turn::Sent(0));
                }
                match self.sock.try_write(piece) {
                    Ok(n) => return Ok(Turn::Sent(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(self.write_failed(e)),
                }
            }
            if ready.is_readable() {
                if let Some(b) = buf.as_deref_mut() {
                    // A record the kernel holds in part makes this wait for
                    // the rest; its sender only delays what it gets itself.
                    return self.read_unanswered(b).await.map(Turn::Read);
                }
            }
        }
    }

    /// Like [`read`](Self::read), appending at most `max` bytes to `out`;
    /// in user space only as many bytes as rustls holds decrypted are
    /// zero-filled first, not `max` per read (a 16 KiB memset per request
    /// of a keep-alive connection was 8 % of the server's CPU).
    pub async fn read_append(&mut self, out: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        let want = if self.carried.is_empty() && !self.peer_closed {
            self.wait_plaintext().await?.clamp(1, max.max(1))
        } else {
            max
        };
        let at = out.len();
        out.resize(at + want, 0);
        let r = self.read(out.get_mut(at..).unwrap_or_default()).await;
        out.truncate(at + *r.as_ref().unwrap_or(&0));
        r
    }

    /// Waits until a [`read`](Self::read) would not wait: application
    /// bytes, a close or an error are there. The caller needs no buffer
    /// meanwhile (an idle connection holds none).
    pub async fn readable(&mut self) -> io::Result<()> {
        if !self.carried.is_empty() || self.peer_closed {
            return Ok(());
        }
        match self.layer {
            Layer::User(_) => self.wait_plaintext().await.map(|_| ()),
            Layer::Kernel(_) => self.sock.readable().await,
            Layer::Gone => Err(gone()),
        }
    }

    /// How many decrypted bytes rustls holds, once it holds some; waits
    /// for the client as needed. `usize::MAX` when that is unknown (kernel
    /// layer) or none will come (a close or EOF, which `read` reports).
    async fn wait_plaintext(&mut self) -> io::Result<usize> {
        loop {
            if !matches!(self.layer, Layer::User(_)) {
                return Ok(usize::MAX);
            }
            let state = self.process_packets()?;
            let Layer::User(tls) = &mut self.layer else {
                return Ok(usize::MAX);
            };
            if state.plaintext_bytes_to_read() > 0 {
                return Ok(state.plaintext_bytes_to_read());
            }
            if state.peer_has_closed() {
                return Ok(usize::MAX);
            }
            // Send what is queued (tickets, a KeyUpdate answer) before
            // waiting for the client, as `read` does.
            if tls.wants_write() {
                self.flush().await?;
            }
            if self.read_tls().await? == 0 {
                return Ok(usize::MAX);
            }
        }
    }

    async fn read_user(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone());
            };
            match tls.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            // Nothing decrypted is waiting: send what is queued (session
            // tickets, a KeyUpdate answer) before waiting for the client.
            if tls.wants_write() {
                self.flush().await?;
            }
            self.read_tls().await?;
            self.process_packets()?;
        }
    }

    /// rustls processes the records read. A fatal alert, ours or the
    /// peer's, ends the connection (ours is sent if the socket takes it).
    fn process_packets(&mut self) -> io::Result<rustls::IoState> {
        let Layer::User(tls) = &mut self.layer else {
            return Err(gone());
        };
        match tls.process_new_packets() {
            Ok(state) => Ok(state),
            Err(e) => {
                let _ = tls.write_tls(&mut SyncIo(&self.sock));
                self.write_closed = true;
                self.failed();
                Err(io::Error::new(io::ErrorKind::InvalidData, e))
            }
        }
    }

    /// One read from the kernel's record layer: application data, or a
    /// control record handled here.
    async fn read_kernel(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let sock = &self.sock;
            let got = match sock
                .async_io(Interest::READABLE, || ktls::recv_record(sock.as_fd(), buf))
                .await
            {
                Ok(got) => got,
                Err(e) if ktls::is_bad_record(&e) => {
                    // The kernel could not authenticate a record: answer as
                    // rustls would, with bad_record_mac, and fail. The
                    // kernel's pending EBADMSG would refuse the alert.
                    let _ = ktls::clear_error(self.sock.as_fd());
                    let _ = self.send_alert(alert::FATAL, alert::BAD_RECORD_MAC).await;
                    self.write_closed = true;
                    self.failed();
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                Err(e) => return Err(e),
            };
            let Layer::Kernel(k) = &mut self.layer else {
                return Err(gone());
            };
            let data = buf.get(..got.len).unwrap_or_default();
            match got.content_type {
                content_type::APPLICATION_DATA if got.len == 0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection without close_notify",
                    ));
                }
                content_type::APPLICATION_DATA => return Ok(got.len),
                content_type::ALERT => match data {
                    [_, alert::CLOSE_NOTIFY] => return Ok(0),
                    [alert::WARNING, alert::USER_CANCELED] => continue,
                    _ => {
                        // A fatal alert ends the connection with no answer.
                        self.write_closed = true;
                        self.failed();
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            format!("peer sent alert {data:?}"),
                        ));
                    }
                },
                content_type::HANDSHAKE => {
                    // Linux before 6.14 cannot re-key a TLS 1.3 socket, and
                    // rustls' buffered connection keeps no traffic secret to
                    // derive the next key from: the connection ends cleanly,
                    // under the key the peer still reads with.
                    k.ended_by = Some(match (k.version, data.first()) {
                        (TlsVersion::Tls13, Some(&KEY_UPDATE)) => "key_update",
                        (TlsVersion::Tls13, _) => "post_handshake_message",
                        (TlsVersion::Tls12, _) => "renegotiation",
                    });
                    let why = k.ended_by.unwrap_or_default();
                    let _ = tokio::time::timeout(Duration::from_secs(1), self.close()).await;
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("{why} under kernel TLS: connection closed"),
                    ));
                }
                _ => {
                    let _ = self
                        .send_alert(alert::FATAL, alert::UNEXPECTED_MESSAGE)
                        .await;
                    self.write_closed = true;
                    self.failed();
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected record type {}", got.content_type),
                    ));
                }
            }
        }
    }

    /// Sends an alert through the kernel's record layer.
    async fn send_alert(&mut self, level: u8, description: u8) -> io::Result<()> {
        let sock = &self.sock;
        let payload = [level, description];
        let n = sock
            .async_io(Interest::WRITABLE, || {
                ktls::send_control(sock.as_fd(), content_type::ALERT, &payload)
            })
            .await?;
        if n == payload.len() {
            Ok(())
        } else {
            Err(io::ErrorKind::WriteZero.into())
        }
    }

    /// Encrypts all of `data` into records, sending as rustls' buffer fills.
    /// Call [`flush`](Self::flush) to send what is left.
    ///
    /// Up to `ONE_WRITE` bytes handed over at once are encrypted before
    /// anything is sent: a proxied answer's head with 64 KiB of body then
    /// leaves in one write, not 64 KiB and then its last few hundred
    /// bytes in a write (and a segment) of their own. The caller holds
    /// that much plaintext already; ciphertext beyond it still waits for
    /// the socket (rustls' limit, `SEND_BUFFER`, between calls).
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        match &mut self.layer {
            Layer::User(_) => {}
            Layer::Kernel(k) => {
                if !k.charge(data.len()) {
                    return self.key_worn_out().await;
                }
                return AsyncWriteExt::write_all(&mut self.sock, data).await;
            }
            Layer::Gone => return Err(gone()),
        }
        while !data.is_empty() {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone());
            };
            tls.set_buffer_limit(Some(ONE_WRITE));
            let n = tls.writer().write(data);
            tls.set_buffer_limit(Some(SEND_BUFFER));
            let n = n?;
            data = data.get(n..).unwrap_or_default();
            if n == 0 || !data.is_empty() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// The AEAD's confidentiality limit is near and the kernel cannot be
    /// given a new key: end the connection before another record.
    async fn key_worn_out(&mut self) -> io::Result<()> {
        if let Layer::Kernel(k) = &mut self.layer {
            k.ended_by = Some("record_limit");
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.close()).await;
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "records under one key reached the cipher's confidentiality limit",
        ))
    }

    /// Sends every pending TLS record.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.flush_noting_wait().await.map(|_| ())
    }

    /// Like [`flush`](Self::flush); `Ok(true)` when the socket was full
    /// on the way, so the client reads slower than we send.
    pub async fn flush_noting_wait(&mut self) -> io::Result<bool> {
        self.send_records(false).await
    }

    /// Sends rustls' pending records; `last`: with `MSG_MORE`, for a
    /// `shutdown` that follows at once. `Ok(true)` when the socket was full
    /// on the way.
    async fn send_records(&mut self, last: bool) -> io::Result<bool> {
        let mut waited = false;
        loop {
            let Layer::User(tls) = &mut self.layer else {
                // The kernel sends as it encrypts.
                return Ok(waited);
            };
            if !tls.wants_write() {
                self.unsent_plaintext = 0;
                return Ok(waited);
            }
            let sent = if last {
                tls.write_tls(&mut LastWrite(&self.sock))
            } else {
                tls.write_tls(&mut SyncIo(&self.sock))
            };
            match sent {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    waited = true;
                    self.sock.writable().await?;
                }
                Err(e) => return Err(self.write_failed(e)),
            }
        }
    }

    /// Encrypts as much of `data` as rustls' send buffer takes (64 KiB
    /// when empty) and returns how much, without waiting: the caller's
    /// plaintext need not outlive this call, and [`flush`](Self::flush)
    /// sends the records. User-space TLS only.
    pub fn encrypt(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.layer {
            Layer::User(tls) => tls.writer().write(data),
            Layer::Kernel(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel encrypts this connection's records",
            )),
            Layer::Gone => Err(gone()),
        }
    }

    /// Whether epoll has reported the peer's FIN (or a reset): it will send
    /// nothing more. Without a system call.
    pub fn peer_done_sending(&self) -> bool {
        last_readiness(&self.sock, Interest::READABLE).is_some_and(|r| r.is_read_closed())
    }

    /// Sends close_notify (once) and shuts the write side of the socket.
    pub async fn close(&mut self) -> io::Result<()> {
        if self.write_closed {
            return Ok(());
        }
        self.write_closed = true;
        if peer_unreachable(&self.sock) {
            // The reset is known: a write would only fail.
            return Ok(());
        }
        match &mut self.layer {
            Layer::User(tls) => {
                tls.send_close_notify();
                // The last records wait in the socket for the FIN below,
                // which leaves with them in one segment.
                self.send_records(true).await?;
            }
            Layer::Kernel(_) => self.send_alert(alert::WARNING, alert::CLOSE_NOTIFY).await?,
            Layer::Gone => {}
        }
        self.sock.shutdown().await
    }

    /// After [`close`](Self::close): waits for the client to close too,
    /// reading through rustls at most `budget` bytes of what it still
    /// sends. `true` once its close_notify came, or its FIN, or the
    /// connection failed: a TLS peer sends nothing after its close_notify
    /// (RFC 8446 §6.1), so a lingering close need not wait for the FIN
    /// behind it (a wake-up and a read per connection for clients that
    /// send one, such as curl and wrk). `false` when the client sent
    /// something else, more than `budget` bytes of it, or records rustls
    /// refuses: the caller drains the socket without decrypting. Always
    /// `false` under kernel TLS. Plaintext read here is dropped.
    pub async fn read_peer_close(&mut self, budget: usize) -> bool {
        let mut left = budget;
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return false;
            };
            let Ok(state) = tls.process_new_packets() else {
                return false;
            };
            if state.plaintext_bytes_to_read() > 0 {
                // Dropped in place: no buffer lives in the caller's future.
                let mut reader = tls.reader();
                while let Ok(chunk) = io::BufRead::fill_buf(&mut reader) {
                    let n = chunk.len();
                    if n == 0 {
                        break;
                    }
                    io::BufRead::consume(&mut reader, n);
                }
            }
            if state.peer_has_closed() {
                self.peer_closed = true;
                return true;
            }
            if left == 0 {
                return false;
            }
            match self.read_tls().await {
                Ok(0) | Err(_) => return true,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }

    /// Sends `head` then `len` bytes of `file` from `offset` with
    /// `sendfile(2)`, the head in the body's first record (`MSG_MORE`).
    /// Only under kernel TLS; every wait for the socket is bounded by
    /// `timeout` (`TimedOut`). A file that shrinks is `UnexpectedEof`:
    /// what was sent is the file's true prefix, and the caller must end the
    /// connection. `sent` counts the file bytes the kernel took, also when
    /// the send breaks off.
    pub async fn sendfile(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
        sent: &mut u64,
    ) -> io::Result<()> {
        let Layer::Kernel(k) = &mut self.layer else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "sendfile needs the record layer in the kernel",
            ));
        };
        let total = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .saturating_add(head.len());
        if !k.charge(total) {
            return self.key_worn_out().await;
        }
        let sock = &self.sock;
        let mut rest = head;
        while !rest.is_empty() {
            let n = tokio::time::timeout(
                timeout,
                sock.async_io(Interest::WRITABLE, || ktls::send_more(sock.as_fd(), rest)),
            )
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
            rest = rest.get(n..).unwrap_or_default();
        }
        let mut at = offset;
        let end = offset.saturating_add(len);
        while at < end {
            // Linux moves at most 0x7ffff000 bytes per call.
            let want = usize::try_from(end - at).map_or(0x7fff_f000, |n| n.min(0x7fff_f000));
            let n = tokio::time::timeout(
                timeout,
                sock.async_io(Interest::WRITABLE, || {
                    ktls::sendfile(sock.as_fd(), file, &mut at, want)
                }),
            )
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while being sent",
                ));
            }
            *sent = at - offset;
        }
        Ok(())
    }

    /// Moves the record layer into the kernel for the rest of the
    /// connection: records rustls still holds are sent, the record being
    /// received is read to its end (waiting at most `wait`) so the kernel
    /// starts at a record boundary, decrypted data already here is kept for
    /// [`read`](Self::read), then rustls' secrets and sequence numbers go
    /// to `TLS_TX` and `TLS_RX`. One-way. On
    /// [`OffloadError::Unsupported`] nothing changed; on any other error
    /// the connection is unusable.
    pub async fn offload(
        &mut self,
        support: &Support,
        zerocopy: bool,
        wait: Duration,
    ) -> Result<(), OffloadError> {
        let Layer::User(tls) = &self.layer else {
            return match self.layer {
                Layer::Kernel(_) => Ok(()),
                _ => Err(gone().into()),
            };
        };
        if let Some(why) = &support.unavailable {
            return Err(OffloadError::Unsupported(why.clone()));
        }
        let Some((version, cipher)) =
            kernel_suite(tls.protocol_version(), tls.negotiated_cipher_suite())
        else {
            return Err(OffloadError::Unsupported(format!(
                "{:?}",
                tls.negotiated_cipher_suite().map(|s| s.suite())
            )));
        };
        if !support.offers(version, cipher) {
            return Err(OffloadError::Unsupported(format!(
                "{} {} in both directions",
                version.name(),
                cipher.name()
            )));
        }
        let limit = match tls.negotiated_cipher_suite() {
            Some(rustls::SupportedCipherSuite::Tls13(s)) => s.common.confidentiality_limit,
            Some(rustls::SupportedCipherSuite::Tls12(s)) => s.common.confidentiality_limit,
            None => 0,
        };
        // One deadline for the whole wait: a client that stops reading
        // with an answer queued (to a KeyUpdate, say) cannot hold the
        // switch, and the connection, past it.
        tokio::time::timeout(wait, async {
            self.flush().await?;
            self.read_to_record_end().await?;
            // Answers rustls queued while decrypting.
            self.flush().await
        })
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        let fd = self.sock.as_fd();
        // The ULP first, while rustls still holds the connection: the
        // kernel refuses it on a socket no longer ESTABLISHED (a client
        // that sent its request and half-closed), and then the connection
        // goes on in user space. Without keys the ULP passes data through.
        ktls::attach_ulp(fd)
            .map_err(|e| OffloadError::Unsupported(format!("the tls ULP on this socket: {e}")))?;
        let Layer::User(tls) = std::mem::replace(&mut self.layer, Layer::Gone) else {
            return Err(gone().into());
        };
        let secrets = tls
            .dangerous_extract_secrets()
            .map_err(|e| OffloadError::Secrets(e.to_string()))?;
        let kernel = |step| move |source| OffloadError::Kernel { call: step, source };
        let tx = crypto_info(version, cipher, &secrets.tx)?;
        ktls::install(fd, Direction::Tx, &tx).map_err(kernel("tx"))?;
        let rx = crypto_info(version, cipher, &secrets.rx)?;
        ktls::install(fd, Direction::Rx, &rx).map_err(kernel("rx"))?;
        if version == TlsVersion::Tls13 && support.rx_expect_no_pad {
            // An optimisation the kernel may lack: failure changes nothing.
            let _ = ktls::expect_no_pad(fd);
        }
        if zerocopy && support.tx_zerocopy {
            let _ = ktls::zerocopy_sendfile(fd);
        }
        self.layer = Layer::Kernel(KernelState {
            version,
            tx_records: secrets.tx.0,
            // A margin for the records counted loosely.
            tx_record_limit: limit.saturating_sub(1 << 16),
            ended_by: None,
        });
        Ok(())
    }

    /// Decrypts what rustls holds into `carried` and, if the bytes read
    /// so far end inside a record, reads exactly the rest of that record.
    async fn read_to_record_end(&mut self) -> io::Result<()> {
        // On the heap: an array here would sit in every connection's
        // future (the switch can happen mid-connection), idle or not.
        let mut chunk = vec![0u8; 4096];
        loop {
            let Layer::User(tls) = &mut self.layer else {
                return Err(gone());
            };
            let state = tls.process_new_packets().map_err(|e| {
                let _ = tls.write_tls(&mut SyncIo(&self.sock));
                io::Error::new(io::ErrorKind::InvalidData, e)
            })?;
            let have = state.plaintext_bytes_to_read();
            if have > 0 {
                let at = self.carried.len();
                self.carried.resize(at + have, 0);
                tls.reader()
                    .read_exact(self.carried.get_mut(at..).unwrap_or_default())?;
            }
            if state.peer_has_closed() {
                self.peer_closed = true;
            }
            let need = self.boundary.to_boundary();
            if need == 0 {
                return Ok(());
            }
            let want = need.min(chunk.len());
            let buf = chunk.get_mut(..want).unwrap_or_default();
            let n = match self.sock.try_read(buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.sock.readable().await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let got = buf.get(..n).unwrap_or_default();
            self.boundary.observe(got);
            let mut rest = got;
            while !rest.is_empty() {
                if tls.read_tls(&mut rest)? == 0 {
                    break;
                }
            }
        }
    }

    /// Whether the kernel runs the record layer.
    pub fn is_offloaded(&self) -> bool {
        matches!(self.layer, Layer::Kernel(_))
    }

    /// Why the kernel's record layer had to end the connection (a
    /// KeyUpdate it cannot follow, the record limit), for metrics.
    pub fn ended_by(&self) -> Option<&'static str> {
        match &self.layer {
            Layer::Kernel(k) => k.ended_by,
            _ => None,
        }
    }

    /// The rustls state (negotiated version, suite, group, SNI...), while
    /// rustls runs the record layer.
    pub fn tls(&self) -> Option<&ServerConnection> {
        match &self.layer {
            Layer::User(tls) => Some(tls),
            _ => None,
        }
    }

    /// The TCP socket.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_hello_start_gives_legacy_version_only_from_a_client_hello() {
        let mut h = HelloStart::default();
        // Split anywhere: the bytes are joined.
        h.observe(&[0x16, 3, 1, 0, 200, 1]);
        assert_eq!(h.legacy_version(), None, "not all 11 bytes yet");
        h.observe(&[0, 0, 196, 3, 0, 0xAA, 0xBB]);
        assert_eq!(h.legacy_version(), Some(0x0300));
        let mut other = HelloStart::default();
        other.observe(&[0x17, 3, 3, 0, 200, 1, 0, 0, 196, 3, 0]);
        assert_eq!(other.legacy_version(), None, "not a handshake record");
    }

    #[test]
    fn the_session_id_is_read_from_a_tls12_server_hello() {
        let mut flight = vec![0x16, 3, 3, 0, 80, 2, 0, 0, 76, 3, 3];
        flight.extend([7u8; 32]); // random
        flight.push(32);
        flight.extend(1..=32u8);
        let (id, len) = server_hello_session_id(&flight[..76]).unwrap();
        assert_eq!(len, 32);
        assert_eq!(id.to_vec(), (1..=32u8).collect::<Vec<_>>());
        // An empty ID (a server that caches nothing) and short input.
        let mut empty = flight.clone();
        empty[43] = 0;
        assert!(server_hello_session_id(&empty).is_none());
        assert!(server_hello_session_id(&flight[..50]).is_none());
        assert!(server_hello_session_id(&[0x15, 3, 3, 0, 2, 2, 40]).is_none());
    }

    /// A ServerHello with a 32-byte ID and `exts`, followed in the same
    /// record by the start of a Certificate message.
    fn server_hello(exts: &[u8]) -> Vec<u8> {
        let body = 2 + 32 + 1 + 32 + 3 + 2 + exts.len();
        let mut m = vec![2, 0, 0, u8::try_from(body).unwrap(), 3, 3];
        m.extend([7u8; 32]);
        m.push(32);
        m.extend(1..=32u8);
        m.extend([0xc0, 0x2b, 0]);
        m.extend(u16::try_from(exts.len()).unwrap().to_be_bytes());
        m.extend(exts);
        // The next message: a Certificate whose bytes hold 0x00 0x23.
        m.extend([11, 0, 0, 8, 0, 0x23, 0, 0, 0, 0x23, 0, 0]);
        let mut r = vec![0x16, 3, 3];
        r.extend(u16::try_from(m.len()).unwrap().to_be_bytes());
        r.extend(m);
        r
    }

    #[test]
    fn a_ticket_is_told_from_the_server_hellos_extensions_only() {
        // renegotiation_info, extended_master_secret, session_ticket.
        let with = [0xff, 0x01, 0, 1, 0, 0, 0x17, 0, 0, 0, 0x23, 0, 0];
        assert!(server_hello_sends_ticket(&server_hello(&with)));
        let without = [0xff, 0x01, 0, 1, 0, 0, 0x17, 0, 0];
        assert!(!server_hello_sends_ticket(&server_hello(&without)));
        // An extension whose data holds 0x00 0x23 is not the extension.
        let inside = [0x00, 0x10, 0, 4, 0, 0x23, 0, 0x23];
        assert!(!server_hello_sends_ticket(&server_hello(&inside)));
        assert!(!server_hello_sends_ticket(&server_hello(&[])));
        // Cut short, or not a ServerHello: no.
        let full = server_hello(&with);
        assert!(!server_hello_sends_ticket(&full[..full.len() - 20]));
        assert!(!server_hello_sends_ticket(&[0x15, 3, 3, 0, 2, 2, 40]));
        // An extension length running past the hello stops the walk.
        let long = [0x00, 0x10, 0xff, 0xff, 0, 0x23, 0, 0];
        assert!(!server_hello_sends_ticket(&server_hello(&long)));
    }
}
