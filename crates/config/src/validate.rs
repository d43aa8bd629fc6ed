//! From [`ConfigFile`] (plus command-line overrides) to [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::file::{CertificateSection, ConfigFile, ListenerSection};
use crate::{
    AccessLog, CertificateFiles, Certificates, CipherSuite, ClientAuth, ClientAuthMode, Config,
    ConfigError, KeyPolicy, KxGroup, Limits, Listener, LogFormat, LogTarget, Offload,
    OffloadPolicy, Privileges, SessionTickets, TlsPolicy, TlsVersion, UnknownSni,
};

const FLAGS: &str = "command line";
const BUILTIN: &str = "built-in defaults";

/// Command-line flags that override the file (or the built-in defaults).
///
/// `listen`, `root`, `cert` and `key` apply to the first listener; when the
/// file has none, they create it.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen` (repeatable): replaces the first listener's addresses.
    pub listen: Vec<String>,
    /// `--root`: the first listener's document root.
    pub root: Option<PathBuf>,
    /// `--cert`: certificate chain PEM for the first listener (with `--key`).
    pub cert: Option<PathBuf>,
    /// `--key`: private key PEM for the first listener (with `--cert`).
    pub key: Option<PathBuf>,
    /// `--admin`: admin listener address ("" disables).
    pub admin: Option<String>,
    /// `--workers`: worker threads.
    pub workers: Option<usize>,
}

/// Loads and validates the configuration.
///
/// `path` is the config file, or `None` for the built-in defaults: one
/// listener on 127.0.0.1:8443 serving `default_root` with a self-signed
/// certificate.
pub fn load(
    path: Option<&Path>,
    overrides: &Overrides,
    default_root: &Path,
) -> Result<Config, ConfigError> {
    let (origin, base_dir, mut file) = match path {
        Some(p) => {
            let origin = p.display().to_string();
            let text = crate::read_file(p)?;
            let file = parse_toml(&origin, &text)?;
            let base = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (origin, base, file)
        }
        None => {
            let mut file = ConfigFile::default();
            file.listeners.push(ListenerSection {
                listen: vec!["127.0.0.1:8443".into()],
                root: Some(default_root.to_path_buf()),
                self_signed: true,
                ..ListenerSection::default()
            });
            (BUILTIN.to_string(), PathBuf::new(), file)
        }
    };
    // Paths in the file are relative to the file; resolve them now so that
    // flag paths (relative to the working directory) are not mixed up.
    for l in &mut file.listeners {
        if let Some(root) = &mut l.root {
            *root = base_dir.join(&*root);
        }
        if let Some(ca) = &mut l.client_ca {
            *ca = base_dir.join(&*ca);
        }
        for c in &mut l.certificates {
            c.cert = base_dir.join(&c.cert);
            c.key = base_dir.join(&c.key);
            if let Some(ca) = &mut c.client_ca {
                *ca = base_dir.join(&*ca);
            }
        }
    }
    {
        let ConfigFile {
            upstreams,
            listeners,
            ..
        } = &mut file;
        let mut routes: Vec<_> = listeners
            .iter_mut()
            .flat_map(|l| l.routes.iter_mut())
            .collect();
        crate::proxy::resolve_paths(&base_dir, upstreams, &mut routes);
    }
    if let Some(k) = &mut file.tls.ticket_key_file {
        *k = base_dir.join(&*k);
    }
    if !file.access_log.target.is_empty()
        && !matches!(file.access_log.target.as_str(), "stdout" | "off")
    {
        file.access_log.target = base_dir.join(&file.access_log.target).display().to_string();
    }
    apply_overrides(&mut file, overrides)?;
    validate(&origin, file)
}

/// Parses TOML text, reporting the key path and line of the first problem.
pub(crate) fn parse_toml(origin: &str, text: &str) -> Result<ConfigFile, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        let start = inner.span().map(|s| s.start.min(text.len()));
        let at = start
            .map(|s| {
                let line = text.get(..s).unwrap_or(text).matches('\n').count() + 1;
                format!(" (line {line})")
            })
            .unwrap_or_default();
        // A value the TOML parser itself refuses (an integer past i64)
        // fails before serde walks any key: the key is read off the text.
        let key = match (key.as_str(), start) {
            (".", Some(s)) => key_at(text, s).unwrap_or_default(),
            (".", None) => String::new(),
            _ => key,
        };
        let mut problem = inner.message().trim().to_string();
        if problem.contains("number too large") {
            problem.push_str(&format!("; expected an integer of at most {}", i64::MAX));
        }
        ConfigError::new(origin, key, format!("{problem}{at}"))
    })
}

/// The dotted key (as serde names it: `listener[1].offload_threshold`) of
/// the `key = value` line holding byte `offset` of `text`: the last table
/// header before it, `[[array]]` headers counted, and the line's key.
/// `None` when the offset is not inside a `key = value` line.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = &text[line_start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let (name, _) = line.split_once('=')?;
    let name: Vec<&str> = name
        .split('.')
        .map(|p| p.trim().trim_matches('"'))
        .collect();
    if name.iter().any(|p| p.is_empty() || p.starts_with('[')) {
        return None;
    }
    // Header path with each [[array]] element's index: `listener[1].route[0]`.
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut table = String::new();
    for l in text[..line_start].lines().map(str::trim) {
        let (array, header) = if let Some(h) = l.strip_prefix("[[") {
            (true, h.split_once("]]").map(|(h, _)| h))
        } else if let Some(h) = l.strip_prefix('[') {
            (false, h.split_once(']').map(|(h, _)| h))
        } else {
            continue;
        };
        let Some(header) = header else { continue };
        let parts: Vec<&str> = header
            .split('.')
            .map(|p| p.trim().trim_matches('"'))
            .collect();
        let mut path = String::new();
        for (i, part) in parts.iter().enumerate() {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(part);
            let last = i + 1 == parts.len();
            if last && array {
                let n = match counts.iter_mut().find(|(p, _)| *p == path) {
                    Some((_, n)) => {
                        *n += 1;
                        *n
                    }
                    None => {
                        counts.push((path.clone(), 0));
                        0
                    }
                };
                // Nested arrays are counted under the indexed path
                // (`listener[1].route`): each element's start at 0.
                path.push_str(&format!("[{n}]"));
            } else if let Some((_, n)) = counts.iter().find(|(p, _)| *p == path) {
                path.push_str(&format!("[{n}]"));
            }
        }
        table = path;
    }
    let mut key = table;
    for part in name {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(part);
    }
    Some(key)
}

