//! The key process and its supervisor.
//!
//! The supervisor (`tlsgate key-supervisor`) is started by the network-
//! facing process before it drops privileges, so it keeps them. It never
//! reads a key: it starts the key server (`tlsgate key-server`), hands one
//! end of a fresh socket pair to the network-facing process over its
//! control socket (`SCM_RIGHTS`), waits for the key server to exit, and
//! starts another after a backoff. A fresh socket per key server means an
//! answer half-written by a dying key server can never be mistaken for
//! the start of the next one's.
//!
//! The key server reads the configuration and the private keys itself (the
//! network-facing process cannot name other files to it), answers `load`
//! with the public half of every certificate, and signs on request. Each
//! wake-up drains every request that has arrived and answers them all in
//! one write.
//!
//! A worker thread of the network-facing process can open a lane: a
//! socket pair whose one end it sends along with a `lane` request, or two
//! pipes (requests in, answers out) whose far ends it sends along with a
//! `pipe_lane` request. A lane is served by a thread of its own here, and
//! the worker writes its request and reads the answer itself: two wake-ups per signature (this
//! process, then the worker), where the shared connection needs a third
//! (its reader thread, which hands the answer over).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rustls::sign::SigningKey;
use tlsgate_config::{Config, ConfigError};
use tlsgate_tls::{KeyInfo, SelfSignedCache};

use crate::proto::{
    self, CertEntry, ClientEntry, Deframer, Failure, LoadError, Loaded, Request, Response,
};

/// First wait before restarting a key server that exited.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between restarts.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A key server that ran this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// How long an answer may wait for the network-facing process to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Capacity of the answer buffer kept between wake-ups.
const OUT_KEPT: usize = 64 * 1024;
/// Most lanes served at once (one thread each); the network side opens one
/// per worker thread. A lane over the bound is closed at once, and its
/// worker signs over the shared connection.
pub const MAX_LANES: usize = 256;

/// The key server's nice value, where it may lower it (root, or
/// `CAP_SYS_NICE`). On a core it shares with a worker, a worker woken by
/// the network would otherwise preempt a signature under way, as often
/// as twice per RSA signature at a few thousand handshakes a second,
/// each time on caches the worker then filled. docs/bench.md, "Key
/// isolation's cost", has the measurement.
pub const NICE: i32 = -5;

