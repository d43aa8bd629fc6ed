//! The model: coefficients, workloads, predictions.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tlsgate_loadgen::{Cipher, KeyType, Version};

/// Errors of the cost commands.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// The model file is missing or unreadable.
    #[error("{path}: {problem} (run `tlsgate cost calibrate` first)")]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The workload asks for something the model was not calibrated for.
    #[error("the model has no coefficient for {0}: calibrate with it")]
    Uncalibrated(String),
    /// A workload parameter is out of range.
    #[error("invalid workload: {0}")]
    Workload(String),
    /// Measuring failed.
    #[error(transparent)]
    Bench(#[from] tlsgate_bench::BenchError),
    /// Too many operations of a measurement failed for its figure to mean
    /// anything.
    #[error("{case}: {failed} of {total} operations failed (first: {first}); no figure taken")]
    Failures {
        /// The case measured.
        case: String,
        /// Failed operations.
        failed: u64,
        /// All operations.
        total: u64,
        /// The first failure.
        first: String,
    },
    /// The server could not be brought to a steady state before measuring.
    #[error("settling the server before measuring: no TLS 1.2 handshake completed while filling its session cache")]
    Settle,
}

/// Coefficients measured on one machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Model {
    /// Where and when.
    pub machine: String,
    /// When (RFC 3339).
    pub date: String,
    /// tlsgate version measured.
    pub server: String,
    /// Server CPU per connection (handshake + small request + close), µs,
    /// by handshake kind label ("TLS1.3 ECDSA full", "… mTLS").
    pub handshake_us: BTreeMap<String, f64>,
    /// The byte term by protocol version and cipher ([`curve_key`], e.g.
    /// "TLS1.2 AES-128-GCM"; files from before TLS 1.2 had its own curves
    /// are keyed by cipher alone, TLS 1.3's): the server CPU a transaction of
    /// `bytes` response bytes costs beyond one of the handshake
    /// measurement's small response, at calibrated sizes (ascending).
    /// Between them the term is interpolated linearly, past the last one
    /// extrapolated with the last segment's slope. Measured with a
    /// generator that never sleeps, the cost per byte is nearly constant
    /// (AES-GCM within ~15 % from 256 KiB to 256 MiB); the curve follows
    /// what is left of a size's own cost without a formula for it. Curves
    /// are per version because the record layers differ (TLS 1.2's explicit
    /// nonce); measured, they agree within noise on this machine.
    pub byte_curve: BTreeMap<String, Vec<BytePoint>>,
    /// Response bytes included in each handshake measurement (where the
    /// byte term starts).
    pub handshake_response_bytes: f64,
    /// Curve points calibration measured but did not use (see
    /// [`smooth_regime_flips`]).
    #[serde(default)]
    pub replaced: Vec<ReplacedPoint>,
    /// The machine's speed the figures are stated at: CPU ns per round of
    /// the speed reference (`tlsgate_bench::speed`), the median over the handshake
    /// cells; each cell's CPU was scaled from the reference measured
    /// around it to this one. 0 in files from before references.
    #[serde(default)]
    pub reference_ns: f64,
}

/// A measured curve point set aside as a regime flip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplacedPoint {
    /// The curve's key ([`curve_key`]).
    #[serde(alias = "cipher")]
    pub curve: String,
    /// The point's bytes.
    pub bytes: f64,
    /// What was measured, ns.
    pub measured_ns: f64,
    /// What the curve holds instead, ns.
    pub used_ns: f64,
    /// Why the measured value was set aside.
    #[serde(default)]
    pub why: ReplacedWhy,
}

/// Why a measured curve point was set aside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplacedWhy {
    /// Far from both neighbours' cost per byte ([`smooth_regime_flips`]).
    #[default]
    RegimeFlip,
    /// Not above the noise of the connection it rode on
    /// ([`fill_below_noise`]).
    BelowNoise,
}

impl fmt::Display for ReplacedWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplacedWhy::RegimeFlip => "far from both neighbours (a regime flip, docs/bench.md)",
            ReplacedWhy::BelowNoise => {
                "not above the handshake's noise; the next point's cost per byte"
            }
        })
    }
}

/// How far (as a share) a point's cost per byte may be from what its two
/// neighbours say before it is taken for a regime flip. Repeats of one
/// size agree within ~10 %; flips are 25–100 % apart.
pub const REGIME_FLIP: f64 = 0.25;

