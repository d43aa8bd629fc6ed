//! `[[upstream]]` pools and `[[listener.route]]` routes: the file's tables,
//! and their validation into [`Upstream`] and [`Route`]. What they do is
//! tlsgate-proxy's business; this module only checks them.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::validate::Checker;
use crate::ConfigError;

/// `[[upstream]]`: a pool of application servers.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// Name that routes refer to (required, unique).
    pub name: String,
    /// The servers; `[[upstream.server]]` tables.
    #[serde(rename = "server")]
    pub servers: Vec<UpstreamServerSection>,
    /// "round_robin" (default), "weighted", "least_connections", or
    /// "hash" (with `hash_key`).
    pub balance: Option<String>,
    /// For `balance = "hash"`: "source", "header:NAME" or "cookie:NAME".
    pub hash_key: Option<String>,
    /// Speak TLS to the servers.
    pub tls: bool,
    /// PEM bundle of the CAs the servers' certificates must chain to
    /// (required with `tls = true`).
    pub ca: Option<PathBuf>,
    /// Server name sent as SNI and verified; default: each server's host.
    pub sni: Option<String>,
    /// Client certificate chain (PEM) presented to the servers (mTLS).
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub client_key: Option<PathBuf>,
    /// Resume TLS sessions to the servers (default true).
    pub session_resumption: Option<bool>,
    /// Time allowed to open a connection (TCP and TLS handshake).
    #[serde(with = "humantime_serde::option")]
    pub connect_timeout: Option<Duration>,
    /// Time allowed from the request's end to the response head.
    #[serde(with = "humantime_serde::option")]
    pub response_timeout: Option<Duration>,
    /// Longest silence while a body streams, and how long an idle pooled
    /// connection is kept.
    #[serde(with = "humantime_serde::option")]
    pub idle_timeout: Option<Duration>,
    /// Time allowed for the whole exchange, body included; unset = none.
    #[serde(with = "humantime_serde::option")]
    pub total_timeout: Option<Duration>,
    /// Idle keep-alive connections kept per server and worker.
    pub max_idle: Option<usize>,
    /// Connections open to one server (in use and idle), all workers.
    pub max_conns: Option<usize>,
    /// Requests that may wait for a connection to one server at its cap.
    pub queue: Option<usize>,
    /// How long such a request waits before a 503.
    #[serde(with = "humantime_serde::option")]
    pub queue_timeout: Option<Duration>,
    /// Further servers tried for an idempotent request that failed before
    /// any response byte (connect failure, reset).
    pub retries: Option<u32>,
    /// Consecutive failures that take a server out (passive checks); 0 = never.
    pub max_fails: Option<u32>,
    /// How long a server failed that way stays out.
    #[serde(with = "humantime_serde::option")]
    pub fail_timeout: Option<Duration>,
    /// How often server host names are resolved again (default 30 s;
    /// "0s" = only when the configuration is loaded).
    #[serde(with = "humantime_serde::option")]
    pub resolve_interval: Option<Duration>,
    /// Active health checks.
    pub health_check: Option<HealthCheckSection>,
    /// Begin every connection to the servers with a PROXY protocol header
    /// naming the client: "v1" (text) or "v2" (binary); unset = none.
    pub proxy_protocol: Option<String>,
}

/// `[[upstream.server]]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamServerSection {
    /// "host:port"; a host name is resolved when the config is loaded and
    /// again every `resolve_interval`.
    pub address: String,
    /// Share of requests relative to the pool's other servers (default 1).
    pub weight: Option<u32>,
}

/// `[upstream.health_check]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckSection {
    /// Path requested with GET (default "/").
    pub path: Option<String>,
    /// Host header of the check (default: the server's address).
    pub host: Option<String>,
    /// Time between checks of one server (default 2 s).
    #[serde(with = "humantime_serde::option")]
    pub interval: Option<Duration>,
    /// Time allowed for one check (default 1 s).
    #[serde(with = "humantime_serde::option")]
    pub timeout: Option<Duration>,
    /// Consecutive successes that bring a server back (default 2).
    pub rise: Option<u32>,
    /// Consecutive failures that take it out (default 3).
    pub fall: Option<u32>,
    /// Statuses counted as healthy; default any 2xx or 3xx.
    pub expect_status: Option<Vec<u16>>,
}

