//! Fuzzes the access log's two line formats
//! (`tlsgate_server::access_log::format`) on records of hostile bytes:
//! method, target, referer and user agent as a client sends them, the SNI,
//! a client certificate's subject, common name and subject alternative
//! names, and (though the server fills them from the config and from a
//! fixed list of reasons) the upstream and its error.
//!
//! Combined format: exactly one line, of printable ASCII, ending in `\n`;
//! it splits by the format's grammar (`remote - user [date] "request"
//! status bytes "referer" "user-agent"`, then `upstream=`/`upstream_error=`)
//! into the record's own fields: the address, the date (as a civil
//! calendar computed here reads the time), the status and the byte count
//! read back, and undoing the `\xHH` escapes gives back the exact bytes of
//! method, target and version, referer and user agent (`-` when absent),
//! the certificate's short name (`-` when empty or absent), upstream and
//! error; except that method, target, referer and user agent longer than
//! `access_log::FIELD_MAX` bytes give back exactly their first
//! `FIELD_MAX` bytes followed by the mark `\...` (which only a cut field
//! has: no other `\` is followed by anything but `xHH`). No field can end a quoted one: the line holds six `"`, the
//! delimiters, whatever the record holds.
//!
//! JSON format: exactly one line ending in `\n`, with no DEL, C1 control,
//! U+2028 or U+2029 written raw (readers that split lines there would see
//! two records), that serde_json reads as one object with the documented keys; every string decodes to the
//! record's: exactly for text fields (SNI, TLS version, upstream,
//! error, the certificate's subject and names), and for the byte fields
//! (target, referer, user agent) exactly when they are UTF-8, else by the
//! rule `access_log::json` states: lossily, each invalid sequence as U+FFFD
//! (`String::from_utf8_lossy`). Method, target, referer and user agent
//! longer than `FIELD_MAX` bytes: their first `FIELD_MAX` bytes read so,
//! then `...`, and the key `truncated` (present only then) lists exactly
//! the cut ones, in the order method, target, referer, user agent.
//!
//! Input: a fixed head, missing bytes read as zeros: a flag byte (IPv6,
//! referer, user agent, SNI, client certificate, upstream, error, kTLS),
//! a choice byte (HTTP version, TLS version, common name, number of
//! SANs), 16 address bytes, the time (u64 seconds before year 10000, u32
//! nanoseconds), status (u16), body bytes (u64), duration (u64 seconds,
//! u32 nanoseconds), all little-endian. Then fields, each a length byte
//! and that many bytes: method, target, referer, user agent, SNI,
//! upstream, error, subject, common name, then the SANs; then the
//! certificate's SHA-256 (32 bytes), then a byte `grow`: method, target,
//! referer and user agent are each their bytes repeated `1 + grow` times
//! (up to 65 280 bytes, past `FIELD_MAX`).

#![no_main]

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tlsgate_config::LogFormat;
use tlsgate_server::access_log::{format, Record, FIELD_MAX};
use tlsgate_tls::ClientIdentity;

/// The input, read front to back; past its end every byte is zero and
/// every field empty.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let head = self.take(N);
        a[..head.len()].copy_from_slice(head);
        a
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn field(&mut self) -> &'a [u8] {
        let n = self.u8();
        self.take(usize::from(n))
    }
}

