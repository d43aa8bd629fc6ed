//! Handshake flood limits with real peers: one source floods handshakes and
//! is throttled at accept (closed before any ServerHello) while another is
//! served throughout; silent connections fill the handshake slots per
//! source and overall, and service comes back when they close or time out;
//! the limits follow a reload and group sources by prefix.
//!
//! Linux routes all of 127.0.0.0/8 to loopback, so binding the client
//! socket to 127.0.0.x gives each peer its own source address.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::ClientConfig;

fn tls_config() -> Arc<ClientConfig> {
    Arc::new(client_config(rustls::DEFAULT_VERSIONS))
}

/// A full handshake from `source` then `GET /hello.txt`; panics unless served.
fn get_hello_from(source: &str, to: SocketAddr, config: &Arc<ClientConfig>) {
    let Attempt::Completed(mut s) = attempt_from(source, to, config).unwrap() else {
        panic!("handshake from {source} refused");
    };
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let answer = read_to_close(&mut s);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with(HELLO),
        "{answer}"
    );
}

fn refused(source: &str, to: SocketAddr, config: &Arc<ClientConfig>) -> bool {
    matches!(attempt_from(source, to, config).unwrap(), Attempt::Refused)
}

fn rejected(s: &Server, reason: &str) -> f64 {
    s.metric(&format!(
        "tlsgate_connections_rejected_total{{reason=\"{reason}\"}}"
    ))
}

/// Waits until the server counts `n` handshakes in progress.
fn wait_in_progress(s: &Server, n: usize) {
    s.expect_metric_line(&format!("tlsgate_handshakes_in_progress {n}\n"));
}

/// Silent TCP connections (no ClientHello) from `sources`, once the server
/// counts each as a handshake in progress.
fn silent_from(s: &Server, sources: &[&str], already: usize) -> Vec<TcpStream> {
    let held: Vec<TcpStream> = sources
        .iter()
        .map(|src| connect_from(src, s.addr).unwrap())
        .collect();
    wait_in_progress(s, already + held.len());
    held
}

