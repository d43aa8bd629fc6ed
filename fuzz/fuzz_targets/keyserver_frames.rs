//! Fuzzes the key protocol, the one thing a compromised worker can send
//! the process that holds the private keys (and what the worker reads
//! back). The stream is split by the `Deframer` in pieces the input
//! chooses; each frame is decoded as a request and as a response. Nothing
//! may panic, no frame may exceed the bound, and the format is canonical:
//! whatever decodes encodes back to the very same bytes, so the two ends
//! cannot read one frame two ways.
//!
//! Input: one byte choosing the read size (1 to 256 bytes), then the stream.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_keyserver::proto::{
    decode_request, decode_response, encode_request, encode_response, Deframer, MAX_REQUEST,
};

fn check(payload: &[u8]) {
    assert!(payload.len() <= MAX_REQUEST);
    if let Ok((id, request)) = decode_request(payload) {
        let mut again = Vec::new();
        encode_request(&mut again, id, &request);
        assert_eq!(&again[4..], payload, "{request:?} encodes otherwise");
        assert_eq!(
            u32::from_be_bytes([again[0], again[1], again[2], again[3]]) as usize,
            payload.len()
        );
    }
    if let Ok((id, response)) = decode_response(payload) {
        let mut again = Vec::new();
        encode_response(&mut again, id, &response);
        assert_eq!(&again[4..], payload, "{response:?} encodes otherwise");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step) + 1;
    let mut deframer = Deframer::new(MAX_REQUEST);
    for piece in stream.chunks(step) {
        deframer.push(piece);
        loop {
            match deframer.next_frame() {
                Ok(Some(payload)) => check(payload),
                Ok(None) => break,
                // A bad length prefix ends the stream: the reader drops it.
                Err(_) => return,
            }
        }
        assert!(deframer.pending() <= 4 + MAX_REQUEST + step);
    }
});
