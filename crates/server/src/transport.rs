//! What the HTTP layer needs from a connection, so that it runs unchanged
//! over user-space TLS, plain TCP (admin, upstreams later) and, later,
//! kernel TLS where [`Transport::send_file`] becomes `sendfile(2)`.

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tlsgate_tls::TlsConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A byte stream to a client.
pub trait Transport {
    /// Reads application bytes; 0 is end of stream.
    fn read(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Queues or writes all of `data`.
    fn write_all(&mut self, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends everything queued.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Ends the stream cleanly (close_notify for TLS) and shuts the write side.
    fn close(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Reads and discards what the client still sends, for at most `limit`,
    /// so a close after an error response is not turned into a reset that
    /// destroys the response in the client's receive buffer.
    fn linger(&mut self, limit: Duration) -> impl Future<Output = ()> + Send;

    /// Sends `len` bytes of `file` from `offset`, each write bounded by
    /// `timeout`. The default reads through `scratch`; kernel TLS will
    /// override this with `sendfile`.
    fn send_file(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = io::Result<()>> + Send
    where
        Self: Send,
    {
        async move {
            const CHUNK: usize = 64 * 1024;
            scratch.resize(CHUNK, 0);
            let mut done = 0u64;
            while done < len {
                let want = usize::try_from(len - done).map_or(CHUNK, |r| r.min(CHUNK));
                let buf = scratch.get_mut(..want).ok_or(io::ErrorKind::InvalidInput)?;
                // Page-cache reads are short; like nginx without aio, the
                // worker reads in line rather than paying a thread hop.
                let n = file.read_at(buf, offset + done)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file shrank while being sent",
                    ));
                }
                let chunk = buf.get(..n).ok_or(io::ErrorKind::InvalidInput)?;
                tokio::time::timeout(timeout, self.write_all(chunk))
                    .await
                    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
                done += n as u64;
            }
            Ok(())
        }
    }
}

impl Transport for TlsConnection {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TlsConnection::read(self, buf).await
    }
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        TlsConnection::write_all(self, data).await
    }
    async fn flush(&mut self) -> io::Result<()> {
        TlsConnection::flush(self).await
    }
    async fn close(&mut self) -> io::Result<()> {
        TlsConnection::close(self).await
    }
    async fn linger(&mut self, limit: Duration) {
        linger_socket(self.socket(), limit).await;
    }
}

impl Transport for TcpStream {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        AsyncReadExt::read(self, buf).await
    }
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        AsyncWriteExt::write_all(self, data).await
    }
    async fn flush(&mut self) -> io::Result<()> {
        AsyncWriteExt::flush(self).await
    }
    async fn close(&mut self) -> io::Result<()> {
        AsyncWriteExt::shutdown(self).await
    }
    async fn linger(&mut self, limit: Duration) {
        linger_socket(self, limit).await;
    }
}

/// Discards incoming bytes until EOF, `limit`, or 1 MiB.
async fn linger_socket(sock: &TcpStream, limit: Duration) {
    let mut sink = [0u8; 4096];
    let mut left = 1usize << 20;
    let _ = tokio::time::timeout(limit, async {
        while left > 0 {
            if sock.readable().await.is_err() {
                return;
            }
            match sock.try_read(&mut sink) {
                Ok(0) => return,
                Ok(n) => left = left.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}
