//! The operator's view of refused connections: a limit that closes
//! connections before their handshake is invisible to the client (it sees
//! a closed connection), so a load balancer, a proxy or a benchmark client
//! cut off by a per-source limit would fail without a word. The metric
//! counts every refusal; this says, at most once per interval, which
//! source hit which `[limits]` key and how to raise it. The same, in an
//! instance of its own, for connections from a trusted load balancer
//! closed for their PROXY protocol header: a balancer that does not send
//! one would otherwise fail every connection silently.

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
        let n = self.due()?;
        tracing::warn!(
            source = %source,
            limit = key,
            refused = n,
            "connections refused before their handshake by [limits] {key}, this one from {source} \
             ({n} refused by any limit since the last such warning); {}: see docs/config.md",
            advice(key)
        );
        Some(n)
    }

    /// Notes a connection from the trusted balancer `source` closed for
    /// its PROXY protocol header, and warns when the interval allows.
    pub fn bad_proxy_header(&self, source: IpAddr, why: &impl std::fmt::Display) -> Option<u64> {
        let n = self.due()?;
        tracing::warn!(
            source = %source,
            refused = n,
            "connection from {source}, listed in proxy_protocol_from, closed: {why} \
             ({n} closed for their PROXY protocol header since the last such warning); \
             a source listed there must begin every connection with a v1 or v2 header: see docs/config.md"
        );
        Some(n)
    }

    /// Notes a request answered 503 because opening its file found no
    /// descriptor free, and warns when the interval allows (one line per
    /// request would add log writes to an overload).
    pub fn out_of_descriptors(&self, why: &impl std::fmt::Display) -> Option<u64> {
        let n = self.due()?;
        tracing::warn!(
            refused = n,
            "request for a file answered 503: {why} ({n} since the last such warning); \
             lower [limits] max_connections or [files] open_file_cache, or raise RLIMIT_NOFILE: \
             see docs/config.md"
        );
        Some(n)
    }

    /// Notes an accept() that failed and paused its listener, and warns
    /// when the interval allows: the error repeats every pause for as
    /// long as the process is out of descriptors or memory.
    pub fn accept_paused(&self, why: &impl std::fmt::Display) -> Option<u64> {
        let n = self.due()?;
        tracing::warn!(
            failed = n,
            "accept: {why}; new connections wait in the listen backlog, each listener \
             trying again every 100 ms ({n} failed accepts since the last such warning); \
             lower [limits] max_connections or [files] open_file_cache, or raise RLIMIT_NOFILE: \
             see docs/config.md"
        );
        Some(n)
    }

    /// Counts one; `Some(n)` when a warning is due now, covering `n`.
    fn due(&self) -> Option<u64> {
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
        Some(self.since.swap(0, Ordering::Relaxed))
    }
}

/// How to let more through, as the key allows (some take 0 for off,
/// some count the whole server rather than one source).
fn advice(key: &str) -> &'static str {
    match key {
        "handshake_rate_per_source" | "max_handshakes_per_source" => {
            "if that source is a proxy, a load balancer or a benchmark client, raise the key or set it to 0 (off), or list a balancer that sends PROXY protocol headers in the listener's proxy_protocol_from"
        }
        "max_connections_per_ip" => {
            "if that source is a proxy, a load balancer or a benchmark client, raise the key (an IPv4 address or IPv6 /64 is one source, see source_prefix_v4/_v6), or list a balancer that sends PROXY protocol headers in the listener's proxy_protocol_from"
        }
        "max_handshakes_in_progress" => {
            "the server as a whole is at that limit: raise it, or set it to 0 (off), if the machine has room"
        }
        // max_connections, max_tracked_sources: whole-server caps, never off.
        _ => "the server as a whole is at that limit: raise it if the machine has room",
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

    #[test]
    fn the_advice_is_one_the_key_takes() {
        // Only these take 0 (off); the others are refused at 0 by check-config.
        for key in [
            "handshake_rate_per_source",
            "max_handshakes_per_source",
            "max_handshakes_in_progress",
        ] {
            assert!(advice(key).contains("0 (off)"), "{key}");
        }
        for key in [
            "max_connections",
            "max_connections_per_ip",
            "max_tracked_sources",
        ] {
            assert!(!advice(key).contains("0 (off)"), "{key}");
        }
        assert!(advice("max_connections").contains("server as a whole"));
        assert!(advice("max_connections_per_ip").contains("source"));
    }
}
