//! Fuzzes `ChunkedDecoder`: it must never panic, never claim more input than
//! it was given, and give the same result fed at once or byte by byte.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_http1::{ChunkError, ChunkedDecoder, Decoded};

const MAX_BODY: u64 = 1 << 16;
const MAX_TRAILERS: usize = 1024;

fn bytewise(data: &[u8], out: &mut Vec<u8>) -> Result<Decoded, ChunkError> {
    let mut decoder = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
    let mut consumed = 0;
    for b in data {
        let r = decoder.decode(std::slice::from_ref(b), out)?;
        assert!(r.consumed <= 1);
        consumed += r.consumed;
        if r.done {
            return Ok(Decoded {
                consumed,
                done: true,
            });
        }
    }
    Ok(Decoded {
        consumed,
        done: false,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut decoder = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
    let mut out = Vec::new();
    let whole = decoder.decode(data, &mut out);
    if let Ok(d) = whole {
        assert!(d.consumed <= data.len());
        assert!(d.done || d.consumed == data.len());
        assert!(out.len() as u64 <= MAX_BODY);
    }
    let mut out2 = Vec::new();
    assert_eq!(whole, bytewise(data, &mut out2));
    assert_eq!(out, out2);
});
