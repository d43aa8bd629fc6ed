//! The TOML file as written by an operator: documented serde structs with
//! defaults. Nothing here is trusted yet; [`crate::validate`] turns it into
//! the typed [`crate::Config`]. Every key is documented in `docs/config.md`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    /// Process-wide settings.
    pub server: ServerSection,
    /// The plain-HTTP admin listener (metrics, health).
    pub admin: AdminSection,
    /// Timeouts and size limits.
    pub limits: LimitsSection,
    /// TLS protocol policy shared by all listeners.
    pub tls: TlsSection,
    /// Access log.
    pub access_log: AccessLogSection,
    /// HTTPS listeners; `[[listener]]` tables.
    #[serde(rename = "listener")]
    pub listeners: Vec<ListenerSection>,
    /// SYN cookies answered from XDP (SynGate); off without the table.
    pub xdp: Option<XdpSection>,
    /// HTTP/2 limits, for every listener that offers `h2`.
    pub http2: Http2Section,
    /// How static files are opened: the open-file cache.
    pub files: FilesSection,
    /// Upstream pools for proxied routes; `[[upstream]]` tables.
    #[serde(rename = "upstream")]
    pub upstreams: Vec<crate::proxy::UpstreamSection>,
}

/// `[server]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    /// Value of the `Server` response header; empty omits the header.
    pub server_header: String,
    /// How long SIGTERM waits for in-flight requests before exiting.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Listen backlog of every listening socket.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT`: connections reach tlsgate once their first bytes
    /// are in, or after about this long; "0s" hands them over at once.
    #[serde(with = "humantime_serde")]
    pub defer_accept: Duration,
    /// User the network-facing process runs as after binding; "" = stay.
    pub user: String,
    /// Group it runs as; "" = the user's primary group.
    pub group: String,
    /// Let the serving process dump core (and be read by a debugger of
    /// its user); the key server never does.
    pub core_dumps: bool,
    /// Keep private keys in a separate key process (false: in-process).
    pub key_isolation: bool,
    /// How long a handshake waits for the key process to sign.
    #[serde(with = "humantime_serde")]
    pub key_timeout: Duration,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            workers: 0,
            server_header: "tlsgate".into(),
            shutdown_timeout: Duration::from_secs(10),
            backlog: 1024,
            defer_accept: Duration::from_secs(1),
            user: String::new(),
            group: String::new(),
            core_dumps: false,
            key_isolation: true,
            key_timeout: Duration::from_secs(2),
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    /// Address of the metrics/health listener; empty disables it.
    pub listen: String,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9090".into(),
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Time allowed from accept to the end of the TLS handshake.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Time allowed to receive a complete request head once its first byte arrived
    /// (for the first request: from the end of the handshake).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long an idle keep-alive connection waits for the next request.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// How long a write may wait for the client to read (slow-read defence).
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Time allowed to receive a request body.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Largest request head (request line and headers) in bytes.
    pub max_header_bytes: usize,
    /// Longest request target in bytes.
    pub max_uri_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Largest request body accepted (and discarded, for static files).
    pub max_body_bytes: u64,
    /// Open client connections over all listeners and workers.
    pub max_connections: usize,
    /// Open client connections from one source address.
    pub max_connections_per_ip: usize,
    /// Requests served on one connection before it is closed.
    pub max_requests_per_connection: u64,
    /// New handshakes per second allowed from one source (token refill rate); 0 = no rate limit.
    pub handshake_rate_per_source: u32,
    /// Handshakes one source may start at once after being quiet (token bucket size).
    pub handshake_burst_per_source: u32,
    /// Handshakes in progress from one source; 0 = no limit.
    pub max_handshakes_per_source: usize,
    /// Handshakes in progress over all listeners and workers; 0 = no limit.
    pub max_handshakes_in_progress: usize,
    /// IPv4 sources sharing this many leading bits count as one source.
    pub source_prefix_v4: u8,
    /// IPv6 sources sharing this many leading bits count as one source.
    pub source_prefix_v6: u8,
    /// Sources whose handshake state is remembered; idle ones are evicted first.
    pub max_tracked_sources: usize,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_headers: 100,
            max_body_bytes: 1024 * 1024,
            max_connections: 20_000,
            max_connections_per_ip: 512,
            max_requests_per_connection: 10_000,
            handshake_rate_per_source: 100,
            handshake_burst_per_source: 500,
            max_handshakes_per_source: 128,
            max_handshakes_in_progress: 5_000,
            source_prefix_v4: 32,
            source_prefix_v6: 64,
            max_tracked_sources: 100_000,
        }
    }
}

