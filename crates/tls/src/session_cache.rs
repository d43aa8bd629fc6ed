//! The TLS 1.2 session-ID cache, for clients that cannot take a ticket.
//!
//! rustls gives every new TLS 1.2 session an ID and caches it, even when
//! it also sends the client a ticket. A client that has a ticket resumes
//! with it, so that cache entry is never used. It only takes memory
//! (~1–2 KB per session with a client certificate's chain), and once the
//! cache is full it evicts the sessions of clients that have no ticket.
//! A full cache also made every handshake 4–9 % dearer in the bench
//! (docs/bench.md, "The server's state: a full session cache"). So a
//! session that was given a ticket is not put in the cache.
//!
//! rustls' cache keeps a session until it is evicted, whatever its age,
//! so each entry carries the time it was put and one older than
//! `ticket_lifetime` is dropped instead of resumed: the lifetime bounds
//! what a stolen session resumes, with tickets or without.

use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

thread_local! {
    /// Set while rustls processes records of a connection whose
    /// ServerHello announced a ticket.
    static TICKETED: Cell<bool> = const { Cell::new(false) };
    /// Set while rustls processes records of a connection that epoll
    /// already reported reset: no session is kept or ticket sealed for it.
    static PEER_GONE: Cell<bool> = const { Cell::new(false) };
}

/// A thread's mark on the records rustls processes while it lives.
/// rustls processes records synchronously, so nothing else runs on this
/// thread meanwhile.
pub(crate) struct Mark(&'static LocalKey<Cell<bool>>);

impl Mark {
    fn enter(key: &'static LocalKey<Cell<bool>>) -> Self {
        key.with(|t| t.set(true));
        Self(key)
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.0.with(|t| t.set(false));
    }
}

/// The records of a connection whose peer can no longer receive anything
/// (a reset seen with its last flight, as from `openssl s_time`, scanners
/// and TLS health checks): neither this cache nor the ticket keys take its
/// session, which nobody could resume, and rustls sends no ticket, which
/// could not arrive (a sealed ticket and a write into a reset socket saved).
pub(crate) struct UnreachablePeer;

impl UnreachablePeer {
    pub(crate) fn enter() -> Mark {
        Mark::enter(&PEER_GONE)
    }

    /// Whether the records being processed are such a connection's.
    pub(crate) fn now() -> bool {
        PEER_GONE.with(Cell::get)
    }
}

/// The records of a ticketed session: the cache takes no session from them.
pub(crate) struct TicketedSession;

impl TicketedSession {
    pub(crate) fn enter() -> Mark {
        Mark::enter(&TICKETED)
    }
}

/// rustls' memory cache, bounded, that refuses ticketed sessions and
/// those older than `lifetime`.
pub(crate) struct SessionIdCache {
    inner: Arc<ServerSessionMemoryCache>,
    lifetime: Duration,
}

/// Bytes of the put time in front of each cached value.
const STAMP: usize = 8;

/// Milliseconds on the monotonic clock since the first use: a wall clock
/// step must neither revive nor expire sessions.
fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl SessionIdCache {
    pub(crate) fn new(size: usize, lifetime: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner: ServerSessionMemoryCache::new(size),
            lifetime,
        })
    }

    /// The session in `stamped` if it is younger than the lifetime.
    fn fresh(&self, stamped: Vec<u8>) -> Option<Vec<u8>> {
        let (stamp, value) = stamped.split_at_checked(STAMP)?;
        let put = u64::from_be_bytes(stamp.try_into().ok()?);
        let age = Duration::from_millis(now_ms().saturating_sub(put));
        (age < self.lifetime).then(|| value.to_vec())
    }
}

impl fmt::Debug for SessionIdCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SessionIdCache").finish()
    }
}

impl StoresServerSessions for SessionIdCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        if TICKETED.with(Cell::get) || UnreachablePeer::now() {
            return false;
        }
        let mut stamped = Vec::with_capacity(STAMP + value.len());
        stamped.extend_from_slice(&now_ms().to_be_bytes());
        stamped.extend_from_slice(&value);
        self.inner.put(key, stamped)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let stamped = self.inner.get(key)?;
        let value = self.fresh(stamped);
        if value.is_none() {
            // Expired: its slot goes to a session that can still resume.
            self.inner.take(key);
        }
        value
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.fresh(self.inner.take(key)?)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticketed_sessions_are_not_kept_and_others_are() {
        let cache = SessionIdCache::new(4, Duration::from_secs(60));
        {
            let _t = TicketedSession::enter();
            assert!(!cache.put(vec![1], vec![10]));
        }
        assert_eq!(cache.get(&[1]), None);
        // The mark ends with its guard.
        assert!(cache.put(vec![2], vec![20]));
        assert_eq!(cache.get(&[2]), Some(vec![20]));
        assert_eq!(cache.take(&[2]), Some(vec![20]));
        assert_eq!(cache.get(&[2]), None);
    }

    #[test]
    fn an_unreachable_peers_session_is_not_kept() {
        let cache = SessionIdCache::new(4, Duration::from_secs(60));
        {
            let _gone = UnreachablePeer::enter();
            assert!(UnreachablePeer::now());
            assert!(!cache.put(vec![1], vec![10]));
        }
        assert!(!UnreachablePeer::now());
        assert_eq!(cache.get(&[1]), None);
        assert!(cache.put(vec![2], vec![20]));
    }

    #[test]
    fn sessions_older_than_the_lifetime_are_dropped() {
        let cache = SessionIdCache::new(4, Duration::from_millis(50));
        assert!(cache.put(vec![1], vec![10]));
        assert!(cache.put(vec![2], vec![20]));
        assert_eq!(cache.get(&[1]), Some(vec![10]));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(cache.get(&[1]), None);
        assert_eq!(cache.take(&[2]), None);
        // The expired entry is gone, not just hidden.
        assert_eq!(cache.inner.get(&[1]), None);
    }
}
