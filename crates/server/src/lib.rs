//! The tlsgate server: worker threads and their listeners, the life of a
//! client connection (TLS handshake, HTTP/1.1, static files), limits and
//! timeouts, the admin listener, the access log, reload on SIGHUP and
//! graceful shutdown on SIGTERM/SIGINT.
//!
//! The binary only parses the command line and calls [`run`].
#![forbid(unsafe_code)]

/// Public for the fuzzer, which formats records of hostile bytes and reads
/// the lines back.
pub mod access_log;
mod admin;
mod buffers;
mod conn;
mod descriptors;
mod flood;
mod generation;
mod h2;
mod http;
mod keys;
mod limiter;
mod privileges;
mod proxy;
pub mod proxy_protocol;
mod refusals;
mod respond;
mod tickets;
mod transport;
mod worker;
mod xdp;

use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use tlsgate_config::{Config, ConfigError, Overrides};
use tlsgate_metrics::{Metrics, ResultLabel};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

pub use access_log::AccessLog;
pub use generation::Generation;
/// HTTP/2 frame followers of the flood guard, public for the fuzzer.
pub use h2::frames as h2_frames;
pub use http::INLINE_BODY_MAX;
pub use tickets::TicketCache;
pub use tlsgate_tls::SelfSignedCache;
pub use transport::Transport;

use flood::HandshakeLimiter;
use keys::Keys;
use limiter::ConnLimiter;
use worker::WorkerSocket;

