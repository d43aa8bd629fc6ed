//! The servers under test, each started by the bench with an equivalent
//! configuration: the same two certificates, the same document root, TLS
//! 1.2 and 1.3 with the same suites and groups, session resumption on,
//! one worker, no access log, pinned to the server core. The client then
//! decides what is negotiated by offering exactly one version, suite,
//! group and signature scheme — and the bench checks what was negotiated.

use std::fmt;
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::materials::Materials;
use crate::proc::ProcessTree;

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// This project.
    Tlsgate,
    /// This project with its private keys in the worker
    /// (`key_isolation = false`): beside `Tlsgate` in the same run, what
    /// keeping the keys out of the network-facing process costs.
    #[serde(rename = "tlsgate-inproc")]
    TlsgateKeysInProcess,
    /// nginx with OpenSSL (Debian package).
    Nginx,
    /// HAProxy with OpenSSL (Debian package).
    Haproxy,
    /// HAProxy in `mode tcp`, only in the proxy scenario: it terminates TLS
    /// and relays the bytes to the upstream without reading HTTP, one
    /// upstream connection per client connection. No proxy can do less
    /// for a request, so its CPU is the floor of that scenario's ratios on
    /// this machine (the kernel's TCP work plus TLS's records).
    #[serde(rename = "haproxy-relay")]
    HaproxyRelay,
}

impl TargetKind {
    /// The default targets, in report order.
    pub const ALL: [TargetKind; 3] = [Self::Tlsgate, Self::Nginx, Self::Haproxy];

    /// Every kind, in report order.
    pub const REPORTED: [TargetKind; 5] = [
        Self::Tlsgate,
        Self::TlsgateKeysInProcess,
        Self::Nginx,
        Self::Haproxy,
        Self::HaproxyRelay,
    ];

    /// Parses "tlsgate", "tlsgate-inproc", "nginx" or "haproxy" (the relay
    /// is not a target of its own: the proxy scenario adds it).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tlsgate" => Some(Self::Tlsgate),
            "tlsgate-inproc" => Some(Self::TlsgateKeysInProcess),
            "nginx" => Some(Self::Nginx),
            "haproxy" => Some(Self::Haproxy),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tlsgate => "tlsgate",
            Self::TlsgateKeysInProcess => "tlsgate-inproc",
            Self::Nginx => "nginx",
            Self::Haproxy => "haproxy",
            Self::HaproxyRelay => "haproxy-relay",
        }
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a target is started.
#[derive(Debug, Clone)]
pub struct TargetSettings {
    /// Pin the server here (all its processes and threads).
    pub core: Option<usize>,
    /// Largest file a scenario fetches (HAProxy needs buffers that large).
    pub max_file: u64,
    /// The tlsgate binary.
    pub tlsgate_bin: PathBuf,
    /// tlsgate's kernel-TLS policy.
    pub tlsgate_offload: tlsgate_config::OffloadPolicy,
    /// Proxy every request to this upstream (keep-alive HTTP/1.1) instead
    /// of serving the document root (the `proxy` scenario).
    pub proxy_to: Option<ProxyUpstream>,
}

/// The upstream of the `proxy` scenario: one server, two ports.
#[derive(Clone, Copy, Debug)]
pub struct ProxyUpstream {
    /// Plain HTTP/1.1: every path but those under [`PROXY_PROTOCOL_PREFIX`].
    pub plain: SocketAddr,
    /// The same files under [`PROXY_PROTOCOL_PREFIX`], on a port that
    /// requires a PROXY protocol header: proxies that can send one route
    /// that prefix there, with a v2 header on each connection.
    pub proxy_protocol: SocketAddr,
}

/// Paths under this prefix go to the upstream's PROXY protocol port.
pub const PROXY_PROTOCOL_PREFIX: &str = "/pp/";

impl TargetKind {
    /// Whether it can begin its upstream connections with a PROXY protocol
    /// header in HTTP mode (nginx can only in its `stream` module).
    pub fn sends_proxy_protocol(self) -> bool {
        !matches!(self, Self::Nginx | Self::HaproxyRelay)
    }
}

