//! Kernel TLS (kTLS) with real peers. The same tests run everywhere:
//! where the kernel has kTLS (the lab VM, `lab/ktls`, which sets
//! `TLSGATE_EXPECT_KTLS=1`) they prove the kernel did the work —
//! `/proc/net/tls_stat` rising by the expected counts, no decrypt errors —
//! and where it has none (this project's build machines) that the same
//! requests work in user space and the server says why offload is off.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use common::*;

/// tls_stat deltas are exact only if one test runs at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this kernel runs TLS; fails loudly when the lab expected it.
fn kernel_tls() -> bool {
    let has = Path::new("/proc/net/tls_stat").exists();
    if std::env::var("TLSGATE_EXPECT_KTLS").is_ok_and(|v| v == "1") {
        assert!(
            has,
            "TLSGATE_EXPECT_KTLS=1 but this kernel has no kTLS (/proc/net/tls_stat missing)"
        );
    }
    has
}

/// The kernel's kTLS counters; empty without kTLS.
fn tls_stat() -> Vec<(String, u64)> {
    std::fs::read_to_string("/proc/net/tls_stat")
        .map(|t| {
            t.lines()
                .filter_map(|l| {
                    let mut it = l.split_whitespace();
                    Some((it.next()?.to_string(), it.next()?.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

struct StatDelta(Vec<(String, u64)>);

impl StatDelta {
    fn start() -> Self {
        Self(tls_stat())
    }
    fn get(&self, name: &str) -> u64 {
        let now = tls_stat();
        let find = |v: &[(String, u64)]| v.iter().find(|(n, _)| n == name).map_or(0, |(_, x)| *x);
        find(&now) - find(&self.0)
    }
    /// In the lab: exactly `tx`/`rx` new kernel sessions and no decrypt error.
    fn expect_sessions(&self, tx: u64, rx: u64) {
        if kernel_tls() {
            assert_eq!(
                self.get("TlsTxSw"),
                tx,
                "TlsTxSw delta; tls_stat {:?}",
                tls_stat()
            );
            assert_eq!(
                self.get("TlsRxSw"),
                rx,
                "TlsRxSw delta; tls_stat {:?}",
                tls_stat()
            );
            assert_eq!(self.get("TlsDecryptError"), 0, "TlsDecryptError");
        }
    }
}

const SIZES: [usize; 8] = [
    0,
    1,
    16 * 1024 - 1,
    16 * 1024,
    16 * 1024 + 1,
    64 * 1024,
    1 << 20,
    10 << 20,
];

fn content(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) ^ seed) as u8)
        .collect()
}

struct Site {
    fx: Fixture,
    files: Vec<(String, Vec<u8>)>,
}

impl Site {
    fn new() -> Site {
        let fx = Fixture::new();
        let mut files = Vec::new();
        for (i, len) in SIZES.iter().enumerate() {
            let name = format!("f{len}.bin");
            let body = content(*len, i);
            std::fs::write(fx.root.join(&name), &body).unwrap();
            files.push((name, body));
        }
        Site { fx, files }
    }

    fn body(&self, len: usize) -> &[u8] {
        &self
            .files
            .iter()
            .find(|(n, _)| *n == format!("f{len}.bin"))
            .unwrap()
            .1
    }

    fn start(&self, offload: &str) -> Server {
        self.start_with(offload, "")
    }

    /// `listener_extra`: more keys of the listener.
    fn start_with(&self, offload: &str, listener_extra: &str) -> Server {
        let fx = &self.fx;
        let config = format!(
            r#"[access_log]
target = "stdout"
format = "json"

[limits]
handshake_rate_per_source = 0
max_handshakes_per_source = 0
max_handshakes_in_progress = 0

[admin]
listen = "127.0.0.1:0"

[[listener]]
listen = ["127.0.0.1:0"]
root = {root:?}
offload = "{offload}"
{listener_extra}

[[listener.certificate]]
cert = {cert:?}
key = {key:?}
"#,
            root = fx.root,
            cert = fx.cert.cert,
            key = fx.cert.key,
        );
        let s = Server::start(fx, &config);
        if kernel_tls() {
            s.wait_log("kernel TLS offload available", Duration::from_secs(5));
        } else {
            s.wait_log(
                "kernel TLS offload unavailable, all TLS stays in user space",
                Duration::from_secs(5),
            );
        }
        s
    }
}

/// Metrics that say how many connections moved to the kernel.
fn offloaded(s: &Server) -> f64 {
    s.metric(r#"tlsgate_ktls_offloaded_total{direction="tx"}"#)
}

/// Reads one response (head and Content-Length body) from a TLS stream.
fn read_response(s: &mut impl Read) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).unwrap();
        assert_eq!(n, 1, "connection ended inside a response head: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, body)
}

fn get(s: &mut (impl Read + Write), path: &str) -> (String, Vec<u8>) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    s.flush().unwrap();
    read_response(s)
}

/// `curl` flags for one TLS version and cipher.
fn curl_cipher(version: &str, cipher: &str) -> Vec<String> {
    let mut v = vec![
        format!("--tlsv{version}"),
        "--tls-max".into(),
        version.into(),
    ];
    if version == "1.3" {
        v.extend(["--tls13-ciphers".into(), cipher.into()]);
    } else {
        v.extend(["--ciphers".into(), cipher.into()]);
    }
    v
}

const CIPHERS: [(&str, &str); 6] = [
    ("1.3", "TLS_AES_128_GCM_SHA256"),
    ("1.3", "TLS_AES_256_GCM_SHA384"),
    ("1.3", "TLS_CHACHA20_POLY1305_SHA256"),
    ("1.2", "ECDHE-ECDSA-AES128-GCM-SHA256"),
    ("1.2", "ECDHE-ECDSA-AES256-GCM-SHA384"),
    ("1.2", "ECDHE-ECDSA-CHACHA20-POLY1305"),
];

/// Every size over every version × cipher, one curl connection each
/// fetching all sizes in order: with `always` the kernel runs the whole
/// connection, with `auto` it takes over at the 64 KiB file.
#[test]
fn every_size_and_cipher_is_byte_exact_under_both_policies() {
    let _g = serial();
    let site = Site::new();
    let out = tempfile::tempdir().unwrap();
    for policy in ["always", "auto"] {
        let s = site.start(policy);
        let stat = StatDelta::start();
        for (version, cipher) in CIPHERS {
            let mut args: Vec<String> = curl_cipher(version, cipher);
            for len in SIZES {
                args.push(s.url(&format!("/f{len}.bin")));
                args.push("-o".into());
                args.push(out.path().join(format!("{len}")).display().to_string());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = s.curl(&args);
            assert!(
                o.status.success(),
                "{policy} {version} {cipher}: curl {}\n{}",
                String::from_utf8_lossy(&o.stderr),
                s.log()
            );
            for len in SIZES {
                let got = std::fs::read(out.path().join(format!("{len}"))).unwrap();
                assert!(
                    got == site.body(len),
                    "{policy} {version} {cipher}: {len} bytes differ (got {})",
                    got.len()
                );
            }
        }
        let n = CIPHERS.len() as u64;
        stat.expect_sessions(n, n);
        if kernel_tls() {
            assert_eq!(offloaded(&s), n as f64, "{}", s.admin_get("/metrics"));
            let switches = s.metric("tlsgate_ktls_switches_total");
            assert_eq!(switches, if policy == "auto" { n as f64 } else { 0.0 });
            assert!(s.metric(r#"tlsgate_body_bytes_total{path="sendfile"}"#) > 0.0);
            // The access log says which responses the kernel sent: under
            // auto, nothing below the 64 KiB threshold until the switch.
            let log = s.access_log();
            for line in log.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let target = v["target"].as_str().unwrap();
                let len: usize = target[2..target.len() - 4].parse().unwrap();
                let want = policy == "always" || len >= 64 * 1024;
                assert_eq!(v["ktls"], want, "{line}");
            }
        } else {
            assert_eq!(offloaded(&s), 0.0);
            assert_eq!(s.metric("tlsgate_ktls_available"), 0.0);
            assert!(s.access_log().lines().all(|l| l.contains("\"ktls\":false")));
        }
    }
}

#[test]
fn ranges_over_kernel_tls() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    let big = site.body(10 << 20);
    for (from, to) in [
        (0usize, 0usize),
        (100, 20_000),
        (16_380, 16_390),
        (5_000_000, (10 << 20) - 1),
    ] {
        let o = s.curl(&["-r", &format!("{from}-{to}"), &s.url("/f10485760.bin")]);
        assert!(o.status.success());
        assert!(
            o.stdout == big[from..=to],
            "range {from}-{to}: {} bytes",
            o.stdout.len()
        );
    }
    stat.expect_sessions(4, 4);
}

#[test]
fn a_hundred_keepalive_requests_on_one_offloaded_connection() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    for i in 0..100 {
        let len = SIZES[i % 7];
        let (head, body) = get(&mut c, &format!("/f{len}.bin"));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body == site.body(len), "request {i}: {len} bytes differ");
    }
    drop(c);
    stat.expect_sessions(1, 1);
    assert_eq!(
        s.metric(r#"tlsgate_requests_total{class="2xx",protocol="http/1.1"}"#),
        100.0
    );
}

#[test]
fn auto_switches_once_in_the_middle_of_a_connection() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("auto");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    for len in [1, 1 << 20, 16 * 1024 - 1, 64 * 1024, 0] {
        let (head, body) = get(&mut c, &format!("/f{len}.bin"));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body == site.body(len), "{len} bytes differ");
    }
    // Pipelined: three requests in one write, answered in order across
    // whatever the record layer is now.
    write!(
        c,
        "GET /f1.bin HTTP/1.1\r\nHost: l\r\n\r\nGET /f16385.bin HTTP/1.1\r\nHost: l\r\n\r\nGET /f65536.bin HTTP/1.1\r\nHost: l\r\n\r\n"
    )
    .unwrap();
    for len in [1, 16 * 1024 + 1, 64 * 1024] {
        let (_, body) = read_response(&mut c);
        assert!(body == site.body(len), "pipelined {len}");
    }
    drop(c);
    stat.expect_sessions(1, 1);
    if kernel_tls() {
        assert_eq!(s.metric("tlsgate_ktls_switches_total"), 1.0);
        let wanted = [false, true, true, true, true, true, true, true];
        let log = s.access_log();
        let seen: Vec<bool> = log
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["ktls"] == true)
            .collect();
        assert_eq!(seen, wanted, "{log}");
    }
}

