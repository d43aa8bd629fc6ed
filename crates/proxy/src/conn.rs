//! A connection to one upstream server, plain or TLS, with the bytes read
//! past the last response, and the gauge of open connections it keeps right.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
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
}

impl UpstreamConn {
    pub fn new(stream: Stream, server: usize, addr: SocketAddr, open: Gauge) -> Self {
        open.inc();
        Self {
            stream,
            server,
            reused: false,
            idle_since: Instant::now(),
            addr,
            private: false,
            open,
        }
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
