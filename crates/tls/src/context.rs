//! Building the rustls `ServerConfig` of a listener from the validated
//! policy: versions, server-ordered suites and groups, ALPN, session cache.

use std::sync::Arc;

use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider, kx_group};
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ProducesTickets, ServerSessionMemoryCache};
use rustls::{ServerConfig, SupportedCipherSuite};
use tlsgate_config::{CipherSuite, KxGroup, TlsPolicy, TlsVersion};

use crate::certs::LoadedCert;
use crate::resolver::CertStore;

/// What a listener needs to accept TLS: the rustls config and the
/// certificate index (consulted before the handshake for SNI policy).
#[derive(Debug, Clone)]
pub struct TlsContext {
    config: Arc<ServerConfig>,
    store: Arc<CertStore>,
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

fn group(g: KxGroup) -> &'static dyn rustls::crypto::SupportedKxGroup {
    match g {
        KxGroup::X25519Mlkem768 => kx_group::X25519MLKEM768,
        KxGroup::X25519 => kx_group::X25519,
        KxGroup::Secp256r1 => kx_group::SECP256R1,
        KxGroup::Secp384r1 => kx_group::SECP384R1,
    }
}

impl TlsContext {
    /// Builds the context of one listener.
    pub fn new(policy: &TlsPolicy, certs: &[LoadedCert]) -> Result<Self, rustls::Error> {
        let provider = CryptoProvider {
            cipher_suites: policy.cipher_suites.iter().map(|s| suite(*s)).collect(),
            kx_groups: policy.kx_groups.iter().map(|g| group(*g)).collect(),
            ..default_provider()
        };
        let versions: Vec<&'static rustls::SupportedProtocolVersion> = policy
            .versions
            .iter()
            .map(|v| match v {
                TlsVersion::Tls12 => &rustls::version::TLS12,
                TlsVersion::Tls13 => &rustls::version::TLS13,
            })
            .collect();
        let store = Arc::new(CertStore::new(certs, policy.unknown_sni));
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&versions)?
            .with_no_client_auth()
            .with_cert_resolver(store.clone());
        // The server's order decides (clients often prefer weaker suites).
        config.ignore_client_order = true;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.session_storage = if policy.session_cache_size == 0 {
            Arc::new(NoServerSessionStorage {})
        } else {
            ServerSessionMemoryCache::new(policy.session_cache_size)
        };
        // Tickets (set by `set_ticketer`) or, without them, the session
        // cache above. rustls only resumes TLS 1.3 with a fresh (EC)DHE
        // exchange (psk_dhe_ke), and never takes 0-RTT data with stateless
        // tickets; max_early_data_size = 0 refuses it in every case.
        config.send_tls13_tickets = policy.tickets.tls13_count;
        config.max_early_data_size = 0;
        Ok(Self {
            config: Arc::new(config),
            store,
        })
    }

    /// Issues and accepts session tickets with `ticketer` (TLS 1.2 RFC 5077
    /// tickets, TLS 1.3 stateless tickets), e.g. [`TicketKeys::for_listener`](crate::TicketKeys::for_listener).
    pub fn set_ticketer(&mut self, ticketer: Arc<dyn ProducesTickets>) {
        // Not yet shared: make_mut does not copy.
        Arc::make_mut(&mut self.config).ticketer = ticketer;
    }

    /// The rustls configuration.
    pub fn server_config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// Whether a client with this SNI is served (a certificate or the default).
    pub fn serves(&self, sni: Option<&str>) -> bool {
        self.store.lookup(sni).is_some()
    }
}
