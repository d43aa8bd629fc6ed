//! Safe mapping of request paths to files under a document root.
//!
//! A request path is percent-decoded (a decoded `%2f` is a separator, a
//! backslash is an ordinary byte, any byte except NUL is allowed since Linux
//! paths are bytes), normalised (empty and `.` segments dropped, `..` pops,
//! `..` above the root is [`LookupError::BadPath`]) and then opened
//! *relative to an open directory fd of the root* with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so the kernel guarantees that no
//! symlink, `..` or concurrent rename can make the lookup escape the root.
//! Symlinks that stay inside the root are followed; note that under
//! `RESOLVE_BENEATH` an *absolute* symlink is always refused, even when it
//! points inside the root, so use relative symlinks.
//!
//! With [`RootOptions::allow_symlinks_outside_root`] only
//! `RESOLVE_NO_MAGICLINKS` is used: symlinks may then lead anywhere, but the
//! normalised request path itself still cannot climb out of the root.
//!
//! On kernels without `openat2` (`ENOSYS`, Linux < 5.6) the file is opened
//! with plain `openat` and its real path (via `/proc/self/fd`, else
//! `canonicalize`) is checked to lie under the canonical root.
//!
//! Hidden files (dot files such as `.htaccess` or `.git/`) are served like any
//! other file: there is deliberately no special case, so don't put secrets in
//! the document root.
//!
//! Files are opened `O_RDONLY | O_CLOEXEC | O_NOCTTY` **plus `O_NONBLOCK`**,
//! so that opening a FIFO can never block the caller; the type is then taken
//! from `fstat` of the opened fd and, for regular files, `O_NONBLOCK` is
//! cleared again before the [`File`] is handed out. FIFOs, sockets and devices
//! are [`LookupError::Forbidden`].
//!
//! A path naming a regular file but ending in `/` (e.g. `/a.txt/`) is
//! [`LookupError::NotFound`], like the kernel's `ENOTDIR`.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::cache::{CacheOptions, OpenFileCache};
use crate::error::{LookupError, RootError};
use crate::meta::{content_type_for, FileMeta};

