//! The HTTP/2 side of a client connection (RFC 9113), for clients that
//! chose `h2` in ALPN: the `h2` crate runs the protocol over the
//! connection's user-space TLS (no kernel TLS offload: `h2` owns the byte
//! stream and its framing, and `sendfile` cannot carry HTTP/2 frames), and
//! every stream is answered by the core shared with HTTP/1.1
//! ([`crate::respond`]). Streams of a connection run concurrently inside
//! its task; file bodies go out in DATA frames as the client's flow-control
//! windows allow, each wait bounded by the send timeout.
//!
//! Limits: `[http2]` (streams, windows, header lists and blocks, resets)
//! applied through `h2`'s builder, the floods `h2` does not bound by
//! itself through [`guard`], `limits.header_timeout` for the connection
//! preface, `http2.idle_timeout` without open streams,
//! `limits.send_timeout` per stream (a zero window) and per connection
//! (a client that does not read at all), `limits.max_requests_per_connection`.
//! Shutdown: GOAWAY, then the streams in flight are finished up to the
//! worker's deadline.

mod budget;
mod chunks;
pub mod frames;
mod guard;
mod proxy;

use std::future::poll_fn;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use h2::server::{Builder, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::header::AsHeaderName;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use tlsgate_files::StaticFile;
use tlsgate_http1::Method;
use tlsgate_metrics::ReasonLabel;
use tlsgate_tls::TlsConnection;

use crate::respond::{self, decide, HttpCtx, Logged, Reply, Request};
use budget::SendBudget;
use guard::{Alarm, GuardedIo, SharedConn};

/// The protocol label of this module's requests in the metrics.
const PROTOCOL: &str = "h2";
/// How often a connection with streams open checks for a stalled client.
const STALL_CHECK: Duration = Duration::from_secs(1);
/// How long a connection that is being closed may take to send its GOAWAY.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long after a graceful GOAWAY new streams are still taken. `h2`
/// first sends GOAWAY naming no stream and a PING, and names the last
/// stream it takes only once the PING is answered (RFC 9113 §6.8): a
/// client that never answers could open streams for ever, past
/// `max_requests_per_connection` and on a generation a reload retired.
/// After this, new streams are refused (REFUSED_STREAM, safe to retry
/// elsewhere), and the connection ends a send timeout after the open
/// ones are done.
const DRAIN_ACK_WAIT: Duration = Duration::from_secs(5);
/// DATA payload that fills a TLS record (2^14 bytes of plaintext) with
/// its frame header.
const FRAME_IN_RECORD: usize = 16_384 - 9;
/// h2's send buffer per stream (`http2.max_send_buffer_size`) in whole
/// [`FRAME_IN_RECORD`] frames. A stream's room is that buffer less what
/// it has buffered, and h2 frees it a frame at a time: with 65,536 bytes,
/// each 65,500-byte read (four frames) left room for 36 more, read,
/// framed and encrypted as a record of their own after every chunk.
fn stream_send_buffer(h2c: &tlsgate_config::Http2) -> usize {
    whole_frames(h2c.max_send_buffer_size as usize)
}

/// `n` rounded down to whole [`FRAME_IN_RECORD`] frames, one at least.
fn whole_frames(n: usize) -> usize {
    (n - n % FRAME_IN_RECORD).max(FRAME_IN_RECORD)
}

/// How long a connection cut off keeps draining the client's bytes.
const LINGER: Duration = Duration::from_secs(2);

/// Serves HTTP/2 on `conn` until the client leaves, a limit or timeout
/// ends the connection, or shutdown. Never panics on client input.
pub(crate) async fn serve(conn: &mut TlsConnection, cx: &HttpCtx<'_>) {
    let end = serve_connection(conn, cx).await;
    if end == End::CutOff || (end == End::Drained && !conn.peer_done_sending()) {
        // The GOAWAY, or the last frames, are on their way: what the
        // client still sends (a WINDOW_UPDATE for the last DATA, a PING's
        // answer) is read and dropped for a while, so that closing does
        // not turn into a reset that destroys what is still in the
        // client's receive buffer.
        let _ = tokio::time::timeout(CLOSE_GRACE, conn.close()).await;
        crate::transport::linger_socket(conn.socket(), LINGER).await;
    }
}

/// How a connection's HTTP/2 loop ended.
#[derive(PartialEq, Eq)]
enum End {
    /// The client left, or nothing more could be sent to it.
    Done,
    /// The server sent GOAWAY (shutdown, reload, a request limit, idle)
    /// and the connection ran down.
    Drained,
    /// The server ended it for a limit or an error of the client's.
    CutOff,
}

async fn serve_connection(conn: &mut TlsConnection, cx: &HttpCtx<'_>) -> End {
    let m = &cx.shared.metrics;
    let limits = &cx.gen.config.limits;
    let h2c = &cx.gen.config.http2;
    let alarm = Alarm::default();
    let conn: SharedConn<'_> = std::sync::Mutex::new(conn);
    let io = GuardedIo::new(&conn, h2c, &alarm, m);
    let mut builder = Builder::new();
    builder
        .max_concurrent_streams(h2c.max_concurrent_streams)
        .initial_window_size(h2c.initial_window_size)
        .initial_connection_window_size(h2c.initial_connection_window_size)
        .max_frame_size(h2c.max_frame_size)
        .max_header_list_size(h2c.max_header_list_size)
        .max_send_buffer_size(stream_send_buffer(h2c))
        .max_pending_accept_reset_streams(h2c.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(h2c.max_local_error_reset_streams));
    let mut connection = match tokio::time::timeout(
        limits.header_timeout,
        builder.handshake::<_, Bytes>(io),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(peer = %cx.peer(), "HTTP/2 preface failed: {e}");
            m.count_h2_rejected(error_reason(&e));
            return End::CutOff;
        }
        Err(_) => {
            m.timeouts
                .get_or_create(&ReasonLabel { reason: "header" })
                .inc();
            return End::CutOff;
        }
    };

    // From here every turn of the loop below ends by sending what it
    // wrote (its last branch): a read that waits need not send first.
    guard::send_at_turn_end(&conn);
    let mut shutdown = cx.shutdown.clone();
    let budget = SendBudget::new(
        h2c,
        budget::Gauges {
            buffered: cx.shared.metrics.h2_send_buffered.clone(),
            waiting: cx.shared.metrics.h2_send_waiting.clone(),
        },
    );
    // Streams forwarded to upstream pools at once (`max_proxied_streams`):
    // one connection's many streams cannot take a whole pool.
    let proxied = tokio::sync::Semaphore::new(h2c.max_proxied_streams as usize);
    let mut streams = FuturesUnordered::new();
    let mut served: u64 = 0;
    // Set once GOAWAY went out: no new streams, the open ones finish.
    let mut draining = *shutdown.borrow();
    if draining {
        connection.graceful_shutdown();
    }
    // When a connection being closed for a limit must be gone.
    let mut hard_deadline: Option<tokio::time::Instant> = None;
    // Since draining began, once `DRAIN_ACK_WAIT` passes: no new streams.
    let mut refuse_after: Option<tokio::time::Instant> = None;
    let mut refusing = false;
    let mut end = End::Done;
    let idle = tokio::time::sleep(h2c.idle_timeout);
    tokio::pin!(idle);
    let mut stall_check = tokio::time::interval(STALL_CHECK);
    stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    'serve: loop {
        if draining && refuse_after.is_none() {
            refuse_after = Some(tokio::time::Instant::now() + DRAIN_ACK_WAIT);
        }
        if refusing && streams.is_empty() && hard_deadline.is_none() {
            // What the last streams handed to `h2` may still be on its way
            // to the client, and only a client that answers the PING lets
            // `h2` end the connection by itself: the end comes at the
            // send timeout (a reader that slow is cut off anyway).
            hard_deadline = Some(tokio::time::Instant::now() + limits.send_timeout);
        }
        let deadline =
            hard_deadline.unwrap_or_else(|| tokio::time::Instant::now() + h2c.idle_timeout);
        // Biased, streams before the connection: every response that is
        // ready is queued before `accept` polls the connection, which
        // writes and flushes — one write for a batch of streams, not one
        // per stream.
        tokio::select! {
            biased;
            () = alarm.notify.notified() => {
                let reason = alarm.tripped().unwrap_or("flood");
                tracing::debug!(peer = %cx.peer(), "HTTP/2 client cut off: {reason}");
                m.count_h2_rejected(reason);
                connection.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                // What the client had open is abandoned with it.
                streams.clear();
                hard_deadline = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                end = End::CutOff;
            }
            // Only to run the loop again: its stall check is on now.
            () = alarm.blocked.notified() => {}
            r = shutdown.changed(), if !draining => {
                if r.is_err() || *shutdown.borrow() {
                    connection.graceful_shutdown();
                    draining = true;
                }
            }
            Some(()) = streams.next(), if !streams.is_empty() => {
                // Each finished stream is polled once more at most: bounded.
                while let Some(Some(())) = streams.next().now_or_never() {}
                if streams.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + h2c.idle_timeout);
                }
            }
            accepted = connection.accept() => {
                let mut next = Some(accepted);
                while let Some(accepted) = next.take() {
                    match accepted {
                        Some(Ok((_, mut respond))) if refusing => {
                            respond.send_reset(Reason::REFUSED_STREAM);
                            next = connection.accept().now_or_never();
                        }
                        Some(Ok((req, respond))) => {
                            served += 1;
                            m.h2_streams.inc();
                            streams.push(serve_stream(cx, req, respond, &budget, &proxied));
                            // After a reload the connection's streams still
                            // meet the old generation (its pools, its files):
                            // GOAWAY brings the client back to the new one.
                            let retire = served >= limits.max_requests_per_connection
                                || crate::proxy::reloaded(cx);
                            if retire && !draining {
                                connection.graceful_shutdown();
                                draining = true;
                            }
                            // Every stream the last read brought is taken
                            // before any is answered (see `biased` above).
                            next = connection.accept().now_or_never();
                        }
                        Some(Err(e)) => {
                            if !is_client_gone(&e) {
                                tracing::debug!(peer = %cx.peer(), "HTTP/2 connection error: {e}");
                                m.count_h2_rejected(error_reason(&e));
                                end = End::CutOff;
                            }
                            break 'serve;
                        }
                        None => break 'serve,
                    }
                }
            }
            () = &mut idle, if streams.is_empty() && hard_deadline.is_none() => {
                m.timeouts.get_or_create(&ReasonLabel { reason: "h2_idle" }).inc();
                connection.graceful_shutdown();
                draining = true;
                // A client that reads nothing does not even take the GOAWAY.
                hard_deadline = Some(tokio::time::Instant::now() + limits.send_timeout);
            }
            _ = stall_check.tick(), if !streams.is_empty() || alarm.blocked_since().is_some() => {
                let blocked = alarm.blocked_since().map(|t| t.elapsed());
                if blocked.is_some_and(|b| b >= limits.send_timeout) {
                    m.timeouts.get_or_create(&ReasonLabel { reason: "send" }).inc();
                    // Nothing more can be sent: no GOAWAY, no linger.
                    return End::Done;
                }
                if blocked.is_some_and(|b| budget.should_yield(b)) {
                    // What this client does not read, other streams of the
                    // worker wait for (see `budget`).
                    m.timeouts.get_or_create(&ReasonLabel { reason: "h2_send_budget" }).inc();
                    return End::Done;
                }
            }
            () = tokio::time::sleep_until(refuse_after.unwrap_or(deadline)),
                if refuse_after.is_some() && !refusing && hard_deadline.is_none() =>
            {
                refusing = true;
            }
            () = tokio::time::sleep_until(deadline), if hard_deadline.is_some() => break,
            // Last: what every branch above wrote in this turn, in one go.
            sent = poll_fn(|cx| guard::poll_send_records(&conn, &alarm, cx)) => {
                if sent.is_err() {
                    break;
                }
            }
        }
    }
    // Streams already answered finish their logging; the rest end with
    // the connection.
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while streams.next().await.is_some() {}
    })
    .await;
    // Their frames (and a GOAWAY) may still wait in the buffer.
    let _ = tokio::time::timeout(CLOSE_GRACE, poll_fn(|cx| guard::poll_flush(&conn, cx))).await;
    if end == End::Done && draining {
        // The GOAWAY was ours: the client may still be sending.
        End::Drained
    } else {
        end
    }
}

