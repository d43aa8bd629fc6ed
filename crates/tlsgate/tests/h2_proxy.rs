//! The reverse proxy for HTTP/2 clients: curl --http2, h2load and a
//! rustls + h2 client through tlsgate to real HTTP/1.1 upstreams (the
//! tests' own Rust server and Python's http.server). Bodies byte-exact
//! both ways with and without content-length, 100 concurrent streams,
//! balancing, a slow upstream timing out on one stream while another
//! succeeds, a client reset cancelling its upstream request, an upstream
//! failing mid-body resetting only its stream, headers as translated for
//! the upstream, full duplex (an answer relayed while the body still goes
//! up), h2spec on a listener whose routes go to a pool.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::upstream::{
    make_leaf, pattern, pool, route, routes, start, start_early_answering, upstream_tls, Python,
    Upstream,
};
use common::{client_config, h2spec_strict_passes, Fixture, Server};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

type Client = h2::client::SendRequest<Bytes>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An HTTP/2 connection to `addr` (ALPN h2 checked), its driver spawned.
async fn h2_client(addr: SocketAddr) -> Client {
    let mut c = client_config(rustls::DEFAULT_VERSIONS);
    c.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(c))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A stream's answer.
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// Sends `req` with `body` (none: END_STREAM on HEADERS) and reads the
/// whole answer.
async fn exchange(client: &Client, req: http::Request<()>, body: Option<Vec<u8>>) -> Answer {
    let mut client = client.clone().ready().await.unwrap();
    let (resp, mut send) = client.send_request(req, body.is_none()).unwrap();
    if let Some(b) = body {
        send.send_data(Bytes::from(b), true).unwrap();
    }
    let (parts, mut recv) = resp.await.unwrap().into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        recv.flow_control().release_capacity(chunk.len()).unwrap();
        data.extend_from_slice(&chunk);
    }
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: data,
    }
}

fn get(path: &str) -> http::Request<()> {
    http::Request::get(format!("https://app.test{path}"))
        .body(())
        .unwrap()
}

/// curl --http2 with `args`: (status, http version, body).
fn curl2(s: &Server, args: &[&str]) -> (String, String, Vec<u8>) {
    let mut all = vec![
        "--http2",
        "--max-time",
        "120",
        "-w",
        "\n%{http_code} %{http_version}",
    ];
    all.extend_from_slice(args);
    let out = s.curl(&all);
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = out.stdout.iter().rposition(|&b| b == b'\n').unwrap();
    let tail = String::from_utf8(out.stdout[at + 1..].to_vec()).unwrap();
    let (code, version) = tail.split_once(' ').unwrap();
    (
        code.to_string(),
        version.to_string(),
        out.stdout[..at].to_vec(),
    )
}

#[test]
fn curl_http2_through_the_proxy_is_byte_exact_both_ways() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    // Python serves files with Content-Length from the directory it runs in.
    let py_dir = fx.path().join("pyroot");
    let py_file = pattern((1 << 20) + 13);
    std::fs::create_dir_all(py_dir.join("py")).unwrap();
    std::fs::write(py_dir.join("py/big.bin"), &py_file).unwrap();
    let py = Python::start(&py_dir, "py");
    let pools = [
        pool("app", &[(a.address(), 1)], "", ""),
        pool("py", &[(py.addr.to_string(), 1)], "", ""),
    ]
    .concat();
    let routes = [
        route("/", "app", "max_body_bytes = 209715200"),
        route("/py", "py", ""),
    ]
    .concat();
    let s = start(&fx, "", &pools, &routes);
    let url = |p: &str| s.url(p);

    let (code, version, body) = curl2(&s, &[&url("/id")]);
    assert_eq!((code.as_str(), version.as_str()), ("200", "2"));
    assert_eq!(body, b"a");
    // Content-Length from Python, chunked from the Rust upstream.
    let (code, _, body) = curl2(&s, &[&url("/py/big.bin")]);
    assert_eq!(code, "200");
    assert!(body == py_file, "1 MiB Content-Length download differs");
    for n in [0usize, 1, 100, (1 << 20) + 13] {
        let (code, _, body) = curl2(&s, &[&url(&format!("/gen?n={n}"))]);
        assert_eq!(code, "200");
        assert!(body == pattern(n), "chunked download of {n} bytes differs");
    }

    for n in [0usize, 1, 1 << 20, 64 << 20] {
        let data = pattern(n);
        let input = fx.path().join(format!("in-{n}"));
        std::fs::write(&input, &data).unwrap();
        // With content-length: passed on as it is.
        let upload = format!("@{}", input.display());
        let (code, _, body) = curl2(&s, &["--data-binary", &upload, &url("/echo")]);
        assert_eq!(code, "200", "upload of {n} bytes with content-length");
        assert!(
            body == data,
            "upload of {n} bytes with content-length differs"
        );
        let head = a.last_head.lock().unwrap().clone();
        assert!(
            head.contains(&format!("Content-Length: {n}\r\n"))
                && !head.contains("Transfer-Encoding"),
            "{head}"
        );
        // Without: curl streams stdin of unknown size; the upstream gets it chunked.
        let resolve = format!("localhost:{}:127.0.0.1", s.addr.port());
        let out = Command::new("curl")
            .args([
                "-sS",
                "-k",
                "--http2",
                "--max-time",
                "120",
                "--resolve",
                &resolve,
            ])
            .args([
                "-X",
                "POST",
                "-T",
                "-",
                "-w",
                "\n%{http_code} %{http_version}",
                &url("/echo"),
            ])
            .stdin(std::fs::File::open(&input).unwrap())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let at = out.stdout.iter().rposition(|&b| b == b'\n').unwrap();
        assert_eq!(
            &out.stdout[at + 1..],
            b"200 2",
            "upload of {n} bytes without length"
        );
        assert!(
            out.stdout[..at] == data[..],
            "upload of {n} bytes without content-length differs"
        );
        let head = a.last_head.lock().unwrap().clone();
        assert!(!head.contains("Content-Length"), "{head}");
        // (An empty upload may end with the request's HEADERS: no body at all.)
        assert!(
            n == 0 || head.contains("Transfer-Encoding: chunked\r\n"),
            "{head}"
        );
    }

    // Logged and counted as HTTP/2 requests, with the upstream named.
    s.wait_access_line(&[
        "\"POST /echo HTTP/2.0\" 200 67108864",
        &format!("upstream={}", a.address()),
    ]);
    s.wait_access_line(&[
        "\"GET /py/big.bin HTTP/2.0\" 200",
        &format!("upstream={}", py.addr),
    ]);
    // 1 + 1 + 4 downloads, 4 sizes × 2 uploads.
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="2xx",protocol="h2"}"#),
        14.0
    );
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="2xx",protocol="http/1.1"}"#),
        0.0
    );
}

