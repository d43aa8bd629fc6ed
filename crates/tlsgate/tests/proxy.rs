//! The reverse proxy with real upstreams started here: HTTP/1.1 servers
//! of the test's own (plain and TLS, with and without client
//! certificates, well-behaved and malicious) and Python's http.server as
//! a peer not written in Rust (both in common/upstream.rs). The client
//! side is curl and rustls.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::upstream::{
    body_text, get, make_leaf, pattern, pool, read_response, route, routes, start,
    start_early_answering, upstream_tls, Python, Upstream, NO_RATE_LIMIT,
};
use common::{tls_connect, Fixture, Server, TlsStream, HELLO};

/// Clients requesting `/id` in a loop until stopped, half of them on a
/// new connection per request.
struct Loop {
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Loop {
    fn start(addr: SocketAddr, clients: usize) -> Loop {
        let (stop, failures, seen) = (
            Arc::<AtomicBool>::default(),
            Arc::<AtomicUsize>::default(),
            Arc::<Mutex<Vec<String>>>::default(),
        );
        let threads = (0..clients)
            .map(|i| {
                let (stop, failures, seen) = (stop.clone(), failures.clone(), seen.clone());
                std::thread::spawn(move || {
                    let mut s = tls_connect(addr);
                    while !stop.load(Ordering::Relaxed) {
                        if i % 2 == 1 {
                            s = tls_connect(addr);
                        }
                        match get(&mut s, "/id", "") {
                            Ok(r) if r.status == 200 => {
                                seen.lock().unwrap().push(body_text(&r));
                                if r.head.contains("Connection: close\r\n") {
                                    s = tls_connect(addr);
                                }
                            }
                            other => {
                                eprintln!(
                                    "failed: client {i} at {:?}: {:?}",
                                    std::time::SystemTime::now(),
                                    other.map(|r| r.head)
                                );
                                failures.fetch_add(1, Ordering::Relaxed);
                                s = tls_connect(addr);
                            }
                        }
                    }
                })
            })
            .collect();
        Loop {
            stop,
            failures,
            seen,
            threads,
        }
    }

    /// Stops the clients: (failed requests, answers in order).
    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        (self.failures.load(Ordering::Relaxed), seen)
    }
}

fn count_ids(server: &Server, path: &str, n: usize) -> HashMap<String, usize> {
    let mut s = tls_connect(server.addr);
    let mut seen = HashMap::new();
    for _ in 0..n {
        let r = get(&mut s, path, "").unwrap();
        assert_eq!(r.status, 200, "{}", r.head);
        *seen.entry(body_text(&r)).or_insert(0) += 1;
    }
    seen
}

// ---------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------

#[test]
fn requests_are_balanced_as_configured_over_rust_and_python_upstreams() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let py = Python::start(&fx.path().join("py"), "py");
    let three = vec![(a.address(), 1), (b.address(), 1), (py.addr.to_string(), 1)];
    let pools = [
        pool("rr", &three, "", ""),
        pool(
            "weighted",
            &[(a.address(), 3), (b.address(), 1)],
            "balance = \"weighted\"",
            "",
        ),
        pool(
            "lc",
            &[(a.address(), 1), (b.address(), 1)],
            "balance = \"least_connections\"",
            "",
        ),
        pool(
            "hash",
            &three,
            "balance = \"hash\"\nhash_key = \"header:X-User\"",
            "",
        ),
    ]
    .concat();
    let routes = routes(&[
        ("/id", "rr"),
        ("/w", "weighted"),
        ("/lc", "lc"),
        ("/slow", "lc"),
        ("/h", "hash"),
    ]);
    let server = start(&fx, "", &pools, &routes);
    let counts = || {
        (
            a.requests.load(Ordering::Relaxed),
            b.requests.load(Ordering::Relaxed),
        )
    };

    let rr = count_ids(&server, "/id", 300);
    assert_eq!(rr.get("a"), Some(&100), "{rr:?}");
    assert_eq!(rr.get("b"), Some(&100), "{rr:?}");
    assert_eq!(rr.get("py"), Some(&100), "{rr:?}");

    // The test upstreams answer /w and /lc with 404; their counters tell.
    let mut s = tls_connect(server.addr);
    for _ in 0..400 {
        assert_eq!(get(&mut s, "/w", "").unwrap().status, 404);
    }
    assert_eq!(counts(), (100 + 300, 100 + 100), "weighted 3:1");

    let before = counts();
    for _ in 0..100 {
        assert_eq!(get(&mut s, "/lc", "").unwrap().status, 404);
    }
    let after = counts();
    assert!(
        after.0 > before.0 && after.1 > before.1 && after.0 + after.1 == before.0 + before.1 + 100,
        "least connections uses both: {before:?} {after:?}"
    );
    // While one server holds a slow request, the other takes every new one.
    let addr = server.addr;
    let slow = std::thread::spawn(move || get(&mut tls_connect(addr), "/slow", "").unwrap().status);
    let deadline = Instant::now() + Duration::from_secs(2);
    while counts().0 + counts().1 == after.0 + after.1 {
        assert!(Instant::now() < deadline, "the slow request never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    let holding = counts();
    for _ in 0..10 {
        assert_eq!(get(&mut s, "/lc", "").unwrap().status, 404);
    }
    let now = counts();
    let a_holds = holding.0 > after.0;
    assert_eq!(
        if a_holds {
            (now.0 - holding.0, now.1 - holding.1)
        } else {
            (now.1 - holding.1, now.0 - holding.0)
        },
        (0, 10),
        "least connections: all to the idle server ({holding:?} then {now:?})"
    );
    assert_eq!(slow.join().unwrap(), 200);

    // Hash: one user always lands on one server; users spread.
    let mut placed: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for user in 0..30 {
            let was = counts();
            let r = get(&mut s, "/h", &format!("X-User: user-{user}\r\n")).unwrap();
            let now = counts();
            let on = if now.0 > was.0 {
                "a"
            } else if now.1 > was.1 {
                "b"
            } else {
                assert_eq!(r.status, 404, "python answers /h with 404");
                "py"
            };
            let prev = placed
                .entry(format!("user-{user}"))
                .or_insert_with(|| on.into());
            assert_eq!(prev, on, "user-{user} moved in round {round}");
        }
    }
    let distinct: std::collections::HashSet<&String> = placed.values().collect();
    assert!(distinct.len() >= 2, "{placed:?}");

    let m = server.admin_get("/metrics");
    assert!(
        m.contains(&format!(
            "tlsgate_upstream_requests_total{{pool=\"rr\",server=\"{}\"}} 100",
            a.address()
        )),
        "{m}"
    );
    assert!(m.contains("tlsgate_upstream_healthy{pool=\"rr\""), "{m}");
    assert!(
        m.contains("tlsgate_upstream_response_seconds_bucket{"),
        "{m}"
    );
    assert!(server
        .access_log()
        .contains(&format!("upstream={}", py.addr)));
}

#[test]
fn a_killed_upstream_fails_no_idempotent_request() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let c = Upstream::start("c", None);
    let servers = vec![(a.address(), 1), (b.address(), 1), (c.address(), 1)];
    let pools = pool(
        "app",
        &servers,
        "retries = 2\nconnect_timeout = \"1s\"\nmax_fails = 1\nfail_timeout = \"30s\"",
        "[upstream.health_check]\npath = \"/health\"\ninterval = \"1s\"\ntimeout = \"500ms\"\nfall = 1\nrise = 1\n",
    );
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let clients = Loop::start(server.addr, 4);
    std::thread::sleep(Duration::from_millis(700));
    // Checks 1 s apart: requests meet the killed server before a check
    // can take it out (with checks 100 ms apart one run in many saw no
    // request fail on it, nothing to retry), and its first failure takes
    // it out (max_fails = 1).
    a.kill();
    std::thread::sleep(Duration::from_millis(700));
    // A server that still accepts but fails its health check goes too,
    // within a check's interval and timeout.
    b.healthy.store(false, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1700));
    let b_before = b.requests.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let (failures, seen) = clients.finish();
    assert_eq!(failures, 0, "{}", server.log());
    assert!(seen.len() > 200, "{}", seen.len());
    // Out of service: only health checks reach b now.
    let b_after = b.requests.load(Ordering::Relaxed);
    assert!(
        b_after - b_before <= 10,
        "b still served {} requests",
        b_after - b_before
    );
    let m = server.expect_metric_line(&format!(
        "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 0",
        a.address()
    ));
    assert!(
        m.contains(&format!(
            "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 0",
            b.address()
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 1",
            c.address()
        )),
        "{m}"
    );
    // The tries that failed on the killed server were made again, and
    // counted against it; none failed on c.
    let retried = |u: &Upstream| {
        server.metric(&format!(
            "tlsgate_upstream_retries_total{{pool=\"app\",server=\"{}\"}}",
            u.address()
        ))
    };
    assert!(retried(&a) >= 1.0, "{m}");
    assert_eq!(retried(&c), 0.0, "{m}");
    server.wait_log("upstream server out of service", Duration::from_secs(2));
}

