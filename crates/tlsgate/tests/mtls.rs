//! Mutual TLS per name: a client certificate signed by the configured CA
//! is accepted and its identity logged; an unknown, an expired and a
//! missing one are refused with their alerts (curl, openssl s_client and a
//! rustls client); `optional` serves clients without one; resumed sessions
//! keep the identity and never cross to a stricter policy, even after a
//! reload; a broken CA bundle is refused by check-config.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, HandshakeKind};

/// A client certificate on disk and in memory.
struct ClientCert {
    cert: PathBuf,
    key: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

/// The configured client CA and clients: `good` (signed by it), `rogue`
/// (signed by another CA), `expired` (by the right CA, out of date).
struct Pki {
    ca: PathBuf,
    good: ClientCert,
    rogue: ClientCert,
    expired: ClientCert,
}

fn make_client(
    dir: &Path,
    stem: &str,
    cn: &str,
    ca: &(rcgen::Certificate, rcgen::KeyPair),
    expired: bool,
) -> ClientCert {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::new(vec![format!("{cn}.internal")]).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    if expired {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
    let c = dir.join(format!("{stem}.crt"));
    let k = dir.join(format!("{stem}.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    ClientCert {
        cert: c,
        key: k,
        chain: vec![cert.der().clone()],
        key_der: key.serialize_der(),
    }
}

fn pki(dir: &Path) -> Pki {
    let ca = common::make_ca("tlsgate test client CA");
    let other = common::make_ca("someone else's CA");
    let ca_path = dir.join("client-ca.pem");
    std::fs::write(&ca_path, ca.0.pem()).unwrap();
    Pki {
        ca: ca_path,
        good: make_client(dir, "good", "svc-a", &ca, false),
        rogue: make_client(dir, "rogue", "svc-rogue", &other, false),
        expired: make_client(dir, "expired", "svc-old", &ca, true),
    }
}

/// Certificate entries serving the fixture's certificate under
/// `secure.test` (client certificate required) and `opt.test` (optional).
fn mtls_entries(fx: &Fixture, ca: &Path, opt_mode: &str) -> String {
    format!(
        "[[listener.certificate]]\ncert = {c:?}\nkey = {k:?}\nnames = [\"secure.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\n\n\
         [[listener.certificate]]\ncert = {c:?}\nkey = {k:?}\nnames = [\"opt.test\"]\nclient_auth = {opt_mode:?}\nclient_ca = {ca:?}\n",
        c = fx.cert.cert,
        k = fx.cert.key,
    )
}

fn curl_as(server: &Server, name: &str, client: Option<&ClientCert>, extra: &[&str]) -> Output {
    let resolve = format!("{name}:{}:127.0.0.1", server.addr.port());
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "20", "--resolve", &resolve]);
    if let Some(c) = client {
        cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
    }
    cmd.args(extra)
        .arg(format!("https://{name}:{}/hello.txt", server.addr.port()))
        .output()
        .expect("curl must be installed (./dev setup installs it)")
}

/// openssl s_client to `name`, sending one request; all it printed.
fn s_client(server: &Server, name: &str, client: Option<&ClientCert>, version: &str) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect"])
        .arg(server.addr.to_string())
        .args(["-servername", name, version, "-ign_eof"]);
    if let Some(c) = client {
        cmd.arg("-cert").arg(&c.cert).arg("-key").arg(&c.key);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl must be installed (./dev setup installs it)");
    // TLS 1.3 refusals arrive after the client's Finished: give the
    // server's alert time to land before the request goes out.
    std::thread::sleep(Duration::from_millis(300));
    let _ = write!(
        child.stdin.take().unwrap(),
        "GET /hello.txt HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"
    );
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits up to 5 s for the access log to hold `n` lines that `keep` selects
/// (the writer thread logs after the client has its answer); those lines.
fn wait_log<T>(server: &Server, n: usize, keep: impl Fn(&str) -> Option<T>) -> Vec<T> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<T> = server.access_log().lines().filter_map(&keep).collect();
        if lines.len() >= n || std::time::Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_log_lines(server: &Server, sni: &str, n: usize) -> Vec<serde_json::Value> {
    wait_log(server, n, |l| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .filter(|v| v["sni"] == sni)
    })
}

#[test]
fn required_name_accepts_its_ca_and_refuses_unknown_expired_and_none() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let config = fx.config(
        "[access_log]\nformat = \"json\"\n",
        &mtls_entries(&fx, &p.ca, "optional"),
    );
    let server = Server::start(&fx, &config);