/// `[tls]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// Protocol versions offered: any of "1.2", "1.3".
    pub versions: Vec<String>,
    /// Cipher suites in server preference order (IANA names); empty = all supported.
    pub cipher_suites: Vec<String>,
    /// Key-exchange groups in preference order; empty = all supported.
    pub key_exchange_groups: Vec<String>,
    /// What a client gets whose SNI matches no certificate (or who sends none):
    /// "default" (the default certificate) or "reject" (alert unrecognized_name).
    pub unknown_sni: String,
    /// Entries in the TLS 1.2 session-ID cache; 0 disables it.
    pub session_cache_size: usize,
    /// Stateless session tickets (TLS 1.2 RFC 5077, TLS 1.3 PSK with ECDHE).
    pub session_tickets: bool,
    /// TLS 1.3 tickets sent after each handshake.
    pub tls13_tickets: usize,
    /// How long a ticket resumes; sealed inside the ticket.
    #[serde(with = "humantime_serde")]
    pub ticket_lifetime: Duration,
    /// How often keys made in memory are replaced (no `ticket_key_file`).
    #[serde(with = "humantime_serde")]
    pub ticket_rotation: Duration,
    /// Ticket keys shared by a fleet; none = keys made in memory.
    pub ticket_key_file: Option<PathBuf>,
}

impl Default for TlsSection {
    fn default() -> Self {
        Self {
            versions: vec!["1.2".into(), "1.3".into()],
            cipher_suites: Vec::new(),
            key_exchange_groups: Vec::new(),
            unknown_sni: "default".into(),
            session_cache_size: 20_000,
            session_tickets: true,
            tls13_tickets: 2,
            ticket_lifetime: Duration::from_secs(12 * 3600),
            ticket_rotation: Duration::from_secs(3600),
            ticket_key_file: None,
        }
    }
}

/// `[access_log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogSection {
    /// "stdout", "off", or a file path (appended to).
    pub target: String,
    /// "combined" or "json".
    pub format: String,
}

impl Default for AccessLogSection {
    fn default() -> Self {
        Self {
            target: "stdout".into(),
            format: "combined".into(),
        }
    }
}

/// `[[listener]]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerSection {
    /// Socket addresses, e.g. ["0.0.0.0:443", "[::]:443"].
    pub listen: Vec<String>,
    /// Document root served by this listener.
    pub root: Option<PathBuf>,
    /// Files tried, in order, for a request that names a directory.
    pub index: Option<Vec<String>>,
    /// Serve files reached through symlinks that lead out of the root.
    pub allow_symlinks_outside_root: bool,
    /// Make a self-signed ECDSA P-256 certificate for localhost at start
    /// when no `[[listener.certificate]]` is given.
    pub self_signed: bool,
    /// Client certificates for this listener's names: "none", "optional"
    /// or "required" (mutual TLS); a certificate entry may override it.
    pub client_auth: Option<String>,
    /// PEM bundle of the CAs that client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    /// Kernel TLS (kTLS): "auto" moves a connection's record layer into
    /// the kernel at its first response body of `offload_threshold` bytes
    /// or more (then files go out with sendfile), "always" right after the
    /// handshake, "never" keeps it in user space. Default "auto"; without
    /// kTLS in the kernel everything stays in user space.
    pub offload: Option<String>,
    /// Body size in bytes from which `offload = "auto"` switches; default
    /// 65536 (below it user-space TLS is cheaper).
    pub offload_threshold: Option<u64>,
    /// Let the kernel encrypt files straight from the page cache
    /// (`TLS_TX_ZEROCOPY_RO`). Only for roots whose files never change
    /// while served: a retransmitted record would carry other bytes.
    pub offload_zerocopy: bool,
    /// Application protocols offered in ALPN, in the server's order of
    /// preference: "h2" and/or "http/1.1"; default ["h2", "http/1.1"]. A
    /// client that sends no ALPN gets HTTP/1.1.
    pub alpn: Option<Vec<String>>,
    /// Certificates chosen by SNI.
    #[serde(rename = "certificate")]
    pub certificates: Vec<CertificateSection>,
    /// Routes by Host, SNI and path prefix to a pool or another root;
    /// requests no route matches are served from `root`.
    #[serde(rename = "route")]
    pub routes: Vec<crate::proxy::RouteSection>,
    /// Load balancers trusted to begin each connection with a PROXY
    /// protocol header (v1 or v2) naming the client: addresses or networks,
    /// e.g. ["10.0.0.0/8", "192.0.2.7"]. A connection from one of them
    /// must begin with the header; from anyone else it must not (a header
    /// there is not trusted, and the handshake fails on it). Default: none.
    pub proxy_protocol_from: Vec<String>,
    /// Fields of [`crate::PASSABLE_FIELDS`] (client address, scheme and
    /// prefix overrides) that proxied requests keep as the client sent
    /// them, for a listener only a trusted CDN can reach, e.g.
    /// ["CF-Connecting-IP"]. Default: none, every one is dropped.
    pub pass_client_headers: Vec<String>,
}

/// `[[listener.certificate]]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct CertificateSection {
    /// PEM file with the certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file with the private key (PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// Server names (exact or `*.example.com`); default: the certificate's DNS SANs.
    pub names: Option<Vec<String>>,
    /// Serve this certificate to clients whose SNI matches nothing.
    pub default: bool,
    /// Client certificates under this entry's names; default: the listener's.
    pub client_auth: Option<String>,
    /// CA bundle for this entry's client certificates; default: the listener's.
    pub client_ca: Option<PathBuf>,
}

