//! Dropping privileges once the listening sockets are bound: switch user and
//! group (supplementary groups cleared), clear every capability set and set
//! `PR_SET_NO_NEW_PRIVS`, then check that every thread of the process ended
//! up that way.
//!
//! `setuid`, `setgid` and `setgroups` go through glibc (via `nix`), which
//! applies them to every thread of the process; the raw syscalls would only
//! change the calling thread. Capabilities and no-new-privs are per-thread,
//! so this must run before any other thread is started: [`drop_privileges`]
//! verifies it through `/proc/self/task` rather than trusting it.
//!
//! [`set_dumpable`] keeps a process holding secrets out of core files and
//! out of reach of other processes of its user (`PR_SET_DUMPABLE`).

use std::io;

use nix::unistd::{Gid, Group, Uid, User};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// A user and group to switch to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Group id (also the only group: supplementary groups are cleared).
    pub gid: u32,
}

/// Why privileges could not be dropped, naming the step.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {problem}")]
pub struct PrivilegeError {
    /// What was being done (`setuid(65534)`, `user lookup`...).
    pub step: String,
    /// What went wrong, with a hint when there is one.
    pub problem: String,
}

fn fail(step: impl Into<String>, problem: impl std::fmt::Display) -> PrivilegeError {
    PrivilegeError {
        step: step.into(),
        problem: problem.to_string(),
    }
}

/// The user id the process acts as (its effective uid).
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Resolves `user` (a name or a number) and `group` (default: the user's
/// primary group) to ids.
pub fn resolve(user: &str, group: Option<&str>) -> Result<Ids, PrivilegeError> {
    let (uid, primary) = match user.parse::<u32>() {
        Ok(n) => {
            let found = User::from_uid(Uid::from_raw(n)).map_err(|e| fail("user lookup", e))?;
            (n, found.map(|u| u.gid.as_raw()))
        }
        Err(_) => {
            let u = User::from_name(user)
                .map_err(|e| fail("user lookup", e))?
                .ok_or_else(|| fail("user lookup", format!("no user named {user:?}")))?;
            (u.uid.as_raw(), Some(u.gid.as_raw()))
        }
    };
    let gid = match group {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => Group::from_name(g)
                .map_err(|e| fail("group lookup", e))?
                .ok_or_else(|| fail("group lookup", format!("no group named {g:?}")))?
                .gid
                .as_raw(),
        },
        None => primary.ok_or_else(|| {
            fail(
                "group lookup",
                format!("user id {uid} has no passwd entry; give server.group"),
            )
        })?,
    };
    Ok(Ids { uid, gid })
}

fn hint(e: nix::errno::Errno) -> String {
    if e == nix::errno::Errno::EPERM {
        format!("{e} (switching user needs tlsgate to be started as root)")
    } else {
        e.to_string()
    }
}

/// Switches to `ids` (if given), clears every capability set and sets
/// no-new-privs, then verifies that every thread has no capability left
/// and runs as `ids`. Must be called while the process has one thread.
pub fn drop_privileges(ids: Option<Ids>) -> Result<(), PrivilegeError> {
    if let Some(Ids { uid, gid }) = ids {
        nix::unistd::setgroups(&[]).map_err(|e| fail("setgroups([])", hint(e)))?;
        nix::unistd::setgid(Gid::from_raw(gid))
            .map_err(|e| fail(format!("setgid({gid})"), hint(e)))?;
        // From uid 0 to another uid the kernel also empties the permitted and
        // effective sets (no SECBIT_KEEP_CAPS is set).
        nix::unistd::setuid(Uid::from_raw(uid))
            .map_err(|e| fail(format!("setuid({uid})"), hint(e)))?;
    }
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(|e| fail("capset", e))?;
    rustix::thread::clear_ambient_capability_set()
        .map_err(|e| fail("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", e))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| fail("prctl(PR_SET_NO_NEW_PRIVS)", e))?;
    verify(ids)
}

