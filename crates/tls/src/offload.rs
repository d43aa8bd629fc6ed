//! Moving an established connection's record layer into the kernel (kTLS):
//! which negotiated suites the kernel can run, the record boundary of the
//! bytes rustls has read (the kernel must start at a record's first byte),
//! and the kernel-side state kept afterwards.

use rustls::{CipherSuite, ConnectionTrafficSecrets, ProtocolVersion, SupportedCipherSuite};
use tlsgate_sys::ktls::{Cipher, CryptoInfo, KeyMaterialError, TlsVersion};

/// Why a connection's record layer did not move to the kernel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OffloadError {
    /// The kernel cannot run what was negotiated (or has no kTLS at all);
    /// the connection goes on in user space.
    #[error("kernel TLS cannot run {0}")]
    Unsupported(String),
    /// The client misbehaved or left while the switch waited for the end
    /// of a record; the connection is over.
    #[error("connection failed during the switch to kernel TLS: {0}")]
    Io(#[from] std::io::Error),
    /// The kernel refused the keys after rustls gave them up; the
    /// connection is over.
    #[error("{call}: {source}")]
    Kernel {
        /// The step that failed.
        call: &'static str,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// rustls would not give up its secrets (extraction not enabled, or
    /// records still queued); the connection is over.
    #[error("rustls refused to export the traffic secrets: {0}")]
    Secrets(String),
}

impl OffloadError {
    /// Whether the connection can go on in user space.
    pub fn connection_survives(&self) -> bool {
        matches!(self, Self::Unsupported(_))
    }

    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unsupported(_) => "unsupported",
            Self::Io(_) => "io",
            Self::Kernel { call, .. } => call,
            Self::Secrets(_) => "secrets",
        }
    }
}

impl From<KeyMaterialError> for OffloadError {
    fn from(e: KeyMaterialError) -> Self {
        Self::Secrets(e.to_string())
    }
}

/// The kernel's names for a negotiated version and suite, if it has them.
pub(crate) fn kernel_suite(
    version: Option<ProtocolVersion>,
    suite: Option<SupportedCipherSuite>,
) -> Option<(TlsVersion, Cipher)> {
    let version = match version? {
        ProtocolVersion::TLSv1_2 => TlsVersion::Tls12,
        ProtocolVersion::TLSv1_3 => TlsVersion::Tls13,
        _ => return None,
    };
    let cipher = match suite?.suite() {
        CipherSuite::TLS13_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Cipher::Aes128Gcm,
        CipherSuite::TLS13_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Cipher::Aes256Gcm,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Cipher::Chacha20Poly1305,
        _ => return None,
    };
    Some((version, cipher))
}

/// The kernel's structure for one direction. rustls' secrets type is
/// `non_exhaustive`: a variant it adds later is refused, not guessed at.
pub(crate) fn crypto_info(
    version: TlsVersion,
    cipher: Cipher,
    (seq, secrets): &(u64, ConnectionTrafficSecrets),
) -> Result<CryptoInfo, OffloadError> {
    let (key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
        _ => {
            return Err(OffloadError::Secrets(
                "an AEAD the kernel does not know".into(),
            ))
        }
    };
    let mut iv: [u8; 12] = iv
        .as_ref()
        .try_into()
        .map_err(|_| OffloadError::Secrets(format!("an IV of {} bytes", iv.as_ref().len())))?;
    if version == TlsVersion::Tls12 && cipher != Cipher::Chacha20Poly1305 {
        let (_, explicit) = iv.split_at_mut(4);
        let rustls_explicit = u64::from_be_bytes(explicit.try_into().unwrap_or_default());
        explicit.copy_from_slice(&kernel_explicit_nonce(rustls_explicit, *seq).to_be_bytes());
    }
    let info = CryptoInfo::new(version, cipher, key.as_ref(), &iv, *seq);
    zeroize::Zeroize::zeroize(&mut iv);
    Ok(info?)
}

