//! Active health checks: per server, a GET of the configured path every
//! `interval`; `fall` failures in a row take it out of service, `rise`
//! successes bring it back. They run on a thread of their own per
//! generation, holding only weak references, so they end with the pools,
//! or as soon as a reload retires them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tlsgate_http1::parse_response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::pool::Pool;

pub(crate) fn start(pools: &[Arc<Pool>]) -> std::io::Result<()> {
    let targets: Vec<(Weak<Pool>, usize)> = pools
        .iter()
        .filter(|p| p.cfg.health_check.is_some())
        .flat_map(|p| (0..p.servers.len()).map(move |i| (Arc::downgrade(p), i)))
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    crate::background::run(
        "health-checks",
        targets
            .into_iter()
            .map(|(pool, i)| check_loop(pool, i))
            .collect(),
    )
}

async fn check_loop(pool: Weak<Pool>, i: usize) {
    let (mut ok_run, mut bad_run) = (0u32, 0u32);
    let Some(mut retired) = pool.upgrade().map(|p| p.retirement()) else {
        return;
    };
    loop {
        let Some(p) = pool.upgrade() else { return };
        if p.is_retired() {
            return;
        }
        let Some(hc) = p.cfg.health_check.clone() else {
            return;
        };
        let good = check_once(&p, i).await;
        let Some(s) = p.servers.get(i) else { return };
        let was = s.check_ok.load(Ordering::Relaxed);
        if good {
            ok_run += 1;
            bad_run = 0;
            // A passing check ends a passive mark, as Envoy's outlier
            // detection does by default.
            s.clear_mark();
            if !was && ok_run >= hc.rise {
                s.check_ok.store(true, Ordering::Relaxed);
                tracing::info!(pool = %p.cfg.name, server = %s.cfg.address, "upstream server back in service (health check)");
            }
        } else {
            bad_run += 1;
            ok_run = 0;
            if was && bad_run >= hc.fall {
                s.check_ok.store(false, Ordering::Relaxed);
                s.outages.record();
                tracing::warn!(pool = %p.cfg.name, server = %s.cfg.address, "upstream server out of service: {} health checks failed", bad_run);
            }
        }
        p.update_health_gauge(i);
        drop(p);
        // A reload that replaces the pool ends the wait, and the checks.
        tokio::select! {
            () = tokio::time::sleep(hc.interval) => {}
            _ = retired.changed() => return,
        }
    }
}

/// One check: a fresh connection, `GET path`, a status from the list.
async fn check_once(p: &Pool, i: usize) -> bool {
    let (Some(hc), Some(s)) = (&p.cfg.health_check, p.servers.get(i)) else {
        return false;
    };
    let host = hc.host.clone().unwrap_or_else(|| s.cfg.address.clone());
    let exchange = async {
        let mut conn = p.open(i, p.own_header().as_deref()).await.ok()?;
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tlsgate-health-check\r\nConnection: close\r\n\r\n",
            hc.path
        );
        conn.stream.write_all(req.as_bytes()).await.ok()?;
        conn.stream.flush().await.ok()?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(head) = parse_response(&buf, 16 * 1024, 100, false).ok()? {
                return Some(head.status());
            }
            let n = conn.stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        }
    };
    match tokio::time::timeout(hc.timeout, exchange).await {
        Ok(Some(status)) if hc.expect_status.is_empty() => (200..400).contains(&status),
        Ok(Some(status)) => hc.expect_status.contains(&status),
        _ => false,
    }
}