#[test]
fn a_slow_upstream_is_answered_504_at_the_timeout() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("slow", &[(a.address(), 1)], "response_timeout = \"1s\"", "");
    let server = start(&fx, "", &pools, &route("/", "slow", ""));
    let mut s = tls_connect(server.addr);
    let t0 = Instant::now();
    let r = get(&mut s, "/slow", "").unwrap();
    let took = t0.elapsed();
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    // The connection stays usable (the request had no body).
    assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
    server.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"slow\",status=\"504\",reason=\"response_timeout\"} 1",
    );
    server.wait_access_line(&["upstream_error=response_timeout"]);
}

/// Passive marks never leave a pool with no server: a lone server that
/// timed out `max_fails` times in a row still gets the next request (it
/// got 503 for the whole `fail_timeout` before), and a passing health
/// check ends a mark at once.
#[test]
fn passive_marks_never_empty_a_pool_and_a_passing_check_ends_them() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let marks = "response_timeout = \"300ms\"\nmax_fails = 1\nfail_timeout = \"60s\"";
    let lone = pool("lone", &[(a.address(), 1)], marks, "");
    let server = start(&fx, "", &lone, &route("/", "lone", ""));
    let mut s = tls_connect(server.addr);
    assert_eq!(get(&mut s, "/slow", "").unwrap().status, 504);
    // Marked out: the gauge says so, and the next request still goes.
    server.expect_metric_line(&format!(
        "tlsgate_upstream_healthy{{pool=\"lone\",server=\"{}\"}} 0",
        a.address()
    ));
    let r = get(&mut s, "/id", "").unwrap();
    assert_eq!(
        (r.status, body_text(&r)),
        (200, "a".to_string()),
        "{}",
        r.head
    );
    drop(server);

    // A pair: one of them marked for 60 s, back once its check passes.
    let fx = Fixture::new();
    let pair = pool(
        "pair",
        &[(a.address(), 1), (b.address(), 1)],
        marks,
        "[upstream.health_check]\npath = \"/health\"\ninterval = \"100ms\"\nrise = 1\n",
    );
    let server = start(&fx, "", &pair, &route("/", "pair", ""));
    let mut s = tls_connect(server.addr);
    assert_eq!(get(&mut s, "/slow", "").unwrap().status, 504);
    std::thread::sleep(Duration::from_millis(600));
    let seen = count_ids(&server, "/id", 10);
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// `total_timeout` bounds the upload too: a client that sends part of its
/// body and stalls gets 408 when the total passes, not at `body_timeout`.
#[test]
fn total_timeout_bounds_a_stalled_upload() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "total_timeout = \"1s\"", "");
    // body_timeout stays at its 30 s default.
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let t0 = Instant::now();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n0123456789")
        .unwrap();
    s.flush().unwrap();
    let answer = common::read_to_close(&mut s);
    let took = t0.elapsed();
    assert_eq!(common::statuses(&answer), [408], "{answer}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    server.wait_access_line(&["\" 408 ", "upstream_error=total_timeout"]);
}

