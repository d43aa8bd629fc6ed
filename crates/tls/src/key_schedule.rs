//! TLS 1.3's key schedule on HMAC keys prepared once per secret.
//!
//! rustls' aws-lc-rs suites derive every secret, key and IV with aws-lc's
//! one-shot `HKDF_expand`, which hashes HMAC's two padded key blocks
//! again for each label: four SHA-256 compressions per expansion where
//! two do once the padded key is kept. A full handshake makes about 25
//! expansions (traffic secrets, keys, IVs, Finished keys, one per
//! ticket). These suites are rustls' own (same AEAD, hash, limits) with
//! HKDF (RFC 5869) run on aws-lc's HMAC, whose key keeps the prepared
//! context and copies it per tag, as rustls' `HkdfUsingHmac` does but
//! with the key held in the expander itself (one allocation each, as
//! before, not two). The bytes are the same (the tests compare).

use std::sync::OnceLock;

use aws_lc_rs::hmac as lc;
use rustls::crypto::hmac::Tag;
use rustls::crypto::tls13::{Hkdf, HkdfExpander, OkmBlock, OutputLengthError};
use rustls::{CipherSuiteCommon, SupportedCipherSuite, Tls13CipherSuite};
use zeroize::Zeroize;

/// The longest hash output (SHA-384's; SHA-512 is not used by TLS 1.3).
const MAX_HASH: usize = 48;

