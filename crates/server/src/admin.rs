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

use crate::Shared;

/// Admin connections served at once; more wait in the backlog.
const MAX_CONCURRENT: usize = 32;
/// Whole-request deadline for an admin client.
const DEADLINE: Duration = Duration::from_secs(10);

/// Serves the admin listener until the task is dropped.
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DEADLINE, handle(&shared, sock)).await;
            drop(permit);
        });
    }
}

async fn handle(shared: &Shared, mut sock: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let limits = Limits::default();
    let head = loop {
        match parse_request(&buf, &limits) {
            Ok(Some(h)) => break Some(h),
            Ok(None) => {}
            Err(_) => break None,
        }
        let mut chunk = [0u8; 2048];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    let (status, content_type, body): (u16, &str, String) = match &head {
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
            b"/healthz" => (200, "text/plain", "ok\n".into()),
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
                .get_or_create(&tlsgate_metrics::CounterLabel { counter })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }
}
