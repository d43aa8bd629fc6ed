//! `[xdp]`: validation of the XDP SynGate settings into [`Xdp`]. What the
//! settings do is tlsgate-xdp's business; this module only checks them.

use std::time::Duration;

use crate::file::XdpSection;
use crate::validate::Checker;
use crate::{ConfigError, Listener};

/// Most ports one interface can protect (the program's port slots).
pub const MAX_PORTS: usize = 16;

/// `xdp.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Attached, but every SYN passes to the kernel (counted only).
    Off,
    /// Every SYN to a protected port is answered with a cookie.
    Always,
    /// Cookies only under a flood (peacetime probes every t1).
    Auto,
}

/// The validated `[xdp]` table (see [`XdpSection`] for meanings).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each field mirrors the documented file key of the same name.
pub struct Xdp {
    pub interface: String,
    pub mode: XdpMode,
    /// Resolved: the listeners' ports when the file gave none.
    pub ports: Vec<u16>,
    pub t1: Duration,
    pub t2: Duration,
    pub top_sample: u32,
    pub optional: bool,
    pub manage_sysctls: bool,
    pub generic: bool,
}

pub(crate) fn validate(
    c: &Checker<'_>,
    section: Option<&XdpSection>,
    listeners: &[Listener],
) -> Result<Option<Xdp>, ConfigError> {
    let Some(x) = section else { return Ok(None) };
    let interface = x.interface.trim().to_string();
    // What the kernel takes (dev_valid_name: no '/', ':' or white space),
    // less what /metrics would have to escape in its `interface` label: a
    // name with a quote or backslash is refused here rather than exported.
    if interface.is_empty()
        || interface.len() > 15
        || !interface
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b'"' | b'\\'))
        || interface == "."
        || interface == ".."
    {
        return Err(c.err(
            "xdp.interface",
            format!(
                "expected a network interface name like \"eth0\" (1 to 15 visible ASCII bytes, none of / : \" \\), found {:?}",
                x.interface
            ),
        ));
    }
    let mode = match x.mode.as_str() {
        "off" => XdpMode::Off,
        "always" => XdpMode::Always,
        "auto" => XdpMode::Auto,
        m => {
            return Err(c.err(
                "xdp.mode",
                format!("expected \"auto\", \"always\" or \"off\", found {m:?}"),
            ))
        }
    };
    let mut ports = Vec::new();
    if x.ports.is_empty() {
        for a in listeners.iter().flat_map(|l| &l.addrs) {
            if !ports.contains(&a.port()) {
                ports.push(a.port());
            }
        }
    } else {
        for &p in &x.ports {
            if p == 0 || ports.contains(&p) {
                return Err(c.err(
                    "xdp.ports",
                    format!("expected distinct ports from 1 to 65535, found {p} (zero or twice)"),
                ));
            }
            ports.push(p);
        }
    }
    if ports.contains(&0) {
        return Err(c.err(
            "xdp.ports",
            "a listener on port 0 (any free port) cannot be protected; list the ports",
        ));
    }
    if ports.len() > MAX_PORTS {
        return Err(c.err(
            "xdp.ports",
            format!(
                "at most {MAX_PORTS} ports per interface, found {}",
                ports.len()
            ),
        ));
    }
    let positive = |key: &str, d: Duration| c.positive(key, d);
    if !x.top_sample.is_power_of_two() {
        return Err(c.err(
            "xdp.top_sample",
            format!(
                "expected a power of two (1, 2, 4, … 65536), found {}",
                x.top_sample
            ),
        ));
    }
    Ok(Some(Xdp {
        interface,
        mode,
        ports,
        t1: positive("xdp.t1", x.t1)?,
        t2: positive("xdp.t2", x.t2)?,
        top_sample: c.within("xdp.top_sample", x.top_sample, 1, 1 << 16)?,
        optional: x.optional,
        manage_sysctls: x.manage_sysctls,
        generic: x.generic,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use crate::{load, Config, ConfigError, Overrides};

    use super::*;

    fn load_text(xdp: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        std::fs::write(dir.path().join("c.pem"), "x").unwrap();
        std::fs::write(dir.path().join("k.pem"), "x").unwrap();
        let text = format!(
            "[[listener]]\nlisten = [\"127.0.0.1:8443\", \"[::1]:8443\", \"127.0.0.1:443\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n{xdp}"
        );
        let p = dir.path().join("tlsgate.toml");
        std::fs::write(&p, text).unwrap();
        load(Some(&p), &Overrides::default(), Path::new("/nonexistent"))
    }

    #[test]
    fn absent_means_off_and_ports_default_to_the_listeners() {
        assert_eq!(load_text("").unwrap().xdp, None);
        let x = load_text("[xdp]\ninterface = \"eth0\"\n")
            .unwrap()
            .xdp
            .unwrap();
        assert_eq!(x.ports, vec![8443, 443]);
        assert_eq!(x.mode, XdpMode::Auto);
        assert_eq!(
            (x.t1, x.t2),
            (Duration::from_secs(1), Duration::from_secs(10))
        );
        assert!(!x.optional && !x.manage_sysctls);
        let x = load_text(
            "[xdp]\ninterface = \"eth0\"\nmode = \"always\"\nports = [443]\nt1 = \"20ms\"\noptional = true\n",
        )
        .unwrap()
        .xdp
        .unwrap();
        assert_eq!(
            (x.mode, x.ports.as_slice(), x.t1),
            (XdpMode::Always, &[443][..], Duration::from_millis(20))
        );
        assert!(x.optional);
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("[xdp]\n", "xdp.interface"),
            ("[xdp]\ninterface = \"a/b\"\n", "xdp.interface"),
            ("[xdp]\ninterface = \"a\\\"b\"\n", "xdp.interface"),
            ("[xdp]\ninterface = \"a\\\\b\"\n", "xdp.interface"),
            ("[xdp]\ninterface = \"a\\nb\"\n", "xdp.interface"),
            ("[xdp]\ninterface = \"a:1\"\n", "xdp.interface"),
            (
                "[xdp]\ninterface = \"eth0\"\nmode = \"sometimes\"\n",
                "xdp.mode",
            ),
            (
                "[xdp]\ninterface = \"eth0\"\nports = [443, 443]\n",
                "xdp.ports",
            ),
            ("[xdp]\ninterface = \"eth0\"\nt2 = \"0s\"\n", "xdp.t2"),
            (
                "[xdp]\ninterface = \"eth0\"\ntop_sample = 3\n",
                "xdp.top_sample",
            ),
            ("[xdp]\ninterface = \"eth0\"\nfast = true\n", "xdp"),
        ] {
            let e = load_text(text).unwrap_err();
            assert!(e.key.starts_with(key), "{text:?}: {e}");
        }
    }
}
