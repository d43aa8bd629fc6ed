//! Mutual TLS: the verifier of client certificates for one name's policy,
//! and the verified identity ([`ClientIdentity`]) that the access log and,
//! for proxied requests, the upstream get.

use std::fmt::Write as _;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tlsgate_config::{ClientAuth, ClientAuthMode};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::CertError;

/// A client certificate verifier and the SHA-256 of the CA bundle it trusts.
pub struct Verifier {
    /// What rustls calls.
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// SHA-256 of the bundle's bytes.
    pub bundle_sha256: [u8; 32],
}

/// The verifier for `auth`, or `None` when no certificate is asked for.
///
/// rustls answers each verification failure with its alert: `unknown_ca`,
/// `certificate_expired`, `bad_certificate`, `decrypt_error` for a bad
/// signature, and `certificate_required` (TLS 1.3) when a required
/// certificate is missing.
/// Tickets are bound to the bundle's hash, so a session verified against
/// one set of CAs never resumes under another.
///
/// The bundle comes from `material`: the key holder read it (it may be
/// readable by root only, and a reload runs as `server.user`).
pub fn verifier(
    auth: &ClientAuth,
    provider: &Arc<CryptoProvider>,
    material: &crate::Material,
) -> Result<Option<Verifier>, CertError> {
    let Some(ca) = auth
        .ca
        .as_ref()
        .filter(|_| auth.mode != ClientAuthMode::None)
    else {
        return Ok(None);
    };
    let fail = |problem: String| CertError {
        key: auth.ca_key.clone(),
        path: ca.clone(),
        problem,
    };
    let bytes = material
        .read(ca)
        .map_err(|e| fail(format!("cannot read the CA bundle: {e}")))?;
    let bytes = bytes.as_slice();
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(format!("expected PEM CERTIFICATE blocks: {e}")))?;
    if certs.is_empty() {
        return Err(fail("expected at least one PEM CERTIFICATE block".into()));
    }
    let mut roots = RootCertStore::empty();
    for (i, der) in certs.into_iter().enumerate() {
        roots.add(der).map_err(|e| {
            fail(format!(
                "certificate {} of the bundle is not a usable CA: {e}",
                i + 1
            ))
        })?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match auth.mode {
        ClientAuthMode::Optional => builder.allow_unauthenticated(),
        _ => builder,
    };
    let verifier = builder
        .build()
        .map_err(|e| fail(format!("cannot build the client verifier: {e}")))?;
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    let mut bundle_sha256 = [0u8; 32];
    bundle_sha256.copy_from_slice(digest.as_ref());
    Ok(Some(Verifier {
        verifier,
        bundle_sha256,
    }))
}

/// Who a verified client certificate names: its subject, its subject
/// alternative names and the SHA-256 of its DER (what RFC 8705 binds
/// tokens to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The subject as `CN=client, O=Example`.
    pub subject: String,
    /// The subject's common name, if any.
    pub common_name: Option<String>,
    /// DNS names, e-mail addresses, URIs and IP addresses, in certificate
    /// order, each with its kind (`DNS:a.example`, `URI:spiffe://…`).
    pub sans: Vec<String>,
    /// SHA-256 of the certificate's DER.
    pub sha256: [u8; 32],
}

