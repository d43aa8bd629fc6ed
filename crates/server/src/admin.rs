//! The admin listener: plain HTTP on a local address, `GET /metrics`
//! (Prometheus/OpenMetrics text) and `GET /healthz`. One request per
//! connection, bounded in time and concurrency.

use std::sync::Arc;
use std::time::Duration;

use tlsgate_http1::{
    end_head, parse_request, write_header, write_header_u64, write_status_line, Limits, Method,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::keys::KeyState;
use crate::Shared;

/// Admin connections open at once, idle ones included; more wait in the
/// backlog. Each holds a small buffer for at most [`HEAD_TIMEOUT`] before
/// its request is read.
const MAX_CONNECTIONS: usize = 256;
/// Requests answered at once (rendering the metrics is the work).
const MAX_CONCURRENT: usize = 32;
/// How long a client has to send its request head: a probe sends it at
/// once, and sockets that send nothing must not keep probes waiting.
const HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// Deadline for an answer, from the end of its request head.
const DEADLINE: Duration = Duration::from_secs(10);

/// Serves the admin listener until the task is dropped.
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let answering = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                if let Some(pause) = crate::worker::accept_failed(&shared, &e) {
                    tokio::time::sleep(pause).await;
                }
                continue;
            }
        };
        let shared = shared.clone();
        let answering = answering.clone();
        tokio::spawn(async move {
            let _ = handle(&shared, sock, &answering).await;
            drop(permit);
        });
    }
}

async fn handle(
    shared: &Shared,
    mut sock: TcpStream,
    answering: &Semaphore,
) -> std::io::Result<()> {
    let Ok(head) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut sock)).await else {
        return Ok(());
    };
    let head = match head? {
        Head::Request(h) => Some(h),
        Head::Malformed => None,
        Head::Gone => return Ok(()),
    };
    // A slot per request being answered, not per connection.
    let Ok(Ok(_slot)) = tokio::time::timeout(DEADLINE, answering.acquire()).await else {
        return Ok(());
    };
    let _ = tokio::time::timeout(DEADLINE, answer(shared, &mut sock, head.as_ref())).await;
    Ok(())
}

/// What a client sent before its request head ended.
enum Head {
    Request(tlsgate_http1::RequestHead),
    /// Not HTTP/1.x: answered 400.
    Malformed,
    /// The client left first.
    Gone,
}

async fn read_head(sock: &mut TcpStream) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let limits = Limits::default();
    loop {
        match parse_request(&buf, &limits) {
            Ok(Some(h)) => return Ok(Head::Request(h)),
            Ok(None) => {}
            Err(_) => return Ok(Head::Malformed),
        }
        let mut chunk = [0u8; 2048];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Gone);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

async fn answer(
    shared: &Shared,
    sock: &mut TcpStream,
    head: Option<&tlsgate_http1::RequestHead>,
) -> std::io::Result<()> {
    let (status, content_type, body): (u16, &str, String) = match head {
        None => (400, "text/plain", "bad request\n".into()),
        Some(h) if !matches!(h.method(), Method::Get | Method::Head) => {
            (405, "text/plain", "only GET and HEAD\n".into())
        }
        Some(h) => match h.path() {
            b"/metrics" => {
                shared.handshakes.export(&shared.metrics);
                export_kernel_tls(&shared.metrics);
                (
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    shared.metrics.render(),
                )
            }
            b"/healthz" if *shared.shutdown.borrow() => {
                (503, "text/plain", "shutting down\n".into())
            }
            b"/healthz" => match shared.key_state.get() {
                KeyState::Up => (200, "text/plain", "ok\n".into()),
                // Every full handshake fails meanwhile: out of the pool.
                KeyState::Down => (503, "text/plain", "key process down\n".into()),
                KeyState::Hung => (
                    503,
                    "text/plain",
                    "key process hung (being restarted)\n".into(),
                ),
            },
            _ => (
                404,
                "text/plain",
                "not found; try /metrics or /healthz\n".into(),
            ),
        },
    };
    let mut out = Vec::with_capacity(body.len() + 256);
    write_status_line(&mut out, status);
    write_header(&mut out, "Content-Type", content_type.as_bytes());
    write_header_u64(&mut out, "Content-Length", body.len() as u64);
    write_header(&mut out, "Connection", b"close");
    end_head(&mut out);
    if !head.as_ref().is_some_and(|h| h.method() == &Method::Head) {
        out.extend_from_slice(body.as_bytes());
    }
    sock.write_all(&out).await?;
    sock.shutdown().await
}

/// Copies the kernel's kTLS counters (`/proc/net/tls_stat`) into the
/// metrics: the proof that the kernel did the work, and where its TLS
/// device offload (a NIC's) shows (`TlsTxDevice`, `TlsRxDevice`).
fn export_kernel_tls(m: &tlsgate_metrics::Metrics) {
    if let Ok(Some(counters)) = tlsgate_sys::ktls::read_stat() {
        for (counter, value) in counters {
            m.kernel_tls
                .get_or_create(&tlsgate_metrics::CounterLabel {
                    counter: counter.into(),
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }
}