fn apply_overrides(file: &mut ConfigFile, o: &Overrides) -> Result<(), ConfigError> {
    if o.cert.is_some() != o.key.is_some() {
        return Err(ConfigError::new(
            FLAGS,
            if o.cert.is_some() { "--key" } else { "--cert" },
            "--cert and --key must be given together",
        ));
    }
    let touches_listener = !o.listen.is_empty() || o.root.is_some() || o.cert.is_some();
    if touches_listener && file.listeners.is_empty() {
        file.listeners.push(ListenerSection {
            listen: vec!["127.0.0.1:8443".into()],
            self_signed: true,
            ..ListenerSection::default()
        });
    }
    // A flag's value is checked here, under the flag's name: once copied
    // into the file's sections, an error would name the file and its key.
    let flags = Checker { origin: FLAGS };
    for a in &o.listen {
        flags.addr("--listen", a)?;
    }
    if let Some(root) = &o.root {
        if !root.is_dir() {
            return Err(flags.err(
                "--root",
                format!("expected an existing directory, found {}", root.display()),
            ));
        }
    }
    for (flag, p) in [("--cert", &o.cert), ("--key", &o.key)] {
        if let Some(p) = p
            .as_ref()
            .filter(|p| p.as_os_str().is_empty() || !p.is_file())
        {
            return Err(flags.err(
                flag,
                format!(
                    "expected a readable PEM file, found {:?}",
                    p.display().to_string()
                ),
            ));
        }
    }
    if let Some(admin) = o.admin.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
        flags.addr("--admin", admin)?;
    }
    if let Some(w) = o.workers {
        flags.within("--workers", w, 1, MAX_WORKERS)?;
    }
    if let Some(first) = file.listeners.first_mut() {
        if !o.listen.is_empty() {
            first.listen = o.listen.clone();
        }
        if let Some(root) = &o.root {
            first.root = Some(root.clone());
        }
        if let (Some(cert), Some(key)) = (&o.cert, &o.key) {
            first.certificates = vec![CertificateSection {
                cert: cert.clone(),
                key: key.clone(),
                names: None,
                default: true,
                ..CertificateSection::default()
            }];
            first.self_signed = false;
        }
    }
    if let Some(admin) = &o.admin {
        file.admin.listen = admin.clone();
    }
    if let Some(w) = o.workers {
        file.server.workers = w;
    }
    Ok(())
}

/// Most worker threads `server.workers` and `--workers` take.
const MAX_WORKERS: usize = 1024;

pub(crate) struct Checker<'a> {
    pub(crate) origin: &'a str,
}

impl Checker<'_> {
    pub(crate) fn err(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::new(self.origin, key, problem)
    }

    /// A header field value (RFC 9110 §5.5): no control bytes but HTAB. A
    /// CR or LF would end the header and begin one of the writer's choosing.
    pub(crate) fn header_value(&self, key: &str, value: &str) -> Result<String, ConfigError> {
        match value.bytes().find(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            Some(b) => Err(self.err(
                key,
                format!(
                    "byte 0x{b:02X} is not allowed in a header value; expected visible characters, spaces and tabs (RFC 9110 §5.5)"
                ),
            )),
            None => Ok(value.to_string()),
        }
    }

    /// A timeout or interval: more than zero, at most [`LONGEST_WAIT`].
    pub(crate) fn positive(&self, key: &str, d: Duration) -> Result<Duration, ConfigError> {
        if d.is_zero() {
            Err(self.err(key, "expected a duration greater than zero, e.g. \"10s\""))
        } else {
            self.not_too_long(key, d)
        }
    }

    /// A wait of at most [`LONGEST_WAIT`].
    pub(crate) fn not_too_long(&self, key: &str, d: Duration) -> Result<Duration, ConfigError> {
        if d > LONGEST_WAIT {
            Err(self.err(
                key,
                format!("expected at most 365 days, found {}s", d.as_secs()),
            ))
        } else {
            Ok(d)
        }
    }

    pub(crate) fn within<T: PartialOrd + std::fmt::Display + Copy>(
        &self,
        key: &str,
        v: T,
        lo: T,
        hi: T,
    ) -> Result<T, ConfigError> {
        if v < lo || v > hi {
            Err(self.err(
                key,
                format!("expected a number from {lo} to {hi}, found {v}"),
            ))
        } else {
            Ok(v)
        }
    }

    fn addr(&self, key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
        s.parse().map_err(|_| {
            self.err(
                key,
                format!("expected a socket address like \"127.0.0.1:8443\" or \"[::]:443\", found {s:?}"),
            )
        })
    }
}

