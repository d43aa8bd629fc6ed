//! `server.user` / `server.group`: resolved at start (an unknown user is a
//! configuration error), applied once every socket is bound and before any
//! thread starts. After that the process has no capability and cannot gain
//! one (no-new-privs), so a reload reads the configuration file and the
//! document roots as that user; the key process, started earlier, keeps
//! its own privileges and reads the certificates and keys.
//!
//! The process is made not dumpable before it holds any secret, and stays
//! so unless `server.core_dumps` asks for core files (see docs/config.md,
//! "Core dumps").

use tlsgate_config::{Config, ConfigError};
use tlsgate_sys::privileges::{self, Ids};

use crate::StartError;

/// The ids to switch to, if `server.user` is set.
pub(crate) fn resolve(config: &Config) -> Result<Option<Ids>, StartError> {
    let Some(user) = &config.privileges.user else {
        return Ok(None);
    };
    privileges::resolve(user, config.privileges.group.as_deref())
        .map(Some)
        .map_err(|e| {
            let key = if e.step.starts_with("group") {
                "server.group"
            } else {
                "server.user"
            };
            ConfigError::new(&config.origin, key, e.to_string()).into()
        })
}

/// Makes this process not dumpable, before it reads its first secret
/// (session ticket keys, traffic secrets; the private keys themselves
/// without key isolation): no core file holds them, and no process of
/// the same user without `CAP_SYS_PTRACE` reads them from its memory.
/// The kernel does this at a change of uid, but not for a process that
/// stays as it was started (root without `server.user`).
pub(crate) fn protect_memory() -> Result<(), StartError> {
    privileges::set_dumpable(false).map_err(|e| StartError::Privileges(e.to_string()))
}

/// Switches to `ids` and drops every capability. `isolated`: the keys are
/// in the key process, whose protection needs the serving process off
/// uid 0 (which owns root-only key files without any capability).
/// `core_dumps`: make the process dumpable again (the switch of uid
/// cleared it too), for the operator who wants core files.
pub(crate) fn drop(ids: Option<Ids>, isolated: bool, core_dumps: bool) -> Result<(), StartError> {
    privileges::drop_privileges(ids).map_err(|e| StartError::Privileges(e.to_string()))?;
    if core_dumps {
        privileges::set_dumpable(true).map_err(|e| StartError::Privileges(e.to_string()))?;
        tracing::info!(
            "server.core_dumps: the serving process is dumpable; a core file, or a debugger of \
             its user, sees its session ticket keys and TLS traffic secrets"
        );
    }
    match ids {
        Some(i) => tracing::info!("running as uid {} gid {}, no capabilities", i.uid, i.gid),
        None if isolated && privileges::effective_uid() == 0 => tracing::warn!(
            "the serving process runs as root (uid 0, `server.user` not set): key isolation keeps \
             private keys out of its memory, but a root process can still read root-owned key \
             files, so a serving process taken over from the network could; set `server.user` \
             (a user of its own, or \"nobody\") to make the isolation hold"
        ),
        None => tracing::debug!("capabilities dropped"),
    }
    Ok(())
}