/// A socket that keeps a copy of every byte it reads.
struct Tap {
    sock: std::net::TcpStream,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Read for Tap {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.seen.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

/// The explicit nonces of the sealed records in a TLS 1.2 server's bytes
/// (every record after its ChangeCipherSpec).
fn explicit_nonces(wire: &[u8]) -> Vec<u64> {
    let (mut nonces, mut at, mut sealed) = (Vec::new(), 0, false);
    while at + 5 <= wire.len() {
        let len = usize::from(u16::from_be_bytes([wire[at + 3], wire[at + 4]]));
        let Some(body) = wire.get(at + 5..at + 5 + len) else {
            break;
        };
        if sealed {
            nonces.push(u64::from_be_bytes(body[..8].try_into().unwrap()));
        }
        sealed |= wire[at] == 20;
        at += 5 + len;
    }
    nonces
}

/// TLS 1.2 AES-GCM puts each record's nonce on the wire, and the kernel
/// counts its own from what it was given: no record the kernel seals may
/// repeat one of the nonces rustls sealed the handshake's Finished and
/// the first answers under (a repeated GCM nonce gives the key's
/// authentication away). Every nonce of the connection is read off the
/// wire, before and after the switch, under both policies.
#[test]
fn tls12_gcm_nonces_are_never_repeated_across_the_switch() {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    let _g = serial();
    let site = Site::new();
    for offload in ["always", "auto"] {
        let s = site.start(offload);
        for suite in [
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ] {
            let stat = StatDelta::start();
            let provider = rustls::crypto::CryptoProvider {
                cipher_suites: vec![suite],
                ..provider()
            };
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify))
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
            let seen = Arc::<Mutex<Vec<u8>>>::default();
            let tap = Tap {
                sock: std::net::TcpStream::connect(s.addr).unwrap(),
                seen: seen.clone(),
            };
            let mut c = rustls::StreamOwned::new(conn, tap);
            // Small answers first (before `auto` switches), then big ones.
            for len in [1, 16 * 1024 - 1, 1 << 20, 1, 64 * 1024] {
                let (head, body) = get(&mut c, &format!("/f{len}.bin"));
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                assert!(
                    body == site.body(len),
                    "{offload} {suite:?}: {len} bytes differ"
                );
            }
            drop(c);
            stat.expect_sessions(1, 1);
            let nonces = explicit_nonces(&seen.lock().unwrap());
            assert!(nonces.len() > 70, "{} records", nonces.len());
            let mut sorted = nonces.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                nonces.len(),
                "{offload} {suite:?}: a nonce sealed twice among {nonces:x?}"
            );
        }
    }
}

