//! One proxied exchange: the request head rewritten for the upstream
//! (hop-by-hop fields out, forwarding fields in), the request body
//! streamed with backpressure (re-framed when it was chunked or of unknown
//! length), bounded retries to other servers, the response head checked
//! and rewritten, its body streamed back. Nothing is buffered whole; the
//! slower side sets the pace.
//!
//! The exchange with the upstream ([`exchange`], [`UpBody`]) is the same
//! whatever protocol the client speaks; [`forward`] puts an HTTP/1.1
//! client connection on it, [`forward_stream`] an HTTP/2 stream (or any
//! client side that sends a response as a head and then body pieces).

use std::future::{poll_fn, Future};
use std::io::{self, Write as _};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tlsgate_config::{PassedFields, DROPPED_FIELDS, PASSABLE_FIELDS};
use tlsgate_http1::{
    end_head, is_field_value, list_elements, parse_response, with_date, write_header,
    write_header_u64, write_status_line, BodyFraming, ChunkedDecoder, Method, RequestHead,
    ResponseFraming, ResponseHead, Version,
};
use tlsgate_tls::Turn;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::timeout_at;

use crate::client::ClientConn;
use crate::conn::UpstreamConn;
use crate::error::Failure;
use crate::path::{normalize as normalize_path, BadPath};
use crate::pool::{Lease, Pool};

/// Bytes moved per read, each way.
const CHUNK: usize = 64 * 1024;
/// Largest request body kept for a retry (sent again to another server).
const REPLAY_MAX: usize = 64 * 1024;
/// Room made for each read of a response head.
const READ_RESERVE: usize = 16 * 1024;
/// Bytes of interim (1xx) response heads skipped before the final one:
/// any number of them (a `102 Processing` every few seconds of a long
/// request), but an upstream cannot keep the proxy parsing for ever; the
/// response timeout bounds their time.
const MAX_INTERIM_BYTES: usize = 1024 * 1024;
/// Limits on an upstream's response head.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
const MAX_RESPONSE_HEADERS: usize = 200;
/// Trailer bytes accepted on a chunked body (then dropped).
const MAX_TRAILER: usize = 16 * 1024;
/// The status logged for a request whose client went away before any
/// response (nginx's convention); never sent.
pub const CLIENT_CLOSED: u16 = 499;

/// The client side of an exchange: the connection's byte stream.
pub trait Downstream {
    /// Reads application bytes; 0 is end of stream.
    fn read(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Writes all of `data`.
    fn write_all(&mut self, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends what is queued.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// One turn of a WebSocket tunnel: reads into `buf` (when given) or
    /// takes bytes of `data` to send, whichever the client allows first
    /// (`Read(0)`: its clean close). Must be cancel-safe: what it read or
    /// took is in its answer (see `tlsgate_tls::TlsConnection::relay`).
    fn relay(
        &mut self,
        buf: Option<&mut [u8]>,
        data: &[u8],
    ) -> impl Future<Output = io::Result<Turn>> + Send;
    /// Ends what goes to the client (close_notify and FIN); what it still
    /// sends can be read.
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}

/// A request body refused on the client's side: the status it gets and
/// the reason logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyRefused {
    /// 400, 408, 413 (or 502 when the client is gone).
    pub status: u16,
    /// For the access log and metrics.
    pub reason: &'static str,
}

/// A request body as the client sends it, already decoded from its
/// protocol's framing.
pub trait RequestBody: Send {
    /// The next bytes of the body, `None` at its end. The bytes of the
    /// previous call have been written upstream when this is called again
    /// (an HTTP/2 side gives the flow-control window back then).
    fn next(&mut self) -> impl Future<Output = Result<Option<&[u8]>, BodyRefused>> + Send;
}

/// Why a response could not be sent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The client reset the stream or left.
    Gone,
    /// The client did not make room within the send timeout.
    Timeout,
}

impl SendError {
    /// Stable name for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Gone => "client_gone",
            Self::Timeout => "send_timeout",
        }
    }
}

/// A client side that takes a response as a head and then body pieces,
/// each sent as its flow control allows (an HTTP/2 stream).
pub trait Responder: Send {
    /// Sends the response head; `end` when no body follows. The fields
    /// are the upstream's, hop-by-hop ones removed, names as the upstream
    /// spelled them, framing as `content-length` when the length is known.
    fn head(
        &mut self,
        status: u16,
        fields: &mut dyn Iterator<Item = (&str, &[u8])>,
        end: bool,
    ) -> Result<(), SendError>;
    /// Sends body bytes once the client has room for them; `end` with the last.
    fn data(
        &mut self,
        data: Vec<u8>,
        end: bool,
    ) -> impl Future<Output = Result<(), SendError>> + Send;
    /// Completes when the client cancels the request (resets the stream).
    fn cancelled(&mut self) -> impl Future<Output = ()> + Send;
    /// Ends a response that broke off after its head: the client must not
    /// take it for complete.
    fn abort(&mut self);
}

/// A request to forward and what the connection knows about it.
pub struct Request<'a> {
    /// The parsed head (framing already checked by the strict parser).
    pub head: &'a RequestHead,
    /// The client connection: its address, and its private upstream
    /// connections.
    pub conn: &'a ClientConn,
    /// `X-Forwarded-Client-Cert` value of a verified client certificate.
    pub client_cert: Option<String>,
    /// Request body limit of the route.
    pub max_body: u64,
    /// Time allowed to receive the request body.
    pub body_timeout: Duration,
    /// Time a write to the client may wait.
    pub send_timeout: Duration,
    /// Whether the client connection may stay open after this exchange.
    pub keep_alive: bool,
}

/// A request that came as an HTTP/2 stream (RFC 9113 §8.3), in the
/// pieces the upstream head is made of.
pub struct StreamRequest<'a> {
    /// `:method`.
    pub method: &'a Method,
    /// `:path` (origin-form, or `*`).
    pub target: &'a [u8],
    /// `:authority` (or the Host field of a client that sent no authority).
    pub host: &'a [u8],
    /// The other fields, cookies already joined into one (RFC 9113 §8.2.3).
    pub fields: &'a [(&'a str, &'a [u8])],
    /// `content-length`, if the client sent one.
    pub content_length: Option<u64>,
    /// Whether the request has no body at all (END_STREAM on its HEADERS).
    pub end_stream: bool,
    /// The client connection: its address, and its private upstream
    /// connections.
    pub conn: &'a ClientConn,
    /// `X-Forwarded-Client-Cert` value of a verified client certificate.
    pub client_cert: Option<String>,
    /// Request body limit of the route.
    pub max_body: u64,
}

/// How an exchange ended.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing was sent to the client: answer `status` (and close unless
    /// `body_done`, i.e. the request body was read whole). `status` is
    /// [`CLIENT_CLOSED`] when the client cancelled: nothing to send then.
    Refused {
        /// 400, 405, 408, 413, 499, 502, 503 or 504.
        status: u16,
        /// Why, for the access log and metrics.
        reason: &'static str,
        /// The server tried last, if any.
        server: Option<String>,
        /// The request body was read to its end.
        body_done: bool,
    },
    /// The response was relayed whole.
    Relayed {
        /// The upstream's status.
        status: u16,
        /// Body bytes sent to the client.
        body_bytes: u64,
        /// The server that answered.
        server: String,
        /// Whether the client connection may stay open.
        keep_client: bool,
    },
    /// The response broke off after its head went out: drop the client
    /// connection without a clean close (HTTP/1.1) or reset the stream
    /// (HTTP/2; the responder has done it).
    Aborted {
        /// The upstream's status.
        status: u16,
        /// Body bytes sent to the client.
        body_bytes: u64,
        /// The server that answered.
        server: String,
        /// Why.
        reason: &'static str,
    },
}

/// Hop-by-hop fields (RFC 9110 §7.6.1), never passed on either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request fields dropped besides those: framing we redo, and
/// credentials meant for the proxy. The client's forwarding fields go
/// too ([`client_may_not_send`]).
const REQUEST_DROP: &[&str] = &["proxy-authorization", "content-length", "host", "expect"];

/// Fields only the proxy, or a trusted CDN before it, may send: those of
/// the proxy's own ([`tlsgate_config::DROPPED_FIELDS`], with the two that
/// make a backend serve another path than the one routed), and the
/// client address, scheme and prefix fields that backends take from
/// proxies ([`tlsgate_config::PASSABLE_FIELDS`]) unless the listener
/// passes them (in their `-` spelling only: a CDN that sets
/// `CF-Connecting-IP` passes on a client's `CF_Connecting_IP`).
fn client_may_not_send(name: &str, passed: PassedFields) -> bool {
    DROPPED_FIELDS
        .iter()
        .any(|f| same_name_to_a_gateway(name, f))
        || PASSABLE_FIELDS.iter().enumerate().any(|(i, f)| {
            same_name_to_a_gateway(name, f) && !(passed.passes(i) && name.eq_ignore_ascii_case(f))
        })
}

/// Response fields dropped besides the hop-by-hop ones.
const RESPONSE_DROP: &[&str] = &["proxy-authenticate", "content-length"];

