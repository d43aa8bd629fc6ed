//! The `proxy` scenario: each target as a reverse proxy — TLS 1.3 from the
//! generator, plain keep-alive HTTP/1.1 to one upstream shared by all of
//! them — measuring the proxy's own CPU per request (its process tree
//! only), its rate and latency, for keep-alive 1 KiB and 64 KiB GETs and
//! for a new TLS connection per request.
//!
//! The upstream is an nginx serving the bench's files over plain HTTP (one
//! worker, `sendfile`, `open_file_cache`, no access log): cheap per
//! request, so the proxy under test is the bottleneck, and the same
//! server for every proxy. It runs on the generator's core, so the proxy
//! has the server core to itself; its CPU per request and the generator
//! core's busy share are reported beside the proxy's figures, and a cell
//! whose generator core was saturated while the proxy was not is marked
//! generator-bound.

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
    find, free_port, nginx_head, program_version, write, Probe, ServerProcess, Target,
};

/// The scenario's name in results.
pub const SCENARIO: &str = "proxy";

/// The plain-HTTP upstream every proxy forwards to.
pub struct Upstream(ServerProcess);

impl Upstream {
    /// Starts nginx on a free port of 127.0.0.1, pinned to `core`, and
    /// checks that it serves `probe` (a path under the root).
    pub fn start(
        materials: &Materials,
        core: Option<usize>,
        probe: &str,
    ) -> Result<Self, BenchError> {
        let program = find("nginx", &["/usr/sbin/nginx"])?;
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = materials.dir().join("upstream");
        fs::create_dir_all(&dir).map_err(BenchError::io(&dir))?;
        let conf = dir.join("nginx.conf");
        write(&conf, &upstream_config(materials, addr, &dir))?;
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
        Ok(Self(server))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Its processes.
    pub fn tree(&self) -> &ProcessTree {
        self.0.tree()
    }

    /// Its version line.
    pub fn version(&self) -> &str {
        self.0.version()
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
/// keep-alive without limit, file descriptors cached.
pub fn upstream_config(m: &Materials, addr: SocketAddr, dir: &std::path::Path) -> String {
    format!(
        r#"{head}    open_file_cache max=64 inactive=1h;
    server {{
        listen {addr};
        root {root};
    }}
}}
"#,
        head = nginx_head(dir),
        root = m.root.display(),
    )
}

/// A case of the scenario.
enum Case {
    /// Keep-alive GETs of a file of this size.
    KeepAlive(u64),
    /// A new TLS 1.3 connection (full handshake) per 1 KiB GET.
    NewConnection,
}

impl Case {
    fn label(&self) -> String {
        match self {
            Case::KeepAlive(size) => format!("{} keep-alive", size_label(*size)),
            Case::NewConnection => "1 KiB, new TLS 1.3 connection per request".into(),
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

fn cases() -> [Case; 3] {
    [
        Case::KeepAlive(1 << 10),
        Case::KeepAlive(64 << 10),
        Case::NewConnection,
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
    settings.proxy_to = Some(upstream.addr());
    let mut targets = Vec::new();
    for kind in &opts.targets {
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
                tracing::info!(
                    "bench {SCENARIO} [{}/{}] {name} → {}",
                    repeat + 1,
                    opts.repeats,
                    t.kind()
                );
                let job = match case {
                    Case::KeepAlive(size) => Job::Transfer(TransferJob {
                        addr: t.addr(),
                        server_name: SERVER_NAME.into(),
                        profile: TlsProfile::tls13_ecdsa(),
                        path: if *size == 1 << 10 {
                            small.clone()
                        } else {
                            large.clone()
                        },
                        connections: opts.proxy_connections,
                        window: opts.window(),
                        cores: opts.placement.client_cores.clone(),
                    }),
                    Case::NewConnection => Job::Handshake(HandshakeJob {
                        addr: t.addr(),
                        server_name: SERVER_NAME.into(),
                        profile: TlsProfile::tls13_ecdsa(),
                        path: small.clone(),
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
