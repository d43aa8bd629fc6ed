//! Proxied routes on a client connection: which route a request takes,
//! and the hand-over of a routed request to tlsgate-proxy, whose outcome
//! becomes a response, an access-log note and metrics.

use std::sync::Arc;

use tlsgate_files::DocumentRoot;
use tlsgate_http1::{Method, RequestHead, Version};
use tlsgate_proxy::{Downstream, Outcome, Pool, Request, Target};

use crate::http::{simple, Answered, End, HttpCtx};
use crate::transport::Transport;

/// What the access log says of a proxied request.
pub(crate) struct Proxied {
    /// The server tried last.
    pub server: Option<String>,
    /// Why it failed, if it did.
    pub reason: Option<&'static str>,
}

/// Where a request goes.
pub(crate) enum Routed<'g> {
    /// Static files from this root.
    Root(&'g DocumentRoot),
    /// This pool, with the route's request body limit.
    Pool(&'g Arc<Pool>, u64),
    /// Nowhere: answered with this status. 421 when the host falls under
    /// another client certificate policy than the connection's handshake.
    Refused(u16),
}

/// The route of `head` on the connection's listener (its root without one).
pub(crate) fn route<'g>(cx: &HttpCtx<'g>, head: &RequestHead) -> Routed<'g> {
    route_to(cx, head.host(), head.path())
}

/// The route of a request for `host` (the authority or Host, if any) and
/// `path`, whatever its protocol.
pub(crate) fn route_to<'g>(cx: &HttpCtx<'g>, host: Option<&[u8]>, path: &[u8]) -> Routed<'g> {
    let site = cx.site;
    if let Some(h) = host {
        if !site
            .tls
            .host_fits(cx.sni.as_deref(), tlsgate_http1::host_without_port(h))
        {
            tracing::debug!(peer = %cx.peer(), sni = ?cx.sni, "421: the host is under another client_auth policy");
            return Routed::Refused(421);
        }
    }
    match site.routes.find(host, cx.sni.as_deref(), path) {
        // Its readers could disagree on it (see tlsgate_proxy::route_view).
        Err(_) => Routed::Refused(400),
        Ok(None) => Routed::Root(&site.root),
        Ok(Some(e)) => match &e.target {
            Target::Static(root) => Routed::Root(root),
            Target::Pool(pool) => Routed::Pool(pool, e.max_body_bytes()),
        },
    }
}

/// Whether a configuration was loaded after this connection's: its
/// requests still meet the old pools, so its client is asked to come back.
pub(crate) fn reloaded(cx: &HttpCtx<'_>) -> bool {
    !std::ptr::eq(&**cx.shared.current.load(), cx.gen)
}

/// Counts a proxied request answered with an error of the proxy's
/// (502, 503, 504), whatever the client's protocol.
pub(crate) fn count_refusal(cx: &HttpCtx<'_>, pool: &Pool, status: u16, reason: &'static str) {
    if status >= 500 {
        pool.count_answer(status, reason);
        tracing::debug!(peer = %cx.peer(), pool = %pool.name(), "{status}: {reason}");
    }
}

/// The client connection as tlsgate-proxy sees it.
struct Client<'a, T>(&'a mut T);

impl<T: Transport + Send> Downstream for Client<'_, T> {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).await
    }
    async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all(data).await
    }
    async fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().await
    }
    async fn relay(
        &mut self,
        buf: Option<&mut [u8]>,
        data: &[u8],
    ) -> std::io::Result<tlsgate_proxy::Turn> {
        self.0.relay(buf, data).await
    }
    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.0.close().await
    }
}

/// Forwards a routed request; the answer and whether the connection
/// stays open, or how it ends when a response broke off.
pub(crate) async fn serve<T: Transport + Send>(
    io: &mut T,
    cx: &HttpCtx<'_>,
    head: &RequestHead,
    inbuf: &mut Vec<u8>,
    out: &mut Vec<u8>,
    (pool, max_body, keep_alive): (&Arc<Pool>, u64, bool),
) -> Result<(Answered, Proxied, bool), End> {
    let limits = &cx.gen.config.limits;
    // After a reload this connection still runs on the generation it was
    // accepted under; its client is asked to come back (Connection:
    // close), so that its next requests meet the new pools, as nginx's
    // old workers do with keep-alive connections.
    let keep_alive = keep_alive && !reloaded(cx);
    let req = Request {
        head,
        conn: &cx.proxy,
        client_cert: cx.client.as_ref().map(|c| c.forwarded_header()),
        max_body,
        body_timeout: limits.body_timeout,
        send_timeout: limits.send_timeout,
        keep_alive,
    };
    let t0 = std::time::Instant::now();
    let wall = std::time::SystemTime::now();
    let outcome = tlsgate_proxy::forward(pool, &mut Client(io), inbuf, out, &req).await;
    match outcome {
        Outcome::Relayed {
            status,
            body_bytes,
            server,
            keep_client,
        } => Ok((
            Answered { status, body_bytes },
            Proxied {
                server: Some(server),
                reason: None,
            },
            keep_client,
        )),
        Outcome::Refused {
            status,
            reason,
            server,
            body_done,
        } => {
            count_refusal(cx, pool, status, reason);
            let keep = keep_alive && body_done;
            let body_bytes = simple(
                out,
                cx,
                status,
                keep,
                head.version() == Version::Http10,
                head.method() == &Method::Head,
            );
            Ok((
                Answered { status, body_bytes },
                Proxied {
                    server,
                    reason: Some(reason),
                },
                keep,
            ))
        }
        Outcome::Aborted {
            status,
            body_bytes,
            server,
            reason,
        } => {
            let note = Proxied {
                server: Some(server),
                reason: Some(reason),
            };
            crate::http::log_request(
                cx,
                false,
                Some(head),
                status,
                body_bytes,
                t0,
                wall,
                Some(&note),
            );
            // Without close_notify: the client must not take the
            // truncated body for a complete one.
            Err(End::Abort)
        }
    }
}
