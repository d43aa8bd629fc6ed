//! TLS termination for tlsgate: certificates and keys, choice of
//! certificate by SNI, the rustls server configuration, and a hand-driven
//! TLS connection over a tokio socket whose record layer can move into the
//! kernel (kTLS).
//!
//! It owns nothing of HTTP. Keys are read here ([`certs`]), by the key
//! process or, with key isolation off, by the server itself; the
//! network-facing process signs through [`RemoteKey`] instead.
#![forbid(unsafe_code)]

pub mod certs;
pub mod client_auth;
mod conn;
mod context;
pub mod error;
pub mod key_schedule;
pub mod material;
mod offload;
pub mod remote;
pub mod resolver;
mod session_cache;
pub mod tickets;

pub use certs::{load, load_all, self_signed, LoadedCert, SelfSigned, SelfSignedCache};
pub use client_auth::ClientIdentity;
pub use conn::{accept, relay_interest, TlsConnection, Turn};
pub use context::{ContextError, TlsContext};
pub use error::{CertError, HandshakeError};
pub use material::Material;
pub use offload::OffloadError;
pub use remote::{
    poll_signing, run_signing, KeyBackend, KeyInfo, KeyUnavailable, MovedThread, RemoteKey,
    SignFuture, SignResult,
};
pub use rustls;
pub use tickets::{TicketKeyError, TicketKeys, TicketObserver};