/// Bytes escaped when building a redirect location: everything except the
/// RFC 3986 unreserved characters and `/`.
const LOCATION_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Options for a [`DocumentRoot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootOptions {
    /// File names tried, in order, when a directory is requested with a
    /// trailing slash. Each must be a plain file name (no `/`, not `.`/`..`).
    /// Default: `["index.html"]`.
    pub index_files: Vec<String>,
    /// Follow symlinks that lead outside the root. Default: `false`.
    pub allow_symlinks_outside_root: bool,
    /// Keep recently served files open (see [`crate::cache`]). Default: off.
    pub open_file_cache: Option<CacheOptions>,
}

impl Default for RootOptions {
    fn default() -> Self {
        RootOptions {
            index_files: vec!["index.html".to_owned()],
            allow_symlinks_outside_root: false,
            open_file_cache: None,
        }
    }
}

/// An opened document root directory.
#[derive(Debug)]
pub struct DocumentRoot {
    /// `O_PATH | O_DIRECTORY` fd of the root; all lookups are relative to it.
    fd: OwnedFd,
    /// Canonical path of the root.
    path: PathBuf,
    opts: RootOptions,
    /// Cleared the first time `openat2` reports `ENOSYS`.
    openat2_supported: AtomicBool,
    /// Files kept open per worker thread, if configured.
    cache: Option<OpenFileCache>,
}

/// Result of a successful [`DocumentRoot::lookup`].
#[derive(Debug)]
pub enum Found {
    /// A regular file to serve (shared with the open-file cache, if any).
    File(Arc<StaticFile>),
    /// A directory asked for without trailing slash: redirect to this
    /// (percent-encoded) location, e.g. `"/docs/"`.
    Redirect(String),
}

/// An opened regular file and its metadata (taken from the fd, not the path).
#[derive(Debug)]
pub struct StaticFile {
    /// The open file (`O_RDONLY | O_CLOEXEC | O_NOCTTY`, blocking).
    pub file: File,
    /// Length, validators and content type.
    pub meta: FileMeta,
    /// The whole body, read once when the open-file cache took the file
    /// in (files up to its `content_max`): answered without a read, and
    /// consistent with `meta` for as long as the entry is served.
    pub contents: Option<Box<[u8]>>,
}

impl StaticFile {
    /// `len` bytes from `start` out of [`contents`](Self::contents), when
    /// they are kept and the range lies within them; `None`: read them.
    pub fn cached(&self, start: u64, len: usize) -> Option<&[u8]> {
        let from = usize::try_from(start).ok()?;
        self.contents.as_deref()?.get(from..from.checked_add(len)?)
    }

    /// Whether what is served of it still agrees with the file: kept bytes
    /// always do; otherwise its length and modification time must not
    /// have moved since `meta` was taken (one `fstat`), or a file written
    /// in place would go out with a stale length under a stale ETag.
    pub(crate) fn unchanged(&self) -> bool {
        self.contents.is_some()
            || self.file.metadata().is_ok_and(|md| {
                md.len() == self.meta.len && md.modified().ok() == Some(self.meta.modified)
            })
    }
}

/// A decoded and normalised request path.
#[derive(Debug, PartialEq, Eq)]
struct RequestPath {
    /// Normalised segments: non-empty, no `/`, no NUL, never `.` or `..`.
    segments: Vec<Vec<u8>>,
    /// The decoded path ended with `/`.
    trailing_slash: bool,
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Strict percent-decoding: `%` must be followed by two hex digits.
fn percent_decode_strict(raw: &[u8]) -> Result<Vec<u8>, LookupError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'%' {
            let hi = raw.get(i + 1).copied().and_then(hex_val);
            let lo = raw.get(i + 2).copied().and_then(hex_val);
            match (hi, lo) {
                (Some(h), Some(l)) => out.push(h << 4 | l),
                _ => return Err(LookupError::BadPath),
            }
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Ok(out)
}

impl RequestPath {
    fn parse(raw: &[u8]) -> Result<RequestPath, LookupError> {
        if raw.first() != Some(&b'/') {
            return Err(LookupError::BadPath);
        }
        let decoded = percent_decode_strict(raw)?;
        if decoded.contains(&0) {
            return Err(LookupError::BadPath);
        }
        let mut segments: Vec<Vec<u8>> = Vec::new();
        for seg in decoded.split(|&b| b == b'/') {
            match seg {
                b"" | b"." => {}
                b".." => {
                    if segments.pop().is_none() {
                        return Err(LookupError::BadPath);
                    }
                }
                s => segments.push(s.to_vec()),
            }
        }
        Ok(RequestPath {
            segments,
            trailing_slash: decoded.ends_with(b"/"),
        })
    }

    /// The open-file cache's key: `/` before each segment, then `/` if
    /// the path ended with one. Segments hold neither `/` nor NUL, so two
    /// paths share a key only when they name the same segments and
    /// trailing slash, which is all [`DocumentRoot::lookup_uncached`]
    /// resolves: every spelling of one file (`//a`, `/./a`, `/%61`) is one
    /// entry and one descriptor, and two files never share one.
    fn cache_key(&self) -> Vec<u8> {
        let len = self.segments.iter().map(|s| s.len() + 1).sum::<usize>() + 1;
        let mut key = Vec::with_capacity(len);
        for seg in &self.segments {
            key.push(b'/');
            key.extend_from_slice(seg);
        }
        if self.trailing_slash {
            key.push(b'/');
        }
        key
    }

    /// Path relative to the root (`.` for the root itself).
    fn relative(&self) -> OsString {
        if self.segments.is_empty() {
            return OsString::from(".");
        }
        OsString::from_vec(self.segments.join(&b'/'))
    }

    /// Percent-encoded absolute location with a trailing slash.
    fn dir_location(&self) -> String {
        let mut loc = String::from("/");
        for seg in &self.segments {
            loc.extend(percent_encoding::percent_encode(seg, LOCATION_ESCAPE));
            loc.push('/');
        }
        loc
    }
}

/// The cache key of `raw` (see [`RequestPath::cache_key`]): `raw` itself
/// when it is already in that form (no `%`, NUL, empty, `.` or `..`
/// segment but a trailing slash), as most paths are, without allocating;
/// otherwise decoded and normalised.
fn cache_key(raw: &[u8]) -> Result<Cow<'_, [u8]>, LookupError> {
    let normal = raw.strip_prefix(b"/").is_some_and(|rest| {
        !rest.contains(&b'%')
            && !rest.contains(&0)
            && !rest.starts_with(b"/")
            && !rest.windows(2).any(|w| w == b"//")
            && !rest
                .split(|&b| b == b'/')
                .any(|seg| seg == b"." || seg == b"..")
    });
    if normal {
        return Ok(Cow::Borrowed(raw));
    }
    Ok(Cow::Owned(RequestPath::parse(raw)?.cache_key()))
}