impl ClientIdentity {
    /// The identity of the leaf of a verified chain, or `None` without one
    /// (or if the leaf cannot be parsed, which the verifier already refused).
    pub fn from_chain(chain: &[CertificateDer<'_>]) -> Option<Self> {
        let leaf = chain.first()?;
        let (_, cert) = X509Certificate::from_der(leaf).ok()?;
        let subject = cert.subject().to_string();
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            for name in &ext.value.general_names {
                match name {
                    GeneralName::DNSName(d) => sans.push(format!("DNS:{d}")),
                    GeneralName::RFC822Name(m) => sans.push(format!("email:{m}")),
                    GeneralName::URI(u) => sans.push(format!("URI:{u}")),
                    GeneralName::IPAddress(ip) => {
                        if let Some(ip) = ip_text(ip) {
                            sans.push(format!("IP:{ip}"));
                        }
                    }
                    _ => {}
                }
            }
        }
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, leaf);
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(digest.as_ref());
        Some(Self {
            subject,
            common_name,
            sans,
            sha256,
        })
    }

    /// The identity of the client of an established connection.
    pub fn of(conn: &rustls::ServerConnection) -> Option<Self> {
        Self::from_chain(conn.peer_certificates()?)
    }

    /// A short name for logs: the common name, else the first SAN.
    pub fn short_name(&self) -> &str {
        self.common_name
            .as_deref()
            .or_else(|| {
                self.sans
                    .first()
                    .map(|s| s.split_once(':').map_or(s.as_str(), |(_, v)| v))
            })
            .unwrap_or("-")
    }

    /// The SHA-256 as lowercase hex.
    pub fn sha256_hex(&self) -> String {
        self.sha256
            .iter()
            .fold(String::with_capacity(64), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }

    /// The value of an `X-Forwarded-Client-Cert` header for the upstream,
    /// in the format Envoy established: `Hash=…;Subject="…";DNS=…;URI=…`.
    /// Values are quoted where they hold `,`, `;`, `=` or `"` and escaped
    /// so that a hostile certificate cannot add fields or break the header.
    pub fn forwarded_header(&self) -> String {
        let mut out = format!("Hash={};Subject=", self.sha256_hex());
        quoted(&mut out, &self.subject);
        for san in &self.sans {
            let (kind, value) = san.split_once(':').unwrap_or(("DNS", san));
            let key = match kind {
                "URI" => "URI",
                "DNS" => "DNS",
                "email" => "Email",
                _ => "IP",
            };
            out.push(';');
            out.push_str(key);
            out.push('=');
            quoted(&mut out, value);
        }
        out
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Appends `value` in double quotes, `"` and `\` escaped with `\`, and
/// anything outside printable ASCII as `\xHH` (no header injection).
fn quoted(out: &mut String, value: &str) {
    out.push('"');
    for b in value.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\x{b:02X}");
            }
        }
    }
    out.push('"');
}

fn ip_text(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn client_cert(cn: &str, sans: Vec<rcgen::SanType>) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example, Inc.");
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn identity_has_subject_sans_and_hash() {
        let der = client_cert(
            "svc-a",
            vec![
                rcgen::SanType::DnsName("a.internal".try_into().unwrap()),
                rcgen::SanType::URI("spiffe://example.org/a".try_into().unwrap()),
                rcgen::SanType::IpAddress("10.1.2.3".parse().unwrap()),
            ],
        );
        let id = ClientIdentity::from_chain(std::slice::from_ref(&der)).unwrap();
        assert!(id.subject.contains("CN=svc-a"), "{}", id.subject);
        assert_eq!(id.common_name.as_deref(), Some("svc-a"));
        assert_eq!(id.short_name(), "svc-a");
        assert_eq!(
            id.sans,
            [
                "DNS:a.internal",
                "URI:spiffe://example.org/a",
                "IP:10.1.2.3"
            ]
        );
        let want = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &der);
        assert_eq!(&id.sha256[..], want.as_ref());
        assert_eq!(id.sha256_hex().len(), 64);
        let h = id.forwarded_header();
        assert!(
            h.starts_with(&format!("Hash={};Subject=\"", id.sha256_hex())),
            "{h}"
        );
        assert!(h.contains(";DNS=\"a.internal\""), "{h}");
        assert!(h.contains(";URI=\"spiffe://example.org/a\""), "{h}");
        assert!(h.contains(";IP=\"10.1.2.3\""), "{h}");
        assert!(ClientIdentity::from_chain(&[]).is_none());
    }

    #[test]
    fn hostile_names_cannot_break_the_header() {
        let der = client_cert(
            "x\";Hash=forged\r\nX-Admin: 1",
            vec![rcgen::SanType::DnsName("b.internal".try_into().unwrap())],
        );
        let id = ClientIdentity::from_chain(&[der]).unwrap();
        let h = id.forwarded_header();
        assert!(!h.contains('\r') && !h.contains('\n'), "{h}");
        // Only the two values' own quotes are left once escaped ones go.
        assert_eq!(h.replace("\\\"", "").matches('"').count(), 4, "{h}");
        assert!(h.contains("\\\";Hash=forged\\x0D\\x0AX-Admin: 1"), "{h}");
    }

    #[test]
    fn a_bundle_that_is_not_pem_names_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "not a certificate").unwrap();
        let auth = ClientAuth {
            mode: ClientAuthMode::Required,
            ca: Some(p.clone()),
            ca_key: "listener[0].client_ca".into(),
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let material = crate::Material {
            files: [(p.clone(), Arc::new(std::fs::read(&p).unwrap()))].into(),
            ..Default::default()
        };
        let e = verifier(&auth, &provider, &material).err().unwrap();
        assert_eq!(e.key, "listener[0].client_ca");
        assert_eq!(e.path, p);
        assert!(e.problem.contains("at least one"), "{}", e.problem);
        assert!(verifier(&ClientAuth::none(), &provider, &material)
            .unwrap()
            .is_none());
    }
}
