//! The HTTP/1.1 side of a client connection: read heads under timeouts,
//! drain request bodies within limits, answer from the document root, keep
//! pipelined responses in order, and close cleanly.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant, SystemTime};

use tlsgate_http1::{
    end_head, parse_request, write_header, write_status_line, BodyFraming, ChunkedDecoder, Limits,
    Method, RequestHead, Version,
};
use tokio::time::timeout_at;

use crate::buffers;
pub(crate) use crate::respond::HttpCtx;
use crate::respond::{self, decide, Logged, Reply, Request};
use crate::transport::Transport;

/// Bodies up to this size are copied after the head into one write; larger
/// ones are streamed (`sendfile` under kernel TLS). The cost model
/// calibrates a point here: the CPU per byte changes with the path.
pub const INLINE_BODY_MAX: u64 = 64 * 1024;
/// Queued pipelined responses are sent once they reach this size.
const OUT_FLUSH_AT: usize = 64 * 1024;
/// Bytes asked of the transport per read.
const READ_CHUNK: usize = buffers::READ_BUFFER;
/// How long a closing connection keeps draining the client's bytes.
const LINGER: Duration = Duration::from_secs(2);

/// The protocol label of this module's requests in the metrics.
const PROTOCOL: &str = "http/1.1";

/// How a connection ended; for the timeout metrics.
pub(crate) enum End {
    Done,
    Timeout(&'static str),
    /// A response broke off after its head: the connection is dropped
    /// without close_notify, which would claim a complete exchange.
    Abort,
}

/// A response's outcome for logs and metrics.
pub(crate) struct Answered {
    pub status: u16,
    pub body_bytes: u64,
}

/// Reads more bytes into the tail of `buf`. Callers that may cancel this
/// future return from the connection right after, so the zero-filled tail
/// left by a cancellation is never parsed.
async fn read_more<T: Transport + Send>(io: &mut T, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() == 0 {
        // A connection waiting for a request holds no buffer.
        io.readable().await?;
        *buf = buffers::take_read();
    }
    io.read_append(buf, READ_CHUNK).await
}

/// Sends the queued output within the send timeout.
async fn send<T: Transport>(io: &mut T, out: &mut Vec<u8>, cx: &HttpCtx<'_>) -> Result<(), End> {
    send_then(io, out, cx, false).await
}

/// Sends the queued output and closes: for TLS the response and the
/// close_notify leave in one write. `Err` when the client did not take it.
async fn send_and_close<T: Transport>(
    io: &mut T,
    out: &mut Vec<u8>,
    cx: &HttpCtx<'_>,
) -> Result<(), End> {
    send_then(io, out, cx, true).await
}

async fn send_then<T: Transport>(
    io: &mut T,
    out: &mut Vec<u8>,
    cx: &HttpCtx<'_>,
    and_close: bool,
) -> Result<(), End> {
    let limit = cx.gen.config.limits.send_timeout;
    let r = tokio::time::timeout(limit, async {
        io.write_all(out).await?;
        if and_close {
            io.close().await
        } else {
            io.flush().await
        }
    })
    .await;
    cx.shared.metrics.bytes_sent.inc_by(out.len() as u64);
    out.clear();
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(End::Done),
        Err(_) => Err(End::Timeout("send")),
    }
}

/// Serves requests until the client leaves, a limit or timeout ends the
/// connection, or shutdown. Never panics on client input. Ends with the
/// transport closed (close_notify for TLS, RFC 8446 §6.1) unless the client
/// stopped reading.
pub(crate) async fn serve<T: Transport + Send>(io: &mut T, cx: &mut HttpCtx<'_>) {
    let end = serve_inner(io, cx).await;
    if let End::Timeout(which) = end {
        cx.shared
            .metrics
            .timeouts
            .get_or_create(&tlsgate_metrics::ReasonLabel { reason: which })
            .inc();
    }
    if !matches!(end, End::Timeout("send") | End::Abort) {
        // Idempotent: paths that closed already send nothing more.
        close(io).await;
    }
}

