//! `stream`: many mostly idle connections, each fetching a chunk every few
//! seconds (seed 001's media scenario): the offered throughput is fixed by
//! the number of connections and the interval, not by the server's speed.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::engine::{self, Observer, Window};
use crate::error::LoadError;
use crate::handshake::{into_tally, keepalive_request, require_success, thread_dialer};
use crate::http::{get_request, OpError};
use crate::profile::TlsProfile;
use crate::stats::{Report, Tally};
use crate::wire::Reads;

/// A streaming job.
#[derive(Debug, Clone)]
pub struct StreamJob {
    /// The server.
    pub addr: SocketAddr,
    /// SNI and Host.
    pub server_name: String,
    /// What the client offers.
    pub profile: TlsProfile,
    /// The chunk fetched on each tick.
    pub path: String,
    /// Connections, over all threads.
    pub connections: usize,
    /// Each connection waits a uniformly random time in this range between
    /// the starts of its fetches.
    pub interval: (Duration, Duration),
    /// Idle mode: each connection fetches `path` once, right after its
    /// handshake, and then holds the connection open without a request
    /// (`interval` is ignored); the measure is the server's memory.
    pub once: bool,
    /// Handshakes in flight while the connections open (per thread).
    pub connect_concurrency: usize,
    /// Warm-up (connections open during it) and measurement.
    pub window: Window,
    /// One generator thread per entry, pinned to the core it names.
    pub cores: Vec<Option<usize>>,
}

/// Runs a streaming job. Extra figures: `connections_open` (at window
/// open), `late_fetches` (a fetch took longer than its interval); in idle
/// mode `idle_at_window` (connections whose one fetch succeeded before the
/// window opened), and the operations are those fetches.
pub fn run_stream(job: &StreamJob, observer: &dyn Observer) -> Result<Report, LoadError> {
    let (lo, hi) = job.interval;
    if job.connections == 0 || lo.is_zero() || hi < lo {
        return Err(LoadError::Job(
            "need connections >= 1 and 0 < interval low <= high".into(),
        ));
    }
    let per_thread = job.connections.div_ceil(job.cores.len().max(1));
    let once = job.once;
    let request = get_request(&job.path, &job.server_name, false);
    let mut report = engine::run(&job.cores, job.window, observer, |_, clock| {
        let request = request.clone();
        async move {
            let dialer =
                match thread_dialer(job.addr, &job.server_name, &job.profile, 16, Reads::Across) {
                    Ok(d) => d,
                    Err(t) => return *t,
                };
            let tally = Rc::new(RefCell::new(Tally::new()));
            let gate = Rc::new(Semaphore::new(job.connect_concurrency.max(1)));
            let open_at_window = Rc::new(std::cell::Cell::new(0u64));
            let idle_at_window = Rc::new(std::cell::Cell::new(0u64));
            let all_dialed = Rc::new(tokio::sync::Barrier::new(per_thread));
            let mut tasks = Vec::new();
            for _ in 0..per_thread {
                let (dialer, tally, request, gate, open_at_window, idle_at_window, all_dialed) = (
                    dialer.clone(),
                    tally.clone(),
                    request.clone(),
                    gate.clone(),
                    open_at_window.clone(),
                    idle_at_window.clone(),
                    all_dialed.clone(),
                );
                tasks.push(tokio::task::spawn_local(async move {
                    // Small buffers: thousands of connections, one chunk each now and then.
                    let mut buf = vec![0u8; 16 * 1024];
                    let session = async {
                        let dialed = {
                            let _permit = gate.acquire().await;
                            dialer.connect(&clock, &tally).await
                        };
                        if dialed.is_ok() && Instant::now() <= clock.open {
                            open_at_window.set(open_at_window.get() + 1);
                        }
                        // Fetches start once every connection of this
                        // thread is open (or failed): fetches competing
                        // with the handshakes left a saturated server with
                        // half its connections open when the window opened,
                        // and its memory per connection could not be compared.
                        all_dialed.wait().await;
                        let mut tls = dialed?;
                        if once {
                            let (_, done) =
                                keepalive_request(&mut tls, &request, &mut buf, &clock, &tally)
                                    .await?;
                            if done <= clock.open {
                                idle_at_window.set(idle_at_window.get() + 1);
                            }
                            // Idle: no buffer kept here either.
                            buf = Vec::new();
                            tokio::time::sleep_until(clock.close.into()).await;
                            drop(tls);
                            return Ok(());
                        }
                        // Spread the first fetches over one interval.
                        let first = hi.mul_f64(fastrand::f64());
                        let mut next = Instant::now() + first;
                        loop {
                            tokio::time::sleep_until(next.into()).await;
                            next = Instant::now() + lo + (hi - lo).mul_f64(fastrand::f64());
                            let (_, done) =
                                keepalive_request(&mut tls, &request, &mut buf, &clock, &tally)
                                    .await?;
                            if clock.in_window(done) && done > next {
                                *tally
                                    .borrow_mut()
                                    .extra
                                    .entry("late_fetches".into())
                                    .or_default() += 1.0;
                            }
                        }
                    };
                    let r: Result<Result<(), OpError>, _> =
                        tokio::time::timeout_at(clock.close.into(), session).await;
                    if let Ok(Err(e)) = r {
                        tally.borrow_mut().record_error(e.kind, || e.message);
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            let mut t = into_tally(tally);
            t.extra
                .insert("connections_open".into(), open_at_window.get() as f64);
            if job.once {
                t.extra
                    .insert("idle_at_window".into(), idle_at_window.get() as f64);
            }
            t
        }
    })?;
    report.extra.entry("late_fetches".into()).or_insert(0.0);
    let ok = if job.once {
        report.extra.get("idle_at_window").copied().unwrap_or(0.0) > 0.0
    } else {
        report.operations > 0
    };
    require_success(report, job.addr, ok)
}
