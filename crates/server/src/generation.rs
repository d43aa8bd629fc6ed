//! A generation: everything built from one configuration (TLS contexts,
//! open document roots). Connections hold the generation they were accepted
//! under, so a reload swaps in a new one without touching them.

use std::sync::OnceLock;

use tlsgate_config::{Certificates, Config, ConfigError};
use tlsgate_files::{DocumentRoot, RootOptions};
use tlsgate_tls::{LoadedCert, TlsContext};

use crate::tickets::TicketCache;
use crate::StartError;

/// What one listener serves.
pub struct Site {
    /// TLS configuration and certificates.
    pub tls: TlsContext,
    /// The open document root.
    pub root: DocumentRoot,
}

/// The running configuration and what was built from it.
pub struct Generation {
    /// The validated configuration.
    pub config: Config,
    /// One site per `config.listeners` entry, same order.
    pub sites: Vec<Site>,
}

/// The self-signed certificate, made once per process and kept across reloads.
#[derive(Default)]
pub struct SelfSignedCache(OnceLock<Result<LoadedCert, String>>);

impl SelfSignedCache {
    fn get(&self) -> Result<LoadedCert, String> {
        self.0
            .get_or_init(|| {
                let made = tlsgate_tls::self_signed().map_err(|e| e.to_string())?;
                tracing::info!(
                    "generated a self-signed ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1, \
                     valid 90 days; clients must skip verification (curl -k)"
                );
                Ok(made.loaded)
            })
            .clone()
    }
}

/// Builds a generation, checking everything a config file cannot show by
/// itself: certificates parse and match their keys, roots open.
pub fn build(
    config: Config,
    self_signed: &SelfSignedCache,
    tickets: &TicketCache,
) -> Result<Generation, StartError> {
    let origin = config.origin.clone();
    let ticket_keys = tickets.get(&config.tls.tickets).map_err(|e| {
        let key = match config.tls.tickets.key_file {
            Some(_) => "tls.ticket_key_file",
            None => "tls.session_tickets",
        };
        ConfigError::new(&origin, key, e.to_string())
    })?;
    let mut sites = Vec::with_capacity(config.listeners.len());
    for l in &config.listeners {
        let certs = match &l.certificates {
            Certificates::SelfSigned => vec![self_signed.get().map_err(|problem| {
                ConfigError::new(&origin, format!("{}.self_signed", l.key_path), problem)
            })?],
            Certificates::Files(files) => files
                .iter()
                .map(|f| {
                    tlsgate_tls::load(f).map_err(|e| {
                        ConfigError::new(
                            &origin,
                            e.key.clone(),
                            format!("{} ({})", e.problem, e.path.display()),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut tls = TlsContext::new(&config.tls, &certs).map_err(|e| {
            ConfigError::new(
                &origin,
                "tls",
                format!("cannot build the TLS configuration: {e}"),
            )
        })?;
        if let Some(keys) = &ticket_keys {
            // Bound to the listener: its tickets resume only on the listener
            // at the same place in the configuration (here or on a fleet peer).
            tls.set_ticketer(keys.for_listener(&l.key_path));
        }
        let root = DocumentRoot::open(
            &l.root,
            RootOptions {
                index_files: l.index.clone(),
                allow_symlinks_outside_root: l.allow_symlinks_outside_root,
            },
        )
        .map_err(|e| ConfigError::new(&origin, format!("{}.root", l.key_path), e.to_string()))?;
        sites.push(Site { tls, root });
    }
    Ok(Generation { config, sites })
}