/// A total timeout that passes while the body is relayed cuts the
/// answer, and is counted, but puts no server out of service: the
/// exchange's time also runs while the client takes the body, so clients
/// reading slowly (several at once, on purpose) could otherwise take a
/// pool's servers out one by one. Slow servers are caught by
/// `response_timeout` and `idle_timeout`, which mark them.
#[test]
fn a_total_timeout_mid_body_puts_no_server_out() {
    let fx = Fixture::new();
    let (a, b, server) = pair(&fx, "total_timeout = \"1s\"\nmax_fails = 1");
    for _ in 0..2 {
        let answer = common::raw_exchange(server.addr, b"GET /drip HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(!answer.ends_with("0\r\n\r\n"), "not cut: {answer}");
    }
    server.wait_access_line(&["upstream_error=total_timeout"]);
    // Counted (against whichever servers the two went to)...
    let counted = |t: &str| -> u64 {
        t.lines()
            .filter(|l| {
                l.starts_with("tlsgate_upstream_errors_total{")
                    && l.contains("kind=\"total_timeout\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let text = server.metrics_when(|t| counted(t) >= 2);
    assert_eq!(counted(&text), 2, "{text}");
    // ...and no server out.
    in_service(&server, [&a, &b]);
}

/// Upstreams `a` and `b` in pool `app` (with `keys`), which takes every
/// request.
fn pair(fx: &Fixture, keys: &str) -> (Upstream, Upstream, Server) {
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let pools = pool("app", &[(a.address(), 1), (b.address(), 1)], keys, "");
    let server = start(fx, "", &pools, &route("/", "app", ""));
    (a, b, server)
}

/// Pool `app`'s servers `ups` are in service, as the gauge says.
fn in_service(server: &Server, ups: [&Upstream; 2]) {
    for up in ups {
        server.expect_metric_line(&format!(
            "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 1\n",
            up.address()
        ));
    }
}

/// `total_timeout` is the whole exchange's bound even when the upstream
/// has sent everything and only the client is slow to take it: every
/// read of the upstream is then ready at once, and the time goes into
/// writes to the client. Over HTTP/1.1 (a Content-Length body and a
/// chunked one) and over HTTP/2, the exchange ends at the timeout (its
/// access line is written then, short of the body), is counted, and puts
/// no server out. What the kernel already holds still reaches the
/// client after the cut, so its own download ends later.
#[test]
fn total_timeout_cuts_a_download_to_a_slow_reader() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool(
        "app",
        &[(a.address(), 1)],
        "total_timeout = \"2s\"\nmax_fails = 1",
        "",
    );
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    // Far more than the loopback's socket buffers take from a reader this
    // slow, so the server's writes wait on it. Each case its own size, to
    // tell their access lines apart.
    const SIZE: usize = 48 << 20;
    let resolve = format!("localhost:{}:127.0.0.1", server.addr.port());
    for (i, (path, protocol)) in [
        ("/len", "--http1.1"),
        ("/gen", "--http1.1"),
        ("/len", "--http2"),
    ]
    .into_iter()
    .enumerate()
    {
        let target = format!("{path}?n={}", SIZE + i);
        let t0 = Instant::now();
        let mut curl = Command::new("curl")
            .args([
                "-sSk",
                protocol,
                "--limit-rate",
                "200k",
                "--resolve",
                &resolve,
            ])
            .args(["--max-time", "30", "-o", "/dev/null", &server.url(&target)])
            .spawn()
            .expect("curl must be installed (./dev setup installs it)");
        let line =
            server.wait_access_line(&[&format!("GET {target} "), "upstream_error=total_timeout"]);
        let took = t0.elapsed();
        let _ = curl.kill();
        let _ = curl.wait();
        let case = format!("{path} {protocol} after {took:?}: {line}");
        assert!(took < Duration::from_secs(4), "{case}");
        let bytes: usize = line
            .split("\" ")
            .nth(1)
            .and_then(|rest| rest.split(' ').nth(1))
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("no byte count: {case}"));
        assert!(bytes > 0 && bytes < SIZE, "{case}");
    }
    let counted = |t: &str| {
        t.lines().any(|l| {
            l.starts_with("tlsgate_upstream_errors_total{")
                && l.contains("kind=\"total_timeout\"")
                && l.ends_with(" 3")
        })
    };
    let text = server.metrics_when(counted);
    assert!(counted(&text), "{text}");
    server.expect_metric_line(&format!(
        "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 1\n",
        a.address()
    ));
}

#[test]
fn upstream_tls_with_and_without_client_certificates_and_a_wrong_ca() {
    let fx = Fixture::new();
    let dir = fx.path();
    let ca = common::make_ca("upstream CA");
    let other = common::make_ca("someone else's CA");
    let ca_pem = dir.join("up-ca.pem");
    std::fs::write(&ca_pem, ca.0.pem()).unwrap();
    let other_pem = dir.join("other-ca.pem");
    std::fs::write(&other_pem, other.0.pem()).unwrap();
    let (srv_cert, srv_key, _, _) =
        make_leaf(dir, "upstream", &["app.internal", "127.0.0.1"], false, &ca);
    let (_, _, client_crt, client_key) =
        make_leaf(dir, "tlsgate-client", &["tlsgate.internal"], true, &ca);
    let plain_tls = Upstream::start("tls", Some(upstream_tls(&srv_cert, &srv_key, None)));
    let mtls = Upstream::start("mtls", Some(upstream_tls(&srv_cert, &srv_key, Some(&ca.0))));
    let tls_keys = |ca: &Path| format!("tls = true\nca = {ca:?}\nsni = \"app.internal\"");
    let with_cert = format!(
        "{}\nclient_cert = {client_crt:?}\nclient_key = {client_key:?}",
        tls_keys(&ca_pem)
    );
    let pools = [
        pool("tls", &[(plain_tls.address(), 1)], &tls_keys(&ca_pem), ""),
        pool("mtls", &[(mtls.address(), 1)], &with_cert, ""),
        pool(
            "nocert",
            &[(mtls.address(), 1)],
            &format!("{}\nretries = 0", tls_keys(&ca_pem)),
            "",
        ),
        pool(
            "wrongca",
            &[(plain_tls.address(), 1)],
            &format!("tls = true\nca = {other_pem:?}\nsni = \"app.internal\"\nretries = 0"),
            "",
        ),
        // No idle connections: a TLS handshake per request.
        pool(
            "resume",
            &[(plain_tls.address(), 1)],
            &format!("{}\nmax_idle = 0", tls_keys(&ca_pem)),
            "",
        ),
        pool(
            "fresh",
            &[(plain_tls.address(), 1)],
            &format!(
                "{}\nmax_idle = 0\nsession_resumption = false",
                tls_keys(&ca_pem)
            ),
            "",
        ),
    ]
    .concat();
    let routes = routes(&[
        ("/resume", "resume"),
        ("/fresh", "fresh"),
        ("/tls", "tls"),
        ("/mtls", "mtls"),
        ("/nocert", "nocert"),
        ("/wrongca", "wrongca"),
    ]);
    let server = start(&fx, "", &pools, &routes);
    let mut s = tls_connect(server.addr);
    let r = get(&mut s, "/tls", "").unwrap();
    assert_eq!(r.status, 404, "the TLS upstream answered: {}", r.head);
    assert_eq!(plain_tls.requests.load(Ordering::Relaxed), 1);
    let r = get(&mut s, "/mtls", "").unwrap();
    assert_eq!(r.status, 404, "the mTLS upstream answered: {}", r.head);
    assert_eq!(mtls.requests.load(Ordering::Relaxed), 1);
    let r = get(&mut s, "/nocert", "").unwrap();
    assert_eq!(r.status, 502, "{}", r.head);
    let r = get(&mut s, "/wrongca", "").unwrap();
    assert_eq!(r.status, 502, "{}", r.head);
    assert_eq!(
        plain_tls.requests.load(Ordering::Relaxed),
        1,
        "no request over an unverified connection"
    );
    server.wait_log("upstream TLS handshake failed", Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.access_log().matches("upstream_error=tls").count() < 1 {
        assert!(Instant::now() < deadline, "{}", server.access_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    server.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"wrongca\",status=\"502\",reason=\"tls\"} 1",
    );
    // Keep-alive to the upstream: more requests, no more connections.
    for _ in 0..5 {
        assert_eq!(get(&mut s, "/tls", "").unwrap().status, 404);
    }
    assert_eq!(
        plain_tls.conns.load(Ordering::Relaxed),
        2,
        "one connection, and the refused handshake"
    );
    // Session resumption to the upstream: on by default, off when asked.
    let resumed = || plain_tls.resumed.load(Ordering::Relaxed);
    assert_eq!(resumed(), 0);
    for _ in 0..4 {
        assert_eq!(get(&mut s, "/resume", "").unwrap().status, 404);
    }
    let conns = plain_tls.conns.load(Ordering::Relaxed);
    assert_eq!(conns, 2 + 4, "a new connection per request");
    assert!(resumed() >= 3, "{} of 4 handshakes resumed", resumed());
    let before = resumed();
    for _ in 0..3 {
        assert_eq!(get(&mut s, "/fresh", "").unwrap().status, 404);
    }
    assert_eq!(plain_tls.conns.load(Ordering::Relaxed), conns + 3);
    assert_eq!(resumed(), before, "session_resumption = false resumed");
}

/// curl through the proxy: `args` added, output to `out`.
fn curl_to(server: &Server, args: &[&str], out: &Path) -> String {
    let mut all: Vec<&str> = vec![
        "-o",
        out.to_str().unwrap(),
        "-w",
        "%{http_code}",
        "--max-time",
        "120",
    ];
    all.extend_from_slice(args);
    let o = server.curl(&all);
    assert!(
        o.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn chunked_uploads_and_downloads_are_byte_exact_up_to_100_mib() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("bulk", &[(a.address(), 1)], "", "");
    let server = start(
        &fx,
        "",
        &pools,
        &route("/", "bulk", "max_body_bytes = 209715200"),
    );
    for n in [0usize, 1, 1 << 20, 100 << 20] {
        let data = pattern(n);
        let input = fx.path().join(format!("in-{n}"));
        std::fs::write(&input, &data).unwrap();
        let out = fx.path().join(format!("out-{n}"));
        let upload = format!("@{}", input.display());
        let echo = server.url("/echo");
        let gen = server.url(&format!("/gen?n={n}"));
        let ways: [(&str, Vec<&str>); 3] = [
            // Chunked upload; the echo comes back chunked.
            (
                "chunked upload",
                vec![
                    "-H",
                    "Transfer-Encoding: chunked",
                    "--data-binary",
                    &upload,
                    &echo,
                ],
            ),
            (
                "upload with Content-Length",
                vec!["--data-binary", &upload, &echo],
            ),
            ("chunked download", vec![&gen]),
        ];
        for (what, args) in ways {
            assert_eq!(curl_to(&server, &args, &out), "200", "{what} of {n} bytes");
            assert!(
                std::fs::read(&out).unwrap() == data,
                "{what} of {n} bytes differs"
            );
        }
    }
    // Above the route's limit: 413 before the upstream sees it.
    let before = a.requests.load(Ordering::Relaxed);
    let mut s = tls_connect(server.addr);
    write!(
        s,
        "POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 209715201\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut s, false).unwrap().status, 413);
    assert_eq!(a.requests.load(Ordering::Relaxed), before);
}

#[test]
fn an_upstream_that_answers_before_the_body_ends_is_relayed_at_once() {
    let fx = Fixture::new();
    let (a, server) = start_early_answering(&fx);
    // Far more than the socket buffers between the proxy and the upstream.
    let input = fx.path().join("upload");
    std::fs::write(&input, pattern(64 << 20)).unwrap();
    let upload = format!("@{}", input.display());
    let out = fx.path().join("answer");
    for (what, extra) in [
        ("Content-Length", None),
        ("chunked", Some("Transfer-Encoding: chunked")),
    ] {
        let t0 = Instant::now();
        let url = server.url("/early");
        let mut args = vec!["-o", out.to_str().unwrap(), "-w", "%{http_code}"];
        args.extend(["--data-binary", &upload]);
        if let Some(h) = extra {
            args.extend(["-H", h]);
        }
        args.push(&url);
        let o = server.curl(&args);
        let took = t0.elapsed();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "413", "{what}: {o:?}");
        assert_eq!(std::fs::read(&out).unwrap(), b"too big!", "{what}");
        assert!(took < Duration::from_secs(10), "{what}: took {took:?}");
    }
    // Those upstream connections were not reused: the next request gets
    // its answer on a fresh one.
    let conns = a.conns.load(Ordering::Relaxed);
    let mut s = tls_connect(server.addr);
    let r = get(&mut s, "/id", "").unwrap();
    assert_eq!((r.status, body_text(&r).as_str()), (200, "a"));
    assert_eq!(a.conns.load(Ordering::Relaxed), conns + 1);
    a.kill();
}

#[test]
fn a_server_name_that_resolves_anew_gets_the_new_connections() {
    // The name lives in an /etc/hosts of tlsgate's own: a private mount
    // namespace (root, as the XDP tests) with a file the test rewrites.
    let fx = Fixture::new();
    let a = Upstream::start_at("a", "127.0.0.2:0", None);
    let port = a.addr.port();
    let b = Upstream::start_at("b", &format!("127.0.0.3:{port}"), None);
    let hosts = fx.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.2 app.upstream.test\n").unwrap();
    let address = format!("app.upstream.test:{port}");
    let pools = pool(
        "app",
        &[(address.clone(), 1)],
        "resolve_interval = \"200ms\"",
        "",
    );
    let top = format!("[server]\nworkers = 2\n{NO_RATE_LIMIT}\n{pools}");
    let config = fx.write_config(&fx.config(&top, &route("/", "app", "")));
    let server = Server::spawn_under(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
            hosts.to_str().unwrap(),
        ],
        &["serve", "--config", config.to_str().unwrap()],
    );
    let mut s = tls_connect(server.addr);
    let id = |s: &mut TlsStream| body_text(&get(s, "/id", "").unwrap());
    assert_eq!(id(&mut s), "a");
    // The record changes: new requests reach b, on the same client
    // connection (the idle upstream connection to a is let go).
    std::fs::write(&hosts, "127.0.0.3 app.upstream.test\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while id(&mut s) != "b" {
        assert!(Instant::now() < deadline, "still served by a");
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..20 {
        assert_eq!(id(&mut s), "b");
    }
    let changed = format!(
        "tlsgate_upstream_resolutions_total{{pool=\"app\",server=\"{address}\",result=\"changed\"}} 1\n"
    );
    server.expect_metric_line(&changed);
    // The name stops resolving: the last address is kept.
    std::fs::write(&hosts, "127.0.0.9 elsewhere.test\n").unwrap();
    let failed = format!(
        "tlsgate_upstream_resolutions_total{{pool=\"app\",server=\"{address}\",result=\"failed\"}}"
    );
    let text = server.metrics_when(|t| t.contains(&failed));
    assert!(text.contains(&failed), "{text}");
    assert_eq!(id(&mut s), "b");
    assert!(
        server
            .log()
            .contains("cannot resolve the upstream server's name"),
        "{}",
        server.log()
    );
    a.kill();
    b.kill();
}

#[test]
fn smuggling_shaped_requests_never_reach_the_upstream() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let cases: &[&[u8]] = &[
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /id HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
        b"GET /id HTTP/1.1\nHost: a\n\n",
        b"GET /id HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
        b"GET /id HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
        b"GET /id HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /id HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nGET /id HTTP/1.1\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        // CONNECT is refused, and what follows it (a body, or the tunnel's
        // first bytes) is not read as a request.
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nContent-Length: 29\r\n\r\nGET /id HTTP/1.1\r\nHost: a\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /id HTTP/1.1\r\nHost: a\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\nGET /id HTTP/1.1\r\nHost: a\r\n\r\n",
    ];
    for case in cases {
        let answer = common::raw_exchange(server.addr, case);
        let status = common::statuses(&answer);
        assert!(
            status.first().is_some_and(|s| (400..=501).contains(s)) && status.len() == 1,
            "{:?} got {answer:?}",
            String::from_utf8_lossy(case)
        );
        assert_eq!(
            a.requests.load(Ordering::Relaxed),
            0,
            "{:?} reached the upstream",
            String::from_utf8_lossy(case)
        );
    }
}

/// A Host no DNS name or IP literal could be (RFC 3986's reg-name takes
/// `,` `;` `=` `%`…) is refused: tlsgate would route and pick the client
/// certificate policy on the whole string, while a backend reading the
/// list-valued `X-Forwarded-Host` takes one element of it (Rack the last).
#[test]
fn a_host_that_names_no_server_is_400_and_reaches_no_upstream() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    for host in [
        "localhost,evil.example",
        "a;for=6.6.6.6",
        "a=b",
        "a%2Cevil.example",
        "a~b:443",
        "a!b",
    ] {
        for request in [
            format!("GET /headers HTTP/1.1\r\nHost: {host}\r\n\r\n"),
            format!("GET http://{host}/headers HTTP/1.1\r\nHost: a\r\n\r\n"),
        ] {
            let answer = common::raw_exchange(server.addr, request.as_bytes());
            assert_eq!(common::statuses(&answer), [400], "{request:?}: {answer}");
        }
    }
    assert_eq!(a.requests.load(Ordering::Relaxed), 0);
    let answer = common::raw_exchange(
        server.addr,
        b"GET /headers HTTP/1.1\r\nHost: _a-1.app.test:8443\r\nConnection: close\r\n\r\n",
    );
    assert!(
        answer.contains("X-Forwarded-Host: _a-1.app.test:8443\r\n"),
        "{answer}"
    );
}

/// Dot-segments (`..`, also as `%2e%2e`) and repeated slashes cannot lead
/// a request around its route: routes match the normalised path, the
/// upstream gets that same path, and a path climbing above `/` is 400.
#[test]
fn dot_segments_cannot_lead_a_request_around_its_route() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/id", "app", ""));
    let exchange = |target: &str| {
        let req = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        common::raw_exchange(server.addr, req.as_bytes())
    };
    // Out of the route: the listener's own files, never the upstream.
    for target in [
        "/id/../hello.txt",
        "/id/%2e%2E/hello.txt",
        "/id/x/../../hello.txt",
    ] {
        let answer = exchange(target);
        assert_eq!(common::statuses(&answer), [200], "{target}: {answer}");
        assert!(answer.ends_with(HELLO), "{target}: {answer}");
    }
    assert_eq!(a.requests.load(Ordering::Relaxed), 0);
    // Into the route: forwarded with the path it was routed by.
    for (target, upstream_sees) in [
        ("/x/../id", "GET /id HTTP/1.1"),
        ("//id", "GET /id HTTP/1.1"),
        ("/./id?q=/../x", "GET /id?q=/../x HTTP/1.1"),
        ("/%69d", "GET /id HTTP/1.1"),
    ] {
        let answer = exchange(target);
        assert_eq!(common::statuses(&answer), [200], "{target}: {answer}");
        assert!(answer.ends_with("\r\n\r\na"), "{target}: {answer}");
        let head = a.last_head.lock().unwrap().clone();
        assert!(head.starts_with(upstream_sees), "{target}: {head}");
    }
    // Taken by the route for what Tomcat reads (`;params` dropped),
    // forwarded as sent: the test upstream answers 404 to `/id;v=1`.
    let answer = exchange("/id;v=1");
    assert_eq!(common::statuses(&answer), [404], "{answer}");
    assert!(a
        .last_head
        .lock()
        .unwrap()
        .starts_with("GET /id;v=1 HTTP/1.1"));
    // Paths its readers could disagree on: 400, whatever the route.
    let before = a.requests.load(Ordering::Relaxed);
    for target in [
        "/id%2f..%2fhello.txt",
        "/x%2F..%2Fid",
        "/x\\..\\id",
        "/x/..;/id",
        "/id/..;/hello.txt",
        // A `..` after a segment of `;params` alone (found by fuzz/'s
        // proxy_path): Tomcat's `..` would remove `hello.txt`, others' `;`.
        "/hello.txt/;/../id",
        "/id/;x/../hello.txt",
        "/x/%2%65%2%65/id",
        "/id/../../etc/passwd",
    ] {
        let answer = exchange(target);
        assert_eq!(common::statuses(&answer), [400], "{target}: {answer}");
    }
    assert_eq!(a.requests.load(Ordering::Relaxed), before);
    // Over h2, the same: curl sends the path as it is given.
    let h2 = Command::new("curl")
        .args(["-sS", "-k", "--http2", "--path-as-is", "--max-time", "20"])
        .arg(format!("https://127.0.0.1:{}/x/../id", server.addr.port()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&h2.stdout), "a", "{h2:?}");
    assert!(a.last_head.lock().unwrap().starts_with("GET /id HTTP/1.1"));
    let h2 = Command::new("curl")
        .args(["-sS", "-k", "--http2", "--path-as-is", "--max-time", "20"])
        .args(["-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!(
            "https://127.0.0.1:{}/id/../../x",
            server.addr.port()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&h2.stdout), "400", "{h2:?}");
    assert_eq!(a.requests.load(Ordering::Relaxed), before + 1);
}

/// tlsgate proxying everything to upstream `a` (never marked out), and a
/// client connection that has had one answer from it.
fn one_server_never_marked() -> (Fixture, Upstream, Server, TlsStream) {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "max_fails = 0", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
    (fx, a, server, s)
}

#[test]
fn smuggling_shaped_responses_are_refused_and_their_connections_dropped() {
    let (_fx, a, server, mut s) = one_server_never_marked();
    for bad in [
        "/bad/clte",
        "/bad/dupcl",
        "/bad/lf",
        "/bad/cr",
        "/bad/nul",
        "/bad/te",
        "/bad/gzipte",
        "/bad/fold",
        "/bad/204body",
    ] {
        let conns = a.conns.load(Ordering::Relaxed);
        let r = get(&mut s, bad, "").unwrap();
        assert_eq!(r.status, 502, "{bad}: {}", r.head);
        assert!(!r.head.contains("X-Evil"), "{bad}: {}", r.head);
        // The next request needs a new upstream connection.
        assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
        assert_eq!(
            a.conns.load(Ordering::Relaxed),
            conns + 1,
            "{bad}: connection reused"
        );
    }
    // Bytes after a complete response: the response is relayed, the
    // surplus never, and the connection is not reused.
    let conns = a.conns.load(Ordering::Relaxed);
    let r = get(&mut s, "/bad/extra", "").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    let r = get(&mut s, "/id", "").unwrap();
    assert_eq!(body_text(&r), "a");
    assert_eq!(a.conns.load(Ordering::Relaxed), conns + 1);
    // Past a body the proxy reads in more than one piece (the last read
    // may take a byte more than the body, to learn the socket is drained).
    let conns = a.conns.load(Ordering::Relaxed);
    let r = get(&mut s, "/bad/extra-big", "").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body == pattern(65_536), "{} body bytes", r.body.len());
    let r = get(&mut s, "/id", "").unwrap();
    assert_eq!(body_text(&r), "a");
    assert_eq!(a.conns.load(Ordering::Relaxed), conns + 1);
    // Bytes after a response that has no body, whatever its head says: a
    // 304 with a Content-Length, and the upstream's answer to a HEAD (the
    // test upstream sends /id's body even then).
    for (request, status) in [
        ("GET /bad/304extra HTTP/1.1\r\nHost: a\r\n\r\n", 304),
        ("HEAD /id HTTP/1.1\r\nHost: a\r\n\r\n", 200),
    ] {
        bodiless_then_the_next_request(&mut s, &a, request, status);
    }
    // Interim answers are skipped; the final one is relayed, alone.
    let r = get(&mut s, "/interim", "").unwrap();
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"ok"[..]),
        "{}",
        r.head
    );
    assert!(
        !r.head.contains("Early") && !r.head.contains("Link"),
        "{}",
        r.head
    );
    assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
    server.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"app\",status=\"502\",reason=\"bad_response\"} 9",
    );
}

