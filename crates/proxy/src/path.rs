//! Request paths as routes and upstreams see them. A path such as
//! `/api/../admin` or `/api/%2e%2e/admin` would match the `/api` route
//! while its upstream, resolving the dot-segments, serves `/admin`: a way
//! around routing. So routes match the normalised path (RFC 3986 §5.2.4
//! dot-segments resolved, `%2e` read as `.`, repeated slashes merged) and
//! a proxied request carries that same path upstream. `%2F` is not
//! decoded: it stays part of its segment, as most servers treat it.

use std::borrow::Cow;

/// A `..` segment that would climb above `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AboveRoot;

/// `target` (an origin-form path, maybe followed by `?query`) normalised;
/// borrowed when it already is. A target that does not start with `/`
/// (`*`) is returned as it is.
pub fn normalize(target: &[u8]) -> Result<Cow<'_, [u8]>, AboveRoot> {
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => target.split_at(i),
        None => (target, &[][..]),
    };
    let Some(rest) = path.strip_prefix(b"/") else {
        return Ok(Cow::Borrowed(target));
    };
    if is_normal(rest) {
        return Ok(Cow::Borrowed(target));
    }
    let mut kept: Vec<&[u8]> = Vec::new();
    // Whether the output ends with a slash: after an empty, `.` or `..`
    // last segment, as RFC 3986 resolves `/a/b/..` to `/a/`.
    let mut trailing = false;
    for seg in rest.split(|&b| b == b'/') {
        trailing = true;
        match dot_segment(seg) {
            _ if seg.is_empty() => {}
            Some(Dots::One) => {}
            Some(Dots::Two) => {
                if kept.pop().is_none() {
                    return Err(AboveRoot);
                }
            }
            None => {
                kept.push(seg);
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

/// No empty segment but the last, no dot-segment.
fn is_normal(rest: &[u8]) -> bool {
    let mut segs = rest.split(|&b| b == b'/').peekable();
    while let Some(seg) = segs.next() {
        let last = segs.peek().is_none();
        if (seg.is_empty() && !last) || dot_segment(seg).is_some() {
            return false;
        }
    }
    true
}

enum Dots {
    One,
    Two,
}

/// `.` or `..`, each dot possibly written `%2e` or `%2E`.
fn dot_segment(seg: &[u8]) -> Option<Dots> {
    let mut dots = 0;
    let mut at = seg;
    while !at.is_empty() {
        at = at
            .strip_prefix(b".")
            .or_else(|| at.strip_prefix(b"%2e"))
            .or_else(|| at.strip_prefix(b"%2E"))?;
        dots += 1;
    }
    match dots {
        1 => Some(Dots::One),
        2 => Some(Dots::Two),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(t: &str) -> Result<String, AboveRoot> {
        normalize(t.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned())
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
            "/a%2F..%2Fb",
            "*",
        ] {
            assert!(
                matches!(normalize(t.as_bytes()), Ok(Cow::Borrowed(_))),
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
        }
    }

    #[test]
    fn climbing_above_the_root_is_refused() {
        assert_eq!(norm("/.."), Err(AboveRoot));
        assert_eq!(norm("/a/../../b"), Err(AboveRoot));
        assert_eq!(norm("/%2e%2e/etc/passwd"), Err(AboveRoot));
    }
}
