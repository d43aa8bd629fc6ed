//! The values the XDP program and user space share, mirroring
//! `bpf/syngate.h` byte for byte (native byte order, the C layout).
//!
//! They cross the map syscalls as byte arrays (`[u8; N]`, which aya accepts
//! as plain data) and are encoded and decoded here field by field, so no
//! `unsafe impl Pod` is needed. The tests pin every size and offset to the
//! header's `_Static_assert`s; change both together.

use std::time::Duration;

/// Protected ports per interface (`SG_MAX_PORTS`).
pub const MAX_PORTS: usize = 16;

/// `sizeof(struct sg_config)`.
pub const CONFIG_SIZE: usize = 80;
/// `sizeof(struct sg_counters)`.
pub const COUNTERS_SIZE: usize = 64;
/// `sizeof(struct sg_state)`.
pub const STATE_SIZE: usize = 40;

/// When the program answers SYNs itself (`SG_MODE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every SYN passes to the kernel (the program only counts).
    Off,
    /// Every SYN to a protected port is answered with a cookie.
    Always,
    /// Peacetime sampling: one SYN per `t1` is offered to the helper; once
    /// it issues a cookie (the listener's queue is full), every SYN is
    /// answered until `t2` passes without one.
    Auto,
}

impl Mode {
    fn code(self) -> u32 {
        match self {
            Mode::Off => 0,
            Mode::Always => 1,
            Mode::Auto => 2,
        }
    }

    fn from_code(c: u32) -> Option<Mode> {
        match c {
            0 => Some(Mode::Off),
            1 => Some(Mode::Always),
            2 => Some(Mode::Auto),
            _ => None,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Always => "always",
            Mode::Auto => "auto",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "always" => Ok(Mode::Always),
            "auto" => Ok(Mode::Auto),
            _ => Err(format!("unknown mode {s:?} (expected off, always or auto)")),
        }
    }
}

/// `SG_F_SACK`.
const F_SACK: u16 = 1;
/// `SG_F_WSCALE`.
const F_WSCALE: u16 = 2;

/// What the program takes from the host rather than from the SYN: read
/// at attach (in the attaching process's network namespace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostView {
    /// The receive window scale the kernel gives a cookie socket,
    /// advertised in SYN-ACKs.
    pub wscale: u32,
    /// Our MSS over IPv4, advertised in SYN-ACKs: the interface's MTU
    /// less 40.
    pub mss4: u16,
    /// Our MSS over IPv6: the interface's MTU less 60.
    pub mss6: u16,
    /// The interface's MAC address: frames to any other pass.
    pub if_mac: [u8; 6],
    /// SACK may be offered (`net.ipv4.tcp_sack`).
    pub sack: bool,
    /// Window scaling may be offered (`net.ipv4.tcp_window_scaling`).
    pub window_scaling: bool,
}