/// Why tlsgate could not start. Every variant is an operator's problem to
/// fix (the binary exits with status 2).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration (file, flags, certificates, roots) is wrong.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A listening socket could not be opened.
    #[error("{origin}: key `{key}`: cannot listen: {source}")]
    Listen {
        /// Config origin.
        origin: String,
        /// The key naming the address.
        key: String,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// Something else the process needs (threads, runtime, log file).
    #[error("cannot start: {0}")]
    Io(#[from] std::io::Error),
    /// The key process could not be started or used.
    #[error("{0}")]
    Keys(#[from] tlsgate_keyserver::KeyError),
    /// `server.user` / `server.group` could not be applied.
    #[error("cannot drop privileges: {0}")]
    Privileges(String),
    /// XDP SynGate (`[xdp]`, not optional) could not be attached.
    #[error("{origin}: [xdp]: {message}")]
    Xdp {
        /// Config origin.
        origin: String,
        /// What failed (the verifier's log included).
        message: String,
    },
}

/// How long the end of shutdown waits for the access log to be written.
const FINAL_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// State shared by the main thread and every worker.
pub struct Shared {
    /// The running generation; replaced whole on reload.
    pub current: ArcSwap<Generation>,
    /// Generations a reload replaced, while connections still hold them:
    /// the workers sweep their file caches too.
    retired: Mutex<Vec<std::sync::Weak<Generation>>>,
    /// Metrics.
    pub metrics: Metrics,
    /// Connection limits.
    limiter: Arc<ConnLimiter>,
    /// Handshake flood limits.
    handshakes: Arc<HandshakeLimiter>,
    /// Rate-limited warnings about connections the limits refused.
    refusals: refusals::RefusalWarnings,
    /// Rate-limited warnings about trusted balancers' bad PROXY headers.
    proxy_header_warnings: refusals::RefusalWarnings,
    /// Requests answered 503 for want of a file descriptor.
    descriptor_warnings: refusals::RefusalWarnings,
    /// accept() calls that failed and paused a listener.
    accept_warnings: refusals::RefusalWarnings,
    /// Access log writer.
    pub access_log: AccessLog,
    /// Becomes true when shutdown starts.
    pub shutdown: watch::Sender<bool>,
    /// What the kernel offers for TLS offload, probed once at start.
    pub ktls: tlsgate_sys::ktls::Support,
    /// Whether the key process signs (for `/healthz`).
    pub(crate) key_state: keys::KeyHealth,
}

impl Shared {
    /// The generations a reload replaced that connections still hold.
    pub(crate) fn retired_generations(&self) -> Vec<Arc<Generation>> {
        self.retired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }
}

/// Where the configuration comes from, kept for reloads.
#[derive(Debug, Clone)]
pub struct Launch {
    /// `--config FILE`, or `None` for built-in defaults.
    pub config_path: Option<PathBuf>,
    /// Command-line overrides.
    pub overrides: Overrides,
    /// Document root of the built-in default.
    pub default_root: PathBuf,
}

impl Launch {
    /// Reads and validates the configuration it names.
    pub fn load(&self) -> Result<Config, ConfigError> {
        tlsgate_config::load(
            self.config_path.as_deref(),
            &self.overrides,
            &self.default_root,
        )
    }
}

/// Validates everything `launch` names without serving: the config, the
/// certificates and keys, the document roots.
pub fn check(launch: &Launch) -> Result<Config, StartError> {
    // Without key isolation it reads the private keys itself.
    privileges::protect_memory()?;
    let config = launch.load()?;
    let ids = privileges::resolve(&config)?;
    access_log::check_target(&config, ids)?;
    let keys = Keys::start(&config, launch)?;
    let certs = keys.certificates(&config, &[])?;
    let metrics = Metrics::new();
    let gen = generation::build(
        config,
        certs,
        &TicketCache::checking(ids.map(|i| i.uid)),
        &metrics.proxy,
        None,
    )?;
    Ok(gen.config)
}

/// Finds what kernel TLS the running kernel offers, says so once in the
/// log and in the metrics.
fn probe_ktls(metrics: &Metrics) -> tlsgate_sys::ktls::Support {
    let support = tlsgate_sys::ktls::probe();
    match &support.unavailable {
        None => tracing::info!("kernel TLS offload {}", support.summary()),
        Some(why) => {
            tracing::info!("kernel TLS offload unavailable, all TLS stays in user space: {why}")
        }
    }
    metrics
        .ktls_available
        .set(i64::from(support.unavailable.is_none()));
    for (direction, list) in [("tx", &support.tx), ("rx", &support.rx)] {
        for (v, c) in list {
            metrics
                .ktls_supported
                .get_or_create(&tlsgate_metrics::KtlsLabels {
                    direction,
                    version: v.name(),
                    cipher: c.name(),
                })
                .set(1);
        }
    }
    support
}

/// Runs the server until SIGTERM or SIGINT, then drains and returns.
pub fn run(launch: Launch) -> Result<(), StartError> {
    privileges::protect_memory()?;
    let config = launch.load()?;
    // Before any descriptor is opened for serving: the default soft limit
    // (1024 under systemd) is below what the default limits may hold.
    descriptors::check(&config, tlsgate_sys::rlimit::raise_nofile());
    let ids = privileges::resolve(&config)?;
    // Before any socket: a log that cannot be opened stops the start here,
    // naming its key, not after the listeners are up.
    access_log::check_target(&config, ids)?;
    // The key process is started while we still have privileges, so that
    // it keeps them (and can be restarted) after we drop ours.
    let keys = Keys::start(&config, &launch)?;
    let certs = keys.certificates(&config, &[])?;
    let mut metrics = Metrics::new();
    let tickets = TicketCache::serving(&metrics, ids.map(|i| i.uid));
    let gen = generation::build(config, certs, &tickets, &metrics.proxy, None)?;
    tickets
        .commit(gen.ticket_keys.as_ref())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    gen.pools.publish();
    keys.set_active(gen.key_ids.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Signal handlers come first: a signal that arrives once we say we are
    // listening must reach us, not kill us.
    let (mut term, mut int, mut hup, mut usr1) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
            // Log rotation written for nginx sends USR1; its default
            // action would kill us without a drain.
            signal(SignalKind::user_defined1())?,
        )
    };

    // Open every socket before starting anything: nothing half-started.
    let workers = gen.config.workers;
    let mut per_worker: Vec<Vec<WorkerSocket>> = (0..workers).map(|_| Vec::new()).collect();
    let mut announced = Vec::new();
    let listen = tlsgate_sys::ListenOptions {
        backlog: gen.config.backlog,
        defer_accept: gen.config.defer_accept,
    };
    for (i, l) in gen.config.listeners.iter().enumerate() {
        for addr in &l.addrs {
            let group = tlsgate_sys::reuseport_group(*addr, listen, workers).map_err(|e| {
                StartError::Listen {
                    origin: gen.config.origin.clone(),
                    key: format!("{}.listen", l.key_path),
                    source: std::io::Error::new(e.source.kind(), e.to_string()),
                }
            })?;
            if let Some(first) = group.first() {
                announced.push((first.local_addr()?, l.root.clone()));
            }
            for (w, socket) in group.into_iter().enumerate() {
                if let Some(slot) = per_worker.get_mut(w) {
                    slot.push(WorkerSocket {
                        listener: i,
                        socket,
                    });
                }
            }
        }
    }
    let admin = match gen.config.admin {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr).map_err(|source| StartError::Listen {
                origin: gen.config.origin.clone(),
                key: "admin.listen".into(),
                source,
            })?;
            l.set_nonblocking(true)?;
            Some(l)
        }
        None => None,
    };
    // Attaching XDP needs the privileges we are about to drop; the program
    // goes when `gate` does (or with the process).
    let gate = xdp::Gate::start(&gen.config, &mut metrics)?;
    // Probed with our privileges: the kernel loads the `tls` module on
    // first use only for CAP_NET_ADMIN.
    let ktls = probe_ktls(&metrics);
    // Every socket is bound and no thread runs yet: drop privileges now.
    privileges::drop(
        ids,
        gen.config.keys.isolation,
        gen.config.privileges.core_dumps,
    )?;
    // A thread of their own: started once privileges are gone.
    gen.pools.start_background_tasks()?;
    let access_log = AccessLog::start(
        &gen.config.access_log.target,
        gen.config.access_log.format,
        metrics.access_log_dropped.clone(),
    )?;

    let (shutdown, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        current: ArcSwap::from_pointee(gen),
        retired: Mutex::new(Vec::new()),
        metrics,
        limiter: Arc::new(ConnLimiter::default()),
        handshakes: Arc::new(HandshakeLimiter::default()),
        refusals: refusals::RefusalWarnings::default(),
        proxy_header_warnings: refusals::RefusalWarnings::default(),
        descriptor_warnings: refusals::RefusalWarnings::default(),
        accept_warnings: refusals::RefusalWarnings::default(),
        access_log,
        shutdown,
        ktls,
        key_state: keys::KeyHealth::default(),
    });
    let (rekey, mut rekeyed) = tokio::sync::mpsc::unbounded_channel();
    keys.start_threads(&shared, rekey)?;
    tickets
        .start_threads()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut threads = Vec::with_capacity(workers);
    for (id, sockets) in per_worker.into_iter().enumerate() {
        threads.push(worker::spawn(id, shared.clone(), sockets)?);
    }
    for (addr, root) in &announced {
        tracing::info!(
            "listening on https://{addr} serving {} with {workers} workers",
            root.display()
        );
    }
    for l in &shared.current.load().config.listeners {
        if !l.proxy_protocol_from.is_empty() {
            tracing::info!(
                "{}: connections from {} must begin with a PROXY protocol header",
                l.key_path,
                l.proxy_protocol_from
            );
        }
    }

    let (reload_events, mut reload_done) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(Mutex::new(Some(gate)));
    let mut reloads = Reloader {
        launch: Arc::new(launch),
        shared: shared.clone(),
        keys: Arc::new(keys),
        tickets: Arc::new(tickets),
        gate: gate.clone(),
        events: reload_events,
        running: false,
        queued: None,
    };
    rt.block_on(async {
        if let Some(l) = admin {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!("admin listening on http://{}/metrics", l.local_addr()?);
            tokio::spawn(admin::serve(shared.clone(), l));
        }
        // SynGate's interface may be deleted under it: checked every second.
        let mut xdp_watch = tokio::time::interval(std::time::Duration::from_secs(1));
        xdp_watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A reload runs on a thread of its own (see `Reloader`): this loop
        // keeps answering signals, and the admin listener its probes, while
        // one resolves names or waits for the key server.
        let held = || {
            gate.try_lock()
                .is_ok_and(|g| g.as_ref().is_some_and(xdp::Gate::is_held))
        };
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => reloads.request(true),
                _ = usr1.recv() => reopen_log(&shared),
                Some(()) = rekeyed.recv() => reloads.request(false),
                Some(event) = reload_done.recv() => reloads.event(event),
                _ = xdp_watch.tick(), if held() => {
                    if let Ok(mut g) = gate.try_lock() {
                        if let Some(g) = g.as_mut() {
                            g.watch();
                        }
                    }
                }
            }
        }
        if reloads.running {
            // Its thread may still be waiting (a name, the key server):
            // what it builds is dropped, never put in service.
            tracing::info!("shutdown: the reload under way is abandoned");
        }
        // Its thread's result has nowhere to go (the key client stays, for
        // the handshakes of the grace period).
        drop(reload_done);
        // Shutdown runs on this runtime too: the admin listener lives here,
        // and /healthz must answer 503 while requests in flight finish.
        let grace = shared.current.load().config.shutdown_timeout;
        tracing::info!(
            "shutting down: no new connections, finishing requests in flight (up to {grace:?})"
        );
        shared.shutdown.send_replace(true);
        let finishing = shared.clone();
        let finished = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
            finishing.access_log.flush(FINAL_FLUSH)
        });
        // The workers end by their grace period; a flush by its own limit.
        match tokio::time::timeout(grace + FINAL_FLUSH + FINAL_FLUSH, finished).await {
            Ok(Ok(0)) => {}
            Ok(Ok(lost)) => tracing::warn!(
                "{lost} access log lines not written: the log's output did not take them within {FINAL_FLUSH:?}"
            ),
            Ok(Err(e)) => tracing::error!("shutdown: {e}"),
            Err(_) => tracing::warn!("workers still running at the shutdown deadline; exiting anyway"),
        }
        Ok::<(), std::io::Error>(())
    })?;
    // Not waiting for a join or flush that the deadline above gave up on.
    rt.shutdown_background();
    // Waits only for an XDP refresh under way on a reload thread.
    drop(gate.lock().unwrap_or_else(PoisonError::into_inner).take());
    tracing::info!("stopped");
    Ok(())
}

