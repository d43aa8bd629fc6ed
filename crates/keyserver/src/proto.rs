//! The key protocol: small, versioned, length-prefixed binary frames over
//! a Unix stream socket between the network-facing process and the key
//! process, and over each thread's lane, a sequenced-packet socket or a
//! pair of pipes (there a frame may span packets of at most [`MAX_PACKET`]
//! bytes, or `PIPE_BUF` on a pipe, and a packet may hold several frames:
//! the reader reassembles the bytes as a stream).
//!
//! ```text
//! frame    = length:u32 payload            (big endian; 1 <= length <= limit)
//! payload  = version:u8 kind:u8 id:u64 body
//! requests  (network -> key process, length <= MAX_REQUEST)
//!   0x01 sign    key:u64 scheme:u16 message:bytes32   (message <= MAX_MESSAGE)
//!   0x02 load    count:u16 keep:u64*count             (count <= MAX_KEYS)
//!   0x03 lane    (empty; a socket rides along as SCM_RIGHTS, unanswered)
//!   0x04 retain  count:u16 keep:u64*count             (count <= MAX_KEYS)
//!   0x05 pipe_lane (empty; two pipe ends ride along as SCM_RIGHTS, unanswered)
//! responses (key process -> network, length <= MAX_RESPONSE)
//!   0x81 signature  signature:bytes16                 (<= MAX_SIGNATURE)
//!   0x82 failed     code:u8
//!   0x83 loaded     listeners:u16 { certs:u16 { default:u8 names:u16 {str16}
//!                   chain:u16 {bytes32} key:u64 algorithm:u8 schemes:u8 {u16} spki:bytes16 } }
//!   0x84 load_failed origin:str16 key:str16 problem:str16
//! ```
//!
//! Parsing is strict: every length is bounded before anything is
//! allocated, trailing bytes are an error, and nothing here panics on any
//! input. `id` pairs an answer with its request, so requests of several
//! threads can be in flight at once and answered in any order.

use rustls::{SignatureAlgorithm, SignatureScheme};
use tlsgate_tls::KeyInfo;

/// Protocol version; both ends are the same binary, so any other is a bug.
/// (2: a message to sign is `bytes32`.)
pub const VERSION: u8 = 2;
/// Largest message to sign. A server signs a few hundred bytes; a TLS 1.2
/// client (an upstream's client certificate) signs the whole handshake so
/// far: its ClientHello, the server's ServerHello, Certificate, status,
/// ServerKeyExchange, CertificateRequest and ServerHelloDone (rustls takes
/// none over 64 KiB), its own Certificate and ClientKeyExchange. The first
/// eight come to under 480 KiB, the client's chain is at most
/// [`tlsgate_tls::material::MAX_CLIENT_CHAIN`] (512 KiB): whatever rustls
/// asks to sign fits. A larger message is refused before it is sent.
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// Largest request payload: a `sign` with the largest message (its header
/// and fields are 20 bytes), a `load` with the largest keep list.
pub const MAX_REQUEST: usize = MAX_MESSAGE + 64;
/// Largest response payload (a `loaded` answer carries every chain).
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;
/// Largest packet written on a lane: one [`Deframer::read_from`] takes at
/// least this much, so a packet is never cut short (the rest of a
/// sequenced packet longer than the read would be lost). Larger frames
/// are sent in several packets.
pub const MAX_PACKET: usize = READ_SIZE;
/// Largest signature (RSA-16384 is 2048 bytes).
pub const MAX_SIGNATURE: usize = 2048;
/// Most keys in a `load` keep list.
pub const MAX_KEYS: usize = 4096;
/// Longest string (paths, error messages, names).
pub const MAX_STR: usize = 4096;
/// Largest certificate DER.
pub const MAX_CERT: usize = 64 * 1024;
/// Largest SubjectPublicKeyInfo DER.
pub const MAX_SPKI: usize = 4096;
/// Largest public file in a `loaded` answer (a CA bundle).
pub const MAX_FILE: usize = tlsgate_tls::material::MAX_PUBLIC_FILE;
/// Most public files in a `loaded` answer.
pub const MAX_FILES: usize = 1024;

