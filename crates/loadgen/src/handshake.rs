//! `handshake`: a new connection per request — connect, handshake, one small
//! GET with `Connection: close`, wait for the server to close.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::engine::{self, Clock, Observer, Window};
use crate::error::LoadError;
use crate::http::{
    await_close, count, get_request, ok_status, read_body, read_head, read_response, Head, OpError,
};
use crate::profile::TlsProfile;
use crate::stats::{Report, Tally};
use crate::wire::{Reads, Wire};

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
    /// Generator threads never sleep: they poll their sockets in a loop.
    /// On one machine a server's send to a client asleep in `epoll_wait`
    /// is a wake-up the server pays for (on a virtual machine, an
    /// inter-processor interrupt): with a sleeping generator tlsgate spent
    /// up to twice the CPU per byte it spent with a busy one, and a cell
    /// flipped between the two. A remote client costs the server no
    /// wake-up, so the cost model measures with this on. The generator's
    /// utilization then reads 100 % and says nothing.
    pub busy_poll: bool,
}

/// Shared by the connection helpers of every job.
pub(crate) struct Dialer {
    pub addr: SocketAddr,
    pub name: ServerName<'static>,
    pub connector: TlsConnector,
    /// Record-bounded for connections whose big bodies are dropped unread.
    pub reads: Reads,
}

