//! The `proxy` scenario: each target as a reverse proxy — TLS 1.3 from the
//! generator, plain keep-alive HTTP/1.1 to one upstream shared by all of
//! them — measuring the proxy's own CPU per request (its process tree
//! only), its rate and latency, for keep-alive 1 KiB and 64 KiB GETs and
//! for a new TLS connection per request; and 1 KiB both ways again through
//! a pool that begins each upstream connection with a PROXY protocol v2
//! header (tlsgate's `proxy_protocol`, HAProxy's `send-proxy-v2`; nginx's
//! HTTP proxy cannot send one), where each client connection needs an
//! upstream connection of its own.
//!
//! The upstream is an nginx serving the bench's files over plain HTTP (one
//! worker, `sendfile`, `open_file_cache`, no access log): cheap per
//! request, so the proxy under test is the bottleneck, and the same
//! server for every proxy. It runs on the generator's core, so the proxy
//! has the server core to itself; its CPU per request and the generator
//! core's busy share are reported beside the proxy's figures, and a cell
//! whose generator core was saturated while the proxy was not is marked
//! generator-bound.
//!
//! Beside the proxies, where nginx or HAProxy is compared, a TLS relay
//! (HAProxy in `mode tcp`) in the keep-alive cases: TLS terminated, bytes
//! relayed, no HTTP read. What it costs per request is what any proxy
//! pays on this machine before it does any HTTP work.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tlsgate_loadgen::{HandshakeJob, Pacing, TlsProfile, TransferJob};

use crate::error::BenchError;
use crate::materials::{Materials, SERVER_NAME};
use crate::proc::ProcessTree;
use crate::report::Results;
use crate::runner::{Beside, Job, Runner};
use crate::scenario::BenchOptions;
use crate::targets::{
    find, free_port, nginx_head, program_version, write, Probe, ProxyUpstream, ServerProcess,
    Target, TargetKind, PROXY_PROTOCOL_PREFIX,
};

/// The scenario's name in results.
pub const SCENARIO: &str = "proxy";

/// The plain-HTTP upstream every proxy forwards to.
pub struct Upstream {
    server: ServerProcess,
    /// Its port that requires a PROXY protocol header.
    proxy_protocol: SocketAddr,
}

impl Upstream {
    /// Starts nginx on a free port of 127.0.0.1, pinned to `core`, and
    /// checks that it serves `probe` (a path under the root).
    pub fn start(
        materials: &Materials,
        core: Option<usize>,
        probe: &str,
    ) -> Result<Self, BenchError> {
        let program = find("nginx", &["/usr/sbin/nginx"])?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let proxy_protocol = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let dir = materials.dir().join("upstream");
        fs::create_dir_all(&dir).map_err(BenchError::io(&dir))?;
        let conf = dir.join("nginx.conf");
        let upstream = ProxyUpstream {
            plain: addr,
            proxy_protocol,
        };
        write(&conf, &upstream_config(materials, upstream, &dir))?;
        let args = [
            "-p".to_string(),
            dir.display().to_string(),
            "-c".to_string(),
            conf.display().to_string(),
        ];
        let version = program_version(&program, &["-v"]);
        let server = ServerProcess::start(
            "upstream nginx".into(),
            &program,
            &args,
            core,
            addr,
            &dir,
            version,
            |addr| match get_status(addr, probe) {
                Ok(200) => Probe::Ready,
                Ok(code) => Probe::Failed(format!("GET {probe} answered {code}, not 200")),
                Err(e) => Probe::NotYet(format!("GET {probe}: {e}")),
            },
        )?;
        Ok(Self {
            server,
            proxy_protocol,
        })
    }

    /// Where it listens: plain, and with PROXY protocol headers.
    pub fn addrs(&self) -> ProxyUpstream {
        ProxyUpstream {
            plain: self.server.addr(),
            proxy_protocol: self.proxy_protocol,
        }
    }

    /// Its processes.
    pub fn tree(&self) -> &ProcessTree {
        self.server.tree()
    }

    /// Its version line.
    pub fn version(&self) -> &str {
        self.server.version()
    }
}

/// One plain HTTP/1.0 GET: the status code.
fn get_status(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {SERVER_NAME}\r\n\r\n")?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head)?;
    std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))
}

/// The upstream: nginx, one worker, the bench's root over plain HTTP/1.1,
/// keep-alive without limit, file descriptors cached; on its second port
/// the same files under the PROXY protocol prefix, each connection opened
/// by a PROXY protocol header.
pub fn upstream_config(m: &Materials, at: ProxyUpstream, dir: &std::path::Path) -> String {
    format!(
        r#"{head}    open_file_cache max=64 inactive=1h;
    server {{
        listen {plain};
        root {root};
    }}
    server {{
        listen {pp} proxy_protocol;
        location {PROXY_PROTOCOL_PREFIX} {{
            alias {root}/;
        }}
    }}
}}
"#,
        head = nginx_head(dir),
        plain = at.plain,
        pp = at.proxy_protocol,
        root = m.root.display(),
    )
}

/// A case of the scenario.
#[derive(Clone, Copy)]
enum Load {
    /// Keep-alive GETs of a file of this size.
    KeepAlive(u64),
    /// A new TLS 1.3 connection (full handshake) per 1 KiB GET.
    NewConnection,
}

#[derive(Clone, Copy)]
struct Case {
    load: Load,
    /// To the upstream's PROXY protocol port, a v2 header on each
    /// upstream connection (which is then its client connection's alone).
    proxy_protocol: bool,
}