/// Names listed in `Connection` fields (lower case): hop-by-hop too.
fn connection_named<'h>(headers: impl Iterator<Item = (&'h str, &'h [u8])>) -> Vec<Vec<u8>> {
    headers
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| list_elements(v).map(<[u8]>::to_ascii_lowercase))
        .collect()
}

fn dropped(name: &str, fixed: &[&str], named: &[Vec<u8>]) -> bool {
    HOP_BY_HOP
        .iter()
        .chain(fixed)
        .any(|f| same_name_to_a_gateway(name, f))
        || named
            .iter()
            .any(|n| name.as_bytes().eq_ignore_ascii_case(n))
}

/// `name` is `fixed` (lower case) in any case, and with `_` for `-`: CGI,
/// WSGI, Rack and PHP gateways turn both into the same variable
/// (`HTTP_X_FORWARDED_FOR`), so a client's `X_Forwarded_For` would pass
/// for the proxy's own field.
fn same_name_to_a_gateway(name: &str, fixed: &str) -> bool {
    name.len() == fixed.len()
        && name.bytes().zip(fixed.bytes()).all(|(n, f)| {
            let n = match n {
                b'_' => b'-',
                n => n.to_ascii_lowercase(),
            };
            n == f
        })
}

/// The upstream's response fields a client may see.
fn response_fields(resp: &ResponseHead) -> impl Iterator<Item = (&str, &[u8])> + '_ {
    let named = connection_named(resp.headers());
    resp.headers()
        .filter(move |(name, _)| !dropped(name, RESPONSE_DROP, &named))
}

/// Whether a retry may send the request again (RFC 9110 §9.2.2).
fn idempotent(m: &Method) -> bool {
    matches!(
        m,
        Method::Get | Method::Head | Method::Options | Method::Trace | Method::Put | Method::Delete
    )
}

/// The protocol of a WebSocket upgrade request (RFC 6455 §4.1: GET,
/// HTTP/1.1, `Upgrade: websocket`, `Connection: upgrade`, no body).
fn websocket_upgrade(head: &RequestHead) -> Option<&[u8]> {
    let upgrade = head.header("upgrade")?;
    let asks = connection_named(head.headers())
        .iter()
        .any(|o| o == b"upgrade");
    (asks
        && upgrade.eq_ignore_ascii_case(b"websocket")
        && head.method() == &Method::Get
        && head.version() == Version::Http11
        && head.body() == BodyFraming::None)
        .then_some(upgrade)
}

/// What the upstream request head is made of, whatever protocol carried
/// the request.
struct Outgoing<'a, F> {
    method: &'a Method,
    /// Origin-form (or `*`).
    target: &'a [u8],
    host: &'a [u8],
    /// The client's fields, each time anew (read twice).
    fields: F,
    /// `Via`'s entry for the client's protocol.
    via: &'static [u8],
    /// How the body goes upstream.
    body: BodyFraming,
    websocket: Option<&'a [u8]>,
    peer: SocketAddr,
    /// The client connection (its server name, for a missing Host).
    conn: &'a ClientConn,
    client_cert: Option<&'a str>,
}

/// The request head as sent upstream.
fn upstream_head<'h, F, I>(o: &Outgoing<'_, F>) -> Vec<u8>
where
    F: Fn() -> I,
    I: Iterator<Item = (&'h str, &'h [u8])>,
{
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(o.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(o.target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // HTTP/1.1 requires a Host (RFC 9112 §3.2) and an empty one is
    // refused by most servers (nginx: 400).
    // X-Forwarded-Host and Forwarded carry only what the client sent.
    let host = o.host;
    if host.is_empty() {
        write_header(&mut out, "Host", &o.conn.fallback_host());
    } else {
        write_header(&mut out, "Host", host);
    }
    let named = connection_named((o.fields)());
    for (name, value) in (o.fields)() {
        // The strict parser (and h2's own checks) already refused CR, LF
        // and NUL in values; checked again here so a change there cannot
        // reach an upstream.
        if !dropped(name, REQUEST_DROP, &named)
            && !client_may_not_send(name, o.conn.passed)
            && is_field_value(value)
        {
            write_header(&mut out, name, value);
        }
    }
    let ip = o.peer.ip();
    // The address as text, formatted once into a stack buffer.
    let mut ip_buf = [0u8; 48];
    let ip_text = {
        let mut w = std::io::Cursor::new(&mut ip_buf[..]);
        // 48 bytes hold any IPv4 or IPv6 address.
        let _ = write!(w, "{ip}");
        let n = usize::try_from(w.position()).unwrap_or(0);
        ip_buf.get(..n).unwrap_or_default()
    };
    write_header(&mut out, "X-Forwarded-For", ip_text);
    write_header(&mut out, "X-Real-IP", ip_text);
    write_header(&mut out, "X-Forwarded-Proto", b"https");
    if !host.is_empty() {
        write_header(&mut out, "X-Forwarded-Host", host);
    }
    let mut fwd = Vec::with_capacity(64 + host.len());
    fwd.extend_from_slice(b"for=");
    match ip {
        std::net::IpAddr::V4(_) => fwd.extend_from_slice(ip_text),
        std::net::IpAddr::V6(_) => {
            fwd.extend_from_slice(b"\"[");
            fwd.extend_from_slice(ip_text);
            fwd.extend_from_slice(b"]\"");
        }
    }
    fwd.extend_from_slice(b";proto=https");
    if !host.is_empty() {
        fwd.extend_from_slice(b";host=\"");
        // Borrowed, not copied, when it is UTF-8 (as it always is in practice).
        fwd.extend_from_slice(String::from_utf8_lossy(host).as_bytes());
        fwd.push(b'"');
    }
    write_header(&mut out, "Forwarded", &fwd);
    write_header(&mut out, "Via", o.via);
    if let Some(cert) = o.client_cert {
        if is_field_value(cert.as_bytes()) {
            write_header(&mut out, "X-Forwarded-Client-Cert", cert.as_bytes());
        }
    }
    if let Some(protocol) = o.websocket {
        write_header(&mut out, "Upgrade", protocol);
        write_header(&mut out, "Connection", b"upgrade");
    }
    match o.body {
        BodyFraming::None => {}
        BodyFraming::ContentLength(n) => write_header_u64(&mut out, "Content-Length", n),
        BodyFraming::Chunked => write_header(&mut out, "Transfer-Encoding", b"chunked"),
    }
    end_head(&mut out);
    out
}

/// The head an HTTP/2 stream's request goes upstream with, and how its
/// body is framed there (chunked when the client gave no length); as
/// [`upstream_request_head`] otherwise. Public for the fuzz targets.
pub fn upstream_stream_head(r: &StreamRequest<'_>) -> Result<(Vec<u8>, BodyFraming), BadPath> {
    // The path the route was chosen by.
    let target = normalize_path(r.target)?;
    let framing = match (r.content_length, r.end_stream) {
        (Some(n), _) => BodyFraming::ContentLength(n),
        (None, true) => BodyFraming::None,
        // A body of unknown length goes upstream chunked.
        (None, false) => BodyFraming::Chunked,
    };
    let head = upstream_head(&Outgoing {
        method: r.method,
        target: &target,
        host: r.host,
        fields: || r.fields.iter().copied(),
        via: b"2 tlsgate",
        body: framing,
        websocket: None,
        peer: r.conn.peer,
        conn: r.conn,
        client_cert: r.client_cert.as_deref(),
    });
    Ok((head, framing))
}

/// The head an HTTP/1.x request goes upstream with (hop-by-hop fields
/// dropped, forwarding fields the proxy's own, the path as routed, the
/// body framed as the client framed it); `BadPath` for a path that is
/// refused (see [`crate::path`]). Not for CONNECT, which [`forward`]
/// refuses before. Public for the fuzz targets.
pub fn upstream_request_head(r: &Request<'_>) -> Result<Vec<u8>, BadPath> {
    let head = r.head;
    let target = head.target();
    // absolute-form: the upstream gets origin-form and the authority as Host.
    let origin_form;
    let target = if target.first() == Some(&b'/') || target == b"*" {
        target
    } else {
        let mut t = head.path().to_vec();
        if let Some(q) = head.query() {
            t.push(b'?');
            t.extend_from_slice(q);
        }
        origin_form = t;
        &origin_form
    };
    // The path the route was chosen by.
    let target = normalize_path(target)?;
    Ok(upstream_head(&Outgoing {
        method: head.method(),
        target: &target,
        host: head.host().unwrap_or_default(),
        fields: || head.headers(),
        via: match head.version() {
            Version::Http10 => b"1.0 tlsgate",
            Version::Http11 => b"1.1 tlsgate",
        },
        body: head.body(),
        websocket: websocket_upgrade(head),
        peer: r.conn.peer,
        conn: r.conn,
        client_cert: r.client_cert.as_deref(),
    }))
}

/// The request as the exchange sends it, whatever protocol carried it.
struct Prepared<'a> {
    head: Vec<u8>,
    method: &'a Method,
    /// How the body goes upstream.
    framing: BodyFraming,
    /// The whole body when it is in memory (then it can be sent again).
    replay: Option<&'a [u8]>,
    /// The hash key for `balance = "hash"`.
    key: Option<u64>,
    /// A WebSocket upgrade was asked for (a 101 may come).
    upgrade: bool,
    /// The client side can take the response while it still sends the
    /// body (an HTTP/2 stream): an early answer does not end the upload.
    duplex: bool,
    /// The client connection it comes from.
    conn: &'a ClientConn,
}

/// An upstream's answer: its head read, its body still to come.
struct Answer<'p> {
    lease: Lease<'p>,
    resp: ResponseHead,
    /// Bytes read past the head.
    ubuf: Vec<u8>,
    /// The request body went upstream whole.
    body_done: bool,
    /// The rest of the body, to send while the answer is relayed (an
    /// early answer on a duplex exchange).
    upload: Option<Upload>,
    server: String,
}

