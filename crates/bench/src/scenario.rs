//! The scenarios and how they interleave the targets: for each repeat, for
//! each case, every target in turn (rotating who goes first), so slow drift
//! of a shared machine hits all of them alike.

use std::path::PathBuf;
use std::time::Duration;

use tlsgate_loadgen::{
    Cipher, Group, HandshakeJob, KeyType, Pacing, StreamJob, TlsProfile, TransferJob, Version,
    Window,
};

use crate::bound::Bounds;
use crate::error::BenchError;
use crate::materials::{size_name, Materials, SERVER_NAME};
use crate::report::{Machine, Results};
use crate::runner::{Job, Placement, Runner};
use crate::targets::{Target, TargetKind, TargetSettings};

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// New connection per request, full and resumed, 1.2 and 1.3, ECDSA and RSA.
    Handshake,
    /// Keep-alive GETs of growing files.
    Transfer,
    /// Many connections fetching 1 MiB every 1–5 s.
    Stream,
    /// The physical floor.
    Bound,
    /// openssl s_time and wrk against the same targets.
    CrossCheck,
    /// HTTP/2 with h2load: small files over many streams, and 1 MiB files.
    H2,
    /// Each target as a reverse proxy to one plain-HTTP upstream.
    Proxy,
}

impl Scenario {
    /// Parses a scenario name.
    pub fn parse(s: &str) -> Option<Vec<Self>> {
        Some(match s {
            "handshake" => vec![Self::Bound, Self::Handshake],
            "transfer" => vec![Self::Transfer],
            "stream" => vec![Self::Stream],
            "bound" => vec![Self::Bound],
            "crosscheck" => vec![Self::CrossCheck],
            "h2" => vec![Self::H2],
            "proxy" => vec![Self::Proxy],
            "all" => vec![
                Self::Bound,
                Self::Handshake,
                Self::Transfer,
                Self::Stream,
                Self::CrossCheck,
                Self::H2,
                Self::Proxy,
            ],
            _ => return None,
        })
    }
}

/// Everything a bench run can be told.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Short smoke run.
    pub quick: bool,
    /// Targets, in order.
    pub targets: Vec<TargetKind>,
    /// Repeats of every cell (medians are reported).
    pub repeats: usize,
    /// Rounds of the cross-check. Its verdict compares a ratio of two
    /// 3 s cells with another such ratio, within 15 %: three rounds
    /// disagreed in 5 of 15 checks on 2026-11-27 where five agreed in
    /// all 6 (docs/bench.md, "The cross-check with the new generator").
    pub crosscheck_rounds: usize,
    /// Warm-up of each cell.
    pub warmup: Duration,
    /// Measurement window of each cell.
    pub measure: Duration,
    /// Connections in flight in the handshake scenario.
    pub handshake_concurrency: usize,
    /// Handshake kinds (labels as `TlsProfile::label`).
    pub handshake_kinds: Vec<TlsProfile>,
    /// Connections in the transfer scenario.
    pub transfer_connections: usize,
    /// File sizes of the transfer scenario.
    pub sizes: Vec<u64>,
    /// Connection counts of the stream scenario.
    pub stream_connections: Vec<usize>,
    /// Window of each stream point.
    pub stream_measure: Duration,
    /// Connection counts of the stream scenario's idle points (keep-alive
    /// connections after one 1 KiB GET each, measured for memory).
    pub idle_connections: Vec<usize>,
    /// Client connections in the proxy scenario (each with one request in
    /// flight, or one handshake in progress).
    pub proxy_connections: usize,
    /// Cores.
    pub placement: Placement,
    /// The tlsgate binary to run as a target.
    pub tlsgate_bin: PathBuf,
    /// tlsgate's kernel-TLS policy (`offload` of its listener).
    pub tlsgate_offload: tlsgate_config::OffloadPolicy,
    /// Measure key isolation's cost: tlsgate-inproc beside tlsgate in the
    /// handshake and crosscheck scenarios.
    pub isolation_cost: bool,
}

/// The eight handshake kinds: {1.3, 1.2} × {ECDSA, RSA} × {full, resumed}.
pub fn handshake_kinds() -> Vec<TlsProfile> {
    let mut v = Vec::new();
    for key in [KeyType::EcdsaP256, KeyType::Rsa2048] {
        for version in [Version::Tls13, Version::Tls12] {
            for resume in [false, true] {
                v.push(TlsProfile {
                    version,
                    key,
                    cipher: Cipher::Aes128Gcm,
                    group: Group::X25519,
                    resume,
                    client_identity: None,
                });
            }
        }
    }
    v
}

