//! Typed errors for request-head parsing and chunked decoding.
//!
//! Each error knows which HTTP status the server should answer with, so the
//! connection code never has to guess how to classify a protocol failure.

use thiserror::Error;

/// Why a request head was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParseError {
    /// A CR not followed by LF, or an LF not preceded by CR.
    #[error("bare CR or LF in request head (lines must end with CRLF)")]
    BareLineEnding,
    /// Too many empty lines before the request line.
    #[error("too many empty lines before the request line")]
    TooManyLeadingEmptyLines,
    /// The request line does not have the shape `method SP target SP version`.
    #[error("malformed request line")]
    InvalidRequestLine,
    /// The method is not a token.
    #[error("invalid request method")]
    InvalidMethod,
    /// The request-target has invalid bytes or an invalid form for the method.
    #[error("invalid request target")]
    InvalidTarget,
    /// The request-target is longer than the configured limit.
    #[error("request target too long")]
    TargetTooLong,
    /// The version is not of the form `HTTP/DIGIT.DIGIT`.
    #[error("invalid HTTP version")]
    InvalidVersion,
    /// A well-formed HTTP version other than 1.0 or 1.1.
    #[error("unsupported HTTP version")]
    UnsupportedVersion,
    /// A header name is not a token, or has whitespace before the colon.
    #[error("invalid header name")]
    InvalidHeaderName,
    /// A header value contains control characters.
    #[error("invalid header value")]
    InvalidHeaderValue,
    /// A header line starts with whitespace (obsolete line folding).
    #[error("obsolete line folding in header")]
    ObsoleteLineFolding,
    /// More header lines than the configured limit.
    #[error("too many header fields")]
    TooManyHeaders,
    /// The head is larger than the configured limit.
    #[error("request head too large")]
    HeadTooLarge,
    /// An HTTP/1.1 request without a Host header.
    #[error("missing Host header")]
    MissingHost,
    /// More than one Host header.
    #[error("multiple Host headers")]
    DuplicateHost,
    /// A Host header (or target authority) with invalid syntax.
    #[error("invalid Host header or target authority")]
    InvalidHost,
    /// A Content-Length that is not a plain decimal number fitting in u64.
    #[error("invalid Content-Length")]
    InvalidContentLength,
    /// Content-Length values that disagree.
    #[error("conflicting Content-Length values")]
    ConflictingContentLength,
    /// Both Transfer-Encoding and Content-Length are present.
    #[error("both Transfer-Encoding and Content-Length present")]
    ContentLengthWithTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 request.
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    TransferEncodingInHttp10,
    /// Transfer-Encoding whose final coding is not a single `chunked`.
    #[error("invalid Transfer-Encoding (final coding must be a single chunked)")]
    InvalidTransferEncoding,
    /// A transfer coding other than `chunked`.
    #[error("unsupported transfer coding")]
    UnsupportedTransferCoding,
}

impl ParseError {
    /// The HTTP status code to answer with: 400, 414, 431, 501 or 505.
    pub fn status(&self) -> u16 {
        match self {
            Self::TargetTooLong => 414,
            Self::TooManyHeaders | Self::HeadTooLarge => 431,
            Self::UnsupportedTransferCoding => 501,
            Self::UnsupportedVersion => 505,
            _ => 400,
        }
    }
}

/// Why a chunked body was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// The chunk-size line does not start with a hex digit or has stray bytes.
    #[error("invalid chunk size")]
    InvalidChunkSize,
    /// More than 16 hex digits in a chunk size (would overflow u64).
    #[error("chunk size has too many digits")]
    ChunkSizeOverflow,
    /// A malformed chunk extension.
    #[error("invalid chunk extension")]
    InvalidExtension,
    /// Chunk extensions longer than the fixed bound.
    #[error("chunk extensions too long")]
    ExtensionTooLong,
    /// A line not terminated by CRLF, or chunk data not followed by CRLF.
    #[error("chunked line not terminated by CRLF")]
    InvalidLineEnding,
    /// A malformed trailer field.
    #[error("invalid trailer field")]
    InvalidTrailer,
    /// The trailer section exceeds the configured limit.
    #[error("trailer section too large")]
    TrailersTooLarge,
    /// The decoded body exceeds the configured limit.
    #[error("request body too large")]
    TooLarge,
}

impl ChunkError {
    /// The HTTP status code to answer with: 413 for [`ChunkError::TooLarge`], else 400.
    pub fn status(&self) -> u16 {
        match self {
            Self::TooLarge => 413,
            _ => 400,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_error_statuses() {
        assert_eq!(ParseError::BareLineEnding.status(), 400);
        assert_eq!(ParseError::TargetTooLong.status(), 414);
        assert_eq!(ParseError::TooManyHeaders.status(), 431);
        assert_eq!(ParseError::HeadTooLarge.status(), 431);
        assert_eq!(ParseError::UnsupportedTransferCoding.status(), 501);
        assert_eq!(ParseError::UnsupportedVersion.status(), 505);
        assert_eq!(ParseError::MissingHost.status(), 400);
    }

    #[test]
    fn chunk_error_statuses() {
        assert_eq!(ChunkError::TooLarge.status(), 413);
        assert_eq!(ChunkError::InvalidChunkSize.status(), 400);
        assert_eq!(ChunkError::TrailersTooLarge.status(), 400);
    }

    #[test]
    fn messages_are_nonempty() {
        assert!(!ParseError::InvalidTarget.to_string().is_empty());
        assert!(!ChunkError::InvalidExtension.to_string().is_empty());
    }
}