/// A failure and the server it happened on.
struct Failed {
    failure: Failure,
    server: Option<usize>,
}

/// The Content-Length a bodiless answer passes on: HEAD and 304 answers
/// keep the length they describe, as one value; 1xx and 204 answers carry
/// none (RFC 9110 §8.6), whatever the server sent (`0` passes the parser).
fn described_length(resp: &ResponseHead) -> Option<u64> {
    let status = resp.status();
    if status < 200 || status == 204 {
        return None;
    }
    resp.declared_length()
}

/// Whether the connection may serve another request after this answer,
/// as far as its head tells. Not after a bodiless answer (to a HEAD, a
/// 304) whose head describes a body (a length above 0, or chunked): a
/// server that sends that body anyway may send it after every check the
/// idle pool makes, and the next request on the connection, perhaps
/// another client's, would read it as its response.
fn may_reuse(resp: &ResponseHead) -> bool {
    let describes_a_body =
        resp.declared_length().is_some_and(|n| n > 0) || resp.header("transfer-encoding").is_some();
    resp.keep_alive() && !(resp.framing() == ResponseFraming::None && describes_a_body)
}

fn refused(status: u16, reason: &'static str, server: Option<String>, body_done: bool) -> Outcome {
    Outcome::Refused {
        status,
        reason,
        server,
        body_done,
    }
}

/// Tries again after stale keep-alive connections, beyond `retries`: a
/// server that closed its idle connections may have closed several.
const STALE_RETRIES: usize = 2;

/// Sends `p` to a server of `pool` (retrying as allowed) with the body
/// from `body`, and reads the final response head.
async fn exchange<'p, B: RequestBody>(
    pool: &'p Pool,
    p: &Prepared<'_>,
    body: &mut B,
    deadline: Option<Instant>,
) -> Result<Answer<'p>, Outcome> {
    let may_retry_sent = idempotent(p.method) && p.replay.is_some();
    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<Failed> = None;
    let mut attempts = 1 + pool.cfg.retries as usize;
    // Tries again on a stale keep-alive connection (which took nothing of
    // the request) are not among the `retries`, up to this many.
    let mut stale_left = STALE_RETRIES;
    let mut stale = |attempts: &mut usize| {
        if stale_left > 0 {
            stale_left -= 1;
            *attempts += 1;
        }
    };
    while attempts > 0 {
        attempts -= 1;
        let Some(mut lease) = pool.choose(&tried, p.key) else {
            break;
        };
        // Counted against the server whose try failed (the last one, also
        // when a stale keep-alive connection sends it back to the same).
        if let Some(failed_on) = last.as_ref().and_then(|f| f.server) {
            pool.count_retry(failed_on);
        }
        tried.push(lease.server);
        pool.count_request(lease.server);
        let server_idx = lease.server;
        let server_name = || pool.servers.get(server_idx).map(|s| s.cfg.address.clone());
        // `connect` bounds its wait in the server's queue (`queue_timeout`)
        // and the connect itself (`connect_timeout`) each; this, the
        // exchange's `deadline` over both.
        if let Err(f) = within(
            deadline,
            pool.cfg.queue_timeout + pool.cfg.connect_timeout,
            Failure::ConnectTimeout,
            pool.connect(&mut lease, p.conn),
        )
        .await
        {
            pool.failed(lease.server, f);
            last = Some(Failed {
                failure: f,
                server: Some(lease.server),
            });
            if f.before_sending() {
                continue;
            }
            break;
        }
        let Some(conn) = lease.conn.as_mut() else {
            break;
        };
        let reused = conn.reused;
        let sent_at = Instant::now();
        let wrote = within(
            deadline,
            pool.cfg.idle_timeout,
            Failure::IdleTimeout,
            async {
                // The head, with a replayable body, in one write.
                match p.replay {
                    Some(b) if !b.is_empty() => {
                        let mut first = Vec::with_capacity(p.head.len() + b.len());
                        first.extend_from_slice(&p.head);
                        first.extend_from_slice(b);
                        conn.stream.write_all(&first).await
                    }
                    _ => conn.stream.write_all(&p.head).await,
                }
                .map_err(|_| Failure::Reset)?;
                conn.stream.flush().await.map_err(|_| Failure::Reset)
            },
        )
        .await;
        if let Err(f) = wrote {
            if !reused {
                pool.failed(lease.server, f);
            }
            last = Some(Failed {
                failure: f,
                server: Some(lease.server),
            });
            if reused {
                // A keep-alive connection the server had closed: nothing of
                // the request was taken, so any request may go again, to
                // the same server on a new connection.
                tried.pop();
                stale(&mut attempts);
                continue;
            }
            if may_retry_sent {
                continue;
            }
            break;
        }
        let mut body_done = p.replay.is_some();
        // What the upstream sent before the body was done (an early answer).
        let mut early = Vec::new();
        let mut upload = Upload::new(p.framing);
        let mut rest_to_send = false;
        if !body_done {
            match send_body(body, &mut upload, conn, pool, deadline, &mut early).await {
                Ok(()) => body_done = true,
                Err(BodyError::Client(r)) => {
                    return Err(refused(r.status, r.reason, server_name(), false));
                }
                // The upstream stopped taking the body: it may have answered.
                Err(BodyError::Upstream(f)) => {
                    tracing::debug!(pool = %pool.name(), "request body not taken: {}", f.reason());
                }
                // A duplex client goes on sending while the answer is
                // relayed. Otherwise neither connection can go on: the
                // upstream's is not reused, the client's closes after the
                // answer.
                Err(BodyError::Answered) => {
                    tracing::debug!(pool = %pool.name(), "upstream answered before the request body ended");
                    rest_to_send = p.duplex;
                }
            }
        }
        let response = read_response(
            conn,
            p.method == &Method::Head,
            p.upgrade,
            pool,
            deadline,
            early,
        )
        .await;
        let (resp, ubuf) = match response {
            Ok(x) => x,
            Err(f) => {
                if !(reused && f == Failure::Reset) {
                    pool.failed(lease.server, f);
                }
                last = Some(Failed {
                    failure: f,
                    server: Some(lease.server),
                });
                if f == Failure::Reset && may_retry_sent {
                    // The request is gone with the connection: send it again
                    // (a stale keep-alive one: to the same server).
                    if reused {
                        tried.pop();
                        stale(&mut attempts);
                    }
                    continue;
                }
                return Err(refused(f.status(), f.reason(), server_name(), body_done));
            }
        };
        pool.succeeded(lease.server, sent_at.elapsed());
        return Ok(Answer {
            lease,
            resp,
            ubuf,
            body_done,
            upload: rest_to_send.then_some(upload),
            server: server_name().unwrap_or_default(),
        });
    }
    Err(match last {
        Some(Failed { failure, server }) => {
            let server = server
                .and_then(|i| pool.servers.get(i))
                .map(|s| s.cfg.address.clone());
            // Nothing was taken from the client's body unless it was in memory.
            refused(
                failure.status(),
                failure.reason(),
                server,
                p.replay.is_some(),
            )
        }
        None => refused(503, Failure::NoServer.reason(), None, p.replay.is_some()),
    })
}