/// A malformed answer is the application's answer to that request, not a
/// failing server: any client that can ask for one (here a head over the
/// 64 KiB limit) would otherwise take every server out in turn. It is
/// still a 502, logged and counted, and its connection is not reused.
#[test]
fn malformed_answers_put_no_server_out() {
    let fx = Fixture::new();
    let (a, b, server) = pair(&fx, "max_fails = 1\nfail_timeout = \"60s\"");
    let mut s = tls_connect(server.addr);
    // Round-robin: each server gives two of them, twice max_fails.
    for _ in 0..4 {
        let r = get(&mut s, "/bad/bighead", "").unwrap();
        assert_eq!(r.status, 502, "{}", r.head);
        assert!(!r.head.contains("X-Big"), "{}", r.head);
    }
    server.wait_access_line(&["\" 502 ", "upstream_error=bad_response"]);
    server.expect_metric_line(
        "tlsgate_proxy_errors_total{pool=\"app\",status=\"502\",reason=\"bad_response\"} 4",
    );
    for up in [&a, &b] {
        server.expect_metric_line(&format!(
            "tlsgate_upstream_errors_total{{pool=\"app\",server=\"{}\",kind=\"bad_response\"}} 2\n",
            up.address()
        ));
    }
    in_service(&server, [&a, &b]);
    // Each refused answer cost its connection: four, and two more for
    // the next two requests, which both servers answer.
    let seen = count_ids(&server, "/id", 2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    let conns = a.conns.load(Ordering::Relaxed) + b.conns.load(Ordering::Relaxed);
    assert_eq!(conns, 6);
}

/// Sends `request`, whose answer (`status`) has no body whatever the
/// server sends after its head, then `GET /id`: the surplus never reaches
/// the client, the next response is the next request's (`a`'s id), and it
/// went over a new upstream connection. Returns the first answer's head.
fn bodiless_then_the_next_request(
    s: &mut TlsStream,
    a: &Upstream,
    request: &str,
    status: u16,
) -> String {
    let conns = a.conns.load(Ordering::Relaxed);
    s.write_all(request.as_bytes()).unwrap();
    s.flush().unwrap();
    let first = read_response(s, true).unwrap();
    assert_eq!(first.status, status, "{request}: {}", first.head);
    let r = get(s, "/id", "").unwrap();
    assert_eq!(
        (r.status, body_text(&r).as_str()),
        (200, "a"),
        "{request}: the surplus was read as the next request's response"
    );
    assert_eq!(
        a.conns.load(Ordering::Relaxed),
        conns + 1,
        "{request}: connection reused"
    );
    first.head
}

/// A server that sends the body a HEAD or 304 answer describes, but only
/// after the pool's idle check, would have it read as the next request's
/// response (perhaps another client's): such a connection is not reused.
#[test]
fn a_body_sent_late_after_a_bodiless_answer_is_never_read_as_a_response() {
    let (_fx, a, _server, mut s) = one_server_never_marked();
    for (request, status) in [
        ("HEAD /bad/late-head-body HTTP/1.1\r\nHost: a\r\n\r\n", 200),
        ("GET /bad/late-304-body HTTP/1.1\r\nHost: a\r\n\r\n", 304),
    ] {
        let head = bodiless_then_the_next_request(&mut s, &a, request, status);
        assert!(head.contains("Content-Length: 43\r\n"), "{request}: {head}");
    }
    // An answer to HEAD that describes no body keeps its connection.
    let conns = a.conns.load(Ordering::Relaxed);
    s.write_all(b"HEAD /nothing HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    s.flush().unwrap();
    assert_eq!(read_response(&mut s, true).unwrap().status, 404);
    assert_eq!(body_text(&get(&mut s, "/id", "").unwrap()), "a");
    assert_eq!(a.conns.load(Ordering::Relaxed), conns);
}

/// A bodiless answer passes on the length it describes as one value
/// (HEAD), and a 204 none at all (RFC 9110 §8.6), whatever the server's
/// head said: a list of equal lengths and a `Content-Length: 0` on a 204
/// both pass the parser, and were relayed as sent.
#[test]
fn bodiless_answers_carry_one_length_or_none() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let r = get(&mut s, "/listlen", "").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    assert!(r.head.contains("Content-Length: 2\r\n"), "{}", r.head);
    s.write_all(b"HEAD /listlen HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    s.flush().unwrap();
    let r = read_response(&mut s, true).unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(r.head.contains("Content-Length: 2\r\n"), "{}", r.head);
    let r = get(&mut s, "/204len", "").unwrap();
    assert_eq!(r.status, 204, "{}", r.head);
    assert!(
        !r.head.to_ascii_lowercase().contains("content-length"),
        "{}",
        r.head
    );
    assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
}

#[test]
fn a_large_answer_takes_one_write_to_the_client_and_no_failed_read() {
    // A 64 KiB answer used to cost two writes to the client (64 KiB of
    // records, then the last few hundred bytes on their own) and a failed
    // `recvfrom` per request: its last read filled its buffer exactly, so
    // the check that the idle upstream connection is still open had to
    // ask the kernel. Now the body is read whole when it is there, sent in
    // one write, and its last read comes back short.
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let want = pattern(65_536);
    assert!(get(&mut s, "/len?n=65536", "").unwrap().body == want);
    let requests = 40;
    let calls = common::traced_calls(&fx, &["trace=writev,recvfrom"], server.pid(), || {
        for _ in 0..requests {
            let r = get(&mut s, "/len?n=65536", "").unwrap();
            assert!(r.body == want, "{} body bytes", r.body.len());
        }
    });
    let writes = calls.iter().filter(|c| c.contains("writev(")).count();
    let failed = calls
        .iter()
        .filter(|c| c.contains("recvfrom(") && c.contains("EAGAIN"))
        .count();
    // Before: 80 writes and 40 failed reads. A few answers may still come
    // in two pieces when the proxy reads while the upstream is writing.
    assert!(
        writes <= requests * 5 / 4 && failed <= requests / 8,
        "{writes} writes to the client and {failed} failed reads for {requests} requests:\n{}",
        calls.join("\n")
    );
    assert_eq!(
        a.conns.load(Ordering::Relaxed),
        1,
        "the connection was reused"
    );
}

#[test]
fn forwarding_headers_are_set_and_client_copies_and_hop_by_hop_fields_dropped() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let r = get(
        &mut s,
        "/headers?x=1",
        "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Client-Cert: Hash=forged\r\nForwarded: for=6.6.6.6\r\nConnection: X-Secret, keep-alive\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: h2c\r\nVia: 1.1 edge\r\nX-Kept: yes\r\nX_Forwarded_For: 7.7.7.7\r\nx_real_ip: 7.7.7.8\r\nX-Forwarded_Client_Cert: Hash=forged2\r\nX_Kept_Too: yes\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let head = body_text(&r);
    let lower = head.to_ascii_lowercase();
    assert!(
        head.starts_with("GET /headers?x=1 HTTP/1.1\r\nHost: app.test\r\n"),
        "{head}"
    );
    for gone in [
        "6.6.6.6",
        // Underscore spellings: a CGI-style gateway reads them as the
        // proxy's own fields.
        "7.7.7.",
        "forged",
        "x-secret",
        "keep-alive",
        "proxy-connection",
        "te:",
        "upgrade",
    ] {
        assert!(!lower.contains(gone), "{gone} passed: {head}");
    }
    for kept in [
        "X-Forwarded-For: 127.0.0.1\r\n",
        "X-Forwarded-Proto: https\r\n",
        "Forwarded: for=127.0.0.1;proto=https;host=\"app.test\"\r\n",
        "Via: 1.1 edge\r\n",
        "Via: 1.1 tlsgate\r\n",
        "X-Kept: yes\r\n",
        "X_Kept_Too: yes\r\n",
    ] {
        assert!(head.contains(kept), "{kept:?} missing: {head}");
    }
}

/// Fields with which backends take the client's address, scheme, port,
/// prefix or even path from a proxy are dropped from the client, over
/// HTTP/1.1 as over h2 (tests/h2_proxy.rs): `X-Original-URL` would make
/// IIS or Laminas serve `/admin` for a request routed as `/api`.
/// `pass_client_headers` keeps the ones named, for a listener behind a
/// CDN that sets them, in their `-` spelling only.
#[test]
fn client_copies_of_address_scheme_and_path_overrides_are_dropped_unless_passed() {
    const FORGED: &str = "X-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\nX-Forwarded-Scheme: http\r\nX-Forwarded-Ssl: off\r\nX-Forwarded-Port: 80\r\nX-Forwarded-Prefix: /evil\r\nX-Forwarded-Server: evil\r\nTrue-Client-IP: 6.6.6.1\r\nX-Client-IP: 6.6.6.2\r\nCF-Connecting-IP: 6.6.6.3\r\nCF_Connecting_IP: 6.6.6.4\r\nFastly-Client-IP: 6.6.6.5\r\nX-Cluster-Client-IP: 6.6.6.6\r\nX_Original_URL: /admin2\r\nX-Kept: yes\r\n";
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let seen = |listener_keys: &str| {
        let fx = Fixture::new();
        let top = format!("[server]\nworkers = 2\n{NO_RATE_LIMIT}\n{pools}");
        // The listener's own keys go before its first sub-table.
        let config = fx.config(&top, &route("/", "app", "")).replacen(
            "\n[[listener.certificate]]",
            &format!("\n{listener_keys}\n[[listener.certificate]]"),
            1,
        );
        let server = Server::start(&fx, &config);
        let mut s = tls_connect(server.addr);
        let r = get(&mut s, "/headers", FORGED).unwrap();
        assert_eq!(r.status, 200);
        body_text(&r)
    };
    let head = seen("");
    let lower = head.to_ascii_lowercase();
    for gone in [
        "original",
        "rewrite",
        "scheme",
        "ssl",
        "port",
        "prefix",
        "server",
        "client-ip",
        "client_ip",
        "connecting",
        "6.6.6.",
    ] {
        assert!(!lower.contains(gone), "{gone} passed: {head}");
    }
    assert!(head.contains("X-Kept: yes\r\n"), "{head}");
    let head = seen("pass_client_headers = [\"cf-connecting-ip\", \"X-Forwarded-Prefix\"]");
    assert!(head.contains("CF-Connecting-IP: 6.6.6.3\r\n"), "{head}");
    assert!(head.contains("X-Forwarded-Prefix: /evil\r\n"), "{head}");
    for gone in ["6.6.6.4", "original", "true-client", "scheme"] {
        assert!(
            !head.to_ascii_lowercase().contains(gone),
            "{gone} passed: {head}"
        );
    }
}

/// A reload keeps what the health checks learnt: a server found down
/// stays out in the new generation, instead of taking requests until its
/// new checker has failed `fall` times again.
#[test]
fn a_reload_keeps_a_server_found_down_out_of_service() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    a.healthy.store(false, Ordering::Relaxed);
    let pools = pool(
        "app",
        &[(a.address(), 1), (b.address(), 1)],
        "",
        "[upstream.health_check]\npath = \"/health\"\ninterval = \"1s\"\nfall = 2\n",
    );
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let down = format!(
        "tlsgate_upstream_healthy{{pool=\"app\",server=\"{}\"}} 0",
        a.address()
    );
    server.expect_metric_line(&down);
    server.signal("HUP");
    server.wait_log("reloaded configuration from", Duration::from_secs(5));
    // The new generation's checker needs two failures (a second or more)
    // to find it again; until then only what was learnt keeps it out.
    let seen = count_ids(&server, "/id", 20);
    assert_eq!(seen.get("b"), Some(&20), "{seen:?}");
    assert!(server.admin_get("/metrics").contains(&down));
}

/// A reload that removes a server and a pool removes their series from
/// `/metrics` once the last connection of the old generation is done: no
/// health state, connection count or error counter of a server no longer
/// configured stays there. A server it keeps counts on, and its idle
/// connections in the old pools leave the count with them.
#[test]
fn a_reload_drops_the_series_of_servers_and_pools_it_removes() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let nowhere = "127.0.0.1:1".to_string();
    let check = "[upstream.health_check]\npath = \"/health\"\ninterval = \"100ms\"\n";
    let text = |servers: &[(String, u32)], with_old: bool| {
        let mut pools = pool("app", servers, "", check);
        let mut routes = route("/", "app", "");
        if with_old {
            pools.push_str(&pool("old", &[(nowhere.clone(), 1)], "", ""));
            routes.push_str(&route("/old", "old", ""));
        }
        fx.config(
            &format!("[server]\nworkers = 2\n{NO_RATE_LIMIT}\n{pools}"),
            &routes,
        )
    };
    let both = [(a.address(), 1), (b.address(), 1)];
    let server = Server::start(&fx, &text(&both, true));
    let series = |name: &str, s: &str| format!("{name}{{pool=\"app\",server=\"{s}\"}}");
    let healthy = |s: &Upstream| format!("{} 1", series("tlsgate_upstream_healthy", &s.address()));
    server.expect_metric_line(&healthy(&b));
    let seen = count_ids(&server, "/id", 10);
    assert_eq!(seen.len(), 2, "{seen:?}");
    // A keep-alive client of the old generation, open across the reload.
    let mut held = tls_connect(server.addr);
    assert_eq!(get(&mut held, "/old/x", "").unwrap().status, 502);
    let failed = format!(
        "tlsgate_upstream_errors_total{{pool=\"old\",server=\"{nowhere}\",kind=\"connect\"}} 1"
    );
    let before = server.expect_metric_line(&failed);
    assert!(
        before.contains("tlsgate_proxy_errors_total{pool=\"old\",status=\"502\""),
        "{before}"
    );
    let idle_a = series("tlsgate_upstream_connections_idle", &a.address());
    assert!(!before.contains(&format!("{idle_a} 0")), "{before}");
    fx.write_config(&text(&[(a.address(), 1)], false));
    server.signal("HUP");
    server.wait_log("reloaded configuration from", Duration::from_secs(5));
    let b_label = format!("server=\"{}\"", b.address());
    let gone = |t: &str| !t.contains(&b_label) && !t.contains("pool=\"old\"");
    std::thread::sleep(Duration::from_millis(300));
    let while_held = server.admin_get("/metrics");
    assert!(
        while_held.contains(&b_label) && while_held.contains(&failed),
        "the old generation still serves a connection:\n{while_held}"
    );
    drop(held);
    let after = server.metrics_when(gone);
    assert!(gone(&after), "series of removed servers left:\n{after}");
    assert!(after.contains(&healthy(&a)), "{after}");
    // The old pools' idle connections to a went with them; the new pool
    // has made none yet.
    assert!(after.contains(&format!("{idle_a} 0")), "{after}");
    assert_eq!(count_ids(&server, "/id", 4).get("a"), Some(&4));
}

