//! The reverse proxy's metrics: per pool and per upstream server. The
//! families live as long as the process; pools rebuilt by a reload keep
//! counting into the same series. A server or pool that a reload removed
//! loses its series once the last pool object using them is gone (the old
//! generation's last request done): no health state or open-connection
//! count of a server no longer configured stays on `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::LabelText;

/// One upstream server of one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    /// The pool's name.
    pub pool: LabelText,
    /// The server's address as configured.
    pub server: LabelText,
}

/// A failure talking to one server, by kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerErrorLabels {
    /// The pool's name.
    pub pool: LabelText,
    /// The server's address as configured.
    pub server: LabelText,
    /// `connect`, `connect_timeout`, `tls`, `reset`, `response_timeout`,
    /// `bad_response`, `idle_timeout`, `total_timeout`, `truncated`.
    pub kind: &'static str,
}

/// A resolution of a server's host name, by what came of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResolutionLabels {
    /// The pool's name.
    pub pool: LabelText,
    /// The server's address as configured.
    pub server: LabelText,
    /// `changed`, `unchanged` or `failed` (the last address is kept).
    pub result: &'static str,
}

/// A pool's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// The pool's name.
    pub pool: LabelText,
}

/// An error answer of the proxy (502, 503, 504) and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyErrorLabels {
    /// The pool's name.
    pub pool: LabelText,
    /// 502, 503 or 504.
    pub status: u16,
    /// The same reason as the access log's.
    pub reason: &'static str,
}

fn latency() -> Histogram {
    // 100 µs … ~52 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// Every metric of the proxy.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    /// Requests sent to a server (each try counts).
    pub requests: Family<ServerLabels, Counter>,
    /// Failures by kind.
    pub errors: Family<ServerErrorLabels, Counter>,
    /// From the request sent to the response head.
    pub response_seconds: Family<ServerLabels, Histogram, fn() -> Histogram>,
    /// 1 while the server takes requests, 0 while it is out.
    pub healthy: Family<ServerLabels, Gauge>,
    /// Open connections to the server.
    pub connections_open: Family<ServerLabels, Gauge>,
    /// Of those, idle in the keep-alive pools.
    pub connections_idle: Family<ServerLabels, Gauge>,
    /// Requests waiting for a connection to the server (at `max_conns`).
    pub queued: Family<ServerLabels, Gauge>,
    /// Tries made again after one failed on this server (on another
    /// server, or on a new connection when it is the pool's only one).
    pub retries: Family<ServerLabels, Counter>,
    /// Error answers to clients.
    pub proxy_errors: Family<ProxyErrorLabels, Counter>,
    /// Host names resolved again while running.
    pub resolutions: Family<ResolutionLabels, Counter>,
    /// Who uses which series, and which labelled series exist.
    live: Arc<Mutex<Live>>,
}

impl ProxyMetrics {
    pub(crate) fn new() -> Self {
        Self {
            requests: Family::default(),
            errors: Family::default(),
            response_seconds: Family::new_with_constructor(latency),
            healthy: Family::default(),
            connections_open: Family::default(),
            connections_idle: Family::default(),
            queued: Family::default(),
            retries: Family::default(),
            proxy_errors: Family::default(),
            resolutions: Family::default(),
            live: Arc::default(),
        }
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The series of server `labels`, created if new; kept until the last
    /// holder drops them.
    pub fn server(&self, labels: ServerLabels) -> ServerSeries {
        // Under the lock: a last holder's drop removing the series now
        // cannot detach the handles taken here.
        let mut live = self.live();
        live.servers.hold(labels.clone());
        ServerSeries {
            requests: self.requests.get_or_create(&labels).clone(),
            response_seconds: self.response_seconds.get_or_create(&labels).clone(),
            healthy: self.healthy.get_or_create(&labels).clone(),
            connections_open: self.connections_open.get_or_create(&labels).clone(),
            connections_idle: self.connections_idle.get_or_create(&labels).clone(),
            queued: self.queued.get_or_create(&labels).clone(),
            retries: self.retries.get_or_create(&labels).clone(),
            metrics: self.clone(),
            labels,
        }
    }

    /// The series of pool `name`, as [`ProxyMetrics::server`].
    pub fn pool(&self, name: &str) -> PoolSeries {
        let mut live = self.live();
        live.pools.hold(name.into());
        let label = PoolLabel { pool: name.into() };
        PoolSeries {
            metrics: self.clone(),
            label,
        }
    }

    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "upstream_requests",
            "Requests sent to an upstream server (each try)",
            self.requests.clone(),
        );
        r.register(
            "upstream_errors",
            "Failures talking to an upstream server, by kind",
            self.errors.clone(),
        );
        r.register(
            "upstream_response_seconds",
            "Time from the request sent to the upstream's response head",
            self.response_seconds.clone(),
        );
        r.register(
            "upstream_healthy",
            "1 while the upstream server takes requests, 0 while it is out",
            self.healthy.clone(),
        );
        r.register(
            "upstream_connections_open",
            "Open connections to the upstream server",
            self.connections_open.clone(),
        );
        r.register(
            "upstream_connections_idle",
            "Idle keep-alive connections to the upstream server",
            self.connections_idle.clone(),
        );
        r.register(
            "upstream_queued",
            "Requests waiting for a connection to the upstream server (at its max_conns)",
            self.queued.clone(),
        );
        r.register(
            "upstream_retries",
            "Requests tried again after a try failed on this upstream server",
            self.retries.clone(),
        );
        r.register(
            "proxy_errors",
            "Error answers (502, 503, 504) of proxied requests, by reason",
            self.proxy_errors.clone(),
        );
        r.register(
            "upstream_resolutions",
            "Upstream server host names resolved again, by result (changed, unchanged, failed)",
            self.resolutions.clone(),
        );
    }
}

