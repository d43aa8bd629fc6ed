//! What a configuration needs read besides the listeners' certificates:
//! the public files (the listeners' `client_ca` bundles, the upstreams'
//! `ca` bundles and client certificate chains) and the upstreams' client
//! keys. Whoever holds the keys reads them (the key process, which keeps
//! its privileges, or this process with key isolation off), so that a
//! reload as `server.user` needs no access to a root-only file, and no
//! private key enters a process that talks to the network.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::aws_lc_rs::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tlsgate_config::{Config, ConfigError};
use zeroize::{Zeroize, Zeroizing};

/// Largest public file read for a configuration (a CA bundle).
pub const MAX_PUBLIC_FILE: usize = 4 * 1024 * 1024;
/// Largest upstream client certificate chain, as a TLS 1.2 Certificate
/// message carries it (3 bytes of length per certificate and its DER): a
/// TLS 1.2 client signs it with the rest of the handshake, and the key
/// process signs at most 1 MiB (`tlsgate_keyserver::proto::MAX_MESSAGE`).
pub const MAX_CLIENT_CHAIN: usize = 512 * 1024;

/// Public files and upstream client keys, as the key holder read them.
#[derive(Debug, Clone, Default)]
pub struct Material {
    /// Public files by path: CA bundles, client certificate chains.
    pub files: HashMap<PathBuf, Arc<Vec<u8>>>,
    /// The client certificate (chain and key) of each upstream, in
    /// configuration order; `None` for one without `client_cert`.
    pub upstream_clients: Vec<Option<Arc<CertifiedKey>>>,
}

impl Material {
    /// The bytes of public file `path`, as the key holder read them.
    ///
    /// # Errors
    /// `NotFound` for a file the key holder did not read.
    pub fn read(&self, path: &Path) -> io::Result<Arc<Vec<u8>>> {
        self.files.get(path).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "not read by the key holder (the configuration changed while it was being read; try again)",
            )
        })
    }

    /// Every public file `config` names (each once).
    pub fn public_paths(config: &Config) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        let mut add = |key: String, p: &Path| {
            if !out.iter().any(|(_, q)| q == p) {
                out.push((key, p.to_path_buf()));
            }
        };
        for l in &config.listeners {
            if let Some(ca) = &l.client_auth.ca {
                add(l.client_auth.ca_key.clone(), ca);
            }
            if let tlsgate_config::Certificates::Files(files) = &l.certificates {
                for f in files {
                    if let Some(ca) = &f.client_auth.ca {
                        add(f.client_auth.ca_key.clone(), ca);
                    }
                }
            }
        }
        for u in &config.upstreams {
            if let Some(t) = &u.tls {
                add(format!("{}.ca", u.key_path), &t.ca);
                if let Some((cert, _)) = &t.client_cert {
                    add(format!("{}.client_cert", u.key_path), cert);
                }
            }
        }
        out
    }

    /// Reads every public file and upstream client key of `config` here.
    ///
    /// # Errors
    /// The first file that cannot be read, or key that cannot be used,
    /// naming its config key.
    pub fn load(config: &Config) -> Result<Material, ConfigError> {
        let origin = &config.origin;
        let mut files = HashMap::new();
        for (key, path) in Self::public_paths(config) {
            let bytes = read_bounded(&path).map_err(|e| {
                ConfigError::new(origin, key, format!("cannot read {}: {e}", path.display()))
            })?;
            files.insert(path, Arc::new(bytes));
        }
        let mut upstream_clients = Vec::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            let Some((cert, key)) = u.tls.as_ref().and_then(|t| t.client_cert.as_ref()) else {
                upstream_clients.push(None);
                continue;
            };
            let err = |k: &str, problem: String| {
                ConfigError::new(origin, format!("{}.{k}", u.key_path), problem)
            };
            let chain_pem = files.get(cert).map(|b| b.as_slice()).unwrap_or_default();
            let chain = CertificateDer::pem_slice_iter(chain_pem)
                .collect::<Result<Vec<_>, _>>()
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
            let sent: usize = chain.iter().map(|c| 3 + c.as_ref().len()).sum();
            if sent > MAX_CLIENT_CHAIN {
                return Err(err(
                    "client_cert",
                    format!(
                        "the chain in {} is {sent} bytes as sent; at most {MAX_CLIENT_CHAIN} (TLS 1.2 signs it with the rest of the handshake, and the key process signs at most 1 MiB)",
                        cert.display()
                    ),
                ));
            }
            let pem =
                Zeroizing::new(std::fs::read(key).map_err(|e| {
                    err("client_key", format!("cannot read {}: {e}", key.display()))
                })?);
            let mut der = PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|e| err("client_key", format!("cannot read {}: {e}", key.display())))?;
            let signing = any_supported_type(&der);
            der.zeroize();
            let signing = signing.map_err(|e| {
                err(
                    "client_key",
                    format!("unsupported private key in {}: {e}", key.display()),
                )
            })?;
            let certified = CertifiedKey::new(chain, signing);
            certified
                .keys_match()
                .map_err(|e| err("client_key", format!("does not fit client_cert: {e}")))?;
            upstream_clients.push(Some(Arc::new(certified)));
        }
        Ok(Material {
            files,
            upstream_clients,
        })
    }
}

/// Reads `path`, refusing more than [`MAX_PUBLIC_FILE`] bytes.
fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PUBLIC_FILE as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > MAX_PUBLIC_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_PUBLIC_FILE} bytes"),
        ));
    }
    Ok(out)
}
