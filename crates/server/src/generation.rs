//! A generation: everything built from one configuration (TLS contexts,
//! open document roots). Connections hold the generation they were accepted
//! under, so a reload swaps in a new one without touching them.

use tlsgate_config::{Config, ConfigError};
use tlsgate_files::{DocumentRoot, RootOptions};
use tlsgate_tls::{ContextError, LoadedCert, TlsContext};

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
    /// Ids of the keys its certificates sign with.
    pub key_ids: Vec<u64>,
}

/// Builds a generation from `config` and the certificates of each of its
/// listeners (loaded and checked against their keys by the key holder),
/// checking what a config file cannot show by itself: roots open.
pub fn build(
    config: Config,
    certs: Vec<Vec<LoadedCert>>,
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
    let key_ids = crate::keys::key_ids(&certs);
    let mut sites = Vec::with_capacity(config.listeners.len());
    for (l, certs) in config.listeners.iter().zip(certs) {
        let mut tls = TlsContext::new(&config.tls, l, &certs).map_err(|e| match e {
            ContextError::ClientCa(c) => ConfigError::new(
                &origin,
                c.key,
                format!("{} ({})", c.problem, c.path.display()),
            ),
            other => ConfigError::new(&origin, "tls", other.to_string()),
        })?;
        if let Some(keys) = &ticket_keys {
            // Bound to the listener and its client certificate policy: its
            // tickets resume only on the listener at the same place in the
            // configuration (here or on a fleet peer), under the same policy.
            tls.set_tickets(|tag| keys.for_listener(&format!("{}{tag}", l.key_path)));
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
    Ok(Generation {
        config,
        sites,
        key_ids,
    })
}
