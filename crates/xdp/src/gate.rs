//! Attaching SynGate to an interface and detaching it.
//!
//! [`attach`] loads the embedded program, writes its configuration and
//! port slots, attaches it through a BPF link and pins the link and every
//! map in `<pin root>/<iface>/`: the program stays attached after the
//! process exits, and `tlsgate xdp stats`/`detach` find it there. The
//! configuration map also records the port of each slot and the sysctl
//! values attach changed, so the pin directory describes the attachment by
//! itself. [`detach`] unpins the link (the kernel detaches the program when
//! its last reference goes), removes the pins and restores the sysctls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::fd::{AsFd, OwnedFd};

use aya::maps::{Array, Map, MapData};
use aya::programs::links::PinnedLink;
use aya::programs::{ProgramError, Xdp};
use aya::EbpfLoader;

use crate::abi::{Config, HostView, Mode, CONFIG_SIZE, MAX_PORTS};
use crate::link::{Link, LinkState};
use crate::sysctl::{Sysctls, SACK, SYNCOOKIES, TIMESTAMPS, WINDOW_SCALING};
use crate::{Error, OBJECT, PIN_ROOT};

/// The maps pinned beside the link, by their names in the program.
pub const MAPS: [&str; 6] = ["config", "ports", "counters", "state", "top_v4", "top_v6"];

/// Every pin an attachment may have.
const ALL_PINS: [&str; 7] = [
    "config", "ports", "counters", "state", "top_v4", "top_v6", "link",
];

/// `BPF_FS_MAGIC`, statfs' type of a BPF filesystem.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// What to attach where.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The interface (in the caller's network namespace).
    pub iface: String,
    /// Protected ports, 1 to [`MAX_PORTS`].
    pub ports: Vec<u16>,
    /// The mode.
    pub mode: Mode,
    /// auto: peacetime sampling interval.
    pub t1: Duration,
    /// auto: flood mode ends after this long without a cookie.
    pub t2: Duration,
    /// Top sources count a SYN answered in flood mode when
    /// `random & mask == 0` (0: every one; 15: one in 16).
    pub top_sample_mask: u32,
    /// Set the sysctls the mode needs (and restore them on detach) instead
    /// of failing when they differ.
    pub manage_sysctls: bool,
    /// Generic (skb) XDP instead of the driver's native mode.
    pub generic: bool,
    /// Where the per-interface pin directories go ([`PIN_ROOT`]).
    pub pin_root: PathBuf,
}

impl AttachOptions {
    /// Defaults for `iface` and `ports`: auto, t1 1 s, t2 10 s, one source
    /// in 16 sampled, sysctls checked but not set, native XDP.
    pub fn new(iface: impl Into<String>, ports: Vec<u16>) -> AttachOptions {
        AttachOptions {
            iface: iface.into(),
            ports,
            mode: Mode::Auto,
            t1: Duration::from_secs(1),
            t2: Duration::from_secs(10),
            top_sample_mask: 15,
            manage_sysctls: false,
            generic: false,
            pin_root: PathBuf::from(PIN_ROOT),
        }
    }
}

/// Our MSS for an interface MTU, `(IPv4, IPv6)`, as the kernel's own
/// SYN-ACK advertises it (the route's advmss): `mtu - 40` but at least 256
/// (`ip_rt_min_advmss`), and `mtu - 60` but at least 1220
/// (`ip6_rt_min_advmss`).
pub fn advmss(mtu: u32) -> (u16, u16) {
    let clamp = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
    (
        clamp(mtu.saturating_sub(40).max(256)),
        clamp(mtu.saturating_sub(60).max(1220)),
    )
}

impl HostView {
    /// Reads the interface (MTU, MAC address) and the sysctls.
    pub fn read(iface: &str, sysctls: &Sysctls) -> Result<HostView, Error> {
        let failed = |e: std::io::Error| Error::Interface {
            iface: iface.into(),
            detail: e.to_string(),
        };
        let (mss4, mss6) = advmss(tlsgate_sys::netdev::mtu(iface).map_err(failed)?);
        Ok(HostView {
            wscale: sysctls.cookie_wscale()?,
            mss4,
            mss6,
            if_mac: tlsgate_sys::netdev::mac(iface).map_err(failed)?,
            sack: sysctls.enabled(SACK)?,
            window_scaling: sysctls.enabled(WINDOW_SCALING)?,
        })
    }
}

