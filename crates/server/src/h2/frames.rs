//! The frame layout of the bytes under an HTTP/2 connection, followed as
//! they pass without parsing anything twice (9 bytes of header per frame):
//! [`ClientFrames`] charges the client's frames that cost the server work
//! without serving anything to token buckets, [`SentFrames`] picks the
//! error codes out of the RST_STREAM and GOAWAY frames the server sends.
//! Both give the same verdict however reads split the bytes; no I/O here
//! (the guard in `guard.rs` owns that), so the fuzzer can drive them.

use std::time::Instant;

use tlsgate_config::{FrameRate, Http2};

/// The client connection preface (RFC 9113 §3.4) precedes the frames.
pub const PREFACE_LEN: usize = 24;

/// Frame types and flags (RFC 9113 §6).
#[allow(missing_docs)] // Each is the RFC's name.
pub mod frame {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
}

/// A token bucket, refilled by time and by work done for the client.
struct Bucket {
    tokens: f64,
    rate: FrameRate,
    at: Instant,
}

impl Bucket {
    fn new(rate: FrameRate, now: Instant) -> Self {
        Self {
            tokens: f64::from(rate.burst),
            rate,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * f64::from(self.rate.per_second))
            .min(f64::from(self.rate.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn credit(&mut self, tokens: usize) {
        self.tokens = (self.tokens + tokens as f64).min(f64::from(self.rate.burst));
    }
}

/// A 9-byte frame header gathered across reads that split it anywhere.
#[derive(Default)]
struct FrameHead {
    bytes: [u8; 9],
    have: usize,
}

impl FrameHead {
    /// Takes header bytes off the front of `input`; the header once whole.
    fn gather(&mut self, input: &mut &[u8]) -> Option<[u8; 9]> {
        let n = (9 - self.have).min(input.len());
        if let (Some(dst), Some(src)) =
            (self.bytes.get_mut(self.have..self.have + n), input.get(..n))
        {
            dst.copy_from_slice(src);
        }
        self.have += n;
        *input = input.get(n..).unwrap_or_default();
        if self.have < 9 {
            return None;
        }
        self.have = 0;
        Some(self.bytes)
    }
}

/// Follows the frame layout of the client's bytes.
pub struct ClientFrames {
    preface_left: usize,
    head: FrameHead,
    payload_left: usize,
    /// HEADERS and CONTINUATION frames of the header block being received.
    block_frames: Option<u32>,
    max_block_frames: u32,
    resets: Bucket,
    control: Bucket,
}

impl ClientFrames {
    /// A connection's follower, its buckets full at `now`.
    pub fn new(limits: &Http2, now: Instant) -> Self {
        Self {
            preface_left: PREFACE_LEN,
            head: FrameHead::default(),
            payload_left: 0,
            block_frames: None,
            max_block_frames: limits.max_header_frames,
            resets: Bucket::new(limits.resets, now),
            control: Bucket::new(limits.control_frames, now),
        }
    }

    /// Follows `bytes`; `Err(reason)` when a limit is passed.
    pub fn observe(&mut self, mut bytes: &[u8], now: Instant) -> Result<(), &'static str> {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            if let Some([l0, l1, l2, kind, flags, ..]) = self.head.gather(&mut bytes) {
                let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                self.payload_left = len;
                self.frame(kind, flags, len, now)?;
            }
        }
        Ok(())
    }

    /// `frames` more control frames earned by bytes sent to the client.
    pub fn credit_control(&mut self, frames: usize) {
        self.control.credit(frames);
    }

    fn frame(&mut self, kind: u8, flags: u8, len: usize, now: Instant) -> Result<(), &'static str> {
        use frame::*;
        let control = |c: &mut Bucket, reason| if c.take(now) { Ok(()) } else { Err(reason) };
        match kind {
            HEADERS => {
                self.block_frames = (flags & END_HEADERS == 0).then_some(1);
                Ok(())
            }
            CONTINUATION => {
                let n = self.block_frames.unwrap_or(0) + 1;
                if n > self.max_block_frames {
                    return Err("continuation_flood");
                }
                self.block_frames = (flags & END_HEADERS == 0).then_some(n);
                if len == 0 && flags & END_HEADERS == 0 {
                    return control(&mut self.control, "empty_frame_flood");
                }
                Ok(())
            }
            RST_STREAM => control(&mut self.resets, "reset_flood"),
            DATA if len == 0 && flags & END_STREAM == 0 => {
                control(&mut self.control, "empty_frame_flood")
            }
            DATA => Ok(()),
            // One ends a client's side; more (up to 16 KiB each) only
            // cost reads.
            GOAWAY => control(&mut self.control, "goaway_flood"),
            PING => control(&mut self.control, "ping_flood"),
            SETTINGS if flags & ACK == 0 => control(&mut self.control, "settings_flood"),
            SETTINGS => Ok(()),
            PRIORITY => control(&mut self.control, "priority_flood"),
            WINDOW_UPDATE => control(&mut self.control, "window_update_flood"),
            // PUSH_PROMISE from a client is h2's protocol error; unknown
            // types are ignored by h2 (RFC 9113 §5.5) but still cost a read.
            _ => control(&mut self.control, "unknown_frame_flood"),
        }
    }
}