/// A connection ended by the client going away is no error of theirs to count.
fn is_client_gone(e: &h2::Error) -> bool {
    e.is_io() || (e.is_go_away() && e.is_remote() && e.reason() == Some(Reason::NO_ERROR))
}

/// The metric label of an `h2` error that ended a connection or preface.
fn error_reason(e: &h2::Error) -> &'static str {
    if e.is_io() {
        return "io";
    }
    let local = !e.is_remote();
    match e.reason() {
        Some(Reason::PROTOCOL_ERROR) if local => "protocol_error",
        Some(Reason::FLOW_CONTROL_ERROR) if local => "flow_control_error",
        Some(Reason::FRAME_SIZE_ERROR) if local => "frame_size_error",
        Some(Reason::COMPRESSION_ERROR) if local => "compression_error",
        Some(Reason::ENHANCE_YOUR_CALM) if local => "enhance_your_calm",
        Some(Reason::REFUSED_STREAM) if local => "refused_stream",
        Some(_) if local => "other_error",
        _ => "client_error",
    }
}

/// Keeps `h2_streams_open` right however a stream ends.
struct OpenStream<'a>(&'a tlsgate_metrics::Metrics);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        self.0.h2_streams_open.dec();
    }
}

/// A request header's value; repeated fields joined with ", " (RFC 9110 §5.3).
fn joined(headers: &HeaderMap, name: impl AsHeaderName) -> Option<Vec<u8>> {
    joined_with(headers, name, b", ", usize::MAX)
}
/// A field's values joined by `sep`, at most `max` bytes of them.
fn joined_with(
    headers: &HeaderMap,
    name: impl AsHeaderName,
    sep: &[u8],
    max: usize,
) -> Option<Vec<u8>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?.as_bytes();
    let mut out = first.get(..max).unwrap_or(first).to_vec();
    for v in values {
        if out.len() >= max {
            break;
        }
        for part in [sep, v.as_bytes()] {
            let room = max.saturating_sub(out.len());
            out.extend_from_slice(part.get(..room).unwrap_or(part));
        }
    }
    Some(out)
}