impl std::fmt::Display for HostView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.if_mac;
        write!(
            f,
            "window scale {}, MSS {}/{} (IPv4/IPv6), SACK {}, window scaling {}, MAC {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            self.wscale,
            self.mss4,
            self.mss6,
            if self.sack { "on" } else { "off" },
            if self.window_scaling { "on" } else { "off" },
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// An attachment made by [`attach`] or [`attach_held`].
#[derive(Clone, Debug)]
pub struct Attachment {
    /// The pin directory.
    pub dir: PathBuf,
    /// What was read from the host.
    pub host: HostView,
    /// Sysctls changed, with their old values.
    pub changed: Vec<(&'static str, i32)>,
}

/// What [`detach`] did.
#[derive(Clone, Debug)]
pub struct Detached {
    /// Sysctls restored, with the values written back.
    pub restored: Vec<(&'static str, i32)>,
}

/// The pin directory of `iface` under `root`.
pub fn pin_dir(root: &Path, iface: &str) -> Result<PathBuf, Error> {
    let ok = !iface.is_empty()
        && iface.len() <= 15
        && !iface.contains(['/', '\0'])
        && iface != "."
        && iface != "..";
    if !ok {
        return Err(Error::Invalid(format!("bad interface name {iface:?}")));
    }
    Ok(root.join(iface))
}

/// Whether SynGate is pinned for `iface` under `root`: its pin directory
/// exists. Not only its `link`: `tlsgate serve` holds its link and pins
/// only the maps.
pub fn is_attached(root: &Path, iface: &str) -> bool {
    pin_dir(root, iface).is_ok_and(|d| d.exists())
}

/// An error with its sources, `a: b: c` (aya puts the errno in a source).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn check_bpffs(root: &Path) -> Result<(), Error> {
    // The root itself may not exist yet: check the nearest existing parent.
    let mut p = root;
    while !p.exists() {
        p = p.parent().unwrap_or(Path::new("/"));
    }
    let fs = rustix::fs::statfs(p).map_err(|e| Error::bpf(format!("statfs {}", p.display()), e))?;
    #[allow(clippy::unnecessary_cast, reason = "f_type's width differs by arch")]
    if fs.f_type as i64 != BPF_FS_MAGIC {
        return Err(Error::NoBpffs {
            path: p.display().to_string(),
        });
    }
    Ok(())
}

fn validate_ports(ports: &[u16]) -> Result<[u16; MAX_PORTS], Error> {
    if ports.is_empty() || ports.len() > MAX_PORTS {
        return Err(Error::Invalid(format!(
            "{} ports given; SynGate protects 1 to {MAX_PORTS}",
            ports.len()
        )));
    }
    let mut slots = [0u16; MAX_PORTS];
    for (i, &p) in ports.iter().enumerate() {
        if p == 0 {
            return Err(Error::Invalid("port 0 cannot be protected".into()));
        }
        if ports[..i].contains(&p) {
            return Err(Error::Invalid(format!("port {p} given twice")));
        }
        slots[i] = p;
    }
    Ok(slots)
}

/// The last lines of a verifier log: the reason is at its end, and a
/// program that hits the complexity limit logs a million instructions.
fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn load_error(e: ProgramError) -> Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => Error::Verifier {
            io: io_error,
            log: log_tail(&verifier_log.to_string(), 40),
        },
        other => Error::bpf("load the XDP program", chain(&other)),
    }
}

/// Restores sysctls on every early return of [`attach`] after it changed
/// them.
struct Restore<'a> {
    sysctls: &'a Sysctls,
    changed: Vec<(&'static str, i32)>,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        for (name, old) in &self.changed {
            if let Err(e) = self.sysctls.write(name, *old) {
                tracing::warn!("could not restore {name}={old}: {e}");
            }
        }
    }
}

