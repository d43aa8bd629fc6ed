//! Fuzzes the PROXY protocol header (v1 text, v2 binary) that a trusted
//! load balancer puts before a connection's TLS. The server peeks at what
//! has arrived and parses it again as more comes, so beyond not panicking:
//! a header's length stays within the input and the limit; every prefix
//! of a whole header asks for more (a header split across TCP segments is
//! never refused); and the bytes after it (the ClientHello) change
//! nothing, neither its length nor what it says.
//!
//! Input: the stream as the socket would hold it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_server::proxy_protocol::{parse_header, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((len, header))) = parse_header(data) else {
        return;
    };
    assert!(len > 0 && len <= data.len() && len <= MAX_HEADER, "{len}");
    let exact = &data[..len];
    assert_eq!(parse_header(exact).ok(), Some(Some((len, header))));
    for n in 1..len {
        assert!(
            matches!(parse_header(&exact[..n]), Ok(None)),
            "a prefix of {n} of {len} bytes was not taken as the start of a header: {:?}",
            parse_header(&exact[..n])
        );
    }
    let mut longer = exact.to_vec();
    longer.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n");
    assert_eq!(parse_header(&longer).ok(), Some(Some((len, header))));
});
