//! `tlsgate cost`: seed 002's formula made real. CPU per transaction is
//!
//! ```text
//! cpu(txn) = (1 − r)·h_full + r·h_resumed + B_cipher(T)
//! ```
//!
//! where `h_*` is the server CPU of a connection with its handshake (and a
//! small request), `r` the share of resumed handshakes, `T` the bytes per
//! transaction and `B_cipher` the record layer's CPU for them, a calibrated
//! curve per protocol version and cipher (seed 002 has `T·b_cipher`); all
//! at the calibration's machine speed (`tlsgate_bench::speed`). CPU-seconds
//! per second are `N·cpu(txn)` for `N` transactions per second; one core
//! serves at most `1 / cpu(txn)`. The coefficients are measured on the
//! machine (`calibrate`), and the model is checked against measurement
//! (`validate`).
#![forbid(unsafe_code)]

mod measure;
mod model;

pub use measure::{calibrate, validate, Validation, ValidationRow};
pub use model::{
    smooth_regime_flips, BytePoint, CostError, Model, Prediction, ReplacedPoint, Workload,
    REGIME_FLIP,
};