const HEADER: usize = 1 + 1 + 8;

// What rustls may ask a client key to sign (see `MAX_MESSAGE`): seven
// handshake messages of at most 4 + 0xffff bytes (six of the server's and
// the ClientHello's extensions), the ClientHello's other fields and a
// ClientKeyExchange (under 2 KiB), and the client's Certificate message
// (its 7 bytes of headers and the chain as it is sent).
const _: () =
    assert!(7 * (4 + 0xffff) + 2048 + 7 + tlsgate_tls::material::MAX_CLIENT_CHAIN <= MAX_MESSAGE);
const _: () = assert!(HEADER + 8 + 2 + 4 + MAX_MESSAGE <= MAX_REQUEST);
const _: () = assert!(HEADER + 2 + MAX_KEYS * 8 <= MAX_REQUEST);

/// What is wrong with a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The length prefix is 0 or above the limit: the stream cannot be trusted.
    #[error("frame length {0} out of bounds")]
    Length(usize),
    /// Another protocol version.
    #[error("unsupported protocol version {0}")]
    Version(u8),
    /// An unknown message kind.
    #[error("unknown message kind {0:#04x}")]
    Kind(u8),
    /// The payload ended early.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A field is over its bound or has a bad value.
    #[error("bad {0}")]
    Field(&'static str),
    /// Bytes after the end of the message.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// A request to the key process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Sign `message` with key `key_id` using `scheme`.
    Sign {
        /// [`KeyInfo::id`] of the key.
        key_id: u64,
        /// The signature scheme, as on the wire in TLS.
        scheme: SignatureScheme,
        /// The bytes to sign.
        message: Vec<u8>,
    },
    /// Read the configuration and its keys again; keep also the keys in
    /// `keep` (those the running configuration uses) if they are gone.
    Load {
        /// Key ids to keep.
        keep: Vec<u64>,
    },
    /// Serve signatures on the Unix socket sent along with this request:
    /// a lane of one worker thread, which then writes a request and reads
    /// its answer itself, with no thread in between. Not answered.
    Lane,
    /// [`Request::Lane`] over two pipes, whose ends ride along in this
    /// order: the one the requests are read from, the one the answers are
    /// written to. Cheaper per signature than a socket (see
    /// `tlsgate_sys::ipc::pipe`). Not answered.
    PipeLane,
    /// The running configuration uses only the keys in `keep`: any other
    /// stops signing once the handshakes begun before may have ended.
    /// Answered with an empty [`Response::Loaded`].
    Retain {
        /// Key ids the running configuration uses.
        keep: Vec<u64>,
    },
}

/// Why the key process did not sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No key with that id is loaded.
    UnknownKey = 1,
    /// The key does not sign with that scheme.
    BadScheme = 2,
    /// The signature itself failed.
    SignFailed = 3,
    /// The request could not be parsed.
    BadRequest = 4,
}

impl Failure {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::UnknownKey,
            2 => Self::BadScheme,
            3 => Self::SignFailed,
            4 => Self::BadRequest,
            _ => return None,
        })
    }
}

/// One certificate as the key process loaded it: everything public.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertEntry {
    /// Served when SNI matches nothing.
    pub default: bool,
    /// Server names it answers for.
    pub names: Vec<String>,
    /// Chain DER, leaf first.
    pub chain: Vec<Vec<u8>>,
    /// Its key, described.
    pub key: KeyInfo,
}

/// An upstream's client certificate as the key process loaded it: the
/// chain and the public description of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientEntry {
    /// Chain DER, leaf first.
    pub chain: Vec<Vec<u8>>,
    /// Its key, described (it signs in the key process).
    pub key: KeyInfo,
}

/// What a `load` is answered with: everything public.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Certificates per listener, in configuration order.
    pub listeners: Vec<Vec<CertEntry>>,
    /// Public files (CA bundles, client certificate chains) by path:
    /// the network-facing process, unprivileged after its start, may be
    /// unable to read them.
    pub files: Vec<(String, Vec<u8>)>,
    /// Each upstream's client certificate, in configuration order.
    pub upstreams: Vec<Option<ClientEntry>>,
}

