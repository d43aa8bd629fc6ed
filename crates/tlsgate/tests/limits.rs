//! Limits and timeouts against hostile or slow clients: slowloris, silent
//! handshakes, idle keep-alive, slow readers, connection caps per source.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn slowloris_connections_are_closed_while_a_normal_client_is_served() {
    const SLOW: usize = 300;
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("[limits]\nheader_timeout = \"2s\"\n", ""));
    let t0 = Instant::now();
    let mut slow: Vec<TlsStream> = (0..SLOW)
        .map(|_| {
            let mut c = tls_connect(s.addr);
            c.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n")
                .unwrap();
            c.sock
                .set_read_timeout(Some(Duration::from_millis(1)))
                .unwrap();
            c
        })
        .collect();
    // Trickle a header line to each every 300 ms: never idle, never done.
    let mut normal_served = false;
    while t0.elapsed() < Duration::from_millis(1500) {
        for c in &mut slow {
            let _ = c.write_all(b"X-Slow: 1\r\n");
        }
        if !normal_served {
            let t = Instant::now();
            let out = s.curl(&[&s.url("/hello.txt")]);
            assert_eq!(
                out.stdout,
                HELLO.as_bytes(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "normal client waited {:?}",
                t.elapsed()
            );
            normal_served = true;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(normal_served);
    // All are closed by the header timeout (2 s after their handshake).
    std::thread::sleep(Duration::from_millis(1500));
    let still_open = slow
        .iter_mut()
        .map(|c| closed_within(c, Duration::from_millis(20)))
        .filter(|closed| !closed)
        .count();
    assert_eq!(
        still_open, 0,
        "{still_open} slow connections survived the header timeout"
    );
    let text = s.metrics_when(|t| {
        t.contains(&format!(
            "tlsgate_timeouts_total{{reason=\"header\"}} {SLOW}"
        ))
    });
    assert!(
        text.contains(&format!(
            "tlsgate_timeouts_total{{reason=\"header\"}} {SLOW}"
        )),
        "{text}"
    );
    let out = s.curl(&[&s.url("/hello.txt")]);
    assert_eq!(out.stdout, HELLO.as_bytes());
}

#[test]
fn silent_and_partial_handshakes_time_out() {
    let fx = Fixture::new();
    let s = Server::start(
        &fx,
        &fx.config("[limits]\nhandshake_timeout = \"1s\"\n", ""),
    );
    let mut silent = TcpStream::connect(s.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut partial = TcpStream::connect(s.addr).unwrap();
    partial
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    partial
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(3)));
    assert!(closed_within(&mut partial, Duration::from_secs(3)));
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "closed too early: {:?}",
        t.elapsed()
    );
    let text =
        s.metrics_when(|t| t.contains("tlsgate_handshake_failures_total{reason=\"timeout\"} 2"));
    assert!(
        text.contains("tlsgate_handshake_failures_total{reason=\"timeout\"} 2"),
        "{text}"
    );
}

#[test]
fn idle_keepalive_is_closed_and_requests_per_connection_capped() {
    let fx = Fixture::new();
    let top = "[limits]\nkeepalive_timeout = \"1s\"\nmax_requests_per_connection = 3\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let mut c = tls_connect(s.addr);
    c.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    assert!(c.read(&mut buf).unwrap() > 0);
    c.sock
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let t = Instant::now();
    assert!(
        closed_within(&mut c, Duration::from_secs(4)),
        "idle connection kept open"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "closed before the keep-alive timeout"
    );
    assert!(s.metric(r#"tlsgate_timeouts_total{reason="keepalive"}"#) >= 1.0);

    let five = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(5);
    let answer = raw_exchange(s.addr, &five);
    assert_eq!(statuses(&answer), vec![200, 200, 200], "{answer}");
    assert_eq!(answer.matches("Connection: close").count(), 1, "{answer}");
}

#[test]
fn slow_reader_is_cut_by_the_send_timeout() {
    let fx = Fixture::new();
    let big: Vec<u8> = vec![7u8; 48 << 20];
    std::fs::write(fx.root.join("huge.bin"), &big).unwrap();
    let s = Server::start(&fx, &fx.config("[limits]\nsend_timeout = \"1s\"\n", ""));
    let mut c = tls_connect(s.addr);
    c.write_all(b"GET /huge.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    // Never read: the server's writes stall, then it gives up.
    let text = s.metrics_when(|t| t.contains("tlsgate_timeouts_total{reason=\"send\"} 1"));
    assert!(
        text.contains("tlsgate_timeouts_total{reason=\"send\"} 1"),
        "{text}"
    );
    assert!(text.contains("tlsgate_connections_open 0"), "{text}");
}

#[test]
fn connection_caps_per_source_and_overall() {
    let fx = Fixture::new();
    let top = "[limits]\nmax_connections_per_ip = 5\nmax_connections = 8\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let mut held: Vec<TlsStream> = (0..5)
        .map(|_| tls_from("127.0.0.1", s.addr).unwrap())
        .collect();
    // The sixth from the same source is closed before any TLS.
    let mut sixth = connect_from("127.0.0.1", s.addr).unwrap();
    assert!(
        closed_within(&mut sixth, Duration::from_secs(2)),
        "sixth connection from one source accepted"
    );
    // Another source is still served.
    let mut other = tls_from("127.0.0.2", s.addr).unwrap();
    other
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = other.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    held.push(other);
    held.push(tls_from("127.0.0.3", s.addr).unwrap());
    held.push(tls_from("127.0.0.3", s.addr).unwrap());
    // Eight open: the global cap refuses a ninth from a fresh source.
    let mut ninth = connect_from("127.0.0.4", s.addr).unwrap();
    assert!(
        closed_within(&mut ninth, Duration::from_secs(2)),
        "ninth connection accepted over the cap"
    );
    let text = s.admin_get("/metrics");
    assert!(
        text.contains(r#"tlsgate_connections_rejected_total{reason="max_connections_per_ip"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tlsgate_connections_rejected_total{reason="max_connections"} 1"#),
        "{text}"
    );
    // Closing one frees a slot.
    drop(held.pop());
    std::thread::sleep(Duration::from_millis(200));
    let mut again = tls_from("127.0.0.4", s.addr).unwrap();
    again
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert!(read_to_close(&mut again).starts_with("HTTP/1.1 200"));
}