/// Sets the calling thread's nice value (Linux: per thread; threads it
/// starts afterwards inherit it). Lowering it needs `CAP_SYS_NICE`
/// (or `RLIMIT_NICE`).
pub fn set_thread_nice(nice: i32) -> Result<(), PrivilegeError> {
    rustix::process::setpriority_process(None, nice)
        .map_err(|e| fail(format!("setpriority({nice})"), e))
}

/// Sets whether this process dumps core and may be read by other
/// processes of its user (`/proc/PID/mem`, `environ`, `ptrace`) without
/// `CAP_SYS_PTRACE`: `PR_SET_DUMPABLE`, for the whole process at once.
/// The kernel sets it again at `execve` and clears it when the uid
/// changes, so a process sets it after both.
pub fn set_dumpable(dumpable: bool) -> Result<(), PrivilegeError> {
    use rustix::process::DumpableBehavior as D;
    let (how, step) = if dumpable {
        (D::Dumpable, "prctl(PR_SET_DUMPABLE, 1)")
    } else {
        (D::NotDumpable, "prctl(PR_SET_DUMPABLE, 0)")
    };
    rustix::process::set_dumpable_behavior(how).map_err(|e| fail(step, e))
}

/// Whether this process is dumpable (`PR_GET_DUMPABLE`); the kernel's
/// "dumpable, readable by root only" (`fs.suid_dumpable = 2`) counts as not.
pub fn is_dumpable() -> Result<bool, PrivilegeError> {
    rustix::process::dumpable_behavior()
        .map(|d| d == rustix::process::DumpableBehavior::Dumpable)
        .map_err(|e| fail("prctl(PR_GET_DUMPABLE)", e))
}

/// Reads a `Name:\t...` line of a `/proc/.../status` file.
fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn verify(ids: Option<Ids>) -> Result<(), PrivilegeError> {
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| fail("/proc/self/task", e))?;
    for task in tasks {
        let task = task.map_err(|e| fail("/proc/self/task", e))?;
        let path = task.path().join("status");
        let status = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            // The thread ended meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(fail(path.display().to_string(), e)),
        };
        let check = |name: &str, ok: &dyn Fn(&str) -> bool| match field(&status, name) {
            Some(v) if ok(v) => Ok(()),
            other => Err(fail(
                "verify",
                format!(
                    "thread {}: {name} is {other:?} after dropping privileges",
                    task.file_name().to_string_lossy()
                ),
            )),
        };
        let zero = |v: &str| v.bytes().all(|b| b == b'0');
        check("CapEff", &zero)?;
        check("CapPrm", &zero)?;
        check("CapAmb", &zero)?;
        if let Some(Ids { uid, gid }) = ids {
            let all =
                |want: u32| move |v: &str| v.split_whitespace().all(|x| x == want.to_string());
            check("Uid", &all(uid))?;
            check("Gid", &all(gid))?;
            check("Groups", &|v: &str| v.is_empty())?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_and_numbers() {
        let root = resolve("root", None).unwrap();
        assert_eq!(root, Ids { uid: 0, gid: 0 });
        assert_eq!(resolve("0", Some("0")).unwrap(), root);
        let e = resolve("no-such-user-here", None).unwrap_err();
        assert!(e.to_string().contains("no-such-user-here"), "{e}");
        let e = resolve("root", Some("no-such-group-here")).unwrap_err();
        assert!(e.to_string().contains("no-such-group-here"), "{e}");
    }

    #[test]
    fn dumpable_is_set_and_read_back() {
        // Per process: the other tests of this binary do not mind a moment
        // of not being dumpable (they read their own /proc/self only).
        let was = is_dumpable().unwrap();
        set_dumpable(false).unwrap();
        assert!(!is_dumpable().unwrap());
        set_dumpable(true).unwrap();
        assert!(is_dumpable().unwrap());
        set_dumpable(was).unwrap();
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tx\nUid:\t0\t0\t0\t0\nCapEff:\t0000000000000000\n";
        assert_eq!(field(s, "Uid"), Some("0\t0\t0\t0"));
        assert_eq!(field(s, "CapEff"), Some("0000000000000000"));
        assert_eq!(field(s, "Groups"), None);
    }
}
