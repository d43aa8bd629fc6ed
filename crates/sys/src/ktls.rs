//! Kernel TLS (kTLS): the `tls` upper-layer protocol on a TCP socket, the
//! record keys handed to it (`SOL_TLS`/`TLS_TX`/`TLS_RX`), records of other
//! content types (alerts, handshake messages) sent and received through the
//! record-type control messages, `sendfile` into the record layer, and the
//! kernel's own counters (`/proc/net/tls_stat`).
//!
//! The structures are libc's mirrors of `linux/tls.h`. What the TLS library
//! negotiated (version, cipher, keys, sequence numbers) is the caller's: this
//! module knows no rustls. Options are set through the crate's `sockopt`; every
//! `unsafe` call here is in [`send_control`] or [`recv_record`].
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::mem;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use crate::sockopt::{setsockopt_bytes, setsockopt_int};

use zeroize::Zeroize;

/// TLS content types (RFC 8446 §5.1).
pub mod content_type {
    /// change_cipher_spec
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    /// alert
    pub const ALERT: u8 = 21;
    /// handshake (post-handshake messages: KeyUpdate, NewSessionTicket, HelloRequest)
    pub const HANDSHAKE: u8 = 22;
    /// application_data
    pub const APPLICATION_DATA: u8 = 23;
}

/// The protocol version whose record format the kernel must use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsVersion {
    /// TLS 1.2 (explicit nonce in each record).
    Tls12,
    /// TLS 1.3 (inner content type, optional padding).
    Tls13,
}

impl TlsVersion {
    /// Both, for iteration.
    pub const ALL: [TlsVersion; 2] = [TlsVersion::Tls12, TlsVersion::Tls13];

    fn wire(self) -> u16 {
        match self {
            Self::Tls12 => libc::TLS_1_2_VERSION,
            Self::Tls13 => libc::TLS_1_3_VERSION,
        }
    }

    /// "TLSv1.2" / "TLSv1.3".
    pub fn name(self) -> &'static str {
        match self {
            Self::Tls12 => "TLSv1.2",
            Self::Tls13 => "TLSv1.3",
        }
    }
}

/// The AEADs tlsgate negotiates, all of which Linux can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cipher {
    /// AES-128-GCM.
    Aes128Gcm,
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305 (Linux 5.11+).
    Chacha20Poly1305,
}

impl Cipher {
    /// All three, for iteration.
    pub const ALL: [Cipher; 3] = [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ];

    /// Stable lower-case name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes128Gcm => "aes_128_gcm",
            Self::Aes256Gcm => "aes_256_gcm",
            Self::Chacha20Poly1305 => "chacha20_poly1305",
        }
    }

    fn key_len(self) -> usize {
        match self {
            Self::Aes128Gcm => 16,
            Self::Aes256Gcm | Self::Chacha20Poly1305 => 32,
        }
    }
}

/// A direction of the record layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Records the kernel encrypts (`TLS_TX`).
    Tx,
    /// Records the kernel decrypts (`TLS_RX`).
    Rx,
}

impl Direction {
    fn optname(self) -> libc::c_int {
        match self {
            Self::Tx => libc::TLS_TX,
            Self::Rx => libc::TLS_RX,
        }
    }

    /// "tx" / "rx".
    pub fn name(self) -> &'static str {
        match self {
            Self::Tx => "tx",
            Self::Rx => "rx",
        }
    }
}

/// Key material that does not fit the cipher.
#[derive(Debug, thiserror::Error)]
#[error("{cipher:?}: expected a {want_key}-byte key and a 12-byte IV, got {key} and {iv}")]
pub struct KeyMaterialError {
    cipher: Cipher,
    want_key: usize,
    key: usize,
    iv: usize,
}

enum RawInfo {
    Aes128(libc::tls12_crypto_info_aes_gcm_128),
    Aes256(libc::tls12_crypto_info_aes_gcm_256),
    Chacha(libc::tls12_crypto_info_chacha20_poly1305),
}

/// One direction's record state for the kernel: version, cipher, key, IV
/// and the sequence number of the next record. Zeroed when dropped.
pub struct CryptoInfo {
    raw: RawInfo,
}

impl std::fmt::Debug for CryptoInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("CryptoInfo(..)")
    }
}