/// What a reload's thread tells the main loop.
enum ReloadEvent {
    /// The new generation, or why there is none. The main loop puts it in
    /// service (or logs the refusal) and, when it did, sends back the key
    /// ids for the key server to keep.
    Built(
        Box<Result<Generation, StartError>>,
        std_mpsc::Sender<Vec<u64>>,
    ),
    /// The thread is done.
    Done,
}

/// Reloads, one at a time, each built on a thread of its own: reading the
/// configuration, resolving upstream names, the key server's Load call
/// and the XDP refresh may each take seconds, and the main loop must keep
/// answering `/healthz` and SIGTERM meanwhile. A SIGHUP (or key change)
/// that comes during a reload is coalesced: one more reload runs when the
/// current one ends, however many came. Only the main loop puts a built
/// generation in service, so a SIGTERM during a reload drops it.
struct Reloader {
    launch: Arc<Launch>,
    shared: Arc<Shared>,
    keys: Arc<Keys>,
    tickets: Arc<TicketCache>,
    gate: Arc<Mutex<Option<xdp::Gate>>>,
    events: tokio::sync::mpsc::UnboundedSender<ReloadEvent>,
    /// A reload's thread is running.
    running: bool,
    /// Asked for while one ran; `true`: by SIGHUP (XDP is refreshed too).
    queued: Option<bool>,
}

