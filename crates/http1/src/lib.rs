//! Strict HTTP/1.1 wire handling for tlsgate (RFC 9112).
//!
//! This crate owns the byte-level HTTP/1.1 protocol: parsing and validating
//! request heads ([`parse_request`]), deciding how a request body is framed
//! ([`BodyFraming`]), decoding chunked bodies ([`ChunkedDecoder`]) and writing
//! response heads ([`response`]). It does no I/O and makes no routing or
//! policy decisions; the server crate feeds it bytes and acts on the result.
//!
//! The parsers are deliberately stricter than the RFC's "MAY accept" leeway:
//! anything ambiguous enough to enable request smuggling (bare CR/LF,
//! obs-fold, conflicting framing headers) is rejected with a typed error that
//! maps to the HTTP status to answer with.

#![forbid(unsafe_code)]

pub mod chunked;
pub mod error;
pub mod request;
pub mod response;
mod syntax;
mod target;
#[cfg(test)]
mod testutil;

pub use chunked::{ChunkedDecoder, Decoded};
pub use error::{ChunkError, ParseError};
pub use request::{parse_request, BodyFraming, Limits, Method, RequestHead, Version};
pub use response::{end_head, reason_phrase, write_header, write_header_u64, write_status_line};