#[test]
fn an_upstream_that_answers_before_the_body_ends_is_relayed_at_once() {
    let fx = Fixture::new();
    let (a, s) = start_early_answering(&fx);
    let t0 = Instant::now();
    let r = rt().block_on(async {
        let c = h2_client(s.addr).await;
        let post = http::Request::post("https://app.test/early")
            .header("content-length", (64u64 << 20).to_string())
            .body(())
            .unwrap();
        exchange(&c, post, Some(pattern(64 << 20))).await
    });
    let took = t0.elapsed();
    assert_eq!((r.status, &r.body[..]), (413, &b"too big!"[..]));
    // Not after the upstream's idle timeout (30 s) ran out on the upload.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // The rest of the upload is called off without error (RFC 9113 §8.1).
    s.expect_metric_line(
        "tlsgate_h2_errors_sent_total{frame=\"rst_stream\",code=\"no_error\"} 1\n",
    );
    a.kill();
}

/// Receives from `recv` until `want` more bytes came (within 10 s).
async fn receive(recv: &mut h2::RecvStream, got: &mut Vec<u8>, want: usize) {
    let until = got.len() + want;
    while got.len() < until {
        let chunk = tokio::time::timeout(Duration::from_secs(10), recv.data())
            .await
            .unwrap_or_else(|_| panic!("{} of {until} bytes back after 10 s", got.len()))
            .expect("the answer ended early")
            .unwrap();
        recv.flow_control().release_capacity(chunk.len()).unwrap();
        got.extend_from_slice(&chunk);
    }
}

#[test]
fn a_stream_gets_its_answer_while_it_still_sends_its_body() {
    // The upstreams answer at once and send each piece of the body back as
    // they read it: each piece must come back before the next is sent.
    // Over TLS too, where a piece could sit in the TLS layer unflushed.
    let fx = Fixture::new();
    let ca = common::make_ca("upstream CA");
    let ca_pem = fx.path().join("up-ca.pem");
    std::fs::write(&ca_pem, ca.0.pem()).unwrap();
    let (cert, key, _, _) = make_leaf(fx.path(), "upstream", &["app.internal"], false, &ca);
    let plain = Upstream::start("plain", None);
    let tls = Upstream::start("tls", Some(upstream_tls(&cert, &key, None)));
    let tls_keys = format!("tls = true\nca = {ca_pem:?}\nsni = \"app.internal\"");
    let pools = [
        pool("plain", &[(plain.address(), 1)], "", ""),
        pool("tls", &[(tls.address(), 1)], &tls_keys, ""),
    ]
    .concat();
    let limit = "max_body_bytes = 33554432";
    let routes = [route("/", "plain", limit), route("/tls/", "tls", limit)].concat();
    let s = start(&fx, "", &pools, &routes);
    for (prefix, up) in [("", &plain), ("/tls", &tls)] {
        rt().block_on(duplex_both_ways(&s, prefix, up));
    }
    plain.kill();
    tls.kill();
}

