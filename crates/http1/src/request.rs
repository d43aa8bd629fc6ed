//! Request-head parsing and body framing (RFC 9112 §2-§6).
//!
//! Owns everything between the first byte of a request and the blank line
//! ending its head: line-ending discipline, the request line, header fields
//! (tokenised by `httparse`, then re-checked), Host rules, and the choice of
//! [`BodyFraming`] from Content-Length / Transfer-Encoding. The result is an
//! owned [`RequestHead`] that stores the raw head bytes once plus offsets.

use std::fmt;

use crate::error::ParseError;
use crate::syntax::{self, Span};
use crate::target;

/// Empty lines tolerated before the request line (RFC 9112 §2.2 "at least one").
const MAX_LEADING_EMPTY_LINES: usize = 4;

/// Headers up to this count are tokenised into a stack array, not the heap.
const STACK_HEADERS: usize = 32;

/// Size limits applied while parsing a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum bytes of the whole head, including leading empty lines and the final CRLFCRLF.
    pub max_head_bytes: usize,
    /// Maximum bytes of the request-target.
    pub max_target_bytes: usize,
    /// Maximum number of header field lines.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 16384,
            max_target_bytes: 8192,
            max_headers: 100,
        }
    }
}

/// The request method. Methods are case-sensitive, so `get` is `Other("get")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
    /// OPTIONS
    Options,
    /// PATCH
    Patch,
    /// TRACE
    Trace,
    /// CONNECT
    Connect,
    /// A syntactically valid token that is not one of the above.
    Other(String),
}

impl Method {
    /// The method as sent on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
            Self::Options => "OPTIONS",
            Self::Patch => "PATCH",
            Self::Trace => "TRACE",
            Self::Connect => "CONNECT",
            Self::Other(s) => s,
        }
    }

    /// The method named by `token`, which must already be validated as a
    /// token (hence ASCII), as HTTP/2's `:method` is by the `h2` crate.
    pub fn from_token(token: &[u8]) -> Self {
        match token {
            b"GET" => Self::Get,
            b"HEAD" => Self::Head,
            b"POST" => Self::Post,
            b"PUT" => Self::Put,
            b"DELETE" => Self::Delete,
            b"OPTIONS" => Self::Options,
            b"PATCH" => Self::Patch,
            b"TRACE" => Self::Trace,
            b"CONNECT" => Self::Connect,
            other => Self::Other(String::from_utf8_lossy(other).into_owned()),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// HTTP/1.0
    Http10,
    /// HTTP/1.1
    Http11,
}

impl Version {
    /// The version as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http10 => "HTTP/1.0",
            Self::Http11 => "HTTP/1.1",
        }
    }
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    None,
    /// Exactly this many bytes follow the head.
    ContentLength(u64),
    /// A chunked body follows; decode it with [`crate::ChunkedDecoder`].
    Chunked,
}

#[derive(Debug, Clone, Copy)]
struct FieldSpan {
    name: Span,
    value: Span,
}

/// An owned, parsed request head: the raw head bytes plus offsets into them.
#[derive(Debug, Clone)]
pub struct RequestHead {
    raw: Box<[u8]>,
    method: Method,
    version: Version,
    target: Span,
    /// `None` is the implied "/" of an absolute-form target without a path.
    path: Option<Span>,
    query: Option<Span>,
    authority: Option<Span>,
    host_header: Option<Span>,
    fields: Vec<FieldSpan>,
    body: BodyFraming,
    keep_alive: bool,
}

impl RequestHead {
    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The raw request-target as sent.
    pub fn target(&self) -> &[u8] {
        self.target.slice(&self.raw)
    }

    /// The path of an origin-form or absolute-form target, without the query
    /// ("/" when an absolute-form target has none); "*" for asterisk-form and
    /// empty for authority-form (CONNECT).
    pub fn path(&self) -> &[u8] {
        match self.path {
            Some(span) => span.slice(&self.raw),
            None => b"/",
        }
    }

    /// The query (after '?', which is excluded), if the target has one.
    pub fn query(&self) -> Option<&[u8]> {
        self.query.map(|s| s.slice(&self.raw))
    }

