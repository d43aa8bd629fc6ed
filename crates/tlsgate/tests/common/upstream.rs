//! Upstreams for the proxy tests: an HTTP/1.1 server of the tests' own
//! (plain or TLS, keep-alive, behaviour chosen by path) and Python's
//! http.server as a peer not written in Rust, with the config pieces that
//! route to them. Shared by tests/proxy.rs and tests/h2_proxy.rs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

use super::{Fixture, Server, TlsStream};

// ---------------------------------------------------------------------
// Client side: responses read off a keep-alive connection.
// ---------------------------------------------------------------------

/// A response read off a keep-alive connection.
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Reads one response (Content-Length, chunked, or until close).
pub fn read_response(s: &mut TlsStream, head_request: bool) -> std::io::Result<Response> {
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if head_request || status == 204 || status == 304 {
    } else if lower.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end)?;
                break;
            }
            let at = body.len();
            body.resize(at + n, 0);
            r.read_exact(&mut body[at..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(cl) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
    {
        body.resize(cl.trim().parse().unwrap(), 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response { status, head, body })
}

/// `GET path` (Host: app.test, `extra` header lines) and its response.
pub fn get(s: &mut TlsStream, path: &str, extra: &str) -> std::io::Result<Response> {
    // One write: a request in pieces meets Nagle and delayed ACKs.
    let req = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n{extra}\r\n");
    s.write_all(req.as_bytes())?;
    s.flush()?;
    read_response(s, false)
}

pub fn body_text(r: &Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

// ---------------------------------------------------------------------
// A test upstream: HTTP/1.1 with keep-alive, behaviour chosen by path.
// ---------------------------------------------------------------------

pub trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// A running test upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Complete requests it read.
    pub requests: Arc<AtomicUsize>,
    /// Connections it accepted.
    pub conns: Arc<AtomicUsize>,
    /// Connections that ended (closed by either side).
    pub closed: Arc<AtomicUsize>,
    /// Set to stop: the listener closes and every connection with it.
    pub stop: Arc<AtomicBool>,
    /// What `/health` answers.
    pub healthy: Arc<AtomicBool>,
    /// The last request head it read.
    pub last_head: Arc<Mutex<String>>,
    /// TLS connections that resumed a session.
    pub resumed: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn start(name: &str, tls: Option<Arc<ServerConfig>>) -> Upstream {
        Upstream::start_at(name, "127.0.0.1:0", tls)
    }

    /// Like `start`, listening on `addr` (another loopback address, a
    /// chosen port).
    pub fn start_at(name: &str, addr: &str, tls: Option<Arc<ServerConfig>>) -> Upstream {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let up = Upstream {
            addr: listener.local_addr().unwrap(),
            requests: Arc::default(),
            conns: Arc::default(),
            closed: Arc::default(),
            stop: Arc::default(),
            healthy: Arc::new(AtomicBool::new(true)),
            last_head: Arc::default(),
            resumed: Arc::default(),
        };
        let (name, requests, conns, closed, stop, healthy, last, resumed) = (
            name.to_string(),
            up.requests.clone(),
            up.conns.clone(),
            up.closed.clone(),
            up.stop.clone(),
            up.healthy.clone(),
            up.last_head.clone(),
            up.resumed.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let sock = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                conns.fetch_add(1, Ordering::Relaxed);
                sock.set_nonblocking(false).unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(50)))
                    .unwrap();
                let (name, requests, closed, stop, healthy, last, tls, resumed) = (
                    name.clone(),
                    requests.clone(),
                    closed.clone(),
                    stop.clone(),
                    healthy.clone(),
                    last.clone(),
                    tls.clone(),
                    resumed.clone(),
                );
                std::thread::spawn(move || {
                    let io: Box<dyn Io> = match tls {
                        Some(cfg) => {
                            let mut conn = ServerConnection::new(cfg).unwrap();
                            let mut sock = sock;
                            // The handshake first, to see how it went.
                            while conn.is_handshaking() && !stop.load(Ordering::Relaxed) {
                                match conn.complete_io(&mut sock) {
                                    Ok(_) => {}
                                    Err(e)
                                        if e.kind() == std::io::ErrorKind::WouldBlock
                                            || e.kind() == std::io::ErrorKind::TimedOut => {}
                                    Err(_) => {
                                        closed.fetch_add(1, Ordering::Relaxed);
                                        return;
                                    }
                                }
                            }
                            if conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                                resumed.fetch_add(1, Ordering::Relaxed);
                            }
                            Box::new(StreamOwned::new(conn, sock))
                        }
                        None => Box::new(sock),
                    };
                    serve_conn(io, &name, &requests, &stop, &healthy, &last);
                    closed.fetch_add(1, Ordering::Relaxed);
                });
            }
            // The listener is dropped here: connects are refused from now on.
        });
        up
    }

    pub fn kill(&self) {
        self.stop.store(true, Ordering::Relaxed);
        // Until the accept loop noticed, a connect could still succeed.
        std::thread::sleep(Duration::from_millis(100));
    }

    pub fn address(&self) -> String {
        self.addr.to_string()
    }
}