/// Full duplex through `prefix`'s pool, whose one server is `a`.
async fn duplex_both_ways(s: &Server, prefix: &str, a: &Upstream) {
    let url = format!("https://app.test{prefix}/duplex");
    let c = h2_client(s.addr).await;
    // Without content-length the body goes upstream chunked.
    let post = http::Request::post(&url).body(()).unwrap();
    let mut ready = c.clone().ready().await.unwrap();
    let (resp, mut send) = ready.send_request(post, false).unwrap();
    let mut resp = Some(resp);
    let mut recv = None;
    let mut got = Vec::new();
    for i in 0..5u8 {
        let piece = vec![b'a' + i; 10_000 + usize::from(i)];
        send.send_data(Bytes::from(piece.clone()), false).unwrap();
        if recv.is_none() {
            let r = tokio::time::timeout(Duration::from_secs(10), resp.take().unwrap());
            let (parts, body) = r.await.expect("no head in 10 s").unwrap().into_parts();
            assert_eq!(parts.status, 200, "{url}");
            recv = Some(body);
        }
        let before = got.len();
        receive(recv.as_mut().unwrap(), &mut got, piece.len()).await;
        assert!(
            got[before..] == piece[..],
            "{url}: piece {i} came back changed"
        );
    }
    send.send_data(Bytes::new(), true).unwrap();
    let mut recv = recv.unwrap();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut rest = Vec::new();
        while let Some(chunk) = recv.data().await {
            rest.extend_from_slice(&chunk.unwrap());
        }
        rest
    });
    assert_eq!(
        rest.await.expect("no end in 10 s"),
        b"",
        "more after the body"
    );

    // A large body both ways at once, with content-length: each side is
    // held back by the other's windows and buffers.
    let total = 16usize << 20;
    let data = pattern(total);
    let post = http::Request::post(&url)
        .header("content-length", total.to_string())
        .body(())
        .unwrap();
    let mut ready = c.clone().ready().await.unwrap();
    let (resp, mut send) = ready.send_request(post, false).unwrap();
    let sending = tokio::spawn({
        let data = Bytes::from(data.clone());
        async move {
            let mut rest = data;
            while !rest.is_empty() {
                send.reserve_capacity(rest.len().min(64 << 10));
                let mut room = send.capacity();
                while room == 0 {
                    room = poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap();
                }
                let piece = rest.split_to(room.min(rest.len()));
                send.send_data(piece, false).unwrap();
            }
            send.send_data(Bytes::new(), true).unwrap();
        }
    });
    let (parts, mut recv) = resp.await.unwrap().into_parts();
    assert_eq!(parts.status, 200);
    let mut got = Vec::new();
    receive(&mut recv, &mut got, total).await;
    assert!(got == data, "{url}: 16 MiB echo differs");
    while let Some(chunk) = recv.data().await {
        assert!(chunk.unwrap().is_empty(), "more after the body");
    }
    sending.await.unwrap();

    // Both bodies ended cleanly: the upstream connection serves the next
    // request of this worker (the client's connection is on one).
    let conns = a.conns.load(Ordering::Relaxed);
    let post = http::Request::post(&url).body(()).unwrap();
    let r = exchange(&c, post, Some(b"again".to_vec())).await;
    assert_eq!((r.status, &r.body[..]), (200, &b"again"[..]));
    assert_eq!(a.conns.load(Ordering::Relaxed), conns, "{url}: not reused");

    // A client that resets mid-way ends the exchange: the upstream
    // connection is closed, not left waiting for the rest.
    let closed = a.closed.load(Ordering::Relaxed);
    let post = http::Request::post(&url).body(()).unwrap();
    let mut ready = c.clone().ready().await.unwrap();
    let (resp, mut send) = ready.send_request(post, false).unwrap();
    send.send_data(Bytes::from_static(b"first"), false).unwrap();
    let (_, mut recv) = resp.await.unwrap().into_parts();
    let mut got = Vec::new();
    receive(&mut recv, &mut got, 5).await;
    send.send_reset(h2::Reason::CANCEL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.closed.load(Ordering::Relaxed) == closed {
        assert!(
            Instant::now() < deadline,
            "{url}: upstream connection left open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn expect_100_continue_is_answered_once_a_server_has_the_head() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let s = start(&fx, "", &pools, &route("/", "app", ""));
    let data = pattern(300_000);
    let input = fx.path().join("upload");
    std::fs::write(&input, &data).unwrap();
    let upload = format!("@{}", input.display());
    // curl waits up to 10 s for the 100 before it sends the body anyway.
    let o = s.curl(&[
        "--http2",
        "-v",
        "--expect100-timeout",
        "10",
        "-H",
        "Expect: 100-continue",
        "--data-binary",
        &upload,
        &s.url("/echo"),
    ]);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("< HTTP/2 100"), "no interim 100 in:\n{log}");
    assert!(o.stdout == data, "the echo differs");
    // The upstream never saw `Expect` (tlsgate answered it).
    assert!(!a
        .last_head
        .lock()
        .unwrap()
        .to_ascii_lowercase()
        .contains("expect:"));
}

#[test]
fn request_bodies_over_the_limit_are_refused_and_never_reach_the_upstream_whole() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let s = start(&fx, "", &pools, &route("/", "app", "max_body_bytes = 1000"));
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        // At the limit, without content-length: passed on chunked.
        let post = || {
            http::Request::post("https://app.test/echo")
                .body(())
                .unwrap()
        };
        let r = exchange(&c, post(), Some(pattern(1000))).await;
        assert_eq!((r.status, r.body == pattern(1000)), (200, true));
        assert_eq!(a.requests.load(Ordering::Relaxed), 1);
        // Over it, announced: 413 before any upstream is asked.
        let big = http::Request::post("https://app.test/echo")
            .header("content-length", "1001")
            .body(())
            .unwrap();
        let r = exchange(&c, big, Some(pattern(1001))).await;
        assert_eq!(r.status, 413);
        // Over it, unannounced: 413 once the body passes the limit; the
        // upstream never gets a complete request.
        let r = exchange(&c, post(), Some(pattern(5000))).await;
        assert_eq!(r.status, 413);
        // An empty body without content-length: END_STREAM on a DATA frame.
        let r = exchange(&c, post(), Some(Vec::new())).await;
        assert_eq!((r.status, r.body.len()), (200, 0));
    });
    assert_eq!(a.requests.load(Ordering::Relaxed), 2);
    s.wait_access_line(&[
        "\"POST /echo HTTP/2.0\" 413",
        "upstream_error=body_too_large",
    ]);
}

