//! Connection limits checked at accept, before any TLS work: a cap on open
//! connections overall and per source: an address's first
//! `limits.source_prefix_v4`/`_v6` bits, as for the handshake limits (an
//! IPv6 host usually has a whole /64 to pick addresses from).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counts open connections; shared by every worker.
#[derive(Debug, Default)]
pub struct ConnLimiter {
    total: AtomicUsize,
    /// Open connections by source key ([`crate::flood::source_key`]).
    per_source: Mutex<HashMap<u128, usize>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `limits.max_connections` reached.
    Total,
    /// `limits.max_connections_per_ip` reached for this source.
    PerIp,
}

impl Refusal {
    /// Metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Total => "max_connections",
            Self::PerIp => "max_connections_per_ip",
        }
    }
}

/// One open connection's share of the limits; released on drop.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<ConnLimiter>,
    /// `None` until the source is known: a connection from a trusted load
    /// balancer counts against the total from accept, against its client
    /// once the PROXY protocol header names it.
    source: Option<u128>,
}

impl ConnLimiter {
    /// Takes a permit for a connection from `ip`, or says which limit
    /// refuses it; `prefixes` are the IPv4 and IPv6 bits that make a source.
    #[cfg(test)]
    pub fn try_acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        max_total: usize,
        max_per_ip: usize,
        prefixes: (u8, u8),
    ) -> Result<Permit, Refusal> {
        let mut permit = self.try_acquire_unattributed(max_total)?;
        permit.attribute(ip, max_per_ip, prefixes)?;
        Ok(permit)
    }

    /// Takes a permit that counts against the total only, until
    /// [`Permit::attribute`] gives it a source.
    pub fn try_acquire_unattributed(self: &Arc<Self>, max_total: usize) -> Result<Permit, Refusal> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Total);
        }
        Ok(Permit {
            limiter: self.clone(),
            source: None,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

impl Permit {
    /// Counts this connection against the source of `ip` too, or says that
    /// source is at its limit (dropping the permit then frees its place in
    /// the total). A permit has one source: a second call is refused.
    pub fn attribute(
        &mut self,
        ip: IpAddr,
        max_per_ip: usize,
        prefixes: (u8, u8),
    ) -> Result<(), Refusal> {
        if self.source.is_some() {
            return Err(Refusal::PerIp);
        }
        let source = crate::flood::source_key(ip, prefixes.0, prefixes.1);
        let mut map = self
            .limiter
            .per_source
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = map.entry(source).or_insert(0);
        if *n >= max_per_ip {
            if *n == 0 {
                map.remove(&source);
            }
            return Err(Refusal::PerIp);
        }
        *n += 1;
        self.source = Some(source);
        Ok(())
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(source) = self.source {
            let mut map = self
                .limiter
                .per_source
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = map.get_mut(&source) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&source);
                }
            }
        }
        self.limiter.total.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn limits_total_and_per_ip_and_releases_on_drop() {
        let l = Arc::new(ConnLimiter::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        const P: (u8, u8) = (32, 64);
        let p1 = l.try_acquire(a, 3, 2, P).unwrap();
        let _p2 = l.try_acquire(a, 3, 2, P).unwrap();
        assert_eq!(l.try_acquire(a, 3, 2, P).unwrap_err(), Refusal::PerIp);
        let _p3 = l.try_acquire(b, 3, 2, P).unwrap();
        assert_eq!(l.try_acquire(b, 3, 2, P).unwrap_err(), Refusal::Total);
        drop(p1);
        assert_eq!(l.open(), 2);
        let _p4 = l.try_acquire(a, 3, 2, P).unwrap();
        assert_eq!(l.open(), 3);
    }

    #[test]
    fn a_balancers_connection_counts_in_the_total_at_once_and_for_its_client_later() {
        let l = Arc::new(ConnLimiter::default());
        const P: (u8, u8) = (32, 64);
        let client: IpAddr = "198.51.100.7".parse().unwrap();
        let _c1 = l.try_acquire(client, 10, 1, P).unwrap();
        let mut pending = l.try_acquire_unattributed(10).unwrap();
        assert_eq!(l.open(), 2);
        // Its header names a client already at its limit: refused, and
        // dropping it gives the place back.
        assert_eq!(pending.attribute(client, 1, P).unwrap_err(), Refusal::PerIp);
        drop(pending);
        assert_eq!(l.open(), 1);
        let mut other = l.try_acquire_unattributed(10).unwrap();
        other
            .attribute("198.51.100.8".parse().unwrap(), 1, P)
            .unwrap();
        assert!(
            other.attribute(client, 1, P).is_err(),
            "one source per permit"
        );
        drop(other);
        // The other client's count went with it.
        let _c2 = l
            .try_acquire("198.51.100.8".parse().unwrap(), 10, 1, P)
            .unwrap();
        assert_eq!(l.try_acquire_unattributed(2).unwrap_err(), Refusal::Total);
    }

    #[test]
    fn an_ipv6_host_is_one_source_whatever_address_of_its_64_it_uses() {
        let l = Arc::new(ConnLimiter::default());
        const P: (u8, u8) = (32, 64);
        let _held: Vec<Permit> = (1..=2u16)
            .map(|i| {
                let ip: IpAddr = format!("2001:db8:1:2::{i:x}").parse().unwrap();
                l.try_acquire(ip, 100, 2, P).unwrap()
            })
            .collect();
        let third: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(l.try_acquire(third, 100, 2, P).unwrap_err(), Refusal::PerIp);
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(l.try_acquire(next_64, 100, 2, P).is_ok());
        // Per address with a /128.
        assert!(l.try_acquire(third, 100, 2, (32, 128)).is_ok());
    }
}
