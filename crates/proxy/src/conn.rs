//! A connection to one upstream server, plain or TLS, with the bytes read
//! past the last response, and the gauge of open connections it keeps right.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tlsgate_metrics::types::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The byte stream.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// How many times a server was taken out of service (a passive mark or a
/// failing health check), shared by its pool and every connection to it.
/// A connection opened before the latest outage is suspect: wherever it
/// waits (any worker's idle list, any client's private list), it is let
/// go instead of reused.
#[derive(Clone, Default)]
pub(crate) struct Outages(Arc<AtomicU64>);

impl Outages {
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn record(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// An open connection to server `server` of a pool.
pub(crate) struct UpstreamConn {
    pub stream: Stream,
    /// Index of the server in its pool.
    pub server: usize,
    /// Whether it came from the idle pool (a stale one may fail at once).
    pub reused: bool,
    /// When it was put into the idle pool.
    pub idle_since: Instant,
    /// The address it was opened to (a server's name may since resolve
    /// to another).
    pub addr: SocketAddr,
    /// It began with a client's PROXY protocol header: that client's only.
    pub private: bool,
    open: Gauge,
    /// Its place under the server's `max_conns`, given back when it
    /// closes (none for a health check's).
    pub slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its server's outages, and their count when it was opened.
    outages: Outages,
    opened_after: u64,
}

impl UpstreamConn {
    pub fn new(
        stream: Stream,
        (server, addr): (usize, SocketAddr),
        open: Gauge,
        outages: Outages,
    ) -> Self {
        open.inc();
        Self {
            stream,
            server,
            reused: false,
            idle_since: Instant::now(),
            addr,
            private: false,
            open,
            slot: None,
            opened_after: outages.count(),
            outages,
        }
    }

    /// Whether its server was taken out of service since it was opened.
    pub fn predates_an_outage(&self) -> bool {
        self.outages.count() != self.opened_after
    }

    /// Whether an idle connection still looks usable: the server has
    /// neither closed it nor sent anything unasked (either one is a
    /// framing doubt). Does not block.
    pub fn looks_alive(&self) -> bool {
        let mut probe = [0u8; 1];
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut buf = ReadBuf::new(&mut probe);
        matches!(
            self.stream.tcp().poll_peek(&mut cx, &mut buf),
            Poll::Pending
        )
    }
}

impl Drop for UpstreamConn {
    fn drop(&mut self) {
        self.open.dec();
    }
}
