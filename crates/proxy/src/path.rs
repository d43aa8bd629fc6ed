//! Request paths as routes and upstreams see them. A path such as
//! `/api/../admin`, `/api/%2e%2e/admin` or `/api/..;/admin` would match the
//! `/api` route while its upstream, resolving it, serves `/admin`: a way
//! around routing. So there are two views of a path, and every reader of
//! a path that gets past [`BadPath`] reads it as they do:
//!
//! - [`normalize`], what a proxied request carries upstream: escapes of
//!   unreserved characters decoded (`%61` is `a`, `%2e` is `.`; RFC 3986
//!   §6.2.2.2), dot-segments resolved (§5.2.4), repeated slashes merged.
//!   Other escapes (`%2F`) and `;params` stay as sent.
//! - [`route_view`], what routes match: the same, with `%2F`, `%5C` and
//!   `\` read as `/` (the file lookup, and servers that decode them, take
//!   them for separators) and every segment's `;params` dropped (as
//!   Tomcat does), so a route owns whatever a server could read.
//!
//! Where readers would disagree on which dot-segments there are, the path
//! is refused rather than guessed at: a dot-segment in a path that also
//! has a separator in disguise (`%2F`, `%5C`, `\`), a dot-segment with
//! `;params` (`..;`, a `..` to Tomcat and a name to others), a `..` after
//! a segment that is only `;params` (an empty segment to Tomcat, which
//! the `..` skips, and a name to others, which the `..` removes), a malformed
//! escape (`%2%65` must not become `%2e` on its way), and a `..` that
//! climbs above `/`.

use std::borrow::Cow;

/// A path refused: its readers could disagree on it, or it climbs above `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadPath;

/// `target` (an origin-form path, maybe followed by `?query`) as it goes
/// upstream; borrowed when already normal. A target that does not start
/// with `/` (`*`) is returned as it is.
pub fn normalize(target: &[u8]) -> Result<Cow<'_, [u8]>, BadPath> {
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    // Refused for routes, refused upstream.
    resolve(path, View::Routed)?;
    resolve(target, View::Forwarded)
}

/// `path` (no query) as routes match it.
pub fn route_view(path: &[u8]) -> Result<Cow<'_, [u8]>, BadPath> {
    resolve(path, View::Routed)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Forwarded,
    Routed,
}

fn resolve(target: &[u8], view: View) -> Result<Cow<'_, [u8]>, BadPath> {
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
    let decoded = decode(rest)?;
    let disguised = has_disguised_separator(&decoded);
    let source = if view == View::Routed && disguised {
        reveal_separators(&decoded)
    } else {
        decoded
    };
    let mut kept: Vec<&[u8]> = Vec::new();
    // Whether the output ends with a slash: after an empty, `.` or `..`
    // last segment, as RFC 3986 resolves `/a/b/..` to `/a/`.
    let mut trailing = false;
    // A segment that is nothing but `;params` came before.
    let mut params_alone = false;
    for seg in source.split(|&b| b == b'/') {
        trailing = true;
        let (name, params) = match seg.iter().position(|&b| b == b';') {
            Some(i) => (seg.get(..i).unwrap_or_default(), true),
            None => (seg, false),
        };
        match dots(name) {
            0 => {
                let shown = if view == View::Routed { name } else { seg };
                // Empty segments merge (and, for routes, `;params` alone).
                if !shown.is_empty() {
                    kept.push(shown);
                    trailing = false;
                }
                params_alone |= name.is_empty() && params;
            }
            n => {
                if disguised || params || (n == 2 && (params_alone || kept.pop().is_none())) {
                    return Err(BadPath);
                }
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
        if (seg.is_empty() && !last) || dots(seg) != 0 {
            return false;
        }
    }
    true
}

/// Escapes of unreserved characters decoded, others kept as sent (in
/// upper case); a `%` without two hex digits is refused.
fn decode(rest: &[u8]) -> Result<Vec<u8>, BadPath> {
    let mut out = Vec::with_capacity(rest.len());
    let mut at = rest;
    while let Some((&b, tail)) = at.split_first() {
        if b != b'%' {
            out.push(b);
            at = tail;
            continue;
        }
        let (hi, lo) = match tail {
            [hi, lo, ..] => (hex(*hi).ok_or(BadPath)?, hex(*lo).ok_or(BadPath)?),
            _ => return Err(BadPath),
        };
        let c = (hi << 4) | lo;
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(hi)], HEX[usize::from(lo)]]);
        }
        at = tail.get(2..).unwrap_or_default();
    }
    Ok(out)
}