/// Runs the supervisor until the network-facing process goes away.
///
/// `control` is its control socket (standard input); `worker_args` are the
/// arguments of `tlsgate key-server` (the configuration to load).
pub fn supervise(control: UnixStream, parent: u32, worker_args: Vec<OsString>) -> io::Result<()> {
    tlsgate_sys::ipc::die_with_parent(parent)?;
    let me = std::process::id().to_string();
    let mut backoff = BACKOFF_MIN;
    // Key servers handed over so far: the network side names the one it
    // asks us to kill by this count, so a late ask never hits its successor.
    let mut generation: u64 = 0;
    let asks = restart_asks(control.try_clone()?)?;
    loop {
        let (ours, theirs) = tlsgate_sys::ipc::socket_pair()?;
        // /proc/self/exe: the very binary that runs now, even if the file
        // was replaced by an upgrade since.
        let spawned = Command::new("/proc/self/exe")
            .arg0("tlsgate")
            .arg("key-server")
            .arg("--parent")
            .arg(&me)
            .args(&worker_args)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("cannot start the key server: {e}; retrying in {backoff:?}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let started = Instant::now();
        if let Err(e) = tlsgate_sys::ipc::send_fd(&control, &ours) {
            // The network-facing process is gone: so are we.
            let _ = child.kill();
            let _ = child.wait();
            tracing::debug!("control socket closed ({e}); key supervisor exits");
            return Ok(());
        }
        drop(ours);
        generation += 1;
        let status = wait_or_kill(&mut child, generation, &asks)?;
        if started.elapsed() >= HEALTHY_AFTER {
            backoff = BACKOFF_MIN;
        }
        if status.success() {
            // It saw the network side close its connection: that side is
            // exiting (or `check-config` is done), not a failure to report.
            tracing::debug!("key server finished; starting another in {backoff:?}");
        } else {
            tracing::warn!("key server exited ({status}); starting another in {backoff:?}");
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Bytes of a restart ask on the control socket: the generation (1 for
/// the first key server handed over), big-endian.
pub(crate) const RESTART_ASK_LEN: usize = 8;
/// How often the supervisor checks its key server for an exit while it
/// waits for restart asks.
const CHILD_POLL: Duration = Duration::from_millis(50);

/// Reads restart asks from the network side on a thread of their own (the
/// main thread waits for the key server); the channel closes with the
/// control socket.
fn restart_asks(mut control: UnixStream) -> io::Result<std::sync::mpsc::Receiver<u64>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("restart-asks".into())
        .spawn(move || {
            let mut ask = [0u8; RESTART_ASK_LEN];
            while control.read_exact(&mut ask).is_ok() {
                if tx.send(u64::from_be_bytes(ask)).is_err() {
                    return;
                }
            }
        })?;
    Ok(rx)
}

/// Waits for `child` (key server number `generation`) to exit, killing it
/// when the network side asks for that generation: a hung key server
/// (stopped, deadlocked) never exits by itself, and the network side
/// cannot signal it (it runs unprivileged). The child is reaped only here,
/// so its pid cannot be reused by another process while we may kill it.
fn wait_or_kill(
    child: &mut std::process::Child,
    generation: u64,
    asks: &std::sync::mpsc::Receiver<u64>,
) -> io::Result<std::process::ExitStatus> {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        match asks.recv_timeout(CHILD_POLL) {
            Ok(g) if g == generation => {
                tracing::error!(
                    "killing the key server (pid {}): the serving process finds it hung",
                    child.id()
                );
                child.kill()?;
            }
            // Asked about a key server already replaced.
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            // The network side is gone: its key server exits on EOF.
            Err(RecvTimeoutError::Disconnected) => return child.wait(),
        }
    }
}

/// Loaded keys by [`KeyInfo::id`], shared by the main loop (which
/// replaces them on `load`) and the lanes (which sign with them).
type KeyMap = Arc<RwLock<HashMap<u64, Held>>>;

/// A loaded key, and when it stops signing if the running configuration
/// no longer uses it.
#[derive(Clone)]
struct Held {
    key: Arc<dyn SigningKey>,
    retired_until: Option<Instant>,
    /// A listener's key: signs what a TLS server signs.
    server: bool,
    /// An upstream's client key: signs what a TLS client signs.
    client: bool,
}

impl Held {
    fn signs(&self, now: Instant) -> bool {
        self.retired_until.is_none_or(|t| now < t)
    }
}

/// The keys the key server holds.
struct Keys {
    by_id: KeyMap,
    self_signed: SelfSignedCache,
    /// How long a key the configuration dropped still signs for the
    /// handshakes begun before: `handshake_timeout` + `key_timeout` of the
    /// configuration last loaded.
    grace: Duration,
}

/// Whether `message` is what a TLS server signs in a handshake, the only
/// use of the keys here. A network process taken over by an attacker must
/// not get signatures over bytes of its choice (a certificate request, a
/// token): only a TLS 1.3 server CertificateVerify (RFC 8446 §4.4.3, over
/// a SHA-256 or SHA-384 transcript hash) or a TLS 1.2 ServerKeyExchange
/// (RFC 8422 §5.4: both randoms, then a named curve and its point).
fn is_handshake_signature_input(message: &[u8]) -> bool {
    const TLS13_CONTEXT: &[u8] = b"TLS 1.3, server CertificateVerify\0";
    if let Some(rest) = message.strip_prefix(&[0x20; 64]) {
        if let Some(hash) = rest.strip_prefix(TLS13_CONTEXT) {
            return matches!(hash.len(), 32 | 48);
        }
    }
    // client_random, server_random, curve_type named_curve (3), the
    // curve, the point's length and the point.
    let Some(&[3, hi, lo, len]) = message.get(64..68) else {
        return false;
    };
    let point = match u16::from_be_bytes([hi, lo]) {
        0x001d => 32, // X25519
        0x0017 => 65, // secp256r1, uncompressed
        0x0018 => 97, // secp384r1, uncompressed
        _ => return false,
    };
    usize::from(len) == point && message.len() == 68 + point
}

/// Whether `message` is what a TLS client signs in a handshake (an
/// upstream's client key, the only use of those keys here): a TLS 1.3
/// client CertificateVerify (RFC 8446 §4.4.3), or a TLS 1.2 one, whose
/// input is the handshake so far (RFC 5246 §7.4.8): a ClientHello, then
/// a ServerHello. Neither can pass for what a server signs.
fn is_client_signature_input(message: &[u8]) -> bool {
    const TLS13_CONTEXT: &[u8] = b"TLS 1.3, client CertificateVerify\0";
    if let Some(rest) = message.strip_prefix(&[0x20; 64]) {
        if let Some(hash) = rest.strip_prefix(TLS13_CONTEXT) {
            return matches!(hash.len(), 32 | 48);
        }
    }
    // ClientHello (1), its 24-bit length, legacy_version 3.3; then a
    // ServerHello (2) right after it.
    let Some(&[1, a, b, c, 3, 3]) = message.get(..6) else {
        return false;
    };
    let hello = 4 + (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c));
    message.get(hello) == Some(&2)
}

fn sign_with(
    by_id: &KeyMap,
    key_id: u64,
    scheme: rustls::SignatureScheme,
    message: &[u8],
) -> Response {
    let server_input = is_handshake_signature_input(message);
    let client_input = !server_input && is_client_signature_input(message);
    if !server_input && !client_input {
        return Response::Failed(Failure::BadRequest);
    }
    let key = by_id
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key_id)
        .filter(|h| h.signs(Instant::now()))
        .map(|h| (h.key.clone(), h.server, h.client));
    let Some((key, server, client)) = key else {
        return Response::Failed(Failure::UnknownKey);
    };
    // A key signs only for its role: a listener's key never what a client
    // signs, an upstream client key never what a server signs.
    if (server_input && !server) || (client_input && !client) {
        return Response::Failed(Failure::BadRequest);
    }
    let Some(signer) = key.choose_scheme(&[scheme]) else {
        return Response::Failed(Failure::BadScheme);
    };
    match signer.sign(message) {
        Ok(sig) if sig.len() <= proto::MAX_SIGNATURE => Response::Signature(sig),
        _ => Response::Failed(Failure::SignFailed),
    }
}

impl Keys {
    fn sign(&self, key_id: u64, scheme: rustls::SignatureScheme, message: &[u8]) -> Response {
        sign_with(&self.by_id, key_id, scheme, message)
    }

    /// The running configuration uses only `keep`: every other key stops
    /// signing after the grace (a deadline once set is never moved).
    fn retain(&mut self, keep: &[u64]) -> Response {
        let now = Instant::now();
        let mut current = self.by_id.write().unwrap_or_else(PoisonError::into_inner);
        current.retain(|_, h| h.signs(now));
        for (id, held) in current.iter_mut() {
            if !keep.contains(id) && held.retired_until.is_none() {
                held.retired_until = Some(now + self.grace);
            }
        }
        Response::Loaded(Loaded::default())
    }

    /// Reads the configuration and every key again. On success the loaded
    /// keys replace the old ones, except those in `keep` that are gone
    /// (the running configuration of the network side still uses them
    /// until a `retain` says otherwise; one already retired keeps its
    /// deadline, so asking again does not keep a dropped key alive).
    fn load(&mut self, config: Result<Config, ConfigError>, keep: &[u64]) -> Response {
        let fail = |e: ConfigError| {
            Response::LoadFailed(LoadError {
                origin: e.origin,
                key: e.key,
                problem: e.problem,
            })
        };
        let config = match config {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let loaded = match tlsgate_tls::load_all(&config, &self.self_signed) {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        let material = match tlsgate_tls::Material::load(&config) {
            Ok(m) => m,
            Err(e) => return fail(e),
        };
        let mut by_id = HashMap::new();
        let mut listeners = Vec::with_capacity(loaded.len());
        for certs in loaded {
            let mut entries = Vec::with_capacity(certs.len());
            for c in certs {
                let key = c.certified.key.clone();
                let Some(info) = KeyInfo::of(&*key) else {
                    return fail(ConfigError::new(
                        &config.origin,
                        "listener",
                        "a private key cannot state its public key",
                    ));
                };
                by_id
                    .entry(info.id)
                    .or_insert(Held {
                        key,
                        retired_until: None,
                        server: false,
                        client: false,
                    })
                    .server = true;
                entries.push(CertEntry {
                    default: c.default,
                    names: c.names.clone(),
                    chain: c
                        .certified
                        .cert
                        .iter()
                        .map(|d| d.as_ref().to_vec())
                        .collect(),
                    key: info,
                });
            }
            listeners.push(entries);
        }
        let mut upstreams = Vec::with_capacity(material.upstream_clients.len());
        for c in &material.upstream_clients {
            let Some(c) = c else {
                upstreams.push(None);
                continue;
            };
            let Some(info) = KeyInfo::of(&*c.key) else {
                return fail(ConfigError::new(
                    &config.origin,
                    "upstream",
                    "a private key cannot state its public key",
                ));
            };
            by_id
                .entry(info.id)
                .or_insert(Held {
                    key: c.key.clone(),
                    retired_until: None,
                    server: false,
                    client: false,
                })
                .client = true;
            upstreams.push(Some(ClientEntry {
                chain: c.cert.iter().map(|d| d.as_ref().to_vec()).collect(),
                key: info,
            }));
        }
        let files = material
            .files
            .iter()
            .map(|(p, b)| (p.to_string_lossy().into_owned(), b.to_vec()))
            .collect();
        let now = Instant::now();
        let mut current = self.by_id.write().unwrap_or_else(PoisonError::into_inner);
        for id in keep {
            if let Some(old) = current.get(id).filter(|h| h.signs(now)) {
                by_id.entry(*id).or_insert_with(|| old.clone());
            }
        }
        *current = by_id;
        self.grace = config
            .limits
            .handshake_timeout
            .saturating_add(config.keys.timeout);
        Response::Loaded(Loaded {
            listeners,
            files,
            upstreams,
        })
    }
}

/// Runs the key server on `conn` until the network side closes it (the
/// caller makes it die with its supervisor first).
///
/// `load_config` reads the configuration the way `tlsgate serve` was told
/// to (file and flags). An out-of-bounds frame length ends the server
/// (the stream cannot be resynchronised; the supervisor starts another);
/// any other bad request is answered with [`Failure::BadRequest`].
pub fn serve(
    mut conn: UnixStream,
    load_config: impl Fn() -> Result<Config, ConfigError>,
) -> io::Result<()> {
    conn.set_write_timeout(Some(WRITE_TIMEOUT))?;
    // Before any lane thread starts: they inherit it.
    if let Err(e) = tlsgate_sys::privileges::set_thread_nice(NICE) {
        tracing::debug!("key server: keeps its nice value: {e}");
    }
    let mut keys = Keys {
        by_id: Arc::default(),
        self_signed: SelfSignedCache::default(),
        grace: Duration::ZERO,
    };
    let lanes = Arc::new(AtomicUsize::new(0));
    let mut input = Deframer::new(proto::MAX_REQUEST);
    let mut out = Vec::with_capacity(OUT_KEPT);
    // Sockets that came with the bytes read, each for a `lane` request.
    let mut fds: Vec<OwnedFd> = Vec::new();
    loop {
        // One read takes whatever has arrived: several workers' requests.
        let mut reader = FdReader {
            sock: &conn,
            fds: &mut fds,
        };
        if input.read_from(&mut reader)? == 0 {
            return Ok(());
        }
        // What answers to the last wake-up's loads held goes back.
        if out.capacity() > OUT_KEPT {
            out = Vec::with_capacity(OUT_KEPT);
        }
        out.clear();
        // One load per wake-up: each reads every key, and its answer may
        // be megabytes; the network side never sends two at once.
        let mut loaded = false;
        loop {
            let frame = match input.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    conn.write_all(&out)?;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            };
            let (id, resp) = match proto::decode_request(frame) {
                Ok((
                    id,
                    Request::Sign {
                        key_id,
                        scheme,
                        message,
                    },
                )) => (id, keys.sign(key_id, scheme, &message)),
                Ok((id, Request::Load { keep })) if !loaded => {
                    loaded = true;
                    (id, keys.load(load_config(), &keep))
                }
                Ok((id, Request::Load { .. })) => (id, Response::Failed(Failure::BadRequest)),
                Ok((id, Request::Retain { keep })) => (id, keys.retain(&keep)),
                Ok((id, Request::Lane)) => {
                    // The socket came with this frame's first byte: the
                    // oldest not yet taken.
                    let fd = (!fds.is_empty()).then(|| fds.remove(0));
                    match fd {
                        Some(fd) if tlsgate_sys::ipc::is_unix_packet(&fd) => {
                            open_lane(LaneEnds::Socket(UnixStream::from(fd)), &keys.by_id, &lanes);
                            continue;
                        }
                        _ => (id, Response::Failed(Failure::BadRequest)),
                    }
                }
                Ok((id, Request::PipeLane)) => {
                    // Its two pipe ends, in order, are the oldest not yet
                    // taken; anything but a read end and a write end is
                    // refused (and closed).
                    let ends: Vec<OwnedFd> = fds.drain(..fds.len().min(2)).collect();
                    match LaneEnds::pipes(ends) {
                        Some(lane) => {
                            open_lane(lane, &keys.by_id, &lanes);
                            continue;
                        }
                        None => (id, Response::Failed(Failure::BadRequest)),
                    }
                }
                Err(e) => {
                    tracing::warn!("key server: bad request: {e}");
                    let id = proto::request_id(frame).unwrap_or(0);
                    (id, Response::Failed(Failure::BadRequest))
                }
            };
            proto::encode_response(&mut out, id, &resp);
        }
        // Every answer of this wake-up in one write.
        if !out.is_empty() {
            conn.write_all(&out)?;
        }
        // Sockets without a `lane` request are not kept.
        fds.truncate(tlsgate_sys::ipc::MAX_FDS_PER_READ);
    }
}

/// Reads for the deframer that keep the sockets sent along.
struct FdReader<'a> {
    sock: &'a UnixStream,
    fds: &'a mut Vec<OwnedFd>,
}

impl Read for FdReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        tlsgate_sys::ipc::recv_with_fds(self.sock, buf, self.fds)
    }
}