fn validate(origin: &str, f: ConfigFile) -> Result<Config, ConfigError> {
    let c = Checker { origin };
    let workers = match f.server.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => c.within("server.workers", n, 1, MAX_WORKERS)?,
    };
    let backlog = c.within("server.backlog", f.server.backlog, 1, 65535)?;
    let server_header = c.header_value("server.server_header", &f.server.server_header)?;
    let defer_accept = f.server.defer_accept;
    if defer_accept > MAX_DEFER_ACCEPT || defer_accept.subsec_nanos() != 0 {
        return Err(c.err(
            "server.defer_accept",
            format!("expected whole seconds from \"0s\" (off) to \"60s\", found {defer_accept:?}"),
        ));
    }
    if f.server.user.trim().is_empty() && !f.server.group.trim().is_empty() {
        return Err(c.err(
            "server.group",
            "expected server.user too: a group alone would leave the process running as root",
        ));
    }
    let keys = KeyPolicy {
        isolation: f.server.key_isolation,
        timeout: c.positive("server.key_timeout", f.server.key_timeout)?,
    };
    let admin = match f.admin.listen.trim() {
        "" => None,
        s => Some(c.addr("admin.listen", s)?),
    };

    let l = &f.limits;
    let max_header_bytes =
        c.within("limits.max_header_bytes", l.max_header_bytes, 1024, 1 << 20)?;
    let limits = Limits {
        handshake_timeout: c.positive("limits.handshake_timeout", l.handshake_timeout)?,
        header_timeout: c.positive("limits.header_timeout", l.header_timeout)?,
        keepalive_timeout: c.positive("limits.keepalive_timeout", l.keepalive_timeout)?,
        send_timeout: c.positive("limits.send_timeout", l.send_timeout)?,
        body_timeout: c.positive("limits.body_timeout", l.body_timeout)?,
        max_header_bytes,
        max_uri_bytes: c.within(
            "limits.max_uri_bytes",
            l.max_uri_bytes,
            64,
            max_header_bytes,
        )?,
        max_headers: c.within("limits.max_headers", l.max_headers, 1, 10_000)?,
        max_body_bytes: l.max_body_bytes,
        max_connections: c.within("limits.max_connections", l.max_connections, 1, 10_000_000)?,
        max_connections_per_ip: c.within(
            "limits.max_connections_per_ip",
            l.max_connections_per_ip,
            1,
            10_000_000,
        )?,
        max_requests_per_connection: c.within(
            "limits.max_requests_per_connection",
            l.max_requests_per_connection,
            1,
            u64::MAX,
        )?,
        handshake: crate::handshake::validate(&c, l)?,
    };

    let http2 = crate::http2::validate(&c, &f.http2)?;
    let open_file_cache = validate_files(&c, &f.files)?;
    let tls = validate_tls(&c, &f)?;
    let access_log = AccessLog {
        target: match f.access_log.target.as_str() {
            "stdout" => LogTarget::Stdout,
            "off" | "" => LogTarget::Off,
            p => LogTarget::File(PathBuf::from(p)),
        },
        format: match f.access_log.format.as_str() {
            "combined" => LogFormat::Combined,
            "json" => LogFormat::Json,
            other => {
                return Err(c.err(
                    "access_log.format",
                    format!("expected \"combined\" or \"json\", found {other:?}"),
                ))
            }
        },
    };

    if f.listeners.is_empty() {
        return Err(c.err(
            "listener",
            "expected at least one [[listener]] table (or --listen on the command line)",
        ));
    }
    let upstreams = crate::proxy::validate_upstreams(&c, &f.upstreams)?;
    let mut listeners = Vec::with_capacity(f.listeners.len());
    let mut seen = Vec::new();
    for (i, ls) in f.listeners.iter().enumerate() {
        let mut listener = validate_listener(&c, i, ls, tls.unknown_sni)?;
        listener.routes = crate::proxy::validate_routes(
            &c,
            &listener.key_path,
            &ls.routes,
            &upstreams,
            limits.max_body_bytes,
        )?;
        for a in &listener.addrs {
            let key = format!("listener[{i}].listen");
            if let Some((b, other)) = seen.iter().find(|(b, _)| overlaps(a, b)) {
                return Err(c.err(
                    key,
                    if a == b {
                        format!("address {a} is also in `{other}`: each address can be listened on once")
                    } else {
                        format!(
                            "address {a} overlaps {b} in `{other}`: a wildcard address \
                             (0.0.0.0, [::]) takes the port on every address of its family"
                        )
                    },
                ));
            }
            seen.push((*a, key));
        }
        listeners.push(listener);
    }

    let xdp = crate::xdp::validate(&c, f.xdp.as_ref(), &listeners)?;
    Ok(Config {
        origin: origin.to_string(),
        workers,
        server_header: Some(server_header).filter(|s| !s.is_empty()),
        shutdown_timeout: c.positive("server.shutdown_timeout", f.server.shutdown_timeout)?,
        backlog,
        defer_accept,
        privileges: Privileges {
            user: Some(f.server.user.trim().to_string()).filter(|s| !s.is_empty()),
            group: Some(f.server.group.trim().to_string()).filter(|s| !s.is_empty()),
            core_dumps: f.server.core_dumps,
        },
        keys,
        admin,
        limits,
        tls,
        access_log,
        listeners,
        xdp,
        http2,
        open_file_cache,
        upstreams,
    })
}