/// A client that sends its request and half-closes (a FIN, with or
/// without close_notify before it) gets its answer whole. The kernel
/// takes the tls ULP only on an ESTABLISHED socket: such a connection
/// stays in user space. It used to lose rustls' state first and end with
/// nothing sent.
#[test]
fn a_client_that_half_closes_after_its_request_gets_its_answer() {
    let _g = serial();
    let site = Site::new();
    for offload in ["auto", "always"] {
        let s = site.start(offload);
        for close_notify in [false, true] {
            let case = format!("{offload}, close_notify {close_notify}");
            let mut c = tls_connect(s.addr);
            write!(
                c,
                "GET /f1048576.bin HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            if close_notify {
                c.conn.send_close_notify();
            }
            c.flush().unwrap();
            c.sock.shutdown(std::net::Shutdown::Write).unwrap();
            let (head, body) = read_response(&mut c);
            assert!(head.starts_with("HTTP/1.1 200"), "{case}: {head}");
            assert!(body == site.body(1 << 20), "{case}: the body differs");
        }
    }
}

/// A request body cut short by the client's close_notify: the server
/// drains the body a byte at a time through the kernel, and the alert
/// must be read whole (a one-byte read of it looked like a fatal alert:
/// no close_notify back, the session forgotten).
#[test]
fn close_notify_inside_a_drained_body_is_answered() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let mut c = tls_connect(s.addr);
    write!(
        c,
        "GET /f1.bin HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\n\r\nabcd"
    )
    .unwrap();
    c.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.conn.send_close_notify();
    c.flush().unwrap();
    let mut rest = Vec::new();
    let end = c.read_to_end(&mut rest);
    assert!(
        end.is_ok(),
        "the connection ended without close_notify: {end:?} after {} bytes",
        rest.len()
    );
}

