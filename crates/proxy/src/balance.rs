//! Choosing a server: round-robin, smooth weighted round-robin (nginx's),
//! least connections relative to weight, and a consistent hash ring (a
//! server leaving moves only its own keys). Every algorithm skips servers
//! that are out of service or already tried for this request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tlsgate_config::Balance;

/// Ring points per unit of weight.
const POINTS_PER_WEIGHT: u32 = 160;

/// What a balancer knows of each server at the moment of the choice.
pub(crate) struct Candidate {
    /// Usable now (in service and not yet tried).
    pub usable: bool,
    pub weight: u32,
    pub in_flight: usize,
}

pub(crate) enum Balancer {
    RoundRobin(AtomicUsize),
    Weighted(Mutex<Vec<i64>>),
    LeastConnections(AtomicUsize),
    Hash(Vec<(u64, usize)>),
}

impl Balancer {
    pub fn new(balance: &Balance, weights: &[(String, u32)]) -> Self {
        match balance {
            Balance::RoundRobin => Self::RoundRobin(AtomicUsize::new(0)),
            Balance::Weighted => Self::Weighted(Mutex::new(vec![0; weights.len()])),
            Balance::LeastConnections => Self::LeastConnections(AtomicUsize::new(0)),
            Balance::Hash(_) => {
                let mut ring = Vec::new();
                for (i, (name, w)) in weights.iter().enumerate() {
                    for p in 0..w.saturating_mul(POINTS_PER_WEIGHT) {
                        ring.push((hash(format!("{name}#{p}").as_bytes()), i));
                    }
                }
                ring.sort_unstable();
                Self::Hash(ring)
            }
        }
    }

    /// A usable server, or `None` when none is. `key` is the request's
    /// hash key (only for the hash balancer; `None` falls back to turns).
    pub fn pick(&self, c: &[Candidate], key: Option<u64>) -> Option<usize> {
        let n = c.len();
        if !c.iter().any(|x| x.usable) {
            return None;
        }
        // The turn counts over the usable servers only, so a server out
        // of service does not double its successor's share.
        let in_turn = |counter: &AtomicUsize| {
            let usable = c.iter().filter(|x| x.usable).count().max(1);
            let turn = counter.fetch_add(1, Ordering::Relaxed) % usable;
            c.iter()
                .enumerate()
                .filter(|(_, x)| x.usable)
                .nth(turn)
                .map(|(i, _)| i)
        };
        match self {
            Self::RoundRobin(counter) => in_turn(counter),
            Self::Weighted(current) => {
                // A poisoned lock only means another thread panicked mid-update
                // of plain integers; the values are still usable.
                let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
                let total: i64 = c
                    .iter()
                    .filter(|x| x.usable)
                    .map(|x| i64::from(x.weight))
                    .sum();
                let mut best: Option<usize> = None;
                for (i, x) in c.iter().enumerate() {
                    if !x.usable {
                        continue;
                    }
                    let Some(w) = cur.get_mut(i) else { continue };
                    *w += i64::from(x.weight);
                    let w = *w;
                    if best.is_none_or(|b| cur.get(b).is_some_and(|&bw| bw < w)) {
                        best = Some(i);
                    }
                }
                if let Some(w) = best.and_then(|b| cur.get_mut(b)) {
                    *w -= total;
                }
                best
            }
            Self::LeastConnections(counter) => {
                // Ties go in turn, so equal servers share an idle start.
                let start = counter.fetch_add(1, Ordering::Relaxed);
                (0..n)
                    .map(|i| (start + i) % n)
                    .filter(|&i| c.get(i).is_some_and(|x| x.usable))
                    .min_by(|&a, &b| {
                        let (Some(a), Some(b)) = (c.get(a), c.get(b)) else {
                            return std::cmp::Ordering::Equal;
                        };
                        // in_flight / weight, compared without division.
                        (a.in_flight as u128 * u128::from(b.weight))
                            .cmp(&(b.in_flight as u128 * u128::from(a.weight)))
                    })
            }
            Self::Hash(ring) => {
                let Some(key) = key else {
                    return c.iter().position(|x| x.usable);
                };
                let at = ring.partition_point(|(h, _)| *h < key);
                ring.iter()
                    .cycle()
                    .skip(at)
                    .take(ring.len())
                    .map(|(_, i)| *i)
                    .find(|&i| c.get(i).is_some_and(|x| x.usable))
            }
        }
    }
}