/// A configuration problem found by the key process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file (or `command line`, `built-in defaults`).
    pub origin: String,
    /// The config key.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

/// An answer of the key process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The signature.
    Signature(Vec<u8>),
    /// No signature.
    Failed(Failure),
    /// Certificates per listener, public files and upstream client
    /// certificates.
    Loaded(Loaded),
    /// The configuration or a key could not be loaded.
    LoadFailed(LoadError),
}

/// Appends big-endian fields to a frame under construction.
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    /// A count or length that the sender bounds; saturates rather than
    /// wrapping so that an over-long value is refused by the reader.
    fn len16(&mut self, n: usize) {
        self.u16(u16::try_from(n).unwrap_or(u16::MAX));
    }
    fn bytes16(&mut self, b: &[u8]) {
        self.len16(b.len());
        self.0.extend_from_slice(b);
    }
    fn bytes32(&mut self, b: &[u8]) {
        self.0
            .extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_be_bytes());
        self.0.extend_from_slice(b);
    }
    fn chain(&mut self, chain: &[Vec<u8>]) {
        self.len16(chain.len());
        for der in chain {
            self.bytes32(der);
        }
    }
    fn key(&mut self, k: &KeyInfo) {
        self.u64(k.id);
        self.u8(u8::from(k.algorithm));
        self.u8(u8::try_from(k.schemes.len()).unwrap_or(u8::MAX));
        for s in &k.schemes {
            self.u16(u16::from(*s));
        }
        self.bytes16(&k.spki);
    }
    fn str16(&mut self, s: &str) {
        // Longer strings are cut (on a char boundary) rather than refused:
        // they are messages and names, and the reader enforces the bound.
        let mut end = s.len().min(MAX_STR);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes16(s.as_bytes().get(..end).unwrap_or_default());
    }
}

/// Reads fields from a payload, never past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_be_bytes(a))
    }
    fn bounded(
        &mut self,
        n: usize,
        max: usize,
        what: &'static str,
    ) -> Result<&'a [u8], ProtoError> {
        if n > max {
            return Err(ProtoError::Field(what));
        }
        self.take(n, what)
    }
    fn bytes16(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let n = usize::from(self.u16(what)?);
        self.bounded(n, max, what)
    }
    fn bytes32(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let n = usize::try_from(self.u32(what)?).map_err(|_| ProtoError::Field(what))?;
        self.bounded(n, max, what)
    }
    fn str16(&mut self, what: &'static str) -> Result<String, ProtoError> {
        let b = self.bytes16(MAX_STR, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Field(what))
    }
    /// A count of items each at least `min_size` bytes long: bounded by
    /// what is left, so a lying count cannot make us allocate.
    fn count(
        &mut self,
        n: usize,
        max: usize,
        min_size: usize,
        what: &'static str,
    ) -> Result<usize, ProtoError> {
        if n > max || n.saturating_mul(min_size) > self.0.len() {
            return Err(ProtoError::Field(what));
        }
        Ok(n)
    }
    fn finish(self) -> Result<(), ProtoError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

/// Starts a frame: reserves the length and writes the header.
fn begin(out: &mut Vec<u8>, kind: u8, id: u64) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut w = Writer(out);
    w.u8(VERSION);
    w.u8(kind);
    w.u64(id);
    start
}

/// Ends a frame: fills in its length.
fn end(out: &mut [u8], start: usize) {
    let len = out.len() - start - 4;
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    if let Some(slot) = out.get_mut(start..start + 4) {
        slot.copy_from_slice(&len);
    }
}