/// A request header's fields joined for the access log, which keeps at
/// most [`crate::access_log::FIELD_MAX`] bytes of it: the join stops one byte
/// past that (enough for the log to see, and mark, the cut), so HPACK's
/// cheap repetition of one big indexed field costs no big copy.
fn joined_for_log(headers: &HeaderMap, name: impl AsHeaderName) -> Option<Vec<u8>> {
    joined_with(headers, name, b", ", crate::access_log::FIELD_MAX + 1)
}

/// The HTTP/2 name of a response header of the core's (no parsing per
/// response for the names it uses).
fn response_header(name: &str) -> Option<HeaderName> {
    Some(match name {
        "Date" => header::DATE,
        "Server" => header::SERVER,
        "Content-Type" => header::CONTENT_TYPE,
        "Content-Length" => header::CONTENT_LENGTH,
        "Last-Modified" => header::LAST_MODIFIED,
        "ETag" => header::ETAG,
        "Accept-Ranges" => header::ACCEPT_RANGES,
        "Content-Range" => header::CONTENT_RANGE,
        "Location" => header::LOCATION,
        "Allow" => header::ALLOW,
        other => return HeaderName::from_bytes(other.as_bytes()).ok(),
    })
}

/// Why a stream's response did not complete.
enum Broken {
    /// The client reset the stream or left.
    Gone,
    /// The client did not open its window within the send timeout.
    Timeout,
    /// The file could not be read to the length announced.
    Read,
}

