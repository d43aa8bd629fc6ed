//! What the HTTP/1.1 targets share: reading a head the way the project's
//! parsers present it, to compare with httparse's reading of it.

/// `v` without leading and trailing spaces and tabs (OWS).
pub fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// Whether every element of a Content-Length value is `n` in decimal
/// (leading zeros allowed, as the parsers take them).
pub fn says_length(value: &[u8], n: u64) -> bool {
    value.split(|&b| b == b',').all(|element| {
        let digits = trim_ows(element);
        let significant = match digits.iter().position(|&d| d != b'0') {
            Some(i) => &digits[i..],
            None => &b"0"[..],
        };
        !digits.is_empty()
            && digits.iter().all(u8::is_ascii_digit)
            && significant == n.to_string().as_bytes()
    })
}

/// Asserts that httparse found the same fields, in the same order, with
/// the same values once trimmed.
pub fn assert_same_fields(ours: &[(&str, &[u8])], theirs: &[httparse::Header<'_>]) {
    assert_eq!(ours.len(), theirs.len(), "field count");
    for ((name, value), theirs) in ours.iter().zip(theirs) {
        assert_eq!(*name, theirs.name);
        assert_eq!(*value, trim_ows(theirs.value), "value of {name}");
    }
}

/// What a head's fields say about its body's framing.
pub struct FramingFields {
    /// Every Content-Length value, as sent.
    pub lengths: Vec<Vec<u8>>,
    /// Whether a Transfer-Encoding field is there.
    pub transfer_encoding: bool,
}

impl FramingFields {
    /// Reads the fields of an accepted head, asserting on the way that no
    /// value holds what a field value must not (CR, LF, NUL, other CTLs).
    pub fn of<'a>(fields: impl Iterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut seen = Self {
            lengths: Vec::new(),
            transfer_encoding: false,
        };
        for (name, value) in fields {
            assert!(
                tlsgate_http1::is_field_value(value),
                "accepted value {value:?}"
            );
            if name.eq_ignore_ascii_case("content-length") {
                seen.lengths.push(value.to_vec());
            }
            seen.transfer_encoding |= name.eq_ignore_ascii_case("transfer-encoding");
        }
        seen
    }

    /// Whether every Content-Length says `n`.
    pub fn all_say(&self, n: u64) -> bool {
        self.lengths.iter().all(|l| says_length(l, n))
    }
}

/// httparse's minor version number for `v`.
pub fn minor(v: tlsgate_http1::Version) -> u8 {
    match v {
        tlsgate_http1::Version::Http10 => 0,
        tlsgate_http1::Version::Http11 => 1,
    }
}

/// The limits the request targets parse clients' heads under (small, so
/// that the fuzzer reaches them).
pub const CLIENT_LIMITS: tlsgate_http1::Limits = tlsgate_http1::Limits {
    max_head_bytes: 4096,
    max_target_bytes: 512,
    max_headers: 32,
};

/// How many fields of `head` a CGI-style gateway would take for `name`
/// (lower case): any case, `_` for `-` (`X_Forwarded_For` counts as
/// `x-forwarded-for`).
pub fn count_as(head: &tlsgate_http1::RequestHead, name: &str) -> usize {
    head.headers()
        .filter(|(n, _)| {
            n.len() == name.len()
                && n.bytes().zip(name.bytes()).all(|(a, b)| {
                    let a = if a == b'_' {
                        b'-'
                    } else {
                        a.to_ascii_lowercase()
                    };
                    a == b
                })
        })
        .count()
}

/// `head`, as the proxy sent it upstream, read back by the project's
/// parser under limits no proxied head comes near; panics, showing the
/// head, when it does not parse.
pub fn read_back(head: &[u8]) -> tlsgate_http1::RequestHead {
    let wide = tlsgate_http1::Limits {
        max_head_bytes: 1 << 20,
        max_target_bytes: 1 << 20,
        max_headers: 256,
    };
    match tlsgate_http1::parse_request(head, &wide) {
        Ok(Some(h)) => h,
        other => panic!(
            "the project's parser refuses the upstream head ({other:?}): {:?}",
            String::from_utf8_lossy(head)
        ),
    }
}

/// A directory of this process's own under the system's temporary one,
/// `tlsgate-fuzz-<what>-<pid>`, made empty. Those that processes gone
/// left behind are removed first, so runs do not pile them up.
pub fn scratch_dir(what: &str) -> std::path::PathBuf {
    let prefix = format!("tlsgate-fuzz-{what}-");
    let tmp = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix(&prefix));
            if pid.is_some_and(|p| !std::path::Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tmp.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}
