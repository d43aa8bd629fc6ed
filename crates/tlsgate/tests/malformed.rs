//! Malformed, hostile and edge-case requests against the real `tlsgate`
//! binary over real TLS: exact statuses, exact framing, connection closes,
//! and that the server stays healthy afterwards.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const INDEX: &str = "<h1>index</h1>\n";
const SUB_INDEX: &str = "<p>sub</p>\n";
const SECRET: &str = "TOP SECRET";

/// Small limits so every limit can be hit cheaply; a long keep-alive so a
/// connection the server fails to close shows up as a read timeout.
const TOP: &str = "[server]\nworkers = 2\n\n[limits]\nhandshake_timeout = \"3s\"\nheader_timeout = \"5s\"\nkeepalive_timeout = \"30s\"\nbody_timeout = \"5s\"\nmax_uri_bytes = 256\nmax_header_bytes = 2048\nmax_headers = 20\nmax_body_bytes = 1000\n";

/// How long a client waits for more bytes before deciding the server is
/// keeping the connection open (well below keepalive_timeout).
const READ_LIMIT: Duration = Duration::from_secs(5);

/// A valid request pipelined after a bad one: it must never be answered.
const FOLLOW: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// A running server and its site; the server is dropped (killed) first.
struct Env {
    server: Server,
    fx: Fixture,
}

fn start() -> Env {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config(TOP, ""));
    Env { server, fx }
}

/// What came back on one connection.
struct Answer {
    bytes: Vec<u8>,
    /// The server closed (clean close_notify, EOF or reset), as opposed to
    /// the read timing out with the connection still open.
    closed: bool,
}

fn read_answer(s: &mut TlsStream) -> Answer {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 16384];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => bytes.extend_from_slice(buf.get(..n).expect("n <= buf.len()")),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    Answer { bytes, closed }
}

/// Connects over TLS, sends `parts` as separate writes, reads until close.
fn exchange_parts(srv: &Server, parts: &[&[u8]]) -> Answer {
    let mut s = tls_connect(srv.addr);
    s.sock
        .set_read_timeout(Some(READ_LIMIT))
        .expect("set_read_timeout");
    for p in parts {
        // The server may already have closed after an early error; what it
        // answered is still readable.
        if s.write_all(p).and_then(|()| s.flush()).is_err() {
            break;
        }
    }
    read_answer(&mut s)
}

fn exchange(srv: &Server, request: &[u8]) -> Answer {
    exchange_parts(srv, &[request])
}

/// One parsed response.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Splits an answer into responses (`head_only[i]`: response `i` answers a
/// HEAD, so it has no body). Returns the responses and any bytes left over
/// that do not form a complete response.
fn parse_responses(bytes: &[u8], head_only: &[bool]) -> (Vec<Resp>, Vec<u8>) {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(rest.get(..end).unwrap_or_default()).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let Some(status) = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse::<u16>().ok())
        else {
            break;
        };
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_string(), v.trim().to_string()))
            .collect();
        let no_body = head_only.get(out.len()).copied().unwrap_or(false) || status == 304;
        let len = if no_body {
            0
        } else {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0)
        };
        let body_start = end + 4;
        let Some(body) = rest.get(body_start..body_start + len) else {
            break;
        };
        out.push(Resp {
            status,
            headers,
            body: body.to_vec(),
        });
        rest = rest.get(body_start + len..).unwrap_or_default();
    }
    (out, rest.to_vec())
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

fn show(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() > 300 {
        format!(
            "{:?}... ({} bytes)",
            s.get(..300).unwrap_or_default(),
            bytes.len()
        )
    } else {
        format!("{s:?}")
    }
}