/// The send timeout's rule for a stream's body: its waits for the
/// client's window add up to at most the send timeout until a record's
/// worth more was granted, so a client that opens its window a few bytes
/// just before each timeout is cut off as well. Only those waits count,
/// not the time spent reading a file or waiting for an upstream.
struct SendProgress {
    limit: Duration,
    waited: Duration,
    granted: usize,
}

impl SendProgress {
    fn new(limit: Duration) -> Self {
        Self {
            limit,
            waited: Duration::ZERO,
            granted: 0,
        }
    }

    /// Room on `send` for up to `want` bytes, waited for within what is
    /// left of the limit; past it the stream is reset with CANCEL.
    async fn room(&mut self, send: &mut SendStream<Bytes>, want: usize) -> Result<usize, Broken> {
        send.reserve_capacity(want);
        let mut granted = send.capacity();
        while granted == 0 {
            let budget = self.limit.saturating_sub(self.waited);
            let started = Instant::now();
            let r = tokio::time::timeout(budget, poll_fn(|c| send.poll_capacity(c))).await;
            self.waited += started.elapsed();
            match r {
                Err(_) => {
                    send.send_reset(Reason::CANCEL);
                    return Err(Broken::Timeout);
                }
                Ok(None) | Ok(Some(Err(_))) => return Err(Broken::Gone),
                Ok(Some(Ok(n))) => granted = n,
            }
        }
        Ok(granted)
    }

