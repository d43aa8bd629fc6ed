//! The counters, gauges and histograms tlsgate exports, and their
//! Prometheus text rendering. One [`Metrics`] is shared by every worker;
//! updates are lock-free atomics except the first use of a new label set.
#![forbid(unsafe_code)]

use prometheus_client::encoding::{
    text::encode, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

pub use prometheus_client::collector::Collector;

mod proxy;
pub use proxy::{
    PoolLabel, PoolSeries, ProxyErrorLabels, ProxyMetrics, ResolutionLabels, ServerErrorLabels,
    ServerLabels, ServerSeries,
};

/// The metric types, for code that keeps clones of single metrics.
pub mod types {
    pub use prometheus_client::metrics::{
        counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
    };
}

/// A label value that comes from outside the program (the configuration,
/// the kernel), escaped as the text format asks: `\\`, `\"` and `\n`.
/// prometheus-client 0.23 writes label values as they are, so a quote
/// would end the value early and a newline start a line of the writer's
/// choosing: `/metrics` that no scraper parses. Values the program writes
/// itself (`&'static str`) need none of this.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LabelText(String);

impl LabelText {
    /// The value as given, unescaped.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for LabelText {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for LabelText {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        let mut rest = self.0.as_str();
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..i])?;
            encoder.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        encoder.write_str(rest)
    }
}

/// Labels of a completed handshake.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// "TLSv1.2" / "TLSv1.3".
    pub version: &'static str,
    /// IANA suite name.
    pub cipher: &'static str,
    /// Key-exchange group name.
    pub group: &'static str,
    /// "true" when resumed.
    pub resumed: &'static str,
}

/// A reason label (handshake failures, rejected connections).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Short stable reason.
    pub reason: &'static str,
}

/// The status class of a response and the protocol it went out in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// "1xx" … "5xx".
    pub class: &'static str,
    /// "http/1.1" or "h2".
    pub protocol: &'static str,
}

/// An application protocol (as negotiated by ALPN).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabel {
    /// "http/1.1" or "h2".
    pub protocol: &'static str,
}

/// An HTTP/2 frame that ends a stream or a connection with an error
/// code, and the code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct H2ErrorLabel {
    /// "rst_stream" or "goaway".
    pub frame: &'static str,
    /// RFC 9113 §7's name in lower case, e.g. "protocol_error".
    pub code: &'static str,
}

/// An outcome: of a reload, a ticket key refresh, a PROXY protocol header.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// "ok" or "error", or the family's own outcomes.
    pub result: &'static str,
}

/// A (direction, version, cipher) the kernel's TLS can run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KtlsLabels {
    /// "tx" or "rx".
    pub direction: &'static str,
    /// "TLSv1.2" / "TLSv1.3".
    pub version: &'static str,
    /// "aes_128_gcm", "aes_256_gcm", "chacha20_poly1305".
    pub cipher: &'static str,
}

/// A direction of the record layer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// "tx" or "rx".
    pub direction: &'static str,
}

/// How response body bytes left the server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// "userspace" (rustls), "ktls_write" (kernel TLS, written) or
    /// "sendfile" (kernel TLS, from the page cache).
    pub path: &'static str,
}

/// A counter of the kernel's, by its own name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabel {
    /// The kernel's name, e.g. `TlsTxSw`.
    pub counter: LabelText,
}