/// A normal request on a new connection is answered 200 with the right body.
fn healthy(srv: &Server) -> Result<(), String> {
    let ans = exchange(
        srv,
        b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    let (resps, rest) = parse_responses(&ans.bytes, &[]);
    match resps.as_slice() {
        [r] if r.status == 200 && r.body == HELLO.as_bytes() && rest.is_empty() && ans.closed => {
            Ok(())
        }
        _ => Err(format!(
            "server unhealthy afterwards: a normal GET got {}",
            show(&ans.bytes)
        )),
    }
}

/// Checks that the answer is exactly one error response `status` with its
/// standard body, `Connection: close`, nothing after it, and a closed
/// connection.
fn check_single_error(ans: &Answer, status: u16, head_only: bool) -> Result<(), String> {
    let (resps, rest) = parse_responses(&ans.bytes, &[head_only]);
    let got = show(&ans.bytes);
    let [r] = resps.as_slice() else {
        return Err(format!(
            "expected exactly one {status} response, got {} responses: {got}",
            resps.len()
        ));
    };
    if r.status != status {
        return Err(format!("expected {status}, got {}: {got}", r.status));
    }
    if r.header("connection") != Some("close") {
        return Err(format!("{status} without Connection: close: {got}"));
    }
    let body = format!("{status} {}\n", reason(status));
    if r.header("content-length") != Some(body.len().to_string().as_str()) {
        return Err(format!("{status} with a wrong Content-Length: {got}"));
    }
    let want_body = if head_only { "" } else { body.as_str() };
    if r.body_str() != want_body {
        return Err(format!("{status} with body {:?}: {got}", r.body_str()));
    }
    if !rest.is_empty() {
        return Err(format!("bytes after the {status} response: {got}"));
    }
    if !ans.closed {
        return Err(format!(
            "connection still open {READ_LIMIT:?} after the {status}: {got}"
        ));
    }
    if String::from_utf8_lossy(&ans.bytes).contains(SECRET) {
        return Err(format!("secret leaked: {got}"));
    }
    Ok(())
}

/// Sends `request` with a valid request pipelined after it: the answer must
/// be exactly one `status` error and a close; then the server is healthy.
fn rejected(srv: &Server, request: &[u8], status: u16) -> Result<(), String> {
    let mut bytes = request.to_vec();
    bytes.extend_from_slice(FOLLOW);
    let ans = exchange(srv, &bytes);
    check_single_error(&ans, status, false)?;
    healthy(srv)
}

/// Runs `rejected` for every case and reports all failures at once.
fn all_rejected(srv: &Server, cases: &[(&str, Vec<u8>, u16)]) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(name, req, status)| {
            rejected(srv, req, *status)
                .err()
                .map(|e| format!("{name} {}: {e}", show(req)))
        })
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn get_close(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A GET of /hello.txt with extra header lines (each without CRLF).
fn get_with(version: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut s = format!("GET /hello.txt {version}\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    let mut v = s.into_bytes();
    v.extend_from_slice(body);
    v
}

/// Sends `request` (which must end the connection itself) and expects
/// exactly the given statuses, nothing after them, and a close.
fn expect_responses(srv: &Server, request: &[u8], head_only: &[bool]) -> Vec<Resp> {
    let ans = exchange(srv, request);
    let (resps, rest) = parse_responses(&ans.bytes, head_only);
    assert!(
        rest.is_empty(),
        "unparsed bytes after {} responses for {}: {}",
        resps.len(),
        show(request),
        show(&rest)
    );
    assert!(
        ans.closed,
        "connection not closed after {}: {}",
        show(request),
        show(&ans.bytes)
    );
    resps
}

fn status_list(resps: &[Resp]) -> Vec<u16> {
    resps.iter().map(|r| r.status).collect()
}

#[test]
fn malformed_request_lines_and_headers_get_400_and_close() {
    let env = start();
    let h = "Host: localhost";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "text garbage",
            b"this is not http at all\r\n\r\n".to_vec(),
            400,
        ),
        (
            "binary garbage",
            b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec(),
            400,
        ),
        (
            "missing version",
            b"GET /hello.txt\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "double space",
            b"GET  /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "lowercase version",
            b"GET /hello.txt http/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "trailing space after version",
            b"GET /hello.txt HTTP/1.1 \r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "tabs as separators",
            b"GET\t/hello.txt\tHTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "bare LF line endings",
            b"GET /hello.txt HTTP/1.1\nHost: localhost\n\n".to_vec(),
            400,
        ),
        (
            "bare LF ending the head",
            b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\n".to_vec(),
            400,
        ),
        (
            "bare LF before the request line",
            b"\nGET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "bare CR line ending",
            b"GET /hello.txt HTTP/1.1\rHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "bare CR inside a header value",
            get_with("HTTP/1.1", &[h, "X-A: a\rb"], b""),
            400,
        ),
        (
            "NUL in a header value",
            get_with("HTTP/1.1", &[h, "X-A: a\0b"], b""),
            400,
        ),
        (
            "NUL in a header name",
            get_with("HTTP/1.1", &[h, "X-\0A: b"], b""),
            400,
        ),
        (
            "space before colon",
            get_with("HTTP/1.1", &[h, "X-A : b"], b""),
            400,
        ),
        (
            "space before colon in Host",
            get_with("HTTP/1.1", &["Host : localhost"], b""),
            400,
        ),
        (
            "empty header name",
            get_with("HTTP/1.1", &[h, ": b"], b""),
            400,
        ),
        (
            "header line without colon",
            get_with("HTTP/1.1", &[h, "X-A b"], b""),
            400,
        ),
        (
            "obs-fold continuation line",
            get_with("HTTP/1.1", &[h, "X-A: a", " b"], b""),
            400,
        ),
        (
            "obs-fold with a tab",
            get_with("HTTP/1.1", &[h, "X-A: a", "\tb"], b""),
            400,
        ),
        (
            "missing Host in HTTP/1.1",
            get_with("HTTP/1.1", &["Accept: */*"], b""),
            400,
        ),
        (
            "missing Host with an absolute-form target",
            b"GET https://localhost/hello.txt HTTP/1.1\r\n\r\n".to_vec(),
            400,
        ),
        (
            "two identical Host headers",
            get_with("HTTP/1.1", &[h, h], b""),
            400,
        ),
        (
            "two different Host headers",
            get_with("HTTP/1.1", &[h, "Host: example.com"], b""),
            400,
        ),
        (
            "Host with a space",
            get_with("HTTP/1.1", &["Host: local host"], b""),
            400,
        ),
        (
            "Host with userinfo",
            get_with("HTTP/1.1", &["Host: user@localhost"], b""),
            400,
        ),
        (
            "fragment in the target",
            b"GET /hello.txt#frag HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "control byte in the target",
            b"GET /hello\x01.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "non-ASCII byte in the target",
            b"GET /hell\xc3\xb6.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "relative target",
            b"GET hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "asterisk target with GET",
            b"GET * HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
        (
            "five empty lines before the request line",
            b"\r\n\r\n\r\n\r\n\r\nGET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
            400,
        ),
    ];
    all_rejected(&env.server, &cases);
}

#[test]
fn leading_empty_lines_up_to_four_are_tolerated() {
    let env = start();
    let mut req = b"\r\n\r\n\r\n\r\n".to_vec();
    req.extend_from_slice(&get_close("/hello.txt"));
    let resps = expect_responses(&env.server, &req, &[]);
    assert_eq!(status_list(&resps), [200]);
    assert_eq!(resps[0].body_str(), HELLO);
}

#[test]
fn unsupported_versions_get_505_and_close() {
    let env = start();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "HTTP/2.0",
            b"GET /hello.txt HTTP/2.0\r\nHost: localhost\r\n\r\n".to_vec(),
            505,
        ),
        (
            "HTTP/3.0",
            b"GET /hello.txt HTTP/3.0\r\nHost: localhost\r\n\r\n".to_vec(),
            505,
        ),
        (
            "HTTP/2 prior-knowledge preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            505,
        ),
    ];
    all_rejected(&env.server, &cases);
}

