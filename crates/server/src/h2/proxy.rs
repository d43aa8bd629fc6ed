//! Proxied routes on an HTTP/2 stream: the request translated for
//! tlsgate-proxy's HTTP/1.1 upstreams (RFC 9113 §8.3: `:authority` as
//! Host, cookies joined, connection-specific fields never passed), its
//! body passed on as it comes with the client's window given back only
//! once the bytes are upstream, the response sent back in HEADERS and
//! DATA frames as the client's windows allow. A client's reset cancels
//! the exchange; an upstream failure after the head resets the stream,
//! never the connection.

use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{header, HeaderName, HeaderValue, Response, StatusCode};
use tlsgate_http1::{is_field_value, Method};
use tlsgate_metrics::ReasonLabel;
use tlsgate_proxy::{
    BodyRefused, Outcome, Pool, RequestBody, Responder, SendError, StreamRequest, CLIENT_CLOSED,
};
use tokio::time::{timeout_at, Instant};

use super::budget::SendBudget;
use super::{Broken, SendProgress, FRAME_IN_RECORD};
use crate::proxy::Proxied;
use crate::respond::HttpCtx;

/// How a proxied stream was answered, for the access log.
pub(super) struct Answered {
    pub status: u16,
    pub body_bytes: u64,
    pub note: Proxied,
}

/// A request the proxy does not pass on: the status it gets and the
/// reason logged.
struct Unfit(u16, &'static str);

/// Forwards a stream routed to `pool` and answers it, once one of its
/// connection's `proxied` places is free (`http2.max_proxied_streams`).
pub(super) async fn serve(
    cx: &HttpCtx<'_>,
    parts: &http::request::Parts,
    method: &Method,
    body: RecvStream,
    mut respond: SendResponse<Bytes>,
    (pool, max_body, proxied, budget): (&Arc<Pool>, u64, &tokio::sync::Semaphore, &SendBudget),
) -> Answered {
    let is_head = method == &Method::Head;
    let h = &parts.headers;
    // Cookies split across fields (RFC 9113 §8.2.3) go upstream as one.
    let cookie = super::joined_with(h, &header::COOKIE, b"; ", usize::MAX);
    let fields = match translate(parts, method, cookie.as_deref()) {
        Ok(f) => f,
        Err(Unfit(status, reason)) => {
            let bytes = super::send_text(&mut respond, status, is_head, cx);
            return Answered {
                status,
                body_bytes: bytes,
                note: Proxied {
                    server: None,
                    reason: Some(reason),
                },
            };
        }
    };
    let req = StreamRequest {
        method,
        target: fields.target,
        host: fields.host,
        fields: &fields.fields,
        content_length: fields.content_length,
        end_stream: body.is_end_stream(),
        conn: &cx.proxy,
        client_cert: cx.client.as_ref().map(|c| c.forwarded_header()),
        max_body,
    };
    let limits = &cx.gen.config.limits;
    // The body's side sends `100 Continue` (`Expect` is not passed on), the
    // response's side the rest: one handle, shared.
    let respond = Mutex::new(respond);
    let expects_continue = !req.end_stream
        && h.get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let mut body = StreamBody {
        continue_to: expects_continue.then_some(&respond),
        recv: body,
        taken: 0,
        chunk: Bytes::new(),
        total: 0,
        max: max_body,
        timeout: limits.body_timeout,
        deadline: None,
        ended: false,
    };
    let mut client = Stream {
        respond: &respond,
        send: None,
        progress: SendProgress::new(limits.send_timeout),
        budget,
    };
    // The stream waits for a place among its connection's proxied
    // streams (its body unread, its window not given back), or until the
    // client resets it.
    let place = tokio::select! {
        p = proxied.acquire() => p.ok(),
        () = client.cancelled() => None,
    };
    let outcome = match place {
        Some(_place) => tlsgate_proxy::forward_stream(pool, &req, &mut body, &mut client).await,
        None => Outcome::Refused {
            status: CLIENT_CLOSED,
            reason: SendError::Gone.reason(),
            server: None,
            body_done: false,
        },
    };
    // The request body is not read any further.
    drop(body);
    let m = &cx.shared.metrics;
    match outcome {
        Outcome::Relayed {
            status,
            body_bytes,
            server,
            ..
        } => {
            m.bytes_sent.inc_by(body_bytes);
            Answered {
                status,
                body_bytes,
                note: Proxied {
                    server: Some(server),
                    reason: None,
                },
            }
        }
        Outcome::Refused {
            status,
            reason,
            server,
            ..
        } => {
            crate::proxy::count_refusal(cx, pool, status, reason);
            // A client that cancelled gets nothing: its stream is gone.
            let body_bytes = if status == CLIENT_CLOSED {
                0
            } else {
                super::send_text(&mut lock(&respond), status, is_head, cx)
            };
            Answered {
                status,
                body_bytes,
                note: Proxied {
                    server,
                    reason: Some(reason),
                },
            }
        }
        Outcome::Aborted {
            status,
            body_bytes,
            server,
            reason,
        } => {
            m.bytes_sent.inc_by(body_bytes);
            if reason == SendError::Timeout.reason() {
                m.timeouts
                    .get_or_create(&ReasonLabel {
                        reason: "h2_stream_send",
                    })
                    .inc();
                m.count_h2_rejected("stream_send_timeout");
            }
            Answered {
                status,
                body_bytes,
                note: Proxied {
                    server: Some(server),
                    reason: Some(reason),
                },
            }
        }
    }
}

/// The pieces of the upstream head taken from a stream's request.
struct Translated<'a> {
    target: &'a [u8],
    host: &'a [u8],
    fields: Vec<(&'a str, &'a [u8])>,
    content_length: Option<u64>,
}

