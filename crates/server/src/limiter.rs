//! Connection limits checked at accept, before any TLS work: a cap on open
//! connections overall and per source address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counts open connections; shared by every worker.
#[derive(Debug, Default)]
pub struct ConnLimiter {
    total: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
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
    ip: IpAddr,
}

impl ConnLimiter {
    /// Takes a permit for a connection from `ip`, or says which limit refuses it.
    pub fn try_acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        max_total: usize,
        max_per_ip: usize,
    ) -> Result<Permit, Refusal> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Total);
        }
        let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max_per_ip {
            drop(map);
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::PerIp);
        }
        *n += 1;
        Ok(Permit {
            limiter: self.clone(),
            ip,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut map = self
            .limiter
            .per_ip
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
        drop(map);
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
        let p1 = l.try_acquire(a, 3, 2).unwrap();
        let _p2 = l.try_acquire(a, 3, 2).unwrap();
        assert_eq!(l.try_acquire(a, 3, 2).unwrap_err(), Refusal::PerIp);
        let _p3 = l.try_acquire(b, 3, 2).unwrap();
        assert_eq!(l.try_acquire(b, 3, 2).unwrap_err(), Refusal::Total);
        drop(p1);
        assert_eq!(l.open(), 2);
        let _p4 = l.try_acquire(a, 3, 2).unwrap();
        assert_eq!(l.open(), 3);
    }
}
