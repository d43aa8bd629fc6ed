//! What every target is given, identically: an ECDSA P-256 and an RSA-2048
//! certificate for the same name, and a document root of files of the
//! sizes the scenarios fetch (random bytes: nothing compresses).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tlsgate_loadgen::ClientIdentity;
use tlsgate_sys::resident::LockedFile;

use crate::error::BenchError;

/// The name in the certificates, SNI and Host.
pub const SERVER_NAME: &str = "bench.tlsgate.test";

/// A second name, served with the same certificates, under which tlsgate
/// requires a client certificate (mutual TLS).
pub const MTLS_SERVER_NAME: &str = "mtls.bench.tlsgate.test";

/// A certificate and its key on disk.
#[derive(Debug, Clone)]
pub struct CertPair {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8).
    pub key: PathBuf,
    /// Certificate then key in one file (HAProxy's format).
    pub combined: PathBuf,
}

/// The bench's working directory.
#[derive(Debug)]
pub struct Materials {
    /// The served files, kept in memory: see [`Materials::file`].
    /// (Before `dir`: unmapped before the directory goes.)
    resident: Mutex<HashMap<String, LockedFile>>,
    dir: tempfile::TempDir,
    /// ECDSA P-256.
    pub ecdsa: CertPair,
    /// RSA-2048.
    pub rsa: CertPair,
    /// Document root; files live under `/f/`.
    pub root: PathBuf,
    /// The CA that signs client certificates (PEM).
    pub client_ca: PathBuf,
    /// A client certificate signed by `client_ca`, and its key.
    pub client: ClientIdentity,
}

impl Materials {
    /// Makes certificates and an empty document root in a fresh temporary directory.
    pub fn create() -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("tlsgate-bench-")
            .tempdir()
            .map_err(BenchError::io("temporary directory"))?;
        let root = dir.path().join("www");
        fs::create_dir_all(root.join("f")).map_err(BenchError::io(&root))?;
        let ecdsa = make_cert(dir.path(), "ecdsa", &rcgen::PKCS_ECDSA_P256_SHA256)?;
        let rsa = make_cert(dir.path(), "rsa", &rcgen::PKCS_RSA_SHA256)?;
        let client_ca = dir.path().join("client-ca.crt");
        let client = make_client_identity(&client_ca)?;
        Ok(Self {
            resident: Mutex::default(),
            dir,
            ecdsa,
            rsa,
            root,
            client_ca,
            client,
        })
    }

    /// The working directory (configs and logs go here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Makes sure `/f/<name>` exists with `size` random bytes, locked in
    /// memory for as long as `self` lives; returns the URL path. Locked
    /// because memory reclaim may evict a file idle for a minute (this
    /// machine's DAMON does), and one re-read from disk is served at a
    /// different cost than one written and cached: measured here, a 64 MiB
    /// file cost 4–6 % more per byte after twelve minutes of other load
    /// than a fresh one (docs/bench.md).
    pub fn file(&self, size: u64) -> Result<String, BenchError> {
        let name = size_name(size);
        let path = self.root.join("f").join(&name);
        if fs::metadata(&path).map(|m| m.len()).ok() != Some(size) {
            let mut f = fs::File::create(&path).map_err(BenchError::io(&path))?;
            let mut rng = fastrand::Rng::with_seed(size);
            let mut chunk = vec![0u8; 1 << 20];
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                rng.fill(&mut chunk[..n]);
                f.write_all(&chunk[..n]).map_err(BenchError::io(&path))?;
                left -= n as u64;
            }
        }
        let mut resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if !resident.contains_key(&name) {
            let file = fs::File::open(&path).map_err(BenchError::io(&path))?;
            match LockedFile::lock(&file) {
                Ok(locked) => {
                    resident.insert(name.clone(), locked);
                }
                Err(e) => tracing::warn!(
                    "cannot lock {} in memory ({e}): if reclaim evicts it, \
                     measurements of it include re-reading it",
                    path.display()
                ),
            }
        }
        Ok(format!("/f/{name}"))
    }
}