/// The first explicit nonce the kernel may seal a TLS 1.2 AES-GCM record
/// under, after rustls sealed records `0..sent` of the same key.
///
/// The two count differently. rustls seals record `i` under `explicit ⊕ i`
/// (its IV's last eight bytes, as in TLS 1.3); the kernel seals its k-th
/// record under `start + k` and puts that on the wire (RFC 5288 only asks
/// that each be used once). Given rustls' IV as `start`, the kernel's first
/// record would reuse the nonce of rustls' first (the Finished), and GCM
/// under a repeated nonce gives away the authentication key. Every nonce
/// rustls used lies in the aligned block of 2^b values holding `explicit`,
/// b the bit length of the last sequence number: the kernel starts at the
/// next block and counts away from it (it would take 2^64 records to come
/// back). The receive side reads each record's nonce from the wire, so
/// this matters only for sending, and is harmless for receiving.
pub(crate) fn kernel_explicit_nonce(explicit: u64, sent: u64) -> u64 {
    let Some(last) = sent.checked_sub(1) else {
        return explicit;
    };
    let b = u64::BITS - last.leading_zeros();
    let block = explicit.checked_shr(b).unwrap_or(0);
    block.wrapping_add(1).checked_shl(b).unwrap_or(0)
}

/// Follows the TLS record framing of a byte stream as it is read, so the
/// reader knows whether it stopped inside a record. Only the 5-byte
/// headers are looked at.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecordBoundary {
    header: [u8; 5],
    header_have: usize,
    body_left: usize,
}

impl RecordBoundary {
    /// Accounts for `bytes`, the next bytes of the stream.
    pub(crate) fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            let take = (5 - self.header_have).min(bytes.len());
            if let (Some(dst), Some(src)) = (
                self.header
                    .get_mut(self.header_have..self.header_have + take),
                bytes.get(..take),
            ) {
                dst.copy_from_slice(src);
            }
            self.header_have += take;
            bytes = bytes.get(take..).unwrap_or_default();
            if self.header_have == 5 {
                self.body_left = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                self.header_have = 0;
            }
        }
    }

    /// Bytes that can be read without passing the end of the current
    /// record's header or body; 0 at a record boundary.
    pub(crate) fn to_boundary(&self) -> usize {
        if self.body_left > 0 {
            self.body_left
        } else if self.header_have > 0 {
            5 - self.header_have
        } else {
            0
        }
    }
}

/// Record-layer state once the kernel runs it.
#[derive(Debug)]
pub(crate) struct KernelState {
    pub(crate) version: TlsVersion,
    /// Records the kernel may have sent under the current key (an upper
    /// bound: one per write call plus one per 16 KiB).
    pub(crate) tx_records: u64,
    /// Records allowed under one key (the AEAD's confidentiality limit).
    /// rustls would re-key before it; nothing can here, so the
    /// connection ends instead.
    pub(crate) tx_record_limit: u64,
    /// Why the connection had to end on a message the kernel cannot
    /// handle (a KeyUpdate, say), for the caller's metrics.
    pub(crate) ended_by: Option<&'static str>,
}

