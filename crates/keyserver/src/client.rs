//! The network-facing side: starts the key supervisor, receives a
//! connection to each key server it starts, and forwards signatures.
//!
//! Requests carry ids, so the worker threads' signatures are in flight
//! together on one connection: a request is written under a short lock,
//! then its thread waits (with a timeout) for the reader thread to hand it
//! the answer with its id. When the key server dies, its connection reads
//! EOF, every waiting request fails at once, and new ones fail without
//! waiting until the supervisor's next key server is connected and loaded.
//!
//! Signatures take a shorter way: each thread that signs opens its own
//! lane to the key server (a sequenced-packet socket pair, one end sent
//! over the shared connection; see `tlsgate_sys::ipc::packet_pair` for why
//! not a stream), then writes its request and reads the answer itself. That
//! saves the reader thread's wake-up and the hand-over per signature; a
//! thread whose lane cannot be had signs over the shared connection.
//!
//! A worker's handshakes do not block on their lane: rustls' signing call
//! is suspended (`tlsgate_tls::run_signing`) and the handshake awaits its
//! answer on the thread's [`AsyncLane`], whose requests of one runtime turn
//! leave in one packet and come back in one. That lane is a pair of pipes,
//! cheaper per message than a socket (see `tlsgate_sys::ipc::pipe`). The
//! blocking lane serves the rest (a signature outside a suspendable call,
//! no runtime).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use rustls_pki_types::CertificateDer;
use tlsgate_tls::{KeyBackend, KeyUnavailable, LoadedCert, Material, RemoteKey, SignFuture};
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, Notify};

use crate::proto::{self, Deframer, LoadError, Loaded, Request, Response};

/// How long a `load` (reading every key file) may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the supervisor may take to connect its first key server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Signatures waiting at once before new ones are refused.
const MAX_PENDING: usize = 4096;

