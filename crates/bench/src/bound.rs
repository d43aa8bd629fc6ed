//! `bound`: the floor on this machine. The server-side cryptography of each
//! handshake kind (key generation and agreement, signature, key schedule)
//! measured in-process with aws-lc, plus a bare TCP accept and close, so a
//! server's CPU per handshake can be read as a ratio to the physical limit.
//! The key schedules are modelled by their HKDF/HMAC/hash operation counts
//! (RFC 8446 §7.1 and RFC 5246 §8, §6.3), not run through a TLS stack.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use aws_lc_rs::{aead, agreement, digest, hkdf, hmac, rand, signature};
use serde::{Deserialize, Serialize};
use tlsgate_loadgen::thread_cpu_ns;

use crate::error::BenchError;
use crate::report::median;

/// Measured floors, nanoseconds of one core per operation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Bounds {
    /// Primitive operations: "x25519", "p256_ecdh", "ecdsa_p256_sign",
    /// "rsa2048_pss_sign", "tls13_key_schedule", "tls12_key_schedule",
    /// "tcp_accept_close" (server side), "ticket_open".
    pub ops_ns: BTreeMap<String, f64>,
    /// Bulk encryption, ns per byte in 16 KiB records, by cipher.
    pub seal_ns_per_byte: BTreeMap<String, f64>,
}

/// Primitives of each handshake kind, server side.
fn recipe(case: &str) -> Option<Vec<&'static str>> {
    let tls13 = case.contains("TLS1.3");
    let resumed = case.contains("resumed");
    let schedule = if tls13 {
        "tls13_key_schedule"
    } else {
        "tls12_key_schedule"
    };
    let mut v = vec!["tcp_accept_close", schedule];
    if resumed {
        v.push("ticket_open");
        if tls13 {
            // psk_dhe_ke: a fresh key exchange even when resuming.
            v.push("x25519");
        }
    } else {
        v.push("x25519");
        v.push(if case.contains("RSA") {
            "rsa2048_pss_sign"
        } else {
            "ecdsa_p256_sign"
        });
    }
    Some(v)
}

impl Bounds {
    /// The floor of one handshake case ("TLS1.3 ECDSA full"), µs.
    pub fn handshake_us(&self, case: &str) -> Option<f64> {
        let parts = recipe(case)?;
        let mut sum = 0.0;
        for p in parts {
            sum += self.ops_ns.get(p)?;
        }
        Some(sum / 1e3)
    }

    /// Measures everything; `server_core` runs the measured side.
    pub fn measure(
        server_core: Option<usize>,
        client_core: Option<usize>,
        quick: bool,
    ) -> Result<Self, BenchError> {
        let span = if quick {
            Duration::from_millis(60)
        } else {
            Duration::from_millis(400)
        };
        let rounds = if quick { 1 } else { 3 };
        let mut b = Bounds::default();
        let pinned = std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(id) = server_core {
                    core_affinity::set_for_current(core_affinity::CoreId { id });
                }
                crypto_costs(span, rounds)
            })
            .join()
        })
        .map_err(|_| BenchError::Other("bound measurement thread panicked".into()))??;
        b.ops_ns = pinned.0;
        b.seal_ns_per_byte = pinned.1;
        let tcp = tcp_accept_close(server_core, client_core, span * 2)?;
        b.ops_ns.insert("tcp_accept_close".into(), tcp);
        Ok(b)
    }

    /// A Markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from("| operation (server side, one core) | µs |\n|---|---:|\n");
        for (k, v) in &self.ops_ns {
            let _ = writeln!(out, "| {k} | {:.2} |", v / 1e3);
        }
        for (k, v) in &self.seal_ns_per_byte {
            let _ = writeln!(
                out,
                "| {k} seal, per 16 KiB record ({:.0} MB/s) | {:.2} |",
                1e3 / v,
                v * 16384.0 / 1e3
            );
        }
        out
    }
}

/// CPU ns per call of `op`, median over `rounds` spans.
pub(crate) fn per_op(span: Duration, rounds: usize, mut op: impl FnMut()) -> f64 {
    let mut results = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let cpu = thread_cpu_ns();
        let mut n = 0u64;
        while start.elapsed() < span || n < 10 {
            op();
            n += 1;
        }
        results.push((thread_cpu_ns() - cpu) as f64 / n as f64);
    }
    median(results)
}

