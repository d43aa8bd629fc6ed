//! `[http2]` and the listeners' `alpn`: validation of the HTTP/2 limits
//! into [`Http2`] and of the protocols offered into [`Alpn`] lists. What
//! the limits do is the server's business (docs/config.md says it too).

use std::time::Duration;

use crate::file::Http2Section;
use crate::validate::Checker;
use crate::ConfigError;

/// An application protocol offered in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 over TLS (RFC 9113), `h2`.
    H2,
    /// HTTP/1.1, `http/1.1`.
    Http11,
}

impl Alpn {
    /// The protocol's ALPN identifier (also its name in the config file).
    pub fn id(self) -> &'static str {
        match self {
            Self::H2 => "h2",
            Self::Http11 => "http/1.1",
        }
    }

    /// The default list, in the server's order of preference.
    pub fn defaults() -> Vec<Alpn> {
        vec![Self::H2, Self::Http11]
    }
}

/// A per-connection token bucket: `per_second` tokens added each second,
/// at most `burst` kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRate {
    /// Refill rate (at least 1).
    pub per_second: u32,
    /// Bucket size (at least 1).
    pub burst: u32,
}

/// The validated `[http2]` table (see [`Http2Section`] for meanings).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each field mirrors the documented file key of the same name.
pub struct Http2 {
    pub max_concurrent_streams: u32,
    pub initial_window_size: u32,
    pub initial_connection_window_size: u32,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
    pub max_header_frames: u32,
    pub max_send_buffer_size: u32,
    pub max_connection_send_buffer: u32,
    pub max_worker_send_buffer: u64,
    pub max_pending_accept_reset_streams: usize,
    pub max_local_error_reset_streams: usize,
    /// Streams the client may reset (RST_STREAM), per connection.
    pub resets: FrameRate,
    /// PING, SETTINGS, PRIORITY, WINDOW_UPDATE and empty DATA frames.
    pub control_frames: FrameRate,
    pub idle_timeout: Duration,
    /// Streams of one connection in flight to upstream pools at once.
    pub max_proxied_streams: u32,
}

/// RFC 9113 §6.5.2: the largest window a peer may announce.
const MAX_WINDOW: u32 = (1 << 31) - 1;

pub(crate) fn validate(c: &Checker<'_>, s: &Http2Section) -> Result<Http2, ConfigError> {
    let rate = |key: &str, per_second: u32, burst_key: &str, burst: u32| {
        Ok::<_, ConfigError>(FrameRate {
            per_second: c.within(&format!("http2.{key}"), per_second, 1, 10_000_000)?,
            burst: c.within(&format!("http2.{burst_key}"), burst, 1, 10_000_000)?,
        })
    };
    let idle_timeout = c.positive("http2.idle_timeout", s.idle_timeout)?;
    let h = Http2 {
        max_concurrent_streams: c.within(
            "http2.max_concurrent_streams",
            s.max_concurrent_streams,
            1,
            10_000,
        )?,
        // Below 1 KiB a window costs a WINDOW_UPDATE every few frames.
        initial_window_size: c.within(
            "http2.initial_window_size",
            s.initial_window_size,
            1024,
            MAX_WINDOW,
        )?,
        initial_connection_window_size: c.within(
            "http2.initial_connection_window_size",
            s.initial_connection_window_size,
            65_535,
            MAX_WINDOW,
        )?,
        // RFC 9113 §6.5.2: from 2^14 to 2^24 - 1.
        max_frame_size: c.within("http2.max_frame_size", s.max_frame_size, 16_384, 16_777_215)?,
        max_header_list_size: c.within(
            "http2.max_header_list_size",
            s.max_header_list_size,
            1024,
            1 << 20,
        )?,
        max_header_frames: c.within("http2.max_header_frames", s.max_header_frames, 1, 1000)?,
        max_send_buffer_size: c.within(
            "http2.max_send_buffer_size",
            s.max_send_buffer_size,
            16_384,
            16 << 20,
        )?,
        // At least a record's worth: one read must fit.
        max_connection_send_buffer: c.within(
            "http2.max_connection_send_buffer",
            s.max_connection_send_buffer,
            16_384,
            1 << 30,
        )?,
        max_worker_send_buffer: c.within(
            "http2.max_worker_send_buffer",
            s.max_worker_send_buffer,
            16_384,
            1 << 40,
        )?,
        max_pending_accept_reset_streams: c.within(
            "http2.max_pending_accept_reset_streams",
            s.max_pending_accept_reset_streams,
            1,
            100_000,
        )?,
        max_local_error_reset_streams: c.within(
            "http2.max_local_error_reset_streams",
            s.max_local_error_reset_streams,
            1,
            100_000,
        )?,
        resets: rate(
            "resets_per_second",
            s.resets_per_second,
            "reset_burst",
            s.reset_burst,
        )?,
        control_frames: rate(
            "control_frames_per_second",
            s.control_frames_per_second,
            "control_frame_burst",
            s.control_frame_burst,
        )?,
        idle_timeout,
        max_proxied_streams: c.within(
            "http2.max_proxied_streams",
            s.max_proxied_streams,
            1,
            10_000,
        )?,
    };
    // A header list at the size limit, sent in frames of the largest size
    // allowed, must not look like a CONTINUATION flood.
    let needed = h.max_header_list_size.div_ceil(h.max_frame_size);
    if h.max_header_frames < needed {
        return Err(c.err(
            "http2.max_header_frames",
            format!(
                "expected at least {needed}: a header list of max_header_list_size = {} bytes \
                 takes that many frames of max_frame_size = {} bytes",
                h.max_header_list_size, h.max_frame_size
            ),
        ));
    }
    if h.max_worker_send_buffer < u64::from(h.max_connection_send_buffer) {
        return Err(c.err(
            "http2.max_worker_send_buffer",
            format!(
                "expected at least max_connection_send_buffer = {}: a worker must hold what \
                 one connection may",
                h.max_connection_send_buffer
            ),
        ));
    }
    Ok(h)
}

/// A listener's `alpn`: known protocols, no repeats, at least one.
pub(crate) fn validate_alpn(
    c: &Checker<'_>,
    key: &str,
    list: Option<&[String]>,
) -> Result<Vec<Alpn>, ConfigError> {
    let Some(list) = list else {
        return Ok(Alpn::defaults());
    };
    let mut out = Vec::with_capacity(list.len());
    for name in list {
        let p = match name.as_str() {
            "h2" => Alpn::H2,
            "http/1.1" => Alpn::Http11,
            other => {
                return Err(c.err(
                    key,
                    format!(
                        "unknown protocol {other:?}; expected \"h2\" and/or \"http/1.1\" (HTTP/2 is offered over TLS only, no \"h2c\")"
                    ),
                ))
            }
        };
        if out.contains(&p) {
            return Err(c.err(key, format!("{name:?} is listed twice")));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(c.err(
            key,
            "expected at least one protocol, e.g. [\"h2\", \"http/1.1\"]",
        ));
    }
    Ok(out)
}