/// `[[listener.route]]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RouteSection {
    /// Host header (port ignored) this route serves: exact or
    /// `*.example.com`; none = any.
    pub host: Option<String>,
    /// TLS server name (SNI) this route serves; none = any.
    pub sni: Option<String>,
    /// Path prefix, matched at segment boundaries (default "/").
    pub path: Option<String>,
    /// The `[[upstream]]` that serves it.
    pub upstream: Option<String>,
    /// Or a document root that serves it as static files.
    pub root: Option<PathBuf>,
    /// Largest request body passed on (default `limits.max_body_bytes`).
    pub max_body_bytes: Option<u64>,
}

/// How a pool picks a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// In turn, ignoring weights.
    RoundRobin,
    /// In turn, in proportion to weights (smooth weighted round-robin).
    Weighted,
    /// The fewest requests in flight relative to weight.
    LeastConnections,
    /// A consistent hash of the key (weights give ring points).
    Hash(HashKey),
}

/// What `balance = "hash"` hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's IP address.
    Source,
    /// A request header's value (lower-case name).
    Header(String),
    /// A cookie's value.
    Cookie(String),
}

/// The PROXY protocol version an `[[upstream]]` sends (HAProxy's
/// `send-proxy` and `send-proxy-v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    /// The text header: `PROXY TCP4 client server cport sport`.
    V1,
    /// The binary header.
    V2,
}

/// Upstream TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// CA bundle the servers' certificates are verified against.
    pub ca: PathBuf,
    /// Name sent and verified instead of each server's host.
    pub sni: Option<String>,
    /// Client certificate chain and key (mTLS origination).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Session resumption on.
    pub resumption: bool,
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    /// As written (host:port), for logs, metrics and Host of checks.
    pub address: String,
    /// The host part, for SNI.
    pub host: String,
    /// Resolved at load.
    pub addr: SocketAddr,
    /// At least 1.
    pub weight: u32,
    /// The host is a name (not an IP literal): resolved again while running.
    pub named: bool,
}

/// Active health checks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each field mirrors the documented file key of the same name.
pub struct HealthCheck {
    pub path: String,
    pub host: Option<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// Empty: any 2xx or 3xx.
    pub expect_status: Vec<u16>,
}

/// A validated `[[upstream]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each field mirrors the documented file key of the same name.
pub struct Upstream {
    pub name: String,
    /// Config key, e.g. `upstream[0]`.
    pub key_path: String,
    pub servers: Vec<UpstreamServer>,
    pub balance: Balance,
    pub tls: Option<UpstreamTls>,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Option<Duration>,
    pub max_idle: usize,
    /// Per server, every worker together; at least 1.
    pub max_conns: usize,
    /// Requests waiting per server for a connection; 0: none wait.
    pub queue: usize,
    pub queue_timeout: Duration,
    pub retries: u32,
    pub max_fails: u32,
    pub fail_timeout: Duration,
    pub health_check: Option<HealthCheck>,
    /// Zero: names are resolved only at load.
    pub resolve_interval: Duration,
    /// A PROXY protocol header begins each connection (then the
    /// connection serves only the client it names).
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// Where a route sends its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTarget {
    /// Index into [`crate::Config::upstreams`].
    Upstream(usize),
    /// A document root served as static files.
    Root(PathBuf),
}

/// A validated `[[listener.route]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Config key, e.g. `listener[0].route[1]`.
    pub key_path: String,
    /// Lower-case host or `*.suffix`; `None` = any.
    pub host: Option<String>,
    /// Lower-case server name; `None` = any.
    pub sni: Option<String>,
    /// Path prefix (starts with '/').
    pub path: String,
    /// Where requests go.
    pub target: RouteTarget,
    /// Request body limit.
    pub max_body_bytes: u64,
}

