//! What the HTTP layer needs from a connection, so that it runs unchanged
//! over user-space TLS, plain TCP (admin, upstreams later) and kernel TLS,
//! where [`Transport::send_file`] becomes `sendfile(2)`; and [`TlsClient`],
//! a client's TLS connection with its listener's offload policy.

use std::cell::RefCell;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tlsgate_config::{Offload, OffloadPolicy};
use tlsgate_metrics::{DirectionLabel, Metrics, ReasonLabel};
use tlsgate_sys::ktls::Support;
use tlsgate_tls::{relay_interest, TlsConnection, Turn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A byte stream to a client.
pub trait Transport {
    /// Reads application bytes; 0 is end of stream.
    fn read(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Reads at most `max` application bytes onto the end of `buf`; 0 is
    /// end of stream.
    fn read_append(
        &mut self,
        buf: &mut Vec<u8>,
        max: usize,
    ) -> impl Future<Output = io::Result<usize>> + Send
    where
        Self: Send,
    {
        async move {
            let start = buf.len();
            buf.resize(start + max, 0);
            let r = self.read(buf.get_mut(start..).unwrap_or_default()).await;
            buf.truncate(start + *r.as_ref().unwrap_or(&0));
            r
        }
    }
    /// Waits until a read would not wait (bytes, end of stream or an
    /// error are there), without a buffer; by default a read waits itself.
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        async { Ok(()) }
    }
    /// Queues or writes all of `data`.
    fn write_all(&mut self, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends everything queued.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// One turn of a full-duplex relay: reads into `buf` (when given) or
    /// takes bytes of `data`, whichever the peer allows first; cancel-safe
    /// ([`TlsConnection::relay`] says how).
    fn relay(
        &mut self,
        buf: Option<&mut [u8]>,
        data: &[u8],
    ) -> impl Future<Output = io::Result<Turn>> + Send;
    /// Ends the stream cleanly (close_notify for TLS) and shuts the write side.
    fn close(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Reads and discards what the client still sends, for at most `limit`,
    /// so a close after an error response is not turned into a reset that
    /// destroys the response in the client's receive buffer.
    fn linger(&mut self, limit: Duration) -> impl Future<Output = ()> + Send;

    /// Sends `head` (the response head, after any queued responses) and
    /// then `len` bytes of `file` from `offset`, the head in the same write
    /// as the body's first bytes; each write bounded by `timeout`. The
    /// default reads through a buffer of its own; user-space TLS encrypts
    /// from the worker's buffer, kernel TLS uses `sendfile`. `sent` counts
    /// the body bytes that left, also when the send breaks off (for the
    /// access log).
    fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
        sent: &mut u64,
    ) -> impl Future<Output = io::Result<()>> + Send
    where
        Self: Send,
    {
        async move { send_file_through(self, head, file, offset, len, timeout, sent).await }
    }

    /// Whether a response body of `len` bytes should first move the
    /// connection's record layer into the kernel (`offload = "auto"`).
    fn wants_offload(&self, _len: u64) -> bool {
        false
    }

    /// Moves the record layer into the kernel; output queued in the HTTP
    /// layer must have been sent. `Err`: the connection is over.
    fn offload(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        async { Ok(()) }
    }

    /// Whether responses now leave through kernel TLS.
    fn offloaded(&self) -> bool {
        false
    }
}

/// [`Transport::send_file`] through the transport's own writes.
async fn send_file_through<T: Transport + ?Sized>(
    io: &mut T,
    head: &[u8],
    file: &File,
    offset: u64,
    len: u64,
    timeout: Duration,
    sent: &mut u64,
) -> io::Result<()> {
    const CHUNK: usize = 64 * 1024;
    let mut scratch = Vec::with_capacity(CHUNK);
    scratch.extend_from_slice(head);
    let mut done = 0u64;
    while done < len {
        let at = scratch.len();
        let room = CHUNK.saturating_sub(at).max(16 * 1024);
        let want = usize::try_from(len - done).map_or(room, |r| r.min(room));
        scratch.resize(at + want, 0);
        let buf = scratch.get_mut(at..).ok_or(io::ErrorKind::InvalidInput)?;
        // Page-cache reads are short; like nginx without aio, the
        // worker reads in line rather than paying a thread hop.
        let n = file.read_at(buf, offset + done)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while being sent",
            ));
        }
        scratch.truncate(at + n);
        tokio::time::timeout(timeout, io.write_all(&scratch))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        scratch.clear();
        done += n as u64;
        *sent = done;
    }
    Ok(())
}

/// Most plaintext encrypted per turn of [`send_file_encrypting`]: what
/// rustls' send buffer takes at once.
const FILE_TURN: usize = 64 * 1024;
/// The first turn, and every turn after the socket was found full: one
/// TLS record, so a connection waiting for a slow client holds at most
/// that. Turns double while the socket takes each one whole.
const SLOW_CLIENT_TURN: usize = 16 * 1024;

