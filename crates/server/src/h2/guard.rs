//! The byte stream under an HTTP/2 connection, watched for the floods the
//! `h2` crate does not bound by itself (RFC 9113 §10.5): it reads the frame
//! headers of what the client sends as they pass (nothing is parsed twice:
//! 9 bytes per frame) and charges frames that cost the server work without
//! serving anything to per-connection token buckets. Client resets
//! (CVE-2023-44487 rapid reset) have their own bucket; PING, SETTINGS,
//! PRIORITY, WINDOW_UPDATE, empty DATA and unknown frames share one, which
//! bytes sent to the client refill as well (a client reading a large body
//! sends WINDOW_UPDATEs in proportion). A header block of too many frames
//! (CONTINUATION floods, CVE-2024-27316) trips it too. Once tripped the
//! stream reads nothing more and the connection loop answers with GOAWAY
//! ENHANCE_YOUR_CALM. It also notes since when writes wait for a client
//! that does not read, for the connection's send timeout, and counts the
//! RST_STREAM and GOAWAY frames the server sends by error code (`h2`
//! resets streams by itself and does not say so).

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Instant;

use tlsgate_config::Http2;
use tlsgate_metrics::Metrics;
use tlsgate_tls::TlsConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::frames::{ClientFrames, SentFrames};

/// Sent bytes that earn one control frame.
const BYTES_PER_CONTROL_FRAME: usize = 1024;

/// What the connection loop learns from the stream.
#[derive(Default)]
pub(super) struct Alarm {
    /// Why the client was cut off, once it was.
    tripped: Mutex<Option<&'static str>>,
    /// Wakes the connection loop when `tripped` is set.
    pub notify: Notify,
    /// Wakes the connection loop when a write starts to wait for the
    /// client, so that its stall check runs even with no stream open
    /// (every response handed to h2, the client reading none of them).
    pub blocked: Notify,
    /// Since when a write has been waiting for the client to read, and
    /// the bytes it has taken since then.
    blocked_since: Mutex<Option<(Instant, usize)>>,
}

/// What a blocked client must take for its wait to start again: reading a
/// few bytes just before each send timeout keeps no connection open.
const MIN_PROGRESS: usize = 16 * 1024;

impl Alarm {
    /// The reason the guard tripped, if it did.
    pub fn tripped(&self) -> Option<&'static str> {
        *self.tripped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Since when the client has not taken what is written to it.
    pub fn blocked_since(&self) -> Option<Instant> {
        self.blocked_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|(t, _)| t)
    }

    fn trip(&self, reason: &'static str) {
        let mut t = self.tripped.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none() {
            *t = Some(reason);
            self.notify.notify_one();
        }
    }

    fn set_blocked(&self, blocked: bool) {
        let mut b = self.blocked_since.lock().unwrap_or_else(|e| e.into_inner());
        match (blocked, b.is_some()) {
            (true, false) => {
                *b = Some((Instant::now(), 0));
                self.blocked.notify_one();
            }
            (false, true) => *b = None,
            _ => {}
        }
    }

    /// `n` more bytes taken: a blocked writer is free again once
    /// [`MIN_PROGRESS`] went since it blocked.
    fn progressed(&self, n: usize) {
        let mut b = self.blocked_since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, taken)) = b.as_mut() {
            *taken += n;
            if *taken >= MIN_PROGRESS {
                *b = None;
            }
        }
    }
}

/// The TLS connection under h2, shared between h2's I/O ([`GuardedIo`])
/// and the connection loop, which sends the records ([`poll_send_records`]).
pub(super) type SharedConn<'c> = Mutex<&'c mut TlsConnection>;

fn lock<'g, 'c>(conn: &'g SharedConn<'c>) -> std::sync::MutexGuard<'g, &'c mut TlsConnection> {
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends the records h2's writes left in rustls' buffer. Pending, with no
/// wake-up, when there are none: the connection loop polls this last in
/// every turn, after everything that could have written.
pub(super) fn poll_send_records(
    conn: &SharedConn<'_>,
    alarm: &Alarm,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    let mut conn = lock(conn);
    if !conn.has_pending_records() {
        return Poll::Pending;
    }
    let r = Pin::new(&mut **conn).poll_flush(cx);
    alarm.set_blocked(r.is_pending());
    r
}

/// Leaves the sending of what h2 wrote to the connection loop's turns
/// ([`poll_send_records`]), not to reads that wait.
pub(super) fn send_at_turn_end(conn: &SharedConn<'_>) {
    lock(conn).send_before_waiting(false);
}

/// Sends every record still waiting, for the end of the connection.
pub(super) fn poll_flush(conn: &SharedConn<'_>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    Pin::new(&mut **lock(conn)).poll_flush(cx)
}

/// The TLS connection as h2's I/O, with the frame accounting.
///
/// Flushes are deferred: h2 flushes after every DATA frame it does not
/// copy (over 256 bytes), which would be one `writev` per response of a
/// small file. The records wait in rustls' buffer until the connection
/// loop's turn ends ([`poll_send_records`]), or until the buffer is full
/// (64 KiB), when a write sends them and waits for the client as needed.
pub(super) struct GuardedIo<'a, 'c> {
    conn: &'a SharedConn<'c>,
    frames: ClientFrames,
    sent_frames: SentFrames,
    alarm: &'a Alarm,
    metrics: &'a Metrics,
    /// Sent bytes not yet turned into control-frame credit.
    sent: usize,
}

impl<'a, 'c> GuardedIo<'a, 'c> {
    pub fn new(
        conn: &'a SharedConn<'c>,
        limits: &Http2,
        alarm: &'a Alarm,
        metrics: &'a Metrics,
    ) -> Self {
        Self {
            conn,
            frames: ClientFrames::new(limits, Instant::now()),
            sent_frames: SentFrames::default(),
            alarm,
            metrics,
            sent: 0,
        }
    }

    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) => {
                let metrics = self.metrics;
                let mut ended = |frame, code| metrics.count_h2_error_sent(frame, code);
                let mut left = *n;
                for buf in bufs {
                    if left == 0 {
                        break;
                    }
                    let take = left.min(buf.len());
                    self.sent_frames
                        .observe(buf.get(..take).unwrap_or_default(), &mut ended);
                    left -= take;
                }
                self.alarm.progressed(*n);
                self.sent += n;
                if self.sent >= BYTES_PER_CONTROL_FRAME {
                    self.frames
                        .credit_control(self.sent / BYTES_PER_CONTROL_FRAME);
                    self.sent %= BYTES_PER_CONTROL_FRAME;
                }
            }
            Poll::Pending => self.alarm.set_blocked(true),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl AsyncRead for GuardedIo<'_, '_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.alarm.tripped().is_some() {
            // Nothing more is read from a client that was cut off; the
            // connection loop sends GOAWAY and closes.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut **lock(this.conn)).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let got = buf.filled().get(before..).unwrap_or_default();
            if let Err(reason) = this.frames.observe(got, Instant::now()) {
                // h2 never sees the read that passed a limit; the alarm
                // wakes the connection loop, which ends the connection.
                buf.set_filled(before);
                this.alarm.trip(reason);
                return Poll::Pending;
            }
        }
        r
    }
}

impl AsyncWrite for GuardedIo<'_, '_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut **lock(this.conn)).poll_write_vectored(cx, bufs);
        this.wrote(bufs, &r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        lock(self.conn).is_write_vectored()
    }

    /// Deferred to the end of the connection loop's turn (see above).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **lock(self.get_mut().conn)).poll_shutdown(cx)
    }
}
