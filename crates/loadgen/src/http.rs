//! Just enough HTTP/1.1 to read a response whose length is known:
//! status line, headers, a Content-Length body. Anything else is an error
//! the report counts (the targets serve static files).

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt};

use crate::engine::Clock;

/// Upper bound on a response head; more is a protocol error.
const MAX_HEAD: usize = 16 * 1024;

/// Why an operation failed; the kind is the report's error key.
#[derive(Debug)]
pub(crate) struct OpError {
    pub kind: &'static str,
    pub message: String,
}

impl OpError {
    pub fn new(kind: &'static str, message: impl ToString) -> Self {
        Self {
            kind,
            message: message.to_string(),
        }
    }
}

/// A GET request for `path`, keep-alive or not.
pub(crate) fn get_request(path: &str, host: &str, close: bool) -> Vec<u8> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tlsgate-bench\r\n{connection}\r\n")
        .into_bytes()
}

/// A response head, read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    pub status: u16,
    /// Bytes of the head itself.
    pub head_len: u64,
    pub content_length: u64,
    /// Body bytes that arrived with the head.
    pub have: u64,
}

impl Head {
    /// Body bytes still to come.
    pub fn body_left(&self) -> u64 {
        self.content_length - self.have
    }
}

/// Reads one 200 response into `buf` (reused) and returns its body length,
/// counting received bytes that arrive inside the window into `bytes`.
pub(crate) async fn read_response<S: AsyncBufRead + AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut [u8],
    clock: &Clock,
    bytes: &mut u64,
) -> Result<u64, OpError> {
    let head = read_head(s, buf, clock, bytes).await?;
    read_body(s, &head, clock, bytes).await?;
    Ok(head.content_length)
}

/// Reads a response head (and whatever body bytes come with it): a
/// non-200 status is an error only once the body is read, so that the
/// connection stays usable. Reads no further than a head may reach, so
/// that the body's bytes past it stay where [`read_body`] counts them.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut [u8],
    clock: &Clock,
    bytes: &mut u64,
) -> Result<Head, OpError> {
    let limit = buf.len().min(MAX_HEAD);
    let mut filled = 0;
    loop {
        if filled == limit {
            return Err(OpError::new("protocol", "response head too large"));
        }
        let n = s
            .read(&mut buf[filled..limit])
            .await
            .map_err(|e| OpError::new("read", e))?;
        if n == 0 {
            return Err(OpError::new("read", "connection closed before a response"));
        }
        count(clock, bytes, n);
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf[..filled]) {
            Ok(httparse::Status::Partial) => continue,
            Ok(httparse::Status::Complete(head_len)) => {
                let status = response.code.unwrap_or(0);
                let content_length = response
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| OpError::new("protocol", "response without Content-Length"))?;
                let have = (filled - head_len) as u64;
                if have > content_length {
                    return Err(OpError::new("protocol", "bytes after the response body"));
                }
                return Ok(Head {
                    status,
                    head_len: head_len as u64,
                    content_length,
                    have,
                });
            }
            Err(e) => return Err(OpError::new("protocol", e)),
        }
    }
}

/// Reads the rest of the body `head` announced, counting it where it
/// lies: the plaintext is not copied out (a 64 KiB response copied into
/// a buffer only to be dropped cost the generator's core a copy per byte).
pub(crate) async fn read_body<S: AsyncBufRead + Unpin>(
    s: &mut S,
    head: &Head,
    clock: &Clock,
    bytes: &mut u64,
) -> Result<(), OpError> {
    let mut left = head.body_left();
    while left > 0 {
        let have = s.fill_buf().await.map_err(|e| OpError::new("read", e))?;
        if have.is_empty() {
            return Err(OpError::new("read", "connection closed inside the body"));
        }
        let n = have.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        s.consume(n);
        count(clock, bytes, n);
        left -= n as u64;
    }
    ok_status(head)
}

/// A response other than 200 is an error the report counts.
pub(crate) fn ok_status(head: &Head) -> Result<(), OpError> {
    if head.status != 200 {
        return Err(OpError::new("status", format!("HTTP {}", head.status)));
    }
    Ok(())
}

/// After a `Connection: close` response, waits (briefly) for the server to
/// close first, so TIME_WAIT stays on the server and client ports recycle.
pub(crate) async fn await_close<S: AsyncRead + Unpin>(s: &mut S, buf: &mut [u8]) {
    let limit = Instant::now() + Duration::from_secs(1);
    let _ = tokio::time::timeout_at(limit.into(), async {
        // Errors (e.g. no close_notify) end the wait as well as EOF does.
        while let Ok(n) = s.read(buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

pub(crate) fn count(clock: &Clock, bytes: &mut u64, n: usize) {
    if clock.in_window(Instant::now()) {
        *bytes += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Clock {
        let now = Instant::now();
        Clock {
            open: now,
            close: now + Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn reads_a_response_in_small_pieces() {
        let (client, server) = tokio::io::duplex(7);
        // Small pieces: the body arrives across many buffer fills.
        let mut client = tokio::io::BufReader::with_capacity(3, client);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut server = server;
            server
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
                .await
                .unwrap();
            server
        });
        let mut buf = vec![0; 4096];
        let mut bytes = 0;
        let body = read_response(&mut client, &mut buf, &clock(), &mut bytes)
            .await
            .unwrap();
        assert_eq!(body, 10);
        assert_eq!(bytes, 49);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn rejects_non_200_missing_length_and_truncation() {
        for (input, kind) in [
            (
                &b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"[..],
                "status",
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", "protocol"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "read"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nabc",
                "protocol",
            ),
            (b"garbage\r\n\r\n", "protocol"),
        ] {
            let mut s: &[u8] = input;
            let mut buf = vec![0; 4096];
            let mut bytes = 0;
            let e = read_response(&mut s, &mut buf, &clock(), &mut bytes)
                .await
                .unwrap_err();
            assert_eq!(e.kind, kind, "{:?}", String::from_utf8_lossy(input));
        }
    }
}