/// On one machine the server's CPU per byte has two regimes: whether its
/// sends must wake the client or find it running (docs/bench.md). A cell
/// can land in either, and so, when two of its three repeats do, can a
/// curve point: 4 MiB once measured 6.2 GB per CPU-second between
/// neighbours at 4.3 and 4.1. A point whose cost per byte is more than
/// [`REGIME_FLIP`] off the interpolation (in log size) of its neighbours'
/// is replaced by that interpolation; the ends, with one neighbour, are
/// kept, and so are points below `from_bytes`: small transactions, which
/// do not flip, and whose cost per byte has a real kink where the server
/// stops sending bodies inline. Returns the replaced points' indices and
/// measured values.
pub fn smooth_regime_flips(curve: &mut [BytePoint], from_bytes: f64) -> Vec<(usize, f64)> {
    let measured: Vec<BytePoint> = curve.to_vec();
    let per_byte = |p: &BytePoint| p.ns / p.bytes.max(1.0);
    let mut replaced = Vec::new();
    for i in 1..measured.len().saturating_sub(1) {
        let (a, p, b) = (&measured[i - 1], &measured[i], &measured[i + 1]);
        if p.bytes < from_bytes || a.bytes <= 0.0 || p.bytes <= a.bytes || b.bytes <= p.bytes {
            continue;
        }
        let at = (p.bytes.ln() - a.bytes.ln()) / (b.bytes.ln() - a.bytes.ln());
        let expected = per_byte(a) + (per_byte(b) - per_byte(a)) * at;
        if expected > 0.0 && (per_byte(p) / expected - 1.0).abs() > REGIME_FLIP {
            curve[i].ns = expected * p.bytes;
            replaced.push((i, p.ns));
        }
    }
    replaced
}

/// A point's byte term is its transaction's CPU less that of a transaction
/// with the small response, both carrying a full handshake. When the bytes
/// cost less than that handshake's noise (256 KiB is ~40 µs beside a
/// ~150 µs handshake that moves ±30 % on a shared host), the difference
/// can come out at or below zero, which no amount of bytes costs. Such a
/// point takes the cost per byte of the nearest bigger point that was
/// measured above zero. Returns the replaced points' indices and measured
/// values.
pub fn fill_below_noise(curve: &mut [BytePoint]) -> Vec<(usize, f64)> {
    let mut replaced = Vec::new();
    // From the biggest down, so a run of such points takes the cost per
    // byte of the first one above them that was measured.
    let mut per_byte = None;
    for i in (0..curve.len()).rev() {
        let p = curve[i];
        if p.ns > 0.0 && p.bytes > 0.0 {
            per_byte = Some(p.ns / p.bytes);
        } else if let Some(per_byte) = per_byte {
            curve[i].ns = per_byte * p.bytes;
            replaced.push((i, p.ns));
        }
    }
    replaced
}

/// One calibrated point of a byte curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BytePoint {
    /// Response bytes per transaction beyond the small response.
    pub bytes: f64,
    /// Server CPU of those bytes, ns (the transaction's CPU less that of a
    /// transaction with the small response).
    pub ns: f64,
}

/// The byte term of `bytes` on `curve` (µs), and the segment used.
fn byte_term(curve: &[BytePoint], bytes: f64) -> (f64, BytePoint, BytePoint) {
    let origin = BytePoint {
        bytes: 0.0,
        ns: 0.0,
    };
    let points: Vec<BytePoint> = std::iter::once(origin)
        .chain(curve.iter().copied().filter(|p| p.bytes > 0.0))
        .collect();
    // The segment that holds `bytes`, or the last one past the end.
    let i = points
        .windows(2)
        .position(|w| bytes <= w[1].bytes)
        .unwrap_or(points.len().saturating_sub(2));
    let (a, b) = match (points.get(i), points.get(i + 1)) {
        (Some(a), Some(b)) => (*a, *b),
        _ => return (0.0, origin, origin),
    };
    let slope = (b.ns - a.ns) / (b.bytes - a.bytes).max(1.0);
    ((a.ns + (bytes - a.bytes) * slope).max(0.0) / 1e3, a, b)
}