impl CryptoInfo {
    /// `iv` is the full 12-byte per-connection IV (RFC 8446 §5.3; for TLS
    /// 1.2 GCM the 4-byte salt followed by 8 bytes the kernel uses as the
    /// first explicit nonce); `seq` is the sequence number of the next record.
    pub fn new(
        version: TlsVersion,
        cipher: Cipher,
        key: &[u8],
        iv: &[u8],
        seq: u64,
    ) -> Result<Self, KeyMaterialError> {
        let bad = || KeyMaterialError {
            cipher,
            want_key: cipher.key_len(),
            key: key.len(),
            iv: iv.len(),
        };
        if key.len() != cipher.key_len() || iv.len() != 12 {
            return Err(bad());
        }
        let info = libc::tls_crypto_info {
            version: version.wire(),
            cipher_type: match cipher {
                Cipher::Aes128Gcm => libc::TLS_CIPHER_AES_GCM_128,
                Cipher::Aes256Gcm => libc::TLS_CIPHER_AES_GCM_256,
                Cipher::Chacha20Poly1305 => libc::TLS_CIPHER_CHACHA20_POLY1305,
            },
        };
        let rec_seq = seq.to_be_bytes();
        let (salt, explicit) = iv.split_at(4);
        let raw = match cipher {
            Cipher::Aes128Gcm => RawInfo::Aes128(libc::tls12_crypto_info_aes_gcm_128 {
                info,
                iv: explicit.try_into().map_err(|_| bad())?,
                key: key.try_into().map_err(|_| bad())?,
                salt: salt.try_into().map_err(|_| bad())?,
                rec_seq,
            }),
            Cipher::Aes256Gcm => RawInfo::Aes256(libc::tls12_crypto_info_aes_gcm_256 {
                info,
                iv: explicit.try_into().map_err(|_| bad())?,
                key: key.try_into().map_err(|_| bad())?,
                salt: salt.try_into().map_err(|_| bad())?,
                rec_seq,
            }),
            Cipher::Chacha20Poly1305 => {
                RawInfo::Chacha(libc::tls12_crypto_info_chacha20_poly1305 {
                    info,
                    iv: iv.try_into().map_err(|_| bad())?,
                    key: key.try_into().map_err(|_| bad())?,
                    salt: [],
                    rec_seq,
                })
            }
        };
        Ok(Self { raw })
    }

    /// The structure's bytes exactly as `setsockopt` takes them.
    fn with_bytes<R>(&self, f: impl FnOnce(*const libc::c_void, usize) -> R) -> R {
        fn raw<T>(t: &T) -> (*const libc::c_void, usize) {
            ((t as *const T).cast(), mem::size_of::<T>())
        }
        let (p, n) = match &self.raw {
            RawInfo::Aes128(i) => raw(i),
            RawInfo::Aes256(i) => raw(i),
            RawInfo::Chacha(i) => raw(i),
        };
        f(p, n)
    }
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        match &mut self.raw {
            RawInfo::Aes128(i) => {
                i.key.zeroize();
                i.iv.zeroize();
                i.salt.zeroize();
            }
            RawInfo::Aes256(i) => {
                i.key.zeroize();
                i.iv.zeroize();
                i.salt.zeroize();
            }
            RawInfo::Chacha(i) => {
                i.key.zeroize();
                i.iv.zeroize();
            }
        }
    }
}

/// Attaches the `tls` upper-layer protocol to a connected TCP socket.
/// `ENOENT`: the kernel has no kTLS (or the module cannot load).
pub fn attach_ulp(sock: BorrowedFd<'_>) -> io::Result<()> {
    const NAME: &[u8] = b"tls";
    setsockopt_bytes(
        sock,
        libc::SOL_TCP,
        libc::TCP_ULP,
        NAME.as_ptr().cast(),
        NAME.len(),
    )
}

/// Hands one direction of the record layer to the kernel.
pub fn install(sock: BorrowedFd<'_>, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
    info.with_bytes(|p, n| setsockopt_bytes(sock, libc::SOL_TLS, dir.optname(), p, n))
}

/// TLS 1.3 RX: tells the kernel the peer does not pad records, so it
/// decrypts in place without a second pass (Linux 6.0+; a padded record
/// is still read, through a slower retry the kernel counts).
pub fn expect_no_pad(sock: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(sock, libc::SOL_TLS, libc::TLS_RX_EXPECT_NO_PAD, 1)
}

/// TX: lets `sendfile` encrypt straight from the page cache (Linux 5.19+).
/// Only sound for files that cannot change while sent: a retransmitted
/// record would carry other bytes than the ones authenticated.
pub fn zerocopy_sendfile(sock: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(sock, libc::SOL_TLS, libc::TLS_TX_ZEROCOPY_RO, 1)
}

