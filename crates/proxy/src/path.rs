//! Request paths as routes and upstreams see them. A path such as
//! `/api/../admin`, `/api/%2e%2e/admin` or `/api/..;/admin` would match the
//! `/api` route while its upstream, resolving it, serves `/admin`: a way
//! around routing. So there are two views of a path, agreeing on every
//! route decision:
//!
//! - [`normalize`], what a proxied request carries upstream: escapes of
//!   unreserved characters decoded (`%61` is `a`, `%2e` is `.`; RFC 3986
//!   §6.2.2.2), dot-segments resolved (§5.2.4; a segment's `;params`, as
//!   Tomcat reads `..;`, do not hide a dot-segment), repeated slashes
//!   merged. Other escapes (`%2F`) and `;params` stay as sent.
//! - [`route_view`], what routes match: the same, and also `%2F`, `%5C`
//!   and `\` read as `/` (the file lookup, and servers that decode them,
//!   take them for separators) and every segment's `;params` dropped.
//!   A request is routed by what any of its readers could take it for.
//!
//! A `..` that climbs above `/` in either view is refused.

use std::borrow::Cow;

/// A `..` segment that would climb above `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AboveRoot;

/// `target` (an origin-form path, maybe followed by `?query`) as it goes
/// upstream; borrowed when already normal. A target that does not start
/// with `/` (`*`) is returned as it is.
pub fn normalize(target: &[u8]) -> Result<Cow<'_, [u8]>, AboveRoot> {
    // Refused when either view climbs: an upstream that decodes `%2F`
    // would climb with `/a%2f..%2f..%2fb`.
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    resolve(path, View::Routed)?;
    resolve(target, View::Forwarded)
}

/// `path` (no query) as routes match it.
pub fn route_view(path: &[u8]) -> Result<Cow<'_, [u8]>, AboveRoot> {
    resolve(path, View::Routed)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Forwarded,
    Routed,
}

fn resolve(target: &[u8], view: View) -> Result<Cow<'_, [u8]>, AboveRoot> {
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => target.split_at(i),
        None => (target, &[][..]),
    };
    let Some(rest) = path.strip_prefix(b"/") else {
        return Ok(Cow::Borrowed(target));
    };
    if is_plain(rest) {
        return Ok(Cow::Borrowed(target));
    }
    let decoded = decode(rest, view);
    let mut kept: Vec<&[u8]> = Vec::new();
    // Whether the output ends with a slash: after an empty, `.` or `..`
    // last segment, as RFC 3986 resolves `/a/b/..` to `/a/`.
    let mut trailing = false;
    for seg in decoded.split(|&b| b == b'/') {
        trailing = true;
        let name = seg.split(|&b| b == b';').next().unwrap_or_default();
        match dots(name) {
            _ if seg.is_empty() => {}
            1 => {}
            2 => {
                if kept.pop().is_none() {
                    return Err(AboveRoot);
                }
            }
            _ => {
                kept.push(if view == View::Routed { name } else { seg });
                trailing = false;
            }
        }
    }
    let mut out = Vec::with_capacity(target.len());
    for seg in &kept {
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if trailing || kept.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(query);
    Ok(Cow::Owned(out))
}

/// No escape, backslash or `;`, no empty segment but the last, no
/// dot-segment: both views leave it as it is.
fn is_plain(rest: &[u8]) -> bool {
    if rest.iter().any(|&b| matches!(b, b'%' | b'\\' | b';')) {
        return false;
    }
    let mut segs = rest.split(|&b| b == b'/').peekable();
    while let Some(seg) = segs.next() {
        let last = segs.peek().is_none();
        if (seg.is_empty() && !last) || matches!(dots(seg), 1 | 2) {
            return false;
        }
    }
    true
}

