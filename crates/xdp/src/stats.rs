//! Reading an attachment's counters, flood state and top sources from its
//! pinned maps (`tlsgate xdp stats`, and `/metrics` when tlsgate serves).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray};

use crate::abi::{Config, Counters, HostView, State, CONFIG_SIZE, COUNTERS_SIZE, STATE_SIZE};
use crate::gate::{chain, open_pinned, pin_dir};
use crate::link::LinkState;
use crate::sysctl::Sysctls;
use crate::{Error, Mode};

/// One protected port.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PortStats {
    /// The port.
    pub port: u16,
    /// Its counters, summed over CPUs.
    pub counters: Counters,
    /// Its flood-mode state.
    pub state: State,
}

/// A source address (an IPv4 /32 or an IPv6 /64) and the SYNs sampled from
/// it in flood mode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Source {
    /// `198.51.100.7/32` or `2001:db8:1:2::/64`.
    pub prefix: String,
    /// Sampled SYNs.
    pub syns: u64,
}

/// Everything `tlsgate xdp stats` shows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Stats {
    /// The interface.
    pub iface: String,
    /// Whether SynGate answers SYNs on the interface now (the counters
    /// stay readable after the kernel detached it).
    pub attached: bool,
    /// Where it stands: `attached (interface index 3)`, or why not.
    pub link: String,
    /// The mode.
    pub mode: Mode,
    /// The window scale advertised in SYN-ACKs.
    pub wscale: u32,
    /// Our MSS advertised in SYN-ACKs over IPv4.
    pub mss_ipv4: u16,
    /// Our MSS advertised in SYN-ACKs over IPv6.
    pub mss_ipv6: u16,
    /// SACK offered (the host allows it).
    pub sack: bool,
    /// Window scaling offered (the host allows it).
    pub window_scaling: bool,
    /// auto: t1 in milliseconds.
    pub t1_ms: u64,
    /// auto: t2 in milliseconds.
    pub t2_ms: u64,
    /// One in `top_sample_mask + 1` answered SYNs is sampled for the top
    /// sources.
    pub top_sample_mask: u32,
    /// The protected ports.
    pub ports: Vec<PortStats>,
    /// The most frequent sampled sources, most first (at most 10 of each
    /// family).
    pub top_sources: Vec<Source>,
}

/// The pinned maps of one attachment, open. Opening needs the rights on
/// the pins (root's, 0600); reading through the open descriptors does not,
/// so `tlsgate serve` opens them before it drops its privileges and reads
/// them at every scrape after.
pub struct PinnedMaps {
    iface: String,
    config: Array<MapData, [u8; CONFIG_SIZE]>,
    counters: PerCpuArray<MapData, [u8; COUNTERS_SIZE]>,
    state: Array<MapData, [u8; STATE_SIZE]>,
    top_v4: HashMap<MapData, u32, u64>,
    top_v6: HashMap<MapData, u64, u64>,
}

// aya's map types are not Debug; the interface names the maps.
impl std::fmt::Debug for PinnedMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMaps")
            .field("iface", &self.iface)
            .finish_non_exhaustive()
    }
}

impl PinnedMaps {
    /// Opens the maps of the attachment of `iface` under `pin_root`.
    pub fn open(pin_root: &Path, iface: &str) -> Result<PinnedMaps, Error> {
        let dir = pin_dir(pin_root, iface)?;
        if !dir.join("config").exists() {
            return Err(Error::NotAttached {
                iface: iface.into(),
                dir: dir.display().to_string(),
            });
        }
        Ok(PinnedMaps {
            iface: iface.into(),
            config: Array::try_from(Map::Array(open_pinned(&dir, "config")?))
                .map_err(|e| Error::bpf("config map", chain(&e)))?,
            counters: PerCpuArray::try_from(Map::PerCpuArray(open_pinned(&dir, "counters")?))
                .map_err(|e| Error::bpf("counters map", chain(&e)))?,
            state: Array::try_from(Map::Array(open_pinned(&dir, "state")?))
                .map_err(|e| Error::bpf("state map", chain(&e)))?,
            top_v4: HashMap::try_from(Map::LruHashMap(open_pinned(&dir, "top_v4")?))
                .map_err(|e| Error::bpf("top_v4 map", chain(&e)))?,
            top_v6: HashMap::try_from(Map::LruHashMap(open_pinned(&dir, "top_v6")?))
                .map_err(|e| Error::bpf("top_v6 map", chain(&e)))?,
        })
    }

    /// The configuration the program runs with.
    pub fn config(&self) -> Result<Config, Error> {
        let raw = self
            .config
            .get(&0, 0)
            .map_err(|e| Error::bpf("read the config map", chain(&e)))?;
        Config::decode(&raw).ok_or_else(|| Error::bpf("read the config map", "unknown mode"))
    }

    /// Replaces the configuration the program runs with.
    pub fn set_config(&mut self, config: &Config) -> Result<(), Error> {
        self.config
            .set(0, config.encode(), 0)
            .map_err(|e| Error::bpf("write the config map", chain(&e)))
    }

