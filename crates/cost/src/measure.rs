//! Calibration and validation: both measure tlsgate with the bench's
//! generator, pinned, server CPU from /proc, medians over repeats.

use std::time::Duration;

use serde::Serialize;
use tlsgate_bench::materials::{Materials, MTLS_SERVER_NAME, SERVER_NAME};
use tlsgate_bench::report::{median, Machine};
use tlsgate_bench::runner::Job;
use tlsgate_bench::scenario::handshake_kinds;
use tlsgate_bench::speed;
use tlsgate_bench::targets::TLSGATE_SESSION_CACHE;
use tlsgate_bench::{BenchOptions, Cell, Runner, Target, TargetKind};
use tlsgate_loadgen::{Cipher, Group, HandshakeJob, KeyType, Pacing, TlsProfile, Version, Window};
use tlsgate_server::INLINE_BODY_MAX;

use crate::model::{
    cipher_name, curve_key, fill_below_noise, smooth_regime_flips, BytePoint, CostError, Model,
    ReplacedPoint, ReplacedWhy, Workload,
};

/// The response of the handshake measurements.
const SMALL: u64 = 1 << 10;
/// From this size on a transaction is big: few in flight, a long window,
/// counted by the bytes that arrived.
const RAMP: u64 = 1 << 20;

/// The sizes the byte curve is calibrated at, mostly a factor of 4 apart:
/// bodies the server sends inline with the head (up to its
/// [`INLINE_BODY_MAX`], where the path and the CPU per byte change: 64 KiB
/// cost 7 µs more than 1 KiB, a third of the straight 1 KiB–256 KiB line's
/// 16 µs), a new connection's ramp (TCP's send buffer grows through the
/// first megabytes), then sizes that fit the CPU caches and sizes that do
/// not. 2 MiB, inside the ramp, is measured too (validations there had
/// missed by 4–7 %, though the point itself lies near the 1–4 MiB line).
/// `validate` runs sizes between these points, never on one.
fn curve_sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![256 << 10, 1 << 20, 16 << 20]
    } else {
        vec![
            16 << 10,
            INLINE_BODY_MAX,
            256 << 10,
            1 << 20,
            2 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
            256 << 20,
        ]
    }
}
/// Big transactions in flight at once: enough that the handshakes' round
/// trips leave the server no idle gaps (with 4, a 2 MiB workload kept it
/// only ~65 % busy, and idle wake-ups were measured as cost), few enough
/// that each moves many bytes.
const BIG_CONCURRENCY: usize = 16;

fn handshake_job(
    t: &Target,
    profile: TlsProfile,
    path: &str,
    shape: Shape,
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
        pacing: Pacing::Closed {
            concurrency: shape.concurrency,
        },
        window: shape.window,
        cores: opts.placement.client_cores.clone(),
        busy_poll: shape.busy_poll,
    })
}

/// One measured case: its name and the job that measures it once.
struct Case<'a> {
    name: String,
    job: Box<dyn Fn(&Target) -> Job + 'a>,
}

/// A measured cell and the machine's speed around it.
struct Measured {
    cell: Cell,
    /// Reference CPU ns per round ([`speed::reference_ns`]), the mean of
    /// one run just before the cell and one just after.
    reference_ns: f64,
}

impl Measured {
    /// Server CPU seconds at a machine speed of `reference_ns` (the
    /// measured ones when that is 0: a model from before references).
    fn cpu_secs_at(&self, reference_ns: f64) -> f64 {
        if reference_ns > 0.0 && self.reference_ns > 0.0 {
            self.cell.server_cpu_secs * reference_ns / self.reference_ns
        } else {
            self.cell.server_cpu_secs
        }
    }
}

