//! Private keys live in the key process: handshakes sign through it, the
//! network-facing process's memory holds no key, the key process is
//! restarted when killed, SIGHUP swaps keys, and the network-facing
//! process runs unprivileged.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::{ClientConfig, HandshakeKind};
use std::sync::Arc;

/// Config extra: an RSA-2048 certificate for `rsa.test` next to the
/// fixture's ECDSA one for localhost.
fn with_rsa(fx: &Fixture) -> (CertFiles, String) {
    let rsa = make_cert(fx.path(), "rsa", &["rsa.test"], &rcgen::PKCS_RSA_SHA256);
    let extra = format!(
        "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        rsa.cert, rsa.key
    );
    (rsa, extra)
}

/// GET /hello.txt over a fresh full handshake; returns the server's leaf DER.
fn fetch(
    addr: std::net::SocketAddr,
    sni: &str,
    v: &'static rustls::SupportedProtocolVersion,
) -> Result<Vec<u8>, String> {
    let mut config = client_config(&[v]);
    // No resumption: every connection signs.
    config.resumption = rustls::client::Resumption::disabled();
    let mut s = tls_connect_with(addr, sni, config).map_err(|e| e.to_string())?;
    let leaf = s.conn.peer_certificates().unwrap()[0].to_vec();
    assert_eq!(s.conn.protocol_version(), Some(v.version));
    write!(
        s,
        "GET /hello.txt HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let answer = read_to_close(&mut s);
    assert!(answer.ends_with(HELLO), "{answer}");
    Ok(leaf)
}

/// Parent pid of `pid` from /proc/PID/stat.
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| ppid(*p) == Some(pid))
        .collect()
}

