//! Keeping a file in the page cache: mapped and locked (`mlock`), so
//! memory reclaim cannot evict it. The bench locks the files it serves:
//! on a machine whose reclaim pages out what was idle for a minute (DAMON
//! here), a file evicted between two measurements comes back through
//! `read`-ahead and is served at a different cost (docs/bench.md).
//!
//! The mapping is never read from Rust: it exists only for the lock, so
//! nobody can observe the file changing under it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fs::File;
use std::io;
use std::ptr;

use rustix::mm::{mlock, mmap, munmap, MapFlags, ProtFlags};

/// A file whose pages stay in memory until this is dropped.
#[derive(Debug)]
pub struct LockedFile {
    /// The mapping's start; null for an empty file (nothing mapped).
    addr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is only ever unmapped, never read or written, so
// sharing or moving the pointer between threads cannot race.
unsafe impl Send for LockedFile {}
// SAFETY: as above; `&LockedFile` gives no access to the memory.
unsafe impl Sync for LockedFile {}

impl LockedFile {
    /// Maps all of `file` read-only and locks it: its pages are read in
    /// now, if they are not in memory yet, and stay. Fails with the
    /// kernel's error (`EPERM`/`ENOMEM` past `RLIMIT_MEMLOCK` without
    /// `CAP_IPC_LOCK`).
    pub fn lock(file: &File) -> io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too big to map"))?;
        if len == 0 {
            return Ok(Self {
                addr: ptr::null_mut(),
                len,
            });
        }
        // SAFETY: a new shared read-only mapping chosen by the kernel
        // (null hint), aliasing no Rust memory; it is never dereferenced.
        let addr = unsafe {
            mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file,
                0,
            )
        }?;
        // SAFETY: exactly the range mapped above.
        if let Err(e) = unsafe { mlock(addr, len) } {
            // SAFETY: the range mapped above, unmapped once.
            let _ = unsafe { munmap(addr, len) };
            return Err(e.into());
        }
        Ok(Self { addr, len })
    }

    /// Bytes held in memory.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the file was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        if !self.addr.is_null() {
            // SAFETY: the range mapped in `lock`, unmapped only here;
            // unmapping also unlocks it.
            let _ = unsafe { munmap(self.addr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// `VmLck` of this process, in kB.
    fn locked_kb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn locks_the_whole_file_and_unlocks_on_drop() {
        let dir = std::env::temp_dir().join(format!("tlsgate-sys-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 3 << 20]).unwrap();
        drop(f);
        let before = locked_kb();
        let file = File::open(&path).unwrap();
        match LockedFile::lock(&file) {
            Ok(locked) => {
                assert_eq!(locked.len(), 3 << 20);
                assert_eq!(
                    locked_kb() - before,
                    3 << 10,
                    "the kernel counts 3 MiB locked"
                );
                drop(locked);
                assert_eq!(locked_kb(), before, "dropping unlocks");
            }
            // Without CAP_IPC_LOCK a small RLIMIT_MEMLOCK refuses: say so.
            Err(e) => panic!("mlock of 3 MiB refused ({e}); run as root or raise RLIMIT_MEMLOCK"),
        }
        let empty = File::create(dir.join("empty")).unwrap();
        assert!(LockedFile::lock(&empty).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