/// A server process the bench started: pinned, its output in a log, its
/// process tree for CPU accounting, stopped when dropped.
pub(crate) struct ServerProcess {
    label: String,
    addr: SocketAddr,
    child: Child,
    tree: ProcessTree,
    log: PathBuf,
    version: String,
}

/// What a readiness probe found.
pub(crate) enum Probe {
    Ready,
    NotYet(String),
    Failed(String),
}

impl ServerProcess {
    /// Runs `program args` (pinned to `core`, through taskset, which execs
    /// it: the child's pid is the server's), its output in `dir/server.log`,
    /// then waits up to 15 s for `probe` to find it ready.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        label: String,
        program: &str,
        args: &[String],
        core: Option<usize>,
        addr: SocketAddr,
        dir: &Path,
        version: String,
        mut probe: impl FnMut(SocketAddr) -> Probe,
    ) -> Result<Self, BenchError> {
        let log = dir.join("server.log");
        let out = fs::File::create(&log).map_err(BenchError::io(&log))?;
        let err = out.try_clone().map_err(BenchError::io(&log))?;
        let mut cmd = crate::crosscheck::tool_command(core, program);
        // Should the bench be killed outright, the server goes too.
        tlsgate_sys::ipc::terminate_with_spawning_thread(&mut cmd);
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| BenchError::Target {
                target: label.clone(),
                problem: format!("cannot run {program}: {e}"),
                log: String::new(),
            })?;
        let mut server = Self {
            label,
            addr,
            tree: ProcessTree::of(child.id()),
            child,
            log,
            version,
        };
        let limit = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(server.failure(format!("exited at start ({status})")));
            }
            match probe(addr) {
                Probe::Ready => break,
                Probe::Failed(problem) => return Err(server.failure(problem)),
                Probe::NotYet(why) if Instant::now() > limit => {
                    return Err(server.failure(format!("not ready after 15 s: {why}")));
                }
                Probe::NotYet(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        // Workers exist once it is ready: take the tree now.
        server.tree = ProcessTree::of(server.child.id());
        Ok(server)
    }

    /// An error carrying the end of the server's log.
    pub(crate) fn failure(&self, problem: String) -> BenchError {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        BenchError::Target {
            target: self.label.clone(),
            problem,
            log: lines[lines.len().saturating_sub(20)..].join("\n"),
        }
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its processes.
    pub(crate) fn tree(&self) -> &ProcessTree {
        &self.tree
    }

    /// Its version line.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// Fails if the server died.
    pub(crate) fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failure(format!("died ({status})"))),
            Err(e) => Err(self.failure(format!("cannot wait: {e}"))),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A running target.
pub struct Target {
    kind: TargetKind,
    server: ServerProcess,
}

impl Target {
    /// Starts `kind` and waits until it accepts connections.
    pub fn start(
        kind: TargetKind,
        materials: &Materials,
        settings: &TargetSettings,
    ) -> Result<Self, BenchError> {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = materials.dir().join(kind.name());
        fs::create_dir_all(&dir).map_err(BenchError::io(&dir))?;
        let (program, args, version) = match kind {
            TargetKind::Tlsgate | TargetKind::TlsgateKeysInProcess => {
                let conf = dir.join("tlsgate.toml");
                let keys_in_process = kind == TargetKind::TlsgateKeysInProcess;
                write(
                    &conf,
                    &tlsgate_config(materials, addr, settings, keys_in_process),
                )?;
                let bin = settings.tlsgate_bin.display().to_string();
                (
                    bin.clone(),
                    vec![
                        "serve".into(),
                        "--config".into(),
                        conf.display().to_string(),
                    ],
                    program_version(&bin, &["--version"]),
                )
            }
            TargetKind::Nginx => {
                let program = find("nginx", &["/usr/sbin/nginx"])?;
                let conf = dir.join("nginx.conf");
                write(
                    &conf,
                    &nginx_config(materials, addr, &dir, settings.proxy_to.map(|u| u.plain)),
                )?;
                let version = program_version(&program, &["-v"]);
                (
                    program,
                    vec![
                        "-p".into(),
                        dir.display().to_string(),
                        "-c".into(),
                        conf.display().to_string(),
                    ],
                    version,
                )
            }
            TargetKind::Haproxy | TargetKind::HaproxyRelay => {
                let program = find("haproxy", &["/usr/sbin/haproxy"])?;
                let conf = dir.join("haproxy.cfg");
                let text = match (kind, settings.proxy_to) {
                    (TargetKind::HaproxyRelay, Some(upstream)) => {
                        haproxy_relay_config(materials, addr, upstream)
                    }
                    (TargetKind::HaproxyRelay, None) => return Err(BenchError::Target {
                        target: kind.to_string(),
                        problem:
                            "a TLS relay has nothing to serve: it runs in the proxy scenario only"
                                .into(),
                        log: String::new(),
                    }),
                    (_, Some(upstream)) => haproxy_proxy_config(materials, addr, upstream),
                    (_, None) => haproxy_config(materials, addr, settings.max_file)?,
                };
                write(&conf, &text)?;
                let version = program_version(&program, &["-v"]);
                (
                    program,
                    vec!["-db".into(), "-f".into(), conf.display().to_string()],
                    version,
                )
            }
        };
        let server = ServerProcess::start(
            kind.to_string(),
            &program,
            &args,
            settings.core,
            addr,
            &dir,
            version,
            |addr| match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(_) => {
                    // nginx accepts in its master's socket before the worker runs.
                    std::thread::sleep(Duration::from_millis(100));
                    Probe::Ready
                }
                Err(e) => Probe::NotYet(format!("not accepting connections ({e})")),
            },
        )?;
        Ok(Self { kind, server })
    }

    /// Stops the server, then starts it again under a new port with
    /// nothing left of what it served before.
    pub fn restart(
        &mut self,
        materials: &Materials,
        settings: &TargetSettings,
    ) -> Result<(), BenchError> {
        // Stopped first: the old server's memory and sockets are gone
        // before the new one starts.
        stop(&mut self.server.child);
        *self = Target::start(self.kind, materials, settings)?;
        Ok(())
    }

    /// An error carrying the end of the target's log.
    pub fn failure(&self, problem: String) -> BenchError {
        self.server.failure(problem)
    }

    /// Which server.
    pub fn kind(&self) -> TargetKind {
        self.kind
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Its processes.
    pub fn tree(&self) -> &ProcessTree {
        self.server.tree()
    }

    /// Its version line.
    pub fn version(&self) -> &str {
        self.server.version()
    }

    /// Fails if the target died.
    pub fn check_alive(&mut self) -> Result<(), BenchError> {
        self.server.check_alive()
    }
}

/// SIGTERM, up to 5 s to exit, then SIGKILL.
pub(crate) fn stop(child: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let limit = Instant::now() + Duration::from_secs(5);
    while Instant::now() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The descriptor limit every target may use (a container may forbid raising it).
pub(crate) fn fd_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(1 << 20)
        .min(1 << 20)
}

/// The most connections every target can hold at once here: HAProxy
/// reserves two descriptors per connection, and a container may forbid
/// raising the descriptor limit.
pub fn connection_ceiling() -> usize {
    (fd_limit().saturating_sub(100) / 2).saturating_sub(100) as usize
}

pub(crate) fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(BenchError::io("127.0.0.1:0"))?;
    Ok(l.local_addr()
        .map_err(BenchError::io("127.0.0.1:0"))?
        .port())
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    fs::write(path, text).map_err(BenchError::io(path))
}

