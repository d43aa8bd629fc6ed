//! Certificates and private keys: loading PEM files, reading the names a
//! certificate covers, and making the self-signed certificate of the
//! embedded default.
//!
//! Key bytes are held in zeroizing buffers and wiped as soon as the signing
//! key has been built; nothing here logs key material.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::crypto::aws_lc_rs::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls::SignatureAlgorithm;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
use zeroize::{Zeroize, Zeroizing};

use crate::error::CertError;

/// A certificate chain with its signing key and the names it serves.
#[derive(Clone, Debug)]
pub struct LoadedCert {
    /// Chain and key, ready for rustls.
    pub certified: Arc<CertifiedKey>,
    /// Names to serve it for: explicit, or the leaf's DNS SANs.
    pub names: Vec<String>,
    /// Whether it is served to clients whose SNI matches nothing.
    pub default: bool,
}

impl LoadedCert {
    /// The key's algorithm (ECDSA, RSA, Ed25519).
    pub fn algorithm(&self) -> SignatureAlgorithm {
        self.certified.key.algorithm()
    }
}

/// Loads one `[[listener.certificate]]` entry.
pub fn load(files: &tlsgate_config::CertificateFiles) -> Result<LoadedCert, CertError> {
    let err = |what: &str, path: &Path, problem: String| CertError {
        key: format!("{}.{what}", files.key_path),
        path: path.to_path_buf(),
        problem,
    };
    let chain_pem = std::fs::read(&files.cert)
        .map_err(|e| err("cert", &files.cert, format!("cannot read: {e}")))?;
    let chain = CertificateDer::pem_slice_iter(&chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            err(
                "cert",
                &files.cert,
                format!("not a PEM certificate chain: {e}"),
            )
        })?;
    if chain.is_empty() {
        return Err(err(
            "cert",
            &files.cert,
            "expected at least one CERTIFICATE block".into(),
        ));
    }
    // Parse the leaf now so a broken certificate is blamed on `cert`, not
    // on the key check below.
    let san_names = dns_names(&chain[0]).map_err(|problem| err("cert", &files.cert, problem))?;
    let key_pem = Zeroizing::new(
        std::fs::read(&files.key)
            .map_err(|e| err("key", &files.key, format!("cannot read: {e}")))?,
    );
    let mut key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        err(
            "key",
            &files.key,
            format!("expected a PKCS#8, SEC1 or PKCS#1 PEM private key: {e}"),
        )
    })?;
    let signing = any_supported_type(&key);
    key.zeroize();
    let signing =
        signing.map_err(|e| err("key", &files.key, format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    // Catches a key file that belongs to another certificate.
    certified.keys_match().map_err(|e| {
        err(
            "key",
            &files.key,
            format!("does not match the certificate: {e}"),
        )
    })?;
    let names = match &files.names {
        Some(n) => n.iter().map(|s| s.to_ascii_lowercase()).collect(),
        None => san_names,
    };
    if names.is_empty() && !files.default {
        return Err(err(
            "cert",
            &files.cert,
            "the certificate has no DNS names; give `names` or make it the default".into(),
        ));
    }
    Ok(LoadedCert {
        certified: Arc::new(certified),
        names,
        default: files.default,
    })
}

/// The DNS subjectAltNames of a certificate, lower-cased.
fn dns_names(der: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let (_, cert) = X509Certificate::from_der(der.as_ref())
        .map_err(|e| format!("cannot parse the leaf certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("bad subjectAltName extension: {e}"))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The self-signed certificate, made once per process and kept across reloads.
#[derive(Default)]
pub struct SelfSignedCache(OnceLock<Result<LoadedCert, String>>);

impl SelfSignedCache {
    /// The certificate, made on first use.
    pub fn get(&self) -> Result<LoadedCert, String> {
        self.0
            .get_or_init(|| {
                let made = self_signed().map_err(|e| e.to_string())?;
                tracing::info!(
                    "generated a self-signed ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1, \
                     valid 90 days; clients must skip verification (curl -k)"
                );
                Ok(made.loaded)
            })
            .clone()
    }
}

/// Loads the certificates and keys of every listener of `config`, in the
/// order of `config.listeners`, reporting problems under their config keys.
pub fn load_all(
    config: &tlsgate_config::Config,
    self_signed: &SelfSignedCache,
) -> Result<Vec<Vec<LoadedCert>>, tlsgate_config::ConfigError> {
    use tlsgate_config::{Certificates, ConfigError};
    let origin = &config.origin;
    config
        .listeners
        .iter()
        .map(|l| match &l.certificates {
            Certificates::SelfSigned => Ok(vec![self_signed.get().map_err(|problem| {
                ConfigError::new(origin, format!("{}.self_signed", l.key_path), problem)
            })?]),
            Certificates::Files(files) => files
                .iter()
                .map(|f| {
                    load(f).map_err(|e| {
                        ConfigError::new(
                            origin,
                            e.key.clone(),
                            format!("{} ({})", e.problem, e.path.display()),
                        )
                    })
                })
                .collect(),
        })
        .collect()
}

/// A PEM certificate and key generated in memory.
pub struct SelfSigned {
    /// Certificate PEM (public).
    pub cert_pem: String,
    /// Private key PEM, wiped on drop.
    pub key_pem: Zeroizing<String>,
    /// The loaded form.
    pub loaded: LoadedCert,
}

/// Makes an ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1,
/// valid from an hour ago for 90 days (short, as a throw-away should be).
pub fn self_signed() -> Result<SelfSigned, rcgen::Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, "localhost");
    dn.push(rcgen::DnType::OrganizationName, "tlsgate self-signed");
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(90);
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key)?;
    let key_der = Zeroizing::new(key.serialize_der());
    let pkcs8 = PrivateKeyDer::Pkcs8(key_der.to_vec().into());
    let signing = any_supported_type(&pkcs8).map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
    let mut pkcs8 = pkcs8;
    pkcs8.zeroize();
    Ok(SelfSigned {
        cert_pem: cert.pem(),
        key_pem: Zeroizing::new(key.serialize_pem()),
        loaded: LoadedCert {
            certified: Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)),
            names: vec!["localhost".into()],
            default: true,
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &str, key: &str) -> tlsgate_config::CertificateFiles {
        let c = dir.join("c.pem");
        let k = dir.join("k.pem");
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        tlsgate_config::CertificateFiles {
            key_path: "listener[0].certificate[0]".into(),
            cert: c,
            key: k,
            names: None,
            default: false,
            client_auth: tlsgate_config::ClientAuth::none(),
        }
    }

    #[test]
    fn self_signed_round_trips_through_load() {
        let s = self_signed().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(&files(dir.path(), &s.cert_pem, &s.key_pem)).unwrap();
        assert_eq!(loaded.names, vec!["localhost".to_string()]);
        assert_eq!(loaded.algorithm(), SignatureAlgorithm::ECDSA);
    }

    #[test]
    fn mismatched_key_and_garbage_are_refused_with_the_key_name() {
        let a = self_signed().unwrap();
        let b = self_signed().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let e = load(&files(dir.path(), &a.cert_pem, &b.key_pem)).unwrap_err();
        assert_eq!(e.key, "listener[0].certificate[0].key");
        assert!(e.problem.contains("does not match"), "{e}");
        let e = load(&files(dir.path(), "garbage", &a.key_pem)).unwrap_err();
        assert_eq!(e.key, "listener[0].certificate[0].cert");
        let e = load(&files(dir.path(), &a.cert_pem, "garbage")).unwrap_err();
        assert_eq!(e.key, "listener[0].certificate[0].key");
        assert!(
            !e.to_string().contains("BEGIN"),
            "never echo key material: {e}"
        );
    }
}