#[test]
fn sighup_changes_a_pool_while_a_client_loops_without_a_failure() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let config = |addr: &str| {
        let pools = pool(
            "app",
            &[(addr.to_string(), 1)],
            "",
            "[upstream.health_check]\npath = \"/health\"\ninterval = \"100ms\"\n",
        );
        format!("[server]\nworkers = 2\n{NO_RATE_LIMIT}{pools}")
    };
    let text = |addr: &str| fx.config(&config(addr), &route("/", "app", ""));
    let server = Server::start(&fx, &text(&a.address()));
    let clients = Loop::start(server.addr, 2);
    for (round, to) in [&b, &a, &b].iter().enumerate() {
        std::thread::sleep(Duration::from_millis(400));
        fx.write_config(&text(&to.address()));
        server.signal("HUP");
        let want = "reloaded configuration from";
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.log().matches(want).count() < round + 1 {
            assert!(Instant::now() < deadline, "{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(400));
    let (failures, seen) = clients.finish();
    let odd: Vec<String> = server
        .access_log()
        .lines()
        .filter(|l| !l.contains("\" 200 "))
        .map(str::to_string)
        .collect();
    assert_eq!(failures, 0, "{}\n{odd:?}", server.log());
    assert!(seen.len() > 100, "{}", seen.len());
    assert_eq!(seen.last().map(String::as_str), Some("b"));
    assert!(seen.iter().any(|s| s == "a"));
    // A broken pool in a reload is refused, naming the key; the old one serves.
    fx.write_config(&text("nowhere"));
    server.signal("HUP");
    server.wait_log("upstream[0].server[0].address", Duration::from_secs(5));
    let mut s = tls_connect(server.addr);
    assert_eq!(body_text(&get(&mut s, "/id", "").unwrap()), "b");
}

/// Every label value that comes from the configuration reaches /metrics
/// as the OpenMetrics text format allows, read by the Prometheus project's
/// own parser (python3-prometheus-client); a name that would need escaping
/// where tlsgate does not escape is refused at load, naming its key.
#[test]
fn metrics_with_configured_names_parse_and_names_that_would_break_them_are_refused() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let port = a.addr.port();
    let servers = [(a.address(), 1), (format!("localhost:{port}"), 1)];
    let pools = pool("app-1.x_y", &servers, "", "");
    let server = start(&fx, "", &pools, &route("/", "app-1.x_y", ""));
    let mut s = tls_connect(server.addr);
    for _ in 0..4 {
        assert_eq!(get(&mut s, "/id", "").unwrap().status, 200);
    }
    let text = server.admin_get("/metrics");
    let body = &text[text.find("\r\n\r\n").map_or(0, |i| i + 4)..];
    let script = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
        n = 0\n\
        for f in parse(sys.stdin.read()):\n\
        \x20   for s in f.samples:\n\
        \x20       if s.labels.get('pool') == 'app-1.x_y': n += 1\n\
        print(n)\n";
    let mut py = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 with python3-prometheus-client (./dev setup installs it)");
    py.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = py.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the parser refused /metrics: {said}\n{body}"
    );
    assert!(said.trim().parse::<u32>().unwrap() > 10, "{said}");

    // Names /metrics would have to escape: refused, naming the key.
    let bad_xdp = "[xdp]\ninterface = \"et\\\"h0\"\nports = [443]\noptional = true\n";
    let bad_pool = pool("a\"b", &servers, "", "");
    for (top, extra, key) in [
        (bad_xdp.to_string(), String::new(), "xdp.interface"),
        (bad_pool, route("/", "a\"b", ""), "upstream[0].name"),
    ] {
        let path = fx.write_config(&fx.config(&top, &extra));
        let o = Command::new(common::bin())
            .args(["check-config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{top}: {err}");
        assert!(
            err.contains(&format!("tlsgate.toml: key `{key}`")),
            "{top}: {err}"
        );
    }
}

#[test]
fn check_config_names_the_file_and_key_of_a_bad_pool() {
    let fx = Fixture::new();
    let text = fx.config(
        "[[upstream]]\nname = \"app\"\nbalance = \"hash\"\n[[upstream.server]]\naddress = \"127.0.0.1:1\"\n",
        &route("/", "app", ""),
    );
    let path = fx.write_config(&text);
    let o = Command::new(common::bin())
        .args(["check-config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("tlsgate.toml") && err.contains("upstream[0].hash_key"),
        "{err}"
    );
    let text = fx.config("", &route("/", "missing", ""));
    let path = fx.write_config(&text);
    let o = Command::new(common::bin())
        .args(["check-config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("listener[0].route[0].upstream"), "{err}");
}

#[test]
fn the_client_certificate_identity_reaches_the_upstream_and_forged_copies_do_not() {
    let fx = Fixture::new();
    let ca = common::make_ca("client CA");
    let ca_pem = fx.path().join("client-ca.pem");
    std::fs::write(&ca_pem, ca.0.pem()).unwrap();
    let (_, _, crt, key) = make_leaf(fx.path(), "svc-a", &["svc-a.internal"], true, &ca);
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    // Keys of the listener's certificate entry, then the route.
    let extra = format!(
        "client_auth = \"optional\"\nclient_ca = {ca_pem:?}\n{}",
        route("/", "app", "")
    );
    let server = start(&fx, "", &pools, &extra);
    let forged = "X-Forwarded-Client-Cert: Hash=forged;Subject=\"CN=admin\"";
    let with_cert = server.curl(&[
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "-H",
        forged,
        &server.url("/headers"),
    ]);
    let head = String::from_utf8_lossy(&with_cert.stdout).into_owned();
    let xfcc = head
        .lines()
        .filter(|l| {
            l.to_ascii_lowercase()
                .starts_with("x-forwarded-client-cert:")
        })
        .collect::<Vec<_>>();
    assert_eq!(xfcc.len(), 1, "{head}");
    assert!(xfcc[0].contains("Subject=\"CN=svc-a\""), "{head}");
    assert!(xfcc[0].contains("DNS=\"svc-a.internal\""), "{head}");
    assert!(!head.contains("forged"), "{head}");
    // Without a certificate, a client's copy is dropped and none is added.
    let without = server.curl(&["-H", forged, &server.url("/headers")]);
    let head = String::from_utf8_lossy(&without.stdout).into_owned();
    assert!(head.starts_with("GET /headers HTTP/1.1\r\n"), "{head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("x-forwarded-client-cert"),
        "{head}"
    );
}

#[test]
fn websocket_upgrades_pass_through_until_idle() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "idle_timeout = \"1s\"", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let upgrade = "GET /ws HTTP/1.1\r\nHost: app.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    s.write_all(upgrade.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.contains("Upgrade: websocket\r\n") && head.contains("Sec-WebSocket-Accept: "),
        "{head}"
    );
    let seen = a.last_head.lock().unwrap().clone();
    assert!(
        seen.contains("Upgrade: websocket\r\n") && seen.contains("Connection: upgrade\r\n"),
        "{seen}"
    );
    // A masked text frame "hello", echoed byte for byte, several times.
    let frame = [
        0x81u8,
        0x85,
        1,
        2,
        3,
        4,
        b'h' ^ 1,
        b'e' ^ 2,
        b'l' ^ 3,
        b'l' ^ 4,
        b'o' ^ 1,
    ];
    for _ in 0..3 {
        s.write_all(&frame).unwrap();
        let mut back = [0u8; 11];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, frame);
    }
    // Silence both ways for idle_timeout ends the tunnel.
    let t0 = Instant::now();
    assert!(common::closed_within(&mut s, Duration::from_secs(5)));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // A 101 nobody asked for is refused.
    let mut s = tls_connect(server.addr);
    assert_eq!(get(&mut s, "/bad/101", "").unwrap().status, 502);
}

#[test]
fn a_keep_alive_connection_closed_under_a_request_is_retried_on_a_new_one() {
    // `retries = 0` too: that retry resends nothing a server took, so it
    // is not one of those the key counts (it used to spend the only
    // attempt, and the client got 502).
    for keys in ["", "retries = 0"] {
        let fx = Fixture::new();
        let a = Upstream::start("a", None);
        let pools = pool("app", &[(a.address(), 1)], keys, "");
        let server = start(&fx, "", &pools, &route("/", "app", ""));
        let mut s = tls_connect(server.addr);
        for round in 1..=3 {
            assert_eq!(get(&mut s, "/then-drop", "").unwrap().status, 200);
            // The pooled connection dies under this request: one server, so
            // the retry goes to it again on a new connection.
            let r = get(&mut s, "/id", "").unwrap();
            let got = (r.status, body_text(&r));
            assert_eq!((got.0, got.1.as_str()), (200, "a"), "{keys}: {}", r.head);
            assert_eq!(a.conns.load(Ordering::Relaxed), round + 1, "{keys}");
        }
        server.expect_metric_line(&format!(
            "tlsgate_upstream_retries_total{{pool=\"app\",server=\"{}\"}} 3",
            a.address()
        ));
    }
}

/// A WebSocket upstream of the test's own: each connection's request
/// head is read, 101 answered, and the rest left to `then`.
fn ws_upstream(then: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let then = Arc::new(then);
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let (mut sock, then) = (sock.unwrap(), then.clone());
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if sock.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
                if sock.write_all(switch).is_ok() {
                    then(sock);
                }
            });
        }
    });
    addr
}