#[test]
fn a_hundred_concurrent_streams_and_h2load_through_the_proxy_are_balanced_and_correct() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let py = Python::start(&fx.path().join("py"), "py");
    let pools = [
        pool("gen", &[(a.address(), 1), (b.address(), 1)], "", ""),
        pool(
            "ids",
            &[(a.address(), 1), (b.address(), 1), (py.addr.to_string(), 1)],
            "",
            "",
        ),
    ]
    .concat();
    let s = start(
        &fx,
        "[access_log]\ntarget = \"off\"\n[http2]\nmax_concurrent_streams = 100",
        &pools,
        &routes(&[("/gen", "gen"), ("/id", "ids")]),
    );
    const BIG: usize = (1 << 20) + 13;
    let seen = rt().block_on(async {
        let c = h2_client(s.addr).await;
        let mut tasks = Vec::new();
        for i in 0..100 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let path = if i % 2 == 0 {
                    format!("/gen?n={BIG}")
                } else {
                    "/id".to_string()
                };
                (i, exchange(&c, get(&path), None).await)
            }));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for t in tasks {
            let (i, r) = t.await.unwrap();
            assert_eq!(r.status, 200, "stream {i}");
            if i % 2 == 0 {
                assert!(r.body == pattern(BIG), "stream {i}: 1 MiB body differs");
            } else {
                *seen.entry(String::from_utf8(r.body).unwrap()).or_default() += 1;
            }
        }
        seen
    });
    // 50 requests round-robin over three servers, one of them Python.
    for id in ["a", "b", "py"] {
        let n = seen.get(id).copied().unwrap_or(0);
        assert!((16..=17).contains(&n), "{seen:?}");
    }
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="2xx",protocol="h2"}"#),
        100.0
    );
    s.expect_metric_line("tlsgate_h2_streams_open 0\n");

    let out = Command::new("h2load")
        .args([
            "-n",
            "2000",
            "-c",
            "2",
            "-m",
            "100",
            "-t",
            "1",
            &s.url("/gen?n=1000"),
        ])
        .output()
        .expect("h2load must be installed (./dev setup installs nghttp2-client)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "requests: 2000 total, 2000 started, 2000 done, 2000 succeeded, 0 failed, 0 errored"
        ),
        "{text}"
    );
    assert!(text.contains("status codes: 2000 2xx"), "{text}");
    assert!(text.contains("Application protocol: h2"), "{text}");
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="2xx",protocol="h2"}"#),
        2100.0
    );
}

#[test]
fn a_slow_upstream_times_out_on_its_stream_while_another_stream_succeeds() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("slow", &[(a.address(), 1)], "response_timeout = \"1s\"", "");
    let s = start(&fx, "", &pools, &route("/", "slow", ""));
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        let t0 = Instant::now();
        let slow = tokio::spawn({
            let c = c.clone();
            async move { (exchange(&c, get("/slow"), None).await, t0.elapsed()) }
        });
        // Another stream on the same connection meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = exchange(&c, get("/id"), None).await;
        let quick_took = t0.elapsed();
        assert_eq!((quick.status, quick.body.as_slice()), (200, &b"a"[..]));
        assert!(quick_took < Duration::from_millis(900), "{quick_took:?}");
        let (slow, took) = slow.await.unwrap();
        assert_eq!(slow.status, 504);
        assert!(
            took >= Duration::from_millis(950) && took < Duration::from_millis(2500),
            "{took:?}"
        );
        // And the connection goes on.
        assert_eq!(exchange(&c, get("/id"), None).await.status, 200);
    });
    s.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"slow\",status=\"504\",reason=\"response_timeout\"} 1",
    );
    s.wait_access_line(&[
        "\"GET /slow HTTP/2.0\" 504",
        "upstream_error=response_timeout",
    ]);
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="5xx",protocol="h2"}"#),
        1.0
    );
}