    /// `n` bytes of the body handed to `h2`.
    fn sent(&mut self, n: usize) {
        self.granted += n;
        if self.granted >= FRAME_IN_RECORD {
            self.waited = Duration::ZERO;
            self.granted = 0;
        }
    }
}

/// Answers one stream.
async fn serve_stream(
    cx: &HttpCtx<'_>,
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    budget: &SendBudget,
    proxied: &tokio::sync::Semaphore,
) {
    let m = &cx.shared.metrics;
    m.h2_streams_open.inc();
    let _open = OpenStream(m);
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let (parts, body) = req.into_parts();
    let method = Method::from_token(parts.method.as_str().as_bytes());
    let target = parts
        .uri
        .path_and_query()
        .map_or("", |p| p.as_str())
        .as_bytes();
    let path = parts.uri.path().as_bytes();
    let h = &parts.headers;
    let conditionals = crate::respond::CONDITIONAL_FIELDS.map(|name| joined(h, name));
    let referer = joined_for_log(h, &header::REFERER);
    let user_agent = joined_for_log(h, &header::USER_AGENT);
    let logged = Logged {
        method: method.as_str(),
        target,
        version: "HTTP/2.0",
        referer: referer.as_deref(),
        user_agent: user_agent.as_deref(),
        upstream: None,
        upstream_error: None,
    };
    let is_head = method == Method::Head;
    let authority = parts
        .uri
        .authority()
        .map(|a| a.as_str().as_bytes())
        .or_else(|| h.get(http::header::HOST).map(HeaderValue::as_bytes));
    // The request limits HTTP/1.1's parser applies: the target's length
    // (414) and the number of fields (431), before the request goes
    // anywhere.
    let limits = &cx.gen.config.limits;
    // Browsers send each cookie as a field of its own over h2 (RFC 9113
    // §8.2.3): they count as the one Cookie line HTTP/1.1 would carry.
    let cookies = h.get_all(header::COOKIE).iter().count();
    let fields = h.len() - cookies + usize::from(cookies > 0);
    let over_limit = if target.len() > limits.max_uri_bytes {
        Some(414)
    } else if fields > limits.max_headers {
        Some(431)
    } else if malformed(&parts).is_some()
        || !tlsgate_http1::is_target_text(target)
        || (target == b"*" && method != Method::Options)
        || authority.is_some_and(|a| !a.is_empty() && !tlsgate_http1::is_valid_host(a, false))
    {
        // What HTTP/1.1's parser refuses in a target or a Host, and the
        // `http` crate takes in `:path` (raw UTF-8) and `:authority`
        // (`:g(`): it would route nowhere, or go upstream as a request
        // line no two servers read alike.
        Some(400)
    } else {
        None
    };
    let routed = match over_limit {
        Some(status) => crate::proxy::Routed::Refused(status),
        None => crate::proxy::route_to(cx, authority, path),
    };
    let (root, early) = match routed {
        // A proxied request's Host is checked (and logged) by the proxy.
        crate::proxy::Routed::Root(root) if request_host(&parts).is_err() => (root, Some(400)),
        crate::proxy::Routed::Root(root) => (root, None),
        crate::proxy::Routed::Refused(status) => (&cx.site.root, Some(status)),
        crate::proxy::Routed::Pool(pool, max_body) => {
            // The proxy reads the body itself, as it goes upstream.
            // Boxed: its state is large, and would otherwise make every
            // stream's future (a connection holds up to
            // `max_concurrent_streams` of them) as large, file or not.
            let answered = Box::pin(proxy::serve(
                cx,
                &parts,
                &method,
                body,
                respond,
                (pool, max_body, proxied, budget),
            ))
            .await;
            let logged = Logged {
                upstream: answered.note.server.as_deref(),
                upstream_error: answered.note.reason,
                ..logged
            };
            respond::log_request(
                cx,
                PROTOCOL,
                false,
                &logged,
                answered.status,
                answered.body_bytes,
                t0,
                wall,
            );
            return;
        }
    };

    // A body is read (and discarded) within the body limits whatever the
    // method, so that h2 checks it: content-length against the DATA
    // received, trailers without pseudo-headers (RFC 9113 §8.1.1); and
    // because curl 7.88 takes an answer that comes before the body ended
    // (then a reset with NO_ERROR, as RFC 9113 §8.1 asks) for an error.
    // Not CONNECT's, which never ends (a tunnel's bytes): 405 at once.
    let refused = if body.is_end_stream() || method == Method::Connect {
        None
    } else {
        drain(body, cx).await.err().map(Reply::text)
    };
    // `OPTIONS *` gets 405 like any other method; a GET whose `:path`
    // does not start with `/` gets 400 from the core.
    let reply = match (refused, early) {
        (Some(r), _) => r,
        (None, Some(status)) => Reply::text(status),
        (None, None) => decide(cx, root, &request(&method, &parts.uri, path, &conditionals)),
    };
    let status = reply.status();
    let body_len = if is_head { 0 } else { reply.body_len() };
    // What left before a stream broke off, for the access log.
    let mut body_sent = 0;
    let sent = match respond.send_response(reply_head(&reply, cx), body_len == 0) {
        Ok(mut send) if body_len > 0 => match &reply {
            Reply::File {
                file, start, len, ..
            } => send_file(&mut send, file, *start, *len, cx, budget, &mut body_sent).await,
            _ => {
                let mut text = Vec::with_capacity(32);
                reply.write_text_body(&mut text);
                send.send_data(Bytes::from(text), true)
                    .map(|()| body_len)
                    .map_err(|_| Broken::Gone)
            }
        },
        Ok(_) => Ok(0),
        Err(_) => Err(Broken::Gone),
    };
    let body_bytes = match sent {
        Ok(n) => {
            m.bytes_sent.inc_by(n);
            n
        }
        Err(Broken::Gone) => body_sent,
        Err(Broken::Timeout) => {
            m.timeouts
                .get_or_create(&ReasonLabel {
                    reason: "h2_stream_send",
                })
                .inc();
            m.count_h2_rejected("stream_send_timeout");
            body_sent
        }
        Err(Broken::Read) => body_sent,
    };
    respond::log_request(cx, PROTOCOL, false, &logged, status, body_bytes, t0, wall);
}

