//! Why a load job could not run at all (individual failed operations are
//! counted in the report, not returned as errors).

use std::io;

/// A job that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The TLS profile cannot be built (e.g. a cipher of the other version).
    #[error("TLS profile {profile}: {source}")]
    Profile {
        /// The profile's label.
        profile: String,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The server name is not a valid DNS name or IP address.
    #[error("server name {0:?} is not a DNS name or an IP address")]
    ServerName(String),
    /// A thread or runtime could not be created.
    #[error("starting the load generator: {0}")]
    Start(#[source] io::Error),
    /// The job's parameters make no sense.
    #[error("invalid job: {0}")]
    Job(String),
    /// Nothing in the whole window succeeded: the first error seen.
    #[error("no operation succeeded against {addr}: {first_error}")]
    NothingSucceeded {
        /// The server's address.
        addr: std::net::SocketAddr,
        /// The first error seen.
        first_error: String,
    },
}