/// The users of each server's and pool's series, and the label values
/// their counters were created with (the families cannot be listed).
#[derive(Debug, Default)]
struct Live {
    servers: Users<ServerLabels, Extra>,
    pools: Users<LabelText, (u16, &'static str)>,
}

/// A server's counters with a label of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    Error(&'static str),
    Resolution(&'static str),
}

/// Holders per key, and the extra label values created under it.
#[derive(Debug)]
struct Users<K, R>(HashMap<K, (usize, Vec<R>)>);

impl<K, R> Default for Users<K, R> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq, R: PartialEq> Users<K, R> {
    fn hold(&mut self, key: K) {
        self.0.entry(key).or_insert((0, Vec::new())).0 += 1;
    }

    /// Notes a label value created under `key`, which a holder has.
    fn record(&mut self, key: &K, extra: R) {
        if let Some((_, seen)) = self.0.get_mut(key) {
            if !seen.contains(&extra) {
                seen.push(extra);
            }
        }
    }

    /// The extra label values to remove when `key`'s last holder let go.
    fn release(&mut self, key: &K) -> Option<Vec<R>> {
        let (users, _) = self.0.get_mut(key)?;
        *users = users.saturating_sub(1);
        if *users > 0 {
            return None;
        }
        self.0.remove(key).map(|(_, extra)| extra)
    }
}

/// One server's series, held by each pool object that has the server; the
/// last one dropped removes them.
#[derive(Debug)]
pub struct ServerSeries {
    metrics: ProxyMetrics,
    labels: ServerLabels,
    /// Requests sent (each try).
    pub requests: Counter,
    /// From the request sent to the response head.
    pub response_seconds: Histogram,
    /// 1 while it takes requests.
    pub healthy: Gauge,
    /// Open connections.
    pub connections_open: Gauge,
    /// Of those, idle.
    pub connections_idle: Gauge,
    /// Requests waiting for a connection.
    pub queued: Gauge,
    /// Tries made again after one failed here.
    pub retries: Counter,
}

impl ServerSeries {
    fn error(&self, kind: &'static str) -> ServerErrorLabels {
        ServerErrorLabels {
            pool: self.labels.pool.clone(),
            server: self.labels.server.clone(),
            kind,
        }
    }

    fn resolution(&self, result: &'static str) -> ResolutionLabels {
        ResolutionLabels {
            pool: self.labels.pool.clone(),
            server: self.labels.server.clone(),
            result,
        }
    }

    /// Counts a failure of `kind`.
    pub fn count_error(&self, kind: &'static str) {
        let mut live = self.metrics.live();
        live.servers.record(&self.labels, Extra::Error(kind));
        self.metrics.errors.get_or_create(&self.error(kind)).inc();
    }

    /// Counts a resolution of its name, by `result`.
    pub fn count_resolution(&self, result: &'static str) {
        let mut live = self.metrics.live();
        live.servers.record(&self.labels, Extra::Resolution(result));
        self.metrics
            .resolutions
            .get_or_create(&self.resolution(result))
            .inc();
    }
}

impl Drop for ServerSeries {
    fn drop(&mut self) {
        let m = &self.metrics;
        // The lock is held until the series are gone (see `server`).
        let mut live = m.live();
        let Some(extra) = live.servers.release(&self.labels) else {
            return;
        };
        let l = &self.labels;
        m.requests.remove(l);
        m.response_seconds.remove(l);
        m.healthy.remove(l);
        m.connections_open.remove(l);
        m.connections_idle.remove(l);
        m.queued.remove(l);
        m.retries.remove(l);
        for e in extra {
            match e {
                Extra::Error(kind) => m.errors.remove(&self.error(kind)),
                Extra::Resolution(result) => m.resolutions.remove(&self.resolution(result)),
            };
        }
    }
}

/// One pool's series, held by each pool object of that name; the last one
/// dropped removes them.
#[derive(Debug)]
pub struct PoolSeries {
    metrics: ProxyMetrics,
    label: PoolLabel,
}

impl PoolSeries {
    fn answer(&self, status: u16, reason: &'static str) -> ProxyErrorLabels {
        ProxyErrorLabels {
            pool: self.label.pool.clone(),
            status,
            reason,
        }
    }

    /// Counts an error answer of the proxy's (502, 503, 504) and why.
    pub fn count_answer(&self, status: u16, reason: &'static str) {
        let mut live = self.metrics.live();
        live.pools.record(&self.label.pool, (status, reason));
        self.metrics
            .proxy_errors
            .get_or_create(&self.answer(status, reason))
            .inc();
    }
}

impl Drop for PoolSeries {
    fn drop(&mut self) {
        let m = &self.metrics;
        let mut live = m.live();
        let Some(answers) = live.pools.release(&self.label.pool) else {
            return;
        };
        for (status, reason) in answers {
            m.proxy_errors.remove(&self.answer(status, reason));
        }
    }
}
