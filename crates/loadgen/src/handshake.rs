//! `handshake`: a new connection per request — connect, handshake, one small
//! GET with `Connection: close`, wait for the server to close.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::engine::{self, Clock, Observer, Window};
use crate::error::LoadError;
use crate::http::{await_close, get_request, read_response, OpError};
use crate::profile::TlsProfile;
use crate::stats::{Report, Tally};

/// How new connections are paced.
#[derive(Debug, Clone, Copy)]
pub enum Pacing {
    /// A fixed number of connections in flight, each followed at once by the
    /// next: finds the maximum rate.
    Closed {
        /// Connections in flight, over all threads.
        concurrency: usize,
    },
    /// A fixed arrival rate, whatever the server does: latency at a given
    /// load, without coordinated omission (latency counts from the
    /// scheduled start).
    Open {
        /// New connections per second, over all threads.
        per_second: f64,
        /// Beyond this many in flight, arrivals are counted as `overload`.
        max_in_flight: usize,
    },
}

/// A handshake job.
#[derive(Debug, Clone)]
pub struct HandshakeJob {
    /// The server.
    pub addr: SocketAddr,
    /// SNI and Host.
    pub server_name: String,
    /// What the client offers.
    pub profile: TlsProfile,
    /// The small file fetched on each connection.
    pub path: String,
    /// Pacing.
    pub pacing: Pacing,
    /// Warm-up and measurement.
    pub window: Window,
    /// One generator thread per entry, pinned to the core it names.
    pub cores: Vec<Option<usize>>,
}

/// Shared by the connection helpers of every job.
pub(crate) struct Dialer {
    pub addr: SocketAddr,
    pub name: ServerName<'static>,
    pub connector: TlsConnector,
}

impl Dialer {
    pub fn new(
        addr: SocketAddr,
        server_name: &str,
        profile: &TlsProfile,
        sessions: usize,
    ) -> Result<Self, LoadError> {
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| LoadError::ServerName(server_name.to_string()))?;
        Ok(Self {
            addr,
            name,
            connector: TlsConnector::from(profile.client_config(sessions)?),
        })
    }

    /// Connects and completes the handshake; counts it when it ends inside
    /// the window.
    pub async fn connect(
        &self,
        clock: &Clock,
        tally: &RefCell<Tally>,
    ) -> Result<TlsStream<TcpStream>, OpError> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| OpError::new("connect", e))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .connector
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| OpError::new("handshake", e))?;
        if clock.in_window(Instant::now()) {
            let conn = tls.get_ref().1;
            let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
            let negotiated = (
                conn.protocol_version()
                    .map_or("none".into(), |v| format!("{v:?}")),
                conn.negotiated_cipher_suite()
                    .map_or("none".into(), |s| format!("{:?}", s.suite())),
                conn.negotiated_key_exchange_group()
                    .map_or("none".into(), |g| format!("{:?}", g.name())),
            );
            tally.borrow_mut().record_handshake(resumed, negotiated);
        }
        Ok(tls)
    }
}

/// One keep-alive request: send, read the whole response, count it when
/// it ends inside the window. Returns when it began and ended.
pub(crate) async fn keepalive_request(
    tls: &mut TlsStream<TcpStream>,
    request: &[u8],
    buf: &mut [u8],
    clock: &Clock,
    tally: &RefCell<Tally>,
) -> Result<(Instant, Instant), OpError> {
    let began = Instant::now();
    tls.write_all(request)
        .await
        .map_err(|e| OpError::new("write", e))?;
    let mut bytes = 0;
    let r = read_response(tls, buf, clock, &mut bytes).await;
    let mut t = tally.borrow_mut();
    t.bytes += bytes;
    r?;
    let done = Instant::now();
    if clock.in_window(done) {
        t.record_op((done - began).as_micros() as u64);
    }
    Ok((began, done))
}

/// A thread's dialer, or a tally holding why there is none.
pub(crate) fn thread_dialer(
    addr: SocketAddr,
    server_name: &str,
    profile: &TlsProfile,
    sessions: usize,
) -> Result<Rc<Dialer>, Box<Tally>> {
    Dialer::new(addr, server_name, profile, sessions)
        .map(Rc::new)
        .map_err(|e| {
            let mut t = Tally::new();
            t.record_error("setup", || e.to_string());
            Box::new(t)
        })
}

/// The thread's tally once its tasks are done.
pub(crate) fn into_tally(tally: Rc<RefCell<Tally>>) -> Tally {
    Rc::try_unwrap(tally)
        .map(RefCell::into_inner)
        .unwrap_or_else(|rc| std::mem::replace(&mut *rc.borrow_mut(), Tally::new()))
}

/// A report in which nothing succeeded is an error naming the first failure.
pub(crate) fn require_success(
    report: Report,
    addr: SocketAddr,
    succeeded: bool,
) -> Result<Report, LoadError> {
    if succeeded {
        return Ok(report);
    }
    Err(LoadError::NothingSucceeded {
        addr,
        first_error: report
            .first_error
            .unwrap_or_else(|| "no operation completed".into()),
    })
}

