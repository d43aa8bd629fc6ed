//! The sysctls SynGate depends on, read and written through `/proc/sys`
//! (per network namespace: the one of the calling process), and the window
//! scale the kernel will pick for a cookie socket.
//!
//! - `net.ipv4.tcp_syncookies`: `always` needs 2 (the helper issues a
//!   cookie for every SYN); `auto` needs 1 (the helper then issues one only
//!   when the listener's SYN queue is full, which is how auto's probe tells
//!   a flood; with 2 every probe would enter flood mode).
//! - `net.ipv4.tcp_timestamps=2`: timestamps without the random per-connection
//!   offset, which the kernel subtracts from TSecr before decoding the
//!   options we encode in TSval and which BPF cannot compute (field notes:
//!   with 1, half the connections stalled).

use std::path::{Path, PathBuf};

use crate::abi::Mode;
use crate::Error;

/// `net.ipv4.tcp_syncookies`.
pub const SYNCOOKIES: &str = "net.ipv4.tcp_syncookies";
/// `net.ipv4.tcp_timestamps`.
pub const TIMESTAMPS: &str = "net.ipv4.tcp_timestamps";
/// `net.ipv4.tcp_sack`: 0 (the CVE-2019-11477 mitigation) makes the kernel
/// refuse a cookie that says SACK was agreed.
pub const SACK: &str = "net.ipv4.tcp_sack";
/// `net.ipv4.tcp_window_scaling`: 0 makes the kernel refuse a cookie that
/// carries a window scale.
pub const WINDOW_SCALING: &str = "net.ipv4.tcp_window_scaling";

/// Reads and writes sysctls under a root (`/proc/sys`, or a directory in
/// tests).
#[derive(Clone, Debug)]
pub struct Sysctls {
    root: PathBuf,
}