/// Reads from `io` into `buf` until `pred` holds; false at EOF or stop.
pub fn fill(
    io: &mut dyn Io,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    pred: impl Fn(&[u8]) -> bool,
) -> bool {
    let mut chunk = [0u8; 65536];
    while !pred(buf) {
        match io.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads the next chunk of a chunked body off `io`, `buf` holding the
/// bytes read past it: `Some(data)`, empty once the body ended (trailers
/// skipped); `None` at EOF or stop. One chunk at a time: a 100 MiB body
/// costs its bytes, not their square.
pub fn next_chunk(io: &mut dyn Io, buf: &mut Vec<u8>, stop: &AtomicBool) -> Option<Vec<u8>> {
    if !fill(io, buf, stop, |b| find(b, b"\r\n").is_some()) {
        return None;
    }
    let line_end = find(buf, b"\r\n").unwrap();
    let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
    let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
    buf.drain(..line_end + 2);
    if size == 0 {
        // Trailer lines up to the empty one.
        loop {
            if !fill(io, buf, stop, |b| find(b, b"\r\n").is_some()) {
                return None;
            }
            let end = find(buf, b"\r\n").unwrap();
            buf.drain(..end + 2);
            if end == 0 {
                return Some(Vec::new());
            }
        }
    }
    if !fill(io, buf, stop, |b| b.len() >= size + 2) {
        return None;
    }
    let data = buf[..size].to_vec();
    buf.drain(..size + 2);
    Some(data)
}

pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

fn serve_conn(
    mut io: Box<dyn Io>,
    name: &str,
    requests: &AtomicUsize,
    stop: &AtomicBool,
    healthy: &AtomicBool,
    last: &Mutex<String>,
) {
    let mut buf = Vec::new();
    // Set by `/then-drop`: the connection's next request is read and the
    // connection closed without an answer (a keep-alive close race).
    let mut drop_next = false;
    loop {
        if !fill(io.as_mut(), &mut buf, stop, |b| {
            find(b, b"\r\n\r\n").is_some()
        }) {
            return;
        }
        if drop_next {
            return;
        }
        let head_len = find(&buf, b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
        buf.drain(..head_len);
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_string();
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        if request_line.starts_with("POST /early ") {
            // Refuses an upload before reading its body, then reads nothing
            // more (and keeps the connection) until stopped or 30 s pass.
            let refusal = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo big!";
            let _ = io.write_all(refusal).and_then(|()| io.flush());
            let until = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        let chunked_request = headers
            .get("transfer-encoding")
            .is_some_and(|v| v == "chunked");
        let target_ends = |tail: &str| {
            request_line
                .split(' ')
                .nth(1)
                .is_some_and(|t| t.ends_with(tail))
        };
        if request_line.starts_with("POST ") && target_ends("/duplex") {
            // Answers at once, then sends each piece of the body back as
            // it comes (a bidirectional stream over HTTP/1.1): a client
            // sees its first piece again before it sends the second.
            let length = headers.get("content-length").map(|v| v.parse().unwrap());
            if !echo_as_it_comes(io.as_mut(), &mut buf, stop, length) {
                return;
            }
            requests.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let body = if chunked_request {
            let mut body = Vec::new();
            loop {
                match next_chunk(io.as_mut(), &mut buf, stop) {
                    None => return,
                    Some(chunk) if chunk.is_empty() => break,
                    Some(chunk) => body.extend_from_slice(&chunk),
                }
            }
            body
        } else {
            let n: usize = headers
                .get("content-length")
                .map_or(0, |v| v.parse().unwrap());
            if !fill(io.as_mut(), &mut buf, stop, |b| b.len() >= n) {
                return;
            }
            buf.drain(..n).collect()
        };
        requests.fetch_add(1, Ordering::Relaxed);
        *last.lock().unwrap() = head.clone();
        let target = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let ok = |body: &[u8]| {
            let mut r =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            r.extend_from_slice(body);
            r
        };
        let chunked = |body: &[u8]| {
            let mut r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for c in body.chunks(100_000) {
                r.extend_from_slice(&chunk_of(c));
            }
            r.extend_from_slice(b"0\r\n\r\n");
            r
        };
        let answer: Vec<u8> = match path {
            "/id" => ok(name.as_bytes()),
            "/then-drop" => {
                drop_next = true;
                ok(name.as_bytes())
            }
            "/headers" => ok(head.as_bytes()),
            // Ten interim `102 Processing` heads, 20 ms apart, then 200.
            "/processing" => {
                for _ in 0..10 {
                    if io
                        .write_all(b"HTTP/1.1 102 Processing\r\n\r\n")
                        .and_then(|()| io.flush())
                        .is_err()
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                ok(b"done")
            }
            // Hop-by-hop fields of every kind around one that passes.
            "/hop" => b"HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\nTrailer: X-T\r\nX-End: kept\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n".to_vec(),
            // A body that stops short of its length, then the connection closes.
            "/truncated" => {
                let mut r = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n".to_vec();
                r.extend_from_slice(&pattern(100_000));
                let _ = io.write_all(&r).and_then(|()| io.flush());
                return;
            }
            // A chunk every 300 ms for 3 s: a body slower than a client.
            "/drip" => {
                let _ = io
                    .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .and_then(|()| io.flush());
                for _ in 0..10 {
                    std::thread::sleep(Duration::from_millis(300));
                    if io.write_all(b"4\r\ndrip\r\n").and_then(|()| io.flush()).is_err() {
                        return;
                    }
                }
                let _ = io.write_all(b"0\r\n\r\n").and_then(|()| io.flush());
                return;
            }
            "/echo" => chunked(&body),
            "/gen" => chunked(&pattern(query.trim_start_matches("n=").parse().unwrap_or(0))),
            "/len" => ok(&pattern(query.trim_start_matches("n=").parse().unwrap_or(0))),
            // Answers after `ms` milliseconds.
            "/sleep" => {
                let ms = query.trim_start_matches("ms=").parse().unwrap_or(0);
                std::thread::sleep(Duration::from_millis(ms));
                ok(b"slept")
            }
            "/slow" => {
                std::thread::sleep(Duration::from_secs(3));
                ok(b"late")
            }
            "/health" if healthy.load(Ordering::Relaxed) => ok(b"fine"),
            "/health" => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec(),
            "/bad/clte" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            "/bad/dupcl" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk".to_vec(),
            "/bad/lf" => b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok".to_vec(),
            "/bad/cr" => b"HTTP/1.1 200 OK\r\nX-Evil: a\rSet-Cookie: b\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/bad/nul" => b"HTTP/1.1 200 OK\r\nX-Evil: a\x00b\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "/bad/te" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked, identity\r\n\r\n".to_vec(),
            // Chunked last, and well formed: but a coding the proxy would
            // strip without decoding it.
            "/bad/gzipte" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec(),
            "/listlen" => b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok".to_vec(),
            "/204len" => b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n".to_vec(),
            "/bad/101" => b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec(),
            "/ws" => {
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
                if io.write_all(switch).and_then(|()| io.flush()).is_err() {
                    return;
                }
                // Echo every byte (frames untouched) until the peer closes.
                let mut echo = std::mem::take(&mut buf);
                loop {
                    if !echo.is_empty() {
                        if io.write_all(&echo).and_then(|()| io.flush()).is_err() {
                            return;
                        }
                        echo.clear();
                    }
                    if !fill(io.as_mut(), &mut echo, stop, |b| !b.is_empty()) {
                        return;
                    }
                }
            }
            // obs-fold (RFC 9112 §5.2): refused, never unfolded.
            "/bad/fold" => b"HTTP/1.1 200 OK\r\nX-Evil: a\r\n b\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            // A head over the proxy's 64 KiB limit (a large Set-Cookie or
            // CSP): the application's answer, not a failing server.
            "/bad/bighead" => {
                let mut r = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
                r.resize(r.len() + 70_000, b'b');
                r.extend_from_slice(b"\r\nContent-Length: 2\r\n\r\nok");
                r
            }
            // A 204 that claims a body.
            "/bad/204body" => b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nevil!".to_vec(),
            // Interim answers before the final one.
            "/interim" => b"HTTP/1.1 103 Early Hints\r\nLink: </x.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            // A 304 (no body, whatever it says) followed by more bytes.
            "/bad/304extra" => b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 5\r\n\r\nevil!".to_vec(),
            // A bodiless answer whose described body follows 200 ms later,
            // after any check an idle pool can make; the body looks like
            // a response of its own.
            "/bad/late-head-body" | "/bad/late-304-body" => {
                let fake: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!";
                let status = if path == "/bad/late-head-body" { "200 OK" } else { "304 Not Modified" };
                let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n", fake.len());
                if io.write_all(head.as_bytes()).and_then(|()| io.flush()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
                fake.to_vec()
            }
            "/bad/extra" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!".to_vec(),
            // The same past a body longer than the proxy's first read.
            "/bad/extra-big" => {
                let mut r = ok(&pattern(65_536));
                r.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!");
                r
            }
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        };
        if io.write_all(&answer).and_then(|()| io.flush()).is_err() {
            return;
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// `data` framed as one chunk of a chunked body.
fn chunk_of(data: &[u8]) -> Vec<u8> {
    let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
    chunk.extend_from_slice(data);
    chunk.extend_from_slice(b"\r\n");
    chunk
}

/// `/duplex`: a 200 with a chunked body at once, then every piece of the
/// request body (`length` bytes, or chunked) sent back as a chunk as soon
/// as it is read. False when the connection ended first.
fn echo_as_it_comes(
    io: &mut dyn Io,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    length: Option<usize>,
) -> bool {
    let echo = |io: &mut dyn Io, data: &[u8]| {
        io.write_all(&chunk_of(data))
            .and_then(|()| io.flush())
            .is_ok()
    };
    let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    if io.write_all(head).and_then(|()| io.flush()).is_err() {
        return false;
    }
    match length {
        Some(mut left) => {
            while left > 0 {
                if !fill(io, buf, stop, |b| !b.is_empty()) {
                    return false;
                }
                let n = left.min(buf.len());
                if !echo(io, &buf[..n]) {
                    return false;
                }
                buf.drain(..n);
                left -= n;
            }
        }
        None => loop {
            match next_chunk(io, buf, stop) {
                None => return false,
                Some(chunk) if chunk.is_empty() => break,
                Some(chunk) if !echo(io, &chunk) => return false,
                Some(_) => {}
            }
        },
    }
    io.write_all(b"0\r\n\r\n").and_then(|()| io.flush()).is_ok()
}

// ---------------------------------------------------------------------
// PKI for upstream TLS.
// ---------------------------------------------------------------------

/// A leaf signed by `ca`: (cert DER, key DER, cert PEM path, key PEM path).
pub fn make_leaf(
    dir: &Path,
    stem: &str,
    names: &[&str],
    client: bool,
    ca: &(rcgen::Certificate, rcgen::KeyPair),
) -> (CertificateDer<'static>, Vec<u8>, PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, stem);
    p.extended_key_usages = vec![if client {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    }];
    let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
    let c = dir.join(format!("{stem}.crt"));
    let k = dir.join(format!("{stem}.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (cert.der().clone(), key.serialize_der(), c, k)
}

pub fn upstream_tls(
    cert: &CertificateDer<'static>,
    key: &[u8],
    client_ca: Option<&rcgen::Certificate>,
) -> Arc<ServerConfig> {
    let provider = Arc::new(super::provider());
    let b = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let b = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.der().clone()).unwrap();
            b.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap(),
            )
        }
        None => b.with_no_client_auth(),
    };
    Arc::new(
        b.with_single_cert(
            vec![cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.to_vec())),
        )
        .unwrap(),
    )
}

// ---------------------------------------------------------------------
// Python's http.server: an upstream not written in Rust.
// ---------------------------------------------------------------------

pub struct Python {
    child: Child,
    pub addr: SocketAddr,
}

impl Python {
    pub fn start(dir: &Path, id: &str) -> Python {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("id"), id).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 must be installed (./dev setup installs it)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "python http.server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Python { child, addr }
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pool table with `servers` and extra top-level keys.
pub fn pool(name: &str, servers: &[(String, u32)], keys: &str, tables: &str) -> String {
    let mut s = format!("[[upstream]]\nname = {name:?}\n{keys}\n");
    for (addr, weight) in servers {
        s.push_str(&format!(
            "[[upstream.server]]\naddress = {addr:?}\nweight = {weight}\n"
        ));
    }
    s.push_str(tables);
    s.push('\n');
    s
}

pub fn route(path: &str, upstream: &str, extra: &str) -> String {
    format!("[[listener.route]]\npath = {path:?}\nupstream = {upstream:?}\n{extra}\n")
}

/// Routes from (path prefix, pool) pairs.
pub fn routes(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(p, u)| route(p, u, "")).collect()
}

/// Clients here open a connection per request, faster than the default
/// handshake rate limit per source allows.
pub const NO_RATE_LIMIT: &str = "[limits]\nhandshake_rate_per_source = 0\n";

/// An upstream and tlsgate in front of it for the early-answer tests: the
/// upstream's `/early` refuses an upload before reading it, and the pool's
/// idle timeout is long (the old exchange sent the whole body first and
/// stalled until it passed); uploads up to 200 MiB pass the route.
pub fn start_early_answering(fx: &Fixture) -> (Upstream, Server) {
    let a = Upstream::start("a", None);
    let pools = pool("early", &[(a.address(), 1)], "idle_timeout = \"30s\"", "");
    let server = start(
        fx,
        "",
        &pools,
        &route("/", "early", "max_body_bytes = 209715200"),
    );
    (a, server)
}

/// Starts tlsgate with `pools` (before the listener) and `routes`.
pub fn start(fx: &Fixture, top: &str, pools: &str, routes: &str) -> Server {
    let top = format!("[server]\nworkers = 2\n{top}\n{NO_RATE_LIMIT}\n{pools}");
    Server::start(fx, &fx.config(&top, routes))
}
