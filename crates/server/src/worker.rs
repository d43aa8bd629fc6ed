//! Worker threads: one tokio runtime per thread, each with its own
//! `SO_REUSEPORT` listener per address, so connections never migrate
//! between cores and the workers share nothing on the hot path.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tlsgate_metrics::ReasonLabel;
use tokio_util::task::TaskTracker;

use crate::flood::HandshakeSlot;
use crate::limiter::Permit;
use crate::Shared;

/// A listening socket of one worker and the listener (site) it belongs to.
pub(crate) struct WorkerSocket {
    pub listener: usize,
    pub socket: std::net::TcpListener,
}

/// Starts worker `id` on its sockets.
pub(crate) fn spawn(
    id: usize,
    shared: Arc<Shared>,
    sockets: Vec<WorkerSocket>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("worker-{id}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("worker {id}: cannot start its runtime: {e}");
                    return;
                }
            };
            rt.block_on(run(shared, sockets));
        })
}

async fn run(shared: Arc<Shared>, sockets: Vec<WorkerSocket>) {
    let tracker = TaskTracker::new();
    let mut loops = Vec::new();
    for ws in sockets {
        match tlsgate_sys::accept::Listener::new(ws.socket) {
            Ok(l) => loops.push(tokio::spawn(accept_loop(
                shared.clone(),
                ws.listener,
                l,
                tracker.clone(),
            ))),
            Err(e) => tracing::error!("cannot register a listener: {e}"),
        }
    }
    let sweeper = tokio::spawn(sweep_file_caches(shared.clone()));
    for l in loops {
        let _ = l.await;
    }
    sweeper.abort();
    // Listeners are closed; in-flight requests get the grace period.
    tracker.close();
    let grace = shared.current.load().config.shutdown_timeout;
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            "{} connections still open at the shutdown deadline; closing them",
            tracker.len()
        );
    }
}

/// Lets go of this worker's cached files once they expire (a deleted
/// file's space is freed even if nobody asks for it again), those of
/// generations a reload replaced too, as long as a connection holds them.
async fn sweep_file_caches(shared: Arc<Shared>) {
    const MIN_PERIOD: Duration = Duration::from_millis(100);
    loop {
        let period = {
            let gen = shared.current.load();
            for root in gen.roots() {
                root.sweep_cache();
            }
            // Generations a reload replaced, while connections hold them.
            for old in shared.retired_generations() {
                for root in old.roots() {
                    root.sweep_cache();
                }
            }
            gen.config
                .open_file_cache
                .map_or(Duration::from_secs(1), |c| c.valid.max(MIN_PERIOD))
        };
        tokio::time::sleep(period).await;
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener_idx: usize,
    listener: tlsgate_sys::accept::Listener,
    tracker: TaskTracker,
) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let (sock, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                if let Some(pause) = accept_failed(&shared, &e) {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => return,
                    }
                }
                continue;
            }
        };
        let accepted = Instant::now();
        let gen = shared.current.load();
        let from_balancer = gen
            .config
            .listeners
            .get(listener_idx)
            .is_some_and(|l| l.proxy_protocol_from.trusts(peer.ip()));
        if from_balancer {
            // It holds its place in max_connections from now; the limits
            // per source apply to the client its header names, once read.
            let max = gen.config.limits.max_connections;
            match shared.limiter.try_acquire_unattributed(max) {
                Ok(permit) => {
                    tracker.spawn(Box::pin(crate::conn::handle_proxied(
                        shared.clone(),
                        listener_idx,
                        sock,
                        peer,
                        permit,
                        accepted,
                    )));
                }
                Err(r) => refuse(&shared, peer.ip(), r.reason()),
            }
            continue;
        }
        match admit(&shared, peer.ip()) {
            Ok((permit, slot)) => {
                // Boxed: the connection's future is ~10 KiB, and tokio
                // moves a future by value through several layers of
                // `spawn` and again into and out of its task cell (callgrind:
                // ~100 KB of memcpy per connection unboxed); a box moves
                // as a pointer.
                tracker.spawn(Box::pin(crate::conn::handle(
                    shared.clone(),
                    listener_idx,
                    sock,
                    (peer, None),
                    (permit, slot),
                    accepted,
                )));
            }
            // Dropping the socket closes it: nothing read, no TLS work.
            Err(reason) => refuse(&shared, peer.ip(), reason),
        }
    }
}

