//! The generator's side of the key exchange, made cheaper than a real
//! client's without changing what a server does.
//!
//! - **One key share per group, reused**: every ClientHello carries the
//!   same X25519 (or P-256) public value, so a handshake costs the
//!   generator one ECDH and no key generation. A server still generates its
//!   own key and computes the shared secret: it cannot tell, and none of the
//!   targets caches anything by the client's share. On resumed TLS 1.3
//!   handshakes the key generation was ~4 % of the generator's core, which
//!   then, not the server, was the limit.
//! - **Randoms from a fast generator**: client randoms and session ids need
//!   to differ, not to be secret, here.
//!
//! Never for a real client: a reused share gives up forward secrecy.

use std::sync::{Arc, OnceLock};

use aws_lc_rs::agreement::{self, Algorithm, PrivateKey, UnparsedPublicKey};
use rustls::crypto::{
    ActiveKeyExchange, GetRandomFailed, SecureRandom, SharedSecret, SupportedKxGroup,
};
use rustls::{Error, NamedGroup, PeerMisbehaved};

/// A group whose key share is generated once per process.
#[derive(Debug)]
pub(crate) struct ReusedKeyShare {
    name: NamedGroup,
    algorithm: &'static Algorithm,
    key: OnceLock<Result<Arc<KeyShare>, String>>,
}

/// The private key and its public value, as sent.
#[derive(Debug)]
struct KeyShare {
    private: PrivateKey,
    public: Vec<u8>,
}

/// X25519 with one key share for every handshake.
pub(crate) static X25519: ReusedKeyShare =
    ReusedKeyShare::new(NamedGroup::X25519, &agreement::X25519);

/// P-256 with one key share for every handshake.
pub(crate) static SECP256R1: ReusedKeyShare =
    ReusedKeyShare::new(NamedGroup::secp256r1, &agreement::ECDH_P256);

impl ReusedKeyShare {
    const fn new(name: NamedGroup, algorithm: &'static Algorithm) -> Self {
        Self {
            name,
            algorithm,
            key: OnceLock::new(),
        }
    }

    fn key(&self) -> Result<&Arc<KeyShare>, Error> {
        self.key
            .get_or_init(|| {
                let key = PrivateKey::generate(self.algorithm)
                    .map_err(|_| format!("cannot generate a {:?} key", self.name))?;
                let public = key
                    .compute_public_key()
                    .map_err(|_| format!("cannot compute a {:?} public key", self.name))?;
                Ok(Arc::new(KeyShare {
                    private: key,
                    public: public.as_ref().to_vec(),
                }))
            })
            .as_ref()
            .map_err(|e| Error::General(e.clone()))
    }
}

impl SupportedKxGroup for ReusedKeyShare {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        Ok(Box::new(Exchange {
            name: self.name,
            algorithm: self.algorithm,
            share: self.key()?.clone(),
        }))
    }

    fn name(&self) -> NamedGroup {
        self.name
    }
}

/// One handshake's use of the shared key.
struct Exchange {
    name: NamedGroup,
    algorithm: &'static Algorithm,
    share: Arc<KeyShare>,
}

impl ActiveKeyExchange for Exchange {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        agreement::agree(
            &self.share.private,
            UnparsedPublicKey::new(self.algorithm, peer),
            Error::from(PeerMisbehaved::InvalidKeyShare),
            |secret| Ok(SharedSecret::from(secret)),
        )
    }

    fn pub_key(&self) -> &[u8] {
        &self.share.public
    }

    fn group(&self) -> NamedGroup {
        self.name
    }
}

/// Randoms that only need to differ.
#[derive(Debug)]
pub(crate) struct FastRandom;

impl SecureRandom for FastRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        fastrand::fill(buf);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls::crypto::aws_lc_rs::kx_group;

    /// A real implementation on the other side agrees on the secret, and
    /// the share is the same from one handshake to the next.
    #[test]
    fn agrees_with_a_fresh_key_and_reuses_its_share() {
        for (ours, theirs) in [
            (&X25519, kx_group::X25519),
            (&SECP256R1, kx_group::SECP256R1),
        ] {
            let a = ours.start().unwrap();
            let b = ours.start().unwrap();
            assert_eq!(a.pub_key(), b.pub_key(), "{:?}", ours.name);
            let server = theirs.start_and_complete(a.pub_key()).unwrap();
            let client = a.complete(&server.pub_key).unwrap();
            assert_eq!(client.secret_bytes(), server.secret.secret_bytes());
            assert!(
                b.complete(&[0u8; 7]).is_err(),
                "a malformed share is refused"
            );
        }
    }
}
