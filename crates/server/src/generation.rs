//! A generation: everything built from one configuration (TLS contexts,
//! open document roots). Connections hold the generation they were accepted
//! under, so a reload swaps in a new one without touching them.

use tlsgate_config::{Config, ConfigError, RouteTarget};
use tlsgate_files::{CacheOptions, DocumentRoot, RootOptions};
use tlsgate_metrics::ProxyMetrics;
use tlsgate_proxy::{PoolFiles, Pools, Router};
use tlsgate_tls::{ContextError, LoadedCert, Material, TlsContext};

use crate::tickets::TicketCache;
use crate::StartError;

/// What one listener serves.
pub struct Site {
    /// TLS configuration and certificates.
    pub tls: TlsContext,
    /// The open document root.
    pub root: DocumentRoot,
    /// Routes to pools and other roots; requests none matches use `root`.
    pub routes: Router<DocumentRoot>,
    /// A route goes to a pool that sends PROXY protocol headers, which
    /// name the address each client connected to.
    pub sends_proxy_protocol: bool,
}

/// The running configuration and what was built from it.
pub struct Generation {
    /// The validated configuration.
    pub config: Config,
    /// One site per `config.listeners` entry, same order.
    pub sites: Vec<Site>,
    /// Ids of the keys its certificates sign with.
    pub key_ids: Vec<u64>,
    /// Upstream pools (`[[upstream]]`); a reload builds new ones, requests
    /// in flight finish on these.
    pub pools: Pools,
    /// Its session ticket keys, made current (for later reloads to keep)
    /// only when it is put in service.
    pub(crate) ticket_keys: Option<crate::tickets::Chosen>,
}

impl Generation {
    /// Every document root of this generation: the listeners' and the
    /// routes'.
    pub fn roots(&self) -> impl Iterator<Item = &DocumentRoot> {
        self.sites
            .iter()
            .flat_map(|s| std::iter::once(&s.root).chain(s.routes.static_roots()))
    }
}

/// Builds a generation from `config` and the certificates of each of its
/// listeners (loaded and checked against their keys by the key holder),
/// checking what a config file cannot show by itself: roots open. On a
/// reload `previous` is the running generation (its servers' health
/// carries over).
pub fn build(
    config: Config,
    (certs, material): (Vec<Vec<LoadedCert>>, Material),
    tickets: &TicketCache,
    proxy_metrics: &ProxyMetrics,
    previous: Option<&Generation>,
) -> Result<Generation, StartError> {
    let origin = config.origin.clone();
    let read = |p: &std::path::Path| material.read(p);
    let files = PoolFiles {
        read: &read,
        clients: &material.upstream_clients,
    };
    let pools = Pools::build(&config, proxy_metrics, previous.map(|g| &g.pools), files)?;
    let ticket_keys = tickets.get(&config.tls.tickets).map_err(|e| {
        let key = match config.tls.tickets.key_file {
            Some(_) => "tls.ticket_key_file",
            None => "tls.session_tickets",
        };
        ConfigError::new(&origin, key, e.to_string())
    })?;
    let key_ids = crate::keys::key_ids(&certs, &material);
    let mut sites = Vec::with_capacity(config.listeners.len());
    for (l, certs) in config.listeners.iter().zip(certs) {
        let mut tls = TlsContext::new(&config.tls, l, &certs, &material).map_err(|e| match e {
            ContextError::ClientCa(c) => ConfigError::new(
                &origin,
                c.key,
                format!("{} ({})", c.problem, c.path.display()),
            ),
            ContextError::PolicyConflict { key, problem } => {
                ConfigError::new(&origin, key, problem)
            }
            other => ConfigError::new(&origin, "tls", other.to_string()),
        })?;
        if let Some(keys) = &ticket_keys {
            // Bound to the listener and its client certificate policy: its
            // tickets resume only on the listener at the same place in the
            // configuration (here or on a fleet peer), under the same policy.
            let keys = &keys.keys;
            tls.set_tickets(|tag| keys.for_listener(&format!("{}{tag}", l.key_path)));
        }
        let open = |key: String, path: &std::path::Path| {
            DocumentRoot::open(
                path,
                RootOptions {
                    index_files: l.index.clone(),
                    allow_symlinks_outside_root: l.allow_symlinks_outside_root,
                    open_file_cache: config.open_file_cache.map(|c| CacheOptions {
                        entries: c.entries,
                        valid: c.valid,
                        content_max: c.content_max,
                    }),
                },
            )
            .map_err(|e| ConfigError::new(&origin, key, e.to_string()))
        };
        let root = open(format!("{}.root", l.key_path), &l.root)?;
        let routes = Router::build(&l.routes, &pools, |r, path| {
            open(format!("{}.root", r.key_path), path)
        })?;
        let sends_proxy_protocol = l.routes.iter().any(|r| match r.target {
            RouteTarget::Upstream(i) => config
                .upstreams
                .get(i)
                .is_some_and(|u| u.proxy_protocol.is_some()),
            RouteTarget::Root(_) => false,
        });
        sites.push(Site {
            tls,
            root,
            routes,
            sends_proxy_protocol,
        });
    }
    Ok(Generation {
        config,
        sites,
        key_ids,
        pools,
        ticket_keys,
    })
}
