//! Building the rustls `ServerConfig`s of a listener from the validated
//! policy: versions, server-ordered suites and groups, ALPN, session cache,
//! and one config per client certificate policy of its names.

use std::sync::Arc;

use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider, kx_group};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoServerSessionStorage, ProducesTickets};
use rustls::{ServerConfig, SignatureAlgorithm, SupportedCipherSuite};
use tlsgate_config::{
    Alpn, Certificates, CipherSuite, ClientAuth, KxGroup, Listener, TlsPolicy, TlsVersion,
};

use crate::certs::LoadedCert;
use crate::client_auth;
use crate::error::CertError;
use crate::resolver::{CertStore, StoreError};

/// What a listener needs to accept TLS: the rustls config and the
/// certificate index (consulted before the handshake for SNI policy).
#[derive(Debug, Clone)]
pub struct TlsContext {
    /// One per distinct client certificate policy; never empty.
    configs: Vec<AuthConfig>,
    store: Arc<CertStore>,
}

/// A listener's TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// A client CA bundle is unusable (names its config key and file).
    #[error(transparent)]
    ClientCa(#[from] CertError),
    /// rustls refused the combination of versions and suites.
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// Two certificates serve one name under different client certificate
    /// policies, or with keys of the same type so that one would never be
    /// served (names the second one's config key).
    #[error("key `{key}`: {problem}")]
    PolicyConflict {
        /// Config key, e.g. `listener[0].certificate[1].client_auth`.
        key: String,
        /// Which name, and which entry disagrees.
        problem: String,
    },
}

/// The rustls config of one client certificate policy of a listener.
fn server_config(
    policy: &TlsPolicy,
    alpn: &[Alpn],
    provider: &Arc<CryptoProvider>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    store: &Arc<CertStore>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = policy
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&versions)?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(store.clone());
    // The server's order decides (clients often prefer weaker suites).
    config.ignore_client_order = true;
    // The listener's protocols in its order: the server's choice wins.
    config.alpn_protocols = alpn.iter().map(|p| p.id().as_bytes().to_vec()).collect();
    // Each policy has its own TLS 1.2 session-ID cache: a session never
    // resumes under another policy. It keeps only sessions that got no
    // ticket (crate::session_cache), for at most `ticket_lifetime`.
    config.session_storage = if policy.session_cache_size == 0 {
        Arc::new(NoServerSessionStorage {})
    } else {
        crate::session_cache::SessionIdCache::new(
            policy.session_cache_size,
            policy.tickets.lifetime,
        )
    };
    // Tickets (set by `set_tickets`) or, without them, the session
    // cache above. rustls only resumes TLS 1.3 with a fresh (EC)DHE
    // exchange (psk_dhe_ke), and never takes 0-RTT data with stateless
    // tickets; max_early_data_size = 0 refuses it in every case.
    config.send_tls13_tickets = policy.tickets.tls13_count;
    config.max_early_data_size = 0;
    // Lets an established connection hand its keys to kernel TLS.
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

fn suite(s: CipherSuite) -> SupportedCipherSuite {
    match s {
        CipherSuite::Tls13Aes128GcmSha256 => cs::TLS13_AES_128_GCM_SHA256,
        CipherSuite::Tls13Aes256GcmSha384 => cs::TLS13_AES_256_GCM_SHA384,
        CipherSuite::Tls13Chacha20Poly1305Sha256 => cs::TLS13_CHACHA20_POLY1305_SHA256,
        CipherSuite::EcdheEcdsaAes128GcmSha256 => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        CipherSuite::EcdheEcdsaAes256GcmSha384 => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        CipherSuite::EcdheEcdsaChacha20Poly1305Sha256 => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        CipherSuite::EcdheRsaAes128GcmSha256 => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        CipherSuite::EcdheRsaAes256GcmSha384 => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        CipherSuite::EcdheRsaChacha20Poly1305Sha256 => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
    }
}