/// `struct sg_config`: the one entry of the `config` map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The mode.
    pub mode: Mode,
    /// What was read from the host.
    pub host: HostView,
    /// Peacetime sampling interval (auto).
    pub t1: Duration,
    /// Flood mode ends after this long without a cookie (auto).
    pub t2: Duration,
    /// A SYN answered in flood mode counts toward the top sources when
    /// `random & mask == 0`.
    pub top_sample_mask: u32,
    /// The port of each slot, 0 for unused ones.
    pub slot_ports: [u16; MAX_PORTS],
    /// `net.ipv4.tcp_syncookies` before attach changed it.
    pub saved_syncookies: Option<i32>,
    /// `net.ipv4.tcp_timestamps` before attach changed it.
    pub saved_timestamps: Option<i32>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl Config {
    /// The C layout.
    pub fn encode(&self) -> [u8; CONFIG_SIZE] {
        let mut b = [0u8; CONFIG_SIZE];
        b[0..4].copy_from_slice(&self.mode.code().to_ne_bytes());
        b[4..8].copy_from_slice(&self.host.wscale.to_ne_bytes());
        b[8..16].copy_from_slice(&nanos(self.t1).to_ne_bytes());
        b[16..24].copy_from_slice(&nanos(self.t2).to_ne_bytes());
        b[24..28].copy_from_slice(&self.top_sample_mask.to_ne_bytes());
        b[28..30].copy_from_slice(&self.host.mss4.to_ne_bytes());
        b[30..32].copy_from_slice(&self.host.mss6.to_ne_bytes());
        for (i, p) in self.slot_ports.iter().enumerate() {
            b[32 + 2 * i..34 + 2 * i].copy_from_slice(&p.to_ne_bytes());
        }
        b[64..68].copy_from_slice(&self.saved_syncookies.unwrap_or(-1).to_ne_bytes());
        b[68..72].copy_from_slice(&self.saved_timestamps.unwrap_or(-1).to_ne_bytes());
        b[72..78].copy_from_slice(&self.host.if_mac);
        let flags = if self.host.sack { F_SACK } else { 0 }
            | if self.host.window_scaling {
                F_WSCALE
            } else {
                0
            };
        b[78..80].copy_from_slice(&flags.to_ne_bytes());
        b
    }

    /// From the C layout; `None` for an unknown mode.
    pub fn decode(b: &[u8; CONFIG_SIZE]) -> Option<Config> {
        let saved = |at| Some(i32::from_ne_bytes(get(b, at))).filter(|v| *v >= 0);
        let mut slot_ports = [0u16; MAX_PORTS];
        for (i, p) in slot_ports.iter_mut().enumerate() {
            *p = u16::from_ne_bytes(get(b, 32 + 2 * i));
        }
        let flags = u16::from_ne_bytes(get(b, 78));
        Some(Config {
            mode: Mode::from_code(u32::from_ne_bytes(get(b, 0)))?,
            host: HostView {
                wscale: u32::from_ne_bytes(get(b, 4)),
                mss4: u16::from_ne_bytes(get(b, 28)),
                mss6: u16::from_ne_bytes(get(b, 30)),
                if_mac: get(b, 72),
                sack: flags & F_SACK != 0,
                window_scaling: flags & F_WSCALE != 0,
            },
            t1: Duration::from_nanos(u64::from_ne_bytes(get(b, 8))),
            t2: Duration::from_nanos(u64::from_ne_bytes(get(b, 16))),
            top_sample_mask: u32::from_ne_bytes(get(b, 24)),
            slot_ports,
            saved_syncookies: saved(64),
            saved_timestamps: saved(68),
        })
    }
}

/// `struct sg_counters`, one port slot, summed over CPUs. Every SYN seen is
/// answered or passed: `syn_seen == cookies + passed`; `no_listener`,
/// `errors`, `martian` and `malformed` are passed SYNs that were not
/// answered, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// SYNs to the port.
    pub syn_seen: u64,
    /// SYN-ACKs with a cookie sent from XDP.
    pub cookies: u64,
    /// SYNs passed to the kernel.
    pub passed: u64,
    /// Passed: no listener (or the lookup found a non-listening socket).
    pub no_listener: u64,
    /// Passed: the helper failed or the reply could not be built.
    pub errors: u64,
    /// auto: peacetime probes offered to the helper.
    pub sampled: u64,
    /// Passed: from or to an address the kernel never answers (multicast,
    /// broadcast, loopback, unspecified, IPv4-mapped), for it to drop.
    pub martian: u64,
    /// Passed: the IP length does not hold the TCP header or runs past
    /// the frame, for the kernel to drop.
    pub malformed: u64,
}

impl Counters {
    /// One CPU's value from the C layout.
    pub fn decode(b: &[u8; COUNTERS_SIZE]) -> Counters {
        let f = |i: usize| u64::from_ne_bytes(get(b, 8 * i));
        Counters {
            syn_seen: f(0),
            cookies: f(1),
            passed: f(2),
            no_listener: f(3),
            errors: f(4),
            sampled: f(5),
            martian: f(6),
            malformed: f(7),
        }
    }

    /// Adds another CPU's counts.
    pub fn add(&mut self, o: &Counters) {
        self.syn_seen += o.syn_seen;
        self.cookies += o.cookies;
        self.passed += o.passed;
        self.no_listener += o.no_listener;
        self.errors += o.errors;
        self.sampled += o.sampled;
        self.martian += o.martian;
        self.malformed += o.malformed;
    }
}

