//! Configuration of tlsgate: the TOML file ([`file`]), command-line
//! overrides, and validation into the typed [`Config`] the server runs on.
//!
//! Parse once, validate once: everything the server reads from here is
//! already checked, so a broken file stops the start (or a reload) with a
//! [`ConfigError`] that names the file, the key and what was expected.
//! Certificates and keys are only checked for existence here; their
//! contents are parsed by `tlsgate-tls`, which reports errors under the
//! same key names.
#![forbid(unsafe_code)]

pub mod file;
mod handshake;
mod http2;
pub mod proxy;
mod validate;
mod xdp;

pub use http2::{Alpn, FrameRate, Http2};

pub use proxy::{
    Balance, HashKey, HealthCheck, ProxyProtocol, Route, RouteTarget, Upstream, UpstreamServer,
    UpstreamTls,
};
pub use xdp::{Xdp, XdpMode};

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use validate::{load, Overrides};

/// A configuration problem: where, which key, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, or `command line` for flags, or `built-in defaults`.
    pub origin: String,
    /// Dotted key path, e.g. `listener[0].certificate[1].key`.
    pub key: String,
    /// What was wrong and what was expected.
    pub problem: String,
}

impl ConfigError {
    /// Builds an error for `key` in `origin`.
    pub fn new(
        origin: impl Into<String>,
        key: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Self {
            origin: origin.into(),
            key: key.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.origin, self.problem)
        } else {
            write!(f, "{}: key `{}`: {}", self.origin, self.key, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it came from (file path, or `built-in defaults`), for messages.
    pub origin: String,
    /// Worker threads (already resolved: never 0).
    pub workers: usize,
    /// `Server` header value, if any.
    pub server_header: Option<String>,
    /// Grace period for in-flight requests at shutdown.
    pub shutdown_timeout: Duration,
    /// Listen backlog.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT` of every listener, whole seconds (zero: off).
    pub defer_accept: Duration,
    /// Privileges kept by the network-facing process.
    pub privileges: Privileges,
    /// Where private keys live and sign.
    pub keys: KeyPolicy,
    /// Admin (metrics) listener address.
    pub admin: Option<SocketAddr>,
    /// Timeouts and size limits.
    pub limits: Limits,
    /// TLS protocol policy.
    pub tls: TlsPolicy,
    /// Access log destination and format.
    pub access_log: AccessLog,
    /// HTTPS listeners (at least one).
    pub listeners: Vec<Listener>,
    /// XDP SynGate, when `[xdp]` is present.
    pub xdp: Option<Xdp>,
    /// HTTP/2 limits.
    pub http2: Http2,
    /// The open-file cache of the document roots; `None`: off.
    pub open_file_cache: Option<OpenFileCache>,
    /// Upstream pools (`[[upstream]]`), referred to by routes by index.
    pub upstreams: Vec<Upstream>,
}

/// The validated `[files]` open-file cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileCache {
    /// Files kept open per worker thread and document root (at least 1).
    pub entries: std::num::NonZeroUsize,
    /// How long an entry is trusted after its file was opened.
    pub valid: Duration,
    /// Files up to this size keep their bytes with the entry (0: none).
    pub content_max: u64,
}

/// Whom the network-facing process runs as once its sockets are bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Privileges {
    /// `server.user` (a name or a numeric id), if any.
    pub user: Option<String>,
    /// `server.group` (a name or a numeric id), if any.
    pub group: Option<String>,
    /// `server.core_dumps`: the serving process stays dumpable (core
    /// files, same-user debuggers) instead of being made not dumpable.
    pub core_dumps: bool,
}

/// `server.key_isolation` and `server.key_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPolicy {
    /// Private keys live in a separate key process.
    pub isolation: bool,
    /// Longest wait for one signature from the key process.
    pub timeout: Duration,
}

/// Timeouts and size limits (see [`file::LimitsSection`] for meanings).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each field mirrors the documented file key of the same name.
pub struct Limits {
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub send_timeout: Duration,
    pub body_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: u64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub max_requests_per_connection: u64,
    /// The handshake flood limits (`handshake_*`, `*_handshakes_*`, `source_prefix_*`, `max_tracked_sources`).
    pub handshake: HandshakeLimits,
}