/// Forwards one HTTP/1.x request through `pool` and relays the answer.
/// `inbuf` holds bytes read after the head (the body's start, pipelined
/// requests); what follows this request's body stays in it. `out` holds
/// responses not yet sent to the client; it is sent first.
pub async fn forward<D: Downstream + Send>(
    pool: &Pool,
    client: &mut D,
    inbuf: &mut Vec<u8>,
    out: &mut Vec<u8>,
    r: &Request<'_>,
) -> Outcome {
    let t0 = Instant::now();
    let deadline = pool.cfg.total_timeout.map(|d| t0 + d);
    let head = r.head;
    if matches!(head.method(), Method::Connect) {
        // Closed after: what follows a CONNECT (its body, or the bytes of
        // the tunnel the client expects) is never read as a request.
        return refused(405, "connect_refused", None, false);
    }
    if let BodyFraming::ContentLength(n) = head.body() {
        if n > r.max_body {
            return refused(413, "body_too_large", None, false);
        }
    }
    if !out.is_empty() && send(client, out, r.send_timeout, None).await.is_err() {
        return refused(502, "client_gone", None, false);
    }
    // A body already here in full is taken now: it can be sent again to
    // another server, and whatever happens it is never read as a request.
    let replay: Option<Vec<u8>> = match head.body() {
        BodyFraming::None => Some(Vec::new()),
        BodyFraming::ContentLength(n) if n as usize <= REPLAY_MAX && n as usize <= inbuf.len() => {
            Some(inbuf.drain(..n as usize).collect())
        }
        _ => None,
    };
    let expects_continue = head.expects_continue() && replay.is_none();
    let Ok(upstream_head) = upstream_request_head(r) else {
        return refused(400, "bad_path", None, false);
    };
    let prepared = Prepared {
        head: upstream_head,
        method: head.method(),
        framing: head.body(),
        replay: replay.as_deref(),
        key: pool.hash_key(r.conn.peer.ip(), |name| {
            head.header(name).map(<[u8]>::to_vec)
        }),
        upgrade: websocket_upgrade(head).is_some(),
        duplex: false,
        conn: r.conn,
    };
    let mut body = Http1Body {
        client: &mut *client,
        inbuf: &mut *inbuf,
        framing: head.body(),
        left: match head.body() {
            BodyFraming::ContentLength(n) => n,
            _ => 0,
        },
        decoder: ChunkedDecoder::new(r.max_body, MAX_TRAILER),
        ended: false,
        buf: Vec::new(),
        data: Vec::new(),
        deadline: None,
        body_timeout: r.body_timeout,
        expects_continue,
        send_timeout: r.send_timeout,
    };
    let answer = match exchange(pool, &prepared, &mut body, deadline).await {
        Ok(a) => a,
        Err(refusal) => return refusal,
    };
    if answer.resp.status() == 101 {
        return tunnel(client, out, inbuf, r, pool, answer).await;
    }
    relay(client, out, r, pool, answer, deadline).await
}

/// Forwards one request that came as an HTTP/2 stream through `pool`,
/// its body from `body`, its response through `client`. A client that
/// cancels ends the exchange at once: the upstream connection is closed,
/// never reused half-way.
pub async fn forward_stream<B: RequestBody, S: Responder>(
    pool: &Pool,
    r: &StreamRequest<'_>,
    body: &mut B,
    client: &mut S,
) -> Outcome {
    let t0 = Instant::now();
    let deadline = pool.cfg.total_timeout.map(|d| t0 + d);
    // CONNECT (and extended CONNECT, RFC 8441, whose setting is not
    // offered) would need a tunnel over the stream: not proxied.
    if matches!(r.method, Method::Connect) {
        // Closed after: what follows a CONNECT (its body, or the bytes of
        // the tunnel the client expects) is never read as a request.
        return refused(405, "connect_refused", None, false);
    }
    if r.content_length.is_some_and(|n| n > r.max_body) {
        return refused(413, "body_too_large", None, false);
    }
    let Ok((head, framing)) = upstream_stream_head(r) else {
        return refused(400, "bad_path", None, false);
    };
    let prepared = Prepared {
        head,
        method: r.method,
        framing,
        replay: r.end_stream.then_some(&[][..]),
        key: pool.hash_key(r.conn.peer.ip(), |name| {
            r.fields
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_vec())
        }),
        upgrade: false,
        duplex: true,
        conn: r.conn,
    };
    let answer = tokio::select! {
        a = exchange(pool, &prepared, body, deadline) => match a {
            Ok(a) => a,
            Err(refusal) => return refusal,
        },
        () = client.cancelled() => {
            return refused(CLIENT_CLOSED, SendError::Gone.reason(), None, false);
        }
    };
    relay_stream(client, body, pool, answer, (deadline, r.conn)).await
}

/// Runs `fut` under `per`, and under the exchange's `deadline` when set.
async fn within<T>(
    deadline: Option<Instant>,
    per: Duration,
    on_timeout: Failure,
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let now = Instant::now();
    let own = now + per;
    let (at, why) = match deadline {
        Some(d) if d < own => (d, Failure::TotalTimeout),
        _ => (own, on_timeout),
    };
    // A future that is ready at once is never timed out by `timeout_at`:
    // reads of an answer the upstream has sent whole would outlive the
    // deadline for as long as the client takes to read them.
    if at <= now {
        return Err(why);
    }
    timeout_at(at.into(), fut).await.unwrap_or(Err(why))
}

/// Why a write to the client did not end well.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ClientCut {
    /// The client left, or took nothing within the send timeout.
    Gone,
    /// The exchange's `total_timeout` passed while the client was taking
    /// the answer.
    TotalTimeout,
}

impl ClientCut {
    /// Counts a total timeout against `server` (it was the exchange's,
    /// not the server's fault: no mark) and returns the reason to log.
    fn count_and_reason(self, pool: &Pool, server: usize) -> &'static str {
        match self {
            ClientCut::Gone => "client_gone",
            ClientCut::TotalTimeout => {
                pool.failed_relaying(server, Failure::TotalTimeout);
                Failure::TotalTimeout.reason()
            }
        }
    }
}

/// Writes and empties `buf` within the send timeout, and before the
/// exchange's `deadline` when there is one.
async fn send<D: Downstream>(
    client: &mut D,
    buf: &mut Vec<u8>,
    limit: Duration,
    deadline: Option<Instant>,
) -> Result<(), ClientCut> {
    let own = Instant::now() + limit;
    let (at, why) = match deadline {
        Some(d) if d < own => (d, ClientCut::TotalTimeout),
        _ => (own, ClientCut::Gone),
    };
    let r = timeout_at(at.into(), async {
        client.write_all(buf).await?;
        client.flush().await
    })
    .await;
    buf.clear();
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(ClientCut::Gone),
        Err(_) => Err(why),
    }
}

enum BodyError {
    /// The client's fault (or it left).
    Client(BodyRefused),
    /// Writing to the upstream failed.
    Upstream(Failure),
    /// The upstream began its final answer (or closed) before the body
    /// ended: the rest of the body is not sent (RFC 9112 §9.3's early
    /// response), and what it sent waits in the exchange's buffer.
    Answered,
}

/// A request body on its way upstream, framed as announced:
/// Content-Length bodies as they are (exactly that long), others chunked
/// (extensions and trailers dropped), so only well-formed framing reaches
/// the upstream.
struct Upload {
    chunked: bool,
    /// The length the upstream was told, `None` for chunked.
    announced: Option<u64>,
    /// Body bytes taken from the client so far.
    taken: u64,
    /// The current piece with its chunk framing.
    framed: Vec<u8>,
    /// Framed bytes an early answer stopped before they were written.
    unsent: Vec<u8>,
    /// The body's end has been framed (its last bytes may be in `unsent`).
    ended: bool,
}

impl Upload {
    fn new(framing: BodyFraming) -> Self {
        Self {
            chunked: framing == BodyFraming::Chunked,
            announced: match framing {
                BodyFraming::ContentLength(n) => Some(n),
                BodyFraming::None => Some(0),
                BodyFraming::Chunked => None,
            },
            taken: 0,
            framed: Vec::new(),
            unsent: Vec::new(),
            ended: false,
        }
    }

    /// A body that does not match its announced length would desync the
    /// upstream connection: cut off, never sent on.
    fn mismatch() -> BodyError {
        BodyError::Client(BodyRefused {
            status: 400,
            reason: "bad_body_length",
        })
    }

    /// The bytes that carry `data` (not empty) upstream.
    fn frame<'a>(&'a mut self, data: &'a [u8]) -> Result<&'a [u8], BodyError> {
        self.taken += data.len() as u64;
        if self.announced.is_some_and(|n| self.taken > n) {
            return Err(Self::mismatch());
        }
        if !self.chunked {
            return Ok(data);
        }
        self.framed.clear();
        put_body(&mut self.framed, data);
        Ok(&self.framed)
    }

    /// The bytes that end the body, once it ended on the client's side.
    fn end(&mut self) -> Result<&'static [u8], BodyError> {
        if self.announced.is_some_and(|n| self.taken != n) {
            return Err(Self::mismatch());
        }
        self.ended = true;
        Ok(if self.chunked { b"0\r\n\r\n" } else { b"" })
    }
}

/// Streams the request body to the upstream. When the upstream answers
/// first, the bytes of the piece that were not written stay in
/// `up.unsent` (a duplex exchange sends them later).
async fn send_body<B: RequestBody>(
    body: &mut B,
    up: &mut Upload,
    conn: &mut UpstreamConn,
    pool: &Pool,
    deadline: Option<Instant>,
    early: &mut Vec<u8>,
) -> Result<(), BodyError> {
    // `total_timeout` bounds the upload too: a client still sending when
    // it passes gets 408 (its body, not the server, took the time).
    let total = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(total);
    loop {
        // While the client is slow to send, the upstream may answer.
        let next = tokio::select! {
            biased;
            () = poll_fn(|cx| poll_answer(conn, early, cx)) => return Err(BodyError::Answered),
            next = body.next() => next,
            () = &mut total => {
                return Err(BodyError::Client(BodyRefused {
                    status: 408,
                    reason: Failure::TotalTimeout.reason(),
                }));
            }
        };
        let Some(data) = next.map_err(BodyError::Client)? else {
            break;
        };
        // An empty chunk would end a chunked body.
        if data.is_empty() {
            continue;
        }
        let mut rest = up.frame(data)?;
        let wrote = up_write(conn, &mut rest, false, pool, deadline, early).await;
        if matches!(wrote, Err(BodyError::Answered)) {
            up.unsent = rest.to_vec();
        }
        wrote?;
    }
    let mut rest = up.end()?;
    let wrote = up_write(conn, &mut rest, true, pool, deadline, early).await;
    if matches!(wrote, Err(BodyError::Answered)) {
        up.unsent = rest.to_vec();
    }
    wrote
}

