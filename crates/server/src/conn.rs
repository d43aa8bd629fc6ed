//! One client connection from accept to close: the TLS handshake under its
//! timeout, its metrics, then the HTTP loop.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tlsgate_metrics::{HandshakeLabels, ReasonLabel};
use tlsgate_tls::rustls::{HandshakeKind, ProtocolVersion};
use tlsgate_tls::TlsConnection;
use tokio::net::TcpStream;

use crate::flood::HandshakeSlot;
use crate::generation::{Generation, Site};
use crate::http;
use crate::limiter::Permit;
use crate::proxy_protocol::Origin;
use crate::respond::HttpCtx;
use crate::transport::TlsClient;
use crate::Shared;

/// Keeps `connections_open` right however the task ends.
struct OpenGuard<'a>(&'a Shared);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.metrics.connections_open.dec();
    }
}

fn version_name(v: Option<ProtocolVersion>) -> &'static str {
    match v {
        Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "other",
    }
}

/// Serves one accepted connection of listener `listener`.
///
/// An idle keep-alive connection holds little more than this future, so it
/// is kept small: the handshake and the serving each run in a box of their
/// own, made by plain functions, so this future holds two pointers where it
/// would otherwise reserve room for the handshake's state and for every
/// value moved on the way (~10 KiB of 16 per idle connection).
///
/// `destination` is where a balancer's header says the client connected
/// to; the socket's own address is taken (for the PROXY protocol headers
/// sent upstream) only on listeners with a route to a pool that sends them.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    listener: usize,
    sock: TcpStream,
    (peer, destination): (SocketAddr, Option<SocketAddr>),
    (_permit, slot): (Permit, HandshakeSlot),
    accepted: Instant,
) {
    let m = &shared.metrics;
    m.connections_total.inc();
    m.connections_open.inc();
    let _open = OpenGuard(&shared);
    // The generation at accept serves the whole connection, across reloads.
    let gen = shared.current.load_full();
    let Some(site) = gen.sites.get(listener) else {
        return;
    };
    let destination = destination.or_else(|| {
        site.sends_proxy_protocol
            .then(|| sock.local_addr().ok())
            .flatten()
    });
    // TCP_NODELAY comes from the listener (`tlsgate_sys::reuseport_listener`):
    // Linux copies it to accepted sockets, so no setsockopt per connection.
    // From accept: a balancer's connection read its PROXY header first.
    let deadline = tokio::time::Instant::from_std(accepted + gen.config.limits.handshake_timeout);
    let handshake: Pin<Box<dyn Future<Output = Handshake> + Send + '_>> = Box::pin(
        tokio::time::timeout_at(deadline, tlsgate_tls::accept(sock, &site.tls)),
    );
    let serving = after_handshake(
        &shared,
        &gen,
        site,
        listener,
        (peer, destination),
        handshake.await,
        accepted,
    );
    // The handshake is over, however it ended: free its slot.
    drop(slot);
    if let Some(serving) = serving {
        serving.await;
    }
}

/// Serves a connection from a trusted load balancer (`proxy_protocol_from`),
/// whose `permit` holds its place in `max_connections`: its PROXY
/// protocol header names the client, which the limits per source then
/// admit or refuse as any other and which the connection is served as.
/// The header and the handshake share one `handshake_timeout` from accept.
pub(crate) async fn handle_proxied(
    shared: Arc<Shared>,
    listener: usize,
    mut sock: TcpStream,
    balancer: SocketAddr,
    permit: Permit,
    accepted: Instant,
) {
    let wait = shared.current.load().config.limits.handshake_timeout;
    let deadline = tokio::time::Instant::from_std(accepted + wait);
    let read =
        tokio::time::timeout_at(deadline, crate::proxy_protocol::read_header(&mut sock)).await;
    let count = |result: &'static str| {
        shared
            .metrics
            .proxy_protocol_headers
            .get_or_create(&tlsgate_metrics::ResultLabel { result })
            .inc();
    };
    let header = match read {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            count(e.reason());
            if e.balancers_fault() {
                shared
                    .proxy_header_warnings
                    .bad_proxy_header(balancer.ip(), &e);
            }
            tracing::debug!(%balancer, "PROXY protocol header: {e}");
            return;
        }
        Err(_) => {
            count("timeout");
            count_timeout(&shared, "proxy_protocol_header");
            return;
        }
    };
    count(header.version);
    let (peer, destination) = match header.origin {
        Origin::Client {
            source,
            destination,
        } => (source, Some(destination)),
        Origin::Balancer => (balancer, None),
    };
    match crate::worker::admit_source(&shared, permit, peer.ip()) {
        Ok(admitted) => {
            handle(
                shared,
                listener,
                sock,
                (peer, destination),
                admitted,
                accepted,
            )
            .await
        }
        Err(reason) => crate::worker::refuse(&shared, peer.ip(), reason),
    }
}

