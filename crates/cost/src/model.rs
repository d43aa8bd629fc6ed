//! The model: coefficients, workloads, predictions.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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
    /// Server CPU per response byte past the first [`ramp_bytes`](Self::ramp_bytes)
    /// of a connection (bulk), ns, by cipher name.
    pub byte_ns: BTreeMap<String, f64>,
    /// Server CPU per byte of the first `ramp_bytes` of a connection, ns, by
    /// cipher name: TCP's send buffer is still small, so each wake-up moves
    /// fewer bytes.
    #[serde(default)]
    pub ramp_byte_ns: BTreeMap<String, f64>,
    /// How many bytes of each connection cost `ramp_byte_ns`.
    #[serde(default)]
    pub ramp_bytes: f64,
    /// Response bytes included in each handshake measurement (subtracted
    /// with the byte term so it is not counted twice).
    pub handshake_response_bytes: f64,
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
    /// CPU ns per byte of a connection's first `ramp_bytes`.
    pub b_ramp_ns: f64,
    /// CPU ns per byte after those.
    pub b_bulk_ns: f64,
    /// Bytes of a connection at the ramp's cost.
    pub ramp_bytes: f64,
    /// Handshake term per transaction, µs.
    pub handshake_term_us: f64,
    /// Byte term per transaction (ramp and bulk), µs.
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
        let name = cipher_name(w.cipher);
        let coefficient = |table: &BTreeMap<String, f64>| {
            table
                .get(name)
                .copied()
                .ok_or_else(|| CostError::Uncalibrated(name.to_string()))
        };
        let b_bulk_ns = coefficient(&self.byte_ns)?;
        let b_ramp_ns = coefficient(&self.ramp_byte_ns)?;
        // The handshake coefficients were measured with a small response:
        // its bytes (all within the ramp) belong to the byte term.
        let small = self.handshake_response_bytes * b_ramp_ns / 1e3;
        let h_full_us = if w.resumed < 1.0 {
            (self.handshake(w.version, w.key, false, w.mtls)? - small).max(0.0)
        } else {
            0.0
        };
        let h_resumed_us = if w.resumed > 0.0 {
            (self.handshake(w.version, w.key, true, w.mtls)? - small).max(0.0)
        } else {
            0.0
        };
        let handshake_term_us = (1.0 - w.resumed) * h_full_us + w.resumed * h_resumed_us;
        let ramp = w.bytes.min(self.ramp_bytes);
        let byte_term_us = (ramp * b_ramp_ns + (w.bytes - ramp) * b_bulk_ns) / 1e3;
        let cpu_per_txn_us = handshake_term_us + byte_term_us;
        let cpu_seconds_per_second = w.rate * cpu_per_txn_us / 1e6;
        Ok(Prediction {
            h_full_us,
            h_resumed_us,
            b_ramp_ns,
            b_bulk_ns,
            ramp_bytes: self.ramp_bytes,
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
        let ramp = w.bytes.min(p.ramp_bytes);
        let _ = writeln!(
            out,
            "cpu(txn) = (1 − r)·h_full + r·h_resumed + min(T, W)·b_ramp + (T − W)⁺·b_bulk    (W = {} B)",
            p.ramp_bytes
        );
        let _ = writeln!(
            out,
            "         = {:.2}·{:.1} µs + {:.2}·{:.1} µs + {} B · {:.4} ns/B + {} B · {:.4} ns/B",
            1.0 - w.resumed,
            p.h_full_us,
            w.resumed,
            p.h_resumed_us,
            ramp,
            p.b_ramp_ns,
            w.bytes - ramp,
            p.b_bulk_ns
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
        handshake_us.insert("TLS1.3 ECDSA full".into(), 201.0);
        handshake_us.insert("TLS1.3 ECDSA resumed".into(), 101.0);
        let mut byte_ns = BTreeMap::new();
        byte_ns.insert("AES-128-GCM".into(), 0.5);
        let mut ramp_byte_ns = BTreeMap::new();
        ramp_byte_ns.insert("AES-128-GCM".into(), 1.0);
        Model {
            machine: "test".into(),
            date: "now".into(),
            server: "tlsgate".into(),
            handshake_us,
            byte_ns,
            ramp_byte_ns,
            ramp_bytes: 200_000.0,
            handshake_response_bytes: 1000.0,
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
        // 1 µs of the handshake coefficients is their own response's bytes.
        assert_eq!(p.h_full_us, 200.0);
        assert_eq!(p.h_resumed_us, 100.0);
        assert_eq!(p.handshake_term_us, 150.0);
        // 200 kB at 1 ns/B, then 800 kB at 0.5 ns/B.
        assert_eq!(p.byte_term_us, 600.0);
        assert_eq!(p.cpu_per_txn_us, 750.0);
        assert!((p.cpu_seconds_per_second - 0.75).abs() < 1e-9);
        assert_eq!(p.cores_needed, 1);
        assert!((p.max_tps_per_core - 1e6 / 750.0).abs() < 1e-9);
        let text = model().explain(&workload(), &p);
        assert!(text.contains("750.0 µs"), "{text}");
    }

    #[test]
    fn a_transaction_inside_the_ramp_pays_only_the_ramp() {
        let mut w = workload();
        w.bytes = 100_000.0;
        let p = model().predict(&w).unwrap();
        assert_eq!(p.byte_term_us, 100.0);
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
