//! The request→response core shared by HTTP/1.1 ([`crate::http`]) and
//! HTTP/2 ([`crate::h2`]): which response a request gets from the document
//! root (methods, redirects, conditionals, ranges), the headers it carries,
//! and the access log line and metrics of each answered request. Framing
//! the response on the wire is each protocol's business, not this one's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tlsgate_files::{
    select, DocumentRoot, FileMeta, Found, LookupError, Preconditions, Selection, StaticFile,
};
use tlsgate_http1::{reason_phrase, with_date, Method};
use tokio::sync::watch;

use crate::access_log::{self, Record};
use crate::generation::{Generation, Site};
use crate::Shared;

/// The request fields the file core's preconditions read, in the order
/// [`preconditions`] takes their values.
pub(crate) const CONDITIONAL_FIELDS: [&str; 6] = [
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "range",
];

/// The core's preconditions from the values of [`CONDITIONAL_FIELDS`]
/// (repeated lines of each joined into one list, RFC 9110 §5.3).
pub(crate) fn preconditions<V: AsRef<[u8]>>(values: &[Option<V>; 6]) -> Preconditions<'_> {
    let [if_match, if_none_match, if_modified_since, if_unmodified_since, if_range, range] =
        values.each_ref().map(|v| v.as_ref().map(AsRef::as_ref));
    Preconditions {
        if_match,
        if_none_match,
        if_modified_since,
        if_unmodified_since,
        if_range,
        range,
    }
}

/// Everything a connection's protocol loop needs to know.
pub(crate) struct HttpCtx<'a> {
    pub gen: &'a Generation,
    pub site: &'a Site,
    pub shared: &'a Shared,
    pub shutdown: watch::Receiver<bool>,
    pub sni: Option<String>,
    pub tls_version: Option<&'static str>,
    /// The verified client certificate's identity (mutual TLS), if any.
    pub client: Option<tlsgate_tls::ClientIdentity>,
    /// The client's address (`peer()`), and what the proxy keeps of this
    /// connection across its requests.
    pub proxy: tlsgate_proxy::ClientConn,
}

impl HttpCtx<'_> {
    /// The client's address: the TCP peer, or the client a balancer's
    /// PROXY protocol header named.
    pub fn peer(&self) -> SocketAddr {
        self.proxy.peer
    }
}

/// A request as the core sees it, whatever protocol carried it.
pub(crate) struct Request<'a> {
    pub method: &'a Method,
    /// The path as sent (percent-encoded), starting with `/`.
    pub path: &'a [u8],
    pub query: Option<&'a [u8]>,
    /// Conditional and range headers.
    pub pre: Preconditions<'a>,
}

/// What a request is answered with.
pub(crate) enum Reply {
    /// A short text body (`404 Not Found\n`), with one extra header.
    Text {
        status: u16,
        extra: Option<(&'static str, Vec<u8>)>,
    },
    /// 304 with the file's validators.
    NotModified { file: Arc<StaticFile> },
    /// 200 or 206: `len` bytes of `file` from `start`.
    File {
        status: u16,
        file: Arc<StaticFile>,
        start: u64,
        len: u64,
    },
}

impl Reply {
    /// A text response without extra headers.
    pub fn text(status: u16) -> Reply {
        Reply::Text {
            status,
            extra: None,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Reply::Text { status, .. } | Reply::File { status, .. } => *status,
            Reply::NotModified { .. } => 304,
        }
    }

    /// Length of the body a GET gets (HEAD gets the same headers, no body).
    pub fn body_len(&self) -> u64 {
        match self {
            Reply::Text { status, .. } => text_body_len(*status),
            Reply::NotModified { .. } => 0,
            Reply::File { len, .. } => *len,
        }
    }

    /// The text body of a [`Reply::Text`].
    pub fn write_text_body(&self, out: &mut Vec<u8>) {
        if let Reply::Text { status, .. } = self {
            out.extend_from_slice(status.to_string().as_bytes());
            out.push(b' ');
            out.extend_from_slice(reason_phrase(*status).as_bytes());
            out.push(b'\n');
        }
    }