type Costs = (BTreeMap<String, f64>, BTreeMap<String, f64>);

pub(crate) fn crypto<E>(what: &str) -> impl FnOnce(E) -> BenchError + '_ {
    move |_| BenchError::Other(format!("bound: {what} failed in aws-lc"))
}

fn crypto_costs(span: Duration, rounds: usize) -> Result<Costs, BenchError> {
    let rng = rand::SystemRandom::new();
    let mut ops = BTreeMap::new();
    for (name, alg) in [
        ("x25519", &agreement::X25519),
        ("p256_ecdh", &agreement::ECDH_P256),
    ] {
        let peer = agreement::EphemeralPrivateKey::generate(alg, &rng).map_err(crypto(name))?;
        let peer_public = peer.compute_public_key().map_err(crypto(name))?;
        let peer_public = peer_public.as_ref().to_vec();
        let ns = per_op(span, rounds, || {
            // The server's share: generate, publish, agree.
            if let Ok(k) = agreement::EphemeralPrivateKey::generate(alg, &rng) {
                let _ = std::hint::black_box(k.compute_public_key());
                let _ = agreement::agree_ephemeral(
                    k,
                    agreement::UnparsedPublicKey::new(alg, &peer_public),
                    (),
                    |s| {
                        std::hint::black_box(s);
                        Ok(())
                    },
                );
            }
        });
        ops.insert(name.to_string(), ns);
    }
    // The signed content of a TLS 1.3 CertificateVerify is 130 bytes.
    let message = [0x20u8; 130];
    let pkcs8 =
        signature::EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(crypto("ECDSA key generation"))?;
    let ecdsa = signature::EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
    )
    .map_err(crypto("ECDSA key"))?;
    ops.insert(
        "ecdsa_p256_sign".into(),
        per_op(span, rounds, || {
            let _ = std::hint::black_box(ecdsa.sign(&rng, &message));
        }),
    );
    let rsa = signature::RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
        .map_err(crypto("RSA key generation"))?;
    let mut sig = vec![0u8; rsa.public_modulus_len()];
    ops.insert(
        "rsa2048_pss_sign".into(),
        per_op(span, rounds, || {
            let _ = rsa.sign(&signature::RSA_PSS_SHA256, &rng, &message, &mut sig);
        }),
    );
    let transcript = vec![0x16u8; 3 * 1024];
    ops.insert(
        "tls13_key_schedule".into(),
        per_op(span, rounds, || tls13_schedule(&transcript)),
    );
    ops.insert(
        "tls12_key_schedule".into(),
        per_op(span, rounds, || tls12_schedule(&transcript)),
    );
    let mut seal = BTreeMap::new();
    for (name, alg) in [
        ("AES-128-GCM", &aead::AES_128_GCM),
        ("AES-256-GCM", &aead::AES_256_GCM),
        ("CHACHA20-POLY1305", &aead::CHACHA20_POLY1305),
    ] {
        let key = vec![7u8; alg.key_len()];
        let key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, &key).map_err(crypto(name))?);
        let mut record = vec![0u8; 16 * 1024];
        let mut seq = 0u64;
        let ns = per_op(span, rounds, || {
            seq += 1;
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&seq.to_be_bytes());
            let _ = std::hint::black_box(key.seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from([23u8, 3, 3, 64, 17]),
                &mut record,
            ));
        });
        seal.insert(name.to_string(), ns / record.len() as f64);
        if name == "AES-128-GCM" {
            // A resumption ticket (about 200 bytes) opened with the same cipher.
            let mut ticket = vec![0u8; 200];
            let tag = key
                .seal_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key([1; 12]),
                    aead::Aad::empty(),
                    &mut ticket,
                )
                .map_err(crypto("ticket seal"))?;
            ticket.extend_from_slice(tag.as_ref());
            ops.insert(
                "ticket_open".into(),
                per_op(span, rounds, || {
                    let mut t = ticket.clone();
                    let _ = std::hint::black_box(key.open_in_place(
                        aead::Nonce::assume_unique_for_key([1; 12]),
                        aead::Aad::empty(),
                        &mut t,
                    ));
                }),
            );
        }
    }
    Ok((ops, seal))
}