const WS_UPGRADE: &[u8] = b"GET /ws HTTP/1.1\r\nHost: app.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// Reads a response head byte by byte (nothing of the tunnel after it).
fn read_head<R: Read>(s: &mut R) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// The two directions of a tunnel move independently: an upstream that
/// never reads (its receive buffer full of the client's upload) still
/// gets everything it sends to the client, and the idle timeout, which
/// any byte moved either way restarts, does not end a tunnel that moves
/// bytes one way. The old tunnel waited on its blocked write upstream,
/// relayed nothing more and closed at `idle_timeout`.
#[test]
fn a_tunnel_relays_one_way_while_the_other_way_is_blocked() {
    const DOWN: usize = 4 << 20;
    let fx = Fixture::new();
    let up = ws_upstream(|mut sock| {
        // Time for the client's upload to fill every buffer on its way.
        std::thread::sleep(Duration::from_millis(300));
        let data = pattern(DOWN);
        for piece in data.chunks(64 * 1024) {
            if sock.write_all(piece).is_err() {
                return;
            }
        }
        // Reads nothing, ever, while the test runs.
        std::thread::sleep(Duration::from_secs(30));
    });
    let pools = pool("app", &[(up.to_string(), 1)], "idle_timeout = \"2s\"", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let config = common::client_config(rustls::DEFAULT_VERSIONS);
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(WS_UPGRADE).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tls.read_u8().await.unwrap());
        }
        assert!(head.starts_with(b"HTTP/1.1 101 "));
        let (mut rd, mut wr) = tokio::io::split(tls);
        // Uploads as fast as the way up takes it, until the test ends.
        let upload = tokio::spawn(async move {
            let blob = vec![b'u'; 64 * 1024];
            while wr.write_all(&blob).await.is_ok() {}
        });
        let mut got = Vec::with_capacity(DOWN);
        let mut buf = vec![0u8; 64 * 1024];
        let read = tokio::time::timeout(Duration::from_secs(60), async {
            while got.len() < DOWN {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        upload.abort();
        assert!(read.is_ok(), "stalled at {} bytes", got.len());
        got
    });
    assert_eq!(got.len(), DOWN, "the tunnel ended short");
    assert!(got == pattern(DOWN), "bytes changed on the way");
}