/// What the label of a PROXY protocol case ends with.
const PROXY_PROTOCOL_SUFFIX: &str = ", PROXY protocol v2 upstream";

impl Case {
    fn label(&self) -> String {
        let load = match self.load {
            Load::KeepAlive(size) => format!("{}{KEEP_ALIVE_SUFFIX}", size_label(size)),
            Load::NewConnection => "1 KiB, new TLS 1.3 connection per request".into(),
        };
        if self.proxy_protocol {
            format!("{load}{PROXY_PROTOCOL_SUFFIX}")
        } else {
            load
        }
    }
}

fn size_label(size: u64) -> String {
    format!("{} KiB", size >> 10)
}

/// The cases' labels, in order (for the report and its checks).
pub fn case_labels() -> Vec<String> {
    cases().iter().map(Case::label).collect()
}

/// Whether the case labelled `case` is measured on `target`: the PROXY
/// protocol cases only where the target can send the header; the TLS
/// relay only in the keep-alive cases, where each of its client
/// connections keeps one upstream connection as the proxies' pools do
/// (with a new connection per request it would also pay an upstream
/// connection per request, which the proxies do not).
pub fn measures(case: &str, target: TargetKind) -> bool {
    if target == TargetKind::HaproxyRelay {
        return case.ends_with(KEEP_ALIVE_SUFFIX);
    }
    !case.ends_with(PROXY_PROTOCOL_SUFFIX) || target.sends_proxy_protocol()
}

/// What the label of a plain keep-alive case ends with.
const KEEP_ALIVE_SUFFIX: &str = " keep-alive";

/// The targets of the scenario: those asked for and, where nginx or
/// HAProxy is among them, the TLS relay, the floor their ratios are read
/// against.
pub fn scenario_targets(asked: &[TargetKind]) -> Vec<TargetKind> {
    let mut out = asked.to_vec();
    let compared = asked
        .iter()
        .any(|t| matches!(t, TargetKind::Nginx | TargetKind::Haproxy));
    if compared && !out.contains(&TargetKind::HaproxyRelay) {
        out.push(TargetKind::HaproxyRelay);
    }
    out
}

fn cases() -> [Case; 5] {
    let plain = |load| Case {
        load,
        proxy_protocol: false,
    };
    let pp = |load| Case {
        load,
        proxy_protocol: true,
    };
    [
        plain(Load::KeepAlive(1 << 10)),
        plain(Load::KeepAlive(64 << 10)),
        plain(Load::NewConnection),
        pp(Load::KeepAlive(1 << 10)),
        pp(Load::NewConnection),
    ]
}

/// Runs the cases against every target, each proxying to one upstream;
/// for each repeat, for each case, every target in turn (rotating).
pub fn run(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let small = materials.file(1 << 10)?;
    let large = materials.file(64 << 10)?;
    let client_core = opts.placement.client_cores.first().copied().flatten();
    let upstream = Upstream::start(materials, client_core, &small)?;
    results.versions.insert(
        "upstream".into(),
        format!("{} (plain HTTP)", upstream.version()),
    );
    let mut settings = opts.settings(64 << 10);
    settings.proxy_to = Some(upstream.addrs());
    let mut targets = Vec::new();
    for kind in &scenario_targets(&opts.targets) {
        let t = Target::start(*kind, materials, &settings)?;
        results
            .versions
            .insert(kind.to_string(), t.version().to_string());
        targets.push(t);
    }
    let beside = Beside {
        tree: upstream.tree(),
        client_core,
    };
    let cases = cases();
    let n = targets.len();
    for repeat in 0..opts.repeats {
        for (ci, case) in cases.iter().enumerate() {
            for k in 0..n {
                let t = &mut targets[(k + ci + repeat) % n];
                let name = case.label();
                if !measures(&name, t.kind()) {
                    continue;
                }
                let path = |p: &str| {
                    if case.proxy_protocol {
                        format!("{}{}", PROXY_PROTOCOL_PREFIX.trim_end_matches('/'), p)
                    } else {
                        p.to_string()
                    }
                };
                tracing::info!(
                    "bench {SCENARIO} [{}/{}] {name} → {}",
                    repeat + 1,
                    opts.repeats,
                    t.kind()
                );
                let job = match case.load {
                    Load::KeepAlive(size) => Job::Transfer(TransferJob {
                        addr: t.addr(),
                        server_name: SERVER_NAME.into(),
                        profile: TlsProfile::tls13_ecdsa(),
                        path: path(if size == 1 << 10 { &small } else { &large }),
                        connections: opts.proxy_connections,
                        window: opts.window(),
                        cores: opts.placement.client_cores.clone(),
                        per_second: None,
                        busy_poll: false,
                    }),
                    Load::NewConnection => Job::Handshake(HandshakeJob {
                        addr: t.addr(),
                        server_name: SERVER_NAME.into(),
                        profile: TlsProfile::tls13_ecdsa(),
                        path: path(&small),
                        pacing: Pacing::Closed {
                            concurrency: opts.proxy_connections,
                        },
                        window: opts.window(),
                        cores: opts.placement.client_cores.clone(),
                        busy_poll: false,
                    }),
                };
                let cell = Runner::measure_beside(t, Some(&beside), SCENARIO, &name, repeat, job)?;
                results.cells.push(cell);
            }
        }
    }
    Ok(())
}