/// Runs a handshake job; the observer sees the window open and close.
pub fn run_handshakes(job: &HandshakeJob, observer: &dyn Observer) -> Result<Report, LoadError> {
    let threads = job.cores.len().max(1);
    let (per_thread_concurrency, per_thread_rate, max_in_flight) = match job.pacing {
        Pacing::Closed { concurrency } => {
            if concurrency == 0 {
                return Err(LoadError::Job("concurrency must be at least 1".into()));
            }
            (concurrency.div_ceil(threads), 0.0, 0)
        }
        Pacing::Open {
            per_second,
            max_in_flight,
        } => {
            if per_second.is_nan() || per_second <= 0.0 {
                return Err(LoadError::Job("rate must be positive".into()));
            }
            (
                0,
                per_second / threads as f64,
                max_in_flight.div_ceil(threads),
            )
        }
    };
    let request: Arc<[u8]> = get_request(&job.path, &job.server_name, true).into();
    let report = engine::run(&job.cores, job.window, observer, |_, clock| {
        let request = request.clone();
        async move {
            let dialer = match thread_dialer(
                job.addr,
                &job.server_name,
                &job.profile,
                per_thread_concurrency.max(max_in_flight) * 2,
            ) {
                Ok(d) => d,
                Err(t) => return *t,
            };
            let tally = Rc::new(RefCell::new(Tally::new()));
            if per_thread_concurrency > 0 {
                let mut tasks = Vec::new();
                for _ in 0..per_thread_concurrency {
                    // Each closed-loop client keeps its own tickets, as real
                    // clients do: one shared store holds only a few tickets
                    // per server name (TLS 1.3 tickets are single-use), so
                    // dozens of concurrent connections would fall back to
                    // full handshakes and "resumed" would measure a mix.
                    let dialer = match Dialer::new(job.addr, &job.server_name, &job.profile, 4) {
                        Ok(d) => Rc::new(d),
                        Err(_) => dialer.clone(),
                    };
                    let (tally, request) = (tally.clone(), request.clone());
                    tasks.push(tokio::task::spawn_local(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while !clock.over() {
                            let began = Instant::now();
                            one(&dialer, &request, &mut buf, began, &clock, &tally).await;
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            } else {
                open_loop(
                    dialer,
                    request,
                    per_thread_rate,
                    max_in_flight,
                    clock,
                    &tally,
                )
                .await;
            }
            into_tally(tally)
        }
    })?;
    let ok = report.operations > 0;
    require_success(report, job.addr, ok)
}

async fn open_loop(
    dialer: Rc<Dialer>,
    request: Arc<[u8]>,
    rate: f64,
    max_in_flight: usize,
    clock: Clock,
    tally: &Rc<RefCell<Tally>>,
) {
    let period = Duration::from_secs_f64(1.0 / rate);
    let in_flight = Rc::new(std::cell::Cell::new(0usize));
    let mut next = Instant::now();
    let mut tasks = Vec::new();
    while next < clock.close {
        tokio::time::sleep_until(next.into()).await;
        let scheduled = next;
        next += period;
        if in_flight.get() >= max_in_flight.max(1) {
            if clock.in_window(scheduled) {
                tally
                    .borrow_mut()
                    .record_error("overload", || "generator in-flight cap reached".into());
            }
            continue;
        }
        in_flight.set(in_flight.get() + 1);
        let (dialer, tally, request, in_flight) = (
            dialer.clone(),
            tally.clone(),
            request.clone(),
            in_flight.clone(),
        );
        tasks.push(tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 16 * 1024];
            one(&dialer, &request, &mut buf, scheduled, &clock, &tally).await;
            in_flight.set(in_flight.get() - 1);
        }));
        tasks.retain(|t| !t.is_finished());
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// One connection: handshake, GET, wait for close. Cut off at window end.
async fn one(
    dialer: &Dialer,
    request: &[u8],
    buf: &mut [u8],
    began: Instant,
    clock: &Clock,
    tally: &RefCell<Tally>,
) {
    let mut bytes = 0;
    let work = async {
        let mut tls = dialer.connect(clock, tally).await?;
        tls.write_all(request)
            .await
            .map_err(|e| OpError::new("write", e))?;
        read_response(&mut tls, buf, clock, &mut bytes).await?;
        let done = Instant::now();
        await_close(&mut tls, buf).await;
        Ok::<Instant, OpError>(done)
    };
    let outcome = tokio::time::timeout_at(clock.close.into(), work).await;
    let mut t = tally.borrow_mut();
    t.bytes += bytes;
    match outcome {
        Ok(Ok(done)) if clock.in_window(done) => {
            t.record_op((done - began).as_micros() as u64);
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) if clock.in_window(Instant::now()) => t.record_error(e.kind, || e.message),
        Ok(Err(_)) | Err(_) => {}
    }
}