/// Loads, configures, attaches and pins SynGate on `o.iface`, checking (or,
/// with `manage_sysctls`, setting) the sysctls its mode needs first. The
/// link is pinned: the program stays attached after this process exits.
pub fn attach(o: &AttachOptions) -> Result<Attachment, Error> {
    attach_with(o, &Sysctls::default(), true).map(|(a, _)| a)
}

/// The program as loaded and its link, kept by [`Held`].
#[derive(Debug)]
pub struct Loaded {
    ebpf: aya::Ebpf,
    link: OwnedFd,
}

/// SynGate attached for as long as this value (this process) lives: the
/// link is not pinned, only held, so the kernel detaches the program when
/// the process exits, whether it stops cleanly or crashes. The maps are
/// pinned (for `tlsgate xdp stats`); [`Held::release`] removes them and
/// restores the sysctls, and [`cleanup_stale`] does it at the next start
/// after a crash.
///
/// The loaded program (and its maps) stay open with the link: when the
/// kernel detaches the link because the interface went, [`Held::reattach`]
/// attaches the same program, counters and all, to the interface of that
/// name that exists then.
#[derive(Debug)]
pub struct Held {
    /// What was attached.
    pub attachment: Attachment,
    link: Link,
    ebpf: Option<aya::Ebpf>,
    generic: bool,
    pin_root: PathBuf,
    iface: String,
}

/// Attaches SynGate to `o.iface` for the life of this process (see
/// [`Held`]).
pub fn attach_held(o: &AttachOptions) -> Result<Held, Error> {
    let (attachment, loaded) = attach_with(o, &Sysctls::default(), false)?;
    let loaded = loaded.ok_or_else(|| Error::bpf("attach", "no link returned"))?;
    Ok(Held {
        attachment,
        link: Link::new(&o.iface, loaded.link),
        ebpf: Some(loaded.ebpf),
        generic: o.generic,
        pin_root: o.pin_root.clone(),
        iface: o.iface.clone(),
    })
}

