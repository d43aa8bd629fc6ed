//! Threads, runtimes and the measurement window shared by every job.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::cpu::thread_cpu_ns;
use crate::error::LoadError;
use crate::stats::{Report, Tally};

/// Told when the measurement window opens and closes, from the generator's
/// control thread, so the caller can sample the server over the same span.
pub trait Observer: Sync {
    /// The window has just opened.
    fn window_opened(&self) {}
    /// The window has just closed.
    fn window_closed(&self) {}
}

/// An observer that watches nothing.
impl Observer for () {}

/// Warm-up (not counted) followed by the measured span.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Load runs but is not counted: caches fill, connections open.
    pub warmup: Duration,
    /// The measured span.
    pub measure: Duration,
}

/// When the window opens and closes, as seen by every thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub open: Instant,
    pub close: Instant,
}

impl Clock {
    pub fn in_window(&self, t: Instant) -> bool {
        t >= self.open && t <= self.close
    }

    pub fn over(&self) -> bool {
        Instant::now() >= self.close
    }
}

/// Keeps this generator thread from sleeping until the window closes: a
/// task always ready makes the runtime poll its sockets without blocking
/// (see [`crate::HandshakeJob::busy_poll`]).
pub(crate) fn keep_polling(clock: Clock) {
    tokio::task::spawn_local(async move {
        while !clock.over() {
            tokio::task::yield_now().await;
        }
    });
}

/// Lets threads start and pin themselves before the clock starts.
const SPIN_UP: Duration = Duration::from_millis(50);

/// Runs `per_thread` on one thread per entry of `cores` (pinned when the
/// entry names a core), each inside its own current-thread runtime and
/// local task set, and merges what they counted.
pub(crate) fn run<F, Fut>(
    cores: &[Option<usize>],
    window: Window,
    observer: &dyn Observer,
    per_thread: F,
) -> Result<Report, LoadError>
where
    F: Fn(usize, Clock) -> Fut + Sync,
    Fut: Future<Output = Tally>,
{
    if cores.is_empty() {
        return Err(LoadError::Job("no generator threads".into()));
    }
    if window.measure.is_zero() {
        return Err(LoadError::Job("empty measurement window".into()));
    }
    raise_fd_limit();
    let start = Instant::now() + SPIN_UP;
    let clock = Clock {
        open: start + window.warmup,
        close: start + window.warmup + window.measure,
    };
    let per_thread = &per_thread;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (i, core) in cores.iter().enumerate() {
            let core = *core;
            let handle = std::thread::Builder::new()
                .name(format!("loadgen-{i}"))
                .spawn_scoped(scope, move || -> Result<(Tally, u64), LoadError> {
                    if let Some(id) = core {
                        core_affinity::set_for_current(core_affinity::CoreId { id });
                    }
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(LoadError::Start)?;
                    let local = tokio::task::LocalSet::new();
                    // The thread samples its own CPU at the window's edges:
                    // it may be gone by the time anyone else looks.
                    let cpu = async {
                        tokio::time::sleep_until(clock.open.into()).await;
                        let at_open = thread_cpu_ns();
                        tokio::time::sleep_until(clock.close.into()).await;
                        thread_cpu_ns().saturating_sub(at_open)
                    };
                    Ok(local.block_on(&rt, async move {
                        tokio::time::sleep_until(start.into()).await;
                        tokio::join!(per_thread(i, clock), cpu)
                    }))
                })
                .map_err(LoadError::Start)?;
            handles.push(handle);
        }
        sleep_until(clock.open);
        observer.window_opened();
        sleep_until(clock.close);
        observer.window_closed();
        let mut total = Tally::new();
        let mut client_cpu_ns = 0;
        for h in handles {
            let (tally, cpu) = h
                .join()
                .map_err(|_| LoadError::Job("a generator thread panicked".into()))??;
            total.merge(tally);
            client_cpu_ns += cpu;
        }
        let window_secs = (clock.close - clock.open).as_secs_f64();
        Ok(total.into_report(window_secs, client_cpu_ns as f64 / 1e9, cores.len()))
    })
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Many connections need many descriptors: lift the soft limit to the hard one.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}
