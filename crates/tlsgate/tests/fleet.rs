//! Session resumption across a fleet: two tlsgate processes share one
//! ticket key file, and a session from one resumes on the other, over
//! TLS 1.2 (RFC 5077 tickets) and TLS 1.3 (PSK with ECDHE), through key
//! rotation, key removal, expiry and a broken key file. Peers: a rustls
//! client with a shared session store, and openssl s_client.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::{ClientConfig, HandshakeKind, SupportedProtocolVersion};

const VERSIONS: [(&SupportedProtocolVersion, &str); 2] = [
    (&rustls::version::TLS12, "TLSv1.2"),
    (&rustls::version::TLS13, "TLSv1.3"),
];

/// `tlsgate ticket-keys ...`; panics unless it succeeds.
fn ticket_keys(args: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("ticket-keys")
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ticket-keys {args:?}: {text}");
    text
}

/// Two instances on their own ports with the same configuration.
fn fleet(fx: &Fixture, tls: &str) -> (Server, Server) {
    let cfg = fx.path().join("fleet.toml");
    std::fs::write(&cfg, fx.config(&format!("[tls]\n{tls}"), "")).unwrap();
    let args = ["serve", "--config", cfg.to_str().unwrap()];
    let a = Server::spawn(&args);
    let b = Server::spawn(&args);
    assert_ne!(a.addr, b.addr);
    (a, b)
}

fn key_file_tls(keys: &Path, extra: &str) -> String {
    // No session-ID cache: a TLS 1.2 resumption can only come from a ticket.
    format!("ticket_key_file = {keys:?}\nsession_cache_size = 0\n{extra}")
}

fn client(version: &'static SupportedProtocolVersion) -> Arc<ClientConfig> {
    Arc::new(client_config(&[version]))
}

/// One request over a new connection; reading to the close also takes in
/// TLS 1.3 tickets. Returns how the handshake went.
fn visit(s: &Server, cfg: &Arc<ClientConfig>) -> HandshakeKind {
    let mut c = tls_connect_shared(s.addr, "localhost", cfg.clone()).unwrap();
    let kind = c.conn.handshake_kind().unwrap();
    c.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let answer = read_to_close(&mut c);
    assert!(answer.ends_with(HELLO), "{answer}");
    kind
}