/// Why a request that `h2` let through is malformed (RFC 9113 §8.2.1,
/// §8.3.1), for a 400 before it is routed, static or proxied: a field
/// value with leading or trailing whitespace, a `:scheme` other than
/// `https` (every listener is TLS). `h2` itself ends the connection for
/// field names and values no HTTP/2 request may hold (upper case, NUL,
/// CR, LF), drops a fragment from `:path` (the `http` crate's URI) and
/// pseudo-header fields from trailers, and keeps `:scheme` only with an
/// `:authority`: those never reach this.
fn malformed(parts: &http::request::Parts) -> Option<&'static str> {
    let padded = |v: &[u8]| {
        matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t'))
    };
    if parts.headers.values().any(|v| padded(v.as_bytes())) {
        return Some("field value with leading or trailing whitespace");
    }
    if parts
        .uri
        .scheme_str()
        .is_some_and(|s| !s.eq_ignore_ascii_case("https"))
    {
        return Some(":scheme is not https");
    }
    None
}

/// The host a request names: its `:authority`, else its one `Host`
/// field; `Err` (the reason for the log) when `Host` fields contradict
/// `:authority` or each other (RFC 9113 §8.3.1). Static routes answer
/// that with 400; the proxy too, and it also needs the host itself.
fn request_host(parts: &http::request::Parts) -> Result<Option<&[u8]>, &'static str> {
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    let mut hosts = parts
        .headers
        .get_all(header::HOST)
        .iter()
        .map(HeaderValue::as_bytes);
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("duplicate_host");
    }
    match (authority, host) {
        // A Host that names another entity than :authority is malformed.
        (Some(a), Some(h)) if !a.eq_ignore_ascii_case(h) => Err("host_mismatch"),
        (Some(a), _) => Ok(Some(a)),
        (None, h) => Ok(h),
    }
}

