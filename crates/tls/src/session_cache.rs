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

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

thread_local! {
    /// Set while rustls processes records of a connection whose
    /// ServerHello announced a ticket.
    static TICKETED: Cell<bool> = const { Cell::new(false) };
}

/// Marks the records processed while it lives as a ticketed session's:
/// the cache takes no session from them. rustls processes records
/// synchronously, so nothing else runs on this thread meanwhile.
pub(crate) struct TicketedSession(());

impl TicketedSession {
    pub(crate) fn enter() -> Self {
        TICKETED.with(|t| t.set(true));
        Self(())
    }
}

impl Drop for TicketedSession {
    fn drop(&mut self) {
        TICKETED.with(|t| t.set(false));
    }
}

/// rustls' memory cache, bounded, that refuses ticketed sessions.
pub(crate) struct SessionIdCache(Arc<ServerSessionMemoryCache>);

impl SessionIdCache {
    pub(crate) fn new(size: usize) -> Arc<Self> {
        Arc::new(Self(ServerSessionMemoryCache::new(size)))
    }
}

impl fmt::Debug for SessionIdCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SessionIdCache").finish()
    }
}

impl StoresServerSessions for SessionIdCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        if TICKETED.with(Cell::get) {
            return false;
        }
        self.0.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.take(key)
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
        let cache = SessionIdCache::new(4);
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
}
