//! Request-target forms (RFC 9112 §3.2) and Host / authority syntax.
//!
//! Decides which of the four target forms a request uses, rejects forms that
//! are not allowed for its method, and splits the target into path, query
//! and authority without copying.

use crate::error::ParseError;
use crate::request::Method;
use crate::syntax::Span;

/// The pieces of a request-target, as spans relative to the target itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TargetParts {
    /// `None` means the implied "/" of an absolute-form target without a path.
    pub(crate) path: Option<Span>,
    pub(crate) query: Option<Span>,
    /// Authority of an absolute-form or authority-form target.
    pub(crate) authority: Option<Span>,
}

/// Whether `target` has only what a request-target may: VCHAR, so no
/// whitespace, control or non-ASCII byte, and no `#` (a fragment is never
/// part of one). HTTP/2's `:path` is held to it too.
pub fn is_target_text(target: &[u8]) -> bool {
    target
        .iter()
        .all(|&b| matches!(b, 0x21..=0x7e) && b != b'#')
}

/// Classifies and splits `target` (already checked to contain only VCHARs).
pub(crate) fn parse_target(method: &Method, target: &[u8]) -> Result<TargetParts, ParseError> {
    let is_connect = *method == Method::Connect;
    if target.first() == Some(&b'/') {
        if is_connect {
            return Err(ParseError::InvalidTarget);
        }
        let (path, query) = split_path_query(target, 0);
        return Ok(TargetParts {
            path: Some(path),
            query,
            authority: None,
        });
    }
    if target == b"*" {
        // asterisk-form is only meaningful for a server-wide OPTIONS.
        if *method != Method::Options {
            return Err(ParseError::InvalidTarget);
        }
        return Ok(TargetParts {
            path: Some(Span::new(0, 1)),
            query: None,
            authority: None,
        });
    }
    if let Some(scheme_len) = http_scheme_len(target) {
        if is_connect {
            return Err(ParseError::InvalidTarget);
        }
        let rest = target.get(scheme_len..).unwrap_or_default();
        let auth_len = rest
            .iter()
            .position(|&b| b == b'/' || b == b'?')
            .unwrap_or(rest.len());
        let auth_end = scheme_len + auth_len;
        let authority = rest.get(..auth_len).unwrap_or_default();
        // http(s) URIs must have a non-empty host; userinfo is refused outright.
        if authority.is_empty() || !is_valid_host(authority, false) {
            return Err(ParseError::InvalidTarget);
        }
        let (path, query) = match target.get(auth_end) {
            Some(b'/') => {
                let (p, q) = split_path_query(target, auth_end);
                (Some(p), q)
            }
            Some(_) => (None, Some(Span::new(auth_end + 1, target.len()))),
            None => (None, None),
        };
        return Ok(TargetParts {
            path,
            query,
            authority: Some(Span::new(scheme_len, auth_end)),
        });
    }
    if is_connect {
        // authority-form: host ":" port, nothing else.
        if !is_valid_host(target, true) {
            return Err(ParseError::InvalidTarget);
        }
        return Ok(TargetParts {
            path: Some(Span::new(0, 0)),
            query: None,
            authority: Some(Span::new(0, target.len())),
        });
    }
    Err(ParseError::InvalidTarget)
}

/// Length of a case-insensitive `http://` or `https://` prefix.
fn http_scheme_len(target: &[u8]) -> Option<usize> {
    [&b"http://"[..], b"https://"]
        .into_iter()
        .find_map(|scheme| {
            let prefix = target.get(..scheme.len())?;
            prefix.eq_ignore_ascii_case(scheme).then_some(scheme.len())
        })
}

/// Splits `target[start..]` (which begins with '/') at the first '?'.
fn split_path_query(target: &[u8], start: usize) -> (Span, Option<Span>) {
    let rest = target.get(start..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'?') {
        Some(q) => (
            Span::new(start, start + q),
            Some(Span::new(start + q + 1, target.len())),
        ),
        None => (Span::new(start, target.len()), None),
    }
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2). IPv6 literals are allowed,
/// IPvFuture and userinfo are not; a port, when present, must be 1-5 digits
/// no larger than 65535. An empty value is not valid here; callers that
/// accept an empty Host check that first.
pub fn is_valid_host(value: &[u8], port_required: bool) -> bool {
    let (host_ok, port) = if let Some(inner) = value.strip_prefix(b"[") {
        let Some(close) = inner.iter().position(|&b| b == b']') else {
            return false;
        };
        let (literal, rest) = inner.split_at(close);
        let ok = !literal.is_empty()
            && literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        let port = match rest.get(1..) {
            Some([]) | None => None,
            Some([b':', port @ ..]) => Some(port),
            Some(_) => return false,
        };
        (ok, port)
    } else {
        let (host, port) = match value.iter().position(|&b| b == b':') {
            Some(i) => (value.get(..i).unwrap_or_default(), value.get(i + 1..)),
            None => (value, None),
        };
        (!host.is_empty() && is_reg_name(host), port)
    };
    if !host_ok {
        return false;
    }
    match port {
        None => !port_required,
        Some(p) => is_port(p),
    }
}