impl Held {
    /// Detaches the program, removes the pins and restores the sysctls.
    pub fn release(mut self) -> Result<Detached, Error> {
        self.link.replace(None);
        drop(self.ebpf.take());
        // Its own pins: the program this link held may outlive the drop for
        // a moment, and nobody else holds it.
        detach_checked(&self.pin_root, &self.iface, &Sysctls::default(), false)
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The link, for readers of its state.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Attaches the program again when the kernel has detached it (its
    /// interface went) and an interface of its name exists now: the new
    /// state, or `None` when there was nothing to do (still attached, or
    /// no interface of that name yet). Needs `CAP_NET_ADMIN` and
    /// `CAP_BPF` (or root), like the first attach.
    pub fn reattach(&mut self) -> Result<Option<LinkState>, Error> {
        match self.link.state()? {
            LinkState::Attached { .. } | LinkState::InterfaceGone => return Ok(None),
            LinkState::Replaced { .. } | LinkState::NotAttached => {}
        }
        let ebpf = self
            .ebpf
            .as_mut()
            .ok_or_else(|| Error::bpf("attach again", "the program was released"))?;
        let fd = attach_link(ebpf, &self.iface, self.generic)?;
        self.link.replace(Some(fd));
        self.link.state().map(Some)
    }

    /// The pin root.
    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }
}

/// Removes what a previous SynGate on `iface` left behind (a process that
/// crashed leaves its pinned maps and changed sysctls; one attached by
/// `tlsgate xdp attach` leaves its pinned link): detaches, unpins,
/// restores. `None` when there was nothing; an error, and nothing changed,
/// when a running process still holds the program (see [`detach_with`]).
pub fn cleanup_stale(pin_root: &Path, iface: &str) -> Result<Option<Detached>, Error> {
    if !pin_dir(pin_root, iface)?.exists() {
        return Ok(None);
    }
    detach(pin_root, iface).map(Some)
}

/// [`attach`] with the sysctls read and written under `sysctls`; with
/// `pin_link` false the link (and the loaded program) is returned instead
/// of pinned.
pub fn attach_with(
    o: &AttachOptions,
    sysctls: &Sysctls,
    pin_link: bool,
) -> Result<(Attachment, Option<Loaded>), Error> {
    let dir = pin_dir(&o.pin_root, &o.iface)?;
    let slot_ports = validate_ports(&o.ports)?;
    if is_attached(&o.pin_root, &o.iface) {
        return Err(Error::AlreadyAttached {
            iface: o.iface.clone(),
            dir: dir.display().to_string(),
        });
    }
    check_bpffs(&o.pin_root)?;
    let mut restore = Restore {
        sysctls,
        changed: sysctls.ensure(o.mode, o.manage_sysctls)?,
    };
    let host = HostView::read(&o.iface, sysctls)?;
    if !host.sack || !host.window_scaling {
        tracing::info!(
            "XDP SynGate on {}: SYN-ACKs offer no {} ({} = 0 on this host)",
            o.iface,
            if host.sack { "window scaling" } else { "SACK" },
            if host.sack { WINDOW_SCALING } else { SACK },
        );
    }
    let saved = |name| {
        restore
            .changed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    };
    let config = Config {
        mode: o.mode,
        host,
        t1: o.t1,
        t2: o.t2,
        top_sample_mask: o.top_sample_mask,
        slot_ports,
        saved_syncookies: saved(SYNCOOKIES),
        saved_timestamps: saved(TIMESTAMPS),
    };

    let mut ebpf = load_object(OBJECT)?;
    {
        let mut cfg: Array<&mut MapData, [u8; CONFIG_SIZE]> = map_mut(&mut ebpf, "config")?;
        cfg.set(0, config.encode(), 0)
            .map_err(|e| Error::bpf("write the config map", chain(&e)))?;
    }
    {
        let mut ports: Array<&mut MapData, u32> = map_mut(&mut ebpf, "ports")?;
        for (slot, &p) in o.ports.iter().enumerate() {
            let v = u32::try_from(slot + 1).unwrap_or(u32::MAX);
            ports
                .set(u32::from(p), v, 0)
                .map_err(|e| Error::bpf("write the ports map", chain(&e)))?;
        }
    }

    std::fs::create_dir_all(&o.pin_root)
        .map_err(|e| Error::bpf(format!("mkdir {}", o.pin_root.display()), e))?;
    // The directory is this attachment's claim on the interface: one that
    // appeared since the check above is another's, and stays untouched.
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::AlreadyAttached {
                iface: o.iface.clone(),
                dir: dir.display().to_string(),
            })
        }
        Err(e) => return Err(Error::bpf(format!("mkdir {}", dir.display()), e)),
    }
    let mut pinned = Vec::new();
    let result = (|| -> Result<Option<OwnedFd>, Error> {
        for name in MAPS {
            let map = ebpf
                .map(name)
                .ok_or_else(|| Error::bpf(format!("find map {name}"), "not in the object"))?;
            map.pin(dir.join(name))
                .map_err(|e| Error::bpf(format!("pin map {name}"), chain(&e)))?;
            pinned.push(name);
        }
        let link = attach_link(&mut ebpf, &o.iface, o.generic)?;
        if !pin_link {
            return Ok(Some(link));
        }
        tlsgate_sys::bpf::pin(link.as_fd(), &dir.join("link"))
            .map_err(|e| Error::bpf("pin the XDP link (BPF_OBJ_PIN)", e))?;
        Ok(None)
    })();
    let loaded = match result {
        Ok(link) => link.map(|link| Loaded { ebpf, link }),
        Err(e) => {
            // Only what this call pinned, in the directory it made.
            remove_pins(&dir, &pinned);
            return Err(e);
        }
    };
    let changed = std::mem::take(&mut restore.changed);
    Ok((Attachment { dir, host, changed }, loaded))
}

/// Attaches the loaded `syngate` program to `iface` through a new BPF link
/// (the kernel's `BPF_LINK_CREATE`; this process holds the descriptor), in
/// generic or the driver's native mode.
fn attach_link(ebpf: &mut aya::Ebpf, iface: &str, generic: bool) -> Result<OwnedFd, Error> {
    let prog = syngate(ebpf)?
        .fd()
        .map_err(|e| Error::bpf("program syngate", chain(&e)))?;
    let ifindex = tlsgate_sys::netdev::ifindex(iface).map_err(|e| Error::Interface {
        iface: iface.into(),
        detail: e.to_string(),
    })?;
    tlsgate_sys::bpf::xdp_link_create(prog.as_fd(), ifindex, generic)
        .map_err(|e| Error::attach(iface, generic, &e))
}

