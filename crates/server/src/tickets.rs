//! The session ticket keys of the process: set up once, kept across
//! configuration reloads while the ticket settings stay the same (so a
//! SIGHUP does not cut off every ticket issued so far), and reported in
//! the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tlsgate_config::SessionTickets;
use tlsgate_metrics::types::{Counter, Family, Gauge};
use tlsgate_metrics::{Metrics, ResultLabel};
use tlsgate_tls::tickets::Refused;
use tlsgate_tls::{TicketKeyError, TicketKeys, TicketObserver};

/// The keys in use and the settings they were made for.
pub struct TicketCache {
    observer: Arc<dyn TicketObserver>,
    /// `server.user`, who may own the key file besides root and us.
    run_as: Option<u32>,
    state: Mutex<State>,
}

struct State {
    current: Option<Chosen>,
    /// Refresher threads (rotation, key file polling) may run: only once
    /// serving has started and privileges are dropped; never for check-config.
    threads: bool,
}

impl TicketCache {
    /// Keys that are checked but never refreshed or counted
    /// (check-config); `run_as` is the user `server.user` names.
    pub fn checking(run_as: Option<u32>) -> Self {
        Self {
            observer: Arc::new(tlsgate_tls::tickets::Quiet),
            run_as,
            state: Mutex::new(State {
                current: None,
                threads: false,
            }),
        }
    }

    /// Keys for serving, counted in `metrics`; refreshed by their own
    /// thread once [`start_threads`](Self::start_threads) was called;
    /// `run_as` is the user `server.user` names.
    pub fn serving(metrics: &Metrics, run_as: Option<u32>) -> Self {
        Self {
            observer: Arc::new(MetricsObserver::new(metrics)),
            run_as,
            state: Mutex::new(State {
                current: None,
                threads: false,
            }),
        }
    }

    /// Starts the refresher of the current keys, and of any made later.
    /// Called once the process may start threads (privileges dropped).
    pub fn start_threads(&self) -> Result<(), TicketKeyError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.threads = true;
        if let Some(Chosen { keys, .. }) = &state.current {
            keys.spawn_refresher()?;
        }
        Ok(())
    }

    /// The keys for `policy`: the current ones if only settings that do
    /// not concern keys changed, else new ones (kept only once
    /// [`commit`](Self::commit)ted). `None` when tickets are off.
    pub(crate) fn get(&self, policy: &SessionTickets) -> Result<Option<Chosen>, TicketKeyError> {
        if !policy.enabled {
            return Ok(None);
        }
        let same = |old: &SessionTickets| {
            old.lifetime == policy.lifetime
                && old.key_file == policy.key_file
                && (policy.key_file.is_some() || old.rotation == policy.rotation)
        };
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = state.current.as_ref() {
            if same(&current.policy) {
                return Ok(Some(current.clone()));
            }
        }
        drop(state);
        let observer = Arc::new(InService {
            inner: self.observer.clone(),
            on: AtomicBool::new(false),
        });
        let keys = TicketKeys::new(policy, self.run_as, observer.clone())?;
        Ok(Some(Chosen {
            policy: policy.clone(),
            keys,
            observer,
        }))
    }

    /// Makes `chosen` (what [`get`](Self::get) gave the generation now put
    /// in service) the current keys. A generation that is refused is never
    /// committed: its keys go with it, and the running ones stay current
    /// (a later reload to the running settings keeps every ticket valid).
    pub(crate) fn commit(&self, chosen: Option<&Chosen>) -> Result<(), TicketKeyError> {
        let Some(chosen) = chosen else {
            return Ok(());
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(&c.keys, &chosen.keys))
        {
            return Ok(());
        }
        if let Some(old) = &state.current {
            old.observer.on.store(false, Ordering::Relaxed);
        }
        chosen.observer.on.store(true, Ordering::Relaxed);
        chosen.observer.key_count(chosen.keys.key_count());
        state.current = Some(chosen.clone());
        if state.threads {
            chosen.keys.spawn_refresher()?;
        }
        Ok(())
    }
}

/// Ticket keys and the settings they were made for.
#[derive(Clone)]
pub(crate) struct Chosen {
    policy: SessionTickets,
    pub(crate) keys: Arc<TicketKeys>,
    observer: Arc<InService>,
}

/// What one set of keys reports about itself (their count, rotations and
/// file reloads) reaches the metrics only while that set is in service:
/// a refused reload's keys, or the keys a reload replaced and that
/// in-flight connections still hold, must not overwrite the gauge.
/// Tickets issued and opened are always counted: they are real.
struct InService {
    inner: Arc<dyn TicketObserver>,
    on: AtomicBool,
}

impl InService {
    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
}

impl TicketObserver for InService {
    fn issued(&self) {
        self.inner.issued();
    }
    fn opened(&self, result: Result<(), Refused>) {
        self.inner.opened(result);
    }
    fn key_count(&self, count: usize) {
        if self.on() {
            self.inner.key_count(count);
        }
    }
    fn reloaded(&self, ok: bool) {
        if self.on() {
            self.inner.reloaded(ok);
        }
    }
    fn rotated(&self) {
        if self.on() {
            self.inner.rotated();
        }
    }
}

/// Counts ticket events in the server's metrics.
struct MetricsObserver {
    issued: Counter,
    decrypts: Family<ResultLabel, Counter>,
    reloads: Family<ResultLabel, Counter>,
    rotations: Counter,
    keys: Gauge,
}

impl MetricsObserver {
    fn new(m: &Metrics) -> Self {
        // Clones share the registered metrics.
        Self {
            issued: m.tickets_issued.clone(),
            decrypts: m.ticket_decrypts.clone(),
            reloads: m.ticket_key_reloads.clone(),
            rotations: m.ticket_key_rotations.clone(),
            keys: m.ticket_keys.clone(),
        }
    }
}

impl TicketObserver for MetricsObserver {
    fn issued(&self) {
        self.issued.inc();
    }
    fn opened(&self, result: Result<(), Refused>) {
        let result = match result {
            Ok(()) => "ok",
            Err(Refused::Expired) => "expired",
            Err(Refused::UnknownKey) => "unknown_key",
            Err(Refused::Invalid) => "failed",
        };
        self.decrypts.get_or_create(&ResultLabel { result }).inc();
    }
    fn key_count(&self, count: usize) {
        self.keys.set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }
    fn rotated(&self) {
        self.rotations.inc();
    }
}
