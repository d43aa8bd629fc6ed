//! How TLS connections end and how odd first flights are met, with peers
//! other than rustls' own happy path: Python's `ssl` (OpenSSL) closing at
//! every point of a connection, raw sockets replaying real ClientHellos,
//! a corrupted record after a resumed TLS 1.2 session, and a stop.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::client::{Resumption, Tls12Resumption};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, HandshakeKind};

/// Python closes with `unwrap()` (SSL_shutdown: sends close_notify, then
/// waits for the server's) right after the handshake, in the middle of a
/// request head, and in keep-alive idle after a response; TLS 1.2 and 1.3.
#[test]
fn close_notify_is_answered_in_every_state() {
    let fx = Fixture::new();
    for offload in ["never", "always"] {
        let config = fx.config("", "").replace(
            "[[listener.certificate]]",
            &format!("offload = \"{offload}\"\n\n[[listener.certificate]]"),
        );
        let s = Server::start(&fx, &config);
        let script = r#"
import socket, ssl, sys
port = int(sys.argv[1])
for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
    for state in ("handshake", "partial_head", "keepalive_idle"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = version
        ctx.maximum_version = version
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        s = ctx.wrap_socket(raw, server_hostname="localhost")
        if state == "partial_head":
            s.sendall(b"GET /hello.txt HTTP/1.1\r\nHo")
        elif state == "keepalive_idle":
            s.sendall(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
            got = b""
            while not got.endswith(b"hello from the test site\n"):
                got += s.recv(4096)
        s.unwrap()  # raises unless the server's close_notify comes back
        print("ok", version.name, state)
"#;
        let out = Command::new("python3")
            .args(["-c", script, &s.addr.port().to_string()])
            .output()
            .expect("python3 must be installed (./dev setup installs it)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "offload {offload}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.lines().count(), 6, "{stdout}");
    }
}

/// A real ClientHello, as rustls writes it.
fn client_hello(versions: &[&'static rustls::SupportedProtocolVersion]) -> Vec<u8> {
    let mut c = ClientConnection::new(
        Arc::new(client_config(versions)),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut hello = Vec::new();
    c.write_tls(&mut hello).unwrap();
    hello
}

/// Reads until the server closes, for at most `limit`; what came and how long.
fn read_until_close(sock: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let t0 = Instant::now();
    sock.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => return (got, t0.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Two ClientHellos in one segment: the second is processed at once and
/// ends the connection with unexpected_message — no wait for the handshake
/// timeout — and the handshake slot is free again.
#[test]
fn a_second_hello_in_the_first_segment_ends_the_connection_at_once() {
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("", ""));
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let hello = client_hello(versions);
        let mut sock = TcpStream::connect(s.addr).unwrap();
        sock.write_all(&[hello.clone(), hello].concat()).unwrap();
        let (got, took) = read_until_close(&mut sock, Duration::from_secs(5));
        assert!(took < Duration::from_secs(1), "closed only after {took:?}");
        assert_eq!(
            got.first(),
            Some(&0x16),
            "the server's first flight came first"
        );
        // The last record is the alert: plaintext (TLS 1.2 before its
        // keys) ends in [2, 10]; TLS 1.3's is encrypted, so only its type shows.
        let tail = &got[got.len() - 7..];
        if versions[0] == &rustls::version::TLS12 {
            assert_eq!(tail, &[0x15, 3, 3, 0, 2, 2, 10], "unexpected_message");
        }
    }
    s.expect_metric_line("tlsgate_handshakes_in_progress 0\n");
}

/// legacy_version 0x0300 in an otherwise real TLS 1.3 ClientHello:
/// protocol_version (70) and no ServerHello.
#[test]
fn an_sslv3_hello_gets_protocol_version() {
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("", ""));
    let mut hello = client_hello(&[&rustls::version::TLS13, &rustls::version::TLS12]);
    assert_eq!((hello[0], hello[5]), (0x16, 0x01));
    hello[9] = 0x03;
    hello[10] = 0x00;
    let mut sock = TcpStream::connect(s.addr).unwrap();
    sock.write_all(&hello).unwrap();
    let (got, _) = read_until_close(&mut sock, Duration::from_secs(5));
    assert_eq!(
        got,
        [0x15, 3, 3, 0, 2, 2, 70],
        "wanted only a protocol_version alert"
    );
    s.expect_metric_line(r#"tlsgate_handshake_failures_total{reason="protocol_version"} 1"#);
}

/// A TLS 1.2 session (session IDs, no tickets) resumes in a control
/// connection; once a connection of that session fails with a corrupted
/// record (bad_record_mac), it never resumes again.
#[test]
fn a_session_that_ended_in_a_fatal_alert_does_not_resume() {
    let fx = Fixture::new();
    for offload in ["never", "always"] {
        let config = fx.config("[tls]\nsession_tickets = false\n", "").replace(
            "[[listener.certificate]]",
            &format!("offload = \"{offload}\"\n\n[[listener.certificate]]"),
        );
        let s = Server::start(&fx, &config);
        let mut c = client_config(&[&rustls::version::TLS12]);
        c.resumption =
            Resumption::in_memory_sessions(16).tls12_resumption(Tls12Resumption::SessionIdOnly);
        let c = Arc::new(c);
        let hello = |c: &Arc<rustls::ClientConfig>| {
            let mut t = tls_connect_shared(s.addr, "localhost", c.clone()).unwrap();
            write!(t, "GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
            let mut buf = [0u8; 4096];
            let n = t.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
            t
        };
        let first = hello(&c);
        assert_eq!(first.conn.handshake_kind(), Some(HandshakeKind::Full));
        drop(first);
        let mut control = hello(&c);
        assert_eq!(
            control.conn.handshake_kind(),
            Some(HandshakeKind::Resumed),
            "{offload}: the control connection resumes"
        );
        // A record whose MAC cannot verify.
        let mut bad = vec![0x17, 3, 3, 0, 40];
        bad.extend((0..40u8).map(|i| i.wrapping_mul(37)));
        control.sock.write_all(&bad).unwrap();
        let (got, _) = read_until_close(&mut control.sock, Duration::from_secs(5));
        if offload == "never" {
            // rustls' alert goes out encrypted: only its record type shows.
            assert_eq!(
                got.first(),
                Some(&0x15),
                "{offload}: an alert record, got {got:?}"
            );
        }
        let after = hello(&c);
        assert_eq!(
            after.conn.handshake_kind(),
            Some(HandshakeKind::Full),
            "{offload}: the failed session resumed"
        );
    }
}

/// An orderly stop after traffic logs no error.
#[test]
fn sigterm_after_traffic_logs_no_error() {
    let fx = Fixture::new();
    let mut s = Server::start(&fx, &fx.config("", ""));
    let o = s.curl(&[&s.url("/hello.txt")]);
    assert!(o.status.success());
    s.signal("TERM");
    assert!(s.wait_exit(Duration::from_secs(20)).success());
    let log = s.log();
    assert!(!log.contains("ERROR"), "{log}");
}

/// After a `Connection: close` response the server lingers, draining what
/// the client still sends until its FIN (up to 2 s), so that a reset does
/// not destroy the response. A client's close_notify ends that at once: a
/// TLS peer sends nothing after it. A client that sends none and keeps
/// its socket open is still waited for.
#[test]
fn a_clients_close_notify_ends_the_lingering_close() {
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("", ""));
    // Python's `unwrap()` sends close_notify and leaves the TCP connection
    // open; "plain" sends nothing more. Both then hold the socket for 4 s.
    let script = r#"
import socket, ssl, sys, time
port, how = int(sys.argv[1]), sys.argv[2]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
raw = socket.create_connection(("127.0.0.1", port), timeout=5)
s = ctx.wrap_socket(raw, server_hostname="localhost")
s.sendall(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
got = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    got += chunk
assert got.endswith(b"hello from the test site\n"), got
held = s.unwrap() if how == "close_notify" else s
print("answered", flush=True)
time.sleep(4)
"#;
    for how in ["close_notify", "plain"] {
        let mut client = Command::new("python3")
            .args(["-c", script, &s.addr.port().to_string(), how])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 must be installed (./dev setup installs it)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(client.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "answered", "{how}");
        // The linger lasts 2 s: let go well before it, or still held at
        // half of it.
        let wait = Duration::from_millis(if how == "close_notify" { 1500 } else { 1000 });
        let t0 = Instant::now();
        let text =
            s.metrics_when(|t| t.contains("tlsgate_connections_open 0\n") || t0.elapsed() > wait);
        let closed = text.contains("tlsgate_connections_open 0\n");
        if how == "close_notify" {
            assert!(
                closed,
                "still lingering {wait:?} after the client's close_notify"
            );
        } else {
            assert!(
                text.contains("tlsgate_connections_open 1\n"),
                "a client without close_notify must be waited for: {text}"
            );
        }
        let _ = client.kill();
        let _ = client.wait();
        s.metrics_when(|t| t.contains("tlsgate_connections_open 0\n"));
    }
}

/// A connection reset while the server writes to it (a client that asks
/// for a big file and goes) makes a write fail; nothing more is tried on
/// that socket, close_notify included. A client that resets right after
/// its Finished (as `openssl s_time`, scanners and TLS health checks do)
/// and whose reset the server has seen when it reads that Finished gets
/// no session tickets: none is sealed (`tlsgate_tickets_issued_total`),
/// none written into the dead socket. And a listener that serves only
/// files never asks a connection without SNI for the address it reached
/// (`getsockname`: only a proxied, Host-less request needs it). Each was
/// a system call or more per connection under `s_time`. Over HTTP/1.1
/// and HTTP/2.
#[test]
fn a_reset_connection_gets_no_more_writes_and_a_file_site_asks_no_socket_name() {
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("", ""));
    let connections = 16;
    // Each TLS 1.3 handshake that is not skipped issues this many.
    let per_handshake = 2.0;
    let mut tickets = 0.0;
    let calls = traced_calls(
        &fx,
        &["trace=writev,sendmsg,sendto,write,getsockname,close"],
        s.pid(),
        || {
            for i in 0..connections {
                // By address: no SNI; every other one over HTTP/2, whose
                // connection loop sends and shuts down on its own path.
                let protocol: &[u8] = if i % 2 == 1 { b"h2" } else { b"http/1.1" };
                let mut config = client_config(&[&rustls::version::TLS13]);
                config.alpn_protocols = vec![protocol.to_vec()];
                let c = tls_connect_with(s.addr, "127.0.0.1", config).unwrap();
                assert_eq!(c.conn.alpn_protocol(), Some(protocol));
                socket2::SockRef::from(&c.sock)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
                drop(c);
            }
            // Until the server has seen every connection end.
            s.metrics_when(|t| t.contains("tlsgate_connections_open 0\n"));
            tickets = s.metric("tlsgate_tickets_issued_total");
            // Reset in the middle of a body the socket cannot hold (a
            // 4 KiB receive buffer against 1 MiB): a write fails.
            for _ in 0..4 {
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                sock.set_recv_buffer_size(4096).unwrap();
                sock.connect(&s.addr.into()).unwrap();
                let sock: TcpStream = sock.into();
                sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let conn = ClientConnection::new(
                    Arc::new(client_config(&[&rustls::version::TLS13])),
                    ServerName::try_from("127.0.0.1").unwrap(),
                )
                .unwrap();
                let mut c = rustls::StreamOwned::new(conn, sock);
                c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    .unwrap();
                let mut head = [0u8; 64];
                c.read_exact(&mut head).unwrap();
                assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
                socket2::SockRef::from(&c.sock)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
                drop(c);
            }
            s.metrics_when(|t| t.contains("tlsgate_connections_open 0\n"));
        },
    );
    // Under strace the server reads a Finished well after the reset behind
    // it has come: most of them, and always some, get no tickets.
    assert!(
        tickets < per_handshake * f64::from(connections),
        "every connection reset after its handshake was issued tickets: {tickets}"
    );
    // Those alive at their Finished (they sent a request with it) do.
    let live = s.metric("tlsgate_tickets_issued_total") - tickets;
    assert!(
        live >= per_handshake * 4.0,
        "tickets issued to live connections: {live}"
    );
    assert!(
        !calls.iter().any(|l| l.contains("getsockname(")),
        "{calls:#?}"
    );
    // Per descriptor, from a failed write to its close: no other write.
    let fd_of = |l: &str| -> Option<(String, i32)> {
        let call = l.split_whitespace().nth(1).unwrap_or(l);
        let (name, rest) = call.split_once('(')?;
        let fd = rest
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        Some((name.to_string(), fd))
    };
    let mut failed: std::collections::HashMap<i32, String> = Default::default();
    let mut failures = 0;
    for line in &calls {
        let Some((name, fd)) = fd_of(line) else {
            continue;
        };
        if name == "close" {
            failed.remove(&fd);
            continue;
        }
        if let Some(first) = failed.get(&fd) {
            panic!("wrote again after a failed write on fd {fd}:\n{first}\n{line}");
        }
        if line.contains("= -1 E") && !line.contains("EAGAIN") {
            failures += 1;
            failed.insert(fd, line.clone());
        }
    }
    assert!(
        failures > 0,
        "no write failed on a reset connection, so this proved nothing: {calls:#?}"
    );
}
