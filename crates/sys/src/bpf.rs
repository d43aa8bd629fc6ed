//! BPF links as the kernel lists them: which program a link holds and, for
//! an XDP link, the interface it is attached to. aya 0.13 loads, attaches
//! and pins, but cannot say whether a link is still attached: the kernel
//! detaches an XDP link by itself when its interface goes (`ip link del`,
//! a move to another namespace) and then reports interface index 0 for it.
//! SynGate asks that here, and makes and pins its XDP links here too, so
//! that it holds the link's descriptor and can ask it. Six `bpf(2)`
//! commands, all through [`sys_bpf`]; that call and taking ownership of a
//! descriptor it returns ([`owned`]) are the unsafe code of this module.
//! Errors are the kernel's errno as it came (`EOPNOTSUPP` from a driver
//! without native XDP stays recognisable): the caller names the step.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

const BPF_OBJ_PIN: libc::c_int = 6;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_LINK_GET_FD_BY_ID: libc::c_int = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_int = 31;

/// `BPF_XDP` of `enum bpf_attach_type`.
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE` and `XDP_FLAGS_DRV_MODE` (`if_link.h`).
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `BPF_LINK_TYPE_XDP` of `enum bpf_link_type`.
pub const LINK_TYPE_XDP: u32 = 6;

/// The `bpf_attr` member of `BPF_*_GET_NEXT_ID` and `BPF_*_GET_FD_BY_ID`:
/// an id (the start id, or the link id), the next id, open flags.
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// The `info` member of `bpf_attr` (`BPF_OBJ_GET_INFO_BY_FD`).
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The `link_create` member of `bpf_attr`, up to its flags.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// The `BPF_OBJ_PIN` member of `bpf_attr`, up to its file flags.
#[repr(C)]
#[derive(Default)]
struct PinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The start of `struct bpf_link_info`, up to the XDP member of its union
/// (which is 8-aligned: it begins at 16). The kernel fills what fits in
/// the length given.
#[repr(C)]
#[derive(Default)]
struct LinkInfoRaw {
    kind: u32,
    id: u32,
    prog_id: u32,
    pad: u32,
    xdp_ifindex: u32,
    tail: u32,
}

/// The `bpf_attr` members this crate passes: plain `repr(C)` data with no
/// implicit padding, of the layouts the kernel's UAPI gives them, whose
/// pointers (if any) the code that fills them keeps valid for the call.
pub(crate) trait Attr {}
impl Attr for IdAttr {}
impl Attr for InfoAttr {}
impl Attr for LinkCreateAttr {}
impl Attr for PinAttr {}

/// `bpf(cmd, attr, sizeof attr)`: the return value, or the errno. The
/// crate's one `bpf(2)` call (also `packet::xdp_live_run`'s test run).
pub(crate) fn sys_bpf<A: Attr>(cmd: libc::c_int, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a `repr(C)` bpf_attr member (the `Attr` trait is
    // crate-private and implemented only for them), fully initialised, its
    // size passed; the kernel reads at most that many bytes and may write
    // back into it (next_id; a test run's retval and duration). A pointer
    // inside it (InfoAttr::info, PinAttr::pathname, a test run's frame and
    // context) points to a buffer of the length given (a NUL-terminated
    // path) that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            std::mem::size_of::<A>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// A descriptor a `bpf(2)` command returned, owned.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("bpf: descriptor"))?;
    // SAFETY: the command returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fd_u32(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u32> {
    u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::other("descriptor"))
}

/// Attaches the XDP program `prog` to the interface `ifindex` through a
/// new BPF link (`BPF_LINK_CREATE`), in generic (skb) or the driver's
/// native mode. The program stays attached while the link is open (this
/// descriptor, a pin) and its interface exists.
pub fn xdp_link_create(
    prog: std::os::fd::BorrowedFd<'_>,
    ifindex: u32,
    generic: bool,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: fd_u32(prog)?,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: if generic {
            XDP_FLAGS_SKB_MODE
        } else {
            XDP_FLAGS_DRV_MODE
        },
    };
    owned(sys_bpf(BPF_LINK_CREATE, &mut attr)?)
}

/// Pins the BPF object `fd` at `path` on a BPF filesystem.
pub fn pin(fd: std::os::fd::BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a pin path"))?;
    let mut attr = PinAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd_u32(fd)?,
        file_flags: 0,
    };
    sys_bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// What the kernel says about a BPF link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// `enum bpf_link_type` ([`LINK_TYPE_XDP`]).
    pub kind: u32,
    /// The link's id.
    pub id: u32,
    /// The id of the program it holds.
    pub prog_id: u32,
    /// For an XDP link, the interface it is attached to; 0 once the kernel
    /// detached it (its interface was deleted or left the namespace).
    pub ifindex: u32,
}

/// The id of the next BPF link after `start` (0: the first), `None` past
/// the last.
fn next_link_id(start: u32) -> io::Result<Option<u32>> {
    let mut attr = IdAttr {
        id: start,
        ..IdAttr::default()
    };
    match sys_bpf(BPF_LINK_GET_NEXT_ID, &mut attr) {
        Ok(_) => Ok(Some(attr.next_id)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the kernel says about the link with id `id`; `None` when there is
/// no such link (any more).
pub fn link_by_id(id: u32) -> io::Result<Option<LinkInfo>> {
    let mut attr = IdAttr {
        id,
        ..IdAttr::default()
    };
    let fd = match sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    link_info(owned(fd)?.as_fd()).map(Some)
}

/// What the kernel says about the link open as `link`.
pub fn link_info(link: std::os::fd::BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let mut info = LinkInfoRaw::default();
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(link)?,
        info_len: std::mem::size_of::<LinkInfoRaw>() as u32,
        info: (&mut info as *mut LinkInfoRaw) as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(LinkInfo {
        kind: info.kind,
        id: info.id,
        prog_id: info.prog_id,
        ifindex: if info.kind == LINK_TYPE_XDP {
            info.xdp_ifindex
        } else {
            0
        },
    })
}

/// Every BPF link that holds the program `prog_id`. Links freed while the
/// list is walked are skipped.
pub fn links_of_program(prog_id: u32) -> io::Result<Vec<LinkInfo>> {
    let mut found = Vec::new();
    let mut id = 0;
    while let Some(next) = next_link_id(id)? {
        id = next;
        if let Some(info) = link_by_id(id)? {
            if info.prog_id == prog_id {
                found.push(info);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets the kernel's UAPI gives these structs.
    #[test]
    fn layouts_match_the_uapi() {
        assert_eq!(std::mem::size_of::<IdAttr>(), 12);
        assert_eq!(std::mem::size_of::<InfoAttr>(), 16);
        assert_eq!(std::mem::offset_of!(InfoAttr, info), 8);
        assert_eq!(std::mem::size_of::<LinkCreateAttr>(), 16);
        assert_eq!(std::mem::size_of::<PinAttr>(), 16);
        assert_eq!(std::mem::offset_of!(LinkInfoRaw, prog_id), 8);
        assert_eq!(std::mem::offset_of!(LinkInfoRaw, xdp_ifindex), 16);
    }

    /// Needs root (CI runs as root): listing BPF objects needs CAP_SYS_ADMIN.
    #[test]
    fn an_unknown_link_is_none_and_the_list_can_be_walked() {
        assert_eq!(link_by_id(u32::MAX).expect("root"), None);
        links_of_program(u32::MAX).expect("root");
    }
}
