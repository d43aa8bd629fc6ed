//! The BPF link that attaches SynGate to its interface, and whether it
//! still does.
//!
//! The kernel detaches an XDP link by itself when its interface is deleted
//! (`ip link del`) or moves to another network namespace, and says so only
//! when asked: the link then reports interface index 0. An interface of
//! the same name that appears later is another interface, without SynGate.
//! [`Link`] holds the descriptor of `tlsgate serve`'s link and answers
//! [`Link::state`] at every read (one `bpf(2)` call on the descriptor and
//! one ioctl, allowed after privileges are dropped); [`pinned_state`]
//! answers for `tlsgate xdp stats` from the pins (it walks the kernel's
//! programs and links: root only).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tlsgate_sys::bpf::{LinkInfo, LINK_TYPE_XDP};

use crate::gate::{pin_dir, program_using};
use crate::Error;

/// Where SynGate stands with its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Attached to the interface of its name, which has this index.
    Attached {
        /// The interface's index.
        ifindex: u32,
    },
    /// No interface of its name exists (here) any more: the kernel
    /// detached SynGate when it went.
    InterfaceGone,
    /// An interface of its name exists, but not the one SynGate was
    /// attached to (deleted and made again): it has no SynGate.
    Replaced {
        /// The new interface's index.
        ifindex: u32,
    },
    /// Released by its holder, or no program uses the pins.
    NotAttached,
}

impl LinkState {
    /// Whether SynGate answers SYNs on the interface.
    pub fn is_attached(self) -> bool {
        matches!(self, LinkState::Attached { .. })
    }
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkState::Attached { ifindex } => write!(f, "attached (interface index {ifindex})"),
            LinkState::InterfaceGone => f.write_str(
                "detached: the interface is gone (deleted, or moved to another network namespace)",
            ),
            LinkState::Replaced { ifindex } => write!(
                f,
                "detached: the interface was deleted, and the one of that name now (index {ifindex}) has no SynGate"
            ),
            LinkState::NotAttached => f.write_str("not attached"),
        }
    }
}

/// The state of SynGate on `iface` given its XDP link as the kernel
/// describes it (`None`: no link).
fn judge(iface: &str, link: Option<LinkInfo>) -> Result<LinkState, Error> {
    let Some(link) = link else {
        return Ok(LinkState::NotAttached);
    };
    let now = tlsgate_sys::netdev::ifindex_if_present(iface).map_err(|e| Error::Interface {
        iface: iface.into(),
        detail: e.to_string(),
    })?;
    Ok(match now {
        Some(now) if link.ifindex == now => LinkState::Attached { ifindex: now },
        Some(now) => LinkState::Replaced { ifindex: now },
        None => LinkState::InterfaceGone,
    })
}

/// SynGate's link held by this process, shared by its holder ([`crate::Held`])
/// and its readers (the `/metrics` collector). Closing it (at release)
/// detaches the program; readers then see [`LinkState::NotAttached`].
#[derive(Clone, Debug)]
pub struct Link(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    iface: String,
    fd: Mutex<Option<OwnedFd>>,
    /// The loss has been logged (once per attachment).
    warned: AtomicBool,
}

impl Link {
    pub(crate) fn new(iface: &str, fd: OwnedFd) -> Link {
        Link(Arc::new(Inner {
            iface: iface.into(),
            fd: Mutex::new(Some(fd)),
            warned: AtomicBool::new(false),
        }))
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.0.iface
    }

    /// Puts `fd` in place of the link held (closing that one): `None` at
    /// release, a new link at re-attach, which may be lost and logged again.
    pub(crate) fn replace(&self, fd: Option<OwnedFd>) {
        let old = std::mem::replace(
            &mut *self.0.fd.lock().unwrap_or_else(PoisonError::into_inner),
            fd,
        );
        drop(old);
        self.0.warned.store(false, Ordering::Relaxed);
    }

    /// Where SynGate stands now. The first time in an attachment that it
    /// finds SynGate detached it logs a warning naming the interface.
    pub fn state(&self) -> Result<LinkState, Error> {
        let info = {
            let fd = self.0.fd.lock().unwrap_or_else(PoisonError::into_inner);
            match fd.as_ref() {
                None => return Ok(LinkState::NotAttached),
                Some(fd) => tlsgate_sys::bpf::link_info(fd.as_fd())
                    .map_err(|e| Error::bpf("read the XDP link's info", e))?,
            }
        };
        let state = judge(&self.0.iface, Some(info))?;
        if !state.is_attached() && !self.0.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "XDP SynGate on {iface} is {state}; SYNs on {iface} are no longer answered from XDP \
                 (tlsgate_xdp_attached 0). Once an interface named {iface} exists again, SIGHUP \
                 attaches SynGate to it (or restart tlsgate)",
                iface = self.0.iface
            );
        }
        Ok(state)
    }
}

/// Where the SynGate pinned for `iface` under `pin_root` stands: the
/// program using its maps, and that program's XDP link. Root only.
pub fn pinned_state(pin_root: &Path, iface: &str) -> Result<LinkState, Error> {
    let dir = pin_dir(pin_root, iface)?;
    let Some(prog) = program_using(&dir)? else {
        return Ok(LinkState::NotAttached);
    };
    let links = tlsgate_sys::bpf::links_of_program(prog)
        .map_err(|e| Error::bpf("list the BPF links", e))?;
    // An attached link before a detached one.
    let link = links
        .into_iter()
        .filter(|l| l.kind == LINK_TYPE_XDP)
        .max_by_key(|l| l.ifindex != 0);
    judge(iface, link)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(ifindex: u32) -> Option<LinkInfo> {
        Some(LinkInfo {
            kind: LINK_TYPE_XDP,
            id: 1,
            prog_id: 2,
            ifindex,
        })
    }

    #[test]
    fn the_state_compares_the_links_interface_with_the_names() {
        let lo = tlsgate_sys::netdev::ifindex("lo").expect("lo exists");
        assert_eq!(
            judge("lo", link(lo)).unwrap_or(LinkState::NotAttached),
            LinkState::Attached { ifindex: lo }
        );
        // Detached by the kernel (index 0), or attached to another.
        for other in [0, lo + 1000] {
            assert_eq!(
                judge("lo", link(other)).ok(),
                Some(LinkState::Replaced { ifindex: lo })
            );
        }
        assert_eq!(
            judge("no-such-if0", link(0)).ok(),
            Some(LinkState::InterfaceGone)
        );
        assert_eq!(judge("lo", None).ok(), Some(LinkState::NotAttached));
    }
}