/// Limits on TLS handshakes, checked at accept before any TLS work (see
/// [`file::LimitsSection`] for meanings). `None` means the limit is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Token bucket of each source: refill rate per second, size.
    pub rate_per_source: Option<HandshakeRate>,
    /// Handshakes in progress from one source.
    pub max_per_source: Option<usize>,
    /// Handshakes in progress overall.
    pub max_in_progress: Option<usize>,
    /// Prefix length (1..=32) that groups IPv4 sources.
    pub source_prefix_v4: u8,
    /// Prefix length (1..=128) that groups IPv6 sources.
    pub source_prefix_v6: u8,
    /// Bound on the per-source state kept in memory.
    pub max_tracked_sources: usize,
}

/// A token bucket: `per_second` tokens added each second, at most `burst` kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeRate {
    /// Refill rate (at least 1).
    pub per_second: u32,
    /// Bucket size (at least 1).
    pub burst: u32,
}

/// A TLS protocol version tlsgate offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2
    Tls12,
    /// TLS 1.3
    Tls13,
}

/// Cipher suites tlsgate supports (AEAD only; TLS 1.2 with ECDHE only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // IANA names say it all.
pub enum CipherSuite {
    Tls13Aes128GcmSha256,
    Tls13Aes256GcmSha384,
    Tls13Chacha20Poly1305Sha256,
    EcdheEcdsaAes128GcmSha256,
    EcdheEcdsaAes256GcmSha384,
    EcdheEcdsaChacha20Poly1305Sha256,
    EcdheRsaAes128GcmSha256,
    EcdheRsaAes256GcmSha384,
    EcdheRsaChacha20Poly1305Sha256,
}

impl CipherSuite {
    /// Every suite with its IANA name, in tlsgate's default preference order.
    pub const ALL: [(&'static str, CipherSuite); 9] = [
        ("TLS13_AES_128_GCM_SHA256", Self::Tls13Aes128GcmSha256),
        ("TLS13_AES_256_GCM_SHA384", Self::Tls13Aes256GcmSha384),
        (
            "TLS13_CHACHA20_POLY1305_SHA256",
            Self::Tls13Chacha20Poly1305Sha256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            Self::EcdheEcdsaAes128GcmSha256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            Self::EcdheEcdsaAes256GcmSha384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            Self::EcdheEcdsaChacha20Poly1305Sha256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            Self::EcdheRsaAes128GcmSha256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            Self::EcdheRsaAes256GcmSha384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            Self::EcdheRsaChacha20Poly1305Sha256,
        ),
    ];
}

/// Key-exchange groups tlsgate supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // Names say it all.
pub enum KxGroup {
    X25519Mlkem768,
    X25519,
    Secp256r1,
    Secp384r1,
}

impl KxGroup {
    /// Every group with its IANA name, in tlsgate's default preference order.
    pub const ALL: [(&'static str, KxGroup); 4] = [
        ("X25519MLKEM768", Self::X25519Mlkem768),
        ("X25519", Self::X25519),
        ("secp256r1", Self::Secp256r1),
        ("secp384r1", Self::Secp384r1),
    ];
}

/// What to do with a ClientHello whose SNI matches no certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSni {
    /// Answer with the default certificate.
    UseDefault,
    /// Refuse with the `unrecognized_name` alert.
    Reject,
}

/// TLS policy shared by all listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPolicy {
    /// Versions offered (non-empty).
    pub versions: Vec<TlsVersion>,
    /// Suites in server preference order (non-empty).
    pub cipher_suites: Vec<CipherSuite>,
    /// Groups in server preference order (non-empty).
    pub kx_groups: Vec<KxGroup>,
    /// Unknown or missing SNI handling.
    pub unknown_sni: UnknownSni,
    /// TLS 1.2 session-ID cache entries.
    pub session_cache_size: usize,
    /// Session tickets.
    pub tickets: SessionTickets,
}

/// Session ticket policy (see [`file::TlsSection`] for meanings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTickets {
    /// Tickets are issued and accepted.
    pub enabled: bool,
    /// TLS 1.3 tickets sent per handshake.
    pub tls13_count: usize,
    /// Ticket lifetime (whole seconds, 1 s to 7 days).
    pub lifetime: Duration,
    /// Rotation period of keys made in memory.
    pub rotation: Duration,
    /// Shared key file; `None` = keys made in memory.
    pub key_file: Option<PathBuf>,
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// Standard output.
    Stdout,
    /// No access log.
    Off,
    /// Appended to this file.
    File(PathBuf),
}

/// Access log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// NCSA combined log format.
    Combined,
    /// One JSON object per line.
    Json,
}

/// Access log settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// Destination.
    pub target: LogTarget,
    /// Line format.
    pub format: LogFormat,
}