const HEX: [u8; 16] = *b"0123456789ABCDEF";

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// `%2F`, `%5C` (escapes are upper case after [`decode`]) or `\`.
fn has_disguised_separator(decoded: &[u8]) -> bool {
    decoded.contains(&b'\\') || decoded.windows(3).any(|w| w == b"%2F" || w == b"%5C")
}

/// `%2F`, `%5C` and `\` as `/`.
fn reveal_separators(decoded: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(decoded.len());
    let mut at = decoded;
    while let Some((&b, tail)) = at.split_first() {
        if at.starts_with(b"%2F") || at.starts_with(b"%5C") {
            out.push(b'/');
            at = at.get(3..).unwrap_or_default();
        } else {
            out.push(if b == b'\\' { b'/' } else { b });
            at = tail;
        }
    }
    out
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

    fn norm(t: &str) -> Result<String, BadPath> {
        normalize(t.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned())
    }

    fn routed(t: &str) -> Result<String, BadPath> {
        route_view(t.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned())
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for t in [
            "/",
            "/a",
            "/a/",
            "/a/b.html?x=/../y%zz;",
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
        assert_eq!(norm("/%7euser/%41%2f").as_deref(), Ok("/~user/A%2F"));
        assert_eq!(norm("/a%2Fb").as_deref(), Ok("/a%2Fb"));
        assert_eq!(
            norm("/app;jsessionid=1/x").as_deref(),
            Ok("/app;jsessionid=1/x")
        );
        assert_eq!(norm("/a\\b").as_deref(), Ok("/a\\b"));
        assert_eq!(norm("/;x/admin").as_deref(), Ok("/;x/admin"));
    }

    #[test]
    fn routes_see_what_any_reader_could() {
        assert_eq!(routed("/%61dmin").as_deref(), Ok("/admin"));
        assert_eq!(routed("/x%2fadmin").as_deref(), Ok("/x/admin"));
        assert_eq!(routed("/public\\admin").as_deref(), Ok("/public/admin"));
        assert_eq!(routed("/admin;jsessionid=1/x").as_deref(), Ok("/admin/x"));
        assert_eq!(routed("/admin;x").as_deref(), Ok("/admin"));
        assert_eq!(routed("/;x/admin/secret").as_deref(), Ok("/admin/secret"));
    }

    #[test]
    fn paths_readers_could_disagree_on_are_refused() {
        for t in [
            // Above the root.
            "/..",
            "/a/../../b",
            "/%2e%2e/etc/passwd",
            // A dot-segment and a separator in disguise.
            "/x%2f..%2fadmin",
            "/x%5C..%5cadmin",
            "/public\\..\\admin",
            "/api/x%2fy/../../internal/admin",
            "/api/x\\y/../../internal",
            // A dot-segment with params: `..` to Tomcat, a name to others.
            "/api/..;/admin",
            "/api/.;x/admin",
            "/a\\b/../private/..;/../secret",
            // A `..` after a segment of params alone: Tomcat's `..`
            // removes `admin`, others' removes `;`.
            "/admin/;/../api",
            "/a/;x/b/../../c",
            // Malformed escapes, which must not make new ones.
            "/public/%2%65%2%65/admin",
            "/a/%2%46../b",
            "/a%",
            "/a%4",
            "/a%zz",
        ] {
            assert_eq!(norm(t), Err(BadPath), "{t}");
            assert_eq!(routed(t), Err(BadPath), "{t}");
        }
    }

    #[test]
    fn what_goes_upstream_is_routed_as_what_came_in() {
        for t in [
            "/api/../admin",
            "/%61pi/x",
            "/api;v=1/x/../y",
            "/a%2Fb/c",
            "/x/./y//z/",
            "/;p/a",
            "/a\\b/c",
            "/a/../;/b",
            "/;/a/./b",
        ] {
            let sent = norm(t).unwrap();
            assert_eq!(routed(&sent), routed(t), "{t} went upstream as {sent}");
        }
    }
}
