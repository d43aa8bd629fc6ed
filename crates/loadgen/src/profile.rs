//! What a client offers: exactly one protocol version, one cipher suite, one
//! key-exchange group and one kind of server key, so every target under test
//! negotiates the same thing (or fails visibly).

use std::fmt;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider, kx_group};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::{ClientConfig, SignatureScheme, SupportedCipherSuite};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use crate::error::LoadError;
use crate::kx;
use crate::verify::SkipVerification;

/// Protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Version {
    /// TLS 1.2.
    #[serde(rename = "TLSv1.2")]
    Tls12,
    /// TLS 1.3.
    #[serde(rename = "TLSv1.3")]
    Tls13,
}

/// The server certificate's key type (chosen through the signature schemes
/// the client offers, and in TLS 1.2 the suite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KeyType {
    /// ECDSA P-256.
    #[serde(rename = "ECDSA-P256")]
    EcdsaP256,
    /// RSA 2048.
    #[serde(rename = "RSA-2048")]
    Rsa2048,
}

/// Bulk cipher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Cipher {
    /// AES-128-GCM.
    #[serde(rename = "AES-128-GCM")]
    Aes128Gcm,
    /// AES-256-GCM.
    #[serde(rename = "AES-256-GCM")]
    Aes256Gcm,
    /// ChaCha20-Poly1305.
    #[serde(rename = "CHACHA20-POLY1305")]
    Chacha20Poly1305,
}

/// Key-exchange group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Group {
    /// X25519.
    X25519,
    /// NIST P-256.
    P256,
    /// Hybrid X25519 + ML-KEM-768 (TLS 1.3 only).
    X25519Mlkem768,
}

/// A client certificate and key, for mutual TLS.
#[derive(Debug)]
pub struct ClientIdentity {
    /// Certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for ClientIdentity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// Everything a client offers in its handshake.
#[derive(Debug, Clone)]
pub struct TlsProfile {
    /// The only version offered.
    pub version: Version,
    /// The server key type wanted.
    pub key: KeyType,
    /// The only bulk cipher offered.
    pub cipher: Cipher,
    /// The only group offered.
    pub group: Group,
    /// Resume sessions (tickets or session IDs) after the first handshake.
    pub resume: bool,
    /// Present this client certificate when asked.
    pub client_identity: Option<ClientIdentity>,
}

impl TlsProfile {
    /// TLS 1.3, AES-128-GCM, X25519, full handshakes with an ECDSA server key.
    pub fn tls13_ecdsa() -> Self {
        Self {
            version: Version::Tls13,
            key: KeyType::EcdsaP256,
            cipher: Cipher::Aes128Gcm,
            group: Group::X25519,
            resume: false,
            client_identity: None,
        }
    }

    /// A short label: "TLS1.3 ECDSA full".
    pub fn label(&self) -> String {
        format!(
            "{} {} {}{}",
            match self.version {
                Version::Tls12 => "TLS1.2",
                Version::Tls13 => "TLS1.3",
            },
            match self.key {
                KeyType::EcdsaP256 => "ECDSA",
                KeyType::Rsa2048 => "RSA",
            },
            if self.resume { "resumed" } else { "full" },
            if self.client_identity.is_some() {
                " mTLS"
            } else {
                ""
            }
        )
    }

    /// The rustls suite this profile offers.
    pub fn suite(&self) -> SupportedCipherSuite {
        match (self.version, self.key, self.cipher) {
            (Version::Tls13, _, Cipher::Aes128Gcm) => cs::TLS13_AES_128_GCM_SHA256,
            (Version::Tls13, _, Cipher::Aes256Gcm) => cs::TLS13_AES_256_GCM_SHA384,
            (Version::Tls13, _, Cipher::Chacha20Poly1305) => cs::TLS13_CHACHA20_POLY1305_SHA256,
            (Version::Tls12, KeyType::EcdsaP256, Cipher::Aes128Gcm) => {
                cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            }
            (Version::Tls12, KeyType::EcdsaP256, Cipher::Aes256Gcm) => {
                cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            }
            (Version::Tls12, KeyType::EcdsaP256, Cipher::Chacha20Poly1305) => {
                cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            }
            (Version::Tls12, KeyType::Rsa2048, Cipher::Aes128Gcm) => {
                cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            }
            (Version::Tls12, KeyType::Rsa2048, Cipher::Aes256Gcm) => {
                cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
            }
            (Version::Tls12, KeyType::Rsa2048, Cipher::Chacha20Poly1305) => {
                cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            }
        }
    }

