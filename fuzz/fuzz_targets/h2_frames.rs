//! Fuzzes the HTTP/2 flood guard's frame followers, which see the
//! client's bytes (and the server's) as the socket's reads cut them. The
//! verdict must not depend on that cut: a limit trips in the read that
//! holds the last header byte of the frame that passes it, with the same
//! reason, and never earlier; the RST_STREAM and GOAWAY codes the server
//! sends are counted once each, whatever the reads. Both are checked
//! against a reading of the whole stream at once, frame by frame.
//!
//! Input: the limits, the lengths of successive reads, then the bytes.

#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tlsgate_config::Http2;
use tlsgate_server::h2_frames::{error_code_name, frame, ClientFrames, SentFrames, PREFACE_LEN};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    resets: u8,
    control: u8,
    header_frames: u8,
    reads: Vec<u8>,
    bytes: &'a [u8],
}

fn defaults() -> &'static Http2 {
    static DEFAULTS: OnceLock<Http2> = OnceLock::new();
    DEFAULTS.get_or_init(|| {
        tlsgate_config::load(None, &Default::default(), std::path::Path::new("/"))
            .expect("the embedded defaults load")
            .http2
    })
}

/// A frame header at `at`: payload length, type, flags.
fn header(bytes: &[u8], at: usize) -> Option<(usize, u8, u8)> {
    let h = bytes.get(at..at + 9)?;
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    Some((len, h[3], h[4]))
}

/// The whole client stream read at once: where the first limit trips (the
/// offset just past the header of the frame that passes it) and why.
fn client_verdict(bytes: &[u8], limits: &Http2) -> Option<(usize, &'static str)> {
    let mut resets = limits.resets.burst;
    let mut control = limits.control_frames.burst;
    let mut block: Option<u32> = None;
    let take = |bucket: &mut u32, reason| {
        if *bucket == 0 {
            return Err(reason);
        }
        *bucket -= 1;
        Ok(())
    };
    let mut at = PREFACE_LEN;
    while let Some((len, kind, flags)) = header(bytes, at) {
        at += 9;
        let end_headers = flags & frame::END_HEADERS != 0;
        let verdict = match kind {
            frame::HEADERS => {
                block = (!end_headers).then_some(1);
                Ok(())
            }
            frame::CONTINUATION => {
                let n = block.unwrap_or(0) + 1;
                if n > limits.max_header_frames {
                    Err("continuation_flood")
                } else {
                    block = (!end_headers).then_some(n);
                    if len == 0 && !end_headers {
                        take(&mut control, "empty_frame_flood")
                    } else {
                        Ok(())
                    }
                }
            }
            frame::RST_STREAM => take(&mut resets, "reset_flood"),
            frame::DATA if len == 0 && flags & frame::END_STREAM == 0 => {
                take(&mut control, "empty_frame_flood")
            }
            frame::DATA => Ok(()),
            frame::GOAWAY => take(&mut control, "goaway_flood"),
            frame::PING => take(&mut control, "ping_flood"),
            frame::SETTINGS if flags & frame::ACK == 0 => take(&mut control, "settings_flood"),
            frame::SETTINGS => Ok(()),
            frame::PRIORITY => take(&mut control, "priority_flood"),
            frame::WINDOW_UPDATE => take(&mut control, "window_update_flood"),
            _ => take(&mut control, "unknown_frame_flood"),
        };
        if let Err(reason) = verdict {
            return Some((at, reason));
        }
        at = at.saturating_add(len);
    }
    None
}

/// The whole server stream read at once: each ending frame whose code is in.
fn sent_codes(bytes: &[u8]) -> Vec<(&'static str, &'static str)> {
    let mut codes = Vec::new();
    let mut at = 0;
    while let Some((len, kind, _)) = header(bytes, at) {
        at += 9;
        let code_at = match kind {
            frame::RST_STREAM if len >= 4 => Some(("rst_stream", at)),
            frame::GOAWAY if len >= 8 => Some(("goaway", at + 4)),
            _ => None,
        };
        if let Some((name, code_at)) = code_at {
            if let Some(code) = bytes.get(code_at..code_at + 4) {
                let code = u32::from_be_bytes(code.try_into().expect("4 bytes"));
                codes.push((name, error_code_name(code)));
            }
        }
        at = at.saturating_add(len);
    }
    codes
}

/// The bytes as successive reads of the given lengths (cycled).
fn reads<'b>(bytes: &'b [u8], lengths: &[u8]) -> Vec<(usize, &'b [u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = match lengths.get(i % lengths.len().max(1)) {
            Some(&l) => usize::from(l) + 1,
            None => bytes.len(),
        };
        let end = (at + n).min(bytes.len());
        out.push((at, &bytes[at..end]));
        at = end;
        i += 1;
    }
    out
}

fuzz_target!(|input: Input<'_>| {
    let mut limits = defaults().clone();
    limits.resets.burst = 1 + u32::from(input.resets % 8);
    limits.control_frames.burst = 1 + u32::from(input.control % 16);
    limits.max_header_frames = 1 + u32::from(input.header_frames % 8);
    let now = Instant::now();
    let reads = reads(input.bytes, &input.reads);

    let expected = client_verdict(input.bytes, &limits);
    let mut client = ClientFrames::new(&limits, now);
    let mut tripped = None;
    for &(at, read) in &reads {
        if let Err(reason) = client.observe(read, now) {
            tripped = Some((at, at + read.len(), reason));
            break;
        }
    }
    match (expected, tripped) {
        (None, None) => {}
        (Some((past, reason)), Some((start, end, got))) => {
            assert!(
                start < past && past <= end,
                "tripped in the read of bytes {start}..{end}, the frame's header ends at {past}"
            );
            assert_eq!(got, reason, "at {past}");
        }
        (expected, tripped) => panic!("expected {expected:?}, tripped {tripped:?}"),
    }

    let mut counted = Vec::new();
    let mut sent = SentFrames::default();
    for &(_, read) in &reads {
        sent.observe(read, &mut |frame, code| counted.push((frame, code)));
    }
    assert_eq!(counted, sent_codes(input.bytes));
});