/// Control message space for one byte, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgSpace([u8; 32]);

/// Sends `payload` as one record of `content_type` (an alert, say) on a
/// socket with kTLS TX. Non-blocking.
pub fn send_control(sock: BorrowedFd<'_>, content_type: u8, payload: &[u8]) -> io::Result<usize> {
    let mut space = CmsgSpace([0; 32]);
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr().cast_mut().cast(),
        iov_len: payload.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    let cmsg_space = unsafe { libc::CMSG_SPACE(1) } as usize;
    debug_assert!(cmsg_space <= space.0.len());
    msg.msg_controllen = cmsg_space;
    // SAFETY: msg_control points to `space` (32 aligned bytes, more than
    // CMSG_SPACE(1)), so the first header and its one data byte lie inside
    // it; the iovec points to `payload`, which the kernel only reads.
    // sendmsg copies everything before returning.
    let r = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as usize;
        *libc::CMSG_DATA(c) = content_type;
        libc::sendmsg(
            sock.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}

/// What one read from a kTLS RX socket returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes written into the buffer (0 with application data = TCP EOF).
    pub len: usize,
    /// The record's content type; application data unless the kernel said
    /// otherwise.
    pub content_type: u8,
}

/// Reads decrypted bytes of one content type from a socket with kTLS RX.
/// A plain `read` would fail with `EIO` at a control record; this one
/// returns it with its type. Non-blocking.
pub fn recv_record(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut space = CmsgSpace([0; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr().cast();
    msg.msg_controllen = space.0.len();
    // SAFETY: the iovec covers `buf` (writable, exclusively borrowed) and
    // msg_control covers `space`; the kernel writes within their lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    let len = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let mut content_type = content_type::APPLICATION_DATA;
    // SAFETY: the headers walked are those the kernel wrote into `space`,
    // bounded by msg_controllen as the CMSG_* macros check.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_TLS && (*c).cmsg_type == libc::TLS_GET_RECORD_TYPE {
                content_type = *libc::CMSG_DATA(c);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received { len, content_type })
}

/// Whether a kTLS read failed because a record did not authenticate
/// (`EBADMSG`): the peer sent garbage or the keys disagree.
pub fn is_bad_record(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EBADMSG)
}

/// Reads and clears the socket's pending error (`SO_ERROR`). After a
/// record fails to authenticate the kernel leaves `EBADMSG` there, and
/// every later send would fail with it — the alert that must answer it too.
pub fn clear_error(sock: BorrowedFd<'_>) -> io::Result<Option<io::Error>> {
    socket2::SockRef::from(&sock).take_error()
}

/// Writes `data` with `MSG_MORE`: under kTLS the record stays open so the
/// next write (a `sendfile`) fills it, instead of a small record of its own.
pub fn send_more(sock: BorrowedFd<'_>, data: &[u8]) -> io::Result<usize> {
    crate::send_vectored_more(sock, &[io::IoSlice::new(data)])
}

/// `sendfile(2)` from `file` at `offset` (advanced by what was sent).
pub fn sendfile(
    sock: BorrowedFd<'_>,
    file: &File,
    offset: &mut u64,
    count: usize,
) -> io::Result<usize> {
    rustix::fs::sendfile(sock, file, Some(offset), count).map_err(io::Error::from)
}

/// What the running kernel offers for kTLS, found once at start by trying
/// it on loopback socket pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Support {
    /// Why kTLS cannot be used at all, if it cannot.
    pub unavailable: Option<String>,
    /// (version, cipher) pairs the kernel accepted for TX.
    pub tx: Vec<(TlsVersion, Cipher)>,
    /// (version, cipher) pairs the kernel accepted for RX.
    pub rx: Vec<(TlsVersion, Cipher)>,
    /// `TLS_RX_EXPECT_NO_PAD` is known (Linux 6.0+).
    pub rx_expect_no_pad: bool,
    /// `TLS_TX_ZEROCOPY_RO` is known (Linux 5.19+).
    pub tx_zerocopy: bool,
}

impl Support {
    /// Whether both directions can run (version, cipher) in the kernel.
    pub fn offers(&self, version: TlsVersion, cipher: Cipher) -> bool {
        self.tx.contains(&(version, cipher)) && self.rx.contains(&(version, cipher))
    }

