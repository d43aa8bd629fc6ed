//! The operator's view of refused connections: a limit that closes
//! connections before their handshake is invisible to the client (it sees
//! a closed connection), so a load balancer, a proxy or a benchmark client
//! cut off by a per-source limit would fail without a word. The metric
//! counts every refusal; this says, at most once per interval, which
//! source hit which `[limits]` key and how to raise it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// At most one warning per this long, whatever the refusal rate (a flood
/// must not flood the log).
pub const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Counts refusals and warns about them, rate-limited; shared by all
/// workers.
#[derive(Debug)]
pub struct RefusalWarnings {
    start: Instant,
    /// Milliseconds since `start` before which no warning is written.
    next_ms: AtomicU64,
    /// Refusals since the last warning.
    since: AtomicU64,
}

impl Default for RefusalWarnings {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            next_ms: AtomicU64::new(0),
            since: AtomicU64::new(0),
        }
    }
}

impl RefusalWarnings {
    /// Notes a connection from `source` refused by the limit `key` and
    /// warns when the interval allows; returns the refusals the warning
    /// covered, `None` when it stayed silent.
    pub fn refused(&self, source: IpAddr, key: &'static str) -> Option<u64> {
        self.since.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(WARNING_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if now < next
            || self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return None;
        }
        let n = self.since.swap(0, Ordering::Relaxed);
        tracing::warn!(
            source = %source,
            limit = key,
            refused = n,
            "connections refused before their handshake by [limits] {key} ({n} since the last such warning, \
             this one from {source}); if that source is a proxy, a load balancer or a benchmark client, \
             raise {key} in [limits] or set it to 0 (off): see docs/config.md"
        );
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_per_interval_and_counts_what_it_skipped() {
        let w = RefusalWarnings::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(w.refused(ip, "handshake_rate_per_source"), Some(1));
        for _ in 0..99 {
            assert_eq!(w.refused(ip, "handshake_rate_per_source"), None);
        }
        // The next interval's warning covers the 99 skipped and itself.
        w.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(w.refused(ip, "max_connections_per_ip"), Some(100));
        assert_eq!(w.refused(ip, "max_connections_per_ip"), None);
    }
}