/// `[http2]`: limits of HTTP/2 connections (RFC 9113), shared by every
/// listener that offers `h2`. The timeouts of `[limits]` apply too:
/// `header_timeout` to the connection preface, `send_timeout` to every
/// wait for a slow reader (per stream and per connection).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Section {
    /// Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// Receive window of each stream announced to clients (request bodies).
    pub initial_window_size: u32,
    /// Receive window of the whole connection.
    pub initial_connection_window_size: u32,
    /// Largest frame payload accepted (SETTINGS_MAX_FRAME_SIZE).
    pub max_frame_size: u32,
    /// Largest decoded header list of a request (SETTINGS_MAX_HEADER_LIST_SIZE).
    pub max_header_list_size: u32,
    /// HEADERS plus CONTINUATION frames allowed in one header block.
    pub max_header_frames: u32,
    /// Response bytes buffered per stream before waiting for the client.
    pub max_send_buffer_size: u32,
    /// Response bytes read for a connection's streams and not yet taken
    /// by its TLS connection, all streams together.
    pub max_connection_send_buffer: u32,
    /// The same over all HTTP/2 connections of a worker thread.
    pub max_worker_send_buffer: u64,
    /// Streams reset by the client before they were served, held at once.
    pub max_pending_accept_reset_streams: usize,
    /// Streams the server had to reset for the client's protocol errors.
    pub max_local_error_reset_streams: usize,
    /// Streams a client may reset (RST_STREAM) per second, per connection.
    pub resets_per_second: u32,
    /// Resets allowed at once after a quiet period.
    pub reset_burst: u32,
    /// PING, SETTINGS, PRIORITY, WINDOW_UPDATE and empty DATA frames a
    /// client may send per second, per connection (plus one per KiB sent).
    pub control_frames_per_second: u32,
    /// Such frames allowed at once after a quiet period.
    pub control_frame_burst: u32,
    /// A connection with no open stream for this long is closed (GOAWAY).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Streams of one connection forwarded to upstream pools at once;
    /// more wait for one of them to end.
    pub max_proxied_streams: u32,
}

impl Default for Http2Section {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 128,
            initial_window_size: 65_535,
            initial_connection_window_size: 1 << 20,
            max_frame_size: 16_384,
            max_header_list_size: 32 * 1024,
            max_header_frames: 4,
            max_send_buffer_size: 64 * 1024,
            max_connection_send_buffer: 256 * 1024,
            max_worker_send_buffer: 64 << 20,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 128,
            resets_per_second: 100,
            reset_burst: 400,
            control_frames_per_second: 1000,
            control_frame_burst: 2000,
            idle_timeout: Duration::from_secs(60),
            max_proxied_streams: 32,
        }
    }
}

/// `[files]`: the open-file cache of every document root (like nginx's
/// `open_file_cache`): descriptors, metadata and validators of recently
/// served files, kept per worker thread.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesSection {
    /// Files kept open per worker thread and document root; 0 turns the
    /// cache off. Each is one file descriptor.
    pub open_file_cache: usize,
    /// How long a cached file is served before it is looked up again (a
    /// file replaced or deleted is seen by then).
    #[serde(with = "humantime_serde")]
    pub open_file_cache_valid: Duration,
    /// Files up to this many bytes are kept in memory with their entry
    /// and answered without a read; 0 keeps no bytes.
    pub open_file_cache_content_max: u64,
}

impl Default for FilesSection {
    fn default() -> Self {
        Self {
            open_file_cache: 1024,
            open_file_cache_valid: Duration::from_secs(2),
            open_file_cache_content_max: 4096,
        }
    }
}

/// `[xdp]`: SYN cookies answered from XDP for the TLS listeners' ports
/// (SynGate; the crate tlsgate-xdp does the work).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct XdpSection {
    /// The interface the program attaches to (required).
    pub interface: String,
    /// "auto" (flood mode only under pressure), "always" or "off".
    pub mode: String,
    /// Protected ports; empty: the ports of every `[[listener]]`.
    pub ports: Vec<u16>,
    /// auto: peacetime probe interval.
    #[serde(with = "humantime_serde")]
    pub t1: Duration,
    /// auto: flood mode ends after this long without a cookie.
    #[serde(with = "humantime_serde")]
    pub t2: Duration,
    /// One in this many SYNs answered in flood mode counts toward the top
    /// sources (a power of two).
    pub top_sample: u32,
    /// Serve unprotected (logged loudly) when the program cannot attach,
    /// instead of refusing to start.
    pub optional: bool,
    /// Set the sysctls the mode needs at start and restore them at exit,
    /// instead of refusing to start when they differ.
    pub manage_sysctls: bool,
    /// Generic (skb) XDP instead of the driver's native mode.
    pub generic: bool,
}

impl Default for XdpSection {
    fn default() -> Self {
        Self {
            interface: String::new(),
            mode: "auto".into(),
            ports: Vec::new(),
            t1: Duration::from_secs(1),
            t2: Duration::from_secs(10),
            top_sample: 16,
            optional: false,
            manage_sysctls: false,
            generic: false,
        }
    }
}
