//! The open-file cache of a document root (like nginx's `open_file_cache`):
//! the descriptor, metadata and validators of recently served files, per
//! worker thread, so that serving a small file again costs no `openat2`,
//! `fstat`, two `fcntl` and `close` — five of the six system calls of a
//! cache miss, and most of a small response's cost over HTTP/2.
//!
//! An entry is trusted for [`CacheOptions::valid`] after its file was
//! opened, then looked up again (a file replaced by a rename is seen by
//! then; one modified in place is read through the same descriptor, as
//! without a cache). Entries are bounded per thread
//! ([`CacheOptions::entries`], least recently used out first); each holds
//! one descriptor. Only regular files are kept: redirects and errors are
//! looked up every time, so nothing a client sends can fill the cache with
//! paths that do not exist. Each thread has its own map (no lock on the
//! request path), dropped with the root when a reload replaces it.

use std::cell::RefCell;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lru::LruCache;
use thread_local::ThreadLocal;

use crate::error::LookupError;
use crate::root::{Found, StaticFile};

/// How big an open-file cache is and how long it trusts an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Files kept open per worker thread (each is one descriptor).
    pub entries: NonZeroUsize,
    /// How long after opening a file its entry is served without a lookup.
    pub valid: Duration,
    /// Files up to this many bytes are read once, when their entry is made,
    /// and answered from memory after that ([`StaticFile::contents`]);
    /// 0 keeps no bytes.
    pub content_max: u64,
}

/// One file as cached.
struct Entry {
    file: Arc<StaticFile>,
    opened: Instant,
}

/// The per-thread caches of one root.
pub(crate) struct OpenFileCache {
    per_thread: ThreadLocal<RefCell<LruCache<Box<[u8]>, Entry>>>,
    opts: CacheOptions,
}

