//! The reverse proxy's metrics: per pool and per upstream server. The
//! families live as long as the process; pools rebuilt by a reload keep
//! counting into the same series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// One upstream server of one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    /// The pool's name.
    pub pool: String,
    /// The server's address as configured.
    pub server: String,
}

/// A failure talking to one server, by kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerErrorLabels {
    /// The pool's name.
    pub pool: String,
    /// The server's address as configured.
    pub server: String,
    /// `connect`, `connect_timeout`, `tls`, `reset`, `response_timeout`,
    /// `bad_response`, `idle_timeout`, `total_timeout`, `truncated`.
    pub kind: &'static str,
}

/// A resolution of a server's host name, by what came of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResolutionLabels {
    /// The pool's name.
    pub pool: String,
    /// The server's address as configured.
    pub server: String,
    /// `changed`, `unchanged` or `failed` (the last address is kept).
    pub result: &'static str,
}

/// A pool's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// The pool's name.
    pub pool: String,
}

/// An error answer of the proxy (502, 503, 504) and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyErrorLabels {
    /// The pool's name.
    pub pool: String,
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
    /// Tries after the first.
    pub retries: Family<PoolLabel, Counter>,
    /// Error answers to clients.
    pub proxy_errors: Family<ProxyErrorLabels, Counter>,
    /// Host names resolved again while running.
    pub resolutions: Family<ResolutionLabels, Counter>,
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
            retries: Family::default(),
            proxy_errors: Family::default(),
            resolutions: Family::default(),
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
            "upstream_retries",
            "Requests tried again on another server",
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
