//! The process's life: config checks and exit codes, reload on SIGHUP
//! under load, graceful shutdown on SIGTERM.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_accepts_good_and_names_file_key_and_expectation() {
    let fx = Fixture::new();
    let good = fx.write_config(&fx.config("", ""));
    let (code, out, err) = run(&["check-config", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK"), "{out}");
    // The key server it started for the check ends with it, quietly (its
    // supervisor once warned "key server exited; starting another").
    assert!(!err.contains("WARN"), "{err}");

    let cases: &[(&str, &str)] = &[
        (
            "[limits]\nheader_timeout = \"soon\"\n",
            "limits.header_timeout",
        ),
        ("[tls]\nversions = [\"1.0\"]\n", "tls.versions"),
        ("[server]\nworkers = 0.5\n", "server.workers"),
        ("[bogus]\n", "bogus"),
    ];
    for (top, key) in cases {
        let p = fx.write_config(&fx.config(top, ""));
        let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{top}: {err}");
        assert!(
            err.contains("tlsgate.toml") && err.contains(key),
            "{top}: {err}"
        );
    }
    // A key that does not belong to the certificate: caught by check-config.
    let other = make_cert(
        fx.path(),
        "other",
        &["other"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    let text = fx
        .config("", "")
        .replace(fx.cert.key.to_str().unwrap(), other.key.to_str().unwrap());
    let p = fx.write_config(&text);
    let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("listener[0].certificate[0].key") && err.contains("does not match"),
        "{err}"
    );
    assert!(
        !err.contains("PRIVATE KEY"),
        "never print key material: {err}"
    );
    let (code, _, err) = run(&["check-config", "/nonexistent/tlsgate.toml"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("/nonexistent/tlsgate.toml") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_2_and_nothing_is_half_started() {
    let (code, _, err) = run(&["serve", "--workers", "0"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["serve", "--cert", "x.pem"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = run(&["frobnicate"]);
    assert_eq!(code, 2);
    let (code, _, err) = run(&["serve", "--listen", "not-an-address"]);
    assert_eq!(code, 2);
    assert!(err.contains("--listen") || err.contains("listen"), "{err}");

    // The first listener is fine, the second's certificate is broken: the
    // process must exit 2 without ever listening on the first.
    let fx = Fixture::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let broken = fx.path().join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = format!(
        "{}\n[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = {:?}\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        fx.config("", "").replace("127.0.0.1:0\"]", &format!("127.0.0.1:{port}\"]")),
        fx.root,
        broken,
        fx.cert.key
    );
    let p = fx.write_config(&text);
    let mut child = Command::new(bin())
        .args(["serve", "--config", p.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "listened before validating everything"
        );
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("listener[1].certificate[0].cert"), "{err}");

    // A port already taken: exit 2 naming the key.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, _, err) = run(&["serve", "--listen", &addr, "--admin", ""]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("listener[0].listen") && err.contains("bind"),
        "{err}"
    );
}

/// A value given by a flag is blamed on the flag, not on the file it
/// overrides; an integer too large for TOML names its key.
#[test]
fn flag_errors_name_the_flag_and_an_overflowing_size_names_its_key() {
    let fx = Fixture::new();
    let p = fx.write_config(&fx.config("", ""));
    let config = p.to_str().unwrap();
    for (args, flag) in [
        (&["--workers", "5000"][..], "--workers"),
        (&["--admin", "bogus"][..], "--admin"),
        (&["--listen", "nowhere"][..], "--listen"),
        (&["--root", "/nonexistent/site"][..], "--root"),
    ] {
        let mut all = vec!["serve", "--config", config];
        all.extend_from_slice(args);
        let (code, _, err) = run(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(&format!("command line: key `{flag}`")) && !err.contains("tlsgate.toml"),
            "{args:?}: {err}"
        );
    }
    let big = "99999999999999999999";
    let route = format!(
        "[[listener.route]]\npath = \"/other/\"\nroot = {:?}\nmax_body_bytes = {big}\n",
        fx.root
    );
    for (top, extra, key) in [
        (
            format!("[limits]\nmax_body_bytes = {big}\n"),
            String::new(),
            "limits.max_body_bytes",
        ),
        (
            format!("[files]\nopen_file_cache_content_max = {big}\n"),
            String::new(),
            "files.open_file_cache_content_max",
        ),
        (String::new(), route, "listener[0].route[0].max_body_bytes"),
    ] {
        let p = fx.write_config(&fx.config(&top, &extra));
        let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{top}{extra}: {err}");
        assert!(
            err.contains(&format!("tlsgate.toml: key `{key}`")) && err.contains("at most"),
            "{top}{extra}: {err}"
        );
    }
}

/// Fetches /hello.txt on a new connection; returns the leaf certificate.
fn fetch_cert(addr: std::net::SocketAddr) -> Result<Vec<u8>, String> {
    let mut c = tls_connect_with(addr, "localhost", client_config(rustls::DEFAULT_VERSIONS))
        .map_err(|e| e.to_string())?;
    let leaf = c.conn.peer_certificates().ok_or("no certificate")?[0].to_vec();
    c.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let answer = read_to_close(&mut c);
    if answer.starts_with("HTTP/1.1 200") && answer.ends_with(HELLO) {
        Ok(leaf)
    } else {
        Err(format!("bad answer: {answer:?}"))
    }
}

#[test]
fn sighup_swaps_certificates_under_load_without_a_failed_request() {
    let fx = Fixture::new();
    // The load comes from one address as fast as it can: off with the
    // handshake rate limit, which would (rightly) throttle it.
    let s = Server::start(
        &fx,
        &fx.config("[limits]\nhandshake_rate_per_source = 0\n", ""),
    );
    let old = fx.cert.der.clone();
    let addr = s.addr;

    // A keep-alive connection made before the reload must keep working.
    let mut long_lived = tls_connect(addr);
    long_lived
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, seen, failures, done) =
                (stop.clone(), seen.clone(), failures.clone(), done.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match fetch_cert(addr) {
                        Ok(leaf) => {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&leaf) {
                                seen.push(leaf);
                            }
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // New certificate and key in place, then SIGHUP.
    let fresh = make_cert(
        fx.path(),
        "fresh",
        &["localhost"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    std::fs::copy(&fresh.cert, &fx.cert.cert).unwrap();
    std::fs::copy(&fresh.key, &fx.cert.key).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));

    // A broken config is refused and the running one keeps serving.
    std::fs::write(fx.path().join("tlsgate.toml"), "this is [not toml").unwrap();
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed requests: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    let seen = seen.lock().unwrap();
    assert!(
        done.load(Ordering::Relaxed) > 20,
        "too few requests to mean anything"
    );
    assert_eq!(seen.first(), Some(&old));
    assert!(seen.contains(&fresh.der), "new certificate never served");
    assert_eq!(fetch_cert(addr).unwrap(), fresh.der);
    assert!(
        s.log().contains("tlsgate.toml"),
        "the refusal names the file"
    );
    assert_eq!(s.metric(r#"tlsgate_reloads_total{result="ok"}"#), 1.0);
    assert_eq!(s.metric(r#"tlsgate_reloads_total{result="error"}"#), 1.0);

    // The connection from before the reload still answers.
    long_lived
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let answer = read_to_close(&mut long_lived);
    assert_eq!(statuses(&answer), vec![200, 200], "{answer}");
}

#[test]
fn sigterm_finishes_requests_in_flight_then_exits_0() {
    let fx = Fixture::new();
    // 48 MiB: more than socket buffers hold, so the response is still being
    // written when the signal arrives.
    let big: Vec<u8> = (0..48usize << 20).map(|i| (i % 253) as u8).collect();
    std::fs::write(fx.root.join("huge.bin"), &big).unwrap();
    let mut s = Server::start(
        &fx,
        &fx.config("[server]\nshutdown_timeout = \"30s\"\n", ""),
    );
    let url = s.url("/huge.bin");
    let port = s.addr.port();
    let downloader = {
        let resolve = format!("localhost:{port}:127.0.0.1");
        std::thread::spawn(move || {
            Command::new("curl")
                .args([
                    "-sS",
                    "-k",
                    "--limit-rate",
                    "16M",
                    "--resolve",
                    &resolve,
                    &url,
                ])
                .output()
                .unwrap()
        })
    };
    // An idle keep-alive connection is closed at shutdown.
    let mut idle = tls_connect(s.addr);
    idle.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let _ = idle.read(&mut buf).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    s.signal("TERM");
    s.wait_log("shutting down", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        TcpStream::connect(s.addr).is_err(),
        "still accepting after SIGTERM"
    );
    let t = Instant::now();
    let rest = read_to_close(&mut idle);
    assert!(
        t.elapsed() < Duration::from_secs(5) && !rest.contains("HTTP/1.1"),
        "idle connection not closed: {rest:?}"
    );
    let status = s.wait_exit(Duration::from_secs(40));
    let out = downloader.join().unwrap();
    assert!(
        out.status.success(),
        "download cut: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == big,
        "download differs: {} of {} bytes",
        out.stdout.len(),
        big.len()
    );
    assert_eq!(status.code(), Some(0), "{}", s.log());
    assert!(s.log().contains("stopped"));
}

#[test]
fn check_config_refuses_a_server_header_that_would_split_responses() {
    let fx = Fixture::new();
    for value in [r"x\r\nSet-Cookie: session=evil", r"x\u0000y", r"x\u007F"] {
        let p =
            fx.write_config(&fx.config(&format!("[server]\nserver_header = \"{value}\"\n"), ""));
        let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{value}: {err}");
        assert!(
            err.contains("tlsgate.toml") && err.contains("server.server_header"),
            "{value}: {err}"
        );
    }
    // A tab and non-ASCII bytes are field content (RFC 9110 §5.5).
    let p = fx.write_config(&fx.config("[server]\nserver_header = \"a\\tb é\"\n", ""));
    let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

/// `GET path` on the admin listener; the answer, or why none came within `limit`.
fn admin_probe(admin: std::net::SocketAddr, path: &str, limit: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect(admin).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(limit)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("no answer within {limit:?}: {e}"))?;
    Ok(out)
}

#[test]
fn healthz_answers_503_while_requests_in_flight_finish() {
    let fx = Fixture::new();
    std::fs::write(fx.root.join("huge.bin"), vec![7u8; 48 << 20]).unwrap();
    let mut s = Server::start(
        &fx,
        &fx.config("[server]\nshutdown_timeout = \"30s\"\n", ""),
    );
    let admin = s.admin.unwrap();
    let ok = admin_probe(admin, "/healthz", Duration::from_secs(1)).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // A slow download keeps the shutdown waiting.
    let resolve = format!("localhost:{}:127.0.0.1", s.addr.port());
    let mut download = Command::new("curl")
        .args(["-sS", "-k", "--limit-rate", "1M", "-o", "/dev/null"])
        .args(["--resolve", &resolve, &s.url("/huge.bin")])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    s.signal("TERM");
    s.wait_log("shutting down", Duration::from_secs(5));
    let answer = admin_probe(admin, "/healthz", Duration::from_secs(1));
    let in_flight = download.try_wait().unwrap().is_none();
    let _ = download.kill();
    let _ = download.wait();
    let answer = answer.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(in_flight, "the download ended before the probe");
    assert!(
        s.running(),
        "exited before the download ended:\n{}",
        s.log()
    );
}

#[test]
fn idle_admin_connections_do_not_keep_probes_waiting() {
    let fx = Fixture::new();
    let s = Server::start(&fx, &fx.config("", ""));
    let admin = s.admin.unwrap();
    // More idle sockets than answers served at once (32).
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(admin).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let answer = admin_probe(admin, "/healthz", Duration::from_secs(1)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(1));
    // The idle ones are let go soon (no request head within 1 s).
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0);
}

#[test]
fn an_access_log_that_cannot_be_opened_stops_check_config_and_start() {
    let fx = Fixture::new();
    let missing_dir = fx.path().join("no-such-dir/access.log");
    let a_directory = fx.path().to_path_buf();
    for target in [&missing_dir, &a_directory] {
        let p = fx.write_config(&fx.config(&format!("[access_log]\ntarget = {target:?}\n"), ""));
        for command in ["check-config", "serve"] {
            let args: Vec<&str> = match command {
                "serve" => vec!["serve", "--config", p.to_str().unwrap()],
                _ => vec!["check-config", p.to_str().unwrap()],
            };
            let (code, _, err) = run(&args);
            assert_eq!(code, 2, "{command} {target:?}: {err}");
            assert!(
                err.contains("tlsgate.toml") && err.contains("access_log.target"),
                "{command} {target:?}: {err}"
            );
            assert!(!err.contains("listening on"), "{command}: {err}");
        }
    }
    // A file that does not exist yet is fine, and the check leaves none.
    let fresh = fx.path().join("fresh.log");
    let p = fx.write_config(&fx.config(&format!("[access_log]\ntarget = {fresh:?}\n"), ""));
    let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(!fresh.exists());
    // With server.user, as that user: the test's directory (mode 0700)
    // is not writable by nobody.
    let p = fx.write_config(&fx.config(
        &format!("[server]\nuser = \"nobody\"\n[access_log]\ntarget = {fresh:?}\n"),
        "",
    ));
    let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("access_log.target") && err.contains("server.user"),
        "{err}"
    );
}

#[test]
fn a_reload_to_an_access_log_that_cannot_be_opened_is_refused_whole() {
    let fx = Fixture::new();
    let fresh = fx.path().join("fresh.log");
    let missing_dir = fx.path().join("no-such-dir/access.log");
    let s = Server::start(
        &fx,
        &fx.config(&format!("[access_log]\ntarget = {fresh:?}\n"), ""),
    );
    fx.write_config(&fx.config(
        &format!("[access_log]\ntarget = {missing_dir:?}\nformat = \"json\"\n"),
        "",
    ));
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    assert!(s.log().contains("access_log.target"), "{}", s.log());
    assert_eq!(s.metric(r#"tlsgate_reloads_total{result="ok"}"#), 0.0);
    assert_eq!(s.metric(r#"tlsgate_reloads_total{result="error"}"#), 1.0);
    // Still the old log, in the old format.
    assert!(s.curl(&[&s.url("/hello.txt?kept")]).status.success());
    let text = wait_file_line(&fresh, "?kept");
    let line = text.lines().find(|l| l.contains("?kept")).unwrap();
    assert!(
        line.contains("\"GET /hello.txt?kept HTTP/1.1\" 200"),
        "{line}"
    );
}

/// A config with one pool `app` of the server at `address`, routed `/api`.
fn config_with_upstream(fx: &Fixture, address: &str) -> String {
    fx.config(
        &format!("[[upstream]]\nname = \"app\"\n[[upstream.server]]\naddress = {address:?}\n"),
        "[[listener.route]]\npath = \"/api\"\nupstream = \"app\"\n",
    )
}

#[test]
fn a_reload_stuck_resolving_a_name_leaves_healthz_and_sigterm_answered() {
    let fx = Fixture::new();
    // A name server that never answers: glibc waits 5 s a try, two tries.
    let ns = format!("127.91.{}.{}", std::process::id() % 250 + 1, 53);
    let blackhole = std::net::UdpSocket::bind((ns.as_str(), 53)).unwrap();
    let resolv = fx.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {ns}\noptions timeout:5 attempts:2\n"),
    )
    .unwrap();
    let path = fx.write_config(&config_with_upstream(&fx, "127.0.0.1:1"));
    // tlsgate alone sees that resolv.conf (a mount namespace of its own).
    let mut s = Server::spawn_under(
        &[
            "unshare",
            "-m",
            "sh",
            "-c",
            "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
            resolv.to_str().unwrap(),
        ],
        &["serve", "--config", path.to_str().unwrap()],
    );
    let admin = s.admin.unwrap();
    let ok = admin_probe(admin, "/healthz", Duration::from_secs(1)).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // The new configuration names the server: loading it resolves the
    // name, which takes about 10 s here.
    fx.write_config(&config_with_upstream(&fx, "app.reload-test.internal:8080"));
    s.signal("HUP");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let answer = admin_probe(admin, "/healthz", Duration::from_secs(1));
    let took = t.elapsed();
    let answer = answer.unwrap_or_else(|e| panic!("/healthz during the reload: {e}"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
    // A second SIGHUP during the reload is queued behind it.
    s.signal("HUP");
    s.wait_log("reload requested during a reload", Duration::from_secs(1));
    let log = s.log();
    assert!(
        !log.contains("reloaded configuration") && !log.contains("reload refused"),
        "the reload was not under way any more:\n{log}"
    );
    // SIGTERM does not wait for the reload.
    let t = Instant::now();
    s.signal("TERM");
    let status = s.wait_exit(Duration::from_secs(3));
    assert!(status.success(), "{status}\n{}", s.log());
    assert!(t.elapsed() < Duration::from_secs(3));
    let log = s.log();
    assert!(!log.contains("reloaded configuration"), "{log}");
    drop(blackhole);
}

/// `openssl s_client -tls1_2` to `addr`, saving (`out`) or offering the
/// session in `sess`: whether the session was resumed.
fn resumed_tls12(addr: std::net::SocketAddr, sess: &std::path::Path, out: bool) -> bool {
    let flag = if out { "-sess_out" } else { "-sess_in" };
    let o = s_client(addr, &["-tls1_2", flag, sess.to_str().unwrap()], b"");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains("\nNew,") || text.contains("\nReused,"),
        "no handshake:\n{text}"
    );
    text.contains("\nReused,")
}

#[test]
fn a_refused_reload_leaves_the_session_ticket_keys_alone() {
    let fx = Fixture::new();
    let cfg = |lifetime: &str, listen: &str| {
        fx.config(&format!("[tls]\nticket_lifetime = {lifetime:?}\n"), "")
            .replace(
                "listen = [\"127.0.0.1:0\"]",
                &format!("listen = [{listen:?}]"),
            )
    };
    let mut s = Server::start(&fx, &cfg("12h", "127.0.0.1:0"));
    let sess = fx.path().join("session.pem");
    assert!(!resumed_tls12(s.addr, &sess, true));
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    assert!(
        resumed_tls12(s.addr, &sess, false),
        "not resumed after a plain reload"
    );
    // New ticket settings, refused for its changed listen address: the
    // keys it made must not replace the running ones...
    fx.write_config(&cfg("13h", "127.0.0.3:0"));
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    // ...or the running settings, loaded again, count as a change.
    fx.write_config(&cfg("12h", "127.0.0.1:0"));
    s.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.log().matches("reloaded configuration").count() < 2 {
        assert!(Instant::now() < deadline, "{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        resumed_tls12(s.addr, &sess, false),
        "a ticket from before the refused reload no longer resumes:\n{}",
        s.admin_get("/metrics")
    );
    assert!(s.running());
}

/// A second instance on an address the first one listens on stops at
/// start naming the key and the address, exit 2, instead of joining the
/// first one's `SO_REUSEPORT` group and taking half its connections; so
/// does anything else listening there. The first keeps every connection.
#[test]
fn a_second_instance_on_a_busy_address_stops_at_start() {
    let fx = Fixture::new();
    let first = Server::start(&fx, &fx.config("", ""));
    let addr = first.addr;
    let other = Fixture::new();
    std::fs::write(other.root.join("hello.txt"), "the second instance\n").unwrap();
    let text = other.config("", "").replace(
        "listen = [\"127.0.0.1:0\"]",
        &format!("listen = [\"{addr}\"]"),
    );
    let cfg = other.write_config(&text);
    for extra in [&[][..], &["--admin", ""][..]] {
        let mut args = vec!["serve", "--config", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut child = Command::new(bin())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("the second instance started on {addr} ({extra:?})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(status.code(), Some(2), "{err}");
        assert!(
            err.contains("listener[0].listen")
                && err.contains(&addr.to_string())
                && err.contains("already in use"),
            "{err}"
        );
        assert!(!err.contains("listening on"), "nothing started: {err}");
    }
    // Every request still reaches the first one.
    for _ in 0..8 {
        let answer = raw_exchange(
            addr,
            b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        );
        assert!(answer.contains(HELLO), "{answer}");
    }
    // A plain listener of another program is refused the same way.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = plain.local_addr().unwrap();
    let text = other.config("", "").replace(
        "listen = [\"127.0.0.1:0\"]",
        &format!("listen = [\"{busy}\"]"),
    );
    let cfg = other.write_config(&text);
    let (code, _, err) = run(&["serve", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("listener[0].listen") && err.contains(&busy.to_string()),
        "{err}"
    );
}

/// Listeners whose addresses overlap (a wildcard and a specific address
/// of the same family and port) are refused by check-config, naming both
/// keys; `[::]` and `0.0.0.0` on one port do not overlap (IPv6 listeners
/// are IPv6-only).
#[test]
fn check_config_refuses_overlapping_listeners_naming_both() {
    let fx = Fixture::new();
    let base = fx.config("", "");
    let second = |addr: &str| {
        let l = base.split("[[listener]]").nth(1).unwrap().replace(
            "listen = [\"127.0.0.1:0\"]",
            &format!("listen = [\"{addr}\"]"),
        );
        format!("{base}\n[[listener]]{l}")
    };
    for (a, b) in [
        ("0.0.0.0:18543", "127.0.0.1:18543"),
        ("127.0.0.1:18543", "0.0.0.0:18543"),
        ("[::]:18543", "[::1]:18543"),
        ("127.0.0.1:18543", "127.0.0.1:18543"),
    ] {
        let text = second(b).replacen(
            "listen = [\"127.0.0.1:0\"]",
            &format!("listen = [\"{a}\"]"),
            1,
        );
        let p = fx.write_config(&text);
        let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{a} {b}: {err}");
        assert!(
            err.contains("listener[0].listen") && err.contains("listener[1].listen"),
            "{a} {b}: {err}"
        );
        assert!(err.contains(a) && err.contains(b), "{a} {b}: {err}");
    }
    for (a, b) in [
        ("0.0.0.0:18543", "[::]:18543"),
        ("127.0.0.1:18543", "127.0.0.2:18543"),
        ("127.0.0.1:0", "0.0.0.0:0"),
    ] {
        let text = second(b).replacen(
            "listen = [\"127.0.0.1:0\"]",
            &format!("listen = [\"{a}\"]"),
            1,
        );
        let p = fx.write_config(&text);
        let (code, _, err) = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(code, 0, "{a} {b}: {err}");
    }
}

/// A config file is a regular file of at most 16 MiB: /dev/zero (which
/// was read until the OOM killer came), a FIFO nobody writes to (never
/// opened, so no wait) and a file one byte over are refused by
/// check-config and serve within seconds, exit 2, naming the file and
/// what was expected; one byte less passes.
#[test]
fn a_config_that_is_a_device_or_too_large_is_refused_at_once() {
    let fx = Fixture::new();
    let fifo = fx.path().join("fifo.toml");
    let ok = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(ok.success());
    let big = fx.path().join("big.toml");
    let mut text = fx.config("", "");
    text.push_str(&"#".repeat((16 << 20) - text.len()));
    text.push('\n');
    assert_eq!(text.len(), (16 << 20) + 1);
    std::fs::write(&big, &text).unwrap();
    let fifo = fifo.to_str().unwrap();
    let big = big.to_str().unwrap();
    for (file, says) in [
        (
            "/dev/zero",
            "is a character device; expected a regular file of at most 16 MiB",
        ),
        (fifo, "is a FIFO; expected a regular file of at most 16 MiB"),
        (
            big,
            "larger than 16 MiB; expected a configuration file of at most 16 MiB",
        ),
    ] {
        for cmd in [&["check-config"][..], &["serve", "--config"][..]] {
            let args = [cmd, &[file]].concat();
            let (code, err) = common::tlsgate_within_5s(&args);
            assert_eq!(code, Some(2), "{args:?}: {err}");
            assert!(err.contains(&format!("{file}: {says}")), "{args:?}: {err}");
            assert!(!err.contains("listening"), "{err}");
        }
    }
    // The limit is where it says.
    std::fs::write(big, &text[1..]).unwrap();
    check_config_passes(std::path::Path::new(big));
}