#[test]
fn a_flooding_source_is_throttled_while_another_is_served() {
    const RATE: f64 = 20.0;
    const BURST: f64 = 20.0;
    const FLOOD: Duration = Duration::from_secs(3);
    let fx = Fixture::new();
    let top = "[server]\nworkers = 2\n[limits]\nhandshake_rate_per_source = 20\n\
               handshake_burst_per_source = 20\nmax_handshakes_per_source = 64\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let addr = s.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    // Four threads from 127.0.0.2, each starting a new handshake as soon
    // as the last one ended, until FLOOD is over.
    let flooders: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let config = tls_config();
                let (mut completed, mut refused) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match attempt_from("127.0.0.2", addr, &config).unwrap() {
                        Attempt::Refused => refused += 1,
                        Attempt::Completed(_) => completed += 1,
                    }
                }
                (completed, refused)
            })
        })
        .collect();
    // Meanwhile 127.0.0.1 fetches a page ten times a second, each time
    // with a new connection and a full handshake.
    let config = tls_config();
    let mut served = 0;
    let mut slowest = Duration::ZERO;
    while t0.elapsed() < FLOOD {
        let t = Instant::now();
        get_hello_from("127.0.0.1", addr, &config);
        slowest = slowest.max(t.elapsed());
        served += 1;
        std::thread::sleep(Duration::from_millis(100).saturating_sub(t.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut completed, mut refused) = (0, 0);
    for f in flooders {
        let (c, r) = f.join().unwrap();
        completed += c;
        refused += r;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    eprintln!(
        "flood of {elapsed:.2} s: {completed} handshakes completed, {refused} refused; \
         {served} pages served to the other source, slowest in {slowest:?}"
    );
    assert!(served >= 20, "only {served} pages served");
    assert!(
        slowest < Duration::from_secs(2),
        "the other source waited {slowest:?}"
    );
    assert!(refused >= 200, "the flood was too weak to test: {refused}");
    // One bucket for the source, shared by both workers.
    let allowed = BURST + RATE * elapsed;
    assert!(
        (completed as f64) <= allowed + 2.0 && (completed as f64) >= BURST,
        "{completed} handshakes completed; the bucket allows {allowed:.0}"
    );
    // Every refusal was counted under the rate limit, and none of them
    // reached the handshake code: no failures, and only the completed
    // handshakes were accepted as connections.
    let text = s.expect_metric_line(&format!(
        "tlsgate_connections_rejected_total{{reason=\"handshake_rate_per_source\"}} {refused}\n"
    ));
    assert!(
        text.contains(&format!(
            "tlsgate_connections_total {}\n",
            completed + served
        )),
        "{completed} + {served} expected:\n{text}"
    );
    assert!(
        !text.contains("tlsgate_handshake_failures_total{"),
        "{text}"
    );
    assert!(
        text.contains("tlsgate_handshake_sources_tracked 2\n"),
        "{text}"
    );
    // The operator is told, once per 10 s however many were refused: the
    // source, the key and how to raise it.
    let log = s.log();
    let warnings = log
        .matches("connections refused before their handshake by [limits] handshake_rate_per_source")
        .count();
    assert!(
        (1..=1 + (elapsed / 10.0) as usize).contains(&warnings),
        "{warnings} warnings for {refused} refusals in {elapsed:.1} s:\n{log}"
    );
    assert!(
        log.contains("this one from 127.0.0.2") && log.contains("set it to 0 (off)"),
        "{log}"
    );
    // The flooder's bucket refills: after a quiet second it is served again.
    std::thread::sleep(Duration::from_secs(1));
    get_hello_from("127.0.0.2", addr, &config);
}

#[test]
fn silent_connections_are_capped_per_source() {
    let fx = Fixture::new();
    let top = "[limits]\nmax_handshakes_per_source = 3\nhandshake_timeout = \"30s\"\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let config = tls_config();
    let mut held = silent_from(&s, &["127.0.0.2", "127.0.0.2", "127.0.0.2"], 0);
    // The fourth from that source is closed at once, without a ServerHello.
    assert!(refused("127.0.0.2", s.addr, &config));
    let mut fifth = connect_from("127.0.0.2", s.addr).unwrap();
    assert!(closed_within(&mut fifth, Duration::from_secs(2)));
    assert_eq!(rejected(&s, "max_handshakes_per_source"), 2.0);
    s.wait_log(
        "refused before their handshake by [limits] max_handshakes_per_source",
        Duration::from_secs(5),
    );
    // Another source is not affected.
    get_hello_from("127.0.0.1", s.addr, &config);
    // One silent connection gone frees its slot.
    drop(held.pop());
    wait_in_progress(&s, 2);
    get_hello_from("127.0.0.2", s.addr, &config);
    assert_eq!(rejected(&s, "max_handshakes_per_source"), 2.0);
}

#[test]
fn silent_connections_fill_the_global_cap_until_they_close_or_time_out() {
    let fx = Fixture::new();
    let top = "[server]\nworkers = 2\n[limits]\nmax_handshakes_in_progress = 8\n\
               handshake_timeout = \"2s\"\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let config = tls_config();
    let sources: Vec<String> = (10..18).map(|i| format!("127.0.0.{i}")).collect();
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let mut held = silent_from(&s, &sources, 0);
    // Eight silent connections from eight sources hold every slot: new
    // handshakes from anywhere are closed before their ClientHello is read.
    assert!(refused("127.0.0.1", s.addr, &config));
    assert!(refused("127.0.0.3", s.addr, &config));
    assert_eq!(rejected(&s, "max_handshakes_in_progress"), 2.0);
    // Closing two frees two slots.
    held.truncate(6);
    wait_in_progress(&s, 6);
    get_hello_from("127.0.0.1", s.addr, &config);
    // Full again, then the handshake timeout closes them all and service resumes.
    let t = Instant::now();
    held.extend(silent_from(&s, &["127.0.0.20", "127.0.0.21"], 6));
    assert!(refused("127.0.0.1", s.addr, &config));
    assert_eq!(rejected(&s, "max_handshakes_in_progress"), 3.0);
    for c in &mut held {
        assert!(closed_within(c, Duration::from_secs(5)), "still open");
    }
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    wait_in_progress(&s, 0);
    get_hello_from("127.0.0.1", s.addr, &config);
    get_hello_from("127.0.0.3", s.addr, &config);
    let text = s.expect_metric_line("tlsgate_handshake_failures_total{reason=\"timeout\"} 8\n");
    // The refused ones never became connections.
    assert!(text.contains("tlsgate_connections_total 13\n"), "{text}");
}

#[test]
fn handshake_limits_follow_a_reload() {
    let fx = Fixture::new();
    let s = Server::start(
        &fx,
        &fx.config("[limits]\nmax_handshakes_in_progress = 2\n", ""),
    );
    let config = tls_config();
    let _held = silent_from(&s, &["127.0.0.2", "127.0.0.3"], 0);
    assert!(refused("127.0.0.1", s.addr, &config));
    // Off, and a tight rate per source instead.
    fx.write_config(&fx.config(
        "[limits]\nmax_handshakes_in_progress = 0\nhandshake_rate_per_source = 1\n\
         handshake_burst_per_source = 2\n",
        "",
    ));
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    // 127.0.0.1 was refused by the global cap, which took none of its tokens.
    get_hello_from("127.0.0.1", s.addr, &config);
    get_hello_from("127.0.0.1", s.addr, &config);
    assert!(refused("127.0.0.1", s.addr, &config));
    assert_eq!(rejected(&s, "handshake_rate_per_source"), 1.0);
    // A bad value is refused and the running limits stay: had the cap of
    // one applied, the two silent connections would hold it.
    fx.write_config(&fx.config(
        "[limits]\nmax_handshakes_in_progress = 1\nhandshake_burst_per_source = 0\n",
        "",
    ));
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    assert!(s.log().contains("limits.handshake_burst_per_source"));
    get_hello_from("127.0.0.3", s.addr, &config);
}

#[test]
fn ipv4_sources_are_grouped_by_the_configured_prefix() {
    let fx = Fixture::new();
    let top = "[limits]\nhandshake_rate_per_source = 1\nhandshake_burst_per_source = 2\n\
               source_prefix_v4 = 24\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    let config = tls_config();
    get_hello_from("127.0.1.2", s.addr, &config);
    get_hello_from("127.0.1.3", s.addr, &config);
    // Same /24: the bucket is shared and empty.
    assert!(refused("127.0.1.4", s.addr, &config));
    // Another /24 has its own.
    get_hello_from("127.0.2.1", s.addr, &config);
    assert_eq!(rejected(&s, "handshake_rate_per_source"), 1.0);
}
