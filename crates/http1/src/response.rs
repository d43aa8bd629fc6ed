//! Response-head serialisation: status line, header lines and the blank
//! line that ends the head, appended to a caller-owned buffer.
//!
//! Inputs here come from the server itself, not the peer, so they are
//! trusted; debug builds still assert that nothing could split the head.

/// The standard reason phrase for `status` (RFC 9110 §15), or "" if unknown
/// (the reason phrase is optional on the wire).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        511 => "Network Authentication Required",
        _ => "",
    }
}

/// Appends `"HTTP/1.1 {status} {reason}\r\n"` to `buf`.
pub fn write_status_line(buf: &mut Vec<u8>, status: u16) {
    debug_assert!(
        (100..=999).contains(&status),
        "status code must be 3 digits"
    );
    buf.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(buf, u64::from(status));
    buf.push(b' ');
    buf.extend_from_slice(reason_phrase(status).as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// Appends `"name: value\r\n"`. Names and values come from the server, so
/// they are trusted; debug builds assert they cannot break the framing.
pub fn write_header(buf: &mut Vec<u8>, name: &str, value: &[u8]) {
    debug_assert!(
        !name.is_empty() && name.bytes().all(crate::syntax::is_tchar),
        "header name must be a token"
    );
    debug_assert!(
        !value.iter().any(|&b| b == b'\r' || b == b'\n'),
        "header value must not contain CR or LF"
    );
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n");
}

/// Appends `"name: {value}\r\n"` with `value` in decimal, without allocating.
pub fn write_header_u64(buf: &mut Vec<u8>, name: &str, value: u64) {
    debug_assert!(
        !name.is_empty() && name.bytes().all(crate::syntax::is_tchar),
        "header name must be a token"
    );
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b": ");
    push_decimal(buf, value);
    buf.extend_from_slice(b"\r\n");
}

/// Appends the final `"\r\n"` that ends the head.
pub fn end_head(buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal using a stack buffer (u64::MAX has 20 digits).
fn push_decimal(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut used = 0;
    for slot in digits.iter_mut().rev() {
        // `n % 10` is below 10, so the cast cannot truncate.
        *slot = b'0' + (n % 10) as u8;
        used += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = digits.len() - used;
    buf.extend_from_slice(digits.get(start..).unwrap_or_default());
}

thread_local! {
    /// The `Date` value, formatted at most once a second per thread.
    static DATE: std::cell::RefCell<(u64, String)> =
        const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

/// Calls `f` with the current date as a `Date` field value (IMF-fixdate,
/// RFC 9110 §5.6.7), formatted once a second per thread: a server's
/// responses carry one, and a proxy adds one to a response that has none
/// (§6.6.1).
pub fn with_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            *d = (secs, httpdate::fmt_http_date(now));
        }
        f(d.1.as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        let text = with_date(|d| String::from_utf8(d.to_vec()).unwrap());
        assert_eq!(text.len(), 29, "{text}");
        assert!(text.ends_with(" GMT"), "{text}");
        let when = httpdate::parse_http_date(&text).unwrap();
        let age = std::time::SystemTime::now().duration_since(when).unwrap();
        assert!(age < std::time::Duration::from_secs(2), "{text}");
    }

    #[test]
    fn status_line() {
        let mut buf = Vec::new();
        write_status_line(&mut buf, 200);
        write_status_line(&mut buf, 404);
        write_status_line(&mut buf, 599);
        assert_eq!(
            buf,
            b"HTTP/1.1 200 OK\r\nHTTP/1.1 404 Not Found\r\nHTTP/1.1 599 \r\n"
        );
    }

    #[test]
    fn reason_phrases_cover_our_error_statuses() {
        for status in [
            400, 405, 408, 413, 414, 416, 421, 431, 500, 501, 502, 503, 505,
        ] {
            assert!(!reason_phrase(status).is_empty(), "{status}");
        }
        assert_eq!(reason_phrase(304), "Not Modified");
        assert_eq!(reason_phrase(0), "");
    }

    #[test]
    fn full_head() {
        let mut buf = Vec::new();
        write_status_line(&mut buf, 206);
        write_header(&mut buf, "Content-Type", b"text/plain; charset=utf-8");
        write_header_u64(&mut buf, "Content-Length", 1234);
        end_head(&mut buf);
        assert_eq!(
            buf,
            b"HTTP/1.1 206 Partial Content\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 1234\r\n\r\n"
        );
    }

    #[test]
    fn decimal_values() {
        for (n, s) in [
            (0u64, "0"),
            (7, "7"),
            (10, "10"),
            (u64::MAX, "18446744073709551615"),
        ] {
            let mut buf = b"x".to_vec();
            write_header_u64(&mut buf, "N", n);
            assert_eq!(buf, format!("xN: {s}\r\n").as_bytes());
        }
    }
}