/// Measures every case `opts.repeats` times, interleaved (each repeat
/// runs every case once, in turn), so that a slow spell of a shared
/// machine lands on one repeat of many cases, which the median drops,
/// rather than on every repeat of one case; each cell bracketed by the
/// speed reference on the server's core. The cells of each case, in the
/// order of `cases`.
fn interleaved(
    opts: &BenchOptions,
    t: &mut Target,
    cases: &[Case<'_>],
) -> Result<Vec<Vec<Measured>>, CostError> {
    let core = opts.placement.server_core;
    let mut cells: Vec<Vec<Measured>> = cases.iter().map(|_| Vec::new()).collect();
    for r in 0..opts.repeats {
        for (case, out) in cases.iter().zip(cells.iter_mut()) {
            let j = (case.job)(t);
            let before = speed::reference_ns(core)?;
            let cell = Runner::measure(t, "cost", &case.name, r, j)?;
            let reference_ns = (before + speed::reference_ns(core)?) / 2.0;
            check_failures(&case.name, &cell)?;
            tracing::info!(
                "cost: {} [{}/{}]: {:.3} s server CPU for {} operations and {} bytes; reference {:.0} ns",
                case.name,
                r + 1,
                opts.repeats,
                cell.server_cpu_secs,
                cell.load.operations,
                cell.load.bytes,
                reference_ns
            );
            out.push(Measured { cell, reference_ns });
        }
    }
    Ok(cells)
}

/// Brings a freshly started server to the state of one that has served a
/// while: its TLS 1.2 session cache full (twice turned over). Measured
/// here: with the cache full, every handshake costs 4–9 % more CPU, TLS 1.3
/// ones too, which never touch it (with a cache of 256 the effect is gone;
/// the tens of MB of live entries are the likely cause, not profiled), so a
/// fresh server measured against one whose cache filled mid-run disagreed
/// by that much (docs/bench.md). Calibration and validation both start here.
fn settle(opts: &BenchOptions, t: &mut Target, small: &str) -> Result<(), CostError> {
    let wanted = if opts.quick {
        // A smoke run: exercise the step, not the full turnover.
        1
    } else {
        2 * TLSGATE_SESSION_CACHE as u64
    };
    let profile = TlsProfile {
        version: Version::Tls12,
        ..TlsProfile::tls13_ecdsa()
    };
    // Short windows: only the count matters, checked between them.
    let shape = Shape {
        window: Window {
            warmup: Duration::ZERO,
            measure: Duration::from_millis(if opts.quick { 200 } else { 2000 }),
        },
        ..shape(SMALL, opts)
    };
    let mut done = 0;
    let mut round = 0;
    while done < wanted {
        let cell = Runner::measure(
            t,
            "cost",
            "settling",
            round,
            handshake_job(t, profile.clone(), small, shape, opts),
        )?;
        check_failures("settling", &cell)?;
        if cell.load.operations == 0 {
            return Err(CostError::Settle);
        }
        done += cell.load.operations;
        round += 1;
    }
    tracing::info!(
        "cost: settled: {done} TLS 1.2 full handshakes into a session cache of {TLSGATE_SESSION_CACHE}"
    );
    Ok(())
}

/// Failed operations cost CPU but count no transaction: beyond a few per
/// thousand they skew the figure, and the cell is refused.
fn check_failures(case: &str, c: &Cell) -> Result<(), CostError> {
    let failed = c.load.error_count();
    let total = c.load.operations + failed;
    if failed * 1000 > total * MAX_FAILED_PER_MILLE {
        return Err(CostError::Failures {
            case: case.into(),
            failed,
            total,
            first: c.load.first_error.clone().unwrap_or_default(),
        });
    }
    if failed > 0 {
        tracing::warn!("{case}: {failed} of {total} operations failed");
    }
    Ok(())
}

/// Failed operations a cell may have, per thousand.
const MAX_FAILED_PER_MILLE: u64 = 2;

/// How a transaction size is measured.
#[derive(Debug, Clone, Copy)]
struct Shape {
    concurrency: usize,
    window: Window,
    /// See `HandshakeJob::busy_poll`. Small transactions keep the
    /// generator busy anyway (~85 %), and polling would take CPU the
    /// handshakes need; big ones leave it waiting ~70 % of the time, and a
    /// sleeping generator made the server's CPU per byte flip between two
    /// values up to twice apart, cell to cell.
    busy_poll: bool,
}

/// Big transactions: few in flight, a window that holds many, and a
/// generator that never sleeps. Calibration and validation measure each
/// size alike.
fn shape(size: u64, opts: &BenchOptions) -> Shape {
    if size >= RAMP {
        Shape {
            concurrency: BIG_CONCURRENCY,
            window: big_window(opts),
            busy_poll: true,
        }
    } else {
        Shape {
            concurrency: opts.handshake_concurrency,
            window: opts.window(),
            busy_poll: false,
        }
    }
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
    let sizes = curve_sizes(opts.quick);
    let largest = sizes.iter().copied().max().unwrap_or(SMALL);
    let small = materials.file(SMALL)?;
    let mut target = Target::start(TargetKind::Tlsgate, &materials, &opts.settings(largest))?;
    let mut model = Model {
        machine: {
            let m = Machine::detect(String::new());
            format!("{}, {} cores, kernel {}", m.cpu, m.cores, m.kernel)
        },
        date: Machine::detect(String::new()).date,
        server: target.version().to_string(),
        handshake_us: Default::default(),
        byte_curve: Default::default(),
        handshake_response_bytes: 0.0,
        replaced: Vec::new(),
        reference_ns: 0.0,
    };
    let kinds = handshake_kinds();
    let with_client_certs = kinds.iter().map(|p| TlsProfile {
        client_identity: Some(materials.client.clone()),
        ..p.clone()
    });
    let all_kinds: Vec<TlsProfile> = kinds.iter().cloned().chain(with_client_certs).collect();
    let cases: Vec<Case<'_>> = all_kinds
        .iter()
        .map(|profile| Case {
            name: profile.label(),
            job: Box::new(|t: &Target| {
                handshake_job(t, profile.clone(), &small, shape(SMALL, opts), opts)
            }),
        })
        .collect();
    settle(opts, &mut target, &small)?;
    let handshakes = interleaved(opts, &mut target, &cases)?;
    // The model's speed: the median of the handshake cells' references;
    // every figure is stated at it.
    model.reference_ns = median(
        handshakes
            .iter()
            .flatten()
            .map(|m| m.reference_ns)
            .collect(),
    );
    let at = model.reference_ns;
    let mut response_bytes = Vec::new();
    for (case, cells) in cases.iter().zip(handshakes) {
        model.handshake_us.insert(
            case.name.clone(),
            median(
                cells
                    .iter()
                    .map(|m| m.cpu_secs_at(at) * 1e6 / m.cell.load.operations.max(1) as f64)
                    .collect(),
            ),
        );
        response_bytes.extend(
            cells
                .iter()
                .map(|m| m.cell.load.bytes as f64 / m.cell.load.operations.max(1) as f64),
        );
    }
    model.handshake_response_bytes = median(response_bytes);
    // Bytes: new connections (full ECDSA handshakes of each version)
    // fetching the small response and each curve size; the difference to
    // the small one is the size's byte term, so the connection's own cost
    // cancels out.
    let curves: Vec<(Version, Cipher)> = [Version::Tls13, Version::Tls12]
        .into_iter()
        .flat_map(|v| {
            [
                Cipher::Aes128Gcm,
                Cipher::Aes256Gcm,
                Cipher::Chacha20Poly1305,
            ]
            .map(|c| (v, c))
        })
        .collect();
    let all_sizes: Vec<u64> = std::iter::once(SMALL)
        .chain(sizes.iter().copied())
        .collect();
    let mut plan = Vec::new();
    for &(version, cipher) in &curves {
        for &size in &all_sizes {
            plan.push((version, cipher, size, materials.file(size)?));
        }
    }
    let cases: Vec<Case<'_>> = plan
        .iter()
        .map(|(version, cipher, size, path)| {
            let profile = TlsProfile {
                version: *version,
                cipher: *cipher,
                ..TlsProfile::tls13_ecdsa()
            };
            let shape = shape(*size, opts);
            Case {
                name: format!(
                    "{} {} per txn",
                    curve_key(*version, *cipher),
                    tlsgate_bench::materials::size_name(*size)
                ),
                job: Box::new(move |t: &Target| {
                    handshake_job(t, profile.clone(), path, shape, opts)
                }),
            }
        })
        .collect();
    let measured = interleaved(opts, &mut target, &cases)?;
    let per_txn_ns: Vec<f64> = plan
        .iter()
        .zip(&measured)
        .map(|((_, _, size, _), cells)| {
            median(
                cells
                    .iter()
                    .map(|m| m.cpu_secs_at(at) * 1e9 / transactions(&m.cell, *size).max(1e-9))
                    .collect(),
            )
        })
        .collect();
    for (row, &(version, cipher)) in per_txn_ns.chunks(all_sizes.len()).zip(&curves) {
        let key = curve_key(version, cipher);
        let base = row[0];
        let mut curve: Vec<BytePoint> = all_sizes
            .iter()
            .zip(row)
            .skip(1)
            .map(|(size, ns)| BytePoint {
                bytes: (size - SMALL) as f64,
                ns: ns - base,
            })
            .collect();
        // Reported by `calibrate`'s output, from the model.
        let below_noise = fill_below_noise(&mut curve);
        let flips = smooth_regime_flips(&mut curve, (RAMP - SMALL) as f64);
        for (why, (i, measured_ns)) in below_noise
            .into_iter()
            .map(|r| (ReplacedWhy::BelowNoise, r))
            .chain(flips.into_iter().map(|r| (ReplacedWhy::RegimeFlip, r)))
        {
            model.replaced.push(ReplacedPoint {
                curve: key.clone(),
                bytes: curve[i].bytes,
                measured_ns,
                used_ns: curve[i].ns,
                why,
            });
        }
        // No point measured above the noise: nothing to scale from.
        for p in &mut curve {
            p.ns = p.ns.max(0.0);
        }
        model.byte_curve.insert(key, curve);
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
    /// Measured: transactions per server CPU-second, at the model's
    /// machine speed (from the speed reference around each cell).
    pub measured_tps_per_core: f64,
    /// The same as measured, at the machine's speed during the run.
    pub measured_tps_per_core_raw: f64,
    /// The machine's speed during the run relative to the calibration's
    /// (above 1: faster now; 0: the model has no reference).
    pub speed: f64,
    /// Transactions per second the server actually reached (wall clock).
    pub measured_tps: f64,
    /// Server core utilization during the measurement.
    pub server_utilization: f64,
    /// (predicted − measured) / measured, at the model's machine speed.
    pub error: f64,
    /// The same with the measurement as taken.
    pub error_raw: f64,
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
            "| workload | predicted txn/s per core | measured txn/s per core (at calibration speed) | error | machine speed vs calibration | measured txn/s per core (as taken) | error as taken | measured txn/s | server CPU % |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:+.1} % | {:.3} | {:.1} | {:+.1} % | {:.1} | {:.0} |\n",
                r.workload,
                r.predicted_tps_per_core,
                r.measured_tps_per_core,
                r.error * 100.0,
                r.speed,
                r.measured_tps_per_core_raw,
                r.error_raw * 100.0,
                r.measured_tps,
                r.server_utilization * 100.0,
            ));
        }
        out
    }
}

