//! The PROXY protocol on a listener behind a load balancer
//! (`proxy_protocol_from`): HAProxy in front sending v1 and v2 headers,
//! hand-made headers (split, LOCAL, forged by an untrusted source,
//! missing, late), and the limits applied to the client a header names;
//! and headers sent to upstreams (`proxy_protocol` on a pool), read by nginx.

#![allow(clippy::unwrap_used, missing_docs)]
mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::upstream::{body_text, get, pool, route, Upstream};
use common::*;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

/// A v1 header from `client` to the server at `to`.
fn v1(client: SocketAddr, to: SocketAddr) -> Vec<u8> {
    format!(
        "PROXY TCP4 {} {} {} {}\r\n",
        client.ip(),
        to.ip(),
        client.port(),
        to.port()
    )
    .into_bytes()
}

/// A v2 header: `command` 1 = PROXY, 0 = LOCAL; IPv4 addresses; one TLV.
fn v2(command: u8, client: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(c), SocketAddr::V4(t)) = (client, to) else {
        panic!("IPv4 only here");
    };
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x20 | command);
    h.push(0x11);
    // Addresses (12 bytes) and a NOOP TLV (type 4) of 3 bytes.
    h.extend_from_slice(&18u16.to_be_bytes());
    h.extend_from_slice(&c.ip().octets());
    h.extend_from_slice(&t.ip().octets());
    h.extend_from_slice(&c.port().to_be_bytes());
    h.extend_from_slice(&t.port().to_be_bytes());
    h.extend_from_slice(&[4, 0, 3, 0, 0, 0]);
    h
}