/// The `syngate` program of a loaded object.
fn syngate(ebpf: &mut aya::Ebpf) -> Result<&mut Xdp, Error> {
    ebpf.program_mut("syngate")
        .ok_or_else(|| Error::bpf("find program syngate", "not in the object"))?
        .try_into()
        .map_err(|e: ProgramError| Error::bpf("program syngate", chain(&e)))
}

/// Creates the maps of `object` and loads its `syngate` program into the
/// kernel (not attached yet); a refusal carries the verifier's log.
fn load_object(object: &[u8]) -> Result<aya::Ebpf, Error> {
    let mut ebpf = EbpfLoader::new().load(object).map_err(|e| {
        let mut detail = chain(&e);
        if detail.contains("Operation not permitted") {
            detail.push_str(" (loading BPF needs root: CAP_BPF and CAP_NET_ADMIN)");
        }
        Error::bpf("load the BPF object", detail)
    })?;
    syngate(&mut ebpf)?.load().map_err(load_error)?;
    Ok(ebpf)
}

fn map_mut<'a, V: aya::Pod>(
    ebpf: &'a mut aya::Ebpf,
    name: &str,
) -> Result<Array<&'a mut MapData, V>, Error> {
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| Error::bpf(format!("find map {name}"), "not in the object"))?;
    Array::try_from(map).map_err(|e| Error::bpf(format!("map {name}"), chain(&e)))
}

/// Opens a pinned map of the attachment in `dir`.
pub(crate) fn open_pinned(dir: &Path, name: &str) -> Result<MapData, Error> {
    MapData::from_pin(dir.join(name))
        .map_err(|e| Error::bpf(format!("open {}", dir.join(name).display()), chain(&e)))
}

/// The configuration recorded in the pinned `config` map.
pub fn pinned_config(dir: &Path) -> Result<Config, Error> {
    let map: Array<MapData, [u8; CONFIG_SIZE]> =
        Array::try_from(Map::Array(open_pinned(dir, "config")?))
            .map_err(|e| Error::bpf("config map", chain(&e)))?;
    let raw = map
        .get(&0, 0)
        .map_err(|e| Error::bpf("read the config map", chain(&e)))?;
    Config::decode(&raw).ok_or_else(|| Error::bpf("read the config map", "unknown mode"))
}