#[test]
fn a_client_reset_cancels_the_upstream_request_and_the_connection_keeps_serving() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("dl", &[(a.address(), 1)], "", "");
    let s = start(&fx, "", &pools, &route("/", "dl", ""));
    let open = format!(
        "tlsgate_upstream_connections_open{{pool=\"dl\",server=\"{}\"}}",
        a.address()
    );
    let idle = open.replace("_open", "_idle");
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        // Mid-download: 64 MiB asked, reset after 1 MiB.
        let mut sender = c.clone().ready().await.unwrap();
        let (resp, mut send) = sender
            .send_request(get(&format!("/gen?n={}", 64 << 20)), true)
            .unwrap();
        let (parts, mut recv) = resp.await.unwrap().into_parts();
        assert_eq!(parts.status, 200);
        let mut got = 0;
        while got < 1 << 20 {
            let chunk = recv.data().await.unwrap().unwrap();
            recv.flow_control().release_capacity(chunk.len()).unwrap();
            got += chunk.len();
        }
        assert_eq!(a.conns.load(Ordering::Relaxed), 1);
        send.send_reset(h2::Reason::CANCEL);
        drop(recv);
        // The upstream connection is closed at once, not kept half-used.
        let t0 = Instant::now();
        while a.closed.load(Ordering::Relaxed) < 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "upstream not cancelled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(s.metric(&open), 0.0);
        assert_eq!(s.metric(&idle), 0.0);
        // Before the response head: the slow upstream's request is
        // cancelled too (the upstream sleeps 3 s: only tlsgate's gauge
        // tells the connection went at once).
        let (resp, mut send) = sender.send_request(get("/slow"), true).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.conns.load(Ordering::Relaxed), 2);
        assert_eq!(s.metric(&open), 1.0);
        send.send_reset(h2::Reason::CANCEL);
        assert!(resp.await.is_err());
        let t0 = Instant::now();
        while s.metric(&open) > 0.0 {
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "slow request not cancelled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The same connection goes on, on a new upstream connection.
        let r = exchange(&c, get("/id"), None).await;
        assert_eq!((r.status, r.body.as_slice()), (200, &b"a"[..]));
        assert_eq!(a.conns.load(Ordering::Relaxed), 3);
    });
    s.wait_access_line(&[
        "\"GET /gen?n=67108864 HTTP/2.0\" 200",
        "upstream_error=client_gone",
    ]);
    s.wait_access_line(&["\"GET /slow HTTP/2.0\" 499", "upstream_error=client_gone"]);
    s.expect_metric_line(&format!("{idle} 1\n"));
}

#[test]
fn upstream_failures_are_502_503_or_a_reset_of_their_stream_only() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let dead = Upstream::start("dead", None);
    dead.kill();
    let pools = [
        pool("app", &[(a.address(), 1)], "max_fails = 0", ""),
        pool(
            "dead",
            &[(dead.address(), 1)],
            "retries = 0\nmax_fails = 1\nfail_timeout = \"60s\"",
            "",
        ),
        pool(
            "checked",
            &[(dead.address(), 1)],
            "retries = 0",
            "[upstream.health_check]\ninterval = \"100ms\"\nfall = 1\n",
        ),
    ]
    .concat();
    let s = start(
        &fx,
        "",
        &pools,
        &routes(&[("/", "app"), ("/gone", "dead"), ("/checked", "checked")]),
    );
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        // Refused connection: 502, and again: passive marks never empty
        // a pool.
        assert_eq!(exchange(&c, get("/gone/x"), None).await.status, 502);
        assert_eq!(exchange(&c, get("/gone/x"), None).await.status, 502);
        // A failed health check takes the lone server out: 503.
        s.expect_metric_line(&format!(
            "tlsgate_upstream_healthy{{pool=\"checked\",server=\"{}\"}} 0",
            dead.address()
        ));
        assert_eq!(exchange(&c, get("/checked/x"), None).await.status, 503);
        // A malformed response: 502, never relayed.
        let r = exchange(&c, get("/bad/clte"), None).await;
        assert_eq!(r.status, 502);
        // Cut mid-body: the stream is reset, the connection goes on.
        let mut sender = c.clone().ready().await.unwrap();
        let (resp, _) = sender.send_request(get("/truncated"), true).unwrap();
        let (parts, mut recv) = resp.await.unwrap().into_parts();
        assert_eq!(parts.status, 200);
        assert_eq!(
            parts.headers.get("content-length").unwrap(),
            "1000000",
            "the length is announced"
        );
        let mut got = 0;
        let err = loop {
            match recv.data().await {
                Some(Ok(chunk)) => {
                    got += chunk.len();
                    recv.flow_control().release_capacity(chunk.len()).unwrap();
                }
                Some(Err(e)) => break e,
                None => panic!("the truncated body ended cleanly after {got} bytes"),
            }
        };
        assert_eq!(err.reason(), Some(h2::Reason::INTERNAL_ERROR), "{err}");
        assert!(got <= 100_000, "{got}");
        let r = exchange(&c, get("/id"), None).await;
        assert_eq!((r.status, r.body.as_slice()), (200, &b"a"[..]));
    });
    s.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"dead\",status=\"502\",reason=\"connect\"} 2",
    );
    s.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"checked\",status=\"503\",reason=\"no_server\"} 1",
    );
    s.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"app\",status=\"502\",reason=\"bad_response\"} 1",
    );
    s.wait_access_line(&["\"GET /gone/x HTTP/2.0\" 502", "upstream_error=connect"]);
    s.wait_access_line(&[
        "\"GET /checked/x HTTP/2.0\" 503",
        "upstream_error=no_server",
    ]);
    s.wait_access_line(&[
        "\"GET /truncated HTTP/2.0\" 200",
        "upstream_error=truncated",
    ]);
}