/// Approximately the TLS 1.3 server key schedule: 3 extracts, 18
/// expand-labels (derived ×2, traffic secrets ×4, key+IV ×8, finished ×2,
/// resumption, exporter), 2 Finished HMACs, transcript hashes.
fn tls13_schedule(transcript: &[u8]) {
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, &[0u8; 32]);
    let mut secret = [0u8; 32];
    for _ in 0..3 {
        let prk = salt.extract(&secret);
        for _ in 0..6 {
            if let Ok(okm) = prk.expand(&[b"tls13 derived"], hkdf::HKDF_SHA256) {
                let _ = okm.fill(&mut secret);
            }
        }
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
    for _ in 0..2 {
        std::hint::black_box(hmac::sign(&key, &secret));
    }
    for _ in 0..4 {
        std::hint::black_box(digest::digest(&digest::SHA256, transcript));
    }
}

/// Approximately the TLS 1.2 key schedule: PRF for the master secret and
/// the key block, two Finished PRFs (about 14 HMACs), transcript hashes.
fn tls12_schedule(transcript: &[u8]) {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &[3u8; 48]);
    let mut a = [0u8; 32];
    for _ in 0..14 {
        let tag = hmac::sign(&key, &a);
        a.copy_from_slice(tag.as_ref());
    }
    std::hint::black_box(a);
    for _ in 0..3 {
        std::hint::black_box(digest::digest(&digest::SHA256, transcript));
    }
}

/// Server CPU per accepted-and-closed TCP connection (loopback).
fn tcp_accept_close(
    server_core: Option<usize>,
    client_core: Option<usize>,
    span: Duration,
) -> Result<f64, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(BenchError::io("127.0.0.1:0"))?;
    let addr = listener
        .local_addr()
        .map_err(BenchError::io("127.0.0.1:0"))?;
    let deadline = Instant::now() + span;
    std::thread::scope(|s| {
        let client = s.spawn(move || {
            if let Some(id) = client_core {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            let mut buf = [0u8; 16];
            let mut n = 0u64;
            while Instant::now() < deadline {
                if let Ok(mut c) = TcpStream::connect(addr) {
                    // Wait for the server's close: TIME_WAIT stays there.
                    let _ = c.read(&mut buf);
                    n += 1;
                }
            }
            // One last connection releases the server's accept.
            let _ = TcpStream::connect(addr);
            n
        });
        let server = s.spawn(move || {
            if let Some(id) = server_core {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            let cpu = thread_cpu_ns();
            let mut n = 0u64;
            while Instant::now() < deadline {
                match listener.accept() {
                    Ok((c, _)) => {
                        drop(c);
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            (thread_cpu_ns() - cpu, n)
        });
        let _ = client.join();
        let (cpu, n) = server
            .join()
            .map_err(|_| BenchError::Other("bound: TCP thread panicked".into()))?;
        if n == 0 {
            return Err(BenchError::Other(
                "bound: no TCP connection accepted".into(),
            ));
        }
        Ok(cpu as f64 / n as f64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_bounds_are_positive_and_rsa_costs_more_than_ecdsa() {
        let b = Bounds::measure(None, None, true).unwrap();
        for k in [
            "x25519",
            "ecdsa_p256_sign",
            "rsa2048_pss_sign",
            "tls13_key_schedule",
            "tcp_accept_close",
        ] {
            assert!(b.ops_ns[k] > 0.0, "{k}: {:?}", b.ops_ns);
        }
        assert!(b.ops_ns["rsa2048_pss_sign"] > b.ops_ns["ecdsa_p256_sign"]);
        let full = b.handshake_us("TLS1.3 ECDSA full").unwrap();
        let resumed = b.handshake_us("TLS1.2 ECDSA resumed").unwrap();
        assert!(full > resumed, "{full} vs {resumed}");
        assert!(b.seal_ns_per_byte["AES-128-GCM"] > 0.0);
    }
}