fn map_errno(e: Errno) -> LookupError {
    match e {
        Errno::NOENT | Errno::NOTDIR | Errno::NAMETOOLONG => LookupError::NotFound,
        Errno::XDEV | Errno::LOOP | Errno::ACCESS | Errno::PERM | Errno::NXIO | Errno::NODEV => {
            LookupError::Forbidden
        }
        Errno::MFILE | Errno::NFILE => LookupError::NoDescriptors(e.into()),
        other => LookupError::Io(other.into()),
    }
}

fn valid_index_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

impl DocumentRoot {
    /// Opens `dir` as a document root.
    ///
    /// Fails (with a message naming the path) if it is missing, not a
    /// directory, or an index file name is not a plain file name.
    pub fn open(dir: &Path, opts: RootOptions) -> Result<Self, RootError> {
        if let Some(bad) = opts.index_files.iter().find(|n| !valid_index_name(n)) {
            return Err(RootError::InvalidIndexFile {
                name: bad.clone(),
                path: dir.to_path_buf(),
            });
        }
        let path = std::fs::canonicalize(dir).map_err(|source| RootError::Resolve {
            path: dir.to_path_buf(),
            source,
        })?;
        let fd = rustix::fs::open(
            &path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOTDIR => RootError::NotADirectory {
                path: dir.to_path_buf(),
            },
            e => RootError::Open {
                path: path.clone(),
                source: e.into(),
            },
        })?;
        Ok(DocumentRoot {
            fd,
            path,
            cache: opts.open_file_cache.map(OpenFileCache::new),
            opts,
            openat2_supported: AtomicBool::new(true),
        })
    }

    /// The canonical path of the root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options this root was opened with.
    pub fn options(&self) -> &RootOptions {
        &self.opts
    }

    /// Maps a request path to a file or a redirect.
    ///
    /// `raw_path` is the request path exactly as sent (percent-encoded, no
    /// query). With an open-file cache, a file served recently by this
    /// thread comes from it, without a system call.
    pub fn lookup(&self, raw_path: &[u8]) -> Result<Found, LookupError> {
        match &self.cache {
            Some(cache) => {
                let keep = cache.content_max();
                // Keyed on the path as resolved, not as spelled: one
                // client could otherwise hold a descriptor per spelling.
                let key = cache_key(raw_path)?;
                cache.get_or_lookup(&key, Instant::now(), || {
                    self.lookup_uncached(raw_path, keep)
                })
            }
            None => self.lookup_uncached(raw_path, 0),
        }
    }

    /// Lets go of the files this thread's open-file cache holds past
    /// their validity (call it now and then from every worker thread).
    pub fn sweep_cache(&self) {
        if let Some(cache) = &self.cache {
            cache.sweep(Instant::now());
        }
    }

    /// How long cached files are trusted, if this root has a cache.
    pub fn cache_valid(&self) -> Option<std::time::Duration> {
        self.opts.open_file_cache.map(|c| c.valid)
    }

    /// The lookup itself; files of at most `keep_contents` bytes (if not
    /// 0) are read whole into [`StaticFile::contents`].
    pub(crate) fn lookup_uncached(
        &self,
        raw_path: &[u8],
        keep_contents: u64,
    ) -> Result<Found, LookupError> {
        let req = RequestPath::parse(raw_path)?;
        let rel = req.relative();
        let file = self.open_beneath(&rel)?;
        let md = file.metadata().map_err(LookupError::Io)?;
        let ft = md.file_type();
        if ft.is_file() {
            if req.trailing_slash {
                return Err(LookupError::NotFound);
            }
            let name = req.segments.last().map(|s| s.as_slice()).unwrap_or(b"");
            return finish_file(file, &md, OsStr::from_bytes(name), keep_contents);
        }
        if !ft.is_dir() {
            return Err(LookupError::Forbidden);
        }
        drop(file);
        if !req.trailing_slash {
            return Ok(Found::Redirect(req.dir_location()));
        }
        for index in &self.opts.index_files {
            let mut idx_rel = rel.clone();
            idx_rel.push("/");
            idx_rel.push(index);
            let file = match self.open_beneath(&idx_rel) {
                Ok(f) => f,
                Err(LookupError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let md = file.metadata().map_err(LookupError::Io)?;
            if md.file_type().is_file() {
                return finish_file(file, &md, OsStr::new(index), keep_contents);
            }
        }
        Err(LookupError::Forbidden)
    }

    /// Opens `rel` (normalised, relative) beneath the root.
    ///
    /// The file is opened with `O_NONBLOCK` so that opening a FIFO cannot
    /// block; [`finish_file`] clears it again for regular files.
    fn open_beneath(&self, rel: &OsStr) -> Result<File, LookupError> {
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        if self.openat2_supported.load(Ordering::Relaxed) {
            let resolve = if self.opts.allow_symlinks_outside_root {
                ResolveFlags::NO_MAGICLINKS
            } else {
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
            };
            match rustix::fs::openat2(&self.fd, rel, flags, Mode::empty(), resolve) {
                Ok(fd) => return Ok(File::from(fd)),
                Err(Errno::NOSYS) => self.openat2_supported.store(false, Ordering::Relaxed),
                Err(e) => return Err(map_errno(e)),
            }
        }
        self.open_fallback(rel, flags)
    }

    /// `openat` + after-the-fact containment check, for kernels without
    /// `openat2`.
    fn open_fallback(&self, rel: &OsStr, flags: OFlags) -> Result<File, LookupError> {
        let fd = rustix::fs::openat(&self.fd, rel, flags, Mode::empty()).map_err(map_errno)?;
        if !self.opts.allow_symlinks_outside_root {
            let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .ok()
                .filter(|p| p.is_absolute())
                .map(Ok)
                .unwrap_or_else(|| std::fs::canonicalize(self.path.join(rel)))
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => LookupError::NotFound,
                    _ => LookupError::Io(e),
                })?;
            if !real.starts_with(&self.path) {
                return Err(LookupError::Forbidden);
            }
        }
        Ok(File::from(fd))
    }

    #[cfg(test)]
    fn force_fallback(&self) {
        self.openat2_supported.store(false, Ordering::Relaxed);
    }
}