#[test]
fn headers_are_translated_both_ways() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let s = start(&fx, "", &pools, &route("/", "app", ""));
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        let req = http::Request::get("https://app.test/headers?x=1")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("te", "trailers")
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-real-ip", "6.6.6.6")
            .header("forwarded", "for=6.6.6.6")
            .header("x-forwarded-client-cert", "Hash=forged")
            .header("x-original-url", "/forged")
            .header("x-forwarded-scheme", "forged")
            .header("x-forwarded-prefix", "/forged")
            .header("true-client-ip", "6.6.6.6")
            .header("cf_connecting_ip", "6.6.6.6")
            .header("via", "1.1 edge")
            .header("x-kept", "yes")
            .body(())
            .unwrap();
        let r = exchange(&c, req, None).await;
        assert_eq!(r.status, 200);
        let head = String::from_utf8(r.body).unwrap();
        assert!(
            head.starts_with("GET /headers?x=1 HTTP/1.1\r\nHost: app.test\r\n"),
            "{head}"
        );
        for kept in [
            "cookie: a=1; b=2\r\n",
            "X-Forwarded-For: 127.0.0.1\r\n",
            "X-Real-IP: 127.0.0.1\r\n",
            "X-Forwarded-Proto: https\r\n",
            "X-Forwarded-Host: app.test\r\n",
            "Forwarded: for=127.0.0.1;proto=https;host=\"app.test\"\r\n",
            "via: 1.1 edge\r\n",
            "Via: 2 tlsgate\r\n",
            "x-kept: yes\r\n",
        ] {
            assert!(head.contains(kept), "{kept:?} missing: {head}");
        }
        let lower = head.to_ascii_lowercase();
        for gone in [
            "6.6.6.6",
            "forged",
            "\r\nte:",
            "content-length",
            "transfer-encoding",
            "connection:",
        ] {
            assert!(!lower.contains(gone), "{gone:?} passed: {head}");
        }
        assert_eq!(lower.matches("\r\ncookie:").count(), 1, "{head}");

        // The response's hop-by-hop fields never reach the client (h2
        // would take any of them for a malformed response).
        let r = exchange(&c, get("/hop"), None).await;
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        assert_eq!(r.headers.get("x-end").unwrap(), "kept");
        for gone in [
            "connection",
            "x-hop",
            "keep-alive",
            "proxy-connection",
            "upgrade",
            "trailer",
            "transfer-encoding",
        ] {
            assert!(r.headers.get(gone).is_none(), "{gone}: {:?}", r.headers);
        }

        // A Host naming another entity than :authority is malformed.
        let before = a.requests.load(Ordering::Relaxed);
        let req = http::Request::get("https://app.test/id")
            .header("host", "other.test")
            .body(())
            .unwrap();
        assert_eq!(exchange(&c, req, None).await.status, 400);
        // An authority HTTP/1.1's parser would refuse as a Host (the
        // `http` crate takes it; found by fuzz/'s proxy_forward_h2): 400,
        // not a Host no upstream reads alike.
        let req = http::Request::get("https://:g(/id").body(()).unwrap();
        assert_eq!(exchange(&c, req, None).await.status, 400);
        // An authority no host name could be, which the `http` crate
        // takes: a list (`a,b` becomes two names in X-Forwarded-Host) or
        // parameters (it refuses `%` itself).
        for authority in ["app.test,evil.example", "app.test;for=6.6.6.6", "a=b"] {
            let req = http::Request::get(format!("https://{authority}/id"))
                .body(())
                .unwrap();
            assert_eq!(exchange(&c, req, None).await.status, 400, "{authority}");
        }
        // So is a `:path` with raw UTF-8, which HTTP/1.1's parser refuses
        // in a target (and the `http` crate takes).
        let uri = http::Uri::try_from(&b"https://app.test/id\xcc\x98"[..]).unwrap();
        let req = http::Request::get(uri).body(()).unwrap();
        assert_eq!(exchange(&c, req, None).await.status, 400);
        // CONNECT is not tunnelled: a clear refusal, nothing upstream.
        let req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("app.test:443")
            .body(())
            .unwrap();
        let mut sender = c.clone().ready().await.unwrap();
        let (resp, _) = sender.send_request(req, false).unwrap();
        assert_eq!(resp.await.unwrap().status(), 405);
        assert_eq!(a.requests.load(Ordering::Relaxed), before);
    });
    s.wait_access_line(&[
        "\"CONNECT ",
        "HTTP/2.0\" 405",
        "upstream_error=connect_refused",
    ]);
    s.wait_access_line(&["\"GET /id HTTP/2.0\" 400", "upstream_error=host_mismatch"]);
}