/// The HTTP/2 response head of one of the core's replies.
fn reply_head(reply: &Reply, cx: &HttpCtx<'_>) -> Response<()> {
    let mut head = Response::new(());
    *head.status_mut() = http::StatusCode::from_u16(reply.status()).unwrap_or(http::StatusCode::OK);
    let headers = head.headers_mut();
    reply.headers(cx.gen, |name, value| {
        // Our own names and values: always valid (a redirect's query
        // came through h2's URI check).
        if let (Some(n), Ok(v)) = (response_header(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    });
    head
}

/// Answers a stream with a short text reply of `status`; the body bytes sent.
fn send_text(
    respond: &mut SendResponse<Bytes>,
    status: u16,
    is_head: bool,
    cx: &HttpCtx<'_>,
) -> u64 {
    let reply = Reply::text(status);
    let len = if is_head { 0 } else { reply.body_len() };
    match respond.send_response(reply_head(&reply, cx), len == 0) {
        Ok(mut send) if len > 0 => {
            let mut text = Vec::with_capacity(32);
            reply.write_text_body(&mut text);
            match send.send_data(Bytes::from(text), true) {
                Ok(()) => {
                    cx.shared.metrics.bytes_sent.inc_by(len);
                    len
                }
                Err(_) => 0,
            }
        }
        _ => 0,
    }
}

/// The core's request from a stream's pieces.
fn request<'a>(
    method: &'a Method,
    uri: &'a http::Uri,
    path: &'a [u8],
    c: &'a [Option<Vec<u8>>; 6],
) -> Request<'a> {
    Request {
        method,
        path,
        query: uri.query().map(str::as_bytes),
        pre: crate::respond::preconditions(c),
    }
}

/// Reads and discards a request body and its trailers within
/// `max_body_bytes` and `body_timeout`, giving the window back as it goes.
/// `Err(status)`; a body h2 found malformed has had its stream reset.
async fn drain(mut body: RecvStream, cx: &HttpCtx<'_>) -> Result<(), u16> {
    let limits = &cx.gen.config.limits;
    let mut total: u64 = 0;
    let read = async {
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|_| 400u16)?;
            total += chunk.len() as u64;
            let _ = body.flow_control().release_capacity(chunk.len());
            if total > limits.max_body_bytes {
                return Err(413);
            }
        }
        body.trailers().await.map(|_| ()).map_err(|_| 400)
    };
    tokio::time::timeout(limits.body_timeout, read)
        .await
        .unwrap_or(Err(408))
}

