//! SynGate: SYN cookies answered at the driver, from XDP, for tlsgate's
//! own listeners.
//!
//! The program (`bpf/syngate.bpf.c`, compiled by clang in this crate's
//! build and embedded here) answers a SYN to a protected port with a
//! SYN-ACK whose sequence number is a cookie from the kernel's own helper,
//! so the kernel accepts the final ACK and makes the socket; everything
//! else passes. This crate owns loading it, configuring it, attaching it
//! to an interface, pinning it in bpffs so that it outlives the process
//! that attached it ([`gate`]), the sysctls it depends on ([`sysctl`]), the
//! layout it shares with user space ([`abi`]), reading its counters
//! ([`stats`]) and whether it is still attached ([`link`]). It does not own tlsgate's configuration file or its
//! `/metrics` (the server wires those).
//!
//! No `unsafe`: aya does the BPF syscalls, values cross as byte arrays.
#![forbid(unsafe_code)]

pub mod abi;
pub mod flood;
pub mod gate;
pub mod link;
pub mod metrics;
pub mod stats;
pub mod sysctl;

pub use abi::{HostView, Mode};
pub use gate::{
    attach, attach_held, cleanup_stale, detach, AttachOptions, Attachment, Detached, Held,
};
pub use link::{pinned_state, Link, LinkState};
pub use stats::{stats, Stats};

/// The compiled XDP object: the `syngate` program and, for the far end of
/// a veth pair in tests, `xdp_pass`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/syngate.bpf.o"));

/// `tlsgate bench synflood`'s program for the client end of its veth
/// pair (`bench_sink`): drops what goes to the bench's spoofed ranges,
/// 10.254.2.0/24 and fd00:254:2::/64, passes the rest.
pub static SINK_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sink.bpf.o"));

/// `EOPNOTSUPP`: a driver without native XDP (this crate has no libc).
const EOPNOTSUPP: i32 = rustix::io::Errno::OPNOTSUPP.raw_os_error();

/// Where SynGate pins its link and maps, one directory per interface.
pub const PIN_ROOT: &str = "/sys/fs/bpf/tlsgate";

/// What can go wrong; every variant names what it was doing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A sysctl could not be read or written.
    #[error("sysctl {name}: {detail}")]
    Sysctl {
        /// The sysctl.
        name: String,
        /// What failed.
        detail: String,
    },
    /// A sysctl does not have the value the mode needs.
    #[error(
        "{name} is {have}, but XDP mode {mode} needs {want} (set it with `sysctl -w {name}={want}`, \
         or let tlsgate set it and restore it on detach: --manage-sysctls / [xdp] manage_sysctls = true)"
    )]
    SysctlNeeded {
        /// The sysctl.
        name: &'static str,
        /// Its value.
        have: i64,
        /// The value needed.
        want: i32,
        /// The mode that needs it.
        mode: Mode,
    },
    /// The attach request itself is wrong (ports, interface name).
    #[error("{0}")]
    Invalid(String),
    /// The interface's MTU or MAC address could not be read.
    #[error("interface {iface}: {detail}")]
    Interface {
        /// The interface.
        iface: String,
        /// What failed.
        detail: String,
    },
    /// The program is attached, held by a running process (`tlsgate serve`
    /// with `[xdp]`) rather than by a pinned link: only that process may
    /// remove it.
    #[error(
        "XDP SynGate on {iface} is attached and held by a running process (tlsgate serve with [xdp]?), \
         not by a pinned link: stop that process to remove it; nothing changed (pins in {dir})"
    )]
    HeldByProcess {
        /// The interface.
        iface: String,
        /// Its pin directory.
        dir: String,
    },
    /// bpffs is not mounted where the pins go.
    #[error("{path} is not a BPF filesystem (mount it: mount -t bpf bpf /sys/fs/bpf)")]
    NoBpffs {
        /// The directory checked.
        path: String,
    },
    /// The interface already has SynGate attached (pins exist).
    #[error("XDP SynGate already attached to {iface} (pinned in {dir}); detach it first: tlsgate xdp detach --iface {iface}")]
    AlreadyAttached {
        /// The interface.
        iface: String,
        /// Its pin directory.
        dir: String,
    },
    /// Nothing is pinned for the interface.
    #[error("no XDP SynGate attached to {iface} (nothing pinned in {dir})")]
    NotAttached {
        /// The interface.
        iface: String,
        /// Its pin directory.
        dir: String,
    },
    /// The kernel refused the program; `log` is the end of the verifier's
    /// log.
    #[error("the kernel refused the XDP program ({io}); verifier log (last lines):\n{log}")]
    Verifier {
        /// The `BPF_PROG_LOAD` error.
        io: std::io::Error,
        /// The end of the verifier's log.
        log: String,
    },
    /// The kernel refused to attach the program to the interface.
    #[error("attach XDP to {iface} in {mode} mode: {detail}{hint}")]
    Attach {
        /// The interface.
        iface: String,
        /// `native (driver)` or `generic (skb)`.
        mode: &'static str,
        /// The kernel's error.
        detail: String,
        /// What to try instead, when there is something (`""` or `"; ..."`).
        hint: String,
    },
    /// Any other BPF step that failed, named.
    #[error("{step}: {detail}")]
    Bpf {
        /// What was being done (`load object`, `attach to eth0`, `pin ...`).
        step: String,
        /// The error.
        detail: String,
    },
}

impl Error {
    /// Attaching to `iface` failed with `e`; in native mode the error says
    /// how to ask for generic mode, which every Ethernet device runs.
    fn attach(iface: &str, generic: bool, e: &std::io::Error) -> Error {
        let hint = if generic {
            String::new()
        } else if e.raw_os_error() == Some(EOPNOTSUPP) {
            format!(
                "; the driver of {iface} has no native XDP (as bridges and many virtual devices): \
                 use generic mode, `generic = true` in [xdp] (`tlsgate xdp attach --generic`)"
            )
        } else {
            "; generic mode, `generic = true` in [xdp] (`tlsgate xdp attach --generic`), \
             runs on every Ethernet device"
                .to_string()
        };
        Error::Attach {
            iface: iface.into(),
            mode: if generic {
                "generic (skb)"
            } else {
                "native (driver)"
            },
            detail: e.to_string(),
            hint,
        }
    }

    fn bpf(step: impl Into<String>, e: impl std::fmt::Display) -> Error {
        Error::Bpf {
            step: step.into(),
            detail: e.to_string(),
        }
    }
}