/// The key type a TLS 1.2 suite signs its key exchange with; `None` for
/// TLS 1.3 suites, which take any certificate.
fn tls12_signer(s: CipherSuite) -> Option<&'static str> {
    match s {
        CipherSuite::Tls13Aes128GcmSha256
        | CipherSuite::Tls13Aes256GcmSha384
        | CipherSuite::Tls13Chacha20Poly1305Sha256 => None,
        CipherSuite::EcdheEcdsaAes128GcmSha256
        | CipherSuite::EcdheEcdsaAes256GcmSha384
        | CipherSuite::EcdheEcdsaChacha20Poly1305Sha256 => Some("ECDSA"),
        CipherSuite::EcdheRsaAes128GcmSha256
        | CipherSuite::EcdheRsaAes256GcmSha384
        | CipherSuite::EcdheRsaChacha20Poly1305Sha256 => Some("RSA"),
    }
}

/// With TLS 1.2 on, every certificate needs a TLS 1.2 suite its key can
/// sign for: the certificate is chosen (by SNI and the client's signature
/// schemes) before the suite, so a TLS 1.2 client given it would fail the
/// handshake (`handshake_failure`), even when TLS 1.3 clients are served.
fn check_tls12_suites(
    policy: &TlsPolicy,
    listener: &Listener,
    certs: &[LoadedCert],
) -> Result<(), ContextError> {
    if !policy.versions.contains(&TlsVersion::Tls12) {
        return Ok(());
    }
    let offered: Vec<&str> = policy
        .cipher_suites
        .iter()
        .filter_map(|s| tls12_signer(*s))
        .collect();
    for (i, c) in certs.iter().enumerate() {
        let needs = match c.algorithm() {
            SignatureAlgorithm::ECDSA | SignatureAlgorithm::ED25519 => "ECDSA",
            SignatureAlgorithm::RSA => "RSA",
            _ => continue,
        };
        if offered.contains(&needs) {
            continue;
        }
        let entry = match &listener.certificates {
            Certificates::Files(files) => files
                .get(i)
                .map_or_else(|| format!("certificate {i}"), |f| f.key_path.clone()),
            _ => format!("{}'s certificate", listener.key_path),
        };
        return Err(ContextError::PolicyConflict {
            key: "tls.cipher_suites".into(),
            problem: format!(
                "TLS 1.2 is on but no TLS 1.2 suite can be used with the {:?} key of {entry} ({}): every TLS 1.2 client given it would fail the handshake; expected a TLS_ECDHE_{needs}_* suite, or versions = [\"1.3\"]",
                c.algorithm(),
                c.names.join(", "),
            ),
        });
    }
    Ok(())
}

fn group(g: KxGroup) -> &'static dyn rustls::crypto::SupportedKxGroup {
    match g {
        KxGroup::X25519Mlkem768 => kx_group::X25519MLKEM768,
        KxGroup::X25519 => kx_group::X25519,
        KxGroup::Secp256r1 => kx_group::SECP256R1,
        KxGroup::Secp384r1 => kx_group::SECP384R1,
    }
}

/// One client certificate policy of a listener and the rustls config
/// that applies it.
#[derive(Debug, Clone)]
struct AuthConfig {
    config: Arc<ServerConfig>,
    /// Appended to the listener's ticket context: empty without client
    /// certificates, else the mode and the CA bundle's hash.
    ticket_tag: String,
}

