//! Fuzzes the head the proxy writes upstream for a client's request: the
//! end-to-end smuggling check. For every head the strict parser accepts,
//! what goes upstream must be one complete head that the same parser and
//! httparse read back whole, with the client's method, the path it was
//! routed by, the client's body framing stated once, one Host, no
//! hop-by-hop field (nor any the client's `Connection` names), no
//! forwarding field of the client's (in any spelling a gateway would take
//! for the proxy's), and each of the proxy's own exactly once.
//!
//! Input: one byte of flags (a client certificate; an IPv6 client), then
//! the client's request head.

#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tlsgate_fuzz::{assert_same_fields, count_as, minor, read_back, CLIENT_LIMITS};
use tlsgate_http1::{list_elements, parse_request, BodyFraming, Method};
use tlsgate_proxy::path::normalize;
use tlsgate_proxy::{upstream_request_head, ClientConn, Request};

/// Fields only the proxy may write, each once. (`Via` is a list the
/// client's intermediaries may have begun: the proxy's entry comes last.)
const OWN: &[&str] = &[
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-proto",
    "forwarded",
];
/// Fields that never go upstream from a client (framing is redone).
const NEVER: &[&str] = &[
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "proxy-authorization",
    "expect",
];

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let limits = CLIENT_LIMITS;
    let Ok(Some(head)) = parse_request(data, &limits) else {
        return;
    };
    if head.method() == &Method::Connect {
        // `forward` refuses CONNECT before any head is made.
        return;
    }
    let peer: SocketAddr = if flags & 2 == 0 {
        "192.0.2.7:50000".parse().unwrap()
    } else {
        "[2001:db8::7]:50000".parse().unwrap()
    };
    let conn = ClientConn::new(peer, None);
    let cert = (flags & 1 == 1).then(|| "Hash=abc;Subject=\"CN=client\"".to_owned());
    let request = Request {
        head: &head,
        conn: &conn,
        client_cert: cert.clone(),
        max_body: 1 << 20,
        body_timeout: Duration::from_secs(1),
        send_timeout: Duration::from_secs(1),
        keep_alive: true,
    };
    let Ok(up) = upstream_request_head(&request) else {
        return;
    };

    let sent = read_back(&up);
    assert_eq!(sent.head_len(), up.len(), "one head, nothing after it");
    assert_eq!(sent.method(), head.method());
    assert_eq!(sent.body(), head.body());
    let origin_form = if head.target().starts_with(b"/") || head.target() == b"*" {
        head.target().to_vec()
    } else {
        let mut t = head.path().to_vec();
        if let Some(q) = head.query() {
            t.push(b'?');
            t.extend_from_slice(q);
        }
        t
    };
    assert_eq!(sent.target(), &*normalize(&origin_form).unwrap());

    let named: Vec<Vec<u8>> = head
        .headers()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| list_elements(v).map(<[u8]>::to_ascii_lowercase))
        .collect();
    let count = |wanted: &str| count_as(&sent, wanted);
    assert_eq!(count("host"), 1);
    for own in OWN {
        assert_eq!(count(own), 1, "{own}");
    }
    assert_eq!(
        count("x-forwarded-client-cert"),
        usize::from(cert.is_some())
    );
    for never in NEVER {
        assert_eq!(count(never), 0, "{never}");
    }
    let upgrade = sent.header("upgrade").is_some();
    assert_eq!(count("upgrade"), usize::from(upgrade));
    assert_eq!(count("connection"), usize::from(upgrade));
    let lengths = count("content-length");
    let codings = count("transfer-encoding");
    match head.body() {
        BodyFraming::None => assert_eq!((lengths, codings), (0, 0)),
        BodyFraming::ContentLength(_) => assert_eq!((lengths, codings), (1, 0)),
        BodyFraming::Chunked => {
            assert_eq!((lengths, codings), (0, 1));
            assert_eq!(sent.header("transfer-encoding"), Some(&b"chunked"[..]));
        }
    }
    // The fields the proxy writes itself are counted above; the client's
    // `Connection` names only what the client sent.
    let written = [
        "host",
        "x-forwarded-host",
        "x-forwarded-client-cert",
        "content-length",
        "transfer-encoding",
    ];
    for (name, _) in sent.headers() {
        let lower = name.to_ascii_lowercase();
        let ours = OWN.contains(&lower.as_str())
            || written.contains(&lower.as_str())
            || lower == "via"
            || (["connection", "upgrade"].contains(&lower.as_str()) && upgrade);
        assert!(
            ours || !named.iter().any(|n| n == lower.as_bytes()),
            "{name} is named by the client's Connection"
        );
    }

    let mut fields = [httparse::EMPTY_HEADER; 160];
    let mut reference = httparse::Request::new(&mut fields);
    let status = reference.parse(&up);
    assert!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == up.len()),
        "httparse read {status:?}"
    );
    assert_eq!(reference.version, Some(minor(sent.version())));
    let ours: Vec<_> = sent.headers().collect();
    assert_same_fields(&ours, reference.headers);
});
