//! Strict streaming decoder for the chunked transfer coding (RFC 9112 §7.1).
//!
//! Owns chunk-size lines, chunk extensions, chunk data framing and the
//! trailer section. It is a byte-level state machine: it never buffers or
//! allocates on its own, so input may be split anywhere (even byte by byte)
//! with identical results. Extensions and trailers are validated and then
//! discarded.

use crate::error::ChunkError;
use crate::syntax;

/// A chunk size may have at most 16 hex digits, so it always fits in u64.
const MAX_SIZE_DIGITS: u8 = 16;
/// Extension bytes allowed on a single chunk-size line.
const MAX_EXT_BYTES_PER_LINE: usize = 1024;
/// Extension bytes allowed over the whole body, so that many tiny chunks
/// with long extensions cannot make us chew far more bytes than `max_body`.
const MAX_EXT_BYTES_TOTAL: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the first hex digit of a chunk size.
    SizeStart,
    /// In the hex digits.
    Size,
    /// BWS after the size; only more BWS or ';' may follow.
    SizeBws,
    /// After ';': BWS, then an extension name.
    ExtBeforeName,
    ExtName,
    /// BWS after a name: '=' or ';' must follow.
    ExtAfterName,
    /// After '=': BWS, then a token or quoted-string.
    ExtBeforeValue,
    ExtToken,
    ExtQuoted,
    /// After a backslash inside a quoted-string.
    ExtQuotedPair,
    /// Right after the closing DQUOTE.
    ExtAfterQuoted,
    /// BWS after a value: only ';' may follow.
    ExtAfterValue,
    /// CR of the chunk-size line seen.
    SizeLf,
    /// Inside chunk data; `remaining` bytes left.
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    /// CR of the final empty line seen.
    FinalLf,
    Done,
    Failed(ChunkError),
}

/// Streaming decoder for a chunked request body.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size_digits: u8,
    /// The chunk size being read, then the data bytes still to come.
    remaining: u64,
    body_len: u64,
    max_body: u64,
    line_ext_bytes: usize,
    total_ext_bytes: usize,
    trailer_bytes: usize,
    max_trailer_bytes: usize,
}

/// Progress report from [`ChunkedDecoder::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Input bytes consumed; bytes after a completed body are left untouched.
    pub consumed: usize,
    /// The last chunk and the trailer section are complete.
    pub done: bool,
}

impl ChunkedDecoder {
    /// A decoder accepting at most `max_body` decoded bytes and
    /// `max_trailer_bytes` bytes of trailer field lines.
    pub fn new(max_body: u64, max_trailer_bytes: usize) -> Self {
        Self {
            state: State::SizeStart,
            size_digits: 0,
            remaining: 0,
            body_len: 0,
            max_body,
            line_ext_bytes: 0,
            total_ext_bytes: 0,
            trailer_bytes: 0,
            max_trailer_bytes,
        }
    }