/// Makes the paths of the tables relative to the config file's directory.
pub(crate) fn resolve_paths(
    base: &Path,
    upstreams: &mut [UpstreamSection],
    routes: &mut [&mut RouteSection],
) {
    for u in upstreams {
        for p in [&mut u.ca, &mut u.client_cert, &mut u.client_key]
            .into_iter()
            .flatten()
        {
            *p = base.join(&*p);
        }
    }
    for r in routes {
        if let Some(root) = &mut r.root {
            *root = base.join(&*root);
        }
    }
}

pub(crate) fn validate_upstreams(
    c: &Checker<'_>,
    sections: &[UpstreamSection],
) -> Result<Vec<Upstream>, ConfigError> {
    let mut out: Vec<Upstream> = Vec::with_capacity(sections.len());
    for (i, u) in sections.iter().enumerate() {
        let up = validate_upstream(c, i, u)?;
        if out.iter().any(|o| o.name == up.name) {
            return Err(c.err(
                format!("upstream[{i}].name"),
                format!(
                    "the name {:?} is used by more than one [[upstream]]",
                    up.name
                ),
            ));
        }
        out.push(up);
    }
    Ok(out)
}

fn validate_upstream(
    c: &Checker<'_>,
    i: usize,
    u: &UpstreamSection,
) -> Result<Upstream, ConfigError> {
    let k = format!("upstream[{i}]");
    let key = |s: &str| format!("{k}.{s}");
    let name = u.name.trim().to_string();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(c.err(
            key("name"),
            format!("expected a name of letters, digits, '-', '_' or '.', found {name:?}"),
        ));
    }
    if u.servers.is_empty() {
        return Err(c.err(
            key("server"),
            "expected at least one [[upstream.server]] table with an address",
        ));
    }
    let mut servers = Vec::with_capacity(u.servers.len());
    for (j, s) in u.servers.iter().enumerate() {
        let sk = format!("{k}.server[{j}]");
        servers.push(validate_server(c, &sk, s)?);
    }
    let balance = match (u.balance.as_deref().unwrap_or("round_robin"), &u.hash_key) {
        ("round_robin", None) => Balance::RoundRobin,
        ("weighted", None) => Balance::Weighted,
        ("least_connections", None) => Balance::LeastConnections,
        ("hash", Some(h)) => Balance::Hash(parse_hash_key(h).ok_or_else(|| {
            c.err(
                key("hash_key"),
                format!("expected \"source\", \"header:NAME\" or \"cookie:NAME\", found {h:?}"),
            )
        })?),
        ("hash", None) => {
            return Err(c.err(
                key("hash_key"),
                "balance = \"hash\" needs hash_key = \"source\", \"header:NAME\" or \"cookie:NAME\"",
            ))
        }
        ("round_robin" | "weighted" | "least_connections", Some(_)) => {
            return Err(c.err(key("hash_key"), "hash_key is only used with balance = \"hash\""))
        }
        (other, _) => {
            return Err(c.err(
                key("balance"),
                format!("expected \"round_robin\", \"weighted\", \"least_connections\" or \"hash\", found {other:?}"),
            ))
        }
    };
    let tls = validate_tls(c, &k, u)?;
    let positive = |name: &str, d: Option<Duration>, default: u64| {
        c.positive(&key(name), d.unwrap_or(Duration::from_millis(default)))
    };
    let total_timeout = match u.total_timeout {
        Some(d) => Some(positive("total_timeout", Some(d), 0)?),
        None => None,
    };
    let health_check = match &u.health_check {
        Some(h) => Some(validate_health(c, &k, h)?),
        None => None,
    };
    let proxy_protocol = match u.proxy_protocol.as_deref() {
        None => None,
        Some("v1") => Some(ProxyProtocol::V1),
        Some("v2") => Some(ProxyProtocol::V2),
        Some(other) => {
            return Err(c.err(
                key("proxy_protocol"),
                format!("expected \"v1\" or \"v2\", found {other:?}"),
            ))
        }
    };
    Ok(Upstream {
        name,
        key_path: k.clone(),
        servers,
        balance,
        tls,
        connect_timeout: positive("connect_timeout", u.connect_timeout, 5_000)?,
        response_timeout: positive("response_timeout", u.response_timeout, 60_000)?,
        idle_timeout: positive("idle_timeout", u.idle_timeout, 60_000)?,
        total_timeout,
        max_idle: c.within(&key("max_idle"), u.max_idle.unwrap_or(32), 0, 100_000)?,
        max_conns: c.within(&key("max_conns"), u.max_conns.unwrap_or(256), 1, 1_000_000)?,
        queue: c.within(&key("queue"), u.queue.unwrap_or(1024), 0, 1_000_000)?,
        queue_timeout: positive("queue_timeout", u.queue_timeout, 10_000)?,
        retries: c.within(&key("retries"), u.retries.unwrap_or(2), 0, 16)?,
        max_fails: c.within(&key("max_fails"), u.max_fails.unwrap_or(3), 0, 1000)?,
        fail_timeout: positive("fail_timeout", u.fail_timeout, 10_000)?,
        health_check,
        resolve_interval: c.not_too_long(
            &key("resolve_interval"),
            u.resolve_interval.unwrap_or(Duration::from_secs(30)),
        )?,
        proxy_protocol,
    })
}

