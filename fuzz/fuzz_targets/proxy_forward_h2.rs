//! Fuzzes the head the proxy sends upstream for an HTTP/2 stream: the
//! downgrade from HTTP/2 to HTTP/1.1, where request smuggling through
//! proxies has been found again and again (values with CR/LF, a length
//! that disagrees with the body, `transfer-encoding` over h2). The stream
//! is built from what the `http` crate accepts as the `h2` crate hands it
//! over (method, `:path`, `:authority`, field names and values) and what
//! the server's translation keeps; the head that goes upstream must be one
//! complete head that httparse and the project's parser read back whole,
//! with the method, the path as routed, the body framed once (by the
//! client's length, or chunked when it gave none), one Host (the
//! authority), no hop-by-hop field however the client sent it, no client
//! copy of a forwarding field, and the proxy's own fields once.

#![no_main]

use std::net::SocketAddr;

use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tlsgate_fuzz::{assert_same_fields, count_as, minor, read_back};
use tlsgate_http1::{is_field_value, is_target_text, is_valid_host, BodyFraming, Method};
use tlsgate_proxy::path::normalize;
use tlsgate_proxy::{upstream_stream_head, ClientConn, StreamRequest};

#[derive(Arbitrary, Debug)]
struct Stream<'a> {
    method: &'a [u8],
    path: &'a [u8],
    authority: &'a [u8],
    fields: Vec<(&'a [u8], &'a [u8])>,
    content_length: Option<u64>,
    end_stream: bool,
    client_cert: bool,
    ipv6: bool,
}

/// Hop-by-hop and framing fields: never the client's upstream.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-authorization",
];
/// The proxy's own fields, each once.
const OWN: &[&str] = &[
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-proto",
    "forwarded",
    "host",
];

fuzz_target!(|s: Stream<'_>| {
    // What h2 and the http crate let through.
    let Ok(method) = http::Method::from_bytes(s.method) else {
        return;
    };
    let method = Method::from_token(method.as_str().as_bytes());
    if method == Method::Connect {
        return; // refused before any head is made
    }
    let Ok(path) = PathAndQuery::try_from(s.path) else {
        return;
    };
    let Ok(authority) = Authority::try_from(s.authority) else {
        return;
    };
    // What the server refuses before (crates/server/src/h2.rs and
    // h2/proxy.rs): an authority that is not a Host HTTP/1.1 would take,
    // a target with what HTTP/1.1 refuses in one (until this target found
    // `:g(` and raw UTF-8 going upstream), `*` but for OPTIONS, a path
    // that is not origin-form.
    let target = path.as_str().as_bytes();
    let host = authority.as_str().as_bytes();
    if !(target.starts_with(b"/") || (target == b"*" && method == Method::Options))
        || !is_target_text(target)
        || host.is_empty()
        || !is_valid_host(host, false)
    {
        return;
    }
    let mut fields = Vec::new();
    for (name, value) in &s.fields {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            return;
        };
        if name == http::header::HOST || name == http::header::COOKIE {
            continue;
        }
        if !is_field_value(value.as_bytes()) {
            return;
        }
        fields.push((name, value));
    }
    let fields: Vec<(&str, &[u8])> = fields
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();

    let peer: SocketAddr = if s.ipv6 {
        "[2001:db8::7]:50000".parse().unwrap()
    } else {
        "192.0.2.7:50000".parse().unwrap()
    };
    let conn = ClientConn::new(peer, None);
    let request = StreamRequest {
        method: &method,
        target,
        host,
        fields: &fields,
        content_length: s.content_length,
        end_stream: s.end_stream,
        conn: &conn,
        client_cert: s.client_cert.then(|| "Hash=abc".to_owned()),
        max_body: u64::MAX,
    };
    let Ok((up, framing)) = upstream_stream_head(&request) else {
        return;
    };

    let mut slots = [httparse::EMPTY_HEADER; 256];
    let mut reference = httparse::Request::new(&mut slots);
    let status = reference.parse(&up);
    assert!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == up.len()),
        "httparse read {status:?} of {:?}",
        String::from_utf8_lossy(&up)
    );
    assert_eq!(reference.method, Some(method.as_str()));
    let routed = normalize(target).unwrap();
    assert_eq!(reference.path.map(str::as_bytes), Some(&*routed));
    assert_eq!(reference.version, Some(1));

    let sent = read_back(&up);
    assert_eq!(sent.head_len(), up.len());
    assert_eq!(minor(sent.version()), 1);
    let ours: Vec<_> = sent.headers().collect();
    assert_same_fields(&ours, reference.headers);

    let expected = match (s.content_length, s.end_stream) {
        (Some(n), _) => BodyFraming::ContentLength(n),
        (None, true) => BodyFraming::None,
        (None, false) => BodyFraming::Chunked,
    };
    assert_eq!(framing, expected);
    assert_eq!(sent.body(), expected);
    let count = |wanted: &str| count_as(&sent, wanted);
    let framing_fields = (count("content-length"), count("transfer-encoding"));
    match expected {
        BodyFraming::None => assert_eq!(framing_fields, (0, 0)),
        BodyFraming::ContentLength(_) => assert_eq!(framing_fields, (1, 0)),
        BodyFraming::Chunked => assert_eq!(framing_fields, (0, 1)),
    }
    for hop in HOP {
        assert_eq!(count(hop), 0, "{hop}");
    }
    for own in OWN {
        assert_eq!(count(own), 1, "{own}");
    }
    assert_eq!(sent.header("host"), Some(host));
    assert_eq!(count("x-forwarded-client-cert"), usize::from(s.client_cert));
    let via = sent
        .headers()
        .filter(|(n, _)| n.eq_ignore_ascii_case("via"))
        .last();
    assert!(matches!(via, Some((_, v)) if v == b"2 tlsgate"), "{via:?}");
});