#[test]
fn h2spec_passes_in_strict_mode_on_a_listener_whose_routes_go_to_a_pool() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let s = start(
        &fx,
        "[access_log]\ntarget = \"off\"",
        &pools,
        &route("/", "app", ""),
    );
    let text = h2spec_strict_passes(s.addr.port(), "/id");
    // The streams h2spec opened went through the proxy.
    assert!(a.requests.load(Ordering::Relaxed) >= 10, "{text}");
}

/// Connections to `u` open now: accepted, less those that ended.
/// Connections the process `pid` holds open to `to` (IPv4): its socket
/// descriptors whose peer is `to`. Counted on the proxy's side, because
/// an upstream learns of a close only when it reads next, and on a busy
/// machine it may accept a queued request's new connection first.
fn held_to(pid: u32, to: &str) -> usize {
    let Ok(SocketAddr::V4(to)) = to.parse() else {
        panic!("{to}: IPv4 only")
    };
    let peer = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(to.ip().octets()),
        to.port()
    );
    let sockets: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    // Distinct inodes: the kernel builds the table a page at a time, and
    // a socket that closes between two pages can show one twice.
    let held: std::collections::HashSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Established or connecting: a closing socket may keep its
            // inode in the table a while.
            let inode = *f.get(9)?;
            (f.get(2) == Some(&peer.as_str())
                && matches!(f.get(3), Some(&"01" | &"02"))
                && sockets.contains(inode))
            .then_some(inode)
        })
        .collect();
    held.len()
}

/// Descriptors the process `pid` has open.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The sum of the metric samples whose line has every one of `needles`.
fn metric_sum(s: &Server, needles: &[&str]) -> f64 {
    s.admin_get("/metrics")
        .lines()
        .filter(|l| !l.starts_with('#') && needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

/// `n` streams at once on each of `conns` connections, each `GET path`:
/// their statuses.
async fn streams_at_once(addr: SocketAddr, conns: usize, n: usize, path: &str) -> Vec<u16> {
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let c = h2_client(addr).await;
        for _ in 0..n {
            let (c, path) = (c.clone(), path.to_string());
            tasks.push(tokio::spawn(
                async move { exchange(&c, get(&path), None).await },
            ));
        }
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status);
    }
    statuses
}