/// Removes the pins `names` and then `dir`, which must be left empty.
fn remove_pins(dir: &Path, names: &[&str]) {
    for name in names {
        let p = dir.join(name);
        if p.exists() {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!("could not remove {}: {e}", p.display());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!("could not remove {}: {e}", dir.display());
    }
}

/// Detaches SynGate from `iface`: unpins the link (the program goes when
/// no process holds the link any more), removes the pins and restores the
/// sysctls attach changed.
pub fn detach(pin_root: &Path, iface: &str) -> Result<Detached, Error> {
    detach_with(pin_root, iface, &Sysctls::default())
}

/// [`detach`] with the sysctls under `sysctls`. Refuses (and changes
/// nothing) when no link is pinned but a live program still uses the
/// pinned maps: a running `tlsgate serve` holds it, and taking its pins and
/// sysctls away would leave the program running on changed ground.
pub fn detach_with(pin_root: &Path, iface: &str, sysctls: &Sysctls) -> Result<Detached, Error> {
    detach_checked(pin_root, iface, sysctls, true)
}

/// The id of the loaded BPF program that uses one of the maps pinned in
/// `dir`, if one does: the program lives as long as something holds it (a
/// pinned link, a process's link), and is gone from the kernel's list once
/// its last holder is.
pub(crate) fn program_using(dir: &Path) -> Result<Option<u32>, Error> {
    let mut ids = Vec::new();
    for name in MAPS.iter().filter(|n| dir.join(n).exists()) {
        let info = open_pinned(dir, name)?
            .info()
            .map_err(|e| Error::bpf(format!("map {name} info"), chain(&e)))?;
        ids.push(info.id());
    }
    if ids.is_empty() {
        return Ok(None);
    }
    let mut listed = false;
    let mut first_error = None;
    for prog in aya::programs::loaded_programs() {
        // A program freed while the list is walked fails its lookup: skip
        // it; an error with nothing listed means the list cannot be read.
        let prog = match prog {
            Ok(p) => p,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        listed = true;
        let maps = prog
            .map_ids()
            .map_err(|e| Error::bpf("read a loaded program's maps", chain(&e)))?
            .ok_or_else(|| {
                Error::bpf(
                    "read a loaded program's maps",
                    "the kernel does not say (before 4.15)",
                )
            })?;
        if maps.iter().any(|m| ids.contains(m)) {
            return Ok(Some(prog.id()));
        }
    }
    match first_error {
        Some(e) if !listed => Err(Error::bpf("list the loaded BPF programs", chain(&e))),
        _ => Ok(None),
    }
}

fn detach_checked(
    pin_root: &Path,
    iface: &str,
    sysctls: &Sysctls,
    check_held: bool,
) -> Result<Detached, Error> {
    let dir = pin_dir(pin_root, iface)?;
    if !dir.exists() {
        return Err(Error::NotAttached {
            iface: iface.into(),
            dir: dir.display().to_string(),
        });
    }
    let config = pinned_config(&dir).ok();
    let link = dir.join("link");
    if link.exists() {
        let pinned = PinnedLink::from_pin(&link)
            .map_err(|e| Error::bpf(format!("open {}", link.display()), chain(&e)))?;
        let fd_link = pinned
            .unpin()
            .map_err(|e| Error::bpf(format!("unpin {}", link.display()), e))?;
        drop(fd_link);
    } else if check_held && program_using(&dir)?.is_some() {
        return Err(Error::HeldByProcess {
            iface: iface.into(),
            dir: dir.display().to_string(),
        });
    }
    remove_pins(&dir, &ALL_PINS);
    let mut restored = Vec::new();
    if let Some(c) = config {
        for (name, old) in [
            (SYNCOOKIES, c.saved_syncookies),
            (TIMESTAMPS, c.saved_timestamps),
        ] {
            if let Some(old) = old {
                sysctls.write(name, old)?;
                restored.push((name, old));
            }
        }
    }
    Ok(Detached { restored })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_cannot_escape_the_pin_root() {
        let root = Path::new("/sys/fs/bpf/tlsgate");
        assert!(pin_dir(root, "eth0").is_ok());
        for bad in ["", "..", ".", "a/b", "averyveryverylongname"] {
            assert!(pin_dir(root, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ports_are_checked() {
        assert!(validate_ports(&[]).is_err());
        assert!(validate_ports(&[0]).is_err());
        assert!(validate_ports(&[443, 443]).is_err());
        assert!(validate_ports(&(1..=17).collect::<Vec<u16>>()).is_err());
        let s = validate_ports(&[443, 8443]).expect("fine");
        assert_eq!(&s[..3], &[443, 8443, 0]);
    }

    /// Needs root (CI runs as root): loading BPF programs needs CAP_BPF.
    #[test]
    fn the_program_passes_the_verifier_and_a_refusal_shows_its_log() {
        load_object(OBJECT).expect("the kernel loads syngate (needs root)");
        static REFUSED: &[u8] =
            aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/refused.bpf.o"));
        let e = load_object(REFUSED).expect_err("the verifier refuses it");
        let msg = e.to_string();
        assert!(matches!(e, Error::Verifier { .. }), "{msg}");
        assert!(msg.contains("invalid access to packet"), "{msg}");
    }

    #[test]
    fn our_mss_is_the_kernels_advmss() {
        assert_eq!(advmss(1500), (1460, 1440));
        assert_eq!(advmss(1400), (1360, 1340));
        assert_eq!(advmss(9000), (8960, 8940));
        // The kernel's floors (ip_rt_min_advmss, ip6_rt_min_advmss).
        assert_eq!(advmss(68), (256, 1220));
        assert_eq!(advmss(u32::MAX), (u16::MAX, u16::MAX));
    }

    #[test]
    fn verifier_log_tail_keeps_the_end() {
        let log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = log_tail(&log, 3);
        assert_eq!(t, "line 97\nline 98\nline 99");
    }
}
