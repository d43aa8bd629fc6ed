//! The rustls client configuration of a pool: its CA bundle, its optional
//! client certificate (mTLS origination) and session resumption.

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tlsgate_config::{ConfigError, Upstream, UpstreamTls};

/// What a pool needs to open TLS connections.
pub(crate) struct Connector {
    pub config: Arc<ClientConfig>,
    /// The name sent and verified instead of each server's host.
    pub sni: Option<ServerName<'static>>,
}

/// Builds the pool's client configuration; errors name the config key.
pub(crate) fn connector(
    origin: &str,
    u: &Upstream,
    t: &UpstreamTls,
) -> Result<Connector, ConfigError> {
    let err = |key: &str, problem: String| {
        ConfigError::new(origin, format!("{}.{key}", u.key_path), problem)
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&t.ca)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            err(
                "ca",
                format!("cannot read the CA bundle {}: {e}", t.ca.display()),
            )
        })?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(err(
            "ca",
            format!("expected at least one CA certificate in {}", t.ca.display()),
        ));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("tls", e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match &t.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    err(
                        "client_cert",
                        format!("cannot read {}: {e}", cert.display()),
                    )
                })?;
            if chain.is_empty() {
                return Err(err(
                    "client_cert",
                    format!("expected a certificate in {}", cert.display()),
                ));
            }
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| err("client_key", format!("cannot read {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| err("client_key", format!("does not fit client_cert: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    if !t.resumption {
        config.resumption = Resumption::disabled();
    }
    let sni = match &t.sni {
        Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| {
            err(
                "sni",
                format!("expected a DNS name or IP address, found {name:?}"),
            )
        })?),
        None => None,
    };
    Ok(Connector {
        config: Arc::new(config),
        sni,
    })
}

/// The name a server is verified under: the pool's `sni`, else its host.
pub(crate) fn server_name(c: &Connector, host: &str) -> Option<ServerName<'static>> {
    c.sni
        .clone()
        .or_else(|| ServerName::try_from(host.to_string()).ok())
}
