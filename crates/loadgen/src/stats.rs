//! What a job measured, merged over its threads.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency summary in microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// One negotiated combination and how many handshakes used it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Negotiated {
    /// Protocol version, e.g. "TLSv1_3".
    pub version: String,
    /// Cipher suite, e.g. "TLS13_AES_128_GCM_SHA256".
    pub suite: String,
    /// Key-exchange group, e.g. "X25519" ("none" for resumed TLS 1.2).
    pub group: String,
    /// Handshakes.
    pub count: u64,
}

/// The result of one job, counted over its measurement window only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Length of the measurement window, seconds.
    pub window_secs: f64,
    /// Operations completed in the window (handshake+GET, request, fetch).
    pub operations: u64,
    /// TLS handshakes completed in the window.
    pub handshakes: u64,
    /// Of which resumed.
    pub resumed: u64,
    /// Response bytes (headers and bodies) received in the window.
    pub bytes: u64,
    /// Failed operations, by kind.
    pub errors: BTreeMap<String, u64>,
    /// The first error message seen, for diagnosis.
    pub first_error: Option<String>,
    /// Latency of operations completed in the window.
    pub latency: Latency,
    /// CPU time of the generator's threads over the window, seconds.
    pub client_cpu_secs: f64,
    /// Client cores (threads) used.
    pub client_threads: usize,
    /// What was negotiated.
    pub negotiated: Vec<Negotiated>,
    /// Job-specific figures (e.g. `late_fetches`, `connections_open`).
    pub extra: BTreeMap<String, f64>,
}

impl Report {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        per_sec(self.operations as f64, self.window_secs)
    }

    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        per_sec(self.bytes as f64, self.window_secs)
    }

    /// Failed operations in all.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Share of the generator's cores it kept busy (1.0 = saturated).
    pub fn client_utilization(&self) -> f64 {
        per_sec(
            self.client_cpu_secs,
            self.window_secs * self.client_threads.max(1) as f64,
        )
    }

    /// Share of handshakes that were resumed.
    pub fn resumed_share(&self) -> f64 {
        if self.handshakes == 0 {
            0.0
        } else {
            self.resumed as f64 / self.handshakes as f64
        }
    }
}

fn per_sec(x: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        x / secs
    } else {
        0.0
    }
}

/// Per-thread counters, merged into a [`Report`] at the end.
pub(crate) struct Tally {
    pub hist: Histogram<u64>,
    pub operations: u64,
    pub handshakes: u64,
    pub resumed: u64,
    pub bytes: u64,
    pub errors: BTreeMap<String, u64>,
    pub first_error: Option<String>,
    pub negotiated: BTreeMap<(String, String, String), u64>,
    pub extra: BTreeMap<String, f64>,
}

impl Tally {
    pub fn new() -> Self {
        Self {
            // 1 µs .. 10 min at 3 significant digits; bounded size.
            hist: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("constant histogram bounds are valid"),
            operations: 0,
            handshakes: 0,
            resumed: 0,
            bytes: 0,
            errors: BTreeMap::new(),
            first_error: None,
            negotiated: BTreeMap::new(),
            extra: BTreeMap::new(),
        }
    }

    pub fn record_op(&mut self, micros: u64) {
        self.operations += 1;
        self.hist.saturating_record(micros.max(1));
    }

    pub fn record_error(&mut self, kind: &str, message: impl FnOnce() -> String) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{kind}: {}", message()));
        }
    }

    pub fn record_handshake(&mut self, resumed: bool, negotiated: (String, String, String)) {
        self.handshakes += 1;
        if resumed {
            self.resumed += 1;
        }
        *self.negotiated.entry(negotiated).or_default() += 1;
    }

    pub fn merge(&mut self, other: Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.hist.add(&other.hist);
        self.operations += other.operations;
        self.handshakes += other.handshakes;
        self.resumed += other.resumed;
        self.bytes += other.bytes;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        for (k, v) in other.negotiated {
            *self.negotiated.entry(k).or_default() += v;
        }
        for (k, v) in other.extra {
            *self.extra.entry(k).or_default() += v;
        }
    }

    pub fn into_report(self, window_secs: f64, client_cpu_secs: f64, threads: usize) -> Report {
        let h = &self.hist;
        let latency = if h.is_empty() {
            Latency::default()
        } else {
            Latency {
                p50_us: h.value_at_quantile(0.5) as f64,
                p99_us: h.value_at_quantile(0.99) as f64,
                mean_us: h.mean(),
                max_us: h.max() as f64,
            }
        };
        Report {
            window_secs,
            operations: self.operations,
            handshakes: self.handshakes,
            resumed: self.resumed,
            bytes: self.bytes,
            errors: self.errors,
            first_error: self.first_error,
            latency,
            client_cpu_secs,
            client_threads: threads,
            negotiated: self
                .negotiated
                .into_iter()
                .map(|((version, suite, group), count)| Negotiated {
                    version,
                    suite,
                    group,
                    count,
                })
                .collect(),
            extra: self.extra,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_add_up_and_give_percentiles() {
        let mut a = Tally::new();
        let mut b = Tally::new();
        for us in 1..=99 {
            a.record_op(us * 10);
        }
        b.record_op(100_000);
        b.record_error("connect", || "refused".into());
        b.record_error("connect", || "refused again".into());
        a.record_handshake(true, ("v".into(), "s".into(), "g".into()));
        b.record_handshake(false, ("v".into(), "s".into(), "g".into()));
        a.merge(b);
        let r = a.into_report(2.0, 1.0, 1);
        assert_eq!(r.operations, 100);
        assert_eq!(r.ops_per_sec(), 50.0);
        assert_eq!(r.error_count(), 2);
        assert_eq!(r.first_error.as_deref(), Some("connect: refused"));
        assert_eq!(r.negotiated.len(), 1);
        assert_eq!(r.negotiated[0].count, 2);
        assert_eq!(r.resumed_share(), 0.5);
        assert!((r.latency.p50_us - 500.0).abs() <= 1.0, "{:?}", r.latency);
        assert!(r.latency.p99_us >= 990.0 && r.latency.max_us >= 99_000.0);
        assert_eq!(r.client_utilization(), 0.5);
    }
}
