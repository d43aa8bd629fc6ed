//! Calibration and validation: both measure tlsgate with the bench's
//! generator, pinned, server CPU from /proc, medians over repeats.

use std::time::Duration;

use serde::Serialize;
use tlsgate_bench::materials::{Materials, MTLS_SERVER_NAME, SERVER_NAME};
use tlsgate_bench::report::{median, Machine};
use tlsgate_bench::runner::Job;
use tlsgate_bench::scenario::handshake_kinds;
use tlsgate_bench::{BenchOptions, Cell, Runner, Target, TargetKind};
use tlsgate_loadgen::{Cipher, Group, HandshakeJob, KeyType, Pacing, TlsProfile, Version, Window};

use crate::model::{cipher_name, CostError, Model, Workload};

const SMALL: u64 = 1 << 10;
/// Bytes of a connection at the ramp's cost: about where TCP's send
/// buffer has grown on loopback (see docs/bench.md).
const RAMP: u64 = 1 << 20;
/// The bulk transaction: larger than the last-level cache, so the file's
/// pages come from memory as they do for a large working set.
fn bulk(quick: bool) -> u64 {
    if quick {
        8 << 20
    } else {
        64 << 20
    }
}
/// Big transactions in flight at once: few, so each moves many bytes.
const BIG_CONCURRENCY: usize = 4;

fn handshake_job(
    t: &Target,
    profile: TlsProfile,
    path: &str,
    concurrency: usize,
    window: Window,
    opts: &BenchOptions,
) -> Job {
    // The bench's tlsgate requires client certificates under its second name.
    let server_name = if profile.client_identity.is_some() {
        MTLS_SERVER_NAME
    } else {
        SERVER_NAME
    };
    Job::Handshake(HandshakeJob {
        addr: t.addr(),
        server_name: server_name.into(),
        profile,
        path: path.into(),
        pacing: Pacing::Closed { concurrency },
        window,
        cores: opts.placement.client_cores.clone(),
    })
}

fn repeat(
    opts: &BenchOptions,
    t: &mut Target,
    case: &str,
    job: impl Fn(&Target) -> Job,
) -> Result<Vec<Cell>, CostError> {
    let mut cells = Vec::new();
    for r in 0..opts.repeats {
        tracing::info!("cost: {case} [{}/{}]", r + 1, opts.repeats);
        let j = job(t);
        cells.push(Runner::measure(t, "cost", case, r, j)?);
    }
    Ok(cells)
}

/// A window that holds many big transactions.
fn big_window(opts: &BenchOptions) -> Window {
    Window {
        warmup: opts.warmup,
        measure: opts
            .measure
            .max(Duration::from_secs(if opts.quick { 1 } else { 5 })),
    }
}

/// Transactions in a cell. Big ones cut by the window's edges still cost
/// CPU inside it: they are counted by the bytes that arrived.
fn transactions(c: &Cell, size: u64) -> f64 {
    if size >= RAMP {
        c.load.bytes as f64 / size as f64
    } else {
        c.load.operations as f64
    }
}

/// Measures the model's coefficients on this machine against tlsgate.
pub fn calibrate(opts: &BenchOptions) -> Result<Model, CostError> {
    let materials = Materials::create()?;
    let bulk_size = bulk(opts.quick);
    let small = materials.file(SMALL)?;
    let ramp = materials.file(RAMP)?;
    let bulk = materials.file(bulk_size)?;
    let mut target = Target::start(TargetKind::Tlsgate, &materials, &opts.settings(bulk_size))?;
    let mut model = Model {
        machine: {
            let m = Machine::detect(String::new());
            format!("{}, {} cores, kernel {}", m.cpu, m.cores, m.kernel)
        },
        date: Machine::detect(String::new()).date,
        server: target.version().to_string(),
        handshake_us: Default::default(),
        byte_ns: Default::default(),
        ramp_byte_ns: Default::default(),
        ramp_bytes: 0.0,
        handshake_response_bytes: 0.0,
    };
    let mut response_bytes = Vec::new();
    let kinds = handshake_kinds();
    let with_client_certs = kinds.iter().map(|p| TlsProfile {
        client_identity: Some(materials.client.clone()),
        ..p.clone()
    });
    let all_kinds: Vec<TlsProfile> = kinds.iter().cloned().chain(with_client_certs).collect();
    for profile in all_kinds {
        let label = profile.label();
        let cells = repeat(opts, &mut target, &label, |t| {
            handshake_job(
                t,
                profile.clone(),
                &small,
                opts.handshake_concurrency,
                opts.window(),
                opts,
            )
        })?;
        model.handshake_us.insert(
            label,
            median(cells.iter().map(|c| c.server_cpu_us_per_op).collect()),
        );
        response_bytes.extend(
            cells
                .iter()
                .map(|c| c.load.bytes as f64 / c.load.operations.max(1) as f64),
        );
    }
    model.handshake_response_bytes = median(response_bytes);
    // Bytes: new connections (full TLS 1.3 ECDSA handshakes) fetching 1 KiB,
    // RAMP and the bulk size; the slopes between them are the two byte
    // coefficients, so the connection's own cost cancels out.
    model.ramp_bytes = RAMP as f64;
    for cipher in [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ] {
        let profile = TlsProfile {
            cipher,
            ..TlsProfile::tls13_ecdsa()
        };
        let name = cipher_name(cipher);
        let mut per_txn = Vec::new();
        for (size, path) in [(SMALL, &small), (RAMP, &ramp), (bulk_size, &bulk)] {
            let case = format!(
                "{name} {} per txn",
                tlsgate_bench::materials::size_name(size)
            );
            let cells = repeat(opts, &mut target, &case, |t| {
                handshake_job(
                    t,
                    profile.clone(),
                    path,
                    BIG_CONCURRENCY,
                    big_window(opts),
                    opts,
                )
            })?;
            per_txn.push(median(
                cells
                    .iter()
                    .map(|c| c.server_cpu_secs * 1e9 / transactions(c, size).max(1e-9))
                    .collect(),
            ));
        }
        let (small_ns, ramp_ns, bulk_ns) = (per_txn[0], per_txn[1], per_txn[2]);
        model
            .ramp_byte_ns
            .insert(name.into(), (ramp_ns - small_ns) / (RAMP - SMALL) as f64);
        model
            .byte_ns
            .insert(name.into(), (bulk_ns - ramp_ns) / (bulk_size - RAMP) as f64);
    }
    Ok(model)
}

