//! Fuzzes `DocumentRoot::lookup`, which maps a request path as sent
//! (percent-encoded) to a file under the root, on a real directory: files,
//! an index, a subdirectory, a symlink inside the root and one that leads
//! out of it to a secret. Nothing may panic; a file found is one of the
//! root's own (never the secret, whatever the path); and a root with the
//! open-file cache answers exactly as one without it.

#![no_main]

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::os::unix::fs::{symlink, MetadataExt};
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tlsgate_files::{CacheOptions, DocumentRoot, Found, LookupError, RootOptions};

struct Roots {
    plain: DocumentRoot,
    cached: DocumentRoot,
    /// (device, inode) of every file a lookup may serve.
    servable: HashSet<(u64, u64)>,
}

fn roots() -> &'static Roots {
    static ROOTS: OnceLock<Roots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let base = tlsgate_fuzz::scratch_dir("files");
        let root = base.join("root");
        std::fs::create_dir_all(root.join("docs/deep dir")).unwrap();
        std::fs::write(base.join("secret.txt"), b"secret").unwrap();
        let mut servable = HashSet::new();
        for (name, body) in [
            ("index.html", &b"<h1>hi</h1>"[..]),
            ("a.txt", b"a"),
            ("docs/index.html", b"docs"),
            ("docs/deep dir/%41 b;c.txt", b"odd name"),
            ("..hidden", b"dots"),
        ] {
            let path = root.join(name);
            std::fs::write(&path, body).unwrap();
            let md = std::fs::metadata(&path).unwrap();
            servable.insert((md.dev(), md.ino()));
        }
        symlink("a.txt", root.join("link")).unwrap();
        symlink("../secret.txt", root.join("leak")).unwrap();
        symlink("../..", root.join("docs/up")).unwrap();
        let cache = CacheOptions {
            entries: NonZeroUsize::new(8).unwrap(),
            valid: Duration::from_secs(3600),
            content_max: 1024,
        };
        Roots {
            plain: DocumentRoot::open(&root, RootOptions::default()).unwrap(),
            cached: DocumentRoot::open(
                &root,
                RootOptions {
                    open_file_cache: Some(cache),
                    ..RootOptions::default()
                },
            )
            .unwrap(),
            servable,
        }
    })
}

/// What a lookup came to, comparable across the two roots.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    File(u64, u64, u64),
    Redirect(String),
    Refused(u16),
}

fn answer(found: Result<Found, LookupError>) -> Answer {
    match found {
        Ok(Found::File(f)) => {
            let md = f.file.metadata().unwrap();
            assert_eq!(md.len(), f.meta.len);
            if let Some(contents) = &f.contents {
                assert_eq!(contents.len() as u64, f.meta.len);
            }
            Answer::File(md.dev(), md.ino(), f.meta.len)
        }
        Ok(Found::Redirect(to)) => {
            assert!(to.starts_with('/') && to.ends_with('/'), "redirect to {to}");
            Answer::Redirect(to)
        }
        Err(e) => Answer::Refused(e.status()),
    }
}

fuzz_target!(|path: &[u8]| {
    let roots = roots();
    let plain = answer(roots.plain.lookup(path));
    if let Answer::File(dev, ino, _) = plain {
        assert!(
            roots.servable.contains(&(dev, ino)),
            "{:?} served a file from outside the root",
            String::from_utf8_lossy(path)
        );
    }
    // Twice through the cache: the first fills it, the second is served from it.
    assert_eq!(answer(roots.cached.lookup(path)), plain);
    assert_eq!(answer(roots.cached.lookup(path)), plain);
});