/// Checks a stream's request for what an HTTP/1.1 upstream must never
/// get, and takes its pieces (RFC 9113 §8.3.1).
fn translate<'a>(
    parts: &'a http::request::Parts,
    method: &Method,
    cookie: Option<&'a [u8]>,
) -> Result<Translated<'a>, Unfit> {
    // CONNECT (and extended CONNECT, RFC 8441, whose setting is not
    // offered) would need a tunnel over the stream: not proxied.
    if method == &Method::Connect {
        return Err(Unfit(405, "connect_refused"));
    }
    let h = &parts.headers;
    let host = super::request_host(parts)
        .map_err(|reason| Unfit(400, reason))?
        .ok_or(Unfit(400, "no_authority"))?;
    // Its syntax (a host, no userinfo) was checked before routing
    // (`serve_stream`); an empty Host names nothing to send upstream.
    if host.is_empty() {
        return Err(Unfit(400, "bad_authority"));
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or(&b""[..], |p| p.as_str().as_bytes());
    if !(target.first() == Some(&b'/') || target == b"*") {
        return Err(Unfit(400, "bad_path"));
    }
    let mut content_length: Option<u64> = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let n = std::str::from_utf8(v.as_bytes())
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(Unfit(400, "bad_content_length"))?;
        if content_length.is_some_and(|c| c != n) {
            return Err(Unfit(400, "bad_content_length"));
        }
        content_length = Some(n);
    }
    let mut fields = Vec::with_capacity(h.len() + 1);
    for (name, value) in h {
        if name == header::HOST || name == header::COOKIE {
            continue;
        }
        // CR, LF and NUL never reach an upstream (h2 refuses them too).
        if !is_field_value(value.as_bytes()) {
            return Err(Unfit(400, "bad_header_value"));
        }
        fields.push((name.as_str(), value.as_bytes()));
    }
    if let Some(c) = cookie {
        if !is_field_value(c) {
            return Err(Unfit(400, "bad_header_value"));
        }
        fields.push(("cookie", c));
    }
    Ok(Translated {
        target,
        host,
        fields,
        content_length,
    })
}

fn lock<'a>(respond: &'a Mutex<SendResponse<Bytes>>) -> MutexGuard<'a, SendResponse<Bytes>> {
    respond.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stream's request body as tlsgate-proxy reads it: within the route's
/// limit and the body timeout; each piece's window is given back once the
/// proxy asks for the next, i.e. once the piece is upstream.
struct StreamBody<'r> {
    /// `Expect: 100-continue` asked for, not yet answered: the interim
    /// response goes out when the proxy first asks for the body, once a
    /// server has the request head (as for HTTP/1.1 clients).
    continue_to: Option<&'r Mutex<SendResponse<Bytes>>>,
    recv: RecvStream,
    /// Bytes handed out and not yet given back to the client's window.
    taken: usize,
    chunk: Bytes,
    total: u64,
    max: u64,
    timeout: Duration,
    deadline: Option<Instant>,
    ended: bool,
}

fn refused(status: u16, reason: &'static str) -> BodyRefused {
    BodyRefused { status, reason }
}