async fn serve_inner<T: Transport + Send>(io: &mut T, cx: &mut HttpCtx<'_>) -> End {
    let limits = &cx.gen.config.limits;
    let parse_limits = Limits {
        max_head_bytes: limits.max_header_bytes,
        max_target_bytes: limits.max_uri_bytes,
        max_headers: limits.max_headers,
    };
    let mut inbuf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut served: u64 = 0;
    // When the head being read began; the first one counts from the handshake.
    let mut head_started: Option<Instant> = Some(Instant::now());

    loop {
        let head = match parse_request(&inbuf, &parse_limits) {
            Ok(Some(h)) => h,
            Ok(None) => {
                if !out.is_empty() {
                    if let Err(e) = send(io, &mut out, cx).await {
                        return e;
                    }
                }
                match head_started {
                    Some(t0) => {
                        let deadline = (t0 + limits.header_timeout).into();
                        match timeout_at(deadline, read_more(io, &mut inbuf)).await {
                            Ok(Ok(n)) if n > 0 => continue,
                            Ok(_) => return End::Done,
                            Err(_) => {
                                // RFC 9110 408, then close.
                                simple(&mut out, cx, 408, false, false, false);
                                let _ = send(io, &mut out, cx).await;
                                close(io).await;
                                return End::Timeout("header");
                            }
                        }
                    }
                    None => {
                        if *cx.shutdown.borrow() {
                            close(io).await;
                            return End::Done;
                        }
                        // Idle keep-alive connections are most of a busy
                        // server's connections: they wait for the next
                        // request with no buffer of their own.
                        release_idle_buffers(&mut out, &mut inbuf);
                        let deadline = (Instant::now() + limits.keepalive_timeout).into();
                        tokio::select! {
                            r = timeout_at(deadline, read_more(io, &mut inbuf)) => match r {
                                Ok(Ok(n)) if n > 0 => {
                                    head_started = Some(Instant::now());
                                    continue;
                                }
                                Ok(_) => return End::Done,
                                Err(_) => {
                                    close(io).await;
                                    return End::Timeout("keepalive");
                                }
                            },
                            _ = cx.shutdown.changed() => {
                                close(io).await;
                                return End::Done;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                let status = e.status();
                tracing::debug!(peer = %cx.peer(), "bad request: {e}");
                let t0 = Instant::now();
                let bytes = simple(&mut out, cx, status, false, false, false);
                log_request(
                    cx,
                    io.offloaded(),
                    None,
                    status,
                    bytes,
                    t0,
                    SystemTime::now(),
                    None,
                );
                let _ = send(io, &mut out, cx).await;
                close(io).await;
                io.linger(LINGER).await;
                return End::Done;
            }
        };

        let t0 = Instant::now();
        let wall = SystemTime::now();
        served += 1;
        if out.capacity() == 0 {
            out = buffers::take_out();
        }
        let mut keep_alive = head.keep_alive()
            && served < limits.max_requests_per_connection
            && !*cx.shutdown.borrow()
            // After a reload this connection still meets the generation it
            // was accepted under: Connection: close brings its client to
            // the new one, as for proxied requests and h2's GOAWAY.
            && !crate::proxy::reloaded(cx);
        inbuf.drain(..head.head_len().min(inbuf.len()));

        // A route may send the request to an upstream pool (which reads
        // the body itself) or to another document root.
        let mut early: Option<u16> = None;
        let (root, proxied) = match crate::proxy::route(cx, &head) {
            crate::proxy::Routed::Root(root) => (root, None),
            crate::proxy::Routed::Refused(status) => {
                early = Some(status);
                (&cx.site.root, None)
            }
            crate::proxy::Routed::Pool(pool, max_body) => {
                let args = (pool, max_body, keep_alive);
                // Boxed: an upstream exchange's state is ~3 KiB, which
                // inline would sit in every connection's future, idle or not.
                let exchange = crate::proxy::serve(io, cx, &head, &mut inbuf, &mut out, args);
                match Box::pin(exchange).await {
                    Ok((answered, note, keep)) => {
                        keep_alive = keep;
                        (&cx.site.root, Some((answered, note)))
                    }
                    Err(e) => return e,
                }
            }
        };

        // The body: drained for GET/HEAD (we have no use for it), never read
        // for other methods, which are refused and closed.
        let serves_method = matches!(head.method(), Method::Get | Method::Head);
        let framing = match proxied {
            Some(_) => BodyFraming::None,
            None => head.body(),
        };
        let body_to_come = serves_method
            && match framing {
                BodyFraming::ContentLength(n) => {
                    n <= limits.max_body_bytes && n > inbuf.len() as u64
                }
                BodyFraming::Chunked => true,
                BodyFraming::None => false,
            };
        if body_to_come {
            // The wait for the body may be long, or end the connection:
            // the answers to earlier pipelined requests leave first, and a
            // client waiting for a 100 (Continue) gets it (RFC 9110 §10.1.1).
            if head.expects_continue() {
                out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            if !out.is_empty() {
                if let Err(e) = send(io, &mut out, cx).await {
                    return e;
                }
            }
        }
        match framing {
            BodyFraming::None | BodyFraming::ContentLength(0) => {}
            _ if !serves_method => keep_alive = false,
            BodyFraming::ContentLength(n) if n > limits.max_body_bytes => early = Some(413),
            BodyFraming::ContentLength(n) => {
                if let Err(e) = drain_length(io, &mut inbuf, n, cx).await {
                    return e;
                }
            }
            BodyFraming::Chunked => match drain_chunked(io, &mut inbuf, cx).await {
                Ok(()) => {}
                Err(Err(e)) => return e,
                Err(Ok(status)) => early = Some(status),
            },
        }
        if early.is_some() {
            keep_alive = false;
        }

        let (proxied, note) = match proxied {
            Some((answered, note)) => (Some(answered), Some(note)),
            None => (None, None),
        };
        let answered = match (proxied, early) {
            (Some(answered), _) => answered,
            (None, Some(status)) => Answered {
                status,
                body_bytes: simple(
                    &mut out,
                    cx,
                    status,
                    false,
                    false,
                    head.method() == &Method::Head,
                ),
            },
            (None, None) => {
                // A big response can take seconds to a slow client: the
                // read buffer waits for the next request in the pool.
                buffers::release_read(&mut inbuf);
                match respond(io, cx, root, &head, &mut out, keep_alive).await {
                    Ok(a) => a,
                    Err((e, broken)) => {
                        // Broken off: still one line, with the body bytes
                        // that left (as nginx logs it).
                        log_request(
                            cx,
                            io.offloaded(),
                            Some(&head),
                            broken.status,
                            broken.body_bytes,
                            t0,
                            wall,
                            note.as_ref(),
                        );
                        return e;
                    }
                }
            }
        };
        log_request(
            cx,
            io.offloaded(),
            Some(&head),
            answered.status,
            answered.body_bytes,
            t0,
            wall,
            note.as_ref(),
        );

        if !keep_alive {
            // Lingering stays even when the client asked to close: bytes it
            // sends anyway would otherwise meet a reset that can destroy the
            // response (tests/malformed.rs pins this).
            if send_and_close(io, &mut out, cx).await.is_ok() {
                io.linger(LINGER).await;
            }
            return End::Done;
        }
        head_started = if inbuf.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        // Pipelined requests already here are answered before one write.
        if inbuf.is_empty() || out.len() >= OUT_FLUSH_AT {
            if let Err(e) = send(io, &mut out, cx).await {
                return e;
            }
        }
    }
}

/// Gives back what a connection waiting for its next request does not
/// need: every buffer, unless it still holds bytes.
fn release_idle_buffers(out: &mut Vec<u8>, inbuf: &mut Vec<u8>) {
    buffers::release_out(out);
    buffers::release_read(inbuf);
}

async fn close<T: Transport>(io: &mut T) {
    let _ = tokio::time::timeout(Duration::from_secs(1), io.close()).await;
}

/// Discards a Content-Length body.
async fn drain_length<T: Transport + Send>(
    io: &mut T,
    inbuf: &mut Vec<u8>,
    len: u64,
    cx: &HttpCtx<'_>,
) -> Result<(), End> {
    let have = usize::try_from(len).unwrap_or(usize::MAX).min(inbuf.len());
    inbuf.drain(..have);
    let mut left = len - have as u64;
    let deadline = (Instant::now() + cx.gen.config.limits.body_timeout).into();
    // On the heap, and only when a body is still coming: an array here
    // would sit in every connection's future, idle or not.
    let mut sink = if left > 0 {
        vec![0u8; 4096]
    } else {
        Vec::new()
    };
    while left > 0 {
        let want = usize::try_from(left).map_or(sink.len(), |l| l.min(sink.len()));
        match timeout_at(deadline, io.read(sink.get_mut(..want).unwrap_or_default())).await {
            Ok(Ok(n)) if n > 0 => left -= n as u64,
            Ok(_) => return Err(End::Done),
            Err(_) => return Err(End::Timeout("body")),
        }
    }
    Ok(())
}

/// Discards a chunked body. `Err(Ok(status))` answers the client's error.
async fn drain_chunked<T: Transport + Send>(
    io: &mut T,
    inbuf: &mut Vec<u8>,
    cx: &HttpCtx<'_>,
) -> Result<(), Result<u16, End>> {
    let limits = &cx.gen.config.limits;
    let mut decoder = ChunkedDecoder::new(limits.max_body_bytes, limits.max_header_bytes);
    let deadline = (Instant::now() + limits.body_timeout).into();
    let mut sink = Vec::new();
    loop {
        let decoded = decoder
            .decode(inbuf, &mut sink)
            .map_err(|e| Ok(e.status()))?;
        sink.clear();
        inbuf.drain(..decoded.consumed.min(inbuf.len()));
        if decoded.done {
            return Ok(());
        }
        match timeout_at(deadline, read_more(io, inbuf)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return Err(Err(End::Done)),
            Err(_) => return Err(Err(End::Timeout("body"))),
        }
    }
}

/// Writes `reply`'s head into `out`: status line, the core's headers,
/// then `Connection` as HTTP/1.1 needs it. Returns the body length a GET
/// gets.
fn write_head(
    out: &mut Vec<u8>,
    cx: &HttpCtx<'_>,
    reply: &Reply,
    keep_alive: bool,
    http10: bool,
) -> u64 {
    write_status_line(out, reply.status());
    reply.headers(cx.gen, |name, value| write_header(out, name, value));
    if !keep_alive {
        write_header(out, "Connection", b"close");
    } else if http10 {
        write_header(out, "Connection", b"keep-alive");
    }
    end_head(out);
    reply.body_len()
}

/// A short text response (errors, redirects). Returns the body length.
pub(crate) fn simple(
    out: &mut Vec<u8>,
    cx: &HttpCtx<'_>,
    status: u16,
    keep_alive: bool,
    http10: bool,
    head_only: bool,
) -> u64 {
    let reply = Reply::text(status);
    let len = write_head(out, cx, &reply, keep_alive, http10);
    if head_only {
        return 0;
    }
    reply.write_text_body(out);
    len
}

/// Answers one request from the document root. `Err`: the connection
/// ends, with what the response got to send.
async fn respond<T: Transport + Send>(
    io: &mut T,
    cx: &HttpCtx<'_>,
    root: &tlsgate_files::DocumentRoot,
    head: &RequestHead,
    out: &mut Vec<u8>,
    keep_alive: bool,
) -> Result<Answered, (End, Answered)> {
    let is_head = head.method() == &Method::Head;
    let http10 = head.version() == Version::Http10;
    // Repeated lines are one list (`If-None-Match: "a"` then `"b"`).
    let conditionals = respond::CONDITIONAL_FIELDS.map(|name| head.joined(name));
    let req = Request {
        method: head.method(),
        path: head.path(),
        query: head.query(),
        pre: respond::preconditions(&conditionals),
    };
    let reply = decide(cx, root, &req);
    let status = reply.status();
    let (file, start, len) = match &reply {
        Reply::File {
            file, start, len, ..
        } => (file, *start, *len),
        _ => {
            let len = write_head(out, cx, &reply, keep_alive, http10);
            if is_head {
                return Ok(Answered {
                    status,
                    body_bytes: 0,
                });
            }
            reply.write_text_body(out);
            return Ok(Answered {
                status,
                body_bytes: len,
            });
        }
    };
    if !is_head && len > 0 && io.wants_offload(len) {
        // Responses queued before this one leave under user-space TLS;
        // this one and every later one through the kernel.
        let none_sent = |end| {
            (
                end,
                Answered {
                    status,
                    body_bytes: 0,
                },
            )
        };
        send(io, out, cx).await.map_err(none_sent)?;
        io.offload().await.map_err(|_| none_sent(End::Done))?;
    }
    // Where this response begins: what is before it answers earlier
    // pipelined requests, complete and logged.
    let ours = out.len();
    write_head(out, cx, &reply, keep_alive, http10);
    if is_head || len == 0 {
        return Ok(Answered {
            status,
            body_bytes: 0,
        });
    }
    if len <= INLINE_BODY_MAX {
        let at = out.len();
        // len <= 64 KiB, so the cast is exact.
        out.resize(at + len as usize, 0);
        let body = out.get_mut(at..).unwrap_or_default();
        let filled = match file.cached(start, body.len()) {
            // Kept by the open-file cache: no read.
            Some(bytes) => {
                body.copy_from_slice(bytes);
                Ok(())
            }
            None => file.file.read_exact_at(body, start),
        };
        if let Err(e) = filled {
            // The head promised a length we cannot deliver: drop the
            // connection, after the responses queued before this one
            // (within the send timeout; they were logged as answered).
            tracing::warn!(peer = %cx.peer(), "read failed mid-response: {e}");
            out.truncate(ours);
            if !out.is_empty() {
                let _ = send(io, out, cx).await;
            }
            return Err((
                End::Abort,
                Answered {
                    status,
                    body_bytes: 0,
                },
            ));
        }
        let path = if io.offloaded() {
            "ktls_write"
        } else {
            "userspace"
        };
        cx.shared.metrics.count_body(path, len);
    } else {
        // The head (after any queued responses) leaves with the body's
        // first bytes, never as a small record of its own.
        let limit = cx.gen.config.limits.send_timeout;
        let mut sent = 0;
        let r = io
            .send_file(out, &file.file, start, len, limit, &mut sent)
            .await;
        cx.shared.metrics.bytes_sent.inc_by(out.len() as u64);
        out.clear();
        let broken = |end| {
            (
                end,
                Answered {
                    status,
                    body_bytes: sent,
                },
            )
        };
        match r {
            Ok(()) => {
                cx.shared.metrics.bytes_sent.inc_by(len);
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(broken(End::Timeout("send")))
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    tracing::warn!(peer = %cx.peer(), "{e}: connection dropped mid-response");
                }
                return Err(broken(End::Abort));
            }
        }
    }
    Ok(Answered {
        status,
        body_bytes: len,
    })
}

// One record's worth of facts, each from a different place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn log_request(
    cx: &HttpCtx<'_>,
    ktls: bool,
    head: Option<&RequestHead>,
    status: u16,
    body_bytes: u64,
    t0: Instant,
    wall: SystemTime,
    proxied: Option<&crate::proxy::Proxied>,
) {
    let mut logged = match head {
        None => Logged::UNREAD,
        Some(h) => Logged {
            method: h.method().as_str(),
            target: h.target(),
            version: match h.version() {
                Version::Http10 => "HTTP/1.0",
                Version::Http11 => "HTTP/1.1",
            },
            referer: h.header("referer"),
            user_agent: h.header("user-agent"),
            upstream: None,
            upstream_error: None,
        },
    };
    if let Some(p) = proxied {
        logged.upstream = p.server.as_deref();
        logged.upstream_error = p.reason;
    }
    respond::log_request(cx, PROTOCOL, ktls, &logged, status, body_bytes, t0, wall);
}