    /// The request's HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The first header named `name` (case-insensitive), OWS-trimmed.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| {
                f.name
                    .slice(&self.raw)
                    .eq_ignore_ascii_case(name.as_bytes())
            })
            .map(|f| f.value.slice(&self.raw))
    }

    /// Whether the client waits for a 100 (Continue) before its body: an
    /// HTTP/1.1 `Expect: 100-continue` (HTTP/1.0's is ignored, RFC 9110
    /// §10.1.1).
    pub fn expects_continue(&self) -> bool {
        self.version == Version::Http11
            && self
                .header("expect")
                .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"))
    }

    /// Every line of the header named `name`, joined with ", " as one
    /// list (RFC 9110 §5.3); borrowed unless the field is repeated.
    pub fn joined(&self, name: &str) -> Option<std::borrow::Cow<'_, [u8]>> {
        let mut values = self
            .fields
            .iter()
            .filter(|f| {
                f.name
                    .slice(&self.raw)
                    .eq_ignore_ascii_case(name.as_bytes())
            })
            .map(|f| f.value.slice(&self.raw));
        let first = values.next()?;
        let Some(second) = values.next() else {
            return Some(std::borrow::Cow::Borrowed(first));
        };
        let mut all = first.to_vec();
        for v in std::iter::once(second).chain(values) {
            all.extend_from_slice(b", ");
            all.extend_from_slice(v);
        }
        Some(std::borrow::Cow::Owned(all))
    }

    /// All header fields in order, names as sent, values OWS-trimmed.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.fields.iter().map(move |f| {
            // Names were validated as tokens, so they are ASCII.
            let name = std::str::from_utf8(f.name.slice(&self.raw)).unwrap_or_default();
            (name, f.value.slice(&self.raw))
        })
    }

    /// The authority of an absolute-form or authority-form target if there is
    /// one (RFC 9112 §3.2.2: it overrides Host), else the Host header value.
    pub fn host(&self) -> Option<&[u8]> {
        self.authority
            .or(self.host_header)
            .map(|s| s.slice(&self.raw))
    }

    /// How the body that follows the head is framed.
    pub fn body(&self) -> BodyFraming {
        self.body
    }

    /// Whether the connection may be reused after this request (RFC 9112 §9.3).
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Bytes of the head, including skipped leading empty lines and the final
    /// CRLFCRLF; the body (if any) starts at this offset of the parsed buffer.
    pub fn head_len(&self) -> usize {
        self.raw.len()
    }
}

/// Parse one request head from the start of `buf`.
///
/// `Ok(None)` means the head is incomplete and more bytes are needed, unless
/// `buf` already holds more than `limits.max_head_bytes` without a complete
/// head, which is [`ParseError::HeadTooLarge`]. Errors that are certain from
/// a partial head (bad line endings, an over-long target, a bad method) are
/// reported without waiting for the rest.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Result<Option<RequestHead>, ParseError> {
    match scan_head(buf, limits)? {
        Some(scan) => build_head(buf, &scan).map(Some),
        None => Ok(None),
    }
}

#[derive(Debug, Clone, Copy)]
struct RequestLine {
    method: Span,
    target: Span,
    version: Version,
}

/// Result of the line-level pre-scan of a complete head.
#[derive(Debug, Clone, Copy)]
struct Scan {
    head_len: usize,
    request_line: RequestLine,
    header_lines: usize,
}

/// Walks the head line by line enforcing what httparse is lenient about:
/// CRLF-only line endings, leading empty lines, obs-fold, the request line's
/// exact shape, and the size limits (so they apply to partial heads too).
fn scan_head(buf: &[u8], limits: &Limits) -> Result<Option<Scan>, ParseError> {
    // Bytes past the limit can never be part of an acceptable head.
    let window = buf.get(..limits.max_head_bytes).unwrap_or(buf);
    let incomplete = || {
        if buf.len() > limits.max_head_bytes {
            Err(ParseError::HeadTooLarge)
        } else {
            Ok(None)
        }
    };

    let mut pos = 0;
    let mut empty_lines = 0;
    loop {
        match window.get(pos..).unwrap_or_default() {
            [b'\r', b'\n', ..] => {
                empty_lines += 1;
                if empty_lines > MAX_LEADING_EMPTY_LINES {
                    return Err(ParseError::TooManyLeadingEmptyLines);
                }
                pos += 2;
            }
            [] | [b'\r'] => return incomplete(),
            [b'\r', ..] | [b'\n', ..] => return Err(ParseError::BareLineEnding),
            _ => break,
        }
    }

    let mut request_line: Option<RequestLine> = None;
    let mut header_lines = 0usize;
    loop {
        let rest = window.get(pos..).unwrap_or_default();
        let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
            // Partial line: reject now what can never become valid.
            let partial = rest.strip_suffix(b"\r").unwrap_or(rest);
            if partial.contains(&b'\r') {
                return Err(ParseError::BareLineEnding);
            }
            match request_line {
                None => {
                    parse_request_line(partial, pos, false, limits)?;
                }
                Some(_) => {
                    if partial.first().is_some_and(|&b| syntax::is_ows(b)) {
                        return Err(ParseError::ObsoleteLineFolding);
                    }
                }
            }
            return incomplete();
        };
        let line = rest.get(..lf).unwrap_or_default();
        let Some(content) = line.strip_suffix(b"\r") else {
            return Err(ParseError::BareLineEnding);
        };
        if content.contains(&b'\r') {
            return Err(ParseError::BareLineEnding);
        }
        let line_end = pos + lf + 1;
        match request_line {
            None => {
                let parsed = parse_request_line(content, pos, true, limits)?;
                // A complete line always yields Some; None would be a bug, refuse it.
                request_line = Some(parsed.ok_or(ParseError::InvalidRequestLine)?);
            }
            Some(rl) if content.is_empty() => {
                return Ok(Some(Scan {
                    head_len: line_end,
                    request_line: rl,
                    header_lines,
                }));
            }
            Some(_) => {
                if content.first().is_some_and(|&b| syntax::is_ows(b)) {
                    return Err(ParseError::ObsoleteLineFolding);
                }
                header_lines += 1;
                if header_lines > limits.max_headers {
                    return Err(ParseError::TooManyHeaders);
                }
            }
        }
        pos = line_end;
    }
}