/// The host of a Host value or authority (`host[:port]`), port dropped;
/// an IPv6 literal keeps its brackets.
pub fn host_without_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        let end = host
            .iter()
            .position(|&b| b == b']')
            .map_or(host.len(), |i| i + 1);
        return host.get(..end).unwrap_or(host);
    }
    match host.iter().rposition(|&b| b == b':') {
        Some(i) => host.get(..i).unwrap_or(host),
        None => host,
    }
}

fn is_port(p: &[u8]) -> bool {
    if p.is_empty() || p.len() > 5 || !p.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let n = p
        .iter()
        .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'));
    n <= 65535
}

/// A host name as DNS names (and IPv4 literals) are written: letters,
/// digits, `-`, `.` and `_`. RFC 3986's reg-name allows more (`~`,
/// `%`-escapes, the sub-delims `!$&'()*+,;=`), which no real host uses and
/// which downstream readers split on: `Host: a,b` would become a list in
/// `X-Forwarded-Host` (Rack reads its last element, Express its first) and
/// `a;for=x` would add a pair to `Forwarded`. Such a Host routes nowhere
/// a client means, so it is refused (400) for HTTP/1.1 and HTTP/2 alike.
fn is_reg_name(host: &[u8]) -> bool {
    host.iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parts(method: Method, target: &[u8]) -> Result<TargetParts, ParseError> {
        parse_target(&method, target)
    }

    #[test]
    fn ports_go_and_ipv6_literals_keep_their_brackets() {
        assert_eq!(host_without_port(b"a.test:8443"), b"a.test");
        assert_eq!(host_without_port(b"[::1]:8443"), b"[::1]");
        assert_eq!(host_without_port(b"[::1]"), b"[::1]");
        assert_eq!(host_without_port(b"a.test"), b"a.test");
    }

    #[test]
    fn origin_form() {
        let p = parts(Method::Get, b"/a/b?x=1").unwrap();
        assert_eq!(p.path, Some(Span::new(0, 4)));
        assert_eq!(p.query, Some(Span::new(5, 8)));
        assert_eq!(p.authority, None);
        let p = parts(Method::Get, b"/").unwrap();
        assert_eq!(p.query, None);
        assert_eq!(parts(Method::Connect, b"/"), Err(ParseError::InvalidTarget));
    }

    #[test]
    fn absolute_form() {
        let t = b"HTTPS://Example.com:8443/p?q";
        let p = parts(Method::Get, t).unwrap();
        assert_eq!(p.authority.unwrap().slice(t), b"Example.com:8443");
        assert_eq!(p.path.unwrap().slice(t), b"/p");
        assert_eq!(p.query.unwrap().slice(t), b"q");
        let p = parts(Method::Get, b"http://h").unwrap();
        assert_eq!(p.path, None);
        let t = b"http://h?x";
        let p = parts(Method::Get, t).unwrap();
        assert_eq!(p.path, None);
        assert_eq!(p.query.unwrap().slice(t), b"x");
        for bad in [
            &b"http://"[..],
            b"http:///p",
            b"http://user@h/",
            b"ftp://h/",
            b"http:/h",
            b"http://h:99999/",
        ] {
            assert_eq!(
                parts(Method::Get, bad),
                Err(ParseError::InvalidTarget),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn asterisk_form_only_with_options() {
        assert!(parts(Method::Options, b"*").is_ok());
        assert_eq!(parts(Method::Get, b"*"), Err(ParseError::InvalidTarget));
        assert_eq!(
            parts(Method::Options, b"*x"),
            Err(ParseError::InvalidTarget)
        );
    }

    #[test]
    fn authority_form_only_with_connect() {
        let p = parts(Method::Connect, b"example.com:443").unwrap();
        assert_eq!(p.authority, Some(Span::new(0, 15)));
        assert!(parts(Method::Connect, b"[::1]:443").is_ok());
        assert_eq!(
            parts(Method::Connect, b"example.com"),
            Err(ParseError::InvalidTarget)
        );
        assert_eq!(
            parts(Method::Get, b"example.com:443"),
            Err(ParseError::InvalidTarget)
        );
        assert_eq!(
            parts(Method::Connect, b"http://h/"),
            Err(ParseError::InvalidTarget)
        );
    }

    #[test]
    fn host_syntax() {
        for ok in [
            &b"example.com"[..],
            b"example.com:8080",
            b"127.0.0.1",
            b"[::1]",
            b"[2001:db8::1]:443",
            b"xn--bcher-kva.example",
            b"_srv.example",
        ] {
            assert!(is_valid_host(ok, false), "{ok:?}");
        }
        for bad in [
            &b""[..],
            b"a b",
            b"a/b",
            b"user@host",
            b"host:",
            b"host:x",
            b"host:65536",
            b"a:1:2",
            b":80",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"[zz]",
            b"a%2",
            b"a%zz",
            b"h\xc3\xa9",
            // What reg-name allows and no host name holds: list and
            // parameter separators, quotes, escapes.
            b"localhost,evil.example",
            b"a;for=6.6.6.6",
            b"a=b",
            b"a!b",
            b"a$b",
            b"a&b",
            b"a'b",
            b"a(b)",
            b"a*b",
            b"a+b",
            b"a~b",
            b"a%20b",
            b"a%2Cb:443",
            b"a\"b",
        ] {
            assert!(!is_valid_host(bad, false), "{bad:?}");
        }
        assert!(!is_valid_host(b"example.com", true));
        assert!(is_valid_host(b"example.com:1", true));
    }
}
