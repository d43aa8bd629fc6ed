//! `[xdp]`: XDP SynGate attached at start and detached at exit. The work
//! is in tlsgate-xdp; this module decides what a failure means (stop, or
//! serve unprotected when `xdp.optional`), wires the counters into
//! `/metrics`, watches that the kernel has not detached SynGate (its
//! interface deleted) and attaches it again at SIGHUP when it has.

use std::path::PathBuf;

use tlsgate_config::{Config, XdpMode};
use tlsgate_metrics::Metrics;
use tlsgate_xdp::metrics::XdpCollector;
use tlsgate_xdp::stats::PinnedMaps;
use tlsgate_xdp::sysctl::Sysctls;
use tlsgate_xdp::{AttachOptions, Held, LinkState, Mode};

use crate::StartError;

/// SynGate held for the life of the server; dropping it detaches the
/// program, removes its pins and restores the sysctls it set.
pub(crate) struct Gate {
    held: Option<Held>,
    /// The program's maps, opened at start (as root) for [`Gate::refresh`].
    maps: Option<PinnedMaps>,
}

impl Gate {
    /// Cleans up what a previous tlsgate left on the interface, then
    /// attaches. Must run before privileges are dropped.
    pub(crate) fn start(config: &Config, metrics: &mut Metrics) -> Result<Gate, StartError> {
        let Some(x) = &config.xdp else {
            return Ok(Gate {
                held: None,
                maps: None,
            });
        };
        let root = PathBuf::from(tlsgate_xdp::PIN_ROOT);
        match tlsgate_xdp::cleanup_stale(&root, &x.interface) {
            Ok(Some(d)) => tracing::warn!(
                "XDP SynGate: removed what a previous tlsgate left on {} (sysctls restored: {:?})",
                x.interface,
                d.restored
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "XDP SynGate: could not clean up what was left on {}: {e}",
                x.interface
            ),
        }
        let o = AttachOptions {
            mode: match x.mode {
                XdpMode::Off => Mode::Off,
                XdpMode::Always => Mode::Always,
                XdpMode::Auto => Mode::Auto,
            },
            t1: x.t1,
            t2: x.t2,
            top_sample_mask: x.top_sample.saturating_sub(1),
            manage_sysctls: x.manage_sysctls,
            generic: x.generic,
            ..AttachOptions::new(x.interface.clone(), x.ports.clone())
        };
        // The maps are opened now, as root: the pins are root's, and the
        // collector and refresh use them after privileges are dropped.
        let attached = tlsgate_xdp::attach_held(&o).and_then(|held| {
            let opened = XdpCollector::open(&root, held.link().clone())
                .and_then(|c| Ok((c, PinnedMaps::open(&root, &x.interface)?)));
            match opened {
                Ok((collector, maps)) => Ok((held, collector, maps)),
                Err(e) => {
                    if let Err(e) = held.release() {
                        tracing::warn!("XDP SynGate: {e}");
                    }
                    Err(e)
                }
            }
        });
        match attached {
            Ok((held, collector, maps)) => {
                for (name, old) in &held.attachment.changed {
                    tracing::info!("XDP SynGate: set {name} (was {old}; restored at exit)");
                }
                tracing::info!(
                    "XDP SynGate attached to {} (mode {}, ports {:?}, {})",
                    x.interface,
                    o.mode,
                    x.ports,
                    held.attachment.host
                );
                metrics.register_collector(Box::new(collector));
                Ok(Gate {
                    held: Some(held),
                    maps: Some(maps),
                })
            }
            Err(e) if x.optional => {
                tracing::error!(
                    "XDP SynGate could not attach to {}: {e}\nSERVING UNPROTECTED against SYN floods (xdp.optional = true)",
                    x.interface
                );
                metrics.register_collector(Box::new(XdpCollector::unattached(&x.interface)));
                Ok(Gate {
                    held: None,
                    maps: None,
                })
            }
            Err(e) => Err(StartError::Xdp {
                origin: config.origin.clone(),
                message: format!("cannot attach XDP SynGate to {}: {e}", x.interface),
            }),
        }
    }
}

impl Gate {
    /// Whether there is a SynGate to watch ([`Gate::watch`]).
    pub(crate) fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Asks the kernel whether SynGate is still attached; the link logs a
    /// warning naming the interface the first time it is not. Cheap (one
    /// `bpf(2)` call and one ioctl): the server calls it every second so
    /// that the loss is logged when it happens, not at the next scrape.
    pub(crate) fn watch(&self) {
        if let Some(held) = &self.held {
            if let Err(e) = held.link().state() {
                tracing::warn!("XDP SynGate on {}: {e}", held.iface());
            }
        }
    }

    /// At a reload (SIGHUP): when the kernel has detached SynGate because
    /// its interface went and an interface of that name exists again,
    /// reads that interface (MTU, MAC) and attaches the same program to it.
    fn reattach(&mut self) {
        let Some(held) = &mut self.held else { return };
        let iface = held.iface().to_string();
        match held.link().state() {
            Ok(LinkState::Replaced { .. } | LinkState::NotAttached) => {}
            Ok(LinkState::InterfaceGone) => {
                tracing::warn!(
                    "XDP SynGate on {iface} stays detached: there is no interface named {iface}"
                );
                return;
            }
            Ok(LinkState::Attached { .. }) | Err(_) => return,
        }
        // The new interface's MAC and MTU first, so that the program
        // answers for it from its first frame.
        if let Some(maps) = &mut self.maps {
            if let Err(e) = maps.refresh(&Sysctls::default()) {
                tracing::error!("XDP SynGate could not read the new {iface}: {e}");
            }
        }
        match held.reattach() {
            Ok(Some(state)) => {
                tracing::info!("XDP SynGate attached again to {iface}: {state}");
            }
            Ok(None) => {}
            Err(e) => tracing::error!(
                "XDP SynGate could not attach again to {iface}: {e}\nSERVING UNPROTECTED against SYN floods on {iface} until tlsgate restarts"
            ),
        }
    }

    /// Reads what SynGate takes from the host (the interface's MTU and MAC
    /// address, the TCP sysctls, the window scale the kernel gives a cookie
    /// socket) again and updates the running program: at a reload
    /// (SIGHUP), so that a lowered `tcp_rmem` or MTU is not over-advertised
    /// until the next restart. Every read is allowed after privileges are
    /// dropped, and the map is written through the descriptor opened at
    /// start.
    pub(crate) fn refresh(&mut self) {
        self.reattach();
        if self.held.as_ref().is_some_and(|h| {
            h.link()
                .state()
                .is_ok_and(|s| s == LinkState::InterfaceGone)
        }) {
            return;
        }
        let Some(maps) = &mut self.maps else { return };
        match maps.refresh(&Sysctls::default()) {
            Ok(Some((old, new))) => {
                tracing::info!("XDP SynGate now advertises {new} (was {old})")
            }
            Ok(None) => {}
            Err(e) => tracing::error!(
                "XDP SynGate could not re-read the host, still advertising what it read before: {e}"
            ),
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        let iface = held.iface().to_string();
        match held.release() {
            Ok(d) => {
                for (name, v) in d.restored {
                    tracing::info!("XDP SynGate: restored {name}={v}");
                }
                tracing::info!("XDP SynGate detached from {iface}");
            }
            // The program itself went with the link; what is left (pins,
            // sysctls: no permission after dropping privileges) is cleaned
            // up at the next start.
            Err(e) => tracing::warn!(
                "XDP SynGate detached from {iface}, but its pins or sysctls are left for the next start: {e}"
            ),
        }
    }
}