impl Reloader {
    /// Starts a reload, or queues one if a reload is under way.
    /// `refresh_xdp`: a SIGHUP's, which also re-reads what XDP advertises.
    fn request(&mut self, refresh_xdp: bool) {
        if self.running {
            if self.queued.is_none() {
                tracing::info!("reload requested during a reload: it runs when this one ends");
            }
            self.queued = Some(self.queued.unwrap_or(false) || refresh_xdp);
            return;
        }
        let (launch, shared, keys, tickets, gate, events) = (
            self.launch.clone(),
            self.shared.clone(),
            self.keys.clone(),
            self.tickets.clone(),
            self.gate.clone(),
            self.events.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || {
                if refresh_xdp {
                    if let Some(g) = gate.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                        g.refresh();
                    }
                }
                let built = build_reload(&launch, &shared, &keys, &tickets);
                let (ack, accepted) = std_mpsc::channel();
                if events
                    .send(ReloadEvent::Built(Box::new(built), ack))
                    .is_ok()
                {
                    // After the swap: the key server lets go of the keys
                    // only the replaced generation used.
                    if let Ok(ids) = accepted.recv() {
                        keys.set_active(ids);
                    }
                }
                let _ = events.send(ReloadEvent::Done);
            });
        match spawned {
            Ok(_) => self.running = true,
            Err(e) => refused(
                &self.shared,
                StartError::Io(std::io::Error::other(format!(
                    "cannot start the reload's thread: {e}"
                ))),
            ),
        }
    }

    /// What a reload's thread reported.
    fn event(&mut self, event: ReloadEvent) {
        match event {
            ReloadEvent::Built(built, ack) => match *built {
                Ok(new) => {
                    let ids = new.key_ids.clone();
                    accept(&self.shared, &self.tickets, new);
                    let _ = ack.send(ids);
                }
                Err(e) => refused(&self.shared, e),
            },
            ReloadEvent::Done => {
                self.running = false;
                if let Some(refresh_xdp) = self.queued.take() {
                    self.request(refresh_xdp);
                }
            }
        }
    }
}