/// Runs workloads unlike the calibration's and compares the model's
/// prediction with measurement: 1 KiB and 100 MiB per transaction, full and
/// resumed, a TLS 1.2 3 MiB one, a ChaCha20 8 MiB one and a 32 KiB one
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
        (3 << 20, Version::Tls12, false, aes, false),
        (
            8 << 20,
            Version::Tls13,
            false,
            Cipher::Chacha20Poly1305,
            false,
        ),
        (32 << 10, Version::Tls13, false, aes, true),
    ];
    let materials = Materials::create()?;
    let mut target = Target::start(TargetKind::Tlsgate, &materials, &opts.settings(big))?;
    let mut plan = Vec::new();
    for (size, version, resumed, cipher, mtls) in workloads {
        let profile = TlsProfile {
            version,
            key: KeyType::EcdsaP256,
            cipher,
            group: Group::X25519,
            resume: resumed,
            client_identity: mtls.then(|| materials.client.clone()),
        };
        plan.push((size, profile, materials.file(size)?));
    }
    let cases: Vec<Case<'_>> = plan
        .iter()
        .map(|(size, profile, path)| {
            let shape = shape(*size, opts);
            Case {
                name: format!(
                    "{} per txn, {} {}",
                    tlsgate_bench::materials::size_name(*size),
                    profile.label(),
                    cipher_name(profile.cipher)
                ),
                job: Box::new(move |t: &Target| {
                    handshake_job(t, profile.clone(), path, shape, opts)
                }),
            }
        })
        .collect();
    settle(opts, &mut target, &materials.file(SMALL)?)?;
    let measured = interleaved(opts, &mut target, &cases)?;
    let mut rows = Vec::new();
    for (((size, profile, _), case), cells) in plan.iter().zip(&cases).zip(measured) {
        let txn = |c: &Cell| transactions(c, *size);
        let per_cpu_second = |at: f64| {
            median(
                cells
                    .iter()
                    .map(|m| txn(&m.cell) / m.cpu_secs_at(at).max(1e-9))
                    .collect(),
            )
        };
        let measured = per_cpu_second(model.reference_ns);
        let measured_raw = per_cpu_second(0.0);
        let speed = if model.reference_ns > 0.0 {
            median(
                cells
                    .iter()
                    .map(|m| model.reference_ns / m.reference_ns.max(1e-9))
                    .collect(),
            )
        } else {
            0.0
        };
        let predicted = model
            .predict(&Workload {
                rate: 1.0,
                bytes: *size as f64,
                resumed: if profile.resume { 1.0 } else { 0.0 },
                mtls: profile.client_identity.is_some(),
                version: profile.version,
                key: KeyType::EcdsaP256,
                cipher: profile.cipher,
            })?
            .max_tps_per_core;
        rows.push(ValidationRow {
            workload: case.name.clone(),
            predicted_tps_per_core: predicted,
            measured_tps_per_core: measured,
            measured_tps_per_core_raw: measured_raw,
            speed,
            measured_tps: median(
                cells
                    .iter()
                    .map(|m| txn(&m.cell) / m.cell.load.window_secs)
                    .collect(),
            ),
            server_utilization: median(cells.iter().map(|m| m.cell.server_utilization).collect()),
            error: (predicted - measured) / measured.max(1e-9),
            error_raw: (predicted - measured_raw) / measured_raw.max(1e-9),
        });
    }
    Ok(Validation { rows })
}
