//! Send budgets: the memory HTTP/2 response bodies (files, and proxied
//! answers as their upstream sends them) may hold while their client
//! does not read. A file's bytes are read for a stream only once the
//! client's flow-control windows have room for them, so what they wait
//! for afterwards is the connection itself: h2's queue, then the TLS
//! connection's buffer, then the socket. A client that opens its windows
//! wide and reads nothing would otherwise have every stream read its
//! share (128 streams × 64 KiB and their buffers: ~14 MB a connection).
//!
//! Each read first takes its bytes from its connection's budget
//! (`http2.max_connection_send_buffer`), then from its worker thread's
//! (`http2.max_worker_send_buffer`), and gives them back when h2 has
//! written the last frame cut from it (the buffer is dropped then too: its
//! [`Bytes`] own the budget). A stream waits, holding nothing, until its
//! bytes are free; the waits are first come, first served. While streams
//! of a worker wait for its budget, a connection that holds some of it
//! and whose client has taken nothing for [`SHORT_SEND_TIMEOUT`] is
//! closed (the connection loop checks, [`SendBudget::should_yield`]):
//! a few clients that do not read cannot stall everyone else's
//! responses for a whole `send_timeout`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tlsgate_config::Http2;
use tlsgate_metrics::types::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection holding send budget may go without its client
/// taking anything while its worker's budget is short (below the send
/// timeout, which applies as always).
pub(super) const SHORT_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// A worker thread's budget, shared by its connections.
struct Worker {
    bytes: Arc<Semaphore>,
    total: usize,
    /// Streams waiting for it now.
    waiting: AtomicUsize,
}

thread_local! {
    /// This worker thread's budget (connections never leave their thread).
    static WORKER: RefCell<Option<Arc<Worker>>> = const { RefCell::new(None) };
}

/// The worker thread's budget of `total` bytes: a new one when a reload
/// changed the size (connections keep the one they started with).
fn worker(total: usize) -> Arc<Worker> {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        match &*w {
            Some(b) if b.total == total => b.clone(),
            _ => {
                let b = Arc::new(Worker {
                    bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
                    total,
                    waiting: AtomicUsize::new(0),
                });
                *w = Some(b.clone());
                b
            }
        }
    })
}

/// One connection's budget, and its worker's.
pub(super) struct SendBudget {
    conn: Arc<Semaphore>,
    conn_total: usize,
    worker: Arc<Worker>,
    /// `tlsgate_h2_send_buffered_bytes` and `_waiting_streams`.
    gauges: Gauges,
}

/// The process's gauges of budget in use and streams waiting for it.
#[derive(Clone)]
pub(super) struct Gauges {
    pub buffered: Gauge,
    pub waiting: Gauge,
}

/// Budget taken for one read; given back when dropped.
pub(super) struct Held {
    _conn: OwnedSemaphorePermit,
    _worker: OwnedSemaphorePermit,
    bytes: i64,
    buffered: Gauge,
}

#[cfg(test)]
impl Held {
    /// Budget of nothing, for tests of what holds it.
    pub fn none() -> Self {
        let none = || {
            Arc::new(Semaphore::new(0))
                .try_acquire_many_owned(0)
                .unwrap_or_else(|_| unreachable!("zero permits are always there"))
        };
        Self {
            _conn: none(),
            _worker: none(),
            bytes: 0,
            buffered: Gauge::default(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.buffered.dec_by(self.bytes);
    }
}

/// Counts a stream waiting for the worker's budget while it waits.
struct Waiting<'a>(&'a AtomicUsize, &'a Gauge);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        self.1.dec();
    }
}

impl SendBudget {
    /// The budgets of a new connection under `h2c`.
    pub fn new(h2c: &Http2, gauges: Gauges) -> Self {
        let conn_total = h2c.max_connection_send_buffer as usize;
        let worker_total = usize::try_from(h2c.max_worker_send_buffer).unwrap_or(usize::MAX);
        Self {
            conn: Arc::new(Semaphore::new(conn_total)),
            conn_total,
            worker: worker(worker_total),
            gauges,
        }
    }

    /// The most one read may take.
    pub fn max_read(&self) -> usize {
        self.conn_total.min(self.worker.total)
    }

    /// `n` bytes (at most [`Self::max_read`]), once both budgets have
    /// them. `None` only if a budget were closed (never).
    pub async fn take(&self, n: usize) -> Option<Held> {
        let n = u32::try_from(n.min(self.max_read())).unwrap_or(u32::MAX);
        let conn = self.conn.clone().acquire_many_owned(n).await.ok()?;
        let worker = match self.worker.bytes.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                self.worker.waiting.fetch_add(1, Ordering::Relaxed);
                self.gauges.waiting.inc();
                let _waiting = Waiting(&self.worker.waiting, &self.gauges.waiting);
                self.worker.bytes.clone().acquire_many_owned(n).await.ok()?
            }
        };
        let bytes = i64::from(n);
        self.gauges.buffered.inc_by(bytes);
        Some(Held {
            _conn: conn,
            _worker: worker,
            bytes,
            buffered: self.gauges.buffered.clone(),
        })
    }

    /// Whether bytes read for this connection wait to be written.
    pub fn holding(&self) -> bool {
        self.conn.available_permits() < self.conn_total
    }

    /// Whether a connection whose client has taken nothing for `blocked`
    /// should be closed for its worker's sake: it holds budget that
    /// streams of the worker wait for, and has past
    /// [`SHORT_SEND_TIMEOUT`].
    pub fn should_yield(&self, blocked: Duration) -> bool {
        blocked >= SHORT_SEND_TIMEOUT
            && self.holding()
            && self.worker.waiting.load(Ordering::Relaxed) > 0
    }
}

/// `data` as `Bytes` that keep `held` until the last frame cut from them
/// is dropped (h2 has written it), and `data` with it.
pub(super) fn budgeted<D>(data: D, held: Held) -> Bytes
where
    D: AsRef<[u8]> + Send + 'static,
{
    Bytes::from_owner(Piece { data, _held: held })
}

struct Piece<D> {
    data: D,
    _held: Held,
}

impl<D: AsRef<[u8]>> AsRef<[u8]> for Piece<D> {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}