/// Clears `O_NONBLOCK` and builds the [`Found::File`], with its bytes
/// when it is not empty and at most `keep_contents` long.
fn finish_file(
    file: File,
    md: &std::fs::Metadata,
    name: &OsStr,
    keep_contents: u64,
) -> Result<Found, LookupError> {
    let fl = rustix::fs::fcntl_getfl(&file).map_err(|e| LookupError::Io(e.into()))?;
    rustix::fs::fcntl_setfl(&file, fl - OFlags::NONBLOCK).map_err(|e| LookupError::Io(e.into()))?;
    let meta = FileMeta::from_metadata(md, content_type_for(Path::new(name)));
    let contents = if meta.len > 0 && meta.len <= keep_contents {
        read_whole(&file, meta.len)
    } else {
        None
    };
    Ok(Found::File(Arc::new(StaticFile {
        file,
        meta,
        contents,
    })))
}

/// `len` bytes from the start of `file`; `None` if it is shorter now (it
/// changed since its metadata was read: it is then read per response, as
/// without contents kept) or the read fails.
fn read_whole(file: &File, len: u64) -> Option<Box<[u8]>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut buf, 0).ok()?;
    Some(buf.into_boxed_slice())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    struct Tree {
        _tmp: tempfile::TempDir,
        /// `<tmp>/outside.txt` lives outside the root.
        root: PathBuf,
    }

    /// <tmp>/
    ///   outside.txt           "secret"
    ///   www/                  (root)
    ///     a.txt               "hello"
    ///     .hidden             "dot"
    ///     back\slash          "bs"
    ///     sp ace.txt          "space"
    ///     docs/index.html     "<h1>docs</h1>"
    ///     docs/sub/b.txt      "b"
    ///     empty/              (no index)
    ///     link-in -> docs/sub/b.txt
    ///     link-dir -> docs
    ///     link-out -> ../outside.txt
    ///     link-abs -> <tmp>/outside.txt
    ///     link-loop -> link-loop
    ///     nix/index.html/     (directory named like an index)
    fn tree() -> Tree {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::write(base.join("outside.txt"), "secret").unwrap();
        let root = base.join("www");
        std::fs::create_dir_all(root.join("docs/sub")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::create_dir_all(root.join("nix/index.html")).unwrap();
        std::fs::write(root.join("a.txt"), "hello").unwrap();
        std::fs::write(root.join(".hidden"), "dot").unwrap();
        std::fs::write(root.join("back\\slash"), "bs").unwrap();
        std::fs::write(root.join("sp ace.txt"), "space").unwrap();
        std::fs::write(root.join("docs/index.html"), "<h1>docs</h1>").unwrap();
        std::fs::write(root.join("docs/sub/b.txt"), "b").unwrap();
        symlink("docs/sub/b.txt", root.join("link-in")).unwrap();
        symlink("docs", root.join("link-dir")).unwrap();
        symlink("../outside.txt", root.join("link-out")).unwrap();
        symlink(base.join("outside.txt"), root.join("link-abs")).unwrap();
        symlink("link-loop", root.join("link-loop")).unwrap();
        Tree { _tmp: tmp, root }
    }

    fn open(t: &Tree) -> DocumentRoot {
        DocumentRoot::open(&t.root, RootOptions::default()).unwrap()
    }

    fn body(found: Found) -> String {
        match found {
            Found::File(f) => {
                let mut s = String::new();
                (&f.file).read_to_string(&mut s).unwrap();
                s
            }
            Found::Redirect(r) => panic!("unexpected redirect to {r}"),
        }
    }

    fn err(root: &DocumentRoot, p: &[u8]) -> u16 {
        match root.lookup(p) {
            Ok(f) => panic!(
                "{:?}: expected error, got {f:?}",
                String::from_utf8_lossy(p)
            ),
            Err(e) => e.status(),
        }
    }

    /// Runs `check` both with openat2 and with the ENOSYS fallback.
    fn both(opts: RootOptions, check: impl Fn(&DocumentRoot)) {
        let t = tree();
        let r = DocumentRoot::open(&t.root, opts.clone()).unwrap();
        check(&r);
        let r = DocumentRoot::open(&t.root, opts).unwrap();
        r.force_fallback();
        check(&r);
    }

    #[test]
    fn decode_and_normalise() {
        let p = RequestPath::parse(b"/a//./b/../c%2Fd/").unwrap();
        assert_eq!(
            p.segments,
            vec![b"a".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        assert!(p.trailing_slash);
        assert_eq!(p.relative(), OsString::from("a/c/d"));
        let p = RequestPath::parse(b"/").unwrap();
        assert!(p.segments.is_empty());
        assert_eq!(p.relative(), OsString::from("."));
        let p = RequestPath::parse(b"/%ff%FE").unwrap();
        assert_eq!(p.segments, vec![vec![0xff, 0xfe]]);
        assert!(RequestPath::parse(b"/a/..").is_ok());
        assert!(RequestPath::parse(b"/..").is_err());
    }

    #[test]
    fn open_errors_name_path() {
        let t = tree();
        let missing = t.root.join("nope");
        let e = DocumentRoot::open(&missing, RootOptions::default()).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let file = t.root.join("a.txt");
        let e = DocumentRoot::open(&file, RootOptions::default()).unwrap_err();
        assert!(matches!(e, RootError::NotADirectory { .. }), "{e:?}");
        assert!(e.to_string().contains("a.txt"), "{e}");
        for bad in ["", ".", "..", "a/b", "x\0"] {
            let opts = RootOptions {
                index_files: vec![bad.to_owned()],
                ..RootOptions::default()
            };
            assert!(matches!(
                DocumentRoot::open(&t.root, opts),
                Err(RootError::InvalidIndexFile { .. })
            ));
        }
    }

    #[test]
    fn root_path_is_canonical() {
        let t = tree();
        let via_dots = t.root.join("docs/..");
        let r = DocumentRoot::open(&via_dots, RootOptions::default()).unwrap();
        assert_eq!(r.path(), std::fs::canonicalize(&t.root).unwrap());
    }

    #[test]
    fn serves_regular_file_with_meta() {
        both(RootOptions::default(), |r| {
            let Found::File(f) = r.lookup(b"/a.txt").unwrap() else {
                panic!("expected file")
            };
            assert_eq!(f.meta.len, 5);
            assert_eq!(f.meta.content_type, "text/plain; charset=utf-8");
            assert!(f.meta.etag.starts_with('"') && f.meta.etag.ends_with('"'));
            let fl = rustix::fs::fcntl_getfl(&f.file).unwrap();
            assert!(!fl.contains(OFlags::NONBLOCK));
            assert_eq!(body(Found::File(f)), "hello");
        });
    }

    #[test]
    fn percent_encoded_names() {
        both(RootOptions::default(), |r| {
            assert_eq!(body(r.lookup(b"/%61.txt").unwrap()), "hello");
            assert_eq!(body(r.lookup(b"/sp%20ace.txt").unwrap()), "space");
            assert_eq!(body(r.lookup(b"/docs%2fsub%2Fb.txt").unwrap()), "b");
            assert_eq!(body(r.lookup(b"/back\\slash").unwrap()), "bs");
            assert_eq!(body(r.lookup(b"/back%5cslash").unwrap()), "bs");
            assert_eq!(err(r, b"/%ff"), 404);
        });
    }

    #[test]
    fn hidden_files_are_served() {
        both(RootOptions::default(), |r| {
            assert_eq!(body(r.lookup(b"/.hidden").unwrap()), "dot");
        });
    }

    #[test]
    fn dot_segments_inside_root_are_fine() {
        both(RootOptions::default(), |r| {
            assert_eq!(body(r.lookup(b"/docs/../a.txt").unwrap()), "hello");
            assert_eq!(
                body(r.lookup(b"/./docs/sub/./../../a.txt").unwrap()),
                "hello"
            );
            assert_eq!(body(r.lookup(b"//a.txt").unwrap()), "hello");
            assert_eq!(body(r.lookup(b"/docs/%2e%2E/a.txt").unwrap()), "hello");
        });
    }

    #[test]
    fn traversal_is_bad_path() {
        both(RootOptions::default(), |r| {
            for p in [
                &b"/../etc/passwd"[..],
                b"/%2e%2e/x",
                b"/%2E%2E/x",
                b"/a/%2E%2E/%2e%2e/x",
                b"/%2f..%2f",
                b"/%2F..%2Fouside.txt",
                b"/docs/../../outside.txt",
                b"/..",
                b"/docs/sub/../../..",
            ] {
                assert_eq!(err(r, p), 400, "{}", String::from_utf8_lossy(p));
            }
        });
    }

    #[test]
    fn malformed_paths_are_bad() {
        both(RootOptions::default(), |r| {
            for p in [
                &b""[..],
                b"a.txt",
                b"*",
                b"http://x/a.txt",
                b"/%zz",
                b"/%4",
                b"/a%",
                b"/a%g1",
                b"/%00",
                b"/a.txt%00.png",
                b"/a\0b",
            ] {
                assert_eq!(err(r, p), 400, "{}", String::from_utf8_lossy(p));
            }
        });
    }

    #[test]
    fn missing_is_not_found() {
        both(RootOptions::default(), |r| {
            assert_eq!(err(r, b"/nope.txt"), 404);
            assert_eq!(err(r, b"/nope/deeper.txt"), 404);
            assert_eq!(err(r, b"/a.txt/x"), 404); // ENOTDIR
            assert_eq!(err(r, b"/a.txt/"), 404); // file with trailing slash
            let long = format!("/{}", "x".repeat(5000));
            assert_eq!(err(r, long.as_bytes()), 404);
        });
    }

    #[test]
    fn symlink_inside_root_ok() {
        both(RootOptions::default(), |r| {
            assert_eq!(body(r.lookup(b"/link-in").unwrap()), "b");
            assert_eq!(body(r.lookup(b"/link-dir/sub/b.txt").unwrap()), "b");
            assert_eq!(body(r.lookup(b"/link-dir/").unwrap()), "<h1>docs</h1>");
        });
    }

    #[test]
    fn symlink_outside_root_forbidden() {
        both(RootOptions::default(), |r| {
            assert_eq!(err(r, b"/link-out"), 403);
            assert_eq!(err(r, b"/link-abs"), 403);
            assert_eq!(err(r, b"/link-loop"), 403);
        });
    }

    #[test]
    fn symlink_outside_root_allowed_with_option() {
        let opts = RootOptions {
            allow_symlinks_outside_root: true,
            ..RootOptions::default()
        };
        both(opts, |r| {
            assert_eq!(body(r.lookup(b"/link-out").unwrap()), "secret");
            assert_eq!(body(r.lookup(b"/link-abs").unwrap()), "secret");
            // `..` in the request still cannot escape.
            assert_eq!(err(r, b"/../outside.txt"), 400);
            assert_eq!(err(r, b"/%2e%2e/outside.txt"), 400);
        });
    }

    #[test]
    fn directory_redirect() {
        both(RootOptions::default(), |r| {
            let redirect = |p: &[u8]| match r.lookup(p).unwrap() {
                Found::Redirect(l) => l,
                Found::File(_) => panic!("expected redirect"),
            };
            assert_eq!(redirect(b"/docs"), "/docs/");
            assert_eq!(redirect(b"/docs/sub"), "/docs/sub/");
            assert_eq!(redirect(b"/docs/sub/.."), "/docs/");
            assert_eq!(redirect(b"/empty"), "/empty/");
            assert_eq!(redirect(b"/."), "/");
            assert_eq!(redirect(b"/link-dir"), "/link-dir/");
        });
    }

    #[test]
    fn redirect_location_is_encoded() {
        let t = tree();
        std::fs::create_dir(t.root.join("we ird?#%\u{e9}")).unwrap();
        let r = open(&t);
        match r.lookup(b"/we%20ird%3F%23%25%C3%A9").unwrap() {
            Found::Redirect(l) => assert_eq!(l, "/we%20ird%3F%23%25%C3%A9/"),
            Found::File(_) => panic!("expected redirect"),
        }
    }

    #[test]
    fn index_file_served() {
        both(RootOptions::default(), |r| {
            let Found::File(f) = r.lookup(b"/docs/").unwrap() else {
                panic!("expected file")
            };
            assert_eq!(f.meta.content_type, "text/html; charset=utf-8");
            assert_eq!(body(Found::File(f)), "<h1>docs</h1>");
            assert_eq!(body(r.lookup(b"/docs%2F").unwrap()), "<h1>docs</h1>");
        });
    }

    #[test]
    fn index_order_and_root_index() {
        let t = tree();
        std::fs::write(t.root.join("index.htm"), "htm").unwrap();
        let opts = RootOptions {
            index_files: vec![
                "missing.html".into(),
                "index.htm".into(),
                "index.html".into(),
            ],
            ..RootOptions::default()
        };
        let r = DocumentRoot::open(&t.root, opts).unwrap();
        assert_eq!(body(r.lookup(b"/").unwrap()), "htm");
        assert_eq!(body(r.lookup(b"/docs/").unwrap()), "<h1>docs</h1>");
    }

    #[test]
    fn dir_without_index_forbidden() {
        both(RootOptions::default(), |r| {
            assert_eq!(err(r, b"/empty/"), 403);
            assert_eq!(err(r, b"/docs/sub/"), 403);
            assert_eq!(err(r, b"/"), 403);
            // An "index.html" that is itself a directory is not an index file.
            assert_eq!(err(r, b"/nix/"), 403);
        });
        let t = tree();
        let opts = RootOptions {
            index_files: vec![],
            ..RootOptions::default()
        };
        let r = DocumentRoot::open(&t.root, opts).unwrap();
        assert_eq!(err(&r, b"/docs/"), 403);
    }

    #[test]
    fn index_symlink_escaping_forbidden() {
        let t = tree();
        symlink("../../outside.txt", t.root.join("empty/index.html")).unwrap();
        let r = open(&t);
        assert_eq!(err(&r, b"/empty/"), 403);
        r.force_fallback();
        assert_eq!(err(&r, b"/empty/"), 403);
    }

    #[test]
    fn fifo_forbidden() {
        let t = tree();
        let fifo = t.root.join("pipe");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let r = open(&t);
        assert_eq!(err(&r, b"/pipe"), 403);
        r.force_fallback();
        assert_eq!(err(&r, b"/pipe"), 403);
    }

    #[test]
    fn socket_forbidden() {
        let t = tree();
        let _l = std::os::unix::net::UnixListener::bind(t.root.join("sock")).unwrap();
        let r = open(&t);
        assert_eq!(err(&r, b"/sock"), 403);
    }

    #[test]
    fn device_forbidden_when_reachable() {
        let t = tree();
        symlink("/dev/null", t.root.join("null")).unwrap();
        let opts = RootOptions {
            allow_symlinks_outside_root: true,
            ..RootOptions::default()
        };
        let r = DocumentRoot::open(&t.root, opts).unwrap();
        assert_eq!(err(&r, b"/null"), 403);
        // Magic links (/proc/self/fd/N, /proc/self/root) are never followed.
        symlink("/proc/self/root/etc", t.root.join("magic")).unwrap();
        assert_eq!(err(&r, b"/magic/hostname"), 403);
    }

    #[test]
    fn root_moved_keeps_working_via_fd() {
        let t = tree();
        let r = open(&t);
        let moved = t.root.with_file_name("moved");
        std::fs::rename(&t.root, &moved).unwrap();
        assert_eq!(body(r.lookup(b"/a.txt").unwrap()), "hello");
    }

    #[test]
    fn absolute_symlink_inside_root() {
        let t = tree();
        symlink(t.root.join("a.txt"), t.root.join("abs-in")).unwrap();
        let r = open(&t);
        let status = r
            .lookup(b"/abs-in")
            .map(|_| 200)
            .unwrap_or_else(|e| e.status());
        if r.openat2_supported.load(Ordering::Relaxed) {
            // RESOLVE_BENEATH refuses absolute symlinks outright.
            assert_eq!(status, 403);
        } else {
            assert_eq!(status, 200);
        }
        r.force_fallback();
        assert_eq!(body(r.lookup(b"/abs-in").unwrap()), "hello");
    }

    #[test]
    fn document_root_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<DocumentRoot>();
        check::<Found>();
    }

    #[test]
    fn errno_mapping() {
        for e in [Errno::NOENT, Errno::NOTDIR, Errno::NAMETOOLONG] {
            assert_eq!(map_errno(e).status(), 404, "{e:?}");
        }
        for e in [
            Errno::XDEV,
            Errno::LOOP,
            Errno::ACCESS,
            Errno::PERM,
            Errno::NXIO,
        ] {
            assert_eq!(map_errno(e).status(), 403, "{e:?}");
        }
        assert_eq!(map_errno(Errno::IO).status(), 500);
        assert_eq!(map_errno(Errno::MFILE).status(), 503);
        assert_eq!(map_errno(Errno::NFILE).status(), 503);
    }

    #[test]
    fn unreadable_file_forbidden() {
        let t = tree();
        let p = t.root.join("private.txt");
        std::fs::write(&p, "x").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
        // Root (CAP_DAC_OVERRIDE) bypasses permission checks: nothing to test.
        if File::open(&p).is_ok() {
            return;
        }
        let r = open(&t);
        assert_eq!(err(&r, b"/private.txt"), 403);
    }

    #[test]
    fn cache_key_is_the_resolved_path() {
        // The fast path (borrowed) and the full parse agree.
        for raw in [&b"/"[..], b"/a.txt", b"/d/", b"/d/e/f.txt", b"/a.b..c"] {
            let key = cache_key(raw).unwrap();
            assert!(matches!(key, Cow::Borrowed(_)), "{raw:?} borrowed");
            assert_eq!(&*key, RequestPath::parse(raw).unwrap().cache_key());
        }
        for raw in [
            &b"//a.txt"[..],
            b"/./a.txt",
            b"/%61.txt",
            b"/x/../a.txt",
            b"/a.txt/.",
            b"///a.txt",
        ] {
            assert_eq!(&*cache_key(raw).unwrap(), b"/a.txt", "{raw:?}");
        }
        assert_eq!(&*cache_key(b"//d//").unwrap(), b"/d/");
        assert_eq!(&*cache_key(b"/%2F").unwrap(), b"/");
        // Different resolutions never share a key.
        assert_ne!(cache_key(b"/d").unwrap(), cache_key(b"/d/").unwrap());
        assert_ne!(
            cache_key(b"/a%2Fb").unwrap(),
            cache_key(b"/a%252Fb").unwrap()
        );
        assert_ne!(cache_key(b"/ab").unwrap(), cache_key(b"/a/b").unwrap());
        assert!(cache_key(b"/..").is_err());
        assert!(cache_key(b"/%zz").is_err());
    }

    #[test]
    fn spellings_of_one_file_are_one_cache_entry() {
        let t = tree();
        let opts = RootOptions {
            open_file_cache: Some(crate::CacheOptions {
                entries: std::num::NonZeroUsize::new(64).unwrap(),
                valid: std::time::Duration::from_secs(60),
                content_max: 0,
            }),
            ..RootOptions::default()
        };
        let root = DocumentRoot::open(&t.root, opts).unwrap();
        let cache = root.cache.as_ref().unwrap();
        let first = match root.lookup(b"/docs/sub/b.txt").unwrap() {
            Found::File(f) => f,
            Found::Redirect(r) => panic!("unexpected redirect to {r}"),
        };
        for i in 1..=40 {
            let mut raw = b"/".repeat(i);
            raw.extend_from_slice(b"docs/./sub/%62.txt");
            match root.lookup(&raw).unwrap() {
                Found::File(f) => assert!(Arc::ptr_eq(&f, &first), "{i}: the cached file"),
                Found::Redirect(r) => panic!("unexpected redirect to {r}"),
            }
        }
        assert_eq!(cache.len(), 1, "one entry for 40 spellings");
        // A different file is a different entry.
        assert_eq!(body(root.lookup(b"/docs/").unwrap()), "<h1>docs</h1>");
        assert_eq!(cache.len(), 2);
    }
}