/// Every metric of the server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Client connections currently open.
    pub connections_open: Gauge,
    /// Client connections accepted.
    pub connections_total: Counter,
    /// Connections closed at accept by a limit.
    pub connections_rejected: Family<ReasonLabel, Counter>,
    /// Failed accept() calls: `descriptors` (EMFILE, ENFILE) and `memory`
    /// (ENOMEM, ENOBUFS) pause the listener, `connection` (one that was
    /// aborted before it was accepted) does not, `other` pauses too.
    pub accept_errors: Family<ReasonLabel, Counter>,
    /// PROXY protocol headers from trusted balancers: `result` is the
    /// version read ("v1", "v2") or why the connection was closed.
    pub proxy_protocol_headers: Family<ResultLabel, Counter>,
    /// Completed handshakes.
    pub handshakes: Family<HandshakeLabels, Counter>,
    /// Failed handshakes by reason.
    pub handshake_failures: Family<ReasonLabel, Counter>,
    /// Handshake duration from accept.
    pub handshake_seconds: Histogram,
    /// Responses by status class.
    pub requests: Family<StatusLabel, Counter>,
    /// Request duration from complete head to response queued.
    pub request_seconds: Histogram,
    /// Response bytes handed to TLS (headers and bodies).
    pub bytes_sent: Counter,
    /// Connections closed by a timeout, by which one.
    pub timeouts: Family<ReasonLabel, Counter>,
    /// Access log lines dropped because the writer fell behind.
    pub access_log_dropped: Counter,
    /// Configuration reloads.
    pub reloads: Family<ResultLabel, Counter>,
    /// Session tickets sealed (TLS 1.2 and 1.3).
    pub tickets_issued: Counter,
    /// Tickets presented by clients: "ok", "expired", "unknown_key", "failed".
    pub ticket_decrypts: Family<ResultLabel, Counter>,
    /// Re-reads of the ticket key file after it changed: "ok" or "error".
    pub ticket_key_reloads: Family<ResultLabel, Counter>,
    /// Rotations of in-memory ticket keys.
    pub ticket_key_rotations: Counter,
    /// Ticket keys in use.
    pub ticket_keys: Gauge,
    /// TLS handshakes in progress (set when the metrics are read).
    pub handshakes_in_progress: Gauge,
    /// Sources the handshake limits remember (set when the metrics are read).
    pub handshake_sources_tracked: Gauge,
    /// Signatures the key process could not give, by reason.
    pub key_failures: Family<ReasonLabel, Counter>,
    /// Key servers connected after the first (restarts).
    pub key_restarts: Counter,
    /// 1 while a key server is connected (always 1 without isolation).
    pub key_up: Gauge,
    /// 1 when the kernel offers TLS offload (kTLS), 0 when not.
    pub ktls_available: Gauge,
    /// What kTLS can run: 1 per (direction, version, cipher).
    pub ktls_supported: Family<KtlsLabels, Gauge>,
    /// Connections whose record layer moved into the kernel, by direction.
    pub ktls_offloaded: Family<DirectionLabel, Counter>,
    /// Mid-connection switches made by `offload = "auto"`.
    pub ktls_switches: Counter,
    /// Switches to kTLS that did not happen or broke, by reason.
    pub ktls_failures: Family<ReasonLabel, Counter>,
    /// Offloaded connections closed on a message the kernel cannot handle.
    pub ktls_closed: Family<ReasonLabel, Counter>,
    /// Response body bytes by how they were sent.
    pub body_bytes: Family<PathLabel, Counter>,
    /// The kernel's kTLS counters (`/proc/net/tls_stat`; set when read).
    pub kernel_tls: Family<CounterLabel, Gauge>,
    /// Connections by the application protocol they speak.
    pub protocol_connections: Family<ProtocolLabel, Counter>,
    /// HTTP/2 streams open (being served).
    pub h2_streams_open: Gauge,
    /// HTTP/2 streams opened by clients.
    pub h2_streams: Counter,
    /// File bytes read for HTTP/2 streams and not yet written to their
    /// TLS connections (held in the send budgets), every worker together.
    pub h2_send_buffered: Gauge,
    /// HTTP/2 streams waiting for their worker's send budget.
    pub h2_send_waiting: Gauge,
    /// HTTP/2 connections ended by an error or a limit, and streams
    /// reset by the server, by reason.
    pub h2_rejected: Family<ReasonLabel, Counter>,
    /// RST_STREAM and GOAWAY frames the server sent, by error code: also
    /// the resets the `h2` crate makes by itself (malformed requests,
    /// REFUSED_STREAM past the stream limit, flow-control errors).
    pub h2_errors_sent: Family<H2ErrorLabel, Counter>,
    /// The reverse proxy's pools and servers.
    pub proxy: ProxyMetrics,
    /// `requests` and `body_bytes` handles, each looked up once.
    per_request: PerRequest,
}

/// The counters every request adds to, each looked up in its `Family`
/// once (at its first use, so that no series shows before it counts): a
/// lookup takes the family's lock and hashes the labels' strings, twice
/// per request on the 1 KiB paths.
#[derive(Debug, Default)]
struct PerRequest {
    /// By protocol ("http/1.1", "h2"), then status class.
    status: [[OnceLock<Counter>; STATUS_CLASSES.len()]; REQUEST_PROTOCOLS.len()],
    /// By [`BODY_PATHS`].
    body: [OnceLock<Counter>; BODY_PATHS.len()],
}

