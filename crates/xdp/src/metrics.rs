//! SynGate's counters for `/metrics`: a Prometheus collector that reads
//! the maps at every scrape (nothing to keep in step), through descriptors
//! opened once, at start: `tlsgate serve` may drop its privileges after,
//! and the pins are root's. Its names get the registry's `tlsgate_` prefix.
//!
//! Every series is labelled by interface and, but for the top sources,
//! by port: `tlsgate_xdp_syns_total`, `_cookies_total`, `_passed_total`,
//! `_failures_total{reason="no_listener"|"error"|"martian"|"malformed"}`,
//! `_probes_total`, `_flood` (1 in flood mode),
//! `_flood_transitions_total{to="flood"|"peace"}`,
//! `_top_source_syns{prefix}` (sampled, flood mode only) and
//! `tlsgate_xdp_attached` (0 when the program could not be attached and
//! `xdp.optional` let tlsgate run unprotected, and when the kernel has
//! detached it since: its interface was deleted, see [`crate::link`]).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::link::{Link, LinkState};
use crate::stats::{PinnedMaps, PortStats};
use crate::Error;

/// Reads SynGate's maps of one interface at every scrape.
#[derive(Debug)]
pub struct XdpCollector {
    iface: String,
    maps: Option<(PinnedMaps, Link)>,
}

impl XdpCollector {
    /// A collector for the attachment held as `link` (of its interface)
    /// under `pin_root`, its maps opened now.
    pub fn open(pin_root: &std::path::Path, link: Link) -> Result<Self, Error> {
        Ok(XdpCollector {
            iface: link.iface().into(),
            maps: Some((PinnedMaps::open(pin_root, link.iface())?, link)),
        })
    }

    /// A collector for an interface SynGate is not attached to: it exports
    /// only `tlsgate_xdp_attached 0`.
    pub fn unattached(iface: impl Into<String>) -> Self {
        XdpCollector {
            iface: iface.into(),
            maps: None,
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// Picks one value of a port's stats.
type Pick<'a> = &'a dyn Fn(&PortStats) -> u64;

fn family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    rows: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in rows {
        let fe = m.encode_family(labels)?;
        match ty {
            MetricType::Counter => ConstCounter::new(*v).encode(fe)?,
            _ => ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX)).encode(fe)?,
        }
    }
    Ok(())
}

impl Collector for XdpCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.maps.as_ref().and_then(|(m, link)| {
            // Attached only when the kernel says so.
            let state = link.state().unwrap_or_else(|err| {
                tracing::warn!("XDP SynGate state for /metrics: {err}");
                LinkState::NotAttached
            });
            match m.stats(state) {
                Ok(s) => Some(s),
                Err(err) => {
                    tracing::warn!("XDP stats for /metrics: {err}");
                    None
                }
            }
        });
        let iface = || ("interface", self.iface.clone());
        family(
            &mut e,
            "xdp_attached",
            "1 when XDP SynGate is attached to the interface",
            MetricType::Gauge,
            &[(
                vec![iface()],
                u64::from(s.as_ref().is_some_and(|s| s.attached)),
            )],
        )?;
        let Some(s) = s else { return Ok(()) };
        let rows = |f: Pick<'_>| -> Vec<(Labels, u64)> {
            s.ports
                .iter()
                .map(|p| (vec![iface(), ("port", p.port.to_string())], f(p)))
                .collect()
        };
        let counters: [(&str, &str, Pick<'_>); 4] = [
            ("xdp_syns", "SYNs to a protected port seen by XDP", &|p| {
                p.counters.syn_seen
            }),
            (
                "xdp_cookies",
                "SYNs answered from XDP with a SYN cookie",
                &|p| p.counters.cookies,
            ),
            ("xdp_passed", "SYNs passed to the kernel", &|p| {
                p.counters.passed
            }),
            (
                "xdp_probes",
                "auto mode: peacetime probes offered to the cookie helper",
                &|p| p.counters.sampled,
            ),
        ];
        for (name, help, f) in counters {
            family(&mut e, name, help, MetricType::Counter, &rows(f))?;
        }
        let mut failures = Vec::new();
        for p in &s.ports {
            for (reason, v) in [
                ("no_listener", p.counters.no_listener),
                ("error", p.counters.errors),
                ("martian", p.counters.martian),
                ("malformed", p.counters.malformed),
            ] {
                failures.push((
                    vec![
                        iface(),
                        ("port", p.port.to_string()),
                        ("reason", reason.to_string()),
                    ],
                    v,
                ));
            }
        }
        family(
            &mut e,
            "xdp_failures",
            "SYNs XDP did not answer (passed to the kernel), by reason",
            MetricType::Counter,
            &failures,
        )?;
        family(
            &mut e,
            "xdp_flood",
            "1 while the port is in flood mode",
            MetricType::Gauge,
            &rows(&|p| u64::from(p.state.flood)),
        )?;
        let mut transitions = Vec::new();
        for p in &s.ports {
            for (to, v) in [
                ("flood", p.state.flood_entered),
                ("peace", p.state.flood_left),
            ] {
                transitions.push((
                    vec![
                        iface(),
                        ("port", p.port.to_string()),
                        ("to", to.to_string()),
                    ],
                    v,
                ));
            }
        }
        family(
            &mut e,
            "xdp_flood_transitions",
            "Flood mode entered (to=flood) and left (to=peace)",
            MetricType::Counter,
            &transitions,
        )?;
        let top: Vec<(Labels, u64)> = s
            .top_sources
            .iter()
            .map(|t| (vec![iface(), ("prefix", t.prefix.clone())], t.syns))
            .collect();
        family(
            &mut e,
            "xdp_top_source_syns",
            "Sampled SYNs answered in flood mode from the busiest sources (/32, /64)",
            MetricType::Gauge,
            &top,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn unprotected_exports_attached_zero() {
        let mut r = Registry::with_prefix("tlsgate");
        r.register_collector(Box::new(XdpCollector::unattached("eth9")));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encodes");
        assert!(out.contains(r#"xdp_attached{interface="eth9"} 0"#), "{out}");
        assert!(!out.contains("xdp_syns"), "{out}");
    }
}
