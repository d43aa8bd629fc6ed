//! File validators (`ETag`, `Last-Modified`), `Content-Type` detection and
//! HTTP-date formatting/parsing.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Content type used when the extension is unknown.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Latest instant `httpdate` can format: 9999-12-31T23:59:59Z.
const MAX_HTTP_DATE_SECS: u64 = 253_402_300_799;

/// Metadata of an opened regular file, as needed to build response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// File size in bytes.
    pub len: u64,
    /// Modification time (full precision; compare via
    /// [`FileMeta::last_modified`] for HTTP purposes).
    pub modified: SystemTime,
    /// Strong entity tag, including the double quotes, e.g. `"1a2b-5f3-17f0…"`.
    pub etag: String,
    /// `Content-Type` value, with `; charset=utf-8` for textual types.
    pub content_type: &'static str,
}

impl FileMeta {
    /// Builds the metadata from an `fstat` result of the opened file.
    ///
    /// The ETag is `"<inode>-<size>-<mtime in ns>"`, all lowercase hex.
    pub fn from_metadata(md: &std::fs::Metadata, content_type: &'static str) -> FileMeta {
        let len = md.len();
        let modified = md.modified().unwrap_or(UNIX_EPOCH);
        let mtime_ns = i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec());
        FileMeta {
            len,
            modified,
            etag: make_etag(md.ino(), len, mtime_ns),
            content_type,
        }
    }

    /// The modification time truncated to whole seconds (HTTP-date resolution).
    pub fn last_modified(&self) -> SystemTime {
        truncate_to_secs(self.modified)
    }

    /// The `Last-Modified` header value.
    pub fn last_modified_header(&self) -> String {
        http_date(self.modified)
    }
}

/// Builds a strong, quoted ETag from inode, size and mtime in nanoseconds.
pub fn make_etag(ino: u64, len: u64, mtime_ns: i128) -> String {
    // Pre-epoch mtimes are rendered as their two's-complement bit pattern;
    // the tag only needs to be stable and distinct, not meaningful.
    format!("\"{ino:x}-{len:x}-{:x}\"", mtime_ns as u128)
}

/// Truncates a time to whole seconds since the epoch (times before the epoch
/// are returned unchanged).
pub(crate) fn truncate_to_secs(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(_) => t,
    }
}

/// Formats a time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
///
/// Times before 1970 are clamped to the epoch and times after the year 9999
/// to its last second, so this never panics.
pub fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .min(MAX_HTTP_DATE_SECS);
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Parses an HTTP-date in any of the three RFC 9110 formats (surrounding
/// whitespace tolerated). Returns `None` when invalid.
pub fn parse_http_date(value: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(value).ok()?;
    httpdate::parse_http_date(s.trim_matches([' ', '\t'])).ok()
}

/// Common types with a charset appended, served without touching the cache.
static TEXT_TYPES: &[(&str, &str)] = &[
    ("text/html", "text/html; charset=utf-8"),
    ("text/plain", "text/plain; charset=utf-8"),
    ("text/css", "text/css; charset=utf-8"),
    ("text/javascript", "text/javascript; charset=utf-8"),
    ("text/xml", "text/xml; charset=utf-8"),
    ("text/csv", "text/csv; charset=utf-8"),
    ("text/markdown", "text/markdown; charset=utf-8"),
    (
        "application/javascript",
        "application/javascript; charset=utf-8",
    ),
    ("application/json", "application/json; charset=utf-8"),
];

fn wants_charset(mime: &str) -> bool {
    mime.starts_with("text/") || mime == "application/javascript" || mime == "application/json"
}

/// Returns `mime` with `; charset=utf-8` appended as a `&'static str`.
///
/// Uncommon types are leaked once into a process-wide cache; the set of
/// possible inputs is mime_guess's finite static table, so this is bounded.
fn with_charset(mime: &'static str) -> &'static str {
    if let Some((_, v)) = TEXT_TYPES.iter().find(|(k, _)| *k == mime) {
        return v;
    }
    static CACHE: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = match cache.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    map.entry(mime)
        .or_insert_with(|| Box::leak(format!("{mime}; charset=utf-8").into_boxed_str()))
}

/// The `Content-Type` for a file, guessed from its extension.
///
/// `text/*`, `application/javascript` and `application/json` get
/// `; charset=utf-8`; unknown extensions give `application/octet-stream`.
pub fn content_type_for(path: &Path) -> &'static str {
    match mime_guess::from_path(path).first_raw() {
        Some(m) if wants_charset(m) => with_charset(m),
        Some(m) => m,
        None => DEFAULT_CONTENT_TYPE,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert_eq!(
            content_type_for(Path::new("a/index.html")),
            "text/html; charset=utf-8"
        );
        assert_eq!(
            content_type_for(Path::new("x.JS")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type_for(Path::new("x.mjs")),
            "application/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type_for(Path::new("x.json")),
            "application/json; charset=utf-8"
        );
        assert_eq!(content_type_for(Path::new("x.png")), "image/png");
        assert_eq!(content_type_for(Path::new("x.svg")), "image/svg+xml");
        assert_eq!(
            content_type_for(Path::new("noext")),
            "application/octet-stream"
        );
        assert_eq!(
            content_type_for(Path::new("x.unknownext")),
            "application/octet-stream"
        );
        assert_eq!(
            content_type_for(Path::new(".hidden")),
            "application/octet-stream"
        );
    }

    #[test]
    fn uncommon_text_type_cached() {
        // text/x-c (from .c) is not in the static table.
        let a = content_type_for(Path::new("main.c"));
        let b = content_type_for(Path::new("other.c"));
        assert!(a.starts_with("text/"), "{a}");
        assert!(a.ends_with("; charset=utf-8"));
        assert!(std::ptr::eq(a, b));
    }

    #[test]
    fn http_date_roundtrip() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(t));
        assert_eq!(
            parse_http_date(b"  Sun, 06 Nov 1994 08:49:37 GMT "),
            Some(t)
        );
        assert_eq!(parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(parse_http_date(b"garbage"), None);
        assert_eq!(parse_http_date(b"\xff\xfe"), None);
        assert_eq!(parse_http_date(b""), None);
    }

    #[test]
    fn http_date_subsecond_truncated() {
        let t = UNIX_EPOCH + Duration::from_millis(784_111_777_900);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn http_date_never_panics() {
        assert_eq!(
            http_date(UNIX_EPOCH - Duration::from_secs(10)),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(http_date(far), "Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn etag_format() {
        assert_eq!(make_etag(0x5f3a, 0x1a2b, 0xff), "\"5f3a-1a2b-ff\"");
    }

    #[test]
    fn meta_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.txt");
        std::fs::write(&p, b"hello").unwrap();
        let md = std::fs::metadata(&p).unwrap();
        let m = FileMeta::from_metadata(&md, content_type_for(&p));
        assert_eq!(m.len, 5);
        assert!(m.etag.starts_with(&format!("\"{:x}-5-", md.ino())));
        assert!(m.etag.ends_with('"'));
        assert_eq!(m.content_type, "text/plain; charset=utf-8");
        assert_eq!(m.last_modified(), truncate_to_secs(md.modified().unwrap()));
    }
}