/// Why the key process could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The configuration or a key is wrong (found by the key process).
    #[error("{}: key `{}`: {}", .0.origin, .0.key, .0.problem)]
    Config(LoadError),
    /// The key process could not be started or talked to.
    #[error("key process: {0}")]
    Io(#[from] io::Error),
    /// The key process broke the protocol.
    #[error("key process: {0}")]
    Protocol(#[from] proto::ProtoError),
    /// It answered something other than what was asked.
    #[error("key process: unexpected answer to {0}")]
    Unexpected(&'static str),
    /// It did not answer in time or went away.
    #[error("key process: {0}")]
    Unavailable(#[from] KeyUnavailable),
}

/// What the network side wants to hear about the key process.
pub trait Events: Send + Sync {
    /// A signature could not be had.
    fn sign_failed(&self, why: KeyUnavailable);
    /// A key server is connected (`restart`: not the first) or lost; also
    /// up (not a restart) when a hung one answers again.
    fn key_server(&self, up: bool, restart: bool);
    /// The key server answers no signature: it is taken as hung (and
    /// killed, to be restarted), until it answers or a new one connects.
    fn key_hung(&self);
    /// A restarted key server lacks keys the running configuration uses
    /// (self-signed certificate made anew, key files changed): reload.
    fn keys_changed(&self);
}

type Pending = HashMap<u64, SyncSender<Response>>;

/// One connection to one key server.
struct Connection {
    writer: Mutex<UnixStream>,
    pending: Mutex<Pending>,
    alive: AtomicBool,
    /// Which key server of the supervisor's this is (1: the first).
    generation: u64,
    /// The read half before the reader thread takes it: requests made
    /// until then read their answer themselves (at start-up, while the
    /// process must stay single-threaded until privileges are dropped).
    direct: Mutex<Option<(UnixStream, Deframer)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take signing down with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    fn new(sock: UnixStream, timeout: Duration, generation: u64) -> io::Result<Arc<Self>> {
        sock.set_write_timeout(Some(timeout))?;
        let reader = sock.try_clone()?;
        Ok(Arc::new(Self {
            writer: Mutex::new(sock),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            generation,
            direct: Mutex::new(Some((reader, Deframer::new(proto::MAX_RESPONSE)))),
        }))
    }

    /// Hands the read half to a thread that routes answers to their
    /// waiters; `closed` runs when the key server's side closes.
    fn start_reader(
        self: &Arc<Self>,
        closed: impl FnOnce(&Arc<Connection>) + Send + 'static,
    ) -> io::Result<()> {
        let Some((mut sock, mut frames)) = lock(&self.direct).take() else {
            return Ok(());
        };
        sock.set_read_timeout(None)?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("key-reader".into())
            .spawn(move || {
                if let Err(e) = me.read_loop(&mut sock, &mut frames) {
                    tracing::error!("dropping the key server connection: {e}");
                }
                // Close our side too: a key server we stopped listening to
                // (bad answer) then reads EOF, exits, and is replaced.
                me.close();
                // Dropping the senders wakes every waiter with "disconnected".
                lock(&me.pending).clear();
                closed(&me);
            })?;
        Ok(())
    }

    fn read_loop(&self, sock: &mut UnixStream, frames: &mut Deframer) -> Result<(), KeyError> {
        loop {
            if frames.read_from(sock)? == 0 {
                return Ok(());
            }
            while let Some(f) = frames.next_frame()? {
                let (id, resp) = proto::decode_response(f)?;
                // An answer nobody waits for (timed out) is dropped.
                if let Some(tx) = lock(&self.pending).remove(&id) {
                    let _ = tx.try_send(resp);
                }
            }
        }
    }

    fn send(&self, id: u64, req: &Request) -> io::Result<()> {
        let mut buf = Vec::with_capacity(64);
        proto::encode_request(&mut buf, id, req);
        let r = lock(&self.writer).write_all(&buf);
        if r.is_err() {
            self.alive.store(false, Ordering::SeqCst);
        }
        r
    }

    /// Sends `req` and waits up to `timeout` for its answer.
    fn call(&self, id: u64, req: &Request, timeout: Duration) -> Result<Response, KeyUnavailable> {
        if !self.alive.load(Ordering::SeqCst) {
            return Err(KeyUnavailable::Down);
        }
        {
            let mut direct = lock(&self.direct);
            if let Some((sock, frames)) = direct.as_mut() {
                self.send(id, req).map_err(|_| KeyUnavailable::Down)?;
                return read_direct(sock, frames, id, timeout);
            }
        }
        let (tx, rx) = sync_channel(1);
        {
            let mut pending = lock(&self.pending);
            if pending.len() >= MAX_PENDING {
                return Err(KeyUnavailable::Busy);
            }
            pending.insert(id, tx);
        }
        // The reader may have died between the check above and the insert.
        if !self.alive.load(Ordering::SeqCst) || self.send(id, req).is_err() {
            lock(&self.pending).remove(&id);
            return Err(KeyUnavailable::Down);
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.pending).remove(&id);
                Err(KeyUnavailable::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(KeyUnavailable::Down),
        }
    }

    fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }

    /// Opens a lane: a socket pair whose other end goes to the key server
    /// with a `lane` request. Only once the reader thread runs (at start-up
    /// the process must stay single-threaded, and the key server is
    /// then asked only to load).
    fn open_lane(self: &Arc<Self>, timeout: Duration) -> io::Result<Lane> {
        let ours = self.lane_socket()?;
        ours.set_read_timeout(Some(timeout))?;
        ours.set_write_timeout(Some(timeout))?;
        Ok(Lane {
            conn: Arc::downgrade(self),
            packet: tlsgate_sys::ipc::packet_limit(&ours, proto::MAX_PACKET),
            sock: ours,
            frames: Deframer::new(proto::MAX_RESPONSE),
            out: Vec::with_capacity(1024),
        })
    }
}

impl Connection {
    /// Sends `req` (a lane's opening) with `theirs`, the key server's
    /// ends of the lane, over the shared connection.
    fn hand_over(&self, req: &Request, theirs: &[BorrowedFd<'_>]) -> io::Result<()> {
        if lock(&self.direct).is_some() || !self.alive.load(Ordering::SeqCst) {
            return Err(io::ErrorKind::NotConnected.into());
        }
        let mut frame = Vec::with_capacity(16);
        proto::encode_request(&mut frame, 0, req);
        tlsgate_sys::ipc::send_with_fds(&lock(&self.writer), &frame, theirs)
    }

    /// Our end of a new lane: a socket pair whose other end goes to the
    /// key server with a `lane` request.
    fn lane_socket(&self) -> io::Result<UnixStream> {
        let (ours, theirs) = tlsgate_sys::ipc::packet_pair()?;
        self.hand_over(&Request::Lane, &[theirs.as_fd()])?;
        Ok(ours)
    }

    /// Our ends of a new pipe lane, `(requests' write end, answers' read
    /// end)`; the other two go to the key server with a `pipe_lane`
    /// request and are closed here, so that each side sees the other's
    /// exit as the end of its pipe.
    fn lane_pipes(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        let (their_requests, our_requests) = tlsgate_sys::ipc::pipe()?;
        let (our_answers, their_answers) = tlsgate_sys::ipc::pipe()?;
        let theirs = [their_requests.as_fd(), their_answers.as_fd()];
        self.hand_over(&Request::PipeLane, &theirs)?;
        Ok((our_requests, our_answers))
    }
}

/// A thread's own socket to the key server (see the module's text).
struct Lane {
    /// The connection it was opened over: a lane of an older key server
    /// is not used after a restart.
    conn: Weak<Connection>,
    sock: UnixStream,
    /// Largest packet written: a longer request goes in several.
    packet: usize,
    frames: Deframer,
    out: Vec<u8>,
}

impl Lane {
    /// Sends `req` and reads its answer, bounded by the socket timeouts.
    /// Any failure leaves the lane unusable (an answer may still come).
    fn call(&mut self, id: u64, req: &Request) -> Result<Response, KeyUnavailable> {
        if self.out.capacity() > proto::MAX_PACKET {
            // What a large request (a TLS 1.2 client's transcript) took.
            self.out = Vec::with_capacity(1024);
        }
        self.out.clear();
        proto::encode_request(&mut self.out, id, req);
        // Each write is one packet (a sequenced-packet socket sends it
        // whole or not at all).
        for packet in self.out.chunks(self.packet) {
            self.sock
                .write_all(packet)
                .map_err(|_| KeyUnavailable::Down)?;
        }
        loop {
            let frame = self
                .frames
                .next_frame()
                .map_err(|_| KeyUnavailable::Refused)?;
            if let Some(f) = frame {
                // One request at a time on a lane: the next frame is its
                // answer (one to an earlier request that timed out cannot
                // come, a timeout drops the lane).
                return match proto::decode_response(f) {
                    Ok((got, resp)) if got == id => Ok(resp),
                    _ => Err(KeyUnavailable::Refused),
                };
            }
            read_more(&mut self.frames, &mut self.sock)?;
        }
    }
}

/// A thread's lane, if it has one.
enum LaneState {
    /// None yet (or the last one failed): the next signature opens one.
    Closed,
    Open(Lane),
    /// The key server of this connection closed a fresh lane (it serves
    /// [`crate::server::MAX_LANES`] already): this thread uses the shared
    /// connection until a restart.
    Refused(Weak<Connection>),
}

thread_local! {
    /// This thread's lane, opened at its first signature.
    static LANE: RefCell<LaneState> = const { RefCell::new(LaneState::Closed) };
}

/// Reads answers on the calling thread until the one for `id`.
fn read_direct(
    sock: &mut UnixStream,
    frames: &mut Deframer,
    id: u64,
    timeout: Duration,
) -> Result<Response, KeyUnavailable> {
    let deadline = Instant::now() + timeout;
    loop {
        while let Some(f) = frames.next_frame().map_err(|_| KeyUnavailable::Refused)? {
            match proto::decode_response(f) {
                Ok((got, resp)) if got == id => return Ok(resp),
                Ok(_) => {}
                Err(_) => return Err(KeyUnavailable::Refused),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(KeyUnavailable::Timeout);
        }
        let _ = sock.set_read_timeout(Some(left));
        read_more(frames, sock)?;
    }
}

/// Reads what has come of an answer; EOF and errors say why it cannot.
fn read_more(frames: &mut Deframer, sock: &mut UnixStream) -> Result<(), KeyUnavailable> {
    match frames.read_from(sock) {
        Ok(0) => Err(KeyUnavailable::Down),
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(KeyUnavailable::Timeout)
        }
        Err(_) => Err(KeyUnavailable::Down),
    }
}

/// The network side's handle on the key process.
pub struct KeyClient {
    inner: Arc<Inner>,
}

struct Inner {
    current: Mutex<Option<Arc<Connection>>>,
    next_id: AtomicU64,
    timeout: Duration,
    events: OnceLock<Box<dyn Events>>,
    /// Keys of the running configuration, checked after a restart.
    active: Mutex<Vec<u64>>,
    control: Mutex<Option<UnixStream>>,
    supervisor: Mutex<Option<Child>>,
    /// Set when tlsgate itself closes the key process (an orderly stop):
    /// its going away is then expected, not an error.
    closing: AtomicBool,
    /// Signatures that time out: warnings, and finding a hung key server.
    watch: Watch,
}

/// At most one warning about timed-out signatures per this long.
const TIMEOUT_WARN_EVERY: Duration = Duration::from_secs(10);
/// Consecutive timeouts, with no answer between, before the key server is
/// taken as hung...
const HUNG_AFTER_TIMEOUTS: u32 = 3;
/// ...and this many `key_timeout`s after the first of them timed out
/// (so no answer for three `key_timeout`s since it was asked): a burst of
/// timeouts at one moment (a slow key, a busy machine) is not a hang.
const HUNG_AFTER_TIMEOUT_SPANS: u32 = 2;

/// What the signatures that time out say about the key server.
#[derive(Default)]
struct Watch {
    /// A timeout came since the last answer: checked (one load) by every
    /// answer, so that the usual path takes no lock.
    timing_out: AtomicBool,
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    /// Timeouts not yet in a warning.
    unlogged: u64,
    last_warning: Option<Instant>,
    /// Consecutive timeouts with no answer between, and when the first of
    /// them timed out.
    streak: u32,
    streak_from: Option<Instant>,
    /// Taken as hung; cleared by an answer or a new key server.
    hung: bool,
}

impl Watch {
    /// A new key server: nothing it did timed out yet.
    fn reset(&self) {
        let mut s = lock(&self.state);
        s.streak = 0;
        s.streak_from = None;
        s.hung = false;
        self.timing_out.store(false, Ordering::Relaxed);
    }

    /// A signature was answered; `true` when the key server had been taken
    /// as hung.
    fn answered(&self) -> bool {
        if !self.timing_out.load(Ordering::Relaxed) {
            return false;
        }
        let mut s = lock(&self.state);
        self.timing_out.store(false, Ordering::Relaxed);
        s.streak = 0;
        s.streak_from = None;
        std::mem::take(&mut s.hung)
    }

    /// A signature timed out after `timeout`: warns (rate-limited), and
    /// says whether the key server is now to be taken as hung.
    fn timed_out(&self, timeout: Duration) -> bool {
        let now = Instant::now();
        let mut s = lock(&self.state);
        self.timing_out.store(true, Ordering::Relaxed);
        s.unlogged += 1;
        if s.last_warning
            .is_none_or(|t| now.duration_since(t) >= TIMEOUT_WARN_EVERY)
        {
            tracing::warn!(
                "{} signature(s) timed out since the last warning (key_timeout {timeout:?}): \
                 their handshakes failed; the key server is slow, overloaded or hung: \
                 check the `tlsgate key-server` process (running, not stopped, its CPU) \
                 and tlsgate_key_failures_total",
                s.unlogged
            );
            s.unlogged = 0;
            s.last_warning = Some(now);
        }
        s.streak = s.streak.saturating_add(1);
        let from = *s.streak_from.get_or_insert(now);
        let hung = !s.hung
            && s.streak >= HUNG_AFTER_TIMEOUTS
            && now.duration_since(from) >= timeout * HUNG_AFTER_TIMEOUT_SPANS;
        if hung {
            s.hung = true;
            // A fresh count for the next key server, should it hang too.
            s.streak = 0;
            s.streak_from = None;
        }
        hung
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyClient").finish_non_exhaustive()
    }
}

impl KeyClient {
    /// Starts the key supervisor (`/proc/self/exe key-supervisor`) with the
    /// arguments that make its key servers load the same configuration,
    /// and waits for its first key server. No thread is started: call
    /// [`KeyClient::start`] once privileges are dropped.
    pub fn spawn(worker_args: &[OsString], timeout: Duration) -> Result<KeyClient, KeyError> {
        let (ours, theirs) = tlsgate_sys::ipc::socket_pair()?;
        let child = Command::new("/proc/self/exe")
            .arg0("tlsgate")
            .arg("key-supervisor")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--")
            .args(worker_args)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            // Its own process group: a Ctrl-C for the server must not kill
            // the keys it still needs while it drains.
            .process_group(0)
            .spawn()?;
        let inner = Arc::new(Inner {
            current: Mutex::new(None),
            next_id: AtomicU64::new(1),
            timeout,
            events: OnceLock::new(),
            active: Mutex::new(Vec::new()),
            control: Mutex::new(None),
            supervisor: Mutex::new(Some(child)),
            closing: AtomicBool::new(false),
            watch: Watch::default(),
        });
        ours.set_read_timeout(Some(CONNECT_TIMEOUT))?;
        let first = tlsgate_sys::ipc::recv_fd(&ours)?
            .ok_or_else(|| io::Error::other("the key supervisor exited at start"))?;
        ours.set_read_timeout(None)?;
        *lock(&inner.control) = Some(ours);
        *lock(&inner.current) = Some(Connection::new(UnixStream::from(first), timeout, 1)?);
        Ok(KeyClient { inner })
    }

    /// Asks the key server to load the configuration's keys (keeping
    /// `keep`), and returns the certificates per listener, each with a
    /// [`RemoteKey`] that signs through this client, and the public files
    /// and upstream client certificates (their keys remote too).
    pub fn load(&self, keep: &[u64]) -> Result<(Vec<Vec<LoadedCert>>, Material), KeyError> {
        let conn = lock(&self.inner.current)
            .clone()
            .ok_or(KeyUnavailable::Down)?;
        let Loaded {
            listeners,
            files,
            upstreams,
        } = self.inner.load_on(&conn, keep)?;
        let backend: Arc<dyn KeyBackend> = self.inner.clone();
        let material = Material {
            files: files
                .into_iter()
                .map(|(p, b)| (p.into(), Arc::new(b)))
                .collect(),
            upstream_clients: upstreams
                .into_iter()
                .map(|u| {
                    u.map(|c| {
                        Arc::new(CertifiedKey::new(
                            c.chain.into_iter().map(CertificateDer::from).collect(),
                            Arc::new(RemoteKey::new(c.key, backend.clone())),
                        ))
                    })
                })
                .collect(),
        };
        let certs = listeners
            .into_iter()
            .map(|certs| {
                certs
                    .into_iter()
                    .map(|c| LoadedCert {
                        certified: Arc::new(CertifiedKey::new(
                            c.chain.into_iter().map(CertificateDer::from).collect(),
                            Arc::new(RemoteKey::new(c.key, backend.clone())),
                        )),
                        names: c.names,
                        default: c.default,
                    })
                    .collect()
            })
            .collect();
        Ok((certs, material))
    }

    /// Records the keys the running configuration uses, and tells the key
    /// server: any other it holds (one a reload dropped) stops signing
    /// once the handshakes begun under the old configuration may have
    /// ended.
    pub fn set_active(&self, ids: Vec<u64>) {
        let keep: Vec<u64> = ids.iter().take(proto::MAX_KEYS).copied().collect();
        *lock(&self.inner.active) = ids;
        let Some(conn) = lock(&self.inner.current).clone() else {
            return;
        };
        match conn.call(self.inner.id(), &Request::Retain { keep }, LOAD_TIMEOUT) {
            Ok(Response::Loaded(_)) => {}
            Ok(other) => tracing::warn!("the key server did not retire unused keys: {other:?}"),
            Err(e) => tracing::warn!("the key server did not retire unused keys: {e}"),
        }
    }

    /// Starts the threads: the reader of the current connection and the
    /// one that takes each restarted key server into use.
    pub fn start(&self, events: Box<dyn Events>) -> io::Result<()> {
        let _ = self.inner.events.set(events);
        if let Some(c) = lock(&self.inner.current).clone() {
            c.start_reader(self.inner.on_close())?;
        }
        let control = lock(&self.inner.control)
            .as_ref()
            .map(UnixStream::try_clone)
            .transpose()?;
        if let Some(control) = control {
            let inner = self.inner.clone();
            std::thread::Builder::new()
                .name("key-connector".into())
                .spawn(move || inner.connector(&control))?;
        }
        Ok(())
    }
}

impl Drop for KeyClient {
    fn drop(&mut self) {
        // Closing the sockets ends the key server (EOF) and then the
        // supervisor (its next hand-over fails). The supervisor is reaped
        // only when it could be killed (not after dropping privileges).
        self.inner.closing.store(true, Ordering::SeqCst);
        if let Some(c) = lock(&self.inner.current).take() {
            c.close();
        }
        if let Some(c) = lock(&self.inner.control).take() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(mut child) = lock(&self.inner.supervisor).take() {
            if child.kill().is_ok() {
                let _ = child.wait();
            }
        }
    }
}

impl Inner {
    /// Counts a signature's outcome: failures into the events; timeouts
    /// watched for a hung key server, which is then killed (by the
    /// supervisor: we run unprivileged) so that another one starts.
    fn note(&self, result: &Result<Vec<u8>, KeyUnavailable>) {
        match result {
            Ok(_) => {
                if self.watch.answered() {
                    tracing::info!("the key server answers again");
                    self.event(|e| e.key_server(true, false));
                }
                return;
            }
            Err(KeyUnavailable::Timeout) => {
                if self.watch.timed_out(self.timeout) {
                    let generation = lock(&self.current).as_ref().map(|c| c.generation);
                    tracing::error!(
                        "the key server answered no signature for {:?} ({} timed out in a row): \
                         taking it as hung; handshakes fail until it is replaced; asking the \
                         supervisor to kill it and start another",
                        self.timeout * (HUNG_AFTER_TIMEOUT_SPANS + 1),
                        HUNG_AFTER_TIMEOUTS
                    );
                    self.event(|e| e.key_hung());
                    if let Some(g) = generation {
                        self.ask_restart(g);
                    }
                }
            }
            Err(_) => {}
        }
        if let Err(why) = result {
            self.event(|e| e.sign_failed(*why));
        }
    }

    /// Asks the supervisor to kill key server number `generation` (it
    /// starts another after its backoff).
    fn ask_restart(&self, generation: u64) {
        let control = lock(&self.control);
        let sent = control
            .as_ref()
            .map(|mut c| c.write_all(&generation.to_be_bytes()));
        if let Some(Err(e)) = sent {
            tracing::error!("cannot ask the key supervisor for a restart: {e}");
        }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn load_on(&self, conn: &Connection, keep: &[u64]) -> Result<Loaded, KeyError> {
        let keep = keep.iter().take(proto::MAX_KEYS).copied().collect();
        match conn.call(self.id(), &Request::Load { keep }, LOAD_TIMEOUT)? {
            Response::Loaded(l) => Ok(l),
            Response::LoadFailed(e) => Err(KeyError::Config(e)),
            _ => Err(KeyError::Unexpected("load")),
        }
    }

    /// What a connection's reader does when the key server is gone.
    fn on_close(self: &Arc<Self>) -> impl FnOnce(&Arc<Connection>) + Send + 'static {
        let me = Arc::downgrade(self);
        move |conn| {
            let Some(me) = me.upgrade() else { return };
            let current = lock(&me.current)
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(c, conn));
            if current {
                tracing::warn!("lost the key server; handshakes fail until it is back");
                me.event(|e| e.key_server(false, false));
            }
        }
    }

    fn event(&self, f: impl FnOnce(&dyn Events)) {
        if let Some(e) = self.events.get() {
            f(e.as_ref());
        }
    }

    /// Takes each new key server into use, until the supervisor is gone.
    fn connector(self: &Arc<Self>, control: &UnixStream) {
        // The first key server came at spawn; the supervisor counts alike.
        let mut generation = 1;
        loop {
            let fd = match tlsgate_sys::ipc::recv_fd(control) {
                Ok(Some(fd)) => fd,
                Ok(None) | Err(_) => {
                    if self.closing.load(Ordering::SeqCst) {
                        tracing::debug!("the key supervisor stopped with tlsgate");
                        return;
                    }
                    tracing::error!(
                        "the key supervisor is gone: handshakes fail until tlsgate is restarted"
                    );
                    // Its control socket closes only when it exits: reap it.
                    if let Some(mut child) = lock(&self.supervisor).take() {
                        let _ = child.wait();
                    }
                    if let Some(c) = lock(&self.current).take() {
                        c.close();
                    }
                    self.event(|e| e.key_server(false, false));
                    return;
                }
            };
            generation += 1;
            if let Err(e) = self.adopt(UnixStream::from(fd), generation) {
                // A key server that could not load signs nothing (its
                // keys are loaded all or none): have it replaced, with the
                // supervisor's backoff, until the files on disk load
                // again, rather than failing every handshake until SIGHUP.
                tracing::error!(
                    "restarted key server unusable: {e}; handshakes fail until one loads, \
                     retrying with the supervisor's backoff"
                );
                self.ask_restart(generation);
            }
        }
    }

    fn adopt(self: &Arc<Self>, sock: UnixStream, generation: u64) -> Result<(), KeyError> {
        let conn = Connection::new(sock, self.timeout, generation)?;
        conn.start_reader(self.on_close())?;
        let active = lock(&self.active).clone();
        let loaded = match self.load_on(&conn, &active) {
            Ok(l) => l,
            Err(e) => {
                // Current, so that its exit is seen as a loss; key_up
                // stays 0 (it was lost before) until one loads.
                if let Some(old) = lock(&self.current).replace(conn) {
                    old.close();
                }
                return Err(e);
            }
        };
        let have: Vec<u64> = loaded
            .listeners
            .iter()
            .flatten()
            .map(|c| c.key.id)
            .chain(loaded.upstreams.iter().flatten().map(|c| c.key.id))
            .collect();
        let missing = active.iter().any(|id| !have.contains(id));
        if let Some(old) = lock(&self.current).replace(conn) {
            old.close();
        }
        self.watch.reset();
        tracing::info!("key server restarted and connected");
        self.event(|e| e.key_server(true, true));
        if missing {
            tracing::warn!(
                "the restarted key server has other keys than the running configuration; reloading"
            );
            self.event(|e| e.keys_changed());
        }
        Ok(())
    }
}

impl Inner {
    /// Asks on this thread's lane to `conn`, opening it first if needed;
    /// `None` when no lane can be had (then the shared connection serves).
    fn on_lane(
        &self,
        conn: &Arc<Connection>,
        req: &Request,
    ) -> Option<Result<Response, KeyUnavailable>> {
        let same = |w: &Weak<Connection>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(conn));
        LANE.try_with(|cell| {
            let mut slot = cell.try_borrow_mut().ok()?;
            let fresh = match &*slot {
                LaneState::Open(l) if same(&l.conn) => false,
                LaneState::Refused(w) if same(w) => return None,
                // None yet, or a lane to an older key server (closed with it).
                _ => {
                    *slot = LaneState::Open(conn.open_lane(self.timeout).ok()?);
                    true
                }
            };
            let LaneState::Open(lane) = &mut *slot else {
                return None;
            };
            let r = lane.call(self.id(), req);
            match r {
                Ok(resp) => Some(Ok(resp)),
                // Closed at once: refused by the key server. The shared
                // connection serves this signature and the next ones.
                Err(KeyUnavailable::Down) if fresh => {
                    *slot = LaneState::Refused(Arc::downgrade(conn));
                    None
                }
                // Out of step (a late answer may come) or closed: the next
                // signature opens another.
                Err(e) => {
                    *slot = LaneState::Closed;
                    Some(Err(e))
                }
            }
        })
        .ok()
        .flatten()
    }
}

impl KeyBackend for Inner {
    fn sign(
        &self,
        key_id: u64,
        scheme: SignatureScheme,
        message: &[u8],
    ) -> Result<Vec<u8>, KeyUnavailable> {
        let result = (|| {
            if message.len() > proto::MAX_MESSAGE {
                tracing::warn!(
                    "not signing {} bytes: the key process signs at most {} (a TLS 1.2 client signs the whole handshake: the upstream's certificate messages are that large)",
                    message.len(),
                    proto::MAX_MESSAGE
                );
                return Err(KeyUnavailable::Refused);
            }
            let conn = lock(&self.current).clone().ok_or(KeyUnavailable::Down)?;
            if !conn.alive.load(Ordering::SeqCst) {
                return Err(KeyUnavailable::Down);
            }
            let req = Request::Sign {
                key_id,
                scheme,
                message: message.to_vec(),
            };
            let answer = match self.on_lane(&conn, &req) {
                Some(answer) => answer?,
                None => conn.call(self.id(), &req, self.timeout)?,
            };
            match answer {
                Response::Signature(s) => Ok(s),
                _ => Err(KeyUnavailable::Refused),
            }
        })();
        self.note(&result);
        result
    }

    fn sign_later(
        self: Arc<Self>,
        key_id: u64,
        scheme: SignatureScheme,
        message: Vec<u8>,
    ) -> SignFuture {
        Box::pin(async move {
            let lane = lock(&self.current)
                .clone()
                .filter(|c| c.alive.load(Ordering::SeqCst) && message.len() <= proto::MAX_MESSAGE)
                .and_then(|conn| self.async_lane(&conn));
            let Some(lane) = lane else {
                // No lane to wait on: the blocking way (which also says why
                // there is no connection, if there is none).
                return self.sign(key_id, scheme, &message);
            };
            let req = Request::Sign {
                key_id,
                scheme,
                message,
            };
            let result = match lane.call(self.id(), &req, self.timeout).await {
                Ok(Response::Signature(s)) => Ok(s),
                Ok(_) => Err(KeyUnavailable::Refused),
                Err(e) => Err(e),
            };
            self.note(&result);
            result
        })
    }
}

/// Signatures waiting on one asynchronous lane before new ones are refused.
const LANE_MAX_WAITING: usize = 1024;
/// Requests that end in one packet: their answers (an RSA-4096 signature
/// and its header, ~530 bytes each), which the key server sends in one
/// packet, must fit one 64 KiB read on our side.
const LANE_BATCH: usize = 32;
/// Bytes of requests queued on one asynchronous lane before new ones are
/// refused (`busy`): a few of the largest (TLS 1.2 client transcripts).
const LANE_MAX_QUEUED: usize = 8 * proto::MAX_MESSAGE;

/// A worker thread's lane for handshakes that wait without blocking it
/// (`tlsgate_tls::run_signing`). The requests made in one turn of the
/// thread's runtime leave together in one packet; the key server reads
/// them in one wake-up and answers them in one packet; a reader task hands
/// each answer to its handshake. At saturation that is a pair of context
/// switches per batch of signatures, not per signature.
struct AsyncLane {
    /// The connection it was opened over (see [`Lane::conn`]).
    conn: Weak<Connection>,
    /// The pipe the requests go into: each write of at most
    /// [`packet`](Self::packet) bytes goes in whole or not at all.
    requests: pipe::Sender,
    /// The pipe the answers come from, a stream of frames.
    answers: pipe::Receiver,
    /// Largest packet written: a longer request goes in several.
    packet: usize,
    queue: Mutex<LaneQueue>,
    /// Wakes the lane's sender: requests are queued.
    queued: Notify,
}

#[derive(Default)]
struct LaneQueue {
    /// Packets not yet sent, each of at most [`AsyncLane::packet`] bytes,
    /// with how many requests end in it (at most [`LANE_BATCH`]).
    packets: Vec<(Vec<u8>, usize)>,
    /// A sent packet's buffer, kept for the next.
    spare: Vec<u8>,
    /// Requests sent and not answered yet: at zero no answer can be on
    /// its way, so the reader waits for epoll instead of trying a read
    /// that would fail with `EAGAIN` (a packet read is short either way).
    in_flight: usize,
    /// The sender has packets out of the queue not all written yet: a
    /// request written now could land inside a frame they continue.
    sending: bool,
    waiting: HashMap<u64, oneshot::Sender<Response>>,
    /// The lane failed or closed: nothing more is sent on it.
    closed: bool,
    /// An answer came, so the key server took the lane (it closes those
    /// over its limit at once, unanswered).
    answered: bool,
    /// Packets written: the batching, seen from this side (a pipe's
    /// reader cannot tell writes apart).
    packets_sent: u64,
}

/// A thread's asynchronous lane, if it has one (see [`LaneState`]).
enum AsyncLaneState {
    None,
    Open(Arc<AsyncLane>),
    Refused(Weak<Connection>),
}

thread_local! {
    static ASYNC_LANE: RefCell<AsyncLaneState> = const { RefCell::new(AsyncLaneState::None) };
}

impl AsyncLane {
    /// Opens one to `conn` and starts its reader on this thread's runtime.
    fn open(conn: &Arc<Connection>) -> io::Result<Arc<AsyncLane>> {
        let (requests, answers) = conn.lane_pipes()?;
        let lane = Arc::new(AsyncLane {
            conn: Arc::downgrade(conn),
            // A pipe keeps only writes up to PIPE_BUF whole.
            packet: tlsgate_sys::ipc::PIPE_BUF.min(proto::MAX_PACKET),
            requests: pipe::Sender::from_owned_fd(requests)?,
            answers: pipe::Receiver::from_owned_fd(answers)?,
            queue: Mutex::new(LaneQueue::default()),
            queued: Notify::new(),
        });
        tokio::spawn(lane.clone().read_answers());
        tokio::spawn(lane.clone().send_batches());
        Ok(lane)
    }

    fn is_closed(&self) -> bool {
        lock(&self.queue).closed
    }

    /// Closed by the key server before any answer: over its lane limit.
    fn refused(&self) -> bool {
        let q = lock(&self.queue);
        q.closed && !q.answered
    }

    /// Sends `req` with the others of this turn and waits up to `timeout`
    /// for its answer.
    async fn call(
        &self,
        id: u64,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, KeyUnavailable> {
        let rx = {
            let mut q = lock(&self.queue);
            if q.closed {
                return Err(KeyUnavailable::Down);
            }
            let queued: usize = q.packets.iter().map(|(p, _)| p.len()).sum();
            if q.waiting.len() >= LANE_MAX_WAITING || queued > LANE_MAX_QUEUED {
                return Err(KeyUnavailable::Busy);
            }
            let (tx, rx) = oneshot::channel();
            q.waiting.insert(id, tx);
            // With nothing of ours at the key server there is no batch to
            // join: the request leaves now (an idle server's handshake
            // would otherwise wait a turn).
            let idle = q.packets.is_empty() && q.in_flight == 0 && !q.sending;
            if !(idle && self.send_now(&mut q, id, req)) {
                self.queue_request(&mut q, id, req);
            }
            rx
        };
        self.wait(rx, id, timeout).await
    }

    /// Writes one request at once; `false` when the socket takes it not
    /// whole (full, not yet known writable, failed): then it is queued
    /// and the sender tries (and fails the lane if it must).
    fn send_now(&self, q: &mut LaneQueue, id: u64, req: &Request) -> bool {
        let mut buf = std::mem::take(&mut q.spare);
        proto::encode_request(&mut buf, id, req);
        let sent = buf.len() <= self.packet
            && matches!(self.requests.try_write(&buf), Ok(n) if n == buf.len());
        if sent {
            q.in_flight += 1;
            q.packets_sent += 1;
        }
        buf.clear();
        if buf.capacity() <= self.packet {
            q.spare = buf;
        }
        sent
    }

    /// Adds a request to the packet being filled; the first of a batch
    /// wakes the sender.
    fn queue_request(&self, q: &mut LaneQueue, id: u64, req: &Request) {
        let first = q.packets.is_empty();
        let open = matches!(
            q.packets.last(),
            Some((buf, n)) if *n < LANE_BATCH && buf.len() < self.packet
        );
        if !open {
            let buf = std::mem::take(&mut q.spare);
            q.packets.push((buf, 0));
        }
        let over = match q.packets.last_mut() {
            Some((buf, _)) => {
                proto::encode_request(buf, id, req);
                (buf.len() > self.packet).then(|| buf.split_off(self.packet))
            }
            None => None,
        };
        // What does not fit goes on in packets of its own; the key server
        // reassembles the frame.
        if let Some(over) = over {
            for piece in over.chunks(self.packet) {
                q.packets.push((piece.to_vec(), 0));
            }
        }
        if let Some((_, n)) = q.packets.last_mut() {
            *n += 1;
        }
        if first {
            // A task of its own sends the batch, so that a handshake
            // dropped meanwhile cannot strand the others' requests.
            self.queued.notify_one();
        }
    }

    /// Waits up to `timeout` for the answer to request `id`.
    async fn wait(
        &self,
        rx: oneshot::Receiver<Response>,
        id: u64,
        timeout: Duration,
    ) -> Result<Response, KeyUnavailable> {
        // A handshake dropped while it waits (its own timeout, a closed
        // connection) takes its entry with it.
        let _entry = WaitingEntry { lane: self, id };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(_)) => Err(KeyUnavailable::Down),
            Err(_) => Err(KeyUnavailable::Timeout),
        }
    }

    /// Sends the queued requests until the lane closes: once woken, it
    /// lets the other connections of this turn add theirs, then sends
    /// every queued packet.
    async fn send_batches(self: Arc<Self>) {
        loop {
            self.queued.notified().await;
            if self.is_closed() {
                return;
            }
            tokio::task::yield_now().await;
            if !self.send_queued().await {
                self.fail();
                return;
            }
        }
    }

    /// Sends every queued packet; `false` when the socket failed.
    async fn send_queued(&self) -> bool {
        let packets = {
            let mut q = lock(&self.queue);
            q.sending = true;
            std::mem::take(&mut q.packets)
        };
        let sent = self.send_packets(packets).await;
        lock(&self.queue).sending = false;
        sent
    }

    /// Sends `packets` in order; `false` when the socket failed.
    async fn send_packets(&self, packets: Vec<(Vec<u8>, usize)>) -> bool {
        for (mut packet, requests) in packets {
            let sent = loop {
                if self.requests.writable().await.is_err() {
                    break false;
                }
                match self.requests.try_write(&packet) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => break matches!(r, Ok(n) if n == packet.len()),
                }
            };
            if !sent {
                return false;
            }
            packet.clear();
            let mut q = lock(&self.queue);
            q.in_flight += requests;
            q.packets_sent += 1;
            q.spare = packet;
        }
        true
    }

    /// Routes answers to their handshakes until the lane closes.
    async fn read_answers(self: Arc<Self>) {
        let mut frames = Deframer::new(proto::MAX_RESPONSE);
        loop {
            if self.answers.readable().await.is_err() {
                break;
            }
            let mut routed = None;
            let read = self.answers.try_io(|| {
                let n = frames.read_from(&mut TryRead(&self.answers))?;
                if n > 0 {
                    let r = self.route(&mut frames);
                    routed = Some(r);
                    if r == Ok(true) {
                        // Makes `try_io` clear the readiness this read
                        // consumed (its event tick keeps a packet that
                        // came meanwhile from being missed).
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                }
                Ok(n)
            });
            match (read, routed) {
                (_, Some(Ok(_))) => {}
                (_, Some(Err(()))) | (Ok(0), None) => break,
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => {}
                (_, None) => break,
            }
        }
        self.fail();
    }

    /// Hands the answers read to their handshakes; `Ok(true)` when every
    /// request sent is answered, `Err` on a broken answer.
    fn route(&self, frames: &mut Deframer) -> Result<bool, ()> {
        loop {
            let frame = match frames.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return Err(()),
            };
            let (id, resp) = proto::decode_response(frame).map_err(|_| ())?;
            let tx = {
                let mut q = lock(&self.queue);
                q.answered = true;
                q.in_flight = q.in_flight.saturating_sub(1);
                q.waiting.remove(&id)
            };
            // An answer nobody waits for (timed out) is dropped.
            if let Some(tx) = tx {
                let _ = tx.send(resp);
            }
        }
        Ok(lock(&self.queue).in_flight == 0)
    }

    /// Closes it: the waiting handshakes fail at once (their senders go).
    fn fail(&self) {
        {
            let mut q = lock(&self.queue);
            q.closed = true;
            q.packets.clear();
            q.waiting.clear();
        }
        // The sender ends too.
        self.queued.notify_one();
    }
}