/// Certificate files for one listener entry, with the key path used in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// Config key of this entry, e.g. `listener[0].certificate[1]`.
    pub key_path: String,
    /// Chain PEM.
    pub cert: PathBuf,
    /// Private key PEM.
    pub key: PathBuf,
    /// Explicit names, or `None` to take the certificate's DNS SANs.
    pub names: Option<Vec<String>>,
    /// Chosen for unknown SNI.
    pub default: bool,
    /// Client certificates asked of clients under these names.
    pub client_auth: ClientAuth,
}

/// Whether clients must present a certificate (mutual TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientAuthMode {
    /// No certificate is asked for.
    None,
    /// Asked for; a client without one is served, one with a bad one refused.
    Optional,
    /// A certificate chaining to the CA bundle is required.
    Required,
}

impl ClientAuthMode {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Optional => "optional",
            Self::Required => "required",
        }
    }
}

/// Client certificate policy of one server name (or a whole listener).
/// Two are equal when they ask the same of clients (mode and bundle),
/// wherever in the file they were written.
#[derive(Debug, Clone, Eq)]
pub struct ClientAuth {
    /// None, optional or required.
    pub mode: ClientAuthMode,
    /// CA bundle (PEM); always set unless the mode is `None`.
    pub ca: Option<PathBuf>,
    /// Config key of `client_ca`, for messages about the bundle's contents.
    pub ca_key: String,
}

impl PartialEq for ClientAuth {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode && self.ca == other.ca
    }
}

impl ClientAuth {
    /// No client certificates.
    pub fn none() -> Self {
        Self {
            mode: ClientAuthMode::None,
            ca: None,
            ca_key: String::new(),
        }
    }
}

/// Where a listener's certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Certificates {
    /// Generated at start for localhost, 127.0.0.1 and ::1.
    SelfSigned,
    /// Loaded from files.
    Files(Vec<CertificateFiles>),
}

/// When a connection's record layer moves into the kernel (kTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadPolicy {
    /// At the first response body of at least the threshold.
    Auto,
    /// Right after the handshake.
    Always,
    /// Never: user-space TLS only.
    Never,
}

impl OffloadPolicy {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        }
    }
}

/// A listener's kernel TLS settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offload {
    /// When to switch.
    pub policy: OffloadPolicy,
    /// Body bytes from which `Auto` switches.
    pub threshold: u64,
    /// `TLS_TX_ZEROCOPY_RO` for sendfile.
    pub zerocopy: bool,
}

impl Default for Offload {
    fn default() -> Self {
        Self {
            policy: OffloadPolicy::Auto,
            threshold: 64 * 1024,
            zerocopy: false,
        }
    }
}

/// One HTTPS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Config key, e.g. `listener[0]`, for messages.
    pub key_path: String,
    /// Addresses (port 0 = any free port, the same for every worker).
    pub addrs: Vec<SocketAddr>,
    /// Document root (an existing directory).
    pub root: PathBuf,
    /// Index file names.
    pub index: Vec<String>,
    /// Serve symlinks that lead out of the root.
    pub allow_symlinks_outside_root: bool,
    /// Client certificate policy of the listener (its self-signed
    /// certificate, and certificate entries that set none of their own).
    pub client_auth: ClientAuth,
    /// Certificates.
    pub certificates: Certificates,
    /// Kernel TLS.
    pub offload: Offload,
    /// ALPN protocols in the server's order of preference (non-empty).
    pub alpn: Vec<Alpn>,
    /// Routes to pools or other roots (`[[listener.route]]`), in file order.
    pub routes: Vec<Route>,
    /// Sources whose connections begin with a PROXY protocol header
    /// (`proxy_protocol_from`); empty: none.
    pub proxy_protocol_from: TrustedProxies,
    /// Fields a proxied request keeps from the client (`pass_client_headers`).
    pub pass_client_headers: PassedFields,
}

/// Request fields that backends read as the client's address, the scheme
/// or the path prefix the client used (Rack, Spring, Express, PHP
/// frameworks; CDNs set some of them), lower case. The proxy drops the
/// client's copies, in either `-` or `_` spelling, so that no client can
/// speak for tlsgate; a listener's `pass_client_headers` keeps some of
/// them (their `-` spelling only) where a trusted CDN sets them.
pub const PASSABLE_FIELDS: &[&str] = &[
    "x-forwarded-scheme",
    "x-forwarded-ssl",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "true-client-ip",
    "x-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
];

