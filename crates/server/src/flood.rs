//! Handshake flood limits, checked right after accept, before the
//! ClientHello is read or any cryptography is done: a token bucket and a
//! cap on handshakes in progress per source, and a cap on handshakes in
//! progress overall.
//!
//! A "source" is the client address cut to a prefix (`/32` and `/64` by
//! default), so one IPv6 host cannot pose as 2^64 sources. The per-source
//! state lives in a table sharded by a keyed hash (an attacker cannot aim
//! at one shard) and bounded by `limits.max_tracked_sources`: when a shard
//! is full, the sources that are idle (bucket full, nothing in progress)
//! go first, then the least recently seen ones that have nothing in
//! progress. A source that keeps knocking stays recent and so keeps its
//! empty bucket; a flood of one-shot sources only evicts itself.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tlsgate_config::{HandshakeLimits, HandshakeRate};

/// Shards of the source table (a power of two).
const SHARDS: usize = 64;

/// Why a connection was refused before its handshake. The metric label is
/// the config key of the limit, as for the connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The source's token bucket is empty.
    SourceRate,
    /// The source has `max_handshakes_per_source` handshakes in progress.
    SourceConcurrent,
    /// `max_handshakes_in_progress` handshakes are in progress overall.
    GlobalConcurrent,
    /// The source is new and its shard is full of sources with handshakes
    /// in progress (only when the global cap is off or very high).
    TableFull,
}

impl Refusal {
    /// Metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::SourceRate => "handshake_rate_per_source",
            Self::SourceConcurrent => "max_handshakes_per_source",
            Self::GlobalConcurrent => "max_handshakes_in_progress",
            Self::TableFull => "max_tracked_sources",
        }
    }
}

/// What is remembered of one source.
#[derive(Debug)]
struct Source {
    /// Tokens in the bucket as of `stamp`; infinite while no rate is set,
    /// so a rate set by a reload starts with a full bucket.
    tokens: f64,
    /// Last time the source was seen (and its bucket refilled).
    stamp: Instant,
    /// Handshakes in progress.
    in_progress: usize,
}

impl Source {
    fn new(now: Instant) -> Self {
        Self {
            tokens: f64::INFINITY,
            stamp: now,
            in_progress: 0,
        }
    }

    /// Tokens the bucket would hold at `now`.
    fn tokens_at(&self, rate: HandshakeRate, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
        (self.tokens + elapsed * f64::from(rate.per_second)).min(f64::from(rate.burst))
    }

    fn refill(&mut self, rate: Option<HandshakeRate>, now: Instant) {
        if let Some(rate) = rate {
            self.tokens = self.tokens_at(rate, now);
        }
        self.stamp = self.stamp.max(now);
    }

    /// Forgetting an idle source changes nothing: it would come back as new.
    fn is_idle(&self, rate: Option<HandshakeRate>, now: Instant) -> bool {
        self.in_progress == 0 && rate.is_none_or(|r| self.tokens_at(r, now) >= f64::from(r.burst))
    }
}

#[derive(Debug, Default)]
struct Shard {
    sources: HashMap<u128, Source>,
}

impl Shard {
    /// Brings the shard down to 7/8 of `cap` if it can; returns how many
    /// sources were forgotten. Each call frees at least `cap / 8` slots
    /// unless nearly everything is in progress, so the scan is paid back
    /// over the inserts that follow.
    fn make_room(&mut self, cap: usize, rate: Option<HandshakeRate>, now: Instant) -> usize {
        let before = self.sources.len();
        self.sources.retain(|_, s| !s.is_idle(rate, now));
        let target = cap - cap.div_ceil(8);
        if self.sources.len() > target {
            let mut oldest: Vec<(Instant, u128)> = self
                .sources
                .iter()
                .filter(|(_, s)| s.in_progress == 0)
                .map(|(k, s)| (s.stamp, *k))
                .collect();
            let excess = (self.sources.len() - target).min(oldest.len());
            if excess > 0 {
                oldest.select_nth_unstable(excess - 1);
                for (_, k) in oldest.iter().take(excess) {
                    self.sources.remove(k);
                }
            }
        }
        before - self.sources.len()
    }
}

