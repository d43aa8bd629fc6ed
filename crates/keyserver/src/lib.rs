//! Private keys kept out of the processes that talk to the network.
//!
//! `tlsgate serve` starts a small supervisor ([`server::supervise`]) before
//! it drops privileges; the supervisor starts the key server
//! ([`server::serve`]), which alone reads private key files (and makes the
//! self-signed default), checks each against its certificate and signs on
//! request. The network-facing process holds only public halves and signs
//! through [`client::KeyClient`], speaking the [`proto`] protocol over a
//! socket pair that nothing in the file system names.
#![forbid(unsafe_code)]

pub mod client;
pub mod proto;
pub mod server;

pub use client::{Events, KeyClient, KeyError};
