//! Evaluation of conditional requests and `Range` (pure functions).
//!
//! [`select`] follows RFC 9110 §13.2.2:
//!
//! 1. `If-Match` (strong comparison, `*` matches) — no match → 412;
//! 2. otherwise `If-Unmodified-Since` — modified after the date → 412
//!    (an invalid date is ignored);
//! 3. `If-None-Match` (weak comparison, `*`, lists, `W/`) — match → 304 for
//!    GET/HEAD, 412 for other methods;
//! 4. otherwise, for GET/HEAD only, `If-Modified-Since` — not modified since
//!    the date (second resolution) → 304 (an invalid date is ignored);
//! 5. `Range`, for GET and HEAD alike (a caller wanting RFC-strict HEAD
//!    behaviour passes `range: None`), gated by `If-Range`: an entity tag
//!    must match strongly, an HTTP-date must equal `Last-Modified` exactly
//!    (second resolution) and `Last-Modified` must be a strong validator:
//!    the file's mtime at least one second before now, the response's
//!    `Date` (RFC 9110 §8.8.2.2; within that second the file may have been
//!    written again with the same `Last-Modified`); any mismatch, weak date
//!    or malformed `If-Range` → full body.
//!
//! Range decisions:
//!
//! * only the `bytes` unit (case-insensitive) and a single range are honoured;
//!   multiple ranges, other units and syntactically invalid values are
//!   ignored (→ [`Selection::Full`]), as RFC 9110 §14.2 permits;
//! * whitespace is tolerated around the unit, `=`, `-` and the range, and
//!   empty list elements (`bytes=0-1,`) are skipped;
//! * `a-b` with `a > b` is invalid → Full;
//! * numbers too large for `u64` are still syntactically valid: they are
//!   compared exactly as decimal strings (for `a > b`) and otherwise
//!   saturate, so a huge first position is [`Selection::Unsatisfiable`], a huge
//!   last position is clipped and a huge suffix selects the whole file;
//! * `start >= len` → Unsatisfiable; the end is clipped to `len - 1`;
//!   `-0` → Unsatisfiable; a suffix longer than the file → the whole file as
//!   Partial; an empty file with any valid range → Unsatisfiable.

use std::cmp::Ordering;
use std::time::{Duration, SystemTime};

use crate::meta::{parse_http_date, FileMeta};

/// Raw values of the request headers relevant to selection (`None` = absent).
///
/// Repeated header lines should be joined with `", "` by the caller.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Preconditions<'a> {
    /// `If-Match`.
    pub if_match: Option<&'a [u8]>,
    /// `If-None-Match`.
    pub if_none_match: Option<&'a [u8]>,
    /// `If-Modified-Since`.
    pub if_modified_since: Option<&'a [u8]>,
    /// `If-Unmodified-Since`.
    pub if_unmodified_since: Option<&'a [u8]>,
    /// `If-Range`.
    pub if_range: Option<&'a [u8]>,
    /// `Range`.
    pub range: Option<&'a [u8]>,
}

/// What response to send for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// 200 with the whole file.
    Full,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    PreconditionFailed,
    /// 206 Partial Content with bytes `start..=end_inclusive`
    /// (always `start <= end_inclusive < len`).
    Partial {
        /// First byte offset.
        start: u64,
        /// Last byte offset, inclusive.
        end_inclusive: u64,
    },
    /// 416 Range Not Satisfiable; the caller sends `Content-Range: bytes */len`.
    Unsatisfiable,
}

/// Decides the response for a file given the request's conditional and
/// range headers. `is_get_or_head` is whether the method is GET or HEAD.
pub fn select(pre: &Preconditions, meta: &FileMeta, is_get_or_head: bool) -> Selection {
    select_at(pre, meta, is_get_or_head, SystemTime::now())
}