/// Removes a request's entry from its lane's waiting list when its
/// handshake stops waiting, answered or not.
struct WaitingEntry<'a> {
    lane: &'a AsyncLane,
    id: u64,
}

impl Drop for WaitingEntry<'_> {
    fn drop(&mut self) {
        lock(&self.lane.queue).waiting.remove(&self.id);
    }
}

/// A tokio pipe's non-blocking read as `std::io::Read`, for [`Deframer`].
struct TryRead<'a>(&'a pipe::Receiver);

impl io::Read for TryRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Inner {
    /// This thread's asynchronous lane to `conn`, opened at its first use;
    /// `None` outside a tokio runtime or when the key server refused it
    /// (then the blocking ways serve).
    fn async_lane(&self, conn: &Arc<Connection>) -> Option<Arc<AsyncLane>> {
        let same = |w: &Weak<Connection>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(conn));
        ASYNC_LANE
            .try_with(|cell| {
                let mut slot = cell.try_borrow_mut().ok()?;
                match &*slot {
                    AsyncLaneState::Open(l) if same(&l.conn) => {
                        if !l.is_closed() {
                            return Some(l.clone());
                        }
                        if l.refused() {
                            *slot = AsyncLaneState::Refused(Arc::downgrade(conn));
                            return None;
                        }
                    }
                    AsyncLaneState::Refused(w) if same(w) => return None,
                    // None yet, or a lane to an older key server.
                    _ => {}
                }
                tokio::runtime::Handle::try_current().ok()?;
                let lane = AsyncLane::open(conn).ok()?;
                *slot = AsyncLaneState::Open(lane.clone());
                Some(lane)
            })
            .ok()
            .flatten()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;

