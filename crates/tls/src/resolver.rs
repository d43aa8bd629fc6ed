//! Certificate choice by SNI: exact names, one-label wildcards, and per
//! name an ECDSA certificate preferred over RSA when the client can verify it.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{SignatureAlgorithm, SignatureScheme};
use tlsgate_config::UnknownSni;

use crate::certs::LoadedCert;

/// The certificates that answer for one name: ECDSA first, then the rest
/// (RSA, Ed25519) in configuration order, and the name's client
/// certificate policy (an index into the listener's policies).
#[derive(Debug, Default, Clone)]
pub struct NameSlot {
    ecdsa: Option<Arc<CertifiedKey>>,
    others: Vec<Arc<CertifiedKey>>,
    client_auth: usize,
    /// The certificate (its index) that set `client_auth`.
    first: usize,
    /// Each certificate's index and the signature schemes its key can
    /// sign with, in the order `choose` tries them.
    signs: Vec<(usize, Vec<SignatureScheme>)>,
}

/// Every signature scheme a server key may be asked for.
const ALL_SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ECDSA_NISTP521_SHA512,
    SignatureScheme::ED25519,
    SignatureScheme::ED448,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA512,
    SignatureScheme::RSA_PKCS1_SHA256,
    SignatureScheme::RSA_PKCS1_SHA384,
    SignatureScheme::RSA_PKCS1_SHA512,
    SignatureScheme::ECDSA_SHA1_Legacy,
    SignatureScheme::RSA_PKCS1_SHA1,
];

/// The schemes of `ALL_SCHEMES` `ck`'s key can sign with.
fn schemes_of(ck: &CertifiedKey) -> Vec<SignatureScheme> {
    ALL_SCHEMES
        .iter()
        .copied()
        .filter(|s| ck.key.choose_scheme(&[*s]).is_some())
        .collect()
}

