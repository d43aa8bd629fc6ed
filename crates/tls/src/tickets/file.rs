//! The ticket key file shared by a fleet: format, checks, atomic writes.
//!
//! ```text
//! tlsgate-ticket-keys v1
//! # first key encrypts new tickets; every key decrypts
//! 3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
//! ```
//!
//! The first line is the version header; then one key per line, standard
//! base64 of 32 random bytes; blank lines and `#` comments are ignored. The
//! file must be a regular file that neither group nor others may access,
//! owned by root or the user tlsgate runs as, in directories that only
//! they can change (OpenSSH's `StrictModes`).
//!
//! This module knows nothing of rustls: it reads and writes secrets, so a
//! separate key process can own the file with the same code.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use zeroize::Zeroizing;

/// The first line of every key file.
pub const HEADER: &str = "tlsgate-ticket-keys v1";
/// Bytes of one key.
pub const KEY_LEN: usize = 32;
/// Most keys a file may list (a key per hour for over two days).
pub const MAX_KEYS: usize = 64;
/// Largest file read; a full file of `MAX_KEYS` is about 3 KiB.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// One ticket key's secret, wiped on drop and never printed.
pub struct Secret(Zeroizing<[u8; KEY_LEN]>);

impl Secret {
    /// A new key from the system's random source.
    pub fn generate() -> Result<Self, KeyFileError> {
        let mut k = Zeroizing::new([0u8; KEY_LEN]);
        aws_lc_rs::rand::fill(&mut k[..]).map_err(|_| KeyFileError {
            path: PathBuf::new(),
            problem: "the system random source failed".into(),
        })?;
        Ok(Self(k))
    }

    /// Wraps bytes (tests, or keys handed over by another process).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The key bytes.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A key file that cannot be read, parsed or written. Names the file;
/// never quotes its content.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct KeyFileError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong and what was expected.
    pub problem: String,
}

