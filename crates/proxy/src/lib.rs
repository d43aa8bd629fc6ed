//! tlsgate's reverse proxy: upstream pools and what they own.
//!
//! - [`Pools`]/[`Pool`]: the servers of each `[[upstream]]`, their state
//!   (in service, in flight, passive failure marks, active health checks),
//!   keep-alive connections kept per worker thread, plain or TLS (CA
//!   bundle, SNI, client certificate, session resumption).
//! - [`Router`]: a listener's routes by Host, SNI and longest prefix of
//!   the path as its readers could take it (`path`).
//! - [`ClientConn`]: one client connection across its requests, and the
//!   upstream connections private to it (those that began with its PROXY
//!   protocol header).
//! - [`forward`]: one exchange, streamed both ways over HTTP/1.1 with the
//!   project's strict parser on both sides (tlsgate-http1), bounded
//!   retries and 502/503/504 with a reason.
//!
//! It owns no client connection and no listener: the server crate reads
//! the client's request head and hands the rest over through
//! [`Downstream`].
#![forbid(unsafe_code)]

mod background;
mod balance;
mod client;
mod conn;
mod error;
mod forward;
mod health;
pub mod path;
mod pool;
mod resolve;
mod route;
mod tls;

pub use client::{ClientConn, PRIVATE_IDLE_MAX};
pub use error::Failure;
pub use forward::{
    forward, forward_stream, upstream_request_head, upstream_stream_head, BodyRefused, Downstream,
    Outcome, Request, RequestBody, Responder, SendError, StreamRequest, CLIENT_CLOSED,
};
pub use path::BadPath;
pub use pool::{Pool, Pools};
pub use route::{Entry, Router, Target};
pub use tls::PoolFiles;
pub use tlsgate_tls::Turn;
