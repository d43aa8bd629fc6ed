//! Where the private keys live: in the key process (`server.key_isolation
//! = true`, the default), or in this process (`false`, to measure the
//! cost). Either way the rest of the server sees certificates whose
//! `CertifiedKey` signs; only with isolation off does this process ever
//! read a key file.

use std::ffi::OsString;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use tlsgate_config::{Config, ConfigError};
use tlsgate_keyserver::{Events, KeyClient, KeyError};
use tlsgate_metrics::ReasonLabel;
use tlsgate_tls::{KeyUnavailable, LoadedCert, Material, SelfSignedCache};
use tokio::sync::mpsc::UnboundedSender;

use crate::{Launch, Shared, StartError};

/// The holder of the private keys.
pub(crate) enum Keys {
    /// Keys are read and used here.
    InProcess(SelfSignedCache),
    /// Keys are in the key process.
    Isolated(KeyClient),
}

/// The arguments that make `tlsgate key-server` load what `launch` names.
fn worker_args(launch: &Launch) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let o = &launch.overrides;
    if let Some(p) = &launch.config_path {
        a.extend(["--config".into(), p.into()]);
    }
    for l in &o.listen {
        a.extend(["--listen".into(), l.into()]);
    }
    if let Some(r) = &o.root {
        a.extend(["--root".into(), r.into()]);
    }
    if let (Some(c), Some(k)) = (&o.cert, &o.key) {
        a.extend(["--cert".into(), c.into(), "--key".into(), k.into()]);
    }
    if let Some(admin) = &o.admin {
        a.extend(["--admin".into(), admin.into()]);
    }
    if let Some(w) = o.workers {
        a.extend(["--workers".into(), w.to_string().into()]);
    }
    a
}

impl Keys {
    /// Starts the key process when `config` asks for isolation. Single-
    /// threaded still: no thread runs until [`Keys::start_threads`].
    pub(crate) fn start(config: &Config, launch: &Launch) -> Result<Keys, StartError> {
        if !config.keys.isolation {
            // A measuring switch: say so, where an operator will see it.
            tracing::warn!(
                "server.key_isolation = false: private keys are in the processes that talk to the network; \
                 meant for measuring what isolation costs, not for serving"
            );
            return Ok(Keys::InProcess(SelfSignedCache::default()));
        }
        let client = KeyClient::spawn(&worker_args(launch), config.keys.timeout)?;
        Ok(Keys::Isolated(client))
    }

    /// The certificates of every listener of `config`, the public files
    /// it names and its upstreams' client certificates, read by whoever
    /// holds the keys (the key process keeps its privileges: a reload as
    /// `server.user` reads root-only files through it). `keep`: keys of
    /// the running generation (isolated).
    pub(crate) fn certificates(
        &self,
        config: &Config,
        keep: &[u64],
    ) -> Result<(Vec<Vec<LoadedCert>>, Material), StartError> {
        let (certs, material) = match self {
            Keys::InProcess(cache) => (
                tlsgate_tls::load_all(config, cache)?,
                Material::load(config)?,
            ),
            Keys::Isolated(client) => client.load(keep).map_err(|e| match e {
                KeyError::Config(e) => {
                    StartError::Config(ConfigError::new(e.origin, e.key, e.problem))
                }
                other => StartError::Keys(other),
            })?,
        };
        if certs.len() != config.listeners.len()
            || material.upstream_clients.len() != config.upstreams.len()
        {
            // The key process read the file at another moment than we did.
            return Err(ConfigError::new(
                &config.origin,
                "listener",
                "the configuration changed while it was being read; try again",
            )
            .into());
        }
        Ok((certs, material))
    }

    /// Records the keys the running generation uses (they are kept by the
    /// key process until a later generation replaces them).
    pub(crate) fn set_active(&self, ids: Vec<u64>) {
        if let Keys::Isolated(c) = self {
            c.set_active(ids);
        }
    }

    /// Starts the key client's threads; `rekey` asks the main loop to reload.
    pub(crate) fn start_threads(
        &self,
        shared: &Arc<Shared>,
        rekey: UnboundedSender<()>,
    ) -> std::io::Result<()> {
        shared.metrics.key_up.set(1);
        shared.key_state.set(KeyState::Up);
        match self {
            Keys::InProcess(_) => Ok(()),
            Keys::Isolated(c) => c.start(Box::new(MetricEvents {
                shared: Arc::downgrade(shared),
                rekey,
            })),
        }
    }
}

/// Key process events into metrics and reloads.
struct MetricEvents {
    shared: Weak<Shared>,
    rekey: UnboundedSender<()>,
}

impl Events for MetricEvents {
    fn sign_failed(&self, why: KeyUnavailable) {
        if let Some(s) = self.shared.upgrade() {
            s.metrics
                .key_failures
                .get_or_create(&ReasonLabel {
                    reason: why.reason(),
                })
                .inc();
        }
    }

    fn key_server(&self, up: bool, restart: bool) {
        if let Some(s) = self.shared.upgrade() {
            s.metrics.key_up.set(i64::from(up));
            s.key_state
                .set(if up { KeyState::Up } else { KeyState::Down });
            if up && restart {
                s.metrics.key_restarts.inc();
            }
        }
    }

    fn key_hung(&self) {
        if let Some(s) = self.shared.upgrade() {
            s.metrics.key_up.set(0);
            s.key_state.set(KeyState::Hung);
        }
    }

    fn keys_changed(&self) {
        let _ = self.rekey.send(());
    }
}

/// The key ids (fingerprints of the public keys) of `certs` and of the
/// upstream client certificates of `material`.
pub(crate) fn key_ids(certs: &[Vec<LoadedCert>], material: &Material) -> Vec<u64> {
    certs
        .iter()
        .flatten()
        .map(|c| &c.certified)
        .chain(material.upstream_clients.iter().flatten())
        .filter_map(|c| c.key.public_key())
        .map(|spki| tlsgate_tls::remote::fingerprint(spki.as_ref()))
        .collect()
}

/// Whether the key process can sign, for `/healthz` (a load balancer takes
/// an instance out whose full handshakes all fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    Up = 0,
    /// No key server connected (died, not loaded, supervisor gone).
    Down = 1,
    /// Connected, but its signatures time out (it is being replaced).
    Hung = 2,
}

/// A [`KeyState`] shared by the key client's threads and the admin
/// listener.
#[derive(Debug, Default)]
pub(crate) struct KeyHealth(AtomicU8);

impl KeyHealth {
    pub(crate) fn set(&self, state: KeyState) {
        self.0.store(state as u8, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> KeyState {
        match self.0.load(Ordering::Relaxed) {
            0 => KeyState::Up,
            1 => KeyState::Down,
            _ => KeyState::Hung,
        }
    }
}