/// `struct sg_state`: one port slot's flood-mode state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct State {
    /// auto: the last peacetime probe (CLOCK_MONOTONIC, ns).
    pub last_try_ns: u64,
    /// The last cookie issued (CLOCK_MONOTONIC, ns).
    pub last_cookie_ns: u64,
    /// Transitions into flood mode.
    pub flood_entered: u64,
    /// Transitions out of flood mode.
    pub flood_left: u64,
    /// In flood mode now (as the program last saw it: it leaves flood mode
    /// lazily, at the first SYN after `t2`).
    pub flood: bool,
}

impl State {
    /// From the C layout.
    pub fn decode(b: &[u8; STATE_SIZE]) -> State {
        let f = |i: usize| u64::from_ne_bytes(get(b, 8 * i));
        State {
            last_try_ns: f(0),
            last_cookie_ns: f(1),
            flood_entered: f(2),
            flood_left: f(3),
            flood: u32::from_ne_bytes(get(b, 32)) != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of syngate.h, field by field.
    #[test]
    fn config_layout_matches_the_header() {
        let c = Config {
            mode: Mode::Auto,
            host: HostView {
                wscale: 10,
                mss4: 1460,
                mss6: 1440,
                if_mac: [2, 0, 0x5e, 0, 0x53, 1],
                sack: false,
                window_scaling: true,
            },
            t1: Duration::from_millis(1),
            t2: Duration::from_secs(2),
            top_sample_mask: 15,
            slot_ports: [443, 8443, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9],
            saved_syncookies: Some(1),
            saved_timestamps: None,
        };
        let b = c.encode();
        assert_eq!(&b[0..4], &2u32.to_ne_bytes());
        assert_eq!(&b[4..8], &10u32.to_ne_bytes());
        assert_eq!(&b[8..16], &1_000_000u64.to_ne_bytes());
        assert_eq!(&b[16..24], &2_000_000_000u64.to_ne_bytes());
        assert_eq!(&b[24..28], &15u32.to_ne_bytes());
        assert_eq!(&b[28..30], &1460u16.to_ne_bytes());
        assert_eq!(&b[30..32], &1440u16.to_ne_bytes());
        assert_eq!(&b[32..34], &443u16.to_ne_bytes());
        assert_eq!(&b[62..64], &9u16.to_ne_bytes());
        assert_eq!(&b[64..68], &1i32.to_ne_bytes());
        assert_eq!(&b[68..72], &(-1i32).to_ne_bytes());
        assert_eq!(&b[72..78], &[2, 0, 0x5e, 0, 0x53, 1]);
        assert_eq!(&b[78..80], &2u16.to_ne_bytes());
        assert_eq!(Config::decode(&b), Some(c));
    }

    #[test]
    fn counters_and_state_layout() {
        let mut b = [0u8; COUNTERS_SIZE];
        for i in 0..8 {
            b[8 * i..8 * i + 8].copy_from_slice(&(i as u64 + 1).to_ne_bytes());
        }
        let c = Counters::decode(&b);
        assert_eq!((c.syn_seen, c.sampled), (1, 6));
        assert_eq!((c.martian, c.malformed), (7, 8));
        let mut s = [0u8; STATE_SIZE];
        s[24..32].copy_from_slice(&7u64.to_ne_bytes());
        s[32..36].copy_from_slice(&1u32.to_ne_bytes());
        let st = State::decode(&s);
        assert_eq!((st.flood_left, st.flood), (7, true));
    }

    #[test]
    fn header_sizes_are_the_ones_asserted_here() {
        let h = include_str!("../bpf/syngate.h");
        for (name, size) in [
            ("sg_config", CONFIG_SIZE),
            ("sg_counters", COUNTERS_SIZE),
            ("sg_state", STATE_SIZE),
        ] {
            let line = format!("sizeof(struct {name}) == {size}");
            assert!(h.contains(&line), "syngate.h must assert {line}");
        }
        assert!(h.contains(&format!("#define SG_MAX_PORTS {MAX_PORTS}")));
        assert!(h.contains(&format!("#define SG_F_SACK {F_SACK} ")));
        assert!(h.contains(&format!("#define SG_F_WSCALE {F_WSCALE} ")));
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [Mode::Off, Mode::Always, Mode::Auto] {
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
            assert_eq!(Mode::from_code(m.code()), Some(m));
        }
        assert!("sometimes".parse::<Mode>().is_err());
    }
}