pub(crate) fn find(program: &str, fallbacks: &[&str]) -> Result<String, BenchError> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .ok_or_else(|| BenchError::Missing {
            program: program.into(),
            hint: "run `./dev setup` (installs nginx-light, haproxy, wrk)".into(),
        })
}

pub(crate) fn program_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_default()
}

/// TLS 1.2 suites, in OpenSSL's names, offered by every target.
const TLS12_SUITES: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
/// TLS 1.3 suites.
const TLS13_SUITES: &str =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
/// Groups both OpenSSL 3.0 and rustls have (OpenSSL 3.0 has no ML-KEM).
const GROUPS: &str = "X25519:P-256";

/// TLS 1.2 sessions the bench's tlsgate keeps for resumption by ID.
pub const TLSGATE_SESSION_CACHE: usize = 20_480;

/// tlsgate: one worker, no admin listener, no access log; its keys in the
/// worker when `keys_in_process` (tlsgate-inproc).
pub fn tlsgate_config(
    m: &Materials,
    addr: SocketAddr,
    s: &TargetSettings,
    keys_in_process: bool,
) -> String {
    format!(
        r#"[server]
workers = 1
{extra}
[admin]
listen = ""

[access_log]
target = "off"

[limits]
max_connections = 100000
max_connections_per_ip = 100000
max_requests_per_connection = 100000000
keepalive_timeout = "75s"
# All load comes from one address: the flood limits would measure themselves.
handshake_rate_per_source = 0
max_handshakes_per_source = 0
max_handshakes_in_progress = 0

[tls]
versions = ["1.2", "1.3"]
cipher_suites = [
  "TLS13_AES_128_GCM_SHA256", "TLS13_AES_256_GCM_SHA384", "TLS13_CHACHA20_POLY1305_SHA256",
  "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
  "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
  "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
]
key_exchange_groups = ["X25519", "secp256r1", "X25519MLKEM768"]
session_cache_size = {session_cache}

[[listener]]
listen = ["{addr}"]
root = "{root}"
offload = "{offload}"

[[listener.certificate]]
cert = "{ecdsa_cert}"
key = "{ecdsa_key}"

[[listener.certificate]]
cert = "{rsa_cert}"
key = "{rsa_key}"

# The same certificates under a second name that requires client certificates.
[[listener.certificate]]
cert = "{ecdsa_cert}"
key = "{ecdsa_key}"
names = ["{mtls_name}"]
client_auth = "required"
client_ca = "{client_ca}"

[[listener.certificate]]
cert = "{rsa_cert}"
key = "{rsa_key}"
names = ["{mtls_name}"]
client_auth = "required"
client_ca = "{client_ca}"
{proxy}"#,
        proxy = s.proxy_to.map(tlsgate_proxy_section).unwrap_or_default(),
        extra = if keys_in_process {
            "key_isolation = false\n"
        } else {
            ""
        },
        offload = s.tlsgate_offload.as_str(),
        session_cache = TLSGATE_SESSION_CACHE,
        root = m.root.display(),
        ecdsa_cert = m.ecdsa.cert.display(),
        ecdsa_key = m.ecdsa.key.display(),
        rsa_cert = m.rsa.cert.display(),
        rsa_key = m.rsa.key.display(),
        mtls_name = crate::materials::MTLS_SERVER_NAME,
        client_ca = m.client_ca.display(),
    )
}

