//! Response-head parsing for the proxy's upstream side (RFC 9112 §4, §6.3).
//!
//! Owns the status line, the header fields of a response and the choice of
//! [`ResponseFraming`], with the same strictness as the request parser:
//! an upstream response whose framing could be read two ways (Content-Length
//! with Transfer-Encoding, differing lengths, a coding other than a final
//! single `chunked`, bare CR/LF, obs-fold, CTLs in values) is an error, so
//! the proxy refuses it (502) instead of relaying it, and never reuses the
//! connection it came on. It does no I/O.

use crate::request::Version;
use crate::syntax::{self, Span};

/// Why an upstream response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// A CR not followed by LF, or an LF not preceded by CR.
    #[error("bare CR or LF in response head")]
    BareLineEnding,
    /// The status line is not `HTTP/1.x SP 3DIGIT SP reason`.
    #[error("malformed status line")]
    InvalidStatusLine,
    /// A header name that is not a token (or whitespace before the colon).
    #[error("invalid header name in response")]
    InvalidHeaderName,
    /// A header value with a control character (CR, LF, NUL...).
    #[error("invalid header value in response")]
    InvalidHeaderValue,
    /// A header line starting with whitespace.
    #[error("obsolete line folding in response")]
    ObsoleteLineFolding,
    /// The head is larger than the limit.
    #[error("response head too large")]
    HeadTooLarge,
    /// More header lines than the limit.
    #[error("too many header fields in response")]
    TooManyHeaders,
    /// Content-Length not a decimal, or values that disagree.
    #[error("invalid or conflicting Content-Length in response")]
    InvalidContentLength,
    /// Transfer-Encoding and Content-Length together.
    #[error("both Transfer-Encoding and Content-Length in response")]
    ContentLengthWithTransferEncoding,
    /// Transfer-Encoding other than a single final `chunked`, or in HTTP/1.0.
    #[error("invalid Transfer-Encoding in response")]
    InvalidTransferEncoding,
    /// Framing headers where the status forbids a body (1xx, 204).
    #[error("framing headers on a response that cannot have a body")]
    BodyNotAllowed,
}

/// How the response body that follows the head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked; decode with [`crate::ChunkedDecoder`].
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// A parsed response head: the raw bytes plus offsets.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    raw: Box<[u8]>,
    version: Version,
    status: u16,
    fields: Vec<(Span, Span)>,
    framing: ResponseFraming,
    keep_alive: bool,
    declared_length: Option<u64>,
}

impl ResponseHead {
    /// The status code (100..=599).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The response's HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// How the body is framed.
    pub fn framing(&self) -> ResponseFraming {
        self.framing
    }

    /// The Content-Length the head declares (a list of equal values read
    /// as its one value), whether or not a body follows: what a HEAD or
    /// 304 answer describes.
    pub fn declared_length(&self) -> Option<u64> {
        self.declared_length
    }

    /// Whether the upstream lets the connection be reused after the body.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive && self.framing != ResponseFraming::UntilClose
    }

    /// Bytes of the head including the final CRLFCRLF.
    pub fn head_len(&self) -> usize {
        self.raw.len()
    }

    /// All header fields in order, values OWS-trimmed; names are tokens.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.fields.iter().map(move |(n, v)| {
            let name = std::str::from_utf8(n.slice(&self.raw)).unwrap_or_default();
            (name, v.slice(&self.raw))
        })
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.slice(&self.raw).eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.slice(&self.raw))
    }
}