/// One validated workload.
#[derive(Debug, Clone, Serialize)]
pub struct ValidationRow {
    /// What was run.
    pub workload: String,
    /// Predicted maximum transactions per second per core.
    pub predicted_tps_per_core: f64,
    /// Measured: transactions per server CPU-second.
    pub measured_tps_per_core: f64,
    /// Transactions per second the server actually reached (wall clock).
    pub measured_tps: f64,
    /// Server core utilization during the measurement.
    pub server_utilization: f64,
    /// (predicted − measured) / measured.
    pub error: f64,
}

/// The validation table.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    /// Rows.
    pub rows: Vec<ValidationRow>,
}

impl Validation {
    /// The largest absolute error.
    pub fn worst_error(&self) -> f64 {
        self.rows.iter().map(|r| r.error.abs()).fold(0.0, f64::max)
    }

    /// A Markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| workload | predicted txn/s per core | measured txn/s per core | measured txn/s | server CPU % | error |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.0} | {:+.1} % |\n",
                r.workload,
                r.predicted_tps_per_core,
                r.measured_tps_per_core,
                r.measured_tps,
                r.server_utilization * 100.0,
                r.error * 100.0
            ));
        }
        out
    }
}

/// Runs workloads unlike the calibration's and compares the model's
/// prediction with measurement: 1 KiB and 100 MiB per transaction, full and
/// resumed, a TLS 1.2 1 MiB one, a ChaCha20 4 MiB one and a 64 KiB one
/// with client certificates.
pub fn validate(model: &Model, opts: &BenchOptions) -> Result<Validation, CostError> {
    let big: u64 = if opts.quick { 8 << 20 } else { 100 << 20 };
    let aes = Cipher::Aes128Gcm;
    // (bytes, version, resumed, cipher, client certificate)
    let workloads: Vec<(u64, Version, bool, Cipher, bool)> = vec![
        (SMALL, Version::Tls13, false, aes, false),
        (SMALL, Version::Tls13, true, aes, false),
        (big, Version::Tls13, false, aes, false),
        (big, Version::Tls13, true, aes, false),
        (1 << 20, Version::Tls12, false, aes, false),
        (
            4 << 20,
            Version::Tls13,
            false,
            Cipher::Chacha20Poly1305,
            false,
        ),
        (64 << 10, Version::Tls13, false, aes, true),
    ];
    let materials = Materials::create()?;
    let mut target = Target::start(TargetKind::Tlsgate, &materials, &opts.settings(big))?;
    let mut rows = Vec::new();
    for (size, version, resumed, cipher, mtls) in workloads {
        let path = materials.file(size)?;
        let profile = TlsProfile {
            version,
            key: KeyType::EcdsaP256,
            cipher,
            group: Group::X25519,
            resume: resumed,
            client_identity: mtls.then(|| materials.client.clone()),
        };
        let name = format!(
            "{} per txn, {} {}",
            tlsgate_bench::materials::size_name(size),
            profile.label(),
            cipher_name(cipher)
        );
        // Big transactions: few in flight, and a window that holds many.
        let (concurrency, window) = if size >= RAMP {
            (BIG_CONCURRENCY, big_window(opts))
        } else {
            (opts.handshake_concurrency, opts.window())
        };
        let cells = repeat(opts, &mut target, &name, |t| {
            handshake_job(t, profile.clone(), &path, concurrency, window, opts)
        })?;
        let txn = |c: &Cell| transactions(c, size);
        let measured = median(
            cells
                .iter()
                .map(|c| txn(c) / c.server_cpu_secs.max(1e-9))
                .collect(),
        );
        let predicted = model
            .predict(&Workload {
                rate: 1.0,
                bytes: size as f64,
                resumed: if resumed { 1.0 } else { 0.0 },
                mtls,
                version,
                key: KeyType::EcdsaP256,
                cipher,
            })?
            .max_tps_per_core;
        rows.push(ValidationRow {
            workload: name,
            predicted_tps_per_core: predicted,
            measured_tps_per_core: measured,
            measured_tps: median(cells.iter().map(|c| txn(c) / c.load.window_secs).collect()),
            server_utilization: median(cells.iter().map(|c| c.server_utilization).collect()),
            error: (predicted - measured) / measured.max(1e-9),
        });
    }
    Ok(Validation { rows })
}