/// tlsgate as a proxy: every path of the listener above routed to one
/// keep-alive pool, those under the PROXY protocol prefix to a pool that
/// sends v2 headers (per-source handshake limits are already off).
fn tlsgate_proxy_section(upstream: ProxyUpstream) -> String {
    format!(
        r#"
[[listener.route]]
path = "/"
upstream = "bench"

[[listener.route]]
path = "{PROXY_PROTOCOL_PREFIX}"
upstream = "bench-pp"

[[upstream]]
name = "bench"
max_idle = {UPSTREAM_KEEPALIVE}
# No passive marks: a bench error must show as an error, not as a 503.
max_fails = 0

[[upstream.server]]
address = "{plain}"

[[upstream]]
name = "bench-pp"
proxy_protocol = "v2"
max_idle = {UPSTREAM_KEEPALIVE}
max_fails = 0

[[upstream.server]]
address = "{pp}"
"#,
        plain = upstream.plain,
        pp = upstream.proxy_protocol,
    )
}

/// Idle keep-alive connections each proxy keeps to the upstream (nginx
/// `keepalive`, tlsgate `max_idle`; HAProxy keeps what it needs).
pub const UPSTREAM_KEEPALIVE: usize = 128;

/// nginx: one worker, both certificates, shared session cache and tickets;
/// serving the root, or proxying to `proxy_to` over keep-alive HTTP/1.1
/// with the usual forwarding headers and buffers that hold a 64 KiB
/// response in memory (nginx's defaults, 8 × 4 KiB, would spill to a
/// temporary file).
pub fn nginx_config(
    m: &Materials,
    addr: SocketAddr,
    dir: &Path,
    proxy_to: Option<SocketAddr>,
) -> String {
    let (upstream, content) = match proxy_to {
        None => (String::new(), format!("root {};", m.root.display())),
        Some(u) => (
            format!(
                r#"upstream bench_upstream {{
        server {u};
        keepalive {UPSTREAM_KEEPALIVE};
        keepalive_requests 100000000;
        keepalive_timeout 75s;
    }}"#
            ),
            r#"location / {
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_buffer_size 16k;
            proxy_buffers 8 16k;
        }"#
            .to_string(),
        ),
    };
    format!(
        r#"{head}    {upstream}
    server {{
        # HTTP/2 for the h2 scenario (nginx 1.22 syntax; `http2 on` from 1.25).
        listen {addr} ssl http2;
        server_name {name};
        {content}
        ssl_certificate {ecdsa_cert};
        ssl_certificate_key {ecdsa_key};
        ssl_certificate {rsa_cert};
        ssl_certificate_key {rsa_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_ciphers {tls12};
        ssl_conf_command Ciphersuites {tls13};
        ssl_prefer_server_ciphers on;
        ssl_ecdh_curve {groups};
        ssl_session_cache shared:SSL:64m;
        ssl_session_timeout 1h;
        ssl_session_tickets on;
    }}
}}
"#,
        head = nginx_head(dir),
        name = crate::materials::SERVER_NAME,
        ecdsa_cert = m.ecdsa.cert.display(),
        ecdsa_key = m.ecdsa.key.display(),
        rsa_cert = m.rsa.cert.display(),
        rsa_key = m.rsa.key.display(),
        tls12 = TLS12_SUITES,
        tls13 = TLS13_SUITES,
        groups = GROUPS,
    )
}