/// Why a listener's certificates cannot be indexed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// One name under two client certificate policies.
    #[error(transparent)]
    Policy(#[from] PolicyConflict),
    /// A certificate that would never be served.
    #[error(transparent)]
    Shadowed(#[from] Shadowed),
}

/// Two certificates of a listener that serve one name with keys of the
/// same type (the second can sign with no scheme the first cannot, e.g.
/// two ECDSA P-256 keys): the handshake always picks the first, the
/// other is never served. Typically a renewed certificate added next to
/// the old one, which would then be served until it expires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("certificate {shadowed} serves {name:?} with a {algorithm} key, as certificate {kept} does: it would never be served")]
pub struct Shadowed {
    /// The name as served (lower case; `*.` for wildcards).
    pub name: String,
    /// Index of the certificate that is always chosen.
    pub kept: usize,
    /// Index of the certificate that never is.
    pub shadowed: usize,
    /// The shadowed key's algorithm (`ECDSA`, `RSA`, …).
    pub algorithm: String,
}

/// Two certificates of a listener that answer for one name under
/// different client certificate policies. The handshake picks the policy
/// by name, before the certificate: one of them would be served under the
/// other's policy (a name that requires client certificates, served
/// without).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("certificates {first} and {second} both serve {name:?} under different client certificate policies")]
pub struct PolicyConflict {
    /// The name as served (lower case; `*.` for wildcards).
    pub name: String,
    /// Index of the certificate whose policy came first.
    pub first: usize,
    /// Index of the certificate that disagrees.
    pub second: usize,
}

impl NameSlot {
    /// Which of the listener's client certificate policies applies.
    pub fn client_auth(&self) -> usize {
        self.client_auth
    }

    fn add(
        &mut self,
        name: &str,
        (i, ck): (usize, &Arc<CertifiedKey>),
        client_auth: usize,
    ) -> Result<(), StoreError> {
        if self.ecdsa.is_none() && self.others.is_empty() {
            self.client_auth = client_auth;
            self.first = i;
        } else if self.client_auth != client_auth {
            return Err(PolicyConflict {
                name: name.to_string(),
                first: self.first,
                second: i,
            }
            .into());
        }
        let schemes = schemes_of(ck);
        let at = if ck.key.algorithm() == SignatureAlgorithm::ECDSA && self.ecdsa.is_none() {
            self.ecdsa = Some(ck.clone());
            0
        } else {
            self.others.push(ck.clone());
            self.signs.len()
        };
        self.signs.insert(at, (i, schemes));
        self.check_shadowing(name, at)
    }

    /// Whether the certificate at `at` (in `choose`'s order) is never
    /// chosen, or makes a later one never chosen: a certificate whose key
    /// signs with no scheme an earlier one cannot.
    fn check_shadowing(&self, name: &str, at: usize) -> Result<(), StoreError> {
        let covers = |a: &[SignatureScheme], b: &[SignatureScheme]| b.iter().all(|s| a.contains(s));
        let algorithm = |k: usize| {
            let ck = if k == 0 && self.ecdsa.is_some() {
                self.ecdsa.as_ref()
            } else {
                self.others.get(k - usize::from(self.ecdsa.is_some()))
            };
            ck.map_or_else(String::new, |c| format!("{:?}", c.key.algorithm()))
        };
        let Some((new, schemes)) = self.signs.get(at) else {
            return Ok(());
        };
        let mut earlier = self.signs.iter().take(at);
        if let Some((kept, _)) = earlier.find(|(_, e)| covers(e, schemes)) {
            return Err(Shadowed {
                name: name.to_string(),
                kept: *kept,
                shadowed: *new,
                algorithm: algorithm(at),
            }
            .into());
        }
        for (k, (later, l)) in self.signs.iter().enumerate().skip(at + 1) {
            if covers(schemes, l) {
                return Err(Shadowed {
                    name: name.to_string(),
                    kept: *new,
                    shadowed: *later,
                    algorithm: algorithm(k),
                }
                .into());
            }
        }
        Ok(())
    }

    /// The first certificate whose key can sign with a scheme the client
    /// offered. If none can, still the first one: rustls then fails suite or
    /// scheme selection and answers `handshake_failure`, which tells the
    /// client more than the `access_denied` of "no certificate".
    pub fn choose(&self, offered: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        let mut all = self.ecdsa.iter().chain(self.others.iter());
        all.clone()
            .find(|ck| ck.key.choose_scheme(offered).is_some())
            .or_else(|| all.next())
            .cloned()
    }
}

/// All certificates of a listener, indexed by server name.
#[derive(Debug)]
pub struct CertStore {
    exact: HashMap<String, NameSlot>,
    /// Keyed by the part after `*.`.
    wildcard: HashMap<String, NameSlot>,
    default: Option<NameSlot>,
}

impl CertStore {
    /// Indexes `certs`, the `i`th under client certificate policy
    /// `client_auth[i]` (0 when missing); with `UnknownSni::Reject` no
    /// default is kept. Names are compared as served (lower case, names
    /// from the certificates included), so entries that agree in the
    /// configuration but not in what they serve are caught here.
    pub fn new(
        certs: &[LoadedCert],
        client_auth: &[usize],
        unknown_sni: UnknownSni,
    ) -> Result<Self, StoreError> {
        let mut exact: HashMap<String, NameSlot> = HashMap::new();
        let mut wildcard: HashMap<String, NameSlot> = HashMap::new();
        let mut default: Option<NameSlot> = None;
        let auth = |i: usize| client_auth.get(i).copied().unwrap_or(0);
        for (i, c) in certs.iter().enumerate() {
            for name in &c.names {
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_string()).or_default().add(
                        name,
                        (i, &c.certified),
                        auth(i),
                    )?,
                    None => exact.entry(name.clone()).or_default().add(
                        name,
                        (i, &c.certified),
                        auth(i),
                    )?,
                }
            }
        }
        // After the names: a conflict is reported under its name.
        for (i, c) in certs.iter().enumerate() {
            if c.default && unknown_sni == UnknownSni::UseDefault {
                // The default may have an RSA twin under the same names.
                let mut slot = NameSlot::default();
                slot.add("(default)", (i, &c.certified), auth(i))?;
                for (j, other) in certs.iter().enumerate() {
                    if !other.default && other.names == c.names {
                        slot.add("(default)", (j, &other.certified), auth(j))?;
                    }
                }
                default = Some(slot);
            }
        }
        Ok(Self {
            exact,
            wildcard,
            default,
        })
    }

    /// The slot for a client's SNI, or `None` when the client must be refused.
    pub fn lookup(&self, sni: Option<&str>) -> Option<&NameSlot> {
        let found = sni.and_then(|name| {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            self.exact.get(&name).or_else(|| {
                let (_, parent) = name.split_once('.')?;
                self.wildcard.get(parent)
            })
        });
        found.or(self.default.as_ref())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.lookup(hello.server_name())?
            .choose(hello.signature_schemes())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls::crypto::aws_lc_rs::sign::any_supported_type;
    use rustls_pki_types::PrivateKeyDer;

    fn cert(alg: &'static rcgen::SignatureAlgorithm, names: &[&str], default: bool) -> LoadedCert {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["x.test".to_string()]).unwrap();
        let c = params.self_signed(&key).unwrap();
        let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        LoadedCert {
            certified: Arc::new(CertifiedKey::new(
                vec![c.der().clone()],
                any_supported_type(&der).unwrap(),
            )),
            names: names.iter().map(|s| s.to_string()).collect(),
            default,
        }
    }

    const ECDSA_AND_RSA: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::RSA_PSS_SHA256,
    ];
    const RSA_ONLY: &[SignatureScheme] = &[SignatureScheme::RSA_PSS_SHA256];

    #[test]
    fn exact_then_wildcard_then_default() {
        let a = cert(&rcgen::PKCS_ECDSA_P256_SHA256, &["a.example"], true);
        let w = cert(&rcgen::PKCS_ECDSA_P256_SHA256, &["*.example"], false);
        let store = CertStore::new(&[a.clone(), w.clone()], &[], UnknownSni::UseDefault).unwrap();
        let pick = |sni| store.lookup(sni).unwrap().choose(ECDSA_AND_RSA).unwrap();
        assert!(Arc::ptr_eq(&pick(Some("a.example")), &a.certified));
        assert!(Arc::ptr_eq(&pick(Some("A.Example.")), &a.certified));
        assert!(Arc::ptr_eq(&pick(Some("b.example")), &w.certified));
        // A wildcard covers exactly one label.
        assert!(Arc::ptr_eq(&pick(Some("c.b.example")), &a.certified));
        assert!(Arc::ptr_eq(&pick(Some("example")), &a.certified));
        assert!(Arc::ptr_eq(&pick(None), &a.certified));

        let strict = CertStore::new(&[a, w], &[], UnknownSni::Reject).unwrap();
        assert!(strict.lookup(Some("other.test")).is_none());
        assert!(strict.lookup(None).is_none());
        assert!(strict.lookup(Some("b.example")).is_some());
    }

    #[test]
    fn a_certificate_that_would_never_be_served_is_refused() {
        let old = cert(&rcgen::PKCS_ECDSA_P256_SHA256, &["a.example"], true);
        let new = cert(&rcgen::PKCS_ECDSA_P256_SHA256, &["a.example"], false);
        let e = CertStore::new(&[old.clone(), new], &[], UnknownSni::UseDefault).unwrap_err();
        assert_eq!(
            e,
            StoreError::Shadowed(Shadowed {
                name: "a.example".into(),
                kept: 0,
                shadowed: 1,
                algorithm: "ECDSA".into(),
            })
        );
        let r1 = cert(&rcgen::PKCS_RSA_SHA256, &["*.example"], false);
        let r2 = cert(&rcgen::PKCS_RSA_SHA256, &["*.example", "b.test"], false);
        assert!(matches!(
            CertStore::new(&[r1.clone(), r2], &[], UnknownSni::UseDefault),
            Err(StoreError::Shadowed(Shadowed {
                kept: 0,
                shadowed: 1,
                ..
            }))
        ));
        // Keys of other types or curves each serve some client.
        let p384 = cert(&rcgen::PKCS_ECDSA_P384_SHA384, &["a.example"], false);
        let r = cert(&rcgen::PKCS_RSA_SHA256, &["a.example"], false);
        CertStore::new(&[old, p384, r, r1], &[], UnknownSni::UseDefault).unwrap();
    }

    #[test]
    fn ecdsa_preferred_rsa_when_client_cannot_verify_ecdsa() {
        let e = cert(&rcgen::PKCS_ECDSA_P256_SHA256, &["a.example"], true);
        let r = cert(&rcgen::PKCS_RSA_SHA256, &["a.example"], false);
        let store = CertStore::new(&[r.clone(), e.clone()], &[], UnknownSni::UseDefault).unwrap();
        let slot = store.lookup(Some("a.example")).unwrap();
        assert!(Arc::ptr_eq(
            &slot.choose(ECDSA_AND_RSA).unwrap(),
            &e.certified
        ));
        assert!(Arc::ptr_eq(&slot.choose(RSA_ONLY).unwrap(), &r.certified));
        // Nothing usable: the ECDSA one, so rustls reports the mismatch.
        assert!(Arc::ptr_eq(
            &slot.choose(&[SignatureScheme::ED25519]).unwrap(),
            &e.certified
        ));
        // The default keeps its RSA twin too.
        let d = store.lookup(None).unwrap();
        assert!(Arc::ptr_eq(&d.choose(RSA_ONLY).unwrap(), &r.certified));
    }
}
