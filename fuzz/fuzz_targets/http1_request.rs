//! Fuzzes `parse_request`, the first reader of every byte a client sends.
//! It must never panic; an accepted head stays within the input and the
//! limits; no prefix of an accepted head is refused (early errors must be
//! certain ones); its framing is unambiguous (never Content-Length beside
//! Transfer-Encoding, every Content-Length the same); no value it accepts
//! holds CR, LF or NUL; and httparse, the reference tokenizer, reads the
//! same head: same length, method, target, version and fields.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_fuzz::{assert_same_fields, minor, says_length, FramingFields, CLIENT_LIMITS};
use tlsgate_http1::{host_without_port, parse_request, BodyFraming};

fuzz_target!(|data: &[u8]| {
    let limits = CLIENT_LIMITS;
    let Ok(Some(head)) = parse_request(data, &limits) else {
        return;
    };
    assert!(head.head_len() <= data.len());
    assert!(head.head_len() <= limits.max_head_bytes);
    assert!(head.target().len() <= limits.max_target_bytes);
    assert!(head.headers().count() <= limits.max_headers);
    let _ = (head.path(), head.query(), head.keep_alive());
    if let Some(host) = head.host() {
        // What routes and certificates are picked by: a part of the Host.
        let name = host_without_port(host);
        assert!(host.starts_with(name), "{host:?} gave {name:?}");
    }
    for n in [0, head.head_len() / 2, head.head_len() - 1] {
        assert!(matches!(parse_request(&data[..n], &limits), Ok(None)));
    }

    let FramingFields {
        lengths,
        transfer_encoding,
    } = FramingFields::of(head.headers());
    match head.body() {
        BodyFraming::Chunked => assert!(transfer_encoding && lengths.is_empty()),
        BodyFraming::ContentLength(n) => {
            assert!(!transfer_encoding);
            assert!(
                lengths.iter().all(|l| says_length(l, n)),
                "{lengths:?} for {n}"
            );
        }
        BodyFraming::None => assert!(!transfer_encoding),
    }

    let mut fields = [httparse::EMPTY_HEADER; 40];
    let mut reference = httparse::Request::new(&mut fields);
    let status = reference.parse(&data[..head.head_len()]);
    assert!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == head.head_len()),
        "httparse read {status:?} where the head is {} bytes",
        head.head_len()
    );
    assert_eq!(reference.method, Some(head.method().as_str()));
    assert_eq!(reference.path.map(str::as_bytes), Some(head.target()));
    assert_eq!(reference.version, Some(minor(head.version())));
    let ours: Vec<_> = head.headers().collect();
    assert_same_fields(&ours, reference.headers);
});