/// [`select`] with `now` (the response's `Date`) given.
pub fn select_at(
    pre: &Preconditions,
    meta: &FileMeta,
    is_get_or_head: bool,
    now: SystemTime,
) -> Selection {
    let last_modified = meta.last_modified();

    if let Some(v) = pre.if_match {
        if !etag_list_matches(v, &meta.etag, Compare::Strong) {
            return Selection::PreconditionFailed;
        }
    } else if let Some(date) = pre.if_unmodified_since.and_then(parse_http_date) {
        if last_modified > date {
            return Selection::PreconditionFailed;
        }
    }

    if let Some(v) = pre.if_none_match {
        if etag_list_matches(v, &meta.etag, Compare::Weak) {
            return if is_get_or_head {
                Selection::NotModified
            } else {
                Selection::PreconditionFailed
            };
        }
    } else if is_get_or_head {
        if let Some(date) = pre.if_modified_since.and_then(parse_http_date) {
            if last_modified <= date {
                return Selection::NotModified;
            }
        }
    }

    if !is_get_or_head {
        return Selection::Full;
    }
    let Some(range) = pre.range else {
        return Selection::Full;
    };
    if let Some(v) = pre.if_range {
        if !if_range_matches(v, meta, now) {
            return Selection::Full;
        }
    }
    parse_range(range, meta.len)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    Strong,
    Weak,
}

/// Trims optional whitespace (SP / HTAB).
fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = s.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(a), Some(b)) => s.get(a..=b).unwrap_or(&[]),
        _ => &[],
    }
}

/// Parses one entity-tag at the start of `s`: returns `(weak, opaque, rest)`.
fn parse_entity_tag(s: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let (weak, s) = match s.strip_prefix(b"W/") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let s = s.strip_prefix(b"\"")?;
    let end = s.iter().position(|&b| b == b'"')?;
    Some((weak, s.get(..end)?, s.get(end + 1..)?))
}

/// Parses a value consisting of exactly one entity-tag.
fn parse_whole_tag(s: &[u8]) -> Option<(bool, &[u8])> {
    match parse_entity_tag(s)? {
        (weak, opaque, []) => Some((weak, opaque)),
        _ => None,
    }
}

fn tags_match(a: (bool, &[u8]), b: (bool, &[u8]), cmp: Compare) -> bool {
    let weak_ok = cmp == Compare::Weak || (!a.0 && !b.0);
    weak_ok && a.1 == b.1
}

/// Does the `If-Match`/`If-None-Match` value match our `etag`?
///
/// `*` (alone or as a list member) always matches. Parsing stops at the first
/// malformed member; members before it still count.
fn etag_list_matches(value: &[u8], etag: &str, cmp: Compare) -> bool {
    let ours = parse_whole_tag(etag.as_bytes());
    let mut s = value;
    loop {
        s = trim_ows(s);
        while let Some(rest) = s.strip_prefix(b",") {
            s = trim_ows(rest);
        }
        if s.is_empty() {
            return false;
        }
        let rest = if let Some(rest) = s.strip_prefix(b"*") {
            return next_member(rest).is_some();
        } else {
            let Some((weak, opaque, rest)) = parse_entity_tag(s) else {
                return false;
            };
            if ours.is_some_and(|o| tags_match(o, (weak, opaque), cmp)) {
                return true;
            }
            rest
        };
        match next_member(rest) {
            Some(r) => s = r,
            None => return false,
        }
    }
}

/// After a list member: allows OWS then `,` or the end.
fn next_member(rest: &[u8]) -> Option<&[u8]> {
    let t = trim_ows(rest);
    if t.is_empty() || t.first() == Some(&b',') {
        Some(t)
    } else {
        None
    }
}

/// Evaluates `If-Range` (RFC 9110 §13.1.5) at `now`.
fn if_range_matches(value: &[u8], meta: &FileMeta, now: SystemTime) -> bool {
    let v = trim_ows(value);
    if v.starts_with(b"\"") || v.starts_with(b"W/") {
        match (parse_whole_tag(meta.etag.as_bytes()), parse_whole_tag(v)) {
            (Some(ours), Some(theirs)) => tags_match(ours, theirs, Compare::Strong),
            _ => false,
        }
    } else {
        // A date is a strong validator only once a second has passed
        // since the mtime (RFC 9110 §8.8.2.2); a clock behind the mtime
        // makes it weak too.
        let strong = meta
            .modified
            .checked_add(Duration::from_secs(1))
            .is_some_and(|t| t <= now);
        strong && parse_http_date(v).is_some_and(|d| d == meta.last_modified())
    }
}