    /// rustls' name of the group, as a negotiated group is reported.
    pub fn group_name(&self) -> String {
        format!("{:?}", self.kx_group().name())
    }

    fn kx_group(&self) -> &'static dyn SupportedKxGroup {
        match self.group {
            Group::X25519 => &kx::X25519,
            Group::P256 => &kx::SECP256R1,
            Group::X25519Mlkem768 => kx_group::X25519MLKEM768,
        }
    }

    /// Signature schemes offered: they make the server pick the key type.
    pub(crate) fn signature_schemes(&self) -> Vec<SignatureScheme> {
        match self.key {
            KeyType::EcdsaP256 => vec![SignatureScheme::ECDSA_NISTP256_SHA256],
            // PSS signs (TLS 1.3 forbids PKCS#1 v1.5 there, and every
            // target uses PSS when offered), but HAProxy picks its RSA
            // certificate only for clients that also list PKCS#1.
            KeyType::Rsa2048 => vec![
                SignatureScheme::RSA_PSS_SHA256,
                SignatureScheme::RSA_PKCS1_SHA256,
            ],
        }
    }

    /// The rustls client configuration. `sessions` bounds the resumption
    /// cache (per server name, rustls keeps a few TLS 1.3 tickets).
    pub fn client_config(&self, sessions: usize) -> Result<Arc<ClientConfig>, LoadError> {
        let mut kx_groups = vec![self.kx_group()];
        if self.version == Version::Tls12
            && self.key == KeyType::EcdsaP256
            && self.group != Group::P256
        {
            // OpenSSL serves a P-256 certificate over TLS 1.2 only to
            // clients listing P-256 among their groups (RFC 4492's rule);
            // the key exchange still uses the first, preferred group.
            kx_groups.push(&kx::SECP256R1);
        }
        let provider = CryptoProvider {
            cipher_suites: vec![self.suite()],
            kx_groups,
            secure_random: &kx::FastRandom,
            ..default_provider()
        };
        let version: &'static rustls::SupportedProtocolVersion = match self.version {
            Version::Tls12 => &rustls::version::TLS12,
            Version::Tls13 => &rustls::version::TLS13,
        };
        let profile_error = |source| LoadError::Profile {
            profile: self.label(),
            source,
        };
        let builder = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[version])
            .map_err(profile_error)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerification::new(
                self.signature_schemes(),
            )));
        let mut config = match &self.client_identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .map_err(profile_error)?,
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = if self.resume {
            Resumption::in_memory_sessions(sessions.max(16))
        } else {
            Resumption::disabled()
        };
        Ok(Arc::new(config))
    }
}

impl fmt::Display for TlsProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_builds_a_client_config() {
        for version in [Version::Tls12, Version::Tls13] {
            for key in [KeyType::EcdsaP256, KeyType::Rsa2048] {
                for cipher in [
                    Cipher::Aes128Gcm,
                    Cipher::Aes256Gcm,
                    Cipher::Chacha20Poly1305,
                ] {
                    let p = TlsProfile {
                        version,
                        key,
                        cipher,
                        group: Group::X25519,
                        resume: true,
                        client_identity: None,
                    };
                    let suite = p.suite();
                    assert_eq!(
                        suite.version().version,
                        match version {
                            Version::Tls12 => rustls::ProtocolVersion::TLSv1_2,
                            Version::Tls13 => rustls::ProtocolVersion::TLSv1_3,
                        }
                    );
                    p.client_config(16).expect("profile builds");
                }
            }
        }
    }

    #[test]
    fn labels_say_version_key_and_resumption() {
        let mut p = TlsProfile::tls13_ecdsa();
        assert_eq!(p.label(), "TLS1.3 ECDSA full");
        p.resume = true;
        p.version = Version::Tls12;
        p.key = KeyType::Rsa2048;
        assert_eq!(p.label(), "TLS1.2 RSA resumed");
    }
}
