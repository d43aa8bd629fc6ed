//! Test harness: runs the real `tlsgate` binary on free ports with a
//! generated site and certificates, and talks to it with real peers
//! (curl, openssl s_client, a rustls client, raw TCP).
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

pub mod upstream;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};

pub const HELLO: &str = "hello from the test site\n";

/// A key pair written as PEM files.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

/// Writes a self-signed certificate for `names` with the given algorithm.
pub fn make_cert(
    dir: &Path,
    stem: &str,
    names: &[&str],
    alg: &'static rcgen::SignatureAlgorithm,
) -> CertFiles {
    let key = rcgen::KeyPair::generate_for(alg).unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let c = dir.join(format!("{stem}.crt"));
    let k = dir.join(format!("{stem}.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    CertFiles {
        cert: c,
        key: k,
        der: cert.der().to_vec(),
    }
}

/// A CA certificate (ECDSA P-256) named `name`, and its key.
pub fn make_ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

/// A temporary directory with a site, a default ECDSA certificate for
/// localhost, and a secret file outside the site.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub cert: CertFiles,
    pub big: Vec<u8>,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("site");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("hello.txt"), HELLO).unwrap();
        std::fs::write(root.join("index.html"), "<h1>index</h1>\n").unwrap();
        std::fs::write(root.join("sub/index.html"), "<p>sub</p>\n").unwrap();
        // 1 MiB + 7: not a multiple of any buffer size.
        let big: Vec<u8> = (0..(1usize << 20) + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        std::fs::write(root.join("big.bin"), &big).unwrap();
        std::fs::write(dir.path().join("secret.txt"), "TOP SECRET\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("escape.txt")).unwrap();
        std::os::unix::fs::symlink("hello.txt", root.join("inside-link.txt")).unwrap();
        let cert = make_cert(
            dir.path(),
            "localhost",
            &["localhost"],
            &rcgen::PKCS_ECDSA_P256_SHA256,
        );
        Fixture {
            dir,
            root,
            cert,
            big,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A complete config: `top` (any of [server], [limits], [tls],
    /// [access_log]) then the admin and one listener with the default cert,
    /// then `listener_extra` (more [[listener.certificate]] tables).
    pub fn config(&self, top: &str, listener_extra: &str) -> String {
        format!(
            "{top}\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = {root:?}\n\n[[listener.certificate]]\ncert = {cert:?}\nkey = {key:?}\n{listener_extra}\n",
            root = self.root,
            cert = self.cert.cert,
            key = self.cert.key,
        )
    }

    pub fn write_config(&self, text: &str) -> PathBuf {
        let p = self.path().join("tlsgate.toml");
        std::fs::write(&p, text).unwrap();
        p
    }
}

/// A running tlsgate.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub stderr: Arc<Mutex<String>>,
    pub stdout: Arc<Mutex<String>>,
}

fn pump(stream: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            into.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tlsgate")
}

/// Runs `tlsgate ARGS`, killed if it takes over 5 s (on /dev/zero it
/// once read until the OOM killer came, on a FIFO it waited forever);
/// exit code, stderr.
pub fn tlsgate_within_5s(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("tlsgate {args:?} still running after 5 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tlsgate check-config CONFIG`, which must pass.
pub fn check_config_passes(config: &Path) {
    let out = Command::new(bin())
        .arg("check-config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `check-config` and `serve` on `config`: each must refuse it with exit
/// 2, before listening. Their error output, in that order.
pub fn refused_by_check_config_and_serve(config: &Path) -> [(&'static str, String); 2] {
    ["check-config", "serve"].map(|cmd| {
        let mut c = Command::new(bin());
        c.arg(cmd);
        if cmd == "serve" {
            c.arg("--config");
        }
        let out = c.arg(config).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(!err.contains("listening on"), "{cmd}: {err}");
        (cmd, err)
    })
}

impl Server {
    /// Starts `tlsgate serve --config FILE` and waits until it listens.
    pub fn start(fixture: &Fixture, config: &str) -> Server {
        let path = fixture.write_config(config);
        Server::spawn(&["serve", "--config", path.to_str().unwrap()])
    }

    pub fn spawn(args: &[&str]) -> Server {
        Server::spawn_under(&[], args)
    }

    /// Like `spawn`, with tlsgate run by `wrapper` (a program and its
    /// arguments that execs the rest, e.g. `setpriv ...`).
    pub fn spawn_under(wrapper: &[&str], args: &[&str]) -> Server {
        Server::spawn_full(wrapper, args, None)
    }

    /// Like `spawn`, with standard output (the access log's "stdout")
    /// going to `stdout` instead of the test's pipe.
    pub fn spawn_with_stdout(args: &[&str], stdout: Stdio) -> Server {
        Server::spawn_full(&[], args, Some(stdout))
    }

    fn spawn_full(wrapper: &[&str], args: &[&str], stdout: Option<Stdio>) -> Server {
        let own_stdout = stdout.is_none();
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let mut child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(stdout.unwrap_or_else(Stdio::piped))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        pump(child.stderr.take().unwrap(), stderr.clone());
        if own_stdout {
            pump(child.stdout.take().unwrap(), stdout.clone());
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = stderr.lock().unwrap().clone();
            let addr = find_after(&text, "listening on https://");
            let admin = find_after(&text, "admin listening on http://");
            let admin_wanted = !args
                .windows(2)
                .any(|w| w[0] == "--admin" && w[1].is_empty());
            if let Some(addr) = addr {
                if admin.is_some() || !admin_wanted {
                    return Server {
                        child,
                        addr,
                        admin,
                        stderr,
                        stdout,
                    };
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("tlsgate exited with {status} before listening:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "tlsgate did not start within 20 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name ("HUP", "TERM").
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Whether the process has not exited yet.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "tlsgate did not exit within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the server's log contains `needle`.
    pub fn wait_log(&self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn access_log(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits up to 5 s for an access-log line holding every needle (the
    /// writer thread logs after the client has its answer); that line.
    pub fn wait_access_line(&self, needles: &[&str]) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.access_log();
            if let Some(line) = log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
                return line.to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needles:?} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` on the admin listener; the whole response.
    pub fn admin_get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(self.admin.expect("admin listener")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Polls the metrics until `pred` holds for the text (the server counts
    /// a handshake after the client may already have moved on).
    pub fn metrics_when(&self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = self.admin_get("/metrics");
            if pred(&text) || Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls the metrics until they contain `line`; panics if they never do.
    pub fn expect_metric_line(&self, line: &str) -> String {
        let text = self.metrics_when(|t| t.contains(line));
        assert!(text.contains(line), "wanted {line:?} in\n{text}");
        text
    }

    /// The value of a metric sample line (exact name with labels).
    pub fn metric(&self, sample: &str) -> f64 {
        let text = self.admin_get("/metrics");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(sample)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0.0)
    }

    /// Runs curl against this server, resolving localhost to its address;
    /// over HTTP/1.1 unless `args` say `--http2`.
    pub fn curl(&self, args: &[&str]) -> Output {
        let resolve = format!("localhost:{}:127.0.0.1", self.addr.port());
        Command::new("curl")
            .args([
                "-sS",
                "-k",
                "--http1.1",
                "--max-time",
                "20",
                "--resolve",
                &resolve,
            ])
            .args(args)
            .output()
            .expect("curl must be installed (./dev setup installs it)")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_after(text: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let end = rest.find(|c: char| c == '/' || c.is_whitespace())?;
    rest[..end].parse().ok()
}

/// Runs `openssl s_client` against `addr` (SNI localhost) with `args`,
/// writes `request` to it and waits for it to end; its output.
pub fn s_client(addr: SocketAddr, args: &[&str], request: &[u8]) -> Output {
    let connect = addr.to_string();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &connect, "-servername", "localhost"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl must be installed (./dev setup installs it)");
    child.stdin.take().unwrap().write_all(request).unwrap();
    child.wait_with_output().unwrap()
}

/// Accepts any certificate: these tests check what the server sends, not
/// its trust (it is self-signed).
#[derive(Debug)]
pub struct NoVerify;

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

pub fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// A rustls client config that accepts any server certificate.
pub fn client_config(versions: &[&'static rustls::SupportedProtocolVersion]) -> ClientConfig {
    let mut c = ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c
}

pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// Connects with rustls to the server under `sni`, completing the handshake.
pub fn tls_connect_with(
    addr: SocketAddr,
    sni: &str,
    config: ClientConfig,
) -> Result<TlsStream, std::io::Error> {
    tls_connect_shared(addr, sni, Arc::new(config))
}

/// Like [`tls_connect_with`], sharing the config (and so its session
/// store) between connections, for resumption.
pub fn tls_connect_shared(
    addr: SocketAddr,
    sni: &str,
    config: Arc<ClientConfig>,
) -> Result<TlsStream, std::io::Error> {
    let sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn =
        ClientConnection::new(config, ServerName::try_from(sni.to_string()).unwrap()).unwrap();
    let mut s = StreamOwned::new(conn, sock);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

pub fn tls_connect(addr: SocketAddr) -> TlsStream {
    tls_connect_with(addr, "localhost", client_config(rustls::DEFAULT_VERSIONS)).unwrap()
}

/// Sends raw bytes over TLS and reads everything until the server closes.
pub fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = tls_connect(addr);
    s.write_all(request).unwrap();
    s.flush().unwrap();
    read_to_close(&mut s)
}

/// Reads until close (clean or not) or a 10 s read timeout.
pub fn read_to_close(s: &mut TlsStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Status codes of every response in a (possibly pipelined) answer.
pub fn statuses(answer: &str) -> Vec<u16> {
    answer
        .match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| answer.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

/// True if the peer closes (EOF or reset) within `limit`; data before the close is skipped.
pub fn closed_within<R: Read>(s: &mut R, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A TCP connection from a chosen loopback source address.
pub fn connect_from(source: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&format!("{source}:0").parse::<SocketAddr>().unwrap().into())?;
    sock.connect(&to.into())?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    Ok(s)
}

/// A completed rustls handshake from a chosen loopback source address.
pub fn tls_from(source: &str, to: SocketAddr) -> std::io::Result<TlsStream> {
    let sock = connect_from(source, to)?;
    let conn = ClientConnection::new(
        Arc::new(client_config(rustls::DEFAULT_VERSIONS)),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut s = StreamOwned::new(conn, sock);
    s.sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    s.sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    Ok(s)
}

/// What became of a handshake attempt.
pub enum Attempt {
    /// Closed by the server before it sent anything: no ServerHello.
    Refused,
    /// The handshake completed.
    Completed(Box<TlsStream>),
}

/// Connects from `source`, sends a ClientHello and tells whether the server
/// answered it (and the handshake completed) or closed without a byte.
/// Errors are connect failures, timeouts and broken handshakes.
pub fn attempt_from(
    source: &str,
    to: SocketAddr,
    config: &Arc<ClientConfig>,
) -> std::io::Result<Attempt> {
    let mut sock = connect_from(source, to)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut conn =
        ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap();
    // The server may already have closed: a failed write shows in the read.
    while conn.wants_write() {
        if conn.write_tls(&mut sock).is_err() {
            break;
        }
    }
    let mut buf = vec![0u8; 16384];
    let n = match sock.read(&mut buf) {
        Ok(0) => return Ok(Attempt::Refused),
        Ok(n) => n,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            return Ok(Attempt::Refused)
        }
        Err(e) => return Err(e),
    };
    assert_eq!(
        buf[0], 0x16,
        "the server's first record is not a handshake record"
    );
    let mut rd = &buf[..n];
    while !rd.is_empty() {
        conn.read_tls(&mut rd)?;
        conn.process_new_packets().map_err(std::io::Error::other)?;
    }
    let mut s = StreamOwned::new(conn, sock);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    // The client's Finished may still be queued: the server's handshake
    // ends only when it has it.
    while s.conn.wants_write() {
        s.conn.write_tls(&mut s.sock)?;
    }
    Ok(Attempt::Completed(Box::new(s)))
}

/// Runs the h2spec conformance suite (`--strict`, over TLS) against the
/// server on `port`, requesting `path`; asserts that every case passed and
/// returns h2spec's report.
pub fn h2spec_strict_passes(port: u16, path: &str) -> String {
    let bin = ["h2spec", "/usr/local/bin/h2spec", "/root/go/bin/h2spec"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok())
        .expect("h2spec must be installed (./dev setup installs it with go install)");
    let out = Command::new(bin)
        .args(["--strict", "--tls", "--insecure", "--timeout", "5"])
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--path",
            path,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
    text
}

/// The system calls of the server process (every thread) that strace saw
/// while `work` ran, selected by strace's `-e` expressions `filters`
/// (e.g. `trace=recvfrom`, `status=failed`): one line each.
pub fn traced_calls(fx: &Fixture, filters: &[&str], pid: u32, work: impl FnOnce()) -> Vec<String> {
    let out = fx.path().join("strace.out");
    let mut tracer = Command::new("strace");
    tracer.args(["-f", "-qq"]);
    for f in filters {
        tracer.args(["-e", f]);
    }
    let mut tracer = tracer
        .arg("-o")
        .arg(&out)
        .args(["-p", &pid.to_string()])
        .spawn()
        .expect("strace (./dev setup installs it)");
    // strace has attached once every thread shows it as its tracer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let traced = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                let status =
                    std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default();
                status
                    .lines()
                    .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
            })
    };
    while !traced() {
        assert!(Instant::now() < deadline, "strace did not attach in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    work();
    std::thread::sleep(Duration::from_millis(200));
    let ok = Command::new("kill")
        .args(["-INT", &tracer.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT strace failed");
    tracer.wait().unwrap();
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        // Calls, not strace's notes (signals, exits).
        .filter(|l| l.contains('('))
        .map(str::to_owned)
        .collect()
}

/// Polls `path` until a line holds `needle`; the whole file.
pub fn wait_file_line(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.contains(needle)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