/// "1k", "64k", "1m", "10m", or bytes.
pub fn size_name(size: u64) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{}m", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{}k", size >> 10)
    } else {
        format!("{size}b")
    }
}

/// The inverse of [`size_name`]: "1k", "64k", "10m", "100b" or plain bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, shift) = match t.as_bytes().last()? {
        b'k' => (&t[..t.len() - 1], 10),
        b'm' => (&t[..t.len() - 1], 20),
        b'b' => (&t[..t.len() - 1], 0),
        _ => (t.as_str(), 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn make_cert(
    dir: &Path,
    stem: &str,
    alg: &'static rcgen::SignatureAlgorithm,
) -> Result<CertPair, BenchError> {
    let other = |e: rcgen::Error| BenchError::Other(format!("making the {stem} certificate: {e}"));
    let key = rcgen::KeyPair::generate_for(alg).map_err(other)?;
    let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(other)?;
    let cert = params.self_signed(&key).map_err(other)?;
    let pair = CertPair {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
        combined: dir.join(format!("{stem}.pem")),
    };
    let key_pem = key.serialize_pem();
    fs::write(&pair.cert, cert.pem()).map_err(BenchError::io(&pair.cert))?;
    fs::write(&pair.key, &key_pem).map_err(BenchError::io(&pair.key))?;
    fs::write(&pair.combined, format!("{}{}", cert.pem(), key_pem))
        .map_err(BenchError::io(&pair.combined))?;
    Ok(pair)
}

/// An ECDSA P-256 client CA (written to `ca_path`) and a client
/// certificate it signs, as mutual TLS deployments between services have.
fn make_client_identity(ca_path: &Path) -> Result<ClientIdentity, BenchError> {
    let other = |e: rcgen::Error| BenchError::Other(format!("making the client certificates: {e}"));
    let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
    let ca_key = rcgen::KeyPair::generate_for(alg).map_err(other)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(other)?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tlsgate bench client CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key).map_err(other)?;
    fs::write(ca_path, ca.pem()).map_err(BenchError::io(ca_path))?;

    let key = rcgen::KeyPair::generate_for(alg).map_err(other)?;
    let mut params = rcgen::CertificateParams::new(vec!["client.bench.tlsgate.test".to_string()])
        .map_err(other)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "bench client");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = params.signed_by(&key, &ca, &ca_key).map_err(other)?;
    Ok(ClientIdentity {
        chain: vec![CertificateDer::from(leaf.der().to_vec())],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_short_names() {
        assert_eq!(size_name(1024), "1k");
        assert_eq!(size_name(10 << 20), "10m");
        assert_eq!(size_name(1000), "1000b");
        for n in [1024, 10 << 20, 1000, 1 << 10 | 1] {
            assert_eq!(parse_size(&size_name(n)), Some(n));
        }
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn materials_hold_both_keys_and_exact_file_sizes() {
        let m = Materials::create().unwrap();
        assert!(fs::read_to_string(&m.rsa.key)
            .unwrap()
            .contains("PRIVATE KEY"));
        assert!(fs::read_to_string(&m.ecdsa.combined)
            .unwrap()
            .contains("CERTIFICATE"));
        assert!(fs::read_to_string(&m.client_ca)
            .unwrap()
            .contains("CERTIFICATE"));
        assert_eq!(m.client.chain.len(), 1);
        let p = m.file(4096).unwrap();
        assert_eq!(p, "/f/4k");
        assert_eq!(fs::metadata(m.root.join("f/4k")).unwrap().len(), 4096);
    }

    #[test]
    fn served_files_stay_locked_in_memory_while_the_materials_live() {
        let m = Materials::create().unwrap();
        m.file(2 << 20).unwrap();
        m.file(2 << 20).unwrap();
        let resident = m.resident.lock().unwrap();
        let locked = resident
            .get("2m")
            .expect("2m locked (root, or RLIMIT_MEMLOCK ≥ 2 MiB)");
        assert_eq!(locked.len(), 2 << 20);
        assert_eq!(resident.len(), 1, "asking twice locks once");
    }
}