/// Rebuilds the generation from the same sources (on a reload's thread),
/// checking that it can replace the running one.
fn build_reload(
    launch: &Launch,
    shared: &Shared,
    keys: &Keys,
    tickets: &TicketCache,
) -> Result<Generation, StartError> {
    let c = launch.load()?;
    // As the user we now run as: the writer opens it after this.
    access_log::check_target(&c, None)?;
    let running = shared.current.load();
    let certs = keys.certificates(&c, &running.key_ids)?;
    let new = generation::build(c, certs, tickets, &shared.metrics.proxy, Some(&running))?;
    let old = &running;
    let addrs = |g: &Generation| {
        g.config
            .listeners
            .iter()
            .map(|l| l.addrs.clone())
            .collect::<Vec<_>>()
    };
    if addrs(&new) != addrs(old) {
        return Err(StartError::Config(ConfigError::new(
            &new.config.origin,
            "listener",
            "listen addresses changed; a restart is needed to apply that",
        )));
    }
    if new.config.workers != old.config.workers || new.config.admin != old.config.admin {
        tracing::warn!("server.workers and admin.listen take effect at the next restart");
    }
    if new.config.backlog != old.config.backlog
        || new.config.defer_accept != old.config.defer_accept
    {
        tracing::warn!(
            "server.backlog and defer_accept take effect at the next restart (the listeners stay open)"
        );
    }
    if new.config.xdp != old.config.xdp {
        tracing::warn!("[xdp] changes take effect at the next restart");
    }
    if new.config.keys != old.config.keys || new.config.privileges != old.config.privileges {
        tracing::warn!(
            "server.key_isolation, key_timeout, user, group and core_dumps take effect at the next restart"
        );
    }
    Ok(new)
}

/// Puts a reloaded generation in service (on the main loop) and retires
/// the one it replaces.
fn accept(shared: &Shared, tickets: &TicketCache, new: Generation) {
    if let Err(e) = tickets.commit(new.ticket_keys.as_ref()) {
        tracing::error!("cannot start the new session ticket keys' refresher: {e}");
    }
    // Its view of the servers' health goes into the shared gauges now,
    // not while it was built (a refused one never writes there).
    new.pools.publish();
    shared.access_log.reopen(
        new.config.access_log.target.clone(),
        new.config.access_log.format,
    );
    let origin = new.config.origin.clone();
    if let Err(e) = new.pools.start_background_tasks() {
        tracing::error!("cannot start the new pools' health checks and name resolution: {e}");
    }
    let old = shared.current.swap(Arc::new(new));
    // Connections accepted under it keep it until they end: its health
    // checks and name lookups stop now, its idle upstream connections
    // close, its file caches are still swept.
    old.pools.retire();
    let mut retired = shared
        .retired
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    retired.retain(|g| g.strong_count() > 0);
    retired.push(Arc::downgrade(&old));
    shared
        .metrics
        .reloads
        .get_or_create(&ResultLabel { result: "ok" })
        .inc();
    tracing::info!("reloaded configuration from {origin}");
}

/// SIGUSR1: reopens the access log at its configured path, as a reload
/// does, without reading the configuration again.
fn reopen_log(shared: &Shared) {
    let running = shared.current.load();
    tracing::info!("SIGUSR1: reopening the access log");
    shared.access_log.reopen(
        running.config.access_log.target.clone(),
        running.config.access_log.format,
    );
}

/// Logs and counts a refused reload; the running generation stays.
fn refused(shared: &Shared, e: StartError) {
    // SIGHUP is also how a rotated log is reopened: that happens
    // whether or not the new configuration was taken.
    let running = shared.current.load();
    shared.access_log.reopen(
        running.config.access_log.target.clone(),
        running.config.access_log.format,
    );
    shared
        .metrics
        .reloads
        .get_or_create(&ResultLabel { result: "error" })
        .inc();
    tracing::error!("reload refused, still serving the previous configuration: {e}");
}