fn validate_server(
    c: &Checker<'_>,
    sk: &str,
    s: &UpstreamServerSection,
) -> Result<UpstreamServer, ConfigError> {
    let address = s.address.trim().to_string();
    let bad = |why: String| c.err(format!("{sk}.address"), why);
    let (host, _port) = address
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0))
        .ok_or_else(|| {
            bad(format!(
                "expected \"host:port\" like \"10.0.0.5:8080\" or \"app.internal:80\", found {address:?}"
            ))
        })?;
    let addr = address
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve {address:?}: {e}")))?
        .next()
        .ok_or_else(|| bad(format!("{address:?} resolves to no address")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(UpstreamServer {
        address: address.clone(),
        named: host.parse::<std::net::IpAddr>().is_err(),
        host,
        addr,
        weight: c.within(&format!("{sk}.weight"), s.weight.unwrap_or(1), 1, 1000)?,
    })
}

fn parse_hash_key(h: &str) -> Option<HashKey> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    match h.split_once(':') {
        None if h == "source" => Some(HashKey::Source),
        Some(("header", n)) if token(n) => Some(HashKey::Header(n.to_ascii_lowercase())),
        Some(("cookie", n)) if token(n) => Some(HashKey::Cookie(n.to_string())),
        _ => None,
    }
}

fn pem_file(c: &Checker<'_>, key: String, p: &Path) -> Result<PathBuf, ConfigError> {
    if p.is_file() {
        Ok(p.to_path_buf())
    } else {
        Err(c.err(
            key,
            format!(
                "expected a readable PEM file, found {:?}",
                p.display().to_string()
            ),
        ))
    }
}

fn validate_tls(
    c: &Checker<'_>,
    k: &str,
    u: &UpstreamSection,
) -> Result<Option<UpstreamTls>, ConfigError> {
    let key = |s: &str| format!("{k}.{s}");
    if !u.tls {
        for (name, set) in [
            ("ca", u.ca.is_some()),
            ("sni", u.sni.is_some()),
            ("client_cert", u.client_cert.is_some()),
            ("client_key", u.client_key.is_some()),
            ("session_resumption", u.session_resumption.is_some()),
        ] {
            if set {
                return Err(c.err(key(name), "only used with tls = true next to it"));
            }
        }
        return Ok(None);
    }
    let ca = u.ca.as_deref().ok_or_else(|| {
        c.err(
            key("ca"),
            "tls = true needs the PEM bundle of the CAs the servers' certificates chain to",
        )
    })?;
    let ca = pem_file(c, key("ca"), ca)?;
    let client_cert = match (&u.client_cert, &u.client_key) {
        (Some(cert), Some(k2)) => Some((
            pem_file(c, key("client_cert"), cert)?,
            pem_file(c, key("client_key"), k2)?,
        )),
        (None, None) => None,
        (Some(_), None) => return Err(c.err(key("client_key"), "client_cert needs client_key")),
        (None, Some(_)) => return Err(c.err(key("client_cert"), "client_key needs client_cert")),
    };
    Ok(Some(UpstreamTls {
        ca,
        sni: u.sni.as_ref().map(|s| s.trim().to_ascii_lowercase()),
        client_cert,
        resumption: u.session_resumption.unwrap_or(true),
    }))
}