/// Parses ASCII digits, saturating at `u64::MAX`.
fn parse_saturating(digits: &[u8]) -> u64 {
    digits.iter().fold(0u64, |acc, &d| {
        acc.saturating_mul(10)
            .saturating_add(u64::from(d.wrapping_sub(b'0')))
    })
}

/// Compares two non-empty digit strings numerically, at any length.
fn cmp_decimal(a: &[u8], b: &[u8]) -> Ordering {
    let strip = |s: &[u8]| -> usize { s.iter().take_while(|&&d| d == b'0').count() };
    let a = a.get(strip(a)..).unwrap_or(&[]);
    let b = b.get(strip(b)..).unwrap_or(&[]);
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Parses a `Range` value against a file of `len` bytes.
fn parse_range(value: &[u8], len: u64) -> Selection {
    let v = trim_ows(value);
    let Some(eq) = v.iter().position(|&b| b == b'=') else {
        return Selection::Full;
    };
    let (unit, set) = (v.get(..eq).unwrap_or(&[]), v.get(eq + 1..).unwrap_or(&[]));
    if !trim_ows(unit).eq_ignore_ascii_case(b"bytes") {
        return Selection::Full;
    }
    let mut specs = set
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        return Selection::Full;
    };
    let Some(dash) = spec.iter().position(|&b| b == b'-') else {
        return Selection::Full;
    };
    let first = trim_ows(spec.get(..dash).unwrap_or(&[]));
    let last = trim_ows(spec.get(dash + 1..).unwrap_or(&[]));
    if !first.iter().all(u8::is_ascii_digit) || !last.iter().all(u8::is_ascii_digit) {
        return Selection::Full;
    }
    match (first.is_empty(), last.is_empty()) {
        (true, true) => Selection::Full,
        (true, false) => {
            let suffix = parse_saturating(last);
            if suffix == 0 || len == 0 {
                return Selection::Unsatisfiable;
            }
            Selection::Partial {
                start: len.saturating_sub(suffix),
                end_inclusive: len - 1,
            }
        }
        (false, open_ended) => {
            if !open_ended && cmp_decimal(first, last) == Ordering::Greater {
                return Selection::Full;
            }
            let start = parse_saturating(first);
            if start >= len {
                return Selection::Unsatisfiable;
            }
            let end = if open_ended {
                len - 1
            } else {
                parse_saturating(last).min(len - 1)
            };
            Selection::Partial {
                start,
                end_inclusive: end,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::meta::http_date;
    use std::time::UNIX_EPOCH;

    const ETAG: &str = "\"abc-3e8-1\"";
    /// Last-Modified second: Sun, 06 Nov 1994 08:49:37 GMT.
    const LM_SECS: u64 = 784_111_777;
    const LM: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";
    const BEFORE: &[u8] = b"Sun, 06 Nov 1994 08:49:36 GMT";
    const AFTER: &[u8] = b"Sun, 06 Nov 1994 08:49:38 GMT";

    fn meta_len(len: u64) -> FileMeta {
        FileMeta {
            len,
            // Sub-second part must be ignored in comparisons.
            modified: UNIX_EPOCH + Duration::from_millis(LM_SECS * 1000 + 700),
            etag: ETAG.to_owned(),
            content_type: "text/plain",
        }
    }

    fn meta() -> FileMeta {
        meta_len(1000)
    }

    fn range(r: &str) -> Selection {
        range_len(r, 1000)
    }

    fn range_len(r: &str, len: u64) -> Selection {
        let pre = Preconditions {
            range: Some(r.as_bytes()),
            ..Default::default()
        };
        select(&pre, &meta_len(len), true)
    }

    fn partial(start: u64, end_inclusive: u64) -> Selection {
        Selection::Partial {
            start,
            end_inclusive,
        }
    }

    fn im(v: &str) -> Selection {
        let pre = Preconditions {
            if_match: Some(v.as_bytes()),
            ..Default::default()
        };
        select(&pre, &meta(), true)
    }

    fn inm(v: &str, get: bool) -> Selection {
        let pre = Preconditions {
            if_none_match: Some(v.as_bytes()),
            ..Default::default()
        };
        select(&pre, &meta(), get)
    }

    #[test]
    fn no_headers_full() {
        assert_eq!(
            select(&Preconditions::default(), &meta(), true),
            Selection::Full
        );
        assert_eq!(
            select(&Preconditions::default(), &meta(), false),
            Selection::Full
        );
    }

    #[test]
    fn if_match_strong() {
        assert_eq!(im(ETAG), Selection::Full);
        assert_eq!(im("*"), Selection::Full);
        assert_eq!(im(" \"x\" , \"abc-3e8-1\""), Selection::Full);
        assert_eq!(im("\"x\", *"), Selection::Full);
        assert_eq!(im("\"other\""), Selection::PreconditionFailed);
        // Weak tags never match strongly.
        assert_eq!(im("W/\"abc-3e8-1\""), Selection::PreconditionFailed);
        assert_eq!(im(""), Selection::PreconditionFailed);
        assert_eq!(im("abc-3e8-1"), Selection::PreconditionFailed);
        assert_eq!(im("\"unterminated"), Selection::PreconditionFailed);
        // Malformed member stops parsing.
        assert_eq!(im("junk, \"abc-3e8-1\""), Selection::PreconditionFailed);
        assert_eq!(im("\"abc-3e8-1\"junk"), Selection::Full);
    }

    #[test]
    fn if_match_failure_beats_everything() {
        let pre = Preconditions {
            if_match: Some(b"\"nope\""),
            if_none_match: Some(b"*"),
            range: Some(b"bytes=0-1"),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::PreconditionFailed);
    }

    #[test]
    fn if_match_on_non_get() {
        let pre = Preconditions {
            if_match: Some(b"\"nope\""),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), false), Selection::PreconditionFailed);
    }

    #[test]
    fn if_unmodified_since() {
        let ius = |d: &'static [u8]| Preconditions {
            if_unmodified_since: Some(d),
            ..Default::default()
        };
        assert_eq!(select(&ius(LM), &meta(), true), Selection::Full);
        assert_eq!(select(&ius(AFTER), &meta(), true), Selection::Full);
        assert_eq!(
            select(&ius(BEFORE), &meta(), true),
            Selection::PreconditionFailed
        );
        assert_eq!(
            select(&ius(BEFORE), &meta(), false),
            Selection::PreconditionFailed
        );
        // Invalid date is ignored.
        assert_eq!(select(&ius(b"yesterday"), &meta(), true), Selection::Full);
    }

    #[test]
    fn if_match_overrides_if_unmodified_since() {
        let pre = Preconditions {
            if_match: Some(ETAG.as_bytes()),
            if_unmodified_since: Some(BEFORE),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::Full);
    }

    #[test]
    fn if_none_match_weak() {
        assert_eq!(inm(ETAG, true), Selection::NotModified);
        assert_eq!(inm("W/\"abc-3e8-1\"", true), Selection::NotModified);
        assert_eq!(inm("\"a\", W/\"abc-3e8-1\"", true), Selection::NotModified);
        assert_eq!(inm("\"a\",,\t\"abc-3e8-1\" ", true), Selection::NotModified);
        assert_eq!(inm("*", true), Selection::NotModified);
        assert_eq!(inm("\"a\", \"b\"", true), Selection::Full);
        assert_eq!(inm("w/\"abc-3e8-1\"", true), Selection::Full);
        assert_eq!(inm("", true), Selection::Full);
        assert_eq!(inm("\"abc-3e8-1", true), Selection::Full);
        assert_eq!(inm("\"abc\"", true), Selection::Full);
    }

    #[test]
    fn if_none_match_comma_inside_tag() {
        // etagc includes ',' so this is one tag, not two.
        assert_eq!(inm("\"x,abc-3e8-1\"", true), Selection::Full);
    }

    #[test]
    fn if_none_match_non_get_is_412() {
        assert_eq!(inm(ETAG, false), Selection::PreconditionFailed);
        assert_eq!(inm("*", false), Selection::PreconditionFailed);
        assert_eq!(inm("\"other\"", false), Selection::Full);
    }

    #[test]
    fn if_modified_since() {
        let ims = |d: &'static [u8]| Preconditions {
            if_modified_since: Some(d),
            ..Default::default()
        };
        // Equal at second resolution although mtime has 700 ms.
        assert_eq!(select(&ims(LM), &meta(), true), Selection::NotModified);
        assert_eq!(select(&ims(AFTER), &meta(), true), Selection::NotModified);
        assert_eq!(select(&ims(BEFORE), &meta(), true), Selection::Full);
        assert_eq!(select(&ims(b"not a date"), &meta(), true), Selection::Full);
        // Only for GET/HEAD.
        assert_eq!(select(&ims(LM), &meta(), false), Selection::Full);
        // Obsolete formats accepted.
        assert_eq!(
            select(&ims(b"Sunday, 06-Nov-94 08:49:37 GMT"), &meta(), true),
            Selection::NotModified
        );
    }

    #[test]
    fn if_none_match_overrides_if_modified_since() {
        let pre = Preconditions {
            if_none_match: Some(b"\"other\""),
            if_modified_since: Some(AFTER),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::Full);
    }

    #[test]
    fn not_modified_beats_range() {
        let pre = Preconditions {
            if_none_match: Some(ETAG.as_bytes()),
            range: Some(b"bytes=0-1"),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::NotModified);
    }

    #[test]
    fn range_basic_forms() {
        assert_eq!(range("bytes=0-499"), partial(0, 499));
        assert_eq!(range("bytes=500-999"), partial(500, 999));
        assert_eq!(range("bytes=500-"), partial(500, 999));
        assert_eq!(range("bytes=-500"), partial(500, 999));
        assert_eq!(range("bytes=0-0"), partial(0, 0));
        assert_eq!(range("bytes=999-999"), partial(999, 999));
        assert_eq!(range("bytes=-1"), partial(999, 999));
        assert_eq!(range("bytes=0-"), partial(0, 999));
    }

    #[test]
    fn range_unit_case_and_whitespace() {
        assert_eq!(range("BYTES=1-2"), partial(1, 2));
        assert_eq!(range("Bytes=1-2"), partial(1, 2));
        assert_eq!(range("  bytes=1-2\t"), partial(1, 2));
        assert_eq!(range("bytes = 1 - 2"), partial(1, 2));
        assert_eq!(range("bytes= -5"), partial(995, 999));
        assert_eq!(range("bytes=1-2,"), partial(1, 2));
        assert_eq!(range("bytes=, 1-2"), partial(1, 2));
    }

    #[test]
    fn range_end_clipped() {
        assert_eq!(range("bytes=0-1000"), partial(0, 999));
        assert_eq!(range("bytes=10-99999"), partial(10, 999));
    }

    #[test]
    fn range_suffix_longer_than_file() {
        assert_eq!(range("bytes=-1000"), partial(0, 999));
        assert_eq!(range("bytes=-5000"), partial(0, 999));
    }

    #[test]
    fn range_unsatisfiable() {
        assert_eq!(range("bytes=1000-"), Selection::Unsatisfiable);
        assert_eq!(range("bytes=1000-2000"), Selection::Unsatisfiable);
        assert_eq!(range("bytes=-0"), Selection::Unsatisfiable);
        assert_eq!(range("bytes=-000"), Selection::Unsatisfiable);
    }

    #[test]
    fn range_empty_file_unsatisfiable() {
        assert_eq!(range_len("bytes=0-", 0), Selection::Unsatisfiable);
        assert_eq!(range_len("bytes=0-0", 0), Selection::Unsatisfiable);
        assert_eq!(range_len("bytes=-5", 0), Selection::Unsatisfiable);
        assert_eq!(range_len("bytes=abc", 0), Selection::Full);
    }

    #[test]
    fn range_invalid_ignored() {
        for r in [
            "bytes=500-100",
            "bytes=",
            "bytes",
            "bytes=-",
            "bytes=a-b",
            "bytes=1-2-3",
            "bytes=--5",
            "bytes=+1-2",
            "bytes=0x10-",
            "bytes=1 2-3",
            "items=0-1",
            "=0-1",
            "bytes=\u{661}-2",
            "",
        ] {
            assert_eq!(range(r), Selection::Full, "{r:?}");
        }
        assert_eq!(
            select(
                &Preconditions {
                    range: Some(b"bytes=\xff-\xfe"),
                    ..Default::default()
                },
                &meta(),
                true
            ),
            Selection::Full
        );
    }

    #[test]
    fn range_multiple_ignored() {
        assert_eq!(range("bytes=0-1,5-6"), Selection::Full);
        assert_eq!(range("bytes=0-1, -5"), Selection::Full);
        assert_eq!(range("bytes=2000-3000,4000-"), Selection::Full);
    }

    #[test]
    fn range_huge_numbers() {
        assert_eq!(
            range("bytes=99999999999999999999-"),
            Selection::Unsatisfiable
        );
        assert_eq!(
            range("bytes=99999999999999999999-99999999999999999999"),
            Selection::Unsatisfiable
        );
        // Exact comparison beyond u64: a > b is invalid even though both saturate.
        assert_eq!(
            range("bytes=99999999999999999999-99999999999999999998"),
            Selection::Full
        );
        assert_eq!(range("bytes=0-99999999999999999999"), partial(0, 999));
        assert_eq!(range("bytes=-99999999999999999999"), partial(0, 999));
        assert_eq!(range("bytes=0010-0020"), partial(10, 20));
        assert_eq!(
            range("bytes=20-0000000000000000000000100"),
            partial(20, 100)
        );
        assert_eq!(range_len("bytes=0-", u64::MAX), partial(0, u64::MAX - 1));
    }

    #[test]
    fn range_not_applied_for_other_methods() {
        let pre = Preconditions {
            range: Some(b"bytes=0-1"),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), false), Selection::Full);
    }

    #[test]
    fn if_range_etag() {
        let ir = |v: &'static [u8]| Preconditions {
            if_range: Some(v),
            range: Some(b"bytes=0-9"),
            ..Default::default()
        };
        assert_eq!(select(&ir(ETAG.as_bytes()), &meta(), true), partial(0, 9));
        assert_eq!(
            select(&ir(b" \"abc-3e8-1\" "), &meta(), true),
            partial(0, 9)
        );
        assert_eq!(select(&ir(b"\"stale\""), &meta(), true), Selection::Full);
        // Strong comparison: a weak tag never matches.
        assert_eq!(
            select(&ir(b"W/\"abc-3e8-1\""), &meta(), true),
            Selection::Full
        );
        assert_eq!(
            select(&ir(b"\"abc-3e8-1\", \"x\""), &meta(), true),
            Selection::Full
        );
        assert_eq!(select(&ir(b"*"), &meta(), true), Selection::Full);
    }

    #[test]
    fn if_range_date() {
        let ir = |v: &'static [u8]| Preconditions {
            if_range: Some(v),
            range: Some(b"bytes=-10"),
            ..Default::default()
        };
        assert_eq!(select(&ir(LM), &meta(), true), partial(990, 999));
        // Weak until a second has passed since the mtime (08:49:37.7).
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        let ms = LM_SECS * 1000 + 700;
        for now in [ms - 1000, ms, ms + 300, ms + 999] {
            assert_eq!(
                select_at(&ir(LM), &meta(), true, at(now)),
                Selection::Full,
                "{now}"
            );
        }
        assert_eq!(
            select_at(&ir(LM), &meta(), true, at(ms + 1000)),
            partial(990, 999)
        );
        // Must be exactly equal, not merely later.
        assert_eq!(select(&ir(AFTER), &meta(), true), Selection::Full);
        assert_eq!(select(&ir(BEFORE), &meta(), true), Selection::Full);
        assert_eq!(select(&ir(b"garbage"), &meta(), true), Selection::Full);
        assert_eq!(select(&ir(b""), &meta(), true), Selection::Full);
    }

    #[test]
    fn if_range_mismatch_with_unsatisfiable_range_gives_full() {
        let pre = Preconditions {
            if_range: Some(b"\"stale\""),
            range: Some(b"bytes=5000-"),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::Full);
    }

    #[test]
    fn if_range_without_range_ignored() {
        let pre = Preconditions {
            if_range: Some(b"\"stale\""),
            ..Default::default()
        };
        assert_eq!(select(&pre, &meta(), true), Selection::Full);
    }

    #[test]
    fn full_chain_passes_to_range() {
        let pre = Preconditions {
            if_match: Some(ETAG.as_bytes()),
            if_unmodified_since: Some(BEFORE), // ignored: If-Match present
            if_none_match: Some(b"\"other\""),
            if_modified_since: Some(AFTER), // ignored: If-None-Match present
            if_range: Some(ETAG.as_bytes()),
            range: Some(b"bytes=100-199"),
        };
        assert_eq!(select(&pre, &meta(), true), partial(100, 199));
    }

    #[test]
    fn weak_own_etag_never_matches_strongly() {
        let mut m = meta();
        m.etag = "W/\"abc\"".to_owned();
        let pre = Preconditions {
            if_match: Some(b"W/\"abc\""),
            ..Default::default()
        };
        assert_eq!(select(&pre, &m, true), Selection::PreconditionFailed);
        let pre = Preconditions {
            if_none_match: Some(b"\"abc\""),
            ..Default::default()
        };
        assert_eq!(select(&pre, &m, true), Selection::NotModified);
    }

    #[test]
    fn dates_round_trip_with_meta() {
        let m = meta();
        let lm = http_date(m.modified);
        assert_eq!(lm.as_bytes(), LM);
        let pre = Preconditions {
            if_modified_since: Some(lm.as_bytes()),
            ..Default::default()
        };
        assert_eq!(select(&pre, &m, true), Selection::NotModified);
    }

    #[test]
    fn pre_epoch_mtime_does_not_panic() {
        let mut m = meta();
        m.modified = UNIX_EPOCH - Duration::from_millis(1500);
        let pre = Preconditions {
            if_modified_since: Some(b"Thu, 01 Jan 1970 00:00:00 GMT"),
            if_range: Some(b"Thu, 01 Jan 1970 00:00:00 GMT"),
            range: Some(b"bytes=0-1"),
            ..Default::default()
        };
        assert_eq!(select(&pre, &m, true), Selection::NotModified);
        let _ = SystemTime::now();
    }

    #[test]
    fn helpers() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        assert_eq!(trim_ows(b""), b"");
        assert_eq!(cmp_decimal(b"007", b"7"), Ordering::Equal);
        assert_eq!(cmp_decimal(b"10", b"9"), Ordering::Greater);
        assert_eq!(cmp_decimal(b"0", b"000"), Ordering::Equal);
        assert_eq!(parse_saturating(b"18446744073709551615"), u64::MAX);
        assert_eq!(parse_saturating(b"18446744073709551616"), u64::MAX);
    }

    #[test]
    fn fuzzish_never_panics() {
        let inputs: &[&[u8]] = &[
            b"",
            b" ",
            b",",
            b"*",
            b"W/",
            b"W/\"",
            b"\"",
            b"\"\"",
            b"bytes=",
            b"=",
            b"bytes=-",
            b"bytes=--",
            b"bytes=0-",
            b"\xff",
            b"W/\"\xff\"",
            b",,,,",
        ];
        for &a in inputs {
            for &b in inputs {
                let pre = Preconditions {
                    if_match: Some(a),
                    if_none_match: Some(b),
                    if_modified_since: Some(a),
                    if_unmodified_since: Some(b),
                    if_range: Some(a),
                    range: Some(b),
                };
                for len in [0, 1, 1000] {
                    let _ = select(&pre, &meta_len(len), true);
                    let _ = select(
                        &Preconditions {
                            if_match: None,
                            ..pre
                        },
                        &meta_len(len),
                        true,
                    );
                    let _ = range_len(std::str::from_utf8(b).unwrap_or(""), len);
                }
            }
        }
    }
}
