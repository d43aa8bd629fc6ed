//! The rustls client configuration of a pool: its CA bundle, its optional
//! client certificate (mTLS origination) and session resumption.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::client::{ResolvesClientCert, Resumption};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};
use tlsgate_config::{ConfigError, Upstream, UpstreamTls};

/// What a pool needs to open TLS connections.
pub(crate) struct Connector {
    pub config: Arc<ClientConfig>,
    /// The name sent and verified instead of each server's host.
    pub sni: Option<ServerName<'static>>,
    /// A client certificate is configured: a handshake may sign with its
    /// key (in the key process), so it is driven where that signature is
    /// awaited (`tlsgate_tls::poll_signing`).
    pub signs: bool,
}

/// What the holder of the keys read for the pools' TLS: this process may
/// be unable to read the files (they may be root's, and a reload runs as
/// `server.user`), and never reads a private key.
#[derive(Clone, Copy)]
pub struct PoolFiles<'a> {
    /// The bytes of a public file (a CA bundle) by path.
    pub read: &'a dyn Fn(&Path) -> io::Result<Arc<Vec<u8>>>,
    /// Each upstream's client certificate chain and key, in configuration
    /// order: the key signs wherever the key holder keeps it.
    pub clients: &'a [Option<Arc<CertifiedKey>>],
}

/// Always the one client certificate of a pool.
#[derive(Debug)]
struct OneClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for OneClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Builds the pool's client configuration; errors name the config key.
/// `client` is the pool's client certificate from [`PoolFiles::clients`].
pub(crate) fn connector(
    origin: &str,
    u: &Upstream,
    t: &UpstreamTls,
    files: PoolFiles<'_>,
    client: Option<&Arc<CertifiedKey>>,
) -> Result<Connector, ConfigError> {
    let err = |key: &str, problem: String| {
        ConfigError::new(origin, format!("{}.{key}", u.key_path), problem)
    };
    let mut roots = RootCertStore::empty();
    let certs = (files.read)(&t.ca)
        .and_then(|b| {
            CertificateDer::pem_slice_iter(&b)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
        })
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
    let provider = Arc::new(tlsgate_tls::key_schedule::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("tls", e.to_string()))?
        .with_root_certificates(roots);
    // The key was read, and checked against the chain, by the key holder.
    let signs = t.client_cert.is_some() && client.is_some();
    let mut config = match (&t.client_cert, client) {
        (Some(_), Some(certified)) => {
            builder.with_client_cert_resolver(Arc::new(OneClientCert(certified.clone())))
        }
        (Some((cert, _)), None) => {
            return Err(err(
                "client_cert",
                format!(
                    "{} was not loaded by the key holder (the configuration changed while it was being read; try again)",
                    cert.display()
                ),
            ))
        }
        (None, _) => builder.with_no_client_auth(),
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
        signs,
    })
}

/// The name a server is verified under: the pool's `sni`, else its host.
pub(crate) fn server_name(c: &Connector, host: &str) -> Option<ServerName<'static>> {
    c.sni
        .clone()
        .or_else(|| ServerName::try_from(host.to_string()).ok())
}