/// HKDF on aws-lc's HMAC with prepared keys.
struct PreparedHkdf(&'static lc::Algorithm);

impl PreparedHkdf {
    fn len(&self) -> usize {
        self.0.digest_algorithm().output_len()
    }

    fn expander(&self, prk: &[u8]) -> Box<dyn HkdfExpander> {
        Box::new(PreparedExpander(lc::Key::new(*self.0, prk)))
    }
}

impl Hkdf for PreparedHkdf {
    fn extract_from_zero_ikm(&self, salt: Option<&[u8]>) -> Box<dyn HkdfExpander> {
        let zeroes = [0u8; MAX_HASH];
        self.extract_from_secret(salt, zeroes.get(..self.len()).unwrap_or_default())
    }

    fn extract_from_secret(&self, salt: Option<&[u8]>, secret: &[u8]) -> Box<dyn HkdfExpander> {
        // A salt of None is HashLen zeroes (RFC 5869 §2.2).
        let zeroes = [0u8; MAX_HASH];
        let salt = salt.unwrap_or(zeroes.get(..self.len()).unwrap_or_default());
        let prk = lc::sign(&lc::Key::new(*self.0, salt), secret);
        self.expander(prk.as_ref())
    }

    fn expander_for_okm(&self, okm: &OkmBlock) -> Box<dyn HkdfExpander> {
        self.expander(okm.as_ref())
    }

    fn hmac_sign(&self, key: &OkmBlock, message: &[u8]) -> Tag {
        Tag::new(lc::sign(&lc::Key::new(*self.0, key.as_ref()), message).as_ref())
    }
}

/// HKDF-Expand from a PRK whose padded key blocks are hashed: each
/// block of output starts from a copy of that context.
struct PreparedExpander(lc::Key);

impl HkdfExpander for PreparedExpander {
    fn expand_slice(&self, info: &[&[u8]], output: &mut [u8]) -> Result<(), OutputLengthError> {
        let len = self.hash_len();
        if output.len() > 255 * len {
            return Err(OutputLengthError);
        }
        // T(0) is empty; T(n) = HMAC(PRK, T(n-1) | info | n).
        let mut t = [0u8; MAX_HASH];
        let mut previous = 0;
        for (n, chunk) in (1u8..).zip(output.chunks_mut(len)) {
            let mut ctx = lc::Context::with_key(&self.0);
            ctx.update(t.get(..previous).unwrap_or_default());
            for piece in info {
                ctx.update(piece);
            }
            ctx.update(&[n]);
            let tag = ctx.sign();
            let tag = tag.as_ref();
            if let Some(dst) = t.get_mut(..tag.len()) {
                dst.copy_from_slice(tag);
            }
            previous = tag.len();
            chunk.copy_from_slice(t.get(..chunk.len()).unwrap_or_default());
        }
        t.zeroize();
        Ok(())
    }

    fn expand_block(&self, info: &[&[u8]]) -> OkmBlock {
        let mut block = [0u8; MAX_HASH];
        let len = self.hash_len();
        let out = block.get_mut(..len).unwrap_or_default();
        // One block of output is always within 255 of them.
        let _ = self.expand_slice(info, out);
        let okm = OkmBlock::new(out);
        block.zeroize();
        okm
    }

    fn hash_len(&self) -> usize {
        self.0.algorithm().digest_algorithm().output_len()
    }
}

static HKDF_SHA256: PreparedHkdf = PreparedHkdf(&lc::HMAC_SHA256);
static HKDF_SHA384: PreparedHkdf = PreparedHkdf(&lc::HMAC_SHA384);

/// `suite` with the prepared-key schedule when it is a TLS 1.3 suite of
/// SHA-256 or SHA-384; any other suite as it is.
pub(crate) fn prepared(suite: SupportedCipherSuite) -> SupportedCipherSuite {
    static AES_128: OnceLock<Tls13CipherSuite> = OnceLock::new();
    static AES_256: OnceLock<Tls13CipherSuite> = OnceLock::new();
    static CHACHA: OnceLock<Tls13CipherSuite> = OnceLock::new();
    let SupportedCipherSuite::Tls13(base) = suite else {
        return suite;
    };
    let (cell, hkdf): (&'static OnceLock<_>, &'static PreparedHkdf) = match base.common.suite {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => (&AES_128, &HKDF_SHA256),
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => (&AES_256, &HKDF_SHA384),
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => (&CHACHA, &HKDF_SHA256),
        _ => return suite,
    };
    SupportedCipherSuite::Tls13(cell.get_or_init(|| Tls13CipherSuite {
        common: CipherSuiteCommon {
            suite: base.common.suite,
            hash_provider: base.common.hash_provider,
            confidentiality_limit: base.common.confidentiality_limit,
        },
        hkdf_provider: hkdf,
        aead_alg: base.aead_alg,
        quic: base.quic,
    }))
}

/// aws-lc-rs' default provider (suites, groups, signatures) with the
/// prepared-key schedule in its TLS 1.3 suites: for TLS clients (the
/// proxy's upstream connections).
pub fn default_provider() -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    for suite in &mut provider.cipher_suites {
        *suite = prepared(*suite);
    }
    provider
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    use rustls::crypto::tls13::Hkdf;

    use super::*;

    fn hkdf(s: SupportedCipherSuite) -> &'static dyn Hkdf {
        match s {
            SupportedCipherSuite::Tls13(t) => t.hkdf_provider,
            SupportedCipherSuite::Tls12(_) => panic!("not TLS 1.3"),
        }
    }

    #[test]
    fn every_derivation_matches_rustls_own_schedule() {
        for base in [
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
        ] {
            let ours = hkdf(prepared(base));
            let theirs = hkdf(base);
            assert!(!std::ptr::addr_eq(ours, theirs), "{base:?} not replaced");
            let info: [&[u8]; 3] = [b"\x00\x20", b"\x0dtls13 c hs traffic", b"\x20abc"];
            for (salt, secret) in [
                (None, &b"shared secret of a key exchange"[..]),
                (Some(&b"derived"[..]), &[0u8; 48][..]),
                (Some(&[7u8; 200][..]), &b""[..]),
            ] {
                let (a, b) = (
                    ours.extract_from_secret(salt, secret),
                    theirs.extract_from_secret(salt, secret),
                );
                assert_eq!(
                    a.expand_block(&info).as_ref(),
                    b.expand_block(&info).as_ref()
                );
                let (mut x, mut y) = ([0u8; 100], [0u8; 100]);
                a.expand_slice(&info, &mut x).unwrap();
                b.expand_slice(&info, &mut y).unwrap();
                assert_eq!(x, y, "{base:?}");
                // Past 255 blocks both refuse.
                let mut long = vec![0u8; 255 * a.hash_len() + 1];
                assert!(a.expand_slice(&info, &mut long).is_err());
                assert!(b.expand_slice(&info, &mut long).is_err());
                let okm = a.expand_block(&info);
                assert_eq!(
                    ours.hmac_sign(&okm, b"transcript hash").as_ref(),
                    theirs.hmac_sign(&okm, b"transcript hash").as_ref()
                );
                assert_eq!(
                    ours.expander_for_okm(&okm).expand_block(&info).as_ref(),
                    theirs.expander_for_okm(&okm).expand_block(&info).as_ref()
                );
            }
            assert_eq!(
                ours.extract_from_zero_ikm(None)
                    .expand_block(&info)
                    .as_ref(),
                theirs
                    .extract_from_zero_ikm(None)
                    .expand_block(&info)
                    .as_ref()
            );
        }
        // TLS 1.2 suites pass unchanged.
        let tls12 = cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;
        assert!(matches!(prepared(tls12), SupportedCipherSuite::Tls12(t)
            if std::ptr::eq(t, match tls12 { SupportedCipherSuite::Tls12(b) => b, _ => unreachable!() })));
    }
}
