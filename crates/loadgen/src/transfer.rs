//! `transfer`: keep-alive GETs of one file over many connections
//! (seed 001's web-server scenario).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::engine::{self, Observer, Window};
use crate::error::LoadError;
use crate::handshake::{into_tally, keepalive_request, require_success, thread_dialer};
use crate::http::{get_request, OpError};
use crate::profile::TlsProfile;
use crate::stats::{Report, Tally};
use crate::wire::Reads;

/// A keep-alive transfer job.
#[derive(Debug, Clone)]
pub struct TransferJob {
    /// The server.
    pub addr: SocketAddr,
    /// SNI and Host.
    pub server_name: String,
    /// What the client offers.
    pub profile: TlsProfile,
    /// The file fetched again and again.
    pub path: String,
    /// Connections, over all threads; each has one request in flight.
    pub connections: usize,
    /// Warm-up and measurement.
    pub window: Window,
    /// One generator thread per entry, pinned to the core it names.
    pub cores: Vec<Option<usize>>,
    /// Requests per second over all connections, each connection taking
    /// an equal share (`None`: a connection asks again as soon as it is
    /// answered). A connection that falls behind does not catch up in a
    /// burst: its rate is then what the server gives it.
    pub per_second: Option<f64>,
    /// Generator threads poll instead of sleeping between requests (see
    /// [`crate::HandshakeJob::busy_poll`]).
    pub busy_poll: bool,
}

/// After a failed connection, wait this long before the next one.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

/// Runs a transfer job; the observer sees the window open and close.
pub fn run_transfer(job: &TransferJob, observer: &dyn Observer) -> Result<Report, LoadError> {
    if job.connections == 0 {
        return Err(LoadError::Job("connections must be at least 1".into()));
    }
    let per_thread = job.connections.div_ceil(job.cores.len().max(1));
    // Each connection's interval between requests.
    let period = match job.per_second {
        None => None,
        Some(r) if r.is_finite() && r > 0.0 => Some(Duration::from_secs_f64(
            (per_thread * job.cores.len().max(1)) as f64 / r,
        )),
        Some(_) => return Err(LoadError::Job("rate must be positive".into())),
    };
    let request = get_request(&job.path, &job.server_name, false);
    let report = engine::run(&job.cores, job.window, observer, |_, clock| {
        let request = request.clone();
        async move {
            let dialer = match thread_dialer(
                job.addr,
                &job.server_name,
                &job.profile,
                per_thread,
                Reads::Across,
            ) {
                Ok(d) => d,
                Err(t) => return *t,
            };
            let tally = Rc::new(RefCell::new(Tally::new()));
            if job.busy_poll {
                engine::keep_polling(clock);
            }
            let mut tasks = Vec::new();
            for i in 0..per_thread {
                let (dialer, tally, request) = (dialer.clone(), tally.clone(), request.clone());
                // Connections start a share of the interval apart, so that
                // paced requests arrive spread out, not all at each tick.
                let mut pace =
                    period.map(|p| (Instant::now() + p.mul_f64(i as f64 / per_thread as f64), p));
                tasks.push(tokio::task::spawn_local(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while !clock.over() {
                        let session = async {
                            let mut tls = dialer.connect(&clock, &tally).await?;
                            loop {
                                if let Some((at, p)) = pace.as_mut() {
                                    tokio::time::sleep_until((*at).into()).await;
                                    let late = Instant::now().checked_sub(*p).unwrap_or(*at);
                                    *at = (*at).max(late) + *p;
                                }
                                keepalive_request(&mut tls, &request, &mut buf, &clock, &tally)
                                    .await?;
                            }
                        };
                        let r: Result<Result<(), OpError>, _> =
                            tokio::time::timeout_at(clock.close.into(), session).await;
                        if let Ok(Err(e)) = r {
                            if clock.in_window(Instant::now()) {
                                tally.borrow_mut().record_error(e.kind, || e.message);
                            }
                            tokio::time::sleep(RECONNECT_PAUSE).await;
                        }
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            into_tally(tally)
        }
    })?;
    let ok = report.operations > 0 || report.bytes > 0;
    require_success(report, job.addr, ok)
}