/// The handshake limits' state, shared by every worker.
#[derive(Debug)]
pub struct HandshakeLimiter {
    shards: Box<[Mutex<Shard>]>,
    /// Keyed hash choosing the shard.
    pick: RandomState,
    in_progress: AtomicUsize,
    tracked: AtomicUsize,
}

impl Default for HandshakeLimiter {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            pick: RandomState::new(),
            in_progress: AtomicUsize::new(0),
            tracked: AtomicUsize::new(0),
        }
    }
}

/// One handshake's share of the limits; released on drop (when the
/// handshake ends, however it ends).
#[derive(Debug)]
pub struct HandshakeSlot {
    limiter: Arc<HandshakeLimiter>,
    /// Shard and key, when per-source limits counted this handshake.
    source: Option<(usize, u128)>,
}

/// The source a client address counts as: its first `v4` or `v6` bits.
/// IPv4 sources live in the IPv4-mapped range `::ffff:0:0/96`, which no
/// IPv6 source reaches since mapped addresses are taken as IPv4.
pub(crate) fn source_key(ip: IpAddr, v4: u8, v6: u8) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(v4.min(32)))
                .unwrap_or(0);
            (0xffff_u128 << 32) | u128::from(u32::from(a) & mask)
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask
        }
    }
}

impl HandshakeLimiter {
    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        // The shard's data stays consistent even if a holder panicked.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handshakes in progress now.
    pub fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::Relaxed)
    }

    /// Sources remembered now.
    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Copies the gauges into the metrics, before they are rendered.
    pub fn export(&self, m: &tlsgate_metrics::Metrics) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        m.handshakes_in_progress.set(gauge(self.in_progress()));
        m.handshake_sources_tracked.set(gauge(self.tracked()));
    }

    /// Takes a slot for a handshake from `ip`, or says which limit refuses it.
    pub fn try_begin(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &HandshakeLimits,
    ) -> Result<HandshakeSlot, Refusal> {
        self.try_begin_at(ip, limits, Instant::now())
    }

    /// [`Self::try_begin`] at a given time (tests drive the clock).
    fn try_begin_at(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &HandshakeLimits,
        now: Instant,
    ) -> Result<HandshakeSlot, Refusal> {
        let rate = limits.rate_per_source;
        if rate.is_none() && limits.max_per_source.is_none() {
            self.take_global(limits)?;
            return Ok(HandshakeSlot {
                limiter: self.clone(),
                source: None,
            });
        }
        let key = source_key(ip, limits.source_prefix_v4, limits.source_prefix_v6);
        let i = (self.pick.hash_one(key) as usize) & (SHARDS - 1);
        let mut shard = self.shard(i);
        if !shard.sources.contains_key(&key) {
            let cap = limits.max_tracked_sources.div_ceil(SHARDS).max(1);
            if shard.sources.len() >= cap {
                let freed = shard.make_room(cap, rate, now);
                self.tracked.fetch_sub(freed, Ordering::Relaxed);
                if shard.sources.len() >= cap {
                    return Err(Refusal::TableFull);
                }
            }
            self.tracked.fetch_add(1, Ordering::Relaxed);
        }
        let src = shard.sources.entry(key).or_insert_with(|| Source::new(now));
        src.refill(rate, now);
        if limits
            .max_per_source
            .is_some_and(|max| src.in_progress >= max)
        {
            return Err(Refusal::SourceConcurrent);
        }
        if rate.is_some() && src.tokens < 1.0 {
            return Err(Refusal::SourceRate);
        }
        // Last, so that a refusal above takes no global slot and a global
        // refusal takes no token.
        self.take_global(limits)?;
        if rate.is_some() {
            src.tokens -= 1.0;
        }
        src.in_progress += 1;
        Ok(HandshakeSlot {
            limiter: self.clone(),
            source: Some((i, key)),
        })
    }

    fn take_global(&self, limits: &HandshakeLimits) -> Result<(), Refusal> {
        let before = self.in_progress.fetch_add(1, Ordering::AcqRel);
        if limits.max_in_progress.is_some_and(|max| before >= max) {
            self.in_progress.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::GlobalConcurrent);
        }
        Ok(())
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if let Some((i, key)) = self.source {
            // Sources with handshakes in progress are never evicted.
            if let Some(s) = self.limiter.shard(i).sources.get_mut(&key) {
                s.in_progress = s.in_progress.saturating_sub(1);
            }
        }
        self.limiter.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(rate: Option<(u32, u32)>, per_source: usize, global: usize) -> HandshakeLimits {
        HandshakeLimits {
            rate_per_source: rate.map(|(per_second, burst)| HandshakeRate { per_second, burst }),
            max_per_source: Some(per_source).filter(|&n| n > 0),
            max_in_progress: Some(global).filter(|&n| n > 0),
            source_prefix_v4: 32,
            source_prefix_v6: 64,
            max_tracked_sources: 100_000,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Begins and at once ends a handshake; true if it was allowed.
    fn knock(l: &Arc<HandshakeLimiter>, from: &str, lim: &HandshakeLimits, at: Instant) -> bool {
        l.try_begin_at(ip(from), lim, at).is_ok()
    }

    #[test]
    fn token_bucket_allows_the_burst_then_the_rate() {
        let l = Arc::new(HandshakeLimiter::default());
        let lim = limits(Some((2, 3)), 0, 0);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(knock(&l, "10.0.0.1", &lim, t0));
        }
        assert_eq!(
            l.try_begin_at(ip("10.0.0.1"), &lim, t0).unwrap_err(),
            Refusal::SourceRate
        );
        // 2 per second: one token after 500 ms, not before.
        assert!(!knock(&l, "10.0.0.1", &lim, t0 + ms(499)));
        assert!(knock(&l, "10.0.0.1", &lim, t0 + ms(500)));
        assert!(!knock(&l, "10.0.0.1", &lim, t0 + ms(500)));
        // Refusals take no token: 1 s later exactly two are allowed.
        assert!(knock(&l, "10.0.0.1", &lim, t0 + ms(1500)));
        assert!(knock(&l, "10.0.0.1", &lim, t0 + ms(1500)));
        assert!(!knock(&l, "10.0.0.1", &lim, t0 + ms(1500)));
        // A long quiet fills the bucket to the burst, no more.
        let later = t0 + Duration::from_secs(3600);
        let allowed = (0..10)
            .filter(|_| knock(&l, "10.0.0.1", &lim, later))
            .count();
        assert_eq!(allowed, 3);
        // Other sources have their own bucket.
        assert!(knock(&l, "10.0.0.2", &lim, t0 + ms(500)));
        assert_eq!(l.in_progress(), 0, "slots are released on drop");
    }

    #[test]
    fn a_reload_that_lowers_the_burst_caps_the_tokens() {
        let l = Arc::new(HandshakeLimiter::default());
        let t0 = Instant::now();
        assert!(knock(&l, "10.0.0.1", &limits(Some((1, 100)), 0, 0), t0));
        let low = limits(Some((1, 2)), 0, 0);
        let allowed = (0..10).filter(|_| knock(&l, "10.0.0.1", &low, t0)).count();
        assert_eq!(allowed, 2);
        // Rate off: everything passes; back on: the bucket starts full.
        let off = limits(None, 5, 0);
        assert!((0..50).all(|_| knock(&l, "10.0.0.9", &off, t0)));
        let allowed = (0..10).filter(|_| knock(&l, "10.0.0.9", &low, t0)).count();
        assert_eq!(allowed, 2);
    }

    #[test]
    fn handshakes_in_progress_are_capped_per_source_and_overall() {
        let l = Arc::new(HandshakeLimiter::default());
        let lim = limits(Some((1, 10)), 2, 3);
        let t0 = Instant::now();
        let a1 = l.try_begin_at(ip("10.0.0.1"), &lim, t0).unwrap();
        let _a2 = l.try_begin_at(ip("10.0.0.1"), &lim, t0).unwrap();
        assert_eq!(
            l.try_begin_at(ip("10.0.0.1"), &lim, t0).unwrap_err(),
            Refusal::SourceConcurrent
        );
        let _b1 = l.try_begin_at(ip("10.0.0.2"), &lim, t0).unwrap();
        assert_eq!(l.in_progress(), 3);
        assert_eq!(
            l.try_begin_at(ip("10.0.0.3"), &lim, t0).unwrap_err(),
            Refusal::GlobalConcurrent
        );
        drop(a1);
        assert_eq!(l.in_progress(), 2);
        // The global refusal took no token from 10.0.0.3: its whole burst is left.
        for _ in 0..10 {
            assert!(knock(&l, "10.0.0.3", &lim, t0));
        }
        assert_eq!(
            l.try_begin_at(ip("10.0.0.3"), &lim, t0).unwrap_err(),
            Refusal::SourceRate
        );
        // With per-source limits off only the global cap counts.
        let global_only = limits(None, 0, 3);
        let _x = l.try_begin_at(ip("10.0.0.4"), &global_only, t0).unwrap();
        assert_eq!(
            l.try_begin_at(ip("10.0.0.5"), &global_only, t0)
                .unwrap_err(),
            Refusal::GlobalConcurrent
        );
    }

    #[test]
    fn sources_are_grouped_by_prefix() {
        // (a, b, v4 prefix, v6 prefix, same source?)
        let cases = [
            (
                "2001:db8:1:2::1",
                "2001:db8:1:2:ffff:ffff:ffff:ffff",
                32,
                64,
                true,
            ),
            ("2001:db8:1:2::1", "2001:db8:1:3::1", 32, 64, false),
            ("2001:db8:1:2::1", "2001:db8:1:3::1", 32, 48, true),
            ("2001:db8::1", "2001:db8::2", 32, 128, false),
            ("192.0.2.1", "192.0.2.2", 32, 64, false),
            ("192.0.2.1", "192.0.2.200", 24, 64, true),
            // A dual-stack socket reports IPv4 clients as mapped addresses.
            ("::ffff:192.0.2.1", "192.0.2.1", 32, 64, true),
        ];
        for (a, b, v4, v6, same) in cases {
            let (ka, kb) = (source_key(ip(a), v4, v6), source_key(ip(b), v4, v6));
            assert_eq!(ka == kb, same, "{a} {b} /{v4} /{v6}");
        }
        // IPv4 never shares a source with IPv6, whatever the prefixes.
        assert_ne!(source_key(ip("0.0.0.0"), 1, 1), source_key(ip("::"), 1, 1));

        let l = Arc::new(HandshakeLimiter::default());
        let mut lim = limits(Some((1, 2)), 0, 0);
        lim.source_prefix_v6 = 64;
        let t0 = Instant::now();
        assert!(knock(&l, "2001:db8:0:7::1", &lim, t0));
        assert!(knock(&l, "2001:db8:0:7::2", &lim, t0));
        assert!(!knock(&l, "2001:db8:0:7:abcd::3", &lim, t0));
        assert!(knock(&l, "2001:db8:0:8::1", &lim, t0));
    }

    #[test]
    fn a_flood_of_sources_stays_within_the_table_bound() {
        let l = Arc::new(HandshakeLimiter::default());
        let mut lim = limits(Some((1, 5)), 4, 0);
        lim.max_tracked_sources = 1024;
        let cap = lim.max_tracked_sources.div_ceil(SHARDS);
        let t0 = Instant::now();
        // A hot source empties its bucket and keeps knocking.
        let hot = "10.255.0.1";
        while knock(&l, hot, &lim, t0) {}
        // One held slot: that source must never be forgotten.
        let held = l.try_begin_at(ip("10.255.0.2"), &lim, t0).unwrap();
        for i in 0..200_000u32 {
            // One microsecond apart: the hot source stays among the most recent.
            let now = t0 + Duration::from_micros(u64::from(i));
            let spoofed = IpAddr::from((0x0b00_0000 + i).to_be_bytes());
            assert!(l.try_begin_at(spoofed, &lim, now).is_ok());
            if i % 16 == 0 {
                assert!(!knock(&l, hot, &lim, now), "hot source forgotten at {i}");
            }
            assert!(l.tracked() <= lim.max_tracked_sources);
        }
        for s in l.shards.iter() {
            assert!(s.lock().unwrap().sources.len() <= cap);
        }
        let total: usize = l
            .shards
            .iter()
            .map(|s| s.lock().unwrap().sources.len())
            .sum();
        assert_eq!(total, l.tracked());
        // 10.255.0.2 still counts its handshake in progress.
        let end = t0 + Duration::from_secs(1);
        let ok: Vec<_> = (0..4)
            .filter_map(|_| l.try_begin_at(ip("10.255.0.2"), &lim, end).ok())
            .collect();
        assert_eq!(ok.len(), 3, "limit 4 with one held");
        drop(ok);
        drop(held);
        assert_eq!(l.in_progress(), 0);
    }

    fn source(stamp: Instant, tokens: f64, in_progress: usize) -> Source {
        Source {
            tokens,
            stamp,
            in_progress,
        }
    }

    #[test]
    fn idle_sources_go_first_then_the_least_recent() {
        let rate = Some(HandshakeRate {
            per_second: 1,
            burst: 10,
        });
        let t0 = Instant::now();
        let mut shard = Shard::default();
        // Old but busy: empty buckets.
        for k in 0..8 {
            shard.sources.insert(k, source(t0, 0.0, 0));
        }
        // Newer but idle: full buckets.
        for k in 8..16 {
            shard.sources.insert(k, source(t0 + ms(1000), 10.0, 0));
        }
        assert_eq!(shard.make_room(16, rate, t0 + ms(2000)), 8);
        let mut left: Vec<u128> = shard.sources.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, (0..8).collect::<Vec<_>>());

        // None idle: exactly enough of the least recent go, never one in progress.
        let mut shard = Shard::default();
        shard.sources.insert(0, source(t0, 0.0, 1));
        for k in 1..16 {
            shard.sources.insert(k, source(t0 + ms(k as u64), 0.0, 0));
        }
        assert_eq!(shard.make_room(16, rate, t0 + ms(100)), 2);
        let mut left: Vec<u128> = shard.sources.keys().copied().collect();
        left.sort_unstable();
        let mut want: Vec<u128> = (3..16).collect();
        want.insert(0, 0);
        assert_eq!(left, want);
    }

    #[test]
    fn a_shard_full_of_handshakes_in_progress_refuses_new_sources() {
        let l = Arc::new(HandshakeLimiter::default());
        let mut lim = limits(None, 1, 0);
        lim.max_tracked_sources = 1024;
        let t0 = Instant::now();
        let mut held = Vec::new();
        let mut full = 0;
        for i in 0..4096u32 {
            match l.try_begin_at(IpAddr::from((0x0b00_0000 + i).to_be_bytes()), &lim, t0) {
                Ok(s) => held.push(s),
                Err(r) => {
                    assert_eq!(r, Refusal::TableFull);
                    full += 1;
                }
            }
        }
        assert_eq!(held.len(), 1024, "every shard filled to its share");
        assert_eq!(full, 4096 - 1024);
        assert_eq!(l.tracked(), 1024);
        drop(held);
        assert_eq!(l.in_progress(), 0);
        assert!(l.try_begin_at(ip("10.9.9.9"), &lim, t0).is_ok());
    }
}