impl std::fmt::Debug for OpenFileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenFileCache")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl OpenFileCache {
    pub(crate) fn new(opts: CacheOptions) -> Self {
        Self {
            per_thread: ThreadLocal::new(),
            opts,
        }
    }

    /// Files up to this size are kept with their bytes (0: none).
    pub(crate) fn content_max(&self) -> u64 {
        self.opts.content_max
    }

    /// The file for `raw_path` from this thread's cache while its entry is
    /// valid; otherwise `lookup`'s answer, kept when it is a file.
    pub(crate) fn get_or_lookup(
        &self,
        raw_path: &[u8],
        now: Instant,
        lookup: impl FnOnce() -> Result<Found, LookupError>,
    ) -> Result<Found, LookupError> {
        let cell = self
            .per_thread
            .get_or(|| RefCell::new(LruCache::new(self.opts.entries)));
        // Never held across `lookup`: nothing else borrows it meanwhile,
        // but a short borrow keeps that obvious.
        if let Some(hit) = cell.borrow_mut().get(raw_path) {
            if now.saturating_duration_since(hit.opened) < self.opts.valid && hit.file.unchanged() {
                return Ok(Found::File(Arc::clone(&hit.file)));
            }
        }
        let found = lookup();
        let mut map = cell.borrow_mut();
        match &found {
            Ok(Found::File(file)) => {
                map.put(
                    raw_path.into(),
                    Entry {
                        file: Arc::clone(file),
                        opened: now,
                    },
                );
            }
            // Gone, or no longer a file: the stale entry goes too.
            _ => {
                map.pop(raw_path);
            }
        }
        found
    }

    /// Drops this thread's expired entries, so that files deleted or
    /// replaced are let go (their disk space freed) without waiting for a
    /// request for the same path.
    pub(crate) fn sweep(&self, now: Instant) {
        let Some(cell) = self.per_thread.get() else {
            return;
        };
        let mut map = cell.borrow_mut();
        let expired: Vec<Box<[u8]>> = map
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.opened) >= self.opts.valid)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            map.pop(&key);
        }
    }

    /// Entries this thread holds (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.per_thread.get().map_or(0, |c| c.borrow().len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::root::{DocumentRoot, RootOptions};

    const VALID: Duration = Duration::from_secs(2);

    fn setup(entries: usize) -> (tempfile::TempDir, DocumentRoot, OpenFileCache) {
        let tmp = tempfile::tempdir().unwrap();
        for (name, body) in [("a.txt", "hello"), ("b.txt", "bee"), ("c.txt", "sea")] {
            std::fs::write(tmp.path().join(name), body).unwrap();
        }
        let root = DocumentRoot::open(tmp.path(), RootOptions::default()).unwrap();
        let cache = OpenFileCache::new(CacheOptions {
            entries: NonZeroUsize::new(entries).unwrap(),
            valid: VALID,
            content_max: 0,
        });
        (tmp, root, cache)
    }

    fn get(root: &DocumentRoot, cache: &OpenFileCache, path: &[u8], at: Instant) -> Found {
        cache
            .get_or_lookup(path, at, || root.lookup_uncached(path, 0))
            .unwrap()
    }

    fn file(found: Found) -> Arc<StaticFile> {
        match found {
            Found::File(f) => f,
            Found::Redirect(r) => panic!("unexpected redirect to {r}"),
        }
    }

    fn body(f: &StaticFile) -> String {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0; usize::try_from(f.meta.len).unwrap()];
        f.file.read_exact_at(&mut buf, 0).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_file_is_opened_once_while_valid() {
        let (_tmp, root, cache) = setup(8);
        let t0 = Instant::now();
        let first = file(get(&root, &cache, b"/a.txt", t0));
        let again = file(get(&root, &cache, b"/a.txt", t0 + VALID / 2));
        assert!(Arc::ptr_eq(&first, &again), "served from the cache");
        assert_eq!(body(&again), "hello");
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_replaced_file_is_seen_once_its_entry_expires() {
        let (tmp, root, cache) = setup(8);
        let t0 = Instant::now();
        let old = file(get(&root, &cache, b"/a.txt", t0));
        let new = tmp.path().join("new.txt");
        std::fs::write(&new, "replaced").unwrap();
        std::fs::rename(&new, tmp.path().join("a.txt")).unwrap();
        // Still within `valid`: the old file, whole and consistent.
        let within = file(get(&root, &cache, b"/a.txt", t0 + VALID / 2));
        assert_eq!(body(&within), "hello");
        let after = file(get(&root, &cache, b"/a.txt", t0 + VALID));
        assert!(!Arc::ptr_eq(&old, &after));
        assert_eq!(body(&after), "replaced");
        assert_ne!(old.meta.etag, after.meta.etag);
    }

    /// A file written in place keeps its descriptor but not its length:
    /// served with the length and ETag of its entry, a grown file would
    /// go out cut to its old length under its old ETag, looking whole.
    #[test]
    fn a_file_modified_in_place_is_looked_up_again_at_once() {
        use std::io::Write as _;
        let (tmp, root, cache) = setup(8);
        let t0 = Instant::now();
        let old = file(get(&root, &cache, b"/a.txt", t0));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.path().join("a.txt"))
            .unwrap();
        f.write_all(b", world").unwrap();
        let within = file(get(&root, &cache, b"/a.txt", t0 + VALID / 2));
        assert!(!Arc::ptr_eq(&old, &within));
        assert_eq!(within.meta.len, 12);
        assert_eq!(body(&within), "hello, world");
        assert_ne!(old.meta.etag, within.meta.etag);
        // The new entry is kept as any other.
        let again = file(get(&root, &cache, b"/a.txt", t0 + VALID / 2));
        assert!(Arc::ptr_eq(&within, &again));
    }

    #[test]
    fn a_deleted_file_is_gone_from_the_cache_once_expired() {
        let (tmp, root, cache) = setup(8);
        let t0 = Instant::now();
        get(&root, &cache, b"/a.txt", t0);
        std::fs::remove_file(tmp.path().join("a.txt")).unwrap();
        let later =
            cache.get_or_lookup(b"/a.txt", t0 + VALID, || root.lookup_uncached(b"/a.txt", 0));
        assert!(matches!(later, Err(LookupError::NotFound)), "{later:?}");
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn misses_and_redirects_are_not_kept() {
        let (tmp, root, cache) = setup(8);
        std::fs::create_dir(tmp.path().join("dir")).unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(cache
                .get_or_lookup(b"/nope", t0, || root.lookup_uncached(b"/nope", 0))
                .is_err());
        }
        assert!(matches!(
            get(&root, &cache, b"/dir", t0),
            Found::Redirect(_)
        ));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn entries_are_bounded_least_recently_used_out_first() {
        let (_tmp, root, cache) = setup(2);
        let t0 = Instant::now();
        let a = file(get(&root, &cache, b"/a.txt", t0));
        get(&root, &cache, b"/b.txt", t0);
        // a used again: b is now the least recently used.
        get(&root, &cache, b"/a.txt", t0);
        get(&root, &cache, b"/c.txt", t0);
        assert_eq!(cache.len(), 2);
        assert!(Arc::ptr_eq(&a, &file(get(&root, &cache, b"/a.txt", t0))));
    }

    #[test]
    fn a_sweep_drops_expired_entries_only() {
        let (_tmp, root, cache) = setup(8);
        let t0 = Instant::now();
        get(&root, &cache, b"/a.txt", t0);
        get(&root, &cache, b"/b.txt", t0 + VALID / 2);
        cache.sweep(t0 + VALID);
        assert_eq!(cache.len(), 1);
        cache.sweep(t0 + VALID + VALID / 2);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn each_thread_has_its_own_entries() {
        let (_tmp, root, cache) = setup(8);
        get(&root, &cache, b"/a.txt", Instant::now());
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(cache.len(), 0)).join().unwrap();
        });
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_root_uses_its_cache_when_configured() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.txt"), "hello").unwrap();
        let opts = RootOptions {
            open_file_cache: Some(CacheOptions {
                entries: NonZeroUsize::new(4).unwrap(),
                valid: Duration::from_secs(60),
                content_max: 0,
            }),
            ..RootOptions::default()
        };
        let cached = DocumentRoot::open(tmp.path(), opts).unwrap();
        let plain = DocumentRoot::open(tmp.path(), RootOptions::default()).unwrap();
        let twice = |r: &DocumentRoot| {
            let a = file(r.lookup(b"/a.txt").unwrap());
            let b = file(r.lookup(b"/a.txt").unwrap());
            Arc::ptr_eq(&a, &b)
        };
        assert!(twice(&cached));
        assert!(!twice(&plain));
    }

    #[test]
    fn small_files_keep_their_bytes_consistent_with_their_entry() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("small.txt"), "hello").unwrap();
        std::fs::write(tmp.path().join("big.txt"), "x".repeat(11)).unwrap();
        std::fs::write(tmp.path().join("empty.txt"), "").unwrap();
        let with = |content_max| RootOptions {
            open_file_cache: Some(CacheOptions {
                entries: NonZeroUsize::new(4).unwrap(),
                valid: Duration::from_secs(60),
                content_max,
            }),
            ..RootOptions::default()
        };
        let root = DocumentRoot::open(tmp.path(), with(10)).unwrap();
        let small = file(root.lookup(b"/small.txt").unwrap());
        assert_eq!(small.contents.as_deref(), Some(&b"hello"[..]));
        assert_eq!(small.cached(1, 3), Some(&b"ell"[..]));
        assert_eq!(small.cached(3, 5), None, "past the end: read instead");
        // Over the size, empty, or kept without bytes: read per response.
        assert!(file(root.lookup(b"/big.txt").unwrap()).contents.is_none());
        assert!(file(root.lookup(b"/empty.txt").unwrap()).contents.is_none());
        let none = DocumentRoot::open(tmp.path(), with(0)).unwrap();
        assert!(file(none.lookup(b"/small.txt").unwrap()).contents.is_none());
        let plain = DocumentRoot::open(tmp.path(), RootOptions::default()).unwrap();
        assert!(file(plain.lookup(b"/small.txt").unwrap())
            .contents
            .is_none());
        // Modified in place: the entry keeps the bytes its validators
        // describe until it expires.
        std::fs::write(tmp.path().join("small.txt"), "HELLO").unwrap();
        let again = file(root.lookup(b"/small.txt").unwrap());
        assert!(Arc::ptr_eq(&small, &again));
        assert_eq!(again.contents.as_deref(), Some(&b"hello"[..]));
    }
}