const VERSIONS: [&str; 4] = ["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "-"];
const TLS_VERSIONS: [Option<&str>; 3] = [None, Some("TLSv1.2"), Some("TLSv1.3")];
/// The first second of year 10000.
const YEAR_10000: u64 = 253_402_300_800;
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Year, month, day, hour, minute, second of `secs` after the epoch, UTC
/// (Howard Hinnant's `civil_from_days`).
fn civil(secs: u64) -> (u64, u64, u64, u64, u64, u64) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A byte of a field, or the mark of a cut one.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Tok {
    Byte(u8),
    Cut,
}

/// What a client-supplied field must read back as: its first `FIELD_MAX`
/// bytes, then the mark if it had more.
fn logged(bytes: &[u8]) -> Vec<Tok> {
    let mut t: Vec<Tok> = bytes
        .iter()
        .take(FIELD_MAX)
        .map(|&b| Tok::Byte(b))
        .collect();
    if bytes.len() > FIELD_MAX {
        t.push(Tok::Cut);
    }
    t
}

/// Plain bytes as tokens (a field that is never cut).
fn whole(bytes: &[u8]) -> Vec<Tok> {
    bytes.iter().map(|&b| Tok::Byte(b)).collect()
}

/// The bytes a quoted (or user) field of the combined format stands for:
/// `\xHH` (upper-case hex) is the byte HH, `\...` the mark of a cut
/// field, any other character itself. Panics on a `\` that starts neither.
fn unescape(field: &str) -> Vec<Tok> {
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.as_bytes().iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(Tok::Byte(b));
            continue;
        }
        if bytes.as_slice().starts_with(b"...") {
            bytes.by_ref().take(3).for_each(drop);
            out.push(Tok::Cut);
            continue;
        }
        let x = bytes.next().copied();
        let hex: Vec<u8> = bytes.by_ref().take(2).copied().collect();
        let upper_hex = |&h: &u8| h.is_ascii_digit() || (b'A'..=b'F').contains(&h);
        assert!(
            x == Some(b'x') && hex.len() == 2 && hex.iter().all(upper_hex),
            "a \\ that is not \\xHH in {field:?}"
        );
        let hex = std::str::from_utf8(&hex).expect("hex digits");
        out.push(Tok::Byte(u8::from_str_radix(hex, 16).expect("hex digits")));
    }
    out
}

/// `s` cut at the first `sep`, or a panic naming the line.
fn cut<'l>(s: &'l str, sep: &str, line: &str) -> (&'l str, &'l str) {
    s.split_once(sep)
        .unwrap_or_else(|| panic!("no {sep:?} where expected in {line:?}"))
}

fn rest_after<'l>(s: &'l str, prefix: &str, line: &str) -> &'l str {
    s.strip_prefix(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} where expected in {line:?}"))
}

fn check_combined(r: &Record<'_>, secs: u64, line: &str) {
    let body = line.strip_suffix('\n').expect("the line ends in \\n");
    assert!(
        body.bytes().all(|b| (0x20..0x7f).contains(&b)),
        "not one line of printable ASCII: {line:?}"
    );
    assert_eq!(body.matches('"').count(), 6, "quotes: {line:?}");

    let (remote, rest) = cut(body, " ", line);
    assert_eq!(remote.parse::<IpAddr>(), Ok(r.remote), "{line:?}");
    let rest = rest_after(rest, "- ", line);
    let (user, rest) = cut(rest, " ", line);
    let name = match r.client {
        Some(c) if !c.short_name().is_empty() => c.short_name(),
        _ => "-",
    };
    assert_eq!(
        unescape(user),
        whole(name.as_bytes()),
        "user field: {line:?}"
    );

    let rest = rest_after(rest, "[", line);
    let (date, rest) = cut(rest, "] \"", line);
    let (y, mo, d, h, mi, s) = civil(secs);
    let month = MONTHS[usize::try_from(mo - 1).expect("a month")];
    assert_eq!(
        date,
        format!("{d:02}/{month}/{y}:{h:02}:{mi:02}:{s:02} +0000"),
        "{line:?}"
    );

    let (request, rest) = cut(rest, "\" ", line);
    let mut want = logged(r.method.as_bytes());
    want.push(Tok::Byte(b' '));
    want.extend(logged(r.target));
    want.push(Tok::Byte(b' '));
    want.extend(whole(r.version.as_bytes()));
    assert_eq!(unescape(request), want, "request: {line:?}");

    let (status, rest) = cut(rest, " ", line);
    assert_eq!(status.parse::<u16>(), Ok(r.status), "{line:?}");
    let (bytes, rest) = cut(rest, " \"", line);
    assert_eq!(bytes.parse::<u64>(), Ok(r.body_bytes), "{line:?}");
    let (referer, rest) = cut(rest, "\" \"", line);
    assert_eq!(
        unescape(referer),
        logged(r.referer.unwrap_or(b"-")),
        "{line:?}"
    );
    let (user_agent, trailer) = cut(rest, "\"", line);
    assert_eq!(
        unescape(user_agent),
        logged(r.user_agent.unwrap_or(b"-")),
        "{line:?}"
    );

    // The proxy's notes: unquoted, one field each whatever they hold
    // (spaces escaped as in the user field, `-` when empty).
    let notes: Vec<(&str, &str)> = [
        ("upstream", r.upstream),
        ("upstream_error", r.upstream_error),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v?)))
    .map(|(k, v)| (k, if v.is_empty() { "-" } else { v }))
    .collect();
    let raw: String = notes.iter().map(|(k, v)| format!(" {k}={v}")).collect();
    assert_eq!(unescape(trailer), whole(raw.as_bytes()), "notes: {line:?}");
    let tokens: Vec<&str> = trailer.split(' ').skip(1).collect();
    assert_eq!(tokens.len(), notes.len(), "notes: {line:?}");
    for (token, (k, v)) in tokens.iter().zip(&notes) {
        let (key, value) = cut(token, "=", line);
        assert_eq!(key, *k, "{line:?}");
        assert_eq!(unescape(value), whole(v.as_bytes()), "{k}: {line:?}");
    }
}