impl RequestBody for StreamBody<'_> {
    async fn next(&mut self) -> Result<Option<&[u8]>, BodyRefused> {
        if let Some(respond) = self.continue_to.take() {
            let mut interim = Response::new(());
            *interim.status_mut() = StatusCode::CONTINUE;
            if lock(respond).send_informational(interim).is_err() {
                return Err(refused(400, "client_gone"));
            }
        }
        if self.taken > 0 {
            let _ = self.recv.flow_control().release_capacity(self.taken);
            self.taken = 0;
        }
        if self.ended {
            return Ok(None);
        }
        let timeout = self.timeout;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + timeout);
        match timeout_at(deadline, self.recv.data()).await {
            Err(_) => Err(refused(408, "body_timeout")),
            Ok(None) => {
                // Trailers are checked by h2 and dropped: the upstream
                // request is chunked without them, as for HTTP/1.1.
                match timeout_at(deadline, self.recv.trailers()).await {
                    Ok(Ok(_)) => {
                        self.ended = true;
                        Ok(None)
                    }
                    Ok(Err(_)) => Err(refused(400, "bad_body")),
                    Err(_) => Err(refused(408, "body_timeout")),
                }
            }
            // Reset by the client, or malformed (DATA beyond content-length).
            Ok(Some(Err(_))) => Err(refused(400, "client_gone")),
            Ok(Some(Ok(data))) => {
                self.taken = data.len();
                self.total += data.len() as u64;
                if self.total > self.max {
                    return Err(refused(413, "body_too_large"));
                }
                self.chunk = data;
                Ok(Some(&self.chunk))
            }
        }
    }
}

/// The response side of a stream, as tlsgate-proxy sends through it.
struct Stream<'r> {
    respond: &'r Mutex<SendResponse<Bytes>>,
    /// Once the head is sent.
    send: Option<SendStream<Bytes>>,
    /// The send timeout's rule, as for files: a client opening its
    /// window a byte at a time holds neither the stream nor its upstream
    /// connection.
    progress: SendProgress,
    /// The connection's and worker's send budgets, as for files: what
    /// h2 holds of proxied answers for a client that does not read counts
    /// against them too.
    budget: &'r SendBudget,
}

impl Responder for Stream<'_> {
    fn head(
        &mut self,
        status: u16,
        fields: &mut dyn Iterator<Item = (&str, &[u8])>,
        end: bool,
    ) -> Result<(), SendError> {
        let mut head = Response::new(());
        // The upstream's status was parsed as three digits.
        *head.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        let headers = head.headers_mut();
        for (name, value) in fields {
            // Names go out in h2's lower case; a field h2 cannot carry
            // (none the strict parser lets through) is left out.
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                headers.append(n, v);
            }
        }
        let send = lock(self.respond)
            .send_response(head, end)
            .map_err(|_| SendError::Gone)?;
        self.send = Some(send);
        Ok(())
    }

    async fn data(&mut self, data: Vec<u8>, end: bool) -> Result<(), SendError> {
        let Some(send) = self.send.as_mut() else {
            return Err(SendError::Gone);
        };
        let mut data = Bytes::from(data);
        if data.is_empty() {
            return send.send_data(data, end).map_err(|_| SendError::Gone);
        }
        while !data.is_empty() {
            let granted = match self.progress.room(send, data.len()).await {
                Ok(n) => n,
                Err(Broken::Timeout) => return Err(SendError::Timeout),
                Err(_) => return Err(SendError::Gone),
            };
            let piece = data.split_to(granted.min(data.len()));
            let held = self.budget.take(piece.len()).await.ok_or(SendError::Gone)?;
            let mut piece = super::budget::budgeted(piece, held);
            self.progress.sent(piece.len());
            // One DATA frame per TLS record (see `send_file`).
            while piece.len() > FRAME_IN_RECORD {
                let frame = piece.split_to(FRAME_IN_RECORD);
                send.send_data(frame, false).map_err(|_| SendError::Gone)?;
            }
            send.send_data(piece, end && data.is_empty())
                .map_err(|_| SendError::Gone)?;
        }
        Ok(())
    }

    async fn cancelled(&mut self) {
        // Before the head, the stream's reset shows on the response
        // handle; after it, on the body's.
        let _ = match self.send.as_mut() {
            Some(send) => poll_fn(|c| send.poll_reset(c)).await,
            None => poll_fn(|c| lock(self.respond).poll_reset(c)).await,
        };
    }

    fn abort(&mut self) {
        match self.send.as_mut() {
            Some(send) => send.send_reset(Reason::INTERNAL_ERROR),
            None => lock(self.respond).send_reset(Reason::INTERNAL_ERROR),
        }
    }
}
