//! testssl.sh against the running server (the embedded default: its
//! self-signed ECDSA certificate). About a minute; fails, never skips, when
//! testssl.sh is missing (`./dev setup` installs it).
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Command;

use common::*;

/// Findings that belong to the self-signed certificate's trust, not to the
/// server: it has no issuer to chain to and none to publish revocation.
const SELF_SIGNED_TRUST: &[&str] = &["cert_chain_of_trust", "cert_revocation"];

#[test]
fn testssl_finds_nothing_high_or_critical() {
    let s = Server::spawn(&["serve", "--listen", "127.0.0.1:0", "--admin", ""]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("testssl.json");
    let out = Command::new("testssl")
        .args([
            "--quiet",
            "--color",
            "0",
            "--warnings",
            "batch",
            "--ip",
            "one",
            "--jsonfile",
        ])
        .arg(&json)
        .arg(format!("localhost:{}", s.addr.port()))
        .output()
        .expect("testssl (Debian package testssl.sh) must be installed: run ./dev setup");
    assert!(
        json.exists(),
        "testssl wrote no results:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let findings: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let get = |id: &str| -> (String, String) {
        let f = findings
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("testssl reported no {id}"));
        (
            f["severity"].as_str().unwrap().to_string(),
            f["finding"].as_str().unwrap().to_string(),
        )
    };
    let bad: Vec<String> = findings
        .iter()
        .filter(|f| matches!(f["severity"].as_str(), Some("HIGH" | "CRITICAL")))
        .filter(|f| !SELF_SIGNED_TRUST.contains(&f["id"].as_str().unwrap_or("")))
        .map(|f| format!("{} {}: {}", f["severity"], f["id"], f["finding"]))
        .collect();
    assert!(bad.is_empty(), "testssl findings:\n{}", bad.join("\n"));
    for (id, want) in [
        ("SSLv2", "not offered"),
        ("SSLv3", "not offered"),
        ("TLS1", "not offered"),
        ("TLS1_1", "not offered"),
        ("TLS1_2", "offered"),
        ("TLS1_3", "offered"),
        ("cipher_order", "server"),
        ("heartbleed", "not vulnerable"),
        ("secure_renego", "supported"),
        ("BREACH", "not vulnerable"),
        ("ALPN", "http/1.1"),
    ] {
        let (_, finding) = get(id);
        assert!(finding.starts_with(want), "{id}: {finding}");
    }
    let (_, order) = get("cipherorder_TLSv1_2");
    assert!(
        !order.contains("CBC") && !order.contains("-SHA ") && order.starts_with("ECDHE-"),
        "{order}"
    );
}
