//! One proxied exchange: the request head rewritten for the upstream
//! (hop-by-hop fields out, forwarding fields in), the request body
//! streamed with backpressure (chunked bodies re-framed), bounded retries
//! to other servers, the response head checked and rewritten, its body
//! streamed back. Nothing is buffered whole; the slower side sets the pace.

use std::future::Future;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tlsgate_http1::{
    end_head, is_field_value, list_elements, parse_response, write_header, write_header_u64,
    write_status_line, BodyFraming, ChunkedDecoder, Method, RequestHead, ResponseFraming,
    ResponseHead, Version,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout_at;

use crate::conn::UpstreamConn;
use crate::error::Failure;
use crate::pool::{Lease, Pool};

/// Bytes moved per read, each way.
const CHUNK: usize = 64 * 1024;
/// Largest request body kept for a retry (sent again to another server).
const REPLAY_MAX: usize = 64 * 1024;
/// Room made for each read of a response head.
const READ_RESERVE: usize = 16 * 1024;
/// Interim (1xx) responses skipped before the final one.
const MAX_INTERIM: usize = 8;
/// Limits on an upstream's response head.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
const MAX_RESPONSE_HEADERS: usize = 200;
/// Trailer bytes accepted on a chunked body (then dropped).
const MAX_TRAILER: usize = 16 * 1024;

/// The client side of an exchange: the connection's byte stream.
pub trait Downstream {
    /// Reads application bytes; 0 is end of stream. Must be cancel-safe
    /// (a WebSocket tunnel waits on both sides at once and drops the read
    /// of the side that stayed silent).
    fn read(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Writes all of `data`.
    fn write_all(&mut self, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends what is queued.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}

/// A request to forward and what the connection knows about it.
pub struct Request<'a> {
    /// The parsed head (framing already checked by the strict parser).
    pub head: &'a RequestHead,
    /// The client's address.
    pub peer: SocketAddr,
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

/// How an exchange ended.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing was sent to the client: answer `status` (and close unless
    /// `body_done`, i.e. the request body was read whole).
    Refused {
        /// 400, 413, 502, 503 or 504.
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
    /// connection without a clean close.
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
/// forwarding fields only the proxy may set.
const REQUEST_DROP: &[&str] = &[
    "proxy-authorization",
    "content-length",
    "host",
    "expect",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "forwarded",
    "x-forwarded-client-cert",
];

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
        .any(|f| name.eq_ignore_ascii_case(f))
        || named
            .iter()
            .any(|n| name.as_bytes().eq_ignore_ascii_case(n))
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

/// The request head as sent upstream.
fn upstream_head(r: &Request<'_>) -> Vec<u8> {
    let head = r.head;
    let mut out = Vec::with_capacity(head.head_len() + 256);
    out.extend_from_slice(head.method().as_str().as_bytes());
    out.push(b' ');
    let target = head.target();
    if target.first() == Some(&b'/') || target == b"*" {
        out.extend_from_slice(target);
    } else {
        // absolute-form: the upstream gets origin-form and the authority as Host.
        out.extend_from_slice(head.path());
        if let Some(q) = head.query() {
            out.push(b'?');
            out.extend_from_slice(q);
        }
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let host = head.host().unwrap_or_default();
    write_header(&mut out, "Host", host);
    let named = connection_named(head.headers());
    for (name, value) in head.headers() {
        // The strict parser already refused CR, LF and NUL in values;
        // checked again here so a change there cannot reach an upstream.
        if !dropped(name, REQUEST_DROP, &named) && is_field_value(value) {
            write_header(&mut out, name, value);
        }
    }
    let ip = r.peer.ip();
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
    let via: &[u8] = match head.version() {
        Version::Http10 => b"1.0 tlsgate",
        Version::Http11 => b"1.1 tlsgate",
    };
    write_header(&mut out, "Via", via);
    if let Some(cert) = &r.client_cert {
        if is_field_value(cert.as_bytes()) {
            write_header(&mut out, "X-Forwarded-Client-Cert", cert.as_bytes());
        }
    }
    if let Some(protocol) = websocket_upgrade(head) {
        write_header(&mut out, "Upgrade", protocol);
        write_header(&mut out, "Connection", b"upgrade");
    }
    match head.body() {
        BodyFraming::None => {}
        BodyFraming::ContentLength(n) => write_header_u64(&mut out, "Content-Length", n),
        BodyFraming::Chunked => write_header(&mut out, "Transfer-Encoding", b"chunked"),
    }
    end_head(&mut out);
    out
}

/// A failure and whether anything of the request body was taken from the client.
struct Failed {
    failure: Failure,
    server: Option<usize>,
}

/// Forwards one request through `pool` and relays the answer. `inbuf`
/// holds bytes read after the head (the body's start, pipelined
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
    let refuse = |status: u16, reason: &'static str, server: Option<String>, body_done: bool| {
        Outcome::Refused {
            status,
            reason,
            server,
            body_done,
        }
    };
    if matches!(head.method(), Method::Connect) {
        return refuse(405, "connect_refused", None, true);
    }
    if let BodyFraming::ContentLength(n) = head.body() {
        if n > r.max_body {
            return refuse(413, "body_too_large", None, false);
        }
    }
    if !out.is_empty() && send(client, out, r.send_timeout).await.is_err() {
        return refuse(502, "client_gone", None, false);
    }
    let req_head = upstream_head(r);
    // A body already here in full can be sent again to another server.
    let replay: Option<usize> = match head.body() {
        BodyFraming::None => Some(0),
        BodyFraming::ContentLength(n) if n as usize <= REPLAY_MAX && n as usize <= inbuf.len() => {
            Some(n as usize)
        }
        _ => None,
    };
    let may_retry_sent = idempotent(head.method()) && replay.is_some();
    let expects_continue = head
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"))
        && head.version() == Version::Http11
        && replay.is_none();
    let key = pool.hash_key(r.peer.ip(), |name| head.header(name).map(<[u8]>::to_vec));

    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<Failed> = None;
    let attempts = 1 + pool.cfg.retries as usize;
    for attempt in 0..attempts {
        let Some(mut lease) = pool.choose(&tried, key) else {
            break;
        };
        if attempt > 0 {
            pool.count_retry();
        }
        tried.push(lease.server);
        pool.count_request(lease.server);
        let server_idx = lease.server;
        let server_name = || pool.servers.get(server_idx).map(|s| s.cfg.address.clone());
        if let Err(f) = within(
            deadline,
            pool.cfg.connect_timeout,
            Failure::ConnectTimeout,
            pool.connect(&mut lease),
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
        // The head, with a replayable body, in one write.
        let mut first = req_head.clone();
        if let Some(n) = replay {
            first.extend_from_slice(inbuf.get(..n).unwrap_or_default());
        }
        let sent_at = Instant::now();
        let wrote = within(
            deadline,
            pool.cfg.idle_timeout,
            Failure::IdleTimeout,
            async {
                conn.stream
                    .write_all(&first)
                    .await
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
                continue;
            }
            if may_retry_sent {
                continue;
            }
            break;
        }
        let mut body_done = replay.is_some();
        if let Some(n) = replay {
            inbuf.drain(..n.min(inbuf.len()));
        } else {
            if expects_continue
                && send(
                    client,
                    &mut b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(),
                    r.send_timeout,
                )
                .await
                .is_err()
            {
                return refuse(502, "client_gone", server_name(), false);
            }
            match send_body(client, inbuf, conn, r, pool, deadline).await {
                Ok(()) => body_done = true,
                Err(BodyError::Client(status, reason)) => {
                    return refuse(status, reason, server_name(), false);
                }
                // The upstream stopped taking the body: it may have answered.
                Err(BodyError::Upstream(f)) => {
                    tracing::debug!(pool = %pool.name(), "request body not taken: {}", f.reason());
                }
            }
        }
        let upgrade = websocket_upgrade(head).is_some();
        let response = read_response(
            conn,
            head.method() == &Method::Head,
            upgrade,
            pool,
            deadline,
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
                    }
                    if replay.is_some() {
                        // Put the replayable body back for the next try.
                        let mut again = first.split_off(req_head.len());
                        again.extend_from_slice(inbuf);
                        *inbuf = again;
                    }
                    continue;
                }
                return refuse(f.status(), f.reason(), server_name(), body_done);
            }
        };
        pool.succeeded(lease.server, sent_at.elapsed());
        let server = server_name().unwrap_or_default();
        if resp.status() == 101 {
            return tunnel(client, out, inbuf, r, pool, lease, &resp, ubuf, server).await;
        }
        return relay(
            client, out, r, pool, lease, resp, ubuf, body_done, server, deadline,
        )
        .await;
    }
    match last {
        Some(Failed { failure, server }) => {
            let server = server
                .and_then(|i| pool.servers.get(i))
                .map(|s| s.cfg.address.clone());
            // Nothing was taken from the client's body unless it was replayable.
            refuse(
                failure.status(),
                failure.reason(),
                server,
                replay.is_some() || head.body() == BodyFraming::None,
            )
        }
        None => refuse(503, Failure::NoServer.reason(), None, replay.is_some()),
    }
}

/// Runs `fut` under `per`, and under the exchange's `deadline` when set.
async fn within<T>(
    deadline: Option<Instant>,
    per: Duration,
    on_timeout: Failure,
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let own = Instant::now() + per;
    let (at, why) = match deadline {
        Some(d) if d < own => (d, Failure::TotalTimeout),
        _ => (own, on_timeout),
    };
    timeout_at(at.into(), fut).await.unwrap_or(Err(why))
}

/// Writes and empties `buf` within the send timeout.
async fn send<D: Downstream>(client: &mut D, buf: &mut Vec<u8>, limit: Duration) -> Result<(), ()> {
    let r = tokio::time::timeout(limit, async {
        client.write_all(buf).await?;
        client.flush().await
    })
    .await;
    buf.clear();
    match r {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

enum BodyError {
    /// The client's fault: answer this status.
    Client(u16, &'static str),
    /// Writing to the upstream failed.
    Upstream(Failure),
}

/// Streams the request body to the upstream: Content-Length bodies as
/// they are, chunked ones decoded and chunked again (extensions and
/// trailers dropped), so only well-formed framing reaches the upstream.
async fn send_body<D: Downstream>(
    client: &mut D,
    inbuf: &mut Vec<u8>,
    conn: &mut UpstreamConn,
    r: &Request<'_>,
    pool: &Pool,
    deadline: Option<Instant>,
) -> Result<(), BodyError> {
    let client_deadline = Instant::now() + r.body_timeout;
    let mut buf = vec![0u8; CHUNK];
    match r.head.body() {
        BodyFraming::None => Ok(()),
        BodyFraming::ContentLength(total) => {
            let have = usize::try_from(total)
                .unwrap_or(usize::MAX)
                .min(inbuf.len());
            let mut left = total - have as u64;
            let first: Vec<u8> = inbuf.drain(..have).collect();
            if !first.is_empty() {
                up_write(conn, &first, pool, deadline)
                    .await
                    .map_err(BodyError::Upstream)?;
            }
            while left > 0 {
                let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
                let n = read_client(
                    client,
                    buf.get_mut(..want).unwrap_or_default(),
                    client_deadline,
                )
                .await?;
                left -= n as u64;
                up_write(conn, buf.get(..n).unwrap_or_default(), pool, deadline)
                    .await
                    .map_err(BodyError::Upstream)?;
            }
            conn.stream
                .flush()
                .await
                .map_err(|_| BodyError::Upstream(Failure::Reset))
        }
        BodyFraming::Chunked => {
            let mut decoder = ChunkedDecoder::new(r.max_body, MAX_TRAILER);
            let mut data = Vec::with_capacity(CHUNK);
            loop {
                data.clear();
                let d = decoder.decode(inbuf, &mut data).map_err(|e| {
                    BodyError::Client(
                        e.status(),
                        if e.status() == 413 {
                            "body_too_large"
                        } else {
                            "bad_chunked_body"
                        },
                    )
                })?;
                inbuf.drain(..d.consumed.min(inbuf.len()));
                let mut framed = Vec::with_capacity(data.len() + 16);
                if !data.is_empty() {
                    framed.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                    framed.extend_from_slice(&data);
                    framed.extend_from_slice(b"\r\n");
                }
                if d.done {
                    framed.extend_from_slice(b"0\r\n\r\n");
                }
                if !framed.is_empty() {
                    up_write(conn, &framed, pool, deadline)
                        .await
                        .map_err(BodyError::Upstream)?;
                }
                if d.done {
                    return conn
                        .stream
                        .flush()
                        .await
                        .map_err(|_| BodyError::Upstream(Failure::Reset));
                }
                let n = read_client(client, &mut buf, client_deadline).await?;
                inbuf.extend_from_slice(buf.get(..n).unwrap_or_default());
            }
        }
    }
}

/// Writes request body bytes to the upstream under its idle timeout.
async fn up_write(
    conn: &mut UpstreamConn,
    data: &[u8],
    pool: &Pool,
    deadline: Option<Instant>,
) -> Result<(), Failure> {
    let fut = async {
        conn.stream
            .write_all(data)
            .await
            .map_err(|_| Failure::Reset)
    };
    within(deadline, pool.cfg.idle_timeout, Failure::IdleTimeout, fut).await
}

async fn read_client<D: Downstream>(
    client: &mut D,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, BodyError> {
    match timeout_at(deadline.into(), client.read(buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(n),
        Ok(_) => Err(BodyError::Client(400, "client_gone")),
        Err(_) => Err(BodyError::Client(408, "body_timeout")),
    }
}

/// Reads the final response head (skipping interim 1xx ones); returns it
/// and the bytes read past it.
async fn read_response(
    conn: &mut UpstreamConn,
    head_request: bool,
    upgrade: bool,
    pool: &Pool,
    deadline: Option<Instant>,
) -> Result<(ResponseHead, Vec<u8>), Failure> {
    // As large as the first read reserves below: no reallocation (and copy)
    // per response.
    let mut ubuf: Vec<u8> = Vec::with_capacity(READ_RESERVE);
    let mut interim = 0;
    let fut = async {
        loop {
            match parse_response(&ubuf, MAX_RESPONSE_HEAD, MAX_RESPONSE_HEADERS, head_request) {
                Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => {
                    interim += 1;
                    if interim > MAX_INTERIM {
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

/// Sends the response head and streams the body to the client.
#[allow(clippy::too_many_arguments)]
async fn relay<D: Downstream>(
    client: &mut D,
    out: &mut Vec<u8>,
    r: &Request<'_>,
    pool: &Pool,
    mut lease: Lease<'_>,
    resp: ResponseHead,
    mut ubuf: Vec<u8>,
    body_done: bool,
    server: String,
    deadline: Option<Instant>,
) -> Outcome {
    let status = resp.status();
    let framing = resp.framing();
    let http10_client = r.head.version() == Version::Http10;
    let reframe = matches!(
        framing,
        ResponseFraming::Chunked | ResponseFraming::UntilClose
    );
    // A 1.0 client cannot take chunked: the body then ends with the connection.
    let close_delimited = reframe && http10_client;
    let keep_client = r.keep_alive && body_done && !close_delimited;
    write_status_line(out, status);
    let named = connection_named(resp.headers());
    for (name, value) in resp.headers() {
        if !dropped(name, RESPONSE_DROP, &named) {
            write_header(out, name, value);
        }
    }
    match framing {
        ResponseFraming::Length(n) => write_header_u64(out, "Content-Length", n),
        ResponseFraming::None => {
            // HEAD and 304 answers keep the length they describe.
            if let Some(cl) = resp.header("content-length") {
                write_header(out, "Content-Length", cl);
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
    let idle = pool.cfg.idle_timeout;
    let mut sent: u64 = 0;
    // Only bodies longer than what came with the head need it.
    let mut buf: Vec<u8> = Vec::new();
    let abort = |sent: u64, f: &'static str| Outcome::Aborted {
        status,
        body_bytes: sent,
        server: server.clone(),
        reason: f,
    };
    // Reads more of the body from the upstream; 0 at its end.
    macro_rules! up_read {
        () => {
            match within(deadline, idle, Failure::IdleTimeout, async {
                if buf.is_empty() {
                    buf.resize(CHUNK, 0);
                }
                conn.stream
                    .read(&mut buf)
                    .await
                    .map_err(|_| Failure::Truncated)
            })
            .await
            {
                Ok(n) => n,
                Err(f) => {
                    pool.failed(lease.server, f);
                    return abort(sent, f.reason());
                }
            }
        };
    }
    macro_rules! to_client {
        () => {
            if send(client, out, r.send_timeout).await.is_err() {
                return abort(sent, "client_gone");
            }
        };
    }
    let mut reusable = resp.keep_alive();
    match framing {
        ResponseFraming::None => {
            to_client!();
            reusable &= ubuf.is_empty();
        }
        ResponseFraming::Length(total) => {
            let have = usize::try_from(total).unwrap_or(usize::MAX).min(ubuf.len());
            out.extend(ubuf.drain(..have));
            sent += have as u64;
            // Bytes past the announced length: the framing is in doubt.
            reusable &= ubuf.is_empty();
            to_client!();
            while sent < total {
                let n = up_read!();
                if n == 0 {
                    pool.failed(lease.server, Failure::Truncated);
                    return abort(sent, Failure::Truncated.reason());
                }
                let take = usize::try_from(total - sent).map_or(n, |l| l.min(n));
                if take < n {
                    reusable = false;
                }
                out.extend_from_slice(buf.get(..take).unwrap_or_default());
                sent += take as u64;
                to_client!();
            }
        }
        ResponseFraming::Chunked => {
            let mut decoder = ChunkedDecoder::new(u64::MAX, MAX_TRAILER);
            let mut data = Vec::with_capacity(CHUNK);
            let mut input = std::mem::take(&mut ubuf);
            loop {
                data.clear();
                let d = match decoder.decode(&input, &mut data) {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::debug!("upstream chunked body refused: {e}");
                        pool.failed(lease.server, Failure::BadResponse);
                        return abort(sent, Failure::BadResponse.reason());
                    }
                };
                input.drain(..d.consumed.min(input.len()));
                sent += data.len() as u64;
                put_body(out, &data, !close_delimited);
                if d.done {
                    if !close_delimited {
                        out.extend_from_slice(b"0\r\n\r\n");
                    }
                    reusable &= input.is_empty();
                    to_client!();
                    break;
                }
                to_client!();
                let n = up_read!();
                if n == 0 {
                    pool.failed(lease.server, Failure::Truncated);
                    return abort(sent, Failure::Truncated.reason());
                }
                input.extend_from_slice(buf.get(..n).unwrap_or_default());
            }
        }
        ResponseFraming::UntilClose => {
            reusable = false;
            let first = std::mem::take(&mut ubuf);
            sent += first.len() as u64;
            put_body(out, &first, !close_delimited);
            to_client!();
            loop {
                let n = up_read!();
                if n == 0 {
                    break;
                }
                sent += n as u64;
                put_body(out, buf.get(..n).unwrap_or_default(), !close_delimited);
                to_client!();
            }
            if !close_delimited {
                out.extend_from_slice(b"0\r\n\r\n");
                to_client!();
            }
        }
    }
    if reusable {
        pool.check_in(conn);
    }
    Outcome::Relayed {
        status,
        body_bytes: sent,
        server,
        keep_client,
    }
}

/// Appends body bytes, as one chunk when `chunked`.
fn put_body(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(data);
    }
}

/// After a 101 to a WebSocket upgrade: the switch relayed, then bytes
/// copied both ways until either side closes or both stay silent for the
/// pool's `idle_timeout`. The client connection ends with the tunnel.
#[allow(clippy::too_many_arguments)]
async fn tunnel<D: Downstream>(
    client: &mut D,
    out: &mut Vec<u8>,
    inbuf: &mut Vec<u8>,
    r: &Request<'_>,
    pool: &Pool,
    mut lease: Lease<'_>,
    resp: &ResponseHead,
    ubuf: Vec<u8>,
    server: String,
) -> Outcome {
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
    let named = connection_named(resp.headers());
    for (name, value) in resp.headers() {
        if !dropped(name, RESPONSE_DROP, &named) {
            write_header(out, name, value);
        }
    }
    write_header(out, "Upgrade", b"websocket");
    write_header(out, "Connection", b"upgrade");
    end_head(out);
    out.extend_from_slice(&ubuf);
    let mut down: u64 = ubuf.len() as u64;
    let done = |down: u64| Outcome::Relayed {
        status: 101,
        body_bytes: down,
        server: server.clone(),
        keep_client: false,
    };
    if send(client, out, r.send_timeout).await.is_err() {
        return done(down);
    }
    // What the client sent after its request head belongs to the tunnel.
    if !inbuf.is_empty() {
        if conn.stream.write_all(inbuf).await.is_err() {
            return done(down);
        }
        inbuf.clear();
    }
    let idle = pool.cfg.idle_timeout;
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_server = vec![0u8; 16 * 1024];
    loop {
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                n = client.read(&mut from_client) => (true, n),
                n = conn.stream.read(&mut from_server) => (false, n),
            }
        })
        .await;
        let (client_side, n) = match step {
            Ok((side, Ok(n))) if n > 0 => (side, n),
            // A close, an error, or silence both ways: the tunnel ends.
            _ => return done(down),
        };
        let ok = if client_side {
            let data = from_client.get(..n).unwrap_or_default();
            within(None, idle, Failure::IdleTimeout, async {
                conn.stream
                    .write_all(data)
                    .await
                    .map_err(|_| Failure::Reset)?;
                conn.stream.flush().await.map_err(|_| Failure::Reset)
            })
            .await
            .is_ok()
        } else {
            down += n as u64;
            out.extend_from_slice(from_server.get(..n).unwrap_or_default());
            send(client, out, r.send_timeout).await.is_ok()
        };
        if !ok {
            return done(down);
        }
    }
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
        let r = Request {
            head: &head,
            peer: peer.parse().unwrap(),
            client_cert: None,
            max_body: 0,
            body_timeout: Duration::from_secs(1),
            send_timeout: Duration::from_secs(1),
            keep_alive: true,
        };
        String::from_utf8(upstream_head(&r)).unwrap()
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
}