    fn sign() -> Request {
        Request::Sign {
            key_id: 1,
            scheme: SignatureScheme::ED25519,
            message: vec![1, 2, 3],
        }
    }

    /// Hung: three timeouts in a row, the last two timeouts after the
    /// first; not a burst, not with an answer between; once per hang.
    #[test]
    fn a_key_server_is_hung_after_timeouts_spanning_three_timeouts() {
        let t = Duration::from_millis(100);
        let w = Watch::default();
        // A burst at one moment is not a hang.
        for _ in 0..10 {
            assert!(!w.timed_out(t));
        }
        // An answer starts the count again.
        assert!(!w.answered());
        std::thread::sleep(2 * t);
        assert!(!w.timed_out(t));
        std::thread::sleep(2 * t);
        assert!(!w.timed_out(t));
        assert!(!w.answered());
        assert!(!w.timed_out(t));
        std::thread::sleep(2 * t);
        assert!(!w.timed_out(t));
        assert!(w.timed_out(t), "third in a row, 2 timeouts after the first");
        // Taken as hung once; an answer says it was.
        std::thread::sleep(2 * t);
        for _ in 0..5 {
            assert!(!w.timed_out(t));
        }
        assert!(w.answered());
        assert!(!w.answered());
        // Rate-limited warnings: the first, then counted.
        let s = lock(&w.state);
        assert!(s.last_warning.is_some());
        assert_eq!(s.unlogged, 19);
    }