    /// Every response header, in order (Date and Server first), through
    /// `put(name, value)`; names in their HTTP/1.1 spelling.
    pub fn headers(&self, gen: &Generation, mut put: impl FnMut(&'static str, &[u8])) {
        with_date(|d| put("Date", d));
        if let Some(server) = &gen.config.server_header {
            put("Server", server.as_bytes());
        }
        let validators = |put: &mut dyn FnMut(&'static str, &[u8]), meta: &FileMeta| {
            put("Last-Modified", meta.last_modified_header().as_bytes());
            put("ETag", meta.etag.as_bytes());
        };
        match self {
            Reply::Text { status, extra } => {
                if let Some((name, value)) = extra {
                    put(name, value);
                }
                put("Content-Type", b"text/plain; charset=utf-8");
                put_len(&mut put, text_body_len(*status));
            }
            Reply::NotModified { file } => validators(&mut put, &file.meta),
            Reply::File {
                status,
                file,
                start,
                len,
            } => {
                let meta = &file.meta;
                put("Content-Type", meta.content_type.as_bytes());
                put_len(&mut put, *len);
                validators(&mut put, meta);
                put("Accept-Ranges", b"bytes");
                if *status == 206 {
                    let range = format!("bytes {}-{}/{}", start, start + len - 1, meta.len);
                    put("Content-Range", range.as_bytes());
                }
            }
        }
    }
}

fn put_len(put: &mut impl FnMut(&'static str, &[u8]), len: u64) {
    put("Content-Length", len.to_string().as_bytes());
}

/// `"404 Not Found\n"` and the like.
fn text_body_len(status: u16) -> u64 {
    (3 + 1 + reason_phrase(status).len() + 1) as u64
}

/// Answers one request from the document root: GET and HEAD only (other
/// known methods 405 with `Allow`, unknown ones 501), redirects for
/// directories, then conditionals and a single range (RFC 9110 §13, §14).
pub(crate) fn decide(cx: &HttpCtx<'_>, root: &DocumentRoot, req: &Request<'_>) -> Reply {
    match req.method {
        Method::Get | Method::Head => {}
        Method::Other(_) => return Reply::text(501),
        _ => {
            return Reply::Text {
                status: 405,
                extra: Some(("Allow", b"GET, HEAD".to_vec())),
            }
        }
    }
    let found = match root.lookup(req.path) {
        Ok(Found::File(f)) => f,
        Ok(Found::Redirect(location)) => {
            let mut loc = location.into_bytes();
            if let Some(q) = req.query {
                loc.push(b'?');
                loc.extend_from_slice(q);
            }
            return Reply::Text {
                status: 301,
                extra: Some(("Location", loc)),
            };
        }
        Err(e) => {
            let status = e.status();
            if let LookupError::NoDescriptors(_) = e {
                cx.shared.descriptor_warnings.out_of_descriptors(&e);
                return Reply::Text {
                    status,
                    extra: Some(("Retry-After", b"1".to_vec())),
                };
            }
            if status >= 500 {
                tracing::warn!(peer = %cx.peer(), "cannot serve {:?}: {e}", String::from_utf8_lossy(req.path));
            }
            return Reply::text(status);
        }
    };
    let meta = &found.meta;
    match select(&req.pre, meta, true) {
        Selection::Full => Reply::File {
            status: 200,
            start: 0,
            len: meta.len,
            file: found,
        },
        Selection::Partial {
            start,
            end_inclusive,
        } => Reply::File {
            status: 206,
            file: found,
            start,
            len: end_inclusive - start + 1,
        },
        Selection::NotModified => Reply::NotModified { file: found },
        Selection::PreconditionFailed => Reply::text(412),
        Selection::Unsatisfiable => Reply::Text {
            status: 416,
            extra: Some((
                "Content-Range",
                format!("bytes */{}", meta.len).into_bytes(),
            )),
        },
    }
}

/// What the access log says about a request (`-` where unknown).
pub(crate) struct Logged<'a> {
    pub method: &'a str,
    pub target: &'a [u8],
    /// "HTTP/1.0", "HTTP/1.1", "HTTP/2.0" or "-".
    pub version: &'a str,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
    /// The upstream server of a proxied request, if one was tried.
    pub upstream: Option<&'a str>,
    /// Why a proxied request failed, if it did.
    pub upstream_error: Option<&'a str>,
}

impl Logged<'_> {
    /// A request whose head could not be read.
    pub const UNREAD: Logged<'static> = Logged {
        method: "-",
        target: b"-",
        version: "-",
        referer: None,
        user_agent: None,
        upstream: None,
        upstream_error: None,
    };
}

/// A request's answer in the metrics (by `protocol`) and the access log.
#[allow(clippy::too_many_arguments)]
pub(crate) fn log_request(
    cx: &HttpCtx<'_>,
    protocol: &'static str,
    ktls: bool,
    req: &Logged<'_>,
    status: u16,
    body_bytes: u64,
    t0: Instant,
    wall: SystemTime,
) {
    let m = &cx.shared.metrics;
    m.count_status(protocol, status);
    let elapsed = t0.elapsed();
    m.request_seconds.observe(elapsed.as_secs_f64());
    // The process's format, not the connection's generation's: it follows
    // the sink, which a reload switches for every connection at once.
    let Some(format) = cx.shared.access_log.format() else {
        return;
    };
    let record = Record {
        remote: cx.peer().ip(),
        time: wall,
        method: req.method,
        target: req.target,
        version: req.version,
        status,
        body_bytes,
        referer: req.referer,
        user_agent: req.user_agent,
        duration: elapsed,
        sni: cx.sni.as_deref(),
        tls_version: cx.tls_version,
        ktls,
        client: cx.client.as_ref(),
        upstream: req.upstream,
        upstream_error: req.upstream_error,
    };
    if !cx
        .shared
        .access_log
        .log(access_log::format(format, &record))
    {
        m.access_log_dropped.inc();
    }
}