#[test]
fn request_smuggling_shapes_are_refused() {
    let env = start();
    let h = "Host: localhost";
    let v11 = "HTTP/1.1";
    let zero = b"0\r\n\r\n";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "Content-Length then Transfer-Encoding",
            get_with(
                v11,
                &[h, "Content-Length: 5", "Transfer-Encoding: chunked"],
                zero,
            ),
            400,
        ),
        (
            "Transfer-Encoding then Content-Length",
            get_with(
                v11,
                &[h, "Transfer-Encoding: chunked", "Content-Length: 5"],
                zero,
            ),
            400,
        ),
        (
            "two differing Content-Length",
            get_with(
                v11,
                &[h, "Content-Length: 5", "Content-Length: 6"],
                b"hello!",
            ),
            400,
        ),
        (
            "Content-Length: +5",
            get_with(v11, &[h, "Content-Length: +5"], b"hello"),
            400,
        ),
        (
            "Content-Length: -5",
            get_with(v11, &[h, "Content-Length: -5"], b"hello"),
            400,
        ),
        (
            "Content-Length: 5, 6",
            get_with(v11, &[h, "Content-Length: 5, 6"], b"hello!"),
            400,
        ),
        (
            "Content-Length: 0x5",
            get_with(v11, &[h, "Content-Length: 0x5"], b"hello"),
            400,
        ),
        (
            "Content-Length: 5 5",
            get_with(v11, &[h, "Content-Length: 5 5"], b"hello"),
            400,
        ),
        (
            "Content-Length empty",
            get_with(v11, &[h, "Content-Length:"], b""),
            400,
        ),
        (
            "Content-Length overflowing u64",
            get_with(v11, &[h, "Content-Length: 18446744073709551616"], b""),
            400,
        ),
        (
            "Transfer-Encoding: chunked in HTTP/1.0",
            get_with("HTTP/1.0", &[h, "Transfer-Encoding: chunked"], zero),
            400,
        ),
        (
            "Transfer-Encoding: gzip, chunked",
            get_with(v11, &[h, "Transfer-Encoding: gzip, chunked"], zero),
            501,
        ),
        (
            "Transfer-Encoding: chunked, gzip",
            get_with(v11, &[h, "Transfer-Encoding: chunked, gzip"], zero),
            400,
        ),
        (
            "Transfer-Encoding: chunked twice",
            get_with(
                v11,
                &[
                    h,
                    "Transfer-Encoding: chunked",
                    "Transfer-Encoding: chunked",
                ],
                zero,
            ),
            400,
        ),
        (
            "Transfer-Encoding: identity",
            get_with(v11, &[h, "Transfer-Encoding: identity"], zero),
            400,
        ),
        (
            "Transfer-Encoding: xchunked",
            get_with(v11, &[h, "Transfer-Encoding: xchunked"], zero),
            400,
        ),
        (
            "Transfer-Encoding: chunked;x=1",
            get_with(v11, &[h, "Transfer-Encoding: chunked;x=1"], zero),
            400,
        ),
        (
            "Transfer-Encoding empty",
            get_with(v11, &[h, "Transfer-Encoding:"], zero),
            400,
        ),
    ];
    all_rejected(&env.server, &cases);
}

#[test]
fn invalid_chunked_bodies_get_400_and_close() {
    let env = start();
    let head = "GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    let sized = |size: &str| format!("{head}{size}\r\nhello\r\n0\r\n\r\n").into_bytes();
    let raw = |body: &str| format!("{head}{body}").into_bytes();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("size zz", sized("zz"), 400),
        ("size 0x5", sized("0x5"), 400),
        ("size -1", sized("-1"), 400),
        ("size +5", sized("+5"), 400),
        // 17 digits are refused even when the value is small...
        (
            "size with 17 hex digits, zero-padded",
            sized("00000000000000005"),
            400,
        ),
        (
            "size with 20 hex digits, zero-padded",
            sized("00000000000000000005"),
            400,
        ),
        // ...and a size already above max_body_bytes is 413 as soon as its
        // digits show it (before the 17th).
        ("size with 17 hex digits", sized("10000000000000000"), 413),
        ("size with 17 f digits", sized("fffffffffffffffff"), 413),
        ("size with leading space", sized(" 5"), 400),
        ("empty size line", sized(""), 400),
        ("bare LF after the size", raw("5\nhello\r\n0\r\n\r\n"), 400),
        (
            "data longer than the size",
            raw("3\r\nhello\r\n0\r\n\r\n"),
            400,
        ),
        (
            "data not followed by CRLF",
            raw("5\r\nhelloXX0\r\n\r\n"),
            400,
        ),
        ("bare LF ending the body", raw("5\r\nhello\r\n0\r\n\n"), 400),
        ("bad chunk extension", raw("5;=\r\nhello\r\n0\r\n\r\n"), 400),
        ("trailer without colon", raw("0\r\nX-T yes\r\n\r\n"), 400),
    ];
    all_rejected(&env.server, &cases);
}