/// Parses one response head from the start of `buf`, the answer to a
/// request with method `head_request` (HEAD responses have no body).
/// `Ok(None)`: incomplete, read more.
pub fn parse_response(
    buf: &[u8],
    max_head_bytes: usize,
    max_headers: usize,
    head_request: bool,
) -> Result<Option<ResponseHead>, ResponseError> {
    let window = buf.get(..max_head_bytes).unwrap_or(buf);
    let Some(end) = find_head_end(window)? else {
        return if buf.len() > max_head_bytes {
            Err(ResponseError::HeadTooLarge)
        } else {
            Ok(None)
        };
    };
    let head = window.get(..end).unwrap_or_default();
    // Lines without the final empty one; each ends in CRLF (checked).
    let mut lines = LineIter { head, pos: 0 };
    let status_line = lines.next().ok_or(ResponseError::InvalidStatusLine)?;
    let (version, status) = parse_status_line(status_line.slice(head))?;
    let mut fields = Vec::with_capacity(16);
    for line in lines {
        if line.start == line.end {
            break;
        }
        if fields.len() >= max_headers {
            return Err(ResponseError::TooManyHeaders);
        }
        fields.push(parse_field(head, line)?);
    }
    let framing_info = Framing::collect(head, &fields)?;
    let framing = framing_info.decide(version, status, head_request)?;
    Ok(Some(ResponseHead {
        raw: head.into(),
        version,
        status,
        fields,
        framing,
        keep_alive: match version {
            Version::Http11 => !framing_info.close,
            Version::Http10 => framing_info.keep_alive && !framing_info.close,
        },
        declared_length: framing_info.length,
    }))
}

/// The offset just past CRLFCRLF, checking that every LF has its CR and no
/// CR stands alone. Jumps from one CR or LF to the next (memchr): the
/// bytes between them need no look here.
fn find_head_end(window: &[u8]) -> Result<Option<usize>, ResponseError> {
    let mut line_start = 0;
    let mut at = 0;
    while let Some(off) = memchr::memchr2(b'\r', b'\n', window.get(at..).unwrap_or_default()) {
        let i = at + off;
        // An LF not consumed as the second byte of a CRLF below is bare.
        if window.get(i) == Some(&b'\n') {
            return Err(ResponseError::BareLineEnding);
        }
        match window.get(i + 1) {
            None => return Ok(None),
            Some(b'\n') => {}
            Some(_) => return Err(ResponseError::BareLineEnding),
        }
        if i == line_start && line_start > 0 {
            return Ok(Some(i + 2));
        }
        line_start = i + 2;
        at = i + 2;
    }
    Ok(None)
}

/// Spans of the lines of a head, without their CRLF.
struct LineIter<'a> {
    head: &'a [u8],
    pos: usize,
}

impl Iterator for LineIter<'_> {
    type Item = Span;
    fn next(&mut self) -> Option<Span> {
        let rest = self.head.get(self.pos..)?;
        let lf = memchr::memchr(b'\n', rest)?;
        // find_head_end proved every LF follows a CR.
        let span = Span::new(self.pos, self.pos + lf.saturating_sub(1));
        self.pos += lf + 1;
        Some(span)
    }
}

fn parse_status_line(line: &[u8]) -> Result<(Version, u16), ResponseError> {
    let bad = ResponseError::InvalidStatusLine;
    let (version, rest) = match line.split_at_checked(9) {
        Some((b"HTTP/1.1 ", rest)) => (Version::Http11, rest),
        Some((b"HTTP/1.0 ", rest)) => (Version::Http10, rest),
        _ => return Err(bad),
    };
    let (code, reason) = rest.split_at_checked(3).ok_or(bad)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    let status = code
        .iter()
        .fold(0u16, |acc, &d| acc * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return Err(bad);
    }
    match reason.split_first() {
        None => {}
        Some((b' ', text)) if text.iter().all(|&b| syntax::is_field_value_byte(b)) => {}
        _ => return Err(bad),
    }
    Ok((version, status))
}

fn parse_field(head: &[u8], line: Span) -> Result<(Span, Span), ResponseError> {
    let text = line.slice(head);
    if text.first().is_some_and(|&b| syntax::is_ows(b)) {
        return Err(ResponseError::ObsoleteLineFolding);
    }
    let colon = memchr::memchr(b':', text).ok_or(ResponseError::InvalidHeaderName)?;
    let name = text.get(..colon).unwrap_or_default();
    if !syntax::is_token(name) {
        return Err(ResponseError::InvalidHeaderName);
    }
    let raw_value = text.get(colon + 1..).unwrap_or_default();
    // Without a short cut, so that the loop vectorises.
    if raw_value
        .iter()
        .fold(false, |bad, &b| bad | !syntax::is_field_value_byte(b))
    {
        return Err(ResponseError::InvalidHeaderValue);
    }
    let value = syntax::trim_ows(raw_value);
    let lead = raw_value.len() - syntax::trim_ows_start(raw_value).len();
    let vstart = line.start + colon + 1 + lead;
    Ok((
        Span::new(line.start, line.start + colon),
        Span::new(vstart, vstart + value.len()),
    ))
}