/// What the JSON line must say for bytes: lossless when they are UTF-8,
/// else each invalid sequence as U+FFFD.
fn text(bytes: &[u8]) -> Value {
    let t = String::from_utf8_lossy(bytes);
    if let Cow::Borrowed(s) = t {
        assert_eq!(s.as_bytes(), bytes);
    }
    Value::String(t.into_owned())
}

/// [`text`] for a client-supplied field: its first `FIELD_MAX` bytes,
/// then `...` if it had more.
fn cut_text(bytes: &[u8]) -> Value {
    if bytes.len() <= FIELD_MAX {
        return text(bytes);
    }
    let head = text(bytes.get(..FIELD_MAX).expect("longer"));
    Value::String(format!("{}...", head.as_str().expect("a string")))
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Null, Into::into)
}

fn check_json(r: &Record<'_>, secs: u64, nanos: u32, line: &str) {
    assert_eq!(line.find('\n'), Some(line.len() - 1), "one line: {line:?}");
    assert!(
        !line.contains(|c| matches!(c, '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}')),
        "a line break or control written raw: {line:?}"
    );
    let v: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    let o = v.as_object().expect("an object");
    let cut: Vec<&str> = [
        ("method", Some(r.method.as_bytes())),
        ("target", Some(r.target)),
        ("referer", r.referer),
        ("user_agent", r.user_agent),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_some_and(|v| v.len() > FIELD_MAX))
    .map(|(k, _)| k)
    .collect();
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if cut.is_empty() {
        assert!(!o.contains_key("truncated"), "{line:?}");
    } else {
        assert_eq!(o["truncated"], Value::from(cut), "{line:?}");
        keys.retain(|&k| k != "truncated");
    }
    assert_eq!(
        keys,
        [
            "bytes",
            "client",
            "duration_us",
            "ktls",
            "method",
            "referer",
            "remote",
            "sni",
            "status",
            "target",
            "time",
            "tls",
            "upstream",
            "upstream_error",
            "user_agent",
            "version",
        ],
        "{line:?}"
    );

    let (y, mo, d, h, mi, s) = civil(secs);
    let time = o["time"].as_str().expect("time is a string");
    let (whole, fraction) = time.split_at(19.min(time.len()));
    assert_eq!(
        whole,
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}"),
        "{line:?}"
    );
    let fraction = fraction.strip_suffix('Z').expect("UTC");
    if nanos == 0 {
        assert_eq!(fraction, "", "{line:?}");
    } else {
        let digits = fraction.strip_prefix('.').expect("a fraction");
        assert!(
            (1..=9).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{line:?}"
        );
        assert_eq!(
            format!("{digits:0<9}").parse::<u32>(),
            Ok(nanos),
            "{line:?}"
        );
    }

    let expect = [
        ("remote", Value::from(r.remote.to_string())),
        ("method", cut_text(r.method.as_bytes())),
        ("target", cut_text(r.target)),
        ("version", Value::from(r.version)),
        ("status", Value::from(r.status)),
        ("bytes", Value::from(r.body_bytes)),
        (
            "duration_us",
            Value::from(u64::try_from(r.duration.as_micros()).unwrap_or(u64::MAX)),
        ),
        ("referer", opt(r.referer.map(cut_text))),
        ("user_agent", opt(r.user_agent.map(cut_text))),
        ("sni", opt(r.sni)),
        ("tls", opt(r.tls_version)),
        ("ktls", Value::from(r.ktls)),
        ("upstream", opt(r.upstream)),
        ("upstream_error", opt(r.upstream_error)),
        (
            "client",
            opt(r.client.map(|c| {
                serde_json::json!({
                    "subject": c.subject,
                    "sans": c.sans,
                    "sha256": c.sha256.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                })
            })),
        ),
    ];
    for (key, want) in expect {
        assert_eq!(o[key], want, "{key}: {line:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.u8();
    let choice = input.u8();
    let address: [u8; 16] = input.array();
    let secs = u64::from_le_bytes(input.array()) % YEAR_10000;
    let nanos = u32::from_le_bytes(input.array()) % 1_000_000_000;
    let status = u16::from_le_bytes(input.array());
    let body_bytes = u64::from_le_bytes(input.array());
    let duration = Duration::new(
        u64::from_le_bytes(input.array()),
        u32::from_le_bytes(input.array()) % 1_000_000_000,
    );
    let method = String::from_utf8_lossy(input.field());
    let target = input.field();
    let referer = input.field();
    let user_agent = input.field();
    let sni = String::from_utf8_lossy(input.field());
    let upstream = String::from_utf8_lossy(input.field());
    let upstream_error = String::from_utf8_lossy(input.field());
    let subject = String::from_utf8_lossy(input.field()).into_owned();
    let common_name = String::from_utf8_lossy(input.field()).into_owned();
    let sans = (0..choice >> 5)
        .map(|_| String::from_utf8_lossy(input.field()).into_owned())
        .collect();
    let client = ClientIdentity {
        subject,
        common_name: (choice & 0x10 != 0).then_some(common_name),
        sans,
        sha256: input.array(),
    };
    let times = 1 + usize::from(input.u8());
    let method = method.repeat(times);
    let (target, referer, user_agent) = (
        target.repeat(times),
        referer.repeat(times),
        user_agent.repeat(times),
    );

    let flag = |bit: u8| flags & (1 << bit) != 0;
    let remote = if flag(0) {
        IpAddr::V6(Ipv6Addr::from(address))
    } else {
        IpAddr::V4(Ipv4Addr::new(
            address[0], address[1], address[2], address[3],
        ))
    };
    let record = Record {
        remote,
        time: SystemTime::UNIX_EPOCH + Duration::new(secs, nanos),
        method: &method,
        target: &target,
        version: VERSIONS[usize::from(choice & 3)],
        status,
        body_bytes,
        referer: flag(1).then_some(&referer),
        user_agent: flag(2).then_some(&user_agent),
        duration,
        sni: flag(3).then_some(&*sni),
        tls_version: TLS_VERSIONS[usize::from(choice >> 2 & 3) % TLS_VERSIONS.len()],
        ktls: flag(7),
        client: flag(4).then_some(&client),
        upstream: flag(5).then_some(&*upstream),
        upstream_error: flag(6).then_some(&*upstream_error),
    };
    check_combined(&record, secs, &format(LogFormat::Combined, &record));
    check_json(&record, secs, nanos, &format(LogFormat::Json, &record));
});