#[test]
fn streams_of_many_connections_share_max_conns_and_the_rest_wait_their_turn() {
    // 4 connections × 128 streams to a slow route: one upstream
    // connection per stream would be 512 (and as many descriptors); the
    // server's `max_conns` holds them at 8, the rest wait in its queue and
    // are all served, and a static file is served meanwhile.
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool(
        "app",
        &[(a.address(), 1)],
        "max_conns = 8\nqueue_timeout = \"60s\"",
        "",
    );
    let s = start(
        &fx,
        "[access_log]\ntarget = \"off\"\n[http2]\nmax_concurrent_streams = 128\nmax_proxied_streams = 128",
        &pools,
        &route("/sleep", "app", ""),
    );
    let before = fds(s.pid());
    let addr = s.addr;
    let load =
        std::thread::spawn(move || rt().block_on(streams_at_once(addr, 4, 128, "/sleep?ms=100")));
    let queued = format!(
        "tlsgate_upstream_queued{{pool=\"app\",server=\"{}\"}}",
        a.address()
    );
    let (mut most_open, mut most_fds, mut most_queued) = (0, 0, 0.0f64);
    let mut static_took = None;
    while !load.is_finished() {
        most_open = most_open.max(held_to(s.pid(), &a.address()));
        most_fds = most_fds.max(fds(s.pid()));
        if a.requests.load(Ordering::SeqCst) > 16 && static_took.is_none() {
            most_queued = most_queued.max(s.metric(&queued));
            let t0 = Instant::now();
            let (code, _, body) = curl2(&s, &[&s.url("/hello.txt")]);
            assert_eq!(code, "200");
            assert_eq!(body, common::HELLO.as_bytes());
            static_took = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let statuses = load.join().unwrap();
    assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
    assert_eq!(a.requests.load(Ordering::SeqCst), 512);
    // A connection done with while requests wait goes to the oldest of
    // them, still open, when it waits on the same worker thread: 26–32
    // connections for the 512 requests (2 workers), 512 without that.
    let opened = a.conns.load(Ordering::SeqCst);
    assert!(
        opened <= 128,
        "{opened} upstream connections for 512 requests"
    );
    assert!(
        (1..=8).contains(&most_open),
        "{most_open} upstream connections open at once"
    );
    // The 4 + 1 client connections, 8 upstream, and slack for the
    // admin connection, the file and those closing as others open (512
    // without the cap).
    assert!(
        most_fds <= before + 8 + 5 + 8,
        "{most_fds} descriptors (from {before})"
    );
    assert!(most_queued > 0.0, "nothing was seen queued");
    let took = static_took.expect("the load ended before a static file was asked for");
    assert!(took < Duration::from_secs(2), "static file took {took:?}");
    s.expect_metric_line(&format!("{queued} 0\n"));
}

#[test]
fn a_full_queue_and_a_queue_timeout_are_503s_with_their_reason_and_mark_nothing() {
    // max_conns 2, queue 3: of 8 streams at once, 2 are served, 3 wait and
    // give up after queue_timeout, 3 find the queue full at once.
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool(
        "app",
        &[(a.address(), 1)],
        "max_conns = 2\nqueue = 3\nqueue_timeout = \"500ms\"\nmax_fails = 1\nretries = 0",
        "",
    );
    let s = start(&fx, "", &pools, &route("/", "app", ""));
    let statuses = rt().block_on(async {
        let c = h2_client(s.addr).await;
        let mut tasks = Vec::new();
        for i in 0..8 {
            let c = c.clone();
            // Each stream's own wait: on a busy machine the later ones
            // start well after the first.
            tasks.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let r = exchange(&c, get("/sleep?ms=1500"), None).await;
                (i, r.status, t0.elapsed())
            }));
            // In order: the first two take the connections.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let ok: Vec<_> = statuses.iter().filter(|s| s.1 == 200).collect();
    let refused: Vec<_> = statuses.iter().filter(|s| s.1 == 503).collect();
    assert_eq!((ok.len(), refused.len()), (2, 6), "{statuses:?}");
    s.wait_access_line(&[
        "\"GET /sleep?ms=1500 HTTP/2.0\" 503",
        "upstream_error=queue_full",
    ]);
    s.wait_access_line(&[
        "\"GET /sleep?ms=1500 HTTP/2.0\" 503",
        "upstream_error=queue_timeout",
    ]);
    let server = format!("server=\"{}\"", a.address());
    for kind in ["queue_full", "queue_timeout"] {
        let want = format!("reason=\"{kind}\"");
        assert_eq!(
            metric_sum(&s, &["tlsgate_proxy_errors_total", "status=\"503\"", &want]),
            3.0,
            "{kind}"
        );
        let want = format!("kind=\"{kind}\"");
        assert_eq!(
            metric_sum(&s, &["tlsgate_upstream_errors_total", &server, &want]),
            3.0,
            "{kind}"
        );
    }
    // Waiting in the queue took its timeout; a full queue answered at once.
    let mut waits: Vec<Duration> = refused.iter().map(|s| s.2).collect();
    waits.sort();
    assert!(waits[2] < Duration::from_millis(400), "{statuses:?}");
    assert!(waits[3] >= Duration::from_millis(500), "{statuses:?}");
    // A busy server is not a failing one (max_fails = 1).
    s.expect_metric_line(&format!(
        "tlsgate_upstream_healthy{{pool=\"app\",{server}}} 1\n"
    ));
    assert!(!s.log().contains("upstream server out"), "{}", s.log());
    rt().block_on(async {
        let c = h2_client(s.addr).await;
        assert_eq!(exchange(&c, get("/id"), None).await.status, 200);
    });
}

#[test]
fn one_connection_forwards_at_most_max_proxied_streams_at_once() {
    // 16 streams on one connection with max_proxied_streams = 4: at most 4
    // upstream connections, the rest wait for a place and are all served;
    // another connection is not held up by them.
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let s = start(
        &fx,
        "[http2]\nmax_proxied_streams = 4",
        &pools,
        &route("/", "app", ""),
    );
    let addr = s.addr;
    let t0 = Instant::now();
    let load =
        std::thread::spawn(move || rt().block_on(streams_at_once(addr, 1, 16, "/sleep?ms=300")));
    let mut most_open = 0;
    let mut other_took = None;
    while !load.is_finished() {
        most_open = most_open.max(held_to(s.pid(), &a.address()));
        if a.requests.load(Ordering::SeqCst) >= 2 && other_took.is_none() {
            other_took = Some(rt().block_on(async {
                let c = h2_client(addr).await;
                let t = Instant::now();
                assert_eq!(exchange(&c, get("/id"), None).await.status, 200);
                t.elapsed()
            }));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let statuses = load.join().unwrap();
    let took = t0.elapsed();
    assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
    assert!(
        (1..=5).contains(&most_open),
        "{most_open} upstream connections open at once"
    );
    // Four rounds of 300 ms.
    assert!(took >= Duration::from_millis(1150), "{took:?}");
    let other = other_took.expect("the load ended first");
    assert!(other < Duration::from_millis(250), "{other:?}");
}