/// A side that closes its half of a tunnel ends only that direction: the
/// close goes on to the other side (FIN upstream; close_notify and FIN
/// to the client), and what the other side still sends arrives. A TLS
/// 1.3 client's close_notify and a bare FIN both count as its close.
#[test]
fn a_half_closed_tunnel_still_carries_the_other_way() {
    let fx = Fixture::new();
    let heard = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let heard_up = heard.clone();
    let up = ws_upstream(move |mut sock| {
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut first = [0u8; 4];
        if sock.read_exact(&mut first).is_err() {
            return;
        }
        if &first == b"late" {
            // Reads to the client's close, then answers after it.
            let mut rest = Vec::new();
            let _ = sock.read_to_end(&mut rest);
            std::thread::sleep(Duration::from_millis(200));
            let _ = sock.write_all(b"LATE-AFTER-HALF-CLOSE");
        } else {
            // Closes its own half first, then hears the client out.
            let _ = sock.write_all(b"BYE");
            let _ = sock.shutdown(std::net::Shutdown::Write);
            let mut rest = Vec::new();
            let _ = sock.read_to_end(&mut rest);
            heard_up.lock().unwrap().push(rest);
        }
    });
    let pools = pool("app", &[(up.to_string(), 1)], "idle_timeout = \"5s\"", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let upgraded = || {
        let mut s = common::tls_connect_with(
            server.addr,
            "localhost",
            common::client_config(&[&rustls::version::TLS13]),
        )
        .unwrap();
        s.write_all(WS_UPGRADE).unwrap();
        assert!(read_head(&mut s).starts_with("HTTP/1.1 101 "));
        s
    };
    for close_notify in [true, false] {
        let mut s = upgraded();
        s.write_all(b"late").unwrap();
        if close_notify {
            s.conn.send_close_notify();
            s.flush().unwrap();
        }
        s.sock.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        let end = s.read_to_end(&mut got);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "LATE-AFTER-HALF-CLOSE",
            "close_notify {close_notify}: {end:?}"
        );
        // The upstream's FIN came on as close_notify: a clean end.
        assert!(end.is_ok(), "close_notify {close_notify}: {end:?}");
    }
    // The upstream closes first: its close reaches the client, which
    // still sends, and the upstream gets it.
    let mut s = upgraded();
    s.write_all(b"byes").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"BYE");
    s.write_all(b"after-the-upstream-closed").unwrap();
    s.conn.send_close_notify();
    s.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while heard.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        heard.lock().unwrap().as_slice(),
        [b"after-the-upstream-closed".to_vec()]
    );
}