/// Connects from `source`, sends `header` in `pieces` writes (a pause
/// between them), then completes a TLS handshake. `pieces = 0`: the header
/// and the ClientHello in one write, so the server must take exactly the
/// header's bytes from what it finds.
fn tls_after_header(
    source: &str,
    to: SocketAddr,
    header: &[u8],
    pieces: usize,
) -> std::io::Result<TlsStream> {
    let mut sock = connect_from(source, to)?;
    let mut conn = ClientConnection::new(
        Arc::new(client_config(rustls::DEFAULT_VERSIONS)),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    if pieces == 0 {
        let mut first = header.to_vec();
        while conn.wants_write() {
            conn.write_tls(&mut first)?;
        }
        sock.write_all(&first)?;
    } else {
        for chunk in header.chunks(header.len().div_ceil(pieces)) {
            sock.write_all(chunk)?;
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut s = StreamOwned::new(conn, sock);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// `GET /hello.txt` with `Connection: close`; the whole answer.
fn get_hello(s: &mut TlsStream) -> String {
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    s.flush().unwrap();
    read_to_close(s)
}

fn server_trusting(fx: &Fixture, sources: &str, top: &str) -> Server {
    server_trusting_with(fx, sources, top, "")
}

/// Like `server_trusting`, with `listener_extra` (routes) in the listener.
fn server_trusting_with(fx: &Fixture, sources: &str, top: &str, listener_extra: &str) -> Server {
    let config = fx.config(top, listener_extra).replacen(
        "\n[[listener.certificate]]",
        &format!("proxy_protocol_from = [{sources}]\n\n[[listener.certificate]]"),
        1,
    );
    Server::start(fx, &config)
}

#[test]
fn hand_made_v1_and_v2_headers_name_the_client_even_split_across_writes() {
    let fx = Fixture::new();
    let s = server_trusting(&fx, "\"127.0.0.0/30\"", "");
    s.wait_log(
        "listener[0]: connections from 127.0.0.0/30 must begin with a PROXY protocol header",
        Duration::from_secs(5),
    );
    let cases = [
        (
            "198.51.100.7:40001",
            v1("198.51.100.7:40001".parse().unwrap(), s.addr),
            1,
        ),
        (
            "198.51.100.8:40002",
            v2(1, "198.51.100.8:40002".parse().unwrap(), s.addr),
            1,
        ),
        // With the ClientHello in the same write.
        (
            "198.51.100.11:40005",
            v1("198.51.100.11:40005".parse().unwrap(), s.addr),
            0,
        ),
        (
            "198.51.100.12:40006",
            v2(1, "198.51.100.12:40006".parse().unwrap(), s.addr),
            0,
        ),
        // The header in three writes 30 ms apart: taken whole, and not a
        // byte of the ClientHello with it.
        (
            "198.51.100.9:40003",
            v2(1, "198.51.100.9:40003".parse().unwrap(), s.addr),
            3,
        ),
        (
            "198.51.100.10:40004",
            v1("198.51.100.10:40004".parse().unwrap(), s.addr),
            4,
        ),
    ];
    for (client, header, pieces) in &cases {
        let mut c = tls_after_header("127.0.0.1", s.addr, header, *pieces).unwrap();
        let answer = get_hello(&mut c);
        assert!(answer.starts_with("HTTP/1.1 200"), "{client}: {answer}");
        assert!(answer.ends_with(HELLO), "{client}: {answer}");
        let ip = client.split(':').next().unwrap();
        s.wait_access_line(&[&format!("{ip} - "), "/hello.txt"]);
    }
    // LOCAL (a balancer's own health check): the connection's own address.
    let mut c = tls_after_header(
        "127.0.0.2",
        s.addr,
        &v2(0, "203.0.113.1:1".parse().unwrap(), s.addr),
        1,
    )
    .unwrap();
    assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
    s.wait_access_line(&["127.0.0.2 - ", "/hello.txt"]);
    assert!(!s.access_log().contains("203.0.113.1"));
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"v1\"} 3");
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"v2\"} 4");
}

#[test]
fn an_untrusted_source_cannot_forge_its_address_and_is_served_as_itself() {
    let fx = Fixture::new();
    let s = server_trusting(&fx, "\"127.0.0.1\"", "");
    // From 127.0.0.3, a header is not a header but the start of a TLS
    // record: the handshake fails and nothing is served.
    let forged = v1("203.0.113.66:5555".parse().unwrap(), s.addr);
    assert!(tls_after_header("127.0.0.3", s.addr, &forged, 1).is_err());
    let forged = v2(1, "203.0.113.66:5555".parse().unwrap(), s.addr);
    assert!(tls_after_header("127.0.0.3", s.addr, &forged, 1).is_err());
    // Without one, it is served, as itself.
    let mut c = tls_from("127.0.0.3", s.addr).unwrap();
    assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
    s.wait_access_line(&["127.0.0.3 - ", "/hello.txt"]);
    assert!(!s.access_log().contains("203.0.113.66"));
}

#[test]
fn a_trusted_source_without_a_header_or_too_slow_with_it_is_closed_and_warned_about() {
    let fx = Fixture::new();
    let s = server_trusting(
        &fx,
        "\"127.0.0.1\"",
        "[limits]\nhandshake_timeout = \"1s\"\n",
    );
    // A plain TLS client from the balancer's address: no header.
    assert!(tls_from("127.0.0.1", s.addr).is_err());
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"missing\"} 1");
    s.wait_log("listed in proxy_protocol_from, closed: the connection does not begin with a PROXY protocol header", Duration::from_secs(5));
    // Garbage after a v1 prefix.
    let mut sock = connect_from("127.0.0.1", s.addr).unwrap();
    sock.write_all(b"PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\n")
        .unwrap();
    assert!(closed_within(&mut sock, Duration::from_secs(3)));
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"malformed\"} 1");
    // Half a header, then silence: closed at the handshake timeout.
    let mut sock = connect_from("127.0.0.1", s.addr).unwrap();
    let header = v2(1, "198.51.100.7:1".parse().unwrap(), s.addr);
    sock.write_all(&header[..20]).unwrap();
    let t0 = Instant::now();
    assert!(closed_within(&mut sock, Duration::from_secs(5)));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_millis(4500),
        "closed after {waited:?}"
    );
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"timeout\"} 1");
    s.expect_metric_line("tlsgate_timeouts_total{reason=\"proxy_protocol_header\"} 1");
    // A header announcing more than the server takes.
    let mut sock = connect_from("127.0.0.1", s.addr).unwrap();
    let mut huge = b"\r\n\r\n\0\r\nQUIT\n\x21\x11".to_vec();
    huge.extend_from_slice(&60_000u16.to_be_bytes());
    huge.extend_from_slice(&[0; 2000]);
    let _ = sock.write_all(&huge);
    assert!(closed_within(&mut sock, Duration::from_secs(3)));
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"too_long\"} 1");
    // The server still serves.
    let mut c = tls_after_header(
        "127.0.0.1",
        s.addr,
        &v1("198.51.100.7:9".parse().unwrap(), s.addr),
        1,
    )
    .unwrap();
    assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
}