/// `n` bytes of `file` from `at` appended to `pool`: from the bytes the
/// open-file cache keeps, or read. The count appended, 0 past the end.
fn body_piece(file: &StaticFile, pool: &mut BytesMut, n: usize, at: u64) -> std::io::Result<usize> {
    match file.cached(at, n) {
        Some(piece) => {
            pool.extend_from_slice(piece);
            Ok(piece.len())
        }
        None => tlsgate_sys::fileread::pread_append(&file.file, pool, n, at),
    }
}

/// Sends `len` bytes of `file` from `start` in DATA frames, each chunk
/// read once the client's windows have room for it (reserved capacity)
/// and the send budgets have its bytes (see [`budget`]).
/// The send timeout bounds each wait for room, and also each record's
/// worth of progress (or the rest of the body): a client that opens its
/// windows a few bytes at a time, each just before the timeout, would
/// otherwise hold the stream and its buffer for as long as it likes.
/// Returns the bytes sent; `sent` counts them also when the stream
/// breaks off.
async fn send_file(
    send: &mut SendStream<Bytes>,
    file: &StaticFile,
    start: u64,
    len: u64,
    cx: &HttpCtx<'_>,
    budget: &SendBudget,
    sent: &mut u64,
) -> Result<u64, Broken> {
    let mut progress = SendProgress::new(cx.gen.config.limits.send_timeout);
    // Reads of whole records' worth of frames, within what the budgets
    // allow one read.
    let chunk = whole_frames(stream_send_buffer(&cx.gen.config.http2).min(budget.max_read()));
    let mut done: u64 = 0;
    while done < len {
        // A tail shorter than a frame goes with the chunk before it: read
        // apart, it became a frame sent a turn later, in a `writev` of its
        // own (607 bytes after every 1 MiB file).
        let want = match usize::try_from(len - done) {
            Ok(rest) if rest < chunk + FRAME_IN_RECORD && rest <= budget.max_read() => rest,
            Ok(rest) => rest.min(chunk),
            Err(_) => chunk,
        };
        let granted = progress.room(send, want).await?;
        let mut n = granted.min(want);
        if n < want && n >= chunk {
            // Room for the chunk, not its tail: h2 keeps the tail until
            // the client's window takes it (a frame at most).
            n = want;
        } else if n < want && n > FRAME_IN_RECORD {
            // A window's odd end waits for the next grant, not a small frame.
            n -= n % FRAME_IN_RECORD;
        }
        // The read's bytes are budgeted until h2 has written the last
        // frame cut from them; the stream waits here, holding no buffer,
        // while its connection's or worker's budget is spent. A read
        // goes into the spare capacity of a buffer of the worker's (see
        // [`chunks`]), not zero-filled first, given back with its budget.
        let held = budget.take(n).await.ok_or(Broken::Gone)?;
        let mut pool = chunks::buffer(n);
        let got = match body_piece(file, &mut pool, n, start + done) {
            Ok(0) | Err(_) => {
                // The head promised a length we cannot deliver.
                tracing::warn!(peer = %cx.peer(), "file shrank or failed while being sent; stream reset");
                send.send_reset(Reason::INTERNAL_ERROR);
                return Err(Broken::Read);
            }
            Ok(got) => got,
        };
        done += got as u64;
        progress.sent(got);
        cx.shared.metrics.count_body("userspace", got as u64);
        // One DATA frame per TLS record: a frame of 16384 bytes with its
        // 9-byte header would take a full record and a 9-byte one.
        let mut data = chunks::frames_of(pool, held);
        while data.len() > FRAME_IN_RECORD {
            let frame = data.split_to(FRAME_IN_RECORD);
            send.send_data(frame, false).map_err(|_| Broken::Gone)?;
        }
        send.send_data(data, done == len)
            .map_err(|_| Broken::Gone)?;
        *sent = done;
    }
    Ok(done)
}