thread_local! {
    /// The worker thread's one buffer for user-space file bodies. A
    /// chunk is read into it and encrypted into rustls with no wait in
    /// between, so no connection holds a plaintext chunk while its client
    /// is slow (64 KiB each with thousands of clients), and no chunk is
    /// zero-filled before its read.
    static FILE_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// [`Transport::send_file`] under user-space TLS: `head`, then `len`
/// bytes of `file` from `offset`, read and encrypted a turn at a time
/// through [`FILE_BUFFER`]; each turn's send is bounded by `timeout`.
async fn send_file_encrypting(
    conn: &mut TlsConnection,
    mut head: &[u8],
    file: &File,
    offset: u64,
    len: u64,
    timeout: Duration,
    sent: &mut u64,
) -> io::Result<()> {
    let mut done = 0u64;
    let mut turn = SLOW_CLIENT_TURN;
    while done < len || !head.is_empty() {
        let (head_taken, body_taken) = FILE_BUFFER.with(|cell| {
            let mut buf = cell
                .try_borrow_mut()
                .map_err(|_| io::Error::other("the worker's file buffer is in use"))?;
            let body_room = turn.saturating_sub(head.len()).max(SLOW_CLIENT_TURN);
            let body_want = usize::try_from(len - done).map_or(body_room, |r| r.min(body_room));
            let total = head.len() + body_want;
            if buf.len() < total {
                buf.resize(total, 0);
            }
            let (head_part, body_part) = buf.split_at_mut(head.len());
            head_part.copy_from_slice(head);
            let body = body_part.get_mut(..body_want).unwrap_or_default();
            // Page-cache reads are short; like nginx without aio, the
            // worker reads in line rather than paying a thread hop.
            let n = if body.is_empty() {
                0
            } else {
                file.read_at(body, offset + done)?
            };
            if n == 0 && body_want > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while being sent",
                ));
            }
            let filled = buf.get(..head.len() + n).unwrap_or_default();
            // Bytes rustls does not take now are read again next turn.
            let taken = conn.encrypt(filled)?;
            let head_taken = taken.min(head.len());
            Ok::<_, io::Error>((head_taken, (taken - head_taken) as u64))
        })?;
        head = head.get(head_taken..).unwrap_or_default();
        done += body_taken;
        let waited = tokio::time::timeout(timeout, conn.flush_noting_wait())
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        // Counted once on the socket, not when encrypted.
        *sent = done;
        turn = if waited {
            SLOW_CLIENT_TURN
        } else {
            (turn * 2).min(FILE_TURN)
        };
    }
    Ok(())
}

/// A client's TLS connection with its listener's kernel-TLS policy.
pub(crate) struct TlsClient<'a> {
    /// The connection.
    pub conn: TlsConnection,
    offload: Offload,
    /// What the kernel offers; `None` when kTLS is off for this connection.
    support: Option<&'a Support>,
    metrics: &'a Metrics,
    /// How long a switch may wait for the end of a record being received.
    wait: Duration,
}

impl<'a> TlsClient<'a> {
    /// `support` as probed at start; kTLS is used only where it has no
    /// `unavailable` reason and the policy is not `never`.
    pub fn new(
        conn: TlsConnection,
        offload: Offload,
        support: &'a Support,
        metrics: &'a Metrics,
        wait: Duration,
    ) -> Self {
        let usable = support.unavailable.is_none() && offload.policy != OffloadPolicy::Never;
        Self {
            conn,
            offload,
            support: usable.then_some(support),
            metrics,
            wait,
        }
    }

    /// Whether the policy moves the connection right after the handshake.
    pub fn offloads_at_once(&self) -> bool {
        self.support.is_some() && self.offload.policy == OffloadPolicy::Always
    }

    /// Moves the record layer into the kernel, counting the outcome. A
    /// refusal leaves the connection in user space, for good.
    pub async fn offload_now(&mut self, switch: bool) -> io::Result<()> {
        let Some(support) = self.support else {
            return Ok(());
        };
        if self.conn.is_offloaded() {
            return Ok(());
        }
        let m = self.metrics;
        match self
            .conn
            .offload(support, self.offload.zerocopy, self.wait)
            .await
        {
            Ok(()) => {
                for direction in ["tx", "rx"] {
                    m.ktls_offloaded
                        .get_or_create(&DirectionLabel { direction })
                        .inc();
                }
                if switch {
                    m.ktls_switches.inc();
                }
                Ok(())
            }
            Err(e) => {
                m.ktls_failures
                    .get_or_create(&ReasonLabel { reason: e.reason() })
                    .inc();
                self.support = None;
                if e.connection_survives() {
                    tracing::debug!("staying in user-space TLS: {e}");
                    Ok(())
                } else {
                    tracing::debug!("switch to kernel TLS failed: {e}");
                    Err(io::Error::other(e))
                }
            }
        }
    }
}