/// The rest of a request body, sent while its answer is relayed (full
/// duplex): what the early answer left unsent, then the client's pieces
/// as they come, each flushed at once (the other end of a bidirectional
/// stream may wait on it).
async fn send_rest<B: RequestBody, W: AsyncWrite + Unpin>(
    body: &mut B,
    mut up: Upload,
    upstream: &mut W,
    pool: &Pool,
    deadline: Option<Instant>,
) -> Result<(), BodyError> {
    let unsent = std::mem::take(&mut up.unsent);
    write_flushed(upstream, &unsent, pool, deadline).await?;
    if up.ended {
        return Ok(());
    }
    while let Some(data) = body.next().await.map_err(BodyError::Client)? {
        if !data.is_empty() {
            let bytes = up.frame(data)?;
            write_flushed(upstream, bytes, pool, deadline).await?;
        }
    }
    let end = up.end()?;
    write_flushed(upstream, end, pool, deadline).await
}

/// Writes and flushes `bytes` under the pool's idle timeout.
async fn write_flushed<W: AsyncWrite + Unpin>(
    upstream: &mut W,
    bytes: &[u8],
    pool: &Pool,
    deadline: Option<Instant>,
) -> Result<(), BodyError> {
    within(
        deadline,
        pool.cfg.idle_timeout,
        Failure::IdleTimeout,
        async {
            upstream
                .write_all(bytes)
                .await
                .map_err(|_| Failure::Reset)?;
            upstream.flush().await.map_err(|_| Failure::Reset)
        },
    )
    .await
    .map_err(BodyError::Upstream)
}

/// Whether the upstream has begun its final answer while the request body
/// is still being sent: Ready once a final response head (or bytes that
/// cannot be one, or the end of the connection) arrived, all of it kept in
/// `early` for [`read_response`]. Interim 1xx heads do not stop the body.
fn poll_answer(conn: &mut UpstreamConn, early: &mut Vec<u8>, cx: &mut Context<'_>) -> Poll<()> {
    // Polled per body chunk while uploads go up: a stack buffer that is
    // not zeroed each time.
    let mut tmp = [MaybeUninit::<u8>::uninit(); 4096];
    loop {
        let mut rb = ReadBuf::uninit(&mut tmp);
        match Pin::new(&mut conn.stream).poll_read(cx, &mut rb) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(()),
            Poll::Ready(Ok(())) => early.extend_from_slice(rb.filled()),
        }
        if early.len() > MAX_RESPONSE_HEAD || final_head_in(early) {
            return Poll::Ready(());
        }
    }
}

/// Whether `buf` holds a final response head after interim ones (at most
/// [`MAX_INTERIM_BYTES`] of them), or bytes that are no response at all.
fn final_head_in(buf: &[u8]) -> bool {
    let mut at = 0;
    while at <= MAX_INTERIM_BYTES {
        let rest = buf.get(at..).unwrap_or_default();
        match parse_response(rest, MAX_RESPONSE_HEAD, MAX_RESPONSE_HEADERS, false) {
            Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => {
                at += h.head_len();
            }
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) => return false,
        }
    }
    true
}

/// The body of an HTTP/1.x request: read from the connection after its
/// head, Content-Length bodies as they come, chunked ones decoded.
struct Http1Body<'a, D> {
    client: &'a mut D,
    inbuf: &'a mut Vec<u8>,
    framing: BodyFraming,
    /// Content-Length bytes still to read.
    left: u64,
    decoder: ChunkedDecoder,
    ended: bool,
    buf: Vec<u8>,
    data: Vec<u8>,
    /// Set at the first read: `body_timeout` from then.
    deadline: Option<Instant>,
    body_timeout: Duration,
    /// `Expect: 100-continue` asked for, not yet answered.
    expects_continue: bool,
    send_timeout: Duration,
}

impl<D: Downstream + Send> RequestBody for Http1Body<'_, D> {
    async fn next(&mut self) -> Result<Option<&[u8]>, BodyRefused> {
        if self.expects_continue {
            // A server is there and has the head: the client may send.
            self.expects_continue = false;
            let mut interim = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
            if send(self.client, &mut interim, self.send_timeout, None)
                .await
                .is_err()
            {
                return Err(BodyRefused {
                    status: 502,
                    reason: "client_gone",
                });
            }
        }
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + self.body_timeout);
        if self.buf.is_empty() {
            self.buf.resize(CHUNK, 0);
        }
        match self.framing {
            BodyFraming::None => Ok(None),
            BodyFraming::ContentLength(_) => {
                if self.left == 0 {
                    return Ok(None);
                }
                let want = usize::try_from(self.left).map_or(CHUNK, |l| l.min(CHUNK));
                let n = if self.inbuf.is_empty() {
                    read_client(
                        self.client,
                        self.buf.get_mut(..want).unwrap_or_default(),
                        deadline,
                    )
                    .await?
                } else {
                    let n = want.min(self.inbuf.len());
                    self.buf
                        .get_mut(..n)
                        .unwrap_or_default()
                        .copy_from_slice(self.inbuf.get(..n).unwrap_or_default());
                    self.inbuf.drain(..n);
                    n
                };
                self.left -= n as u64;
                Ok(self.buf.get(..n))
            }
            BodyFraming::Chunked => loop {
                if self.ended {
                    return Ok(None);
                }
                self.data.clear();
                let d = self
                    .decoder
                    .decode(self.inbuf, &mut self.data)
                    .map_err(|e| BodyRefused {
                        status: e.status(),
                        reason: if e.status() == 413 {
                            "body_too_large"
                        } else {
                            "bad_chunked_body"
                        },
                    })?;
                self.inbuf.drain(..d.consumed.min(self.inbuf.len()));
                self.ended = d.done;
                if !self.data.is_empty() {
                    return Ok(Some(&self.data));
                }
                if d.done {
                    return Ok(None);
                }
                let n = read_client(self.client, &mut self.buf, deadline).await?;
                self.inbuf
                    .extend_from_slice(self.buf.get(..n).unwrap_or_default());
            },
        }
    }
}