fn validate_health(
    c: &Checker<'_>,
    k: &str,
    h: &HealthCheckSection,
) -> Result<HealthCheck, ConfigError> {
    let key = |s: &str| format!("{k}.health_check.{s}");
    let path = h.path.clone().unwrap_or_else(|| "/".into());
    if !path.starts_with('/') || !path.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(c.err(
            key("path"),
            format!("expected a path starting with '/' without spaces, found {path:?}"),
        ));
    }
    if let Some(host) = &h.host {
        if host.is_empty() || !host.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(c.err(key("host"), format!("expected a host name, found {host:?}")));
        }
    }
    let dur = |name: &str, d: Option<Duration>, default: u64| {
        let d = d.unwrap_or(Duration::from_millis(default));
        if d < Duration::from_millis(10) {
            Err(c.err(key(name), "expected a duration of at least \"10ms\""))
        } else {
            c.not_too_long(&key(name), d)
        }
    };
    let expect_status = h.expect_status.clone().unwrap_or_default();
    if let Some(s) = expect_status.iter().find(|s| !(100..=599).contains(*s)) {
        return Err(c.err(
            key("expect_status"),
            format!("expected status codes from 100 to 599, found {s}"),
        ));
    }
    Ok(HealthCheck {
        path,
        host: h.host.clone(),
        interval: dur("interval", h.interval, 2_000)?,
        timeout: dur("timeout", h.timeout, 1_000)?,
        rise: c.within(&key("rise"), h.rise.unwrap_or(2), 1, 100)?,
        fall: c.within(&key("fall"), h.fall.unwrap_or(3), 1, 100)?,
        expect_status,
    })
}

/// A listener's routes, checked against the pools.
/// A route's path prefix in the form requests are matched in (see
/// tlsgate-proxy's `route_view`): escapes in upper case; no escape of an
/// unreserved character, no `\`, `;`, empty or dot-segment, which no
/// request path ever shows a route.
fn route_prefix(path: &str) -> Result<String, &'static str> {
    if path.contains(['\\', ';']) {
        return Err("no '\\' or ';'");
    }
    let mut out = String::with_capacity(path.len());
    let mut chars = path.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let (Some(hi), Some(lo)) = (chars.next(), chars.next()) else {
            return Err("'%' followed by two hex digits");
        };
        let (Some(h), Some(l)) = (hi.to_digit(16), lo.to_digit(16)) else {
            return Err("'%' followed by two hex digits");
        };
        let byte = u8::try_from(h * 16 + l).unwrap_or(0);
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            return Err("unreserved characters written as themselves, not escaped");
        }
        if matches!(byte, b'/' | b'\\') {
            return Err("'/' rather than %2F or %5C");
        }
        out.push('%');
        out.push(hi.to_ascii_uppercase());
        out.push(lo.to_ascii_uppercase());
    }
    let inner = out.strip_prefix('/').unwrap_or(&out);
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if !inner.is_empty()
        && inner
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err("no empty, '.' or '..' segment");
    }
    Ok(out)
}

