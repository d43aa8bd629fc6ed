//! The load generator behind `tlsgate bench` and `tlsgate cost`.
//!
//! It drives real TLS connections over real sockets, but skips certificate
//! chain and signature verification (as Tempesta's tls-perf does): an ECDSA
//! verify costs about three signs, and a generator that verified would run
//! out of CPU long before the server under test. For the same reason a big
//! body of a `Connection: close` response is dropped in the kernel unread
//! (`recv(MSG_TRUNC)`) once its head has been checked.
//!
//! Every job has the same shape: worker threads (each pinned to a client
//! core, each with its own current-thread runtime) start together, run a
//! warm-up, then a measurement window. Only what happens inside the window
//! is counted, and an [`Observer`] is told when the window opens and closes
//! so the caller can sample the server's CPU over exactly the same span.
#![forbid(unsafe_code)]

mod cpu;
mod engine;
mod error;
mod handshake;
mod http;
mod kx;
mod profile;
mod stats;
mod stream;
pub mod synflood;
mod transfer;
mod verify;
mod wire;

pub use cpu::thread_cpu_ns;
pub use engine::{Observer, Window};
pub use error::LoadError;
pub use handshake::{run_handshakes, HandshakeJob, Pacing};
pub use profile::{Cipher, ClientIdentity, Group, KeyType, TlsProfile, Version};
pub use stats::{Latency, Negotiated, Report};
pub use stream::{run_stream, StreamJob};
pub use transfer::{run_transfer, TransferJob};
