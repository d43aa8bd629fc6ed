//! TLS termination for tlsgate: certificates and keys, choice of
//! certificate by SNI, the rustls server configuration, and a hand-driven
//! TLS connection over a tokio socket.
//!
//! It owns nothing of HTTP. Keys are read here and only here; later work
//! moves signing into a separate key process behind the same
//! `CertifiedKey` interface.
#![forbid(unsafe_code)]

pub mod certs;
mod conn;
mod context;
pub mod error;
pub mod resolver;
pub mod tickets;

pub use certs::{load, self_signed, LoadedCert, SelfSigned};
pub use conn::{accept, TlsConnection};
pub use context::TlsContext;
pub use error::{CertError, HandshakeError};
pub use rustls;
pub use tickets::{TicketKeyError, TicketKeys, TicketObserver};