/// A workload to predict.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Transactions (connections with one request each) per second.
    pub rate: f64,
    /// Response bytes per transaction.
    pub bytes: f64,
    /// Share of resumed handshakes, 0..=1.
    pub resumed: f64,
    /// Client certificates.
    pub mtls: bool,
    /// Protocol version.
    pub version: Version,
    /// Server key.
    pub key: KeyType,
    /// Bulk cipher.
    pub cipher: Cipher,
}

/// A prediction with its terms.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    /// CPU µs per full handshake used.
    pub h_full_us: f64,
    /// CPU µs per resumed handshake used.
    pub h_resumed_us: f64,
    /// The calibrated points the byte term was interpolated between.
    pub byte_segment: (BytePoint, BytePoint),
    /// Handshake term per transaction, µs.
    pub handshake_term_us: f64,
    /// Byte term per transaction, µs.
    pub byte_term_us: f64,
    /// CPU per transaction, µs.
    pub cpu_per_txn_us: f64,
    /// CPU-seconds per second at the workload's rate (= cores busy).
    pub cpu_seconds_per_second: f64,
    /// Cores needed (rounded up).
    pub cores_needed: u64,
    /// Maximum transactions per second on one core.
    pub max_tps_per_core: f64,
}

/// The label of a handshake kind, as calibration stores it.
pub fn kind_label(version: Version, key: KeyType, resumed: bool, mtls: bool) -> String {
    tlsgate_loadgen::TlsProfile {
        version,
        key,
        cipher: Cipher::Aes128Gcm,
        group: tlsgate_loadgen::Group::X25519,
        resume: resumed,
        client_identity: None,
    }
    .label()
        + if mtls { " mTLS" } else { "" }
}

/// The name of a cipher, as calibration stores it.
pub fn cipher_name(c: Cipher) -> &'static str {
    match c {
        Cipher::Aes128Gcm => "AES-128-GCM",
        Cipher::Aes256Gcm => "AES-256-GCM",
        Cipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
    }
}

/// The key of a byte curve: protocol version and cipher.
pub fn curve_key(version: Version, cipher: Cipher) -> String {
    format!(
        "{} {}",
        match version {
            Version::Tls12 => "TLS1.2",
            Version::Tls13 => "TLS1.3",
        },
        cipher_name(cipher)
    )
}