    /// Marks kTLS unavailable when no (version, cipher) runs in both
    /// directions: a connection moves both at once, so TX alone (a kernel
    /// before 4.17, RX ciphers missing) serves nothing, and the log must
    /// say so rather than "available".
    fn judge(&mut self) {
        if self.unavailable.is_some() || self.tx.iter().any(|vc| self.rx.contains(vc)) {
            return;
        }
        self.unavailable = Some(if self.tx.is_empty() && self.rx.is_empty() {
            "the `tls` ULP attaches but no cipher could be installed".into()
        } else {
            let mut only = self.clone();
            only.unavailable = None;
            format!(
                "no version and cipher runs in both directions ({})",
                only.summary()
            )
        });
    }

    /// One line for the log: what is offered, or why nothing is.
    pub fn summary(&self) -> String {
        if let Some(why) = &self.unavailable {
            return format!("unavailable: {why}");
        }
        let list = |v: &[(TlsVersion, Cipher)]| {
            v.iter()
                .map(|(v, c)| format!("{}/{}", v.name(), c.name()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "available: tx [{}] rx [{}] rx_expect_no_pad={} tx_zerocopy={}",
            list(&self.tx),
            list(&self.rx),
            self.rx_expect_no_pad,
            self.tx_zerocopy
        )
    }
}

/// A connected loopback pair; the kernel attaches ULPs only to
/// established sockets.
fn loopback_pair() -> io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    Ok((a, b))
}

/// Tries kTLS on throwaway loopback connections: the `tls` ULP, then every
/// version × cipher × direction with a zero key. Costs a few dozen
/// syscalls; done once at start.
pub fn probe() -> Support {
    let mut s = Support::default();
    let first = match loopback_pair() {
        Ok(p) => p,
        Err(e) => {
            s.unavailable = Some(format!("cannot open a loopback socket pair to probe: {e}"));
            return s;
        }
    };
    if let Err(e) = attach_ulp(first.0.as_fd()) {
        s.unavailable = Some(match e.raw_os_error() {
            Some(libc::ENOENT) => format!(
                "the kernel has no `tls` upper-layer protocol (setsockopt(TCP_ULP, \"tls\"): {e}); \
                 it needs CONFIG_TLS or the tls module"
            ),
            _ => format!("setsockopt(TCP_ULP, \"tls\"): {e}"),
        });
        return s;
    }
    for version in TlsVersion::ALL {
        for cipher in Cipher::ALL {
            let key = [0u8; 32];
            let Ok(info) = CryptoInfo::new(version, cipher, &key[..cipher.key_len()], &[0; 12], 0)
            else {
                continue;
            };
            for dir in [Direction::Tx, Direction::Rx] {
                let Ok((a, _b)) = loopback_pair() else {
                    continue;
                };
                if attach_ulp(a.as_fd()).is_err() || install(a.as_fd(), dir, &info).is_err() {
                    continue;
                }
                match dir {
                    Direction::Tx => {
                        s.tx.push((version, cipher));
                        s.tx_zerocopy |= zerocopy_sendfile(a.as_fd()).is_ok();
                    }
                    Direction::Rx => {
                        s.rx.push((version, cipher));
                        if version == TlsVersion::Tls13 {
                            s.rx_expect_no_pad |= expect_no_pad(a.as_fd()).is_ok();
                        }
                    }
                }
            }
        }
    }
    s.judge();
    s
}

/// The kernel's kTLS counters (`/proc/net/tls_stat`): `TlsTxSw`,
/// `TlsRxSw`, `TlsTxDevice`, `TlsDecryptError`… in the kernel's order.
/// `Ok(None)` where the file does not exist (no kTLS in this kernel).
pub fn read_stat() -> io::Result<Option<Vec<(String, u64)>>> {
    match std::fs::read_to_string("/proc/net/tls_stat") {
        Ok(text) => Ok(Some(parse_stat(&text))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parses `Name<whitespace>value` lines; others are skipped.
pub fn parse_stat(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let value = it.next()?.parse().ok()?;
            Some((name.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn one_direction_alone_is_unavailable() {
        use super::*;
        let tx_only = |tx: Vec<(TlsVersion, Cipher)>, rx: Vec<(TlsVersion, Cipher)>| {
            let mut s = Support {
                tx,
                rx,
                ..Support::default()
            };
            s.judge();
            s.unavailable
        };
        let v13 = (TlsVersion::Tls13, Cipher::Aes128Gcm);
        let v12 = (TlsVersion::Tls12, Cipher::Aes128Gcm);
        let why = tx_only(vec![v13], vec![]).unwrap();
        assert!(why.contains("both directions"), "{why}");
        assert!(tx_only(vec![v13], vec![v12]).is_some());
        assert!(tx_only(vec![], vec![]).unwrap().contains("no cipher"));
        assert_eq!(tx_only(vec![v13, v12], vec![v12]), None);
    }

    use super::*;

    #[test]
    fn crypto_info_has_the_kernels_layout() {
        // linux/tls.h: 4-byte header + iv + key + salt + rec_seq.
        assert_eq!(mem::size_of::<libc::tls12_crypto_info_aes_gcm_128>(), 40);
        assert_eq!(mem::size_of::<libc::tls12_crypto_info_aes_gcm_256>(), 56);
        assert_eq!(
            mem::size_of::<libc::tls12_crypto_info_chacha20_poly1305>(),
            56
        );
        let iv: Vec<u8> = (1..=12).collect();
        let info =
            CryptoInfo::new(TlsVersion::Tls13, Cipher::Aes128Gcm, &[7; 16], &iv, 0x0102).unwrap();
        let bytes = info.with_bytes(|p, n| {
            // SAFETY (test): `p` points to the live struct of `n` bytes.
            unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec()
        });
        assert_eq!(
            &bytes[..4],
            &[0x04, 0x03, 51, 0],
            "version 0x0304, cipher 51 (LE)"
        );
        assert_eq!(&bytes[4..12], &iv[4..], "explicit part of the IV");
        assert_eq!(&bytes[12..28], &[7; 16]);
        assert_eq!(&bytes[28..32], &iv[..4], "salt");
        assert_eq!(
            &bytes[32..40],
            &[0, 0, 0, 0, 0, 0, 1, 2],
            "big-endian sequence"
        );
        let chacha = CryptoInfo::new(
            TlsVersion::Tls12,
            Cipher::Chacha20Poly1305,
            &[9; 32],
            &iv,
            5,
        )
        .unwrap();
        let bytes = chacha.with_bytes(|p, n| {
            // SAFETY (test): as above.
            unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec()
        });
        assert_eq!(&bytes[..4], &[0x03, 0x03, 54, 0]);
        assert_eq!(&bytes[4..16], &iv[..], "ChaCha20 takes the whole IV");
        assert_eq!(&bytes[48..56], &5u64.to_be_bytes());
    }

    #[test]
    fn key_material_of_the_wrong_size_is_refused() {
        let e = CryptoInfo::new(TlsVersion::Tls13, Cipher::Aes256Gcm, &[0; 16], &[0; 12], 0)
            .unwrap_err();
        assert!(e.to_string().contains("32-byte key"), "{e}");
        assert!(
            CryptoInfo::new(TlsVersion::Tls13, Cipher::Aes128Gcm, &[0; 16], &[0; 8], 0).is_err()
        );
    }

    #[test]
    fn tls_stat_lines_parse() {
        let text = "TlsCurrTxSw                     \t1\nTlsTxSw    3\nTlsDecryptError 0\nbogus\n";
        assert_eq!(
            parse_stat(text),
            vec![
                ("TlsCurrTxSw".to_string(), 1),
                ("TlsTxSw".to_string(), 3),
                ("TlsDecryptError".to_string(), 0)
            ]
        );
    }

    /// The probe agrees with the kernel it runs on: where `/proc/net/tls_stat`
    /// exists (the kTLS lab's VM) everything tlsgate negotiates is offered;
    /// where it does not (this project's build machines) the reason is named.
    #[test]
    fn probe_matches_the_running_kernel() {
        let s = probe();
        let has_ktls = std::path::Path::new("/proc/net/tls_stat").exists();
        if has_ktls {
            assert_eq!(s.unavailable, None, "{}", s.summary());
            for v in TlsVersion::ALL {
                for c in Cipher::ALL {
                    assert!(s.offers(v, c), "{v:?} {c:?} missing: {}", s.summary());
                }
            }
        } else {
            let why = s.unavailable.clone().unwrap_or_default();
            assert!(why.contains("TCP_ULP") || why.contains("tls"), "{why}");
            assert!(s.tx.is_empty() && s.rx.is_empty());
        }
    }

    #[test]
    fn control_records_need_ktls() {
        // On a plain socket the record-type cmsg is refused or ignored:
        // either way nothing panics and the call reports.
        let (a, _b) = loopback_pair().unwrap();
        let _ = send_control(a.as_fd(), content_type::ALERT, &[1, 0]);
        let mut buf = [0u8; 8];
        let r = recv_record(a.as_fd(), &mut buf);
        assert!(
            matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock),
            "{r:?}"
        );
    }
}