pub(crate) fn validate_routes(
    c: &Checker<'_>,
    listener_key: &str,
    sections: &[RouteSection],
    upstreams: &[Upstream],
    default_max_body: u64,
) -> Result<Vec<Route>, ConfigError> {
    let mut out: Vec<Route> = Vec::with_capacity(sections.len());
    for (j, r) in sections.iter().enumerate() {
        let rk = format!("{listener_key}.route[{j}]");
        let key = |s: &str| format!("{rk}.{s}");
        let name = |field: &str, v: &Option<String>| -> Result<Option<String>, ConfigError> {
            let Some(v) = v else { return Ok(None) };
            let v = v.trim().to_ascii_lowercase();
            let bare = v.strip_prefix("*.").unwrap_or(&v);
            if bare.is_empty()
                || !bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                return Err(c.err(
                    key(field),
                    format!("expected a host name like \"app.example.com\" or \"*.example.com\", found {v:?}"),
                ));
            }
            Ok(Some(v))
        };
        let host = name("host", &r.host)?;
        let sni = name("sni", &r.sni)?;
        let path = r.path.clone().unwrap_or_else(|| "/".into());
        if !path.starts_with('/') || !path.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(c.err(
                key("path"),
                format!("expected a path prefix starting with '/', found {path:?}"),
            ));
        }
        let path = route_prefix(&path).map_err(|why| {
            c.err(
                key("path"),
                format!("expected a path prefix in the form requests are matched in ({why}), found {path:?}"),
            )
        })?;
        let target = match (&r.upstream, &r.root) {
            (Some(name), None) => {
                RouteTarget::Upstream(upstreams.iter().position(|u| &u.name == name).ok_or_else(
                    || {
                        let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                        c.err(
                            key("upstream"),
                            format!(
                                "no [[upstream]] is named {name:?}; expected one of: {}",
                                if known.is_empty() {
                                    "(none defined)".to_string()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        )
                    },
                )?)
            }
            (None, Some(root)) => {
                if !root.is_dir() {
                    return Err(c.err(
                        key("root"),
                        format!("expected an existing directory, found {}", root.display()),
                    ));
                }
                RouteTarget::Root(root.clone())
            }
            _ => {
                return Err(c.err(
                    key("upstream"),
                    "expected exactly one of upstream = \"NAME\" or root = \"DIR\"",
                ))
            }
        };
        if let Some(prev) = out
            .iter()
            .find(|p| p.host == host && p.sni == sni && p.path == path)
        {
            return Err(c.err(
                key("path"),
                format!(
                    "{} already routes the same host, sni and path",
                    prev.key_path
                ),
            ));
        }
        out.push(Route {
            key_path: rk.clone(),
            host,
            sni,
            path,
            target,
            max_body_bytes: r.max_body_bytes.unwrap_or(default_max_body),
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{load, Config, Overrides};

    fn load_text(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        std::fs::create_dir(dir.path().join("other")).unwrap();
        std::fs::write(dir.path().join("ca.pem"), "x").unwrap();
        let p = dir.path().join("tlsgate.toml");
        std::fs::write(&p, text).unwrap();
        load(Some(&p), &Overrides::default(), Path::new("/nonexistent"))
    }

    const LISTENER: &str =
        "[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = \"site\"\nself_signed = true\n";

    fn with(upstreams: &str, routes: &str) -> String {
        format!("{upstreams}\n{LISTENER}{routes}")
    }

    const POOL: &str = "[[upstream]]\nname = \"app\"\n[[upstream.server]]\naddress = \"127.0.0.1:8080\"\n[[upstream.server]]\naddress = \"localhost:8081\"\nweight = 3\n";

    /// The pool with `keys` at its top level.
    fn pool(keys: &str) -> String {
        POOL.replacen("name = \"app\"\n", &format!("name = \"app\"\n{keys}"), 1)
    }

    /// Proxied routes are served over HTTP/2 too: a listener with a route
    /// to a pool keeps the default ALPN list, and may name h2 itself.
    #[test]
    fn listeners_that_proxy_offer_h2_too() {
        let route = "[[listener.route]]\npath = \"/api\"\nupstream = \"app\"\n";
        let c = load_text(&with(POOL, route)).unwrap();
        assert_eq!(
            c.listeners[0].alpn,
            vec![crate::Alpn::H2, crate::Alpn::Http11]
        );
        let explicit = LISTENER.replace("self_signed", "alpn = [\"h2\"]\nself_signed");
        let c = load_text(&format!("{POOL}\n{explicit}{route}")).unwrap();
        assert_eq!(c.listeners[0].alpn, vec![crate::Alpn::H2]);
    }

    #[test]
    fn pools_and_routes_are_validated_with_defaults() {
        let text = with(
            &format!("{}[upstream.health_check]\npath = \"/healthz\"\nrise = 1\n", pool("balance = \"weighted\"\n")),
            "[[listener.route]]\nhost = \"App.Example.com\"\npath = \"/api\"\nupstream = \"app\"\n[[listener.route]]\npath = \"/static\"\nroot = \"other\"\nmax_body_bytes = 0\n[[listener.route]]\npath = \"/caf%c3%a9/\"\nupstream = \"app\"\n",
        );
        let c = load_text(&text).unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.name, "app");
        assert_eq!(u.balance, Balance::Weighted);
        assert_eq!(u.servers[1].weight, 3);
        assert_eq!(u.servers[1].host, "localhost");
        assert_eq!(u.servers[0].addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(u.retries, 2);
        assert_eq!(u.connect_timeout, Duration::from_secs(5));
        // Names are resolved again every 30 s; IP literals never.
        assert_eq!(u.resolve_interval, Duration::from_secs(30));
        assert_eq!((u.servers[0].named, u.servers[1].named), (false, true));
        let h = u.health_check.as_ref().unwrap();
        assert_eq!((h.path.as_str(), h.rise, h.fall), ("/healthz", 1, 3));
        let r = &c.listeners[0].routes;
        assert_eq!(r[0].host.as_deref(), Some("app.example.com"));
        assert_eq!(r[0].target, RouteTarget::Upstream(0));
        assert_eq!(r[0].max_body_bytes, c.limits.max_body_bytes);
        assert!(matches!(&r[1].target, RouteTarget::Root(p) if p.is_absolute()));
        assert_eq!(r[1].max_body_bytes, 0);
        // Escapes in the case requests are matched in.
        assert_eq!(r[2].path, "/caf%C3%A9/");
    }

    #[test]
    fn a_pool_may_send_the_proxy_protocol() {
        let c = load_text(&with(POOL, "")).unwrap();
        assert_eq!(c.upstreams[0].proxy_protocol, None);
        for (text, version) in [("v1", ProxyProtocol::V1), ("v2", ProxyProtocol::V2)] {
            let keys = format!("proxy_protocol = \"{text}\"\n");
            let c = load_text(&with(&pool(&keys), "")).unwrap();
            assert_eq!(c.upstreams[0].proxy_protocol, Some(version));
        }
    }

    #[test]
    fn name_resolution_can_be_left_to_load_time() {
        let c = load_text(&with(&pool("resolve_interval = \"0s\"\n"), "")).unwrap();
        assert!(c.upstreams[0].resolve_interval.is_zero());
        let c = load_text(&with(&pool("resolve_interval = \"5m\"\n"), "")).unwrap();
        assert_eq!(c.upstreams[0].resolve_interval, Duration::from_secs(300));
    }

    #[test]
    fn connection_caps_have_safe_defaults() {
        let c = load_text(&with(POOL, "")).unwrap();
        let u = &c.upstreams[0];
        assert_eq!(
            (u.max_conns, u.queue, u.queue_timeout),
            (256, 1024, Duration::from_secs(10))
        );
        assert_eq!(c.http2.max_proxied_streams, 32);
    }

    #[test]
    fn errors_name_file_key_and_expectation() {
        let cases: &[(String, &str, &str)] = &[
            (with("[[upstream]]\nname = \"a b\"\n", ""), "upstream[0].name", "letters"),
            (with("[[upstream]]\nname = \"a\"\n", ""), "upstream[0].server", "at least one"),
            (with(&format!("{POOL}{POOL}"), ""), "upstream[1].name", "more than one"),
            (with("[[upstream]]\nname = \"a\"\n[[upstream.server]]\naddress = \"nowhere\"\n", ""), "upstream[0].server[0].address", "host:port"),
            (with("[[upstream]]\nname = \"a\"\n[[upstream.server]]\naddress = \"no-such-host.invalid:80\"\n", ""), "upstream[0].server[0].address", "cannot resolve"),
            (with(&pool("balance = \"random\"\n"), ""), "upstream[0].balance", "least_connections"),
            (with(&pool("balance = \"hash\"\n"), ""), "upstream[0].hash_key", "needs hash_key"),
            (with(&pool("balance = \"hash\"\nhash_key = \"query:x\"\n"), ""), "upstream[0].hash_key", "cookie:NAME"),
            (with(&pool("tls = true\n"), ""), "upstream[0].ca", "PEM bundle"),
            (with(&pool("proxy_protocol = \"v3\"\n"), ""), "upstream[0].proxy_protocol", "\"v1\" or \"v2\""),
            (with(&pool("tls = true\nca = \"missing.pem\"\n"), ""), "upstream[0].ca", "readable PEM"),
            (with(&pool("ca = \"ca.pem\"\n"), ""), "upstream[0].ca", "tls = true"),
            (with(&pool("tls = true\nca = \"ca.pem\"\nclient_cert = \"ca.pem\"\n"), ""), "upstream[0].client_key", "needs client_key"),
            (with(&pool("connect_timeout = \"0s\"\n"), ""), "upstream[0].connect_timeout", "greater than zero"),
            (with(&pool("max_conns = 0\n"), ""), "upstream[0].max_conns", "from 1 to 1000000"),
            (with(&pool("queue = 1000001\n"), ""), "upstream[0].queue", "from 0 to 1000000"),
            (with(&pool("queue_timeout = \"0s\"\n"), ""), "upstream[0].queue_timeout", "greater than zero"),
            (with(&format!("[http2]\nmax_proxied_streams = 0\n{POOL}"), ""), "http2.max_proxied_streams", "from 1 to 10000"),
            (with(&pool("total_timeout = \"9999999years\"\n"), ""), "upstream[0].total_timeout", "at most 365 days"),
            (with(&pool("[upstream.health_check]\ninterval = \"400days\"\n"), ""), "upstream[0].health_check.interval", "at most 365 days"),
            (with(&format!("{POOL}[upstream.health_check]\npath = \"health\"\n"), ""), "upstream[0].health_check.path", "starting with '/'"),
            (with(&format!("{POOL}[upstream.health_check]\nexpect_status = [700]\n"), ""), "upstream[0].health_check.expect_status", "100 to 599"),
            (with(POOL, "[[listener.route]]\nupstream = \"nope\"\n"), "listener[0].route[0].upstream", "expected one of: app"),
            (with(POOL, "[[listener.route]]\n"), "listener[0].route[0].upstream", "exactly one"),
            (with(POOL, "[[listener.route]]\npath = \"api\"\nupstream = \"app\"\n"), "listener[0].route[0].path", "starting with '/'"),
            (with(POOL, "[[listener.route]]\npath = \"/a/../b\"\nupstream = \"app\"\n"), "listener[0].route[0].path", "'..' segment"),
            (with(POOL, "[[listener.route]]\npath = \"/%61pi\"\nupstream = \"app\"\n"), "listener[0].route[0].path", "unreserved"),
            (with(POOL, "[[listener.route]]\npath = \"/a;b\"\nupstream = \"app\"\n"), "listener[0].route[0].path", "';'"),
            (with(POOL, "[[listener.route]]\npath = \"/a%2Fb\"\nupstream = \"app\"\n"), "listener[0].route[0].path", "%2F"),
            (with(POOL, "[[listener.route]]\nhost = \"a b\"\nupstream = \"app\"\n"), "listener[0].route[0].host", "host name"),
            (with(POOL, "[[listener.route]]\nroot = \"missing\"\n"), "listener[0].route[0].root", "existing directory"),
            (with(POOL, "[[listener.route]]\nupstream = \"app\"\n[[listener.route]]\nroot = \"other\"\n"), "listener[0].route[1].path", "already routes"),
            (with(POOL, "[[listener.route]]\nupstream = \"app\"\nweight = 2\n"), "listener[0].route[0].weight", "unknown field"),
        ];
        for (text, key, needle) in cases {
            let e = load_text(text).unwrap_err();
            assert!(e.origin.ends_with("tlsgate.toml"), "{e}");
            assert_eq!(&e.key, key, "{text:?} gave {e}");
            assert!(
                e.to_string().contains(needle),
                "{text:?} gave {e}, wanted {needle:?}"
            );
        }
    }
}
