//! Session tickets: our own rustls [`ProducesTickets`], used for TLS 1.2
//! session tickets (RFC 5077) and TLS 1.3 PSK tickets (resumed with a
//! fresh ECDHE exchange: rustls only does `psk_dhe_ke`).
//!
//! [`TicketKeys`] holds the keys of the process: the first encrypts, all
//! decrypt. They come from one of two sources:
//!
//! * in memory: made at start and replaced every `ticket_rotation`; an old
//!   key stays as long as a ticket it sealed can be within its lifetime;
//! * a key file ([`file`]) shared by a fleet behind a balancer: polled every
//!   second (inode, size, times) and read again when it changes. A file
//!   that cannot be used then keeps the keys already loaded, and is
//!   reported (log and [`TicketObserver::reloaded`]).
//!
//! Each listener gets its own [`ProducesTickets`] ([`TicketKeys::for_listener`])
//! that binds its tickets to the listener, so a ticket from one listener
//! (say without client certificates) never resumes on another.
//!
//! Key material is never logged or printed; `Debug` shows counts and
//! key ids (a prefix of the public key name).

pub mod file;
mod seal;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use rustls::server::ProducesTickets;
use tlsgate_config::SessionTickets;

pub use file::{KeyFileError, Secret};
pub use seal::Refused;
use seal::TicketKey;

/// Unix time in seconds; replaceable in tests.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock. Tickets carry wall-clock time because fleet members
/// must agree on it.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// How often the key file is checked and in-memory rotation is considered.
const POLL: Duration = Duration::from_secs(1);

/// Hears what happens to tickets and keys (metrics). Every method is
/// called on a handshake path or the refresher thread: keep them cheap.
pub trait TicketObserver: Send + Sync {
    /// A ticket was sealed.
    fn issued(&self) {}
    /// A client's ticket opened, or why it did not.
    fn opened(&self, _result: Result<(), Refused>) {}
    /// The number of keys now in use.
    fn key_count(&self, _count: usize) {}
    /// The key file changed and was read again: usable or not.
    fn reloaded(&self, _ok: bool) {}
    /// In-memory keys were rotated.
    fn rotated(&self) {}
}

/// An observer that ignores everything (check-config, tests).
#[derive(Debug, Default)]
pub struct Quiet;

impl TicketObserver for Quiet {}

/// Ticket keys could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TicketKeyError {
    /// The key file is missing, open to others, or malformed.
    #[error(transparent)]
    File(#[from] KeyFileError),
    /// The crypto library failed (random source, key setup).
    #[error("cannot make a ticket key: {0}")]
    Crypto(&'static str),
    /// The refresher thread could not start.
    #[error("cannot start the ticket key thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// What identifies a version of the key file: a rename (new inode), a
/// rewrite (size, mtime) or a chmod (ctime) all change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    // Follows symlinks: a swapped link (e.g. a mounted secret) is a change.
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

enum Source {
    Memory {
        rotation: u64,
    },
    File {
        path: PathBuf,
        /// `server.user`, who may own the file besides root and us.
        run_as: Option<u32>,
        /// The file version last read (or tried).
        seen: Mutex<Option<FileStamp>>,
    },
}

type Ring = Vec<Arc<TicketKey>>;

/// The ticket keys of the process. Shared by every listener and kept
/// across configuration reloads while the ticket settings stay the same.
pub struct TicketKeys {
    ring: ArcSwap<Ring>,
    lifetime: u32,
    source: Source,
    clock: Clock,
    observer: Arc<dyn TicketObserver>,
    /// One refresh at a time (thread and callers).
    refreshing: Mutex<()>,
}

impl std::fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ring = self.ring.load();
        f.debug_struct("TicketKeys")
            .field("keys", &ring.len())
            .field("encrypting", &ring.first().map(|k| k.id()))
            .field("lifetime_secs", &self.lifetime)
            .finish_non_exhaustive()
    }
}