/// What a lane is read from and written to.
enum LaneEnds {
    /// A sequenced-packet socket, both ways.
    Socket(UnixStream),
    /// Requests from one pipe, answers into another.
    Pipes {
        requests: std::fs::File,
        answers: tlsgate_sys::ipc::TimedPipeWriter,
    },
}

impl LaneEnds {
    /// `ends` as a pipe lane: a read end then a write end, else `None`.
    fn pipes(ends: Vec<OwnedFd>) -> Option<LaneEnds> {
        use tlsgate_sys::ipc::{is_pipe_end, PipeEnd, TimedPipeWriter};
        let [requests, answers]: [OwnedFd; 2] = ends.try_into().ok()?;
        if !is_pipe_end(&requests, PipeEnd::Read) || !is_pipe_end(&answers, PipeEnd::Write) {
            return None;
        }
        let answers = TimedPipeWriter::new(answers, WRITE_TIMEOUT).ok()?;
        Some(LaneEnds::Pipes {
            requests: std::fs::File::from(requests),
            answers,
        })
    }

    /// Serves the lane until it closes (see [`serve_lane`]).
    fn serve(self, keys: &KeyMap) -> io::Result<()> {
        match self {
            LaneEnds::Socket(sock) => {
                sock.set_write_timeout(Some(WRITE_TIMEOUT))?;
                serve_lane(&sock, &sock, keys)
            }
            LaneEnds::Pipes { requests, answers } => serve_lane(requests, answers, keys),
        }
    }
}

