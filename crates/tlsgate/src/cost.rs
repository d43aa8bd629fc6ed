//! `tlsgate cost`: arguments in, model and tables out. The work is in tlsgate-cost.

use std::path::PathBuf;
use std::process::ExitCode;

use tlsgate_bench::BenchOptions;
use tlsgate_cost::{Model, Workload};
use tlsgate_loadgen::{Cipher, KeyType, Version};

/// Subcommands of `tlsgate cost`.
#[derive(clap::Subcommand)]
pub enum CostCommand {
    /// Measure on this machine the server CPU per handshake of each kind and
    /// per byte of each cipher, and store the model.
    Calibrate {
        /// Where the model is stored.
        #[arg(long, default_value = "tlsgate-cost.json")]
        model: PathBuf,
        /// A smoke run of seconds: coefficients too noisy to rely on.
        #[arg(long)]
        quick: bool,
        /// Repeats of every measurement; medians are kept.
        #[arg(long, default_value_t = DEFAULT_REPEATS)]
        repeats: usize,
    },
    /// Predict CPU for a workload from the stored model.
    Predict {
        /// The stored model.
        #[arg(long, default_value = "tlsgate-cost.json")]
        model: PathBuf,
        /// Transactions (connections with one request) per second.
        #[arg(long)]
        rate: f64,
        /// Response bytes per transaction (suffixes k, m, g: KiB, MiB, GiB).
        #[arg(long, value_parser = parse_bytes)]
        bytes: f64,
        /// Share of resumed handshakes, 0..1.
        #[arg(long, default_value_t = 0.0)]
        resumed: f64,
        /// Clients present certificates.
        #[arg(long)]
        mtls: bool,
        /// aes128gcm, aes256gcm or chacha20.
        #[arg(long, default_value = "aes128gcm", value_parser = parse_cipher)]
        cipher: Cipher,
        /// 1.2 or 1.3.
        #[arg(long, default_value = "1.3", value_parser = parse_version)]
        tls: Version,
        /// ecdsa or rsa.
        #[arg(long, default_value = "ecdsa", value_parser = parse_key)]
        key: KeyType,
    },
    /// Compare predictions with measurements on several workloads.
    Validate {
        /// The stored model.
        #[arg(long, default_value = "tlsgate-cost.json")]
        model: PathBuf,
        /// A smoke run (smaller big transactions, short windows).
        #[arg(long)]
        quick: bool,
        /// Exit 1 when any error exceeds this many percent.
        #[arg(long, default_value_t = 5.0)]
        max_error: f64,
        /// Repeats of every measurement; medians are kept.
        #[arg(long, default_value_t = DEFAULT_REPEATS)]
        repeats: usize,
    },
}

fn parse_bytes(s: &str) -> Result<f64, String> {
    let (num, mult) = match s.to_ascii_lowercase().chars().last() {
        Some('k') => (&s[..s.len() - 1], 1024.0),
        Some('m') => (&s[..s.len() - 1], 1024.0 * 1024.0),
        Some('g') => (&s[..s.len() - 1], 1024.0 * 1024.0 * 1024.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>()
        .ok()
        .filter(|v| *v >= 0.0)
        .map(|v| v * mult)
        .ok_or_else(|| format!("expected a byte count like 1024, 64k or 100m, got {s:?}"))
}

fn parse_cipher(s: &str) -> Result<Cipher, String> {
    match s {
        "aes128gcm" => Ok(Cipher::Aes128Gcm),
        "aes256gcm" => Ok(Cipher::Aes256Gcm),
        "chacha20" => Ok(Cipher::Chacha20Poly1305),
        _ => Err("expected aes128gcm, aes256gcm or chacha20".into()),
    }
}

fn parse_version(s: &str) -> Result<Version, String> {
    match s {
        "1.2" => Ok(Version::Tls12),
        "1.3" => Ok(Version::Tls13),
        _ => Err("expected 1.2 or 1.3".into()),
    }
}

fn parse_key(s: &str) -> Result<KeyType, String> {
    match s {
        "ecdsa" => Ok(KeyType::EcdsaP256),
        "rsa" => Ok(KeyType::Rsa2048),
        _ => Err("expected ecdsa or rsa".into()),
    }
}

/// Repeats of a cost measurement. A handshake cell's median of three
/// still moved ~8 % between calibrations on this shared machine (TLS 1.2
/// ECDSA full: 110 and 119 µs), enough to take a prediction past 5 %.
const DEFAULT_REPEATS: usize = 5;

fn options(quick: bool, repeats: usize) -> Result<BenchOptions, ExitCode> {
    if repeats == 0 {
        eprintln!("tlsgate: error: --repeats must be at least 1");
        return Err(ExitCode::from(2));
    }
    match std::env::current_exe() {
        Ok(bin) => {
            let mut o = BenchOptions::new(quick, bin);
            // --quick keeps its single repeat: seconds, not minutes.
            if !quick {
                o.repeats = repeats;
            }
            Ok(o)
        }
        Err(e) => {
            eprintln!("tlsgate: error: cannot find my own binary: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// Runs a cost subcommand.
pub fn run(cmd: CostCommand) -> ExitCode {
    match cmd {
        CostCommand::Calibrate {
            model,
            quick,
            repeats,
        } => {
            let opts = match options(quick, repeats) {
                Ok(o) => o,
                Err(c) => return c,
            };
            match tlsgate_cost::calibrate(&opts).and_then(|m| m.save(&model).map(|_| m)) {
                Ok(m) => {
                    println!("calibrated on {} ({}):", m.machine, m.date);
                    println!(
                        "  speed     reference {:.0} ns CPU per round (every figure is stated at this speed)",
                        m.reference_ns
                    );
                    for (k, v) in &m.handshake_us {
                        println!("  handshake {k:<24} {v:>9.1} µs CPU");
                    }
                    for (k, curve) in &m.byte_curve {
                        for p in curve {
                            println!(
                                "  bytes     {k:<24} {:>9.1} µs CPU for {} B more per transaction ({:.0} MB per CPU-second)",
                                p.ns / 1e3,
                                p.bytes,
                                p.bytes / p.ns.max(1e-9) * 1e3
                            );
                        }
                    }
                    for r in &m.replaced {
                        println!(
                            "  replaced  {:<24} {} B measured {:.1} µs CPU, {}: {:.1} µs used",
                            r.curve,
                            r.bytes,
                            r.measured_ns / 1e3,
                            r.why,
                            r.used_ns / 1e3
                        );
                    }
                    println!("model: {}", model.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("tlsgate: cost calibrate failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
        CostCommand::Predict {
            model,
            rate,
            bytes,
            resumed,
            mtls,
            cipher,
            tls,
            key,
        } => {
            let w = Workload {
                rate,
                bytes,
                resumed,
                mtls,
                version: tls,
                key,
                cipher,
            };
            match Model::load(&model).and_then(|m| m.predict(&w).map(|p| m.explain(&w, &p))) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("tlsgate: error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        CostCommand::Validate {
            model,
            quick,
            max_error,
            repeats,
        } => {
            let m = match Model::load(&model) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("tlsgate: error: {e}");
                    return ExitCode::from(2);
                }
            };
            let opts = match options(quick, repeats) {
                Ok(o) => o,
                Err(c) => return c,
            };
            match tlsgate_cost::validate(&m, &opts) {
                Ok(v) => {
                    print!("{}", v.markdown());
                    let worst = v.worst_error() * 100.0;
                    println!("worst error: {worst:.1} % (limit {max_error} %)");
                    if worst <= max_error {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("tlsgate: cost validate failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