/// What every nginx the bench starts has: one worker, descriptors and
/// connections as many as the machine allows, files under `dir`, no access
/// log, `sendfile`, keep-alive without limit; ends inside `http {`.
pub(crate) fn nginx_head(dir: &Path) -> String {
    format!(
        r#"# Written by tlsgate bench.
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {fds};
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections {conns};
}}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000000;
    keepalive_timeout 75s;
"#,
        dir = dir.display(),
        fds = fd_limit(),
        conns = fd_limit().saturating_sub(100),
    )
}

/// HAProxy: one thread, both certificates, files answered from memory with
/// `http-request return` (HAProxy is a proxy and serves no files from disk;
/// its buffers must hold the largest file).
pub fn haproxy_config(
    m: &Materials,
    addr: SocketAddr,
    max_file: u64,
) -> Result<String, BenchError> {
    let mut returns = String::new();
    let dir = m.root.join("f");
    let mut names: Vec<(String, u64)> = fs::read_dir(&dir)
        .map_err(BenchError::io(&dir))?
        .flatten()
        .filter_map(|e| {
            Some((
                e.file_name().to_str()?.to_string(),
                e.metadata().ok()?.len(),
            ))
        })
        .collect();
    names.sort();
    for (name, _) in &names {
        returns.push_str(&format!(
            "    http-request return status 200 content-type application/octet-stream file {} if {{ path /f/{name} }}\n",
            dir.join(name).display()
        ));
    }
    let largest = names
        .iter()
        .map(|(_, l)| *l)
        .max()
        .unwrap_or(0)
        .max(max_file);
    // Room for the file plus headers and HAProxy's rewrite reserve.
    let bufsize = (largest + 64 * 1024).max(16 * 1024);
    Ok(format!(
        r#"{head}
frontend bench
    bind {addr} ssl crt {ecdsa} crt {rsa} alpn h2,http/1.1
{returns}    http-request return status 404
"#,
        head = haproxy_head(&format!("    tune.bufsize {bufsize}\n")),
        ecdsa = m.ecdsa.combined.display(),
        rsa = m.rsa.combined.display(),
    ))
}