/// Writes request body bytes to the upstream (and flushes, with `flush`)
/// under its idle timeout, watching for an early answer meanwhile: an
/// upstream that answered and stopped reading would otherwise hold the
/// write until the timeout. What was not written stays in `rest`.
async fn up_write(
    conn: &mut UpstreamConn,
    rest: &mut &[u8],
    flush: bool,
    pool: &Pool,
    deadline: Option<Instant>,
    early: &mut Vec<u8>,
) -> Result<(), BodyError> {
    let fut = poll_fn(|cx| {
        if poll_answer(conn, early, cx).is_ready() {
            return Poll::Ready(Ok(true));
        }
        while !rest.is_empty() {
            match Pin::new(&mut conn.stream).poll_write(cx, rest) {
                Poll::Ready(Ok(n)) if n > 0 => *rest = rest.get(n..).unwrap_or_default(),
                Poll::Ready(_) => return Poll::Ready(Err(Failure::Reset)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if flush {
            return match Pin::new(&mut conn.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(false)),
                Poll::Ready(Err(_)) => Poll::Ready(Err(Failure::Reset)),
                Poll::Pending => Poll::Pending,
            };
        }
        Poll::Ready(Ok(false))
    });
    match within(deadline, pool.cfg.idle_timeout, Failure::IdleTimeout, fut).await {
        Ok(false) => Ok(()),
        Ok(true) => Err(BodyError::Answered),
        Err(f) => Err(BodyError::Upstream(f)),
    }
}

async fn read_client<D: Downstream>(
    client: &mut D,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, BodyRefused> {
    match timeout_at(deadline.into(), client.read(buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(n),
        Ok(_) => Err(BodyRefused {
            status: 400,
            reason: "client_gone",
        }),
        Err(_) => Err(BodyRefused {
            status: 408,
            reason: "body_timeout",
        }),
    }
}

/// Reads the final response head (skipping interim 1xx ones), after the
/// bytes already in `early`; returns it and the bytes read past it.
async fn read_response(
    conn: &mut UpstreamConn,
    head_request: bool,
    upgrade: bool,
    pool: &Pool,
    deadline: Option<Instant>,
    early: Vec<u8>,
) -> Result<(ResponseHead, Vec<u8>), Failure> {
    // As large as the first read reserves below: no reallocation (and copy)
    // per response.
    let mut ubuf: Vec<u8> = if early.is_empty() {
        Vec::with_capacity(READ_RESERVE)
    } else {
        early
    };
    let mut interim = 0;
    let fut = async {
        loop {
            match parse_response(&ubuf, MAX_RESPONSE_HEAD, MAX_RESPONSE_HEADERS, head_request) {
                Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => {
                    interim += h.head_len();
                    if interim > MAX_INTERIM_BYTES {
                        return Err(Failure::BadResponse);
                    }
                    ubuf.drain(..h.head_len());
                    continue;
                }
                // A 101 without an Upgrade asked for is a protocol error.
                Ok(Some(h)) if h.status() == 101 && !upgrade => return Err(Failure::BadResponse),
                Ok(Some(h)) => {
                    ubuf.drain(..h.head_len());
                    return Ok(h);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!("upstream response refused: {e}");
                    return Err(Failure::BadResponse);
                }
            }
            let at = ubuf.len();
            // Into spare capacity: no zeroing of a fresh buffer per response.
            ubuf.reserve(READ_RESERVE);
            let n = conn
                .stream
                .read_buf(&mut ubuf)
                .await
                .map_err(|_| Failure::Reset)?;
            if n == 0 {
                // Closed before a complete head: a reset when nothing came.
                return Err(if at == 0 {
                    Failure::Reset
                } else {
                    Failure::BadResponse
                });
            }
        }
    };
    let head = within(
        deadline,
        pool.cfg.response_timeout,
        Failure::ResponseTimeout,
        fut,
    )
    .await?;
    Ok((head, ubuf))
}

/// A response body read off the upstream connection, its framing
/// checked, whatever the client's protocol does with it.
struct UpBody {
    framing: ResponseFraming,
    /// Content-Length bytes still to come.
    left: u64,
    decoder: ChunkedDecoder,
    /// Read and not yet decoded (chunked), or not yet handed on.
    input: Vec<u8>,
    /// Whether the connection may serve another request afterwards.
    reusable: bool,
}

impl UpBody {
    /// `ubuf`: what came with the head. `reusable`: what the exchange
    /// allows so far (keep-alive, the request sent whole).
    fn new(framing: ResponseFraming, ubuf: Vec<u8>, reusable: bool) -> Self {
        Self {
            framing,
            left: match framing {
                ResponseFraming::Length(n) => n,
                _ => 0,
            },
            decoder: ChunkedDecoder::new(u64::MAX, MAX_TRAILER),
            input: ubuf,
            reusable,
        }
    }

    /// Appends more of the body to `out`, reading the upstream only when
    /// nothing is buffered; `true` once the body has ended.
    async fn read<R: AsyncRead + Unpin>(
        &mut self,
        upstream: &mut R,
        pool: &Pool,
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> Result<bool, Failure> {
        let idle = pool.cfg.idle_timeout;
        match self.framing {
            ResponseFraming::None => {
                self.reusable &= self.input.is_empty();
                Ok(true)
            }
            ResponseFraming::Length(_) => {
                if !self.input.is_empty() {
                    let take = usize::try_from(self.left)
                        .unwrap_or(usize::MAX)
                        .min(self.input.len());
                    out.extend_from_slice(self.input.get(..take).unwrap_or_default());
                    // Bytes past the announced length: the framing is in doubt.
                    if take < self.input.len() {
                        self.reusable = false;
                    }
                    self.input.clear();
                    self.left -= take as u64;
                    if self.left == 0 {
                        return Ok(true);
                    }
                    // What the upstream has already sent goes to the client
                    // with this piece, in one write instead of two: a 64 KiB
                    // answer is usually on the socket whole by the time its
                    // head is parsed. Only what is there; this never waits.
                    let mut cx = Context::from_waker(std::task::Waker::noop());
                    let mut read = std::pin::pin!(self.read_length(upstream, out));
                    return match read.as_mut().poll(&mut cx) {
                        Poll::Ready(r) => r,
                        Poll::Pending => Ok(false),
                    };
                }
                if self.left == 0 {
                    return Ok(true);
                }
                within(
                    deadline,
                    idle,
                    Failure::IdleTimeout,
                    self.read_length(upstream, out),
                )
                .await
            }
            ResponseFraming::Chunked => {
                let at = out.len();
                loop {
                    let d = self.decoder.decode(&self.input, out).map_err(|e| {
                        tracing::debug!("upstream chunked body refused: {e}");
                        Failure::BadResponse
                    })?;
                    self.input.drain(..d.consumed.min(self.input.len()));
                    if d.done {
                        self.reusable &= self.input.is_empty();
                        return Ok(true);
                    }
                    if out.len() > at {
                        return Ok(false);
                    }
                    self.input.reserve(CHUNK);
                    let n = within(deadline, idle, Failure::IdleTimeout, async {
                        upstream
                            .read_buf(&mut self.input)
                            .await
                            .map_err(|_| Failure::Truncated)
                    })
                    .await?;
                    if n == 0 {
                        return Err(Failure::Truncated);
                    }
                }
            }
            ResponseFraming::UntilClose => {
                self.reusable = false;
                if !self.input.is_empty() {
                    out.append(&mut self.input);
                    return Ok(false);
                }
                out.reserve(CHUNK);
                let n = within(deadline, idle, Failure::IdleTimeout, async {
                    (&mut *upstream)
                        .take(CHUNK as u64)
                        .read_buf(out)
                        .await
                        .map_err(|_| Failure::Truncated)
                })
                .await?;
                Ok(n == 0)
            }
        }
    }

    /// One read of a Content-Length body into `out`; `true` once it ended.
    ///
    /// A read may take one byte past the body. It is never forwarded; it
    /// means the upstream sent something unasked, and the connection is
    /// not reused. What it buys: the last read of a body comes back short
    /// of its buffer, so tokio knows the socket is drained, and the check
    /// that the idle connection is still open before its next request
    /// (`UpstreamConn::looks_alive`) costs no system call. A read that
    /// filled its buffer exactly left a failing `recvfrom` for that check.
    async fn read_length<R: AsyncRead + Unpin>(
        &mut self,
        upstream: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<bool, Failure> {
        let want = usize::try_from(self.left).map_or(CHUNK, |l| l.min(CHUNK));
        let limit = if (want as u64) < self.left {
            want
        } else {
            want + 1
        };
        out.reserve(limit);
        let at = out.len();
        let n = (&mut *upstream)
            .take(limit as u64)
            .read_buf(out)
            .await
            .map_err(|_| Failure::Truncated)?;
        if n == 0 {
            return Err(Failure::Truncated);
        }
        if n as u64 > self.left {
            out.truncate(at + usize::try_from(self.left).unwrap_or(n));
            self.reusable = false;
            self.left = 0;
        } else {
            self.left -= n as u64;
        }
        Ok(self.left == 0)
    }
}

/// Sends the response head and streams the body to an HTTP/1.x client.
async fn relay<D: Downstream>(
    client: &mut D,
    out: &mut Vec<u8>,
    r: &Request<'_>,
    pool: &Pool,
    answer: Answer<'_>,
    deadline: Option<Instant>,
) -> Outcome {
    // An HTTP/1.x exchange is never duplex: no upload is left over.
    let Answer {
        mut lease,
        resp,
        ubuf,
        body_done,
        upload: _,
        server,
    } = answer;
    let status = resp.status();
    let framing = resp.framing();
    let http10_client = r.head.version() == Version::Http10;
    let reframe = matches!(
        framing,
        ResponseFraming::Chunked | ResponseFraming::UntilClose
    );
    // A 1.0 client cannot take chunked: the body then ends with the connection.
    let close_delimited = reframe && http10_client;
    let chunked = reframe && !close_delimited;
    let keep_client = r.keep_alive && body_done && !close_delimited;
    write_status_line(out, status);
    for (name, value) in response_fields(&resp) {
        write_header(out, name, value);
    }
    if resp.header("date").is_none() {
        with_date(|d| write_header(out, "Date", d));
    }
    match framing {
        ResponseFraming::Length(n) => write_header_u64(out, "Content-Length", n),
        ResponseFraming::None => {
            if let Some(n) = described_length(&resp) {
                write_header_u64(out, "Content-Length", n);
            }
        }
        _ if close_delimited => {}
        _ => write_header(out, "Transfer-Encoding", b"chunked"),
    }
    if !keep_client {
        write_header(out, "Connection", b"close");
    } else if http10_client {
        write_header(out, "Connection", b"keep-alive");
    }
    end_head(out);

    let Some(mut conn) = lease.conn.take() else {
        return Outcome::Aborted {
            status,
            body_bytes: 0,
            server,
            reason: "internal",
        };
    };
    // A request not sent whole leaves the upstream waiting for the rest:
    // that connection can serve nothing else.
    let mut body = UpBody::new(framing, ubuf, may_reuse(&resp) && body_done);
    let mut sent: u64 = 0;
    let mut data = Vec::new();
    loop {
        // Chunks are decoded into `data` and framed again; other bodies
        // go straight into `out`.
        let at = out.len();
        let step = if chunked {
            data.clear();
            body.read(&mut conn.stream, pool, deadline, &mut data).await
        } else {
            body.read(&mut conn.stream, pool, deadline, out).await
        };
        let done = match step {
            Ok(done) => done,
            Err(f) => {
                pool.failed_relaying(lease.server, f);
                // What was read before the failure (the head, at least)
                // still goes out: the cut shows as a short body.
                if !out.is_empty() {
                    let _ = send(client, out, r.send_timeout, deadline).await;
                }
                return Outcome::Aborted {
                    status,
                    body_bytes: sent,
                    server,
                    reason: f.reason(),
                };
            }
        };
        if chunked {
            sent += data.len() as u64;
            put_body(out, &data);
        } else {
            sent += (out.len() - at) as u64;
        }
        if done {
            break;
        }
        if let Err(cut) = send(client, out, r.send_timeout, deadline).await {
            return Outcome::Aborted {
                status,
                body_bytes: sent,
                server,
                reason: cut.count_and_reason(pool, lease.server),
            };
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if let Err(cut) = send(client, out, r.send_timeout, deadline).await {
        return Outcome::Aborted {
            status,
            body_bytes: sent,
            server,
            reason: cut.count_and_reason(pool, lease.server),
        };
    }
    if body.reusable {
        pool.check_in(conn, r.conn);
    }
    Outcome::Relayed {
        status,
        body_bytes: sent,
        server,
        keep_client,
    }
}

/// Appends body bytes as one chunk.
fn put_body(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Sends the response head and streams the body to a client that frames
/// them itself (an HTTP/2 stream). Each read of the upstream waits until
/// the client took the previous bytes; a client that cancels meanwhile
/// ends the exchange at once. After an early answer the rest of the
/// request body goes upstream meanwhile (full duplex), until the answer
/// ends.
async fn relay_stream<B: RequestBody, S: Responder>(
    client: &mut S,
    request_body: &mut B,
    pool: &Pool,
    answer: Answer<'_>,
    (deadline, from): (Option<Instant>, &ClientConn),
) -> Outcome {
    let Answer {
        mut lease,
        resp,
        ubuf,
        body_done,
        upload,
        server,
    } = answer;
    let status = resp.status();
    let framing = resp.framing();
    let length = match framing {
        ResponseFraming::Length(n) => Some(n.to_string().into_bytes()),
        ResponseFraming::None => described_length(&resp).map(|n| n.to_string().into_bytes()),
        _ => None,
    };
    let date = resp
        .header("date")
        .is_none()
        .then(|| with_date(|d| String::from_utf8_lossy(d).into_owned()));
    let mut fields = response_fields(&resp)
        .chain(date.as_deref().map(|d| ("date", d.as_bytes())))
        .chain(length.as_deref().map(|l| ("content-length", l)));
    let aborted = |sent: u64, reason: &'static str| Outcome::Aborted {
        status,
        body_bytes: sent,
        server: server.clone(),
        reason,
    };
    let no_body = framing == ResponseFraming::None;
    if let Err(e) = client.head(status, &mut fields, no_body) {
        return refused(CLIENT_CLOSED, e.reason(), Some(server.clone()), body_done);
    }
    let Some(mut conn) = lease.conn.take() else {
        client.abort();
        return aborted(0, "internal");
    };
    let mut body = UpBody::new(framing, ubuf, may_reuse(&resp));
    let mut sent: u64 = 0;
    let (relayed, body_sent) = match upload {
        None => {
            let r = relay_body(
                client,
                &mut body,
                &mut conn.stream,
                pool,
                deadline,
                &mut sent,
            );
            (r.await, body_done)
        }
        Some(up) => {
            let (mut from_up, mut to_up) = tokio::io::split(&mut conn.stream);
            let sending = send_rest(request_body, up, &mut to_up, pool, deadline);
            let relaying = relay_body(client, &mut body, &mut from_up, pool, deadline, &mut sent);
            tokio::pin!(sending, relaying);
            let mut sending_ended = false;
            let mut body_sent = false;
            let relayed = loop {
                tokio::select! {
                    r = &mut sending, if !sending_ended => {
                        sending_ended = true;
                        match r {
                            Ok(()) => body_sent = true,
                            // The upstream got part of a body that broke
                            // off: its answer cannot be trusted to end well.
                            Err(BodyError::Client(refusal)) => break Err(Cut::Body(refusal)),
                            // The upstream stopped reading: its answer may
                            // still end well.
                            Err(BodyError::Upstream(f)) => {
                                tracing::debug!(pool = %pool.name(), "rest of the request body not taken: {}", f.reason());
                            }
                            Err(BodyError::Answered) => {}
                        }
                    }
                    r = &mut relaying => break r,
                }
            };
            // An answer that ended before the body leaves the upstream
            // waiting for the rest: that connection serves nothing else.
            (relayed, body_sent)
        }
    };
    match relayed {
        Ok(()) => {}
        Err(Cut::Cancelled) => return aborted(sent, SendError::Gone.reason()),
        Err(Cut::Client(e)) => return aborted(sent, e.reason()),
        Err(Cut::Upstream(f)) => {
            pool.failed_relaying(lease.server, f);
            client.abort();
            return aborted(sent, f.reason());
        }
        Err(Cut::Body(refusal)) => {
            client.abort();
            return aborted(sent, refusal.reason);
        }
    }
    if body.reusable && body_sent {
        pool.check_in(conn, from);
    }
    Outcome::Relayed {
        status,
        body_bytes: sent,
        server,
        keep_client: true,
    }
}

/// Why relaying an answer to a stream broke off.
enum Cut {
    /// The client reset the stream.
    Cancelled,
    /// The client did not take the answer.
    Client(SendError),
    /// The upstream's answer failed.
    Upstream(Failure),
    /// The request body, sent meanwhile, failed on the client's side.
    Body(BodyRefused),
}

/// Streams an answer's body from `upstream` to a stream, counting what
/// was sent in `sent`.
async fn relay_body<S: Responder, R: AsyncRead + Unpin>(
    client: &mut S,
    body: &mut UpBody,
    upstream: &mut R,
    pool: &Pool,
    deadline: Option<Instant>,
    sent: &mut u64,
) -> Result<(), Cut> {
    let no_body = body.framing == ResponseFraming::None;
    loop {
        let mut data = Vec::new();
        let step = tokio::select! {
            step = body.read(upstream, pool, deadline, &mut data) => step,
            () = client.cancelled() => return Err(Cut::Cancelled),
        };
        let done = step.map_err(Cut::Upstream)?;
        *sent += data.len() as u64;
        // The last piece carries the end of the stream (an empty DATA
        // frame when nothing is left); a response without a body ended
        // with its head.
        if (!data.is_empty() || done) && !no_body {
            let sending = client.data(data, done);
            match deadline {
                Some(d) => timeout_at(d.into(), sending)
                    .await
                    .map_err(|_| Cut::Upstream(Failure::TotalTimeout))?,
                None => sending.await,
            }
            .map_err(Cut::Client)?;
        }
        if done {
            return Ok(());
        }
    }
}

/// Bytes a tunnel reads from a side at once.
const TUNNEL_CHUNK: usize = 16 * 1024;

/// One direction of a tunnel: what was read from one side and the other
/// has not taken yet. A side is read only once the other took the last
/// read whole, so each direction holds one chunk at most and the slower
/// reader sets its pace, without stopping the other direction.
struct Leg {
    buf: Vec<u8>,
    /// Taken up to here.
    at: usize,
    /// Read up to here.
    len: usize,
    /// The sending side closed (its FIN or close_notify).
    eof: bool,
    /// The close was passed on to the receiving side.
    shut: bool,
}

impl Leg {
    /// A direction that starts with `pending` to pass on.
    fn starting_with(mut pending: Vec<u8>) -> Leg {
        let len = pending.len();
        pending.resize(len.max(TUNNEL_CHUNK), 0);
        Leg {
            buf: pending,
            at: 0,
            len,
            eof: false,
            shut: false,
        }
    }

    /// Where to read into (when everything read was taken and the sender
    /// has not closed), and what to pass on: never both.
    fn split(&mut self) -> (Option<&mut [u8]>, &[u8]) {
        if self.at < self.len {
            (None, self.buf.get(self.at..self.len).unwrap_or_default())
        } else if self.eof {
            (None, &[])
        } else {
            (Some(self.buf.as_mut_slice()), &[])
        }
    }

    fn read(&mut self, n: usize) {
        if n == 0 {
            self.eof = true;
        } else {
            (self.at, self.len) = (0, n.min(self.buf.len()));
        }
    }

    fn taken(&mut self, n: usize) {
        self.at = (self.at + n).min(self.len);
    }

    /// Its sender closed and all it sent was taken: time to pass the close on.
    fn to_shut(&self) -> bool {
        self.eof && self.at == self.len && !self.shut
    }
}

/// One turn of the upstream side of a tunnel, as [`Downstream::relay`]
/// is for the client: reads into `buf` or writes from `data`, whichever
/// the server allows first. What a write left in the upstream TLS
/// session is flushed in a later turn (`flushing`), alongside the read.
/// Cancel-safe: a write or read done is returned in the same poll.
async fn upstream_relay<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    mut buf: Option<&mut [u8]>,
    data: &[u8],
    flushing: &mut bool,
) -> io::Result<Turn> {
    poll_fn(|cx| {
        if !data.is_empty() {
            if let Poll::Ready(r) = Pin::new(&mut *stream).poll_write(cx, data) {
                *flushing = true;
                return Poll::Ready(r.map(Turn::Sent));
            }
        } else if *flushing {
            if let Poll::Ready(r) = Pin::new(&mut *stream).poll_flush(cx) {
                *flushing = false;
                return Poll::Ready(r.map(|()| Turn::Sent(0)));
            }
        }
        if let Some(b) = buf.as_deref_mut() {
            let mut rb = ReadBuf::new(b);
            if let Poll::Ready(r) = Pin::new(&mut *stream).poll_read(cx, &mut rb) {
                return Poll::Ready(r.map(|()| Turn::Read(rb.filled().len())));
            }
        }
        Poll::Pending
    })
    .await
}

/// A side's turn in a tunnel.
enum Side {
    Client(io::Result<Turn>),
    Upstream(io::Result<Turn>),
}

/// A read that ended the sending side's direction: its clean close, or
/// a TCP close without TLS close_notify, which ends what it sends all the
/// same.
fn closed(r: &io::Result<Turn>) -> bool {
    match r {
        Ok(Turn::Read(0)) => true,
        Err(e) => e.kind() == io::ErrorKind::UnexpectedEof,
        Ok(_) => false,
    }
}

/// After a 101 to a WebSocket upgrade: the switch relayed, then bytes
/// copied both ways at once, each direction with its own backpressure,
/// until both sides have closed or both stay silent for the pool's
/// `idle_timeout` (any byte moved either way restarts it). A side's close
/// (FIN, TLS close_notify) is passed on to the other once what it sent
/// has been taken, and the other direction goes on. The client
/// connection ends with the tunnel.
async fn tunnel<D: Downstream>(
    client: &mut D,
    out: &mut Vec<u8>,
    inbuf: &mut Vec<u8>,
    r: &Request<'_>,
    pool: &Pool,
    answer: Answer<'_>,
) -> Outcome {
    let Answer {
        mut lease,
        resp,
        ubuf,
        server,
        ..
    } = answer;
    let accepted = resp
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case(b"websocket"));
    let Some(mut conn) = lease.conn.take().filter(|_| accepted) else {
        pool.failed(lease.server, Failure::BadResponse);
        return Outcome::Refused {
            status: 502,
            reason: Failure::BadResponse.reason(),
            server: Some(server),
            body_done: true,
        };
    };
    write_status_line(out, 101);
    for (name, value) in response_fields(&resp) {
        write_header(out, name, value);
    }
    write_header(out, "Upgrade", b"websocket");
    write_header(out, "Connection", b"upgrade");
    end_head(out);
    out.extend_from_slice(&ubuf);
    let mut down_bytes: u64 = ubuf.len() as u64;
    let done = |down: u64| Outcome::Relayed {
        status: 101,
        body_bytes: down,
        server: server.clone(),
        keep_client: false,
    };
    if send(client, out, r.send_timeout, None).await.is_err() {
        return done(down_bytes);
    }
    let idle = pool.cfg.idle_timeout;
    // What the client sent after its request head belongs to the tunnel.
    let mut up = Leg::starting_with(std::mem::take(inbuf));
    let mut down = Leg::starting_with(Vec::new());
    let mut flushing = false;
    while !(up.shut && down.shut) {
        let (client_read, to_server) = up.split();
        let (server_read, to_client) = down.split();
        let turn = tokio::time::timeout(idle, async {
            tokio::select! {
                t = client.relay(client_read, to_client) => Side::Client(t),
                t = upstream_relay(&mut conn.stream, server_read, to_server, &mut flushing) => {
                    Side::Upstream(t)
                }
            }
        })
        .await;
        match turn {
            // Silence both ways.
            Err(_) => return done(down_bytes),
            Ok(Side::Client(t)) if closed(&t) => up.read(0),
            Ok(Side::Upstream(t)) if closed(&t) => down.read(0),
            Ok(Side::Client(Ok(Turn::Read(n)))) => up.read(n),
            Ok(Side::Client(Ok(Turn::Sent(n)))) => {
                down.taken(n);
                down_bytes += n as u64;
            }
            Ok(Side::Upstream(Ok(Turn::Read(n)))) => down.read(n),
            Ok(Side::Upstream(Ok(Turn::Sent(n)))) => up.taken(n),
            // A reset or a failed write: neither direction can go on whole.
            Ok(Side::Client(Err(_)) | Side::Upstream(Err(_))) => return done(down_bytes),
        }
        // A close passed on waits for what is still queued toward that
        // side (bounded as any turn is).
        if up.to_shut() {
            up.shut = true;
            let shut = tokio::time::timeout(idle, conn.stream.shutdown()).await;
            if !matches!(shut, Ok(Ok(()))) {
                return done(down_bytes);
            }
        }
        if down.to_shut() {
            down.shut = true;
            let shut = tokio::time::timeout(idle, client.shutdown()).await;
            if !matches!(shut, Ok(Ok(()))) {
                return done(down_bytes);
            }
        }
    }
    done(down_bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head_for(peer: &str, host: &str) -> String {
        let raw = format!("GET /a?b HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: x-drop\r\nX-Drop: 1\r\nX-Kept: yes\r\n\r\n");
        let head = tlsgate_http1::parse_request(raw.as_bytes(), &Default::default())
            .unwrap()
            .unwrap();
        let conn = ClientConn::new(peer.parse().unwrap(), None);
        let r = Request {
            head: &head,
            conn: &conn,
            client_cert: None,
            max_body: 0,
            body_timeout: Duration::from_secs(1),
            send_timeout: Duration::from_secs(1),
            keep_alive: true,
        };
        String::from_utf8(upstream_request_head(&r).unwrap()).unwrap()
    }

    #[test]
    fn forwarding_fields_name_the_client_in_ipv4_and_ipv6_form() {
        assert_eq!(
            head_for("192.0.2.7:5555", "app.test"),
            "GET /a?b HTTP/1.1\r\nHost: app.test\r\nX-Kept: yes\r\nX-Forwarded-For: 192.0.2.7\r\nX-Real-IP: 192.0.2.7\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: app.test\r\nForwarded: for=192.0.2.7;proto=https;host=\"app.test\"\r\nVia: 1.1 tlsgate\r\n\r\n"
        );
        let v6 = head_for("[2001:db8::7]:5555", "app.test");
        assert!(v6.contains("\r\nX-Forwarded-For: 2001:db8::7\r\n"), "{v6}");
        assert!(v6.contains("\r\nX-Real-IP: 2001:db8::7\r\n"), "{v6}");
        assert!(
            v6.contains("\r\nForwarded: for=\"[2001:db8::7]\";proto=https;host=\"app.test\"\r\n"),
            "{v6}"
        );
        // The longest address text (39 bytes) fits the stack buffer.
        let long = head_for("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1", "a");
        assert!(
            long.contains("\r\nX-Real-IP: ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff\r\n"),
            "{long}"
        );
    }

    #[test]
    fn client_copies_of_forwarding_fields_go_unless_the_listener_passes_them() {
        let passed = PassedFields::parse(&["CF-Connecting-IP".to_string()]).unwrap();
        for name in [
            "X-Forwarded-For",
            "x_real_ip",
            "X-Original-URL",
            "X_Rewrite_Url",
            "X-Forwarded-Scheme",
            "X-Forwarded-Ssl",
            "X-Forwarded-Port",
            "X-Forwarded-Prefix",
            "X-Forwarded-Server",
            "True-Client-IP",
            "X-Client-IP",
            "Fastly-Client-IP",
            "X-Cluster-Client-IP",
            "CF_Connecting_IP",
        ] {
            assert!(client_may_not_send(name, passed), "{name}");
        }
        assert!(client_may_not_send(
            "cf-connecting-ip",
            PassedFields::default()
        ));
        for name in [
            "CF-Connecting-IP",
            "cf-connecting-ip",
            "X-Kept",
            "X-Forwarded",
        ] {
            assert!(!client_may_not_send(name, passed), "{name}");
        }
    }

    #[test]
    fn stream_requests_are_framed_for_http11_and_never_carry_cr_lf_or_hop_fields() {
        let fields: &[(&str, &[u8])] = &[
            ("te", b"trailers"),
            ("x-forwarded-for", b"6.6.6.6"),
            ("x-evil", b"a\r\nInjected: 1"),
            ("x-nul", b"a\0b"),
            ("cookie", b"a=1; b=2"),
        ];
        let o = Outgoing {
            method: &Method::Post,
            target: b"/up?x=1",
            host: b"app.test",
            fields: || fields.iter().copied(),
            via: b"2 tlsgate",
            body: BodyFraming::Chunked,
            websocket: None,
            peer: "192.0.2.7:5555".parse().unwrap(),
            conn: &ClientConn::new("192.0.2.7:5555".parse().unwrap(), None),
            client_cert: None,
        };
        let head = String::from_utf8(upstream_head(&o)).unwrap();
        assert_eq!(
            head,
            "POST /up?x=1 HTTP/1.1\r\nHost: app.test\r\ncookie: a=1; b=2\r\nX-Forwarded-For: 192.0.2.7\r\nX-Real-IP: 192.0.2.7\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: app.test\r\nForwarded: for=192.0.2.7;proto=https;host=\"app.test\"\r\nVia: 2 tlsgate\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }
}