/// Counts a connection closed by the timeout `reason`.
fn count_timeout(shared: &Shared, reason: &'static str) {
    shared
        .metrics
        .timeouts
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

/// How a handshake under its timeout ended.
type Handshake =
    Result<Result<TlsConnection, tlsgate_tls::HandshakeError>, tokio::time::error::Elapsed>;

/// Counts the handshake's outcome; for a connection that came through,
/// the boxed future that serves it.
fn after_handshake<'a>(
    shared: &'a Shared,
    gen: &'a Generation,
    site: &'a Site,
    listener: usize,
    (peer, destination): (SocketAddr, Option<SocketAddr>),
    handshake: Handshake,
    t0: Instant,
) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>> {
    let m = &shared.metrics;
    let conn = match handshake {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "handshake failed: {e}");
            m.handshake_failures
                .get_or_create(&ReasonLabel { reason: e.reason() })
                .inc();
            return None;
        }
        Err(_) => {
            m.handshake_failures
                .get_or_create(&ReasonLabel { reason: "timeout" })
                .inc();
            count_timeout(shared, "handshake");
            return None;
        }
    };
    m.handshake_seconds.observe(t0.elapsed().as_secs_f64());
    let tls = conn.tls()?;
    let version = version_name(tls.protocol_version());
    m.handshakes
        .get_or_create(&HandshakeLabels {
            version,
            cipher: tls
                .negotiated_cipher_suite()
                .and_then(|s| s.suite().as_str())
                .unwrap_or("unknown"),
            group: tls
                .negotiated_key_exchange_group()
                .and_then(|g| g.name().as_str())
                .unwrap_or("none"),
            resumed: if tls.handshake_kind() == Some(HandshakeKind::Resumed) {
                "true"
            } else {
                "false"
            },
        })
        .inc();
    let h2 = tls.alpn_protocol() == Some(tlsgate_config::Alpn::H2.id().as_bytes());
    let protocol = if h2 { "h2" } else { "http/1.1" };
    m.protocol_connections
        .get_or_create(&tlsgate_metrics::ProtocolLabel { protocol })
        .inc();
    let cx = HttpCtx {
        gen,
        site,
        shared,
        shutdown: shared.shutdown.subscribe(),
        sni: tls.server_name().map(str::to_owned),
        tls_version: Some(version),
        client: tlsgate_tls::ClientIdentity::of(tls),
        // Without SNI, a request without Host goes upstream with the
        // address the client connected to (one getsockname, only then,
        // and only on a listener that proxies).
        proxy: tlsgate_proxy::ClientConn::new(peer, destination)
            .with_server_name(
                tls.server_name().map(str::to_owned),
                (tls.server_name().is_none() && site.routes.has_pools())
                    .then(|| conn.socket().local_addr().ok())
                    .flatten(),
            )
            .passing(
                gen.config
                    .listeners
                    .get(listener)
                    .map(|l| l.pass_client_headers)
                    .unwrap_or_default(),
            ),
    };
    if h2 {
        // HTTP/2 keeps the record layer in user space: h2 owns the byte
        // stream, and sendfile cannot frame DATA.
        return Some(Box::pin(async move {
            let mut conn = conn;
            crate::h2::serve(&mut conn, &cx).await;
        }));
    }
    let offload = gen
        .config
        .listeners
        .get(listener)
        .map(|l| l.offload)
        .unwrap_or_default();
    let client = TlsClient::new(
        conn,
        offload,
        &shared.ktls,
        m,
        gen.config.limits.send_timeout,
    );
    Some(Box::pin(serve_http1(client, cx)))
}

/// Serves an HTTP/1.1 connection after its handshake.
async fn serve_http1(mut client: TlsClient<'_>, mut cx: HttpCtx<'_>) {
    if client.offloads_at_once() && client.offload_now(false).await.is_err() {
        return;
    }
    http::serve(&mut client, &mut cx).await;
    if let Some(reason) = client.conn.ended_by() {
        cx.shared
            .metrics
            .ktls_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}