impl Default for Sysctls {
    fn default() -> Self {
        Sysctls {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

/// What the mode needs: `(name, value)` pairs.
pub fn required(mode: Mode) -> Vec<(&'static str, i32)> {
    match mode {
        Mode::Off => vec![],
        Mode::Always => vec![(SYNCOOKIES, 2), (TIMESTAMPS, 2)],
        Mode::Auto => vec![(SYNCOOKIES, 1), (TIMESTAMPS, 2)],
    }
}

impl Sysctls {
    /// Sysctls under `root` instead of `/proc/sys`.
    pub fn at(root: impl Into<PathBuf>) -> Sysctls {
        Sysctls { root: root.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name.replace('.', "/"))
    }

    /// The first integer of a sysctl.
    pub fn read(&self, name: &str) -> Result<i64, Error> {
        self.read_all(name)?
            .first()
            .copied()
            .ok_or_else(|| Error::Sysctl {
                name: name.into(),
                detail: "empty".into(),
            })
    }

    /// Every integer of a sysctl (`tcp_rmem` has three).
    pub fn read_all(&self, name: &str) -> Result<Vec<i64>, Error> {
        let p = self.path(name);
        let text = std::fs::read_to_string(&p).map_err(|e| Error::Sysctl {
            name: name.into(),
            detail: format!("read {}: {e}", p.display()),
        })?;
        text.split_whitespace()
            .map(|w| {
                w.parse().map_err(|_| Error::Sysctl {
                    name: name.into(),
                    detail: format!("not a number: {w:?}"),
                })
            })
            .collect()
    }

    /// Writes a sysctl.
    pub fn write(&self, name: &str, value: i32) -> Result<(), Error> {
        let p = self.path(name);
        std::fs::write(&p, format!("{value}\n")).map_err(|e| Error::Sysctl {
            name: name.into(),
            detail: format!("write {value} to {}: {e}", p.display()),
        })
    }

    /// Checks what `mode` needs. With `set`, changes what differs and
    /// returns the old values (to restore on detach); without, the first
    /// difference is an error naming the sysctl and the value it needs.
    pub fn ensure(&self, mode: Mode, set: bool) -> Result<Vec<(&'static str, i32)>, Error> {
        let mut changed = Vec::new();
        for (name, want) in required(mode) {
            let have = self.read(name)?;
            if have == i64::from(want) {
                continue;
            }
            if !set {
                return Err(Error::SysctlNeeded {
                    name,
                    have,
                    want,
                    mode,
                });
            }
            self.write(name, want)?;
            changed.push((name, i32::try_from(have).unwrap_or(-1)));
        }
        Ok(changed)
    }

    /// Whether a boolean sysctl is on (non-zero).
    pub fn enabled(&self, name: &str) -> Result<bool, Error> {
        Ok(self.read(name)? != 0)
    }

    /// The receive window scale the kernel gives a socket made from a
    /// cookie: `tcp_select_initial_window()` takes the largest of
    /// `tcp_rmem[2]` and `net.core.rmem_max` (and the listener's own buffer,
    /// which tlsgate leaves at the default) and uses `ilog2(space) - 15`,
    /// clamped to 0..=14. `rmem_max` is global and may not be visible from
    /// a network namespace; it then counts as 0.
    pub fn cookie_wscale(&self) -> Result<u32, Error> {
        let rmem = self.read_all("net.ipv4.tcp_rmem")?;
        let max = rmem.get(2).copied().unwrap_or(0);
        let core = self.read("net.core.rmem_max").unwrap_or(0);
        Ok(wscale_for(max.max(core)))
    }

    /// The root these sysctls are read under.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// `clamp(ilog2(space) - 15, 0, 14)`, as the kernel computes it.
pub fn wscale_for(space: i64) -> u32 {
    let space = u64::try_from(space).unwrap_or(0).min(u64::from(u32::MAX));
    if space == 0 {
        return 0;
    }
    space.ilog2().saturating_sub(15).min(14)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(values: &[(&str, &str)]) -> (tempfile::TempDir, Sysctls) {
        let d = tempfile::tempdir().expect("tempdir");
        for (name, v) in values {
            let p = d.path().join(name.replace('.', "/"));
            std::fs::create_dir_all(p.parent().expect("has a parent")).expect("mkdir");
            std::fs::write(p, v).expect("write");
        }
        let s = Sysctls::at(d.path());
        (d, s)
    }

    #[test]
    fn wscale_is_the_kernels() {
        // Debian's defaults: tcp_rmem[2] = 6 MiB -> 7; 32 MiB -> 10.
        assert_eq!(wscale_for(6_291_456), 7);
        assert_eq!(wscale_for(33_554_432), 10);
        assert_eq!(wscale_for(65_535), 0);
        assert_eq!(wscale_for(0), 0);
        assert_eq!(wscale_for(i64::MAX), 14);
        let (_d, s) = fake(&[
            ("net.ipv4.tcp_rmem", "4096\t131072\t33554432\n"),
            ("net.core.rmem_max", "4194304\n"),
        ]);
        assert_eq!(s.cookie_wscale().expect("reads"), 10);
    }

    #[test]
    fn missing_sysctls_name_themselves_and_setting_records_old_values() {
        let (_d, s) = fake(&[(SYNCOOKIES, "1\n"), (TIMESTAMPS, "1\n")]);
        let e = s.ensure(Mode::Always, false).expect_err("needs 2");
        let msg = e.to_string();
        assert!(
            msg.contains("net.ipv4.tcp_syncookies") && msg.contains('2'),
            "{msg}"
        );
        // auto is content with syncookies=1 but not with timestamps=1.
        let e = s.ensure(Mode::Auto, false).expect_err("needs ts 2");
        assert!(e.to_string().contains(TIMESTAMPS), "{e}");
        let changed = s.ensure(Mode::Always, true).expect("sets");
        assert_eq!(changed, vec![(SYNCOOKIES, 1), (TIMESTAMPS, 1)]);
        assert_eq!(s.read(SYNCOOKIES).expect("reads"), 2);
        assert_eq!(s.ensure(Mode::Always, false).expect("now fine"), vec![]);
    }
}