const REQUEST_PROTOCOLS: [&str; 2] = ["http/1.1", "h2"];
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const BODY_PATHS: [&str; 3] = ["userspace", "ktls_write", "sendfile"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `tlsgate_` prefix.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("tlsgate"),
            connections_open: Gauge::default(),
            connections_total: Counter::default(),
            connections_rejected: Family::default(),
            accept_errors: Family::default(),
            proxy_protocol_headers: Family::default(),
            handshakes: Family::default(),
            handshake_failures: Family::default(),
            // 50 µs … ~3.3 s
            handshake_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 17)),
            requests: Family::default(),
            request_seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
            bytes_sent: Counter::default(),
            timeouts: Family::default(),
            access_log_dropped: Counter::default(),
            reloads: Family::default(),
            tickets_issued: Counter::default(),
            ticket_decrypts: Family::default(),
            ticket_key_reloads: Family::default(),
            ticket_key_rotations: Counter::default(),
            ticket_keys: Gauge::default(),
            handshakes_in_progress: Gauge::default(),
            handshake_sources_tracked: Gauge::default(),
            key_failures: Family::default(),
            key_restarts: Counter::default(),
            key_up: Gauge::default(),
            ktls_available: Gauge::default(),
            ktls_supported: Family::default(),
            ktls_offloaded: Family::default(),
            ktls_switches: Counter::default(),
            ktls_failures: Family::default(),
            ktls_closed: Family::default(),
            body_bytes: Family::default(),
            kernel_tls: Family::default(),
            protocol_connections: Family::default(),
            h2_streams_open: Gauge::default(),
            h2_send_buffered: Gauge::default(),
            h2_send_waiting: Gauge::default(),
            h2_streams: Counter::default(),
            h2_rejected: Family::default(),
            h2_errors_sent: Family::default(),
            proxy: ProxyMetrics::new(),
            per_request: PerRequest::default(),
        };
        m.proxy.register(&mut m.registry);
        let r = &mut m.registry;
        r.register(
            "connections_open",
            "Client connections open",
            m.connections_open.clone(),
        );
        r.register(
            "connections",
            "Client connections accepted",
            m.connections_total.clone(),
        );
        r.register(
            "connections_rejected",
            "Connections refused at accept by a limit",
            m.connections_rejected.clone(),
        );
        r.register(
            "accept_errors",
            "Failed accept() calls, by reason; all but connection pause the listener 100 ms",
            m.accept_errors.clone(),
        );
        r.register(
            "proxy_protocol_headers",
            "PROXY protocol headers from trusted balancers, by version read or by why the connection was closed",
            m.proxy_protocol_headers.clone(),
        );
        r.register(
            "handshakes",
            "TLS handshakes completed",
            m.handshakes.clone(),
        );
        r.register(
            "handshake_failures",
            "TLS handshakes that failed, by reason",
            m.handshake_failures.clone(),
        );
        r.register(
            "handshake_seconds",
            "TLS handshake duration",
            m.handshake_seconds.clone(),
        );
        r.register(
            "requests",
            "HTTP responses by status class",
            m.requests.clone(),
        );
        r.register(
            "request_seconds",
            "Time from request head to response written",
            m.request_seconds.clone(),
        );
        r.register(
            "sent_bytes",
            "Response bytes sent (before TLS)",
            m.bytes_sent.clone(),
        );
        r.register(
            "timeouts",
            "Connections closed by a timeout",
            m.timeouts.clone(),
        );
        r.register(
            "access_log_dropped",
            "Access log lines dropped (writer behind)",
            m.access_log_dropped.clone(),
        );
        r.register("reloads", "Configuration reloads", m.reloads.clone());
        r.register(
            "tickets_issued",
            "Session tickets issued",
            m.tickets_issued.clone(),
        );
        r.register(
            "ticket_decrypts",
            "Session tickets presented by clients, by result",
            m.ticket_decrypts.clone(),
        );
        r.register(
            "ticket_key_reloads",
            "Re-reads of the ticket key file after it changed",
            m.ticket_key_reloads.clone(),
        );
        r.register(
            "ticket_key_rotations",
            "Rotations of in-memory ticket keys",
            m.ticket_key_rotations.clone(),
        );
        r.register("ticket_keys", "Ticket keys in use", m.ticket_keys.clone());
        r.register(
            "handshakes_in_progress",
            "TLS handshakes in progress",
            m.handshakes_in_progress.clone(),
        );
        r.register(
            "handshake_sources_tracked",
            "Client sources remembered by the handshake flood limits",
            m.handshake_sources_tracked.clone(),
        );
        r.register(
            "key_failures",
            "Signatures the key process could not give, by reason",
            m.key_failures.clone(),
        );
        r.register(
            "key_restarts",
            "Key servers started again after one exited",
            m.key_restarts.clone(),
        );
        r.register(
            "key_up",
            "1 while the key process is connected",
            m.key_up.clone(),
        );
        r.register(
            "ktls_available",
            "1 when the kernel offers TLS offload (kTLS)",
            m.ktls_available.clone(),
        );
        r.register(
            "ktls_supported",
            "Record-layer directions, versions and ciphers the kernel's TLS runs",
            m.ktls_supported.clone(),
        );
        r.register(
            "ktls_offloaded",
            "Connections whose record layer moved into the kernel",
            m.ktls_offloaded.clone(),
        );
        r.register(
            "ktls_switches",
            "Mid-connection switches to kernel TLS made by offload = auto",
            m.ktls_switches.clone(),
        );
        r.register(
            "ktls_failures",
            "Switches to kernel TLS that did not happen or broke the connection",
            m.ktls_failures.clone(),
        );
        r.register(
            "ktls_closed",
            "Offloaded connections closed on a message the kernel cannot handle",
            m.ktls_closed.clone(),
        );
        r.register(
            "body_bytes",
            "Response body bytes by path: userspace, ktls_write, sendfile",
            m.body_bytes.clone(),
        );
        r.register(
            "kernel_tls",
            "The kernel's kTLS counters from /proc/net/tls_stat",
            m.kernel_tls.clone(),
        );
        r.register(
            "protocol_connections",
            "Client connections by application protocol (ALPN)",
            m.protocol_connections.clone(),
        );
        r.register(
            "h2_streams_open",
            "HTTP/2 streams being served",
            m.h2_streams_open.clone(),
        );
        r.register(
            "h2_streams",
            "HTTP/2 streams opened by clients",
            m.h2_streams.clone(),
        );
        r.register(
            "h2_send_buffered_bytes",
            "File bytes read for HTTP/2 streams and not yet written to their connections (send budgets in use)",
            m.h2_send_buffered.clone(),
        );
        r.register(
            "h2_send_waiting_streams",
            "HTTP/2 streams waiting for their worker's send budget",
            m.h2_send_waiting.clone(),
        );
        r.register(
            "h2_rejected",
            "HTTP/2 connections ended by an error or a limit, and streams reset by the server, by reason",
            m.h2_rejected.clone(),
        );
        r.register(
            "h2_errors_sent",
            "HTTP/2 RST_STREAM and GOAWAY frames sent, by error code (the h2 crate's own resets included)",
            m.h2_errors_sent.clone(),
        );
        m
    }

    /// Adds response body bytes sent by `path`.
    pub fn count_body(&self, path: &'static str, bytes: u64) {
        let family = || self.body_bytes.get_or_create(&PathLabel { path }).clone();
        match BODY_PATHS.iter().position(|p| *p == path) {
            Some(i) => self.per_request.body[i].get_or_init(family).inc_by(bytes),
            None => family().inc_by(bytes),
        };
    }

    /// Counts a response sent in `protocol` ("http/1.1" or "h2").
    pub fn count_status(&self, protocol: &'static str, status: u16) {
        let c = match status {
            100..=199 => 0,
            200..=299 => 1,
            300..=399 => 2,
            400..=499 => 3,
            _ => 4,
        };
        let class = STATUS_CLASSES[c];
        let family = || {
            self.requests
                .get_or_create(&StatusLabel { class, protocol })
                .clone()
        };
        match REQUEST_PROTOCOLS.iter().position(|p| *p == protocol) {
            Some(p) => self.per_request.status[p][c].get_or_init(family).inc(),
            None => family().inc(),
        };
    }

    /// Counts an HTTP/2 connection or stream ended by `reason`.
    pub fn count_h2_rejected(&self, reason: &'static str) {
        self.h2_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a RST_STREAM or GOAWAY frame sent with error `code`.
    pub fn count_h2_error_sent(&self, frame: &'static str, code: &'static str) {
        self.h2_errors_sent
            .get_or_create(&H2ErrorLabel { frame, code })
            .inc();
    }

    /// Adds metrics read at every scrape by `collector` (XDP SynGate's
    /// counters live in BPF maps, not here).
    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        self.registry.register_collector(collector);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Label values from the configuration or the kernel are escaped as
    /// the text format asks; prometheus-client writes them as they are.
    #[test]
    fn label_values_from_outside_are_escaped() {
        let m = Metrics::new();
        let _s = m.proxy.server(ServerLabels {
            pool: "a\"b".into(),
            server: "c\\d\ne:80".into(),
        });
        m.kernel_tls
            .get_or_create(&CounterLabel {
                counter: "Tls\"Tx".into(),
            })
            .set(1);
        let text = m.render();
        assert!(
            text.contains(r#"{pool="a\"b",server="c\\d\ne:80"}"#),
            "{text}"
        );
        assert!(text.contains(r#"{counter="Tls\"Tx"} 1"#), "{text}");
        assert!(!text.contains("d\ne"), "a raw newline in a value: {text}");
    }

    #[test]
    fn per_request_counters_count_in_their_series_and_show_only_once_used() {
        let m = Metrics::new();
        assert!(!m.render().contains("requests_total{"));
        for _ in 0..3 {
            m.count_status("h2", 204);
        }
        m.count_status("http/1.1", 503);
        // A protocol the cache does not know still counts.
        m.count_status("HTTP/1.0", 200);
        m.count_body("sendfile", 10);
        m.count_body("sendfile", 5);
        m.count_body("elsewhere", 7);
        // A handle taken from the family sees the same count.
        let direct = m.requests.get_or_create(&StatusLabel {
            class: "2xx",
            protocol: "h2",
        });
        assert_eq!(direct.get(), 3);
        let text = m.render();
        for line in [
            r#"tlsgate_requests_total{class="2xx",protocol="h2"} 3"#,
            r#"tlsgate_requests_total{class="5xx",protocol="http/1.1"} 1"#,
            r#"tlsgate_requests_total{class="2xx",protocol="HTTP/1.0"} 1"#,
            r#"tlsgate_body_bytes_total{path="sendfile"} 15"#,
            r#"tlsgate_body_bytes_total{path="elsewhere"} 7"#,
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        assert!(!text.contains(r#"path="userspace""#), "{text}");
    }

    #[test]
    fn renders_labelled_counters_and_histograms() {
        let m = Metrics::new();
        m.handshakes
            .get_or_create(&HandshakeLabels {
                version: "TLSv1.3",
                cipher: "TLS13_AES_128_GCM_SHA256",
                group: "X25519",
                resumed: "false",
            })
            .inc();
        m.count_status("h2", 404);
        m.handshake_seconds.observe(0.001);
        let text = m.render();
        assert!(text.contains(r#"tlsgate_handshakes_total{version="TLSv1.3",cipher="TLS13_AES_128_GCM_SHA256",group="X25519",resumed="false"} 1"#), "{text}");
        assert!(
            text.contains(r#"tlsgate_requests_total{class="4xx",protocol="h2"} 1"#),
            "{text}"
        );
        assert!(text.contains("tlsgate_handshake_seconds_count 1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    fn server(m: &Metrics, name: &str) -> ServerSeries {
        m.proxy.server(ServerLabels {
            pool: "app".into(),
            server: name.into(),
        })
    }

    /// A server's and a pool's series outlive a reload that keeps them (an
    /// old and a new pool object hold them at once) and go with the last
    /// holder, error and resolution counters included.
    #[test]
    fn series_go_with_the_last_pool_object_that_has_them() {
        let m = Metrics::new();
        let (old_a, old_b) = (server(&m, "a:80"), server(&m, "b:80"));
        let old_pool = m.proxy.pool("app");
        old_b.healthy.set(1);
        old_b.count_error("connect");
        old_b.count_resolution("unchanged");
        old_pool.count_answer(502, "connect");
        old_a.retries.inc();
        // The reload keeps a and the pool, drops b.
        let new_a = server(&m, "a:80");
        let new_pool = m.proxy.pool("app");
        new_a.healthy.set(1);
        drop((old_a, old_b, old_pool));
        let text = m.render();
        assert!(
            text.contains(r#"tlsgate_upstream_healthy{pool="app",server="a:80"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tlsgate_upstream_retries_total{pool="app",server="a:80"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"tlsgate_proxy_errors_total{pool="app",status="502",reason="connect"} 1"#
            ),
            "{text}"
        );
        assert!(!text.contains(r#"server="b:80""#), "{text}");
        // The next reload removes the pool.
        drop((new_a, new_pool));
        let text = m.render();
        assert!(!text.contains(r#"pool="app""#), "{text}");
        // Configured again: new series, from zero.
        let again = server(&m, "b:80");
        let text = m.render();
        assert!(
            text.contains(r#"tlsgate_upstream_healthy{pool="app",server="b:80"} 0"#),
            "{text}"
        );
        assert!(!text.contains("tlsgate_upstream_errors_total{"), "{text}");
        drop(again);
    }
}