/// Resumed handshakes the server counted for a version.
fn resumed(text: &str, label: &str) -> f64 {
    let version = format!(r#"version="{label}""#);
    text.lines()
        .filter(|l| {
            l.starts_with("tlsgate_handshakes_total{")
                && l.contains(&version)
                && l.contains(r#"resumed="true""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until the server's metric `name` is `want` (counters are
/// updated after the client may have moved on; reloads within a second).
fn wait_metric(s: &Server, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = s.admin_get("/metrics");
        let got = sample(&text, name);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {got}, expected {want}:\n{text}\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_resumed(s: &Server, label: &str, want: f64) {
    let text = s.metrics_when(|t| resumed(t, label) == want);
    assert_eq!(resumed(&text, label), want, "{label}:\n{text}");
}

/// Writes `text` as the key file the way an operator's tool should:
/// a new file, mode 0600, renamed into place.
fn replace_file(path: &Path, text: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const RELOADS_OK: &str = r#"tlsgate_ticket_key_reloads_total{result="ok"}"#;
const RELOADS_ERROR: &str = r#"tlsgate_ticket_key_reloads_total{result="error"}"#;
const UNKNOWN_KEY: &str = r#"tlsgate_ticket_decrypts_total{result="unknown_key"}"#;
const EXPIRED: &str = r#"tlsgate_ticket_decrypts_total{result="expired"}"#;

#[test]
fn sessions_resume_across_instances_through_rotation_and_key_removal() {
    let fx = Fixture::new();
    let keys = fx.path().join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    let (a, b) = fleet(&fx, &key_file_tls(&keys, ""));
    for s in [&a, &b] {
        wait_metric(s, "tlsgate_ticket_keys", 1.0);
    }

    // A session made on A resumes on B: both sides say so.
    let mut before_rotation = Vec::new();
    for (version, label) in VERSIONS {
        let cfg = client(version);
        assert_eq!(visit(&a, &cfg), HandshakeKind::Full, "{label}");
        assert_eq!(visit(&b, &cfg), HandshakeKind::Resumed, "{label}");
        wait_resumed(&b, label, 1.0);
        wait_resumed(&a, label, 0.0);
        // Two more sessions under the first key, kept for later.
        let (kept, dropped) = (client(version), client(version));
        assert_eq!(visit(&a, &kept), HandshakeKind::Full);
        assert_eq!(visit(&a, &dropped), HandshakeKind::Full);
        before_rotation.push((label, kept, dropped));
    }

    // Rotation: a new key in front, the first one kept; both re-read the file.
    ticket_keys(&["rotate", keys.to_str().unwrap(), "--keep", "2"]);
    for s in [&a, &b] {
        wait_metric(s, RELOADS_OK, 1.0);
        wait_metric(s, "tlsgate_ticket_keys", 2.0);
        s.wait_log("ticket keys reloaded from", Duration::from_secs(5));
    }
    let mut after_rotation = Vec::new();
    for (label, kept, _) in &before_rotation {
        assert_eq!(
            visit(&b, kept),
            HandshakeKind::Resumed,
            "{label}: a ticket of the old key still resumes"
        );
        wait_resumed(&b, label, 2.0);
    }
    for (version, label) in VERSIONS {
        let cfg = client(version);
        assert_eq!(visit(&b, &cfg), HandshakeKind::Full);
        after_rotation.push((label, cfg));
    }

    // Second rotation keeping two: the first key is gone.
    ticket_keys(&["rotate", keys.to_str().unwrap(), "--keep", "2"]);
    for s in [&a, &b] {
        wait_metric(s, RELOADS_OK, 2.0);
    }
    for (n, (label, _, dropped)) in before_rotation.iter().enumerate() {
        assert_eq!(
            visit(&b, dropped),
            HandshakeKind::Full,
            "{label}: a ticket of a dropped key does not resume"
        );
        wait_metric(&b, UNKNOWN_KEY, (n + 1) as f64);
    }
    for (label, cfg) in &after_rotation {
        assert_eq!(
            visit(&a, cfg),
            HandshakeKind::Resumed,
            "{label}: sealed on B with the second key, resumed on A"
        );
        wait_resumed(&a, label, 1.0);
    }

    // A broken file: service goes on with the keys loaded before; reported.
    let good = std::fs::read(&keys).unwrap();
    replace_file(&keys, b"tlsgate-ticket-keys v1\nthis is not a key\n");
    for s in [&a, &b] {
        wait_metric(s, RELOADS_ERROR, 1.0);
        s.wait_log("ticket key file not reloaded", Duration::from_secs(5));
        assert!(s.log().contains(keys.to_str().unwrap()), "{}", s.log());
        assert!(s.log().contains("line 2"), "{}", s.log());
        assert!(!s.log().contains("this is not a key"), "{}", s.log());
    }
    for (version, label) in VERSIONS {
        let cfg = client(version);
        assert_eq!(
            visit(&a, &cfg),
            HandshakeKind::Full,
            "{label}: still serving"
        );
        assert_eq!(
            visit(&b, &cfg),
            HandshakeKind::Resumed,
            "{label}: keys kept"
        );
    }
    // Open to others: refused the same way, naming the file.
    replace_file(&keys, &good);
    for s in [&a, &b] {
        wait_metric(s, RELOADS_OK, 3.0);
    }
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    for s in [&a, &b] {
        wait_metric(s, RELOADS_ERROR, 2.0);
        s.wait_log("mode 0644", Duration::from_secs(5));
    }
    for (version, _) in VERSIONS {
        let cfg = client(version);
        assert_eq!(visit(&a, &cfg), HandshakeKind::Full);
        assert_eq!(visit(&b, &cfg), HandshakeKind::Resumed);
    }
    // The secrets never reach the log.
    for line in String::from_utf8(good).unwrap().lines().skip(1) {
        if !line.starts_with('#') {
            assert!(!a.log().contains(line) && !b.log().contains(line));
        }
    }
}

#[test]
fn expired_tickets_are_refused_by_the_server_not_only_the_client() {
    let fx = Fixture::new();
    let keys = fx.path().join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    // A issues tickets that say "1 hour"; B accepts them for 2 seconds:
    // the client still offers them, so only B's check can refuse them.
    let cfg_a = fx.path().join("a.toml");
    let cfg_b = fx.path().join("b.toml");
    std::fs::write(
        &cfg_a,
        fx.config(
            &format!(
                "[tls]\n{}",
                key_file_tls(&keys, "ticket_lifetime = \"1h\"\n")
            ),
            "",
        ),
    )
    .unwrap();
    std::fs::write(
        &cfg_b,
        fx.config(
            &format!(
                "[tls]\n{}",
                key_file_tls(&keys, "ticket_lifetime = \"2s\"\n")
            ),
            "",
        ),
    )
    .unwrap();
    let a = Server::spawn(&["serve", "--config", cfg_a.to_str().unwrap()]);
    let b = Server::spawn(&["serve", "--config", cfg_b.to_str().unwrap()]);
    let mut late = Vec::new();
    for (version, label) in VERSIONS {
        let (now, later) = (client(version), client(version));
        assert_eq!(visit(&a, &now), HandshakeKind::Full);
        assert_eq!(visit(&a, &later), HandshakeKind::Full);
        assert_eq!(visit(&b, &now), HandshakeKind::Resumed, "{label}: fresh");
        late.push((label, later));
    }
    std::thread::sleep(Duration::from_millis(3100));
    for (n, (label, later)) in late.iter().enumerate() {
        assert_eq!(
            visit(&b, later),
            HandshakeKind::Full,
            "{label}: older than B's lifetime"
        );
        wait_metric(&b, EXPIRED, (n + 1) as f64);
    }
    for (_, label) in VERSIONS {
        wait_resumed(&b, label, 1.0);
    }
}

/// `openssl s_client` with a session file; returns its output.
fn s_client(s: &Server, version: &str, sess: &Path, out: bool) -> String {
    let flag = if out { "-sess_out" } else { "-sess_in" };
    let out = common::s_client(
        s.addr,
        &[version, flag, sess.to_str().unwrap(), "-ign_eof"],
        b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.ends_with(HELLO) || text.contains(HELLO), "{text}");
    text
}

#[test]
fn openssl_sessions_resume_on_the_other_instance() {
    let fx = Fixture::new();
    let keys = fx.path().join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap(), "--keys", "3"]);
    let (a, b) = fleet(&fx, &key_file_tls(&keys, ""));
    for (flag, label, name) in [
        ("-tls1_2", "TLSv1.2", "Reused, TLSv1.2"),
        ("-tls1_3", "TLSv1.3", "Reused, TLSv1.3"),
    ] {
        let sess: PathBuf = fx.path().join(format!("{label}.sess"));
        let first = s_client(&a, flag, &sess, true);
        assert!(first.contains(&format!("New, {label}")), "{first}");
        let second = s_client(&b, flag, &sess, false);
        assert!(second.contains(name), "{label}: {second}");
        wait_resumed(&b, label, 1.0);
    }
}

/// A client holding a TLS 1.3 ticket may send 0-RTT data only if the
/// ticket allows it (max_early_data_size > 0); tlsgate's never do.
/// (Takes one ticket from the store.)
fn assert_no_early_data(cfg: &Arc<ClientConfig>) {
    let mut conn = rustls::ClientConnection::new(
        cfg.clone(),
        rustls::pki_types::ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    assert!(
        conn.early_data().is_none(),
        "the server's tickets must not allow early data"
    );
}

#[test]
fn in_memory_keys_ticket_count_early_data_and_switches() {
    let fx = Fixture::new();
    let s = Server::start(
        &fx,
        &fx.config("[tls]\ntls13_tickets = 3\nsession_cache_size = 0\n", ""),
    );
    // TLS 1.3: three tickets per handshake, none allowing 0-RTT.
    let mut cfg = client_config(&[&rustls::version::TLS13]);
    cfg.enable_early_data = true;
    let cfg = Arc::new(cfg);
    assert_eq!(visit(&s, &cfg), HandshakeKind::Full);
    wait_metric(&s, "tlsgate_tickets_issued_total", 3.0);
    assert_no_early_data(&cfg);
    assert_eq!(visit(&s, &cfg), HandshakeKind::Resumed);
    // TLS 1.2 resumes by ticket with the session cache off.
    let cfg12 = client(&rustls::version::TLS12);
    assert_eq!(visit(&s, &cfg12), HandshakeKind::Full);
    assert_eq!(visit(&s, &cfg12), HandshakeKind::Resumed);
    wait_metric(&s, r#"tlsgate_ticket_decrypts_total{result="ok"}"#, 2.0);
    drop(s);

    // No TLS 1.3 tickets, or no tickets at all: no resumption (cache off).
    for top in [
        "[tls]\ntls13_tickets = 0\nsession_cache_size = 0\n",
        "[tls]\nsession_tickets = false\nsession_cache_size = 0\n",
    ] {
        let s = Server::start(&fx, &fx.config(top, ""));
        let cfg = client(&rustls::version::TLS13);
        assert_eq!(visit(&s, &cfg), HandshakeKind::Full);
        assert_eq!(visit(&s, &cfg), HandshakeKind::Full, "{top}");
    }
    // Tickets off, session cache on: TLS 1.3 resumes statefully, TLS 1.2
    // by session ID; no ticket is sealed.
    let s = Server::start(&fx, &fx.config("[tls]\nsession_tickets = false\n", ""));
    for (version, label) in VERSIONS {
        let mut cfg = client_config(&[version]);
        cfg.enable_early_data = true;
        let cfg = Arc::new(cfg);
        assert_eq!(visit(&s, &cfg), HandshakeKind::Full);
        if version == &rustls::version::TLS13 {
            assert_no_early_data(&cfg);
        }
        assert_eq!(visit(&s, &cfg), HandshakeKind::Resumed, "{label}");
    }
    assert_eq!(s.metric("tlsgate_tickets_issued_total"), 0.0);
}

#[test]
fn a_bad_key_file_stops_the_start_naming_file_and_key() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let keys = fx.path().join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o640)).unwrap();
    let cfg = fx.write_config(&fx.config(&format!("[tls]\nticket_key_file = {keys:?}\n"), ""));
    for cmd in [&["check-config"][..], &["serve", "--config"][..]] {
        let out = Command::new(bin()).args(cmd).arg(&cfg).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("tls.ticket_key_file"), "{err}");
        assert!(err.contains(keys.to_str().unwrap()), "{err}");
        assert!(err.contains("0640"), "{err}");
        assert!(!err.contains("listening"), "nothing started: {err}");
    }
    // Rotating refuses it too, and generating over it needs --force.
    let out = Command::new(bin())
        .args(["ticket-keys", "rotate", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(bin())
        .args(["ticket-keys", "generate", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    ticket_keys(&["generate", keys.to_str().unwrap(), "--force"]);
    check_config_passes(&cfg);
}

/// A key file another user owns, or one in a directory others may write
/// (no sticky bit), is refused at start naming the file and what is wrong
/// (OpenSSH's StrictModes); `server.user`'s own file is fine, and root
/// may rotate it.
#[test]
fn a_key_file_another_user_could_change_stops_the_start_naming_what_is_wrong() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fx = Fixture::new();
    let dir = fx.path().join("keys.d");
    std::fs::create_dir(&dir).unwrap();
    let keys = dir.join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    let config = |top: &str| {
        fx.write_config(&fx.config(&format!("{top}[tls]\nticket_key_file = {keys:?}\n"), ""))
    };
    let refused = |cfg: &Path, needle: &str| {
        for cmd in [&["check-config"][..], &["serve", "--config"][..]] {
            let out = Command::new(bin()).args(cmd).arg(cfg).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
            assert!(
                err.contains("tls.ticket_key_file")
                    && err.contains(keys.to_str().unwrap())
                    && err.contains(needle),
                "{cmd:?}: wanted {needle:?} in {err}"
            );
            assert!(!err.contains("listening"), "nothing started: {err}");
        }
    };
    let accepted = check_config_passes;
    let cfg = config("");
    accepted(&cfg);

    // Another user's file: they could read or swap the keys.
    std::os::unix::fs::chown(&keys, Some(4321), None).unwrap();
    refused(&cfg, "owned by uid 4321");
    // Root may rotate it (the new file stays theirs)...
    ticket_keys(&["rotate", keys.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&keys).unwrap().uid(), 4321);
    // ...and it is fine when it is server.user's.
    std::os::unix::fs::chown(&keys, Some(65534), None).unwrap();
    accepted(&config("[server]\nuser = \"nobody\"\n"));
    let cfg = config("");
    refused(&cfg, "owned by uid 65534");
    std::os::unix::fs::chown(&keys, Some(0), None).unwrap();

    // A directory others may write: anyone could put a file in its place.
    let mode = |m: u32| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m)).unwrap();
    mode(0o777);
    refused(
        &cfg,
        &format!("its directory {} has mode 0777", dir.display()),
    );
    mode(0o770);
    refused(&cfg, "has mode 0770");
    // The sticky bit lets no one replace another's file, as in /tmp.
    mode(0o1777);
    accepted(&cfg);
    mode(0o755);
    accepted(&cfg);
    // generate and rotate still write files that pass.
    ticket_keys(&["generate", "--force", keys.to_str().unwrap()]);
    ticket_keys(&["rotate", keys.to_str().unwrap()]);
    accepted(&cfg);
}

#[test]
fn in_memory_keys_rotate_and_survive_a_reload() {
    let fx = Fixture::new();
    let top = "[tls]\nticket_rotation = \"1s\"\nsession_cache_size = 0\n";
    let s = Server::start(&fx, &fx.config(top, ""));
    // Sessions made under the first key, for after rotation, after a
    // reload, and after a reload that changes the ticket settings.
    let sessions: Vec<_> = VERSIONS
        .iter()
        .map(|(version, label)| {
            let three = [client(version), client(version), client(version)];
            for c in &three {
                assert_eq!(visit(&s, c), HandshakeKind::Full, "{label}");
            }
            (*label, three)
        })
        .collect();
    let text = s.metrics_when(|t| sample(t, "tlsgate_ticket_key_rotations_total") >= 2.0);
    assert!(
        sample(&text, "tlsgate_ticket_key_rotations_total") >= 2.0,
        "{text}"
    );
    assert!(sample(&text, "tlsgate_ticket_keys") >= 3.0, "{text}");
    for (label, [rotated, _, _]) in &sessions {
        assert_eq!(
            visit(&s, rotated),
            HandshakeKind::Resumed,
            "{label}: old key kept"
        );
    }
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    for (label, [_, reloaded, _]) in &sessions {
        assert_eq!(
            visit(&s, reloaded),
            HandshakeKind::Resumed,
            "{label}: keys survive a reload"
        );
    }
    // New ticket settings on reload: new keys, old tickets end.
    fx.write_config(&fx.config(&format!("{top}ticket_lifetime = \"2h\"\n"), ""));
    s.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.log().matches("reloaded configuration").count() < 2 {
        assert!(Instant::now() < deadline, "{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    for (label, [_, _, changed]) in &sessions {
        assert_eq!(visit(&s, changed), HandshakeKind::Full, "{label}: new keys");
    }
}

#[test]
fn the_key_file_is_re_read_after_switching_to_nobody() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fx = Fixture::new();
    assert_eq!(
        std::fs::metadata(fx.path()).unwrap().uid(),
        0,
        "this test starts tlsgate as root to see it switch to nobody; run the tests as root"
    );
    // nobody may pass through the directory, and owns the key file.
    std::fs::set_permissions(fx.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let keys = fx.path().join("ticket.keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    std::os::unix::fs::chown(&keys, Some(65534), Some(65534)).unwrap();
    let s = Server::start(
        &fx,
        &fx.config(
            &format!(
                "[server]\nuser = \"nobody\"\n[tls]\n{}",
                key_file_tls(&keys, "")
            ),
            "",
        ),
    );
    let cfgs: Vec<_> = VERSIONS
        .iter()
        .map(|(version, _)| {
            let c = client(version);
            assert_eq!(visit(&s, &c), HandshakeKind::Full);
            c
        })
        .collect();
    // Rotated by root: the file keeps its owner, so nobody reads it again.
    ticket_keys(&["rotate", keys.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&keys).unwrap().uid(), 65534);
    wait_metric(&s, RELOADS_OK, 1.0);
    wait_metric(&s, "tlsgate_ticket_keys", 2.0);
    for (c, (_, label)) in cfgs.iter().zip(VERSIONS) {
        assert_eq!(visit(&s, c), HandshakeKind::Resumed, "{label}");
    }
}

#[test]
fn a_refused_reload_does_not_report_the_ticket_keys_it_read() {
    let fx = Fixture::new();
    let one = fx.path().join("one.keys");
    let three = fx.path().join("three.keys");
    ticket_keys(&["generate", one.to_str().unwrap()]);
    ticket_keys(&["generate", three.to_str().unwrap()]);
    for _ in 0..2 {
        ticket_keys(&["rotate", three.to_str().unwrap(), "--keep", "3"]);
    }
    let cfg = |keys: &Path, listen: &str| {
        fx.config(&format!("[tls]\n{}", key_file_tls(keys, "")), "")
            .replace(
                "listen = [\"127.0.0.1:0\"]",
                &format!("listen = [{listen:?}]"),
            )
    };
    let s = Server::start(&fx, &cfg(&one, "127.0.0.1:0"));
    wait_metric(&s, "tlsgate_ticket_keys", 1.0);
    // Three keys, but refused for its changed listen address: the gauge
    // must go on saying what is in service.
    fx.write_config(&cfg(&three, "127.0.0.3:0"));
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    let text = s.admin_get("/metrics");
    assert_eq!(sample(&text, "tlsgate_ticket_keys"), 1.0, "{text}");
    // The same keys in an accepted reload are counted.
    fx.write_config(&cfg(&three, "127.0.0.1:0"));
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    wait_metric(&s, "tlsgate_ticket_keys", 3.0);
}

/// Without tickets the session cache resumes, but only for
/// `ticket_lifetime`: a TLS 1.2 session ID and a stateful TLS 1.3 ticket
/// from a server with a 2 s lifetime resume at once and not 3 s later,
/// while those from one with a 1 h lifetime still do then (the wait alone
/// does not end a session). Peer: openssl s_client.
#[test]
fn cached_sessions_expire_after_the_ticket_lifetime() {
    let fx = Fixture::new();
    let start = |lifetime: &str| {
        let tls = format!("[tls]\nsession_tickets = false\nticket_lifetime = {lifetime:?}\n");
        let cfg = fx.path().join(format!("cache-{lifetime}.toml"));
        std::fs::write(&cfg, fx.config(&tls, "")).unwrap();
        Server::spawn(&["serve", "--config", cfg.to_str().unwrap()])
    };
    let short = start("2s");
    let long = start("1h");
    let sess = |s: &Server, label: &str, n: u32| {
        fx.path()
            .join(format!("{}-{label}-{n}.sess", s.addr.port()))
    };
    for s in [&short, &long] {
        for (flag, label) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
            // Two sessions: a TLS 1.3 ticket resumes once (the cache
            // gives it up), the second is for after the wait.
            for n in [1, 2] {
                let first = s_client(s, flag, &sess(s, label, n), true);
                assert!(first.contains(&format!("New, {label}")), "{first}");
            }
            let again = s_client(s, flag, &sess(s, label, 1), false);
            assert!(again.contains(&format!("Reused, {label}")), "{again}");
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    for (flag, label) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
        let late = s_client(&short, flag, &sess(&short, label, 2), false);
        assert!(
            late.contains(&format!("New, {label}")),
            "resumed after ticket_lifetime: {late}"
        );
        let kept = s_client(&long, flag, &sess(&long, label, 2), false);
        assert!(kept.contains(&format!("Reused, {label}")), "{kept}");
    }
}

/// `generate --force` replaces key files, nothing else: a FIFO (never
/// opened, so no wait for a writer), a character device (a scratch
/// /dev/null made with mknod), a directory and a symlink to a FIFO are
/// refused with exit 2, naming the file and what was expected, and left
/// as they were; `rotate` refuses them too. A symlink to a key file is
/// still replaced through.
#[test]
fn generate_force_and_rotate_refuse_what_is_not_a_regular_file() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let fx = Fixture::new();
    let dir = fx.path();
    let fifo = dir.join("fifo");
    let null = dir.join("null");
    let sub = dir.join("keys.d");
    let link = dir.join("link-to-fifo");
    let made = |program: &str, args: &[&Path]| {
        let ok = Command::new(program).args(args).status().unwrap().success();
        assert!(ok, "{program} {args:?}");
    };
    made("mkfifo", &[&fifo]);
    made(
        "mknod",
        &[&null, Path::new("c"), Path::new("1"), Path::new("3")],
    );
    std::fs::create_dir(&sub).unwrap();
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let state = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.ino(), m.mode(), m.rdev(), m.len())
    };
    for (path, generate_says, rotate_says) in [
        (&fifo, "is a FIFO; expected a regular file", "is a FIFO"),
        (
            &null,
            "is a character device; expected",
            "is a character device",
        ),
        (&sub, "is a directory; expected", "is a directory"),
        (&link, "is a symlink to a FIFO; expected", "is a FIFO"),
    ] {
        let before = state(path);
        let p = path.to_str().unwrap();
        for (args, says) in [
            (
                &["ticket-keys", "generate", p, "--force"][..],
                generate_says,
            ),
            (&["ticket-keys", "generate", p][..], generate_says),
            (&["ticket-keys", "rotate", p][..], rotate_says),
        ] {
            let (code, err) = common::tlsgate_within_5s(args);
            assert_eq!(code, Some(2), "{args:?}: {err}");
            assert!(err.contains(says), "{args:?}: wanted {says:?} in {err}");
            assert!(err.contains("expected a regular file"), "{err}");
            // rotate names the file the link leads to.
            let target = std::fs::canonicalize(path).unwrap();
            assert!(
                err.contains(p) || err.contains(target.to_str().unwrap()),
                "{err}"
            );
            assert_eq!(state(path), before, "{args:?} changed {p}");
        }
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(&null)
        .unwrap()
        .file_type()
        .is_char_device());
    // The same command on a symlink to a key file replaces the keys
    // through the link.
    let keys = dir.join("ticket.keys");
    let to_keys = dir.join("link-to-keys");
    ticket_keys(&["generate", keys.to_str().unwrap()]);
    std::os::unix::fs::symlink(&keys, &to_keys).unwrap();
    let old = std::fs::read(&keys).unwrap();
    ticket_keys(&["generate", to_keys.to_str().unwrap(), "--force"]);
    assert!(std::fs::symlink_metadata(&to_keys).unwrap().is_symlink());
    assert_ne!(std::fs::read(&keys).unwrap(), old);
}