/// What the framing headers of a response say.
#[derive(Default)]
struct Framing {
    length: Option<u64>,
    length_seen: bool,
    te_seen: bool,
    te_chunked_last: bool,
    te_chunked_count: usize,
    /// A coding other than chunked (gzip, say): the proxy removes the
    /// transfer codings, so it would have to decode it (RFC 9112 §6.1).
    te_other: bool,
    close: bool,
    keep_alive: bool,
}

impl Framing {
    fn collect(head: &[u8], fields: &[(Span, Span)]) -> Result<Self, ResponseError> {
        let mut f = Framing::default();
        for (n, v) in fields {
            let name = n.slice(head);
            let value = v.slice(head);
            if name.eq_ignore_ascii_case(b"content-length") {
                f.length_seen = true;
                for element in syntax::list_elements(value) {
                    let n = parse_decimal(element).ok_or(ResponseError::InvalidContentLength)?;
                    if f.length.is_some_and(|prev| prev != n) {
                        return Err(ResponseError::InvalidContentLength);
                    }
                    f.length = Some(n);
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                f.te_seen = true;
                for element in syntax::list_elements(value).filter(|e| !e.is_empty()) {
                    let chunked = element.eq_ignore_ascii_case(b"chunked");
                    if !chunked && !syntax::is_token(element) {
                        return Err(ResponseError::InvalidTransferEncoding);
                    }
                    f.te_chunked_count += usize::from(chunked);
                    f.te_chunked_last = chunked;
                    f.te_other |= !chunked;
                }
            } else if name.eq_ignore_ascii_case(b"connection") {
                for option in syntax::list_elements(value) {
                    f.close |= option.eq_ignore_ascii_case(b"close");
                    f.keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        if f.length_seen && f.length.is_none() {
            return Err(ResponseError::InvalidContentLength);
        }
        Ok(f)
    }

    /// RFC 9112 §6.3, refusing every case a peer could read differently.
    fn decide(
        &self,
        version: Version,
        status: u16,
        head_request: bool,
    ) -> Result<ResponseFraming, ResponseError> {
        if self.te_seen && self.length_seen {
            return Err(ResponseError::ContentLengthWithTransferEncoding);
        }
        if self.te_seen
            && (version == Version::Http10
                || self.te_chunked_count != 1
                || !self.te_chunked_last
                || self.te_other)
        {
            return Err(ResponseError::InvalidTransferEncoding);
        }
        let no_body_status = status < 200 || status == 204;
        if no_body_status && (self.te_seen || self.length.is_some_and(|n| n != 0)) {
            return Err(ResponseError::BodyNotAllowed);
        }
        if head_request || no_body_status || status == 304 {
            return Ok(ResponseFraming::None);
        }
        Ok(if self.te_seen {
            ResponseFraming::Chunked
        } else {
            self.length
                .map_or(ResponseFraming::UntilClose, ResponseFraming::Length)
        })
    }
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, XorShift};

    fn parse(buf: &[u8]) -> Result<Option<ResponseHead>, ResponseError> {
        parse_response(buf, 16384, 100, false)
    }

    fn framing(buf: &str) -> Result<ResponseFraming, ResponseError> {
        parse(buf.as_bytes()).map(|h| h.unwrap().framing())
    }

    #[test]
    fn parses_a_simple_response() {
        let h = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b \r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!(h.status(), 200);
        assert_eq!(h.framing(), ResponseFraming::Length(5));
        assert_eq!(h.header("x-a"), Some(&b"b"[..]));
        assert_eq!(h.head_len(), 48);
        assert!(h.keep_alive());
        let names: Vec<&str> = h.headers().map(|(n, _)| n).collect();
        assert_eq!(names, ["Content-Length", "X-A"]);
    }

    #[test]
    fn incomplete_and_too_large() {
        assert!(parse(b"HTTP/1.1 200 OK\r\nA: b\r\n").unwrap().is_none());
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r").unwrap().is_none());
        let big = format!("HTTP/1.1 200 OK\r\nA: {}\r\n\r\n", "x".repeat(20000));
        assert_eq!(
            parse(big.as_bytes()).unwrap_err(),
            ResponseError::HeadTooLarge
        );
    }

    #[test]
    fn framing_follows_rfc_9112() {
        use ResponseFraming::*;
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(Chunked)
        );
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), Ok(UntilClose));
        assert_eq!(framing("HTTP/1.1 204 No Content\r\n\r\n"), Ok(None));
        assert_eq!(
            framing("HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"),
            Ok(None)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n"),
            Ok(Length(3))
        );
        let h = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            1024,
            10,
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing(), None);
        let h = parse(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive());
        let h = parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive());
        let h = parse(b"HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive(), "a body until close ends the connection");
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        use ResponseError::*;
        for (text, want) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", ContentLengthWithTransferEncoding),
            ("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", InvalidContentLength),
            ("HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n", InvalidContentLength),
            ("HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", InvalidContentLength),
            ("HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n", InvalidContentLength),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", InvalidTransferEncoding),
            // A coding the proxy would strip without decoding it.
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", InvalidTransferEncoding),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", InvalidTransferEncoding),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", InvalidTransferEncoding),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n", InvalidTransferEncoding),
            ("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", InvalidTransferEncoding),
            ("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", BodyNotAllowed),
            ("HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", BareLineEnding),
            ("HTTP/1.1 200 OK\nX: a\r\n\r\n", BareLineEnding),
            ("HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", InvalidHeaderValue),
            ("HTTP/1.1 200 OK\r\nX : a\r\n\r\n", InvalidHeaderName),
            ("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", ObsoleteLineFolding),
            ("HTTP/1.1 2000 OK\r\n\r\n", InvalidStatusLine),
            ("HTTP/1.1 099 OK\r\n\r\n", InvalidStatusLine),
            ("HTTP/2.0 200 OK\r\n\r\n", InvalidStatusLine),
            ("HTTP/1.1  200 OK\r\n\r\n", InvalidStatusLine),
            ("HTTP/1.1 200\tOK\r\n\r\n", InvalidStatusLine),
        ] {
            assert_eq!(parse(text.as_bytes()).unwrap_err(), want, "{text:?}");
        }
    }

    /// The byte-at-a-time scanner `find_head_end` replaced: the reference.
    fn find_head_end_bytewise(window: &[u8]) -> Result<Option<usize>, ResponseError> {
        let mut line_start = 0;
        for (i, &b) in window.iter().enumerate() {
            match b {
                b'\n' => {
                    if i == 0 || window.get(i - 1) != Some(&b'\r') {
                        return Err(ResponseError::BareLineEnding);
                    }
                    if i + 1 - line_start == 2 && line_start > 0 {
                        return Ok(Some(i + 1));
                    }
                    line_start = i + 1;
                }
                b'\r' if window.get(i + 1).is_some_and(|&n| n != b'\n') => {
                    return Err(ResponseError::BareLineEnding);
                }
                _ => {}
            }
        }
        Ok(None)
    }

    #[test]
    fn the_head_end_is_found_as_the_bytewise_scan_finds_it() {
        let seeds: [&[u8]; 4] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"\r\n\r\nHTTP/1.1 200 OK\r\nA: b\r\n\r",
            b"HTTP/1.1 200 OK\r\r\n\n\r\n\r\n",
        ];
        let mut rng = XorShift(0x0eed_5678);
        for i in 0..50_000 {
            let seed = seeds[i % seeds.len()];
            let input = if i < seeds.len() {
                seed.to_vec()
            } else {
                mutate(&mut rng, seed)
            };
            for end in [input.len(), input.len() / 2, 1, 0] {
                let w = &input[..end.min(input.len())];
                assert_eq!(find_head_end(w), find_head_end_bytewise(w), "{w:?}");
            }
        }
    }

    #[test]
    fn mutated_responses_never_panic_and_never_leak_ctls() {
        let seeds: [&[u8]; 3] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.0 304 Not Modified\r\nConnection: keep-alive\r\n\r\n",
        ];
        let mut rng = XorShift(0x5eed_1234);
        for i in 0..20_000 {
            let seed = seeds[i % seeds.len()];
            let input = mutate(&mut rng, seed);
            if let Ok(Some(h)) = parse(&input) {
                for (n, v) in h.headers() {
                    assert!(!n.is_empty());
                    assert!(!v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0));
                }
            }
        }
    }
}