/// Request bodies arrive through the kernel's RX path and are drained.
#[test]
fn request_bodies_are_read_through_kernel_rx() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    let body = content(100_000, 9);
    write!(
        c,
        "GET /f1.bin HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    c.write_all(&body).unwrap();
    c.flush().unwrap();
    let (head, got) = read_response(&mut c);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(got, site.body(1));
    write!(
        c,
        "GET /f16384.bin HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    )
    .unwrap();
    let (_, got) = read_response(&mut c);
    assert!(got == site.body(16 * 1024));
    drop(c);
    stat.expect_sessions(1, 1);
}

/// The client's close_notify is answered with the server's, and the
/// server's own close (Connection: close) is a close_notify too: rustls
/// reads a clean end (Ok(0)), never an unexpected EOF.
#[test]
fn close_notify_both_ways() {
    let _g = serial();
    let site = Site::new();
    for policy in ["always", "never"] {
        let s = site.start(policy);
        let mut c = tls_connect(s.addr);
        let (_, body) = get(&mut c, "/f65536.bin");
        assert_eq!(body.len(), 64 * 1024);
        c.conn.send_close_notify();
        c.flush().unwrap();
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf);
        assert!(
            matches!(n, Ok(0)),
            "{policy}: wanted the server's close_notify, got {n:?}"
        );

        let mut c = tls_connect(s.addr);
        write!(
            c,
            "GET /f1048576.bin HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let (_, body) = read_response(&mut c);
        assert!(body == site.body(1 << 20));
        let n = c.read(&mut buf);
        assert!(
            matches!(n, Ok(0)),
            "{policy}: wanted close_notify after Connection: close, got {n:?}"
        );
    }
}

/// A TLS 1.3 KeyUpdate from the client: rustls (user space) follows it;
/// the lab's kernels (before 6.14) cannot re-key, so an offloaded
/// connection ends cleanly with close_notify under the old key — never
/// garbage, never a record decrypted under a stale key — and is counted.
#[test]
fn client_key_update() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    let (_, body) = get(&mut c, "/f16385.bin");
    assert!(body == site.body(16 * 1024 + 1));
    c.conn.refresh_traffic_keys().unwrap();
    c.flush().unwrap();
    if kernel_tls() {
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf);
        assert!(
            matches!(n, Ok(0)),
            "wanted a clean close after KeyUpdate, got {n:?}"
        );
        s.expect_metric_line(r#"tlsgate_ktls_closed_total{reason="key_update"} 1"#);
    } else {
        let (head, body) = get(&mut c, "/f65536.bin");
        assert!(head.starts_with("HTTP/1.1 200"));
        assert!(body == site.body(64 * 1024));
    }
    drop(c);
    // KeyUpdate followed at once by a request: the request is never
    // decrypted under the old key, and nothing but the close comes back.
    let mut c = tls_connect(s.addr);
    c.conn.refresh_traffic_keys().unwrap();
    write!(c, "GET /f1.bin HTTP/1.1\r\nHost: l\r\n\r\n").unwrap();
    let _ = c.flush();
    let got = read_to_close(&mut c);
    if kernel_tls() {
        assert_eq!(
            got, "",
            "no response after a KeyUpdate the kernel cannot follow"
        );
    } else {
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    stat.expect_sessions(2, 2);
}

/// openssl s_client as an independent peer, both versions.
#[test]
fn openssl_s_client_reads_offloaded_responses() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    for version in ["-tls1_3", "-tls1_2"] {
        let o = s_client(
            s.addr,
            &["-quiet", version],
            b"GET /f1048576.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        );
        let at = memchr::memmem::find(&o.stdout, b"\r\n\r\n").expect("a response head") + 4;
        assert!(
            o.stdout[at..] == *site.body(1 << 20),
            "{version}: {} body bytes",
            o.stdout.len() - at
        );
    }
    stat.expect_sessions(2, 2);
}

/// A file cut short while the kernel sends it: the connection ends, and
/// every byte the client got is the file's own — no garbage, no padding.
#[test]
fn a_file_truncated_while_sent_ends_the_connection_cleanly() {
    let _g = serial();
    let site = Site::new();
    let path = site.fx.root.join("shrinks.bin");
    let original = content(48 << 20, 3);
    std::fs::write(&path, &original).unwrap();
    let s = site.start("always");
    let mut c = tls_connect(s.addr);
    write!(c, "GET /shrinks.bin HTTP/1.1\r\nHost: l\r\n\r\n").unwrap();
    c.flush().unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Read a little, then cut the file while the server is blocked on a
    // full socket.
    while got.len() < 256 * 1024 {
        let n = c.read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let at = memchr::memmem::find(&got, b"\r\n\r\n").unwrap() + 4;
    let body = &got[at..];
    assert!(
        body.len() < original.len(),
        "the whole file arrived: the cut came too late"
    );
    assert!(body == &original[..body.len()], "garbage in the body");
    s.wait_log("file shrank while being sent", Duration::from_secs(5));
}

/// Many connections offloaded at once, each byte-exact.
#[test]
fn many_connections_offloaded_at_once() {
    let _g = serial();
    let site = Arc::new(Site::new());
    let s = site.start("always");
    let stat = StatDelta::start();
    let n = 32;
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let addr = s.addr;
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let barrier = barrier.clone();
            let site = site.clone();
            std::thread::spawn(move || {
                let mut c = tls_connect(addr);
                barrier.wait();
                let len = if i % 2 == 0 { 1 << 20 } else { 16 * 1024 + 1 };
                let (_, body) = get(&mut c, &format!("/f{len}.bin"));
                assert!(body == site.body(len), "connection {i}");
                barrier.wait();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stat.expect_sessions(n as u64, n as u64);
    if kernel_tls() {
        assert_eq!(offloaded(&s), n as f64);
    }
}

/// A record that does not authenticate, under the kernel's record layer:
/// the server answers bad_record_mac (through the kernel) and ends the
/// connection; the next connection is served.
#[test]
fn a_corrupted_record_gets_bad_record_mac() {
    let _g = serial();
    let site = Site::new();
    let s = site.start("always");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    let (_, body) = get(&mut c, "/f1.bin");
    assert_eq!(body, site.body(1));
    let mut bad = vec![0x17, 3, 3, 0, 40];
    bad.extend((0..40u8).map(|i| i.wrapping_mul(37)));
    c.sock.write_all(&bad).unwrap();
    let mut buf = [0u8; 64];
    let e = c.read(&mut buf).unwrap_err();
    assert!(e.to_string().contains("BadRecordMac"), "{e}");
    let mut c = tls_connect(s.addr);
    let (_, body) = get(&mut c, "/f16384.bin");
    assert!(body == site.body(16 * 1024));
    drop(c);
    if kernel_tls() {
        assert_eq!(
            stat.get("TlsDecryptError"),
            1,
            "the kernel saw the bad record"
        );
        assert_eq!(stat.get("TlsTxSw"), 2);
    }
}

/// `offload_zerocopy`: sendfile encrypts from the page cache; files that
/// do not change arrive byte-exact, every size.
#[test]
fn zerocopy_sendfile_is_byte_exact() {
    let _g = serial();
    let site = Site::new();
    let s = site.start_with("always", "offload_zerocopy = true");
    let stat = StatDelta::start();
    let mut c = tls_connect(s.addr);
    for len in SIZES {
        let (_, body) = get(&mut c, &format!("/f{len}.bin"));
        assert!(body == site.body(len), "{len} bytes differ");
    }
    drop(c);
    stat.expect_sessions(1, 1);
    if kernel_tls() {
        // Linux 5.19+ has TLS_TX_ZEROCOPY_RO: the probe found it.
        assert!(s.log().contains("tx_zerocopy=true"), "{}", s.log());
    }
}