    // Signed by the configured CA: served, over TLS 1.3 and 1.2.
    for v in ["--tlsv1.3", "--tlsv1.2"] {
        let ok = curl_as(&server, "secure.test", Some(&p.good), &[v]);
        assert!(
            ok.status.success(),
            "{v}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&ok.stdout), HELLO);
    }
    let lines = wait_log_lines(&server, "secure.test", 2);
    assert_eq!(lines.len(), 2, "{}", server.access_log());
    for l in &lines {
        assert_eq!(l["status"], 200);
        let subject = l["client"]["subject"].as_str().unwrap();
        assert!(subject.contains("CN=svc-a"), "{l}");
        assert_eq!(l["client"]["sans"][0], "DNS:svc-a.internal", "{l}");
        assert_eq!(l["client"]["sha256"].as_str().unwrap().len(), 64, "{l}");
    }

    // No certificate: refused, with certificate_required on TLS 1.3.
    let none = curl_as(&server, "secure.test", None, &["--tlsv1.3"]);
    assert!(!none.status.success());
    let out = s_client(&server, "secure.test", None, "-tls1_3");
    assert!(out.contains("certificate required"), "{out}");
    assert!(!out.contains(HELLO.trim()), "{out}");
    let out = s_client(&server, "secure.test", None, "-tls1_2");
    assert!(out.contains("alert"), "{out}");
    assert!(!out.contains(HELLO.trim()), "{out}");

    // Another CA's certificate: unknown_ca. An expired one: certificate_expired.
    for v in ["-tls1_3", "-tls1_2"] {
        let out = s_client(&server, "secure.test", Some(&p.rogue), v);
        assert!(out.contains("unknown ca"), "{v}: {out}");
        assert!(!out.contains(HELLO.trim()), "{out}");
        let out = s_client(&server, "secure.test", Some(&p.expired), v);
        assert!(out.contains("certificate expired"), "{v}: {out}");
        assert!(!out.contains(HELLO.trim()), "{out}");
    }
    let rogue = curl_as(&server, "secure.test", Some(&p.rogue), &[]);
    assert!(!rogue.status.success());

    // The name without client authentication still serves anyone, and
    // its log lines name no client.
    let plain = curl_as(&server, "localhost", None, &[]);
    assert!(plain.status.success());
    let lines = wait_log_lines(&server, "localhost", 1);
    assert!(lines[0]["client"].is_null(), "{}", lines[0]);
    // No refused request was logged (n = 0: the lines there now; the
    // plain request above was logged after them).
    assert_eq!(wait_log_lines(&server, "secure.test", 0).len(), 2);

    let text = server.expect_metric_line(
        "tlsgate_handshake_failures_total{reason=\"client_certificate_missing\"}",
    );
    assert!(
        text.contains("reason=\"client_certificate_invalid\""),
        "{text}"
    );
}

#[test]
fn optional_name_serves_without_a_certificate_and_identifies_with_one() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let config = fx.config(
        "[access_log]\nformat = \"combined\"\n",
        &mtls_entries(&fx, &p.ca, "optional"),
    );
    let server = Server::start(&fx, &config);
    let anon = curl_as(&server, "opt.test", None, &[]);
    assert!(anon.status.success(), "{anon:?}");
    let named = curl_as(&server, "opt.test", Some(&p.good), &[]);
    assert!(named.status.success(), "{named:?}");
    assert_eq!(String::from_utf8_lossy(&named.stdout), HELLO);
    // A certificate that is presented must still verify.
    let out = s_client(&server, "opt.test", Some(&p.rogue), "-tls1_3");
    assert!(out.contains("unknown ca"), "{out}");

    // Combined format: the certificate's name is the user field.
    let lines = wait_log(&server, 2, |l| Some(l.to_string()));
    let log = server.access_log();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].starts_with("127.0.0.1 - - ["), "{log}");
    assert!(lines[1].starts_with("127.0.0.1 - svc-a ["), "{log}");
}