impl KernelState {
    /// Counts records a write of `len` bytes may produce; false when the
    /// key must not encrypt them any more.
    pub(crate) fn charge(&mut self, len: usize) -> bool {
        let records = (len as u64).div_ceil(16 * 1024) + 1;
        self.tx_records = self.tx_records.saturating_add(records);
        self.tx_records < self.tx_record_limit
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(len: usize) -> Vec<u8> {
        let mut r = vec![23, 3, 3];
        r.extend_from_slice(&(len as u16).to_be_bytes());
        r.extend(std::iter::repeat_n(0xAA, len));
        r
    }

    #[test]
    fn boundary_follows_records_split_anywhere() {
        let stream: Vec<u8> = [record(10), record(0), record(300)].concat();
        for cut in 0..=stream.len() {
            let mut b = RecordBoundary::default();
            b.observe(&stream[..cut]);
            // Reading exactly `to_boundary` bytes at a time always lands
            // on a record start, never beyond it.
            let mut at = cut;
            while b.to_boundary() > 0 {
                let n = b.to_boundary();
                b.observe(&stream[at..at + n]);
                at += n;
            }
            assert!(
                [0, 15, 20, 325].contains(&at),
                "cut {cut} ended at {at}, not a record start"
            );
        }
    }

    /// The nonces the kernel would seal its first `n` records under.
    fn kernel_nonces(start: u64, n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(move |k| start.wrapping_add(k))
    }

    #[test]
    fn the_kernel_never_reuses_a_tls12_gcm_nonce_rustls_used() {
        let edges = [0, 1, 2, 3, 0x7f, 0x80, 0xff00, u64::MAX - 1, u64::MAX];
        let others = (0..40u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for explicit in edges.into_iter().chain(others) {
            for sent in (0..=300).chain([1 << 16, (1 << 24) - 1]) {
                let used = |nonce: u64| (nonce ^ explicit) < sent;
                let start = kernel_explicit_nonce(explicit, sent);
                if let Some(bad) = kernel_nonces(start, 4096).find(|&n| used(n)) {
                    panic!("explicit {explicit:#x}, {sent} sent: the kernel reuses {bad:#x}");
                }
            }
        }
        // XOR-ing the sequence number in instead is not enough: rustls used
        // 3 and 2, the kernel would start at 1 and then seal under 2.
        assert_eq!(kernel_explicit_nonce(3, 2), 4);
    }

    /// rustls' TLS 1.2 AES-GCM records carry `explicit ⊕ seq` as their
    /// nonce (what `kernel_explicit_nonce` assumes), read off the wire of a
    /// real handshake and a few records.
    #[test]
    fn rustls_tls12_gcm_nonces_are_its_iv_xor_the_sequence() {
        use rustls::crypto::aws_lc_rs::{cipher_suite, default_provider};
        use rustls::pki_types::ServerName;
        use std::sync::Arc;
        let made = crate::self_signed().unwrap();
        let cert = made.loaded.certified.cert.first().unwrap().clone();
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256],
            ..default_provider()
        });
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
                made.loaded.certified,
            )));
        server.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        // Everything the server sends, from its first byte.
        let mut from_server = Vec::new();
        let mut turn = |c: &mut rustls::ClientConnection, s: &mut rustls::ServerConnection| {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets().unwrap();
            let at = from_server.len();
            while s.wants_write() {
                s.write_tls(&mut from_server).unwrap();
            }
            c.read_tls(&mut &from_server[at..]).unwrap();
            c.process_new_packets().unwrap();
        };
        while c.is_handshaking() || s.is_handshaking() {
            turn(&mut c, &mut s);
        }
        for i in 0..5u8 {
            std::io::Write::write_all(&mut s.writer(), &[i; 100]).unwrap();
        }
        turn(&mut c, &mut s);
        // The records after ChangeCipherSpec are sealed: their first eight
        // bytes are the explicit nonce.
        let mut nonces = Vec::new();
        let (mut at, mut sealed) = (0, false);
        while at + 5 <= from_server.len() {
            let len = usize::from(u16::from_be_bytes([
                from_server[at + 3],
                from_server[at + 4],
            ]));
            let body = &from_server[at + 5..at + 5 + len];
            if sealed {
                nonces.push(u64::from_be_bytes(body[..8].try_into().unwrap()));
            }
            sealed |= from_server[at] == 20;
            at += 5 + len;
        }
        assert_eq!(nonces.len(), 6, "the Finished and five records");
        let (seq, secrets) = s.dangerous_extract_secrets().unwrap().tx;
        let ConnectionTrafficSecrets::Aes128Gcm { iv, .. } = secrets else {
            panic!("not AES-128-GCM");
        };
        let explicit = u64::from_be_bytes(iv.as_ref()[4..].try_into().unwrap());
        assert_eq!(seq, 6);
        for (i, n) in nonces.iter().enumerate() {
            assert_eq!(*n, explicit ^ i as u64, "record {i}");
        }
        let start = kernel_explicit_nonce(explicit, seq);
        assert!(kernel_nonces(start, 1 << 16).all(|k| !nonces.contains(&k)));
        // Given rustls' IV as it is, the kernel's first record would repeat
        // the Finished's nonce: the defect this guards against.
        assert_eq!(nonces[0], explicit);
    }

    #[test]
    fn suites_map_to_the_kernels_ciphers() {
        use rustls::crypto::aws_lc_rs::cipher_suite as cs;
        let v13 = Some(ProtocolVersion::TLSv1_3);
        let v12 = Some(ProtocolVersion::TLSv1_2);
        assert_eq!(
            kernel_suite(v13, Some(cs::TLS13_CHACHA20_POLY1305_SHA256)),
            Some((TlsVersion::Tls13, Cipher::Chacha20Poly1305))
        );
        assert_eq!(
            kernel_suite(v12, Some(cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384)),
            Some((TlsVersion::Tls12, Cipher::Aes256Gcm))
        );
        assert_eq!(kernel_suite(None, Some(cs::TLS13_AES_128_GCM_SHA256)), None);
    }

    #[test]
    fn the_record_budget_ends_before_the_limit() {
        let mut k = KernelState {
            version: TlsVersion::Tls13,
            tx_records: 0,
            tx_record_limit: 10,
            ended_by: None,
        };
        assert!(k.charge(16 * 1024 * 4)); // 5
        assert!(k.charge(100)); // 7
        assert!(!k.charge(16 * 1024 * 2)); // 10: no more
    }
}
