//! An upstream pool: its servers' state (in service, in flight, passive
//! failure marks), keep-alive connections kept per worker thread, opening
//! new connections (TCP, then TLS) under the connect timeout, and the
//! choice of a server.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tlsgate_config::{ConfigError, HashKey, Upstream};
use tlsgate_metrics::{PoolSeries, ProxyMetrics, ServerLabels, ServerSeries};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::balance::{self, Balancer, Candidate};
use crate::client::{self, ClientConn};
use crate::conn::{Outages, Stream, UpstreamConn};
use crate::error::Failure;
use crate::tls::{self, Connector};
use rustls::sign::CertifiedKey;

/// Which idle list a thread uses: worker threads get their own (each has
/// its own runtime, and a socket belongs to the runtime that opened it).
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|s| *s)
}

/// One server of a pool.
pub(crate) struct Server {
    pub cfg: tlsgate_config::UpstreamServer,
    /// Where new connections go: `cfg.addr` until a name resolves anew.
    addr: RwLock<SocketAddr>,
    in_flight: AtomicUsize,
    /// Consecutive failures (passive checks).
    fails: AtomicU32,
    /// Out of service until this many ms after the pool's epoch (0 = in).
    down_until_ms: AtomicU64,
    /// The active health check's verdict (true without checks).
    pub check_ok: AtomicBool,
    /// Times taken out of service: connections opened before the latest
    /// are not reused.
    pub(crate) outages: Outages,
    /// Idle keep-alive connections per thread slot.
    idle: Box<[Mutex<Vec<UpstreamConn>>]>,
    /// `max_conns` places: each connection open to it (in use or idle,
    /// health checks' aside) holds one until it closes.
    slots: Arc<tokio::sync::Semaphore>,
    /// Requests at the cap, waiting for a place. While any wait, a
    /// connection done with is not kept idle (an idle one would hold its
    /// place from them): it goes to the oldest waiter, or is closed.
    waiting: AtomicUsize,
    /// The waiters in the order they began to wait, each with the thread
    /// slot it waits on: a connection done with on that thread is handed
    /// to the oldest straight away, still open (no close, no connect, no
    /// TIME_WAIT per request while requests queue). A socket belongs to
    /// the runtime of the thread that opened it, so a connection on
    /// another thread is closed instead, and its place goes to the
    /// semaphore's oldest waiter.
    handoff: Mutex<VecDeque<Waiter>>,
    /// This server's series, looked up once (not per request: a lock and a
    /// hash of two strings each); gone with the last pool that has it.
    pub(crate) series: ServerSeries,
}

impl Drop for Server {
    fn drop(&mut self) {
        // The gauge outlives this pool when a reload kept the server: its
        // idle connections, closed now, must leave the count.
        let idle: usize = self
            .idle
            .iter_mut()
            .map(|m| m.get_mut().unwrap_or_else(PoisonError::into_inner).len())
            .sum();
        self.series
            .connections_idle
            .dec_by(i64::try_from(idle).unwrap_or(i64::MAX));
    }
}

impl Server {
    /// Ends a passive mark: in service again (if its health check agrees).
    pub(crate) fn clear_mark(&self) {
        self.down_until_ms.store(0, Ordering::Relaxed);
    }