/// Checks `method SP request-target SP HTTP-version` (RFC 9112 §3) with
/// exactly one SP between parts. With `complete == false`, `line` is a prefix
/// and only errors already certain are reported (`Ok(None)` otherwise).
/// `base` is the offset of `line` in the buffer, for the returned spans.
fn parse_request_line(
    line: &[u8],
    base: usize,
    complete: bool,
    limits: &Limits,
) -> Result<Option<RequestLine>, ParseError> {
    let find_sp = |s: &[u8]| s.iter().position(|&b| b == b' ');

    let Some(method_len) = find_sp(line) else {
        if !line.iter().all(|&b| syntax::is_tchar(b)) {
            return Err(ParseError::InvalidMethod);
        }
        return if complete {
            Err(ParseError::InvalidRequestLine)
        } else {
            Ok(None)
        };
    };
    let (method, after_method) = line.split_at(method_len);
    if method.is_empty() {
        return Err(ParseError::InvalidRequestLine);
    }
    if !syntax::is_token(method) {
        return Err(ParseError::InvalidMethod);
    }

    let after_method = after_method.get(1..).unwrap_or_default();
    let target_len = find_sp(after_method);
    let target = after_method
        .get(..target_len.unwrap_or(after_method.len()))
        .unwrap_or_default();
    if !crate::target::is_target_text(target) {
        return Err(ParseError::InvalidTarget);
    }
    if target.len() > limits.max_target_bytes {
        return Err(ParseError::TargetTooLong);
    }
    let Some(target_len) = target_len else {
        return if complete {
            Err(ParseError::InvalidRequestLine)
        } else {
            Ok(None)
        };
    };
    if target_len == 0 {
        return Err(ParseError::InvalidRequestLine);
    }

    let version = after_method.get(target_len + 1..).unwrap_or_default();
    if version.contains(&b' ') {
        return Err(ParseError::InvalidRequestLine);
    }
    if !complete {
        return if version.len() > 8 {
            Err(ParseError::InvalidVersion)
        } else {
            Ok(None)
        };
    }
    let version = match version {
        b"HTTP/1.1" => Version::Http11,
        b"HTTP/1.0" => Version::Http10,
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(ParseError::UnsupportedVersion);
        }
        _ => return Err(ParseError::InvalidVersion),
    };

    let target_start = base + method_len + 1;
    Ok(Some(RequestLine {
        method: Span::new(base, base + method_len),
        target: Span::new(target_start, target_start + target_len),
        version,
    }))
}