fn fail(path: &Path, problem: impl Into<String>) -> KeyFileError {
    KeyFileError {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Refuses anything but a regular file closed to group and others.
fn check_metadata(path: &Path, meta: &std::fs::Metadata) -> Result<(), KeyFileError> {
    if !meta.is_file() {
        return Err(fail(path, "expected a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(fail(
            path,
            format!(
                "mode {mode:04o} lets group or others read or change ticket keys; \
                 expected 0600 or 0400 (chmod 600 {})",
                path.display()
            ),
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(
            path,
            format!(
                "{} bytes is too large for a key file (at most {MAX_FILE_BYTES})",
                meta.len()
            ),
        ));
    }
    Ok(())
}

/// Who may own a key file and the directories that lead to it: root, the
/// user this process acts as, and `run_as` (`server.user`, which the file
/// is read as after a start as root).
fn trusted_owners(run_as: Option<u32>) -> [u32; 3] {
    let me = tlsgate_sys::privileges::effective_uid();
    [0, me, run_as.unwrap_or(me)]
}

fn owners_text(owners: &[u32; 3]) -> String {
    let mut ids: Vec<u32> = owners.to_vec();
    ids.dedup();
    let ids: Vec<String> = ids.iter().map(|u| format!("uid {u}")).collect();
    ids.join(" or ")
}

/// Refuses a key file owned by another user (they could read or replace
/// the keys whatever its mode), and one in a directory that another user
/// can change: its owner, or anyone with group or other write permission
/// and no sticky bit, could put a file of their own keys in its place.
/// Every directory from the file up to `/` is checked, along the path as
/// given and along the path its symlinks lead to, unless `reach` says the
/// file alone.
fn check_ownership(
    path: &Path,
    meta: &std::fs::Metadata,
    run_as: Option<u32>,
    reach: Reach,
) -> Result<(), KeyFileError> {
    let owners = trusted_owners(run_as);
    if !owners.contains(&meta.uid()) {
        return Err(fail(
            path,
            format!(
                "owned by uid {}, which is neither root nor the user tlsgate runs as; \
                 expected a file owned by {} (chown)",
                meta.uid(),
                owners_text(&owners)
            ),
        ));
    }
    if reach == Reach::FileOnly {
        return Ok(());
    }
    let given =
        std::path::absolute(path).map_err(|e| fail(path, format!("cannot resolve: {e}")))?;
    let resolved =
        std::fs::canonicalize(path).map_err(|e| fail(path, format!("cannot resolve: {e}")))?;
    let mut seen: Vec<&Path> = Vec::new();
    for dir in [given.parent(), resolved.parent()]
        .into_iter()
        .flatten()
        .flat_map(Path::ancestors)
    {
        if seen.contains(&dir) {
            continue;
        }
        seen.push(dir);
        let d = std::fs::metadata(dir).map_err(|e| {
            fail(
                path,
                format!("cannot stat its directory {}: {e}", dir.display()),
            )
        })?;
        let mode = d.permissions().mode() & 0o7777;
        if !owners.contains(&d.uid()) {
            return Err(fail(
                path,
                format!(
                    "its directory {} is owned by uid {}, who could replace the key file; \
                     expected directories owned by {}",
                    dir.display(),
                    d.uid(),
                    owners_text(&owners)
                ),
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(fail(
                path,
                format!(
                    "its directory {} has mode {:04o}: group or others may write there \
                     and replace the key file; expected no group or other write \
                     permission, or the sticky bit (chmod go-w {})",
                    dir.display(),
                    mode,
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// What [`check_ownership`] looks at.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reach {
    /// The file and every directory that leads to it: what a server
    /// trusts for its keys.
    FileAndDirectories,
    /// The file alone: `rotate`, an operator's command on a file they
    /// name, often in a scratch directory (a Kubernetes emptyDir is mode
    /// 2777). A server that reads the result checks its directories.
    FileOnly,
}

/// Reads and checks a key file: the keys in order, the encrypting one
/// first. `run_as` is a user besides root and this process's own that
/// may own the file (`server.user`).
pub fn read(path: &Path, run_as: Option<u32>) -> Result<Vec<Secret>, KeyFileError> {
    read_reaching(path, run_as, Reach::FileAndDirectories)
}

fn read_reaching(
    path: &Path,
    run_as: Option<u32>,
    reach: Reach,
) -> Result<Vec<Secret>, KeyFileError> {
    // Not blocking on a FIFO: the check below refuses it.
    let mut f = tlsgate_sys::fileread::open_no_wait(path)
        .map_err(|e| fail(path, format!("cannot open: {e}")))?;
    // Checked on the open file, so a swap after the check changes nothing.
    let meta = f
        .metadata()
        .map_err(|e| fail(path, format!("cannot stat: {e}")))?;
    check_metadata(path, &meta)?;
    check_ownership(path, &meta, run_as, reach)?;
    let mut raw = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
    (&mut f)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| fail(path, format!("cannot read: {e}")))?;
    if raw.len() as u64 > MAX_FILE_BYTES {
        return Err(fail(path, "too large for a key file"));
    }
    parse(&raw).map_err(|problem| fail(path, problem))
}

/// Parses the text of a key file; the error never quotes a key line.
pub fn parse(raw: &[u8]) -> Result<Vec<Secret>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "expected a text file".to_string())?;
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, first)) if first.trim() == HEADER => {}
        _ => return Err(format!("expected the first line to be {HEADER:?}")),
    }
    let mut keys: Vec<(usize, Secret)> = Vec::new();
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        // Room for one byte more than a key, to tell "too long" from valid.
        let mut buf = Zeroizing::new([0u8; KEY_LEN + 3]);
        let len = STANDARD
            .decode_slice(line, &mut buf[..])
            .map_err(|_| format!("line {n}: expected base64 of {KEY_LEN} bytes"))?;
        if len != KEY_LEN {
            return Err(format!(
                "line {n}: expected base64 of {KEY_LEN} bytes, found {len} bytes"
            ));
        }
        let mut k = [0u8; KEY_LEN];
        k.copy_from_slice(&buf[..KEY_LEN]);
        let secret = Secret::from_bytes(k);
        k.fill(0);
        if let Some((m, _)) = keys.iter().find(|(_, s)| s.expose() == secret.expose()) {
            return Err(format!("line {n}: repeats the key of line {m}"));
        }
        keys.push((n, secret));
        if keys.len() > MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys"));
        }
    }
    if keys.is_empty() {
        return Err("expected at least one key after the header".into());
    }
    Ok(keys.into_iter().map(|(_, s)| s).collect())
}

/// The file text for `keys`, as `generate` and `rotate` write it: what
/// [`parse`] reads back as the same keys (for 1 to [`MAX_KEYS`] distinct
/// ones).
pub fn render(keys: &[Secret]) -> Zeroizing<String> {
    let mut text = Zeroizing::new(String::with_capacity(64 + keys.len() * 46));
    text.push_str(HEADER);
    text.push_str("\n# First key encrypts new tickets; every key decrypts. Keep mode 0600.\n");
    text.push_str("# Written by `tlsgate ticket-keys`; see docs/config.md.\n");
    for k in keys {
        STANDARD.encode_string(k.expose(), &mut text);
        text.push('\n');
    }
    text
}

/// Replaces `path` atomically: a temporary file in the same directory,
/// mode 0600, `owner` (uid, gid) if given, fsync, rename, fsync of the directory.
/// Readers see the old file or the new one, never a mix.
fn write_atomic(
    path: &Path,
    keys: &[Secret],
    owner: Option<(u32, u32)>,
) -> Result<(), KeyFileError> {
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(fail(
            path,
            format!("expected 1 to {MAX_KEYS} keys, not {}", keys.len()),
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let w = |what: &str, e: std::io::Error| fail(path, format!("cannot {what}: {e}"));
    // tempfile creates the file with mode 0600 (O_EXCL, random name).
    let mut tmp = tempfile::Builder::new()
        .prefix(".tlsgate-ticket-keys.")
        .tempfile_in(dir)
        .map_err(|e| w("create a temporary file beside it", e))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| w("set mode 0600", e))?;
    if let Some((uid, gid)) = owner {
        let meta = tmp.as_file().metadata().map_err(|e| w("stat", e))?;
        if (meta.uid(), meta.gid()) != (uid, gid) {
            // Keeps the file readable by the server user it belonged to.
            std::os::unix::fs::fchown(tmp.as_file(), Some(uid), Some(gid))
                .map_err(|e| w(&format!("keep the owner {uid}:{gid}"), e))?;
        }
    }
    tmp.write_all(render(keys).as_bytes())
        .map_err(|e| w("write", e))?;
    tmp.as_file().sync_all().map_err(|e| w("fsync", e))?;
    tmp.persist(path)
        .map_err(|e| w("rename into place", e.error))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| w("fsync the directory", e))?;
    Ok(())
}

/// `tlsgate ticket-keys generate`: a new file of `count` fresh keys.
/// Refuses to replace an existing file unless `force`.
pub fn generate(path: &Path, count: usize, force: bool) -> Result<(), KeyFileError> {
    if !(1..=MAX_KEYS).contains(&count) {
        return Err(fail(
            path,
            format!("expected --keys from 1 to {MAX_KEYS}, found {count}"),
        ));
    }
    let exists = std::fs::symlink_metadata(path).is_ok();
    if exists {
        refuse_unless_regular(path)?;
    }
    if !force && exists {
        return Err(fail(
            path,
            "exists; use `ticket-keys rotate` to add a key, or --force to replace every key",
        ));
    }
    let keys = (0..count)
        .map(|_| Secret::generate())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(path, e.problem))?;
    if !exists {
        return write_atomic(path, &keys, None);
    }
    let target = followed(path)?;
    let _lock = lock_current(&target)?;
    write_atomic(&target, &keys, None)
}

/// Refuses an existing `path` that is not a regular file or a symlink to
/// one, before anything opens it: `--force` replaces key files, never a
/// device (it once turned /dev/null into a key file), and opening a FIFO
/// would wait for a writer forever.
fn refuse_unless_regular(path: &Path) -> Result<(), KeyFileError> {
    let own =
        std::fs::symlink_metadata(path).map_err(|e| fail(path, format!("cannot stat: {e}")))?;
    let expected = "expected a regular file or a symlink to one";
    if own.is_symlink() {
        let meta = std::fs::metadata(path).map_err(|e| {
            fail(
                path,
                format!("is a symlink that cannot be followed ({e}); {expected}"),
            )
        })?;
        if !meta.is_file() {
            return Err(fail(
                path,
                format!(
                    "is a symlink to {}; {expected}",
                    tlsgate_config::file_kind(&meta.file_type())
                ),
            ));
        }
    } else if !own.is_file() {
        return Err(fail(
            path,
            format!(
                "is {}; {expected}",
                tlsgate_config::file_kind(&own.file_type())
            ),
        ));
    }
    Ok(())
}

/// The file `path` names, through any symlinks: a key file shared by a
/// fleet is often a link to one on shared storage, and replacing the link
/// with a file of its own would part this host from the others' keys.
fn followed(path: &Path) -> Result<PathBuf, KeyFileError> {
    std::fs::canonicalize(path).map_err(|e| fail(path, format!("cannot resolve: {e}")))
}

/// How long a rotation waits for another one on the same file.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Holds an exclusive lock on the file at `path` from before it is read
/// until the rename that replaces it, so two rotations (cron jobs that
/// overlap, hosts sharing the file) run one after the other and neither
/// drops the other's new key. A rotation that waited reads the file the
/// other one wrote: the lock is taken again if the file was replaced.
fn lock_current(path: &Path) -> Result<File, KeyFileError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // Not blocking on a FIFO swapped in after the caller's check.
        let f = tlsgate_sys::fileread::open_no_wait(path)
            .map_err(|e| fail(path, format!("cannot open: {e}")))?;
        let meta = f
            .metadata()
            .map_err(|e| fail(path, format!("cannot stat: {e}")))?;
        if !meta.is_file() {
            return Err(fail(
                path,
                format!(
                    "is {}; expected a regular file",
                    tlsgate_config::file_kind(&meta.file_type())
                ),
            ));
        }
        loop {
            match f.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(fail(
                        path,
                        format!("locked by another rotation for {}s", LOCK_WAIT.as_secs()),
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(fail(path, format!("cannot lock: {e}")))
                }
            }
        }
        let locked = f
            .metadata()
            .map_err(|e| fail(path, format!("cannot stat: {e}")))?;
        let now = std::fs::metadata(path).map_err(|e| fail(path, format!("cannot stat: {e}")))?;
        if (locked.dev(), locked.ino()) == (now.dev(), now.ino()) {
            return Ok(f);
        }
    }
}

