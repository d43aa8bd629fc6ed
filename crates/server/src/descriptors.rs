//! What the configuration may hold open against `RLIMIT_NOFILE`: the soft
//! limit is raised to the hard one at start ([`tlsgate_sys::rlimit`]), and
//! if even that is below what the limits allow, one warning says so,
//! naming the numbers and the keys to lower. The start goes on: the sum
//! is a ceiling that a server reaches only with every connection open
//! and every cache full of distinct files at once; a request that finds
//! no descriptor is answered 503 and warned about, rate-limited
//! (docs/config.md, "File descriptors").

use tlsgate_config::Config;
use tlsgate_sys::rlimit::Nofile;

/// Descriptors held by the process itself besides connections, listeners
/// and cached files: per worker its epoll and wake-up descriptors, plus
/// the logs, the key process's socket, the ticket key file, the admin
/// listener and the standard streams. A generous round figure.
const BASE: u64 = 64;
const PER_WORKER: u64 = 8;

/// The most descriptors `config` may hold open, by what holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Needed {
    /// `max_connections`.
    pub connections: u64,
    /// Upstream connections: each server's `max_conns`, plus one for its
    /// health check.
    pub upstream: u64,
    /// `open_file_cache` × workers × document roots.
    pub cache: u64,
    /// One listening socket per address and worker (`SO_REUSEPORT`).
    pub listeners: u64,
    /// The rest ([`BASE`] + [`PER_WORKER`] × workers).
    pub base: u64,
}

impl Needed {
    pub(crate) fn of(config: &Config) -> Self {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        let workers = n(config.workers);
        let mut roots: Vec<&std::path::Path> =
            config.listeners.iter().map(|l| l.root.as_path()).collect();
        roots.sort();
        roots.dedup();
        let upstream = config
            .upstreams
            .iter()
            .map(|u| {
                let checks = usize::from(u.health_check.is_some());
                n(u.servers.len()).saturating_mul(n(u.max_conns).saturating_add(n(checks)))
            })
            .fold(0u64, u64::saturating_add);
        let addrs: usize = config.listeners.iter().map(|l| l.addrs.len()).sum();
        Needed {
            connections: n(config.limits.max_connections),
            upstream,
            cache: config.open_file_cache.map_or(0, |c| {
                n(c.entries.get())
                    .saturating_mul(workers)
                    .saturating_mul(n(roots.len()))
            }),
            listeners: n(addrs).saturating_mul(workers),
            base: BASE.saturating_add(PER_WORKER.saturating_mul(workers)),
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.connections
            .saturating_add(self.upstream)
            .saturating_add(self.cache)
            .saturating_add(self.listeners)
            .saturating_add(self.base)
    }
}

/// Raises the soft descriptor limit and warns, once, when `config` may
/// need more than it allows. Returns the limit found and the need.
pub(crate) fn check(config: &Config, nofile: Nofile) -> Needed {
    let need = Needed::of(config);
    if let Some(e) = nofile.error {
        tracing::warn!("cannot raise the soft RLIMIT_NOFILE to the hard limit: {e}");
    }
    match nofile.now {
        Some(limit) if need.total() > limit => tracing::warn!(
            limit,
            needed = need.total(),
            "this configuration may hold up to {} file descriptors but RLIMIT_NOFILE \
             (raised to the hard limit) is {limit}: {} for [limits] max_connections, \
             {} for upstream connections ([[upstream]] max_conns × servers), {} for [files] open_file_cache × {} workers × document roots, {} listener \
             sockets, {} for the rest. Past the limit, requests for files are answered \
             503 and new connections are refused: lower max_connections, max_conns, \
             open_file_cache or server.workers, or raise the hard limit \
             (LimitNOFILE= in the systemd unit, ulimit -Hn); see docs/config.md",
            need.total(),
            need.connections,
            need.upstream,
            need.cache,
            config.workers,
            need.listeners,
            need.base,
        ),
        Some(limit) => tracing::info!(
            "RLIMIT_NOFILE {limit} (was {}); this configuration may hold up to {}",
            nofile
                .was
                .map_or_else(|| "unlimited".to_owned(), |w| w.to_string()),
            need.total()
        ),
        None => {}
    }
    need
}