    /// Whether the whole body, including trailers, has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decoded body bytes announced so far (counts a chunk once its size line is read).
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Consume bytes from `input`, appending decoded body data to `out`.
    ///
    /// Stops right after the final CRLF, so pipelined bytes are not consumed.
    /// After an error, data decoded before it may already be in `out`, and
    /// every later call returns the same error.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Decoded, ChunkError> {
        let mut pos = 0;
        while let Some(rest) = input.get(pos..).filter(|r| !r.is_empty()) {
            match self.state {
                State::Done => break,
                State::Failed(e) => return Err(e),
                State::Data => {
                    // Copy as much of the chunk as we have in one go.
                    let take =
                        usize::try_from(self.remaining).map_or(rest.len(), |r| r.min(rest.len()));
                    out.extend_from_slice(rest.get(..take).unwrap_or_default());
                    pos += take;
                    self.remaining = self.remaining.saturating_sub(take as u64);
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                }
                _ => {
                    let b = rest.first().copied().unwrap_or_default();
                    if let Err(e) = self.step(b) {
                        self.state = State::Failed(e);
                        return Err(e);
                    }
                    pos += 1;
                }
            }
        }
        match self.state {
            State::Failed(e) => Err(e),
            state => Ok(Decoded {
                consumed: pos,
                done: state == State::Done,
            }),
        }
    }

    /// Advances the state machine by one framing byte (never chunk data).
    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        use State::*;
        let is_line_end = matches!(self.state, SizeLf | DataLf | TrailerLf | FinalLf);
        if b == b'\n' && !is_line_end {
            // An LF without its CR: refuse, it is a smuggling vector.
            return Err(ChunkError::InvalidLineEnding);
        }
        let ows = syntax::is_ows(b);
        let tchar = syntax::is_tchar(b);
        self.state = match self.state {
            SizeStart => {
                self.push_digit(b)?;
                Size
            }
            Size => match b {
                b'\r' => SizeLf,
                b';' => self.ext(ExtBeforeName)?,
                _ if ows => self.ext(SizeBws)?,
                _ => {
                    self.push_digit(b)?;
                    Size
                }
            },
            SizeBws => match b {
                b';' => self.ext(ExtBeforeName)?,
                _ if ows => self.ext(SizeBws)?,
                _ => return Err(ChunkError::InvalidChunkSize),
            },
            ExtBeforeName if ows => self.ext(ExtBeforeName)?,
            ExtBeforeName if tchar => self.ext(ExtName)?,
            ExtName | ExtToken | ExtAfterQuoted if b == b'\r' => SizeLf,
            ExtName if tchar => self.ext(ExtName)?,
            ExtName | ExtAfterName if ows => self.ext(ExtAfterName)?,
            ExtName | ExtAfterName if b == b'=' => self.ext(ExtBeforeValue)?,
            ExtBeforeValue if ows => self.ext(ExtBeforeValue)?,
            ExtBeforeValue if tchar => self.ext(ExtToken)?,
            ExtBeforeValue if b == b'"' => self.ext(ExtQuoted)?,
            ExtToken if tchar => self.ext(ExtToken)?,
            ExtToken | ExtAfterQuoted | ExtAfterValue if ows => self.ext(ExtAfterValue)?,
            ExtName | ExtAfterName | ExtToken | ExtAfterQuoted | ExtAfterValue if b == b';' => {
                self.ext(ExtBeforeName)?
            }
            ExtQuoted if b == b'"' => self.ext(ExtAfterQuoted)?,
            ExtQuoted if b == b'\\' => self.ext(ExtQuotedPair)?,
            // qdtext, and the escaped byte of a quoted-pair (HTAB / SP / VCHAR / obs-text)
            ExtQuoted | ExtQuotedPair if syntax::is_field_value_byte(b) => self.ext(ExtQuoted)?,
            ExtBeforeName | ExtName | ExtAfterName | ExtBeforeValue | ExtToken | ExtQuoted
            | ExtQuotedPair | ExtAfterQuoted | ExtAfterValue => {
                return Err(ChunkError::InvalidExtension)
            }
            SizeLf => {
                if b != b'\n' {
                    return Err(ChunkError::InvalidLineEnding);
                }
                self.line_ext_bytes = 0;
                // push_digit already checked this fits within max_body.
                self.body_len = self.body_len.saturating_add(self.remaining);
                if self.remaining == 0 {
                    TrailerStart
                } else {
                    Data
                }
            }
            DataCr if b == b'\r' => DataLf,
            DataLf if b == b'\n' => {
                self.size_digits = 0;
                self.remaining = 0;
                SizeStart
            }
            DataCr | DataLf => return Err(ChunkError::InvalidLineEnding),
            TrailerStart if b == b'\r' => FinalLf,
            TrailerStart | TrailerName if tchar => self.trailer(TrailerName)?,
            TrailerName if b == b':' => self.trailer(TrailerValue)?,
            TrailerValue if b == b'\r' => self.trailer(TrailerLf)?,
            TrailerValue if syntax::is_field_value_byte(b) => self.trailer(TrailerValue)?,
            // Includes obs-fold (a line starting with SP/HTAB) and CTLs.
            TrailerStart | TrailerName | TrailerValue => return Err(ChunkError::InvalidTrailer),
            TrailerLf if b == b'\n' => self.trailer(TrailerStart)?,
            FinalLf if b == b'\n' => Done,
            TrailerLf | FinalLf => return Err(ChunkError::InvalidLineEnding),
            // decode() never steps in these states.
            Data => Data,
            Done => Done,
            Failed(e) => return Err(e),
        };
        Ok(())
    }

    /// Accumulates one hex digit of the chunk size.
    fn push_digit(&mut self, b: u8) -> Result<(), ChunkError> {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(ChunkError::InvalidChunkSize),
        };
        self.size_digits += 1;
        if self.size_digits > MAX_SIZE_DIGITS {
            return Err(ChunkError::ChunkSizeOverflow);
        }
        // At most 15 digits so far, so the shift cannot overflow.
        self.remaining = (self.remaining << 4) | u64::from(digit);
        // More digits only make the size larger, so this is already final.
        if self.remaining > self.max_body.saturating_sub(self.body_len) {
            return Err(ChunkError::TooLarge);
        }
        Ok(())
    }

    /// Counts one chunk-extension byte and moves to `next`.
    fn ext(&mut self, next: State) -> Result<State, ChunkError> {
        self.line_ext_bytes += 1;
        self.total_ext_bytes += 1;
        if self.line_ext_bytes > MAX_EXT_BYTES_PER_LINE
            || self.total_ext_bytes > MAX_EXT_BYTES_TOTAL
        {
            return Err(ChunkError::ExtensionTooLong);
        }
        Ok(next)
    }

    /// Counts one trailer-field byte and moves to `next`.
    fn trailer(&mut self, next: State) -> Result<State, ChunkError> {
        self.trailer_bytes = self.trailer_bytes.saturating_add(1);
        if self.trailer_bytes > self.max_trailer_bytes {
            return Err(ChunkError::TrailersTooLarge);
        }
        Ok(next)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, XorShift};

    const MAX_BODY: u64 = 1 << 20;
    const MAX_TRAILERS: usize = 256;

    /// Feeds `input` in one call.
    fn whole(input: &[u8]) -> (Result<Decoded, ChunkError>, Vec<u8>) {
        let mut d = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
        let mut out = Vec::new();
        let r = d.decode(input, &mut out);
        (r, out)
    }

    /// Feeds `input` one byte per call, stopping when done, and reports the
    /// same shape as [`whole`].
    fn bytewise(input: &[u8]) -> (Result<Decoded, ChunkError>, Vec<u8>) {
        let mut d = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
        let mut out = Vec::new();
        let mut consumed = 0;
        for b in input {
            match d.decode(std::slice::from_ref(b), &mut out) {
                Err(e) => return (Err(e), out),
                Ok(r) => {
                    assert!(r.consumed <= 1);
                    consumed += r.consumed;
                    if r.done {
                        return (
                            Ok(Decoded {
                                consumed,
                                done: true,
                            }),
                            out,
                        );
                    }
                }
            }
        }
        (
            Ok(Decoded {
                consumed,
                done: false,
            }),
            out,
        )
    }

    fn ok(input: &[u8]) -> Vec<u8> {
        let (r, out) = whole(input);
        assert_eq!(
            r,
            Ok(Decoded {
                consumed: input.len(),
                done: true
            }),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        out
    }

    fn err(input: &[u8]) -> ChunkError {
        whole(input).0.unwrap_err()
    }

    #[test]
    fn decodes_simple_body() {
        assert_eq!(ok(b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"), b"Wikipedia");
        assert_eq!(ok(b"0\r\n\r\n"), b"");
        assert_eq!(
            ok(b"A\r\n0123456789\r\na\r\n0123456789\r\n000\r\n\r\n").len(),
            20
        );
        // Pipelined bytes after the body are left alone.
        let (r, out) = whole(b"1\r\nx\r\n0\r\n\r\nGET / HTTP/1.1\r\n");
        assert_eq!(
            r.unwrap(),
            Decoded {
                consumed: 11,
                done: true
            }
        );
        assert_eq!(out, b"x");
    }

    #[test]
    fn incomplete_input_is_not_done() {
        let (r, out) = whole(b"5\r\nhel");
        assert_eq!(
            r.unwrap(),
            Decoded {
                consumed: 6,
                done: false
            }
        );
        assert_eq!(out, b"hel");
        let mut d = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
        let mut out = Vec::new();
        assert!(!d.decode(b"3\r\nab", &mut out).unwrap().done);
        assert!(!d.decode(b"c\r\n0\r\n", &mut out).unwrap().done);
        assert!(d.decode(b"\r\n", &mut out).unwrap().done);
        assert!(d.is_done());
        assert_eq!(d.body_len(), 3);
        assert_eq!(out, b"abc");
        // Once done, nothing more is consumed.
        assert_eq!(
            d.decode(b"more", &mut out).unwrap(),
            Decoded {
                consumed: 0,
                done: true
            }
        );
    }

    #[test]
    fn chunk_size_syntax() {
        assert_eq!(ok(b"0000000000000001\r\nx\r\n0\r\n\r\n"), b"x");
        assert_eq!(err(b"00000000000000001\r\n"), ChunkError::ChunkSizeOverflow);
        let mut d = ChunkedDecoder::new(u64::MAX, 0);
        let e = d.decode(b"fffffffffffffffff\r\n", &mut Vec::new());
        assert_eq!(e.unwrap_err(), ChunkError::ChunkSizeOverflow);
        for bad in [
            &b"\r\n"[..],
            b"x\r\n",
            b"0x5\r\n",
            b"+5\r\n",
            b"-5\r\n",
            b" 5\r\n",
            b"5 \r\n",
            b"5 x\r\n",
            b"5g\r\n",
        ] {
            assert_eq!(
                err(bad),
                ChunkError::InvalidChunkSize,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn chunk_extensions() {
        for good in [
            &b"5;a\r\nhello\r\n0\r\n\r\n"[..],
            b"5;a=b\r\nhello\r\n0\r\n\r\n",
            b"5 \t; a = b ;c\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"q \\\" x;y\"\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"\";b\r\nhello\r\n0;last=1\r\n\r\n",
        ] {
            assert_eq!(ok(good), b"hello", "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"5;\r\n"[..],
            b"5;=b\r\n",
            b"5;a=\r\n",
            b"5;a b\r\n",
            b"5;a=b c\r\n",
            b"5;a \r\n",
            b"5;a=b \r\n",
            b"5;a=\"x\"y\r\n",
            b"5;a=\"x\0\"\r\n",
            b"5;a=\"unterminated\r\n",
            b"5;a@b\r\n",
        ] {
            assert_eq!(
                err(bad),
                ChunkError::InvalidExtension,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn extension_length_is_bounded() {
        let mut line = b"1;a=".to_vec();
        line.resize(MAX_EXT_BYTES_PER_LINE + 1, b'x');
        line.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        assert_eq!(ok(&line), b"x");
        let mut long = b"1;a=".to_vec();
        long.resize(MAX_EXT_BYTES_PER_LINE + 2, b'x');
        assert_eq!(err(&long), ChunkError::ExtensionTooLong);
        // Many lines each under the per-line bound still hit the total bound.
        let mut many = Vec::new();
        for _ in 0..(MAX_EXT_BYTES_TOTAL / 1000 + 1) {
            many.extend_from_slice(b"1;a=");
            many.resize(many.len() + 996, b'x');
            many.extend_from_slice(b"\r\nx\r\n");
        }
        assert_eq!(err(&many), ChunkError::ExtensionTooLong);
    }

    #[test]
    fn crlf_required() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\rhello",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloxx",
            b"5\r\nhello\rx",
            b"5;a\n",
            b"0\r\n\n",
            b"0\r\n\rx",
            b"0\r\nX: y\n\r\n",
            b"0\r\nX: y\rz",
        ] {
            assert_eq!(
                err(bad),
                ChunkError::InvalidLineEnding,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn trailers() {
        assert_eq!(ok(b"1\r\nx\r\n0\r\nX-Sum: abc\r\nEmpty:\r\n\r\n"), b"x");
        for bad in [
            &b"0\r\nBad Name: v\r\n\r\n"[..],
            b"0\r\nX: a\r\n folded\r\n\r\n",
            b"0\r\nX: a\0\r\n\r\n",
            b"0\r\nNoColon\r\n\r\n",
            b"0\r\n: v\r\n\r\n",
        ] {
            assert_eq!(
                err(bad),
                ChunkError::InvalidTrailer,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // "X: 12345\r\n" is 10 bytes of field line.
        let input = b"0\r\nX: 12345\r\n\r\n";
        let mut d = ChunkedDecoder::new(10, 10);
        assert!(d.decode(input, &mut Vec::new()).unwrap().done);
        let mut d = ChunkedDecoder::new(10, 9);
        assert_eq!(
            d.decode(input, &mut Vec::new()).unwrap_err(),
            ChunkError::TrailersTooLarge
        );
        let mut d = ChunkedDecoder::new(10, 0);
        assert!(d.decode(b"0\r\n\r\n", &mut Vec::new()).unwrap().done);
    }

    #[test]
    fn body_limit() {
        let mut d = ChunkedDecoder::new(8, 0);
        assert!(
            d.decode(b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n", &mut Vec::new())
                .unwrap()
                .done
        );
        let mut d = ChunkedDecoder::new(8, 0);
        let e = d.decode(b"3\r\nabc\r\n6\r\n", &mut Vec::new()).unwrap_err();
        assert_eq!(e, ChunkError::TooLarge);
        assert_eq!(e.status(), 413);
        // Rejected from the size line alone, before any data arrives.
        let mut d = ChunkedDecoder::new(16, 0);
        assert_eq!(
            d.decode(b"11", &mut Vec::new()).unwrap_err(),
            ChunkError::TooLarge
        );
        let mut d = ChunkedDecoder::new(u64::MAX, 0);
        assert!(
            !d.decode(b"ffffffffffffffff\r\n", &mut Vec::new())
                .unwrap()
                .done
        );
    }

    #[test]
    fn errors_are_sticky() {
        let mut d = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
        let mut out = Vec::new();
        assert_eq!(
            d.decode(b"z", &mut out).unwrap_err(),
            ChunkError::InvalidChunkSize
        );
        assert_eq!(
            d.decode(b"0\r\n\r\n", &mut out).unwrap_err(),
            ChunkError::InvalidChunkSize
        );
        assert_eq!(
            d.decode(b"", &mut out).unwrap_err(),
            ChunkError::InvalidChunkSize
        );
    }

    #[test]
    fn bytewise_matches_whole() {
        let inputs: [&[u8]; 12] = [
            b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
            b"1;a=\"b\\\"c\" ; d\r\nx\r\n0\r\nT: v\r\n\r\nEXTRA",
            b"10\r\n0123456789abcdef\r\n0\r\n\r\n",
            b"5\r\nhel",
            b"5\r\nhello\n",
            b"g\r\n",
            b"0\r\nBad Name: v\r\n\r\n",
            b"5;a=\"open",
            b"00000000000000001\r\n",
            b"0\r\nX: y\r\n",
            b"3\r\nabc\r\n0\r\n\r",
            b"2 ; x = y\r\nab\r\n0\r\n\r\n",
        ];
        for input in inputs {
            assert_eq!(
                whole(input),
                bytewise(input),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn property_never_panics_and_splits_agree() {
        let seeds: [&[u8]; 4] = [
            b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
            b"1;a=\"b\\\"c\" ; d\r\nx\r\n0\r\nT: v\r\n\r\n",
            b"A;k=v\r\n0123456789\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\nGET",
            b"3\r\nabc\r\n00\r\n\r\n",
        ];
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        let mut completed = 0;
        for i in 0..4000 {
            let input = mutate(&mut rng, seeds[i % seeds.len()]);
            let (r, out) = whole(&input);
            if let Ok(d) = r {
                assert!(d.consumed <= input.len());
                assert!(d.done || d.consumed == input.len());
                assert!(out.len() <= d.consumed);
                completed += usize::from(d.done);
            }
            assert_eq!(
                (r, out),
                bytewise(&input),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
            // A random split point must agree too.
            let at = rng.below(input.len() + 1);
            let mut d = ChunkedDecoder::new(MAX_BODY, MAX_TRAILERS);
            let mut split_out = Vec::new();
            let split = d.decode(&input[..at], &mut split_out).and_then(|first| {
                if first.done {
                    return Ok(first);
                }
                let second = d.decode(&input[at..], &mut split_out)?;
                Ok(Decoded {
                    consumed: first.consumed + second.consumed,
                    done: second.done,
                })
            });
            assert_eq!((split, split_out), whole(&input));
        }
        assert!(completed > 250, "only {completed} completed");
    }
}