/// What [`rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotated {
    /// Keys in the file now (the new one first).
    pub kept: usize,
    /// Oldest keys dropped.
    pub dropped: usize,
}

/// `tlsgate ticket-keys rotate`: a new key in front, then at most `keep`
/// keys in all (the oldest go). The file keeps its owner.
pub fn rotate(path: &Path, keep: usize) -> Result<Rotated, KeyFileError> {
    if !(1..=MAX_KEYS).contains(&keep) {
        return Err(fail(
            path,
            format!("expected --keep from 1 to {MAX_KEYS}, found {keep}"),
        ));
    }
    let target = followed(path)?;
    let lock = lock_current(&target)?;
    let meta = lock
        .metadata()
        .map_err(|e| fail(path, format!("cannot stat: {e}")))?;
    // Root may rotate the file of the user a server runs as (the new file
    // keeps that owner); anyone else only their own or root's.
    let root = tlsgate_sys::privileges::effective_uid() == 0;
    let old = read_reaching(&target, root.then_some(meta.uid()), Reach::FileOnly)?;
    let mut keys = Vec::with_capacity(old.len() + 1);
    keys.push(Secret::generate().map_err(|e| fail(path, e.problem))?);
    keys.extend(old);
    let dropped = keys.len().saturating_sub(keep);
    keys.truncate(keep);
    write_atomic(&target, &keys, Some((meta.uid(), meta.gid())))?;
    drop(lock);
    Ok(Rotated {
        kept: keys.len(),
        dropped,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// A rotation through a symlink replaces the file it names (the one
    /// the fleet shares) and leaves the link.
    #[test]
    fn rotate_through_a_symlink_replaces_the_file_it_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shared")).unwrap();
        std::fs::create_dir(dir.path().join("local")).unwrap();
        let shared = dir.path().join("shared/keys");
        let link = dir.path().join("local/keys");
        generate(&shared, 2, false).unwrap();
        std::os::unix::fs::symlink("../shared/keys", &link).unwrap();
        assert_eq!(rotate(&link, 8).unwrap().kept, 3);
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(read(&shared, None).unwrap().len(), 3);
        generate(&link, 1, true).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(read(&shared, None).unwrap().len(), 1);
        assert_eq!(mode(&shared), 0o600);
    }

    /// Rotations at once (overlapping cron jobs, hosts sharing the file)
    /// each add their key: none is lost.
    #[test]
    fn concurrent_rotations_lose_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys");
        generate(&p, 1, false).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..3 {
                        rotate(&p, MAX_KEYS).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let keys = read(&p, None).unwrap();
        assert_eq!(keys.len(), 1 + 8 * 3);
    }

    #[test]
    fn generate_then_rotate_keeps_order_mode_and_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys");
        generate(&p, 2, false).unwrap();
        assert_eq!(mode(&p), 0o600);
        let first = read(&p, None).unwrap();
        assert_eq!(first.len(), 2);
        assert_ne!(first[0].expose(), first[1].expose());
        let e = generate(&p, 1, false).unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");

        let r = rotate(&p, 3).unwrap();
        assert_eq!(
            r,
            Rotated {
                kept: 3,
                dropped: 0
            }
        );
        let second = read(&p, None).unwrap();
        assert_eq!(second[1].expose(), first[0].expose(), "new key in front");
        assert_eq!(second[2].expose(), first[1].expose());
        let r = rotate(&p, 2).unwrap();
        assert_eq!(
            r,
            Rotated {
                kept: 2,
                dropped: 2
            }
        );
        let third = read(&p, None).unwrap();
        assert_eq!(third[1].expose(), second[0].expose());
        assert_eq!(mode(&p), 0o600);
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn open_permissions_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys");
        generate(&p, 1, false).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read(&p, None).unwrap_err();
        assert_eq!(e.path, p);
        assert!(e.to_string().contains("0640"), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert!(
            rotate(&p, 2).is_err(),
            "rotate reads through the same check"
        );
        let e = read(dir.path(), None).unwrap_err();
        assert!(e.problem.contains("regular file"), "{e}");
    }

    /// `rotate` works in a scratch directory anyone may write (the
    /// CronJob's emptyDir); the file itself must still pass.
    #[test]
    fn rotate_checks_the_file_not_the_scratch_directory_it_is_in() {
        // A Kubernetes emptyDir with an fsGroup: mode 2777, no sticky bit.
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("work");
        std::fs::create_dir(&scratch).unwrap();
        let p = scratch.join("keys");
        generate(&p, 1, false).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o2777)).unwrap();
        assert_eq!(rotate(&p, 3).unwrap().kept, 2);
        // A server would not take it from there.
        assert!(read(&p, None).is_err());
        // The file itself is still checked.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(rotate(&p, 3).is_err());
    }

    /// Like OpenSSH's StrictModes: a file another user owns, or one in a
    /// directory another user can change, is refused naming what is wrong.
    #[test]
    fn a_file_or_directory_others_could_change_is_refused_naming_it() {
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("keys.d");
        std::fs::create_dir(&sub).unwrap();
        let p = sub.join("keys");
        generate(&p, 1, false).unwrap();
        for (m, ok) in [
            (0o777, false),
            (0o775, false),
            (0o757, false),
            (0o1777, true),
            (0o755, true),
            (0o700, true),
        ] {
            set(&sub, m);
            match read(&p, None) {
                Ok(_) => assert!(ok, "{m:o} accepted"),
                Err(e) => {
                    assert!(!ok, "{m:o}: {e}");
                    assert_eq!(e.path, p);
                    assert!(
                        e.problem
                            .contains(&format!("{} has mode {m:04o}", sub.display())),
                        "{e}"
                    );
                    assert!(e.problem.contains("chmod go-w"), "{e}");
                }
            }
        }
        // A link in a directory anyone may write is as good as the file.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        set(&open, 0o777);
        let link = open.join("keys");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let e = read(&link, None).unwrap_err();
        assert!(
            e.problem
                .contains(&format!("{} has mode 0777", open.display())),
            "{e}"
        );
        if tlsgate_sys::privileges::effective_uid() != 0 {
            return; // chown below needs root
        }
        let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), None).unwrap();
        chown(&p, 4321);
        let e = read(&p, None).unwrap_err();
        assert!(e.problem.contains("owned by uid 4321"), "{e}");
        assert!(e.problem.contains("expected a file owned by uid 0"), "{e}");
        // server.user's own file is fine, and root may rotate it.
        assert_eq!(read(&p, Some(4321)).unwrap().len(), 1);
        assert_eq!(rotate(&p, 3).unwrap().kept, 2);
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 4321);
        chown(&p, 0);
        chown(&sub, 4321);
        let e = read(&p, None).unwrap_err();
        assert!(
            e.problem
                .contains(&format!("{} is owned by uid 4321", sub.display())),
            "{e}"
        );
        assert!(read(&p, Some(4321)).is_ok());
    }

    #[test]
    fn malformed_files_are_refused_without_quoting_keys() {
        let k = STANDARD.encode([7u8; KEY_LEN]);
        let short = STANDARD.encode([7u8; 31]);
        let long = STANDARD.encode([7u8; 33]);
        let cases: &[(String, &str)] = &[
            (String::new(), "first line"),
            (format!("{k}\n"), "first line"),
            ("tlsgate-ticket-keys v2\n".to_string(), "first line"),
            (format!("{HEADER}\n# only a comment\n"), "at least one key"),
            (format!("{HEADER}\n{short}\n"), "line 2"),
            (format!("{HEADER}\n\n{long}\n"), "line 3"),
            (format!("{HEADER}\nnot base64!\n"), "line 2"),
            (format!("{HEADER}\n{k}\n{k}\n"), "repeats the key of line 2"),
        ];
        for (text, needle) in cases {
            let e = parse(text.as_bytes()).map(|_| ()).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains(&k[..20]), "never quote a key: {e}");
        }
        let many: String = (0..=MAX_KEYS)
            .map(|i| STANDARD.encode([i as u8; KEY_LEN]) + "\n")
            .collect();
        let e = parse(format!("{HEADER}\n{many}").as_bytes())
            .map(|_| ())
            .unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let ok = parse(format!("{HEADER}\r\n# c\r\n\r\n  {k}  \r\n").as_bytes()).unwrap();
        assert_eq!(ok[0].expose(), &[7u8; KEY_LEN]);
        assert_eq!(format!("{:?}", ok[0]), "Secret(..)");
    }
}