impl Model {
    /// Reads a model file.
    pub fn load(path: &Path) -> Result<Self, CostError> {
        let text = fs::read_to_string(path).map_err(|e| CostError::Model {
            path: path.into(),
            problem: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| CostError::Model {
            path: path.into(),
            problem: format!("not a cost model: {e}"),
        })
    }

    /// Writes the model file.
    pub fn save(&self, path: &Path) -> Result<(), CostError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| CostError::Model {
            path: path.into(),
            problem: e.to_string(),
        })?;
        fs::write(path, text).map_err(|e| CostError::Model {
            path: path.into(),
            problem: e.to_string(),
        })
    }

    fn handshake(
        &self,
        version: Version,
        key: KeyType,
        resumed: bool,
        mtls: bool,
    ) -> Result<f64, CostError> {
        let label = kind_label(version, key, resumed, mtls);
        self.handshake_us
            .get(&label)
            .copied()
            .ok_or(CostError::Uncalibrated(label))
    }

    /// The byte curve of a version and cipher. A model calibrated before
    /// curves were per version has TLS 1.3's under the cipher's name alone.
    fn byte_curve(&self, version: Version, cipher: Cipher) -> Result<&[BytePoint], CostError> {
        let key = curve_key(version, cipher);
        let legacy = (version == Version::Tls13).then(|| cipher_name(cipher));
        self.byte_curve
            .get(&key)
            .or_else(|| legacy.and_then(|name| self.byte_curve.get(name)))
            .filter(|c| !c.is_empty())
            .map(Vec::as_slice)
            .ok_or(CostError::Uncalibrated(format!("the byte curve of {key}")))
    }

    /// Predicts the CPU of a workload.
    pub fn predict(&self, w: &Workload) -> Result<Prediction, CostError> {
        if !(0.0..=1.0).contains(&w.resumed) {
            return Err(CostError::Workload(
                "resumed share must be within 0..1".into(),
            ));
        }
        if w.rate.is_nan() || w.bytes.is_nan() || w.rate < 0.0 || w.bytes < 0.0 {
            return Err(CostError::Workload(
                "rate and bytes must be non-negative".into(),
            ));
        }
        let curve = self.byte_curve(w.version, w.cipher)?;
        let h_full_us = if w.resumed < 1.0 {
            self.handshake(w.version, w.key, false, w.mtls)?
        } else {
            0.0
        };
        let h_resumed_us = if w.resumed > 0.0 {
            self.handshake(w.version, w.key, true, w.mtls)?
        } else {
            0.0
        };
        let handshake_term_us = (1.0 - w.resumed) * h_full_us + w.resumed * h_resumed_us;
        // The handshake measurement already paid for its small response.
        let beyond = (w.bytes - self.handshake_response_bytes).max(0.0);
        let (byte_term_us, a, b) = byte_term(curve, beyond);
        let cpu_per_txn_us = handshake_term_us + byte_term_us;
        let cpu_seconds_per_second = w.rate * cpu_per_txn_us / 1e6;
        Ok(Prediction {
            h_full_us,
            h_resumed_us,
            byte_segment: (a, b),
            handshake_term_us,
            byte_term_us,
            cpu_per_txn_us,
            cpu_seconds_per_second,
            cores_needed: cpu_seconds_per_second.ceil().max(1.0) as u64,
            max_tps_per_core: if cpu_per_txn_us > 0.0 {
                1e6 / cpu_per_txn_us
            } else {
                0.0
            },
        })
    }

    /// A readable account of a prediction.
    pub fn explain(&self, w: &Workload, p: &Prediction) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "model: {} ({}; {})",
            self.server, self.machine, self.date
        );
        let _ = writeln!(
            out,
            "workload: N = {} txn/s, T = {} bytes/txn, r = {:.2} resumed, {}, {} {}",
            w.rate,
            w.bytes,
            w.resumed,
            if w.mtls {
                "mTLS"
            } else {
                "no client certificates"
            },
            kind_label(w.version, w.key, false, false).trim_end_matches(" full"),
            cipher_name(w.cipher)
        );
        let (a, b) = p.byte_segment;
        let _ = writeln!(
            out,
            "cpu(txn) = (1 − r)·h_full + r·h_resumed + B(T)    (B: the version and cipher's byte curve, calibrated)"
        );
        let _ = writeln!(
            out,
            "         = {:.2}·{:.1} µs + {:.2}·{:.1} µs + B({} B)",
            1.0 - w.resumed,
            p.h_full_us,
            w.resumed,
            p.h_resumed_us,
            w.bytes,
        );
        let _ = writeln!(
            out,
            "  B between calibrated points B({} B) = {:.1} µs and B({} B) = {:.1} µs: {:.4} ns/B on that segment",
            a.bytes,
            a.ns / 1e3,
            b.bytes,
            b.ns / 1e3,
            (b.ns - a.ns) / (b.bytes - a.bytes).max(1.0),
        );
        let _ = writeln!(
            out,
            "         = {:.1} µs (handshakes) + {:.1} µs (bytes) = {:.1} µs",
            p.handshake_term_us, p.byte_term_us, p.cpu_per_txn_us
        );
        let _ = writeln!(
            out,
            "CPU-seconds per second = N · cpu(txn) = {:.3}",
            p.cpu_seconds_per_second
        );
        let _ = writeln!(out, "cores needed = {}", p.cores_needed);
        let _ = writeln!(
            out,
            "maximum transactions/s per core = 1 / cpu(txn) = {:.1}",
            p.max_tps_per_core
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        let mut handshake_us = BTreeMap::new();
        handshake_us.insert("TLS1.3 ECDSA full".into(), 200.0);
        handshake_us.insert("TLS1.3 ECDSA resumed".into(), 100.0);
        let mut byte_curve = BTreeMap::new();
        // 1 ns/B up to 200 kB, then 0.5 ns/B.
        byte_curve.insert(
            "TLS1.3 AES-128-GCM".into(),
            vec![
                BytePoint {
                    bytes: 200_000.0,
                    ns: 200_000.0,
                },
                BytePoint {
                    bytes: 400_000.0,
                    ns: 300_000.0,
                },
            ],
        );
        Model {
            machine: "test".into(),
            date: "now".into(),
            server: "tlsgate".into(),
            handshake_us,
            byte_curve,
            handshake_response_bytes: 1000.0,
            replaced: Vec::new(),
            reference_ns: 0.0,
        }
    }

    fn workload() -> Workload {
        Workload {
            rate: 1000.0,
            bytes: 1_000_000.0,
            resumed: 0.5,
            mtls: false,
            version: Version::Tls13,
            key: KeyType::EcdsaP256,
            cipher: Cipher::Aes128Gcm,
        }
    }

    #[test]
    fn the_formula_adds_its_terms() {
        let p = model().predict(&workload()).unwrap();
        assert_eq!(p.h_full_us, 200.0);
        assert_eq!(p.h_resumed_us, 100.0);
        assert_eq!(p.handshake_term_us, 150.0);
        // The first 1000 B came with the handshakes; of the other 999 000,
        // 200 kB at 1 ns/B, then 799 kB at 0.5 ns/B (the last slope, extended).
        assert!((p.byte_term_us - 599.5).abs() < 1e-9, "{}", p.byte_term_us);
        assert!((p.cpu_per_txn_us - 749.5).abs() < 1e-9);
        assert!((p.cpu_seconds_per_second - 0.7495).abs() < 1e-9);
        assert_eq!(p.cores_needed, 1);
        assert!((p.max_tps_per_core - 1e6 / 749.5).abs() < 1e-9);
        let text = model().explain(&workload(), &p);
        assert!(text.contains("749.5 µs"), "{text}");
        assert!(text.contains("0.5000 ns/B"), "{text}");
    }

    fn point(bytes: f64, gb_per_s: f64) -> BytePoint {
        BytePoint {
            bytes,
            ns: bytes / gb_per_s,
        }
    }

    #[test]
    fn a_point_far_from_both_neighbours_is_a_regime_flip() {
        const M: f64 = 1048576.0;
        // The calibration of 2026-11-23: 4 MiB in the other regime.
        let mut curve = vec![
            point(M / 4.0, 4.0),
            point(M, 4.28),
            point(4.0 * M, 6.22),
            point(16.0 * M, 4.07),
            point(64.0 * M, 3.75),
        ];
        let replaced = smooth_regime_flips(&mut curve, M / 2.0);
        assert_eq!(replaced.len(), 1, "{replaced:?}");
        assert_eq!(replaced[0].0, 2);
        assert!((replaced[0].1 - 4.0 * M / 6.22).abs() < 1.0);
        // Halfway in log size between 4.28 and 4.07 GB/s, in ns per byte.
        let expected = (1.0 / 4.28 + 1.0 / 4.07) / 2.0;
        assert!(
            (curve[2].ns / (4.0 * M) - expected).abs() < 1e-9,
            "{curve:?}"
        );
        // Ordinary spread (~10 %) is kept as measured.
        let mut curve = vec![
            point(M / 4.0, 3.7),
            point(M / 2.0, 4.0),
            point(M, 4.28),
            point(4.0 * M, 3.9),
            point(16.0 * M, 4.07),
            point(64.0 * M, 3.75),
            point(256.0 * M, 3.6),
        ];
        let before = curve.clone();
        assert!(smooth_regime_flips(&mut curve, M / 2.0).is_empty());
        assert_eq!(curve, before);
    }

    #[test]
    fn small_transactions_keep_their_kink() {
        const K: f64 = 1024.0;
        // 2026-11-24: 16 KiB, 64 KiB (the last size sent inline with the
        // head) and 256 KiB cost 7.8, 6.9 and 64.1 µs more than 1 KiB.
        let shape = || {
            vec![
                BytePoint {
                    bytes: 15.0 * K,
                    ns: 7_800.0,
                },
                BytePoint {
                    bytes: 63.0 * K,
                    ns: 6_900.0,
                },
                BytePoint {
                    bytes: 255.0 * K,
                    ns: 64_100.0,
                },
                BytePoint {
                    bytes: 1023.0 * K,
                    ns: 230_000.0,
                },
            ]
        };
        let mut curve = shape();
        assert!(smooth_regime_flips(&mut curve, 1023.0 * K).is_empty());
        assert_eq!(curve, shape());
        // Examined like big transactions, the 64 KiB point would be a flip.
        let mut curve = shape();
        let replaced = smooth_regime_flips(&mut curve, 0.0);
        assert!(replaced.iter().any(|r| r.0 == 1), "{replaced:?}");
    }

    #[test]
    fn points_not_above_the_noise_take_the_next_cost_per_byte() {
        const K: f64 = 1024.0;
        let point = |bytes: f64, ns: f64| BytePoint { bytes, ns };
        // 256 KiB and 1 MiB came out at or below the small transaction's
        // cost; 16 MiB was measured at 2 ns per byte.
        let mut curve = vec![
            point(256.0 * K, -3_000.0),
            point(1024.0 * K, 0.0),
            point(16384.0 * K, 2.0 * 16384.0 * K),
        ];
        let replaced = fill_below_noise(&mut curve);
        assert_eq!(replaced, vec![(1, 0.0), (0, -3_000.0)]);
        assert_eq!(curve[0].ns, 2.0 * 256.0 * K);
        assert_eq!(curve[1].ns, 2.0 * 1024.0 * K);
        // A measured point is kept as it is, and nothing is made up above
        // the last measured one.
        let mut curve = vec![point(256.0 * K, 500_000.0), point(1024.0 * K, -1.0)];
        assert!(fill_below_noise(&mut curve).is_empty());
        assert_eq!(curve[0].ns, 500_000.0);
        assert_eq!(curve[1].ns, -1.0);
    }

    #[test]
    fn the_byte_curve_interpolates_between_its_points() {
        let mut w = workload();
        w.bytes = 101_000.0;
        assert_eq!(model().predict(&w).unwrap().byte_term_us, 100.0);
        w.bytes = 301_000.0;
        assert_eq!(model().predict(&w).unwrap().byte_term_us, 250.0);
        // The handshake's own response costs nothing more.
        w.bytes = 500.0;
        assert_eq!(model().predict(&w).unwrap().byte_term_us, 0.0);
    }

    #[test]
    fn uncalibrated_kinds_and_bad_shares_are_refused() {
        let mut w = workload();
        w.mtls = true;
        assert!(
            matches!(model().predict(&w), Err(CostError::Uncalibrated(k)) if k.contains("mTLS"))
        );
        let mut w = workload();
        w.resumed = 1.5;
        assert!(matches!(model().predict(&w), Err(CostError::Workload(_))));
        let mut w = workload();
        w.cipher = Cipher::Chacha20Poly1305;
        assert!(matches!(
            model().predict(&w),
            Err(CostError::Uncalibrated(_))
        ));
    }

    #[test]
    fn each_version_has_its_own_byte_curve() {
        let mut m = model();
        m.handshake_us.insert("TLS1.2 ECDSA full".into(), 150.0);
        let mut w = workload();
        w.version = Version::Tls12;
        w.resumed = 0.0;
        w.bytes = 101_000.0;
        // No TLS 1.2 curve: TLS 1.3's is not taken for it.
        assert!(
            matches!(m.predict(&w), Err(CostError::Uncalibrated(k)) if k.contains("TLS1.2 AES-128-GCM"))
        );
        m.byte_curve.insert(
            "TLS1.2 AES-128-GCM".into(),
            vec![BytePoint {
                bytes: 200_000.0,
                ns: 400_000.0,
            }],
        );
        assert_eq!(m.predict(&w).unwrap().byte_term_us, 200.0);
        w.version = Version::Tls13;
        assert_eq!(m.predict(&w).unwrap().byte_term_us, 100.0);
        // A file from before per-version curves: the cipher's name alone
        // is TLS 1.3's curve, and only TLS 1.3's.
        let curve = m.byte_curve.remove("TLS1.3 AES-128-GCM").unwrap();
        m.byte_curve.remove("TLS1.2 AES-128-GCM");
        m.byte_curve.insert("AES-128-GCM".into(), curve);
        assert_eq!(m.predict(&w).unwrap().byte_term_us, 100.0);
        w.version = Version::Tls12;
        assert!(matches!(m.predict(&w), Err(CostError::Uncalibrated(_))));
    }

    #[test]
    fn a_model_survives_the_file() {
        let dir = std::env::temp_dir().join(format!("tlsgate-cost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.json");
        model().save(&path).unwrap();
        let back = Model::load(&path).unwrap();
        assert_eq!(back.handshake_us, model().handshake_us);
        assert!(matches!(
            Model::load(&dir.join("none.json")),
            Err(CostError::Model { .. })
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