    /// Where new connections to it go.
    pub(crate) fn addr(&self) -> SocketAddr {
        *self.addr.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `conn` may still serve it: opened to the address its name
    /// resolves to now, and since it was last taken out of service.
    fn may_reuse(&self, conn: &UpstreamConn) -> bool {
        conn.addr == self.addr() && !conn.predates_an_outage()
    }
}

/// A pool of servers built from one `[[upstream]]` of one generation.
pub struct Pool {
    pub(crate) cfg: Upstream,
    pub(crate) servers: Vec<Server>,
    balancer: Balancer,
    tls: Option<(Connector, TlsConnector)>,
    epoch: Instant,
    series: PoolSeries,
    /// Tells this pool's private connections (`proxy_protocol`) from
    /// those of the pool of the same name before or after a reload.
    id: u64,
    /// Becomes true when a reload replaces the pool's generation: its
    /// health checks and name resolution end, its idle connections are
    /// closed and no more are kept, its gauges are left to the new pool.
    /// Requests still in flight on it finish (opening connections anew).
    retired: tokio::sync::watch::Sender<bool>,
}

/// A server's state carried over a reload.
#[derive(Clone, Copy)]
struct Learnt {
    check_ok: bool,
    down_until_ms: u64,
}

/// A connection checked out for one exchange; counts as in flight.
pub(crate) struct Lease<'p> {
    pool: &'p Pool,
    pub conn: Option<UpstreamConn>,
    pub server: usize,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.pool.servers.get(self.server) {
            s.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Pool {
    /// Builds the pool (its TLS client configuration included) for
    /// `workers` worker threads. A server that `previous` (the pool of
    /// the same name before a reload) has too keeps what was learnt of it:
    /// its health check's verdict (when the new pool checks too) and its
    /// passive mark, so a reload sends no request to a server known down.
    /// `files` and `client`: what the key holder read for its TLS.
    pub fn new(
        origin: &str,
        cfg: &Upstream,
        workers: usize,
        metrics: &ProxyMetrics,
        previous: Option<&Pool>,
        (files, client): (tls::PoolFiles<'_>, Option<&Arc<CertifiedKey>>),
    ) -> Result<Pool, ConfigError> {
        let tls = match &cfg.tls {
            Some(t) => {
                let c = tls::connector(origin, cfg, t, files, client)?;
                let tc = TlsConnector::from(c.config.clone());
                Some((c, tc))
            }
            None => None,
        };
        let slots = workers.max(1) + 2;
        let epoch = Instant::now();
        let servers = cfg
            .servers
            .iter()
            .map(|s| {
                let labels = ServerLabels {
                    pool: cfg.name.as_str().into(),
                    server: s.address.as_str().into(),
                };
                let known = previous.and_then(|p| p.learnt(&s.address, epoch));
                let check_ok = cfg.health_check.is_none() || known.is_none_or(|k| k.check_ok);
                // A mark lasts no longer than the new fail_timeout, and
                // none is kept where passive checks are now off.
                let longest = u64::try_from(cfg.fail_timeout.as_millis()).unwrap_or(u64::MAX);
                let down_until_ms = match known {
                    Some(k) if cfg.max_fails > 0 => k.down_until_ms.min(longest),
                    _ => 0,
                };
                // Its healthy gauge is set once the pool is put in
                // service (`Pools::publish`): a reload may yet be refused.
                let series = metrics.server(labels);
                Server {
                    addr: RwLock::new(s.addr),
                    cfg: s.clone(),
                    in_flight: AtomicUsize::new(0),
                    fails: AtomicU32::new(0),
                    down_until_ms: AtomicU64::new(down_until_ms),
                    check_ok: AtomicBool::new(check_ok),
                    outages: Outages::default(),
                    idle: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
                    slots: Arc::new(tokio::sync::Semaphore::new(cfg.max_conns)),
                    waiting: AtomicUsize::new(0),
                    handoff: Mutex::new(VecDeque::new()),
                    series,
                }
            })
            .collect();
        let weights: Vec<(String, u32)> = cfg
            .servers
            .iter()
            .map(|s| (s.address.clone(), s.weight))
            .collect();
        Ok(Pool {
            balancer: Balancer::new(&cfg.balance, &weights),
            cfg: cfg.clone(),
            servers,
            tls,
            epoch,
            series: metrics.pool(&cfg.name),
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            retired: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Counts an error answer of the proxy's (502, 503, 504) for a
    /// request to this pool, and why.
    pub fn count_answer(&self, status: u16, reason: &'static str) {
        self.series.count_answer(status, reason);
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// What this pool knows of the server configured as `address`, for a
    /// pool whose clock starts at `epoch`.
    fn learnt(&self, address: &str, epoch: Instant) -> Option<Learnt> {
        let s = self.servers.iter().find(|s| s.cfg.address == address)?;
        let until = s.down_until_ms.load(Ordering::Relaxed);
        let down_until_ms =
            if until == 0 {
                0
            } else {
                let at = self.epoch + Duration::from_millis(until);
                // Rounded up: a mark never ends early (0 would mean none).
                u64::try_from(at.saturating_duration_since(epoch).as_millis())
                    .map_or(u64::MAX, |ms| if ms == 0 { 0 } else { ms + 1 })
            };
        Some(Learnt {
            check_ok: s.check_ok.load(Ordering::Relaxed),
            down_until_ms,
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether server `i` takes requests now.
    pub(crate) fn in_service(&self, i: usize) -> bool {
        self.servers.get(i).is_some_and(|s| {
            s.check_ok.load(Ordering::Relaxed)
                && s.down_until_ms.load(Ordering::Relaxed) <= self.now_ms()
        })
    }

    /// Picks a server not in `tried` and counts a request in flight on it.
    /// When passive marks have taken out every server the active checks
    /// (if any) still pass, they are ignored: a few slow or failed answers
    /// in a row must not turn a whole pool into 503s for `fail_timeout`
    /// (a one-server pool above all), as nginx never marks a lone server
    /// and Envoy's panic threshold balances over all hosts.
    pub(crate) fn choose(&self, tried: &[usize], key: Option<u64>) -> Option<Lease<'_>> {
        let now = self.now_ms();
        // One reading of each server's state (checked, unmarked), so that
        // the choice below agrees with itself while other threads mark.
        let states: Vec<(bool, bool)> = self
            .servers
            .iter()
            .map(|s| {
                (
                    s.check_ok.load(Ordering::Relaxed),
                    s.down_until_ms.load(Ordering::Relaxed) <= now,
                )
            })
            .collect();
        // Marks are heeded while any checked server is unmarked, tried
        // or not: a retry never goes to a server known to fail.
        let heed_marks = states
            .iter()
            .any(|&(checked, unmarked)| checked && unmarked);
        // Servers below `max_conns` first; when all are at it, the
        // request waits in the queue of the one picked among them all.
        let candidates = |below_cap: bool| -> Vec<Candidate> {
            self.servers
                .iter()
                .zip(&states)
                .enumerate()
                .map(|(i, (s, &(checked, unmarked)))| {
                    let in_flight = s.in_flight.load(Ordering::Relaxed);
                    Candidate {
                        usable: !tried.contains(&i)
                            && checked
                            && (!heed_marks || unmarked)
                            && (!below_cap || in_flight < self.cfg.max_conns),
                        weight: s.cfg.weight,
                        in_flight,
                    }
                })
                .collect()
        };
        let server = match self.balancer.pick(&candidates(true), key) {
            Some(i) => i,
            None => self.balancer.pick(&candidates(false), key)?,
        };
        let s = self.servers.get(server)?;
        s.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            pool: self,
            conn: None,
            server,
        })
    }

    /// The hash key of a request for `balance = "hash"`.
    pub(crate) fn hash_key(
        &self,
        peer: std::net::IpAddr,
        header: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> Option<u64> {
        let tlsgate_config::Balance::Hash(key) = &self.cfg.balance else {
            return None;
        };
        match key {
            HashKey::Source => Some(balance::hash(peer.to_string().as_bytes())),
            HashKey::Header(name) => header(name).map(|v| balance::hash(&v)),
            HashKey::Cookie(name) => {
                let cookies = header("cookie")?;
                cookies
                    .split(|&b| b == b';')
                    .map(|c| c.trim_ascii())
                    .find_map(|c| {
                        let (k, v) = c.split_at_checked(name.len())?;
                        (k == name.as_bytes() && v.first() == Some(&b'='))
                            .then(|| v.get(1..).unwrap_or_default())
                    })
                    .map(balance::hash)
            }
        }
    }

    /// An idle connection of this thread to the lease's server, or a new
    /// one; with `proxy_protocol`, one of `client`'s own, or a new one
    /// introducing it.
    pub(crate) async fn connect(
        &self,
        lease: &mut Lease<'_>,
        client: &ClientConn,
    ) -> Result<(), Failure> {
        let Some(s) = self.servers.get(lease.server) else {
            return Err(Failure::NoServer);
        };
        let usable = |c: &UpstreamConn| {
            c.idle_since.elapsed() < self.cfg.idle_timeout && s.may_reuse(c) && c.looks_alive()
        };
        let header = match self.cfg.proxy_protocol {
            Some(version) => {
                if let Some(mut c) = client.take(self.id, lease.server, usable) {
                    c.reused = true;
                    lease.conn = Some(c);
                    return Ok(());
                }
                Some(client.header(version))
            }
            None => None,
        };
        if let (None, Some(list)) = (&header, s.idle.get(thread_slot() % s.idle.len())) {
            loop {
                let popped = list.lock().unwrap_or_else(|e| e.into_inner()).pop();
                let Some(mut c) = popped else { break };
                s.series.connections_idle.dec();
                if usable(&c) {
                    c.reused = true;
                    lease.conn = Some(c);
                    return Ok(());
                }
            }
        }
        let slot = match self.place(s).await? {
            Place::Free(slot) => slot,
            Place::HandedOver(mut c) => {
                c.reused = true;
                lease.conn = Some(c);
                return Ok(());
            }
        };
        let opened = tokio::time::timeout(
            self.cfg.connect_timeout,
            self.open(lease.server, header.as_deref()),
        )
        .await;
        match opened {
            Ok(Ok(mut c)) => {
                // It introduced this client: its connection alone.
                c.private = header.is_some();
                c.slot = Some(slot);
                lease.conn = Some(c);
                Ok(())
            }
            Ok(Err(f)) => Err(f),
            Err(_) => Err(Failure::ConnectTimeout),
        }
    }

    /// A place under server `s`'s `max_conns` for a new connection: at
    /// once if one is free or an idle connection (of any thread) can be
    /// closed for it, else after a wait in its queue of at most
    /// `queue_timeout` (503 `queue_full` when `queue` requests already
    /// wait, `queue_timeout` when none frees in time). A wait may also
    /// end with a connection done with on this thread, handed over open.
    async fn place(&self, s: &Server) -> Result<Place, Failure> {
        if let Ok(p) = s.slots.clone().try_acquire_owned() {
            return Ok(Place::Free(p));
        }
        // Counted as waiting before the idle lists are looked at: a
        // connection checked in from now on is closed, not kept (see
        // `check_in`), so none can hold a place while this waits.
        let ahead = s.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&s.waiting);
        loop {
            if let Ok(p) = s.slots.clone().try_acquire_owned() {
                return Ok(Place::Free(p));
            }
            if !self.close_one_idle(s) {
                break;
            }
        }
        if ahead >= self.cfg.queue {
            return Err(Failure::QueueFull);
        }
        // Also off the gauge when the wait is called off (a client that
        // left, the exchange's deadline).
        s.series.queued.inc();
        let _queued = Queued(&s.series.queued);
        // In line for a handed-over connection; leaving the line is
        // dropping `handed` (the entry is skipped once closed).
        let (tx, mut handed) = tokio::sync::oneshot::channel();
        {
            let mut line = s.handoff.lock().unwrap_or_else(PoisonError::into_inner);
            if line.len() >= self.cfg.queue.saturating_mul(2).max(16) {
                line.retain(|w| !w.conn.is_closed());
            }
            line.push_back(Waiter {
                slot: thread_slot(),
                conn: tx,
            });
        }
        let wait = async {
            tokio::select! {
                biased;
                c = &mut handed => c.map(Place::HandedOver).map_err(|_| Failure::NoServer),
                // The semaphore is never closed.
                p = s.slots.clone().acquire_owned() => p.map(Place::Free).map_err(|_| Failure::NoServer),
            }
        };
        match tokio::time::timeout(self.cfg.queue_timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(Failure::QueueTimeout),
        }
    }

    /// Hands `conn` (done with, reusable, on this thread) to the oldest
    /// request waiting for a place at its server if that one waits on
    /// this thread; gives it back otherwise (to be closed).
    fn hand_over(s: &Server, conn: UpstreamConn) -> Option<UpstreamConn> {
        let mut line = s.handoff.lock().unwrap_or_else(PoisonError::into_inner);
        let mut conn = conn;
        loop {
            let oldest = line.front()?;
            if oldest.conn.is_closed() {
                line.pop_front();
                continue;
            }
            if oldest.slot != thread_slot() {
                return Some(conn);
            }
            let w = line.pop_front()?;
            // A waiter that left meanwhile gives it back: the next one.
            match w.conn.send(conn) {
                Ok(()) => return None,
                Err(back) => conn = back,
            }
        }
    }

    /// Closes one idle connection to `s` from any thread's list, giving
    /// its place back; `false` when there was none.
    fn close_one_idle(&self, s: &Server) -> bool {
        for list in &s.idle {
            let popped = list.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(c) = popped {
                s.series.connections_idle.dec();
                drop(c);
                return true;
            }
        }
        false
    }

    /// Opens a connection to server `i`: TCP, the PROXY protocol `header`
    /// if any, then TLS if configured.
    pub(crate) async fn open(
        &self,
        i: usize,
        header: Option<&[u8]>,
    ) -> Result<UpstreamConn, Failure> {
        let s = self.servers.get(i).ok_or(Failure::NoServer)?;
        let addr = s.addr();
        let mut tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| self.connect_error(s, &e))?;
        let _ = tcp.set_nodelay(true);
        if let Some(h) = header {
            // Before any byte of TLS: the header is the connection's first.
            tcp.write_all(h).await.map_err(|e| {
                tracing::debug!(pool = %self.cfg.name, server = %s.cfg.address, "PROXY protocol header: {e}");
                Failure::Connect
            })?;
        }
        let stream = match &self.tls {
            None => Stream::Plain(tcp),
            Some((connector, tc)) => {
                let name = tls::server_name(connector, &s.cfg.host).ok_or(Failure::Tls)?;
                let connect = tc.connect(name, tcp);
                // With a client certificate the upstream may ask for, rustls
                // signs inside the handshake's poll: there the signature is
                // awaited, not waited for (the worker serves its other
                // connections meanwhile). The connect timeout above bounds it.
                let handshake = if connector.signs {
                    tlsgate_tls::poll_signing(connect)
                        .await
                        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
                } else {
                    connect.await
                };
                let tls = handshake.map_err(|e| {
                    tracing::warn!(pool = %self.cfg.name, server = %s.cfg.address, "upstream TLS handshake failed: {e}");
                    Failure::Tls
                })?;
                Stream::Tls(Box::new(tls))
            }
        };
        Ok(UpstreamConn::new(
            stream,
            (i, addr),
            s.series.connections_open.clone(),
            s.outages.clone(),
        ))
    }

    /// What a failed `connect` is: the server's failure, or a lack of the
    /// proxy's own resources (descriptors, local ports, buffers), which
    /// says nothing of the server and must not take it out of service.
    fn connect_error(&self, s: &Server, e: &std::io::Error) -> Failure {
        match local_shortage(e) {
            Some(what) => {
                warn_local_shortage(&self.cfg.name, &s.cfg.address, what, e);
                Failure::LocalResources
            }
            None => {
                tracing::debug!(pool = %self.cfg.name, server = %s.cfg.address, "connect: {e}");
                Failure::Connect
            }
        }
    }

    /// The PROXY protocol header of a connection the proxy opens for
    /// itself (a health check), if the pool sends one.
    pub(crate) fn own_header(&self) -> Option<Vec<u8>> {
        self.cfg.proxy_protocol.map(client::local_header)
    }

    /// Keeps a connection whose last exchange ended cleanly for reuse by
    /// this thread, or by `client` alone when it carries its header
    /// (dropped when the list is full).
    pub(crate) fn check_in(&self, mut conn: UpstreamConn, client: &ClientConn) {
        let Some(s) = self.servers.get(conn.server) else {
            return;
        };
        if !s.may_reuse(&conn) {
            return;
        }
        if self.is_retired() {
            return;
        }
        // Requests wait for a place: this connection's, closed now, is
        // theirs (kept idle, it would hold it). Under the list's lock
        // below for the shared lists, so that a request that begins to
        // wait either finds it in a list or sees it closed.
        if conn.private {
            if s.waiting.load(Ordering::SeqCst) > 0 {
                return;
            }
            client.keep(self.id, conn, (self.cfg.idle_timeout, self.cfg.max_idle));
            return;
        }
        let Some(list) = s.idle.get(thread_slot() % s.idle.len()) else {
            return;
        };
        let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock: `retire` empties every list after setting it.
        if self.is_retired() {
            return;
        }
        if s.waiting.load(Ordering::SeqCst) > 0 {
            drop(list);
            // Given back when the oldest waits on another thread: closed.
            drop(Self::hand_over(s, conn));
            return;
        }
        // Expired ones first, so the list does not fill with dead ones
        // (one clock read for all of them).
        let now = Instant::now();
        let before = list.len();
        list.retain(|c| now.saturating_duration_since(c.idle_since) < self.cfg.idle_timeout);
        let expired = before - list.len();
        s.series.connections_idle.dec_by(expired as i64);
        if list.len() < self.cfg.max_idle {
            conn.idle_since = now;
            list.push(conn);
            s.series.connections_idle.inc();
        }
    }

    /// A failure while a response body was relayed: as [`Self::failed`],
    /// except that a total timeout is only counted. The exchange's time
    /// also ran while the client took the body, so a client reading slowly
    /// (on purpose, say, several at once) would put servers out of service.
    pub(crate) fn failed_relaying(&self, i: usize, f: Failure) {
        match (f, self.servers.get(i)) {
            (Failure::TotalTimeout, Some(s)) => s.series.count_error(f.reason()),
            (Failure::TotalTimeout, None) => {}
            _ => self.failed(i, f),
        }
    }

    /// Counts a failure against server `i` (passive checks): after
    /// `max_fails` in a row it is out for `fail_timeout`.
    pub(crate) fn failed(&self, i: usize, f: Failure) {
        let Some(s) = self.servers.get(i) else { return };
        s.series.count_error(f.reason());
        if !f.marks_server() || self.cfg.max_fails == 0 {
            return;
        }
        let n = s.fails.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.cfg.max_fails {
            s.fails.store(0, Ordering::Relaxed);
            let until = self.now_ms().saturating_add(
                u64::try_from(self.cfg.fail_timeout.as_millis()).unwrap_or(u64::MAX),
            );
            s.down_until_ms.store(until, Ordering::Relaxed);
            s.outages.record();
            tracing::warn!(
                pool = %self.cfg.name,
                server = %s.cfg.address,
                "upstream server out for {:?} after {n} failures in a row (last: {})",
                self.cfg.fail_timeout,
                f.reason()
            );
            // Its connections are suspect: those idle in other threads'
            // lists and clients' private ones go when next looked at
            // (`outages`), this thread's now.
            if let Some(list) = s.idle.get(thread_slot() % s.idle.len()) {
                let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
                s.series.connections_idle.dec_by(list.len() as i64);
                list.clear();
            }
        }
        self.update_health_gauge(i);
    }

    /// Clears server `i`'s failure count after a good exchange.
    pub(crate) fn succeeded(&self, i: usize, latency: Duration) {
        let Some(s) = self.servers.get(i) else { return };
        s.fails.store(0, Ordering::Relaxed);
        // Back from a passive mark: the gauge says so again.
        self.update_health_gauge(i);
        s.series.response_seconds.observe(latency.as_secs_f64());
    }

    /// Points server `i`'s new connections at `addr` (its name resolved
    /// anew); idle connections to the old address are let go as they are
    /// taken or checked in. `false` when it was already there.
    pub(crate) fn readdress(&self, i: usize, addr: SocketAddr) -> bool {
        let Some(s) = self.servers.get(i) else {
            return false;
        };
        let mut current = s.addr.write().unwrap_or_else(|e| e.into_inner());
        if *current == addr {
            return false;
        }
        tracing::info!(pool = %self.cfg.name, server = %s.cfg.address, "upstream server now resolves to {addr} (was {})", *current);
        *current = addr;
        true
    }

    pub(crate) fn count_request(&self, i: usize) {
        if let Some(s) = self.servers.get(i) {
            s.series.requests.inc();
        }
    }

    /// Counts a try made again after one failed on server `failed_on`.
    pub(crate) fn count_retry(&self, failed_on: usize) {
        if let Some(s) = self.servers.get(failed_on) {
            s.series.retries.inc();
        }
    }

    /// Whether a reload replaced this pool's generation.
    pub(crate) fn is_retired(&self) -> bool {
        *self.retired.borrow()
    }

    /// Tells this pool's background tasks to end when it is retired (or
    /// dropped); holds no reference to the pool.
    pub(crate) fn retirement(&self) -> tokio::sync::watch::Receiver<bool> {
        self.retired.subscribe()
    }

    /// See [`Pool::retired`](Self): ends the background tasks, closes the
    /// idle connections.
    fn retire(&self) {
        self.retired.send_replace(true);
        for s in &self.servers {
            for list in &s.idle {
                let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
                s.series.connections_idle.dec_by(list.len() as i64);
                list.clear();
            }
        }
    }

    pub(crate) fn update_health_gauge(&self, i: usize) {
        // The series is shared with the pool of the same name that
        // replaced this one: it alone writes there.
        if self.is_retired() {
            return;
        }
        if let Some(s) = self.servers.get(i) {
            s.series.healthy.set(i64::from(self.in_service(i)));
        }
    }
}

/// What a request gets under a server's `max_conns`.
enum Place {
    /// A place for a connection it opens.
    Free(tokio::sync::OwnedSemaphorePermit),
    /// An open connection another request of this thread was done with.
    HandedOver(UpstreamConn),
}

/// A request waiting for a place, in line for a handed-over connection.
struct Waiter {
    /// The thread slot it waits on (see `thread_slot`).
    slot: usize,
    conn: tokio::sync::oneshot::Sender<UpstreamConn>,
}

/// Counts a request waiting for a place while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps a request on the `queued` gauge while it lives.
struct Queued<'a>(&'a tlsgate_metrics::types::Gauge);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What ran out when `connect` failed for want of the proxy's own
/// resources (Linux errno values, as in the server's accept loop), or
/// `None` for an error that may be the server's.
fn local_shortage(e: &std::io::Error) -> Option<&'static str> {
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const EADDRNOTAVAIL: i32 = 99;
    const ENOBUFS: i32 = 105;
    match e.raw_os_error()? {
        EMFILE => Some("file descriptors (EMFILE: the process's RLIMIT_NOFILE)"),
        ENFILE => Some("file descriptors (ENFILE: the system's file table)"),
        EADDRNOTAVAIL => Some("local ports or addresses (EADDRNOTAVAIL)"),
        ENOBUFS => Some("socket buffers (ENOBUFS)"),
        ENOMEM => Some("memory (ENOMEM)"),
        _ => None,
    }
}

/// Warns that connections to upstream servers failed for want of the
/// proxy's own resources: at most once per 10 s, with how many failed
/// since the last warning.
fn warn_local_shortage(pool: &str, server: &str, what: &str, e: &std::io::Error) {
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let count = match &mut *last {
        Some((at, n)) if now.saturating_duration_since(*at) < Duration::from_secs(10) => {
            *n += 1;
            return;
        }
        Some((_, n)) => std::mem::take(n) + 1,
        None => 1,
    };
    *last = Some((now, 0));
    drop(last);
    tracing::warn!(
        pool,
        server,
        "cannot connect to upstream servers: the proxy ran out of {what} ({e}); \
         {count} connect(s) failed so since the last warning, answered 503 \
         (upstream_error=local_resources) without marking the servers down"
    );
}

/// Every pool of a generation, by `[[upstream]]` index.
pub struct Pools {
    pub(crate) pools: Vec<Arc<Pool>>,
    /// The worker threads their idle lists are for.
    pub(crate) workers: usize,
}

impl Pools {
    /// Builds the pools of `config` (none when it has no `[[upstream]]`);
    /// on a reload, `previous` are the running ones, whose servers' states
    /// carry over (see [`Pool::new`]), and their worker count, which a
    /// reload cannot change.
    ///
    /// `files`: the CA bundles and client certificates, as the holder of
    /// the keys read them.
    pub fn build(
        config: &tlsgate_config::Config,
        metrics: &ProxyMetrics,
        previous: Option<&Pools>,
        files: tls::PoolFiles<'_>,
    ) -> Result<Pools, ConfigError> {
        // The worker threads are those started with the first
        // configuration (a changed `server.workers` waits for a restart):
        // one idle list each, not one per worker the new file names.
        let workers = previous.map_or(config.workers, |p| p.workers);
        let pools = config
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let before = previous
                    .and_then(|p| p.pools.iter().find(|p| p.cfg.name == u.name))
                    .map(|p| &**p);
                let client = files.clients.get(i).and_then(Option::as_ref);
                Pool::new(&config.origin, u, workers, metrics, before, (files, client))
                    .map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        Ok(Pools { pools, workers })
    }

    /// Pool number `i` (`RouteTarget::Upstream(i)`).
    pub fn get(&self, i: usize) -> Option<&Arc<Pool>> {
        self.pools.get(i)
    }

    /// Sets the servers' `healthy` gauges (shared by every generation's
    /// pool of that name) to what these pools know: called when they are
    /// put in service.
    pub fn publish(&self) {
        for p in &self.pools {
            for i in 0..p.servers.len() {
                p.update_health_gauge(i);
            }
        }
    }

    /// Retires these pools when a reload replaced their generation: health
    /// checks and name resolution stop (within a check's timeout), idle
    /// connections are closed and none are kept from now on, the gauges
    /// are left to the new pools. Requests in flight on them finish, on
    /// connections opened anew if they need one.
    pub fn retire(&self) {
        for p in &self.pools {
            p.retire();
        }
    }

    /// Starts the active health checks of every pool that has them and the
    /// resolution of server names again, each on a thread of its own that
    /// ends once these pools are dropped (after a reload, when the last
    /// request of the old generation is done).
    pub fn start_background_tasks(&self) -> std::io::Result<()> {
        crate::health::start(&self.pools)?;
        crate::resolve::start(&self.pools)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A pool `app` of three servers (not listening: never connected to
    /// here) with `keys`, and the running pool `previous` if any.
    fn pool(keys: &str, previous: Option<&Pool>) -> Pool {
        let servers = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"].map(str::parse);
        pool_of(&servers.map(Result::unwrap), keys, previous)
    }

    /// A pool `app` of one server at `addr` with `keys`.
    fn pool_at(addr: SocketAddr, keys: &str) -> Pool {
        pool_of(&[addr], keys, None)
    }

    /// The configuration of [`pool_of`] with `[server] workers`.
    fn config_of(
        dir: &std::path::Path,
        servers: &[SocketAddr],
        keys: &str,
        workers: usize,
    ) -> tlsgate_config::Config {
        let path = dir.join("t.toml");
        let servers: String = servers
            .iter()
            .map(|a| format!("[[upstream.server]]\naddress = \"{a}\"\n"))
            .collect();
        std::fs::write(
            &path,
            format!(
                "[server]\nworkers = {workers}\n[[upstream]]\nname = \"app\"\n{keys}\n{servers}\
                 [[listener]]\nlisten = [\"127.0.0.1:0\"]\nroot = \"/tmp\"\nself_signed = true\n"
            ),
        )
        .unwrap();
        tlsgate_config::load(Some(&path), &Default::default(), dir).unwrap()
    }

    #[test]
    fn a_reload_keeps_one_idle_list_per_running_worker() {
        let dir = tempfile::tempdir().unwrap();
        let servers = ["127.0.0.1:1".parse().unwrap()];
        let metrics = tlsgate_metrics::Metrics::new().proxy;
        let first = Pools::build(
            &config_of(dir.path(), &servers, "", 8),
            &metrics,
            None,
            DISK,
        )
        .unwrap();
        let idle_lists = |p: &Pools| p.pools[0].servers[0].idle.len();
        assert_eq!(idle_lists(&first), 10);
        // `server.workers = 2` waits for a restart: the 8 threads still
        // each need a list of their own.
        let fewer = config_of(dir.path(), &servers, "", 2);
        let reloaded = Pools::build(&fewer, &metrics, Some(&first), DISK).unwrap();
        assert_eq!(idle_lists(&reloaded), 10);
        let again = Pools::build(&fewer, &metrics, Some(&reloaded), DISK).unwrap();
        assert_eq!(idle_lists(&again), 10);
    }

    #[test]
    fn a_retired_pool_keeps_no_idle_connection_and_leaves_the_gauge() {
        let dir = tempfile::tempdir().unwrap();
        let servers = ["127.0.0.1:1".parse().unwrap()];
        let metrics = tlsgate_metrics::Metrics::new().proxy;
        let config = config_of(dir.path(), &servers, "", 1);
        let old = Pools::build(&config, &metrics, None, DISK).unwrap();
        old.publish();
        let new = Pools::build(&config, &metrics, Some(&old), DISK).unwrap();
        new.publish();
        old.retire();
        assert!(old.pools[0].is_retired());
        // A passive mark on the old pool's server stays out of the series
        // the new pool reports in.
        for _ in 0..old.pools[0].cfg.max_fails.max(1) {
            old.pools[0].failed(0, Failure::Connect);
        }
        assert_eq!(new.pools[0].servers[0].series.healthy.get(), 1);
    }

    fn pool_of(servers: &[SocketAddr], keys: &str, previous: Option<&Pool>) -> Pool {
        let dir = tempfile::tempdir().unwrap();
        let config = config_of(dir.path(), servers, keys, 1);
        let metrics = tlsgate_metrics::Metrics::new().proxy;
        Pool::new(
            "t",
            &config.upstreams[0],
            1,
            &metrics,
            previous,
            (DISK, None),
        )
        .unwrap()
    }

    fn read_from_disk(p: &std::path::Path) -> std::io::Result<Arc<Vec<u8>>> {
        std::fs::read(p).map(Arc::new)
    }

    /// The pools' files read here, as with `key_isolation = false`; no
    /// client certificates.
    const DISK: tls::PoolFiles<'static> = tls::PoolFiles {
        read: &read_from_disk,
        clients: &[],
    };

    /// Leases server 0 and connects; the connection, and whether it was
    /// an idle one.
    async fn lease(p: &Pool, client: &ClientConn) -> (UpstreamConn, bool) {
        let mut l = p.choose(&[], None).unwrap();
        p.connect(&mut l, client).await.unwrap();
        let c = l.conn.take().unwrap();
        let reused = c.reused;
        (c, reused)
    }

    #[tokio::test]
    async fn connections_opened_before_an_outage_are_not_reused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The server holds every connection open: none looks closed.
        let held = tokio::spawn(async move {
            let mut peers = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                peers.push(s);
            }
        });
        for keys in ["max_fails = 1", "max_fails = 1\nproxy_protocol = \"v2\""] {
            let p = pool_at(addr, keys);
            let client = ClientConn::new("203.0.113.7:1".parse().unwrap(), None);
            // Reuse works: checked in, taken again.
            let (c, reused) = lease(&p, &client).await;
            assert!(!reused, "{keys}");
            p.check_in(c, &client);
            let (in_flight, reused) = lease(&p, &client).await;
            assert!(reused, "{keys}: an idle connection is reused");
            // The server is marked (and the mark ends at once) while that
            // connection is in flight and another is idle.
            let (idle, _) = lease(&p, &client).await;
            p.check_in(idle, &client);
            mark(&p, 0);
            p.servers[0].clear_mark();
            // Neither is reused: the idle one is not taken, the one in
            // flight is not kept.
            p.check_in(in_flight, &client);
            let (fresh, reused) = lease(&p, &client).await;
            assert!(
                !reused,
                "{keys}: a connection from before the mark was reused"
            );
            // Connections opened since are reused again.
            p.check_in(fresh, &client);
            assert!(lease(&p, &client).await.1, "{keys}");
            // So after a failing health check.
            let (c, _) = lease(&p, &client).await;
            p.check_in(c, &client);
            p.servers[0].outages.record();
            assert!(!lease(&p, &client).await.1, "{keys}");
        }
        held.abort();
    }

    fn mark(p: &Pool, i: usize) {
        p.failed(i, Failure::Connect);
    }

    #[test]
    fn marks_are_heeded_on_retries_and_ignored_only_when_all_are_marked() {
        let p = pool("max_fails = 1", None);
        mark(&p, 0);
        // Retries after 1 and 2 failed: never to 0, which is marked.
        assert!(p.choose(&[1, 2], None).is_none());
        assert!(p.choose(&[1], None).is_some_and(|l| l.server == 2));
        // Every server marked: they are tried anyway.
        mark(&p, 1);
        mark(&p, 2);
        let l = p.choose(&[], None).unwrap();
        assert!(l.server < 3);
    }

    #[test]
    fn a_reload_keeps_marks_no_longer_than_the_new_fail_timeout() {
        let old = pool("max_fails = 1\nfail_timeout = \"1h\"", None);
        mark(&old, 0);
        let kept = pool("max_fails = 1\nfail_timeout = \"5s\"", Some(&old));
        let until = kept.servers[0].down_until_ms.load(Ordering::Relaxed);
        assert!((1..=5_000).contains(&until), "{until}");
        assert!(!kept.in_service(0) && kept.in_service(1));
        // Passive checks turned off: no mark survives.
        let off = pool("max_fails = 0", Some(&old));
        assert!(off.in_service(0));
    }
}
