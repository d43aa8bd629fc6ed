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
pub mod upstream;

pub use chunked::{ChunkedDecoder, Decoded};
pub use error::{ChunkError, ParseError};
pub use request::{parse_request, BodyFraming, Limits, Method, RequestHead, Version};
pub use response::{
    end_head, reason_phrase, with_date, write_header, write_header_u64, write_status_line,
};
pub use target::{host_without_port, is_target_text, is_valid_host};
pub use upstream::{parse_response, ResponseError, ResponseFraming, ResponseHead};

/// The non-empty, OWS-trimmed elements of a comma-separated header value
/// (e.g. the options of a `Connection` header).
pub fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    syntax::list_elements(value).filter(|e| !e.is_empty())
}

/// Whether `value` may be sent as a header value: no CR, LF, NUL or other
/// control characters (HTAB excepted).
pub fn is_field_value(value: &[u8]) -> bool {
    value.iter().all(|&b| syntax::is_field_value_byte(b))
}