/// Appends the frame of request `id` to `out`.
pub fn encode_request(out: &mut Vec<u8>, id: u64, req: &Request) {
    match req {
        Request::Sign {
            key_id,
            scheme,
            message,
        } => {
            let start = begin(out, 0x01, id);
            let mut w = Writer(out);
            w.u64(*key_id);
            w.u16(u16::from(*scheme));
            w.bytes32(message);
            end(out, start);
        }
        Request::Load { keep } | Request::Retain { keep } => {
            let kind = if matches!(req, Request::Load { .. }) {
                0x02
            } else {
                0x04
            };
            let start = begin(out, kind, id);
            let mut w = Writer(out);
            w.len16(keep.len());
            for k in keep.iter().take(usize::from(u16::MAX)) {
                w.u64(*k);
            }
            end(out, start);
        }
        Request::Lane => {
            let start = begin(out, 0x03, id);
            end(out, start);
        }
        Request::PipeLane => {
            let start = begin(out, 0x05, id);
            end(out, start);
        }
    }
}

/// Appends the frame answering request `id` to `out`.
pub fn encode_response(out: &mut Vec<u8>, id: u64, resp: &Response) {
    match resp {
        Response::Signature(sig) => {
            let start = begin(out, 0x81, id);
            Writer(out).bytes16(sig);
            end(out, start);
        }
        Response::Failed(f) => {
            let start = begin(out, 0x82, id);
            Writer(out).u8(*f as u8);
            end(out, start);
        }
        Response::Loaded(loaded) => {
            let start = begin(out, 0x83, id);
            let mut w = Writer(out);
            w.len16(loaded.listeners.len());
            for certs in &loaded.listeners {
                w.len16(certs.len());
                for c in certs {
                    w.u8(u8::from(c.default));
                    w.len16(c.names.len());
                    for n in &c.names {
                        w.str16(n);
                    }
                    w.chain(&c.chain);
                    w.key(&c.key);
                }
            }
            w.len16(loaded.files.len());
            for (path, bytes) in &loaded.files {
                w.str16(path);
                w.bytes32(bytes);
            }
            w.len16(loaded.upstreams.len());
            for u in &loaded.upstreams {
                match u {
                    None => w.u8(0),
                    Some(c) => {
                        w.u8(1);
                        w.chain(&c.chain);
                        w.key(&c.key);
                    }
                }
            }
            end(out, start);
        }
        Response::LoadFailed(e) => {
            let start = begin(out, 0x84, id);
            let mut w = Writer(out);
            w.str16(&e.origin);
            w.str16(&e.key);
            w.str16(&e.problem);
            end(out, start);
        }
    }
}

/// Reads the header; the id is returned even when the body is bad, so the
/// key process can say which request it refuses.
fn header(payload: &[u8]) -> Result<(u8, u64, Reader<'_>), ProtoError> {
    let mut r = Reader(payload);
    if payload.len() < HEADER {
        return Err(ProtoError::Truncated("header"));
    }
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(ProtoError::Version(version));
    }
    let kind = r.u8("kind")?;
    let id = r.u64("id")?;
    Ok((kind, id, r))
}

/// The request id of a payload whose header is sound, if it is.
pub fn request_id(payload: &[u8]) -> Option<u64> {
    header(payload).ok().map(|(_, id, _)| id)
}

/// Parses one request payload (without its length prefix).
pub fn decode_request(payload: &[u8]) -> Result<(u64, Request), ProtoError> {
    let (kind, id, mut r) = header(payload)?;
    let req = match kind {
        0x01 => {
            let key_id = r.u64("key id")?;
            let scheme = SignatureScheme::from(r.u16("scheme")?);
            let message = r.bytes32(MAX_MESSAGE, "message")?.to_vec();
            Request::Sign {
                key_id,
                scheme,
                message,
            }
        }
        kind @ (0x02 | 0x04) => {
            let n = usize::from(r.u16("keep count")?);
            let n = r.count(n, MAX_KEYS, 8, "keep count")?;
            let keep = (0..n).map(|_| r.u64("keep")).collect::<Result<_, _>>()?;
            if kind == 0x02 {
                Request::Load { keep }
            } else {
                Request::Retain { keep }
            }
        }
        0x03 => Request::Lane,
        0x05 => Request::PipeLane,
        k => return Err(ProtoError::Kind(k)),
    };
    r.finish()?;
    Ok((id, req))
}