/// Tokenises the complete head with httparse and applies the semantic rules.
fn build_head(buf: &[u8], scan: &Scan) -> Result<RequestHead, ParseError> {
    let head = buf.get(..scan.head_len).unwrap_or_default();
    let rl = scan.request_line;
    let method = Method::from_token(rl.method.slice(head));
    let parts = target::parse_target(&method, rl.target.slice(head))?;

    let fields = tokenise_fields(head, scan.header_lines)?;

    let mut host_header = None;
    let mut host_count = 0usize;
    let mut content_length: Option<u64> = None;
    let mut te = TransferEncoding::default();
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    for f in &fields {
        let name = f.name.slice(head);
        let value = f.value.slice(head);
        if name.eq_ignore_ascii_case(b"host") {
            host_count += 1;
            host_header.get_or_insert(f.value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(value)?;
            match content_length {
                Some(prev) if prev != n => return Err(ParseError::ConflictingContentLength),
                _ => content_length = Some(n),
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            te.add(value)?;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in syntax::list_elements(value) {
                conn_close |= option.eq_ignore_ascii_case(b"close");
                conn_keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }

    // RFC 9112 §3.2: exactly one Host in 1.1; never more than one.
    if host_count > 1 {
        return Err(ParseError::DuplicateHost);
    }
    if host_count == 0 && rl.version == Version::Http11 {
        return Err(ParseError::MissingHost);
    }
    if let Some(span) = host_header {
        let value = span.slice(head);
        // An empty Host is valid when the target has no authority (RFC 9110 §7.2).
        if !value.is_empty() && !target::is_valid_host(value, false) {
            return Err(ParseError::InvalidHost);
        }
    }

    let body = if te.present {
        if rl.version == Version::Http10 {
            return Err(ParseError::TransferEncodingInHttp10);
        }
        // Both framings at once is the classic smuggling vector: refuse.
        if content_length.is_some() {
            return Err(ParseError::ContentLengthWithTransferEncoding);
        }
        te.framing()?
    } else {
        content_length.map_or(BodyFraming::None, BodyFraming::ContentLength)
    };

    let keep_alive = match rl.version {
        Version::Http11 => !conn_close,
        Version::Http10 => conn_keep_alive && !conn_close,
    };

    let shift = |s: Span| s.shift(rl.target.start);
    Ok(RequestHead {
        raw: head.into(),
        method,
        version: rl.version,
        target: rl.target,
        path: parts.path.map(shift),
        query: parts.query.map(shift),
        authority: parts.authority.map(shift),
        host_header,
        fields,
        body,
        keep_alive,
    })
}

/// Runs httparse over the head and records each field as offsets into `head`.
fn tokenise_fields(head: &[u8], header_lines: usize) -> Result<Vec<FieldSpan>, ParseError> {
    let mut stack = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots = match stack.get_mut(..header_lines) {
        Some(slots) => slots,
        None => {
            heap.resize(header_lines, httparse::EMPTY_HEADER);
            heap.as_mut_slice()
        }
    };
    let mut req = httparse::Request::new(slots);
    match req.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        // httparse disagreeing with our scan about where the head ends: refuse.
        Ok(_) => return Err(ParseError::InvalidRequestLine),
        Err(e) => return Err(map_httparse_error(e)),
    }

    let mut fields = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        // Re-check values ourselves so a change in httparse's leniency can't
        // let CTLs through.
        if !h.value.iter().all(|&b| syntax::is_field_value_byte(b)) {
            return Err(ParseError::InvalidHeaderValue);
        }
        let name = span_of(head, h.name.as_bytes()).ok_or(ParseError::InvalidHeaderName)?;
        let value = span_of(head, h.value).ok_or(ParseError::InvalidHeaderValue)?;
        fields.push(FieldSpan { name, value });
    }
    Ok(fields)
}

fn map_httparse_error(e: httparse::Error) -> ParseError {
    match e {
        httparse::Error::HeaderName => ParseError::InvalidHeaderName,
        httparse::Error::HeaderValue => ParseError::InvalidHeaderValue,
        httparse::Error::NewLine => ParseError::BareLineEnding,
        httparse::Error::TooManyHeaders => ParseError::TooManyHeaders,
        httparse::Error::Version => ParseError::InvalidVersion,
        httparse::Error::Token | httparse::Error::Status => ParseError::InvalidRequestLine,
    }
}

/// Offset range of `sub` inside `base`, if `sub` really is a sub-slice of it.
fn span_of(base: &[u8], sub: &[u8]) -> Option<Span> {
    let start = (sub.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(sub.len())?;
    (end <= base.len()).then_some(Span::new(start, end))
}

/// `1*DIGIT`, or a comma list of identical such values (RFC 9110 §8.6).
fn parse_content_length(value: &[u8]) -> Result<u64, ParseError> {
    let mut result: Option<u64> = None;
    for element in syntax::list_elements(value) {
        if element.is_empty() || !element.iter().all(u8::is_ascii_digit) {
            return Err(ParseError::InvalidContentLength);
        }
        let n = element
            .iter()
            .try_fold(0u64, |acc, &d| {
                acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
            .ok_or(ParseError::InvalidContentLength)?;
        match result {
            Some(prev) if prev != n => return Err(ParseError::ConflictingContentLength),
            _ => result = Some(n),
        }
    }
    result.ok_or(ParseError::InvalidContentLength)
}

/// Accumulates the codings of all Transfer-Encoding lines, in order.
#[derive(Debug, Default)]
struct TransferEncoding {
    present: bool,
    chunked_count: usize,
    last_is_chunked: bool,
    other_coding: bool,
}

impl TransferEncoding {
    fn add(&mut self, value: &[u8]) -> Result<(), ParseError> {
        self.present = true;
        for element in syntax::list_elements(value) {
            // Empty list elements are ignored (RFC 9110 §5.6.1).
            if element.is_empty() {
                continue;
            }
            let (name, params) = match element.iter().position(|&b| b == b';') {
                Some(i) => element.split_at(i),
                None => (element, &b""[..]),
            };
            let name = syntax::trim_ows(name);
            if !syntax::is_token(name) {
                return Err(ParseError::InvalidTransferEncoding);
            }
            if name.eq_ignore_ascii_case(b"chunked") {
                // chunked takes no parameters.
                if !params.is_empty() {
                    return Err(ParseError::InvalidTransferEncoding);
                }
                self.chunked_count += 1;
                self.last_is_chunked = true;
            } else {
                self.other_coding = true;
                self.last_is_chunked = false;
            }
        }
        Ok(())
    }

    /// Without a final, single chunked the length is unknowable (400); with
    /// one, any other coding is merely unimplemented (501).
    fn framing(&self) -> Result<BodyFraming, ParseError> {
        if self.chunked_count != 1 || !self.last_is_chunked {
            return Err(ParseError::InvalidTransferEncoding);
        }
        if self.other_coding {
            return Err(ParseError::UnsupportedTransferCoding);
        }
        Ok(BodyFraming::Chunked)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, XorShift};

    fn parse(buf: &[u8]) -> Result<Option<RequestHead>, ParseError> {
        parse_request(buf, &Limits::default())
    }

    fn ok(buf: &[u8]) -> RequestHead {
        match parse(buf) {
            Ok(Some(h)) => h,
            other => panic!(
                "expected a head for {:?}, got {other:?}",
                String::from_utf8_lossy(buf)
            ),
        }
    }

    fn err(buf: &[u8]) -> ParseError {
        match parse(buf) {
            Err(e) => e,
            other => panic!(
                "expected an error for {:?}, got {other:?}",
                String::from_utf8_lossy(buf)
            ),
        }
    }

    /// A GET request with the given extra header lines (each without CRLF).
    fn get_with(headers: &[&str]) -> Vec<u8> {
        let mut s = String::from("GET / HTTP/1.1\r\nHost: example.com\r\n");
        for h in headers {
            s.push_str(h);
            s.push_str("\r\n");
        }
        s.push_str("\r\n");
        s.into_bytes()
    }

    #[test]
    fn parses_simple_request() {
        let buf = b"GET /a/b?x=1&y HTTP/1.1\r\nHost: example.com\r\nX-Thing:  v1 \t\r\nx-thing: v2\r\n\r\nBODY";
        let h = ok(buf);
        assert_eq!(h.method(), &Method::Get);
        assert_eq!(h.target(), b"/a/b?x=1&y");
        assert_eq!(h.path(), b"/a/b");
        assert_eq!(h.query(), Some(&b"x=1&y"[..]));
        assert_eq!(h.version(), Version::Http11);
        assert_eq!(h.header("x-thing"), Some(&b"v1"[..]));
        assert_eq!(h.header("HOST"), Some(&b"example.com"[..]));
        assert_eq!(h.header("missing"), None);
        let all: Vec<_> = h.headers().collect();
        assert_eq!(
            all,
            vec![
                ("Host", &b"example.com"[..]),
                ("X-Thing", b"v1"),
                ("x-thing", b"v2")
            ]
        );
        assert_eq!(h.host(), Some(&b"example.com"[..]));
        assert_eq!(h.body(), BodyFraming::None);
        assert!(h.keep_alive());
        assert_eq!(h.head_len(), buf.len() - 4);
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let buf = b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n";
        for n in 0..buf.len() {
            assert_eq!(
                parse(&buf[..n]).unwrap().map(|h| h.head_len()),
                None,
                "prefix {n}"
            );
        }
        assert_eq!(ok(buf).body(), BodyFraming::ContentLength(3));
    }

    #[test]
    fn leading_empty_lines() {
        let buf = b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(ok(buf).head_len(), buf.len());
        assert_eq!(parse(b"\r\n\r").unwrap().map(|h| h.head_len()), None);
        let many = b"\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(err(many), ParseError::TooManyLeadingEmptyLines);
        assert_eq!(
            err(b"\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::BareLineEnding
        );
        assert_eq!(
            err(b"\rGET / HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::BareLineEnding
        );
    }

    #[test]
    fn line_endings_must_be_crlf() {
        assert!(parse(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").is_ok());
        for bad in [
            &b"GET / HTTP/1.1\nHost: h\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: h\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\n\n",
            b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\nHost: h\r\n\r\n",
            b"GET /\r HTTP/1.1\r\nHost: h\r\n\r\n",
            // detected while still incomplete
            b"GET / HTTP/1.1\r\nX: a\rb",
            b"GET / HTTP/1.1\nHo",
        ] {
            assert_eq!(
                err(bad),
                ParseError::BareLineEnding,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn request_line_spacing() {
        for bad in [
            &b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET /  HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
            b" GET / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /\r\nHost: h\r\n\r\n",
            b"GET\r\nHost: h\r\n\r\n",
            b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert_eq!(
                err(bad),
                ParseError::InvalidRequestLine,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            err(b"GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::InvalidMethod
        );
        assert_eq!(
            err(b"GET /\tHTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::InvalidTarget
        );
    }

    #[test]
    fn method_is_token_and_unknown_is_other() {
        assert_eq!(
            ok(b"PATCH / HTTP/1.1\r\nHost: h\r\n\r\n").method(),
            &Method::Patch
        );
        let h = ok(b"BREW / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(h.method(), &Method::Other("BREW".into()));
        assert_eq!(h.method().as_str(), "BREW");
        // Methods are case-sensitive.
        assert_eq!(
            ok(b"get / HTTP/1.1\r\nHost: h\r\n\r\n").method(),
            &Method::Other("get".into())
        );
        assert_eq!(
            err(b"GE(T / HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::InvalidMethod
        );
        assert_eq!(
            err(b"G\xc3\xa9T / HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseError::InvalidMethod
        );
        // Detected before the line is complete.
        assert_eq!(err(b"GE@T"), ParseError::InvalidMethod);
        for (m, s) in [
            (Method::Get, "GET"),
            (Method::Head, "HEAD"),
            (Method::Post, "POST"),
            (Method::Put, "PUT"),
            (Method::Delete, "DELETE"),
            (Method::Options, "OPTIONS"),
            (Method::Trace, "TRACE"),
            (Method::Connect, "CONNECT"),
        ] {
            assert_eq!(Method::from_token(s.as_bytes()), m);
            assert_eq!(m.to_string(), s);
        }
    }

    #[test]
    fn versions() {
        let h = ok(b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!(h.version(), Version::Http10);
        assert_eq!(h.version().as_str(), "HTTP/1.0");
        for v in ["HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/3.0"] {
            let buf = format!("GET / {v}\r\nHost: h\r\n\r\n");
            assert_eq!(err(buf.as_bytes()), ParseError::UnsupportedVersion, "{v}");
        }
        for v in [
            "HTTP/1.1x",
            "HTTP/11",
            "http/1.1",
            "HTTP/1",
            "HTTP/1.x",
            "HTTPS/1.1",
            "HTTP/2",
        ] {
            let buf = format!("GET / {v}\r\nHost: h\r\n\r\n");
            assert_eq!(err(buf.as_bytes()), ParseError::InvalidVersion, "{v}");
        }
        assert_eq!(ParseError::UnsupportedVersion.status(), 505);
        // Over-long version rejected while incomplete.
        assert_eq!(err(b"GET / HTTP/1.1.1"), ParseError::InvalidVersion);
    }

    #[test]
    fn target_bytes() {
        assert_eq!(
            ok(b"GET /%7Efoo!$&'()*+,;=:@-._~ HTTP/1.1\r\nHost: h\r\n\r\n").path(),
            b"/%7Efoo!$&'()*+,;=:@-._~"
        );
        for bad in [
            &b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET /a\x01 HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /a\x00 HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /a#frag HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert_eq!(
                err(bad),
                ParseError::InvalidTarget,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn target_too_long() {
        let limits = Limits {
            max_target_bytes: 10,
            ..Limits::default()
        };
        let at_limit = b"GET /123456789 HTTP/1.1\r\nHost: h\r\n\r\n";
        assert!(parse_request(at_limit, &limits).unwrap().is_some());
        let over = b"GET /1234567890 HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(
            parse_request(over, &limits).unwrap_err(),
            ParseError::TargetTooLong
        );
        // Partial target already over the limit.
        assert_eq!(
            parse_request(b"GET /1234567890", &limits).unwrap_err(),
            ParseError::TargetTooLong
        );
        // Partial target still within it.
        assert!(parse_request(b"GET /123456789", &limits).unwrap().is_none());
        // Request line complete, head not.
        assert_eq!(
            parse_request(b"GET /1234567890 HTTP/1.1\r\nHo", &limits).unwrap_err(),
            ParseError::TargetTooLong
        );
        assert_eq!(ParseError::TargetTooLong.status(), 414);
    }

    #[test]
    fn target_forms() {
        let h = ok(b"GET http://Example.com:8080 HTTP/1.1\r\nHost: other\r\n\r\n");
        assert_eq!(h.path(), b"/");
        assert_eq!(h.query(), None);
        assert_eq!(h.host(), Some(&b"Example.com:8080"[..]));
        let h = ok(b"GET HTTPS://e.com/x?q=1 HTTP/1.1\r\nHost: e.com\r\n\r\n");
        assert_eq!(h.path(), b"/x");
        assert_eq!(h.query(), Some(&b"q=1"[..]));
        let h = ok(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(h.path(), b"*");
        assert_eq!(h.query(), None);
        let h = ok(b"CONNECT e.com:443 HTTP/1.1\r\nHost: e.com:443\r\n\r\n");
        assert_eq!(h.host(), Some(&b"e.com:443"[..]));
        assert_eq!(h.path(), b"");
        for bad in [
            &b"GET * HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"CONNECT / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET e.com:443 HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET ftp://e.com/ HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET foo HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET http://u@e.com/ HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET http:/// HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert_eq!(
                err(bad),
                ParseError::InvalidTarget,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn header_names() {
        assert!(parse(&get_with(&["X-Ok_1.~!#$%&'*+^`|: v"])).is_ok());
        for bad in [
            "Bad Name: v",
            "Host : v",
            "Na(me: v",
            ": v",
            "NoColon",
            "X\u{e9}: v",
        ] {
            assert_eq!(
                err(&get_with(&[bad])),
                ParseError::InvalidHeaderName,
                "{bad}"
            );
        }
    }

    #[test]
    fn obs_fold_rejected() {
        assert_eq!(
            err(&get_with(&["X: a", " b"])),
            ParseError::ObsoleteLineFolding
        );
        assert_eq!(
            err(&get_with(&["X: a", "\tb"])),
            ParseError::ObsoleteLineFolding
        );
        assert_eq!(
            err(b"GET / HTTP/1.1\r\n Host: h\r\n\r\n"),
            ParseError::ObsoleteLineFolding
        );
        // Detected while incomplete.
        assert_eq!(
            err(b"GET / HTTP/1.1\r\nHost: h\r\n x"),
            ParseError::ObsoleteLineFolding
        );
        // Whitespace inside a value is fine.
        assert_eq!(
            ok(&get_with(&["X: a \t b"])).header("x"),
            Some(&b"a \t b"[..])
        );
    }

    #[test]
    fn header_values() {
        assert_eq!(ok(&get_with(&["X:\tv\t"])).header("x"), Some(&b"v"[..]));
        assert_eq!(ok(&get_with(&["X:"])).header("x"), Some(&b""[..]));
        let obs_text = b"GET / HTTP/1.1\r\nHost: h\r\nX: caf\xe9\r\n\r\n";
        assert_eq!(ok(obs_text).header("x"), Some(&b"caf\xe9"[..]));
        for bad in ["X: a\0b", "X: \u{1}", "X: a\u{7f}", "X: \u{1b}[0m"] {
            assert_eq!(
                err(&get_with(&[bad])),
                ParseError::InvalidHeaderValue,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn header_count_limit() {
        let hundred: Vec<String> = (0..99).map(|i| format!("X-{i}: v")).collect();
        let refs: Vec<&str> = hundred.iter().map(String::as_str).collect();
        let h = ok(&get_with(&refs)); // 99 + Host = 100
        assert_eq!(h.headers().count(), 100);
        assert_eq!(h.header("x-98"), Some(&b"v"[..]));
        let mut more = refs.clone();
        more.push("X-Extra: v");
        assert_eq!(err(&get_with(&more)), ParseError::TooManyHeaders);
        assert_eq!(ParseError::TooManyHeaders.status(), 431);
        let limits = Limits {
            max_headers: 1,
            ..Limits::default()
        };
        assert!(parse_request(&get_with(&[]), &limits).unwrap().is_some());
        assert_eq!(
            parse_request(&get_with(&["A: b"]), &limits).unwrap_err(),
            ParseError::TooManyHeaders
        );
    }

    #[test]
    fn head_size_limit() {
        let buf = get_with(&["X: 0123456789"]);
        let exact = Limits {
            max_head_bytes: buf.len(),
            ..Limits::default()
        };
        assert_eq!(
            parse_request(&buf, &exact).unwrap().unwrap().head_len(),
            buf.len()
        );
        let small = Limits {
            max_head_bytes: buf.len() - 1,
            ..Limits::default()
        };
        assert_eq!(
            parse_request(&buf, &small).unwrap_err(),
            ParseError::HeadTooLarge
        );
        // Incomplete but already past the limit.
        let partial = &buf[..buf.len() - 2];
        let tiny = Limits {
            max_head_bytes: 20,
            ..Limits::default()
        };
        assert_eq!(
            parse_request(partial, &tiny).unwrap_err(),
            ParseError::HeadTooLarge
        );
        assert!(parse_request(&partial[..20], &tiny).unwrap().is_none());
    }

    #[test]
    fn host_rules() {
        assert_eq!(err(b"GET / HTTP/1.1\r\n\r\n"), ParseError::MissingHost);
        assert_eq!(err(&get_with(&["Host: b"])), ParseError::DuplicateHost);
        assert_eq!(
            err(&get_with(&["host: example.com"])),
            ParseError::DuplicateHost
        );
        assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").host(), None);
        assert_eq!(
            ok(b"GET / HTTP/1.0\r\nHost: h\r\n\r\n").host(),
            Some(&b"h"[..])
        );
        assert_eq!(
            err(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"),
            ParseError::DuplicateHost
        );
        assert_eq!(
            ok(b"GET / HTTP/1.1\r\nHost:\r\n\r\n").host(),
            Some(&b""[..])
        );
        for good in ["h:8080", "[::1]:443", "127.0.0.1", "xn--d1acufc.xn--p1ai"] {
            let buf = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
            assert_eq!(ok(buf.as_bytes()).host(), Some(good.as_bytes()));
        }
        for bad in ["a b", "a/b", "u@h", "h:x", "h:", "a\tb", "a,b", "a;b=c"] {
            let buf = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(err(buf.as_bytes()), ParseError::InvalidHost, "{bad}");
        }
    }

    #[test]
    fn content_length() {
        let cl = |v: &str| parse(&get_with(&[&format!("Content-Length: {v}")]));
        assert_eq!(
            cl("42").unwrap().unwrap().body(),
            BodyFraming::ContentLength(42)
        );
        assert_eq!(
            cl("0").unwrap().unwrap().body(),
            BodyFraming::ContentLength(0)
        );
        assert_eq!(
            cl("\t42  ").unwrap().unwrap().body(),
            BodyFraming::ContentLength(42)
        );
        assert_eq!(
            cl("18446744073709551615").unwrap().unwrap().body(),
            BodyFraming::ContentLength(u64::MAX)
        );
        assert_eq!(
            cl("5, 5,5").unwrap().unwrap().body(),
            BodyFraming::ContentLength(5)
        );
        for bad in [
            "+42",
            "-1",
            "4 2",
            "0x10",
            "",
            "18446744073709551616",
            "5,",
            ",5",
            "1e3",
        ] {
            assert_eq!(
                cl(bad).unwrap_err(),
                ParseError::InvalidContentLength,
                "{bad:?}"
            );
        }
        assert_eq!(
            cl("5, 6").unwrap_err(),
            ParseError::ConflictingContentLength
        );
        let twice = get_with(&["Content-Length: 7", "content-length: 7"]);
        assert_eq!(ok(&twice).body(), BodyFraming::ContentLength(7));
        let differ = get_with(&["Content-Length: 7", "Content-Length: 8"]);
        assert_eq!(err(&differ), ParseError::ConflictingContentLength);
    }

    #[test]
    fn transfer_encoding() {
        let te = |vs: &[&str]| {
            let lines: Vec<String> = vs
                .iter()
                .map(|v| format!("Transfer-Encoding: {v}"))
                .collect();
            let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
            parse(&get_with(&refs))
        };
        assert_eq!(
            te(&["chunked"]).unwrap().unwrap().body(),
            BodyFraming::Chunked
        );
        assert_eq!(
            te(&["ChUnKeD"]).unwrap().unwrap().body(),
            BodyFraming::Chunked
        );
        assert_eq!(
            te(&[" , chunked"]).unwrap().unwrap().body(),
            BodyFraming::Chunked
        );
        assert_eq!(
            te(&["gzip"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(
            te(&["chunked, gzip"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(
            te(&["chunked, chunked"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(
            te(&["chunked", "chunked"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(
            te(&["chunked;x=1"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(te(&[""]).unwrap_err(), ParseError::InvalidTransferEncoding);
        assert_eq!(
            te(&["chu nked"]).unwrap_err(),
            ParseError::InvalidTransferEncoding
        );
        assert_eq!(
            te(&["gzip, chunked"]).unwrap_err(),
            ParseError::UnsupportedTransferCoding
        );
        assert_eq!(
            te(&["gzip", "CHUNKED"]).unwrap_err(),
            ParseError::UnsupportedTransferCoding
        );
        assert_eq!(ParseError::UnsupportedTransferCoding.status(), 501);

        let both = get_with(&["Transfer-Encoding: chunked", "Content-Length: 5"]);
        assert_eq!(err(&both), ParseError::ContentLengthWithTransferEncoding);
        let both = get_with(&["Content-Length: 5", "Transfer-Encoding: chunked"]);
        assert_eq!(err(&both), ParseError::ContentLengthWithTransferEncoding);
        let old = b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(err(old), ParseError::TransferEncodingInHttp10);
    }

    #[test]
    fn keep_alive() {
        assert!(ok(&get_with(&[])).keep_alive());
        assert!(ok(&get_with(&["Connection: upgrade"])).keep_alive());
        assert!(!ok(&get_with(&["Connection: close"])).keep_alive());
        assert!(!ok(&get_with(&["Connection: Keep-Alive, CLOSE"])).keep_alive());
        assert!(!ok(&get_with(&["Connection: foo", "Connection: close"])).keep_alive());
        assert!(!ok(b"GET / HTTP/1.0\r\n\r\n").keep_alive());
        assert!(ok(b"GET / HTTP/1.0\r\nConnection: foo, Keep-Alive\r\n\r\n").keep_alive());
        assert!(!ok(b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive());
        assert!(!ok(b"GET / HTTP/1.0\r\nConnection: keep-alive-ish\r\n\r\n").keep_alive());
    }

    #[test]
    fn many_headers_use_heap_slots() {
        let lines: Vec<String> = (0..STACK_HEADERS + 5)
            .map(|i| format!("X-{i}: {i}"))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let h = ok(&get_with(&refs));
        assert_eq!(h.headers().count(), STACK_HEADERS + 6);
        assert_eq!(h.header("x-36"), Some(&b"36"[..]));
    }

    #[test]
    fn property_never_panics_and_prefixes_agree() {
        let seeds: [&[u8]; 6] = [
            b"GET /a?b HTTP/1.1\r\nHost: h\r\n\r\n",
            b"\r\nPOST /up HTTP/1.1\r\nHost: h:80\r\nContent-Length: 5, 5\r\n\r\nhello",
            b"PUT http://e.com/x HTTP/1.1\r\nHost: e.com\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"OPTIONS * HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"CONNECT e.com:443 HTTP/1.1\r\nHost: e.com:443\r\nX: \t y \r\n\r\n",
            b"BREW /pot HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n",
        ];
        let limits = Limits {
            max_head_bytes: 120,
            max_target_bytes: 24,
            max_headers: 4,
        };
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for i in 0..4000 {
            let seed = seeds[i % seeds.len()];
            let input = mutate(&mut rng, seed);
            for lim in [&Limits::default(), &limits] {
                match parse_request(&input, lim) {
                    Ok(Some(h)) => {
                        accepted += 1;
                        assert!(h.head_len() <= input.len());
                        assert!(h.head_len() <= lim.max_head_bytes);
                        assert!(h.target().len() <= lim.max_target_bytes);
                        assert!(h.headers().count() <= lim.max_headers);
                        let _ = (h.path(), h.query(), h.host(), h.body(), h.keep_alive());
                        // Any shorter prefix must be "incomplete", never an error.
                        if i % 8 == 0 {
                            for n in 0..h.head_len() {
                                assert!(
                                    matches!(parse_request(&input[..n], lim), Ok(None)),
                                    "prefix {n} of {:?}",
                                    String::from_utf8_lossy(&input)
                                );
                            }
                        }
                    }
                    Ok(None) => assert!(input.len() <= lim.max_head_bytes),
                    Err(e) => assert!([400, 414, 431, 501, 505].contains(&e.status())),
                }
            }
        }
        // The mutator must leave enough inputs valid for the checks to bite.
        assert!(accepted > 500, "only {accepted} accepted");
    }
}