/// How long a listener rests after accept() failed for want of a
/// descriptor or memory (nginx pauses accepting likewise). The condition
/// lasts until connections close, the connection stays in the backlog,
/// and tokio reports the listener ready again at once: retried at once,
/// accept() would fail in a loop at 100 % CPU.
pub(crate) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What a failed accept() calls for: counted in `tlsgate_accept_errors_total`,
/// warned about (rate-limited) and the pause to take, or `None` when the
/// error concerned one connection only and the next may be accepted at once.
pub(crate) fn accept_failed(shared: &Shared, e: &io::Error) -> Option<Duration> {
    let reason = accept_error_reason(e);
    shared
        .metrics
        .accept_errors
        .get_or_create(&ReasonLabel { reason })
        .inc();
    if reason == "connection" {
        return None;
    }
    shared.accept_warnings.accept_paused(e);
    Some(ACCEPT_PAUSE)
}

/// The `reason` label of a failed accept().
fn accept_error_reason(e: &io::Error) -> &'static str {
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const EPROTO: i32 = 71;
    const ENOBUFS: i32 = 105;
    match (e.raw_os_error(), e.kind()) {
        (Some(EMFILE | ENFILE), _) => "descriptors",
        (Some(ENOMEM | ENOBUFS), _) => "memory",
        // The connection went before it was accepted (accept(2): also
        // EPROTO, and EPERM from a firewall rule): the next one may be fine.
        (Some(EPROTO), _)
        | (
            _,
            io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::PermissionDenied,
        ) => "connection",
        // Unknown, perhaps lasting: paused too, so it cannot spin.
        _ => "other",
    }
}

/// Counts and reports a connection a limit refused.
pub(crate) fn refuse(shared: &Shared, ip: IpAddr, reason: &'static str) {
    shared
        .metrics
        .connections_rejected
        .get_or_create(&ReasonLabel { reason })
        .inc();
    shared.refusals.refused(ip, reason);
}

/// The connection limits, then the handshake flood limits; the error is
/// the refusing limit's metric label.
pub(crate) fn admit(shared: &Shared, ip: IpAddr) -> Result<(Permit, HandshakeSlot), &'static str> {
    let gen = shared.current.load();
    let limits = &gen.config.limits;
    let permit = shared
        .limiter
        .try_acquire_unattributed(limits.max_connections)
        .map_err(|r| r.reason())?;
    limits_of_source(shared, limits, permit, ip)
}

/// The limits of the source `ip` for a connection whose `permit` already
/// counts in `max_connections`: a balancer's, once its PROXY protocol
/// header named the client.
pub(crate) fn admit_source(
    shared: &Shared,
    permit: Permit,
    ip: IpAddr,
) -> Result<(Permit, HandshakeSlot), &'static str> {
    limits_of_source(shared, &shared.current.load().config.limits, permit, ip)
}

/// `max_connections_per_ip`, then the handshake limits, for `ip`.
fn limits_of_source(
    shared: &Shared,
    limits: &tlsgate_config::Limits,
    mut permit: Permit,
    ip: IpAddr,
) -> Result<(Permit, HandshakeSlot), &'static str> {
    permit
        .attribute(ip, limits.max_connections_per_ip, source_prefixes(limits))
        .map_err(|r| r.reason())?;
    let slot = shared
        .handshakes
        .try_begin(ip, &limits.handshake)
        .map_err(|r| r.reason())?;
    Ok((permit, slot))
}

fn source_prefixes(limits: &tlsgate_config::Limits) -> (u8, u8) {
    (
        limits.handshake.source_prefix_v4,
        limits.handshake.source_prefix_v6,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_that_last_pause_and_those_of_one_connection_do_not() {
        let os = io::Error::from_raw_os_error;
        for (errno, reason) in [
            (24, "descriptors"), // EMFILE
            (23, "descriptors"), // ENFILE
            (12, "memory"),      // ENOMEM
            (105, "memory"),     // ENOBUFS
            (103, "connection"), // ECONNABORTED
            (71, "connection"),  // EPROTO
            (1, "connection"),   // EPERM
            (4, "connection"),   // EINTR
            (22, "other"),       // EINVAL
            (9, "other"),        // EBADF
        ] {
            assert_eq!(accept_error_reason(&os(errno)), reason, "errno {errno}");
        }
    }
}