/// Escapes of unreserved characters decoded; in the routed view `%2F`,
/// `%5C` and `\` become `/`. Other escapes, and malformed ones, stay.
fn decode(rest: &[u8], view: View) -> Vec<u8> {
    let mut out = Vec::with_capacity(rest.len());
    let mut at = 0;
    while let Some(&b) = rest.get(at) {
        let escaped = (b == b'%')
            .then(|| Some((hex(*rest.get(at + 1)?)? << 4) | hex(*rest.get(at + 2)?)?))
            .flatten();
        match escaped {
            Some(c) if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') => {
                out.push(c);
                at += 3;
            }
            Some(b'/' | b'\\') if view == View::Routed => {
                out.push(b'/');
                at += 3;
            }
            _ => {
                out.push(if b == b'\\' && view == View::Routed {
                    b'/'
                } else {
                    b
                });
                at += 1;
            }
        }
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// 1 for `.`, 2 for `..`, 0 for anything else.
fn dots(name: &[u8]) -> u8 {
    match name {
        b"." => 1,
        b".." => 2,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(t: &str) -> Result<String, AboveRoot> {
        normalize(t.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned())
    }

    fn routed(t: &str) -> Result<String, AboveRoot> {
        route_view(t.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned())
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for t in [
            "/",
            "/a",
            "/a/",
            "/a/b.html?x=/../y",
            "/...",
            "/.well-known/x",
            "*",
        ] {
            assert!(
                matches!(normalize(t.as_bytes()), Ok(Cow::Borrowed(_))),
                "{t}"
            );
            assert!(
                matches!(route_view(t.as_bytes()), Ok(Cow::Borrowed(_))),
                "{t}"
            );
        }
    }

    #[test]
    fn dot_segments_resolve_and_slashes_merge() {
        let cases = [
            ("/api/../admin", "/admin"),
            ("/api/%2e%2e/admin", "/admin"),
            ("/api/%2E./admin?q=1", "/admin?q=1"),
            ("/api/..;/admin", "/admin"),
            ("/api/.;x/admin", "/api/admin"),
            ("/a/./b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/..", "/"),
            ("//api", "/api"),
            ("/a//b//", "/a/b/"),
            ("/a/b/../../c/", "/c/"),
        ];
        for (t, want) in cases {
            assert_eq!(norm(t).as_deref(), Ok(want), "{t}");
            assert_eq!(routed(t).as_deref(), Ok(want), "{t}");
        }
    }

    #[test]
    fn unreserved_escapes_are_decoded_others_kept_upstream() {
        assert_eq!(norm("/%61dmin").as_deref(), Ok("/admin"));
        assert_eq!(
            norm("/%7Euser/%41%2f%zz%").as_deref(),
            Ok("/~user/A%2f%zz%")
        );
        assert_eq!(norm("/a%2F..%2Fb").as_deref(), Ok("/a%2F..%2Fb"));
        assert_eq!(
            norm("/app;jsessionid=1/x").as_deref(),
            Ok("/app;jsessionid=1/x")
        );
        assert_eq!(norm("/a\\..\\b").as_deref(), Ok("/a\\..\\b"));
    }

    #[test]
    fn routes_see_what_any_reader_could() {
        assert_eq!(routed("/%61dmin").as_deref(), Ok("/admin"));
        assert_eq!(routed("/x%2f..%2fadmin").as_deref(), Ok("/admin"));
        assert_eq!(routed("/x%5C..%5cadmin").as_deref(), Ok("/admin"));
        assert_eq!(routed("/public\\..\\admin").as_deref(), Ok("/admin"));
        assert_eq!(routed("/admin;jsessionid=1/x").as_deref(), Ok("/admin/x"));
        assert_eq!(routed("/admin;x").as_deref(), Ok("/admin"));
    }

    #[test]
    fn climbing_above_the_root_is_refused() {
        for t in ["/..", "/a/../../b", "/%2e%2e/etc/passwd", "/..;/x"] {
            assert_eq!(norm(t), Err(AboveRoot), "{t}");
            assert_eq!(routed(t), Err(AboveRoot), "{t}");
        }
        assert_eq!(routed("/a%2f..%2f..%2fb"), Err(AboveRoot));
        assert_eq!(norm("/a%2f..%2f..%2fb"), Err(AboveRoot));
    }
}