/// HAProxy's global and defaults sections: one thread, the TLS settings
/// every target has, HTTP keep-alive; `extra` goes into `global`.
fn haproxy_head(extra: &str) -> String {
    format!(
        r#"# Written by tlsgate bench.
global
    nbthread 1
    ulimit-n {fds}
    maxconn {conns}
{extra}    tune.ssl.cachesize 100000
    tune.ssl.lifetime 3600
    ssl-default-bind-ciphers {tls12}
    ssl-default-bind-ciphersuites {tls13}
    ssl-default-bind-curves {groups}
    ssl-default-bind-options ssl-min-ver TLSv1.2 ssl-max-ver TLSv1.3
    log stderr format raw local0 err

defaults
    mode http
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-keep-alive 75s
    option http-keep-alive
"#,
        fds = fd_limit(),
        // HAProxy reserves two descriptors per connection.
        conns = fd_limit().saturating_sub(100) / 2,
        tls12 = TLS12_SUITES,
        tls13 = TLS13_SUITES,
        groups = GROUPS,
    )
}

/// HAProxy as a proxy: one thread, both certificates, every request to one
/// server over keep-alive HTTP/1.1 (`http-reuse always`: idle server
/// connections are shared by all client connections, as nginx's and
/// tlsgate's pools are), the usual forwarding headers, default buffers;
/// the PROXY protocol prefix to the upstream's other port with a v2
/// header on each connection (`send-proxy-v2`).
pub fn haproxy_proxy_config(m: &Materials, addr: SocketAddr, upstream: ProxyUpstream) -> String {
    format!(
        r#"{head}
frontend bench
    bind {addr} ssl crt {ecdsa} crt {rsa} alpn http/1.1
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    use_backend upstream_pp if {{ path_beg {PROXY_PROTOCOL_PREFIX} }}
    default_backend upstream

backend upstream
    http-reuse always
    server u1 {plain}

# Connections that carry a client's header are private to its connection.
backend upstream_pp
    http-reuse always
    server u2 {pp} send-proxy-v2
"#,
        head = haproxy_head(""),
        plain = upstream.plain,
        pp = upstream.proxy_protocol,
        ecdsa = m.ecdsa.combined.display(),
        rsa = m.rsa.combined.display(),
    )
}

/// HAProxy as a TLS relay (`mode tcp`): one thread, both certificates,
/// each client connection's decrypted bytes relayed to the upstream's
/// plain port on a connection of its own, nothing parsed, no forwarding
/// headers; its `mode tcp` overrides the HTTP defaults of the head.
pub fn haproxy_relay_config(m: &Materials, addr: SocketAddr, upstream: ProxyUpstream) -> String {
    format!(
        r#"{head}
frontend relay
    mode tcp
    bind {addr} ssl crt {ecdsa} crt {rsa} alpn http/1.1
    default_backend upstream

backend upstream
    mode tcp
    server u1 {plain}
"#,
        head = haproxy_head(""),
        plain = upstream.plain,
        ecdsa = m.ecdsa.combined.display(),
        rsa = m.rsa.combined.display(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// tlsgate-inproc is tlsgate with its keys in the worker, and nothing
    /// else changed; the config parses as tlsgate's own.
    #[test]
    fn inproc_differs_from_tlsgate_only_by_key_isolation() {
        let m = Materials::create().unwrap();
        let settings = TargetSettings {
            core: None,
            max_file: 1 << 10,
            tlsgate_bin: PathBuf::from("tlsgate"),
            tlsgate_offload: tlsgate_config::OffloadPolicy::Auto,
            proxy_to: None,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 1));
        let isolated = tlsgate_config(&m, addr, &settings, false);
        let inproc = tlsgate_config(&m, addr, &settings, true);
        assert_eq!(
            inproc.replace("key_isolation = false\n", ""),
            isolated,
            "{inproc}"
        );
        for (text, isolation) in [(&isolated, true), (&inproc, false)] {
            let path = m.dir().join("check.toml");
            fs::write(&path, text).unwrap();
            let config = tlsgate_config::load(Some(&path), &Default::default(), m.dir()).unwrap();
            assert_eq!(config.keys.isolation, isolation, "{text}");
        }
    }
}