fn derive(secret: &Secret, since: u64) -> Result<Arc<TicketKey>, TicketKeyError> {
    TicketKey::derive(secret, since)
        .map(Arc::new)
        .map_err(|()| TicketKeyError::Crypto("key derivation failed"))
}

fn load_file(path: &Path, run_as: Option<u32>) -> Result<Ring, TicketKeyError> {
    file::read(path, run_as)?
        .iter()
        .map(|s| derive(s, 0))
        .collect::<Result<Ring, _>>()
}

impl TicketKeys {
    /// Sets up the keys `policy` asks for: the key file is read now (any
    /// problem is an error), or a first key is made in memory. `run_as`
    /// (`server.user`) may own the key file, as may root and this process's
    /// own user.
    pub fn new(
        policy: &SessionTickets,
        run_as: Option<u32>,
        observer: Arc<dyn TicketObserver>,
    ) -> Result<Arc<Self>, TicketKeyError> {
        Self::with_clock(policy, run_as, observer, system_clock())
    }

    /// [`new`](Self::new) with a given clock (tests).
    pub fn with_clock(
        policy: &SessionTickets,
        run_as: Option<u32>,
        observer: Arc<dyn TicketObserver>,
        clock: Clock,
    ) -> Result<Arc<Self>, TicketKeyError> {
        let now = clock();
        let (ring, source) = match &policy.key_file {
            Some(path) => {
                let seen = stamp(path);
                let ring = load_file(path, run_as)?;
                (
                    ring,
                    Source::File {
                        path: path.clone(),
                        run_as,
                        seen: Mutex::new(seen),
                    },
                )
            }
            None => {
                let secret = Secret::generate()
                    .map_err(|_| TicketKeyError::Crypto("the system random source failed"))?;
                (
                    vec![derive(&secret, now)?],
                    Source::Memory {
                        rotation: policy.rotation.as_secs().max(1),
                    },
                )
            }
        };
        observer.key_count(ring.len());
        Ok(Arc::new(Self {
            ring: ArcSwap::from_pointee(ring),
            lifetime: u32::try_from(policy.lifetime.as_secs()).unwrap_or(u32::MAX),
            source,
            clock,
            observer,
            refreshing: Mutex::new(()),
        }))
    }

    /// Ticket lifetime in seconds.
    pub fn lifetime_secs(&self) -> u32 {
        self.lifetime
    }

    /// Keys in use.
    pub fn key_count(&self) -> usize {
        self.ring.load().len()
    }

    /// One step of upkeep: rotate and prune in-memory keys when due, or
    /// read the key file again if it changed.
    pub fn refresh(&self) {
        let _one = self
            .refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &self.source {
            Source::Memory { rotation } => self.refresh_memory(*rotation),
            Source::File { path, run_as, seen } => {
                let now = stamp(path);
                let mut seen = seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if *seen != now {
                    // Recorded before reading: a change during the read is seen next time.
                    *seen = now;
                    self.reload_file(path, *run_as);
                }
            }
        }
    }

    fn refresh_memory(&self, rotation: u64) {
        let now = (self.clock)();
        let current = self.ring.load_full();
        // A clock set back (a host booted with a wrong time, then
        // corrected) leaves the key's age unknown: it is replaced now rather
        // than sealing for as long as the clock went back.
        let due = current
            .first()
            .is_none_or(|k| now < k.since || now >= k.since.saturating_add(rotation));
        let mut all: Ring = Vec::with_capacity(current.len() + 1);
        if due {
            match Secret::generate()
                .map_err(|_| TicketKeyError::Crypto("the system random source failed"))
                .and_then(|s| derive(&s, now))
            {
                Ok(k) => all.push(k),
                Err(e) => tracing::error!("session tickets: {e}; keeping the current key"),
            }
        }
        let rotated = !all.is_empty();
        all.extend(current.iter().cloned());
        // A key stopped sealing when the one before it started; its last
        // tickets expire a lifetime after that.
        let mut keep: Ring = Vec::with_capacity(all.len());
        for (i, k) in all.iter().enumerate() {
            let retired = i
                .checked_sub(1)
                .and_then(|p| all.get(p))
                .map(|newer| newer.since);
            if retired.is_none_or(|t| now.saturating_sub(t) <= u64::from(self.lifetime)) {
                keep.push(k.clone());
            }
        }
        // Bounded like a key file: a rotation much shorter than the
        // lifetime cuts the oldest tickets short instead of growing the ring.
        keep.truncate(file::MAX_KEYS);
        if rotated || keep.len() != current.len() {
            if rotated {
                tracing::debug!(
                    "session tickets: new in-memory key {}, {} keys",
                    keep.first().map(|k| k.id()).unwrap_or_default(),
                    keep.len()
                );
                self.observer.rotated();
            }
            self.observer.key_count(keep.len());
            self.ring.store(Arc::new(keep));
        }
    }

