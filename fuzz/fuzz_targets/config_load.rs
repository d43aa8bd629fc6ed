//! Fuzzes `tlsgate_config::load` on a config file of any content: an
//! operator's typo must end in an error that names the file, never in a
//! panic (the binary exits 2 with that message). The file is written to a
//! directory of its own, which also holds a site root and two PEM-shaped
//! files for the paths the seeds name.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tlsgate_config::{load, Overrides};

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tlsgate_fuzz::scratch_dir("config");
        std::fs::create_dir_all(dir.join("site")).unwrap();
        std::fs::write(dir.join("cert.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        std::fs::write(dir.join("key.pem"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
        dir
    })
}

fuzz_target!(|text: &[u8]| {
    let dir = dir();
    let path = dir.join("tlsgate.toml");
    std::fs::write(&path, text).unwrap();
    if let Err(e) = load(Some(&path), &Overrides::default(), &dir.join("site")) {
        assert_eq!(e.origin, path.display().to_string(), "{e}");
        assert!(!e.problem.is_empty(), "{e}");
    }
});
