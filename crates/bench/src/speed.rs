//! The machine's speed now, from a fixed reference workload.
//!
//! A shared machine's speed drifts over minutes with what other tenants
//! of its host do: the same 1 KiB full-handshake cell measured 115.7 µs of
//! server CPU during a calibration and 108.9 µs in the validation half an
//! hour later, each a median of five repeats. No model predicts a machine
//! better than its speed varies, so each cell is bracketed by a reference
//! workload on the server's core (idle between cells), and costs are
//! stated at the model's reference speed (`tlsgate cost`).

use std::time::Duration;

use aws_lc_rs::{aead, agreement, rand, signature};

use crate::bound::{crypto, per_op};
use crate::error::BenchError;

/// How long the reference runs on each side of a cell.
const SPAN: Duration = Duration::from_millis(150);

/// The reference: what a TLS server's CPU does, in about a handshake's
/// proportions: a key agreement, a signature and 64 KiB of AES-GCM.
struct Reference {
    rng: rand::SystemRandom,
    peer: Vec<u8>,
    signer: signature::EcdsaKeyPair,
    sealer: aead::LessSafeKey,
    record: Vec<u8>,
    seq: u64,
}

impl Reference {
    fn new() -> Result<Self, BenchError> {
        let rng = rand::SystemRandom::new();
        let peer = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng)
            .and_then(|k| k.compute_public_key())
            .map_err(crypto("speed reference"))?
            .as_ref()
            .to_vec();
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng)
            .map_err(crypto("speed reference"))?;
        let signer = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref())
            .map_err(crypto("speed reference"))?;
        let key = aead::UnboundKey::new(&aead::AES_128_GCM, &[7u8; 16])
            .map_err(crypto("speed reference"))?;
        Ok(Self {
            rng,
            peer,
            signer,
            sealer: aead::LessSafeKey::new(key),
            record: vec![0u8; 16 * 1024],
            seq: 0,
        })
    }

    fn round(&mut self) {
        if let Ok(k) = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &self.rng) {
            let _ = agreement::agree_ephemeral(
                k,
                agreement::UnparsedPublicKey::new(&agreement::X25519, &self.peer),
                (),
                |s| {
                    std::hint::black_box(s);
                    Ok(())
                },
            );
        }
        let _ = std::hint::black_box(self.signer.sign(&self.rng, &[0x20u8; 130]));
        for _ in 0..4 {
            self.seq += 1;
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&self.seq.to_be_bytes());
            let _ = std::hint::black_box(self.sealer.seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::empty(),
                &mut self.record,
            ));
        }
    }
}

/// CPU ns per reference round on `core` now (run on a thread pinned there).
pub fn reference_ns(core: Option<usize>) -> Result<f64, BenchError> {
    let run = move || -> Result<f64, BenchError> {
        if let Some(id) = core {
            core_affinity::set_for_current(core_affinity::CoreId { id });
        }
        let mut r = Reference::new()?;
        // Warm: keys, caches and the core's clock.
        for _ in 0..20 {
            r.round();
        }
        Ok(per_op(SPAN, 1, || r.round()))
    };
    std::thread::spawn(run)
        .join()
        .map_err(|_| BenchError::Other("the speed reference's thread panicked".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_costs_what_its_cryptography_costs() {
        let ns = reference_ns(None).unwrap();
        // An ECDSA signature alone is some 20 µs, 64 KiB of AES-GCM some
        // 15 µs on any x86-64 of the last decade; a round is neither free
        // nor a millisecond.
        assert!(ns > 5_000.0 && ns < 1_000_000.0, "{ns}");
    }
}
