//! Fuzzes `parse_response`, the proxy's reader of what an upstream sends.
//! It must never panic; an accepted head stays within the input and the
//! limits; no prefix of it is refused; its framing is unambiguous and
//! follows from its fields (a relayed body is never framed two ways); no
//! value it accepts holds CR, LF or NUL; and httparse reads the same
//! status, version and fields from the same bytes. The first input byte
//! says whether the request was a HEAD.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_fuzz::{assert_same_fields, minor, says_length, FramingFields};
use tlsgate_http1::{parse_response, ResponseFraming};

const MAX_HEAD: usize = 4096;
const MAX_HEADERS: usize = 32;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let head_request = flags & 1 == 1;
    let Ok(Some(head)) = parse_response(data, MAX_HEAD, MAX_HEADERS, head_request) else {
        return;
    };
    let len = head.head_len();
    assert!(len <= data.len() && len <= MAX_HEAD);
    assert!((100..=599).contains(&head.status()));
    assert!(head.headers().count() <= MAX_HEADERS);
    for n in [0, len / 2, len - 1] {
        assert!(matches!(
            parse_response(&data[..n], MAX_HEAD, MAX_HEADERS, head_request),
            Ok(None)
        ));
    }

    let FramingFields {
        lengths,
        transfer_encoding,
    } = FramingFields::of(head.headers());
    assert!(!transfer_encoding || lengths.is_empty(), "framed two ways");
    let bodiless = head_request || head.status() < 200 || matches!(head.status(), 204 | 304);
    match head.framing() {
        ResponseFraming::None => assert!(bodiless),
        ResponseFraming::Length(n) => {
            assert!(!bodiless);
            assert!(!lengths.is_empty());
            assert!(
                lengths.iter().all(|l| says_length(l, n)),
                "{lengths:?} for {n}"
            );
        }
        ResponseFraming::Chunked => assert!(!bodiless && transfer_encoding),
        ResponseFraming::UntilClose => {
            assert!(!bodiless && lengths.is_empty() && !transfer_encoding);
            assert!(!head.keep_alive());
        }
    }

    let mut fields = [httparse::EMPTY_HEADER; 40];
    let mut reference = httparse::Response::new(&mut fields);
    let status = reference.parse(&data[..len]);
    assert!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == len),
        "httparse read {status:?} where the head is {len} bytes"
    );
    assert_eq!(reference.code, Some(head.status()));
    assert_eq!(reference.version, Some(minor(head.version())));
    let ours: Vec<_> = head.headers().collect();
    assert_same_fields(&ours, reference.headers);
});