#[test]
fn per_source_limits_count_the_client_a_header_names_not_the_balancer() {
    let fx = Fixture::new();
    let s = server_trusting(
        &fx,
        "\"127.0.0.1\"",
        "[limits]\nmax_connections_per_ip = 2\n",
    );
    let a: SocketAddr = "198.51.100.7:1000".parse().unwrap();
    let b: SocketAddr = "198.51.100.8:1000".parse().unwrap();
    // Two connections held open as client a: its limit.
    let _held: Vec<TlsStream> = (0..2)
        .map(|_| tls_after_header("127.0.0.1", s.addr, &v2(1, a, s.addr), 1).unwrap())
        .collect();
    // A third as a is refused before its handshake...
    assert!(tls_after_header("127.0.0.1", s.addr, &v2(1, a, s.addr), 1).is_err());
    s.expect_metric_line("tlsgate_connections_rejected_total{reason=\"max_connections_per_ip\"} 1");
    s.wait_log("this one from 198.51.100.7", Duration::from_secs(5));
    // ...while b, through the same balancer address, is served.
    let mut c = tls_after_header("127.0.0.1", s.addr, &v2(1, b, s.addr), 1).unwrap();
    assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
}

#[test]
fn connections_waiting_for_their_header_hold_places_in_max_connections() {
    let fx = Fixture::new();
    let s = server_trusting(&fx, "\"127.0.0.1\"", "[limits]\nmax_connections = 2\n");
    let client: SocketAddr = "198.51.100.7:1000".parse().unwrap();
    // Two connections from the balancer with a byte of a header each (a
    // silent one would wait in the kernel: TCP_DEFER_ACCEPT).
    let silent: Vec<_> = (0..2)
        .map(|_| {
            let mut c = connect_from("127.0.0.1", s.addr).unwrap();
            c.write_all(b"P").unwrap();
            c
        })
        .collect();
    // Time for the workers to accept both (a third connection tried before
    // that would take a place and get one of them refused instead).
    std::thread::sleep(Duration::from_millis(500));
    // A third, whole, is refused: both places are taken.
    assert!(tls_after_header("127.0.0.1", s.addr, &v2(1, client, s.addr), 0).is_err());
    let deadline = Instant::now() + Duration::from_secs(5);
    s.expect_metric_line("tlsgate_connections_rejected_total{reason=\"max_connections\"} 1");
    drop(silent);
    loop {
        match tls_after_header("127.0.0.1", s.addr, &v2(1, client, s.addr), 0) {
            Ok(mut c) => {
                assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "still refused: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on 127.0.0.1:`port` (IPv4 sockets only).
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // st 0A = LISTEN
        f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")
    })
}

struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn haproxy_in_front_passes_the_clients_address_in_v1_and_v2() {
    let haproxy = "/usr/sbin/haproxy";
    assert!(
        std::path::Path::new(haproxy).exists(),
        "{haproxy} is missing: run ./dev setup (it installs haproxy)"
    );
    let fx = Fixture::new();
    // /app goes to an upstream, which must be told the client's address.
    let app = Upstream::start("app", None);
    let s = server_trusting_with(
        &fx,
        "\"127.0.0.1\"",
        &pool("app", &[(app.address(), 1)], "", ""),
        &route("/app", "app", ""),
    );
    let p1 = free_port();
    let p2 = std::iter::repeat_with(free_port)
        .find(|p| *p != p1)
        .unwrap();
    let cfg = fx.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 200\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend v2\n  bind 127.0.0.1:{p1}\n  default_backend tlsgate_v2\n\
             backend tlsgate_v2\n  server t {addr} send-proxy-v2 source 127.0.0.1\n\
             frontend v1\n  bind 127.0.0.1:{p2}\n  default_backend tlsgate_v1\n\
             backend tlsgate_v1\n  server t {addr} send-proxy source 127.0.0.1\n",
            addr = s.addr
        ),
    )
    .unwrap();
    let _lb = Haproxy(
        Command::new(haproxy)
            .args(["-db", "-f", cfg.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    // Read from /proc: a test connection would make HAProxy open one to
    // tlsgate, with a header, and count; a test bind could take the port.
    while ![p1, p2].iter().all(|p| listening(*p)) {
        assert!(Instant::now() < deadline, "haproxy did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    for (port, source, protocol) in [
        (p1, "127.0.0.5", "--http2"),
        (p2, "127.0.0.6", "--http1.1"),
        (p1, "127.0.0.7", "--http1.1"),
    ] {
        let out = Command::new("curl")
            .args([
                "-sk",
                protocol,
                "--interface",
                source,
                "--resolve",
                &format!("localhost:{port}:127.0.0.1"),
                &format!("https://localhost:{port}/hello.txt"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), HELLO);
        s.wait_access_line(&[&format!("{source} - "), "/hello.txt"]);
    }
    // Through to the upstream: X-Forwarded-For names the client too.
    let out = Command::new("curl")
        .args([
            "-sk",
            "--interface",
            "127.0.0.8",
            "--resolve",
            &format!("localhost:{p1}:127.0.0.1"),
            &format!("https://localhost:{p1}/app/who"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let head = app.last_head.lock().unwrap().clone();
    assert!(
        head.contains("X-Forwarded-For: 127.0.0.8\r\n"),
        "the upstream was told:\n{head}"
    );
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"v2\"} 3");
    s.expect_metric_line("tlsgate_proxy_protocol_headers_total{result=\"v1\"} 1");
    let log = s.access_log();
    assert!(
        !log.lines().any(|l| l.starts_with("127.0.0.1 - ")),
        "a request logged as from the balancer:\n{log}"
    );
}

#[test]
fn a_reload_changes_who_is_trusted_for_new_connections() {
    let fx = Fixture::new();
    let s = server_trusting(&fx, "\"127.0.0.2\"", "");
    let client: SocketAddr = "198.51.100.7:1000".parse().unwrap();
    let mut held = tls_after_header("127.0.0.2", s.addr, &v2(1, client, s.addr), 0).unwrap();
    assert!(tls_after_header("127.0.0.1", s.addr, &v2(1, client, s.addr), 0).is_err());
    // Trust 127.0.0.1 instead; the file Server::start wrote is reloaded.
    let path = fx.path().join("tlsgate.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[\"127.0.0.2\"]", "[\"127.0.0.1\"]")).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    let mut c = tls_after_header("127.0.0.1", s.addr, &v2(1, client, s.addr), 0).unwrap();
    assert!(get_hello(&mut c).starts_with("HTTP/1.1 200"));
    assert!(tls_after_header("127.0.0.2", s.addr, &v2(1, client, s.addr), 0).is_err());
    // The connection accepted before the reload is served as it was.
    assert!(get_hello(&mut held).starts_with("HTTP/1.1 200"));
    s.wait_access_line(&["198.51.100.7 - ", "/hello.txt"]);
    assert!(!s.access_log().contains("127.0.0.2 - "));
}

// ---------------------------------------------------------------------
// Sending the header upstream (`proxy_protocol` on an `[[upstream]]`),
// to nginx listening with `proxy_protocol`: it refuses a connection
// without a header, and answers with what the header told it.
// ---------------------------------------------------------------------

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx reading PROXY protocol headers on a plain port and on a TLS
/// port (a certificate for localhost from a CA of its own), answering
/// every request with the client and server addresses its connection's
/// header named, its connection's serial number and how many requests
/// that connection took; and the two ports and the CA's PEM file.
fn nginx_reading_headers(fx: &Fixture) -> (Nginx, u16, u16, std::path::PathBuf) {
    let nginx = "/usr/sbin/nginx";
    assert!(
        std::path::Path::new(nginx).exists(),
        "{nginx} is missing: run ./dev setup (it installs nginx)"
    );
    let ca = make_ca("upstream CA");
    let ca_pem = fx.path().join("upstream-ca.pem");
    std::fs::write(&ca_pem, ca.0.pem()).unwrap();
    let (_, _, cert, key) =
        common::upstream::make_leaf(fx.path(), "nginx", &["localhost"], false, &ca);
    let plain = free_port();
    let tls = std::iter::repeat_with(free_port)
        .find(|p| *p != plain)
        .unwrap();
    let dir = fx.path().join("nginx");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nuser root;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  keepalive_timeout 60s;\n\
               server {{\n    listen 127.0.0.1:{plain} proxy_protocol;\n    listen 127.0.0.1:{tls} ssl proxy_protocol;\n    ssl_certificate {cert};\n    ssl_certificate_key {key};\n\
                 location / {{ return 200 \"client=$proxy_protocol_addr:$proxy_protocol_port server=$proxy_protocol_server_addr:$proxy_protocol_server_port conn=$connection n=$connection_requests\\n\"; }}\n  }}\n}}\n",
            cert = cert.display(),
            key = key.display(),
        ),
    )
    .unwrap();
    let child = Command::new(nginx)
        .args(["-p", &d.to_string(), "-c", conf.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Read from /proc: a test connection without a header would count as
    // one of the refusals the tests look for.
    while !(listening(plain) && listening(tls)) {
        assert!(Instant::now() < deadline, "nginx did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Nginx(child), plain, tls, ca_pem)
}

/// What nginx said of one request: the header's client and server, the
/// connection's serial number and its count of requests.
#[derive(Debug, PartialEq)]
struct Told {
    client: String,
    server: String,
    conn: u64,
    n: u64,
}

fn told(body: &str) -> Told {
    let field = |name: &str| {
        body.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {body:?}"))
            .to_string()
    };
    Told {
        client: field("client="),
        server: field("server="),
        conn: field("conn=").parse().unwrap(),
        n: field("n=").parse().unwrap(),
    }
}

/// A keep-alive GET of `path`; the status and the body.
fn get_kept(s: &mut TlsStream, path: &str) -> (u16, String) {
    let r = get(s, path, "").unwrap();
    (r.status, body_text(&r))
}

/// Every `tlsgate_upstream_connections_open` sample of `pool` is 0.
fn none_open(metrics: &str, pool: &str) -> bool {
    let prefix = format!("tlsgate_upstream_connections_open{{pool=\"{pool}\"");
    let lines: Vec<&str> = metrics.lines().filter(|l| l.starts_with(&prefix)).collect();
    !lines.is_empty() && lines.iter().all(|l| l.ends_with(" 0"))
}

#[test]
fn upstreams_are_told_each_client_and_its_connections_serve_no_other() {
    let fx = Fixture::new();
    let (_nginx, plain, tls, ca_pem) = nginx_reading_headers(&fx);
    let at = |port: u16| vec![(format!("127.0.0.1:{port}"), 1)];
    // Checks every 100 ms: three failed in a row take a server out.
    let check = "[upstream.health_check]\ninterval = \"100ms\"\ntimeout = \"1s\"\n";
    let pools = [
        pool("v1", &at(plain), "proxy_protocol = \"v1\"", check),
        pool("v2", &at(plain), "proxy_protocol = \"v2\"", check),
        pool(
            "v2tls",
            &at(tls),
            &format!("proxy_protocol = \"v2\"\ntls = true\nca = {ca_pem:?}\nsni = \"localhost\""),
            check,
        ),
        pool("none", &at(plain), "", check),
    ]
    .concat();
    // One worker: one shared idle list, which a private connection must
    // stay out of.
    let top = format!(
        "[server]\nworkers = 1\n{}\n{pools}",
        common::upstream::NO_RATE_LIMIT
    );
    let routes = common::upstream::routes(&[
        ("/v1", "v1"),
        ("/v2", "v2"),
        ("/tls", "v2tls"),
        ("/none", "none"),
    ]);
    let s = Server::start(&fx, &fx.config(&top, &routes));
    // nginx refuses the checks without a header: that server goes out;
    // the checks with one (v2 LOCAL, v1 UNKNOWN) keep theirs in.
    let healthy = |m: &str, pool: &str| {
        let prefix = format!("tlsgate_upstream_healthy{{pool=\"{pool}\",");
        m.lines()
            .find(|l| l.starts_with(&prefix))
            .map(|l| l.ends_with(" 1"))
    };
    let m = s.metrics_when(|m| healthy(m, "none") == Some(false));
    assert_eq!(healthy(&m, "none"), Some(false), "{m}");
    // Three failed checks take a server out: 300 ms at 100 ms apart, and
    // as long again for any check that began late.
    std::thread::sleep(Duration::from_millis(700));
    let m = s.admin_get("/metrics");
    for p in ["v1", "v2", "v2tls"] {
        assert_eq!(healthy(&m, p), Some(true), "{p}\n{m}");
    }
    let listener = s.addr.to_string();

    let mut a = tls_connect(s.addr);
    let a_addr = a.sock.local_addr().unwrap().to_string();
    let (status, body) = get_kept(&mut a, "/v1/first");
    assert_eq!(status, 200, "{body}");
    let first = told(&body);
    assert_eq!(
        (first.client.as_str(), first.server.as_str(), first.n),
        (a_addr.as_str(), listener.as_str(), 1)
    );
    // The same client's next request takes the same connection.
    let again = told(&get_kept(&mut a, "/v1/again").1);
    assert_eq!((again.conn, again.n), (first.conn, 2));
    // Another client, while the first one's connection is idle: a
    // connection of its own, introducing it.
    let mut b = tls_connect(s.addr);
    let b_addr = b.sock.local_addr().unwrap().to_string();
    let other = told(&get_kept(&mut b, "/v1/other").1);
    assert_eq!(other.client, b_addr);
    assert_ne!(other.conn, first.conn);
    assert_eq!(other.n, 1);
    let third = told(&get_kept(&mut a, "/v1/third").1);
    assert_eq!(
        (third.client.as_str(), third.conn, third.n),
        (a_addr.as_str(), first.conn, 3)
    );
    // v2, and v2 before a TLS handshake with the server.
    for path in ["/v2/x", "/tls/x"] {
        let (status, body) = get_kept(&mut a, path);
        assert_eq!(status, 200, "{path}: {body}");
        let t = told(&body);
        assert_eq!(
            (t.client.as_str(), t.server.as_str()),
            (a_addr.as_str(), listener.as_str()),
            "{path}"
        );
    }
    // The pool without a header: nginx closes on it, and the check took
    // the server out.
    let (status, _) = get_kept(&mut a, "/none/x");
    assert!(status == 502 || status == 503, "{status}");
    // Clients gone: their connections close with them.
    drop(a);
    drop(b);
    let gone = |m: &str| none_open(m, "v1") && none_open(m, "v2") && none_open(m, "v2tls");
    let m = s.metrics_when(gone);
    assert!(gone(&m), "connections outlived their clients:\n{m}");

    // Over HTTP/2: the streams of one connection share its header.
    let out = Command::new("curl")
        .args([
            "-sk",
            "--http2",
            "-w",
            "local=%{local_ip}:%{local_port}\n",
            "--resolve",
            &format!("localhost:{}:127.0.0.1", s.addr.port()),
            &format!("https://localhost:{}/v2/h2-one", s.addr.port()),
            &format!("https://localhost:{}/v2/h2-two", s.addr.port()),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let local = lines[1].strip_prefix("local=").unwrap();
    let (one, two) = (told(lines[0]), told(lines[2]));
    assert_eq!(lines[3], lines[1], "curl used two connections:\n{text}");
    assert_eq!((one.client.as_str(), two.client.as_str()), (local, local));
    assert_eq!((two.conn, two.n), (one.conn, 2));
}

#[test]
fn a_balancers_header_is_passed_on_with_the_client_and_address_it_names() {
    let fx = Fixture::new();
    let (_nginx, plain, _, _) = nginx_reading_headers(&fx);
    let s = server_trusting_with(
        &fx,
        "\"127.0.0.1\"",
        &format!(
            "{}{}",
            common::upstream::NO_RATE_LIMIT,
            pool(
                "app",
                &[(format!("127.0.0.1:{plain}"), 1)],
                "proxy_protocol = \"v1\"",
                ""
            )
        ),
        &route("/app", "app", ""),
    );
    // The balancer's front is 192.0.2.80:8443; the client behind it
    // 198.51.100.7:40001.
    let client: SocketAddr = "198.51.100.7:40001".parse().unwrap();
    let front: SocketAddr = "192.0.2.80:8443".parse().unwrap();
    let mut c = tls_after_header("127.0.0.1", s.addr, &v2(1, client, front), 0).unwrap();
    let (status, body) = get_kept(&mut c, "/app/x");
    assert_eq!(status, 200, "{body}");
    let t = told(&body);
    assert_eq!(
        (t.client.as_str(), t.server.as_str()),
        ("198.51.100.7:40001", "192.0.2.80:8443")
    );
    // A LOCAL header: the balancer itself is the client, and the listener
    // the address it connected to.
    let mut own = tls_after_header("127.0.0.1", s.addr, &v2(0, client, front), 0).unwrap();
    let mine = own.sock.local_addr().unwrap().to_string();
    let t = told(&get_kept(&mut own, "/app/y").1);
    assert_eq!(
        (t.client.as_str(), t.server.as_str()),
        (mine.as_str(), s.addr.to_string().as_str())
    );
}