#[test]
fn chunked_bodies_over_the_limit_and_http10_clients() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", "max_body_bytes = 10"));
    // 11 bytes chunked against a limit of 10: 413, nothing complete upstream.
    let answer = common::raw_exchange(
        server.addr,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
    );
    assert_eq!(common::statuses(&answer), [413], "{answer}");
    assert_eq!(a.requests.load(Ordering::Relaxed), 0);
    // Within it: echoed.
    let answer = common::raw_exchange(
        server.addr,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert!(
        answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("5\r\nhello\r\n0\r\n\r\n"),
        "{answer}"
    );
    // An HTTP/1.0 client cannot take chunked: the body ends with the connection.
    let answer = common::raw_exchange(
        server.addr,
        b"GET /gen?n=100 HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains("Connection: close")
            && !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    // (raw_exchange reads text: compare the same way.)
    assert_eq!(body, String::from_utf8_lossy(&pattern(100)));
}

/// A keep-alive client of the old generation keeps it alive after a
/// reload, but no longer its background work: the server the reload
/// removed gets no more health checks and no idle connection stays open
/// to it; the client's next static response asks it to come back
/// (Connection: close), as a proxied one does.
#[test]
fn a_replaced_generation_stops_its_checks_while_an_old_client_holds_it() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let b = Upstream::start("b", None);
    let check = "[upstream.health_check]\npath = \"/health\"\ninterval = \"100ms\"\n";
    let text = |servers: &[(String, u32)]| {
        fx.config(
            &format!("{NO_RATE_LIMIT}\n{}", pool("app", servers, "", check)),
            &route("/id", "app", ""),
        )
    };
    let server = Server::start(&fx, &text(&[(a.address(), 1), (b.address(), 1)]));
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.requests.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "b is not checked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut held = tls_connect(server.addr);
    for _ in 0..4 {
        assert_eq!(get(&mut held, "/id", "").unwrap().status, 200);
    }
    let r = get(&mut held, "/hello.txt", "").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        !r.head.to_ascii_lowercase().contains("connection: close"),
        "{}",
        r.head
    );
    fx.write_config(&text(&[(a.address(), 1)]));
    server.signal("HUP");
    server.wait_log("reloaded configuration from", Duration::from_secs(5));
    // A check under way when the reload came may still end.
    std::thread::sleep(Duration::from_millis(600));
    let checked = b.requests.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(2));
    let more = b.requests.load(Ordering::Relaxed) - checked;
    assert_eq!(
        more, 0,
        "the removed server was checked {more} times after the reload"
    );
    let open = b.conns.load(Ordering::Relaxed) - b.closed.load(Ordering::Relaxed);
    assert_eq!(open, 0, "connections to the removed server still open");
    // The old generation still serves its client, once more.
    let r = get(&mut held, "/hello.txt", "").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.head.to_ascii_lowercase().contains("connection: close"),
        "a static response of a replaced generation keeps the connection:\n{}",
        r.head
    );
    assert!(common::closed_within(&mut held, Duration::from_secs(2)));
}

/// A request without a Host (HTTP/1.0) goes upstream with the name the
/// client asked for in its handshake, or without one the address it
/// connected to: never with an empty Host, which nginx answers 400.
#[test]
fn a_hostless_request_goes_upstream_with_the_sni_or_the_address() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let last_host = || {
        let head = a.last_head.lock().unwrap().clone();
        head.split("\r\n")
            .find_map(|l| l.strip_prefix("Host:").map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no Host: {head}"))
    };
    for request in [
        &b"GET /id HTTP/1.0\r\n\r\n"[..],
        b"GET /id HTTP/1.0\r\nHost:\r\n\r\n",
    ] {
        // Under SNI "localhost".
        let answer = common::raw_exchange(server.addr, request);
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert_eq!(last_host(), "localhost");
        // By address: no SNI.
        let mut s = common::tls_connect_with(
            server.addr,
            "127.0.0.1",
            common::client_config(rustls::DEFAULT_VERSIONS),
        )
        .unwrap();
        s.write_all(request).unwrap();
        let answer = common::read_to_close(&mut s);
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert_eq!(
            last_host(),
            server.addr.to_string(),
            "{}\n{}",
            a.last_head.lock().unwrap(),
            server.access_log()
        );
    }
    // The client's own Host still wins; forwarding fields carry only it.
    let answer = common::raw_exchange(server.addr, b"GET /id HTTP/1.0\r\nHost: a.test\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(last_host(), "a.test");
}

/// RFC 9110 §6.6.1: a response relayed without `Date` gets one (the test
/// upstream sends none); HTTP/1.1 and HTTP/2 clients alike.
#[test]
fn a_response_without_a_date_is_relayed_with_one() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let answer = common::raw_exchange(
        server.addr,
        b"GET /id HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let head = answer.split_once("\r\n\r\n").unwrap().0;
    let dates = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("date: "))
        .count();
    assert_eq!(dates, 1, "{head}");
    assert!(head.contains(" GMT"), "{head}");
    let out = server.curl(&[
        "--http2",
        "-sk",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &server.url("/id"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(text.starts_with("http/2 200"), "{text}");
    assert_eq!(text.matches("\ndate: ").count(), 1, "{text}");
}

/// Any number of interim `102 Processing` heads before the final answer:
/// the final one is relayed (they were a 502 past 8).
#[test]
fn many_interim_responses_before_the_final_one_are_skipped() {
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool("app", &[(a.address(), 1)], "", "");
    let server = start(&fx, "", &pools, &route("/", "app", ""));
    let mut s = tls_connect(server.addr);
    let r = get(&mut s, "/processing", "").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(body_text(&r), "done");
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

#[test]
fn a_connect_that_finds_no_descriptor_is_503_and_puts_no_server_out() {
    // tlsgate under RLIMIT_NOFILE 128, its descriptors taken by idle
    // client connections: connects to the upstream fail with EMFILE. They
    // are answered 503 local_resources and do not count against the
    // server (max_fails = 1): once descriptors are free the next request
    // goes through at once, and the server was never out.
    let fx = Fixture::new();
    let a = Upstream::start("a", None);
    let pools = pool(
        "app",
        &[(a.address(), 1)],
        "max_fails = 1\nretries = 0\nmax_idle = 0",
        "",
    );
    let config = fx.write_config(&fx.config(
        &format!("[server]\nworkers = 1\n{NO_RATE_LIMIT}max_handshakes_per_source = 0\n{pools}"),
        &route("/", "app", ""),
    ));
    let limit = 128;
    let s = Server::spawn_under(
        &["prlimit", &format!("--nofile={limit}:{limit}"), "--"],
        &["serve", "--config", config.to_str().unwrap()],
    );
    let pid = s.pid();
    let mut client = tls_connect(s.addr);
    assert_eq!(get(&mut client, "/id", "").unwrap().status, 200);
    // Idle TCP connections (no TLS handshake) until the process is out,
    // and stays out: the first request's upstream connection (max_idle =
    // 0) closes after its answer, at a time of its own on a busy machine,
    // and the descriptor it frees would let the next connect through.
    let mut hogs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        while fds(pid) < limit {
            assert!(Instant::now() < deadline, "{} descriptors", fds(pid));
            hogs.push(std::net::TcpStream::connect(s.addr).unwrap());
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(300));
        if fds(pid) >= limit {
            break;
        }
    }
    // Some more wait in the backlog.
    for _ in 0..4 {
        hogs.push(std::net::TcpStream::connect(s.addr).unwrap());
    }
    for i in 0..3 {
        let r = get(&mut client, "/id", "").unwrap();
        assert_eq!(r.status, 503, "request {i}: {}", r.head);
    }
    s.wait_access_line(&["\"GET /id HTTP/1.1\" 503", "upstream_error=local_resources"]);
    drop(hogs);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fds(pid) > limit - 32 {
        assert!(Instant::now() < deadline, "{} descriptors", fds(pid));
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let r = get(&mut client, "/id", "").unwrap();
    assert_eq!((r.status, body_text(&r).as_str()), (200, "a"));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let server = format!("server=\"{}\"", a.address());
    s.expect_metric_line(&format!(
        "tlsgate_upstream_healthy{{pool=\"app\",{server}}} 1\n"
    ));
    assert_eq!(
        metric_sum(
            &s,
            &[
                "tlsgate_upstream_errors_total",
                &server,
                "kind=\"local_resources\""
            ]
        ),
        3.0
    );
    assert_eq!(
        metric_sum(
            &s,
            &[
                "tlsgate_proxy_errors_total",
                "status=\"503\"",
                "reason=\"local_resources\""
            ]
        ),
        3.0
    );
    let log = s.log();
    assert!(!log.contains("upstream server out"), "{log}");
    assert_eq!(
        log.matches("ran out of file descriptors (EMFILE").count(),
        1,
        "{log}"
    );
}