/// A request whose Host names another client certificate policy than the
/// handshake's SNI gets 421 over HTTP/1.1 and h2, whatever route or root
/// its Host would take: a client without a certificate cannot reach a
/// name that requires one by sending the other name's SNI, or none.
#[test]
fn a_host_under_another_client_auth_policy_is_misdirected() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let secret_root = fx.path().join("secret");
    std::fs::create_dir_all(&secret_root).unwrap();
    std::fs::write(secret_root.join("hello.txt"), "secret\n").unwrap();
    let extra = format!(
        "[[listener.certificate]]\ncert = {c:?}\nkey = {k:?}\nnames = [\"secure.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\n\n\
         [[listener.certificate]]\ncert = {c:?}\nkey = {k:?}\nnames = [\"open.test\"]\n\n\
         [[listener.certificate]]\ncert = {c:?}\nkey = {k:?}\nnames = [\"*.corp.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\n\n\
         [[listener.route]]\nhost = \"secure.test\"\nroot = {secret_root:?}\n\n\
         [[listener.route]]\nhost = \"*.corp.test\"\nroot = {secret_root:?}\n",
        c = fx.cert.cert,
        k = fx.cert.key,
        ca = p.ca,
    );
    let server = Server::start(&fx, &fx.config("", &extra));
    let status = |sni: &str, client: Option<&ClientCert>, host: &str, extra: &[&str]| {
        let host = format!("Host: {host}");
        let mut args = vec!["-o", "/dev/null", "-w", "%{http_code}", "-H", &host];
        args.extend_from_slice(extra);
        let out = curl_as(&server, sni, client, &args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for proto in ["--http1.1", "--http2"] {
        // The way around the certificate: refused, by name and by address.
        assert_eq!(
            status("open.test", None, "secure.test", &[proto]),
            "421",
            "{proto}"
        );
        assert_eq!(
            status("open.test", None, "SECURE.test:443", &[proto]),
            "421",
            "{proto}"
        );
        assert_eq!(
            status("localhost", None, "secure.test", &[proto]),
            "421",
            "{proto}"
        );
        // With the certificate, through its own handshake: served.
        assert_eq!(
            status("secure.test", Some(&p.good), "secure.test", &[proto]),
            "200",
            "{proto}"
        );
        // Names under one policy share connections as before.
        assert_eq!(
            status("open.test", None, "localhost", &[proto]),
            "200",
            "{proto}"
        );
        assert_eq!(
            status("open.test", None, "unnamed.test", &[proto]),
            "200",
            "{proto}"
        );
        // And the policies hold both ways.
        assert_eq!(
            status("secure.test", Some(&p.good), "open.test", &[proto]),
            "421",
            "{proto}"
        );
    }
    // The secret root is what the 421s kept back.
    let ok = curl_as(&server, "secure.test", Some(&p.good), &[]);
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "secret\n");
    // A wildcard covers one label in routes as in certificates: a host
    // two labels deep under *.corp.test is no name of that entry (the
    // default's policy), and no route of it either.
    assert_eq!(status("open.test", None, "a.corp.test", &[]), "421");
    let deep = curl_as(&server, "open.test", None, &["-H", "Host: a.b.corp.test"]);
    assert_eq!(String::from_utf8_lossy(&deep.stdout), HELLO);
    // No SNI at all (an IP address): the default name's policy.
    let out = Command::new("curl")
        .args([
            "-sS",
            "-k",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", "Host: secure.test"])
        .arg(format!(
            "https://127.0.0.1:{}/hello.txt",
            server.addr.port()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "421");
}

/// A session store that offers every ticket to every server name, as a
/// hostile client may.
#[derive(Debug)]
struct AnyName(ClientSessionMemoryCache);

fn one_name() -> ServerName<'static> {
    ServerName::try_from("shared.test").unwrap()
}

impl ClientSessionStore for AnyName {
    fn set_kx_hint(&self, _: ServerName<'static>, g: rustls::NamedGroup) {
        self.0.set_kx_hint(one_name(), g)
    }
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.0.kx_hint(&one_name())
    }
    fn set_tls12_session(
        &self,
        _: ServerName<'static>,
        v: rustls::client::Tls12ClientSessionValue,
    ) {
        self.0.set_tls12_session(one_name(), v)
    }
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.0.tls12_session(&one_name())
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {
        self.0.remove_tls12_session(&one_name())
    }
    fn insert_tls13_ticket(
        &self,
        _: ServerName<'static>,
        v: rustls::client::Tls13ClientSessionValue,
    ) {
        self.0.insert_tls13_ticket(one_name(), v)
    }
    fn take_tls13_ticket(
        &self,
        _: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.0.take_tls13_ticket(&one_name())
    }
}

fn client(
    v: &'static rustls::SupportedProtocolVersion,
    cert: Option<&ClientCert>,
    store: Arc<dyn ClientSessionStore>,
) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[v])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify));
    let mut c = match cert {
        Some(c) => builder
            .with_client_auth_cert(
                c.chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.key_der.clone())),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    c.resumption = Resumption::store(store);
    Arc::new(c)
}