/// Parses one response payload (without its length prefix).
pub fn decode_response(payload: &[u8]) -> Result<(u64, Response), ProtoError> {
    let (kind, id, mut r) = header(payload)?;
    let resp = match kind {
        0x81 => Response::Signature(r.bytes16(MAX_SIGNATURE, "signature")?.to_vec()),
        0x82 => Response::Failed(
            Failure::from_u8(r.u8("failure")?).ok_or(ProtoError::Field("failure"))?,
        ),
        0x83 => {
            let n = usize::from(r.u16("listener count")?);
            // Each listener takes at least its 2-byte certificate count.
            let n = r.count(n, usize::from(u16::MAX), 2, "listener count")?;
            let mut listeners = Vec::with_capacity(n);
            for _ in 0..n {
                let m = usize::from(r.u16("certificate count")?);
                // default, names, chain, key id, algorithm, schemes, spki
                let m = r.count(
                    m,
                    usize::from(u16::MAX),
                    1 + 2 + 2 + 8 + 1 + 1 + 2,
                    "certificate count",
                )?;
                let mut certs = Vec::with_capacity(m);
                for _ in 0..m {
                    certs.push(cert_entry(&mut r)?);
                }
                listeners.push(certs);
            }
            let n = usize::from(r.u16("file count")?);
            // A path's length and the bytes' length at least.
            let n = r.count(n, MAX_FILES, 2 + 4, "file count")?;
            let mut files = Vec::with_capacity(n);
            for _ in 0..n {
                let path = r.str16("path")?;
                let bytes = r.bytes32(MAX_FILE, "file")?.to_vec();
                files.push((path, bytes));
            }
            let n = usize::from(r.u16("upstream count")?);
            let n = r.count(n, usize::from(u16::MAX), 1, "upstream count")?;
            let mut upstreams = Vec::with_capacity(n);
            for _ in 0..n {
                upstreams.push(match r.u8("client")? {
                    0 => None,
                    1 => {
                        let chain = chain(&mut r)?;
                        let key = key_info(&mut r)?;
                        Some(ClientEntry { chain, key })
                    }
                    _ => return Err(ProtoError::Field("client")),
                });
            }
            Response::Loaded(Loaded {
                listeners,
                files,
                upstreams,
            })
        }
        0x84 => Response::LoadFailed(LoadError {
            origin: r.str16("origin")?,
            key: r.str16("key")?,
            problem: r.str16("problem")?,
        }),
        k => return Err(ProtoError::Kind(k)),
    };
    r.finish()?;
    Ok((id, resp))
}

fn cert_entry(r: &mut Reader<'_>) -> Result<CertEntry, ProtoError> {
    let default = match r.u8("default")? {
        0 => false,
        1 => true,
        _ => return Err(ProtoError::Field("default")),
    };
    let n = usize::from(r.u16("name count")?);
    let n = r.count(n, MAX_KEYS, 2, "name count")?;
    let names = (0..n).map(|_| r.str16("name")).collect::<Result<_, _>>()?;
    let chain = chain(r)?;
    let key = key_info(r)?;
    Ok(CertEntry {
        default,
        names,
        chain,
        key,
    })
}

fn chain(r: &mut Reader<'_>) -> Result<Vec<Vec<u8>>, ProtoError> {
    let n = usize::from(r.u16("chain length")?);
    let n = r.count(n, 64, 4, "chain length")?;
    let chain: Vec<Vec<u8>> = (0..n)
        .map(|_| r.bytes32(MAX_CERT, "certificate").map(<[u8]>::to_vec))
        .collect::<Result<_, _>>()?;
    if chain.is_empty() {
        return Err(ProtoError::Field("chain length"));
    }
    Ok(chain)
}

fn key_info(r: &mut Reader<'_>) -> Result<KeyInfo, ProtoError> {
    let id = r.u64("key id")?;
    let algorithm = SignatureAlgorithm::from(r.u8("algorithm")?);
    let n = usize::from(r.u8("scheme count")?);
    let n = r.count(n, 32, 2, "scheme count")?;
    let schemes = (0..n)
        .map(|_| r.u16("scheme").map(SignatureScheme::from))
        .collect::<Result<_, _>>()?;
    let spki = r.bytes16(MAX_SPKI, "spki")?.to_vec();
    Ok(KeyInfo {
        id,
        algorithm,
        schemes,
        spki,
    })
}

