//! `tlsgate bench`: measures TLS termination side by side with nginx and
//! HAProxy — same certificates, files, protocol version and cipher, one
//! worker each, all pinned to the same server core while the load
//! generator runs on the other — and reports server CPU per operation from
//! /proc, never just wall time.
#![forbid(unsafe_code)]

pub mod bound;
pub mod crosscheck;
mod error;
pub mod h2;
pub mod materials;
pub mod plot;
pub mod proc;
pub mod proxy;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod speed;
pub mod synflood;
pub mod targets;

pub use error::BenchError;
pub use materials::Materials;
pub use report::{Cell, Results};
pub use runner::{Placement, Runner};
pub use scenario::{BenchOptions, Scenario};
pub use targets::{Target, TargetKind};
