//! `tlsgate xdp`: attach, detach and read XDP SynGate by hand. The work is
//! in tlsgate-xdp.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tlsgate_xdp::{AttachOptions, Mode};

/// Subcommands of `tlsgate xdp`.
#[derive(clap::Subcommand)]
pub enum XdpCommand {
    /// Attach SynGate to an interface: SYNs to the ports are answered with
    /// SYN cookies from XDP. It stays attached (pinned in
    /// /sys/fs/bpf/tlsgate/IFACE/) after this command exits.
    Attach {
        /// The interface (in this network namespace).
        #[arg(long, value_name = "IF")]
        iface: String,
        /// A protected port; repeat for more (up to 16).
        #[arg(long = "port", value_name = "PORT", required = true)]
        ports: Vec<u16>,
        /// always: answer every SYN (needs net.ipv4.tcp_syncookies=2);
        /// auto: only under a flood, probing once per t1 (needs 1).
        #[arg(long, default_value = "auto")]
        mode: Mode,
        /// auto: peacetime probe interval.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
        t1: Duration,
        /// auto: flood mode ends after this long without a cookie.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
        t2: Duration,
        /// Count one in N SYNs answered in flood mode toward the top
        /// sources (a power of two).
        #[arg(long, value_name = "N", default_value_t = 16)]
        top_sample: u32,
        /// Set the sysctls the mode needs (restored on detach) instead of
        /// failing when they differ.
        #[arg(long)]
        manage_sysctls: bool,
        /// Generic (skb) XDP instead of the driver's native mode.
        #[arg(long)]
        generic: bool,
    },
    /// Detach SynGate from an interface and restore the sysctls attach set.
    Detach {
        /// The interface.
        #[arg(long, value_name = "IF")]
        iface: String,
    },
    /// Counters per port, flood state and top sources.
    Stats {
        /// The interface.
        #[arg(long, value_name = "IF")]
        iface: String,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn pin_root() -> PathBuf {
    PathBuf::from(tlsgate_xdp::PIN_ROOT)
}

/// Runs a `tlsgate xdp` subcommand; exit 2 on any error.
pub fn run(cmd: XdpCommand) -> ExitCode {
    let result = match cmd {
        XdpCommand::Attach {
            iface,
            ports,
            mode,
            t1,
            t2,
            top_sample,
            manage_sysctls,
            generic,
        } => {
            if !top_sample.is_power_of_two() {
                eprintln!("tlsgate: error: --top-sample must be a power of two, not {top_sample}");
                return ExitCode::from(2);
            }
            let o = AttachOptions {
                mode,
                t1,
                t2,
                top_sample_mask: top_sample - 1,
                manage_sysctls,
                generic,
                ..AttachOptions::new(iface.clone(), ports.clone())
            };
            tlsgate_xdp::attach(&o).map(|a| {
                for (name, old) in &a.changed {
                    println!("set {name} (was {old}; restored on detach)");
                }
                println!(
                    "XDP SynGate attached to {iface} (mode {mode}, ports {ports:?}, {}), pinned in {}",
                    a.host,
                    a.dir.display()
                );
            })
        }
        XdpCommand::Detach { iface } => tlsgate_xdp::detach(&pin_root(), &iface).map(|d| {
            for (name, v) in &d.restored {
                println!("restored {name}={v}");
            }
            println!("XDP SynGate detached from {iface}");
        }),
        XdpCommand::Stats { iface, json } => {
            tlsgate_xdp::stats(&pin_root(), &iface).and_then(|s| {
                if json {
                    serde_json::to_string_pretty(&s)
                        .map(|j| println!("{j}"))
                        .map_err(|e| tlsgate_xdp::Error::Invalid(e.to_string()))
                } else {
                    print!("{s}");
                    Ok(())
                }
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tlsgate: error: {e}");
            ExitCode::from(2)
        }
    }
}