/// Splits a byte stream into frame payloads, holding at most one frame.
#[derive(Debug)]
pub struct Deframer {
    /// Initialized bytes; those from `end` on are free space.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max: usize,
}

/// Bytes one read asks for.
const READ_SIZE: usize = 64 * 1024;

impl Deframer {
    /// Frames of at most `max` payload bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max,
        }
    }

    /// Moves unread bytes to the front and makes room for `room` more.
    /// The buffer is zeroed once when it grows, not at every read (a read
    /// per signature zeroed 64 KiB on both sides).
    fn make_room(&mut self, room: usize) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + room {
            self.buf.resize(self.end + room, 0);
        }
    }

    /// Reads once from `src` (as much as is there, up to 64 KiB); `Ok(0)` is EOF.
    pub fn read_from(&mut self, src: &mut impl std::io::Read) -> std::io::Result<usize> {
        // Consumed bytes go first, so the buffer never grows past one frame
        // plus one read.
        self.make_room(READ_SIZE);
        let free = self.buf.get_mut(self.end..).unwrap_or_default();
        let n = src.read(free)?.min(free.len());
        self.end += n;
        Ok(n)
    }

    /// Adds bytes (for tests and for callers that read themselves).
    pub fn push(&mut self, data: &[u8]) {
        self.make_room(data.len());
        if let Some(dst) = self.buf.get_mut(self.end..self.end + data.len()) {
            dst.copy_from_slice(data);
            self.end += data.len();
        }
    }

    /// The next complete payload, `Ok(None)` when more bytes are needed, or
    /// an error when the length prefix is out of bounds.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, ProtoError> {
        let rest = self.buf.get(self.start..self.end).unwrap_or_default();
        let Some(prefix) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len < HEADER || len > self.max {
            return Err(ProtoError::Length(len));
        }
        if rest.len() < 4 + len {
            return Ok(None);
        }
        let from = self.start + 4;
        self.start = from + len;
        Ok(self.buf.get(from..from + len))
    }

    /// Bytes of an incomplete frame waiting for the rest.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key() -> KeyInfo {
        KeyInfo {
            id: 0x0123_4567_89ab_cdef,
            algorithm: SignatureAlgorithm::RSA,
            schemes: vec![
                SignatureScheme::RSA_PSS_SHA256,
                SignatureScheme::RSA_PKCS1_SHA256,
            ],
            spki: vec![0x30, 3, 1, 2, 3],
        }
    }

    fn responses() -> Vec<Response> {
        vec![
            Response::Signature(vec![7; 256]),
            Response::Failed(Failure::UnknownKey),
            Response::Loaded(Loaded {
                listeners: vec![
                    vec![CertEntry {
                        default: true,
                        names: vec!["a.example".into(), "*.b.example".into()],
                        chain: vec![vec![1, 2, 3], vec![4; 1000]],
                        key: key(),
                    }],
                    vec![],
                ],
                files: vec![("/etc/ca.pem".into(), vec![5; 3000])],
                upstreams: vec![
                    None,
                    Some(ClientEntry {
                        chain: vec![vec![6; 10]],
                        key: key(),
                    }),
                ],
            }),
            Response::LoadFailed(LoadError {
                origin: "/etc/tlsgate.toml".into(),
                key: "listener[0].certificate[0].key".into(),
                problem: "does not match — the certificate".into(),
            }),
            Response::Loaded(Loaded::default()),
        ]
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::Sign {
                key_id: 42,
                scheme: SignatureScheme::ECDSA_NISTP256_SHA256,
                message: b"to be signed".to_vec(),
            },
            Request::Load {
                keep: vec![1, 2, u64::MAX],
            },
            Request::Load { keep: vec![] },
            Request::Lane,
            Request::PipeLane,
            Request::Retain { keep: vec![7, 8] },
        ]
    }

    /// Payloads of every frame in `bytes`.
    fn frames(bytes: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut d = Deframer::new(max);
        d.push(bytes);
        let mut out = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            out.push(f.to_vec());
        }
        assert_eq!(d.pending(), 0);
        out
    }

    #[test]
    fn requests_and_responses_round_trip_in_one_buffer() {
        let mut buf = Vec::new();
        for (i, r) in requests().iter().enumerate() {
            encode_request(&mut buf, i as u64 + 10, r);
        }
        let got: Vec<_> = frames(&buf, MAX_REQUEST)
            .iter()
            .map(|f| decode_request(f).unwrap())
            .collect();
        let want: Vec<_> = requests()
            .into_iter()
            .enumerate()
            .map(|(i, r)| (i as u64 + 10, r))
            .collect();
        assert_eq!(got, want);

        let mut buf = Vec::new();
        for (i, r) in responses().iter().enumerate() {
            encode_response(&mut buf, u64::MAX - i as u64, r);
        }
        let got: Vec<_> = frames(&buf, MAX_RESPONSE)
            .iter()
            .map(|f| decode_response(f).unwrap())
            .collect();
        let want: Vec<_> = responses()
            .into_iter()
            .enumerate()
            .map(|(i, r)| (u64::MAX - i as u64, r))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn frames_split_anywhere_are_reassembled() {
        let mut buf = Vec::new();
        for r in requests() {
            encode_request(&mut buf, 1, &r);
        }
        let mut d = Deframer::new(MAX_REQUEST);
        let mut seen = 0;
        for b in &buf {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                decode_request(f).unwrap();
                seen += 1;
            }
        }
        assert_eq!(seen, requests().len());
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for r in responses() {
            let mut buf = Vec::new();
            encode_response(&mut buf, 9, &r);
            let payload = &buf[4..];
            for cut in 0..payload.len() {
                assert!(
                    decode_response(&payload[..cut]).is_err(),
                    "{r:?} cut at {cut}"
                );
            }
            let mut long = payload.to_vec();
            long.push(0);
            assert_eq!(decode_response(&long).unwrap_err(), ProtoError::Trailing(1));
        }
        for r in requests() {
            let mut buf = Vec::new();
            encode_request(&mut buf, 9, &r);
            let payload = &buf[4..];
            for cut in 0..payload.len() {
                assert!(
                    decode_request(&payload[..cut]).is_err(),
                    "{r:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn oversized_and_undersized_lengths_are_refused_before_buffering() {
        let mut d = Deframer::new(MAX_REQUEST);
        d.push(&(MAX_REQUEST as u32 + 1).to_be_bytes());
        assert_eq!(
            d.next_frame().unwrap_err(),
            ProtoError::Length(MAX_REQUEST + 1)
        );
        let mut d = Deframer::new(MAX_REQUEST);
        d.push(&u32::MAX.to_be_bytes());
        assert!(matches!(d.next_frame(), Err(ProtoError::Length(_))));
        let mut d = Deframer::new(MAX_REQUEST);
        d.push(&[0, 0, 0, 0]);
        assert_eq!(d.next_frame().unwrap_err(), ProtoError::Length(0));
        // A message over its own bound inside a frame that fits.
        let mut buf = Vec::new();
        encode_request(
            &mut buf,
            1,
            &Request::Sign {
                key_id: 1,
                scheme: SignatureScheme::ED25519,
                message: vec![0; MAX_MESSAGE + 1],
            },
        );
        assert_eq!(
            decode_request(&buf[4..]).unwrap_err(),
            ProtoError::Field("message")
        );
        assert_eq!(request_id(&buf[4..]), Some(1), "the id is still known");
    }

    /// The largest message goes over a lane in packets of at most
    /// [`MAX_PACKET`], after and before small frames sharing those
    /// packets; the reader's deframer gives the frames back whole.
    #[test]
    fn the_largest_sign_request_crosses_a_lane_in_packets() {
        use std::io::Write;
        let big = Request::Sign {
            key_id: 7,
            scheme: SignatureScheme::RSA_PSS_SHA256,
            message: (0..MAX_MESSAGE).map(|i| i as u8).collect(),
        };
        let mut buf = Vec::new();
        encode_request(&mut buf, 1, &requests()[0]);
        encode_request(&mut buf, 2, &big);
        encode_request(&mut buf, 3, &requests()[0]);
        let (mut ours, mut theirs) = tlsgate_sys::ipc::packet_pair().unwrap();
        let packet = tlsgate_sys::ipc::packet_limit(&ours, MAX_PACKET);
        let writer = std::thread::spawn(move || {
            for p in buf.chunks(packet) {
                ours.write_all(p).unwrap();
            }
        });
        let mut d = Deframer::new(MAX_REQUEST);
        let mut got = Vec::new();
        while got.len() < 3 {
            assert!(d.read_from(&mut theirs).unwrap() > 0);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(decode_request(f).unwrap());
            }
        }
        writer.join().unwrap();
        assert_eq!(got[1], (2, big));
        assert_eq!(got[2], (3, requests()[0].clone()));
    }

    #[test]
    fn lying_counts_and_bad_fields_are_refused() {
        // keep count says 65535 but carries none.
        let mut p = vec![VERSION, 0x02, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff];
        assert_eq!(
            decode_request(&p).unwrap_err(),
            ProtoError::Field("keep count")
        );
        p[1] = 0x7f;
        assert_eq!(decode_request(&p).unwrap_err(), ProtoError::Kind(0x7f));
        p[0] = VERSION + 1;
        assert_eq!(
            decode_request(&p).unwrap_err(),
            ProtoError::Version(VERSION + 1)
        );
        // A loaded answer claiming 65535 listeners in 2 bytes.
        let p = [VERSION, 0x83, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff];
        assert!(decode_response(&p).is_err());
        // Unknown failure code; a bad default flag; invalid UTF-8.
        let p = [VERSION, 0x82, 0, 0, 0, 0, 0, 0, 0, 1, 99];
        assert_eq!(
            decode_response(&p).unwrap_err(),
            ProtoError::Field("failure")
        );
        let mut buf = Vec::new();
        encode_response(&mut buf, 1, &responses()[2]);
        let mut bad = buf[4..].to_vec();
        bad[HEADER + 4] = 2; // the first certificate's default flag
        assert_eq!(
            decode_response(&bad).unwrap_err(),
            ProtoError::Field("default")
        );
        let mut buf = Vec::new();
        encode_response(&mut buf, 1, &responses()[3]);
        let mut bad = buf[4..].to_vec();
        bad[HEADER + 2] = 0xff; // first byte of the origin
        assert_eq!(
            decode_response(&bad).unwrap_err(),
            ProtoError::Field("origin")
        );
    }

    #[test]
    fn garbage_never_panics() {
        // A deterministic pseudo-random stream of payloads, raw and behind
        // valid headers, through both decoders and the deframer.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20_000 {
            let len = (next() % 300) as usize;
            let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && p.len() >= 2 {
                p[0] = VERSION;
                p[1] = [0x01, 0x02, 0x81, 0x82, 0x83, 0x84][round / 2 % 6];
            }
            let _ = decode_request(&p);
            let _ = decode_response(&p);
            let mut d = Deframer::new(MAX_REQUEST);
            d.push(&p);
            while let Ok(Some(f)) = d.next_frame() {
                let _ = decode_request(f);
            }
        }
    }

    #[test]
    fn long_strings_are_cut_on_a_char_boundary() {
        let e = LoadError {
            origin: "é".repeat(MAX_STR),
            key: String::new(),
            problem: String::new(),
        };
        let mut buf = Vec::new();
        encode_response(&mut buf, 1, &Response::LoadFailed(e));
        let (_, r) = decode_response(&buf[4..]).unwrap();
        let Response::LoadFailed(got) = r else {
            panic!()
        };
        assert_eq!(got.origin.len(), MAX_STR);
    }
}