/// Whether two listen addresses would take the same port: equal, or the
/// same family and port with one of them the wildcard. IPv6 listeners are
/// IPv6-only (`IPV6_V6ONLY`), so `[::]:P` and `0.0.0.0:P` coexist. Port 0
/// (any free port) overlaps nothing.
fn overlaps(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Most files one worker keeps open for one root: far below any
/// descriptor limit tlsgate runs with.
const MAX_OPEN_FILE_CACHE: usize = 100_000;
/// Bodies up to 64 KiB go out in one write after their head.
const MAX_CACHED_CONTENT: u64 = 64 * 1024;

fn validate_files(
    c: &Checker<'_>,
    f: &crate::file::FilesSection,
) -> Result<Option<crate::OpenFileCache>, ConfigError> {
    let entries = c.within(
        "files.open_file_cache",
        f.open_file_cache,
        0,
        MAX_OPEN_FILE_CACHE,
    )?;
    let Some(entries) = std::num::NonZeroUsize::new(entries) else {
        return Ok(None);
    };
    let valid = f.open_file_cache_valid;
    if valid.is_zero() || valid > Duration::from_secs(3600) {
        return Err(c.err(
            "files.open_file_cache_valid",
            "expected a duration from 1ms to 1h, e.g. \"2s\" (turn the cache off with open_file_cache = 0)",
        ));
    }
    let content_max = c.within(
        "files.open_file_cache_content_max",
        f.open_file_cache_content_max,
        0,
        MAX_CACHED_CONTENT,
    )?;
    Ok(Some(crate::OpenFileCache {
        entries,
        valid,
        content_max,
    }))
}

fn validate_tls(c: &Checker<'_>, f: &ConfigFile) -> Result<TlsPolicy, ConfigError> {
    let t = &f.tls;
    let mut versions = Vec::new();
    for v in &t.versions {
        let parsed = match v.as_str() {
            "1.2" => TlsVersion::Tls12,
            "1.3" => TlsVersion::Tls13,
            other => {
                return Err(c.err(
                    "tls.versions",
                    format!("expected \"1.2\" and/or \"1.3\", found {other:?}"),
                ))
            }
        };
        if !versions.contains(&parsed) {
            versions.push(parsed);
        }
    }
    if versions.is_empty() {
        return Err(c.err("tls.versions", "expected at least one of \"1.2\", \"1.3\""));
    }
    let cipher_suites = pick_named(c, "tls.cipher_suites", &t.cipher_suites, &CipherSuite::ALL)?;
    let kx_groups = pick_named(
        c,
        "tls.key_exchange_groups",
        &t.key_exchange_groups,
        &KxGroup::ALL,
    )?;
    let is_tls13 = |s: &&CipherSuite| {
        matches!(
            s,
            CipherSuite::Tls13Aes128GcmSha256
                | CipherSuite::Tls13Aes256GcmSha384
                | CipherSuite::Tls13Chacha20Poly1305Sha256
        )
    };
    let has_13 = cipher_suites.iter().any(|s| is_tls13(&s));
    if versions.contains(&TlsVersion::Tls13) && !has_13 {
        return Err(c.err(
            "tls.cipher_suites",
            "TLS 1.3 is enabled but no TLS13_* suite is listed",
        ));
    }
    let has_12 = cipher_suites.len() > cipher_suites.iter().filter(|s| is_tls13(s)).count();
    if versions.contains(&TlsVersion::Tls12) && !has_12 {
        return Err(c.err(
            "tls.cipher_suites",
            "TLS 1.2 is enabled but no TLS_ECDHE_* suite is listed",
        ));
    }
    let unknown_sni = match t.unknown_sni.as_str() {
        "default" => UnknownSni::UseDefault,
        "reject" => UnknownSni::Reject,
        other => {
            return Err(c.err(
                "tls.unknown_sni",
                format!("expected \"default\" or \"reject\", found {other:?}"),
            ))
        }
    };
    Ok(TlsPolicy {
        versions,
        cipher_suites,
        kx_groups,
        unknown_sni,
        session_cache_size: c.within(
            "tls.session_cache_size",
            t.session_cache_size,
            0,
            10_000_000,
        )?,
        tickets: validate_tickets(c, t)?,
    })
}

/// Longer would keep a silent client's connection half-open in the kernel
/// for minutes before tlsgate sees it.
const MAX_DEFER_ACCEPT: Duration = Duration::from_secs(60);
/// The longest timeout or interval: more than any use needs, and short
/// enough that a deadline computed from it (`now + timeout`) never
/// overflows the clock.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// RFC 8446 §4.6.1: a ticket lifetime is at most 7 days.
const MAX_TICKET_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

fn validate_tickets(
    c: &Checker<'_>,
    t: &crate::file::TlsSection,
) -> Result<SessionTickets, ConfigError> {
    let whole = |key: &str, d: Duration| {
        if d < Duration::from_secs(1) || d > MAX_TICKET_LIFETIME || d.subsec_nanos() != 0 {
            Err(c.err(
                key,
                format!("expected whole seconds from \"1s\" to \"7days\", found {d:?}"),
            ))
        } else {
            Ok(d)
        }
    };
    Ok(SessionTickets {
        enabled: t.session_tickets,
        tls13_count: c.within("tls.tls13_tickets", t.tls13_tickets, 0, 16)?,
        lifetime: whole("tls.ticket_lifetime", t.ticket_lifetime)?,
        rotation: whole("tls.ticket_rotation", t.ticket_rotation)?,
        key_file: t.ticket_key_file.clone(),
    })
}

/// Maps names to values from `table`, keeping order; empty means all.
fn pick_named<T: Copy + PartialEq>(
    c: &Checker<'_>,
    key: &str,
    names: &[String],
    table: &[(&'static str, T)],
) -> Result<Vec<T>, ConfigError> {
    if names.is_empty() {
        return Ok(table.iter().map(|(_, v)| *v).collect());
    }
    let mut out = Vec::new();
    for n in names {
        let Some((_, v)) = table.iter().find(|(name, _)| name.eq_ignore_ascii_case(n)) else {
            let known: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
            return Err(c.err(
                key,
                format!("unknown name {n:?}; expected any of {}", known.join(", ")),
            ));
        };
        if !out.contains(v) {
            out.push(*v);
        }
    }
    Ok(out)
}

fn validate_listener(
    c: &Checker<'_>,
    i: usize,
    ls: &ListenerSection,
    unknown_sni: UnknownSni,
) -> Result<Listener, ConfigError> {
    let key_path = format!("listener[{i}]");
    if ls.listen.is_empty() {
        return Err(c.err(
            format!("{key_path}.listen"),
            "expected at least one address",
        ));
    }
    let addrs = ls
        .listen
        .iter()
        .map(|a| c.addr(&format!("{key_path}.listen"), a))
        .collect::<Result<Vec<_>, _>>()?;
    let root = ls.root.clone().ok_or_else(|| {
        c.err(
            format!("{key_path}.root"),
            "expected a document root directory",
        )
    })?;
    if !root.is_dir() {
        return Err(c.err(
            format!("{key_path}.root"),
            format!("expected an existing directory, found {}", root.display()),
        ));
    }
    let index = ls
        .index
        .clone()
        .unwrap_or_else(|| vec!["index.html".into()]);
    for name in &index {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(c.err(
                format!("{key_path}.index"),
                format!("expected plain file names, found {name:?}"),
            ));
        }
    }
    let client_auth = validate_client_auth(
        c,
        &key_path,
        ls.client_auth.as_deref(),
        ls.client_ca.as_deref(),
        None,
    )?;
    let certificates = if ls.certificates.is_empty() {
        if !ls.self_signed {
            return Err(c.err(
                format!("{key_path}.certificate"),
                "expected at least one [[listener.certificate]] (or self_signed = true)",
            ));
        }
        Certificates::SelfSigned
    } else {
        let mut files = Vec::new();
        let defaults = ls.certificates.iter().filter(|c| c.default).count();
        if defaults > 1 {
            return Err(c.err(
                format!("{key_path}.certificate"),
                "more than one certificate has default = true; expected at most one",
            ));
        }
        for (j, cs) in ls.certificates.iter().enumerate() {
            let ck = format!("{key_path}.certificate[{j}]");
            for (what, p) in [("cert", &cs.cert), ("key", &cs.key)] {
                if p.as_os_str().is_empty() || !p.is_file() {
                    return Err(c.err(
                        format!("{ck}.{what}"),
                        format!(
                            "expected a readable PEM file, found {:?}",
                            p.display().to_string()
                        ),
                    ));
                }
            }
            if let Some(names) = &cs.names {
                for n in names {
                    check_server_name(n).map_err(|why| c.err(format!("{ck}.names"), why))?;
                }
            }
            // With no explicit default, the first certificate is the default
            // (only matters when unknown_sni = "default").
            let default =
                cs.default || (defaults == 0 && j == 0 && unknown_sni == UnknownSni::UseDefault);
            let client_auth = validate_client_auth(
                c,
                &ck,
                cs.client_auth.as_deref(),
                cs.client_ca.as_deref(),
                Some(&client_auth),
            )?;
            files.push(CertificateFiles {
                key_path: ck,
                cert: cs.cert.clone(),
                key: cs.key.clone(),
                names: cs.names.clone(),
                default,
                client_auth,
            });
        }
        check_client_auth_per_name(c, &files)?;
        Certificates::Files(files)
    };
    let offload = validate_offload(c, &key_path, ls)?;
    let alpn = crate::http2::validate_alpn(c, &format!("{key_path}.alpn"), ls.alpn.as_deref())?;
    let proxy_protocol_from = crate::TrustedProxies::parse(&ls.proxy_protocol_from)
        .map_err(|why| c.err(format!("{key_path}.proxy_protocol_from"), why))?;
    let pass_client_headers = crate::PassedFields::parse(&ls.pass_client_headers)
        .map_err(|why| c.err(format!("{key_path}.pass_client_headers"), why))?;
    Ok(Listener {
        key_path,
        addrs,
        root,
        index,
        allow_symlinks_outside_root: ls.allow_symlinks_outside_root,
        client_auth,
        certificates,
        offload,
        alpn,
        routes: Vec::new(),
        proxy_protocol_from,
        pass_client_headers,
    })
}

/// `offload`, `offload_threshold` and `offload_zerocopy` of a listener.
fn validate_offload(
    c: &Checker<'_>,
    key_path: &str,
    ls: &ListenerSection,
) -> Result<Offload, ConfigError> {
    let mut o = Offload::default();
    if let Some(p) = &ls.offload {
        o.policy = match p.as_str() {
            "auto" => OffloadPolicy::Auto,
            "always" => OffloadPolicy::Always,
            "never" => OffloadPolicy::Never,
            other => {
                return Err(c.err(
                    format!("{key_path}.offload"),
                    format!("unknown policy {other:?}; expected \"auto\", \"always\" or \"never\""),
                ))
            }
        };
    }
    if let Some(t) = ls.offload_threshold {
        o.threshold = c.within(&format!("{key_path}.offload_threshold"), t, 0, 1 << 40)?;
    }
    o.zerocopy = ls.offload_zerocopy;
    Ok(o)
}

/// `client_auth` and `client_ca` of a listener (`inherited` = None) or of a
/// certificate entry, which takes what it leaves out from its listener.
fn validate_client_auth(
    c: &Checker<'_>,
    at: &str,
    mode: Option<&str>,
    ca: Option<&Path>,
    inherited: Option<&ClientAuth>,
) -> Result<ClientAuth, ConfigError> {
    let mode_key = format!("{at}.client_auth");
    let ca_key = format!("{at}.client_ca");
    let mode = match mode {
        None => inherited.map_or(ClientAuthMode::None, |i| i.mode),
        Some("none") => ClientAuthMode::None,
        Some("optional") => ClientAuthMode::Optional,
        Some("required") => ClientAuthMode::Required,
        Some(other) => {
            return Err(c.err(
                mode_key,
                format!("expected \"none\", \"optional\" or \"required\", found {other:?}"),
            ))
        }
    };
    if mode == ClientAuthMode::None && ca.is_some() {
        return Err(c.err(
            ca_key,
            "client_ca is set but client_auth is \"none\"; expected client_auth = \"optional\" or \"required\" next to it",
        ));
    }
    let (ca, ca_key) = match (ca, inherited) {
        (Some(p), _) => (Some(p.to_path_buf()), ca_key),
        (None, Some(i)) if i.ca.is_some() => (i.ca.clone(), i.ca_key.clone()),
        (None, _) => (None, ca_key),
    };
    match (mode, &ca) {
        (ClientAuthMode::None, _) => Ok(ClientAuth::none()),
        (_, None) => Err(c.err(
            ca_key,
            format!(
                "client_auth = {:?} needs the CA bundle that client certificates chain to; expected client_ca = \"FILE.pem\"",
                mode.as_str()
            ),
        )),
        (_, Some(p)) if !p.is_file() => Err(c.err(
            ca_key,
            format!("expected a readable PEM file of CA certificates, found {:?}", p.display().to_string()),
        )),
        (_, Some(_)) => Ok(ClientAuth { mode, ca, ca_key }),
    }
}

/// A name served by two entries (an ECDSA and an RSA certificate) has one
/// client certificate policy: the handshake picks it before the certificate.
fn check_client_auth_per_name(
    c: &Checker<'_>,
    files: &[CertificateFiles],
) -> Result<(), ConfigError> {
    for (j, a) in files.iter().enumerate() {
        for b in files.iter().skip(j + 1) {
            let same_names = match (&a.names, &b.names) {
                (Some(x), Some(y)) => x.iter().any(|n| y.contains(n)),
                // Names from the certificates themselves are only known once
                // they are read: the certificate store compares the names
                // each entry serves when it is built (check-config and
                // serve build it too), naming the entries.
                _ => false,
            };
            let both_default = a.default && b.default;
            if (same_names || both_default) && a.client_auth != b.client_auth {
                return Err(c.err(
                    format!("{}.client_auth", b.key_path),
                    format!(
                        "{} serves the same names with client_auth = {:?}{}; expected the same client_auth and client_ca for every certificate of a name",
                        a.key_path,
                        a.client_auth.mode.as_str(),
                        a.client_auth.ca.as_ref().map(|p| format!(", client_ca = {:?}", p.display().to_string())).unwrap_or_default(),
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A DNS name or a wildcard of one leftmost label (`*.example.com`).
fn check_server_name(n: &str) -> Result<(), String> {
    let bare = n.strip_prefix("*.").unwrap_or(n);
    let ok = !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected DNS names like \"example.com\" or \"*.example.com\", found {n:?}"
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        std::fs::write(dir.path().join("c.pem"), "x").unwrap();
        std::fs::write(dir.path().join("k.pem"), "x").unwrap();
        let p = dir.path().join("tlsgate.toml");
        std::fs::write(&p, text).unwrap();
        load(Some(&p), &Overrides::default(), Path::new("/nonexistent"))
    }

    const GOOD: &str = r#"
[server]
workers = 2
[limits]
header_timeout = "5s"
[[listener]]
listen = ["127.0.0.1:8443", "[::1]:8443"]
root = "site"
[[listener.certificate]]
cert = "c.pem"
key = "k.pem"
names = ["example.com", "*.example.com"]
"#;

    #[test]
    fn good_file_is_accepted_and_paths_are_relative_to_it() {
        let c = load_text(GOOD).unwrap();
        assert_eq!(c.workers, 2);
        assert_eq!(c.limits.header_timeout, Duration::from_secs(5));
        assert_eq!(c.listeners[0].addrs.len(), 2);
        assert!(c.listeners[0].root.ends_with("site"));
        assert!(c.listeners[0].root.is_absolute());
        let Certificates::Files(f) = &c.listeners[0].certificates else {
            panic!()
        };
        assert!(f[0].default, "first certificate is the default");
        assert_eq!(c.tls.cipher_suites.len(), 9);
        assert!(c.keys.isolation, "keys are isolated unless turned off");
        assert_eq!(c.privileges, Privileges::default());
        assert!(!c.privileges.core_dumps, "not dumpable unless asked");
        let c = load_text(&GOOD.replace("workers = 2", "core_dumps = true")).unwrap();
        assert!(c.privileges.core_dumps);
    }

    #[test]
    fn ticket_settings_default_and_key_file_is_relative_to_the_file() {
        let c = load_text(GOOD).unwrap();
        assert!(c.tls.tickets.enabled);
        assert_eq!(c.tls.tickets.tls13_count, 2);
        assert_eq!(c.tls.tickets.lifetime, Duration::from_secs(12 * 3600));
        assert_eq!(c.tls.tickets.rotation, Duration::from_secs(3600));
        assert_eq!(c.tls.tickets.key_file, None);
        let text = format!(
            "[tls]\nticket_key_file = \"keys/ticket.keys\"\nticket_lifetime = \"2h\"\n{GOOD}"
        );
        let c = load_text(&text).unwrap();
        let k = c.tls.tickets.key_file.unwrap();
        assert!(k.is_absolute() && k.ends_with("keys/ticket.keys"), "{k:?}");
        assert_eq!(c.tls.tickets.lifetime, Duration::from_secs(7200));
    }

    #[test]
    fn offload_defaults_to_auto_at_64_kib_and_takes_each_policy() {
        let c = load_text(GOOD).unwrap();
        assert_eq!(c.listeners[0].offload, Offload::default());
        assert_eq!(c.listeners[0].offload.policy, OffloadPolicy::Auto);
        assert_eq!(c.listeners[0].offload.threshold, 65536);
        for (name, policy) in [
            ("always", OffloadPolicy::Always),
            ("never", OffloadPolicy::Never),
        ] {
            let text = GOOD.replace(
                "root = \"site\"",
                &format!("root = \"site\"\noffload = \"{name}\"\noffload_threshold = 1024\noffload_zerocopy = true"),
            );
            let o = load_text(&text).unwrap().listeners[0].offload;
            assert_eq!(o.policy, policy);
            assert_eq!(o.threshold, 1024);
            assert!(o.zerocopy);
        }
    }

    #[test]
    fn the_documented_example_is_valid() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/tlsgate.example.toml");
        let c = load(
            Some(&example),
            &Overrides::default(),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(c.listeners[0].offload.policy, OffloadPolicy::Auto);
        // The example shows the defaults.
        let dir = tempfile::tempdir().unwrap();
        let builtin = load(None, &Overrides::default(), dir.path()).unwrap();
        assert_eq!(c.http2, builtin.http2);
        assert_eq!(c.listeners[0].alpn, builtin.listeners[0].alpn);
        assert_eq!(
            c.listeners[0].alpn,
            vec![crate::Alpn::H2, crate::Alpn::Http11]
        );
    }

    #[test]
    fn alpn_keeps_the_order_given() {
        let c = load_text("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nalpn = [\"http/1.1\", \"h2\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n").unwrap();
        assert_eq!(
            c.listeners[0].alpn,
            vec![crate::Alpn::Http11, crate::Alpn::H2]
        );
    }

    #[test]
    fn builtin_defaults_are_valid() {
        let dir = tempfile::tempdir().unwrap();
        let c = load(None, &Overrides::default(), dir.path()).unwrap();
        assert_eq!(c.listeners[0].addrs[0], "127.0.0.1:8443".parse().unwrap());
        assert_eq!(c.listeners[0].certificates, Certificates::SelfSigned);
        assert_eq!(c.admin, Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(c.origin, BUILTIN);
    }

    #[test]
    fn errors_name_file_key_and_expectation() {
        let cases: &[(&str, &str, &str)] = &[
            ("[limits]\nheader_timeout = 5\n", "limits.header_timeout", "duration"),
            ("[limits]\nheader_timeout = \"0s\"\n", "limits.header_timeout", "greater than zero"),
            ("[server]\nworkerz = 1\n", "server.workerz", "unknown field"),
            ("[tls]\nversions = [\"1.1\"]\n", "tls.versions", "\"1.2\""),
            ("[tls]\nunknown_sni = \"maybe\"\n", "tls.unknown_sni", "reject"),
            ("[tls]\ncipher_suites = [\"RC4\"]\n", "tls.cipher_suites", "unknown name"),
            ("[admin]\nlisten = \"nowhere\"\n", "admin.listen", "socket address"),
            ("[server]\nserver_header = \"x\\r\\nSet-Cookie: a=b\"\n", "server.server_header", "byte 0x0D"),
            ("[server]\nserver_header = \"x\\u0000\"\n", "server.server_header", "byte 0x00"),
            ("[server]\ngroup = \"nogroup\"\n", "server.group", "server.user"),
            ("[server]\nkey_timeout = \"0s\"\n", "server.key_timeout", "greater than zero"),
            ("[server]\ndefer_accept = \"1500ms\"\n", "server.defer_accept", "whole seconds"),
            ("[server]\ndefer_accept = \"2m\"\n", "server.defer_accept", "\"60s\""),
            ("[limits]\nkeepalive_timeout = \"1000years\"\n", "limits.keepalive_timeout", "at most 365 days"),
            ("[limits]\nbody_timeout = \"366days\"\n", "limits.body_timeout", "at most 365 days"),
            ("[access_log]\nformat = \"xml\"\n", "access_log.format", "json"),
            ("[tls]\nticket_lifetime = \"8days\"\n", "tls.ticket_lifetime", "7days"),
            ("[tls]\nticket_rotation = \"1500ms\"\n", "tls.ticket_rotation", "whole seconds"),
            ("[tls]\ntls13_tickets = 17\n", "tls.tls13_tickets", "0 to 16"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"missing\"\nself_signed = true\n", "listener[0].root", "existing directory"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n", "listener[0].certificate", "at least one"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"nope.pem\"\nkey = \"k.pem\"\n", "listener[0].certificate[0].cert", "PEM file"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"bad name\"]\n", "listener[0].certificate[0].names", "DNS names"),
            ("", "listener", "at least one"),
            ("[limits\n", "", "line 1"),
            ("[limits]\nsource_prefix_v6 = 129\n", "limits.source_prefix_v6", "from 1 to 128"),
            ("[limits]\nhandshake_burst_per_source = 0\n", "limits.handshake_burst_per_source", "from 1 to"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nclient_auth = \"sometimes\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].client_auth", "\"required\""),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nclient_auth = \"required\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].client_ca", "needs the CA bundle"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nclient_auth = \"optional\"\nclient_ca = \"nope.pem\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].client_ca", "PEM file of CA"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"c.pem\"\n", "listener[0].certificate[0].client_ca", "client_auth is \"none\""),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"a.test\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"a.test\"]\nclient_auth = \"required\"\nclient_ca = \"c.pem\"\n", "listener[0].certificate[1].client_auth", "listener[0].certificate[0] serves the same names"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\noffload = \"sometimes\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].offload", "\"auto\", \"always\" or \"never\""),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nalpn = [\"h2c\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].alpn", "no \"h2c\""),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nalpn = []\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].alpn", "at least one"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nalpn = [\"h2\", \"h2\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].alpn", "twice"),
            ("[http2]\nmax_concurrent_streams = 0\n", "http2.max_concurrent_streams", "from 1 to 10000"),
            ("[http2]\nmax_frame_size = 16383\n", "http2.max_frame_size", "from 16384"),
            ("[http2]\ninitial_window_size = 2147483648\n", "http2.initial_window_size", "2147483647"),
            ("[http2]\nreset_burst = 0\n", "http2.reset_burst", "from 1 to"),
            ("[http2]\nidle_timeout = \"0s\"\n", "http2.idle_timeout", "greater than zero"),
            ("[http2]\nmax_streams = 5\n", "http2.max_streams", "unknown field"),
            ("[http2]\nmax_connection_send_buffer = 16383\n", "http2.max_connection_send_buffer", "from 16384"),
            ("[http2]\nmax_connection_send_buffer = 1048576\nmax_worker_send_buffer = 524288\n", "http2.max_worker_send_buffer", "at least max_connection_send_buffer"),
            (
                "[http2]\nmax_header_list_size = 262144\nmax_header_frames = 15\n",
                "http2.max_header_frames",
                "expected at least 16",
            ),
            ("[files]\nopen_file_cache = 100001\n", "files.open_file_cache", "100000"),
            ("[files]\nopen_file_cache_valid = \"0s\"\n", "files.open_file_cache_valid", "from 1ms to 1h"),
            ("[files]\nopen_file_cache_valid = \"2h\"\n", "files.open_file_cache_valid", "from 1ms to 1h"),
            ("[files]\nopen_file_cache = \"many\"\n", "files.open_file_cache", "expected usize"),
            ("[files]\nopen_file_cache_content_max = 65537\n", "files.open_file_cache_content_max", "65536"),
            ("[limits]\nmax_body_bytes = 99999999999999999999\n", "limits.max_body_bytes", "at most 9223372036854775807 (line 2)"),
            ("[limits]\nmax_header_bytes = 18446744073709551616\n", "limits.max_header_bytes", "at most 9223372036854775807"),
            ("limits.max_body_bytes = 99999999999999999999\n", "limits.max_body_bytes", "at most"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n[[listener]]\nlisten = [\"127.0.0.1:2\"]\nroot = \"site\"\n[[listener.route]]\npath = \"/a/\"\nroot = \"site\"\n[[listener.route]]\npath = \"/b/\"\nroot = \"site\"\nmax_body_bytes = 99999999999999999999 # too big\n", "listener[1].route[1].max_body_bytes", "at most"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\noffload_threshold = \"64k\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].offload_threshold", "expected u64"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nproxy_protocol_from = [\"10.0.0.0/33\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].proxy_protocol_from", "\"10.0.0.0/33\" is not an address or network"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nproxy_protocol_from = \"10.0.0.0/8\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].proxy_protocol_from", "expected a sequence"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nproxy_protocol_from = [\"10.0.0.0/8\", \"::/0\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].proxy_protocol_from", "trusts every address"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\npass_client_headers = [\"X-Forwarded-For\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].pass_client_headers", "\"X-Forwarded-For\" is always dropped"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\npass_client_headers = [\"X-Original-URL\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].pass_client_headers", "around its route"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\npass_client_headers = [\"X-Kept\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].pass_client_headers", "passes already; expected some of x-forwarded-scheme"),
            ("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\npass_client_headers = [\"CF_Connecting_IP\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", "listener[0].pass_client_headers", "passes already"),
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

    #[test]
    fn pass_client_headers_takes_passable_names_in_any_case() {
        let c = load_text("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\npass_client_headers = [\"CF-Connecting-IP\", \"x-forwarded-prefix\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n").unwrap();
        let p = c.listeners[0].pass_client_headers;
        for (i, name) in crate::PASSABLE_FIELDS.iter().enumerate() {
            let want = matches!(*name, "cf-connecting-ip" | "x-forwarded-prefix");
            assert_eq!(p.passes(i), want, "{name}");
        }
        assert!(!p.passes(99));
        assert!(crate::PASSABLE_FIELDS.len() <= 32);
    }

    #[test]
    fn proxy_protocol_from_takes_addresses_and_networks_and_trusts_mapped_ipv4() {
        let c = load_text("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nproxy_protocol_from = [\"10.1.2.3/8\", \"192.0.2.7\", \"2001:db8::/32\", \"::ffff:172.16.0.0/108\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n").unwrap();
        let t = &c.listeners[0].proxy_protocol_from;
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        for yes in [
            "10.200.0.1",
            "192.0.2.7",
            "2001:db8:5::1",
            "::ffff:10.0.0.9",
        ] {
            assert!(t.trusts(ip(yes)), "{yes}");
        }
        for no in [
            "11.0.0.1",
            "192.0.2.8",
            "2001:db9::1",
            "::ffff:192.0.2.8",
            "172.32.0.1",
        ] {
            assert!(!t.trusts(ip(no)), "{no}");
        }
        // Off unless asked for.
        let builtin = load_text("[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n").unwrap();
        assert!(builtin.listeners[0].proxy_protocol_from.is_empty());
        assert!(!builtin.listeners[0]
            .proxy_protocol_from
            .trusts(ip("127.0.0.1")));
    }

    #[test]
    fn client_auth_is_inherited_from_the_listener_and_overridden_per_name() {
        let text = "[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\nclient_auth = \"required\"\nclient_ca = \"c.pem\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"a.test\"]\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"b.test\"]\nclient_auth = \"none\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"c.test\"]\nclient_auth = \"optional\"\n";
        let c = load_text(text).unwrap();
        let l = &c.listeners[0];
        assert_eq!(l.client_auth.mode, ClientAuthMode::Required);
        assert!(l.client_auth.ca.as_ref().unwrap().is_absolute());
        let Certificates::Files(f) = &l.certificates else {
            panic!()
        };
        assert_eq!(f[0].client_auth, l.client_auth);
        assert_eq!(f[1].client_auth, ClientAuth::none());
        assert_eq!(f[2].client_auth.mode, ClientAuthMode::Optional);
        assert_eq!(f[2].client_auth.ca, l.client_auth.ca);
        // Messages about the bundle name the key where it was set.
        assert_eq!(f[2].client_auth.ca_key, "listener[0].client_ca");
        // The same policy written twice is one policy.
        let twice = "[[listener]]\nlisten = [\"127.0.0.1:1\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"a.test\"]\nclient_auth = \"required\"\nclient_ca = \"c.pem\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\nnames = [\"a.test\"]\nclient_auth = \"required\"\nclient_ca = \"c.pem\"\n";
        let c = load_text(twice).unwrap();
        let Certificates::Files(f) = &c.listeners[0].certificates else {
            panic!()
        };
        assert_eq!(f[0].client_auth, f[1].client_auth);
        // Without the keys, nothing is asked of clients.
        let plain = load_text(GOOD).unwrap();
        assert_eq!(plain.listeners[0].client_auth, ClientAuth::none());
    }

    #[test]
    fn flags_override_the_first_listener() {
        let dir = tempfile::tempdir().unwrap();
        let o = Overrides {
            listen: vec!["127.0.0.1:0".into()],
            admin: Some(String::new()),
            workers: Some(3),
            ..Overrides::default()
        };
        let c = load(None, &o, dir.path()).unwrap();
        assert_eq!(c.listeners[0].addrs[0].port(), 0);
        assert_eq!(c.admin, None);
        assert_eq!(c.workers, 3);
        let half = Overrides {
            cert: Some("x".into()),
            ..Overrides::default()
        };
        let e = load(None, &half, dir.path()).unwrap_err();
        assert_eq!(e.key, "--key");
    }

    #[test]
    fn wildcard_names() {
        assert!(check_server_name("*.example.com").is_ok());
        assert!(check_server_name("a-b.example").is_ok());
        assert!(check_server_name("*.*.example.com").is_err());
        assert!(check_server_name("ex ample.com").is_err());
        assert!(check_server_name("").is_err());
    }
}