    #[test]
    fn answers_out_of_order_reach_their_waiters() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let conn = Connection::new(a, Duration::from_secs(5), 1).unwrap();
        conn.start_reader(|_| {}).unwrap();
        let waiters: Vec<_> = (1..=3u64)
            .map(|id| {
                let c = conn.clone();
                std::thread::spawn(move || c.call(id, &sign(), Duration::from_secs(5)))
            })
            .collect();
        // Read the three requests, answer them in reverse order, in one write.
        let mut d = Deframer::new(proto::MAX_REQUEST);
        let mut ids = Vec::new();
        while ids.len() < 3 {
            d.read_from(&mut b).unwrap();
            while let Some(f) = d.next_frame().unwrap() {
                ids.push(proto::decode_request(f).unwrap().0);
            }
        }
        let mut out = Vec::new();
        for id in ids.iter().rev() {
            proto::encode_response(&mut out, *id, &Response::Signature(vec![*id as u8; 4]));
        }
        b.write_all(&out).unwrap();
        for (i, w) in waiters.into_iter().enumerate() {
            let id = i as u8 + 1;
            assert_eq!(w.join().unwrap().unwrap(), Response::Signature(vec![id; 4]));
        }
    }

    #[test]
    fn silence_times_out_and_garbage_closes_the_connection() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let conn = Connection::new(a, Duration::from_secs(5), 1).unwrap();
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        conn.start_reader(move |_| flag.store(true, Ordering::SeqCst))
            .unwrap();
        let t0 = Instant::now();
        assert_eq!(
            conn.call(1, &sign(), Duration::from_millis(200)),
            Err(KeyUnavailable::Timeout)
        );
        assert!(t0.elapsed() < Duration::from_secs(2));
        // A frame with a sound length and a garbage payload.
        b.write_all(&[0, 0, 0, 12, 1, 0x99, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0])
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !closed.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "reader did not give up");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            conn.call(2, &sign(), Duration::from_secs(1)),
            Err(KeyUnavailable::Down)
        );
        // Our side was closed too, so the key server would see EOF.
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
    }

    /// A connection whose reader runs, and the key server's end of it.
    fn connected() -> (Arc<Connection>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let conn = Connection::new(a, Duration::from_secs(5), 1).unwrap();
        conn.start_reader(|_| {}).unwrap();
        (conn, b)
    }

    /// A worker's kind of runtime.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A key server's lane for the test: takes the lane handed over `b`,
    /// then answers each packet it reads in one packet, in reverse order,
    /// reporting how many requests each packet held.
    fn fake_lane_server(b: UnixStream, sizes: std::sync::mpsc::Sender<usize>) {
        std::thread::spawn(move || {
            let mut fds = Vec::new();
            let mut buf = [0u8; 64];
            while fds.is_empty() {
                tlsgate_sys::ipc::recv_with_fds(&b, &mut buf, &mut fds).unwrap();
            }
            // A socket both ways, or a pipe for each way.
            let (mut requests, mut answers): (Box<dyn Read + Send>, Box<dyn Write + Send>) =
                if fds.len() == 1 {
                    let lane = UnixStream::from(fds.remove(0));
                    (Box::new(lane.try_clone().unwrap()), Box::new(lane))
                } else {
                    assert_eq!(fds.len(), 2);
                    let answers = std::fs::File::from(fds.remove(1));
                    (
                        Box::new(std::fs::File::from(fds.remove(0))),
                        Box::new(answers),
                    )
                };
            let mut d = Deframer::new(proto::MAX_REQUEST);
            while d.read_from(&mut requests).unwrap() > 0 {
                let mut ids = Vec::new();
                while let Some(f) = d.next_frame().unwrap() {
                    ids.push(proto::decode_request(f).unwrap().0);
                }
                // A packet in the middle of a large request ends none.
                if ids.is_empty() {
                    continue;
                }
                sizes.send(ids.len()).unwrap();
                let mut out = Vec::new();
                for id in ids.iter().rev() {
                    proto::encode_response(&mut out, *id, &Response::Signature(vec![*id as u8; 4]));
                }
                answers.write_all(&out).unwrap();
            }
        });
    }

    #[test]
    fn requests_of_one_turn_share_a_packet_and_answers_reach_their_waiters() {
        let (conn, b) = connected();
        let (tx, sizes) = std::sync::mpsc::channel();
        fake_lane_server(b, tx);
        let rt = runtime();
        let packets = rt.block_on(async {
            let lane = AsyncLane::open(&conn).unwrap();
            // A fresh pipe is not known writable before epoll says so:
            // the first request goes through the sender.
            assert_eq!(
                lane.call(7, &sign(), Duration::from_secs(5)).await.unwrap(),
                Response::Signature(vec![7; 4])
            );
            let calls: Vec<_> = (1..=5u64)
                .map(|id| {
                    let lane = lane.clone();
                    tokio::spawn(
                        async move { lane.call(id, &sign(), Duration::from_secs(5)).await },
                    )
                })
                .collect();
            for (i, c) in calls.into_iter().enumerate() {
                let id = i as u8 + 1;
                assert_eq!(c.await.unwrap().unwrap(), Response::Signature(vec![id; 4]));
            }
            assert!(lock(&lane.queue).waiting.is_empty());
            // A request alone goes at once.
            assert_eq!(
                lane.call(9, &sign(), Duration::from_secs(5)).await.unwrap(),
                Response::Signature(vec![9; 4])
            );
            let packets = lock(&lane.queue).packets_sent;
            packets
        });
        // The first went at once (the key server had nothing of ours),
        // the four asked meanwhile together; the last alone again. The
        // key server may read the first two packets of the five at once.
        assert_eq!(packets, 4);
        let sizes: Vec<usize> = sizes.try_iter().collect();
        assert!(sizes == [1, 1, 4, 1] || sizes == [1, 5, 1], "{sizes:?}");
    }

    /// A request larger than a packet (a TLS 1.2 client's transcript) goes
    /// in several, and requests made meanwhile do not land inside it.
    #[test]
    fn a_request_larger_than_a_packet_is_split_and_reassembled() {
        let (conn, b) = connected();
        let (tx, sizes) = std::sync::mpsc::channel();
        fake_lane_server(b, tx);
        let big = |id: u64| Request::Sign {
            key_id: id,
            scheme: SignatureScheme::ED25519,
            message: vec![id as u8; proto::MAX_MESSAGE],
        };
        let rt = runtime();
        rt.block_on(async {
            let lane = AsyncLane::open(&conn).unwrap();
            assert!(lane.packet < proto::MAX_MESSAGE);
            let calls: Vec<_> = (1..=6u64)
                .map(|id| {
                    let lane = lane.clone();
                    let req = if id % 2 == 0 { big(id) } else { sign() };
                    tokio::spawn(async move { lane.call(id, &req, Duration::from_secs(10)).await })
                })
                .collect();
            for (i, c) in calls.into_iter().enumerate() {
                let id = i as u8 + 1;
                assert_eq!(c.await.unwrap().unwrap(), Response::Signature(vec![id; 4]));
            }
        });
        let sizes: Vec<usize> = sizes.try_iter().collect();
        assert_eq!(sizes.iter().sum::<usize>(), 6, "{sizes:?}");
        // And the blocking lane.
        let (conn, b) = connected();
        let (tx, sizes) = std::sync::mpsc::channel();
        fake_lane_server(b, tx);
        let mut blocking = conn.open_lane(Duration::from_secs(10)).unwrap();
        assert!(blocking.packet < proto::MAX_MESSAGE);
        assert_eq!(
            blocking.call(8, &big(8)).unwrap(),
            Response::Signature(vec![8; 4])
        );
        assert_eq!(
            blocking.call(9, &sign()).unwrap(),
            Response::Signature(vec![9; 4])
        );
        assert_eq!(sizes.try_iter().collect::<Vec<_>>(), [1, 1]);
    }

    #[test]
    fn a_dropped_waiter_leaves_no_entry_and_a_closed_lane_fails_its_waiters() {
        let (conn, b) = connected();
        let rt = runtime();
        rt.block_on(async {
            let lane = AsyncLane::open(&conn).unwrap();
            let mut theirs = Vec::new();
            tlsgate_sys::ipc::recv_with_fds(&b, &mut [0u8; 64], &mut theirs).unwrap();
            // Nobody answers: a waiter given up on takes its entry along.
            let gave_up = tokio::time::timeout(
                Duration::from_millis(50),
                lane.call(1, &sign(), Duration::from_secs(5)),
            )
            .await;
            assert!(gave_up.is_err());
            assert!(lock(&lane.queue).waiting.is_empty());
            // The key server closes the lane: a waiting request fails at once.
            let waiting = tokio::spawn({
                let lane = lane.clone();
                async move { lane.call(2, &sign(), Duration::from_secs(30)).await }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(theirs);
            let t0 = Instant::now();
            assert_eq!(waiting.await.unwrap(), Err(KeyUnavailable::Down));
            assert!(t0.elapsed() < Duration::from_secs(5));
            // Closed without a single answer: what a key server over its
            // lane limit does, so this thread signs the blocking way.
            assert!(lane.refused());
            assert_eq!(
                lane.call(3, &sign(), Duration::from_secs(1)).await,
                Err(KeyUnavailable::Down)
            );
        });
    }
}