    fn reload_file(&self, path: &Path, run_as: Option<u32>) {
        match load_file(path, run_as) {
            Ok(ring) => {
                tracing::info!(
                    "ticket keys reloaded from {}: {} keys, encrypting with key {}",
                    path.display(),
                    ring.len(),
                    ring.first().map(|k| k.id()).unwrap_or_default()
                );
                self.observer.key_count(ring.len());
                self.ring.store(Arc::new(ring));
                self.observer.reloaded(true);
            }
            Err(e) => {
                tracing::error!(
                    "ticket key file not reloaded, still using the {} keys loaded before: {e}",
                    self.key_count()
                );
                self.observer.reloaded(false);
            }
        }
    }

    /// Starts the thread that calls [`refresh`](Self::refresh) every
    /// second; it ends once these keys are dropped.
    pub fn spawn_refresher(self: &Arc<Self>) -> Result<(), TicketKeyError> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ticket-keys".into())
            .spawn(move || loop {
                std::thread::sleep(POLL);
                match weak.upgrade() {
                    Some(keys) => keys.refresh(),
                    None => return,
                }
            })
            .map_err(TicketKeyError::Thread)?;
        Ok(())
    }

    /// The ticketer of one listener; `context` (e.g. `listener[0]`) is
    /// bound into its tickets, and must match across a fleet.
    pub fn for_listener(self: &Arc<Self>, context: &str) -> Arc<dyn ProducesTickets> {
        Arc::new(ListenerTickets {
            keys: self.clone(),
            context: context.as_bytes().into(),
        })
    }

    /// Seals session `state` for `context` with the first key.
    pub fn seal(&self, context: &[u8], state: &[u8]) -> Option<Vec<u8>> {
        let ring = self.ring.load();
        let sealed = ring.first()?.seal(context, state, (self.clock)());
        if sealed.is_some() {
            self.observer.issued();
        }
        sealed
    }

    /// Opens a ticket a client sent for `context`.
    pub fn open(&self, context: &[u8], ticket: &[u8]) -> Result<Vec<u8>, Refused> {
        let ring = self.ring.load();
        let result = seal::open(
            ring.iter().map(|k| &**k),
            context,
            ticket,
            (self.clock)(),
            u64::from(self.lifetime),
        );
        self.observer
            .opened(result.as_ref().map(|_| ()).map_err(|r| *r));
        result
    }
}

/// [`TicketKeys`] bound to one listener, for rustls.
struct ListenerTickets {
    keys: Arc<TicketKeys>,
    context: Box<[u8]>,
}

impl std::fmt::Debug for ListenerTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTickets")
            .field("context", &String::from_utf8_lossy(&self.context))
            .field("keys", &self.keys)
            .finish()
    }
}

impl ProducesTickets for ListenerTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.keys.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        // rustls then sends no ticket (see `UnreachablePeer`).
        if crate::session_cache::UnreachablePeer::now() {
            return None;
        }
        self.keys.seal(&self.context, plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.keys.open(&self.context, cipher).ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