/// FNV-1a, then a SplitMix64 finaliser for spread on the ring.
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tlsgate_config::HashKey;

    fn all(weights: &[u32]) -> Vec<Candidate> {
        weights
            .iter()
            .map(|&weight| Candidate {
                usable: true,
                weight,
                in_flight: 0,
            })
            .collect()
    }

    fn names(weights: &[u32]) -> Vec<(String, u32)> {
        weights
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("10.0.0.{i}:80"), *w))
            .collect()
    }

    fn counts(b: &Balancer, c: &[Candidate], picks: usize) -> Vec<usize> {
        let mut n = vec![0; c.len()];
        for _ in 0..picks {
            n[b.pick(c, None).expect("a server")] += 1;
        }
        n
    }

    #[test]
    fn round_robin_takes_turns_and_skips_unusable() {
        let b = Balancer::new(&Balance::RoundRobin, &names(&[1, 5, 1]));
        assert_eq!(counts(&b, &all(&[1, 5, 1]), 300), [100, 100, 100]);
        let mut c = all(&[1, 1, 1]);
        c[1].usable = false;
        assert_eq!(counts(&b, &c, 300), [150, 0, 150]);
        for x in &mut c {
            x.usable = false;
        }
        assert_eq!(b.pick(&c, None), None);
    }

    #[test]
    fn weighted_is_proportional_and_smooth() {
        let b = Balancer::new(&Balance::Weighted, &names(&[5, 1, 1]));
        let c = all(&[5, 1, 1]);
        let seq: Vec<usize> = (0..7).map(|_| b.pick(&c, None).unwrap_or(9)).collect();
        // nginx's smooth sequence for 5:1:1.
        assert_eq!(seq, [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(counts(&b, &c, 700), [500, 100, 100]);
    }

    #[test]
    fn least_connections_prefers_the_least_loaded_per_weight() {
        let b = Balancer::new(&Balance::LeastConnections, &names(&[1, 1, 2]));
        let mut c = all(&[1, 1, 2]);
        c[0].in_flight = 3;
        c[1].in_flight = 1;
        c[2].in_flight = 3; // 1.5 per weight
        assert_eq!(b.pick(&c, None), Some(1));
        c[1].in_flight = 2;
        assert_eq!(b.pick(&c, None), Some(2));
    }

    #[test]
    fn hash_is_stable_and_moves_only_the_lost_servers_keys() {
        let w = [1, 1, 1, 1];
        let b = Balancer::new(&Balance::Hash(HashKey::Source), &names(&w));
        let c = all(&w);
        let keys: Vec<u64> = (0..2000u32).map(|k| hash(&k.to_le_bytes())).collect();
        let before: Vec<usize> = keys
            .iter()
            .map(|&k| b.pick(&c, Some(k)).unwrap_or(9))
            .collect();
        let again: Vec<usize> = keys
            .iter()
            .map(|&k| b.pick(&c, Some(k)).unwrap_or(9))
            .collect();
        assert_eq!(before, again);
        let mut share = [0usize; 4];
        for &s in &before {
            share[s] += 1;
        }
        assert!(share.iter().all(|&s| s > 300), "{share:?}");
        let mut less = all(&w);
        less[2].usable = false;
        for (&k, &was) in keys.iter().zip(&before) {
            let now = b.pick(&less, Some(k)).unwrap_or(9);
            if was != 2 {
                assert_eq!(now, was, "a key of a healthy server moved");
            } else {
                assert_ne!(now, 2);
            }
        }
    }
}