impl Transport for TlsClient<'_> {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.conn.read(buf).await
    }
    async fn readable(&mut self) -> io::Result<()> {
        self.conn.readable().await
    }
    async fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        self.conn.read_append(buf, max).await
    }
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.conn.write_all(data).await
    }
    async fn flush(&mut self) -> io::Result<()> {
        self.conn.flush().await
    }
    async fn relay(&mut self, buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        self.conn.relay(buf, data).await
    }
    async fn close(&mut self) -> io::Result<()> {
        self.conn.close().await
    }
    async fn linger(&mut self, limit: Duration) {
        linger_tls(&mut self.conn, limit).await;
    }
    fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
        sent: &mut u64,
    ) -> impl Future<Output = io::Result<()>> + Send {
        // Only the fields go into the future: holding `&mut Self` there
        // trips rustc's higher-ranked `Send` check on the lifetime.
        let conn = &mut self.conn;
        let metrics = self.metrics;
        async move {
            let path = if conn.is_offloaded() {
                "sendfile"
            } else {
                "userspace"
            };
            let r = Transport::send_file(conn, head, file, offset, len, timeout, sent).await;
            if r.is_ok() {
                metrics.count_body(path, len);
            }
            r
        }
    }
    fn wants_offload(&self, len: u64) -> bool {
        self.support.is_some()
            && self.offload.policy == OffloadPolicy::Auto
            && len >= self.offload.threshold
            && !self.conn.is_offloaded()
    }
    async fn offload(&mut self) -> io::Result<()> {
        self.offload_now(true).await
    }
    fn offloaded(&self) -> bool {
        self.conn.is_offloaded()
    }
}

/// A TLS connection by itself, with no offload policy.
impl Transport for TlsConnection {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TlsConnection::read(self, buf).await
    }
    async fn send_file(
        &mut self,
        head: &[u8],
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
        sent: &mut u64,
    ) -> io::Result<()> {
        if self.is_offloaded() {
            self.sendfile(head, file, offset, len, timeout, sent).await
        } else {
            send_file_encrypting(self, head, file, offset, len, timeout, sent).await
        }
    }
    async fn readable(&mut self) -> io::Result<()> {
        TlsConnection::readable(self).await
    }
    async fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        TlsConnection::read_append(self, buf, max).await
    }
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        TlsConnection::write_all(self, data).await
    }
    async fn flush(&mut self) -> io::Result<()> {
        TlsConnection::flush(self).await
    }
    async fn relay(&mut self, buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        TlsConnection::relay(self, buf, data).await
    }
    async fn close(&mut self) -> io::Result<()> {
        TlsConnection::close(self).await
    }
    async fn linger(&mut self, limit: Duration) {
        linger_tls(self, limit).await;
    }
}

impl Transport for TcpStream {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        AsyncReadExt::read(self, buf).await
    }
    async fn readable(&mut self) -> io::Result<()> {
        TcpStream::readable(self).await
    }
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        AsyncWriteExt::write_all(self, data).await
    }
    async fn flush(&mut self) -> io::Result<()> {
        AsyncWriteExt::flush(self).await
    }
    async fn relay(&mut self, mut buf: Option<&mut [u8]>, data: &[u8]) -> io::Result<Turn> {
        loop {
            let Some(interest) = relay_interest(buf.is_some(), !data.is_empty()) else {
                return std::future::pending().await;
            };
            let ready = self.ready(interest).await?;
            if ready.is_writable() && !data.is_empty() {
                match self.try_write(data) {
                    Ok(n) => return Ok(Turn::Sent(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if let Some(b) = buf.as_deref_mut().filter(|_| ready.is_readable()) {
                match self.try_read(b) {
                    Ok(n) => return Ok(Turn::Read(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    async fn close(&mut self) -> io::Result<()> {
        AsyncWriteExt::shutdown(self).await
    }
    async fn linger(&mut self, limit: Duration) {
        linger_socket(self, limit).await;
    }
}

/// What a lingering TLS connection reads through rustls, looking for the
/// client's close_notify, before it drains the rest undecrypted: a record
/// and a little more (a client uploading is not decrypted for 2 s).
const PEER_CLOSE_BUDGET: usize = 16 * 1024 + 512;

/// [`linger_socket`] for a TLS connection whose close_notify went out:
/// the client's close_notify ends it at once (see
/// `TlsConnection::read_peer_close`).
async fn linger_tls(conn: &mut TlsConnection, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let read = tokio::time::timeout_at(deadline, conn.read_peer_close(PEER_CLOSE_BUDGET)).await;
    if let Ok(false) = read {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        linger_socket(conn.socket(), left).await;
    }
}

/// Discards incoming bytes until EOF or `limit`, so that what the client
/// still sends does not meet a reset that destroys the response it has not
/// read yet. Time is the only bound: a client uploading at full speed sends
/// far more than any byte cap in the moment it takes to see the answer
/// (a 1 MiB cap lost a 413 to a 64 MiB upload on a loaded machine).
pub(crate) async fn linger_socket(sock: &TcpStream, limit: Duration) {
    // On the heap: an array here would sit in every connection's future.
    // 4 KiB: a small size class; a larger, zero-filled one faulted in fresh
    // pages per closed connection (tests/serve.rs counts them).
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(limit, async {
        loop {
            if sock.readable().await.is_err() {
                return;
            }
            // A short read (the close_notify) waits for the FIN through
            // epoll, not through a read that fails with EAGAIN.
            match tlsgate_sys::read_draining(sock, &mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}