/// (supervisor, key server) of a running tlsgate, waiting for them.
fn key_processes(server: &Server) -> (u32, u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sup = children(server.pid());
        if let [sup] = sup[..] {
            if let [ks] = children(sup)[..] {
                return (sup, ks);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no key supervisor and key server under {}: {sup:?}",
            server.pid()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_field(pid: u32, task: Option<u32>, name: &str) -> String {
    let path = match task {
        Some(t) => format!("/proc/{pid}/task/{t}/status"),
        None => format!("/proc/{pid}/status"),
    };
    let s = std::fs::read_to_string(&path).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {path}"))
        .trim()
        .to_string()
}

// ---- searching a process's memory for a key ----

/// One DER TLV: (tag, content, rest).
fn tlv(b: &[u8]) -> (u8, &[u8], &[u8]) {
    let tag = b[0];
    let (len, hdr) = match b[1] {
        n if n < 0x80 => (n as usize, 2),
        0x81 => (b[2] as usize, 3),
        0x82 => ((b[2] as usize) << 8 | b[3] as usize, 4),
        n => panic!("DER length form {n:#x}"),
    };
    (tag, &b[hdr..hdr + len], &b[hdr + len..])
}

fn strip_zero(i: &[u8]) -> &[u8] {
    i.strip_prefix(&[0]).unwrap_or(i)
}

/// What a leaked key would look like in memory: the PKCS#8 DER, the first
/// line of the PEM base64 body, and the private scalar (ECDSA) or the prime
/// p (RSA) in big-endian and in little-endian (BIGNUM limb) order.
fn needles(key_pem: &Path) -> Vec<(String, Vec<u8>)> {
    let pem = std::fs::read_to_string(key_pem).unwrap();
    let b64_line = pem.lines().nth(1).unwrap().as_bytes().to_vec();
    assert_eq!(b64_line.len(), 64);
    let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let PrivateKeyDer::Pkcs8(p8) = &der else {
        panic!("PKCS#8 expected")
    };
    let p8 = p8.secret_pkcs8_der().to_vec();
    // PrivateKeyInfo ::= SEQUENCE { version, algorithm, privateKey OCTET STRING }
    let (_, info, _) = tlv(&p8);
    let (_, _, rest) = tlv(info);
    let (_, alg, rest) = tlv(rest);
    let (_, inner, _) = tlv(rest);
    let (_, inner, _) = tlv(inner);
    let (_, _, after_version) = tlv(inner);
    let is_rsa = alg
        .windows(9)
        .any(|w| w == [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01]);
    let (name, secret) = if is_rsa {
        // RSAPrivateKey ::= SEQUENCE { version, n, e, d, p, ... }
        let mut r = after_version;
        for _ in 0..3 {
            r = tlv(r).2;
        }
        ("rsa p", strip_zero(tlv(r).1).to_vec())
    } else {
        // ECPrivateKey ::= SEQUENCE { version, privateKey OCTET STRING, ... }
        ("ec scalar", tlv(after_version).1.to_vec())
    };
    assert!(secret.len() >= 32, "{name}: {} bytes", secret.len());
    let mut le = secret.clone();
    le.reverse();
    vec![
        ("pkcs8 der".into(), p8),
        ("pem base64".into(), b64_line),
        (format!("{name} big-endian"), secret),
        (format!("{name} little-endian"), le),
    ]
}

/// Names of the needles found anywhere in the readable memory of `pid`
/// (all its threads share it).
fn search_memory(pid: u32, needles: &[(String, Vec<u8>)]) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let finders: Vec<_> = needles
        .iter()
        .map(|(n, b)| (n.clone(), memchr::memmem::Finder::new(b).into_owned()))
        .collect();
    let mut found = Vec::new();
    let mut scanned = 0usize;
    let mut buf = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let range = f.next().unwrap();
        let perms = f.next().unwrap();
        let path = f.nth(3).unwrap_or("");
        if !perms.starts_with('r')
            || path == "[vvar]"
            || path == "[vsyscall]"
            || path == "[vvar_vclock]"
        {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        buf.resize((b - a) as usize, 0);
        if mem.seek(SeekFrom::Start(a)).is_err() {
            continue;
        }
        // A region can shrink while we read it; search what we got.
        let mut got = 0;
        while got < buf.len() {
            match mem.read(&mut buf[got..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        scanned += got;
        for (name, finder) in &finders {
            if !found.contains(name) && finder.find(&buf[..got]).is_some() {
                found.push(name.clone());
            }
        }
    }
    assert!(
        scanned > 1 << 20,
        "read only {scanned} bytes of {pid}'s memory"
    );
    found
}

// ---- tests ----

#[test]
fn tls12_and_tls13_handshakes_with_ecdsa_and_rsa_sign_in_the_key_process() {
    let fx = Fixture::new();
    let (rsa, extra) = with_rsa(&fx);
    let server = Server::start(&fx, &fx.config("", &extra));
    let (_, ks) = key_processes(&server);
    assert_eq!(
        status_field(ks, None, "Uid").split_whitespace().next(),
        Some("0")
    );
    for v in [&rustls::version::TLS12, &rustls::version::TLS13] {
        assert_eq!(
            fetch(server.addr, "localhost", v).unwrap(),
            fx.cert.der,
            "{v:?} ECDSA"
        );
        assert_eq!(
            fetch(server.addr, "rsa.test", v).unwrap(),
            rsa.der,
            "{v:?} RSA"
        );
    }
    // Other peers: curl over TLS 1.2 with RSA, openssl over TLS 1.3 with ECDSA.
    let resolve = format!("rsa.test:{}:127.0.0.1", server.addr.port());
    let out = Command::new("curl")
        .args([
            "-sS",
            "-k",
            "--max-time",
            "20",
            "--tlsv1.2",
            "--tls-max",
            "1.2",
            "--resolve",
            &resolve,
        ])
        .arg(format!("https://rsa.test:{}/hello.txt", server.addr.port()))
        .output()
        .expect("curl must be installed (./dev setup)");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        HELLO,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = Command::new("openssl")
        .args([
            "s_client",
            "-tls1_3",
            "-ign_eof",
            "-servername",
            "localhost",
            "-connect",
        ])
        .arg(server.addr.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl must be installed (./dev setup)");
    s.stdin
        .take()
        .unwrap()
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let out = s.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("TLSv1.3") && text.to_lowercase().contains("ecdsa"),
        "{text}"
    );
    assert!(text.contains(HELLO.trim()), "{text}");
    let m = server.metrics_when(|t| t.contains("tlsgate_handshakes_total"));
    assert!(m.contains("tlsgate_key_up 1"), "{m}");
    assert!(!m.contains("key_unavailable"), "{m}");
    // The signatures travelled on the workers' own lanes, not the shared
    // connection a refused lane falls back to (silently, by design).
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{ks}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect();
    assert!(
        threads.iter().any(|t| t == "key-lane"),
        "no lane thread in the key server: {threads:?}"
    );
    // The handshakes' lanes are pipes: the network process and the key
    // server share two (the requests' and the answers') besides the
    // standard streams they may inherit.
    let pipes = |pid: u32| -> std::collections::HashSet<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| !["0", "1", "2"].contains(&n))
            })
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .filter(|l| l.starts_with("pipe:"))
            .collect()
    };
    let shared = pipes(server.pid()).intersection(&pipes(ks)).count();
    assert!(shared >= 2, "{shared} pipes shared with the key server");
}

#[test]
fn no_private_key_in_the_network_process_memory_and_the_search_finds_one_in_process() {
    let fx = Fixture::new();
    let (rsa, extra) = with_rsa(&fx);
    let mut wanted = needles(&fx.cert.key);
    wanted.extend(needles(&rsa.key));
    let exercise = |server: &Server| {
        for v in [&rustls::version::TLS12, &rustls::version::TLS13] {
            fetch(server.addr, "localhost", v).unwrap();
            fetch(server.addr, "rsa.test", v).unwrap();
        }
        // A reload reads everything again.
        let before = server.metric("tlsgate_reloads_total{result=\"ok\"}");
        server.signal("HUP");
        server.metrics_when(|_| server.metric("tlsgate_reloads_total{result=\"ok\"}") > before);
        fetch(server.addr, "rsa.test", &rustls::version::TLS13).unwrap();
    };

    let isolated = Server::start(&fx, &fx.config("", &extra));
    exercise(&isolated);
    let (sup, _) = key_processes(&isolated);
    let in_supervisor = search_memory(sup, &wanted);
    assert!(
        in_supervisor.is_empty(),
        "key material in the key supervisor: {in_supervisor:?}"
    );
    // The key server does hold them: the search works on a live process.
    let in_keys = held_by_the_key_server_only(&isolated, &wanted);
    assert!(
        in_keys.iter().any(|n| n.starts_with("rsa p")),
        "{in_keys:?}"
    );
    drop(isolated);

    // Control: the same search finds the keys when they are in-process.
    let inproc = Server::start(&fx, &fx.config("[server]\nkey_isolation = false\n", &extra));
    exercise(&inproc);
    assert!(
        children(inproc.pid()).is_empty(),
        "no key process without isolation"
    );
    // And it says so: the switch is for measuring.
    inproc.wait_log(
        "server.key_isolation = false: private keys are in the processes that talk to the network",
        Duration::from_secs(5),
    );
    let found = search_memory(inproc.pid(), &wanted);
    eprintln!("key server holds: {in_keys:?}\nin-process server holds: {found:?}");
    assert!(
        found.iter().any(|n| n.starts_with("ec scalar")),
        "{found:?}"
    );
    assert!(found.iter().any(|n| n.starts_with("rsa p")), "{found:?}");
}

/// Waits until `handshakes` handshakes have failed for want of a
/// signature (the server counts after the client moved on), then checks
/// how many signatures failed for each reason.
fn assert_key_failures(server: &Server, handshakes: u32, reasons: &[(&str, u32)]) {
    let m = server.expect_metric_line(&format!(
        "tlsgate_handshake_failures_total{{reason=\"key_unavailable\"}} {handshakes}"
    ));
    for (reason, n) in reasons {
        let line = format!("tlsgate_key_failures_total{{reason=\"{reason}\"}} {n}");
        assert!(m.contains(&line), "wanted {line:?} in\n{m}");
    }
}

#[test]
fn a_killed_key_server_is_restarted_and_handshakes_fail_cleanly_meanwhile() {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config("", ""));
    let tls13 = &rustls::version::TLS13;
    fetch(server.addr, "localhost", tls13).unwrap();
    let (sup, ks) = key_processes(&server);
    // Hold the supervisor so the gap without a key server is certain.
    let sig = |s: &str, pid: u32| {
        assert!(Command::new("kill")
            .args([s, &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    sig("-STOP", sup);
    sig("-KILL", ks);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("tlsgate_key_up") != 0.0 {
        assert!(Instant::now() < deadline, "key_up stayed 1");
        std::thread::sleep(Duration::from_millis(20));
    }
    for v in [&rustls::version::TLS12, tls13] {
        assert!(
            fetch(server.addr, "localhost", v).is_err(),
            "{v:?}: no key server, no handshake"
        );
    }
    assert_key_failures(&server, 2, &[("down", 2)]);

    sig("-CONT", sup);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetch(server.addr, "localhost", tls13).is_err() {
        assert!(
            Instant::now() < deadline,
            "handshakes did not resume:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, ks2) = key_processes(&server);
    assert_ne!(ks, ks2);
    assert_eq!(server.metric("tlsgate_key_restarts_total"), 1.0);
    assert_eq!(server.metric("tlsgate_key_up"), 1.0);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// A full TLS 1.3 handshake over rustls, `retried` by a HelloRetryRequest
/// (its only key share is for P-384, which the server in
/// `a_handshake_waiting_...` does not take); the kind of handshake it was.
fn full_handshake(addr: std::net::SocketAddr, retried: bool) -> Result<HandshakeKind, String> {
    let mut config = client_config(&[&rustls::version::TLS13]);
    if retried {
        let provider = rustls::crypto::CryptoProvider {
            kx_groups: vec![
                rustls::crypto::aws_lc_rs::kx_group::SECP384R1,
                rustls::crypto::aws_lc_rs::kx_group::SECP256R1,
            ],
            ..provider()
        };
        config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify))
            .with_no_client_auth();
    }
    config.resumption = rustls::client::Resumption::disabled();
    let mut s = tls_connect_with(addr, "localhost", config).map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let answer = read_to_close(&mut s);
    assert!(answer.ends_with(HELLO), "{answer}");
    s.conn
        .handshake_kind()
        .ok_or_else(|| "no handshake kind".into())
}

/// A handshake waiting for its signature does not hold up its worker: with
/// the key server stopped, a full handshake waits for the key process, and
/// meanwhile a keep-alive connection on the same (only) worker is answered
/// at once. Signing used to block the worker's thread until the answer,
/// and still did for a client asked to retry its ClientHello (the second
/// hello was processed outside the suspendable call).
/// Asks for /hello.txt on `s` and reads until its body has come.
fn hello_answered(s: &mut TlsStream) -> Result<(), String> {
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(HELLO.as_bytes()) {
        match s.read(&mut buf) {
            Ok(0) => return Err("closed".into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

#[test]
fn a_handshake_waiting_for_its_signature_does_not_hold_up_the_worker() {
    let fx = Fixture::new();
    let top = "[server]\nworkers = 1\nkey_timeout = \"20s\"\n\n[tls]\nkey_exchange_groups = [\"X25519\", \"secp256r1\"]\n";
    let server = Server::start(&fx, &fx.config(top, ""));
    let mut kept = tls_connect(server.addr);
    hello_answered(&mut kept).unwrap();
    let (_, ks) = key_processes(&server);
    let sig = |s: &str| {
        assert!(Command::new("kill")
            .args([s, &ks.to_string()])
            .status()
            .unwrap()
            .success());
    };
    for (retried, kind) in [
        (false, HandshakeKind::Full),
        (true, HandshakeKind::FullWithHelloRetryRequest),
    ] {
        sig("-STOP");
        let addr = server.addr;
        let waiting = std::thread::spawn(move || full_handshake(addr, retried));
        // Time for its ClientHello (both, when retried) to reach the worker
        // and ask for a signature.
        std::thread::sleep(Duration::from_millis(500));
        kept.sock
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let t0 = Instant::now();
        let served = hello_answered(&mut kept);
        let took = t0.elapsed();
        let still_waiting = !waiting.is_finished();
        sig("-CONT");
        served.unwrap_or_else(|e| {
            panic!(
                "{kind:?}: the kept connection was not answered while a signature was awaited: {e}"
            )
        });
        assert!(
            took < Duration::from_secs(1),
            "{kind:?}: answered after {took:?}"
        );
        assert!(
            still_waiting,
            "{kind:?}: the handshake did not wait for the stopped key server"
        );
        assert_eq!(waiting.join().unwrap(), Ok(kind));
    }
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn the_self_signed_default_is_made_by_the_key_server_and_remade_after_a_restart() {
    let fx = Fixture::new();
    let text = fx.config("", "").replace(
        &format!(
            "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
            fx.cert.cert, fx.cert.key
        ),
        "self_signed = true\n",
    );
    let server = Server::start(&fx, &text);
    let first = fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    let (_, ks) = key_processes(&server);
    assert!(Command::new("kill")
        .args(["-KILL", &ks.to_string()])
        .status()
        .unwrap()
        .success());
    // The new key server makes a new key: the server reloads to serve it.
    server.wait_log("reloaded configuration", Duration::from_secs(10));
    let second = fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    assert_ne!(first, second, "a new self-signed certificate");
}

#[test]
fn sighup_swaps_to_a_new_certificate_and_key() {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config("", ""));
    assert_eq!(
        fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap(),
        fx.cert.der
    );
    // New pair under the same file names, as a renewal does.
    let renewed = make_cert(
        fx.path(),
        "localhost",
        &["localhost"],
        &rcgen::PKCS_RSA_SHA256,
    );
    assert_ne!(renewed.der, fx.cert.der);
    server.signal("HUP");
    server.wait_log("reloaded configuration", Duration::from_secs(10));
    for v in [&rustls::version::TLS12, &rustls::version::TLS13] {
        assert_eq!(fetch(server.addr, "localhost", v).unwrap(), renewed.der);
    }
    // A key that does not match its certificate is refused; the pair in use stays.
    let other = make_cert(
        fx.path(),
        "other",
        &["localhost"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    std::fs::copy(&other.key, &renewed.key).unwrap();
    server.signal("HUP");
    server.wait_log("does not match", Duration::from_secs(10));
    assert_eq!(
        server.metric("tlsgate_reloads_total{result=\"error\"}"),
        1.0
    );
    assert_eq!(
        fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap(),
        renewed.der
    );
}

#[test]
fn the_network_process_runs_as_nobody_without_capabilities_and_serves() {
    assert_eq!(
        status_field(std::process::id(), None, "Uid")
            .split_whitespace()
            .next(),
        Some("0"),
        "this test starts tlsgate as root to see it switch to nobody; run the tests as root"
    );
    let fx = Fixture::new();
    // Only root may read the keys.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fx.cert.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = Server::start(
        &fx,
        &fx.config("[server]\nuser = \"nobody\"\nworkers = 2\n", ""),
    );
    fetch(server.addr, "localhost", &rustls::version::TLS12).unwrap();
    let out = server.curl(&[&server.url("/hello.txt")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), HELLO);
    let pid = server.pid();
    let nobody = status_field(pid, None, "Uid");
    assert!(
        nobody.split_whitespace().all(|u| u == "65534"),
        "Uid: {nobody}"
    );
    let tasks: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    assert!(tasks.len() >= 3, "main and two workers at least: {tasks:?}");
    for t in tasks {
        for f in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
            let v = status_field(pid, Some(t), f);
            assert!(v.bytes().all(|b| b == b'0'), "thread {t} {f} = {v}");
        }
        assert_eq!(status_field(pid, Some(t), "NoNewPrivs"), "1", "thread {t}");
        assert_eq!(status_field(pid, Some(t), "Groups"), "", "thread {t}");
        assert!(status_field(pid, Some(t), "Uid")
            .split_whitespace()
            .all(|u| u == "65534"));
    }
    // The key process keeps its privileges (it must read the 0600 key).
    let (sup, ks) = key_processes(&server);
    for p in [sup, ks] {
        assert_eq!(
            status_field(p, None, "Uid").split_whitespace().next(),
            Some("0")
        );
    }
    assert!(!server.log().contains("runs as root"), "{}", server.log());
    drop(server);
    // Left as root, the serving process could read that 0600 key itself:
    // the isolation does not hold, and the log says so.
    let root = Server::start(&fx, &fx.config("", ""));
    root.wait_log(
        "the serving process runs as root (uid 0, `server.user` not set)",
        Duration::from_secs(10),
    );
}

/// `setpriv` arguments for a root process without CAP_SYS_PTRACE (gone
/// from its bounding set, so from every set after exec) and with every
/// other capability: only a target's dumpability is then between it and
/// a root process of the same capabilities.
const WITHOUT_PTRACE: [&str; 5] = [
    "setpriv",
    "--bounding-set",
    "-sys_ptrace",
    "--inh-caps",
    "-all",
];

/// Opens /proc/PID/mem of `pid` (what a debugger or a memory dump reads)
/// from a root process without CAP_SYS_PTRACE, and reads nothing: `Err`
/// with what the shell said when the kernel refuses the open.
fn open_memory_without_ptrace(pid: u32) -> Result<(), String> {
    let mem = format!("/proc/{pid}/mem");
    let out = Command::new("timeout")
        .arg("10")
        .args(WITHOUT_PTRACE)
        .args(["sh", "-c", "exec 3< \"$0\"", &mem])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// tlsgate as root (no `server.user`) without CAP_SYS_PTRACE, as the
/// reader of [`open_memory_without_ptrace`], so that the reader holds
/// every capability the key processes hold: only dumpability decides.
fn start_without_ptrace(fx: &Fixture, top: &str) -> Server {
    let path = fx.write_config(&fx.config(top, ""));
    let server = Server::spawn_under(
        &WITHOUT_PTRACE,
        &["serve", "--config", path.to_str().unwrap()],
    );
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    server
}

/// Nice values of every thread of `pid`, by thread name.
fn thread_nice(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let stat = std::fs::read_to_string(t.join("stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        // Field 19 of stat(5); `after` starts at field 3.
        let nice = after.split_whitespace().nth(16).unwrap().parse().unwrap();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap();
        out.push((comm.trim().to_string(), nice));
    }
    out
}

/// The key server runs at a lower nice value, lanes included, so that a
/// worker woken by the network does not preempt a signature under way on
/// the core they share; the serving process keeps its own.
#[test]
fn the_key_server_signs_at_a_higher_priority_than_the_workers() {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config("", ""));
    // A full handshake opens the worker's lane (a thread of its own).
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    let (_, ks) = key_processes(&server);
    let deadline = Instant::now() + Duration::from_secs(5);
    let threads = loop {
        let t = thread_nice(ks);
        if t.iter().any(|(name, _)| name == "key-lane") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        threads.iter().any(|(name, _)| name == "key-lane"),
        "no lane: {threads:?}"
    );
    assert!(
        threads.iter().all(|(_, nice)| *nice == -5),
        "key server: {threads:?}"
    );
    // As the test runs (a niced test run starts the server niced too).
    let ours = thread_nice(std::process::id())[0].1;
    let serving = thread_nice(server.pid());
    assert!(
        serving.iter().all(|(_, nice)| *nice == ours),
        "serving process: {serving:?}, ours {ours}"
    );
}

/// The key server is not dumpable from its start: a process of its own
/// user (root here) without CAP_SYS_PTRACE cannot open its memory, and a
/// crash writes no core file with its keys. Neither is the serving process
/// (ticket keys, traffic secrets), which stays root here, where the
/// kernel's own clearing at a change of uid does not apply. The key
/// supervisor, which holds no key and is left dumpable, shows that the
/// same reader opens a dumpable one. Both used to be open to that reader.
#[test]
fn the_key_server_and_the_serving_process_are_not_dumpable() {
    let fx = Fixture::new();
    let server = start_without_ptrace(&fx, "");
    let (sup, ks) = key_processes(&server);
    for pid in [server.pid(), sup, ks] {
        assert_eq!(status_field(pid, None, "Uid"), "0\t0\t0\t0", "{pid}");
    }
    open_memory_without_ptrace(sup).expect("a dumpable root process is open to the reader");
    for (who, pid) in [("key server", ks), ("serving process", server.pid())] {
        let refused = open_memory_without_ptrace(pid).expect_err(who);
        assert!(refused.contains("Permission denied"), "{who}: {refused}");
    }
    // Still signing, still serving.
    fetch(server.addr, "localhost", &rustls::version::TLS12).unwrap();
    assert!(!server.log().contains("core_dumps"), "{}", server.log());
}

/// `server.core_dumps = true` makes the serving process dumpable again
/// after it drops its privileges (an operator chasing a crash), and says
/// so; the key server stays not dumpable.
#[test]
fn core_dumps_make_the_serving_process_dumpable_but_never_the_key_server() {
    let fx = Fixture::new();
    let server = start_without_ptrace(&fx, "[server]\ncore_dumps = true\n");
    let (_, ks) = key_processes(&server);
    open_memory_without_ptrace(server.pid()).expect("core_dumps: the serving process is dumpable");
    let refused = open_memory_without_ptrace(ks).expect_err("the key server");
    assert!(refused.contains("Permission denied"), "{refused}");
    server.wait_log(
        "server.core_dumps: the serving process is dumpable",
        Duration::from_secs(5),
    );
}

/// With `server.user`, an upstream's client key, its CA bundle and a
/// listener's `client_ca` readable by root only: a request through the
/// mTLS pool works, a SIGHUP is accepted (the key process reads the files
/// at every load; the network process, nobody by then, cannot), a request
/// still works after, and the upstream client key is in the key server's
/// memory, never in the network-facing process's.
#[test]
fn root_only_upstream_client_keys_sign_in_the_key_process_across_reloads() {
    use common::upstream::{make_leaf, pool, route, upstream_tls, Upstream};
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        status_field(std::process::id(), None, "Uid")
            .split_whitespace()
            .next(),
        Some("0"),
        "this test starts tlsgate as root to see it switch to nobody; run the tests as root"
    );
    let fx = Fixture::new();
    let dir = fx.path();
    // nobody reads the configuration and the site (as on a reload), not
    // the keys and the CA bundles.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = common::make_ca("upstream CA");
    let ca_pem = dir.join("up-ca.pem");
    std::fs::write(&ca_pem, ca.0.pem()).unwrap();
    let (srv_cert, srv_key, _, _) =
        make_leaf(dir, "upstream", &["app.internal", "127.0.0.1"], false, &ca);
    let (_, _, client_crt, client_key) =
        make_leaf(dir, "tlsgate-client", &["tlsgate.internal"], true, &ca);
    for p in [&ca_pem, &client_key, &fx.cert.key] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mtls = Upstream::start("mtls", Some(upstream_tls(&srv_cert, &srv_key, Some(&ca.0))));
    let keys = format!(
        "tls = true\nca = {ca_pem:?}\nsni = \"app.internal\"\nclient_cert = {client_crt:?}\nclient_key = {client_key:?}\nmax_idle = 0"
    );
    let pools = pool("mtls", &[(mtls.address(), 1)], &keys, "");
    // The listener asks for client certificates against the same bundle.
    let listener = format!(
        "client_auth = \"optional\"\nclient_ca = {ca_pem:?}\n{}",
        route("/", "mtls", "")
    );
    let top = format!(
        "[server]\nworkers = 2\nuser = \"nobody\"\n{}\n{pools}",
        common::upstream::NO_RATE_LIMIT
    );
    let server = Server::start(&fx, &fx.config(&top, &listener));
    let get_id = || {
        let mut s = tls_connect(server.addr);
        common::upstream::get(&mut s, "/id", "Connection: close\r\n").unwrap()
    };
    let r = get_id();
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(common::upstream::body_text(&r), "mtls");
    server.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("reloaded configuration") {
        assert!(
            !server.log().contains("reload refused"),
            "the reload as nobody was refused: {}",
            server.log()
        );
        assert!(Instant::now() < deadline, "no reload: {}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A new generation, new pools: a new handshake signs again.
    for _ in 0..3 {
        let r = get_id();
        assert_eq!(r.status, 200, "{}", r.head);
    }
    assert!(mtls.conns.load(std::sync::atomic::Ordering::Relaxed) >= 4);
    held_by_the_key_server_only(&server, &needles(&client_key));
}

/// Asserts that none of `wanted` is in the network-facing process's memory
/// and that the key server holds an EC scalar of them; what the key server
/// holds, for further checks.
fn held_by_the_key_server_only(server: &Server, wanted: &[(String, Vec<u8>)]) -> Vec<String> {
    let (_, ks) = key_processes(server);
    let in_network = search_memory(server.pid(), wanted);
    assert!(
        in_network.is_empty(),
        "key material in the network-facing process: {in_network:?}"
    );
    let in_keys = search_memory(ks, wanted);
    assert!(
        in_keys.iter().any(|n| n.starts_with("ec scalar")),
        "the key server does not hold the key: {in_keys:?}"
    );
    in_keys
}

/// An upstream pool whose server asks for tlsgate's client certificate,
/// and tlsgate (one worker, `key_timeout` and `connect_timeout` 20 s) in
/// front of it: `/id` goes upstream, every request over a new upstream
/// connection (`max_idle = 0`) with a full handshake (no resumption), so
/// every one signs; the rest is files.
fn behind_an_mtls_upstream(fx: &Fixture, upstream: Arc<rustls::ServerConfig>) -> Server {
    use common::upstream::{pool, route};
    let dir = fx.path();
    let up = common::upstream::Upstream::start("mtls", Some(upstream));
    let keys = format!(
        "tls = true\nca = {:?}\nsni = \"app.internal\"\nclient_cert = {:?}\nclient_key = {:?}\nmax_idle = 0\nsession_resumption = false\nconnect_timeout = \"20s\"",
        dir.join("up-ca.pem"),
        dir.join("tlsgate-client.crt"),
        dir.join("tlsgate-client.key"),
    );
    let pools = pool("mtls", &[(up.address(), 1)], &keys, "");
    let top = format!(
        "[server]\nworkers = 1\nkey_timeout = \"20s\"\n{}\n{pools}",
        common::upstream::NO_RATE_LIMIT
    );
    let server = Server::start(fx, &fx.config(&top, &route("/id", "mtls", "")));
    // The upstream lives as long as the test's process needs it.
    std::mem::forget(up);
    server
}

/// The upstream CA (its PEM in `up-ca.pem`) and tlsgate's client
/// certificate signed by it (`tlsgate-client.crt` and `.key`).
fn upstream_pki(fx: &Fixture) -> (rcgen::Certificate, rcgen::KeyPair) {
    let ca = common::make_ca("upstream CA");
    std::fs::write(fx.path().join("up-ca.pem"), ca.0.pem()).unwrap();
    common::upstream::make_leaf(
        fx.path(),
        "tlsgate-client",
        &["tlsgate.internal"],
        true,
        &ca,
    );
    ca
}

/// A rustls upstream configuration with `chain` and `key`, offering
/// `versions`, that requires a client certificate from `ca`.
fn mtls_upstream(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: Vec<u8>,
    ca: &rcgen::Certificate,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, PrivateKeyDer::Pkcs8(key.into()))
            .unwrap(),
    )
}

/// An upstream's request for tlsgate's client certificate does not hold
/// up the worker: with the key server stopped, a request that opens a new
/// upstream connection waits for its client signature, and meanwhile a
/// keep-alive connection on the same (only) worker gets a file at once.
/// rustls signed inside tokio-rustls' handshake poll, which blocked the
/// worker's thread until the key process answered (the kept connection's
/// read timed out); then the request completes.
#[test]
fn an_upstream_client_signature_does_not_hold_up_the_worker() {
    use common::upstream::{body_text, get, make_leaf};
    let fx = Fixture::new();
    let ca = upstream_pki(&fx);
    let (srv_cert, srv_key, _, _) = make_leaf(
        fx.path(),
        "upstream",
        &["app.internal", "127.0.0.1"],
        false,
        &ca,
    );
    let upstream = mtls_upstream(vec![srv_cert], srv_key, &ca.0, rustls::DEFAULT_VERSIONS);
    let server = behind_an_mtls_upstream(&fx, upstream);
    // Both open before, both used once (A through the pool: its key
    // server running, the client signature comes at once).
    let mut a = tls_connect(server.addr);
    let r = get(&mut a, "/id", "").unwrap();
    assert_eq!(
        (r.status, body_text(&r)),
        (200, "mtls".into()),
        "{}",
        r.head
    );
    let mut kept = tls_connect(server.addr);
    hello_answered(&mut kept).unwrap();
    let (_, ks) = key_processes(&server);
    let sig = |s: &str| {
        assert!(Command::new("kill")
            .args([s, &ks.to_string()])
            .status()
            .unwrap()
            .success());
    };
    sig("-STOP");
    let waiting = std::thread::spawn(move || {
        let r = get(&mut a, "/id", "").map_err(|e| e.to_string());
        r.map(|r| (r.status, body_text(&r)))
    });
    // Time for the upstream connection's handshake to ask for the
    // client signature.
    std::thread::sleep(Duration::from_millis(500));
    kept.sock
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let t0 = Instant::now();
    let served = hello_answered(&mut kept);
    let took = t0.elapsed();
    let still_waiting = !waiting.is_finished();
    sig("-CONT");
    served.unwrap_or_else(|e| {
        panic!("the kept connection was not answered while a client signature was awaited: {e}")
    });
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    assert!(
        still_waiting,
        "the upstream handshake did not wait for the stopped key server"
    );
    assert_eq!(waiting.join().unwrap(), Ok((200, "mtls".into())));
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// TLS 1.2 client authentication signs the whole handshake so far, the
/// upstream's certificate chain with it: an upstream whose chain is over
/// 20 KiB (a leaf with many long names), TLS 1.2 only, requiring a client
/// certificate, is reached. The key protocol carried at most 16 KiB to
/// sign, and the request was answered 502.
#[test]
fn a_tls12_upstream_with_a_large_chain_gets_its_client_signature() {
    use common::upstream::{body_text, get};
    let fx = Fixture::new();
    let ca = upstream_pki(&fx);
    let mut names: Vec<String> = vec!["app.internal".into()];
    names.extend((0..400).map(|i| format!("n{i:03}-{}.app.internal", "x".repeat(50))));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::new(names).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = p.signed_by(&key, &ca.0, &ca.1).unwrap();
    let leaf = leaf.der().clone();
    assert!(leaf.len() > 20 * 1024, "the chain is {} bytes", leaf.len());
    let upstream = mtls_upstream(
        vec![leaf],
        key.serialize_der(),
        &ca.0,
        &[&rustls::version::TLS12],
    );
    let server = behind_an_mtls_upstream(&fx, upstream);
    for _ in 0..2 {
        let mut s = tls_connect(server.addr);
        let r = get(&mut s, "/id", "Connection: close\r\n").unwrap();
        assert_eq!(r.status, 200, "{}\n{}", r.head, server.log());
        assert_eq!(body_text(&r), "mtls");
    }
}

/// A process of the test's own server stopped with SIGSTOP: continued when
/// dropped (a failed assertion included), if it is still the child of the
/// parent it had (so never a process that reused its pid).
struct Stopped {
    pid: u32,
    parent: u32,
}

impl Stopped {
    fn stop(pid: u32, parent: u32) -> Stopped {
        assert_eq!(ppid(pid), Some(parent), "{pid} is not a child of {parent}");
        signal(pid, "-STOP");
        Stopped { pid, parent }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if ppid(self.pid) == Some(self.parent) {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid.to_string()])
                .status();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// (status line's code, body) of `/healthz`.
fn healthz(server: &Server) -> (u16, String) {
    let answer = server.admin_get("/healthz");
    let code = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{answer}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

/// Full handshakes from `n` threads, one after the other each, until
/// `stop` is set: signatures keep being asked for.
fn keep_handshaking(
    addr: std::net::SocketAddr,
    n: usize,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if fetch(addr, "localhost", &rustls::version::TLS13).is_ok() {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

/// A key server that hangs (SIGSTOP: alive, answering nothing) is found out
/// by its signatures timing out (key_timeout 2 s): they are logged (once,
/// rate-limited), it is taken as hung after three key_timeouts without an
/// answer, key_up goes 0 and /healthz 503, and the supervisor kills it and
/// starts another: handshakes work again with no one's help. It used to
/// stay hung, unlogged, with key_up 1 and /healthz 200.
#[test]
fn a_hung_key_server_is_killed_and_replaced_and_healthz_fails_meanwhile() {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config("", ""));
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    assert_eq!(healthz(&server), (200, "ok\n".into()));
    let (sup, ks) = key_processes(&server);
    let stopped_at = Instant::now();
    let _stopped = Stopped::stop(ks, sup);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = keep_handshaking(server.addr, 4, &stop);
    // Watch key_up and /healthz closely: once killed, the key server is
    // replaced after the supervisor's first backoff (100 ms).
    let mut saw_key_down = None;
    let mut saw_503 = None;
    let recovered = loop {
        let elapsed = stopped_at.elapsed();
        assert!(
            elapsed < Duration::from_secs(20),
            "not recovered in 20 s:\n{}",
            server.log()
        );
        if server.metric("tlsgate_key_up") == 0.0 {
            saw_key_down.get_or_insert(elapsed);
        }
        let (code, body) = healthz(&server);
        if code == 503 {
            assert!(body.starts_with("key process "), "{body}");
            saw_503.get_or_insert(elapsed);
        }
        if saw_key_down.is_some()
            && server.metric("tlsgate_key_restarts_total") == 1.0
            && fetch(server.addr, "localhost", &rustls::version::TLS13).is_ok()
        {
            break stopped_at.elapsed();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    eprintln!(
        "key_up 0 at {saw_key_down:?}, 503 at {saw_503:?}, handshakes again at {recovered:?}"
    );
    let log = server.log();
    // What an operator reads (shown with --nocapture).
    for line in log
        .lines()
        .filter(|l| l.contains("key server") || l.contains("signature"))
    {
        eprintln!("{line}");
    }
    let down = saw_key_down.unwrap();
    // No answer for three key_timeouts (6 s) before it is taken as hung
    // (less the few ms of a signature asked just before the stop).
    assert!(down >= Duration::from_millis(5900), "{down:?}\n{log}");
    assert!(recovered < Duration::from_secs(10), "{recovered:?}\n{log}");
    assert!(saw_503.is_some(), "/healthz never 503:\n{log}");
    // The stopped one was killed, not continued: another serves.
    assert_ne!(ppid(ks), Some(sup), "{ks} still there:\n{log}");
    let (sup2, ks2) = key_processes(&server);
    assert_eq!(sup2, sup);
    assert_ne!(ks2, ks);
    let warnings = log.matches("timed out since the last warning").count();
    assert_eq!(warnings, 1, "one warning per 10 s:\n{log}");
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("taking it as hung"), "{log}");
    assert!(
        log.contains(&format!("killing the key server (pid {ks})")),
        "{log}"
    );
    assert!(log.contains("key server restarted and connected"), "{log}");
    assert_eq!(server.metric("tlsgate_key_up"), 1.0);
    assert_eq!(healthz(&server), (200, "ok\n".into()));
    assert!(server.metric("tlsgate_key_failures_total{reason=\"timeout\"}") >= 3.0);
    assert!(!log.contains("panicked"), "{log}");
}

/// While a key server is taken as hung and not yet replaced (its
/// supervisor held too, so the state lasts), /healthz says why and key_up
/// is 0; once the supervisor runs it kills the hung one and the next one
/// serves: /healthz 200, key_up 1.
#[test]
fn healthz_says_hung_until_the_hung_key_server_is_replaced() {
    let fx = Fixture::new();
    let server = Server::start(&fx, &fx.config("[server]\nkey_timeout = \"1s\"\n", ""));
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    let (sup, ks) = key_processes(&server);
    let held = Stopped::stop(sup, server.pid());
    let _stopped = Stopped::stop(ks, sup);
    let stopped_at = Instant::now();
    // One handshake at a time: 1 s each, the third after 3 s is the one.
    loop {
        assert!(
            fetch(server.addr, "localhost", &rustls::version::TLS13).is_err(),
            "a stopped key server signed"
        );
        if healthz(&server).0 == 503 {
            break;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(10),
            "not taken as hung:\n{}",
            server.log()
        );
    }
    let hung_after = stopped_at.elapsed();
    assert!(hung_after >= Duration::from_secs(3), "{hung_after:?}");
    // It stays so while nothing replaces it.
    for _ in 0..5 {
        assert_eq!(
            healthz(&server),
            (503, "key process hung (being restarted)\n".into())
        );
        assert_eq!(server.metric("tlsgate_key_up"), 0.0);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server.log().contains("ERROR"), "{}", server.log());
    drop(held);
    let continued = Instant::now();
    while fetch(server.addr, "localhost", &rustls::version::TLS13).is_err() {
        assert!(
            continued.elapsed() < Duration::from_secs(5),
            "not replaced:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "hung after {hung_after:?}; serving {:?} after the supervisor ran",
        continued.elapsed()
    );
    assert_ne!(ppid(ks), Some(sup));
    assert_eq!(healthz(&server), (200, "ok\n".into()));
    assert_eq!(server.metric("tlsgate_key_up"), 1.0);
    assert_eq!(server.metric("tlsgate_key_restarts_total"), 1.0);
}

/// A key server restarted while the configuration file on disk holds a bad
/// edit (not applied: no SIGHUP) cannot load and signs nothing: it is
/// replaced again with the supervisor's backoff, /healthz says 503 and
/// key_up 0 meanwhile, and once the file is fixed the next one serves,
/// without a SIGHUP. It used to be kept, failing every full handshake until
/// a SIGHUP.
#[test]
fn a_key_server_that_cannot_load_is_replaced_until_the_file_is_fixed() {
    let fx = Fixture::new();
    let good = fx.config("", "");
    let server = Server::start(&fx, &good);
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    let (sup, ks) = key_processes(&server);
    let path = fx.path().join("tlsgate.toml");
    std::fs::write(&path, format!("{good}\n[[listener.certificate]]\ncert = \"/nonexistent.pem\"\nkey = \"/nonexistent.key\"\n")).unwrap();
    assert_eq!(ppid(ks), Some(sup));
    signal(ks, "-KILL");
    server.wait_log("restarted key server unusable", Duration::from_secs(10));
    let broken_at = Instant::now();
    // Replaced again and again (backoff 200 ms, 400 ms, ...), each unusable.
    while server
        .log()
        .matches("restarted key server unusable")
        .count()
        < 3
    {
        assert!(
            broken_at.elapsed() < Duration::from_secs(10),
            "{}",
            server.log()
        );
        assert_eq!(healthz(&server), (503, "key process down\n".into()));
        assert_eq!(server.metric("tlsgate_key_up"), 0.0);
        assert!(fetch(server.addr, "localhost", &rustls::version::TLS13).is_err());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&path, &good).unwrap();
    let fixed = Instant::now();
    while fetch(server.addr, "localhost", &rustls::version::TLS13).is_err() {
        assert!(
            fixed.elapsed() < Duration::from_secs(15),
            "not serving after the fix:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("serving {:?} after the fix", fixed.elapsed());
    assert_eq!(healthz(&server), (200, "ok\n".into()));
    assert_eq!(server.metric("tlsgate_key_up"), 1.0);
    assert!(
        !server.log().contains("reload"),
        "no SIGHUP, no reload:\n{}",
        server.log()
    );
}

/// `openssl s_client` against `addr` with `args` and nothing to send,
/// killed after 10 s: what it printed, standard error first.
fn s_client_says(addr: std::net::SocketAddr, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args(["10", "openssl", "s_client", "-connect", &addr.to_string()])
        .args(["-servername", "localhost"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("timeout and openssl must be installed (./dev setup installs openssl)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

/// The fatal alert a client reads when its handshake's signature fails.
fn assert_internal_error_alert(said: &str, what: &str) {
    assert!(
        said.contains("alert internal error") && said.contains("SSL alert number 80"),
        "{what}: no internal_error alert:\n{said}"
    );
    assert!(!said.contains("unexpected eof"), "{what}: cut off:\n{said}");
}

/// A handshake whose signature the key process does not give ends in a
/// fatal internal_error alert the client reads, not in a closed stream:
/// over TLS 1.3 and 1.2 (openssl) and after a HelloRetryRequest (rustls),
/// when the key server is stopped (the signature times out) and when it is
/// gone (down). It used to end in a bare close, after the ServerHello
/// alone over TLS 1.3 ("unexpected eof" in openssl).
#[test]
fn a_signature_the_key_process_does_not_give_ends_the_handshake_with_internal_error() {
    let fx = Fixture::new();
    let top = "[server]\nkey_timeout = \"1s\"\n\n[tls]\nkey_exchange_groups = [\"X25519\", \"secp256r1\"]\n";
    let server = Server::start(&fx, &fx.config(top, ""));
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();
    let (sup, ks) = key_processes(&server);

    // One signature timing out: not enough to take the key server as hung.
    {
        let _stopped = Stopped::stop(ks, sup);
        let said = s_client_says(server.addr, &["-tls1_3"]);
        assert_internal_error_alert(&said, "TLS 1.3, key server stopped");
    }
    fetch(server.addr, "localhost", &rustls::version::TLS13).unwrap();

    // No key server (its supervisor held, so none comes back meanwhile).
    let held = Stopped::stop(sup, server.pid());
    signal(ks, "-KILL");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("tlsgate_key_up") != 0.0 {
        assert!(Instant::now() < deadline, "key_up stayed 1");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (args, what) in [
        (["-tls1_3"], "TLS 1.3, down"),
        (["-tls1_2"], "TLS 1.2, down"),
    ] {
        assert_internal_error_alert(&s_client_says(server.addr, &args), what);
    }
    let retried = full_handshake(server.addr, true).unwrap_err();
    assert!(
        retried.contains("received fatal alert: InternalError"),
        "after a HelloRetryRequest: {retried}"
    );
    assert_key_failures(&server, 4, &[("timeout", 1), ("down", 3)]);

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetch(server.addr, "localhost", &rustls::version::TLS13).is_err() {
        assert!(Instant::now() < deadline, "no recovery:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!server.log().contains("panicked"), "{}", server.log());
}