impl TlsContext {
    /// Builds the context of one listener from its loaded certificates
    /// (in the order of `listener.certificates`).
    ///
    /// Each distinct client certificate policy gets its own rustls
    /// `ServerConfig`; the one of the client's SNI is chosen after the
    /// ClientHello is read, before any cryptography.
    /// `material` holds the `client_ca` bundles, as the key holder read them.
    pub fn new(
        policy: &TlsPolicy,
        listener: &Listener,
        certs: &[LoadedCert],
        material: &crate::Material,
    ) -> Result<Self, ContextError> {
        check_tls12_suites(policy, listener, certs)?;
        let provider = Arc::new(CryptoProvider {
            cipher_suites: policy
                .cipher_suites
                .iter()
                .map(|s| crate::key_schedule::prepared(suite(*s)))
                .collect(),
            kx_groups: policy.kx_groups.iter().map(|g| group(*g)).collect(),
            ..default_provider()
        });
        // The policy of each certificate, and the distinct ones.
        let per_cert: Vec<&ClientAuth> = match &listener.certificates {
            Certificates::Files(files) if files.len() == certs.len() => {
                files.iter().map(|f| &f.client_auth).collect()
            }
            _ => vec![&listener.client_auth; certs.len()],
        };
        let mut distinct: Vec<&ClientAuth> = Vec::new();
        let index: Vec<usize> = per_cert
            .iter()
            .map(|a| {
                distinct.iter().position(|d| d == a).unwrap_or_else(|| {
                    distinct.push(a);
                    distinct.len() - 1
                })
            })
            .collect();
        if distinct.is_empty() {
            distinct.push(&listener.client_auth);
        }
        let store = CertStore::new(certs, &index, policy.unknown_sni).map_err(|e| {
            let path = |i: usize| match &listener.certificates {
                Certificates::Files(files) => files
                    .get(i)
                    .map_or_else(|| format!("certificate {i}"), |f| f.key_path.clone()),
                _ => format!("certificate {i}"),
            };
            let c = match e {
                StoreError::Policy(c) => c,
                StoreError::Shadowed(s) => {
                    return ContextError::PolicyConflict {
                        key: format!("{}.cert", path(s.shadowed)),
                        problem: format!(
                            "serves {:?} with a {} key, as {} does (names from a certificate's subjectAltName count): the handshake always picks {}, this one would never be served; expected one certificate per name and key type (after a renewal, remove the old one)",
                            s.name,
                            s.algorithm,
                            path(s.kept),
                            path(s.kept),
                        ),
                    }
                }
            };
            ContextError::PolicyConflict {
                key: format!("{}.client_auth", path(c.second)),
                problem: format!(
                    "serves {:?}, as {} does, under another client_auth or client_ca (names from a certificate's subjectAltName count, compared in lower case); expected the same client_auth and client_ca for every certificate of a name",
                    c.name,
                    path(c.first)
                ),
            }
        })?;
        let store = Arc::new(store);
        let configs = distinct
            .iter()
            .map(|auth| {
                let verifier = client_auth::verifier(auth, &provider, material)?;
                let ticket_tag = match &verifier {
                    None => String::new(),
                    Some(v) => format!(
                        "|client_auth={}|ca={}",
                        auth.mode.as_str(),
                        client_auth::hex(&v.bundle_sha256[..16])
                    ),
                };
                let config = server_config(
                    policy,
                    &listener.alpn,
                    &provider,
                    verifier.map(|v| v.verifier),
                    &store,
                )?;
                Ok(AuthConfig { config, ticket_tag })
            })
            .collect::<Result<Vec<_>, ContextError>>()?;
        Ok(Self { configs, store })
    }

    /// Issues and accepts session tickets (TLS 1.2 RFC 5077 tickets, TLS
    /// 1.3 stateless tickets) with the ticketer `make(tag)` returns, e.g.
    /// [`TicketKeys::for_listener`](crate::TicketKeys::for_listener) of the
    /// listener's key path followed by `tag`. The tag is empty without
    /// client certificates and names the policy otherwise, so a ticket
    /// never resumes under a stricter policy than the one that issued it.
    pub fn set_tickets(&mut self, make: impl Fn(&str) -> Arc<dyn ProducesTickets>) {
        for c in &mut self.configs {
            // Not yet shared: make_mut does not copy.
            Arc::make_mut(&mut c.config).ticketer = make(&c.ticket_tag);
        }
    }

    /// Whether a request for `host` (the name of a Host field or
    /// `:authority`, without its port) may be answered on a connection whose handshake was made
    /// for `sni`. Not when the two names fall under different client
    /// certificate policies: a client must not reach a name that requires
    /// a certificate through the handshake of one that does not (it gets
    /// 421 and a new connection makes the right handshake). Nor, under
    /// `unknown_sni = "reject"`, a host that no certificate of the
    /// listener names: no handshake could have been made for it.
    pub fn host_fits(&self, sni: Option<&str>, host: &[u8]) -> bool {
        if self.configs.len() < 2 {
            return true;
        }
        let name = String::from_utf8_lossy(host);
        let Some(wanted) = self.store.lookup(Some(&name)) else {
            return false;
        };
        self.store
            .lookup(sni)
            .is_some_and(|had| had.client_auth() == wanted.client_auth())
    }

    /// The rustls configuration for a client with this SNI, or `None`
    /// when the client is not served (no certificate, no default).
    pub fn config_for(&self, sni: Option<&str>) -> Option<&Arc<ServerConfig>> {
        let slot = self.store.lookup(sni)?;
        self.configs.get(slot.client_auth()).map(|c| &c.config)
    }
}