impl BenchOptions {
    /// Defaults for a full run, or a quick smoke run of seconds.
    pub fn new(quick: bool, tlsgate_bin: PathBuf) -> Self {
        Self {
            quick,
            targets: TargetKind::ALL.to_vec(),
            repeats: if quick { 1 } else { 3 },
            crosscheck_rounds: if quick { 1 } else { 5 },
            warmup: Duration::from_millis(if quick { 200 } else { 1000 }),
            measure: Duration::from_millis(if quick { 500 } else { 3000 }),
            handshake_concurrency: 32,
            handshake_kinds: handshake_kinds(),
            // Quick runs are short: 100 connections × 10 MiB would not
            // finish a response inside a sub-second window on a busy machine.
            transfer_connections: if quick { 10 } else { 100 },
            sizes: vec![
                1 << 10,
                4 << 10,
                16 << 10,
                64 << 10,
                256 << 10,
                1 << 20,
                10 << 20,
            ],
            stream_connections: if quick {
                vec![200]
            } else {
                vec![1000, 2500, 5000, 10000]
            },
            stream_measure: Duration::from_secs(if quick { 2 } else { 10 }),
            idle_connections: if quick { vec![200] } else { vec![10_000] },
            proxy_connections: if quick { 4 } else { 16 },
            placement: Placement::detect(),
            tlsgate_bin,
            tlsgate_offload: tlsgate_config::OffloadPolicy::Auto,
            isolation_cost: true,
        }
    }

    /// The targets of handshake cells: tlsgate with its keys in-process
    /// too, beside tlsgate, so every run measures what key isolation costs.
    pub fn handshake_targets(&self) -> Vec<TargetKind> {
        let mut out = Vec::new();
        for kind in &self.targets {
            out.push(*kind);
            if self.isolation_cost
                && *kind == TargetKind::Tlsgate
                && !self.targets.contains(&TargetKind::TlsgateKeysInProcess)
            {
                out.push(TargetKind::TlsgateKeysInProcess);
            }
        }
        out
    }

    /// How targets are started under these options.
    pub fn settings(&self, max_file: u64) -> TargetSettings {
        TargetSettings {
            core: self.placement.server_core,
            max_file,
            tlsgate_bin: self.tlsgate_bin.clone(),
            tlsgate_offload: self.tlsgate_offload,
            proxy_to: None,
        }
    }

    /// The warm-up and window of one cell.
    pub fn window(&self) -> Window {
        Window {
            warmup: self.warmup,
            measure: self.measure,
        }
    }
}

