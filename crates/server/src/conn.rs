//! One client connection from accept to close: the TLS handshake under its
//! timeout, its metrics, then the HTTP loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tlsgate_metrics::{HandshakeLabels, ReasonLabel};
use tlsgate_tls::rustls::{HandshakeKind, ProtocolVersion};
use tokio::net::TcpStream;

use crate::flood::HandshakeSlot;
use crate::http;
use crate::limiter::Permit;
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
pub(crate) async fn handle(
    shared: Arc<Shared>,
    listener: usize,
    sock: TcpStream,
    peer: SocketAddr,
    _permit: Permit,
    slot: HandshakeSlot,
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
    // TCP_NODELAY comes from the listener (`tlsgate_sys::reuseport_listener`):
    // Linux copies it to accepted sockets, so no setsockopt per connection.
    let t0 = Instant::now();
    let handshake = tokio::time::timeout(
        gen.config.limits.handshake_timeout,
        tlsgate_tls::accept(sock, &site.tls),
    )
    .await;
    // The handshake is over, however it ended: free its slot.
    drop(slot);
    let conn = match handshake {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "handshake failed: {e}");
            m.handshake_failures
                .get_or_create(&ReasonLabel { reason: e.reason() })
                .inc();
            return;
        }
        Err(_) => {
            m.handshake_failures
                .get_or_create(&ReasonLabel { reason: "timeout" })
                .inc();
            m.timeouts
                .get_or_create(&ReasonLabel {
                    reason: "handshake",
                })
                .inc();
            return;
        }
    };
    m.handshake_seconds.observe(t0.elapsed().as_secs_f64());
    let Some(tls) = conn.tls() else {
        return;
    };
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
    let mut cx = HttpCtx {
        gen: &gen,
        site,
        shared: &shared,
        peer,
        shutdown: shared.shutdown.subscribe(),
        sni: tls.server_name().map(str::to_owned),
        tls_version: Some(version),
        client: tlsgate_tls::ClientIdentity::of(tls),
    };
    if h2 {
        // HTTP/2 keeps the record layer in user space: h2 owns the byte
        // stream, and sendfile cannot frame DATA.
        let mut conn = conn;
        crate::h2::serve(&mut conn, &cx).await;
        return;
    }
    let offload = gen
        .config
        .listeners
        .get(listener)
        .map(|l| l.offload)
        .unwrap_or_default();
    let mut client = TlsClient::new(
        conn,
        offload,
        &shared.ktls,
        m,
        gen.config.limits.send_timeout,
    );
    if client.offloads_at_once() && client.offload_now(false).await.is_err() {
        return;
    }
    http::serve(&mut client, &mut cx).await;
    if let Some(reason) = client.conn.ended_by() {
        m.ktls_closed.get_or_create(&ReasonLabel { reason }).inc();
    }
}
