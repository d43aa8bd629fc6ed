//! Server host names resolved again while running, every pool's
//! `resolve_interval`: a server whose name now points elsewhere (a
//! replaced VM, a Kubernetes Service behind a changed record) gets its new
//! connections there, and its idle ones to the old address are let go. A
//! failed lookup keeps the last address. Like the health checks, this
//! runs on a thread of its own per generation holding weak references, so
//! it ends with the pools, or as soon as a reload retires them.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::pool::Pool;

/// Longest wait for one lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn start(pools: &[Arc<Pool>]) -> std::io::Result<()> {
    let targets: Vec<Weak<Pool>> = pools
        .iter()
        .filter(|p| !p.cfg.resolve_interval.is_zero() && p.cfg.servers.iter().any(|s| s.named))
        .map(Arc::downgrade)
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    crate::background::run("upstream-dns", targets.into_iter().map(pool_loop).collect())
}

async fn pool_loop(pool: Weak<Pool>) {
    let Some(mut retired) = pool.upgrade().map(|p| p.retirement()) else {
        return;
    };
    loop {
        let Some(interval) = pool.upgrade().map(|p| p.cfg.resolve_interval) else {
            return;
        };
        // A reload that replaces the pool ends the wait, and the lookups.
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = retired.changed() => return,
        }
        let Some(p) = pool.upgrade() else { return };
        if p.is_retired() {
            return;
        }
        for (i, s) in p.servers.iter().enumerate().filter(|(_, s)| s.cfg.named) {
            let current = s.addr();
            let found =
                tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host(&s.cfg.address)).await;
            let result = match found {
                Ok(Ok(addrs)) => match pick(addrs.collect(), current) {
                    Some(addr) if p.readdress(i, addr) => "changed",
                    Some(_) => "unchanged",
                    None => {
                        tracing::warn!(pool = %p.cfg.name, server = %s.cfg.address, "upstream server name resolves to no address; keeping {current}");
                        "failed"
                    }
                },
                Ok(Err(e)) => {
                    tracing::warn!(pool = %p.cfg.name, server = %s.cfg.address, "cannot resolve the upstream server's name ({e}); keeping {current}");
                    "failed"
                }
                Err(_) => {
                    tracing::warn!(pool = %p.cfg.name, server = %s.cfg.address, "resolving the upstream server's name took over {LOOKUP_TIMEOUT:?}; keeping {current}");
                    "failed"
                }
            };
            s.series.count_resolution(result);
        }
    }
}

/// The address to use of those a name resolves to: the current one while
/// it is among them (a name with several addresses does not make the
/// server hop between them), else the first.
fn pick(addrs: Vec<SocketAddr>, current: SocketAddr) -> Option<SocketAddr> {
    if addrs.contains(&current) {
        return Some(current);
    }
    addrs.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_address_stays_while_the_name_still_has_it() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap_or_else(|_| unreachable!());
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(pick(vec![a, b], b), Some(b));
        assert_eq!(pick(vec![a], b), Some(a));
        assert_eq!(pick(vec![], b), None);
    }
}