/// Serves `lane` on a thread of its own, if under [`MAX_LANES`];
/// dropping it otherwise closes it (its worker then uses the shared
/// connection).
fn open_lane(lane: LaneEnds, keys: &KeyMap, lanes: &Arc<AtomicUsize>) {
    if lanes.fetch_add(1, Ordering::SeqCst) >= MAX_LANES {
        lanes.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("key server: more than {MAX_LANES} lanes; one refused");
        return;
    }
    let (keys, count) = (keys.clone(), lanes.clone());
    let spawned = std::thread::Builder::new()
        .name("key-lane".into())
        .spawn(move || {
            if let Err(e) = lane.serve(&keys) {
                tracing::debug!("key server: lane closed: {e}");
            }
            count.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        lanes.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("key server: cannot start a lane thread: {e}");
    }
}

/// What a lane answers `req`: a signature, or a refusal for anything else.
fn lane_answer(keys: &KeyMap, req: &Request) -> Response {
    match req {
        Request::Sign {
            key_id,
            scheme,
            message,
        } => sign_with(keys, *key_id, *scheme, message),
        _ => Response::Failed(Failure::BadRequest),
    }
}

/// Answers the signature requests of one lane until it closes. A lane
/// only signs: anything else is refused (`load` belongs to the shared
/// connection), and an out-of-bounds length ends the lane. Each read's
/// answers go in one write, bounded by [`WRITE_TIMEOUT`].
fn serve_lane(mut requests: impl Read, mut answers: impl Write, keys: &KeyMap) -> io::Result<()> {
    let mut input = Deframer::new(proto::MAX_REQUEST);
    let mut out = Vec::with_capacity(1024);
    loop {
        if input.read_from(&mut requests)? == 0 {
            return Ok(());
        }
        out.clear();
        while let Some(frame) = input
            .next_frame()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
        {
            let (id, resp) = match proto::decode_request(frame) {
                Ok((id, req)) => (id, lane_answer(keys, &req)),
                Err(_) => (
                    proto::request_id(frame).unwrap_or(0),
                    Response::Failed(Failure::BadRequest),
                ),
            };
            proto::encode_response(&mut out, id, &resp);
        }
        if !out.is_empty() {
            answers.write_all(&out)?;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::path::Path;

    fn answers(sock: &mut impl Read, n: usize) -> Vec<(u64, Response)> {
        let mut d = Deframer::new(proto::MAX_RESPONSE);
        let mut out = Vec::new();
        while out.len() < n {
            assert!(d.read_from(sock).unwrap() > 0, "EOF after {out:?}");
            while let Some(f) = d.next_frame().unwrap() {
                out.push(proto::decode_response(f).unwrap());
            }
        }
        out
    }

    /// Over a lane, `sign` (as request `id`) is signed and a load (`id + 1`) refused.
    fn lane_signs_and_refuses_a_load(
        to: &mut impl Write,
        from: &mut impl Read,
        sign: &Request,
        id: u64,
    ) {
        let mut buf = Vec::new();
        proto::encode_request(&mut buf, id, sign);
        proto::encode_request(&mut buf, id + 1, &Request::Load { keep: vec![] });
        to.write_all(&buf).unwrap();
        let got = answers(from, 2);
        assert_eq!(got[0].0, id);
        assert!(matches!(&got[0].1, Response::Signature(s) if s.len() > 60));
        assert_eq!(got[1], (id + 1, Response::Failed(Failure::BadRequest)));
    }

    /// What a TLS 1.3 server signs, over a SHA-256 transcript hash.
    fn tls13_input() -> Vec<u8> {
        let mut m = vec![0x20; 64];
        m.extend_from_slice(b"TLS 1.3, server CertificateVerify\0");
        m.extend_from_slice(&[7; 32]);
        m
    }

    /// A TLS 1.2 ServerKeyExchange's signed part for `group`.
    fn tls12_input(group: u16, point: usize) -> Vec<u8> {
        let mut m = vec![1; 64];
        m.push(3);
        m.extend_from_slice(&group.to_be_bytes());
        m.push(point as u8);
        m.extend(std::iter::repeat_n(4, point));
        m
    }

    #[test]
    fn only_what_a_tls_server_signs_is_signed() {
        assert!(is_handshake_signature_input(&tls13_input()));
        let mut sha384 = tls13_input();
        sha384.extend_from_slice(&[7; 16]);
        assert!(is_handshake_signature_input(&sha384));
        for (group, point) in [(0x1d, 32), (0x17, 65), (0x18, 97)] {
            assert!(is_handshake_signature_input(&tls12_input(group, point)));
            let mut longer = tls12_input(group, point);
            longer.push(0);
            assert!(!is_handshake_signature_input(&longer));
        }
        let mut client = tls13_input();
        client[64..70].copy_from_slice(b"TLS 1.");
        client[73..79].copy_from_slice(b"client");
        for refused in [
            b"hello".to_vec(),
            Vec::new(),
            client,
            tls13_input()[..129].to_vec(),
            tls12_input(0x1d, 65),
            tls12_input(0x99, 32),
            vec![0x20; 200],
        ] {
            assert!(!is_handshake_signature_input(&refused), "{refused:?}");
        }
    }

    #[test]
    fn only_what_a_tls_client_signs_is_signed_with_a_client_key() {
        let mut tls13 = vec![0x20; 64];
        tls13.extend_from_slice(b"TLS 1.3, client CertificateVerify\0");
        tls13.extend_from_slice(&[9; 32]);
        assert!(is_client_signature_input(&tls13));
        assert!(!is_handshake_signature_input(&tls13));
        // TLS 1.2: a ClientHello of 5 bytes, then a ServerHello.
        let tls12 = [&[1, 0, 0, 5, 3, 3, 0, 0, 0][..], &[2, 0, 0, 1, 0]].concat();
        assert!(is_client_signature_input(&tls12));
        for refused in [
            tls13_input(),
            tls12_input(0x1d, 32),
            b"hello".to_vec(),
            [&[1, 0, 0, 5, 3, 3, 0, 0, 0][..], &[11, 0]].concat(),
        ] {
            assert!(!is_client_signature_input(&refused), "{refused:?}");
        }
        // Each key signs for its role only.
        let key = rustls::crypto::aws_lc_rs::sign::any_supported_type(
            &rustls::pki_types::PrivateKeyDer::Pkcs8(
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                    .unwrap()
                    .serialize_der()
                    .into(),
            ),
        )
        .unwrap();
        let scheme = rustls::SignatureScheme::ECDSA_NISTP256_SHA256;
        for (server, client) in [(true, false), (false, true), (true, true)] {
            let map: KeyMap = Arc::default();
            map.write().unwrap().insert(
                1,
                Held {
                    key: key.clone(),
                    retired_until: None,
                    server,
                    client,
                },
            );
            let signs = |m: &[u8]| matches!(sign_with(&map, 1, scheme, m), Response::Signature(_));
            assert_eq!(signs(&tls13_input()), server);
            assert_eq!(signs(&tls13), client);
            assert_eq!(signs(&tls12), client);
        }
    }

    /// A key pair on disk as `NAME.pem` / `NAME.key` under `dir`.
    fn key_files(dir: &Path, name: &str) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec![format!("{name}.test")])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    /// A key a reload dropped signs for the grace (the old configuration's
    /// handshakes), then never again, however the network side asks.
    #[test]
    fn a_key_dropped_by_a_reload_stops_signing_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        key_files(dir.path(), "a");
        key_files(dir.path(), "b");
        let toml = dir.path().join("t.toml");
        let config = |names: &[&str]| {
            let mut t = "[server]\nkey_timeout = \"1s\"\n[limits]\nhandshake_timeout = \"1s\"\n[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = \"site\"\n".to_string();
            for n in names {
                t.push_str(&format!(
                    "[[listener.certificate]]\ncert = \"{n}.pem\"\nkey = \"{n}.key\"\n"
                ));
            }
            std::fs::write(&toml, t).unwrap();
        };
        config(&["a", "b"]);
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let file = toml.clone();
        std::thread::spawn(move || {
            serve(theirs, move || {
                tlsgate_config::load(Some(&file), &Default::default(), Path::new("/"))
            })
        });
        let mut ask = |req: Request| {
            let mut buf = Vec::new();
            proto::encode_request(&mut buf, 1, &req);
            ours.write_all(&buf).unwrap();
            answers(&mut ours, 1).remove(0).1
        };
        let Response::Loaded(l) = ask(Request::Load { keep: vec![] }) else {
            panic!("not loaded")
        };
        let (a, b) = (l.listeners[0][0].key.id, l.listeners[0][1].key.id);
        let sign = |key_id| Request::Sign {
            key_id,
            scheme: rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            message: tls13_input(),
        };
        // Anything but a handshake's input is refused, even with a good key.
        let hello = Request::Sign {
            key_id: a,
            scheme: rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            message: b"hello".to_vec(),
        };
        assert_eq!(ask(hello), Response::Failed(Failure::BadRequest));
        // The reload drops a; the running configuration still uses it.
        config(&["b"]);
        assert!(matches!(
            ask(Request::Load { keep: vec![a, b] }),
            Response::Loaded(_)
        ));
        assert!(matches!(ask(sign(a)), Response::Signature(_)));
        // The new configuration runs: a signs for the grace (2 s), then not.
        let t0 = Instant::now();
        assert_eq!(
            ask(Request::Retain { keep: vec![b] }),
            Response::Loaded(Loaded::default())
        );
        assert!(matches!(ask(sign(a)), Response::Signature(_)));
        std::thread::sleep(Duration::from_millis(2100).saturating_sub(t0.elapsed()));
        assert_eq!(ask(sign(a)), Response::Failed(Failure::UnknownKey));
        assert!(matches!(ask(sign(b)), Response::Signature(_)));
        // Asking to keep it again does not bring it back.
        assert!(matches!(
            ask(Request::Load { keep: vec![a, b] }),
            Response::Loaded(_)
        ));
        assert_eq!(ask(sign(a)), Response::Failed(Failure::UnknownKey));
        // Unless the configuration names it again.
        config(&["a", "b"]);
        assert!(matches!(
            ask(Request::Load { keep: vec![b] }),
            Response::Loaded(_)
        ));
        assert!(matches!(ask(sign(a)), Response::Signature(_)));
    }

    /// Loads in one read: only the first is answered with the keys.
    #[test]
    fn one_load_per_wake_up() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        key_files(dir.path(), "a");
        let toml = dir.path().join("t.toml");
        std::fs::write(
            &toml,
            "[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"a.pem\"\nkey = \"a.key\"\n",
        )
        .unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            serve(theirs, move || {
                tlsgate_config::load(Some(&toml), &Default::default(), Path::new("/"))
            })
        });
        let mut buf = Vec::new();
        for id in 1..=50 {
            proto::encode_request(&mut buf, id, &Request::Load { keep: vec![] });
        }
        ours.write_all(&buf).unwrap();
        let got = answers(&mut ours, 50);
        assert!(matches!(got[0], (1, Response::Loaded(_))), "{:?}", got[0]);
        let refused = got
            .iter()
            .filter(|(_, r)| *r == Response::Failed(Failure::BadRequest))
            .count();
        // The first of each read is loaded; a write of 50 arrives in one
        // read or a few.
        assert!(refused >= 45, "{refused} refused");
    }

    #[test]
    fn signs_in_batches_refuses_garbage_and_stops_on_a_bad_length() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("site")).unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), key.serialize_pem()).unwrap();
        let toml = dir.path().join("t.toml");
        std::fs::write(
            &toml,
            "[[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = \"site\"\n[[listener.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n",
        )
        .unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            serve(theirs, move || {
                tlsgate_config::load(Some(&toml), &Default::default(), Path::new("/"))
            })
        });

        // Three requests in one write: load, garbage behind a valid length, unknown key.
        let mut buf = Vec::new();
        proto::encode_request(&mut buf, 1, &Request::Load { keep: vec![] });
        buf.extend_from_slice(&[0, 0, 0, 12, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
        let sign = |key_id| Request::Sign {
            key_id,
            scheme: rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            message: tls13_input(),
        };
        proto::encode_request(&mut buf, 3, &sign(7));
        ours.write_all(&buf).unwrap();
        let got = answers(&mut ours, 3);
        let Response::Loaded(l) = &got[0].1 else {
            panic!("{got:?}")
        };
        assert_eq!(got[0].0, 1);
        assert_eq!(l.listeners[0][0].names, vec!["a.test".to_string()]);
        assert_eq!(l.listeners[0][0].chain[0], cert.der().to_vec());
        assert_eq!(got[1], (0, Response::Failed(Failure::BadRequest)));
        assert_eq!(got[2], (3, Response::Failed(Failure::UnknownKey)));

        let id = l.listeners[0][0].key.id;
        let mut buf = Vec::new();
        for i in 10..20 {
            proto::encode_request(&mut buf, i, &sign(id));
        }
        ours.write_all(&buf).unwrap();
        let got = answers(&mut ours, 10);
        for (i, (rid, r)) in got.iter().enumerate() {
            assert_eq!(*rid, 10 + i as u64);
            assert!(matches!(r, Response::Signature(s) if s.len() > 60), "{r:?}");
        }

        // A lane: its socket rides with the request; it signs, refuses a
        // load, and a request without a socket is refused on the connection.
        // A stream socket is refused as a lane (see `packet_pair`).
        let (_stream, theirs) = UnixStream::pair().unwrap();
        let mut frame = Vec::new();
        proto::encode_request(&mut frame, 29, &Request::Lane);
        tlsgate_sys::ipc::send_with_fd(&ours, &frame, &theirs).unwrap();
        assert_eq!(
            answers(&mut ours, 1),
            vec![(29, Response::Failed(Failure::BadRequest))]
        );
        let (mut lane, theirs) = tlsgate_sys::ipc::packet_pair().unwrap();
        let mut frame = Vec::new();
        proto::encode_request(&mut frame, 0, &Request::Lane);
        tlsgate_sys::ipc::send_with_fd(&ours, &frame, &theirs).unwrap();
        drop(theirs);
        lane_signs_and_refuses_a_load(&mut lane.try_clone().unwrap(), &mut lane, &sign(id), 30);
        let mut buf = Vec::new();
        proto::encode_request(&mut buf, 32, &Request::Lane);
        ours.write_all(&buf).unwrap();
        assert_eq!(
            answers(&mut ours, 1),
            vec![(32, Response::Failed(Failure::BadRequest))]
        );
        // A lane with a bad length is closed; the connection still serves.
        lane.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let mut rest = Vec::new();
        lane.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        let mut buf = Vec::new();
        proto::encode_request(&mut buf, 33, &sign(id));
        ours.write_all(&buf).unwrap();
        assert!(matches!(
            &answers(&mut ours, 1)[0],
            (33, Response::Signature(_))
        ));

        // A pipe lane: requests through one pipe, answers through the
        // other. Ends the wrong way round, or one alone, are refused.
        use std::os::fd::AsFd;
        let (requests_read, requests_write) = tlsgate_sys::ipc::pipe().unwrap();
        let (answers_read, answers_write) = tlsgate_sys::ipc::pipe().unwrap();
        let pipe_lane = |id| {
            let mut frame = Vec::new();
            proto::encode_request(&mut frame, id, &Request::PipeLane);
            frame
        };
        tlsgate_sys::ipc::send_with_fds(
            &ours,
            &pipe_lane(34),
            &[requests_write.as_fd(), answers_read.as_fd()],
        )
        .unwrap();
        assert_eq!(
            answers(&mut ours, 1),
            vec![(34, Response::Failed(Failure::BadRequest))]
        );
        tlsgate_sys::ipc::send_with_fds(&ours, &pipe_lane(35), &[requests_read.as_fd()]).unwrap();
        assert_eq!(
            answers(&mut ours, 1),
            vec![(35, Response::Failed(Failure::BadRequest))]
        );
        tlsgate_sys::ipc::send_with_fds(
            &ours,
            &pipe_lane(0),
            &[requests_read.as_fd(), answers_write.as_fd()],
        )
        .unwrap();
        drop((requests_read, answers_write));
        let (mut to_lane, mut from_lane) = (
            std::fs::File::from(requests_write),
            std::fs::File::from(answers_read),
        );
        lane_signs_and_refuses_a_load(&mut to_lane, &mut from_lane, &sign(id), 36);
        // The worker's end closes: the lane ends, and its answers with it.
        drop(to_lane);
        let mut rest = Vec::new();
        from_lane.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());

        // A length over the bound: the stream is untrustworthy, the server ends.
        ours.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let e = server.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let mut rest = Vec::new();
        let _ = ours.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }
}