    /// Reads what the program takes from the host again ([`HostView::read`])
    /// and writes it to the program's configuration if it changed: the old
    /// and the new view, `None` when nothing changed.
    pub fn refresh(&mut self, sysctls: &Sysctls) -> Result<Option<(HostView, HostView)>, Error> {
        let mut config = self.config()?;
        let host = HostView::read(&self.iface, sysctls)?;
        if host == config.host {
            return Ok(None);
        }
        let old = std::mem::replace(&mut config.host, host);
        self.set_config(&config)?;
        Ok(Some((old, host)))
    }

    /// Reads the counters, flood state and top sources; `link` is where
    /// SynGate stands, as its holder or [`crate::pinned_state`] found.
    pub fn stats(&self, link: LinkState) -> Result<Stats, Error> {
        let config = self.config()?;
        let mut ports = Vec::new();
        for (slot, &port) in config.slot_ports.iter().enumerate() {
            if port == 0 {
                continue;
            }
            let slot = u32::try_from(slot).unwrap_or(u32::MAX);
            let per_cpu = self
                .counters
                .get(&slot, 0)
                .map_err(|e| Error::bpf("read the counters map", chain(&e)))?;
            let mut sum = Counters::default();
            for raw in per_cpu.iter() {
                sum.add(&Counters::decode(raw));
            }
            let raw = self
                .state
                .get(&slot, 0)
                .map_err(|e| Error::bpf("read the state map", chain(&e)))?;
            ports.push(PortStats {
                port,
                counters: sum,
                state: State::decode(&raw),
            });
        }

        let mut top_sources = Vec::new();
        let mut list: Vec<(u32, u64)> = self.top_v4.iter().filter_map(Result::ok).collect();
        list.sort_by_key(|e| std::cmp::Reverse(e.1));
        top_sources.extend(list.into_iter().take(10).map(|(k, n)| Source {
            // The key is the address as it sits in the packet (network order).
            prefix: format!("{}/32", Ipv4Addr::from(k.to_ne_bytes())),
            syns: n,
        }));
        let mut list: Vec<(u64, u64)> = self.top_v6.iter().filter_map(Result::ok).collect();
        list.sort_by_key(|e| std::cmp::Reverse(e.1));
        top_sources.extend(list.into_iter().take(10).map(|(k, n)| {
            let mut a = [0u8; 16];
            a[..8].copy_from_slice(&k.to_ne_bytes());
            Source {
                prefix: format!("{}/64", Ipv6Addr::from(a)),
                syns: n,
            }
        }));

        Ok(Stats {
            iface: self.iface.clone(),
            attached: link.is_attached(),
            link: link.to_string(),
            mode: config.mode,
            wscale: config.host.wscale,
            mss_ipv4: config.host.mss4,
            mss_ipv6: config.host.mss6,
            sack: config.host.sack,
            window_scaling: config.host.window_scaling,
            t1_ms: u64::try_from(config.t1.as_millis()).unwrap_or(u64::MAX),
            t2_ms: u64::try_from(config.t2.as_millis()).unwrap_or(u64::MAX),
            top_sample_mask: config.top_sample_mask,
            ports,
            top_sources,
        })
    }
}

/// Reads the stats of the attachment of `iface` under `pin_root`, and
/// whether it is still attached (root only).
pub fn stats(pin_root: &Path, iface: &str) -> Result<Stats, Error> {
    let maps = PinnedMaps::open(pin_root, iface)?;
    maps.stats(crate::link::pinned_state(pin_root, iface)?)
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.attached {
            writeln!(
                f,
                "XDP SynGate on {}: {}; the counters below are what it counted while attached",
                self.iface, self.link
            )?;
        }
        writeln!(
            f,
            "XDP SynGate on {}: mode {}, t1 {} ms, t2 {} ms, window scale {}{}, MSS {}/{} (IPv4/IPv6){}",
            self.iface,
            self.mode,
            self.t1_ms,
            self.t2_ms,
            self.wscale,
            if self.window_scaling { "" } else { " (not offered)" },
            self.mss_ipv4,
            self.mss_ipv6,
            if self.sack { "" } else { ", no SACK" },
        )?;
        writeln!(
            f,
            "{:>6} {:>12} {:>12} {:>12} {:>11} {:>8} {:>8} {:>9} {:>8} {:>6} {:>8} {:>6}",
            "port",
            "syns",
            "cookies",
            "passed",
            "no_listener",
            "errors",
            "martian",
            "malformed",
            "probes",
            "flood",
            "entered",
            "left"
        )?;
        for p in &self.ports {
            let c = &p.counters;
            writeln!(
                f,
                "{:>6} {:>12} {:>12} {:>12} {:>11} {:>8} {:>8} {:>9} {:>8} {:>6} {:>8} {:>6}",
                p.port,
                c.syn_seen,
                c.cookies,
                c.passed,
                c.no_listener,
                c.errors,
                c.martian,
                c.malformed,
                c.sampled,
                if p.state.flood { "yes" } else { "no" },
                p.state.flood_entered,
                p.state.flood_left
            )?;
        }
        if !self.top_sources.is_empty() {
            writeln!(
                f,
                "top sources in flood mode (1 SYN in {} sampled):",
                u64::from(self.top_sample_mask) + 1
            )?;
            for s in &self.top_sources {
                writeln!(f, "  {:<28} {}", s.prefix, s.syns)?;
            }
        }
        Ok(())
    }
}