/// RFC 9113 §7's name of an error code, as a metric label.
pub fn error_code_name(code: u32) -> &'static str {
    match code {
        0x0 => "no_error",
        0x1 => "protocol_error",
        0x2 => "internal_error",
        0x3 => "flow_control_error",
        0x4 => "settings_timeout",
        0x5 => "stream_closed",
        0x6 => "frame_size_error",
        0x7 => "refused_stream",
        0x8 => "cancel",
        0x9 => "compression_error",
        0xa => "connect_error",
        0xb => "enhance_your_calm",
        0xc => "inadequate_security",
        0xd => "http_1_1_required",
        _ => "unknown",
    }
}

/// Follows the frame layout of the server's bytes for the frames that end
/// a stream or the connection with an error code: only frame headers and
/// the first 8 payload bytes of those two types are looked at.
#[derive(Default)]
pub struct SentFrames {
    head: FrameHead,
    payload_left: usize,
    /// RST_STREAM or GOAWAY being read: its type and where its code ends.
    ending: Option<(u8, usize)>,
    code: [u8; 8],
    code_have: usize,
}

impl SentFrames {
    /// Adds payload bytes of the frame being read to its code; the code
    /// once its last byte (`code_end`) is in.
    fn gather_code(&mut self, bytes: &[u8], code_end: usize) -> Option<u32> {
        let have = self.code_have;
        if let Some(dst) = self.code.get_mut(have..have + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        self.code_have += bytes.len();
        if self.code_have < code_end {
            return None;
        }
        self.ending = None;
        let code = self.code.get(code_end - 4..code_end)?;
        <[u8; 4]>::try_from(code).ok().map(u32::from_be_bytes)
    }

    /// Follows `bytes`; `ended(frame, code)` for each RST_STREAM or GOAWAY.
    pub fn observe(
        &mut self,
        mut bytes: &[u8],
        ended: &mut impl FnMut(&'static str, &'static str),
    ) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let mut n = self.payload_left.min(bytes.len());
                if let Some((kind, code_end)) = self.ending {
                    n = n.min(code_end - self.code_have);
                    if let Some(code) =
                        self.gather_code(bytes.get(..n).unwrap_or_default(), code_end)
                    {
                        let frame = if kind == frame::GOAWAY {
                            "goaway"
                        } else {
                            "rst_stream"
                        };
                        ended(frame, error_code_name(code));
                    }
                }
                self.payload_left -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            if let Some([l0, l1, l2, kind, ..]) = self.head.gather(&mut bytes) {
                let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                self.payload_left = len;
                // The code: all of RST_STREAM's payload, GOAWAY's bytes 4..8.
                let code_end = match kind {
                    frame::RST_STREAM => 4,
                    frame::GOAWAY => 8,
                    _ => 0,
                };
                self.code_have = 0;
                self.ending = (code_end > 0 && len >= code_end).then_some((kind, code_end));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits() -> Http2 {
        let mut l = tlsgate_config::load(None, &Default::default(), std::path::Path::new("/"))
            .unwrap()
            .http2;
        l.resets = FrameRate {
            per_second: 1,
            burst: 3,
        };
        l.control_frames = FrameRate {
            per_second: 1,
            burst: 5,
        };
        l.max_header_frames = 3;
        l
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_split_anywhere_are_followed_and_resets_are_bounded() {
        let now = Instant::now();
        let mut r = ClientFrames::new(&limits(), now);
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(frame::SETTINGS, 0, &[0; 6]));
        wire.extend(frame(frame::HEADERS, frame::END_HEADERS, &[0x82; 20]));
        for _ in 0..3 {
            wire.extend(frame(frame::RST_STREAM, 0, &[0, 0, 0, 8]));
        }
        // One byte at a time: the layout is kept across reads.
        for b in &wire {
            r.observe(std::slice::from_ref(b), now).unwrap();
        }
        assert_eq!(
            r.observe(&frame(frame::RST_STREAM, 0, &[0, 0, 0, 8]), now),
            Err("reset_flood")
        );
    }

    #[test]
    fn sent_resets_and_goaways_are_counted_by_code_however_split() {
        let mut wire = frame(frame::HEADERS, frame::END_HEADERS, &[0x88; 3]);
        wire.extend(frame(frame::DATA, 0, &[7; 40]));
        wire.extend(frame(frame::RST_STREAM, 0, &[0, 0, 0, 7]));
        // A RST_STREAM's code inside a DATA payload is not a frame.
        wire.extend(frame(
            frame::DATA,
            0,
            &frame(frame::RST_STREAM, 0, &[0, 0, 0, 1]),
        ));
        wire.extend(frame(
            frame::GOAWAY,
            0,
            &[0, 0, 0, 5, 0, 0, 0, 0xb, b'x', b'y'],
        ));
        wire.extend(frame(frame::RST_STREAM, 0, &[0, 0, 0, 0x42]));
        let expected = vec![
            ("rst_stream", "refused_stream"),
            ("goaway", "enhance_your_calm"),
            ("rst_stream", "unknown"),
        ];
        for step in [1, 3, 10, wire.len()] {
            let mut seen = Vec::new();
            let mut f = SentFrames::default();
            for piece in wire.chunks(step) {
                f.observe(piece, &mut |frame, code| seen.push((frame, code)));
            }
            assert_eq!(seen, expected, "split every {step} bytes");
        }
    }

    #[test]
    fn long_header_blocks_and_ping_floods_trip_but_sent_bytes_refill() {
        let now = Instant::now();
        let mut r = ClientFrames::new(&limits(), now);
        r.observe(&[0; PREFACE_LEN], now).unwrap();
        r.observe(&frame(frame::HEADERS, 0, &[0; 4]), now).unwrap();
        r.observe(&frame(frame::CONTINUATION, 0, &[0; 4]), now)
            .unwrap();
        r.observe(&frame(frame::CONTINUATION, 0, &[0; 4]), now)
            .unwrap();
        assert_eq!(
            r.observe(&frame(frame::CONTINUATION, 0, &[0; 4]), now),
            Err("continuation_flood")
        );
        let mut r = ClientFrames::new(&limits(), now);
        r.observe(&[0; PREFACE_LEN], now).unwrap();
        for _ in 0..5 {
            r.observe(&frame(frame::PING, 0, &[0; 8]), now).unwrap();
        }
        assert_eq!(
            r.observe(&frame(frame::PING, 0, &[0; 8]), now),
            Err("ping_flood")
        );
        let mut r = ClientFrames::new(&limits(), now);
        r.observe(&[0; PREFACE_LEN], now).unwrap();
        for _ in 0..5 {
            r.observe(&frame(frame::GOAWAY, 0, &[0; 8]), now).unwrap();
        }
        assert_eq!(
            r.observe(&frame(frame::GOAWAY, 0, &[0; 8]), now),
            Err("goaway_flood")
        );
        // A tripped reader is done with; a new one, its bucket emptied.
        let mut r = ClientFrames::new(&limits(), now);
        r.observe(&[0; PREFACE_LEN], now).unwrap();
        for _ in 0..5 {
            r.observe(&frame(frame::SETTINGS, 0, &[]), now).unwrap();
        }
        r.control.credit(1);
        r.observe(&frame(frame::WINDOW_UPDATE, 0, &[0, 0, 1, 0]), now)
            .unwrap();
        // Time refills too.
        let later = now + std::time::Duration::from_secs(2);
        r.observe(&frame(frame::DATA, 0, &[]), later).unwrap();
        r.observe(&frame(frame::DATA, 0, &[]), later).unwrap();
        // A DATA frame with a body, or that ends the stream, is not charged.
        r.observe(&frame(frame::DATA, frame::END_STREAM, &[]), later)
            .unwrap();
        r.observe(&frame(frame::DATA, 0, &[1, 2, 3]), later)
            .unwrap();
        assert_eq!(
            r.observe(&frame(frame::DATA, 0, &[]), later),
            Err("empty_frame_flood")
        );
    }
}