#[test]
fn request_bodies_are_drained_and_keep_alive_continues() {
    let env = start();
    let srv = &env.server;
    let next = b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

    let check = |name: &str, parts: &[&[u8]]| {
        let ans = exchange_parts(srv, parts);
        let (resps, rest) = parse_responses(&ans.bytes, &[]);
        assert_eq!(
            status_list(&resps),
            [200, 200],
            "{name}: {}",
            show(&ans.bytes)
        );
        assert_eq!(resps[0].body_str(), HELLO, "{name}");
        assert_eq!(resps[0].header("connection"), None, "{name}");
        assert_eq!(resps[1].body_str(), INDEX, "{name}");
        assert_eq!(resps[1].header("connection"), Some("close"), "{name}");
        assert!(
            rest.is_empty() && ans.closed,
            "{name}: {}",
            show(&ans.bytes)
        );
    };

    // Chunked, with an extension and a trailer, all in one write.
    let mut req = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5;name=\"va;lue\"\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n".to_vec();
    req.extend_from_slice(next);
    check("chunked in one write", &[&req]);

    // Chunked, "Chunked" spelled in another case, split over several writes.
    check(
        "chunked in pieces",
        &[
            b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: Chunked\r\n\r\n",
            b"a\r\n01234",
            b"56789\r",
            b"\n0\r\n",
            b"\r\n",
            next,
        ],
    );

    // Content-Length body.
    let mut req = get_with(
        "HTTP/1.1",
        &["Host: localhost", "Content-Length: 11"],
        b"hello world",
    );
    req.extend_from_slice(next);
    check("content-length in one write", &[&req]);
    check(
        "content-length in pieces",
        &[
            &get_with(
                "HTTP/1.1",
                &["Host: localhost", "Content-Length: 11"],
                b"hel",
            ),
            b"lo wor",
            b"ld",
            next,
        ],
    );

    // Exactly max_body_bytes, both framings.
    let body = vec![b'x'; 1000];
    let mut req = get_with(
        "HTTP/1.1",
        &["Host: localhost", "Content-Length: 1000"],
        &body,
    );
    req.extend_from_slice(next);
    check("content-length at the limit", &[&req]);
    let mut req = get_with(
        "HTTP/1.1",
        &["Host: localhost", "Transfer-Encoding: chunked"],
        b"3e8\r\n",
    );
    req.extend_from_slice(&body);
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    req.extend_from_slice(next);
    check("chunked at the limit", &[&req]);
}

