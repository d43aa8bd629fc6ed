//! Fuzzes `parse_request`: it must never panic, successful parses must stay
//! within the input and the limits, and no prefix of an accepted head may be
//! rejected (early errors must be certain ones).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_http1::{parse_request, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_head_bytes: 4096,
        max_target_bytes: 512,
        max_headers: 32,
    };
    let Ok(Some(head)) = parse_request(data, &limits) else {
        return;
    };
    assert!(head.head_len() <= data.len());
    assert!(head.head_len() <= limits.max_head_bytes);
    assert!(head.target().len() <= limits.max_target_bytes);
    assert!(head.headers().count() <= limits.max_headers);
    let _ = (
        head.method().as_str(),
        head.path(),
        head.query(),
        head.host(),
        head.body(),
        head.keep_alive(),
        head.version(),
    );
    for n in [0, head.head_len() / 2, head.head_len() - 1] {
        assert!(matches!(parse_request(&data[..n], &limits), Ok(None)));
    }
});