/// One GET over a fresh connection: how the handshake went and the answer.
fn get(
    server: &Server,
    sni: &str,
    config: &Arc<ClientConfig>,
) -> Result<(HandshakeKind, String), String> {
    let mut s = tls_connect_shared(server.addr, sni, config.clone()).map_err(|e| e.to_string())?;
    let kind = s.conn.handshake_kind().unwrap();
    // TLS 1.3: a refused client certificate is answered after the client's
    // Finished. Read the alert before writing: the server closes without
    // reading, and a write into that close is reset, losing the alert.
    s.sock
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    match s.conn.read_tls(&mut s.sock) {
        Ok(0) => return Err("closed after the handshake".into()),
        Ok(_) => {
            if let Err(e) = s.conn.process_new_packets() {
                return Err(e.to_string());
            }
        }
        Err(_) => {} // nothing yet: served
    }
    s.sock
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    if let Err(e) = write!(
        s,
        "GET /hello.txt HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"
    ) {
        // The server's alert may already be waiting: report it.
        return Err(match std::io::Read::read_to_end(&mut s, &mut out) {
            Err(alert) => format!("{alert} (writing: {e})"),
            Ok(_) => e.to_string(),
        });
    }
    match std::io::Read::read_to_end(&mut s, &mut out) {
        Ok(_) => Ok((kind, String::from_utf8_lossy(&out).into_owned())),
        // TLS 1.3: a refused client certificate is reported after the
        // client's Finished, on the first read.
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn resumed_sessions_keep_the_identity_and_never_cross_to_a_stricter_policy() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let config = fx.config(
        "[access_log]\nformat = \"json\"\n",
        &mtls_entries(&fx, &p.ca, "optional"),
    );
    let path = fx.write_config(&config);
    let server = Server::spawn(&["serve", "--config", path.to_str().unwrap()]);

    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        // With a certificate: the second connection resumes and is still
        // the same client in the log.
        let with_cert = client(v, Some(&p.good), Arc::new(ClientSessionMemoryCache::new(8)));
        let (first, a) = get(&server, "secure.test", &with_cert).unwrap();
        let (second, b) = get(&server, "secure.test", &with_cert).unwrap();
        assert_eq!(first, HandshakeKind::Full);
        assert_eq!(second, HandshakeKind::Resumed, "{v:?}");
        assert!(a.ends_with(HELLO) && b.ends_with(HELLO), "{b}");

        // A ticket issued on a name without client certificates is
        // offered, by a hostile client, to the name that requires one:
        // no resumption, and no certificate means no service.
        let hostile = Arc::new(AnyName(ClientSessionMemoryCache::new(8)));
        let anon = client(v, None, hostile.clone());
        let (k, _) = get(&server, "localhost", &anon).unwrap();
        assert_eq!(k, HandshakeKind::Full);
        match get(&server, "secure.test", &anon) {
            Ok((kind, answer)) => {
                panic!("{v:?}: served ({kind:?}) without a certificate: {answer}")
            }
            Err(e) => assert!(e.to_lowercase().contains("certificate"), "{v:?}: {e}"),
        }
    }
    let lines = wait_log_lines(&server, "secure.test", 4);
    assert_eq!(lines.len(), 4, "{}", server.access_log());
    for l in &lines {
        assert!(
            l["client"]["subject"]
                .as_str()
                .unwrap()
                .contains("CN=svc-a"),
            "{l}"
        );
    }

    // opt.test issues tickets to a client without a certificate; after a
    // reload that makes it `required`, those tickets no longer resume.
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let anon = client(v, None, Arc::new(ClientSessionMemoryCache::new(8)));
        get(&server, "opt.test", &anon).unwrap();
        let (k, _) = get(&server, "opt.test", &anon).unwrap();
        assert_eq!(k, HandshakeKind::Resumed, "{v:?}: optional resumes");
    }
    let tls13 = client(
        &rustls::version::TLS13,
        None,
        Arc::new(ClientSessionMemoryCache::new(8)),
    );
    let tls12 = client(
        &rustls::version::TLS12,
        None,
        Arc::new(ClientSessionMemoryCache::new(8)),
    );
    get(&server, "opt.test", &tls13).unwrap();
    get(&server, "opt.test", &tls12).unwrap();
    std::fs::write(
        &path,
        fx.config(
            "[access_log]\nformat = \"json\"\n",
            &mtls_entries(&fx, &p.ca, "required"),
        ),
    )
    .unwrap();
    server.signal("HUP");
    server.wait_log("reloaded configuration", Duration::from_secs(10));
    for (v, c) in [("TLS1.3", &tls13), ("TLS1.2", &tls12)] {
        match get(&server, "opt.test", c) {
            Ok((kind, answer)) => panic!("{v}: served ({kind:?}) after the reload: {answer}"),
            Err(e) => assert!(e.to_lowercase().contains("certificate"), "{v}: {e}"),
        }
    }
    let with_cert = client(
        &rustls::version::TLS13,
        Some(&p.good),
        Arc::new(ClientSessionMemoryCache::new(8)),
    );
    assert!(get(&server, "opt.test", &with_cert)
        .unwrap()
        .1
        .ends_with(HELLO));
}