impl Dialer {
    pub fn new(
        addr: SocketAddr,
        server_name: &str,
        profile: &TlsProfile,
        sessions: usize,
        reads: Reads,
    ) -> Result<Self, LoadError> {
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| LoadError::ServerName(server_name.to_string()))?;
        Ok(Self {
            addr,
            name,
            connector: TlsConnector::from(profile.client_config(sessions)?),
            reads,
        })
    }

    /// Connects and completes the handshake; counts it when it ends inside
    /// the window.
    pub async fn connect(
        &self,
        clock: &Clock,
        tally: &RefCell<Tally>,
    ) -> Result<TlsStream<Wire>, OpError> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| OpError::new("connect", e))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .connector
            .connect(self.name.clone(), Wire::new(tcp, self.reads))
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
    tls: &mut TlsStream<Wire>,
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
    reads: Reads,
) -> Result<Rc<Dialer>, Box<Tally>> {
    Dialer::new(addr, server_name, profile, sessions, reads)
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
                Reads::RecordBounded,
            ) {
                Ok(d) => d,
                Err(t) => return *t,
            };
            let tally = Rc::new(RefCell::new(Tally::new()));
            if job.busy_poll {
                engine::keep_polling(clock);
            }
            if per_thread_concurrency > 0 {
                let mut tasks = Vec::new();
                for _ in 0..per_thread_concurrency {
                    // Each closed-loop client keeps its own tickets, as real
                    // clients do: one shared store holds only a few tickets
                    // per server name (TLS 1.3 tickets are single-use), so
                    // dozens of concurrent connections would fall back to
                    // full handshakes and "resumed" would measure a mix.
                    let dialer = match Dialer::new(
                        job.addr,
                        &job.server_name,
                        &job.profile,
                        4,
                        Reads::RecordBounded,
                    ) {
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

/// From this many body bytes still to come, a `Connection: close`
/// response is discarded unread (see [`discard_rest`]).
const DISCARD_FROM: u64 = 128 * 1024;

/// How much one discarding `recv` asks for.
const DISCARD_CHUNK: usize = 1 << 20;

thread_local! {
    /// The buffer discarding `recv`s name; the kernel never writes to it.
    static DISCARD: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; DISCARD_CHUNK]);
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
        let reading = Instant::now();
        let head = read_head(&mut tls, buf, clock, &mut bytes).await?;
        if head.body_left() >= DISCARD_FROM {
            discard_rest(&mut tls, &head, buf, clock, &mut bytes).await?;
            let done = Instant::now();
            // Wholly inside the window: the exact plaintext, as the
            // decrypting path counts it (raw bytes carry record overhead).
            if clock.in_window(reading) && clock.in_window(done) {
                bytes = head.head_len + head.content_length;
            }
            return Ok(done);
        }
        read_body(&mut tls, &head, clock, &mut bytes).await?;
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

/// Reads the rest of a `Connection: close` response up to the server's
/// close without decrypting it: `recv(MSG_TRUNC)` drops the bytes in the
/// kernel, uncopied. A big body then costs the generator almost nothing
/// and the server, not the generator, is the limit (decrypting, the
/// generator topped out with the server ~75 % busy on 2 MiB responses).
/// The server's work is the same; what is lost is only the check of the
/// body's bytes, which the integration tests make.
async fn discard_rest(
    tls: &mut TlsStream<Wire>,
    head: &Head,
    scratch: &mut [u8],
    clock: &Clock,
    bytes: &mut u64,
) -> Result<(), OpError> {
    ok_status(head)?;
    let (wire, conn) = tls.get_mut();
    // What rustls has decrypted (it holds no part of a record: see Wire).
    let mut arrived = 0u64;
    let mut took = |n: usize| {
        count(clock, bytes, n);
        arrived += n as u64;
    };
    loop {
        match std::io::Read::read(&mut conn.reader(), scratch) {
            Ok(0) => break,
            Ok(n) => took(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(OpError::new("read", e)),
        }
    }
    // What the buffer below rustls holds, then the socket, to its end.
    took(wire.discard_buffered());
    let tcp = wire.socket();
    loop {
        tcp.readable().await.map_err(|e| OpError::new("read", e))?;
        let r = tcp.try_io(Interest::READABLE, || {
            DISCARD.with_borrow_mut(|b| {
                rustix::net::recv(tcp, &mut b[..], rustix::net::RecvFlags::TRUNC)
                    .map(|(_, n)| n)
                    .map_err(std::io::Error::from)
            })
        });
        match r {
            Ok(0) => break,
            Ok(n) => took(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(OpError::new("read", e)),
        }
    }
    // Ciphertext is longer than its plaintext: fewer bytes than the body
    // means the server closed inside it.
    if arrived < head.body_left() {
        return Err(OpError::new("read", "connection closed inside the body"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::AsyncReadExt;

    /// A TLS server on loopback answering every request with a head that
    /// announces `announced` body bytes, then `sent` bytes, then closing.
    fn server(announced: usize, sent: usize) -> SocketAddr {
        let cert = rcgen::generate_simple_self_signed(vec!["bench.test".into()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (sock, _) = listener.accept().await.unwrap();
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(sock).await else {
                            return;
                        };
                        let mut req = [0u8; 1024];
                        if tls.read(&mut req).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let head =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\n\r\n");
                        let _ = tls.write_all(head.as_bytes()).await;
                        let _ = tls.write_all(&vec![b'x'; sent]).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
        });
        addr
    }

    fn job(addr: SocketAddr) -> HandshakeJob {
        HandshakeJob {
            addr,
            server_name: "bench.test".into(),
            profile: TlsProfile::tls13_ecdsa(),
            path: "/big".into(),
            pacing: Pacing::Closed { concurrency: 2 },
            window: Window {
                warmup: Duration::from_millis(100),
                measure: Duration::from_millis(500),
            },
            cores: vec![None],
            busy_poll: false,
        }
    }

    /// A big body is dropped unread, yet counted to the byte.
    #[test]
    fn a_discarded_body_is_counted_whole() {
        let size = 512 * 1024;
        let report = run_handshakes(&job(server(size, size)), &()).unwrap();
        assert!(report.operations > 0, "{report:?}");
        assert_eq!(report.error_count(), 0, "{report:?}");
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n").len() as u64;
        // Whole transactions count exactly; the few the window's edges cut
        // (at most the two in flight at each edge) count what arrived
        // inside it.
        let txn = head + size as u64;
        let ops = report.operations;
        assert!(
            (ops.saturating_sub(4) * txn..=(ops + 4) * txn).contains(&report.bytes),
            "{} bytes for {ops} operations of {txn}",
            report.bytes
        );
    }

    /// A server that closes inside a discarded body fails the operation.
    #[test]
    fn a_body_cut_short_is_an_error_even_unread() {
        let e = run_handshakes(&job(server(512 * 1024, 300 * 1024)), &()).unwrap_err();
        assert!(
            e.to_string().contains("connection closed inside the body"),
            "{e}"
        );
    }
}