/// Request fields always dropped, which no listener can pass: the
/// proxy's own forwarding fields (it sets them), and those that make a
/// backend serve another path than the one routed (IIS URL Rewrite,
/// Laminas, old Symfony: CVE-2018-14773).
pub const DROPPED_FIELDS: &[&str] = &[
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "forwarded",
    "x-forwarded-client-cert",
    "x-original-url",
    "x-rewrite-url",
];

/// A set of [`PASSABLE_FIELDS`], by their place in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassedFields(u32);

impl PassedFields {
    /// Parses field names (any case); the error names the entry and why.
    pub fn parse(names: &[String]) -> Result<Self, String> {
        let mut set = 0u32;
        for n in names {
            let lower = n.to_ascii_lowercase();
            if let Some(i) = PASSABLE_FIELDS.iter().position(|f| *f == lower) {
                set |= 1 << i;
            } else if DROPPED_FIELDS.contains(&lower.as_str()) {
                return Err(format!(
                    "{n:?} is always dropped from the client: tlsgate sets it, or it would lead a request around its route"
                ));
            } else {
                return Err(format!(
                    "{n:?} is not dropped, so it passes already; expected some of {}",
                    PASSABLE_FIELDS.join(", ")
                ));
            }
        }
        Ok(Self(set))
    }

    /// Whether the field at place `i` of [`PASSABLE_FIELDS`] passes.
    pub fn passes(self, i: usize) -> bool {
        u32::try_from(i)
            .ok()
            .and_then(|i| self.0.checked_shr(i))
            .is_some_and(|bits| bits & 1 == 1)
    }
}

/// `::ffff:10.0.0.0/104` as `10.0.0.0/8`: peers are matched as IPv4.
fn as_ipv4_if_mapped(net: ipnet::IpNet) -> ipnet::IpNet {
    match net {
        ipnet::IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(ipnet::IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// Networks trusted to send a PROXY protocol header, host bits cleared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

impl std::fmt::Display for TrustedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, net) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{net}")?;
        }
        Ok(())
    }
}

impl TrustedProxies {
    /// Parses `"10.0.0.0/8"` or `"192.0.2.7"` entries; the error names
    /// the entry and what was expected.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut nets = Vec::with_capacity(entries.len());
        for e in entries {
            let net = match e.parse::<ipnet::IpNet>() {
                Ok(n) => n.trunc(),
                Err(_) => match e.parse::<std::net::IpAddr>() {
                    Ok(ip) => ipnet::IpNet::from(ip),
                    Err(_) => {
                        return Err(format!(
                            "{e:?} is not an address or network; expected e.g. \"10.0.0.0/8\", \"2001:db8::/32\" or \"192.0.2.7\""
                        ))
                    }
                },
            };
            if net.prefix_len() == 0 {
                return Err(format!(
                    "{e:?} trusts every address, so any client could claim any address; expected the balancers' own addresses or networks"
                ));
            }
            nets.push(as_ipv4_if_mapped(net));
        }
        Ok(Self(nets))
    }

    /// True when no source is trusted (the default).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` (an IPv4-mapped IPv6 address counts as IPv4) is trusted.
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|n| n.contains(&ip))
    }
}

/// The most a config file may hold. Real ones are a few KiB; the cap
/// stops `--config /dev/zero` or a huge file named by mistake from
/// filling memory (it got a process OOM-killed at 24 GB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Reads a config file's text, for messages that need it. Takes a regular
/// file of at most [`MAX_CONFIG_BYTES`], checked before it is opened (a
/// FIFO would wait for a writer) and again on the open file. A pipe could
/// not serve anyway: the key process and every reload read the file again.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let fail = |problem: String| ConfigError::new(path.display().to_string(), "", problem);
    let limit = MAX_CONFIG_BYTES >> 20;
    let regular = |meta: std::fs::Metadata| {
        if meta.is_file() {
            Ok(())
        } else {
            Err(fail(format!(
                "is {}; expected a regular file of at most {limit} MiB",
                file_kind(&meta.file_type())
            )))
        }
    };
    regular(std::fs::metadata(path).map_err(|e| fail(format!("cannot read the file: {e}")))?)?;
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read the file: {e}")))?;
    // Swapped since the check above: refused all the same.
    regular(
        file.metadata()
            .map_err(|e| fail(format!("cannot read the file: {e}")))?,
    )?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read the file: {e}")))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(fail(format!(
            "larger than {limit} MiB; expected a configuration file of at most {limit} MiB"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        fail("cannot read the file: it is not UTF-8; expected UTF-8 text (TOML)".into())
    })
}

/// What a file that is not regular is, for messages (also the ticket key
/// file's).
pub fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}