#[test]
fn a_broken_client_ca_is_refused_naming_its_key() {
    let fx = Fixture::new();
    let bad = fx.path().join("not-a-ca.pem");
    std::fs::write(
        &bad,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = fx.config(
        "",
        &format!("client_ca = {bad:?}\nclient_auth = \"required\"\n"),
    );
    // client_ca/client_auth placed after the fixture's certificate belong to it.
    let refused = |text: &str, needle: &str| {
        let path = fx.write_config(text);
        let out = Command::new(bin())
            .args(["check-config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("listener[0].certificate[0].client_ca"),
            "{err}"
        );
        assert!(err.contains(needle), "{err}");
    };
    refused(&text, "not-a-ca.pem");
    refused(
        &fx.config("", "client_auth = \"required\"\n"),
        "needs the CA bundle",
    );
}

/// Entries that look apart in the configuration but serve one name (one
/// with `names`, one named by its certificate; or names differing in case)
/// must agree on client certificates: the handshake picks the policy by
/// name, so one of them would be served under the other's, and a name
/// that requires client certificates could be reached without one.
#[test]
fn a_name_served_under_two_client_auth_policies_is_refused() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let d = fx.path();
    let rsa = common::make_cert(d, "a-rsa", &["a.test"], &rcgen::PKCS_RSA_SHA256);
    let ec = common::make_cert(d, "a-ec", &["a.test"], &rcgen::PKCS_ECDSA_P256_SHA256);
    let required = format!("client_auth = \"required\"\nclient_ca = {:?}\n", p.ca);
    // The fixture's entry and the ECDSA one take their names from their
    // certificates and agree; the RSA one names a.test without a policy.
    let mixed = fx.config(
        "",
        &format!(
            "{required}\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\nnames = [\"a.test\"]\n\n\
             [[listener.certificate]]\ncert = {:?}\nkey = {:?}\n{required}",
            rsa.cert, rsa.key, ec.cert, ec.key
        ),
    );
    let cased = fx.config(
        "",
        &format!(
            "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\nnames = [\"A.test\"]\n\n\
             [[listener.certificate]]\ncert = {:?}\nkey = {:?}\nnames = [\"a.test\"]\n{required}",
            rsa.cert, rsa.key, ec.cert, ec.key
        ),
    );
    for (text, key) in [
        (&mixed, "listener[0].certificate[2].client_auth"),
        (&cased, "listener[0].certificate[2].client_auth"),
    ] {
        let path = fx.write_config(text);
        for cmd in [&["check-config"][..], &["serve", "--config"][..]] {
            let out = Command::new(bin()).args(cmd).arg(&path).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
            assert!(err.contains(key), "{cmd:?}: {err}");
            assert!(err.contains("\"a.test\""), "{cmd:?}: {err}");
            assert!(err.contains("listener[0].certificate[1]"), "{cmd:?}: {err}");
        }
    }
}

/// Two entries without `names` (their names come from their
/// certificates) under different client certificate policies are fine
/// when the certificates name different hosts: check-config passes and
/// each name is served under its own policy. The names compared are the
/// ones the certificates carry, not the absence of `names`.
#[test]
fn entries_named_by_their_certificates_may_differ_in_client_auth() {
    let fx = Fixture::new();
    let p = pki(fx.path());
    let secure = common::make_cert(
        fx.path(),
        "secure",
        &["secure.test"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    let text = fx.config(
        "",
        &format!(
            "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\nclient_auth = \"required\"\nclient_ca = {:?}\n",
            secure.cert, secure.key, p.ca
        ),
    );
    check_config_passes(&fx.write_config(&text));
    let s = Server::start(&fx, &text);
    // localhost: no client certificate needed.
    let out = curl_as(&s, "localhost", None, &[]);
    assert_eq!(out.stdout, HELLO.as_bytes(), "{out:?}");
    // secure.test: refused without one, served with a good one.
    let out = curl_as(&s, "secure.test", None, &[]);
    assert!(!out.status.success(), "{out:?}");
    let out = curl_as(&s, "secure.test", Some(&p.good), &[]);
    assert_eq!(out.stdout, HELLO.as_bytes(), "{out:?}");
}
