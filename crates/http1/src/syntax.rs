//! Shared RFC 9110 character classes and small lexical helpers (tokens,
//! field values, OWS trimming, comma lists) used by the request parser and
//! the chunked decoder.

/// A byte range inside a buffer that is owned elsewhere; used instead of
/// per-field allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl Span {
    pub(crate) fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    /// Moves the span right by `base` bytes (sub-slice offsets to buffer offsets).
    pub(crate) fn shift(self, base: usize) -> Self {
        Self::new(
            self.start.saturating_add(base),
            self.end.saturating_add(base),
        )
    }

    /// The bytes covered by this span; empty if it does not fit `buf`
    /// (never happens for spans we built, but must not panic).
    pub(crate) fn slice(self, buf: &[u8]) -> &[u8] {
        buf.get(self.start..self.end).unwrap_or_default()
    }
}

/// `tchar` from RFC 9110 §5.6.2.
pub(crate) fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9'
        | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+'
        | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// A non-empty run of `tchar`.
pub(crate) fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// A byte allowed inside a field value: VCHAR, SP, HTAB or obs-text.
/// Everything else is a CTL (including NUL and DEL).
pub(crate) fn is_field_value_byte(b: u8) -> bool {
    matches!(b, b'\t' | b' '..=0x7e | 0x80..=0xff)
}

/// Optional whitespace (SP / HTAB).
pub(crate) fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Strips leading and trailing OWS.
pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_ows(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_ows(*last) {
            break;
        }
        s = rest;
    }
    s
}

/// Strips leading OWS only.
pub(crate) fn trim_ows_start(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_ows(*first) {
            break;
        }
        s = rest;
    }
    s
}

/// Elements of a comma-separated list, OWS-trimmed. Empty elements are
/// yielded too; callers decide whether they are acceptable.
pub(crate) fn list_elements(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    s.split(|&b| b == b',').map(trim_ows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(is_token(b"GET"));
        assert!(is_token(b"x-Custom_1.~!"));
        assert!(!is_token(b""));
        assert!(!is_token(b"a b"));
        assert!(!is_token(b"a:b"));
        assert!(!is_token(b"caf\xc3\xa9"));
    }

    #[test]
    fn field_value_bytes() {
        assert!(is_field_value_byte(b'\t'));
        assert!(is_field_value_byte(b' '));
        assert!(is_field_value_byte(0x80));
        assert!(!is_field_value_byte(0));
        assert!(!is_field_value_byte(b'\r'));
        assert!(!is_field_value_byte(0x7f));
    }

    #[test]
    fn trimming_and_lists() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        let v: Vec<&[u8]> = list_elements(b" a ,b,, c").collect();
        assert_eq!(v, vec![&b"a"[..], b"b", b"", b"c"]);
    }
}