#[test]
fn size_limits_give_414_431_413() {
    let env = start();
    let srv = &env.server;

    // Target of exactly max_uri_bytes (256) is fine (404, no such file).
    let target = format!("/{}", "a".repeat(255));
    let resps = expect_responses(srv, &get_close(&target), &[]);
    assert_eq!(status_list(&resps), [404], "target of 256 bytes");

    // Head of exactly max_header_bytes (2048) is fine.
    let head_of = |total: usize| {
        let base = "GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nX-Pad: \r\n\r\n";
        let pad = "p".repeat(total - base.len());
        format!("GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nX-Pad: {pad}\r\n\r\n").into_bytes()
    };
    let mut req = head_of(2048);
    assert_eq!(req.len(), 2048);
    req.extend_from_slice(FOLLOW);
    let resps = expect_responses(srv, &req, &[]);
    assert_eq!(status_list(&resps), [200, 200], "head of 2048 bytes");

    // max_headers (20) lines is fine.
    let lines = |n: usize| {
        let mut v = vec!["Host: localhost".to_string()];
        v.extend((1..n).map(|i| format!("X-H{i}: {i}")));
        v
    };
    let twenty = lines(20);
    let twenty: Vec<&str> = twenty.iter().map(String::as_str).collect();
    let mut req = get_with("HTTP/1.1", &twenty, b"");
    req.extend_from_slice(FOLLOW);
    let resps = expect_responses(srv, &req, &[]);
    assert_eq!(status_list(&resps), [200, 200], "20 header lines");

    let twentyone = lines(21);
    let twentyone: Vec<&str> = twentyone.iter().map(String::as_str).collect();
    let h = "Host: localhost";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "target of 257 bytes",
            get_close(&format!("/{}", "a".repeat(256))),
            414,
        ),
        (
            "target of 1500 bytes",
            get_close(&format!("/{}", "a".repeat(1499))),
            414,
        ),
        (
            "target longer than max_header_bytes",
            get_close(&format!("/{}", "a".repeat(4000))),
            414,
        ),
        ("head of 2049 bytes", head_of(2049), 431),
        ("head of 10000 bytes", head_of(10000), 431),
        (
            "head that never ends",
            format!(
                "GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nX-Pad: {}",
                "p".repeat(3000)
            )
            .into_bytes(),
            431,
        ),
        (
            "21 header lines",
            get_with("HTTP/1.1", &twentyone, b""),
            431,
        ),
        (
            "200 header lines",
            get_with("HTTP/1.1", &[h; 200], b""),
            431,
        ),
        (
            "Content-Length 1001",
            get_with("HTTP/1.1", &[h, "Content-Length: 1001"], &vec![b'x'; 1001]),
            413,
        ),
        (
            "Content-Length u64::MAX",
            get_with(
                "HTTP/1.1",
                &[h, "Content-Length: 18446744073709551615"],
                b"",
            ),
            413,
        ),
        (
            "chunked body of 1001 bytes in one chunk",
            {
                let mut v = get_with("HTTP/1.1", &[h, "Transfer-Encoding: chunked"], b"3e9\r\n");
                v.extend_from_slice(&[b'x'; 1001]);
                v.extend_from_slice(b"\r\n0\r\n\r\n");
                v
            },
            413,
        ),
        (
            "chunked body of 1001 bytes in many chunks",
            {
                let mut v = get_with("HTTP/1.1", &[h, "Transfer-Encoding: chunked"], b"");
                for _ in 0..77 {
                    v.extend_from_slice(b"d\r\n0123456789abc\r\n");
                }
                v.extend_from_slice(b"0\r\n\r\n");
                v
            },
            413,
        ),
    ];
    all_rejected(srv, &cases);

    // HEAD with a body over the limit: 413 head without a body.
    let req = b"HEAD /hello.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n";
    let ans = exchange(srv, req);
    check_single_error(&ans, 413, true).unwrap_or_else(|e| panic!("HEAD with 413: {e}"));
    healthy(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn methods_405_501_and_head() {
    let env = start();
    let srv = &env.server;
    let mut failures = Vec::new();

    // Refused methods without a body: 405 with Allow, keep-alive goes on.
    for target in ["/hello.txt", "/", "/missing"] {
        for m in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"] {
            let mut req = format!("{m} {target} HTTP/1.1\r\nHost: localhost\r\n\r\n").into_bytes();
            req.extend_from_slice(FOLLOW);
            let ans = exchange(srv, &req);
            let (resps, rest) = parse_responses(&ans.bytes, &[]);
            let ok = status_list(&resps) == [405, 200]
                && resps[0].header("allow") == Some("GET, HEAD")
                && resps[0].body_str() == "405 Method Not Allowed\n"
                && resps[1].body_str() == INDEX
                && rest.is_empty()
                && ans.closed;
            if !ok {
                failures.push(format!("{m} {target}: {}", show(&ans.bytes)));
            }
        }
    }
    // OPTIONS * (asterisk-form) is refused the same way.
    let mut req = b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
    req.extend_from_slice(FOLLOW);
    let ans = exchange(srv, &req);
    let (resps, _) = parse_responses(&ans.bytes, &[]);
    if status_list(&resps) != [405, 200] || resps[0].header("allow") != Some("GET, HEAD") {
        failures.push(format!("OPTIONS *: {}", show(&ans.bytes)));
    }

    // Unknown method tokens (methods are case-sensitive): 501, keep-alive.
    for m in ["BREW", "get", "PROPFIND"] {
        let mut req = format!("{m} /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n").into_bytes();
        req.extend_from_slice(FOLLOW);
        let ans = exchange(srv, &req);
        let (resps, rest) = parse_responses(&ans.bytes, &[]);
        let ok = status_list(&resps) == [501, 200]
            && resps[0].body_str() == "501 Not Implemented\n"
            && resps[1].body_str() == INDEX
            && rest.is_empty()
            && ans.closed;
        if !ok {
            failures.push(format!("{m}: {}", show(&ans.bytes)));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));

    // A refused method with a body: the body is never read, so 405 and close.
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "POST with Content-Length body",
            b"POST /hello.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello"
                .to_vec(),
            405,
        ),
        (
            "PUT with chunked body",
            b"PUT /hello.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            405,
        ),
    ];
    for (name, req, status) in &cases {
        let mut bytes = req.clone();
        bytes.extend_from_slice(FOLLOW);
        let ans = exchange(srv, &bytes);
        check_single_error(&ans, *status, false).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (resps, _) = parse_responses(&ans.bytes, &[]);
        assert_eq!(resps[0].header("allow"), Some("GET, HEAD"), "{name}");
    }

    // HEAD: the GET's headers, no body; the next pipelined response follows
    // immediately.
    let mut req = b"HEAD /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\nHEAD /missing HTTP/1.1\r\nHost: localhost\r\n\r\nHEAD /sub HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
    req.extend_from_slice(FOLLOW);
    let resps = expect_responses(srv, &req, &[true, true, true, false]);
    assert_eq!(status_list(&resps), [200, 404, 301, 200]);
    assert_eq!(
        resps[0].header("content-length"),
        Some(HELLO.len().to_string().as_str())
    );
    assert!(resps[0].body.is_empty());
    assert_eq!(
        resps[0]
            .header("content-type")
            .map(|t| t.starts_with("text/plain")),
        Some(true)
    );
    assert!(resps[0].header("etag").is_some());
    assert_eq!(resps[1].header("content-length"), Some("14"));
    assert_eq!(resps[2].header("location"), Some("/sub/"));
    assert_eq!(resps[3].body_str(), INDEX);

    // The same HEAD and GET agree on headers.
    let get = expect_responses(srv, &get_close("/hello.txt"), &[]);
    let head = expect_responses(
        srv,
        b"HEAD /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        &[true],
    );
    for name in ["content-length", "content-type", "etag", "last-modified"] {
        assert_eq!(get[0].header(name), head[0].header(name), "{name}");
    }
    healthy(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn traversal_over_raw_tls_never_leaks() {
    let env = start();
    let srv = &env.server;
    let cases: &[(&str, u16, Option<&str>)] = &[
        ("/../hello.txt", 400, None),
        ("/../secret.txt", 400, None),
        ("/%2e%2e/secret.txt", 400, None),
        ("/%2E%2E/secret.txt", 400, None),
        ("/sub/%2E%2E/%2e%2e/secret.txt", 400, None),
        ("/sub/../../secret.txt", 400, None),
        ("/%2f..%2fsecret.txt", 400, None),
        ("/..%2fsecret.txt", 400, None),
        ("/%2e%2e%2fsecret.txt", 400, None),
        ("/sub/..%2f..%2fsecret.txt", 400, None),
        ("/hello.txt%00", 400, None),
        ("/hello.txt%00.html", 400, None),
        ("/%zz", 400, None),
        ("/hello.txt%2", 400, None),
        ("https://localhost/../secret.txt", 400, None),
        ("/escape.txt", 403, None),
        ("/sub/../escape.txt", 403, None),
        ("/..\\secret.txt", 404, None),
        ("/sub/../hello.txt", 200, Some(HELLO)),
        ("/./hello.txt", 200, Some(HELLO)),
        ("//hello.txt", 200, Some(HELLO)),
        ("/%68ello.txt", 200, Some(HELLO)),
        ("/sub/%2e%2e/hello.txt", 200, Some(HELLO)),
        ("/inside-link.txt", 200, Some(HELLO)),
        ("https://localhost/hello.txt", 200, Some(HELLO)),
        ("HTTPS://LOCALHOST/hello.txt", 200, Some(HELLO)),
        ("https://localhost/sub/", 200, Some(SUB_INDEX)),
    ];
    let mut failures = Vec::new();
    for (target, status, body) in cases {
        let ans = exchange(srv, &get_close(target));
        let (resps, rest) = parse_responses(&ans.bytes, &[]);
        let text = String::from_utf8_lossy(&ans.bytes);
        let ok = status_list(&resps) == [*status]
            && body.is_none_or(|b| resps[0].body_str() == b)
            && rest.is_empty()
            && ans.closed
            && !text.contains(SECRET);
        if !ok {
            failures.push(format!(
                "GET {target}: want {status}, got {}",
                show(&ans.bytes)
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    healthy(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let env = start();
    let srv = &env.server;

    let req = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\nGET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\nGET /sub/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let resps = expect_responses(srv, req, &[]);
    assert_eq!(status_list(&resps), [200, 200, 200]);
    assert_eq!(resps[0].body_str(), HELLO);
    assert_eq!(resps[1].body_str(), INDEX);
    assert_eq!(resps[2].body_str(), SUB_INDEX);
    assert_eq!(resps[0].header("connection"), None);
    assert_eq!(resps[1].header("connection"), None);
    assert_eq!(resps[2].header("connection"), Some("close"));

    // A streamed (large) body between small ones keeps its place.
    let req = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\nGET /big.bin HTTP/1.1\r\nHost: localhost\r\n\r\nGET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let resps = expect_responses(srv, req, &[]);
    assert_eq!(status_list(&resps), [200, 200, 200]);
    assert_eq!(resps[0].body_str(), HELLO);
    assert!(resps[1].body == env.fx.big, "big.bin body differs");
    assert_eq!(resps[2].body_str(), INDEX);

    // Many small ones: more output than one flush.
    let mut req = Vec::new();
    for i in 0..300 {
        let target = ["/hello.txt", "/index.html", "/sub/"][i % 3];
        req.extend_from_slice(
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
        );
    }
    req.extend_from_slice(FOLLOW);
    let resps = expect_responses(srv, &req, &[]);
    assert_eq!(resps.len(), 301);
    for (i, r) in resps.iter().enumerate().take(300) {
        let want = [HELLO, INDEX, SUB_INDEX][i % 3];
        assert_eq!(
            (r.status, r.body_str().as_str()),
            (200, want),
            "response {i}"
        );
    }
    assert_eq!(resps[300].body_str(), INDEX);

    // A bad request after good ones: the good ones are answered, then one
    // 400, then the close; what follows the bad one is never answered.
    let mut req = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\nGET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\nGET /hello.txt HTTP/1.1\r\n\r\n".to_vec();
    req.extend_from_slice(FOLLOW);
    let resps = expect_responses(srv, &req, &[]);
    assert_eq!(status_list(&resps), [200, 200, 400]);
    assert_eq!(resps[0].body_str(), HELLO);
    assert_eq!(resps[1].body_str(), INDEX);
    assert_eq!(resps[2].header("connection"), Some("close"));

    // A request whose body is still to come: the answers before it leave
    // at once (they waited for that body, or for its timeout, and were
    // lost with the connection then). With `Expect: 100-continue` the
    // client gets the interim answer first, then the final one once the
    // body is in; an HTTP/1.0 client's expectation is ignored.
    let mut s = tls_connect(srv.addr);
    s.sock
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("set_read_timeout");
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\nGET /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\nhello")
        .unwrap();
    s.flush().unwrap();
    let before = read_answer(&mut s);
    assert!(!before.closed, "{}", show(&before.bytes));
    let (resps, rest) = parse_responses(&before.bytes, &[]);
    assert_eq!(status_list(&resps), [200, 100], "{}", show(&before.bytes));
    assert_eq!(resps[0].body_str(), HELLO);
    assert!(before.bytes.ends_with(b"HTTP/1.1 100 Continue\r\n\r\n"));
    assert!(rest.is_empty(), "{}", show(&before.bytes));
    s.write_all(b"world").unwrap();
    s.flush().unwrap();
    let after = read_answer(&mut s);
    let (resps, rest) = parse_responses(&after.bytes, &[]);
    assert_eq!(status_list(&resps), [200], "{}", show(&after.bytes));
    assert_eq!(resps[0].body_str(), INDEX);
    assert!(rest.is_empty(), "{}", show(&after.bytes));
    let mut s = tls_connect(srv.addr);
    s.sock
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("set_read_timeout");
    s.write_all(b"GET /hello.txt HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    s.flush().unwrap();
    let ignored = read_answer(&mut s);
    assert!(ignored.bytes.is_empty(), "{}", show(&ignored.bytes));

    // HTTP/1.0 keep-alive is honoured, and its absence closes.
    let req = b"GET /hello.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /index.html HTTP/1.0\r\n\r\nGET /hello.txt HTTP/1.0\r\n\r\n";
    let resps = expect_responses(srv, req, &[]);
    assert_eq!(status_list(&resps), [200, 200]);
    assert_eq!(resps[0].header("connection"), Some("keep-alive"));
    assert_eq!(resps[1].header("connection"), Some("close"));
    assert_eq!(resps[1].body_str(), INDEX);
}

/// Sum of all `tlsgate_handshake_failures_total{...}` samples.
fn handshake_failures(srv: &Server) -> f64 {
    srv.admin_get("/metrics")
        .lines()
        .filter(|l| l.starts_with("tlsgate_handshake_failures_total"))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

/// Polls until the failure count exceeds `before` (the server counts after
/// dropping the socket, so the client can see the close first).
fn wait_failures_above(srv: &Server, before: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = handshake_failures(srv);
        if now > before {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "tlsgate_handshake_failures_total stayed at {now} (before: {before}):\n{}",
            srv.admin_get("/metrics")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Raw TCP (no TLS): sends `data`, reads until close; returns the reply and
/// whether the server closed within the read limit.
fn raw_tcp(srv: &Server, data: &[u8]) -> (Vec<u8>, bool, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(srv.addr).expect("connect");
    s.set_read_timeout(Some(READ_LIMIT))
        .expect("set_read_timeout");
    // The server may reset the connection before all of it is written.
    let _ = s.write_all(data);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(buf.get(..n).expect("n <= buf.len()")),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    (out, closed, t0.elapsed())
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}

#[test]
fn hostile_bytes_before_tls_are_dropped() {
    let env = start();
    let srv = &env.server;

    let mut random = vec![0u8; 64 * 1024];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    random.iter_mut().for_each(|b| *b = rng.byte());
    let cases: [(&str, &[u8]); 2] = [
        (
            "plain-text HTTP",
            b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n",
        ),
        ("64 KiB of random bytes", &random),
    ];
    for (name, data) in cases {
        let before = handshake_failures(srv);
        let (reply, closed, took) = raw_tcp(srv, data);
        assert!(
            closed,
            "{name}: connection still open after {took:?}; got {}",
            show(&reply)
        );
        assert!(
            !reply.starts_with(b"HTTP/"),
            "{name}: plain HTTP answer on the TLS port: {}",
            show(&reply)
        );
        // At most a TLS alert record (content type 21).
        assert!(
            reply.is_empty() || reply.first() == Some(&0x15),
            "{name}: unexpected reply {reply:02x?}"
        );
        wait_failures_above(srv, before);
        healthy(srv).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Bytes a mutation likes to insert, besides random ones.
const INTERESTING: &[u8] = b"\r\n\0 \t:;,%/.?#\"\\0123456789abcdefxX-+\x7f\xff";

fn mutate(rng: &mut XorShift, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(3) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                let b = if rng.below(2) == 0 {
                    INTERESTING[rng.below(INTERESTING.len())]
                } else {
                    rng.byte()
                };
                v.insert(i, b);
            }
            _ if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            _ => {}
        }
    }
    v
}

fn server_alive(srv: &Server) -> Result<(), String> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", srv.pid()))
        .map_err(|e| format!("server process gone: {e}"))?;
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("?");
    if state == "Z" || state == "X" {
        return Err(format!("server process exited:\n{}", srv.log()));
    }
    if srv.log().contains("panicked") {
        return Err(format!("server panicked:\n{}", srv.log()));
    }
    Ok(())
}

#[test]
fn mutated_requests_never_break_the_server() {
    let env = start();
    let srv = &env.server;
    let bases: [&[u8]; 3] = [
        b"GET /hello.txt?q=1 HTTP/1.1\r\nHost: localhost\r\nRange: bytes=0-4\r\nIf-Match: *\r\nAccept: */*\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        b"GET /sub/ HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
        b"HEAD /index.html HTTP/1.1\r\nHost: localhost:443\r\nIf-None-Match: \"abc\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\nConnection: close\r\n\r\n",
    ];
    const ALLOWED: [u16; 14] = [
        200, 206, 301, 304, 400, 404, 405, 412, 413, 414, 416, 431, 501, 505,
    ];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut failures = Vec::new();
    for i in 0..200 {
        let req = mutate(&mut rng, bases[i % bases.len()]);
        let mut s = tls_connect(srv.addr);
        s.sock
            .set_read_timeout(Some(READ_LIMIT))
            .expect("set_read_timeout");
        // End of input: a request that waits for more bytes sees EOF rather
        // than a timeout, so every answer is final and fast.
        let _ = s.write_all(&req);
        s.conn.send_close_notify();
        let _ = s.flush();
        let ans = read_answer(&mut s);
        let text = String::from_utf8_lossy(&ans.bytes);
        let all = statuses(&text);
        let ok = ans.closed
            && (ans.bytes.is_empty()
                || (text.starts_with("HTTP/1.1 ")
                    && !all.is_empty()
                    && all.iter().all(|s| ALLOWED.contains(s))));
        if !ok {
            failures.push(format!(
                "#{i} {}: closed={} answer {}",
                show(&req),
                ans.closed,
                show(&ans.bytes)
            ));
        }
    }
    server_alive(srv).unwrap_or_else(|e| panic!("{e}"));
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    // Several connections, so every worker is exercised.
    for _ in 0..6 {
        healthy(srv).unwrap_or_else(|e| panic!("{e}"));
    }
    server_alive(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn errors_certain_from_a_partial_head_are_answered_at_once() {
    let env = start();
    let srv = &env.server;
    // None of these heads is complete: the server must not wait for the rest
    // (header_timeout is 5 s here).
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "over-long target, no line end yet",
            format!("GET /{}", "a".repeat(300)).into_bytes(),
            414,
        ),
        ("binary junk, no line end", b"\x01\x02\x03".to_vec(), 400),
        ("bare CR in the request line", b"GET /\rX".to_vec(), 400),
        (
            "obs-fold, head not finished",
            b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n x".to_vec(),
            400,
        ),
        (
            "bare LF, head not finished",
            b"GET /hello.txt HTTP/1.1\nHost".to_vec(),
            400,
        ),
        (
            "version too long, no line end",
            b"GET /hello.txt HTTP/1.1.1".to_vec(),
            400,
        ),
    ];
    for (name, req, status) in &cases {
        let t0 = Instant::now();
        let ans = exchange(srv, req);
        let took = t0.elapsed();
        check_single_error(&ans, *status, false)
            .unwrap_or_else(|e| panic!("{name} {}: {e}", show(req)));
        assert!(
            took < Duration::from_secs(2),
            "{name}: answered only after {took:?}"
        );
    }
    healthy(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn heads_split_at_every_line_boundary_are_reassembled() {
    let env = start();
    let srv = &env.server;
    // Pieces cut between CR and LF, inside a header, and inside the final
    // CRLFCRLF, each written separately with a short pause so that they
    // reach the server in separate reads.
    let pieces: [&[u8]; 8] = [
        b"GET /hello.txt HTTP/1.1\r",
        b"\nHo",
        b"st: localhost\r",
        b"\n",
        b"Connection: close\r\n\r",
        b"\n",
        b"GET /index.html HTTP/1.1\r\n",
        // Never answered: the first request asked for a close.
        b"\r\n",
    ];
    let mut s = tls_connect(srv.addr);
    s.sock
        .set_read_timeout(Some(READ_LIMIT))
        .expect("set_read_timeout");
    for p in pieces {
        s.write_all(p).expect("write");
        s.flush().expect("flush");
        std::thread::sleep(Duration::from_millis(15));
    }
    let ans = read_answer(&mut s);
    let (resps, rest) = parse_responses(&ans.bytes, &[]);
    assert_eq!(status_list(&resps), [200], "{}", show(&ans.bytes));
    assert_eq!(resps[0].body_str(), HELLO);
    assert!(rest.is_empty() && ans.closed, "{}", show(&ans.bytes));

    // A CR at the end of one read followed by a non-LF in the next is a bare CR.
    let ans = exchange_parts(
        srv,
        &[b"GET /hello.txt HTTP/1.1\r", b"Host: localhost\r\n\r\n"],
    );
    check_single_error(&ans, 400, false).unwrap_or_else(|e| panic!("split bare CR: {e}"));
    healthy(srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn slow_heads_get_408_and_idle_connections_close_silently() {
    let fx = Fixture::new();
    let top =
        "[server]\nworkers = 1\n\n[limits]\nhandshake_timeout = \"1s\"\nheader_timeout = \"1s\"\nkeepalive_timeout = \"1s\"\n";
    let srv = Server::start(&fx, &fx.config(top, ""));

    // A head that never completes: 408 with Connection: close, then a close.
    let t0 = Instant::now();
    let ans = exchange(&srv, b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n");
    let took = t0.elapsed();
    let (resps, rest) = parse_responses(&ans.bytes, &[]);
    assert_eq!(status_list(&resps), [408], "{}", show(&ans.bytes));
    assert_eq!(resps[0].header("connection"), Some("close"));
    assert_eq!(resps[0].body_str(), "408 Request Timeout\n");
    assert!(rest.is_empty() && ans.closed, "{}", show(&ans.bytes));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "408 after {took:?}"
    );

    // A TLS record header announcing a ClientHello that never comes: the
    // handshake times out, the socket is closed, and it is counted.
    let timeouts = r#"tlsgate_handshake_failures_total{reason="timeout"}"#;
    let before = srv.metric(timeouts);
    let (reply, closed, took) = raw_tcp(&srv, b"\x16\x03\x01\x00\x50\x01");
    assert!(closed, "stalled handshake still open after {took:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "stalled handshake closed after {took:?}"
    );
    assert!(
        reply.is_empty() || reply.first() == Some(&0x15),
        "stalled handshake got {reply:02x?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.metric(timeouts) <= before {
        assert!(Instant::now() < deadline, "{timeouts} did not rise");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Idle after a complete exchange: closed without any response.
    let ans = exchange(&srv, b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let (resps, rest) = parse_responses(&ans.bytes, &[]);
    assert_eq!(status_list(&resps), [200], "{}", show(&ans.bytes));
    assert!(rest.is_empty() && ans.closed, "{}", show(&ans.bytes));
    healthy(&srv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn http10_keep_alive_is_advertised_on_every_response_that_keeps_it() {
    let env = start();
    let srv = &env.server;
    // Each first request asks for HTTP/1.0 keep-alive and the server keeps
    // the connection (the second request is answered), so the first response
    // must say `Connection: keep-alive` (RFC 9112 §9.3): without it an
    // HTTP/1.0 client takes the connection as closing.
    let cases: &[(&str, &str, u16)] = &[
        ("GET /hello.txt", "", 200),
        ("GET /hello.txt", "If-None-Match: *\r\n", 304),
        ("GET /missing", "", 404),
        ("GET /sub", "", 301),
        ("GET /../x", "", 400),
        ("GET /escape.txt", "", 403),
        ("GET /hello.txt", "If-Match: \"nope\"\r\n", 412),
        ("GET /hello.txt", "Range: bytes=999-\r\n", 416),
        ("POST /hello.txt", "", 405),
        ("BREW /hello.txt", "", 501),
    ];
    let mut failures = Vec::new();
    for (line, extra, status) in cases {
        let req = format!(
            "{line} HTTP/1.0\r\nConnection: keep-alive\r\n{extra}\r\nGET /hello.txt HTTP/1.0\r\n\r\n"
        );
        let ans = exchange(srv, req.as_bytes());
        let (resps, rest) = parse_responses(&ans.bytes, &[]);
        let ok = status_list(&resps) == [*status, 200]
            && resps[0].header("connection") == Some("keep-alive")
            && resps[1].header("connection") == Some("close")
            && resps[1].body_str() == HELLO
            && rest.is_empty()
            && ans.closed;
        if !ok {
            failures.push(format!("{}: {}", show(req.as_bytes()), show(&ans.bytes)));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// rustls warns once per connection about what a client sends (here an IP
/// address as SNI, which RFC 6066 §3 forbids): none of it may reach the
/// log, or any client could write a line per handshake into it. The tests
/// run the server with `RUST_LOG=info`, as an operator would.
#[test]
fn what_clients_send_cannot_write_a_log_line_per_connection() {
    let env = start();
    let srv = &env.server;
    let before = srv.log().lines().count();
    for _ in 0..10 {
        let out = s_client(
            srv.addr,
            &["-servername", "127.0.0.1", "-ign_eof"],
            b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(INDEX), "not served: {text}");
    }
    let log = srv.log();
    let added: Vec<&str> = log.lines().skip(before).collect();
    assert!(
        added.len() < 3,
        "10 connections wrote {} log lines: {added:#?}",
        added.len()
    );
}