/// Runs the scenarios and returns everything measured.
pub fn run(scenarios: &[Scenario], opts: &BenchOptions) -> Result<Results, BenchError> {
    let placement = format!(
        "server pinned to core {}, generator on {}",
        opts.placement
            .server_core
            .map_or("(none)".into(), |c| c.to_string()),
        opts.placement
            .client_cores
            .iter()
            .map(|c| c.map_or("(any)".into(), |c| format!("core {c}")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut results = Results::new(Machine::detect(placement), opts.quick);
    let materials = Materials::create()?;
    for s in scenarios {
        match s {
            Scenario::Bound => {
                tracing::info!("bench bound: cryptography and TCP floor");
                results.bounds = Some(Bounds::measure(
                    opts.placement.server_core,
                    opts.placement.client_cores.first().copied().flatten(),
                    opts.quick,
                )?);
            }
            Scenario::Handshake => handshake(&materials, opts, &mut results)?,
            Scenario::Transfer => transfer(&materials, opts, &mut results)?,
            Scenario::Stream => stream(&materials, opts, &mut results)?,
            Scenario::CrossCheck => {
                results.summarize();
                crate::crosscheck::run(&materials, opts, &mut results)?
            }
            Scenario::H2 => crate::h2::run(&materials, opts, &mut results)?,
            Scenario::Proxy => crate::proxy::run(&materials, opts, &mut results)?,
        }
        results.summarize();
    }
    Ok(results)
}

fn start_all(
    materials: &Materials,
    opts: &BenchOptions,
    max_file: u64,
    results: &mut Results,
) -> Result<Vec<Target>, BenchError> {
    start_these(&opts.targets, materials, opts, max_file, results)
}

fn start_these(
    kinds: &[TargetKind],
    materials: &Materials,
    opts: &BenchOptions,
    max_file: u64,
    results: &mut Results,
) -> Result<Vec<Target>, BenchError> {
    let mut targets = Vec::new();
    for kind in kinds {
        let t = Target::start(*kind, materials, &opts.settings(max_file))?;
        results
            .versions
            .insert(kind.to_string(), t.version().to_string());
        targets.push(t);
    }
    Ok(targets)
}

/// Which servers the cells of a scenario measure.
#[derive(Clone, Copy)]
enum Servers<'a> {
    /// The same server of each target for every cell: CPU is measured,
    /// and a warm server is what is meant.
    Kept,
    /// A server started afresh for every cell: memory is measured, and
    /// what an earlier cell left in the allocator would count in this one
    /// (freed pages that jemalloc keeps for a while, glibc's heap, which
    /// nginx never gives back after a peak: measured at 1 GB through every
    /// later cell after one stream repeat had needed it).
    Fresh(&'a Materials, &'a TargetSettings),
}

/// Runs `cases` × targets × repeats, interleaved.
#[allow(clippy::too_many_arguments)]
fn interleave<C>(
    targets: &mut [Target],
    opts: &BenchOptions,
    scenario: &str,
    servers: Servers<'_>,
    cases: &[C],
    label: impl Fn(&C) -> String,
    job: impl Fn(&C, &Target) -> Job,
    results: &mut Results,
) -> Result<(), BenchError> {
    let n = targets.len();
    for repeat in 0..opts.repeats {
        for (ci, case) in cases.iter().enumerate() {
            for k in 0..n {
                let t = &mut targets[(k + ci + repeat) % n];
                let name = label(case);
                tracing::info!(
                    "bench {scenario} [{}/{}] {name} → {}",
                    repeat + 1,
                    opts.repeats,
                    t.kind()
                );
                if let Servers::Fresh(materials, settings) = servers {
                    t.restart(materials, settings)?;
                }
                let j = job(case, t);
                let cell = Runner::measure(t, scenario, &name, repeat, j)?;
                results.cells.push(cell);
            }
        }
    }
    Ok(())
}

fn handshake(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let path = materials.file(1 << 10)?;
    let kinds = opts.handshake_targets();
    let mut targets = start_these(&kinds, materials, opts, 1 << 10, results)?;
    saturated_handshakes(&mut targets, &path, opts, results)?;
    latency_at_half_nginx(&mut targets, &path, opts, results)
}

/// Latency at a fixed arrival rate — half of nginx's maximum full TLS 1.3
/// ECDSA handshake rate — for every target (open loop, so a slow server
/// cannot slow the arrivals down and hide its queueing).
fn latency_at_half_nginx(
    targets: &mut [Target],
    path: &str,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let profile = TlsProfile::tls13_ecdsa();
    results.summarize();
    let Some(nginx) = results.summary("handshake", &profile.label(), TargetKind::Nginx) else {
        return Ok(());
    };
    let rate = (nginx.ops_per_sec / 2.0).max(1.0);
    interleave(
        targets,
        opts,
        "latency",
        Servers::Kept,
        &[rate],
        |r| format!("{} at {r:.0}/s (half nginx's max)", profile.label()),
        |r, t| {
            Job::Handshake(HandshakeJob {
                addr: t.addr(),
                server_name: SERVER_NAME.into(),
                profile: profile.clone(),
                path: path.to_string(),
                pacing: Pacing::Open {
                    per_second: *r,
                    max_in_flight: 4096,
                },
                window: opts.window(),
                cores: opts.placement.client_cores.clone(),
                busy_poll: false,
            })
        },
        results,
    )
}

/// Closed loop: the maximum rate and its CPU per handshake.
fn saturated_handshakes(
    targets: &mut [Target],
    path: &str,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    interleave(
        targets,
        opts,
        "handshake",
        Servers::Kept,
        &opts.handshake_kinds,
        TlsProfile::label,
        |profile, t| {
            Job::Handshake(HandshakeJob {
                addr: t.addr(),
                server_name: SERVER_NAME.into(),
                profile: profile.clone(),
                path: path.to_string(),
                pacing: Pacing::Closed {
                    concurrency: opts.handshake_concurrency,
                },
                window: opts.window(),
                cores: opts.placement.client_cores.clone(),
                busy_poll: false,
            })
        },
        results,
    )
}

fn transfer(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let mut paths = Vec::new();
    for size in &opts.sizes {
        paths.push((*size, materials.file(*size)?));
    }
    let max = opts.sizes.iter().copied().max().unwrap_or(1 << 10);
    let mut targets = start_all(materials, opts, max, results)?;
    interleave(
        &mut targets,
        opts,
        "transfer",
        Servers::Kept,
        &paths,
        |(size, _)| size_name(*size),
        |(_, path), t| {
            Job::Transfer(TransferJob {
                addr: t.addr(),
                server_name: SERVER_NAME.into(),
                profile: TlsProfile::tls13_ecdsa(),
                path: path.clone(),
                connections: opts.transfer_connections,
                window: opts.window(),
                cores: opts.placement.client_cores.clone(),
                per_second: None,
                busy_poll: false,
            })
        },
        results,
    )
}

fn stream(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let path = materials.file(1 << 20)?;
    let ceiling = crate::targets::connection_ceiling();
    let points: Vec<usize> = opts
        .stream_connections
        .iter()
        .map(|c| {
            if *c > ceiling {
                tracing::warn!(
                    "stream: {c} connections exceed what every target can hold under this \
                     machine's descriptor limit; measuring {ceiling}"
                );
            }
            (*c).min(ceiling)
        })
        .collect();
    // Made before the targets start: HAProxy serves the files it was
    // configured with.
    let small = materials.file(1 << 10)?;
    let mut targets = start_all(materials, opts, 1 << 20, results)?;
    let settings = opts.settings(1 << 20);
    let fresh = Servers::Fresh(materials, &settings);
    let interval = (Duration::from_secs(1), Duration::from_secs(5));
    interleave(
        &mut targets,
        opts,
        "stream",
        fresh,
        &points,
        |c| format!("{c}"),
        |connections, t| {
            // Time to open every connection (a few thousand handshakes a
            // second), then one whole interval so fetches spread out.
            let warmup = Duration::from_secs_f64(*connections as f64 / 1500.0)
                + if opts.quick {
                    Duration::from_secs(1)
                } else {
                    interval.1
                };
            Job::Stream(StreamJob {
                addr: t.addr(),
                server_name: SERVER_NAME.into(),
                profile: TlsProfile::tls13_ecdsa(),
                path: path.clone(),
                connections: *connections,
                interval,
                connect_concurrency: 64,
                window: Window {
                    warmup,
                    measure: opts.stream_measure,
                },
                cores: opts.placement.client_cores.clone(),
                once: false,
            })
        },
        results,
    )?;
    idle(&small, opts, fresh, &mut targets, results)
}

/// The stream scenario's idle points: keep-alive connections that made one
/// 1 KiB GET each and wait, the usual state of most of a busy server's
/// connections; what counts is the memory they take.
fn idle(
    path: &str,
    opts: &BenchOptions,
    servers: Servers<'_>,
    targets: &mut [Target],
    results: &mut Results,
) -> Result<(), BenchError> {
    // One descriptor per connection in each of the bench and the target,
    // except HAProxy's two: only HAProxy is held to the lower ceiling.
    let most = |kind: TargetKind| match kind {
        TargetKind::Haproxy => crate::targets::connection_ceiling(),
        _ => crate::targets::fd_limit().saturating_sub(400) as usize,
    };
    interleave(
        targets,
        opts,
        IDLE,
        servers,
        &opts.idle_connections,
        |c| format!("{c}"),
        |connections, t| {
            let connections = (*connections).min(most(t.kind()));
            Job::Stream(StreamJob {
                addr: t.addr(),
                server_name: SERVER_NAME.into(),
                profile: TlsProfile::tls13_ecdsa(),
                path: path.into(),
                connections,
                interval: (Duration::from_secs(1), Duration::from_secs(1)),
                connect_concurrency: 64,
                window: Window {
                    warmup: Duration::from_secs_f64(connections as f64 / 1500.0)
                        + Duration::from_secs(2),
                    measure: Duration::from_secs(2),
                },
                cores: opts.placement.client_cores.clone(),
                once: true,
            })
        },
        results,
    )
}

/// The idle points' scenario name in the results.
pub const IDLE: &str = "idle";
